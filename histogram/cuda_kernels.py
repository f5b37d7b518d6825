"""Numba CUDA histogram kernel and its host wrapper.

This module imports ``numba.cuda`` at the top (a kernel body can only reach ``cuda``
as a global), so :mod:`histogram.kernels` imports this module only for
``backend="cuda"``; CPU-only use never imports CUDA. With ``NUMBA_ENABLE_CUDASIM=1``
set before the first import, the same code runs on Numba's CUDA simulator (the test
suite does so in a subprocess).

Kernel design. The launch grid is ``(n_tiles, n_feature_chunks, n_channel_chunks)``:

* a *tile* is a (node, row range) pair of at most ``rows_per_block`` rows, built on the
  host from ``node_starts``, so no block is wasted on rows of other nodes and big nodes
  get many blocks;
* a block owns a chunk of features and a chunk of channels small enough for its
  ``(features, bins, channels)`` float64 histogram to fit in shared memory
  (``SHARED_BYTES``);
* the block zeroes that shared histogram, its threads stride over the tile's rows and
  add each (feature, channel) value with a *shared-memory* atomic, and after one
  barrier the block flushes each non-zero shared entry with **one global atomic add
  per (bin, channel) per block**, never one global atomic per sample.

Data movement. :class:`CudaHistogramContext` uploads a fit's bin codes once and keeps
them on the device; each build then moves only its channels and row ids in and the
histograms out, and zeroes the output with a device kernel rather than uploading zeros.
"""
import numpy as np
from numba import cuda, types

from .dtypes import CHANNEL_DTYPE

#: Dynamic shared memory per block used for the block histogram (48 KiB is the
#: limit every CUDA device grants without opting in).
SHARED_BYTES = 48 * 1024
#: Default rows per tile and threads per block.
ROWS_PER_BLOCK = 4096
THREADS_PER_BLOCK = 256


def hist_kernel(binned, channels, rows, tile_node, tile_start, tile_stop,
                feat_per_block, chan_per_block, out):
    """CUDA kernel body (compiled with ``numba.cuda.jit``; see module docstring).

    Parameters
    ----------
    binned : uint8[:, ::1], shape (n_features, n_rows)
    channels : float64[:, ::1], shape (n_rows, n_channels)
    rows : int32[::1], shape (m,)
    tile_node, tile_start, tile_stop : int64[::1], shape (n_tiles,)
        Tile ``t`` sums rows[tile_start[t]:tile_stop[t]] into node ``tile_node[t]``.
    feat_per_block, chan_per_block : int64
        Feature and channel chunk sizes (grid axes y and z).
    out : float64[:, :, :, ::1], shape (n_nodes, n_features, n_bins, n_channels)
        Must be zeroed before launch; blocks add into it atomically.
    """
    hist = cuda.shared.array(0, dtype=types.float64)
    n_features = binned.shape[0]
    n_channels = channels.shape[1]
    n_bins = out.shape[2]
    f0 = cuda.blockIdx.y * feat_per_block
    f1 = min(f0 + feat_per_block, n_features)
    c0 = cuda.blockIdx.z * chan_per_block
    c1 = min(c0 + chan_per_block, n_channels)
    nf = f1 - f0
    nc = c1 - c0
    slab = n_bins * nc
    total = nf * slab
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x

    for i in range(tid, total, nthreads):
        hist[i] = 0.0
    cuda.syncthreads()

    tile = cuda.blockIdx.x
    node = tile_node[tile]
    for k in range(tile_start[tile] + tid, tile_stop[tile], nthreads):
        r = rows[k]
        for fl in range(nf):
            base = fl * slab + binned[f0 + fl, r] * nc
            for cl in range(nc):
                cuda.atomic.add(hist, base + cl, channels[r, c0 + cl])
    cuda.syncthreads()

    for i in range(tid, total, nthreads):
        v = hist[i]
        if v != 0.0:
            fl = i // slab
            rem = i - fl * slab
            b = rem // nc
            cl = rem - b * nc
            cuda.atomic.add(out, (node, f0 + fl, b, c0 + cl), v)


def kernel_signature():
    """Numba type signature of :func:`hist_kernel` (the only one ever compiled)."""
    i64 = types.int64
    return (types.Array(types.uint8, 2, "C"), types.Array(types.float64, 2, "C"),
            types.Array(types.int32, 1, "C"), types.Array(i64, 1, "C"),
            types.Array(i64, 1, "C"), types.Array(i64, 1, "C"), i64, i64,
            types.Array(types.float64, 4, "C"))


_COMPILED = None


def check_narrow_codes(binned):
    """Refuse codes other than uint8 (wide categorical codes, :mod:`histogram.categories`).

    The kernel is compiled for uint8 codes only and keeps a block's histogram of up to
    256 bins in shared memory; a bin axis of up to 4,096 bins would need another tiling
    of features and channels, which was not written (nor measured on a GPU) with wide codes.
    """
    if np.asarray(binned).dtype != np.uint8:
        raise ValueError(f"backend='cuda' takes uint8 codes (bin axes of up to 256 bins), got {binned.dtype}: a fit "
                         "with wide categorical codes (a categorical column of more than 255 categories under "
                         "gradient boosting) runs on backend='numba'")


def _compiled_kernel():
    global _COMPILED
    if _COMPILED is None:
        _COMPILED = cuda.jit(kernel_signature(), cache=True)(hist_kernel)
    return _COMPILED


def compile_ptx(cc=(9, 0)):
    """PTX text of the kernel for compute capability ``cc`` (no GPU needed).

    Returns
    -------
    str
    """
    ptx, _ = cuda.compile_ptx(hist_kernel, kernel_signature(), cc=cc)
    return ptx


def plan_tiles(node_starts, rows_per_block):
    """Cut every node into tiles of at most ``rows_per_block`` rows.

    Parameters
    ----------
    node_starts : ndarray of int64, shape (n_nodes + 1,)
    rows_per_block : int

    Returns
    -------
    tile_node, tile_start, tile_stop : ndarray of int64, shape (n_tiles,)
        Empty nodes get no tile.
    """
    sizes = np.diff(node_starts)
    n_tiles = (sizes + rows_per_block - 1) // rows_per_block
    tile_node = np.repeat(np.arange(sizes.shape[0], dtype=np.int64), n_tiles)
    first_tile = np.concatenate(([0], np.cumsum(n_tiles)))[:-1]
    within = np.arange(tile_node.shape[0], dtype=np.int64) - np.repeat(first_tile, n_tiles)
    tile_start = node_starts[tile_node] + within * rows_per_block
    tile_stop = np.minimum(tile_start + rows_per_block, node_starts[tile_node + 1])
    return tile_node, tile_start.astype(np.int64), tile_stop.astype(np.int64)


def block_shape(n_features, n_bins, n_channels, shared_bytes=SHARED_BYTES):
    """Feature and channel chunk sizes whose histogram fits ``shared_bytes``.

    Returns
    -------
    feat_per_block, chan_per_block : int
    """
    per_bin = 8 * n_bins
    chan_per_block = max(1, min(n_channels, shared_bytes // per_bin))
    feat_per_block = max(1, min(n_features, shared_bytes // (per_bin * chan_per_block)))
    if per_bin * chan_per_block * feat_per_block > shared_bytes:
        raise ValueError(f"one bin axis of {n_bins} float64 entries does not fit in "
                         f"{shared_bytes} bytes of shared memory")
    return int(feat_per_block), int(chan_per_block)


def _zero_kernel(flat):
    """CUDA kernel body: ``flat[:] = 0`` (zeroes the output on the device, no upload)."""
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < flat.shape[0]:
        flat[i] = 0.0
        i += step


_ZERO = None


def _compiled_zero():
    global _ZERO
    if _ZERO is None:
        _ZERO = cuda.jit((types.Array(types.float64, 1, "C"),), cache=True)(_zero_kernel)
    return _ZERO


class CudaHistogramContext:
    """The bin codes of one fit, uploaded to the GPU once, and histogram launches over them.

    A fit builds histograms level after level over the same codes; only the per-call
    inputs (channels, row ids, node bounds) change. Uploading the ``(n_features,
    n_rows)`` code matrix on every call would move more bytes than the kernel reads,
    so this context keeps one device copy for its lifetime.

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows)
        Every code must be ``< n_bins`` (checked by the caller, see
        :func:`histogram.kernels.build_histograms`).
    n_bins : int
    rows_per_block, threads_per_block : int
        Launch shape (see the module docstring).
    """

    def __init__(self, binned, n_bins, rows_per_block=ROWS_PER_BLOCK,
                 threads_per_block=THREADS_PER_BLOCK):
        check_narrow_codes(binned)
        if not cuda.is_available():
            raise RuntimeError("backend='cuda' needs a CUDA GPU (or NUMBA_ENABLE_CUDASIM=1)")
        self.n_features, self.n_rows = binned.shape
        self.n_bins = int(n_bins)
        self.rows_per_block = int(rows_per_block)
        self.threads_per_block = int(threads_per_block)
        self.stream = cuda.stream()
        binned = np.ascontiguousarray(binned)
        self.d_binned = cuda.to_device(binned, stream=self.stream)
        #: Host-to-device bytes this context has moved (codes, channels, row ids, tiles).
        self.uploaded_bytes = binned.nbytes
        #: Channel arrays uploaded (a held array counts once, however many builds read it).
        self.channel_uploads = 0
        self._held = None  # (host channels, device copy) while a caller holds them

    def hold_channels(self, channels):
        """Keep a device copy of ``channels`` for the builds that pass this same array.

        The caller promises not to change ``channels`` until :meth:`release_channels`:
        a boosting tree (or a level-wise forest batch) reads one channel array in every
        node's build, so uploading it once per tree instead of once per node moves
        ``n_rows * C * 8`` bytes once rather than at every node (about 30x fewer for a
        31-leaf tree). The upload happens at the first build that uses it.
        """
        self._held = (channels, None)

    def release_channels(self):
        """Forget the held channels (their device copy is freed with the last reference)."""
        self._held = None

    def _device_channels(self, channels):
        held = self._held
        if held is not None and held[0] is channels and held[1] is not None:
            return held[1]
        d_channels = self._upload(np.ascontiguousarray(channels))
        self.channel_uploads += 1
        if held is not None and held[0] is channels:
            self._held = (channels, d_channels)
        return d_channels

    def _upload(self, host):
        self.uploaded_bytes += host.nbytes
        return cuda.to_device(host, stream=self.stream)

    def build(self, channels, rows, node_starts, out=None):
        """Histograms of the node segments of ``rows``, copied back to the host.

        Parameters
        ----------
        channels : ndarray of float64, shape (n_rows, n_channels)
        rows : ndarray of int32, shape (m,)
            Row ids grouped by node, each in ``[0, n_rows)``.
        node_starts : ndarray of int64, shape (n_nodes + 1,)
        out : ndarray of float64, shape (n_nodes, n_features, n_bins, n_channels), optional

        Returns
        -------
        ndarray of float64, shape (n_nodes, n_features, n_bins, n_channels)
        """
        d_out = self.build_on_device(channels, rows, node_starts)
        if out is None:
            out = np.empty(d_out.shape, dtype=CHANNEL_DTYPE)
        if d_out.size:
            d_out.copy_to_host(out, stream=self.stream)
            self.stream.synchronize()
        else:
            out[...] = 0.0
        return out

    def build_on_device(self, channels, rows, node_starts):
        """:meth:`build` without the copy back: the device array (the launch is queued
        on ``self.stream``; synchronize before reading it). ``channels`` held by
        :meth:`hold_channels` are not uploaded again."""
        d_channels = self._device_channels(channels)
        d_rows = self._upload(np.ascontiguousarray(rows, dtype=np.int32))
        return self.launch(d_channels, d_rows, node_starts)

    def launch(self, d_channels, d_rows, node_starts):
        """Zero an output on the device and queue the histogram kernel on ``self.stream``.

        Parameters
        ----------
        d_channels : device array of float64, shape (n_rows, n_channels)
        d_rows : device array of int32, shape (m,)
        node_starts : ndarray of int64, shape (n_nodes + 1,)
            On the host: the tiles are planned there.

        Returns
        -------
        device array of float64, shape (n_nodes, n_features, n_bins, n_channels)
        """
        n_channels = d_channels.shape[1]
        n_nodes = node_starts.shape[0] - 1
        shape = (n_nodes, self.n_features, self.n_bins, n_channels)
        stream = self.stream
        d_out = cuda.device_array(shape, dtype=CHANNEL_DTYPE, stream=stream)
        if d_out.size == 0:
            return d_out
        _compiled_zero()[min(1024, -(-d_out.size // 256)), 256, stream](d_out.reshape(d_out.size))
        tile_node, tile_start, tile_stop = plan_tiles(node_starts, self.rows_per_block)
        if tile_node.shape[0] == 0:
            return d_out
        fpb, cpb = block_shape(self.n_features, self.n_bins, n_channels)
        grid = (tile_node.shape[0], -(-self.n_features // fpb), -(-n_channels // cpb))
        shared = 8 * self.n_bins * fpb * cpb
        tiles = [self._upload(a) for a in (tile_node, tile_start, tile_stop)]
        _compiled_kernel()[grid, self.threads_per_block, stream, shared](
            self.d_binned, d_channels, d_rows, *tiles, np.int64(fpb), np.int64(cpb), d_out)
        return d_out


def build_histograms_cuda(binned, channels, rows, node_starts, n_bins, out=None,
                          rows_per_block=ROWS_PER_BLOCK, threads_per_block=THREADS_PER_BLOCK):
    """Histograms on the GPU in one call: upload the codes, launch, copy the result back.

    Parameters are those of :func:`histogram.kernels.build_histograms` (already
    validated there); ``rows`` must be int32 and ``node_starts`` int64. A loop over
    levels of one fit should hold a :class:`CudaHistogramContext` instead, which
    uploads the codes once.

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows)
    channels : ndarray of float64, shape (n_rows, n_channels)
    rows : ndarray of int32, shape (m,)
    node_starts : ndarray of int64, shape (n_nodes + 1,)
    n_bins : int
    out : ndarray of float64, shape (n_nodes, n_features, n_bins, n_channels), optional
    rows_per_block, threads_per_block : int

    Returns
    -------
    ndarray of float64, shape (n_nodes, n_features, n_bins, n_channels)
    """
    context = CudaHistogramContext(binned, n_bins, rows_per_block, threads_per_block)
    return context.build(channels, rows, node_starts, out=out)

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


def build_histograms_cuda(binned, channels, rows, node_starts, n_bins, out=None,
                          rows_per_block=ROWS_PER_BLOCK, threads_per_block=THREADS_PER_BLOCK):
    """Histograms on the GPU: copy inputs to the device, launch, copy the result back.

    Parameters are those of :func:`histogram.kernels.build_histograms` (already
    validated there); ``rows`` must be int32 and ``node_starts`` int64.

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
    if not cuda.is_available():
        raise RuntimeError("backend='cuda' needs a CUDA GPU (or NUMBA_ENABLE_CUDASIM=1)")
    n_features = binned.shape[0]
    n_channels = channels.shape[1]
    n_nodes = node_starts.shape[0] - 1
    shape = (n_nodes, n_features, n_bins, n_channels)
    if out is None:
        out = np.empty(shape, dtype=CHANNEL_DTYPE)
    tile_node, tile_start, tile_stop = plan_tiles(node_starts, rows_per_block)
    if tile_node.shape[0] == 0 or n_features == 0:
        out[...] = 0.0
        return out
    fpb, cpb = block_shape(n_features, n_bins, n_channels)
    grid = (tile_node.shape[0], -(-n_features // fpb), -(-n_channels // cpb))
    shared = 8 * n_bins * fpb * cpb

    stream = cuda.stream()
    d_binned = cuda.to_device(np.ascontiguousarray(binned), stream=stream)
    d_channels = cuda.to_device(np.ascontiguousarray(channels), stream=stream)
    d_rows = cuda.to_device(np.ascontiguousarray(rows, dtype=np.int32), stream=stream)
    d_tn = cuda.to_device(tile_node, stream=stream)
    d_ts = cuda.to_device(tile_start, stream=stream)
    d_te = cuda.to_device(tile_stop, stream=stream)
    d_out = cuda.to_device(np.zeros(shape, dtype=CHANNEL_DTYPE), stream=stream)
    _compiled_kernel()[grid, threads_per_block, stream, shared](
        d_binned, d_channels, d_rows, d_tn, d_ts, d_te, np.int64(fpb), np.int64(cpb), d_out)
    d_out.copy_to_host(out, stream=stream)
    stream.synchronize()
    return out

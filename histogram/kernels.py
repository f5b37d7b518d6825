"""Public histogram API: one entry point over three backends, plus subtraction.

``build_histograms`` sums any number of float64 channels per (node, feature, bin) for
many nodes at once into one ``[node, feature, bin, channel]`` buffer. It validates the
inputs once and dispatches to

* ``"numpy"``: :func:`histogram.reference.build_histograms_numpy` (the oracle),
* ``"numba"``: :func:`histogram.cpu_kernels.build_histograms_numba` (parallel CPU),
* ``"cuda"``: :func:`histogram.cuda_kernels.build_histograms_cuda` (Numba CUDA; the
  module and ``numba.cuda`` are imported only when this backend is asked for),
* ``"auto"``: the Numba CPU backend.
"""
import numpy as np

from .dtypes import CHANNEL_DTYPE, MAX_CATEGORY_CODES, ROW_INDEX_DTYPE, is_bin_dtype

BACKENDS = ("numpy", "numba", "cuda", "auto")


def build_histograms(binned, channels, rows, node_starts, n_bins, backend="auto", out=None):
    """Sum channels per (node, feature, bin).

    Parameters
    ----------
    binned : ndarray of uint8 or uint16, shape (n_features, n_rows)
        Feature-major bin codes; every code must be ``< n_bins``. uint16 only for a
        bin axis wider than 256 (wide categorical codes, :func:`histogram.dtypes.bin_dtype`).
    channels : ndarray of float64, shape (n_rows, n_channels)
        Per-row statistics (e.g. gradient, hessian), C-contiguous.
    rows : ndarray of int32, shape (m,), or None
        Local row ids grouped by node. ``None`` means the identity
        ``arange(n_rows)`` (the root: a fast path that never reads an index array);
        then ``node_starts`` indexes rows directly.
    node_starts : ndarray of int64, shape (n_nodes + 1,)
        Node ``i`` owns ``rows[node_starts[i]:node_starts[i + 1]]``; non-decreasing,
        ``node_starts[0] >= 0`` and ``node_starts[-1] <= m``. Empty nodes are allowed.
    n_bins : int
        Length of the bin axis (``BinMapper.n_bins_``), at most 256 for uint8 codes.
    backend : {"auto", "numpy", "numba", "cuda"}
    out : ndarray of float64, shape (n_nodes, n_features, n_bins, n_channels), optional
        C-contiguous buffer to overwrite and return (saves an allocation per level).

    Returns
    -------
    ndarray of float64, shape (n_nodes, n_features, n_bins, n_channels)
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    binned, channels, rows, node_starts, identity = validate_inputs(
        binned, channels, rows, node_starts, n_bins)
    n_nodes = node_starts.shape[0] - 1
    shape = (n_nodes, binned.shape[0], int(n_bins), channels.shape[1])
    out = _check_out(out, shape)

    if backend == "numpy":
        from .reference import build_histograms_numpy
        if identity:
            rows = np.arange(binned.shape[1], dtype=ROW_INDEX_DTYPE)
        return build_histograms_numpy(binned, channels, rows, node_starts, int(n_bins),
                                      out=out)
    if backend == "cuda":
        # One-shot: uploads the codes on every call. A fit's level loop holds a
        # histogram.cuda_kernels.CudaHistogramContext instead (forest.engine.hist_builder).
        from .cuda_kernels import build_histograms_cuda
        if identity:
            rows = np.arange(binned.shape[1], dtype=ROW_INDEX_DTYPE)
        return build_histograms_cuda(binned, channels, rows, node_starts, int(n_bins), out=out)
    from .cpu_kernels import build_histograms_numba
    if out is None:
        out = np.empty(shape, dtype=CHANNEL_DTYPE)
    return build_histograms_numba(binned, channels, rows, node_starts, int(n_bins), out,
                                  identity=identity)


def subtract_histograms(parent, child, out=None):
    """Sibling histogram by subtraction: ``parent - child``.

    Parameters
    ----------
    parent, child : ndarray of float64, same shape (..., n_features, n_bins, n_channels)
    out : ndarray, optional
        Destination (may be ``parent`` itself for an in-place update).

    Returns
    -------
    ndarray, same shape as ``parent``
    """
    parent = np.asarray(parent)
    child = np.asarray(child)
    if parent.shape != child.shape:
        raise ValueError(f"subtract_histograms: shapes differ, parent {parent.shape} "
                         f"vs child {child.shape}")
    return np.subtract(parent, child, out=out)


def validate_inputs(binned, channels, rows, node_starts, n_bins, check_codes=True):
    """Check dtypes, shapes and index ranges; return contiguous arrays and identity flag.

    ``check_codes=False`` skips the scan of every code against ``n_bins`` (a pass
    over the whole matrix), for callers that checked the same matrix once already.

    Returns
    -------
    binned, channels, rows, node_starts : ndarray
        Contiguous; ``rows`` int32 (empty when ``identity``), ``node_starts`` int64.
    identity : bool
        Whether ``rows`` was None (all rows, in order).
    """
    binned = np.asarray(binned)
    if binned.ndim != 2 or not is_bin_dtype(binned.dtype):
        raise ValueError(f"binned must be a 2-D uint8 (or uint16) array (n_features, n_rows), got "
                         f"{binned.dtype} with shape {binned.shape}")
    binned = np.ascontiguousarray(binned)
    channels = np.asarray(channels)
    if channels.ndim != 2 or channels.dtype != CHANNEL_DTYPE:
        raise ValueError(f"channels must be a 2-D float64 array (n_rows, n_channels), got "
                         f"{channels.dtype} with shape {channels.shape}")
    if channels.shape[0] != binned.shape[1]:
        raise ValueError(f"channels has {channels.shape[0]} rows but binned has "
                         f"{binned.shape[1]}")
    if channels.shape[1] < 1:
        raise ValueError("channels needs at least one column")
    channels = np.ascontiguousarray(channels)
    n_bins = int(n_bins)
    top = 256 if binned.dtype == np.uint8 else MAX_CATEGORY_CODES + 1
    if not 1 <= n_bins <= top:
        raise ValueError(f"n_bins must be in [1, {top}] for {binned.dtype} codes, got {n_bins}")
    node_starts = np.asarray(node_starts)
    if node_starts.ndim != 1 or node_starts.shape[0] < 1 or node_starts.dtype.kind not in "iu":
        raise ValueError("node_starts must be a 1-D integer array of length n_nodes + 1")
    node_starts = np.ascontiguousarray(node_starts, dtype=np.int64)
    identity = rows is None
    if identity:
        limit = binned.shape[1]
        rows = np.zeros(0, dtype=ROW_INDEX_DTYPE)
    else:
        rows = np.asarray(rows)
        if rows.ndim != 1 or rows.dtype.kind not in "iu":
            raise ValueError("rows must be a 1-D integer array of local row ids")
        rows = np.ascontiguousarray(rows, dtype=ROW_INDEX_DTYPE)
        limit = rows.shape[0]
        if rows.shape[0]:
            lo, hi = int(rows.min()), int(rows.max())
            if lo < 0 or hi >= binned.shape[1]:
                raise ValueError(f"rows must lie in [0, {binned.shape[1]}), got [{lo}, {hi}]")
    if node_starts[0] < 0 or node_starts[-1] > limit or np.any(np.diff(node_starts) < 0):
        raise ValueError(f"node_starts must be non-decreasing within [0, {limit}]")
    if check_codes and binned.size and n_bins < np.iinfo(binned.dtype).max + 1 and int(binned.max()) >= n_bins:
        raise ValueError(f"binned holds code {int(binned.max())} >= n_bins={n_bins}")
    return binned, channels, rows, node_starts, identity


def _check_out(out, shape):
    if out is None:
        return None
    if out.shape != shape or out.dtype != CHANNEL_DTYPE or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float64 array of shape {shape}, got "
                         f"{out.dtype} {out.shape}")
    return out

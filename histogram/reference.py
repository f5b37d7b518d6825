"""Slow, obviously correct NumPy histogram kernel: the oracle for the fast ones.

Every fast kernel (Numba CPU in :mod:`histogram.cpu_kernels`, Numba CUDA in
:mod:`histogram.cuda_kernels`) is tested against :func:`build_histograms_numpy`.
"""
import numpy as np

from .dtypes import CHANNEL_DTYPE, MAX_CATEGORY_CODES


def build_histograms_numpy(binned, channels, rows, node_starts, n_bins, out=None):
    """Per (node, feature, bin) sums of every channel, one ``np.bincount`` at a time.

    Parameters
    ----------
    binned : ndarray of uint8 or uint16, shape (n_features, n_rows)
    channels : ndarray of float64, shape (n_rows, n_channels)
    rows : ndarray of int, shape (m,)
        Local row ids grouped by node.
    node_starts : ndarray of int64, shape (n_nodes + 1,)
        Node ``i`` owns ``rows[node_starts[i]:node_starts[i + 1]]``.
    n_bins : int
    out : ndarray of float64, shape (n_nodes, n_features, n_bins, n_channels), optional

    Returns
    -------
    ndarray of float64, shape (n_nodes, n_features, n_bins, n_channels)
    """
    n_features = binned.shape[0]
    n_channels = channels.shape[1]
    n_nodes = node_starts.shape[0] - 1
    shape = (n_nodes, n_features, n_bins, n_channels)
    if out is None:
        out = np.zeros(shape, dtype=CHANNEL_DTYPE)
    else:
        out[...] = 0.0
    for node in range(n_nodes):
        idx = rows[node_starts[node]:node_starts[node + 1]]
        for f in range(n_features):
            codes = binned[f, idx]
            for c in range(n_channels):
                out[node, f, :, c] = np.bincount(codes, weights=channels[idx, c],
                                                 minlength=n_bins)
    return out


def build_int_histogram_numpy(binned, codes, rows):
    """Per (feature, bin) exact int64 sums of packed codes, one ``np.add.at`` per feature.

    Parameters
    ----------
    binned : ndarray of uint8 or uint16, shape (n_features, n_rows)
    codes : ndarray of int64, shape (n_rows,)
    rows : ndarray of int, shape (m,)
        The node's local row ids.

    Returns
    -------
    ndarray of int64, shape (n_features, 256), or (n_features, MAX_CATEGORY_CODES + 1) for uint16 codes
        Bins past the last code are zero (callers slice to their ``n_bins``).
    """
    width = 256 if binned.dtype == np.uint8 else MAX_CATEGORY_CODES + 1
    out = np.zeros((binned.shape[0], width), dtype=np.int64)
    vals = codes[rows]
    for f in range(binned.shape[0]):
        np.add.at(out[f], binned[f, rows], vals)
    return out

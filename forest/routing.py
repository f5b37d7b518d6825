"""How an innerNode routes a row: the one home of the "goes left" rule.

A split node ``(feature f, bin threshold b, threshold t, missing_left m)`` sends a row

* on binned codes (uint8, :class:`histogram.binning.BinMapper`): left when
  ``code <= b``, and the missing bin left exactly when ``m``;
* on raw float features: left when ``x <= t``, and NaN left exactly when ``m``.

The two agree because ``x <= bin_thresholds_[f][b]`` exactly when ``bin(x) <= b``.
Every kernel that partitions rows or walks trees (:mod:`forest.partition`,
:mod:`forest.local_growth`, :mod:`forest.predictor`, leaf re-estimation in
:mod:`forest.grower`) calls the Numba functions here, and the slow references call
:func:`goes_left_codes`, so the rule cannot drift between them.
"""
import numba
import numpy as np


@numba.njit(cache=True, inline="always")
def goes_left_code(code, bin_threshold, missing_left, missing_bin):
    """Whether a binned row goes left (branch-free: the side is often a coin flip)."""
    return ((code <= bin_threshold) & (code != missing_bin)) | ((code == missing_bin) & (missing_left != 0))


@numba.njit(cache=True, inline="always")
def goes_left_value(x, threshold, missing_left):
    """Whether a raw feature value goes left (NaN is missing)."""
    if np.isnan(x):
        return missing_left != 0
    return x <= threshold


@numba.njit(cache=True, inline="always")
def walk_binned(binned, i, node, feature, bin_threshold, missing_left, left, right, missing_bin):
    """Leaf reached by row ``i`` of feature-major codes ``binned`` from ``node``.

    ``left`` / ``right`` hold ids into the same arrays as ``node`` (the packed
    layout of :func:`forest.tree.pack_trees`); leaves have ``feature < 0``.
    """
    while feature[node] >= 0:
        code = np.int32(binned[feature[node], i])
        if goes_left_code(code, bin_threshold[node], missing_left[node], missing_bin):
            node = left[node]
        else:
            node = right[node]
    return node


@numba.njit(cache=True, inline="always")
def walk_raw(X, i, node, feature, threshold, missing_left, left, right):
    """Leaf reached by row ``i`` of raw features ``X`` (n, n_features) from ``node``."""
    while feature[node] >= 0:
        if goes_left_value(X[i, feature[node]], threshold[node], missing_left[node]):
            node = left[node]
        else:
            node = right[node]
    return node


def goes_left_codes(codes, bin_threshold, missing_left, missing_bin):
    """NumPy version of :func:`goes_left_code` for arrays of codes (slow references).

    Parameters
    ----------
    codes : ndarray of int, shape (n,)
    bin_threshold : int
    missing_left : bool
    missing_bin : int

    Returns
    -------
    ndarray of bool, shape (n,)
    """
    codes = np.asarray(codes, dtype=np.int64)
    return np.where(codes == missing_bin, bool(missing_left), codes <= bin_threshold)

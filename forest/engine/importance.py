"""Feature importances computed from fitted trees.

This module owns the importance measures every tree model in ``forest`` reports:

* :func:`gain_importance`: total split gain per feature (optionally normalised to sum
  to one), the usual boosting importance;
* :func:`split_counts`: number of splits per feature;
* :func:`split_frequencies`: per depth, splits per feature (GRF's ``split_frequencies``);
* :func:`depth_weighted_importance`: GRF's ``variable_importance``: for depths
  ``k = 1 .. max_depth`` (the root is depth 1), the share of depth-``k`` splits made
  on each feature, weighted by ``k ** -decay_exponent`` and divided by the sum of the
  weights.

All take a sequence of :class:`forest.engine.tree.Tree` or a packed-forest dict.
"""
import numpy as np

from forest.engine.tree import Tree


def _node_arrays(trees):
    if isinstance(trees, dict):
        return np.asarray(trees["feature"]), np.asarray(trees["gain"]), np.asarray(trees["depth"])
    if isinstance(trees, Tree):
        trees = [trees]
    trees = list(trees)
    if not trees:
        return np.zeros(0, np.int32), np.zeros(0), np.zeros(0, np.int32)
    return (np.concatenate([t.feature for t in trees]), np.concatenate([t.gain for t in trees]),
            np.concatenate([t.depth for t in trees]))


def _check_n_features(feature, n_features):
    n_features = int(n_features)
    if n_features < 1:
        raise ValueError(f"n_features must be >= 1, got {n_features}")
    if feature.size and feature.max() >= n_features:
        raise ValueError(f"trees split on feature {int(feature.max())} but n_features={n_features}")
    return n_features


def gain_importance(trees, n_features, normalize=True):
    """Total split gain per feature.

    Parameters
    ----------
    trees : sequence of Tree, Tree or packed dict
    n_features : int
    normalize : bool, default True
        Divide by the total so the result sums to one (all zeros if no split).

    Returns
    -------
    ndarray of float64, shape (n_features,)
    """
    feature, gain, _ = _node_arrays(trees)
    n_features = _check_n_features(feature, n_features)
    inner = feature >= 0
    out = np.bincount(feature[inner], weights=np.maximum(gain[inner], 0.0), minlength=n_features).astype(np.float64)
    total = out.sum()
    if normalize and total > 0:
        out /= total
    return out


def split_counts(trees, n_features):
    """Number of splits on each feature.

    Returns
    -------
    ndarray of int64, shape (n_features,)
    """
    feature, _, _ = _node_arrays(trees)
    n_features = _check_n_features(feature, n_features)
    return np.bincount(feature[feature >= 0], minlength=n_features).astype(np.int64)


def split_frequencies(trees, n_features, max_depth=4):
    """Splits per (depth, feature) for the top ``max_depth`` levels.

    Returns
    -------
    ndarray of int64, shape (max_depth, n_features)
        Row ``k - 1`` counts splits at depth ``k`` (root = depth 1).
    """
    feature, _, depth = _node_arrays(trees)
    n_features = _check_n_features(feature, n_features)
    if max_depth < 1:
        raise ValueError(f"max_depth must be >= 1, got {max_depth}")
    sel = (feature >= 0) & (depth < max_depth)
    out = np.zeros((max_depth, n_features), dtype=np.int64)
    np.add.at(out, (depth[sel], feature[sel]), 1)
    return out


def depth_weighted_importance(trees, n_features, max_depth=4, decay_exponent=2.0):
    """GRF's depth-weighted split-frequency importance.

    Parameters
    ----------
    trees : sequence of Tree, Tree or packed dict
    n_features : int
    max_depth : int, default 4
    decay_exponent : float, default 2.0

    Returns
    -------
    ndarray of float64, shape (n_features,)
        ``sum_k w_k * share_k / sum_k w_k`` with ``w_k = k ** -decay_exponent`` and
        ``share_k`` the fraction of depth-``k`` splits on each feature (zero for a depth
        with no splits). Sums to one when every depth up to ``max_depth`` has splits.
    """
    freq = split_frequencies(trees, n_features, max_depth).astype(np.float64)
    share = freq / np.maximum(1.0, freq.sum(axis=1, keepdims=True))
    weight = np.arange(1, max_depth + 1, dtype=np.float64) ** -float(decay_exponent)
    return share.T @ weight / weight.sum()

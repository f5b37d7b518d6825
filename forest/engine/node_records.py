"""Appending grown nodes to trees: node fields from the criterion, splits and children.

This module owns how every growth path (the level-wise and best-first policies of
:mod:`forest.engine.expansion`, tree-parallel finishing in :mod:`forest.engine.tree_parallel`)
writes what it decided into :class:`forest.engine.tree.Tree` objects: node fields come from
the criterion's vectorised methods on the nodes' channel sums, and a split's two
children take consecutive ids (left, right).
"""
import numpy as np

from forest.engine.tree import CATEGORICAL_SPLIT


def node_fields(criterion, stats):
    """``(weight, count, value, objective)`` of nodes with channel sums ``stats`` (k, C)."""
    return (np.asarray(criterion.node_weight(stats), dtype=np.float64),
            np.asarray(criterion.node_count(stats), dtype=np.float64),
            np.asarray(criterion.node_value(stats), dtype=np.float64),
            np.asarray(criterion.node_objective(stats), dtype=np.float64))


def add_roots(trees, criterion, stats):
    """Give each empty tree its root from the root's channel sums ``stats`` (n_trees, C).

    Returns
    -------
    weight, count : ndarray of float64, shape (n_trees,)
    """
    weight, count, value, objective = node_fields(criterion, stats)
    for t, tree in enumerate(trees):
        tree.append_leaves(weight[t:t + 1], count[t:t + 1], value[t:t + 1], objective[t:t + 1],
                           np.zeros(1, dtype=np.int32))
    return weight, count


def record_splits(trees, criterion, owner, parent_node, left_stats, right_stats, depth, feature, bins, missing_left,
                  gain, bin_info, cat_bits=None):
    """Append both children of each split and record the splits, tree by tree.

    Parameters
    ----------
    trees : sequence of forest.engine.tree.Tree
    criterion : forest.criteria.basic.Criterion
    owner : ndarray of int, shape (n_splits,)
        Tree of each split, non-decreasing; within a tree the children take
        consecutive ids in split order (left, right, left, right, ...).
    parent_node : ndarray of int, shape (n_splits,)
    left_stats, right_stats : ndarray of float64, shape (n_splits, C)
    depth : int or ndarray of int, shape (n_splits,)
        The children's depth.
    feature, bins : ndarray of int, shape (n_splits,)
    missing_left : ndarray of bool or uint8, shape (n_splits,)
    gain : ndarray of float64, shape (n_splits,)
    bin_info : forest.engine.bin_info.BinInfo
        Raw thresholds of the bins.
    cat_bits : ndarray of uint64, shape (n_splits, CAT_WORDS), optional
        Category sets of the categorical splits (``bins == CATEGORICAL_SPLIT``; their raw
        threshold is NaN).

    Returns
    -------
    left_ids : ndarray of int64, shape (n_splits,)
    """
    n = len(owner)
    c = left_stats.shape[1]
    stats = np.stack([left_stats, right_stats], axis=1).reshape(2 * n, c)
    weight, count, value, objective = node_fields(criterion, stats)
    child_depth = np.repeat(np.broadcast_to(np.asarray(depth), (n,)), 2)
    feature = np.asarray(feature, dtype=np.int64)
    bins = np.asarray(bins, dtype=np.int64)
    categorical = bins == CATEGORICAL_SPLIT
    thresholds = np.where(categorical, np.nan, bin_info.threshold_table[feature, np.where(categorical, 0, bins)])
    left_ids = np.empty(n, dtype=np.int64)
    bounds = np.flatnonzero(np.diff(owner)) + 1
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [n]])):
        if hi <= lo:
            continue
        tree = trees[owner[lo]]
        s = slice(2 * lo, 2 * hi)
        first = tree.append_leaves(weight[s], count[s], value[s], objective[s], child_depth[s])
        lids = first + 2 * np.arange(hi - lo, dtype=np.int64)
        tree.set_splits(np.asarray(parent_node[lo:hi], dtype=np.int64), feature[lo:hi], bins[lo:hi],
                        thresholds[lo:hi], np.asarray(missing_left[lo:hi], dtype=np.uint8), gain[lo:hi], lids,
                        None if cat_bits is None else cat_bits[lo:hi])
        left_ids[lo:hi] = lids
    return left_ids

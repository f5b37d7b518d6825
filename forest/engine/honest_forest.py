"""Honest subsampled forests on the histogram engine (shared by regression and causal forests).

This module owns the forest-level loop that both :class:`forest.RegressionForest` and
:class:`forest.CausalForest` run: bin the data with global edges, then per batch of
trees draw each tree's rows (:mod:`forest.engine.subsample`), grow the batch level-wise on the
structure halves (:func:`forest.engine.expansion.grow_levelwise`: tree-parallel subtree
kernels, or one histogram pass and one collective per level), re-estimate every node
from the estimation halves (:func:`forest.engine.leaf_estimation.reestimate_leaves`: one
collective per batch), and optionally accumulate out-of-bag leaf values for this
rank's rows. What to grow comes as one :class:`ForestSpec`; how to grow it (engine
settings) as :class:`forest.engine.growth_options.EngineOptions`.

Empty leaves (``honesty_prune_leaves``, grf's ``honesty.prune.leaves``). A leaf that no
estimation row reaches (or, in a regression forest, only rows of zero weight) has no
value of its own. Two rules, chosen by :attr:`ForestSpec.fill_empty`:

``fill_empty=True`` (``honesty_prune_leaves=True``, the default)
    :func:`fill_empty_from_parent`: the leaf takes the whole value row (estimation
    count included) of its nearest non-empty ancestor, so every tree contributes to
    every prediction. This stands in for grf's pruning, which is not the same: grf
    (``Tree::prune_empty_leaves``, bottom-up) replaces a split that has an empty child
    by its other child, leaf or subtree, so a query that would end in the empty leaf
    walks on down the sibling's splits to one of the sibling's leaves. Here it stops at
    the ancestor and gets the mean over *all* the sibling subtree's estimation rows.
    The two agree exactly when that sibling is a leaf (the ancestor's estimation rows
    are then the sibling leaf's); otherwise ours is the coarser cell. Measured on the
    same trees (benchmarks/bench_grf_prune_stabilize.py), grf's pruning has 0.4-0.8%
    lower MSE on small regression designs: kept as is, so fitted models predict as before.
``fill_empty=False`` (``honesty_prune_leaves=False``)
    grf's rule without pruning: the leaf keeps the values of no rows (all zero,
    estimation count 0), and a tree whose leaf is empty for a query is left out of that
    query's average. The estimators read it off the count: a regression forest's
    prediction is a ratio of sums in which an empty leaf adds zero to both; an effect
    forest's estimating equation is homogeneous in the averaged moments, so zero
    moments leave it unchanged whatever the divisor; forest weights, little-bag
    variances (a group with an empty tree is not used, as in grf) and out-of-bag
    error estimates skip leaves of count zero. A query whose every tree is empty gets NaN.

Prediction helpers (:func:`tree_values`, :func:`oob_average`) live in
:mod:`forest.engine.predictor` and are re-exported here. Importances live in :mod:`forest.engine.importance`.

Continuing a forest (checkpoint resume, warm start; :mod:`forest.io.checkpoint`): the
loop can start from trees already grown (:class:`ForestStart`) and reports each
finished batch (``on_batch``). Batches lie on a fixed grid of ``batch_size`` trees
counted from tree 0, so a run resumed at a batch boundary fuses exactly the trees an
uninterrupted run fuses (which decides the float summation order of the collectives
on three or more ranks). Out-of-bag sums of the earlier trees are recomputed by
:func:`oob_sums_binned`: each row adds its trees' values in tree order in both cases,
so the sums are the same bits.
"""
from collections import namedtuple
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from histogram.binning import BinMapper
from histogram.jit import kernel
from native import collectives as col

from forest.engine.expansion import grow_levelwise
from forest.engine.growth_options import TreeParams, current_engine_options
from forest.engine.leaf_estimation import reestimate_leaves
from forest.engine.predictor import accumulate_oob_binned, oob_average, tree_values  # noqa: F401 (re-exported)
from forest.profiling import phase
from forest.engine.subsample import OUT, STRUCTURE, BOTH, ESTIMATION, sampled_row_codes, sampling_segments  # noqa: F401
from forest.engine.tree import pack_trees

#: Histogram memory a batch of trees may use at its widest level (bytes, estimate).
HIST_BUDGET_BYTES = 384 * 2 ** 20


def global_ids(comm, n_local):
    """Global ids of this rank's rows (ranks hold consecutive blocks in rank order).

    Returns
    -------
    gids : ndarray of int64, shape (n_local,)
    n_global : int
    """
    if comm.size == 1:
        return np.arange(n_local, dtype=np.int64), int(n_local)
    offset, n_global = col.global_row_offset(comm, n_local)
    return np.arange(offset, offset + n_local, dtype=np.int64), int(n_global)


def fit_binning(X, max_bins, seed, comm, categorical=None):
    """Global bin edges and this rank's feature-major codes.

    ``categorical`` (bool, ``(n_features,)``) marks the columns that hold category codes
    (:meth:`histogram.binning.BinMapper.mark_categorical`).

    Returns
    -------
    mapper : BinMapper
    binned : ndarray of uint8, shape (n_features, n_local)
    """
    with phase("binning"):
        mapper = BinMapper(max_bins=max_bins, random_state=seed)
        mapper.fit(X, comm=comm, categorical=categorical)
        return mapper, mapper.transform(X)


#: Smallest batch when a progress callback asks for at least ten updates per fit.
PROGRESS_MIN_BATCH = 8


def auto_batch_size(n_struct_global, n_features, n_bins, n_channels, min_leaf, max_depth, n_trees,
                    local_threshold=0.0):
    """Trees per level-wise batch, so the widest frontier fits :data:`HIST_BUDGET_BYTES`.

    A tree of ``s`` structure rows with children of at least ``min_leaf`` rows has
    at most ``s / min_leaf`` nodes on a level (fewer with ``max_depth``); a level keeps
    about three histogram copies of its frontier. With local finishing
    (``local_threshold > 0``, see :func:`forest.engine.expansion.grow_levelwise`) only nodes
    heavier than the threshold get histograms: at most ``s / local_threshold`` per
    level, two children each.
    """
    per_node = n_features * n_bins * n_channels * 8 * 3
    frontier = max(1.0, n_struct_global / max(2 * min_leaf, 1))
    if local_threshold and local_threshold > 0:
        frontier = min(frontier, max(1.0, 2.0 * n_struct_global / local_threshold))
    if max_depth is not None:
        frontier = min(frontier, 2.0 ** max_depth)
    return int(np.clip(HIST_BUDGET_BYTES // (per_node * frontier), 1, min(n_trees, 128)))


@kernel
def _fill_from_parent(value, feature, left, right, count_col):
    # Parents have smaller ids than their children: one forward pass settles chains.
    for node in range(value.shape[0]):
        if feature[node] >= 0:
            for child in (left[node], right[node]):
                if value[child, count_col] <= 0:
                    for j in range(value.shape[1]):
                        value[child, j] = value[node, j]


def fill_empty_from_parent(tree, count_col):
    """Give nodes with no estimation rows the value of their nearest non-empty ancestor.

    Parameters
    ----------
    tree : forest.engine.tree.Tree
        Modified in place.
    count_col : int
        Column of ``tree.value`` holding the node's estimation row count.
    """
    value = tree.value
    if not (value[:, count_col] <= 0).any():
        return
    value = np.ascontiguousarray(value, dtype=np.float64).copy()
    _fill_from_parent(value, np.ascontiguousarray(tree.feature), np.ascontiguousarray(tree.left),
                      np.ascontiguousarray(tree.right), int(count_col))
    tree.value = value


#: Where a continued forest starts: ``trees`` (list of Tree, indices 0..len-1) already
#: grown, their out-of-bag sums ``oob_acc`` / ``oob_cnt`` for this rank's rows (or
#: None), and ``batch_size``, the batch grid to keep (None: choose as usual).
ForestStart = namedtuple("ForestStart", "trees oob_acc oob_cnt batch_size")


def batch_ranges(first, n_trees, batch_size):
    """Tree ranges ``(lo, hi)`` from ``first`` to ``n_trees`` on the grid of ``batch_size``.

    Returns
    -------
    list of (int, int)
        ``[(0, B), (B, 2B), ...]`` from 0; from another start, a first shorter range
        up to the next multiple of ``B``, then the grid.
    """
    out, lo = [], int(first)
    while lo < n_trees:
        hi = min(n_trees, (lo // batch_size + 1) * batch_size)
        out.append((lo, hi))
        lo = hi
    return out


def oob_sums_binned(packed, binned, missing_bin, gids, sampling, clusters=None, chunk_trees=64):
    """Out-of-bag sums of a forest's leaf values over this rank's training rows.

    The fit accumulates these batch by batch; every row adds its out-of-bag trees in
    tree order either way, so the result equals the fit's sums bit for bit.

    Parameters
    ----------
    packed : dict
        Packed forest, trees ``0 .. n_trees - 1`` of ``sampling``.
    binned : ndarray of uint8, shape (n_features, n_local)
    missing_bin : int
    gids : ndarray of int64, shape (n_local,)
    sampling : dict
        ``seed, sample_fraction, ci_group_size, honest, honesty_fraction``.
    clusters : forest.engine.clusters.ClusterLayout, optional
        As in the fit.

    Returns
    -------
    acc : ndarray of float64, shape (n_local, n_values)
    cnt : ndarray of float64, shape (n_local,)
    """
    n_local = binned.shape[1]
    acc = np.zeros((n_local, packed["value"].shape[1]))
    cnt = np.zeros(n_local)
    offsets = packed["tree_offsets"]
    for lo, hi, codes in _oob_code_chunks(sampling, gids, len(offsets) - 1, chunk_trees, clusters):
        sub = dict(packed, tree_offsets=offsets[lo:hi + 1])
        accumulate_oob_binned(sub, binned, missing_bin, codes, acc, cnt)
    return acc, cnt


def _oob_code_chunks(sampling, gids, n_trees, chunk_trees, clusters=None):
    """Yield ``(lo, hi, codes)``: packed trees ``lo:hi`` and their row codes for ``gids``."""
    pos = 0
    for seed, first, count in sampling_segments(sampling, n_trees):
        for a in range(0, count, chunk_trees):
            b = min(count, a + chunk_trees)
            codes = sampled_row_codes(sampling, seed, np.arange(first + a, first + b), gids, clusters)
            yield pos + a, pos + b, codes
        pos += count


@dataclass(frozen=True)
class ForestSpec:
    """What :func:`grow_honest_forest` grows, from an estimator's parameters.

    Attributes
    ----------
    n_estimators : int
    sampling : dict
        Each tree's rows: the estimator's ``sampling_`` (``seed, sample_fraction,
        ci_group_size, honest, honesty_fraction``; :mod:`forest.engine.subsample`).
    tree : forest.engine.growth_options.TreeParams
        The trees' shape (its ``seed`` keys the mtry draw).
    value_fn : callable
        Node sums (n_nodes, C) -> node values (n_nodes, n_outputs).
    count_col : int
        Column of the node values holding the estimation count (empty-leaf fallback).
    batch_size : int or None
        Trees per batch; ``None`` chooses by :func:`auto_batch_size`.
    fill_empty : bool
        Give empty leaves their nearest non-empty ancestor's value (module docstring);
        False leaves them empty (count 0), as grf's ``honesty.prune.leaves=FALSE``.
    """

    n_estimators: int
    sampling: dict
    tree: TreeParams
    value_fn: Callable
    count_col: int
    batch_size: Optional[int] = None
    fill_empty: bool = True


def grow_honest_forest(binned, mapper, gids, channels, criterion, spec, *, n_global, comm, oob=False, progress=None,
                       clusters=None, start=None, on_batch=None, engine=None):
    """Grow and honestly re-estimate a forest in batches.

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_local)
    mapper : BinMapper
    gids : ndarray of int64, shape (n_local,)
    channels : ndarray of float64, shape (n_local, C)
        Per-row channels (used for growing and for re-estimation).
    criterion : forest.criteria.basic.Criterion
    spec : ForestSpec
    n_global : int
    comm : native.comm.Communicator
    oob : bool
        Also accumulate out-of-bag leaf values for this rank's rows.
    progress : callable, optional
        ``progress(n_trees_done, n_trees_total)`` after each batch.
    clusters : forest.engine.clusters.ClusterLayout, optional
        Sample by cluster (:func:`forest.engine.subsample.tree_row_codes`).
    start : ForestStart, optional
        Continue after these trees (grow trees ``len(start.trees) .. n_estimators - 1``).
    on_batch : callable, optional
        ``on_batch(new_trees, n_done, batch_size)`` after each batch, before ``progress``.
    engine : forest.engine.growth_options.EngineOptions, optional
        Default: :func:`forest.engine.growth_options.current_engine_options`.

    Returns
    -------
    packed : dict
        The packed forest (``forest.engine.tree.pack_trees``).
    oob_acc : ndarray, shape (n_local, n_outputs), or None
    oob_cnt : ndarray, shape (n_local,), or None
    """
    engine = current_engine_options() if engine is None else engine
    n_estimators, sampling, params = int(spec.n_estimators), spec.sampling, spec.tree
    n_local = binned.shape[1]
    finishes_locally = engine.local_threshold > 0 and criterion.compiled() is not None
    batch_size = spec.batch_size
    if batch_size is None:
        n_struct = n_global * sampling["sample_fraction"] * (sampling["honesty_fraction"] if sampling["honest"]
                                                             else 1.0)
        batch_size = auto_batch_size(n_struct, binned.shape[0], mapper.n_bins_, criterion.n_channels,
                                     getattr(criterion, "min_samples_leaf", 1), params.max_depth, n_estimators,
                                     engine.local_threshold if finishes_locally else 0.0)
    if progress is not None:
        # A progress bar that jumps from 0 to 100% says nothing: report at least ten
        # times. Batches of 8+ trees still keep every thread busy on small machines,
        # and the trees do not depend on the batching (sampling is hashed per tree).
        # A constant, not the thread count, since all ranks must run the same batches.
        batch_size = min(batch_size, max(PROGRESS_MIN_BATCH, -(-n_estimators // 10)))
    ci_group_size = int(sampling["ci_group_size"])
    if ci_group_size > 1:
        batch_size = max(ci_group_size, batch_size - batch_size % ci_group_size)
    trees = [] if start is None else list(start.trees)
    if start is not None and start.batch_size is not None:
        batch_size = int(start.batch_size)
    oob_acc = None if start is None else start.oob_acc   # else allocated once the value width is known
    oob_cnt = (np.zeros(n_local) if start is None or start.oob_cnt is None else start.oob_cnt) if oob else None
    if progress is not None and trees:
        progress(len(trees), n_estimators)
    for lo, hi in batch_ranges(len(trees), n_estimators, batch_size):
        idx = np.arange(lo, hi, dtype=np.int64)
        with phase("other"):
            codes = sampled_row_codes(sampling, sampling["seed"], idx, gids, clusters)
            grow_rows = [np.flatnonzero((c == STRUCTURE) | (c == BOTH)).astype(np.int32) for c in codes]
            est_rows = [np.flatnonzero((c == ESTIMATION) | (c == BOTH)).astype(np.int32) for c in codes]
        batch = grow_levelwise(binned, channels, grow_rows, criterion, mapper, params, tree_indices=idx, comm=comm,
                               gids=gids, engine=engine)
        reestimate_leaves(batch, binned, channels, est_rows, spec.value_fn, mapper.missing_bin_, comm=comm,
                          algorithm=engine.algorithm)
        if spec.fill_empty:
            with phase("leaves"):
                for tree in batch:
                    fill_empty_from_parent(tree, spec.count_col)
        if oob:
            packed = pack_trees(batch)
            if oob_acc is None:
                oob_acc = np.zeros((n_local, packed["value"].shape[1]))
            accumulate_oob_binned(packed, binned, mapper.missing_bin_, codes, oob_acc, oob_cnt)
        trees.extend(batch)
        if on_batch is not None:
            on_batch(batch, len(trees), batch_size)
        if progress is not None:
            progress(len(trees), n_estimators)
    return pack_trees(trees), oob_acc, oob_cnt

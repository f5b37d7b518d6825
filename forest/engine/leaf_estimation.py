"""Leaf re-estimation: node values from another row set per tree (honest estimation).

This module owns the step after growth in honest forests: route each tree's
estimation rows through the grown trees on binned data, sum the channels per node,
reduce all trees' sums in ONE collective, sum inner nodes from their leaves and set
every node's value from its sums (a user function, e.g. the criterion's
``node_value``). It works for any channel layout (the sums need not be the growing
criterion's).
"""
import numba
import numpy as np

from histogram.jit import kernel, compiled_only
from native import collectives as col
from native.comm import world

from forest.engine.hist_builder import SERIAL_BUILD_ROWS
from forest.profiling import phase
from forest.engine.routing import walk_binned
from forest.engine.tree import stacked_cat_bits


@compiled_only
def _route_sum_tree(t, binned, channels, rows, row_starts, feature, bin_thr, missing_left, left, right, offsets,
                    missing_bin, cat_bits, out):
    # Sums tree t's rows into the leaf each reaches (rows in the given order);
    # ``left`` / ``right`` are packed ids (tree offset added), as walk_binned expects.
    c = channels.shape[1]
    # Unsigned row and node ids: no negative-index wraparound per access (walk_binned).
    for i in range(row_starts[t], row_starts[t + 1]):
        r = np.uint64(rows[i])
        node = np.uint64(walk_binned(binned, r, offsets[t], feature, bin_thr, missing_left, left, right, missing_bin,
                                     cat_bits))
        for k in range(c):
            out[node, k] += channels[r, k]


@kernel
def _route_sum_serial(binned, channels, rows, row_starts, feature, bin_thr, missing_left, left, right, offsets,
                      missing_bin, cat_bits, out):
    for t in range(offsets.shape[0] - 1):
        _route_sum_tree(t, binned, channels, rows, row_starts, feature, bin_thr, missing_left, left, right, offsets,
                        missing_bin, cat_bits, out)


@kernel(parallel=True)
def _route_sum_parallel(binned, channels, rows, row_starts, feature, bin_thr, missing_left, left, right, offsets,
                        missing_bin, cat_bits, out):
    # Trees own disjoint node slices of ``out``: no races.
    for t in numba.prange(offsets.shape[0] - 1):
        _route_sum_tree(t, binned, channels, rows, row_starts, feature, bin_thr, missing_left, left, right, offsets,
                        missing_bin, cat_bits, out)


@kernel
def _sum_inner_nodes(feature, left, right, offsets, sums):
    # Children have larger ids than their parent: one backward pass per tree.
    for t in range(offsets.shape[0] - 1):
        base = offsets[t]
        for node in range(offsets[t + 1] - base - 1, -1, -1):
            if feature[base + node] >= 0:
                for k in range(sums.shape[1]):
                    sums[base + node, k] = sums[base + left[base + node], k] + sums[base + right[base + node], k]


def reestimate_leaves(trees, binned, channels, tree_rows, value_fn, missing_bin, comm=None, algorithm="auto"):
    """Set node values from another row set per tree (honest estimation).

    Parameters
    ----------
    trees : sequence of Tree
        Modified in place: ``value`` becomes ``value_fn(sums)``.
    binned : ndarray of uint8, shape (n_features, n_rows)
    channels : ndarray of float64, shape (n_rows, C)
        Channels to sum (any ``C``; need not be the growing criterion's).
    tree_rows : sequence of ndarray of int
        Per tree, this rank's local estimation rows.
    value_fn : callable
        ``value_fn(sums (n_nodes, C)) -> (n_nodes, n_outputs)``, row by row; it is
        called once with the global sums of every node of every tree stacked (inner
        nodes sum their leaves).
    missing_bin : int
    comm : native.comm.Communicator, optional
    algorithm : str

    Returns
    -------
    list of ndarray of float64, shape (n_nodes_t, C)
        The global channel sums of every node of every tree (identical on all ranks).
    """
    comm = world() if comm is None else comm
    trees = list(trees)
    if len(tree_rows) != len(trees):
        raise ValueError(f"got {len(tree_rows)} row sets for {len(trees)} trees")
    channels = np.ascontiguousarray(channels, dtype=np.float64)
    if channels.ndim != 2 or channels.shape[0] != np.asarray(binned).shape[1]:
        raise ValueError(f"channels must have shape ({np.asarray(binned).shape[1]}, C), got {channels.shape}")
    c = channels.shape[1]
    sizes = np.array([t.node_count for t in trees], dtype=np.int64)
    offsets = np.zeros(len(trees) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    local = np.zeros((int(offsets[-1]), c))
    with phase("leaves"):
        # One kernel for all trees (tree-local child ids, concatenated node arrays).
        cat = {name: np.ascontiguousarray(np.concatenate([getattr(t, name) for t in trees]))
               for name in ("feature", "bin_threshold", "missing_left", "left", "right")} if trees else None
        lengths = np.array([len(r) for r in tree_rows], dtype=np.int64)
        row_starts = np.zeros(len(trees) + 1, dtype=np.int64)
        np.cumsum(lengths, out=row_starts[1:])
        all_rows = np.ascontiguousarray(np.concatenate([np.asarray(r, dtype=np.int64) for r in tree_rows])) \
            if lengths.sum() else np.zeros(0, dtype=np.int64)
        if trees and len(all_rows):
            route_sum = _route_sum_serial if (len(all_rows) < SERIAL_BUILD_ROWS or numba.get_num_threads() == 1) \
                else _route_sum_parallel
            base = np.repeat(offsets[:-1], sizes)
            packed_left = np.where(cat["left"] >= 0, cat["left"] + base, -1)
            packed_right = np.where(cat["right"] >= 0, cat["right"] + base, -1)
            cat_bits = stacked_cat_bits(trees)
            route_sum(np.asarray(binned), channels, all_rows, row_starts, cat["feature"], cat["bin_threshold"],
                   cat["missing_left"], packed_left, packed_right, offsets, int(missing_bin), cat_bits, local)
    with phase("communication"):
        total = col.allreduce(comm, local, algorithm=algorithm) if comm.size > 1 else local
    out = []
    with phase("leaves"):
        total = np.ascontiguousarray(total.reshape(-1, c))
        if trees:
            _sum_inner_nodes(cat["feature"], cat["left"], cat["right"], offsets, total)
            values = np.asarray(value_fn(total), dtype=np.float64).reshape(len(total), -1)
        for t, tree in enumerate(trees):
            tree.value = values[offsets[t]:offsets[t + 1]]
            out.append(total[offsets[t]:offsets[t + 1]].copy())
    return out

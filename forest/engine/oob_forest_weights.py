"""Out-of-bag forest weights: a training row's weights over the trees that left it out.

grf's out-of-bag predictions of its weight-based estimators (local linear prediction and
its ``ll.lambda`` tuning among them) give a training row ``j`` the forest weights of the
trees whose subsample did not hold ``j``:

    alpha_i^oob(x_j) = sum_{b: j out of bag} 1[i in V_b(x_j)] f_i / rows_b(x_j)  /  D^oob(x_j),

with ``V_b``, ``rows_b``, ``f_i`` and the normaliser as in :mod:`forest.engine.forest_weights`
(``D^oob`` sums only the out-of-bag trees). Row ``j`` itself never gets weight: it is in
no estimation half of a tree that left it out. "Out of bag" is subsample code ``OUT``
(:mod:`forest.engine.subsample`): a row of a drawn cluster that the tree did not keep
is not out of bag (grf draws clusters).

The query rows are given by their leaves with the trees they were in the bag for
masked out (leaf ``-1``), so under ``mpirun`` a rank gathers the other ranks' training
rows as one int32 array (:func:`oob_query_leaves`) and adds its own estimation rows, as
:func:`forest.engine.forest_weights.forest_weights` does for ordinary queries; each
query row's entries are merged by training row in tree order, so the result does not
depend on how the training rows are spread over ranks.
"""
import numpy as np
from numba import prange

from histogram.jit import kernel
from forest.engine.forest_weights import value_nodes
from forest.engine.subsample import ESTIMATION, BOTH, OUT


def oob_query_leaves(leaves, codes):
    """Leaves of training rows as out-of-bag queries: ``-1`` where the row was in the tree's bag.

    Parameters
    ----------
    leaves : ndarray of int, shape (n, n_trees)
        Tree-local leaf of each row (:func:`forest.engine.predictor.predict_leaves_binned`).
    codes : ndarray of int8, shape (n_trees, n)
        The rows' roles (:func:`forest.engine.subsample.forest_row_codes`).

    Returns
    -------
    ndarray of int32, shape (n, n_trees)
    """
    return np.ascontiguousarray(np.where(np.asarray(codes).T == OUT, leaves, -1), dtype=np.int32)


@kernel
def _bounds(qleaves, offsets, vnode, count, node_lo, node_hi, out):
    for q in range(qleaves.shape[0]):
        s = 0
        for t in range(offsets.shape[0] - 1):
            leaf = qleaves[q, t]
            if leaf < 0:
                continue
            v = vnode[offsets[t] + leaf]
            if count[v] > 0:
                s += node_hi[v] - node_lo[v]
        out[q] = s


@kernel
def _fill_one(q, qleaves, offsets, vnode, count, norm, node_lo, node_hi, rows, factor, start, cols, vals):
    k = start
    denom = 0.0
    for t in range(offsets.shape[0] - 1):
        leaf = qleaves[q, t]
        if leaf < 0:
            continue
        v = vnode[offsets[t] + leaf]
        c = count[v]
        if c <= 0:
            continue
        denom += norm[v]
        for j in range(node_lo[v], node_hi[v]):
            i = rows[j]
            cols[k] = i
            vals[k] = factor[i] / c
            k += 1
    n = k - start
    if n == 0:
        return 0
    seg_cols = cols[start:k].copy()
    seg_vals = vals[start:k].copy()
    order = np.argsort(seg_cols, kind="mergesort")
    m = 0
    prev = -1
    acc = 0.0
    for r in range(n):
        i = seg_cols[order[r]]
        if i != prev:
            if prev >= 0:
                cols[start + m] = prev
                vals[start + m] = acc / denom
                m += 1
            prev = i
            acc = 0.0
        acc += seg_vals[order[r]]
    cols[start + m] = prev
    vals[start + m] = acc / denom
    return m + 1


@kernel(parallel=True)
def _fill(qleaves, offsets, vnode, count, norm, node_lo, node_hi, rows, factor, starts, cols, vals, nnz):
    for q in prange(qleaves.shape[0]):
        nnz[q] = _fill_one(q, qleaves, offsets, vnode, count, norm, node_lo, node_hi, rows, factor, starts[q], cols,
                           vals)


def oob_forest_weights(packed, query_leaves, slices, factor, count_col, norm_col=None):
    """Out-of-bag forest weights of training rows (as queries) over this rank's training rows.

    Parameters
    ----------
    packed : dict
        Packed forest.
    query_leaves : ndarray of int32, shape (n_query, n_trees)
        :func:`oob_query_leaves` of the query rows (``-1``: the tree does not count).
    slices : forest.engine.forest_weights.EstimationSlices
        This rank's estimation rows.
    factor : ndarray of float64, shape (n_local,)
    count_col, norm_col : int
        As :func:`forest.engine.forest_weights.forest_weights`.

    Returns
    -------
    indptr, indices, data
        CSR arrays of the ``(n_query, n_local)`` weights; a row with no out-of-bag tree
        (or only empty ones) has no entry.
    """
    value = packed["value"]
    offsets = np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64)
    vnode = value_nodes(packed, count_col)
    count = np.ascontiguousarray(value[:, count_col], dtype=np.float64)
    norm = (np.ones(len(count)) if norm_col is None else np.ascontiguousarray(value[:, norm_col], dtype=np.float64))
    qleaves = np.ascontiguousarray(query_leaves, dtype=np.int64)
    n_query = qleaves.shape[0]
    bound = np.empty(n_query, dtype=np.int64)
    _bounds(qleaves, offsets, vnode, count, slices.node_lo, slices.node_hi, bound)
    starts = np.zeros(n_query + 1, dtype=np.int64)
    np.cumsum(bound, out=starts[1:])
    cols = np.empty(int(starts[-1]), dtype=np.int64)
    vals = np.empty(int(starts[-1]), dtype=np.float64)
    nnz = np.empty(n_query, dtype=np.int64)
    if n_query:
        _fill(qleaves, offsets, vnode, count, norm, slices.node_lo, slices.node_hi, slices.rows,
              np.ascontiguousarray(factor, dtype=np.float64), starts, cols, vals, nnz)
    indptr = np.zeros(n_query + 1, dtype=np.int64)
    np.cumsum(nnz, out=indptr[1:])
    keep = np.repeat(starts[:-1] - indptr[:-1], nnz) + np.arange(indptr[-1])
    return indptr, cols[keep], vals[keep]


def oob_forest_weights_reference(packed, query_leaves, train_leaves, codes, factor, count_col, norm_col=None):
    """Slow reference of :func:`oob_forest_weights`: the dense ``(n_query, n_local)`` matrix.

    Plain Python over (query row, tree, training row): tree ``t`` counts for a query
    whose leaf there is not ``-1``; its value node is found by walking up while the
    count equals the parent's; a training row counts when it is an estimation row of
    the tree whose leaf lies under that node.
    """
    feature, left, right = packed["feature"], packed["left"], packed["right"]
    offsets, value = packed["tree_offsets"], packed["value"]
    parent = np.full(len(feature), -1)
    for node in range(len(feature)):
        if feature[node] >= 0:
            parent[left[node]] = node
            parent[right[node]] = node

    def under(leaf, node):
        while leaf >= 0:
            if leaf == node:
                return True
            leaf = parent[leaf]
        return False

    n_query, n_local = query_leaves.shape[0], train_leaves.shape[0]
    out = np.zeros((n_query, n_local))
    denom = np.zeros(n_query)
    for q in range(n_query):
        for t in range(len(offsets) - 1):
            if query_leaves[q, t] < 0:
                continue
            node = offsets[t] + query_leaves[q, t]
            while parent[node] >= 0 and value[node, count_col] == value[parent[node], count_col]:
                node = parent[node]
            c = value[node, count_col]
            if c <= 0:
                continue
            denom[q] += 1.0 if norm_col is None else value[node, norm_col]
            for i in range(n_local):
                if codes[t, i] in (ESTIMATION, BOTH) and under(offsets[t] + train_leaves[i, t], node):
                    out[q, i] += factor[i] / c
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom[:, None] > 0, out / np.where(denom > 0, denom, 1.0)[:, None], 0.0)

"""Forest weights: how much each training row counts in a forest's estimate at ``x``.

This module owns grf's forest weights (``get_forest_weights``),

    alpha_i(x) = sum_b 1[i in V_b(x)] f_i / rows_b(x)  /  D(x),

where ``V_b(x)`` is the set of estimation rows (the honest half of tree ``b``'s
subsample, or the whole subsample without honesty) that tree ``b``'s value at ``x``
comes from, ``rows_b(x)`` its row count (stored with the node), ``f_i`` a per-row
factor (the regression forest's rescaled sample weight; 1 where the leaves average
per-row moments that already hold the weight, as in the effect forests) and ``D(x)``
the normaliser the estimator's prediction uses (the sum over trees of each leaf's mean
factor: every row of the result sums to 1).

Which rows a node's value comes from. A leaf with estimation rows uses them; an empty
leaf was given its nearest non-empty ancestor's value
(:func:`forest.engine.honest_forest.fill_empty_from_parent`), count column included.
So the *value node* of a node is found from the stored counts alone: a node whose
count equals its parent's has its parent's value node (a child holding all of its
parent's rows has the same row set; a filled child copied the count), otherwise it is
its own (:func:`value_nodes`). The rows of a value node are the estimation rows whose
leaf lies in its subtree; leaves numbered in depth-first order make every subtree a
contiguous run of leaves, so after a counting sort of the rows by leaf position each
node's rows are one slice (:func:`estimation_slices`).

The result is sparse: a query row touches about ``n_trees * leaf size`` training rows.
:func:`forest_weights` builds it in two passes over the query rows (an upper bound of
each row's entries, then the entries), each row's entries merged by training row with a
stable sort, so a training row's contributions are added in tree order and the result
does not depend on how the training rows are spread over ranks. A NumPy reference
(:func:`forest_weights_reference`) walks every (query, tree, row) triple.
"""
import numpy as np
from numba import prange

from histogram.jit import kernel
from forest.engine.subsample import BOTH, ESTIMATION


@kernel
def _value_nodes(left, right, feature, offsets, count, out):
    n_trees = offsets.shape[0] - 1
    for t in range(n_trees):
        root = offsets[t]
        out[root] = root
        # children have larger ids than their parents: one forward pass
        for node in range(offsets[t], offsets[t + 1]):
            if feature[node] >= 0:
                for child in (left[node], right[node]):
                    out[child] = out[node] if count[child] == count[node] else child


def value_nodes(packed, count_col):
    """Value node of every node of a packed forest (see the module docstring).

    Parameters
    ----------
    packed : dict
        Packed forest (:func:`forest.engine.tree.pack_trees`).
    count_col : int
        Column of ``packed["value"]`` holding the node's estimation row count.

    Returns
    -------
    ndarray of int64, shape (n_nodes,)
        Packed id of the node whose estimation rows give each node's value.
    """
    out = np.empty(len(packed["feature"]), dtype=np.int64)
    _value_nodes(np.ascontiguousarray(packed["left"], dtype=np.int64),
                 np.ascontiguousarray(packed["right"], dtype=np.int64),
                 np.ascontiguousarray(packed["feature"], dtype=np.int64),
                 np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64),
                 np.ascontiguousarray(packed["value"][:, count_col], dtype=np.float64), out)
    return out


@kernel
def _leaf_spans(left, right, feature, offsets, pos, lo, hi):
    # Depth-first leaf positions per tree (left before right), then each node's span of
    # positions; children have larger ids, so a backward pass closes the spans.
    for t in range(offsets.shape[0] - 1):
        a, b = offsets[t], offsets[t + 1]
        stack = np.empty(b - a, dtype=np.int64)
        stack[0] = a
        top = 1
        nxt = 0
        while top > 0:
            top -= 1
            node = stack[top]
            if feature[node] < 0:
                pos[node] = nxt
                nxt += 1
            else:
                stack[top] = right[node]
                stack[top + 1] = left[node]
                top += 2
        for node in range(b - 1, a - 1, -1):
            if feature[node] < 0:
                lo[node] = pos[node]
                hi[node] = pos[node] + 1
            else:
                lo[node] = min(lo[left[node]], lo[right[node]])
                hi[node] = max(hi[left[node]], hi[right[node]])


@kernel
def _sort_rows(leaves, codes, pos, offsets, lo, hi, tree_base, rows, node_lo, node_hi):
    # leaves (n_local, n_trees) tree-local leaf ids, codes (n_trees, n_local) roles.
    n_local = leaves.shape[0]
    for t in range(offsets.shape[0] - 1):
        a, b = offsets[t], offsets[t + 1]
        n_leaves = 0
        for node in range(a, b):
            if hi[node] > n_leaves:
                n_leaves = hi[node]
        starts = np.zeros(n_leaves + 1, dtype=np.int64)
        for i in range(n_local):
            c = codes[t, i]
            if c == ESTIMATION or c == BOTH:
                starts[pos[a + leaves[i, t]] + 1] += 1
        for k in range(n_leaves):
            starts[k + 1] += starts[k]
        base = tree_base[t]
        fill = starts.copy()
        for i in range(n_local):
            c = codes[t, i]
            if c == ESTIMATION or c == BOTH:
                k = pos[a + leaves[i, t]]
                rows[base + fill[k]] = i
                fill[k] += 1
        for node in range(a, b):
            node_lo[node] = base + starts[lo[node]]
            node_hi[node] = base + starts[hi[node]]


class EstimationSlices:
    """This rank's estimation rows of every tree, grouped so each node's rows are one slice.

    Attributes
    ----------
    rows : ndarray of int64, shape (n_memberships,)
        Local row indices, tree by tree, ordered by depth-first leaf position.
    node_lo, node_hi : ndarray of int64, shape (n_nodes,)
        Packed node ``v``'s estimation rows (on this rank) are ``rows[node_lo[v]:node_hi[v]]``.
    """

    def __init__(self, rows, node_lo, node_hi):
        self.rows, self.node_lo, self.node_hi = rows, node_lo, node_hi


def estimation_slices(packed, leaves, codes):
    """Group this rank's estimation rows by node (see the module docstring).

    Parameters
    ----------
    packed : dict
        Packed forest.
    leaves : ndarray of int32, shape (n_local, n_trees)
        Tree-local leaf of each training row in each tree
        (:func:`forest.engine.predictor.predict_leaves_binned`).
    codes : ndarray of int8, shape (n_trees, n_local)
        Each row's role in each tree (:func:`forest.engine.subsample.forest_row_codes`).

    Returns
    -------
    EstimationSlices
    """
    feature = np.ascontiguousarray(packed["feature"], dtype=np.int64)
    left = np.ascontiguousarray(packed["left"], dtype=np.int64)
    right = np.ascontiguousarray(packed["right"], dtype=np.int64)
    offsets = np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64)
    n_nodes = len(feature)
    pos = np.full(n_nodes, -1, dtype=np.int64)
    lo = np.empty(n_nodes, dtype=np.int64)
    hi = np.empty(n_nodes, dtype=np.int64)
    _leaf_spans(left, right, feature, offsets, pos, lo, hi)
    codes = np.ascontiguousarray(codes, dtype=np.int8)
    est = (codes == ESTIMATION) | (codes == BOTH)
    per_tree = est.sum(axis=1).astype(np.int64)
    tree_base = np.zeros(len(offsets), dtype=np.int64)
    np.cumsum(per_tree, out=tree_base[1:])
    rows = np.empty(int(tree_base[-1]), dtype=np.int64)
    node_lo = np.empty(n_nodes, dtype=np.int64)
    node_hi = np.empty(n_nodes, dtype=np.int64)
    _sort_rows(np.ascontiguousarray(leaves, dtype=np.int64), codes, pos, offsets, lo, hi, tree_base, rows,
               node_lo, node_hi)
    return EstimationSlices(rows, node_lo, node_hi)


@kernel
def _bounds(qleaves, offsets, vnode, count, node_lo, node_hi, out):
    for q in range(qleaves.shape[0]):
        s = 0
        for t in range(offsets.shape[0] - 1):
            leaf = qleaves[q, t]
            if leaf < 0:                    # the tree does not count for this query (out of bag)
                continue
            v = vnode[offsets[t] + leaf]
            if count[v] > 0:
                s += node_hi[v] - node_lo[v]
        out[q] = s


@kernel
def _fill_one(q, qleaves, offsets, vnode, count, norm, node_lo, node_hi, rows, factor, start, cols, vals):
    # Entries of query row q in tree order, merged by training row (a stable sort keeps
    # each row's contributions in tree order), scaled by 1 / D(x). Returns the count.
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


def forest_weights(packed, query_leaves, slices, factor, count_col, norm_col=None, n_train=None):
    """Forest weights of query rows over this rank's training rows.

    Parameters
    ----------
    packed : dict
        Packed forest.
    query_leaves : ndarray of int32, shape (n_query, n_trees)
        Tree-local leaf of each query row (:func:`forest.engine.predictor.predict_leaves`);
        ``-1`` where the tree does not count for the query (its out-of-bag weights,
        :func:`forest.engine.oob_forest_weights.oob_query_leaves`: the sums and the
        normaliser then run over the other trees only).
    slices : EstimationSlices
        This rank's estimation rows (:func:`estimation_slices`).
    factor : ndarray of float64, shape (n_local,)
        ``f_i`` of each training row.
    count_col : int
        Column of the node values holding the estimation row count.
    norm_col : int, optional
        Column holding the node's mean factor ``sum f / rows``, whose sum over the
        trees is ``D(x)``; without it ``D(x)`` is the number of trees (``f = 1``).
    n_train : int, optional
        Number of columns (this rank's training rows); ``len(factor)`` by default.

    Returns
    -------
    indptr : ndarray of int64, shape (n_query + 1,)
    indices : ndarray of int64, shape (nnz,)
        Local training row of each entry, increasing within a query row.
    data : ndarray of float64, shape (nnz,)
        CSR arrays of the ``(n_query, n_train)`` weight matrix.
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


def forest_weights_reference(packed, query_leaves, train_leaves, codes, factor, count_col, norm_col=None):
    """Slow reference of :func:`forest_weights`: the dense ``(n_query, n_local)`` matrix.

    Walks every (query row, tree, training row) triple with plain Python: a training
    row counts in tree ``t`` when it is an estimation row there and the query's value
    node (the count rule of the module docstring, applied by walking up from the
    query's leaf) is among the ancestors of the training row's leaf.
    """
    feature, left, right = packed["feature"], packed["left"], packed["right"]
    offsets, value = packed["tree_offsets"], packed["value"]
    parent = np.full(len(feature), -1)
    for node in range(len(feature)):
        if feature[node] >= 0:
            parent[left[node]] = node
            parent[right[node]] = node

    def ancestors(node):
        out = set()
        while node >= 0:
            out.add(node)
            node = parent[node]
        return out

    n_query, n_local = query_leaves.shape[0], train_leaves.shape[0]
    out = np.zeros((n_query, n_local))
    denom = np.zeros(n_query)
    for t in range(len(offsets) - 1):
        a = offsets[t]
        est = [i for i in range(n_local) if codes[t, i] in (ESTIMATION, BOTH)]
        above = {i: ancestors(a + train_leaves[i, t]) for i in est}
        for q in range(n_query):
            if query_leaves[q, t] < 0:
                continue
            node = a + query_leaves[q, t]
            while parent[node] >= 0 and value[node, count_col] == value[parent[node], count_col]:
                node = parent[node]
            c = value[node, count_col]
            if c <= 0:
                continue
            denom[q] += 1.0 if norm_col is None else value[node, norm_col]
            for i in est:
                if node in above[i]:
                    out[q, i] += factor[i] / c
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom[:, None] > 0, out / np.where(denom > 0, denom, 1.0)[:, None], 0.0)

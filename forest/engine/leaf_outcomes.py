"""Leaves that keep their estimation rows' outcomes, and weighted quantiles from them.

A quantile forest predicts the weighted quantiles of the training outcomes under the
forest weights (:mod:`forest.engine.forest_weights`). A model file holds no training rows,
and ``forest-predict`` or a Spark ``mapInPandas`` task has neither the training rows nor a
communicator, so the weights' ingredients live in the model instead: each *value node*
of a leaf (the leaf, or for an empty leaf the ancestor it took its value from) keeps the
outcomes of its estimation rows with their weights ``f_i / rows`` (grf's per-tree
weights: each tree gives its leaf's rows equal shares, times the sample weight). Then a
query's weighted outcome distribution is the union of its trees' lists, and prediction
is local: no collective, no training rows.

Why this and not a collective bisection over distributed training rows: prediction
from a file and inside Spark tasks must work without the training data, and the lists
cost what quantile-forest's and grf's own models store (every tree's estimation rows:
about ``n_trees * n * max_samples * (1 - honesty_fraction)`` outcomes, 8 bytes each plus 8
for the weight). Building them is one ``allgatherv`` per fit of the estimation rows'
``(node, outcome, weight, row id)``: the outcomes, not the features.

Lists are ordered by ``(outcome, global row id)``, so they are the same bits at any
rank count (weights up to the rounding of the rescaled sample weights).
"""
import numba
import numpy as np
from numba import prange

from native import collectives as col

from histogram.jit import kernel
from forest.engine.forest_weights import value_nodes


def gather_leaf_outcomes(packed, slices, y, factor, gids, count_col, comm, event=None):
    """Outcome lists of every leaf's value node, over all ranks (collective).

    Parameters
    ----------
    packed : dict
        Packed forest.
    slices : forest.engine.forest_weights.EstimationSlices
        This rank's estimation rows by node.
    y : ndarray of float64, shape (n_local,)
    factor : ndarray of float64, shape (n_local,)
        ``f_i`` (the rescaled sample weight, or ones).
    gids : ndarray of int64, shape (n_local,)
    count_col : int
        Column of ``packed["value"]`` holding the node's estimation row count.
    comm : native.comm.Communicator
    event : ndarray of bool, shape (n_local,), optional
        A mark kept beside each outcome (a survival forest's failure flags; ``y`` is
        then the time).

    Returns
    -------
    dict
        ``offsets`` int64 ``(n_nodes + 1,)`` (node ``v``'s entries are
        ``offsets[v]:offsets[v + 1]``, empty but for value nodes of leaves), ``y``
        float64 ``(n_entries,)`` increasing within a node, ``weight`` float64
        ``(n_entries,)``, ``f_i / rows`` of the node; with ``event``, also ``event``
        uint8 ``(n_entries,)`` (0 or 1).
    """
    n_nodes = len(packed["feature"])
    vnode = value_nodes(packed, count_col)
    leaves = np.flatnonzero(np.asarray(packed["feature"]) < 0)
    holders = np.unique(vnode[leaves])
    count = np.asarray(packed["value"][:, count_col], dtype=np.float64)
    holders = holders[count[holders] > 0]
    sizes = slices.node_hi[holders] - slices.node_lo[holders]
    local_rows = (np.concatenate([slices.rows[slices.node_lo[v]:slices.node_hi[v]] for v in holders])
                  if len(holders) else np.zeros(0, dtype=np.int64))
    local_node = np.repeat(holders, sizes)
    node = col.allgatherv(comm, local_node.astype(np.int64))
    ys = col.allgatherv(comm, np.ascontiguousarray(y[local_rows], dtype=np.float64))
    fs = col.allgatherv(comm, np.ascontiguousarray(factor[local_rows], dtype=np.float64))
    ids = col.allgatherv(comm, np.ascontiguousarray(gids[local_rows], dtype=np.int64))
    order = np.lexsort((ids, ys, node))
    node, ys, fs = node[order], ys[order], fs[order]
    offsets = np.zeros(n_nodes + 1, dtype=np.int64)
    np.add.at(offsets, node + 1, 1)
    np.cumsum(offsets, out=offsets)
    lists = {"offsets": offsets, "y": ys, "weight": fs / count[node]}
    if event is not None:
        marks = col.allgatherv(comm, np.ascontiguousarray(np.asarray(event)[local_rows], dtype=np.uint8))
        lists["event"] = marks[order]
    return lists


@kernel
def _quantiles_one(q, qleaves, use, offsets_t, span, entries, levels, out, rel_tol, vals, wts, bs, hist, sel_v,
                   sel_w):
    # Entries of the query's trees into the scratch arrays, a weight histogram over the
    # coarse outcome bins, then per level: the bin where the cumulative weight reaches it,
    # and a sort of that bin's entries only (a full sort of every entry, and allocating
    # per query, cost most of the prediction).
    n_bins = hist.shape[0]
    for b in range(n_bins):
        hist[b] = 0.0
    m = 0
    total = 0.0
    for t in range(offsets_t.shape[0] - 1):
        if not use[q, t]:
            continue
        node = offsets_t[t] + qleaves[q, t]
        for e in range(span[node, 0], span[node, 1]):
            y = entries[e, 0]
            w = entries[e, 1]
            b = int(entries[e, 2])
            vals[m] = y
            wts[m] = w
            bs[m] = b
            hist[b] += w
            total += w
            m += 1
    if m == 0:
        for k in range(levels.shape[0]):
            out[q, k] = np.nan
        return
    for k in range(levels.shape[0]):
        # a relative slack so that a cumulative weight equal to tau * total in exact
        # arithmetic takes the lower outcome whatever the rounding (any rank count)
        target = levels[k] * total * (1.0 - rel_tol)
        before = 0.0
        b = 0
        while b < n_bins - 1 and before + hist[b] < target:
            before += hist[b]
            b += 1
        cnt = 0
        for r in range(m):
            if bs[r] == b:
                sel_v[cnt] = vals[r]
                sel_w[cnt] = wts[r]
                cnt += 1
        order = np.argsort(sel_v[:cnt], kind="mergesort")
        cum = before
        found = False
        for r in range(cnt):
            cum += sel_w[order[r]]
            if cum >= target:
                out[q, k] = sel_v[order[r]]
                found = True
                break
        if not found:
            # rounding left the target just above the bins' sum: the largest outcome
            best = vals[0]
            for r in range(m):
                if vals[r] > best:
                    best = vals[r]
            out[q, k] = best


@kernel(parallel=True)
def _quantiles(qleaves, use, offsets_t, span, entries, n_bins, levels, out, rel_tol, bound, n_chunks):
    # One scratch per chunk of queries, sized by the largest entry count among them.
    n = qleaves.shape[0]
    for c in prange(n_chunks):
        a = c * n // n_chunks
        b = (c + 1) * n // n_chunks
        size = 1
        for q in range(a, b):
            if bound[q] > size:
                size = bound[q]
        vals = np.empty(size)
        wts = np.empty(size)
        bs = np.empty(size, dtype=np.int64)
        sel_v = np.empty(size)
        sel_w = np.empty(size)
        hist = np.empty(n_bins)
        for q in range(a, b):
            _quantiles_one(q, qleaves, use, offsets_t, span, entries, levels, out, rel_tol, vals, wts, bs, hist,
                           sel_v, sel_w)


@kernel
def entry_bounds(qleaves, use, offsets_t, span, out):
    """``out[q]``: how many list entries query ``q``'s used trees hold (scratch sizes)."""
    for q in range(qleaves.shape[0]):
        s = 0
        for t in range(offsets_t.shape[0] - 1):
            if use[q, t]:
                node = offsets_t[t] + qleaves[q, t]
                s += span[node, 1] - span[node, 0]
        out[q] = s


#: Coarse outcome bins of the prediction kernel (quantiles of the stored outcomes).
_COARSE_BINS = 256


def coarse_bins(ys):
    """Monotone coarse bin of every stored outcome: ``(bins int64 (E,), n_bins)``.

    The edges are quantiles of the stored outcomes themselves, the same bits on every
    rank (the lists are), so no model-file field is needed.
    """
    if not len(ys):
        return np.zeros(0, dtype=np.int64), 1
    # edges from an evenly strided sample (sorting every entry cost more than the kernel)
    sample = ys[::max(1, len(ys) // 65536)]
    edges = np.unique(np.quantile(sample, np.linspace(0.0, 1.0, _COARSE_BINS + 1)[1:-1]))
    return np.searchsorted(edges, ys, side="left").astype(np.int64), len(edges) + 1


#: Relative slack of the cumulative-weight test (see ``_quantiles_one``).
REL_TOL = 1e-12


class PredictionLayout:
    """The outcome lists laid out for the prediction kernel (built once per model and reused).

    The gather is bound by cache misses, so each node's entry range is one row (through
    its value node) and each entry's outcome, weight and coarse bin one row.

    Attributes
    ----------
    span : ndarray of int64, shape (n_nodes, 2)
    entries : ndarray of float64, shape (n_entries, 3)
    n_bins : int
    """

    def __init__(self, packed, outcomes, count_col):
        vnode = value_nodes(packed, count_col)
        ys = np.ascontiguousarray(outcomes["y"], dtype=np.float64)
        bins, self.n_bins = coarse_bins(ys)
        self.entries = np.empty((len(ys), 3))
        self.entries[:, 0], self.entries[:, 1], self.entries[:, 2] = ys, outcomes["weight"], bins
        lo_of = np.asarray(outcomes["offsets"], dtype=np.int64)
        self.span = np.ascontiguousarray(np.stack([lo_of[vnode], lo_of[vnode + 1]], axis=1))


def weighted_quantiles(packed, outcomes, query_leaves, levels, count_col, use=None, layout=None):
    """Weighted quantiles of the forest's outcome lists at each query row.

    For each query row: the entries of its trees' value nodes; the quantile at level
    ``tau`` is the smallest outcome whose cumulative weight reaches ``tau`` of the total
    (grf's and the inverse-CDF definition). Rows with no entries (every tree empty) get
    NaN.

    Parameters
    ----------
    packed : dict
    outcomes : dict
        :func:`gather_leaf_outcomes`.
    query_leaves : ndarray of int32, shape (n_query, n_trees)
        Tree-local leaves (:func:`forest.engine.predictor.predict_leaves`).
    levels : ndarray of float64, shape (n_levels,)
        In (0, 1], increasing.
    count_col : int
    use : ndarray of bool, shape (n_query, n_trees), optional
        Which trees each row takes (out-of-bag estimates: the trees that did not draw
        it); all by default.
    layout : PredictionLayout, optional
        Of these ``packed`` and ``outcomes`` (built here when omitted).

    Returns
    -------
    ndarray of float64, shape (n_query, n_levels)
    """
    levels = np.ascontiguousarray(levels, dtype=np.float64)
    out = np.empty((len(query_leaves), len(levels)))
    if len(query_leaves):
        layout = PredictionLayout(packed, outcomes, count_col) if layout is None else layout
        n_trees = len(packed["tree_offsets"]) - 1
        use = (np.ones((len(query_leaves), n_trees), dtype=np.bool_) if use is None
               else np.ascontiguousarray(use, dtype=np.bool_))
        qleaves = np.ascontiguousarray(query_leaves, dtype=np.int64)
        offsets_t = np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64)
        bound = np.empty(len(qleaves), dtype=np.int64)
        entry_bounds(qleaves, use, offsets_t, layout.span, bound)
        n_chunks = max(1, min(len(qleaves), 8 * numba.get_num_threads()))
        _quantiles(qleaves, use, offsets_t, layout.span, layout.entries, int(layout.n_bins), levels, out, REL_TOL,
                   bound, n_chunks)
    return out


def weighted_quantile_reference(values, weights, levels):
    """Slow reference: the smallest value whose cumulative weight reaches ``tau`` of the total.

    Parameters
    ----------
    values, weights : array-like, shape (m,)
    levels : array-like, shape (k,)

    Returns
    -------
    ndarray of float64, shape (k,)
    """
    values = np.asarray(values, dtype=np.float64)
    weights = np.asarray(weights, dtype=np.float64)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if not len(values):
        return np.full(len(levels), np.nan)
    order = np.argsort(values, kind="stable")
    v, cum = values[order], np.cumsum(weights[order])
    out = []
    for tau in levels:
        idx = np.flatnonzero(cum >= tau * cum[-1] * (1.0 - REL_TOL))
        out.append(v[idx[0]] if len(idx) else v[-1])
    return np.array(out)


def cached_layout(est, layout_class, count_col):
    """``layout_class(est.estimators_, est.leaf_outcomes_, count_col)``, built on first use and kept
    on ``est._prediction_layout_`` (keyed by the lists' array, so new lists rebuild it; never in
    model files: the estimators exclude the attribute)."""
    cached = getattr(est, "_prediction_layout_", None)
    if cached is None or cached[0] is not est.leaf_outcomes_["y"]:
        cached = (est.leaf_outcomes_["y"], layout_class(est.estimators_, est.leaf_outcomes_, count_col))
        est._prediction_layout_ = cached
    return cached[1]

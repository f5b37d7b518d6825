"""Forest-weighted survival curves from the leaves' lists of times and failure flags.

grf's survival forest predicts, at a query ``x``, the Kaplan-Meier (or Nelson-Aalen)
estimate of the training rows weighted by the forest weights ``alpha_i(x)``
(:mod:`forest.engine.forest_weights`): with weighted failures ``d_k`` and weighted rows
at risk ``Y_k`` at each distinct time ``t_k``,

    S(t) = prod_{t_k <= t} (1 - d_k / Y_k)        H(t) = sum_{t_k <= t} d_k / Y_k.

The leaves keep their estimation rows' times, flags and per-tree weights
(:func:`forest.engine.leaf_outcomes.gather_leaf_outcomes` with ``event``), so a query's
weighted sample is the union of its trees' lists, and the curves come from one sort of
those entries: local, no collective, no training rows (a model file predicts alone).
The weights sum to the number of trees used, not to 1; ``d_k / Y_k`` does not care.
The slow reference is :func:`forest.analysis.survival.kaplan_meier` on the forest weights
(the tests compare the two).
"""
import numba
import numpy as np
from numba import prange

from histogram.jit import kernel
from forest.engine.forest_weights import value_nodes
from forest.engine.leaf_outcomes import entry_bounds


@kernel
def _curves_one(q, qleaves, use, offsets_t, span, entries, at, where, surv, chf, vals, wts, evs, risk):
    m = 0
    for t in range(offsets_t.shape[0] - 1):
        if not use[q, t]:
            continue
        node = offsets_t[t] + qleaves[q, t]
        for e in range(span[node, 0], span[node, 1]):
            vals[m] = entries[e, 0]
            wts[m] = entries[e, 1]
            evs[m] = entries[e, 2]
            m += 1
    n_at = at.shape[0]
    if m == 0:
        for j in range(n_at):
            surv[q, where[j]] = np.nan
            chf[q, where[j]] = np.nan
        return
    order = np.argsort(vals[:m], kind="mergesort")
    # the risk set's weight as a sum from the latest time back (not a running subtraction
    # from the total, whose rounding left 1e-16 of a curve where everyone at risk fails)
    acc = 0.0
    for r in range(m - 1, -1, -1):
        acc += wts[order[r]]
        risk[r] = acc
    s = 1.0
    h = 0.0
    j = 0
    r = 0
    while r < m:
        t0 = vals[order[r]]
        while j < n_at and at[j] < t0:
            surv[q, where[j]] = s
            chf[q, where[j]] = h
            j += 1
        at_risk = risk[r]
        d = 0.0
        while r < m and vals[order[r]] == t0:
            d += wts[order[r]] * evs[order[r]]
            r += 1
        if d > 0 and at_risk > 0:
            hazard = min(d / at_risk, 1.0)
            s *= 1.0 - hazard
            h += hazard
    while j < n_at:
        surv[q, where[j]] = s
        chf[q, where[j]] = h
        j += 1


@kernel(parallel=True)
def _curves(qleaves, use, offsets_t, span, entries, at, where, surv, chf, bound, n_chunks):
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
        evs = np.empty(size)
        risk = np.empty(size)
        for q in range(a, b):
            _curves_one(q, qleaves, use, offsets_t, span, entries, at, where, surv, chf, vals, wts, evs, risk)


class SurvivalLayout:
    """The lists laid out for the kernel (built once per model): each node's entry range
    (through its value node) and each entry's ``[time, weight, failure]`` as one row.

    Attributes
    ----------
    span : ndarray of int64, shape (n_nodes, 2)
    entries : ndarray of float64, shape (n_entries, 3)
    """

    def __init__(self, packed, outcomes, count_col):
        vnode = value_nodes(packed, count_col)
        self.entries = np.empty((len(outcomes["y"]), 3))
        self.entries[:, 0] = outcomes["y"]
        self.entries[:, 1] = outcomes["weight"]
        self.entries[:, 2] = outcomes["event"]
        lo_of = np.asarray(outcomes["offsets"], dtype=np.int64)
        self.span = np.ascontiguousarray(np.stack([lo_of[vnode], lo_of[vnode + 1]], axis=1))


def survival_curves(packed, outcomes, query_leaves, times, count_col, use=None, layout=None):
    """Forest-weighted Kaplan-Meier and Nelson-Aalen curves at each query row.

    Parameters
    ----------
    packed : dict
    outcomes : dict
        :func:`forest.engine.leaf_outcomes.gather_leaf_outcomes` with ``event``.
    query_leaves : ndarray of int32, shape (n_query, n_trees)
    times : ndarray of float64, shape (n_times,)
        Where to evaluate the curves (any order).
    count_col : int
    use : ndarray of bool, shape (n_query, n_trees), optional
        Which trees each row takes (out of bag: those that did not draw it).
    layout : SurvivalLayout, optional

    Returns
    -------
    survival : ndarray of float64, shape (n_query, n_times)
        Kaplan-Meier ``S(t)``; NaN for rows with no entries.
    cumulative_hazard : ndarray of float64, shape (n_query, n_times)
        Nelson-Aalen ``H(t)``; NaN likewise.
    """
    times = np.asarray(times, dtype=np.float64)
    where = np.argsort(times, kind="stable")
    at = np.ascontiguousarray(times[where])
    n = len(query_leaves)
    surv = np.empty((n, len(times)))
    chf = np.empty((n, len(times)))
    if n:
        layout = SurvivalLayout(packed, outcomes, count_col) if layout is None else layout
        n_trees = len(packed["tree_offsets"]) - 1
        use = (np.ones((n, n_trees), dtype=np.bool_) if use is None
               else np.ascontiguousarray(use, dtype=np.bool_))
        qleaves = np.ascontiguousarray(query_leaves, dtype=np.int64)
        offsets_t = np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64)
        bound = np.empty(n, dtype=np.int64)
        entry_bounds(qleaves, use, offsets_t, layout.span, bound)
        n_chunks = max(1, min(n, 8 * numba.get_num_threads()))
        _curves(qleaves, use, offsets_t, layout.span, layout.entries, at, where.astype(np.int64), surv, chf, bound,
                n_chunks)
    return surv, chf

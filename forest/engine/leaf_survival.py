"""Forest-weighted survival curves from the leaves' lists of times and failure flags.

grf's survival forest predicts, at a query ``x``, the Kaplan-Meier (or Nelson-Aalen)
estimate of the training rows weighted by the forest weights ``alpha_i(x)``
(:mod:`forest.engine.forest_weights`): with weighted failures ``d_k`` and weighted rows
at risk ``Y_k`` at each distinct time ``t_k``,

    S(t) = prod_{t_k <= t} (1 - d_k / Y_k)        H(t) = sum_{t_k <= t} d_k / Y_k.

The leaves keep their estimation rows' times, flags and per-tree weights
(:func:`forest.engine.leaf_outcomes.gather_leaf_outcomes` with ``event``), so a query's
weighted sample is the union of its trees' lists: local, no collective, no training rows
(a model file predicts alone). The entries are gathered into slots of the lists' distinct
times, marked in a bitmap, and the curves walk the marked slots in time order: O(entries +
distinct times / 64) per query, with no sort (a first version sorted each query's entries;
with grf's alpha = 0.05, whose leaves hold hundreds of rows, FLCHAIN's test rows took
minutes).

The weights sum to the number of trees used, not to 1; ``d_k / Y_k`` does not care.
The slow reference is :func:`forest.analysis.survival.kaplan_meier` on the forest weights
(the tests compare the two).
"""
import numba
import numpy as np
from numba import prange
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros

from histogram.jit import compiled_only, kernel
from forest.engine.forest_weights import value_nodes


@kernel
def _curves_one(q, qleaves, use, offsets_t, span, weight, event, tindex, utimes, at, where, surv, chf, dsum, wsum,
                risk, bits):
    # Gather: each entry's weight into its distinct time's slot; a bitmap marks the slots
    # touched, so they are visited in time order without sorting the entries (a query's
    # entries number the trees times the leaf sizes: sorting them dominated the cost).
    n_at = at.shape[0]
    m = 0
    for t in range(offsets_t.shape[0] - 1):
        if not use[q, t]:
            continue
        node = offsets_t[t] + qleaves[q, t]
        for e in range(span[node, 0], span[node, 1]):
            k = tindex[e]
            word = k >> 6
            bit = np.uint64(1) << np.uint64(k & 63)
            if not (bits[word] & bit):
                bits[word] |= bit
                dsum[k] = 0.0
                wsum[k] = 0.0
            dsum[k] += weight[e] * event[e]
            wsum[k] += weight[e]
            m += 1
    if m == 0:
        for j in range(n_at):
            surv[q, where[j]] = np.nan
            chf[q, where[j]] = np.nan
        return
    # the risk set's weight at each touched time: a sum from the latest time back
    acc = 0.0
    for word in range(bits.shape[0] - 1, -1, -1):
        b = bits[word]
        while b:
            hi = 63 - _leading_zeros(b)
            k = (word << 6) + hi
            acc += wsum[k]
            risk[k] = acc
            b &= ~(np.uint64(1) << np.uint64(hi))
    s = 1.0
    h = 0.0
    j = 0
    for word in range(bits.shape[0]):
        b = bits[word]
        bits[word] = np.uint64(0)
        while b:
            lo = _trailing_zeros(b)
            k = (word << 6) + lo
            b &= b - np.uint64(1)
            t0 = utimes[k]
            while j < n_at and at[j] < t0:
                surv[q, where[j]] = s
                chf[q, where[j]] = h
                j += 1
            if dsum[k] > 0 and risk[k] > 0:
                hazard = min(dsum[k] / risk[k], 1.0)
                s *= 1.0 - hazard
                h += hazard
    while j < n_at:
        surv[q, where[j]] = s
        chf[q, where[j]] = h
        j += 1


@compiled_only(inline="always")
def _trailing_zeros(b):
    # the hardware count (LLVM's cttz): a shifting loop here cost up to 63 steps per set bit and
    # was most of a query's time once the leaves held many distinct times (measured: 115 s of a
    # 138 s causal survival fit at 100k rows)
    return np.int64(trailing_zeros(b))


@compiled_only(inline="always")
def _leading_zeros(b):
    return np.int64(leading_zeros(b))


@kernel(parallel=True)
def _curves(qleaves, use, offsets_t, span, weight, event, tindex, utimes, at, where, surv, chf, n_chunks):
    n = qleaves.shape[0]
    n_times = utimes.shape[0]
    for c in prange(n_chunks):
        a = c * n // n_chunks
        b = (c + 1) * n // n_chunks
        dsum = np.empty(n_times)
        wsum = np.empty(n_times)
        risk = np.empty(n_times)
        bits = np.zeros((n_times + 63) // 64, dtype=np.uint64)
        for q in range(a, b):
            _curves_one(q, qleaves, use, offsets_t, span, weight, event, tindex, utimes, at, where, surv, chf, dsum,
                        wsum, risk, bits)


class SurvivalLayout:
    """The lists laid out for the kernel (built once per model): each node's entry range
    (through its value node), each entry's weight, failure flag and the index of its time
    among the lists' distinct times.

    Attributes
    ----------
    span : ndarray of int64, shape (n_nodes, 2)
    weight, event : ndarray of float64, shape (n_entries,)
    tindex : ndarray of int64, shape (n_entries,)
    utimes : ndarray of float64, shape (n_distinct,)
    """

    def __init__(self, packed, outcomes, count_col):
        vnode = value_nodes(packed, count_col)
        self.utimes, self.tindex = np.unique(np.asarray(outcomes["y"], dtype=np.float64), return_inverse=True)
        self.tindex = self.tindex.astype(np.int64)
        self.weight = np.ascontiguousarray(outcomes["weight"], dtype=np.float64)
        self.event = np.ascontiguousarray(outcomes["event"], dtype=np.float64)
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
    n_trees = len(packed["tree_offsets"]) - 1
    if use is None and len(query_leaves) > 1:
        # Rows that reach the same leaves have the same curves: compute each once. Held-out
        # counterfactual queries of a causal survival forest need it: where the survival forest
        # cannot split a treatment arm (every failure at the horizon), all its queries share one
        # leaf per tree, and each such leaf holds thousands of rows. (Out of bag, each row uses
        # its own trees: keys hardly repeat, so no attempt.)
        distinct, inverse = np.unique(np.asarray(query_leaves, dtype=np.int64), axis=0, return_inverse=True)
        if len(distinct) < 0.9 * len(query_leaves):
            surv, chf = survival_curves(packed, outcomes, distinct, times, count_col, layout=layout)
            inverse = inverse.reshape(-1)
            return surv[inverse], chf[inverse]
    where = np.argsort(times, kind="stable")
    at = np.ascontiguousarray(times[where])
    n = len(query_leaves)
    surv = np.empty((n, len(times)))
    chf = np.empty((n, len(times)))
    if n:
        layout = SurvivalLayout(packed, outcomes, count_col) if layout is None else layout
        use = (np.ones((n, n_trees), dtype=np.bool_) if use is None
               else np.ascontiguousarray(use, dtype=np.bool_))
        qleaves = np.ascontiguousarray(query_leaves, dtype=np.int64)
        offsets_t = np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64)
        # scratch of three distinct-time arrays per chunk: a few chunks per thread
        n_chunks = max(1, min(n, 4 * numba.get_num_threads()))
        _curves(qleaves, use, offsets_t, layout.span, layout.weight, layout.event, layout.tindex, layout.utimes, at,
                where.astype(np.int64), surv, chf, n_chunks)
    return surv, chf

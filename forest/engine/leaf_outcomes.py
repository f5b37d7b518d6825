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

from histogram.cpu_kernels import prefetch
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


_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)
_NEG_ZERO = np.uint64(1 << 63)


@kernel(inline="always")
def _key(bits):
    # an outcome's bits, +0.0's for -0.0 (np.unique keeps one zero)
    return np.uint64(0) if bits == _NEG_ZERO else bits


@kernel
def _hash_values(values, keys, slots, shift):
    # open addressing, linear probing (Fibonacci hashing); slots hold rank + 1 (0: empty)
    mask = np.uint64(keys.shape[0] - 1)
    for r in range(values.shape[0]):
        k = _key(values[r])
        h = (k * _HASH_MUL) >> shift
        while slots[h] != 0:
            h = (h + np.uint64(1)) & mask
        keys[h] = k
        slots[h] = r + 1


@kernel
def _lookup_ranks(keys, slots, shift, ys, out, a, b):
    mask = np.uint64(keys.shape[0] - 1)
    for e in range(a, b):
        k = _key(ys[e])
        h = (k * _HASH_MUL) >> shift
        while keys[h] != k or slots[h] == 0:  # present: the values are ys' distinct outcomes
            h = (h + np.uint64(1)) & mask
        out[e] = slots[h] - 1


@kernel(parallel=True)
def _par_lookup_ranks(keys, slots, shift, ys, out, n_chunks):
    n = ys.shape[0]
    for c in prange(n_chunks):
        _lookup_ranks(keys, slots, shift, ys, out, c * n // n_chunks, (c + 1) * n // n_chunks)


def outcome_ranks(ys):
    """Distinct stored outcomes and each entry's rank among them.

    Parameters
    ----------
    ys : ndarray of float64, shape (n_entries,)
        Finite outcomes (the model checks reject others).

    Returns
    -------
    values : ndarray of float64, shape (n_values,)
        The distinct outcomes, increasing.
    ranks : ndarray of uint32 (int64 from 2**32 - 1 distinct outcomes), shape (n_entries,)
        ``values[ranks] == ys`` (``np.searchsorted(values, ys)``).
    """
    ys = np.ascontiguousarray(ys, dtype=np.float64)
    values = np.unique(ys)  # NumPy's float64 sort is vectorised: ~0.05 s for 5M entries
    if not np.all(np.isfinite(values)):
        # a NaN of another payload than the one np.unique kept would never be found
        raise ValueError("outcome lists must hold finite outcomes")
    wide = len(values) >= 2 ** 32 - 1
    ranks = np.empty(len(ys), dtype=np.int64 if wide else np.uint32)
    if len(ys):
        # A hash table of the values, at most half full: one probe per entry mostly, and
        # the entries' probes are independent loads. np.searchsorted is a chain of
        # mispredicted branches and cache misses per entry (1.5 s for 5M entries into
        # 200k values; a branch-free two-level search 0.24 s, this ~0.05 s).
        log_size = max(4, (2 * len(values)).bit_length())
        keys = np.zeros(1 << log_size, dtype=np.uint64)
        slots = np.zeros(1 << log_size, dtype=np.int64 if wide else np.uint32)
        shift = np.uint64(64 - log_size)
        _hash_values(values.view(np.uint64), keys, slots, shift)
        _par_lookup_ranks(keys, slots, shift, ys.view(np.uint64), ranks, max(1, 8 * numba.get_num_threads()))
    return values, ranks


@kernel
def _prefetch_nodes(q, qleaves, offsets_t, bounds):
    # the entry ranges of query q's leaves into cache, ahead of _entry_ranges
    for t in range(offsets_t.shape[0] - 1):
        prefetch(bounds, 2 * (offsets_t[t] + qleaves[q, t]))


@kernel
def _entry_ranges(q, qleaves, use, offsets_t, bounds, ranks, weights, uniform, los, his):
    # query q's entry range per tree (empty for trees it does not use), and the ranges'
    # first and last entries into cache, ahead of _quantiles_one
    for t in range(offsets_t.shape[0] - 1):
        lo = 0
        hi = 0
        if use[q, t]:
            node = offsets_t[t] + qleaves[q, t]
            lo = bounds[2 * node]
            hi = bounds[2 * node + 1]
            if hi > lo:
                prefetch(ranks, lo)
                prefetch(ranks, hi - 1)
                if not uniform:
                    prefetch(weights, lo)
                    prefetch(weights, hi - 1)
        los[t] = lo
        his[t] = hi


@kernel
def _quantiles_one(q, los, his, ranks, weights, uniform, shift, values, levels, out, rel_tol, rs, ws, hist,
                   sel_r, sel_w):
    # The entries of the query's trees into the scratch arrays with a weight histogram
    # over coarse rank bins (rank >> shift); then the levels in one walk up the
    # histogram: the bin where the cumulative weight reaches the level, and a sort of
    # that bin's few entries only.
    n_bins = hist.shape[0]
    for b in range(n_bins):
        hist[b] = 0.0
    m = 0
    total = 0.0
    top = np.int64(0)
    for t in range(los.shape[0]):
        lo = los[t]
        hi = his[t]
        if hi == lo:
            continue
        # equal shares f_i / rows with f_i = 1: the stored weights' bits (PredictionLayout checks)
        w = 1.0 / np.float64(hi - lo)
        for e in range(lo, hi):
            r = np.int64(ranks[e])
            if not uniform:
                w = weights[e]
            rs[m] = r
            ws[m] = w
            hist[r >> shift] += w
            total += w
            m += 1
        top = max(top, np.int64(ranks[hi - 1]))  # a node's entries increase
    if m == 0:
        for k in range(levels.shape[0]):
            out[q, k] = np.nan
        return
    before = 0.0
    b = 0
    sorted_bin = -1
    cnt = 0
    for k in range(levels.shape[0]):
        if k > 0 and levels[k] < levels[k - 1]:
            before = 0.0  # levels out of order: walk again from the first bin
            b = 0
        # a relative slack so that a cumulative weight equal to tau * total in exact
        # arithmetic takes the lower outcome whatever the rounding (any rank count)
        target = levels[k] * total * (1.0 - rel_tol)
        while b < n_bins - 1 and before + hist[b] < target:
            before += hist[b]
            b += 1
        if b != sorted_bin:
            cnt = 0
            for j in range(m):  # branch-free: the test is a coin flip per entry
                r = rs[j]
                sel_r[cnt] = r
                sel_w[cnt] = ws[j]
                cnt += (r >> shift) == b
            for i in range(1, cnt):  # insertion sort by rank: a bin holds a few entries
                r = sel_r[i]
                w = sel_w[i]
                j = i - 1
                while j >= 0 and sel_r[j] > r:
                    sel_r[j + 1] = sel_r[j]
                    sel_w[j + 1] = sel_w[j]
                    j -= 1
                sel_r[j + 1] = r
                sel_w[j + 1] = w
            sorted_bin = b
        cum = before
        found = top  # rounding left the target just above the bins' sum: the largest outcome
        for i in range(cnt):
            cum += sel_w[i]
            if cum >= target:
                found = sel_r[i]
                break
        out[q, k] = values[found]


@kernel(parallel=True)
def _quantiles(qleaves, use, offsets_t, bounds, ranks, weights, uniform, shift, n_bins, values, levels, out, rel_tol,
               n_chunks):
    # Chunks of queries, each with its own scratch (sized by its queries' largest entry
    # count). The gather is bound by cache misses (a leaf's entries are one random line
    # per tree), so the loop runs two stages ahead: query q + 2's entry ranges and
    # query q + 1's first entries are fetched while query q is computed.
    n = qleaves.shape[0]
    n_trees = offsets_t.shape[0] - 1
    for c in prange(n_chunks):
        a = c * n // n_chunks
        b = (c + 1) * n // n_chunks
        size = 1
        for q in range(a, b):
            s = 0
            for t in range(n_trees):
                if use[q, t]:
                    node = offsets_t[t] + qleaves[q, t]
                    s += bounds[2 * node + 1] - bounds[2 * node]
            size = max(size, s)
        rs = np.empty(size, dtype=np.int64)
        ws = np.empty(size)
        sel_r = np.empty(size, dtype=np.int64)
        sel_w = np.empty(size)
        hist = np.empty(n_bins)
        los = np.empty((2, n_trees), dtype=np.int64)
        his = np.empty((2, n_trees), dtype=np.int64)
        if a < b:
            _entry_ranges(a, qleaves, use, offsets_t, bounds, ranks, weights, uniform, los[a & 1], his[a & 1])
        for q in range(a, b):
            if q + 2 < b:
                _prefetch_nodes(q + 2, qleaves, offsets_t, bounds)
            if q + 1 < b:
                _entry_ranges(q + 1, qleaves, use, offsets_t, bounds, ranks, weights, uniform, los[(q + 1) & 1],
                              his[(q + 1) & 1])
            _quantiles_one(q, los[q & 1], his[q & 1], ranks, weights, uniform, shift, values, levels, out, rel_tol,
                           rs, ws, hist, sel_r, sel_w)


#: Coarse rank bins of the prediction kernel: 2**8 at most (fewer bins leave more
#: entries to sort per level, more bins cost more to clear and walk; 2**6..2**12
#: measured, 2**8 the fastest at 200k training rows).
BINS_LOG2 = 8

#: Relative slack of the cumulative-weight test (see ``_quantiles_one``).
REL_TOL = 1e-12


class PredictionLayout:
    """The outcome lists laid out for the prediction kernel (built once per model and reused).

    The gather is bound by cache misses, so the lists shrink to what the kernel reads:
    each entry's rank among the distinct stored outcomes (4 bytes, not 24: outcome,
    weight and a coarse bin; the bin is now ``rank >> shift``), and, when every
    entry's weight is its node's equal share (no sample weights), no weight at all:
    the kernel divides 1 by the node's entry count, the same bits as the stored
    weight (checked here; otherwise the stored weights are read).

    Parameters
    ----------
    packed : dict
    outcomes : dict
        :func:`gather_leaf_outcomes`.
    count_col : int
    bins_log2 : int, optional
        At most ``2 ** bins_log2`` coarse bins (:data:`BINS_LOG2`; tests take fewer).

    Attributes
    ----------
    values : ndarray of float64, shape (n_values,)
        Distinct stored outcomes, increasing.
    ranks : ndarray of uint32 (or int64), shape (n_entries,)
        ``values[ranks] == outcomes["y"]``.
    bounds : ndarray of int64, shape (2 * n_nodes,)
        Node ``v``'s entries (those of its value node) are ``bounds[2 v]:bounds[2 v + 1]``.
    uniform : bool
        Whether every weight is ``1 / (entries of its node)``.
    weights : ndarray of float64, shape (n_entries,), or (0,) when ``uniform``
    shift : int
        Coarse bin of a rank: ``rank >> shift``.
    n_bins : int
    """

    def __init__(self, packed, outcomes, count_col, bins_log2=BINS_LOG2):
        vnode = value_nodes(packed, count_col)
        self.values, self.ranks = outcome_ranks(outcomes["y"])
        offsets = np.asarray(outcomes["offsets"], dtype=np.int64)
        self.bounds = np.ascontiguousarray(np.stack([offsets[vnode], offsets[vnode + 1]], axis=1).reshape(-1))
        weights = np.ascontiguousarray(outcomes["weight"], dtype=np.float64)
        sizes = np.diff(offsets)
        sizes = sizes[sizes > 0]
        self.uniform = bool(np.array_equal(weights, np.repeat(1.0 / sizes.astype(np.float64), sizes)))
        self.weights = np.zeros(0) if self.uniform else weights
        n_values = len(self.values)
        self.shift = max(0, (n_values - 1).bit_length() - int(bins_log2)) if n_values else 0
        self.n_bins = ((n_values - 1) >> self.shift) + 1 if n_values else 1


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
        # tree-local ids fit int32 (the packed children are int32): one compiled signature
        qleaves = np.ascontiguousarray(query_leaves, dtype=np.int32)
        offsets_t = np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64)
        n_chunks = max(1, min(len(qleaves), 8 * numba.get_num_threads()))
        _quantiles(qleaves, use, offsets_t, layout.bounds, layout.ranks, layout.weights, layout.uniform,
                   np.int64(layout.shift), int(layout.n_bins), layout.values, levels, out, REL_TOL, n_chunks)
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

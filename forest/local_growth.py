"""Exact growth of whole subtrees from binned codes, one task per node, trees in parallel.

This module owns the "finish nodes locally" step of level-wise forest growth
(:func:`forest.grower.grow_levelwise`), which by default covers whole trees from the
root (tree-parallel growth; see ``forest.grower.DEFAULT_LOCAL_THRESHOLD``). Deep forest trees (``min_samples_leaf`` ~ 5)
have thousands of nodes of a handful of rows each; giving every one of them a dense
``n_features x n_bins x C`` histogram costs ``nodes x F x B x C`` work (and bytes in the
collectives). A node of ``m`` rows instead is split exactly from its rows: per
feature, its rows are kept ordered by bin code, channel sums are accumulated along
that order, and every boundary between two distinct codes is scored, with the missing
bin on either side. A whole subtree costs ``O(F m depth)`` after one counting sort.

Two regimes inside a task (:func:`_grow_task_hybrid`)
    Nodes of more than :data:`HIST_ROWS` rows are split from per-feature histograms
    of their rows (``F x bins x C``; the smaller child is built and its sibling is the
    parent minus it, so a level costs about ``F x m/2 x C`` plus ``F x bins x C`` per
    node), keeping only a position list in gid order; nodes of at most
    :data:`HIST_ROWS` rows get the per-feature sorted orders and the exact scan
    (:func:`_grow_task`), where a node has fewer distinct codes than bins. Row-count
    histograms, not subtracted sums, decide which bins and missing rows exist. Measured
    on 25k rows, F = 20, causal channels, one thread: 104-117 ms per tree with the
    scan only, 82-85 ms with ``HIST_ROWS`` 256..1024 (92 at 2048, 100 at 4096).

Same split rule as the histogram path (:mod:`forest.splitting`)
    Of all histogram thresholds that give the same partition, the histogram search's
    tie rule picks the lowest bin, so only the present codes ``c`` (threshold
    ``b = c``) and, when the node has missing rows and no row in bin 0, the
    "missing rows alone on the left" candidate (``b = 0``, missing left) can win;
    these are exactly the candidates scored here, in the same (feature, bin,
    missing-right before missing-left) order. The best gain ``g`` wins with ties
    within ``rel_tol * |g|`` going to the first candidate in that order; a split
    needs ``g > min_gain``; a node whose chosen feature has no missing weight sends
    missing values to the heavier child. ``min_samples_split`` and ``max_depth``
    stop growth as in the histogram path, and per-node feature subsampling uses the
    draw as the histogram path (:mod:`forest.mtry`).
Determinism
    A subtree is a pure function of its rows *in their given order* (the caller passes
    them in global-row-id order), so every rank and every rank count that finishes a
    node grows the same subtree bit for bit: the counting sort and the partitions are
    stable, and sums run in that order.
Node ids
    A tree's subtrees are grown one after another (parallelism is over trees), and a
    split's two children take the next two ids of the tree, in depth-first order, so
    ids are contiguous, parents precede children, and the mtry key of a node is its
    final id.

The kernels return flat records (one per split); :func:`forest.grower.grow_levelwise`
appends them to the :class:`forest.tree.Tree` objects. :func:`grow_subtrees_reference`
is a slow pure-Python version used by tests.
"""
import numba
import numpy as np

from .causal_criterion import KIND_CAUSAL, _gain_scalar_core, causal_prepare
from ._validation import check_codes
from .criteria import variance_gains_rows, variance_prepare
from .mtry import mtry_feature_mask, mtry_keys, node_mask
from .routing import goes_left_code, goes_left_codes

#: Columns of the integer record array.
REC_NODE, REC_LEFT, REC_DEPTH, REC_FEATURE, REC_BIN, REC_MISSING_LEFT = range(6)
N_INT_FIELDS = 6

#: Nodes of more rows than this are split from per-feature histograms inside a task
#: (smaller child built, sibling by subtraction: about F x m/2 x C per level plus
#: F x bins x C per node), nodes of at most this many by the sorted-code scan (F x m
#: x C per level plus a gain per distinct code). Chosen by measurement (see the commit log).
HIST_ROWS = 1024

#: Histogram slots one task may hold at once (pending big nodes of a depth-first
#: growth: about one per level); past it, big nodes take the sorted-code scan.
MAX_HIST_SLOTS = 32

#: Below this many rows in a call, the kernel runs on one thread (waking the pool
#: costs more than the work).
_SERIAL_ROWS = 4096


@numba.njit(cache=True, inline="always")
def _prepare(kind, parent, params, consts):
    if kind == KIND_CAUSAL:
        causal_prepare(parent, params, consts)
    else:
        variance_prepare(parent, params, consts)


@numba.njit(cache=True, inline="always")
def _gains(kind, lefts, rights, consts, params, out, f, n):
    """Gains of the first ``n`` candidates into ``out[f, :n]``: the loops of
    ``causal_gains`` / ``variance_gains`` (same scalar cores, same values) written out
    here, so that no per-(node, feature) call or array view updates reference counts
    (measured ~7% of the kernel in atomic increments/decrements)."""
    # Batched per (node, feature): computing each gain inside the scan loop instead was
    # measured 1.8x slower for the whole kernel (the scan loop no longer optimises well).
    if kind == KIND_CAUSAL:
        m_leaf = params[0]
        pen = params[2]
        wb = consts[0]
        yb = consts[1]
        tau = consts[2]
        floor = consts[3]
        valid = consts[4]
        for i in range(n):
            out[f, i] = _gain_scalar_core(lefts[i, 0], lefts[i, 1], lefts[i, 2], lefts[i, 3], lefts[i, 4],
                                          lefts[i, 5], lefts[i, 6], rights[i, 0], rights[i, 1], rights[i, 2],
                                          rights[i, 3], rights[i, 4], rights[i, 5], rights[i, 6], wb, yb, tau,
                                          floor, valid, m_leaf, pen)
    else:
        variance_gains_rows(lefts, rights, consts, params, out, f, n)


@numba.njit(cache=True, inline="always")
def _arm_channel(kind, c):
    """Channel of the treated-row indicator for the causal kind (the last one of
    :class:`forest.causal_criterion.CausalChannels` with ``K = 1``), else -1."""
    return c - 1 if kind == KIND_CAUSAL else -1


@numba.njit(cache=True, inline="always")
def _sides_ok(n_l, n_r, arm_l, arm_p, arm, min_rows):
    """Whether a candidate with ``n_l`` / ``n_r`` rows left / right can pass the
    criterion's row constraints: ``min_rows`` rows per side and, for the causal kind
    (``arm >= 0``), ``min_rows`` treated and control rows per side, read from the
    arm-indicator sums (``arm_l`` left, ``arm_p`` the node's). Exactly the count tests
    of :func:`forest.causal_criterion._gain_scalar_core` (integer-valued sums), so a
    candidate that fails here would score ``-inf``; skipping it changes nothing.
    """
    ok = n_l >= min_rows and n_r >= min_rows
    if arm >= 0:
        arm_r = arm_p - arm_l
        ok = ok and arm_l >= min_rows and n_l - arm_l >= min_rows and arm_r >= min_rows and n_r - arm_r >= min_rows
    return ok


@numba.njit(cache=True, inline="always")
def _right_exhausted(n_r, arm_r, arm, min_rows):
    """No later candidate of the scan can pass: the right side (which only shrinks as
    the scan moves on, missing rows sent left or not) already has fewer than
    ``min_rows`` rows, or, for the causal kind, fewer treated or control rows."""
    done = n_r < min_rows
    if arm >= 0:
        done = done or arm_r < min_rows or n_r - arm_r < min_rows
    return done


@numba.njit(cache=True)
def _grow_task(binned, channels, rows, s, e, root_id, root_depth, tree_index, next_id, rec, rec_i, rec_f,
               nb, missing_bin, kind, params, wch, min_rows, min_split, max_depth, min_gain, rel_tol, mtry, key1,
               key2):
    """Grow the subtree of one node from its rows ``rows[s:e]``; returns ``(next_id, rec)``."""
    m = e - s
    n_features = binned.shape[0]
    c = channels.shape[1]
    # Local copies: codes (F, m) and channels (m, C) of the node's rows, by position.
    tc = np.empty((n_features, m), dtype=np.uint8)
    ch = np.empty((m, c))
    for i in range(m):
        r = rows[s + i]
        for k in range(c):
            ch[i, k] = channels[r, k]
    for f in range(n_features):
        for i in range(m):
            tc[f, i] = binned[f, rows[s + i]]
    # Stable counting sort of positions by code, per feature; later partitions keep it.
    # ``sc`` holds the codes in the same order, so scans read codes sequentially.
    order = np.empty((n_features, m), dtype=np.int32)
    sc = np.empty((n_features, m), dtype=np.uint8)
    counts = np.empty(257, dtype=np.int64)
    for f in range(n_features):
        counts[:] = 0
        for i in range(m):
            counts[np.int64(tc[f, i]) + 1] += 1
        for b in range(256):
            counts[b + 1] += counts[b]
        for i in range(m):
            code = np.int64(tc[f, i])
            order[f, counts[code]] = i
            sc[f, counts[code]] = code
            counts[code] += 1
    # Depth-first stack of nodes still to split: segment [lo, hi) of every order row.
    st_lo = np.empty(m + 1, dtype=np.int64)
    st_hi = np.empty(m + 1, dtype=np.int64)
    st_node = np.empty(m + 1, dtype=np.int64)
    st_depth = np.empty(m + 1, dtype=np.int64)
    st_stats = np.empty((m + 1, c))
    for k in range(c):
        acc = 0.0
        for i in range(m):
            acc += ch[i, k]
        st_stats[0, k] = acc
    st_lo[0] = 0
    st_hi[0] = m
    st_node[0] = root_id
    st_depth[0] = root_depth
    sp = 1
    if not (st_stats[0, wch] >= min_split and root_depth < max_depth):
        sp = 0
    # At most two candidates per distinct code plus the missing-alone one: bounded by
    # the bin count as well as by the rows (root tasks of big trees stay small here).
    n_slots = min(2 * m + 2, 2 * (missing_bin + 1) + 2)
    cand_gain = np.empty((n_features, n_slots))
    cand_bin = np.empty((n_features, n_slots), dtype=np.int64)
    cand_dir = np.empty((n_features, n_slots), dtype=np.int64)
    cand_end = np.empty((n_features, n_slots), dtype=np.int64)
    n_cand = np.zeros(n_features, dtype=np.int64)
    allowed = np.empty(n_features, dtype=np.bool_)
    parent = np.empty(c)
    consts = np.zeros(8)
    cum = np.empty(c)
    miss = np.empty(c)
    left = np.empty(c)
    right = np.empty(c)
    goes_left = np.empty(m, dtype=np.bool_)
    lefts = np.empty((n_slots, c))
    rights = np.empty((n_slots, c))
    scratch = np.empty(m, dtype=np.int32)
    scratch_c = np.empty(m, dtype=np.uint8)
    arm = _arm_channel(kind, c)
    while sp > 0:
        sp -= 1
        lo = st_lo[sp]
        hi = st_hi[sp]
        node = st_node[sp]
        depth = st_depth[sp]
        for k in range(c):
            parent[k] = st_stats[sp, k]
        _prepare(kind, parent, params, consts)
        parent_arm = parent[arm] if arm >= 0 else 0.0
        node_mask(key1, key2, tree_index, node, n_features, mtry, allowed)
        best = -np.inf
        for f in range(n_features):
            n_cand[f] = 0
            if not allowed[f]:
                continue
            # Missing rows sort last (missing_bin is the largest code).
            kv = hi
            while kv > lo and np.int64(sc[f, kv - 1]) == missing_bin:
                kv -= 1
            if kv == lo:
                continue
            n_miss = hi - kv
            for k in range(c):
                miss[k] = 0.0
            for i in range(kv, hi):
                p = order[f, i]
                for k in range(c):
                    miss[k] += ch[p, k]
            miss_a = miss[arm] if arm >= 0 else 0.0
            # Candidates in (bin, missing-right, missing-left) order; sides with fewer
            # than min_rows rows (or arm rows) fail the criterion's constraints and are
            # not scored, and the scan stops once no later side can pass.
            nc = 0
            n_node = hi - lo
            for k in range(c):
                cum[k] = 0.0
            if n_miss > 0 and sc[f, lo] > 0 and _sides_ok(n_miss, n_node - n_miss, miss_a, parent_arm, arm,
                                                          min_rows):
                # threshold bin 0 with no row in bin 0: the missing rows alone go left
                for k in range(c):
                        lefts[nc, k] = cum[k] + miss[k]
                        rights[nc, k] = parent[k] - lefts[nc, k]
                cand_bin[f, nc] = 0
                cand_dir[f, nc] = 1
                cand_end[f, nc] = lo - 1
                nc += 1
            for i in range(lo, kv):
                p = order[f, i]
                for k in range(c):
                    cum[k] += ch[p, k]
                n_l = i + 1 - lo
                cum_arm = cum[arm] if arm >= 0 else 0.0
                code = sc[f, i]
                if not (i + 1 < kv and sc[f, i + 1] == code):
                    if _sides_ok(n_l, n_node - n_l, cum_arm, parent_arm, arm, min_rows):
                        for k in range(c):
                            lefts[nc, k] = cum[k]
                            rights[nc, k] = parent[k] - cum[k]
                        cand_bin[f, nc] = code
                        cand_dir[f, nc] = 0
                        cand_end[f, nc] = i
                        nc += 1
                    if n_miss > 0 and i < kv - 1 and _sides_ok(n_l + n_miss, n_node - n_l - n_miss,
                                                               cum_arm + miss_a, parent_arm, arm, min_rows):
                        for k in range(c):
                            lefts[nc, k] = cum[k] + miss[k]
                            rights[nc, k] = parent[k] - lefts[nc, k]
                        cand_bin[f, nc] = code
                        cand_dir[f, nc] = 1
                        cand_end[f, nc] = i
                        nc += 1
                if _right_exhausted(n_node - n_l, parent_arm - cum_arm, arm, min_rows):
                    break
            n_cand[f] = nc
            if nc > 0:
                _gains(kind, lefts, rights, consts, params, cand_gain, f, nc)
            for j in range(nc):
                if cand_gain[f, j] > best:
                    best = cand_gain[f, j]
        if not (best > min_gain and best < np.inf):
            continue
        thr = best - rel_tol * abs(best)
        bf = -1
        bj = -1
        for f in range(n_features):
            for j in range(n_cand[f]):
                if cand_gain[f, j] >= thr:
                    bf = f
                    bj = j
                    break
            if bf >= 0:
                break
        b = cand_bin[bf, bj]
        d = cand_dir[bf, bj]
        end = cand_end[bf, bj]
        # The chosen children's sums, recomputed in the scan's order (same bits).
        for k in range(c):
            cum[k] = 0.0
            miss[k] = 0.0
        for i in range(lo, end + 1):
            p = order[bf, i]
            for k in range(c):
                cum[k] += ch[p, k]
        for i in range(lo, hi):
            p = order[bf, i]
            if np.int64(sc[bf, i]) == missing_bin:
                for k in range(c):
                    miss[k] += ch[p, k]
        for k in range(c):
            left[k] = cum[k] + miss[k] if d == 1 else cum[k]
            right[k] = parent[k] - left[k]
        ml = d == 1
        if miss[wch] == 0.0:
            ml = left[wch] >= right[wch]
        for i in range(lo, hi):
            p = order[bf, i]
            code = np.int64(tc[bf, p])
            goes_left[p] = goes_left_code(code, b, ml, missing_bin)
        n_left = 0
        for f in range(n_features):
            # Branchless stable partition: every row is written to both the left
            # destination (in place: lo + nl <= i, already read) and the scratch, and
            # only the side's counter moves. For any feature but the split one the
            # side is unpredictable, and the branchy form spent most of its time in
            # mispredictions (measured: the partition was ~20% of the kernel).
            nl = 0
            nr = 0
            for i in range(lo, hi):
                p = order[f, i]
                code = sc[f, i]
                gl = np.int64(goes_left[p])
                order[f, lo + nl] = p
                sc[f, lo + nl] = code
                scratch[nr] = p
                scratch_c[nr] = code
                nl += gl
                nr += 1 - gl
            for j in range(nr):
                order[f, lo + nl + j] = scratch[j]
                sc[f, lo + nl + j] = scratch_c[j]
            n_left = nl
        lid = next_id
        next_id += 2
        rec_i[rec, REC_NODE] = node
        rec_i[rec, REC_LEFT] = lid
        rec_i[rec, REC_DEPTH] = depth + 1
        rec_i[rec, REC_FEATURE] = bf
        rec_i[rec, REC_BIN] = b
        rec_i[rec, REC_MISSING_LEFT] = 1 if ml else 0
        rec_f[rec, 0] = best
        for k in range(c):
            rec_f[rec, 1 + k] = left[k]
            rec_f[rec, 1 + c + k] = right[k]
        rec += 1
        mid = lo + n_left
        # Push right first so the left child is split next (depth-first, left first).
        if right[wch] >= min_split and depth + 1 < max_depth:
            st_lo[sp] = mid
            st_hi[sp] = hi
            st_node[sp] = lid + 1
            st_depth[sp] = depth + 1
            for k in range(c):
                st_stats[sp, k] = right[k]
            sp += 1
        if left[wch] >= min_split and depth + 1 < max_depth:
            st_lo[sp] = lo
            st_hi[sp] = mid
            st_node[sp] = lid
            st_depth[sp] = depth + 1
            for k in range(c):
                st_stats[sp, k] = left[k]
            sp += 1
    return next_id, rec


@numba.njit(cache=True)
def _hist_add(hist, hcnt, tcb, chl, pos, lo, hi, sign):
    """``hist[f, code] += sign * channels`` and ``hcnt[f, code] += sign`` over positions ``pos[lo:hi]``."""
    n_features = tcb.shape[1]
    c = chl.shape[1]
    for i in range(lo, hi):
        p = pos[i]
        for f in range(n_features):
            code = np.int64(tcb[p, f])
            hcnt[f, code] += sign
            for k in range(c):
                hist[f, code, k] += sign * chl[p, k]


@numba.njit(cache=True)
def _grow_task_hybrid(binned, channels, rows, s, e, root_id, root_depth, tree_index, next_id, rec, rec_i, rec_f,
                      nb, missing_bin, kind, params, wch, min_rows, min_split, max_depth, min_gain, rel_tol, mtry,
                      key1, key2, hist_rows, max_slots):
    """:func:`_grow_task` for a node of any size: nodes above ``hist_rows`` rows split from
    per-feature histograms (the smaller child built, its sibling by subtraction), and
    every node at or below it is finished by the sorted-code scan of :func:`_grow_task`.

    Same candidates, order, tie rule and depth-first ids as :func:`_grow_task`; only
    the channel sums of histogram-mode nodes are added in another order (last bits).
    The split is exactly the sorted scan's unless two gains tie within those bits.
    """
    m = e - s
    if m <= hist_rows:
        return _grow_task(binned, channels, rows, s, e, root_id, root_depth, tree_index, next_id, rec, rec_i, rec_f,
                          nb, missing_bin, kind, params, wch, min_rows, min_split, max_depth, min_gain, rel_tol, mtry,
                          key1, key2)
    n_features = binned.shape[0]
    c = channels.shape[1]
    n_codes = missing_bin + 1
    arm = _arm_channel(kind, c)
    # Row-major local copies (a histogram pass reads all codes of one row together).
    tcb = np.empty((m, n_features), dtype=np.uint8)
    chl = np.empty((m, c))
    for i in range(m):
        r = rows[s + i]
        for k in range(c):
            chl[i, k] = channels[r, k]
        for f in range(n_features):
            tcb[i, f] = binned[f, r]
    pos = np.arange(m)
    scratch = np.empty(m, dtype=np.int64)
    sub_rows = np.empty(m, dtype=np.int64)
    # Histogram slots: live ones belong to disjoint nodes of more than hist_rows rows.
    # When all max_slots are live, a big node falls back to the sorted-code scan.
    n_slots = min(m // max(hist_rows, 1) + 1, max_slots)
    hist = np.zeros((n_slots, n_features, n_codes, c))
    hcnt = np.zeros((n_slots, n_features, n_codes), dtype=np.int64)
    free = np.empty(n_slots, dtype=np.int64)
    n_free = n_slots
    for j in range(n_slots):
        free[j] = n_slots - 1 - j
    # Stack: segment [lo, hi) of pos, node, depth, sums, histogram slot (-1: none).
    st_lo = np.empty(m + 1, dtype=np.int64)
    st_hi = np.empty(m + 1, dtype=np.int64)
    st_node = np.empty(m + 1, dtype=np.int64)
    st_depth = np.empty(m + 1, dtype=np.int64)
    st_slot = np.empty(m + 1, dtype=np.int64)
    st_stats = np.empty((m + 1, c))
    for k in range(c):
        acc = 0.0
        for i in range(m):
            acc += chl[i, k]
        st_stats[0, k] = acc
    st_lo[0] = 0
    st_hi[0] = m
    st_node[0] = root_id
    st_depth[0] = root_depth
    st_slot[0] = -1
    sp = 1
    if not (st_stats[0, wch] >= min_split and root_depth < max_depth):
        sp = 0
    n_slots_cand = 2 * n_codes + 2
    cand_gain = np.empty((n_features, n_slots_cand))
    cand_bin = np.empty((n_features, n_slots_cand), dtype=np.int64)
    cand_dir = np.empty((n_features, n_slots_cand), dtype=np.int64)
    n_cand = np.zeros(n_features, dtype=np.int64)
    allowed = np.empty(n_features, dtype=np.bool_)
    parent = np.empty(c)
    consts = np.zeros(8)
    cum = np.empty(c)
    miss = np.empty(c)
    left = np.empty(c)
    right = np.empty(c)
    lefts = np.empty((n_slots_cand, c))
    rights = np.empty((n_slots_cand, c))
    cand_left = np.empty((n_features, n_slots_cand, c))
    while sp > 0:
        sp -= 1
        lo = st_lo[sp]
        hi = st_hi[sp]
        node = st_node[sp]
        depth = st_depth[sp]
        slot = st_slot[sp]
        n_node = hi - lo
        if slot < 0 and (n_node <= hist_rows or n_free == 0):
            # Small node (or no histogram memory left): the exact sorted-code scan.
            for i in range(n_node):
                sub_rows[i] = rows[s + pos[lo + i]]
            next_id, rec = _grow_task(binned, channels, sub_rows, 0, n_node, node, depth, tree_index, next_id, rec,
                                      rec_i, rec_f, nb, missing_bin, kind, params, wch, min_rows, min_split,
                                      max_depth, min_gain, rel_tol, mtry, key1, key2)
            continue
        if slot < 0:
            n_free -= 1
            slot = free[n_free]
            hist[slot] = 0.0
            hcnt[slot] = 0
            _hist_add(hist[slot], hcnt[slot], tcb, chl, pos, lo, hi, 1)
        h = hist[slot]
        hc = hcnt[slot]
        for k in range(c):
            parent[k] = st_stats[sp, k]
        _prepare(kind, parent, params, consts)
        parent_arm = parent[arm] if arm >= 0 else 0.0
        node_mask(key1, key2, tree_index, node, n_features, mtry, allowed)
        best = -np.inf
        for f in range(n_features):
            n_cand[f] = 0
            if not allowed[f]:
                continue
            n_miss = hc[f, missing_bin]
            n_present = n_node - n_miss
            if n_present == 0:
                continue
            for k in range(c):
                miss[k] = h[f, missing_bin, k]
            miss_a = miss[arm] if arm >= 0 else 0.0
            # Candidates in the sorted scan's order: (bin, missing-right, missing-left).
            nc = 0
            if n_miss > 0 and hc[f, 0] == 0 and _sides_ok(n_miss, n_present, miss_a, parent_arm, arm, min_rows):
                for k in range(c):
                    lefts[nc, k] = 0.0 + miss[k]
                    rights[nc, k] = parent[k] - lefts[nc, k]
                cand_bin[f, nc] = 0
                cand_dir[f, nc] = 1
                nc += 1
            for k in range(c):
                cum[k] = 0.0
            n_l = 0
            for b in range(missing_bin):
                cb = hc[f, b]
                if cb == 0:
                    continue
                for k in range(c):
                    cum[k] += h[f, b, k]
                n_l += cb
                cum_arm = cum[arm] if arm >= 0 else 0.0
                if _sides_ok(n_l, n_node - n_l, cum_arm, parent_arm, arm, min_rows):
                    for k in range(c):
                        lefts[nc, k] = cum[k]
                        rights[nc, k] = parent[k] - cum[k]
                    cand_bin[f, nc] = b
                    cand_dir[f, nc] = 0
                    nc += 1
                if n_miss > 0 and n_l < n_present and _sides_ok(n_l + n_miss, n_node - n_l - n_miss,
                                                                cum_arm + miss_a, parent_arm, arm, min_rows):
                    for k in range(c):
                        lefts[nc, k] = cum[k] + miss[k]
                        rights[nc, k] = parent[k] - lefts[nc, k]
                    cand_bin[f, nc] = b
                    cand_dir[f, nc] = 1
                    nc += 1
                if n_l == n_present or _right_exhausted(n_node - n_l, parent_arm - cum_arm, arm, min_rows):
                    break
            n_cand[f] = nc
            if nc > 0:
                _gains(kind, lefts, rights, consts, params, cand_gain, f, nc)
                for j in range(nc):
                    for k in range(c):
                        cand_left[f, j, k] = lefts[j, k]
                    if cand_gain[f, j] > best:
                        best = cand_gain[f, j]
        if not (best > min_gain and best < np.inf):
            n_free += 1
            free[n_free - 1] = slot
            continue
        thr = best - rel_tol * abs(best)
        bf = -1
        bj = -1
        for f in range(n_features):
            for j in range(n_cand[f]):
                if cand_gain[f, j] >= thr:
                    bf = f
                    bj = j
                    break
            if bf >= 0:
                break
        b = cand_bin[bf, bj]
        d = cand_dir[bf, bj]
        for k in range(c):
            left[k] = cand_left[bf, bj, k]
            right[k] = parent[k] - left[k]
        ml = d == 1
        # Row counts, not the subtracted sums, say whether the node has missing rows
        # (parent minus child leaves rounding residue where the rows are gone).
        if hc[bf, missing_bin] == 0 or h[bf, missing_bin, wch] == 0.0:
            ml = left[wch] >= right[wch]
        # Stable partition of the node's positions (gid order kept on both sides).
        nl = 0
        nr = 0
        for i in range(lo, hi):
            p = pos[i]
            code = np.int64(tcb[p, bf])
            if goes_left_code(code, b, ml, missing_bin):
                pos[lo + nl] = p
                nl += 1
            else:
                scratch[nr] = p
                nr += 1
        for j in range(nr):
            pos[lo + nl + j] = scratch[j]
        mid = lo + nl
        lid = next_id
        next_id += 2
        rec_i[rec, REC_NODE] = node
        rec_i[rec, REC_LEFT] = lid
        rec_i[rec, REC_DEPTH] = depth + 1
        rec_i[rec, REC_FEATURE] = bf
        rec_i[rec, REC_BIN] = b
        rec_i[rec, REC_MISSING_LEFT] = 1 if ml else 0
        rec_f[rec, 0] = best
        for k in range(c):
            rec_f[rec, 1 + k] = left[k]
            rec_f[rec, 1 + c + k] = right[k]
        rec += 1
        can_l = left[wch] >= min_split and depth + 1 < max_depth
        can_r = right[wch] >= min_split and depth + 1 < max_depth
        big_l = can_l and nl > hist_rows
        big_r = can_r and nr > hist_rows
        slot_l = -1
        slot_r = -1
        if (big_l or big_r) and n_free > 0:
            # Build the child with fewer rows; the parent's slot becomes its sibling.
            n_free -= 1
            s2 = free[n_free]
            hist[s2] = 0.0
            hcnt[s2] = 0
            if nl <= nr:
                _hist_add(hist[s2], hcnt[s2], tcb, chl, pos, lo, mid, 1)
                slot_l = s2
                slot_r = slot
            else:
                _hist_add(hist[s2], hcnt[s2], tcb, chl, pos, mid, hi, 1)
                slot_l = slot
                slot_r = s2
            hist[slot] -= hist[s2]
            hcnt[slot] -= hcnt[s2]
            if not big_l:
                n_free += 1
                free[n_free - 1] = slot_l
                slot_l = -1
            if not big_r:
                n_free += 1
                free[n_free - 1] = slot_r
                slot_r = -1
        else:
            n_free += 1
            free[n_free - 1] = slot
        # Push right first so the left child is split next (depth-first, left first).
        if can_r:
            st_lo[sp] = mid
            st_hi[sp] = hi
            st_node[sp] = lid + 1
            st_depth[sp] = depth + 1
            st_slot[sp] = slot_r
            for k in range(c):
                st_stats[sp, k] = right[k]
            sp += 1
        if can_l:
            st_lo[sp] = lo
            st_hi[sp] = mid
            st_node[sp] = lid
            st_depth[sp] = depth + 1
            st_slot[sp] = slot_l
            for k in range(c):
                st_stats[sp, k] = left[k]
            sp += 1
    return next_id, rec


@numba.njit(cache=True)
def _grow_one_tree(t, binned, channels, rows, task_starts, tree_task_starts, task_node, task_depth, tree_next,
                   tree_index, rec_offsets, rec_i, rec_f, rec_count, nb, missing_bin, kind, params, wch, min_rows,
                   min_split, max_depth, min_gain, rel_tol, mtry, key1, key2, hist_rows, max_slots):
    next_id = tree_next[t]
    rec = rec_offsets[t]
    for task in range(tree_task_starts[t], tree_task_starts[t + 1]):
        next_id, rec = _grow_task_hybrid(binned, channels, rows, task_starts[task], task_starts[task + 1],
                                         task_node[task], task_depth[task], tree_index[t], next_id, rec, rec_i, rec_f,
                                         nb, missing_bin, kind, params, wch, min_rows, min_split, max_depth, min_gain,
                                         rel_tol, mtry, key1, key2, hist_rows, max_slots)
    rec_count[t] = rec - rec_offsets[t]


@numba.njit(cache=True)
def _grow_trees_serial(binned, channels, rows, task_starts, tree_task_starts, task_node, task_depth, tree_next,
                       tree_index, rec_offsets, rec_i, rec_f, rec_count, nb, missing_bin, kind, params, wch,
                       min_rows, min_split, max_depth, min_gain, rel_tol, mtry, key1, key2, hist_rows, max_slots):
    for t in range(tree_next.shape[0]):
        _grow_one_tree(t, binned, channels, rows, task_starts, tree_task_starts, task_node, task_depth, tree_next,
                       tree_index, rec_offsets, rec_i, rec_f, rec_count, nb, missing_bin, kind, params, wch,
                       min_rows, min_split, max_depth, min_gain, rel_tol, mtry, key1, key2, hist_rows, max_slots)


@numba.njit(cache=True, parallel=True)
def _grow_trees_parallel(binned, channels, rows, task_starts, tree_task_starts, task_node, task_depth, tree_next,
                         tree_index, rec_offsets, rec_i, rec_f, rec_count, nb, missing_bin, kind, params, wch,
                         min_rows, min_split, max_depth, min_gain, rel_tol, mtry, key1, key2, hist_rows, max_slots):
    # Each tree writes only its own record slice and count: no races.
    for t in numba.prange(tree_next.shape[0]):
        _grow_one_tree(t, binned, channels, rows, task_starts, tree_task_starts, task_node, task_depth, tree_next,
                       tree_index, rec_offsets, rec_i, rec_f, rec_count, nb, missing_bin, kind, params, wch,
                       min_rows, min_split, max_depth, min_gain, rel_tol, mtry, key1, key2, hist_rows, max_slots)


class SubtreeRecords:
    """Splits made by :func:`grow_subtrees`, grouped by tree, in id order.

    Attributes
    ----------
    ints : ndarray of int64, shape (n_splits, 6)
        Columns ``REC_NODE`` (split node id), ``REC_LEFT`` (left child id; the right
        child is ``left + 1``), ``REC_DEPTH`` (children's depth), ``REC_FEATURE``,
        ``REC_BIN``, ``REC_MISSING_LEFT``.
    floats : ndarray of float64, shape (n_splits, 1 + 2 C)
        Gain, then the left child's channel sums, then the right child's.
    tree_starts : ndarray of int64, shape (n_trees + 1,)
        Tree ``t``'s splits are rows ``tree_starts[t]:tree_starts[t+1]``.
    """

    def __init__(self, ints, floats, tree_starts):
        self.ints = ints
        self.floats = floats
        self.tree_starts = tree_starts


def _as_row_bound(x):
    """An int64 row bound from an int or float (``inf``: no bound)."""
    return int(np.iinfo(np.int64).max) if not np.isfinite(x) else max(int(x), 0)


def grow_subtrees(binned, channels, rows, task_starts, task_tree, task_node, task_depth, tree_next, tree_index,
                  numba_gain, n_bins_non_missing, missing_bin, *, min_samples_split=2.0, max_depth=None, min_gain=0.0,
                  rel_tol=1e-12, mtry=None, seed=0, hist_rows=None, max_hist_slots=None):
    """Grow the full subtrees of a set of nodes exactly from their rows.

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows)
    channels : ndarray of float64, shape (n_rows, C)
    rows : ndarray of int64, shape (m,)
        Row ids into ``binned`` / ``channels``, grouped by task (subtree root); within a
        task the order is the summation and tie order (pass global-row-id order).
    task_starts : ndarray of int64, shape (n_tasks + 1,)
    task_tree : ndarray of int64, shape (n_tasks,)
        Batch-local tree of each task, non-decreasing in ``[0, n_trees)``.
    task_node, task_depth : ndarray of int64, shape (n_tasks,)
        Node id (already in the tree) and depth of each subtree root.
    tree_next : ndarray of int64, shape (n_trees,)
        First free node id of each tree.
    tree_index : ndarray of int64, shape (n_trees,)
        Global tree index (keys mtry).
    numba_gain : forest.criteria.NumbaGain
    n_bins_non_missing : ndarray of int, shape (n_features,)
    missing_bin : int
    min_samples_split, max_depth, min_gain, rel_tol, mtry, seed
        As in :func:`forest.grower.grow_levelwise`.
    hist_rows : int or None
        Nodes of more rows than this split from histograms (:func:`_grow_task_hybrid`);
        ``None`` means :data:`HIST_ROWS`.
    max_hist_slots : int or None
        Histograms a task may hold at once (``None``: :data:`MAX_HIST_SLOTS`); a big
        node met with all of them live is split by the sorted-code scan instead
        (the same split; tests lower this to reach that path).

    Returns
    -------
    SubtreeRecords
    """
    binned = check_codes(binned)
    channels = np.ascontiguousarray(channels, dtype=np.float64)
    if channels.ndim != 2 or channels.shape[0] != binned.shape[1]:
        raise ValueError(f"channels must have shape ({binned.shape[1]}, C), got {channels.shape}")
    c = channels.shape[1]
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    task_starts = np.ascontiguousarray(task_starts, dtype=np.int64)
    task_tree = np.ascontiguousarray(task_tree, dtype=np.int64)
    tree_next = np.ascontiguousarray(tree_next, dtype=np.int64)
    n_trees = len(tree_next)
    n_tasks = len(task_tree)
    if task_starts.shape != (n_tasks + 1,) or task_starts[-1] != len(rows):
        raise ValueError("task_starts must have n_tasks + 1 entries ending at len(rows)")
    if n_tasks and (np.any(np.diff(task_tree) < 0) or task_tree[0] < 0 or task_tree[-1] >= n_trees):
        raise ValueError("task_tree must be non-decreasing tree numbers in [0, n_trees)")
    tree_task_starts = np.searchsorted(task_tree, np.arange(n_trees + 1)).astype(np.int64)
    # A subtree of m rows makes at most m / r - 1 splits: every leaf keeps at least
    # r = min_child_rows rows (the kernel never scores a smaller side).
    rows_per_tree = np.bincount(task_tree, weights=np.diff(task_starts), minlength=n_trees).astype(np.int64)
    rows_per_tree //= max(1, int(numba_gain.min_child_rows))
    rec_offsets = np.zeros(n_trees + 1, dtype=np.int64)
    np.cumsum(rows_per_tree, out=rec_offsets[1:])
    total = int(rec_offsets[-1])
    rec_i = np.empty((total, N_INT_FIELDS), dtype=np.int64)
    rec_f = np.empty((total, 1 + 2 * c))
    rec_count = np.zeros(n_trees, dtype=np.int64)
    key1, key2 = mtry_keys(seed)
    mt = 0 if mtry is None else int(mtry)
    md = np.iinfo(np.int64).max if max_depth is None else int(max_depth)
    nb = np.ascontiguousarray(n_bins_non_missing, dtype=np.int64)
    args = (binned, channels, rows, task_starts, tree_task_starts, np.ascontiguousarray(task_node, dtype=np.int64),
            np.ascontiguousarray(task_depth, dtype=np.int64), tree_next,
            np.ascontiguousarray(tree_index, dtype=np.int64), rec_offsets, rec_i, rec_f, rec_count, nb,
            int(missing_bin), numba_gain.kind, numba_gain.params, numba_gain.weight_channel,
            int(numba_gain.min_child_rows), float(min_samples_split),
            md, float(min_gain), float(rel_tol), mt, key1, key2,
            _as_row_bound(HIST_ROWS if hist_rows is None else hist_rows),
            max(1, int(MAX_HIST_SLOTS if max_hist_slots is None else max_hist_slots)))
    if n_tasks:
        if len(rows) < _SERIAL_ROWS or n_trees == 1 or numba.get_num_threads() == 1:
            _grow_trees_serial(*args)
        else:
            _grow_trees_parallel(*args)
    keep = np.concatenate([np.arange(rec_offsets[t], rec_offsets[t] + rec_count[t]) for t in range(n_trees)]) \
        if n_trees else np.zeros(0, dtype=np.int64)
    starts = np.zeros(n_trees + 1, dtype=np.int64)
    np.cumsum(rec_count, out=starts[1:])
    return SubtreeRecords(rec_i[keep], rec_f[keep], starts)


# ---------------------------------------------------------------------- reference
def grow_subtrees_reference(binned, channels, rows, task_starts, task_tree, task_node, task_depth, tree_next,
                            tree_index, criterion, n_bins_non_missing, missing_bin, *, min_samples_split=2.0,
                            max_depth=None, min_gain=0.0, rel_tol=1e-12, mtry=None, seed=0):
    """Slow reference of :func:`grow_subtrees`: per node, a dense per-bin table and the
    vectorised criterion over *every* histogram threshold (no candidate pruning), with
    the tie rule of :func:`forest.splitting.find_best_splits_reference`.

    Same parameters (``criterion`` instead of its ``NumbaGain``) and result, except
    that sums come from per-bin tables, so channel sums may differ in the last bits.
    """
    c = channels.shape[1]
    n_features = binned.shape[0]
    nb = np.asarray(n_bins_non_missing, dtype=np.int64)
    wch = criterion.numba_gain().weight_channel
    max_depth = np.iinfo(np.int64).max if max_depth is None else int(max_depth)
    n_trees = len(tree_next)
    ints = [[] for _ in range(n_trees)]
    floats = [[] for _ in range(n_trees)]
    for t in range(n_trees):
        next_id = int(tree_next[t])
        for task in np.flatnonzero(np.asarray(task_tree) == t):
            seg = np.asarray(rows[task_starts[task]:task_starts[task + 1]], dtype=np.int64)
            root_stats = channels[seg].sum(axis=0) if len(seg) else np.zeros(c)
            stack = [(seg, int(task_node[task]), int(task_depth[task]), root_stats)]
            if not (root_stats[wch] >= min_samples_split and task_depth[task] < max_depth):
                stack = []
            while stack:
                seg, node, depth, pstats = stack.pop()
                mask = mtry_feature_mask(seed, [tree_index[t]], [node], n_features, mtry)[0]
                cands = []
                for f in range(n_features):
                    if not mask[f]:
                        continue
                    codes = binned[f, seg].astype(np.int64)
                    table = np.zeros((missing_bin + 1, c))
                    np.add.at(table, codes, channels[seg])
                    miss = table[missing_bin]
                    for b in range(int(nb[f])):
                        for d in (0, 1):
                            if d == 1 and b == nb[f] - 1:
                                continue
                            left_rows = goes_left_codes(codes, b, d == 1, missing_bin)
                            if left_rows.all() or not left_rows.any():
                                continue
                            left = channels[seg[left_rows]].sum(axis=0)
                            right = pstats - left
                            g = float(criterion.gain(left, right, pstats))
                            cands.append((g, f, b, d, left, right, left_rows, miss))
                if not cands:
                    continue
                best = max(x[0] for x in cands)
                if not (np.isfinite(best) and best > min_gain):
                    continue
                for g, f, b, d, left, right, left_rows, miss in cands:
                    if g >= best - rel_tol * abs(best):
                        break
                ml = bool(d)
                if miss[wch] == 0:
                    ml = bool(left[wch] >= right[wch])
                    codes = binned[f, seg].astype(np.int64)
                    left_rows = goes_left_codes(codes, b, ml, missing_bin)
                lid = next_id
                next_id += 2
                ints[t].append([node, lid, depth + 1, f, b, int(ml)])
                floats[t].append(np.concatenate([[best], left, right]))
                for child_rows, cid, st in ((seg[~left_rows], lid + 1, right), (seg[left_rows], lid, left)):
                    if st[wch] >= min_samples_split and depth + 1 < max_depth:
                        stack.append((child_rows, cid, depth + 1, st))
    starts = np.zeros(n_trees + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ints], out=starts[1:])
    all_i = np.array([r for x in ints for r in x], dtype=np.int64).reshape(-1, N_INT_FIELDS)
    all_f = np.array([r for x in floats for r in x], dtype=np.float64).reshape(-1, 1 + 2 * c)
    return SubtreeRecords(all_i, all_f, starts)

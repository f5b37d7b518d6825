"""Exact growth of whole subtrees from binned codes, one task per node, trees in parallel.

This module owns the compiled subtree kernel that finishes nodes of level-wise
forest growth (:mod:`forest.engine.tree_parallel`), by default whole trees from the root.
Deep forest trees (``min_samples_leaf`` ~ 5) have thousands of nodes of a handful
of rows each; a dense ``n_features x n_bins x C`` histogram for each of them costs
``nodes x F x B x C`` work (and bytes in the collectives). Here a node is split
exactly from its rows.

One depth-first kernel, two candidate sources (:func:`_grow_task`)
    Nodes of more than ``EngineOptions.hist_rows`` rows (histogram mode) are split
    from per-feature histograms of their rows (:func:`forest.engine.splitting.hist_candidates`,
    the source the level-wise search uses too; the smaller child is built and its
    sibling is the parent minus it, so a level costs about ``F x m/2 x C`` plus
    ``F x bins x C`` per node), keeping only a position list in gid order. The
    first node at or below it enters scan mode: its rows are sorted by code per
    feature once (a counting sort), channel sums are accumulated along that order and
    every boundary between two distinct codes is scored, with the missing bin on
    either side (:func:`_scan_candidates`); partitions keep every order, so the
    whole subtree costs ``O(F m depth)``. Row-count histograms, not subtracted sums,
    decide which bins and missing rows exist. Measured on 25k rows, F = 20, causal
    channels, one thread: 104-117 ms per tree with the scan only, 82-85 ms with
    ``hist_rows`` 256..1024 (92 at 2048, 100 at 4096).
The criterion
    The kernel is specialised per criterion through the criterion's parameter record
    (:mod:`forest.criteria.compiled`): it calls ``prepare`` once per node, ``gains``
    once per (node, feature) with that feature's candidates, and the ``sides_ok`` /
    ``right_exhausted`` count shortcuts while scanning. Growth settings travel as one
    record (:data:`GrowthRecord`). A criterion with row classes (the probability
    forest's one-hot criterion; the row-class pieces of :mod:`forest.criteria.compiled`)
    scans by class instead (:func:`_class_node`): per row a class count and two integer
    updates rather than ``C`` channel adds, per candidate two (rows, statistic) pairs
    rather than ``2 C`` sums; its histograms count rows per (feature, code, class) and
    form each bin's sums once (:func:`_class_hist`). The same trees bit for bit. Measured on the issue 34 fit
    (200k rows, one thread, interleaved in one process): benchmarks/RESULTS.md,
    "ProbabilityForest (issue 34)".
Same split rule as the histogram path (:mod:`forest.engine.splitting`)
    Of all histogram thresholds that give the same partition, the histogram search's
    tie rule picks the lowest bin, so only the present codes ``c`` (threshold
    ``b = c``) and, when the node has missing rows and no row in bin 0, the
    "missing rows alone on the left" candidate (``b = 0``, missing left) can win;
    these are exactly the candidates scored here, in the same (feature, bin,
    missing-right before missing-left) order, and the choice among them is
    :func:`forest.engine.splitting.first_near_best`. A node whose chosen feature has no
    missing weight sends missing values to the heavier child. ``min_samples_split``
    and ``max_depth`` stop growth as in the histogram path, and per-node feature
    subsampling uses the draw of the histogram path (:mod:`forest.engine.mtry`).
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

The kernels return flat records (one per split), which :mod:`forest.engine.tree_parallel`
appends to the :class:`forest.engine.tree.Tree` objects. :func:`grow_subtrees_reference` is
a slow pure-Python version used by tests.
"""
import numba
import numpy as np
from collections import namedtuple
from numba.extending import overload

from histogram.jit import arange, compiled_only, empty, kernel, zeros
from forest.criteria import compiled as cc
from forest._validation import check_codes
from forest.engine.growth_options import current_engine_options
from forest.engine.mtry import mtry_feature_mask, mtry_keys, node_mask
from forest.engine.routing import goes_left_code, goes_left_codes, goes_left_set
from forest.engine.categorical_split import halves_to_bits
from forest.engine.splitting import admissible_jit, first_near_best, hist_candidates, largest_gain
from forest.engine.tree import CAT_WORDS, CATEGORICAL_SPLIT, cat_bitset

#: Columns of the integer record array; ``REC_BITS`` on: a categorical split's category
#: set (``CAT_WORDS`` uint64 words as 32-bit halves, low first), zero for numeric splits.
REC_NODE, REC_LEFT, REC_DEPTH, REC_FEATURE, REC_BIN, REC_MISSING_LEFT = range(6)
REC_BITS = 6
N_INT_FIELDS = REC_BITS + 2 * CAT_WORDS

#: Below this many rows in a call, the kernel runs on one thread (waking the pool
#: costs more than the work).
_SERIAL_ROWS = 4096

#: The growth settings of one :func:`grow_subtrees` call, as the kernel reads them:
#: ``missing_bin``, ``min_rows`` (the criterion's ``min_child_rows``),
#: ``weight_channel``, ``size_channel`` (compared with ``min_split``), ``n_consts`` (the
#: criterion's node-constant count), ``min_split``, ``max_depth``, ``min_gain``, ``rel_tol``, ``mtry`` (0: all
#: features), ``key1``/``key2`` (:func:`forest.engine.mtry.mtry_keys`), ``hist_rows`` and
#: ``max_slots``.
GrowthRecord = namedtuple("GrowthRecord", ["missing_bin", "min_rows", "weight_channel", "size_channel", "n_consts",
                                           "min_split", "max_depth", "min_gain", "rel_tol", "mtry", "key1", "key2", "hist_rows",
                                           "max_slots"])


@compiled_only
def _scan_candidates(p, f, lo, hi, order, sc, ch, parent, min_rows, missing_bin, cum, miss, lefts, rights, cand_bin,
                     cand_dir, cand_end):
    """Split candidates of feature ``f`` of a scan-mode node from its rows sorted by code.

    ``order[f, lo:hi]`` are the node's scan positions sorted by code (``sc`` the codes
    in that order, missing last), ``ch`` their channels. Every boundary between two
    distinct codes is a candidate, with the missing rows right and (when the node
    has some) left, plus "missing rows alone on the left" when no row has code 0:
    exactly the partitions a histogram threshold can make, in the histogram search's
    (bin, missing-right, missing-left) order. Sides with fewer than ``min_rows`` rows
    or failing the criterion's ``sides_ok`` are not scored, and the scan stops once
    the right side is exhausted. Fills ``lefts``/``rights``, ``cand_bin``,
    ``cand_dir`` and ``cand_end`` (last scan index on the left); returns the count.

    Called, not inlined, as :func:`forest.engine.splitting.hist_candidates`: ~1.3 s less to
    compile the subtree kernel for ~1 % of a warm fit (benchmarks/RESULTS.md, "Cold start").
    """
    c = ch.shape[1]
    # Missing rows sort last (missing_bin is the largest code).
    kv = hi
    while kv > lo and np.int64(sc[f, kv - 1]) == missing_bin:
        kv -= 1
    if kv == lo:
        return 0
    n_miss = hi - kv
    for k in range(c):
        miss[k] = 0.0
        cum[k] = 0.0
    for i in range(kv, hi):
        q = np.uint32(order[f, i])
        for k in range(c):
            miss[k] += ch[q, k]
    nc = 0
    n_node = hi - lo
    if n_miss > 0 and sc[f, lo] > 0 and n_miss >= min_rows and n_node - n_miss >= min_rows \
            and cc.sides_ok(p, n_miss, n_node - n_miss, cum, miss, True, parent):
        # threshold bin 0 with no row in bin 0: the missing rows alone go left
        for k in range(c):
            lefts[nc, k] = cum[k] + miss[k]
            rights[nc, k] = parent[k] - lefts[nc, k]
        cand_bin[f, nc] = 0
        cand_dir[f, nc] = 1
        cand_end[f, nc] = lo - 1
        nc += 1
    for i in range(lo, kv):
        q = np.uint32(order[f, i])
        for k in range(c):
            cum[k] += ch[q, k]
        n_l = i + 1 - lo
        code = sc[f, np.uint64(i)]
        if not (i + 1 < kv and sc[f, np.uint64(i + 1)] == code):
            if n_l >= min_rows and n_node - n_l >= min_rows \
                    and cc.sides_ok(p, n_l, n_node - n_l, cum, miss, False, parent):
                for k in range(c):
                    lefts[nc, k] = cum[k]
                    rights[nc, k] = parent[k] - cum[k]
                cand_bin[f, nc] = code
                cand_dir[f, nc] = 0
                cand_end[f, nc] = i
                nc += 1
            if n_miss > 0 and i < kv - 1 and n_l + n_miss >= min_rows and n_node - n_l - n_miss >= min_rows \
                    and cc.sides_ok(p, n_l + n_miss, n_node - n_l - n_miss, cum, miss, True, parent):
                for k in range(c):
                    lefts[nc, k] = cum[k] + miss[k]
                    rights[nc, k] = parent[k] - lefts[nc, k]
                cand_bin[f, nc] = code
                cand_dir[f, nc] = 1
                cand_end[f, nc] = i
                nc += 1
        if n_node - n_l < min_rows or cc.right_exhausted(p, n_node - n_l, cum, parent):
            break
    return nc


# ---------------------------------------------------------------------- class-count scan
# For a criterion with row classes (forest.criteria.compiled's row-class pieces; the
# probability forest's one-hot criterion) a scan subtree's rows get their class once, and
# the scans count rows per class and keep both sides' summed squared class counts by
# integer updates: a row costs one count and two integer updates instead of C channel
# adds, and a candidate two (rows, statistic) pairs instead of 2 C sums, scored by the
# criterion's class_gains (the same bits as its gains on the sums). The entry points
# resolve by the record's class at typing time: for a criterion without the pieces each is
# a stub (no classes, so the kernel only ever runs the channel scan and LLVM drops the
# dead branches), and its kernels compile as before the pieces existed, plus those stubs.
def _classes_on(p, ch, n, cls):
    # Classes of rows 0..n of ch into cls; False where some row has none.
    for i in range(n):
        g = cc.row_class(p, ch, i)
        if g < 0:
            return False
        cls[i] = g
    return True


def _class_node_on(p, allowed, is_cat, lo, hi, order, sc, cls, cnt, cmiss, tot, min_rows, missing_bin, st, consts,
                   cand_gain, cand_bin, cand_dir, cand_end, n_cand):
    # The node's class totals, then per allowed numeric feature _scan_candidates's candidates
    # in its order, each side (rows, class_side(q2, rows)), scored by class_gains; one call
    # per node rather than one per (node, feature) (each call passes a dozen arrays).
    for g in range(tot.shape[0]):
        tot[g] = 0
    for i in range(lo, hi):
        tot[np.uint32(cls[np.uint32(order[0, i])])] += 1
    best = -np.inf
    for f in range(order.shape[0]):
        if not allowed[f] or is_cat[f]:
            continue
        n_cand[f] = 0
        n_g = cnt.shape[0]
        kv = hi
        while kv > lo and np.int64(sc[f, kv - 1]) == missing_bin:
            kv -= 1
        if kv == lo:
            continue
        n_miss = hi - kv
        for g in range(n_g):
            cnt[g] = 0
            cmiss[g] = 0
        for i in range(kv, hi):
            cmiss[np.uint32(cls[np.uint32(order[f, i])])] += 1
        q_tot = 0
        for g in range(n_g):
            q_tot += tot[g] * tot[g]
        nc = 0
        n_node = hi - lo
        if n_miss > 0 and sc[f, lo] > 0 and n_miss >= min_rows and n_node - n_miss >= min_rows:
            # threshold bin 0 with no row in bin 0: the missing rows alone go left
            ql = 0
            qr = 0
            for g in range(n_g):
                ql += cmiss[g] * cmiss[g]
                qr += (tot[g] - cmiss[g]) * (tot[g] - cmiss[g])
            st[0, nc] = np.float64(n_miss)
            st[1, nc] = cc.class_side(p, ql, n_miss)
            st[2, nc] = np.float64(n_node - n_miss)
            st[3, nc] = cc.class_side(p, qr, n_node - n_miss)
            cand_bin[f, nc] = 0
            cand_dir[f, nc] = 1
            cand_end[f, nc] = lo - 1
            nc += 1
        q_l = 0          # sum_g cnt_g**2 of the rows left of the boundary
        cross = 0        # sum_g tot_g cnt_g: the right side's is q_tot - 2 cross + q_l
        for i in range(lo, kv):
            g = np.uint32(cls[np.uint32(order[f, i])])
            a = cnt[g]
            q_l += 2 * a + 1
            cnt[g] = a + 1
            cross += tot[g]
            n_l = i + 1 - lo
            code = sc[f, np.uint64(i)]
            if not (i + 1 < kv and sc[f, np.uint64(i + 1)] == code):
                if n_l >= min_rows and n_node - n_l >= min_rows:
                    st[0, nc] = np.float64(n_l)
                    st[1, nc] = cc.class_side(p, q_l, n_l)
                    st[2, nc] = np.float64(n_node - n_l)
                    st[3, nc] = cc.class_side(p, q_tot - 2 * cross + q_l, n_node - n_l)
                    cand_bin[f, nc] = code
                    cand_dir[f, nc] = 0
                    cand_end[f, nc] = i
                    nc += 1
                if n_miss > 0 and i < kv - 1 and n_l + n_miss >= min_rows and n_node - n_l - n_miss >= min_rows:
                    ql = 0
                    qr = 0
                    for h in range(n_g):
                        x = cnt[h] + cmiss[h]
                        ql += x * x
                        qr += (tot[h] - x) * (tot[h] - x)
                    st[0, nc] = np.float64(n_l + n_miss)
                    st[1, nc] = cc.class_side(p, ql, n_l + n_miss)
                    st[2, nc] = np.float64(n_node - n_l - n_miss)
                    st[3, nc] = cc.class_side(p, qr, n_node - n_l - n_miss)
                    cand_bin[f, nc] = code
                    cand_dir[f, nc] = 1
                    cand_end[f, nc] = i
                    nc += 1
            if n_node - n_l < min_rows:
                break
        n_cand[f] = nc
        if nc > 0:
            cc.class_gains(p, st, consts, cand_gain, f, nc)
            best_f = largest_gain(cand_gain[f], nc)
            if best_f > best:
                best = best_f
    return best


def _class_children_on(p, f, lo, end, hi, order, sc, cls, cnt, cmiss, missing_bin, cum, miss):
    # Scan positions lo..end go left; the missing rows are the tail of the feature's order.
    for g in range(cnt.shape[0]):
        cnt[g] = 0
        cmiss[g] = 0
    for i in range(lo, end + 1):
        cnt[np.uint32(cls[np.uint32(order[f, i])])] += 1
    kv = hi
    while kv > lo and np.int64(sc[f, kv - 1]) == missing_bin:
        kv -= 1
        cmiss[cls[order[f, kv]]] += 1
    cc.class_sums(p, cnt, end + 1 - lo, cum)
    cc.class_sums(p, cmiss, hi - kv, miss)


def _class_hist_on(p, hist, hcnt, tcb, tcls, hcls, pos, lo, hi):
    # Rows per (feature, code, class), then each bin's count and (exact) channel sums: the
    # bits _hist_add gives from zeroed slots, for one count per row and feature instead of
    # C channel adds.
    n_features = hcls.shape[0]
    n_codes = hcls.shape[1]
    n_g = hcls.shape[2]
    for f in range(n_features):
        for b in range(n_codes):
            for g in range(n_g):
                hcls[f, b, g] = 0
    for i in range(lo, hi):
        q = np.uint64(pos[i])
        g = np.uint32(tcls[q])
        for f in range(n_features):
            hcls[f, np.uint64(tcb[q, f]), g] += 1
    for f in range(n_features):
        for b in range(n_codes):
            n = 0
            for g in range(n_g):
                n += hcls[f, b, g]
            hcnt[f, b] = n
            if n == 0:
                for k in range(hist.shape[2]):
                    hist[f, b, k] = 0.0
            else:
                cc.class_sums(p, hcls[f, b], n, hist[f, b])


def _class_hist_off(p, hist, hcnt, tcb, tcls, hcls, pos, lo, hi):
    pass


def _class_hist(p, hist, hcnt, tcb, tcls, hcls, pos, lo, hi):
    """A histogram slot ``hist (F, B, C)`` / ``hcnt (F, B)`` of positions ``pos[lo:hi]`` from
    their classes ``tcls``: rows counted per (feature, code, class) in ``hcls (F, B, G)``,
    then each bin's sums by the criterion's ``class_sums`` (exact: what zeroing the slot and
    :func:`_hist_add` give, bit for bit). Nothing for a criterion without row classes."""
    (_class_hist_on if cc.has_row_classes(type(p)) else _class_hist_off)(p, hist, hcnt, tcb, tcls, hcls, pos, lo, hi)


@overload(_class_hist, jit_options=cc._PIECE_OPTIONS)
def _ov_class_hist(p, hist, hcnt, tcb, tcls, hcls, pos, lo, hi):
    return _class_hist_on if _typed_has_classes(p) else _class_hist_off


def _classes_off(p, ch, n, cls):
    return False


def _class_node_off(p, allowed, is_cat, lo, hi, order, sc, cls, cnt, cmiss, tot, min_rows, missing_bin, st, consts,
                    cand_gain, cand_bin, cand_dir, cand_end, n_cand):
    return -np.inf


def _class_children_off(p, f, lo, end, hi, order, sc, cls, cnt, cmiss, missing_bin, cum, miss):
    pass


def _scan_classes(p, ch, n, cls):
    """Classes of a scan subtree's rows ``0..n`` of ``ch (m, C)`` into ``cls``: whether every
    row has one (the subtree then scans by class); False for a criterion without row
    classes. The caller checks ``n_row_classes`` for the subtree's size first."""
    return (_classes_on if cc.has_row_classes(type(p)) else _classes_off)(p, ch, n, cls)


def _class_node(p, allowed, is_cat, lo, hi, order, sc, cls, cnt, cmiss, tot, min_rows, missing_bin, st, consts,
                cand_gain, cand_bin, cand_dir, cand_end, n_cand):
    """The candidates of a scan node's allowed numeric features from the rows' classes ``cls``
    (by scan position): :func:`_scan_candidates`'s candidates (bins, directions, ends) in
    its order per feature, each side's rows and ``class_side`` in rows 0-3 of ``st``, scored
    into ``cand_gain[f]`` by the criterion's ``class_gains``; fills ``n_cand[f]`` of those
    features and returns their best gain. ``tot``, ``cnt``, ``cmiss (G,)`` scratch (the
    node's, the left side's and the missing rows' class counts). Never calls ``sides_ok`` /
    ``right_exhausted`` (a criterion with row classes has neither); ``-inf`` and nothing
    written for a criterion without row classes."""
    fn = _class_node_on if cc.has_row_classes(type(p)) else _class_node_off
    return fn(p, allowed, is_cat, lo, hi, order, sc, cls, cnt, cmiss, tot, min_rows, missing_bin, st, consts, cand_gain,
              cand_bin, cand_dir, cand_end, n_cand)


def _class_children(p, f, lo, end, hi, order, sc, cls, cnt, cmiss, missing_bin, cum, miss):
    """The chosen split's sums from classes: ``cum`` of scan positions ``lo..end`` of feature
    ``f`` and ``miss`` of its missing rows (the bits of the kernel's channel sums)."""
    fn = _class_children_on if cc.has_row_classes(type(p)) else _class_children_off
    fn(p, f, lo, end, hi, order, sc, cls, cnt, cmiss, missing_bin, cum, miss)


def _typed_has_classes(p):
    return cc.has_row_classes(getattr(p, "instance_class", None))


@overload(_scan_classes, jit_options=cc._PIECE_OPTIONS)
def _ov_scan_classes(p, ch, n, cls):
    return _classes_on if _typed_has_classes(p) else _classes_off


@overload(_class_node, jit_options=cc._PIECE_OPTIONS)
def _ov_class_node(p, allowed, is_cat, lo, hi, order, sc, cls, cnt, cmiss, tot, min_rows, missing_bin, st, consts,
                   cand_gain, cand_bin, cand_dir, cand_end, n_cand):
    return _class_node_on if _typed_has_classes(p) else _class_node_off


@overload(_class_children, jit_options=cc._PIECE_OPTIONS)
def _ov_class_children(p, f, lo, end, hi, order, sc, cls, cnt, cmiss, missing_bin, cum, miss):
    return _class_children_on if _typed_has_classes(p) else _class_children_off


@kernel(inline="always")
def _in_set(bits, code, ml, missing_bin):
    """Whether a code goes left at a categorical split with bitset ``bits (CAT_WORDS,)``."""
    if code == missing_bin:
        return ml
    return ((bits[code >> 6] >> np.uint64(code & 63)) & np.uint64(1)) != np.uint64(0)


@compiled_only
def _cat_candidates(p, f, in_scan, lo, hi, order, sc, ch, hist, hcnt, slot, n_node, missing_bin, min_rows, parent,
                    consts, fh, fcnt, keys, perm, ph, pcnt, cum, miss, lefts, rights, cand_bin, cand_dir, cand_left):
    """Split candidates of categorical feature ``f`` of one node (either mode).

    The node's per-category sums and row counts (from its histogram slot, or summed
    along the scan order) are permuted into the order of
    :mod:`forest.engine.categorical_split` (categories with rows by the criterion's
    ``bin_key``, ties by code, then the empty ones) into ``ph[f]`` / ``pcnt[f]``, whose
    candidates :func:`forest.engine.splitting.hist_candidates` gives as for any
    histogram node; ``perm[f, :b + 1]`` are then the categories of threshold ``b``.
    """
    c = ch.shape[1]
    n_codes = missing_bin + 1
    for b in range(n_codes):
        fcnt[b] = 0
        for k in range(c):
            fh[b, k] = 0.0
    if in_scan:
        for i in range(lo, hi):
            q = np.uint32(order[f, i])
            code = np.uint64(sc[f, np.uint64(i)])
            fcnt[code] += 1
            for k in range(c):
                fh[code, k] += ch[q, k]
    else:
        for b in range(n_codes):
            fcnt[b] = hcnt[slot, f, b]
            for k in range(c):
                fh[b, k] = hist[slot, f, b, k]
    npres = 0
    for b in range(missing_bin):
        if fcnt[b] > 0:
            keys[b] = cc.bin_key(p, fh, b, consts)
            # insertion into the sorted prefix: stable, so equal keys keep code order
            j = npres
            while j > 0 and keys[perm[f, j - 1]] > keys[b]:
                perm[f, j] = perm[f, j - 1]
                j -= 1
            perm[f, j] = b
            npres += 1
    j = npres
    for b in range(missing_bin):
        if fcnt[b] == 0:
            perm[f, j] = b
            j += 1
    for j in range(missing_bin):
        b = perm[f, j]
        pcnt[f, j] = fcnt[b]
        for k in range(c):
            ph[f, j, k] = fh[b, k]
    pcnt[f, missing_bin] = fcnt[missing_bin]
    for k in range(c):
        ph[f, missing_bin, k] = fh[missing_bin, k]
    return hist_candidates(p, f, ph, pcnt, True, n_node, 0, missing_bin, min_rows, parent, parent, cum, miss, lefts,
                           rights, cand_bin, cand_dir, cand_left)


@compiled_only
def _sort_scan(tc, order, sc, m):
    """Stable counting sort of positions ``0..m`` by code, per feature (``sc``: codes in that order)."""
    counts = empty(257, np.int64)
    for f in range(tc.shape[0]):
        counts[:] = 0
        for i in range(m):
            counts[np.int64(tc[f, i]) + 1] += 1
        for b in range(256):
            counts[b + 1] += counts[b]
        for i in range(m):
            code = np.uint64(tc[f, i])
            at = np.uint64(counts[code])
            order[f, at] = i
            sc[f, at] = code
            counts[code] += 1


@compiled_only
def _hist_add(hist, hcnt, tcb, chl, pos, lo, hi, sign):
    """``hist[f, code] += sign * channels`` and ``hcnt[f, code] += sign`` over positions ``pos[lo:hi]``."""
    n_features = tcb.shape[1]
    c = chl.shape[1]
    for i in range(lo, hi):
        q = np.uint64(pos[i])
        for f in range(n_features):
            code = np.uint64(tcb[q, f])
            hcnt[f, code] += sign
            for k in range(c):
                hist[f, code, k] += sign * chl[q, k]


@compiled_only
def _hist_fill(p, hist, hcnt, by_class, tcb, chl, tcls, hcls, pos, lo, hi):
    """One histogram slot ``hist (F, B, C)`` / ``hcnt (F, B)`` from positions ``pos[lo:hi]``:
    by class (:func:`_class_hist`) when the task's rows have classes, else zeroed and
    summed by :func:`_hist_add`."""
    if by_class:
        _class_hist(p, hist, hcnt, tcb, tcls, hcls, pos, lo, hi)
    else:
        hist[:] = 0.0
        hcnt[:] = 0
        _hist_add(hist, hcnt, tcb, chl, pos, lo, hi, 1)


@compiled_only
def _hist_sub(hist, hcnt, slot, s2):
    """``hist[slot] -= hist[s2]`` and ``hcnt[slot] -= hcnt[s2]`` as plain loops (the array
    expressions compiled a broadcasting kernel and its error formatting: ~3 s cold). The
    4-deep nest compiles faster than flat runs over reshaped slots (0.32-0.36 s against
    0.45-0.48 s, measured alone) or raveled views (0.54 s)."""
    for f in range(hist.shape[1]):
        for b in range(hist.shape[2]):
            hcnt[slot, f, b] -= hcnt[s2, f, b]
            for k in range(hist.shape[3]):
                hist[slot, f, b, k] -= hist[s2, f, b, k]


@kernel(inline="always")
def _scan_buffers(n_features, ms, c):
    """A scan subtree's buffers for ``ms`` rows: codes ``tc`` (F, ms), channels ``ch`` (ms, C),
    per-feature orders (F, ms) and their codes ``sc``, the side of each row, partition scratch."""
    return (empty((n_features, ms), np.uint8), empty((ms, c), np.float64), empty((n_features, ms), np.int32),
            empty((n_features, ms), np.uint8), empty(ms, np.bool_), empty(ms, np.int32), empty(ms, np.uint8))


@kernel
def _grow_trees(t_lo, t_hi, binned, is_cat, channels, rows, task_starts, tree_task_starts, task_node, task_depth,
                tree_next, tree_index, rec_offsets, rec_i, rec_f, rec_count, p, gp):
    """Grow the subtrees of trees ``t_lo..t_hi``, task after task; fills ``rec_count[t]``.

    Tree ``t``'s tasks (subtree roots) are ``tree_task_starts[t]..tree_task_starts[t+1]``,
    task ``k`` grows the node ``task_node[k]`` (at ``task_depth[k]``) from its rows
    ``rows[task_starts[k]:task_starts[k+1]]``, and the tree's splits fill the records
    from ``rec_offsets[t]`` on. The task and tree loops live in this one kernel rather
    than in small callers because Numba links a callee's whole machine code into every
    caller and LLVM optimises and compiles it again there: each extra level cost as much
    compile time as this body itself (measured, see the commit log).

    Inside a task: one depth-first loop, two candidate sources. A node of more than
    ``gp.hist_rows`` rows (histogram mode) is split from per-feature histograms of its rows
    (:func:`forest.engine.splitting.hist_candidates`; the smaller child's histogram is built
    and its sibling's is the parent's minus it) and keeps only a list of positions in
    gid order. The first node at or below it (or met when all ``gp.max_slots``
    histograms are live) enters scan mode: its rows are sorted by code per feature
    once, and it and its whole subtree are split by the exact sorted-code scan
    (:func:`_scan_candidates`), partitions keeping every feature's order. Depth-first
    order means at most one scan-mode subtree is live at a time. Both sources offer
    the same candidates in the same order; gains, the split rule
    (:func:`forest.engine.splitting.first_near_best`), records and ids are shared.
    Categorical features (``is_cat``) take their candidates from the node's per-category
    sums in either mode (:func:`_cat_candidates`) and split by category sets.
    """
    for t in range(t_lo, t_hi):
        next_id = tree_next[t]
        rec = rec_offsets[t]
        tree_idx = tree_index[t]
        for task in range(tree_task_starts[t], tree_task_starts[t + 1]):
            s = task_starts[task]
            e = task_starts[task + 1]
            root_id = task_node[task]
            root_depth = task_depth[task]
            m = e - s
            n_features = binned.shape[0]
            c = channels.shape[1]
            missing_bin = gp.missing_bin
            n_codes = missing_bin + 1
            wch = gp.weight_channel
            sch = gp.size_channel
            min_rows = gp.min_rows
            hist_rows = gp.hist_rows
            hist_task = m > hist_rows
            # Histogram mode: row-major local copies (a histogram pass reads all codes of one
            # row together), positions in gid order, histogram slots of live big nodes.
            mh = m if hist_task else 0
            tcb = empty((mh, n_features), np.uint8)
            chl = empty((mh, c), np.float64)
            for i in range(mh):
                r = np.uint32(rows[s + i])
                for k in range(c):
                    chl[i, k] = channels[r, k]
                for f in range(n_features):
                    tcb[i, f] = binned[f, r]
            pos = arange(mh)
            pscratch = empty(mh, np.int64)
            n_hslots = min(m // max(hist_rows, 1) + 1, gp.max_slots) if hist_task else 0
            hist = zeros((n_hslots, n_features, n_codes, c), np.float64)
            hcnt = zeros((n_hslots, n_features, n_codes), np.int64)
            free = empty(n_hslots, np.int64)
            n_free = n_hslots
            for j in range(n_hslots):
                free[j] = n_hslots - 1 - j
            # Scan mode: codes (F, ms) and channels (ms, C) of the scan subtree's rows by
            # position, per-feature orders; (re)allocated when a scan subtree starts.
            ms = 0 if hist_task else m
            tc, ch, order, sc, goes_left, scratch, scratch_c = _scan_buffers(n_features, ms, c)
            # Row classes by scan position (criteria with row classes only; _scan_classes).
            n_row_classes = cc.n_row_classes(p, m)
            cls = empty(m if n_row_classes > 0 else 0, np.int32)
            cnt = empty(n_row_classes, np.int64)
            cmiss = empty(n_row_classes, np.int64)
            tot = empty(n_row_classes, np.int64)
            use_cls = False
            # Histogram mode by class: the task's rows' classes and per-class bin counts.
            tcls = empty(mh if n_row_classes > 0 else 0, np.int32)
            hcls = empty((n_features if n_row_classes > 0 and hist_task else 0, n_codes, n_row_classes), np.int32)
            hist_cls = n_row_classes > 0 and hist_task and _scan_classes(p, chl, mh, tcls)
            # Stack of nodes still to split: segment [lo, hi) of pos (histogram mode) or of
            # the scan orders (scan mode), node, depth, sums, histogram slot (-1: none).
            st_lo = empty(m + 1, np.int64)
            st_hi = empty(m + 1, np.int64)
            st_node = empty(m + 1, np.int64)
            st_depth = empty(m + 1, np.int64)
            st_slot = empty(m + 1, np.int64)
            st_scan = empty(m + 1, np.bool_)
            st_stats = empty((m + 1, c), np.float64)
            st_lo[0] = 0
            st_hi[0] = m
            st_node[0] = root_id
            st_depth[0] = root_depth
            st_slot[0] = -1
            st_scan[0] = False
            sp = 1
            if hist_task:
                # The root's sums over its rows in order (a scan-mode root sums when it starts).
                for k in range(c):
                    acc = 0.0
                    for i in range(m):
                        acc += chl[i, k]
                    st_stats[0, k] = acc
                if not (st_stats[0, sch] >= gp.min_split and root_depth < gp.max_depth):
                    sp = 0
            # At most two candidates per distinct code plus the missing-alone one: bounded by
            # the bin count as well as by the rows (root tasks of big trees stay small here).
            n_cand_slots = min(2 * m + 2, 2 * n_codes + 2)
            cand_gain = empty((n_features, n_cand_slots), np.float64)
            cand_bin = empty((n_features, n_cand_slots), np.int64)
            cand_dir = empty((n_features, n_cand_slots), np.int64)
            cand_end = empty((n_features, n_cand_slots), np.int64)
            cst = empty((4, n_cand_slots if n_row_classes > 0 else 0), np.float64)
            n_cat = 0
            for f in range(n_features):
                if is_cat[f]:
                    n_cat += 1
            cat_f = n_features if n_cat > 0 else 0
            cat_b = n_codes if n_cat > 0 else 0
            ph = zeros((cat_f, cat_b, c), np.float64)
            pcnt = zeros((cat_f, cat_b), np.int64)
            fh = empty((cat_b, c), np.float64)
            fcnt = empty(cat_b, np.int64)
            keys = empty(cat_b, np.float64)
            perm = empty((cat_f, cat_b), np.int64)
            bits = zeros(CAT_WORDS, np.uint64)
            cand_left = empty((n_features, n_cand_slots if hist_task or n_cat > 0 else 0, c), np.float64)
            n_cand = zeros(n_features, np.int64)
            allowed = empty(n_features, np.bool_)
            parent = empty(c, np.float64)
            consts = zeros(gp.n_consts, np.float64)
            cum = empty(c, np.float64)
            miss = empty(c, np.float64)
            left = empty(c, np.float64)
            right = empty(c, np.float64)
            lefts = empty((n_cand_slots, c), np.float64)
            rights = empty((n_cand_slots, c), np.float64)
            while sp > 0:
                sp -= 1
                lo = st_lo[sp]
                hi = st_hi[sp]
                node = st_node[sp]
                depth = st_depth[sp]
                slot = st_slot[sp]
                in_scan = st_scan[sp]
                n_node = hi - lo
                if not in_scan and slot < 0 and (n_node <= hist_rows or n_free == 0):
                    # Small node (or no histogram memory left): its subtree takes the scan.
                    if n_node > ms:
                        ms = n_node
                        tc, ch, order, sc, goes_left, scratch, scratch_c = _scan_buffers(n_features, ms, c)
                    if hist_task:
                        for i in range(n_node):
                            q = np.uint64(pos[lo + i])
                            for k in range(c):
                                ch[i, k] = chl[q, k]
                            for f in range(n_features):
                                tc[f, i] = tcb[q, f]
                    else:  # the task's root: its rows straight from the arguments
                        for i in range(n_node):
                            r = np.uint32(rows[s + i])
                            for k in range(c):
                                ch[i, k] = channels[r, k]
                        for f in range(n_features):
                            for i in range(n_node):
                                tc[f, i] = binned[f, np.uint32(rows[s + i])]
                    _sort_scan(tc, order, sc, n_node)
                    use_cls = n_row_classes > 0 and _scan_classes(p, ch, n_node, cls)
                    lo = 0
                    hi = n_node
                    in_scan = True
                    # The subtree's sums over its rows in order (a histogram node's come from
                    # bins), as for a task's root; the split that made the node tested the latter.
                    for k in range(c):
                        acc = 0.0
                        for i in range(n_node):
                            acc += ch[i, k]
                        st_stats[sp, k] = acc
                    if not (st_stats[sp, sch] >= gp.min_split and depth < gp.max_depth):
                        continue
                if not in_scan and slot < 0:
                    n_free -= 1
                    slot = free[n_free]
                    _hist_fill(p, hist[slot], hcnt[slot], hist_cls, tcb, chl, tcls, hcls, pos, lo, hi)
                for k in range(c):
                    parent[k] = st_stats[sp, k]
                cc.prepare(p, parent, consts)
                node_mask(gp.key1, gp.key2, tree_idx, node, n_features, gp.mtry, allowed)
                best = -np.inf
                if in_scan and use_cls:
                    best = _class_node(p, allowed, is_cat, lo, hi, order, sc, cls, cnt, cmiss, tot, min_rows,
                                       missing_bin, cst, consts, cand_gain, cand_bin, cand_dir, cand_end, n_cand)
                for f in range(n_features):
                    if in_scan and use_cls and allowed[f] and not is_cat[f]:
                        continue     # scored by _class_node
                    n_cand[f] = 0
                    if not allowed[f]:
                        continue
                    if is_cat[f]:
                        nc = _cat_candidates(p, f, in_scan, lo, hi, order, sc, ch, hist, hcnt, slot, n_node,
                                             missing_bin, min_rows, parent, consts, fh, fcnt, keys, perm, ph, pcnt,
                                             cum, miss, lefts, rights, cand_bin, cand_dir, cand_left)
                    elif in_scan:
                        nc = _scan_candidates(p, f, lo, hi, order, sc, ch, parent, min_rows, missing_bin, cum, miss,
                                              lefts, rights, cand_bin, cand_dir, cand_end)
                    else:
                        nc = hist_candidates(p, f, hist[slot], hcnt[slot], True, n_node, 0, missing_bin, min_rows,
                                             parent, parent, cum, miss, lefts, rights, cand_bin, cand_dir, cand_left)
                    n_cand[f] = nc
                    if nc > 0:
                        # Gains batched per (node, feature): computing each inside the scan
                        # loop was measured 1.8x slower (the scan loop no longer optimises well).
                        cc.gains(p, lefts, rights, consts, cand_gain, f, nc)
                        best_f = largest_gain(cand_gain[f], nc)
                        if best_f > best:
                            best = best_f
                if not admissible_jit(best, gp.min_gain):
                    if not in_scan:
                        n_free += 1
                        free[n_free - 1] = slot
                    continue
                bf, bj = first_near_best(cand_gain, n_cand, best, gp.rel_tol)
                b = cand_bin[bf, bj]
                d = cand_dir[bf, bj]
                split_cat = is_cat[bf]
                if split_cat:
                    for w in range(CAT_WORDS):
                        bits[w] = 0
                    for j in range(b + 1):
                        code = perm[bf, j]
                        bits[code >> 6] |= np.uint64(1) << np.uint64(code & 63)
                    for k in range(c):
                        left[k] = cand_left[bf, bj, k]
                        right[k] = parent[k] - left[k]
                    no_missing = pcnt[bf, missing_bin] == 0 or ph[bf, missing_bin, wch] == 0.0
                elif in_scan:
                    if use_cls:
                        _class_children(p, bf, lo, cand_end[bf, bj], hi, order, sc, cls, cnt, cmiss, missing_bin, cum,
                                        miss)
                    else:
                        # The chosen children's sums, recomputed in the scan's order (same bits).
                        for k in range(c):
                            cum[k] = 0.0
                            miss[k] = 0.0
                        for i in range(lo, cand_end[bf, bj] + 1):
                            q = np.uint32(order[bf, i])
                            for k in range(c):
                                cum[k] += ch[q, k]
                        for i in range(lo, hi):
                            q = np.uint32(order[bf, i])
                            if np.int64(sc[bf, np.uint64(i)]) == missing_bin:
                                for k in range(c):
                                    miss[k] += ch[q, k]
                    for k in range(c):
                        left[k] = cum[k] + miss[k] if d == 1 else cum[k]
                        right[k] = parent[k] - left[k]
                    no_missing = miss[wch] == 0.0
                else:
                    for k in range(c):
                        left[k] = cand_left[bf, bj, k]
                        right[k] = parent[k] - left[k]
                    # Row counts, not the subtracted sums, say whether the node has missing
                    # rows (parent minus child leaves rounding residue where the rows are gone).
                    no_missing = hcnt[slot, bf, missing_bin] == 0 or hist[slot, bf, missing_bin, wch] == 0.0
                ml = d == 1
                if no_missing:
                    # no missing weight in this node for the chosen feature: NaN goes to the heavier child
                    ml = left[wch] >= right[wch]
                if in_scan:
                    for i in range(lo, hi):
                        q = np.uint32(order[bf, np.uint64(i)])
                        if split_cat:
                            goes_left[q] = _in_set(bits, np.int64(tc[bf, q]), ml, missing_bin)
                        else:
                            goes_left[q] = goes_left_code(np.int64(tc[bf, q]), b, ml, missing_bin)
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
                            ui = np.uint64(i)
                            q = order[f, ui]
                            code = sc[f, ui]
                            gl = np.int64(goes_left[np.uint32(q)])
                            order[f, np.uint64(lo + nl)] = q
                            sc[f, np.uint64(lo + nl)] = code
                            scratch[np.uint64(nr)] = q
                            scratch_c[np.uint64(nr)] = code
                            nl += gl
                            nr += 1 - gl
                        for j in range(nr):
                            order[f, np.uint64(lo + nl + j)] = scratch[j]
                            sc[f, np.uint64(lo + nl + j)] = scratch_c[j]
                        n_left = nl
                else:
                    # Stable partition of the node's positions (gid order kept on both sides).
                    nl = 0
                    nr = 0
                    for i in range(lo, hi):
                        q = pos[np.uint64(i)]
                        code = np.int64(tcb[np.uint64(q), bf])
                        if _in_set(bits, code, ml, missing_bin) if split_cat else goes_left_code(code, b, ml,
                                                                                                 missing_bin):
                            pos[lo + nl] = q
                            nl += 1
                        else:
                            pscratch[nr] = q
                            nr += 1
                    for j in range(nr):
                        pos[lo + nl + j] = pscratch[j]
                    n_left = nl
                mid = lo + n_left
                lid = next_id
                next_id += 2
                rec_i[rec, REC_NODE] = node
                rec_i[rec, REC_LEFT] = lid
                rec_i[rec, REC_DEPTH] = depth + 1
                rec_i[rec, REC_FEATURE] = bf
                rec_i[rec, REC_BIN] = CATEGORICAL_SPLIT if split_cat else b
                rec_i[rec, REC_MISSING_LEFT] = 1 if ml else 0
                for w in range(CAT_WORDS):
                    word = bits[w] if split_cat else np.uint64(0)
                    rec_i[rec, REC_BITS + 2 * w] = np.int64(word & np.uint64(0xFFFFFFFF))
                    rec_i[rec, REC_BITS + 2 * w + 1] = np.int64(word >> np.uint64(32))
                rec_f[rec, 0] = best
                for k in range(c):
                    rec_f[rec, 1 + k] = left[k]
                    rec_f[rec, 1 + c + k] = right[k]
                rec += 1
                can_l = left[sch] >= gp.min_split and depth + 1 < gp.max_depth
                can_r = right[sch] >= gp.min_split and depth + 1 < gp.max_depth
                slot_l = -1
                slot_r = -1
                if not in_scan:
                    big_l = can_l and mid - lo > hist_rows
                    big_r = can_r and hi - mid > hist_rows
                    if (big_l or big_r) and n_free > 0:
                        # Build the child with fewer rows; the parent's slot becomes its sibling.
                        n_free -= 1
                        s2 = free[n_free]
                        b_lo, b_hi = (lo, mid) if mid - lo <= hi - mid else (mid, hi)
                        _hist_fill(p, hist[s2], hcnt[s2], hist_cls, tcb, chl, tcls, hcls, pos, b_lo, b_hi)
                        if mid - lo <= hi - mid:
                            slot_l = s2
                            slot_r = slot
                        else:
                            slot_l = slot
                            slot_r = s2
                        _hist_sub(hist, hcnt, slot, s2)
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
                    st_scan[sp] = in_scan
                    for k in range(c):
                        st_stats[sp, k] = right[k]
                    sp += 1
                if can_l:
                    st_lo[sp] = lo
                    st_hi[sp] = mid
                    st_node[sp] = lid
                    st_depth[sp] = depth + 1
                    st_slot[sp] = slot_l
                    st_scan[sp] = in_scan
                    for k in range(c):
                        st_stats[sp, k] = left[k]
                    sp += 1
        rec_count[t] = rec - rec_offsets[t]


@kernel(parallel=True)
def _grow_trees_parallel(binned, is_cat, channels, rows, task_starts, tree_task_starts, task_node, task_depth,
                         tree_next, tree_index, rec_offsets, rec_i, rec_f, rec_count, p, gp):
    # Each tree writes only its own record slice and count: no races.
    for t in numba.prange(tree_next.shape[0]):
        _grow_trees(t, t + 1, binned, is_cat, channels, rows, task_starts, tree_task_starts, task_node, task_depth,
                    tree_next, tree_index, rec_offsets, rec_i, rec_f, rec_count, p, gp)


@kernel(parallel=True)
def _grow_trees_parallel_paired(binned, is_cat, channels, rows, task_starts, tree_task_starts, task_node, task_depth,
                                tree_next, tree_index, rec_offsets, rec_i, rec_f, rec_count, which, first, second,
                                gp):
    # _grow_trees_parallel for a PairedRecord: Numba's parallel loops take flat records
    # but not a record of records, so the pair travels as its parts and is rebuilt
    # inside the loop body.
    for t in numba.prange(tree_next.shape[0]):
        _grow_trees(t, t + 1, binned, is_cat, channels, rows, task_starts, tree_task_starts, task_node, task_depth,
                    tree_next, tree_index, rec_offsets, rec_i, rec_f, rec_count, cc.PairedRecord(which, first, second),
                    gp)


class SubtreeRecords:
    """Splits made by :func:`grow_subtrees`, grouped by tree, in id order.

    Attributes
    ----------
    ints : ndarray of int64, shape (n_splits, N_INT_FIELDS)
        Columns ``REC_NODE`` (split node id), ``REC_LEFT`` (left child id; the right
        child is ``left + 1``), ``REC_DEPTH`` (children's depth), ``REC_FEATURE``,
        ``REC_BIN`` (``CATEGORICAL_SPLIT`` for a category set), ``REC_MISSING_LEFT``,
        then the category set's bits from ``REC_BITS`` (:meth:`cat_bits`).
    floats : ndarray of float64, shape (n_splits, 1 + 2 C)
        Gain, then the left child's channel sums, then the right child's.
    tree_starts : ndarray of int64, shape (n_trees + 1,)
        Tree ``t``'s splits are rows ``tree_starts[t]:tree_starts[t+1]``.
    """

    def __init__(self, ints, floats, tree_starts):
        self.ints = ints
        self.floats = floats
        self.tree_starts = tree_starts

    def cat_bits(self):
        """ndarray of uint64, shape (n_splits, CAT_WORDS): the splits' category sets."""
        return halves_to_bits(self.ints[:, REC_BITS:REC_BITS + 2 * CAT_WORDS])


def _as_row_bound(x):
    """An int64 row bound from an int or float (``inf``: no bound)."""
    return int(np.iinfo(np.int64).max) if not np.isfinite(x) else max(int(x), 0)


def grow_subtrees(binned, channels, rows, task_starts, task_tree, task_node, task_depth, tree_next, tree_index,
                  compiled, missing_bin, *, min_samples_split=2.0, max_depth=None, min_gain=0.0, rel_tol=1e-12,
                  mtry=None, seed=0, hist_rows=None, max_hist_slots=None, categorical=None):
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
    compiled : forest.criteria.compiled.CompiledCriterion
        The criterion's compiled pieces (``criterion.compiled()``).
    missing_bin : int
    min_samples_split, max_depth, min_gain, rel_tol, mtry, seed
        As in :class:`forest.engine.growth_options.TreeParams`; ``rel_tol``: :data:`forest.engine.splitting.REL_TOL`.
    hist_rows : float or None
        Nodes of more rows than this split from histograms (see :func:`_grow_task`);
        ``None`` means ``EngineOptions.hist_rows`` of the current engine settings.
    max_hist_slots : int or None
        Histograms a task may hold at once (``None``: ``EngineOptions.max_hist_slots``);
        a big node met with all of them live is split by the sorted-code scan instead
        (the same split; tests lower this to reach that path).
    categorical : array-like of bool, shape (n_features,), optional
        Features split by category sets (:mod:`forest.engine.categorical_split`).

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
    rows_per_tree //= compiled.min_child_rows
    rec_offsets = np.zeros(n_trees + 1, dtype=np.int64)
    np.cumsum(rows_per_tree, out=rec_offsets[1:])
    total = int(rec_offsets[-1])
    rec_i = np.empty((total, N_INT_FIELDS), dtype=np.int64)
    rec_f = np.empty((total, 1 + 2 * c))
    rec_count = np.zeros(n_trees, dtype=np.int64)
    key1, key2 = mtry_keys(seed)
    engine = current_engine_options()
    gp = GrowthRecord(int(missing_bin), compiled.min_child_rows, compiled.weight_channel, compiled.size_channel,
                      compiled.n_consts,
                      float(min_samples_split), np.iinfo(np.int64).max if max_depth is None else int(max_depth),
                      float(min_gain), float(rel_tol), 0 if mtry is None else int(mtry), key1, key2,
                      _as_row_bound(engine.hist_rows if hist_rows is None else hist_rows),
                      max(1, int(engine.max_hist_slots if max_hist_slots is None else max_hist_slots)))
    is_cat = np.zeros(binned.shape[0], dtype=np.bool_) if categorical is None \
        else np.ascontiguousarray(categorical, dtype=np.bool_)
    arrays = (binned, is_cat, channels, rows, task_starts, tree_task_starts,
              np.ascontiguousarray(task_node, dtype=np.int64),
              np.ascontiguousarray(task_depth, dtype=np.int64), tree_next,
              np.ascontiguousarray(tree_index, dtype=np.int64), rec_offsets, rec_i, rec_f, rec_count)
    record = cc.kernel_record(compiled)
    if n_tasks:
        if len(rows) < _SERIAL_ROWS or n_trees == 1 or numba.get_num_threads() == 1:
            cc.call_kernel(_grow_trees, 0, n_trees, *arrays, record, gp)
        elif isinstance(record, cc.PairedRecord):
            cc.call_kernel(_grow_trees_parallel_paired, *arrays, *record, gp)
        else:
            cc.call_kernel(_grow_trees_parallel, *arrays, record, gp)
    keep = np.concatenate([np.arange(rec_offsets[t], rec_offsets[t] + rec_count[t]) for t in range(n_trees)]) \
        if n_trees else np.zeros(0, dtype=np.int64)
    starts = np.zeros(n_trees + 1, dtype=np.int64)
    np.cumsum(rec_count, out=starts[1:])
    return SubtreeRecords(rec_i[keep], rec_f[keep], starts)


# ---------------------------------------------------------------------- reference
def grow_subtrees_reference(binned, channels, rows, task_starts, task_tree, task_node, task_depth, tree_next,
                            tree_index, criterion, n_bins_non_missing, missing_bin, *, min_samples_split=2.0,
                            max_depth=None, min_gain=0.0, rel_tol=1e-12, mtry=None, seed=0, categorical=None):
    """Slow reference of :func:`grow_subtrees`: per node, a dense per-bin table and the
    vectorised criterion over *every* histogram threshold (no candidate pruning), with
    the tie rule of :func:`forest.engine.splitting.find_best_splits_reference`.

    Same parameters (``criterion`` instead of its compiled pieces, plus
    ``n_bins_non_missing (n_features,)``) and result, except that sums come from
    per-bin tables, so channel sums may differ in the last bits. A categorical feature's
    categories present in the node are ordered by ``criterion.category_keys`` (ties by
    code) and every prefix of that order is a candidate set.
    """
    c = channels.shape[1]
    n_features = binned.shape[0]
    categorical = np.zeros(n_features, bool) if categorical is None else np.asarray(categorical, dtype=bool)
    nb = np.asarray(n_bins_non_missing, dtype=np.int64)
    wch = criterion.compiled().weight_channel
    sch = criterion.compiled().size_channel
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
            if not (root_stats[sch] >= min_samples_split and task_depth[task] < max_depth):
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
                    order = None
                    if categorical[f]:
                        keys = criterion.category_keys(table[None, None, :missing_bin], pstats[None])[0, 0]
                        present = np.unique(codes[codes != missing_bin])
                        order = np.array(sorted(present.tolist(), key=lambda q: (keys[q], q)), dtype=np.int64)
                    for b in range(int(nb[f])):
                        for d in (0, 1):
                            if d == 1 and b == nb[f] - 1:
                                continue
                            if order is None:
                                left_rows = goes_left_codes(codes, b, d == 1, missing_bin)
                            else:
                                left_rows = goes_left_set(codes, order[:b + 1], d == 1, missing_bin)
                            if left_rows.all() or not left_rows.any():
                                continue
                            left = channels[seg[left_rows]].sum(axis=0)
                            right = pstats - left
                            g = float(criterion.gain(left, right, pstats))
                            cands.append((g, f, b, d, left, right, left_rows, miss, order))
                if not cands:
                    continue
                best = max(x[0] for x in cands)
                if not (np.isfinite(best) and best > min_gain):
                    continue
                for g, f, b, d, left, right, left_rows, miss, order in cands:
                    if g >= best - rel_tol * abs(best):
                        break
                ml = bool(d)
                if miss[wch] == 0:
                    ml = bool(left[wch] >= right[wch])
                    codes = binned[f, seg].astype(np.int64)
                    left_rows = goes_left_codes(codes, b, ml, missing_bin) if order is None \
                        else goes_left_set(codes, order[:b + 1], ml, missing_bin)
                lid = next_id
                next_id += 2
                halves = np.zeros(2 * CAT_WORDS, dtype=np.int64)
                if order is not None:
                    word = cat_bitset(order[:b + 1])
                    halves[0::2] = (word & np.uint64(0xFFFFFFFF)).astype(np.int64)
                    halves[1::2] = (word >> np.uint64(32)).astype(np.int64)
                ints[t].append([node, lid, depth + 1, f, CATEGORICAL_SPLIT if order is not None else b, int(ml)]
                               + halves.tolist())
                floats[t].append(np.concatenate([[best], left, right]))
                for child_rows, cid, st in ((seg[~left_rows], lid + 1, right), (seg[left_rows], lid, left)):
                    if st[sch] >= min_samples_split and depth + 1 < max_depth:
                        stack.append((child_rows, cid, depth + 1, st))
    starts = np.zeros(n_trees + 1, dtype=np.int64)
    np.cumsum([len(x) for x in ints], out=starts[1:])
    all_i = np.array([r for x in ints for r in x], dtype=np.int64).reshape(-1, N_INT_FIELDS)
    all_f = np.array([r for x in floats for r in x], dtype=np.float64).reshape(-1, 1 + 2 * c)
    return SubtreeRecords(all_i, all_f, starts)

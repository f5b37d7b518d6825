"""Exact policy-tree search kernels over binned reward tables, with NumPy references.

This module owns the arithmetic of the exact depth-k policy search: given cumulative
reward tables over the bins of one, two or three *search features*, it finds for every
candidate subtree root the best subtree below it. It knows nothing about ranks or
estimators (:mod:`forest.policy.exact` builds and exchanges the tables).

Vocabulary
----------
* Channels: ``C = A + 1`` per row: the fixed-point rewards of the ``A`` actions
  (integer-valued float64, :func:`forest.policy.exact.fixed_point`) and a count of 1.
  Every sum of them is an exact integer, so every comparison below is exact and its
  result does not depend on summation order (or on how many ranks added the rows).
* Search feature ``s``: a column of codes in ``[0, nb)``; a split at *position* ``b``
  sends codes ``<= b`` left. ``lo[s] <= b < hi[s]`` are its candidate positions.
* ``m(Q) = max_a Q[a]`` when the cell ``Q`` holds at least ``min_rows`` rows, else
  ``-inf`` (a leaf that is too small). The value of a tree is the sum of ``m`` over its
  leaves; the action of a leaf is the first ``a`` reaching ``m``. The root alone is
  the exception: it is a leaf of any size (``min_rows`` limits what splits create),
  so a search always finds a tree.
* A *record* is ``(value, feature, position)``: the best subtree of some cell and the
  split at its top (``feature = -1``: the cell stays a leaf). Records compare by
  value, then by the smaller ``(feature, position)``, so a leaf wins a tie against
  any split and ties between splits go to the lowest feature, then the lowest
  position. This is a strict total order, so the result is the same whichever order
  candidates are visited in (by threads, by blocks or by ranks).

Depth 2 (:func:`pair_block_search`): for search features ``s1 <= s2`` the table
``J[b1, b2] = sum over rows with code_s1 <= b1 and code_s2 <= b2`` gives the four
quadrants of a pair of splits by inclusion-exclusion; the last index ``nb - 1`` of an
axis is the whole axis, so ``J[b1, nb-1]`` and ``J[nb-1, b2]`` are the one-feature
cumulative sums. One table serves both orientations (root on ``s1`` with a child on
``s2``, and root on ``s2`` with a child on ``s1``). The output is, per half-space
``(side, s, b)`` (``side`` 0: codes ``<= b``), the record of its best depth-1 subtree.

Depth 3 (:func:`triple_block_search`): with ``s1 <= s2 <= s3`` the 3-D table gives the
eight octants of three splits; each of the six orientations (which feature is the
root, the child, the grandchild) updates, per quadrant ``(r, c, br, bc, side_r,
side_c)``, the record of its best depth-1 subtree.

The upper levels (:func:`best_depth1_of_halves_from_quadrants`, :func:`best_root`) are
small maxima done in NumPy.
"""
import numba
import numpy as np
from numba import prange

from histogram.jit import kernel, compiled_only, empty

NEG_INF = -np.inf
#: Key of "no record yet": larger than every real (feature, position).
NO_KEY = np.iinfo(np.int32).max


# ---------------------------------------------------------------------------- helpers

@kernel(inline="always")
def _better(v, f, b, cur_v, cur_f, cur_b):
    """Record (v, f, b) beats (cur_v, cur_f, cur_b): higher value, then smaller keys."""
    if v > cur_v:
        return True
    if v < cur_v or v == NEG_INF:
        return False
    return f < cur_f or (f == cur_f and b < cur_b)


def new_records(shape):
    """Empty records of the given shape: values ``-inf``, keys :data:`NO_KEY`.

    Returns
    -------
    value : ndarray of float64
    feature, position : ndarray of int32
    """
    return (np.full(shape, NEG_INF), np.full(shape, NO_KEY, dtype=np.int32),
            np.full(shape, NO_KEY, dtype=np.int32))


def leaf_value(sums, n_actions, min_rows):
    """``m`` of cells: best action's reward sum, ``-inf`` where a cell is too small.

    Parameters
    ----------
    sums : ndarray, shape (..., n_actions + 1)
        Channel sums of cells (the last channel counts rows).
    n_actions : int
    min_rows : int

    Returns
    -------
    ndarray of float64, shape (...)
    """
    sums = np.asarray(sums, dtype=np.float64)
    best = sums[..., :n_actions].max(axis=-1)
    return np.where(sums[..., n_actions] >= min_rows, best, NEG_INF)


def cumulate(table, axes):
    """NumPy reference of :func:`cumulate_block`: cumulative sums along each of ``axes``."""
    out = np.asarray(table, dtype=np.float64)
    for ax in axes:
        out = np.cumsum(out, axis=ax)
    return out


@kernel
def _cumulate_range(T, j0, j1):
    """Cumulative sums over the bin axes of features ``j0:j1`` of a (nb, m, nb, C) or
    (nb, nb, m, nb, C) block (4-D blocks arrive as 5-D with a leading axis of 1)."""
    n0, n1, _, nb, C = T.shape
    for j in range(j0, j1):
        for b0 in range(n0):
            for b1 in range(n1):
                for b3 in range(1, nb):
                    for c in range(C):
                        T[b0, b1, j, b3, c] += T[b0, b1, j, b3 - 1, c]
        for b0 in range(n0):
            for b1 in range(1, n1):
                for b3 in range(nb):
                    for c in range(C):
                        T[b0, b1, j, b3, c] += T[b0, b1 - 1, j, b3, c]
        for b0 in range(1, n0):
            for b1 in range(n1):
                for b3 in range(nb):
                    for c in range(C):
                        T[b0, b1, j, b3, c] += T[b0 - 1, b1, j, b3, c]


@kernel(parallel=True)
def _cumulate_chunks(T, n_chunks):
    m = T.shape[2]
    for k in prange(n_chunks):
        _cumulate_range(T, k * m // n_chunks, (k + 1) * m // n_chunks)


#: Parallel kernels run serially below this much work (cells x channels): on a busy
#: machine waking the thread pool costs milliseconds, far more than a small block.
PARALLEL_MIN_WORK = 1 << 20


def _run(serial, parallel, n_items, work, *args):
    """``serial(*args, 0, n_items)``, or the chunked ``parallel`` driver when it pays."""
    threads = numba.get_num_threads()
    if threads == 1 or n_items < 2 or work < PARALLEL_MIN_WORK:
        serial(*args, 0, n_items)
    else:
        parallel(*args, min(n_items, 4 * threads))


def cumulate_block(table):
    """Make a block table cumulative over its bin axes, in place.

    Parameters
    ----------
    table : ndarray of float64, C-contiguous
        ``(nb, m, nb, C)`` (pairs) or ``(nb, nb, m, nb, C)`` (triples); the feature
        axis ``m`` is not summed.

    Returns
    -------
    ndarray
        ``table`` itself.
    """
    T = table[None] if table.ndim == 4 else table
    _run(_cumulate_range, _cumulate_chunks, T.shape[2], T.size, T)
    return table


def half_leaf_records(cum1, total, lo, hi, n_actions, min_rows):
    """Records of every half-space left as a leaf (the start of every search).

    Parameters
    ----------
    cum1 : ndarray, shape (S, nb, C)
        One-feature cumulative sums: ``cum1[s, b]`` sums the rows with code ``<= b``.
    total : ndarray, shape (C,)
    lo, hi : ndarray of int, shape (S,)
        Candidate positions ``lo[s] <= b < hi[s]``.
    n_actions, min_rows : int

    Returns
    -------
    value, feature, position : ndarray, shape (2, S, nb)
        Side 0 is ``code <= b``, side 1 ``code > b``; positions outside ``[lo, hi)``
        stay empty (``-inf``).
    """
    S, nb, _ = cum1.shape
    value, feature, position = new_records((2, S, nb))
    left = leaf_value(cum1, n_actions, min_rows)
    right = leaf_value(total[None, None, :] - cum1, n_actions, min_rows)
    for s in range(S):
        sl = slice(int(lo[s]), int(hi[s]))
        value[0, s, sl], value[1, s, sl] = left[s, sl], right[s, sl]
        feature[:, s, sl] = -1
        position[:, s, sl] = -1
    return value, feature, position


def best_root(half_value, lo, hi, root_leaf):
    """The best root split from the records of both halves of every split.

    Parameters
    ----------
    half_value : ndarray, shape (2, S, nb)
        Best subtree value of side 0 / side 1 of each candidate split.
    lo, hi : ndarray of int, shape (S,)
    root_leaf : float
        Value of the whole population as one leaf.

    Returns
    -------
    value : float
    feature, position : int
        ``-1, -1`` when no split beats the single leaf (ties go to the leaf, then to
        the lowest feature and position).
    """
    total = half_value[0] + half_value[1]
    S, nb = total.shape
    valid = np.zeros((S, nb), dtype=bool)
    for s in range(S):
        valid[s, int(lo[s]):int(hi[s])] = True
    total = np.where(valid, total, NEG_INF)
    flat = int(np.argmax(total))  # first maximum: lowest feature, then lowest position
    value = float(total.flat[flat])
    if not value > root_leaf:
        return float(root_leaf), -1, -1
    return value, flat // nb, flat % nb


# ---------------------------------------------------------------------------- depth 2

@kernel(inline="always")
def _quadrant_maxima(J, c1, c2, total, n_actions, min_rows, out):
    """``out[q] = m(Q_q)`` for the four quadrants of a pair of splits.

    ``J`` sums codes (<= b1, <= b2); ``c1`` / ``c2`` are the cumulative sums of each
    feature alone. Quadrants: 0 (<=, <=), 1 (<=, >), 2 (>, <=), 3 (>, >).
    """
    A = n_actions
    n0 = J[A]
    n1 = c1[A] - J[A]
    n2 = c2[A] - J[A]
    n3 = total[A] - c1[A] - c2[A] + J[A]
    m0 = NEG_INF
    m1 = NEG_INF
    m2 = NEG_INF
    m3 = NEG_INF
    for a in range(A):
        q0 = J[a]
        q1 = c1[a] - q0
        q2 = c2[a] - q0
        q3 = total[a] - c1[a] - c2[a] + q0
        if q0 > m0:
            m0 = q0
        if q1 > m1:
            m1 = q1
        if q2 > m2:
            m2 = q2
        if q3 > m3:
            m3 = q3
    out[0] = m0 if n0 >= min_rows else NEG_INF
    out[1] = m1 if n1 >= min_rows else NEG_INF
    out[2] = m2 if n2 >= min_rows else NEG_INF
    out[3] = m3 if n3 >= min_rows else NEG_INF


@kernel
def _pair_range(Jc, s1, s2_lo, lo, hi, total, n_actions, min_rows, best_v, best_f, best_b, loc_v, loc_b, j0, j1):
    """:func:`pair_block_search` for block features ``j0:j1``."""
    nb = Jc.shape[0]
    q = empty(4, np.float64)
    for j in range(j0, j1):
        s2 = s2_lo + j
        for b1 in range(lo[s1], hi[s1]):
            c1 = Jc[b1, j, nb - 1]
            for b2 in range(lo[s2], hi[s2]):
                _quadrant_maxima(Jc[b1, j, b2], c1, Jc[nb - 1, j, b2], total, n_actions, min_rows, q)
                v = q[0] + q[1]  # half (<= b1) of s1 split on s2
                if v > loc_v[j, 0, b1]:
                    loc_v[j, 0, b1] = v
                    loc_b[j, 0, b1] = b2
                v = q[2] + q[3]  # half (> b1) of s1
                if v > loc_v[j, 1, b1]:
                    loc_v[j, 1, b1] = v
                    loc_b[j, 1, b1] = b2
                if s2 == s1:
                    continue  # the other orientation is this one again
                v = q[0] + q[2]  # half (<= b2) of s2 split on s1
                if _better(v, s1, b1, best_v[0, s2, b2], best_f[0, s2, b2], best_b[0, s2, b2]):
                    best_v[0, s2, b2] = v
                    best_f[0, s2, b2] = s1
                    best_b[0, s2, b2] = b1
                v = q[1] + q[3]  # half (> b2) of s2
                if _better(v, s1, b1, best_v[1, s2, b2], best_f[1, s2, b2], best_b[1, s2, b2]):
                    best_v[1, s2, b2] = v
                    best_f[1, s2, b2] = s1
                    best_b[1, s2, b2] = b1


@kernel(parallel=True)
def _pair_chunks(Jc, s1, s2_lo, lo, hi, total, n_actions, min_rows, best_v, best_f, best_b, loc_v, loc_b,
                 n_chunks):
    m = Jc.shape[1]
    for k in prange(n_chunks):
        _pair_range(Jc, s1, s2_lo, lo, hi, total, n_actions, min_rows, best_v, best_f, best_b, loc_v, loc_b,
                    k * m // n_chunks, (k + 1) * m // n_chunks)


@kernel
def _pair_merge(s1, s2_lo, lo, hi, best_v, best_f, best_b, loc_v, loc_b):
    for j in range(loc_v.shape[0]):
        for side in range(2):
            for b1 in range(lo[s1], hi[s1]):
                v = loc_v[j, side, b1]
                if _better(v, s2_lo + j, loc_b[j, side, b1], best_v[side, s1, b1], best_f[side, s1, b1],
                           best_b[side, s1, b1]):
                    best_v[side, s1, b1] = v
                    best_f[side, s1, b1] = s2_lo + j
                    best_b[side, s1, b1] = loc_b[j, side, b1]


def pair_block_search(Jc, s1, s2_lo, lo, hi, total, n_actions, min_rows, best_v, best_f, best_b):
    """Update half-space records with every depth-1 subtree on features ``s1``/``s2``.

    Parameters
    ----------
    Jc : ndarray of float64, shape (nb, m, nb, C)
        ``Jc[b1, j, b2]``: sums over rows with ``code_s1 <= b1`` and
        ``code_{s2_lo + j} <= b2`` (cumulative over axes 0 and 2, full range).
    s1, s2_lo : int
        Root-table feature and the first feature of the block; ``s2_lo >= s1``.
    lo, hi : ndarray of int64, shape (S,)
    total : ndarray of float64, shape (C,)
    n_actions, min_rows : int
    best_v, best_f, best_b : ndarray, shape (2, S, nb)
        Half-space records (:func:`half_leaf_records`), updated in place: the half
        ``(side, s, b)`` may split on the other feature of the pair.

    Notes
    -----
    Block features ``j`` run in parallel. The orientation "root ``s2_lo + j``, child
    ``s1``" writes the records of ``s2_lo + j`` (one thread each); the orientation
    "root ``s1``" would have every thread write ``s1``'s records, so it goes to
    per-feature buffers merged afterwards.
    """
    nb, m = Jc.shape[0], Jc.shape[1]
    loc_v = np.full((m, 2, nb), NEG_INF)
    loc_b = np.full((m, 2, nb), NO_KEY, dtype=np.int32)
    args = (Jc, int(s1), int(s2_lo), lo, hi, total, int(n_actions), float(min_rows), best_v, best_f, best_b,
            loc_v, loc_b)
    _run(_pair_range, _pair_chunks, m, Jc.size, *args)
    _pair_merge(int(s1), int(s2_lo), lo, hi, best_v, best_f, best_b, loc_v, loc_b)


def _merge(best, cand_v, f, cand_b, target):
    """Merge candidate records ``(cand_v, f, cand_b)`` (arrays, one feature) into ``best[target]``."""
    bv, bf, bb = best
    cur_v, cur_f, cur_b = bv[target], bf[target], bb[target]
    take = (cand_v > cur_v) | ((cand_v == cur_v) & (cand_v > NEG_INF)
                               & ((f < cur_f) | ((f == cur_f) & (cand_b < cur_b))))
    bv[target] = np.where(take, cand_v, cur_v)
    bf[target] = np.where(take, f, cur_f)
    bb[target] = np.where(take, cand_b, cur_b)


def _first_max(values, axis):
    """Max along ``axis`` and the first index reaching it (``-inf`` rows give index 0)."""
    idx = np.argmax(values, axis=axis)
    return np.take_along_axis(values, np.expand_dims(idx, axis), axis).squeeze(axis), idx


def pair_block_search_reference(Jc, s1, s2_lo, lo, hi, total, n_actions, min_rows, best):
    """NumPy reference of :func:`pair_block_search` (``best`` = (value, feature, position))."""
    nb, m = Jc.shape[0], Jc.shape[1]
    for j in range(m):
        s2 = s2_lo + j
        b1s = np.arange(lo[s1], hi[s1])
        b2s = np.arange(lo[s2], hi[s2])
        if not len(b1s) or not len(b2s):
            continue
        J = Jc[np.ix_(b1s, [j], b2s)][:, 0]                       # (n1, n2, C)
        c1 = Jc[b1s, j, nb - 1][:, None, :]
        c2 = Jc[nb - 1, j, b2s][None, :, :]
        quads = [J, c1 - J, c2 - J, total - c1 - c2 + J]
        q = [leaf_value(Q, n_actions, min_rows) for Q in quads]   # each (n1, n2)
        for side, v in ((0, q[0] + q[1]), (1, q[2] + q[3])):
            val, k = _first_max(v, axis=1)
            _merge(best, val, s2, b2s[k], (side, s1, b1s))
        if s2 == s1:
            continue
        for side, v in ((0, q[0] + q[2]), (1, q[1] + q[3])):
            val, k = _first_max(v, axis=0)
            _merge(best, val, s1, b1s[k], (side, s2, b2s))


# ---------------------------------------------------------------------------- depth 3

@kernel(inline="always")
def _octant_maxima(J, P12, P13, P23, c1, c2, c3, total, n_actions, min_rows, out, vals):
    """``out[o] = m(octant o)``, ``o = 4 i1 + 2 i2 + i3`` (``i = 1``: the ``>`` side).

    ``J`` sums (<= b1, <= b2, <= b3); ``P12``, ``P13``, ``P23`` the pair sums; ``c1``,
    ``c2``, ``c3`` the single-feature sums (all cumulative, channel vectors); ``vals``
    is scratch space of 8.
    """
    for o in range(8):
        out[o] = NEG_INF
    for a in range(n_actions + 1):
        vals[0] = J[a]
        vals[1] = P12[a] - J[a]
        vals[2] = P13[a] - J[a]
        vals[3] = c1[a] - P12[a] - P13[a] + J[a]
        vals[4] = P23[a] - J[a]
        vals[5] = c2[a] - P12[a] - P23[a] + J[a]
        vals[6] = c3[a] - P13[a] - P23[a] + J[a]
        vals[7] = total[a] - c1[a] - c2[a] - c3[a] + P12[a] + P13[a] + P23[a] - J[a]
        for o in range(8):
            if a < n_actions:
                if vals[o] > out[o]:
                    out[o] = vals[o]
            elif vals[o] < min_rows:  # the count channel
                out[o] = NEG_INF


#: The six orientations (root, child, grandchild) as axes of the octant table.
ORIENTATIONS = np.array([(0, 1, 2), (1, 0, 2), (0, 2, 1), (2, 0, 1), (1, 2, 0), (2, 1, 0)], dtype=np.int64)


@compiled_only
def _octant_table(Jc, j, total, n_actions, min_rows, M):
    """``M[b1, b2, b3, o]``: octant maxima for the block's feature ``j``, every position.

    Every axis runs over ``[0, nb)``; index ``nb - 1`` of an axis holds that whole
    axis, which is how the quadrant-as-a-leaf candidates read a quadrant's sum.
    """
    nb = Jc.shape[0]
    last = nb - 1
    vals = empty(8, np.float64)
    for b1 in range(nb):
        c1 = Jc[b1, last, j, last]
        for b2 in range(nb):
            P12 = Jc[b1, b2, j, last]
            c2 = Jc[last, b2, j, last]
            for b3 in range(nb):
                _octant_maxima(Jc[b1, b2, j, b3], P12, Jc[b1, last, j, b3], Jc[last, b2, j, b3], c1, c2,
                               Jc[last, last, j, b3], total, n_actions, min_rows, M[b1, b2, b3], vals)


@compiled_only
def _orient_update(M, ax_r, ax_c, ax_g, feats, lo, hi, tv, tf, tb):
    """Offer the depth-1 subtrees of quadrants (root axis ax_r, child ax_c) split on ax_g.

    ``feats`` are the search features of the three axes of ``M`` (:func:`_octant_table`).
    The targets ``tv, tf, tb[br, bc, side_r, side_c]`` are the records of the
    quadrants of features ``(feats[ax_r], feats[ax_c])``; each also gets the quadrant
    as a leaf.
    """
    nb = M.shape[0]
    flat = M.reshape(-1)
    stride = np.array([nb * nb * 8, nb * 8, 8], dtype=np.int64)
    r, c, g = feats[ax_r], feats[ax_c], feats[ax_g]
    sr_bit, sc_bit, g_bit = 4 >> ax_r, 4 >> ax_c, 4 >> ax_g
    whole_g = (nb - 1) * stride[ax_g]
    for br in range(lo[r], hi[r]):
        for bc in range(lo[c], hi[c]):
            base = br * stride[ax_r] + bc * stride[ax_c]
            for sr in range(2):
                for sc in range(2):
                    o = sr * sr_bit + sc * sc_bit
                    best = NEG_INF
                    best_pos = NO_KEY
                    for bg in range(lo[g], hi[g]):
                        at = base + bg * stride[ax_g]
                        v = flat[at + o] + flat[at + o + g_bit]
                        if v > best:
                            best = v
                            best_pos = bg
                    if _better(best, g, best_pos, tv[br, bc, sr, sc], tf[br, bc, sr, sc], tb[br, bc, sr, sc]):
                        tv[br, bc, sr, sc] = best
                        tf[br, bc, sr, sc] = g
                        tb[br, bc, sr, sc] = best_pos
                    leaf = flat[base + whole_g + o]
                    if _better(leaf, -1, -1, tv[br, bc, sr, sc], tf[br, bc, sr, sc], tb[br, bc, sr, sc]):
                        tv[br, bc, sr, sc] = leaf
                        tf[br, bc, sr, sc] = -1
                        tb[br, bc, sr, sc] = -1


@kernel
def _merge_records(tv, tf, tb, sv, sf, sb):
    """``t = better of (t, s)`` elementwise over two same-shape record arrays."""
    a, b, c = tv.reshape(-1), tf.reshape(-1), tb.reshape(-1)
    x, y, z = sv.reshape(-1), sf.reshape(-1), sb.reshape(-1)
    for i in range(a.shape[0]):
        if _better(x[i], y[i], z[i], a[i], b[i], c[i]):
            a[i] = x[i]
            b[i] = y[i]
            c[i] = z[i]


@kernel
def _triple_range(Jc, s1, s2, s3_lo, lo, hi, total, n_actions, min_rows, bv, bf, bb, shared_v, shared_f,
                  shared_b, j0, j1):
    """:func:`triple_block_search` for block features ``j0:j1``."""
    nb = Jc.shape[0]
    M = empty((nb, nb, nb, 8), np.float64)
    for j in range(j0, j1):
        feats = np.array([s1, s2, s3_lo + j], dtype=np.int64)
        _octant_table(Jc, j, total, n_actions, min_rows, M)
        for k in range(6):
            ax_r, ax_c, ax_g = ORIENTATIONS[k, 0], ORIENTATIONS[k, 1], ORIENTATIONS[k, 2]
            if k < 2:  # grandchild on the block feature: shared target
                _orient_update(M, ax_r, ax_c, ax_g, feats, lo, hi, shared_v[j, k], shared_f[j, k], shared_b[j, k])
            else:
                r, c = feats[ax_r], feats[ax_c]
                _orient_update(M, ax_r, ax_c, ax_g, feats, lo, hi, bv[r, c], bf[r, c], bb[r, c])


@kernel(parallel=True)
def _triple_chunks(Jc, s1, s2, s3_lo, lo, hi, total, n_actions, min_rows, bv, bf, bb, shared_v, shared_f,
                   shared_b, n_chunks):
    m = Jc.shape[2]
    for k in prange(n_chunks):
        _triple_range(Jc, s1, s2, s3_lo, lo, hi, total, n_actions, min_rows, bv, bf, bb, shared_v, shared_f,
                      shared_b, k * m // n_chunks, (k + 1) * m // n_chunks)


def triple_block_search(Jc, s1, s2, s3_lo, lo, hi, total, n_actions, min_rows, bv, bf, bb):
    """Update quadrant records with every depth-1 subtree inside features s1, s2, s3.

    Parameters
    ----------
    Jc : ndarray of float64, shape (nb, nb, m, nb, C)
        ``Jc[b1, b2, j, b3]``: sums over rows with ``code_s1 <= b1``, ``code_s2 <= b2``
        and ``code_{s3_lo + j} <= b3`` (cumulative over axes 0, 1 and 3).
    s1, s2, s3_lo : int
        ``s1 <= s2 <= s3_lo``.
    lo, hi : ndarray of int64, shape (S,)
    total : ndarray of float64, shape (C,)
    n_actions, min_rows : int
    bv, bf, bb : ndarray, shape (S, S, nb, nb, 2, 2)
        Quadrant records ``[r, c, br, bc, side_r, side_c]``: the best depth-1 subtree
        of the cell (r on side_r of br, c on side_c of bc), updated in place.

    Notes
    -----
    Block features ``j`` run in parallel. Thread ``j`` writes the records of pairs
    that contain ``s3_lo + j`` directly; those are distinct between threads because
    ``s1 <= s2 <= s3``. The two orientations whose grandchild is the block feature
    target ``(s1, s2)`` and ``(s2, s1)`` from every ``j``: they go to per-feature
    buffers merged afterwards.
    """
    nb, m = Jc.shape[0], Jc.shape[2]
    shared_v = np.full((m, 2, nb, nb, 2, 2), NEG_INF)
    shared_f = np.full((m, 2, nb, nb, 2, 2), NO_KEY, dtype=np.int32)
    shared_b = np.full((m, 2, nb, nb, 2, 2), NO_KEY, dtype=np.int32)
    args = (Jc, int(s1), int(s2), int(s3_lo), lo, hi, total, int(n_actions), float(min_rows), bv, bf, bb,
            shared_v, shared_f, shared_b)
    _run(_triple_range, _triple_chunks, m, 8 * Jc.size, *args)
    for j in range(m):
        _merge_records(bv[s1, s2], bf[s1, s2], bb[s1, s2], shared_v[j, 0], shared_f[j, 0], shared_b[j, 0])
        _merge_records(bv[s2, s1], bf[s2, s1], bb[s2, s1], shared_v[j, 1], shared_f[j, 1], shared_b[j, 1])


def _octant_sums(Jc, j):
    """NumPy: the eight octant sums ``(nb, nb, nb, C)`` of block feature ``j``, o = 4 i1 + 2 i2 + i3."""
    J = Jc[:, :, j]                                          # (nb, nb, nb, C)
    P12 = J[:, :, -1:, :]
    P13 = J[:, -1:, :, :]
    P23 = J[-1:, :, :, :]
    c1 = J[:, -1:, -1:, :]
    c2 = J[-1:, :, -1:, :]
    c3 = J[-1:, -1:, :, :]
    tot = J[-1:, -1:, -1:, :]
    return [J, P12 - J, P13 - J, c1 - P12 - P13 + J, P23 - J, c2 - P12 - P23 + J, c3 - P13 - P23 + J,
            tot - c1 - c2 - c3 + P12 + P13 + P23 - J]


def triple_block_search_reference(Jc, s1, s2, s3_lo, lo, hi, n_actions, min_rows, best):
    """NumPy reference of :func:`triple_block_search` (``best`` = (value, feature, position))."""
    nb, m = Jc.shape[0], Jc.shape[2]
    for j in range(m):
        feats = (s1, s2, s3_lo + j)
        M = np.stack([leaf_value(o, n_actions, min_rows) for o in _octant_sums(Jc, j)], axis=-1)
        for ax_r, ax_c, ax_g in ORIENTATIONS:
            r, c, g = feats[ax_r], feats[ax_c], feats[ax_g]
            Mo = np.transpose(M, (ax_r, ax_c, ax_g, 3))          # (br, bc, bg, o)
            brs, bcs, bgs = (np.arange(lo[x], hi[x]) for x in (r, c, g))
            if not len(brs) or not len(bcs):
                continue
            for sr in range(2):
                for sc in range(2):
                    o = sr * (4 >> ax_r) + sc * (4 >> ax_c)
                    target = (r, c, brs[:, None], bcs[None, :], sr, sc)
                    if len(bgs):
                        sub = Mo[np.ix_(brs, bcs, bgs)]
                        v = sub[..., o] + sub[..., o + (4 >> ax_g)]
                        val, k = _first_max(v, axis=2)
                        _merge(best, val, g, bgs[k], target)
                    leaf = Mo[np.ix_(brs, bcs, [nb - 1])][:, :, 0, o]
                    _merge(best, leaf, -1, np.full(leaf.shape, -1), target)


def halves_from_quadrants(quadrant, half_leaf, lo, hi):
    """Best depth-2 subtree of every half-space from the quadrant records.

    Parameters
    ----------
    quadrant : (value, feature, position), each of shape (S, S, nb, nb, 2, 2)
        Best depth-1 subtree of each quadrant (:func:`triple_block_search`).
    half_leaf : ndarray, shape (2, S, nb)
        Value of each half-space left as a leaf (:func:`half_leaf_records`).
    lo, hi : ndarray of int, shape (S,)

    Returns
    -------
    value, feature, position : ndarray, shape (2, S, nb)
        Per half ``(side, r, br)``: the value of its best depth-2 subtree and the
        split of its top (``-1``: a leaf, preferred on ties; else lowest feature,
        then lowest position).
    """
    qv = quadrant[0]
    S, nb = qv.shape[0], qv.shape[2]
    split = qv[..., 0] + qv[..., 1]                    # (r, c, br, bc, side_r)
    valid_c = np.zeros((S, nb), dtype=bool)
    for s in range(S):
        valid_c[s, int(lo[s]):int(hi[s])] = True
    split = np.where(valid_c[None, :, None, :, None], split, NEG_INF)
    # per (side, r, br): first max over (c, bc) in (c, bc) order
    cand = np.transpose(split, (4, 0, 2, 1, 3)).reshape(2, S, nb, S * nb)
    best, k = _first_max(cand, axis=3)
    take = best > half_leaf
    value = np.where(take, best, half_leaf)
    feature = np.where(take, k // nb, -1).astype(np.int32)
    position = np.where(take, k % nb, -1).astype(np.int32)
    return value, feature, position


def brute_force_search(codes, channels, lo, hi, n_actions, depth, min_rows):
    """Obviously correct exact search by recursion over row subsets (tests only).

    ``best(rows, d) = max(leaf, max over (s, b) of best(left, d-1) + best(right, d-1))``
    with the same ties as the table search (a leaf first, then the first split in
    (feature, position) order). Cost ``(2 sum(hi - lo))^depth`` leaf sums.

    Parameters
    ----------
    codes : ndarray of uint8, shape (S, n)
    channels : ndarray of float64, shape (n, n_actions + 1)
    lo, hi : ndarray of int, shape (S,)
    n_actions, depth, min_rows : int

    Returns
    -------
    value : float
    structure : None or tuple
        ``(s, b, left, right)`` nested, ``None`` for a leaf.
    """
    codes = np.asarray(codes)
    splits = [(s, b) for s in range(codes.shape[0]) for b in range(int(lo[s]), int(hi[s]))]
    goes_left = {sb: codes[sb[0]] <= sb[1] for sb in splits}

    def best(mask, d, min_leaf):
        value = float(leaf_value(channels[mask].sum(axis=0), n_actions, min_leaf))
        found = None
        if d == 0 or value == NEG_INF and mask.sum() < 2 * min_rows:
            return value, found
        for sb in splits:
            left = mask & goes_left[sb]
            vl, tl = best(left, d - 1, min_rows)
            if vl == NEG_INF:
                continue
            vr, tr = best(mask & ~goes_left[sb], d - 1, min_rows)
            if vl + vr > value:
                value, found = vl + vr, (sb[0], sb[1], tl, tr)
        return value, found

    # the root is a leaf whatever its size (see "Vocabulary" above)
    return best(np.ones(codes.shape[1], dtype=bool), depth, 0)

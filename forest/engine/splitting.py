"""Best split per node from reduced histograms.

This module owns split *finding*: given the globally reduced histograms of a set of
nodes (shape ``(n_nodes, n_features, n_bins, C)``, the last bin being the missing
bin) and a criterion (:mod:`forest.criteria.basic`), it returns each node's best split.

Candidates
    For feature ``f`` with ``nb_f`` value bins and threshold bin ``b``, value bins
    ``<= b`` go left. Thresholds ``b = 0 .. nb_f - 2`` are tried with the missing bin
    on the right and on the left; ``b = nb_f - 1`` (every value left) is tried with
    missing on the right only, i.e. the split "missing vs not". Left sums come from a
    cumulative sum over bins; right sums are the feature's total minus left.
Ties
    Gains within a relative tolerance ``rel_tol`` (default ``1e-12``) of the node's
    best gain count as equal, and the first in (feature, bin, missing-right before
    missing-left) order wins. Every rank evaluates this on bitwise-identical reduced
    histograms, and the tolerance means summation-order noise between rank counts
    cannot flip which of two equally good splits is chosen.
Missing direction when a node saw no missing values for the chosen feature
    Both directions score the same; rows with NaN at prediction time are sent to the
    child with more weight (as scikit-learn does), which is deterministic too.

:func:`find_best_splits` is the vectorised NumPy implementation used by the growers for
any criterion; for :class:`forest.criteria.basic.NewtonCriterion` it runs a Numba kernel
instead (same candidates, constraints, ties and missing rule), because boosting calls
the search once per split step on one or two nodes, where NumPy's per-call overhead
and temporaries dominated fit time. :func:`find_best_splits_reference` is a slow loop
over candidates used by tests.
"""
import numpy as np
from numba import prange

from histogram.jit import kernel, compiled_only, empty, zeros
from forest.criteria import compiled as cc
from forest.engine.categorical_split import (_permute_kernel, group_categories_kernel, group_categories_reference,
                                            left_bitsets, left_bitsets_kernel, permute_categories)
from forest.engine.tree import CAT_BITS_DTYPE, CAT_WORDS, cat_words

#: Upper bound on the float64 elements of one candidate block (per chunk of nodes),
#: which bounds the temporaries of the vectorised search (~64 MiB).
_CHUNK_ELEMENTS = 8_000_000


class SplitResult:
    """Best split per node.

    Attributes
    ----------
    feature : ndarray of int32, shape (n_nodes,)
        Global feature index, ``-1`` where the node has no admissible split.
    bin : ndarray of int32, shape (n_nodes,)
        Threshold bin: value bins ``<= bin`` go left.
    missing_left : ndarray of bool, shape (n_nodes,)
    gain : ndarray of float64, shape (n_nodes,)
        ``-inf`` where there is no admissible split.
    left_stats, right_stats : ndarray of float64, shape (n_nodes, C)
        Channel sums of the two children.
    cat_bits : ndarray of uint64, shape (n_nodes, W)
        Left categories of categorical splits (``bin == CATEGORICAL_SPLIT``), zero elsewhere;
        ``W`` the binning's width (:func:`forest.engine.tree.cat_words`, ``CAT_WORDS`` by default).
    """

    def __init__(self, feature, bin, missing_left, gain, left_stats, right_stats, cat_bits=None):
        self.feature = feature
        self.bin = bin
        self.missing_left = missing_left
        self.gain = gain
        self.left_stats = left_stats
        self.right_stats = right_stats
        self.cat_bits = np.zeros((len(feature), CAT_WORDS), dtype=CAT_BITS_DTYPE) if cat_bits is None else cat_bits

    def __len__(self):
        return len(self.feature)

    @property
    def valid(self):
        """ndarray of bool, shape (n_nodes,): nodes with an admissible split."""
        return self.feature >= 0

    @classmethod
    def empty(cls, n_nodes, n_channels, n_words=CAT_WORDS):
        return cls(np.full(n_nodes, -1, np.int32), np.zeros(n_nodes, np.int32), np.zeros(n_nodes, bool),
                   np.full(n_nodes, -np.inf), np.zeros((n_nodes, n_channels)), np.zeros((n_nodes, n_channels)),
                   np.zeros((n_nodes, n_words), dtype=CAT_BITS_DTYPE))

    def take(self, index):
        """Subset of nodes (``index`` is an int array or bool mask)."""
        return SplitResult(self.feature[index], self.bin[index], self.missing_left[index], self.gain[index],
                           self.left_stats[index], self.right_stats[index], self.cat_bits[index])


def _check_inputs(hist, parent, n_bins_non_missing, missing_bin, feature_mask):
    hist = np.asarray(hist)
    if hist.ndim != 4:
        raise ValueError(f"hist must have shape (n_nodes, n_features, n_bins, C), got {hist.shape}")
    n_nodes, n_features, n_bins, n_channels = hist.shape
    if not 0 < missing_bin < n_bins:
        raise ValueError(f"missing_bin={missing_bin} must index the bin axis of length {n_bins}")
    parent = np.asarray(parent, dtype=np.float64).reshape(n_nodes, n_channels)
    nb = np.asarray(n_bins_non_missing, dtype=np.int64)
    if nb.shape != (n_features,):
        raise ValueError(f"n_bins_non_missing must have shape ({n_features},), got {nb.shape}")
    if np.any(nb > missing_bin):
        raise ValueError("n_bins_non_missing exceeds the number of value bins")
    if feature_mask is not None:
        feature_mask = np.asarray(feature_mask, dtype=bool)
        if feature_mask.shape != (n_nodes, n_features):
            raise ValueError(f"feature_mask must have shape ({n_nodes}, {n_features}), got {feature_mask.shape}")
    return hist, parent, nb, feature_mask


def _candidate_valid(nb, n_value_bins):
    """(n_features, n_value_bins, 2) mask of admissible (bin, direction) pairs."""
    b = np.arange(n_value_bins)[None, :]
    both = b <= (nb[:, None] - 2)
    right_only = b == (nb[:, None] - 1)
    valid = np.empty((len(nb), n_value_bins, 2), dtype=bool)
    valid[:, :, 0] = both | right_only
    valid[:, :, 1] = both
    return valid


# ---------------------------------------------------------------------- the split rule
# One home for the rule every growth path applies to its candidates (the level-wise
# search here, both candidate sources of forest.engine.local_growth, the boosting kernel,
# and the best-first choice of the leaf to split): a node splits when its best gain g
# is finite and > min_gain, and the first candidate in (feature, bin, missing-right
# before missing-left) order whose gain is >= tie_threshold(g) wins.

#: Gains within this relative distance count as tied everywhere in growth.
REL_TOL = 1e-12


def tie_threshold(best, rel_tol):
    """Gains at or above this tie with ``best`` (scalars or NumPy arrays)."""
    return best - rel_tol * abs(best)


def admissible(best, min_gain):
    """Whether a node whose best gain is ``best`` splits (scalars or NumPy arrays)."""
    return (best > min_gain) & (best < np.inf)


tie_threshold_jit = kernel(tie_threshold, inline="always")
admissible_jit = kernel(admissible, inline="always")


@compiled_only(inline="always")
def largest_gain(gains, n):
    """The largest of ``gains[:n]`` (a 1-D view) that is not NaN; -inf if there is none.

    Four running maxima, combined at the end: one maximum carried through every
    candidate is a chain of dependent compares (~4 cycles each), which took as long as
    computing the gains of the boosting search (measured alone: 0.93 against 0.33 ns per
    candidate). Strict compares in any order keep the same value, and a NaN never wins.
    """
    m0 = -np.inf
    m1 = -np.inf
    m2 = -np.inf
    m3 = -np.inf
    i = 0
    while i + 3 < n:
        g0 = gains[i]
        g1 = gains[i + 1]
        g2 = gains[i + 2]
        g3 = gains[i + 3]
        m0 = g0 if g0 > m0 else m0
        m1 = g1 if g1 > m1 else m1
        m2 = g2 if g2 > m2 else m2
        m3 = g3 if g3 > m3 else m3
        i += 4
    while i < n:
        g0 = gains[i]
        m0 = g0 if g0 > m0 else m0
        i += 1
    m0 = m1 if m1 > m0 else m0
    m2 = m3 if m3 > m2 else m2
    return m2 if m2 > m0 else m0


@kernel(inline="always")
def first_near_best(cand_gain, n_cand, best, rel_tol):
    """``(feature, candidate)`` of the first candidate tying ``best``; ``(-1, -1)`` if none.

    ``cand_gain[f, :n_cand[f]]`` are feature ``f``'s candidates in (bin,
    missing-right, missing-left) order.
    """
    thr = tie_threshold_jit(best, rel_tol)
    for f in range(n_cand.shape[0]):
        for j in range(n_cand[f]):
            if cand_gain[f, j] >= thr:
                return f, j
    return -1, -1


@compiled_only
def hist_candidates(p, f, h, cnt, have_counts, n_node, nbf, missing_bin, min_rows, base, parent, cum, miss, lefts,
                    rights, cand_bin, cand_dir, cand_left):
    """Split candidates of feature ``f`` of one node from its histogram ``h (F, bins, C)``.

    The candidate source of the level-wise search (:func:`_compiled_search_kernel`)
    and of histogram-mode nodes of :mod:`forest.engine.local_growth`. Candidates go to
    ``lefts``/``rights`` (children's sums; ``rights = base - lefts``), ``cand_bin``,
    ``cand_dir`` (1: missing left) and ``cand_left[f]``, in (bin, missing-right,
    missing-left) order; returns their number. Bins whose candidates repeat an
    earlier partition (an empty bin, "missing left" with no missing rows) are left
    out: they would score the same and lose the tie to the earlier one.

    With row counts (``have_counts``: ``cnt (F, bins)`` int, ``n_node`` rows) the
    counts say which bins and missing rows exist, candidates with a side of fewer
    than ``min_rows`` rows or failing the criterion's ``sides_ok`` are not scored,
    and the scan stops once the right side is exhausted. Without them, channel sums
    say which bins are empty and every value bin up to ``nbf`` is tried (the
    histogram search's candidates; ``b = nbf - 1`` only with missing right).

    Called, not inlined: one call per (node, feature) costs nothing next to its loop
    over the bins, and inlined into the subtree kernel it was ~1.5 s of that kernel's
    first compile (benchmarks/RESULTS.md, "Cold start").
    """
    c = h.shape[2]
    for k in range(c):
        miss[k] = h[f, missing_bin, k]
        cum[k] = 0.0
    n_miss = 0
    n_present = 0
    if have_counts:
        n_miss = cnt[f, missing_bin]
        n_present = n_node - n_miss
        if n_present == 0:
            return 0
        has_missing = n_miss > 0
        last = missing_bin
    else:
        has_missing = False
        for k in range(c):
            if miss[k] != 0.0:
                has_missing = True
        last = nbf
    nc = 0
    if have_counts and n_miss > 0 and cnt[f, 0] == 0 and n_miss >= min_rows and n_present >= min_rows \
            and cc.sides_ok(p, n_miss, n_present, cum, miss, True, parent):
        # threshold bin 0 with no row in bin 0: the missing rows alone go left
        for k in range(c):
            lefts[nc, k] = cum[k] + miss[k]
            rights[nc, k] = base[k] - lefts[nc, k]
            cand_left[f, nc, k] = lefts[nc, k]
        cand_bin[f, nc] = 0
        cand_dir[f, nc] = 1
        nc += 1
    n_l = 0
    for b in range(last):
        if have_counts:
            cb = cnt[f, b]
            if cb == 0:
                continue
            n_l += cb
        elif b > 0:
            empty = True
            for k in range(c):
                if h[f, b, k] != 0.0:
                    empty = False
            if empty:
                continue
        for k in range(c):
            cum[k] += h[f, b, k]
        if not have_counts or (n_l >= min_rows and n_node - n_l >= min_rows
                               and cc.sides_ok(p, n_l, n_node - n_l, cum, miss, False, parent)):
            for k in range(c):
                lefts[nc, k] = cum[k]
                rights[nc, k] = base[k] - cum[k]
                cand_left[f, nc, k] = cum[k]
            cand_bin[f, nc] = b
            cand_dir[f, nc] = 0
            nc += 1
        if has_missing and ((have_counts and n_l < n_present and n_l + n_miss >= min_rows
                             and n_node - n_l - n_miss >= min_rows
                             and cc.sides_ok(p, n_l + n_miss, n_node - n_l - n_miss, cum, miss, True, parent))
                            or (not have_counts and b < nbf - 1)):
            for k in range(c):
                lefts[nc, k] = cum[k] + miss[k]
                rights[nc, k] = base[k] - lefts[nc, k]
                cand_left[f, nc, k] = lefts[nc, k]
            cand_bin[f, nc] = b
            cand_dir[f, nc] = 1
            nc += 1
        if have_counts and (n_l == n_present or n_node - n_l < min_rows
                            or cc.right_exhausted(p, n_node - n_l, cum, parent)):
            break
    return nc


@kernel
def _compiled_search_kernel(p, n_consts, weight_channel, hist, parent, nb, missing_bin, mask, use_mask, min_gain,
                            rel_tol, out_f, out_b, out_ml, out_gain, out_left, out_right):
    """:func:`find_best_splits` for a criterion with compiled pieces (record ``p``)."""
    n_nodes, n_features, _, c = hist.shape
    n_slots = 2 * missing_bin + 2
    cand_gain = empty((n_features, n_slots), np.float64)
    cand_bin = empty((n_features, n_slots), np.int64)
    cand_dir = empty((n_features, n_slots), np.int64)
    cand_left = empty((n_features, n_slots, c), np.float64)
    n_cand = zeros(n_features, np.int64)
    lefts = empty((n_slots, c), np.float64)
    rights = empty((n_slots, c), np.float64)
    consts = zeros(n_consts, np.float64)
    total = empty((n_features, c), np.float64)
    cum = empty(c, np.float64)
    miss = empty(c, np.float64)
    no_counts = zeros((1, 1), np.int64)
    for n in range(n_nodes):
        h = hist[n]
        cc.prepare(p, parent[n], consts)
        best = -np.inf
        for f in range(n_features):
            n_cand[f] = 0
            if use_mask and not mask[n, f]:
                continue
            # The feature's own total (value bins in order, then missing), as the
            # vectorised search's cumulative sum gives it: right = total - left.
            for k in range(c):
                acc = 0.0
                for b in range(missing_bin):
                    acc += h[f, b, k]
                total[f, k] = acc + h[f, missing_bin, k]
            nc = hist_candidates(p, f, h, no_counts, False, 0, nb[f], missing_bin, 1, total[f], parent[n], cum,
                                 miss, lefts, rights, cand_bin, cand_dir, cand_left)
            n_cand[f] = nc
            if nc > 0:
                cc.gains(p, lefts, rights, consts, cand_gain, f, nc)
                best_f = largest_gain(cand_gain[f], nc)
                if best_f > best:
                    best = best_f
        out_f[n] = -1
        out_gain[n] = -np.inf
        if not admissible_jit(best, min_gain):
            continue
        bf, bj = first_near_best(cand_gain, n_cand, best, rel_tol)
        for k in range(c):
            out_left[n, k] = cand_left[bf, bj, k]
            out_right[n, k] = total[bf, k] - cand_left[bf, bj, k]
        ml = cand_dir[bf, bj] == 1
        if h[bf, missing_bin, weight_channel] == 0.0:
            # no missing weight in this node for the chosen feature: NaN goes to the heavier child
            ml = out_left[n, weight_channel] >= out_right[n, weight_channel]
        out_f[n] = bf
        out_b[n] = cand_bin[bf, bj]
        out_ml[n] = ml
        out_gain[n] = best


def find_best_splits(hist, parent, criterion, n_bins_non_missing, missing_bin, feature_mask=None,
                     parent_count=None, min_gain=0.0, rel_tol=REL_TOL, feature_offset=0, categorical=None):
    """Best split of every node, vectorised over nodes, features, bins and directions.

    Parameters
    ----------
    hist : ndarray of float64, shape (n_nodes, n_features, n_bins, C)
        Reduced histograms; bin ``missing_bin`` holds the missing values.
    parent : ndarray of float64, shape (n_nodes, C)
        Channel sums of each node (all its rows).
    criterion : forest.criteria.basic.Criterion
    n_bins_non_missing : array-like of int, shape (n_features,)
        Value bins in use per feature (features with fewer than 1 bin never split). Bins
        ``n_bins_non_missing[f]:missing_bin`` must be empty (no code reaches them), as binning
        leaves them; the compiled Newton search does not read them.
    missing_bin : int
        Index of the missing-value bin (value bins are ``0 .. missing_bin - 1``).
    feature_mask : ndarray of bool, shape (n_nodes, n_features), optional
        Features each node may split on (mtry); all when omitted.
    parent_count : ndarray, shape (n_nodes,), optional
        Exact row count of each node, passed to the criterion.
    min_gain : float, default 0.0
        A split must have ``gain > min_gain``.
    rel_tol : float, default REL_TOL
        Relative tolerance of the tie test (see the module docstring).
    feature_offset : int, default 0
        Added to the returned feature indices (the first global feature of ``hist``,
        when a rank searches only its block of features).
    categorical : array-like of bool, shape (n_features,), optional
        Features whose value bins are categories: searched for a category subset
        (:mod:`forest.engine.categorical_split`), found as ``bin == CATEGORICAL_SPLIT``
        with the subset in ``cat_bits``.

    Returns
    -------
    SplitResult
    """
    hist, parent, nb, feature_mask = _check_inputs(hist, parent, n_bins_non_missing, missing_bin, feature_mask)
    n_nodes, n_features, n_bins, n_channels = hist.shape
    if categorical is not None and np.any(categorical) and n_nodes and n_features:
        hist = np.ascontiguousarray(hist, dtype=np.float64)
        if getattr(criterion, "numba_categorical_search", None) is not None:
            result = SplitResult.empty(n_nodes, n_channels, cat_words(missing_bin))
            pc = None if parent_count is None else np.ascontiguousarray(parent_count, dtype=np.float64)
            criterion.numba_categorical_search(hist, parent, nb, int(missing_bin),
                                               None if feature_mask is None else np.ascontiguousarray(feature_mask),
                                               pc, float(min_gain), float(rel_tol), result,
                                               np.asarray(categorical, dtype=bool))
            result.feature[result.feature >= 0] += feature_offset
            return result
        scan = getattr(criterion, "categorical_scan", None)
        keys = None

        def keys_fn(stats):  # kept: boosting's regrouping below reads the same keys
            nonlocal keys
            keys = np.ascontiguousarray(criterion.category_keys(stats, parent, parent_count=parent_count),
                                        dtype=np.float64)
            return keys

        permuted, orders, cat_index = permute_categories(hist[:, :, :missing_bin + 1], categorical, keys_fn,
                                                         extremes=0 if scan is None else int(scan()[0]))
        ends = None
        if scan is not None and len(cat_index):
            # boosting's candidate layout (LightGBM's scan): regroup the permuted bins
            max_cat, min_group = scan()
            ends = np.empty(orders.shape, dtype=np.int64)
            use_count = parent_count is not None
            pc = np.ascontiguousarray(parent_count, dtype=np.float64) if use_count else np.zeros(1)
            group_categories_kernel(hist[:, :, :missing_bin + 1], permuted, orders, cat_index.astype(np.int64), keys,
                                    np.ascontiguousarray(nb, dtype=np.int64), np.ascontiguousarray(parent),
                                    pc, use_count, int(criterion.n_outputs), int(max_cat), float(min_group), ends,
                                    np.empty(orders.shape[:2], dtype=np.int64))
        if permuted.shape[2] != n_bins:
            permuted = np.concatenate([permuted, hist[:, :, missing_bin + 1:]], axis=2)
        cat_criterion = criterion.categorical_criterion() if hasattr(criterion, "categorical_criterion") \
            else criterion
        if cat_criterion is criterion:
            result = find_best_splits(permuted, parent, criterion, nb, missing_bin, feature_mask, parent_count,
                                      min_gain, rel_tol)
        else:
            result = _two_criteria_search(permuted, parent, criterion, cat_criterion, nb, missing_bin, feature_mask,
                                          parent_count, min_gain, rel_tol, np.asarray(categorical, dtype=bool))
        if ends is not None:  # a bin of the layout -> the last category it sends left
            position = {int(f): j for j, f in enumerate(cat_index)}
            for node in range(n_nodes):
                j = position.get(int(result.feature[node]))
                if j is not None:
                    result.bin[node] = ends[node, j, result.bin[node]] - 1
        result.cat_bits, result.bin = left_bitsets(orders, cat_index, result.feature, result.bin)
        result.feature[result.feature >= 0] += feature_offset
        return result
    result = SplitResult.empty(n_nodes, n_channels)
    if n_nodes == 0 or n_features == 0:
        return result
    if getattr(criterion, "numba_search", None) is not None:
        pc = None if parent_count is None else np.ascontiguousarray(parent_count, dtype=np.float64)
        criterion.numba_search(np.ascontiguousarray(hist, dtype=np.float64), parent, nb, int(missing_bin),
                               None if feature_mask is None else np.ascontiguousarray(feature_mask), pc,
                               float(min_gain), float(rel_tol), result)
        result.feature[result.feature >= 0] += feature_offset
        return result
    compiled = criterion.compiled() if hasattr(criterion, "compiled") else None
    if compiled is not None:
        mask = np.ones((1, 1), dtype=np.bool_) if feature_mask is None else np.ascontiguousarray(feature_mask)
        cc.call_kernel(_compiled_search_kernel, cc.kernel_record(compiled), compiled.n_consts,
                       compiled.weight_channel, np.ascontiguousarray(hist, dtype=np.float64), parent, nb,
                       int(missing_bin), mask, feature_mask is not None, float(min_gain), float(rel_tol),
                       result.feature, result.bin, result.missing_left, result.gain, result.left_stats,
                       result.right_stats)
        result.feature[result.feature >= 0] += feature_offset
        return result
    valid = _candidate_valid(nb, missing_bin)
    per_node = n_features * missing_bin * 2 * n_channels * 6
    chunk = max(1, _CHUNK_ELEMENTS // max(per_node, 1))
    for lo in range(0, n_nodes, chunk):
        hi = min(n_nodes, lo + chunk)
        _search_chunk(hist[lo:hi], parent[lo:hi], criterion, valid, missing_bin,
                      None if feature_mask is None else feature_mask[lo:hi],
                      None if parent_count is None else np.asarray(parent_count, dtype=np.float64)[lo:hi],
                      min_gain, rel_tol, result, lo)
    result.feature[result.feature >= 0] += feature_offset
    return result


def _two_criteria_search(hist, parent, criterion, cat_criterion, nb, missing_bin, feature_mask, parent_count,
                         min_gain, rel_tol, categorical):
    """Numeric features scored by ``criterion``, categorical ones by ``cat_criterion``; per node the
    better of the two, a tie (the split rule's tolerance) to the lower feature index."""
    n_nodes, n_features = hist.shape[:2]
    base = np.ones((n_nodes, n_features), dtype=bool) if feature_mask is None else np.asarray(feature_mask, bool)
    num = find_best_splits(hist, parent, criterion, nb, missing_bin, base & ~categorical[None], parent_count,
                           min_gain, rel_tol)
    cat = find_best_splits(hist, parent, cat_criterion, nb, missing_bin, base & categorical[None], parent_count,
                           min_gain, rel_tol)
    best = np.maximum(num.gain, cat.gain)
    with np.errstate(invalid="ignore"):
        thr = tie_threshold(best, rel_tol)
        num_ties = num.valid & (num.gain >= thr)
        cat_ties = cat.valid & (cat.gain >= thr)
    take_cat = cat_ties & (~num_ties | (cat.feature < num.feature))
    out = num
    for name in ("feature", "bin", "missing_left", "gain", "left_stats", "right_stats"):
        getattr(out, name)[take_cat] = getattr(cat, name)[take_cat]
    return out


def _search_chunk(hist, parent, criterion, valid, missing_bin, feature_mask, parent_count, min_gain, rel_tol,
                  result, offset):
    n_nodes, n_features, _, n_channels = hist.shape
    nv = missing_bin
    cum = np.cumsum(hist[:, :, :nv, :], axis=2)                       # (N, F, nv, C)
    miss = hist[:, :, missing_bin, :]                                 # (N, F, C)
    total = cum[:, :, nv - 1, :] + miss                               # (N, F, C)
    left = np.empty((n_nodes, n_features, nv, 2, n_channels))
    left[:, :, :, 0, :] = cum
    left[:, :, :, 1, :] = cum + miss[:, :, None, :]
    right = total[:, :, None, None, :] - left
    kwargs = {}
    if parent_count is not None:
        kwargs["parent_count"] = parent_count.reshape(n_nodes, 1, 1, 1)
    gains = criterion.gain(left, right, parent.reshape(n_nodes, 1, 1, 1, n_channels), **kwargs)
    gains = np.where(valid[None], gains, -np.inf)
    if feature_mask is not None:
        gains = np.where(feature_mask[:, :, None, None], gains, -np.inf)
    flat = gains.reshape(n_nodes, -1)
    best = flat.max(axis=1)
    ok = admissible(best, min_gain)
    with np.errstate(invalid="ignore"):
        near = flat >= tie_threshold(best, rel_tol)[:, None]
    idx = np.argmax(near, axis=1)
    f, rest = np.divmod(idx, nv * 2)
    b, d = np.divmod(rest, 2)
    rows = np.arange(n_nodes)
    lstats = left[rows, f, b, d]
    rstats = right[rows, f, b, d]
    miss_left = d.astype(bool)
    # No missing rows for the chosen feature in this node: send future NaNs to the
    # heavier child (both directions scored the same, so this changes no gain).
    no_missing = criterion.node_weight(miss[rows, f]) == 0
    heavier_left = criterion.node_weight(lstats) >= criterion.node_weight(rstats)
    miss_left = np.where(no_missing, heavier_left, miss_left)
    sl = slice(offset, offset + n_nodes)
    result.feature[sl] = np.where(ok, f, -1)
    result.bin[sl] = np.where(ok, b, 0)
    result.missing_left[sl] = ok & miss_left
    result.gain[sl] = np.where(ok, best, -np.inf)
    result.left_stats[sl] = np.where(ok[:, None], lstats, 0.0)
    result.right_stats[sl] = np.where(ok[:, None], rstats, 0.0)


@kernel(inline="always")
def _newton_score(st, k, lam):
    s = 0.0
    for j in range(k):
        d = st[k + j] + lam
        if d > 0:
            s += st[j] * st[j] / d
    return s


@kernel(inline="always")
def _newton_score1(g, h, lam):
    d = h + lam
    return g * g / d if d > 0 else 0.0


@compiled_only
def _newton_scan_k1(hist, n, f, nbf, missing_bin, lam, min_leaf, min_hess, factor, score_p, gains, cg, ch, live):
    """Fill ``gains[d, b]`` of one (node, feature) for one output (scalar fast path); return the best.

    Skipped candidates are -inf and never change the result: an empty bin repeats
    the previous bin's split (which comes first in tie order), and without missing
    rows "missing left" repeats "missing right" (which comes first too).

    The prefix sums come first (``cg``, ``ch``: scratch of at least ``nbf`` elements), then
    every candidate's gain in a loop without branches, which the compiler vectorises:
    the two divisions per candidate (four with missing rows) bound the scan, and run
    four at a time. Each gain is computed by the same operations as one at a time, so
    the result is the same bit for bit.
    """
    gt = 0.0
    ht = 0.0
    # Bins nbf:missing_bin hold no rows (exact zeros: built, subtracted or quantized sums of
    # nothing), and adding a zero leaves a sum unchanged, so the totals stop at nbf: with
    # one wide categorical the bin axis is 1,000+ bins where a numeric feature uses 255.
    for b in range(nbf):
        gb = hist[n, f, b, 0]
        hb = hist[n, f, b, 1]
        gt += gb
        ht += hb
        cg[b] = gt
        ch[b] = ht
        # an empty bin (after the first) repeats the previous bin's split
        live[b] = b == 0 or gb != 0.0 or hb != 0.0
    gm = hist[n, f, missing_bin, 0]
    hm = hist[n, f, missing_bin, 1]
    gt += gm
    ht += hm
    has_missing = gm != 0.0 or hm != 0.0
    for b in range(nbf):
        gl = cg[b]
        hl = ch[b]
        rg = gt - gl
        rh = ht - hl
        ok = live[b] & ~((hl < min_hess) | (rh < min_hess) | (hl * factor < min_leaf) | (rh * factor < min_leaf))
        g = _newton_score1(gl, hl, lam) + _newton_score1(rg, rh, lam) - score_p
        gains[0, b] = g if ok else -np.inf
    if has_missing:
        for b in range(nbf):
            lg = cg[b] + gm
            lh = ch[b] + hm
            rg = gt - lg
            rh = ht - lh
            ok = live[b] & (b != nbf - 1) & ~((lh < min_hess) | (rh < min_hess) | (lh * factor < min_leaf)
                                             | (rh * factor < min_leaf))
            g = _newton_score1(lg, lh, lam) + _newton_score1(rg, rh, lam) - score_p
            gains[1, b] = g if ok else -np.inf
    else:
        for b in range(nbf):
            gains[1, b] = -np.inf
    best = largest_gain(gains[0], nbf)
    if has_missing:
        best_ml = largest_gain(gains[1], nbf)
        if best_ml > best:
            best = best_ml
    return best


@kernel
def _newton_search_kernel(hist, parent, nb, missing_bin, mask, use_mask, parent_count, use_count, k, lam, min_leaf,
                          min_hess, min_gain, rel_tol, out_f, out_b, out_ml, out_gain, out_left, out_right):
    n_nodes, n_features, _, c = hist.shape
    nv = missing_bin
    gains = empty((n_features, 2, nv), np.float64)  # [f, d, b]: d = missing left
    cum_g = empty(nv, np.float64)  # prefix-sum scratch of _newton_scan_k1
    cum_h = empty(nv, np.float64)
    live = empty(nv, np.bool_)
    fbest = empty(n_features, np.float64)  # best gain per feature: the tie scan visits only features that reach it
    cum = empty(c, np.float64)
    total = empty(c, np.float64)
    left = empty(c, np.float64)
    right = empty(c, np.float64)
    for n in range(n_nodes):
        hp = 0.0
        for j in range(k):
            hp += parent[n, k + j]
        factor = 1.0
        if use_count:
            factor = parent_count[n] / hp if hp > 0 else 0.0
        score_p = _newton_score(parent[n], k, lam)
        best = -np.inf
        for f in range(n_features):
            fbest[f] = -np.inf
            if use_mask and not mask[n, f]:
                continue
            nbf = nb[f]
            if k == 1:
                bf = _newton_scan_k1(hist, n, f, nbf, missing_bin, lam, min_leaf, min_hess, factor, score_p, gains[f],
                                     cum_g, cum_h, live)
                fbest[f] = bf
                if bf > best:
                    best = bf
                continue
            gains[f, :, :nbf] = -np.inf
            has_missing = False
            for ch in range(c):
                acc = 0.0
                for b in range(nbf):  # bins nbf:nv are empty (see _newton_scan_k1)
                    acc += hist[n, f, b, ch]
                total[ch] = acc + hist[n, f, missing_bin, ch]
                cum[ch] = 0.0
                if hist[n, f, missing_bin, ch] != 0.0:
                    has_missing = True
            for b in range(nbf):
                bin_empty = True
                for ch in range(c):
                    cum[ch] += hist[n, f, b, ch]
                    if hist[n, f, b, ch] != 0.0:
                        bin_empty = False
                if b > 0 and bin_empty:
                    continue  # same split as the previous bin (see _newton_scan_k1)
                for d in range(2):
                    if d == 1 and (b == nbf - 1 or not has_missing):
                        continue
                    hl = 0.0
                    hr = 0.0
                    for ch in range(c):
                        left[ch] = cum[ch] + hist[n, f, missing_bin, ch] if d == 1 else cum[ch]
                        right[ch] = total[ch] - left[ch]
                    for j in range(k):
                        hl += left[k + j]
                        hr += right[k + j]
                    if hl < min_hess or hr < min_hess or hl * factor < min_leaf or hr * factor < min_leaf:
                        continue
                    g = _newton_score(left, k, lam) + _newton_score(right, k, lam) - score_p
                    gains[f, d, b] = g
                    if g > fbest[f]:
                        fbest[f] = g
                    if g > best:
                        best = g
        out_f[n] = -1
        out_gain[n] = -np.inf
        if not admissible_jit(best, min_gain):
            continue
        thr = tie_threshold_jit(best, rel_tol)
        found = False
        for f in range(n_features):
            if not fbest[f] >= thr:
                continue  # no candidate of this feature ties the best (unscanned rows unread)
            for b in range(nb[f]):
                for d in range(2):
                    if gains[f, d, b] >= thr:
                        found = True
                        break
                if found:
                    break
            if found:
                break
        # the chosen children's sums, summed in the same order as in the scan
        miss_w = 0.0
        for j in range(k):
            miss_w += hist[n, f, missing_bin, k + j]
        for ch in range(c):
            acc = 0.0
            for bb in range(nb[f]):  # bins nb[f]:nv are empty (see _newton_scan_k1)
                acc += hist[n, f, bb, ch]
            tot = acc + hist[n, f, missing_bin, ch]
            acc = 0.0
            for bb in range(b + 1):
                acc += hist[n, f, bb, ch]
            lv = acc + hist[n, f, missing_bin, ch] if d == 1 else acc
            out_left[n, ch] = lv
            out_right[n, ch] = tot - lv
        ml = d == 1
        if miss_w == 0.0:
            lw = 0.0
            rw = 0.0
            for j in range(k):
                lw += out_left[n, k + j]
                rw += out_right[n, k + j]
            ml = lw >= rw
        out_f[n] = f
        out_b[n] = b
        out_ml[n] = ml
        out_gain[n] = best


@kernel
def _newton_category_keys(hist, parent, parent_count, use_count, cat_index, nb, k, cat_smooth, min_category_rows,
                          keys):
    """:meth:`NewtonCriterion.category_keys` of the value bins of features ``cat_index`` (its
    NumPy form is the reference): ``keys[n, j, b]`` for feature ``cat_index[j]``, bin ``b``,
    for the bins below ``nb[f]`` (those above never hold rows and are left unset: the
    permutation reads keys of categories with rows only).

    Same operations in the same order; a zero denominator (``cat_smooth=0`` and no
    hessian) gives an infinite key, as NumPy's non-finite quotient ends up in the scan.
    """
    n_nodes = hist.shape[0]
    nv = keys.shape[2]
    check = use_count and min_category_rows > 1.0
    for n in range(n_nodes):
        per_hess = 0.0
        if check:
            hp = parent[n, k]
            for j in range(1, k):
                hp += parent[n, k + j]
            per_hess = parent_count[n] / hp if hp > 0 else 0.0
        for jf in range(cat_index.shape[0]):
            f = cat_index[jf]
            for b in range(min(nb[f], nv)):
                key = 0.0
                finite = True
                for j in range(k):
                    d = hist[n, f, b, k + j] + cat_smooth
                    if d == 0.0:
                        finite = False
                        break
                    term = hist[n, f, b, j] / d
                    key = term if j == 0 else key + term
                if not finite:
                    key = np.inf
                elif check:
                    h = hist[n, f, b, k]
                    for j in range(1, k):
                        h += hist[n, f, b, k + j]
                    if h * per_hess < min_category_rows:
                        key = np.inf
                keys[n, jf, b] = key


@compiled_only
def _search_copy(hist, nb, missing_bin, cat_pos):
    """What :func:`_newton_search_kernel` reads of ``hist (N, F, B, C)``, in a new array.

    Per node and feature: the value bins below ``nb[f]`` (numeric features only: the
    categorical ones are written by the permutation) and the missing bin. The bins
    ``nb[f]:missing_bin`` hold no rows and are neither copied nor read, so they are left
    uninitialised: reading them is a bug. Copying the whole array cost 14-25 us per call
    (2 nodes x 7 features x 1,001 bins, issue 32's design), most of the categorical search's
    overhead after the sort.
    """
    n_nodes, n_features, n_bins, c = hist.shape
    out = empty((n_nodes, n_features, n_bins, c), np.float64)
    for n in range(n_nodes):
        for f in range(n_features):
            if cat_pos[f] < 0:
                for b in range(nb[f]):
                    for ch in range(c):
                        out[n, f, b, ch] = hist[n, f, b, ch]
            for ch in range(c):
                out[n, f, missing_bin, ch] = hist[n, f, missing_bin, ch]
    return out


@kernel
def _newton_categorical_kernel(hist, parent, nb, missing_bin, mask, use_mask, parent_count, use_count, cat_index,
                               cat_pos, k, lam, two_lambdas, cat_lam, cat_smooth, max_cat, min_group, min_leaf,
                               min_hess, min_gain, rel_tol, out_f, out_b, out_ml, out_gain, out_left, out_right,
                               out_bits):
    """The categorical branch of :func:`find_best_splits` for the Newton criterion, compiled.

    Keys (:func:`_newton_category_keys`: categories under ``cat_smooth`` rows unjudged), order
    and permutation (:func:`forest.engine.categorical_split._permute_kernel`), LightGBM's
    candidate layout (:func:`forest.engine.categorical_split.group_categories_kernel`:
    ``max_cat``, ``min_group``), the search of numeric features
    at ``lam`` and of categorical ones at ``cat_lam`` (``two_lambdas``; else one search at
    ``lam``), the better of the two per node with the split rule's tie to the lower feature,
    then the left categories as bitsets: what the NumPy branch does through
    ``permute_categories``, ``_two_criteria_search`` and ``left_bitsets``, bit for bit,
    without their per-call overhead (boosting calls it once per split step, ~3,000 times a fit).
    """
    n_nodes, n_features, n_bins, c = hist.shape
    nv = missing_bin
    n_cat = cat_index.shape[0]
    keys = empty((n_nodes, n_cat, nv), np.float64)
    _newton_category_keys(hist, parent, parent_count, use_count, cat_index, nb, k, cat_smooth, cat_smooth, keys)
    permuted = _search_copy(hist, nb, missing_bin, cat_pos)
    orders = empty((n_nodes, n_cat, nv), np.int64)
    _permute_kernel(hist[:, :, :nv + 1], cat_index, keys, permuted[:, :, :nv + 1], orders, nb, max_cat)
    ends = empty((n_nodes, n_cat, nv), np.int64)
    n_used = empty((n_nodes, n_cat), np.int64)
    group_categories_kernel(hist[:, :, :nv + 1], permuted[:, :, :nv + 1], orders, cat_index, keys, nb, parent,
                            parent_count, use_count, k, max_cat, min_group, ends, n_used)
    # A categorical feature's scan stops at its longest layout over the nodes: the bins
    # after a layout are zero (skipped candidates that change no sum), and a 1,000-level
    # column's layout is a few dozen bins.
    nb_scan = nb.copy()
    for j in range(n_cat):
        longest = 1
        for n in range(n_nodes):
            longest = max(longest, n_used[n, j])
        nb_scan[cat_index[j]] = min(nb[cat_index[j]], longest)
    nb = nb_scan
    if not two_lambdas:
        _newton_search_kernel(permuted, parent, nb, missing_bin, mask, use_mask, parent_count, use_count, k, lam,
                              min_leaf, min_hess, min_gain, rel_tol, out_f, out_b, out_ml, out_gain, out_left,
                              out_right)
    else:
        num_mask = empty((n_nodes, n_features), np.bool_)
        cat_mask = empty((n_nodes, n_features), np.bool_)
        for n in range(n_nodes):
            for f in range(n_features):
                base = mask[n, f] if use_mask else True
                num_mask[n, f] = base and cat_pos[f] < 0
                cat_mask[n, f] = base and cat_pos[f] >= 0
        c_f = empty(n_nodes, np.int32)
        c_b = empty(n_nodes, np.int32)
        c_ml = empty(n_nodes, np.bool_)
        c_gain = empty(n_nodes, np.float64)
        c_left = zeros((n_nodes, c), np.float64)
        c_right = zeros((n_nodes, c), np.float64)
        _newton_search_kernel(permuted, parent, nb, missing_bin, num_mask, True, parent_count, use_count, k, lam,
                              min_leaf, min_hess, min_gain, rel_tol, out_f, out_b, out_ml, out_gain, out_left,
                              out_right)
        _newton_search_kernel(permuted, parent, nb, missing_bin, cat_mask, True, parent_count, use_count, k, cat_lam,
                              min_leaf, min_hess, min_gain, rel_tol, c_f, c_b, c_ml, c_gain, c_left, c_right)
        for n in range(n_nodes):
            best = max(out_gain[n], c_gain[n])
            thr = tie_threshold_jit(best, rel_tol)
            num_ties = out_f[n] >= 0 and out_gain[n] >= thr
            cat_ties = c_f[n] >= 0 and c_gain[n] >= thr
            if cat_ties and (not num_ties or c_f[n] < out_f[n]):
                out_f[n] = c_f[n]
                out_b[n] = c_b[n]
                out_ml[n] = c_ml[n]
                out_gain[n] = c_gain[n]
                for ch in range(c):
                    out_left[n, ch] = c_left[n, ch]
                    out_right[n, ch] = c_right[n, ch]
    for n in range(n_nodes):  # a bin of the layout -> the last category it sends left
        f = out_f[n]
        if f >= 0 and cat_pos[f] >= 0:
            out_b[n] = ends[n, cat_pos[f], out_b[n]] - 1
    left_bitsets_kernel(orders, cat_pos, out_f, out_b, out_bits)


@kernel(parallel=True)
def _newton_nodes_parallel(hist, parent, nb, missing_bin, mask, use_mask, parent_count, use_count, k, lam, min_leaf,
                           min_hess, min_gain, rel_tol, out_f, out_b, out_ml, out_gain, out_left, out_right):
    """:func:`_newton_search_kernel` with one node per thread (the nodes are independent).

    Boosting searches a split step's two children in one call; a node's scan costs the same
    at any row count (features x bins), so on two threads the pair takes about one node's
    time. Each node's result is what the serial kernel computes for it.
    """
    for n in prange(hist.shape[0]):
        m = mask[n:n + 1] if use_mask else mask
        pc = parent_count[n:n + 1] if use_count else parent_count
        _newton_search_kernel(hist[n:n + 1], parent[n:n + 1], nb, missing_bin, m, use_mask, pc, use_count, k, lam,
                              min_leaf, min_hess, min_gain, rel_tol, out_f[n:n + 1], out_b[n:n + 1],
                              out_ml[n:n + 1], out_gain[n:n + 1], out_left[n:n + 1], out_right[n:n + 1])


@kernel(parallel=True)
def _newton_categorical_nodes_parallel(hist, parent, nb, missing_bin, mask, use_mask, parent_count, use_count,
                                       cat_index, cat_pos, k, lam, two_lambdas, cat_lam, cat_smooth, max_cat,
                                       min_group, min_leaf, min_hess, min_gain, rel_tol, out_f, out_b,
                                       out_ml, out_gain, out_left, out_right, out_bits):
    """:func:`_newton_categorical_kernel` with one node per thread (the nodes are independent).

    Boosting searches a split step's two children in one call; the search of a node (keys,
    the sorted permutation of its categories, the scan) costs the same at any row count,
    tens of microseconds with a wide categorical column, so on two threads the pair takes
    about one node's time. Each node's result is what the serial kernel computes for it.
    """
    for n in prange(hist.shape[0]):
        m = mask[n:n + 1] if use_mask else mask
        pc = parent_count[n:n + 1] if use_count else parent_count
        _newton_categorical_kernel(hist[n:n + 1], parent[n:n + 1], nb, missing_bin, m, use_mask, pc, use_count,
                                   cat_index, cat_pos, k, lam, two_lambdas, cat_lam, cat_smooth, max_cat, min_group,
                                   min_leaf, min_hess, min_gain, rel_tol, out_f[n:n + 1], out_b[n:n + 1],
                                   out_ml[n:n + 1], out_gain[n:n + 1], out_left[n:n + 1], out_right[n:n + 1],
                                   out_bits[n:n + 1])


def find_best_splits_reference(hist, parent, criterion, n_bins_non_missing, missing_bin, feature_mask=None,
                               parent_count=None, min_gain=0.0, rel_tol=1e-12, categorical=None):
    """Slow reference of :func:`find_best_splits`: explicit loops and sums.

    Same parameters and result; used only by tests. A categorical feature's order is
    found here by a plain sort of its non-empty categories by the criterion's keys
    (ties by code), the empty ones after.
    """
    hist, parent, nb, feature_mask = _check_inputs(hist, parent, n_bins_non_missing, missing_bin, feature_mask)
    n_nodes, n_features, n_bins, n_channels = hist.shape
    result = SplitResult.empty(n_nodes, n_channels, cat_words(missing_bin))
    categorical = np.zeros(n_features, bool) if categorical is None else np.asarray(categorical, dtype=bool)
    for n in range(n_nodes):
        cands = []  # (gain, f, b, d, left, right, left categories or None)
        for f in range(n_features):
            if feature_mask is not None and not feature_mask[n, f]:
                continue
            miss = hist[n, f, missing_bin]
            order = np.arange(missing_bin)
            groups = None
            if categorical[f]:
                stats = hist[n, f, :missing_bin]
                pc = None if parent_count is None else np.asarray(parent_count, dtype=np.float64)[n:n + 1]
                keys = np.asarray(criterion.category_keys(stats[None, None], parent[n:n + 1], parent_count=pc))[0, 0]
                present = [b for b in range(missing_bin) if np.any(stats[b] != 0.0)]
                absent = [b for b in range(missing_bin) if not np.any(stats[b] != 0.0)]
                order = np.array(sorted(present, key=lambda b: (keys[b], b)) + absent, dtype=np.int64)
                if hasattr(criterion, "categorical_scan"):  # boosting: LightGBM's candidates
                    k = criterion.n_outputs
                    hp = float(np.sum(parent[n, k:2 * k]))
                    per_hess = 1.0 if parent_count is None else (float(parent_count[n]) / hp if hp > 0 else 0.0)
                    groups = group_categories_reference(stats[:int(nb[f])], keys[:int(nb[f])], per_hess, k,
                                                        *criterion.categorical_scan())
                    order = np.array([b for g in groups for b in g] + list(range(int(nb[f]), missing_bin)),
                                     dtype=np.int64)
            for b in range(int(nb[f]) if groups is None else len(groups)):
                for d in (0, 1):
                    if d == 1 and b == (nb[f] if groups is None else len(groups)) - 1:
                        continue
                    n_left = b + 1 if groups is None else sum(len(g) for g in groups[:b + 1])
                    lset = order[:n_left]
                    rset = order[n_left: missing_bin]
                    left = hist[n, f, lset].sum(axis=0) + (miss if d == 1 else 0.0)
                    right = hist[n, f, rset].sum(axis=0) + (miss if d == 0 else 0.0)
                    kw = {} if parent_count is None else {"parent_count": float(parent_count[n])}
                    scorer = criterion.categorical_criterion() if categorical[f] and hasattr(
                        criterion, "categorical_criterion") else criterion
                    g = float(scorer.gain(left, right, parent[n], **kw))
                    cands.append((g, f, b, d, left, right, lset if categorical[f] else None))
        if not cands:
            continue
        best = max(c[0] for c in cands)
        if not (np.isfinite(best) and best > min_gain):
            continue
        for g, f, b, d, left, right, lset in cands:  # already in (f, b, d) order
            if g >= best - rel_tol * abs(best):
                break
        ml = bool(d)
        if criterion.node_weight(hist[n, f, missing_bin]) == 0:
            ml = bool(criterion.node_weight(left) >= criterion.node_weight(right))
        result.feature[n], result.bin[n], result.missing_left[n] = f, b, ml
        if lset is not None:
            from forest.engine.tree import CATEGORICAL_SPLIT, cat_bitset
            result.bin[n] = CATEGORICAL_SPLIT
            result.cat_bits[n] = cat_bitset(lset, cat_words(missing_bin))
        result.gain[n] = best
        result.left_stats[n], result.right_stats[n] = left, right
    return result

"""Category-subset splits: order a node's categories, scan the order, keep the prefix.

This module owns how a split on a categorical feature is searched in the histogram
paths (the level-wise search of :mod:`forest.engine.splitting` and the subtree kernel of
:mod:`forest.engine.local_growth`) and how the chosen subset is written down.

The rule
    A categorical feature's value bins are its categories (:mod:`histogram.categories`).
    At a node, the categories holding rows are sorted by the criterion's per-category
    key (``Criterion.category_keys``, compiled as the ``bin_key`` piece of
    :mod:`forest.criteria.compiled`: the mean outcome, the mean GRF pseudo-outcome, the
    gradient over the smoothed hessian), ties by code; categories without rows at the
    node follow in code order. The node's histogram of that feature is permuted into
    this order and searched exactly as a numeric feature's (same candidates, missing
    bin on either side, same tie rule): threshold ``b`` in the permuted order sends the
    categories ``order[0..b]`` left. For a variance criterion with one target (and a
    binary outcome) the best subset is a prefix of the mean order (Fisher 1958), so the
    search is exact; for the causal criteria it is exact for the regression on the
    pseudo-outcome the gain scores; otherwise (several outputs, boosting's Newton
    gain) it is LightGBM's sorted scan, and for boosting LightGBM's candidates only: the
    bins are regrouped first (:func:`group_categories_kernel`: at most ``max_cat_threshold``
    categories from either end of the order on the small side, steps of
    ``min_data_per_group`` rows).
Writing it down
    The subset becomes a bitset over value bins (:func:`forest.engine.tree.cat_bitset`)
    and the node's ``bin_threshold`` :data:`forest.engine.tree.CATEGORICAL_SPLIT`.
    Categories without rows at the node go right: a category never seen in training
    arrives as missing (NaN) and follows ``missing_left``.
Determinism
    Keys are computed from the reduced (rank-count independent) histograms, the sort
    is stable, so every rank and rank count chooses the same subset.

:func:`category_orders` and :func:`permute_categories` are the NumPy forms used by the
level-wise search; :func:`left_bitsets` turns chosen thresholds into bitsets.
"""
import numpy as np

from histogram.jit import compiled_only, kernel
from forest.engine.tree import CAT_BITS_DTYPE, CATEGORICAL_SPLIT, cat_words


def category_orders(stats, keys):
    """Scan order of each node's categories.

    Parameters
    ----------
    stats : ndarray of float64, shape (N, F, B, C)
        Per-category channel sums (value bins only) of ``F`` categorical features.
    keys : ndarray of float64, shape (N, F, B)
        The criterion's key of every category.

    Returns
    -------
    ndarray of int64, shape (N, F, B)
        Categories with rows at the node (some channel non-zero) by increasing key,
        ties by code, then the empty ones in code order.
    """
    empty = ~(stats != 0.0).any(axis=-1)
    keys = np.where(empty | ~np.isfinite(keys), np.inf, keys)
    codes = np.broadcast_to(np.arange(stats.shape[2]), keys.shape)
    # lexsort sorts by the last key first: emptiness, then key, then code.
    flat = np.lexsort((codes.reshape(-1, keys.shape[-1]), keys.reshape(-1, keys.shape[-1]),
                       empty.reshape(-1, keys.shape[-1])), axis=-1)
    return flat.reshape(keys.shape).astype(np.int64)


#: Value bins up to which :func:`_permute_kernel` orders a node's categories by insertion
#: (fast for up to 255 codes); wider axes (wide categorical codes) take a merge sort, as
#: insertion costs ~n^2/4 moves (~250,000 at 1,000 categories, per node and split step).
_INSERTION_MAX_BINS = 256


@compiled_only
def _sort_present(hist, n, f, nbf, keys, kk, order, spare, extremes, mark):
    """The present categories of node ``n``, feature ``f`` into ``order[:npres]`` by key, ties by
    code (a stable merge sort): the insertion sort's order; categories are the bins below ``nbf``.
    Returns ``npres``.

    Only the categories of finite key are sorted; those of non-finite key (every one that
    counts as infinite: boosting's categories under ``cat_smooth`` rows) follow in
    code order, which is where the stable sort of the keys with them as ``inf`` put them.
    At a deep node most of a wide column's present categories are such (issue 32's design:
    ~570 present, ~40 finite at 1,000 levels), so the sort shrinks ~14x. ``spare`` is an
    int64 scratch of ``hist.shape[2] - 1`` elements.
    """
    c = hist.shape[3]
    nfin = 0
    ninf = 0
    for b in range(nbf):
        present = False
        for k in range(c):
            if hist[n, f, b, k] != 0.0:
                present = True
        if present:
            key = keys[b]
            if np.isfinite(key):
                kk[nfin] = key
                order[nfin] = b
                nfin += 1
            else:
                spare[ninf] = b
                ninf += 1
    if extremes > 0 and nfin > 2 * extremes:
        _sort_extremes(order, nfin, kk, extremes, mark)
    else:
        perm = np.argsort(kk[:nfin], kind="mergesort")
        codes = order[:nfin].copy()
        for i in range(nfin):
            order[i] = codes[perm[i]]
    for i in range(ninf):
        order[nfin + i] = spare[i]
    return nfin + ninf


@compiled_only
def _sort_extremes(order, nfin, kk, m, mark):
    """Order ``order[:nfin]`` (categories of finite key ``kk[:nfin]``, both in code order on
    entry) so that the ``m`` lowest and the ``m`` highest lead and end it in key order (ties by
    code: what a stable sort puts first and last), the others between them in code order.
    Boosting's scan reads only those (:func:`group_categories_kernel`); a full sort of a
    1,000-level column's categories at every node cost most of its categorical search.
    ``mark``: bool scratch indexed by code (all False on entry and on return). Requires
    ``nfin > 2 m``."""
    lo_key = np.partition(kk[:nfin], m - 1)[m - 1]
    hi_key = np.partition(kk[:nfin], nfin - m)[nfin - m]
    n_lo = 0
    n_hi = 0
    for i in range(nfin):
        n_lo += kk[i] <= lo_key
        n_hi += kk[i] >= hi_key
    lo = np.empty(n_lo, np.int64)
    lk = np.empty(n_lo, np.float64)
    hi = np.empty(n_hi, np.int64)
    hk = np.empty(n_hi, np.float64)
    a = 0
    z = 0
    for i in range(nfin):
        if kk[i] <= lo_key:
            lo[a] = order[i]
            lk[a] = kk[i]
            a += 1
        if kk[i] >= hi_key:
            hi[z] = order[i]
            hk[z] = kk[i]
            z += 1
    lperm = np.argsort(lk, kind="mergesort")
    hperm = np.argsort(hk, kind="mergesort")
    for t in range(m):
        mark[lo[lperm[t]]] = True
        mark[hi[hperm[n_hi - m + t]]] = True
    spare = order[:nfin].copy()
    pos = 0
    for t in range(m):
        order[pos] = lo[lperm[t]]
        pos += 1
    for i in range(nfin):
        if not mark[spare[i]]:
            order[pos] = spare[i]
            pos += 1
    for t in range(m):
        order[pos] = hi[hperm[n_hi - m + t]]
        pos += 1
    for t in range(m):
        mark[lo[lperm[t]]] = False
        mark[hi[hperm[n_hi - m + t]]] = False


@kernel
def _permute_kernel(hist, cat_index, keys, out, orders, nb, extremes):
    """:func:`category_orders` and the gather of :func:`permute_categories` in one pass.

    Boosting searches one or two nodes per call, where NumPy's per-call costs (lexsort,
    take_along_axis, temporaries) were most of the categorical search (measured ~190 us of
    ~450 us per call on 7 features x 256 bins).

    ``nb (F,)``: feature ``f``'s categories are the bins below ``nb[f]`` (at most the
    ``B`` value bins); the bins from ``nb[f]`` on never hold rows, so they are the last of
    the empty categories in code order and are neither read nor gathered: ``out`` must
    already hold ``hist``'s values (zeros) there. With wide codes every feature's axis is
    as wide as the widest column (1,001 bins for a 1,000-level one), and a 200-level
    column's scan of 1,000 bins was most of its cost.

    ``extremes > 0`` (boosting: its ``max_cat_threshold``): of the categories of finite key,
    only the ``extremes`` lowest and highest are put in key order, the others between them
    in code order (:func:`_sort_extremes`), when there are more than ``2 extremes``.
    """
    n_nodes = hist.shape[0]
    nv = hist.shape[2] - 1
    c = hist.shape[3]
    kk = np.empty(nv, np.float64)
    spare = np.empty(nv, np.int64)
    mark = np.zeros(nv, np.bool_)
    for n in range(n_nodes):
        for j in range(cat_index.shape[0]):
            f = cat_index[j]
            nbf = min(nb[f], nv)
            npres = 0
            insertion = nbf <= _INSERTION_MAX_BINS and extremes == 0
            if not insertion:
                npres = _sort_present(hist, n, f, nbf, keys[n, j], kk, orders[n, j], spare, extremes, mark)
            for b in range(nbf if insertion else 0):
                present = False
                for k in range(c):
                    if hist[n, f, b, k] != 0.0:
                        present = True
                if present:
                    key = keys[n, j, b]
                    if not np.isfinite(key):
                        key = np.inf
                    kk[b] = key
                    # stable insertion: equal keys keep code order
                    i = npres
                    while i > 0 and kk[orders[n, j, i - 1]] > key:
                        orders[n, j, i] = orders[n, j, i - 1]
                        i -= 1
                    orders[n, j, i] = b
                    npres += 1
            i = npres
            for b in range(nbf):
                present = False
                for k in range(c):
                    if hist[n, f, b, k] != 0.0:
                        present = True
                if not present:
                    orders[n, j, i] = b
                    i += 1
            for b in range(nbf, nv):
                orders[n, j, b] = b
            for i in range(nbf):
                b = orders[n, j, i]
                for k in range(c):
                    out[n, f, i, k] = hist[n, f, b, k]


@compiled_only(inline="always")
def _category_hessian(hist, n, f, code, k):
    """Hessian sum of category ``code`` of feature ``f`` at node ``n`` (channels ``k:2k``)."""
    h = 0.0
    for j in range(k):
        h += hist[n, f, code, k + j]
    return h


@kernel
def group_categories_kernel(hist, permuted, orders, cat_index, keys, nb, parent, parent_count, use_count, k, max_cat,
                            min_group, ends, n_used):
    """Boosting's candidate layout of each categorical feature (LightGBM's categorical scan).

    After :func:`_permute_kernel` a categorical feature's bins hold its categories in key
    order (judged ones, of finite key, ascending; then those of infinite key; then the
    empty ones). LightGBM does not scan all prefixes of that order: it tries the ``i``
    lowest and the ``i`` highest judged categories on one side, ``i`` up to ``max_cat``
    and half the judged ones, and only where the categories added since the last candidate
    hold ``min_group`` rows or more. Each categorical feature's bins are rewritten here so
    that the ordinary prefix scan sees exactly those candidates:

    * the forward groups: the first judged categories, closed whenever a group reaches
      ``min_group`` rows (a row count estimated from the hessian, as ``min_samples_leaf``
      is; the hessian itself without ``use_count``), within the first ``m = min(max_cat,
      (judged + 1) // 2)``;
    * one middle bin: every category in no closed group (judged, of infinite key, empty),
      when there is one;
    * the backward groups, in ascending order: closed the same way from the highest
      judged category down, within the top ``m`` and above the forward groups.

    A threshold after a forward group sends its lowest categories left (LightGBM's
    forward candidate); one after the middle bin or a backward group sends the highest
    right (LightGBM's backward candidate, sides mirrored: the gain is symmetric). Bins past
    the layout are zero, so the scan skips them. ``orders[n, j]`` is rewritten into the
    layout's category order and ``ends[n, j, b]`` is the number of its categories in bins
    ``0..b``, so a split at bin ``b`` sends ``orders[n, j, :ends[n, j, b]]`` left. A bin's
    channels are summed over its categories in that order.

    Parameters
    ----------
    hist : ndarray of float64, shape (N, F, B + 1, C)
        The unpermuted histograms.
    permuted : ndarray of float64, shape (N, F, >= B + 1, C)
        :func:`_permute_kernel`'s output; its categorical features' value bins are rewritten.
    orders : ndarray of int64, shape (N, Fc, B)
    cat_index : ndarray of int64, shape (Fc,)
    keys : ndarray of float64, shape (N, Fc, B)
        The keys the order was sorted by (non-finite: not judged).
    nb : ndarray of int64, shape (F,)
    parent : ndarray of float64, shape (N, C)
    parent_count : ndarray of float64, shape (N,) (read when ``use_count``)
    use_count : bool
    k : int
        Outputs (hessians in channels ``k:2k``).
    max_cat : int
    min_group : float
    ends : ndarray of int64, shape (N, Fc, B)
        Written.
    n_used : ndarray of int64, shape (N, Fc)
        Written: the layout's bins (the scan may stop there).
    """
    n_nodes = hist.shape[0]
    nv = hist.shape[2] - 1
    c = hist.shape[3]
    starts = np.empty(nv, np.int64)  # backward groups' first positions, from the top down
    copy = np.empty(nv, np.int64)
    for n in range(n_nodes):
        per_hess = 1.0
        if use_count:
            hp = 0.0
            for j in range(k):
                hp += parent[n, k + j]
            per_hess = parent_count[n] / hp if hp > 0 else 0.0
        for jf in range(cat_index.shape[0]):
            f = cat_index[jf]
            nbf = min(nb[f], nv)
            judged = 0
            while judged < nbf:
                code = orders[n, jf, judged]
                present = False
                for ch in range(c):
                    if hist[n, f, code, ch] != 0.0:
                        present = True
                if not (present and np.isfinite(keys[n, jf, code])):
                    break
                judged += 1
            m = min(max_cat, (judged + 1) // 2)
            n_bins_used = 0
            # forward groups over orders[0 : m]
            fwd = 0
            rows = 0.0
            for i in range(m):
                rows += _category_hessian(hist, n, f, orders[n, jf, i], k) * per_hess
                if rows >= min_group:
                    ends[n, jf, n_bins_used] = i + 1
                    n_bins_used += 1
                    fwd = i + 1
                    rows = 0.0
            # backward groups over orders[judged - 1] downwards, within the top m, above fwd
            low = judged
            rows = 0.0
            n_back = 0
            for i in range(m):
                pos = judged - 1 - i
                if pos < fwd:
                    break
                rows += _category_hessian(hist, n, f, orders[n, jf, pos], k) * per_hess
                if rows >= min_group:
                    starts[n_back] = pos
                    n_back += 1
                    low = pos
                    rows = 0.0
            # the layout's order: forward categories, the middle ones (judged, unjudged,
            # empty), the backward ones ascending
            middle = (low - fwd) + (nbf - judged)
            for i in range(nbf):
                copy[i] = orders[n, jf, i]
            for i in range(judged, nbf):
                orders[n, jf, low + (i - judged)] = copy[i]
            for i in range(low, judged):
                orders[n, jf, fwd + middle + (i - low)] = copy[i]
            # bins: forward groups (ends already written), middle, backward groups ascending
            if middle > 0:  # (without it the layout still fits the feature's nbf bins)
                ends[n, jf, n_bins_used] = fwd + middle
                n_bins_used += 1
            for g in range(n_back - 1, -1, -1):
                stop = starts[g - 1] if g > 0 else judged  # the group [starts[g], stop)
                ends[n, jf, n_bins_used] = fwd + middle + (stop - low)
                n_bins_used += 1
            n_used[n, jf] = n_bins_used
            for b in range(n_bins_used, nbf):
                ends[n, jf, b] = nbf
            start = 0
            for b in range(nbf):
                for ch in range(c):
                    permuted[n, f, b, ch] = 0.0
                if b < n_bins_used:
                    for i in range(start, ends[n, jf, b]):
                        code = orders[n, jf, i]
                        for ch in range(c):
                            permuted[n, f, b, ch] += hist[n, f, code, ch]
                    start = ends[n, jf, b]


def group_categories_reference(stats, keys, parent_rows_per_hess, k, max_cat, min_group):
    """Slow reference of :func:`group_categories_kernel` for one node and feature.

    Parameters
    ----------
    stats : ndarray of float64, shape (B, C)
        The feature's per-category sums at the node.
    keys : ndarray of float64, shape (B,)
    parent_rows_per_hess : float
        Rows per unit of hessian at the node (1.0 without row counts).
    k : int
    max_cat : int
    min_group : float

    Returns
    -------
    list of list of int
        The bins' categories, in scan order (forward groups, the middle if any, backward groups).
    """
    present = [b for b in range(stats.shape[0]) if np.any(stats[b] != 0.0)]
    judged = sorted((b for b in present if np.isfinite(keys[b])), key=lambda b: (keys[b], b))
    unjudged = [b for b in present if not np.isfinite(keys[b])]
    empty = [b for b in range(stats.shape[0]) if b not in set(present)]
    m = min(max_cat, (len(judged) + 1) // 2)

    def rows(b):
        return float(np.sum(stats[b, k:2 * k])) * parent_rows_per_hess

    forward, group, acc = [], [], 0.0
    for b in judged[:m]:
        group.append(b)
        acc += rows(b)
        if acc >= min_group:
            forward.append(group)
            group, acc = [], 0.0
    fwd = sum(len(g) for g in forward)
    backward, group, acc = [], [], 0.0
    for i in range(m):
        pos = len(judged) - 1 - i
        if pos < fwd:
            break
        group.insert(0, judged[pos])
        acc += rows(judged[pos])
        if acc >= min_group:
            backward.insert(0, group)
            group, acc = [], 0.0
    low = len(judged) - sum(len(g) for g in backward)
    middle = judged[fwd:low] + unjudged + empty
    return forward + ([middle] if middle else []) + backward


def permute_categories(hist, categorical, keys_fn, extremes=0):
    """Histograms with each categorical feature's value bins in scan order.

    Parameters
    ----------
    hist : ndarray of float64, shape (N, F, B + 1, C)
        Reduced histograms, the last bin the missing one.
    categorical : ndarray of bool, shape (F,)
    keys_fn : callable
        ``keys_fn(stats (N, Fc, B, C)) -> (N, Fc, B)`` category keys.
    extremes : int, default 0
        Boosting's ``max_cat_threshold``: order only the lowest and highest categories
        (:func:`_permute_kernel`); 0 orders them all.

    Returns
    -------
    permuted : ndarray of float64, shape (N, F, B + 1, C)
        A copy (``hist`` itself when no feature is categorical).
    orders : ndarray of int64, shape (N, Fc, B)
        Scan order of each categorical feature (:func:`category_orders`).
    cat_index : ndarray of int64, shape (Fc,)
        Which features of ``hist`` they are.
    """
    cat_index = np.flatnonzero(np.asarray(categorical, dtype=bool))
    if len(cat_index) == 0:
        return hist, np.zeros(hist.shape[:1] + (0, hist.shape[2] - 1), dtype=np.int64), cat_index
    nv = hist.shape[2] - 1
    keys = np.ascontiguousarray(keys_fn(hist[:, cat_index, :nv, :]), dtype=np.float64)
    permuted = hist.copy()
    orders = np.empty(keys.shape, dtype=np.int64)
    _permute_kernel(hist, cat_index.astype(np.int64), keys, permuted, orders, np.full(hist.shape[1], nv, np.int64),
                    int(extremes))
    return permuted, orders, cat_index


@kernel
def drop_stray_categories(sibling, parent, cat_local, p0, p1, n_value_bins, rel_tol):
    """Zero, in place, the categories of a sibling histogram that only rounding put there.

    A sibling's histogram is its parent's minus its built sibling's. A category with no
    rows in it should come out zero, but its parent and sibling sums add the same rows in
    other orders (threads, ranks), so it may keep a rounding residue: it would then count
    as present (:func:`_permute_kernel`), take a key and a place in the scan, and the split's
    bitset would include or leave it depending on the rank count. A category whose
    presence channels ``p0:p1`` (the hessians of boosting: sums of nonnegative terms) are
    all within ``rel_tol`` of zero relative to the parent's totals of those channels is
    taken to be empty and zeroed, as it is exactly in a built histogram. Compiled: boosting
    calls it at every split step (a NumPy version cost ~30 us per call).

    Parameters
    ----------
    sibling : ndarray of float64, shape (F, B + 1, C)
        The subtracted histogram (written).
    parent : ndarray of float64, shape (F, B + 1, C)
    cat_local : ndarray of int64, shape (Fc,)
        Categorical features, as indices into the first axis.
    p0, p1 : int
        The presence channels ``p0:p1``.
    n_value_bins : int
        ``B``: value bins (the missing bin, after them, is left alone).
    rel_tol : float
    """
    nbins = parent.shape[1]
    c = sibling.shape[2]
    bound = np.empty(max(p1 - p0, 0), np.float64)
    for j in range(cat_local.shape[0]):
        f = cat_local[j]
        for ch in range(p0, p1):
            total = 0.0
            for q in range(nbins):
                total += parent[f, q, ch]
            bound[ch - p0] = rel_tol * abs(total)
        for b in range(n_value_bins):
            stray = True
            for ch in range(p0, p1):
                if abs(sibling[f, b, ch]) > bound[ch - p0]:
                    stray = False
                    break
            if stray:
                for ch in range(c):
                    sibling[f, b, ch] = 0.0


@kernel
def left_bitsets_kernel(orders, cat_pos, feature, bins, bits):
    """Compiled :func:`left_bitsets`, in place: ``bits`` (zeros on entry) gets each categorical
    split's left categories and ``bins`` :data:`forest.engine.tree.CATEGORICAL_SPLIT`.

    ``cat_pos[f]`` is feature ``f``'s index into ``orders``' second axis, ``-1`` for a numeric
    feature; ``feature < 0`` marks a node without a split.
    """
    for node in range(feature.shape[0]):
        f = feature[node]
        if f < 0 or cat_pos[f] < 0:
            continue
        j = cat_pos[f]
        for i in range(bins[node] + 1):
            code = orders[node, j, i]
            bits[node, code >> 6] |= np.uint64(1) << np.uint64(code & 63)
        bins[node] = CATEGORICAL_SPLIT


def left_bitsets(orders, cat_index, feature, bins):
    """Bitsets of the chosen splits, and their ``bin_threshold`` values.

    Parameters
    ----------
    orders, cat_index
        From :func:`permute_categories`.
    feature : ndarray of int, shape (N,)
        Chosen feature per node (index into ``hist``'s features; ``< 0``: no split).
    bins : ndarray of int, shape (N,)
        Chosen threshold in the (permuted) bin order.

    Returns
    -------
    bits : ndarray of uint64, shape (N, W)
        The left categories of categorical splits, zero elsewhere; ``W =
        cat_words(B)`` (:func:`forest.engine.tree.cat_words`, ``B`` the value bins).
    bin_threshold : ndarray of int32, shape (N,)
        ``bins``, with :data:`forest.engine.tree.CATEGORICAL_SPLIT` at categorical splits.
    """
    n = len(feature)
    bits = np.zeros((n, cat_words(orders.shape[2])), dtype=CAT_BITS_DTYPE)
    out_bins = np.asarray(bins, dtype=np.int32).copy()
    position = {int(f): j for j, f in enumerate(cat_index)}
    for node in range(n):
        j = position.get(int(feature[node]))
        if j is None:
            continue
        chosen = orders[node, j, :int(bins[node]) + 1]
        np.bitwise_or.at(bits[node], chosen >> 6, np.uint64(1) << (chosen & 63).astype(np.uint64))
        out_bins[node] = CATEGORICAL_SPLIT
    return bits, out_bins


def bits_to_halves(bits):
    """uint64 bitsets ``(n, W)`` as int64 32-bit halves ``(n, 2W)`` (exact in float64 records)."""
    bits = np.asarray(bits, dtype=np.uint64)
    out = np.empty((bits.shape[0], 2 * bits.shape[1]), dtype=np.int64)
    out[:, 0::2] = (bits & np.uint64(0xFFFFFFFF)).astype(np.int64)
    out[:, 1::2] = (bits >> np.uint64(32)).astype(np.int64)
    return out


def halves_to_bits(halves):
    """Inverse of :func:`bits_to_halves`."""
    h = np.asarray(halves, dtype=np.int64).astype(np.uint64)
    return (h[:, 0::2] | (h[:, 1::2] << np.uint64(32))).astype(np.uint64)

"""How an innerNode routes a row: the one home of the "goes left" rule.

A split node ``(feature f, bin threshold b, threshold t, missing_left m)`` sends a row

* on binned codes (uint8, :class:`histogram.binning.BinMapper`): left when
  ``code <= b``, and the missing bin left exactly when ``m``;
* on raw float features: left when ``x <= t``, and NaN left exactly when ``m``.

The two agree because ``x <= bin_thresholds_[f][b]`` exactly when ``bin(x) <= b``.
A categorical split (``b == CATEGORICAL_SPLIT``, :mod:`forest.engine.tree`) sends a row
left when its code's bit is set in the node's bitset ``cat_bits[node]``; a raw
categorical value *is* its code (:mod:`histogram.categories` encodes categories as
the integers their bins are), so :func:`goes_left_raw` tests the same bit, and a value
that is no code of the forest's (an unseen category arrives as NaN) goes where
missing goes.
Every kernel that partitions rows or walks trees (:mod:`forest.engine.partition`,
:mod:`forest.engine.local_growth`, :mod:`forest.engine.predictor`, leaf re-estimation in
:mod:`forest.engine.leaf_estimation`) calls the Numba functions here, and the slow references call
:func:`goes_left_codes`, so the rule cannot drift between them.
"""
import numpy as np

from histogram.jit import kernel, compiled_only, empty, zeros


@kernel(inline="always")
def goes_left_code(code, bin_threshold, missing_left, missing_bin):
    """Whether a binned row goes left (branch-free: the side is often a coin flip)."""
    return ((code <= bin_threshold) & (code != missing_bin)) | ((code == missing_bin) & (missing_left != 0))


@kernel(inline="always")
def goes_left_value(x, threshold, missing_left):
    """Whether a raw feature value goes left (NaN is missing)."""
    if np.isnan(x):
        return missing_left != 0
    return x <= threshold


@kernel(inline="always")
def in_bitset(bits, node, code):
    """Whether value bin ``code`` (0 <= code < 64 * words) is set in ``bits[node]``."""
    return ((bits[node, code >> 6] >> np.uint64(code & 63)) & np.uint64(1)) != np.uint64(0)


@kernel(inline="always")
def goes_left_split(code, node, bin_threshold, missing_left, cat_bits, missing_bin):
    """:func:`goes_left_code` for any split: numeric thresholds and category sets.

    ``cat_bits`` is the forest's ``(n_nodes, words)`` bitset array (width 0 without
    categorical splits, when the categorical branch is never taken).
    """
    thr = bin_threshold[node]
    if thr >= 0:
        return goes_left_code(code, thr, missing_left[node], missing_bin)
    if code == missing_bin:
        return missing_left[node] != 0
    return in_bitset(cat_bits, node, np.int64(code))


@kernel(inline="always")
def goes_left_raw(x, node, bin_threshold, threshold, missing_left, cat_bits):
    """:func:`goes_left_value` for any split (a categorical value is its code as a float)."""
    if bin_threshold[node] >= 0:
        return goes_left_value(x, threshold[node], missing_left[node])
    if np.isnan(x) or x < 0.0 or x >= 64.0 * cat_bits.shape[1] or x != np.floor(x):
        return missing_left[node] != 0
    return in_bitset(cat_bits, node, np.int64(x))


@kernel(inline="always")
def walk_binned(binned, i, node, feature, bin_threshold, missing_left, left, right, missing_bin, cat_bits):
    """Leaf reached by row ``i`` of feature-major codes ``binned`` from ``node``.

    ``left`` / ``right`` hold ids into the same arrays as ``node`` (the packed
    layout of :func:`forest.engine.tree.pack_trees`); leaves have ``feature < 0``.

    Node ids, row ids and features are indexed as unsigned (they are never negative):
    with a signed index Numba emits a negative-index wraparound at every access, which
    cost more than the walk itself (see :mod:`forest.engine.partition`).
    """
    ui = np.uint64(i)
    nd = np.uint64(node)
    f = feature[nd]
    while f >= 0:
        code = np.int32(binned[np.uint64(f), ui])
        if goes_left_split(code, nd, bin_threshold, missing_left, cat_bits, missing_bin):
            nd = np.uint64(left[nd])
        else:
            nd = np.uint64(right[nd])
        f = feature[nd]
    return np.int64(nd)


@kernel(inline="always")
def walk_raw(X, i, node, feature, bin_threshold, threshold, missing_left, left, right, cat_bits):
    """Leaf reached by row ``i`` of raw features ``X`` (n, n_features) from ``node``."""
    while feature[node] >= 0:
        if goes_left_raw(X[i, feature[node]], node, bin_threshold, threshold, missing_left, cat_bits):
            node = left[node]
        else:
            node = right[node]
    return node


def goes_left_codes(codes, bin_threshold, missing_left, missing_bin):
    """NumPy version of :func:`goes_left_code` for arrays of codes (slow references).

    Parameters
    ----------
    codes : ndarray of int, shape (n,)
    bin_threshold : int
    missing_left : bool
    missing_bin : int

    Returns
    -------
    ndarray of bool, shape (n,)
    """
    codes = np.asarray(codes, dtype=np.int64)
    return np.where(codes == missing_bin, bool(missing_left), codes <= bin_threshold)


def goes_left_set(codes, left_bins, missing_left, missing_bin):
    """NumPy version of a categorical split (slow references): code in ``left_bins``.

    Parameters
    ----------
    codes : ndarray of int, shape (n,)
    left_bins : array-like of int
        The value bins that go left.
    missing_left : bool
    missing_bin : int

    Returns
    -------
    ndarray of bool, shape (n,)
    """
    codes = np.asarray(codes, dtype=np.int64)
    return np.where(codes == missing_bin, bool(missing_left), np.isin(codes, np.asarray(left_bins, dtype=np.int64)))


# ---------------------------------------------------------------------------------
# Batch walks: compact node records, row codes from the forest's own thresholds,
# and a level-synchronous walk of a block of rows through one tree.
#
# A row reaches the same leaf as in :func:`walk_raw`, by this argument. Let
# ``T_f`` be the sorted distinct thresholds of feature ``f`` over the forest's
# innerNodes and ``code(x) = #{t in T_f : t < x}`` (NaN: :data:`RECORD_MISSING`).
# For a split ``x <= T_f[b]``: ``x <= T_f[b]`` exactly when fewer than ``b + 1``
# thresholds lie below ``x``, i.e. ``code(x) <= b``. So the raw rule becomes the
# code rule of :func:`goes_left_code` with missing bin 255, whatever the thresholds
# are (no bin mapper involved), and a feature with at most 254 distinct thresholds
# fits a uint8 code.
#
# Record (uint64) of an innerNode, so one load fetches everything a step needs:
#   bits  0-31  (first child's record id << 2) | left child internal | right child internal << 1
#               (the right child's record follows the left child's: siblings are stored
#               in pairs, breadth-first, so a tree's levels are contiguous)
#   bits 32-39  b + s, bits 40-47  s   (s = missing_left, see goes_left_shifted)
#   bits 48-62  feature, bit 63 set.
# A leafNode's record holds its compact leaf index (bit 63 clear).

#: Code of a missing value (NaN) in the batch walk.
RECORD_MISSING = 255
#: Largest number of distinct thresholds per feature a uint8 code can separate.
RECORD_MAX_THRESHOLDS = 254
#: Features and record ids the record layout can address.
RECORD_MAX_FEATURES = 1 << 15
RECORD_MAX_NODES = 1 << 30

_LOW32 = np.uint64(0xFFFFFFFF)


@kernel(inline="always")
def goes_left_shifted(code, shifted_threshold, shift):
    """:func:`goes_left_code` with missing bin 255, in the form the batch walk uses.

    ``((code + s) mod 256) <= b + s`` with ``s = missing_left`` (0 or 1) and
    ``b <= 253``: for ``s = 0`` it is ``code <= b`` (255 > b: missing goes right);
    for ``s = 1`` the missing code wraps to 0 (left) and every other code moves up
    by one on both sides. Three integer operations and no branch.
    """
    return ((code + shift) & np.uint64(0xFF)) <= shifted_threshold


@kernel
def _threshold_ranks(feature, threshold, n_features):
    """Per-feature sorted distinct thresholds and each innerNode's rank among them.

    Returns ``(table, width, n_thresholds, used, rank)``, or ``width = 0`` when a
    threshold is NaN or a feature has more than RECORD_MAX_THRESHOLDS of them.
    """
    n_nodes = feature.shape[0]
    count = zeros(n_features + 1, np.int64)
    for i in range(n_nodes):
        if feature[i] >= 0:
            if threshold[i] != threshold[i]:
                return zeros(0, np.float64), 0, count[:n_features], count[:0], count[:0]
            count[feature[i] + 1] += 1
    for f in range(n_features):
        count[f + 1] += count[f]
    members = empty(count[n_features], np.int64)   # inner nodes grouped by feature
    fill = count[:n_features].copy()
    for i in range(n_nodes):
        if feature[i] >= 0:
            members[fill[feature[i]]] = i
            fill[feature[i]] += 1
    rank = zeros(n_nodes, np.int64)
    n_thresholds = zeros(n_features, np.int64)
    distinct = empty(count[n_features], np.float64)
    for f in range(n_features):
        group = members[count[f]:count[f + 1]]
        values = threshold[group]
        order = np.argsort(values)
        k = -1
        for j in range(order.shape[0]):
            v = values[order[j]]
            if k < 0 or v != distinct[count[f] + k]:   # -0.0 == 0.0: one threshold
                k += 1
                distinct[count[f] + k] = v
            rank[group[order[j]]] = k
        n_thresholds[f] = k + 1
    most = n_thresholds.max() if n_features else 0
    if most > RECORD_MAX_THRESHOLDS:
        return zeros(0, np.float64), 0, n_thresholds, count[:0], count[:0]
    width = 1
    while width < most + 1:
        width *= 2
    table = np.full(n_features * width, np.inf)
    n_used = 0
    for f in range(n_features):
        table[f * width: f * width + n_thresholds[f]] = distinct[count[f]: count[f] + n_thresholds[f]]
        n_used += n_thresholds[f] > 0
    used = empty(n_used, np.int64)
    n_used = 0
    for f in range(n_features):
        if n_thresholds[f] > 0:
            used[n_used] = f
            n_used += 1
    return table, width, n_thresholds, used, rank


@kernel
def _encode_records(feature, rank, missing_left, left, right, offsets):
    n_trees = offsets.shape[0] - 1
    n_nodes = feature.shape[0]
    records = zeros(n_nodes, np.uint64)
    roots = empty(n_trees + 1, np.int64)
    leaf_starts = empty(n_trees + 1, np.int64)
    source = empty(n_nodes, np.int64)       # record id -> packed node id
    depth = zeros(n_nodes, np.int64)        # record id -> depth in its tree
    sure_passes = zeros(n_trees, np.int64)
    n_leaves = 0
    for i in range(n_nodes):
        n_leaves += feature[i] < 0
    leaf_nodes = empty(n_leaves, np.int64)  # compact leaf index -> packed node id
    pos = 0
    leaf = 0
    for t in range(n_trees):
        roots[t] = pos
        leaf_starts[t] = leaf
        source[pos] = offsets[t]
        depth[pos] = 0
        pos += 1
        head = roots[t]
        shallowest_leaf = -1
        while head < pos:                            # breadth-first: children in pairs
            node = source[head]
            f = feature[node]
            if f >= 0:
                lo, hi = left[node], right[node]
                source[pos] = lo
                source[pos + 1] = hi
                depth[pos] = depth[head] + 1
                depth[pos + 1] = depth[head] + 1
                s = np.uint64(missing_left[node] != 0)
                link = (np.uint64(pos) << np.uint64(2)) | np.uint64(feature[lo] >= 0) \
                    | (np.uint64(feature[hi] >= 0) << np.uint64(1))
                records[head] = link | ((np.uint64(rank[node]) + s) << np.uint64(32)) | (s << np.uint64(40)) \
                    | (np.uint64(f) << np.uint64(48)) | (np.uint64(1) << np.uint64(63))
                pos += 2
            else:
                records[head] = np.uint64(leaf)
                leaf_nodes[leaf] = node
                leaf += 1
                if shallowest_leaf < 0:              # breadth-first: the first leaf is the shallowest
                    shallowest_leaf = depth[head]
            head += 1
        sure_passes[t] = max(shallowest_leaf - 1, 0)
    roots[n_trees] = pos
    leaf_starts[n_trees] = leaf
    return records, roots, leaf_starts, leaf_nodes, sure_passes


def encode_records(packed, n_features):
    """Record layout of a packed forest for :func:`walk_block` (see the comment above).

    Parameters
    ----------
    packed : dict
        :func:`forest.engine.tree.pack_trees` layout.
    n_features : int
        Columns of the rows to be routed.

    Returns
    -------
    dict or None
        ``records`` (uint64, one per node), ``roots`` (int64, ``(n_trees + 1,)``: tree
        ``t`` owns records ``roots[t]:roots[t+1]``, its root first), ``leaf_starts``
        (int64, ``(n_trees + 1,)``: the tree's compact leaf indices), ``leaf_nodes``
        (int64: compact leaf index -> packed node id), ``table`` (float64,
        ``(n_features * width,)``: row ``f`` holds ``T_f`` then ``+inf``), ``width``
        (a power of two above every ``len(T_f)``), ``used`` (int64: the features
        some innerNode splits on), ``sure_passes`` (int64, ``(n_trees,)``: levels every
        row passes without meeting a leaf, the tree's shallowest leaf depth minus one;
        :func:`walk_block` takes them without compacting). ``None`` when the forest
        does not fit the layout: more than :data:`RECORD_MAX_THRESHOLDS` thresholds on a feature, a NaN
        threshold, too many features or nodes.
    """
    feature = np.ascontiguousarray(packed["feature"], dtype=np.int32)
    if len(feature) >= RECORD_MAX_NODES or n_features > RECORD_MAX_FEATURES:
        return None
    threshold = np.ascontiguousarray(packed["threshold"], dtype=np.float64)
    table, width, _, used, rank = _threshold_ranks(feature, threshold, int(n_features))
    if width == 0:
        return None
    records, roots, leaf_starts, leaf_nodes, sure_passes = _encode_records(
        feature, rank, np.ascontiguousarray(packed["missing_left"], dtype=np.uint8),
        np.ascontiguousarray(packed["left"], dtype=np.int32), np.ascontiguousarray(packed["right"], dtype=np.int32),
        np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64))
    return dict(records=records, roots=roots, leaf_starts=leaf_starts, leaf_nodes=leaf_nodes, table=table,
                width=int(width), used=used, sure_passes=sure_passes)


@compiled_only
def code_rows(X, a, n, table, width, used, codes, stride):
    """Codes of rows ``X[a:a+n]`` for the batch walk, feature-major.

    ``codes[f * stride + r] = #{t in T_f : t < X[a + r, f]}`` (255 for NaN) for
    each feature ``f`` in ``used``, by a branch-free binary search over the row of
    ``table`` (``width`` a power of two).

    Parameters
    ----------
    X : ndarray of float64, shape (n_rows, n_features), C-contiguous
    a, n : int
    table : ndarray of float64, shape (n_features * width,)
    width : int
    used : ndarray of int64
    codes : ndarray of uint8, shape (>= n_features * stride,)
    stride : int
    """
    # The search sets the code's bits from the top: bit s is whether the threshold
    # below the candidate ``lo | (2**s - 1)`` is under x. It is written as an OR of
    # a shifted comparison on purpose: the form ``lo += (t < x) * h`` becomes a
    # select, which LLVM's x86 back end turned into a branch on the data (half of
    # them mispredicted: 57 ns per code against 16 ns for this form, 1 thread).
    one = np.uint64(1)
    log_width = np.uint64(0)
    while (one << log_width) < np.uint64(width):
        log_width += one
    for u in range(used.shape[0]):
        f = used[u]
        base = np.uint64(f * width)
        out = np.uint64(f * stride)
        for r in range(n):
            x = X[a + r, f]
            lo = np.uint64(0)
            s = log_width
            while s > 0:
                s -= one
                lo |= np.uint64(table[base + (lo | ((one << s) - one))] < x) << s
            codes[out + np.uint64(r)] = np.uint8(RECORD_MISSING) if x != x else np.uint8(lo)


@kernel(inline="always")
def _step(codes, ustride, records, node, r):
    """One row at one innerNode of the batch walk: ``(link, right)``.

    ``link`` is the record's low word (children's position << 2 | their "internal"
    bits), ``right`` 1 when the row goes to the right child (:func:`goes_left_shifted`).
    """
    rec = records[node]
    f = (rec >> np.uint64(48)) & np.uint64(0x7FFF)
    code = np.uint64(codes[f * ustride + r])
    right = np.uint64(1) - np.uint64(goes_left_shifted(code, (rec >> np.uint64(32)) & np.uint64(0xFF),
                                                        (rec >> np.uint64(40)) & np.uint64(0xFF)))
    return rec & _LOW32, right


@compiled_only
def walk_block(codes, stride, records, root, sure_passes, rows, m, act, leaf):
    """Route rows ``rows[:m]`` of a coded block through one tree, level by level.

    Each pass over the active rows moves every row one level down, with no branch
    on the row's data: rows are independent, so the processor overlaps their
    node and code loads. Rows that reach a leaf drop out of the active list
    (compacted in place). The first ``sure_passes`` levels cannot end at a leaf,
    so they update every row in place and skip the compaction and the leaf store:
    a third fewer instructions per level, on the levels every row walks.

    Parameters
    ----------
    codes : ndarray of uint8
        Row ``r``'s code of feature ``f`` at ``f * stride + r`` (:func:`code_rows`).
    stride : int
    records : ndarray of uint64
        :func:`encode_records` layout.
    root : int
        Record id of the tree's root.
    sure_passes : int
        Levels below the root that hold no leaf (:func:`encode_records`); 0 is
        always correct.
    rows : ndarray of uint32, shape (>= m,)
        Block-local rows to route (< 2**32).
    m : int
    act : ndarray of uint64, shape (>= m,)
        Scratch.
    leaf : ndarray of uint32
        ``leaf[r]`` receives the record id of the leaf row ``r`` reaches.
    """
    low = _LOW32
    one = np.uint64(1)
    top = np.uint64(root) << np.uint64(32)
    if records[root] >> np.uint64(63) == 0:
        for j in range(m):
            leaf[rows[j]] = np.uint32(root)
        return
    for j in range(m):
        act[j] = top | np.uint64(rows[j])
    ustride = np.uint64(stride)
    for _ in range(sure_passes):
        for j in range(m):
            state = act[j]
            r = state & low
            link, right = _step(codes, ustride, records, state >> np.uint64(32), r)
            act[j] = ((link >> np.uint64(2)) + right) << np.uint64(32) | r
    while m > 0:
        k = np.uint64(0)
        for j in range(m):
            state = act[j]
            r = state & low
            link, right = _step(codes, ustride, records, state >> np.uint64(32), r)
            child = (link >> np.uint64(2)) + right
            leaf[r] = np.uint32(child)
            act[k] = (child << np.uint64(32)) | r
            k += (link >> right) & one          # the child's "internal" bit
        m = k

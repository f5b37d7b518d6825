"""Tree-ensemble prediction: Numba kernels over the packed-forest layout.

This module owns routing rows through trees, for every model in ``forest``:

* on raw float features ``X`` of shape ``(n, n_features)``;
* on binned features ``binned`` of shape ``(n_features, n)`` (uint8, feature-major,
  as :class:`histogram.binning.BinMapper` produces);

both by the rule of :mod:`forest.engine.routing`.

Results are either the leaf reached in every tree (``(n, n_trees)`` tree-local node
ids, for leaf statistics such as the causal forest's moment averages) or the sum of
the reached leaves' output vectors (``(n, n_outputs)``, for boosting and regression).
Kernels run in parallel over chunks of rows (``numba.prange``; small inputs serially); a forest goes in as the dict
of :func:`forest.engine.tree.pack_trees`. :func:`predict_reference` is a plain-Python
traversal used by tests.

Batch prediction on raw features (:data:`BATCH_MIN_ROWS` rows or more) takes the
blocked route: the forest is re-encoded once per call into 8-byte node records
(:func:`forest.engine.routing.encode_records`: breadth-first, siblings adjacent, leaf
values compacted per tree); a block of :data:`ROW_BLOCK` rows is turned into uint8
codes against the forest's own thresholds (:func:`forest.engine.routing.code_rows`, exact:
``x <= t`` iff ``code <= b``), and then walks one tree at a time
(:func:`forest.engine.routing.walk_block`) while that tree's records and leaf values sit
in L1/L2, adding each row's leaf vector before the next tree. Every row still adds
its trees' leaf vectors in tree order, onto the same starting value, so the sums
are bitwise those of the per-row walk. Why this is fast where the per-row walk is
not: walking rows outer and trees inner touches every tree's nodes once per row
(a forest of 200 trees of 700 nodes is 10 MB: one L2 miss per level), and a
row's walk is one chain of dependent loads; the level-synchronous block walk
keeps one tree hot and gives the processor hundreds of independent chains, with
no branch on the data. ``benchmarks/bench_predict.py`` measures the rates.
"""
import numba
import numpy as np

from histogram.jit import kernel, empty, zeros
from forest._validation import check_codes
from forest.profiling import phase
from forest.engine.routing import code_rows, encode_records, walk_binned, walk_block, walk_raw
from forest.engine.tree import CATEGORICAL_SPLIT, Tree, bitset_bins, pack_trees, packed_cat_bits

_PACKED_KEYS = ("feature", "threshold", "bin_threshold", "missing_left", "left", "right", "value", "tree_offsets")


# Each kernel is a serial loop over rows [a, b) plus a parallel driver over row chunks;
# small inputs run the serial loop directly, because starting the thread pool costs
# more than routing a few thousand rows (much more on an oversubscribed machine).
_PARALLEL_MIN_ROWS = 4096


@kernel
def _leaves_raw(X, feature, bin_threshold, threshold, missing_left, cat_bits, left, right, offsets, out, a, b):
    n_trees = offsets.shape[0] - 1
    for i in range(a, b):
        for t in range(n_trees):
            root = offsets[t]
            out[i, t] = walk_raw(X, i, root, feature, bin_threshold, threshold, missing_left, left, right,
                                 cat_bits) - root


@kernel
def _values_raw(X, feature, bin_threshold, threshold, missing_left, cat_bits, left, right, value, offsets, out, a, b):
    n_trees = offsets.shape[0] - 1
    k = value.shape[1]
    for i in range(a, b):
        for t in range(n_trees):
            leaf = walk_raw(X, i, offsets[t], feature, bin_threshold, threshold, missing_left, left, right, cat_bits)
            for j in range(k):
                out[i, j] += value[leaf, j]


@kernel
def _leaves_binned(binned, rows, feature, bin_threshold, missing_left, cat_bits, left, right, offsets, missing_bin, out,
                   a, b):
    n_trees = offsets.shape[0] - 1
    for r in range(a, b):
        i = rows[r]
        for t in range(n_trees):
            root = offsets[t]
            out[r, t] = walk_binned(binned, i, root, feature, bin_threshold, missing_left, left, right,
                                     missing_bin, cat_bits) - root


@kernel
def _values_binned(binned, rows, feature, bin_threshold, missing_left, cat_bits, left, right, value, offsets,
                   missing_bin, out, a, b):
    n_trees = offsets.shape[0] - 1
    k = value.shape[1]
    for r in range(a, b):
        i = rows[r]
        for t in range(n_trees):
            leaf = walk_binned(binned, i, offsets[t], feature, bin_threshold, missing_left, left, right,
                                missing_bin, cat_bits)
            for j in range(k):
                out[r, j] += value[leaf, j]


@kernel(parallel=True)
def _par_leaves_raw(X, feature, bin_threshold, threshold, missing_left, cat_bits, left, right, offsets, out,
                    n_chunks):
    n = X.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        _leaves_raw(X, feature, bin_threshold, threshold, missing_left, cat_bits, left, right, offsets, out, c * chunk,
                    min(n, (c + 1) * chunk))


@kernel(parallel=True)
def _par_values_raw(X, feature, bin_threshold, threshold, missing_left, cat_bits, left, right, value, offsets, out,
                    n_chunks):
    n = X.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        _values_raw(X, feature, bin_threshold, threshold, missing_left, cat_bits, left, right, value, offsets, out,
                    c * chunk, min(n, (c + 1) * chunk))


@kernel(parallel=True)
def _par_leaves_binned(binned, rows, feature, bin_threshold, missing_left, cat_bits, left, right, offsets, missing_bin,
                       out, n_chunks):
    n = rows.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        _leaves_binned(binned, rows, feature, bin_threshold, missing_left, cat_bits, left, right, offsets, missing_bin,
                       out, c * chunk, min(n, (c + 1) * chunk))


@kernel(parallel=True)
def _par_values_binned(binned, rows, feature, bin_threshold, missing_left, cat_bits, left, right, value, offsets,
                       missing_bin, out, n_chunks):
    n = rows.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        _values_binned(binned, rows, feature, bin_threshold, missing_left, cat_bits, left, right, value, offsets,
                       missing_bin, out, c * chunk, min(n, (c + 1) * chunk))


#: Rows per block of :func:`_oob_binned`.
_OOB_BLOCK = 2048


@kernel
def _oob_binned(binned, codes, feature, bin_threshold, missing_left, cat_bits, left, right, value, offsets, missing_bin,
                acc, cnt, a, b):
    n_trees = offsets.shape[0] - 1
    k = value.shape[1]
    # Blocks of rows, trees outer within a block: one tree's nodes stay in cache while
    # a block's rows walk it (rows outer, trees inner thrashed all trees' nodes).
    for a0 in range(a, b, _OOB_BLOCK):
        b0 = min(b, a0 + _OOB_BLOCK)
        for t in range(n_trees):
            root = offsets[t]
            for i in range(a0, b0):
                if codes[t, i] != 0:  # not out of bag: no walk at all
                    continue
                leaf = walk_binned(binned, i, root, feature, bin_threshold, missing_left, left, right, missing_bin,
                                   cat_bits)
                for j in range(k):
                    acc[i, j] += value[leaf, j]
                cnt[i] += 1.0


@kernel(parallel=True)
def _par_oob_binned(binned, codes, feature, bin_threshold, missing_left, cat_bits, left, right, value, offsets,
                    missing_bin, acc, cnt, n_chunks):
    n = binned.shape[1]
    for c in numba.prange(n_chunks):
        _oob_binned(binned, codes, feature, bin_threshold, missing_left, cat_bits, left, right, value, offsets,
                    missing_bin, acc, cnt, c * n // n_chunks, (c + 1) * n // n_chunks)


#: Rows per block of the batch walk. A block's codes (``ROW_BLOCK`` bytes per used
#: feature) and its active list stay in L1/L2 while the block walks every tree; the
#: per-(block, tree) cost of bringing the tree's records and leaf values in from L3
#: is spread over this many rows.
ROW_BLOCK = 1024

#: Smallest input that takes the batch route. Building the record layout costs about
#: 100 ns per node (13 ms CPU for 200 trees of 670 nodes) and saves about as much per
#: (row, tree): so the batch route also needs at least as many (row, tree) pairs as
#: nodes. Single rows (latency) always take the per-row walk.
BATCH_MIN_ROWS = 256

_LOW32 = np.uint64(0xFFFFFFFF)


#: What a batch walk does with the leaf each row reaches (:func:`_batch_walk`).
_VALUES, _LEAVES, _OOB = 0, 1, 2


@kernel
def _batch_walk(X, records, roots, sure_passes, table, width, used, mode, leaf_values_t, leaf_map, oob_codes,
                values_out, leaves_out, cnt, a, b):
    """Rows ``[a, b)`` of ``X`` through every tree, a block of :data:`ROW_BLOCK` rows at a time.

    ``mode``: ``_VALUES`` adds each tree's leaf vector to ``values_out`` (trees in
    order); ``_LEAVES`` writes ``leaf_map[leaf]`` to ``leaves_out[:, t]``; ``_OOB``
    routes only rows with ``oob_codes[t, i] == 0`` and adds to ``values_out`` and
    ``cnt``. Arrays a mode does not use may be empty. ``leaf_values_t`` holds the
    leaf vectors output-major, shape ``(n_outputs, n_leaves)``.

    The sums of a block live output-major in ``block_sums`` while the block walks
    the trees: adding one output over the block's rows is then a short gather-add
    loop with a fixed stride, where a row-major sum per row (an inner loop over a
    handful of outputs) cost about three times as much (12 ns per (row, tree) for
    six outputs, a fifth of the whole prediction). Each value still receives its
    trees' leaf values in tree order onto its starting value: bitwise the same sums.
    """
    n_trees = roots.shape[0] - 1
    kv = leaf_values_t.shape[0] if mode != _LEAVES else 0
    codes = zeros(max(X.shape[1], 1) * ROW_BLOCK, np.uint8)
    rows = np.arange(ROW_BLOCK).astype(np.uint32)
    act = empty(ROW_BLOCK, np.uint64)
    leaf = empty(ROW_BLOCK, np.uint32)
    leaf_id = empty(ROW_BLOCK, np.uint64)
    block_sums = empty((kv, ROW_BLOCK), np.float64)
    for a0 in range(a, b, ROW_BLOCK):
        n = min(ROW_BLOCK, b - a0)
        code_rows(X, a0, n, table, width, used, codes, ROW_BLOCK)
        for r in range(n):
            for q in range(kv):
                block_sums[q, r] = values_out[a0 + r, q]
        for t in range(n_trees):
            m = n
            if mode == _OOB:
                m = 0
                for r in range(n):                # out-of-bag rows only (branch-free)
                    rows[m] = r
                    m += oob_codes[t, a0 + r] == 0
            walk_block(codes, ROW_BLOCK, records, roots[t], sure_passes[t], rows, m, act, leaf)
            if mode == _LEAVES:
                for r in range(n):
                    leaves_out[a0 + r, t] = leaf_map[records[leaf[r]] & _LOW32]
                continue
            for j in range(m):
                leaf_id[j] = records[leaf[rows[j]]] & _LOW32
            for q in range(kv):
                sums = block_sums[q]
                values = leaf_values_t[q]
                for j in range(m):
                    sums[rows[j]] += values[leaf_id[j]]
            if mode == _OOB:
                for j in range(m):
                    cnt[a0 + rows[j]] += 1.0
        for r in range(n):
            for q in range(kv):
                values_out[a0 + r, q] = block_sums[q, r]


@kernel(parallel=True)
def _par_batch_walk(X, records, roots, sure_passes, table, width, used, mode, leaf_values_t, leaf_map, oob_codes,
                    values_out, leaves_out, cnt, n_chunks):
    n = X.shape[0]
    for c in numba.prange(n_chunks):
        _batch_walk(X, records, roots, sure_passes, table, width, used, mode, leaf_values_t, leaf_map, oob_codes,
                    values_out, leaves_out, cnt, c * n // n_chunks, (c + 1) * n // n_chunks)


def _run_batch(batch, X, mode, values_out=None, leaves_out=None, leaf_map=None, oob_codes=None, cnt=None):
    """Run :func:`_batch_walk` over all rows of ``X`` (empty stand-ins for unused arrays)."""
    no_values = np.zeros((0, 1))
    run_rows(_batch_walk, _par_batch_walk, X.shape[0], X, *batch.walk, mode, batch.leaf_values_t,
             batch.leaf_local if leaf_map is None else leaf_map,
             np.zeros((0, 0), dtype=np.int8) if oob_codes is None else oob_codes,
             no_values if values_out is None else values_out,
             np.zeros((0, 0), dtype=np.int32) if leaves_out is None else leaves_out,
             np.zeros(0) if cnt is None else cnt)


class _BatchForest:
    """A packed forest in the batch walk's layout (built per call: it is cheap, and a
    cached copy could go stale if the caller edits the packed arrays; :func:`batch_layout`
    builds one for a caller that keeps it).

    Attributes
    ----------
    walk : tuple
        ``(records, roots, sure_passes, table, width, used)`` as the batch kernels take them.
    leaf_values : ndarray of float64, shape (n_leaves, n_outputs)
        Leaf vectors in compact leaf order (each tree's leaves together); no outputs
        (shape ``(n_leaves, 0)``) in a layout for leaves only.
    leaf_values_t : ndarray of float64, shape (n_outputs, n_leaves)
        The same, output-major (as the batch kernel adds them).
    leaf_local : ndarray of int32, shape (n_leaves,)
        Tree-local node id of each compact leaf.
    leaf_starts : ndarray of int64, shape (n_trees + 1,)
    """

    def __init__(self, layout, packed, values=True):
        self.walk = (layout["records"], layout["roots"], layout["sure_passes"], layout["table"],
                     np.int64(layout["width"]), layout["used"])
        nodes = layout["leaf_nodes"]
        self.leaf_starts = layout["leaf_starts"]
        value = np.asarray(packed["value"], dtype=np.float64)
        self.leaf_values = np.ascontiguousarray(value[nodes] if values else np.zeros((len(nodes), 0)))
        self.leaf_values_t = np.ascontiguousarray(self.leaf_values.T)
        offsets = np.asarray(packed["tree_offsets"], dtype=np.int64)
        self.leaf_local = (nodes - np.repeat(offsets[:-1], np.diff(self.leaf_starts))).astype(np.int32)


def batch_worthwhile(n_rows, n_trees, n_nodes):
    """Whether ``n_rows`` rows should take the batch route (:data:`BATCH_MIN_ROWS`)."""
    return n_rows >= BATCH_MIN_ROWS and n_rows * n_trees >= n_nodes


def batch_forest(packed, n_rows, n_features):
    """The batch layout for ``n_rows`` rows, or None (few rows, or a forest that does
    not fit the record layout: the per-row walk then serves)."""
    if not batch_worthwhile(n_rows, len(packed["tree_offsets"]) - 1, len(packed["feature"])):
        return None
    layout = encode_records(packed, n_features)
    return None if layout is None else _BatchForest(layout, packed)


def _batch_forest(packed, X):
    return batch_forest(packed, X.shape[0], X.shape[1])


def batch_layout(forest, n_features):
    """The batch layout of a forest whatever the row count, for a caller that keeps it
    over calls (:func:`predict_leaves`'s ``batch``): building it costs about 70 ns per
    node, 0.1 s for a forest of 1.6M nodes, as much as walking 20k rows through it.
    It routes to leaves only: it holds no leaf values (``leaf_values`` has no columns),
    so it is no ``batch`` for :func:`leaf_value_index` or :func:`accumulate_oob`.

    Parameters
    ----------
    forest : dict (packed), Tree or sequence of Tree
    n_features : int
        Columns of the rows it will route.

    Returns
    -------
    _BatchForest or False
        False where the forest does not fit the record layout (the per-row walk serves).
    """
    packed = as_packed(forest)
    layout = encode_records(packed, n_features)
    return False if layout is None else _BatchForest(layout, packed, values=False)


def run_rows(serial, parallel, n, *args):
    """Run a row kernel: ``serial(*args, 0, n)`` for small ``n`` or one thread, else
    ``parallel(*args, n_chunks)`` (a ``prange`` over row chunks calling ``serial``)."""
    threads = numba.get_num_threads()
    if n < _PARALLEL_MIN_ROWS or threads == 1:
        serial(*args, 0, n)
    else:
        parallel(*args, 8 * threads)


def as_packed(forest):
    """Accept a packed dict, a Tree, or a sequence of Trees; return the packed dict."""
    if isinstance(forest, Tree):
        return pack_trees([forest])
    if isinstance(forest, dict):
        missing = [k for k in _PACKED_KEYS if k not in forest]
        if missing:
            raise ValueError(f"packed forest lacks {missing}")
        return forest
    return pack_trees(list(forest))


def _arrays(packed):
    return (np.ascontiguousarray(packed["feature"], dtype=np.int32),
            np.ascontiguousarray(packed["threshold"], dtype=np.float64),
            np.ascontiguousarray(packed["bin_threshold"], dtype=np.int32),
            np.ascontiguousarray(packed["missing_left"], dtype=np.uint8),
            np.ascontiguousarray(packed["left"], dtype=np.int32),
            np.ascontiguousarray(packed["right"], dtype=np.int32),
            np.ascontiguousarray(packed["value"], dtype=np.float64),
            np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64),
            np.ascontiguousarray(packed_cat_bits(packed)))


def _check_X(X, packed):
    X = np.ascontiguousarray(X, dtype=np.float64)
    if not X.flags.writeable:
        # A read-only array is a distinct Numba type: copying avoids a second compile.
        X = X.copy()
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features), got shape {X.shape}")
    feature = np.asarray(packed["feature"])
    if feature.size and X.shape[1] <= int(feature.max()):
        raise ValueError(f"X has {X.shape[1]} features but the forest splits on feature {int(feature.max())}")
    return X


def _check_binned(binned, rows, packed):
    binned = np.asarray(binned)
    if not binned.flags.writeable:
        binned = binned.copy()  # one Numba signature, as in _check_X
    check_codes(binned, dtype=None)
    feature = np.asarray(packed["feature"])
    if feature.size and binned.shape[0] <= int(feature.max()):
        raise ValueError(f"binned has {binned.shape[0]} features but the forest splits on feature {int(feature.max())}")
    rows = np.arange(binned.shape[1], dtype=np.int64) if rows is None else np.ascontiguousarray(rows, dtype=np.int64)
    return binned, rows


def predict_leaves(forest, X, batch=None):
    """Leaf reached by each row in each tree, from raw features.

    Parameters
    ----------
    forest : dict (packed), Tree or sequence of Tree
    X : array-like of float, shape (n, n_features)
        NaN means missing.
    batch : optional
        :func:`batch_layout` of this forest for ``n_features`` columns, kept by the
        caller over calls: then the batch walk serves from :data:`BATCH_MIN_ROWS` rows
        on, whatever the forest's size (False: the per-row walk). Built per call when
        omitted. The leaves are the same on every route.

    Returns
    -------
    ndarray of int32, shape (n, n_trees)
        Tree-local node ids (add ``tree_offsets[t]`` for packed ids).
    """
    packed = as_packed(forest)
    X = _check_X(X, packed)
    feature, threshold, bin_threshold, missing_left, left, right, _, offsets, cat_bits = _arrays(packed)
    out = np.empty((X.shape[0], len(offsets) - 1), dtype=np.int32)
    with phase("prediction"):
        if batch is None:
            batch = _batch_forest(packed, X)
        elif batch is False or not batch_worthwhile(X.shape[0], 1, 0):   # single rows: the per-row walk
            batch = None
        if batch is None:
            run_rows(_leaves_raw, _par_leaves_raw, X.shape[0], X, feature, bin_threshold, threshold, missing_left,
                     cat_bits, left, right, offsets, out)
        else:
            _run_batch(batch, X, _LEAVES, leaves_out=out)
    return out


def predict_values(forest, X, out=None):
    """Sum over trees of the output vector of the leaf each row reaches.

    Parameters
    ----------
    forest : dict (packed), Tree or sequence of Tree
    X : array-like of float, shape (n, n_features)
    out : ndarray of float64, shape (n, n_outputs), optional
        Added to in place (e.g. a baseline prediction); zeros when omitted.

    Returns
    -------
    ndarray of float64, shape (n, n_outputs)
    """
    packed = as_packed(forest)
    X = _check_X(X, packed)
    feature, threshold, bin_threshold, missing_left, left, right, value, offsets, cat_bits = _arrays(packed)
    if out is None:
        out = np.zeros((X.shape[0], value.shape[1]), dtype=np.float64)
    elif out.shape != (X.shape[0], value.shape[1]) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float64 of shape {(X.shape[0], value.shape[1])}")
    with phase("prediction"):
        batch = _batch_forest(packed, X)
        if batch is None:
            run_rows(_values_raw, _par_values_raw, X.shape[0], X, feature, bin_threshold, threshold, missing_left,
                     cat_bits, left, right, value, offsets, out)
        else:
            _run_batch(batch, X, _VALUES, values_out=out)
    return out


def predict_leaves_binned(forest, binned, missing_bin, rows=None):
    """Leaf reached by each row in each tree, from binned features.

    Parameters
    ----------
    forest : dict (packed), Tree or sequence of Tree
    binned : ndarray of uint8, shape (n_features, n_rows)
    missing_bin : int
    rows : array-like of int, shape (m,), optional
        Which columns of ``binned`` to route (all when omitted).

    Returns
    -------
    ndarray of int32, shape (m, n_trees)
        Tree-local node ids.
    """
    packed = as_packed(forest)
    binned, rows = _check_binned(binned, rows, packed)
    feature, _, bin_threshold, missing_left, left, right, _, offsets, cat_bits = _arrays(packed)
    out = np.empty((rows.shape[0], len(offsets) - 1), dtype=np.int32)
    with phase("prediction"):
        run_rows(_leaves_binned, _par_leaves_binned, rows.shape[0], binned, rows, feature, bin_threshold, missing_left,
                 cat_bits, left, right, offsets, int(missing_bin), out)
    return out


def predict_values_binned(forest, binned, missing_bin, rows=None, out=None):
    """Summed leaf output vectors from binned features.

    Parameters
    ----------
    forest : dict (packed), Tree or sequence of Tree
    binned : ndarray of uint8, shape (n_features, n_rows)
    missing_bin : int
    rows : array-like of int, shape (m,), optional
    out : ndarray of float64, shape (m, n_outputs), optional
        Added to in place.

    Returns
    -------
    ndarray of float64, shape (m, n_outputs)
    """
    packed = as_packed(forest)
    binned, rows = _check_binned(binned, rows, packed)
    feature, _, bin_threshold, missing_left, left, right, value, offsets, cat_bits = _arrays(packed)
    if out is None:
        out = np.zeros((rows.shape[0], value.shape[1]), dtype=np.float64)
    elif out.shape != (rows.shape[0], value.shape[1]) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float64 of shape {(rows.shape[0], value.shape[1])}")
    with phase("prediction"):
        run_rows(_values_binned, _par_values_binned, rows.shape[0], binned, rows, feature, bin_threshold, missing_left,
                 cat_bits, left, right, value, offsets, int(missing_bin), out)
    return out


def predict_reference(trees, X):
    """Plain-Python traversal (tests only).

    Parameters
    ----------
    trees : sequence of Tree
    X : ndarray of float, shape (n, n_features)

    Returns
    -------
    leaves : ndarray of int, shape (n, n_trees)
    values : ndarray of float64, shape (n, n_outputs)
    """
    X = np.asarray(X, dtype=np.float64)
    trees = list(trees)
    leaves = np.zeros((X.shape[0], len(trees)), dtype=np.int64)
    values = np.zeros((X.shape[0], trees[0].n_outputs))
    rows = X.tolist()
    for t, tree in enumerate(trees):
        # plain lists: the walk reads them node by node (Tree's attributes are trimmed views)
        feature, threshold = tree.feature.tolist(), tree.threshold.tolist()
        categorical = (tree.bin_threshold == CATEGORICAL_SPLIT).tolist()
        missing_left, left_of, right_of = tree.missing_left.tolist(), tree.left.tolist(), tree.right.tolist()
        n_codes = 64 * tree.cat_bits.shape[1]
        subsets = {node: set(bitset_bins(tree.cat_bits[node]).tolist())
                   for node in np.flatnonzero(tree.bin_threshold == CATEGORICAL_SPLIT).tolist()}
        for i, row in enumerate(rows):
            node = 0
            while feature[node] >= 0:
                x = row[feature[node]]
                if categorical[node]:
                    known = x == x and x == int(x) and 0 <= x < n_codes
                    left = int(x) in subsets[node] if known else bool(missing_left[node])
                else:
                    left = bool(missing_left[node]) if x != x else x <= threshold[node]
                node = left_of[node] if left else right_of[node]
            leaves[i, t] = node
        values += tree.value[leaves[:, t]]     # each row's sum in tree order, as a per-row walk adds
    return leaves, values


def accumulate_oob_binned(forest, binned, missing_bin, codes, acc, cnt):
    """Add each tree's leaf vector to the rows the tree left out of bag (binned features).

    Only out-of-bag (row, tree) pairs are routed: with half-samples that halves the
    walks of routing every row through every tree and then masking.

    Parameters
    ----------
    forest : dict (packed), Tree or sequence of Tree
    binned : ndarray of uint8, shape (n_features, n_rows)
    missing_bin : int
    codes : ndarray of int8, shape (n_trees, n_rows)
        ``0`` where the row is out of bag for the tree (:func:`forest.engine.subsample.tree_row_codes`).
    acc : ndarray of float64, shape (n_rows, n_outputs)
        Added to in place.
    cnt : ndarray of float64, shape (n_rows,)
        Out-of-bag tree count per row, added to in place.
    """
    packed = as_packed(forest)
    binned, _ = _check_binned(binned, np.zeros(0, dtype=np.int64), packed)
    feature, _, bin_threshold, missing_left, left, right, value, offsets, cat_bits = _arrays(packed)
    n = binned.shape[1]
    codes = np.ascontiguousarray(codes, dtype=np.int8)
    if codes.shape != (len(offsets) - 1, n):
        raise ValueError(f"codes must have shape {(len(offsets) - 1, n)}, got {codes.shape}")
    if acc.shape != (n, value.shape[1]) or acc.dtype != np.float64 or not acc.flags.c_contiguous:
        raise ValueError(f"acc must be C-contiguous float64 of shape {(n, value.shape[1])}, got {acc.shape}")
    if cnt.shape != (n,) or cnt.dtype != np.float64:
        raise ValueError(f"cnt must be float64 of shape ({n},), got {cnt.shape}")
    with phase("prediction"):
        if _oob_binned_batch(packed, binned, int(missing_bin), codes, acc, cnt):
            return
        run_rows(_oob_binned, _par_oob_binned, n, binned, codes, feature, bin_threshold, missing_left, cat_bits, left,
                 right, value, offsets, int(missing_bin), acc, cnt)


#: Fewest (row, tree) pairs, out of bag or not, for which :func:`accumulate_oob_binned`
#: takes the batch walk (about 4x faster per pair once compiled, benchmarks/RESULTS.md).
#: Its kernels, shared with ``predict``, take ~5.5 s to compile on an empty cache, and a
#: forest's fit needs them for nothing else: below this (the blocked walk costs ~100 ns
#: of CPU per pair, ~0.4 s here) a first fit stays quick to start (issue 11); above it
#: the fit compiles them once, or loads them (the ``batch-walk`` warm-up variant).
OOB_BATCH_MIN_PAIRS = 4_000_000

#: Rows of codes turned into float rows at a time for the batch walk: at most this many
#: rows, and at most :data:`_OOB_BATCH_CHUNK_CELLS` cells (8 bytes each) unless that
#: leaves fewer than :data:`_PARALLEL_MIN_ROWS` rows (wide data: the threads still share a chunk).
_OOB_BATCH_CHUNK_ROWS = 32_768
_OOB_BATCH_CHUNK_CELLS = 4_000_000


def _own_nodes(packed):
    """``packed`` cut to its trees' own node range, child ids and offsets rebased to it
    (a tree chunk of a larger forest shares its node arrays)."""
    offsets = np.asarray(packed["tree_offsets"], dtype=np.int64)
    lo, hi = int(offsets[0]), int(offsets[-1])
    if lo == 0 and hi == len(packed["feature"]):
        return packed
    sub = {k: np.asarray(packed[k])[lo:hi] for k in _PACKED_KEYS if k != "tree_offsets"}
    for name in ("left", "right"):
        child = sub[name]
        sub[name] = np.where(child >= 0, child - lo, child).astype(np.int32)
    sub["tree_offsets"] = offsets - lo
    return sub


def _oob_binned_batch(packed, binned, missing_bin, codes, acc, cnt):
    """:func:`accumulate_oob_binned` by the batch walk; False when it does not apply.

    The batch walk routes float rows against raw thresholds; binned rows route the
    same way as the floats ``code`` (NaN for ``missing_bin``) against the thresholds
    ``bin_threshold``: ``code <= b`` goes left, missing follows ``missing_left``.
    Each row's values are added in tree order onto its running value, as the
    per-tree walk adds them, so the sums are the same bits. Measured on the
    bench_causal fit (100,000 rows, 200 trees, 2 threads): see benchmarks/RESULTS.md.
    """
    n_features, n = binned.shape
    n_trees = len(packed["tree_offsets"]) - 1
    if n * n_trees < OOB_BATCH_MIN_PAIRS:
        return False
    own = _own_nodes(packed)
    as_float = dict(own, threshold=np.asarray(own["bin_threshold"], dtype=np.float64))
    batch = batch_forest(as_float, n, n_features)
    if batch is None:
        return False
    step = max(_PARALLEL_MIN_ROWS, min(_OOB_BATCH_CHUNK_ROWS, _OOB_BATCH_CHUNK_CELLS // max(n_features, 1)))
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        block = binned[:, lo:hi].T
        X = np.ascontiguousarray(block, dtype=np.float64)
        X[block == missing_bin] = np.nan
        _run_batch(batch, X, _OOB, values_out=acc[lo:hi], oob_codes=np.ascontiguousarray(codes[:, lo:hi]),
                   cnt=cnt[lo:hi])
    return True


def leaf_value_index(forest, X, batch=None):
    """Where each row's leaf vector of each tree lies: ``values[index[i, t]]``.

    The batch route's compact leaf table, or the packed ``value`` array for small
    inputs; either way ``values[index]`` is each tree's leaf vector for each row.

    Parameters
    ----------
    forest : dict (packed), Tree or sequence of Tree
    X : array-like of float, shape (n, n_features)
    batch : optional
        :func:`batch_forest` of the same forest, to reuse over chunks of rows.

    Returns
    -------
    index : ndarray of int32 or int64, shape (n, n_trees)
    values : ndarray of float64, shape (n_values, n_outputs)
    """
    packed = as_packed(forest)
    X = _check_X(X, packed)
    if batch is None:
        batch = _batch_forest(packed, X)
    if batch is None:
        offsets = np.asarray(packed["tree_offsets"], dtype=np.int64)
        index = predict_leaves(packed, X).astype(np.int64) + offsets[None, :-1]
        return index, np.ascontiguousarray(packed["value"], dtype=np.float64)
    out = np.empty((X.shape[0], len(batch.leaf_starts) - 1), dtype=np.int32)
    compact = np.arange(len(batch.leaf_local), dtype=np.int32)
    with phase("prediction"):
        _run_batch(batch, X, _LEAVES, leaves_out=out, leaf_map=compact)
    return out, batch.leaf_values


def tree_values(forest, X):
    """Each tree's leaf vector for each row.

    Returns
    -------
    ndarray of float64, shape (n, n_trees, n_outputs)
    """
    index, values = leaf_value_index(forest, X)
    return values[index]


def accumulate_oob(forest, X, codes, acc, cnt, batch=None):
    """Add each tree's leaf vector to the rows the tree left out of bag (raw features).

    Per row, trees add in tree order (as :func:`accumulate_oob_binned` does); only
    out-of-bag (row, tree) pairs are walked.

    Parameters
    ----------
    forest : dict (packed), Tree or sequence of Tree
    X : array-like of float, shape (n, n_features)
    codes : ndarray of int8, shape (n_trees, n)
        ``0`` where the row is out of bag for the tree.
    acc : ndarray of float64, shape (n, n_outputs), C-contiguous
        Added to in place.
    cnt : ndarray of float64, shape (n,)
        Out-of-bag tree count per row, added to in place.
    batch : optional
        :func:`batch_forest` of the same forest.
    """
    packed = as_packed(forest)
    X = _check_X(X, packed)
    n = X.shape[0]
    n_trees = len(packed["tree_offsets"]) - 1
    codes = np.ascontiguousarray(codes, dtype=np.int8)
    kv = np.asarray(packed["value"]).shape[1]
    if codes.shape != (n_trees, n):
        raise ValueError(f"codes must have shape {(n_trees, n)}, got {codes.shape}")
    if acc.shape != (n, kv) or acc.dtype != np.float64 or not acc.flags.c_contiguous:
        raise ValueError(f"acc must be C-contiguous float64 of shape {(n, kv)}, got {acc.shape}")
    if cnt.shape != (n,) or cnt.dtype != np.float64:
        raise ValueError(f"cnt must be float64 of shape ({n},), got {cnt.shape}")
    if batch is None:
        batch = _batch_forest(packed, X)
    with phase("prediction"):
        if batch is not None:
            _run_batch(batch, X, _OOB, values_out=acc, oob_codes=codes, cnt=cnt)
            return
        leaves = predict_leaves(packed, X)
        _oob_from_leaves(leaves, codes, np.ascontiguousarray(packed["value"], dtype=np.float64),
                         np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64), acc, cnt)


@kernel
def _oob_from_leaves(leaves, codes, value, offsets, acc, cnt):
    n, n_trees = leaves.shape
    for i in range(n):
        for t in range(n_trees):
            if codes[t, i] == 0:
                node = offsets[t] + leaves[i, t]
                for j in range(value.shape[1]):
                    acc[i, j] += value[node, j]
                cnt[i] += 1.0


#: Tree-row cells of out-of-bag codes :func:`oob_average` holds at once (int8 each).
OOB_CHUNK_CELLS = 16_000_000


def oob_average(forest, X, gids, sampling, chunk_rows=None, clusters=None):
    """Out-of-bag average of leaf vectors for training rows given by raw ``X``.

    Parameters
    ----------
    forest : dict (packed), Tree or sequence of Tree
    X : ndarray, shape (n, n_features)
    gids : ndarray of int64, shape (n,)
        The rows' global ids during fitting.
    sampling : dict
        ``seed, sample_fraction, ci_group_size, honest, honesty_fraction`` as fitted
        (and ``segments`` for a merged forest, :func:`forest.engine.subsample.sampling_segments`).
    chunk_rows : int, optional
        Rows whose out-of-bag codes are drawn at once.
    clusters : forest.engine.clusters.ClusterLayout, optional
        The rows' cluster layout when the forest was fitted with clusters.

    Returns
    -------
    avg : ndarray, shape (n, n_outputs)
        NaN rows where no tree left the row out.
    cnt : ndarray, shape (n,)
    """
    from forest.engine.clusters import layout_rows
    from forest.engine.subsample import forest_row_codes

    packed = as_packed(forest)
    X = _check_X(X, packed)
    n = X.shape[0]
    n_trees = len(packed["tree_offsets"]) - 1
    gids = np.asarray(gids, dtype=np.int64)
    acc = np.zeros((n, np.asarray(packed["value"]).shape[1]))
    cnt = np.zeros(n)
    chunk_rows = chunk_rows or max(1, OOB_CHUNK_CELLS // max(n_trees, 1))
    batch = _batch_forest(packed, X)
    for lo in range(0, n, chunk_rows):
        hi = min(n, lo + chunk_rows)
        codes = forest_row_codes(sampling, n_trees, gids[lo:hi], layout_rows(clusters, lo, hi))
        accumulate_oob(packed, X[lo:hi], codes, acc[lo:hi], cnt[lo:hi], batch)
    with np.errstate(invalid="ignore", divide="ignore"):
        return acc / cnt[:, None], cnt

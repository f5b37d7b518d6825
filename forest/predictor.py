"""Tree-ensemble prediction: Numba kernels over the packed-forest layout.

This module owns routing rows through trees, for every model in ``forest``:

* on raw float features ``X`` of shape ``(n, n_features)``;
* on binned features ``binned`` of shape ``(n_features, n)`` (uint8, feature-major,
  as :class:`histogram.binning.BinMapper` produces);

both by the rule of :mod:`forest.routing`.

Results are either the leaf reached in every tree (``(n, n_trees)`` tree-local node
ids, for leaf statistics such as the causal forest's moment averages) or the sum of
the reached leaves' output vectors (``(n, n_outputs)``, for boosting and regression).
Kernels run in parallel over chunks of rows (``numba.prange``; small inputs serially); a forest goes in as the dict
of :func:`forest.tree.pack_trees`. :func:`predict_reference` is a plain-Python
traversal used by tests.
"""
import numba
import numpy as np

from ._validation import check_codes
from .profiling import phase
from .routing import walk_binned, walk_raw
from .tree import Tree, pack_trees

_PACKED_KEYS = ("feature", "threshold", "bin_threshold", "missing_left", "left", "right", "value", "tree_offsets")


# Each kernel is a serial loop over rows [a, b) plus a parallel driver over row chunks;
# small inputs run the serial loop directly, because starting the thread pool costs
# more than routing a few thousand rows (much more on an oversubscribed machine).
_PARALLEL_MIN_ROWS = 4096


@numba.njit(cache=True)
def _leaves_raw(X, feature, threshold, missing_left, left, right, offsets, out, a, b):
    n_trees = offsets.shape[0] - 1
    for i in range(a, b):
        for t in range(n_trees):
            root = offsets[t]
            out[i, t] = walk_raw(X, i, root, feature, threshold, missing_left, left, right) - root


@numba.njit(cache=True)
def _values_raw(X, feature, threshold, missing_left, left, right, value, offsets, out, a, b):
    n_trees = offsets.shape[0] - 1
    k = value.shape[1]
    for i in range(a, b):
        for t in range(n_trees):
            leaf = walk_raw(X, i, offsets[t], feature, threshold, missing_left, left, right)
            for j in range(k):
                out[i, j] += value[leaf, j]


@numba.njit(cache=True)
def _leaves_binned(binned, rows, feature, bin_threshold, missing_left, left, right, offsets, missing_bin, out, a, b):
    n_trees = offsets.shape[0] - 1
    for r in range(a, b):
        i = rows[r]
        for t in range(n_trees):
            root = offsets[t]
            out[r, t] = walk_binned(binned, i, root, feature, bin_threshold, missing_left, left, right,
                                     missing_bin) - root


@numba.njit(cache=True)
def _values_binned(binned, rows, feature, bin_threshold, missing_left, left, right, value, offsets, missing_bin,
                   out, a, b):
    n_trees = offsets.shape[0] - 1
    k = value.shape[1]
    for r in range(a, b):
        i = rows[r]
        for t in range(n_trees):
            leaf = walk_binned(binned, i, offsets[t], feature, bin_threshold, missing_left, left, right,
                                missing_bin)
            for j in range(k):
                out[r, j] += value[leaf, j]


@numba.njit(cache=True, parallel=True)
def _par_leaves_raw(X, feature, threshold, missing_left, left, right, offsets, out, n_chunks):
    n = X.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        _leaves_raw(X, feature, threshold, missing_left, left, right, offsets, out, c * chunk, min(n, (c + 1) * chunk))


@numba.njit(cache=True, parallel=True)
def _par_values_raw(X, feature, threshold, missing_left, left, right, value, offsets, out, n_chunks):
    n = X.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        _values_raw(X, feature, threshold, missing_left, left, right, value, offsets, out, c * chunk,
                    min(n, (c + 1) * chunk))


@numba.njit(cache=True, parallel=True)
def _par_leaves_binned(binned, rows, feature, bin_threshold, missing_left, left, right, offsets, missing_bin, out,
                       n_chunks):
    n = rows.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        _leaves_binned(binned, rows, feature, bin_threshold, missing_left, left, right, offsets, missing_bin, out,
                       c * chunk, min(n, (c + 1) * chunk))


@numba.njit(cache=True, parallel=True)
def _par_values_binned(binned, rows, feature, bin_threshold, missing_left, left, right, value, offsets, missing_bin,
                       out, n_chunks):
    n = rows.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        _values_binned(binned, rows, feature, bin_threshold, missing_left, left, right, value, offsets, missing_bin,
                       out, c * chunk, min(n, (c + 1) * chunk))


#: Rows per block of :func:`_oob_binned`.
_OOB_BLOCK = 2048


@numba.njit(cache=True)
def _oob_binned(binned, codes, feature, bin_threshold, missing_left, left, right, value, offsets, missing_bin, acc,
                cnt, a, b):
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
                leaf = walk_binned(binned, i, root, feature, bin_threshold, missing_left, left, right, missing_bin)
                for j in range(k):
                    acc[i, j] += value[leaf, j]
                cnt[i] += 1.0


@numba.njit(cache=True, parallel=True)
def _par_oob_binned(binned, codes, feature, bin_threshold, missing_left, left, right, value, offsets, missing_bin,
                    acc, cnt, n_chunks):
    n = binned.shape[1]
    for c in numba.prange(n_chunks):
        _oob_binned(binned, codes, feature, bin_threshold, missing_left, left, right, value, offsets, missing_bin,
                    acc, cnt, c * n // n_chunks, (c + 1) * n // n_chunks)


def _run(serial, parallel, n, *args):
    """Serial kernel for small ``n`` or one thread, else the chunked parallel driver."""
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
            np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64))


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
    check_codes(binned)
    feature = np.asarray(packed["feature"])
    if feature.size and binned.shape[0] <= int(feature.max()):
        raise ValueError(f"binned has {binned.shape[0]} features but the forest splits on feature {int(feature.max())}")
    rows = np.arange(binned.shape[1], dtype=np.int64) if rows is None else np.ascontiguousarray(rows, dtype=np.int64)
    return binned, rows


def predict_leaves(forest, X):
    """Leaf reached by each row in each tree, from raw features.

    Parameters
    ----------
    forest : dict (packed), Tree or sequence of Tree
    X : array-like of float, shape (n, n_features)
        NaN means missing.

    Returns
    -------
    ndarray of int32, shape (n, n_trees)
        Tree-local node ids (add ``tree_offsets[t]`` for packed ids).
    """
    packed = as_packed(forest)
    X = _check_X(X, packed)
    feature, threshold, _, missing_left, left, right, _, offsets = _arrays(packed)
    out = np.empty((X.shape[0], len(offsets) - 1), dtype=np.int32)
    with phase("prediction"):
        _run(_leaves_raw, _par_leaves_raw, X.shape[0], X, feature, threshold, missing_left, left, right, offsets, out)
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
    feature, threshold, _, missing_left, left, right, value, offsets = _arrays(packed)
    if out is None:
        out = np.zeros((X.shape[0], value.shape[1]), dtype=np.float64)
    elif out.shape != (X.shape[0], value.shape[1]) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float64 of shape {(X.shape[0], value.shape[1])}")
    with phase("prediction"):
        _run(_values_raw, _par_values_raw, X.shape[0], X, feature, threshold, missing_left, left, right, value,
                 offsets, out)
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
    feature, _, bin_threshold, missing_left, left, right, _, offsets = _arrays(packed)
    out = np.empty((rows.shape[0], len(offsets) - 1), dtype=np.int32)
    with phase("prediction"):
        _run(_leaves_binned, _par_leaves_binned, rows.shape[0], binned, rows, feature, bin_threshold, missing_left,
             left, right, offsets, int(missing_bin), out)
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
    feature, _, bin_threshold, missing_left, left, right, value, offsets = _arrays(packed)
    if out is None:
        out = np.zeros((rows.shape[0], value.shape[1]), dtype=np.float64)
    elif out.shape != (rows.shape[0], value.shape[1]) or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous float64 of shape {(rows.shape[0], value.shape[1])}")
    with phase("prediction"):
        _run(_values_binned, _par_values_binned, rows.shape[0], binned, rows, feature, bin_threshold, missing_left,
             left, right, value, offsets, int(missing_bin), out)
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
    for i in range(X.shape[0]):
        for t, tree in enumerate(trees):
            node = 0
            while tree.feature[node] >= 0:
                x = X[i, tree.feature[node]]
                left = bool(tree.missing_left[node]) if np.isnan(x) else x <= tree.threshold[node]
                node = tree.left[node] if left else tree.right[node]
            leaves[i, t] = node
            values[i] += tree.value[node]
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
        ``0`` where the row is out of bag for the tree (:func:`forest.subsample.tree_row_codes`).
    acc : ndarray of float64, shape (n_rows, n_outputs)
        Added to in place.
    cnt : ndarray of float64, shape (n_rows,)
        Out-of-bag tree count per row, added to in place.
    """
    packed = as_packed(forest)
    binned, _ = _check_binned(binned, np.zeros(0, dtype=np.int64), packed)
    feature, _, bin_threshold, missing_left, left, right, value, offsets = _arrays(packed)
    n = binned.shape[1]
    codes = np.ascontiguousarray(codes, dtype=np.int8)
    if codes.shape != (len(offsets) - 1, n):
        raise ValueError(f"codes must have shape {(len(offsets) - 1, n)}, got {codes.shape}")
    if acc.shape != (n, value.shape[1]) or acc.dtype != np.float64 or not acc.flags.c_contiguous:
        raise ValueError(f"acc must be C-contiguous float64 of shape {(n, value.shape[1])}, got {acc.shape}")
    if cnt.shape != (n,) or cnt.dtype != np.float64:
        raise ValueError(f"cnt must be float64 of shape ({n},), got {cnt.shape}")
    with phase("prediction"):
        _run(_oob_binned, _par_oob_binned, n, binned, codes, feature, bin_threshold, missing_left, left, right, value,
             offsets, int(missing_bin), acc, cnt)

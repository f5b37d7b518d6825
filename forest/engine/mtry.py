"""Per-node feature subsampling (``mtry``): which features a node may split on.

This module is the one home of the draw. A node's features are a pure function of
``(seed, tree index, node id)``: each feature gets a hash (:mod:`histogram.rowhash`)
and the ``mtry`` features with the smallest hashes win (ties by feature index). So
every rank, every rank count and every growth path (level-wise histograms and the
compiled subtree kernels of :mod:`forest.engine.local_growth`) draws the same features.

Two stages keep the counters from overflowing: first a key per (tree, node), then
that key offset by the feature index is hashed again. Stream 0x6D747279 ("mtry")
keeps the draw independent of the row-sampling streams.
"""
import numpy as np

from histogram.jit import arange, compiled_only, empty, kernel
from histogram.rowhash import hash64_reference, hash_id, stream_key

#: Hash stream of the node keys; the feature hashes use the next stream.
MTRY_STREAM = 0x6D747279


def mtry_keys(seed):
    """The two per-seed keys of the draw, as uint64 (see :func:`node_mask`)."""
    return stream_key(seed, MTRY_STREAM), stream_key(seed, MTRY_STREAM + 1)


@compiled_only
def node_mask(key1, key2, tree_index, node_id, n_features, mtry, out):
    """Features node ``node_id`` of tree ``tree_index`` may split on.

    Parameters
    ----------
    key1, key2 : uint64
        From :func:`mtry_keys`.
    tree_index, node_id : int
    n_features, mtry : int
        ``mtry <= 0`` or ``>= n_features`` allows every feature.
    out : ndarray of bool, shape (n_features,)
        Filled in place.
    """
    if mtry <= 0 or mtry >= n_features:
        out[:] = True
        return
    node_key = hash_id(key1, np.uint64((np.int64(tree_index) << np.int64(31)) ^ np.int64(node_id)))
    keys = empty(n_features, np.uint64)
    for f in range(n_features):
        keys[f] = hash_id(key2, node_key + np.uint64(f))
    order = _stable_order(keys)
    out[:] = False
    for j in range(mtry):
        out[order[j]] = True


@compiled_only
def _stable_order(keys):
    """Indices sorting ``keys`` (uint64, shape (n,)) ascending, ties by index; int64 (n,).

    A bottom-up merge sort written out rather than ``np.argsort(kind="mergesort")``:
    Numba's generic mergesort costs about 0.65 s to compile into every process with
    an empty cache (it was the biggest piece of a forest's first fit after the
    growth kernel), and these loops compile in a fraction of that. Merging takes
    the left run's element on equal keys, so equal keys keep index order.
    """
    n = keys.shape[0]
    a = arange(n)
    b = empty(n, np.int64)
    width = 1
    while width < n:
        lo = 0
        while lo < n:
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            i = lo
            j = mid
            k = lo
            while i < mid and j < hi:
                if keys[a[j]] < keys[a[i]]:
                    b[k] = a[j]
                    j += 1
                else:
                    b[k] = a[i]
                    i += 1
                k += 1
            while i < mid:
                b[k] = a[i]
                i += 1
                k += 1
            while j < hi:
                b[k] = a[j]
                j += 1
                k += 1
            lo = hi
        a, b = b, a
        width *= 2
    return a


@kernel
def _node_masks(key1, key2, tree_index, node_id, mtry, out):
    for i in range(tree_index.shape[0]):
        node_mask(key1, key2, tree_index[i], node_id[i], out.shape[1], mtry, out[i])


def mtry_feature_mask(seed, tree_index, node_id, n_features, mtry):
    """Features each node may split on.

    Parameters
    ----------
    seed : int
    tree_index : array-like of int, shape (n_nodes,)
        Global tree index of each node (not the index within a batch).
    node_id : array-like of int, shape (n_nodes,)
        Node id within its tree.
    n_features : int
    mtry : int or None
        Features drawn per node; ``None`` or ``>= n_features`` means all.

    Returns
    -------
    ndarray of bool, shape (n_nodes, n_features)
        Exactly ``min(mtry, n_features)`` True per row.
    """
    tree_index = np.ascontiguousarray(np.asarray(tree_index, dtype=np.int64).ravel())
    node_id = np.ascontiguousarray(np.asarray(node_id, dtype=np.int64).ravel())
    n_nodes = len(node_id)
    if mtry is None or mtry >= n_features:
        return np.ones((n_nodes, n_features), dtype=bool)
    if mtry < 1:
        raise ValueError(f"mtry must be >= 1, got {mtry}")
    out = np.empty((n_nodes, n_features), dtype=np.bool_)
    if n_nodes:
        key1, key2 = mtry_keys(seed)
        _node_masks(key1, key2, tree_index, node_id, int(mtry), out)
    return out


def mtry_feature_mask_reference(seed, tree_index, node_id, n_features, mtry):
    """Slow NumPy reference of :func:`mtry_feature_mask` (vectorised over nodes)."""
    tree_index = np.asarray(tree_index, dtype=np.int64).ravel()
    node_id = np.asarray(node_id, dtype=np.int64).ravel()
    n_nodes = len(node_id)
    if mtry is None or mtry >= n_features:
        return np.ones((n_nodes, n_features), dtype=bool)
    node_key = hash64_reference(seed, MTRY_STREAM, (tree_index << np.int64(31)) ^ node_id)
    with np.errstate(over="ignore"):
        counters = node_key[:, None] + np.arange(n_features, dtype=np.uint64)[None, :]
    keys = hash64_reference(seed, MTRY_STREAM + 1, counters.ravel()).reshape(n_nodes, n_features)
    order = np.argsort(keys, axis=1, kind="stable")[:, :mtry]
    mask = np.zeros((n_nodes, n_features), dtype=bool)
    np.put_along_axis(mask, order, True, axis=1)
    return mask

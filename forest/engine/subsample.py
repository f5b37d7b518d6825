"""Which rows each tree of a forest sees: subsample, honesty halves, BLB groups.

This module owns the forests' row sampling. Every decision is a counter-based hash
of ``(seed, stream, global row id)`` (:mod:`histogram.rowhash`, whose
Numba scalar functions the kernel here inlines, so it runs in parallel without
temporaries), so a row's role in a tree does not depend on how rows are spread over
ranks, and it can be recomputed at prediction time for out-of-bag estimates without
storing sample lists.

Scheme for tree ``b`` (group ``q = b // ci_group_size``):

1. with ``ci_group_size > 1``, the group's half-sample is
   ``u(seed, HALF + 16 q, id) < 1/2``; the tree then keeps rows of that half with
   ``u(seed, SUB + 16 b, id) < 2 * sample_fraction`` (GRF's little bags: each tree
   takes ``sample_fraction`` of the data from its group's half). With
   ``ci_group_size == 1`` the tree keeps ``u(seed, SUB + 16 b, id) < sample_fraction``.
2. with honesty, a kept row goes to the structure (split) half when
   ``u(seed, HONEST + 16 b, id) < honesty_fraction`` and to the estimation half
   otherwise; without honesty every kept row does both.

Sampling is Bernoulli per row rather than exact-size: sizes vary by
``O(sqrt(n))``, and in exchange each decision is a pure function of one row id.

Clusters (grf's semantics, :mod:`forest.engine.clusters`): with a cluster layout every
decision above is keyed by the row's global cluster code instead of its row id, so
trees draw whole clusters, little bags split the clusters in halves, and honesty
puts all of a cluster's rows on one side. A drawn cluster then gives the tree at
most ``samples_per_cluster`` of its rows: row ``j`` (its index among the cluster's
``n_c`` rows in global row order) is kept when ``pi(j) < samples_per_cluster``,
``pi`` a pseudo-random permutation of ``0 .. n_c - 1`` keyed by (seed, tree,
cluster) (a 4-round Feistel network on the next power of four, cycle-walked into
range), so exactly ``min(n_c, samples_per_cluster)`` rows are kept, a uniformly
scrambled subset, and each row decides alone. A row is out of bag exactly when its
cluster was not drawn (as in grf); rows of a drawn cluster that were not kept get
the code ``4`` and take no part in the tree.

Codes returned by :func:`tree_row_codes`: ``0`` out of bag, ``1`` structure only,
``2`` estimation only, ``3`` both (no honesty), ``4`` in a drawn cluster but not
among its kept rows.
"""
import numba
import numpy as np
from numba import prange

from histogram.jit import kernel
from histogram.rowhash import GOLDEN, hash_id, hash64_reference, key_of, mix64, unit_id, uniform

OUT, STRUCTURE, ESTIMATION, BOTH, UNUSED = 0, 1, 2, 3, 4

# Purpose codes of the hash streams (stream = purpose + 16 * tree-or-group index).
_HALF, _SUB, _HONEST, _WITHIN = 1, 2, 3, 4
_FEISTEL_ROUNDS = 4


@kernel(inline="always")
def _scrambled_index(key, j, n):
    """Image of ``j`` under a keyed permutation of ``0 .. n-1`` (Feistel + cycle walking)."""
    half = np.uint64(1)
    while (np.uint64(1) << (np.uint64(2) * half)) < np.uint64(n):
        half += np.uint64(1)
    mask = (np.uint64(1) << half) - np.uint64(1)
    x = np.uint64(j)
    while True:
        left = x >> half
        right = x & mask
        for r in range(_FEISTEL_ROUNDS):
            f = mix64(key + np.uint64(r + 1) * GOLDEN + right) & mask
            left, right = right, left ^ f
        x = (left << half) | right
        if x < np.uint64(n):
            return np.int64(x)


@kernel
def _codes_trees(j0, j1, seed, trees, ids, group_size, keep_frac, honest, honesty_fraction, within, csize,
                 per_cluster, out):
    """Rows ``j0:j1`` of :func:`tree_row_codes`' output (the serial kernel)."""
    n = ids.shape[0]
    for j in range(j0, j1):
        b = trees[j]
        k_half = key_of(seed, _HALF + 16 * (b // group_size))
        k_sub = key_of(seed, _SUB + 16 * b)
        k_hon = key_of(seed, _HONEST + 16 * b)
        k_within = key_of(seed, _WITHIN + 16 * b)
        for i in range(n):
            uid = ids[i]
            code = 0
            if group_size == 1 or unit_id(k_half, uid) < 0.5:
                if unit_id(k_sub, uid) < keep_frac:
                    if per_cluster > 0 and csize[i] > per_cluster and \
                            _scrambled_index(hash_id(k_within, uid), within[i], csize[i]) >= per_cluster:
                        code = 4
                    elif not honest:
                        code = 3
                    elif unit_id(k_hon, uid) < honesty_fraction:
                        code = 1
                    else:
                        code = 2
            out[j, i] = code


@kernel(parallel=True)
def _codes_parallel(seed, trees, ids, group_size, keep_frac, honest, honesty_fraction, within, csize, per_cluster,
                    out):
    for j in prange(trees.shape[0]):
        _codes_trees(j, j + 1, seed, trees, ids, group_size, keep_frac, honest, honesty_fraction, within, csize,
                     per_cluster, out)


def little_bag_size(ci_group_size, sample_fraction):
    """Trees per little bag of a fit: ``ci_group_size``, or for ``None`` grf's 2 where each tree's
    subsample fits in half of the data (``sample_fraction <= 0.5``) and 1 otherwise.

    ``RegressionForest`` defaults to ``None``: its variance estimates need little bags
    (as grf's ``regression_forest``, whose ``ci.group.size`` is 2), yet a larger sample
    fraction alone must not become an error.
    """
    if ci_group_size is None:
        return 2 if sample_fraction <= 0.5 else 1
    return int(ci_group_size)


def keep_fraction(sample_fraction, ci_group_size):
    """Per-tree keep probability inside the tree's pool (the group's half, or all rows)."""
    return 2.0 * sample_fraction if ci_group_size > 1 else sample_fraction


def tree_row_codes(seed, trees, gids, *, sample_fraction=0.5, ci_group_size=1, honest=True,
                   honesty_fraction=0.5, clusters=None):
    """Role of every row in every tree of a batch.

    Parameters
    ----------
    seed : int
        Non-negative seed.
    trees : array-like of int, shape (n_trees,)
        Global tree indices.
    gids : array-like of int, shape (n,)
        Global row ids.
    sample_fraction : float
        Fraction of all rows each tree is grown from (``<= 0.5`` when
        ``ci_group_size > 1``).
    ci_group_size : int
    honest : bool
    honesty_fraction : float
    clusters : forest.engine.clusters.ClusterLayout, optional
        Sample by cluster (module docstring); its arrays are aligned with ``gids``.

    Returns
    -------
    ndarray of int8, shape (n_trees, n)
        ``OUT``, ``STRUCTURE``, ``ESTIMATION``, ``BOTH`` or ``UNUSED``.
    """
    trees = np.ascontiguousarray(trees, dtype=np.int64)
    gids = np.ascontiguousarray(gids, dtype=np.int64)
    ids, within, csize, per_cluster = _sampling_ids(gids, clusters)
    out = np.empty((len(trees), len(gids)), dtype=np.int8)
    if len(trees) and len(gids):
        args = (np.int64(seed), trees, ids, np.int64(ci_group_size),
                float(keep_fraction(sample_fraction, ci_group_size)), bool(honest), float(honesty_fraction),
                within, csize, np.int64(per_cluster), out)
        # One thread: the serial kernel (a parallel=True kernel costs more to compile).
        if numba.get_num_threads() == 1 or len(trees) == 1:
            _codes_trees(0, len(trees), *args)
        else:
            _codes_parallel(*args)
    return out


def sampling_segments(sampling, n_trees):
    """``[(seed, first tree index, n trees), ...]`` in packed order.

    A fitted forest is one segment ``(seed, 0, n_trees)``; a merged forest
    (:func:`forest.io.merge.merge_forests`) records one per part in ``sampling["segments"]``.
    """
    segments = sampling.get("segments")
    if segments is None:
        return [(int(sampling["seed"]), 0, int(n_trees))]
    return [(int(a), int(b), int(c)) for a, b, c in segments]


def sampled_row_codes(sampling, seed, trees, gids, clusters=None):
    """:func:`tree_row_codes` of trees ``trees`` drawn with ``seed`` under a sampling dict.

    Parameters
    ----------
    sampling : dict
        An estimator's ``sampling_`` (``sample_fraction, ci_group_size, honest,
        honesty_fraction``; its ``seed`` is ignored for the segment's ``seed``).
    seed : int
    trees : array-like of int, shape (n_trees,)
    gids : array-like of int, shape (n,)
    clusters : forest.engine.clusters.ClusterLayout, optional

    Returns
    -------
    ndarray of int8, shape (n_trees, n)
    """
    return tree_row_codes(seed, trees, gids, sample_fraction=sampling["sample_fraction"],
                          ci_group_size=sampling["ci_group_size"], honest=sampling["honest"],
                          honesty_fraction=sampling["honesty_fraction"], clusters=clusters)


def forest_row_codes(sampling, n_trees, gids, clusters=None):
    """Role of every row in every tree of a fitted forest, in packed tree order.

    Parameters
    ----------
    sampling : dict
        The estimator's ``sampling_`` (``seed, sample_fraction, ci_group_size, honest,
        honesty_fraction`` and, for merged forests, ``segments``).
    n_trees : int
    gids : array-like of int, shape (n,)
        Global row ids during fitting.
    clusters : forest.engine.clusters.ClusterLayout, optional
        Aligned with ``gids`` (see :func:`forest.engine.clusters.layout_rows` for a slice).

    Returns
    -------
    ndarray of int8, shape (n_trees, n)
    """
    parts = [sampled_row_codes(sampling, seed, np.arange(first, first + count), gids, clusters)
             for seed, first, count in sampling_segments(sampling, n_trees)]
    if not parts:
        return np.empty((0, len(gids)), dtype=np.int8)
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def _sampling_ids(gids, clusters):
    """``(hash ids, within-cluster index, cluster size per row, samples_per_cluster or 0)``."""
    if clusters is None:
        return gids, gids, gids, 0
    if len(clusters.codes) != len(gids):
        raise ValueError(f"cluster layout holds {len(clusters.codes)} rows, gids {len(gids)}")
    sizes = np.ascontiguousarray(clusters.row_sizes, dtype=np.int64)
    return (np.ascontiguousarray(clusters.codes, dtype=np.int64),
            np.ascontiguousarray(clusters.within, dtype=np.int64), sizes, int(clusters.samples_per_cluster))


def tree_row_codes_reference(seed, trees, gids, *, sample_fraction=0.5, ci_group_size=1, honest=True,
                             honesty_fraction=0.5, clusters=None):
    """Slow NumPy reference of :func:`tree_row_codes` built on :func:`histogram.rowhash.uniform`."""
    gids = np.asarray(gids, dtype=np.int64)
    ids = gids if clusters is None else np.asarray(clusters.codes, dtype=np.int64)
    keep = keep_fraction(sample_fraction, ci_group_size)
    out = np.zeros((len(trees), len(gids)), dtype=np.int8)
    for j, b in enumerate(int(v) for v in trees):
        pool = np.ones(len(gids), bool) if ci_group_size == 1 else \
            uniform(seed, _HALF + 16 * (b // ci_group_size), ids) < 0.5
        kept = pool & (uniform(seed, _SUB + 16 * b, ids) < keep)
        if clusters is not None:
            unused = kept & ~_kept_in_cluster_reference(seed, b, clusters)
            out[j, unused] = UNUSED
            kept &= ~unused
        if not honest:
            out[j, kept] = BOTH
        else:
            s = uniform(seed, _HONEST + 16 * b, ids) < honesty_fraction
            out[j, kept & s] = STRUCTURE
            out[j, kept & ~s] = ESTIMATION
    return out


def _kept_in_cluster_reference(seed, tree, clusters):
    """Rows a drawn cluster gives tree ``tree``; the permutation in plain Python integers."""
    m64 = (1 << 64) - 1

    def mix(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m64
        return z ^ (z >> 31)

    golden = int(GOLDEN)
    keep = np.ones(len(clusters.codes), bool)
    for i, (code, j) in enumerate(zip(clusters.codes.tolist(), clusters.within.tolist())):
        n = int(clusters.sizes[code])
        if n <= clusters.samples_per_cluster:
            continue
        key = int(hash64_reference(seed, _WITHIN + 16 * tree, np.array([code]))[0])
        half = 1
        while 4 ** half < n:
            half += 1
        mask = (1 << half) - 1
        x = j
        while True:
            left, right = x >> half, x & mask
            for r in range(_FEISTEL_ROUNDS):
                left, right = right, left ^ (mix((key + (r + 1) * golden + right) & m64) & mask)
            x = (left << half) | right
            if x < n:
                break
        keep[i] = x < clusters.samples_per_cluster
    return keep

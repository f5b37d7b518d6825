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

Codes returned by :func:`tree_row_codes`: ``0`` out of bag, ``1`` structure only,
``2`` estimation only, ``3`` both (no honesty).
"""
import numpy as np
from numba import njit, prange

from histogram.rowhash import key_of, unit_id, uniform

OUT, STRUCTURE, ESTIMATION, BOTH = 0, 1, 2, 3

# Purpose codes of the hash streams (stream = purpose + 16 * tree-or-group index).
_HALF, _SUB, _HONEST = 1, 2, 3


@njit(cache=True, parallel=True)
def _codes_kernel(seed, trees, gids, group_size, keep_frac, honest, honesty_fraction, out):
    n_trees = trees.shape[0]
    n = gids.shape[0]
    for j in prange(n_trees):
        b = trees[j]
        k_half = key_of(seed, _HALF + 16 * (b // group_size))
        k_sub = key_of(seed, _SUB + 16 * b)
        k_hon = key_of(seed, _HONEST + 16 * b)
        for i in range(n):
            gid = gids[i]
            code = 0
            if group_size == 1 or unit_id(k_half, gid) < 0.5:
                if unit_id(k_sub, gid) < keep_frac:
                    if not honest:
                        code = 3
                    elif unit_id(k_hon, gid) < honesty_fraction:
                        code = 1
                    else:
                        code = 2
            out[j, i] = code


def keep_fraction(sample_fraction, ci_group_size):
    """Per-tree keep probability inside the tree's pool (the group's half, or all rows)."""
    return 2.0 * sample_fraction if ci_group_size > 1 else sample_fraction


def tree_row_codes(seed, trees, gids, *, sample_fraction=0.5, ci_group_size=1, honest=True,
                   honesty_fraction=0.5):
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

    Returns
    -------
    ndarray of int8, shape (n_trees, n)
        ``OUT``, ``STRUCTURE``, ``ESTIMATION`` or ``BOTH``.
    """
    trees = np.ascontiguousarray(trees, dtype=np.int64)
    gids = np.ascontiguousarray(gids, dtype=np.int64)
    out = np.empty((len(trees), len(gids)), dtype=np.int8)
    if len(trees) and len(gids):
        _codes_kernel(np.int64(seed), trees, gids, np.int64(ci_group_size),
                      float(keep_fraction(sample_fraction, ci_group_size)), bool(honest),
                      float(honesty_fraction), out)
    return out


def tree_row_codes_reference(seed, trees, gids, *, sample_fraction=0.5, ci_group_size=1, honest=True,
                             honesty_fraction=0.5):
    """Slow NumPy reference of :func:`tree_row_codes` built on :func:`histogram.rowhash.uniform`."""
    gids = np.asarray(gids, dtype=np.int64)
    keep = keep_fraction(sample_fraction, ci_group_size)
    out = np.zeros((len(trees), len(gids)), dtype=np.int8)
    for j, b in enumerate(int(v) for v in trees):
        pool = np.ones(len(gids), bool) if ci_group_size == 1 else \
            uniform(seed, _HALF + 16 * (b // ci_group_size), gids) < 0.5
        kept = pool & (uniform(seed, _SUB + 16 * b, gids) < keep)
        if not honest:
            out[j, kept] = BOTH
        else:
            s = uniform(seed, _HONEST + 16 * b, gids) < honesty_fraction
            out[j, kept & s] = STRUCTURE
            out[j, kept & ~s] = ESTIMATION
    return out

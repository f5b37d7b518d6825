"""Exact path-dependent TreeSHAP over the packed forest (issue 35).

Shapley values of one row ``x`` for a tree ``f`` take as the value of a feature set
``S`` the *path-dependent conditional expectation* ``E[f | x_S]``: walk the tree from
the root; at a split on a feature of ``S`` follow ``x``; at a split on any other
feature take both children, weighted by the share of the node's training cover each
child holds (``frac``, below). So no background data set is needed: the covers are the
training rows the tree saw. A forest's values are the sums of its trees' values
(Shapley values are linear in the game).

Two implementations share that definition:

* :func:`tree_shap`, compiled and threaded over rows. Lundberg, Erion and Lee ("Consistent
  individualized feature attribution for tree ensembles", 2018, Algorithm 2) showed
  that one depth-first walk per (row, tree) suffices: for a leaf whose path holds the
  distinct features ``i`` with "feature unknown" cover share ``z_i`` (product of the
  shares on the path's splits on ``i``) and ``o_i`` (1 when ``x`` takes those splits'
  way, else 0), feature ``i``'s Shapley weight is a sum over subsets of the others of
  the Shapley kernel times products of ``z`` and ``o``. That sum equals
  ``(o_i - z_i) * integral over (0, 1) of prod_{k != i} (z_k + (o_k - z_k) t) dt``
  (the Shapley kernel ``|S|! (m - |S| - 1)! / m!`` is the Beta integral of
  ``t^|S| (1 - t)^(m - |S| - 1)``; the form Linear TreeSHAP, Yu et al. 2022, builds on).
  The integrand is a polynomial of degree ``m - 1``, so Gauss-Legendre quadrature with
  ``ceil(m / 2)`` nodes is exact: the walk carries the path's product at those nodes
  (one multiplication per node and quadrature point, a division where a feature
  repeats on the path), instead of the paper's subset-size weights and their
  extend / unwind recurrences. The same numbers, in fewer operations; see the
  comment above :func:`_tree_shap_one` for how the leaves' terms are summed per node.
* :func:`tree_shap_reference`: the definition itself, in Python: every subset of each
  tree's features, the recursive expectation, the Shapley sum. Exponential; for tests
  on small trees.

Both route a row through a node by :func:`forest.engine.routing.goes_left_raw` (NaN takes
the missing direction, categorical splits test the bitset), the rule of every walk.

Covers (:func:`count_fractions`, :func:`honest_fractions`)
    ``frac[node]`` is the node's share of its parent's cover (1 at a root); siblings'
    shares sum to one. Where a parent's cover is zero both children get one half (such a
    subtree is constant, see below, so the choice changes nothing but avoids 0 / 0).
    The expected value of a tree (the last column of the explanation) is
    ``sum over leaves of prod(frac on the path) * value``: the cover-weighted mean of its
    leaf values. Which cover each model uses is its estimator's choice
    (:mod:`forest.estimators.explanations`): GBDT trees the training rows that reached the
    node (:func:`count_fractions`), honest forests the estimation rows their leaf values
    come from (:func:`honest_fractions`).
"""
import functools
import itertools
import math

import numba
import numpy as np

from histogram.jit import kernel, compiled_only, empty, zeros
from forest.engine.predictor import as_packed, _check_X
from forest.engine.routing import goes_left_raw
from forest.engine.tree import packed_cat_bits

#: Rows from which :func:`tree_shap` starts Numba's thread pool (one row of a
#: 100-tree, 255-leaf model is about a hundred microseconds of work).
PARALLEL_MIN_ROWS = 64


# --------------------------------------------------------------------------- covers
@kernel
def _fractions_from_covers(cover, feature, left, right, offsets, frac):
    for t in range(offsets.shape[0] - 1):
        frac[offsets[t]] = 1.0
    for node in range(feature.shape[0]):
        if feature[node] >= 0:
            c = cover[node]
            if c > 0.0:
                frac[left[node]] = cover[left[node]] / c
                frac[right[node]] = cover[right[node]] / c
            else:
                frac[left[node]] = 0.5
                frac[right[node]] = 0.5


def count_fractions(packed, cover=None):
    """Cover shares from per-node covers (default: the ``count`` field, training rows).

    Parameters
    ----------
    packed : dict
        :func:`forest.engine.tree.pack_trees` layout.
    cover : ndarray of float64, shape (n_nodes,), optional
        The covers; a parent's should be its children's sum.

    Returns
    -------
    ndarray of float64, shape (n_nodes,)
        Each node's share of its parent's cover (1.0 at the roots).
    """
    cover = np.ascontiguousarray(packed["count"] if cover is None else cover, dtype=np.float64)
    frac = np.empty(len(cover))
    _fractions_from_covers(cover, np.ascontiguousarray(packed["feature"], dtype=np.int32),
                           np.ascontiguousarray(packed["left"], dtype=np.int32),
                           np.ascontiguousarray(packed["right"], dtype=np.int32),
                           np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64), frac)
    return frac


@compiled_only
def _same_node(value, a, b):
    for j in range(value.shape[1]):
        if value[a, j] != value[b, j]:
            return False
    return True


@kernel
def _honest_fractions(value, count_col, feature, left, right, offsets, frac):
    n = feature.shape[0]
    # constant[node]: every node of the subtree carries node's value row bit for bit
    # (what fill_empty_from_parent leaves below an empty node). Children follow parents.
    constant = empty(n, np.bool_)
    for node in range(n - 1, -1, -1):
        if feature[node] < 0:
            constant[node] = True
        else:
            lo, hi = left[node], right[node]
            constant[node] = (constant[lo] and constant[hi] and _same_node(value, lo, node)
                              and _same_node(value, hi, node))
    for t in range(offsets.shape[0] - 1):
        frac[offsets[t]] = 1.0
    for node in range(n):
        if feature[node] < 0:
            continue
        lo, hi = left[node], right[node]
        c, cl, cr = value[node, count_col], value[lo, count_col], value[hi, count_col]
        if c > 0.0 and cl + cr == c:
            frac[lo] = cl / c
            frac[hi] = cr / c
            continue
        # A child with no estimation rows was given its parent's whole value row, row
        # count included, so the counts no longer add up: that child is a copy of the
        # parent all the way down, and its cover is zero.
        filled_lo = constant[lo] and _same_node(value, lo, node)
        filled_hi = constant[hi] and _same_node(value, hi, node)
        if filled_lo and filled_hi:
            # both copies of the parent (or the parent is empty itself): the subtree is
            # constant and the split cannot matter; keep the shares finite
            frac[lo] = 0.5
            frac[hi] = 0.5
        elif filled_lo:
            frac[lo] = 0.0
            frac[hi] = 1.0
        elif filled_hi:
            frac[lo] = 1.0
            frac[hi] = 0.0
        elif cl + cr > 0.0:
            frac[lo] = cl / (cl + cr)
            frac[hi] = cr / (cl + cr)
        else:
            frac[lo] = 0.5
            frac[hi] = 0.5


def honest_fractions(packed, count_col):
    """Cover shares from the estimation rows an honest forest's node values come from.

    Each node's value row holds its estimation row count in column ``count_col``
    (inner nodes: the sum of their leaves'). A node that no estimation row reached took
    its parent's whole value row (:func:`forest.engine.honest_forest.fill_empty_from_parent`),
    count included; such a node is recognised (its counts do not add up to its
    parent's, and its subtree repeats the parent's value row bit for bit) and gets
    cover zero: it holds none of the rows the expectation averages over.

    Parameters
    ----------
    packed : dict
    count_col : int

    Returns
    -------
    ndarray of float64, shape (n_nodes,)
        As :func:`count_fractions`.
    """
    value = np.ascontiguousarray(packed["value"], dtype=np.float64)
    frac = np.empty(value.shape[0])
    _honest_fractions(value, int(count_col), np.ascontiguousarray(packed["feature"], dtype=np.int32),
                      np.ascontiguousarray(packed["left"], dtype=np.int32),
                      np.ascontiguousarray(packed["right"], dtype=np.int32),
                      np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64), frac)
    return frac


@kernel
def _expected_values(feature, left, right, frac, value, offsets, out):
    reach = empty(feature.shape[0], np.float64)
    for t in range(offsets.shape[0] - 1):
        reach[offsets[t]] = 1.0
        for node in range(offsets[t], offsets[t + 1]):   # parents before children
            if feature[node] >= 0:
                reach[left[node]] = reach[node] * frac[left[node]]
                reach[right[node]] = reach[node] * frac[right[node]]
            else:
                for k in range(value.shape[1]):
                    out[t, k] += reach[node] * value[node, k]


def expected_values(packed, frac, value=None):
    """Each tree's expected value: its leaf values weighted by their cover shares.

    Parameters
    ----------
    packed : dict
    frac : ndarray of float64, shape (n_nodes,)
    value : ndarray of float64, shape (n_nodes, k), optional
        The node values to explain (default ``packed["value"]``).

    Returns
    -------
    ndarray of float64, shape (n_trees, k)
    """
    value = np.ascontiguousarray(packed["value"] if value is None else value, dtype=np.float64)
    offsets = np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64)
    out = np.zeros((len(offsets) - 1, value.shape[1]))
    _expected_values(np.ascontiguousarray(packed["feature"], dtype=np.int32),
                     np.ascontiguousarray(packed["left"], dtype=np.int32),
                     np.ascontiguousarray(packed["right"], dtype=np.int32),
                     np.ascontiguousarray(frac, dtype=np.float64), value, offsets, out)
    return out


# --------------------------------------------------------------------------- the kernel
# The walk keeps, per depth d of the current path (root d = 0), the element its edge
# adds: feature e_f[d], zero fraction e_z[d], one fraction e_o[d]; slot[f] is the depth
# of feature f's live element (-1: not on the path). A deeper split on the same feature
# merges the two into a new element and retires the old one for the leaves below it.
# g[d, q] is the path polynomial G(t) = prod over live elements (z + (o - z) t) at the
# quadrature nodes t_q.
#
# Feature i's weight at a leaf is the integral of G(t) / (z_i + (o_i - z_i) t): linear in
# the leaf's G. So the leaves do not visit their path's elements: a leaf adds
# w_q G(t_q) value into acc[d] (its own depth), and when the walk leaves the node at
# depth d, its element takes the accumulated sum over the leaves below it, divided by
# its own factor at each node, and passes the sum to depth d - 1. Leaves below a deeper
# split on the same feature (where the element is retired) are also summed into
# dead[d] by that split, and taken off. Work per tree: O(nodes * q) instead of
# O(leaves * depth * q).

@compiled_only
def _tree_shap_one(X, row, root, feature, bin_threshold, threshold, missing_left, cat_bits, left, right, value,
                   frac, n_q, t_nodes, t_weights, inv_one_minus_t, g, acc, dead, has_dead, e_f, e_z, e_o, prev, slot,
                   s_node, s_z, s_o, s_f, s_dup, s_d, out):
    k_out = value.shape[1]
    for q in range(n_q):
        g[0, q] = 1.0
        for k in range(k_out):
            acc[0, k, q] = 0.0
    top = 0
    s_node[0] = root
    s_d[0] = 0
    current = 0          # depth of the node processed last: elements 1..current are set
    while True:
        # Leave the branch walked before (all of it once the stack is empty). Written
        # here rather than as a function: passing the scratch arrays to a call per
        # node costs reference-count updates that took most of the time.
        d = s_d[top] if top >= 0 else 1
        while current >= d and current > 0:
            c = current
            f = e_f[c]
            z = e_z[c]
            o = e_o[c]
            if has_dead[c]:   # the element's own share: without the leaves it is retired for
                for k in range(k_out):
                    for q in range(n_q):
                        acc[c, k, q] -= dead[c, k, q]
            if o == 0.0:
                # (0 - z) / (z (1 - t)) = -1 / (1 - t): no division, whatever z is
                for k in range(k_out):
                    total = 0.0
                    for q in range(n_q):
                        total += acc[c, k, q] * inv_one_minus_t[q]
                    out[row, f, k] -= total
            else:
                for k in range(k_out):
                    total = 0.0
                    for q in range(n_q):
                        total += acc[c, k, q] / (z + (o - z) * t_nodes[q])
                    out[row, f, k] += (o - z) * total
            if has_dead[c]:
                for k in range(k_out):
                    for q in range(n_q):
                        acc[c, k, q] += dead[c, k, q]
            for k in range(k_out):
                for q in range(n_q):
                    acc[c - 1, k, q] += acc[c, k, q]
            above = prev[c]
            if above > 0:
                if not has_dead[above]:
                    has_dead[above] = True
                    for k in range(k_out):
                        for q in range(n_q):
                            dead[above, k, q] = 0.0
                for k in range(k_out):
                    for q in range(n_q):
                        dead[above, k, q] += acc[c, k, q]
            slot[f] = above
            current -= 1
        if top < 0:
            break
        node = s_node[top]
        if d > 0:
            z = s_z[top]
            o = s_o[top]
            f = s_f[top]
            dup = s_dup[top]
            if dup > 0:
                # the feature's earlier factor comes off the path (its fractions are
                # already multiplied into z and o)
                dz = e_z[dup]
                do = e_o[dup]
                for q in range(n_q):
                    t = t_nodes[q]
                    g[d, q] = g[d - 1, q] * (z + (o - z) * t) / (dz + (do - dz) * t)
            else:
                for q in range(n_q):
                    g[d, q] = g[d - 1, q] * (z + (o - z) * t_nodes[q])
            for k in range(k_out):
                for q in range(n_q):
                    acc[d, k, q] = 0.0
            has_dead[d] = False
            e_f[d] = f
            e_z[d] = z
            e_o[d] = o
            prev[d] = slot[f]
            slot[f] = d
            current = d
        top -= 1
        split = feature[node]
        if split < 0:
            for k in range(k_out):
                v = value[node, k]
                for q in range(n_q):
                    acc[d, k, q] += t_weights[q] * g[d, q] * v
            continue
        dup = slot[split]
        iz = 1.0
        io = 1.0
        if dup > 0:
            iz = e_z[dup]
            io = e_o[dup]
        if goes_left_raw(X[row, split], node, bin_threshold, threshold, missing_left, cat_bits):
            hot, cold = left[node], right[node]
        else:
            hot, cold = right[node], left[node]
        # A child with z = o = 0 (no cover, and x cannot go there) contributes exactly nothing.
        cz = iz * frac[cold]
        if cz != 0.0:
            top += 1
            s_node[top] = cold
            s_z[top] = cz
            s_o[top] = 0.0
            s_f[top] = split
            s_dup[top] = dup
            s_d[top] = d + 1
        hz = iz * frac[hot]
        if hz != 0.0 or io != 0.0:
            top += 1
            s_node[top] = hot
            s_z[top] = hz
            s_o[top] = io
            s_f[top] = split
            s_dup[top] = dup
            s_d[top] = d + 1


@kernel
def _shap_rows(X, feature, bin_threshold, threshold, missing_left, cat_bits, left, right, value, frac, offsets,
               max_depth, tree_q, q_nodes, q_weights, out, a, b):
    n_q_max = q_nodes.shape[1]
    k_out = value.shape[1]
    levels = max_depth + 2
    g = empty((levels, n_q_max), np.float64)
    acc = empty((levels, k_out, n_q_max), np.float64)
    dead = empty((levels, k_out, n_q_max), np.float64)
    has_dead = empty(levels, np.bool_)
    e_f = empty(levels, np.int64)
    e_z = empty(levels, np.float64)
    e_o = empty(levels, np.float64)
    prev = empty(levels, np.int64)
    slot = empty(X.shape[1], np.int64)
    for f in range(X.shape[1]):
        slot[f] = -1
    stack = 2 * levels
    s_node = empty(stack, np.int64)
    s_z = empty(stack, np.float64)
    s_o = empty(stack, np.float64)
    s_f = empty(stack, np.int64)
    s_dup = empty(stack, np.int64)
    s_d = empty(stack, np.int64)
    inv_one_minus_t = empty(q_nodes.shape, np.float64)
    for i in range(q_nodes.shape[0]):
        for q in range(n_q_max):
            inv_one_minus_t[i, q] = 1.0 / (1.0 - q_nodes[i, q])
    for row in range(a, b):
        for t in range(offsets.shape[0] - 1):
            n_q = tree_q[t]
            _tree_shap_one(X, row, offsets[t], feature, bin_threshold, threshold, missing_left, cat_bits, left, right,
                           value, frac, n_q, q_nodes[n_q], q_weights[n_q], inv_one_minus_t[n_q], g, acc, dead,
                           has_dead, e_f, e_z, e_o, prev, slot, s_node, s_z, s_o, s_f, s_dup, s_d, out)


@kernel(parallel=True)
def _par_shap_rows(X, feature, bin_threshold, threshold, missing_left, cat_bits, left, right, value, frac, offsets,
                   max_depth, tree_q, q_nodes, q_weights, out, n_chunks):
    n = X.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        _shap_rows(X, feature, bin_threshold, threshold, missing_left, cat_bits, left, right, value, frac, offsets,
                   max_depth, tree_q, q_nodes, q_weights, out, c * chunk, min(n, (c + 1) * chunk))


@kernel
def _path_features(feature, left, right, offsets, n_features):
    """Most distinct features on one root-to-leaf path, per tree."""
    n_trees = offsets.shape[0] - 1
    out = zeros(n_trees, np.int64)
    seen = zeros(n_features, np.int64)     # times feature f occurs on the current path
    stack = empty(feature.shape[0] + 1, np.int64)
    for t in range(n_trees):
        top = 0
        stack[0] = offsets[t]
        distinct = 0
        path_len = 0
        depth_of = empty(offsets[t + 1] - offsets[t], np.int64)
        path = empty(offsets[t + 1] - offsets[t] + 1, np.int64)   # features on the path, by depth
        depth_of[0] = 0
        while top >= 0:
            node = stack[top]
            top -= 1
            d = depth_of[node - offsets[t]]
            while path_len > d:                  # back up to this node's parent
                path_len -= 1
                seen[path[path_len]] -= 1
                if seen[path[path_len]] == 0:
                    distinct -= 1
            f = feature[node]
            if f < 0:
                continue
            path[path_len] = f
            path_len += 1
            if seen[f] == 0:
                distinct += 1
                if distinct > out[t]:
                    out[t] = distinct
            seen[f] += 1
            for child in (left[node], right[node]):
                depth_of[child - offsets[t]] = d + 1
                top += 1
                stack[top] = child
        while path_len > 0:
            path_len -= 1
            seen[path[path_len]] -= 1
    return out


@functools.lru_cache(maxsize=None)
def _gauss_legendre(n_q):
    # Newton's method on the Legendre polynomial from the usual cosine guesses, in
    # NumPy: numpy.polynomial.legendre.leggauss calls LAPACK, whose threads then spin
    # on the cores the kernel's threads need.
    x = np.cos(np.pi * (np.arange(1, n_q + 1) - 0.25) / (n_q + 0.5))
    for _ in range(100):
        p0, p1 = np.ones_like(x), x.copy()
        for k in range(2, n_q + 1):
            p0, p1 = p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k
        dp = n_q * (x * p1 - p0) / (x * x - 1.0) if n_q > 1 else np.ones_like(x)
        step = p1 / dp
        x = x - step
        if np.abs(step).max() < 1e-16:
            break
    p0, p1 = np.ones_like(x), x.copy()
    for k in range(2, n_q + 1):
        p0, p1 = p1, ((2 * k - 1) * x * p1 - (k - 1) * p0) / k
    dp = n_q * (x * p1 - p0) / (x * x - 1.0) if n_q > 1 else np.ones_like(x)
    w = 2.0 / ((1.0 - x * x) * dp * dp)
    order = np.argsort(x)
    return (x[order] + 1.0) / 2.0, w[order] / 2.0


def quadrature(n_elements):
    """Gauss-Legendre nodes and weights on (0, 1) exact for the Shapley weights of a path.

    The weights of a path of ``m`` distinct features are integrals over (0, 1) of
    polynomials of degree ``m - 1`` at most; ``ceil(m / 2)`` nodes integrate those
    exactly.

    Parameters
    ----------
    n_elements : int
        Most distinct features on one root-to-leaf path.

    Returns
    -------
    nodes, weights : ndarray of float64, shape (q,)
    """
    nodes, weights = _gauss_legendre(max(1, -(-int(n_elements) // 2)))
    return nodes.copy(), weights.copy()


def _quadrature_tables(packed, n_features):
    """Per tree its node count ``tree_q``, and tables of nodes and weights by count."""
    offsets = np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64)
    distinct = _path_features(np.ascontiguousarray(packed["feature"], dtype=np.int32),
                              np.ascontiguousarray(packed["left"], dtype=np.int32),
                              np.ascontiguousarray(packed["right"], dtype=np.int32), offsets, int(n_features))
    tree_q = np.maximum(1, -(-distinct // 2)).astype(np.int64)
    top = int(tree_q.max()) if len(tree_q) else 1
    nodes = np.full((top + 1, top), 0.5)
    weights = np.zeros((top + 1, top))
    for q in range(1, top + 1):
        t, w = quadrature(2 * q)
        nodes[q, :q] = t
        weights[q, :q] = w
    return tree_q, nodes, weights


def _inputs(packed, X, frac, value):
    packed = as_packed(packed)
    X = _check_X(X, packed)
    value = np.ascontiguousarray(packed["value"] if value is None else value, dtype=np.float64)
    frac = np.ascontiguousarray(frac, dtype=np.float64)
    n_nodes = len(packed["feature"])
    if value.ndim != 2 or value.shape[0] != n_nodes or frac.shape != (n_nodes,):
        raise ValueError(f"value must be (n_nodes, k) and frac (n_nodes,) for {n_nodes} nodes, got "
                         f"{value.shape} and {frac.shape}")
    return packed, X, value, frac


def tree_shap(packed, X, frac, value=None):
    """Path-dependent TreeSHAP values of a forest (the sum over its trees), compiled.

    Parameters
    ----------
    packed : dict
        :func:`forest.engine.tree.pack_trees` layout.
    X : array-like of float, shape (n, n_features)
        NaN means missing (the split's missing direction).
    frac : ndarray of float64, shape (n_nodes,)
        Cover shares (:func:`count_fractions`, :func:`honest_fractions`).
    value : ndarray of float64, shape (n_nodes, k), optional
        Node values to explain, default ``packed["value"]``.

    Returns
    -------
    ndarray of float64, shape (n, n_features, k)
        ``phi[i, j, :]``: feature ``j``'s contribution to row ``i``'s sum of leaf values;
        ``phi[i].sum(axis=0) + expected_values(packed, frac, value).sum(axis=0)`` is the
        row's sum over trees of its leaves' values (up to rounding).
    """
    packed, X, value, frac = _inputs(packed, X, frac, value)
    offsets = np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64)
    out = np.zeros((X.shape[0], X.shape[1], value.shape[1]))
    depth = packed["depth"]
    max_depth = int(depth.max()) if len(depth) else 0
    tree_q, q_nodes, q_weights = _quadrature_tables(packed, X.shape[1])
    args = (X, np.ascontiguousarray(packed["feature"], dtype=np.int32),
            np.ascontiguousarray(packed["bin_threshold"], dtype=np.int32),
            np.ascontiguousarray(packed["threshold"], dtype=np.float64),
            np.ascontiguousarray(packed["missing_left"], dtype=np.uint8),
            np.ascontiguousarray(packed_cat_bits(packed)), np.ascontiguousarray(packed["left"], dtype=np.int32),
            np.ascontiguousarray(packed["right"], dtype=np.int32), value, frac, offsets, max_depth, tree_q, q_nodes,
            q_weights, out)
    threads = numba.get_num_threads()
    if X.shape[0] < PARALLEL_MIN_ROWS or threads == 1:
        _shap_rows(*args, 0, X.shape[0])
    else:
        # many more chunks than threads: rows differ in cost (depth of the paths they follow)
        _par_shap_rows(*args, min(X.shape[0], 16 * threads))
    return out


# --------------------------------------------------------------------------- the reference
def _goes_left(packed, bits, node, x):
    return bool(goes_left_raw(float(x), int(node), packed["bin_threshold"], packed["threshold"],
                              packed["missing_left"], bits))


def tree_shap_reference(packed, X, frac, value=None, max_features=12):
    """Shapley values by their definition, over every subset of each tree's features.

    The value of a feature set ``S`` for row ``x`` and tree ``t`` is the
    path-dependent expectation ``E_t[x, S]``: at a split on a feature of ``S`` follow
    ``x`` (:func:`forest.engine.routing.goes_left_raw`), otherwise ``frac[left] * E(left) +
    frac[right] * E(right)``; at a leaf its value. Then
    ``phi_j = sum over S not holding j of |S|! (m - |S| - 1)! / m! (E[S + j] - E[S])``
    with ``m`` the number of distinct features the tree splits on (the others get 0).

    Parameters
    ----------
    packed, X, frac, value
        As :func:`tree_shap`.
    max_features : int
        Refuse trees that split on more distinct features (``2**m`` subsets each).

    Returns
    -------
    phi : ndarray of float64, shape (n, n_features, k)
    expected : ndarray of float64, shape (k,)
        ``E[x, {}]`` summed over trees.
    """
    packed, X, value, frac = _inputs(packed, X, frac, value)
    bits = np.ascontiguousarray(packed_cat_bits(packed))
    feature, left, right = packed["feature"], packed["left"], packed["right"]
    offsets = packed["tree_offsets"]
    n, n_features = X.shape
    k = value.shape[1]
    phi = np.zeros((n, n_features, k))
    expected = np.zeros(k)
    for t in range(len(offsets) - 1):
        root = int(offsets[t])
        nodes = np.arange(offsets[t], offsets[t + 1])
        used = sorted({int(f) for f in feature[nodes] if f >= 0})
        m = len(used)
        if m > max_features:
            raise ValueError(f"tree {t} splits on {m} features: 2**{m} subsets is too many for the reference")
        position = {f: i for i, f in enumerate(used)}

        def expect(node, x, known):
            f = int(feature[node])
            if f < 0:
                return value[node]
            lo, hi = int(left[node]), int(right[node])
            if (known >> position[f]) & 1:
                return expect(lo if _goes_left(packed, bits, node, x[f]) else hi, x, known)
            return frac[lo] * expect(lo, x, known) + frac[hi] * expect(hi, x, known)

        weight = [math.factorial(s) * math.factorial(m - s - 1) / math.factorial(m) for s in range(m)]
        expected += expect(root, X[0] if n else np.zeros(n_features), 0)
        for i in range(n):
            e = {mask: expect(root, X[i], mask) for mask in range(1 << m)}
            for j, f in enumerate(used):
                for size in range(m):
                    for others in itertools.combinations([q for q in range(m) if q != j], size):
                        mask = sum(1 << q for q in others)
                        phi[i, f] += weight[size] * (e[mask | (1 << j)] - e[mask])
    return phi, expected


def shap_tree_dicts(packed, frac, value=None, root_cover=1.0):
    """The trees as the ``shap`` package's custom tree dictionaries (for comparisons).

    ``shap.TreeExplainer({"trees": shap_tree_dicts(...)})`` explains the same sums of
    leaf values as :func:`tree_shap` (numeric splits only: the dictionaries have no
    category sets). Covers are ``root_cover`` times the product of the shares on the
    path, so shap's ratios are ``frac``.

    Parameters
    ----------
    packed : dict
    frac : ndarray of float64, shape (n_nodes,)
    value : ndarray of float64, shape (n_nodes, k), optional
    root_cover : float

    Returns
    -------
    list of dict
        Per tree: ``children_left``, ``children_right``, ``children_default``,
        ``features``, ``thresholds``, ``values`` ``(nodes, k)``, ``node_sample_weight``.
    """
    packed = as_packed(packed)
    value = np.asarray(packed["value"] if value is None else value, dtype=np.float64)
    offsets = packed["tree_offsets"]
    trees = []
    for t in range(len(offsets) - 1):
        lo, hi = int(offsets[t]), int(offsets[t + 1])
        feature = packed["feature"][lo:hi].astype(np.int64)
        inner = feature >= 0
        if (packed["bin_threshold"][lo:hi][inner] < 0).any():
            raise ValueError("shap's tree dictionaries cannot hold categorical splits")
        left = np.where(inner, packed["left"][lo:hi].astype(np.int64) - lo, -1)
        right = np.where(inner, packed["right"][lo:hi].astype(np.int64) - lo, -1)
        cover = np.empty(hi - lo)
        cover[0] = root_cover
        for node in range(hi - lo):   # parents before children
            if inner[node]:
                cover[left[node]] = cover[node] * frac[lo + left[node]]
                cover[right[node]] = cover[node] * frac[lo + right[node]]
        trees.append(dict(
            children_left=left, children_right=right,
            children_default=np.where(packed["missing_left"][lo:hi] != 0, left, right),
            features=np.where(inner, feature, -2),   # -2: sklearn's and shap's leaf marker
            thresholds=np.where(inner, packed["threshold"][lo:hi], 0.0),
            values=np.ascontiguousarray(value[lo:hi]), node_sample_weight=cover))
    return trees


__all__ = ["tree_shap", "tree_shap_reference", "expected_values", "count_fractions", "honest_fractions", "quadrature",
           "shap_tree_dicts", "PARALLEL_MIN_ROWS"]

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
  (one multiplication per node and quadrature point), instead of the paper's
  subset-size weights and their extend / unwind recurrences. The same numbers, in
  fewer operations. A path-dependent walk visits every node for every row, and only
  the ``o_i`` depend on the row: so blocks of rows (:data:`BLOCK`) walk each tree
  together, the arithmetic vectorised over the block's rows, and what depends on the
  tree alone is computed outside the loops over rows (the walk order and the ``z_i``
  once per call, a node's quadrature factors once per block). See the comment above
  :func:`_schedule`.
* :func:`tree_shap_reference`: the definition itself, in Python: every subset of each
  tree's features, the recursive expectation, the Shapley sum. Exponential; for tests
  on small trees.

Both route a row through a node by :func:`forest.engine.routing.goes_left_raw` (NaN takes
the missing direction, categorical splits test the bitset; the kernel calls its numeric
case, ``goes_left_value``, directly in the loop over a block's rows), the rule of every
walk.

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
from forest.engine.routing import goes_left_raw, goes_left_value
from forest.engine.tree import packed_cat_bits

#: Rows from which :func:`tree_shap` starts Numba's thread pool: two blocks of rows
#: (``BLOCK``, the kernel's unit of work).
PARALLEL_MIN_ROWS = 256


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
# Path-dependent TreeSHAP visits every node of a tree for every row (a split on a
# feature outside S takes both children), and a row changes what a node adds only
# through the one fractions o (0 or 1): the zero fractions z and which splits repeat a
# feature belong to the tree. The work is split in two:
#
# * _schedule, once per call: every tree's nodes in depth-first pre-order (position i),
#   each with its depth, the element its edge adds (the parent's feature p_feat, its
#   zero fraction p_z, p_dup the depth of the element of the same feature it merges
#   with, 0 if none, and that element's zero fraction p_z_before); p_end[i] is the
#   position after i's subtree. Also each tree's quadrature size (most distinct
#   features on a path).
# * _shap_blocks: a block of up to BLOCK rows walks each tree once in that order. The
#   state the row-by-row walk kept per depth is a vector over the block's rows, row
#   index innermost, so the loops over the rows compile to vector instructions. The
#   node's quadrature factors (the divisions) are computed once per node and block,
#   outside those loops; o is a 0 / 1 vector from the rows' routing at the parent
#   (:mod:`forest.engine.routing`).
#
# Per depth d of the current path (root d = 0): g[d, q, r] is the path polynomial
# G(t) = prod over live elements (z + (o - z) t) at the quadrature nodes t_q for row r.
# Entering a node multiplies g by its element's factor, e0 + o * ed: e0 = z (1 - t_q),
# ed = (z + (1 - z) t_q) - e0. A deeper split on a feature already on the path merges
# the two elements: z and o become the products, and the earlier factor comes off
# (e0, ed divided by it); if the row failed the earlier split (o_before = 0) the
# factor's ratio is z / z_before (e00) whatever t.
#
# Feature i's weight at a leaf is the integral of G(t) (o_i - z_i) / (z_i + (o_i - z_i) t):
# linear in the leaf's G. So the leaves do not visit their path's elements: a leaf adds
# G(t_q) value into acc[d - 1] (its parent's depth), and when the walk leaves the node
# at depth d, its element takes the accumulated sum over the leaves below it times
# w_q (o - z) / (z + (o - z) t_q) = w0 + o * wd (w0 = -w_q / (1 - t_q), the same for
# every z: with o = 0 the ratio is -1 / (1 - t)), and passes the sum to depth d - 1.
# Leaves below a deeper split on the same feature (where the element is retired) are
# also summed into dead[d] by that split, and taken off. Work per tree and row:
# O(nodes * q), in vector loops over the block's rows.
#
# A child with zero cover (z = 0) is skipped when no row of the block takes it (its
# rows' terms are exactly zero). Rows do not interact: a row's values do not depend on
# the block it was explained in (same operations, same order), so not on the threads.

#: Rows explained together per walk of a tree: the width of the vector loops. Scratch
#: per thread is about ``3 * depth * k * q * BLOCK`` doubles.
BLOCK = 128


@kernel
def _schedule(feature, left, right, frac, offsets, n_features, max_depth):
    """Pre-order positions of every tree's nodes and their path elements (row-independent)."""
    n = feature.shape[0]
    levels = max_depth + 2
    p_node = empty(n, np.int64)
    p_depth = empty(n, np.int64)
    p_left = empty(n, np.bool_)
    p_feat = empty(n, np.int64)
    p_dup = empty(n, np.int64)
    p_z = empty(n, np.float64)
    p_z_before = empty(n, np.float64)
    p_end = empty(n, np.int64)
    distinct_max = zeros(offsets.shape[0] - 1, np.int64)
    slot = empty(n_features, np.int64)        # depth of feature f's live element, -1: none
    for f in range(n_features):
        slot[f] = -1
    e_z = empty(levels, np.float64)
    e_f = empty(levels, np.int64)
    e_prev = empty(levels, np.int64)
    e_pos = empty(levels, np.int64)
    distinct = zeros(levels, np.int64)        # distinct features on the path down to depth d
    stack = 2 * levels + 2
    s_node = empty(stack, np.int64)
    s_d = empty(stack, np.int64)
    s_parent = empty(stack, np.int64)
    s_left = empty(stack, np.bool_)
    for t in range(offsets.shape[0] - 1):
        pos = offsets[t]
        top = 0
        s_node[0] = offsets[t]
        s_d[0] = 0
        s_parent[0] = -1
        s_left[0] = False
        current = 0
        while top >= 0:
            node = s_node[top]
            d = s_d[top]
            parent = s_parent[top]
            p_left[pos] = s_left[top]
            top -= 1
            while current >= d and current > 0:      # leave the branch walked before
                p_end[e_pos[current]] = pos
                slot[e_f[current]] = e_prev[current]
                current -= 1
            p_node[pos] = node
            p_depth[pos] = d
            p_end[pos] = pos + 1
            p_feat[pos] = -1
            p_dup[pos] = 0
            p_z[pos] = 1.0
            p_z_before[pos] = 1.0
            if d > 0:
                f = feature[parent]
                dup = slot[f]
                z_before = e_z[dup] if dup > 0 else 1.0
                z = z_before * frac[node]
                p_feat[pos] = f
                p_dup[pos] = max(dup, 0)
                p_z[pos] = z
                p_z_before[pos] = z_before
                distinct[d] = distinct[d - 1] + (1 if dup < 0 else 0)
                distinct_max[t] = max(distinct_max[t], distinct[d])
                e_z[d] = z
                e_f[d] = f
                e_prev[d] = dup
                e_pos[d] = pos
                slot[f] = d
                current = d
            if feature[node] >= 0:
                top += 1                   # right below left: the left subtree comes first
                s_node[top] = right[node]
                s_d[top] = d + 1
                s_parent[top] = node
                s_left[top] = False
                top += 1
                s_node[top] = left[node]
                s_d[top] = d + 1
                s_parent[top] = node
                s_left[top] = True
            pos += 1
        while current > 0:
            p_end[e_pos[current]] = pos
            slot[e_f[current]] = e_prev[current]
            current -= 1
        p_end[offsets[t]] = pos
    return (p_node, p_depth, p_left, p_feat, p_dup, p_z, p_z_before, p_end), distinct_max


@kernel(inline="always")
def _leave(c, nb, k_out, n_q, p_feat, p_dup, w0t, wd, e_pos, o, acc, dead, has_dead, out_b):
    """The walk leaves the element at depth ``c``: its Shapley terms, and its sums passed up."""
    i = e_pos[c]
    f = p_feat[i]
    if has_dead[c]:     # the element's own share: without the leaves it is retired for
        for k in range(k_out):
            for q in range(n_q):
                a0 = w0t[q]
                a1 = wd[c, q]
                for r in range(nb):
                    a = acc[c, k, q, r]
                    out_b[f, k, r] += (a - dead[c, k, q, r]) * (a0 + o[c, r] * a1)
                    acc[c - 1, k, q, r] += a
    else:
        for k in range(k_out):
            for q in range(n_q):
                a0 = w0t[q]
                a1 = wd[c, q]
                for r in range(nb):
                    a = acc[c, k, q, r]
                    out_b[f, k, r] += a * (a0 + o[c, r] * a1)
                    acc[c - 1, k, q, r] += a
    above = p_dup[i]
    if above > 0:
        if not has_dead[above]:
            has_dead[above] = True
            for k in range(k_out):
                for q in range(n_q):
                    for r in range(nb):
                        dead[above, k, q, r] = acc[c, k, q, r]
        else:
            for k in range(k_out):
                for q in range(n_q):
                    for r in range(nb):
                        dead[above, k, q, r] += acc[c, k, q, r]


@kernel(inline="always")
def _route_block(nb, xb, node, feature, bin_threshold, threshold, missing_left, cat_bits, side, d):
    """``side[d, r]``: 1.0 where row ``r`` of the block goes left at ``node``."""
    f = feature[node]
    if bin_threshold[node] >= 0:     # goes_left_raw's numeric case, outside the loop over rows
        thr = threshold[node]
        ml = missing_left[node]
        for r in range(nb):
            side[d, r] = 1.0 if goes_left_value(xb[f, r], thr, ml) else 0.0
    else:
        for r in range(nb):
            side[d, r] = 1.0 if goes_left_raw(xb[f, r], node, bin_threshold, threshold, missing_left, cat_bits) else 0.0


@kernel
def _shap_blocks(X, feature, bin_threshold, threshold, missing_left, cat_bits, value, offsets, max_depth,
                 p_node, p_depth, p_left, p_feat, p_dup, p_z, p_z_before, p_end, tree_q, q_nodes, q_weights, out,
                 b0, b1):
    n, n_features = X.shape
    k_out = value.shape[1]
    n_q_max = q_nodes.shape[1]
    levels = max_depth + 2
    xb = empty((n_features, BLOCK), np.float64)
    g = empty((levels, n_q_max, BLOCK), np.float64)
    acc = empty((levels, k_out, n_q_max, BLOCK), np.float64)
    dead = empty((levels, k_out, n_q_max, BLOCK), np.float64)
    has_dead = empty(levels, np.bool_)
    o = empty((levels, BLOCK), np.float64)
    side = empty((levels, BLOCK), np.float64)
    e_pos = empty(levels, np.int64)
    wd = empty((levels, n_q_max), np.float64)   # the exit weights' o-part of the element at depth d
    e0 = empty(n_q_max, np.float64)
    ed = empty(n_q_max, np.float64)
    w0 = zeros(q_nodes.shape, np.float64)       # the exit weights with o = 0, by quadrature size
    for n_q in range(1, q_nodes.shape[0]):
        for q in range(n_q):
            w0[n_q, q] = -q_weights[n_q, q] / (1.0 - q_nodes[n_q, q])
    out_b = empty((n_features, k_out, BLOCK), np.float64)
    for block in range(b0, b1):
        r0 = block * BLOCK
        nb = min(BLOCK, n - r0)
        for f in range(n_features):
            for r in range(nb):
                xb[f, r] = X[r0 + r, f]
            for k in range(k_out):
                for r in range(nb):
                    out_b[f, k, r] = 0.0
        for t in range(offsets.shape[0] - 1):
            root, end = offsets[t], offsets[t + 1]
            if feature[root] < 0:
                continue                  # a single leaf: no feature moves it
            n_q = tree_q[t]
            t_q = q_nodes[n_q]
            w_q = q_weights[n_q]
            w0t = w0[n_q]
            for q in range(n_q):
                for r in range(nb):
                    g[0, q, r] = 1.0
                for k in range(k_out):
                    for r in range(nb):
                        acc[0, k, q, r] = 0.0
            has_dead[0] = False
            _route_block(nb, xb, root, feature, bin_threshold, threshold, missing_left, cat_bits, side, 0)
            current = 0               # depth of the inner node entered last: elements 1..current live
            i = root + 1
            while i < end:
                d = p_depth[i]
                while current >= d:
                    _leave(current, nb, k_out, n_q, p_feat, p_dup, w0t, wd, e_pos, o, acc, dead, has_dead, out_b)
                    current -= 1
                node = p_node[i]
                dup = p_dup[i]
                z = p_z[i]
                # o: the row goes this way here (and took the earlier splits on the feature)
                flip = 0.0 if p_left[i] else 1.0
                if dup > 0:
                    for r in range(nb):
                        o[d, r] = abs(flip - side[d - 1, r]) * o[dup, r]
                else:
                    for r in range(nb):
                        o[d, r] = abs(flip - side[d - 1, r])
                if z == 0.0:
                    taken = False
                    for r in range(nb):
                        if o[d, r] != 0.0:
                            taken = True
                    if not taken:
                        i = p_end[i]      # no cover and no row goes there: every term is zero
                        continue
                # the element's factors and exit weights at the quadrature nodes
                for q in range(n_q):
                    f0 = z * (1.0 - t_q[q])
                    f1 = z + (1.0 - z) * t_q[q]
                    e0[q] = f0
                    ed[q] = f1 - f0
                    wd[d, q] = w_q[q] * (1.0 - z) / f1 - w0t[q]
                if dup > 0:
                    z_before = p_z_before[i]
                    ratio = z / z_before if z_before > 0.0 else 0.0
                    for q in range(n_q):
                        before = z_before + (1.0 - z_before) * t_q[q]
                        e0[q] /= before
                        ed[q] /= before
                    for q in range(n_q):
                        a0 = e0[q]
                        a1 = ed[q]
                        for r in range(nb):
                            was = o[dup, r]
                            g[d, q, r] = g[d - 1, q, r] * (was * (a0 + o[d, r] * a1) + (1.0 - was) * ratio)
                else:
                    for q in range(n_q):
                        a0 = e0[q]
                        a1 = ed[q]
                        for r in range(nb):
                            g[d, q, r] = g[d - 1, q, r] * (a0 + o[d, r] * a1)
                e_pos[d] = i
                if feature[node] < 0:
                    # a leaf: its element's terms and its sums passed up at once
                    f = p_feat[i]
                    for k in range(k_out):
                        v = value[node, k]
                        for q in range(n_q):
                            a0 = w0t[q]
                            a1 = wd[d, q]
                            for r in range(nb):
                                a = g[d, q, r] * v
                                out_b[f, k, r] += a * (a0 + o[d, r] * a1)
                                acc[d - 1, k, q, r] += a
                    if dup > 0:
                        if not has_dead[dup]:
                            has_dead[dup] = True
                            for k in range(k_out):
                                for q in range(n_q):
                                    for r in range(nb):
                                        dead[dup, k, q, r] = 0.0
                        for k in range(k_out):
                            v = value[node, k]
                            for q in range(n_q):
                                for r in range(nb):
                                    dead[dup, k, q, r] += g[d, q, r] * v
                else:
                    for k in range(k_out):
                        for q in range(n_q):
                            for r in range(nb):
                                acc[d, k, q, r] = 0.0
                    has_dead[d] = False
                    _route_block(nb, xb, node, feature, bin_threshold, threshold, missing_left, cat_bits, side, d)
                    current = d
                i += 1
            while current > 0:
                _leave(current, nb, k_out, n_q, p_feat, p_dup, w0t, wd, e_pos, o, acc, dead, has_dead, out_b)
                current -= 1
        for r in range(nb):
            for f in range(n_features):
                for k in range(k_out):
                    out[r0 + r, f, k] = out_b[f, k, r]


@kernel(parallel=True)
def _par_shap_blocks(X, feature, bin_threshold, threshold, missing_left, cat_bits, value, offsets, max_depth,
                     p_node, p_depth, p_left, p_feat, p_dup, p_z, p_z_before, p_end, tree_q, q_nodes, q_weights, out,
                     n_chunks):
    n_blocks = (X.shape[0] + BLOCK - 1) // BLOCK
    per = (n_blocks + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        _shap_blocks(X, feature, bin_threshold, threshold, missing_left, cat_bits, value, offsets, max_depth,
                     p_node, p_depth, p_left, p_feat, p_dup, p_z, p_z_before, p_end, tree_q, q_nodes, q_weights, out,
                     c * per, min(n_blocks, (c + 1) * per))


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


def _quadrature_tables(distinct):
    """Per tree its node count ``tree_q`` (from the most distinct features on a path),
    and tables of nodes and weights by count (row ``q``: ``q`` nodes, padded)."""
    tree_q = np.maximum(1, -(-np.asarray(distinct, dtype=np.int64) // 2))
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

    Notes
    -----
    Rows are explained :data:`BLOCK` at a time per walk of a tree, blocks spread over
    Numba's threads from :data:`PARALLEL_MIN_ROWS` rows. A row's values do not depend on
    the other rows of the call nor on the thread count, bit for bit. Every call walks
    every node of the forest at least once, so one row costs about as much as a few.
    """
    packed, X, value, frac = _inputs(packed, X, frac, value)
    offsets = np.ascontiguousarray(packed["tree_offsets"], dtype=np.int64)
    out = np.zeros((X.shape[0], X.shape[1], value.shape[1]))
    depth = packed["depth"]
    max_depth = int(depth.max()) if len(depth) else 0
    feature = np.ascontiguousarray(packed["feature"], dtype=np.int32)
    schedule, distinct = _schedule(feature, np.ascontiguousarray(packed["left"], dtype=np.int32),
                                   np.ascontiguousarray(packed["right"], dtype=np.int32), frac, offsets, X.shape[1],
                                   max_depth)
    args = (X, feature, np.ascontiguousarray(packed["bin_threshold"], dtype=np.int32),
            np.ascontiguousarray(packed["threshold"], dtype=np.float64),
            np.ascontiguousarray(packed["missing_left"], dtype=np.uint8),
            np.ascontiguousarray(packed_cat_bits(packed)), value, offsets, max_depth) + schedule
    args += _quadrature_tables(distinct) + (out,)
    n_blocks = -(-X.shape[0] // BLOCK)
    threads = numba.get_num_threads()
    if X.shape[0] < PARALLEL_MIN_ROWS or threads == 1:
        _shap_blocks(*args, 0, n_blocks)
    else:
        _par_shap_blocks(*args, min(n_blocks, 16 * threads))
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
           "shap_tree_dicts", "PARALLEL_MIN_ROWS", "BLOCK"]

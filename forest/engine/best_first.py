"""Compiled best-first growth of one boosting tree on one process (numeric features).

:class:`forest.engine.expansion.LeafwiseGrower` grows a tree one split step at a time in
Python: pick the leaf of largest gain, partition its rows, build the smaller child's
histogram, subtract it from the parent's, search both children. Each step makes about six
calls into compiled kernels plus Python bookkeeping, ~200 us per step whatever the data's
size; at 5,000 rows x 20 features that was four fifths of a 100-tree fit (cProfile: 3,000
steps, 0.11 s in the kernels of 0.59 s), and LightGBM fit the same data 2.5x faster.

:func:`grow_tree` runs the same loop inside one compiled function on the same arrays, so
the tree is the Python loop's, bit for bit (tested against it, and through it against the
NumPy references of every kernel). It calls the kernels whose results it needs: the serial
histogram build, or the row-split build on the same threads where the Python loop would
(its sums depend on the thread count); the serial stable partition and the serial Newton
search, where the Python loop may run their parallel forms, which give the same results.

What it leaves to the Python loop, and why: several ranks (the reducer's collectives sit
between the steps), quantized (integer) histograms, vector leaves (multiclass), GPU
backends, unlimited ``max_leaf_nodes``, fits recorded by a :class:`forest.profiling.FitTrace`
(whose per-phase seconds price the cost model's phases; this loop's time is one ``"local"``
phase), and categorical features. Compile time decided the last one and the serial
kernels: Numba links every kernel this loop calls into it and LLVM optimises them again,
so each one costs its compile once more on a fresh machine. The first 3-tree GBDT fit with
an empty cache took 5.6 s with the Python loop, 39 s with a loop that also held the
categorical search and the parallel partition, search and feature-split builds, 20 s as
it is (15 s without the row-split build, which the thread-count-dependent sums need).

Histograms live in a pool of sibling pairs ``(pairs, 2, n_features, n_bins)`` of
complex ``(g, h)`` values, viewed as float ``(..., 2)`` for the search: the two children
of a split step sit side by side, as the search of two nodes reads them. A pair returns
to the pool when neither child needs its histogram (split, or not splittable), and the
pool doubles when full (it holds at most one pair per leaf). The Python loop allocated
three histograms per step; at 256 bins x 20+ features those are above glibc's mmap
threshold, and every step paid page faults for them.
"""
import numpy as np

from forest.engine.partition import _partition_table, numeric_side_table
from forest.engine.splitting import _newton_search_kernel, tie_threshold_jit
from histogram.cpu_kernels import _NO_PACKED, _gather, _gh_features, _gh_rows_parallel
from histogram.jit import compiled_only, empty, kernel, zeros

#: Node mask argument of the split search when every feature is searched.
_NO_MASK = np.ones((1, 1), dtype=np.bool_)


@compiled_only(inline="always")
def _summary(g, h, lam, shrinkage, out, i):
    """:meth:`forest.criteria.basic.NewtonCriterion.node_summary` of one output into node ``i``."""
    d = h + lam
    value = 0.0
    score = 0.0
    if d > 0:
        value = -g / d
        score = g * g / d
    out[i, 0] = h
    out[i, 1] = value * shrinkage
    out[i, 2] = -score


@compiled_only
def _build_child(binned, gh, rows, lo, hi, buf, partial, out, n_threads, gh_parallel_rows, split_by_rows, no_packed):
    """One child's (g, h) histogram ``out (n_features, n_bins)`` complex, the sums
    :meth:`forest.engine.hist_builder.HistogramBuilder.build_node` forms for a row subset: the
    row-split build on the same threads (its sums depend on the thread count), else the
    serial kernel (the feature-split build sums as one thread does)."""
    m = hi - lo
    n_features = binned.shape[0]
    threads = 1 if m < gh_parallel_rows else n_threads
    if split_by_rows and threads > 1 and n_features > 0:
        n_parts = min(threads, max(1, m))
        if n_parts > 1:
            _gh_rows_parallel(binned, no_packed, gh, rows, lo, hi, False, False, buf, out, partial[:n_parts - 1])
            return
    _gather(gh, rows, lo, hi, buf)
    _gh_features(binned, buf, rows, lo, hi, False, 0, n_features, out)


@kernel
def _grow(binned, gh, rows, scratch, buf, partial, root_hist, root_stats, root_count, nb, missing_bin, max_leaves,
          max_depth, split_rows, lam, min_leaf, min_hess, min_gain, rel_tol, shrinkage, n_threads, gh_parallel_rows,
          split_by_rows, no_packed, mask, feature, bin_, missing_left, gain, left, fields, count,
          depth, seg):
    """The best-first loop of :meth:`LeafwiseGrower._grow`; returns the node count.

    Node ``i``'s record: ``feature[i]`` (-1 for a leaf), ``bin_[i]``, ``missing_left[i]``,
    ``gain[i]``, ``left[i]`` (right = left + 1), ``fields[i] = (weight, value, objective)``,
    ``count[i]``, ``depth[i]``, ``seg[i] = (lo, hi)`` its rows ``rows[lo:hi]``.
    """
    n_features = root_hist.shape[0]
    n_bins = root_hist.shape[1]
    max_nodes = feature.shape[0]
    # per node: the row count the size test reads, the channel sums, the best split found
    stats = empty((max_nodes, 2), np.float64)
    cand = zeros(max_nodes, np.bool_)
    sp_f = empty(max_nodes, np.int32)
    sp_b = empty(max_nodes, np.int32)
    sp_ml = empty(max_nodes, np.bool_)
    sp_gain = empty(max_nodes, np.float64)
    sp_left = empty((max_nodes, 2), np.float64)
    sp_right = empty((max_nodes, 2), np.float64)
    slot = empty(max_nodes, np.int64)  # 2 * pair + side of the node's histogram, -1 none
    # the histogram pool (see the module docstring)
    cap = 4
    pool = empty((cap, 2, n_features, n_bins), np.complex128)
    refs = zeros(cap, np.int64)
    # one search call's arguments and results (two nodes at most)
    parent = empty((2, 2), np.float64)
    pcount = empty(2, np.float64)
    out_f = empty(2, np.int32)
    out_b = empty(2, np.int32)
    out_ml = empty(2, np.bool_)
    out_gain = empty(2, np.float64)
    out_l = empty((2, 2), np.float64)
    out_r = empty((2, 2), np.float64)

    for i in range(max_nodes):
        feature[i] = -1
        bin_[i] = 0
        missing_left[i] = False
        gain[i] = 0.0
        left[i] = -1
    _summary(root_stats[0], root_stats[1], lam, shrinkage, fields, 0)
    count[0] = root_count
    depth[0] = 0
    seg[0, 0] = 0
    seg[0, 1] = rows.shape[0]
    stats[0, 0] = root_stats[0]
    stats[0, 1] = root_stats[1]
    slot[0] = -1
    node_count = 1
    if 0 < max_depth and root_count >= split_rows:
        refs[0] = 1
        slot[0] = 0
        flat = pool.view(np.float64).reshape(cap, 2, n_features, n_bins, 2)
        flat[0, 0] = root_hist
        parent[0, 0] = stats[0, 0]
        parent[0, 1] = stats[0, 1]
        pcount[0] = root_count
        _newton_search_kernel(flat[0, 0:1], parent[0:1], nb, missing_bin, mask, False, pcount[0:1], True, 1, lam,
                              min_leaf, min_hess, min_gain, rel_tol, out_f[0:1], out_b[0:1], out_ml[0:1],
                              out_gain[0:1], out_l[0:1], out_r[0:1])
        sp_f[0] = out_f[0]
        sp_b[0] = out_b[0]
        sp_ml[0] = out_ml[0]
        sp_gain[0] = out_gain[0]
        sp_left[0, 0] = out_l[0, 0]
        sp_left[0, 1] = out_l[0, 1]
        sp_right[0, 0] = out_r[0, 0]
        sp_right[0, 1] = out_r[0, 1]
        cand[0] = out_f[0] >= 0
        if not cand[0]:
            refs[0] = 0
            slot[0] = -1
    n_leaves = 1
    while n_leaves < max_leaves:
        # the leaf to split: largest gain; gains tied by the split rule go to the lowest id
        any_cand = False
        best = -np.inf
        for i in range(node_count):
            if cand[i] and (not any_cand or sp_gain[i] > best):
                best = sp_gain[i]
                any_cand = True
        if not any_cand:
            break
        thr = tie_threshold_jit(best, rel_tol)
        node = -1
        for i in range(node_count):
            if cand[i] and sp_gain[i] >= thr:
                node = i
                break
        cand[node] = False
        lo = seg[node, 0]
        hi = seg[node, 1]
        d = depth[node]
        cnt = count[node]
        f = sp_f[node]
        b = sp_b[node]
        ml = sp_ml[node]
        table = numeric_side_table(np.int64(b), np.int64(1 if ml else 0), np.int64(missing_bin))
        n_left = _partition_table(rows, scratch, lo, hi, binned, np.int64(f), table)
        mid = lo + n_left
        lid = node_count
        rid = lid + 1
        node_count += 2
        for j in range(2):
            stats[lid, j] = sp_left[node, j]
            stats[rid, j] = sp_right[node, j]
        _summary(stats[lid, 0], stats[lid, 1], lam, shrinkage, fields, lid)
        _summary(stats[rid, 0], stats[rid, 1], lam, shrinkage, fields, rid)
        lw = fields[lid, 0]
        rw = fields[rid, 0]
        # counts are estimated from the weight share until the child's rows are counted
        tot_w = lw + rw
        l_est = cnt * lw / tot_w if tot_w > 0 else cnt / 2
        count[lid] = l_est
        count[rid] = cnt - l_est
        depth[lid] = d + 1
        depth[rid] = d + 1
        seg[lid, 0] = lo
        seg[lid, 1] = mid
        seg[rid, 0] = mid
        seg[rid, 1] = hi
        slot[lid] = -1
        slot[rid] = -1
        feature[node] = f
        bin_[node] = b
        missing_left[node] = ml
        gain[node] = sp_gain[node]
        left[node] = lid
        n_leaves += 1
        parent_slot = slot[node]
        slot[node] = -1
        can_l = d + 1 < max_depth and l_est >= split_rows
        can_r = d + 1 < max_depth and cnt - l_est >= split_rows
        if n_leaves >= max_leaves or not (can_l or can_r):
            refs[parent_slot // 2] -= 1
            continue
        # a pair for the children, the pool doubled when every pair is in use
        p = -1
        for q in range(cap):
            if refs[q] == 0:
                p = q
                break
        if p < 0:
            grown = empty((2 * cap, 2, n_features, n_bins), np.complex128)
            grown[:cap] = pool
            pool = grown
            grown_refs = zeros(2 * cap, np.int64)
            grown_refs[:cap] = refs
            refs = grown_refs
            p = cap
            cap *= 2
        flat = pool.view(np.float64).reshape(cap, 2, n_features, n_bins, 2)
        build_left = lw <= rw
        k = 0 if build_left else 1
        if build_left:
            _build_child(binned, gh, rows, lo, mid, buf, partial, pool[p, 0], n_threads, gh_parallel_rows,
                         split_by_rows, no_packed)
        else:
            _build_child(binned, gh, rows, mid, hi, buf, partial, pool[p, 1], n_threads, gh_parallel_rows,
                         split_by_rows, no_packed)
        pp = parent_slot // 2
        ps = parent_slot - 2 * pp
        built = flat[p, k]
        sibling = flat[p, 1 - k]
        phist = flat[pp, ps]
        for ff in range(n_features):
            for bb in range(n_bins):
                sibling[ff, bb, 0] = phist[ff, bb, 0] - built[ff, bb, 0]
                sibling[ff, bb, 1] = phist[ff, bb, 1] - built[ff, bb, 1]
        refs[pp] -= 1
        small = np.float64(mid - lo) if build_left else np.float64(hi - mid)
        lc = small if build_left else cnt - small
        rc = cnt - small if build_left else small
        count[lid] = lc
        count[rid] = rc
        todo_l = d + 1 < max_depth and lc >= split_rows
        todo_r = d + 1 < max_depth and rc >= split_rows
        if not (todo_l or todo_r):
            continue
        first = 0 if todo_l else 1
        n_todo = 2 if todo_l and todo_r else 1
        for j in range(n_todo):
            nid = lid + first + j
            parent[j, 0] = stats[nid, 0]
            parent[j, 1] = stats[nid, 1]
            pcount[j] = count[nid]
        _newton_search_kernel(flat[p, first:first + n_todo], parent[:n_todo], nb, missing_bin, mask, False,
                              pcount[:n_todo], True, 1, lam, min_leaf, min_hess, min_gain, rel_tol, out_f[:n_todo],
                              out_b[:n_todo], out_ml[:n_todo], out_gain[:n_todo], out_l[:n_todo], out_r[:n_todo])
        for j in range(n_todo):
            nid = lid + first + j
            sp_f[nid] = out_f[j]
            sp_b[nid] = out_b[j]
            sp_ml[nid] = out_ml[j]
            sp_gain[nid] = out_gain[j]
            sp_left[nid, 0] = out_l[j, 0]
            sp_left[nid, 1] = out_l[j, 1]
            sp_right[nid, 0] = out_r[j, 0]
            sp_right[nid, 1] = out_r[j, 1]
            if out_f[j] >= 0:
                cand[nid] = True
                slot[nid] = 2 * p + first + j
                refs[p] += 1
    return node_count


def grow_tree(binned, channels, rows, scratch, buf, partial, root_hist, root_stats, root_count, *, nb, missing_bin,
              max_leaves, max_depth, split_rows, criterion, min_gain, rel_tol, shrinkage, n_threads, gh_parallel_rows,
              split_by_rows):
    """Grow one one-output Newton tree from its root histogram; the records of its nodes.

    Parameters
    ----------
    binned : ndarray of uint8 or uint16, shape (n_features, n_rows), C-contiguous
    channels : ndarray of float64, shape (n_rows, 2), C-contiguous
        Gradient and hessian per row.
    rows : ndarray of int32, shape (m,)
        The tree's local rows; reordered in place, grouped by leaf on return.
    scratch : ndarray of int32, shape (>= m,)
    buf : ndarray of float64, shape (>= 2 * m,)
        Gather scratch of the histogram builds.
    partial : ndarray of float64, shape (>= n_threads - 1, n_features, n_bins, 2), C-contiguous
        Row-split scratch of the histogram builds.
    root_hist : ndarray of float64, shape (n_features, n_bins, 2)
        The root's histogram.
    root_stats : ndarray of float64, shape (2,)
    root_count : float
    nb : ndarray of int64, shape (n_features,)
        Value bins per feature.
    missing_bin : int
    max_leaves, max_depth, split_rows : int
        Leaf budget, depth limit, fewest rows of a splittable leaf.
    criterion : forest.criteria.basic.NewtonCriterion
        One output (its ``l2_regularization``, ``min_samples_leaf``, ``min_child_weight``).
    min_gain, rel_tol, shrinkage : float
    n_threads, gh_parallel_rows : int
    split_by_rows : bool
        ``EngineOptions.gh_hist_split == "rows"``.

    Returns
    -------
    dict of ndarray
        Per node (``node_count`` of them, root first, children in pairs): ``feature``
        (int32, -1 for leaves), ``bin`` (int32), ``missing_left`` (bool), ``gain``,
        ``left`` (int64, -1 for leaves), ``weight``, ``value``, ``objective``, ``count``
        (float64), ``depth`` (int64), ``seg`` (int64 ``(node_count, 2)``: the leaf's rows
        ``rows[lo:hi]``).
    """
    max_nodes = 2 * int(max_leaves) - 1
    feature = np.empty(max_nodes, dtype=np.int32)
    bin_ = np.empty(max_nodes, dtype=np.int32)
    missing_left = np.empty(max_nodes, dtype=np.bool_)
    gain = np.empty(max_nodes)
    left = np.empty(max_nodes, dtype=np.int64)
    fields = np.empty((max_nodes, 3))
    count = np.empty(max_nodes)
    depth = np.empty(max_nodes, dtype=np.int64)
    seg = np.empty((max_nodes, 2), dtype=np.int64)
    n_features, n_bins = root_hist.shape[:2]
    gh = channels.reshape(-1).view(np.complex128)
    pv = partial.reshape(partial.shape[0], n_features, 2 * n_bins).view(np.complex128)
    n = _grow(binned, gh, rows, scratch, buf.view(np.complex128), pv, np.ascontiguousarray(root_hist),
              np.ascontiguousarray(root_stats, dtype=np.float64), float(root_count), nb, int(missing_bin),
              int(max_leaves), int(max_depth), float(split_rows), float(criterion.l2_regularization),
              float(criterion.min_samples_leaf), float(criterion.min_child_weight), float(min_gain), float(rel_tol),
              float(shrinkage), int(n_threads), int(gh_parallel_rows), bool(split_by_rows), _NO_PACKED, _NO_MASK, feature, bin_, missing_left, gain, left, fields, count, depth, seg)
    return {"feature": feature[:n], "bin": bin_[:n], "missing_left": missing_left[:n], "gain": gain[:n],
            "left": left[:n], "weight": fields[:n, 0], "value": fields[:n, 1], "objective": fields[:n, 2],
            "count": count[:n], "depth": depth[:n], "seg": seg[:n]}

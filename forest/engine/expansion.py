"""The expansion step of tree growth and its two policies: level-wise and best-first.

This module owns the growth *loops*: which nodes are split next, and the step that
splits them. The step is the same for both policies: find each node's best split
from reduced histograms (:mod:`forest.engine.reducers`, which hides whether and how ranks
communicate), partition the nodes' local rows (:mod:`forest.engine.partition`), record the
children (:mod:`forest.engine.node_records`), and get the children's histograms by building
the smaller one and subtracting (:mod:`forest.engine.hist_builder`).

:func:`grow_levelwise` (forests)
    Expands every frontier node of a *batch* of trees at once, level by level: one
    histogram build and one collective per level for all trees. Each tree has its own
    local row set (int32 local row ids, e.g. the split half of its subsample on this
    rank). Per-node feature subsampling (mtry) is a pure function of ``(seed, tree
    index, node id)``. Nodes whose global weight is at most
    ``EngineOptions.local_threshold`` leave the level-wise path and are finished
    exactly by the compiled subtree kernel (:mod:`forest.engine.tree_parallel`); by default
    that is every tree from its root, and the histogram path stays for criteria
    without compiled pieces (:meth:`forest.criteria.basic.Criterion.compiled`) and for
    nodes too big for one task.
:class:`LeafwiseGrower` (boosting)
    Expands one leaf per step, best first: the leaf with the largest gain is split
    next until ``max_leaf_nodes`` leaves (optionally also ``max_depth``). Per step
    one collective carries the smaller child's histogram and its exact row count.

Stops everywhere at ``max_depth``, at nodes whose size (``Criterion.node_size``) is below
``min_samples_split``, and where no split has ``gain > min_gain``.

Histogram memory: a level holds the histograms of its frontier,
``n_frontier * n_features * n_bins * C * 8`` bytes; callers size tree batches with it.
"""
import functools

import numpy as np

from native import collectives as col
from native.comm import world

from histogram.dtypes import bin_dtype

from forest._validation import check_codes
from forest.engine.best_first import grow_tree
from forest.engine.bin_info import BinInfo
from forest.engine.categorical_split import drop_stray_categories
from forest.engine.growth_options import TreeParams, current_engine_options
from forest.engine.hist_builder import HistogramBuilder
from forest.engine.int_packing import WireLayout
from forest.engine.mtry import mtry_feature_mask
from forest.engine.node_records import add_roots, record_splits
from forest.engine.partition import partition_rows, partition_segment, sum_channels_by_node
from forest.profiling import TIMER, phase
from forest.engine.reducers import make_reducer
from forest.engine.splitting import REL_TOL, SplitResult, tie_threshold
from forest.engine.tree import CAT_BITS_DTYPE, CATEGORICAL_SPLIT, Tree
from forest.engine.tree_parallel import TreeParallelFinisher


def _check_binned(binned, channels, bin_info):
    if bin_info.wide:
        # Wide categorical codes are gradient boosting's (LeafwiseGrower): the level-wise
        # forests' subtree kernel (forest.engine.local_growth) keeps uint8 codes and 4-word
        # bitsets in its split records, so the forests fold a column past max_bins instead.
        raise ValueError(f"the level-wise grower takes bin axes of up to 256 bins (uint8 codes), got "
                         f"{bin_info.n_bins}: forests fold a categorical column of more than max_bins categories "
                         "(histogram.categories); wide codes are for gradient boosting")
    binned = check_codes(binned, bin_info.n_features)
    channels = np.ascontiguousarray(channels, dtype=np.float64)
    if channels.ndim != 2 or channels.shape[0] != binned.shape[1]:
        raise ValueError(f"channels must have shape (n_rows={binned.shape[1]}, C), got {channels.shape}")
    return binned, channels


def _pairs(a, b):
    """Interleave ``a`` and ``b`` along the first axis: a0, b0, a1, b1, ..."""
    return np.stack([a, b], axis=1).reshape((-1,) + np.shape(a)[1:])


def grow_levelwise(binned, channels, tree_rows, criterion, bin_mapper, params=None, *, tree_indices=None, comm=None,
                   gids=None, engine=None):
    """Grow a batch of trees level by level.

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows)
        This rank's binned rows (feature-major).
    channels : ndarray of float64, shape (n_rows, C)
        The criterion's per-row channels.
    tree_rows : sequence of ndarray of int32
        Per tree, the local row ids it grows on (may be empty on some ranks).
    criterion : forest.criteria.basic.Criterion
    bin_mapper : BinMapper or forest.engine.bin_info.BinInfo
    params : forest.engine.growth_options.TreeParams, optional
        What to grow (default ``TreeParams()``).
    tree_indices : array-like of int, shape (n_trees,), optional
        Global index of each tree in the forest (keys mtry); default ``0..n_trees-1``.
    comm : native.comm.Communicator, optional
        ``None`` means ``native.comm.world()``.
    gids : ndarray of int64, shape (n_rows,), optional
        Global id of each local row. Required for tree-parallel finishing on several
        ranks (the gathered rows of a node are put in global-id order).
    engine : forest.engine.growth_options.EngineOptions, optional
        How to grow (default: :func:`forest.engine.growth_options.current_engine_options`).
        With ``local_threshold`` between 0 and inf, node ids follow histogram levels
        down to the small nodes and depth-first order inside each finished subtree;
        with ``mtry=None`` and no tied gains the trees have the same structure for
        every threshold.

    Returns
    -------
    list of Tree
        Node values are ``criterion.node_value`` of the growing rows; identical on all
        ranks.
    """
    comm = world() if comm is None else comm
    params = TreeParams() if params is None else params
    engine = current_engine_options() if engine is None else engine
    bin_info = BinInfo.from_mapper(bin_mapper)
    binned, channels = _check_binned(binned, channels, bin_info)
    n_trees = len(tree_rows)
    if n_trees == 0:
        return []
    if channels.shape[1] != criterion.n_channels:
        raise ValueError(f"criterion expects {criterion.n_channels} channels, got {channels.shape[1]}")
    tree_indices = np.arange(n_trees) if tree_indices is None else np.asarray(tree_indices, dtype=np.int64)
    if tree_indices.shape != (n_trees,):
        raise ValueError(f"tree_indices must have shape ({n_trees},)")
    local_threshold = min(float(engine.local_threshold), float(engine.task_rows(bin_info.n_features, channels.shape[1])))
    compiled = criterion.compiled() if local_threshold > 0 else None
    if gids is not None:
        gids = np.asarray(gids, dtype=np.int64)
        if gids.shape != (binned.shape[1],):
            raise ValueError(f"gids must have shape ({binned.shape[1]},), got {gids.shape}")
    if compiled is not None and comm.size > 1 and gids is None:
        raise ValueError("local finishing on several ranks needs gids (global row ids); pass gids= or "
                         "local_threshold=0")
    max_depth = params.depth_limit
    min_split = params.min_samples_split
    reducer = make_reducer(comm, bin_info.n_features, engine.split_mode, engine.algorithm)
    builder = HistogramBuilder(binned, bin_info.n_bins, channels.shape[1], engine)
    # Every build of this call reads these channels, unchanged; the builder is local
    # to the call, so nothing needs releasing (a GPU backend uploads them once).
    builder.hold(channels)
    finisher = None
    if compiled is not None:
        finisher = TreeParallelFinisher(compiled, criterion, binned, channels, gids, bin_info, comm, tree_indices,
                                        params, engine)

    lengths = np.array([len(r) for r in tree_rows], dtype=np.int64)
    rows = np.concatenate([np.asarray(r, dtype=np.int32) for r in tree_rows]) if lengths.sum() else \
        np.zeros(0, dtype=np.int32)
    rows = np.ascontiguousarray(rows, dtype=np.int32)
    scratch = np.empty_like(rows)
    starts = np.zeros(n_trees + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])

    local_tot = sum_channels_by_node(channels, rows, np.repeat(np.arange(n_trees), lengths), n_trees)
    if finisher is None:
        # Roots: one build, one collective (histograms + each root's channel totals).
        hist, tot = reducer.reduce(builder.build(channels, rows, starts), local_tot.ravel())
        stats = tot.reshape(n_trees, -1)
    else:
        # Totals first (a small collective): roots that local finishing takes whole
        # (all of them with the default threshold) need no histogram at all.
        stats = reducer.reduce_small(local_tot.ravel()).reshape(n_trees, -1)
        r_size = np.asarray(criterion.node_size(stats), dtype=np.float64)
        big = np.flatnonzero((r_size >= min_split) & (0 < max_depth) & (r_size > local_threshold))
        hist = np.zeros((n_trees, reducer.f1 - reducer.f0, bin_info.n_bins, channels.shape[1]))
        if len(big):
            hist[big], _ = reducer.reduce(builder.build_segments(channels, rows, starts[:-1][big], starts[1:][big]),
                                          np.zeros(0))
    trees = [Tree(criterion.n_outputs) for _ in range(n_trees)]
    _, count = add_roots(trees, criterion, stats)
    size = np.asarray(criterion.node_size(stats), dtype=np.float64)

    f_tree = np.arange(n_trees)
    f_node = np.zeros(n_trees, dtype=np.int64)
    f_lo, f_hi = starts[:-1].copy(), starts[1:].copy()
    depth = 0
    keep = (size >= min_split) & (depth < max_depth)
    small = keep & (size <= local_threshold) if finisher is not None else np.zeros(n_trees, dtype=bool)
    # Pending small nodes: (tree, node, depth, lo, hi, rows) finished at the top of the loop.
    pend = (f_tree[small], f_node[small], np.zeros(int(small.sum()), dtype=np.int64), f_lo[small], f_hi[small],
            count[small])
    keep &= ~small
    f_tree, f_node, f_lo, f_hi, stats, hist = (f_tree[keep], f_node[keep], f_lo[keep], f_hi[keep], stats[keep],
                                               hist[keep])
    while True:
        if finisher is not None:
            finisher.finish(trees, rows, *pend)
        if not len(f_tree):
            break
        mask = None if params.mtry is None else mtry_feature_mask(params.seed, tree_indices[f_tree], f_node,
                                                                  bin_info.n_features, params.mtry)
        res = reducer.find(hist, stats, criterion, bin_info, feature_mask=mask, min_gain=params.min_gain)
        split = np.flatnonzero(res.valid)
        if len(split) == 0:
            break
        with phase("partition"):
            n_left = partition_rows(rows, scratch, f_lo[split], f_hi[split], binned, res.feature[split],
                                    res.bin[split], res.missing_left[split].astype(np.uint8), bin_info.missing_bin,
                                    res.cat_bits[split])
        # Record the splits and children (left id, right id = left + 1) in tree order.
        child_depth = depth + 1
        with phase("other"):
            left_ids = record_splits(trees, criterion, f_tree[split], f_node[split], res.left_stats[split],
                                     res.right_stats[split], child_depth, res.feature[split], res.bin[split],
                                     res.missing_left[split], res.gain[split], bin_info, res.cat_bits[split])
        right_ids = left_ids + 1
        lo, hi = f_lo[split], f_hi[split]
        mid = lo + n_left
        lw = criterion.node_size(res.left_stats[split])
        rw = criterion.node_size(res.right_stats[split])
        can_l = (lw >= min_split) & (child_depth < max_depth)
        can_r = (rw >= min_split) & (child_depth < max_depth)
        if finisher is not None:
            loc_l, loc_r = can_l & (lw <= local_threshold), can_r & (rw <= local_threshold)
        else:
            loc_l = loc_r = np.zeros(len(split), dtype=bool)
        # Small children wait for local finishing, interleaved (left, right) per split.
        tl = f_tree[split]
        p_sel = _pairs(loc_l, loc_r)
        p_cnt = _pairs(criterion.node_count(res.left_stats[split]), criterion.node_count(res.right_stats[split]))
        pend = (_pairs(tl, tl)[p_sel], _pairs(left_ids, right_ids)[p_sel],
                np.full(int(p_sel.sum()), child_depth, dtype=np.int64), _pairs(lo, mid)[p_sel],
                _pairs(mid, hi)[p_sel], p_cnt[p_sel])
        hist_l, hist_r = can_l & ~loc_l, can_r & ~loc_r
        need = hist_l | hist_r
        depth = child_depth
        if not need.any():
            f_tree = f_tree[:0]
            continue
        p = np.flatnonzero(need)
        # smaller child by global size (rows where the criterion counts them); ties build the left
        left_hist, right_hist = builder.children(reducer, channels, rows, hist[split[p]], lo[p], mid[p], hi[p],
                                                 lw[p] <= rw[p])
        # Next frontier: interleave (left, right) per split, keep the histogram ones.
        tp = f_tree[split[p]]
        n_keep = _pairs(hist_l[p], hist_r[p])
        f_tree = _pairs(tp, tp)[n_keep]
        f_node = _pairs(left_ids[p], right_ids[p])[n_keep]
        f_lo = _pairs(lo[p], mid[p])[n_keep]
        f_hi = _pairs(mid[p], hi[p])[n_keep]
        stats = _pairs(res.left_stats[split[p]], res.right_stats[split[p]])[n_keep]
        hist = _pairs(left_hist, right_hist)[n_keep]
    return trees


class GrownTree:
    """A tree from :class:`LeafwiseGrower` plus where its training rows ended.

    Attributes
    ----------
    tree : Tree
    rows : ndarray of int32, shape (m,)
        The local training rows, grouped by leaf.
    leaf_nodes : ndarray of int64, shape (n_leaves,)
    leaf_starts, leaf_stops : ndarray of int64, shape (n_leaves,)
        Leaf ``leaf_nodes[i]`` owns ``rows[leaf_starts[i]:leaf_stops[i]]``.
    """

    def __init__(self, tree, rows, leaf_nodes, leaf_starts, leaf_stops):
        self.tree = tree
        self.rows = rows
        self.leaf_nodes = leaf_nodes
        self.leaf_starts = leaf_starts
        self.leaf_stops = leaf_stops


class LeafwiseGrower:
    """Best-first growth of one tree at a time (gradient boosting).

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows)
    bin_mapper : BinMapper or forest.engine.bin_info.BinInfo
    criterion : forest.criteria.basic.Criterion
    max_leaf_nodes : int or None, default 31
        ``None`` means unlimited (then ``max_depth`` should be set).
    max_depth : int or None
    min_gain : float
    comm : native.comm.Communicator, optional
    backend : str, optional
    split_mode : {"allreduce", "reduce_scatter"}, optional
    algorithm : str, optional
        These three override ``engine``'s.
    engine : forest.engine.growth_options.EngineOptions, optional
        Default: :func:`forest.engine.growth_options.current_engine_options`.
    quantized : bool, default False
        Prepare for :meth:`grow` with ``quantized=`` (integer histograms; a
        :class:`forest.criteria.basic.NewtonCriterion` and ``split_mode="allreduce"``).

    Notes
    -----
    On one process with numeric features, scalar leaves and float histograms, :meth:`grow` runs the loop below
    in one compiled call (:mod:`forest.engine.best_first`; the same trees), unless
    ``EngineOptions.compiled_best_first`` is False or a ``FitTrace`` is recording.
    """

    def __init__(self, binned, bin_mapper, criterion, *, max_leaf_nodes=31, max_depth=None, min_gain=0.0,
                 comm=None, backend=None, split_mode=None, algorithm=None, engine=None, quantized=False):
        self.bin_info = BinInfo.from_mapper(bin_mapper)
        self.binned = check_codes(binned, self.bin_info.n_features, dtype=bin_dtype(self.bin_info.n_bins))
        if max_leaf_nodes is not None and max_leaf_nodes < 2:
            raise ValueError(f"max_leaf_nodes must be >= 2 or None, got {max_leaf_nodes}")
        if max_leaf_nodes is None and max_depth is None:
            raise ValueError("set max_leaf_nodes or max_depth")
        engine = current_engine_options() if engine is None else engine
        self.engine = engine.replace(backend=backend, split_mode=split_mode, algorithm=algorithm)
        self.criterion = criterion
        self.max_leaf_nodes = np.iinfo(np.int64).max if max_leaf_nodes is None else int(max_leaf_nodes)
        self.max_depth = np.iinfo(np.int32).max if max_depth is None else int(max_depth)
        self.min_gain = float(min_gain)
        self.comm = world() if comm is None else comm
        self.reducer = make_reducer(self.comm, self.bin_info.n_features, self.engine.split_mode,
                                    self.engine.algorithm)
        self.builder = HistogramBuilder(self.binned, self.bin_info.n_bins, criterion.n_channels, self.engine,
                                        quantized=quantized)
        self.binned = self.builder.binned
        self._scratch = None
        self._quant = None
        self._bin_rows = None
        if quantized:
            if self.engine.split_mode != "allreduce":
                raise ValueError("quantized histograms need split_mode='allreduce'")
            if self.engine.backend not in ("auto", "numba", "numpy"):
                raise ValueError(f"quantized histograms run on the CPU backends, not {self.engine.backend!r}")
            self._bin_rows = self._global_bin_rows()
        # A criterion's fused search (numba_search) is called directly when one rank
        # searches every feature without a mask, skipping find_best_splits' per-call
        # checks (the grower's arrays are float64, contiguous and of known shapes).
        # Measured at 28 features x 256 bins, one node: 82-86 -> 76 us per call.
        # With categorical features, the criterion's compiled categorical search plays that
        # part (the NumPy branch's order, permute and two searches cost ~180 us per call).
        red = self.reducer
        whole = (not red.scattered and red.f0 == 0 and red.f1 == self.bin_info.n_features
                 and self.bin_info.missing_bin > 0)
        self._fused = None
        if whole and not self.bin_info.any_categorical:
            self._fused = getattr(criterion, "numba_search", None)
        elif whole and getattr(criterion, "numba_categorical_search", None) is not None:
            self._fused = functools.partial(criterion.numba_categorical_search,
                                            categorical=np.asarray(self.bin_info.categorical, dtype=bool))
        self._nb = np.ascontiguousarray(self.bin_info.n_bins_non_missing, dtype=np.int64)
        # Categorical features of this rank's histogram slice and the hessian channels by which
        # a subtracted sibling's rounding-only categories are dropped (drop_stray_categories:
        # otherwise the bitsets of boosting depend on the rank count).
        from forest.criteria.basic import NewtonCriterion

        cats = np.flatnonzero(self.bin_info.categorical[red.f0:red.f1])
        k = getattr(criterion, "n_outputs", 0)
        self._stray = (cats.astype(np.int64), k, 2 * k) \
            if len(cats) and isinstance(criterion, NewtonCriterion) else None
        # Fewest rows a splittable leaf holds (both children need min_samples_leaf).
        self._split_rows = 2 * getattr(criterion, "min_samples_leaf", 1)
        # The compiled loop (forest.engine.best_first) grows the float path's trees when one
        # process holds every row and feature, the features are numeric, the leaves scalar and
        # the histograms the CPU's (g, h) ones; a leaf budget bounds its node arrays.
        self._compiled = (self._fused is not None and not self.bin_info.any_categorical and self.comm.size == 1
                          and self.builder.gh
                          and isinstance(criterion, NewtonCriterion) and criterion.n_outputs == 1
                          and max_leaf_nodes is not None and self.engine.compiled_best_first)
        self._cbuf = None
        self._cpartial = None

    def _global_bin_rows(self):
        """Training rows per (feature, bin) over all ranks, int64 (n_features * n_bins,): the
        bound of the quantized wire packing (:mod:`forest.engine.int_packing`)."""
        from histogram.quantize import pack

        ones = np.full((1, self.binned.shape[1]), pack(0, 1), dtype=np.int64)
        local = self.builder.build_codes(ones, None, 0, self.binned.shape[1])
        if self.comm.size > 1:
            with phase("communication"):
                local = col.allreduce(self.comm, local)
        return np.ascontiguousarray(local, dtype=np.int64)

    def _reduce_codes(self, rows, lo, hi, row_cap):
        """Reduced exact ``(G, H)`` histogram (n_features, n_bins, 2K) int64 and global rows of one node."""
        quant = self._quant
        k = quant.n_outputs
        local = self.builder.build_codes(quant.codes, rows, lo, hi)

        def layout():
            return WireLayout(self._bin_rows, row_cap, k, quant.levels)

        sums, count = self.reducer.reduce_codes(local, k, hi - lo, layout)
        return sums.reshape(self.binned.shape[0], self.bin_info.n_bins, 2 * k), count

    def _splittable(self, depth, count):
        """Whether a leaf at ``depth`` with ``count`` rows may be split (Python scalars in, bool out)."""
        return depth < self.max_depth and count >= self._split_rows

    def grow(self, channels, rows=None, shrinkage=1.0, quantized=None):
        """Grow one tree.

        Parameters
        ----------
        channels : ndarray of float64, shape (n_rows, C)
        rows : ndarray of int32, shape (m,), optional
            Local training rows (all rows when omitted); not modified.
        shrinkage : float
            Multiplies every node value (the learning rate).
        quantized : forest.engine.quantized.QuantizedGradients, optional
            Grow from its integer histograms (exact sums, converted to float by its
            scales for the criterion's search) instead of float histograms of
            ``channels``. Node values are then those of the quantized sums until
            :func:`forest.engine.quantized.refit_leaves` recomputes them from ``channels``.

        Returns
        -------
        GrownTree
        """
        binned = self.binned
        channels = np.ascontiguousarray(channels, dtype=np.float64)
        if channels.shape != (binned.shape[1], self.criterion.n_channels):
            raise ValueError(f"channels must have shape ({binned.shape[1]}, {self.criterion.n_channels}), "
                             f"got {channels.shape}")
        # Every node of the tree is built from these channels (a GPU backend uploads
        # them once per tree, not per node).
        with self.builder.holding(channels):
            return self._grow(channels, rows, shrinkage, quantized)

    def _grow(self, channels, rows, shrinkage, quantized):
        """:meth:`grow` on checked, C-contiguous ``channels``."""
        crit, info, red = self.criterion, self.bin_info, self.reducer
        binned = self.binned
        identity = rows is None
        rows = np.arange(binned.shape[1], dtype=np.int32) if identity else np.array(rows, dtype=np.int32)
        if self._scratch is None or len(self._scratch) < len(rows):
            self._scratch = np.empty(len(rows), dtype=np.int32)
        scratch = self._scratch
        n_local = len(rows)
        self._quant = quantized
        if quantized is not None:
            if self._bin_rows is None:
                raise ValueError("grow(quantized=...) needs a LeafwiseGrower built with quantized=True")
            if n_local * quantized.levels >= 2 ** 31:
                raise ValueError(f"quantized histograms hold at most {2 ** 31 // quantized.levels} rows per rank")
            hist, root_count = self._reduce_codes(None if identity else rows, 0, n_local,
                                                  int(self._bin_rows[:self.bin_info.n_bins].sum()))
            hist = hist[None]
            # Feature 0's bins hold every row once: their sums are the node's totals.
            root_stats = hist[0, 0].sum(axis=0) * quantized.scale
            root_count = float(root_count)
        else:
            local = self.builder.build_node(channels, None if identity else rows, 0, n_local)
            # Every row lands in exactly one bin of feature 0, so its bins sum to the node's
            # channel totals: no pass over the rows (numpy's strided axis-0 sum of an (n, 2)
            # array cost 2.6 ms per tree at 200k rows).
            local_tot = local[0, 0].sum(axis=0) if binned.shape[0] else np.zeros(channels.shape[1])
            hist, extra = red.reduce(local, np.concatenate([local_tot, [n_local]]))
            root_stats, root_count = extra[:-1], extra[-1]
            if self._compiled and TIMER.trace is None:
                return self._grow_compiled(channels, rows, scratch, hist[0], root_stats, root_count, shrinkage)
        tree = Tree(crit.n_outputs)
        weight, value, objective = crit.node_summary(root_stats, shrinkage)
        tree.add_node(0, weight, value, objective, count=root_count)
        # Per leaf: [lo, hi, depth, count, stats, hist, split]; split None = not splittable.
        leaves = {0: [0, n_local, 0, root_count, root_stats, hist[0], None]}
        # Gain (a Python float) of each leaf with an admissible split: the candidates of _pick.
        gains = {}
        if self._splittable(0, root_count):
            leaves[0][6] = self._find(hist[:1], [root_stats], [root_count])
            self._note_gain(gains, 0, leaves[0][6], 0)
        n_leaves = 1
        while n_leaves < self.max_leaf_nodes:
            node = self._pick(gains)
            if node is None:
                break
            del gains[node]
            lo, hi, depth, count, stats, phist, sp = leaves.pop(node)
            f, b, ml = int(sp.feature[0]), int(sp.bin[0]), bool(sp.missing_left[0])
            with phase("partition"):
                n_left = partition_segment(rows, scratch, lo, hi, binned, f, b, ml, info.missing_bin,
                                           self.engine.partition_blocks_min_rows, sp.cat_bits[0])
            mid = lo + n_left
            ls, rs = sp.left_stats[0], sp.right_stats[0]
            left_fields = crit.node_summary(ls, shrinkage)
            right_fields = crit.node_summary(rs, shrinkage)
            lw, rw = left_fields[0], right_fields[0]
            # Counts are estimated from the weight share until the collective brings the exact one.
            tot_w = lw + rw
            l_est = count * lw / tot_w if tot_w > 0 else count / 2
            # Both children in one append (tree.add_node twice cost ~2x the Python work).
            lid = tree.append_leaves(np.array([lw, rw], dtype=np.float64),
                                     np.array([l_est, count - l_est], dtype=np.float64),
                                     np.array([left_fields[1], right_fields[1]], dtype=np.float64).reshape(
                                         2, crit.n_outputs),
                                     np.array([left_fields[2], right_fields[2]], dtype=np.float64),
                                     np.array([depth + 1, depth + 1]))
            rid = lid + 1
            if b == CATEGORICAL_SPLIT:
                tree.set_split(node, f, b, np.nan, ml, float(sp.gain[0]), lid, rid, sp.cat_bits[0])
            else:
                tree.set_split(node, f, b, info.threshold(f, b), ml, float(sp.gain[0]), lid, rid)
            n_leaves += 1
            can_l = self._splittable(depth + 1, l_est)
            can_r = self._splittable(depth + 1, count - l_est)
            last = n_leaves >= self.max_leaf_nodes
            if last or not (can_l or can_r):
                leaves[lid] = [lo, mid, depth + 1, l_est, ls, None, None]
                leaves[rid] = [mid, hi, depth + 1, count - l_est, rs, None, None]
                continue
            build_left = lw <= rw
            if quantized is not None:
                built, small_count = self._reduce_codes(rows, *((lo, mid) if build_left else (mid, hi)), count)
                sibling = phist - built
                lh, rh = (built, sibling) if build_left else (sibling, built)
                small_count = float(small_count)
            else:
                pair, extra = self.builder.child_pair(red, channels, rows, phist, lo, mid, hi, build_left,
                                                      np.array([float(mid - lo if build_left else hi - mid)]))
                if self._stray is not None:
                    drop_stray_categories(pair[1 if build_left else 0], phist, *self._stray, info.missing_bin,
                                          REL_TOL)
                lh, rh = pair[0], pair[1]
                small_count = float(extra[0])
            lc, rc = (small_count, count - small_count) if build_left else (count - small_count, small_count)
            tree.set_count(lid, lc)
            tree.set_count(rid, rc)
            leaves[lid] = [lo, mid, depth + 1, lc, ls, lh, None]
            leaves[rid] = [mid, hi, depth + 1, rc, rs, rh, None]
            todo = [i for i, c in ((lid, lc), (rid, rc)) if self._splittable(depth + 1, c)]
            if todo:
                if quantized is None:
                    # The children's histograms are already one stacked array: no copy.
                    hists = pair if len(todo) == 2 else pair[todo[0] - lid:todo[0] - lid + 1]
                else:
                    hists = [leaves[i][5] for i in todo]
                res = self._find(hists, [leaves[i][4] for i in todo], [leaves[i][3] for i in todo])
                for j, i in enumerate(todo):
                    leaves[i][6] = res.take(slice(j, j + 1))  # views, no copies
                    self._note_gain(gains, i, res, j)
            for i in (lid, rid):
                leaves[i][5] = None if leaves[i][6] is None else leaves[i][5]
        leaf_nodes = np.array(sorted(leaves), dtype=np.int64)
        leaf_starts = np.array([leaves[i][0] for i in leaf_nodes], dtype=np.int64)
        leaf_stops = np.array([leaves[i][1] for i in leaf_nodes], dtype=np.int64)
        return GrownTree(tree, rows, leaf_nodes, leaf_starts, leaf_stops)

    def _grow_compiled(self, channels, rows, scratch, root_hist, root_stats, root_count, shrinkage):
        """The rest of :meth:`_grow` in :func:`forest.engine.best_first.grow_tree` (the same tree).

        Its time is one ``"local"`` phase; a traced fit (whose phases price the cost model)
        takes the Python loop instead.
        """
        import numba

        info, crit = self.bin_info, self.criterion
        n_features, n_bins = root_hist.shape[:2]
        threads = numba.get_num_threads()
        if self._cbuf is None or len(self._cbuf) < 2 * len(rows):
            self._cbuf = np.empty(2 * len(rows))
        if self._cpartial is None or self._cpartial.shape[0] != max(threads - 1, 0):
            self._cpartial = np.empty((max(threads - 1, 0), n_features, n_bins, 2))
        with phase("local"):
            rec = grow_tree(self.binned, channels, rows, scratch, self._cbuf, self._cpartial, root_hist, root_stats,
                            root_count, nb=self._nb, missing_bin=info.missing_bin, max_leaves=self.max_leaf_nodes,
                            max_depth=self.max_depth, split_rows=self._split_rows, criterion=crit,
                            min_gain=self.min_gain, rel_tol=REL_TOL, shrinkage=shrinkage, n_threads=threads,
                            gh_parallel_rows=self.engine.gh_parallel_rows,
                            split_by_rows=self.engine.gh_hist_split == "rows")
        n = len(rec["feature"])
        tree = Tree(crit.n_outputs, capacity=n)
        tree.append_leaves(rec["weight"], rec["count"], rec["value"].reshape(n, 1), rec["objective"], rec["depth"])
        inner = np.flatnonzero(rec["feature"] >= 0)
        if len(inner):
            features, bins = rec["feature"][inner], rec["bin"][inner]
            thresholds = np.array([info.threshold(int(f), int(b)) for f, b in zip(features, bins)], dtype=np.float64)
            tree.set_splits(inner, features, bins, thresholds, rec["missing_left"][inner], rec["gain"][inner],
                            rec["left"][inner])
        leaf_nodes = np.flatnonzero(rec["feature"] < 0).astype(np.int64)
        return GrownTree(tree, rows, leaf_nodes, rec["seg"][leaf_nodes, 0].copy(), rec["seg"][leaf_nodes, 1].copy())

    def _find(self, hists, stats, counts):
        """Best split of each node: ``hists`` a list of (n_features, n_bins, C) histograms or
        one stacked C-contiguous (n, n_features, n_bins, C) array (float path only)."""
        n = len(hists)
        if self._quant is not None:
            # Exact integer sums to the criterion's float units (one home for the gain),
            # written straight into the stacked buffer the search reads, one channel at a
            # time: numpy's broadcast of a (C,) scale runs an inner loop of C elements, 3x
            # slower than one strided pass per channel (37 vs 13 us per 28 x 256 x 2 node).
            scale = self._quant.scale
            hist = np.empty((n,) + hists[0].shape)
            for j, h in enumerate(hists):
                for k in range(scale.shape[0]):
                    np.multiply(h[..., k], scale[k], out=hist[j, ..., k])
        elif isinstance(hists, np.ndarray):
            hist = hists
        elif self._fused is None or n > 1:
            hist = np.stack(hists)
        else:
            hist = hists[0][None]
        if self._fused is None:
            return self.reducer.find(hist, np.stack(stats), self.criterion, self.bin_info,
                                     parent_count=np.asarray(counts, dtype=np.float64), min_gain=self.min_gain)
        c = self.criterion.n_channels
        with phase("split"):
            parent = np.array(stats, dtype=np.float64) if n > 1 else \
                np.ascontiguousarray(stats[0], dtype=np.float64)[None]
            res = SplitResult(np.empty(n, np.int32), np.zeros(n, np.int32), np.zeros(n, bool), np.empty(n),
                              np.zeros((n, c)), np.zeros((n, c)),
                              np.zeros((n, self.bin_info.cat_words), dtype=CAT_BITS_DTYPE))
            self._fused(np.ascontiguousarray(hist), np.ascontiguousarray(parent, dtype=np.float64), self._nb,
                        self.bin_info.missing_bin, None, np.asarray(counts, dtype=np.float64), self.min_gain, REL_TOL,
                        res)
        return res

    @staticmethod
    def _note_gain(gains, node, res, j):
        """Record node ``node``'s split ``res[j]`` among the candidates if it is admissible."""
        if res.feature[j] >= 0:
            gains[node] = float(res.gain[j])

    @staticmethod
    def _pick(gains):
        """Leaf to split next from ``{node: gain}``: largest gain; gains tied by the split rule go
        to the lowest node id."""
        if not gains:
            return None
        thr = tie_threshold(max(gains.values()), REL_TOL)
        return min(node for node, g in gains.items() if g >= thr)

"""Tree growth from histograms: level-wise batches of trees and leaf-wise single trees.

This module owns the growth loops shared by every model in ``forest``:

:func:`grow_levelwise`
    Grows a *batch* of trees at once, level by level (forests: regression and causal).
    Each tree has its own local row set (int32 local row ids, e.g. the split half of its
    subsample on this rank). Per level, the histograms of all frontier nodes of all
    trees are built in ONE ``build_histograms`` call and reduced across ranks in ONE
    collective; of each pair of children only the one with the smaller *global* weight
    (from the reduced parent histogram, so every rank picks the same child) is built,
    the sibling is parent minus child. Per-node feature subsampling (mtry) is a pure
    function of ``(seed, tree index, node id)``. Stops at ``max_depth``, at nodes whose
    weight is below ``min_samples_split``, and where no split has ``gain > min_gain``.
:class:`LeafwiseGrower`
    Grows one tree best-first (gradient boosting): the leaf with the largest gain is
    split next until ``max_leaf_nodes`` leaves (optionally also ``max_depth``). Per
    step one collective carries the smaller child's histogram and its exact row count.
:func:`reestimate_leaves`
    Routes another row set per tree (the honest estimation half) through the grown
    trees on binned data, sums the channels per node, reduces all trees' sums in ONE
    collective and sets every node's value from its sums (a user function).

Coordinator choice: every rank finds the splits itself from the identical reduced
histograms (the collectives leave bitwise-identical buffers on all ranks, and split
finding is a deterministic function of them), instead of rank 0 choosing and
broadcasting the split records. This costs no message at all, where rank 0 + bcast
adds one latency-bound collective per level/step on the critical path while the other
ranks idle; the split search itself is small next to the histogram pass, so repeating
it on every rank is cheaper than waiting for it.

Split modes (``split_mode``)
    ``"allreduce"``: each rank gets the full reduced histograms (default).
    ``"reduce_scatter"``: LightGBM's data-parallel scheme: histograms are
    reduce-scattered by blocks of features (half the bytes of an allreduce), each rank
    searches its feature block and the per-node best records are combined with
    ``native.collectives.allreduce_best`` (gain, then lowest feature, bin,
    missing-right), carrying the children's channel sums as payload. Both modes grow
    the same trees.

Nodes of global weight <= ``local_threshold`` leave the level-wise histogram path and
are finished exactly by :mod:`forest.local_growth` (see ``_LocalFinisher``): a dense
``F x B x C`` histogram per node of a handful of rows made deep forest trees cost
``nodes x F x B x C`` in work and bytes. By default that is every node (forests grow
tree-parallel from the root: on several ranks each tree's rows are sent to the one
rank that grows it, and the split records are shared); the histogram path stays for
criteria without a compiled gain, for GBDT, and for nodes too big for one task
(:data:`LOCAL_TASK_BYTES`).

Histogram memory: a level holds the histograms of its frontier,
``n_frontier * n_features * n_bins * C * 8`` bytes; callers size tree batches with it.
"""
import numba
import numpy as np

from native import collectives as col
from native.blocks import block_range
from native.comm import world

from ._validation import check_codes
from .partition import partition_rows, partition_segment, sum_channels_by_node
from .predictor import predict_leaves_binned
from .criteria import NewtonCriterion
from .profiling import phase
from .routing import walk_binned
from .mtry import mtry_feature_mask
from .splitting import SplitResult, find_best_splits
from .tree import Tree

SPLIT_MODES = ("allreduce", "reduce_scatter")

#: Gains within this relative distance count as tied everywhere in growth.
REL_TOL = 1e-12


class BinInfo:
    """The parts of a fitted :class:`histogram.binning.BinMapper` that growers use.

    Parameters
    ----------
    n_bins : int
        Histogram bin-axis length (value bins plus the missing bin).
    missing_bin : int
    n_bins_non_missing : array-like of int, shape (n_features,)
    bin_thresholds : list of ndarray of float64
        ``bin_thresholds[f]`` has shape ``(n_bins_non_missing[f] - 1,)``; value bin
        ``b`` holds ``thresholds[b-1] < x <= thresholds[b]``.
    """

    def __init__(self, n_bins, missing_bin, n_bins_non_missing, bin_thresholds):
        self.n_bins = int(n_bins)
        self.missing_bin = int(missing_bin)
        self.n_bins_non_missing = np.asarray(n_bins_non_missing, dtype=np.int64)
        self.bin_thresholds = [np.asarray(t, dtype=np.float64) for t in bin_thresholds]
        self.n_features = len(self.n_bins_non_missing)
        # (n_features, max bins) table of raw thresholds, +inf past each feature's last
        # edge, so a batch of (feature, bin) pairs maps to thresholds in one lookup.
        width = max([len(t) for t in self.bin_thresholds] + [0]) + 1
        self.threshold_table = np.full((self.n_features, width), np.inf)
        for f, t in enumerate(self.bin_thresholds):
            self.threshold_table[f, :len(t)] = t

    @classmethod
    def from_mapper(cls, mapper):
        """From a fitted BinMapper (or anything with the same attributes)."""
        if isinstance(mapper, BinInfo):
            return mapper
        return cls(mapper.n_bins_, mapper.missing_bin_, mapper.n_bins_non_missing_, mapper.bin_thresholds_)

    def threshold(self, feature, bin_index):
        """Raw threshold of "bin <= bin_index goes left" (``+inf``: every value left)."""
        t = self.bin_thresholds[feature]
        return float(t[bin_index]) if bin_index < len(t) else np.inf


#: Histogram builds over fewer rows than this run on one Numba thread: waking the
#: thread pool costs ~1 ms (tens of ms on an oversubscribed machine), more than
#: the work itself.
_SERIAL_BUILD_ROWS = 16384


def _build(binned, channels, rows, node_starts, n_bins, backend):
    from histogram.kernels import build_histograms

    node_starts = np.asarray(node_starts, dtype=np.int64)
    n_rows = int(node_starts[-1] - node_starts[0])
    with phase("histogram"):
        threads = numba.get_num_threads()
        if n_rows >= _SERIAL_BUILD_ROWS or threads == 1:
            return build_histograms(binned, channels, rows, node_starts, n_bins, backend=backend)
        numba.set_num_threads(1)
        try:
            return build_histograms(binned, channels, rows, node_starts, n_bins, backend=backend)
        finally:
            numba.set_num_threads(threads)


def _gather_segments(rows, lo, hi):
    """Concatenate ``rows[lo[i]:hi[i]]`` and return ``(gathered int32, node_starts int64)``."""
    lengths = (hi - lo).astype(np.int64)
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    idx = np.arange(starts[-1], dtype=np.int64) + np.repeat(lo.astype(np.int64) - starts[:-1], lengths)
    return np.ascontiguousarray(rows[idx], dtype=np.int32), starts


class HistogramReducer:
    """Combines local histograms across ranks and finds splits in one of two modes.

    Parameters
    ----------
    comm : native.comm.Communicator
    n_features : int
    split_mode : {"allreduce", "reduce_scatter"}
    algorithm : str
        Passed to the collectives (``"auto"`` lets ``native`` choose).

    Attributes
    ----------
    f0, f1 : int
        The features whose histograms this rank holds after :meth:`reduce`
        (all features in allreduce mode).
    """

    def __init__(self, comm, n_features, split_mode="allreduce", algorithm="auto"):
        if split_mode not in SPLIT_MODES:
            raise ValueError(f"split_mode must be one of {SPLIT_MODES}, got {split_mode!r}")
        self.comm = comm
        self.split_mode = split_mode
        self.algorithm = algorithm
        self.n_features = n_features
        if split_mode == "reduce_scatter" and comm.size > 1:
            self.f0, self.f1 = block_range(n_features, comm.size, comm.rank)
        else:
            self.f0, self.f1 = 0, n_features

    @property
    def scattered(self):
        return self.split_mode == "reduce_scatter" and self.comm.size > 1

    def reduce(self, local_hist, extra):
        """Sum histograms (and a small vector of extra values) over ranks.

        Parameters
        ----------
        local_hist : ndarray of float64, shape (n_nodes, n_features, n_bins, C)
        extra : ndarray of float64, shape (k,)
            Small values reduced along (row counts, channel totals).

        Returns
        -------
        hist : ndarray of float64, shape (n_nodes, f1 - f0, n_bins, C)
            This rank's features of the reduced histograms.
        extra : ndarray of float64, shape (k,)
        """
        extra = np.ascontiguousarray(extra, dtype=np.float64)
        with phase("communication"):
            if self.comm.size == 1:
                return local_hist, extra
            if not self.scattered:
                # One fused buffer: histograms and the extras travel in one collective.
                buf = np.concatenate([local_hist.reshape(-1), extra])
                red = col.allreduce(self.comm, buf, algorithm=self.algorithm)
                n = local_hist.size
                return red[:n].reshape(local_hist.shape), red[n:]
            by_feature = np.ascontiguousarray(local_hist.transpose(1, 0, 2, 3))
            alg = self.algorithm if self.algorithm in ("ring", "halving") else "auto"
            block, (start, stop) = col.reduce_scatter(self.comm, by_feature, algorithm=alg)
            assert (start, stop) == (self.f0, self.f1)
            red_extra = col.allreduce(self.comm, extra) if extra.size else extra
            return np.ascontiguousarray(block.transpose(1, 0, 2, 3)), red_extra

    def find(self, hist, parent, criterion, bin_info, feature_mask=None, parent_count=None, min_gain=0.0):
        """Best split per node from this rank's reduced histograms.

        Parameters
        ----------
        hist : ndarray, shape (n_nodes, f1 - f0, n_bins, C)
        parent : ndarray, shape (n_nodes, C)
        criterion : forest.criteria.Criterion
        bin_info : BinInfo
        feature_mask : ndarray of bool, shape (n_nodes, n_features), optional
            Over all features (sliced here).
        parent_count : ndarray, shape (n_nodes,), optional
        min_gain : float

        Returns
        -------
        SplitResult
            Identical on all ranks.
        """
        f0, f1 = self.f0, self.f1
        with phase("split"):
            res = find_best_splits(hist, parent, criterion, bin_info.n_bins_non_missing[f0:f1], bin_info.missing_bin,
                                   feature_mask=None if feature_mask is None else feature_mask[:, f0:f1],
                                   parent_count=parent_count, min_gain=min_gain, rel_tol=REL_TOL, feature_offset=f0)
        if not self.scattered:
            return res
        n, c = res.left_stats.shape
        rec = np.empty((n, 4 + 2 * c))
        rec[:, 0] = res.gain
        rec[:, 1] = np.where(res.valid, res.feature, self.n_features)
        rec[:, 2] = res.bin
        rec[:, 3] = res.missing_left
        rec[:, 4:4 + c] = res.left_stats
        rec[:, 4 + c:] = res.right_stats
        with phase("communication"):
            best = col.allreduce_best(self.comm, rec, rtol=REL_TOL, n_keys=3)  # (feature, bin, missing_left)
        valid = np.isfinite(best[:, 0]) & (best[:, 1] < self.n_features)
        return SplitResult(np.where(valid, best[:, 1], -1).astype(np.int32), best[:, 2].astype(np.int32),
                           best[:, 3] != 0, np.where(valid, best[:, 0], -np.inf),
                           best[:, 4:4 + c].copy(), best[:, 4 + c:].copy())


def _check_binned(binned, channels, bin_info):
    binned = check_codes(binned, bin_info.n_features)
    channels = np.ascontiguousarray(channels, dtype=np.float64)
    if channels.ndim != 2 or channels.shape[0] != binned.shape[1]:
        raise ValueError(f"channels must have shape (n_rows={binned.shape[1]}, C), got {channels.shape}")
    return binned, channels


def _add_child(tree, criterion, stats, depth, shrinkage=1.0, count=None):
    count = float(criterion.node_count(stats)) if count is None else count
    return tree.add_node(depth, float(criterion.node_weight(stats)), criterion.node_value(stats) * shrinkage,
                         float(criterion.node_objective(stats)), count=count)


#: Default ``local_threshold`` of :func:`grow_levelwise` (global node weight, i.e. rows
#: for the forests' criteria): every node, i.e. tree-parallel growth from the root
#: (bounded by :data:`LOCAL_TASK_BYTES`). A tree's structure rows gathered onto the
#: rank that grows it cost ``rows x (F + 8 C + 16)`` bytes once (about 1 MB per tree
#: per rank at n = 100k, d = 20), where the histogram path allreduces ``F x B x C x 8``
#: bytes (286 KB for the causal forest) per node of every top level and makes all
#: ranks wait for each level; inside a task, big nodes still use histograms with
#: sibling subtraction (:data:`forest.local_growth.HIST_ROWS`). Measured (CausalForest,
#: d = 20, 200 trees + 2 x 50 nuisance, one thread per rank, CPU s): n = 20k, one
#: rank 7.25 (threshold 2048) vs 7.28 (all local); -np 2 wall 10.95 vs 7.09 s. With
#: the later kernel and exchange changes, n = 100k: -np 1 42 s, -np 2 20.7 s wall.
DEFAULT_LOCAL_THRESHOLD = np.inf

#: Bound on the bytes one local-growth task may use (:func:`forest.local_growth.grow_subtrees`
#: copies a node's codes and channels and keeps per-feature orders: about
#: ``m * (6 F + 8 C + 48)`` bytes for ``m`` rows). Nodes heavier than this take the
#: histogram path whatever ``local_threshold`` says, so huge data never has to fit
#: one tree's rows into one task.
LOCAL_TASK_BYTES = 1024 * 2 ** 20

#: Bound on the bytes of node rows one alltoallv of local finishing moves (all ranks
#: together); a level with more is finished in several chunks of trees.
LOCAL_GATHER_BYTES = 256 * 2 ** 20


def _threshold_table(bin_info):
    """``table[f, b]`` = :meth:`BinInfo.threshold` (``+inf`` past the last edge), shape (F, n_bins)."""
    table = np.full((bin_info.n_features, bin_info.n_bins), np.inf)
    for f, t in enumerate(bin_info.bin_thresholds):
        table[f, :len(t)] = t
    return table


def _node_fields(criterion, stats):
    """``(weight, count, value, objective)`` of nodes with channel sums ``stats`` (k, C)."""
    return (np.asarray(criterion.node_weight(stats), dtype=np.float64),
            np.asarray(criterion.node_count(stats), dtype=np.float64),
            np.asarray(criterion.node_value(stats), dtype=np.float64),
            np.asarray(criterion.node_objective(stats), dtype=np.float64))


def _add_split_children(trees, criterion, owner, parent_node, left_stats, right_stats, depth, feature, bins,
                        missing_left, gain, thr_table):
    """Append both children of each split and record the splits, tree by tree.

    ``owner`` (batch-local tree of each split) must be non-decreasing; within a tree
    the children take consecutive ids in split order (left, right, left, right, ...).

    Returns
    -------
    left_ids : ndarray of int64, shape (n_splits,)
    """
    n = len(owner)
    c = left_stats.shape[1]
    stats = np.stack([left_stats, right_stats], axis=1).reshape(2 * n, c)
    weight, count, value, objective = _node_fields(criterion, stats)
    depth = np.broadcast_to(np.asarray(depth), (n,))
    child_depth = np.repeat(depth, 2)
    feature = np.asarray(feature, dtype=np.int64)
    bins = np.asarray(bins, dtype=np.int64)
    thresholds = thr_table[feature, bins]
    left_ids = np.empty(n, dtype=np.int64)
    bounds = np.flatnonzero(np.diff(owner)) + 1
    for lo, hi in zip(np.concatenate([[0], bounds]), np.concatenate([bounds, [n]])):
        if hi <= lo:
            continue
        tree = trees[owner[lo]]
        s = slice(2 * lo, 2 * hi)
        first = tree.append_leaves(weight[s], count[s], value[s], objective[s], child_depth[s])
        lids = first + 2 * np.arange(hi - lo, dtype=np.int64)
        tree.set_splits(np.asarray(parent_node[lo:hi], dtype=np.int64), feature[lo:hi], bins[lo:hi],
                        thresholds[lo:hi], np.asarray(missing_left[lo:hi], dtype=np.uint8), gain[lo:hi], lids)
        left_ids[lo:hi] = lids
    return left_ids


class _LocalFinisher:
    """Finishes the subtrees of small frontier nodes with :mod:`forest.local_growth`.

    One call per level. Single rank: the nodes' local rows are used directly. Several
    ranks, per chunk of trees (:data:`LOCAL_GATHER_BYTES`): each tree is given to one
    rank (greedy by rows, computed identically everywhere); one ``alltoallv`` sends
    the nodes' rows (codes, channels, global ids) to their tree's owner, which puts
    them in global-row-id order and grows the subtrees, and an ``allgatherv`` shares
    the split records. A
    subtree is a pure function of its gid-ordered rows, so the trees are identical
    on every rank and for every rank count. (Growing every tree on every rank would
    save the second collective but replicate the work: measured slower at -np 2.)
    """

    def __init__(self, numba_gain, binned, channels, gids, bin_info, comm, criterion, thr_table, tree_indices,
                 kwargs):
        self.numba_gain = numba_gain
        self.binned = binned
        self.channels = channels
        self.gids = gids
        self.bin_info = bin_info
        self.comm = comm
        self.criterion = criterion
        self.thr_table = thr_table
        self.tree_indices = tree_indices
        self.kwargs = kwargs
        # Single rank: rows are used in local order, which is global-id order when the
        # ids increase with the local row (as native.blocks / global_ids lay them out).
        self.sort_local = gids is not None and len(gids) > 1 and not np.all(np.diff(gids) > 0)

    def finish(self, trees, rows, t_tree, t_node, t_depth, t_lo, t_hi, t_count):
        """Grow the subtrees of nodes ``(t_tree, t_node)`` (tree-sorted) owning ``rows[t_lo:t_hi]``."""
        from .local_growth import grow_subtrees

        if len(t_tree) == 0:
            return
        if self.comm.size == 1:
            with phase("local"):
                gathered, g_starts = _gather_segments(rows, t_lo, t_hi)
                if self.sort_local:
                    task = np.repeat(np.arange(len(t_lo)), np.diff(g_starts))
                    gathered = gathered[np.lexsort((self.gids[gathered], task))]
                tree_next = np.array([t.node_count for t in trees], dtype=np.int64)
                recs = grow_subtrees(self.binned, self.channels, gathered, g_starts, t_tree, t_node, t_depth,
                                     tree_next, self.tree_indices, self.numba_gain,
                                     self.bin_info.n_bins_non_missing, self.bin_info.missing_bin, **self.kwargs)
                self._append(trees, recs)
            return
        # Several ranks: chunks of whole trees, each at most LOCAL_GATHER_BYTES on the wire.
        c = self.channels.shape[1]
        row_bytes = self.binned.shape[0] + 8 * c + 16
        per_tree = np.bincount(t_tree, weights=t_count, minlength=len(trees))
        cum = np.cumsum(per_tree) * row_bytes
        chunk_of_tree = (cum // LOCAL_GATHER_BYTES).astype(np.int64)
        chunk_of_task = chunk_of_tree[t_tree]
        for ch in np.unique(chunk_of_task):
            sel = np.flatnonzero(chunk_of_task == ch)
            self._finish_gathered(trees, rows, t_tree[sel], t_node[sel], t_depth[sel], t_lo[sel], t_hi[sel],
                                  t_count[sel])

    def _finish_gathered(self, trees, rows, t_tree, t_node, t_depth, t_lo, t_hi, t_count):
        from .local_growth import SubtreeRecords, grow_subtrees

        f = self.binned.shape[0]
        c = self.channels.shape[1]
        with phase("local"):
            # Each tree's subtrees are grown by one rank (greedy by rows, the same on
            # every rank since the counts are global), then the records are shared:
            # a subtree depends only on its gid-ordered rows, not on who grows it.
            per_tree = np.bincount(t_tree, weights=t_count, minlength=len(trees))
            load = np.zeros(self.comm.size)
            owner = np.full(len(trees), -1, dtype=np.int64)
            busy = np.flatnonzero(per_tree > 0)
            for t in busy[np.argsort(-per_tree[busy], kind="stable")]:
                owner[t] = int(np.argmin(load))
                load[owner[t]] += per_tree[t]
            mine_t = owner[t_tree] == self.comm.rank
            mine, m_starts = _gather_segments(rows, t_lo, t_hi)
            task = np.repeat(np.arange(len(t_lo), dtype=np.int64), np.diff(m_starts))
            dest = owner[t_tree[task]]
            by_dest = np.argsort(dest, kind="stable")
            mine, task = mine[by_dest], task[by_dest]
            # One row record: task, global id, codes, channels (as bytes).
            pack = np.empty((len(mine), 16 + f + 8 * c), dtype=np.uint8)
            pack[:, 0:8] = task.view(np.uint8).reshape(-1, 8)
            pack[:, 8:16] = np.ascontiguousarray(self.gids[mine], dtype=np.int64).view(np.uint8).reshape(-1, 8)
            pack[:, 16:16 + f] = self.binned[:, mine].T
            pack[:, 16 + f:] = np.ascontiguousarray(self.channels[mine]).view(np.uint8).reshape(-1, 8 * c)
            send_counts = np.bincount(dest, minlength=self.comm.size).astype(np.int64)
        with phase("communication"):
            # Rows go to their tree's owner only (a pairwise alltoallv): each rank
            # receives the rows of its own trees, not every tree's.
            offs = np.concatenate(([0], np.cumsum(send_counts)))
            allp = col.alltoallv(self.comm, [pack[offs[q]:offs[q + 1]] for q in range(self.comm.size)])
        with phase("local"):
            g_task = np.ascontiguousarray(allp[:, 0:8]).view(np.int64).ravel()
            g_gid = np.ascontiguousarray(allp[:, 8:16]).view(np.int64).ravel()
            # Ranks hold consecutive gid blocks in rank order (global_ids), rows arrive
            # in source-rank order and each source sends in local order, so a stable
            # sort by task usually leaves each task in gid order already; the full
            # sort is only the fallback.
            order = np.argsort(g_task, kind="stable")
            st_gid = g_gid[order]
            same = g_task[order][1:] == g_task[order][:-1]
            if np.any(same & (st_gid[1:] <= st_gid[:-1])):
                order = np.lexsort((g_gid, g_task))
            allp = allp[order]
            g_binned = np.ascontiguousarray(allp[:, 16:16 + f].T)
            g_channels = np.ascontiguousarray(allp[:, 16 + f:]).view(np.float64).reshape(-1, c)
            counts = np.bincount(g_task, minlength=len(t_lo))
            sub_rows = np.arange(len(allp), dtype=np.int64)
            sub_starts = np.zeros(int(mine_t.sum()) + 1, dtype=np.int64)
            np.cumsum(counts[mine_t], out=sub_starts[1:])
            tree_next = np.array([t.node_count for t in trees], dtype=np.int64)
            recs = grow_subtrees(g_binned, g_channels, sub_rows, sub_starts, t_tree[mine_t], t_node[mine_t],
                                 t_depth[mine_t], tree_next, self.tree_indices, self.numba_gain,
                                 self.bin_info.n_bins_non_missing, self.bin_info.missing_bin, **self.kwargs)
            rec_tree = np.repeat(np.arange(len(trees), dtype=np.int64), np.diff(recs.tree_starts))
            n_int = recs.ints.shape[1]
            packed = np.concatenate([rec_tree[:, None].astype(np.float64), recs.ints.astype(np.float64),
                                     recs.floats], axis=1)
        with phase("communication"):
            allr = col.allgatherv(self.comm, np.ascontiguousarray(packed))
        with phase("local"):
            # each tree's records come from one rank, already in id order: stable sort by tree
            allr = allr[np.argsort(allr[:, 0], kind="stable")]
            starts = np.zeros(len(trees) + 1, dtype=np.int64)
            np.cumsum(np.bincount(allr[:, 0].astype(np.int64), minlength=len(trees)), out=starts[1:])
            self._append(trees, SubtreeRecords(allr[:, 1:1 + n_int].astype(np.int64),
                                               np.ascontiguousarray(allr[:, 1 + n_int:]), starts))

    def _append(self, trees, recs):
        from .local_growth import REC_BIN, REC_DEPTH, REC_FEATURE, REC_LEFT, REC_MISSING_LEFT, REC_NODE

        ints, floats = recs.ints, recs.floats
        if len(ints) == 0:
            return
        c = self.channels.shape[1]
        owner = np.repeat(np.arange(len(trees)), np.diff(recs.tree_starts))
        lids = _add_split_children(trees, self.criterion, owner, ints[:, REC_NODE], floats[:, 1:1 + c],
                                   floats[:, 1 + c:], ints[:, REC_DEPTH], ints[:, REC_FEATURE], ints[:, REC_BIN],
                                   ints[:, REC_MISSING_LEFT], floats[:, 0], self.thr_table)
        if not np.array_equal(lids, ints[:, REC_LEFT]):
            raise RuntimeError("local growth and the trees disagree on node ids")


def grow_levelwise(binned, channels, tree_rows, criterion, bin_mapper, *, tree_indices=None, max_depth=None,
                   min_samples_split=2.0, min_gain=0.0, mtry=None, seed=0, comm=None, backend="auto",
                   split_mode="allreduce", algorithm="auto", gids=None, local_threshold=None):
    """Grow a batch of trees level by level.

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows)
        This rank's binned rows (feature-major).
    channels : ndarray of float64, shape (n_rows, C)
        The criterion's per-row channels.
    tree_rows : sequence of ndarray of int32
        Per tree, the local row ids it grows on (may be empty on some ranks).
    criterion : forest.criteria.Criterion
    bin_mapper : BinMapper or BinInfo
    tree_indices : array-like of int, shape (n_trees,), optional
        Global index of each tree in the forest (keys mtry); default ``0..n_trees-1``.
    max_depth : int or None
        Root has depth 0; ``None`` means unlimited.
    min_samples_split : float, default 2.0
        A node is split only if ``criterion.node_weight`` of its rows (all ranks) is at
        least this.
    min_gain : float, default 0.0
    mtry : int or None
        Features tried per node.
    seed : int
        Seed of the mtry draw.
    comm : native.comm.Communicator, optional
        ``None`` means ``native.comm.world()``.
    backend : str
        Histogram backend.
    split_mode : {"allreduce", "reduce_scatter"}
    algorithm : str
        Collective algorithm.
    gids : ndarray of int64, shape (n_rows,), optional
        Global id of each local row. Required for local finishing on several ranks
        (the gathered rows of a node are put in global-id order).
    local_threshold : float or None
        Frontier nodes whose global ``criterion.node_weight`` is at most this are
        finished exactly by :mod:`forest.local_growth` instead of by histograms
        (criteria with a ``numba_gain`` kernel only; others use histograms for every
        node). ``None`` means :data:`DEFAULT_LOCAL_THRESHOLD`; ``0`` disables it.
        Node ids then follow histogram levels down to the small nodes and depth-first
        order inside each finished subtree; with ``mtry=None`` and no tied gains the
        trees have the same structure for every threshold.

    Returns
    -------
    list of Tree
        Node values are ``criterion.node_value`` of the growing rows; identical on all
        ranks.
    """
    comm = world() if comm is None else comm
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
    local_threshold = DEFAULT_LOCAL_THRESHOLD if local_threshold is None else float(local_threshold)
    task_rows = LOCAL_TASK_BYTES / (6 * bin_info.n_features + 8 * channels.shape[1] + 48)
    local_threshold = min(local_threshold, float(task_rows))
    numba_gain = criterion.numba_gain() if (local_threshold > 0 and hasattr(criterion, "numba_gain")) else None
    if gids is not None:
        gids = np.asarray(gids, dtype=np.int64)
        if gids.shape != (binned.shape[1],):
            raise ValueError(f"gids must have shape ({binned.shape[1]},), got {gids.shape}")
    if numba_gain is not None and comm.size > 1 and gids is None:
        raise ValueError("local finishing on several ranks needs gids (global row ids); pass gids= or "
                         "local_threshold=0")
    max_depth_arg = max_depth
    max_depth = np.iinfo(np.int32).max if max_depth is None else int(max_depth)
    reducer = HistogramReducer(comm, bin_info.n_features, split_mode, algorithm)
    n_bins = bin_info.n_bins
    thr_table = _threshold_table(bin_info)
    finisher = None
    if numba_gain is not None:
        finisher = _LocalFinisher(numba_gain, binned, channels, gids, bin_info, comm, criterion, thr_table,
                                  tree_indices, dict(min_samples_split=float(min_samples_split),
                                                     max_depth=max_depth_arg, min_gain=float(min_gain),
                                                     rel_tol=REL_TOL, mtry=mtry, seed=seed))

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
        local_hist = _build(binned, channels, rows, starts, n_bins, backend)
        hist, tot = reducer.reduce(local_hist, local_tot.ravel())
        stats = tot.reshape(n_trees, -1)
    else:
        # Totals first (a small collective): roots that local finishing takes whole
        # (all of them with the default threshold) need no histogram at all.
        with phase("communication"):
            tot = col.allreduce(comm, np.ascontiguousarray(local_tot.ravel()), algorithm=algorithm) \
                if comm.size > 1 else local_tot.ravel()
        stats = tot.reshape(n_trees, -1)
        r_weight = np.asarray(criterion.node_weight(stats), dtype=np.float64)
        big = np.flatnonzero((r_weight >= min_samples_split) & (0 < max_depth) & (r_weight > local_threshold))
        hist = np.zeros((n_trees, reducer.f1 - reducer.f0, n_bins, channels.shape[1]))
        if len(big):
            g_rows, g_starts = _gather_segments(rows, starts[:-1][big], starts[1:][big])
            big_hist, _ = reducer.reduce(_build(binned, channels, g_rows, g_starts, n_bins, backend), np.zeros(0))
            hist[big] = big_hist
    trees = [Tree(criterion.n_outputs) for _ in range(n_trees)]
    weight, count, value, objective = _node_fields(criterion, stats)
    for t in range(n_trees):
        trees[t].append_leaves(weight[t:t + 1], count[t:t + 1], value[t:t + 1], objective[t:t + 1],
                               np.zeros(1, dtype=np.int32))

    f_tree = np.arange(n_trees)
    f_node = np.zeros(n_trees, dtype=np.int64)
    f_lo, f_hi = starts[:-1].copy(), starts[1:].copy()
    depth = 0
    keep = (weight >= min_samples_split) & (depth < max_depth)
    small = keep & (weight <= local_threshold) if finisher is not None else np.zeros(n_trees, dtype=bool)
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
        mask = None if mtry is None else mtry_feature_mask(seed, tree_indices[f_tree], f_node, bin_info.n_features,
                                                           mtry)
        res = reducer.find(hist, stats, criterion, bin_info, feature_mask=mask, min_gain=min_gain)
        split = np.flatnonzero(res.valid)
        if len(split) == 0:
            break
        with phase("partition"):
            n_left = partition_rows(rows, scratch, f_lo[split], f_hi[split], binned, res.feature[split],
                                    res.bin[split], res.missing_left[split].astype(np.uint8), bin_info.missing_bin)
        # Record the splits and children (left id, right id = left + 1) in tree order.
        child_depth = depth + 1
        with phase("other"):
            left_ids = _add_split_children(trees, criterion, f_tree[split], f_node[split], res.left_stats[split],
                                           res.right_stats[split], child_depth, res.feature[split], res.bin[split],
                                           res.missing_left[split], res.gain[split], thr_table)
        right_ids = left_ids + 1
        lo, hi = f_lo[split], f_hi[split]
        mid = lo + n_left
        lw = criterion.node_weight(res.left_stats[split])
        rw = criterion.node_weight(res.right_stats[split])
        can_l = (lw >= min_samples_split) & (child_depth < max_depth)
        can_r = (rw >= min_samples_split) & (child_depth < max_depth)
        if finisher is not None:
            loc_l, loc_r = can_l & (lw <= local_threshold), can_r & (rw <= local_threshold)
        else:
            loc_l = loc_r = np.zeros(len(split), dtype=bool)
        # Small children wait for local finishing, interleaved (left, right) per split.
        tl = f_tree[split]
        p_tree = np.stack([tl, tl], axis=1).ravel()
        p_node = np.stack([left_ids, right_ids], axis=1).ravel()
        p_lo = np.stack([lo, mid], axis=1).ravel()
        p_hi = np.stack([mid, hi], axis=1).ravel()
        p_cnt = np.stack([criterion.node_count(res.left_stats[split]), criterion.node_count(res.right_stats[split])],
                         axis=1).ravel()
        p_sel = np.stack([loc_l, loc_r], axis=1).ravel()
        pend = (p_tree[p_sel], p_node[p_sel], np.full(int(p_sel.sum()), child_depth, dtype=np.int64), p_lo[p_sel],
                p_hi[p_sel], p_cnt[p_sel])
        hist_l, hist_r = can_l & ~loc_l, can_r & ~loc_r
        need = hist_l | hist_r
        depth = child_depth
        if not need.any():
            f_tree = f_tree[:0]
            continue
        p = np.flatnonzero(need)
        build_left = lw[p] <= rw[p]  # smaller child by global weight; ties build the left
        b_lo = np.where(build_left, lo[p], mid[p])
        b_hi = np.where(build_left, mid[p], hi[p])
        gathered, g_starts = _gather_segments(rows, b_lo, b_hi)
        child_local = _build(binned, channels, gathered, g_starts, n_bins, backend)
        child_hist, _ = reducer.reduce(child_local, np.zeros(0))
        sib_hist = hist[split[p]] - child_hist
        left_hist = np.where(build_left[:, None, None, None], child_hist, sib_hist)
        right_hist = np.where(build_left[:, None, None, None], sib_hist, child_hist)
        # Next frontier: interleave (left, right) per split, keep the histogram ones.
        tp = f_tree[split[p]]
        n_tree = np.stack([tp, tp], axis=1).ravel()
        n_node = np.stack([left_ids[p], right_ids[p]], axis=1).ravel()
        n_lo = np.stack([lo[p], mid[p]], axis=1).ravel()
        n_hi = np.stack([mid[p], hi[p]], axis=1).ravel()
        n_stats = np.stack([res.left_stats[split[p]], res.right_stats[split[p]]], axis=1).reshape(-1, stats.shape[1])
        n_hist = np.stack([left_hist, right_hist], axis=1).reshape((-1,) + hist.shape[1:])
        n_keep = np.stack([hist_l[p], hist_r[p]], axis=1).ravel()
        f_tree, f_node, f_lo, f_hi = n_tree[n_keep], n_node[n_keep], n_lo[n_keep], n_hi[n_keep]
        stats, hist = n_stats[n_keep], n_hist[n_keep]
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


#: Placeholder mask for the direct Newton search (read only when masks are used).
_NO_MASK = np.ones((1, 1), dtype=np.bool_)


class LeafwiseGrower:
    """Best-first growth of one tree at a time (gradient boosting).

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows)
    bin_mapper : BinMapper or BinInfo
    criterion : forest.criteria.Criterion
    max_leaf_nodes : int or None, default 31
        ``None`` means unlimited (then ``max_depth`` should be set).
    max_depth : int or None
    min_gain : float
    comm : native.comm.Communicator, optional
    backend : str
    split_mode : {"allreduce", "reduce_scatter"}
    algorithm : str
    """

    #: How threads share one node's (g, h) histogram: "rows" (see ``_build_node``);
    #: "features" is kept for A/B measurements.
    _hist_split = "rows"
    #: (g, h) builds from this many rows use all Numba threads. Lower than the generic
    #: _SERIAL_BUILD_ROWS: a small child of a 1M-row fit is a sparse subset whose code
    #: reads miss cache (cold, one thread: 2k rows 1.05 ms, 4k 1.55 ms, 16k 2.09 ms), and
    #: two threads split those misses (main-thread CPU 0.59 / 0.93 / 1.23 ms), far more
    #: than an idle pool's wake-up on a quiet machine (~20 us measured).
    _gh_parallel_rows = 4096

    def __init__(self, binned, bin_mapper, criterion, *, max_leaf_nodes=31, max_depth=None, min_gain=0.0,
                 comm=None, backend="auto", split_mode="allreduce", algorithm="auto"):
        self.bin_info = BinInfo.from_mapper(bin_mapper)
        self.binned = check_codes(binned, self.bin_info.n_features)
        if max_leaf_nodes is not None and max_leaf_nodes < 2:
            raise ValueError(f"max_leaf_nodes must be >= 2 or None, got {max_leaf_nodes}")
        if max_leaf_nodes is None and max_depth is None:
            raise ValueError("set max_leaf_nodes or max_depth")
        self.criterion = criterion
        self.max_leaf_nodes = np.iinfo(np.int64).max if max_leaf_nodes is None else int(max_leaf_nodes)
        self.max_depth = np.iinfo(np.int32).max if max_depth is None else int(max_depth)
        self.min_gain = float(min_gain)
        self.comm = world() if comm is None else comm
        self.backend = backend
        self.reducer = HistogramReducer(self.comm, self.bin_info.n_features, split_mode, algorithm)
        self._scratch = None
        # The (g, h) fast path reads codes unchecked, so they are checked here, once per
        # fit, instead of by every histogram call.
        self._fast = backend in ("auto", "numba") and criterion.n_channels == 2
        if self._fast:
            self.binned = np.ascontiguousarray(self.binned)
            if self.binned.size and self.bin_info.n_bins < 256 and int(self.binned.max()) >= self.bin_info.n_bins:
                raise ValueError(f"binned holds code {int(self.binned.max())} >= n_bins={self.bin_info.n_bins}")
        self._gh_buf = None
        self._gh_partial = None
        # Root histograms read the codes four rows per 32-bit load (a view when the row
        # count is a multiple of 4, else a padded copy made once per fit).
        self._packed = None
        if self._fast:
            from histogram.cpu_kernels import pack_codes

            self._packed = pack_codes(self.binned)
        # One rank searches all features with no mtry mask: the Newton kernel can be
        # called directly (criteria of other types keep the generic path).
        self._direct_search = (type(criterion) is NewtonCriterion and not self.reducer.scattered
                               and self.reducer.f0 == 0 and self.reducer.f1 == self.bin_info.n_features
                               and self.bin_info.missing_bin > 0)
        self._nb = np.ascontiguousarray(self.bin_info.n_bins_non_missing, dtype=np.int64)
        # One output: node weights, values and objectives from two floats (g, h) in
        # Python arithmetic, the same IEEE operations as NewtonCriterion's array code.
        self._scalar = type(criterion) is NewtonCriterion and criterion.n_outputs == 1

    def _build_node(self, channels, rows, start, stop):
        """Local histogram of one node, shape (1, n_features, n_bins, C).

        ``rows`` None: the node is the positions ``start:stop`` (the root over all rows).
        """
        if not self._fast:
            if rows is None:
                return _build(self.binned, channels, None, np.array([start, stop]), self.bin_info.n_bins,
                              self.backend)
            return _build(self.binned, channels, rows[start:stop], np.array([0, stop - start]),
                          self.bin_info.n_bins, self.backend)
        from histogram.cpu_kernels import build_gh_histogram

        with phase("histogram"):
            out = np.empty((1, self.bin_info.n_features, self.bin_info.n_bins, 2))
            m = stop - start
            if rows is not None and (self._gh_buf is None or len(self._gh_buf) < 2 * m):
                self._gh_buf = np.empty(2 * len(rows))
            threads = 1 if m < self._gh_parallel_rows else numba.get_num_threads()
            buf = self._gh_buf if rows is not None else np.empty(0)
            partial = None
            if threads > 1:
                shape = (threads - 1,) + out.shape[1:]
                if self._gh_partial is None or self._gh_partial.shape != shape:
                    self._gh_partial = np.empty(shape)
                partial = self._gh_partial
            # Threads split the node's rows (each its own partial histogram, then added),
            # not its features: each thread then gathers and reads only its own rows'
            # codes and (g, h), the way a rank does under mpirun. Process CPU time per
            # build (1M x 28 HIGGS codes, 2 threads, OMP_WAIT_POLICY=passive, minima
            # of 25): half the rows 14.1 (feature split) vs 13.4 ms (row split; 1
            # thread 13.3), root 19.3 vs 17.1 (1 thread 16.8).
            build_gh_histogram(self.binned, channels, rows, start, stop, out[0], buf, n_threads=threads,
                               packed=self._packed, split=self._hist_split, partial=partial)
            return out

    def _splittable(self, depth, count):
        min_leaf = getattr(self.criterion, "min_samples_leaf", 1)
        return (depth < self.max_depth) & (count >= 2 * min_leaf)

    def grow(self, channels, rows=None, shrinkage=1.0):
        """Grow one tree.

        Parameters
        ----------
        channels : ndarray of float64, shape (n_rows, C)
        rows : ndarray of int32, shape (m,), optional
            Local training rows (all rows when omitted); not modified.
        shrinkage : float
            Multiplies every node value (the learning rate).

        Returns
        -------
        GrownTree
        """
        crit, info, red = self.criterion, self.bin_info, self.reducer
        binned = self.binned
        channels = np.ascontiguousarray(channels, dtype=np.float64)
        if channels.shape != (binned.shape[1], crit.n_channels):
            raise ValueError(f"channels must have shape ({binned.shape[1]}, {crit.n_channels}), got {channels.shape}")
        identity = rows is None
        rows = np.arange(binned.shape[1], dtype=np.int32) if identity else np.array(rows, dtype=np.int32)
        if self._scratch is None or len(self._scratch) < len(rows):
            self._scratch = np.empty(len(rows), dtype=np.int32)
        scratch = self._scratch
        n_local = len(rows)

        local = self._build_node(channels, None if identity else rows, 0, n_local)
        # Every row lands in exactly one bin of feature 0, so its bins sum to the node's
        # channel totals: no pass over the rows (numpy's strided axis-0 sum of an (n, 2)
        # array cost 2.6 ms per tree at 200k rows).
        local_tot = local[0, 0].sum(axis=0) if binned.shape[0] else np.zeros(channels.shape[1])
        hist, extra = red.reduce(local, np.concatenate([local_tot, [n_local]]))
        root_stats, root_count = extra[:-1], extra[-1]
        tree = Tree(crit.n_outputs)
        add_child = self._add_scalar_child if self._scalar else _add_child
        add_child(tree, crit, root_stats, 0, shrinkage, root_count)
        # Per leaf: [lo, hi, depth, count, stats, hist, split]; split None = not splittable.
        leaves = {0: [0, n_local, 0, root_count, root_stats, hist[0], None]}
        if self._splittable(0, root_count):
            leaves[0][6] = self._find([hist[0]], [root_stats], [root_count], 0)
        n_leaves = 1
        while n_leaves < self.max_leaf_nodes:
            node = self._pick(leaves)
            if node is None:
                break
            lo, hi, depth, count, stats, phist, sp = leaves.pop(node)
            f, b, ml = int(sp.feature[0]), int(sp.bin[0]), bool(sp.missing_left[0])
            with phase("partition"):
                n_left = partition_segment(rows, scratch, lo, hi, binned, f, b, ml, info.missing_bin)
            mid = lo + n_left
            ls, rs = sp.left_stats[0], sp.right_stats[0]
            if self._scalar:
                lw, rw = float(ls[1]), float(rs[1])
            else:
                lw, rw = float(crit.node_weight(ls)), float(crit.node_weight(rs))
            # Counts are estimated from the weight share until the collective brings the exact one.
            tot_w = lw + rw
            l_est = count * lw / tot_w if tot_w > 0 else count / 2
            lid = add_child(tree, crit, ls, depth + 1, shrinkage, l_est)
            rid = add_child(tree, crit, rs, depth + 1, shrinkage, count - l_est)
            tree.set_split(node, f, b, info.threshold(f, b), ml, float(sp.gain[0]), lid, rid)
            n_leaves += 1
            can_l = bool(self._splittable(depth + 1, l_est))
            can_r = bool(self._splittable(depth + 1, count - l_est))
            last = n_leaves >= self.max_leaf_nodes
            if last or not (can_l or can_r):
                leaves[lid] = [lo, mid, depth + 1, l_est, ls, None, None]
                leaves[rid] = [mid, hi, depth + 1, count - l_est, rs, None, None]
                continue
            build_left = lw <= rw
            b_lo, b_hi = (lo, mid) if build_left else (mid, hi)
            local = self._build_node(channels, rows, b_lo, b_hi)
            small, extra = red.reduce(local, np.array([float(b_hi - b_lo)]))
            small = small[0]
            sib = phist - small
            small_count = float(extra[0])
            lh, rh = (small, sib) if build_left else (sib, small)
            lc, rc = (small_count, count - small_count) if build_left else (count - small_count, small_count)
            tree.set_count(lid, lc)
            tree.set_count(rid, rc)
            leaves[lid] = [lo, mid, depth + 1, lc, ls, lh, None]
            leaves[rid] = [mid, hi, depth + 1, rc, rs, rh, None]
            todo = [i for i, c in ((lid, lc), (rid, rc)) if self._splittable(depth + 1, c)]
            if todo:
                res = self._find([leaves[i][5] for i in todo], [leaves[i][4] for i in todo],
                                 [leaves[i][3] for i in todo], depth + 1)
                for j, i in enumerate(todo):
                    leaves[i][6] = res.take(slice(j, j + 1))  # views, no copies
            for i in (lid, rid):
                leaves[i][5] = None if leaves[i][6] is None else leaves[i][5]
        leaf_nodes = np.array(sorted(leaves), dtype=np.int64)
        leaf_starts = np.array([leaves[i][0] for i in leaf_nodes], dtype=np.int64)
        leaf_stops = np.array([leaves[i][1] for i in leaf_nodes], dtype=np.int64)
        return GrownTree(tree, rows, leaf_nodes, leaf_starts, leaf_stops)

    def _find(self, hists, stats, counts, depth):
        if self._direct_search:
            return self._find_newton(hists, stats, counts)
        res = self.reducer.find(np.stack(hists), np.stack(stats), self.criterion, self.bin_info,
                                parent_count=np.asarray(counts, dtype=np.float64), min_gain=self.min_gain)
        return res

    def _find_newton(self, hists, stats, counts):
        """Newton split search by a direct call of the compiled kernel.

        Same kernel and arguments as ``find_best_splits`` reaches through
        ``NewtonCriterion.numba_search``, without its per-call input checks and
        conversions (the grower's own arrays are already float64, contiguous and of
        known shapes). Measured at 28 features x 256 bins, one node: 82-86 -> 76 us
        per call; the rest is the kernel itself.
        """
        from .splitting import _newton_search_kernel

        crit = self.criterion
        n = len(hists)
        c = crit.n_channels
        with phase("split"):
            hist = hists[0][None] if n == 1 else np.stack(hists)
            parent = np.stack(stats) if n > 1 else np.ascontiguousarray(stats[0], dtype=np.float64)[None]
            res = SplitResult(np.empty(n, np.int32), np.zeros(n, np.int32), np.zeros(n, bool), np.empty(n),
                              np.zeros((n, c)), np.zeros((n, c)))
            _newton_search_kernel(np.ascontiguousarray(hist), np.ascontiguousarray(parent, dtype=np.float64),
                                  self._nb, self.bin_info.missing_bin, _NO_MASK, False,
                                  np.asarray(counts, dtype=np.float64), True, crit.n_outputs,
                                  crit.l2_regularization, float(crit.min_samples_leaf), crit.min_child_weight,
                                  self.min_gain, REL_TOL, res.feature, res.bin, res.missing_left, res.gain,
                                  res.left_stats, res.right_stats)
        return res

    @staticmethod
    def _add_scalar_child(tree, crit, stats, depth, shrinkage, count):
        """``_add_child`` for a one-output NewtonCriterion (``stats`` = (G, H))."""
        g, h = float(stats[0]), float(stats[1])
        d = h + crit.l2_regularization
        value, score = (-g / d, g * g / d) if d > 0 else (0.0, 0.0)
        return tree.add_node(depth, h, (value * shrinkage,), -score, count=count)

    @staticmethod
    def _pick(leaves):
        """Leaf to split next: largest gain; gains within REL_TOL tie to the lowest node id."""
        cands = [(node, float(v[6].gain[0])) for node, v in leaves.items()
                 if v[6] is not None and v[6].feature[0] >= 0]
        if not cands:
            return None
        best = max(g for _, g in cands)
        return min(node for node, g in cands if g >= best - REL_TOL * abs(best))


@numba.njit(cache=True)
def _route_sum_tree(t, binned, channels, rows, row_starts, feature, bin_thr, missing_left, left, right, offsets,
                    missing_bin, out):
    # Sums tree t's rows into the leaf each reaches (rows in the given order);
    # ``left`` / ``right`` are packed ids (tree offset added), as walk_binned expects.
    c = channels.shape[1]
    for i in range(row_starts[t], row_starts[t + 1]):
        r = rows[i]
        node = walk_binned(binned, r, offsets[t], feature, bin_thr, missing_left, left, right, missing_bin)
        for k in range(c):
            out[node, k] += channels[r, k]


@numba.njit(cache=True)
def _route_sum_serial(binned, channels, rows, row_starts, feature, bin_thr, missing_left, left, right, offsets,
                      missing_bin, out):
    for t in range(offsets.shape[0] - 1):
        _route_sum_tree(t, binned, channels, rows, row_starts, feature, bin_thr, missing_left, left, right, offsets,
                        missing_bin, out)


@numba.njit(cache=True, parallel=True)
def _route_sum_parallel(binned, channels, rows, row_starts, feature, bin_thr, missing_left, left, right, offsets,
                        missing_bin, out):
    # Trees own disjoint node slices of ``out``: no races.
    for t in numba.prange(offsets.shape[0] - 1):
        _route_sum_tree(t, binned, channels, rows, row_starts, feature, bin_thr, missing_left, left, right, offsets,
                        missing_bin, out)


@numba.njit(cache=True)
def _sum_inner_nodes(feature, left, right, offsets, sums):
    # Children have larger ids than their parent: one backward pass per tree.
    for t in range(offsets.shape[0] - 1):
        base = offsets[t]
        for node in range(offsets[t + 1] - base - 1, -1, -1):
            if feature[base + node] >= 0:
                for k in range(sums.shape[1]):
                    sums[base + node, k] = sums[base + left[base + node], k] + sums[base + right[base + node], k]


def reestimate_leaves(trees, binned, channels, tree_rows, value_fn, missing_bin, comm=None, algorithm="auto"):
    """Set node values from another row set per tree (honest estimation).

    Parameters
    ----------
    trees : sequence of Tree
        Modified in place: ``value`` becomes ``value_fn(sums)``.
    binned : ndarray of uint8, shape (n_features, n_rows)
    channels : ndarray of float64, shape (n_rows, C)
        Channels to sum (any ``C``; need not be the growing criterion's).
    tree_rows : sequence of ndarray of int
        Per tree, this rank's local estimation rows.
    value_fn : callable
        ``value_fn(sums (n_nodes, C)) -> (n_nodes, n_outputs)``, row by row; it is
        called once with the global sums of every node of every tree stacked (inner
        nodes sum their leaves).
    missing_bin : int
    comm : native.comm.Communicator, optional
    algorithm : str

    Returns
    -------
    list of ndarray of float64, shape (n_nodes_t, C)
        The global channel sums of every node of every tree (identical on all ranks).
    """
    comm = world() if comm is None else comm
    trees = list(trees)
    if len(tree_rows) != len(trees):
        raise ValueError(f"got {len(tree_rows)} row sets for {len(trees)} trees")
    channels = np.ascontiguousarray(channels, dtype=np.float64)
    if channels.ndim != 2 or channels.shape[0] != np.asarray(binned).shape[1]:
        raise ValueError(f"channels must have shape ({np.asarray(binned).shape[1]}, C), got {channels.shape}")
    c = channels.shape[1]
    sizes = np.array([t.node_count for t in trees], dtype=np.int64)
    offsets = np.zeros(len(trees) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    local = np.zeros((int(offsets[-1]), c))
    with phase("leaves"):
        # One kernel for all trees (tree-local child ids, concatenated node arrays).
        cat = {name: np.ascontiguousarray(np.concatenate([getattr(t, name) for t in trees]))
               for name in ("feature", "bin_threshold", "missing_left", "left", "right")} if trees else None
        lengths = np.array([len(r) for r in tree_rows], dtype=np.int64)
        row_starts = np.zeros(len(trees) + 1, dtype=np.int64)
        np.cumsum(lengths, out=row_starts[1:])
        all_rows = np.ascontiguousarray(np.concatenate([np.asarray(r, dtype=np.int64) for r in tree_rows])) \
            if lengths.sum() else np.zeros(0, dtype=np.int64)
        if trees and len(all_rows):
            kernel = _route_sum_serial if (len(all_rows) < _SERIAL_BUILD_ROWS or numba.get_num_threads() == 1) \
                else _route_sum_parallel
            base = np.repeat(offsets[:-1], sizes)
            packed_left = np.where(cat["left"] >= 0, cat["left"] + base, -1)
            packed_right = np.where(cat["right"] >= 0, cat["right"] + base, -1)
            kernel(np.asarray(binned), channels, all_rows, row_starts, cat["feature"], cat["bin_threshold"],
                   cat["missing_left"], packed_left, packed_right, offsets, int(missing_bin), local)
    with phase("communication"):
        total = col.allreduce(comm, local, algorithm=algorithm) if comm.size > 1 else local
    out = []
    with phase("leaves"):
        total = np.ascontiguousarray(total.reshape(-1, c))
        if trees:
            _sum_inner_nodes(cat["feature"], cat["left"], cat["right"], offsets, total)
            values = np.asarray(value_fn(total), dtype=np.float64).reshape(len(total), -1)
        for t, tree in enumerate(trees):
            tree.value = values[offsets[t]:offsets[t + 1]]
            out.append(total[offsets[t]:offsets[t + 1]].copy())
    return out

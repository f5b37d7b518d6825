"""Tree-parallel finishing: whole subtrees grown by the compiled kernel, one rank per tree.

This module owns the step that hands frontier nodes from level-wise histogram growth
(:func:`forest.engine.expansion.grow_levelwise`) to the subtree kernel of
:mod:`forest.engine.local_growth`. By default that is every tree from its root (see
``EngineOptions.local_threshold``): deep forest trees have thousands of nodes of a
handful of rows, and a dense ``F x B x C`` histogram per node costs
``nodes x F x B x C`` in work and bytes.

One call per level (:meth:`TreeParallelFinisher.finish`). Single rank: the nodes'
local rows are used directly. Several ranks, per chunk of trees
(``EngineOptions.local_gather_bytes``): each tree is given to one rank (greedy by
rows, computed identically everywhere); one ``alltoallv`` sends the nodes' rows
(codes, channels, global ids) to their tree's owner, which puts them in
global-row-id order and grows the subtrees, and an ``allgatherv`` shares the split
records. A subtree is a pure function of its gid-ordered rows, so the trees are
identical on every rank and for every rank count. (Growing every tree on every rank
would save the second collective but replicate the work: measured slower at -np 2.)
"""
import numpy as np

from native import collectives as col

from forest.engine.hist_builder import gather_segments
from forest.engine.local_growth import (REC_BIN, REC_DEPTH, REC_FEATURE, REC_LEFT, REC_MISSING_LEFT, REC_NODE,
                                        SubtreeRecords, grow_subtrees)
from forest.engine.node_records import record_splits
from forest.profiling import phase
from forest.engine.splitting import REL_TOL


class TreeParallelFinisher:
    """Finishes the subtrees of frontier nodes with :mod:`forest.engine.local_growth`.

    Parameters
    ----------
    compiled : forest.criteria.compiled.CompiledCriterion
    criterion : forest.criteria.basic.Criterion
    binned : ndarray of uint8, shape (n_features, n_rows)
    channels : ndarray of float64, shape (n_rows, C)
    gids : ndarray of int64, shape (n_rows,) or None
        Global row ids (needed on several ranks).
    bin_info : forest.engine.bin_info.BinInfo
    comm : native.comm.Communicator
    tree_indices : ndarray of int64, shape (n_trees,)
    params : forest.engine.growth_options.TreeParams
    engine : forest.engine.growth_options.EngineOptions
    """

    def __init__(self, compiled, criterion, binned, channels, gids, bin_info, comm, tree_indices, params, engine):
        self.compiled = compiled
        self.criterion = criterion
        self.binned = binned
        self.channels = channels
        self.gids = gids
        self.bin_info = bin_info
        self.comm = comm
        self.tree_indices = tree_indices
        self.engine = engine
        self.kwargs = dict(min_samples_split=float(params.min_samples_split), max_depth=params.max_depth,
                           min_gain=float(params.min_gain), rel_tol=REL_TOL, mtry=params.mtry, seed=params.seed,
                           hist_rows=engine.hist_rows, max_hist_slots=engine.max_hist_slots)
        # Single rank: rows are used in local order, which is global-id order when the
        # ids increase with the local row (as native.blocks / global_ids lay them out).
        self.sort_local = gids is not None and len(gids) > 1 and not np.all(np.diff(gids) > 0)

    def _grow(self, binned, channels, rows, starts, t_tree, t_node, t_depth, trees):
        tree_next = np.array([t.node_count for t in trees], dtype=np.int64)
        return grow_subtrees(binned, channels, rows, starts, t_tree, t_node, t_depth, tree_next, self.tree_indices,
                             self.compiled, self.bin_info.missing_bin,
                             categorical=self.bin_info.categorical if self.bin_info.any_categorical else None,
                             **self.kwargs)

    def finish(self, trees, rows, t_tree, t_node, t_depth, t_lo, t_hi, t_count):
        """Grow the subtrees of nodes ``(t_tree, t_node)`` (tree-sorted) owning ``rows[t_lo:t_hi]``."""
        if len(t_tree) == 0:
            return
        if self.comm.size == 1:
            with phase("local"):
                gathered, g_starts = gather_segments(rows, t_lo, t_hi)
                if self.sort_local:
                    task = np.repeat(np.arange(len(t_lo)), np.diff(g_starts))
                    gathered = gathered[np.lexsort((self.gids[gathered], task))]
                self._append(trees, self._grow(self.binned, self.channels, gathered, g_starts, t_tree, t_node,
                                               t_depth, trees))
            return
        # Several ranks: chunks of whole trees, each at most local_gather_bytes on the wire.
        c = self.channels.shape[1]
        row_bytes = self.binned.shape[0] + 8 * c + 16
        per_tree = np.bincount(t_tree, weights=t_count, minlength=len(trees))
        cum = np.cumsum(per_tree) * row_bytes
        chunk_of_tree = (cum // self.engine.local_gather_bytes).astype(np.int64)
        chunk_of_task = chunk_of_tree[t_tree]
        for ch in np.unique(chunk_of_task):
            sel = np.flatnonzero(chunk_of_task == ch)
            self._finish_gathered(trees, rows, t_tree[sel], t_node[sel], t_depth[sel], t_lo[sel], t_hi[sel],
                                  t_count[sel])

    def _finish_gathered(self, trees, rows, t_tree, t_node, t_depth, t_lo, t_hi, t_count):
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
            mine, m_starts = gather_segments(rows, t_lo, t_hi)
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
            recs = self._grow(g_binned, g_channels, sub_rows, sub_starts, t_tree[mine_t], t_node[mine_t],
                              t_depth[mine_t], trees)
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
        ints, floats = recs.ints, recs.floats
        if len(ints) == 0:
            return
        c = self.channels.shape[1]
        owner = np.repeat(np.arange(len(trees)), np.diff(recs.tree_starts))
        lids = record_splits(trees, self.criterion, owner, ints[:, REC_NODE], floats[:, 1:1 + c], floats[:, 1 + c:],
                             ints[:, REC_DEPTH], ints[:, REC_FEATURE], ints[:, REC_BIN], ints[:, REC_MISSING_LEFT],
                             floats[:, 0], self.bin_info, recs.cat_bits() if self.bin_info.any_categorical else None)
        if not np.array_equal(lids, ints[:, REC_LEFT]):
            raise RuntimeError("local growth and the trees disagree on node ids")

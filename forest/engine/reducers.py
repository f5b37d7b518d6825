"""The communicating hooks of growth: one rank, allreduce, reduce-scatter.

This module owns how the growers' per-rank histograms become the split decisions
every rank shares. As in LightGBM's parallel learners, the growth loops
(:mod:`forest.engine.expansion`) are written once against :class:`LocalReducer` (a single
rank: nothing to communicate) and the parallel modes override only the hooks that
communicate:

:class:`LocalReducer`
    ``reduce`` returns the local histograms, ``reduce_small`` the local vector,
    ``reduce_codes`` unpacks a quantized histogram, ``find`` searches every feature
    (:func:`forest.engine.splitting.find_best_splits`).
:class:`AllreduceReducer`
    ``reduce``: one fused collective carries the histograms and the small extras
    (row counts, channel totals); ``reduce_small``: an allreduce; ``reduce_codes``:
    one integer allreduce in the narrow wire packing of :mod:`forest.engine.int_packing`
    (exact sums, so the same on any rank count). Every rank then
    holds the full reduced histograms and finds the same splits itself.
:class:`ReduceScatterReducer`
    LightGBM's data-parallel scheme: ``reduce`` reduce-scatters the histograms by
    blocks of features (half the bytes of an allreduce), ``find`` searches this
    rank's block and combines the per-node best records with
    ``native.collectives.allreduce_best`` (gain, then lowest feature, bin,
    missing-right; the children's channel sums ride along). Grows the trees
    allreduce grows.

Coordinator choice: every rank finds the splits itself from the identical reduced
histograms (the collectives leave bitwise-identical buffers on all ranks, and split
finding is a deterministic function of them), instead of rank 0 choosing and
broadcasting the split records. This costs no message at all, where rank 0 + bcast
adds one latency-bound collective per level/step on the critical path while the other
ranks idle; the split search itself is small next to the histogram pass, so repeating
it on every rank is cheaper than waiting for it.
"""
import numpy as np

from native import collectives as col
from native.blocks import block_range

from forest.engine.growth_options import SPLIT_MODES
from forest.engine.int_packing import unpack_histogram
from forest.profiling import phase
from forest.engine.categorical_split import bits_to_halves, halves_to_bits
from forest.engine.splitting import REL_TOL, SplitResult, find_best_splits


class LocalReducer:
    """Hooks of a single rank (see the module docstring).

    Parameters
    ----------
    comm : native.comm.Communicator
    n_features : int
    algorithm : str
        Passed to the collectives (``"auto"`` lets ``native`` choose).

    Attributes
    ----------
    f0, f1 : int
        The features whose histograms this rank holds after :meth:`reduce`.
    """

    scattered = False

    def __init__(self, comm, n_features, algorithm="auto"):
        self.comm = comm
        self.n_features = n_features
        self.algorithm = algorithm
        self.f0, self.f1 = 0, n_features

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
        return local_hist, np.ascontiguousarray(extra, dtype=np.float64)

    def reduce_small(self, values):
        """Sum a small float vector over ranks."""
        return np.ascontiguousarray(values, dtype=np.float64)

    def reduce_codes(self, codes, n_outputs, n_rows, layout):
        """Exact sums over ranks of one node's packed integer histogram (quantized boosting).

        Parameters
        ----------
        codes : ndarray of int64, shape (n_features * n_bins * K,)
            Local packed codes ``G * 2**32 + H`` per (feature, bin, output).
        n_outputs : int
            ``K``.
        n_rows : int
            The node's local row count (summed along, exactly).
        layout : callable
            Returns the node's :class:`forest.engine.int_packing.WireLayout`; called only
            where ranks communicate.

        Returns
        -------
        sums : ndarray of int64, shape (n_features * n_bins, 2K)
            ``G`` columns then ``H`` columns; identical on every rank.
        n_rows : int
            Global row count of the node.
        """
        return unpack_histogram(codes, n_outputs), int(n_rows)

    def find(self, hist, parent, criterion, bin_info, feature_mask=None, parent_count=None, min_gain=0.0):
        """Best split per node from this rank's reduced histograms.

        Parameters
        ----------
        hist : ndarray, shape (n_nodes, f1 - f0, n_bins, C)
        parent : ndarray, shape (n_nodes, C)
        criterion : forest.criteria.basic.Criterion
        bin_info : forest.engine.bin_info.BinInfo
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
            return find_best_splits(hist, parent, criterion, bin_info.n_bins_non_missing[f0:f1], bin_info.missing_bin,
                                    feature_mask=None if feature_mask is None else feature_mask[:, f0:f1],
                                    parent_count=parent_count, min_gain=min_gain, rel_tol=REL_TOL, feature_offset=f0,
                                    categorical=bin_info.categorical[f0:f1] if bin_info.any_categorical else None)


class AllreduceReducer(LocalReducer):
    """Every rank gets the full reduced histograms (see the module docstring)."""

    def reduce(self, local_hist, extra):
        extra = np.ascontiguousarray(extra, dtype=np.float64)
        with phase("communication"):
            # One fused buffer: histograms and the extras travel in one collective.
            buf = np.concatenate([local_hist.reshape(-1), extra])
            red = col.allreduce(self.comm, buf, algorithm=self.algorithm)
            n = local_hist.size
            return red[:n].reshape(local_hist.shape), red[n:]

    def reduce_codes(self, codes, n_outputs, n_rows, layout):
        wire = layout()
        n = wire.n_slots
        buf = np.empty(n + 2, dtype=wire.dtype)
        wire.encode(codes, buf[:n])
        # The row count rides in two slots (low 16 bits, the rest): both sums stay small.
        buf[n], buf[n + 1] = int(n_rows) & 0xFFFF, int(n_rows) >> 16
        with phase("communication"):
            red = col.allreduce(self.comm, buf, algorithm=self.algorithm)
        return wire.decode(red[:n]), int(red[n]) + (int(red[n + 1]) << 16)

    def reduce_small(self, values):
        with phase("communication"):
            return col.allreduce(self.comm, np.ascontiguousarray(values, dtype=np.float64), algorithm=self.algorithm)


class ReduceScatterReducer(AllreduceReducer):
    """Feature blocks per rank, best records combined (see the module docstring)."""

    scattered = True

    def reduce_codes(self, codes, n_outputs, n_rows, layout):
        raise ValueError("quantized histograms need split_mode='allreduce'")

    def __init__(self, comm, n_features, algorithm="auto"):
        super().__init__(comm, n_features, algorithm)
        self.f0, self.f1 = block_range(n_features, comm.size, comm.rank)

    def reduce(self, local_hist, extra):
        extra = np.ascontiguousarray(extra, dtype=np.float64)
        with phase("communication"):
            by_feature = np.ascontiguousarray(local_hist.transpose(1, 0, 2, 3))
            alg = self.algorithm if self.algorithm in ("ring", "halving") else "auto"
            block, (start, stop) = col.reduce_scatter(self.comm, by_feature, algorithm=alg)
            assert (start, stop) == (self.f0, self.f1)
            red_extra = col.allreduce(self.comm, extra) if extra.size else extra
            return np.ascontiguousarray(block.transpose(1, 0, 2, 3)), red_extra

    def find(self, hist, parent, criterion, bin_info, feature_mask=None, parent_count=None, min_gain=0.0):
        res = super().find(hist, parent, criterion, bin_info, feature_mask, parent_count, min_gain)
        n, c = res.left_stats.shape
        # A categorical split's category set travels as 32-bit halves (exact in float64).
        nb = 2 * bin_info.cat_words if bin_info.any_categorical else 0
        rec = np.empty((n, 4 + 2 * c + nb))
        rec[:, 0] = res.gain
        rec[:, 1] = np.where(res.valid, res.feature, self.n_features)
        rec[:, 2] = res.bin
        rec[:, 3] = res.missing_left
        rec[:, 4:4 + c] = res.left_stats
        rec[:, 4 + c:4 + 2 * c] = res.right_stats
        if nb:
            # a rank whose features hold no categorical one searched with the default width
            rec[:, 4 + 2 * c:] = 0.0
            halves = bits_to_halves(res.cat_bits)
            rec[:, 4 + 2 * c:4 + 2 * c + halves.shape[1]] = halves
        with phase("communication"):
            best = col.allreduce_best(self.comm, rec, rtol=REL_TOL, n_keys=3)  # (feature, bin, missing_left)
        valid = np.isfinite(best[:, 0]) & (best[:, 1] < self.n_features)
        return SplitResult(np.where(valid, best[:, 1], -1).astype(np.int32), best[:, 2].astype(np.int32),
                           best[:, 3] != 0, np.where(valid, best[:, 0], -np.inf),
                           best[:, 4:4 + c].copy(), best[:, 4 + c:4 + 2 * c].copy(),
                           halves_to_bits(best[:, 4 + 2 * c:]) if nb else None)


def make_reducer(comm, n_features, split_mode="allreduce", algorithm="auto"):
    """The reducer of ``split_mode`` for ``comm`` (:class:`LocalReducer` on one rank).

    Parameters
    ----------
    comm : native.comm.Communicator
    n_features : int
    split_mode : {"allreduce", "reduce_scatter"}
    algorithm : str

    Returns
    -------
    LocalReducer
    """
    if split_mode not in SPLIT_MODES:
        raise ValueError(f"split_mode must be one of {SPLIT_MODES}, got {split_mode!r}")
    if comm.size == 1:
        return LocalReducer(comm, n_features, algorithm)
    if split_mode == "reduce_scatter":
        return ReduceScatterReducer(comm, n_features, algorithm)
    return AllreduceReducer(comm, n_features, algorithm)

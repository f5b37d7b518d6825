"""Quantized gradient boosting: per-iteration integer gradients and the leaf refit.

This module owns the boosting side of quantized training (``quantized=True`` on
:class:`forest.estimators.gbdt.GBDTRegressor` / ``GBDTClassifier``):

:class:`GradientQuantizer`
    Once per iteration: the global maxima of ``|g_k|`` and ``h_k`` (one allgather),
    the scales of :func:`histogram.quantize.scales`, and the stochastically rounded
    packed codes of every training row (:func:`histogram.quantize.quantize`, noise
    keyed by seed, iteration and global row id, so the codes do not depend on the
    rank count).
:func:`refit_leaves`
    After a tree is grown from the integer histograms, its node values are recomputed
    from the full-precision gradients: per node the sums of the float channels, as
    fixed-point int64 (``2**-b`` of the channel's global maximum, ``b = 62 -
    bits(n_rows)``: finer than float64 summation of ``n`` rows already rounds, and
    exact and order independent, so the refit model is the same bits on any rank
    count), one int64 allreduce, then ``criterion.node_summary`` (value with ``l2``
    and the learning rate, weight, objective).
:func:`exact_sum`
    The same fixed-point sums for the baseline, so that the first gradients (and so
    every later one) are the same bits on any rank count.

The integer histograms themselves: :func:`histogram.cpu_kernels.build_int_histogram`
(one integer add per row and feature), the wire packing :mod:`forest.engine.int_packing`,
and the grower's quantized step in :class:`forest.engine.expansion.LeafwiseGrower`.
"""
import numba
import numpy as np

from histogram.cpu_kernels import PREFETCH_ROWS, prefetch
from histogram.jit import kernel
from histogram.quantize import column_abs_max, quantize, scales
from native import collectives as col

from forest.profiling import phase

#: rowhash stream base of the rounding noise (the iteration is added).
_QUANT_STREAM = 0x51 << 48  # "Q"


def global_abs_max(comm, x):
    """Largest ``|x[:, j]|`` of each column over all ranks (one allgather); float64 (C,)."""
    with phase("other"):
        local = column_abs_max(x)
    if comm.size == 1:
        return local
    with phase("communication"):
        return col.allgather(comm, local[None, :]).max(axis=0)


class QuantizedGradients:
    """One iteration's integer gradients.

    Attributes
    ----------
    codes : ndarray of int64, shape (K, n)
        Packed ``g_int * 2**32 + h_int`` per output and row.
    scale : ndarray of float64, shape (2K,)
        ``g ~ g_int * scale[k]``, ``h ~ h_int * scale[K + k]``.
    fine : ndarray of float64, shape (2K,)
        Fixed-point unit of each channel for :func:`refit_leaves`.
    levels : int
    """

    def __init__(self, codes, scale, fine, levels):
        self.codes = codes
        self.scale = scale
        self.fine = fine
        self.levels = int(levels)

    @property
    def n_outputs(self):
        return self.codes.shape[0]


class GradientQuantizer:
    """Rounds each iteration's gradients (see the module docstring).

    Parameters
    ----------
    comm : native.comm.Communicator
    gids : ndarray of int64, shape (n,)
        Global ids of this rank's training rows.
    n_global : int
        Training rows over all ranks.
    levels : int
        Even number of gradient levels (``quantized_bins``).
    seed : int
    """

    def __init__(self, comm, gids, n_global, levels, seed):
        self.comm = comm
        self.gids = np.ascontiguousarray(gids, dtype=np.int64)
        self.levels = int(levels)
        self.seed = int(seed)
        self.n_global = int(n_global)
        _fine_units(np.ones(1), n_global)  # refuses row counts the fixed point cannot hold
        self._codes = None

    def quantize(self, channels, iteration):
        """:class:`QuantizedGradients` of ``channels`` (n, 2K) at boosting ``iteration``."""
        k = channels.shape[1] // 2
        peak = global_abs_max(self.comm, channels)
        with phase("other"):
            scale = scales(peak[:k], peak[k:], self.levels)
            fine = _fine_units(peak, self.n_global)
            if self._codes is None or self._codes.shape != (k, len(channels)):
                self._codes = np.empty((k, len(channels)), dtype=np.int64)
            quantize(channels, self.gids, self.seed, _QUANT_STREAM + int(iteration), scale, self.levels,
                     out=self._codes)
        return QuantizedGradients(self._codes, scale, fine, self.levels)


#: Rows per task of the parallel fixed-point sums (a leaf segment of more rows is cut
#: into pieces of at most this many, so two threads share even a tree's largest leaf).
_SUM_PIECE_ROWS = 32768


@kernel
def _fixed_sums_range(channels, rows, a, b, inv, out):
    c = channels.shape[1]
    flat = channels.reshape(-1)
    for i in range(a, b):
        # The rows of a leaf are scattered over the whole array: each read is a cache
        # miss unless asked for ahead (as the histogram kernels do).
        if i + PREFETCH_ROWS < b:
            prefetch(flat, np.int64(rows[i + PREFETCH_ROWS]) * c)
        r = rows[i]
        for j in range(c):
            out[j] += np.int64(np.rint(channels[r, j] * inv[j]))


@kernel(parallel=True)
def _fixed_sums_tasks(channels, rows, task_lo, task_hi, inv, partial):
    for t in numba.prange(task_lo.shape[0]):
        _fixed_sums_range(channels, rows, task_lo[t], task_hi[t], inv, partial[t])


def fixed_leaf_sums(channels, rows, starts, stops, fine):
    """Per leaf segment, fixed-point sums ``round(channels / fine)``; int64 (n_leaves, C).

    ``channels`` (n, C) float64 is read at ``rows[starts[s]:stops[s]]`` for segment ``s``.
    The integer sums are exact, so the pieces the threads take (segments cut into
    :data:`_SUM_PIECE_ROWS`) do not change them. :func:`fixed_leaf_sums_reference` is
    the NumPy reference.
    """
    channels = np.ascontiguousarray(channels, dtype=np.float64)
    rows = np.ascontiguousarray(rows)
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    stops = np.ascontiguousarray(stops, dtype=np.int64)
    inv = 1.0 / np.asarray(fine, dtype=np.float64)
    out = np.zeros((len(starts), channels.shape[1]), dtype=np.int64)
    lengths = stops - starts
    threads = numba.get_num_threads()
    if threads == 1 or lengths.sum() < 2 * _SUM_PIECE_ROWS:
        for s in range(len(starts)):
            _fixed_sums_range(channels, rows, starts[s], stops[s], inv, out[s])
        return out
    pieces = np.maximum(1, -(-lengths // _SUM_PIECE_ROWS))
    seg = np.repeat(np.arange(len(starts)), pieces)
    k = np.arange(len(seg)) - np.repeat(np.cumsum(pieces) - pieces, pieces)  # piece index within its segment
    lo = starts[seg] + lengths[seg] * k // pieces[seg]
    hi = starts[seg] + lengths[seg] * (k + 1) // pieces[seg]
    partial = np.zeros((len(seg), channels.shape[1]), dtype=np.int64)
    _fixed_sums_tasks(channels, rows, lo, hi, inv, partial)
    np.add.at(out, seg, partial)
    return out


def fixed_leaf_sums_reference(channels, rows, starts, stops, fine):
    """NumPy reference of :func:`fixed_leaf_sums` (same integers)."""
    channels = np.asarray(channels, dtype=np.float64)
    fixed = np.rint(channels * (1.0 / np.asarray(fine, dtype=np.float64))).astype(np.int64)
    return np.array([fixed[rows[a:b]].sum(axis=0) for a, b in zip(starts, stops)], dtype=np.int64
                    ).reshape(len(starts), channels.shape[1])


def _fine_units(peak, n_global):
    """Fixed-point unit per column: ``2**-b`` of the column's global peak, ``b = 62 - bits(n)``."""
    bits = 62 - int(n_global).bit_length()
    if bits < 24:
        raise ValueError(f"quantized boosting supports up to 2**38 rows, got {n_global}")
    return np.where(peak > 0, peak, 1.0) * 2.0 ** -bits


def exact_sum(comm, terms, n_global):
    """Column sums of per-row ``terms`` (n, c) over all ranks, the same bits on any rank count.

    Each term is rounded to the fixed-point unit of :func:`_fine_units` and summed in
    int64 (one allgather of the column peaks, one int64 allreduce); the baseline of a
    quantized fit comes from here so that every later gradient is rank-count free.

    Returns
    -------
    ndarray of float64, shape (c,)
    """
    terms = np.ascontiguousarray(terms, dtype=np.float64)
    peak = global_abs_max(comm, terms)
    fine = _fine_units(peak, n_global)
    sums = fixed_leaf_sums(terms, np.arange(len(terms), dtype=np.int32), np.array([0]), np.array([len(terms)]),
                           fine)[0]
    if comm.size > 1:
        sums = col.allreduce(comm, sums)
    return sums * fine


def refit_leaves(grown, channels, quant, criterion, comm, shrinkage):
    """Recompute every node's value, weight and objective of ``grown.tree`` from float sums.

    Parameters
    ----------
    grown : forest.engine.expansion.GrownTree
    channels : ndarray of float64, shape (n, 2K)
        The iteration's full-precision gradients and hessians.
    quant : QuantizedGradients
    criterion : forest.criteria.basic.NewtonCriterion
    comm : native.comm.Communicator
    shrinkage : float
        The learning rate (multiplies the values).
    """
    tree = grown.tree
    with phase("other"):
        leaf = fixed_leaf_sums(channels, grown.rows, grown.leaf_starts, grown.leaf_stops, quant.fine)
    if comm.size > 1:
        with phase("communication"):
            leaf = col.allreduce(comm, leaf)
    with phase("other"):
        sums = np.zeros((tree.node_count, channels.shape[1]), dtype=np.int64)
        sums[grown.leaf_nodes] = leaf
        left, right = tree.left, tree.right
        # Children have larger ids than their parent: one backward pass adds them up.
        for node in range(tree.node_count - 1, -1, -1):
            if left[node] >= 0:
                sums[node] = sums[left[node]] + sums[right[node]]
        stats = sums * quant.fine
        fields = [criterion.node_summary(stats[i], shrinkage) for i in range(tree.node_count)]
        tree.set_summaries(np.array([f[0] for f in fields]), np.array([f[1] for f in fields], dtype=np.float64),
                           np.array([f[2] for f in fields]))

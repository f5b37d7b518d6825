"""grf's log-rank splitting rule for censored outcomes, on histograms over a global time grid.

grf's survival forest relabels a node's times by the node's own distinct failure times
and splits where the log-rank statistic of the two children is largest (Ishwaran et al.
2008, eq. 8.1):

    num  = sum_k  d_k^L - Y_k^L * d_k / Y_k
    var  = sum_k  Y_k^L (Y_k - Y_k^L) * (Y_k - d_k) / (Y_k - 1) * d_k / Y_k^2
    gain = num^2 / var

over the failure times ``t_k`` (``d_k`` failures at ``t_k``, ``Y_k`` rows still at risk,
``L`` the left child), stopping where ``Y_k < 2``. A split needs, in each child, at least
``max(ceil(alpha * rows of the node), 1)`` failures, and the node at least two distinct
failure times.

On histograms a node's own relabelling cannot be a per-row channel, so the times are
labelled once, globally, against a *failure grid* ``t_1 < .. < t_G``
(:func:`failure_grid`): a row's label is the number of grid times at or below its time,
``0 .. G``. Channels hold, per label, the weighted failures ``d`` and the weighted rows
``e`` whose time has that label (they leave the risk set after it), so channel sums are
subtractable histograms and ``Y_k = W - sum_{j<k} e_j``. When the data have at most
``G`` distinct failure times the grid is exactly them and the statistic is grf's
(censored rows between two failure times stay at risk at the earlier one, as in grf's
relabelling); with more, failures that share a grid cell count as ties. Prediction does
not use the grid: leaves keep the exact times (:mod:`forest.engine.leaf_outcomes`).

Weights: sample weights scale ``d`` and ``e`` (a frequency-weighted log-rank statistic);
the row and failure counts of the size rules never use them.

Channels ``[w, d_0 .. d_G, e_0 .. e_G, failures, 1]``: ``C = 2 (G + 1) + 3``.
"""
from collections import namedtuple

import numpy as np

from native import collectives as col

from histogram.binning import BinMapper

from forest.criteria.basic import Criterion, rows_and_mean_weight
from forest.criteria.compiled import CompiledCriterion, register

#: Default most failure times the splitting rule tells apart (the grid's size ``G``), chosen
#: by measurement (benchmarks/bench_survival.py, RESULTS.md "SurvivalForest (issue 33)").
DEFAULT_SPLIT_TIMES = 32
#: Largest grid: the channels grow as ``2 G``, the histograms and the gain's cost with them.
MAX_SPLIT_TIMES = 255


def failure_grid(time, event, max_times, comm, seed=0):
    """The global failure grid: at most ``max_times`` increasing failure times (collective).

    The failure times are binned by :class:`histogram.binning.BinMapper` (weighted-row
    quantiles, the same edges at any rank count), and each bin that holds a failure
    contributes its smallest failure time, the exact minimum over every rank. With at
    most ``max_times`` distinct failure times every one has its own bin, so the grid is
    all of them (grf's default ``failure.times``).

    Parameters
    ----------
    time : ndarray of float64, shape (n_local,)
    event : ndarray of bool, shape (n_local,)
    max_times : int
        In ``[2, 255]``.
    comm : native.comm.Communicator
    seed : int

    Returns
    -------
    ndarray of float64, shape (G,)
        ``1 <= G <= max_times`` when any rank has a failure (empty otherwise).
    """
    failures = np.ascontiguousarray(time[event], dtype=np.float64)
    mapper = BinMapper(max_bins=int(max_times), random_state=seed).fit(failures[:, None], comm=comm)
    bins = mapper.transform(failures[:, None])[0].astype(np.int64)
    lowest = np.full(mapper.n_bins_, np.inf)
    np.minimum.at(lowest, bins, failures)
    every = col.allgather(comm, lowest[None, :])
    grid = every.min(axis=0)
    return np.ascontiguousarray(grid[np.isfinite(grid)])


def time_labels(time, grid):
    """Each time's label against the grid: how many grid times are at or below it, ``(n,)`` int64 in ``[0, G]``."""
    return np.searchsorted(np.asarray(grid, dtype=np.float64), np.asarray(time, dtype=np.float64),
                           side="right").astype(np.int64)


class LogRankCriterion(Criterion):
    """grf's log-rank split on failure-grid histograms (see the module docstring).

    Parameters
    ----------
    n_grid : int
        ``G``, the failure grid's size (labels ``0 .. G``).
    alpha : float, default 0.05
        Each child needs ``max(ceil(alpha * rows of the node), 1)`` failures (grf's rule).
    min_samples_leaf : int, default 1
        Each child needs this many rows.
    """

    def __init__(self, n_grid, alpha=0.05, min_samples_leaf=1):
        self.n_grid = int(n_grid)
        if self.n_grid < 1:
            raise ValueError(f"the failure grid needs at least one time, got {n_grid}")
        self.n_labels = self.n_grid + 1
        self.n_channels = 2 * self.n_labels + 3
        self.alpha = float(alpha)
        self.min_samples_leaf = max(int(min_samples_leaf), 1)
        self.n_outputs = 2

    # channel layout
    def _d(self, stats):
        return stats[..., 1:1 + self.n_labels]

    def _e(self, stats):
        return stats[..., 1 + self.n_labels:1 + 2 * self.n_labels]

    def make_channels(self, labels, event, sample_weight=None):
        """Channels ``(n, C)`` from each row's time label ``(n,)`` in ``[0, G]`` and failure flag ``(n,)``."""
        labels = np.asarray(labels, dtype=np.int64)
        event = np.asarray(event, dtype=bool)
        n = len(labels)
        w = np.ones(n) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        out = np.zeros((n, self.n_channels), dtype=np.float64)
        rows = np.arange(n)
        out[:, 0] = w
        out[rows, 1 + labels] = np.where(event, w, 0.0)
        out[rows, 1 + self.n_labels + labels] = w
        out[:, -2] = event
        out[:, -1] = 1.0
        return out

    def min_child_failures(self, parent):
        """Fewest failures a child of a node with sums ``parent (..., C)`` needs, shape (...)."""
        return np.maximum(np.ceil(self.alpha * parent[..., -1]), 1.0)

    def log_rank(self, left, parent):
        """The log-rank statistic ``num^2 / var`` of children ``left`` vs the rest of ``parent``.

        NumPy reference of the compiled gain, the same operations in the same order (so
        the two agree to the bit): ``Y`` and ``Y^L`` by running subtraction from the
        weights, terms while ``Y_k >= 2`` and ``Y^L_k > 0``.

        Parameters
        ----------
        left : ndarray of float64, shape (..., C)
        parent : ndarray of float64, shape broadcastable to ``left``

        Returns
        -------
        ndarray of float64, shape (...); 0 where the variance is 0
        """
        left = np.asarray(left, dtype=np.float64)
        parent = np.broadcast_to(np.asarray(parent, dtype=np.float64), left.shape)
        d, e = self._d(parent), self._e(parent)
        dl, el = self._d(left), self._e(left)
        y = parent[..., 0].copy()
        yl = left[..., 0].copy()
        num = np.zeros(left.shape[:-1])
        var = np.zeros(left.shape[:-1])
        live = np.ones(left.shape[:-1], dtype=bool)
        for k in range(1, self.n_labels):
            y = y - e[..., k - 1]
            yl = yl - el[..., k - 1]
            live = live & (y >= 2.0) & (yl > 0.0)
            with np.errstate(divide="ignore", invalid="ignore"):
                nw = d[..., k] / y
                dw = (y - d[..., k]) / (y - 1.0) * d[..., k] / (y * y)
                num = np.where(live, num + (dl[..., k] - yl * nw), num)
                var = np.where(live, var + yl * (y - yl) * dw, var)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(var > 0, num * num / np.where(var > 0, var, 1.0), 0.0)

    def gain(self, left, right, parent, parent_count=None):
        left = np.asarray(left, dtype=np.float64)
        right = np.asarray(right, dtype=np.float64)
        parent = np.asarray(parent, dtype=np.float64)
        least = self.min_child_failures(parent)
        distinct = (self._d(parent) > 0).sum(axis=-1)
        ok = ((left[..., 0] > 0) & (right[..., 0] > 0)
              & (left[..., -1] >= self.min_samples_leaf) & (right[..., -1] >= self.min_samples_leaf)
              & (left[..., -2] >= least) & (right[..., -2] >= least) & (distinct >= 2))
        return np.where(ok, self.log_rank(left, parent), -np.inf)

    def node_value(self, stats):
        """``[rows, mean weight]`` (rows 0 when the weight is 0: such a node counts as empty)."""
        return rows_and_mean_weight(self._check_stats(stats))

    def node_weight(self, stats):
        return self._check_stats(stats)[..., 0]

    def node_count(self, stats):
        return self._check_stats(stats)[..., -1]

    def node_size(self, stats):
        """Rows (what ``min_samples_split`` compares)."""
        return self.node_count(stats)

    def compiled(self):
        record = LogRankRecord(self.n_labels, self.alpha, float(self.min_samples_leaf))
        # consts: [least failures, distinct failure labels >= 2, stop label, Y_k, d_k/Y_k, var weight_k]
        return CompiledCriterion(record, 0, self.min_samples_leaf, n_consts=3 + 3 * self.n_labels,
                                 size_channel=self.n_channels - 1)


#: Parameter record of :class:`LogRankCriterion` in the compiled kernels.
LogRankRecord = namedtuple("LogRankRecord", ["n_labels", "alpha", "min_samples_leaf"])


def log_rank_prepare(p, parent, consts):
    """Node constants: ``consts[0]`` fewest failures per child, ``consts[1]`` 1 when the node
    has two failure labels, ``consts[2]`` the first label with ``Y < 2`` (the terms stop
    there), then ``Y_k``, ``d_k / Y_k`` and ``(Y_k - d_k) / (Y_k - 1) d_k / Y_k^2`` per label."""
    L = p.n_labels
    c = parent.shape[0]
    consts[0] = max(np.ceil(p.alpha * parent[c - 1]), 1.0)
    distinct = 0
    for k in range(L):
        if parent[1 + k] > 0:
            distinct += 1
    consts[1] = 1.0 if distinct >= 2 else 0.0
    y = parent[0]
    stop = L
    for k in range(1, L):
        y = y - parent[1 + L + k - 1]
        dk = parent[1 + k]
        consts[3 + k] = y
        if y >= 2.0:
            consts[3 + L + k] = dk / y
            consts[3 + 2 * L + k] = (y - dk) / (y - 1.0) * dk / (y * y)
        elif stop == L:
            stop = k
    consts[2] = stop


def log_rank_gains(p, lefts, rights, consts, out, row, n):
    """:meth:`LogRankCriterion.gain` of ``n`` candidates of one node into ``out[row, :n]``."""
    L = p.n_labels
    c = lefts.shape[1]
    stop = int(consts[2])
    for i in range(n):
        g = -np.inf
        if (consts[1] > 0 and lefts[i, 0] > 0 and rights[i, 0] > 0
                and lefts[i, c - 1] >= p.min_samples_leaf and rights[i, c - 1] >= p.min_samples_leaf
                and lefts[i, c - 2] >= consts[0] and rights[i, c - 2] >= consts[0]):
            yl = lefts[i, 0]
            num = 0.0
            var = 0.0
            for k in range(1, stop):
                yl = yl - lefts[i, 1 + L + k - 1]
                if not yl > 0.0:
                    break
                num = num + (lefts[i, 1 + k] - yl * consts[3 + L + k])
                var = var + yl * (consts[3 + k] - yl) * consts[3 + 2 * L + k]
            g = num * num / var if var > 0 else 0.0
        out[row, i] = g


def log_rank_bin_key(p, stats, i, consts):
    """Category sort key: observed over expected failures (the category's relative hazard)."""
    L = p.n_labels
    stop = int(consts[2])
    y = stats[i, 0]
    observed = 0.0
    expected = 0.0
    for k in range(1, stop):
        y = y - stats[i, 1 + L + k - 1]
        if not y > 0.0:
            break
        observed += stats[i, 1 + k]
        expected += y * consts[3 + L + k]
    return observed / expected if expected > 0 else 0.0


register(LogRankRecord, prepare=log_rank_prepare, gains=log_rank_gains, bin_key=log_rank_bin_key)

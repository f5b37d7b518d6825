"""grf's quantile splitting rule on histograms: relabel by the node's quantiles, split as a classification.

grf's quantile forest relabels a node's outcomes by the node's own quantiles at the
forest's levels ``tau_1 < .. < tau_L`` (class ``c`` = how many of those quantiles lie
below the outcome) and splits them by the classification (Gini) rule. The relabelling
depends on the node, so per-row channels cannot hold it directly, and a histogram of the
classes of one node is not the parent's minus its sibling's.

What this module does instead: the outcome is binned once, globally, into ``J`` bins of
its weighted quantiles (``outcome_bins``; the same edges at any rank count, through
:class:`histogram.binning.BinMapper`), and the channels are the one-hot outcome bin
times the weight. Channel sums then *are* subtractable histograms, and a node's
relabelling is a map from outcome bins to classes computed from the node's own sums
(``prepare``): a bin goes to the class of its upper end, i.e. the number of node quantiles
that fall in earlier bins (a quantile's bin is the first whose cumulative weight reaches
``tau_l`` of the node's). Every candidate's class sums are then sums of its bin sums, and the
gain is the Gini gain, ``sum_c S_c(L)^2 / W_L + sum_c S_c(R)^2 / W_R - sum_c S_c^2 / W``
(the variance-reduction gain of the one-hot classes).

The approximation: outcomes that share an outcome bin share a class, so the node's
quantiles are resolved to ``J`` global bins. ``J`` (``DEFAULT_OUTCOME_BINS``) was
chosen by measurement (benchmarks/bench_quantile.py, RESULTS.md). Prediction does not
use the bins: leaves keep the exact outcomes (:mod:`forest.engine.leaf_outcomes`).

Channels: ``[w, w*1[bin = 0] .. w*1[bin = J-1], 1]`` (weight, bin weights, row count).
"""
from collections import namedtuple

import numpy as np

from histogram.jit import compiled_only

from forest.criteria.basic import VarianceCriterion, rows_and_mean_weight
from forest.criteria.compiled import CompiledCriterion, register

#: Outcome bins of the relabelling (see the module docstring), at least twice the classes.
#: Measured (RESULTS.md, "QuantileForest (issue 34)"): 8, 16 and 32 bins gave the same
#: pinball loss to 4 digits on two designs at 20k rows, and 32 bins cost 1.6x the fit time
#: of 16.
DEFAULT_OUTCOME_BINS = 16
#: Most quantile levels one relabelling uses: the compiled record holds them as scalar
#: fields (a tuple field cannot cross Numba's parallel-loop boundary), so a forest asked
#: for more splits on this many of them, spread evenly (:func:`split_levels`).
MAX_SPLIT_LEVELS = 8


def split_levels(levels):
    """The levels a relabelling uses: all of them, or :data:`MAX_SPLIT_LEVELS` spread evenly."""
    levels = tuple(float(t) for t in levels)
    if len(levels) <= MAX_SPLIT_LEVELS:
        return levels
    pick = np.round(np.linspace(0, len(levels) - 1, MAX_SPLIT_LEVELS)).astype(int)
    return tuple(levels[i] for i in pick)


def relabel_map(parent, levels):
    """Class of every outcome bin under a node's relabelling (NumPy reference).

    Parameters
    ----------
    parent : ndarray of float64, shape (..., C)
        The node's channel sums (``C = J + 2``).
    levels : sequence of float
        Quantile levels, increasing in (0, 1).

    Returns
    -------
    ndarray of int64, shape (..., J)
        ``classes[..., j]`` = the number of node quantiles whose bin is before ``j``.
    """
    parent = np.asarray(parent, dtype=np.float64)
    J = parent.shape[-1] - 2
    cum = np.cumsum(parent[..., 1:1 + J], axis=-1)
    total = parent[..., 0]
    j = np.arange(J)
    classes = np.zeros(parent.shape[:-1] + (J,), dtype=np.int64)
    for tau in levels:
        reached = cum >= tau * total[..., None]
        first = np.where(reached.any(axis=-1), reached.argmax(axis=-1), J)   # the quantile's bin
        classes += (first[..., None] < j)
    return classes


class QuantileCriterion(VarianceCriterion):
    """grf's quantile relabelling split on outcome-bin histograms (see the module docstring).

    Parameters
    ----------
    levels : sequence of float
        Quantile levels of the relabelling, increasing, in (0, 1).
    n_outcome_bins : int
        ``J``, the outcome bins of the channels.
    min_samples_leaf : int, default 1
    """

    def __init__(self, levels, n_outcome_bins, min_samples_leaf=1):
        super().__init__(int(n_outcome_bins), min_samples_leaf=min_samples_leaf, count_channel=True)
        self.levels = split_levels(levels)
        if not self.levels or any(not 0.0 < t < 1.0 for t in self.levels) or list(self.levels) != sorted(
                set(self.levels)):
            raise ValueError(f"quantile levels must be distinct, increasing and in (0, 1), got {levels}")
        self.n_classes = len(self.levels) + 1
        self.n_outputs = 2

    def make_channels(self, outcome_bins, sample_weight=None):
        """Channels ``(n, J + 2)`` from each row's outcome bin ``(n,)`` (ints in ``[0, J)``)."""
        b = np.asarray(outcome_bins, dtype=np.int64)
        w = np.ones(len(b)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        out = np.zeros((len(b), self.n_channels), dtype=np.float64)
        out[:, 0] = w
        out[np.arange(len(b)), 1 + b] = w
        out[:, -1] = 1.0
        return out

    def _class_score(self, stats, classes):
        J = self.n_targets
        w = stats[..., 0]
        score = np.zeros(np.broadcast_shapes(stats.shape[:-1], classes.shape[:-1]))
        for c in range(self.n_classes):
            s = (stats[..., 1:1 + J] * (classes == c)).sum(axis=-1)
            with np.errstate(divide="ignore", invalid="ignore"):
                score = score + np.where(w > 0, s * s / np.where(w > 0, w, 1.0), 0.0)
        return score

    def gain(self, left, right, parent, parent_count=None):
        left = np.asarray(left, dtype=np.float64)
        right = np.asarray(right, dtype=np.float64)
        parent = np.asarray(parent, dtype=np.float64)
        classes = relabel_map(parent, self.levels)
        g = self._class_score(left, classes) + self._class_score(right, classes) - self._class_score(parent, classes)
        wl, wr = left[..., 0], right[..., 0]
        ok = (wl > 0) & (wr > 0) & (left[..., -1] >= self.min_samples_leaf) & (right[..., -1] >= self.min_samples_leaf)
        return np.where(ok, g, -np.inf)

    def node_value(self, stats):
        """``[rows, mean weight]`` (rows 0 when the weight is 0: such a node counts as empty)."""
        return rows_and_mean_weight(self._check_stats(stats))

    def node_objective(self, stats):
        stats = self._check_stats(stats)
        return -self._class_score(stats, relabel_map(stats, self.levels))

    def compiled(self):
        padded = self.levels + (2.0,) * (MAX_SPLIT_LEVELS - len(self.levels))   # 2.0: never used
        record = QuantileRecord(self.n_targets, self.n_classes, float(self.min_samples_leaf), *padded)
        # consts: J classes, the parent's score, then 2 * n_classes scratch slots
        return CompiledCriterion(record, 0, self.min_samples_leaf, n_consts=self.n_targets + 1 + 2 * self.n_classes)


#: Parameter record of :class:`QuantileCriterion` in the compiled kernels.
QuantileRecord = namedtuple("QuantileRecord", ["n_bins", "n_classes", "min_samples_leaf"]
                            + [f"tau{i}" for i in range(MAX_SPLIT_LEVELS)])


@compiled_only
def _level(p, i):
    # the i-th level of the record (scalar fields; see MAX_SPLIT_LEVELS)
    if i == 0:
        return p.tau0
    if i == 1:
        return p.tau1
    if i == 2:
        return p.tau2
    if i == 3:
        return p.tau3
    if i == 4:
        return p.tau4
    if i == 5:
        return p.tau5
    if i == 6:
        return p.tau6
    return p.tau7


@compiled_only
def _class_sums_score(p, st, consts, scratch):
    # sum_c S_c^2 / W of one channel-sum row under the node's relabelling (consts[:J]).
    for c in range(p.n_classes):
        consts[scratch + c] = 0.0
    for j in range(p.n_bins):
        c = int(consts[j])
        consts[scratch + c] += st[1 + j]
    w = st[0]
    s = 0.0
    if w > 0:
        for c in range(p.n_classes):
            s += consts[scratch + c] * consts[scratch + c] / w
    return s


def quantile_prepare(p, parent, consts):
    """Node constants: ``consts[:J]`` each outcome bin's class, ``consts[J]`` the parent's score."""
    J = p.n_bins
    total = parent[0]
    for j in range(J):
        consts[j] = 0.0
    for level in range(p.n_classes - 1):
        tau = _level(p, level)
        cum = 0.0
        first = J
        for j in range(J):
            cum += parent[1 + j]
            if cum >= tau * total:
                first = j
                break
        for j in range(first + 1, J):
            consts[j] += 1.0
    consts[J] = _class_sums_score(p, parent, consts, J + 1)


def quantile_gains(p, lefts, rights, consts, out, row, n):
    """:meth:`QuantileCriterion.gain` of ``n`` candidates of one node into ``out[row, :n]``."""
    c = lefts.shape[1] - 1
    for i in range(n):
        wl = lefts[i, 0]
        wr = rights[i, 0]
        g = -np.inf
        if wl > 0 and wr > 0 and lefts[i, c] >= p.min_samples_leaf and rights[i, c] >= p.min_samples_leaf:
            g = (_class_sums_score(p, lefts[i], consts, p.n_bins + 1)
                 + _class_sums_score(p, rights[i], consts, p.n_bins + 1 + p.n_classes) - consts[p.n_bins])
        out[row, i] = g


def quantile_bin_key(p, stats, i, consts):
    """Category sort key: the category's mean relabelled class."""
    w = stats[i, 0]
    key = 0.0
    if w > 0:
        for j in range(p.n_bins):
            key += consts[j] * stats[i, 1 + j]
        key /= w
    return key


register(QuantileRecord, prepare=quantile_prepare, gains=quantile_gains, bin_key=quantile_bin_key)

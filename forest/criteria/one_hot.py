"""The probability forest's split criterion: the Gini decrease on one-hot channels with unit weights.

This module owns :class:`OneHotCriterion`, what :class:`forest.estimators.probability_forest.ProbabilityForest`
grows on when every row weighs exactly 1. It is :class:`forest.criteria.basic.VarianceCriterion`
with ``rows_are_weights=True`` on the standardised one-hot targets (whose gain is the
weighted Gini decrease, see the probability forest's module docstring), with two changes
that only make it cheaper:

One channel fewer
    A row's standardised one-hot values sum to the same number ``row_total`` for every
    class (``1 - K / 2`` for the ``+-0.5`` coding the probability forest uses), so the
    last class's sum is implied: ``S_{K-1} = row_total * W - sum_{k < K-1} S_k``. The
    channels are ``[w, w y_0 .. w y_{K-2}]`` (``K`` instead of ``K + 1``) and every piece
    rebuilds ``S_{K-1}``. With unit weights and the ``+-0.5`` coding every sum is a multiple
    of 0.5 of magnitude at most the row count, so the rebuilt sum is *exactly* the summed
    one (no rounding while the counts stay below 2**50): node values, categorical keys and
    size limits are bit for bit those of the variance criterion.
One division per side
    The variance criterion scores a side as ``sum_k S_k**2 / W`` (``K`` divisions per side
    and candidate: most of the subtree kernel's gain time, which was a fifth of a fit).
    Here it is ``(sum_k S_k**2) / W``: the squares of such sums are multiples of 0.25
    below 2**53, so their sum is exact and the score is the correctly rounded true value
    (the variance criterion's is ``K`` roundings from it). Gains differ from the variance
    criterion's in the last bits only; a split changes only where two candidates' gains
    are that close and the tie rule's tolerance (:data:`forest.engine.splitting.REL_TOL`,
    1e-12 relative) does not already call them equal. Measured on the issue 34 benchmark
    (benchmarks/RESULTS.md, "ProbabilityForest (issue 34)").

Only exact with unit weights (the probability forest uses the variance criterion with a
count channel otherwise); the vectorised methods take any sums and compute what the
compiled pieces compute, in the same order.
"""
from collections import namedtuple

import numpy as np

from forest.criteria.basic import VarianceCriterion
from forest.criteria.compiled import CompiledCriterion, register
from histogram.jit import compiled_only


class OneHotCriterion(VarianceCriterion):
    """Gini decrease of unit-weight one-hot targets on ``K`` channels (module docstring).

    Channels: ``[w, w*y_0 .. w*y_{K-2}]``; the last class's sum is
    ``row_total * w - sum_k w*y_k`` (every row's targets sum to ``row_total``). The weight
    channel counts the rows (unit weights), so size limits read it, as
    ``VarianceCriterion(rows_are_weights=True)``.

    Parameters
    ----------
    n_classes : int
        ``K >= 2``, the targets (one-hot columns).
    row_total : float
        What every row's ``K`` targets sum to.
    min_samples_leaf, min_weight_leaf, alpha, imbalance_penalty
        As in :class:`forest.criteria.basic.VarianceCriterion`.
    """

    def __init__(self, n_classes, row_total, min_samples_leaf=1, min_weight_leaf=0.0, alpha=0.0,
                 imbalance_penalty=0.0):
        if n_classes < 2:
            raise ValueError(f"n_classes must be >= 2, got {n_classes}")
        super().__init__(n_classes, min_samples_leaf=min_samples_leaf, min_weight_leaf=min_weight_leaf,
                         alpha=alpha, imbalance_penalty=imbalance_penalty, rows_are_weights=True)
        self.row_total = float(row_total)
        self.n_channels = self.n_targets        # the weight and K - 1 class sums

    def make_channels(self, y, sample_weight=None):
        """Build the ``(n, K)`` channel array from all ``K`` targets (the last is dropped).

        Parameters
        ----------
        y : array-like, shape (n, n_classes)
            Each row summing to ``row_total``.
        sample_weight : array-like, shape (n,), optional
            All ones (the criterion is for unit weights).
        """
        y, w = self._targets_and_weight(y, sample_weight)
        out = np.empty((len(y), self.n_channels), dtype=np.float64)
        out[:, 0] = w
        out[:, 1:] = w[:, None] * y[:, :-1]
        return out

    def class_sums(self, stats):
        """All ``K`` class sums ``(..., K)`` from channel sums ``(..., K)`` (the last one rebuilt)."""
        stats = self._check_stats(stats)
        out = np.empty(stats.shape[:-1] + (self.n_targets,))
        out[..., :-1] = stats[..., 1:]
        last = self.row_total * stats[..., 0]
        for k in range(1, self.n_channels):
            last = last - stats[..., k]
        out[..., -1] = last
        return out

    def _score(self, stats):
        # (sum_k S_k**2) / W, the squares summed in class order as the compiled piece does
        s = self.class_sums(stats)
        w = stats[..., 0]
        sq = np.zeros(w.shape)
        for k in range(self.n_targets):
            sq = sq + s[..., k] * s[..., k]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(w > 0, sq / np.where(w > 0, w, 1.0), 0.0)

    def node_value(self, stats):
        s = self.class_sums(stats)
        w = np.asarray(stats, dtype=np.float64)[..., 0:1]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(w > 0, s / np.where(w > 0, w, 1.0), 0.0)

    def node_objective(self, stats):
        # The variance criterion's -sum_k S_k**2 / W (the trees' stored impurity), unchanged.
        s = self.class_sums(stats)
        w = np.asarray(stats, dtype=np.float64)[..., 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(w[..., None] > 0, s * s / np.where(w > 0, w, 1.0)[..., None], 0.0)
        return -q.sum(axis=-1)

    def compiled(self):
        """Compiled pieces for the growth kernels (:class:`forest.criteria.compiled.CompiledCriterion`)."""
        record = OneHotRecord(self.n_targets, self.row_total, float(self.min_samples_leaf), self.min_weight_leaf,
                              self.alpha, self.imbalance_penalty)
        return CompiledCriterion(record, 0, self.min_samples_leaf, n_consts=2, size_channel=0)


# ---------------------------------------------------------------------- compiled pieces
#: Parameter record of :class:`OneHotCriterion` in the compiled kernels.
OneHotRecord = namedtuple("OneHotRecord", ["n_classes", "row_total", "min_samples_leaf", "min_weight_leaf", "alpha",
                                           "imbalance_penalty"])


@compiled_only
def _one_hot_sq(st, i, n_classes, row_total):
    """``sum_k S_k**2`` of row ``i`` of ``st (.., K)``, the last class rebuilt."""
    w = st[i, 0]
    last = row_total * w
    sq = 0.0
    for k in range(1, n_classes):
        s = st[i, k]
        last -= s
        sq += s * s
    return sq + last * last


def one_hot_prepare(p, parent, consts):
    """``consts[0]`` = the parent's score, ``consts[1]`` = the fewest rows a child needs."""
    w = parent[0]
    last = p.row_total * w
    sq = 0.0
    for k in range(1, p.n_classes):
        last -= parent[k]
        sq += parent[k] * parent[k]
    consts[0] = (sq + last * last) / w if w > 0 else 0.0
    consts[1] = max(p.min_samples_leaf, np.ceil(p.alpha * w))


def one_hot_gains_rows(p, lefts, rights, consts, out, row, n):
    """Scalar :meth:`OneHotCriterion.gain` of ``n`` candidates of one node into ``out[row, :n]``
    (the variance criterion's constraints; one division per side)."""
    for i in range(n):
        wl = lefts[i, 0]
        wr = rights[i, 0]
        ok = ((wl > 0) & (wr > 0) & (wl >= p.min_weight_leaf) & (wr >= p.min_weight_leaf)
              & (wl >= consts[1]) & (wr >= consts[1]))
        g = -np.inf
        if ok:
            g = _one_hot_sq(lefts, i, p.n_classes, p.row_total) / wl \
                + _one_hot_sq(rights, i, p.n_classes, p.row_total) / wr - consts[0]
            if p.imbalance_penalty > 0:
                g -= p.imbalance_penalty * (1.0 / wl + 1.0 / wr)
        out[row, i] = g


def one_hot_bin_key(p, stats, i, consts):
    """The variance criterion's category key, ``sum_k S_k / W`` over all ``K`` classes (the
    last rebuilt, exactly, so the same bits)."""
    w = stats[i, 0]
    key = 0.0
    if w > 0:
        last = p.row_total * w
        for k in range(1, p.n_classes):
            last -= stats[i, k]
            key += stats[i, k] / w
        key += last / w
    return key


register(OneHotRecord, prepare=one_hot_prepare, gains=one_hot_gains_rows, bin_key=one_hot_bin_key)

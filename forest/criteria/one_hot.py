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

Rows by class, not by channels
    A unit-weight row of class ``j`` carries one of ``K`` fixed channel vectors (``1``,
    then ``hot`` in class ``j``'s channel and ``cold`` in the others, with
    ``cold = (row_total - 1) / K`` and ``hot = cold + 1``: the one-hot coding shifted by
    a common number). A side of ``n`` rows with ``cnt_j`` of class ``j`` has the class sums
    ``S_j = cnt_j + n * cold`` (the last class's too), so
    ``sum_j S_j**2 = q2 + n**2 (2 cold + K cold**2)`` with ``q2 = sum_j cnt_j**2``: the
    row-class pieces of :mod:`forest.criteria.compiled` (``n_row_classes``, ``row_class``,
    ``class_sums``, ``class_side``, ``class_gains``) let the subtree kernel's scan count rows
    per class and score a candidate from ``(n, sum_j S_j**2)`` (integers times 0.25).
    Where ``cold`` is a multiple of 0.5 (the ``+-0.5`` coding) and the rows few enough,
    that is the exact value the channel pieces compute, so gains, sums and trees are
    unchanged bit for bit; otherwise (``n_row_classes`` 0, or a row that is not such a
    vector) the kernel adds channels as before.

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
                              self.alpha, self.imbalance_penalty, *_class_constants(self.n_targets, self.row_total))
        return CompiledCriterion(record, 0, self.min_samples_leaf, n_consts=2, size_channel=0)


# ---------------------------------------------------------------------- compiled pieces
#: Parameter record of :class:`OneHotCriterion` in the compiled kernels.
#: ``hot`` / ``cold``: a class row's value in its own / another class's channel; ``class_coef``
#: the integer ``8 cold + 4 K cold**2`` (``4 sum_j S_j**2 = 4 q2 + class_coef n**2``);
#: ``class_bound``: a subtree of ``n`` rows takes the class scan where
#: ``n**2 * class_bound < 2**52`` (0: never, the coding's sums are not exact).
OneHotRecord = namedtuple("OneHotRecord", ["n_classes", "row_total", "min_samples_leaf", "min_weight_leaf", "alpha",
                                           "imbalance_penalty", "hot", "cold", "class_coef", "class_bound"])


def _class_constants(n_classes, row_total):
    """``(hot, cold, class_coef, class_bound)`` of :data:`OneHotRecord` for ``K`` classes.

    Exact where ``cold`` (hence ``hot``) is a multiple of 0.5: every class sum is then a
    multiple of 0.5, its square of 0.25, and ``class_bound`` keeps both the integer
    ``4 q2 + class_coef n**2`` and the channel pieces' float sum of squares (``K`` squares
    of at most ``(n max|x|)**2``, in quarters) below 2**52.
    """
    cold = (float(row_total) - 1.0) / n_classes
    hot = cold + 1.0
    if not (np.isfinite(cold) and 2.0 * cold == np.round(2.0 * cold) and abs(cold) <= 2.0 ** 10):
        return hot, cold, 0, 0.0
    coef = int(round(8.0 * cold + 4.0 * n_classes * cold * cold))
    big = max(abs(hot), abs(cold))
    return hot, cold, coef, float(max(4 + abs(coef), 4.0 * n_classes * big * big))


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


def one_hot_n_row_classes(p, n):
    """``K`` row classes for subtrees of up to ``n`` rows where their sums are exact, else 0."""
    nn = np.float64(n) * np.float64(n)
    if p.class_bound > 0 and nn * p.class_bound < 2.0 ** 52:
        return p.n_classes
    return 0


def one_hot_row_class(p, ch, i):
    """The class ``j`` whose channel vector (weight 1, ``hot`` in channel ``1 + j``, ``cold``
    elsewhere; the last class all ``cold``) row ``i`` of ``ch`` is, or -1 if none."""
    if ch[i, 0] != 1.0:
        return -1
    j = p.n_classes - 1
    for k in range(1, p.n_classes):
        v = ch[i, k]
        if v == p.hot and j == p.n_classes - 1:
            j = k - 1
        elif v != p.cold:
            return -1
    return j


def one_hot_class_sums(p, cnt, n, out):
    """Channel sums of ``n`` rows, ``cnt[j]`` of class ``j``: ``n``, then
    ``cnt_j * hot + (n - cnt_j) * cold`` (exact, so the bits of adding the rows' channels;
    summed from ``+0.0`` so an empty or balanced sum is ``+0.0`` as there)."""
    out[0] = np.float64(n)
    for k in range(1, p.n_classes):
        a = cnt[k - 1]
        s = 0.0
        s += a * p.hot
        s += (n - a) * p.cold
        out[k] = s


def one_hot_class_side(p, q2, n):
    """``sum_j S_j**2`` of a side of ``n`` rows with ``q2 = sum_j cnt_j**2``: the integer
    ``4 q2 + class_coef n**2`` (below 2**52, :func:`one_hot_n_row_classes`) times 0.25, exact."""
    return np.float64(4 * q2 + p.class_coef * n * n) * 0.25


def one_hot_class_gains(p, st, consts, out, row, n):
    """:func:`one_hot_gains_rows` from the sides' rows and ``sum_j S_j**2`` (``st`` rows 0-3):
    the same expression on the same (exact) squares, so the same bits. Branch-free (every
    candidate's gain is computed, ``-inf`` replaces it where a constraint fails) and compiled
    with NumPy's error model (:mod:`forest.criteria.compiled`), so LLVM vectorises the
    divisions; a kept candidate has both sides' rows > 0, so no division by zero is kept."""
    c0 = consts[0]
    c1 = consts[1]
    mw = p.min_weight_leaf
    pen = p.imbalance_penalty
    o = out[row]
    wls = st[0]
    sls = st[1]
    wrs = st[2]
    srs = st[3]
    if pen > 0:
        for i in range(n):
            wl = wls[i]
            wr = wrs[i]
            ok = (wl > 0) & (wr > 0) & (wl >= mw) & (wr >= mw) & (wl >= c1) & (wr >= c1)
            g = sls[i] / wl + srs[i] / wr - c0
            g -= pen * (1.0 / wl + 1.0 / wr)
            o[i] = g if ok else -np.inf
    else:
        for i in range(n):
            wl = wls[i]
            wr = wrs[i]
            ok = (wl > 0) & (wr > 0) & (wl >= mw) & (wr >= mw) & (wl >= c1) & (wr >= c1)
            g = sls[i] / wl + srs[i] / wr - c0
            o[i] = g if ok else -np.inf


register(OneHotRecord, prepare=one_hot_prepare, gains=one_hot_gains_rows, bin_key=one_hot_bin_key,
         n_row_classes=one_hot_n_row_classes, row_class=one_hot_row_class, class_sums=one_hot_class_sums,
         class_side=one_hot_class_side, class_gains=one_hot_class_gains)

"""The causal-forest (GRF) splitting criterion, evaluated exactly from histograms.

This module owns the channel layout of the causal forest (:class:`CausalChannels`) and
the split criterion (:class:`CausalCriterion`), plus slow per-row NumPy references
(:func:`pseudo_outcomes_reference`, :func:`split_gain_reference`) that tests compare
the histogram version against.

GRF's gradient criterion
------------------------
At a node ``P`` (rows of the tree's split half, weights ``g``) with centered treatment
``W~`` (K-vector) and outcome ``Y~`` (M-vector), let ``wbar, ybar`` be the weighted
means, ``M_P = sum g (W~-wbar)(W~-wbar)^T``, ``tau_P = M_P^{-1} sum g (W~-wbar)(Y~-ybar)^T``
(K x M). GRF relabels each row with the pseudo-outcome

    rho_i = A^{-1} (W~_i - wbar) ((Y~_i - ybar) - tau_P^T (W~_i - wbar))^T      (K x M)

where ``A = I`` for a single treatment (GRF's ``causal_forest``) and ``A = M_P / sum g``
for ``K > 1`` (GRF's multi-arm forest), and scores a split by
``|sum_L g rho|^2 / sum_L g + |sum_R g rho|^2 / sum_R g`` (the parent's ``sum g rho``
is zero by construction of ``tau_P``, so this is already the improvement).

Why channels suffice
--------------------
``rho`` is bilinear in ``(W~, Y~)`` with node constants, so for any child ``L``

    sum_L g (W~-wbar)(Y~-ybar)^T = S_wy - S_w ybar^T - wbar S_y^T + S_g wbar ybar^T
    sum_L g (W~-wbar)(W~-wbar)^T = S_ww - S_w wbar^T - wbar S_w^T + S_g wbar wbar^T
    sum_L g rho = A^{-1} (first - second tau_P)

with ``S_*`` the child's sums of the node-independent per-row channels
``g, g W~, g Y~, g W~ Y~^T, g W~ W~^T``. Per-bin histograms of these channels give
every candidate split of every node exactly (up to rounding), and the parent's own
``wbar, ybar, tau_P`` come from the parent's channel sums; subtraction still works.

Constraints (GRF's, in histogram form)
--------------------------------------
* each child has at least ``min_samples_leaf`` rows *of every arm* (control included)
  for a categorical treatment. GRF counts rows on each side of the parent's mean
  centered treatment, which is node dependent and not available from per-bin sums;
  raw arm counts are the histogram-computable version (for a binary treatment with
  constant propensity they coincide). For a continuous treatment the proxy is the
  count of rows with ``W~_k > 0`` and with ``W~_k <= 0``, for each component ``k``;
* ``alpha``: each child's treatment spread ``S_ww,kk - S_w,k^2 / S_g`` is at least
  ``alpha`` times the parent's, for each component ``k``;
* ``imbalance_penalty``: the score loses ``penalty * sum_k (1/size_L,k + 1/size_R,k)``
  (for ``K = 1`` exactly GRF's penalty); with a penalty, a child of zero spread fails.

These are grf's "stabilized" splits (``stabilize.splits = TRUE``, whether the treatment is
taken into account when judging a split's balance). The ``"rows"`` constraint is grf's
``stabilize.splits = FALSE``, where grf scores the same pseudo-outcomes with its regression
rule: each child needs ``max(min_samples_leaf, ceil(alpha * rows of the node))`` rows, any
treatment, no spread floor, and the penalty is ``penalty * (1/n_L + 1/n_R)`` in rows. A
child may then hold fewer treated (or control) rows than ``min_samples_leaf``, or none;
trees grow deeper where one arm is rare.

Leaf values
-----------
``node_value`` returns the leaf's moments divided by its row count
``(g, gW~, gY~, gW~Y~^T, gW~W~^T)/n`` followed by ``n`` itself. The forest averages
these per tree and solves ``theta(x) = A(x)^{-1} b(x)`` (see :mod:`forest.analysis.inference`),
which equals GRF's estimate with its forest weights.
"""
import functools
from collections import namedtuple

import numpy as np
from numba import vectorize

from histogram.jit import kernel, compiled_only, empty, zeros
from forest._validation import as_columns

from forest.criteria.compiled import CompiledCriterion, register
from forest.criteria.basic import Criterion

#: Constraint kinds: raw arm counts (categorical), sign of the centered treatment, or
#: rows only (``stabilize_splits=False``: grf's regression rule on the pseudo-outcomes).
CONSTRAINTS = ("arms", "sign", "rows")


class CausalChannels:
    """Channel layout for ``K`` treatments and ``M`` outcomes.

    Channel order (``C = n_moments + 1 + K``)::

        0                 g
        1 .. K            g W~_k
        next M            g Y~_m
        next K*M          g W~_k Y~_m          (k-major: index k*M + m)
        next K(K+1)/2     g W~_i W~_j, i <= j   (upper triangle, row-major)
        next 1            1 (row count; absent with rows_are_weights)
        next K            constraint counts: 1[arm == k+1] ("arms") or 1[W~_k > 0] ("sign")

    Parameters
    ----------
    n_treatments : int
        ``K``.
    n_outcomes : int
        ``M``.
    rows_are_weights : bool, default False
        Every row weighs exactly 1 (a fit without weights, or with equal ones), so
        channel ``g`` counts the rows: no count channel is built and ``i_count`` is
        ``i_g``. The same sums with one channel fewer in every histogram and scan.
    """

    def __init__(self, n_treatments=1, n_outcomes=1, rows_are_weights=False):
        k, m = int(n_treatments), int(n_outcomes)
        if k < 1 or m < 1:
            raise ValueError(f"need n_treatments >= 1 and n_outcomes >= 1, got {k}, {m}")
        self.K, self.M = k, m
        self.n_tri = k * (k + 1) // 2
        self.i_g = 0
        self.s_w = slice(1, 1 + k)
        self.s_y = slice(1 + k, 1 + k + m)
        self.s_wy = slice(1 + k + m, 1 + k + m + k * m)
        self.s_ww = slice(self.s_wy.stop, self.s_wy.stop + self.n_tri)
        self.n_moments = self.s_ww.stop
        self.rows_are_weights = bool(rows_are_weights)
        self.i_count = self.i_g if self.rows_are_weights else self.n_moments
        arm0 = self.n_moments + (0 if self.rows_are_weights else 1)
        self.s_arm = slice(arm0, arm0 + k)
        self.n_channels = self.s_arm.stop
        iu, ju = np.triu_indices(k)
        full = np.empty((k, k), dtype=np.int64)
        full[iu, ju] = np.arange(self.n_tri)
        full[ju, iu] = np.arange(self.n_tri)
        self._tri_to_full = full
        self._iu, self._ju = iu, ju

    def make(self, w_centered, y_centered, sample_weight, indicator):
        """Per-row channels.

        Parameters
        ----------
        w_centered : ndarray, shape (n, K)
            ``W - e(X)``.
        y_centered : ndarray, shape (n, M)
            ``Y - m(X)``.
        sample_weight : ndarray, shape (n,)
        indicator : ndarray, shape (n, K)
            Constraint indicators (arm membership, or ``W~ > 0``), 0/1.

        Returns
        -------
        ndarray of float64, shape (n, C), C-contiguous
        """
        w = as_columns(w_centered)
        y = as_columns(y_centered)
        g = np.asarray(sample_weight, dtype=np.float64)
        ind = as_columns(indicator)
        n = w.shape[0]
        if w.shape[1] != self.K or y.shape[1] != self.M or ind.shape[1] != self.K:
            raise ValueError(f"channel inputs disagree with K={self.K}, M={self.M}: "
                             f"w {w.shape}, y {y.shape}, indicator {ind.shape}")
        if y.shape[0] != n or g.shape != (n,) or ind.shape[0] != n:
            raise ValueError("channel inputs must have the same number of rows")
        out = np.empty((n, self.n_channels), dtype=np.float64)
        gw = g[:, None] * w
        out[:, 0] = g
        out[:, self.s_w] = gw
        out[:, self.s_y] = g[:, None] * y
        out[:, self.s_wy] = (gw[:, :, None] * y[:, None, :]).reshape(n, self.K * self.M)
        out[:, self.s_ww] = gw[:, self._iu] * w[:, self._ju]
        if not self.rows_are_weights:
            out[:, self.i_count] = 1.0
        out[:, self.s_arm] = ind
        return out

    #: The instrument of the local estimating equation is the treatment itself, so
    #: its Jacobian ``g ww - w w^T`` is positive semi-definite (:mod:`forest.analysis.inference`).
    has_instrument = False

    def equation_moments(self, stats):
        """``g, z, w, y, zy, zw`` of the estimating equation (:mod:`forest.analysis.inference`): ``z = w``."""
        g, w, y, wy, ww = self.moments(stats)
        return g, w, w, y, wy, ww

    def moments(self, stats):
        """Split a moment vector (channels or averaged moments) into its parts.

        Parameters
        ----------
        stats : ndarray, shape (..., >= n_moments)

        Returns
        -------
        tuple
            ``g (...)``, ``w (..., K)``, ``y (..., M)``, ``wy (..., K, M)``,
            ``ww (..., K, K)`` (symmetric).
        """
        lead = stats.shape[:-1]
        g = stats[..., self.i_g]
        w = stats[..., self.s_w]
        y = stats[..., self.s_y]
        wy = stats[..., self.s_wy].reshape(lead + (self.K, self.M))
        ww = stats[..., self.s_ww][..., self._tri_to_full]
        return g, w, y, wy, ww


@compiled_only
def _gain_scalar_core(gl, wl, yl, wyl, wwl, nl, al, gr, wr, yr, wyr, wwr, nr, ar, wb, yb, tau, floor, valid, m,
                      pen):
    """Fused ``K = M = 1`` gain of one candidate (no temporaries); see ``CausalCriterion.gain``.

    For one treatment column the two constraint kinds coincide: ``a >= m`` and
    ``n - a >= m`` on each side, ``a`` the arm-1 (or positive-sign) count. Shared by
    the vectorised ufunc below and the exact small-node grower (:func:`causal_gains`).
    """
    # Combined tests and one return: Numba compiled the early-return form ~50x
    # slower (measured), and the exact small-node grower calls this per candidate.
    out = -np.inf
    ok = (valid != 0.0) & (gl > 0.0) & (gr > 0.0)
    ok = ok & (nl >= m) & (nr >= m) & (al >= m) & (ar >= m) & (nl - al >= m) & (nr - ar >= m)
    if ok:
        size_l = wwl - wl * wl / gl
        size_r = wwr - wr * wr / gr
        ok2 = (size_l >= floor) & (size_r >= floor)
        if pen > 0.0:
            ok2 = ok2 & (size_l > 0.0) & (size_r > 0.0)
        if ok2:
            score = _scalar_score(gl, wl, yl, wyl, wwl, gr, wr, yr, wyr, wwr, wb, yb, tau)
            if pen > 0.0:
                score -= pen * (1.0 / size_l + 1.0 / size_r)
            out = score
    return out


@compiled_only
def _scalar_score(gl, wl, yl, wyl, wwl, gr, wr, yr, wyr, wwr, wb, yb, tau):
    """``(sum_L g rho)^2 / sum_L g + (sum_R g rho)^2 / sum_R g`` for ``K = M = 1`` (both sides weighted)."""
    sl = wyl - yb * wl - wb * yl + wb * yb * gl - tau * (wwl - 2.0 * wb * wl + wb * wb * gl)
    sr = wyr - yb * wr - wb * yr + wb * yb * gr - tau * (wwr - 2.0 * wb * wr + wb * wb * gr)
    return sl * sl / gl + sr * sr / gr


@compiled_only
def _gain_scalar_rows_core(gl, wl, yl, wyl, wwl, nl, gr, wr, yr, wyr, wwr, nr, wb, yb, tau, valid, least, pen):
    """The ``K = M = 1`` gain under the ``"rows"`` constraint (``stabilize_splits=False``).

    grf's regression-style rule on the pseudo-outcomes: each child needs ``least`` rows
    (``max(min_samples_leaf, ceil(alpha * rows of the node))``, from ``prepare``),
    whatever its treatment; the penalty is ``pen * (1/n_L + 1/n_R)`` in rows.
    """
    out = -np.inf
    if (valid != 0.0) & (gl > 0.0) & (gr > 0.0) & (nl >= least) & (nr >= least):
        score = _scalar_score(gl, wl, yl, wyl, wwl, gr, wr, yr, wyr, wwr, wb, yb, tau)
        if pen > 0.0:
            score -= pen * (1.0 / nl + 1.0 / nr)
        out = score
    return out


_GAIN_SCALAR_SIGNATURE = "float64(" + ", ".join(["float64"] * 21) + ")"


def _gain_scalar_elementwise(gl, wl, yl, wyl, wwl, nl, al, gr, wr, yr, wyr, wwr, nr, ar, wb, yb, tau, floor, valid, m,
                             pen):
    """One element of :func:`_gain_scalar_ufunc` (plain Python until vectorised there)."""
    return _gain_scalar_core(gl, wl, yl, wyl, wwl, nl, al, gr, wr, yr, wyr, wwr, nr, ar, wb, yb, tau, floor, valid,
                             m, pen)


@functools.cache
def _gain_scalar_ufunc():
    """Vectorised :func:`_gain_scalar_core` (the NumPy split search's ``K = M = 1`` path), built on first use.

    Built lazily because Numba builds a ufunc's wrapper anew in every process even
    with ``cache=True`` (about 0.1 s), and this module is imported by every process
    that loads a growth kernel from the cache (the kernels' cache index names this
    module's records), most of which never call the NumPy gain.
    """
    return vectorize([_GAIN_SCALAR_SIGNATURE], cache=True)(_gain_scalar_elementwise)


# ---------------------------------------------------------------------- compiled pieces
# CausalCriterion.gain per candidate for the compiled growth kernels
# (forest.criteria.compiled): two records, so that a binary forest's kernels never
# compile the general code (LAPACK calls) and a multi-arm one never the scalar code.

#: Record of the fused ``K = M = 1`` case (no preconditioning): the indicator channel
#: ``arm``, the row-count channel ``i_count`` (``g``'s without weights) and the constraints.
CausalScalarRecord = namedtuple("CausalScalarRecord", ["arm", "i_count", "min_samples_leaf", "alpha",
                                                       "imbalance_penalty"])

#: Record of the general case: ``K`` treatment columns, ``M`` outcomes, the first
#: channel of ``g W~W~^T`` (``ww0``), the count channel, the first constraint
#: channel (``arm0``), the constraints, ``sign`` (True: "sign" counts, False: "arms")
#: and ``precondition``.
CausalRecord = namedtuple("CausalRecord", ["K", "M", "ww0", "i_count", "arm0", "min_samples_leaf", "alpha",
                                           "imbalance_penalty", "sign", "precondition"])


@compiled_only    # the registry compiles the function itself; the "rows" records' prepare calls it compiled
def causal_prepare(p, parent, consts):
    """Node constants of the ``K = M = 1`` gain, as ``_parent_terms`` computes them.

    ``consts[:5]`` becomes ``wbar, ybar, tau_P, alpha * spread_P, valid_P``.
    """
    g = parent[0]
    w = parent[1]
    y = parent[2]
    wy = parent[3]
    ww = parent[4]
    wbar = w / g if g > 0 else 0.0
    ybar = y / g if g > 0 else 0.0
    mp = ww - w * wbar
    cp = wy - w * ybar
    scale = max(ww, 1e-300)
    valid = g > 0 and mp > 1e-12 * scale
    consts[0] = wbar
    consts[1] = ybar
    consts[2] = cp / (mp if valid else 1.0)
    consts[3] = p.alpha * mp
    consts[4] = 1.0 if valid else 0.0


def _scalar_gains_piece(p, lefts, rights, consts, out, row, n):
    # One call per (node, feature); inside, the loop calls the scalar core with scalars
    # only, so no per-candidate array view updates reference counts (measured ~7% of the
    # subtree kernel in atomic increments/decrements when it did).
    m_leaf = p.min_samples_leaf
    pen = p.imbalance_penalty
    wb = consts[0]
    yb = consts[1]
    tau = consts[2]
    floor = consts[3]
    valid = consts[4]
    c = p.i_count
    a = p.arm
    for i in range(n):
        out[row, i] = _gain_scalar_core(lefts[i, 0], lefts[i, 1], lefts[i, 2], lefts[i, 3], lefts[i, 4],
                                        lefts[i, c], lefts[i, a], rights[i, 0], rights[i, 1], rights[i, 2],
                                        rights[i, 3], rights[i, 4], rights[i, c], rights[i, a], wb, yb, tau,
                                        floor, valid, m_leaf, pen)


def _scalar_sides_ok(p, n_l, n_r, cum, miss, with_miss, parent):
    # Exactly the count tests of _gain_scalar_core (integer-valued sums): a candidate
    # failing here would score -inf.
    m = p.min_samples_leaf
    arm_l = cum[p.arm]
    if with_miss:
        arm_l += miss[p.arm]
    arm_r = parent[p.arm] - arm_l
    return arm_l >= m and n_l - arm_l >= m and arm_r >= m and n_r - arm_r >= m


def _scalar_right_exhausted(p, n_r, cum, parent):
    arm_r = parent[p.arm] - cum[p.arm]
    return arm_r < p.min_samples_leaf or n_r - arm_r < p.min_samples_leaf


def _scalar_bin_key(p, stats, i, consts):
    """Category sort key: the category's mean GRF pseudo-outcome ``sum g rho / sum g`` under the
    node's ``wbar, ybar, tau_P``. The gain is a variance reduction of ``rho``, so sorting by
    its mean scans the subsets a regression on ``rho`` would rank best."""
    g = stats[i, 0]
    if not g > 0:
        return 0.0
    wb = consts[0]
    yb = consts[1]
    tau = consts[2]
    cross = stats[i, 3] - yb * stats[i, 1] - wb * stats[i, 2] + wb * yb * g
    spread = stats[i, 4] - 2.0 * wb * stats[i, 1] + wb * wb * g
    return (cross - tau * spread) / g


register(CausalScalarRecord, prepare=causal_prepare, gains=_scalar_gains_piece, sides_ok=_scalar_sides_ok,
         right_exhausted=_scalar_right_exhausted, bin_key=_scalar_bin_key)


# The "rows" constraint (stabilize_splits=False): records of their own, so the default
# forests' kernels are untouched and these compile only for a forest that asks for them.

#: Record of the ``K = M = 1`` gain under the ``"rows"`` constraint; ``i_count`` is the row-count channel.
CausalScalarRowsRecord = namedtuple("CausalScalarRowsRecord", ["i_count", "min_samples_leaf", "alpha",
                                                               "imbalance_penalty"])

#: Slot of the node constants holding a child's fewest rows under ``"rows"`` (after ``causal_prepare``'s five).
_ROWS_SLOT = 5


@compiled_only
def rows_least(min_samples_leaf, alpha, node_rows):
    """Fewest rows a child needs under ``"rows"``: ``max(min_samples_leaf, ceil(alpha * node_rows))``
    (grf's regression rule, ``alpha`` applied to rows)."""
    return max(min_samples_leaf, np.ceil(alpha * node_rows))


def causal_rows_prepare(p, parent, consts):
    """:func:`causal_prepare`'s constants, then the children's fewest rows (slot 5)."""
    causal_prepare(p, parent, consts)
    consts[_ROWS_SLOT] = rows_least(p.min_samples_leaf, p.alpha, parent[p.i_count])


def _scalar_rows_gains_piece(p, lefts, rights, consts, out, row, n):
    pen = p.imbalance_penalty
    wb = consts[0]
    yb = consts[1]
    tau = consts[2]
    valid = consts[4]
    least = consts[_ROWS_SLOT]
    c = p.i_count
    for i in range(n):
        out[row, i] = _gain_scalar_rows_core(lefts[i, 0], lefts[i, 1], lefts[i, 2], lefts[i, 3], lefts[i, 4],
                                             lefts[i, c], rights[i, 0], rights[i, 1], rights[i, 2], rights[i, 3],
                                             rights[i, 4], rights[i, c], wb, yb, tau, valid, least, pen)


def rows_sides_ok(p, n_l, n_r, cum, miss, with_miss, parent):
    """The row tests of every ``"rows"`` record's gains (``p.i_count``: the count channel)."""
    least = rows_least(p.min_samples_leaf, p.alpha, parent[p.i_count])
    return n_l >= least and n_r >= least


def rows_right_exhausted(p, n_r, cum, parent):
    """A scan's right side only shrinks: below the fewest rows, no later candidate passes."""
    return n_r < rows_least(p.min_samples_leaf, p.alpha, parent[p.i_count])


register(CausalScalarRowsRecord, prepare=causal_rows_prepare, gains=_scalar_rows_gains_piece,
         sides_ok=rows_sides_ok, right_exhausted=rows_right_exhausted, bin_key=_scalar_bin_key)


def _general_offsets(K, M):
    """Offsets in the node constants of the general case: ``floor (K)``, ``valid (1)``, then
    the node's linear map ``P`` (``K*M`` rows, ``n_moments`` columns, row-major).

    Why a matrix: for fixed node constants ``wbar, ybar, tau_P, A^{-1}``, a child's
    ``sum_child g rho`` is *linear* in its moment sums ``s`` (module docstring), so
    ``vec(sum_child g rho) = P s``. ``prepare`` folds the constants into ``P`` once per
    node, and each candidate side costs ``K*M*n_moments`` multiply-adds with no
    scratch writes, instead of the nested bilinear loops that rebuilt the centred
    moments per candidate (that form measured ~23% of a 3-arm fit's CPU). Within one
    ``gains`` call every candidate splits the same total (``lefts + rights``: the node's
    sums, or in a histogram search the feature's own total), so the right side is
    ``q - P s_left`` with ``q = P (s_left + s_right)`` of the first candidate (scratch at
    ``o_q``, computed per call): one product per candidate, not two. The rounding is
    that of ``P s_right`` with ``s_right = total - s_left``, as the growers form it.
    """
    o_floor = 0
    o_valid = o_floor + K
    o_q = o_valid + 1
    o_p = o_q + K * M
    return o_floor, o_valid, o_q, o_p


def _general_consts_size(K, M, n_moments):
    """Node-constant slots: ``P`` has ``n_moments`` (:attr:`CausalChannels.n_moments`) columns."""
    return _general_offsets(K, M)[-1] + K * M * n_moments


_general_offsets_jit = kernel(_general_offsets, inline="always")


@kernel(inline="always")
def _n_moments(p):
    """Moment channels of record ``p``: the ``g W~W~^T`` triangle is the last block (CausalChannels)."""
    return p.ww0 + p.K * (p.K + 1) // 2


@kernel(inline="always")
def _tri(K, i, j):
    """Index of ``g W~_i W~_j`` (``i <= j``) in the upper triangle, row-major."""
    return i * K - (i * (i - 1)) // 2 + (j - i)


@compiled_only    # as causal_prepare
def causal_prepare_general(p, parent, consts):
    """Node constants of the general gain: the parent terms of ``CausalCriterion._parent_terms``
    (``wbar, ybar, tau_P, A^{-1}``) folded into the linear map ``P`` (see :func:`_general_offsets`)."""
    K = p.K
    M = p.M
    o_floor, o_valid, o_q, o_p = _general_offsets_jit(K, M)
    nm = _n_moments(p)
    g = parent[0]
    wbar = empty(K, np.float64)
    ybar = empty(M, np.float64)
    mp = empty((K, K), np.float64)
    cp = empty((K, M), np.float64)
    for k in range(K):
        wbar[k] = parent[1 + k] / g if g > 0 else 0.0
    for m in range(M):
        ybar[m] = parent[1 + K + m] / g if g > 0 else 0.0
    scale = 0.0
    for i in range(K):
        for j in range(K):
            a, b = (i, j) if i <= j else (j, i)
            mp[i, j] = parent[p.ww0 + _tri(K, a, b)] - parent[1 + i] * wbar[j]
        for m in range(M):
            cp[i, m] = parent[1 + K + M + i * M + m] - parent[1 + i] * ybar[m]
        scale += parent[p.ww0 + _tri(K, i, i)]
    scale = max(scale, 1e-300)
    for k in range(K):
        consts[o_floor + k] = p.alpha * mp[k, k]
    tau = empty((K, M), np.float64)
    ainv = zeros((K, K), np.float64)
    if K == 1:
        valid = g > 0 and mp[0, 0] > 1e-12 * scale
        d = mp[0, 0] if valid else 1.0
        for m in range(M):
            tau[0, m] = cp[0, m] / d
        ainv[0, 0] = g / mp[0, 0] if mp[0, 0] > 0 else 0.0
    else:
        eig = np.linalg.eigvalsh(mp)
        valid = g > 0 and eig[0] > 1e-12 * scale
        if not valid:
            mp[:, :] = 0.0
            for k in range(K):
                mp[k, k] = 1.0
        tau = np.linalg.solve(mp, cp)
        ainv = np.linalg.inv(mp) * g
    consts[o_valid] = 1.0 if valid else 0.0
    # U: rows (j, m) of sum_child g (W~-wbar)_j (Y~-ybar - tau^T (W~-wbar))_m as a map of the
    # child's moment sums: cross_jm - sum_l mw_jl tau_lm with
    #   cross_jm = S_wy,jm - ybar_m S_w,j - wbar_j S_y,m + wbar_j ybar_m S_g
    #   mw_jl    = S_ww,jl - wbar_l S_w,j - wbar_j S_w,l + wbar_j wbar_l S_g
    u = zeros((K * M, nm), np.float64)
    for j in range(K):
        for m in range(M):
            r = j * M + m
            u[r, 1 + K + M + j * M + m] += 1.0
            u[r, 1 + K + m] -= wbar[j]
            c_wj = -ybar[m]
            c_g = wbar[j] * ybar[m]
            for l in range(K):
                t = tau[l, m]
                c_wj += wbar[l] * t
                c_g -= wbar[j] * wbar[l] * t
                u[r, 1 + l] += wbar[j] * t
                a, b = (j, l) if j <= l else (l, j)
                u[r, p.ww0 + _tri(K, a, b)] -= t
            u[r, 1 + j] += c_wj
            u[r, 0] += c_g
    for k in range(K):
        for m in range(M):
            base = o_p + (k * M + m) * nm
            for c in range(nm):
                if p.precondition:
                    v = 0.0
                    for j in range(K):
                        v += ainv[k, j] * u[j * M + m, c]
                else:
                    v = u[k * M + m, c]
                consts[base + c] = v


@kernel(inline="always")
def _project_parent(p, lefts, rights, consts, o_q, o_p, nm):
    """``consts[o_q:o_q + K M]``: the node's moments (any candidate's left + right) times the
    projection rows at ``o_p``, once per call of a general gains piece."""
    for r in range(p.K * p.M):
        acc = 0.0
        for c in range(nm):
            acc += consts[o_p + r * nm + c] * (lefts[0, c] + rights[0, c])
        consts[o_q + r] = acc


@kernel(inline="always")
def _general_sides(p, lefts, i, consts, o_q, o_p, nm):
    """``|sum_L g rho|^2`` and ``|sum_R g rho|^2`` of candidate ``i``: ``|P s_L|^2``, ``|q - P s_L|^2``."""
    total_l = 0.0
    total_r = 0.0
    for r in range(p.K * p.M):
        base = o_p + r * nm
        acc = 0.0
        for c in range(nm):
            acc += consts[base + c] * lefts[i, c]
        right = consts[o_q + r] - acc
        total_l += acc * acc
        total_r += right * right
    return total_l, total_r


@compiled_only
def _general_counts_ok(p, s, i):
    m = p.min_samples_leaf
    n = s[i, p.i_count]
    ok = n >= m
    tot = 0.0
    for k in range(p.K):
        a = s[i, p.arm0 + k]
        ok = ok and a >= m
        if p.sign:
            ok = ok and n - a >= m
        tot += a
    if not p.sign:
        ok = ok and n - tot >= m
    return ok


def causal_gains_general(p, lefts, rights, consts, out, row, n):
    """General :meth:`CausalCriterion.gain` of ``n`` candidates of one node into ``out[row, :n]``."""
    K = p.K
    o_floor, o_valid, o_q, o_p = _general_offsets_jit(K, p.M)
    nm = _n_moments(p)
    valid = consts[o_valid] != 0.0
    pen = p.imbalance_penalty
    if n > 0:
        _project_parent(p, lefts, rights, consts, o_q, o_p, nm)
    for i in range(n):
        gl = lefts[i, 0]
        gr = rights[i, 0]
        out[row, i] = -np.inf
        ok = valid and gl > 0 and gr > 0 and _general_counts_ok(p, lefts, i) and _general_counts_ok(p, rights, i)
        if not ok:
            continue
        penalty = 0.0
        for k in range(K):
            d = p.ww0 + _tri(K, k, k)
            size_l = lefts[i, d] - lefts[i, 1 + k] * lefts[i, 1 + k] / gl
            size_r = rights[i, d] - rights[i, 1 + k] * rights[i, 1 + k] / gr
            fl = consts[o_floor + k]
            ok = ok and size_l >= fl and size_r >= fl
            if pen > 0.0:
                ok = ok and size_l > 0.0 and size_r > 0.0
                if ok:
                    penalty += 1.0 / size_l + 1.0 / size_r
        if not ok:
            continue
        side_l, side_r = _general_sides(p, lefts, i, consts, o_q, o_p, nm)
        score = side_l / gl + side_r / gr
        if pen > 0.0:
            score = score - pen * penalty
        out[row, i] = score


def _general_sides_ok(p, n_l, n_r, cum, miss, with_miss, parent):
    # The count tests of CausalCriterion._counts_ok on both children (integer-valued sums).
    m = p.min_samples_leaf
    ok = True
    tot_l = 0.0
    tot_r = 0.0
    for k in range(p.K):
        c = p.arm0 + k
        a_l = cum[c]
        if with_miss:
            a_l += miss[c]
        a_r = parent[c] - a_l
        ok = ok and a_l >= m and a_r >= m
        if p.sign:
            ok = ok and n_l - a_l >= m and n_r - a_r >= m
        tot_l += a_l
        tot_r += a_r
    if not p.sign:
        ok = ok and n_l - tot_l >= m and n_r - tot_r >= m
    return ok


def _general_right_exhausted(p, n_r, cum, parent):
    # Every right-side count (per arm, control or per sign) only shrinks as a scan moves on.
    m = p.min_samples_leaf
    done = False
    tot = 0.0
    for k in range(p.K):
        c = p.arm0 + k
        a_r = parent[c] - cum[c]
        done = done or a_r < m
        if p.sign:
            done = done or n_r - a_r < m
        tot += a_r
    if not p.sign:
        done = done or n_r - tot < m
    return done


def _general_bin_key(p, stats, i, consts):
    """Category sort key: the category's mean pseudo-outcome ``P s / sum g``, its components
    (treatments x outcomes) summed. One order cannot serve several components at once; the
    sum keeps categories that move every arm the same way together (the scan is then a
    heuristic, as LightGBM's for several outputs)."""
    g = stats[i, 0]
    if not g > 0:
        return 0.0
    o_floor, o_valid, o_q, o_p = _general_offsets_jit(p.K, p.M)
    nm = _n_moments(p)
    key = 0.0
    for r in range(p.K * p.M):
        base = o_p + r * nm
        for c in range(nm):
            key += consts[base + c] * stats[i, c]
    return key / g


# The general record keeps its own kernels (shares_kernels=False): paired with it
# (forest.criteria.compiled.shared_specialisation), the subtree kernel ran the nuisance
# forests' variance criterion 3-4x and the K = 2 causal criterion itself 2.8x slower than
# on their own records (3 arms, 50,000 rows, same splits; the scalar records pair at no
# cost), while pairing saves only a compile per machine.
register(CausalRecord, prepare=causal_prepare_general, gains=causal_gains_general, sides_ok=_general_sides_ok,
         right_exhausted=_general_right_exhausted, bin_key=_general_bin_key, shares_kernels=False)

#: Record of the general gain under the ``"rows"`` constraint (fields as :class:`CausalRecord`'s).
CausalRowsRecord = namedtuple("CausalRowsRecord", ["K", "M", "ww0", "i_count", "min_samples_leaf", "alpha",
                                                   "imbalance_penalty", "precondition"])


def causal_rows_prepare_general(p, parent, consts):
    """:func:`causal_prepare_general`'s constants; the first ``floor`` slot (unused under ``"rows"``)
    then holds the children's fewest rows."""
    causal_prepare_general(p, parent, consts)
    consts[0] = rows_least(p.min_samples_leaf, p.alpha, parent[p.i_count])


def causal_rows_gains_general(p, lefts, rights, consts, out, row, n):
    """The general gain of ``n`` candidates under ``"rows"``: :func:`causal_gains_general`'s score with
    each child's rows (not arms, signs or treatment spread) constrained, and the penalty in rows."""
    o_floor, o_valid, o_q, o_p = _general_offsets_jit(p.K, p.M)
    nm = _n_moments(p)
    valid = consts[o_valid] != 0.0
    least = consts[0]
    pen = p.imbalance_penalty
    if n > 0:
        _project_parent(p, lefts, rights, consts, o_q, o_p, nm)
    for i in range(n):
        gl = lefts[i, 0]
        gr = rights[i, 0]
        nl = lefts[i, p.i_count]
        nr = rights[i, p.i_count]
        out[row, i] = -np.inf
        if not (valid and gl > 0 and gr > 0 and nl >= least and nr >= least):
            continue
        side_l, side_r = _general_sides(p, lefts, i, consts, o_q, o_p, nm)
        score = side_l / gl + side_r / gr
        if pen > 0.0:
            score = score - pen * (1.0 / nl + 1.0 / nr)
        out[row, i] = score


register(CausalRowsRecord, prepare=causal_rows_prepare_general, gains=causal_rows_gains_general,
         sides_ok=rows_sides_ok, right_exhausted=rows_right_exhausted, bin_key=_general_bin_key,
         shares_kernels=False)  # as CausalRecord


def _safe_div(num, den):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), 0.0)


class CausalCriterion(Criterion):
    """GRF's causal splitting rule on histogram channel sums (module docstring).

    Parameters
    ----------
    n_treatments : int, default 1
        ``K``: 1 for a binary or scalar continuous treatment, the number of arms
        (besides control) for a categorical one, or the treatment vector's length.
    n_outcomes : int, default 1
        ``M``.
    min_samples_leaf : int, default 5
        Fewest rows per child, and per arm (or per sign of ``W~``) in each child
        (``"rows"``: rows only).
    alpha : float, default 0.05
        Fewest treatment spread per child, as a fraction of the parent's (``"rows"``:
        fewest rows, as a fraction of the parent's rows).
    imbalance_penalty : float, default 0.0
    constraint : {"arms", "sign", "rows"}, default "arms"
        How the per-arm counts are read (see :class:`CausalChannels`); ``"rows"``
        constrains rows only (module docstring: grf's ``stabilize.splits = FALSE``).
    precondition : bool or None, default None
        Multiply pseudo-outcomes by ``A^{-1}``; ``None`` means ``K > 1`` (GRF).
    rows_are_weights : bool, default False
        Every row weighs exactly 1: no count channel (:class:`CausalChannels`).
    """

    def __init__(self, n_treatments=1, n_outcomes=1, min_samples_leaf=5, alpha=0.05,
                 imbalance_penalty=0.0, constraint="arms", precondition=None, rows_are_weights=False):
        if constraint not in CONSTRAINTS:
            raise ValueError(f"constraint must be one of {CONSTRAINTS}, got {constraint!r}")
        if not 0.0 <= alpha < 0.5:
            raise ValueError(f"alpha must be in [0, 0.5), got {alpha}")
        if imbalance_penalty < 0:
            raise ValueError(f"imbalance_penalty must be >= 0, got {imbalance_penalty}")
        self.layout = CausalChannels(n_treatments, n_outcomes, rows_are_weights)
        self.K, self.M = self.layout.K, self.layout.M
        self.n_channels = self.layout.n_channels
        self.n_outputs = self.layout.n_moments + 1
        self.min_samples_leaf = max(int(min_samples_leaf), 1)
        self.alpha = float(alpha)
        self.imbalance_penalty = float(imbalance_penalty)
        self.constraint = constraint
        self.precondition = (self.K > 1) if precondition is None else bool(precondition)

    def make_channels(self, w_centered, y_centered, sample_weight, indicator):
        """See :meth:`CausalChannels.make`."""
        return self.layout.make(w_centered, y_centered, sample_weight, indicator)

    # ------------------------------------------------------------------ parent terms
    def _parent_terms(self, parent):
        """Node constants: ``wbar, ybar, tau_P``, ``A^{-1}``, spreads and validity."""
        L = self.layout
        g, w, y, wy, ww = L.moments(parent)
        wbar = _safe_div(w, g[..., None])
        ybar = _safe_div(y, g[..., None])
        # Centered second moments of the parent: M_P and C_P.
        Mp = ww - w[..., :, None] * wbar[..., None, :]
        Cp = wy - w[..., :, None] * ybar[..., None, :]
        spread = np.diagonal(Mp, axis1=-2, axis2=-1)
        scale = np.maximum(np.diagonal(ww, axis1=-2, axis2=-1).sum(-1), 1e-300)
        if self.K == 1:
            valid = (g > 0) & (Mp[..., 0, 0] > 1e-12 * scale)
            safe = np.where(valid[..., None, None], Mp, 1.0)
            tau = Cp / safe
            a_inv = _safe_div(g, Mp[..., 0, 0])[..., None, None] if self.precondition else None
        else:
            eig = np.linalg.eigvalsh(Mp)
            valid = (g > 0) & (eig[..., 0] > 1e-12 * scale)
            safe = np.where(valid[..., None, None], Mp, np.eye(self.K))
            tau = np.linalg.solve(safe, Cp)
            a_inv = np.linalg.inv(safe) * g[..., None, None] if self.precondition else None
        return wbar, ybar, tau, a_inv, spread, valid

    def _child_sum_rho(self, child, wbar, ybar, tau, a_inv):
        """``sum_child g rho`` (..., K, M) from the child's channel sums."""
        g, w, y, wy, ww = self.layout.moments(child)
        gg = g[..., None, None]
        cross = (wy - w[..., :, None] * ybar[..., None, :] - wbar[..., :, None] * y[..., None, :]
                 + gg * (wbar[..., :, None] * ybar[..., None, :]))
        wc = w - g[..., None] * wbar
        # sum g (W-wbar)(W-wbar)^T = S_ww - S_w wbar^T - wbar S_w^T + S_g wbar wbar^T
        #                          = S_ww - wc wbar^T - wbar S_w^T
        mw = ww - wc[..., :, None] * wbar[..., None, :] - wbar[..., :, None] * w[..., None, :]
        v = cross - mw @ tau
        if a_inv is not None:
            v = a_inv @ v
        return v

    def _score_scalar(self, child, wbar, ybar, tau, a_inv):
        """Fast path for ``K = M = 1``: returns ``(sum g rho)`` (...)."""
        L = self.layout
        g = child[..., 0]
        w = child[..., 1]
        y = child[..., 2]
        wy = child[..., 3]
        ww = child[..., 4]
        wb, yb, t = wbar[..., 0], ybar[..., 0], tau[..., 0, 0]
        s = wy - yb * w - wb * y + wb * yb * g - t * (ww - 2.0 * wb * w + wb * wb * g)
        if a_inv is not None:
            s = s * a_inv[..., 0, 0]
        assert L.n_moments == 5
        return s

    def gain(self, left, right, parent, parent_count=None):
        """Split improvement; ``-inf`` where a constraint fails.

        Parameters
        ----------
        left, right : ndarray, shape (..., C)
        parent : ndarray, broadcastable to ``left``, shape (..., C)
        parent_count : ignored (the count is a channel)

        Returns
        -------
        ndarray of float64, shape (...)
        """
        left = np.asarray(left, dtype=np.float64)
        right = np.asarray(right, dtype=np.float64)
        parent = np.asarray(parent, dtype=np.float64)
        L = self.layout
        wbar, ybar, tau, a_inv, spread_p, valid_p = self._parent_terms(parent)
        if self.K == 1 and self.M == 1 and a_inv is None and self.constraint != "rows":
            l, r = left, right
            c, a = L.i_count, L.s_arm.start
            return _gain_scalar_ufunc()(l[..., 0], l[..., 1], l[..., 2], l[..., 3], l[..., 4], l[..., c], l[..., a],
                                        r[..., 0], r[..., 1], r[..., 2], r[..., 3], r[..., 4], r[..., c], r[..., a],
                                        wbar[..., 0], ybar[..., 0], tau[..., 0, 0], self.alpha * spread_p[..., 0],
                                        valid_p.astype(np.float64), float(self.min_samples_leaf),
                                        self.imbalance_penalty)
        gl, gr = left[..., 0], right[..., 0]
        if self.K == 1 and self.M == 1:
            sl = self._score_scalar(left, wbar, ybar, tau, a_inv)
            sr = self._score_scalar(right, wbar, ybar, tau, a_inv)
            score = _safe_div(sl * sl, gl) + _safe_div(sr * sr, gr)
        else:
            vl = self._child_sum_rho(left, wbar, ybar, tau, a_inv)
            vr = self._child_sum_rho(right, wbar, ybar, tau, a_inv)
            score = _safe_div((vl * vl).sum(axis=(-2, -1)), gl) + _safe_div((vr * vr).sum(axis=(-2, -1)), gr)
        ok = valid_p & (gl > 0) & (gr > 0)
        if self.constraint == "rows":
            nl, nr = left[..., L.i_count], right[..., L.i_count]
            least = np.maximum(float(self.min_samples_leaf), np.ceil(self.alpha * parent[..., L.i_count]))
            ok = ok & (nl >= least) & (nr >= least)
            if self.imbalance_penalty > 0:
                with np.errstate(divide="ignore"):
                    score = score - self.imbalance_penalty * (1.0 / nl + 1.0 / nr)
            return np.where(ok, score, -np.inf)
        ok = ok & self._counts_ok(left) & self._counts_ok(right)
        size_l = self._spread(left)
        size_r = self._spread(right)
        floor = self.alpha * spread_p
        ok = ok & np.all(size_l >= floor, axis=-1) & np.all(size_r >= floor, axis=-1)
        if self.imbalance_penalty > 0:
            ok = ok & np.all(size_l > 0, axis=-1) & np.all(size_r > 0, axis=-1)
            pen = (_safe_div(1.0, size_l) + _safe_div(1.0, size_r)).sum(axis=-1)
            score = score - self.imbalance_penalty * pen
        return np.where(ok, score, -np.inf)

    def _spread(self, stats):
        """``S_ww,kk - S_w,k^2 / S_g`` per component, shape (..., K)."""
        L = self.layout
        g = stats[..., 0]
        w = stats[..., L.s_w]
        diag_idx = L._tri_to_full[np.arange(self.K), np.arange(self.K)] + L.s_ww.start
        wwd = stats[..., diag_idx]
        return wwd - _safe_div(w * w, g[..., None])

    def _counts_ok(self, stats):
        L = self.layout
        n = stats[..., L.i_count]
        ind = stats[..., L.s_arm]
        m = self.min_samples_leaf
        ok = (n >= m) & np.all(ind >= m, axis=-1)
        if self.constraint == "arms":
            ok &= (n - ind.sum(axis=-1)) >= m
        else:
            ok &= np.all((n[..., None] - ind) >= m, axis=-1)
        return ok

    # ------------------------------------------------------------------ nodes
    def node_value(self, stats):
        """Leaf moments per row, then the row count.

        Parameters
        ----------
        stats : ndarray, shape (..., C)

        Returns
        -------
        ndarray, shape (..., n_moments + 1)
            ``stats[..., :n_moments] / n`` (zeros where ``n == 0``) and ``n``.
        """
        stats = self._check_stats(stats)
        L = self.layout
        n = stats[..., L.i_count]
        out = np.empty(stats.shape[:-1] + (self.n_outputs,), dtype=np.float64)
        out[..., :L.n_moments] = _safe_div(stats[..., :L.n_moments], n[..., None])
        out[..., L.n_moments] = n
        return out

    def node_weight(self, stats):
        """Row count, shape (...)."""
        return self._check_stats(stats)[..., self.layout.i_count]

    def compiled(self):
        """Compiled pieces for the growth kernels (:class:`forest.criteria.compiled.CompiledCriterion`).

        A single treatment column and outcome without preconditioning (binary or
        scalar continuous treatment) gets the fused scalar record
        (:class:`CausalScalarRecord`); every other case (``K`` arms or a treatment
        vector, ``M`` outcomes) the general one (:class:`CausalRecord`). The ``"rows"``
        constraint has records of its own (:class:`CausalScalarRowsRecord`,
        :class:`CausalRowsRecord`).
        """
        L = self.layout
        if self.constraint == "rows":
            if self.K == 1 and self.M == 1 and not self.precondition:
                record = CausalScalarRowsRecord(L.i_count, float(self.min_samples_leaf), self.alpha,
                                                self.imbalance_penalty)
                n_consts = 8
            else:
                record = CausalRowsRecord(self.K, self.M, L.s_ww.start, L.i_count, float(self.min_samples_leaf),
                                          self.alpha, self.imbalance_penalty, self.precondition)
                n_consts = _general_consts_size(self.K, self.M, L.n_moments)
            return CompiledCriterion(record, L.i_count, self.min_samples_leaf, n_consts)
        if self.K == 1 and self.M == 1 and not self.precondition:
            record = CausalScalarRecord(L.s_arm.start, L.i_count, float(self.min_samples_leaf), self.alpha,
                                        self.imbalance_penalty)
            n_consts = 8
        else:
            record = CausalRecord(self.K, self.M, L.s_ww.start, L.i_count, L.s_arm.start,
                                  float(self.min_samples_leaf), self.alpha, self.imbalance_penalty,
                                  self.constraint == "sign", self.precondition)
            n_consts = _general_consts_size(self.K, self.M, L.n_moments)
        return CompiledCriterion(record, L.i_count, self.min_samples_leaf, n_consts)


# ---------------------------------------------------------------------- references
def pseudo_outcomes_reference(w, y, g, precondition=None):
    """GRF pseudo-outcomes of one node, computed row by row (slow reference).

    Parameters
    ----------
    w : ndarray, shape (n, K)
        Centered treatment of the node's rows.
    y : ndarray, shape (n, M)
        Centered outcome.
    g : ndarray, shape (n,)
        Sample weights.
    precondition : bool or None
        Multiply by ``A^{-1}``, ``A = M_P / sum g``; ``None`` means ``K > 1``.

    Returns
    -------
    ndarray, shape (n, K, M)
    """
    w = as_columns(w)
    y = as_columns(y)
    g = np.asarray(g, dtype=np.float64)
    k = w.shape[1]
    precondition = (k > 1) if precondition is None else precondition
    sg = g.sum()
    wc = w - (g @ w) / sg
    yc = y - (g @ y) / sg
    mp = (g[:, None] * wc).T @ wc
    tau = np.linalg.solve(mp, (g[:, None] * wc).T @ yc)
    resid = yc - wc @ tau
    rho = wc[:, :, None] * resid[:, None, :]
    if precondition:
        rho = np.einsum("ij,njm->nim", np.linalg.inv(mp / sg), rho)
    return rho


def split_gain_reference(w, y, g, goes_left, precondition=None):
    """GRF split score of one partition of one node, from row-wise pseudo-outcomes.

    Parameters
    ----------
    w, y, g : see :func:`pseudo_outcomes_reference`
    goes_left : ndarray of bool, shape (n,)

    Returns
    -------
    float
        ``|sum_L g rho|^2 / sum_L g + |sum_R g rho|^2 / sum_R g`` (no constraints).
    """
    rho = pseudo_outcomes_reference(w, y, g, precondition)
    g = np.asarray(g, dtype=np.float64)
    grho = g[:, None, None] * rho
    total = 0.0
    for side in (goes_left, ~goes_left):
        s = grho[side].sum(axis=0)
        total += float((s * s).sum() / g[side].sum())
    return total

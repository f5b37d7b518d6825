"""GRF's instrumental splitting rule, evaluated exactly from histogram channel sums.

This module owns the channel layout of the instrumental forest
(:class:`InstrumentalChannels`), its split criterion (:class:`InstrumentalCriterion`)
with the compiled pieces the growth kernels call (:mod:`forest.criteria.compiled`),
and slow per-row NumPy references (:func:`pseudo_outcomes_reference`,
:func:`split_gain_reference`) that tests compare both against.

The rule
--------
At a node ``P`` (rows of the tree's split half, weights ``g``) with locally centred
instrument ``Z~``, treatment ``W~`` and outcome ``Y~`` (scalars), let ``zbar, wbar,
ybar`` be the weighted means, ``C_zy = sum g (Z~-zbar)(Y~-ybar)`` and
``C_zw = sum g (Z~-zbar)(W~-wbar)``, and ``tau_P = C_zy / C_zw`` the node's local
average treatment effect (the Wald / two-stage least squares estimate). Each row gets
the pseudo-outcome

    rho_i = (Z~_i - zbar) ((Y~_i - ybar) - tau_P (W~_i - wbar)) / d

with ``d = 1`` (grf's ``instrumental_forest``, the default) or, with
``precondition=True``, ``d = C_zw / sum g`` (the node's first-stage covariance, the
``A_P^{-1}`` of the GRF paper). A split scores
``(sum_L g rho)^2 / sum_L g + (sum_R g rho)^2 / sum_R g``; the parent's ``sum g rho``
is zero by construction of ``tau_P``, so the score is already the improvement. ``d``
is a node constant, so both choices pick the same split unless
``imbalance_penalty > 0``.

Why channels suffice
--------------------
``rho`` is bilinear in ``Z~`` and ``(W~, Y~)`` with node constants, so for a child ``L``

    sum_L g rho d = S_zy - ybar S_z - zbar S_y + zbar ybar S_g
                    - tau_P (S_zw - wbar S_z - zbar S_w + zbar wbar S_g)

with ``S_*`` the child's sums of the node-independent per-row channels
``g, gZ~, gW~, gY~, gZ~Y~, gZ~W~``; ``gZ~Z~`` gives the instrument spread the
constraints need. Histograms of these channels give every candidate exactly.

Constraints (grf's, in histogram form)
--------------------------------------
* each child holds at least ``min_samples_leaf`` rows with a large and with a small
  instrument. grf splits the instrument at the parent's mean, which no per-bin sum
  can give; here the split is at the row's own centring, ``Z~ > 0`` (for a binary
  instrument with ``0 < E[Z|x] < 1`` exactly ``Z = 1``), as the causal criterion's
  ``"sign"`` constraint does for a continuous treatment;
* ``alpha``: each child's instrument spread ``S_zz - S_z^2 / S_g`` is at least
  ``alpha`` times the parent's;
* ``imbalance_penalty``: the score loses ``penalty (1/size_L + 1/size_R)`` (the
  spreads above); with a penalty a child of zero spread fails;
* no split of a node whose first stage ``C_zw`` is zero (relative to the size of its
  terms): ``tau_P`` is undefined there (grf stops at ``|C_zw| <= 1e-10``).

The first three are grf's ``stabilize.splits = TRUE``. ``constraint="rows"`` is its
``FALSE``: the same pseudo-outcomes under grf's regression rule (rows only, see
:class:`InstrumentalCriterion`), with records of its own (:class:`InstrumentalRowsRecord`).

Leaf values and the estimate
----------------------------
``node_value`` returns the leaf's equation moments divided by its row count,
``(g, gZ~, gW~, gY~, gZ~Y~, gZ~W~) / n``, then ``n``. Averaged over trees they give
the forest-weighted ``theta(x) = (g zy - z y) / (g zw - z w)`` (grf's instrumental
prediction), which :func:`forest.analysis.inference.solve_theta` solves through
:meth:`InstrumentalChannels.equation_moments`.
"""
import functools
from collections import namedtuple

import numpy as np
from numba import vectorize

from histogram.jit import kernel, compiled_only
from forest._validation import as_columns
from forest.criteria.causal import (CausalCriterion, _scalar_right_exhausted, _scalar_sides_ok, rows_least,
                                    rows_right_exhausted, rows_sides_ok)
from forest.criteria.compiled import CompiledCriterion, register
from forest.criteria.basic import Criterion


class InstrumentalChannels:
    """Channel layout of the instrumental forest (one treatment, one outcome).

    Channel order (``C = 9``)::

        0  g          1  g Z~       2  g W~       3  g Y~
        4  g Z~ Y~    5  g Z~ W~    6  g Z~ Z~    7  1 (row count)
        8  1[Z~ > 0]  (the instrument-sign count of the constraints)

    The first ``n_moments = 6`` are the equation moments a leaf stores.
    """

    K = 1
    M = 1
    n_moments = 6
    i_zz = 6
    i_count = 7
    i_sign = 8
    n_channels = 9
    #: The local Jacobian ``g zw - z w`` may be negative (a negative first stage):
    #: :func:`forest.analysis.inference.solve_theta` accepts any non-zero value.
    has_instrument = True

    def make(self, z_centered, w_centered, y_centered, sample_weight):
        """Per-row channels.

        Parameters
        ----------
        z_centered, w_centered, y_centered : ndarray, shape (n,)
            ``Z - z_hat(X)``, ``W - t_hat(X)``, ``Y - y_hat(X)``.
        sample_weight : ndarray, shape (n,)

        Returns
        -------
        ndarray of float64, shape (n, 9), C-contiguous
        """
        z, w, y = (np.asarray(a, dtype=np.float64).reshape(-1) for a in (z_centered, w_centered, y_centered))
        g = np.asarray(sample_weight, dtype=np.float64).reshape(-1)
        n = len(z)
        if not (len(w) == len(y) == len(g) == n):
            raise ValueError(f"channel inputs must have the same number of rows, got {n}, {len(w)}, {len(y)}, "
                             f"{len(g)}")
        out = np.empty((n, self.n_channels), dtype=np.float64)
        gz = g * z
        out[:, 0] = g
        out[:, 1] = gz
        out[:, 2] = g * w
        out[:, 3] = g * y
        out[:, 4] = gz * y
        out[:, 5] = gz * w
        out[:, 6] = gz * z
        out[:, 7] = 1.0
        out[:, 8] = z > 0
        return out

    def equation_moments(self, stats):
        """Moments of the local estimating equation (see :mod:`forest.analysis.inference`).

        Parameters
        ----------
        stats : ndarray, shape (..., >= 6)

        Returns
        -------
        tuple
            ``g (...)``, ``z (..., 1)``, ``w (..., 1)``, ``y (..., 1)``,
            ``zy (..., 1, 1)``, ``zw (..., 1, 1)``.
        """
        lead = stats.shape[:-1]
        return (stats[..., 0], stats[..., 1:2], stats[..., 2:3], stats[..., 3:4],
                stats[..., 4].reshape(lead + (1, 1)), stats[..., 5].reshape(lead + (1, 1)))


# ---------------------------------------------------------------------- the gain
@compiled_only
def _iv_gain_core(gl, zl, wl, yl, zyl, zwl, zzl, nl, al, gr, zr, wr, yr, zyr, zwr, zzr, nr, ar,
                  zb, wb, yb, tau, inv_d, floor, valid, m, pen):
    """Gain of one candidate from scalars (no temporaries); see ``InstrumentalCriterion.gain``.

    Shared by the vectorised ufunc and the compiled growth kernels, so the two cannot
    disagree. ``a`` is the count of rows with ``Z~ > 0`` on a side.
    """
    out = -np.inf
    ok = (valid != 0.0) & (gl > 0.0) & (gr > 0.0)
    ok = ok & (nl >= m) & (nr >= m) & (al >= m) & (ar >= m) & (nl - al >= m) & (nr - ar >= m)
    if ok:
        size_l = zzl - zl * zl / gl
        size_r = zzr - zr * zr / gr
        ok2 = (size_l >= floor) & (size_r >= floor)
        if pen > 0.0:
            ok2 = ok2 & (size_l > 0.0) & (size_r > 0.0)
        if ok2:
            score = _iv_score(gl, zl, wl, yl, zyl, zwl, gr, zr, wr, yr, zyr, zwr, zb, wb, yb, tau, inv_d)
            if pen > 0.0:
                score -= pen * (1.0 / size_l + 1.0 / size_r)
            out = score
    return out


@compiled_only
def _iv_score(gl, zl, wl, yl, zyl, zwl, gr, zr, wr, yr, zyr, zwr, zb, wb, yb, tau, inv_d):
    """``(sum_L g rho)^2 / sum_L g + (sum_R g rho)^2 / sum_R g`` of one candidate."""
    zbyb = zb * yb
    zbwb = zb * wb
    sl = (zyl - yb * zl - zb * yl + zbyb * gl - tau * (zwl - wb * zl - zb * wl + zbwb * gl)) * inv_d
    sr = (zyr - yb * zr - zb * yr + zbyb * gr - tau * (zwr - wb * zr - zb * wr + zbwb * gr)) * inv_d
    return sl * sl / gl + sr * sr / gr


@compiled_only
def _iv_gain_rows_core(gl, zl, wl, yl, zyl, zwl, nl, gr, zr, wr, yr, zyr, zwr, nr, zb, wb, yb, tau, inv_d, valid,
                       least, pen):
    """The gain under the ``"rows"`` constraint (``stabilize_splits=False``): grf's regression rule
    on the pseudo-outcomes, each child ``least`` rows whatever its instrument, the penalty in rows."""
    out = -np.inf
    if (valid != 0.0) & (gl > 0.0) & (gr > 0.0) & (nl >= least) & (nr >= least):
        score = _iv_score(gl, zl, wl, yl, zyl, zwl, gr, zr, wr, yr, zyr, zwr, zb, wb, yb, tau, inv_d)
        if pen > 0.0:
            score -= pen * (1.0 / nl + 1.0 / nr)
        out = score
    return out


def _iv_gain_elementwise(gl, zl, wl, yl, zyl, zwl, zzl, nl, al, gr, zr, wr, yr, zyr, zwr, zzr, nr, ar,
                         zb, wb, yb, tau, inv_d, floor, valid, m, pen):
    """One element of :func:`_iv_gain_ufunc` (plain Python until vectorised there)."""
    return _iv_gain_core(gl, zl, wl, yl, zyl, zwl, zzl, nl, al, gr, zr, wr, yr, zyr, zwr, zzr, nr, ar,
                         zb, wb, yb, tau, inv_d, floor, valid, m, pen)


@functools.cache
def _iv_gain_ufunc():
    """Vectorised :func:`_iv_gain_core` (the NumPy split search), built on first use.

    Lazy for the reason given at :func:`forest.criteria.causal._gain_scalar_ufunc`:
    a ufunc's wrapper is rebuilt in every process, and this module is imported by
    every process that loads a growth kernel from the cache.
    """
    return vectorize(["float64(" + ", ".join(["float64"] * 27) + ")"], cache=True)(_iv_gain_elementwise)


#: Relative size below which a node's first stage counts as zero (no split).
FIRST_STAGE_TOL = 1e-12


@compiled_only
def _node_constants(parent, alpha, precondition):
    """``zbar, wbar, ybar, tau_P, 1/d, alpha * spread_P, valid_P`` of one node's sums ``parent (9,)``.

    The one home of the node constants: the compiled ``prepare`` and the vectorised
    gain (through :func:`_constants_rows`) both call it.
    """
    g = parent[0]
    z = parent[1]
    pos = g > 0
    gs = g if pos else 1.0
    zbar = z / gs if pos else 0.0
    wbar = parent[2] / gs if pos else 0.0
    ybar = parent[3] / gs if pos else 0.0
    czw = parent[5] - z * wbar
    czy = parent[4] - z * ybar
    scale = max(abs(parent[5]) + abs(z * wbar), 1e-300)
    valid = pos and abs(czw) > FIRST_STAGE_TOL * scale
    safe = czw if valid else 1.0
    inv_d = gs / safe if precondition else 1.0
    return zbar, wbar, ybar, czy / safe, inv_d, alpha * (parent[6] - z * zbar), 1.0 if valid else 0.0


@kernel
def _constants_rows(parents, alpha, precondition, out):
    """:func:`_node_constants` of each row of ``parents (N, 9)`` into ``out (N, 7)``."""
    for i in range(parents.shape[0]):
        c = _node_constants(parents[i], alpha, precondition)
        for j in range(7):
            out[i, j] = c[j]


# ---------------------------------------------------------------------- compiled pieces
#: Parameter record of :class:`InstrumentalCriterion` in the compiled kernels. ``arm``
#: (the ``Z~ > 0`` count channel) and ``min_samples_leaf`` carry the names the causal
#: criterion's count shortcuts read, which implement the same two-sided count rule.
InstrumentalRecord = namedtuple("InstrumentalRecord", ["arm", "min_samples_leaf", "alpha", "imbalance_penalty",
                                                       "precondition"])


def instrumental_prepare(p, parent, consts):
    """Node constants into ``consts[:7]``: ``zbar, wbar, ybar, tau_P, 1/d, floor, valid``."""
    c = _node_constants(parent, p.alpha, p.precondition)
    for j in range(7):
        consts[j] = c[j]


def _gains_piece(p, lefts, rights, consts, out, row, n):
    # Scalars only in the loop (no per-candidate array views), as the causal forest's
    # scalar piece.
    m_leaf = p.min_samples_leaf
    pen = p.imbalance_penalty
    zb = consts[0]
    wb = consts[1]
    yb = consts[2]
    tau = consts[3]
    inv_d = consts[4]
    floor = consts[5]
    valid = consts[6]
    for i in range(n):
        out[row, i] = _iv_gain_core(lefts[i, 0], lefts[i, 1], lefts[i, 2], lefts[i, 3], lefts[i, 4], lefts[i, 5],
                                    lefts[i, 6], lefts[i, 7], lefts[i, 8], rights[i, 0], rights[i, 1], rights[i, 2],
                                    rights[i, 3], rights[i, 4], rights[i, 5], rights[i, 6], rights[i, 7],
                                    rights[i, 8], zb, wb, yb, tau, inv_d, floor, valid, m_leaf, pen)


def _iv_bin_key(p, stats, i, consts):
    """Category sort key: the category's mean pseudo-outcome ``sum g rho / sum g`` under the
    node's ``zbar, wbar, ybar, tau_P`` (the sum the gain squares, per unit weight)."""
    g = stats[i, 0]
    if not g > 0:
        return 0.0
    zb = consts[0]
    wb = consts[1]
    yb = consts[2]
    tau = consts[3]
    s = (stats[i, 4] - yb * stats[i, 1] - zb * stats[i, 3] + zb * yb * g
         - tau * (stats[i, 5] - wb * stats[i, 1] - zb * stats[i, 2] + zb * wb * g)) * consts[4]
    return s / g


register(InstrumentalRecord, prepare=instrumental_prepare, gains=_gains_piece, sides_ok=_scalar_sides_ok,
         right_exhausted=_scalar_right_exhausted, bin_key=_iv_bin_key)

#: Record of the gain under the ``"rows"`` constraint (``stabilize_splits=False``); ``i_count`` is
#: the row-count channel, as the causal criterion's rows records name it (their count shortcuts).
InstrumentalRowsRecord = namedtuple("InstrumentalRowsRecord", ["i_count", "min_samples_leaf", "alpha",
                                                               "imbalance_penalty", "precondition"])


def instrumental_rows_prepare(p, parent, consts):
    """:func:`instrumental_prepare`'s constants, then the children's fewest rows (slot 7)."""
    c = _node_constants(parent, p.alpha, p.precondition)
    for j in range(7):
        consts[j] = c[j]
    consts[7] = rows_least(p.min_samples_leaf, p.alpha, parent[p.i_count])


def _rows_gains_piece(p, lefts, rights, consts, out, row, n):
    pen = p.imbalance_penalty
    zb = consts[0]
    wb = consts[1]
    yb = consts[2]
    tau = consts[3]
    inv_d = consts[4]
    valid = consts[6]
    least = consts[7]
    for i in range(n):
        out[row, i] = _iv_gain_rows_core(lefts[i, 0], lefts[i, 1], lefts[i, 2], lefts[i, 3], lefts[i, 4],
                                         lefts[i, 5], lefts[i, 7], rights[i, 0], rights[i, 1], rights[i, 2],
                                         rights[i, 3], rights[i, 4], rights[i, 5], rights[i, 7], zb, wb, yb, tau,
                                         inv_d, valid, least, pen)


register(InstrumentalRowsRecord, prepare=instrumental_rows_prepare, gains=_rows_gains_piece,
         sides_ok=rows_sides_ok, right_exhausted=rows_right_exhausted, bin_key=_iv_bin_key)


# ---------------------------------------------------------------------- the criterion
class InstrumentalCriterion(Criterion):
    """GRF's instrumental splitting rule on histogram channel sums (module docstring).

    Parameters
    ----------
    min_samples_leaf : int, default 5
        Fewest rows per child, and per side of the centred instrument in each child.
    alpha : float, default 0.05
        Fewest instrument spread per child, as a fraction of the parent's.
    imbalance_penalty : float, default 0.0
    precondition : bool, default False
        Divide the pseudo-outcomes by the node's first-stage covariance (the GRF
        paper's ``A_P^{-1}``); grf's code does not. Same splits without a penalty.
    constraint : {"sign", "rows"}, default "sign"
        ``"sign"``: the constraints above (grf's ``stabilize.splits = TRUE``). ``"rows"``
        (``stabilize.splits = FALSE``, grf's regression rule on the pseudo-outcomes):
        each child needs ``max(min_samples_leaf, ceil(alpha * rows of the node))`` rows,
        whatever its instrument; no spread floor; the penalty is
        ``penalty (1/n_L + 1/n_R)`` in rows.
    """

    def __init__(self, min_samples_leaf=5, alpha=0.05, imbalance_penalty=0.0, precondition=False, constraint="sign"):
        if constraint not in ("sign", "rows"):
            raise ValueError(f"constraint must be 'sign' or 'rows', got {constraint!r}")
        if not 0.0 <= alpha < 0.5:
            raise ValueError(f"alpha must be in [0, 0.5), got {alpha}")
        if imbalance_penalty < 0:
            raise ValueError(f"imbalance_penalty must be >= 0, got {imbalance_penalty}")
        self.layout = InstrumentalChannels()
        self.n_channels = self.layout.n_channels
        self.n_outputs = self.layout.n_moments + 1
        self.min_samples_leaf = max(int(min_samples_leaf), 1)
        self.alpha = float(alpha)
        self.imbalance_penalty = float(imbalance_penalty)
        self.precondition = bool(precondition)
        self.constraint = constraint

    def make_channels(self, z_centered, w_centered, y_centered, sample_weight):
        """See :meth:`InstrumentalChannels.make`."""
        return self.layout.make(z_centered, w_centered, y_centered, sample_weight)

    def gain(self, left, right, parent, parent_count=None):
        """Split improvement; ``-inf`` where a constraint fails.

        Parameters
        ----------
        left, right : ndarray, shape (..., 9)
        parent : ndarray, broadcastable to ``left``, shape (..., 9)
        parent_count : ignored (the count is a channel)

        Returns
        -------
        ndarray of float64, shape (...)
        """
        l = np.asarray(left, dtype=np.float64)
        r = np.asarray(right, dtype=np.float64)
        p = np.asarray(parent, dtype=np.float64)
        flat = np.ascontiguousarray(p.reshape(-1, p.shape[-1]))
        consts = np.empty((flat.shape[0], 7))
        _constants_rows(flat, self.alpha, self.precondition, consts)
        consts = consts.reshape(p.shape[:-1] + (7,))
        if self.constraint == "rows":
            return self._rows_gain(l, r, p, consts)
        return _iv_gain_ufunc()(*(l[..., c] for c in range(9)), *(r[..., c] for c in range(9)),
                                *(consts[..., j] for j in range(7)), float(self.min_samples_leaf),
                                self.imbalance_penalty)

    def _rows_gain(self, l, r, p, consts):
        """The ``"rows"`` gain in NumPy, from the node constants of :func:`_node_constants`."""
        zb, wb, yb, tau, inv_d, _, valid = (consts[..., j] for j in range(7))

        def side(s):
            cross = s[..., 4] - yb * s[..., 1] - zb * s[..., 3] + zb * yb * s[..., 0]
            first = s[..., 5] - wb * s[..., 1] - zb * s[..., 2] + zb * wb * s[..., 0]
            return (cross - tau * first) * inv_d

        gl, gr, nl, nr = l[..., 0], r[..., 0], l[..., 7], r[..., 7]
        least = np.maximum(float(self.min_samples_leaf), np.ceil(self.alpha * p[..., 7]))
        ok = (valid != 0.0) & (gl > 0) & (gr > 0) & (nl >= least) & (nr >= least)
        with np.errstate(divide="ignore", invalid="ignore"):
            score = side(l) ** 2 / gl + side(r) ** 2 / gr
            if self.imbalance_penalty > 0:
                score = score - self.imbalance_penalty * (1.0 / nl + 1.0 / nr)
        return np.where(ok, score, -np.inf)

    # A leaf stores its first ``n_moments`` channel sums per row, then its row count,
    # and its weight is the row count: the causal criterion's rules, on this layout.
    node_value = CausalCriterion.node_value
    node_weight = CausalCriterion.node_weight

    def compiled(self):
        """Compiled pieces for the growth kernels (:class:`forest.criteria.compiled.CompiledCriterion`)."""
        L = self.layout
        if self.constraint == "rows":
            record = InstrumentalRowsRecord(L.i_count, float(self.min_samples_leaf), self.alpha,
                                            self.imbalance_penalty, self.precondition)
        else:
            record = InstrumentalRecord(L.i_sign, float(self.min_samples_leaf), self.alpha, self.imbalance_penalty,
                                        self.precondition)
        return CompiledCriterion(record, L.i_count, self.min_samples_leaf, n_consts=8)


# ---------------------------------------------------------------------- references
def pseudo_outcomes_reference(z, w, y, g, precondition=False):
    """grf's instrumental pseudo-outcomes of one node, row by row (slow reference).

    Parameters
    ----------
    z, w, y : ndarray, shape (n,)
        Centred instrument, treatment and outcome of the node's rows.
    g : ndarray, shape (n,)
        Sample weights.
    precondition : bool, default False
        Divide by the node's first-stage covariance.

    Returns
    -------
    ndarray, shape (n,)
    """
    z, w, y = (as_columns(a)[:, 0] for a in (z, w, y))
    g = np.asarray(g, dtype=np.float64)
    sg = g.sum()
    zc = z - (g @ z) / sg
    wc = w - (g @ w) / sg
    yc = y - (g @ y) / sg
    first_stage = g @ (zc * wc)
    tau = (g @ (zc * yc)) / first_stage
    rho = zc * (yc - tau * wc)
    return rho / (first_stage / sg) if precondition else rho


def split_gain_reference(z, w, y, g, goes_left, precondition=False):
    """GRF split score of one partition of one node, from row-wise pseudo-outcomes.

    Parameters
    ----------
    z, w, y, g : see :func:`pseudo_outcomes_reference`
    goes_left : ndarray of bool, shape (n,)

    Returns
    -------
    float
        ``(sum_L g rho)^2 / sum_L g + (sum_R g rho)^2 / sum_R g`` (no constraints).
    """
    rho = pseudo_outcomes_reference(z, w, y, g, precondition)
    g = np.asarray(g, dtype=np.float64)
    total = 0.0
    for side in (goes_left, ~goes_left):
        s = float((g[side] * rho[side]).sum())
        total += s * s / float(g[side].sum())
    return total

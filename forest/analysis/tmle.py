"""Targeted maximum likelihood (TMLE) average effects of a binary treatment (grf's ``method="TMLE"``).

This module owns the TMLE branch of grf's ``average_treatment_effect`` for a binary
treatment, over the rows of every rank. With ``e = e(x)`` the propensity (clipped into
``[PROPENSITY_CLIP, 1 - PROPENSITY_CLIP]`` as the AIPW scores clip it), the forest's
regression surfaces ``mu0 = m(x) - e tau(x)`` and ``mu1 = mu0 + tau(x)``, and the residuals
``r0 = Y - mu0`` (controls) and ``r1 = Y - mu1`` (treated), each surface is moved by a
*linear* fluctuation (no logistic link, as in grf): the residuals of one arm are regressed,
without intercept and by ordinary least squares, on that arm's clever covariate ``H``, and
``mu_w* = mu_w + eps_w H_w(x)``. The estimate is the mean of ``mu1* - mu0*`` over the target
population ``P`` (the rows of positive weight in the subset; of those, the treated for
``"treated"``, the controls for ``"control"``):

``"all"``
    ``H1 = 1/e`` on the treated, ``H0 = 1/(1-e)`` on the controls:
    ``est = mean_P(tau) + eps1 mean_P(1/e) - eps0 mean_P(1/(1-e))``.
``"treated"``
    ``H0 = e/(1-e)`` on the controls; the treated arm's covariate is the constant 1, so its
    ``eps1`` is the treated rows' mean residual:
    ``est = mean_T(tau) + mean_T(r1) - eps0 mean_T(e/(1-e))``.
``"control"``
    Mirrored: ``H1 = (1-e)/e`` on the treated, the constant on the controls:
    ``est = mean_C(tau) + eps1 mean_C((1-e)/e) - mean_C(r0)``.

Standard errors are grf's: the variance of the raw mean, ``sum_P (tau - mean_P tau)^2 /
|P|^2``, plus, for each fitted fluctuation, the HC3 variance of its coefficient
(``sum a_i^2 u_i^2 / (1 - h_i)^2 / (sum a_i^2)^2`` with ``u`` the fit's residuals and
``h_i = a_i^2 / sum a^2`` its leverages) times the squared mean covariate over ``P``,
and, for an arm whose covariate is the constant, the sample variance of its residuals
over its row count. Term by term these are the first-order pieces of the AIPW influence
function's variance (the spread of ``tau`` and each arm's inverse-propensity weighted
residuals), so TMLE's and AIPW's standard errors agree to first order. Like grf's, they take
the fluctuations' covariate sums as fixed: right when the fluctuation is small (a good
outcome model), they can understate the spread when the outcome model is far off
(benchmarks/RESULTS.md, "TMLE average effect").

One deliberate difference from grf's code: for ``"treated"`` (``"control"``) grf leaves
the treated (control) arm's mean residual out of the estimate while its standard error
counts that term's variance; here the term is in the estimate (the targeted update of
that arm with the constant covariate), which makes the estimate doubly robust, as the
AIPW one is, and consistent with the standard error. For ``"all"`` the two agree.

As in grf, TMLE is refused for clustered rows and for rows with sample weights (grf:
"TMLE has not yet been implemented with clustered observations / sample weighted
observations"), for treatments that are not binary, and for ``target="overlap"`` (an
AIPW-only weighted regression). Two allreduces: the fluctuations' sums, then the sums of
squares around the fitted values; every figure is the same at any rank count (to the
rounding of the sums' order).
"""
import numpy as np

from native import collectives as col

from forest.analysis.inference import PROPENSITY_CLIP

TARGETS = ("all", "treated", "control")


def check_tmle_rows(rows, target):
    """Raise ``ValueError`` where grf's TMLE does not apply (the same on every rank).

    Parameters
    ----------
    rows : forest.analysis.effect_rows.EffectRows
    target : str
    """
    if target not in TARGETS:
        extra = (" (the overlap-weighted effect is a weighted regression estimated by AIPW only, as in grf)"
                 if target == "overlap" else "")
        raise ValueError(f"method='TMLE' supports targets {TARGETS}, got target={target!r}{extra}; "
                         f"use method='AIPW'")
    if rows.kind != "binary":
        what = {"categorical": "a multi-arm treatment", "continuous": "a continuous treatment",
                "instrumental": "an instrumental forest"}.get(rows.kind, f"a {rows.kind} treatment")
        raise ValueError(f"method='TMLE' needs a binary treatment (as in grf), not {what}; use method='AIPW'")
    if rows.layout is not None:
        raise ValueError("method='TMLE' has no cluster-robust form (grf refuses clustered observations too); "
                         "use method='AIPW'")


def _pieces(rows, w, target):
    """Per-row inputs: the population mask, tau, and the fluctuations.

    Returns
    -------
    pop : ndarray of bool, shape (n,)
    tau : ndarray, shape (n, M)
    flucts : list of (mask (n,), covariate a (n,), residual r (n, M), centre covariate b (n,), sign, hc3)
        ``eps = sum_mask a r / sum_mask a^2``; the estimate adds ``sign eps mean_pop(b)``; ``hc3``
        False marks a constant covariate, whose variance is the residuals' sample variance / count.
    """
    e = np.clip(rows.t_hat[:, 0], PROPENSITY_CLIP, 1.0 - PROPENSITY_CLIP)
    tau = rows.tau[:, 0, :]                                          # (n, M)
    mu0 = rows.y_hat - e[:, None] * tau
    r0 = rows.Y - mu0
    r1 = r0 - tau                                                    # Y - mu1
    inc = w > 0
    treated = inc & (rows.arm == 1)
    control = inc & (rows.arm == 0)
    ones = np.ones(rows.n)
    if target == "all":
        flucts = [(control, 1.0 / (1.0 - e), r0, 1.0 / (1.0 - e), -1.0, True),
                  (treated, 1.0 / e, r1, 1.0 / e, 1.0, True)]
        return inc, tau, flucts
    if target == "treated":
        odds = e / (1.0 - e)
        return treated, tau, [(control, odds, r0, odds, -1.0, True), (treated, ones, r1, ones, 1.0, False)]
    odds = (1.0 - e) / e
    return control, tau, [(treated, odds, r1, odds, 1.0, True), (control, ones, r0, ones, -1.0, False)]


def _sum(comm, values):
    return col.allreduce(comm, values) if comm.size > 1 else values


def tmle_average_effect(comm, rows, w, target="all"):
    """grf's TMLE average effect and its standard error (module docstring), collective.

    Parameters
    ----------
    comm : native.comm.Communicator
    rows : forest.analysis.effect_rows.EffectRows
        This rank's rows; binary treatment, no clusters, unit observation weights.
    w : ndarray, shape (n,)
        The rows' weights with zeros outside the subset
        (:func:`forest.analysis.effect_rows.subset_weights`); rows of positive weight are used.
    target : {"all", "treated", "control"}

    Returns
    -------
    estimate, stderr : ndarray, shape (1, M)
    """
    check_tmle_rows(rows, target)
    M = rows.Y.shape[1]
    pop, tau, flucts = _pieces(rows, w, target)
    # first pass: [weights != 1, |P|, sum_P tau (M), per fluctuation: n_j, sum a^2, sum_P b, sum a r (M)]
    first = [np.array([float(np.count_nonzero(rows.weight != 1.0)), float(pop.sum())]), tau[pop].sum(axis=0)]
    for mask, a, r, b, _, _ in flucts:
        first += [np.array([float(mask.sum()), float(np.sum(a[mask] ** 2)), float(b[pop].sum())]),
                  (a[mask, None] * r[mask]).sum(axis=0)]
    first = _sum(comm, np.concatenate(first))
    if first[0] > 0:
        raise ValueError("method='TMLE' takes no sample weights (grf refuses sample-weighted observations too): "
                         "use method='AIPW', or rows without sample_weight")
    n_pop = first[1]
    group = {"all": "rows", "treated": "treated rows", "control": "control rows"}[target]
    if n_pop < 1:
        raise ValueError(f"target={target!r} with method='TMLE' found no {group} with positive weight")
    raw = first[2:2 + M] / n_pop
    fits, at = [], 2 + M
    for mask, a, r, b, sign, hc3 in flucts:
        n_j, S_j, sum_b = first[at:at + 3]
        B_j = first[at + 3:at + 3 + M]
        at += 3 + M
        if n_j < 2:
            raise ValueError(f"method='TMLE' needs at least two treated and two control rows with positive "
                             f"weight (target={target!r}), got {int(n_j)} in one arm")
        fits.append((B_j / S_j, S_j, n_j, sum_b / n_pop))
    # second pass: sum_P (tau - raw)^2 (M), then per fluctuation its residuals' sums of squares (M)
    second = [((tau[pop] - raw) ** 2).sum(axis=0)]
    for (mask, a, r, b, sign, hc3), (eps, S_j, n_j, centre) in zip(flucts, fits):
        u = r[mask] - a[mask, None] * eps                               # (n_mask, M)
        if hc3:
            lev = a[mask] ** 2 / S_j
            second.append((a[mask, None] ** 2 * u ** 2 / (1.0 - lev[:, None]) ** 2).sum(axis=0))
        else:
            second.append((u ** 2).sum(axis=0))
    second = _sum(comm, np.concatenate(second))
    est = raw.copy()
    var = second[:M] / (n_pop * n_pop)
    for j, ((mask, a, r, b, sign, hc3), (eps, S_j, n_j, centre)) in enumerate(zip(flucts, fits)):
        ss = second[(j + 1) * M:(j + 2) * M]
        est += sign * eps * centre
        var += ss / (S_j * S_j) * centre * centre if hc3 else ss / (n_j * (n_j - 1.0))
    return est.reshape(1, M), np.sqrt(np.maximum(var, 0.0)).reshape(1, M)

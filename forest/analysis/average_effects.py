"""Doubly robust average treatment effects over all ranks' rows (grf's ``average_treatment_effect``).

This module owns the four target populations of grf's ``average_treatment_effect``
and their standard errors, computed from :class:`forest.analysis.effect_rows.EffectRows`
with observation weights ``w`` (zero outside a subset):

``"all"``
    ``sum w G / sum w`` over the doubly robust scores ``G``; variance
    ``sum_c (sum_{i in c} w_i (G_i - est))^2 / (sum w)^2 * C/(C-1)`` over the ``C``
    clusters with weight (rows without clusters). Binary, multi-arm (each arm
    against the control) and continuous treatments (the average partial effect).
``"treated"`` / ``"control"``
    For arm ``k`` against the control (binary: ``k = 1``), with ``T`` the rows on
    arm ``k``, ``C`` the control rows and ``mu0 = m - sum_j e_j tau_j``,
    ``mu1 = mu0 + tau_k``: the weighted mean of ``tau_k`` over the target group
    plus the correction
    ``sum_T w g_T (Y - mu1) / sum_T w g_T - sum_C w g_C (Y - mu0) / sum_C w g_C``
    with ``g_T = 1, g_C = e_k / e_0`` (treated) or ``g_T = e_0 / e_k, g_C = 1``
    (control). Variance: the variance of the raw mean,
    ``sum_group w^2 (tau - raw)^2 / (sum_group w)^2``, plus the uncentred variance of
    the correction with the ``C/(C-1)`` factor, both as grf computes them for a
    binary treatment. grf sums the correction by cluster but not the raw mean;
    here both are (identical without clusters). Continuous treatments: an error.
``"overlap"``
    grf's overlap-weighted effect: the coefficient of ``W - e(x)`` in the
    weighted least-squares fit of ``Y - m(x)`` on ``(1, W - e(x))`` (Robinson's
    partially linear estimator; weights ``e(1-e)`` without inverse propensities),
    with HC3 standard errors, or the cluster-robust ``HC1`` (``vcovCL``'s default)
    with clusters. Multi-arm and vector treatments regress on all columns of
    ``W - e`` jointly (for one column this is exactly grf's estimator).

Each is a few sums over rows: one allreduce (two for ``"overlap"``'s regression).

``method="TMLE"`` (binary treatment; ``"all"``, ``"treated"``, ``"control"``) replaces the
AIPW correction by grf's targeted (linear) fluctuation of the regression surfaces:
:mod:`forest.analysis.tmle`.
"""
import numpy as np

from forest.engine.clusters import cluster_moments
from forest.analysis.effect_rows import subset_weights
from forest.analysis.inference import PROPENSITY_CLIP
from forest.analysis.robust_ols import robust_ols
from forest.analysis.tmle import tmle_average_effect

TARGETS = ("all", "treated", "control", "overlap")
METHODS = ("AIPW", "TMLE")


def average_treatment_effect(comm, rows, target="all", subset=None, method="AIPW"):
    """Doubly robust average effect and its standard error.

    Parameters
    ----------
    comm : native.comm.Communicator
    rows : forest.analysis.effect_rows.EffectRows
        This rank's rows.
    target : {"all", "treated", "control", "overlap"}
    subset : array-like of bool, shape (n_local,), optional
        Rows of this rank to average over (defined by ``X`` only, as grf warns).
    method : {"AIPW", "TMLE"}
        ``"TMLE"``: :func:`forest.analysis.tmle.tmle_average_effect` (binary treatment, no
        clusters or sample weights, targets other than ``"overlap"``; ``ValueError`` otherwise).

    Returns
    -------
    estimate, stderr : ndarray, shape (K, M)
        One entry per treatment column (arm against control) and outcome.
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if method == "TMLE":
        return tmle_average_effect(comm, rows, subset_weights(rows, subset), target)
    if target in ("treated", "control") and rows.kind == "continuous":
        raise ValueError(f"target={target!r} needs a binary or categorical treatment; a continuous treatment "
                         f"supports 'all' (the average partial effect) and 'overlap'")
    w = subset_weights(rows, subset)
    if target == "all":
        return _all(comm, rows, w)
    if target == "overlap":
        return _overlap(comm, rows, w)
    return _targeted(comm, rows, w, target)


def _all(comm, rows, w):
    K, M = rows.shape
    G = rows.scores.reshape(rows.n, K * M)
    values = np.concatenate([w[:, None] * G, w[:, None]], axis=1)
    first, second, C = cluster_moments(comm, values, rows.layout, include=w > 0)
    _check_units(C, rows.layout)
    total = first[-1]
    est = first[:-1] / total
    ss = np.diag(second)[:-1] - 2.0 * est * second[:-1, -1] + est * est * second[-1, -1]
    se = np.sqrt(np.maximum(ss, 0.0) * C / (C - 1)) / total
    return est.reshape(K, M), se.reshape(K, M)


def _check_units(C, layout, where=""):
    """Raise ``ValueError`` unless the rows used lie in at least two clusters (rows without clusters)."""
    if C < 2:
        unit = "cluster" if layout is not None else "row"
        also = " (a subset inside a single cluster cannot give them)" if layout is not None else ""
        raise ValueError(f"the rows used{where} lie in {C} {unit}{'' if C == 1 else 's'} with positive weight: "
                         f"standard errors need at least two {unit}s{also}")


def _targeted(comm, rows, w, target):
    K, M = rows.shape
    est = np.zeros((K, M))
    se = np.zeros((K, M))
    e = rows.t_hat
    if rows.kind == "binary":
        e0 = 1.0 - e[:, 0]
    else:
        e0 = 1.0 - e.sum(axis=1)
    e0 = np.clip(e0, PROPENSITY_CLIP, 1.0)
    mu0 = rows.y_hat - np.einsum("nk,nkm->nm", e, rows.tau)             # (n, M)
    control = rows.arm == 0
    for k in range(K):
        treated = rows.arm == k + 1
        ek = np.clip(e[:, k], PROPENSITY_CLIP, 1.0)
        g_t = np.ones(rows.n) if target == "treated" else e0 / ek
        g_c = ek / e0 if target == "treated" else np.ones(rows.n)
        group = treated if target == "treated" else control
        wt = np.where(treated, w * g_t, 0.0)
        wc = np.where(control, w * g_c, 0.0)
        wg = np.where(group, w, 0.0)
        tau_k = rows.tau[:, k, :]                                          # (n, M)
        resid_t = rows.Y - (mu0 + tau_k)
        resid_c = rows.Y - mu0
        # columns: [wt r_t (M), wc r_c (M), wg tau (M), wt, wc, wg]
        values = np.concatenate([wt[:, None] * resid_t, wc[:, None] * resid_c, wg[:, None] * tau_k,
                                 wt[:, None], wc[:, None], wg[:, None]], axis=1)
        first, second, C = cluster_moments(comm, values, rows.layout, include=(treated | control) & (w > 0))
        _check_units(C, rows.layout, f" (arm {k + 1} and the control)" if K > 1 else " (treated and control)")
        St, Sc, Sg = first[3 * M], first[3 * M + 1], first[3 * M + 2]
        if not (St > 0 and Sc > 0 and Sg > 0):
            raise ValueError(f"target={target!r} needs treated and control rows with positive weight "
                             f"(arm {k + 1} against the control)")
        for m in range(M):
            raw = first[2 * M + m] / Sg
            corr = first[m] / St - first[M + m] / Sc
            a = np.zeros(len(first))
            a[m], a[M + m] = 1.0 / St, -1.0 / Sc
            var_corr = a @ second @ a * C / (C - 1)
            b = np.zeros(len(first))
            b[2 * M + m], b[3 * M + 2] = 1.0 / Sg, -raw / Sg
            var_raw = b @ second @ b
            est[k, m] = raw + corr
            se[k, m] = np.sqrt(max(var_raw, 0.0) + max(var_corr, 0.0))
    return est, se


def _overlap(comm, rows, w):
    K, M = rows.shape
    design = np.concatenate([np.ones((rows.n, 1)), rows.W - rows.t_hat], axis=1)
    vcov = "HC1" if rows.layout is not None else "HC3"
    est = np.zeros((K, M))
    se = np.zeros((K, M))
    for m in range(M):
        fit = robust_ols(comm, design, rows.Y[:, m] - rows.y_hat[:, m], w, rows.layout, vcov=vcov)
        est[:, m] = fit.coef[1:]
        se[:, m] = fit.stderr[1:]
    return est, se

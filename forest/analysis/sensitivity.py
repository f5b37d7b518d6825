"""Sensitivity of the doubly robust average effect to hidden confounding, and overlap warnings.

The omitted-variable-bias bound of Chernozhukov, Cinelli, Newey, Sharma and Syrgkanis
(2022, "Long story short: omitted variable bias in causal machine learning"): if a latent
confounder ``A`` were left out, the doubly robust ATE ``theta`` would be off by at most

    |bias| <= |rho| sqrt(c_y) sqrt(c_t / (1 - c_t)) sqrt(sigma^2 nu^2)

with ``sigma^2 = E[(Y - g(W, X))^2]`` the outcome's residual variance (``g(w, x) = m(x) +
(w - e(x)) tau(x)``), ``nu^2 = E[2 (1/e_k + 1/e_0) - alpha^2]`` the Riesz representer's
second moment (``alpha = 1[W = k]/e_k - 1[W = 0]/e_0``, its mean-of-the-derivative form),
``c_y`` the share of the outcome's residual variation the confounder would explain,
``c_t`` the share of the Riesz representer's (the treatment's) variation it would explain,
and ``rho`` their correlation: EconML's ``sensitivity_interval`` parameterisation. The bound
is ``theta -/+`` that half-width; its confidence interval adds the sampling uncertainty of
``(theta, sigma^2, nu^2)`` by the delta method (their joint covariance from the per-row
scores, cluster-robust with clusters). The robustness value is the ``r = c_y = c_t``
(``rho = 1``) at which the bound (or its confidence interval) reaches the null hypothesis.

Everything is a few weighted sums over rows (one allreduce), from
:class:`forest.analysis.effect_rows.EffectRows`, so it is the same at any rank count.
"""
import math
from statistics import NormalDist
from typing import NamedTuple
import warnings

import numpy as np

from native import collectives as col

from forest.analysis.effect_rows import subset_weights
from forest.analysis.inference import PROPENSITY_CLIP, check_interval_alpha
from forest.engine.clusters import cluster_moments

#: grf warns when estimated propensities come this near 0 or 1.
OVERLAP_WARN = 0.05


class SensitivityParameters(NamedTuple):
    """The sufficient statistics of the bound, per arm (k) and outcome (m).

    Attributes
    ----------
    theta, sigma2, nu2 : ndarray, shape (K, M)
    cov : ndarray, shape (K, M, 3, 3)
        Covariance of the estimates of ``(theta, sigma2, nu2)``.
    """
    theta: np.ndarray
    sigma2: np.ndarray
    nu2: np.ndarray
    cov: np.ndarray


def sensitivity_parameters(comm, rows, subset=None):
    """``(theta, sigma^2, nu^2)`` and their covariance from doubly robust rows (collective).

    Parameters
    ----------
    comm : native.comm.Communicator
    rows : forest.analysis.effect_rows.EffectRows
        A binary or categorical treatment.
    subset : array-like of bool, shape (n_local,), optional

    Returns
    -------
    SensitivityParameters
    """
    if rows.kind not in ("binary", "categorical"):
        raise ValueError(f"the sensitivity bound is defined for a binary or categorical treatment's average effect, "
                         f"not a {rows.kind} one")
    w = subset_weights(rows, subset)
    K, M = rows.shape
    e = rows.t_hat
    e0 = np.clip(1.0 - (e[:, 0] if rows.kind == "binary" else e.sum(axis=1)), PROPENSITY_CLIP, 1.0)
    theta, sigma2, nu2 = np.zeros((K, M)), np.zeros((K, M)), np.zeros((K, M))
    cov = np.zeros((K, M, 3, 3))
    resid = rows.Y - rows.y_hat - np.einsum("nk,nkm->nm", rows.W - e, rows.tau)    # Y - g(W, X), (n, M)
    control = rows.arm == 0
    for k in range(K):
        ek = np.clip(e[:, k], PROPENSITY_CLIP, 1.0)
        riesz = (rows.arm == k + 1) / ek - control / e0
        nu_score = 2.0 * (1.0 / ek + 1.0 / e0) - riesz * riesz
        for m in range(M):
            s = np.stack([rows.scores[:, k, m], resid[:, m] ** 2, nu_score], axis=1)         # (n, 3)
            values = np.concatenate([w[:, None] * s, w[:, None]], axis=1)
            first, second, C = cluster_moments(comm, values, rows.layout, include=w > 0)
            if C < 2:
                raise ValueError(f"the sensitivity bound needs rows from at least two clusters (rows) with positive "
                                 f"weight, got {C}")
            total = first[3]
            mean = first[:3] / total
            # second moments of the cluster totals of w (s - mean), from the raw ones
            S, c = second[:3, :3], second[:3, 3]
            centred = S - np.outer(mean, c) - np.outer(c, mean) + np.outer(mean, mean) * second[3, 3]
            theta[k, m], sigma2[k, m], nu2[k, m] = mean
            cov[k, m] = centred * C / (C - 1) / (total * total)
    return SensitivityParameters(theta, sigma2, nu2, cov)


def _check_strengths(c_y, c_t, rho):
    for name, v in (("c_y", c_y), ("c_t", c_t)):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or not 0 <= v < 1:
            raise ValueError(f"{name} must be a number in [0, 1), got {v!r}")
    if isinstance(rho, bool) or not isinstance(rho, (int, float, np.integer, np.floating)) or not -1 <= rho <= 1:
        raise ValueError(f"rho must be a number in [-1, 1], got {rho!r}")


def sensitivity_bounds(params, c_y, c_t, rho=1.0, alpha=0.05):
    """Bounds on the effect under confounding of strength ``(c_y, c_t, rho)``, and their confidence interval.

    Parameters
    ----------
    params : SensitivityParameters
    c_y, c_t : float in [0, 1)
    rho : float in [-1, 1]
    alpha : float
        ``1 - alpha`` confidence for the interval around the bounds.

    Returns
    -------
    lower, upper, ci_lower, ci_upper : ndarray, shape (K, M)
    """
    _check_strengths(c_y, c_t, rho)
    check_interval_alpha(alpha)
    theta, sigma2, nu2, cov = params
    if np.any(nu2 < 0) or np.any(sigma2 < 0):
        raise ValueError(f"the Riesz representer's estimated second moment nu^2 = {float(np.min(nu2)):.4g} is "
                         f"negative: the propensity estimates disagree with the observed treatment (too few rows or "
                         f"nuisance trees, or poor overlap), so the bound cannot be formed")
    C = abs(rho) * math.sqrt(c_y) * math.sqrt(c_t / (1.0 - c_t))
    half = C * np.sqrt(sigma2 * nu2)
    z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    # gradient of theta +/- C sqrt(sigma2 nu2) in (theta, sigma2, nu2)
    with np.errstate(divide="ignore", invalid="ignore"):
        d_sigma = np.where(sigma2 > 0, 0.5 * C * np.sqrt(nu2 / sigma2), 0.0)
        d_nu = np.where(nu2 > 0, 0.5 * C * np.sqrt(sigma2 / nu2), 0.0)
    out = []
    for sign in (-1.0, 1.0):
        g = np.stack([np.ones_like(theta), sign * d_sigma, sign * d_nu], axis=-1)        # (K, M, 3)
        sd = np.sqrt(np.maximum(np.einsum("kmi,kmij,kmj->km", g, cov, g), 0.0))
        out.append((theta + sign * half, theta + sign * (half + z * sd)))
    (lower, ci_lower), (upper, ci_upper) = out
    return lower, upper, ci_lower, ci_upper


def robustness_value(params, alpha=0.05, null_hypothesis=0.0, interval="ci"):
    """The confounding strength ``r = c_y = c_t`` (``rho = 1``) that moves the bound to the null.

    Parameters
    ----------
    params : SensitivityParameters
    alpha : float
    null_hypothesis : float
    interval : {"ci", "estimate"}
        Reach the null with the bounds' confidence interval, or with the bounds themselves.

    Returns
    -------
    ndarray, shape (K, M)
        In ``[0, 1)``; 0 where the interval (or estimate) already holds the null.
    """
    if interval not in ("ci", "estimate"):
        raise ValueError(f"interval must be 'ci' or 'estimate', got {interval!r}")
    theta = params.theta
    out = np.zeros(theta.shape)
    for idx in np.ndindex(theta.shape):
        one = SensitivityParameters(*(np.asarray(a)[idx][None, None] for a in params))

        def gap(r):
            lo, hi, ci_lo, ci_hi = sensitivity_bounds(one, r, r, 1.0, alpha)
            a, b = (ci_lo, ci_hi) if interval == "ci" else (lo, hi)
            return float(a[0, 0] - null_hypothesis), float(b[0, 0] - null_hypothesis)

        lo0, hi0 = gap(0.0)
        if lo0 <= 0 <= hi0:
            continue
        above = lo0 > 0
        r_lo, r_hi = 0.0, 1.0 - 1e-12
        for _ in range(60):                       # the bounds widen monotonically in r
            mid = 0.5 * (r_lo + r_hi)
            lo, hi = gap(mid)
            still = lo > 0 if above else hi < 0
            r_lo, r_hi = (mid, r_hi) if still else (r_lo, mid)
        out[idx] = 0.5 * (r_lo + r_hi)
    return out


def warn_overlap(comm, t_hat, kind, stacklevel=3):
    """grf's warning, with the numbers, when estimated propensities come within 0.05 of 0 or 1 (collective).

    Parameters
    ----------
    comm : native.comm.Communicator
    t_hat : ndarray, shape (n_local, K)
        Propensities of arms 1..K.
    kind : str
        The treatment kind; only binary and categorical treatments have propensities.
    """
    if kind not in ("binary", "categorical"):
        return
    e = np.asarray(t_hat, dtype=np.float64)
    e = np.concatenate([e, 1.0 - e.sum(axis=1, keepdims=True)], axis=1)   # the control's too
    local = np.array([[e.min() if e.size else np.inf, -(e.max() if e.size else -np.inf)]])
    lo, neg_hi = col.allgather(comm, local).min(axis=0)
    hi = -neg_hi
    if lo <= OVERLAP_WARN or hi >= 1.0 - OVERLAP_WARN:
        warnings.warn(f"estimated treatment propensities range from {lo:.3g} to {hi:.3g}, within {OVERLAP_WARN} of "
                      f"0 or 1: overlap is poor, and the doubly robust averages lean on few rows with large "
                      f"inverse-propensity weights (consider target='overlap' or trimming the sample)", UserWarning,
                      stacklevel=stacklevel)

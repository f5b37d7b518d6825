"""Causal-forest estimates from leaf moments: point estimates, BLB variance, AIPW ATE.

This module owns the statistics downstream of the trees:

* :func:`solve_theta` turns averaged leaf moments into ``theta(x) = A(x)^{-1} b(x)``
  with ``A = g ww - w w^T`` and ``b = g wy - w y^T`` (``g, w, y, wy, ww`` the averaged
  per-tree leaf means of ``g, gW~, gY~, gW~Y~^T, gW~W~^T``). Averaging each tree's
  leaf means with equal tree weight is exactly GRF's forest weighting
  ``alpha_i(x) = (1/B) sum_b 1[i in leaf_b(x)] / |leaf_b(x)|``, and the solution is the
  weighted local regression of ``Y~`` on ``W~`` with an intercept.
* :func:`blb_variance` is the bootstrap of little bags. Trees come in groups of
  ``ci_group_size`` that share a half-sample. ``theta`` is linearised in the moments
  (delta method): for tree ``b``
  ``psi_b = A^{-1} [ g (wy_b - ww_b theta) + g_b (wy - ww theta)
  - w_b (y - theta^T w)^T - w (y_b - theta^T w_b)^T ]``
  (unsubscripted = forest average), whose forest average is exactly zero, so a
  group's mean ``psi`` is the first-order deviation of the group's half-sample
  estimate from the forest's. The variance of a half-sample estimate around the
  full estimate equals the variance of the full estimate (Hajek projection), so
  ``Var = mean_q psibar_q^2`` corrected for the Monte-Carlo noise of finitely many
  trees per group (within-group variance / group size). The corrected value can be
  negative; it is replaced by the posterior mean of a non-negative variance under a
  flat prior and a Gaussian likelihood, ``v + s phi(v/s) / Phi(v/s)``, with ``s``
  the noise scale ``max(between, noise) sqrt(2/G)``.

  For one treatment and outcome with unit weights ``psi_b`` equals GRF's
  ``V^{-1}``-weighted moment ``((wy_b - ww_b theta - w_b mu) - w (y_b - w_b theta - mu)) / A``
  (``mu`` the local intercept), so the estimate is GRF's, debiasing included (tested
  against a loop version of it). What it is not: exact. The half-sample argument is
  exact for the first-order (Hajek) part of the forest only; with a group's trees
  using their whole half-sample, higher-order parts enter ``(2^k - 1)`` times, which
  makes the method-of-moments value conservative. And where tree noise dominates
  (constant effects, few trees) the o-Bayes step adds up to about ``0.8 s``: at
  n = 4000, d = 10, tau = 1, 1000 trees the raw value matched the sampling variance
  over 20 training sets (0.0049 vs 0.0042) while the debiased one was 2.8 times it.
  Intervals that miss tau(x) on the Wager-Athey design do so from the forest's
  smoothing bias, not from this variance (benchmarks/RESULTS.md, coverage).
* :func:`aipw_scores` gives the doubly robust scores from (out-of-bag or held-out)
  effects and the nuisance estimates; the averages and tests built on them live in
  :mod:`forest.average_effects`, :mod:`forest.linear_projection` and :mod:`forest.rate`.
"""
import math

import numpy as np

from .causal_criterion import CausalChannels

#: Propensities are clipped into [EPS, 1 - EPS] inside the AIPW weights.
PROPENSITY_CLIP = 1e-3


def _solve(A, b):
    """Batched ``A^{-1} b`` with NaN where ``A`` is singular; A (n,K,K), b (n,K,M)."""
    K = A.shape[-1]
    scale = np.maximum(np.abs(np.diagonal(A, axis1=-2, axis2=-1)).sum(-1), 1e-300)
    if K == 1:
        ok = A[:, 0, 0] > 1e-12 * scale
        out = b / np.where(ok, A[:, 0, 0], 1.0)[:, None, None]
    else:
        eig = np.linalg.eigvalsh(A)
        ok = eig[:, 0] > 1e-12 * scale
        out = np.linalg.solve(np.where(ok[:, None, None], A, np.eye(K)), b)
    out[~ok] = np.nan
    return out, ok


def solve_theta(mbar, layout):
    """Local effect from averaged leaf moments.

    Parameters
    ----------
    mbar : ndarray, shape (n, >= n_moments)
        Averaged per-tree leaf moments (extra trailing columns are ignored).
    layout : CausalChannels

    Returns
    -------
    theta : ndarray, shape (n, K, M)
        NaN where the local treatment covariance is singular.
    A : ndarray, shape (n, K, K)
        ``g ww - w w^T`` (``g^2`` times the local covariance of ``W~``).
    """
    g, w, y, wy, ww = layout.moments(np.asarray(mbar, dtype=np.float64))
    A = g[:, None, None] * ww - w[:, :, None] * w[:, None, :]
    b = g[:, None, None] * wy - w[:, :, None] * y[:, None, :]
    theta, _ = _solve(A, b)
    return theta, A


def oob_effects(mbar, layout, all_tree_moments):
    """Out-of-bag effects, with a fallback where the out-of-bag moments are singular.

    A row whose out-of-bag trees leave its local treatment covariance singular (for
    example every such leaf held one arm only) takes the moments of all trees
    instead, as rows with no out-of-bag tree do; a row singular even then gets a
    zero effect, so one degenerate row cannot turn the AIPW average into NaN.

    Parameters
    ----------
    mbar : ndarray, shape (n, >= n_moments)
        Averaged out-of-bag leaf moments; rows replaced by the fallback are
        overwritten in place.
    layout : CausalChannels
    all_tree_moments : callable
        ``all_tree_moments(mask) -> ndarray (mask.sum(), mbar.shape[1])``: the moments
        averaged over all trees for the rows selected by the boolean ``mask``.

    Returns
    -------
    ndarray, shape (n, K, M)
        Finite everywhere.
    """
    tau, _ = solve_theta(mbar, layout)
    bad = ~np.isfinite(tau).all(axis=(1, 2))
    if bad.any():
        mbar[bad] = all_tree_moments(bad)
        tau[bad] = solve_theta(mbar[bad], layout)[0]
    return np.nan_to_num(tau, nan=0.0, posinf=0.0, neginf=0.0)


def _psi(tree_m, mbar, theta, layout):
    """Per-tree linearised deviations ``psi_b`` (before ``A^{-1}``), shape (n, B, K, M)."""
    g, w, y, wy, ww = layout.moments(mbar)                # (n,), (n,K), (n,M), (n,K,M), (n,K,K)
    gb, wb, yb, wyb, wwb = layout.moments(tree_m)          # (n,B), (n,B,K), ...
    th = theta[:, None]                                   # (n,1,K,M)
    u = g[:, None, None, None] * (wyb - wwb @ th)
    u += gb[..., None, None] * (wy - ww @ theta)[:, None]
    r = y - np.einsum("nkm,nk->nm", theta, w)              # (n,M)
    u -= wb[..., :, None] * r[:, None, None, :]
    rb = yb - np.einsum("nkm,nbk->nbm", theta, wb)         # (n,B,M)
    u -= w[:, None, :, None] * rb[:, :, None, :]
    return u


def _debias(raw, noise_scale):
    """Posterior mean of a non-negative variance given a noisy unbiased estimate."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ratio = raw / noise_scale
        pdf = np.exp(-0.5 * ratio * ratio) / math.sqrt(2.0 * math.pi)
        cdf = 0.5 * _erfc(-ratio / math.sqrt(2.0))
        out = raw + noise_scale * pdf / cdf
    # far in the left tail phi/Phi ~ -ratio: the posterior mean tends to s/|ratio|
    tail = ~np.isfinite(out) | (cdf < 1e-300)
    out = np.where(tail, noise_scale / np.maximum(np.abs(ratio), 1.0), out)
    return np.where(noise_scale > 0, np.maximum(out, 0.0), np.maximum(raw, 0.0))


_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def blb_variance(tree_m, layout, ci_group_size):
    """Bootstrap-of-little-bags variance of ``theta(x)`` (module docstring).

    Parameters
    ----------
    tree_m : ndarray, shape (n, B, >= n_moments)
        Each tree's leaf moments at each point; trees ``q*L .. q*L+L-1`` form group
        ``q`` (``L = ci_group_size``); a trailing partial group is ignored. Trees whose
        leaf count (column ``n_moments``) is zero make their group unusable.
    layout : CausalChannels
    ci_group_size : int
        ``L >= 2``.

    Returns
    -------
    theta : ndarray, shape (n, K, M)
        The forest estimate over the usable trees.
    var : ndarray, shape (n, K, M)
        Variance of each component; NaN where fewer than two usable groups exist.
    """
    L = int(ci_group_size)
    if L < 2:
        raise ValueError(f"variance estimates need ci_group_size >= 2, got {ci_group_size}")
    tree_m = np.asarray(tree_m, dtype=np.float64)
    n, B = tree_m.shape[:2]
    G = B // L
    if G < 2:
        raise ValueError(f"variance estimates need at least two groups of {L} trees, got {B} trees")
    tm = tree_m[:, : G * L, : layout.n_moments + 1]
    count = tm[..., layout.n_moments]
    good = (count.reshape(n, G, L) > 0).all(axis=2)       # (n, G)
    n_good = good.sum(axis=1)
    gmask = np.repeat(good, L, axis=1)[..., None]          # (n, G*L, 1)
    mbar = (tm * gmask).sum(axis=1) / np.maximum(n_good * L, 1)[:, None]
    theta, A = solve_theta(mbar, layout)
    u = _psi(tm[..., : layout.n_moments], mbar, theta, layout) * gmask[..., None]
    K, M = layout.K, layout.M
    # psi = A^{-1} u, applied per tree
    A_safe = np.where(np.isfinite(theta).all(axis=(1, 2))[:, None, None], A, np.eye(K))
    psi = np.linalg.solve(A_safe[:, None], u) if K > 1 else u / A_safe[:, None, :, :]
    psi = psi.reshape(n, G, L, K, M)
    ng = np.maximum(n_good, 1)[:, None, None]
    group_mean = psi.mean(axis=2)                                        # (n, G, K, M)
    between = (group_mean ** 2).sum(axis=1) / ng
    within = ((psi - group_mean[:, :, None]) ** 2).sum(axis=(1, 2)) / (ng * (L - 1))
    noise = within / L
    raw = between - noise
    scale = np.maximum(between, noise) * np.sqrt(2.0 / ng)
    var = _debias(raw, scale)
    var[n_good < 2] = np.nan
    return theta, var


# ---------------------------------------------------------------------- AIPW
def aipw_scores(kind, tau, t, y, y_hat, t_hat, local_cov=None):
    """Doubly robust scores ``Gamma_i`` whose mean is the average effect.

    Parameters
    ----------
    kind : {"binary", "categorical", "continuous"}
    tau : ndarray, shape (n, K, M)
        Out-of-bag effect estimates at the training rows.
    t : ndarray
        Treatment: (n,) 0/1 (binary), (n,) codes 0..K (categorical), (n, K) values
        (continuous).
    y : ndarray, shape (n, M)
    y_hat : ndarray, shape (n, M)
        ``E[Y|x]`` estimates.
    t_hat : ndarray, shape (n, K)
        Propensities of arms 1..K, or ``E[W|x]``.
    local_cov : ndarray, shape (n, K, K), optional
        Conditional covariance of ``W`` given ``x`` (continuous treatments only).

    Returns
    -------
    ndarray, shape (n, K, M)

    Notes
    -----
    With ``mu_w(x) = m(x) + (w - e(x))^T tau(x)``:
    binary ``Gamma = tau + (W - e) / (e (1 - e)) (Y - mu_W)``;
    categorical ``Gamma_k = tau_k + (1[W=k]/e_k - 1[W=0]/e_0) (Y - mu_W)``;
    continuous ``Gamma = tau + V^{-1} (W - e) (Y - mu_W)`` (GRF's average partial
    effect), ``V`` the conditional covariance of ``W``.
    """
    tau = np.asarray(tau, dtype=np.float64)
    n, K, M = tau.shape
    y = np.asarray(y, dtype=np.float64).reshape(n, M)
    y_hat = np.asarray(y_hat, dtype=np.float64).reshape(n, M)
    e = np.asarray(t_hat, dtype=np.float64).reshape(n, K)
    if kind == "binary":
        w = np.asarray(t, dtype=np.float64).reshape(n, 1)
        wc = w - e
    elif kind == "categorical":
        codes = np.asarray(t).reshape(n).astype(np.int64)
        w = np.zeros((n, K))
        rows = codes > 0
        w[rows, codes[rows] - 1] = 1.0
        wc = w - e
    elif kind == "continuous":
        w = np.asarray(t, dtype=np.float64).reshape(n, K)
        wc = w - e
    else:
        raise ValueError(f"unknown treatment kind {kind!r}")
    resid = y - y_hat - np.einsum("nk,nkm->nm", wc, tau)            # Y - mu_W(x), (n, M)
    if kind == "binary":
        ec = np.clip(e[:, 0], PROPENSITY_CLIP, 1 - PROPENSITY_CLIP)
        weight = (wc[:, 0] / (ec * (1 - ec)))[:, None]
    elif kind == "categorical":
        ec = np.clip(e, PROPENSITY_CLIP, 1.0)
        e0 = np.clip(1.0 - e.sum(axis=1), PROPENSITY_CLIP, 1.0)
        control = (codes == 0).astype(np.float64)
        weight = w / ec - (control / e0)[:, None]
    else:
        if local_cov is None:
            raise ValueError("continuous treatments need local_cov for the AIPW weights")
        V = np.asarray(local_cov, dtype=np.float64).reshape(n, K, K)
        weight, ok = _solve(V, wc[:, :, None])
        weight = np.where(ok[:, None, None], weight, 0.0)[:, :, 0]
    return tau + weight[:, :, None] * resid[:, None, :]

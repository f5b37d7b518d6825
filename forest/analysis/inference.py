"""Causal-forest estimates from leaf moments: point estimates, BLB variance, AIPW ATE.

This module owns the statistics downstream of the trees:

* :func:`solve_theta` turns averaged leaf moments into ``theta(x) = A(x)^{-1} b(x)``
  with ``A = g zw - z w^T`` and ``b = g zy - z y^T`` (``g, z, w, y, zy, zw`` the averaged
  per-tree leaf means of ``g, gZ~, gW~, gY~, gZ~Y~^T, gZ~W~^T``), the solution of the
  local estimating equation ``sum alpha_i (Z~_i - zbar)(Y~_i - ybar - theta^T (W~_i - wbar)) = 0``.
  The causal forest's instrument is its treatment (``Z~ = W~``, so ``A = g ww - w w^T``);
  the instrumental forest's (:mod:`forest.criteria.instrumental`) is its own. A layout
  gives these moments through ``equation_moments``. Averaging each tree's
  leaf means with equal tree weight is exactly GRF's forest weighting
  ``alpha_i(x) = (1/B) sum_b 1[i in leaf_b(x)] / |leaf_b(x)|``, and the solution is the
  weighted local regression of ``Y~`` on ``W~`` with an intercept.
* :func:`blb_variance` is the bootstrap of little bags. Trees come in groups of
  ``ci_group_size`` that share a half-sample. ``theta`` is linearised in the moments
  (delta method): for tree ``b``
  ``psi_b = A^{-1} [ g (zy_b - zw_b theta) + g_b (zy - zw theta)
  - z_b (y - theta^T w)^T - z (y_b - theta^T w_b)^T ]``
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
  :mod:`forest.analysis.average_effects`, :mod:`forest.analysis.linear_projection` and :mod:`forest.analysis.rate`.
"""
import math
from statistics import NormalDist

import numpy as np
from numba import prange

from histogram.jit import kernel, compiled_only, empty
from forest.criteria.causal import CausalChannels

#: Propensities are clipped into [EPS, 1 - EPS] inside the AIPW weights.
PROPENSITY_CLIP = 1e-3


def _solve(A, b, signed=False):
    """Batched ``A^{-1} b`` with NaN where ``A`` is singular; A (n,K,K), b (n,K,M).

    ``A`` is positive semi-definite (a causal layout), or, with ``signed``, any sign
    (an instrumented layout's first stage; ``K = 1`` only).
    """
    K = A.shape[-1]
    scale = np.maximum(np.abs(np.diagonal(A, axis1=-2, axis2=-1)).sum(-1), 1e-300)
    if K == 1:
        ok = (np.abs(A[:, 0, 0]) if signed else A[:, 0, 0]) > 1e-12 * scale
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
    layout : CausalChannels or InstrumentalChannels

    Returns
    -------
    theta : ndarray, shape (n, K, M)
        NaN where the local treatment (or first-stage) covariance is singular.
    A : ndarray, shape (n, K, K)
        ``g zw - z w^T`` (``g^2`` times the local covariance of ``Z~`` and ``W~``).
    """
    g, z, w, y, zy, zw = layout.equation_moments(np.asarray(mbar, dtype=np.float64))
    A = g[:, None, None] * zw - z[:, :, None] * w[:, None, :]
    b = g[:, None, None] * zy - z[:, :, None] * y[:, None, :]
    theta, _ = _solve(A, b, layout.has_instrument)
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
    layout : CausalChannels or InstrumentalChannels
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
    g, z, w, y, zy, zw = layout.equation_moments(mbar)    # (n,), (n,K), (n,K), (n,M), (n,K,M), (n,K,K)
    gb, zb, wb, yb, zyb, zwb = layout.equation_moments(tree_m)   # (n,B), (n,B,K), ...
    th = theta[:, None]                                   # (n,1,K,M)
    u = g[:, None, None, None] * (zyb - zwb @ th)
    u += gb[..., None, None] * (zy - zw @ theta)[:, None]
    r = y - np.einsum("nkm,nk->nm", theta, w)              # (n,M)
    u -= zb[..., :, None] * r[:, None, None, :]
    rb = yb - np.einsum("nkm,nbk->nbm", theta, wb)         # (n,B,M)
    u -= z[:, None, :, None] * rb[:, :, None, :]
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


def _check_groups(ci_group_size, n_trees):
    """``(L, G)``: trees per little bag and the number of whole groups."""
    L = int(ci_group_size)
    if L < 2:
        raise ValueError(f"variance estimates need ci_group_size >= 2, got {ci_group_size}")
    G = n_trees // L
    if G < 2:
        raise ValueError(f"variance estimates need at least two groups of {L} trees, got {n_trees} trees")
    return L, G


def blb_variance(tree_m, layout, ci_group_size):
    """Bootstrap-of-little-bags variance of ``theta(x)`` (module docstring).

    Parameters
    ----------
    tree_m : ndarray, shape (n, B, >= n_moments)
        Each tree's leaf moments at each point; trees ``q*L .. q*L+L-1`` form group
        ``q`` (``L = ci_group_size``); a trailing partial group is ignored. Trees whose
        leaf count (column ``n_moments``) is zero make their group unusable.
    layout : CausalChannels or InstrumentalChannels
    ci_group_size : int
        ``L >= 2``.

    Returns
    -------
    theta : ndarray, shape (n, K, M)
        The forest estimate over the usable trees.
    var : ndarray, shape (n, K, M)
        Variance of each component; NaN where fewer than two usable groups exist.
    """
    tree_m = np.asarray(tree_m, dtype=np.float64)
    L, G = _check_groups(ci_group_size, tree_m.shape[1])
    return _blb_finish(*_blb_sums(tree_m, layout, L, G), L)


def _blb_sums(tree_m, layout, L, G):
    """``theta``, the between- and within-group sums of squares, and usable groups per row."""
    n = tree_m.shape[0]
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
    return theta, between, within, n_good


def _blb_finish(theta, between, within, n_good, L):
    """Noise-corrected, non-negative variance from :func:`_blb_sums`' output."""
    ng = np.maximum(n_good, 1)[:, None, None]
    noise = within / L
    raw = between - noise
    scale = np.maximum(between, noise) * np.sqrt(2.0 / ng)
    var = _debias(raw, scale)
    var[n_good < 2] = np.nan
    return theta, var


def check_interval_alpha(alpha):
    """Raise ``ValueError`` unless ``alpha`` (1 - confidence level) is a number in (0, 1)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer, np.floating)) \
            or not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")


def normal_interval(center, var, alpha):
    """Normal ``1 - alpha`` confidence bounds ``center -/+ z_{1 - alpha/2} sqrt(var)`` (checks ``alpha``).

    Returns
    -------
    lower, upper : ndarray, shape of ``center``
    """
    check_interval_alpha(alpha)
    half = NormalDist().inv_cdf(1.0 - alpha / 2.0) * np.sqrt(var)
    return center - half, center + half


def ratio_blb_variance(tree_values, k, ci_group_size, valid=None):
    """Bootstrap-of-little-bags variance of a regression forest's ratio estimate.

    A regression forest predicts ``mu = num / den``, the ratio of its trees' averaged
    leaf sums (``num_b = sum w y / rows``, ``den_b = sum w / rows`` of the leaf the point
    reaches in tree ``b``; grf's forest-weighted mean). Linearised in the trees' sums,
    tree ``b`` deviates by ``psi_b = (num_b - mu den_b) / den`` (forest average exactly
    zero), and the rest is :func:`blb_variance`'s: ``Var = mean_q psibar_q^2`` over the
    groups of ``ci_group_size`` trees, less the Monte-Carlo noise (within-group variance
    / group size), made non-negative by the same posterior mean. Without sample weights
    ``den_b = 1`` and ``psi_b`` is the tree's leaf mean minus the forest's, grf's
    regression variance.

    Parameters
    ----------
    tree_values : ndarray of float64, shape (n, B, >= k + 2)
        Each tree's leaf values at each point: ``[num_0 .. num_{k-1}, rows, den]``.
        Trees ``q*L .. q*L+L-1`` form group ``q``; a trailing partial group is ignored.
    k : int
        Outputs.
    ci_group_size : int
        ``L >= 2``.
    valid : ndarray of bool, shape (n, B), optional
        Trees that may enter at each point (out-of-bag estimates: the trees that left
        the row out); a group counts only where all its trees may, as in grf.

    Returns
    -------
    mu : ndarray, shape (n, k)
        The estimate over the usable groups' trees.
    var : ndarray, shape (n, k)
        NaN where fewer than two groups are usable.
    """
    tree_values = np.asarray(tree_values, dtype=np.float64)
    L, G = _check_groups(ci_group_size, tree_values.shape[1])
    n = tree_values.shape[0]
    tv = tree_values[:, : G * L]
    num, den = tv[..., :k], tv[..., k + 1]
    usable = den > 0                                   # a leaf without weight says nothing
    if valid is not None:
        usable &= np.asarray(valid, dtype=bool)[:, : G * L]
    good = usable.reshape(n, G, L).all(axis=2)         # (n, G)
    n_good = good.sum(axis=1)
    gmask = np.repeat(good, L, axis=1)                 # (n, G*L)
    used = np.maximum(n_good * L, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        num_bar = np.where(gmask[..., None], num, 0.0).sum(axis=1) / used[:, None]
        den_bar = np.where(gmask, den, 0.0).sum(axis=1) / used
        mu = num_bar / den_bar[:, None]
        psi = np.where(gmask[..., None], (num - mu[:, None, :] * den[..., None]) / den_bar[:, None, None], 0.0)
    psi = psi.reshape(n, G, L, k)
    ng = np.maximum(n_good, 1)[:, None]
    group_mean = psi.mean(axis=2)                                        # (n, G, k)
    between = (group_mean ** 2).sum(axis=1) / ng
    within = ((psi - group_mean[:, :, None]) ** 2).sum(axis=(1, 2)) / (ng * (L - 1))
    with np.errstate(invalid="ignore"):
        mu3, var = _blb_finish(mu[..., None], between[..., None], within[..., None], n_good, L)
    return mu3[..., 0], var[..., 0]


def tree_jackknife_error(tree_values, k, valid, y):
    """grf's out-of-bag error decomposition of a regression forest's ratio estimate.

    Parameters
    ----------
    tree_values : ndarray of float64, shape (n, B, >= k + 2)
        Each tree's leaf values at each training row: ``[num_0 .. num_{k-1}, rows, den]``.
    k : int
    valid : ndarray of bool, shape (n, B)
        The trees that left each row out.
    y : ndarray of float64, shape (n, k)

    Returns
    -------
    debiased, excess : ndarray, shape (n, k)
        ``excess = sum_b (mu_b - mu)^2 / (B (B - 1))`` over the ``B`` valid trees with
        weight in the leaf (``mu_b = num_b / den_b``, ``mu = sum num / sum den``), and
        ``debiased = (mu - y)^2 - excess``; NaN where ``B < 2``.
    """
    num, den = tree_values[..., :k], tree_values[..., k + 1]
    use = np.asarray(valid, dtype=bool) & (den > 0)
    B = use.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        mu = np.where(use[..., None], num, 0.0).sum(axis=1) / np.where(use, den, 0.0).sum(axis=1)[:, None]
        mu_b = num / np.where(use, den, 1.0)[..., None]
        dev = np.where(use[..., None], (mu_b - mu[:, None, :]) ** 2, 0.0).sum(axis=1)
        excess = dev / (B * (B - 1.0))[:, None]
    excess[B < 2] = np.nan
    return (mu - y) ** 2 - excess, excess


#: NumPy's pairwise summation: blocks of at most this many terms are summed directly.
_PAIRWISE_BLOCK = 128


@compiled_only
def _pairwise_block(a, lo, n):
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        j = lo + i
        r0 += a[j]
        r1 += a[j + 1]
        r2 += a[j + 2]
        r3 += a[j + 3]
        r4 += a[j + 4]
        r5 += a[j + 5]
        r6 += a[j + 6]
        r7 += a[j + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@compiled_only
def _pairwise_sum(a, lo, n, stack, partial):
    """``sum(a[lo:lo+n])`` in NumPy's pairwise order (``add.reduce`` along a contiguous
    axis: blocks of up to 128 terms summed by eight accumulators, longer runs split in
    halves at multiples of 8 and the halves' sums added), so a compiled reduction
    gives NumPy's bits. The recursion runs on ``stack`` (int64, (3 * 64,)) and
    ``partial`` (float64, (64,)) scratch: Numba cannot cache recursive functions.
    """
    if n <= _PAIRWISE_BLOCK:
        return _pairwise_block(a, lo, n)
    sp = 0
    vp = 0
    stack[0], stack[1], stack[2] = lo, n, 0
    sp = 1
    while sp > 0:
        sp -= 1
        s_lo, s_n, done = stack[3 * sp], stack[3 * sp + 1], stack[3 * sp + 2]
        if s_n <= _PAIRWISE_BLOCK:
            partial[vp] = _pairwise_block(a, s_lo, s_n)
            vp += 1
        elif done:                               # both halves summed: left below right
            partial[vp - 2] = partial[vp - 2] + partial[vp - 1]
            vp -= 1
        else:
            half = s_n // 2
            half -= half % 8
            stack[3 * sp], stack[3 * sp + 1], stack[3 * sp + 2] = s_lo, s_n, 1
            stack[3 * sp + 3], stack[3 * sp + 4], stack[3 * sp + 5] = s_lo + half, s_n - half, 0
            stack[3 * sp + 6], stack[3 * sp + 7], stack[3 * sp + 8] = s_lo, half, 0
            sp += 3
    return partial[0]


@kernel
def _blb_sums_scalar(index, values, L, G, theta, between, within, n_good, a, b):
    """:func:`_blb_sums` for one treatment and one outcome, row by row, from leaf indices.

    ``values[index[i, t]]`` is tree ``t``'s leaf vector ``(g, w, y, wy, ww, count, ...)``
    for row ``i``. Every operation is :func:`_blb_sums`' NumPy operation on the same
    operands in the same order (tree sums in tree order, group means and sums of
    squares in NumPy's pairwise order), so the outputs are bitwise equal, without
    the ``(rows, trees, moments)`` array or its temporaries.
    """
    B = G * L
    good = empty(G, np.float64)                      # 1.0 / 0.0: the group mask as NumPy multiplies it
    tm = empty((B, 5), np.float64)                   # the row's tree moments, gathered once
    psi = empty(B, np.float64)
    sq = empty(B, np.float64)
    mean = empty(G, np.float64)
    stack = empty(3 * 64, np.int64)
    partial = empty(64, np.float64)
    for i in range(a, b):
        ng = 0
        s0 = s1 = s2 = s3 = s4 = 0.0
        t = 0
        for q in range(G):
            ok = True
            for _ in range(L):
                v = index[i, t]
                ok &= values[v, 5] > 0
                for c in range(5):
                    tm[t, c] = values[v, c]
                t += 1
            good[q] = 1.0 if ok else 0.0
            ng += ok
        t = 0
        for q in range(G):
            m = good[q]
            for _ in range(L):
                s0 += tm[t, 0] * m
                s1 += tm[t, 1] * m
                s2 += tm[t, 2] * m
                s3 += tm[t, 3] * m
                s4 += tm[t, 4] * m
                t += 1
        den = float(max(ng * L, 1))
        g, w, y, wy, ww = s0 / den, s1 / den, s2 / den, s3 / den, s4 / den
        A = g * ww - w * w
        rhs = g * wy - w * y
        scale = max(abs(A), 1e-300)
        ok = A > 1e-12 * scale
        th = rhs / (A if ok else 1.0)
        if not ok:
            th = np.nan
        A_safe = A if np.isfinite(th) else 1.0
        c = wy - ww * th
        r = y - th * w
        t = 0
        for q in range(G):
            m = good[q]
            for _ in range(L):
                u = g * (tm[t, 3] - tm[t, 4] * th)
                u += tm[t, 0] * c
                u -= tm[t, 1] * r
                u -= w * (tm[t, 2] - th * tm[t, 1])
                u *= m
                psi[t] = u / A_safe
                t += 1
        t = 0
        for q in range(G):
            mean[q] = _pairwise_sum(psi, t, L, stack, partial) / L
            sq[q] = mean[q] * mean[q]
            t += L
        ngs = max(ng, 1)
        between[i] = _pairwise_sum(sq, 0, G, stack, partial) / ngs
        t = 0
        for q in range(G):
            for _ in range(L):
                d = psi[t] - mean[q]
                sq[t] = d * d
                t += 1
        within[i] = _pairwise_sum(sq, 0, B, stack, partial) / (ngs * (L - 1))
        theta[i] = th
        n_good[i] = ng


@kernel(parallel=True)
def _par_blb_sums_scalar(index, values, L, G, theta, between, within, n_good, n_chunks):
    n = index.shape[0]
    for c in prange(n_chunks):
        _blb_sums_scalar(index, values, L, G, theta, between, within, n_good, c * n // n_chunks,
                         (c + 1) * n // n_chunks)


#: Rows per chunk of :func:`blb_predict` (bounds its leaf-index and moment buffers).
BLB_CHUNK_ELEMENTS = 8_000_000


def blb_predict(forest, X, layout, ci_group_size, chunk_rows=None):
    """Forest estimate and bootstrap-of-little-bags variance at new points.

    Equal, bit for bit, to :func:`blb_variance` of each tree's leaf moments at ``X``.
    For one treatment and one outcome of a causal layout the variance is computed
    row by row from the leaves each row reaches (:func:`_blb_sums_scalar`), never materialising the
    ``(rows, trees, moments)`` array; otherwise chunks of that array go through
    :func:`blb_variance`.

    Parameters
    ----------
    forest : dict
        Packed causal forest (node values: averaged moments, then the count).
    X : ndarray of float64, shape (n, n_features)
    layout : CausalChannels or InstrumentalChannels
    ci_group_size : int
    chunk_rows : int, optional
        Rows per chunk (default: about :data:`BLB_CHUNK_ELEMENTS` tree-row cells).

    Returns
    -------
    theta, var : ndarray, shape (n, K, M)
    """
    from forest.engine.predictor import batch_forest, leaf_value_index, run_rows

    n_trees = len(forest["tree_offsets"]) - 1
    L, G = _check_groups(ci_group_size, n_trees)
    K, M = layout.K, layout.M
    n = X.shape[0]
    width = layout.n_moments + 1
    if chunk_rows is None:
        chunk_rows = max(1, BLB_CHUNK_ELEMENTS // max(n_trees * (1 if K * M == 1 else width), 1))
    theta = np.empty((n, K, M))
    var = np.empty((n, K, M))
    batch = batch_forest(forest, n, X.shape[1])
    for lo in range(0, n, chunk_rows):
        hi = min(n, lo + chunk_rows)
        index, values = leaf_value_index(forest, X[lo:hi], batch)
        if K * M == 1 and not layout.has_instrument:
            m = hi - lo
            th, between, within = np.empty(m), np.empty(m), np.empty(m)
            n_good = np.empty(m, dtype=np.int64)
            run_rows(_blb_sums_scalar, _par_blb_sums_scalar, m, index, values, L, G, th, between, within, n_good)
            sums = (th.reshape(m, 1, 1), between.reshape(m, 1, 1), within.reshape(m, 1, 1), n_good)
        else:
            sums = _blb_sums(values[index], layout, L, G)
        theta[lo:hi], var[lo:hi] = _blb_finish(*sums, L)
    return theta, var


# ---------------------------------------------------------------------- AIPW
def instrumental_scores(tau, t, y, z, y_hat, t_hat, z_hat, compliance):
    """Doubly robust scores of the average (conditional local) treatment effect of an instrumental forest.

    grf's ``get_scores`` of an instrumental forest with a binary instrument:
    ``tau + (z - z_hat) / (z_hat (1 - z_hat) c) * (y - y_hat - tau (t - t_hat))`` with
    ``c(x)`` the compliance score ``E[t | z=1, x] - E[t | z=0, x]``. Their mean is the
    average of ``tau(x)`` (the average local effect among the population's covariates,
    weighted by nothing else), robust to errors in either the instrument propensity or
    the outcome model.

    Parameters
    ----------
    tau, t, y, z, y_hat, t_hat, z_hat, compliance : ndarray, shape (n,)
        ``z_hat`` is clipped into ``[PROPENSITY_CLIP, 1 - PROPENSITY_CLIP]``.

    Returns
    -------
    ndarray, shape (n,)
    """
    e = np.clip(z_hat, PROPENSITY_CLIP, 1.0 - PROPENSITY_CLIP)
    with np.errstate(divide="ignore", invalid="ignore"):
        weight = (z - e) / (e * (1.0 - e)) / compliance
    return tau + weight * (y - y_hat - tau * (t - t_hat))


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

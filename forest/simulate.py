"""Simulated treatment-effect designs with known effects.

Owns the data-generating processes used by the causal-forest tests, the demo and
the benchmarks. Every design returns a :class:`CausalData` holding the features,
treatment, outcome and the *true* conditional effect ``tau(x)`` (plus the true
propensity and baseline), so an estimate can be scored against the truth.

Designs
-------
``constant_effect``
    Confounded design (propensity and baseline both rise with ``x0``) with a
    constant effect. A forest that skips or botches local centering is biased.
``one_feature_effect``
    The effect is a step plus slope in a single feature; the baseline depends on
    other features, so importance must single out the effect feature.
``athey_wager``
    Wager and Athey (2018, JASA), heterogeneous design: ``X ~ U[0,1]^d``,
    ``e(x) = 0.5``, ``m(x) = 0``,
    ``tau(x) = offset + s(x1) s(x2)``, ``s(z) = 1 + 1/(1+exp(-20(z-1/3)))``.
    The paper uses ``offset = 0``; the project's benchmark specification uses
    ``offset = 1``, the default here. ``Y = m(X) + (W - e(X)) tau(X) + eps``.
``multi_arm``
    Categorical treatment with ``K`` arms against a control (codes ``0..K``),
    softmax propensities depending on ``x0``; one effect function per arm.
``continuous_treatment``
    Continuous treatment(s) ``W = a x0 + N(0,1)``; ``Y = m(X) + W . tau(X) + eps``.
``linear_confounded``
    Binary treatment with ``e(x) = 0.2 + 0.6 x0`` and the linear effect
    ``tau(x) = 1 + 3 x0 - x1``: the feature that drives treatment also drives the
    effect, so the effect on the treated (2.3), on everyone (2.0) and on the
    controls (1.7) differ, and the best linear projection of ``tau`` on
    ``(x0, x1)`` is ``(1, 3, -1)`` exactly.
``instrumental``
    Binary instrument, binary treatment confounded with the outcome through an
    unobserved ``U``, and a heterogeneous effect: the instrumental forest's design
    (:class:`IVData`, with the true local average treatment effect).
"""
from statistics import NormalDist
from typing import NamedTuple

import numpy as np


class CausalData(NamedTuple):
    """One simulated data set.

    Attributes
    ----------
    X : ndarray, shape (n, d)
    t : ndarray, shape (n,) or (n, K)
        Binary 0/1, arm codes 0..K (int), or continuous treatment.
    y : ndarray, shape (n,)
    tau : ndarray, shape (n,) or (n, K)
        True conditional treatment effect at each row.
    e : ndarray, shape (n,) or (n, K)
        True propensity ``P(W=1|x)`` (binary), arm probabilities ``P(W=k|x)`` for
        ``k = 1..K`` (multi-arm), or ``E[W|x]`` (continuous).
    m : ndarray, shape (n,)
        True conditional mean of the outcome, ``E[Y|x]``.
    """

    X: np.ndarray
    t: np.ndarray
    y: np.ndarray
    tau: np.ndarray
    e: np.ndarray
    m: np.ndarray


def _features(rng, n, d):
    if n < 1 or d < 1:
        raise ValueError(f"need n >= 1 and d >= 1, got n={n}, d={d}")
    return rng.uniform(0.0, 1.0, size=(n, d))


def aw_sigmoid(z):
    """``s(z) = 1 + 1 / (1 + exp(-20 (z - 1/3)))`` of Wager and Athey (2018)."""
    return 1.0 + 1.0 / (1.0 + np.exp(-20.0 * (np.asarray(z, dtype=np.float64) - 1.0 / 3.0)))


def athey_wager_tau(X, offset=1.0):
    """True effect of :func:`athey_wager`: ``offset + s(x1) s(x2)``.

    Parameters
    ----------
    X : ndarray, shape (n, d), d >= 2
    offset : float

    Returns
    -------
    ndarray, shape (n,)
    """
    X = np.asarray(X, dtype=np.float64)
    return offset + aw_sigmoid(X[:, 0]) * aw_sigmoid(X[:, 1])


def athey_wager(n, d=10, *, offset=1.0, noise=1.0, seed=0):
    """Wager-Athey heterogeneous design (see module docstring).

    Parameters
    ----------
    n, d : int
        Rows and features (``d >= 2``).
    offset : float
        Constant added to ``s(x1) s(x2)``.
    noise : float
        Standard deviation of the outcome noise.
    seed : int

    Returns
    -------
    CausalData
        ``t`` binary float, ``tau`` shape (n,).
    """
    if d < 2:
        raise ValueError(f"athey_wager needs d >= 2, got {d}")
    rng = np.random.default_rng(seed)
    X = _features(rng, n, d)
    e = np.full(n, 0.5)
    t = (rng.uniform(size=n) < e).astype(np.float64)
    tau = athey_wager_tau(X, offset)
    m = np.zeros(n)
    y = m + (t - e) * tau + noise * rng.standard_normal(n)
    return CausalData(X, t, y, tau, e, m)


def constant_effect(n, d=5, *, tau=2.0, noise=1.0, seed=0):
    """Confounded design with a constant effect.

    ``e(x) = 0.15 + 0.7 x0``, baseline ``mu0(x) = 3 x0 + x1``,
    ``Y = mu0(X) + tau W + eps``. Because ``x0`` drives both treatment and baseline,
    the naive treated-minus-control difference overstates ``tau`` by about 1.4.

    Returns
    -------
    CausalData
    """
    if d < 2:
        raise ValueError(f"constant_effect needs d >= 2, got {d}")
    rng = np.random.default_rng(seed)
    X = _features(rng, n, d)
    e = 0.15 + 0.7 * X[:, 0]
    t = (rng.uniform(size=n) < e).astype(np.float64)
    mu0 = 3.0 * X[:, 0] + X[:, 1]
    y = mu0 + tau * t + noise * rng.standard_normal(n)
    tau_vec = np.full(n, float(tau))
    return CausalData(X, t, y, tau_vec, e, mu0 + tau * e)


def one_feature_effect(n, d=6, *, feature=2, noise=1.0, seed=0):
    """Binary treatment whose effect depends on one feature only.

    ``tau(x) = 1 + 2 * 1[x_f > 0.5] + x_f`` with ``f = feature``; the baseline
    ``mu0(x) = 2 x0 + 2 x1`` and propensity ``e(x) = 0.3 + 0.4 x0`` involve other
    features so that the effect feature must be found through the treatment
    contrast, not the outcome level.

    Returns
    -------
    CausalData
    """
    if not 0 <= feature < d or d < 2:
        raise ValueError(f"need 0 <= feature < d and d >= 2, got feature={feature}, d={d}")
    rng = np.random.default_rng(seed)
    X = _features(rng, n, d)
    e = 0.3 + 0.4 * X[:, 0]
    t = (rng.uniform(size=n) < e).astype(np.float64)
    xf = X[:, feature]
    tau = 1.0 + 2.0 * (xf > 0.5) + xf
    mu0 = 2.0 * X[:, 0] + 2.0 * X[:, 1] if feature > 1 else 2.0 * X[:, 1 - feature]
    y = mu0 + tau * t + noise * rng.standard_normal(n)
    return CausalData(X, t, y, tau, e, mu0 + tau * e)


def multi_arm_tau(X, n_arms=2):
    """True per-arm effects of :func:`multi_arm`.

    Arm ``k`` (1-based) has ``tau_k(x) = (-1)^(k+1) k + 2 x_{k mod d}``: arm 1
    ``1 + 2 x1``, arm 2 ``-2 + 2 x2``, arm 3 ``3 + 2 x3``.

    Returns
    -------
    ndarray, shape (n, n_arms)
    """
    X = np.asarray(X, dtype=np.float64)
    d = X.shape[1]
    cols = []
    for k in range(1, n_arms + 1):
        sign = 1.0 if k % 2 == 1 else -1.0
        cols.append(sign * k + 2.0 * X[:, k % d])
    return np.column_stack(cols)


def multi_arm(n, d=5, *, n_arms=2, noise=1.0, seed=0):
    """Categorical treatment: control 0 and arms ``1..n_arms``.

    Arm probabilities are a softmax of ``(0, 0.8 x0, 0.8 x0 * 0.5, ...)``, so ``x0``
    confounds; baseline ``mu0(x) = 2 x0 + x1``; ``Y = mu0 + tau_W(X) + eps``.

    Returns
    -------
    CausalData
        ``t`` int codes (n,); ``tau`` and ``e`` shape (n, n_arms), ``e[:, k-1]`` the
        probability of arm ``k``.
    """
    if n_arms < 1:
        raise ValueError(f"n_arms must be >= 1, got {n_arms}")
    rng = np.random.default_rng(seed)
    X = _features(rng, n, d)
    logits = np.zeros((n, n_arms + 1))
    for k in range(1, n_arms + 1):
        logits[:, k] = 0.8 * X[:, 0] / k
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    u = rng.uniform(size=n)
    t = (u[:, None] > np.cumsum(p, axis=1)[:, :-1]).sum(axis=1).astype(np.int64)
    tau = multi_arm_tau(X, n_arms)
    mu0 = 2.0 * X[:, 0] + X[:, 1]
    tau_w = np.zeros(n)
    treated = t > 0
    tau_w[treated] = tau[treated, t[treated] - 1]
    y = mu0 + tau_w + noise * rng.standard_normal(n)
    m = mu0 + (p[:, 1:] * tau).sum(axis=1)
    return CausalData(X, t, y, tau, p[:, 1:], m)


def continuous_tau(X, n_treatments=1):
    """True effects of :func:`continuous_treatment`.

    Component ``j`` (0-based): ``tau_j(x) = (j + 1) (0.5 + x_{(j+1) mod d})``, i.e.
    ``tau_0 = 0.5 + x1``, ``tau_1 = 2 (0.5 + x2)``.

    Returns
    -------
    ndarray, shape (n,) if ``n_treatments == 1`` else (n, n_treatments)
    """
    X = np.asarray(X, dtype=np.float64)
    d = X.shape[1]
    cols = [(j + 1) * (0.5 + X[:, (j + 1) % d]) for j in range(n_treatments)]
    return cols[0] if n_treatments == 1 else np.column_stack(cols)


def continuous_treatment(n, d=5, *, n_treatments=1, confounding=1.0, noise=1.0, seed=0):
    """Continuous treatment(s) ``W_j = confounding * x0 + N(0, 1)`` (independent).

    ``Y = mu0(X) + sum_j W_j tau_j(X) + eps`` with ``mu0(x) = 2 x0 + x1``.

    Returns
    -------
    CausalData
        ``t`` shape (n,) or (n, n_treatments); ``tau`` likewise; ``e = E[W|x]``.
    """
    if n_treatments < 1:
        raise ValueError(f"n_treatments must be >= 1, got {n_treatments}")
    rng = np.random.default_rng(seed)
    X = _features(rng, n, d)
    ew = np.repeat((confounding * X[:, 0])[:, None], n_treatments, axis=1)
    W = ew + rng.standard_normal((n, n_treatments))
    tau = continuous_tau(X, n_treatments)
    tau2 = tau.reshape(n, -1)
    mu0 = 2.0 * X[:, 0] + X[:, 1]
    y = mu0 + (W * tau2).sum(axis=1) + noise * rng.standard_normal(n)
    m = mu0 + (ew * tau2).sum(axis=1)
    if n_treatments == 1:
        return CausalData(X, W[:, 0], y, tau, ew[:, 0], m)
    return CausalData(X, W, y, tau, ew, m)


def linear_confounded(n, d=5, *, noise=1.0, seed=0):
    """Confounded binary treatment with a linear, confounder-driven effect (module docstring).

    ``X ~ U[0,1]^d``, ``e(x) = 0.2 + 0.6 x0``, ``mu0(x) = 2 x0 + x2``,
    ``tau(x) = 1 + 3 x0 - x1``, ``Y = mu0 + W tau + eps``. Population averages:
    ATE 2.0, ATT 2.3, ATC 1.7.

    Returns
    -------
    CausalData
    """
    if d < 3:
        raise ValueError(f"linear_confounded needs d >= 3, got {d}")
    rng = np.random.default_rng(seed)
    X = _features(rng, n, d)
    e = 0.2 + 0.6 * X[:, 0]
    t = (rng.uniform(size=n) < e).astype(np.float64)
    tau = 1.0 + 3.0 * X[:, 0] - X[:, 1]
    mu0 = 2.0 * X[:, 0] + X[:, 2]
    y = mu0 + t * tau + noise * rng.standard_normal(n)
    return CausalData(X, t, y, tau, e, mu0 + e * tau)


class IVData(NamedTuple):
    """One simulated instrumental-variable data set.

    Attributes
    ----------
    X : ndarray, shape (n, d)
    t : ndarray, shape (n,)
        Binary 0/1 treatment.
    y : ndarray, shape (n,)
    z : ndarray, shape (n,)
        Binary 0/1 instrument.
    tau : ndarray, shape (n,)
        True local average treatment effect at each row (the effect of the compliers,
        here everyone's effect at ``x``).
    compliance : ndarray, shape (n,)
        True first stage ``P(W=1|Z=1,x) - P(W=1|Z=0,x)``.
    """

    X: np.ndarray
    t: np.ndarray
    y: np.ndarray
    z: np.ndarray
    tau: np.ndarray
    compliance: np.ndarray


def instrumental_tau(X):
    """``tau(x) = 1 + 2 * 1[x0 > 0.5] + x1`` of :func:`instrumental`."""
    return 1.0 + 2.0 * (X[:, 0] > 0.5) + X[:, 1]


def instrumental(n, d=5, *, strength=1.5, confounding=1.0, noise=1.0, seed=0):
    """Binary instrument and treatment with an unobserved confounder (module docstring).

    ``X ~ U[0,1]^d``; ``Z ~ Bernoulli(0.3 + 0.4 x2)``; ``U, V, eps ~ N(0, 1)``;
    ``W = 1[strength Z + U + V > 1]``; ``Y = 2 x2 + x3 + tau(x) W + 2 confounding U
    + noise eps`` with :func:`instrumental_tau`. ``U`` drives both ``W`` and ``Y``, so
    the treated-minus-control contrast overstates ``tau`` (by about 2 at
    ``confounding = 1``), while ``Z`` moves ``W`` only: the Wald ratio at ``x`` is
    ``tau(x)``. ``strength`` sets the first stage: 1.5 gives a compliance of 0.40,
    0.8 (weak-ish) 0.20.

    Returns
    -------
    IVData
    """
    if d < 4:
        raise ValueError(f"instrumental needs d >= 4, got {d}")
    rng = np.random.default_rng(seed)
    X = _features(rng, n, d)
    z = (rng.uniform(size=n) < 0.3 + 0.4 * X[:, 2]).astype(np.float64)
    u = rng.standard_normal(n)
    t = (strength * z + u + rng.standard_normal(n) > 1.0).astype(np.float64)
    tau = instrumental_tau(X)
    y = 2.0 * X[:, 2] + X[:, 3] + tau * t + 2.0 * confounding * u + noise * rng.standard_normal(n)
    # U + V ~ N(0, 2): P(W=1 | Z=z) = Phi((strength z - 1) / sqrt(2))
    phi = NormalDist(0.0, np.sqrt(2.0)).cdf
    compliance = np.full(n, phi(strength - 1.0) - phi(-1.0))
    return IVData(X, t, y, z, tau, compliance)

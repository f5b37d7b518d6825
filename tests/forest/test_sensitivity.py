"""Sensitivity to hidden confounding (issue 35): the omitted-variable-bias bounds of the doubly robust
ATE against a NumPy reference and a simulation with a known confounder, the robustness value's closed
form, the overlap warning, and the same numbers at any rank count."""
import math
import warnings

import numpy as np
import pytest
from scipy.special import expit

from native.comm import SelfCommunicator
from forest import CausalForest
from forest.analysis.sensitivity import SensitivityParameters, robustness_value, sensitivity_bounds

SELF = SelfCommunicator()


def _confounded(n, seed):
    """Y = W + A + x0 + noise with a hidden A that also drives W: the true ATE is 1."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    A = rng.normal(size=n)
    W = rng.binomial(1, expit(0.8 * A + 0.4 * X[:, 0])).astype(float)
    Y = W + A + X[:, 0] + rng.normal(size=n)
    return X, W, Y


def _true_strengths(X, seed=1):
    """c_y and c_t of the hidden A, by Monte Carlo over A at the rows' x0."""
    a = np.random.default_rng(seed).normal(size=50_000)
    x0 = X[:300, 0]
    p = expit(0.8 * a[:, None] + 0.4 * x0[None, :])                    # e_long(x, a)
    e_short = p.mean(axis=0)
    m1 = (p * a[:, None]).sum(axis=0) / p.sum(axis=0)                  # E[A | W = 1, x]
    m0 = ((1 - p) * a[:, None]).sum(axis=0) / (1 - p).sum(axis=0)
    var_a = 1.0 - (e_short * m1 ** 2 + (1 - e_short) * m0 ** 2)        # E[Var(A | W, x)]
    c_y = 1.0 - 1.0 / (1.0 + var_a.mean())                             # long residual variance 1
    riesz_short = np.mean(1 / e_short + 1 / (1 - e_short))
    riesz_long = np.mean(1 / p + 1 / (1 - p))
    return float(c_y), float(1.0 - riesz_short / riesz_long)


@pytest.fixture(scope="module")
def forest():
    X, W, Y = _confounded(5000, 0)
    return CausalForest(n_estimators=200, random_state=0).fit(X, W, Y, comm=SELF), X


def test_parameters_equal_the_numpy_reference(forest):
    f, _ = forest
    rows = f._oob_rows_
    e = np.clip(rows.t_hat[:, 0], 1e-3, 1 - 1e-3)
    W, tau = rows.W[:, 0], rows.tau[:, 0, 0]
    g = rows.y_hat[:, 0] + (W - rows.t_hat[:, 0]) * tau
    theta_s = rows.scores[:, 0, 0]
    sigma_s = (rows.Y[:, 0] - g) ** 2
    alpha = W / e - (1 - W) / (1 - e)
    nu_s = 2 * (1 / e + 1 / (1 - e)) - alpha ** 2
    S = np.stack([theta_s, sigma_s, nu_s], axis=1)
    n = len(S)
    mean = S.mean(axis=0)
    cov = (S - mean).T @ (S - mean) / n / n * n / (n - 1)
    r = f.sensitivity_analysis(0.1, 0.2, rho=0.5, alpha=0.1)
    assert r["estimate"] == pytest.approx(mean[0], rel=1e-10)
    assert r["sigma2"] == pytest.approx(mean[1], rel=1e-10) and r["nu2"] == pytest.approx(mean[2], rel=1e-10)
    half = 0.5 * math.sqrt(0.1 * 0.2 / 0.8) * math.sqrt(mean[1] * mean[2])
    assert r["lower"] == pytest.approx(mean[0] - half, rel=1e-10)
    assert r["upper"] == pytest.approx(mean[0] + half, rel=1e-10)
    C = 0.5 * math.sqrt(0.1 * 0.2 / 0.8)
    grad = np.array([1.0, 0.5 * C * math.sqrt(mean[2] / mean[1]), 0.5 * C * math.sqrt(mean[1] / mean[2])])
    z = 1.6448536269514722
    assert r["ci_upper"] == pytest.approx(mean[0] + half + z * math.sqrt(grad @ cov @ grad), rel=1e-9)
    assert f.sensitivity_analysis(0.0, 0.0)["ci_lower"] == pytest.approx(f.ate_ - 1.959963984540054 * f.ate_stderr_,
                                                                        rel=1e-9)


def test_bounds_at_the_true_confounding_cover_the_true_effect(forest):
    f, X = forest
    assert f.ate_ - 3 * f.ate_stderr_ > 1.3                # the confounded estimate is far from the truth, 1
    c_y, c_t = _true_strengths(X)
    r = f.sensitivity_analysis(c_y, c_t)
    assert r["lower"] < 1.0 < r["upper"]
    weak = f.sensitivity_analysis(0.02, 0.02)                 # a weak confounder cannot explain it away
    assert weak["ci_lower"] > 1.0
    # the strength that reaches the truth lies between the two
    rv = f.robustness_value(null_hypothesis=1.0, interval="estimate")
    assert 0.02 < rv < max(c_y, c_t)


def test_robustness_value_closed_form_and_monotone():
    p = SensitivityParameters(np.array([[0.3]]), np.array([[2.0]]), np.array([[5.0]]), np.zeros((1, 1, 3, 3)))
    k = 0.3 / math.sqrt(10.0)                           # r / sqrt(1 - r) = theta / sqrt(sigma2 nu2)
    r = (-k * k + math.sqrt(k ** 4 + 4 * k * k)) / 2
    assert robustness_value(p, interval="estimate")[0, 0] == pytest.approx(r, rel=1e-8)
    cov = np.diag([0.01, 0.1, 0.1])[None, None]
    p_noisy = p._replace(cov=cov)
    assert robustness_value(p_noisy)[0, 0] < r            # the confidence interval reaches the null sooner
    lo, hi, _, _ = sensitivity_bounds(p, r, r)
    assert lo[0, 0] == pytest.approx(0.0, abs=1e-7)
    p_null = p._replace(theta=np.array([[0.0]]))
    assert robustness_value(p_null)[0, 0] == 0.0


def test_bad_strengths_and_continuous_treatments_refused(forest):
    f, X = forest
    for kw, message in ((dict(c_y=1.0), "c_y must be"), (dict(c_t=-0.1), "c_t must be"), (dict(rho=2), "rho must")):
        with pytest.raises(ValueError, match=message):
            f.sensitivity_analysis(**kw)
    rng = np.random.default_rng(3)
    t = rng.normal(size=len(X))
    g = CausalForest(n_estimators=8, random_state=0).fit(X, t, t + rng.normal(size=len(X)), comm=SELF)
    with pytest.raises(ValueError, match="binary or categorical"):
        g.sensitivity_analysis()


def test_overlap_warning_names_the_propensities():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(3000, 3))
    W = rng.binomial(1, expit(4 * X[:, 0])).astype(float)
    f = CausalForest(n_estimators=20, random_state=0).fit(X, W, W + X[:, 1] + rng.normal(size=3000), comm=SELF)
    with pytest.warns(UserWarning, match=r"propensities range from 0\.0\d*.* to 0\.9"):
        f.average_treatment_effect()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f.average_treatment_effect(target="overlap")      # the overlap-weighted effect needs no warning


@pytest.mark.mpi
def test_same_bounds_at_any_rank_count(comm):
    X, W, Y = _confounded(1500, 5)
    lo, hi = len(W) * comm.rank // comm.size, len(W) * (comm.rank + 1) // comm.size
    kw = dict(n_estimators=16, nuisance_estimators=60, random_state=2)
    dist = CausalForest(**kw).fit(X[lo:hi], W[lo:hi], Y[lo:hi], comm=comm)
    ref = CausalForest(**kw).fit(X, W, Y, comm=SELF)
    a, b = dist.sensitivity_analysis(0.1, 0.1, comm=comm), ref.sensitivity_analysis(0.1, 0.1, comm=SELF)
    for key in ("estimate", "lower", "upper", "ci_lower", "ci_upper"):
        assert a[key] == pytest.approx(b[key], rel=0, abs=1e-9)
    assert dist.robustness_value(comm=comm) == pytest.approx(ref.robustness_value(comm=SELF), abs=1e-9)

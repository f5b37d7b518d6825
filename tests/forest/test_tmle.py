"""TMLE average effects (issue 38, grf's ``method="TMLE"``): a slow NumPy reference of the formula, double
robustness and coverage on rows with a known effect, closeness to AIPW on a fitted forest, the refusals grf
makes, the same figures at any rank count; and a subset holding one cluster refused in words."""
import numpy as np
import pytest

from native.comm import SelfCommunicator
from forest import simulate
from forest.analysis.average_effects import average_treatment_effect
from forest.analysis.effect_rows import make_effect_rows
from forest.analysis.tmle import tmle_average_effect
from forest.estimators.causal_forest import CausalForest

SELF = SelfCommunicator()
FAST = dict(max_bins=32, random_state=0)


def _known(n, seed, outcomes=1):
    """x ~ U(0,1), e = 0.2 + 0.6 x, tau = 1 + 2 x, E[Y(0)|x] = x (+ m per outcome column): ATE 2, ATT 2.2, ATC 1.8."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=n)
    e = 0.2 + 0.6 * x
    W = rng.binomial(1, e).astype(np.float64)
    tau = 1.0 + 2.0 * x
    shift = np.arange(outcomes, dtype=np.float64)
    Y = (x + W * tau)[:, None] + shift + rng.normal(size=(n, outcomes))
    return x, e, W, tau, Y


def _rows(tau_hat, W, Y, y_hat, e_hat, weight=None, layout=None):
    n = len(W)
    M = Y.shape[1]
    tau3 = np.broadcast_to(np.asarray(tau_hat, float).reshape(n, 1, -1), (n, 1, M)).copy()
    return make_effect_rows("binary", tau3, W.reshape(n, 1), W.astype(np.int64), Y, y_hat, e_hat.reshape(n, 1),
                            None, np.ones(n) if weight is None else weight, np.arange(n), layout)


def _reference(tau, W, Y, y_hat, e, target, keep):
    """grf's TMLE written the slow way: explicit least squares, hat matrices and HC3 per fluctuation."""
    e = np.clip(e, 1e-3, 1 - 1e-3)
    tau, W, Y, y_hat, e = tau[keep], W[keep], Y[keep], y_hat[keep], e[keep]
    mu0 = y_hat - e * tau
    mu1 = y_hat + (1 - e) * tau
    T, C = W == 1, W == 0

    def ols_hc3(a, r):
        A = a[:, None]
        coef = np.linalg.lstsq(A, r, rcond=None)[0][0]
        H = A @ np.linalg.inv(A.T @ A) @ A.T
        u = r - coef * a
        bread = np.linalg.inv(A.T @ A)
        meat = A.T @ np.diag((u / (1 - np.diag(H))) ** 2) @ A
        return coef, (bread @ meat @ bread)[0, 0]

    pop = {"all": np.ones(len(W), bool), "treated": T, "control": C}[target]
    raw = tau[pop].mean()
    var = np.sum((tau[pop] - raw) ** 2) / pop.sum() ** 2
    if target == "all":
        eps0, v0 = ols_hc3(1 / (1 - e[C]), Y[C] - mu0[C])
        eps1, v1 = ols_hc3(1 / e[T], Y[T] - mu1[T])
        mu1s, mu0s = mu1 + eps1 / e, mu0 + eps0 / (1 - e)
        est = np.mean(mu1s - mu0s)
        var += v0 * np.mean(1 / (1 - e)) ** 2 + v1 * np.mean(1 / e) ** 2
    elif target == "treated":
        eps0, v0 = ols_hc3(e[C] / (1 - e[C]), Y[C] - mu0[C])
        mu0s = mu0 + eps0 * e / (1 - e)
        mu1s = mu1 + np.mean(Y[T] - mu1[T])
        est = np.mean((mu1s - mu0s)[T])
        var += v0 * np.mean(e[T] / (1 - e[T])) ** 2 + np.var(Y[T] - mu1[T], ddof=1) / T.sum()
    else:
        eps1, v1 = ols_hc3((1 - e[T]) / e[T], Y[T] - mu1[T])
        mu1s = mu1 + eps1 * (1 - e) / e
        mu0s = mu0 + np.mean(Y[C] - mu0[C])
        est = np.mean((mu1s - mu0s)[C])
        var += v1 * np.mean((1 - e[C]) / e[C]) ** 2 + np.var(Y[C] - mu0[C], ddof=1) / C.sum()
    return est, np.sqrt(var)


@pytest.mark.parametrize("target", ["all", "treated", "control"])
def test_matches_a_slow_reference(target):
    x, e, W, tau, Y = _known(700, 1, outcomes=2)
    rng = np.random.default_rng(2)
    tau_hat = tau + rng.normal(scale=0.5, size=700)            # noisy nuisances, so every term matters
    e_hat = np.clip(e + rng.normal(scale=0.05, size=700), 0.0005, 0.9995)   # some clipped
    e_hat[:3] = [0.0, 1.0, 0.9999]
    y_hat = (x + e_hat * tau_hat)[:, None] + np.array([0.0, 1.0]) + 0.3
    keep = x < 0.8                                               # a subset
    rows = _rows(tau_hat, W, Y, y_hat, e_hat)
    est, se = average_treatment_effect(SELF, rows, target, subset=keep, method="TMLE")
    assert est.shape == se.shape == (1, 2)
    for m in range(2):
        ref = _reference(tau_hat, W, Y[:, m], y_hat[:, m], e_hat, target, keep)
        np.testing.assert_allclose([est[0, m], se[0, m]], ref, rtol=1e-11)


def test_doubly_robust_and_covers_with_a_wrong_outcome_model():
    """True propensities, a wrong effect and outcome model (tau_hat = 1 + x, no baseline): TMLE is unbiased
    and its intervals cover all three targets, beside AIPW's."""
    errors = {t: [] for t in ("all", "treated", "control")}
    ses = {t: [] for t in errors}
    for seed in range(20):
        x, e, W, tau, Y = _known(4000, 100 + seed)
        tau_hat = 1.0 + x                                       # truth 1 + 2 x; y_hat lacks the baseline x
        rows = _rows(tau_hat, W, Y, (e * tau_hat)[:, None], e)
        truth = {"all": tau.mean(), "treated": tau[W == 1].mean(), "control": tau[W == 0].mean()}
        for target in truth:
            est, se = average_treatment_effect(SELF, rows, target, method="TMLE")
            a_est, a_se = average_treatment_effect(SELF, rows, target)
            errors[target].append(est[0, 0] - truth[target])
            ses[target].append(se[0, 0])
            assert abs(est[0, 0] - a_est[0, 0]) < 2.5 * a_se[0, 0], (target, est, a_est, a_se)
            # AIPW's treated/control errors use uncentred moments (grf's formula): larger under misfit
            assert 0.65 < se[0, 0] / a_se[0, 0] < 1.35, (target, se, a_se)
    for target in errors:
        err, se = np.array(errors[target]), np.array(ses[target])
        # the plain mean of tau_hat is off by 0.5 (all), 0.6 (treated), 0.4 (control); the outcome
        # residual mean that grf's code leaves out of "treated"/"control" is of the same order
        assert abs(err.mean()) < 0.03, (target, err.mean())
        assert np.sum(np.abs(err) < 1.96 * se) >= 16, (target, err / se)
        assert 0.6 < err.std() / se.mean() < 1.5, (target, err.std(), se.mean())


@pytest.fixture(scope="module")
def linear():
    d = simulate.linear_confounded(2500, seed=3)
    return d, CausalForest(60, **FAST).fit(d.X, d.t, d.y, comm=SELF)


def test_close_to_aipw_on_a_fitted_forest(linear):
    d, cf = linear
    truth = {"all": d.tau.mean(), "treated": d.tau[d.t == 1].mean(), "control": d.tau[d.t == 0].mean()}
    for target, value in truth.items():
        est, se = cf.average_treatment_effect(target, method="TMLE", comm=SELF)
        a_est, a_se = cf.average_treatment_effect(target, comm=SELF)
        assert np.ndim(est) == 0
        assert abs(est - a_est) < 0.3 * a_se, (target, est, a_est, a_se)
        assert 0.85 < se / a_se < 1.15, (target, se, a_se)
        assert abs(est - value) < 3.5 * se, (target, est, se, value)
    sub = d.X[:, 0] > 0.5
    est, se = cf.average_treatment_effect(subset=sub, method="TMLE", comm=SELF)
    assert abs(est - d.tau[sub].mean()) < 3.5 * se
    test = simulate.linear_confounded(600, seed=4)                 # held-out rows
    est, se = cf.average_treatment_effect(X=test.X, t=test.t, y=test.y, method="TMLE", comm=SELF)
    assert abs(est - test.tau.mean()) < 3.5 * se


def test_refusals(linear):
    d, cf = linear
    with pytest.raises(ValueError, match="overlap.*AIPW only"):
        cf.average_treatment_effect("overlap", method="TMLE", comm=SELF)
    with pytest.raises(ValueError, match="method must be one of"):
        cf.average_treatment_effect(method="tmle", comm=SELF)
    held = simulate.linear_confounded(300, seed=6)
    weights = np.where(held.X[:, 0] > 0.5, 2.0, 1.0)
    with pytest.raises(ValueError, match="no sample weights"):
        cf.average_treatment_effect(X=held.X, t=held.t, y=held.y, sample_weight=weights, method="TMLE", comm=SELF)
    n = 50
    rng = np.random.default_rng(0)
    Y = rng.normal(size=(n, 1))
    arms = make_effect_rows("categorical", np.zeros((n, 2, 1)), np.zeros((n, 2)), rng.integers(0, 3, n), Y,
                            np.zeros((n, 1)), np.full((n, 2), 0.3), None, np.ones(n), np.arange(n), None)
    with pytest.raises(ValueError, match="binary treatment.*multi-arm"):
        average_treatment_effect(SELF, arms, method="TMLE")
    cont = make_effect_rows("continuous", np.zeros((n, 1, 1)), rng.normal(size=(n, 1)), None, Y, np.zeros((n, 1)),
                            np.zeros((n, 1)), np.ones((n, 1, 1)), np.ones(n), np.arange(n), None)
    with pytest.raises(ValueError, match="binary treatment.*continuous"):
        average_treatment_effect(SELF, cont, method="TMLE")
    one_treated = _rows(np.zeros(n), (np.arange(n) == 0).astype(float), Y, np.zeros((n, 1)), np.full(n, 0.5))
    with pytest.raises(ValueError, match="at least two treated and two control"):
        tmle_average_effect(SELF, one_treated, np.ones(n), "all")


@pytest.mark.filterwarnings("ignore:estimated treatment propensities")     # four nuisance trees
def test_clusters_refused_and_a_single_cluster_said_in_words():
    d = simulate.linear_confounded(400, d=3, seed=5)
    labels = np.arange(400) // 40
    cf = CausalForest(8, nuisance_estimators=4, max_bins=16, random_state=0).fit(d.X, d.t, d.y, clusters=labels,
                                                                                comm=SELF)
    with pytest.raises(ValueError, match="no cluster-robust form"):
        cf.average_treatment_effect(method="TMLE", comm=SELF)
    one = labels == 3
    for target in ("all", "treated", "control"):
        with pytest.raises(ValueError, match="lie in 1 cluster .*need at least two clusters"):
            cf.average_treatment_effect(target, subset=one, comm=SELF)
    with pytest.raises(ValueError, match="lie in 1 cluster: cluster-robust standard errors need at least two"):
        cf.average_treatment_effect("overlap", subset=one, comm=SELF)      # was a standard error of 1e-16
    est, se = cf.average_treatment_effect("overlap", subset=labels < 2, comm=SELF)     # two clusters: fine
    assert se > 0.01


@pytest.mark.mpi
def test_same_figures_at_any_rank_count(comm):
    lo, hi = 1500 * comm.rank // comm.size, 1500 * (comm.rank + 1) // comm.size
    x, e, W, tau, Y = _known(1500, 7, outcomes=2)
    rng = np.random.default_rng(8)
    tau_hat = tau + rng.normal(scale=0.3, size=1500)
    y_hat = (x + e * tau_hat)[:, None] + np.array([0.0, 1.0])
    keep = x > 0.1
    part = slice(lo, hi)
    got, ref = [], []
    for target in ("all", "treated", "control"):
        got.append(average_treatment_effect(comm, _rows(tau_hat[part], W[part], Y[part], y_hat[part], e[part]),
                                            target, subset=keep[part], method="TMLE"))
        ref.append(average_treatment_effect(SELF, _rows(tau_hat, W, Y, y_hat, e), target, subset=keep,
                                            method="TMLE"))
    d = simulate.linear_confounded(900, d=3, seed=9)
    kw = dict(n_estimators=16, nuisance_estimators=20, max_bins=32, random_state=1)
    rows = slice(900 * comm.rank // comm.size, 900 * (comm.rank + 1) // comm.size)
    dist = CausalForest(**kw).fit(d.X[rows], d.t[rows], d.y[rows], comm=comm)
    one = CausalForest(**kw).fit(d.X, d.t, d.y, comm=SELF)
    forest_got = dist.average_treatment_effect("treated", method="TMLE", comm=comm)
    forest_ref = one.average_treatment_effect("treated", method="TMLE", comm=SELF)
    for (a, b), (c, f) in zip(got, ref):
        np.testing.assert_allclose(a, c, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(b, f, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(forest_got, forest_ref, rtol=1e-10, atol=1e-12)

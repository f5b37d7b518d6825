"""CausalForest: known answers on simulated designs, intervals, API, and rank-count invariance."""
import numpy as np
import pytest
from sklearn.base import clone

from forest import simulate
from forest.estimators.causal_forest import CausalForest
from forest.io.training_rows import TrainingRowsNotice
from native.comm import SelfCommunicator
from tests.conftest import block_slice

SELF = SelfCommunicator()
FAST = dict(max_bins=32, random_state=0)


def test_constant_effect_recovered_despite_confounding():
    d = simulate.constant_effect(2000, d=4, seed=1)
    # the naive contrast is far off: the test cannot pass without centering
    naive = d.y[d.t == 1].mean() - d.y[d.t == 0].mean()
    assert naive - 2.0 > 0.5
    cf = CausalForest(60, **FAST).fit(d.X, d.t, d.y, comm=SELF)
    test = simulate.constant_effect(400, d=4, seed=2)
    tau = cf.predict(test.X)
    assert tau.shape == (400,)
    assert abs(tau.mean() - 2.0) < 0.12
    est, se = cf.average_treatment_effect()
    assert np.ndim(est) == 0 and 0.02 < se < 0.15
    assert abs(est - 2.0) < 3 * se
    oob = cf.oob_predict(d.X, comm=SELF)
    assert oob.shape == (2000,) and abs(oob.mean() - 2.0) < 0.12


def test_user_nuisances_are_used():
    """Passing the true nuisances gives the same answer; a wrong sign of centering breaks it."""
    d = simulate.constant_effect(2000, d=4, seed=3)
    good = CausalForest(40, **FAST).fit(d.X, d.t, d.y, y_hat=d.m, t_hat=d.e, comm=SELF)
    assert abs(good.predict(d.X[:300]).mean() - 2.0) < 0.12
    bad = CausalForest(40, **FAST).fit(d.X, d.t, d.y, y_hat=np.zeros(2000), t_hat=np.full(2000, 0.5), comm=SELF)
    assert abs(bad.predict(d.X[:300]).mean() - 2.0) > 0.3


def test_effect_on_one_feature_found_and_ranked_first():
    d = simulate.one_feature_effect(2500, d=6, feature=2, seed=4)
    cf = CausalForest(60, **FAST).fit(d.X, d.t, d.y, comm=SELF)
    assert np.argmax(cf.feature_importances_) == 2
    assert np.argmax(cf.gain_importances_) == 2
    assert cf.feature_importances_.sum() == pytest.approx(1.0)
    test = simulate.one_feature_effect(500, d=6, feature=2, seed=5)
    pred = cf.predict(test.X)
    assert np.corrcoef(pred, test.tau)[0, 1] > 0.85
    assert np.sqrt(np.mean((pred - test.tau) ** 2)) < 0.5          # tau has sd ~1.2


def test_multi_arm_effects_recovered():
    d = simulate.multi_arm(2400, d=4, n_arms=2, seed=6)
    cf = CausalForest(40, **FAST).fit(d.X, d.t, d.y, comm=SELF)
    assert cf.treatment_type_ == "categorical"
    test = simulate.multi_arm(500, d=4, n_arms=2, seed=7)
    pred = cf.predict(test.X)
    assert pred.shape == (500, 2)
    for k in range(2):
        assert abs(pred[:, k].mean() - test.tau[:, k].mean()) < 0.2, k
        assert np.corrcoef(pred[:, k], test.tau[:, k])[0, 1] > 0.6, k
    est, se = cf.average_treatment_effect()
    assert est.shape == (2,)
    assert np.all(np.abs(est - d.tau.mean(axis=0)) < 3.5 * se + 0.03)


@pytest.mark.parametrize("n_treatments", [1, 2])
def test_continuous_treatment_recovered(n_treatments):
    d = simulate.continuous_treatment(2000, d=4, n_treatments=n_treatments, seed=8)
    cf = CausalForest(40, **FAST).fit(d.X, d.t, d.y, comm=SELF)
    assert cf.treatment_type_ == "continuous"
    test = simulate.continuous_treatment(400, d=4, n_treatments=n_treatments, seed=9)
    pred = cf.predict(test.X).reshape(400, -1)
    tau = test.tau.reshape(400, -1)
    for k in range(n_treatments):
        assert abs(pred[:, k].mean() - tau[:, k].mean()) < 0.15 * (k + 1), k
        assert np.corrcoef(pred[:, k], tau[:, k])[0, 1] > 0.8, k
    est, se = cf.average_treatment_effect()
    assert np.all(np.abs(np.ravel(est) - d.tau.reshape(2000, -1).mean(axis=0)) < 3.5 * np.ravel(se) + 0.03)


@pytest.mark.slow
def test_interval_coverage_athey_wager():
    """95% BLB intervals cover tau(x) on average (small version of the n=4000, d=10 check)."""
    covs = []
    for seed in range(2):
        d = simulate.athey_wager(1500, d=5, seed=seed)
        cf = CausalForest(160, max_bins=32, random_state=seed).fit(d.X, d.t, d.y, comm=SELF)
        test = simulate.athey_wager(300, d=5, seed=100 + seed)
        lo, hi = cf.predict_interval(test.X, alpha=0.05)
        assert np.all(lo < hi)
        covs.append(np.mean((lo <= test.tau) & (test.tau <= hi)))
    assert np.mean(covs) >= 0.85, covs


def test_variance_shrinks_with_data_and_intervals_are_centered():
    small = simulate.athey_wager(600, d=3, seed=10)
    large = simulate.athey_wager(2400, d=3, seed=10)
    X = simulate.athey_wager(100, d=3, seed=11).X
    v_small = CausalForest(40, **FAST).fit(small.X, small.t, small.y, comm=SELF).predict_var(X)
    cf = CausalForest(40, **FAST).fit(large.X, large.t, large.y, comm=SELF)
    v_large = cf.predict_var(X)
    assert np.all(v_small >= 0) and np.all(v_large >= 0)
    assert np.median(v_large) < 0.9 * np.median(v_small)
    lo, hi = cf.predict_interval(X, alpha=0.1)
    np.testing.assert_allclose((lo + hi) / 2, cf.predict(X), rtol=1e-9, atol=1e-9)


def test_api_and_errors():
    d = simulate.constant_effect(300, d=3, seed=12)
    cf = CausalForest(8, **FAST)
    assert clone(cf).get_params() == cf.get_params()
    with pytest.raises(Exception):
        cf.predict(d.X)
    with pytest.raises(ValueError, match="max_samples"):
        CausalForest(8, max_samples=0.8).fit(d.X, d.t, d.y, comm=SELF)
    with pytest.raises(ValueError, match="rows"):
        CausalForest(8).fit(d.X, d.t[:-1], d.y, comm=SELF)
    with pytest.raises(ValueError, match="single value"):
        CausalForest(8, treatment_type="binary").fit(d.X, np.zeros(300), d.y, comm=SELF)
    with pytest.raises(ValueError, match="treatment_type"):
        CausalForest(8, treatment_type="dose").fit(d.X, d.t, d.y, comm=SELF)
    with pytest.raises(ValueError, match="y_hat"):
        CausalForest(8).fit(d.X, d.t, d.y, y_hat=np.zeros(5), comm=SELF)
    cf.fit(d.X, d.t, d.y, comm=SELF)
    with pytest.raises(ValueError, match="features"):
        cf.predict(d.X[:, :2])
    with pytest.raises(ValueError, match="ci_group_size"):
        CausalForest(8, ci_group_size=1, **FAST).fit(d.X, d.t, d.y, comm=SELF).predict_var(d.X)


@pytest.mark.mpi
def test_same_forest_for_any_rank_count(comm):
    """Each rank fits its block; the forest equals the single-process fit on all rows."""
    d = simulate.athey_wager(900, d=4, seed=13)
    kw = dict(n_estimators=12, nuisance_estimators=6, max_bins=32, random_state=3)
    sl = block_slice(900, comm.size, comm.rank)
    dist = CausalForest(**kw).fit(d.X[sl], d.t[sl], d.y[sl], comm=comm)
    ref = CausalForest(**kw).fit(d.X, d.t, d.y, comm=SELF)
    test = simulate.athey_wager(200, d=4, seed=14).X
    same_feature = np.array_equal(dist.estimators_["feature"], ref.estimators_["feature"])
    same_bin = np.array_equal(dist.estimators_["bin_threshold"], ref.estimators_["bin_threshold"])
    pred_diff = np.max(np.abs(dist.predict(test) - ref.predict(test)))
    var_diff = np.max(np.abs(dist.predict_var(test) - ref.predict_var(test)))
    ate_diff = abs(dist.ate_ - ref.ate_) + abs(dist.ate_stderr_ - ref.ate_stderr_)
    oob_diff = np.max(np.abs(dist.oob_predict(d.X[sl], comm=comm) - ref.oob_predict(d.X, comm=SELF)[sl]))
    assert same_feature and same_bin
    assert pred_diff < 1e-9 and var_diff < 1e-9 and oob_diff < 1e-9
    assert ate_diff < 1e-9


@pytest.mark.parametrize("n_treatments", [1, 2])
def test_continuous_treatment_fits_without_warnings(n_treatments):
    """The Var[W|x] forest of a scalar dose gets a 1-D target: no internal DataConversionWarning."""
    import warnings

    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    t = rng.normal(size=(200, n_treatments)).squeeze()
    y = X[:, 0] + X[:, 1] * np.atleast_2d(t.T)[0] + rng.normal(size=200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cf = CausalForest(n_estimators=20, random_state=0).fit(X, t, y, comm=SELF)
    with pytest.warns(TrainingRowsNotice):          # the training rows: out-of-bag scores
        scores = cf.dr_scores(X, t, y)
    assert cf.treatment_type_ == "continuous" and np.isfinite(scores).all()
    np.testing.assert_array_equal(scores, cf.get_scores())
    assert cf.treatment_variance_forest_.predict(X).reshape(200, -1).shape[1] == n_treatments * (n_treatments + 1) // 2


def test_warm_start_needs_the_first_fits_treatment_and_outcome():
    """Adding trees for another treatment (type, levels, shape) or outcome shape is a clear error, not a
    reshape failure deep in the nuisance forests."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    t = rng.integers(0, 2, size=200)
    y = X[:, 0] + t * X[:, 1] + rng.normal(size=200)
    cf = CausalForest(n_estimators=10, warm_start=True, random_state=0).fit(X, t, y, comm=SELF)
    cf.set_params(n_estimators=20)
    cases = [
        (np.arange(200) % 3, y, r"t is a categorical treatment with levels \[0, 1, 2\], the forest was fitted on a "
                                r"binary treatment with levels \[0, 1\]"),
        (t + 1, y, r"t is a binary treatment with levels \[1, 2\]"),
        (rng.normal(size=200), y, "t is a continuous treatment with 1 column,"),
        (t, np.column_stack([y, y]), r"y has shape \(n, 2\), the forest was fitted on y of shape \(n,\)"),
    ]
    for t_new, y_new, match in cases:
        with pytest.raises(ValueError, match="^warm start: " + match):
            cf.fit(X, t_new, y_new, comm=SELF)
    with pytest.raises(ValueError, match="warm start: t is a binary treatment"):   # even with no tree to add
        cf.set_params(n_estimators=10).fit(X, t + 1, y, comm=SELF)
    assert len(cf.estimators_["tree_offsets"]) == 11        # the refused fits changed nothing
    cf.set_params(n_estimators=20).fit(X, t, y, comm=SELF)   # the same treatment adds the trees
    assert len(cf.estimators_["tree_offsets"]) == 21
    dose = CausalForest(n_estimators=10, warm_start=True, random_state=0).fit(X, rng.normal(size=200), y, comm=SELF)
    with pytest.raises(ValueError, match="t is a continuous treatment with 2 columns, the forest was fitted on a "
                                         "continuous treatment with 1 column;"):
        dose.set_params(n_estimators=20).fit(X, rng.normal(size=(200, 2)), y, comm=SELF)


def test_sample_weight_scale_does_not_change_the_causal_forest():
    # Equal weights on any scale are an unweighted fit, bit for bit; weights of 1e-160
    # used to underflow in the criterion's products (NaN effects and intervals).
    rng = np.random.default_rng(11)
    X = rng.normal(size=(300, 3))
    t = (rng.uniform(size=300) < 0.5).astype(float)
    y = X[:, 0] + t * (1 + X[:, 1]) + rng.normal(size=300)
    kw = dict(n_estimators=12, nuisance_estimators=6, random_state=0)
    base = CausalForest(**kw).fit(X, t, y, comm=SELF)
    lo, hi = base.predict_interval(X[:5])
    for c in (1e-160, 1e-6, 0.1, 3.0, 1e100):
        cf = CausalForest(**kw).fit(X, t, y, sample_weight=np.full(300, c), comm=SELF)
        np.testing.assert_array_equal(cf.predict(X[:5]), base.predict(X[:5]), err_msg=str(c))
        np.testing.assert_array_equal(cf.predict_interval(X[:5])[0], lo, err_msg=str(c))
        assert cf.ate_ == base.ate_ and cf.ate_stderr_ == base.ate_stderr_
    # unequal tiny weights: finite, and the effect of the same weights at scale 1
    w = rng.uniform(0.5, 1.5, size=300)
    tiny = CausalForest(**kw).fit(X, t, y, sample_weight=w * 1e-160, comm=SELF)
    unit = CausalForest(**kw).fit(X, t, y, sample_weight=w, comm=SELF)
    assert np.isfinite(tiny.predict(X)).all() and np.isfinite(tiny.predict_interval(X[:5])).all()
    assert abs(tiny.ate_ - unit.ate_) < 0.05

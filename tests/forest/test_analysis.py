"""grf's analysis toolkit on CausalForest: known answers, held-out scores, model files, clusters."""
import json

import numpy as np
import pytest

from forest import simulate

from forest.io import model_io
from forest.analysis.result import EstimateTable, RATEResult
from forest.estimators.causal_forest import CausalForest
from native.comm import SelfCommunicator

SELF = SelfCommunicator()
FAST = dict(max_bins=32, random_state=0)


@pytest.fixture(scope="module")
def linear():
    """tau = 1 + 3 x0 - x1 with e = 0.2 + 0.6 x0: ATT 2.3, ATE 2.0, ATC 1.7, BLP (1, 3, -1)."""
    d = simulate.linear_confounded(3000, seed=1)
    cf = CausalForest(60, **FAST).fit(d.X, d.t, d.y, comm=SELF)
    return d, cf


def _within(est, se, truth, k=3.5):
    return np.all(np.abs(np.asarray(est) - truth) < k * np.asarray(se))


def test_targets_under_confounding_with_heterogeneity(linear):
    d, cf = linear
    truth = {"all": d.tau.mean(), "treated": d.tau[d.t == 1].mean(), "control": d.tau[d.t == 0].mean(),
             "overlap": np.sum(d.e * (1 - d.e) * d.tau) / np.sum(d.e * (1 - d.e))}
    got = {target: cf.average_treatment_effect(target, comm=SELF) for target in truth}
    for target, (est, se) in got.items():
        assert np.ndim(est) == 0 and 0.02 < se < 0.1, (target, est, se)
        assert _within(est, se, truth[target]), (target, est, se, truth[target])
    assert got["treated"][0] - got["control"][0] > 0.35            # truth: 0.56
    np.testing.assert_allclose(got["all"], (cf.ate_, cf.ate_stderr_))
    sub = d.X[:, 0] > 0.5
    est, se = cf.average_treatment_effect(subset=sub, comm=SELF)
    assert _within(est, se, d.tau[sub].mean())


def test_best_linear_projection_of_a_linear_effect(linear):
    d, cf = linear
    blp = cf.best_linear_projection(d.X[:, :2], names=["x0", "x1"], comm=SELF)
    assert isinstance(blp, EstimateTable)
    assert blp.terms == ["(Intercept)", "x0", "x1"]
    assert blp.estimate.shape == blp.stderr.shape == blp.pvalue.shape == (3,)
    assert _within(blp.estimate, blp.stderr, [1.0, 3.0, -1.0]), str(blp)
    assert blp.pvalue[1] < 1e-6
    lo, hi = blp.conf_int(0.05)
    assert np.all(lo < blp.estimate) and np.all(blp.estimate < hi)
    ate = cf.best_linear_projection(comm=SELF)                      # intercept only: the ATE
    assert ate.estimate[0] == pytest.approx(cf.ate_, rel=1e-10)
    json.dumps(blp.to_dict())
    assert "x0" in str(blp) and "(Intercept)" in str(blp)
    A = d.X[:, :2].copy()
    A[::7, 1] = np.nan                                              # rows with a missing covariate are left out
    with_nan = cf.best_linear_projection(A, comm=SELF)
    kept = np.ones(3000, bool)
    kept[::7] = False
    on_subset = cf.best_linear_projection(d.X[:, :2], subset=kept, comm=SELF)
    np.testing.assert_allclose(with_nan.estimate, on_subset.estimate, rtol=1e-12)
    np.testing.assert_allclose(with_nan.stderr, on_subset.stderr, rtol=1e-12)
    # a DataFrame's (or Series') column names name the terms; names= still wins
    import pandas as pd

    frame = pd.DataFrame(d.X[:, :2], columns=["age", "income"])
    named = cf.best_linear_projection(frame, comm=SELF)
    assert named.terms == ["(Intercept)", "age", "income"]
    np.testing.assert_allclose(named.estimate, blp.estimate, rtol=1e-12)  # (a frame is column-major)
    assert cf.best_linear_projection(frame["age"], comm=SELF).terms == ["(Intercept)", "age"]
    assert cf.best_linear_projection(frame, names=["a", "b"], comm=SELF).terms == ["(Intercept)", "a", "b"]


def test_calibration_coefficients_near_one(linear):
    _, cf = linear
    cal = cf.test_calibration(comm=SELF)
    assert cal.terms == ["mean.forest.prediction", "differential.forest.prediction"]
    assert _within(cal.estimate, cal.stderr, [1.0, 1.0]), str(cal)
    assert cal.alternative == "greater" and cal.pvalue[1] < 1e-6


def test_rate_positive_with_heterogeneity_and_zero_without(linear):
    d, cf = linear
    test = simulate.linear_confounded(3000, seed=2)
    prio = cf.predict(test.X)
    autoc = cf.rank_average_treatment_effect(prio, test.X, test.t, test.y, n_bootstrap=100, comm=SELF)
    qini = cf.rank_average_treatment_effect(prio, test.X, test.t, test.y, target="QINI", n_bootstrap=100, comm=SELF)
    assert isinstance(autoc, RATEResult) and autoc.toc.shape == (10,) and autoc.q[-1] == 1.0
    for res in (autoc, qini):
        assert res.estimate[0] / res.stderr[0] > 4, str(res)
    # the TOC with the true priorities: E[tau | top q] - E[tau] > 0 and decreasing in q
    assert autoc.toc[0] > autoc.toc[4] > 0
    flat = simulate.constant_effect(3000, d=5, seed=3)
    cf0 = CausalForest(40, **FAST).fit(flat.X, flat.t, flat.y, comm=SELF)
    held = simulate.constant_effect(3000, d=5, seed=4)
    null = cf0.rank_average_treatment_effect(cf0.predict(held.X), held.X, held.t, held.y, n_bootstrap=100,
                                             comm=SELF)
    assert abs(null.estimate[0]) < 3 * null.stderr[0], str(null)
    oob = cf.rank_average_treatment_effect(d.X[:, 0], n_bootstrap=50, comm=SELF)     # OOB scores
    assert oob.estimate[0] > 3 * oob.stderr[0]
    assert "TOC" in str(autoc)
    json.dumps(autoc.to_dict())


def test_scores_oob_and_held_out(linear):
    d, cf = linear
    assert cf.dr_scores_.shape == (3000,)
    np.testing.assert_array_equal(cf.get_scores(), cf.dr_scores_)
    sub = d.X[:, 1] < 0.3
    np.testing.assert_array_equal(cf.get_scores(sub), cf.dr_scores_[sub])
    assert cf.dr_scores_.mean() == pytest.approx(cf.ate_)
    test = simulate.linear_confounded(500, seed=5)
    G = cf.dr_scores(test.X, test.t, test.y)
    tau = cf.predict(test.X)
    m = cf.outcome_forest_.predict(test.X)
    e = np.clip(cf.treatment_forest_.predict(test.X), 1e-3, 1 - 1e-3)
    manual = tau + (test.t - e) / (e * (1 - e)) * (test.y - m - (test.t - e) * tau)
    np.testing.assert_allclose(G, manual, rtol=1e-10, atol=1e-10)
    # held-out averages use the same scores
    est, _ = cf.average_treatment_effect(X=test.X, t=test.t, y=test.y, comm=SELF)
    assert est == pytest.approx(G.mean())


def test_multi_arm_per_arm_against_control():
    d = simulate.multi_arm(2400, d=4, n_arms=2, seed=6)
    cf = CausalForest(40, **FAST).fit(d.X, d.t, d.y, comm=SELF)
    assert cf.dr_scores_.shape == (2400, 2)
    test = simulate.multi_arm(600, d=4, n_arms=2, seed=7)
    assert cf.dr_scores(test.X, test.t, test.y).shape == (600, 2)
    for target in ("all", "treated", "control", "overlap"):
        est, se = cf.average_treatment_effect(target, comm=SELF)
        assert est.shape == se.shape == (2,)
    est, se = cf.average_treatment_effect("treated", comm=SELF)
    truth = [d.tau[d.t == k + 1, k].mean() for k in range(2)]
    assert _within(est, se, truth), (est, se, truth)
    blp = cf.best_linear_projection(d.X[:, 1:3], comm=SELF)
    assert blp.estimate.shape == (2, 3) and blp.contrasts == ["1 - 0", "2 - 0"]
    # arm 1: tau = 1 + 2 x1, arm 2: tau = -2 + 2 x2
    assert _within(blp.estimate[0, 1], blp.stderr[0, 1], 2.0) and _within(blp.estimate[1, 2], blp.stderr[1, 2], 2.0)
    cal = cf.test_calibration(comm=SELF)
    assert cal.estimate.shape == (2, 2)
    rate = cf.rank_average_treatment_effect(cf.predict(test.X), test.X, test.t, test.y, target="QINI",
                                            n_bootstrap=50, comm=SELF)
    assert rate.estimate.shape == (2, 1) and rate.toc.shape == (2, 10)
    assert np.all(rate.estimate[:, 0] > 2 * rate.stderr[:, 0])
    with pytest.raises(ValueError, match="levels"):
        cf.dr_scores(test.X[:3], np.array([0, 1, 5]), test.y[:3])


def test_continuous_treatment_partial_effect_score():
    d = simulate.continuous_treatment(2000, d=4, seed=8)
    cf = CausalForest(40, **FAST).fit(d.X, d.t, d.y, comm=SELF)
    V = cf.treatment_variance_forest_.predict(d.X[:200])
    assert abs(np.median(V) - 1.0) < 0.25                   # Var(W | x) = 1 in this design
    est, se = cf.average_treatment_effect(comm=SELF)
    assert _within(est, se, d.tau.mean())
    est, se = cf.average_treatment_effect("overlap", comm=SELF)
    assert abs(est - d.tau.mean()) < 0.2
    with pytest.raises(ValueError, match="continuous"):
        cf.average_treatment_effect("treated", comm=SELF)
    with pytest.raises(ValueError, match="binary or categorical"):
        cf.rank_average_treatment_effect(d.X[:, 0], comm=SELF)
    test = simulate.continuous_treatment(300, d=4, seed=9)
    G = cf.dr_scores(test.X, test.t, test.y)
    tau = cf.predict(test.X)
    m, e = cf.outcome_forest_.predict(test.X), cf.treatment_forest_.predict(test.X)
    v = cf.treatment_variance_forest_.predict(test.X)
    np.testing.assert_allclose(G, tau + (test.t - e) / v * (test.y - m - (test.t - e) * tau), rtol=1e-10)
    blp = cf.best_linear_projection(d.X[:, 1], comm=SELF)          # tau = 0.5 + x1
    assert _within(blp.estimate, blp.stderr, [0.5, 1.0])


def test_model_file_keeps_nuisances_not_training_rows(linear, tmp_path):
    d, cf = linear
    path = str(tmp_path / "cf.model")
    model_io.save(cf, path)
    loaded = model_io.load(path, expect=CausalForest)
    test = simulate.linear_confounded(300, seed=10)
    np.testing.assert_allclose(loaded.dr_scores(test.X, test.t, test.y), cf.dr_scores(test.X, test.t, test.y),
                               rtol=1e-12)
    assert not hasattr(loaded, "dr_scores_")
    assert not hasattr(loaded.outcome_forest_, "oob_prediction_")
    header = model_io.read_header(path)
    # no per-training-row array but the training-row signature's sketch of row hashes (complete below
    # forest.io.training_rows.SKETCH_SIZE rows): keys and counts, uint64 and int64
    per_row = sorted(info["dtype"] for info in header["arrays"].values() if 3000 in info["shape"])
    assert per_row == ["<i8", "<u8"] and len(loaded.training_rows_["keys"]) == 3000
    assert loaded.average_treatment_effect() == (cf.ate_, cf.ate_stderr_)
    with pytest.raises(ValueError, match="only in the process that ran fit"):
        loaded.best_linear_projection(comm=SELF)
    blp = loaded.best_linear_projection(test.X[:, :2], X=test.X, t=test.t, y=test.y, comm=SELF)
    assert blp.estimate.shape == (3,)


def test_model_files_of_older_versions_still_load(linear):
    """What model_io's decoder does with a file written before clusters and nuisance forests existed."""
    d, cf = linear
    old = CausalForest.__new__(CausalForest)
    old.__dict__.update({k: v for k, v in vars(cf).items()
                         if k not in ("equalize_cluster_weights", "outcome_forest_", "treatment_forest_")})
    old._model_io_restore_()
    assert old.get_params() == cf.get_params() and old.outcome_forest_ is None
    with pytest.raises(ValueError, match="nuisance forests"):
        old.dr_scores(d.X[:5], d.t[:5], d.y[:5])
    rf = type(cf.outcome_forest_).__new__(type(cf.outcome_forest_))
    rf.__dict__.update({k: v for k, v in vars(cf.outcome_forest_).items() if k != "equalize_cluster_weights"})
    rf._model_io_restore_()
    assert rf.get_params() == cf.outcome_forest_.get_params()


def test_vector_continuous_treatment():
    d = simulate.continuous_treatment(1500, d=4, n_treatments=2, seed=15)
    cf = CausalForest(30, **FAST).fit(d.X, d.t, d.y, comm=SELF)
    assert cf.dr_scores_.shape == (1500, 2)
    est, se = cf.average_treatment_effect(comm=SELF)
    assert est.shape == (2,) and _within(est, se, d.tau.mean(axis=0), k=4.0)
    test = simulate.continuous_treatment(200, d=4, n_treatments=2, seed=16)
    assert cf.dr_scores(test.X, test.t, test.y).shape == (200, 2)
    V = cf.treatment_variance_forest_.predict(test.X)          # (Var W0, Cov, Var W1) = (1, 0, 1)
    np.testing.assert_allclose(np.median(V, axis=0), [1.0, 0.0, 1.0], atol=0.25)
    assert cf.best_linear_projection(comm=SELF).contrasts == ["W0", "W1"]


def test_clusters_widen_every_interval():
    """Cluster-level effect shifts: cluster sampling and cluster-robust errors see them, row-level ones do not."""
    rng = np.random.default_rng(11)
    n, n_cl = 2400, 30
    labels = rng.permutation(np.repeat(np.arange(n_cl), n // n_cl))
    d = simulate.athey_wager(n, d=4, seed=12)
    shift = 1.5 * rng.normal(size=n_cl)[labels]
    y = d.y + d.t * shift
    plain = CausalForest(60, **FAST).fit(d.X, d.t, y, comm=SELF)
    clustered = CausalForest(60, **FAST).fit(d.X, d.t, y, clusters=labels, comm=SELF)
    assert clustered.sampling_["clusters"] and not plain.sampling_["clusters"]
    X = d.X[:100]
    assert np.median(clustered.predict_var(X)) > 1.4 * np.median(plain.predict_var(X))
    assert clustered.ate_stderr_ > 1.5 * plain.ate_stderr_
    b_plain = plain.best_linear_projection(d.X[:, 0], comm=SELF)
    b_cl = clustered.best_linear_projection(d.X[:, 0], comm=SELF)
    assert b_cl.stderr[0] > 1.5 * b_plain.stderr[0]
    prio = rng.normal(size=n_cl)[labels]              # a cluster-level priority: top shares are sets of clusters
    r_plain = plain.rank_average_treatment_effect(prio, n_bootstrap=60, comm=SELF)
    r_cl = clustered.rank_average_treatment_effect(prio, n_bootstrap=60, comm=SELF)
    assert r_cl.stderr[0] > 1.3 * r_plain.stderr[0]
    with pytest.raises(ValueError, match="pass the same cluster labels"):
        clustered.oob_predict(d.X, comm=SELF)
    # out-of-bag membership recomputed from the cluster labels is the one fit used
    np.testing.assert_allclose(clustered.oob_predict(d.X, comm=SELF, clusters=labels),
                               clustered._oob_rows_.tau[:, 0, 0], rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="sample_weight"):
        CausalForest(8, equalize_cluster_weights=True, **FAST).fit(d.X, d.t, y, np.ones(n), clusters=labels,
                                                                   comm=SELF)


def test_equalized_cluster_weights_take_equal_rows_per_cluster():
    rng = np.random.default_rng(13)
    sizes = rng.integers(10, 120, size=25)
    labels = np.repeat(np.arange(25), sizes)
    n = len(labels)
    d = simulate.linear_confounded(n, seed=14)
    cf = CausalForest(30, equalize_cluster_weights=True, **FAST).fit(d.X, d.t, d.y, clusters=labels, comm=SELF)
    rows = cf._oob_rows_
    np.testing.assert_allclose(rows.weight, 1.0 / sizes[labels])
    assert rows.layout.samples_per_cluster == sizes.min()
    est, se = cf.average_treatment_effect(comm=SELF)
    by_cluster = np.mean([d.tau[labels == c].mean() for c in range(25)])
    assert _within(est, se, by_cluster)


def test_errors(linear):
    d, cf = linear
    with pytest.raises(ValueError, match="all of X, t and y"):
        cf.average_treatment_effect(X=d.X)
    with pytest.raises(ValueError, match="held-out"):
        cf.average_treatment_effect(clusters=np.zeros(3000))
    with pytest.raises(ValueError, match="shape"):
        cf.best_linear_projection(d.X[:10], comm=SELF)
    given = CausalForest(8, **FAST).fit(d.X, d.t, d.y, y_hat=d.m, t_hat=d.e, comm=SELF)
    assert given.outcome_forest_ is None
    with pytest.raises(ValueError, match="nuisance forests"):
        given.dr_scores(d.X[:5], d.t[:5], d.y[:5])
    with pytest.raises(ValueError, match="levels"):
        cf.dr_scores(d.X[:3], np.array([0.0, 1.0, 2.0]), d.y[:3])

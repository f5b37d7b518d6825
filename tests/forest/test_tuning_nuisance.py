"""tune_parameters' nuisance choice (issue 35): forest or local linear correction, by out-of-bag error."""
import numpy as np
import pytest

from forest import CausalForest, RegressionForest, model_io
from forest.estimators.tuning import NUISANCE_LAMBDAS
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _design(kind, n=500, seed=0):
    """Confounded binary treatment, effect 1 everywhere; outcome and propensity linear or steps in x."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 5))
    if kind == "linear":
        W = (rng.uniform(size=n) < 0.2 + 0.6 * X[:, 0]).astype(float)
        Y = 4 * X[:, 0] + 3 * X[:, 1] + 2 * X[:, 2] + W + 0.5 * rng.normal(size=n)
    else:
        W = (rng.uniform(size=n) < np.where(X[:, 0] > 0.5, 0.8, 0.2)).astype(float)
        Y = 3.0 * (X[:, 0] > 0.5) + 3.0 * (X[:, 1] > 0.5) + W + 0.5 * rng.normal(size=n)
    return X, W, Y


def _rmse(est, X):
    return float(np.sqrt(np.mean((est.predict(X) - 1.0) ** 2)))


def _oob_errors(est, Y, W):
    """Out-of-bag squared errors of the nuisance forests' plain predictions (the reference of the choice)."""
    source = est._weights_source_
    y_hat = np.ravel(est.outcome_forest_.oob_prediction_binned(source.codes, source.gids))
    t_hat = np.ravel(est.treatment_forest_.oob_prediction_binned(source.codes, source.gids))
    return np.mean((Y - y_hat) ** 2), np.mean((W - t_hat) ** 2)


def test_a_linear_outcome_chooses_the_local_linear_correction_and_it_lowers_the_error(tmp_path):
    X, W, Y = _design("linear")
    tuned = CausalForest(100, random_state=1, tune_parameters=["nuisance"]).fit(X, W, Y, comm=SELF)
    plain = CausalForest(100, random_state=1).fit(X, W, Y, comm=SELF)
    choice = tuned.tuning_["nuisance"]["y_hat"]
    assert choice["model"] == "local linear" and choice["ll_lambda"] in NUISANCE_LAMBDAS
    assert len(choice["errors"]) == 1 + len(NUISANCE_LAMBDAS)
    # the forest's error is the plain out-of-bag error of the same nuisance forest as an untuned fit
    y_err, t_err = _oob_errors(plain, Y, W)
    assert choice["errors"][0] == pytest.approx(y_err, rel=1e-12)
    assert tuned.tuning_["nuisance"]["t_hat"]["errors"][0] == pytest.approx(t_err, rel=1e-12)
    # a linear m(x) is smoothed by the forest's leaves: the correction removes most of it (noise 0.25)
    assert min(choice["errors"]) < 0.85 * y_err and min(choice["errors"]) > 0.25
    # and the effect's error falls (0.09 vs 0.16 here)
    assert _rmse(tuned, X) < 0.75 * _rmse(plain, X)
    # the corrected centring is the fit's, and its forest is not kept (it would not give those values)
    assert tuned.outcome_forest_ is None
    rec = tuned.nuisance_["y_hat"]
    assert rec["source"] == "local linear forest" and rec["ll_lambda"] == choice["ll_lambda"]
    assert rec["seed"] == plain.nuisance_["y_hat"]["seed"]
    # rows passed again cannot be scored without that forest: one line that says why
    with pytest.raises(ValueError, match="local linear correction"):
        tuned.dr_scores(X[:50] + 1.0, W[:50], Y[:50])
    again = CausalForest(100, random_state=1).fit(X, W, Y, comm=SELF, y_hat=tuned._oob_rows_.y_hat,
                                                  t_hat=tuned._oob_rows_.t_hat)
    np.testing.assert_array_equal(again.predict(X), tuned.predict(X))
    # binary treatment: propensities stay in [0, 1]
    assert tuned._oob_rows_.t_hat.min() >= 0 and tuned._oob_rows_.t_hat.max() <= 1
    # a model file keeps the record (and no outcome forest)
    model_io.save(tuned, tmp_path / "ll.model")
    back = model_io.load(tmp_path / "ll.model")
    assert back.nuisance_ == tuned.nuisance_ and back.outcome_forest_ is None
    np.testing.assert_array_equal(back.predict(X), tuned.predict(X))
    # no forest parameter was asked for: the given ones are kept
    assert tuned.tuned_params_ == {} and tuned.tuning_["status"] == "given: no forest parameter to tune"
    # "all" makes the same choice (the correction had the lower R-loss here too)
    assert tuned.tuning_["centring"]["model"] == "local linear"
    small = dict(tune_num_trees=8, tune_num_reps=3, tune_num_draws=20)
    every = CausalForest(40, random_state=1, tune_parameters="all", **small).fit(X, W, Y, comm=SELF)
    assert set(every.tuning_["nuisance"]) == {"y_hat", "t_hat"} and every.tuning_["centring"] is not None



def test_a_step_design_keeps_the_forest():
    X, W, Y = _design("step")
    tuned = CausalForest(100, random_state=1, tune_parameters=["nuisance"]).fit(X, W, Y, comm=SELF)
    plain = CausalForest(100, random_state=1).fit(X, W, Y, comm=SELF)
    for name in ("y_hat", "t_hat"):
        choice = tuned.tuning_["nuisance"][name]
        assert choice["model"] == "forest" and choice["ll_lambda"] is None
        assert min(choice["errors"][1:]) > choice["errors"][0]
        assert tuned.nuisance_[name] == plain.nuisance_[name]
    assert tuned.outcome_forest_ is not None and tuned.treatment_forest_ is not None
    # nothing changed: the untuned fit, bit for bit
    np.testing.assert_array_equal(tuned.predict(X), plain.predict(X))


def test_given_estimates_and_binned_input_are_left_alone():
    X, W, Y = _design("linear", n=200)
    est = CausalForest(40, random_state=1, tune_parameters=["nuisance"]).fit(X, W, Y, y_hat=np.zeros(200),
                                                                             comm=SELF)
    assert set(est.tuning_["nuisance"]) == {"t_hat"} and est.nuisance_["y_hat"]["source"] == "given"
    base = CausalForest(40, random_state=1).fit(X, W, Y, comm=SELF)
    binned = (base.bin_mapper_, base.bin_mapper_.transform(X))
    est = CausalForest(40, random_state=1, tune_parameters=["nuisance"]).fit(None, W, Y, binned=binned, comm=SELF)
    for choice in est.tuning_["nuisance"].values():
        assert choice["model"] == "forest" and "binned" in choice["reason"]
    with pytest.raises(ValueError, match="unknown 'nuisance'"):
        RegressionForest(10, tune_parameters=["nuisance"]).fit(X, Y, comm=SELF)


@pytest.mark.mpi
def test_the_nuisance_choice_is_the_same_at_any_rank_count(comm):
    X, W, Y = _design("linear", n=300, seed=3)
    lo, hi = len(W) * comm.rank // comm.size, len(W) * (comm.rank + 1) // comm.size
    kw = dict(n_estimators=30, random_state=2, tune_parameters=["nuisance", "min_samples_leaf"],
              tune_num_trees=8, tune_num_reps=4, tune_num_draws=40)
    dist = CausalForest(**kw).fit(X[lo:hi], W[lo:hi], Y[lo:hi], comm=comm)
    ref = CausalForest(**kw).fit(X, W, Y, comm=SELF)
    assert ref.tuning_["nuisance"]["y_hat"]["model"] == "local linear"
    for name, choice in ref.tuning_["nuisance"].items():
        got = dist.tuning_["nuisance"][name]
        assert got["model"] == choice["model"] and got["ll_lambda"] == choice["ll_lambda"]
        np.testing.assert_allclose(got["errors"], choice["errors"], rtol=1e-12)
    assert dist.tuned_params_ == ref.tuned_params_
    assert dist.nuisance_ == ref.nuisance_
    np.testing.assert_allclose(dist._oob_rows_.y_hat, ref._oob_rows_.y_hat[lo:hi], rtol=0, atol=1e-12)
    np.testing.assert_allclose(dist.predict(X), ref.predict(X), rtol=0, atol=1e-12)

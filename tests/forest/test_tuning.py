"""tune_parameters (issue 35): grf's draw maps, the kriging smoother, the tuned fit, model files, ranks."""
import math

import numpy as np
import pytest

from forest import CausalForest, InstrumentalForest, RegressionForest, model_io
from forest.analysis.kriging import fit_kriging, matern52, predict_kriging
from forest.estimators.tuning import params_from_draws, tunable_names
from native.comm import SelfCommunicator

SELF = SelfCommunicator()
SMALL = dict(tune_num_trees=16, tune_num_reps=6, tune_num_draws=60)


def _causal(n=400, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 4))
    W = (rng.uniform(size=n) < 0.3 + 0.4 * X[:, 1]).astype(float)
    Y = X[:, 2] + W * (1.0 + 2.0 * (X[:, 0] > 0.5)) + rng.normal(size=n)
    return X, W, Y


def test_matern52_equals_the_formula_entry_by_entry():
    rng = np.random.default_rng(1)
    A, B, theta = rng.uniform(size=(5, 3)), rng.uniform(size=(4, 3)), np.array([0.3, 1.0, 2.0])
    ref = np.empty((5, 4))
    for i in range(5):
        for j in range(4):
            r = math.sqrt(sum(((A[i, k] - B[j, k]) / theta[k]) ** 2 for k in range(3)))
            ref[i, j] = (1 + math.sqrt(5) * r + 5 * r * r / 3) * math.exp(-math.sqrt(5) * r)
    np.testing.assert_allclose(matern52(A, B, theta), ref, rtol=1e-13)


def test_kriging_finds_the_minimum_of_a_noisy_bowl():
    rng = np.random.default_rng(2)
    design = rng.uniform(size=(40, 2))
    truth = lambda P: (P[:, 0] - 0.3) ** 2 + 0.5 * (P[:, 1] - 0.7) ** 2   # noqa: E731
    errors = truth(design) + 0.01 * rng.normal(size=40)
    model = fit_kriging(design, errors)
    grid = rng.uniform(size=(2000, 2))
    best = grid[np.argmin(predict_kriging(model, grid))]
    assert np.abs(best - [0.3, 0.7]).max() < 0.15
    # the smoother does not interpolate the noise: its predictions at the design sit between the
    # noisy errors and the truth
    assert np.mean((predict_kriging(model, design) - truth(design)) ** 2) < np.mean((errors - truth(design)) ** 2)


def test_draws_map_to_grfs_values():
    est = CausalForest()
    names = ["min_samples_leaf", "max_samples", "max_features", "honesty_fraction", "alpha", "imbalance_penalty"]
    assert tunable_names(est) == names
    (p,) = params_from_draws(est, names, np.array([[0.5, 0.5, 0.5, 0.5, 0.5, 0.5]]), n=1024, d=16)
    # floor(2^(0.5 (10 - 4))) + 1; 0.05 + 0.45 / 2; ceil(min(16, 4 + 20) / 2); 0.5 + 0.15; 0.125; -log(0.5)
    assert p == {"min_samples_leaf": 9, "max_samples": 0.275, "max_features": 8, "honesty_fraction": 0.65,
                 "alpha": 0.125, "imbalance_penalty": pytest.approx(math.log(2))}
    assert tunable_names(RegressionForest(min_node_size=5))[0] == "min_node_size"
    assert "honesty_fraction" not in tunable_names(RegressionForest(honest=False))
    # no little bags: a draw may sample up to every row
    assert params_from_draws(CausalForest(ci_group_size=1), ["max_samples"], np.array([[1.0]]), 100, 3)[0] == \
        {"max_samples": 1.0}


@pytest.mark.parametrize("kwargs, match", [
    (dict(tune_parameters="some"), "tune_parameters must be"),
    (dict(tune_parameters=["min_samples_leaf", "depth"]), "unknown 'depth'"),
    (dict(tune_parameters=[]), "empty list"),
    (dict(tune_parameters="all", tune_num_reps=1), "tune_num_reps must be an int >= 2"),
    (dict(tune_parameters="all", tune_num_trees=3), "tune_num_trees must be an int >= 4"),
])
def test_bad_tuning_parameters_are_refused_before_any_fit(kwargs, match):
    X, W, Y = _causal(60)
    with pytest.raises(ValueError, match=match):
        CausalForest(10, **kwargs).fit(X, W, Y, comm=SELF)


def test_warm_start_cannot_be_tuned():
    X, W, Y = _causal(100)
    with pytest.raises(ValueError, match="warm_start=True cannot be combined"):
        CausalForest(10, warm_start=True, tune_parameters="all", **SMALL).fit(X, W, Y, comm=SELF)


@pytest.fixture(scope="module")
def tuned_causal():
    X, W, Y = _causal()
    return CausalForest(60, random_state=3, tune_parameters="all", **SMALL).fit(X, W, Y, comm=SELF), (X, W, Y)


def test_tuned_causal_forest_is_the_plain_fit_at_the_chosen_values(tuned_causal):
    est, (X, W, Y) = tuned_causal
    rec = est.tuning_
    assert set(est.tuned_params_) == set(tunable_names(est)) and len(rec["errors"]) == SMALL["tune_num_reps"]
    assert np.all(np.isfinite(rec["errors"])) and np.isfinite(rec["default_error"])
    assert rec["status"] == "tuned" or rec["status"].startswith("given")
    if rec["status"] == "tuned":
        assert rec["best_error"] < rec["default_error"]
    # the user's parameters are left as given
    assert est.tune_parameters == "all" and est.min_samples_leaf == 5
    # "all" chose the centring: the forests' or the corrected one, whichever small effect forests
    # had the lower R-loss (against the corrected centring)
    centring = rec["centring"]
    assert centring is not None and set(centring["candidates"]) <= {"y_hat", "t_hat"}
    losses = centring["r_loss"]
    assert centring["model"] == ("local linear" if losses["local linear"] < losses["forest"] else "forest")
    # the record's choice is the fit's centring
    source = est._weights_source_
    forests = {"y_hat": est.outcome_forest_, "t_hat": est.treatment_forest_}
    for name, forest in forests.items():
        choice = rec["nuisance"][name]
        assert (choice["model"] == "local linear") == (centring["model"] == "local linear"
                                                      and name in centring["candidates"])
        assert (forest is None) == (choice["model"] == "local linear")
        if forest is not None:
            np.testing.assert_array_equal(np.ravel(forest.oob_prediction_binned(source.codes, source.gids)),
                                          np.ravel(getattr(est._oob_rows_, name)))
    # the same forest as an ordinary fit with those values on that centring
    hats = {name: getattr(est._oob_rows_, name) for name in forests}
    plain = CausalForest(60, random_state=3, **est.tuned_params_).fit(X, W, Y, comm=SELF, **hats)
    np.testing.assert_array_equal(est.predict(X), plain.predict(X))


def test_tuned_model_file_keeps_the_tuning(tuned_causal, tmp_path):
    est, (X, _, _) = tuned_causal
    path = tmp_path / "tuned.model"
    model_io.save(est, path)
    back = model_io.load(path)
    assert back.tuned_params_ == est.tuned_params_ and back.tuning_["status"] == est.tuning_["status"]
    np.testing.assert_array_equal(back.predict(X), est.predict(X))


def test_regression_and_instrumental_forests_tune():
    rng = np.random.default_rng(4)
    X = rng.uniform(size=(300, 3))
    y = np.sin(4 * X[:, 0]) + 0.3 * rng.normal(size=300)
    rf = RegressionForest(40, random_state=1, tune_parameters=["min_samples_leaf", "max_samples"], **SMALL)
    rf.fit(X, y, comm=SELF)
    assert set(rf.tuned_params_) == {"min_samples_leaf", "max_samples"}
    assert np.isfinite(rf.tuning_["default_error"])
    plain = RegressionForest(40, random_state=1, **rf.tuned_params_).fit(X, y, comm=SELF)
    np.testing.assert_array_equal(rf.predict(X), plain.predict(X))
    z = (rng.uniform(size=300) < 0.5).astype(float)
    t = ((rng.uniform(size=300) < 0.3) | (z > 0)).astype(float)
    iv = InstrumentalForest(40, random_state=1, tune_parameters=["min_samples_leaf"], **SMALL)
    iv.fit(X, t, X[:, 1] + t * (1 + X[:, 0]) + rng.normal(size=300), z, comm=SELF)
    assert np.all(np.isfinite(iv.tuning_["errors"])) and iv.tuned_params_["min_samples_leaf"] >= 1


@pytest.mark.mpi
def test_tuning_is_the_same_at_any_rank_count(comm):
    X, W, Y = _causal(300, seed=5)
    lo, hi = len(W) * comm.rank // comm.size, len(W) * (comm.rank + 1) // comm.size
    kw = dict(n_estimators=30, random_state=2, tune_parameters=["min_samples_leaf", "max_samples", "alpha", "nuisance"],
              tune_num_trees=8, tune_num_reps=4, tune_num_draws=40)
    dist = CausalForest(**kw).fit(X[lo:hi], W[lo:hi], Y[lo:hi], comm=comm)
    ref = CausalForest(**kw).fit(X, W, Y, comm=SELF)
    assert dist.tuned_params_ == ref.tuned_params_
    np.testing.assert_allclose(dist.tuning_["errors"], ref.tuning_["errors"], rtol=1e-12)
    # the centring choice: both R-losses (sums over the ranks' rows) and the winner
    got, want = dist.tuning_["centring"], ref.tuning_["centring"]
    assert want is not None and got["model"] == want["model"] and got["candidates"] == want["candidates"]
    for name in ("forest", "local linear"):
        assert got["r_loss"][name] == pytest.approx(want["r_loss"][name], rel=1e-12)
    np.testing.assert_allclose(dist._oob_rows_.y_hat, ref._oob_rows_.y_hat[lo:hi], rtol=0, atol=1e-12)
    np.testing.assert_allclose(dist.predict(X), ref.predict(X), rtol=0, atol=1e-12)   # as a plain fit


def test_a_fixed_half_variance_nugget_blurs_a_clean_surface():
    """Why the nugget is estimated (forest.analysis.kriging's docstring)."""
    rng = np.random.default_rng(2)
    design = rng.uniform(size=(40, 2))
    truth = (design[:, 0] - 0.3) ** 2 + 0.5 * (design[:, 1] - 0.7) ** 2
    errors = truth + 0.01 * rng.normal(size=40)
    fixed = fit_kriging(design, errors, nugget=np.var(errors) / 2)
    noise = np.mean((errors - truth) ** 2)
    assert np.mean((predict_kriging(fixed, design) - truth) ** 2) > 2 * noise

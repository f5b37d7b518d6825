"""warm_start=True: raising n_estimators and fitting again equals one fit with the larger
n_estimators (forests bit for bit; GBDT the same trees), under mpirun too."""
import warnings

import numpy as np
import pytest

from native.comm import SelfCommunicator
from forest import CausalForest, GBDTClassifier, GBDTRegressor, RegressionForest
from forest.io import model_io
from forest.io.checkpoint import Checkpoint

from resume_helpers import N, Crash, crash_at, data

SELF = SelfCommunicator()

MODELS = {
    "regression": lambda n: RegressionForest(n_estimators=n, batch_size=4, random_state=2, warm_start=True),
    "causal": lambda n: CausalForest(n_estimators=n, batch_size=4, nuisance_estimators=8, random_state=2,
                                     warm_start=True),
    "gbdt-regressor": lambda n: GBDTRegressor(n_estimators=n, max_leaf_nodes=7, early_stopping=True,
                                              n_iter_no_change=50, random_state=1, warm_start=True),
    "gbdt-classifier": lambda n: GBDTClassifier(n_estimators=n, max_leaf_nodes=7, early_stopping=True,
                                                n_iter_no_change=50, random_state=1, warm_start=True),
    "gbdt-quantized": lambda n: GBDTClassifier(n_estimators=n, max_leaf_nodes=7, early_stopping=True,
                                               n_iter_no_change=50, random_state=1, warm_start=True,
                                               quantized=True),
}


def fit(est, comm, sl=slice(None), X=None, **kwargs):
    Xd, t, y = data()
    X = Xd[sl] if X is None else X
    if isinstance(est, CausalForest):
        return est.fit(X, t[sl], y[sl], comm=comm, **kwargs)
    if isinstance(est, GBDTClassifier):
        return est.fit(X, (y[sl] > 1.0).astype(int) + (y[sl] > 2.5), comm=comm, **kwargs)
    return est.fit(X, y[sl], comm=comm, **kwargs)


@pytest.mark.mpi
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_warm_start_equals_one_fit(kind, comm, rank_slice, same_model_file):
    sl = rank_slice(N)
    warm = fit(MODELS[kind](8), comm, sl)
    fit(warm.set_params(n_estimators=20), comm, sl)
    one = fit(MODELS[kind](20), comm, sl)
    assert same_model_file(warm, one)


@pytest.mark.parametrize("kind", ["regression", "causal"])
def test_warm_start_from_an_incomplete_batch_is_bitwise_serially(kind, same_model_file):
    make = {"regression": lambda n: RegressionForest(n_estimators=n, random_state=5, warm_start=True),
            "causal": lambda n: CausalForest(n_estimators=n, nuisance_estimators=6, random_state=5,
                                             warm_start=True)}[kind]
    warm = fit(make(7), SELF)
    fit(warm.set_params(n_estimators=33), SELF)
    assert same_model_file(warm, fit(make(33), SELF))


def test_causal_warm_start_keeps_the_first_nuisance_forests(tmp_path, same_model_file):
    # nuisance_estimators=None: max(50, n // 4) is 50 for 8 trees, 52 for 208. The warm
    # start keeps the 50-tree centering, so it is the fit with nuisance_estimators=50.
    warm = fit(CausalForest(n_estimators=8, random_state=1, warm_start=True), SELF)
    nuisance_forest = warm.outcome_forest_
    fit(warm.set_params(n_estimators=208), SELF)
    assert warm.nuisance_ == {"n_estimators": 50, "y_hat": {"source": "forest", "seed": 7920},
                              "t_hat": {"source": "forest", "seed": 104730}}
    assert warm.outcome_forest_ is nuisance_forest
    one = fit(CausalForest(n_estimators=208, random_state=1, nuisance_estimators=50, warm_start=True), SELF)
    assert same_model_file(warm, one.set_params(nuisance_estimators=None))
    np.testing.assert_array_equal(warm.dr_scores_, one.dr_scores_)
    # a loaded model continues the same way: the kept nuisance forests' out-of-bag
    # estimates are recomputed from their trees
    path = str(tmp_path / "cf.model")
    model_io.save(warm, path)
    loaded = fit(model_io.load(path).set_params(n_estimators=212), SELF)
    one = fit(one.set_params(n_estimators=212, nuisance_estimators=50), SELF)
    assert same_model_file(loaded, one.set_params(nuisance_estimators=None))


def test_causal_warm_start_refuses_other_given_nuisance():
    X, t, y = data()
    est = CausalForest(n_estimators=4, random_state=1, warm_start=True).fit(X, t, y, y_hat=np.zeros(N),
                                                                            t_hat=np.full(N, 0.5), comm=SELF)
    assert est.nuisance_["y_hat"]["source"] == "given"
    with pytest.raises(ValueError, match="warm start: the nuisance y_hat differs from the first fit's"):
        est.set_params(n_estimators=8).fit(X, t, y, y_hat=np.ones(N), t_hat=np.full(N, 0.5), comm=SELF)
    est.fit(X, t, y, y_hat=np.zeros(N), t_hat=np.full(N, 0.5), comm=SELF)
    assert len(est.estimators_["tree_offsets"]) == 9


@pytest.mark.parametrize("kind", ["regression", "causal"])
def test_forest_warm_start_errors(kind):
    est = fit(MODELS[kind](8), SELF)
    with pytest.raises(ValueError, match="n_estimators=4 must be >= the 8 trees already fitted"):
        fit(est.set_params(n_estimators=4), SELF)
    with pytest.raises(ValueError, match=r"cannot change the sampling .*\(seed: 2 -> 3\)"):
        fit(est.set_params(n_estimators=12, random_state=3), SELF)
    with pytest.raises(ValueError, match="X has 3 features, the forest was fitted with 4"):
        fit(est.set_params(random_state=2), SELF, X=data()[0][:, :3])
    before = est.estimators_
    with pytest.warns(UserWarning, match="without increasing n_estimators"):
        fit(est.set_params(n_estimators=8), SELF)
    assert est.estimators_ is before
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(est.set_params(n_estimators=12, warm_start=False), SELF)   # a fresh fit
    assert len(est.estimators_["tree_offsets"]) == 13


def test_gbdt_warm_start_errors_and_early_stop():
    est = fit(MODELS["gbdt-regressor"](8), SELF)
    with pytest.raises(ValueError, match="n_estimators=4 must be >= n_iter_=8"):
        fit(est.set_params(n_estimators=4), SELF)
    clf = fit(MODELS["gbdt-classifier"](4), SELF)
    X, _, y = data()
    with pytest.raises(ValueError, match=r"warm start: y has classes \[0, 1\]"):
        clf.set_params(n_estimators=6).fit(X, (y > 1.0).astype(int), comm=SELF)
    # a fit that stopped early stays as it is, as a single longer fit would stop there too
    make = lambda n: GBDTRegressor(n_estimators=n, learning_rate=0.5, max_leaf_nodes=7,  # noqa: E731
                                   early_stopping=True, n_iter_no_change=3, random_state=4, warm_start=True)
    stopped = fit(make(300), SELF)
    assert stopped.n_iter_ < 300
    trees = list(stopped.trees_)
    fit(stopped.set_params(n_estimators=400), SELF)
    assert stopped.trees_ == trees
    warm = fit(make(stopped.n_iter_ - 2), SELF)
    fit(warm.set_params(n_estimators=300), SELF)
    assert warm.trees_ == trees


@pytest.mark.parametrize("kind", ["regression", "gbdt-regressor"])
def test_warm_start_with_a_checkpoint_writes_the_earlier_trees(kind, tmp_path, same_model_file):
    warm = fit(MODELS[kind](8), SELF)
    crash = 12 if kind == "regression" else 10
    with pytest.raises(Crash):
        fit(warm.set_params(n_estimators=20), SELF, checkpoint=Checkpoint(tmp_path, every=2),
            progress=crash_at(crash))
    lines = []
    resumed = fit(MODELS[kind](20), SELF, checkpoint=Checkpoint(tmp_path, every=2, log=lines.append))
    assert lines == [f"resuming from {crash} of 20 trees (checkpoint {tmp_path})"]
    assert same_model_file(resumed, fit(MODELS[kind](20), SELF))

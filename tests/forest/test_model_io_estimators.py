"""Every estimator survives a model file (predictions equal to 1e-12) and pickling."""
import pickle

import numpy as np
import pytest

from forest.io import model_io
from forest.io.model_io import ModelFormatError
from native.comm import SelfCommunicator


def _data(rng, n=240, d=4):
    X = rng.normal(size=(n, d))
    X[rng.uniform(size=n) < 0.05, 1] = np.nan
    t = (rng.uniform(size=n) < 0.5).astype(float)
    y = X[:, 0] + t * (1 + X[:, 2] > 0) + 0.3 * rng.normal(size=n)
    return X, t, y


def _fitted(kind, rng):
    X, t, y = _data(rng)
    comm = SelfCommunicator()
    if kind == "causal":
        from forest.estimators.causal_forest import CausalForest

        return CausalForest(n_estimators=8, nuisance_estimators=4, random_state=1).fit(X, t, y, comm=comm), X
    if kind == "regression":
        from forest.estimators.regression_forest import RegressionForest

        return RegressionForest(n_estimators=6, random_state=2).fit(X, y, comm=comm), X
    gbdt = pytest.importorskip("forest.estimators.gbdt")
    if kind == "gbdt-regressor":
        return gbdt.GBDTRegressor(random_state=0).set_params(**_small_gbdt(gbdt.GBDTRegressor)).fit(
            X, y, comm=comm), X
    return gbdt.GBDTClassifier(random_state=0).set_params(**_small_gbdt(gbdt.GBDTClassifier)).fit(
        X, (y > 0.5).astype(int), comm=comm), X


def _small_gbdt(cls):
    params = cls().get_params()
    return {k: 5 for k in ("max_iter", "n_estimators") if k in params}


def _same_outputs(a, b, X):
    np.testing.assert_allclose(b.predict(X), a.predict(X), rtol=1e-12, atol=1e-12)
    if hasattr(a, "predict_interval"):
        for u, v in zip(a.predict_interval(X, alpha=0.1), b.predict_interval(X, alpha=0.1)):
            np.testing.assert_allclose(v, u, rtol=1e-12, atol=1e-12)
    if hasattr(a, "predict_proba"):
        np.testing.assert_allclose(b.predict_proba(X), a.predict_proba(X), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["causal", "regression", "gbdt-regressor", "gbdt-classifier"])
def test_model_file_and_pickle_round_trip(kind, rng, tmp_path):
    est, X = _fitted(kind, rng)
    path = str(tmp_path / "m.hfm")
    model_io.save(est, path, metadata={"model": kind})
    loaded = model_io.load(path, expect=type(est))
    assert type(loaded) is type(est)
    assert loaded.get_params() == est.get_params()
    _same_outputs(est, loaded, X)
    _same_outputs(est, pickle.loads(pickle.dumps(est)), X)
    header = model_io.read_header(path)
    assert header["estimator"].endswith(type(est).__name__)
    assert header["metadata"] == {"model": kind}


def test_wrong_estimator_kind(rng, tmp_path):
    from forest.estimators.causal_forest import CausalForest

    est, _ = _fitted("regression", rng)
    path = str(tmp_path / "m.hfm")
    model_io.save(est, path)
    with pytest.raises(ModelFormatError, match="holds a RegressionForest, but a CausalForest is needed"):
        model_io.load(path, expect=CausalForest)

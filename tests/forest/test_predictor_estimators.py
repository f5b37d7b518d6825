"""Every estimator's predictions through the batch route equal, bit for bit, those of
the per-row walk (the route before batching) and of the plain-Python reference, with
missing values, on 1 and 2 threads."""
import numpy as np
import pytest

from forest import CausalForest, GBDTClassifier, GBDTRegressor, RegressionForest, simulate

from forest.engine import predictor
from forest.analysis.inference import blb_variance
from forest.engine.predictor import predict_reference, tree_values
from forest.engine.tree import unpack_trees
from native.comm import SelfCommunicator

N_TEST = 2500          # above the batch threshold, several row blocks, one parallel chunk set


def _with_nan(X, rng, share=0.08):
    X = X.copy()
    X[rng.random(X.shape) < share] = np.nan
    return X


def _assert_batched(packed, X):
    """The test's inputs do take the batch route (or the comparison proves nothing)."""
    assert predictor.batch_forest(packed, len(X), X.shape[1]) is not None


@pytest.fixture(scope="module")
def causal():
    rng = np.random.default_rng(7)
    d = simulate.athey_wager(1200, d=6, seed=3)
    X = _with_nan(d.X, rng)
    cf = CausalForest(40, max_bins=48, random_state=1).fit(X, d.t, d.y, comm=SelfCommunicator())
    test = _with_nan(simulate.athey_wager(N_TEST, d=6, seed=4).X, rng)
    return cf, X, test


def test_causal_forest(causal, threads, per_row_walk):
    cf, X_train, X = causal
    _assert_batched(cf.estimators_, X)
    _assert_batched(cf.estimators_, X_train)
    np.testing.assert_array_equal(cf.predict(X), per_row_walk(cf.predict, X))
    np.testing.assert_array_equal(cf.predict_var(X), per_row_walk(cf.predict_var, X))
    lo, hi = cf.predict_interval(X, alpha=0.1)
    ref_lo, ref_hi = per_row_walk(cf.predict_interval, X, alpha=0.1)
    np.testing.assert_array_equal(lo, ref_lo)
    np.testing.assert_array_equal(hi, ref_hi)
    # the variance before this change: blb_variance over the (rows, trees, moments) array
    _, var = blb_variance(per_row_walk(tree_values, cf.estimators_, X), cf._layout(), cf.ci_group_size)
    np.testing.assert_array_equal(cf.predict_var(X), cf._shape(var))
    comm = SelfCommunicator()
    np.testing.assert_array_equal(cf.oob_predict(X_train, comm=comm), per_row_walk(cf.oob_predict, X_train, comm=comm))


def test_causal_forest_moments_equal_reference(causal):
    cf, _, X = causal
    _, values = predict_reference(unpack_trees(cf.estimators_), X)
    n_trees = len(cf.estimators_["tree_offsets"]) - 1
    np.testing.assert_array_equal(cf._mean_moments(X), values / n_trees)


def test_causal_forest_chunked_interval(causal):
    cf, _, X = causal
    np.testing.assert_array_equal(cf.predict_var(X, chunk_rows=333), cf.predict_var(X))


def test_causal_forest_multi_arm(threads, per_row_walk):
    rng = np.random.default_rng(8)
    d = simulate.multi_arm(1200, d=5, n_arms=2, seed=5)
    cf = CausalForest(20, max_bins=32, random_state=2).fit(_with_nan(d.X, rng), d.t, d.y, comm=SelfCommunicator())
    X = _with_nan(simulate.multi_arm(N_TEST, d=5, seed=6).X, rng)
    _assert_batched(cf.estimators_, X)
    np.testing.assert_array_equal(cf.predict(X), per_row_walk(cf.predict, X))
    np.testing.assert_array_equal(cf.predict_var(X), per_row_walk(cf.predict_var, X))


def test_regression_forest(threads, per_row_walk):
    rng = np.random.default_rng(9)
    X_train = _with_nan(rng.normal(size=(1000, 5)), rng)
    y = np.nan_to_num(X_train[:, 0]) + rng.normal(size=1000)
    rf = RegressionForest(30, max_bins=64, random_state=0).fit(X_train, y, comm=SelfCommunicator())
    X = _with_nan(rng.normal(size=(N_TEST, 5)), rng)
    _assert_batched(rf.estimators_, X)
    _assert_batched(rf.estimators_, X_train)
    np.testing.assert_array_equal(rf.predict(X), per_row_walk(rf.predict, X))
    _, values = predict_reference(unpack_trees(rf.estimators_), X)
    np.testing.assert_array_equal(rf.predict(X), values[:, 0] / 30)
    comm = SelfCommunicator()
    np.testing.assert_array_equal(rf.oob_predict(X_train, comm=comm), per_row_walk(rf.oob_predict, X_train, comm=comm))
    np.testing.assert_array_equal(rf.oob_predict(X_train, comm=comm), rf.oob_prediction_)


def test_gbdt_regressor(threads, per_row_walk):
    rng = np.random.default_rng(10)
    X_train = _with_nan(rng.normal(size=(1500, 6)), rng)
    y = np.nan_to_num(X_train[:, 0]) * 2 + np.nan_to_num(X_train[:, 1]) ** 2 + rng.normal(size=1500)
    gb = GBDTRegressor(n_estimators=25, max_leaf_nodes=15, early_stopping=False, random_state=0).fit(X_train, y)
    X = _with_nan(rng.normal(size=(N_TEST, 6)), rng)
    _assert_batched(gb._packed_forest(), X)
    np.testing.assert_array_equal(gb.predict(X), per_row_walk(gb.predict, X))
    leaves, _ = predict_reference(gb.trees_, X)
    raw = np.tile(gb.baseline_, (len(X), 1))                 # baseline first, then trees in order
    for t, tree in enumerate(gb.trees_):
        raw += tree.value[leaves[:, t]]
    np.testing.assert_array_equal(gb.predict(X), raw[:, 0])
    for a, b in zip(gb.staged_predict(X), per_row_walk(lambda: list(gb.staged_predict(X)))):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_gbdt_classifier(threads, per_row_walk, n_classes):
    rng = np.random.default_rng(11)
    X_train = _with_nan(rng.normal(size=(1500, 6)), rng)
    y = np.digitize(np.nan_to_num(X_train[:, 0]) + 0.5 * rng.normal(size=1500),
                    np.linspace(-0.7, 0.7, n_classes - 1))
    gb = GBDTClassifier(n_estimators=20, max_leaf_nodes=15, early_stopping=False, random_state=0).fit(X_train, y)
    X = _with_nan(rng.normal(size=(N_TEST, 6)), rng)
    _assert_batched(gb._packed_forest(), X)
    np.testing.assert_array_equal(gb.predict_proba(X), per_row_walk(gb.predict_proba, X))
    np.testing.assert_array_equal(gb.predict(X), per_row_walk(gb.predict, X))

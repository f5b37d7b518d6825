"""RegressionForest: accuracy, honest OOB predictions, importances, rank-count invariance."""
import numpy as np
import pytest
from sklearn.base import clone

from forest.engine.honest_forest import fill_empty_from_parent
from forest.estimators.regression_forest import RegressionForest, resolve_mtry
from forest.engine.tree import Tree
from native.comm import SelfCommunicator
from tests.conftest import block_slice

SELF = SelfCommunicator()


def _data(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 5))
    f = np.sin(4 * X[:, 0]) + 2 * X[:, 1]
    return X, f + 0.3 * rng.normal(size=n), f


def test_accuracy_oob_and_importance():
    X, y, f = _data(3000, 0)
    rf = RegressionForest(60, max_bins=32, random_state=1).fit(X, y, comm=SELF)
    Xt, _, ft = _data(1000, 1)
    rmse = np.sqrt(np.mean((rf.predict(Xt) - ft) ** 2))
    assert rmse < 0.15                                     # noise sd 0.3, signal sd ~0.85
    oob_rmse = np.sqrt(np.mean((rf.oob_prediction_ - f) ** 2))
    in_rmse = np.sqrt(np.mean((rf.predict(X) - f) ** 2))
    assert oob_rmse < 0.2 and abs(oob_rmse - in_rmse) < 0.1
    # OOB predictions recomputed from the hashed sample membership match those of fit
    np.testing.assert_allclose(rf.oob_predict(X, comm=SELF), rf.oob_prediction_, rtol=1e-12, atol=1e-12)
    # honest OOB residuals are not shrunk towards the noise (an in-sample fit would be)
    assert np.mean((y - rf.oob_prediction_) ** 2) > 0.9 * 0.3 ** 2
    assert set(np.argsort(rf.feature_importances_)[-2:]) == {0, 1}
    assert set(np.argsort(rf.gain_importances_)[-2:]) == {0, 1}


def test_multi_output_and_weights():
    X, y, f = _data(1500, 2)
    Y = np.column_stack([y, -3 * y])
    rf = RegressionForest(30, max_bins=32, random_state=0).fit(X, Y, comm=SELF)
    p = rf.predict(X[:200])
    assert p.shape == (200, 2)
    np.testing.assert_allclose(p[:, 1], -3 * p[:, 0], rtol=1e-9)
    # zero weight on half the rows = fitting on the other half only for the leaf means
    w = np.ones(1500)
    w[::2] = 0.0
    yb = y.copy()
    yb[::2] = 100.0                                       # would dominate if weights were ignored
    rw = RegressionForest(30, max_bins=32, random_state=0).fit(X, yb, w, comm=SELF)
    assert np.abs(rw.predict(X[:200])).max() < 5


def test_empty_leaf_takes_parent_value():
    t = Tree(2)
    t.add_node(0, 10.0, [1.0, 10.0])
    a = t.add_node(1, 5.0, [2.0, 5.0])
    b = t.add_node(1, 0.0, [0.0, 0.0])
    t.set_split(0, 0, 3, 0.5, False, 1.0, a, b)
    c = t.add_node(2, 0.0, [0.0, 0.0])
    d = t.add_node(2, 5.0, [3.0, 5.0])
    t.set_split(a, 1, 2, 0.2, False, 1.0, c, d)
    fill_empty_from_parent(t, 1)
    np.testing.assert_array_equal(t.value[:, 0], [1.0, 2.0, 1.0, 2.0, 3.0])


def test_params_and_errors():
    X, y, _ = _data(200, 3)
    rf = RegressionForest(5)
    assert clone(rf).get_params() == rf.get_params()
    assert resolve_mtry(None, 10) == 10 and resolve_mtry(None, 900) == 50
    assert resolve_mtry(0.5, 10) == 5 and resolve_mtry("sqrt", 16) == 4
    for bad in (dict(n_estimators=0), dict(max_samples=0.0), dict(honesty_fraction=1.0), dict(max_bins=1),
                dict(max_features=0), dict(random_state=-1)):
        with pytest.raises(ValueError):
            RegressionForest(**{"n_estimators": 5, **bad}).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="y"):
        RegressionForest(5).fit(X, y[:-1], comm=SELF)
    with pytest.raises(ValueError, match="NaN"):
        RegressionForest(5).fit(X, np.full(200, np.nan), comm=SELF)
    with pytest.raises(ValueError, match="sample_weight"):
        RegressionForest(5).fit(X, y, -np.ones(200), comm=SELF)
    # a warm start adds trees for the same outputs only
    warm = RegressionForest(5, warm_start=True).fit(X, y, comm=SELF).set_params(n_estimators=8)
    with pytest.raises(ValueError, match="warm start: y has 2 output"):
        warm.fit(X, np.column_stack([y, y]), comm=SELF)
    # comm and clusters are keywords: oob_predict(X, t, y), an easy slip, is a TypeError
    with pytest.raises(TypeError):
        RegressionForest(5).fit(X, y, comm=SELF).oob_predict(X, y, y)


@pytest.mark.mpi
def test_same_forest_for_any_rank_count(comm):
    X, y, _ = _data(800, 4)
    X[::17, 2] = np.nan                                   # missing values travel too
    sl = block_slice(800, comm.size, comm.rank)
    kw = dict(n_estimators=10, max_bins=32, random_state=5)
    dist = RegressionForest(**kw).fit(X[sl], y[sl], comm=comm)
    ref = RegressionForest(**kw).fit(X, y, comm=SELF)
    same = all(np.array_equal(dist.estimators_[k], ref.estimators_[k]) for k in ("feature", "bin_threshold", "left"))
    diff = np.max(np.abs(dist.predict(X) - ref.predict(X)))
    oob = np.max(np.abs(dist.oob_prediction_ - ref.oob_prediction_[sl]))
    assert same
    assert diff < 1e-9 and oob < 1e-9


def test_sample_weight_scale_does_not_change_the_forest():
    # min_samples_split is compared with summed weight: weights summing to 1 used to
    # stop every tree at its root. They are rescaled to mean 1, so any common factor
    # gives the same forest as unit weights.
    rng = np.random.default_rng(3)
    X = rng.uniform(size=(400, 3))
    y = 3 * X[:, 0] + rng.normal(scale=0.1, size=400)
    unit = RegressionForest(8, random_state=0).fit(X, y)
    assert unit.predict(X).std() > 0.5
    # 0.1, 1e-6, 1e100: the rescaled weights would round to 1 - 2**-52, and ten rows
    # would weigh less than min_samples_split = 10 (equal weights are now exactly 1)
    for c in (1 / 400, 3.0, 0.1, 1e-6, 1e-100, 1e100):
        scaled = RegressionForest(8, random_state=0).fit(X, y, sample_weight=np.full(400, c))
        np.testing.assert_allclose(scaled.predict(X), unit.predict(X), rtol=0, atol=1e-12, err_msg=str(c))


def test_offset_and_scale_of_y_do_not_change_the_forest():
    # Sums of squares of y = 1e9 + noise used to lose the noise (the trees split on
    # rounding), and |y| ~ 1e-200 underflowed to no split at all; the trees now grow on
    # the standardised outcome.
    X, y, f = _data(600, 6)
    base = RegressionForest(10, random_state=0).fit(X, y)
    ref = base.predict(X)
    assert np.sqrt(np.mean((ref - f) ** 2)) < 0.3
    for off in (1e7, 1e9, -1e9):
        shifted = RegressionForest(10, random_state=0).fit(X, y + off)
        np.testing.assert_array_equal(shifted.estimators_["feature"], base.estimators_["feature"])
        np.testing.assert_allclose(shifted.predict(X) - off, ref, rtol=0, atol=1e-5 * max(1.0, abs(off) / 1e9))
        np.testing.assert_allclose(shifted.oob_prediction_ - off, base.oob_prediction_, rtol=0, atol=1e-5)
    for scale in (1e-200, 1e-6, 1e100, 1e300):
        scaled = RegressionForest(10, random_state=0).fit(X, y * scale)
        np.testing.assert_array_equal(scaled.estimators_["feature"], base.estimators_["feature"])
        np.testing.assert_allclose(scaled.predict(X) / scale, ref, rtol=1e-9, err_msg=str(scale))
    with pytest.raises(ValueError, match="random_state"):
        RegressionForest(5, random_state=2 ** 63).fit(X, y)
    assert RegressionForest(5, random_state=2 ** 32 - 1).fit(X, y).predict(X[:3]).shape == (3,)


@pytest.mark.mpi
def test_same_forest_for_any_rank_count_with_offset_y(comm):
    # the standardisation comes from the global min and max: the same bits on any rank count
    X, y, _ = _data(500, 7)
    sl = block_slice(500, comm.size, comm.rank)
    kw = dict(n_estimators=6, max_bins=32, random_state=2)
    dist = RegressionForest(**kw).fit(X[sl], 1e8 + y[sl], comm=comm)
    ref = RegressionForest(**kw).fit(X, 1e8 + y, comm=SELF)
    for k in ("feature", "bin_threshold", "left", "value"):
        np.testing.assert_array_equal(dist.estimators_[k], ref.estimators_[k])


def test_progress_reports_at_least_ten_times_and_changes_nothing():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(600, 4))
    y = X[:, 0] + 0.1 * rng.normal(size=600)
    calls = []
    with_bar = RegressionForest(n_estimators=100, random_state=1).fit(
        X, y, progress=lambda done, total: calls.append((done, total)))
    without = RegressionForest(n_estimators=100, random_state=1).fit(X, y)
    assert len(calls) >= 10
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and calls[-1] == (100, 100)
    np.testing.assert_array_equal(with_bar.predict(X), without.predict(X))
    np.testing.assert_array_equal(with_bar.oob_prediction_, without.oob_prediction_)

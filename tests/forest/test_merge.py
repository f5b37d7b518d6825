"""forest.merge_forests: a merged forest predicts, estimates out-of-bag and gives intervals
as one forest of all the trees; incompatible forests are refused with a clear message."""
import numpy as np
import pytest

from native.comm import SelfCommunicator
from forest import CausalForest, GBDTRegressor, RegressionForest, merge_forests
from forest.io import model_io
from forest.criteria.causal import CausalChannels
from forest.engine.honest_forest import global_ids, oob_average
from forest.analysis.inference import solve_theta
from forest.engine.predictor import predict_values

SELF = SelfCommunicator()
N = 500


def data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    t = (rng.uniform(size=n) < 0.5).astype(float)
    y = X[:, 0] + t * (1.0 + (X[:, 1] > 0)) + 0.5 * rng.normal(size=n)
    return X, t, y


def mean_moments(est, X):
    return predict_values(est.estimators_, X) / (len(est.estimators_["tree_offsets"]) - 1)


@pytest.mark.mpi
def test_merged_regression_forest_is_the_forest_of_all_trees(comm, rank_slice):
    X, _, y = data()
    sl = rank_slice(N)
    parts = [RegressionForest(n_estimators=n, random_state=seed).fit(X[sl], y[sl], comm=comm)
             for n, seed in ((6, 1), (10, 2))]
    merged = merge_forests(parts)
    gids, _ = global_ids(comm, len(X[sl]))
    oob_merged = merged.oob_predict(X[sl], comm=comm)
    sums = [oob_average(p.estimators_, X[sl], gids, p.sampling_) for p in parts]   # (average, count) per part
    # no collective below
    acc = sum(np.nan_to_num(avg[:, 0]) * cnt for avg, cnt in sums)
    cnt = sum(c for _, c in sums)
    with np.errstate(invalid="ignore"):
        expected = acc / cnt
    expected[cnt == 0] = merged.predict(X[sl][cnt == 0])     # rows every tree drew: the whole forest's
    np.testing.assert_allclose(oob_merged, expected, rtol=1e-12)
    np.testing.assert_allclose(merged.predict(X), (6 * parts[0].predict(X) + 10 * parts[1].predict(X)) / 16,
                               rtol=1e-12, atol=1e-12)
    assert merged.n_estimators == 16 and merged.random_state == 1
    assert merged.sampling_["segments"] == [[1, 0, 6], [2, 0, 10]]
    assert not hasattr(merged, "oob_prediction_") and hasattr(parts[0], "oob_prediction_")
    assert len(parts[0].estimators_["tree_offsets"]) == 7      # parts untouched


def test_merged_causal_forest_with_shared_nuisance(tmp_path):
    X, t, y = data()
    y_hat = RegressionForest(n_estimators=20, random_state=9).fit(X, y, comm=SELF).oob_prediction_
    t_hat = np.full(N, t.mean())
    parts = [CausalForest(n_estimators=8, random_state=seed).fit(X, t, y, y_hat=y_hat, t_hat=t_hat, comm=SELF)
             for seed in (1, 2, 3)]
    merged = merge_forests(parts)
    moments = sum(mean_moments(p, X) for p in parts) / 3
    theta, _ = solve_theta(moments, CausalChannels(1, 1))
    np.testing.assert_allclose(merged.predict(X), theta[:, 0, 0], rtol=1e-10, atol=1e-12)
    lo, hi = merged.predict_interval(X, alpha=0.1)
    assert np.all(np.isfinite(lo)) and np.all(lo < hi)
    assert np.all(np.isfinite(merged.oob_predict(X, comm=SELF)))
    # the training rows' summaries belong to one part; rows passed again are scored with
    # the shared nuisance forests
    assert not hasattr(merged, "ate_") and not hasattr(merged, "dr_scores_")
    with pytest.raises(ValueError, match="pass held-out rows as X, t and y"):
        merged.average_treatment_effect()
    path = str(tmp_path / "merged.model")
    model_io.save(merged, path)
    loaded = model_io.load(path)
    np.testing.assert_array_equal(loaded.predict(X), merged.predict(X))
    np.testing.assert_array_equal(loaded.oob_predict(X, comm=SELF), merged.oob_predict(X, comm=SELF))


def test_incompatible_forests_are_refused():
    X, t, y = data()
    a = RegressionForest(n_estimators=4, random_state=1).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="forests 0 and 1 both hold trees 0-3 of seed 1"):
        merge_forests([a, a])
    with pytest.raises(ValueError, match=r"differ in max_depth \(None vs 3\)"):
        merge_forests([a, RegressionForest(n_estimators=4, random_state=2, max_depth=3).fit(X, y, comm=SELF)])
    with pytest.raises(ValueError, match="different bin edges"):
        merge_forests([a, RegressionForest(n_estimators=4, random_state=2).fit(X[::2], y[::2], comm=SELF)])
    with pytest.raises(ValueError, match="n_outputs_"):
        merge_forests([a, RegressionForest(n_estimators=4, random_state=2).fit(X, np.c_[y, y], comm=SELF)])
    gb = GBDTRegressor(n_estimators=3).fit(X, y, comm=SELF)
    with pytest.raises(TypeError, match="not GBDTRegressor"):
        merge_forests([gb, gb])
    with pytest.raises(TypeError, match="forest 1 is a GBDTRegressor"):
        merge_forests([a, gb])
    c1 = CausalForest(n_estimators=4, nuisance_estimators=4, random_state=1).fit(X, t, y, comm=SELF)
    c2 = CausalForest(n_estimators=4, nuisance_estimators=4, random_state=2).fit(X, t, y, comm=SELF)
    with pytest.raises(ValueError, match="centred on different nuisance estimates"):
        merge_forests([c1, c2])
    c3 = CausalForest(n_estimators=3, random_state=1).fit(X, t, y, y_hat=y, t_hat=np.full(N, 0.5), comm=SELF)
    c4 = CausalForest(n_estimators=4, random_state=2).fit(X, t, y, y_hat=y, t_hat=np.full(N, 0.5), comm=SELF)
    with pytest.raises(ValueError, match="ci_group_size=2 every forest but the last must hold a multiple of 2"):
        merge_forests([c3, c4])
    assert merge_forests([c4, c3]).n_estimators == 7
    one = merge_forests([c1])
    assert one is not c1 and one.ate_ == c1.ate_
    with pytest.raises(ValueError, match="warm start cannot continue a merged forest"):
        merge_forests([c4, c3]).set_params(warm_start=True, n_estimators=9).fit(X, t, y, y_hat=y,
                                                                                t_hat=np.full(N, 0.5), comm=SELF)

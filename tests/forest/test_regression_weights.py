"""Weighted regression forests predict with grf's forest-level estimator (issue 38's first difference).

grf: ``mu(x) = sum_i alpha_i(x) w_i Y_i / sum_i alpha_i(x) w_i`` with the forest weights
``alpha_i(x)`` (each tree: 1 / rows of x's leaf). Averaging each tree's weighted leaf mean
instead is biased when the weights go with the outcome inside small leaves.
"""
import copy

import numpy as np
import pytest

from forest.estimators.regression_forest import RegressionForest
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _as_leaf_means(rf):
    """The same trees with leaves as forests wrote them before: weighted means and rows (per-tree average)."""
    old = copy.deepcopy(rf)
    v, k = old.estimators_["value"], rf.n_outputs_
    mean_weight = v[:, k + 1:k + 2]
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(mean_weight > 0, v[:, :k] / np.where(mean_weight > 0, mean_weight, 1.0), 0.0)
    old.estimators_["value"] = np.ascontiguousarray(np.hstack([means, v[:, k:k + 1]]))
    return old


@pytest.mark.parametrize("seed", [0, 1])
def test_weighted_oob_mean_is_the_weighted_mean_of_y(seed):
    """grf's claim: with weights that go with y, the mean out-of-bag prediction is within 0.05 of the
    weighted mean of y (the per-tree average of leaf means was 0.28 too low here)."""
    rng = np.random.default_rng(seed)
    n = 1500
    X = rng.normal(size=(n, 4))
    y = rng.normal(size=n)                       # nothing to learn from X
    w = np.where(y > 0, 10.0, 1.0)
    rf = RegressionForest(150, min_samples_leaf=1, random_state=seed).fit(X, y, w, comm=SELF)
    target = np.average(y, weights=w)
    assert abs(rf.oob_predict().mean() - target) < 0.05
    assert abs(rf.predict(X).mean() - target) < 0.05
    old = _as_leaf_means(rf)
    assert target - old.oob_predict(X, comm=SELF).mean() > 0.15    # the bias this fixes
    np.testing.assert_array_equal(rf.oob_predict(X, comm=SELF), rf.oob_predict())


def test_unweighted_forests_predict_the_mean_of_leaf_means_bit_for_bit():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(800, 3))
    y = X[:, 0] + rng.normal(size=800)
    rf = RegressionForest(40, random_state=2).fit(X, y, comm=SELF)
    assert np.all(rf.estimators_["value"][:, 2] == 1.0)               # mean weight: exactly 1
    old = _as_leaf_means(rf)
    np.testing.assert_array_equal(rf.predict(X), old.predict(X))
    np.testing.assert_array_equal(rf.oob_predict(), old.oob_predict(X, comm=SELF))
    # equal weights on any scale are the unweighted fit
    again = RegressionForest(40, random_state=2).fit(X, y, np.full(800, 1e-3), comm=SELF)
    np.testing.assert_array_equal(again.predict(X), rf.predict(X))


def test_old_leaf_layout_cannot_be_continued_or_merged():
    from forest import merge_forests

    rng = np.random.default_rng(4)
    X = rng.normal(size=(300, 3))
    y = X[:, 0] + rng.normal(size=300)
    rf = RegressionForest(8, random_state=1, warm_start=True).fit(X, y, comm=SELF)
    old = _as_leaf_means(rf)
    old.set_params(n_estimators=16)
    with pytest.raises(ValueError, match="older histforest|per-tree leaf means"):
        old.fit(X, y, comm=SELF)
    other = RegressionForest(8, random_state=2).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="older histforest"):
        merge_forests([_as_leaf_means(other), rf])

"""Size limits of regression forests count rows, and grf's ``min_node_size`` (issue 38).

grf's claims, as its own tests state them: sample weights never count as rows in a size
limit, so a weight of 2 equals two copies of the row wherever no size limit binds
(grf: ``sample.fraction = 1``, ``min.node.size = 1``, no honesty); and ``min.node.size``
stops splitting nodes of that many rows or fewer while letting children be smaller, so
trees grow deeper than scikit-learn's ``min_samples_leaf`` at the same number.
"""
import numpy as np
import pytest

from forest import RegressionForest, model_io
from forest.estimators.regression_forest import size_rules
from native.comm import SelfCommunicator
from tests.conftest import block_slice

SELF = SelfCommunicator()


def _replication_data(rng, n=500, p=10):
    X = rng.normal(size=(n, p))
    y = X[:, 0] * rng.normal(size=n)
    dup = rng.choice(n, 100, replace=False)
    w = np.ones(n)
    w[dup] = 2.0
    return X, y, w, np.vstack([X, X[dup]]), np.concatenate([y, y[dup]])


REPLICATION = dict(max_samples=1.0, min_samples_leaf=1, honest=False)


@pytest.mark.parametrize("grf_rules", [False, True])
def test_integer_weights_equal_replicated_rows(grf_rules):
    """grf's test: weights of 2 on 100 of 500 rows against those rows duplicated (sample fraction 1,
    min node size 1, no honesty): equal predictions. Limits that compared summed (rescaled) weights
    stopped nodes of two rows weighing 5/6 each and differed by up to 1.47."""
    rng = np.random.default_rng(123)
    X, y, w, XX, yy = _replication_data(rng)
    kw = dict(REPLICATION, n_estimators=30, random_state=4, **(dict(min_node_size=1) if grf_rules else {}))
    weighted = RegressionForest(**kw).fit(X, y, sample_weight=w, comm=SELF)
    replicated = RegressionForest(**kw).fit(XX, yy, comm=SELF)
    np.testing.assert_allclose(weighted.predict(XX), replicated.predict(XX), rtol=0, atol=1e-10)


def _tree_nodes(forest):
    """``(count, left, right)`` per tree of a packed forest (child ids index the whole forest's
    arrays; they are made local to the tree here)."""
    pk = forest.estimators_
    off = pk["tree_offsets"]
    out = []
    for a, b in zip(off[:-1], off[1:]):
        left, right = pk["left"][a:b].copy(), pk["right"][a:b].copy()
        inner = left >= 0
        left[inner] -= a
        right[inner] -= a
        out.append((pk["count"][a:b], left, right))
    return out


@pytest.mark.parametrize("weighted", [False, True])
def test_min_node_size_stops_at_node_rows_and_lets_children_be_small(weighted):
    rng = np.random.default_rng(2)
    n = 3000
    X = rng.uniform(size=(n, 4))
    y = np.sin(6 * X[:, 0]) + X[:, 1] + 0.3 * rng.normal(size=n)
    w = rng.uniform(0.05, 20.0, n) if weighted else None     # weights far from 1: rows must still decide
    m, alpha = 5, 0.05
    rf = RegressionForest(20, honest=False, min_node_size=m, random_state=0).fit(X, y, sample_weight=w, comm=SELF)
    assert size_rules(rf) == (m + 1.0, 1, alpha)
    small_leaves = 0
    for count, left, right in _tree_nodes(rf):
        inner = left >= 0
        assert np.all(count[inner] > m)                       # nodes of <= m rows never split
        least = np.maximum(1.0, np.ceil(alpha * count[inner]))
        assert np.all(count[left[inner]] >= least) and np.all(count[right[inner]] >= least)
        np.testing.assert_array_equal(count[left[inner]] + count[right[inner]], count[inner])
        small_leaves += int(np.sum(count[~inner] < m))
    assert small_leaves > 100                                 # children below the old 5-row minimum
    # deeper trees than scikit-learn's rule at the same number
    sk = RegressionForest(20, honest=False, min_samples_leaf=m, random_state=0).fit(X, y, sample_weight=w,
                                                                                   comm=SELF)
    assert len(rf.estimators_["left"]) > 1.5 * len(sk.estimators_["left"])
    for count, left, _ in _tree_nodes(sk):
        assert np.all(count[left >= 0] >= 2 * m) and np.all(count[left < 0] >= m)


def test_min_node_size_is_more_accurate_on_a_smooth_signal():
    """grf-deep trees fit a smooth signal better than scikit-learn's rule at the same number (held-out MSE)."""
    rng = np.random.default_rng(11)
    n, p = 2000, 5
    X = rng.normal(size=(n, p))
    y = np.abs(X[:, 0]) + 0.5 * X[:, 1] ** 2 + 0.5 * rng.normal(size=n)
    Xt = rng.normal(size=(3000, p))
    truth = np.abs(Xt[:, 0]) + 0.5 * Xt[:, 1] ** 2
    mse = {}
    for name, kw in (("grf", dict(min_node_size=5)), ("sklearn", dict(min_samples_leaf=5))):
        rf = RegressionForest(100, random_state=3, **kw).fit(X, y, comm=SELF)
        mse[name] = np.mean((rf.predict(Xt) - truth) ** 2)
    assert mse["grf"] < 0.92 * mse["sklearn"], mse


def test_size_parameters_are_checked_and_kept_in_model_files():
    X = np.random.default_rng(0).normal(size=(200, 3))
    y = X[:, 0]
    for bad, match in ((dict(min_node_size=0), "min_node_size"), (dict(alpha=0.3), "alpha"),
                       (dict(alpha="x"), "alpha"), (dict(min_samples_leaf=0), "min_samples_leaf")):
        with pytest.raises((ValueError, TypeError), match=match):
            RegressionForest(3, **bad).fit(X, y, comm=SELF)
    rf = RegressionForest(5, min_node_size=3, alpha=0.1, random_state=0).fit(X, y, comm=SELF)
    back = model_io.loads(model_io.dumps(rf), expect=RegressionForest)
    assert (back.min_node_size, back.alpha, back.min_samples_leaf) == (3, 0.1, None)
    np.testing.assert_array_equal(back.predict(X), rf.predict(X))
    assert size_rules(RegressionForest()) == (10.0, 5, 0.0)
    assert size_rules(RegressionForest(min_samples_leaf=2, min_node_size=8, alpha=0.0)) == (9.0, 2, 0.0)


@pytest.mark.mpi
def test_min_node_size_and_weights_same_forest_for_any_rank_count(comm):
    rng = np.random.default_rng(5)
    n = 900
    X = rng.normal(size=(n, 4))
    y = X[:, 0] + rng.normal(size=n)
    w = rng.uniform(0.2, 3.0, n)
    sl = block_slice(n, comm.size, comm.rank)
    kw = dict(n_estimators=8, max_bins=32, min_node_size=3, random_state=6)
    dist = RegressionForest(**kw).fit(X[sl], y[sl], sample_weight=w[sl], comm=comm)
    ref = RegressionForest(**kw).fit(X, y, sample_weight=w, comm=SELF)
    for k in ("feature", "bin_threshold", "left", "count"):
        np.testing.assert_array_equal(dist.estimators_[k], ref.estimators_[k])
    np.testing.assert_allclose(dist.predict(X), ref.predict(X), rtol=0, atol=1e-9)


def test_imbalance_penalty_is_in_the_units_of_y_and_the_weights_as_given():
    """grf's imbalance.penalty: the gain of a split loses penalty * (1/n_left + 1/n_right). The trees grow
    on a standardised outcome and rescaled weights, so the penalty is converted: scaling y by c and the
    penalty by c**2 (or the weights and the penalty by the same factor) grows the same trees."""
    rng = np.random.default_rng(12)
    n = 1500
    X = rng.normal(size=(n, 4))
    y = 3 * X[:, 0] + rng.normal(size=n)
    w = rng.uniform(0.5, 2.0, n)
    kw = dict(n_estimators=10, min_samples_leaf=1, random_state=0)
    base = RegressionForest(imbalance_penalty=0.5, **kw).fit(X, y, sample_weight=w, comm=SELF)
    for c in (4.0, 0.25):
        scaled = RegressionForest(imbalance_penalty=0.5 * c * c, **kw).fit(X, c * y, sample_weight=w, comm=SELF)
        np.testing.assert_array_equal(scaled.estimators_["feature"], base.estimators_["feature"])
        weighted = RegressionForest(imbalance_penalty=0.5 * c, **kw).fit(X, y, sample_weight=c * w, comm=SELF)
        np.testing.assert_array_equal(weighted.estimators_["feature"], base.estimators_["feature"])
    # grf's claims: a positive penalty still grows deep trees; a tiny one is the unpenalised forest
    # (out-of-bag errors), a large one is not
    free = RegressionForest(imbalance_penalty=0.0, **kw).fit(X, y, comm=SELF)
    tiny = RegressionForest(imbalance_penalty=1e-7, **kw).fit(X, y, comm=SELF)
    large = RegressionForest(imbalance_penalty=100.0, **kw).fit(X, y, comm=SELF)
    assert base.estimators_["depth"].max() >= 4
    assert np.mean(np.abs(tiny.oob_predict() - free.oob_predict())) < \
        0.1 * np.mean(np.abs(large.oob_predict() - free.oob_predict()))
    assert len(large.estimators_["feature"]) < len(free.estimators_["feature"])
    with pytest.raises(ValueError, match="imbalance_penalty"):
        RegressionForest(3, imbalance_penalty=-1).fit(X, y, comm=SELF)

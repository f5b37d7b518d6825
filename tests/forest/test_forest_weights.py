"""Forest weights (issue 34): kernel vs reference, grf's identities, training rows passed again, ranks."""
import warnings

import numpy as np
import pytest
from scipy import sparse

from native.comm import SelfCommunicator
from forest import CausalForest, InstrumentalForest, RegressionForest, model_io
from forest.analysis.inference import solve_theta
from forest.criteria.causal import CausalCriterion
from forest.engine.forest_weights import estimation_slices, forest_weights, forest_weights_reference, value_nodes
from forest.engine.predictor import predict_leaves, predict_leaves_binned
from forest.engine.subsample import forest_row_codes

SELF = SelfCommunicator()


def _data(n, seed=0, d=4):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    y = X[:, 0] + np.where(X[:, 1] > 0, 1.0, -1.0) + rng.normal(size=n)
    return X, y, rng


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("honesty_fraction", [0.5, 0.85])
def test_kernel_equals_reference(weighted, honesty_fraction):
    # honesty_fraction 0.85 leaves few estimation rows per tree: many empty leaves take
    # their parent's value, which the weights must follow
    X, y, rng = _data(500, 1)
    w = rng.uniform(0, 2, size=len(y)) * (rng.uniform(size=len(y)) > 0.2) if weighted else None
    f = RegressionForest(12, min_samples_leaf=1, honesty_fraction=honesty_fraction, random_state=3).fit(
        X, y, sample_weight=w, comm=SELF)
    packed = f.estimators_
    codes = f.bin_mapper_.transform(X)
    train_leaves = predict_leaves_binned(packed, codes, f.bin_mapper_.missing_bin_)
    roles = forest_row_codes(f.sampling_, 12, np.arange(len(y)))
    factor = f._weights_source_.factor
    Xq = rng.normal(size=(30, X.shape[1]))
    q_leaves = predict_leaves(packed, Xq)
    indptr, indices, data = forest_weights(packed, q_leaves, estimation_slices(packed, train_leaves, roles), factor,
                                           1, 2)
    got = sparse.csr_matrix((data, indices, indptr), shape=(30, len(y))).toarray()
    ref = forest_weights_reference(packed, q_leaves, train_leaves, roles, factor, 1, 2)
    np.testing.assert_allclose(got, ref, rtol=1e-14, atol=1e-15)
    if honesty_fraction == 0.85:
        vn = value_nodes(packed, 1)
        assert (vn != np.arange(len(vn))).any()        # some nodes take an ancestor's value


@pytest.mark.parametrize("weighted", [False, True])
def test_regression_weights_reproduce_predict(weighted):
    # grf: predict(x) = sum_i alpha_i(x) y_i, the rows of alpha summing to 1
    X, y, rng = _data(700, 2)
    w = rng.uniform(0.1, 3, size=len(y)) if weighted else None
    f = RegressionForest(40, min_samples_leaf=2, honesty_fraction=0.7, random_state=0).fit(X, y, sample_weight=w,
                                                                                          comm=SELF)
    Xq = rng.normal(size=(60, X.shape[1]))
    W = f.get_forest_weights(Xq, comm=SELF)
    assert sparse.isspmatrix_csr(W) and W.shape == (60, len(y))
    assert W.min() >= 0
    np.testing.assert_allclose(np.asarray(W.sum(axis=1)).ravel(), 1.0, atol=1e-12)
    np.testing.assert_allclose(W @ y, f.predict(Xq), atol=1e-9)


def test_multi_output_and_training_rows_again():
    X, y, rng = _data(500, 3)
    Y = np.column_stack([y, X[:, 2] ** 2])
    w = rng.uniform(0.5, 2, size=len(y))
    f = RegressionForest(20, random_state=1).fit(X, Y, sample_weight=w, comm=SELF)
    Xq = rng.normal(size=(25, X.shape[1]))
    W = f.get_forest_weights(Xq, comm=SELF)
    np.testing.assert_allclose(W @ Y, f.predict(Xq), atol=1e-9)
    restored = model_io.loads(model_io.dumps(f))
    assert not hasattr(restored, "_weights_source_")     # training rows never reach the file
    with pytest.raises(ValueError, match="X_train"):
        restored.get_forest_weights(Xq, comm=SELF)
    again = restored.get_forest_weights(Xq, X_train=X, sample_weight=w, comm=SELF)
    np.testing.assert_array_equal(again.toarray(), W.toarray())
    with pytest.raises(ValueError, match="not this model's training data"):
        restored.get_forest_weights(Xq, X_train=X[::-1], sample_weight=w, comm=SELF)
    with pytest.raises(ValueError, match="go with X_train"):
        f.get_forest_weights(Xq, sample_weight=w, comm=SELF)


def test_causal_weights_solve_to_predict():
    # The causal forest's tau(x) is the local estimating equation solved with the
    # forest weights over the rows' moments (grf's causal forest).
    X, _, rng = _data(900, 4)
    n = len(X)
    t = rng.integers(0, 2, n).astype(float)
    y = X[:, 0] * t + X[:, 1] + rng.normal(size=n)
    y_hat, t_hat = 0.1 * rng.normal(size=n), np.full(n, 0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        c = CausalForest(40, random_state=0).fit(X, t, y, y_hat=y_hat, t_hat=t_hat, comm=SELF)
    Xq = rng.normal(size=(40, X.shape[1]))
    W = c.get_forest_weights(Xq, comm=SELF).toarray()
    np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-12)
    crit = CausalCriterion(1, 1)
    rows = crit.make_channels((t - t_hat)[:, None], (y - y_hat)[:, None], np.ones(n), t[:, None])
    theta, _ = solve_theta(W @ rows[:, :crit.layout.n_moments], crit.layout)
    np.testing.assert_allclose(theta[:, 0, 0], c.predict(Xq), atol=1e-9)


def test_instrumental_forest_has_weights():
    X, _, rng = _data(600, 5)
    n = len(X)
    z = rng.integers(0, 2, n).astype(float)
    t = (z + rng.normal(size=n) > 0.5).astype(float)
    y = t * (1 + X[:, 0]) + rng.normal(size=n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        iv = InstrumentalForest(20, random_state=0).fit(X, t, y, z, comm=SELF)
    W = iv.get_forest_weights(X[:10], comm=SELF)
    np.testing.assert_allclose(np.asarray(W.sum(axis=1)).ravel(), 1.0, atol=1e-12)


@pytest.mark.mpi
def test_weights_identical_at_any_rank_count(comm):
    X, y, rng = _data(600, 6)
    w = rng.uniform(0.5, 2, size=len(y))
    Xq = rng.normal(size=(20, X.shape[1]))
    lo, hi = len(y) * comm.rank // comm.size, len(y) * (comm.rank + 1) // comm.size
    ql, qh = 20 * comm.rank // comm.size, 20 * (comm.rank + 1) // comm.size
    kw = dict(n_estimators=16, min_samples_leaf=2, random_state=4)
    dist = RegressionForest(**kw).fit(X[lo:hi], y[lo:hi], sample_weight=w[lo:hi], comm=comm)
    mine = dist.get_forest_weights(Xq[ql:qh], comm=comm).toarray()       # every rank's queries, my columns
    again = model_io.loads(model_io.dumps(dist)).get_forest_weights(
        Xq[ql:qh], X_train=X[lo:hi], sample_weight=w[lo:hi], comm=comm).toarray()
    ref = RegressionForest(**kw).fit(X, y, sample_weight=w, comm=SELF)
    full = ref.get_forest_weights(Xq, comm=SELF).toarray()
    assert mine.shape == (20, hi - lo)
    np.testing.assert_allclose(mine, full[:, lo:hi], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(again, mine)


def test_probability_forest_weights_give_its_probabilities():
    from forest import ProbabilityForest
    X, y, rng = _data(600, 7)
    labels = np.where(y > 0.5, "hi", np.where(y < -0.5, "lo", "mid"))
    w = rng.uniform(0.5, 2, size=len(y))
    f = ProbabilityForest(20, random_state=0).fit(X, labels, sample_weight=w, comm=SELF)
    Xq = rng.normal(size=(30, X.shape[1]))
    onehot = (labels[:, None] == f.classes_[None, :]).astype(float)
    np.testing.assert_allclose(f.get_forest_weights(Xq, comm=SELF) @ onehot, f.predict_proba(Xq), atol=1e-9)


def test_apply_gives_the_leaves_the_weights_come_from():
    """grf's get_leaf_node: two rows share a tree's leaf exactly where that tree gives each weight in
    the other's estimate; the ids are leaves of their trees."""
    from forest import RegressionForest
    from native.comm import SelfCommunicator

    rng = np.random.default_rng(9)
    X = rng.normal(size=(300, 3))
    y = X[:, 0] + rng.normal(size=300)
    rf = RegressionForest(10, honest=False, max_samples=1.0, random_state=0).fit(X, y, comm=SelfCommunicator())
    leaves = rf.apply(X)
    assert leaves.shape == (300, 10)
    pk = rf.estimators_
    offsets = pk["tree_offsets"][:-1]
    assert (pk["left"][leaves + offsets] < 0).all()                  # every id is a leaf of its tree
    # one tree, every training row drawn, no honesty: x's weights are its leaf-mates
    single = RegressionForest(1, honest=False, max_samples=1.0, random_state=0).fit(X, y, comm=SelfCommunicator())
    w = single.get_forest_weights(X[:20]).toarray()
    mates = single.apply(X[:20]) == single.apply(X).T[0][None, :]
    np.testing.assert_array_equal(w > 0, mates)

"""grf's local linear pieces beyond the regression correction (issue 38): out-of-bag forest weights,
the out-of-bag choice of ``ll_lambda``, and the local linear correction of the causal forest."""
import numpy as np
import pytest
from scipy import sparse

from forest import CausalForest, RegressionForest
from forest.analysis.local_linear import (LAMBDA_PATH, local_linear_causal_reference, local_linear_causal_solve,
                                          local_linear_causal_sums, local_linear_causal_sums_reference,
                                          local_linear_reference)
from forest.engine.oob_forest_weights import oob_forest_weights, oob_forest_weights_reference, oob_query_leaves
from forest.estimators import local_linear as local_linear_estimators
from forest.io import model_io
from forest.estimators.local_linear import _TrainingLayout
from native.blocks import block_range
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _dense_oob_weights(est, X):
    """The compiled out-of-bag weights of a forest's training rows, as a dense matrix."""
    layout = _TrainingLayout(est, est._source_from(X, None, None, SELF))
    count_col, norm_col = est._weights_columns()
    q = oob_query_leaves(layout.leaves, layout.codes)
    indptr, indices, data = oob_forest_weights(est.estimators_, q, layout.slices, layout.source.factor, count_col,
                                               norm_col)
    return sparse.csr_matrix((data, indices, indptr), shape=(len(X), len(X))).toarray(), layout


def _linear_design(seed, n=300, p=3):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, p))
    y = 1.0 + 2.0 * X[:, 0] - X[:, 1] + rng.normal(size=n)
    return X, y


def test_oob_weights_equal_reference_and_oob_prediction():
    """The kernel equals the plain-Python walk; with the regression forest's weights, ``alpha^oob y`` is
    the forest's own out-of-bag prediction, and no row weighs itself."""
    X, y = _linear_design(0, n=120)
    w = np.random.default_rng(1).uniform(0.5, 2.0, len(y))
    rf = RegressionForest(12, max_bins=16, random_state=0).fit(X, y, sample_weight=w, comm=SELF)
    layout = _TrainingLayout(rf, rf._source_from(X, w, None, SELF))
    count_col, norm_col = rf._weights_columns()
    q = oob_query_leaves(layout.leaves, layout.codes)
    assert (q < 0).any() and (q >= 0).any()
    indptr, indices, data = oob_forest_weights(rf.estimators_, q, layout.slices, layout.source.factor, count_col,
                                               norm_col)
    got = sparse.csr_matrix((data, indices, indptr), shape=(len(X), len(X))).toarray()
    ref = oob_forest_weights_reference(rf.estimators_, q, layout.leaves, layout.codes, layout.source.factor,
                                       count_col, norm_col)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-15)
    assert np.all(np.diag(got) == 0)
    has = got.sum(axis=1) > 0
    np.testing.assert_allclose(got[has].sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(got[has] @ y, rf.oob_prediction_[has], rtol=1e-10, atol=1e-12)


def test_regression_lambda_is_argmin_of_reference_criterion():
    """grf's rule: the first lambda of the grid with least mean squared out-of-bag error, here
    recomputed row by row with grf's formula from the dense out-of-bag weights."""
    X, y = _linear_design(2)
    rf = RegressionForest(60, random_state=0).fit(X, y, comm=SELF)
    path = rf.tune_local_linear(X, y, comm=SELF)
    np.testing.assert_array_equal(path.lambdas, LAMBDA_PATH)
    alpha, _ = _dense_oob_weights(rf, X)
    ref = np.array([[local_linear_reference(alpha[i], X, y[:, None], X[i], lam)[0] if alpha[i].sum() > 0 else np.nan
                     for lam in LAMBDA_PATH] for i in range(len(X))])
    np.testing.assert_allclose(path.oob_predictions, ref, rtol=1e-8, atol=1e-10)
    used = np.isfinite(ref).all(axis=1)
    errors = np.mean((ref[used] - y[used, None]) ** 2, axis=0)
    np.testing.assert_allclose(path.errors, errors, rtol=1e-9)
    assert path.ll_lambda == LAMBDA_PATH[int(np.argmin(errors))]
    assert path.n_rows == used.sum() and rf.local_linear_tuning_ is path
    best = path.errors[list(path.lambdas).index(path.ll_lambda)]
    assert best <= path.errors[0] and best <= path.errors[-1]
    # ll_lambda=None predicts with the chosen lambda
    Xq = np.random.default_rng(3).uniform(-1, 1, size=(20, 3))
    np.testing.assert_array_equal(rf.predict_local_linear(Xq, X, y, ll_lambda=None, comm=SELF),
                                  rf.predict_local_linear(Xq, X, y, ll_lambda=path.ll_lambda, comm=SELF))
    with pytest.raises(ValueError, match="lambdas must be"):
        rf.tune_local_linear(X, y, lambdas=[-1.0], comm=SELF)
    # the choice describes training rows: not in model files
    assert not hasattr(model_io.loads(model_io.dumps(rf)), "local_linear_tuning_")


def test_causal_sums_and_solve_equal_grf_formula():
    rng = np.random.default_rng(4)
    n_q, n_t, p = 12, 150, 2
    dense = np.where(rng.random((n_q, n_t)) < 0.3, rng.random((n_q, n_t)), 0.0)
    dense[2] = 0.0
    W = sparse.csr_matrix(dense)
    X_train, w, y = rng.normal(size=(n_t, p)), rng.normal(size=n_t), rng.normal(size=(n_t, 2))
    queries = rng.normal(size=(n_q, p))
    M, b = local_linear_causal_sums(W, X_train, w, y, queries)
    Mr, br = local_linear_causal_sums_reference(W, X_train, w, y, queries)
    np.testing.assert_allclose(M, Mr, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b, br, rtol=1e-12, atol=1e-12)
    assert np.isnan(local_linear_causal_solve(M[2:3], b[2:3], 0.0)).all()
    for weight_penalty in (False, True):
        for lam in (0.0, 0.1, 3.0):
            got = local_linear_causal_solve(M, b, lam, weight_penalty)
            for q in (0, 5, 11):
                ref = local_linear_causal_reference(dense[q], X_train, w, y, queries[q], lam, weight_penalty)
                np.testing.assert_allclose(got[q], ref, rtol=1e-9)


def _causal_design(seed, n=1000, p=6, kind="binary"):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    tau = 1.0 + 2.0 * X[:, 0]
    t = rng.binomial(1, 0.5, n) if kind == "binary" else rng.normal(size=n) + 0.3 * X[:, 1]
    y = X[:, 1] + tau * t + rng.normal(size=n)
    return X, t, y


def test_causal_correction_beats_plain_forest_on_linear_effect():
    """grf's "local linear causal forests work in a simple case", with a linear effect 1 + 2 x0: the
    correction on x0 cuts the held-out CATE error several-fold (grf asks for 0.8; here about 0.1)."""
    X, t, y = _causal_design(5)
    cf = CausalForest(200, random_state=0).fit(X, t, y, comm=SELF)
    Xq = np.random.default_rng(6).normal(size=(300, X.shape[1]))
    truth = 1.0 + 2.0 * Xq[:, 0]
    ll = cf.predict_local_linear(Xq, X, t, y, linear_correction_variables=[0], ll_lambda=0.01, comm=SELF)
    mse_ll, mse_cf = np.mean((ll - truth) ** 2), np.mean((cf.predict(Xq) - truth) ** 2)
    assert mse_ll < 0.35 * mse_cf, (mse_ll, mse_cf)


@pytest.mark.parametrize("kind", ["binary", "continuous"])
def test_causal_correction_equals_reference_and_large_lambda_gives_forest(kind):
    X, t, y = _causal_design(7, n=400, p=3, kind=kind)
    w = np.random.default_rng(8).uniform(0.5, 2.0, len(y)) if kind == "continuous" else None
    cf = CausalForest(60, random_state=1).fit(X, t, y, sample_weight=w, comm=SELF)
    Xq = np.random.default_rng(9).normal(size=(8, 3))
    cols = [0, 2]
    got = cf.predict_local_linear(Xq, X, t, y, linear_correction_variables=cols, ll_lambda=0.05, sample_weight=w,
                                  comm=SELF)
    alpha = cf.get_forest_weights(Xq, comm=SELF).toarray() * (1.0 if w is None else w)
    rows = cf._oob_rows_
    yc, wc = rows.Y - rows.y_hat, (rows.W - rows.t_hat)[:, 0]
    for q in range(len(Xq)):
        ref = local_linear_causal_reference(alpha[q], X[:, cols], wc, yc, Xq[q, cols], 0.05)
        np.testing.assert_allclose(got[q], ref[0], rtol=1e-8)
    # a huge penalty leaves the regression on [1, W~]: the forest's own estimate
    flat = cf.predict_local_linear(Xq, X, t, y, ll_lambda=1e12, sample_weight=w, comm=SELF)
    np.testing.assert_allclose(flat, cf.predict(Xq), rtol=1e-6, atol=1e-8)
    # the centring recomputed from the nuisance forests (a process that did not fit) is the fit's
    del cf._oob_rows_
    again = cf.predict_local_linear(Xq, X, t, y, linear_correction_variables=cols, ll_lambda=0.05, sample_weight=w,
                                    comm=SELF)
    np.testing.assert_allclose(again, got, rtol=1e-12)


def test_causal_lambda_is_argmin_of_reference_r_loss():
    X, t, y = _causal_design(10, n=300, p=3)
    cf = CausalForest(60, random_state=2).fit(X, t, y, comm=SELF)
    cols = [0]
    path = cf.tune_local_linear(X, t, y, linear_correction_variables=cols, comm=SELF)
    assert path.criterion == "R-loss"
    alpha, _ = _dense_oob_weights(cf, X)
    rows = cf._oob_rows_
    yc, wc = (rows.Y - rows.y_hat)[:, 0], (rows.W - rows.t_hat)[:, 0]
    tau = np.array([[local_linear_causal_reference(alpha[i], X[:, cols], wc, yc[:, None], X[i, cols], lam)[0]
                     if alpha[i].sum() > 0 else np.nan for lam in LAMBDA_PATH] for i in range(len(X))])
    np.testing.assert_allclose(path.oob_predictions, tau, rtol=1e-7, atol=1e-9)
    used = np.isfinite(tau).all(axis=1)
    errors = np.mean((yc[used, None] - wc[used, None] * tau[used]) ** 2, axis=0)
    np.testing.assert_allclose(path.errors, errors, rtol=1e-9)
    assert path.ll_lambda == LAMBDA_PATH[int(np.argmin(errors))]
    Xq = X[:5] + 0.01
    np.testing.assert_array_equal(
        cf.predict_local_linear(Xq, X, t, y, linear_correction_variables=cols, ll_lambda=None, comm=SELF),
        cf.predict_local_linear(Xq, X, t, y, linear_correction_variables=cols, ll_lambda=path.ll_lambda, comm=SELF))


def test_causal_refusals():
    X, t, y = _causal_design(11, n=200, p=3)
    cf = CausalForest(20, random_state=0).fit(X, t, y, comm=SELF)
    with pytest.raises(ValueError, match="not this model's training data"):
        cf.predict_local_linear(X[:5], X, t, y[::-1], comm=SELF)
    with pytest.raises(ValueError, match="ll_lambda must be"):
        cf.predict_local_linear(X[:5], X, t, y, ll_lambda=-0.5, comm=SELF)
    with pytest.raises(ValueError, match="linear_correction_variables index 9 is out of range"):
        cf.predict_local_linear(X[:5], X, t, y, linear_correction_variables=[9], comm=SELF)
    arms = np.random.default_rng(0).integers(0, 3, len(y))
    multi = CausalForest(10, random_state=0).fit(X, arms, y, comm=SELF)
    with pytest.raises(ValueError, match="binary or scalar continuous treatment"):
        multi.predict_local_linear(X[:5], X, arms, y, comm=SELF)
    vec = np.random.default_rng(1).normal(size=(len(y), 2))
    two = CausalForest(10, random_state=0).fit(X, vec, y, comm=SELF)
    with pytest.raises(ValueError, match="binary or scalar continuous treatment"):
        two.tune_local_linear(X, vec, y, comm=SELF)


@pytest.mark.mpi
def test_same_results_for_any_rank_count(comm, monkeypatch):
    """Lambda choice (regression and causal) and causal corrections: -np K equals one process (the
    distributed out-of-bag pass in rounds of 97 rows, which cut across the ranks' blocks)."""
    X, t, y = _causal_design(12, n=480, p=3)
    Xq = np.random.default_rng(13).normal(size=(40, 3))
    sl, ql = slice(*block_range(480, comm.size, comm.rank)), slice(*block_range(40, comm.size, comm.rank))
    kw = dict(n_estimators=30, max_bins=32, random_state=3)

    rf = RegressionForest(**kw).fit(X[sl], y[sl], comm=comm)
    rf_ref = RegressionForest(**kw).fit(X, y, comm=SELF)
    ref = rf_ref.tune_local_linear(X, y, comm=SELF)
    monkeypatch.setattr(local_linear_estimators, "OOB_QUERY_ROWS", 97)
    path = rf.tune_local_linear(X[sl], y[sl], comm=comm)
    assert path.ll_lambda == ref.ll_lambda and path.n_rows == ref.n_rows
    np.testing.assert_allclose(path.errors, ref.errors, rtol=1e-10)
    np.testing.assert_allclose(path.oob_predictions, ref.oob_predictions[sl], rtol=1e-9, atol=1e-12)

    cf = CausalForest(**kw).fit(X[sl], t[sl], y[sl], comm=comm)
    cf_ref = CausalForest(**kw).fit(X, t, y, comm=SELF)
    got = cf.predict_local_linear(Xq[ql], X[sl], t[sl], y[sl], linear_correction_variables=[0, 1], comm=comm)
    want = cf_ref.predict_local_linear(Xq, X, t, y, linear_correction_variables=[0, 1], comm=SELF)[ql]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    cpath = cf.tune_local_linear(X[sl], t[sl], y[sl], linear_correction_variables=[0], comm=comm)
    monkeypatch.undo()
    cref = cf_ref.tune_local_linear(X, t, y, linear_correction_variables=[0], comm=SELF)
    assert cpath.ll_lambda == cref.ll_lambda
    np.testing.assert_allclose(cpath.errors, cref.errors, rtol=1e-10)

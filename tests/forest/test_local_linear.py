"""Local linear correction (grf's ``local.linear`` prediction; issue 38)."""
import numpy as np
import pytest
from scipy import sparse

from forest import ProbabilityForest, RegressionForest
from forest.analysis.local_linear import (local_linear_reference, local_linear_solve, local_linear_sums,
                                          local_linear_sums_reference)
from native.comm import SelfCommunicator
from tests.conftest import block_slice

SELF = SelfCommunicator()


def _poly(X):
    return X[:, 0] + 2 * X[:, 1] + 2 * X[:, 2] ** 2


def test_sums_kernel_equals_reference():
    rng = np.random.default_rng(0)
    n_q, n_t, p, k = 30, 200, 4, 2
    dense = np.where(rng.random((n_q, n_t)) < 0.1, rng.random((n_q, n_t)), 0.0)
    dense[3] = 0.0                                            # a query without weights
    W = sparse.csr_matrix(dense)
    X_train, y = rng.normal(size=(n_t, p)), rng.normal(size=(n_t, k))
    queries = rng.normal(size=(n_q, p))
    M, b = local_linear_sums(W, X_train, y, queries)
    Mr, br = local_linear_sums_reference(W, X_train, y, queries)
    np.testing.assert_allclose(M, Mr, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(b, br, rtol=1e-12, atol=1e-12)
    assert np.all(M[3] == 0)


@pytest.mark.parametrize("weight_penalty", [False, True])
@pytest.mark.parametrize("ll_lambda", [0.0, 0.1, 2.0])
def test_solve_equals_grf_formula(weight_penalty, ll_lambda):
    rng = np.random.default_rng(1)
    n_t, p = 80, 3
    X_train, y = rng.normal(size=(n_t, p)), rng.normal(size=(n_t, 1))
    alpha = rng.random(n_t)
    alpha /= alpha.sum()
    x = rng.normal(size=(1, p))
    M, b = local_linear_sums_reference(alpha[None, :], X_train, y, x)
    got = local_linear_solve(M, b, ll_lambda, weight_penalty)[0]
    ref = local_linear_reference(alpha, X_train, y, x[0], ll_lambda, weight_penalty)
    np.testing.assert_allclose(got, ref, rtol=1e-10)


def test_linear_truth_is_reproduced_exactly_without_penalty():
    """A weighted least-squares fit reproduces a linear function exactly wherever its weights span the
    features: without penalty and noise the corrected prediction is the truth, while the forest's
    piecewise-constant mean is biased at the edges."""
    rng = np.random.default_rng(2)
    X = rng.uniform(-1, 1, size=(1500, 3))
    beta = np.array([1.5, -2.0, 0.5])
    y = 3.0 + X @ beta
    rf = RegressionForest(100, random_state=0).fit(X, y, comm=SELF)
    Xq = rng.uniform(-1, 1, size=(200, 3))
    truth = 3.0 + Xq @ beta
    ll = rf.predict_local_linear(Xq, X, y, ll_lambda=0.0, comm=SELF)
    np.testing.assert_allclose(ll, truth, rtol=0, atol=1e-8)
    assert np.mean((rf.predict(Xq) - truth) ** 2) > 1e-3
    # two outputs at once: each as alone
    two = rf_two = RegressionForest(100, random_state=0).fit(X, np.column_stack([y, -y]), comm=SELF)
    out = rf_two.predict_local_linear(Xq, X, np.column_stack([y, -y]), ll_lambda=0.0, comm=SELF)
    assert two.n_outputs_ == 2
    np.testing.assert_allclose(out, np.column_stack([truth, -truth]), rtol=0, atol=1e-8)


def test_grf_local_linear_claims():
    """grf's "local linear prediction gives reasonable estimates": on x1 + 2 x2 + 2 x3^2 with unit noise,
    the corrected held-out MSE is below 1.5 and below the forest's own."""
    rng = np.random.default_rng(3)
    n, p = 1000, 5
    X = rng.normal(size=(n, p))
    y = _poly(X) + rng.normal(size=n)
    rf = RegressionForest(random_state=0).fit(X, y, comm=SELF)
    Xq = rng.normal(size=(1000, p))
    mse_ll = np.mean((rf.predict_local_linear(Xq, X, y, comm=SELF) - _poly(Xq)) ** 2)
    mse_rf = np.mean((rf.predict(Xq) - _poly(Xq)) ** 2)
    assert mse_ll < 1.5 and mse_ll < mse_rf, (mse_ll, mse_rf)
    # the weight penalty and other variables run too, and a huge penalty gives back the forest
    assert np.isfinite(rf.predict_local_linear(Xq[:20], X, y, weight_penalty=True, variables=[0, 2],
                                               comm=SELF)).all()
    flat = rf.predict_local_linear(Xq[:50], X, y, ll_lambda=1e12, comm=SELF)
    np.testing.assert_allclose(flat, rf.predict(Xq[:50]), rtol=0, atol=1e-6)


def test_refusals():
    rng = np.random.default_rng(4)
    X = rng.normal(size=(300, 3))
    y = X[:, 0] + rng.normal(size=300)
    rf = RegressionForest(20, random_state=0).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="X_train is not this model's training data"):
        rf.predict_local_linear(X[:5], X[::-1], y, comm=SELF)
    with pytest.raises(ValueError, match="ll_lambda must be"):
        rf.predict_local_linear(X[:5], X, y, ll_lambda=-1, comm=SELF)
    with pytest.raises(ValueError, match="variables index 7 is out of range for 3 features"):
        rf.predict_local_linear(X[:5], X, y, variables=[7], comm=SELF)
    Xn = X[:5].copy()
    Xn[0, 1] = np.nan
    with pytest.raises(ValueError, match="missing values in the correction variables"):
        rf.predict_local_linear(Xn, X, y, comm=SELF)
    assert np.isfinite(rf.predict_local_linear(Xn, X, y, variables=[0, 2], comm=SELF)).all()
    pf = ProbabilityForest(20, random_state=0).fit(X, (y > 0).astype(int), comm=SELF)
    with pytest.raises(ValueError, match="for regression forests"):
        pf.predict_local_linear(X[:5], X, y, comm=SELF)


@pytest.mark.mpi
def test_same_predictions_for_any_rank_count(comm):
    rng = np.random.default_rng(5)
    n = 600
    X = rng.normal(size=(n, 3))
    y = _poly(X) + 0.5 * rng.normal(size=n)
    w = rng.uniform(0.5, 2.0, n)
    Xq = rng.normal(size=(90, 3))
    sl, ql = block_slice(n, comm.size, comm.rank), block_slice(90, comm.size, comm.rank)
    kw = dict(n_estimators=30, max_bins=32, random_state=2)
    dist = RegressionForest(**kw).fit(X[sl], y[sl], sample_weight=w[sl], comm=comm)
    ref = RegressionForest(**kw).fit(X, y, sample_weight=w, comm=SELF)
    got = dist.predict_local_linear(Xq[ql], X[sl], y[sl], sample_weight=w[sl], comm=comm)
    want = ref.predict_local_linear(Xq, X, y, sample_weight=w, comm=SELF)[ql]
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_tuning_on_the_fits_own_rows_equals_tuning_on_rows_passed_again(tmp_path):
    """tune_local_linear_on_fit_rows (no fingerprint check: the rows as the fit laid them out)
    gives tune_local_linear's path on the same rows; a loaded model has no fit rows to use."""
    from forest.io import model_io

    rng = np.random.default_rng(6)
    X = rng.normal(size=(400, 3))
    y = _poly(X) + 0.5 * rng.normal(size=400)
    w = rng.uniform(0.5, 2.0, 400)
    rf = RegressionForest(30, random_state=1).fit(X, y, sample_weight=w, comm=SELF)
    grid = (0.01, 0.1, 1.0)
    own = rf.tune_local_linear_on_fit_rows(X, y, lambdas=grid, sample_weight=w, comm=SELF)
    again = rf.tune_local_linear(X, y, lambdas=grid, sample_weight=w, comm=SELF)
    np.testing.assert_array_equal(own.oob_predictions, again.oob_predictions)
    assert own.oob_predictions.shape == (400, 3)
    model_io.save(rf, tmp_path / "rf.model")
    with pytest.raises(ValueError, match="keeps no rows of its fit"):
        model_io.load(tmp_path / "rf.model").tune_local_linear_on_fit_rows(X, y, lambdas=grid, comm=SELF)

"""CausalSurvivalForest's out-of-bag choice of the local linear penalty (``ll_lambda=None``, issue 33):
the out-of-bag path against dense out-of-bag forest weights, the R-loss, a known answer (an effect
linear in x0), model files, binned fits with ``correction_values``, bad input, and the same
choice at any rank count."""
import functools
import warnings

import numpy as np
import pytest

from forest import CausalSurvivalForest, model_io
from forest.analysis.local_linear import LAMBDA_PATH
from forest.analysis.local_linear_leaves import local_linear_reference
from forest.engine.oob_forest_weights import oob_forest_weights_reference, oob_query_leaves
from forest.engine.predictor import predict_leaves_binned
from forest.engine.subsample import forest_row_codes
from native.comm import SelfCommunicator

from survival_helpers import simple1, fit_causal_survival  # (conftest path)

SELF = SelfCommunicator()
KW = dict(horizon=1.0, n_estimators=20, nuisance_estimators=10, survival_estimators=10, random_state=1,
          max_grid_times=24, min_samples_leaf=2, local_linear=True, linear_correction_variables=[0, 2],
          ll_lambda=None)


_design = functools.partial(simple1, p=4, with_effect=False)   # grf's "simple1", no effect
_fit = functools.partial(fit_causal_survival, KW)


@pytest.fixture(scope="module")
def weighted():
    X, W, time, event = _design(300, 13)
    g = np.random.default_rng(3).uniform(0.5, 2.0, len(X))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = CausalSurvivalForest(**KW).fit(X, W, time, event, sample_weight=g, comm=SELF)
    return f, X, g


def test_oob_path_is_the_local_linear_regression_on_out_of_bag_weights(weighted):
    f, X, g = weighted
    path = f.local_linear_tuning_
    assert path.criterion == "R-loss" and path.n_rows == len(X)
    np.testing.assert_array_equal(path.lambdas, LAMBDA_PATH)
    # dense out-of-bag forest weights (the trees that left the row out), then grf's regression per row
    packed = f.estimators_
    roles = forest_row_codes(f.sampling_, len(packed["tree_offsets"]) - 1, np.arange(len(X), dtype=np.int64))
    leaves = predict_leaves_binned(packed, f.bin_mapper_.transform(X), f.bin_mapper_.missing_bin_)
    q = np.arange(15)
    alpha = oob_forest_weights_reference(packed, oob_query_leaves(leaves, roles)[q], leaves, roles, np.ones(len(X)),
                                         f._layout().n_moments)
    assert np.all(alpha[q, q] == 0)                            # a row never weighs in its own estimate
    rows = f._oob_rows_
    Z = X[:, [0, 2]] - f.ll_center_
    wc, yc = (rows.W - rows.t_hat)[:, 0], (rows.Y - rows.y_hat)[:, 0]
    for j, lam in enumerate(path.lambdas):
        want = [local_linear_reference(alpha[i], Z, wc, yc, g, Z[i], lam) for i in q]
        np.testing.assert_allclose(path.oob_predictions[q, j], want, rtol=1e-9, atol=1e-9)
    # the criterion: the weighted R-loss of the out-of-bag scores, the first lambda of least loss chosen
    loss = (g[:, None] * (yc[:, None] - wc[:, None] * path.oob_predictions) ** 2).sum(axis=0) / g.sum()
    np.testing.assert_allclose(path.errors, loss, rtol=1e-12)
    assert f.ll_lambda_ == path.ll_lambda == LAMBDA_PATH[int(np.argmin(loss))]


def test_predictions_take_the_chosen_lambda_and_a_given_one_overrides_it(weighted):
    f, X, _ = weighted
    Xq = np.random.default_rng(4).uniform(size=(30, 4))
    tau, var = f.predict(Xq), f.predict_var(Xq)
    other = 10.0 if f.ll_lambda_ != 10.0 else 0.0
    try:
        f.set_params(ll_lambda=f.ll_lambda_)
        np.testing.assert_array_equal(f.predict(Xq), tau)
        np.testing.assert_array_equal(f.predict_var(Xq), var)
        f.set_params(ll_lambda=other)
        assert np.abs(f.predict(Xq) - tau).max() > 1e-6
    finally:
        f.set_params(ll_lambda=None)
    # a fixed ll_lambda at fit is the fit's penalty, and no path is chosen
    X2, W, time, event = _design(300, 13)
    fixed = _fit(X2, W, time, event, ll_lambda=0.3)
    assert fixed.ll_lambda_ == 0.3 and not hasattr(fixed, "local_linear_tuning_")
    assert _fit(X2, W, time, event, local_linear=False).ll_lambda_ is None


def _truth_linear(x0, horizon):
    """RMST effect of the linear design: E[min(U + d, h)] - E[min(U, h)], U ~ U(0, 1), d = 0.5 x0, h >= 1."""
    d = 0.5 * x0
    a = np.minimum(horizon - d, 1.0)
    return a ** 2 / 2 + d * a + horizon * (1 - a) - 0.5


def test_an_effect_linear_in_x0_chooses_a_small_lambda_and_the_correction_lowers_the_rmse():
    horizon = 1.4
    Xq = np.random.default_rng(5).uniform(size=(200, 3))
    truth = _truth_linear(Xq[:, 0], horizon)
    ratios = []
    for seed in (0, 3):
        rng = np.random.default_rng(seed)
        X = rng.uniform(size=(1500, 3))
        W = rng.binomial(1, 0.5, len(X)).astype(float)
        failure = rng.uniform(size=len(X)) + 0.5 * X[:, 0] * W
        censor = 3 * rng.uniform(size=len(X))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f = CausalSurvivalForest(horizon=horizon, n_estimators=400, local_linear=True, ll_lambda=None,
                                     linear_correction_variables=[0], random_state=seed).fit(
                X, W, np.minimum(failure, censor), (failure <= censor).astype(int), comm=SELF)
        assert f.ll_lambda_ <= 0.05, (seed, f.local_linear_tuning_.errors)
        corrected = np.sqrt(np.mean((f.predict(Xq) - truth) ** 2))
        f.set_params(local_linear=False)
        plain = np.sqrt(np.mean((f.predict(Xq) - truth) ** 2))
        ratios.append(corrected / plain)
    # measured 0.90 and 0.86: the forest's flattened slope near x0 = 0 and 1 is what the correction removes
    assert max(ratios) < 0.95, ratios


def test_model_file_keeps_the_chosen_lambda_not_the_path(weighted):
    f, X, _ = weighted
    Xq = np.random.default_rng(6).uniform(size=(20, 4))
    g = model_io.loads(model_io.dumps(f))
    assert g.ll_lambda_ == f.ll_lambda_ and g.ll_lambda is None and not hasattr(g, "local_linear_tuning_")
    np.testing.assert_array_equal(g.predict(Xq), f.predict(Xq))
    for value in (-1.0, np.nan, "0.1"):
        bad = model_io.loads(model_io.dumps(f))
        bad.ll_lambda_ = value
        with pytest.raises(model_io.ModelFormatError):
            model_io.loads(model_io.dumps(bad))
    # a model without the fit's penalty (written before ll_lambda_ existed) and ll_lambda=None: one clear line
    old = model_io.loads(model_io.dumps(f))
    del old.ll_lambda_
    with pytest.raises(ValueError, match="ll_lambda=None takes the fit's penalty") as info:
        old.predict(Xq)
    assert "\n" not in str(info.value)


def test_binned_codes_with_correction_values_fit_the_same_forest():
    X, W, time, event = _design(300, 17)
    ref = _fit(X, W, time, event)
    mapper = ref.bin_mapper_
    codes = np.ascontiguousarray(mapper.transform(X))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        binned = CausalSurvivalForest(**KW).fit(None, W, time, event, binned=(mapper, codes), comm=SELF,
                                                correction_values=X[:, [0, 2]])
    assert binned.ll_lambda_ == ref.ll_lambda_
    np.testing.assert_array_equal(binned.ll_tables_, ref.ll_tables_)
    np.testing.assert_array_equal(binned.local_linear_tuning_.errors, ref.local_linear_tuning_.errors)
    np.testing.assert_array_equal(binned.predict(X), ref.predict(X))
    holed = X[:, [0, 2]].copy()
    holed[5, 1] = np.nan
    cases = [(dict(binned=(mapper, codes)), None, "needs correction_values"),
             (dict(binned=(mapper, codes)), X[:, :3], r"must have shape \(300, 2\)"),
             (dict(binned=(mapper, codes)), holed, "correction_values has missing values"),
             (dict(binned=(mapper, codes)), np.where(np.isnan(holed), np.inf, holed), "infinite"),
             (dict(), X[:, [0, 2]], "go with binned codes and X=None")]
    for extra, values, message in cases:
        data = None if "binned" in extra else X
        with pytest.raises(ValueError, match=message) as info:
            CausalSurvivalForest(**dict(KW, n_estimators=4)).fit(data, W, time, event, comm=SELF,
                                                                correction_values=values, **extra)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="give them with local_linear=True"):
        CausalSurvivalForest(**dict(KW, n_estimators=4, local_linear=False)).fit(
            None, W, time, event, binned=(mapper, codes), comm=SELF, correction_values=X[:, [0, 2]])


@pytest.mark.mpi
def test_the_chosen_lambda_is_the_same_at_any_rank_count(comm):
    X, W, time, event = _design(500, 15)
    Xq = np.random.default_rng(16).uniform(size=(30, 4))
    lo, hi = len(W) * comm.rank // comm.size, len(W) * (comm.rank + 1) // comm.size
    dist = _fit(X[lo:hi], W[lo:hi], time[lo:hi], event[lo:hi], comm=comm)
    ref = _fit(X, W, time, event)
    a, b = dist.local_linear_tuning_, ref.local_linear_tuning_
    assert dist.ll_lambda_ == ref.ll_lambda_ and a.n_rows == b.n_rows >= 490
    np.testing.assert_allclose(a.errors, b.errors, rtol=1e-10, atol=0)
    np.testing.assert_allclose(a.oob_predictions, b.oob_predictions[lo:hi], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(dist.predict(Xq), ref.predict(Xq), rtol=0, atol=1e-9)


def test_the_causal_forests_local_linear_methods_are_refused_with_a_pointer(weighted):
    """Inherited from CausalForest, they would regress a ``y_train`` the censored data do not have."""
    f, X, _ = weighted
    with pytest.raises(TypeError, match="predict\\(X\\)"):
        f.predict_local_linear(X[:5], X, np.zeros(len(X)), np.zeros(len(X)))
    with pytest.raises(TypeError, match="ll_lambda=None"):
        f.tune_local_linear(X, np.zeros(len(X)), np.zeros(len(X)))

"""Local linear splits (grf's ``ll_regression_forest(enable.ll.split = TRUE)``; issue 38)."""
import numpy as np
import pytest

from forest import RegressionForest, model_io
from forest.criteria.local_linear_split import (LocalLinearSplitCriterion, node_penalty, overall_beta,
                                                ridge_system, solve_dropping)
from forest.engine.local_growth import grow_subtrees, grow_subtrees_reference
from forest.engine.splitting import find_best_splits, find_best_splits_reference
from forest.estimators.ll_split import ll_split_channels
from native.blocks import block_range
from native.comm import SelfCommunicator

from criterion_checks import random_cuts
from subtree_tasks import random_tasks

SELF = SelfCommunicator()

#: (n_vars, lambda, weight_penalty, cutoff, min_samples_leaf, alpha, imbalance_penalty)
CASES = [(1, 0.1, False, 0, 3, 0.0, 0.0), (3, 0.0, False, 0, 5, 0.05, 0.0), (2, 0.5, True, 0, 4, 0.1, 0.3),
         (3, 0.1, False, 10 ** 6, 3, 0.0, 0.0), (4, 0.1, True, 45, 2, 0.05, 0.0)]


def _crit(case):
    p, lam, wp, cut, leaf, alpha, pen = case
    return LocalLinearSplitCriterion(p, lam, wp, cut, min_samples_leaf=leaf, alpha=alpha, imbalance_penalty=pen)


def _rows(rng, crit, n):
    Z = rng.normal(1.0, 2.0, size=(n, crit.n_vars))
    y = Z @ rng.normal(size=crit.n_vars) + np.sin(3 * Z[:, 0]) + rng.normal(size=n)
    return crit.make_channels(y, Z, rng.uniform(0.5, 2.0, n), rng.normal(size=n))


@pytest.mark.parametrize("case", CASES)
def test_compiled_gains_and_keys_equal_vectorised(case):
    rng = np.random.default_rng(sum(map(hash, map(str, case))) % 2 ** 32)
    crit = _crit(case)
    comp = crit.compiled()
    n_inf = n_fin = 0
    for _ in range(30):
        n = int(rng.integers(6, 90))
        ch = _rows(rng, crit, n)
        parent = ch.sum(axis=0)
        cuts, lefts = random_cuts(rng, ch, 25, 0.02, 0.98)
        rights = parent - lefts
        ref = crit.gain(lefts, rights, parent)
        got = comp.gains_of(lefts, rights, parent)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-9, atol=1e-12)
        n_inf += (~fin).sum()
        n_fin += fin.sum()
        # category keys: the mean residual of each group under the node's fit
        groups = np.stack([ch[rng.random(n) < 0.3].sum(axis=0) for _ in range(6)])
        beta, node = crit.node_fit(parent)
        want = crit.residual_sums(groups, beta, node) / np.where(groups[:, 0] > 0, groups[:, 0], 1.0)
        keys = comp.keys_of(groups[None], parent[None])[0]
        np.testing.assert_allclose(keys, np.where(groups[:, 0] > 0, want, 0.0), rtol=1e-9, atol=1e-12)
    assert n_inf > 20 and n_fin > 100


@pytest.mark.parametrize("weight_penalty", [False, True])
@pytest.mark.parametrize("ll_lambda", [0.0, 0.1, 3.0])
def test_node_fit_is_grf_ridge(ll_lambda, weight_penalty):
    """grf's node ridge (LLRegressionRelabelingStrategy): M = Z^T W Z plus lambda * trace(M) / (p + 1) (or
    lambda * M_jj) on every diagonal entry but the intercept's; the residuals are y - Z beta."""
    rng = np.random.default_rng(3)
    n, p = 70, 3
    crit = LocalLinearSplitCriterion(p, ll_lambda, weight_penalty)
    Z = rng.normal(2.0, 1.5, size=(n, p))
    y = rng.normal(size=n) + Z[:, 1]
    w = rng.uniform(0.5, 2.0, n)
    ch = crit.make_channels(y, Z, w)
    D = np.column_stack([np.ones(n), Z])
    M = D.T @ (w[:, None] * D)
    pen = ll_lambda * (np.diag(M) if weight_penalty else np.full(p + 1, np.trace(M) / (p + 1)))
    pen[0] = 0.0
    want = np.linalg.solve(M + np.diag(pen), D.T @ (w * y))
    beta, node = crit.node_fit(ch.sum(axis=0))
    np.testing.assert_allclose(beta, want, rtol=1e-9)
    assert node
    sub = rng.random(n) < 0.4
    np.testing.assert_allclose(crit.residual_sums(ch[sub].sum(axis=0), beta, node),
                               (w * (y - D @ want))[sub].sum(), rtol=1e-8, atol=1e-10)


def test_singular_node_drops_the_variable():
    """A split variable constant in a node (lambda 0): the fitted values, hence the residuals, are those of
    least squares without it (grf's LDLT solve gives the same fitted values)."""
    rng = np.random.default_rng(4)
    n = 40
    Z = np.column_stack([rng.normal(size=n), np.full(n, 3.0), rng.normal(size=n)])
    y = 2 * Z[:, 0] + rng.normal(size=n)
    crit = LocalLinearSplitCriterion(3, 0.0)
    ch = crit.make_channels(y, Z)
    beta, node = crit.node_fit(ch.sum(axis=0))
    D = np.column_stack([np.ones(n), Z])
    fitted = D @ np.linalg.lstsq(D, y, rcond=None)[0]
    np.testing.assert_allclose(D @ beta, fitted, rtol=1e-9, atol=1e-9)
    assert beta[2] == 0.0
    left, right = ch[:15].sum(axis=0), ch[15:].sum(axis=0)
    got = crit.compiled().gains_of(left[None], right[None], ch.sum(axis=0))
    np.testing.assert_allclose(got, crit.gain(left, right, ch.sum(axis=0)), rtol=1e-9)
    assert np.isfinite(got[0])


def _binned(rng, n_rows, n_features, n_values, missing_bin, p_missing):
    codes = rng.integers(0, n_values, size=(n_features, n_rows))
    codes[rng.random((n_features, n_rows)) < p_missing] = missing_bin
    return codes.astype(np.uint8)


@pytest.mark.parametrize("hist_rows", [None, 0, 20])
@pytest.mark.parametrize("case,categorical", [(CASES[0], False), (CASES[2], False), (CASES[4], True)])
def test_grow_subtrees_matches_reference(case, categorical, hist_rows):
    rng = np.random.default_rng(7)
    n_rows, n_features, missing_bin = 300, 4, 16
    binned = _binned(rng, n_rows, n_features, 12, missing_bin, 0.1)
    crit = _crit(case)
    p = crit.n_vars
    # the split variables follow the codes of the first features (plus noise), the outcome bends
    Z = binned[:p].T.astype(float) * 0.3 + rng.normal(size=(n_rows, p))
    y = Z @ rng.normal(size=p) + np.abs(binned[-1] - 6.0) * 0.4 + rng.normal(size=n_rows)
    ch = crit.make_channels(y, Z, rng.uniform(0.5, 2.0, n_rows), rng.normal(size=n_rows))
    rows, starts, tree, node, depth, nxt = random_tasks(rng, 2, n_rows, [90, 30, 9])
    nb = np.full(n_features, 12)
    cat = np.array([False, False, True, False]) if categorical else None
    kw = dict(min_samples_split=6.0, max_depth=None, seed=3)
    got = grow_subtrees(binned, ch, rows, starts, tree, node, depth, nxt, np.array([0, 4]), crit.compiled(),
                        missing_bin, hist_rows=hist_rows, categorical=cat, **kw)
    ref = grow_subtrees_reference(binned, ch, rows, starts, tree, node, depth, nxt, np.array([0, 4]), crit, nb,
                                  missing_bin, categorical=cat, **kw)
    assert len(got.ints) > 12
    np.testing.assert_array_equal(got.tree_starts, ref.tree_starts)
    np.testing.assert_array_equal(got.ints, ref.ints)
    np.testing.assert_allclose(got.floats, ref.floats, rtol=1e-9, atol=1e-9)


def test_histogram_search_matches_reference():
    rng = np.random.default_rng(8)
    crit = _crit(CASES[4])
    n_nodes, n_features, missing_bin = 5, 3, 10
    hist = np.zeros((n_nodes, n_features, missing_bin + 1, crit.n_channels))
    for n in range(n_nodes):
        ch = _rows(rng, crit, int(rng.integers(30, 120)))
        for f in range(n_features):
            codes = rng.integers(0, missing_bin + 1, size=len(ch))
            np.add.at(hist[n, f], codes, ch)
    parent = hist[:, 0].sum(axis=1)
    nb = np.full(n_features, missing_bin)
    got = find_best_splits(hist, parent, crit, nb, missing_bin)
    ref = find_best_splits_reference(hist, parent, crit, nb, missing_bin)
    np.testing.assert_array_equal(got.feature, ref.feature)
    np.testing.assert_array_equal(got.bin, ref.bin)
    np.testing.assert_array_equal(got.missing_left, ref.missing_left)
    np.testing.assert_allclose(got.gain, ref.gain, rtol=1e-9)
    assert (got.feature >= 0).all()


def test_whole_data_ridge_is_grf_overall_beta():
    """grf's overall.beta: solve(D^T D + lambda J) D^T Y on the whole data, raw lambda; the residual channel
    holds w (y - D beta) (here on the standardised outcome the trees grow on)."""
    rng = np.random.default_rng(9)
    n, p = 300, 3
    X = rng.normal(size=(n, p)) * [1.0, 10.0, 0.1] + 5.0
    y = (X @ [1.0, -0.2, 3.0] + rng.normal(size=n))[:, None]
    est = RegressionForest(enable_ll_split=True, ll_split_lambda=0.7)
    est.n_features_in_ = p
    est.is_categorical_ = np.zeros(p, bool)
    base = LocalLinearSplitCriterion(1)
    crit, ch = ll_split_channels(est, X, y, np.ones(n), n, SELF, base)
    D = np.column_stack([np.ones(n), X])
    J = np.eye(p + 1)
    J[0, 0] = 0.0
    beta = np.linalg.solve(D.T @ D + 0.7 * J, D.T @ y[:, 0])
    np.testing.assert_allclose(ch[:, crit.layout["r"]], y[:, 0] - D @ beta, rtol=1e-7, atol=1e-9)
    assert crit.cutoff == int(np.sqrt(n))
    np.testing.assert_allclose(overall_beta(ch.sum(axis=0), p, 0.7), beta, rtol=1e-7)
    # the pieces behind it
    M, b = ridge_system(ch.sum(axis=0), p)
    np.testing.assert_allclose(M, D.T @ D, rtol=1e-12)
    np.testing.assert_allclose(solve_dropping(node_penalty(M, 0.0, False), b),
                               np.linalg.lstsq(D, y[:, 0], rcond=None)[0], rtol=1e-7)


def _simple_case(n, seed):
    """grf's "local linear splits improve predictions in a simple case": X ~ N(0, 1)^5, mu = x1 + x2 + x3 x4."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    mu = X[:, 0] + X[:, 1] + X[:, 2] * X[:, 3]
    return X, mu, mu + rng.normal(size=n)


def test_grf_claim_ll_splits_improve_local_linear_predictions():
    """grf: out-of-bag local linear predictions (ll.lambda 0.1, every variable) of an ll-split forest have at
    most 0.9 times the MSE of a regression forest's, n = 600, 500 trees (grf's regression_forest sizes)."""
    X, mu, y = _simple_case(600, 38)
    mse = {}
    for ll in (False, True):
        f = RegressionForest(500, min_node_size=5, enable_ll_split=ll, random_state=1).fit(X, y, comm=SELF)
        pred = f.tune_local_linear(X, y, lambdas=[0.1], comm=SELF).oob_predictions[:, 0]
        mse[ll] = np.mean((pred - mu) ** 2)
    assert mse[True] / mse[False] < 0.9, mse


def test_grf_claim_ll_splits_leave_linear_trends_to_the_ridge():
    """grf's "local linear splits reduce early splits on linear trends": mu = 0.9 exp(x1) + 2 x6 on U(-1, 1)^6,
    n = 200; a regression forest's first split is on x6 more than 3 times as often, and on x1 less than a
    third as often, as an ll-split forest's.

    grf's R wrapper hands ll.split.variables to its C++ core 1-based, and the core reads them 0-based, so its
    default ridge is on x2..x6 and the outcome column, never on x1 (forest/criteria/local_linear_split.py).
    Its claim holds here for that ridge without the outcome (split variables x2..x6); with every variable in
    the ridge, as grf documents, x1's linear part is fitted too and the shift is smaller: x6 at least halves,
    x1 gains."""
    rng = np.random.default_rng(6)
    X = rng.uniform(-1, 1, size=(200, 6))
    y = 0.9 * np.exp(X[:, 0]) + 2 * X[:, 5] + rng.normal(size=200)
    freq = {}
    for key, ll, variables in (("rf", False, None), ("grf", True, [1, 2, 3, 4, 5]), ("all", True, None)):
        f = RegressionForest(300, min_node_size=5, enable_ll_split=ll, ll_split_variables=variables,
                             random_state=2).fit(X, y, comm=SELF)
        roots = f.estimators_["feature"][f.estimators_["tree_offsets"][:-1]]
        freq[key] = np.bincount(roots[roots >= 0], minlength=6) / len(roots)
    assert freq["rf"][0] < freq["grf"][0] / 3 and freq["rf"][5] > freq["grf"][5] * 3, freq
    assert freq["rf"][5] > freq["all"][5] * 2 and freq["all"][0] > freq["rf"][0] * 3 + 0.05, freq


def test_grf_claim_linear_truth_without_noise():
    """grf: an ll-split forest's local linear predictions (lambda 0) of a noiseless linear truth are exact."""
    rng = np.random.default_rng(5)
    X = rng.uniform(-1, 1, size=(80, 2))
    y = X.sum(axis=1)
    f = RegressionForest(80, min_node_size=5, enable_ll_split=True, random_state=0).fit(X, y, comm=SELF)
    pred = f.predict_local_linear(X, X, y, ll_lambda=0.0, comm=SELF)
    assert np.mean((pred - y) ** 2) < 1e-10


def test_split_variables_cutoff_and_model_file():
    X, mu, y = _simple_case(400, 2)
    kw = dict(n_estimators=20, random_state=3, enable_ll_split=True)
    a = RegressionForest(ll_split_variables=[0, 1], ll_split_cutoff=0, **kw).fit(X, y, comm=SELF)
    b = RegressionForest(ll_split_variables=[0, 1, 2, 3, 4], ll_split_cutoff=0, **kw).fit(X, y, comm=SELF)
    c = RegressionForest(**kw).fit(X, y, comm=SELF)
    plain = RegressionForest(n_estimators=20, random_state=3).fit(X, y, comm=SELF)
    assert not np.array_equal(a.predict(X), b.predict(X))
    assert not np.array_equal(c.predict(X), b.predict(X))
    assert not np.array_equal(plain.predict(X), c.predict(X))
    # a cutoff above every node: the whole-data residuals everywhere, a fixed relabelling of y
    d = RegressionForest(ll_split_cutoff=400, **kw).fit(X, y, comm=SELF)
    assert np.isfinite(d.predict(X)).all()
    restored = model_io.loads(model_io.dumps(a))
    assert restored.get_params()["ll_split_variables"] == [0, 1] and restored.enable_ll_split
    np.testing.assert_array_equal(restored.predict(X[:50]), a.predict(X[:50]))


def test_ll_split_refusals():
    X, mu, y = _simple_case(100, 3)
    with pytest.raises(TypeError, match="enable_ll_split must be true or false"):
        RegressionForest(enable_ll_split=1).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="ll_split_lambda must be a finite number >= 0"):
        RegressionForest(enable_ll_split=True, ll_split_lambda=-1.0).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="ll_split_cutoff must be an int >= 0"):
        RegressionForest(enable_ll_split=True, ll_split_cutoff=-2).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match=r"ll_split_cutoff \(101\) must be at most the number of rows \(100\)"):
        RegressionForest(4, enable_ll_split=True, ll_split_cutoff=101).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="ll_split_variables must be None or a non-empty sequence"):
        RegressionForest(enable_ll_split=True, ll_split_variables=[]).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="tune_parameters is not supported with enable_ll_split"):
        RegressionForest(enable_ll_split=True, tune_parameters="all").fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="supports one outcome"):
        RegressionForest(4, enable_ll_split=True).fit(X, np.column_stack([y, y]), comm=SELF)
    Xn = X.copy()
    Xn[7, 2] = np.nan
    with pytest.raises(ValueError, match=r"missing value in split variable 2 \(row 7\)"):
        RegressionForest(4, enable_ll_split=True).fit(Xn, y, comm=SELF)
    RegressionForest(4, enable_ll_split=True, ll_split_variables=[0, 1]).fit(Xn, y, comm=SELF)  # not a split variable
    f = RegressionForest(4).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="enable_ll_split needs X"):
        RegressionForest(4, enable_ll_split=True).fit(None, y, binned=(f.bin_mapper_, f.bin_mapper_.transform(X)),
                                                      comm=SELF)


@pytest.mark.mpi
def test_ll_split_identical_at_any_rank_count(comm):
    X, mu, y = _simple_case(700, 11)
    w = np.random.default_rng(12).uniform(0.5, 2.0, len(y))
    sl = slice(*block_range(len(y), comm.size, comm.rank))
    kw = dict(n_estimators=16, random_state=5, enable_ll_split=True, ll_split_cutoff=40, max_bins=64)
    dist = RegressionForest(**kw).fit(X[sl], y[sl], sample_weight=w[sl], comm=comm)
    ref = RegressionForest(**kw).fit(X, y, sample_weight=w, comm=SELF)
    Xq = np.random.default_rng(13).normal(size=(200, 5))
    # the whole-data ridge: every row's residual channel the same bits at any rank count
    y2 = y[:, None] / 4.0
    _, ch_dist = ll_split_channels(dist, X[sl], y2[sl], w[sl], len(y), comm, LocalLinearSplitCriterion(1))
    _, ch_ref = ll_split_channels(ref, X, y2, w, len(y), SELF, LocalLinearSplitCriterion(1))
    same_channels = np.array_equal(ch_dist, ch_ref[sl])
    same = {key: np.array_equal(dist.estimators_[key], ref.estimators_[key])
            for key in ("feature", "bin_threshold", "left", "right")}
    assert same_channels
    assert all(same.values()), same         # the trees: identical (the ridge sums are exact)
    # leaf values: the estimation rows' weighted sums, added in rank order (as a plain regression forest's)
    np.testing.assert_allclose(dist.predict(Xq), ref.predict(Xq), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dist.oob_prediction_, ref.oob_prediction_[sl], rtol=1e-12, atol=1e-12)

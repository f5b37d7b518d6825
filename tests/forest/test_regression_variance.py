"""RegressionForest variance estimates and intervals (grf's ``estimate.variance``; issue 38).

The statistic against a loop written from its definition, grf's own claims on its designs,
calibration against the sampling variance over training sets, and the same numbers at any
rank count.
"""
import math

import numpy as np
import pytest

from forest import RegressionForest, model_io
from forest.analysis.inference import ratio_blb_variance
from native.comm import SelfCommunicator
from tests.conftest import block_slice

SELF = SelfCommunicator()


def _ratio_variance_loop(tree_values, k, L, valid):
    """Point by point, output by output, as the docstring defines it (grf's regression variance)."""
    n, B, _ = tree_values.shape
    G = B // L
    mu = np.full((n, k), np.nan)
    var = np.full((n, k), np.nan)
    for i in range(n):
        groups = [q for q in range(G)
                  if all(valid[i, b] and tree_values[i, b, k + 1] > 0 for b in range(q * L, q * L + L))]
        if not groups:
            continue
        trees = [b for q in groups for b in range(q * L, q * L + L)]
        den = np.mean([tree_values[i, b, k + 1] for b in trees])
        for j in range(k):
            num = np.mean([tree_values[i, b, j] for b in trees])
            m = num / den
            mu[i, j] = m
            if len(groups) < 2:
                continue
            psi = {b: (tree_values[i, b, j] - m * tree_values[i, b, k + 1]) / den for b in trees}
            means = {q: np.mean([psi[b] for b in range(q * L, q * L + L)]) for q in groups}
            between = np.mean([means[q] ** 2 for q in groups])
            within = sum((psi[b] - means[q]) ** 2 for q in groups for b in range(q * L, q * L + L)) \
                / (len(groups) * (L - 1))
            raw = between - within / L
            s = max(between, within / L) * math.sqrt(2.0 / len(groups))
            if s > 0:
                r = raw / s
                pdf = math.exp(-0.5 * r * r) / math.sqrt(2 * math.pi)
                cdf = 0.5 * math.erfc(-r / math.sqrt(2))
                v = raw + s * pdf / cdf if cdf > 1e-300 else s / max(abs(r), 1.0)
                var[i, j] = max(v, 0.0)
            else:
                var[i, j] = max(raw, 0.0)
    return mu, var


@pytest.mark.parametrize("k,L,weighted", [(1, 2, False), (1, 4, True), (3, 3, True)])
def test_ratio_variance_equals_its_definition(k, L, weighted):
    rng = np.random.default_rng(k * 10 + L)
    n, B = 40, 7 * L + 1                           # a trailing partial group is ignored
    tv = np.empty((n, B, k + 2))
    den = rng.uniform(0.2, 3.0, (n, B)) if weighted else np.ones((n, B))
    den[2:][rng.random((n - 2, B)) < 0.03] = 0.0   # leaves without weight make their group unusable
    tv[..., :k] = rng.normal(size=(n, B, k)) * den[..., None]
    tv[..., k] = rng.integers(1, 9, (n, B))
    tv[..., k + 1] = den
    valid = rng.random((n, B)) < 0.85
    valid[0] = False                               # no usable group: NaN
    valid[1, :L] = True
    valid[1, L:] = False                           # one usable group: an estimate, no variance
    mu, var = ratio_blb_variance(tv, k, L, valid)
    ref_mu, ref_var = _ratio_variance_loop(tv, k, L, valid)
    np.testing.assert_allclose(mu, ref_mu, rtol=1e-12, atol=1e-14, equal_nan=True)
    np.testing.assert_allclose(var, ref_var, rtol=1e-9, atol=1e-15, equal_nan=True)
    assert np.isnan(var[0]).all() and np.isnan(mu[0]).all()
    assert np.isnan(var[1]).all() and np.isfinite(mu[1]).all()
    assert np.isfinite(var[2:]).mean() > 0.5


def test_grf_regression_variance_claims():
    """grf's "regression variance estimates are positive": 1000 trees in groups of 4, positive
    variances at new and out-of-bag points, MSE < 0.2, and fewer than half the out-of-bag
    errors beyond one estimated standard deviation."""
    rng = np.random.default_rng(1234)
    n, p = 1000, 6
    X = 2 * rng.uniform(size=(n, p)) - 1
    y = (X[:, 0] > 0) + 2 * rng.normal(size=n)
    X_test = np.zeros((101, p))
    X_test[:, 0] = np.linspace(-1, 1, 101)
    rf = RegressionForest(1000, ci_group_size=4, random_state=0).fit(X, y, comm=SELF)
    var, oob_var = rf.predict_var(X_test), rf.oob_predict_var()
    assert (var > 0).all() and (oob_var > 0).all()
    assert np.mean((rf.predict(X_test) - (X_test[:, 0] > 0)) ** 2) < 0.2
    err = rf.oob_predict() - (X[:, 0] > 0)
    assert np.mean(err ** 2) < 0.2
    assert np.mean(np.abs(err / np.sqrt(oob_var)) > 1) < 0.5
    np.testing.assert_array_equal(rf.oob_predict_var(X, comm=SELF), oob_var)
    lo, hi = rf.predict_interval(X_test, alpha=0.1)
    np.testing.assert_allclose((hi - lo) / 2, 1.6448536269514722 * np.sqrt(var), rtol=1e-12)
    np.testing.assert_allclose((hi + lo) / 2, rf.predict(X_test), rtol=0, atol=1e-12)
    olo, ohi = rf.oob_predict_interval()
    np.testing.assert_allclose((ohi + olo) / 2, rf.oob_predict(), rtol=0, atol=1e-12)


def test_grf_weighted_coverage_claim():
    """grf's "sample weighted regression forest gives correct coverage": inverse-probability weights
    make the out-of-bag 95% intervals cover E[Y | x, A = 1] (> 0.8) where the unweighted forest's
    do not (< 0.55), at under 0.3 times the unweighted MSE."""
    rng = np.random.default_rng(0)
    n, p, pA = 2500, 5, 0.2
    X = rng.normal(size=(n, p))
    A = rng.binomial(1, pA, n)
    gamma = A / pA + (1 - A) / (1 - pA)
    truth = 1 / (1 + np.exp(-3 * X[:, 0]))
    y = 2 * truth * A + rng.normal(size=n)
    result = {}
    for name, w in (("weighted", gamma), ("unweighted", None)):
        rf = RegressionForest(random_state=1).fit(X, y, sample_weight=w, comm=SELF)
        pred = rf.oob_predict()
        z = (pred - truth) / np.sqrt(rf.oob_predict_var())
        result[name] = (np.mean(np.abs(z) < 1.96), np.mean((pred - truth) ** 2))
    assert result["weighted"][0] > 0.8 and result["unweighted"][0] < 0.55
    assert result["weighted"][1] / result["unweighted"][1] < 0.3


def test_variance_is_calibrated_against_the_sampling_variance():
    """Over 40 training sets the estimated variance at a point is of the order of the prediction's
    variance across them (measured 1.84x: the little bags are conservative, see
    forest.analysis.inference); a variance off by a factor of L or of the tree count fails."""
    x0 = np.array([[0.3, -0.2, 0.1, 0.0]])
    preds, variances = [], []
    for rep in range(40):
        rng = np.random.default_rng(rep)
        X = rng.uniform(-1, 1, size=(800, 4))
        y = X[:, 0] + rng.normal(size=800)
        rf = RegressionForest(400, random_state=rep).fit(X, y, comm=SELF)
        preds.append(rf.predict(x0)[0])
        variances.append(rf.predict_var(x0)[0])
    ratio = np.mean(variances) / np.var(preds)
    assert 0.9 < ratio < 3.0, ratio


def test_little_bags_default_and_refusals():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(300, 3))
    y = X[:, 0] + rng.normal(size=300)
    assert RegressionForest(20, random_state=0).fit(X, y, comm=SELF).sampling_["ci_group_size"] == 2
    wide = RegressionForest(20, max_samples=0.8, random_state=0).fit(X, y, comm=SELF)
    assert wide.sampling_["ci_group_size"] == 1          # no little bags fit: no error either
    with pytest.raises(ValueError, match="ci_group_size=1; refit with ci_group_size >= 2"):
        wide.predict_var(X)
    with pytest.raises(ValueError, match="max_samples <= 0.5 when it is > 1"):
        RegressionForest(20, max_samples=0.8, ci_group_size=2).fit(X, y, comm=SELF)
    rf = RegressionForest(20, random_state=0).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="alpha must be in"):
        rf.predict_interval(X, alpha=1.5)
    back = model_io.loads(model_io.dumps(rf), expect=RegressionForest)
    np.testing.assert_array_equal(back.predict_var(X), rf.predict_var(X))
    np.testing.assert_array_equal(back.oob_predict_var(X, comm=SELF), rf.oob_predict_var())
    with pytest.raises(ValueError, match="pass the training rows"):
        back.oob_predict_var()
    two = RegressionForest(20, random_state=0).fit(X, np.column_stack([y, -2 * y]), comm=SELF)
    v2 = two.predict_var(X[:5])
    assert v2.shape == (5, 2)
    np.testing.assert_allclose(v2[:, 1], 4 * v2[:, 0], rtol=1e-9)


@pytest.mark.mpi
def test_variances_same_for_any_rank_count(comm):
    rng = np.random.default_rng(8)
    n = 700
    X = rng.normal(size=(n, 4))
    y = X[:, 0] + rng.normal(size=n)
    w = rng.uniform(0.5, 2.0, n)
    clusters = np.arange(n) // 7
    sl = block_slice(n, comm.size, comm.rank)
    kw = dict(n_estimators=40, max_bins=32, random_state=3)
    dist = RegressionForest(**kw).fit(X[sl], y[sl], sample_weight=w[sl], clusters=clusters[sl], comm=comm)
    ref = RegressionForest(**kw).fit(X, y, sample_weight=w, clusters=clusters, comm=SELF)
    np.testing.assert_allclose(dist.predict_var(X), ref.predict_var(X), rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(dist.oob_predict_var(), ref.oob_predict_var()[sl], rtol=1e-9, atol=1e-15)
    np.testing.assert_allclose(dist.oob_predict_var(X[sl], comm=comm, clusters=clusters[sl]),
                               ref.oob_predict_var()[sl], rtol=1e-9, atol=1e-15)
    for got, want in zip(dist.oob_error_estimates(y[sl]), ref.oob_error_estimates(y)):
        np.testing.assert_allclose(got, want[sl], rtol=1e-9, atol=1e-15)
    got, want = dist.test_calibration(y[sl]), ref.test_calibration(y, comm=SELF)
    np.testing.assert_allclose(got.estimate, want.estimate, rtol=1e-9)
    np.testing.assert_allclose(got.stderr, want.stderr, rtol=1e-9)


def test_tree_jackknife_error_equals_its_definition():
    from forest.analysis.inference import tree_jackknife_error

    rng = np.random.default_rng(4)
    n, B, k = 25, 12, 2
    tv = np.empty((n, B, k + 2))
    den = rng.uniform(0.3, 2.0, (n, B))
    den[rng.random((n, B)) < 0.05] = 0.0
    tv[..., :k] = rng.normal(size=(n, B, k)) * den[..., None]
    tv[..., k] = 1.0
    tv[..., k + 1] = den
    valid = rng.random((n, B)) < 0.6
    valid[0] = False
    valid[1] = False
    valid[1, 3] = True                    # one tree: no jackknife
    y = rng.normal(size=(n, k))
    debiased, excess = tree_jackknife_error(tv, k, valid, y)
    for i in range(n):
        trees = [b for b in range(B) if valid[i, b] and den[i, b] > 0]
        if len(trees) < 2:
            assert np.isnan(excess[i]).all() and np.isnan(debiased[i]).all()
            continue
        mu = tv[i, trees, :k].sum(axis=0) / den[i, trees].sum()
        dev = sum((tv[i, b, :k] / den[i, b] - mu) ** 2 for b in trees) / (len(trees) * (len(trees) - 1))
        np.testing.assert_allclose(excess[i], dev, rtol=1e-12)
        np.testing.assert_allclose(debiased[i], (mu - y[i]) ** 2 - dev, rtol=1e-12)


def test_debiased_error_estimates_the_error_of_a_larger_forest():
    """grf's debiased.error: the out-of-bag error of 20 trees, less the jackknife Monte-Carlo part,
    estimates the error of many trees (here 1000 trees' raw out-of-bag error) far better than the
    raw error of the 20 trees does."""
    rng = np.random.default_rng(0)
    n = 2000
    X = rng.normal(size=(n, 5))
    y = X[:, 0] + np.sin(2 * X[:, 1]) + rng.normal(size=n)
    small = RegressionForest(20, random_state=1).fit(X, y, comm=SELF)
    big = RegressionForest(1000, random_state=2).fit(X, y, comm=SELF)
    debiased, excess = small.oob_error_estimates(y)
    target = np.mean((big.oob_predict() - y) ** 2)
    raw = np.mean((small.oob_predict() - y) ** 2)
    ok = np.isfinite(debiased)
    assert ok.mean() > 0.99 and (excess[ok] >= 0).all()
    assert abs(np.mean(debiased[ok]) - target) < 0.35 * (raw - target), (np.mean(debiased[ok]), raw, target)
    np.testing.assert_allclose(small.oob_error_estimates(y, X, comm=SELF)[0], debiased, rtol=0, atol=0,
                               equal_nan=True)
    with pytest.raises(ValueError, match="y has"):
        small.oob_error_estimates(np.column_stack([y, y]))


def test_calibration_test_of_a_regression_forest():
    """grf's test_calibration on a regression forest: y on the mean out-of-bag prediction and its
    deviation, no intercept (coefficients exactly those of weighted least squares); about 1 and 1
    with a real signal, the differential insignificant without one."""
    rng = np.random.default_rng(6)
    n = 2000
    X = rng.normal(size=(n, 4))
    y = X[:, 0] + 0.5 * rng.normal(size=n)
    w = rng.uniform(0.5, 2.0, n)
    rf = RegressionForest(200, random_state=0).fit(X, y, sample_weight=w, comm=SELF)
    table = rf.test_calibration(y, X, sample_weight=w, comm=SELF)
    assert list(table.terms) == ["mean.forest.prediction", "differential.forest.prediction"]
    pred = rf.oob_predict()
    mean = np.average(pred, weights=w)
    design = np.column_stack([np.full(n, mean), pred - mean])
    sw = np.sqrt(w)
    coef = np.linalg.lstsq(design * sw[:, None], y * sw, rcond=None)[0]
    np.testing.assert_allclose(table.estimate, coef, rtol=1e-9)
    assert abs(table.estimate[0] - 1) < 3 * table.stderr[0] + 0.02
    assert 0.8 < table.estimate[1] < 1.4 and table.pvalue[1] < 1e-10
    # in the fitting process, without X: the fit's own (rescaled) weights give the same coefficients
    np.testing.assert_allclose(rf.test_calibration(y).estimate, table.estimate, rtol=1e-9)
    y0 = rng.normal(size=n)
    null = RegressionForest(200, random_state=0).fit(X, y0, comm=SELF)
    assert null.test_calibration(y0).pvalue[1] > 0.01
    with pytest.raises(ValueError, match="sample_weight goes with X"):
        rf.test_calibration(y, sample_weight=w)


@pytest.mark.mpi
def test_one_ranks_bad_outcomes_raise_on_every_rank(comm):
    """A wrong y on one rank is one agreed error on every rank, not a rank waiting in a collective."""
    rng = np.random.default_rng(9)
    X = rng.normal(size=(200, 3))
    y = X[:, 0] + rng.normal(size=200)
    rf = RegressionForest(10, random_state=0).fit(X, y, comm=comm)
    bad = y[:3] if comm.rank == comm.size - 1 else y
    for call in (lambda: rf.test_calibration(bad, X, comm=comm), lambda: rf.oob_error_estimates(bad, X, comm=comm)):
        with pytest.raises(ValueError, match=f"rank {comm.size - 1}: y has 3 rows" if comm.size > 1 else "y has 3"):
            call()

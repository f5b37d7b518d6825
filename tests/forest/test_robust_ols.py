"""Distributed weighted least squares with HC3 / cluster-robust covariances against slow references."""
import numpy as np
import pytest

from forest.engine.clusters import cluster_layout
from forest.analysis.robust_ols import robust_ols, robust_ols_reference
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _problem(n, seed, n_clusters=30):
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.ones(n), rng.normal(size=n), rng.uniform(size=n)])
    labels = rng.integers(0, n_clusters, size=n)
    cluster_shock = rng.normal(size=n_clusters)[labels]
    y = X @ [1.0, 2.0, -1.0] + (1 + X[:, 2]) * rng.normal(size=n) + cluster_shock
    w = rng.uniform(0.2, 3.0, size=n)
    return X, y, w, labels


def test_hc3_without_clusters_is_the_textbook_formula():
    X, y, _, _ = _problem(200, 0)
    fit = robust_ols(SELF, X, y, np.ones(200))
    XtX_inv = np.linalg.inv(X.T @ X)
    coef = XtX_inv @ X.T @ y
    e = y - X @ coef
    h = np.einsum("ij,jk,ik->i", X, XtX_inv, X)
    cov = XtX_inv @ (X.T * (e / (1 - h)) ** 2) @ X @ XtX_inv
    np.testing.assert_allclose(fit.coef, coef, rtol=1e-10)
    np.testing.assert_allclose(fit.cov, cov, rtol=1e-9)
    assert fit.dof == 197 and fit.n_obs == 200 and fit.n_clusters == 200


@pytest.mark.parametrize("vcov", ["HC3", "HC1"])
@pytest.mark.parametrize("clustered", [False, True])
def test_matches_explicit_block_reference(vcov, clustered):
    X, y, w, labels = _problem(400, 1)
    w[:7] = 0.0                                         # rows outside a subset
    lay = cluster_layout(SELF, labels, 400) if clustered else None
    fit = robust_ols(SELF, X, y, w, lay, vcov=vcov)
    coef, cov = robust_ols_reference(X, y, w, labels if clustered else None, vcov=vcov)
    np.testing.assert_allclose(fit.coef, coef, rtol=1e-10)
    np.testing.assert_allclose(fit.cov, cov, rtol=1e-8)
    assert fit.n_obs == 393


def test_cluster_robust_errors_grow_with_cluster_shocks():
    X, y, _, labels = _problem(1500, 2, n_clusters=20)
    # a cluster shock on a regressor that is constant within clusters: row-level errors understate
    X[:, 2] = np.random.default_rng(9).normal(size=20)[labels]
    y = y + 2.0 * np.random.default_rng(10).normal(size=20)[labels]
    plain = robust_ols(SELF, X, y, np.ones(1500))
    clustered = robust_ols(SELF, X, y, np.ones(1500), cluster_layout(SELF, labels, 1500))
    assert clustered.stderr[2] > 2 * plain.stderr[2]
    assert clustered.n_clusters == 20


def test_errors():
    X, y, w, _ = _problem(50, 3)
    with pytest.raises(ValueError, match="vcov"):
        robust_ols(SELF, X, y, w, vcov="HC9")
    with pytest.raises(ValueError, match="singular"):
        robust_ols(SELF, np.column_stack([X, X[:, 1]]), y, w)
    with pytest.raises(ValueError, match="rows with positive weight"):
        robust_ols(SELF, X, y, np.r_[np.ones(3), np.zeros(47)])


@pytest.mark.mpi
def test_same_fit_for_any_rank_count(comm, rank_slice):
    X, y, w, labels = _problem(500, 4)
    sl = rank_slice(500)
    fits = {}
    for kind in ("rows", "clusters"):
        for vcov in ("HC3", "HC1"):
            dist_layout = cluster_layout(comm, labels[sl], len(y[sl])) if kind == "clusters" else None
            ref_layout = cluster_layout(SELF, labels, 500) if kind == "clusters" else None
            fits[kind, vcov] = (robust_ols(comm, X[sl], y[sl], w[sl], dist_layout, vcov),
                                robust_ols(SELF, X, y, w, ref_layout, vcov))
    for dist, ref in fits.values():
        np.testing.assert_allclose(dist.coef, ref.coef, rtol=1e-10)
        np.testing.assert_allclose(dist.cov, ref.cov, rtol=1e-9)
        assert (dist.dof, dist.n_obs, dist.n_clusters) == (ref.dof, ref.n_obs, ref.n_clusters)

"""Weighted least squares over all ranks' rows with robust (sandwich) covariances.

This module owns the linear regressions behind the causal-forest diagnostics (best
linear projection, calibration test, overlap-weighted effect): the coefficients of
``y ~ X`` with weights ``w`` over the rows of every rank, and their covariance
``M B M`` with ``M = (X^T W X)^{-1}`` and a "meat" ``B`` that is a sum over clusters
(each row its own cluster when there are none).

Covariance types (R's ``sandwich``, which grf calls):

``"HC3"``
    Jackknife-type residuals. Per row ``u_i = w_i x_i e_i / (1 - h_i)`` with the
    leverage ``h_i = w_i x_i^T M x_i``; per cluster ``g`` the block version
    ``u_g = X_g^T W_g (I - H_gg)^{-1} e_g`` with ``H_gg = X_g M X_g^T W_g``. By the
    Woodbury identity ``u_g = M^{-1} (M^{-1} - S_g)^{-1} s_g`` where
    ``S_g = sum_{i in g} w_i x_i x_i^T`` and ``s_g = sum_{i in g} w_i x_i e_i``: two
    sums over the cluster's rows, so clusters split across ranks need no gathering
    of rows. ``B = sum_g u_g u_g^T`` (sandwich's cluster factor ``G/(G-1)`` cancels
    against its HC3 factor ``(G-1)/G``). Equal to sandwich's ``vcovCL(type="HC3")``
    whenever weights are constant within clusters (no clusters, unit weights, or
    grf's equalised cluster weights); with weights that vary inside a cluster
    sandwich applies ``(I - H_gg)^{-1}`` after weighting the residuals, which is not
    the leave-cluster-out residual of weighted least squares used here.
``"HC1"``
    ``u_g = s_g`` and ``B`` scaled by ``G/(G-1) (n-1)/(n-k)`` (``vcovCL``'s default
    for ``lm``; ``n/(n-k)`` without clusters).

Collectives: one allreduce of ``X^T W X, X^T W y`` (and the row count), then one
through :func:`forest.engine.clusters.cluster_moments` for the meat.
"""
from typing import NamedTuple

import numpy as np

from native import collectives as col

from forest.engine.clusters import cluster_moments

VCOV_TYPES = ("HC3", "HC1")


class OLSFit(NamedTuple):
    """Coefficients and robust covariance of a weighted least-squares fit.

    Attributes
    ----------
    coef : ndarray, shape (k,)
    cov : ndarray, shape (k, k)
    dof : int
        Residual degrees of freedom, rows with positive weight minus ``k``.
    n_obs : int
        Rows with positive weight (all ranks).
    n_clusters : int
        Clusters with at least one such row (``n_obs`` without clusters).
    """

    coef: np.ndarray
    cov: np.ndarray
    dof: int
    n_obs: int
    n_clusters: int

    @property
    def stderr(self):
        """Standard errors, shape (k,)."""
        return np.sqrt(np.maximum(np.diag(self.cov), 0.0))


def robust_ols(comm, X, y, w, layout=None, vcov="HC3"):
    """Weighted least squares of ``y`` on ``X`` over all ranks, with a robust covariance.

    Parameters
    ----------
    comm : native.comm.Communicator
    X : ndarray, shape (n_local, k)
        Design, intercept column included by the caller.
    y : ndarray, shape (n_local,)
    w : ndarray, shape (n_local,)
        Non-negative weights; rows with weight 0 take no part (subsets are passed
        this way).
    layout : forest.engine.clusters.ClusterLayout, optional
        Cluster-robust covariance over these clusters.
    vcov : {"HC3", "HC1"}

    Returns
    -------
    OLSFit

    Raises
    ------
    ValueError
        Unknown ``vcov``; a singular design (a regressor constant or collinear on the
        included rows); no more rows than regressors.
    """
    if vcov not in VCOV_TYPES:
        raise ValueError(f"vcov must be one of {VCOV_TYPES}, got {vcov!r}")
    X = np.asarray(X, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    n, k = X.shape
    used = w > 0
    Xw = X * w[:, None]
    flat = np.concatenate([(Xw.T @ X).ravel(), Xw.T @ y, [float(used.sum())]])
    if comm.size > 1:
        flat = col.allreduce(comm, flat)
    XtWX = flat[: k * k].reshape(k, k)
    XtWy = flat[k * k: k * k + k]
    n_obs = int(round(flat[-1]))
    if n_obs <= k:
        raise ValueError(f"the regression has {n_obs} rows with positive weight for {k} coefficients")
    scale = np.maximum(np.abs(np.diag(XtWX)), 1e-300)
    eig = np.linalg.eigvalsh(XtWX / np.sqrt(np.outer(scale, scale)))
    if eig[0] < 1e-10:
        raise ValueError("the regression design is singular (a regressor is constant or collinear with others "
                         "on the rows used)")
    M = np.linalg.inv(XtWX)
    coef = M @ XtWy
    resid = y - X @ coef
    s = Xw * resid[:, None]                                   # w_i x_i e_i
    if vcov == "HC1":
        _, meat, n_cl = cluster_moments(comm, s, layout, include=used)
        if n_cl < 2:        # one cluster's score total is zero by the normal equations: a zero "error"
            raise ValueError(f"the rows used lie in {n_cl} cluster{'' if n_cl == 1 else 's'}: cluster-robust "
                             f"standard errors need at least two (a subset holding one cluster cannot give them)")
        meat = meat * (n_cl / (n_cl - 1)) * ((n_obs - 1) / (n_obs - k))
    elif layout is None:
        lev = np.einsum("ij,jk,ik->i", X, M, X) * w
        u = s / np.maximum(1.0 - lev, 1e-12)[:, None]
        _, meat, n_cl = cluster_moments(comm, u, None, include=used)
    else:
        Minv = XtWX
        values = np.concatenate([s, (Xw[:, :, None] * X[:, None, :]).reshape(n, k * k)], axis=1)
        # The cluster jackknife leaves one cluster out at a time: with a single cluster among
        # the rows used nothing is left (numpy would only say "Singular matrix").
        _, _, n_used = cluster_moments(comm, np.zeros((n, 1)), layout, include=used)
        if n_used < 2:
            raise ValueError(f"the rows used lie in {n_used} cluster{'' if n_used == 1 else 's'}: cluster-robust "
                             f"standard errors need at least two (a subset holding one cluster cannot give them)")

        def jackknife_scores(V):
            S = V[:, k:].reshape(-1, k, k)
            try:
                inner = np.linalg.solve(Minv[None] - S, V[:, :k, None])
            except np.linalg.LinAlgError:
                # NaN, not an exception: only this rank holds the cluster, and every rank
                # must leave the reduction below; the NaN reaches them all through it.
                return np.full((len(V), k), np.nan)
            return (Minv @ inner)[:, :, 0]

        _, meat, n_cl = cluster_moments(comm, values, layout, transform=jackknife_scores, include=used)
        if not np.all(np.isfinite(meat)):
            raise ValueError("leaving one cluster out makes the regression singular (a regressor varies within "
                             "that cluster only): cluster-robust HC3 errors cannot be computed on these rows; use "
                             "more clusters or fewer regressors")
    cov = M @ meat @ M
    return OLSFit(coef, 0.5 * (cov + cov.T), n_obs - k, n_obs, n_cl)


def robust_ols_reference(X, y, w, clusters=None, vcov="HC3"):
    """Slow single-process reference of :func:`robust_ols`: explicit hat blocks and inverses.

    Parameters
    ----------
    X, y, w : ndarray
        As in :func:`robust_ols` (all rows).
    clusters : ndarray of int, shape (n,), optional
    vcov : {"HC3", "HC1"}

    Returns
    -------
    coef : ndarray, shape (k,)
    cov : ndarray, shape (k, k)
    """
    X = np.asarray(X, dtype=np.float64)
    n, k = X.shape
    keep = w > 0
    X, y, w = X[keep], np.asarray(y, float)[keep], np.asarray(w, float)[keep]
    groups = np.arange(len(y)) if clusters is None else np.asarray(clusters)[keep]
    M = np.linalg.inv(X.T @ (w[:, None] * X))
    coef = M @ X.T @ (w * y)
    e = y - X @ coef
    labels = np.unique(groups)
    meat = np.zeros((k, k))
    for g in labels:
        rows = np.flatnonzero(groups == g)
        Xg, wg, eg = X[rows], w[rows], e[rows]
        if vcov == "HC3":
            H = Xg @ M @ Xg.T @ np.diag(wg)
            eg = np.linalg.solve(np.eye(len(rows)) - H, eg)
        u = Xg.T @ (wg * eg)
        meat += np.outer(u, u)
    if vcov == "HC1":
        G, m = len(labels), len(y)
        meat *= G / (G - 1) * (m - 1) / (m - k)
    return coef, M @ meat @ M

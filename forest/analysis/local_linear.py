"""Local linear correction of forest predictions (grf's ``local.linear`` prediction, Friedberg et al.).

A forest prediction is a weighted mean of the training outcomes with the forest weights
``alpha_i(x)`` (:mod:`forest.engine.forest_weights`). The local linear prediction fits,
at each query point ``x``, a ridge regression of the outcomes on the features centred
at ``x`` with those weights, and predicts its intercept:

    minimise  sum_i alpha_i (y_i - mu - (X_i - x)^T theta)^2 + lambda * P(theta)

``P`` is grf's standard penalty ``(trace(M) / (p + 1)) * |theta|^2`` with ``M`` the
weighted Gram matrix of ``[1, X_i - x]`` (``weight_penalty=False``), or its covariance
penalty ``sum_j M_jj theta_j^2`` (``weight_penalty=True``); the intercept is never
penalised. It corrects the forest's bias where the signal is smooth (a forest's
piecewise-constant leaves flatten slopes near the edges of the data).

Everything is sums over training rows: ``M = sum_i alpha_i d_i d_i^T`` and
``b = sum_i alpha_i d_i y_i^T`` with ``d_i = [1, X_i - x]``. Under ``mpirun`` each rank
adds its own training rows (its columns of the forest weights) and one allreduce gives
every rank the totals; the solve is per query, local.

:func:`local_linear_sums` is the compiled kernel over the sparse weights,
:func:`local_linear_sums_reference` its NumPy reference, :func:`local_linear_solve` the
ridge solve, and :func:`local_linear_reference` the whole prediction written as grf
states it (dense weights, one query at a time) for tests.

Causal forests (grf's ``predict(causal_forest, linear.correction.variables = ...)``):
with the centred outcome ``Y~ = Y - m(X)`` and treatment ``W~ = W - e(X)`` of the
training rows, the regressors are ``d_i = [1, X_i - x, W~_i, W~_i (X_i - x)]``
(``2p + 2`` of them, grf's order) and the effect is the coefficient of ``W~``:

    minimise  sum_i alpha_i (Y~_i - d_i^T beta)^2 + lambda * P(beta)

with the same penalties on every coefficient but the intercept and ``W~``'s (the
normaliser is ``trace(M) / (2p + 2)``). A huge ``lambda`` leaves the regression of
``Y~`` on ``[1, W~]``, which is the causal forest's own estimate. Kernel
:func:`local_linear_causal_sums`, reference :func:`local_linear_causal_sums_reference`,
solve :func:`local_linear_causal_solve`, grf's statement :func:`local_linear_causal_reference`.

Choosing lambda (grf's ``tune_ll_regression_forest`` / ``tune_ll_causal_forest``): the
out-of-bag local linear estimate of every training row (forest weights of the trees
that left the row out, :mod:`forest.engine.oob_forest_weights`) at each lambda of
:data:`LAMBDA_PATH`; the criterion is the mean squared out-of-bag error (regression)
or grf's R-loss ``mean (Y~ - W~ tau)^2`` (causal), and the choice is the first
lambda of least error (:func:`path_errors`, :func:`choose_lambda`). Rows whose
estimate is NaN at some lambda of the grid (a singular unpenalised fit) are left out
at every lambda, so all lambdas are judged on the same rows.
"""
from typing import NamedTuple

import numpy as np
from numba import prange

from histogram.jit import kernel

#: grf's default ridge penalty of local linear prediction (``ll.lambda`` when not tuned).
DEFAULT_LAMBDA = 0.1

#: grf's lambda grid for choosing ``ll.lambda`` (the default path of its tuning functions).
LAMBDA_PATH = (0.0, 0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 1.0, 10.0)


@kernel(parallel=True)
def _sums_kernel(indptr, indices, data, X_train, y_train, queries, M, b):
    n_q = queries.shape[0]
    p = queries.shape[1]
    k = y_train.shape[1]
    for q in prange(n_q):
        d = np.empty(p + 1)
        d[0] = 1.0
        for e in range(indptr[q], indptr[q + 1]):
            i = indices[e]
            w = data[e]
            for j in range(p):
                d[j + 1] = X_train[i, j] - queries[q, j]
            for r in range(p + 1):
                wr = w * d[r]
                for c in range(r, p + 1):
                    M[q, r, c] += wr * d[c]
                for t in range(k):
                    b[q, r, t] += wr * y_train[i, t]
        for r in range(p + 1):
            for c in range(r):
                M[q, r, c] = M[q, c, r]


def local_linear_sums(weights, X_train, y_train, queries):
    """Weighted Gram matrices and cross products of ``[1, X_i - x]`` over this rank's training rows.

    Parameters
    ----------
    weights : scipy.sparse.csr_matrix, shape (n_query, n_train)
        Forest weights (:meth:`get_forest_weights`): query rows by training rows.
    X_train : ndarray of float64, shape (n_train, p)
        The training rows' values of the correction variables.
    y_train : ndarray of float64, shape (n_train, k)
    queries : ndarray of float64, shape (n_query, p)
        The query rows' values of the same variables.

    Returns
    -------
    M : ndarray of float64, shape (n_query, p + 1, p + 1)
    b : ndarray of float64, shape (n_query, p + 1, k)
    """
    n_q, p = queries.shape
    k = y_train.shape[1]
    M = np.zeros((n_q, p + 1, p + 1))
    b = np.zeros((n_q, p + 1, k))
    _sums_kernel(np.asarray(weights.indptr, dtype=np.int64), np.asarray(weights.indices, dtype=np.int64),
                 np.asarray(weights.data, dtype=np.float64), np.ascontiguousarray(X_train, dtype=np.float64),
                 np.ascontiguousarray(y_train, dtype=np.float64), np.ascontiguousarray(queries, dtype=np.float64),
                 M, b)
    return M, b


def local_linear_sums_reference(weights, X_train, y_train, queries):
    """NumPy reference of :func:`local_linear_sums` (dense weights, one query at a time)."""
    dense = weights.toarray() if hasattr(weights, "toarray") else np.asarray(weights)
    n_q, p = queries.shape
    M = np.zeros((n_q, p + 1, p + 1))
    b = np.zeros((n_q, p + 1, y_train.shape[1]))
    for q in range(n_q):
        D = np.hstack([np.ones((len(X_train), 1)), X_train - queries[q]])
        M[q] = D.T @ (dense[q][:, None] * D)
        b[q] = D.T @ (dense[q][:, None] * y_train)
    return M, b


def local_linear_solve(M, b, ll_lambda=DEFAULT_LAMBDA, weight_penalty=False):
    """Intercepts of the penalised local regressions.

    Parameters
    ----------
    M : ndarray, shape (n, p + 1, p + 1)
    b : ndarray, shape (n, p + 1, k)
    ll_lambda : float
        Ridge penalty (>= 0).
    weight_penalty : bool
        grf's ``ll.weight.penalty``: penalise ``theta_j`` by ``M_jj`` instead of the
        Gram matrix's mean diagonal.

    Returns
    -------
    ndarray, shape (n, k)
        NaN where the penalised matrix is singular (a query whose weights sit on one
        point with no penalty).
    """
    return ridge_coefficient(M, b, [ll_lambda], weight_penalty, unpenalised=(0,), coef=0)[:, 0]


def local_linear_reference(alpha, X_train, y_train, x, ll_lambda=DEFAULT_LAMBDA, weight_penalty=False):
    """One query's local linear prediction, as grf writes it (dense weights ``alpha (n_train,)``).

    Returns
    -------
    ndarray, shape (k,)
    """
    D = np.hstack([np.ones((len(X_train), 1)), X_train - x])
    M = D.T @ np.diag(alpha) @ D
    pen = np.diag(M)[1:] if weight_penalty else np.full(D.shape[1] - 1, np.trace(M) / D.shape[1])
    M[1:, 1:] += ll_lambda * np.diag(pen)
    return np.linalg.solve(M, D.T @ np.diag(alpha) @ y_train)[0]


def _solve_stack(A, b):
    """Solve ``A[q] x = b[q]`` for every ``q``; NaN rows where ``A[q]`` is singular."""
    try:
        return np.linalg.solve(A, b)
    except np.linalg.LinAlgError:
        out = np.full(b.shape, np.nan)
        for q in range(len(A)):
            try:
                out[q] = np.linalg.solve(A[q], b[q])
            except np.linalg.LinAlgError:
                pass
        return out


def ridge_coefficient(M, b, lambdas, weight_penalty=False, unpenalised=(0,), coef=0):
    """One coefficient of penalised weighted least squares from its sums, over a lambda grid.

    Solves ``(M + lambda P) beta = b`` per query, ``P`` diagonal and zero on the
    ``unpenalised`` coefficients; elsewhere ``trace(M) / dim`` (grf's standard penalty)
    or ``M_jj`` (``weight_penalty``, grf's covariance penalty).

    Parameters
    ----------
    M : ndarray, shape (n, dim, dim)
    b : ndarray, shape (n, dim, k)
    lambdas : sequence of float
    weight_penalty : bool
    unpenalised : sequence of int
        Coefficients without penalty (the intercept; the causal fit's ``W~`` too).
    coef : int
        The coefficient returned.

    Returns
    -------
    ndarray, shape (n, len(lambdas), k)
        NaN where the penalised matrix is singular.
    """
    M = np.asarray(M, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    n, dim, _ = M.shape
    lambdas = np.asarray(lambdas, dtype=np.float64).ravel()
    idx, scale = ridge_penalty(M, weight_penalty, unpenalised)
    out = np.full((n, len(lambdas), b.shape[2]), np.nan)
    if n == 0:
        return out
    for j, lam in enumerate(lambdas):
        A = M.copy()
        A[:, idx, idx] += lam * scale
        out[:, j] = _solve_stack(A, b)[:, coef]
    return out


def ridge_penalty(M, weight_penalty=False, unpenalised=(0,)):
    """The penalty of :func:`ridge_coefficient`: which diagonal entries, and their scale (linear in ``M``).

    Parameters
    ----------
    M : ndarray, shape (n, dim, dim)
    weight_penalty : bool
    unpenalised : sequence of int

    Returns
    -------
    idx : ndarray of int64, shape (q,)
        The penalised coefficients.
    scale : ndarray, shape (n, q)
        ``trace(M) / dim`` each (grf's standard penalty) or ``M_jj`` (``weight_penalty``):
        ``lambda * scale`` is added to ``M[:, idx, idx]``.
    """
    n, dim, _ = M.shape
    penalised = np.ones(dim, dtype=bool)
    penalised[list(unpenalised)] = False
    idx = np.flatnonzero(penalised)
    if weight_penalty:
        scale = M[:, idx, idx]
    else:
        scale = np.repeat((np.trace(M, axis1=1, axis2=2) / dim)[:, None], len(idx), axis=1)
    return idx, scale


@kernel(parallel=True)
def _causal_sums_kernel(indptr, indices, data, X_train, w_train, y_train, queries, M, b):
    n_q = queries.shape[0]
    p = queries.shape[1]
    k = y_train.shape[1]
    dim = 2 * p + 2
    for q in prange(n_q):
        d = np.empty(dim)
        d[0] = 1.0
        for e in range(indptr[q], indptr[q + 1]):
            i = indices[e]
            w = data[e]
            wi = w_train[i]
            d[p + 1] = wi
            for j in range(p):
                dx = X_train[i, j] - queries[q, j]
                d[j + 1] = dx
                d[p + 2 + j] = wi * dx
            for r in range(dim):
                wr = w * d[r]
                for c in range(r, dim):
                    M[q, r, c] += wr * d[c]
                for t in range(k):
                    b[q, r, t] += wr * y_train[i, t]
        for r in range(dim):
            for c in range(r):
                M[q, r, c] = M[q, c, r]


def local_linear_causal_sums(weights, X_train, w_train, y_train, queries):
    """Weighted Gram matrices and cross products of ``[1, X_i - x, W~_i, W~_i (X_i - x)]``.

    Parameters
    ----------
    weights : scipy.sparse.csr_matrix, shape (n_query, n_train)
    X_train : ndarray of float64, shape (n_train, p)
        The training rows' correction variables.
    w_train : ndarray of float64, shape (n_train,)
        Centred treatment ``W - e(X)``.
    y_train : ndarray of float64, shape (n_train, k)
        Centred outcomes ``Y - m(X)``.
    queries : ndarray of float64, shape (n_query, p)

    Returns
    -------
    M : ndarray of float64, shape (n_query, 2p + 2, 2p + 2)
    b : ndarray of float64, shape (n_query, 2p + 2, k)
    """
    n_q, p = queries.shape
    k = y_train.shape[1]
    M = np.zeros((n_q, 2 * p + 2, 2 * p + 2))
    b = np.zeros((n_q, 2 * p + 2, k))
    _causal_sums_kernel(np.asarray(weights.indptr, dtype=np.int64), np.asarray(weights.indices, dtype=np.int64),
                        np.asarray(weights.data, dtype=np.float64), np.ascontiguousarray(X_train, dtype=np.float64),
                        np.ascontiguousarray(w_train, dtype=np.float64).ravel(),
                        np.ascontiguousarray(y_train, dtype=np.float64),
                        np.ascontiguousarray(queries, dtype=np.float64), M, b)
    return M, b


def _causal_design(X_train, w_train, x):
    dx = X_train - x
    w = np.asarray(w_train, dtype=np.float64).reshape(-1, 1)
    return np.hstack([np.ones((len(X_train), 1)), dx, w, w * dx])


def local_linear_causal_sums_reference(weights, X_train, w_train, y_train, queries):
    """NumPy reference of :func:`local_linear_causal_sums` (dense weights, one query at a time)."""
    dense = weights.toarray() if hasattr(weights, "toarray") else np.asarray(weights)
    n_q, p = queries.shape
    M = np.zeros((n_q, 2 * p + 2, 2 * p + 2))
    b = np.zeros((n_q, 2 * p + 2, y_train.shape[1]))
    for q in range(n_q):
        D = _causal_design(X_train, w_train, queries[q])
        M[q] = D.T @ (dense[q][:, None] * D)
        b[q] = D.T @ (dense[q][:, None] * y_train)
    return M, b


def local_linear_causal_solve(M, b, lambdas, weight_penalty=False):
    """Local linear effects (the ``W~`` coefficient) from :func:`local_linear_causal_sums`.

    Parameters
    ----------
    M : ndarray, shape (n, 2p + 2, 2p + 2)
    b : ndarray, shape (n, 2p + 2, k)
    lambdas : float or sequence of float
    weight_penalty : bool

    Returns
    -------
    ndarray, shape (n, k) for one lambda, (n, len(lambdas), k) for a sequence
        NaN where the penalised matrix is singular.
    """
    p = (np.shape(M)[1] - 2) // 2
    one = np.ndim(lambdas) == 0
    out = ridge_coefficient(M, b, np.atleast_1d(lambdas), weight_penalty, unpenalised=(0, p + 1), coef=p + 1)
    return out[:, 0] if one else out


def local_linear_causal_reference(alpha, X_train, w_train, y_train, x, ll_lambda=DEFAULT_LAMBDA,
                                  weight_penalty=False):
    """One query's local linear effect as grf writes it (dense weights ``alpha (n_train,)``).

    Returns
    -------
    ndarray, shape (k,)
    """
    D = _causal_design(X_train, w_train, x)
    dim = D.shape[1]
    p = (dim - 2) // 2
    M = D.T @ np.diag(alpha) @ D
    pen = np.diag(M).copy() if weight_penalty else np.full(dim, np.trace(M) / dim)
    pen[[0, p + 1]] = 0.0
    return np.linalg.solve(M + ll_lambda * np.diag(pen), D.T @ np.diag(alpha) @ y_train)[p + 1]


class LambdaPath(NamedTuple):
    """A lambda choice (what grf's tuning functions return).

    Attributes
    ----------
    lambdas : ndarray, shape (L,)
        The grid.
    errors : ndarray, shape (L,)
        The criterion at each lambda over all ranks' training rows (the same on every rank).
    ll_lambda : float
        The first lambda of least error.
    criterion : str
        ``"out-of-bag squared error"`` (regression) or ``"R-loss"`` (causal).
    n_rows : int
        Training rows the errors average over (all ranks).
    oob_predictions : ndarray, shape (n_local, L) or (n_local, L, k)
        This rank's training rows' out-of-bag local linear estimates at each lambda.
    """

    lambdas: np.ndarray
    errors: np.ndarray
    ll_lambda: float
    criterion: str
    n_rows: int
    oob_predictions: np.ndarray


def check_lambda_path(lambdas):
    """grf's grid when None; otherwise a non-empty 1-D array of finite numbers >= 0."""
    if lambdas is None:
        return np.asarray(LAMBDA_PATH, dtype=np.float64)
    grid = np.asarray(lambdas, dtype=np.float64).ravel()
    if not len(grid) or not np.all(np.isfinite(grid)) or (grid < 0).any():
        raise ValueError(f"lambdas must be a non-empty sequence of finite numbers >= 0, got {lambdas!r}")
    return grid


def path_errors(residuals, weight):
    """This rank's share of a lambda path's criterion.

    Parameters
    ----------
    residuals : ndarray, shape (n, L, k)
        Each row's residual at each lambda (``y - prediction``, or the R-loss's
        ``Y~ - W~ tau``); NaN where the estimate is.
    weight : ndarray, shape (n,)
        Row weights (ones without sample weights).

    Returns
    -------
    ndarray, shape (L + 2,)
        ``sum_i weight_i |residual_il|^2`` for each lambda over the rows finite at
        every lambda, then those rows' weight and count: add over ranks, then
        :func:`choose_lambda`.
    """
    r = np.asarray(residuals, dtype=np.float64)
    used = np.isfinite(r).all(axis=(1, 2))
    w = np.asarray(weight, dtype=np.float64)[used]
    sq = (r[used] ** 2).sum(axis=2)
    return np.concatenate([w @ sq, [w.sum(), float(used.sum())]])


def choose_lambda(lambdas, totals):
    """``(errors (L,), chosen lambda, rows)`` from :func:`path_errors` summed over ranks."""
    totals = np.asarray(totals, dtype=np.float64)
    L = len(lambdas)
    if not totals[L + 1] > 0 or not totals[L] > 0:
        raise ValueError("no training row has a finite out-of-bag local linear estimate at every lambda of the grid "
                         "(too few trees for out-of-bag estimates?): choose ll_lambda yourself")
    errors = totals[:L] / totals[L]
    return errors, float(lambdas[int(np.argmin(errors))]), int(totals[L + 1])

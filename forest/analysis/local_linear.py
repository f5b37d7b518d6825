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
"""
import numpy as np
from numba import prange

from histogram.jit import kernel

#: grf's default ridge penalty of local linear prediction (``ll.lambda`` when not tuned).
DEFAULT_LAMBDA = 0.1


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
    M = np.array(M, dtype=np.float64, copy=True)
    n, q1, _ = M.shape
    diag = np.arange(1, q1)
    if weight_penalty:
        M[:, diag, diag] += ll_lambda * M[:, diag, diag]
    else:
        norm = np.trace(M, axis1=1, axis2=2) / q1
        M[:, diag, diag] += ll_lambda * norm[:, None]
    out = np.full((n, b.shape[2]), np.nan)
    for q in range(n):
        try:
            out[q] = np.linalg.solve(M[q], b[q])[0]
        except np.linalg.LinAlgError:
            pass
    return out


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

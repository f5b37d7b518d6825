"""Censoring-adjusted outcomes of the causal survival forest (grf's ``causal_survival_forest``).

The forest estimates ``tau(x) = E[f(T(1)) - f(T(0)) | X = x]`` for ``f(T) = min(T, h)``
(the restricted mean survival time up to the horizon ``h``, "RMST") or ``f(T) = 1[T > h]``
("survival_probability"), from censored times ``Y = min(T, C)`` and ``D = 1[T <= C]``.

grf solves ``sum_i alpha_i(x) (psi_num_i - tau psi_den_i) = 0`` with ``psi_den = (W -
e(X))^2`` and ``psi_num = (W - e(X)) r`` where ``r`` is the augmented inverse-probability-of-
censoring-weighted residual of ``f(T)`` (Cui, Kosorok, Sverdrup, Wager and Zhu, 2023):

    r_i = [D_i (f(Y_i) - m_i) + (1 - D_i) (Q_i(Y_i) - m_i)] / C_i(Y_i)
          - sum_{t_j <= Y_i} dLambda_C,i(t_j) / C_i(t_j) (Q_i(t_j) - m_i)

with ``m(x) = E[f(T) | X = x]``, ``Q(t) = E[f(T) | X, W, T > t]`` from the outcome survival
curve ``S(t | X, W)``, ``C(t | X, W)`` the censoring survival curve and
``dLambda_C(t_j) = log C(t_{j-1}) - log C(t_j)`` its hazard increment, all on a grid
``t_0 < ... < t_{G-1} = h`` (``t_0`` the smallest time). ``r`` has conditional mean
``E[f(T) | X, W] - m(X)`` when either the censoring curve or the outcome curve is right.

So ``Y~ = m + r`` is a censoring-unbiased transformation of ``f(T)``: this module gives it
(:func:`adjusted_outcomes`), and the forest is a causal forest of ``Y~`` on ``W`` centred by
``m`` and ``e``. Its doubly robust score for a binary treatment,
``tau + (W - e) / (e (1 - e)) (Y~ - m - (W - e) tau)``, is exactly grf's
``tau + (psi_num - psi_den tau) / (e (1 - e))`` (``get_scores.causal_survival_forest``).

:func:`adjusted_outcomes_reference` is the slow matrix version (grf's layout: a ``Q``
matrix per row and time) the compiled kernel is tested against.
"""
import numpy as np
from numba import prange

from histogram.jit import kernel
from forest.criteria.survival import time_labels

#: Estimands of the causal survival forest.
TARGETS = ("RMST", "survival_probability")
#: Censoring probabilities are floored here (a zero would divide; grf refuses it).
C_FLOOR = 1e-12


def horizon_targets(time, event, horizon, target):
    """``(time, event, f)``: the times and events the scores use, and ``f(T)`` where observed.

    Times beyond the horizon count as observed at the horizon (``f`` is known there):
    ``D = 1, Y = h`` for ``Y >= h`` (RMST) or ``Y > h`` (survival probability), as grf.

    Parameters
    ----------
    time : ndarray of float64, shape (n,)
    event : ndarray of bool, shape (n,)
    horizon : float
    target : {"RMST", "survival_probability"}

    Returns
    -------
    time, event, f : ndarray, shape (n,) each (float64, bool, float64)
    """
    beyond = time >= horizon if target == "RMST" else time > horizon
    f = np.minimum(time, horizon) if target == "RMST" else (time > horizon).astype(np.float64)
    return np.where(beyond, horizon, time), event | beyond, f


def restricted_mean(S, grid, horizon):
    """``int_0^h S(t) dt`` of step curves known on the grid (1 before ``t_0``), shape (n,).

    Parameters
    ----------
    S : ndarray, shape (n, G)
        Survival at the grid times (right-continuous steps).
    grid : ndarray, shape (G,)
        Increasing, ``t_{G-1} <= h``.
    horizon : float
    """
    widths = np.diff(np.append(grid, horizon))
    # einsum, not ``@``: fits make no threaded BLAS call (histogram._thread_wait).
    return grid[0] + np.einsum("ng,g->n", S, widths)


def time_index(grid, time):
    """Index of the last grid time at or below each time (0 for times below the grid), shape (n,).

    :func:`forest.criteria.survival.time_labels` counts the grid times at or below a time;
    this is that count less one.
    """
    return np.maximum(time_labels(time, grid) - 1, 0)


def adjusted_outcomes(S, C, grid, time, event, f, m, target):
    """Censoring-adjusted residuals ``r`` (module docstring), shape (n,).

    Parameters
    ----------
    S, C : ndarray of float64, shape (n, G)
        Outcome and censoring survival curves at the grid times, of each row's own
        ``(X, W)``.
    grid : ndarray of float64, shape (G,)
        Increasing; the last time is the horizon.
    time : ndarray of float64, shape (n,)
        Horizon-capped times (:func:`horizon_targets`).
    event : ndarray of bool, shape (n,)
    f : ndarray of float64, shape (n,)
        ``f(Y)`` (used where ``event``).
    m : ndarray of float64, shape (n,)
        ``E[f(T) | X]``.
    target : {"RMST", "survival_probability"}

    Returns
    -------
    ndarray of float64, shape (n,)
    """
    S = np.ascontiguousarray(S, dtype=np.float64)
    C = np.ascontiguousarray(C, dtype=np.float64)
    grid = np.ascontiguousarray(grid, dtype=np.float64)
    out = np.empty(S.shape[0])
    _adjusted_kernel(S, C, grid, time_index(grid, time), np.asarray(event, dtype=np.bool_),
                     np.ascontiguousarray(f, dtype=np.float64), np.ascontiguousarray(m, dtype=np.float64),
                     target == "RMST", out)
    return out


@kernel(parallel=True)
def _adjusted_kernel(S, C, grid, index, event, f, m, rmst, out):
    n, G = S.shape
    for i in prange(n):
        # Q_j from the back: the tail integral sum_{k >= j} S_k (t_{k+1} - t_k) over S_j (RMST),
        # S_h / S_j (survival probability); the last grid time is the horizon.
        tail = np.empty(G)
        acc = 0.0
        tail[G - 1] = 0.0
        for j in range(G - 2, -1, -1):
            acc += S[i, j] * (grid[j + 1] - grid[j])
            tail[j] = acc
        k = index[i]
        integral = 0.0
        prev_log = 0.0
        q_k = 0.0
        for j in range(k + 1):
            c = max(C[i, j], 1e-12)
            log_c = np.log(c)
            s = S[i, j]
            if rmst:
                q = grid[j] + (tail[j] / s if s > 0.0 else 0.0) if j < G - 1 else grid[G - 1]
            else:
                q = (S[i, G - 1] / s if s > 0.0 else 0.0) if j < G - 1 else 1.0
            integral += (prev_log - log_c) / c * (q - m[i])
            prev_log = log_c
            q_k = q
        c_k = max(C[i, k], 1e-12)
        observed = f[i] if event[i] else q_k
        out[i] = (observed - m[i]) / c_k - integral


def adjusted_outcomes_reference(S, C, grid, time, event, f, m, target):
    """Slow NumPy version of :func:`adjusted_outcomes`: full ``Q`` and integrand matrices."""
    S = np.asarray(S, dtype=np.float64)
    C = np.maximum(np.asarray(C, dtype=np.float64), C_FLOOR)
    n, G = S.shape
    if target == "RMST":
        Q = np.empty((n, G))
        for j in range(G - 1):
            with np.errstate(divide="ignore", invalid="ignore"):
                tail = (S[:, j:G - 1] * np.diff(grid)[j:]).sum(axis=1)
                Q[:, j] = grid[j] + np.where(S[:, j] > 0, tail / S[:, j], 0.0)
        Q[:, G - 1] = grid[G - 1]
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            Q = np.where(S > 0, S[:, G - 1:G] / S, 0.0)
        Q[:, G - 1] = 1.0
    k = time_index(grid, time)
    rows = np.arange(n)
    Q_Y, C_Y = Q[rows, k], C[rows, k]
    first = (np.where(event, f - m, Q_Y - m)) / C_Y
    log_c = -np.log(np.concatenate([np.ones((n, 1)), C], axis=1))
    d_lambda = log_c[:, 1:] - log_c[:, :-1]
    integrand = d_lambda / C * (Q - m[:, None])
    upto = np.arange(G)[None, :] <= k[:, None]
    return first - (integrand * upto).sum(axis=1)

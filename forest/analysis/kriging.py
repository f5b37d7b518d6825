"""Kriging (Gaussian-process regression) of a noisy function on the unit cube: tuning's smoother.

Parameter tuning (:mod:`forest.estimators.tuning`) measures the error of a few dozen small
forests at random points of the unit cube (each coordinate one parameter's draw) and
must pick, among many more candidate points, the one with the lowest *expected* error.
The measured errors are noisy (a small forest's out-of-bag error moves with its trees), so
taking the best measured point favours luck; a smooth surface fitted through them does
not. grf fits DiceKriging's ``km`` with a Matérn 5/2 covariance and a nugget of half the
errors' variance; this module is that model, written out:

``error(x) = beta + Z(x) + noise``, ``Z`` a zero-mean Gaussian process with covariance
``s2 * matern52(|(x - x') / theta|)`` (one length scale per coordinate), ``noise``
independent with variance ``nugget``. ``beta`` is the generalised-least-squares constant;
``s2``, ``theta`` and the nugget maximise the likelihood (L-BFGS-B over their logarithms
from a fixed start, so the same input gives the same model). The prediction at a
candidate ``x*`` is the posterior mean ``beta + k(x*)^T K^{-1} (e - beta)``.

One difference from grf: grf fixes the nugget at half the errors' variance. When the
errors are mostly signal (parameters that matter), that nugget shrinks the surface
toward its mean and blurs the minimum; estimated, it follows the data (a noisy bowl in
``tests/forest/test_tuning.py``: the fixed nugget's surface is 4x further from the truth
than the measured errors themselves). ``nugget=`` fixes it when wanted.

Everything here is NumPy/SciPy on a handful of points (``n`` measured forests,
``O(n^3)``), run by one rank and its choice broadcast (the caller's business).
"""
import numpy as np

#: Bounds of the log length scales (unit-cube coordinates) and of the log process
#: variance and log nugget relative to the errors' variance.
_LOG_THETA_BOUNDS = (np.log(1e-2), np.log(10.0))
_LOG_S2_BOUNDS = (np.log(1e-4), np.log(1e3))
_LOG_NUGGET_BOUNDS = (np.log(1e-6), np.log(1e1))


def matern52(A, B, theta):
    """Matérn 5/2 correlation between the rows of ``A`` and ``B``.

    Parameters
    ----------
    A : ndarray, shape (n, p)
    B : ndarray, shape (m, p)
    theta : ndarray, shape (p,)
        Length scale of each coordinate.

    Returns
    -------
    ndarray, shape (n, m)
        ``(1 + sqrt(5) r + 5 r^2 / 3) exp(-sqrt(5) r)`` with ``r`` the scaled distance.
    """
    d = (A[:, None, :] - B[None, :, :]) / theta
    r = np.sqrt(np.einsum("nmp,nmp->nm", d, d))
    s = np.sqrt(5.0) * r
    return (1.0 + s + s * s / 3.0) * np.exp(-s)


def _posterior_parts(design, errors, theta, s2, nugget):
    """``(cholesky factor, beta, K^{-1} (e - beta), log-likelihood)`` of one hyperparameter choice."""
    n = len(errors)
    K = s2 * matern52(design, design, theta) + nugget * np.eye(n)
    try:
        L = np.linalg.cholesky(K)
    except np.linalg.LinAlgError:
        return None
    ones = np.ones(n)

    def solve(v):
        return np.linalg.solve(L.T, np.linalg.solve(L, v))

    k_ones = solve(ones)
    beta = float(ones @ solve(errors) / (ones @ k_ones))
    resid = errors - beta
    alpha = solve(resid)
    loglik = -0.5 * float(resid @ alpha) - float(np.log(np.diag(L)).sum()) - 0.5 * n * np.log(2 * np.pi)
    return L, beta, alpha, loglik


def fit_kriging(design, errors, nugget=None):
    """Fit the kriging model to measured errors.

    Parameters
    ----------
    design : ndarray, shape (n, p)
        Points of the unit cube where the errors were measured.
    errors : ndarray, shape (n,)
        Finite measured errors.
    nugget : float, optional
        Noise variance; estimated with the other hyperparameters when None (from
        grf's guess ``var(errors) / 2``, bounded below by ``1e-6 var(errors)`` so the
        matrix stays positive definite).

    Returns
    -------
    dict
        ``design, theta (p,), s2, nugget, beta, alpha (n,)``: what :func:`predict_kriging` needs.
    """
    from scipy.optimize import minimize

    design = np.asarray(design, dtype=np.float64)
    errors = np.asarray(errors, dtype=np.float64)
    n, p = design.shape
    spread = float(np.var(errors))
    scale = spread if spread > 0 else 1.0
    fixed = None if nugget is None else max(float(nugget), 1e-12 * scale)

    def unpack(z):
        return np.exp(z[:p]), scale * np.exp(z[p]), fixed if fixed is not None else scale * np.exp(z[p + 1])

    def negative_loglik(z):
        parts = _posterior_parts(design, errors, *unpack(z))
        return 1e300 if parts is None else -parts[3]

    start = np.concatenate([np.full(p, np.log(0.5)), [0.0], [] if fixed is not None else [np.log(0.5)]])
    bounds = [_LOG_THETA_BOUNDS] * p + [_LOG_S2_BOUNDS] + ([] if fixed is not None else [_LOG_NUGGET_BOUNDS])
    best = minimize(negative_loglik, start, method="L-BFGS-B", bounds=bounds)
    z = best.x if np.isfinite(best.fun) and best.fun < negative_loglik(start) else start
    theta, s2, noise = unpack(z)
    _, beta, alpha, _ = _posterior_parts(design, errors, theta, s2, noise)
    return {"design": design, "theta": theta, "s2": s2, "nugget": noise, "beta": beta, "alpha": alpha}


def predict_kriging(model, points):
    """Posterior mean of the kriging model at ``points``.

    Parameters
    ----------
    model : dict
        :func:`fit_kriging`'s result.
    points : ndarray, shape (m, p)

    Returns
    -------
    ndarray, shape (m,)
    """
    points = np.asarray(points, dtype=np.float64)
    k = model["s2"] * matern52(points, model["design"], model["theta"])
    return model["beta"] + k @ model["alpha"]

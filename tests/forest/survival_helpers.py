"""Simulated survival designs shared by the causal survival forest's tests."""
import numpy as np


def simple1(n, seed, p=4, horizon=1.0, X=None, with_effect=True):
    """grf's "simple1": ``T = Exp(1) x0 + W`` (capped at the horizon), ``C ~ U(0, 2)``.

    The effect depends on ``x0`` alone.

    Parameters
    ----------
    n : int
        Rows (ignored when ``X`` is given).
    seed : int
    p : int
        Features, ``X ~ U[0, 1]^p``.
    horizon : float
    X : ndarray of float, shape (n, p), optional
        Fixed features (the draws of ``W``, ``T`` and ``C`` still come from ``seed``).
    with_effect : bool
        Also return the RMST effect at each row by Monte Carlo (4,000 draws per row).

    Returns
    -------
    X : ndarray, shape (n, p)
    W : ndarray of float, shape (n,)
    time : ndarray, shape (n,)
    event : ndarray of int, shape (n,)
    cate : ndarray, shape (n,)
        Only with ``with_effect``.
    """
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, p)) if X is None else X
    n = len(X)
    W = rng.binomial(1, 0.5, n).astype(float)
    failure = np.minimum(rng.exponential(size=n) * X[:, 0] + W, horizon)
    censor = 2 * rng.uniform(size=n)
    out = (X, W, np.minimum(failure, censor), (failure <= censor).astype(int))
    if not with_effect:
        return out
    eps = np.random.default_rng(seed + 1).exponential(size=4000)
    cate = np.array([np.mean(np.minimum(eps * x + 1, horizon) - np.minimum(eps * x, horizon)) for x in X[:, 0]])
    return out + (cate,)


def fit_causal_survival(params, X, W, time, event, comm=None, **overrides):
    """``CausalSurvivalForest(**params, **overrides).fit(X, W, time, event, comm=comm)`` without its
    warnings (small test designs trip the overlap and censoring notices); one process by default."""
    import warnings

    from forest import CausalSurvivalForest
    from native.comm import SelfCommunicator

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return CausalSurvivalForest(**dict(params, **overrides)).fit(
            X, W, time, event, comm=SelfCommunicator() if comm is None else comm)

"""Data and a simulated crash shared by the checkpoint and warm-start tests."""
import numpy as np

#: Global rows of :func:`data`.
N = 600


class Crash(Exception):
    """Raised by :func:`crash_at`'s progress callback on every rank at the same tree."""


def crash_at(n_trees):
    """A ``progress`` callback that raises :class:`Crash` once ``n_trees`` are done.

    The estimators checkpoint a batch before reporting it, so the crash leaves the
    checkpoint of that batch; every rank raises at the same call, so no rank waits.
    """
    def progress(done, total):
        if done >= n_trees:
            raise Crash(f"crash after {done} of {total}")
    return progress


def data(n=N, seed=0):
    """Features with missing values, a binary treatment and an outcome with a known effect.

    Returns
    -------
    X : ndarray, shape (n, 4)
    t : ndarray, shape (n,)
    y : ndarray, shape (n,)
    """
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    X[rng.uniform(size=n) < 0.05, 2] = np.nan
    t = (rng.uniform(size=n) < 0.5).astype(float)
    y = X[:, 0] + t * (1.0 + (X[:, 1] > 0)) + 0.5 * rng.normal(size=n)
    return X, t, y

"""Counter-based random numbers keyed by (seed, stream, global row id).

Every random choice that touches rows (the binning sample, bagging, subsampling,
honesty halves) is a pure function of the global row id, so it does not depend on
how rows are split across ranks: ``mpirun -np 8`` draws what ``-np 1`` draws.

The mixer is SplitMix64's finaliser applied to a combination of the three keys;
it passes the usual avalanche tests and is cheap in vectorised NumPy.
"""
import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix64(z):
    """SplitMix64 finaliser on a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def hash64(seed, stream, ids):
    """Hash global ids to uint64.

    Parameters
    ----------
    seed : int
        User seed (``random_state``).
    stream : int
        Which decision this is (e.g. tree index times a small constant plus a
        purpose code), so different decisions are independent.
    ids : array-like of int, shape (n,)
        Global row ids (or any other counters).

    Returns
    -------
    ndarray of uint64, shape (n,)
    """
    ids = np.asarray(ids, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        key = _mix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * _GOLDEN + np.uint64(stream & 0xFFFFFFFFFFFFFFFF))
        return _mix64(ids * _GOLDEN + key)


def uniform(seed, stream, ids):
    """Uniform floats in [0, 1) keyed by global ids.

    Parameters
    ----------
    seed, stream : int
    ids : array-like of int, shape (n,)

    Returns
    -------
    ndarray of float64, shape (n,)
        Uses the top 53 bits, so every value is exactly representable.
    """
    return (hash64(seed, stream, ids) >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)

"""Counter-based random numbers keyed by (seed, stream, global row id).

Every random choice that touches rows (the binning sample, bagging, subsampling,
honesty halves, per-node feature draws) is a pure function of the global row id (or
node id), so it does not depend on how rows are split across ranks: ``mpirun -np 8``
draws what ``-np 1`` draws.

This module is the one home of the hash. The mixer is SplitMix64's finaliser
(:func:`mix64`) applied to ``id * golden + key``, with ``key = mix64(seed * golden +
stream)``. The scalar functions are Numba ``njit`` so kernels elsewhere
(:mod:`forest.engine.subsample`, :mod:`forest.engine.mtry`) inline them; :func:`hash64` and
:func:`uniform` are the array versions for NumPy callers; :func:`hash64_reference`
is the slow NumPy reference tests compare them with.
"""
import numpy as np

from .jit import kernel

GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
#: 2 ** -53: the top 53 bits of a hash as a float in [0, 1), every value exact.
TO_UNIT = 1.0 / 9007199254740992.0
_MASK64 = 0xFFFFFFFFFFFFFFFF


@kernel(inline="always")
def mix64(z):
    """SplitMix64 finaliser of one uint64 (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@kernel(inline="always")
def key_of(seed, stream):
    """Key of one (seed, stream) pair; both uint64 (callers wrap negative ints)."""
    return mix64(np.uint64(seed) * GOLDEN + np.uint64(stream))


@kernel(inline="always")
def hash_id(key, counter):
    """Hash of one counter (a global row id, a node key + feature, ...) under ``key``."""
    # Both cast: Numba promotes uint64 + int64 to float64, which would silently round.
    return mix64(np.uint64(counter) * GOLDEN + np.uint64(key))


@kernel(inline="always")
def unit_id(key, counter):
    """:func:`hash_id` as a float in [0, 1) from its top 53 bits."""
    return np.float64(hash_id(key, counter) >> np.uint64(11)) * TO_UNIT


@kernel
def _hash_array(key, ids, out):
    for i in range(ids.shape[0]):
        out[i] = hash_id(key, ids[i])


def stream_key(seed, stream):
    """:func:`key_of` from Python ints of any sign (wrapped to 64 bits), as ``np.uint64``."""
    return np.uint64(key_of(np.uint64(int(seed) & _MASK64), np.uint64(int(stream) & _MASK64)))


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
        Global row ids (or any other counters; uint64 counters are used as is).

    Returns
    -------
    ndarray of uint64, shape (n,)
    """
    ids = np.asarray(ids)
    ids = ids.astype(np.uint64) if ids.dtype != np.uint64 else ids
    ids = np.ascontiguousarray(ids.ravel())
    out = np.empty(len(ids), dtype=np.uint64)
    _hash_array(stream_key(seed, stream), ids, out)
    return out


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
    return (hash64(seed, stream, ids) >> np.uint64(11)).astype(np.float64) * TO_UNIT


def mix64_reference(z):
    """NumPy reference of :func:`mix64` on a uint64 array or scalar (caller silences overflow)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def hash64_reference(seed, stream, ids):
    """Slow NumPy reference of :func:`hash64` (vectorised wrapping uint64 arithmetic)."""
    ids = np.asarray(ids)
    ids = ids.astype(np.uint64) if ids.dtype != np.uint64 else ids
    with np.errstate(over="ignore"):
        key = mix64_reference(np.uint64(int(seed) & _MASK64) * GOLDEN + np.uint64(int(stream) & _MASK64))
        return mix64_reference(ids.ravel() * GOLDEN + key)

"""Stochastic rounding of gradients and hessians to small integers, packed one int64 per row.

Quantized boosting (LightGBM 4's quantized training) replaces each row's float
``(g, h)`` by integers ``(g_int, h_int)`` with ``g ~ g_int * scale_g`` and
``h ~ h_int * scale_h``: ``g_int = floor(g / scale_g + u)`` with ``u`` uniform in
[0, 1), so ``E[g_int] * scale_g = g`` (unbiased), and likewise ``h``. With
``levels`` gradient levels, ``scale_g = max |g| / (levels / 2)`` and
``scale_h = max h / levels`` (maxima over all rows of all ranks), so
``g_int in [-levels/2, levels/2]`` and ``h_int in [0, levels]``. A row of zero
gradient and hessian (sample weight 0) rounds to exactly 0.

The rounding noise ``u`` comes from :mod:`histogram.rowhash` keyed by (seed,
stream, global row id), so a row gets the same integers whatever the rank count.
One 64-bit hash serves both: its high 32 bits draw ``u`` of ``g``, its low 32 bits
``u`` of ``h``. With ``K`` outputs the counter is ``gid * K + k``.

Packing: ``code = g_int * 2**32 + h_int`` (``h_int >= 0``). Sums of codes are the
codes of the sums (``G * 2**32 + H``) as long as ``0 <= H < 2**32`` and
``-2**31 <= G < 2**31``: a histogram bin then costs ONE integer add per row
(:func:`histogram.cpu_kernels.build_int_histogram`) and :func:`unpack` recovers
``(G, H)`` exactly, negative ``G`` included.

This module owns the rounding rule, the packing and its inverse; :func:`quantize_reference`
is the slow NumPy reference the tests compare :func:`quantize` with.
"""
import numba
import numpy as np

from .jit import kernel
from .rowhash import hash64_reference, hash_id, stream_key

#: Bits of each packed field (the code is ``g * 2**FIELD_BITS + h``).
FIELD_BITS = 32
_LOW = np.int64((1 << FIELD_BITS) - 1)
#: 2 ** -32: a 32-bit half of a hash as a float in [0, 1).
_TO_UNIT32 = 1.0 / 4294967296.0
_PARALLEL_MIN_ROWS = 16384


def scales(max_abs_g, max_h, levels):
    """Per-channel scales ``[max|g_k| / (levels/2) ..., max h_k / levels ...]``, shape (2K,).

    A channel whose maximum is 0 (every row 0) gets scale 1 (all its integers are 0).
    """
    half = levels // 2
    s = np.concatenate([np.asarray(max_abs_g, dtype=np.float64) / half,
                        np.asarray(max_h, dtype=np.float64) / levels])
    return np.where(s > 0, s, 1.0)


@kernel
def _abs_max_rows(x, a, b, out):
    for j in range(x.shape[1]):
        out[j] = 0.0
    for i in range(a, b):
        for j in range(x.shape[1]):
            v = abs(x[i, j])
            if v > out[j]:
                out[j] = v


@kernel(parallel=True)
def _abs_max_parallel(x, out):
    n = x.shape[0]
    n_chunks = out.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        a = min(n, c * chunk)
        _abs_max_rows(x, a, min(n, a + chunk), out[c])


def column_abs_max(x):
    """Largest ``|x[:, j]|`` of each column (0 for no rows); float64, shape (C,).

    The scales' maxima, once per iteration over every training row: numpy's
    ``np.abs(x).max(axis=0)`` on an ``(n, 2)`` array takes ~35 ms at 900k rows (a
    temporary and a strided reduction); this pass reads ``x`` once, on every thread.

    Parameters
    ----------
    x : ndarray of float64, shape (n, C)
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    threads = numba.get_num_threads()
    if x.shape[0] < _PARALLEL_MIN_ROWS or threads == 1:
        out = np.empty((1, x.shape[1]))
        _abs_max_rows(x, 0, x.shape[0], out[0])
    else:
        out = np.empty((4 * threads, x.shape[1]))
        _abs_max_parallel(x, out)
    return out.max(axis=0)


@kernel
def _quantize_rows(channels, gids, key, inv, half, levels, out, a, b):
    k_out = out.shape[0]
    shift = half + 1
    for i in range(a, b):
        gid = gids[i]
        for k in range(k_out):
            z = hash_id(key, gid * k_out + k)
            # 32-bit halves through int64: uint64 -> float conversion is a slow
            # branchy sequence on x86 without AVX-512.
            ug = np.float64(np.int64(z >> np.uint64(32))) * _TO_UNIT32
            uh = np.float64(np.int64(z & np.uint64(0xFFFFFFFF))) * _TO_UNIT32
            # floor as truncation of a positive number (x >= -half - 1 before the clamp).
            g = np.int64(channels[i, k] * inv[k] + ug + shift) - shift
            h = np.int64(channels[i, k_out + k] * inv[k_out + k] + uh + 1.0) - 1
            # Clamps only guard the last-ulp case x * (1 / s) > levels.
            g = min(max(g, -half), half)
            h = min(max(h, np.int64(0)), levels)
            out[k, i] = (g << FIELD_BITS) + h


@kernel(parallel=True)
def _quantize_parallel(channels, gids, key, inv, half, levels, out, n_chunks):
    n = channels.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        a = c * chunk
        _quantize_rows(channels, gids, key, inv, half, levels, out, a, min(n, a + chunk))


def _check(channels, gids, scale, levels):
    channels = np.ascontiguousarray(channels, dtype=np.float64)
    gids = np.ascontiguousarray(gids, dtype=np.int64)
    scale = np.ascontiguousarray(scale, dtype=np.float64)
    if channels.ndim != 2 or channels.shape[1] % 2 or gids.shape != (channels.shape[0],) \
            or scale.shape != (channels.shape[1],):
        raise ValueError(f"quantize needs channels (n, 2K), gids (n,) and scale (2K,); got {channels.shape}, "
                         f"{gids.shape}, {scale.shape}")
    if not (isinstance(levels, (int, np.integer)) and levels >= 2 and levels % 2 == 0):
        raise ValueError(f"levels must be an even int >= 2, got {levels!r}")
    if not np.all(scale > 0):
        raise ValueError("scales must be > 0")
    return channels, gids, scale


def quantize(channels, gids, seed, stream, scale, levels, out=None):
    """Stochastically rounded, packed codes of every row and output.

    Parameters
    ----------
    channels : ndarray of float64, shape (n, 2K)
        ``[g_0 .. g_{K-1}, h_0 .. h_{K-1}]`` per row (:class:`forest.criteria.basic.NewtonCriterion`).
    gids : ndarray of int64, shape (n,)
        Global row ids (the noise's counters).
    seed, stream : int
        Keys of the noise (:func:`histogram.rowhash.stream_key`); the caller puts the
        boosting iteration into ``stream``.
    scale : ndarray of float64, shape (2K,)
        From :func:`scales` (the same on every rank).
    levels : int
        Even number of gradient levels.
    out : ndarray of int64, shape (K, n), optional

    Returns
    -------
    ndarray of int64, shape (K, n)
        ``g_int * 2**32 + h_int``; row-contiguous per output (one histogram pass each).
    """
    channels, gids, scale = _check(channels, gids, scale, levels)
    k = channels.shape[1] // 2
    if out is None:
        out = np.empty((k, channels.shape[0]), dtype=np.int64)
    elif out.shape != (k, channels.shape[0]) or out.dtype != np.int64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous int64 of shape {(k, channels.shape[0])}")
    key, inv = stream_key(seed, stream), 1.0 / scale
    n = channels.shape[0]
    threads = numba.get_num_threads()
    if n < _PARALLEL_MIN_ROWS or threads == 1:
        _quantize_rows(channels, gids, key, inv, np.int64(levels // 2), np.int64(levels), out, 0, n)
    else:
        _quantize_parallel(channels, gids, key, inv, np.int64(levels // 2), np.int64(levels), out, 4 * threads)
    return out


def quantize_reference(channels, gids, seed, stream, scale, levels):
    """Slow NumPy reference of :func:`quantize` (same integers, bit for bit)."""
    channels, gids, scale = _check(channels, gids, scale, levels)
    k = channels.shape[1] // 2
    out = np.empty((k, channels.shape[0]), dtype=np.int64)
    inv = 1.0 / scale
    for j in range(k):
        z = hash64_reference(seed, stream, gids * k + j)
        ug = (z >> np.uint64(32)).astype(np.float64) * _TO_UNIT32
        uh = (z & np.uint64(0xFFFFFFFF)).astype(np.float64) * _TO_UNIT32
        g = np.clip(np.floor(channels[:, j] * inv[j] + ug), -(levels // 2), levels // 2).astype(np.int64)
        h = np.clip(np.floor(channels[:, k + j] * inv[k + j] + uh), 0, levels).astype(np.int64)
        out[j] = pack(g, h)
    return out


@kernel(inline="always")
def split_code(q):
    """``(g, h)`` of one packed int64 code (compiled :func:`unpack`)."""
    h = q & _LOW
    return (q - h) >> FIELD_BITS, h


def pack(g, h):
    """Packed codes ``g * 2**32 + h`` (int64) of integer fields (``0 <= h < 2**32``)."""
    return (np.asarray(g, dtype=np.int64) << FIELD_BITS) + np.asarray(h, dtype=np.int64)


def unpack(codes):
    """``(G, H)`` int64 arrays of packed sums (inverse of :func:`pack` while the fields fit)."""
    codes = np.asarray(codes, dtype=np.int64)
    h = codes & _LOW
    return (codes - h) >> FIELD_BITS, h

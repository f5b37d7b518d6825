"""Fingerprints of a fit's input that do not depend on how rows are spread over ranks.

This module owns the answer to "is this the data the checkpoint was written for?"
(:mod:`forest.io.checkpoint`) and "were these forests centred on the same nuisance
estimates?" (:mod:`forest.io.merge`).

A row's hash mixes its global row id with every value the fit sees for it (the uint8
feature codes, then each target / weight column as its float64 bit pattern), using
the SplitMix64 mixer of :mod:`histogram.rowhash`. The content hash of the data is the
sum of the row hashes modulo ``2**64``: a sum does not care about order, so every
rank adds its own rows, one allreduce combines the ranks, and ``mpirun -np 3`` gets
the value ``-np 1`` gets. The sum is carried as two exact int64 sums of the 32-bit
halves, so no addition ever overflows (up to ``2**31`` rows). Because the row id is
part of each row's hash, moving a row to another position changes the sum as surely
as changing a value.

Values are hashed after the estimator's own conversions (codes rather than raw
features, targets as float64), so the fingerprint answers "would this fit grow the
same trees", which is what a checkpoint needs. The bin edges are digested separately
(:func:`mapper_digest`): identical codes under different edges give different float
thresholds.
"""
import hashlib

import numpy as np

from histogram.dtypes import codes_dtype
from histogram.jit import kernel
from histogram.rowhash import GOLDEN, hash64_reference, hash_id, mix64, mix64_reference, stream_key
from native import collectives as col

from forest._validation import as_columns

#: rowhash stream of the fingerprint's per-row keys ("FPRT").
FINGERPRINT_STREAM = 0x46505254
_MASK32 = np.uint64(0xFFFFFFFF)
_CANONICAL_NAN = np.float64(np.nan).view(np.uint64)


@kernel
def _start(key, gids, out):
    for i in range(gids.shape[0]):
        out[i] = hash_id(key, gids[i])


@kernel
def _mix_codes(h, codes):
    # Feature-major codes (n_features, n): one pass per feature keeps the reads sequential.
    for f in range(codes.shape[0]):
        for i in range(codes.shape[1]):
            h[i] = mix64(h[i] * GOLDEN + np.uint64(codes[f, i]))


@kernel
def _mix_columns(h, bits):
    # Row-major (n, k) uint64 bit patterns of float64 values.
    for i in range(bits.shape[0]):
        z = h[i]
        for j in range(bits.shape[1]):
            z = mix64(z * GOLDEN + bits[i, j])
        h[i] = z


def _column_bits(a):
    """float64 bit patterns of ``a`` as (n, k) uint64; -0.0 -> 0.0 and every NaN -> one NaN."""
    a = as_columns(a) + 0.0                  # -0.0 + 0.0 == +0.0: one zero
    bits = np.ascontiguousarray(a).view(np.uint64).copy()
    bits[np.isnan(a)] = _CANONICAL_NAN
    return bits


def row_hashes(gids, codes=None, columns=()):
    """Hash of each row's global id and values.

    Parameters
    ----------
    gids : ndarray of int, shape (n,)
        Global row ids.
    codes : ndarray of uint8 or uint16, shape (n_features, n), optional
        Feature codes (feature-major).
    columns : sequence of array-like, each shape (n,) or (n, k)
        Further per-row values (targets, weights), hashed as float64 bit patterns.

    Returns
    -------
    ndarray of uint64, shape (n,)
    """
    gids = np.ascontiguousarray(np.asarray(gids).astype(np.uint64, copy=False))
    n = len(gids)
    h = np.empty(n, dtype=np.uint64)
    _start(stream_key(0, FINGERPRINT_STREAM), gids, h)
    if codes is not None:
        # uint16 codes (wide categorical codes) hash by value, as uint8 codes do
        codes = np.ascontiguousarray(codes, dtype=codes_dtype(codes))
        if codes.ndim != 2 or codes.shape[1] != n:
            raise ValueError(f"codes must have shape (n_features, {n}), got {codes.shape}")
        _mix_codes(h, codes)
    for a in columns:
        _mix_columns(h, _column_bits(a))
    return h


def row_hashes_reference(gids, codes=None, columns=()):
    """Slow NumPy reference of :func:`row_hashes` (vectorised wrapping uint64 arithmetic)."""
    h = hash64_reference(0, FINGERPRINT_STREAM, gids)
    with np.errstate(over="ignore"):
        if codes is not None:
            for row in np.asarray(codes).astype(codes_dtype(codes)):
                h = mix64_reference(h * GOLDEN + row.astype(np.uint64))
        for a in columns:
            a = as_columns(a)
            for j in range(a.shape[1]):
                v = a[:, j] + 0.0
                bits = v.view(np.uint64).copy()
                bits[np.isnan(v)] = _CANONICAL_NAN
                h = mix64_reference(h * GOLDEN + bits)
    return h


def content_hash(comm, gids, codes=None, columns=()):
    """Order-free sum of :func:`row_hashes` over the rows of all ranks (collective).

    Parameters
    ----------
    comm : native.comm.Communicator
    gids, codes, columns
        As :func:`row_hashes`, for this rank's rows.

    Returns
    -------
    str
        16 hex digits, identical on every rank and for every rank count.
    """
    h = row_hashes(gids, codes, columns)
    halves = np.array([(h & _MASK32).sum(dtype=np.int64), (h >> np.uint64(32)).sum(dtype=np.int64)],
                      dtype=np.int64)
    if comm.size > 1:
        halves = col.allreduce(comm, halves)
    total = (int(halves[0]) + (int(halves[1]) << 32)) & 0xFFFFFFFFFFFFFFFF
    return f"{total:016x}"


#: BinMapper state that says how it was fitted, not what it does: two mappers that
#: differ only here bin every value alike.
_FIT_SETTINGS = ("random_state", "subsample", "n_samples_fit_")


def mapper_digest(mapper):
    """SHA-256 (hex) of what a fitted BinMapper does: its edges and bin counts.

    The seed and size of the sample it was fitted on are left out: on data smaller
    than the sample, mappers of different seeds are the same mapper.
    """
    digest = hashlib.sha256()
    state = mapper.get_state()
    for key in sorted(set(state) - set(_FIT_SETTINGS)):
        value = state[key]
        digest.update(key.encode())
        if isinstance(value, np.ndarray):
            digest.update(value.dtype.str.encode() + repr(value.shape).encode())
            digest.update(np.ascontiguousarray(value).tobytes())
        else:
            digest.update(repr(value).encode())
    return digest.hexdigest()


def data_fingerprint(comm, gids, n_global, codes, mapper, columns, feature_names=None):
    """What a checkpoint records about its data, identical on every rank (collective).

    Parameters
    ----------
    comm : native.comm.Communicator
    gids : ndarray of int64, shape (n_local,)
    n_global : int
    codes : ndarray of uint8, shape (n_features, n_local)
    mapper : histogram.binning.BinMapper
    columns : dict of str -> array-like, each (n_local,) or (n_local, k)
        Targets, weights and other per-row inputs, by name.
    feature_names : sequence of str, optional

    Returns
    -------
    dict
        ``rows``, ``features``, ``feature_names`` (list or None), ``columns``
        (name -> width), ``bins`` (:func:`mapper_digest`) and ``content``
        (:func:`content_hash`).
    """
    widths = {name: int(as_columns(a).shape[1]) for name, a in columns.items()}
    return {
        "rows": int(n_global),
        "features": int(codes.shape[0]),
        "feature_names": None if feature_names is None else [str(f) for f in feature_names],
        "columns": widths,
        "bins": mapper_digest(mapper),
        "content": content_hash(comm, gids, codes, [columns[k] for k in columns]),
    }


def describe_difference(old, new):
    """One phrase saying how two :func:`data_fingerprint` results differ (None if equal)."""
    def shape(fp):
        return f"{fp['rows']} rows x {fp['features']} features"

    if old == new:
        return None
    if (old["rows"], old["features"]) != (new["rows"], new["features"]):
        return f"{shape(old)} there, {shape(new)} here"
    if old["feature_names"] != new["feature_names"]:
        return f"feature columns {old['feature_names']} there, {new['feature_names']} here"
    if old["columns"] != new["columns"]:
        return f"columns {sorted(old['columns'].items())} there, {sorted(new['columns'].items())} here"
    if old["bins"] != new["bins"]:
        return f"same shape ({shape(new)}) but different bin edges"
    return f"same shape ({shape(new)}) but different values (content hash {old['content']} there, " \
           f"{new['content']} here)"

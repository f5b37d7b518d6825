"""Tensor fusion: sum many arrays over ranks with few large allreduces.

Reducing the histograms of many tree nodes one by one pays the per-message latency
once per node; packing them into one buffer pays it once (the idea of Horovod's
tensor fusion). :func:`fused_allreduce` packs the arrays of each dtype, in the
order given, into buffers of at most ``threshold_bytes`` (an array larger than the
threshold travels alone), reduces each buffer with one
:func:`native.collectives.allreduce`, and unpacks. Every rank must pass arrays of
the same shapes and dtypes in the same order.
"""
import numpy as np

from . import collectives as col

#: Default fusion buffer size (Horovod's default is also 64 MiB).
DEFAULT_THRESHOLD_BYTES = 64 * 2**20


def plan_fusion(arrays, threshold_bytes=DEFAULT_THRESHOLD_BYTES):
    """Group arrays into fusion buckets, one dtype per bucket.

    Arrays keep their relative order inside each dtype; a bucket is closed when the
    next array of its dtype would push it past ``threshold_bytes``.

    Parameters
    ----------
    arrays : sequence of ndarray
    threshold_bytes : int
        Largest fused buffer, in bytes (> 0).

    Returns
    -------
    list of list of int
        Indices into ``arrays``; each inner list is one bucket of a single dtype
        whose total size is ``<= threshold_bytes`` unless it holds one array only.
        Closed buckets come first in the order they closed, then the open ones in
        order of their dtype's first appearance (the same on every rank).
    """
    if threshold_bytes <= 0:
        raise ValueError(f"threshold_bytes must be > 0, got {threshold_bytes}")
    closed, open_ = [], {}  # open_: dtype -> [indices, bytes]; dicts keep insertion order
    for i, a in enumerate(arrays):
        bucket = open_.get(a.dtype)
        if bucket is not None and bucket[1] + a.nbytes > threshold_bytes:
            closed.append(bucket[0])
            bucket = None
        if bucket is None:
            bucket = open_[a.dtype] = [[], 0]  # keeps the dtype's place in the order
        bucket[0].append(i)
        bucket[1] += a.nbytes
    return closed + [b[0] for b in open_.values()]


def fused_allreduce(comm, arrays, threshold_bytes=DEFAULT_THRESHOLD_BYTES,
                    algorithm="auto", inplace=False, check=None):
    """Sum every array of ``arrays`` over ranks, fusing them into few messages.

    Parameters
    ----------
    comm : native.comm.Communicator
    arrays : sequence of ndarray
        Any shapes; float32, float64, int32 or int64. Identical shapes and dtypes
        on every rank, in the same order.
    threshold_bytes : int
        Fusion buffer size; arrays are packed until the next would exceed it.
    algorithm : str
        Passed to :func:`native.collectives.allreduce` for each fused buffer.
    inplace : bool
        Write the sums back into ``arrays`` (which must then be writeable) instead
        of returning new arrays.
    check : bool, optional
        Check mode for each fused allreduce.

    Returns
    -------
    list of ndarray
        The sums, shapes and dtypes of the inputs (the input arrays themselves when
        ``inplace``), bitwise identical on every rank.
    """
    arrays = [np.asarray(a) for a in arrays]
    results = [None] * len(arrays)
    for bucket in plan_fusion(arrays, threshold_bytes):
        sizes = [arrays[i].size for i in bucket]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        packed = np.empty(int(offsets[-1]), dtype=arrays[bucket[0]].dtype)
        for j, i in enumerate(bucket):
            packed[offsets[j]:offsets[j + 1]] = arrays[i].reshape(-1)
        col.allreduce(comm, packed, algorithm=algorithm, out=packed, check=check)
        for j, i in enumerate(bucket):
            piece = packed[offsets[j]:offsets[j + 1]].reshape(arrays[i].shape)
            if inplace:
                arrays[i][...] = piece
                results[i] = arrays[i]
            else:
                results[i] = piece
    return results

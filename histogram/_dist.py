"""The two collectives that bin fitting needs, behind one seam.

Bin fitting gathers a hashed row sample from every rank. The real collectives live in
:mod:`native.collectives`; this module calls them when they exist and otherwise falls
back to a plain ring all-gather written against the :class:`native.comm.Communicator`
point-to-point interface, so ``histogram`` works before and after ``native`` grows.
"""
import numpy as np

_TAG = 7301  # distinct from tags the native collectives use for their own rings


def _native_allgatherv():
    try:
        from native import collectives
    except ImportError:
        return None
    return getattr(collectives, "allgatherv", None)


def allgatherv(comm, arr):
    """Concatenate every rank's array along axis 0, in rank order.

    Parameters
    ----------
    comm : native.comm.Communicator
    arr : ndarray, shape (n_local, ...)
        Trailing shape and dtype must agree on all ranks.

    Returns
    -------
    ndarray, shape (sum of n_local over ranks, ...)
        Identical on every rank.
    """
    arr = np.ascontiguousarray(arr)
    if comm.size == 1:
        return arr.copy()
    native = _native_allgatherv()
    if native is not None:
        return np.asarray(native(comm, arr))
    return _ring_allgatherv(comm, arr)


def _ring_allgatherv(comm, arr):
    """Fallback all-gather: sizes first, then p-1 ring steps passing blocks along."""
    p, r = comm.size, comm.rank
    right, left = (r + 1) % p, (r - 1) % p
    sizes = np.zeros(p, dtype=np.int64)
    sizes[r] = arr.shape[0]
    # Ring all-gather of the row counts (one int per rank).
    for step in range(p - 1):
        send_idx = (r - step) % p
        recv_idx = (r - step - 1) % p
        got = np.empty(1, dtype=np.int64)
        comm.sendrecv(sizes[send_idx:send_idx + 1].copy(), right, got, left, tag=_TAG)
        sizes[recv_idx] = got[0]
    starts = np.concatenate(([0], np.cumsum(sizes)))
    out = np.empty((int(starts[-1]),) + arr.shape[1:], dtype=arr.dtype)
    out[starts[r]:starts[r + 1]] = arr
    for step in range(p - 1):
        send_idx = (r - step) % p
        recv_idx = (r - step - 1) % p
        recv = np.empty((int(sizes[recv_idx]),) + arr.shape[1:], dtype=arr.dtype)
        comm.sendrecv(np.ascontiguousarray(out[starts[send_idx]:starts[send_idx + 1]]),
                      right, recv, left, tag=_TAG + 1)
        out[starts[recv_idx]:starts[recv_idx + 1]] = recv
    return out

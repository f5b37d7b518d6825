"""Ring reduce-scatter and ring allgather (bandwidth-optimal, ``p - 1`` steps each).

With ``p`` blocks and rank ``r`` sending to ``r + 1``: in reduce-scatter step ``s``,
rank ``r`` forwards its partial sum of block ``r - s - 1`` and adds its own data to
the partial of block ``r - s - 2`` it receives. After ``p - 1`` steps rank ``r`` holds
the complete sum of block ``r``, accumulated along one chain starting at rank
``r + 1``; no other rank ever completes that block, so when the allgather then
copies it around the ring every rank ends with the owner's bits.
Each rank sends ``(p - 1) / p`` of the buffer per phase.
"""
import numpy as np

from ..transport import TAG_RING_ALLGATHER, TAG_RING_REDUCE_SCATTER, exchange


def ring_reduce_scatter(comm, acc, bounds):
    """Sum ``acc`` over ranks so that each rank's own block ends complete.

    Parameters
    ----------
    comm : native.comm.Communicator
    acc : ndarray, shape (n,)
        Contiguous; this rank's contribution on entry. On return the slice
        ``acc[bounds[rank]:bounds[rank + 1]]`` holds the sum over ranks; the rest of
        ``acc`` holds partial sums and must be treated as scratch.
    bounds : ndarray of int64, shape (size + 1,)
        Block boundaries (see :func:`native.blocks.block_bounds`).
    """
    p, r = comm.size, comm.rank
    if p == 1:
        return acc
    right, left = (r + 1) % p, (r - 1) % p
    sizes = np.diff(bounds)
    tmp = np.empty(int(sizes.max()), dtype=acc.dtype)
    for s in range(p - 1):
        sb = (r - s - 1) % p
        rb = (r - s - 2) % p
        lo, hi = bounds[rb], bounds[rb + 1]
        incoming = tmp[: hi - lo]
        exchange(comm, acc[bounds[sb]:bounds[sb + 1]], right, incoming, left,
                 TAG_RING_REDUCE_SCATTER)
        np.add(acc[lo:hi], incoming, out=acc[lo:hi])
    return acc


def ring_allgather(comm, buf, bounds, origin=0):
    """Complete ``buf`` from each rank's own block.

    Parameters
    ----------
    comm : native.comm.Communicator
    buf : ndarray, shape (n,)
        Contiguous; this rank's block (per ``bounds``) is valid on entry, the whole
        array is on return (blocks are copied verbatim, never recomputed).
    bounds : ndarray of int64, shape (size + 1,)
    origin : int
        Rank that owns block 0: rank ``r`` owns block ``(r - origin) mod size``
        (a broadcast's blocks are numbered from its root).
    """
    p, r = comm.size, comm.rank
    if p == 1:
        return buf
    right, left = (r + 1) % p, (r - 1) % p
    me = (r - origin) % p
    for s in range(p - 1):
        sb = (me - s) % p
        rb = (me - s - 1) % p
        exchange(comm, buf[bounds[sb]:bounds[sb + 1]], right,
                 buf[bounds[rb]:bounds[rb + 1]], left, TAG_RING_ALLGATHER)
    return buf

"""Binomial-tree broadcast: ``ceil(log2 p)`` rounds, the root's bytes copied verbatim.

Ranks are renumbered relative to the root (``v = (rank - root) mod p``). Rank ``v``
receives from ``v`` minus its lowest set bit, then forwards to ``v + 2**j`` for every
``2**j`` below that bit, largest first.
"""
from ..transport import TAG_BCAST, recv, send


def binomial_bcast(comm, buf, root):
    """Broadcast ``buf`` from ``root`` in place.

    Parameters
    ----------
    comm : native.comm.Communicator
    buf : ndarray, shape (n,)
        Contiguous; read on the root, overwritten elsewhere.
    root : int
    """
    p, r = comm.size, comm.rank
    v = (r - root) % p
    mask = 1
    while mask < p:
        if v & mask:
            recv(comm, buf, (v - mask + root) % p, TAG_BCAST)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if v + mask < p:
            send(comm, buf, (v + mask + root) % p, TAG_BCAST)
        mask >>= 1
    return buf

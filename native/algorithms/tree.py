"""Broadcasts: binomial tree (latency) and scatter + ring allgather (bandwidth).

Ranks are renumbered relative to the root (``v = (rank - root) mod p``). In the
binomial tree rank ``v`` receives from ``v`` minus its lowest set bit, then forwards
to ``v + 2**j`` for every ``2**j`` below that bit, largest first: ``ceil(log2 p)``
rounds of the whole buffer. For large buffers the same tree instead scatters: each
rank receives only the blocks of its subtree (block ``v`` belongs to relative rank
``v``), and a ring allgather completes every rank (van de Geijn): about ``2 n`` bytes
per rank instead of ``n log2 p``. Either way the root's bytes are copied verbatim.
"""
from ..blocks import block_bounds
from ..transport import TAG_BCAST, recv, send
from .ring import ring_allgather


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


def scatter_allgather_bcast(comm, buf, root):
    """Broadcast ``buf`` from ``root`` in place by binomial scatter + ring allgather.

    Parameters
    ----------
    comm : native.comm.Communicator
    buf : ndarray, shape (n,)
        Contiguous; read on the root, overwritten elsewhere.
    root : int
    """
    p, r = comm.size, comm.rank
    if p == 1:
        return buf
    bounds = block_bounds(buf.size, p)
    v = (r - root) % p
    mask = 1
    while mask < p:
        if v & mask:
            # my subtree is relative ranks v .. v + mask - 1: receive their blocks
            recv(comm, buf[bounds[v]:bounds[min(v + mask, p)]], (v - mask + root) % p,
                 TAG_BCAST)
            break
        mask <<= 1
    mask >>= 1
    while mask > 0:
        if v + mask < p:
            child = v + mask
            send(comm, buf[bounds[child]:bounds[min(child + mask, p)]],
                 (child + root) % p, TAG_BCAST)
        mask >>= 1
    return ring_allgather(comm, buf, bounds, origin=root)

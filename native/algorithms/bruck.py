"""Bruck's allgather: ``ceil(log2 p)`` messages for any ``p`` (latency-optimal).

At step ``k = 1, 2, 4, ...`` rank ``r`` sends the first ``min(k, p - k)`` blocks it has
collected to ``r - k`` and receives as many from ``r + k``, appending them. Its buffer
then lists the blocks of ranks ``r, r + 1, ...`` which a final rotation puts in rank
order. Total bytes sent per rank: ``(p - 1)`` blocks, like the ring.
"""
import numpy as np

from ..transport import TAG_BRUCK, exchange


def bruck_allgather(comm, block, out, tag=TAG_BRUCK, deadline=None):
    """Gather equal blocks from every rank into ``out`` in rank order.

    Parameters
    ----------
    comm : native.comm.Communicator
    block : ndarray, shape (m,)
        This rank's block (contiguous).
    out : ndarray, shape (size * m,)
        Receives block ``i`` of rank ``i`` at ``out[i*m:(i+1)*m]``.
    tag : int
        Message tag (check mode's handshake uses its own).
    deadline : float, optional
        Passed to :func:`native.transport.exchange` (check mode's handshake).
    """
    p, r = comm.size, comm.rank
    m = block.size
    work = np.empty(p * m, dtype=block.dtype)
    work[:m] = block
    k = 1
    while k < p:
        cnt = min(k, p - k)
        exchange(comm, work[: cnt * m], (r - k) % p, work[k * m:(k + cnt) * m],
                 (r + k) % p, tag, deadline=deadline)
        k *= 2
    out.reshape(p, m)[...] = np.roll(work.reshape(p, m), r, axis=0)
    return out

"""The counted point-to-point layer that every algorithm in :mod:`native` sends through.

Keeping one choke point means byte counting (:data:`native.stats.STATS`) cannot be
forgotten by a new algorithm, and message tags live in one table so that different
collectives (and the check-mode handshake) can never consume each other's messages.
"""
import time

from .stats import STATS

# One tag per message family. Within a family messages between one pair of ranks are
# matched in order (MPI guarantees non-overtaking for the same source, tag and
# communicator), so a tag per family is enough.
TAG_CHECK = 901
TAG_RING_REDUCE_SCATTER = 911
TAG_RING_ALLGATHER = 912
TAG_HALVING = 913
TAG_DOUBLING = 914
TAG_FOLD = 915
TAG_BRUCK = 916
TAG_BCAST = 917
TAG_RD_ALLREDUCE = 918
TAG_ALLTOALLV = 919
TAG_DIRECT = 920
TAG_NODE_REDUCE = 921
TAG_NODE_SCATTER = 922
# The socket transport's barrier (MPI has its own; 931/932 are the watchdog's).
TAG_BARRIER = 941


class ExchangeTimeout(RuntimeError):
    """A deadline-bounded exchange did not complete: the peer never arrived."""

    def __init__(self, peer, waited):
        super().__init__(f"no matching message from rank {peer} after {waited:.1f} s")
        self.peer = peer
        self.waited = waited


_ORPHANED_SENDS = []


def exchange(comm, sendbuf, dest, recvbuf, source, tag, deadline=None):
    """Send ``sendbuf`` to ``dest`` while receiving ``recvbuf`` from ``source``.

    Parameters
    ----------
    comm : native.comm.Communicator
    sendbuf : ndarray, shape (m,)
        Contiguous; may be empty (a zero-length message still travels, so that both
        sides stay in step without agreeing on a special case).
    recvbuf : ndarray, shape (k,)
        Contiguous, written in place.
    deadline : float, optional
        ``time.monotonic()`` value after which to give up with
        :class:`ExchangeTimeout` (non-blocking calls polled with short sleeps; meant
        for tiny check-mode messages, where a peer that never comes means a hang).
    """
    STATS._record_send(sendbuf.nbytes)
    if deadline is None:
        comm.sendrecv(sendbuf, dest, recvbuf, source, tag)
        return recvbuf
    start = time.monotonic()
    requests = [comm.irecv(recvbuf, source, tag), comm.isend(sendbuf, dest, tag)]
    pause = 1e-5
    act = comm.activity  # polling is waiting too, for the watchdog
    if act is not None:
        act.token += 1
        act.peers = (source, dest)
    try:
        return _poll(comm, requests, sendbuf, recvbuf, source, start, deadline, pause)
    finally:
        if act is not None:
            act.peers = None


def _poll(comm, requests, sendbuf, recvbuf, source, start, deadline, pause):
    while not comm.test_all(requests):
        now = time.monotonic()
        if now > deadline:
            # The receive must not fill recvbuf after we return; the send may still be
            # pending, so its buffer is kept alive for the rest of the process.
            comm.cancel_recv(requests[0])
            _ORPHANED_SENDS.append((requests[1], sendbuf))
            raise ExchangeTimeout(source, now - start)
        time.sleep(pause)
        pause = min(2 * pause, 1e-3)
    return recvbuf


def send(comm, buf, dest, tag):
    """Counted blocking send of a contiguous array."""
    STATS._record_send(buf.nbytes)
    comm.send(buf, dest, tag)


def recv(comm, buf, source, tag):
    """Blocking receive into a contiguous array (nothing to count)."""
    comm.recv(buf, source, tag)
    return buf

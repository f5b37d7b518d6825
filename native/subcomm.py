"""A subset of a communicator's ranks, seen as a communicator of its own.

Hierarchical collectives run ordinary algorithms among the ranks of one node and among
the node leaders. Rather than creating MPI communicators (a collective call, and an
mpi4py object outside ``native.comm``), a :class:`SubCommunicator` renumbers a list of
parent ranks ``0 .. len - 1`` and forwards every point-to-point call to the parent.
It works over any communicator (MPI, threads). Message tags are shared with the
parent: the phases of a hierarchical collective run one after the other and each
completes all of its messages, and MPI matches messages between a pair of ranks with
the same tag in order, so phases can never take each other's messages.
"""
from .comm import Communicator


class SubCommunicator(Communicator):
    """Ranks ``ranks`` of ``parent``, renumbered ``0 .. len(ranks) - 1``.

    Parameters
    ----------
    parent : native.comm.Communicator
    ranks : sequence of int
        Parent ranks in the order of their new numbers; must include ``parent.rank``.
    """

    def __init__(self, parent, ranks):
        self.parent = parent
        self.ranks = tuple(int(r) for r in ranks)
        if parent.rank not in self.ranks:
            raise ValueError(f"rank {parent.rank} is not among {self.ranks}")
        self.rank = self.ranks.index(parent.rank)
        self.size = len(self.ranks)

    def send(self, buf, dest, tag=0):
        return self.parent.send(buf, self.ranks[dest], tag)

    def recv(self, buf, source, tag=0):
        return self.parent.recv(buf, self.ranks[source], tag)

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        return self.parent.sendrecv(sendbuf, self.ranks[dest], recvbuf, self.ranks[source], tag)

    def isend(self, buf, dest, tag=0):
        return self.parent.isend(buf, self.ranks[dest], tag)

    def irecv(self, buf, source, tag=0):
        return self.parent.irecv(buf, self.ranks[source], tag)

    def test_all(self, requests):
        return self.parent.test_all(requests)

    def cancel_recv(self, request):
        return self.parent.cancel_recv(request)

    def parent_rank(self, rank):
        """Rank of sub-rank ``rank`` in the parent (for messages naming a peer)."""
        return self.ranks[rank]

    def barrier(self):
        raise NotImplementedError("SubCommunicator has no barrier; use the parent's")

    def abort(self, message, code=1):
        return self.parent.abort(message, code)

    def node_keys(self):
        keys = self.parent.node_keys()
        return [keys[r] for r in self.ranks]

"""Which ranks share a node: the layout hierarchical collectives and the cost model use.

A node is a set of ranks that share memory (``MPI_Comm_split_type(COMM_TYPE_SHARED)``,
asked once by :class:`native.comm.MPICommunicator`). Messages inside a node are
memory copies; messages between nodes cross the network, whose links are slower and
shared by all ranks of a node. :mod:`native.algorithms.hierarchical` adds inside each
node first, so only one buffer per node crosses the network.

Pseudo-nodes
    ``HISTFOREST_RANKS_PER_NODE=k`` cuts each shared-memory node into groups of ``k``
    consecutive ranks (the last group may be smaller), so that one machine can play a
    cluster of several nodes: ``mpirun -np 4`` with ``k = 2`` is two nodes of two
    ranks. Every rank must see the same value (``mpirun`` forwards the environment).
    The collectives then treat the groups exactly as real nodes (same algorithms,
    same summation order); only the cost model's inter-node constants are fiction.

Nodes are numbered in the order of their lowest rank; a node's *leader* is its lowest
rank. :func:`topology` caches the layout on the communicator; :func:`use` replaces it
(tests, experiments).
"""
import contextlib

import numpy as np

from . import order
from .settings import positive_number

ENV_RANKS_PER_NODE = "HISTFOREST_RANKS_PER_NODE"


class Topology:
    """The node layout of a communicator, identical on every rank.

    Parameters
    ----------
    node_keys : array-like of int, shape (p,)
        Any label per rank; ranks with equal labels share a node.
    rank : int
        This process's rank.

    Attributes
    ----------
    size, rank : int
    nodes : tuple of tuple of int
        Ranks of each node (increasing), nodes in order of their lowest rank.
    node_of : ndarray of int64, shape (p,)
        Node index of each rank.
    leaders : tuple of int
        Lowest rank of each node.
    node, local_rank : int
        This rank's node and its position inside it.
    tree : int or tuple
        The canonical summation tree (:func:`native.order.canonical_tree`).
    flat_is_canonical : bool
        True when the pair tree over all ranks (what recursive doubling and halving
        compute) equals :attr:`tree`, so the flat tree algorithms may be chosen.
    """

    def __init__(self, node_keys, rank):
        keys = np.asarray(node_keys).reshape(-1)
        if keys.size == 0:
            raise ValueError("a topology needs at least one rank")
        self.size = int(keys.size)
        self.rank = int(rank)
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank {rank} outside 0..{self.size - 1}")
        first = {}
        for r, key in enumerate(keys.tolist()):
            first.setdefault(key, []).append(r)
        self.nodes = tuple(tuple(ranks) for ranks in sorted(first.values(), key=lambda rs: rs[0]))
        self.node_of = np.empty(self.size, dtype=np.int64)
        for j, ranks in enumerate(self.nodes):
            self.node_of[list(ranks)] = j
        self.leaders = tuple(ranks[0] for ranks in self.nodes)
        self.node = int(self.node_of[self.rank])
        self.local_rank = self.nodes[self.node].index(self.rank)
        self.tree = order.canonical_tree(self.nodes)
        self.flat_is_canonical = order.same_sum(self.tree, order.flat_tree(self.size))
        self._views = {}
        self.plans = {}  # "auto"'s choices on this layout (native.collectives)

    @property
    def n_nodes(self):
        return len(self.nodes)

    @property
    def key(self):
        """Hashable identity of the layout (for caches)."""
        return self.nodes

    @property
    def ranks_per_node(self):
        """Largest number of ranks on one node."""
        return max(len(n) for n in self.nodes)

    @classmethod
    def blocks(cls, size, ranks_per_node, rank=0):
        """Nodes of ``ranks_per_node`` consecutive ranks (the last may hold fewer)."""
        return cls(np.arange(size) // max(int(ranks_per_node), 1), rank)

    def node_comm(self, comm):
        """This rank's node as a communicator (a view of ``comm``; local ranks in order)."""
        return self._view(comm, ("node", self.node), self.nodes[self.node])

    def leader_comm(self, comm):
        """The node leaders as a communicator (a view of ``comm``); only leaders may use it."""
        return self._view(comm, ("leaders",), self.leaders)

    def _view(self, comm, name, ranks):
        from .subcomm import SubCommunicator

        view = self._views.get(name)
        if view is None or view.parent is not comm:
            view = self._views[name] = SubCommunicator(comm, ranks)
        return view

    def __repr__(self):
        sizes = [len(n) for n in self.nodes]
        return f"Topology({self.size} ranks on {self.n_nodes} node(s) of {sizes} ranks)"


def ranks_per_node_setting():
    """``HISTFOREST_RANKS_PER_NODE`` as an int, or None when unset."""
    return positive_number(ENV_RANKS_PER_NODE, None, kind=int)


def split_pseudo_nodes(node_keys, ranks_per_node):
    """Cut every node into groups of ``ranks_per_node`` consecutive member ranks.

    Parameters
    ----------
    node_keys : array-like of int, shape (p,)
    ranks_per_node : int or None
        ``None`` leaves the layout unchanged.

    Returns
    -------
    ndarray of int64, shape (p,)
        New labels (pseudo-node index, numbered from 0).
    """
    keys = np.asarray(node_keys).reshape(-1)
    if ranks_per_node is None:
        return keys.astype(np.int64)
    out = np.empty(keys.size, dtype=np.int64)
    label = 0
    seen = {}
    for r, key in enumerate(keys.tolist()):
        members = seen.setdefault(key, [])
        if len(members) % ranks_per_node == 0:
            members.append(label)
            label += 1
        else:
            members.append(members[-1])
        out[r] = members[-1]
    return out


def topology(comm):
    """The (cached) node layout of ``comm``, pseudo-nodes applied.

    Built once per communicator from ``comm.node_keys()`` (no communication: the
    MPI communicator asked MPI when it was created) and :data:`ENV_RANKS_PER_NODE`.

    Returns
    -------
    Topology
    """
    topo = getattr(comm, "_topology", None)
    if topo is None:
        keys = split_pseudo_nodes(comm.node_keys(), ranks_per_node_setting())
        topo = Topology(keys, comm.rank)
        comm._topology = topo
    return topo


@contextlib.contextmanager
def use(comm, layout):
    """Run a block with ``comm`` treated as having the node layout ``layout``.

    Parameters
    ----------
    comm : native.comm.Communicator
    layout : Topology or array-like of int, shape (p,)
        A topology, or a node label per rank. Every rank must pass the same layout.
    """
    if not isinstance(layout, Topology):
        layout = Topology(layout, comm.rank)
    if layout.size != comm.size or layout.rank != comm.rank:
        raise ValueError(f"layout of {layout.size} ranks (rank {layout.rank}) does not fit "
                         f"communicator of {comm.size} ranks (rank {comm.rank})")
    previous = getattr(comm, "_topology", None)
    comm._topology = layout
    try:
        yield layout
    finally:
        comm._topology = previous

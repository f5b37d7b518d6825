"""Node-aware (hierarchical) sums: add inside each node, then across one leader per node.

:func:`hierarchical_allreduce`
    1. inside each node, a tree reduction to the node's leader (its lowest rank) along
       the pair tree of the node's ranks (``ceil(log2 k)`` rounds of the whole buffer,
       memory copies);
    2. among the leaders, a flat allreduce (``"doubling"``, ``"rabenseifner"`` or
       ``"direct"``, all of which add the node sums by the pair tree over nodes): only
       these messages cross the network, one buffer's worth per node instead of one
       per rank;
    3. inside each node, a broadcast from the leader (copies).
:func:`hierarchical_reduce_scatter`
    1. as above; 2. a reduce-scatter among the leaders whose blocks are the nodes'
    ranges of rank blocks (``"halving"`` or ``"direct"``); 3. each leader sends every
    rank of its node its own block.

The sum is the canonical tree of :mod:`native.order` for the node layout, whatever the
leaders' algorithm, so it is bitwise equal to every flat algorithm ``"auto"`` may pick
on that layout.
"""
import numpy as np

from ..blocks import block_bounds
from ..order import pair_tree, schedule
from ..transport import TAG_NODE_REDUCE, TAG_NODE_SCATTER, recv, send
from .direct import direct_reduce_scatter
from .halving import (doubling_allreduce, halving_block_order, halving_reduce_scatter_blocks,
                      rabenseifner_allreduce)
from .ring import ring_allgather
from .tree import binomial_bcast, scatter_allgather_bcast

#: Algorithms the leaders may use: all add by the pair tree over the nodes.
LEADER_ALLREDUCE = ("doubling", "rabenseifner", "direct")
LEADER_REDUCE_SCATTER = ("halving", "direct")


def tree_reduce(comm, acc, tree, tag=TAG_NODE_REDUCE):
    """Sum ``acc`` over ``comm``'s ranks along ``tree``; the total ends on its lowest rank.

    Parameters
    ----------
    comm : native.comm.Communicator
    acc : ndarray, shape (n,)
        Contribution on entry; the total on rank ``min(leaves)`` on return, scratch
        elsewhere.
    tree : int or tuple
        Over ranks ``0 .. comm.size - 1``.
    """
    me = comm.rank
    tmp = None
    for dst, src in schedule(tree):
        if src == me:
            send(comm, acc, dst, tag)
            break
        if dst == me:
            if tmp is None:
                tmp = np.empty_like(acc)
            recv(comm, tmp, src, tag)
            np.add(acc, tmp, out=acc)
    return acc


def flat_allreduce(comm, acc, algorithm):
    """In-place allreduce by one of :data:`LEADER_ALLREDUCE` (pair-tree order)."""
    if comm.size == 1:
        return acc
    if algorithm == "doubling":
        return doubling_allreduce(comm, acc, np.add)
    if algorithm == "rabenseifner":
        return rabenseifner_allreduce(comm, acc)
    if algorithm == "direct":
        bounds = block_bounds(acc.size, comm.size)
        direct_reduce_scatter(comm, acc, bounds, pair_tree(range(comm.size)))
        return ring_allgather(comm, acc, bounds)
    raise ValueError(f"no leader allreduce {algorithm!r}; choose from {LEADER_ALLREDUCE}")


def node_bcast(comm, acc, algorithm):
    """Broadcast ``acc`` from the node leader (local rank 0) by ``algorithm``."""
    if comm.size > 1:
        run = binomial_bcast if algorithm == "binomial" else scatter_allgather_bcast
        run(comm, acc.view(np.uint8), 0)
    return acc


def hierarchical_allreduce(comm, acc, topo, leader_algorithm, bcast_algorithm="binomial"):
    """Sum ``acc`` over all ranks in place, node by node (see the module docstring).

    Parameters
    ----------
    comm : native.comm.Communicator
    acc : ndarray, shape (n,)
        Contiguous; contribution on entry, the sum on return (bitwise identical on
        every rank).
    topo : native.topology.Topology
        The node layout of ``comm``.
    leader_algorithm : {"doubling", "rabenseifner", "direct"}
    bcast_algorithm : {"binomial", "scatter_allgather"}
    """
    node = topo.node_comm(comm)
    if node.size > 1:
        tree_reduce(node, acc, pair_tree(range(node.size)))
    if topo.local_rank == 0 and topo.n_nodes > 1:
        flat_allreduce(topo.leader_comm(comm), acc, leader_algorithm)
    return node_bcast(node, acc, bcast_algorithm)


def hierarchical_block_order(topo, leader_algorithm):
    """Layout of the rank blocks that :func:`hierarchical_reduce_scatter` works on.

    The blocks of one node sit together (in local-rank order), so that each node's
    share is one contiguous range for the leaders' reduce-scatter; the nodes' ranges
    are in the order that algorithm wants (:func:`native.algorithms.halving.halving_block_order`
    for ``"halving"``, node order for ``"direct"``).

    Returns
    -------
    list of int
        A permutation of the ranks.
    """
    nodes = (halving_block_order(topo.n_nodes) if leader_algorithm == "halving"
             else range(topo.n_nodes))
    return [r for j in nodes for r in topo.nodes[j]]


def hierarchical_reduce_scatter(comm, acc, starts, stops, topo, leader_algorithm):
    """Reduce-scatter node by node (see the module docstring).

    Parameters
    ----------
    comm : native.comm.Communicator
    acc : ndarray, shape (n,)
        Contribution on entry, its rank blocks laid out in
        :func:`hierarchical_block_order`; on return ``acc[starts[rank]:stops[rank]]``
        is the complete sum of this rank's block (the rest is scratch).
    starts, stops : ndarray of int64, shape (size,)
        Where each rank's block lies in ``acc``.
    topo : native.topology.Topology
    leader_algorithm : {"halving", "direct"}
    """
    node = topo.node_comm(comm)
    if node.size > 1:
        tree_reduce(node, acc, pair_tree(range(node.size)))
    members = topo.nodes[topo.node]
    if topo.local_rank == 0:
        if topo.n_nodes > 1:
            leaders = topo.leader_comm(comm)
            n_starts = np.array([starts[n[0]] for n in topo.nodes], dtype=np.int64)
            n_stops = np.array([stops[n[-1]] for n in topo.nodes], dtype=np.int64)
            if leader_algorithm == "halving":
                halving_reduce_scatter_blocks(leaders, acc, n_starts, n_stops)
            elif leader_algorithm == "direct":
                # nodes' ranges lie in node order, back to back
                bounds = np.concatenate([n_starts, [n_stops[-1]]])
                direct_reduce_scatter(leaders, acc, bounds, pair_tree(range(topo.n_nodes)))
            else:
                raise ValueError(f"no leader reduce-scatter {leader_algorithm!r}; choose from "
                                 f"{LEADER_REDUCE_SCATTER}")
        for local, rank in enumerate(members[1:], start=1):
            send(node, acc[starts[rank]:stops[rank]], local, TAG_NODE_SCATTER)
    else:
        recv(node, acc[starts[comm.rank]:stops[comm.rank]], 0, TAG_NODE_SCATTER)
    return acc

"""The canonical summation order (native.order) and the node layout (native.topology)."""
import numpy as np
import pytest

from native import order
from native.topology import ENV_RANKS_PER_NODE, Topology, split_pseudo_nodes, topology, use
from native.comm import SelfCommunicator
from native_reference import canonical_sum, pair_sum


def contributions(p, m, seed=0):
    rng = np.random.default_rng([seed, p, m])
    # wide dynamic range: different trees give different bits
    return [rng.standard_normal(m) * 10.0 ** rng.uniform(-8, 8, m) for _ in range(p)]


def test_pair_tree_shapes():
    assert order.pair_tree([0]) == 0
    assert order.pair_tree([0, 1]) == (0, 1)
    assert order.pair_tree([0, 1, 2]) == ((0, 1), 2)
    assert order.pair_tree(range(4)) == ((0, 1), (2, 3))
    # p = 6: fold (0,1), (2,3), then four partial sums as a complete tree
    assert order.pair_tree(range(6)) == (((0, 1), (2, 3)), (4, 5))
    assert order.pair_tree(range(7)) == (((0, 1), (2, 3)), ((4, 5), 6))
    with pytest.raises(ValueError):
        order.pair_tree([])


@pytest.mark.parametrize("p", [1, 2, 3, 5, 6, 7, 8, 13, 16])
def test_tree_sum_equals_the_written_definition(p):
    parts = contributions(p, 257)
    got = order.tree_sum(np.stack(parts), order.flat_tree(p)).copy()
    assert got.tobytes() == pair_sum(parts).tobytes()


@pytest.mark.parametrize("node_of", [[0, 0, 1], [0, 1, 0, 1], [0, 0, 0, 1, 1, 1, 2],
                                     [2, 2, 0, 1, 1, 0, 0], [0, 1, 2, 3, 4]])
def test_canonical_tree_sum_equals_the_written_definition(node_of):
    p = len(node_of)
    parts = contributions(p, 301)
    topo = Topology(node_of, 0)
    got = order.tree_sum(np.stack(parts), topo.tree).copy()
    assert got.tobytes() == canonical_sum(parts, node_of).tobytes()


def leaves_of(tree):
    return leaves_of(tree[0]) + leaves_of(tree[1]) if isinstance(tree, tuple) else [tree]


def test_schedule_is_a_valid_distributed_reduction():
    for tree in (order.flat_tree(11), Topology([0, 1, 0, 1, 2, 2, 2, 0], 0).tree):
        steps = order.schedule(tree)
        leaves = leaves_of(tree)
        sent = set()
        for dst, src in steps:
            # a rank sends once, after all of its own additions, and never adds again
            assert src not in sent and dst not in sent
            sent.add(src)
        assert len(steps) == len(leaves) - 1
        assert order.root(tree) == 0 and 0 not in sent


def test_flat_tree_is_canonical_exactly_for_aligned_power_of_two_nodes():
    for k in (1, 2, 4, 8):
        for n_nodes in range(1, 10):
            assert Topology.blocks(k * n_nodes, k).flat_is_canonical, (k, n_nodes)
            # a smaller last node keeps it canonical only in special cases; equal ones always
    for k in (3, 5, 6):
        assert not Topology.blocks(4 * k, k).flat_is_canonical, k
    assert not Topology([0, 1, 0, 1], 0).flat_is_canonical  # round-robin placement
    assert Topology([0] * 7, 3).flat_is_canonical           # one node
    assert Topology(list(range(7)), 3).flat_is_canonical    # one rank per node
    # same_sum ignores the side of each addition, nothing else
    assert order.same_sum(((1, 0), 2), (2, (0, 1)))
    assert not order.same_sum(((0, 1), 2), (0, (1, 2)))


def test_topology_attributes_and_pseudo_nodes():
    topo = Topology([7, 3, 7, 3, 9], 3)
    assert topo.nodes == ((0, 2), (1, 3), (4,))
    assert topo.leaders == (0, 1, 4)
    assert (topo.node, topo.local_rank, topo.n_nodes, topo.ranks_per_node) == (1, 1, 3, 2)
    assert list(topo.node_of) == [0, 1, 0, 1, 2]
    # two machines of 3 and 2 ranks, cut into pseudo-nodes of 2
    assert list(split_pseudo_nodes([5, 5, 5, 8, 8], 2)) == [0, 0, 1, 2, 2]
    assert list(split_pseudo_nodes([5, 8, 5, 8, 5], 2)) == [0, 1, 0, 1, 2]
    assert list(split_pseudo_nodes([1, 1, 1], None)) == [1, 1, 1]
    with pytest.raises(ValueError, match="outside"):
        Topology([0, 0], 2)


def test_environment_variable_sets_pseudo_nodes(monkeypatch):
    comm = SelfCommunicator()
    monkeypatch.setenv(ENV_RANKS_PER_NODE, "1")
    assert topology(comm).nodes == ((0,),)
    comm2 = SelfCommunicator()
    monkeypatch.setenv(ENV_RANKS_PER_NODE, "zero")
    with pytest.raises(ValueError, match=ENV_RANKS_PER_NODE):
        topology(comm2)
    with use(comm, [0]) as t:
        assert topology(comm) is t
    with pytest.raises(ValueError, match="does not fit"):
        with use(comm, [0, 0]):
            pass

"""Node-aware collectives under real ranks, on pseudo-node layouts of this machine.

Every layout of the world's ranks into nodes (one node, nodes of 1, 2 or 3 consecutive
ranks, round-robin, an uneven last node) is imposed with ``native.topology.use``; for
each, every algorithm that claims the canonical order (direct, hierarchical with each
leaders' algorithm, auto, and recursive doubling / halving where the layout makes their
tree canonical) must return exactly the bits of the written-out reference
(``native_reference.canonical_sum``: pair sums inside nodes, then over nodes), for
allreduce and reduce-scatter, on every rank. Collectives first, assertions after.
"""
import numpy as np
import pytest

from native import collectives as col
from native import costs
from native.algorithms.hierarchical import hierarchical_allreduce, hierarchical_block_order
from native.topology import Topology, use
from native_reference import canonical_sum, split_range

pytestmark = pytest.mark.mpi

SIZES = [0, 1, 7, 1001, 100_003]


def layouts(p):
    out = {"one node": [0] * p, "1 per node": list(range(p)),
           "2 per node": [r // 2 for r in range(p)], "3 per node": [r // 3 for r in range(p)],
           "round robin 2": [r % 2 for r in range(p)],
           "uneven": [0] * max(p - 1, 1) + [1] * (p > 1)}
    return {name: lay[:p] for name, lay in out.items()}


def contribution(rank, n, dtype):
    rng = np.random.default_rng([rank, n, np.dtype(dtype).num])
    if np.dtype(dtype).kind == "i":
        return rng.integers(-2**40, 2**40, n).astype(dtype)
    return (rng.standard_normal(n) * 10.0 ** rng.uniform(-8, 8, n)).astype(dtype)


def claims_canonical(topo, operation):
    flat = {"allreduce": ["doubling", "rabenseifner"], "reduce_scatter": ["halving"]}[operation]
    return ["direct", "hierarchical", "auto"] + (flat if topo.flat_is_canonical else [])


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64])
def test_every_canonical_algorithm_gives_the_reference_bits(comm, dtype):
    p, r = comm.size, comm.rank
    got = []  # (layout, n, operation, algorithm, result bytes, expected bytes)
    for name, lay in layouts(p).items():
        with use(comm, lay) as topo:
            for n in SIZES:
                ref = canonical_sum([contribution(q, n, dtype) for q in range(p)], lay)
                for alg in claims_canonical(topo, "allreduce"):
                    res = col.allreduce(comm, contribution(r, n, dtype), algorithm=alg)
                    got.append((name, n, "allreduce", alg, res.tobytes(), ref.tobytes()))
                sl = split_range(n, p, r)
                for alg in claims_canonical(topo, "reduce_scatter"):
                    block, (s0, s1) = col.reduce_scatter(comm, contribution(r, n, dtype), algorithm=alg)
                    got.append((name, n, "reduce_scatter", alg, block.tobytes() + bytes([s0 == sl.start]),
                                ref[sl].tobytes() + bytes([s1 == sl.stop])))
    bad = [g[:4] for g in got if g[4] != g[5]]
    assert not bad, f"rank {r}: differs from the canonical reference: {bad[:5]}"


def test_each_leaders_algorithm_and_node_broadcast(comm):
    p, r = comm.size, comm.rank
    n = 5003
    results = []
    for lay in ([r // 2 for r in range(p)], [r % 2 for r in range(p)], [0] * p):
        with use(comm, lay) as topo:
            ref = canonical_sum([contribution(q, n, np.float64) for q in range(p)], lay)
            for leader in ("doubling", "rabenseifner", "direct"):
                for nb in ("binomial", "scatter_allgather"):
                    acc = contribution(r, n, np.float64)
                    hierarchical_allreduce(comm, acc, topo, leader, nb)
                    results.append((tuple(lay), leader, nb, acc.tobytes() == ref.tobytes()))
    assert all(ok for *_, ok in results), [res[:3] for res in results if not res[3]]


def test_auto_takes_hierarchical_on_a_slow_network_with_the_same_bits(comm, monkeypatch):
    p, r = comm.size, comm.rank
    # round-robin nodes: the flat tree algorithms are not canonical here, so the
    # choice is between direct (every rank crosses the network) and hierarchical.
    # (On nodes of consecutive power-of-two ranks, Rabenseifner pairing nearest
    # partners first is as frugal with the network as the hierarchical algorithm.)
    lay = [q % 2 for q in range(p)]
    n = 200_003
    x = contribution(r, n, np.float64)
    with use(comm, lay) as topo:
        ref = canonical_sum([contribution(q, n, np.float64) for q in range(p)], lay)
        monkeypatch.setenv(costs.ENV_GBITS, "0.01")      # 10 Mb/s between nodes
        slow = col.choose_allreduce(x.nbytes, p, topo)
        res_slow = col.allreduce(comm, x, algorithm="auto")
        monkeypatch.setenv(costs.ENV_GBITS, "100000")    # faster than memory
        fast = col.choose_allreduce(x.nbytes, p, topo)
        res_fast = col.allreduce(comm, x, algorithm="auto")
    if 1 < topo.n_nodes < p:
        assert slow == "hierarchical", slow
        assert fast != "hierarchical", fast
    assert res_slow.tobytes() == ref.tobytes() == res_fast.tobytes()


def test_hierarchical_reduce_scatter_layout_is_node_major(comm):
    topo = Topology([q % 2 for q in range(comm.size)], comm.rank)
    order = hierarchical_block_order(topo, "direct")
    assert sorted(order) == list(range(comm.size))
    assert [topo.node_of[q] for q in order] == sorted(topo.node_of)

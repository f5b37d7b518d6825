"""The cost model's schedules (native.costs) move the bytes the algorithms really send.

For each algorithm, rank count and node layout, the bytes summed over the modeled
steps must equal what ``native.stats`` counted while the algorithm ran on thread ranks
(buffers divisible by every block count, so blocks are equal). A model that prices
the wrong messages fails here before it misleads ``auto`` or ``--plan``.
"""
import numpy as np
import pytest

from native import collectives as col
from native import costs
from native.algorithms.hierarchical import hierarchical_allreduce
from native.stats import STATS
from native.threads import ThreadWorld
from native.topology import Topology

N = 840 * 16  # float64 elements: divisible by 1..8, 10, 12, 14, 16


def modeled_bytes(steps, nbytes):
    return sum(float(frac.sum()) for _, _, frac, _ in steps) * nbytes


def measured_bytes(p, node_of, call):
    STATS.reset()
    ThreadWorld(p, node_of=node_of).run(call)
    return STATS.bytes_sent  # process-wide: all thread ranks together


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("op,algorithm", [
    ("allreduce", "ring"), ("allreduce", "direct"), ("allreduce", "doubling"), ("allreduce", "rabenseifner"),
    ("reduce_scatter", "ring"), ("reduce_scatter", "direct"), ("reduce_scatter", "halving"),
    ("allgather", "ring"), ("allgather", "bruck"), ("bcast", "binomial"), ("bcast", "scatter_allgather")])
def test_flat_schedules_send_the_counted_bytes(p, op, algorithm):
    x = np.ones(N)

    def call(comm):
        if op == "allreduce":
            col.allreduce(comm, x, algorithm=algorithm, check=False)
        elif op == "reduce_scatter":
            col.reduce_scatter(comm, x, algorithm=algorithm, check=False)
        elif op == "allgather":
            col.allgather(comm, x[: N // p], algorithm=algorithm, check=False)
        else:
            col.bcast(comm, x.copy(), root=0, algorithm=algorithm, check=False)

    got = measured_bytes(p, None, call)
    assert got == pytest.approx(modeled_bytes(costs.schedule(op, algorithm, p, x.nbytes), x.nbytes))


@pytest.mark.parametrize("node_of", [[0, 0, 1, 1], [0, 1, 0, 1, 2, 2], [0, 0, 0, 1, 1, 2, 2, 2]])
@pytest.mark.parametrize("leader", ["doubling", "rabenseifner", "direct"])
@pytest.mark.parametrize("node_bcast", ["binomial", "scatter_allgather"])
def test_hierarchical_schedule_sends_the_counted_bytes(node_of, leader, node_bcast):
    p = len(node_of)
    x = np.ones(N)

    def call(comm):
        hierarchical_allreduce(comm, x.copy(), Topology(node_of, comm.rank), leader, node_bcast)

    got = measured_bytes(p, node_of, call)
    steps = costs.schedule("allreduce", "hierarchical", node_of, x.nbytes, leader=leader, node_bcast=node_bcast)
    assert got == pytest.approx(modeled_bytes(steps, x.nbytes))


def test_step_prices_follow_the_node_layout():
    net = costs.Network(alpha_intra=1e-6, beta_intra=1e-10, alpha_inter=1e-5, beta_inter=1e-9, gamma=0.0)
    n = 2 ** 20
    # 2 ranks on one node: one intra step; on two nodes: one inter step
    assert costs.seconds("bcast", "binomial", n, [0, 0], net, call=False) == pytest.approx(1e-6 + n * 1e-10)
    assert costs.seconds("bcast", "binomial", n, [0, 1], net, call=False) == pytest.approx(1e-5 + n * 1e-9)
    # the ranks of a node share its link. Direct reduce-scatter over 2 nodes of 2 ranks,
    # blocks of n/4: step 1 (r -> r+1) and step 3 (r -> r+3) put one block per node on
    # the network, step 2 (r -> r+2) both ranks' blocks: 3 inter-node latencies, n/4 +
    # n/2 + n/4 bytes through each node's link
    flat = costs.seconds("reduce_scatter", "direct", n, [0, 0, 1, 1], net, call=False)
    assert flat == pytest.approx(3e-5 + n * 1e-9)
    leader, nb, t = costs.plan_hierarchical("allreduce", n, [0, 1, 0, 1], net)
    assert leader in costs.LEADER_ALGORITHMS["allreduce"] and nb in costs.NODE_BCASTS and t > 0

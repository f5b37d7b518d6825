"""Alpha-beta-gamma cost model of every collective algorithm, on any node layout.

This module is the one home of collective costs: ``algorithm="auto"`` in
:mod:`native.collectives` picks the cheapest algorithm with it, and the fit-time model
(:mod:`forest.cli.cost_model`, ``forest-train --plan``) prices the collectives of a fit
with it.

Model
-----
An algorithm is a list of *steps* (:func:`schedule`). In a step some ranks send a
message to others (each of ``frac * n`` bytes of an ``n``-byte buffer) and some add
what they received (``red * n`` bytes). A step costs

    max(alpha_intra + max_intra_frac * n * beta_intra,          (messages inside nodes)
        alpha_inter + max_node_load  * n * beta_inter)          (messages between nodes)
    + red * n * gamma

where ``max_node_load`` is the largest sum of inter-node message sizes leaving or
entering one node in that step: the ranks of a node share its network link, which
is what makes flat algorithms expensive across nodes and hierarchical ones cheap.
A public call adds ``call_overhead`` (argument checks, Python) and ``copy * n`` (the
result buffer the call allocates).

Constants (:class:`Network`)
----------------------------
``alpha_intra, beta_intra, gamma, call_overhead, copy`` are measured on this machine
by ``python benchmarks/bench_scaling.py --calibrate`` (minima over repetitions of
``native.transport.exchange`` between two ranks and of ``numpy.add``), which writes
them, with the command, host and date, to ``native/calibration.json``; the values
below are the fall-back when that file is absent. The inter-node constants describe a
network this machine does not have: ``HISTFOREST_NET_LATENCY_US`` (default 5 us) and
``HISTFOREST_NET_GBITS`` (default 25 Gb/s per node link). They matter only when ranks
sit on several nodes (real ones, or pseudo-nodes: :mod:`native.topology`).
"""
import dataclasses
import functools
import json
import os
from pathlib import Path

import numpy as np

from .algorithms.direct import rounds_for
from .order import pair_tree, schedule as tree_schedule
from .settings import positive_number

CALIBRATION_PATH = Path(__file__).with_name("calibration.json")
ENV_LATENCY_US = "HISTFOREST_NET_LATENCY_US"
ENV_GBITS = "HISTFOREST_NET_GBITS"

#: Fall-back constants (2-core AMD EPYC VM shared with other jobs, MPICH 5.0.2 over
#: shared memory, 2 ranks; medians of 30-200 repetitions): a Sendrecv of 8 B through
#: ``native.transport.exchange`` 4.6-5.7 us, 1-8 MiB at 0.12 ns/B, ``numpy.add`` of
#: 1-4 MiB at 0.03 ns/B of result.
DEFAULTS = {"alpha_intra": 6e-6, "beta_intra": 1.2e-10, "gamma": 3e-11, "call_overhead": 2e-5,
            "copy": 1e-10}


@dataclasses.dataclass(frozen=True)
class Network:
    """Constants of the model, in seconds (per message step, per byte).

    Attributes
    ----------
    alpha_intra, beta_intra : float
        Latency of one message step and seconds per byte between ranks of one node.
    alpha_inter, beta_inter : float
        The same between nodes (``beta_inter`` per byte through one node's link).
    gamma : float
        Seconds per byte added (``numpy.add`` of float64).
    call_overhead : float
        Fixed cost of one public collective call (checks, allocation, Python).
    copy : float
        Seconds per byte of the result copy a call makes.
    """

    alpha_intra: float
    beta_intra: float
    alpha_inter: float
    beta_inter: float
    gamma: float
    call_overhead: float = 0.0
    copy: float = 0.0

    @classmethod
    def cluster(cls, latency_us=5.0, gbits=25.0, base=None):
        """This machine's node-internal constants with a described network between nodes.

        Parameters
        ----------
        latency_us : float
            One-way latency of an inter-node message, microseconds.
        gbits : float
            Bandwidth of one node's network link, gigabits per second.
        base : Network, optional
            Source of the node-internal constants (default: the calibrated ones).
        """
        base = measured() if base is None else base
        return dataclasses.replace(base, alpha_inter=base.alpha_intra + latency_us * 1e-6,
                                   beta_inter=8.0 / (gbits * 1e9))


def calibration():
    """The calibrated constants with their provenance (``{}`` when not calibrated).

    Returns
    -------
    dict
        ``constants`` (a dict of :data:`DEFAULTS`' keys), ``command``, ``host``, ``date``.
    """
    try:
        return json.loads(CALIBRATION_PATH.read_text())
    except (OSError, ValueError):
        return {}


@functools.lru_cache(maxsize=1)
def measured():
    """Network with this machine's calibrated constants, inter-node = intra-node."""
    values = dict(DEFAULTS)
    values.update({k: float(v) for k, v in calibration().get("constants", {}).items() if k in DEFAULTS})
    return Network(values["alpha_intra"], values["beta_intra"], values["alpha_intra"],
                   values["beta_intra"], values["gamma"], values["call_overhead"], values["copy"])


def current():
    """The network ``"auto"`` uses: calibrated constants and the environment's network."""
    # cached on the raw settings: "auto" asks once per collective call
    return _current(os.environ.get(ENV_LATENCY_US, ""), os.environ.get(ENV_GBITS, ""), measured())


@functools.lru_cache(maxsize=16)
def _current(latency_raw, gbits_raw, base):
    return Network.cluster(*network_setting(), base=base)


def network_setting():
    """``(latency_us, gbits)`` of the inter-node network from the environment."""
    return (positive_number(ENV_LATENCY_US, 5.0, unit="a latency in microseconds"),
            positive_number(ENV_GBITS, 25.0, unit="a bandwidth in Gb/s"))


# ----------------------------------------------------------------------------- schedules
# A step is (src, dst, frac, red): int arrays of sending and receiving ranks (in the
# numbering of the participants), the message sizes as fractions of the buffer, and
# the largest fraction of the buffer any rank adds in that step.

def _step(pairs, frac, red=0.0):
    src = np.array([a for a, _ in pairs], dtype=np.int64)
    dst = np.array([b for _, b in pairs], dtype=np.int64)
    return src, dst, np.broadcast_to(np.asarray(frac, dtype=np.float64), src.shape).copy(), float(red)


def _compute_step(red):
    empty = np.zeros(0, dtype=np.int64)
    return empty, empty, np.zeros(0), float(red)


def _fold_parts(m):
    q = 1 << (m.bit_length() - 1)
    rem = m - q
    real = [2 * v + 1 if v < rem else v + rem for v in range(q)]
    return q, rem, real


def _ring(m, red):
    return [_step([(i, (i + 1) % m) for i in range(m)], 1.0 / m, red / m if red else 0.0)
            for _ in range(m - 1)]


def _direct_rs(m, block_bytes):
    steps = []
    rounds = rounds_for(block_bytes, m) if block_bytes else 1
    for _ in range(rounds):
        steps += [_step([(i, (i + k) % m) for i in range(m)], 1.0 / m / rounds) for k in range(1, m)]
    steps.append(_compute_step((m - 1) / m))
    return steps


def _fold_in(m, frac=1.0):
    q, rem, _ = _fold_parts(m)
    return [_step([(2 * i, 2 * i + 1) for i in range(rem)], frac, frac)] if rem else []


def _fold_out(m, frac):
    q, rem, _ = _fold_parts(m)
    return [_step([(2 * i + 1, 2 * i) for i in range(rem)], frac)] if rem else []


def _pairs(m, d):
    q, rem, real = _fold_parts(m)
    return [(real[v], real[v ^ d]) for v in range(q)]


def _doubling(m):
    q, _, _ = _fold_parts(m)
    steps = _fold_in(m)
    d = 1
    while d < q:
        steps.append(_step(_pairs(m, d), 1.0, 1.0))
        d *= 2
    return steps + _fold_out(m, 1.0)


def _halving(m, allgather, back):
    q, _, _ = _fold_parts(m)
    steps = _fold_in(m)
    d, frac = 1, 0.5
    while d < q:
        steps.append(_step(_pairs(m, d), frac, frac))
        d, frac = 2 * d, frac / 2
    if allgather:
        d, frac = q // 2, 1.0 / q
        while d >= 1:
            steps.append(_step(_pairs(m, d), frac))
            d, frac = d // 2, frac * 2
    return steps + _fold_out(m, back)


def _tree_reduce(m):
    # additions of the pair tree grouped by height: one step per level
    height = {}
    steps = {}
    for dst, src in tree_schedule(pair_tree(range(m))):
        h = max(height.get(dst, 0), height.get(src, 0)) + 1
        height[dst] = h
        steps.setdefault(h, []).append((src, dst))
    return [_step(steps[h], 1.0, 1.0) for h in sorted(steps)]


def _binomial(m):
    steps = []
    mask = 1
    while mask < m:
        steps.append(_step([(v, v + mask) for v in range(mask) if v + mask < m], 1.0))
        mask *= 2
    return steps


def _scatter_allgather(m):
    steps = []
    mask = 1
    while mask < m:
        mask *= 2
    mask //= 2
    # the scatter's rounds, largest subtrees first
    while mask >= 1:
        pairs = [(v, v + mask) for v in range(0, m, 2 * mask) if v + mask < m]
        if pairs:
            fr = [min(mask, m - b) / m for _, b in pairs]
            src, dst, _, _ = _step(pairs, 0.0)
            steps.append((src, dst, np.array(fr), 0.0))
        mask //= 2
    return steps + _ring(m, 0.0)


def _bruck(m):
    steps = []
    k = 1
    while k < m:
        steps.append(_step([(i, (i - k) % m) for i in range(m)], min(k, m - k) / m))
        k *= 2
    return steps + [_compute_step(1.0)]  # the final rotation copies the buffer


def _map(steps, ranks):
    ranks = np.asarray(ranks, dtype=np.int64)
    return [(ranks[s], ranks[d], f, r) for s, d, f, r in steps]


def _parallel(groups):
    """Steps of several independent schedules running side by side (step i together)."""
    out = []
    for i in range(max((len(g) for g in groups), default=0)):
        parts = [g[i] for g in groups if i < len(g)]
        out.append((np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                    np.concatenate([p[2] for p in parts]), max(p[3] for p in parts)))
    return out


def _node_parallel(nodes, make):
    return _parallel([_map(make(len(n)), n) for n in nodes if len(n) > 1])


FLAT = {
    ("allreduce", "ring"): lambda m, b: _ring(m, 1.0) + _ring(m, 0.0),
    ("allreduce", "direct"): lambda m, b: _direct_rs(m, b) + _ring(m, 0.0),
    ("allreduce", "doubling"): lambda m, b: _doubling(m),
    ("allreduce", "rabenseifner"): lambda m, b: _halving(m, True, 1.0),
    ("reduce_scatter", "ring"): lambda m, b: _ring(m, 1.0),
    ("reduce_scatter", "direct"): lambda m, b: _direct_rs(m, b),
    ("reduce_scatter", "halving"): lambda m, b: _halving(m, False, 1.0 / m),
    ("allgather", "ring"): lambda m, b: _ring(m, 0.0),
    ("allgather", "bruck"): lambda m, b: _bruck(m),
    ("bcast", "binomial"): lambda m, b: _binomial(m),
    ("bcast", "scatter_allgather"): lambda m, b: _scatter_allgather(m),
}


def _layout(layout):
    """``(nodes, node_of)`` of a Topology, its ``nodes`` tuple, node labels or a rank count."""
    if hasattr(layout, "nodes"):
        nodes = layout.nodes
    elif isinstance(layout, tuple) and layout and isinstance(layout[0], tuple):
        nodes = layout
    else:
        if isinstance(layout, (int, np.integer)):
            layout = [0] * int(layout)
        from .topology import Topology

        nodes = Topology(layout, 0).nodes
    node_of = np.empty(sum(len(n) for n in nodes), dtype=np.int64)
    for j, n in enumerate(nodes):
        node_of[list(n)] = j
    return tuple(tuple(n) for n in nodes), node_of


def schedule(operation, algorithm, layout, nbytes=0, leader=None, node_bcast="binomial"):
    """The steps of one collective on a node layout.

    Parameters
    ----------
    operation : {"allreduce", "reduce_scatter", "allgather", "bcast"}
    algorithm : str
        A flat algorithm of that operation, or ``"hierarchical"``.
    layout : Topology, its ``nodes``, array-like of node labels, or int (ranks on one node)
    nbytes : int
        Buffer size (the direct algorithm's rounds depend on it).
    leader : str, optional
        Leaders' algorithm of a hierarchical collective.
    node_bcast : str
        Node-internal broadcast of a hierarchical allreduce.

    Returns
    -------
    list of (src, dst, frac, red)
    """
    nodes, node_of = _layout(layout)
    p = len(node_of)
    if p == 1:
        return []
    if algorithm != "hierarchical":
        make = FLAT.get((operation, algorithm))
        if make is None:
            raise ValueError(f"no cost model for {operation}/{algorithm}")
        return make(p, nbytes / p)
    leaders = [n[0] for n in nodes]
    up = _node_parallel(nodes, _tree_reduce)
    across = _map(FLAT[(operation, leader)](len(nodes), nbytes / len(nodes)), leaders) \
        if len(nodes) > 1 else []
    if operation == "allreduce":
        down = _node_parallel(nodes, lambda m: FLAT[("bcast", node_bcast)](m, 0))
    elif operation == "reduce_scatter":
        k = max(len(n) for n in nodes)
        down = [_step([(n[0], n[i]) for n in nodes if i < len(n)], 1.0 / p) for i in range(1, k)]
    else:
        raise ValueError(f"no hierarchical {operation}")
    return up + across + down


@functools.lru_cache(maxsize=4096)
def _step_table(operation, algorithm, nodes, nbytes, leader, node_bcast):
    steps = schedule(operation, algorithm, nodes, nbytes, leader, node_bcast)
    node_of = np.empty(sum(len(n) for n in nodes), dtype=np.int64)
    for j, n in enumerate(nodes):
        node_of[list(n)] = j
    n_nodes = len(nodes)
    table = np.zeros((len(steps), 5))  # has_intra, b_intra, has_inter, b_inter, red
    for i, (src, dst, frac, red) in enumerate(steps):
        table[i, 4] = red
        if src.size == 0:
            continue
        inter = node_of[src] != node_of[dst]
        if (~inter).any():
            table[i, 0] = 1.0
            table[i, 1] = frac[~inter].max()
        if inter.any():
            out = np.bincount(node_of[src[inter]], weights=frac[inter], minlength=n_nodes)
            inn = np.bincount(node_of[dst[inter]], weights=frac[inter], minlength=n_nodes)
            table[i, 2] = 1.0
            table[i, 3] = max(out.max(), inn.max())
    return table


def seconds(operation, algorithm, nbytes, layout, network=None, leader=None, node_bcast="binomial",
            call=True):
    """Predicted seconds of one collective (the slowest rank's view).

    Parameters
    ----------
    operation, algorithm : str
        See :func:`schedule`. ``algorithm="hierarchical"`` with ``leader=None`` takes
        the cheapest leaders' algorithm and node broadcast (as ``"auto"`` does).
    nbytes : int
        Bytes of the whole buffer (allgather: of the gathered result).
    layout : Topology, array-like of node labels, or int
    network : Network, optional
        Default :func:`current`.
    call : bool
        Include the public call's fixed overhead and result copy.

    Returns
    -------
    float
    """
    network = current() if network is None else network
    nodes, _ = _layout(layout)
    if algorithm == "hierarchical" and leader is None:
        return plan_hierarchical(operation, nbytes, nodes, network)[2] + \
            (_call_cost(nbytes, network) if call else 0.0)
    t = _table_seconds(_step_table(operation, algorithm, nodes, int(nbytes), leader, node_bcast),
                       float(nbytes), network)
    return t + (_call_cost(nbytes, network) if call else 0.0)


def _call_cost(nbytes, network):
    return network.call_overhead + nbytes * network.copy


def _table_seconds(table, n, net):
    if table.shape[0] == 0:
        return 0.0
    neg = -1e30
    intra = np.where(table[:, 0] > 0, net.alpha_intra + table[:, 1] * n * net.beta_intra, neg)
    inter = np.where(table[:, 2] > 0, net.alpha_inter + table[:, 3] * n * net.beta_inter, neg)
    msg = np.maximum(np.maximum(intra, inter), 0.0)
    return float(msg.sum() + table[:, 4].sum() * n * net.gamma)


LEADER_ALGORITHMS = {"allreduce": ("doubling", "rabenseifner", "direct"),
                     "reduce_scatter": ("halving", "direct")}
NODE_BCASTS = ("binomial", "scatter_allgather")


def plan_hierarchical(operation, nbytes, layout, network=None):
    """Cheapest leaders' algorithm (and node broadcast) of a hierarchical collective.

    Returns
    -------
    leader : str
    node_bcast : str
    seconds : float
        Without the public call's overhead.
    """
    network = current() if network is None else network
    nodes, _ = _layout(layout)
    best = None
    bcasts = NODE_BCASTS if operation == "allreduce" else ("binomial",)
    for leader in LEADER_ALGORITHMS[operation]:
        for nb in bcasts:
            t = _table_seconds(_step_table(operation, "hierarchical", nodes, int(nbytes), leader, nb),
                               float(nbytes), network)
            if best is None or t < best[2]:
                best = (leader, nb, t)
    return best


def cheapest(operation, candidates, nbytes, layout, network=None):
    """The candidate with the smallest :func:`seconds` (ties: the first listed)."""
    network = current() if network is None else network
    return min(candidates, key=lambda alg: seconds(operation, alg, nbytes, layout, network, call=False))

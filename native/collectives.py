"""Public collectives of histforest: validation, algorithm choice, check mode, counting.

Every function takes a :class:`native.comm.Communicator` first and is called by all
ranks in the same order with matching arguments. The algorithms themselves live in
:mod:`native.algorithms`; this module turns arbitrary arrays into the flat
contiguous buffers they work on, picks an algorithm, runs the optional check-mode
handshake (:mod:`native.check`) and counts calls in :data:`STATS`.

Sums (``allreduce``, ``reduce_scatter``) accept float32, float64, int32 and int64.
Every rank ends with bitwise-identical results: each element is summed at one
place and then copied, or summed symmetrically by partners whose IEEE additions
commute exactly (recursive doubling).

Summation order. The algorithms ``"auto"`` chooses from all add the ranks'
contributions by one tree, the canonical tree of :mod:`native.order` for the node
layout (:mod:`native.topology`), so ``"auto"``'s choice (which depends on the buffer
size) never changes a bit of a result, and ``allreduce`` and ``reduce_scatter`` agree
bitwise on every element. The candidates:

- ``"doubling"`` (recursive doubling; small buffers) and ``"rabenseifner"``
  (recursive halving, nearest partners first, then recursive doubling; large buffers),
  when their pair tree over all ranks is the canonical tree (one node; or nodes of
  equal power-of-two sizes made of consecutive ranks);
- ``"direct"``: pairwise-exchange reduce-scatter that adds each block at its owner in
  the canonical order, then a ring allgather (the ring's costs, any layout);
- ``"hierarchical"``: add inside each node, then across one leader per node, then
  broadcast inside the node (:mod:`native.algorithms.hierarchical`), when ranks span
  several nodes.

``"ring"`` and ``"mpi"`` (MPI's own ``Allreduce``) stay selectable by name; they add in
their own orders and ``"auto"`` never picks them.

Algorithm choice (``algorithm="auto"``): the cheapest candidate under the
alpha-beta-gamma model of :mod:`native.costs`, which simulates each algorithm's
message steps on the node layout (inter-node links shared by a node's ranks) with
constants measured on this machine and the network described by
``HISTFOREST_NET_LATENCY_US`` / ``HISTFOREST_NET_GBITS``.
"""
import functools
import pickle
import zlib

import numpy as np

from . import check as _check
from . import costs
from .algorithms.bruck import bruck_allgather
from .algorithms.direct import direct_reduce_scatter
from .algorithms.halving import (doubling_allreduce, halving_block_order, halving_reduce_scatter_blocks,
                                 rabenseifner_allreduce)
from .algorithms.hierarchical import (hierarchical_allreduce, hierarchical_block_order,
                                      hierarchical_reduce_scatter)
from .algorithms.ring import ring_allgather, ring_reduce_scatter
from .algorithms.tree import binomial_bcast, scatter_allgather_bcast
from .blocks import block_bounds
from .stats import STATS
from .topology import topology
from .transport import TAG_ALLTOALLV, exchange

__all__ = ["allreduce", "reduce_scatter", "allgather", "allgatherv", "alltoallv", "bcast",
           "bcast_object", "allgather_object", "allreduce_best", "global_row_offset",
           "choose_allreduce", "choose_reduce_scatter", "auto_plan", "predicted_seconds", "STATS", "SUM_DTYPES"]

SUM_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32),
              np.dtype(np.int64))
ALLREDUCE_ALGORITHMS = ("auto", "ring", "rabenseifner", "doubling", "direct", "hierarchical", "mpi")
REDUCE_SCATTER_ALGORITHMS = ("auto", "ring", "halving", "direct", "hierarchical")
ALLGATHER_ALGORITHMS = ("auto", "ring", "bruck")
BCAST_ALGORITHMS = ("auto", "binomial", "scatter_allgather")


def predicted_seconds(operation, algorithm, nbytes, p, layout=None):
    """Model cost of one collective (:func:`native.costs.seconds`, without the call overhead).

    Parameters
    ----------
    operation : {"allreduce", "reduce_scatter", "allgather", "bcast"}
    algorithm : str
        An algorithm of that operation (not ``"auto"``/``"mpi"``).
    nbytes : int
        Bytes of the whole buffer (for allgather: of the gathered result).
    p : int
    layout : Topology or node labels, optional
        Default: ``p`` ranks on one node.

    Returns
    -------
    float
        Predicted seconds on the slowest rank.
    """
    return costs.seconds(operation, algorithm, nbytes, p if layout is None else layout, call=False)


def _choose(operation, nbytes, topo):
    """(algorithm, leader, node_bcast) for ``"auto"``: the cheapest canonical candidate."""
    network = costs.current()
    key = (operation, int(nbytes), network)
    plan = topo.plans.get(key)  # per layout, so the key need not hash the layout
    if plan is None:
        plan = topo.plans[key] = _cheapest_plan(operation, int(nbytes), topo.nodes, topo.flat_is_canonical,
                                                network)
    return plan


@functools.lru_cache(maxsize=1024)
def _cheapest_plan(operation, nbytes, nodes, flat_ok, network):
    flat = {"allreduce": ("doubling", "rabenseifner"), "reduce_scatter": ("halving",)}[operation]
    best = None
    for alg in (flat if flat_ok else ()) + ("direct",):
        t = costs.seconds(operation, alg, nbytes, nodes, network, call=False)
        if best is None or t < best[3]:
            best = (alg, None, None, t)
    if len(nodes) > 1:
        leader, nb, t = costs.plan_hierarchical(operation, nbytes, nodes, network)
        if t < best[3]:
            best = ("hierarchical", leader, nb, t)
    return best[:3]


def auto_plan(operation, nbytes, layout, network=None):
    """What ``algorithm="auto"`` does for one sum on a node layout, under a network.

    Parameters
    ----------
    operation : {"allreduce", "reduce_scatter"}
    nbytes : int
    layout : Topology or node labels (one per rank)
    network : native.costs.Network, optional
        Default :func:`native.costs.current`.

    Returns
    -------
    algorithm : str
    leader, node_bcast : str or None
        The leaders' algorithm and node broadcast when ``algorithm`` is hierarchical.
    """
    topo = _as_topology(None, layout)
    network = costs.current() if network is None else network
    return _cheapest_plan(operation, int(nbytes), topo.nodes, topo.flat_is_canonical, network)


def _hierarchical_plan(operation, nbytes, topo):
    """(leader, node_bcast) of a hierarchical collective: the cheapest under the model."""
    network = costs.current()
    key = ("hierarchical", operation, int(nbytes), network)
    plan = topo.plans.get(key)
    if plan is None:
        plan = topo.plans[key] = costs.plan_hierarchical(operation, int(nbytes), topo.nodes, network)[:2]
    return plan


def choose_allreduce(nbytes, p, layout=None):
    """Algorithm ``allreduce(..., algorithm="auto")`` uses for ``nbytes`` on ``p`` ranks.

    Parameters
    ----------
    nbytes : int
    p : int
    layout : Topology or node labels, optional
        Default: one node.

    Returns
    -------
    str
        ``"doubling"``, ``"rabenseifner"``, ``"direct"`` or ``"hierarchical"``.
    """
    return _choose("allreduce", nbytes, _as_topology(p, layout))[0]


def choose_reduce_scatter(nbytes, p, layout=None):
    """Algorithm ``reduce_scatter(..., algorithm="auto")`` uses (see :func:`choose_allreduce`)."""
    return _choose("reduce_scatter", nbytes, _as_topology(p, layout))[0]


def _as_topology(p, layout):
    from .topology import Topology

    if layout is None:
        return Topology([0] * p, 0)
    return layout if isinstance(layout, Topology) else Topology(layout, 0)


def _choose_allgather(nbytes, p):
    return costs.cheapest("allgather", ("bruck", "ring"), nbytes, p)


def _begin(comm, op, check, **signature):
    """Count the call, attribute its bytes to ``op`` and run the check handshake."""
    STATS.calls[op] += 1
    STATS._current = op
    traced = signature.pop("trace_bytes", None)
    if STATS.trace is not None:
        dtype = signature.get("dtype")
        nbytes = traced if traced is not None else \
            signature.get("n", 0) * (np.dtype(dtype).itemsize if dtype is not None else 1)
        STATS._record_call(op, signature.get("algorithm", "-"), nbytes, comm.size)
    act = comm.activity
    if act is not None:  # the watchdog compares call numbers between ranks
        act.seq += 1
        act.op = op
    if _check.enabled(check):
        _check.verify(comm, op, **signature)


def _sum_input(buf, name):
    arr = np.asarray(buf)
    if arr.dtype not in SUM_DTYPES:
        raise ValueError(f"{name}: dtype {arr.dtype} is not summable here; use one of "
                         f"{[d.name for d in SUM_DTYPES]}")
    return arr


def _check_algorithm(name, algorithm, allowed):
    if algorithm not in allowed:
        raise ValueError(f"{name}: unknown algorithm {algorithm!r}; choose from {allowed}")


def _rows(arr):
    """``(shape0, elements per axis-0 row, trailing shape)`` of an array with ndim >= 1."""
    trailing = arr.shape[1:]
    return arr.shape[0], int(np.prod(trailing, dtype=np.int64)), trailing


def allreduce(comm, buf, algorithm="auto", out=None, check=None):
    """Elementwise sum of ``buf`` over all ranks.

    Parameters
    ----------
    comm : native.comm.Communicator
    buf : array_like, any shape
        float32, float64, int32 or int64; same shape and dtype on every rank.
    algorithm : {"auto", "ring", "rabenseifner", "doubling", "direct", "hierarchical", "mpi"}
        ``"mpi"`` is the MPI library's own ``Allreduce``, kept as a baseline.
        Ranks must pass the same value. See the module docstring for which
        algorithms add in the canonical order.
    out : ndarray, optional
        C-contiguous array of ``buf``'s shape and dtype to write into; ``out=buf``
        reduces in place.
    check : bool, optional
        Verify first that all ranks make the same call (default: environment variable
        ``HISTFOREST_CHECK_COLLECTIVES``).

    Returns
    -------
    ndarray, shape of ``buf``
        The sum (``out`` if given, else a new array), bitwise identical on all ranks.
    """
    arr = _sum_input(buf, "allreduce")
    _check_algorithm("allreduce", algorithm, ALLREDUCE_ALGORITHMS)
    p = comm.size
    topo = topology(comm) if p > 1 else None
    leader = node_bcast = None
    if algorithm == "auto":
        algorithm, leader, node_bcast = _choose("allreduce", arr.nbytes, topo) if p > 1 \
            else ("doubling", None, None)
    elif algorithm == "hierarchical" and p > 1:
        leader, node_bcast = _hierarchical_plan("allreduce", arr.nbytes, topo)
    if out is None:
        result = np.empty(arr.shape, dtype=arr.dtype) if algorithm == "mpi" \
            else np.array(arr, order="C", copy=True)
    else:
        if out.shape != arr.shape or out.dtype != arr.dtype:
            raise ValueError(f"allreduce: out has shape {out.shape} dtype {out.dtype}, "
                             f"buf has shape {arr.shape} dtype {arr.dtype}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("allreduce: out must be a writeable C-contiguous array")
        result = out
    n0, row, _ = _rows(arr.reshape(1) if arr.ndim == 0 else arr)
    _begin(comm, "allreduce", check, algorithm=algorithm, dtype=arr.dtype, n=arr.size,
           shape0=n0, trailing=row)
    if algorithm == "mpi":
        # MPI needs distinct send and receive buffers; copy only when they alias.
        send = arr.copy() if out is not None and np.shares_memory(arr, out) else arr
        STATS.opaque_calls += 1
        comm.library_allreduce(np.ascontiguousarray(send).reshape(-1), result.reshape(-1))
        return result
    if result is not arr and out is not None:
        np.copyto(result, arr)
    acc = result.reshape(-1)
    if p == 1:
        return result
    if algorithm == "ring":
        bounds = block_bounds(acc.size, p)
        ring_reduce_scatter(comm, acc, bounds)
        ring_allgather(comm, acc, bounds)
    elif algorithm == "rabenseifner":
        rabenseifner_allreduce(comm, acc)
    elif algorithm == "direct":
        bounds = block_bounds(acc.size, p)
        direct_reduce_scatter(comm, acc, bounds, topo.tree)
        ring_allgather(comm, acc, bounds)
    elif algorithm == "hierarchical":
        hierarchical_allreduce(comm, acc, topo, leader, node_bcast)
    else:
        doubling_allreduce(comm, acc, np.add)
    return result


def reduce_scatter(comm, buf, algorithm="auto", axis=0, check=None):
    """Sum ``buf`` over ranks and give each rank only its block along ``axis``.

    The blocks are ``native.blocks.block_bounds(buf.shape[axis], comm.size)``:
    contiguous index ranges along ``axis``, lengths differing by at most one, longer
    ones first. For a 1-D buffer they are blocks of elements. Each rank sends about
    half the bytes of an allreduce. ``axis`` other than 0 (say, feature blocks of a
    ``(node, feature, bin, channel)`` histogram) costs nothing extra: the buffer is
    copied into a work array anyway, with that axis moved to the front.

    Parameters
    ----------
    comm : native.comm.Communicator
    buf : array_like, ndim >= 1
        float32, float64, int32 or int64; same shape and dtype on every rank.
    algorithm : {"auto", "ring", "halving", "direct", "hierarchical"}
        ``"halving"`` is recursive halving (with the fold when ``p`` is not a power
        of two); see the module docstring for the others.
    axis : int, default 0
        Axis along which the result is split between ranks.
    check : bool, optional

    Returns
    -------
    my_block : ndarray
        The summed slice ``start:stop`` along ``axis`` (a new array; the other axes
        keep their length).
    (start, stop) : tuple of int
        This rank's index range along ``axis``.
    """
    arr = _sum_input(buf, "reduce_scatter")
    if arr.ndim == 0:
        raise ValueError("reduce_scatter needs an array with at least one axis")
    if not -arr.ndim <= axis < arr.ndim:
        raise ValueError(f"reduce_scatter: axis {axis} out of range for {arr.ndim} dims")
    _check_algorithm("reduce_scatter", algorithm, REDUCE_SCATTER_ALGORITHMS)
    p, r = comm.size, comm.rank
    topo = topology(comm) if p > 1 else None
    leader = None
    if algorithm == "auto":
        algorithm, leader, _ = _choose("reduce_scatter", arr.nbytes, topo) if p > 1 \
            else ("halving", None, None)
    elif algorithm == "hierarchical" and p > 1:
        leader, _ = _hierarchical_plan("reduce_scatter", arr.nbytes, topo)
    front = np.moveaxis(arr, axis, 0)
    n0, row, trailing = _rows(front)
    _begin(comm, "reduce_scatter", check, algorithm=algorithm, dtype=arr.dtype,
           n=arr.size, shape0=n0, trailing=row)
    rows = block_bounds(n0, p)
    start, stop = int(rows[r]), int(rows[r + 1])
    # The work copy lays the rank blocks out in the order the algorithm wants
    # (halving: bit-reversed positions; hierarchical: each node's blocks together).
    if p == 1 or algorithm in ("ring", "direct"):
        layout = None
    elif algorithm == "halving":
        layout = halving_block_order(p)
    else:
        layout = hierarchical_block_order(topo, leader)
    acc, starts, stops = _blocked_copy(front, rows, row, layout)
    if p > 1 and algorithm == "ring":
        ring_reduce_scatter(comm, acc, starts_bounds(starts, stops))
    elif p > 1 and algorithm == "direct":
        direct_reduce_scatter(comm, acc, starts_bounds(starts, stops), topo.tree)
    elif p > 1 and algorithm == "halving":
        halving_reduce_scatter_blocks(comm, acc, starts, stops)
    elif p > 1:
        hierarchical_reduce_scatter(comm, acc, starts, stops, topo, leader)
    mine = np.moveaxis(acc[starts[r]:stops[r]].reshape((stop - start,) + trailing), 0, axis)
    if axis % arr.ndim:
        mine = np.ascontiguousarray(mine)  # a contiguous copy in the caller's axis order
    elif p > 1:
        mine = mine.copy()  # so the block does not keep the whole work array alive
    return mine, (start, stop)


def _blocked_copy(front, rows, row, layout):
    """Copy ``front`` into a flat work buffer with its row blocks in ``layout`` order.

    Parameters
    ----------
    front : ndarray, shape (n0, ...)
    rows : ndarray of int64, shape (p + 1,)
        Row-block boundaries along axis 0.
    row : int
        Elements per axis-0 row.
    layout : list of int or None
        Order of the blocks in the buffer; ``None`` is the natural order.

    Returns
    -------
    acc : ndarray, shape (front.size,)
    starts, stops : ndarray of int64, shape (p,)
        Where block ``b`` lies in ``acc``.
    """
    p = len(rows) - 1
    if layout is None:
        acc = np.array(front, order="C", copy=True).reshape(-1)
        bounds = rows * row
        return acc, bounds[:-1].copy(), bounds[1:].copy()
    acc = np.empty(front.size, dtype=front.dtype)
    starts = np.empty(p, dtype=np.int64)
    stops = np.empty(p, dtype=np.int64)
    pos = 0
    for b in layout:
        size = int(rows[b + 1] - rows[b]) * row
        acc[pos:pos + size].reshape((int(rows[b + 1] - rows[b]),) + front.shape[1:])[...] = \
            front[rows[b]:rows[b + 1]]
        starts[b], stops[b] = pos, pos + size
        pos += size
    return acc, starts, stops


def starts_bounds(starts, stops):
    """``(p + 1,)`` boundaries of blocks laid out in natural order."""
    return np.concatenate([starts, stops[-1:]])


def allgather(comm, block, algorithm="auto", check=None):
    """Concatenate equal-shaped blocks from all ranks along axis 0, in rank order.

    Parameters
    ----------
    comm : native.comm.Communicator
    block : array_like, shape (m, ...)
        Same shape and dtype on every rank (a 0-d block counts as shape (1,)).
        Any fixed-size dtype.
    algorithm : {"auto", "ring", "bruck"}
    check : bool, optional

    Returns
    -------
    ndarray, shape (size * m, ...)
    """
    arr = np.atleast_1d(np.asarray(block))
    _check_algorithm("allgather", algorithm, ALLGATHER_ALGORITHMS)
    _require_fixed_size(arr, "allgather")
    p, r = comm.size, comm.rank
    total = arr.nbytes * p
    if algorithm == "auto":
        algorithm = _choose_allgather(total, p)
    n0, row, trailing = _rows(arr)
    _begin(comm, "allgather", check, algorithm=algorithm, dtype=arr.dtype, n=arr.size,
           shape0=n0, trailing=row)
    out = np.empty((p * n0,) + trailing, dtype=arr.dtype)
    mine = _as_bytes(arr)
    out_bytes = out.reshape(-1).view(np.uint8)
    if algorithm == "bruck" and p > 1:
        bruck_allgather(comm, mine, out_bytes)
    else:
        bounds = np.arange(p + 1, dtype=np.int64) * mine.size
        out_bytes[bounds[r]:bounds[r + 1]] = mine
        ring_allgather(comm, out_bytes, bounds)
    return out


def allgatherv(comm, arr, check=None):
    """Concatenate arrays of varying axis-0 length from all ranks, in rank order.

    Parameters
    ----------
    comm : native.comm.Communicator
    arr : array_like, shape (m_rank, ...)
        ``m_rank`` may differ between ranks (0 allowed); the trailing shape and dtype
        must not (checked always, since the byte counts depend on them). A 0-d
        input counts as shape (1,).
    check : bool, optional

    Returns
    -------
    ndarray, shape (sum of m_rank, ...)
    """
    a = np.atleast_1d(np.asarray(arr))
    _require_fixed_size(a, "allgatherv")
    p, r = comm.size, comm.rank
    n0, row, trailing = _rows(a)
    _begin(comm, "allgatherv", check, algorithm="ring", dtype=a.dtype, n=a.size,
           shape0=n0, trailing=row, free=("n", "shape0"))
    if p == 1:
        return np.array(a, order="C", copy=True)
    shape_crc = zlib.crc32(np.asarray(trailing, dtype=np.int64).tobytes())
    meta = np.array([n0, a.dtype.itemsize * row, _check._dtype_code(a.dtype), shape_crc],
                    dtype=np.int64)
    table = np.empty(p * meta.size, dtype=np.int64)
    bruck_allgather(comm, meta, table)
    table = table.reshape(p, meta.size)
    if not (table[:, 1:] == table[0, 1:]).all():
        desc = "; ".join(f"rank {i}: {m[0]} rows of {m[1]} bytes, dtype "
                         f"{_check._dtype_name(m[2])}" for i, m in enumerate(table))
        raise ValueError("allgatherv: ranks disagree on the trailing shape or dtype "
                         f"(only axis 0 may differ): {desc}")
    counts = table[:, 0]
    bounds = np.zeros(p + 1, dtype=np.int64)
    np.cumsum(counts * meta[1], out=bounds[1:])
    out = np.empty((int(counts.sum()),) + trailing, dtype=a.dtype)
    out_bytes = out.reshape(-1).view(np.uint8)
    out_bytes[bounds[r]:bounds[r + 1]] = _as_bytes(a)
    ring_allgather(comm, out_bytes, bounds)
    return out


def alltoallv(comm, blocks, check=None):
    """Personalised exchange: block ``q`` of every rank goes to rank ``q``.

    Pairwise schedule: in step ``k = 1 .. p-1`` a rank sends to ``rank + k`` and
    receives from ``rank - k`` (mod p), so each pair exchanges exactly once and a
    rank sends only what others need (the bytes of all its blocks but its own),
    where an ``allgatherv`` would copy everything to everyone. Two rounds: the row
    counts, then the data.

    Parameters
    ----------
    comm : native.comm.Communicator
    blocks : sequence of ``comm.size`` arrays
        ``blocks[q]`` (shape ``(m_q, ...)``, ``m_q`` may be 0) goes to rank ``q``.
        All blocks of all ranks share one dtype; the blocks that go to one rank share
        one trailing shape (blocks for different ranks may differ: e.g. each rank
        receiving its own block of columns). ``blocks[rank]`` stays here and sets the
        trailing shape this rank receives.
    check : bool, optional

    Returns
    -------
    ndarray, shape (sum over sources of m, ...)
        What every rank sent here, concatenated in source-rank order.

    Raises
    ------
    ValueError
        Wrong number of blocks, mixed dtypes, or a source whose rows have a different
        byte size from ``blocks[rank]``'s (found by the receiving rank; under
        :func:`native.comm.world` the uncaught error takes the job down).
    """
    p, r = comm.size, comm.rank
    if len(blocks) != p:
        raise ValueError(f"alltoallv: need {p} blocks (one per rank), got {len(blocks)}")
    arrs = [np.atleast_1d(np.asarray(b)) for b in blocks]
    dtype = arrs[r].dtype
    for a in arrs:
        _require_fixed_size(a, "alltoallv")
        if a.dtype != dtype:
            raise ValueError(f"alltoallv: blocks mix dtypes {dtype} and {a.dtype}")
    n0, row, trailing = _rows(arrs[r])
    _begin(comm, "alltoallv", check, algorithm="pairwise", dtype=dtype,
           trace_bytes=sum(a.nbytes for q, a in enumerate(arrs) if q != r))
    if p == 1:
        return np.array(arrs[0], order="C", copy=True)
    row_bytes = row * dtype.itemsize
    counts = np.zeros(p, dtype=np.int64)
    counts[r] = n0
    for step in range(1, p):
        dst, src = (r + step) % p, (r - step) % p
        mine = np.array([arrs[dst].shape[0], arrs[dst].nbytes], dtype=np.int64)
        got = np.zeros(2, dtype=np.int64)
        exchange(comm, mine, dst, got, src, TAG_ALLTOALLV)
        if got[1] != got[0] * row_bytes:
            raise ValueError(f"alltoallv: rank {src} sends {got[0]} rows in {got[1]} bytes to rank {r}, "
                             f"whose own block has rows of {row_bytes} bytes")
        counts[src] = got[0]
    bounds = np.zeros(p + 1, dtype=np.int64)
    np.cumsum(counts * row_bytes, out=bounds[1:])
    out = np.empty((int(counts.sum()),) + trailing, dtype=dtype)
    out_bytes = out.reshape(-1).view(np.uint8)
    out_bytes[bounds[r]:bounds[r + 1]] = _as_bytes(arrs[r])
    for step in range(1, p):
        dst, src = (r + step) % p, (r - step) % p
        exchange(comm, _as_bytes(arrs[dst]), dst, out_bytes[bounds[src]:bounds[src + 1]], src,
                 TAG_ALLTOALLV)
    return out


def bcast(comm, buf, root=0, algorithm="auto", check=None):
    """Broadcast an array from ``root``.

    Parameters
    ----------
    comm : native.comm.Communicator
    buf : ndarray
        On the root, the data. On other ranks a writeable C-contiguous array of the
        same shape and dtype, overwritten in place. Any fixed-size dtype.
    root : int
    algorithm : {"auto", "binomial", "scatter_allgather"}
        Binomial tree (``log2 p`` rounds of the whole buffer; small buffers) or
        scatter + ring allgather (about two buffers per rank; large buffers, many
        ranks). ``"auto"`` takes the cheaper under :func:`predicted_seconds`.
    check : bool, optional

    Returns
    -------
    ndarray
        ``buf`` (on the root a contiguous copy if ``buf`` was not contiguous).
    """
    _check_root(comm, root, "bcast")
    if comm.rank == root:
        buf = np.ascontiguousarray(buf)
    elif not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous \
            or not buf.flags.writeable:
        raise ValueError("bcast: non-root ranks must pass a writeable C-contiguous "
                         "ndarray of the root's shape and dtype")
    _require_fixed_size(buf, "bcast")
    _check_algorithm("bcast", algorithm, BCAST_ALGORITHMS)
    if algorithm == "auto":
        algorithm = costs.cheapest("bcast", ("binomial", "scatter_allgather"), buf.nbytes,
                                   comm.size)
    _begin(comm, "bcast", check, algorithm=algorithm, dtype=buf.dtype, n=buf.size,
           root=root)
    if comm.size > 1:
        run = binomial_bcast if algorithm == "binomial" else scatter_allgather_bcast
        run(comm, buf.reshape(-1).view(np.uint8), root)
    return buf


def bcast_object(comm, obj, root=0, check=None):
    """Broadcast a small picklable object from ``root``; returns it on every rank.

    Two binomial broadcasts: the pickle's length, then its bytes.
    """
    _check_root(comm, root, "bcast_object")
    _begin(comm, "bcast_object", check, root=root)
    if comm.size == 1:
        return obj
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if comm.rank == root else b""
    length = np.array([len(payload)], dtype=np.int64)
    binomial_bcast(comm, length, root)
    data = (np.frombuffer(payload, dtype=np.uint8).copy() if comm.rank == root
            else np.empty(int(length[0]), dtype=np.uint8))
    binomial_bcast(comm, data, root)
    return obj if comm.rank == root else pickle.loads(data.tobytes())


def allgather_object(comm, obj, check=None):
    """Gather one small picklable object per rank; returns the list in rank order."""
    _begin(comm, "allgather_object", check)
    p, r = comm.size, comm.rank
    if p == 1:
        return [obj]
    payload = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL),
                            dtype=np.uint8)
    lengths = np.empty(p, dtype=np.int64)
    bruck_allgather(comm, np.array([payload.size], dtype=np.int64), lengths)
    bounds = np.zeros(p + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    data = np.empty(int(bounds[-1]), dtype=np.uint8)
    data[bounds[r]:bounds[r + 1]] = payload
    ring_allgather(comm, data, bounds)
    return [pickle.loads(data[bounds[i]:bounds[i + 1]].tobytes()) for i in range(p)]


def allreduce_best(comm, records, rtol=0.0, n_keys=None, check=None):
    """Per row, the best record over ranks: maximum gain, ties to the smallest keys.

    Record layout: a float64 array of shape (n, k), k >= 1. Column 0 is the gain;
    columns 1..n_keys are tie-break keys compared lexicographically, smaller winning
    (histforest uses ``(gain, feature, bin, missing_left, ...)``, so ties go to the
    lowest feature, then lowest bin, then missing-right); the remaining columns are
    payload carried along with the winner (e.g. the split's left/right statistics).
    Row ``i`` of the result is the winner among the ranks' rows ``i``; rows on a
    rank that has no candidate should carry gain ``-inf``.

    The selection is exact: no arithmetic, so every rank returns the same bits
    whatever the reduction order (recursive doubling, ``log2 p`` small messages).
    NaN gains count as ``-inf`` and ``-0.0`` gains or keys as ``0.0`` (rewritten in
    the returned rows). Records whose gain (within ``rtol``) and keys all tie are
    ordered by the raw bits of all their columns, so the choice is a strict total
    order and hence the same on every rank.

    Parameters
    ----------
    comm : native.comm.Communicator
    records : array_like of float64, shape (n, k)
        Same shape on every rank. Key columns must not be NaN; payload may be.
    rtol : float, default 0.0
        Gains within ``rtol * max(|g1|, |g2|)`` of each other count as tied and are
        decided by the keys. With ``rtol > 0`` the result is still identical on all
        ranks, but may depend on the number of ranks (near-ties are not transitive).
    n_keys : int, optional
        Number of key columns after the gain (default: all ``k - 1``).
    check : bool, optional

    Returns
    -------
    ndarray of float64, shape (n, k)
    """
    rec = np.array(records, dtype=np.float64, order="C", copy=True)
    if rec.ndim != 2 or rec.shape[1] < 1:
        raise ValueError(f"allreduce_best: records must have shape (n, k>=1), got {rec.shape}")
    n, k = rec.shape
    n_keys = k - 1 if n_keys is None else int(n_keys)
    if not 0 <= n_keys <= k - 1:
        raise ValueError(f"allreduce_best: n_keys must be in 0..{k - 1}, got {n_keys}")
    if np.isnan(rec[:, 1:1 + n_keys]).any():
        raise ValueError("allreduce_best: tie-break key columns contain NaN")
    if rtol < 0:
        raise ValueError(f"allreduce_best: rtol must be >= 0, got {rtol}")
    gains = rec[:, 0]
    gains[np.isnan(gains)] = -np.inf
    rec[:, :1 + n_keys] += 0.0  # -0.0 -> +0.0: equal gains and keys get equal bits
    _begin(comm, "allreduce_best", check, algorithm="doubling", dtype=rec.dtype,
           n=rec.size, shape0=n, trailing=k)
    if comm.size == 1:
        return rec

    def combine(mine, theirs):
        a, b = mine.reshape(n, k), theirs.reshape(n, k)
        take_b = _better(b, a, rtol, n_keys)
        return np.where(take_b[:, None], b, a).reshape(-1)

    doubling_allreduce(comm, rec.reshape(-1), combine)
    return rec


def _better(a, b, rtol, n_keys):
    """Rows where record ``a`` strictly beats record ``b``. Shapes (n, k) -> (n,).

    A strict total order (antisymmetric for every pair of distinct rows), which is
    what makes the pairwise reduction commutative and so identical on all ranks.
    """
    ga, gb = a[:, 0], b[:, 0]
    if rtol > 0:
        with np.errstate(invalid="ignore"):
            tied = np.abs(ga - gb) <= rtol * np.maximum(np.abs(ga), np.abs(gb))
        tied |= ga == gb  # inf == inf
    else:
        tied = ga == gb
    better = ~tied & (ga > gb)
    decided = ~tied
    for j in range(1, 1 + n_keys):
        better |= ~decided & (a[:, j] < b[:, j])
        decided |= a[:, j] != b[:, j]
    # last resort: raw bits of every column (near-equal gains, payload)
    abits, bbits = a.view(np.int64), b.view(np.int64)
    for j in range(a.shape[1]):
        better |= ~decided & (abits[:, j] < bbits[:, j])
        decided |= abits[:, j] != bbits[:, j]
    return better


def global_row_offset(comm, n_local, check=None):
    """Position of this rank's rows in the global row order (ranks in order).

    Parameters
    ----------
    comm : native.comm.Communicator
    n_local : int
        Rows held by this rank (>= 0).

    Returns
    -------
    offset : int
        Global index of this rank's first row (rows of lower ranks come first).
    n_global : int
        Total rows over all ranks.
    """
    n_local = int(n_local)
    if n_local < 0:
        raise ValueError(f"global_row_offset: n_local must be >= 0, got {n_local}")
    _begin(comm, "global_row_offset", check)
    counts = np.empty(comm.size, dtype=np.int64)
    if comm.size == 1:
        counts[0] = n_local
    else:
        bruck_allgather(comm, np.array([n_local], dtype=np.int64), counts)
    return int(counts[:comm.rank].sum()), int(counts.sum())


def _check_root(comm, root, name):
    if not 0 <= int(root) < comm.size:
        raise ValueError(f"{name}: root {root} outside 0..{comm.size - 1}")


def _require_fixed_size(arr, name):
    if arr.dtype.hasobject:
        raise ValueError(f"{name}: object arrays cannot be sent as bytes; use "
                         "bcast_object / allgather_object")


def _as_bytes(arr):
    """Flat uint8 view (or contiguous copy) of an array's bytes."""
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)

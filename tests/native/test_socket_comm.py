"""The socket transport (issue 36): every collective over TCP ranks, bit for bit, and its failures.

Ranks are threads of this process, each with its own socket communicator over
loopback (``socket_world``), except where a test needs a process to die or stall:
those start real processes. The reference for the collectives is the same algorithm
on :class:`native.threads.ThreadWorld`, whose results the rest of the suite checks
against exact sums; here the socket ranks must give the same bits.
"""
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from native import collectives as col
from native import topology
from native.comm import SelfCommunicator, use_world, world
from native.errors import CollectiveMismatchError
from native.fusion import fused_allreduce
from native.rendezvous import Listener, RendezvousError, RendezvousTimeout
from native.socket_comm import (CommunicatorAborted, PeerLostError, SocketCommunicator, TransportTimeout, connect,
                                loopback_world_endpoints)
from native.threads import ThreadWorld
from socket_world import run_ok, run_socket_world

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def data(rank, n, dtype):
    rng = np.random.default_rng([36, rank, n])
    if np.dtype(dtype).kind == "i":
        return rng.integers(-2**40, 2**40, n).astype(dtype)
    return (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)).astype(dtype)


def every_collective(comm):
    """One call of every public collective (and algorithm) on rank-dependent data."""
    p, r = comm.size, comm.rank
    out = []
    for n in (0, 1, p + 3, 70_001):
        for alg in ("ring", "rabenseifner", "doubling", "direct", "auto"):
            out.append(col.allreduce(comm, data(r, n, np.float64), algorithm=alg))
        out.append(col.allreduce(comm, data(r, n, np.int64), algorithm="auto", check=True))
    for alg in ("ring", "halving", "direct", "auto"):
        out.append(col.reduce_scatter(comm, data(r, 3 * p + 1, np.float64).reshape(-1, 1), algorithm=alg))
    out.append(col.reduce_scatter(comm, data(r, 40, np.float32).reshape(4, 10), axis=1))
    for alg in ("ring", "bruck"):
        out.append(col.allgather(comm, np.array([r, -r, 7 * r]), algorithm=alg))
    out.append(col.allgatherv(comm, np.full((r % 3, 2), r)))
    out.append(col.alltoallv(comm, [np.arange(q + r, dtype=np.int32) for q in range(p)]))
    root = p - 1
    for alg in ("binomial", "scatter_allgather"):
        buf = data(root, 1001, np.float64) if r == root else np.zeros(1001)
        out.append(col.bcast(comm, buf, root=root, algorithm=alg))
    out.append(col.bcast_object(comm, {"root": r, "x": [1, 2]} if r == root else None, root=root))
    out.append(col.allgather_object(comm, ("rank", r)))
    rec = np.array([[float(r % 3), float(p - r), 0.0], [-np.inf, float(r), 1.0]])
    out.append(col.allreduce_best(comm, rec))
    out.append(col.global_row_offset(comm, r + 1))
    out.append(fused_allreduce(comm, [np.full(3, r), np.full((2, 2), 1.0 * r)], threshold_bytes=16))
    if p > 1:  # two (pseudo-)nodes: the hierarchical algorithms
        with topology.use(comm, [q * 2 // p for q in range(p)]):
            out.append(col.allreduce(comm, data(r, 5001, np.float64), algorithm="hierarchical"))
            out.append(col.reduce_scatter(comm, data(r, 5001, np.float64), algorithm="hierarchical"))
    comm.barrier()
    return out


def as_bytes(value):
    """A value's exact content, for bitwise comparison of nested results."""
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(as_bytes(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, as_bytes(v)) for k, v in value.items()))
    return repr(value)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_every_collective_is_bitwise_the_thread_worlds(p):
    over_sockets = run_ok(p, every_collective)
    reference = ThreadWorld(p).run(every_collective)
    for r in range(p):
        assert as_bytes(over_sockets[r]) == as_bytes(reference[r]), f"rank {r} of {p}"
    # and the sums are the sums: int64 exactly
    n = p + 3
    ints = over_sockets[0][2 * 6 + 5]
    np.testing.assert_array_equal(ints, sum(data(q, n, np.int64) for q in range(p)))


def test_large_messages_both_ways_at_once_do_not_deadlock():
    # Each rank sends 24 MiB to the other with a blocking send before receiving: with
    # blocking TCP writes this deadlocks once both kernel buffers are full.
    n = 3 << 20

    def body(comm):
        other = 1 - comm.rank
        comm.send(np.full(n, comm.rank, dtype=np.float64), other, tag=5)
        got = np.empty(n)
        comm.recv(got, other, tag=5)
        return got[[0, -1]]

    out = run_ok(2, body)
    assert out[0].tolist() == [1.0, 1.0] and out[1].tolist() == [0.0, 0.0]


def test_messages_of_one_tag_keep_their_order_and_tags_do_not_mix():
    def body(comm):
        if comm.rank == 0:
            for k in range(5):
                comm.send(np.array([k]), 1, tag=1)
            comm.send(np.array([99]), 1, tag=2)
            return None
        late = np.empty(1, dtype=np.int64)
        comm.recv(late, 0, tag=2)  # the later tag first: tag 1's frames wait, in order
        got = []
        for _ in range(5):
            buf = np.empty(1, dtype=np.int64)
            comm.recv(buf, 0, tag=1)
            got.append(int(buf[0]))
        return int(late[0]), got

    assert run_ok(2, body)[1] == (99, [0, 1, 2, 3, 4])


def test_check_mode_mismatch_raises_on_every_rank():
    def body(comm):
        try:
            col.allreduce(comm, np.ones(5 if comm.rank == 2 else 4), check=True)
        except CollectiveMismatchError as exc:
            return str(exc)
        return "no error"

    messages = run_ok(3, body)
    assert all("n=5" in m and "rank 2" in m for m in messages), messages


def test_a_wait_longer_than_the_timeout_raises_naming_the_peer():
    def body(comm):
        if comm.rank == 1:
            time.sleep(1.5)  # never sends
            return None
        start = time.monotonic()
        with pytest.raises(TransportTimeout, match=r"rank 0 waited .* for rank\(s\) \[1\]"):
            comm.recv(np.empty(3), 1, tag=4)
        return time.monotonic() - start

    results, errors = run_socket_world(2, body, timeout=0.5)
    assert errors == [None, None], errors
    assert 0.5 <= results[0] < 1.4


@pytest.mark.parametrize("bad, match", [(["localhost", "127.0.0.1:1"], "not 'host:port'"),
                                        (["127.0.0.1:1", "127.0.0.1:70000"], "not 'host:port'"),
                                        ([":5000", "127.0.0.1:1"], "not 'host:port'")])
def test_malformed_endpoints_are_refused(bad, match):
    with pytest.raises(RendezvousError, match=match):
        SocketCommunicator.from_endpoints(bad, 1 if bad[0] == "localhost" else 0, connect_timeout=1)


def test_a_rank_out_of_range_is_refused():
    with pytest.raises(RendezvousError, match="rank 2 is not in 0..1"):
        SocketCommunicator.from_endpoints(["127.0.0.1:1", "127.0.0.1:2"], 2)


def test_an_endpoint_nobody_listens_at_times_out_with_its_address():
    dead = Listener("127.0.0.1", 0)
    dead_address = dead.address
    dead.close()  # nothing listens there now
    own = Listener("127.0.0.1", 0)
    start = time.monotonic()
    with pytest.raises(RendezvousTimeout, match=f"rank 1 could not connect to rank 0 at {dead_address}"):
        connect(own, [dead_address, own.address], 1, connect_timeout=1.0)
    assert time.monotonic() - start < 5


def test_a_rank_that_never_connects_times_out_naming_it():
    listeners, endpoints = loopback_world_endpoints(2)
    listeners[1].close()
    with pytest.raises(RendezvousTimeout, match=r"rank 0 .* waited 1 s for rank 1 \(127\.0\.0\.1:\d+\)"):
        connect(listeners[0], endpoints, 0, connect_timeout=1.0)


def test_endpoint_lists_in_another_order_are_refused():
    listeners, endpoints = loopback_world_endpoints(3)
    errors = [None] * 3
    swapped = [endpoints[1], endpoints[0], endpoints[2]]  # rank 2's list has ranks 0 and 1 swapped

    def body(r, eps):
        try:
            connect(listeners[r], eps, r, connect_timeout=3.0)
        except (RendezvousError, RendezvousTimeout) as exc:
            errors[r] = exc

    threads = [threading.Thread(target=body, args=(r, swapped if r == 2 else endpoints)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert isinstance(errors[2], RendezvousError) and "same rank order everywhere" in str(errors[2]), errors
    assert isinstance(errors[1], RendezvousError) and "refused a connection from rank 2" in str(errors[1]), errors


def test_one_endpoint_for_two_ranks_is_refused():
    listener = Listener("127.0.0.1", 0)
    with pytest.raises(RendezvousError, match="given for rank 0 and rank 1"):
        connect(listener, [listener.address, listener.address], 0)


def test_strangers_on_the_port_are_ignored():
    import socket

    listeners, endpoints = loopback_world_endpoints(2)
    host, port = endpoints[0].rsplit(":", 1)
    stranger = socket.create_connection((host, int(port)))
    stranger.sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 64)
    out = [None, None]

    def body(r):
        comm = connect(listeners[r], endpoints, r, connect_timeout=10.0)
        out[r] = col.allreduce(comm, np.array([r + 1.0]))
        comm.close()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stranger.close()
    assert [o.tolist() for o in out] == [[3.0], [3.0]]


def test_an_orderly_close_is_not_taken_for_a_crash():
    # Rank 0 sends and leaves at once; rank 1 reads the message later, after rank 0's
    # goodbye and the end of its stream have arrived.
    def body(comm):
        if comm.rank == 0:
            comm.send(np.arange(1000.0), 1, tag=3)
            return None
        time.sleep(0.5)
        buf = np.empty(1000)
        comm.recv(buf, 0, tag=3)
        return buf.sum()

    assert run_ok(2, body)[1] == np.arange(1000.0).sum()


def test_waiting_for_a_rank_that_closed_raises():
    def body(comm):
        if comm.rank == 0:
            return None  # closes without the message rank 1 waits for
        with pytest.raises(PeerLostError, match="rank 0 closed its communicator"):
            comm.recv(np.empty(1), 0, tag=3)
        return "raised"

    assert run_ok(2, body)[1] == "raised"


def test_abort_raises_here_and_on_every_peer_with_its_message():
    def body(comm):
        if comm.rank == 1:
            time.sleep(0.2)
            with pytest.raises(CommunicatorAborted, match="boom"):
                comm.abort("boom")
            return "aborted"
        with pytest.raises(PeerLostError, match="rank 1 aborted .*boom"):
            col.allreduce(comm, np.ones(10))
        return "told"

    results, errors = run_socket_world(3, body)
    assert errors == [None] * 3 and results == ["told", "aborted", "told"], errors


def test_use_world_hands_the_communicator_to_world():
    comm = SelfCommunicator()
    before = world()
    with use_world(comm) as installed:
        assert installed is comm and world() is comm
    assert world() is before


# ------------------------------------------------------------------ real processes

RANK_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from native import collectives as col, watchdog
    from native.socket_comm import SocketCommunicator
    endpoints, rank, mode = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3]
    comm = SocketCommunicator.from_endpoints(endpoints, rank, token=b"proc", connect_timeout=60)
    dog = watchdog.start(comm) if mode == "stall" else None
    start = time.monotonic()
    try:
        for step in range(100000):
            if rank == 1 and step == 3:
                if mode == "die":
                    os._exit(7)
                time.sleep(60)  # stalled: alive, no CPU, outside the transport
            col.allreduce(comm, np.ones(100000) * rank)
    except Exception as exc:
        print(f"RESULT {type(exc).__name__} after {time.monotonic() - start:.2f} s: {exc}", flush=True)
        comm.close(reason=f"{type(exc).__name__}: {exc}")  # as forest.distributed does: say why
        sys.exit(3)
""")


def _processes(size, mode, env_extra=None):
    import socket

    ports = []
    socks = []
    for _ in range(size):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    endpoints = ",".join(f"127.0.0.1:{p}" for p in ports)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
               NUMBA_NUM_THREADS="1", **(env_extra or {}))
    return [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT, endpoints, str(r), mode], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(size)]


def test_a_killed_rank_ends_every_other_rank_at_once():
    procs = _processes(3, "die")
    outs = [p.communicate(timeout=60) for p in procs]
    assert procs[1].returncode == 7
    for r in (0, 2):
        assert procs[r].returncode == 3, outs[r]
        line = [x for x in outs[r][0].splitlines() if x.startswith("RESULT")][0]
        assert "PeerLostError" in line and "rank 1" in line, line
        assert float(line.split(" after ")[1].split(" s")[0]) < 10, line


def test_the_watchdog_runs_over_sockets_and_ends_a_stall():
    env = {"HISTFOREST_WATCHDOG_PROBE": "0.5", "HISTFOREST_WATCHDOG_STALL": "2",
           "HISTFOREST_WATCHDOG_SILENT": "30"}
    procs = _processes(2, "stall", env)
    try:
        out, err = procs[0].communicate(timeout=45)
    finally:
        procs[1].kill()
        procs[1].communicate()
    assert procs[0].returncode == 3, (out, err)
    line = [x for x in out.splitlines() if x.startswith("RESULT")][0]
    assert "CommunicatorAborted" in line and "rank 1 is stalled" in line, line
    assert float(line.split(" after ")[1].split(" s")[0]) < 15, line


# --------------------------------------------------------------- under mpirun

@pytest.mark.mpi
def test_sockets_beside_mpi_give_the_same_bits(comm):
    """Under mpirun -np K: a socket world over the same ranks, endpoints exchanged through MPI."""
    listener = Listener("127.0.0.1", 0)
    endpoints = col.allgather_object(comm, listener.address)
    sock = connect(listener, endpoints, comm.rank, token=b"mpi-test", connect_timeout=60)
    try:
        x = data(comm.rank, 100_003, np.float64)
        pairs = [(col.allreduce(comm, x, algorithm=a), col.allreduce(sock, x, algorithm=a))
                 for a in ("ring", "rabenseifner", "direct", "auto")]
        gathered = col.allgatherv(sock, np.arange(comm.rank + 1))
        sock.barrier()
    finally:
        sock.close()
    for over_mpi, over_sockets in pairs:
        assert over_mpi.tobytes() == over_sockets.tobytes()
    np.testing.assert_array_equal(gathered, np.concatenate([np.arange(q + 1) for q in range(comm.size)]))

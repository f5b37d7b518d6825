"""Same-machine paths of the socket transport (native.shm_link): single copy and slot rings.

Every path (single copy from the sender's memory, shared-memory slots, plain TCP) must
give the thread world's bits for every collective, keep MPI's matching order, survive
ranks that all send before they receive, raise (not hang) when a peer dies in the
middle of a large message, and leave nothing in ``/dev/shm``.
"""
import os
import socket
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from native import collectives as col
from native import shm_link
from native.socket_comm import connect, loopback_world_endpoints
from native.threads import ThreadWorld
from socket_world import run_ok
from test_socket_comm import as_bytes, every_collective

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# "auto": single copy from 4 MiB, slots below; "single_copy": from 64 KiB (the threshold
# lowered in this process, so that every collective's large messages take it).
PATHS = {"auto": {}, "single_copy": {}, "slots": {"HISTFOREST_SOCKET_CMA": "0"},
         "tcp": {"HISTFOREST_SOCKET_SHM": "0"}}


def _leftovers():
    return sorted(n for n in os.listdir(shm_link.SHM_DIR) if n.startswith("histforest-")) \
        if os.path.isdir(shm_link.SHM_DIR) else []


@pytest.fixture(params=sorted(PATHS))
def path(request, monkeypatch):
    for k in ("HISTFOREST_SOCKET_CMA", "HISTFOREST_SOCKET_SHM"):
        monkeypatch.delenv(k, raising=False)
    for k, v in PATHS[request.param].items():
        monkeypatch.setenv(k, v)
    if request.param in ("auto", "single_copy") and not shm_link.single_copy_enabled():
        pytest.skip("process_vm_readv is not available")
    if request.param == "single_copy":
        monkeypatch.setattr(shm_link, "SINGLE_COPY_MIN_BYTES", shm_link.SHM_MIN_BYTES)
    before = _leftovers()
    yield request.param
    assert _leftovers() == before, "a segment was left in /dev/shm"


def _kind(link):
    if link.lend and link.read_pid is not None and link.shm_out is not None and link.shm_in is not None:
        return "single_copy"
    if link.shm_out is not None and link.shm_in is not None:
        return "slots"
    if link.lend or link.read_pid is not None or link.shm_out is not None or link.shm_in is not None:
        return "mixed"
    return "tcp"


def test_the_configured_path_is_taken_and_nothing_stays_in_dev_shm(path):
    def body(comm):
        comm.barrier()  # every rank connected: every segment already unlinked
        names = _leftovers()
        return [_kind(link) for link in comm._links.values()], names

    for kinds, names in run_ok(3, body):
        assert kinds == [path if path != "auto" else "single_copy"] * 2
        assert names == []


@pytest.mark.parametrize("p", [2, 3])
def test_every_collective_is_bitwise_the_thread_worlds_on_each_path(path, p):
    over_sockets = run_ok(p, every_collective)
    reference = ThreadWorld(p).run(every_collective)
    for r in range(p):
        assert as_bytes(over_sockets[r]) == as_bytes(reference[r]), f"rank {r} of {p} ({path})"


def test_large_sends_before_receives_complete_on_each_path(path):
    # Both ranks send 8 MiB before either receives: the single-copy path holds the
    # message in the sender's memory HOLD_S, then copies it; the slots path copies
    # eagerly. Neither may deadlock.
    n = 1 << 20

    def body(comm):
        other = 1 - comm.rank
        comm.send(np.arange(n, dtype=np.float64) + comm.rank, other, tag=5)
        got = np.empty(n)
        comm.recv(got, other, tag=5)
        return got

    out = run_ok(2, body)
    np.testing.assert_array_equal(out[0], np.arange(n) + 1.0)
    np.testing.assert_array_equal(out[1], np.arange(n) + 0.0)


def test_large_and_small_messages_keep_their_order_per_tag(path):
    n = 50_000  # 400 KB: over the same-machine threshold

    def body(comm):
        if comm.rank == 0:
            reqs = [comm.isend(np.full(n, k, dtype=np.int64), 1, tag=1) for k in range(3)]
            reqs.append(comm.isend(np.array([3]), 1, tag=1))
            reqs.append(comm.isend(np.full(n, 99, dtype=np.int64), 1, tag=2))
            reqs.append(comm.isend(np.full(n, 4, dtype=np.int64), 1, tag=1))
            comm._wait(reqs, None)
            return None
        late = np.empty(n, dtype=np.int64)
        comm.recv(late, 0, tag=2)  # the later tag first: tag 1's messages wait, in order
        got = []
        for size in (n, n, n, 1, n):
            buf = np.empty(size, dtype=np.int64)
            comm.recv(buf, 0, tag=1)
            assert (buf == buf[0]).all()
            got.append(int(buf[0]))
        return int(late[0]), got

    assert run_ok(2, body)[1] == (99, [0, 1, 2, 3, 4])


def test_drain_releases_a_message_still_in_the_senders_memory(path):
    tag = 777

    def body(comm):
        if comm.rank == 0:
            req = comm.isend(np.ones(100_000), 1, tag=tag)
            comm._wait([req], (1,))  # completes once rank 1 has dropped it
            comm.barrier()
            return "sent"
        while comm.service_probe(tag) is None:
            pass
        dropped = comm.drain(tag)
        comm.barrier()
        return dropped

    assert run_ok(2, body) == ["sent", 1]


def test_ranks_on_other_machines_use_tcp():
    a, b = socket.socketpair()
    out = {}

    def side(rank, sock):
        out[rank] = shm_link.setup({1 - rank: sock}, rank, ["host-a", "host-b"], want=True, timeout=10)

    threads = [threading.Thread(target=side, args=(r, s)) for r, s in ((0, a), (1, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    a.close()
    b.close()
    assert out == {0: {}, 1: {}}


def test_a_segment_that_cannot_be_mapped_falls_back_to_tcp(monkeypatch):
    # E.g. containers on one host with private /dev/shm: the cookie check fails.
    monkeypatch.setenv("HISTFOREST_SOCKET_CMA", "0")
    monkeypatch.delenv("HISTFOREST_SOCKET_SHM", raising=False)
    monkeypatch.setattr(shm_link, "_map_peer", lambda *args: None)
    before = _leftovers()

    def body(comm):
        x = np.arange(200_000, dtype=np.float64) * (comm.rank + 1)
        from native import collectives as col
        return [_kind(link) for link in comm._links.values()], col.allreduce(comm, x, algorithm="ring")

    out = run_ok(2, body)
    assert [k for k, _ in out] == [["tcp"], ["tcp"]]
    np.testing.assert_array_equal(out[0][1], np.arange(200_000) * 3.0)
    assert _leftovers() == before


# ------------------------------------------------------------------ real processes

DIE_SCRIPT = textwrap.dedent("""
    import os, sys, time
    import numpy as np
    from native.socket_comm import SocketCommunicator
    endpoints, rank, mode = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3]
    comm = SocketCommunicator.from_endpoints(endpoints, rank, token=b"die", connect_timeout=60)
    n = 8 << 20  # 64 MiB: many slots' worth
    start = time.monotonic()
    try:
        if rank == 1:
            if mode == "sender_dies":
                req = comm.isend(np.ones(n), 0, tag=3)
            for _ in range(2):  # some of the message moves (slots, TCP), not all of it
                comm.service_probe(3)
                time.sleep(0.005)
            os._exit(7)
        if mode == "receiver_dies":
            # Raises here if the receiver died mid-transfer; the slots (like TCP's kernel
            # buffers) may also have taken the rest before it died, which completes
            # the send: then the answer that never comes raises.
            comm.send(np.ones(n), 1, tag=3)
            comm.recv(np.empty(1), 1, tag=4)
        else:
            time.sleep(1.0)  # the sender is gone before the receive asks for the rest
            comm.recv(np.empty(n), 1, tag=3)
        print("RESULT completed", flush=True)
    except Exception as exc:
        print(f"RESULT {type(exc).__name__} after {time.monotonic() - start:.2f} s: {exc}", flush=True)
        sys.exit(3)
""")


def _free_endpoints(size):
    socks = []
    for _ in range(size):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ",".join(f"127.0.0.1:{p}" for p in ports)


@pytest.mark.parametrize("mode", ["receiver_dies", "sender_dies"])
def test_a_peer_killed_mid_transfer_raises_instead_of_hanging(path, mode):
    endpoints = _free_endpoints(2)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]),
               NUMBA_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-c", DIE_SCRIPT, endpoints, str(r), mode], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode == 7, outs[1]
    assert procs[0].returncode == 3, outs[0]
    line = [x for x in outs[0][0].splitlines() if x.startswith("RESULT")][0]
    assert "PeerLostError" in line and "rank 1" in line, line
    assert float(line.split(" after ")[1].split(" s")[0]) < 10, line


def test_two_worlds_interleaved_never_wait_on_each_other(path):
    # Each rank alternates collectives on two socket worlds (as bench_socket does with
    # MPI and sockets): a rank that leaves one world for the other must already have
    # answered every message it read there ("read" and slot credits), or the ranks still
    # waiting for those answers in the first world never reach the second.
    p = 3
    worlds = [loopback_world_endpoints(p) for _ in range(2)]
    results, errors = [None] * p, [None] * p

    def body(r):
        comms = []
        try:
            comms = [connect(lst[r], ends, r, token=b"w%d" % k, timeout=30) for k, (lst, ends) in enumerate(worlds)]
            out = []
            for n in (3 << 20, 1 << 17, 3 << 20, 1 << 17):  # 24 MiB (single copy), 1 MiB (slots)
                x = np.arange(n, dtype=np.float64) * (r + 1)
                for comm in comms:
                    out.append(col.allreduce(comm, x, algorithm="ring")[[0, 1, -1]])
            results[r] = out
        except BaseException as exc:
            errors[r] = exc
        finally:
            for comm in comms:
                comm.close()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(p)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert errors == [None] * p, errors
    for r in range(p):
        for got in results[r]:
            n1 = got[2] / 6
            np.testing.assert_array_equal(got, [0.0, 6.0, 6.0 * n1])


def test_a_read_answered_before_the_receiver_turns_to_another_world(monkeypatch):
    # Rank 1 takes a lent message that arrived before its receive (read at the receive,
    # which completes at once), then works in a second world: its "read" must already
    # be on the way, or rank 0, still waiting for it in the first world, never comes.
    if not shm_link.single_copy_enabled():
        pytest.skip("process_vm_readv is not available")
    for k in ("HISTFOREST_SOCKET_CMA", "HISTFOREST_SOCKET_SHM"):
        monkeypatch.delenv(k, raising=False)
    worlds = [loopback_world_endpoints(2) for _ in range(2)]
    n = 1 << 20  # 8 MiB: single copy
    errors = [None, None]

    def body(r):
        comms = []
        try:
            comms = [connect(lst[r], ends, r, token=b"x%d" % k, timeout=10) for k, (lst, ends) in enumerate(worlds)]
            first, second = comms
            assert first._links[1 - r].lend
            if r == 0:
                first.send(np.ones(n), 1, tag=4)
                second.recv(np.empty(1), 1, tag=4)
            else:
                while first.service_probe(4) is None:  # the announcement is read, the bytes wait
                    pass
                first.recv(np.empty(n), 0, tag=4)
                second.send(np.ones(1), 0, tag=4)
                second.barrier()  # leaves the first world alone until rank 0 is done with it
            if r == 0:
                second.barrier()
        except BaseException as exc:
            errors[r] = exc
        finally:
            for comm in comms:
                comm.close()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "deadlock"
    assert errors == [None, None], errors


class _FailingWrites:
    """A socket whose writes fail as to a peer that aborted and closed; reads go through."""

    def __init__(self, sock):
        self._sock = sock

    def recv_into(self, view):
        return self._sock.recv_into(view)

    def send(self, data):
        raise BrokenPipeError(32, "Broken pipe")

    sendmsg = send


def test_a_failed_credit_write_after_the_last_slot_keeps_the_next_message_readable():
    """The last slot of a message is copied, handing the slot back fails (the peer closed),
    and reading what the peer left meets its next message's header: that is a message,
    not a protocol error (a survivor once raised TransportError here while closing)."""
    from native.socket_comm import _CHUNK, _HEADER, _SHMDATA, _Link

    class _Path:
        ring_out, read_pid, pidfd, lend = None, None, None, False
        ring_in = shm_link.Ring(memoryview(bytearray(4096 + 2 * 64)), 0, 2, 64)

    mine, theirs = socket.socketpair()
    try:
        link = _Link(1, mine, _Path())
        payload = bytes(range(40))
        link._start(_SHMDATA, 5, len(payload))
        _Path.ring_in.slots[0][:len(payload)] = payload
        theirs.sendall(_HEADER.pack(_SHMDATA, 6, 100))  # the peer's next message, then it leaves
        theirs.close()
        link.sock = _FailingWrites(mine)
        link._start(_CHUNK, 0, len(payload))
        assert bytes(link.unexpected[5][0]) == payload
        assert link._shm_cur is not None and link._shm_cur[1] == 6
        assert link.state == "lost"
    finally:
        mine.close()
        theirs.close()

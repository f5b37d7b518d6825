"""The default watchdog: a rank that dies or stalls turns into a job-wide error, not a hang.

Under ``mpirun`` every rank of the world communicator runs a small daemon thread
(:func:`start`, called by :func:`native.comm.world`). The main thread's blocking MPI
calls note whom they wait for (:class:`native.activity.Activity`: two attribute writes
per message); the watchdog thread looks at that note every :data:`TICK_S` seconds and,
while no wait has lasted long, only answers its peers' questions.

What "stalled" means
--------------------
A collective may legitimately wait a long time: for a rank that builds a bigger
histogram, grows more subtrees, reads its row groups from a slow disk, or writes the
model file. A bound on the wait alone would either fire in healthy long jobs or be
useless. So a rank that has waited :data:`ENV_PROBE` seconds (default 10) for a peer
*asks the peer* (a tiny message to the peer's watchdog thread, which answers even
while its main thread computes) and decides from the answer:

- the peer is blocked in a collective of the same call number but another operation
  (say a broadcast where this rank is in an allreduce) and still there when asked
  again: the ranks disagree on the order of collectives and can never meet: error
  after about two probe intervals (check mode, ``HISTFOREST_CHECK_COLLECTIVES``, also
  catches disagreements on sizes);
- the peer is outside MPI and its process used almost no CPU time (under 1% of the
  interval) for :data:`ENV_STALL` seconds (default 120): it is stuck (sleeping,
  blocked on a dead file system, deadlocked on a lock): error. A peer that computes,
  however long, burns CPU time and is waited for without limit;
- the peer is blocked in any other collective: it waits for someone else, whose own
  neighbours will judge it; keep waiting;
- the peer does not answer for :data:`ENV_SILENT` seconds (default 600): its process
  is frozen (``SIGSTOP``, a hung node) or dead, or it has held the Python interpreter
  in one compiled call (Numba kernels keep the GIL) for that long: error. A dead
  rank is usually noticed much sooner: ``mpirun`` (Hydra) ends the whole job within
  about a second when one of its processes is killed.

The error is raised where it is found: that rank prints one line naming both ranks,
the collective and the setting to change, and aborts the job (``MPI_Abort``), which
ends every rank at once; a blocked MPI call cannot be interrupted any other way.

Settings (environment, the same on every rank): ``HISTFOREST_WATCHDOG=0`` turns it
off; ``HISTFOREST_WATCHDOG_PROBE``, ``HISTFOREST_WATCHDOG_STALL``,
``HISTFOREST_WATCHDOG_SILENT`` are the three bounds in seconds. The bound on a stall
is about PROBE + STALL seconds, on a frozen or dead peer PROBE + SILENT. Check mode
(``HISTFOREST_CHECK_COLLECTIVES``) still has its own handshake deadline.

The cost is what a healthy fit pays: the notes on every blocking call and a thread
that wakes four times a second to probe for questions
(``benchmarks/bench_watchdog.py`` measures it in the GBDT fit).
"""
import atexit
import threading
import time

import numpy as np

from .activity import Activity
from .check import OPS
from .settings import flag, positive_number

ENV = "HISTFOREST_WATCHDOG"
ENV_PROBE = "HISTFOREST_WATCHDOG_PROBE"
ENV_STALL = "HISTFOREST_WATCHDOG_STALL"
ENV_SILENT = "HISTFOREST_WATCHDOG_SILENT"
DEFAULTS = {ENV_PROBE: 10.0, ENV_STALL: 120.0, ENV_SILENT: 600.0}

#: Seconds between two looks of the watchdog thread.
TICK_S = 0.25
#: A stalled peer used less CPU time than this share of the wall time.
IDLE_CPU_SHARE = 0.01

TAG_QUERY = 931
TAG_REPLY = 932

#: Reply layout: float64 fields.
_FIELDS = ("nonce", "seq", "op", "blocked", "token", "cpu", "wall")


def enabled():
    """False when ``HISTFOREST_WATCHDOG`` is 0/false/no/off."""
    return flag(ENV, True)


def setting(name):
    """One of the bounds, in seconds (environment, else :data:`DEFAULTS`)."""
    return positive_number(name, DEFAULTS[name], unit="a number of seconds")


def _op_code(op):
    return OPS.index(op) if op in OPS else -1


def _op_name(code):
    return OPS[int(code)] if 0 <= int(code) < len(OPS) else "-"


class _Peer:
    """What this rank has learned about one peer while waiting for it."""

    def __init__(self):
        self.request = None          # pending reply receive
        self.reply = np.zeros(len(_FIELDS))
        self.asked_at = None
        self.first = None            # (time, reply) when the current judgement began
        self.last = None


class Watchdog:
    """The watchdog thread of one communicator (see the module docstring).

    Parameters
    ----------
    comm : native.comm.MPICommunicator
        The communicator whose blocking calls are watched. Constructing a watchdog
        is collective over it: the questions and answers travel on a private
        duplicate (:meth:`~native.comm.MPICommunicator.private_channel`), so none
        is ever left unreceived on the data communicator.
    probe, stall, silent : float
        The three bounds in seconds.
    """

    def __init__(self, comm, probe, stall, silent):
        self.comm = comm
        self.channel = comm.private_channel()
        self.probe = probe
        self.stall = stall
        self.silent = silent
        self.activity = Activity()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="histforest-watchdog", daemon=True)
        self._peers = {}
        self._nonce = 0
        self._waiting = None  # (token, since)
        self._own_cpu = 0.0
        self._out = []        # replies being sent (kept alive until complete)

    def start(self):
        self.comm.activity = self.activity
        self._thread.start()
        return self

    def stop(self):
        """Stop the thread and withdraw its pending receives (before MPI is finalised)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5 * TICK_S + 1.0)
        for peer in self._peers.values():
            if peer.request is not None:
                try:
                    self.channel.cancel_recv(peer.request)
                except Exception:  # finalisation races: nothing left to protect
                    pass
                peer.request = None
        try:
            # Tidy what can be tidied without waiting for anyone: questions and answers
            # that already arrived, then the channel itself. A peer's message still in
            # flight may arrive later; it lands on the freed duplicate, where MPI
            # drops it, not on the data communicator that MPI_Finalize checks.
            for tag in (TAG_QUERY, TAG_REPLY):
                self.channel.drain(tag)
            for req, _ in self._out:
                req.Free()  # a send completes in the background; nothing waits for it
            self._out = []
            self.channel.close()
        except Exception:  # finalisation races: nothing left to protect
            pass
        self.comm.activity = None

    # ------------------------------------------------------------------ the thread
    def _run(self):
        while not self._stop.wait(TICK_S):
            try:
                self._own_cpu = time.thread_time()
                self._answer()
                self._watch()
            except Exception as exc:  # the watchdog must never take a healthy job down
                if self._stop.is_set():
                    return
                self._report_broken(exc)
                return

    def _state(self, nonce):
        act = self.activity
        cpu = time.process_time() - self._own_cpu  # the main (and kernel) threads' CPU
        return np.array([nonce, act.seq, _op_code(act.op), act.peers is not None, act.token, cpu,
                         time.monotonic()], dtype=np.float64)

    def _answer(self):
        while True:
            src = self.channel.service_probe(TAG_QUERY)
            if src is None:
                break
            query = np.zeros(1, dtype=np.float64)
            self.channel.service_recv(query, src, TAG_QUERY)
            reply = self._state(query[0])
            self._out.append((self.channel.isend(reply, src, TAG_REPLY), reply))
        self._out = [(req, buf) for req, buf in self._out if not self.channel.test_all([req])]

    def _watch(self):
        act = self.activity
        peers, token = act.peers, act.token
        now = time.monotonic()
        if peers is None:
            self._waiting = None
            return
        if self._waiting is None or self._waiting[0] != token:
            self._waiting = (token, now)
            for peer in self._peers.values():
                peer.first = peer.last = None
            return
        waited = now - self._waiting[1]
        if waited < self.probe:
            return
        targets = range(self.comm.size) if peers == (-1,) else peers
        for q in targets:
            if q != self.comm.rank:
                self._judge(q, now, waited)

    def _judge(self, q, now, waited):
        peer = self._peers.setdefault(q, _Peer())
        if peer.request is not None and self.channel.test_all([peer.request]):
            peer.request = None
            reply = peer.reply.copy()
            if peer.first is None:
                peer.first = (now, reply)
            peer.last = (now, reply)
            self._verdict(q, peer, now, waited)
        if peer.request is None and (peer.asked_at is None or now - peer.asked_at >= min(self.probe, 1.0)):
            self._nonce += 1
            peer.request = self.channel.irecv(peer.reply, q, TAG_REPLY)
            query = np.array([float(self._nonce)])
            self._out.append((self.channel.isend(query, q, TAG_QUERY), query))
            peer.asked_at = now
        elif peer.request is not None and now - peer.asked_at >= self.silent:
            self._fail(f"rank {q} has not answered the watchdog for {now - peer.asked_at:.0f} s while "
                       f"rank {self.comm.rank} waits for it in {self._where()}: its process is frozen or "
                       f"dead (or has held the interpreter in one compiled call that long)", ENV_SILENT)

    def _verdict(self, q, peer, now, waited):
        act = self.activity
        t0, first = (peer.first[0], dict(zip(_FIELDS, peer.first[1])))
        last = dict(zip(_FIELDS, peer.last[1]))
        seq, op = int(last["seq"]), _op_name(last["op"])
        if last["blocked"]:
            # Another operation under the same call number: the ranks disagree on the
            # collectives and never meet. Another number proves nothing: a peer ahead
            # of us has received what we owed it and now waits in its next collective
            # (we wait for someone else), a peer behind us waits for a third rank
            # whose own neighbours judge it.
            disagree = seq == act.seq and op != act.op
            if not disagree:
                peer.first = None
            elif first["token"] == last["token"] and now - t0 >= self.probe:
                self._fail(f"rank {self.comm.rank} waits in {self._where()} for rank {q}, which has waited "
                           f"in its collective #{seq} ({op}) for over {self.probe:g} s: the ranks called "
                           "different collectives and can never meet", ENV_PROBE)
            return
        if first["token"] != last["token"] or first["blocked"]:
            peer.first = peer.last  # it got somewhere in MPI since: start over
            return
        span = last["wall"] - first["wall"]
        cpu = last["cpu"] - first["cpu"]
        if span < self.stall:
            return
        if cpu < IDLE_CPU_SHARE * span:
            self._fail(f"rank {q} is stalled: outside MPI for {span:.0f} s using {max(cpu, 0.0):.2f} s of CPU time "
                       f"(after its collective #{seq}, {op}), while rank {self.comm.rank} waits for it in "
                       f"{self._where()}", ENV_STALL)
        peer.first = peer.last  # busy computing: a slow rank, not a stalled one; judge the next span

    def _where(self):
        act = self.activity
        return f"collective #{act.seq} ({act.op})"

    def _fail(self, message, knob):
        self.comm.abort(f"histforest watchdog: {message}. (Bound set by {knob}; "
                        f"{ENV}=0 turns the watchdog off.)", code=1)

    def _report_broken(self, exc):
        import sys

        sys.stderr.write(f"[rank {self.comm.rank}] histforest watchdog stopped: {exc!r}\n")


_ACTIVE = []
_AT_EXIT = []


def start(comm):
    """Start the watchdog on ``comm`` if it is enabled and MPI allows a second thread.

    Returns
    -------
    Watchdog or None
    """
    if comm.size <= 1 or not enabled() or not getattr(comm, "thread_multiple", lambda: False)():
        return None
    dog = Watchdog(comm, setting(ENV_PROBE), setting(ENV_STALL), setting(ENV_SILENT)).start()
    _ACTIVE.append(dog)
    if not _AT_EXIT:
        # Registered after MPI was initialised, so it runs before mpi4py finalises MPI.
        atexit.register(stop_all)
        _AT_EXIT.append(True)
    return dog


def stop_all():
    """Stop every watchdog (registered at exit, before MPI is finalised)."""
    while _ACTIVE:
        _ACTIVE.pop().stop()


def stop(dog):
    """Stop one watchdog from :func:`start` (a socket world ends before its process does).

    Parameters
    ----------
    dog : Watchdog or None
    """
    if dog is None:
        return
    dog.stop()
    if dog in _ACTIVE:
        _ACTIVE.remove(dog)

"""A world of p "ranks" as threads of one process, behind the communicator seam.

For tests and experiments, not for speed: the collectives only talk through
:class:`native.comm.Communicator`, so running them on threads that exchange numpy
copies through queues exercises exactly the algorithm code ``mpirun`` runs, for any
p (``mpirun`` on a 2-core machine is practical up to about 5 ranks), in one process.
Code above ``native`` can use it too, to check that a distributed fit gives the same
result for p = 1, 2, 7, ... without launching MPI::

    results = ThreadWorld(7).run(lambda comm: fit(X[block(comm.rank)], comm=comm))

Caveat: :data:`native.stats.STATS` is process-wide, so with thread ranks it sums
the traffic of all of them. There is no MPI library here (``algorithm="mpi"``
raises).
"""
import queue
import threading
import time

import numpy as np

from native.comm import Communicator


class _Request:
    def __init__(self, done=False, poll=None):
        self.done = done
        self.poll = poll

    def test(self):
        if not self.done and self.poll is not None:
            self.done = self.poll()
        return self.done


class ThreadCommunicator(Communicator):
    """One rank of a :class:`ThreadWorld`. Sends never block (messages are queued)."""

    def __init__(self, world, rank):
        self.world = world
        self.rank = rank
        self.size = world.size

    def _queue(self, src, dst, tag):
        return self.world.queue(src, dst, tag)

    def send(self, buf, dest, tag=0):
        self._queue(self.rank, dest, tag).put(np.array(buf, copy=True).reshape(-1))

    def recv(self, buf, source, tag=0):
        try:
            msg = self._queue(source, self.rank, tag).get(timeout=self.world.timeout)
        except queue.Empty:
            raise TimeoutError(f"rank {self.rank}: no message from rank {source} (tag "
                               f"{tag}) within {self.world.timeout:g} s") from None
        self._deliver(msg, buf, source, tag)
        return buf

    def _deliver(self, msg, buf, source, tag):
        if msg.size != buf.size or msg.dtype != buf.dtype:
            raise RuntimeError(f"rank {self.rank}: message from {source} tag {tag} has "
                               f"{msg.size} x {msg.dtype}, buffer {buf.size} x {buf.dtype}")
        buf.reshape(-1)[...] = msg

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        self.send(sendbuf, dest, tag)
        return self.recv(recvbuf, source, tag)

    def isend(self, buf, dest, tag=0):
        self.send(buf, dest, tag)
        return _Request(done=True)

    def irecv(self, buf, source, tag=0):
        q = self._queue(source, self.rank, tag)

        def poll():
            try:
                msg = q.get_nowait()
            except queue.Empty:
                return False
            self._deliver(msg, buf, source, tag)
            return True

        return _Request(poll=poll)

    def test_all(self, requests):
        return all([r.test() for r in requests])

    def cancel_recv(self, request):
        request.poll = None  # never polled again, so it never writes into the buffer

    def barrier(self):
        self.world.barrier.wait(timeout=self.world.timeout)

    def abort(self, message, code=1):
        raise RuntimeError(f"abort from rank {self.rank}: {message}")

    def library_allreduce(self, sendbuf, recvbuf):
        raise NotImplementedError("no MPI library in a thread world")

    def node_keys(self):
        return list(self.world.node_of)


class ThreadWorld:
    """``p`` thread ranks; :meth:`run` calls ``fn(comm)`` on each and returns the results.

    Parameters
    ----------
    size : int
    timeout : float
        Seconds a receive waits before failing (a deadlock turns into an error).
    node_of : sequence of int, optional
        A node label per rank (ranks with equal labels share a node; see
        :mod:`native.topology`); default: all on one node.
    """

    def __init__(self, size, timeout=30.0, node_of=None):
        self.size = size
        self.timeout = timeout
        self.node_of = [0] * size if node_of is None else [int(v) for v in node_of]
        if len(self.node_of) != size:
            raise ValueError(f"node_of has {len(self.node_of)} labels for {size} ranks")
        self.barrier = threading.Barrier(size)
        self._queues = {}
        self._lock = threading.Lock()

    def queue(self, src, dst, tag):
        with self._lock:
            return self._queues.setdefault((src, dst, tag), queue.Queue())

    def run(self, fn):
        """Run ``fn(comm)`` on every rank; re-raise the earliest exception of any rank.

        The earliest is the cause; ranks left waiting for the failed one fail later
        with ``TimeoutError`` after ``timeout`` seconds.

        Returns
        -------
        list
            ``fn``'s return value per rank.
        """
        results = [None] * self.size
        errors = [None] * self.size

        def body(r):
            try:
                results[r] = fn(ThreadCommunicator(self, r))
            except BaseException as exc:  # reported below with its rank
                errors[r] = (time.monotonic(), exc)

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.timeout * 4)
        failed = [(e[0], r, e[1]) for r, e in enumerate(errors) if e is not None]
        if failed:
            _, r, exc = min(failed, key=lambda f: (f[0], f[1]))
            raise RuntimeError(f"rank {r} of {self.size} failed: {exc!r}") from exc
        if any(t.is_alive() for t in threads):
            raise RuntimeError("a thread rank is still blocked (deadlock)")
        return results

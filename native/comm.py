"""The communicator seam: point-to-point on numpy buffers, plus abort.

Collectives in :mod:`native.collectives` are written only against this small
interface, so they run unchanged over MPI (``MPICommunicator``) or inside one
process (``SelfCommunicator``, size 1). This is the only module that imports
mpi4py.
"""
import contextlib
import os
import sys
import time

import numpy as np

from .abort import install_abort_hook
from .activity import Activity  # noqa: F401 (part of the seam: ``comm.activity`` holds one)


class Communicator:
    """Interface every communicator implements.

    Attributes
    ----------
    rank : int
    size : int
    activity : Activity or None
        Set when a watchdog follows this communicator (:mod:`native.watchdog`).
    """

    rank = 0
    size = 1
    activity = None

    def send(self, buf, dest, tag=0):
        """Blocking send of a contiguous numpy array."""
        raise NotImplementedError

    def recv(self, buf, source, tag=0):
        """Blocking receive into a contiguous numpy array (shape fixed by caller)."""
        raise NotImplementedError

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        """Send ``sendbuf`` to ``dest`` while receiving ``recvbuf`` from ``source``."""
        raise NotImplementedError

    def isend(self, buf, dest, tag=0):
        """Start a send of a contiguous numpy array; returns a request for :meth:`test_all`."""
        raise NotImplementedError

    def irecv(self, buf, source, tag=0):
        """Start a receive into a contiguous numpy array; returns a request."""
        raise NotImplementedError

    def test_all(self, requests):
        """True when every request has completed (never blocks)."""
        raise NotImplementedError

    def cancel_recv(self, request):
        """Withdraw a pending receive so it can never write into its buffer later."""
        raise NotImplementedError

    def barrier(self):
        raise NotImplementedError

    def abort(self, message, code=1):
        """Print ``message`` to stderr and bring every rank down."""
        raise NotImplementedError

    def node_keys(self):
        """A label per rank; ranks with equal labels share memory (one node).

        Returns
        -------
        list of int, length ``size``
            The base class puts every rank on one node.
        """
        return [0] * self.size

    def library_allreduce(self, sendbuf, recvbuf):
        """Sum ``sendbuf`` over ranks into ``recvbuf`` with the MPI library's own Allreduce.

        This is the baseline that :mod:`native.collectives` measures itself against
        (``algorithm="mpi"``); the project's own collectives never call it.

        Parameters
        ----------
        sendbuf, recvbuf : ndarray, shape (n,)
            Contiguous, same dtype and length.
        """
        raise NotImplementedError


class SelfCommunicator(Communicator):
    """A world of one process: collectives become copies, sends to self are invalid."""

    rank = 0
    size = 1

    def send(self, buf, dest, tag=0):
        raise RuntimeError("SelfCommunicator has no peer to send to")

    def recv(self, buf, source, tag=0):
        raise RuntimeError("SelfCommunicator has no peer to receive from")

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        if dest != 0 or source != 0:
            raise RuntimeError("SelfCommunicator can only exchange with itself")
        np.copyto(recvbuf, sendbuf)
        return recvbuf

    def isend(self, buf, dest, tag=0):
        raise RuntimeError("SelfCommunicator has no peer to send to")

    def irecv(self, buf, source, tag=0):
        raise RuntimeError("SelfCommunicator has no peer to receive from")

    def test_all(self, requests):
        return True

    def cancel_recv(self, request):
        return None

    def barrier(self):
        return None

    def abort(self, message, code=1):
        sys.stderr.write(f"{message}\n")
        sys.stderr.flush()
        raise SystemExit(code)

    def library_allreduce(self, sendbuf, recvbuf):
        np.copyto(recvbuf, sendbuf)
        return recvbuf


#: Seconds between writing an abort message and calling MPI_Abort.
_ABORT_GRACE_S = 0.5


class MPICommunicator(Communicator):
    """Communicator over an mpi4py communicator (``COMM_WORLD`` by default)."""

    def __init__(self, mpi_comm=None):
        from mpi4py import MPI

        self._MPI = MPI
        self.mpi_comm = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        self.rank = self.mpi_comm.Get_rank()
        self.size = self.mpi_comm.Get_size()
        self._node_keys = self._shared_memory_nodes()

    def _shared_memory_nodes(self):
        # Collective, once per communicator: the ranks that share memory with this one
        # (MPI_Comm_split_type SHARED), labelled by their lowest rank, then every
        # rank's label. MPI's own calls are fine here: setup, not the data path.
        if self.size == 1:
            return [0]
        node = self.mpi_comm.Split_type(self._MPI.COMM_TYPE_SHARED, key=self.rank)
        try:
            label = node.allreduce(self.rank, op=self._MPI.MIN)
        finally:
            node.Free()
        return [int(v) for v in self.mpi_comm.allgather(label)]

    def node_keys(self):
        return list(self._node_keys)

    # Blocking calls record whom they wait for (when a watchdog follows this
    # communicator): two attribute writes per message, nothing else.

    def send(self, buf, dest, tag=0):
        act = self.activity
        if act is None:
            self.mpi_comm.Send(np.ascontiguousarray(buf), dest=dest, tag=tag)
            return
        act.token += 1
        act.peers = (dest,)
        try:
            self.mpi_comm.Send(np.ascontiguousarray(buf), dest=dest, tag=tag)
        finally:
            act.peers = None

    def recv(self, buf, source, tag=0):
        _require_contiguous(buf)
        act = self.activity
        if act is None:
            self.mpi_comm.Recv(buf, source=source, tag=tag)
            return buf
        act.token += 1
        act.peers = (source,)
        try:
            self.mpi_comm.Recv(buf, source=source, tag=tag)
        finally:
            act.peers = None
        return buf

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        _require_contiguous(recvbuf)
        act = self.activity
        if act is None:
            self.mpi_comm.Sendrecv(np.ascontiguousarray(sendbuf), dest=dest, sendtag=tag,
                                   recvbuf=recvbuf, source=source, recvtag=tag)
            return recvbuf
        act.token += 1
        act.peers = (source, dest) if source != dest else (source,)
        try:
            self.mpi_comm.Sendrecv(np.ascontiguousarray(sendbuf), dest=dest, sendtag=tag,
                                   recvbuf=recvbuf, source=source, recvtag=tag)
        finally:
            act.peers = None
        return recvbuf

    def isend(self, buf, dest, tag=0):
        # the caller keeps ``buf`` alive and unchanged until the request completes
        return self.mpi_comm.Isend(np.ascontiguousarray(buf), dest=dest, tag=tag)

    def irecv(self, buf, source, tag=0):
        _require_contiguous(buf)
        return self.mpi_comm.Irecv(buf, source=source, tag=tag)

    def test_all(self, requests):
        return self._MPI.Request.Testall(list(requests))

    def cancel_recv(self, request):
        request.Cancel()
        request.Wait()  # completes at once for a cancelled (or just matched) receive

    def barrier(self):
        act = self.activity
        if act is not None:
            act.token += 1
            act.peers = (-1,)
        try:
            self.mpi_comm.Barrier()
        finally:
            if act is not None:
                act.peers = None

    # The watchdog's own channel: untracked calls from its thread (MPI is initialised
    # with MPI_THREAD_MULTIPLE, so they may run while the main thread is in MPI).

    def private_channel(self):
        """A duplicate of this communicator for a helper thread's own messages (collective).

        The watchdog talks on its own context, never on the data communicator: a
        question or answer still in flight when a rank exits stays on the duplicate.
        Left on ``COMM_WORLD`` it made ``MPI_Finalize`` fail (MPICH 5: "Communicator
        being freed has 1 unmatched message(s)"), the rank left without finalising,
        and ``mpirun`` killed the other ranks of a job that had succeeded.

        Returns
        -------
        MPICommunicator
            Same ranks, same node labels, no activity notes; :meth:`close` frees it.
        """
        channel = MPICommunicator.__new__(MPICommunicator)
        channel._MPI = self._MPI
        channel.mpi_comm = self.mpi_comm.Dup()
        channel.rank, channel.size = self.rank, self.size
        channel._node_keys = list(self._node_keys)
        return channel

    def close(self):
        """Free a communicator made by :meth:`private_channel` (MPI's world is never freed)."""
        if self.mpi_comm not in (self._MPI.COMM_WORLD, self._MPI.COMM_NULL):
            self.mpi_comm.Free()

    def drain(self, tag):
        """Receive and drop every message with ``tag`` that has already arrived.

        Returns
        -------
        int
            How many were dropped.
        """
        dropped = 0
        status = self._MPI.Status()
        while self.mpi_comm.Iprobe(source=self._MPI.ANY_SOURCE, tag=tag, status=status):
            self.mpi_comm.Recv(bytearray(status.Get_count(self._MPI.BYTE)), source=status.Get_source(),
                               tag=tag)
            dropped += 1
        return dropped

    def thread_multiple(self):
        """True when MPI allows calls from several threads at once."""
        return self._MPI.Query_thread() == self._MPI.THREAD_MULTIPLE

    def service_probe(self, tag):
        """Source rank of a waiting message with ``tag`` from anyone, or None (never blocks)."""
        status = self._MPI.Status()
        if self.mpi_comm.Iprobe(source=self._MPI.ANY_SOURCE, tag=tag, status=status):
            return status.Get_source()
        return None

    def service_recv(self, buf, source, tag):
        """Receive a message already announced by :meth:`service_probe`."""
        self.mpi_comm.Recv(buf, source=source, tag=tag)
        return buf

    def abort(self, message, code=1):
        sys.stderr.write(f"[rank {self.rank}] {message}\n")
        sys.stderr.flush()
        # MPI_Abort makes the launcher kill every rank at once; give its I/O forwarder a
        # moment to pass the message on first (seen lost without the pause), then abort.
        time.sleep(_ABORT_GRACE_S)
        self.mpi_comm.Abort(code)

    def library_allreduce(self, sendbuf, recvbuf):
        _require_contiguous(recvbuf)
        act = self.activity
        if act is not None:
            act.token += 1
            act.peers = (-1,)
        try:
            self.mpi_comm.Allreduce(np.ascontiguousarray(sendbuf), recvbuf, op=self._MPI.SUM)
        finally:
            if act is not None:
                act.peers = None
        return recvbuf


def _require_contiguous(buf):
    # MPI writes through the raw pointer: a strided view would be filled wrongly.
    if not buf.flags.c_contiguous:
        raise ValueError("receive buffers must be C-contiguous numpy arrays")


_WORLD = None
#: Communicators installed by :func:`use_world`, innermost last.
_WORLD_OVERRIDES = []


@contextlib.contextmanager
def use_world(comm):
    """Make :func:`world` return ``comm`` inside the block (for this whole process).

    How a launcher that is not ``mpirun`` hands its communicator to code that asks for
    the world: every estimator's ``fit(comm=None)`` (and everything it calls without a
    communicator) then runs over ``comm``. :mod:`forest.distributed` fits inside a Spark
    task or Dask worker this way, over a :class:`native.socket_comm.SocketCommunicator`.
    One world per process, as under MPI: the override is process-wide, not per thread
    (thread ranks, as in tests, pass ``comm=`` to each call instead). Blocks nest.

    Parameters
    ----------
    comm : Communicator

    Yields
    ------
    Communicator
        ``comm``.
    """
    _WORLD_OVERRIDES.append(comm)
    try:
        yield comm
    finally:
        _WORLD_OVERRIDES.remove(comm)


#: Prefixes of the environment variables an MPI launcher sets in every process it
#: starts, for its MPI library to find the job: PMI (MPICH's Hydra, Intel MPI, MVAPICH,
#: Cray, MS-MPI), PMIx (Open MPI 5, Slurm's pmix plugin), Open MPI's own, Hydra's, MPICH's
#: local ranks, Slurm's task rank, Cray PALS and ALPS, IBM's jsrun and Parallel Environment.
LAUNCHER_VARIABLE_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                              "SLURM_PROCID", "PALS_", "ALPS_APP_PE", "MV2_COMM_WORLD", "JSM_NAMESPACE", "MP_CHILD")

#: Variables some launchers set to the number of processes in the job.
#: (Not Slurm's SLURM_NTASKS: a batch script's plain ``python`` sees the allocation's count.)
_LAUNCHER_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "JSM_NAMESPACE_SIZE",
                            "MPI_LOCALNRANKS")


def _launcher_size(environ):
    """The job size a launcher's variables state (1 when none does)."""
    sizes = [int(environ[name]) for name in _LAUNCHER_SIZE_VARIABLES if environ.get(name, "").strip().isdigit()]
    return max(sizes, default=1)


def launched_by_mpi(environ=None):
    """Whether this process may be one rank of an MPI job.

    True when an MPI launcher's variables are in the environment
    (:data:`LAUNCHER_VARIABLE_PREFIXES`), when the program has loaded MPI itself
    (``mpi4py.MPI`` imported), or when ``HISTFOREST_MPI=1`` (a launcher this list does
    not know). ``HISTFOREST_MPI=0`` says False, except in a job that its launcher says
    has several processes: then every rank would silently train on its own rows only,
    so that is an error (a program that wants independent fits per rank passes
    ``comm=SelfCommunicator()``). In doubt the answer is True.

    Parameters
    ----------
    environ : mapping, optional
        Defaults to ``os.environ``.

    Returns
    -------
    bool

    Raises
    ------
    ValueError
        ``HISTFOREST_MPI`` is not one of 1/true/yes/on, 0/false/no/off (or empty), or
        is 0 in a job of several processes.
    """
    from .settings import flag

    environ = os.environ if environ is None else environ
    forced = flag("HISTFOREST_MPI", None, environ, strict=True)
    if forced is False:
        size = _launcher_size(environ)
        if size > 1:
            raise ValueError(f"HISTFOREST_MPI=0, but this process is one of {size} started by an MPI launcher: "
                             "each would train on its own rows only; unset HISTFOREST_MPI (or pass "
                             "comm=native.comm.SelfCommunicator() for independent fits per rank)")
        return False
    if forced:
        return True
    if "mpi4py.MPI" in sys.modules:
        return True
    return any(name.startswith(LAUNCHER_VARIABLE_PREFIXES) for name in environ)


def library_version():
    """First line of the MPI library's version string (e.g. ``'MPICH Version: 5.0.2'``)."""
    from mpi4py import MPI

    return " ".join(MPI.Get_library_version().splitlines()[0].split())


def world():
    """The process-wide communicator: MPI ``COMM_WORLD``, or a :class:`SelfCommunicator`
    in a process that is not part of an MPI job (:func:`launched_by_mpi`).

    The first call under ``mpirun`` (size > 1) also starts the watchdog
    (:mod:`native.watchdog`: a rank that dies or stalls ends the job with an error)
    and installs :func:`native.errors.abort_on_uncaught`'s hook, unless the program has its
    own ``sys.excepthook``: an exception that escapes on one rank ends the whole job.

    Inside :func:`use_world`, the communicator installed there instead.

    Returns
    -------
    Communicator
    """
    global _WORLD
    if _WORLD_OVERRIDES:
        return _WORLD_OVERRIDES[-1]
    if _WORLD is None:
        if not launched_by_mpi():
            # A process no launcher started is a world of one without MPI: loading and
            # initialising the MPI library took 0.1 s of every such process's start
            # (benchmarks/bench_cold_start.py), and a notebook need not start MPI at all.
            _WORLD = SelfCommunicator()
            return _WORLD
        _WORLD = MPICommunicator()
        if _WORLD.size > 1:
            # A rank that dies or stalls must not leave the others waiting forever.
            from .watchdog import start

            start(_WORLD)
        if _WORLD.size > 1 and sys.excepthook is sys.__excepthook__:
            # Under mpirun an uncaught exception on one rank would leave the others
            # blocked in their next collective forever; abort the job with the
            # rank's traceback instead (a hook the program installed itself is kept).
            install_abort_hook(_WORLD)
    return _WORLD

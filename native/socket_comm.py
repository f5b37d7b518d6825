"""A communicator over TCP sockets: the collectives without MPI (Spark, Dask, any launcher).

:class:`SocketCommunicator` implements the seam of :class:`native.comm.Communicator`
(blocking and non-blocking point-to-point on numpy buffers, barrier, abort, node
labels) over a full mesh of TCP links built by :mod:`native.rendezvous` from a list of
``host:port`` endpoints in rank order. Every algorithm of :mod:`native.collectives`
(ring, halving/doubling, direct, hierarchical, Bruck, trees, check mode) runs on it
unchanged; only ``algorithm="mpi"`` (the MPI library's own Allreduce) is missing.

How messages move
-----------------
Each link carries frames ``(kind, tag, nbytes)`` + payload. A receive posted before
its frame arrives gets the payload written straight into its buffer (no copy); a
frame nobody waits for yet is kept whole ("unexpected", MPI's term) until a receive
with its tag asks for it. Between a pair of ranks, frames of one tag are matched in
the order sent, MPI's non-overtaking rule the algorithms rely on.

All sockets are non-blocking and progressed by whichever call is waiting: while a rank
waits for anything it also writes its queued sends and reads every link. That is why
a blocking ``send`` can never deadlock against the peer's blocking ``send`` (each
drains the other), unlike blocking TCP sends with full kernel buffers.

Peers on the same machine (same host name and boot id, agreed at connection time by
:func:`native.shm_link.setup`) move messages of 64 KiB and more without TCP, as MPI
libraries do between ranks of one machine (MPICH over UCX reads the sender's memory
with ``process_vm_readv``), so :file:`benchmarks/bench_socket.py` compares like with
like:

* **single copy** (messages of 4 MiB and more, where the kernel lets one rank read
  another's memory; :data:`native.shm_link.SINGLE_COPY_MIN_BYTES`): the sender
  announces the buffer's address over TCP; the receiver reads it straight into the
  posted receive buffer and answers "read", which completes the send. A message that
  arrives before its receive waits in the sender's memory up to :data:`HOLD_S`, then
  is copied here (so ranks that all send before they receive still finish).
* **slots** (smaller messages, or all where single copy is not permitted): the
  sender copies the message through a ring of slots in
  ``/dev/shm`` (:class:`native.shm_link.Ring`), a small TCP frame per slot filled, one
  back per slot emptied.

Either way the TCP link carries the signalling, so a waiting rank sleeps in
``select`` (ranks oversubscribing the cores leave them to each other) and a dead peer
is noticed as before. ``HISTFOREST_SOCKET_SHM=0`` sends every byte over TCP;
``HISTFOREST_SOCKET_CMA=0`` leaves only the slots. Between machines it is TCP.

Over TCP loopback alone, every byte is copied twice and crosses the TCP stack, and on
the 2-core test machine runs of 64 MiB allreduces with the ranks on different cores
showed loopback segments arriving out of order (``TCPOFOQueue``, ``TCPSACKReorder``
in ``/proc/net/netstat``), answered by spurious fast retransmissions and a few
retransmissions lost again (``TCPLostRetransmit``, each a retransmission timeout of
at least 200 ms): a likely source of the 170-360 ms outliers, though under heavy
load outliers also came without any retransmission (the ranks descheduled).

Failure
-------
A rank's process that ends closes its sockets, so a rank waiting on the mesh learns it
at once: :class:`PeerLostError` names the rank (the mesh is full, so every rank hears
of it, not only the ones waiting for it). A rank that closes normally first sends a
"bye" frame, so its orderly exit is not mistaken for a crash. A peer that dies while
this rank reads its memory is noticed by the read (or by its pidfd, so a reused pid
is never read from). :meth:`abort` sends the
message to every peer (each raises :class:`PeerLostError` quoting it) and raises
:class:`CommunicatorAborted` here; called from another thread (the watchdog), it
shuts the sockets down so the waiting main thread raises instead. A peer that is
frozen or stalled but alive is the watchdog's case (:mod:`native.watchdog`), which runs
unchanged over :meth:`SocketCommunicator.private_channel`, a second set of links.
``HISTFOREST_SOCKET_TIMEOUT`` (seconds, unset by default) bounds every wait as well.
"""
import errno
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections import deque

import numpy as np

from .comm import Communicator
from .rendezvous import (DEFAULT_TIMEOUT_S, ENV_TIMEOUT, Listener, RendezvousError, RendezvousTimeout, connect_mesh,
                         parse_endpoint)
from .settings import positive_number
from . import shm_link
from .transport import TAG_BARRIER

ENV_WAIT_TIMEOUT = "HISTFOREST_SOCKET_TIMEOUT"

_HEADER = struct.Struct("<qqq")  # kind, tag, payload bytes
_DATA, _ABORT, _BYE = 1, 2, 3
# Shared memory (native.shm_link): a message whose payload follows in the peer's ring
# (kind, tag, bytes); a slot filled (kind, slot, bytes in it); a slot handed back (kind, slot, 0).
_SHMDATA, _CHUNK, _CREDIT = 4, 5, 6
# Single copy (native.shm_link.read_remote): a message the receiver reads from the
# sender's memory, payload (address, sequence number, bytes); the receiver's "read it"
# (kind, sequence number, 0), which completes the sender's request.
_CMADATA, _CMADONE = 7, 8
_LEND = struct.Struct("<qqq")
#: Seconds a large message that no receive has asked for yet may wait in the sender's
#: memory (or slots) before this rank copies it into a buffer of its own. Collectives
#: post their receives first, so a message waits only while its receiver finishes the
#: step before; a program whose ranks all send before they receive (which MPI calls
#: unsafe) still completes, each such message a fraction of a second later.
HOLD_S = 0.1
#: Buffers lent to peers by requests this rank gave up on (close, abort): kept alive,
#: so that a peer still reading one never reads memory reused for something else.
_LENT = []

#: Seconds :meth:`SocketCommunicator.close` waits for peers to close their ends (their
#: last frames are read, so no reset discards data a slower peer has not read yet).
CLOSE_LINGER_S = 5.0
#: Bytes left in a frame from which a receive blocks in the kernel for all of them.
_BLOCKING_READ_MIN = 256 << 10
#: Seconds an abort waits to hand its message to the peers' sockets.
ABORT_FLUSH_S = 2.0


class TransportError(RuntimeError):
    """A socket communicator can no longer be used (a peer is gone, or it was aborted)."""


class PeerLostError(TransportError):
    """A peer's connection ended without an orderly close, or the peer aborted."""


class CommunicatorAborted(TransportError):
    """This rank aborted the communicator (:meth:`SocketCommunicator.abort`)."""


class TransportTimeout(TransportError, TimeoutError):
    """A wait lasted longer than the communicator's ``timeout``."""


def wait_timeout_setting():
    """``HISTFOREST_SOCKET_TIMEOUT`` in seconds, or None (wait without bound)."""
    return positive_number(ENV_WAIT_TIMEOUT, None, unit="a number of seconds")


def connect_timeout_setting():
    """``HISTFOREST_SOCKET_CONNECT_TIMEOUT`` in seconds (default 60)."""
    return positive_number(ENV_TIMEOUT, DEFAULT_TIMEOUT_S, unit="a number of seconds")


class _Request:
    """One send or receive in flight; ``done`` turns True when its buffer is free / filled."""

    __slots__ = ("link", "tag", "view", "keep", "done")

    def __init__(self, link, tag, view, keep):
        self.link = link
        self.tag = tag
        self.view = view      # memoryview of the buffer's bytes
        self.keep = keep      # the array itself, alive until the request completes
        self.done = False

    def Free(self):  # noqa: N802 - mpi4py's name: the watchdog frees the sends it stops tracking
        """Nothing to release (a socket send completes on its own)."""


def _byte_view(arr):
    """The bytes of a C-contiguous array as a flat memoryview (shares memory)."""
    flat = arr.reshape(-1)
    return memoryview(flat.view(np.uint8)) if flat.size else memoryview(b"")


class _Link:
    """The frames to and from one peer over one TCP socket (see the module docstring).

    ``path`` (:class:`native.shm_link.PeerPath`) says how large messages move to and
    from a peer on this machine: read from the sender's memory in one copy, or through
    shared-memory slots; None: every byte over TCP.
    """

    def __init__(self, peer, sock, path=None):
        self.peer = peer
        self.sock = sock
        sock.setblocking(False)
        self.fileno = sock.fileno()
        self.out = deque()            # [kind, tag, payload view, request, bytes handed over, announced]
        self.ctrl = deque()           # small frames that may go between any two frames (credits, abort)
        self._tx = None               # [views, total bytes, bytes written, request] being written
        self.blocked = False          # the last write found the kernel buffer full
        self._write_failed = False    # a write failed: nothing more is written
        self.posted = {}              # tag -> deque of receive requests, in posting order
        self.unexpected = {}          # tag -> deque of complete payloads (bytearray)
        self._hdr = bytearray(_HEADER.size)
        self._hdr_view = memoryview(self._hdr)
        self._hdr_got = 0
        self._cur = None              # [kind, tag, view, got, request, store] of the frame being read
        self._shm_cur = None          # [_SHMDATA, tag, view, got, request, store]: a message in slots
        self.shm_out = path.ring_out if path is not None else None
        self.shm_in = path.ring_in if path is not None else None
        self.read_pid = path.read_pid if path is not None else None  # read large messages from its memory
        self.pidfd = path.pidfd if path is not None else None
        self.lend = path is not None and path.lend                     # it reads ours
        self.lent = {}                # sequence number -> send request whose buffer the peer reads
        self._seq = 0
        self.held = 0                 # messages in "unexpected" still in the peer's memory
        self.state = "open"           # "open" | "left" (said bye) | "lost" | "aborted" (said why)
        self.reason = ""
        self.want_write = False

    def pending(self):
        """True while anything of this rank waits to be written to this peer."""
        return bool(self._tx is not None or self.ctrl or self.out)

    # ----------------------------------------------------------------- receiving
    def post(self, req):
        """Match a new receive with an unexpected frame, else queue it for the next one."""
        pending = self.unexpected.get(req.tag)
        if pending:
            store = pending.popleft()
            if isinstance(store, _Remote):
                self.held -= 1
                self._pull(req, store)
            else:
                _fill(req, store, self.peer)
        else:
            self.posted.setdefault(req.tag, deque()).append(req)

    def cancel(self, req):
        """Withdraw a receive: it will never write into its buffer."""
        q = self.posted.get(req.tag)
        if q is not None and req in q:
            q.remove(req)
        for cur in (self._cur, self._shm_cur):
            if cur is not None and cur[4] is req:
                # Its frame is half read into the buffer: finish it into a private copy instead.
                store = bytearray(len(cur[2]))
                store[:cur[3]] = cur[2][:cur[3]]
                cur[2], cur[4], cur[5] = memoryview(store), None, store

    def on_readable(self):
        """Read everything that has arrived, frame by frame, until the socket would block."""
        while self.state in ("open", "left"):
            cur = self._cur
            try:
                if cur is None:
                    n = self.sock.recv_into(self._hdr_view[self._hdr_got:])
                else:
                    n = self.sock.recv_into(cur[2][cur[3]:])
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self._gone(f"its connection failed ({exc.strerror or exc})")
                return
            if n == 0:
                self._gone("its connection closed without a goodbye (the process ended or was killed)")
                return
            if cur is None:
                self._hdr_got += n
                if self._hdr_got == _HEADER.size:
                    self._hdr_got = 0
                    self._start(*_HEADER.unpack(self._hdr))
            else:
                cur[3] += n
                if cur[3] == len(cur[2]):
                    self._finish()

    def _match(self, tag, nbytes):
        """The posted receive a data frame of ``nbytes`` with ``tag`` goes to, or None."""
        q = self.posted.get(tag)
        if not q:
            return None
        req = q.popleft()
        if len(req.view) != nbytes:
            raise TransportError(f"rank {self.peer} sent {nbytes} bytes with tag {tag}, but the receive "
                                 f"expects {len(req.view)}: the ranks disagree on the message size")
        return req

    def _start(self, kind, tag, nbytes):
        if kind == _CHUNK:  # "tag" is the slot, "nbytes" the bytes in it
            self._chunk(tag, nbytes)
            return
        if kind == _CMADONE:
            req = self.lent.pop(tag, None)
            if req is None:
                raise TransportError(f"rank {self.peer} read message {tag}, which it was never lent")
            req.done, req.keep = True, None
            return
        if kind == _CREDIT:
            if self.shm_out is None or not 0 <= tag < len(self.shm_out.slots):
                raise TransportError(f"rank {self.peer} handed back slot {tag}, which it was never given")
            self.shm_out.free.append(tag)
            return
        req = self._match(tag, nbytes) if kind in (_DATA, _SHMDATA) else None
        if req is not None:
            cur = [kind, tag, req.view, 0, req, None]
        else:
            store = bytearray(nbytes)
            cur = [kind, tag, memoryview(store), 0, None, store]
        if kind == _SHMDATA:
            if self.shm_in is None or self._shm_cur is not None:
                raise TransportError(f"rank {self.peer} sent a shared-memory message this rank cannot read")
            self._shm_cur = cur
            return
        self._cur = cur
        if nbytes == 0:
            self._finish()

    def _chunk(self, slot, n):
        """Copy slot ``slot`` of the peer's ring into the message it belongs to, hand it back."""
        cur = self._shm_cur
        ring = self.shm_in
        if cur is None or ring is None or not 0 <= slot < len(ring.slots) or not 0 < n <= len(cur[2]) - cur[3]:
            raise TransportError(f"rank {self.peer} announced {n} bytes in slot {slot} outside a message")
        got = cur[3]
        cur[2][got:got + n] = ring.slots[slot][:n]
        cur[3] = got + n
        self.ctrl.append(_HEADER.pack(_CREDIT, slot, 0))
        if cur[3] == len(cur[2]):
            self._shm_cur = None
            self._deliver(cur[1], cur[4], cur[5])
        # Hand the slot back only now that the message's state is settled: a write that
        # fails (the peer aborted and closed) reads what the peer left, re-entering
        # on_readable, which may meet the peer's next message already.
        self.on_writable()  # as in _pull: the sender may wait for the slot

    def _finish(self):
        kind, tag, _, _, req, store = self._cur
        self._cur = None
        if kind == _DATA:
            self._deliver(tag, req, store)
        elif kind == _CMADATA:
            if self.read_pid is None:
                raise TransportError(f"rank {self.peer} lent memory this rank cannot read")
            where, seq, nbytes = _LEND.unpack(store)
            remote = _Remote(where, seq, nbytes)
            req = self._match(tag, nbytes)
            if req is not None:
                self._pull(req, remote)
            else:
                self.held += 1
                self.unexpected.setdefault(tag, deque()).append(remote)
        elif kind == _ABORT:
            self.state, self.reason = "aborted", bytes(store).decode(errors="replace")
        elif kind == _BYE:
            self.state = "left"

    def _pull(self, req, remote):
        """Read a lent message into ``req``'s buffer, tell the peer it may reuse its own."""
        if len(req.view) != remote.nbytes:
            raise TransportError(f"rank {self.peer} sent {remote.nbytes} bytes with tag {req.tag}, but the "
                                 f"receive expects {len(req.view)}: the ranks disagree on the message size")
        if self.state not in ("open", "left"):
            return
        try:
            shm_link.read_remote(self.read_pid, remote.where, req.view)
            if shm_link.process_ended(self.pidfd):
                raise OSError(errno.ESRCH, "the process ended during the read")
        except OSError as exc:
            # Its process ended (ESRCH) or freed the memory (EFAULT): the peer is gone.
            self._gone(f"its memory could not be read ({exc.strerror or exc}; the process ended or was killed)")
            return
        self.ctrl.append(_HEADER.pack(_CMADONE, remote.seq, 0))
        req.done, req.keep = True, None
        # Say so now: this rank may go on to other work (another communicator, say)
        # before it waits here again, and the sender waits for this answer.
        self.on_writable()

    def spill(self, now):
        """Copy lent messages that waited :data:`HOLD_S` for a receive into buffers of this rank."""
        for q in self.unexpected.values():
            for i, item in enumerate(q):
                if isinstance(item, _Remote) and now - item.since >= HOLD_S and self.state in ("open", "left"):
                    store = bytearray(item.nbytes)
                    tmp = _Request(self, None, memoryview(store), store)
                    self._pull(tmp, item)
                    q[i] = store
                    self.held -= 1

    def _deliver(self, tag, req, store):
        if req is not None:
            req.done, req.keep = True, None
            return
        q = self.posted.get(tag)
        if q:  # posted while its frame was being read
            _fill(q.popleft(), store, self.peer)
        else:
            self.unexpected.setdefault(tag, deque()).append(store)

    def _gone(self, why):
        if self.state == "open":
            self.state, self.reason = "lost", why
        elif self.state == "left":
            self.state = "closed"  # bye, then the end of the stream: an orderly close
        self.out.clear()
        self.ctrl.clear()
        self._tx = None

    # ------------------------------------------------------------------- sending
    def push(self, kind, tag, view, req):
        if kind == _DATA and len(view) >= shm_link.SHM_MIN_BYTES:
            if self.lend and (len(view) >= shm_link.SINGLE_COPY_MIN_BYTES or self.shm_out is None):
                # The peer reads the buffer itself; the request completes on its answer.
                seq = self._seq
                self._seq += 1
                self.lent[seq] = req
                kind, view, req = _CMADATA, memoryview(_LEND.pack(shm_link.address(view), seq, len(view))), None
            elif self.shm_out is not None:
                kind = _SHMDATA
        self.out.append([kind, tag, view, req, 0, False])

    def push_ctrl(self, kind, tag, payload=b""):
        """A frame that overtakes queued data at the next frame boundary (an abort)."""
        self.ctrl.append(_HEADER.pack(kind, tag, len(payload)) + bytes(payload))

    def _next_tx(self):
        """The next bytes to write: control frames first, then the head of the queue."""
        if self.ctrl:
            data = b"".join(self.ctrl)
            self.ctrl.clear()
            return [[memoryview(data)], len(data), 0, None]
        if not self.out:
            return None
        entry = self.out[0]
        kind, tag, view, req, offset, announced = entry
        if kind != _SHMDATA:
            self.out.popleft()
            hdr = memoryview(_HEADER.pack(kind, tag, len(view)))
            return [[hdr, view] if len(view) else [hdr], _HEADER.size + len(view), 0, req]
        # Shared memory: one slot per write, so the peer copies one slot out while this
        # rank fills the next.
        ring = self.shm_out
        frames = b"" if announced else _HEADER.pack(_SHMDATA, tag, len(view))
        entry[5] = True
        if ring.free:
            k = ring.free.pop()
            n = min(ring.slot_bytes, len(view) - offset)
            ring.slots[k][:n] = view[offset:offset + n]
            frames += _HEADER.pack(_CHUNK, k, n)
            entry[4] = offset = offset + n
        done = None
        if offset == len(view):
            self.out.popleft()
            done = req
        if not frames:
            return None  # every slot is with the peer: its credits wake this rank up
        return [[memoryview(frames)], len(frames), 0, done]

    def on_writable(self):
        """Write queued frames until the kernel buffer is full; completes their requests.

        ``blocked`` tells afterwards whether it stopped at a full kernel buffer (the
        selector should wake this rank when there is room) or for want of anything
        writable now (nothing queued, or a shared-memory message waiting for slots).
        """
        self.blocked = False
        while self.state in ("open", "left") and not self._write_failed:
            tx = self._tx
            if tx is None:
                tx = self._tx = self._next_tx()
                if tx is None:
                    return
            views, total, written = tx[0], tx[1], tx[2]
            if written:
                rest, skip = [], written
                for v in views:
                    if skip >= len(v):
                        skip -= len(v)
                        continue
                    rest.append(v[skip:])
                    skip = 0
                views = rest
            try:
                n = self.sock.sendmsg(views) if len(views) > 1 else self.sock.send(views[0])
            except (BlockingIOError, InterruptedError):
                self.blocked = True
                return
            except OSError as exc:
                # A peer that aborted said why before it closed (and one that died may
                # have left frames too): read what is left first, so that the error
                # names the cause rather than this broken pipe.
                self._write_failed = True
                self.on_readable()
                self._gone(f"its connection failed while sending to it ({exc.strerror or exc})")
                return
            tx[2] = written + n
            if tx[2] < total:
                self.blocked = True
                return  # the kernel buffer is full
            self._tx = None
            req = tx[3]
            if req is not None:
                req.done, req.keep = True, None


class _Remote:
    """A message still in the sender's memory: where, its sequence number, its size."""

    __slots__ = ("where", "seq", "nbytes", "since")

    def __init__(self, where, seq, nbytes):
        self.where, self.seq, self.nbytes = where, seq, nbytes
        self.since = time.monotonic()


def _fill(req, store, peer):
    if len(store) != len(req.view):
        raise TransportError(f"rank {peer} sent {len(store)} bytes with tag {req.tag}, but the receive expects "
                             f"{len(req.view)}: the ranks disagree on the message size")
    if len(store):
        req.view[:] = store
    req.done, req.keep = True, None


class SocketCommunicator(Communicator):
    """One rank of a world connected by TCP links (see the module docstring).

    Build one with :meth:`from_endpoints` (every rank given the same ``host:port``
    list) or :func:`connect` (a launcher that made the listening sockets first and
    exchanged their addresses, as :mod:`forest.distributed` does under Spark).

    Parameters
    ----------
    links : dict of int to socket.socket
        Peer rank -> connected socket (channel 0 of :func:`native.rendezvous.connect_mesh`).
    rank, size : int
    hosts : list of str, length ``size``
        Host name of every rank; equal names form one node (:meth:`node_keys`).
    timeout : float, optional
        Seconds any single wait may last before :class:`TransportTimeout`; None (the
        default) waits without bound and leaves stalls to the watchdog.
    channel_links : dict of int to socket.socket, optional
        The second set of links, handed out by :meth:`private_channel`.
    endpoints : list of str, optional
        For error messages.
    quiet : bool
        A watchdog channel: a lost link never raises.
    shm : dict of int to native.shm_link.PeerPath, optional
        From :func:`native.shm_link.setup`: peers on this machine and how large
        messages move to and from them without TCP.
    """

    def __init__(self, links, rank, size, hosts, timeout=None, channel_links=None, endpoints=None, quiet=False,
                 shm=None):
        self.rank = int(rank)
        self.size = int(size)
        self.timeout = timeout
        self.endpoints = list(endpoints) if endpoints is not None else None
        self._hosts = list(hosts)
        paths = shm or {}
        self._links = {peer: _Link(peer, sock, paths.get(peer)) for peer, sock in links.items()}
        self._sel = selectors.DefaultSelector()
        for link in self._links.values():
            self._sel.register(link.sock, selectors.EVENT_READ, link)
        self._self_box = {}       # tag -> deque of arrays sent to this rank itself
        self._self_posted = {}    # tag -> deque of receives from this rank itself
        self._channel_links = channel_links
        self._channel = None
        self._interrupted = None  # the message of an abort from another thread
        self._closed = False
        self._quiet = quiet       # a watchdog channel: a lost link never raises, it just stays silent
        self._owner = threading.get_ident()  # the thread that runs the collectives (see abort)

    # ------------------------------------------------------------ construction
    @classmethod
    def from_endpoints(cls, endpoints, rank, token=b"", timeout=None, connect_timeout=None, bind_host=""):
        """Listen on ``endpoints[rank]``'s port and connect to every other rank.

        Parameters
        ----------
        endpoints : sequence of str
            ``host:port`` of each rank, in rank order, the same list on every rank.
        rank : int
        token : bytes
            The same on every rank of one job; a connection with another token (a
            stale rank of an earlier job on the same ports) is refused.
        timeout : float, optional
            See the class. Default: ``HISTFOREST_SOCKET_TIMEOUT`` (unset: no bound).
        connect_timeout : float, optional
            Seconds for the rendezvous; default ``HISTFOREST_SOCKET_CONNECT_TIMEOUT``
            or 60. Ranks may start in any order within it.
        bind_host : str
            Interface to listen on (default all); the others dial ``endpoints[rank]``.

        Returns
        -------
        SocketCommunicator
        """
        host, port = parse_endpoint(endpoints[rank]) if 0 <= rank < len(endpoints) else (None, None)
        if host is None:
            raise RendezvousError(f"rank {rank} is not in 0..{len(endpoints) - 1} ({len(endpoints)} endpoints)")
        listener = Listener(bind_host, port, advertise=host)
        return connect(listener, endpoints, rank, token, timeout, connect_timeout)

    # ---------------------------------------------------------------- the seam
    def send(self, buf, dest, tag=0):
        self._wait([self.isend(buf, dest, tag)], (dest,))

    def recv(self, buf, source, tag=0):
        self._wait([self.irecv(buf, source, tag)], (source,))
        return buf

    def sendrecv(self, sendbuf, dest, recvbuf, source, tag=0):
        # The receive is posted first, so the peer's frame lands in recvbuf directly.
        rreq = self.irecv(recvbuf, source, tag)
        sreq = self.isend(sendbuf, dest, tag)
        self._wait([rreq, sreq], (source, dest) if source != dest else (source,))
        return recvbuf

    def isend(self, buf, dest, tag=0):
        """Queue a send; the caller keeps ``buf`` unchanged until the request completes."""
        arr = np.ascontiguousarray(buf)
        if dest == self.rank:
            return self._send_self(arr, tag)
        link = self._link(dest)
        req = _Request(link, tag, _byte_view(arr), arr)
        link.push(_DATA, tag, req.view, req)
        link.on_writable()  # most sends fit the kernel buffer: done without a wait
        return req

    def irecv(self, buf, source, tag=0):
        if not buf.flags.c_contiguous:
            raise ValueError("receive buffers must be C-contiguous numpy arrays")
        if source == self.rank:
            return self._recv_self(buf, tag)
        link = self._link(source)
        req = _Request(link, tag, _byte_view(buf), buf)
        link.post(req)
        return req

    def test_all(self, requests):
        requests = list(requests)
        if all(r.done for r in requests):
            return True
        self._progress(0.0)
        if not self._quiet:
            self._raise_failures(requests)
        return all(r.done for r in requests)

    def cancel_recv(self, request):
        if request.done:
            return
        if request.link is None:
            q = self._self_posted.get(request.tag)
            if q is not None and request in q:
                q.remove(request)
        else:
            request.link.cancel(request)
        request.keep = None

    def barrier(self):
        """Dissemination barrier: ``ceil(log2 p)`` rounds of empty messages."""
        empty = np.empty(0, dtype=np.uint8)
        act = self.activity
        if act is not None:
            act.token += 1
            act.peers = (-1,)
        try:
            k = 1
            while k < self.size:
                rreq = self.irecv(empty, (self.rank - k) % self.size, TAG_BARRIER)
                sreq = self.isend(empty, (self.rank + k) % self.size, TAG_BARRIER)
                self._wait([rreq, sreq], None)
                k *= 2
        finally:
            if act is not None:
                act.peers = None

    def abort(self, message, code=1):
        """Tell every peer ``message``, close, and raise :class:`CommunicatorAborted`.

        MPI's abort ends every process of the job; a socket world lives inside other
        programs (a Spark task, a Dask worker) that must stay up, so here every rank
        raises instead: this one at once, its peers in their next (or current) wait,
        with :class:`PeerLostError` quoting ``message``. From a thread other than the
        one that runs the collectives (the watchdog), the sockets are shut down and
        that thread raises :class:`CommunicatorAborted` from its wait.
        """
        sys.stderr.write(f"[rank {self.rank}] {message}\n")
        sys.stderr.flush()
        if threading.get_ident() == self._owner:
            self.close(reason=message)
            raise CommunicatorAborted(f"rank {self.rank} aborted (exit status {code}): {message}")
        self._interrupted = message
        for link in self._links.values():
            try:
                link.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def library_allreduce(self, sendbuf, recvbuf):
        raise NotImplementedError("algorithm='mpi' needs an MPI library; the socket transport has none "
                                  "(every other algorithm runs over it)")

    def node_keys(self):
        """Ranks on the same host (by name) share a node label: the lowest such rank."""
        first = {}
        return [first.setdefault(h, r) for r, h in enumerate(self._hosts)]

    # -------------------------------------------------- the watchdog's extras
    def thread_multiple(self):
        """True: the watchdog's thread has its own links (:meth:`private_channel`)."""
        return self._channel_links is not None

    def private_channel(self):
        """The second set of links, as a communicator of the same ranks for one helper thread.

        Unlike MPI's duplicate this needs no communication: the links were opened at
        the rendezvous. Only one helper may hold it.

        Returns
        -------
        SocketCommunicator
        """
        if self._channel is None:
            if self._channel_links is None:
                raise RuntimeError("this socket communicator was built without a private channel")
            self._channel = SocketCommunicator(self._channel_links, self.rank, self.size, self._hosts,
                                               endpoints=self.endpoints, quiet=True)
            self._channel_links = {}
        return self._channel

    def service_probe(self, tag):
        """Source rank of an arrived message with ``tag``, or None (never blocks)."""
        self._progress(0.0)
        for peer, link in self._links.items():
            if link.unexpected.get(tag):
                return peer
        return None

    def service_recv(self, buf, source, tag):
        """Receive a message already announced by :meth:`service_probe`."""
        req = self.irecv(buf, source, tag)
        if not req.done:
            self._wait([req], (source,))
        return buf

    def drain(self, tag):
        """Drop every arrived message with ``tag``; returns how many."""
        self._progress(0.0)
        dropped = 0
        for link in self._links.values():
            q = link.unexpected.pop(tag, None)
            for item in q or ():
                if isinstance(item, _Remote):  # unread: the sender may reuse its buffer
                    link.held -= 1
                    link.ctrl.append(_HEADER.pack(_CMADONE, item.seq, 0))
            dropped += len(q) if q else 0
        self._flush_ctrl()
        return dropped

    # ------------------------------------------------------------------ close
    def close(self, reason=None, linger=CLOSE_LINGER_S):
        """Say goodbye (or ``reason``, an abort message) to every peer and close the links.

        An orderly close sends a bye frame, half-closes each socket and reads until
        each peer has closed its end too (at most ``linger`` seconds): closing a
        socket with unread data makes the kernel reset the connection, which can
        destroy data a slower peer has not read yet.
        """
        if self._closed:
            return
        self._closed = True
        if self._channel is not None:
            self._channel.close(linger=0.0)
        elif self._channel_links:
            for sock in self._channel_links.values():
                sock.close()
        links = [link for link in self._links.values() if link.state in ("open", "left")]
        for link in links:
            if reason is not None:  # overtakes queued data: the peers learn why at once
                link.push_ctrl(_ABORT, 0, reason.encode()[:65536])
            else:
                link.push(_BYE, 0, memoryview(b""), None)
        self._flush(links, ABORT_FLUSH_S if reason is not None else linger)
        if reason is None and linger > 0:
            for link in links:
                try:
                    link.sock.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
            deadline = time.monotonic() + linger
            while any(lk.state in ("open", "left") for lk in links) and time.monotonic() < deadline:
                self._progress(min(0.05, max(deadline - time.monotonic(), 0.0)))
        for link in self._links.values():
            try:
                self._sel.unregister(link.sock)
            except (KeyError, ValueError):
                pass
            link.sock.close()
            _LENT.extend(req.keep for req in link.lent.values() if req.keep is not None)
            link.lent.clear()
            if link.pidfd is not None:
                os.close(link.pidfd)
                link.pidfd = None
            for ring in (link.shm_out, link.shm_in):
                if ring is not None:
                    ring.release()
            link.shm_out = link.shm_in = None
        self._sel.close()

    def __enter__(self):
        return self

    def __exit__(self, etype, value, tb):
        self.close(reason=None if etype is None else f"{etype.__name__}: {value}")
        return False

    # --------------------------------------------------------------- internals
    def _link(self, peer):
        if self._closed:
            raise TransportError(f"rank {self.rank}: the communicator is closed")
        link = self._links.get(peer)
        if link is None:
            raise ValueError(f"rank {peer} is not a peer of rank {self.rank} in a world of {self.size}")
        return link

    def _send_self(self, arr, tag):
        q = self._self_posted.get(tag)
        if q:
            req = q.popleft()
            _fill(req, _byte_view(arr), self.rank)
        else:
            self._self_box.setdefault(tag, deque()).append(np.array(arr, copy=True))
        done = _Request(None, tag, memoryview(b""), None)
        done.done = True
        return done

    def _recv_self(self, buf, tag):
        req = _Request(None, tag, _byte_view(buf), buf)
        box = self._self_box.get(tag)
        if box:
            _fill(req, _byte_view(box.popleft()), self.rank)
        else:
            self._self_posted.setdefault(tag, deque()).append(req)
        return req

    def _progress(self, wait):
        """Move bytes on every link: queued writes, then whatever the selector reports."""
        for link in self._links.values():
            if link.pending():
                link.on_writable()
            # Wake for room to write only when the kernel buffer was full; a message
            # waiting for shared-memory slots is woken by the peer's credit frames.
            want = link.blocked and link.pending()
            if want != link.want_write and link.state in ("open", "left"):
                link.want_write = want
                events = selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0)
                self._sel.modify(link.sock, events, link)
        if not self._links:
            if wait:
                time.sleep(wait)
            return
        held = [link for link in self._links.values() if link.held]
        if held:
            wait = min(wait, HOLD_S / 2)  # wake up to spill what waited too long
        for key, mask in self._sel.select(wait):
            link = key.data
            if mask & selectors.EVENT_READ:
                link.on_readable()
            if mask & selectors.EVENT_WRITE:
                link.on_writable()
            if link.ctrl and link.state in ("open", "left"):
                link.on_writable()  # hand slots back at once: the peer may be waiting for them
        if held:
            now = time.monotonic()
            for link in held:
                link.spill(now)
                if link.ctrl:
                    link.on_writable()
            if link.state not in ("open", "left"):
                try:
                    self._sel.unregister(link.sock)
                except (KeyError, ValueError):
                    pass

    def _flush(self, links, seconds):
        deadline = time.monotonic() + seconds
        while any(lk.pending() and lk.state in ("open", "left") for lk in links) and time.monotonic() < deadline:
            self._progress(min(0.05, max(deadline - time.monotonic(), 0.0)))

    def _wait(self, requests, peers):
        """Progress until every request is done; raise on a lost peer, an abort or the timeout."""
        if all(r.done for r in requests):
            self._flush_ctrl()
            return
        act = self.activity
        if act is not None:
            act.token += 1
            act.peers = tuple(peers) if peers is not None else (-1,)
        start = time.monotonic()
        try:
            while True:
                # Blocks in the selector (woken by data, or by room to write when a send is
                # queued): spinning here would steal the core a peer on this machine needs.
                self._progress(0.2)
                if all(r.done for r in requests):
                    self._flush_ctrl()
                    return
                try:
                    self._raise_failures(requests)
                except TransportError:
                    self._keep_lent()
                    raise
                if self.timeout is None and self._read_rest_blocking(requests) and all(r.done for r in requests):
                    self._flush_ctrl()
                    return
                if self.timeout is not None and time.monotonic() - start > self.timeout:
                    waiting = sorted({r.link.peer if r.link is not None else self.rank
                                      for r in requests if not r.done})
                    self._keep_lent()
                    raise TransportTimeout(
                        f"rank {self.rank} waited {time.monotonic() - start:.1f} s (limit {self.timeout:g} s, "
                        f"{ENV_WAIT_TIMEOUT}) for rank(s) {waiting} (tag {requests[0].tag}){self._where()}")
        finally:
            if act is not None:
                act.peers = None

    def _flush_ctrl(self):
        """Write whatever answers (credits, "read") are still queued, without waiting."""
        for link in self._links.values():
            if (link.ctrl or link._tx is not None) and link.state in ("open", "left"):
                link.on_writable()

    def _keep_lent(self):
        """Keep every buffer a peer may still read alive: this rank is about to give up on it."""
        for link in self._links.values():
            _LENT.extend(req.keep for req in link.lent.values() if req.keep is not None)

    def _read_rest_blocking(self, requests):
        """Read the rest of a large frame already being received, in one blocking call.

        Only when nothing of this rank waits to be written (so no peer can be waiting
        for bytes of ours while this call blocks): the kernel then fills the buffer
        without returning to Python per chunk (``MSG_WAITALL``), which on a loaded
        machine saves a wake-up of this process per 64 KiB (benchmarks/bench_socket.py).
        An abort from another thread shuts the socket down, which ends the call.

        Returns
        -------
        bool
            True if it read something.
        """
        if any(link.pending() for link in self._links.values()):
            return False
        for req in requests:
            link = req.link
            if req.done or link is None or link._cur is None or link._cur[4] is not req:
                continue
            cur = link._cur
            rest = len(cur[2]) - cur[3]
            if rest < _BLOCKING_READ_MIN:
                return False
            link.sock.setblocking(True)
            try:
                n = link.sock.recv_into(cur[2][cur[3]:], rest, socket.MSG_WAITALL)
            except OSError as exc:
                link._gone(f"its connection failed ({exc.strerror or exc})")
                return True
            finally:
                try:
                    link.sock.setblocking(False)
                except OSError:
                    pass
            if n == 0:
                link._gone("its connection closed without a goodbye (the process ended or was killed)")
                return True
            cur[3] += n
            if cur[3] == len(cur[2]):
                link._finish()
                link.on_readable()  # whatever followed it
            return True
        return False

    def _where(self):
        act = self.activity
        return f" in collective #{act.seq} ({act.op})" if act is not None and act.seq else ""

    def _raise_failures(self, requests):
        if self._interrupted is not None:
            raise CommunicatorAborted(f"rank {self.rank} aborted: {self._interrupted}")
        for link in self._links.values():
            if link.state == "aborted":
                raise PeerLostError(f"rank {link.peer} aborted while rank {self.rank} waited{self._where()}: "
                                    f"{link.reason}")
            if link.state == "lost":
                raise PeerLostError(f"rank {link.peer}{self._endpoint(link.peer)}: {link.reason}, while rank "
                                    f"{self.rank} waited{self._where()}; the job cannot go on without it")
        for r in requests:
            if not r.done and r.link is not None and r.link.state == "closed":
                raise PeerLostError(f"rank {r.link.peer} closed its communicator while rank {self.rank} still "
                                    f"waits for it (tag {r.tag}){self._where()}: the ranks' collectives differ")
            if not r.done and r.link is None and not self._self_box.get(r.tag):
                raise TransportError(f"rank {self.rank} waits for a message from itself that was never sent")

    def _endpoint(self, peer):
        return f" ({self.endpoints[peer]})" if self.endpoints else ""


def connect(listener, endpoints, rank, token=b"", timeout=None, connect_timeout=None, shm=None):
    """Finish the rendezvous from an open listener; the communicator of rank ``rank``.

    Parameters
    ----------
    listener : native.rendezvous.Listener
        Listening at ``endpoints[rank]`` (closed on return).
    endpoints : sequence of str
        Every rank's ``host:port`` in rank order (e.g. from Spark's
        ``BarrierTaskContext.allGather``).
    rank : int
    token : bytes
    timeout, connect_timeout : float, optional
        As in :meth:`SocketCommunicator.from_endpoints`.
    shm : bool, optional
        Whether this rank offers shared memory to the peers on its machine
        (:mod:`native.shm_link`); default ``HISTFOREST_SOCKET_SHM`` (unset: yes).
        A pair uses it only if both ranks offer it.

    Returns
    -------
    SocketCommunicator
        The thread that calls this owns it (runs its collectives).
    """
    if timeout is None:
        timeout = wait_timeout_setting()
    if connect_timeout is None:
        connect_timeout = connect_timeout_setting()
    start = time.monotonic()
    links, hosts = connect_mesh(listener, list(endpoints), rank, token=token, timeout=connect_timeout)
    try:
        rings = shm_link.setup(links[0], rank, hosts, token=token, want=shm,
                               timeout=max(connect_timeout - (time.monotonic() - start), 1.0))
    except (OSError, EOFError) as exc:
        for chan in links.values():
            for sock in chan.values():
                sock.close()
        if isinstance(exc, TimeoutError):
            raise RendezvousTimeout(f"rank {rank}: {exc}") from None
        raise RendezvousError(f"rank {rank}: the links were made but a peer failed right after ({exc})") from None
    except BaseException:
        for chan in links.values():
            for sock in chan.values():
                sock.close()
        raise
    return SocketCommunicator(links[0], rank, len(endpoints), hosts, timeout=timeout, channel_links=links[1],
                              endpoints=endpoints, shm=rings)


def loopback_world_endpoints(size, host="127.0.0.1"):
    """``size`` listeners on free loopback ports and their endpoints (tests, benchmarks).

    Returns
    -------
    listeners : list of native.rendezvous.Listener
    endpoints : list of str
    """
    listeners = [Listener(host, 0) for _ in range(size)]
    return listeners, [lst.address for lst in listeners]

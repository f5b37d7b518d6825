"""Same-machine paths between socket ranks: single copy and shared-memory slots (issue 36).

Over TCP loopback every byte of a large message is copied into the kernel, pushed
through the TCP stack and copied out again (and on the 2-core test machine loopback
segments were seen arriving out of order, answered by spurious retransmissions; see
:mod:`native.socket_comm`). MPI libraries move bytes between ranks of one machine
without TCP (MPICH over UCX: shared memory, and for large messages a single copy with
``process_vm_readv``); this module lets :mod:`native.socket_comm` do the same, so
comparing the two transports compares like with like.

Single copy
-----------
Where the kernel lets a rank read a peer's memory (same user, no ptrace restriction,
same PID namespace: checked at connection time by reading a random cookie at the
address the peer gives), a message of :data:`SINGLE_COPY_MIN_BYTES` or more is read by
the receiver straight from the sender's buffer into its own (:func:`read_remote`). A
pidfd of the peer, checked after every read, guarantees the pid still named the peer.
``HISTFOREST_SOCKET_CMA=0`` turns it off.

Slots
-----
For smaller messages (from :data:`SHM_MIN_BYTES`), and for all of them where single
copy is not permitted, every rank creates one segment in ``/dev/shm`` holding one
*ring* per peer on its machine: a header page (a random cookie, so a peer can tell that it mapped the same
memory) and ``slots`` slots of ``slot_bytes``. The ring from rank ``a`` to rank ``b``
is written only by ``a`` and read only by ``b``. The TCP link between the two stays
and carries everything else: the frame that announces a message (kind, tag, size),
one small frame per slot filled ("chunk in slot k, n bytes") and one per slot
emptied ("credit for slot k"). A waiting rank therefore still blocks in ``select`` on
its sockets (no spinning, so ranks oversubscribing the cores leave them to each
other), and a peer that dies still closes its socket, which ends every wait on it
with :class:`native.socket_comm.PeerLostError` exactly as without shared memory.

Which pairs use it
------------------
Decided at connection time by :func:`setup`, over the freshly made TCP links: two
ranks use these paths when they report the same host name and the same
``/proc/sys/kernel/random/boot_id`` and both have them enabled
(``HISTFOREST_SOCKET_SHM``, default on; ``0`` turns off both paths); the slots also
need the peer to map the segment and read the cookie back (containers on one host
with private ``/dev/shm`` fail that check and keep TCP). Every other pair, in
particular ranks on different machines, uses TCP.

Nothing is left behind: a segment's name carries the job token's hash, the rank and
the process id, space is reserved with ``posix_fallocate`` (a full ``/dev/shm`` fails
here, cleanly, instead of with ``SIGBUS`` at the first write), and the creator
unlinks it as soon as each peer has answered whether it mapped it (or on any error),
so after :func:`setup` returns the memory lives only in the mappings and vanishes
with the last process, killed or not. Only a rank killed inside :func:`setup`, between
creating and unlinking (two small messages each way), can leave its segment behind.
"""
import ctypes
import errno
import hashlib
import mmap
import os
import secrets
import select
import socket
import struct
import time

import numpy as np

from .settings import flag

ENV_SHM = "HISTFOREST_SOCKET_SHM"
ENV_CMA = "HISTFOREST_SOCKET_CMA"
SHM_DIR = "/dev/shm"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

#: Messages of at least this many bytes go through shared memory (smaller ones: TCP,
#: where one system call carries them and no slot hand-over is needed).
SHM_MIN_BYTES = 64 << 10
#: Messages of at least this many bytes are read from the sender's memory where that
#: is permitted; smaller ones go through the slots, whose sends complete without
#: waiting for the receiver (measured with benchmarks/bench_socket.py on 2 loaded
#: cores: slots faster at 1-2 MiB messages, single copy at 5 MiB and more).
SINGLE_COPY_MIN_BYTES = 4 << 20
#: Slots per ring and the bytes of each (shrunk for many peers, see :func:`ring_geometry`).
SLOTS = 4
SLOT_BYTES = 1 << 20
#: Upper bound on the shared memory one rank creates for all its rings.
MAX_SEGMENT_BYTES = 64 << 20
_PAGE = mmap.PAGESIZE
_COOKIE = 16

_IDENT = struct.Struct("<8sqq64s")        # magic, shared memory on, single copy on, boot id
_PROBE = struct.Struct("<8sqqq16s")       # magic, single copy on, pid, address of the cookie, cookie
_READ = struct.Struct("<8sq")             # magic, could read it
_OFFER = struct.Struct("<8sqqqq128s16s")  # magic, ok, offset, slots, slot bytes, name, cookie
_ANSWER = struct.Struct("<8sq")           # magic, mapped
_MAGIC = b"HFSHM002"


def enabled():
    """``HISTFOREST_SOCKET_SHM`` (default on) and a ``/dev/shm`` to put segments in."""
    return flag(ENV_SHM, True) and os.path.isdir(SHM_DIR)


def single_copy_enabled():
    """``HISTFOREST_SOCKET_CMA`` (default on) and ``process_vm_readv`` in the C library."""
    return flag(ENV_CMA, True) and _process_vm_readv is not None


def boot_id():
    """This machine's boot id (equal host names and boot ids: the same running kernel)."""
    try:
        with open(BOOT_ID_PATH) as f:
            return f.read().strip()
    except OSError:
        return ""


def ring_geometry(npeers):
    """Slots and slot size of each of ``npeers`` rings, within :data:`MAX_SEGMENT_BYTES`.

    Returns
    -------
    slots, slot_bytes : int, int
        ``slot_bytes`` a multiple of the page size, at least 64 KiB.
    """
    per_ring = min(SLOTS * SLOT_BYTES, max(MAX_SEGMENT_BYTES // max(npeers, 1), 4 * (64 << 10)))
    slot = max((per_ring // SLOTS) // _PAGE * _PAGE, 64 << 10)
    return SLOTS, slot


# ------------------------------------------------------------ single copy (CMA)
class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _find_readv():
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IOVec), ctypes.c_ulong, ctypes.POINTER(_IOVec), ctypes.c_ulong,
                   ctypes.c_ulong]
    return fn


_process_vm_readv = _find_readv()


def address(view):
    """Address of the first byte of a buffer (a memoryview, bytearray or array)."""
    return np.frombuffer(view, dtype=np.uint8).ctypes.data if len(view) else 0


def read_remote(pid, remote, view):
    """Copy ``len(view)`` bytes at address ``remote`` of process ``pid`` into ``view``.

    One copy, done by the kernel (``process_vm_readv``), as MPI libraries do between
    ranks of one machine. The GIL is released during the call.

    Raises
    ------
    OSError
        The process is gone (``ESRCH``), the memory is not mapped there any more
        (``EFAULT``) or reading it is not permitted (``EPERM``).
    """
    n = len(view)
    local = address(view)
    done = 0
    while done < n:
        k = min(n - done, 1 << 30)
        liov = _IOVec(local + done, k)
        riov = _IOVec(remote + done, k)
        got = _process_vm_readv(pid, ctypes.byref(liov), 1, ctypes.byref(riov), 1, 0)
        if got < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        if got == 0:
            raise OSError(errno.EFAULT, "process_vm_readv read nothing")
        done += got


class Ring:
    """One direction of one pair: ``slots`` slots in a mapping (writer or reader side).

    Attributes
    ----------
    slots : list of memoryview
        Each ``slot_bytes`` long.
    free : list of int
        Writer side: slots the reader has handed back (all of them at first).
    """

    def __init__(self, mapping, base, nslots, slot_bytes):
        self._map = mapping
        view = memoryview(mapping)
        self.slot_bytes = slot_bytes
        self.slots = [view[base + _PAGE + k * slot_bytes: base + _PAGE + (k + 1) * slot_bytes]
                      for k in range(nslots)]
        self.free = list(range(nslots))[::-1]

    def release(self):
        """Drop the views (the mapping itself goes with its last reference)."""
        for s in self.slots:
            s.release()
        self.slots = []


class PeerPath:
    """How large messages move between this rank and one peer on its machine.

    Attributes
    ----------
    read_pid : int or None
        The peer's process id when this rank can read the peer's memory (the peer's
        large sends then reach this rank in one copy).
    lend : bool
        The peer can read this rank's memory: large sends to it go in one copy.
    pidfd : int or None
        A pidfd of the peer's process (with ``read_pid``): readable once it ended.
    ring_out, ring_in : Ring or None
        Slot rings for a direction without single copy.
    """

    def __init__(self):
        self.read_pid = None
        self.pidfd = None
        self.lend = False
        self.ring_out = None
        self.ring_in = None


def _send_all(socks, blobs):
    for peer, sock in socks.items():
        sock.sendall(blobs[peer])


def _recv_all(socks, size, what, deadline):
    out = {}
    for peer, sock in socks.items():
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        buf = bytearray(size)
        view = memoryview(buf)
        got = 0
        while got < size:
            try:
                n = sock.recv_into(view[got:])
            except socket.timeout:
                raise TimeoutError(f"rank {peer} did not answer the shared-memory {what} in time") from None
            if n == 0:
                raise ConnectionError(f"rank {peer} closed its link during the shared-memory {what}")
            got += n
        out[peer] = bytes(buf)
    for sock in socks.values():
        sock.settimeout(None)
    return out


def _unpack(fmt, blob, peer):
    fields = fmt.unpack(blob)
    if fields[0] != _MAGIC:
        raise ConnectionError(f"rank {peer} does not speak this version of the socket transport")
    return fields[1:]


def setup(socks, rank, hosts, token=b"", timeout=60.0, want=None, single_copy=None):
    """Agree with every peer on how large messages move (see the module docstring).

    Every rank of the world must call it, with its channel-0 sockets, right after the
    rendezvous: it speaks on them (five small messages each way with every peer on
    this machine, one with the others).

    Parameters
    ----------
    socks : dict of int to socket.socket
        Peer rank -> connected blocking socket.
    rank : int
    hosts : list of str
        Host name of every rank.
    token : bytes
        The job token (names the segment).
    timeout : float
        Seconds for the whole exchange.
    want, single_copy : bool, optional
        Override :func:`enabled` and :func:`single_copy_enabled` (tests, benchmarks).

    Returns
    -------
    dict of int to PeerPath
        Only peers on this machine with which some path was agreed; the others use TCP.
    """
    deadline = time.monotonic() + timeout
    mine = enabled() if want is None else bool(want)
    cma = mine and (single_copy_enabled() if single_copy is None else bool(single_copy) and
                    _process_vm_readv is not None)
    me_boot = boot_id()
    # Round 1: which machine, what is switched on.
    ident = _IDENT.pack(_MAGIC, int(mine), int(cma), me_boot.encode()[:64])
    _send_all(socks, {p: ident for p in socks})
    idents = _recv_all(socks, _IDENT.size, "greeting", deadline)
    local = []
    their_cma = {}
    for peer in sorted(socks):
        on, on_cma, their_boot = _unpack(_IDENT, idents[peer], peer)
        their_boot = their_boot.rstrip(b"\0").decode(errors="replace")
        if mine and on and me_boot and their_boot == me_boot and hosts[peer] == hosts[rank]:
            local.append(peer)
            their_cma[peer] = bool(on_cma)
    paths = {peer: PeerPath() for peer in local}
    if not local:
        return paths
    local_socks = {p: socks[p] for p in local}
    # Rounds 2-3: can each read the other's memory? Read a cookie where the peer says it is.
    cookie = bytearray(secrets.token_bytes(_COOKIE))
    probe = _PROBE.pack(_MAGIC, int(cma), os.getpid(), address(cookie), bytes(cookie))
    _send_all(local_socks, {p: probe for p in local})
    probes = _recv_all(local_socks, _PROBE.size, "probe", deadline)
    reads = {}
    for peer in local:
        on_cma, pid, where, their_cookie = _unpack(_PROBE, probes[peer], peer)
        ok = False
        if cma and on_cma:
            got = bytearray(_COOKIE)
            try:
                read_remote(pid, where, got)
                ok = bytes(got) == their_cookie
            except OSError:
                ok = False
        if ok:
            try:
                # Checked after every read: while the peer lives its pid is its own, so a
                # read that ends with the peer still alive read the peer's memory.
                paths[peer].pidfd = os.pidfd_open(pid)
            except (OSError, AttributeError):
                ok = False
        if ok:
            paths[peer].read_pid = pid
        reads[peer] = _READ.pack(_MAGIC, int(ok))
    _send_all(local_socks, reads)
    answers = _recv_all(local_socks, _READ.size, "probe answer", deadline)
    for peer in local:
        paths[peer].lend = bool(_unpack(_READ, answers[peer], peer)[0])
    del cookie  # read by now
    # Rounds 4-5: slot rings (for the messages below SINGLE_COPY_MIN_BYTES, and all of
    # them in a direction without single copy).
    need_out = list(local)
    nslots, slot_bytes = ring_geometry(len(need_out))
    ring_bytes = _PAGE + nslots * slot_bytes
    name = f"histforest-{hashlib.sha1(token).hexdigest()[:12]}-r{rank}-p{os.getpid()}-{secrets.token_hex(4)}"
    path = os.path.join(SHM_DIR, name)
    mapping = None
    created = False
    try:
        if need_out:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                created = True
                try:
                    os.posix_fallocate(fd, 0, ring_bytes * len(need_out))
                    mapping = mmap.mmap(fd, ring_bytes * len(need_out))
                finally:
                    os.close(fd)
            except OSError:
                mapping = None  # no room or no /dev/shm: offer nothing, keep TCP
        offers = {}
        for peer in local:
            k = need_out.index(peer) if peer in need_out else -1
            ring_cookie = secrets.token_bytes(_COOKIE)
            ok = mapping is not None and k >= 0
            if ok:
                mapping[k * ring_bytes: k * ring_bytes + _COOKIE] = ring_cookie
            offers[peer] = _OFFER.pack(_MAGIC, int(ok), max(k, 0) * ring_bytes, nslots, slot_bytes,
                                       name.encode(), ring_cookie)
        _send_all(local_socks, offers)
        theirs = _recv_all(local_socks, _OFFER.size, "offer", deadline)
        answers = {}
        for peer in local:
            ok, offset, their_slots, their_slot_bytes, their_name, ring_cookie = _unpack(_OFFER, theirs[peer], peer)
            ring = _map_peer(their_name.rstrip(b"\0").decode(errors="replace"), offset, their_slots,
                             their_slot_bytes, ring_cookie) if ok else None
            paths[peer].ring_in = ring
            answers[peer] = _ANSWER.pack(_MAGIC, int(ring is not None))
        # Round 5: did you map mine? Then nobody needs the name any more.
        _send_all(local_socks, answers)
        replies = _recv_all(local_socks, _ANSWER.size, "answer", deadline)
    finally:
        if created:
            try:
                os.unlink(path)
            except OSError:
                pass
    for peer in need_out:
        k = need_out.index(peer)
        if mapping is not None and _unpack(_ANSWER, replies[peer], peer)[0]:
            paths[peer].ring_out = Ring(mapping, k * ring_bytes, nslots, slot_bytes)
    return {p: path for p, path in paths.items()
            if path.lend or path.read_pid is not None or path.ring_in is not None or path.ring_out is not None}


def process_ended(pidfd):
    """True once the process of ``pidfd`` has ended (its pid may then name another)."""
    return bool(select.select([pidfd], [], [], 0)[0])


def _map_peer(name, offset, nslots, slot_bytes, cookie):
    """Map a peer's ring read-write; None if it cannot be opened or is not the same memory."""
    if "/" in name or not name.startswith("histforest-") or nslots <= 0 or slot_bytes <= 0 or offset % _PAGE:
        return None
    ring_bytes = _PAGE + nslots * slot_bytes
    try:
        fd = os.open(os.path.join(SHM_DIR, name), os.O_RDWR)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_size < offset + ring_bytes:
            return None
        mapping = mmap.mmap(fd, ring_bytes, offset=offset)
    except OSError:
        return None
    finally:
        os.close(fd)
    if mapping[:_COOKIE] != cookie:
        mapping.close()
        return None
    return Ring(mapping, 0, nslots, slot_bytes)

"""Rendezvous for the socket transport: ``host:port`` endpoints -> a full mesh of TCP links.

Every rank listens on one port; rank ``i`` connects to each lower rank ``j < i`` and
accepts one connection from each higher rank, so every pair ends with one link per
channel (channel 0 carries the collectives, channel 1 the watchdog's questions, the
analogue of the duplicate communicator MPI gives it). Connecting before accepting
cannot deadlock: the kernel completes a TCP handshake on the listening socket's
backlog without the listener's program taking part.

Each link opens with a small handshake, so a wrong list fails with a message instead
of a hang or silently mixed-up ranks: the connecting rank states who it is, whom it
meant to reach, the world size and a job token; the accepting rank checks all of it
and answers with its rank and host name. A connection that does not speak the
protocol (a port scanner, a stale connection from a failed earlier attempt of the same
job, which carries another token) is closed and ignored, not taken for a rank.

Errors: :class:`RendezvousError` (a ``ValueError`` for lists that cannot work: bad
syntax, wrong size, disagreeing ranks) and :class:`RendezvousTimeout` (a
``TimeoutError``: some rank never came), both naming the rank and endpoint concerned.
"""
import socket
import struct
import time

#: Protocol magic and version: the first bytes of every handshake.
MAGIC = b"HFSOCK01"
#: Channels of one pair of ranks: 0 = collectives, 1 = the watchdog's private channel.
CHANNELS = (0, 1)
#: Handshake: magic, size, from rank, to rank, channel, token length, host length.
_HELLO = struct.Struct("<8sqqqqqq")
#: Reply: magic, status (0 = accepted), rank, host length, message length.
_REPLY = struct.Struct("<8sqqqq")
_MAX_TEXT = 4096

ENV_TIMEOUT = "HISTFOREST_SOCKET_CONNECT_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0


class RendezvousError(ValueError):
    """The endpoints cannot form this world (bad syntax, wrong size, ranks that disagree)."""


class RendezvousTimeout(TimeoutError):
    """Some rank did not connect, or could not be reached, before the deadline."""


def parse_endpoint(text):
    """Split ``"host:port"`` (``"[v6 address]:port"`` for IPv6) into ``(host, port)``.

    Raises
    ------
    RendezvousError
        Not of that form, or the port is not in 1..65535.
    """
    if not isinstance(text, str):
        raise RendezvousError(f"endpoint {text!r} is not a 'host:port' string")
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise RendezvousError(f"endpoint {text!r} is not 'host:port' with a port in 1..65535")
    return host, int(port)


def format_endpoint(host, port):
    """``host:port`` (brackets around an IPv6 address)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Listener:
    """A listening TCP socket whose address the other ranks are told.

    Parameters
    ----------
    host : str
        Interface to bind (``""`` or ``"0.0.0.0"``: all of them).
    port : int
        0 lets the kernel pick a free port (the Spark and Dask launchers do, then
        exchange the addresses).
    advertise : str, optional
        Host name or address the others should connect to; default: ``host`` unless it
        is a wildcard, else this machine's name resolved to an address.
    """

    def __init__(self, host="", port=0, advertise=None, backlog=128):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        # A restarted job may reuse the port of one that just ended (TIME_WAIT).
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as exc:
            self.sock.close()
            raise RendezvousError(f"cannot listen on {format_endpoint(host or '0.0.0.0', port)}: "
                                  f"{exc.strerror or exc}") from None
        self.sock.listen(backlog)
        self.port = self.sock.getsockname()[1]
        if advertise is None:
            advertise = host if host not in ("", "0.0.0.0", "::") else _own_address()
        self.address = format_endpoint(advertise, self.port)

    def close(self):
        self.sock.close()


def _own_address():
    """An address of this machine the others can reach (its name, resolved)."""
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def connect_mesh(listener, endpoints, rank, token=b"", timeout=DEFAULT_TIMEOUT_S):
    """Open one link per channel to every other rank.

    Parameters
    ----------
    listener : Listener
        This rank's listening socket (its address is ``endpoints[rank]``); closed on
        return.
    endpoints : sequence of str, length ``size``
        ``host:port`` of every rank, in rank order, the same list on every rank.
    rank : int
    token : bytes
        Identifies the job (and attempt); connections with another token are refused.
    timeout : float
        Seconds for the whole rendezvous.

    Returns
    -------
    links : dict
        ``{channel: {peer rank: socket}}`` for the channels of :data:`CHANNELS`
        (blocking sockets, ``TCP_NODELAY`` set).
    hosts : list of str, length ``size``
        Each rank's host name (``socket.gethostname()``), for the node layout.

    Raises
    ------
    RendezvousError, RendezvousTimeout
    """
    size = len(endpoints)
    if not 0 <= rank < size:
        raise RendezvousError(f"rank {rank} is not in 0..{size - 1} ({size} endpoints)")
    parsed = [parse_endpoint(e) for e in endpoints]
    seen = {}
    for r, address in enumerate(parsed):
        if address in seen:
            raise RendezvousError(f"endpoint {endpoints[r]} is given for rank {seen[address]} and rank {r}: "
                                  "each rank needs its own port")
        seen[address] = r
    deadline = time.monotonic() + timeout
    me = socket.gethostname()
    hosts = [None] * size
    hosts[rank] = me
    links = {c: {} for c in CHANNELS}
    try:
        for peer in range(rank):
            for channel in CHANNELS:
                sock, host = _connect(parsed[peer], endpoints[peer], rank, peer, size, channel, token, me, deadline)
                links[channel][peer] = sock
                hosts[peer] = host
        expected = {(peer, c) for peer in range(rank + 1, size) for c in CHANNELS}
        while expected:
            peer, channel, sock, host = _accept(listener, rank, size, token, me, deadline, timeout, expected,
                                               endpoints)
            expected.discard((peer, channel))
            links[channel][peer] = sock
            hosts[peer] = host
    except BaseException:
        for chan in links.values():
            for sock in chan.values():
                sock.close()
        raise
    finally:
        listener.close()
    return links, hosts


#: Kernel buffer bytes per direction of a link, or None: the kernel's own sizing. Setting
#: SO_RCVBUF turns off the kernel's receive-buffer autotuning and caps the buffer at
#: ``net.core.rmem_max``; over loopback on the 2-core test machine (TCP only, 64 MiB
#: allreduces at p = 2, 3, 4, interleaved) autotuning was as fast or faster than fixed
#: 256 KiB, 1 MiB and 4 MiB buffers in every comparison (noisy, load average 5-6).
SOCKET_BUFFER_BYTES = None


def _tune(sock):
    # Collectives send many small messages (handshakes, split records, the shared-memory
    # paths' announcements and answers): no Nagle delay.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if SOCKET_BUFFER_BYTES is None:
        return
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        except OSError:
            pass


def _connect(address, text, rank, peer, size, channel, token, me, deadline):
    """Connect to ``peer`` (retrying while it is not listening yet) and shake hands."""
    pause = 0.01
    last = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise RendezvousTimeout(f"rank {rank} could not connect to rank {peer} at {text} "
                                    f"({last or 'no answer'}); is rank {peer} running, and is the endpoint "
                                    f"list the same on every rank? ({ENV_TIMEOUT} sets the limit)")
        try:
            sock = socket.create_connection(address, timeout=min(remaining, 5.0))
        except OSError as exc:
            # Refused or unreachable: the peer may not listen yet (ranks start at
            # different times); keep trying until the deadline.
            last = exc.strerror or str(exc)
            time.sleep(min(pause, max(deadline - time.monotonic(), 0)))
            pause = min(2 * pause, 0.5)
            continue
        break
    try:
        _tune(sock)
        sock.settimeout(max(deadline - time.monotonic(), 0.001))
        host_b = me.encode()[:_MAX_TEXT]
        sock.sendall(_HELLO.pack(MAGIC, size, rank, peer, channel, len(token), len(host_b)) + token + host_b)
        magic, status, their_rank, host_len, msg_len = _REPLY.unpack(read_exact(sock, _REPLY.size))
        if magic != MAGIC or not 0 <= host_len <= _MAX_TEXT or not 0 <= msg_len <= _MAX_TEXT:
            raise RendezvousError(f"rank {rank}: {text} (given for rank {peer}) is not a histforest rank")
        host = read_exact(sock, host_len).decode(errors="replace")
        message = read_exact(sock, msg_len).decode(errors="replace")
        if status != 0:
            raise RendezvousError(f"rank {rank}: the rank at {text} refused the connection: {message}")
        sock.settimeout(None)
        return sock, host
    except socket.timeout:
        sock.close()
        raise RendezvousTimeout(f"rank {rank}: the process at {text} (rank {peer}) accepted the connection "
                                "but did not answer the handshake in time") from None
    except (ConnectionError, EOFError) as exc:
        sock.close()
        raise RendezvousError(f"rank {rank}: the process at {text} (rank {peer}) dropped the handshake "
                              f"({exc}); is it a histforest rank of this job?") from None
    except BaseException:
        sock.close()
        raise


def _accept(listener, rank, size, token, me, deadline, timeout, expected, endpoints):
    """Accept connections until one is a valid hello from an expected (peer, channel)."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = sorted({p for p, _ in expected})
            where = ", ".join(f"rank {p} ({endpoints[p]})" for p in missing)
            raise RendezvousTimeout(f"rank {rank} (listening at {endpoints[rank]}) waited {timeout:g} s "
                                    f"for {where} to connect; did every rank start, with this same endpoint "
                                    f"list? ({ENV_TIMEOUT} sets the limit)")
        listener.sock.settimeout(remaining)
        try:
            sock, _ = listener.sock.accept()
        except socket.timeout:
            continue
        try:
            sock.settimeout(max(min(deadline - time.monotonic(), 10.0), 0.001))
            hello = read_exact(sock, _HELLO.size)
            magic, their_size, their_rank, to_rank, channel, tok_len, host_len = _HELLO.unpack(hello)
            if magic != MAGIC or not 0 <= tok_len <= _MAX_TEXT or not 0 <= host_len <= _MAX_TEXT:
                sock.close()  # not one of ours
                continue
            their_token = read_exact(sock, tok_len)
            host = read_exact(sock, host_len).decode(errors="replace")
        except (OSError, EOFError):
            sock.close()  # a dropped or silent stranger: keep waiting for the ranks
            continue
        problem = None
        if their_token != token:
            problem = "it belongs to another job or attempt (different token)"
        elif their_size != size:
            problem = f"it has {their_size} endpoints and rank {rank} has {size}: the lists differ"
        elif to_rank != rank:
            problem = (f"it was given this endpoint ({endpoints[rank]}) for rank {to_rank}, but this is rank "
                       f"{rank}: the endpoint lists are not in the same rank order everywhere")
        elif (their_rank, channel) not in expected:
            problem = f"rank {their_rank} channel {channel} is not expected here (duplicate rank?)"
        message = (problem or "").encode()[:_MAX_TEXT]
        host_b = me.encode()[:_MAX_TEXT]
        try:
            sock.sendall(_REPLY.pack(MAGIC, 1 if problem else 0, rank, len(host_b), len(message)) + host_b + message)
        except OSError:
            sock.close()
            continue
        if problem is not None:
            sock.close()
            if their_token != token:
                continue  # a stale attempt: not this job's concern
            raise RendezvousError(f"rank {rank} refused a connection from rank {their_rank}: {problem}")
        _tune(sock)
        sock.settimeout(None)
        return their_rank, channel, sock, host


def read_exact(sock, n):
    """Exactly ``n`` bytes from a blocking socket (``EOFError`` if it closes first)."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)

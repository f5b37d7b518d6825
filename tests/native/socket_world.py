"""Thread ranks joined by real TCP sockets on loopback, for the socket-transport tests.

Like :class:`native.threads.ThreadWorld`, but each thread rank holds its own
:class:`native.socket_comm.SocketCommunicator`, built by the real rendezvous from
``127.0.0.1:port`` endpoints, so every byte crosses the kernel's TCP stack.
"""
import threading
import time

from native.socket_comm import connect, loopback_world_endpoints


def run_socket_world(size, fn, timeout=None, join_s=120.0):
    """Run ``fn(comm)`` on ``size`` socket ranks; return ``(results, errors)`` per rank.

    Parameters
    ----------
    size : int
    fn : callable
        Called with each rank's communicator (closed afterwards in an orderly way,
        or with the error as reason when ``fn`` raised).
    timeout : float, optional
        The communicators' wait bound.

    Returns
    -------
    results, errors : list, list
        ``fn``'s value and the exception (or None) of each rank.
    """
    listeners, endpoints = loopback_world_endpoints(size)
    results, errors = [None] * size, [None] * size

    def body(r):
        try:
            comm = connect(listeners[r], endpoints, r, token=b"test", timeout=timeout)
        except BaseException as exc:  # reported per rank
            errors[r] = exc
            return
        try:
            results[r] = fn(comm)
        except BaseException as exc:
            errors[r] = exc
            comm.close(reason=f"{type(exc).__name__}: {exc}")
            return
        comm.close()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + join_s
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0.0))
    if any(t.is_alive() for t in threads):
        raise RuntimeError("a socket rank is still blocked (deadlock)")
    return results, errors


def run_ok(size, fn, timeout=60.0):
    """:func:`run_socket_world`, raising the first rank's error if any failed."""
    results, errors = run_socket_world(size, fn, timeout=timeout)
    for r, exc in enumerate(errors):
        if exc is not None:
            raise RuntimeError(f"socket rank {r} of {size} failed: {exc!r}") from exc
    return results

"""Traffic counters: what this rank's collectives sent, counted at the send.

:data:`STATS` is process-wide. Every point-to-point send issued by a collective in
:mod:`native` adds its byte count here (``native.transport`` is the only writer), so
"bytes sent per rank" in benchmarks and the CLI is measured, not derived from a
formula. MPI's own ``Allreduce`` (``algorithm="mpi"``) is opaque: its calls are
counted but its bytes are not, and ``opaque_calls`` says how many such calls there
were.

Tracing (off by default): :meth:`CollectiveStats.start_trace` makes every public
collective append one :class:`CollectiveEvent` (operation, algorithm, buffer bytes,
rank count, start time, bytes this rank sent in it); the trace-driven cost model
(``forest.cli.cost_model``) reads these sequences. Off, it costs one attribute test per
call.
"""
import time
from collections import Counter, namedtuple

#: One traced collective call. ``nbytes``: the buffer's bytes as the caller passed it
#: (for gathers: this rank's block); ``sent``: bytes this rank sent during the call
#: (filled in when the next event starts or the trace stops).
CollectiveEvent = namedtuple("CollectiveEvent", "start op algorithm nbytes p sent")


class CollectiveStats:
    """Counters of collective calls and point-to-point traffic on this rank.

    Attributes
    ----------
    bytes_sent : int
        Payload bytes this rank sent in collectives since the last :meth:`reset`.
    messages : int
        Point-to-point messages this rank sent (zero-length ones included).
    calls : collections.Counter
        Number of calls per public collective name (``"allreduce"``, ...).
    bytes_by_op : collections.Counter
        ``bytes_sent`` split by public collective name; check-mode traffic is
        listed under ``"check"``.
    opaque_calls : int
        Calls that went to the MPI library's own collective, whose bytes are unknown.
    """

    def __init__(self):
        self.reset()

    def reset(self):
        """Set every counter to zero."""
        self.bytes_sent = 0
        self.messages = 0
        self.calls = Counter()
        self.bytes_by_op = Counter()
        self.opaque_calls = 0
        self._current = None
        self.trace = None
        self._open = None

    def snapshot(self):
        """Plain-dict copy of the counters (for printing or comparing).

        Returns
        -------
        dict
        """
        return {
            "bytes_sent": self.bytes_sent,
            "messages": self.messages,
            "calls": dict(self.calls),
            "bytes_by_op": dict(self.bytes_by_op),
            "opaque_calls": self.opaque_calls,
        }

    def summary(self):
        """One line for logs, e.g. ``'3 collectives, 12 messages, 1.5 MiB sent'``."""
        n_calls = sum(self.calls.values())
        return (f"{n_calls} collectives, {self.messages} messages, "
                f"{self.bytes_sent / 2**20:.3f} MiB sent")

    def start_trace(self):
        """Begin recording one :class:`CollectiveEvent` per public collective call."""
        self.trace = []
        self._open = None

    def stop_trace(self):
        """Stop recording; return the events (list of :class:`CollectiveEvent`)."""
        self._close_event()
        events, self.trace = self.trace or [], None
        return events

    def _record_call(self, op, algorithm, nbytes, p):
        self._close_event()
        self._open = (time.perf_counter(), op, algorithm, int(nbytes), int(p), self.bytes_sent)

    def _close_event(self):
        if self._open is not None and self.trace is not None:
            start, op, alg, nbytes, p, before = self._open
            self.trace.append(CollectiveEvent(start, op, alg, nbytes, p, self.bytes_sent - before))
        self._open = None

    def _record_send(self, nbytes):
        self.bytes_sent += nbytes
        self.messages += 1
        self.bytes_by_op[self._current or "other"] += nbytes


STATS = CollectiveStats()

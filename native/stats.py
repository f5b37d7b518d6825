"""Traffic counters: what this rank's collectives sent, counted at the send.

:data:`STATS` is process-wide. Every point-to-point send issued by a collective in
:mod:`native` adds its byte count here (``native.transport`` is the only writer), so
"bytes sent per rank" in benchmarks and the CLI is measured, not derived from a
formula. MPI's own ``Allreduce`` (``algorithm="mpi"``) is opaque: its calls are
counted but its bytes are not, and ``opaque_calls`` says how many such calls there
were.
"""
from collections import Counter


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

    def _record_send(self, nbytes):
        self.bytes_sent += nbytes
        self.messages += 1
        self.bytes_by_op[self._current or "other"] += nbytes


STATS = CollectiveStats()

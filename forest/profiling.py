"""Per-phase wall-clock accounting for the training data path.

The engine wraps each phase of a level (binning, histogram build, communication,
split finding, partition, exact local subtree growth, prediction) in
``phase("name")``; ``forest-train --verbose`` prints the accumulated table on rank 0. Timing is always on: the overhead is two
``perf_counter`` calls per phase entry, negligible next to a histogram pass.
"""
import time
from collections import OrderedDict
from contextlib import contextmanager

#: Canonical phase names, in the order reports list them.
PHASES = ("binning", "histogram", "communication", "split", "partition", "local", "leaves", "prediction",
          "other")


class PhaseTimer:
    """Accumulates seconds and call counts per phase name.

    Attributes
    ----------
    seconds : OrderedDict[str, float]
    calls : OrderedDict[str, int]
    """

    def __init__(self):
        self.reset()

    def reset(self):
        self.seconds = OrderedDict((name, 0.0) for name in PHASES)
        self.calls = OrderedDict((name, 0) for name in PHASES)

    @contextmanager
    def phase(self, name):
        """Context manager adding the block's wall time to ``name``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            self.calls[name] = self.calls.get(name, 0) + 1

    def table(self, extra_rows=()):
        """Text table of the phases that ran.

        Parameters
        ----------
        extra_rows : iterable of (str, str)
            Extra ``(label, value)`` rows appended below the phases (e.g. bytes sent).

        Returns
        -------
        str
        """
        total = sum(self.seconds.values())
        lines = [f"{'phase':<15}{'seconds':>10}{'share':>8}{'calls':>9}"]
        for name, sec in self.seconds.items():
            if self.calls.get(name, 0) == 0:
                continue
            share = sec / total if total > 0 else 0.0
            lines.append(f"{name:<15}{sec:>10.3f}{share:>8.1%}{self.calls[name]:>9d}")
        lines.append(f"{'total':<15}{total:>10.3f}")
        for label, value in extra_rows:
            lines.append(f"{label:<15}{value:>10}")
        return "\n".join(lines)


#: The process-wide timer the engine records into.
TIMER = PhaseTimer()
phase = TIMER.phase

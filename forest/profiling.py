"""Per-phase wall-clock accounting for the training data path, and fit traces.

The engine wraps each phase of a level (binning, histogram build, communication,
split finding, partition, exact local subtree growth, prediction) in
``phase("name")``; ``forest-train --verbose`` prints the accumulated table on rank 0. Timing is always on: the overhead is two
``perf_counter`` calls per phase entry, negligible next to a histogram pass.

Traces (off by default): :class:`FitTrace` records, for one fit, the sequence of
phase intervals (name, start, seconds), the collectives the engine issued
(``native.stats.CollectiveEvent``: operation, algorithm, bytes, rank count) and the
tree / iteration boundaries (pass the trace as the estimator's ``progress``
callback). ``forest.cli.cost_model`` calibrates its per-phase costs from such traces.
Off, tracing costs one attribute test per phase entry.
"""
import time
from collections import OrderedDict, namedtuple
from contextlib import contextmanager

#: One traced phase interval.
PhaseEvent = namedtuple("PhaseEvent", "start name seconds")
#: A progress mark: ``done`` of ``total`` trees or iterations finished at ``start``.
TreeMark = namedtuple("TreeMark", "start done total")

#: Canonical phase names, in the order reports list them.
PHASES = ("compile", "binning", "histogram", "communication", "split", "partition", "local", "leaves", "prediction",
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

    trace = None

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
            seconds = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + seconds
            self.calls[name] = self.calls.get(name, 0) + 1
            if self.trace is not None:
                self.trace.append(PhaseEvent(start, name, seconds))

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


class FitTrace:
    """Record the phases, collectives and tree boundaries of the fits run inside a block.

    Use as a context manager around ``fit`` and pass it as ``progress=``::

        with FitTrace() as trace:
            model.fit(X, y, progress=trace)
        trace.phase_seconds()      # {"histogram": 1.2, ...}
        trace.collectives          # [CollectiveEvent(start, op, algorithm, nbytes, p, sent), ...]
        trace.marks                # [TreeMark(start, done, total), ...]

    Phases nested in one another are recorded separately (the engine does not nest
    them). Only one trace may be active at a time.

    Attributes
    ----------
    phases : list of PhaseEvent
    collectives : list of native.stats.CollectiveEvent
    marks : list of TreeMark
    start, stop : float
        ``perf_counter`` at entry and exit.
    """

    def __init__(self, timer=None):
        self.timer = TIMER if timer is None else timer
        self.phases, self.collectives, self.marks = [], [], []
        self.start = self.stop = None
        self._forward = None

    def __enter__(self):
        from native.stats import STATS

        if self.timer.trace is not None or STATS.trace is not None:
            raise RuntimeError("a fit trace is already being recorded")
        self.timer.trace = self.phases
        STATS.start_trace()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc):
        from native.stats import STATS

        self.stop = time.perf_counter()
        self.collectives = STATS.stop_trace()
        self.timer.trace = None
        return False

    def __call__(self, done, total=None):
        """Progress callback: mark ``done`` trees (iterations) of ``total`` finished."""
        self.marks.append(TreeMark(time.perf_counter(), int(done), total))
        if self._forward is not None:
            self._forward(done, total)

    def forwarding(self, progress):
        """Also pass every progress call on to ``progress`` (e.g. a progress bar)."""
        self._forward = progress
        return self

    @property
    def seconds(self):
        """Wall seconds between entry and exit."""
        return (self.stop or time.perf_counter()) - self.start

    def phase_seconds(self):
        """Seconds per phase name, summed over the trace."""
        out = OrderedDict()
        for ev in self.phases:
            out[ev.name] = out.get(ev.name, 0.0) + ev.seconds
        return out

    def phase_calls(self):
        """Entries per phase name."""
        out = OrderedDict()
        for ev in self.phases:
            out[ev.name] = out.get(ev.name, 0) + 1
        return out

    def collective_summary(self):
        """``{(op, algorithm, nbytes, p): (calls, bytes sent)}`` over the trace."""
        out = OrderedDict()
        for ev in self.collectives:
            key = (ev.op, ev.algorithm, ev.nbytes, ev.p)
            calls, sent = out.get(key, (0, 0))
            out[key] = (calls + 1, sent + ev.sent)
        return out

    def per_tree(self):
        """Phase seconds and collective counts between consecutive progress marks.

        Returns
        -------
        list of dict
            One per mark: ``done`` (trees finished), ``phases`` ({name: seconds}),
            ``collectives`` (number of calls) and ``bytes`` (sent by this rank).
        """
        bounds = [self.start] + [m.start for m in self.marks]
        out = []
        for i, mark in enumerate(self.marks):
            lo, hi = bounds[i], bounds[i + 1]
            ph = OrderedDict()
            for ev in self.phases:
                if lo <= ev.start < hi:
                    ph[ev.name] = ph.get(ev.name, 0.0) + ev.seconds
            evs = [ev for ev in self.collectives if lo <= ev.start < hi]
            out.append({"done": mark.done, "phases": ph, "collectives": len(evs),
                        "bytes": sum(ev.sent for ev in evs)})
        return out

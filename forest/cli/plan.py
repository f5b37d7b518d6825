"""``forest-train --plan`` and the memory check every ``forest-train`` run makes first.

From the data's footers only (row counts, schema, column statistics; no row is read),
the rank count, the model and its parameters, :mod:`forest.cli.cost_model` estimates the
fit time, the peak memory of each rank and the bytes each collective phase sends.
``--plan`` prints that and stops. Without it, ``forest-train`` compares the memory
estimate with what a rank may use (the cgroup limit or ``MemAvailable``, whichever is
smaller, shared among the ranks on the same node) and refuses to start, with one
line, when the estimate does not fit, unless ``--force``.
"""
import os

from forest.cli.common import CLIError

GIB = 2.0 ** 30


# ----------------------------------------------------------------------------- inputs
def _column_int_range(source, column):
    """``(min, max)`` of an integer column from the parquet footers' statistics, or None."""
    if source.kind != "parquet" or not source.types.get(column, "").startswith(("int", "uint", "bool")):
        return None
    import pyarrow.parquet as pq

    lo = hi = None
    try:
        for path in source.paths:
            meta = pq.ParquetFile(path).metadata
            idx = meta.schema.to_arrow_schema().get_field_index(column)
            for g in range(meta.num_row_groups):
                stats = meta.row_group(g).column(idx).statistics
                if stats is None or not stats.has_min_max:
                    return None
                lo = stats.min if lo is None else min(lo, stats.min)
                hi = stats.max if hi is None else max(hi, stats.max)
    except (OSError, ValueError, KeyError):
        return None
    return None if lo is None else (int(lo), int(hi))


def workload(args, params, source, features):
    """The :class:`forest.cli.cost_model.Workload` of a ``forest-train`` run."""
    from forest.cli.cost_model import Workload

    n_treatments, n_classes = 1, 2
    if args.model == "causal":
        rng = _column_int_range(source, args.treatment)
        if rng is not None and rng[1] - rng[0] + 1 > 2:
            n_treatments = rng[1] - rng[0]  # arms besides control, at most
    if args.model == "gbdt-classifier":
        rng = _column_int_range(source, args.outcome)
        if rng is not None:
            n_classes = max(2, rng[1] - rng[0] + 1)
    largest_group = max((g[2] for g in source.groups), default=0)
    return Workload(args.model, source.n_rows, len(features), dict(params), n_classes=n_classes,
                    n_treatments=n_treatments, entry="cli", row_group_rows=largest_group,
                    weighted=getattr(args, "weight", None) is not None)


def check_settings():
    """Check the environment the estimate reads (network, core speed) before any work.

    Raises
    ------
    CLIError
        One line naming the malformed variable (every rank raises the same).
    """
    from forest.cli.cost_model import core_speed_setting
    from native import costs

    try:
        costs.network_setting()
        core_speed_setting()
    except ValueError as exc:
        raise CLIError(str(exc)) from None


def cluster(comm):
    """Where this job runs: this host's cores, the job's node layout, the described network
    and core speed (``HISTFOREST_NET_*``, ``HISTFOREST_CORE_SPEED``)."""
    from forest.cli.cost_model import Cluster, core_speed_setting
    from native import costs
    from native.topology import topology

    topo = topology(comm)
    latency_us, gbits = costs.network_setting()
    return Cluster(cores_per_node=os.cpu_count() or 1, ranks_per_node=topo.ranks_per_node,
                   latency_us=latency_us, gbits=gbits, single_node=topo.n_nodes == 1,
                   core_speed=core_speed_setting())


# ----------------------------------------------------------------------------- memory available
def _read_int(path):
    try:
        with open(path) as fh:
            raw = fh.read().strip()
    except OSError:
        return None
    return int(raw) if raw.isdigit() else None


def _proc_kib(path, field):
    """A ``field: N kB`` line of a ``/proc`` file, in bytes (None if absent)."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _mem_available():
    return _proc_kib("/proc/meminfo", "MemAvailable")


def _rss():
    return _proc_kib("/proc/self/status", "VmRSS") or 0


def available_memory(comm):
    """Bytes one more rank-sized share of memory may use on this node, and how it was found.

    The smaller of ``MemAvailable`` and the cgroup's room (``memory.max`` minus
    ``memory.current``, cgroup v2; ``memory.limit_in_bytes`` minus usage, v1), divided
    by the ranks that share this node (``MPI_Comm_split_type`` SHARED, not pseudo-nodes).

    Returns
    -------
    per_rank : int or None
    description : str
    """
    sources = []
    avail = _mem_available()
    if avail is not None:
        sources.append((avail, f"MemAvailable {avail / GIB:.1f} GiB"))
    for limit_path, usage_path in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < 2 ** 60:
            sources.append((max(limit - usage, 0), f"cgroup room {max(limit - usage, 0) / GIB:.1f} GiB"))
            break
    if not sources:
        return None, "unknown (no /proc/meminfo or cgroup limit)"
    keys = comm.node_keys()
    here = sum(1 for k in keys if k == keys[comm.rank])
    total, what = min(sources)
    return int(total / here), f"{what} / {here} rank(s) on this node"


# ----------------------------------------------------------------------------- plan
def estimate(args, params, source, features, comm):
    """The cost model's prediction for this run (every rank computes the same)."""
    from forest.cli import cost_model

    return cost_model.predict(workload(args, params, source, features), comm.size, cluster(comm))


def _fmt_bytes(n):
    for unit, scale in (("GiB", GIB), ("MiB", 2.0 ** 20), ("KiB", 1024.0)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def report(pred, work, comm, avail):
    """The text ``--plan`` prints."""
    from forest.cli import cost_model

    consts = cost_model.calibration()
    where = cluster(comm)
    topo_nodes = len(set(where.layout(comm.size)))
    lines = [f"plan: {work.model} on {work.n_rows:,} rows x {work.n_features} features (from the file footers), "
             f"{comm.size} rank(s) on {topo_nodes} node(s)",
             f"  fit time          {pred.seconds:10.1f} s   (compute {pred.compute_seconds:.1f} s, "
             f"collectives {pred.communication_seconds:.1f} s)",
             f"  peak memory       {_fmt_bytes(pred.peak_bytes):>10} per rank   ("
             + ", ".join(f"{k} {_fmt_bytes(v)}" for k, v in pred.memory.items() if v) + ")",
             f"  memory available  {_fmt_bytes(avail[0]) if avail[0] is not None else 'unknown':>10} per rank   "
             f"({avail[1]})"]
    if pred.collectives:
        lines.append("  collectives (per rank):  calls   bytes sent   seconds")
        for label, (calls, sent, secs) in sorted(pred.collectives.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"    {label:22s} {calls:8.0f} {_fmt_bytes(sent):>12} {secs:9.2f}")
    else:
        lines.append("  collectives: none (one rank)")
    lines.append("  compute phases:   " + ", ".join(f"{k} {v:.1f} s" for k, v in
                                                   sorted(pred.phases.items(), key=lambda kv: -kv[1]) if v >= 0.05))
    lines.append(f"  model: forest/cli/cost_model.py; constants from `{consts.get('command', 'defaults (not calibrated)')}`"
                 f" on {consts.get('host', '?')} ({consts.get('date', '?')})"
                 + ("" if where.core_speed == 1.0 else f"; cores at {where.core_speed:g}x its speed "
                    f"({cost_model.ENV_CORE_SPEED})"))
    return "\n".join(lines)


def plan_or_check(args, params, source, features, comm):
    """Print the plan (``--plan``; returns True), or refuse a run that would not fit.

    Raises
    ------
    CLIError
        On every rank, when the memory estimate exceeds what any rank may use (and
        ``--force`` was not given).
    """
    from forest.cli import cost_model
    from forest.cli.common import CLIError, agree

    if args.model not in cost_model.MODELS:
        # a kind the cost model does not price yet (forest.estimators.kinds): no plan, no memory check
        if args.plan:
            raise CLIError(f"--plan has no cost model for the {args.model!r} model yet")
        return False
    pred = estimate(args, params, source, features, comm)
    avail = available_memory(comm)
    if args.plan:
        if comm.rank == 0:
            print(report(pred, workload(args, params, source, features), comm, avail), flush=True)
        return True
    message = None
    need = pred.peak_bytes - _rss()  # what this rank holds already is not available any more
    if avail[0] is not None and need > avail[0] and not args.force:
        message = (f"estimated peak memory {_fmt_bytes(pred.peak_bytes)} per rank exceeds the "
                   f"{_fmt_bytes(avail[0])} available to rank {comm.rank} ({avail[1]}); use more ranks or nodes, "
                   f"see `--plan`, or pass --force to start anyway")
    agree(comm, message)
    return False

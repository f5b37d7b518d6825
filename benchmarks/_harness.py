"""Shared benchmark harness: run each contender in its own process, print and record tables.

This module owns three things the benchmark scripts share:

* :func:`run_contender` runs one contender (a function ``run(**kwargs) -> dict`` in a
  benchmark module) in a fresh Python process, or in a group of processes (``mpirun`` or
  plain local processes), with the thread count pinned through the environment
  (``OMP_NUM_THREADS``, ``NUMBA_NUM_THREADS``, ...) and passed to the function as
  ``threads``. A fresh process per contender makes peak resident memory a per-contender
  figure (the child reports its own ``VmHWM``), keeps one library's thread pool or JIT
  cache from leaking into the next, and lets a timeout or crash be recorded as
  ``"failed: <reason>"`` while the remaining contenders go on.
* :func:`markdown_table` formats rows as a GitHub markdown table.
* :func:`write_results_section` writes a table with the exact command line and a
  machine description into one ``## ...`` section of ``benchmarks/RESULTS.md``, leaving
  the other sections (written by other benchmarks) untouched.

The child side lives in ``benchmarks/_worker.py``.
"""
import datetime
import fcntl
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from importlib import metadata

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
OUT_DIR = os.path.join(BENCH_DIR, "out")
RESULTS_PATH = os.path.join(BENCH_DIR, "RESULTS.md")
WORKER = os.path.join(BENCH_DIR, "_worker.py")
PLACEHOLDER = "_not measured yet_"

#: Environment variables that cap native thread pools (OpenMP in LightGBM/XGBoost/sklearn,
#: Numba's parallel layer, BLAS). Set in the child before any library is imported.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                   "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")

#: Packages whose versions go into every results block.
VERSION_PACKAGES = ("histforest", "numpy", "numba", "scikit-learn", "mpi4py", "mpich",
                    "lightgbm", "xgboost", "econml", "causalml")


def thread_env(threads, base=None):
    """Environment dict with every native thread pool capped at ``threads``.

    Parameters
    ----------
    threads : int
    base : dict or None
        Environment to start from (default: a copy of ``os.environ``).

    Returns
    -------
    dict
    """
    env = dict(os.environ if base is None else base)
    for var in THREAD_ENV_VARS:
        env[var] = str(int(threads))
    # The benchmark modules import each other by plain name (datasets, anchors).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BENCH_DIR, REPO_ROOT, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def free_ports(count):
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago.

    Returns
    -------
    list of int
    """
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def default_mpirun():
    """Path of ``mpirun`` next to the running interpreter, else the project's ``.venv``.

    Returns
    -------
    str
    """
    here = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.path.exists(here):
        return here
    return os.path.join(REPO_ROOT, ".venv", "bin", "mpirun")


def _tail(path, limit=800):
    try:
        with open(path, "r", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return ""
    text = text.strip()
    return text[-limit:]


def run_contender(name, module, function, kwargs=None, threads=2, timeout=3600,
                  launcher="local", nprocs=1, python=None, mpirun=None, verbose=True):
    """Run ``module.function(**kwargs, threads=threads)`` in fresh process(es).

    Parameters
    ----------
    name : str
        Label used in tables and messages.
    module : str
        Path of the python file that defines ``function`` (absolute or relative to
        ``benchmarks/``).
    function : str
        Name of a function returning a JSON-serialisable dict. Conventional keys:
        ``fit_s``, ``predict_s`` (seconds), ``metrics`` (dict), anything else is kept.
    kwargs : dict or None
        JSON-serialisable keyword arguments.
    threads : int
        Thread count per process, set in the environment and passed as ``threads``.
    timeout : float
        Seconds before the process group is killed and the contender marked failed.
    launcher : {"local", "mpirun", "group"}
        ``"local"``: one plain process. ``"mpirun"``: ``mpirun -np nprocs``.
        ``"group"``: ``nprocs`` plain processes started together, each told its
        ``rank`` and ``size`` through kwargs (for libraries with their own networking,
        e.g. LightGBM's socket-based data-parallel learner).
    nprocs : int
    python : str or None
        Interpreter for the children (default: the running one).
    mpirun : str or None
        ``mpirun`` executable for ``launcher="mpirun"`` (default :func:`default_mpirun`).
    verbose : bool
        Print one status line when the contender finishes.

    Returns
    -------
    dict
        ``name``, ``status`` (``"ok"`` or ``"failed: <reason>"``), ``wall_s``, and on
        success the merged per-rank results: ``fit_s``/``predict_s`` are the maximum over
        ranks (the slowest rank sets the pace), ``peak_rss_mb`` the largest per-process
        peak, ``peak_rss_total_mb`` the sum over processes, ``metrics`` and other keys
        from rank 0, and ``ranks`` the raw per-rank dicts.
    """
    python = python or sys.executable
    kwargs = dict(kwargs or {})
    module_path = module if os.path.isabs(module) else os.path.join(BENCH_DIR, module)
    workdir = tempfile.mkdtemp(prefix="hfbench-", dir=None)
    env = thread_env(threads)
    procs = []
    start = time.perf_counter()
    try:
        if launcher == "group":
            ports = free_ports(nprocs)
            for rank in range(nprocs):
                spec = {"module": module_path, "function": function,
                        "kwargs": dict(kwargs, threads=threads, rank=rank, size=nprocs, ports=ports),
                        "result": os.path.join(workdir, f"result.{rank}.json")}
                procs.append(_spawn([python, WORKER], spec, workdir, f"{rank}", env))
        else:
            spec = {"module": module_path, "function": function,
                    "kwargs": dict(kwargs, threads=threads),
                    "result": os.path.join(workdir, "result.{rank}.json")}
            if launcher == "mpirun":
                cmd = [mpirun or default_mpirun(), "-np", str(nprocs), python, WORKER]
            elif launcher == "local":
                if nprocs != 1:
                    raise ValueError("launcher='local' runs exactly one process; use 'group' or 'mpirun'")
                cmd = [python, WORKER]
            else:
                raise ValueError(f"unknown launcher {launcher!r}; expected 'local', 'mpirun' or 'group'")
            procs.append(_spawn(cmd, spec, workdir, "main", env))
        status = _wait_all(procs, timeout)
        wall = time.perf_counter() - start
        result = {"name": name, "wall_s": wall}
        if status is None:
            n_expected = nprocs
            ranks = []
            for rank in range(n_expected):
                path = os.path.join(workdir, f"result.{rank}.json")
                if os.path.exists(path):
                    with open(path) as fh:
                        ranks.append(json.load(fh))
            if len(ranks) != n_expected:
                status = f"failed: {n_expected - len(ranks)} of {n_expected} processes wrote no result"
            else:
                status = "ok"
                result.update(_merge_ranks(ranks))
        if status != "ok":
            logs = " | ".join(t for t in (_tail(p.log) for p in procs) if t)
            result["log_tail"] = logs
            if verbose and logs:
                print(f"--- {name} output tail ---\n{logs}\n---", file=sys.stderr)
        result["status"] = status
    finally:
        for p in procs:
            _kill(p)
    if verbose:
        extra = ""
        if result["status"] == "ok":
            for key, label, form in (("fit_s", "fit", "{:.2f}s"), ("predict_s", "predict", "{:.2f}s"),
                                     ("peak_rss_mb", "peak", "{:.0f} MB")):
                if isinstance(result.get(key), (int, float)):
                    extra += f" {label} " + form.format(result[key])
            extra += f" metrics {result.get('metrics', {})}"
        print(f"[{name}] {result['status']} in {result['wall_s']:.1f}s{extra}", flush=True)
    return result


class _Proc:
    def __init__(self, popen, log):
        self.popen = popen
        self.log = log


def _spawn(cmd, spec, workdir, tag, env):
    spec_path = os.path.join(workdir, f"spec.{tag}.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    log = os.path.join(workdir, f"log.{tag}.txt")
    with open(log, "w") as out:
        # A new session gives the contender its own process group, so a timeout can
        # kill mpirun's ranks along with it.
        popen = subprocess.Popen(cmd + [spec_path], stdout=out, stderr=subprocess.STDOUT,
                                 env=env, cwd=REPO_ROOT, start_new_session=True)
    return _Proc(popen, log)


def _wait_all(procs, timeout):
    """Wait for every process; return None on success or a failure reason."""
    deadline = time.monotonic() + timeout
    pending = list(procs)
    while pending:
        for p in list(pending):
            rc = p.popen.poll()
            if rc is None:
                continue
            pending.remove(p)
            if rc != 0:
                # One member failed: the others (e.g. a LightGBM peer waiting on a
                # socket) would wait forever, so end the group now.
                return f"failed: exit code {rc}: {_last_line(p.log)}"
        if pending and time.monotonic() > deadline:
            return f"failed: timeout after {timeout:.0f}s"
        if pending:
            time.sleep(0.05)
    return None


def _last_line(path):
    lines = [ln for ln in _tail(path, 4000).splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "no output"


def _kill(proc):
    if proc.popen.poll() is None:
        try:
            os.killpg(proc.popen.pid, 9)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _merge_ranks(ranks):
    ranks = sorted(ranks, key=lambda r: r.get("rank", 0))
    merged = {k: v for k, v in ranks[0].items() if k not in ("rank",)}
    for key in ("fit_s", "predict_s"):
        vals = [r[key] for r in ranks if isinstance(r.get(key), (int, float))]
        if vals:
            merged[key] = max(vals)
    peaks = [r.get("peak_rss_mb", 0.0) for r in ranks]
    merged["peak_rss_mb"] = max(peaks)
    merged["peak_rss_total_mb"] = sum(peaks)
    merged["n_procs"] = len(ranks)
    if len(ranks) > 1:
        merged["ranks"] = ranks
    return merged


# --------------------------------------------------------------------------- memory probes

def proc_status_mb(field):
    """A memory field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...) in MiB.

    Falls back to ``ru_maxrss`` for ``VmHWM`` where ``/proc`` is missing.

    Returns
    -------
    float
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    if field == "VmHWM":
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return float("nan")


# --------------------------------------------------------------------------- tables

def fmt(value, digits=3):
    """Format a table cell: floats to ``digits`` significant places, None/NaN as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:
            return "-"
        if value == 0:
            return "0"
        mag = abs(value)
        if mag >= 10 ** digits:
            return f"{value:,.0f}"
        return f"{value:.{digits}g}" if mag < 1e-3 else f"{value:#.{digits}g}".rstrip(".")
    return str(value)


def markdown_table(headers, rows):
    """GitHub markdown table.

    Parameters
    ----------
    headers : sequence of str, length C
    rows : sequence of sequences, each of length C
        Cells are formatted with :func:`fmt`.

    Returns
    -------
    str
    """
    cells = [[fmt(c) for c in row] for row in rows]
    for row in cells:
        if len(row) != len(headers):
            raise ValueError(f"row has {len(row)} cells, header has {len(headers)}: {row}")
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"
    out = [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


# --------------------------------------------------------------------------- machine + versions

def cpu_model():
    """CPU model name from ``/proc/cpuinfo`` (or ``platform.processor()``)."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def package_versions(names=VERSION_PACKAGES):
    """``{distribution: version}`` for the installed ones among ``names``."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def git_commit():
    """Short commit hash of the checkout, with ``+dirty`` when tracked files differ."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=REPO_ROOT,
                               capture_output=True, timeout=10).returncode != 0
        return sha + ("+dirty" if dirty else "") if sha else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def machine_description():
    """One-paragraph description of the machine, software and date of a run."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    mem = "unknown"
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    mem = f"{int(line.split()[1]) / 1024 ** 2:.1f} GiB"
                    break
    except OSError:
        pass
    versions = ", ".join(f"{k} {v}" for k, v in package_versions().items())
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        # Timings on a busy machine are not comparable (OpenMP pools in particular slow
        # down badly when oversubscribed), so the load at write time goes on record.
        load = "load average %.2f/%.2f/%.2f (1/5/15 min)" % os.getloadavg()
    except OSError:
        load = "load average unknown"
    return (f"{date}; {cpu_model()}, {os.cpu_count()} logical cores ({affinity} usable), "
            f"{mem} RAM, {load}; Python {platform.python_version()} on {platform.system()} "
            f"{platform.release()}; {versions}; git {git_commit()}")


def command_line():
    """The exact command that is running, as a shell line relative to the repo root."""
    exe = os.path.relpath(sys.executable, REPO_ROOT) if sys.executable.startswith(REPO_ROOT) else sys.executable
    argv = [os.path.relpath(os.path.abspath(sys.argv[0]), REPO_ROOT)] + sys.argv[1:]
    return shlex.join([exe] + argv)


# --------------------------------------------------------------------------- RESULTS.md

def write_results_section(heading, body, command=None, machine=None, path=RESULTS_PATH, title=None):
    """Record ``body`` under the ``## heading`` section of ``RESULTS.md``.

    The block written is the optional ``### title``, the command line, the machine
    description, then ``body``. It replaces the section's ``_not measured yet_``
    placeholder if present, otherwise it is appended at the end of the section (before
    the next ``## `` heading). A missing section is appended at the end of the file.
    Other sections are left byte-for-byte as they were; the read-modify-write happens
    in one step under an advisory lock so concurrent writers that use this function do
    not lose each other's blocks.

    Parameters
    ----------
    heading : str
        Section heading text without the ``## `` prefix, e.g. ``"Gradient boosting (issue 4)"``.
    body : str
        Markdown (tables, notes).
    command : str or None
        Defaults to :func:`command_line`.
    machine : str or None
        Defaults to :func:`machine_description`.
    path : str
    title : str or None

    Returns
    -------
    str
        The block that was written.
    """
    command = command_line() if command is None else command
    machine = machine_description() if machine is None else machine
    parts = []
    if title:
        parts.append(f"### {title}\n")
    parts.append(f"Command: `{command}`\n")
    parts.append(f"Machine: {machine}\n")
    parts.append(body.strip() + "\n")
    block = "\n".join(parts)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path) as fh:
                text = fh.read()
        except FileNotFoundError:
            text = "# Measured results\n"
        text = insert_block(text, heading, block)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    return block


def insert_block(text, heading, block):
    """Pure text operation behind :func:`write_results_section`.

    Parameters
    ----------
    text : str
        Whole RESULTS.md.
    heading : str
    block : str

    Returns
    -------
    str
    """
    lines = text.splitlines(keepends=True)
    target = f"## {heading}".strip()
    start = next((i for i, ln in enumerate(lines) if ln.strip() == target), None)
    if start is None:
        sep = "" if text.endswith("\n") or not text else "\n"
        return f"{text}{sep}\n{target}\n\n{block}"
    end = next((j for j in range(start + 1, len(lines)) if lines[j].startswith("## ")), len(lines))
    section = lines[start + 1:end]
    ph = next((k for k, ln in enumerate(section) if ln.strip() == PLACEHOLDER), None)
    if ph is not None:
        section[ph] = block
    else:
        while section and not section[-1].strip():
            section.pop()
        section.append("\n" + block)
    new_section = "".join(section)
    if not new_section.endswith("\n\n") and end < len(lines):
        new_section = new_section.rstrip("\n") + "\n\n"
    return "".join(lines[:start + 1]) + new_section + "".join(lines[end:])

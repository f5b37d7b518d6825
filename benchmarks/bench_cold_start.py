"""Cold-start benchmark (issue 11): ``import forest`` + the first fit in a fresh process.

Each case runs in its own fresh Python process with one thread, on 10,000 rows x 10
features:

* ``gbdt``: ``GBDTClassifier(n_estimators=10)`` on a binary label;
* ``causal``: ``CausalForest(n_estimators=20)`` on a binary treatment (with its
  nuisance forests for ``y_hat`` and ``t_hat``);
* ``lightgbm``: LightGBM's first ``LGBMClassifier(n_estimators=10)`` fit, the anchor
  (only when the running interpreter, or ``--anchor-python``, can import lightgbm).

and in two cache states: ``empty`` (a new, empty ``NUMBA_CACHE_DIR``: every kernel
compiles) and ``warm`` (the same directory again: every kernel loads from the cache).
Reported per run: wall seconds of the whole process, its CPU seconds (user + system,
from ``getrusage(RUSAGE_CHILDREN)``: steadier than wall time on a loaded machine),
and the seconds inside ``fit``. Repeats report the minimum. histforest's packages are byte-compiled first, as a
``pip install`` leaves them (:func:`byte_compile`).

``--profile`` also lists, per case, the kernels that compiled with their own compile
time (a callee's compile nested inside its caller's is subtracted from the caller)
and how many signatures each dispatcher compiled or loaded from the cache, from
Numba's ``numba:compile`` events and the dispatchers' cache statistics.

Usage::

    .venv-bench/bin/python benchmarks/bench_cold_start.py               # table
    .venv-bench/bin/python benchmarks/bench_cold_start.py --profile     # + compile profile
    .venv/bin/python benchmarks/bench_cold_start.py --cases gbdt --repeats 3
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCH_DIR)
sys.path.insert(0, BENCH_DIR)
# _harness is imported by the parent side only: its standard-library imports cost every
# timed child (the anchor's too) 0.06 s that no user's process pays.

N_ROWS, N_FEATURES = 10_000, 10
CASES = ("gbdt", "causal")


# ----------------------------------------------------------------------------- child side

def _data():
    import numpy as np

    rng = np.random.default_rng(0)
    X = rng.normal(size=(N_ROWS, N_FEATURES))
    t = (rng.uniform(size=N_ROWS) < 0.5).astype(float)
    y = X[:, 0] + t * (1.0 + (X[:, 1] > 0)) + rng.normal(size=N_ROWS)
    return X, t, y


def _fit(case):
    """Import the library and fit once; seconds inside ``fit``."""
    if case == "lightgbm":
        import lightgbm

        X, _, y = _data()
        start = time.perf_counter()
        lightgbm.LGBMClassifier(n_estimators=10, n_jobs=1, verbose=-1).fit(X, (y > 0).astype(int))
        return time.perf_counter() - start
    import forest

    X, t, y = _data()
    if case == "gbdt":
        model = forest.GBDTClassifier(n_estimators=10, random_state=0)
        start = time.perf_counter()
        model.fit(X, (y > 0).astype(int))
    elif case == "causal":
        model = forest.CausalForest(n_estimators=20, random_state=0)
        start = time.perf_counter()
        model.fit(X, t, y)
    else:
        raise ValueError(f"unknown case {case!r}")
    return time.perf_counter() - start


def _numba_dispatchers():
    """Every Numba dispatcher defined in histforest's modules (name -> dispatcher)."""
    from numba.core.registry import CPUDispatcher

    found = {}
    for name, module in list(sys.modules.items()):
        if not name.split(".")[0] in ("native", "histogram", "forest") or module is None:
            continue
        for attr, value in vars(module).items():
            if isinstance(value, CPUDispatcher):
                found.setdefault(f"{value.py_func.__module__}.{value.py_func.__qualname__}", value)
    return found


def child_main(case, profile):
    """Run one case in this (fresh) process and print one JSON line."""
    start = time.perf_counter()
    recorder = None
    if profile:
        from numba.core import event

        recorder = CpuTimeRecorder()
        event.register("numba:compile", recorder)
    fit_s = _fit(case)
    result = {"case": case, "fit_s": fit_s, "process_s": time.perf_counter() - start}
    if recorder is not None:
        from numba.core import event

        event.unregister("numba:compile", recorder)
        result["compiles"] = _exclusive_compile_times(recorder.buffer)
        result["cache"] = {name: {"hits": sum(d.stats.cache_hits.values()),
                                  "misses": sum(d.stats.cache_misses.values()),
                                  "signatures": len(d.signatures)}
                           for name, d in _numba_dispatchers().items() if d.signatures}
    print("RESULT " + json.dumps(result), flush=True)


class CpuTimeRecorder:
    """A ``numba.core.event`` listener keeping ``(process CPU seconds, event)`` pairs.

    CPU time rather than Numba's own wall-clock stamps: on a shared machine the wall
    time of a compile swings with the load.
    """

    def __new__(cls):
        from numba.core import event

        class _Recorder(event.Listener):
            def __init__(self):
                self.buffer = []

            def on_start(self, evt):
                self.buffer.append((time.process_time(), evt))

            def on_end(self, evt):
                self.buffer.append((time.process_time(), evt))

        return _Recorder()


def _exclusive_compile_times(buffer):
    """Per-dispatcher compile CPU seconds with nested (callee) compiles subtracted.

    ``buffer`` holds ``(timestamp, Event)`` pairs of ``numba:compile`` start/end events
    in order; a callee compiles while its caller is being typed, so the events nest.
    """
    stack, totals = [], {}
    for stamp, evt in buffer:
        disp = evt.data["dispatcher"]
        name = f"{disp.py_func.__module__}.{disp.py_func.__qualname__}"
        if evt.is_start:
            stack.append([name, stamp, 0.0])
        else:
            name, begin, nested = stack.pop()
            inclusive = stamp - begin
            entry = totals.setdefault(name, {"seconds": 0.0, "compiles": 0})
            entry["seconds"] += inclusive - nested
            entry["compiles"] += 1
            if stack:
                stack[-1][2] += inclusive
    return totals


# ----------------------------------------------------------------------------- parent side

def run_case(case, cache_dir, python, profile=False, timeout=1800, extra_env=None):
    """Run ``case`` in a fresh process with ``NUMBA_CACHE_DIR=cache_dir``.

    Returns
    -------
    dict
        ``wall_s``, ``cpu_s`` (the child's user + system seconds), ``fit_s``, and with
        ``profile`` the child's ``compiles`` and ``cache`` tables; ``status``.
    """
    import _harness

    env = _harness.thread_env(1)
    env["NUMBA_CACHE_DIR"] = cache_dir
    env.update(extra_env or {})
    cmd = [python, os.path.abspath(__file__), "--child", case] + (["--profile"] if profile else [])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    result = {"case": case, "wall_s": wall, "cpu_s": cpu, "status": "ok"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        result["status"] = f"failed (exit {proc.returncode}): {tail[0][-200:]}"
        return result
    result.update(json.loads(lines[-1][len("RESULT "):]))
    return result


def _anchor_python(requested):
    for python in [requested] if requested else [sys.executable, os.path.join(REPO_ROOT, ".venv-bench", "bin", "python")]:
        if python and os.path.exists(python) and subprocess.run(
                [python, "-c", "import lightgbm"], capture_output=True).returncode == 0:
            return python
    return None


def byte_compile(python):
    """Byte-compile histforest's packages for ``python``, as ``pip install`` does.

    A wheel's modules are compiled at install time; this checkout's are compiled on
    first import, unless ``PYTHONDONTWRITEBYTECODE`` is set (as on the dev sandbox),
    where every fresh process compiled about 60 modules from source again (0.13 s).
    Compiled once here, every case starts as it would from an installed package.
    """
    code = ("import importlib, os\n"
            "for name in ('forest', 'histogram', 'native'):\n"
            "    print(os.path.dirname(importlib.import_module(name).__file__))")
    import _harness

    # The children's environment and directory, so the copy compiled is the copy they import.
    env = _harness.thread_env(1)
    dirs = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True, env=env,
                          cwd=REPO_ROOT).stdout.split()
    subprocess.run([python, "-m", "compileall", "-q", *dirs], check=True, capture_output=True, env=env,
                   cwd=REPO_ROOT)


def _fmt(value):
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--repeats", type=int, default=1, help="runs per (case, cache state); minima reported")
    parser.add_argument("--profile", action="store_true", help="list compiled kernels and their compile time")
    parser.add_argument("--python", default=sys.executable, help="interpreter with histforest installed")
    parser.add_argument("--anchor-python", default=None, help="interpreter with lightgbm (default: this one, "
                        "else .venv-bench)")
    parser.add_argument("--child", choices=CASES + ("lightgbm",), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(args.child, args.profile)
        return 0

    import _harness

    byte_compile(args.python)
    rows, profiles = [], {}
    for case in args.cases:
        runs = {"empty": [], "warm": []}
        for _ in range(args.repeats):
            cache_dir = tempfile.mkdtemp(prefix="hf-coldstart-")
            try:
                runs["empty"].append(run_case(case, cache_dir, args.python, args.profile))
                runs["warm"].append(run_case(case, cache_dir, args.python, args.profile))
            finally:
                shutil.rmtree(cache_dir, ignore_errors=True)
        for state, results in runs.items():
            ok = [r for r in results if r["status"] == "ok"]
            if not ok:
                rows.append([case, state, results[0]["status"], "", "", ""])
                continue
            rows.append([case, state, min(r["wall_s"] for r in ok), min(r["cpu_s"] for r in ok),
                         min(r["fit_s"] for r in ok), len(ok)])
            if args.profile:
                profiles[(case, state)] = ok[0]
            print(f"[{case} {state}] wall {rows[-1][2]:.2f}s cpu {rows[-1][3]:.2f}s", file=sys.stderr, flush=True)
    anchor = _anchor_python(args.anchor_python)
    if anchor:
        with tempfile.TemporaryDirectory() as cache_dir:
            results = [run_case("lightgbm", cache_dir, anchor) for _ in range(args.repeats)]
        ok = [r for r in results if r["status"] == "ok"]
        if ok:
            rows.append(["lightgbm (anchor)", "-", min(r["wall_s"] for r in ok), min(r["cpu_s"] for r in ok),
                         min(r["fit_s"] for r in ok), len(ok)])
        else:
            rows.append(["lightgbm (anchor)", "-", results[0]["status"], "", "", ""])
    header = ["case", "Numba cache", "process wall s", "process CPU s", "fit s", "runs"]
    print(f"import + first fit, fresh process, 1 thread, {N_ROWS} rows x {N_FEATURES} features\n")
    print(_harness.markdown_table(header, [[_fmt(v) for v in row] for row in rows]))
    for (case, state), result in profiles.items():
        _print_profile(case, state, result)
    return 0


def _print_profile(case, state, result):
    import _harness

    compiles = sorted(result.get("compiles", {}).items(), key=lambda kv: -kv[1]["seconds"])
    total = sum(v["seconds"] for _, v in compiles)
    print(f"\n### {case}, {state} cache: {len(compiles)} dispatchers compiled, {total:.1f} s compiling")
    if compiles:
        print(_harness.markdown_table(["kernel", "compile s", "signatures compiled"],
                                      [[name, f"{v['seconds']:.2f}", v["compiles"]] for name, v in compiles]))
    cache = result.get("cache", {})
    hits = sum(v["hits"] for v in cache.values())
    misses = sum(v["misses"] for v in cache.values())
    print(f"\ncache: {hits} signatures loaded, {misses} compiled, over {len(cache)} dispatchers")


if __name__ == "__main__":
    sys.exit(main())

"""Scaling of histforest fits (issue 16): calibrate the cost model, validate it, extrapolate.

The model lives in the package (``forest/cli/cost_model.py`` for fits,
``native/costs.py`` for collectives; ``forest-train --plan`` uses the same); this
script measures its constants, checks it against real fits, and prints what it
predicts for a cluster.

Modes
-----
``--calibrate``
    Measures the constants on this machine and writes them with this command, host
    and date: ``native/calibration.json`` (collectives: message latency and per-byte
    costs from ``native.transport.exchange`` between 2 ranks, ``numpy.add`` and copy
    speed, the fixed cost of a call; minima over blocks of repetitions; for each
    rank count from cores + 1 to 4, the latency of a message step between compute
    phases when ranks share the cores, :func:`_phase_step_latency`) and ``forest/cli/calibration.json`` (per
    phase of ``forest.profiling``: seconds per work unit and per call, least squares
    over traced single-rank, single-thread fits at two sizes, each fit repeated and
    the minimum per phase kept; memory: base RSS and bytes per row; from the traces:
    tree nodes per row, bytes per node, bytes per split record; the pace of 2 .. 4
    ranks on this machine, from the larger GBDT and forest case refitted at those
    rank counts, :func:`forest.cli.cost_model.measured_pace`). Each fit runs in a
    fresh process. Run it on a quiet machine; it takes a few minutes.
``--validate``
    First a speed probe (:func:`speed_probe`; ``--no-speed-probe`` skips it): the
    smaller calibration fits again, at one rank, give this machine's core speed now
    relative to the calibration, per family. Then real fits at p = 1, 2, 3, 4 ranks on
    this machine (oversubscribed beyond its cores; one thread per rank): a GBDT
    classifier and a causal forest (with its two nuisance forests), sizes the
    calibration never ran, each repeated, fastest kept; prints predicted (at the
    probed speed, and at the calibrated speed) vs measured fit time and peak RSS per
    rank and exits with status 1 if a time error at the probed speed exceeds 25 %.
``--strong``, ``--weak``, ``--headline`` (default: all three)
    Model only. Strong scaling (1e7 and 1e8 rows, p = 1 .. 256) and weak scaling
    (390,625 rows per rank: 1e8 rows at 256 ranks) with parallel efficiency (and the
    share of time in collectives, the largest phase and the peak memory per rank), for GBDT and CausalForest, on a described
    cluster (``--cores-per-node``, ``--ranks-per-node``, ``--threads-per-rank``,
    ``--gbits``, ``--latency-us``); and the 1e8-row, 100-tree CausalForest at 32
    ranks next to Meituan's reference point (100 trees on ~1e8 rows in under 30
    minutes on Spark).
``--plan-check``
    The estimate ``forest-train --plan`` prints (same code: ``forest.cli.plan``)
    against measured ``forest-train`` runs on parquet files (fit wall time from
    ``--verbose``, peak RSS of the largest rank) at p = 1, 2: within a factor 1.5.
``--refit``
    Recompute ``forest/cli/calibration.json``'s constants from the measurements it keeps
    (after a change of the model's formulas; no fit is rerun).

    python benchmarks/bench_scaling.py --calibrate          # quiet machine, a few minutes
    python benchmarks/bench_scaling.py --validate
    python benchmarks/bench_scaling.py --plan-check
    python benchmarks/bench_scaling.py --cores-per-node 32 --gbits 25 --latency-us 5
"""
import argparse
import datetime
import json
import os
import platform
import shlex
import socket
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import _harness  # noqa: E402
import datasets  # noqa: E402

THIS = os.path.abspath(__file__)

# Calibration fits: two sizes per family, short (seconds on a quiet machine).
CAL_CASES = [
    {"model": "gbdt-classifier", "n": 100_000, "F": 28, "params": {"n_estimators": 20, "early_stopping": False}},
    {"model": "gbdt-classifier", "n": 400_000, "F": 28, "params": {"n_estimators": 20, "early_stopping": False}},
    {"model": "regression", "n": 20_000, "F": 10, "params": {"n_estimators": 50}},
    {"model": "regression", "n": 80_000, "F": 10, "params": {"n_estimators": 50}},
    {"model": "causal", "n": 20_000, "F": 10, "params": {"n_estimators": 50}, "given_nuisance": True},
    {"model": "causal", "n": 80_000, "F": 10, "params": {"n_estimators": 50}, "given_nuisance": True},
]

# Pace fits (forest.cli.cost_model.measured_pace): the larger calibration case of each
# family again at 2 .. 4 ranks.
PACE_CASES = [CAL_CASES[1], CAL_CASES[5]]

# Speed probe of --validate (forest.cli.cost_model.Cluster.core_speed): the smaller
# calibration fits of each family again, at one rank. They share no size with the
# validation fits below.
PROBE_CASES = [CAL_CASES[0], CAL_CASES[2], CAL_CASES[4]]

# Validation fits: a few tens of seconds each at p = 1 on a quiet machine.
VAL_CASES = [
    {"model": "gbdt-classifier", "n": 1_000_000, "F": 28, "params": {"n_estimators": 100, "early_stopping": False}},
    {"model": "causal", "n": 100_000, "F": 10, "params": {"n_estimators": 100}},
]


# ============================================================================ workers
def _case_workload(case, entry="python"):
    from forest.cli.cost_model import Workload

    return Workload(case["model"], int(case["n"]), int(case["F"]), dict(case["params"]), entry=entry,
                    nuisance_given=bool(case.get("given_nuisance")))


def _load_case(case, rank, size):
    """This rank's rows of a case: HIGGS-like for GBDT, Wager-Athey (d = F) for forests."""
    if case["model"].startswith("gbdt"):
        paths = datasets.higgs_like(case["n"], 0)  # generated once, then cached
        return (datasets.load_rows(paths["X_train"], rank, size), datasets.load_rows(paths["y_train"], rank, size),
                None)
    d = datasets.wager_athey(case["n"], d=case["F"], n_test=10, seed=0)
    lo, hi = datasets.block_bounds(case["n"], rank, size)
    return d["X"][lo:hi].copy(), d["y"][lo:hi].copy(), d["t"][lo:hi].copy()


def _estimator(case):
    from forest.cli.cost_model import _estimator_class

    return _estimator_class(case["model"])(**case["params"])


def _warm(case, comm):
    from native.comm import SelfCommunicator

    rng = np.random.default_rng(1)
    X = rng.uniform(size=(3000, case["F"]))
    y = (X[:, 0] + rng.normal(size=3000) > 0.5).astype(np.float64)
    small = dict(case, params=dict(case["params"], n_estimators=4))
    est = _estimator(small)
    if case["model"] == "causal":
        t = (rng.uniform(size=3000) < 0.5).astype(np.float64)
        est.fit(X, t, y, comm=SelfCommunicator())
    else:
        est.fit(X, y, comm=SelfCommunicator())


def _forest_shape(est, case):
    """Nodes per structure row and bytes per node of a fitted forest (single rank)."""
    packed = getattr(est, "estimators_", None)
    if not isinstance(packed, dict) or "tree_offsets" not in packed:
        return {}
    nodes = int(packed["tree_offsets"][-1])
    inner = int((np.asarray(packed["feature"]) >= 0).sum())
    nbytes = sum(v.nbytes for v in packed.values() if isinstance(v, np.ndarray))
    prm = est.get_params()
    rows = case["n"] * prm["max_samples"] * (prm["honesty_fraction"] if prm["honest"] else 1.0)
    trees = len(packed["tree_offsets"]) - 1
    return {"nodes_per_row": nodes / (trees * rows), "node_bytes": nbytes / nodes, "inner_nodes": inner}


def contender_fit(case, threads, trace=True, **_):
    """One rank of a traced fit; returns its phases, wall time, memory and trace figures."""
    import _harness as h
    from forest.profiling import FitTrace
    from native.comm import world

    comm = world()
    _warm(case, comm)
    base_mb = h.proc_status_mb("VmRSS")
    X, y, t = _load_case(case, comm.rank, comm.size)
    est = _estimator(case)
    kwargs = {"comm": comm}
    if case["model"] == "causal" and case.get("given_nuisance"):
        kwargs.update(y_hat=np.full(len(y), float(np.mean(y))), t_hat=np.full(len(y), 0.5))
    comm.barrier()
    with FitTrace() as tr:
        start = time.perf_counter()
        if case["model"] == "causal":
            est.fit(X, t, y, **kwargs)
        else:
            est.fit(X, y, **kwargs)
        fit_s = time.perf_counter() - start
    out = {"fit_s": fit_s, "phases": dict(tr.phase_seconds()), "base_mb": base_mb,
           "allgatherv_bytes": sum(ev.nbytes for ev in tr.collectives if ev.op == "allgatherv" and ev.nbytes > 4096),
           "collectives": [[ev.op, ev.algorithm, ev.nbytes, ev.p] for ev in tr.collectives]}
    if comm.rank == 0:
        out.update(_forest_shape(est, case))
    return out


def contender_collectives(threads, **_):
    """Under mpirun: constants of the collective model (minima over blocks of repetitions)."""
    from native import collectives as col
    from native.comm import world
    from native.transport import exchange

    comm = world()
    p, r = comm.size, comm.rank
    peer = r ^ 1 if (r ^ 1) < p else r

    def timed(fn, reps, blocks=7):
        best = np.inf
        for _ in range(blocks):
            comm.barrier()
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            best = min(best, (time.perf_counter() - t0) / reps)
        return best

    if p > (os.cpu_count() or 1):
        return {"p": p, **_phase_step_latency(comm, col)}
    small = np.zeros(1)
    big = np.random.default_rng(r).standard_normal(2 ** 20)  # 8 MiB
    sbuf, rbuf = np.zeros(1), np.zeros(1)
    bbuf = np.empty_like(big)
    alpha = timed(lambda: exchange(comm, sbuf, peer, rbuf, peer, 990), 500)
    t_big = timed(lambda: exchange(comm, big, peer, bbuf, peer, 991), 5)
    out = {"p": p, "alpha": alpha, "beta": max(t_big - alpha, 0.0) / big.nbytes}
    if p == 2:
        call = timed(lambda: col.allreduce(comm, small, algorithm="doubling"), 500)
        out["call_overhead"] = max(call - alpha, 0.0)
        other = big + 1.0
        out["gamma"] = timed(lambda: np.add(big, other, out=bbuf), 10) / big.nbytes
        out["copy"] = timed(lambda: np.array(big, copy=True), 10) / big.nbytes
    return out


def _phase_step_latency(comm, col, phase_s=2e-3, reps=150):
    """Latency of a message step when ranks share cores, measured the way fits meet it.

    A fit alternates compute phases (milliseconds of one rank's work) with
    collectives. When more ranks than cores run, a message step can only complete
    once its partner is on a core, and a rank that has reached the collective spins
    there while a rank sharing its core still computes. A tight ping-pong loop
    (all ranks in MPI all the time) does not see this: it measured 13 us a step here,
    where fits lose milliseconds per collective. So: ``reps`` rounds of ``phase_s`` of
    compute (its CPU time measured per rank), then a ring allreduce of 8 doubles
    (``2 (p - 1)`` steps); the wall time per round beyond the compute of the busiest
    core (``ceil(p / cores)`` ranks time-sharing it) is charged to the steps.
    """
    import math

    p = comm.size
    cores = os.cpu_count() or 1
    a = np.random.default_rng(comm.rank).standard_normal(4096)
    reps_per_phase = 1
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.05:           # size the phase on this rank's own CPU time
        np.sort(a)
        reps_per_phase += 1
    reps_per_phase = max(1, int(reps_per_phase * phase_s / 0.05))
    buf = np.zeros(8)
    comm.barrier()
    cpu, start = 0.0, time.perf_counter()
    for _ in range(reps):
        c0 = time.thread_time()
        for _ in range(reps_per_phase):
            np.sort(a)
        cpu += time.thread_time() - c0
        col.allreduce(comm, buf, algorithm="ring")
    wall = (time.perf_counter() - start) / reps
    cpu /= reps
    busiest = math.ceil(p / cores)
    steps = 2 * (p - 1)
    return {"phase_wall": wall, "phase_cpu": cpu, "alpha": max(wall - busiest * cpu, 0.0) / steps}


# ============================================================================ calibrate
def _provenance():
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    return {"command": "python benchmarks/bench_scaling.py " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
            "host": socket.gethostname(), "machine": _harness.machine_description(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load_average_at_start": load}


def _run(name, fn, kwargs, nprocs=1, timeout=3600, threads=1):
    launcher = "mpirun" if nprocs > 1 or fn == "contender_collectives" else "local"
    r = _harness.run_contender(name, THIS, fn, kwargs, threads=threads, timeout=timeout, launcher=launcher,
                               nprocs=nprocs)
    if r["status"] != "ok":
        raise SystemExit(f"{name}: {r['status']}")
    r.setdefault("ranks", [r])
    return r


def calibrate(args):
    from forest.cli import cost_model
    from native import costs

    prov = _provenance()
    print(f"calibrating on {prov['machine']} (load {prov['load_average_at_start']})", flush=True)
    # --- collectives
    two = _run("collectives -np 2", "contender_collectives", {}, nprocs=2)["ranks"]
    over = {}
    for k in range((os.cpu_count() or 1) + 1, 5):
        ranks = _run(f"collectives -np {k}", "contender_collectives", {}, nprocs=k)["ranks"]
        over[str(k)] = max(x["alpha"] for x in ranks)  # the collective waits for its slowest rank
    r0 = two[0]
    native_consts = {"alpha_intra": min(x["alpha"] for x in two), "beta_intra": min(x["beta"] for x in two),
                     "gamma": r0["gamma"], "copy": r0["copy"], "call_overhead": r0["call_overhead"]}
    native_doc = dict(prov, constants=native_consts,
                      note="alpha/beta: native.transport.exchange between 2 ranks (8 B; 8 MiB); gamma: "
                           "numpy.add of 8 MiB; copy: numpy copy of 8 MiB; call_overhead: "
                           "allreduce(8 B, doubling) minus one step; minima over 7 blocks of repetitions")
    costs.CALIBRATION_PATH.write_text(json.dumps(native_doc, indent=1) + "\n")
    print(f"wrote {costs.CALIBRATION_PATH}")
    costs.measured.cache_clear()
    over_alpha = over
    print(f"collectives: {native_consts}; step latency with more ranks than {os.cpu_count()} cores: "
          + ", ".join(f"-np {k}: {v:.2e} s" for k, v in over.items()), flush=True)
    # --- compute phases and memory: the measurements are kept in the file, so the
    # constants can be refitted (--refit) after a change of the model's formulas
    measurements = []
    for case in CAL_CASES:
        runs = [_run(f"{case['model']} n={case['n']} #{i + 1}", "contender_fit", {"case": case})
                for i in range(args.repeats)]
        phases = {}
        for r in runs:
            for k, v in r["ranks"][0]["phases"].items():
                phases[k] = min(phases.get(k, np.inf), v)
        shape = {k: runs[0]["ranks"][0][k] for k in ("nodes_per_row", "node_bytes", "inner_nodes")
                 if k in runs[0]["ranks"][0]}
        measurements.append({"case": case, "phases": phases, "fit_s": min(r["fit_s"] for r in runs),
                             "peak_bytes": min(r["peak_rss_mb"] for r in runs) * 2 ** 20,
                             "base_bytes": min(r["ranks"][0]["base_mb"] for r in runs) * 2 ** 20, **shape})
    # bytes per split record, from a 2-rank causal fit
    rec_case = dict(CAL_CASES[4])
    two_fit = _run("causal n=20000 -np 2 (records)", "contender_fit", {"case": rec_case}, nprocs=2)
    records = {"allgatherv_bytes": sum(x["allgatherv_bytes"] for x in two_fit["ranks"]),
               "inner_nodes": two_fit["ranks"][0].get("inner_nodes")}
    # the pace of p ranks on this machine (forest.cli.cost_model.measured_pace): the same
    # fits at 2 .. 4 ranks, compared with the model's compute and collectives
    pace_measurements = []
    for case in PACE_CASES:
        for p in range(2, 5):
            runs = [_run(f"{case['model']} n={case['n']} -np {p} #{i + 1}", "contender_fit", {"case": case},
                         nprocs=p) for i in range(args.repeats)]
            pace_measurements.append({"case": case, "p": p, "fit_s": min(r["fit_s"] for r in runs)})
    doc = dict(prov, measurements=measurements, records=records, oversubscribed_alpha=over_alpha,
               pace_measurements=pace_measurements, repeats=args.repeats)
    return _write_constants(doc)


def refit(args):
    """Recompute forest/cli/calibration.json's constants from the measurements it stores."""
    from forest.cli import cost_model

    doc = cost_model.calibration()
    if "measurements" not in doc:
        raise SystemExit("forest/cli/calibration.json holds no measurements; run --calibrate")
    doc["refitted"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return _write_constants(doc)


def _write_constants(doc):
    from forest.cli import cost_model

    ms = doc["measurements"]
    trace = {}
    for fam in ("regression", "causal"):
        vals = [m["nodes_per_row"] for m in ms if m["case"]["model"] == fam and "nodes_per_row" in m]
        if vals:
            trace[f"{fam}_nodes_per_row"] = statistics.mean(vals)
    vals = [m["node_bytes"] for m in ms if "node_bytes" in m]
    if vals:
        trace["node_bytes"] = statistics.mean(vals)
    rec = doc.get("records", {})
    if rec.get("inner_nodes"):
        trace["record_bytes_per_split"] = rec["allgatherv_bytes"] / rec["inner_nodes"]
    consts = {"trace": trace, "oversubscribed_alpha": doc.get("oversubscribed_alpha")}
    prices = cost_model.fit_prices([(_case_workload(m["case"]), m["phases"]) for m in ms])
    consts["phases"] = prices
    memory = {}
    for fam in ("gbdt", "forest"):
        pts = [m for m in ms if cost_model.growth_family(_case_workload(m["case"])) == fam]
        if not pts:
            continue
        base = min(m["base_bytes"] for m in pts)
        xs, ys = [], []
        for m in pts:
            parts = cost_model.peak_memory(_case_workload(m["case"]), 1,
                                           dict(consts, memory={fam: {"base": 0.0, "per_row": 0.0}}))
            xs.append(m["case"]["n"])
            ys.append(m["peak_bytes"] - base - parts["features"] - parts["model"] - parts["gathered"])
        memory[fam] = {"base": base, "per_row": max(0.0, float(np.dot(xs, ys) / np.dot(xs, xs)))}
    consts["memory"] = memory
    consts["pace"] = _pace(dict(doc, **consts), doc.get("pace_measurements", []))
    doc.update(consts)
    doc["note"] = ("phases: [seconds per work unit, seconds per call] on one core (forest.cli.cost_model.fit_prices "
                   "over the measurements); memory: base RSS after imports and warm-up, bytes per local row "
                   "beyond the modeled arrays; measurements: minima over repetitions of traced fits")
    cost_model.CALIBRATION_PATH.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {cost_model.CALIBRATION_PATH}")
    for fam, ph in prices.items():
        for name, (a, b) in ph.items():
            print(f"  {fam:10s} {name:12s} a={a:.3e} s/unit  b={b:.3e} s/call")
    print(f"  memory {memory}\n  trace {trace}\n  pace {consts['pace']}")
    return 0


def _pace(constants, points):
    """Per family and rank count, wall seconds per single-core compute second on this machine.

    ``points``: fits at ``p`` ranks (``{"case", "p", "fit_s"}``). The pace is what
    makes the model's compute (``single_core_seconds`` times the pace) plus its
    collectives equal the measured fit; several cases of a family are averaged.
    """
    from forest.cli import cost_model

    constants = {k: v for k, v in constants.items() if k != "pace"}
    cluster = cost_model.Cluster.this_machine()
    found = {}
    for pt in points:
        w = _case_workload(pt["case"])
        pred = cost_model.predict(w, pt["p"], cluster, constants)
        if pred.single_core_seconds <= 0:
            continue
        pace = (pt["fit_s"] - pred.communication_seconds) / pred.single_core_seconds
        found.setdefault(cost_model.growth_family(w), {}).setdefault(str(pt["p"]), []).append(max(pace, 0.0))
    return {fam: {p: statistics.mean(v) for p, v in by_p.items()} for fam, by_p in found.items()}


# ============================================================================ validate
def speed_probe(args):
    """How fast this machine's cores run now, relative to the calibration, per family.

    The calibrated phase prices are seconds on the calibrating machine at the time it
    was calibrated. A virtual machine drifts (this one ran 20-35 % slower on some
    afternoons than in the morning it was calibrated), and another machine has other
    processors; both scale every phase of a family by about one factor. The probe
    refits :data:`PROBE_CASES` (the smaller calibration fits, one rank, fastest of
    ``args.repeats``) and returns, per growth family (``"gbdt"``, ``"forest"``), the
    geometric mean of predicted / measured seconds: the
    :attr:`forest.cli.cost_model.Cluster.core_speed` that the validation then uses.
    Everything else the validation checks (the steps of a fit, how compute scales with
    rows and ranks, the pace of shared cores, the collectives, memory) stays as
    calibrated.

    Returns
    -------
    speeds : dict
        ``family -> core speed``.
    rows : list
        One table row per probe fit.
    """
    from forest.cli import cost_model

    here = cost_model.Cluster.this_machine()
    logs, rows = {}, []
    for case in PROBE_CASES:
        w = _case_workload(case)
        runs = [_run(f"probe {case['model']} n={case['n']} #{i + 1}", "contender_fit", {"case": case})
                for i in range(args.repeats)]
        measured = min(r["fit_s"] for r in runs)
        predicted = cost_model.predict(w, 1, here).seconds
        family = cost_model.growth_family(w)
        logs.setdefault(family, []).append(np.log(predicted / measured))
        rows.append([case["model"] + (" (nuisance given)" if case.get("given_nuisance") else ""),
                     f"{case['n']:,}", family, measured, predicted, f"{predicted / measured:.3f}"])
    return {family: float(np.exp(np.mean(v))) for family, v in logs.items()}, rows


def validate(args):
    from forest.cli import cost_model

    speeds = {"gbdt": 1.0, "forest": 1.0}
    if args.speed_probe:
        measured_speeds, probe_rows = speed_probe(args)
        speeds.update(measured_speeds)
        print(_harness.markdown_table(["speed probe", "rows", "family", "fit s measured (min)",
                                       "fit s predicted (calibrated speed)", "core speed"], probe_rows))
        print("core speed used below: " + ", ".join(f"{k} {v:.3f}" for k, v in speeds.items()) + "\n", flush=True)
        far = {k: v for k, v in speeds.items() if not 0.5 <= v <= 2.0}
        if far:
            print(f"note: this machine runs at {far} of the calibrated speed; the prices may not carry over "
                  "between such different machines: recalibrate (--calibrate) before trusting the table", flush=True)
    rows, worst, worst_raw = [], 0.0, 0.0
    for case in VAL_CASES:
        case = dict(case, n=case["n"] // args.shrink)
        w = _case_workload(case)
        speed = speeds[cost_model.growth_family(w)]
        cluster = cost_model.Cluster.this_machine(core_speed=speed)
        for p in args.procs:
            runs = [_run(f"{case['model']} n={case['n']} -np {p} #{i + 1}", "contender_fit", {"case": case},
                         nprocs=p) for i in range(args.repeats)]
            measured = min(r["fit_s"] for r in runs)
            peak = min(r["peak_rss_mb"] for r in runs)
            pred = cost_model.predict(w, p, cluster)
            raw = cost_model.predict(w, p, cost_model.Cluster.this_machine())
            err, err_raw = pred.seconds / measured - 1.0, raw.seconds / measured - 1.0
            worst, worst_raw = max(worst, abs(err)), max(worst_raw, abs(err_raw))
            rows.append([case["model"], f"{case['n']:,}", p, measured, pred.seconds, f"{err:+.1%}",
                         raw.seconds, f"{err_raw:+.1%}", peak, pred.peak_bytes / 2 ** 20,
                         f"{pred.peak_bytes / 2 ** 20 / peak - 1:+.1%}", pred.communication_seconds])
            print(rows[-1], flush=True)
    print()
    print(_harness.markdown_table(["model", "rows", "p", "fit s measured (min)", "fit s predicted", "error",
                                   "predicted at calibrated speed", "error",
                                   "peak RSS MB measured", "peak RSS MB predicted", "error",
                                   "of which collectives s (pred.)"], rows))
    consts = cost_model.calibration()
    print(f"\nconstants: forest/cli/calibration.json from `{consts.get('command', '?')}` on {consts.get('host', '?')} "
          f"({consts.get('date', '?')}); this run: load {_provenance()['load_average_at_start']}")
    print(f"at the calibrated speed (no probe) the largest time error is {worst_raw:.1%}")
    limit = args.tolerance
    if worst > limit:
        print(f"FAIL: largest time error {worst:.1%} > {limit:.0%}")
        return 1
    print(f"OK: largest time error {worst:.1%} <= {limit:.0%}")
    return 0


# ============================================================================ extrapolate
def _cluster(args):
    from forest.cli.cost_model import Cluster

    return Cluster(cores_per_node=args.cores_per_node, ranks_per_node=args.ranks_per_node,
                   threads_per_rank=args.threads_per_rank, latency_us=args.latency_us, gbits=args.gbits,
                   core_speed=args.core_speed)


def _scaling_rows(w_of_p, procs, cluster, weak):
    from forest.cli import cost_model

    rows = []
    base = None
    for p in procs:
        w = w_of_p(p)
        pr = cost_model.predict(w, p, cluster)
        if base is None:
            base = (pr.seconds, p)
        eff = (base[0] / pr.seconds) if weak else (base[0] * base[1] / (pr.seconds * p))
        comm_share = pr.communication_seconds / pr.seconds if pr.seconds else 0.0
        top = max(pr.phases.items(), key=lambda kv: kv[1])[0] if pr.phases else "-"
        rows.append([p, f"{w.n_rows:.0e}", pr.seconds, f"{eff:.0%}", f"{comm_share:.0%}", top,
                     pr.peak_bytes / 2 ** 30])
    return rows


def extrapolate(args):
    from forest.cli.cost_model import Workload

    cluster = _cluster(args)
    procs = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    headers = ["p", "rows", "fit s", "efficiency", "collectives share", "largest phase", "peak GiB/rank"]
    print(f"cluster: {cluster.describe()}; constants: forest/cli/calibration.json, native/calibration.json\n")
    cases = {
        "GBDT classifier, 28 features, 100 iterations x 31 leaves":
            lambda n: Workload("gbdt-classifier", n, 28, {"n_estimators": 100, "early_stopping": False}),
        "CausalForest, 20 features, 100 trees (+2 x 50 nuisance), min_samples_leaf 5":
            lambda n: Workload("causal", n, 20, {"n_estimators": 100}),
    }
    if args.strong:
        for name, make in cases.items():
            for n in (10 ** 7, 10 ** 8):
                print(f"### Strong scaling: {name}, {n:.0e} rows")
                print(_harness.markdown_table(headers, _scaling_rows(lambda p: make(n), procs, cluster, False)))
                print()
    if args.weak:
        per_rank = 10 ** 8 // procs[-1]  # 1e8 rows at the largest p
        for name, make in cases.items():
            print(f"### Weak scaling: {name}, {per_rank:,} rows per rank ({procs[-1]} ranks: 1e8 rows)")
            print(_harness.markdown_table(headers, _scaling_rows(lambda p: make(per_rank * p), procs, cluster,
                                                                 True)))
            print()
    if args.headline:
        from forest.cli import cost_model

        w = cases["CausalForest, 20 features, 100 trees (+2 x 50 nuisance), min_samples_leaf 5"](10 ** 8)
        pr = cost_model.predict(w, 32, cluster)
        print("### 1e8 rows, 100-tree CausalForest, 32 ranks")
        print(f"predicted fit: {pr.seconds / 60:.1f} min ({pr.compute_seconds / 60:.1f} min compute, "
              f"{pr.communication_seconds / 60:.1f} min collectives); peak {pr.peak_bytes / 2 ** 30:.1f} GiB per rank. "
              "Reference: Meituan's Spark causal forest, 100 trees on ~1e8 rows in under 30 minutes.")
        for k, v in sorted(pr.phases.items(), key=lambda kv: -kv[1])[:6]:
            print(f"  {k:24s} {v / 60:8.2f} min")
        for k, v in sorted(pr.collectives.items(), key=lambda kv: -kv[1][2])[:6]:
            print(f"  {k:24s} {v[2] / 60:8.2f} min  {v[1] / 2 ** 30:8.2f} GiB sent per rank  ({v[0]:.0f} calls)")
        print("  memory per rank: " + ", ".join(f"{k} {v / 2 ** 30:.2f} GiB" for k, v in pr.memory.items()))
    return 0


# ============================================================================ plan check
def plan_check(args):
    """forest-train's plan (the same code as ``--plan``) vs measured forest-train runs, factor 1.5."""
    import subprocess
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    from forest.cli import cost_model
    from forest.cli import plan as cli_plan
    from forest.cli.train import build_parser, collect_params
    from forest.io.dataio import open_source

    tmp = tempfile.mkdtemp(prefix="hfplan-")
    cases = [("gbdt-classifier", 1_000_000, 28, ["--n-estimators", "100", "--param", "early_stopping=false"]),
             ("causal", 100_000, 10, ["--n-estimators", "100"])]
    rows, worst = [], 1.0
    mpirun = _harness.default_mpirun()
    for model, n, F, extra in cases:
        n //= args.shrink
        path = os.path.join(tmp, f"{model}.parquet")
        if model.startswith("gbdt"):
            paths = datasets.higgs_like(n, 0)
            X, y = np.load(paths["X_train"], mmap_mode="r")[:n], np.load(paths["y_train"])[:n]
            cols = {f"x{j}": np.asarray(X[:, j]) for j in range(F)}
            cols["y"] = y.astype(np.int64)
            target = ["--outcome", "y"]
        else:
            d = datasets.wager_athey(n, d=F, n_test=10, seed=0)
            cols = {f"x{j}": d["X"][:, j] for j in range(F)}
            cols["t"], cols["y"] = d["t"].astype(np.int64), d["y"]
            target = ["--treatment", "t", "--outcome", "y"]
        pq.write_table(pa.table(cols), path, row_group_size=max(n // 16, 1))
        argv = [path, "--model", model, *target, *extra, "--out", os.path.join(tmp, "m.model"), "--no-progress"]
        cli_args = build_parser().parse_args(argv)
        source = open_source(path)
        features = [c for c in source.columns if c not in ("t", "y")]
        work = cli_plan.workload(cli_args, collect_params(cli_args)[0], source, features)
        # untimed: fills the Numba cache (forest-train compiles inside its fit when cold)
        subprocess.run([sys.executable, THIS, "--train-wrapper", "--"] + argv + ["--force"],
                       capture_output=True, text=True, env=_harness.thread_env(1), check=True)
        for p in args.plan_procs:
            est = cost_model.predict(work, p, cost_model.Cluster.this_machine())
            measured = []
            for _ in range(args.repeats):
                launch = [mpirun, "-np", str(p)] if p > 1 else []
                run = subprocess.run(launch + [sys.executable, THIS, "--train-wrapper", "--"] + argv +
                                     ["--verbose", "--force"], capture_output=True, text=True,
                                     env=_harness.thread_env(1))
                if run.returncode != 0:
                    raise SystemExit(run.stderr[-3000:])
                fit = float(_grep(run.stderr, "fit (wall)"))
                peak = max(float(v) for v in _grep_all(run.stderr, "PEAK_RSS_MB"))
                measured.append((fit, peak))
            fit = min(m[0] for m in measured)
            peak = min(m[1] for m in measured)
            rt, rm = est.seconds / fit, est.peak_bytes / 2 ** 20 / peak
            worst = max(worst, rt, 1 / rt, rm, 1 / rm)
            rows.append([model, f"{n:,}", p, fit, est.seconds, f"{rt:.2f}x", peak, est.peak_bytes / 2 ** 20,
                         f"{rm:.2f}x"])
            print(rows[-1], flush=True)
    print()
    print(_harness.markdown_table(["model", "rows", "p", "fit s measured", "fit s planned", "planned/measured",
                                   "peak RSS MB measured (max rank)", "peak RSS MB planned", "planned/measured"],
                                  rows))
    if worst > 1.5:
        print(f"FAIL: a plan is off by {worst:.2f}x > 1.5x")
        return 1
    print(f"OK: every plan within {worst:.2f}x <= 1.5x")
    return 0


def train_wrapper(argv):
    """``forest-train ARGV`` in this process, then this rank's peak RSS on stderr."""
    from forest.cli import train

    code = train.main(argv)
    sys.stderr.write(f"PEAK_RSS_MB {_harness.proc_status_mb('VmHWM'):.1f}\n")
    return code


def _grep_all(text, label):
    out = []
    for line in text.splitlines():
        if line.strip().startswith(label):
            out.append(line.split()[-1])
    return out


def _grep(text, label):
    found = _grep_all(text, label)
    if not found:
        raise SystemExit(f"no '{label}' line in:\n{text}")
    return found[-1]


# ============================================================================ main
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["--train-wrapper", "--"]:
        return train_wrapper(argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibrate", action="store_true")
    ap.add_argument("--refit", action="store_true", help="recompute the constants from the stored measurements")
    ap.add_argument("--validate", action="store_true")
    ap.add_argument("--plan-check", action="store_true")
    ap.add_argument("--strong", action="store_true")
    ap.add_argument("--weak", action="store_true")
    ap.add_argument("--headline", action="store_true")
    ap.add_argument("--repeats", type=int, default=3, help="repetitions per fit (the fastest is kept)")
    ap.add_argument("--procs", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2, 3, 4])
    ap.add_argument("--plan-procs", type=lambda s: [int(v) for v in s.split(",")], default=[1, 2])
    ap.add_argument("--tolerance", type=float, default=0.25)
    ap.add_argument("--no-speed-probe", dest="speed_probe", action="store_false",
                    help="--validate at the calibrated core speed (no probe fits first)")
    ap.add_argument("--core-speed", type=float, default=1.0,
                    help="extrapolation: the cluster's core speed relative to the calibrating machine")
    ap.add_argument("--quick", dest="shrink", action="store_const", const=10, default=1,
                    help="validation / plan-check fits on a tenth of the rows (smoke run)")
    ap.add_argument("--cores-per-node", type=int, default=32)
    ap.add_argument("--ranks-per-node", type=int, default=None)
    ap.add_argument("--threads-per-rank", type=int, default=1)
    ap.add_argument("--gbits", type=float, default=25.0)
    ap.add_argument("--latency-us", type=float, default=5.0)
    args = ap.parse_args(argv)
    if args.calibrate:
        return calibrate(args)
    if args.refit:
        return refit(args)
    if args.validate:
        return validate(args)
    if args.plan_check:
        return plan_check(args)
    if not (args.strong or args.weak or args.headline):
        args.strong = args.weak = args.headline = True
    return extrapolate(args)


if __name__ == "__main__":
    sys.exit(main())

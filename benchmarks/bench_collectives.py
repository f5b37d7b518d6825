"""Benchmark of histforest's own collectives against MPI's Allreduce (issue 3).

Run without mpirun: the script launches itself under ``mpirun -np P`` for each P in
``--procs`` (default 2 and 4), collects the workers' measurements, prints a markdown
table and records it, with the command and machine, in ``benchmarks/RESULTS.md``
under "## Collectives (issue 3)" (through ``benchmarks/_harness.py``).

For every buffer size (float64, 1 KiB to 64 MiB; ``--quick``: up to 4 MiB) and every
algorithm it reports the median over repetitions of the slowest rank's time (and
the fastest repetition, a hint of what a quiet machine would give), the
algorithm bandwidth ``algbw = bytes / time``, the bus bandwidth (``algbw * 2(p-1)/p``
for allreduce, ``algbw * (p-1)/p`` for reduce-scatter and allgather, NCCL's
convention: the per-rank link traffic an optimal algorithm needs), the bytes this
rank sent as counted by ``native.stats.STATS`` (the maximum over ranks; MPI's own
Allreduce is opaque, "n/a"), and ``vs MPI``: MPI Allreduce's time divided by ours,
both measured in the same run at the same size (for allreduce rows this is the
bus-bandwidth ratio).

Node-aware part (issue 16): ``--ranks-per-node K`` runs every job with
``HISTFOREST_RANKS_PER_NODE=K`` (pseudo-nodes of K consecutive ranks, see
``native.topology``) and adds the direct and hierarchical algorithms; a column
``model (ms)`` gives ``native.costs``' prediction for the same layout, and ``auto``
reports which algorithm it took. On one machine the "network" between pseudo-nodes is
shared memory, so this measures the algorithms' overheads (extra node-internal
steps), not a network; the model's inter-node constants come from
``HISTFOREST_NET_LATENCY_US`` / ``HISTFOREST_NET_GBITS``.

    python benchmarks/bench_collectives.py --quick          # smoke run
    python benchmarks/bench_collectives.py                  # full run
    python benchmarks/bench_collectives.py --procs 4 --ranks-per-node 2 --no-write
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

SECTION = "Collectives (issue 3)"
FULL_SIZES = [2**k for k in range(10, 27, 2)]       # 1 KiB .. 64 MiB, x4 steps
QUICK_SIZES = [2**k for k in range(10, 23, 2)]      # 1 KiB .. 4 MiB
CASES = [  # (operation, algorithm)
    ("allreduce", "mpi"),
    ("allreduce", "ring"),
    ("allreduce", "rabenseifner"),
    ("allreduce", "doubling"),
    ("allreduce", "direct"),
    ("allreduce", "hierarchical"),
    ("allreduce", "auto"),
    ("reduce_scatter", "ring"),
    ("reduce_scatter", "halving"),
    ("reduce_scatter", "direct"),
    ("reduce_scatter", "hierarchical"),
    ("allgather", "ring"),
    ("allgather", "bruck"),
]
BUS_FACTOR = {"allreduce": lambda p: 2 * (p - 1) / p,
              "reduce_scatter": lambda p: (p - 1) / p,
              "allgather": lambda p: (p - 1) / p}


# ----------------------------------------------------------------------------- worker
def _call(col, comm, op, algorithm, x, block):
    if op == "allreduce":
        return col.allreduce(comm, x, algorithm=algorithm)
    if op == "reduce_scatter":
        return col.reduce_scatter(comm, x, algorithm=algorithm)[0]
    return col.allgather(comm, block, algorithm=algorithm)


def _repetitions(nbytes, quick, forced=0):
    if forced:
        return forced
    budget = 2e8 if quick else 2e9  # bytes moved per case, roughly
    return int(max(3, min(30 if quick else 100, budget // max(nbytes, 1))))


def worker(sizes, quick, out_path, max_doubling_bytes, reps=0):
    """Measure every case under mpirun; rank 0 writes a JSON list to ``out_path``."""
    from native import collectives as col
    from native import costs
    from native.comm import world
    from native.topology import topology

    comm = world()
    p, r = comm.size, comm.rank
    topo = topology(comm)
    rows = []
    for nbytes in sizes:
        n = nbytes // 8
        x = np.random.default_rng([r, n]).standard_normal(n)
        block = x[: max(n // p, 1)].copy()  # allgather moves p blocks = the same bytes
        reference = col.allreduce(comm, x, algorithm="mpi")
        cases = [c for c in CASES
                 # doubling sends log2(p) whole buffers: meant for small messages only
                 if not (c[1] == "doubling" and nbytes > max_doubling_bytes)
                 # hierarchical only where there are several (pseudo-)nodes
                 and not (c[1] == "hierarchical" and topo.n_nodes == 1)]
        sent = {}
        for op, algorithm in cases:
            result = _call(col, comm, op, algorithm, x, block)  # warm-up, and check
            if op == "allreduce" and not np.allclose(result, reference, rtol=1e-12,
                                                     atol=1e-9):
                raise AssertionError(f"{op}/{algorithm} wrong at {nbytes} B")
            col.STATS.reset()
            _call(col, comm, op, algorithm, x, block)
            sent[op, algorithm] = col.STATS.bytes_sent
        # Repetitions interleave the cases, so a burst of load from other processes
        # slows every algorithm alike instead of the one that happened to be running.
        times = np.empty((_repetitions(nbytes, quick, reps), len(cases)))
        for rep in range(times.shape[0]):
            for k, (op, algorithm) in enumerate(cases):
                comm.barrier()
                t0 = time.perf_counter()
                _call(col, comm, op, algorithm, x, block)
                times[rep, k] = time.perf_counter() - t0
        # slowest rank in each repetition, then the median repetition
        slowest = col.allgather(comm, times[None], algorithm="ring").max(axis=0)
        sent_all = col.allgather(comm, np.array([sent[c] for c in cases], dtype=np.int64)[None])
        for k, (op, algorithm) in enumerate(cases):
            moved = p * block.nbytes if op == "allgather" else nbytes
            chosen = algorithm
            if algorithm == "auto":
                chosen = (col.choose_allreduce if op == "allreduce" else col.choose_reduce_scatter)(moved, p, topo)
            model = None if chosen == "mpi" else costs.seconds(op, chosen, moved, topo)
            rows.append({"p": p, "op": op, "algorithm": algorithm, "bytes": moved,
                         "nodes": topo.n_nodes, "chosen": chosen, "model": model,
                         "time": float(np.median(slowest[:, k])),
                         "best": float(slowest[:, k].min()),
                         "bytes_sent": None if algorithm == "mpi"
                         else int(sent_all[:, k].max()),
                         "reps": int(times.shape[0])})
    if r == 0:
        Path(out_path).write_text(json.dumps(rows))


# --------------------------------------------------------------------------- launcher
def _fmt_bytes(b):
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if b >= scale:
            v = b / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{b} B"


def table(rows):
    """Markdown table of one run (all P), with 'vs MPI' against MPI's Allreduce."""
    mpi = {(r["p"], r["bytes"]): r["time"] for r in rows
           if r["op"] == "allreduce" and r["algorithm"] == "mpi"}
    lines = ["| p | nodes | operation | algorithm | size | time (ms) | fastest (ms) | model (ms) "
             "| algbw (GB/s) | busbw (GB/s) | bytes sent/rank | vs MPI allreduce |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        algbw = r["bytes"] / r["time"] / 1e9
        busbw = algbw * BUS_FACTOR[r["op"]](r["p"])
        base = mpi.get((r["p"], r["bytes"]))
        ratio = f"{base / r['time']:.2f}x" if base else "n/a"
        sent = "n/a (opaque)" if r["bytes_sent"] is None else _fmt_bytes(r["bytes_sent"])
        name = r["algorithm"] if r["algorithm"] != "auto" else f"auto ({r['chosen']})"
        model = "n/a" if r.get("model") is None else f"{r['model'] * 1e3:.3f}"
        lines.append(f"| {r['p']} | {r.get('nodes', 1)} | {r['op']} | {name} | {_fmt_bytes(r['bytes'])} "
                     f"| {r['time'] * 1e3:.3f} | {r.get('best', r['time']) * 1e3:.3f} | {model} "
                     f"| {algbw:.3f} | {busbw:.3f} | {sent} "
                     f"| {ratio} |")
    return "\n".join(lines)


def best_vs_mpi(rows, min_bytes=2**20):
    """Per (p, size >= min_bytes): best own allreduce busbw / MPI's (same run)."""
    out = []
    for p in sorted({r["p"] for r in rows}):
        for size in sorted({r["bytes"] for r in rows if r["p"] == p}):
            if size < min_bytes:
                continue
            cands = [r for r in rows if r["p"] == p and r["bytes"] == size
                     and r["op"] == "allreduce"]
            mpi = [r["time"] for r in cands if r["algorithm"] == "mpi"]
            ours = [(r["time"], r["algorithm"]) for r in cands
                    if r["algorithm"] not in ("mpi", "auto")]
            if mpi and ours:
                t, name = min(ours)
                out.append((p, size, name, mpi[0] / t))
    return out


def bytes_ratio(rows):
    """Per (p, size): counted bytes sent by reduce-scatter / by allreduce (same algorithm family)."""
    sent = {(r["p"], r["bytes"], r["op"], r["algorithm"]): r["bytes_sent"] for r in rows}
    out = []
    for (p, size, op, alg), b in sorted(sent.items()):
        if op == "reduce_scatter" and alg == "ring":
            full = sent.get((p, size, "allreduce", "ring"))
            if full:
                out.append((p, size, b / full))
    return out


def launch(args, argv):
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    sizes = [s for s in sizes
             if s >= args.min_bytes and (not args.max_bytes or s <= args.max_bytes)]
    mpirun = Path(sys.executable).parent / "mpirun"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in args.procs:
            out = Path(tmp) / f"p{p}.json"
            cmd = [str(mpirun), "-np", str(p), sys.executable, __file__, "--worker",
                   "--out", str(out), "--sizes", ",".join(map(str, sizes)),
                   "--max-doubling-bytes", str(args.max_doubling_bytes),
                   "--reps", str(args.reps)]
            if args.quick:
                cmd.append("--quick")
            env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
            if args.ranks_per_node:
                env["HISTFOREST_RANKS_PER_NODE"] = str(args.ranks_per_node)
            print(f"== p={p}: {' '.join(cmd[:3])} ...", flush=True)
            subprocess.run(cmd, check=True, env=env, cwd=REPO)
            rows += json.loads(out.read_text())
    md = table(rows)
    verdict = [f"- p={p}, {_fmt_bytes(s)}: best own allreduce ({name}) reaches "
               f"{ratio:.2f}x MPI's bus bandwidth" for p, s, name, ratio in best_vs_mpi(rows)]
    halves = bytes_ratio(rows)
    if halves:
        lo = min(h for _, _, h in halves)
        hi = max(h for _, _, h in halves)
        verdict.append(f"- reduce-scatter (ring) sent {lo:.3f}-{hi:.3f} of the bytes of the "
                       f"ring allreduce per rank (counted, all sizes and p)")
    import _harness

    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    machine = (f"{_harness.machine_description()}; load average at start {load} (the "
               "machine is shared; ranks beyond the core count are oversubscribed)")
    body = md + ("\n\nTargets (>= 0.9x MPI bus bandwidth at >= 1 MiB; reduce-scatter "
                 "sends half the bytes of allreduce):\n" + "\n".join(verdict)
                 if verdict else "")
    title = f"{'Smoke run (--quick)' if args.quick else 'Full run'}, p = {args.procs}"
    if args.ranks_per_node:
        title += f", pseudo-nodes of {args.ranks_per_node} ranks"
    print(f"Command: {_harness.command_line()}\nMachine: {machine}\n\n{body}")
    if not args.no_write:
        _harness.write_results_section(SECTION, body, machine=machine, title=title)
        print(f"written to {_harness.RESULTS_PATH}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sizes up to 4 MiB, fewer repetitions")
    ap.add_argument("--procs", type=lambda s: [int(v) for v in s.split(",")], default=[2, 4],
                    help="comma-separated rank counts (default 2,4)")
    ap.add_argument("--max-bytes", type=int, default=0, help="drop sizes above this")
    ap.add_argument("--min-bytes", type=int, default=0, help="drop sizes below this")
    ap.add_argument("--reps", type=int, default=0,
                    help="repetitions per case (default: by size, fewer with --quick)")
    ap.add_argument("--no-write", action="store_true", help="do not touch RESULTS.md")
    ap.add_argument("--ranks-per-node", type=int, default=0,
                    help="pseudo-nodes of this many consecutive ranks (HISTFOREST_RANKS_PER_NODE)")
    ap.add_argument("--max-doubling-bytes", type=int, default=1 << 20,
                    help="largest size at which recursive doubling is measured")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--sizes", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker([int(s) for s in args.sizes.split(",")], args.quick, args.out,
               args.max_doubling_bytes, args.reps)
    else:
        launch(args, argv)


if __name__ == "__main__":
    main()

"""Cost of the default watchdog (issue 14) in the GBDT fit under mpirun.

The watchdog (``native.watchdog``) is on by default under ``mpirun``: every blocking
MPI call notes whom it waits for, and a thread per rank wakes four times a second to
answer its peers. This benchmark fits bench_gbdt's HIGGS-like GBDT (100 trees, 31
leaves, 255 bins; ``--n-train`` rows) under ``mpirun -np P`` (one thread per rank),
alternating ``HISTFOREST_WATCHDOG=0`` and the default, ``--repeats`` times each, and
prints per setting the minimum and median over repetitions of the fit's wall time
(slowest rank) and of its process CPU time (the main thread's and kernel threads'
seconds, summed over ranks), and the overhead of the watchdog as the ratio of the
minima. Minima of CPU time are the load-robust figure on a shared machine.

    python benchmarks/bench_watchdog.py                          # 200k rows, -np 2, 5 x 2 fits
    python benchmarks/bench_watchdog.py --n-train 1000000 --repeats 5
"""
import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402
import datasets  # noqa: E402

THIS = os.path.abspath(__file__)


def contender_gbdt_fit(n_train, seed, threads, cfg, **_):
    """One mpirun rank: bench_gbdt's distributed fit, plus its CPU seconds and messages."""
    import bench_gbdt
    from native.comm import world
    from native.stats import STATS

    comm = world()
    bench_gbdt._warm_numba(threads, cfg)
    X, y, _ = bench_gbdt._load(n_train, seed, comm.rank, comm.size)
    comm.barrier()
    STATS.reset()
    cpu0 = time.process_time()
    _, fit_s = bench_gbdt._ours_fit(X, y, comm, threads, cfg)
    cpu = time.process_time() - cpu0
    return {"fit_s": fit_s, "cpu_s": cpu, "messages": STATS.messages,
            "watchdog": comm.activity is not None}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-train", type=int, default=200_000)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1800.0)
    args = ap.parse_args(argv)
    cfg = {"n_trees": 100, "num_leaves": 31, "max_bins": 255, "learning_rate": 0.1, "min_leaf": 20,
           "seed": args.seed}
    datasets.higgs_like(args.n_train, args.seed)
    kw = {"n_train": args.n_train, "seed": args.seed, "cfg": cfg}
    runs = {"off": [], "on": []}
    saved = os.environ.get("HISTFOREST_WATCHDOG")
    try:
        for rep in range(args.repeats):
            for setting in ("off", "on"):  # interleaved: load bursts hit both alike
                if setting == "off":
                    os.environ["HISTFOREST_WATCHDOG"] = "0"
                else:
                    os.environ.pop("HISTFOREST_WATCHDOG", None)
                r = _harness.run_contender(f"watchdog {setting} #{rep + 1}", THIS, "contender_gbdt_fit", kw,
                                           threads=1, timeout=args.timeout, launcher="mpirun",
                                           nprocs=args.procs)
                if r["status"] != "ok":
                    print(f"failed: {r['status']}", file=sys.stderr)
                    return 1
                ranks = r["ranks"]
                if any(x["watchdog"] != (setting == "on") for x in ranks):
                    raise RuntimeError("the watchdog setting did not reach the ranks")
                runs[setting].append((r["fit_s"], sum(x["cpu_s"] for x in ranks), ranks[0]["messages"]))
    finally:
        if saved is None:
            os.environ.pop("HISTFOREST_WATCHDOG", None)
        else:
            os.environ["HISTFOREST_WATCHDOG"] = saved
    rows = []
    for setting in ("off", "on"):
        walls = [w for w, _, _ in runs[setting]]
        cpus = [c for _, c, _ in runs[setting]]
        rows.append([setting, min(walls), statistics.median(walls), min(cpus), statistics.median(cpus),
                     runs[setting][0][2]])
    print(f"\nGBDT fit, HIGGS-like {args.n_train:,} rows x 28, 100 trees x 31 leaves, mpirun -np {args.procs}, "
          f"1 thread per rank, {args.repeats} fits per setting (interleaved)\n")
    print(_harness.markdown_table(["watchdog", "fit wall min s", "fit wall median s", "fit CPU min s",
                                   "fit CPU median s", "messages per rank"], rows))
    print(f"\noverhead of the watchdog: wall (minima) {rows[1][1] / rows[0][1] - 1:+.1%}, "
          f"CPU (minima) {rows[1][3] / rows[0][3] - 1:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

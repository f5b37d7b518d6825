"""Profile one GBDTClassifier fit: phase times, CPU vs wall time, peak RSS, vs sklearn HGB.

This script owns the engine-side measurement of issue 4 (boosting speed). It fits
the HIGGS-like binary task (generated in memory by :mod:`benchmarks.datasets`, not
cached) with histforest's ``GBDTClassifier`` and scikit-learn's
``HistGradientBoostingClassifier`` on identical settings (100 trees, 31 leaves,
255 bins, lr 0.1, no early stopping) and prints, per contender and thread count,
wall and process CPU seconds, plus histforest's per-phase table
(:data:`forest.profiling.TIMER`, switched to process CPU seconds). CPU time is the steadier figure on a shared
machine. Peak RSS is the process's high-water mark (``ru_maxrss``), so it is only
meaningful for the first contender of a run; use ``--only`` to measure one alone.

Usage::

    .venv/bin/python benchmarks/profile_gbdt.py --rows 200000 --threads 1
    .venv/bin/python benchmarks/profile_gbdt.py --quick          # 20k rows, 20 trees
    .venv/bin/python benchmarks/profile_gbdt.py --cprofile       # top functions too
    .venv/bin/python benchmarks/profile_gbdt.py --rows 1000000 --threads 2 --ab --reps 3

``--ab`` fits our model alternately with the threading settings before and after the
row-split / block-partition change (``before``: feature-split histograms, serial
partition, parallel builds from 16384 rows; ``after``: the current defaults) and prints
per variant the minimum and median wall time and the main thread's CPU time (on a
quiet machine the wall time is the figure; on a loaded one, run it under
``OMP_WAIT_POLICY=passive`` and compare the main thread's CPU time, the critical path).
"""
import argparse
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _data(n, seed=0):
    from benchmarks.datasets import _generate_higgs

    X, y, _ = _generate_higgs(n, seed, 0)
    return X, y


def _timed(fn):
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


class _CpuClock:
    """Stands in for the ``time`` module inside forest.profiling: phases in process CPU time."""

    perf_counter = staticmethod(time.process_time)


def _ours(X, y, threads, trees, cprofile):
    import forest.profiling
    from forest.estimators.gbdt import GBDTClassifier
    from forest.profiling import TIMER

    # Phase table in process CPU seconds (all threads): wall time is noise on a shared machine.
    forest.profiling.time = _CpuClock

    est = GBDTClassifier(n_estimators=trees, max_leaf_nodes=31, max_bins=255, learning_rate=0.1,
                         early_stopping=False, n_threads=threads, random_state=0)
    TIMER.reset()
    if cprofile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
    _, wall, cpu = _timed(lambda: est.fit(X, y))
    if cprofile:
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    return est, wall, cpu, TIMER.table()


#: Threading settings compared by --ab, as forest.engine.growth_options.EngineOptions fields
#: (None: the defaults).
AB_VARIANTS = {"before": dict(gh_hist_split="features", partition_blocks_min_rows=1 << 62, gh_parallel_rows=16384),
               "after": None}


def _ab(X, y, threads, trees, reps):
    """Interleaved fits per AB_VARIANTS; returns {name: [(wall_s, main_thread_cpu_s), ...]}."""
    from forest.estimators.gbdt import GBDTClassifier
    from forest.engine.growth_options import engine_options

    out = {name: [] for name in AB_VARIANTS}
    for _ in range(reps):
        for name, setting in AB_VARIANTS.items():
            with engine_options(**(setting or {})):
                est = GBDTClassifier(n_estimators=trees, max_leaf_nodes=31, max_bins=255, learning_rate=0.1,
                                     early_stopping=False, n_threads=threads, random_state=0)
                w0, c0 = time.perf_counter(), time.thread_time()
                est.fit(X, y)
                out[name].append((time.perf_counter() - w0, time.thread_time() - c0))
    return out


def _sklearn(X, y, threads, trees):
    from sklearn.ensemble import HistGradientBoostingClassifier
    from threadpoolctl import threadpool_limits

    est = HistGradientBoostingClassifier(max_iter=trees, max_leaf_nodes=31, max_bins=255, learning_rate=0.1,
                                         early_stopping=False, random_state=0)
    with threadpool_limits(limits=threads, user_api="openmp"):
        _, wall, cpu = _timed(lambda: est.fit(X, y))
    return est, wall, cpu


def _auc(est, X, y):
    from sklearn.metrics import roc_auc_score

    return roc_auc_score(y, est.predict_proba(X)[:, 1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[200_000])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="20k rows, 20 trees (smoke run)")
    ap.add_argument("--only", choices=["ours", "sklearn"], help="run one contender (clean peak RSS)")
    ap.add_argument("--cprofile", action="store_true", help="print the top functions of our fit")
    ap.add_argument("--ab", action="store_true", help="interleaved before/after threading settings (ours only)")
    ap.add_argument("--reps", type=int, default=3, help="fits per variant with --ab")
    args = ap.parse_args(argv)
    if args.quick:
        args.rows, args.trees = [20_000], 20

    # Warm Numba's caches so compile/load time is not counted in the first fit.
    if args.only != "sklearn":
        Xw, yw = _data(20_000, seed=1)
        _ours(Xw, yw, 1, 2, False)
    for n in args.rows:
        X, y = _data(n)
        Xt, yt = _data(20_000, seed=7)
        for t in args.threads:
            if args.ab:
                for name, runs in _ab(X, y, t, args.trees, args.reps).items():
                    w = sorted(r[0] for r in runs)
                    c = sorted(r[1] for r in runs)
                    print(f"ab {name:7s} n={n} threads={t} trees={args.trees}: wall min {w[0]:.2f} median "
                          f"{w[len(w) // 2]:.2f} s; main-thread cpu min {c[0]:.2f} median {c[len(c) // 2]:.2f} s")
                continue
            if args.only != "sklearn":
                est, wall, cpu, table = _ours(X, y, t, args.trees, args.cprofile)
                print(f"ours    n={n} threads={t}: wall {wall:.2f} s  cpu {cpu:.2f} s  "
                      f"auc {_auc(est, Xt, yt):.4f}  trees {est.n_iter_}")
                print(table)
            if args.only != "ours":
                est, wall, cpu = _sklearn(X, y, t, args.trees)
                print(f"sklearn n={n} threads={t}: wall {wall:.2f} s  cpu {cpu:.2f} s  "
                      f"auc {_auc(est, Xt, yt):.4f}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"peak RSS of this process: {peak:.0f} MiB")


if __name__ == "__main__":
    main()

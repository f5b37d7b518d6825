"""Profile one CausalForest fit (with its two nuisance forests): phases in CPU seconds.

This script owns the engine-side measurement of issue 5 (honest-forest speed). It
fits :class:`forest.CausalForest` on the Wager-Athey design
(:func:`forest.simulate.athey_wager`, generated in memory) and prints wall and
process CPU seconds plus the per-phase table of :data:`forest.profiling.TIMER`,
switched to process CPU seconds (the steadier figure on a shared machine), the wall
time of the two centering forests, and the shape of the causal trees (leaves per
tree, row-weighted leaf depth, structure rows per tree, and the (row, feature,
level) visits they imply). Under
``mpirun`` every rank holds a consecutive block of the rows; rank 0 prints its own
table and the CPU seconds summed over ranks.

Usage::

    .venv/bin/python benchmarks/profile_causal.py --rows 20000 --threads 1
    .venv/bin/python benchmarks/profile_causal.py --rows 100000 --threshold inf
    .venv/bin/python benchmarks/profile_causal.py --rows 100000 --design arms3 --threads 2
    NUMBA_NUM_THREADS=1 .venv/bin/mpirun -np 2 .venv/bin/python benchmarks/profile_causal.py --rows 100000
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _CpuClock:
    """Stands in for the ``time`` module inside forest.profiling: phases in process CPU time."""

    perf_counter = staticmethod(time.process_time)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--trees", type=int, default=200)
    p.add_argument("--design", default="wa",
                   help="wa: forest.simulate.athey_wager (binary t); continuous2, arms3, arms5 or a "
                        "several-arm design name such as step-strong-3-unbal "
                        "(benchmarks/datasets.py parse_arm_design)")
    p.add_argument("--nuisance", type=int, default=None, help="trees per centering forest (default: the model's)")
    p.add_argument("--threads", type=int, default=None, help="Numba threads (default: Numba's)")
    p.add_argument("--threshold", type=float, default=None,
                   help="EngineOptions.local_threshold (inf: all local; 0: histograms)")
    p.add_argument("--hist-rows", type=float, default=None,
                   help="EngineOptions.hist_rows (inf: sorted-code scan only)")
    p.add_argument("--repeat", type=int, default=1, help="fits (the first one includes Numba cache loading)")
    p.add_argument("--cprofile", action="store_true")
    p.add_argument("--quick", action="store_true", help="2000 rows, 20 trees")
    a = p.parse_args(argv)
    if a.quick:
        a.rows, a.trees = 2000, 20

    import numba

    import forest.profiling
    from forest.engine.growth_options import engine_options
    from forest.estimators.regression_forest import RegressionForest
    from forest.simulate import athey_wager
    from native.comm import world

    comm = world()
    if a.threads:
        numba.set_num_threads(a.threads)
    forest.profiling.time = _CpuClock
    data = athey_wager(a.rows, a.features, seed=1) if a.design == "wa" else _several(a)
    lo = a.rows * comm.rank // comm.size
    hi = a.rows * (comm.rank + 1) // comm.size
    X, t, y = data.X[lo:hi], data.t[lo:hi], data.y[lo:hi]
    centering_s = [0.0]
    plain_fit = RegressionForest.fit

    def timed_fit(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return plain_fit(self, *args, **kwargs)
        finally:
            centering_s[0] += time.perf_counter() - start

    RegressionForest.fit = timed_fit
    with engine_options(local_threshold=a.threshold, hist_rows=a.hist_rows) as engine:
        _fits(a, comm, est_args=(X, t, y), data=data, centering_s=centering_s, engine=engine)


class _Design:
    """Training rows and test points with their true effects (the fields _fits reads)."""

    def __init__(self, X, t, y, X_eval, tau_eval):
        self.X, self.t, self.y, self.X_eval, self.tau_eval = X, t, y, X_eval, tau_eval


def _several(a):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import datasets

    if a.design == "continuous2":
        d = datasets.continuous_two(a.rows, d=a.features, n_test=2000, seed=0)
    else:
        d = datasets.multi_arm_design(a.rows, **datasets.parse_arm_design(a.design), d=a.features, n_test=2000,
                                      seed=0)
    return _Design(d["X"], d["t"], d["y"], d["X_test"], d["tau_test"])


def _fits(a, comm, est_args, data, centering_s, engine):
    import numba

    from forest.estimators.causal_forest import CausalForest
    from forest.profiling import TIMER
    from forest.engine.tree import unpack_trees

    X, t, y = est_args
    for rep in range(a.repeat):
        centering_s[0] = 0.0
        TIMER.reset()
        comm.barrier()
        w0, c0 = time.perf_counter(), time.process_time()
        est = CausalForest(a.trees, nuisance_estimators=a.nuisance, random_state=0)
        if a.cprofile and comm.rank == 0:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.runcall(est.fit, X, t, y, comm=comm)
        else:
            est.fit(X, t, y, comm=comm)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        cpus = np.array([cpu])
        if comm.size > 1:
            from native import collectives as col

            cpus = col.allreduce(comm, cpus)
        X_eval, tau_eval = (data.X_eval, data.tau_eval) if isinstance(data, _Design) else (data.X[:2000],
                                                                                           data.tau[:2000])
        tau = np.asarray(est.predict(X_eval)).reshape(np.shape(tau_eval))
        rmse = float(np.sqrt(np.mean((tau - tau_eval) ** 2)))
        nodes = len(est.estimators_["feature"])
        if comm.rank == 0:
            print(f"design={a.design} rows={a.rows} d={a.features} trees={a.trees} ranks={comm.size} threads={numba.get_num_threads()} "
                  f"threshold={engine.local_threshold} hist_rows={engine.hist_rows} rep={rep}: wall {wall:.2f} s, "
                  f"CPU {cpu:.2f} s "
                  f"(all ranks {cpus[0]:.2f} s), nodes {nodes}, rmse(tau) {rmse:.4f}")
            print(TIMER.table())
            trees = unpack_trees(est.estimators_)
            leaf = [tr.is_leaf for tr in trees]
            depth = np.mean([np.sum(tr.depth[lf] * tr.count[lf]) / np.sum(tr.count[lf]) for tr, lf in zip(trees, leaf)])
            rows = np.mean([tr.count[0] for tr in trees])
            print(f"centering forests {centering_s[0]:.2f} s wall; leaves per tree {np.mean([lf.sum() for lf in leaf]):.0f}, "
                  f"row-weighted leaf depth {depth:.1f}, structure rows per tree {rows:.0f}: "
                  f"{len(trees) * rows * a.features * depth:.3g} (row, feature, level) visits")
            if a.cprofile:
                pstats.Stats(prof).sort_stats("tottime").print_stats(15)
            sys.stdout.flush()


if __name__ == "__main__":
    main()

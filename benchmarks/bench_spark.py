"""forest.spark against one process and against mpirun (issue 36).

Two measurements, both recorded in RESULTS.md ("Socket transport and Spark (issue 36)"):

1. ``--check-rows`` (default 200,000): a CausalForest and a GBDTRegressor fitted
   through :func:`forest.spark.fit` under ``local[K]`` (K partitions, rank r = partition
   r) against the same estimator fitted in this process on the same rows in the same
   order; the maximum absolute difference of their predictions on every row (the
   target is <= 1e-9).
2. ``--time-rows`` (default 1,000,000): the wall time of ``forest.spark.fit`` (driver
   side: the barrier stage, Arrow batches into the tasks, rendezvous, fit, model bytes
   back) against the same fit under ``mpirun -np K`` (the slowest rank's ``fit`` call;
   and the whole job, interpreter start and data generation included). Both sides
   first fit a 4-tree warm-up model on the same rows, so Numba's cache is loaded and
   Spark's Python workers have imported forest; one Numba thread per rank on both sides.

    python benchmarks/bench_spark.py                         # both, K = 3, writes RESULTS.md
    python benchmarks/bench_spark.py --check-rows 20000 --time-rows 50000 --no-write
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

SECTION = "Socket transport and Spark (issue 36)"
FEATURES = [f"x{i}" for i in range(6)]


def make_rows(n, seed=36):
    """The benchmark's rows: 6 features, a binary treatment, an outcome (pandas DataFrame)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, len(FEATURES)))
    t = rng.integers(0, 2, n)
    pdf = pd.DataFrame(X, columns=FEATURES)
    pdf["t"] = t
    pdf["y"] = X[:, 0] * t + X[:, 1] - 0.5 * X[:, 2] ** 2 + rng.standard_normal(n)
    return pdf


def causal(n_estimators):
    from forest import CausalForest

    return CausalForest(n_estimators=n_estimators, random_state=0)


def gbdt():
    from forest import GBDTRegressor

    return GBDTRegressor(n_estimators=50, random_state=0)


# ----------------------------------------------------------------------------- mpirun side
def mpi_worker(rows, n_estimators, out_path):
    """Under mpirun: warm up, then time the causal forest's fit on this rank's block."""
    from native import collectives as col
    from native.blocks import block_range
    from native.comm import world

    comm = world()
    pdf = make_rows(rows)
    lo, hi = block_range(rows, comm.size, comm.rank)
    mine = pdf.iloc[lo:hi].reset_index(drop=True)
    causal(4).fit(mine[FEATURES], mine["t"].to_numpy(), mine["y"].to_numpy())  # warm-up: every kernel loaded
    comm.barrier()
    t0 = time.perf_counter()
    model = causal(n_estimators).fit(mine[FEATURES], mine["t"].to_numpy(), mine["y"].to_numpy())
    seconds = time.perf_counter() - t0
    slowest = col.allgather_object(comm, seconds)
    if comm.rank == 0:
        pred = model.predict(pdf[FEATURES].iloc[:1000])
        Path(out_path).write_text(json.dumps({"fit_s": max(slowest), "pred": pred.tolist()}))


def time_mpirun(k, rows, n_estimators):
    from _harness import default_mpirun, thread_env

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "mpi.json")
        cmd = [default_mpirun(), "-np", str(k), sys.executable, str(Path(__file__).resolve()), "--mpi-worker", out,
               "--time-rows", str(rows), "--trees", str(n_estimators)]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=thread_env(1), timeout=3600)
        wall = time.perf_counter() - t0
        got = json.loads(Path(out).read_text())
    return got["fit_s"], wall, np.array(got["pred"])


# ------------------------------------------------------------------------------ Spark side
def spark_session(k):
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    warnings.filterwarnings("ignore", message=".*pandas >= 3.0.0.*")
    session = (SparkSession.builder.master(f"local[{k}]").appName("bench_spark")
               .config("spark.ui.enabled", "false").config("spark.driver.memory", "8g")
               .config("spark.executorEnv.NUMBA_NUM_THREADS", "1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


def check(spark, k, rows, n_estimators):
    """Max |spark fit - one-process fit| over every row, for a causal forest and GBDT."""
    from forest import spark as fs

    pdf = make_rows(rows)
    df = spark.createDataFrame(pdf)
    if df.rdd.getNumPartitions() != k:
        raise RuntimeError(f"expected {k} partitions, got {df.rdd.getNumPartitions()}")
    df = df.cache()
    out = {}
    for name, make, roles in (("CausalForest", lambda: causal(n_estimators), {"treatment": "t", "outcome": "y"}),
                              ("GBDTRegressor", gbdt, {"outcome": "y"})):
        t0 = time.perf_counter()
        model = fs.fit(make(), df, features=FEATURES, num_workers=k, **roles)
        spark_s = time.perf_counter() - t0
        targets = [pdf[roles[r]].to_numpy() for r in ("treatment", "outcome") if r in roles]
        t0 = time.perf_counter()
        alone = make().fit(pdf[FEATURES], *targets)
        alone_s = time.perf_counter() - t0
        diff = float(np.abs(model.predict(pdf[FEATURES]) - alone.predict(pdf[FEATURES])).max())
        out[name] = {"max_abs_diff": diff, "spark_s": spark_s, "alone_s": alone_s}
        print(f"{name}: max |diff| {diff:.3g} (spark {spark_s:.1f} s, one process {alone_s:.1f} s)", flush=True)
    df.unpersist()
    return out


def time_spark(spark, k, rows, n_estimators):
    from forest import spark as fs

    pdf = make_rows(rows)
    df = spark.createDataFrame(pdf).cache()
    df.count()  # materialise the cache: the timing is the fit, not the DataFrame's creation
    # warm-up, as on the mpirun side: the workers import forest and load every kernel
    fs.fit(causal(4), df, features=FEATURES, treatment="t", outcome="y", num_workers=k)
    t0 = time.perf_counter()
    model = fs.fit(causal(n_estimators), df, features=FEATURES, treatment="t", outcome="y", num_workers=k)
    seconds = time.perf_counter() - t0
    df.unpersist()
    return seconds, model.predict(pdf[FEATURES].iloc[:1000])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=3, help="K: Spark tasks = mpirun ranks")
    ap.add_argument("--check-rows", type=int, default=200_000, help="0 skips the equality check")
    ap.add_argument("--time-rows", type=int, default=1_000_000, help="0 skips the timing")
    ap.add_argument("--trees", type=int, default=32, help="causal forest trees")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--mpi-worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mpi_worker:
        mpi_worker(args.time_rows, args.trees, args.mpi_worker)
        return 0
    from _harness import write_results_section

    k = args.procs
    spark = spark_session(k)
    lines = []
    if args.check_rows:
        res = check(spark, k, args.check_rows, args.trees)
        lines += [f"#### Spark local[{k}] vs one process, {args.check_rows:,} rows ({args.trees}-tree CausalForest, "
                  "50-iteration GBDTRegressor)", "",
                  "| estimator | max abs difference of predictions (every row) | forest.spark.fit (s) "
                  "| one process fit (s) |", "|---|---|---|---|"]
        lines += [f"| {name} | {r['max_abs_diff']:.3g} | {r['spark_s']:.1f} | {r['alone_s']:.1f} |"
                  for name, r in res.items()]
        lines.append("")
    if args.time_rows:
        spark_s, spark_pred = time_spark(spark, k, args.time_rows, args.trees)
        spark.stop()
        mpi_fit, mpi_wall, mpi_pred = time_mpirun(k, args.time_rows, args.trees)
        same = float(np.abs(spark_pred - mpi_pred).max())
        print(f"spark {spark_s:.1f} s, mpirun fit {mpi_fit:.1f} s (job {mpi_wall:.1f} s); max |diff| {same:.3g}")
        lines += [f"#### Fit time: forest.spark.fit under local[{k}] vs mpirun -np {k}, {args.time_rows:,} rows, "
                  f"{args.trees}-tree CausalForest", "",
                  "| launcher | seconds | ratio to mpirun's fit |", "|---|---|---|",
                  f"| mpirun: slowest rank's fit() | {mpi_fit:.1f} | 1.00 |",
                  f"| mpirun: whole job (start, imports, data, warm-up, fit) | {mpi_wall:.1f} | "
                  f"{mpi_wall / mpi_fit:.2f} |",
                  f"| forest.spark.fit (driver wall: stage, Arrow batches, rendezvous, fit, model back) "
                  f"| {spark_s:.1f} | {spark_s / mpi_fit:.2f} |", "",
                  f"Predictions of the two models on 1,000 rows: max abs difference {same:.3g}.", ""]
    else:
        spark.stop()
    body = "\n".join(lines)
    print(body)
    if not args.no_write and body:
        write_results_section(SECTION, body, title=f"forest.spark (K = {k})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

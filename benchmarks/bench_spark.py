"""forest.spark against one process and against mpirun (issue 36).

Two measurements, both recorded in RESULTS.md ("Socket transport and Spark (issue 36)"):

1. ``--check-rows`` (default 200,000): a CausalForest and a GBDTRegressor fitted
   through :func:`forest.spark.fit` under ``local[K]`` (K partitions, rank r = partition
   r) against the same estimator fitted in this process on the same rows in the same
   order; the maximum absolute difference of their predictions on every row (the
   target is <= 1e-9).
2. ``--time-rows`` (default 1,000,000): the wall time of ``forest.spark.fit`` (driver
   side: the barrier stage, Arrow batches into the tasks, rendezvous, fit, model bytes
   back to the driver and restored there) against the same fit under ``mpirun -np K``
   (the slowest rank's ``fit`` call; and the whole job, interpreter start, data
   generation and warm-up included). What is not timed is the same on both sides: each
   rank (each Spark partition) holds the same contiguous block of the same rows
   (``native.blocks.block_range``), generated before the clock starts (mpirun: in each
   rank; Spark: by a ``mapInArrow`` over ``K`` seed rows, cached in the executors'
   memory), and each side first fits a 4-tree warm-up model on those rows in the same
   processes (Numba's kernels loaded, forest imported: the timed Spark fit must run in
   the warm-up's Python workers, which the table says). One Numba thread per rank on
   both sides. ``forest.spark.fit(..., timings=)`` breaks the Spark side down by stage.
   ``--repeat N`` alternates the two sides N times (the machine is shared).
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
def mpi_worker(rows, n_estimators, out_path, socket_fit=False):
    """Under mpirun: warm up, then time the causal forest's fit on this rank's block.

    With ``socket_fit``, the same fit again in the same (warm) processes over the socket
    transport, through the rank body the Spark tasks run (:func:`forest.distributed.ranks.run_rank`):
    what the transport costs apart from Spark.
    """
    from forest import model_io
    from forest.distributed.ranks import fit_spec, listen, run_rank
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
    out = {"fit_s": max(slowest)}
    if socket_fit:
        listener = listen(advertise="127.0.0.1")
        endpoints = col.allgather_object(comm, listener.address)
        spec = fit_spec(causal(n_estimators), FEATURES, {"treatment": "t", "outcome": "y", "instrument": None,
                                                         "time": None, "event": None})
        comm.barrier()
        clock = {}
        run_rank(listener, endpoints, comm.rank, b"bench_spark", model_io.dumps(causal(n_estimators)),
                 mine[spec.columns], spec, clock=clock)
        out["socket_fit_s"] = max(col.allgather_object(comm, clock["fit"]))
    if comm.rank == 0:
        out["pred"] = model.predict(pdf[FEATURES].iloc[:1000]).tolist()
        Path(out_path).write_text(json.dumps(out))


def time_mpirun(k, rows, n_estimators, socket_fit=False):
    """``mpirun -np k`` of :func:`mpi_worker`: (slowest fit s, job wall s, predictions, socket fit s or None)."""
    from _harness import default_mpirun, thread_env

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "mpi.json")
        cmd = [default_mpirun(), "-np", str(k), sys.executable, str(Path(__file__).resolve()), "--mpi-worker", out,
               "--time-rows", str(rows), "--trees", str(n_estimators)] + (["--socket-fit"] if socket_fit else [])
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, env=thread_env(1), timeout=3600)
        wall = time.perf_counter() - t0
        got = json.loads(Path(out).read_text())
    return got["fit_s"], wall, np.array(got["pred"]), got.get("socket_fit_s")


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


def staged_frame(spark, k, rows):
    """The benchmark's rows as a cached DataFrame whose partition ``r`` is mpirun rank ``r``'s block.

    Generated in the executors' Python workers from ``K`` seed rows (one per partition),
    as Arrow, then cached; returns ``(df, seconds)``.
    """
    import pyarrow as pa

    def blocks(batches):
        from native.blocks import block_range

        for batch in batches:
            pdf = make_rows(rows)
            for r in batch.column(0).to_pylist():
                lo, hi = block_range(rows, k, r)
                yield pa.RecordBatch.from_pandas(pdf.iloc[lo:hi], preserve_index=False)

    schema = ", ".join([f"{c} double" for c in FEATURES] + ["t long", "y double"])
    t0 = time.perf_counter()
    df = spark.range(0, k, 1, numPartitions=k).mapInArrow(blocks, schema).cache()
    from pyspark.sql import functions as F

    sizes = dict(df.groupBy(F.spark_partition_id().alias("p")).count().collect())
    seconds = time.perf_counter() - t0
    from native.blocks import block_range

    want = {r: block_range(rows, k, r)[1] - block_range(rows, k, r)[0] for r in range(k)}
    if sizes != want:
        raise RuntimeError(f"partition sizes {sizes}, expected mpirun's blocks {want}")
    return df, seconds


def time_spark(spark, df, k, n_estimators, probe):
    """Warm-up fit, then the timed one; ``(seconds, timings, warm-up seconds, predictions on probe)``."""
    from forest import spark as fs

    t0 = time.perf_counter()
    fs.fit(causal(4), df, features=FEATURES, treatment="t", outcome="y", num_workers=k)
    warm_s = time.perf_counter() - t0
    timings = {}
    t0 = time.perf_counter()
    model = fs.fit(causal(n_estimators), df, features=FEATURES, treatment="t", outcome="y", num_workers=k,
                   timings=timings)
    seconds = time.perf_counter() - t0
    return seconds, timings, warm_s, model.predict(probe)


def breakdown_rows(seconds, timings, mpi_fit):
    """Markdown rows: where forest.spark.fit's seconds went, along rank 0 (whose model ends the stage)."""
    d, ranks = timings["driver"], timings["ranks"]
    r0 = ranks[0]
    warm = all(r["worker_tasks"] > 0 for r in ranks)
    rows = [
        ("driver: plan, estimator bytes (`prepare`)", d["prepare"]),
        ("stage submitted -> rank 0's task running (`task_start`; Python workers "
         + ("reused from the warm-up" if warm else "**fresh interpreters**") + ")", d["task_start"][0]),
        ("task: Arrow batches in (`read`)", r0["read"]),
        ("task: batches -> one pandas frame (`frame`)", r0["frame"]),
        ("task: listener + BarrierTaskContext.allGather (`rendezvous`, waits for the last rank)", r0["rendezvous"]),
        ("task: socket mesh (`connect`)", r0["connect"]),
        (f"task: estimator.fit over the sockets (`fit`; {r0['numba_threads']} Numba thread per rank; "
         f"slowest rank {max(r['fit'] for r in ranks):.2f})", r0["fit"]),
        (f"rank 0: model -> bytes (`dumps`, {r0['model_bytes'] / 1e6:.0f} MB)", r0["dumps"]),
        (f"rank 0: bytes -> driver (`send`, via {r0.get('via')})", r0["send"]),
        ("last task's end -> driver has the stage's rows (`back`)", d["back"]),
        ("driver: model from the bytes (`loads`)", d["loads"]),
    ]
    out = [f"| {name} | {sec:.2f} | {sec / mpi_fit:.3f} |" for name, sec in rows]
    accounted = sum(sec for _, sec in rows)
    out.append(f"| rest (between stages, clocks' resolution) | {seconds - accounted:.2f} | "
               f"{(seconds - accounted) / mpi_fit:.3f} |")
    out.append(f"| **forest.spark.fit, driver wall** | **{seconds:.2f}** | **{seconds / mpi_fit:.3f}** |")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=3, help="K: Spark tasks = mpirun ranks")
    ap.add_argument("--check-rows", type=int, default=200_000, help="0 skips the equality check")
    ap.add_argument("--time-rows", type=int, default=1_000_000, help="0 skips the timing")
    ap.add_argument("--trees", type=int, default=32, help="causal forest trees")
    ap.add_argument("--repeat", type=int, default=1, help="alternate Spark and mpirun this many times")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--mpi-worker", help=argparse.SUPPRESS)
    ap.add_argument("--socket-fit", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mpi_worker:
        mpi_worker(args.time_rows, args.trees, args.mpi_worker, args.socket_fit)
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
        df, stage_s = staged_frame(spark, k, args.time_rows)
        probe = make_rows(args.time_rows)[FEATURES].iloc[:1000]  # the rows mpi_worker predicts
        runs = []
        for i in range(args.repeat):
            spark_s, timings, warm, spark_pred = time_spark(spark, df, k, args.trees, probe)
            mpi_fit, mpi_wall, mpi_pred, sock_fit = time_mpirun(k, args.time_rows, args.trees, socket_fit=True)
            same = float(np.abs(spark_pred - mpi_pred).max())
            runs.append((spark_s, timings, warm, mpi_fit, mpi_wall, same, os.getloadavg()[0], sock_fit))
            print(f"run {i + 1}: spark {spark_s:.1f} s ({spark_s / mpi_fit:.2f}x), mpirun fit {mpi_fit:.1f} s "
                  f"(socket transport {sock_fit:.1f} s; job {mpi_wall:.1f} s); max |diff| {same:.3g}; "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            print(json.dumps(timings, indent=1), flush=True)
        df.unpersist()
        spark.stop()
        lines += [f"#### Fit time: forest.spark.fit under local[{k}] vs mpirun -np {k}, {args.time_rows:,} rows, "
                  f"{args.trees}-tree CausalForest", "",
                  f"Data staged before any clock: Spark {stage_s:.1f} s (generate the blocks in the workers, "
                  "cache); mpirun generates them in each rank before its warm-up. Runs alternate "
                  "(Spark, then mpirun).", "",
                  "| run | mpirun: slowest rank's fit() over MPI (s) | the same ranks, same fit over sockets (s) "
                  "| mpirun: whole job (s) | forest.spark.fit (s) | Spark / mpirun fit | Spark: slowest task's fit (s) "
                  "| Spark warm-up fit (s) | load (1 min) after | max abs diff of predictions |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for i, (spark_s, timings, warm, mpi_fit, mpi_wall, same, load, sock_fit) in enumerate(runs):
            lines.append(f"| {i + 1} | {mpi_fit:.1f} | {sock_fit:.1f} | {mpi_wall:.1f} | {spark_s:.1f} "
                         f"| **{spark_s / mpi_fit:.2f}** | {max(r['fit'] for r in timings['ranks']):.1f} | {warm:.1f} "
                         f"| {load:.1f} | {same:.3g} |")
        best = min(range(len(runs)), key=lambda i: runs[i][0] / runs[i][3])
        spark_s, timings, _, mpi_fit = runs[best][:4]
        lines += ["", f"Where forest.spark.fit's time went (run {best + 1}; seconds, and as a fraction of "
                  "mpirun's fit):", "", "| stage | seconds | / mpirun fit |", "|---|---|---|"]
        lines += breakdown_rows(spark_s, timings, mpi_fit)
        lines.append("")
    body = "\n".join(lines)
    print(body)
    if not args.no_write and body:
        write_results_section(SECTION, body, title=f"forest.spark (K = {k})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

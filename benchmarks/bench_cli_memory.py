"""Peak memory of ``forest-train`` on parquet (issue 6: streaming binning).

``forest-train`` bins each row group as it reads it, so a rank never holds its
features as one float64 block. This benchmark trains the same gradient-boosting
model on the HIGGS-like parquet file three ways and reports each process's peak
resident memory (``ru_maxrss``) and the wall time:

* ``forest-train`` under ``mpirun -np 1`` and ``-np 2`` (1 thread per rank);
* the in-memory route a user of the Python API takes: read the parquet file into a
  float64 matrix with pyarrow, then ``GBDTClassifier().fit(X, y)``.

Usage::

    .venv/bin/python benchmarks/bench_cli_memory.py            # 1M x 28, 20 trees
    .venv/bin/python benchmarks/bench_cli_memory.py --quick    # 100k rows

The table goes to ``benchmarks/RESULTS.md`` (section "CLI memory").
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402
import datasets  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
VENV_BIN = os.path.dirname(sys.executable)

#: Runs inside each process: the tool or the in-memory fit, then this process's peak RSS.
_CHILD = r"""
import json, os, resource, sys, time
mode, out = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
if mode in ("cli", "predict"):
    from forest.cli import predict, train
    code = (train if mode == "cli" else predict).main(sys.argv[3:])
    rank = int(os.environ.get("PMI_RANK", "0"))
else:
    import numpy as np
    import pyarrow.parquet as pq
    from forest.estimators.gbdt import GBDTClassifier
    path, trees = sys.argv[3], int(sys.argv[4])
    table = pq.read_table(path)
    names = [c for c in table.column_names if c != "label"]
    X = np.column_stack([table[c].to_numpy() for c in names])
    y = table["label"].to_numpy()
    del table
    GBDTClassifier(n_estimators=trees, max_leaf_nodes=31, early_stopping=False, random_state=0).fit(X, y)
    code, rank = 0, 0
wall = time.perf_counter() - t0
peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
with open(f"{out}.{rank}", "w") as f:
    json.dump({"rank": rank, "code": code, "wall_s": wall, "peak_mb": peak_mb}, f)
"""


def parquet_path(n_rows, group_rows=65_536):
    """Write (once) the HIGGS-like training rows as parquet: f0..f27 and label."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(_harness.OUT_DIR, f"higgs_train{n_rows}.parquet")
    if not os.path.exists(path):
        paths = datasets.higgs_like(n_rows)
        X = np.load(paths["X_train"], mmap_mode="r")
        y = np.load(paths["y_train"])
        cols = {f"f{j}": np.ascontiguousarray(X[:, j]) for j in range(X.shape[1])}
        cols["label"] = y.astype(np.int64)
        tmp = path + ".tmp"
        pq.write_table(pa.table(cols), tmp, row_group_size=group_rows)
        os.replace(tmp, path)
    return path


def run(mode, args, np_=1):
    """One measured run; returns a list of per-rank dicts (``stderr``: the tool's last lines).

    ``mode``: ``"cli"`` (forest-train), ``"predict"`` (forest-predict), both under
    ``mpirun -np np_``, or ``"memory"`` (the in-memory fit, one process).
    """
    env = _harness.thread_env(1)
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rss")
        base = [sys.executable, "-c", _CHILD, mode, out] + args
        cmd = ([os.path.join(VENV_BIN, "mpirun"), "-np", str(np_)] + base) if mode != "memory" else base
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"{mode} -np {np_} failed: {proc.stderr[-2000:]}")
        ranks = []
        for r in range(np_):
            with open(f"{out}.{r}") as f:
                ranks.append(json.load(f))
    for r in ranks:
        r["launcher_wall_s"] = wall
        r["stderr"] = proc.stderr[-2000:]
    return ranks


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--trees", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="100k rows")
    p.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    a = p.parse_args(argv)
    if a.quick:
        a.rows = 100_000
    path = parquet_path(a.rows)
    n_features = 28
    model = os.path.join(tempfile.gettempdir(), "bench_cli_memory.model")
    cli = [path, "--model", "gbdt-classifier", "--outcome", "label", "--n-estimators", str(a.trees),
           "--max-leaf-nodes", "31", "--param", "early_stopping=False", "--random-state", "0", "--out", model,
           "--no-progress"]
    rows = []
    for label, mode, np_, args in (("forest-train, mpirun -np 1", "cli", 1, cli),
                                   ("forest-train, mpirun -np 2", "cli", 2, cli),
                                   ("pyarrow -> float64 X -> GBDTClassifier.fit", "memory", 1, [path, str(a.trees)])):
        ranks = run(mode, args, np_)
        per_rank_rows = a.rows / np_
        rows.append([label, f"{max(r['peak_mb'] for r in ranks):,.0f}",
                     f"{per_rank_rows * n_features * 8 / 2**20:,.0f}", f"{per_rank_rows * n_features / 2**20:,.0f}",
                     _harness.fmt(max(r["wall_s"] for r in ranks))])
        print(rows[-1], flush=True)
    headers = ["run", "peak RSS MiB (max over ranks)", "a rank's features as float64, MiB",
               "as uint8 codes, MiB", "wall s (in process)"]
    body = (f"HIGGS-like training rows as parquet ({a.rows:,} x {n_features}, row groups of 65,536), "
            f"GBDTClassifier {a.trees} trees, 31 leaves, no early stopping, 1 thread per process. "
            "Peak RSS is each process's ru_maxrss (Python, Numba, MPI and the model included).\n\n"
            + _harness.markdown_table(headers, rows))
    print(body)
    if not a.no_write:
        _harness.write_results_section("CLI memory (issue 6): streaming binning", body)


if __name__ == "__main__":
    main()

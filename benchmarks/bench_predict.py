"""Prediction benchmark (issue 18): batch scoring against EconML and LightGBM.

Parts (each contender in its own process, 2 threads unless said; anchors measured in
the same run):

1. ``causal``: a CausalForest of 200 trees fitted on 20,000 rows of the Wager-Athey
   design (:func:`datasets.wager_athey`, d = 20), fitted once and saved under
   ``benchmarks/out/``. histforest: ``predict`` on 1,000,000 rows,
   ``predict_interval`` on 200,000 rows, single-row latency (median of many
   ``predict`` calls on one row); the same walk on rows that stay in cache (the
   cache-resident rate, as ``bench_histogram`` reports it) and the per-row walk that
   preceded the batch walk (on fewer rows). EconML ``grf.CausalForest`` (same trees,
   leaf size, subsample, honesty, mtry; ``inference=True`` for its intervals): the
   same three tasks. LightGBM random-forest mode with as many leaves per tree as our
   trees have on average: ``predict`` on the same 1M rows, its per-(row, tree) rate.
   Rates: ns per (row, tree) = wall time x threads / (rows x trees), and per (row,
   tree, level) dividing by the mean depth of the leaves the rows reach.
   Targets: predict >= 3x EconML and at least LightGBM's per-(row, tree) rate;
   intervals >= 2x EconML; one row <= 1 ms.
2. ``gbdt``: the ``bench_gbdt`` model (HIGGS-like, 100 trees, 31 leaves, lr 0.1;
   ``--gbdt-n-train`` rows) fitted by histforest and by LightGBM; ``predict_proba`` /
   ``predict`` on the 100,000 test rows. Target: within 1.2x of LightGBM.
3. ``cli``: ``forest-predict`` on a parquet file of ``--cli-rows`` rows (row groups of
   65,536; the part-1 model) under ``mpirun -np 1`` and ``-np 2`` (1 thread per rank):
   rows per second as the tool reports it and each rank's peak RSS (``ru_maxrss``).
   At 10M rows the file is about 1.7 GB and the float features 1.6 GB: a flat peak
   shows the tool streams.

Usage::

    .venv-bench/bin/python benchmarks/bench_predict.py                      # all parts, writes RESULTS.md
    .venv-bench/bin/python benchmarks/bench_predict.py --quick              # smoke run, prints only
    .venv-bench/bin/python benchmarks/bench_predict.py --parts cli --cli-rows 10000000

The functions named ``contender_*`` run inside the worker processes.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402
import datasets  # noqa: E402

SECTION = "Prediction (issue 18)"
THIS = os.path.abspath(__file__)
N_FEATURES = 20
CAUSAL_CFG = {"n_estimators": 200, "min_samples_leaf": 5, "max_samples": 0.5, "honest": True, "mtry": None,
              "seed": 0, "ci_group_size": 2}


# --------------------------------------------------------------------------- data and the model

def score_rows(n, d=N_FEATURES, seed=1):
    """Rows to score: ``U[0,1]^d`` (the design's feature distribution), cached as .npy."""
    path = os.path.join(datasets.OUT_DIR, f"score_d{d}_n{n}_s{seed}.npy")
    if not os.path.exists(path):
        os.makedirs(datasets.OUT_DIR, exist_ok=True)
        X = np.empty((n, d))
        for c, start in enumerate(range(0, n, datasets.CHUNK)):
            stop = min(n, start + datasets.CHUNK)
            X[start:stop] = datasets._chunk_rng(seed, c).uniform(size=(stop - start, d))
        datasets._save(path, X)
    return path


def model_path(n_train):
    return os.path.join(datasets.OUT_DIR, f"predict_cf_n{n_train}_t{CAUSAL_CFG['n_estimators']}.model")


def contender_prepare(n_train, threads, **_):
    """Fit (once) and save the histforest CausalForest every other part loads."""
    import bench_causal
    from forest.io import model_io

    path = model_path(n_train)
    if not os.path.exists(path):
        data = datasets.wager_athey(n_train, d=N_FEATURES, seed=0)
        model, fit_s = bench_causal._ours_fit(data["X"], data["t"], data["y"], CAUSAL_CFG)
        names = [f"x{j}" for j in range(N_FEATURES)]
        model_io.save(model, path + ".tmp", metadata={"feature_names": names})
        os.replace(path + ".tmp", path)
    return {"model": path}


def _best(fn, repeat):
    """(result, best wall seconds) over ``repeat`` calls."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return out, best


def _latency(fn, X, calls):
    """Median wall seconds of ``fn`` on one row (after one untimed call)."""
    fn(X[:1])
    times = []
    for i in range(calls):
        t0 = time.perf_counter()
        fn(X[i % len(X): i % len(X) + 1])
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _mean_leaf_depth(model, X):
    """Mean depth of the leaves rows of ``X`` reach in our forest (levels walked per tree)."""
    from forest.engine.predictor import predict_leaves

    packed = model.estimators_
    leaves = predict_leaves(packed, X).astype(np.int64) + packed["tree_offsets"][:-1]
    return float(packed["depth"][leaves].mean())


# --------------------------------------------------------------------------- contenders (worker side)

def contender_ours_causal(n_train, n_predict, n_interval, n_before, repeat, latency_calls, threads, **_):
    from forest.io import model_io
    from forest.engine import predictor

    model = model_io.load(model_path(n_train))
    X = datasets.load_rows(score_rows(n_predict))
    n_trees = len(model.estimators_["tree_offsets"]) - 1
    model.predict(X[:5000])                          # Numba: load the cached kernels (or compile)
    model.predict_interval(X[:5000])
    _, predict_s = _best(lambda: model.predict(X), repeat)
    Xi = X[:n_interval]
    _, interval_s = _best(lambda: model.predict_interval(Xi), repeat)
    latency_s = _latency(model.predict, X, latency_calls)
    small = np.ascontiguousarray(X[:16_384])          # 2.6 MB of rows: with the forest, all in L2/L3
    reps = max(1, n_predict // (8 * len(small)))
    _, resident_s = _best(lambda: [model.predict(small) for _ in range(reps)], repeat)
    Xb = X[:n_before]
    real = predictor.batch_worthwhile
    predictor.batch_worthwhile = lambda *a: False   # the per-row walk of the code before batching
    try:
        _, before_s = _best(lambda: model.predict(Xb), 1)
    finally:
        predictor.batch_worthwhile = real
    depth = _mean_leaf_depth(model, X[:20_000])
    leaves = float((model.estimators_["feature"] < 0).sum() / n_trees)
    cells = n_predict * n_trees
    return {"predict_s": predict_s, "interval_s": interval_s, "latency_s": latency_s,
            "ns_row_tree": predict_s * threads / cells * 1e9,
            "ns_row_tree_level": predict_s * threads / cells / depth * 1e9,
            "resident_ns_row_tree": resident_s * threads / (reps * len(small) * n_trees) * 1e9,
            "before_ns_row_tree": before_s * threads / (n_before * n_trees) * 1e9,
            "mean_depth": depth, "mean_leaves": leaves, "n_trees": n_trees, "metrics": {}}


def contender_econml_causal(n_train, n_predict, n_interval, repeat, latency_calls, threads, **_):
    from econml.grf import CausalForest

    data = datasets.wager_athey(n_train, d=N_FEATURES, seed=0)
    d = N_FEATURES
    model = CausalForest(n_estimators=CAUSAL_CFG["n_estimators"], min_samples_leaf=CAUSAL_CFG["min_samples_leaf"],
                         max_samples=CAUSAL_CFG["max_samples"], honest=CAUSAL_CFG["honest"],
                         max_features=min(int(np.ceil(np.sqrt(d) + 20)), d), n_jobs=threads,
                         random_state=CAUSAL_CFG["seed"], inference=True)
    model.fit(data["X"], data["t"], data["y"])
    X = datasets.load_rows(score_rows(n_predict))
    model.predict(X[:1000])
    _, predict_s = _best(lambda: model.predict(X), repeat)
    Xi = X[:n_interval]
    _, interval_s = _best(lambda: model.predict_interval(Xi, alpha=0.05), repeat)
    latency_s = _latency(model.predict, X, max(5, latency_calls // 20))
    n_trees = len(model.estimators_)
    return {"predict_s": predict_s, "interval_s": interval_s, "latency_s": latency_s,
            "ns_row_tree": predict_s * threads / (n_predict * n_trees) * 1e9, "metrics": {}}


def _lightgbm_leaf_depths(booster):
    """Per tree, the depth of each leaf by LightGBM's leaf index."""
    out = []
    for info in booster.dump_model()["tree_info"]:
        depths = {}
        stack = [(info["tree_structure"], 0)]
        while stack:
            node, depth = stack.pop()
            if "leaf_index" in node:
                depths[node["leaf_index"]] = depth
            elif "left_child" in node:
                stack += [(node["left_child"], depth + 1), (node["right_child"], depth + 1)]
            else:                                    # a single-leaf tree
                depths[0] = 0
        out.append(np.array([depths[i] for i in range(len(depths))]))
    return out


def contender_lightgbm_rf(n_train, n_predict, num_leaves, repeat, threads, **_):
    import anchors

    data = datasets.wager_athey(n_train, d=N_FEATURES, seed=0)
    params, n_trees = anchors.lightgbm_rf_params(threads=threads, n_trees=CAUSAL_CFG["n_estimators"],
                                                 num_leaves=int(round(num_leaves)),
                                                 bagging_fraction=CAUSAL_CFG["max_samples"],
                                                 min_data_in_leaf=CAUSAL_CFG["min_samples_leaf"],
                                                 seed=CAUSAL_CFG["seed"])
    booster, _ = anchors.lightgbm_fit(data["X"], data["y"], params, n_trees)
    X = datasets.load_rows(score_rows(n_predict))
    booster.predict(X[:1000])
    _, predict_s = _best(lambda: booster.predict(X), repeat)
    leaf = booster.predict(X[:20_000], pred_leaf=True)
    depths = _lightgbm_leaf_depths(booster)
    depth = float(np.mean([depths[t][leaf[:, t]] for t in range(leaf.shape[1])]))
    leaves = float(np.mean([len(d) for d in depths]))
    cells = n_predict * booster.num_trees()
    return {"predict_s": predict_s, "ns_row_tree": predict_s * threads / cells * 1e9,
            "ns_row_tree_level": predict_s * threads / cells / depth * 1e9, "mean_depth": depth,
            "mean_leaves": leaves, "metrics": {}}


def contender_ours_gbdt(n_train, seed, repeat, threads, cfg, **_):
    import bench_gbdt
    from native.comm import SelfCommunicator

    bench_gbdt._warm_numba(threads, cfg)
    X, y, paths = bench_gbdt._load(n_train, seed)
    model, _ = bench_gbdt._ours_fit(X, y, SelfCommunicator(), threads, cfg)
    del X, y
    Xt, _ = bench_gbdt._load_test(paths)
    model.predict_proba(Xt[:1000])
    _, predict_s = _best(lambda: model.predict_proba(Xt), repeat)
    return {"predict_s": predict_s, "rows": len(Xt), "metrics": {}}


def contender_lightgbm_gbdt(n_train, seed, repeat, threads, cfg, **_):
    import anchors
    import bench_gbdt

    X, y, paths = bench_gbdt._load(n_train, seed)
    params, n_trees = anchors.lightgbm_gbdt_params(threads, cfg["n_trees"], cfg["num_leaves"], cfg["max_bins"],
                                                   cfg["learning_rate"], cfg["min_leaf"], cfg["seed"])
    booster, _ = anchors.lightgbm_fit(X, y, params, n_trees)
    del X, y
    Xt, _ = bench_gbdt._load_test(paths)
    booster.predict(Xt[:1000])
    _, predict_s = _best(lambda: booster.predict(Xt), repeat)
    return {"predict_s": predict_s, "rows": len(Xt), "metrics": {}}


# --------------------------------------------------------------------------- forest-predict (cli part)

def cli_parquet(n_rows, group_rows=65_536):
    """Write (once) ``n_rows`` rows to score as parquet: ``id`` and ``x0 .. x19``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = os.path.join(datasets.OUT_DIR, f"score_d{N_FEATURES}_n{n_rows}.parquet")
    if os.path.exists(path):
        return path
    os.makedirs(datasets.OUT_DIR, exist_ok=True)
    names = [f"x{j}" for j in range(N_FEATURES)]
    schema = pa.schema([("id", pa.int64())] + [(n, pa.float64()) for n in names])
    tmp = path + ".tmp"
    with pq.ParquetWriter(tmp, schema) as writer:
        for c, start in enumerate(range(0, n_rows, group_rows)):
            stop = min(n_rows, start + group_rows)
            X = datasets._chunk_rng(7, c).uniform(size=(stop - start, N_FEATURES))
            cols = {"id": np.arange(start, stop, dtype=np.int64)}
            cols.update({n: X[:, j] for j, n in enumerate(names)})
            writer.write_table(pa.table(cols, schema=schema))
    os.replace(tmp, path)
    return path


def run_cli(np_, model, data, interval):
    """One forest-predict run under mpirun (:func:`bench_cli_memory.run`); per-rank dicts and
    the tool's report line."""
    import bench_cli_memory

    with tempfile.TemporaryDirectory() as tmp:
        args = [model, data, "--keep", "id", "--out", os.path.join(tmp, "pred.parquet")]
        ranks = bench_cli_memory.run("predict", args + (["--interval"] if interval else []), np_)
    line = next((ln for ln in ranks[0]["stderr"].splitlines() if "wrote" in ln), "")
    return ranks, line


# --------------------------------------------------------------------------- tables (driver side)

def _ok(r):
    return r is not None and r.get("status") == "ok"


def _get(r, key):
    return r.get(key) if _ok(r) else None


def _ratio(a, b):
    return a / b if a and b else None


def causal_table(ours, econ, lgb, n_predict, n_interval, threads):
    rows = [
        [f"`predict`, {n_predict:,} rows (s)", _get(ours, "predict_s"), _get(econ, "predict_s"),
         _get(lgb, "predict_s"), _ratio(_get(econ, "predict_s"), _get(ours, "predict_s")), ">= 3x EconML"],
        ["ns per (row, tree)", _get(ours, "ns_row_tree"), _get(econ, "ns_row_tree"), _get(lgb, "ns_row_tree"),
         _ratio(_get(lgb, "ns_row_tree"), _get(ours, "ns_row_tree")), ">= 1x LightGBM"],
        ["ns per (row, tree, level)", _get(ours, "ns_row_tree_level"), None, _get(lgb, "ns_row_tree_level"),
         _ratio(_get(lgb, "ns_row_tree_level"), _get(ours, "ns_row_tree_level")), "-"],
        ["mean leaves per tree / mean depth reached",
         f"{_get(ours, 'mean_leaves') or 0:.0f} / {_get(ours, 'mean_depth') or 0:.1f}", None,
         f"{_get(lgb, 'mean_leaves') or 0:.0f} / {_get(lgb, 'mean_depth') or 0:.1f}", None, "-"],
        [f"`predict_interval`, {n_interval:,} rows (s)", _get(ours, "interval_s"), _get(econ, "interval_s"), None,
         _ratio(_get(econ, "interval_s"), _get(ours, "interval_s")), ">= 2x EconML"],
        ["`predict`, one row (ms)", (_get(ours, "latency_s") or 0) * 1e3 or None,
         (_get(econ, "latency_s") or 0) * 1e3 or None, None,
         _ratio(_get(econ, "latency_s"), _get(ours, "latency_s")), "<= 1 ms"],
    ]
    headers = ["task", "histforest", "EconML grf.CausalForest", "LightGBM rf", "speed-up vs anchor", "target"]
    table = _harness.markdown_table(headers, rows)
    notes = []
    if _ok(ours):
        full, resident, before = ours["ns_row_tree"], ours["resident_ns_row_tree"], ours["before_ns_row_tree"]
        notes.append(
            f"What bounds it: the full-size rate is {100 * resident / full:.0f} % of the cache-resident rate "
            f"({resident:.1f} ns per (row, tree) on 16,384 rows predicted over and over, forest and rows in "
            f"L2/L3), and the rows are read once per block of 1,024 rows for all {ours['n_trees']} trees "
            f"({N_FEATURES * 8} bytes per row: {N_FEATURES * 8 / (full * ours['n_trees'] / threads):.2f} GB/s "
            "per thread), so the walk is bounded by its own dependent loads and instructions per level, not by "
            f"memory bandwidth. The per-row walk it replaces: {before:.1f} ns per (row, tree) "
            f"({before / full:.1f}x the batch walk), all rates x {threads} threads.")
    return table, notes


def gbdt_table(ours, lgb, n_train):
    rows = [[f"`predict_proba`, {_get(ours, 'rows') or 0:,} rows (s)", _get(ours, "predict_s"),
             _get(lgb, "predict_s"), _ratio(_get(ours, "predict_s"), _get(lgb, "predict_s")), "<= 1.2x LightGBM"]]
    return _harness.markdown_table(["task", "histforest GBDT", "LightGBM", "time ratio", "target"], rows)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 100k / 20k rows, prints only")
    p.add_argument("--parts", default="causal,gbdt,cli", help="comma list among causal,gbdt,cli")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3, help="timed calls per measurement; the best is kept")
    p.add_argument("--n-train", type=int, default=20_000, help="causal forest training rows")
    p.add_argument("--n-predict", type=int, default=None, help="rows for predict (default 1,000,000)")
    p.add_argument("--n-interval", type=int, default=None, help="rows for predict_interval (default 200,000)")
    p.add_argument("--gbdt-n-train", type=int, default=None, help="bench_gbdt training rows (default 1,000,000)")
    p.add_argument("--cli-rows", type=int, default=None, help="forest-predict rows (default 10,000,000)")
    p.add_argument("--cli-interval", action="store_true", help="forest-predict with --interval")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--write", dest="write", action="store_true", default=None)
    p.add_argument("--no-write", dest="write", action="store_false")
    a = p.parse_args(argv)
    a.n_predict = a.n_predict or (100_000 if a.quick else 1_000_000)
    a.n_interval = a.n_interval or (20_000 if a.quick else 200_000)
    a.gbdt_n_train = a.gbdt_n_train or (100_000 if a.quick else 1_000_000)
    a.cli_rows = a.cli_rows or (200_000 if a.quick else 10_000_000)
    if a.write is None:
        a.write = not a.quick
    return a


def main(argv=None):
    a = parse_args(argv)
    parts = set(a.parts.split(","))
    run = lambda name, fn, kw, **o: _harness.run_contender(name, THIS, fn, kw, timeout=a.timeout, **o)
    body = []
    if parts & {"causal", "cli"}:
        prep = run("fit the histforest model", "contender_prepare", {"n_train": a.n_train}, threads=a.threads)
        if not _ok(prep):
            print(prep.get("log_tail", ""), file=sys.stderr)
            return 1
    if "causal" in parts:
        score_rows(a.n_predict)
        kw = {"n_train": a.n_train, "n_predict": a.n_predict, "n_interval": a.n_interval,
              "n_before": min(a.n_predict, 50_000), "repeat": a.repeat, "latency_calls": 400}
        ours = run("histforest CausalForest", "contender_ours_causal", kw, threads=a.threads)
        econ = run("EconML grf.CausalForest", "contender_econml_causal", kw, threads=a.threads)
        leaves = _get(ours, "mean_leaves") or 300
        lgb = run("LightGBM rf", "contender_lightgbm_rf", dict(kw, num_leaves=leaves), threads=a.threads)
        table, notes = causal_table(ours, econ, lgb, a.n_predict, a.n_interval, a.threads)
        body += [f"CausalForest of {CAUSAL_CFG['n_estimators']} trees fitted on {a.n_train:,} rows of the "
                 f"Wager-Athey design (d = {N_FEATURES}, min 5 rows per leaf, subsample 0.5, honest); rows "
                 f"to score U[0,1]^{N_FEATURES}; {a.threads} threads per contender, each in its own process, "
                 f"best of {a.repeat} calls. LightGBM rf: same trees and subsample, num_leaves = our mean "
                 "leaf count, fitted on the raw outcome (a prediction-rate reference only).", "", table, ""]
        body += notes
        body += [f"- {r['name']}: {r['status']}" for r in (ours, econ, lgb) if not _ok(r)]
    if "gbdt" in parts:
        cfg = {"n_trees": 100, "num_leaves": 31, "max_bins": 255, "learning_rate": 0.1, "min_leaf": 20, "seed": 0}
        datasets.higgs_like(a.gbdt_n_train, 0)
        kw = {"n_train": a.gbdt_n_train, "seed": 0, "cfg": cfg, "repeat": a.repeat}
        ours = run("histforest GBDT", "contender_ours_gbdt", kw, threads=a.threads)
        lgb = run("LightGBM GBDT", "contender_lightgbm_gbdt", kw, threads=a.threads)
        body += ["", f"GBDT: the bench_gbdt model ({a.gbdt_n_train:,} HIGGS-like training rows, 100 trees, "
                 f"31 leaves), {a.threads} threads, best of {a.repeat}.", "", gbdt_table(ours, lgb, a.gbdt_n_train)]
        body += [f"- {r['name']}: {r['status']}" for r in (ours, lgb) if not _ok(r)]
    if "cli" in parts:
        data = cli_parquet(a.cli_rows)
        rows = []
        for np_ in (1, 2):
            ranks, line = run_cli(np_, model_path(a.n_train), data, a.cli_interval)
            rate = line.split("(", 2)[-1].rstrip(")") if line else "-"
            rows.append([f"mpirun -np {np_}", max(r["peak_mb"] for r in ranks), max(r["wall_s"] for r in ranks),
                         rate])
            print(rows[-1], flush=True)
        body += ["", f"`forest-predict` on {a.cli_rows:,} rows x {N_FEATURES} float64 features (parquet, row "
                 f"groups of 65,536; {'with' if a.cli_interval else 'without'} --interval), 1 thread per rank. "
                 f"The float features alone are {a.cli_rows * N_FEATURES * 8 / 2 ** 20:,.0f} MiB.", "",
                 _harness.markdown_table(["run", "peak RSS per rank, MiB (max)", "wall s", "tool's report"], rows)]
    text = "\n".join(body).strip()
    print("\n" + text)
    if a.write:
        _harness.write_results_section(SECTION, text, title=f"{'Quick' if a.quick else 'Full'} run")
        print(f"\nwritten to {_harness.RESULTS_PATH} under '## {SECTION}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())

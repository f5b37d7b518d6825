"""Gradient boosting benchmark (issue 4): histforest's GBDTClassifier against the anchors.

Binary classification on the HIGGS-like set (:func:`datasets.higgs_like`): 1M training
rows x 28 features, 100k test rows; 100 trees, 31 leaves, 255 value bins, learning
rate 0.1, 2 threads. Side by side in one run, each contender in its own process:
histforest ``forest.estimators.gbdt.GBDTClassifier``, LightGBM, XGBoost ``hist`` (lossguide) and
scikit-learn ``HistGradientBoostingClassifier``. Reported: fit and predict time, peak
RSS of the process, test AUC, and ratios (time vs the fastest anchor, AUC vs the best
anchor, RSS vs LightGBM).

Distributed part: the same fit under ``mpirun -np 2`` with one thread per rank (each
rank mmaps only its block of rows) against ``-np 1`` with one thread; and LightGBM's
socket data-parallel learner with two local processes of one thread each.

Quantized training (issue 16): "histforest GBDT quantized" is the same contender with
``quantized=True`` (4 gradient levels) in the same table, and under ``mpirun -np 2`` the
histogram allreduces of both modes are traced (``native.stats``): calls, buffer bytes per
call and bytes sent per rank, float vs quantized.

Usage::

    .venv-bench/bin/python benchmarks/bench_gbdt.py            # full size, writes RESULTS.md
    .venv-bench/bin/python benchmarks/bench_gbdt.py --quick    # 100k rows smoke run
    .venv/bin/python benchmarks/bench_gbdt.py --only ours,ours-q,mpi,mpi-q --no-write   # ours only

The functions named ``contender_*`` run inside the worker processes.
"""
import argparse
import inspect
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402
import datasets  # noqa: E402

SECTION = "Gradient boosting (issue 4)"
THIS = os.path.abspath(__file__)


# --------------------------------------------------------------------------- helpers

def _auc(y, score):
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, score))


def _load(n_train, seed, rank=0, size=1):
    paths = datasets.higgs_paths(n_train, seed)
    X = datasets.load_rows(paths["X_train"], rank, size)
    y = datasets.load_rows(paths["y_train"], rank, size)
    return X, y, paths


def _load_test(paths):
    return np.load(paths["X_test"]), np.load(paths["y_test"])


def ours_params(cls, threads, n_trees, num_leaves, max_bins, learning_rate, min_leaf, seed):
    """Map the benchmark settings onto GBDTClassifier's parameter names.

    The estimator is written concurrently with this benchmark, so the mapping accepts
    the common spellings (scikit-learn's and LightGBM's) and raises if a setting cannot
    be expressed, rather than silently benchmarking a different model.
    """
    names = set(inspect.signature(cls.__init__).parameters) - {"self"}
    wanted = [
        (("n_estimators", "max_iter", "n_trees", "num_boost_round"), int(n_trees)),
        (("max_leaf_nodes", "num_leaves", "max_leaves"), int(num_leaves)),
        (("max_bins", "max_bin", "n_bins"), int(max_bins)),
        (("learning_rate", "eta"), float(learning_rate)),
    ]
    optional = [
        (("min_samples_leaf", "min_data_in_leaf", "min_child_samples"), int(min_leaf)),
        (("random_state", "seed"), int(seed)),
        (("n_threads", "n_jobs", "num_threads"), int(threads)),
        (("early_stopping",), False),
        (("max_depth",), None),
    ]
    params = {}
    for aliases, value in wanted:
        hit = next((a for a in aliases if a in names), None)
        if hit is None:
            raise ValueError(f"{cls.__name__} has none of the parameters {aliases}")
        params[hit] = value
    for aliases, value in optional:
        hit = next((a for a in aliases if a in names), None)
        if hit is not None:
            params[hit] = value
    return params


def _ours_fit(X, y, comm, threads, cfg):
    from forest.estimators.gbdt import GBDTClassifier

    model = GBDTClassifier(**ours_params(GBDTClassifier, threads, cfg["n_trees"], cfg["num_leaves"],
                                         cfg["max_bins"], cfg["learning_rate"], cfg["min_leaf"],
                                         cfg["seed"]))
    if cfg.get("quantized"):
        model.set_params(quantized=True)
    start = time.perf_counter()
    model.fit(X, y, comm=comm)
    return model, time.perf_counter() - start


def _ours_predict(model, X):
    start = time.perf_counter()
    proba = model.predict_proba(X)[:, 1]
    return proba, time.perf_counter() - start


def _warm_numba(threads, cfg):
    """Fit a tiny model first so Numba compilation (cached on disk after the first
    process) is not billed to the timed fit; the cold start is reported separately."""
    from native.comm import SelfCommunicator

    # Enough rows for every multi-threaded kernel the timed fit reaches (histograms,
    # quantization and prediction switch above 16,384 rows, the partition above
    # forest.engine.partition._PARALLEL_MIN_ROWS = 262,144): a warm-up on a few thousand rows
    # compiled only the serial ones, and on a cold cache the timed fit paid the rest.
    rng = np.random.default_rng(1)
    n_warm = 300_000
    Xw = rng.normal(size=(n_warm, 4))
    yw = (Xw[:, 0] + rng.normal(size=n_warm) > 0).astype(np.float64)
    small = dict(cfg, n_trees=2, num_leaves=4)
    start = time.perf_counter()
    model, _ = _ours_fit(Xw, yw, SelfCommunicator(), threads, small)
    _ours_predict(model, Xw)
    return time.perf_counter() - start


#: Allreduces of at least this many buffer bytes are histogram ones (the others carry a
#: few scalars: totals, validation losses, quantization maxima, refit leaf sums).
HIST_MIN_BYTES = 4096


def _hist_traffic(events):
    """Histogram allreduces of a traced fit: calls, buffer bytes per call, bytes sent."""
    big = [e for e in events if e.op == "allreduce" and e.nbytes >= HIST_MIN_BYTES]
    if not big:
        return None
    return {"calls": len(big), "bytes_per_call": float(np.mean([e.nbytes for e in big])),
            "sent_mb": sum(e.sent for e in big) / 2 ** 20,
            "all_sent_mb": sum(e.sent for e in events) / 2 ** 20}


# --------------------------------------------------------------------------- contenders (worker side)

def contender_ours(n_train, seed, threads, cfg, **_):
    """histforest GBDTClassifier on all rows in one process."""
    from native.comm import SelfCommunicator

    warm_s = _warm_numba(threads, cfg)
    X, y, paths = _load(n_train, seed)
    rss_data = _harness.proc_status_mb("VmRSS")
    model, fit_s = _ours_fit(X, y, SelfCommunicator(), threads, cfg)
    del X, y
    Xt, yt = _load_test(paths)
    proba, predict_s = _ours_predict(model, Xt)
    return {"fit_s": fit_s, "predict_s": predict_s, "warmup_s": warm_s, "rss_data_mb": rss_data,
            "metrics": {"auc": _auc(yt, proba)}}


def contender_ours_mpi(n_train, seed, threads, cfg, **_):
    """histforest GBDTClassifier under mpirun: each rank fits on its block of rows."""
    from native import collectives as col
    from native.comm import world

    comm = world()
    warm_s = _warm_numba(threads, cfg)
    X, y, paths = _load(n_train, seed, comm.rank, comm.size)
    from native.stats import STATS

    comm.barrier()  # start the clock together so fit_s is the collective fit's wall time
    STATS.reset()
    STATS.start_trace()
    model, fit_s = _ours_fit(X, y, comm, threads, cfg)
    events = STATS.stop_trace()
    del X, y
    out = {"fit_s": fit_s, "warmup_s": warm_s, "size": comm.size, "hist_traffic": _hist_traffic(events)}
    if comm.rank == 0:
        Xt, yt = _load_test(paths)
        proba, predict_s = _ours_predict(model, Xt)
        out.update(predict_s=predict_s, metrics={"auc": _auc(yt, proba)})
    col.bcast_object(comm, None)  # keep ranks alive until rank 0 has predicted
    return out


def contender_lightgbm(n_train, seed, threads, cfg, **_):
    import anchors
    import lightgbm  # noqa: F401  (imported before RSS before fit, as ours is)

    X, y, paths = _load(n_train, seed)
    rss_data = _harness.proc_status_mb("VmRSS")
    params, n_trees = anchors.lightgbm_gbdt_params(threads, cfg["n_trees"], cfg["num_leaves"],
                                                   cfg["max_bins"], cfg["learning_rate"],
                                                   cfg["min_leaf"], cfg["seed"])
    booster, fit_s = anchors.lightgbm_fit(X, y, params, n_trees)
    del X, y
    Xt, yt = _load_test(paths)
    proba, predict_s = anchors.lightgbm_predict(booster, Xt)
    return {"fit_s": fit_s, "predict_s": predict_s, "rss_data_mb": rss_data,
            "metrics": {"auc": _auc(yt, proba)}}


def contender_lightgbm_data_parallel(n_train, seed, threads, cfg, rank, size, ports, **_):
    """One of ``size`` LightGBM processes, each holding its block of rows."""
    import anchors

    X, y, paths = _load(n_train, seed, rank, size)
    params, n_trees = anchors.lightgbm_data_parallel_params(
        rank, size, ports, threads=threads, n_trees=cfg["n_trees"], num_leaves=cfg["num_leaves"],
        max_bin=cfg["max_bins"], learning_rate=cfg["learning_rate"],
        min_data_in_leaf=cfg["min_leaf"], seed=cfg["seed"])
    booster, fit_s = anchors.lightgbm_fit(X, y, params, n_trees)
    out = {"fit_s": fit_s, "size": size}
    if rank == 0:
        Xt, yt = _load_test(paths)
        proba, predict_s = anchors.lightgbm_predict(booster, Xt)
        out.update(predict_s=predict_s, metrics={"auc": _auc(yt, proba)})
    return out


def contender_xgboost(n_train, seed, threads, cfg, **_):
    import anchors
    import xgboost  # noqa: F401  (imported before RSS before fit, as ours is)

    X, y, paths = _load(n_train, seed)
    rss_data = _harness.proc_status_mb("VmRSS")
    booster, fit_s = anchors.xgboost_fit(X, y, threads, cfg["n_trees"], cfg["num_leaves"],
                                         cfg["max_bins"] + 1, cfg["learning_rate"], cfg["seed"])
    del X, y
    Xt, yt = _load_test(paths)
    proba, predict_s = anchors.xgboost_predict(booster, Xt, threads)
    return {"fit_s": fit_s, "predict_s": predict_s, "rss_data_mb": rss_data,
            "metrics": {"auc": _auc(yt, proba)}}


def contender_sklearn_hgb(n_train, seed, threads, cfg, **_):
    import anchors
    from sklearn.ensemble import HistGradientBoostingClassifier  # noqa: F401  (as above)

    X, y, paths = _load(n_train, seed)
    rss_data = _harness.proc_status_mb("VmRSS")
    model, fit_s = anchors.sklearn_hgb_fit(X, y, threads, cfg["n_trees"], cfg["num_leaves"],
                                           cfg["max_bins"], cfg["learning_rate"], cfg["min_leaf"],
                                           cfg["seed"])
    del X, y
    Xt, yt = _load_test(paths)
    proba, predict_s = anchors.sklearn_hgb_predict(model, Xt, threads)
    return {"fit_s": fit_s, "predict_s": predict_s, "rss_data_mb": rss_data,
            "metrics": {"auc": _auc(yt, proba)}}


# --------------------------------------------------------------------------- driver

ANCHORS = ("LightGBM", "XGBoost hist", "sklearn HGB")


def _ok(r):
    return r.get("status") == "ok"


def main_table(results):
    """Markdown table of the single-process comparison with ratios to the anchors."""
    anchors = [r for r in results if r["name"] in ANCHORS and _ok(r)]
    fastest = min((r["fit_s"] for r in anchors), default=None)
    best_auc = max((r["metrics"]["auc"] for r in anchors), default=None)
    lgb = next((r for r in anchors if r["name"] == "LightGBM"), None)
    rows = []
    for r in results:
        if not _ok(r):
            rows.append([r["name"], "failed (below)"] + ["-"] * 9)
            continue
        auc = r["metrics"]["auc"]
        rows.append([
            r["name"], "ok", r["fit_s"], r.get("predict_s"), r["peak_rss_mb"],
            r.get("rss_data_mb"),
            r["peak_rss_mb"] - r["rss_data_mb"] if r.get("rss_data_mb") is not None else None,
            auc, r["fit_s"] / fastest if fastest else None,
            auc - best_auc if best_auc is not None else None,
            r["peak_rss_mb"] / lgb["peak_rss_mb"] if lgb else None,
        ])
    headers = ["contender", "status", "fit s", "predict s", "peak RSS MB", "RSS before fit MB",
               "peak - before fit MB", "test AUC", "fit time / fastest anchor", "AUC - best anchor",
               "RSS / LightGBM"]
    return _harness.markdown_table(headers, rows)


def distributed_table(pairs):
    """Markdown table of 1-process vs 2-process fits; ``pairs`` is a list of (label, r1, r2)."""
    rows = []
    for label, one, two in pairs:
        cells = [label]
        for r in (one, two):
            cells.append(r["fit_s"] if _ok(r) else "failed (below)")
        speed = one["fit_s"] / two["fit_s"] if _ok(one) and _ok(two) else None
        auc1 = one["metrics"]["auc"] if _ok(one) else None
        auc2 = two["metrics"]["auc"] if _ok(two) else None
        peak2 = two.get("peak_rss_mb") if _ok(two) else None
        cells += [speed, auc1, auc2, peak2]
        rows.append(cells)
    headers = ["contender", "fit s, 1 proc x 1 thread", "fit s, 2 procs x 1 thread", "speedup",
               "AUC 1 proc", "AUC 2 procs", "peak RSS MB per proc (2 procs)"]
    return _harness.markdown_table(headers, rows)


def traffic_table(rows_in):
    """Markdown table of traced histogram allreduces under mpirun -np 2 (rank 0)."""
    rows, base = [], None
    for label, r in rows_in:
        t = r.get("hist_traffic") if _ok(r) else None
        if t is None:
            rows.append([label, "-", "-", "-", "-", "-"])
            continue
        base = base or t["bytes_per_call"]
        rows.append([label, t["calls"], t["bytes_per_call"], base / t["bytes_per_call"], t["sent_mb"],
                     t["all_sent_mb"]])
    headers = ["mode", "histogram allreduces", "buffer bytes per allreduce", "float bytes / these bytes",
               "histogram MB sent by rank 0", "all collectives MB sent by rank 0"]
    return _harness.markdown_table(headers, rows)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-train", type=int, default=1_000_000, help="training rows (default 1,000,000)")
    p.add_argument("--quick", action="store_true", help="smoke run: 100,000 training rows, 10 min timeouts")
    p.add_argument("--threads", type=int, default=2, help="threads per contender (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=None, help="seconds per contender (default 3600; 600 with --quick)")
    p.add_argument("--only", default=None,
                   help="comma list among ours,ours-q,lightgbm,xgboost,hgb,mpi,mpi-q,lgb-dp (default: all; "
                        "ours-q / mpi-q: the quantized fits)")
    p.add_argument("--write", dest="write", action="store_true", default=None,
                   help="write the tables to RESULTS.md (default for full runs)")
    p.add_argument("--no-write", dest="write", action="store_false",
                   help="print tables only; leave RESULTS.md alone (default with --quick)")
    args = p.parse_args(argv)
    if args.quick and args.n_train == 1_000_000:
        args.n_train = 100_000
    if args.timeout is None:
        args.timeout = 600.0 if args.quick else 3600.0
    if args.n_train < 1000:
        p.error("--n-train must be at least 1000")
    return args


def main(argv=None):
    args = parse_args(argv)
    only = set((args.only or "ours,ours-q,lightgbm,xgboost,hgb,mpi,mpi-q,lgb-dp").split(","))
    cfg = {"n_trees": 100, "num_leaves": 31, "max_bins": 255, "learning_rate": 0.1, "min_leaf": 20,
           "seed": args.seed}
    print(f"generating / loading HIGGS-like data: {args.n_train} train rows", flush=True)
    datasets.higgs_like(args.n_train, args.seed)
    kw = {"n_train": args.n_train, "seed": args.seed, "cfg": cfg}
    run = lambda name, fn, **o: _harness.run_contender(name, THIS, fn, kw, timeout=args.timeout, **o)
    kw_q = dict(kw, cfg=dict(cfg, quantized=True))
    run_q = lambda name, fn, **o: _harness.run_contender(name, THIS, fn, kw_q, timeout=args.timeout, **o)

    results = []
    if "ours" in only:
        results.append(run("histforest GBDT", "contender_ours", threads=args.threads))
    if "ours-q" in only:
        results.append(run_q("histforest GBDT quantized", "contender_ours", threads=args.threads))
    if "lightgbm" in only:
        results.append(run("LightGBM", "contender_lightgbm", threads=args.threads))
    if "xgboost" in only:
        results.append(run("XGBoost hist", "contender_xgboost", threads=args.threads))
    if "hgb" in only:
        results.append(run("sklearn HGB", "contender_sklearn_hgb", threads=args.threads))

    pairs = []
    if "mpi" in only:
        one = run("histforest mpirun -np 1", "contender_ours_mpi", threads=1, launcher="mpirun", nprocs=1)
        two = run("histforest mpirun -np 2", "contender_ours_mpi", threads=1, launcher="mpirun", nprocs=2)
        pairs.append(("histforest GBDT (mpirun)", one, two))
    if "mpi-q" in only:
        one = run_q("histforest quantized mpirun -np 1", "contender_ours_mpi", threads=1, launcher="mpirun",
                    nprocs=1)
        two = run_q("histforest quantized mpirun -np 2", "contender_ours_mpi", threads=1, launcher="mpirun",
                    nprocs=2)
        pairs.append(("histforest GBDT quantized (mpirun)", one, two))
    if "lgb-dp" in only:
        one = run("LightGBM 1 proc", "contender_lightgbm", threads=1)
        two = run("LightGBM data-parallel x2", "contender_lightgbm_data_parallel", threads=1,
                  launcher="group", nprocs=2)
        pairs.append(("LightGBM (tree_learner=data, 2 local processes)", one, two))

    body = [f"HIGGS-like binary task (benchmarks/datasets.py: higgs_like), {args.n_train:,} train x 28, "
            f"{datasets.HIGGS_TEST_ROWS:,} test rows; 100 trees, 31 leaves, 255 bins, lr 0.1, "
            f"min 20 rows per leaf; {args.threads} threads per contender; each contender in a fresh "
            "process (peak RSS = that process's VmHWM, data included). \"RSS before fit\" is "
            "the process after its imports, its warm-up (ours: the Numba kernels loaded) and "
            "loading the training rows (224 MB of float64); the next column is what fit and "
            "predict added on top. Fit time includes each library's binning / Dataset "
            "construction."]
    if results:
        body += ["", main_table(results)]
        fl = next((r for r in results if r["name"] == "histforest GBDT" and _ok(r)), None)
        qu = next((r for r in results if r["name"] == "histforest GBDT quantized" and _ok(r)), None)
        if fl and qu:
            body += ["", f"Quantized vs float (issue 16 targets: AUC within 0.001, fit <= 0.75x): fit "
                     f"{qu['fit_s'] / fl['fit_s']:.3f}x, AUC {qu['metrics']['auc'] - fl['metrics']['auc']:+.5f}."]
        warm = next((r.get("warmup_s") for r in results if r["name"].startswith("histforest GBDT") and _ok(r)),
                    None)
        if warm is not None:
            body += ["", f"histforest's untimed warm-up fit (Numba compile or cache load): {warm:.2f} s."]
    if pairs:
        body += ["", "Distributed: same data, 1 thread per process; speedup = 1-process fit / "
                 "2-process fit (each process holds half the rows).", "", distributed_table(pairs)]
        traced = [(label.replace(" (mpirun)", ""), two) for label, _, two in pairs if label.startswith("histforest")]
        if traced:
            body += ["", f"Histogram allreduces under mpirun -np 2 (rank 0's trace; allreduces of >= "
                     f"{HIST_MIN_BYTES} buffer bytes; float sends 16 bytes per bin, quantized 4 per "
                     "16|16-bit bin and 8 per wide one):", "", traffic_table(traced)]
    failed = [r for r in results + [x for p in pairs for x in p[1:]] if not _ok(r)]
    for r in failed:
        body += ["", f"- {r['name']}: {r['status']}"]
    text = "\n".join(body)
    print("\n" + text)
    if args.write if args.write is not None else not args.quick:
        title = f"{'Quick smoke run' if args.quick else 'Full run'}, {args.n_train:,} training rows"
        _harness.write_results_section(SECTION, text, title=title)
        print(f"\nwritten to {_harness.RESULTS_PATH} under '## {SECTION}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())

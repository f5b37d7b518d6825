"""Checkpoint cost (issue 14): time and bytes per checkpoint, and the cost of resuming.

On the 1M-row benchmark data of bench_gbdt.py (HIGGS-like, 1M x 28, GBDTClassifier,
100 trees, 31 leaves) and bench_causal.py (Wager-Athey, 1M x 20, CausalForest, 200
trees), each case in fresh processes (2 threads):

- ``fit s`` without a checkpoint, and with ``checkpoint=`` (GBDT: every ``--every``
  iterations, default 10; causal forest: after every batch of the two nuisance forests
  and of the forest);
- per checkpoint: wall seconds of ``Stage.save`` on rank 0 (packing the new trees,
  writing their segment and the manifest with fsync, the agreement broadcast), bytes
  written (new segment + manifest), and their total against the fit;
- the fingerprint (hash of codes and targets, once per fit);
- resume from a complete checkpoint: a second ``fit`` that grows nothing, so its time is
  the whole overhead of resuming (reading and broadcasting the trees, the fingerprint,
  recomputing out-of-bag sums / boosting scores from the trees);
- crash at half the trees (simulated by the progress callback) and resume: the resumed
  fit's time, next to the uninterrupted fit's.

Usage::

    .venv/bin/python benchmarks/bench_checkpoint.py            # full size (1M rows), writes RESULTS.md
    .venv/bin/python benchmarks/bench_checkpoint.py --quick    # 100k / 20k rows smoke run, prints only

The functions named ``contender_*`` run inside the worker processes.
"""
import argparse
import os
import shutil
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402
import datasets  # noqa: E402

SECTION = "Checkpoint cost (issue 14)"
THIS = os.path.abspath(__file__)


class _Crash(Exception):
    pass


def _instrument():
    """Record every checkpoint save (seconds, bytes) and fingerprint (seconds) of this process."""
    from forest.estimators import causal_forest
    from forest.io import checkpoint
    from forest.estimators import gbdt
    from forest.estimators import regression_forest

    record = {"saves": [], "fingerprint_s": 0.0}
    real_save = checkpoint.Stage.save

    def save(self, new_trees, n_done, n_total, **kwargs):
        lo = self.n_done
        start = time.perf_counter()
        real_save(self, new_trees, n_done, n_total, **kwargs)
        seconds = time.perf_counter() - start
        directory = self.run.checkpoint.directory
        written = os.path.getsize(os.path.join(directory, checkpoint.MANIFEST_NAME))
        if new_trees:
            written += os.path.getsize(os.path.join(directory, f"{self.name}-{lo:07d}-{n_done:07d}.ckpt"))
        record["saves"].append((seconds, written))

    checkpoint.Stage.save = save
    for module in (regression_forest, causal_forest, gbdt):
        real = module.fit_fingerprint

        def timed(*args, _real=real, **kwargs):
            start = time.perf_counter()
            out = _real(*args, **kwargs)
            record["fingerprint_s"] += time.perf_counter() - start
            return out
        module.fit_fingerprint = timed
    return record


def _crash_at(n):
    def progress(done, total):
        if done >= n:
            raise _Crash
    return progress


def _gbdt_case(n_train, seed, threads, cfg):
    import bench_gbdt
    from forest.estimators.gbdt import GBDTClassifier

    bench_gbdt._warm_numba(threads, cfg)
    X, y, _ = bench_gbdt._load(n_train, seed)
    params = bench_gbdt.ours_params(GBDTClassifier, threads, cfg["n_trees"], cfg["num_leaves"], cfg["max_bins"],
                                    cfg["learning_rate"], cfg["min_leaf"], cfg["seed"])
    return (lambda **kw: GBDTClassifier(**params).fit(X, y, **kw)), cfg["n_trees"]


def _causal_case(n, seed, threads, cfg):
    import bench_causal
    from forest.estimators.causal_forest import CausalForest

    bench_causal._warm_numba(cfg)
    data = datasets.wager_athey(n, d=20, seed=seed)
    X, t, y = data["X"], data["t"], data["y"]
    params = bench_causal.ours_params(CausalForest, cfg)
    return (lambda **kw: CausalForest(**params).fit(X, t, y, **kw)), cfg["n_estimators"]


def _case(kind, n, seed, threads, cfg):
    return (_gbdt_case if kind == "gbdt" else _causal_case)(n, seed, threads, cfg)


# --------------------------------------------------------------------------- contenders (worker side)

def contender_plain(kind, n, seed, cfg, threads, **_):
    """The fit without a checkpoint."""
    fit, _ = _case(kind, n, seed, threads, cfg)
    start = time.perf_counter()
    fit()
    return {"fit_s": time.perf_counter() - start}


def contender_checkpointed(kind, n, seed, cfg, every, threads, **_):
    """The fit with a checkpoint, then a resume from the complete checkpoint."""
    from forest.io.checkpoint import Checkpoint

    fit, _ = _case(kind, n, seed, threads, cfg)
    record = _instrument()
    directory = tempfile.mkdtemp(prefix="hf-ckpt-", dir=_harness.OUT_DIR if os.path.isdir(_harness.OUT_DIR) else None)
    try:
        start = time.perf_counter()
        fit(checkpoint=Checkpoint(directory, every=every))
        fit_s = time.perf_counter() - start
        saves, fingerprint_s = list(record["saves"]), record["fingerprint_s"]
        on_disk = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory))
        start = time.perf_counter()
        fit(checkpoint=Checkpoint(directory, every=every, log=lambda line: None))
        resume_s = time.perf_counter() - start
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    seconds = np.array([s for s, _ in saves])
    sizes = np.array([b for _, b in saves], dtype=np.float64)
    return {"fit_s": fit_s, "n_saves": len(saves), "save_mean_s": float(seconds.mean()),
            "save_max_s": float(seconds.max()), "save_total_s": float(seconds.sum()),
            "bytes_mean": float(sizes.mean()), "bytes_total": float(sizes.sum()), "on_disk_bytes": on_disk,
            "fingerprint_s": fingerprint_s, "resume_complete_s": resume_s}


def contender_crash_half(kind, n, seed, cfg, every, threads, **_):
    """Crash after half the trees (progress callback), then the timed resumed fit."""
    from forest.io.checkpoint import Checkpoint

    fit, n_trees = _case(kind, n, seed, threads, cfg)
    directory = tempfile.mkdtemp(prefix="hf-ckpt-", dir=_harness.OUT_DIR if os.path.isdir(_harness.OUT_DIR) else None)
    try:
        try:
            fit(checkpoint=Checkpoint(directory, every=every), progress=_crash_at(n_trees // 2))
        except _Crash:
            pass
        start = time.perf_counter()
        fit(checkpoint=Checkpoint(directory, every=every, log=lambda line: None))
        return {"fit_s": time.perf_counter() - start}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# --------------------------------------------------------------------------- driver

def _ok(r):
    return r is not None and r.get("status") == "ok"


def _get(r, key, scale=1.0):
    return r[key] * scale if _ok(r) else "failed"


def table(rows_in):
    rows = []
    for label, n, plain, ckpt, half in rows_in:
        overhead = (ckpt["fit_s"] / plain["fit_s"] - 1.0) * 100.0 if _ok(plain) and _ok(ckpt) else None
        share = ckpt["save_total_s"] / ckpt["fit_s"] * 100.0 if _ok(ckpt) else None
        rows.append([label, f"{n:,}", _get(plain, "fit_s"), _get(ckpt, "fit_s"), overhead, int(ckpt["n_saves"]) if _ok(ckpt) else "failed",
                     _get(ckpt, "save_mean_s"), _get(ckpt, "save_max_s"), share, _get(ckpt, "bytes_mean", 2.0 ** -20),
                     _get(ckpt, "bytes_total", 2.0 ** -20), _get(ckpt, "fingerprint_s"),
                     _get(ckpt, "resume_complete_s"), _get(half, "fit_s")])
    headers = ["model", "rows", "fit s", "fit s, checkpointed", "difference %", "checkpoints", "s per checkpoint",
               "max s", "checkpoint share of fit %", "MiB per checkpoint", "MiB written", "fingerprint s",
               "resume s (complete checkpoint)", "resumed fit s (crash at half)"]
    return _harness.markdown_table(headers, rows)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 100k GBDT rows, 20k causal rows, 40 trees")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every", type=int, default=10, help="GBDT iterations between checkpoints (default 10)")
    p.add_argument("--only", default="gbdt,causal", help="comma list among gbdt,causal")
    p.add_argument("--causal-rows", type=int, default=None,
                   help="causal forest training rows (default 1,000,000; 20,000 with --quick)")
    p.add_argument("--timeout", type=float, default=None, help="seconds per contender (default 7200; 900 quick)")
    p.add_argument("--write", dest="write", action="store_true", default=None,
                   help="write the table to RESULTS.md (default for full runs)")
    p.add_argument("--no-write", dest="write", action="store_false", help="print only (default with --quick)")
    args = p.parse_args(argv)
    args.timeout = args.timeout or (900.0 if args.quick else 7200.0)
    return args


def main(argv=None):
    args = parse_args(argv)
    q = args.quick
    cases = []
    if "gbdt" in args.only:
        n = 100_000 if q else 1_000_000
        datasets.higgs_like(n, args.seed)
        cfg = {"n_trees": 40 if q else 100, "num_leaves": 31, "max_bins": 255, "learning_rate": 0.1, "min_leaf": 20,
               "seed": args.seed}
        cases.append((f"GBDTClassifier, {cfg['n_trees']} trees, every {args.every}", "gbdt", n, cfg))
    if "causal" in args.only:
        n = args.causal_rows or (20_000 if q else 1_000_000)
        datasets.wager_athey(n, d=20, seed=args.seed)
        cfg = {"n_estimators": 40 if q else 200, "min_samples_leaf": 5, "max_samples": 0.5, "honest": True,
               "mtry": 20, "seed": args.seed}
        cases.append((f"CausalForest, {cfg['n_estimators']} trees", "causal", n, cfg))
    rows = []
    for label, kind, n, cfg in cases:
        kw = {"kind": kind, "n": n, "seed": args.seed, "cfg": cfg, "every": args.every}
        run = lambda name, fn: _harness.run_contender(name, THIS, fn, kw, threads=args.threads,  # noqa: E731
                                                      timeout=args.timeout)
        rows.append((label, n, run(f"{kind} plain", "contender_plain"),
                     run(f"{kind} checkpointed", "contender_checkpointed"),
                     run(f"{kind} crash at half + resume", "contender_crash_half")))
    body = ["Each cell from a fresh process with the stated threads; the benchmark data of bench_gbdt.py "
            "(HIGGS-like) and bench_causal.py (Wager-Athey, d=20). Checkpoints go to a local directory "
            "(benchmarks/out). \"s per checkpoint\" is rank 0's Stage.save (pack the new trees, write their "
            "segment and the manifest with fsync, agree); \"MiB per checkpoint\" the new segment plus the "
            "manifest; \"resume s\" a fit whose checkpoint is complete (it grows nothing: reading, fingerprint, "
            "recomputing out-of-bag sums or boosting scores).", "", table(rows)]
    failed = [r for row in rows for r in row[2:] if not _ok(r)]
    body += [f"- {r['name']}: {r['status']}" for r in failed]
    text = "\n".join(body)
    print("\n" + text)
    if args.write if args.write is not None else not q:
        _harness.write_results_section(SECTION, text, title="Quick smoke run" if q else "Full run")
        print(f"\nwritten to {_harness.RESULTS_PATH} under '## {SECTION}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())

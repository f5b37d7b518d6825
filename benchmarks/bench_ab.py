"""Same-run A/B of two commits: the GBDT and causal-forest fits of two checkouts, interleaved.

Why: this machine's speed swings up to 2.5x within an evening, so a "before" table from
another run says little about a refactor. This script checks out both commits as
detached worktrees (``benchmarks/out/ab-<sha>``, removed at the end unless
``--keep-worktrees``), and runs each contender in a fresh
process from each checkout, alternating base and head ``--repeats`` times; the tables
give the minimum and the median per commit and their ratio. The data come from this
checkout's ``datasets`` (the same rows for both); every contender warms its Numba cache
with a small untimed fit first.

Contenders
----------
``gbdt``: ``GBDTClassifier`` on bench_gbdt's HIGGS-like rows (100 trees, 31 leaves,
255 bins, lr 0.1, min 20 rows per leaf), fit time and test AUC. ``causal``:
``CausalForest`` on bench_causal's Wager-Athey design (200 trees, min 5 rows per leaf,
subsample 0.5, honest), fit time and RMSE of the CATE on 10,000 test points. ``regression``:
``RegressionForest`` (200 trees, its defaults) on the same design's outcome, fit time and RMSE
of the prediction against the outcome's mean ``m(x)`` on the test points.

Usage: ``.venv-bench/bin/python benchmarks/bench_ab.py --base 9e3eba6 [--head HEAD] --write``
"""
import argparse
import os
import statistics
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
THIS = os.path.abspath(__file__)
sys.path.insert(0, HERE)

import _harness  # noqa: E402

SECTION = "Same-run A/B of two commits"


def _use_checkout(root):
    """Import ``forest`` and ``native`` from ``root`` (a worktree), not the installed copy."""
    sys.path.insert(0, root)
    import forest

    if not os.path.abspath(forest.__file__).startswith(os.path.abspath(root)):
        raise RuntimeError(f"forest imported from {forest.__file__}, not from {root}")


def contender_gbdt(root, n_train, seed, threads, **_):
    _use_checkout(root)
    import datasets
    from bench_gbdt import ours_params
    from forest import GBDTClassifier          # the public name: both layouts have it
    from sklearn.metrics import roc_auc_score

    params = ours_params(GBDTClassifier, threads, 100, 31, 255, 0.1, 20, seed)
    paths = datasets.higgs_like(n_train, seed=seed)
    X, y = np.load(paths["X_train"]), np.load(paths["y_train"])
    # untimed warm-up on the same columns, large enough to reach the threaded kernels
    warm = dict(params, **{k: 2 for k in ("n_estimators", "max_iter") if k in params})
    GBDTClassifier(**warm).fit(X[:50_000], y[:50_000])
    model = GBDTClassifier(**params)
    start = time.perf_counter()
    model.fit(X, y)
    fit_s = time.perf_counter() - start
    Xt, yt = np.load(paths["X_test"]), np.load(paths["y_test"])
    proba = model.predict_proba(Xt)[:, 1]
    return {"fit_s": fit_s, "metrics": {"auc": float(roc_auc_score(yt, proba)), "digest": _digest(proba)}}


def contender_causal(root, n, seed, threads, **_):
    _use_checkout(root)
    import datasets
    from forest import CausalForest            # the public name: both layouts have it

    params = dict(n_estimators=200, min_samples_leaf=5, max_samples=0.5, honest=True, random_state=seed)
    small = datasets.wager_athey(20_000, seed=seed + 1, cache=False)  # reaches the level-wise search
    CausalForest(**dict(params, n_estimators=4)).fit(small["X"], small["t"], small["y"])
    data = datasets.wager_athey(n, seed=seed)
    model = CausalForest(**params)
    start = time.perf_counter()
    model.fit(data["X"], data["t"], data["y"])
    fit_s = time.perf_counter() - start
    tau = np.asarray(model.predict(data["X_test"]), dtype=np.float64).reshape(-1)
    return {"fit_s": fit_s, "metrics": {"rmse": float(np.sqrt(np.mean((tau - data["tau_test"]) ** 2))),
                                        "digest": _digest(tau)}}


def contender_regression(root, n, seed, threads, **_):
    _use_checkout(root)
    import datasets
    from forest import RegressionForest        # the public name: both layouts have it

    params = dict(n_estimators=200, random_state=seed)
    small = datasets.wager_athey(20_000, seed=seed + 1, cache=False)  # reaches the level-wise search
    RegressionForest(**dict(params, n_estimators=4)).fit(small["X"], small["y"])
    data = datasets.wager_athey(n, seed=seed)
    model = RegressionForest(**params)
    start = time.perf_counter()
    model.fit(data["X"], data["y"])
    fit_s = time.perf_counter() - start
    pred = np.asarray(model.predict(data["X_test"]), dtype=np.float64)
    truth = datasets.wa_main_effect(data["X_test"])      # E[y | x]: the design's t - e has mean 0
    return {"fit_s": fit_s, "metrics": {"rmse": float(np.sqrt(np.mean((pred - truth) ** 2))), "digest": _digest(pred)}}


def _digest(predictions):
    """First 12 hex digits of the SHA-256 of the predictions' bytes: equal digests, equal bits."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(predictions, dtype=np.float64).tobytes()).hexdigest()[:12]


def _worktree(ref):
    sha = subprocess.check_output(["git", "-C", ROOT, "rev-parse", "--short=7", ref], text=True).strip()
    path = os.path.join(HERE, "out", f"ab-{sha}")
    if not os.path.isdir(path):
        subprocess.check_call(["git", "-C", ROOT, "worktree", "add", "--detach", path, sha],
                              stdout=subprocess.DEVNULL)
    return sha, path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the 'before' commit")
    p.add_argument("--head", default="HEAD", help="the 'after' commit (default HEAD)")
    p.add_argument("--parts", default="gbdt,causal", help="comma list among gbdt,causal,regression")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--gbdt-rows", type=int, default=1_000_000)
    p.add_argument("--causal-rows", type=int, default=100_000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--keep-worktrees", action="store_true",
                   help="leave benchmarks/out/ab-<sha> checked out (their Numba caches make a rerun start faster)")
    p.add_argument("--write", action="store_true", help=f"append the tables to RESULTS.md ('{SECTION}')")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    parts = args.parts.split(",")
    unknown = set(parts) - {"gbdt", "causal", "regression"}
    if unknown:
        raise SystemExit(f"unknown --parts {sorted(unknown)}")
    refs = [_worktree(args.base), _worktree(args.head)]
    if refs[0][0] == refs[1][0]:
        raise SystemExit(f"--base and --head are the same commit ({refs[0][0]})")
    try:
        results = _run_all(args, refs, parts)
    finally:
        if not args.keep_worktrees:
            for _, path in refs:
                subprocess.call(["git", "-C", ROOT, "worktree", "remove", "--force", path])
    _report(args, refs, parts, results)


def _run_all(args, refs, parts):
    results = {}
    for rep in range(args.repeats):
        for part in parts:
            for sha, path in refs:
                kw = {"root": path, "seed": args.seed}
                kw.update({"n_train": args.gbdt_rows} if part == "gbdt" else {"n": args.causal_rows})
                res = _harness.run_contender(f"{part} {sha} #{rep + 1}", THIS, f"contender_{part}", kw,
                                             threads=args.threads, timeout=args.timeout)
                results.setdefault((part, sha), []).append(res)
    return results


def _report(args, refs, parts, results):
    rows = []
    for part in parts:
        base_sha, head_sha = refs[0][0], refs[1][0]
        cells = {}
        for sha in (base_sha, head_sha):
            ok = [r for r in results[(part, sha)] if r.get("status") == "ok"]
            fits = [r["fit_s"] for r in ok]
            metric = "auc" if part == "gbdt" else "rmse"       # causal: of tau; regression: of E[y | x]
            vals = [r["metrics"][metric] for r in ok]
            digests = sorted({r["metrics"].get("digest", "-") for r in ok})
            cells[sha] = (min(fits), statistics.median(fits), vals[0] if vals else float("nan"), len(fits),
                          "/".join(digests))
        b, h = cells[base_sha], cells[head_sha]
        rows.append([part, f"{b[0]:.2f} / {b[1]:.2f}", f"{h[0]:.2f} / {h[1]:.2f}", f"{h[0] / b[0]:.3f}",
                     f"{h[1] / b[1]:.3f}", f"{b[2]:.5f}", f"{h[2]:.5f}", f"{b[3]} / {h[3]}", b[4], h[4]])
    header = ["model", f"fit s {base_sha} (min / median)", f"fit s {head_sha} (min / median)",
              "ratio of minima", "ratio of medians", f"{'AUC / RMSE'} {base_sha}", f"AUC / RMSE {head_sha}", "runs",
              f"predictions digest {base_sha}", f"predictions digest {head_sha}"]
    table = _harness.markdown_table(header, rows)
    print(table)
    if args.write:
        argv_s = " ".join(sys.argv[1:])
        body = [f"GBDT: {args.gbdt_rows:,} HIGGS-like rows, 100 trees x 31 leaves. Causal: Wager-Athey, "
                f"{args.causal_rows:,} rows, d = 20, 200 trees. Regression: RegressionForest(200) on the same "
                f"rows' outcome. {args.threads} threads, each run a fresh process, "
                f"base and head alternating ({args.repeats} each). AUC and RMSE of the first run (the fits are "
                "deterministic).", table]
        _harness.write_results_section(SECTION, "\n\n".join(body),
                                       command=f".venv-bench/bin/python benchmarks/bench_ab.py {argv_s}")


if __name__ == "__main__":
    main()

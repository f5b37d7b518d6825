"""GBDT fit time and AUC across data shapes (issue 37): histforest against LightGBM and XGBoost.

Binary classification on :func:`datasets.dense_interactions` (dense float32 columns,
main effects and pairwise interactions, held-out rows from their own stream) at
several shapes ``rows x features``. Matched settings for every contender: 100
iterations, 31 leaves grown best-first, 255 value bins, learning rate 0.1, no L2
penalty, no minimum gain, at least 20 rows and a hessian sum of at least 1e-3 per
leaf, no row or column subsampling, no early stopping, 2 threads:

* histforest ``GBDTClassifier(min_samples_leaf=20, min_child_weight=1e-3,
  l2_regularization=0, early_stopping=False)``;
* LightGBM :func:`anchors.lightgbm_gbdt_params` (``min_data_in_leaf=20``;
  ``min_sum_hessian_in_leaf=1e-3`` and ``lambda_l2=0`` are its defaults);
* XGBoost ``hist`` grown ``lossguide`` with ``max_leaves=31``, ``max_bin=256`` (its
  count includes the missing bin), ``lambda=0`` and ``min_child_weight=1e-3`` (XGBoost
  has no row-count minimum per leaf; its defaults are ``lambda=1``,
  ``min_child_weight=1``).

Each shape runs in one fresh process (the harness's worker): the data are generated,
histforest's Numba kernels warmed up (untimed), then the contenders fit in turn,
``--reps`` rounds, the order rotated every round so no contender always runs first
or last on the shared machine. Fit times include each library's binning / dataset
construction. Reported per contender: the minimum fit time over the rounds, the
held-out AUC (the same every round: the fits are deterministic, checked), the ratio
of the fit time to the fastest anchor's, and the AUC difference to LightGBM's.

Usage::

    .venv-bench/bin/python benchmarks/bench_gbdt_shapes.py                     # 4 shapes, writes RESULTS.md
    .venv-bench/bin/python benchmarks/bench_gbdt_shapes.py --quick             # small shapes, 2 rounds
    .venv-bench/bin/python benchmarks/bench_gbdt_shapes.py --shapes 500000x10 --reps 5 --no-write

The function named ``contender_shape`` runs inside the worker process.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402
import datasets  # noqa: E402

SECTION = "GBDT shapes (issue 37)"
THIS = os.path.abspath(__file__)
DEFAULT_SHAPES = "500000x10,300000x40,200000x100,1000000x20"
CONTENDERS = ("histforest", "LightGBM", "XGBoost hist")
ANCHORS = CONTENDERS[1:]
#: |AUC - the best anchor's AUC| at or below this counts as equal AUC.
AUC_TOL = 0.002


def settings(seed=0):
    """The matched settings (module docstring)."""
    return {"n_trees": 100, "num_leaves": 31, "max_bins": 255, "learning_rate": 0.1, "min_leaf": 20,
            "min_hessian": 1e-3, "l2": 0.0, "seed": int(seed)}


def parse_shapes(text):
    """``"500000x10,300000x40"`` -> ``[(500000, 10), (300000, 40)]``."""
    shapes = []
    for part in text.split(","):
        rows, _, cols = part.strip().lower().partition("x")
        if not rows.isdigit() or not cols.isdigit() or int(rows) < 1000 or int(cols) < 2:
            raise ValueError(f"shape {part!r}: expected ROWSxFEATURES with ROWS >= 1000 and FEATURES >= 2")
        shapes.append((int(rows), int(cols)))
    return shapes


# --------------------------------------------------------------------------- contenders (worker side)

def _auc(y, score):
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, score))


def _fit_ours(X, y, threads, cfg):
    from forest.estimators.gbdt import GBDTClassifier

    model = GBDTClassifier(n_estimators=cfg["n_trees"], max_leaf_nodes=cfg["num_leaves"], max_bins=cfg["max_bins"],
                           learning_rate=cfg["learning_rate"], min_samples_leaf=cfg["min_leaf"],
                           min_child_weight=cfg["min_hessian"], l2_regularization=cfg["l2"], early_stopping=False,
                           random_state=cfg["seed"], n_threads=threads)
    start = time.perf_counter()
    model.fit(X, y)
    return model, time.perf_counter() - start


def _fit_lightgbm(X, y, threads, cfg):
    import anchors

    params, n_trees = anchors.lightgbm_gbdt_params(threads, cfg["n_trees"], cfg["num_leaves"], cfg["max_bins"],
                                                   cfg["learning_rate"], cfg["min_leaf"], cfg["seed"])
    params.update(min_sum_hessian_in_leaf=cfg["min_hessian"], lambda_l2=cfg["l2"])
    return anchors.lightgbm_fit(X, y, params, n_trees)


def _fit_xgboost(X, y, threads, cfg):
    import anchors

    return anchors.xgboost_fit(X, y, threads, cfg["n_trees"], cfg["num_leaves"], cfg["max_bins"] + 1,
                               cfg["learning_rate"], cfg["seed"],
                               extra={"lambda": cfg["l2"], "min_child_weight": cfg["min_hessian"]})


def _predict(name, model, X, threads):
    import anchors

    if name == "histforest":
        return model.predict_proba(X)[:, 1]
    if name == "LightGBM":
        return anchors.lightgbm_predict(model, X)[0]
    return anchors.xgboost_predict(model, X, threads)[0]


FITS = {"histforest": _fit_ours, "LightGBM": _fit_lightgbm, "XGBoost hist": _fit_xgboost}


def contender_shape(n_rows, n_features, reps, seed, threads, cfg, **_):
    """All contenders on one shape, ``reps`` rounds in rotated order, in this process."""
    import bench_gbdt

    data = datasets.dense_interactions(n_rows, n_features, seed=seed)
    X, y = data["X"], data["y"]
    warm_s = bench_gbdt._warm_numba(threads, cfg)
    times = {name: [] for name in CONTENDERS}
    aucs = {name: [] for name in CONTENDERS}
    for r in range(reps):
        order = CONTENDERS[r % len(CONTENDERS):] + CONTENDERS[:r % len(CONTENDERS)]
        for name in order:
            model, fit_s = FITS[name](X, y, threads, cfg)
            times[name].append(fit_s)
            aucs[name].append(_auc(data["y_test"], _predict(name, model, data["X_test"], threads)))
            del model
    return {"fit_times": times, "aucs": aucs, "warmup_s": warm_s, "load": os.getloadavg()}


# --------------------------------------------------------------------------- driver

def shape_rows(n_rows, n_features, res):
    """Table rows of one shape's result (or of its failure)."""
    label = f"{n_rows:,} x {n_features}"
    if res.get("status") != "ok":
        return [[label, "-", res.get("status", "failed"), "-", "-", "-", "-", "-"]]
    best = {name: min(res["fit_times"][name]) for name in CONTENDERS}
    auc = {name: res["aucs"][name][0] for name in CONTENDERS}
    fastest = min(best[name] for name in ANCHORS)
    best_auc = max(auc[name] for name in ANCHORS)
    rows = []
    for name in CONTENDERS:
        spread = "same" if len(set(res["aucs"][name])) == 1 else "DIFFERS"
        rows.append([label, name, best[name], " / ".join(f"{t:.2f}" for t in res["fit_times"][name]),
                     f"{auc[name]:.5f}", f"{auc[name] - best_auc:+.5f}", spread, best[name] / fastest])
    return rows


def verdicts(shapes, results):
    """Per shape, whether histforest meets <= 1.0x the fastest anchor at equal AUC."""
    lines = []
    for (n_rows, n_features), res in zip(shapes, results):
        if res.get("status") != "ok":
            lines.append(f"- {n_rows:,} x {n_features}: {res.get('status')}")
            continue
        best = {name: min(res["fit_times"][name]) for name in CONTENDERS}
        fastest_name = min(ANCHORS, key=best.get)
        ratio = best["histforest"] / best[fastest_name]
        diff = res["aucs"]["histforest"][0] - max(res["aucs"][name][0] for name in ANCHORS)
        ok_time, ok_auc = ratio <= 1.0, diff >= -AUC_TOL
        verdict = "met" if ok_time and ok_auc else "NOT met"
        lines.append(f"- {n_rows:,} x {n_features}: {ratio:.2f}x {fastest_name} (fastest anchor), AUC "
                     f"{diff:+.4f} vs the best anchor: {verdict}")
    return lines


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=None, help=f"comma list ROWSxFEATURES (default {DEFAULT_SHAPES})")
    p.add_argument("--reps", type=int, default=None, help="rounds per shape (default 3; 2 with --quick)")
    p.add_argument("--quick", action="store_true", help="smoke run: 50000x10,20000x40, 2 rounds")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per shape")
    p.add_argument("--write", dest="write", action="store_true", default=None,
                   help="write the table to RESULTS.md (default for full runs)")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)
    if args.shapes is None:
        args.shapes = "50000x10,20000x40" if args.quick else DEFAULT_SHAPES
    if args.reps is None:
        args.reps = 2 if args.quick else 3
    if args.reps < 1:
        p.error("--reps must be >= 1")
    return args


def report(shapes, results, reps, threads):
    """Markdown body (settings, table, verdicts) of ``results``, one harness result per shape."""
    rows = [row for (n, d), res in zip(shapes, results) for row in shape_rows(n, d, res)]
    headers = ["shape (train rows x features)", "contender", "fit s (min)", f"fit s, {reps} rounds",
               "held-out AUC", "AUC - best anchor", "AUC over rounds", "fit / fastest anchor"]
    loads = [f"{res['load'][0]:.1f}" for res in results if res.get("status") == "ok"]
    body = [f"benchmarks/datasets.py `dense_interactions` (float32, main effects and pairwise interactions), "
            f"{datasets.INTERACTION_TEST_ROWS:,} held-out rows; 100 iterations, 31 leaves (best-first), 255 bins, "
            "lr 0.1, L2 0, min 20 rows and hessian 1e-3 per leaf, no early stopping, "
            f"{threads} threads (settings in the script's docstring). Each shape in one process; "
            f"{reps} rounds, contenders in rotated order; fit time = minimum over the rounds. "
            f"Load average (1 min) at the end of each shape: {', '.join(loads) or '-'}.",
            "", _harness.markdown_table(headers, rows), "",
            f"Target (issue 37): fit <= 1.0x the fastest anchor at equal AUC (|diff| <= {AUC_TOL}):", ""]
    body += verdicts(shapes, results)
    return "\n".join(body)


def main(argv=None):
    args = parse_args(argv)
    shapes = parse_shapes(args.shapes)
    cfg = settings(args.seed)
    results = []
    for n_rows, n_features in shapes:
        kw = {"n_rows": n_rows, "n_features": n_features, "reps": args.reps, "seed": args.seed, "cfg": cfg}
        results.append(_harness.run_contender(f"shape {n_rows}x{n_features}", THIS, "contender_shape", kw,
                                              threads=args.threads, timeout=args.timeout))
    text = report(shapes, results, args.reps, args.threads)
    print("\n" + text)
    if args.write if args.write is not None else not args.quick:
        _harness.write_results_section(SECTION, text, title=f"{len(shapes)} shapes, {args.reps} rounds")
        print(f"\nwritten to {_harness.RESULTS_PATH} under '## {SECTION}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""QuantileForest (issue 34) against quantile-forest's RandomForestQuantileRegressor.

Designs (each ratio from one run on the same machine, same tree count, 2 threads each):

* ``step``: ``y = x0 + s(x) e``, ``s = 0.5`` or ``2`` by the sign of ``x1``, Gaussian noise,
  10 uniform features;
* ``skewed``: ``y = sin(2 x0) + exp(x1 / 2) (e - 1)`` with ``e ~ Exponential(1)`` (a
  skewed, heteroscedastic noise), 10 uniform features;
* ``diabetes``: scikit-learn's bundled diabetes data (442 rows, 10 features), 5-fold
  cross-validation, the mean over folds.

Figures: held-out mean pinball loss over the 0.1/0.5/0.9 quantiles (ours / anchor,
target <= 1.05), empirical coverage of the 0.1-0.9 interval (target within 0.03 of
0.8), fit and predict times (targets: fit >= 5x and predict >= 3x faster at 200k rows).
The anchor runs with its defaults (bootstrap, ``min_samples_leaf=1``, all features per
split, linear interpolation between outcomes); ours with its defaults.

Run (anchors venv): ``.venv-bench/bin/python benchmarks/bench_quantile.py [--sizes 20000
200000] [--trees 100] [--test-rows 20000] [--threads 2]``. Writes the "QuantileForest
(issue 34)" section of RESULTS.md unless ``--no-write``.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402

SECTION = "QuantileForest (issue 34)"
LEVELS = (0.1, 0.5, 0.9)


def design(name, n, seed):
    """``(X, y)`` of a simulated design."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 10))
    if name == "step":
        y = X[:, 0] + np.where(X[:, 1] > 0, 2.0, 0.5) * rng.normal(size=n)
    elif name == "skewed":
        y = np.sin(2 * X[:, 0]) + np.exp(X[:, 1] / 2) * (rng.exponential(size=n) - 1.0)
    else:
        raise ValueError(name)
    return X, y


def pinball(y, pred, levels=LEVELS):
    """Mean pinball loss over the levels, ``pred`` of shape (n, len(levels))."""
    diff = y[:, None] - pred
    lv = np.asarray(levels)[None, :]
    return float(np.mean(np.maximum(lv * diff, (lv - 1) * diff)))


def coverage(y, pred):
    return float(np.mean((y >= pred[:, 0]) & (y <= pred[:, -1])))


def run_ours(X, y, Xt, trees, seed):
    from forest import QuantileForest
    t0 = time.perf_counter()
    f = QuantileForest(trees, quantiles=LEVELS, random_state=seed).fit(X, y)
    fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    pred = f.predict(Xt)
    first = time.perf_counter() - t0
    # fit lays the outcome lists and the trees out for prediction (kept for every call; a
    # loaded model lays them out on its first call): the first call and the next should agree
    t0 = time.perf_counter()
    f.predict(Xt)
    return pred, fit, first, time.perf_counter() - t0


def run_anchor(X, y, Xt, trees, seed, threads):
    from quantile_forest import RandomForestQuantileRegressor
    t0 = time.perf_counter()
    f = RandomForestQuantileRegressor(n_estimators=trees, n_jobs=threads, random_state=seed).fit(X, y)
    fit = time.perf_counter() - t0
    t0 = time.perf_counter()
    pred = np.asarray(f.predict(Xt, quantiles=list(LEVELS)))
    return pred, fit, time.perf_counter() - t0


def warm_up():
    """Compile our kernels before timing (the figures are warm-cache fits)."""
    # 20,000 rows: a tree's subsample reaches the level-wise histogram path (its nodes above
    # the exact path's threshold), whose kernels a 2,000-row fit never compiles
    X, y = design("step", 20000, 99)
    run_ours(X, y, X[:300], 4, 0)
    run_ours(X, y, X[:50], 4, 0)   # under 256 rows: the per-row tree walk (diabetes folds)


def simulated(name, n, test_rows, trees, threads, seed=0):
    X, y = design(name, n + test_rows, seed)
    X, Xt, y, yt = X[:n], X[n:], y[:n], y[n:]
    ours, f_ours, p_ours, p_again = run_ours(X, y, Xt, trees, seed)
    anchor, f_anchor, p_anchor = run_anchor(X, y, Xt, trees, seed, threads)
    return dict(design=name, n=n, ours=pinball(yt, ours), anchor=pinball(yt, anchor), cov_ours=coverage(yt, ours),
                cov_anchor=coverage(yt, anchor), fit_ours=f_ours, fit_anchor=f_anchor, pred_ours=p_ours,
                pred_anchor=p_anchor, pred_again=p_again, test=len(yt))


def diabetes(trees, threads, seed=0):
    from sklearn.datasets import load_diabetes
    from sklearn.model_selection import KFold
    X, y = load_diabetes(return_X_y=True)
    out = {k: [] for k in ("ours", "anchor", "cov_ours", "cov_anchor", "fit_ours", "fit_anchor", "pred_ours",
                           "pred_anchor", "pred_again")}
    for train, test in KFold(5, shuffle=True, random_state=seed).split(X):
        ours, f_o, p_o, p_again = run_ours(X[train], y[train], X[test], trees, seed)
        anchor, f_a, p_a = run_anchor(X[train], y[train], X[test], trees, seed, threads)
        for key, value in (("ours", pinball(y[test], ours)), ("anchor", pinball(y[test], anchor)),
                           ("cov_ours", coverage(y[test], ours)), ("cov_anchor", coverage(y[test], anchor)),
                           ("fit_ours", f_o), ("fit_anchor", f_a), ("pred_ours", p_o), ("pred_anchor", p_a),
                           ("pred_again", p_again)):
            out[key].append(value)
    row = {k: float(np.mean(v)) for k, v in out.items()}
    row.update(design="diabetes (5-fold CV)", n=len(y), test=len(y))
    return row


def outcome_bins_sweep(n, trees, seed=0, choices=(8, 16, 32)):
    """Pinball loss and fit time of the relabelling's outcome bins J (the default's measurement)."""
    import forest.estimators.quantile_forest as qf
    rows = []
    default = qf.DEFAULT_OUTCOME_BINS
    try:
        for name in ("step", "skewed"):
            X, y = design(name, 2 * n, seed)
            X, Xt, y, yt = X[:n], X[n:], y[:n], y[n:]
            for J in choices:
                qf.DEFAULT_OUTCOME_BINS = J
                t0 = time.perf_counter()
                f = qf.QuantileForest(trees, quantiles=LEVELS, random_state=seed).fit(X, y)
                fit = time.perf_counter() - t0
                pred = f.predict(Xt)
                rows.append([name, n, J, f"{pinball(yt, pred):.5f}", f"{coverage(yt, pred):.3f}", f"{fit:.2f}"])
                print(rows[-1], flush=True)
    finally:
        qf.DEFAULT_OUTCOME_BINS = default
    return markdown_table(["design", "train rows", "outcome bins J", "pinball", "coverage", "fit s"], rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[20000, 200000])
    ap.add_argument("--designs", nargs="+", default=["step", "skewed"])
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--test-rows", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bins-sweep-rows", type=int, default=20000,
                    help="rows of the outcome-bins sweep (0: skip it)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    warm_up()
    rows = []
    for n in args.sizes:
        for name in args.designs:
            rows.append(simulated(name, n, args.test_rows, args.trees, args.threads))
            print(rows[-1], flush=True)
    rows.append(diabetes(args.trees, args.threads))
    print(rows[-1], flush=True)
    table = markdown_table(
        ["design", "train rows", "pinball ours", "pinball anchor", "ratio", "coverage ours", "coverage anchor",
         "fit ours s", "fit anchor s", "fit speed-up", "predict ours s (first / again)", "predict anchor s",
         "predict speed-up (first / again)"],
        [[r["design"], r["n"], f"{r['ours']:.4f}", f"{r['anchor']:.4f}", f"{r['ours'] / r['anchor']:.3f}",
          f"{r['cov_ours']:.3f}", f"{r['cov_anchor']:.3f}", f"{r['fit_ours']:.2f}", f"{r['fit_anchor']:.2f}",
          f"{r['fit_anchor'] / r['fit_ours']:.1f}x", f"{r['pred_ours']:.2f} / {r['pred_again']:.2f}",
          f"{r['pred_anchor']:.2f}",
          f"{r['pred_anchor'] / r['pred_ours']:.1f}x / {r['pred_anchor'] / r['pred_again']:.1f}x"] for r in rows])
    body = (f"{args.trees} trees each, {args.threads} threads each; predict times on {args.test_rows} held-out rows "
            f"(diabetes: the fold's rows, mean over folds). Anchor: quantile-forest's RandomForestQuantileRegressor "
            f"with its defaults.\n\n" + table)
    if args.bins_sweep_rows:
        body += ("\n\nThe relabelling's outcome bins J (forest.criteria.quantile.DEFAULT_OUTCOME_BINS), "
                 f"{args.trees} trees, held-out rows as many as training rows:\n\n"
                 + outcome_bins_sweep(args.bins_sweep_rows, args.trees))
    print(body)
    if not args.no_write:
        write_results_section(SECTION, body)


if __name__ == "__main__":
    main()

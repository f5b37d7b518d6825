"""TreeSHAP benchmark (issue 35): our ``shap_values`` against shap's TreeExplainer on the same trees.

A GBDTRegressor of ``--trees`` trees of ``--leaves`` leaves (learning rate 0.1, no early
stopping) is fitted on ``--rows`` rows of a 20-feature design with interactions and 5 %
missing values. Then:

* ours: ``est.shap_values(X)`` on ``--explain-rows`` rows, with 2 Numba threads and with 1
  (one warm-up call on a few rows first: compilation is not timed);
* shap: ``shap.TreeExplainer({"trees": shap_tree_dicts(...)})`` (the same trees, covers
  and values, shap's compiled path-dependent algorithm, one thread) on the first
  ``--shap-rows`` rows; rates are per row, so a subsample is enough to compare;
* the largest absolute difference between the two on those rows, and the largest
  additivity error of ours (row sums against ``predict``);
* context: LightGBM fitted with the same settings on the same rows, its
  ``predict(pred_contrib=True)`` on the explained rows (its own trees, so not the same
  numbers), 2 threads.

Usage::

    PYTHONPATH=. /work/main/.venv-bench/bin/python benchmarks/bench_shap.py
    PYTHONPATH=. /work/main/.venv-bench/bin/python benchmarks/bench_shap.py --rows 20000 --explain-rows 2000 \
        --shap-rows 500      # quick

Prints one line per measurement; the figures go into RESULTS.md by hand.
"""
import argparse
import os
import time

import numba
import numpy as np


def design(n, seed=0, features=20):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, features))
    z = X.copy()
    X[rng.random(X.shape) < 0.05] = np.nan
    y = (2 * z[:, 0] + z[:, 1] * z[:, 2] + np.sin(3 * z[:, 3]) + np.abs(z[:, 4]) * z[:, 5]
         + 0.5 * (z[:, 6] > 0.5) * z[:, 7] + rng.normal(scale=0.5, size=n))
    return X, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--explain-rows", type=int, default=100_000)
    ap.add_argument("--shap-rows", type=int, default=2_000)
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--leaves", type=int, default=255)
    ap.add_argument("--skip-one-thread", action="store_true")
    args = ap.parse_args()

    import shap
    from forest import GBDTRegressor
    from forest.engine.treeshap import count_fractions, shap_tree_dicts
    from native.comm import SelfCommunicator

    print(f"load average before: {os.getloadavg()}")
    X, y = design(args.rows)
    Xe = np.ascontiguousarray(X[:args.explain_rows])
    t0 = time.perf_counter()
    est = GBDTRegressor(n_estimators=args.trees, max_leaf_nodes=args.leaves, learning_rate=0.1, early_stopping=False,
                        random_state=0, n_threads=2).fit(X, y, comm=SelfCommunicator())
    packed = est._packed_forest()
    leaves = packed["feature"] < 0
    print(f"fit: {time.perf_counter() - t0:.1f} s; {args.trees} trees, {int(leaves.sum()) / args.trees:.0f} leaves "
          f"per tree, mean leaf depth {packed['depth'][leaves].mean():.1f}, max depth {packed['depth'].max()}")

    est.shap_values(Xe[:50])                      # compile / load the kernels
    timings = {}
    for threads in ((2,) if args.skip_one_thread else (2, 1)):
        est.set_params(n_threads=threads)
        t0 = time.perf_counter()
        ours = est.shap_values(Xe)
        timings[threads] = time.perf_counter() - t0
        print(f"ours, {threads} thread(s): {timings[threads]:.1f} s for {len(Xe)} rows "
              f"({timings[threads] / len(Xe) * 1e3:.3f} ms/row)")
    add = np.abs(ours.sum(axis=1) - est.predict(Xe)).max()
    print(f"ours: largest |row sum - predict| = {add:.2e}")

    frac = count_fractions(packed)
    explainer = shap.TreeExplainer({"trees": shap_tree_dicts(packed, frac, root_cover=float(packed["count"][0]))})
    Xs = Xe[:args.shap_rows]
    t0 = time.perf_counter()
    theirs = np.asarray(explainer.shap_values(Xs))
    t_shap = time.perf_counter() - t0
    per_row = t_shap / len(Xs)
    print(f"shap {shap.__version__} TreeExplainer (same trees): {t_shap:.1f} s for {len(Xs)} rows "
          f"({per_row * 1e3:.3f} ms/row; {per_row * len(Xe):.0f} s for {len(Xe)} rows at that rate)")
    diff = np.abs(ours[:len(Xs), :-1] - theirs).max()
    base = abs(float(ours[0, -1]) - (float(np.ravel(explainer.expected_value)[0]) + float(est.baseline_[0])))
    print(f"largest |ours - shap| = {diff:.2e} (contributions), {base:.2e} (base value)")
    for threads, t in timings.items():
        print(f"speed-up over shap, ours with {threads} thread(s): {per_row * len(Xe) / t:.1f}x")

    try:
        import lightgbm as lgb
    except ImportError:
        print("lightgbm not installed: no context figure")
        return
    model = lgb.LGBMRegressor(n_estimators=args.trees, num_leaves=args.leaves, learning_rate=0.1, max_bin=255,
                              min_child_samples=20, n_jobs=2, verbose=-1).fit(X, y)
    model.predict(Xe[:50], pred_contrib=True)
    t0 = time.perf_counter()
    model.predict(Xe, pred_contrib=True)
    t_lgb = time.perf_counter() - t0
    print(f"LightGBM {lgb.__version__} pred_contrib (its own trees), 2 threads: {t_lgb:.1f} s for {len(Xe)} rows "
          f"({t_lgb / len(Xe) * 1e3:.3f} ms/row)")
    print(f"load average after: {os.getloadavg()}; numba threads available: {numba.config.NUMBA_NUM_THREADS}")


if __name__ == "__main__":
    main()

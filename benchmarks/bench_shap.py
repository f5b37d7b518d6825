"""TreeSHAP benchmark (issue 35): our ``shap_values`` against shap's TreeExplainer on the same trees.

A GBDTRegressor of ``--trees`` trees of ``--leaves`` leaves (learning rate 0.1, no early
stopping) is fitted on ``--rows`` rows of a 20-feature design with interactions and 5 %
missing values (``--model-cache DIR`` keeps the fitted model between runs: the fit is
the slow part). Then the ``--explain-rows`` rows are cut into ``--chunks`` chunks and,
chunk by chunk (so that the load of a shared machine falls on every contender alike):

* ours, 1 Numba thread: ``est.shap_values(chunk)``;
* ours, 2 Numba threads: the same;
* shap, one thread: ``shap.TreeExplainer({"trees": shap_tree_dicts(...)})`` (the same
  trees, covers and values; shap's compiled path-dependent algorithm) on the chunk's
  first ``--shap-rows`` rows. shap's cost is linear in the rows (each row is its own
  walk of every tree), so its time for all the rows is its time per row times the rows:
  an extrapolation, printed as such. ``--shap-rows 0`` runs shap on every row.

Compilation is not timed (warm-up calls with 1 and 2 threads first). Also printed: the
largest absolute difference between ours and shap on the rows shap explained, the
largest additivity error of ours (row sums against ``predict``) on all rows, one-row
latencies, and, for context, LightGBM's ``predict(pred_contrib=True)`` with the same
settings on the first ``--lightgbm-rows`` rows (its own trees, so not the same numbers;
1 and 2 threads; ``--no-lightgbm`` skips it).

Usage::

    PYTHONPATH=. /work/main/.venv-bench/bin/python benchmarks/bench_shap.py --model-cache /tmp/bench_shap
    PYTHONPATH=. /work/main/.venv-bench/bin/python benchmarks/bench_shap.py --rows 20000 --explain-rows 4000 \
        --chunks 4 --shap-rows 100 --no-lightgbm      # quick

Prints one line per measurement; the figures go into RESULTS.md by hand.
"""
import argparse
import os
import pickle
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


def fitted_model(args, X, y):
    from forest import GBDTRegressor
    from native.comm import SelfCommunicator

    path = None
    if args.model_cache:
        os.makedirs(args.model_cache, exist_ok=True)
        path = os.path.join(args.model_cache, f"gbdt_{args.rows}_{args.trees}_{args.leaves}.pkl")
        if os.path.exists(path):
            with open(path, "rb") as fh:
                print(f"model: {path} (cached)")
                return pickle.load(fh)
    t0 = time.perf_counter()
    est = GBDTRegressor(n_estimators=args.trees, max_leaf_nodes=args.leaves, learning_rate=0.1, early_stopping=False,
                        random_state=0, n_threads=2).fit(X, y, comm=SelfCommunicator())
    print(f"fit: {time.perf_counter() - t0:.1f} s")
    if path:
        with open(path, "wb") as fh:
            pickle.dump(est, fh)
    return est


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--explain-rows", type=int, default=100_000)
    ap.add_argument("--chunks", type=int, default=20)
    ap.add_argument("--shap-rows", type=int, default=200, help="rows per chunk shap explains (0: all)")
    ap.add_argument("--trees", type=int, default=100)
    ap.add_argument("--leaves", type=int, default=255)
    ap.add_argument("--model-cache", default=None, help="directory to keep the fitted model in")
    ap.add_argument("--no-lightgbm", action="store_true")
    ap.add_argument("--lightgbm-rows", type=int, default=2_000, help="rows LightGBM's pred_contrib explains")
    args = ap.parse_args()

    import shap
    from forest.engine.treeshap import PARALLEL_MIN_ROWS, count_fractions, shap_tree_dicts

    print(f"load average before: {os.getloadavg()}")
    X, y = design(args.rows)
    Xe = np.ascontiguousarray(X[:args.explain_rows])
    est = fitted_model(args, X, y)
    packed = est._packed_forest()
    leaves = packed["feature"] < 0
    print(f"model: {args.trees} trees, {int(leaves.sum()) / args.trees:.0f} leaves per tree, mean leaf depth "
          f"{packed['depth'][leaves].mean():.1f}, max depth {packed['depth'].max()}")
    frac = count_fractions(packed)
    explainer = shap.TreeExplainer({"trees": shap_tree_dicts(packed, frac, root_cover=float(packed["count"][0]))})

    for threads in (1, 2):                        # compile / load the kernels, the threaded one too
        est.set_params(n_threads=threads)
        est.shap_values(Xe[:2 * PARALLEL_MIN_ROWS])
    explainer.shap_values(Xe[:5])
    ours = np.empty((len(Xe), Xe.shape[1] + 1))
    t_ours = {1: 0.0, 2: 0.0}
    t_shap = 0.0
    shap_rows = []
    theirs = []
    for chunk in np.array_split(np.arange(len(Xe)), args.chunks):
        Xc = Xe[chunk]
        for threads in (1, 2):
            est.set_params(n_threads=threads)
            t0 = time.perf_counter()
            got = est.shap_values(Xc)
            t_ours[threads] += time.perf_counter() - t0
            if threads == 1:
                ours[chunk] = got
            else:
                assert np.array_equal(got, ours[chunk])        # threads change no bit
        take = chunk if args.shap_rows <= 0 else chunk[:args.shap_rows]
        t0 = time.perf_counter()
        theirs.append(np.asarray(explainer.shap_values(Xe[take])))
        t_shap += time.perf_counter() - t0
        shap_rows.append(take)
    shap_rows = np.concatenate(shap_rows)
    theirs = np.concatenate(theirs)
    n = len(Xe)
    per_row = t_shap / len(shap_rows)
    shap_all = per_row * n
    for threads, t in t_ours.items():
        print(f"ours, {threads} thread(s): {t:.1f} s for {n} rows ({t / n * 1e3:.4f} ms/row)")
    how = "measured" if len(shap_rows) == n else f"extrapolated from {len(shap_rows)} rows"
    print(f"shap {shap.__version__} TreeExplainer (same trees), 1 thread: {t_shap:.1f} s for {len(shap_rows)} rows "
          f"({per_row * 1e3:.3f} ms/row; {shap_all:.0f} s for {n} rows, {how})")
    for threads, t in t_ours.items():
        print(f"speed-up over shap (1 thread), ours with {threads} thread(s): {shap_all / t:.1f}x")

    diff = np.abs(ours[shap_rows, :-1] - theirs).max()
    base = abs(float(ours[0, -1]) - (float(np.ravel(explainer.expected_value)[0]) + float(est.baseline_[0])))
    print(f"largest |ours - shap| over {len(shap_rows)} rows = {diff:.2e} (contributions), {base:.2e} (base value)")
    add = np.abs(ours.sum(axis=1) - est.predict(Xe)).max()
    print(f"ours: largest |row sum - predict| over {n} rows = {add:.2e}")

    est.set_params(n_threads=1)
    lat = {"ours": [], "shap": []}
    for i in range(10):
        t0 = time.perf_counter()
        est.shap_values(Xe[i:i + 1])
        lat["ours"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        explainer.shap_values(Xe[i:i + 1])
        lat["shap"].append(time.perf_counter() - t0)
    print("one row, 1 thread, median of 10: " + ", ".join(f"{k} {np.median(v) * 1e3:.1f} ms" for k, v in lat.items()))

    if args.no_lightgbm:
        print(f"load average after: {os.getloadavg()}")
        return
    try:
        import lightgbm as lgb
    except ImportError:
        print("lightgbm not installed: no context figure")
        return
    model = lgb.LGBMRegressor(n_estimators=args.trees, num_leaves=args.leaves, learning_rate=0.1, max_bin=255,
                              min_child_samples=20, n_jobs=2, verbose=-1).fit(X, y)
    model.predict(Xe[:50], pred_contrib=True)
    Xl = Xe[:args.lightgbm_rows]
    for jobs in (1, 2):
        t0 = time.perf_counter()
        model.predict(Xl, pred_contrib=True, num_threads=jobs)
        t_lgb = time.perf_counter() - t0
        print(f"LightGBM {lgb.__version__} pred_contrib (its own trees), {jobs} thread(s): {t_lgb:.1f} s for "
              f"{len(Xl)} rows ({t_lgb / len(Xl) * 1e3:.4f} ms/row)")
    print(f"load average after: {os.getloadavg()}; numba threads available: {numba.config.NUMBA_NUM_THREADS}")


if __name__ == "__main__":
    main()

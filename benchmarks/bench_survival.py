"""SurvivalForest (issue 33) against scikit-survival's RandomSurvivalForest.

Real data (the sets scikit-survival ships: GBSG2, WHAS500, FLCHAIN, veterans, AIDS):
repeated random 75/25 splits (stratified by the event flag), the same tree count for
both, 2 threads each. Held-out Harrell's concordance of the risk scores
(``sksurv.metrics.concordance_index_censored``) and the integrated Brier score of the
survival curves at the 10th..80th percentiles of the test times
(``sksurv.metrics.integrated_brier_score``; both forests' curves at the same times).
Targets: concordance within 0.01 of the anchor or better, IBS <= 1.05x the anchor's.

Inputs: ours takes the tables as they are (pandas ``category`` columns are categorical
features, NaN is missing); the anchor cannot, so it gets one-hot columns
(``sksurv.preprocessing.OneHotEncoder``) and NaN replaced by the training median
(FLCHAIN's ``chapter`` and ``creatinine``).

Speed: a simulated design (exponential failures, rate ``exp(x0 + 0.5 [x1 > 0] - 0.5
x2^2)``, 10 uniform features, about 30 % censored) at ``--speed-rows`` rows, both with
``--speed-trees`` trees; target: our fit >= 10x faster. The anchor runs with
``low_memory=True`` there (without it each leaf stores curves over every distinct time,
which at 100k rows does not fit in memory).

Our forest is also fitted with grf's ``alpha=0.05`` on the same splits (why the default is
0), and, with ``--grid-sweep``, with 8 .. 128 failure-grid times (``max_split_times``, the
default's measurement), timed on the simulated design too.

Run (anchors venv with scikit-survival): ``python benchmarks/bench_survival.py [--trees 200]
[--repeats 5] [--speed-rows 100000] [--speed-trees 50] [--grid-sweep]``. Writes the
"SurvivalForest (issue 33)" section of RESULTS.md unless ``--no-write``.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402

SECTION = "SurvivalForest (issue 33)"
DATASETS = ("gbsg2", "whas500", "flchain", "veterans", "aids")


def load(name):
    """``(X DataFrame, time, event)`` of one of scikit-survival's bundled data sets."""
    from sksurv import datasets
    loader = {"gbsg2": datasets.load_gbsg2, "whas500": datasets.load_whas500, "flchain": datasets.load_flchain,
              "veterans": datasets.load_veterans_lung_cancer, "aids": datasets.load_aids}[name]
    X, y = loader()
    event_field, time_field = y.dtype.names
    return X, y[time_field].astype(float), y[event_field].astype(bool)


def anchor_matrix(X_train, X_test):
    """One-hot, median-imputed float matrices for the anchor."""
    from sksurv.preprocessing import OneHotEncoder
    enc = OneHotEncoder().fit(X_train)
    A, B = enc.transform(X_train).astype(float), enc.transform(X_test).astype(float)
    med = A.median()
    return A.fillna(med).to_numpy(), B.fillna(med).to_numpy()


def structured(time_, event):
    from sksurv.util import Surv
    return Surv.from_arrays(event=event, time=time_)


def eval_times(t_train, t_test):
    lo, hi = np.percentile(t_test, [10, 80])
    grid = np.unique(np.percentile(t_test, np.linspace(10, 80, 15)))
    return grid[(grid > t_train.min()) & (grid < t_train.max()) & (grid >= lo) & (grid <= hi)]


def fit_ours(X, t, e, trees, seed, **params):
    from forest import SurvivalForest
    t0 = time.perf_counter()
    f = SurvivalForest(trees, random_state=seed, **params).fit(X, t, e)
    return f, time.perf_counter() - t0


def fit_anchor(A, t, e, trees, seed, threads, low_memory=False):
    from sksurv.ensemble import RandomSurvivalForest
    t0 = time.perf_counter()
    f = RandomSurvivalForest(n_estimators=trees, n_jobs=threads, random_state=seed, low_memory=low_memory)
    f.fit(A, structured(t, e))
    return f, time.perf_counter() - t0


def scores(risk, surv, t_tr, e_tr, t_te, e_te, times):
    from sksurv.metrics import concordance_index_censored, integrated_brier_score
    c = concordance_index_censored(e_te, t_te, risk)[0]
    # the censoring distribution is estimated from the training rows, so test rows past
    # the last training time cannot be scored (both forests lose the same rows)
    keep = t_te < t_tr.max()
    ibs = integrated_brier_score(structured(t_tr, e_tr), structured(t_te[keep], e_te[keep]), surv[keep], times)
    return c, ibs


def real_data(name, trees, repeats, threads, variants=None):
    """Means over the splits of both forests, and of ours under each of ``variants`` (label -> parameters)."""
    from sklearn.model_selection import train_test_split
    X, t, e = load(name)
    out = {k: [] for k in ("c_ours", "c_anchor", "ibs_ours", "ibs_anchor", "fit_ours", "fit_anchor")}
    variants = variants or {}
    sweep = {g: {"c": [], "ibs": []} for g in variants}
    for r in range(repeats):
        tr, te = train_test_split(np.arange(len(t)), test_size=0.25, stratify=e, random_state=r)
        times = eval_times(t[tr], t[te])
        f, fit = fit_ours(X.iloc[tr], t[tr], e[tr], trees, r)
        c, ibs = scores(f.predict(X.iloc[te]), f.predict_survival_function(X.iloc[te], times), t[tr], e[tr], t[te],
                        e[te], times)
        out["c_ours"].append(c), out["ibs_ours"].append(ibs), out["fit_ours"].append(fit)
        A, B = anchor_matrix(X.iloc[tr], X.iloc[te])
        g, fit = fit_anchor(A, t[tr], e[tr], trees, r, threads)
        surv = np.vstack([fn(times) for fn in g.predict_survival_function(B)])
        c, ibs = scores(g.predict(B), surv, t[tr], e[tr], t[te], e[te], times)
        out["c_anchor"].append(c), out["ibs_anchor"].append(ibs), out["fit_anchor"].append(fit)
        for label, params in variants.items():
            f, _ = fit_ours(X.iloc[tr], t[tr], e[tr], trees, r, **params)
            c, ibs = scores(f.predict(X.iloc[te]), f.predict_survival_function(X.iloc[te], times), t[tr], e[tr],
                            t[te], e[te], times)
            sweep[label]["c"].append(c), sweep[label]["ibs"].append(ibs)
    row = {k: float(np.mean(v)) for k, v in out.items()}
    row.update(name=name, n=len(t), events=float(e.mean()), distinct=len(np.unique(t[e])))
    return row, {g: (float(np.mean(v["c"])), float(np.mean(v["ibs"]))) for g, v in sweep.items()}


def simulated(n, seed=0, p=10):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, p))
    rate = np.exp(X[:, 0] + 0.5 * (X[:, 1] > 0) - 0.5 * X[:, 2] ** 2)
    failure = rng.exponential(1 / rate)
    censor = rng.exponential(2.5, n)
    return X, np.minimum(failure, censor), failure <= censor


def speed(n, trees, threads, grid_sizes=(), anchor=True):
    X, t, e = simulated(n + 20000)
    X, Xt, t, tt, e, et = X[:n], X[n:], t[:n], t[n:], e[:n], e[n:]
    from sksurv.metrics import concordance_index_censored
    f, fit = fit_ours(X, t, e, trees, 0)
    t0 = time.perf_counter()
    risk = f.predict(Xt)
    pred = time.perf_counter() - t0
    row = dict(n=n, trees=trees, fit_ours=fit, pred_ours=pred, c_ours=concordance_index_censored(et, tt, risk)[0])
    if anchor:
        g, fit = fit_anchor(X, t, e, trees, 0, threads, low_memory=True)
        t0 = time.perf_counter()
        risk = g.predict(Xt)
        row.update(fit_anchor=fit, pred_anchor=time.perf_counter() - t0,
                   c_anchor=concordance_index_censored(et, tt, risk)[0])
    sweep = {}
    for size in grid_sizes:
        f, fit = fit_ours(X, t, e, trees, 0, max_split_times=size)
        sweep[size] = (fit, concordance_index_censored(et, tt, f.predict(Xt))[0])
    return row, sweep


def warm_up():
    """Compile our kernels before timing (the figures are warm-cache fits)."""
    import pandas as pd
    # 30k rows: large enough for the level-wise histogram path as well as the subtree kernel
    X, t, e = simulated(30000, seed=9)
    frame = pd.DataFrame(X[:, :3], columns=["a", "b", "c"]).assign(k=pd.Categorical(np.arange(30000) % 3))
    for data in (X, frame):
        f, _ = fit_ours(data, t, e, 4, 0)
        f.predict_survival_function(data[:50] if isinstance(data, np.ndarray) else data.iloc[:50])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--datasets", nargs="*", default=list(DATASETS))
    ap.add_argument("--speed-rows", type=int, default=100_000)
    ap.add_argument("--speed-trees", type=int, default=50)
    ap.add_argument("--grid-sweep", action="store_true")
    ap.add_argument("--no-anchor-speed", action="store_true", help="time ours only at --speed-rows")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    warm_up()
    variants = {"alpha=0.05 (grf)": dict(alpha=0.05)}
    if args.grid_sweep:
        variants.update({f"G={g}": dict(max_split_times=g) for g in (8, 16, 32, 64, 128)})
    rows, sweeps = [], {}
    for name in args.datasets:
        row, sweep = real_data(name, args.trees, args.repeats, args.threads, variants)
        rows.append(row)
        sweeps[name] = sweep
        print(row, sweep, flush=True)
    table = markdown_table(
        ["data", "rows", "events", "distinct failure times", "C ours", "C sksurv", "C diff", "IBS ours", "IBS sksurv",
         "IBS ratio", "fit s ours", "fit s sksurv"],
        [[r["name"], r["n"], f"{r['events']:.2f}", r["distinct"], f"{r['c_ours']:.4f}", f"{r['c_anchor']:.4f}",
          f"{r['c_ours'] - r['c_anchor']:+.4f}", f"{r['ibs_ours']:.4f}", f"{r['ibs_anchor']:.4f}",
          f"{r['ibs_ours'] / r['ibs_anchor']:.3f}", f"{r['fit_ours']:.2f}", f"{r['fit_anchor']:.2f}"] for r in rows])
    body = []
    if rows:
        body = [f"Real data: {args.repeats} random 75/25 splits (stratified by event), {args.trees} trees each, "
                f"{args.threads} threads each; means over the splits.\n", table]
    if args.speed_rows:
        srow, ssweep = speed(args.speed_rows, args.speed_trees, args.threads,
                             (16, 32, 64, 128) if args.grid_sweep else (), anchor=not args.no_anchor_speed)
        print(srow, ssweep, flush=True)
        body += [f"\nSpeed: simulated design, {srow['n']} training rows, {srow['trees']} trees each, "
                 f"{args.threads} threads each, anchor with low_memory=True; held-out concordance on 20,000 rows.\n",
                 markdown_table(["", "fit s", "predict s (risk, 20k rows)", "C"],
                                [["ours", f"{srow['fit_ours']:.2f}", f"{srow['pred_ours']:.2f}",
                                  f"{srow['c_ours']:.4f}"]]
                                + ([["scikit-survival", f"{srow['fit_anchor']:.2f}", f"{srow['pred_anchor']:.2f}",
                                     f"{srow['c_anchor']:.4f}"]] if "fit_anchor" in srow else []))]
        if "fit_anchor" in srow:
            body += [f"\nFit speed-up: {srow['fit_anchor'] / srow['fit_ours']:.1f}x.\n"]
        if ssweep:
            body += ["\nFailure grid size on the simulated design (fit s, C):\n",
                     markdown_table(["max_split_times", "fit s", "C"],
                                    [[g, f"{v[0]:.2f}", f"{v[1]:.4f}"] for g, v in ssweep.items()])]
    if rows:
        body += ["\nOur forest with other parameters (mean C / IBS over the same splits; defaults: alpha=0, "
                 "max_split_times=32):\n",
                 markdown_table(["data"] + list(variants),
                                [[name] + [f"{sweeps[name][v][0]:.4f} / {sweeps[name][v][1]:.4f}" for v in variants]
                                 for name in args.datasets])]
    text = "\n".join(body)
    print(text)
    if not args.no_write:
        write_results_section(SECTION, text)


if __name__ == "__main__":
    main()

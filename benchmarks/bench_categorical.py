"""Categorical features (issue 32): native category-subset splits against their alternatives.

Two parts, each ratio from one run on the same machine:

* ``causal``: a causal forest whose effect depends on a 40-level categorical through a
  set of its levels (14 of 40 add 2 to the effect) plus a numeric effect, confounded
  treatment. Our CausalForest on the native categorical column, the same forest on the
  column's integer codes, and EconML's ``grf.CausalForest`` on one-hot columns (the
  anchor of benchmarks/bench_causal.py, :func:`anchors.econml_causal_forest_fit`, which does not
  centre y and t, so the confounding biases it) and, with ``--dml``, EconML's
  ``CausalForestDML`` (cross-fitted gradient-boosting nuisances: the fair anchor on a
  confounded design); RMSE of the effect on held-out rows at n = 20k and 200k. Targets:
  native <= 0.7x integer codes and <= 0.8x EconML.
* ``gbdt``: binary classification with a 200-level and a 1,000-level categorical
  (Zipf-like level frequencies, a random log-odds per level) plus five numeric
  features; our GBDTClassifier on the native columns against LightGBM with
  ``categorical_feature`` (its defaults otherwise), 100 trees of 31 leaves, 255 bins.
  Targets: test AUC within 0.002 of LightGBM's, fit time <= 1.2x. Our 1,000-level column
  keeps one code per level (wide codes, uint16); the extra LightGBM column folds it to 255
  codes (254 most frequent + "other", what we did before wide codes) to show what folding costs.

Run (anchors venv): ``.venv-bench/bin/python benchmarks/bench_categorical.py
[--parts causal gbdt] [--sizes 20000 200000] [--gbdt-rows 200000] [--threads 2]``.
Writes the "Categorical features (issue 32)" section of RESULTS.md unless ``--no-write``.
"""
import argparse
import os
import sys
import time

import numpy as np
import pandas as pd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402
import anchors  # noqa: E402

SECTION = "Categorical features (issue 32)"


def causal_design(n, seed, levels=40):
    """``(frame, codes, onehot_numeric, t, y, tau)`` of the set-of-levels causal design."""
    rng = np.random.default_rng(seed)
    names = np.array([f"level{i:02d}" for i in range(levels)])
    cat = rng.integers(0, levels, n)
    chosen = np.random.default_rng(1234).choice(levels, 14, replace=False)
    in_set = np.isin(cat, chosen)
    x = rng.normal(size=(n, 5))
    tau = 1.0 + 2.0 * in_set + 0.5 * x[:, 0]
    e = 1.0 / (1.0 + np.exp(-0.8 * x[:, 1]))
    t = (rng.random(n) < e).astype(np.float64)
    y = x[:, 1] + 0.5 * x[:, 2] + tau * t + rng.normal(size=n)
    frame = pd.DataFrame({"c": pd.Categorical(names[cat], categories=names),
                          **{f"x{j}": x[:, j] for j in range(5)}})
    codes = frame.assign(c=cat.astype(np.float64))
    onehot = np.column_stack([(cat[:, None] == np.arange(levels)).astype(np.float64), x])
    return frame, codes, onehot, t, y, tau


def _econml_dml(X, t, y, X_test, tau_test, trees, threads, seed):
    """EconML's ``CausalForestDML`` (centred by cross-fitted nuisance models, as grf does) on
    one-hot columns: the anchor that, unlike ``grf.CausalForest``, corrects the confounding."""
    from econml.dml import CausalForestDML
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor

    start = time.perf_counter()
    model = CausalForestDML(model_y=HistGradientBoostingRegressor(), model_t=HistGradientBoostingClassifier(),
                            discrete_treatment=True, n_estimators=trees, min_samples_leaf=5, n_jobs=threads,
                            random_state=seed, inference=False)
    model.fit(y, t, X=X)
    fit_s = time.perf_counter() - start
    pred = np.asarray(model.effect(X_test)).ravel()
    return float(np.sqrt(np.mean((pred - tau_test) ** 2))), fit_s


def run_causal(sizes, threads, trees, seed=0, dml=False):
    from forest import CausalForest
    from native.comm import SelfCommunicator

    comm = SelfCommunicator()
    rows = []
    for n in sizes:
        frame, codes, onehot, t, y, tau = causal_design(n + 10_000, seed)
        tr, te = slice(0, n), slice(n, None)
        kw = dict(n_estimators=trees, random_state=seed)
        start = time.perf_counter()
        native = CausalForest(**kw).fit(frame.iloc[tr], t[tr], y[tr], comm=comm)
        native_s = time.perf_counter() - start
        rmse_native = float(np.sqrt(np.mean((native.predict(frame.iloc[te]) - tau[te]) ** 2)))
        start = time.perf_counter()
        ints = CausalForest(categorical_features=None, **kw).fit(codes.iloc[tr], t[tr], y[tr], comm=comm)
        ints_s = time.perf_counter() - start
        rmse_ints = float(np.sqrt(np.mean((ints.predict(codes.iloc[te]) - tau[te]) ** 2)))
        model, econ_s = anchors.econml_causal_forest_fit(onehot[tr], t[tr], y[tr], threads=threads,
                                                         n_estimators=trees, seed=seed)
        pred, _ = anchors.econml_causal_forest_predict(model, onehot[te])
        rmse_econ = float(np.sqrt(np.mean((pred - tau[te]) ** 2)))
        row = [n, rmse_native, rmse_ints, rmse_econ, rmse_native / rmse_ints, rmse_native / rmse_econ,
               native_s, ints_s, econ_s]
        if dml:
            rmse_dml, dml_s = _econml_dml(onehot[tr], t[tr], y[tr], onehot[te], tau[te], trees, threads, seed)
            row += [rmse_dml, rmse_native / rmse_dml, dml_s]
            print(f"  EconML CausalForestDML one-hot: RMSE {rmse_dml:.4f}, fit {dml_s:.1f} s", flush=True)
        rows.append(row)
        print(f"causal n={n}: RMSE native {rmse_native:.4f}, integer codes {rmse_ints:.4f}, EconML one-hot "
              f"{rmse_econ:.4f}; fit {native_s:.1f} / {ints_s:.1f} / {econ_s:.1f} s", flush=True)
    return rows


def gbdt_design(n, seed):
    """Binary labels driven by a 200- and a 1,000-level categorical plus numeric features."""
    rng = np.random.default_rng(seed)
    effects = np.random.default_rng(99)
    cols, logit = {}, np.zeros(n)
    for name, levels in (("c200", 200), ("c1000", 1000)):
        weights = 1.0 / np.arange(1, levels + 1) ** 0.8
        cat = rng.choice(levels, n, p=weights / weights.sum())
        logit += effects.normal(scale=1.0, size=levels)[cat]
        cols[name] = cat
    x = rng.normal(size=(n, 5))
    logit += x[:, 0] - 0.5 * x[:, 1] + 0.5 * x[:, 2] * x[:, 3]
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(logit - logit.mean())))).astype(np.int64)
    codes = np.column_stack([cols["c200"], cols["c1000"], x]).astype(np.float64)
    frame = pd.DataFrame({"c200": pd.Categorical(cols["c200"]), "c1000": pd.Categorical(cols["c1000"]),
                          **{f"x{j}": x[:, j] for j in range(5)}})
    return frame, codes, y


def run_gbdt(n, threads, repeats=3, seed=0):
    import lightgbm as lgb
    from sklearn.metrics import roc_auc_score

    from forest import GBDTClassifier
    from native.comm import SelfCommunicator

    comm = SelfCommunicator()
    frame, codes, y = gbdt_design(n + 50_000, seed)
    tr, te = slice(0, n), slice(n, None)
    params, n_trees = anchors.lightgbm_gbdt_params(threads=threads)
    ours_t, lgb_t = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        ours = GBDTClassifier(n_estimators=n_trees, max_leaf_nodes=31, early_stopping=False, random_state=seed,
                              n_threads=threads).fit(frame.iloc[tr], y[tr], comm=comm)
        ours_t.append(time.perf_counter() - start)
        start = time.perf_counter()
        data = lgb.Dataset(codes[tr], label=y[tr], categorical_feature=[0, 1],
                           params={"max_bin": params["max_bin"], "verbosity": -1}, free_raw_data=True)
        booster = lgb.train(params, data, num_boost_round=n_trees)
        lgb_t.append(time.perf_counter() - start)
        print(f"  fit {len(lgb_t)}: ours {ours_t[-1]:.2f} s, LightGBM {lgb_t[-1]:.2f} s", flush=True)
    auc_ours = float(roc_auc_score(y[te], ours.predict_proba(frame.iloc[te])[:, 1]))
    auc_lgb = float(roc_auc_score(y[te], booster.predict(codes[te])))
    # LightGBM on the 1,000-level column folded to 255 codes (254 most frequent + "other", our
    # coding before wide codes): what folding costs, apart from the split rule.
    from histogram.categories import fold_codes

    folded = codes.copy()
    col = folded[:, 1].astype(np.int64)
    folded[:, 1] = fold_codes(np.bincount(col[tr], minlength=1000), 255)[col]
    data = lgb.Dataset(folded[tr], label=y[tr], categorical_feature=[0, 1],
                       params={"max_bin": params["max_bin"], "verbosity": -1}, free_raw_data=True)
    auc_folded = float(roc_auc_score(y[te], lgb.train(params, data, num_boost_round=n_trees).predict(folded[te])))
    ours_s, lgb_s = float(np.median(ours_t)), float(np.median(lgb_t))
    print(f"gbdt n={n}: AUC ours {auc_ours:.4f} LightGBM {auc_lgb:.4f}; fit {ours_s:.2f} s vs {lgb_s:.2f} s "
          f"({ours_s / lgb_s:.2f}x); our codes {ours.bin_mapper_.bin_dtype_}, bin axis {ours.bin_mapper_.n_bins_}",
          flush=True)
    return [[n, auc_ours, auc_lgb, auc_ours - auc_lgb, auc_folded, ours_s, lgb_s, ours_s / lgb_s]]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", default=["causal", "gbdt"], choices=["causal", "gbdt"])
    ap.add_argument("--sizes", nargs="+", type=int, default=[20_000, 200_000])
    ap.add_argument("--trees", type=int, default=200)
    ap.add_argument("--gbdt-rows", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dml", action="store_true", help="also EconML's CausalForestDML (cross-fitted nuisances)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    blocks = []
    if "causal" in args.parts:
        rows = run_causal(args.sizes, args.threads, args.trees, dml=args.dml)
        extra = ["RMSE EconML DML", "native/DML", "fit DML s"] if args.dml else []
        blocks.append("Causal forest, effect through 14 of a 40-level categorical's levels (+0.5 x0), "
                      f"{args.trees} trees, RMSE of tau on 10,000 held-out rows (targets: native / integer codes "
                      "<= 0.7, native / EconML one-hot <= 0.8):\n\n" + markdown_table(
                          ["rows", "RMSE native", "RMSE integer codes", "RMSE EconML one-hot", "native/codes",
                           "native/EconML", "fit native s", "fit codes s", "fit EconML s"] + extra, rows))
    if "gbdt" in args.parts:
        rows = run_gbdt(args.gbdt_rows, args.threads, args.repeats)
        blocks.append("GBDT binary classification, a 200-level and a 1,000-level categorical (Zipf-like "
                      "frequencies) + 5 numeric features, 100 trees x 31 leaves, 255 bins, median of "
                      f"{args.repeats} fits, AUC on 50,000 held-out rows (targets: |AUC difference| <= 0.002, "
                      "fit <= 1.2x LightGBM):\n\n" + markdown_table(
                          ["rows", "AUC ours", "AUC LightGBM", "difference", "AUC LightGBM, c1000 folded to 255",
                           "fit ours s", "fit LightGBM s", "ratio"], rows))
    if not args.no_write and blocks:
        write_results_section(SECTION, "\n\n".join(blocks))


if __name__ == "__main__":
    main()

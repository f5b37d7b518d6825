"""Causal-analysis toolkit benchmark (issue 13): coverage, EconML side by side, real data.

Parts (each in its own process through ``_harness.run_contender``; a failure is
recorded and the rest go on):

1. ``coverage``: ``R`` replications (default 50) of ``forest.simulate.linear_confounded``
   (n = 2000, d = 5; e(x) = 0.2 + 0.6 x0, tau(x) = 1 + 3 x0 - x1): share of the 95%
   intervals that cover the population value, for the average effect on all rows
   (2.0), the treated (2.3), the controls (1.7), the overlap-weighted effect, the
   three best-linear-projection coefficients on (x0, x1) (1, 3, -1) and RATE (AUTOC
   0.75, QINI 0.25) of the fixed priority rule S(x) = x0 on the out-of-bag scores.
   Target: >= 0.90 each. Also the mean standard error against the spread of the
   estimates over replications.
2. ``clusters``: the same design with 40 clusters whose effects are shifted by a
   cluster-level N(0, 0.8^2): coverage of the ATE's interval (truth: the mean
   effect of the population of clusters, 2.0) with and without ``clusters=``.
3. ``econml``: one data set (train 4000 / validation 4000 rows of the same design):
   histforest's estimates next to EconML's ``CausalForestDML.ate_`` / ``att_`` (with
   standard errors, on the training rows) and ``econml.validate.DRTester``'s BLP (DR
   outcome on the CATE prediction), calibration R^2 and Qini/TOC coefficients
   (validation rows), for the CATE models of both libraries.
4. ``real``: public data with published answers, vendored in ``benchmarks/data``
   (see ``benchmarks/data/README.md``):
   NSW (LaLonde 1986; Dehejia and Wahba 1999 experimental sample, 445 men): the
   experimental estimate of the training effect on 1978 earnings, $1794 (SE 633);
   NHEFS (Hernan and Robins, Causal Inference: What If, ch. 12-13): the effect of
   quitting smoking on weight gain, 3.4 kg (95% CI 2.4 to 4.5) by IP weighting and
   3.5 kg (2.6 to 4.5) by standardisation; the script also recomputes the book's IP
   weighted estimate from the vendored file as a check of the data.

Usage::

    .venv-bench/bin/python benchmarks/bench_analysis.py            # full run, writes RESULTS.md
    .venv-bench/bin/python benchmarks/bench_analysis.py --quick    # 10 replications, no write

The functions named ``contender_*`` run inside the worker processes.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402

SECTION = "Causal analysis toolkit (issue 13)"
THIS = os.path.abspath(__file__)
DATA_DIR = os.path.join(os.path.dirname(THIS), "data")

#: Population values of forest.simulate.linear_confounded (derivations in its docstring).
TRUTH = {"all": 2.0, "treated": 2.3, "control": 1.7, "blp": (1.0, 3.0, -1.0),
         # priority S = x0: TOC(q) = E[tau | x0 >= 1 - q] - 2 = 1.5 - 1.5 q
         "AUTOC": 0.75, "QINI": 0.25}


def _overlap_truth(n=2_000_000, seed=99):
    from forest import simulate

    d = simulate.linear_confounded(n, seed=seed)
    v = d.e * (1 - d.e)
    return float(np.sum(v * d.tau) / np.sum(v))


def _forest(trees, seed, **extra):
    from forest import CausalForest

    return CausalForest(trees, random_state=seed, **extra)


def _covers(est, se, truth, z=1.959963984540054):
    return bool(abs(est - truth) <= z * se)


# --------------------------------------------------------------------------- contenders

def contender_coverage(reps, n, trees, threads, n_bootstrap=200, **_):
    """Coverage of every interval over ``reps`` replications."""
    from forest import simulate
    from native.comm import SelfCommunicator

    comm = SelfCommunicator()
    overlap_truth = _overlap_truth()
    names = ["all", "treated", "control", "overlap", "blp0", "blp1", "blp2", "AUTOC", "QINI"]
    truth = [TRUTH["all"], TRUTH["treated"], TRUTH["control"], overlap_truth, *TRUTH["blp"], TRUTH["AUTOC"],
             TRUTH["QINI"]]
    est = np.zeros((reps, len(names)))
    se = np.zeros((reps, len(names)))
    start = time.perf_counter()
    for r in range(reps):
        d = simulate.linear_confounded(n, seed=1000 + r)
        cf = _forest(trees, r).fit(d.X, d.t, d.y, comm=comm)
        for j, target in enumerate(("all", "treated", "control", "overlap")):
            est[r, j], se[r, j] = cf.average_treatment_effect(target, comm=comm)
        blp = cf.best_linear_projection(d.X[:, :2], comm=comm)
        est[r, 4:7], se[r, 4:7] = blp.estimate, blp.stderr
        for j, target in ((7, "AUTOC"), (8, "QINI")):
            res = cf.rank_average_treatment_effect(d.X[:, 0], target=target, n_bootstrap=n_bootstrap, seed=r,
                                                   comm=comm)
            est[r, j], se[r, j] = res.estimate[0], res.stderr[0]
    elapsed = time.perf_counter() - start
    z = 1.959963984540054
    cover = (np.abs(est - np.array(truth)) <= z * se).mean(axis=0)
    rows = {name: {"truth": t, "coverage": float(c), "mean_estimate": float(est[:, j].mean()),
                   "mean_se": float(se[:, j].mean()), "sd_estimate": float(est[:, j].std(ddof=1))}
            for j, (name, t, c) in enumerate(zip(names, truth, cover))}
    return {"fit_s": elapsed / reps, "metrics": {"reps": reps}, "rows": rows}


def contender_clusters(reps, n, trees, threads, n_clusters=40, shift_sd=0.8, **_):
    """ATE coverage with cluster-level effect shifts, with and without ``clusters=``."""
    from forest import simulate
    from native.comm import SelfCommunicator

    comm = SelfCommunicator()
    hits = {"rows": [], "clusters": []}
    ses = {"rows": [], "clusters": []}
    ests = []
    for r in range(reps):
        rng = np.random.default_rng(5000 + r)
        d = simulate.linear_confounded(n, seed=5000 + r)
        labels = rng.integers(0, n_clusters, size=n)
        y = d.y + d.t * shift_sd * rng.normal(size=n_clusters)[labels]
        for kind, cl in (("rows", None), ("clusters", labels)):
            cf = _forest(trees, r).fit(d.X, d.t, y, clusters=cl, comm=comm)
            est, se = cf.average_treatment_effect(comm=comm)
            hits[kind].append(_covers(est, se, TRUTH["all"]))
            ses[kind].append(float(se))
            if kind == "rows":
                ests.append(float(est))
    return {"metrics": {"reps": reps},
            "rows": {k: {"coverage": float(np.mean(hits[k])), "mean_se": float(np.mean(ses[k]))} for k in hits},
            "sd_estimate": float(np.std(ests, ddof=1))}


class _CateAdapter:
    """What DRTester calls on a CATE model: ``effect(X=, T0=, T1=)`` (binary: arm 1 against 0)."""

    def __init__(self, forest):
        self.forest = forest

    def effect(self, X, T0=0, T1=1):
        return self.forest.predict(X)


def contender_econml(n, trees, threads, seed=0, **_):
    """histforest and EconML on one train/validation split."""
    from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
    from econml.dml import CausalForestDML
    from econml.validate import DRTester

    from forest import simulate
    from native.comm import SelfCommunicator

    comm = SelfCommunicator()
    tr = simulate.linear_confounded(n, seed=seed)
    va = simulate.linear_confounded(n, seed=seed + 1)
    out = {}
    t0 = time.perf_counter()
    ours = _forest(trees, seed).fit(tr.X, tr.t, tr.y, comm=comm)
    out["ours_fit_s"] = time.perf_counter() - t0
    for target in ("all", "treated"):
        out[f"ours_{target}"] = [float(v) for v in ours.average_treatment_effect(target, comm=comm)]
    tau_va = ours.predict(va.X)
    held = dict(X=va.X, t=va.t, y=va.y, comm=comm)
    blp = ours.best_linear_projection(tau_va, **held)
    cal = ours.test_calibration(**held)
    out["ours_blp_slope"] = [float(blp.estimate[1]), float(blp.stderr[1])]
    out["ours_calibration"] = [cal.estimate.tolist(), cal.stderr.tolist()]
    for target in ("AUTOC", "QINI"):
        res = ours.rank_average_treatment_effect(tau_va, va.X, va.t, va.y, target=target, comm=comm)
        out[f"ours_{target}"] = [float(res.estimate[0]), float(res.stderr[0])]

    t0 = time.perf_counter()
    dml = CausalForestDML(model_y=RandomForestRegressor(100, min_samples_leaf=10, n_jobs=threads, random_state=seed),
                          model_t=RandomForestClassifier(100, min_samples_leaf=10, n_jobs=threads,
                                                         random_state=seed),
                          discrete_treatment=True, n_estimators=-(-trees // 4) * 4,   # multiple of its subforests
                          n_jobs=threads, random_state=seed)
    dml.fit(tr.y, tr.t.astype(int), X=tr.X)
    out["econml_fit_s"] = time.perf_counter() - t0
    out["econml_all"] = [float(dml.ate_[0] if np.ndim(dml.ate_) else dml.ate_),
                         float(np.ravel(dml.ate_stderr_)[0])]
    out["econml_treated"] = [float(np.ravel(dml.att_(T=1))[0]), float(np.ravel(dml.att_stderr_(T=1))[0])]

    for name, cate in (("ours", _CateAdapter(ours)), ("econml", dml)):
        tester = DRTester(model_regression=RandomForestRegressor(100, min_samples_leaf=10, random_state=seed),
                          model_propensity=RandomForestClassifier(100, min_samples_leaf=10, random_state=seed),
                          cate=cate)
        tester.fit_nuisance(va.X, va.t.astype(int), va.y, tr.X, tr.t.astype(int), tr.y)
        res = tester.evaluate_all(va.X, tr.X)
        out[f"drtester_{name}_blp"] = [float(res.blp.params[0]), float(res.blp.errs[0])]
        out[f"drtester_{name}_cal_r2"] = float(res.cal.cal_r_squared[0])
        out[f"drtester_{name}_qini"] = [float(res.qini.params[0]), float(res.qini.errs[0])]
        out[f"drtester_{name}_autoc"] = [float(res.toc.params[0]), float(res.toc.errs[0])]
    out["truth_sample_ate"] = float(tr.tau.mean())
    out["truth_sample_att"] = float(tr.tau[tr.t == 1].mean())
    return {"metrics": {}, "results": out}


def _nhefs_book_ipw(df):
    """Hernan and Robins' IP-weighted estimate (ch. 12.2): logistic propensity with their covariate set."""
    from sklearn.linear_model import LogisticRegression

    cols = [df.sex, df.race, df.age, df.age ** 2, df.smokeintensity, df.smokeintensity ** 2, df.smokeyrs,
            df.smokeyrs ** 2, df.wt71, df.wt71 ** 2]
    cols += [(df.education == k).astype(float) for k in (2, 3, 4, 5)]
    cols += [(df.exercise == k).astype(float) for k in (1, 2)]
    cols += [(df.active == k).astype(float) for k in (1, 2)]
    Z = np.column_stack(cols)
    Z = (Z - Z.mean(axis=0)) / Z.std(axis=0)
    model = LogisticRegression(penalty=None, max_iter=5000).fit(Z, df.qsmk)
    p = model.predict_proba(Z)[:, 1]
    t, y = df.qsmk.to_numpy(), df.wt82_71.to_numpy()
    w = np.where(t == 1, 1 / p, 1 / (1 - p))
    return float(np.sum(w * t * y) / np.sum(w * t) - np.sum(w * (1 - t) * y) / np.sum(w * (1 - t)))


def contender_real(trees, threads, seeds=5, **_):
    """NSW and NHEFS: our estimates (mean over forest seeds, and the seed spread) with CIs."""
    import pandas as pd

    from native.comm import SelfCommunicator

    comm = SelfCommunicator()
    out = {}
    nsw = pd.read_csv(os.path.join(DATA_DIR, "nsw_dehejia_wahba.csv"))
    feats = ["age", "educ", "black", "hisp", "marr", "nodegree", "re74", "re75"]
    nhefs = pd.read_csv(os.path.join(DATA_DIR, "nhefs_smoking_weight.csv"))
    hfeats = ["sex", "race", "age", "education", "smokeintensity", "smokeyrs", "exercise", "active", "wt71"]
    for name, df, t_col, y_col, cols in (("nsw", nsw, "treat", "re78", feats),
                                         ("nhefs", nhefs, "qsmk", "wt82_71", hfeats)):
        X = df[cols].to_numpy(float)
        t = df[t_col].to_numpy(float)
        y = df[y_col].to_numpy(float)
        res = {target: [] for target in ("all", "treated", "overlap")}
        for s in range(seeds):
            cf = _forest(trees, s).fit(X, t, y, comm=comm)
            for target in res:
                res[target].append([float(v) for v in cf.average_treatment_effect(target, comm=comm)])
        out[name] = {target: np.array(v).tolist() for target, v in res.items()}
        out[name]["difference_in_means"] = float(y[t == 1].mean() - y[t == 0].mean())
        out[name]["n"] = int(len(y))
    out["nhefs"]["book_ipw_recomputed"] = _nhefs_book_ipw(nhefs)
    return {"metrics": {}, "results": out}


# --------------------------------------------------------------------------- tables

def _ok(r):
    return r.get("status") == "ok"


def coverage_table(r, reps):
    if not _ok(r):
        return f"coverage run {r.get('status')}"
    labels = {"all": "ATE (all)", "treated": "ATT (treated)", "control": "ATC (control)",
              "overlap": "overlap-weighted", "blp0": "BLP intercept", "blp1": "BLP x0", "blp2": "BLP x1",
              "AUTOC": "RATE AUTOC (S = x0)", "QINI": "RATE QINI (S = x0)"}
    rows = [[labels[k], f"{v['truth']:.4g}", f"{v['mean_estimate']:.4g}", f"{v['mean_se']:.4g}",
             f"{v['sd_estimate']:.4g}", f"{v['coverage']:.2f}"] for k, v in r["rows"].items()]
    return _harness.markdown_table(["estimand", "truth", "mean estimate", "mean SE", "SD of estimates",
                                    f"95% coverage ({reps} reps)"], rows)


def clusters_table(r, reps):
    if not _ok(r):
        return f"clusters run {r.get('status')}"
    rows = [[k, f"{v['mean_se']:.4g}", f"{v['coverage']:.2f}"] for k, v in r["rows"].items()]
    rows.append(["(SD of the estimate over replications)", f"{r['sd_estimate']:.4g}", ""])
    return _harness.markdown_table(["standard errors", "mean SE of the ATE", f"95% coverage ({reps} reps)"], rows)


def _pair(v):
    return f"{v[0]:.4g} ({v[1]:.3g})" if v is not None else "-"


def econml_table(r):
    if not _ok(r):
        return f"EconML run {r.get('status')}"
    o = r["results"]
    rows = [
        ["ATE on the training rows", _pair(o["ours_all"]), _pair(o["econml_all"]),
         f"{o['truth_sample_ate']:.4g} (sample), 2.0 (population)"],
        ["ATT on the training rows", _pair(o["ours_treated"]), _pair(o["econml_treated"]),
         f"{o['truth_sample_att']:.4g} (sample), 2.3 (population)"],
        ["BLP slope of the DR score on tau-hat (validation)", _pair(o["ours_blp_slope"]),
         "-", "1 for a calibrated tau-hat"],
        ["  same, by DRTester on histforest's tau-hat", _pair(o["drtester_ours_blp"]), "-", ""],
        ["  same, by DRTester on EconML's tau-hat", "-", _pair(o["drtester_econml_blp"]), ""],
        ["calibration: mean / differential forest prediction", 
         f"{o['ours_calibration'][0][0]:.3g} ({o['ours_calibration'][1][0]:.3g}) / "
         f"{o['ours_calibration'][0][1]:.3g} ({o['ours_calibration'][1][1]:.3g})", "-", "1 / 1"],
        ["DRTester calibration R^2 (4 groups)", f"{o['drtester_ours_cal_r2']:.3g}",
         f"{o['drtester_econml_cal_r2']:.3g}", "1 is best"],
        ["RATE QINI (grf) of targeting by tau-hat", _pair(o["ours_QINI"]), "-", ""],
        ["DRTester Qini coefficient (5%-95%)", _pair(o["drtester_ours_qini"]), _pair(o["drtester_econml_qini"]), ""],
        ["RATE AUTOC (grf) of targeting by tau-hat", _pair(o["ours_AUTOC"]), "-", ""],
        ["DRTester TOC coefficient (5%-95%)", _pair(o["drtester_ours_autoc"]), _pair(o["drtester_econml_autoc"]),
         ""],
        ["fit seconds", f"{o['ours_fit_s']:.2f}", f"{o['econml_fit_s']:.2f}", ""],
    ]
    return _harness.markdown_table(["quantity (estimate (SE))", "histforest", "EconML", "reference"], rows)


def real_table(r):
    if not _ok(r):
        return f"real-data run {r.get('status')}"
    o = r["results"]
    rows = []
    published = {"nsw": ("NSW / LaLonde, Dehejia-Wahba experimental sample (n=445): training -> 1978 earnings",
                         "1794 (633): experimental difference in means, Dehejia and Wahba 1999 Table 3"),
                 "nhefs": ("NHEFS: quitting smoking -> weight gain 1971-82, kg (n=1566)",
                           "3.4 (2.4, 4.5) IP weighting; 3.5 (2.6, 4.5) standardisation; Hernan and Robins ch. 12-13")}
    for name, (what, ref) in published.items():
        v = o[name]
        for target in ("all", "treated", "overlap"):
            arr = np.array(v[target])
            est, se = arr[:, 0].mean(), arr[:, 1].mean()
            rows.append([what if target == "all" else "", target, f"{est:.4g}",
                         f"[{est - 1.96 * se:.4g}, {est + 1.96 * se:.4g}]", f"{arr[:, 0].std(ddof=1):.3g}",
                         ref if target == "all" else ""])
        rows.append(["", "difference in means", f"{v['difference_in_means']:.4g}", "", "", ""])
    rows.append(["", "book's IP weighting recomputed from the vendored file",
                 f"{o['nhefs']['book_ipw_recomputed']:.4g}", "", "", "3.4 (book)"])
    return _harness.markdown_table(["data set", "histforest target", "estimate (mean over seeds)",
                                    "95% CI (mean SE)", "SD over forest seeds", "published"], rows)


# --------------------------------------------------------------------------- main

def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="10 replications, 100 trees; print only")
    p.add_argument("--reps", type=int, default=None, help="coverage replications (default 50; 10 with --quick)")
    p.add_argument("--trees", type=int, default=None, help="trees per forest (default 500; 100 with --quick)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=None, help="seconds per part (default 7200; 1200 quick)")
    p.add_argument("--parts", default="coverage,clusters,econml,real",
                   help="comma list among coverage,clusters,econml,real")
    p.add_argument("--write", dest="write", action="store_true", default=None,
                   help="write the tables to RESULTS.md (default for full runs)")
    p.add_argument("--no-write", dest="write", action="store_false", help="print tables only")
    args = p.parse_args(argv)
    args.reps = args.reps or (10 if args.quick else 50)
    args.trees = args.trees or (100 if args.quick else 500)
    args.timeout = args.timeout or (1200.0 if args.quick else 7200.0)
    if args.write is None:
        args.write = not args.quick
    unknown = set(args.parts.split(",")) - {"coverage", "clusters", "econml", "real"}
    if unknown:
        p.error(f"unknown --parts {sorted(unknown)}")
    return args


def main(argv=None):
    args = parse_args(argv)
    parts = set(args.parts.split(","))

    def run(name, fn, kwargs):
        return _harness.run_contender(name, THIS, fn, kwargs, timeout=args.timeout, threads=args.threads)

    body = [f"Settings: CausalForest with {args.trees} trees (other parameters at their defaults), "
            f"{args.threads} threads, each part in a fresh process. Design `forest.simulate.linear_confounded` "
            "(n = 2000, d = 5): e(x) = 0.2 + 0.6 x0, tau(x) = 1 + 3 x0 - x1, mu0(x) = 2 x0 + x2, noise sd 1."]
    if "coverage" in parts:
        r = run("coverage", "contender_coverage", {"reps": args.reps, "n": 2000, "trees": args.trees})
        body += ["", f"#### Coverage of 95% intervals over {args.reps} replications (target >= 0.90)", "",
                 coverage_table(r, args.reps)]
    if "clusters" in parts:
        r = run("clusters", "contender_clusters", {"reps": args.reps, "n": 2000, "trees": args.trees})
        body += ["", "#### Clustered data: 40 clusters, cluster-level effect shifts N(0, 0.8^2)", "",
                 clusters_table(r, args.reps)]
    if "econml" in parts:
        r = run("econml", "contender_econml", {"n": 4000, "trees": args.trees})
        body += ["", "#### Side by side with EconML 0.17 (train 4000 / validation 4000 rows)", "",
                 "DRTester fits its own random-forest nuisances; its BLP regresses its DR outcomes on the CATE "
                 "prediction (our row: `best_linear_projection(A=tau_hat)` on held-out rows); its calibration is "
                 "an R^2 over quantile groups and its Qini/TOC coefficients integrate q*TOC(q) / TOC(q) over "
                 "5%-95%, so those rows compare like with like only roughly.", "", econml_table(r)]
    if "real" in parts:
        r = run("real data", "contender_real", {"trees": args.trees})
        body += ["", "#### Real data with published answers (mean over 5 forest seeds)", "", real_table(r)]
    text = "\n".join(body)
    print(text)
    if args.write:
        _harness.write_results_section(SECTION, text)


if __name__ == "__main__":
    main()

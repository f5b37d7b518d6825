"""False discoveries of forest-report on a model's own training rows (issue 30).

A null-effect design (the effect is the constant 1: no heterogeneity at all, with
confounding through x1) is trained, then reported on its own training rows, as the
README's workflow did. For each seed:

* ``after``: the report as it is now, on the training file: out-of-bag estimates
  (:mod:`forest.io.training_rows`), RATE and Qini ranked by a forest refitted on the
  other half of the rows (:class:`forest.report.analysis.HeldOutRanking`);
* ``before``: the same model file without its training-row signature, which the
  report treats as held out: in-sample predictions and nuisance estimates, the
  behaviour before issue 30;
* ``oob priorities``: RATE with the out-of-bag effects as priorities (what a plain
  "use out-of-bag" fix would do), to show why the report ranks with a refitted forest.

Counted: calibration's differential coefficient with a one-sided p <= 0.01 (a false
discovery of heterogeneity; target: at most 5 of 100 seeds) and AUTOC 95% intervals
that miss 0 (target: covering 0 in at least 95 of 100). The first ``--cli-seeds`` seeds
also go through the real tools: ``mpirun -np K forest-train`` then ``forest-report
--json`` on the training parquet, at each K of ``--ranks``.

Run: ``python benchmarks/bench_null_report.py [--seeds 100] [--n 500] [--trees 500]``.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402

BIN = os.path.dirname(sys.executable)


def null_table(n, seed, d=5):
    """Constant effect 1, propensity logistic in x1, outcome x0 + x1 + t + N(0, 1)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    t = (rng.random(n) < 1.0 / (1.0 + np.exp(-X[:, 1]))).astype(np.int64)
    y = X[:, 0] + X[:, 1] + 1.0 * t + rng.normal(size=n)
    cols = {f"x{j}": X[:, j] for j in range(d)}
    cols.update(t=t, y=y)
    return pa.table(cols)


def _figures(report):
    part = report["analysis"]
    cal = part["calibration"]
    autoc = part["rate"]["AUTOC"]
    lo, hi = autoc["conf_low"][0], autoc["conf_high"][0]
    return {"p_diff": cal["pvalue"][1], "diff": cal["estimate"][1], "autoc": autoc["estimate"][0],
            "autoc_covers_0": bool(lo <= 0.0 <= hi), "qini": report.get("qini", {}).get("qini_coefficient"),
            "rows": report["rows"]["source"]}


def one_seed(seed, n, trees, folder):
    from forest import CausalForest
    from forest.io import model_io
    from forest.cli.report import build_report
    from forest.report.analysis import RANKING_STREAM
    from histogram.rowhash import uniform
    from native.comm import SelfCommunicator

    table = null_table(n, seed)
    data = os.path.join(folder, f"null-{seed}.parquet")
    pq.write_table(table, data)
    names = [c for c in table.column_names if c.startswith("x")]
    X = np.column_stack([table[c].to_numpy() for c in names])
    t, y = table["t"].to_numpy().astype(np.float64), table["y"].to_numpy()
    cf = CausalForest(trees, random_state=seed).fit(X, t, y, comm=SelfCommunicator())
    meta = {"model": "causal", "feature_names": names, "treatment": "t", "outcome": "y", "n_rows": n}
    after = os.path.join(folder, f"after-{seed}.model")
    model_io.save(cf, after, metadata=meta)
    out = {"after": _figures(build_report(after, data=data)[0])}
    del cf.training_rows_                           # what a model file of before issue 30 holds
    before = os.path.join(folder, f"before-{seed}.model")
    model_io.save(cf, before, metadata=meta)
    out["before"] = _figures(build_report(before, data=data)[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rate = cf.rank_average_treatment_effect(cf.oob_predict(), X, t, y, comm=SelfCommunicator())
    lo, hi = rate.conf_int(0.05)
    out["oob_priorities"] = {"autoc": float(rate.estimate[0]), "autoc_covers_0": bool(lo[0] <= 0.0 <= hi[0])}
    # Control: the RATE interval itself on the report's rank half, with priorities that
    # are pure noise (independent of every outcome): what coverage the bootstrap gives there.
    mask = uniform(seed, RANKING_STREAM, np.arange(n)) < 0.5
    noise = np.random.default_rng(10_000 + seed).normal(size=n)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rate = cf.rank_average_treatment_effect(noise, X, t, y, subset=mask, comm=SelfCommunicator())
    lo, hi = rate.conf_int(0.05)
    out["noise_priorities"] = {"autoc": float(rate.estimate[0]), "autoc_covers_0": bool(lo[0] <= 0.0 <= hi[0])}
    return out


def cli_seed(seed, n, trees, folder, ranks):
    table = null_table(n, seed)
    data = os.path.join(folder, f"cli-{seed}.parquet")
    pq.write_table(table, data, row_group_size=max(1, n // 12))
    results = {}
    for k in ranks:
        model = os.path.join(folder, f"cli-{seed}-np{k}.model")
        train = [os.path.join(BIN, "mpirun"), "-np", str(k), os.path.join(BIN, "forest-train"), data, "--treatment",
                 "t", "--outcome", "y", "--n-estimators", str(trees), "--random-state", str(seed), "--no-progress",
                 "--out", model]
        env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
        subprocess.run(train, check=True, capture_output=True, env=env)
        rep = subprocess.run([os.path.join(BIN, "forest-report"), model, "--data", data, "--json"], check=True,
                             capture_output=True, text=True)
        results[k] = _figures(json.loads(rep.stdout))
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=100)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--trees", type=int, default=500)
    ap.add_argument("--cli-seeds", type=int, default=10)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 3])
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    start = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        per_seed = [one_seed(s, args.n, args.trees, folder) for s in range(args.seeds)]
        cli = [cli_seed(s, args.n, args.trees, folder, args.ranks) for s in range(args.cli_seeds)]
    S = args.seeds
    for label, key in (("report now (training file: out of bag, RATE ranked by a half refit)", "after"),
                       ("before issue 30 (training rows treated as held out)", "before")):
        res = [r[key] for r in per_seed]
        rows.append([label, S, sum(r["p_diff"] <= 0.01 for r in res),
                     sum(r["p_diff"] <= 0.05 for r in res), np.median([r["diff"] for r in res]),
                     sum(r["autoc_covers_0"] for r in res), np.median([r["autoc"] for r in res])])
    oob = [r["oob_priorities"] for r in per_seed]
    rows.append(["RATE with out-of-bag effects as priorities (not used)", S, "", "", "",
                 sum(r["autoc_covers_0"] for r in oob), np.median([r["autoc"] for r in oob])])
    noise = [r["noise_priorities"] for r in per_seed]
    rows.append(["control: RATE on the same rank half, priorities pure noise", S, "", "", "",
                 sum(r["autoc_covers_0"] for r in noise), np.median([r["autoc"] for r in noise])])
    for k in args.ranks if cli else ():
        res = [c[k] for c in cli]
        rows.append([f"CLI: mpirun -np {k} forest-train, forest-report --json", len(res),
                     sum(r["p_diff"] <= 0.01 for r in res), sum(r["p_diff"] <= 0.05 for r in res),
                     np.median([r["diff"] for r in res]), sum(r["autoc_covers_0"] for r in res),
                     np.median([r["autoc"] for r in res])])
    same = all(abs(c[args.ranks[0]]["p_diff"] - c[k]["p_diff"]) < 1e-9 for c in cli for k in args.ranks)
    table = markdown_table(["report", "seeds", "calibration p <= 0.01", "p <= 0.05", "median differential",
                            "AUTOC CI covers 0", "median AUTOC"], rows)
    body = (f"Null design (`bench_null_report.null_table`): n = {args.n}, 5 features, effect = 1 everywhere, "
            f"propensity logistic in x1, outcome x0 + x1 + t + N(0, 1); CausalForest({args.trees} trees), other "
            f"parameters at their defaults; seeds 0..{S - 1}. A false discovery is a calibration p <= 0.01 "
            f"(target: at most 5 of 100) or an AUTOC interval missing 0 (target: covering in at least 95 of 100).\n\n"
            + table + "\n\n" + (f"CLI calibration p-values equal across -np {args.ranks}: {same}. " if cli else "")
            + f"Wall time {time.time() - start:.0f} s.\n")
    print(body)
    if not args.no_write:
        write_results_section("Reports on training rows (issue 30)", body,
                              title=f"n = {args.n}, {args.trees} trees, {S} seeds")


if __name__ == "__main__":
    main()

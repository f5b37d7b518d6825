"""Parameter tuning (issue 35): PEHE on IHDP surfaces A and B against EconML, and no loss on Wager-Athey.

IHDP: EconML's ``econml.data.dgps.ihdp_surface_A`` / ``ihdp_surface_B`` (Hill 2011: 747
children, 25 covariates; A has a linear effect surface, B an exponential control
surface), seeds 0..S-1. Per draw a random 80/20 split (seeded); every contender fits the
same 80% and is scored on the same 20%: PEHE = sqrt(mean((tau_hat - tau)^2)).

Contenders: ``CausalForest(n_estimators=T)`` untuned and with ``tune_parameters="all"``
(grf's defaults: 200-tree small forests, 50 of them, 1000 kriging candidates; "all"
includes the centring choice: the nuisance forests' out-of-bag estimates or their local
linear corrections, by the small effect forests' R-loss against the corrected centring;
``--forest-centring`` tunes "all"'s forest parameters only, on the nuisance forests' centring);
EconML's ``CausalForestDML(discrete_treatment=True)`` with its defaults, and the same
after its ``tune(Y, T, X=X)`` (EconML's grid over the forest's parameters, by its
out-of-sample R-score).

Wager-Athey (benchmarks/datasets.py ``wager_athey``, d=20): RMSE of tau on 10,000 test
points, untuned against tuned, at ``--wa-rows`` rows.

Run (anchors' environment): ``.venv-bench/bin/python benchmarks/bench_tuning.py [--seeds 20]
[--trees 500] [--wa-rows 20000] [--wa-seeds 2] [--forest-centring]``; writes the "Parameter tuning (issue 35)"
section of RESULTS.md unless ``--no-write``.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import datasets  # noqa: E402
from _harness import markdown_table, write_results_section  # noqa: E402

SECTION = "Parameter tuning (issue 35)"

#: ``tune_parameters`` of the tuned contender (``--forest-centring``: "all"'s forest parameters, no centring choice)
TUNE = "all"


def _tune_spec():
    from forest import CausalForest
    from forest.estimators.tuning import tunable_names

    return TUNE if TUNE == "all" else tunable_names(CausalForest())


def _split(n, seed):
    idx = np.random.default_rng([seed, 80]).permutation(n)
    cut = int(0.8 * n)
    return idx[:cut], idx[cut:]


def ours(X, t, y, Xtest, trees, seed, tune):
    from forest import CausalForest

    start = time.perf_counter()
    est = CausalForest(trees, random_state=seed, tune_parameters=_tune_spec() if tune else None).fit(X, t, y)
    return est.predict(Xtest), time.perf_counter() - start, getattr(est, "tuned_params_", None), est


def econml_dml(X, t, y, Xtest, seed, tune):
    from econml.dml import CausalForestDML

    start = time.perf_counter()
    est = CausalForestDML(discrete_treatment=True, random_state=seed)
    if tune:
        est.tune(y, t, X=X)
    est.fit(y, t, X=X)
    return np.asarray(est.effect(Xtest)).ravel(), time.perf_counter() - start


def ihdp_part(seeds, trees):
    from econml.data.dgps import ihdp_surface_A, ihdp_surface_B

    rows, per_seed, tuned_status, nuisance = [], [], [], []
    for surface, make in (("A", ihdp_surface_A), ("B", ihdp_surface_B)):
        scores = {k: [] for k in ("ours", "ours tuned", "EconML", "EconML tuned")}
        times = {k: [] for k in scores}
        for seed in range(seeds):
            Y, T, X, te = make(random_state=seed)
            Y, T, te = np.ravel(Y), np.ravel(T).astype(float), np.ravel(te)
            tr, ts = _split(len(Y), seed)
            for key, fn in (("ours", lambda: ours(X[tr], T[tr], Y[tr], X[ts], trees, seed, False)[:2]),
                            ("ours tuned", lambda: ours(X[tr], T[tr], Y[tr], X[ts], trees, seed, True)),
                            ("EconML", lambda: econml_dml(X[tr], T[tr], Y[tr], X[ts], seed, False)),
                            ("EconML tuned", lambda: econml_dml(X[tr], T[tr], Y[tr], X[ts], seed, True))):
                out = fn()
                scores[key].append(datasets.pehe(out[0], te[ts]))
                times[key].append(out[1])
                if key == "ours tuned":
                    tuned_status.append(out[3].tuning_["status"].split(":")[0])
                    nuisance.append((surface, out[3].tuning_.get("centring")))
            per_seed.append((surface, seed, *[scores[k][-1] for k in scores]))
            print(surface, seed, {k: round(v[-1], 3) for k, v in scores.items()}, flush=True)
        for key in scores:
            s = np.array(scores[key])
            rows.append((surface, key, s.mean(), s.std(ddof=1) / np.sqrt(len(s)), np.mean(times[key])))
    return rows, per_seed, tuned_status, nuisance


def centring_summary(centring):
    """One line per surface: how often the corrected centring was a candidate and how often the R-loss took it."""
    lines = []
    for surface in sorted({s for s, _ in centring}):
        picks = [c for s, c in centring if s == surface]
        offered = [c for c in picks if c is not None]
        taken = [c for c in offered if c["model"] == "local linear"]
        names = sorted({name for c in offered for name in c["candidates"]})
        lines.append(f"- surface {surface}: a correction had the lower nuisance error ({', '.join(names) or 'none'}) "
                     f"in {len(offered)} of {len(picks)} fits; the R-loss took the corrected centring in "
                     f"{len(taken)} of them")
    return lines


def wa_part(n, seeds, trees):
    from forest import CausalForest

    rows = []
    for seed in range(seeds):
        data = datasets.wager_athey(n, d=20, seed=seed, cache=False)
        line = [seed]
        for tune in (False, True):
            start = time.perf_counter()
            est = CausalForest(trees, random_state=seed, tune_parameters=_tune_spec() if tune else None).fit(
                data["X"], data["t"], data["y"])
            rmse = datasets.pehe(est.predict(data["X_test"]), data["tau_test"])
            line += [rmse, time.perf_counter() - start]
            if tune:
                nuis = "; ".join(f"{k}: " + (f"local linear {c['ll_lambda']:g}" if c["model"] != "forest" else "forest")
                                 for k, c in est.tuning_["nuisance"].items())
                if est.tuning_.get("centring"):
                    nuis += " (by R-loss: " + ", ".join(f"{k} {v:.4g}" for k, v in est.tuning_["centring"]["r_loss"].items()) + ")"
                line.append(", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                                      for k, v in est.tuned_params_.items())
                            + f" ({est.tuning_['status'].split(':')[0]})" + (f"; {nuis}" if nuis else ""))
        rows.append(tuple(line))
        print("WA", line, flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--trees", type=int, default=500)
    p.add_argument("--wa-rows", type=int, default=20000)
    p.add_argument("--wa-seeds", type=int, default=2)
    p.add_argument("--wa-trees", type=int, default=500)
    p.add_argument("--forest-centring", action="store_true",
                   help="tune \"all\"'s forest parameters only (no centring choice), for comparison")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    global TUNE
    TUNE = "forest" if args.forest_centring else "all"
    spec = "`tune_parameters=\"all\"` (the centring choice included)" if TUNE == "all" else \
        "`tune_parameters=` \"all\"'s forest parameters (a list, so no centring choice)"
    warm = datasets.wager_athey(800, d=25, seed=99, cache=False)          # compile the kernels before timing
    ours(warm["X"], warm["t"], warm["y"], warm["X_test"][:10], 20, 0, False)
    rows, per_seed, status, nuisance = ihdp_part(args.seeds, args.trees)
    wa = wa_part(args.wa_rows, args.wa_seeds, args.wa_trees) if args.wa_seeds else []
    text = [f"IHDP surfaces A and B (EconML's generators), seeds 0..{args.seeds - 1}, 80/20 split per seed, "
            f"PEHE on the 20% (mean and standard error over seeds), fit seconds per seed. Ours: "
            f"`CausalForest({args.trees})`, tuned: {spec} (200-tree small forests x 50, "
            f"1000 kriging candidates). EconML: `CausalForestDML(discrete_treatment=True)` (its defaults: "
            f"100 trees, nuisance models chosen by its 'auto'), tuned: `.tune(Y, T, X=X)` first.", "",
            markdown_table(["surface", "contender", "PEHE mean", "PEHE s.e.", "fit s"], rows), "",
            f"Tuning kept the tuned values in {status.count('tuned')} of {len(status)} fits (else the given "
            f"ones: the refitted winner's error was not below theirs).", "",
            *(["Centring of the tuned fits (the nuisance forests' out-of-bag estimates, or their local linear "
               "corrections where those have the lower out-of-bag error and the small effect forests on them the "
               "lower R-loss against the corrected centring):", "", *centring_summary(nuisance), ""]
              if TUNE == "all" else []),
            "Per seed (PEHE):", "",
            markdown_table(["surface", "seed", "ours", "ours tuned", "EconML", "EconML tuned"], per_seed)]
    if wa:
        text += ["", f"Wager-Athey design, {args.wa_rows:,} rows, d=20, `CausalForest({args.wa_trees})`, RMSE of "
                 f"tau on 10,000 test points:", "",
                 markdown_table(["seed", "RMSE untuned", "fit s", "RMSE tuned", "fit s (tuning included)",
                                 "tuned values"], wa)]
    body = "\n".join(text)
    print(body)
    if not args.no_write:
        write_results_section(SECTION, body)


if __name__ == "__main__":
    main()

"""Instrumental forest benchmark (issue 12): histforest InstrumentalForest against EconML's CausalIVForest.

On the simulated IV design :func:`forest.simulate.instrumental` (binary instrument,
binary treatment confounded with the outcome through an unobserved ``U``, known
``LATE(x)``), with a strong instrument (compliance 0.40) and a weak-ish one (0.20),
d = 10, for each n:

* RMSE of ``LATE-hat(x)`` against the true ``LATE(x)`` on held-out test points,
  histforest ``InstrumentalForest`` vs ``econml.grf.CausalIVForest`` with the same
  trees, ``min_samples_leaf``, subsample fraction 0.5, honesty and mtry (target: RMSE
  ratio <= 1.05);
* fit time of each (ours includes its three out-of-bag nuisance forests; EconML's
  forest fits the raw data with a local intercept, as in ``bench_causal``) (target at
  n = 100,000: >= 5x faster);
* coverage of each one's 95 % intervals (``predict_interval``; EconML's with
  ``inference=True``) of the true ``LATE(x)``.

Each contender runs in its own process (:mod:`_harness`), with a timeout.

Usage::

    /work/main/.venv-bench/bin/python benchmarks/bench_iv.py                 # n = 20,000 and 100,000
    /work/main/.venv-bench/bin/python benchmarks/bench_iv.py --n 20000       # one size
    /work/main/.venv-bench/bin/python benchmarks/bench_iv.py --write         # also into RESULTS.md

The functions named ``contender_*`` run inside the worker processes.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402

SECTION = "Instrumental forest (issue 12)"
THIS = os.path.abspath(__file__)

#: Instrument strengths of :func:`forest.simulate.instrumental` (compliance 0.40 and 0.20).
DESIGNS = {"strong": 1.5, "weak": 0.8}


def _data(n, d, n_test, seed, strength):
    from forest import simulate

    train = simulate.instrumental(n, d=d, strength=strength, seed=seed)
    test = simulate.instrumental(n_test, d=d, strength=strength, seed=seed + 1000)
    return train, test


def _mtry(d):
    return min(int(np.ceil(np.sqrt(d) + 20)), d)


def _scores(late, lo, hi, truth):
    return {"rmse": float(np.sqrt(np.mean((late - truth) ** 2))),
            "coverage": float(np.mean((lo <= truth) & (truth <= hi))),
            "width": float(np.mean(hi - lo))}


def contender_ours(n, d, n_test, seed, strength, cfg, threads, **_):
    from forest.estimators.instrumental_forest import InstrumentalForest

    train, test = _data(n, d, n_test, seed, strength)
    # Compile (or load) the kernels first, prediction and intervals included: the figure
    # is the fit, not Numba's cold start.
    m = min(n, 5000)
    warm = InstrumentalForest(8, nuisance_estimators=4, max_bins=cfg["max_bins"], max_features=_mtry(d)).fit(
        train.X[:m], train.t[:m], train.y[:m], train.z[:m])
    warm.predict_interval(test.X[:100])
    model = InstrumentalForest(cfg["n_estimators"], min_samples_leaf=cfg["min_samples_leaf"],
                               max_samples=cfg["max_samples"], honest=True, max_features=_mtry(d),
                               max_bins=cfg["max_bins"], random_state=seed)
    start = time.perf_counter()
    model.fit(train.X, train.t, train.y, train.z)
    fit_s = time.perf_counter() - start
    late = model.predict(test.X)
    lo, hi = model.predict_interval(test.X)
    return {"fit_s": fit_s, "metrics": _scores(late, lo, hi, test.tau)}


def contender_econml(n, d, n_test, seed, strength, cfg, threads, **_):
    from econml.grf import CausalIVForest

    train, test = _data(n, d, n_test, seed, strength)
    model = CausalIVForest(n_estimators=cfg["n_estimators"], min_samples_leaf=cfg["min_samples_leaf"],
                           max_samples=cfg["max_samples"], honest=True, max_features=_mtry(d), inference=True,
                           n_jobs=threads, random_state=seed)
    start = time.perf_counter()
    model.fit(train.X, train.t, train.y, Z=train.z)
    fit_s = time.perf_counter() - start
    late, lo, hi = (np.asarray(a).reshape(len(test.tau), -1)[:, 0]
                    for a in model.predict(test.X, interval=True, alpha=0.05))
    return {"fit_s": fit_s, "metrics": _scores(late, lo, hi, test.tau)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[20_000, 100_000], help="training sizes")
    p.add_argument("--d", type=int, default=10)
    p.add_argument("--n-test", type=int, default=5_000)
    p.add_argument("--trees", type=int, default=200, help="trees of each forest (a multiple of 4 for EconML)")
    p.add_argument("--min-samples-leaf", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--designs", nargs="+", default=sorted(DESIGNS), choices=sorted(DESIGNS))
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--write", action="store_true", help=f"write the table into RESULTS.md ({SECTION!r})")
    args = p.parse_args(argv)
    cfg = {"n_estimators": args.trees, "min_samples_leaf": args.min_samples_leaf, "max_samples": 0.5,
           "max_bins": 255}
    rows = []
    for design in args.designs:
        for n in args.n:
            kwargs = dict(n=n, d=args.d, n_test=args.n_test, seed=args.seed, strength=DESIGNS[design], cfg=cfg)
            res = {name: _harness.run_contender(f"{name} {design} n={n}", THIS, f"contender_{name}", kwargs,
                                                threads=args.threads, timeout=args.timeout)
                   for name in ("ours", "econml")}
            ok = all("metrics" in r for r in res.values())
            ratio = res["ours"]["metrics"]["rmse"] / res["econml"]["metrics"]["rmse"] if ok else None
            speed = res["econml"]["fit_s"] / res["ours"]["fit_s"] if ok else None
            for name, r in res.items():
                m = r.get("metrics", {})
                rows.append([design, f"{n:,}", name, _harness.fmt(m.get("rmse")),
                             _harness.fmt(ratio) if name == "ours" else "",
                             _harness.fmt(r.get("fit_s")) if "fit_s" in r else r.get("status", "failed"),
                             _harness.fmt(speed) if name == "ours" else "",
                             _harness.fmt(m.get("coverage")), _harness.fmt(m.get("width"))])
    table = _harness.markdown_table(["design", "n", "forest", "RMSE LATE(x)", "RMSE ratio", "fit s",
                                     "speed-up", "95% coverage", "mean width"], rows)
    print(table)
    if args.write:
        body = (f"d = {args.d}, {args.trees} trees, min_samples_leaf {args.min_samples_leaf}, subsample 0.5, "
                f"honest, mtry = GRF default, {args.n_test:,} test points, {args.threads} threads.\n\n{table}")
        _harness.write_results_section(SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())

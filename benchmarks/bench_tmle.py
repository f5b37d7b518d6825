"""Coverage of the TMLE and AIPW average-effect intervals (issue 38, grf's ``method="TMLE"``).

Two designs, ``x ~ U(0, 1)^5``, ``tau(x) = 1 + x0``, ``Y = 2 x0 + x1 + W tau(x) + N(0, 1)``,
``W ~ Bernoulli(e(x))`` with ``e(x) = a + b x0``:

* good overlap: ``e`` from 0.3 to 0.7;
* poor overlap: ``e`` from 0.05 to 0.95 (grf warns; the inverse weights reach 20).

Per seed one ``CausalForest`` (out-of-bag nuisances and effects), then
``average_treatment_effect(target, method=...)`` for the three targets TMLE offers. The truths
are the population values (``E[tau]``, ``E[tau e] / E[e]``, ``E[tau (1 - e)] / E[1 - e]``).
Reported: the share of 95% intervals that cover the truth, the mean error, the standard
deviation of the estimates over seeds and the mean standard error.

A second, forest-free part stresses double robustness: rows of ``x ~ U(0, 1)``,
``e = 0.2 + 0.6 x`` (given exactly), ``tau = 1 + 2 x``, ``Y = x + W tau + N(0, 1)`` (4,000 rows,
300 draws), analysed with a wrong outcome model: "mild" ``tau_hat = 1 + x`` and
``y_hat = e tau_hat`` (the baseline left out), "gross" ``tau_hat = 0.5`` and ``y_hat = 0``.
The truths are the sample means of ``tau`` over the rows, the treated, the controls.

Run: ``python benchmarks/bench_tmle.py [--seeds 50] [--n 2000] [--trees 200] [--no-write]``
"""
import argparse
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402

SECTION = "TMLE average effect (issue 38)"
DESIGNS = {"good overlap (e in 0.3..0.7)": (0.3, 0.4), "poor overlap (e in 0.05..0.95)": (0.05, 0.9)}
TARGETS = ("all", "treated", "control")
Z = 1.959963984540054


def truths(a, b):
    """Population ATE, ATT, ATC of ``tau = 1 + x`` under ``e = a + b x``, ``x ~ U(0, 1)``."""
    e_mean = a + b / 2.0
    tau_e = a + (a + b) / 2.0 + b / 3.0                   # E[(1 + x)(a + b x)]
    return {"all": 1.5, "treated": tau_e / e_mean, "control": (1.5 - tau_e) / (1.0 - e_mean)}


def design(seed, n, a, b):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 5))
    e = a + b * X[:, 0]
    W = rng.binomial(1, e).astype(np.float64)
    Y = 2.0 * X[:, 0] + X[:, 1] + W * (1.0 + X[:, 0]) + rng.normal(size=n)
    return X, W, Y


def run(seeds, n, trees):
    from forest import CausalForest
    from native.comm import SelfCommunicator

    out, secs = [], []
    for label, (a, b) in DESIGNS.items():
        truth = truths(a, b)
        res = {(m, t): [] for m in ("AIPW", "TMLE") for t in TARGETS}
        for seed in range(seeds):
            X, W, Y = design(seed, n, a, b)
            cf = CausalForest(trees, random_state=seed).fit(X, W, Y, comm=SelfCommunicator())
            for method in ("AIPW", "TMLE"):
                for target in TARGETS:
                    t0 = time.perf_counter()
                    est, se = cf.average_treatment_effect(target, method=method, comm=SelfCommunicator())
                    secs.append(time.perf_counter() - t0)
                    res[method, target].append((float(est) - truth[target], float(se)))
        for target in TARGETS:
            for method in ("AIPW", "TMLE"):
                err, se = np.array(res[method, target]).T
                out.append([label, target, method, f"{truth[target]:.4f}", f"{np.mean(np.abs(err) < Z * se):.2f}",
                            f"{err.mean():+.4f}", f"{err.std(ddof=1):.4f}", f"{se.mean():.4f}"])
            print(out[-2], out[-1], flush=True)
    return out, float(np.median(secs))


def stress(draws=300, n=4000):
    """Coverage with true propensities and a wrong outcome model (module docstring), AIPW and TMLE."""
    from forest.analysis.average_effects import average_treatment_effect
    from forest.analysis.effect_rows import make_effect_rows
    from native.comm import SelfCommunicator

    out = []
    for label in ("mild", "gross"):
        res = {(m, t): [] for m in ("AIPW", "TMLE") for t in TARGETS}
        for seed in range(draws):
            rng = np.random.default_rng(10_000 + seed)
            x = rng.uniform(size=n)
            e = 0.2 + 0.6 * x
            W = rng.binomial(1, e).astype(np.float64)
            tau = 1.0 + 2.0 * x
            Y = x + W * tau + rng.normal(size=n)
            tau_hat = 1.0 + x if label == "mild" else np.full(n, 0.5)
            y_hat = e * tau_hat if label == "mild" else np.zeros(n)
            rows = make_effect_rows("binary", tau_hat.reshape(n, 1, 1), W.reshape(n, 1), W.astype(np.int64),
                                    Y.reshape(n, 1), y_hat.reshape(n, 1), e.reshape(n, 1), None, np.ones(n),
                                    np.arange(n), None)
            truth = {"all": tau.mean(), "treated": tau[W == 1].mean(), "control": tau[W == 0].mean()}
            for method in ("AIPW", "TMLE"):
                for target in TARGETS:
                    est, se = average_treatment_effect(SelfCommunicator(), rows, target, method=method)
                    res[method, target].append((est[0, 0] - truth[target], se[0, 0]))
        for target in TARGETS:
            for method in ("AIPW", "TMLE"):
                err, se = np.array(res[method, target]).T
                out.append([label, target, method, f"{np.mean(np.abs(err) < Z * se):.3f}", f"{err.mean():+.4f}",
                            f"{err.std(ddof=1):.4f}", f"{se.mean():.4f}"])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--trees", type=int, default=200)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_NUM_THREADS", "2")
    warnings.simplefilter("ignore")            # grf's overlap warning, on every poor-overlap call
    rows, secs = run(args.seeds, args.n, args.trees)
    table = markdown_table(["design", "target", "method", "truth", "95% coverage", "mean error",
                            "sd of estimates", "mean stderr"], rows)
    stressed = markdown_table(["outcome model", "target", "method", "95% coverage", "mean error",
                               "sd of estimates", "mean stderr"], stress())
    text = (f"{args.seeds} seeds per design, {args.n} rows, {args.trees} trees (module docstring of "
            f"`benchmarks/bench_tmle.py`); out-of-bag rows; population truths. One call takes {secs * 1e3:.1f} ms "
            f"(median).\n\n{table}\n\nTrue propensities, a wrong outcome model (4,000 rows, 300 draws; module "
            f"docstring):\n\n{stressed}")
    print(text)
    if not args.no_write:
        write_results_section(SECTION, text)


if __name__ == "__main__":
    main()

"""Local linear correction of the causal forest, and the out-of-bag choice of ``ll_lambda`` (issue 38).

(a) CausalForest CATE: held-out MSE against the true effect of ``predict`` and of
``predict_local_linear`` (all variables or x0 only, lambda 0.1 or chosen out of bag by
grf's R-loss rule), on three effects of x0: linear ``1 + 2 x0``, a step ``2 * 1[x0 > 0]``
and a smooth nonlinear ``2 / (1 + exp(-3 x0))``; outcome ``x1 + tau W + N(0, 1)``,
W ~ Bernoulli(0.5), X ~ N(0, I_6).

(b) RegressionForest ``tune_local_linear``: out-of-bag squared error over grf's grid, the
chosen lambda, and held-out MSE against the true mean at the choice, at grf's default
0.1 and at the grid's ends; designs: linear plus noise, grf's local linear test
(x0 + 2 x1 + 2 x2^2) and grf's tuning test (log(1 + exp(6 x0)), noise 5, uniform X).

One process. Run: ``python benchmarks/bench_local_linear.py [--n 2000] [--seeds 3] [--trees 400]``;
writes the "Local linear correction: causal forest and lambda selection (issue 38)" section of
RESULTS.md unless ``--no-write``.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402

from forest import CausalForest, RegressionForest  # noqa: E402

SECTION = "Local linear correction: causal forest and lambda selection (issue 38)"

EFFECTS = {
    "linear 1 + 2 x0": lambda X: 1.0 + 2.0 * X[:, 0],
    "step 2 * 1[x0 > 0]": lambda X: 2.0 * (X[:, 0] > 0),
    "smooth 2 / (1 + exp(-3 x0))": lambda X: 2.0 / (1.0 + np.exp(-3.0 * X[:, 0])),
}


def causal_part(n, seeds, trees, n_test=1000, p=6):
    variants = ["forest", "ll all, 0.1", "ll x0, 0.1", "ll all, tuned", "ll x0, tuned"]
    rows = []
    for name, effect in EFFECTS.items():
        mse = {v: [] for v in variants}
        chosen_all, chosen_x0, tune_s, ll_s = [], [], [], []
        for seed in range(seeds):
            rng = np.random.default_rng(1000 + seed)
            X = rng.normal(size=(n, p))
            t = rng.binomial(1, 0.5, n)
            y = X[:, 1] + effect(X) * t + rng.normal(size=n)
            Xq = rng.normal(size=(n_test, p))
            truth = effect(Xq)
            cf = CausalForest(trees, random_state=seed).fit(X, t, y)
            mse["forest"].append(np.mean((cf.predict(Xq) - truth) ** 2))
            t0 = time.perf_counter()
            est = cf.predict_local_linear(Xq, X, t, y)
            ll_s.append(time.perf_counter() - t0)
            mse["ll all, 0.1"].append(np.mean((est - truth) ** 2))
            est = cf.predict_local_linear(Xq, X, t, y, linear_correction_variables=[0])
            mse["ll x0, 0.1"].append(np.mean((est - truth) ** 2))
            t0 = time.perf_counter()
            path = cf.tune_local_linear(X, t, y)
            tune_s.append(time.perf_counter() - t0)
            est = cf.predict_local_linear(Xq, X, t, y, ll_lambda=path.ll_lambda)
            mse["ll all, tuned"].append(np.mean((est - truth) ** 2))
            chosen_all.append(path.ll_lambda)
            path = cf.tune_local_linear(X, t, y, linear_correction_variables=[0])
            est = cf.predict_local_linear(Xq, X, t, y, linear_correction_variables=[0], ll_lambda=path.ll_lambda)
            mse["ll x0, tuned"].append(np.mean((est - truth) ** 2))
            chosen_x0.append(path.ll_lambda)
        base = np.mean(mse["forest"])
        cells = [f"{np.mean(mse[v]):.4f}" + ("" if v == "forest" else f" ({np.mean(mse[v]) / base:.2f})")
                 for v in variants]
        rows.append([name] + cells + [" ".join(f"{v:g}" for v in chosen_all), " ".join(f"{v:g}" for v in chosen_x0),
                                      f"{np.mean(ll_s):.2f} / {np.mean(tune_s):.2f}"])
        print(rows[-1], flush=True)
    headers = ["effect"] + [f"MSE {v}" for v in variants] + ["lambda chosen (all)", "lambda chosen (x0)",
                                                             "ll s / tune s"]
    return markdown_table(headers, rows)


def _regression_design(name, rng, n, p=5):
    if name == "linear + noise":
        X = rng.uniform(-1, 1, size=(n, p))
        mu = 1.0 + 2.0 * X[:, 0] - X[:, 1]
        return X, mu + rng.normal(size=n), mu
    if name == "grf polynomial":
        X = rng.normal(size=(n, p))
        mu = X[:, 0] + 2 * X[:, 1] + 2 * X[:, 2] ** 2
        return X, mu + rng.normal(size=n), mu
    X = rng.uniform(-1, 1, size=(n, p))           # grf's tuning test
    mu = np.log1p(np.exp(6 * X[:, 0]))
    return X, mu + 5.0 * rng.normal(size=n), mu


def lambda_part(n, seeds, trees, n_test=2000):
    rows = []
    for name in ("linear + noise", "grf polynomial", "grf softplus, noise 5"):
        for seed in range(seeds):
            rng = np.random.default_rng(2000 + seed)
            X, y, _ = _regression_design(name, rng, n)
            Xq, _, mu_q = _regression_design(name, rng, n_test)
            rf = RegressionForest(trees, random_state=seed).fit(X, y)
            t0 = time.perf_counter()
            path = rf.tune_local_linear(X, y)
            secs = time.perf_counter() - t0

            def mse(lam):
                return np.mean((rf.predict_local_linear(Xq, X, y, ll_lambda=lam) - mu_q) ** 2)

            oob = " ".join(f"{e:.3f}" for e in path.errors)
            rows.append([name, seed, oob, f"{path.ll_lambda:g}", f"{mse(path.ll_lambda):.4f}", f"{mse(0.1):.4f}",
                         f"{mse(path.lambdas[0]):.4f}", f"{mse(path.lambdas[-1]):.4f}",
                         f"{np.mean((rf.predict(Xq) - mu_q) ** 2):.4f}", f"{secs:.2f}"])
            print(rows[-1], flush=True)
    headers = ["design", "seed", "OOB squared error at 0, .001, .01, .05, .1, .3, .5, .7, 1, 10", "chosen",
               "held-out MSE chosen", "at 0.1", "at 0", "at 10", "forest", "tune s"]
    return markdown_table(headers, rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--trees", type=int, default=400)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    causal = causal_part(args.n, args.seeds, args.trees)
    lam = lambda_part(args.n, args.seeds, args.trees)
    body = (f"(a) CausalForest, n = {args.n}, p = 6, {args.trees} trees, {args.seeds} seeds; held-out MSE of the "
            f"CATE on 1,000 rows (mean over seeds; in brackets the ratio to the forest's own `predict`); ll = "
            f"`predict_local_linear` on all variables or on x0, at grf's default lambda 0.1 or the lambda chosen "
            f"by `tune_local_linear` (grf's R-loss rule, one per seed):\n\n{causal}\n\n"
            f"(b) RegressionForest `tune_local_linear`, n = {args.n}, p = 5, {args.trees} trees: out-of-bag "
            f"error over grf's grid, the choice, and held-out MSE against the true mean (2,000 rows):\n\n{lam}")
    if not args.no_write:
        write_results_section(SECTION, body)
    print(body)


if __name__ == "__main__":
    main()

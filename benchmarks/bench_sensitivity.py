"""Sensitivity bounds (issue 35): coverage of the true ATE at the omitted confounder's true strength.

Design: ``X ~ N(0, I_3)``, a hidden ``A ~ N(0, 1)``, ``W ~ Bernoulli(sigmoid(a A + 0.4 x0))``,
``Y = W + b A + x0 + N(0, 1)``: the true ATE is 1, and the forest (fitted on X alone) is
confounded. The confounder's true strengths follow their definitions: ``c_y = 1 -
E[(Y - g_long)^2] / E[(Y - g_short)^2]`` (``g_short(w, x) = w + b E[A | w, x] + x0``) and
``c_t = 1 - E[alpha_short^2] / E[alpha_long^2]`` (``E[alpha^2 | x] = 1/e + 1/(1 - e)``), by
Monte Carlo over A. Per seed: is 1 inside the bounds' 95 % confidence interval at
``(c_y, c_t, rho = 1)``, inside the plain ATE interval, and what the robustness value for
the null ``theta = 1`` is. Target: the sensitivity interval covers in >= 90 % of seeds.

Run: ``python benchmarks/bench_sensitivity.py [--n 4000] [--seeds 20] [--trees 300]``; writes the
"Sensitivity to hidden confounding (issue 35)" section of RESULTS.md unless ``--no-write``.
"""
import argparse
import os
import sys

import numpy as np
from scipy.special import expit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402

SECTION = "Sensitivity to hidden confounding (issue 35)"


def design(n, seed, a, b):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    A = rng.normal(size=n)
    W = rng.binomial(1, expit(a * A + 0.4 * X[:, 0])).astype(float)
    return X, W, W + b * A + X[:, 0] + rng.normal(size=n)


def strengths(X, a, b, n_mc=50_000):
    """True ``(c_y, c_t)`` of the hidden A (module docstring)."""
    z = np.random.default_rng(99).normal(size=n_mc)
    x0 = X[:500, 0]
    p = expit(a * z[:, None] + 0.4 * x0[None, :])
    e_short = p.mean(axis=0)
    m1 = (p * z[:, None]).sum(axis=0) / p.sum(axis=0)
    m0 = ((1 - p) * z[:, None]).sum(axis=0) / (1 - p).sum(axis=0)
    var_a = 1.0 - (e_short * m1 ** 2 + (1 - e_short) * m0 ** 2)
    c_y = 1.0 - 1.0 / (1.0 + b * b * var_a.mean())
    c_t = 1.0 - np.mean(1 / e_short + 1 / (1 - e_short)) / np.mean(1 / p + 1 / (1 - p))
    return float(c_y), float(c_t)


def main(argv=None):
    from forest import CausalForest
    from native.comm import SelfCommunicator

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--trees", type=int, default=300)
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    rows = []
    for a, b in ((0.8, 1.0), (0.5, 0.5), (1.2, 0.3)):
        cover, plain, rvs, cys, cts = 0, 0, [], [], []
        for s in range(args.seeds):
            X, W, Y = design(args.n, s, a, b)
            c_y, c_t = strengths(X, a, b)
            f = CausalForest(args.trees, random_state=s).fit(X, W, Y, comm=SelfCommunicator())
            r = f.sensitivity_analysis(c_y, c_t)
            cover += r["ci_lower"] <= 1.0 <= r["ci_upper"]
            plain += abs(f.ate_ - 1.0) <= 1.96 * f.ate_stderr_
            rvs.append(f.robustness_value(null_hypothesis=1.0))
            cys.append(c_y)
            cts.append(c_t)
            print(a, b, s, f.ate_, r["ci_lower"], r["ci_upper"], rvs[-1], c_y, c_t, flush=True)
        rows.append([f"a={a}, b={b}", f"{np.mean(cys):.3f}", f"{np.mean(cts):.3f}", f"{plain}/{args.seeds}",
                     f"{cover}/{args.seeds}", f"{np.mean(rvs):.3f}"])
    text = (f"{args.n} rows, {args.trees} trees, {args.seeds} seeds per design; true ATE 1. Columns: the hidden "
            f"confounder's true strengths, how often the plain ATE 95 % CI and the sensitivity 95 % CI at the true "
            f"strengths (rho = 1) cover 1, and the mean robustness value for the null theta = 1.\n\n"
            + markdown_table(["design (W on A, Y on A)", "true c_y", "true c_t", "ATE CI covers",
                              "sensitivity CI covers", "robustness value (theta = 1)"], rows))
    print(text)
    if not args.no_write:
        write_results_section(SECTION, text)


if __name__ == "__main__":
    main()

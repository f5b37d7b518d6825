"""Local linear splits (grf's ``enable.ll.split``, issue 38): accuracy of ``predict_local_linear`` and fit cost.

(a) Out-of-bag local linear predictions (``tune_local_linear`` over grf's grid: the
prediction at grf's default lambda 0.1 and at the chosen lambda) of a RegressionForest
grown with and without ``enable_ll_split`` (grf's regression_forest sizes,
``min_node_size=5``), MSE against the true mean, mean over seeds; the forest's own
out-of-bag ``predict`` for reference. Designs: grf's "simple case" test (X ~ N(0, 1)^5,
mu = x1 + x2 + x3 x4, n = 600, 500 trees; grf asserts ll-split / plain < 0.9 at lambda
0.1), grf's "regulating" test (U(-1, 1)^5, mu = 0.9 exp(x1) + 2 x2 + 2 x3 x4, n = 2000,
500 trees; default cutoff vs ``ll_split_cutoff=0``; grf asserts regulated / cutoff-0 <
0.5 at the tuned lambda), and a linear trend plus a step (U(-1, 1)^6, mu = 2 x1 - x2 +
1[x3 > 0], n = 2000).

(b) Fit time, warm (the kernels compiled by an earlier fit), median of 3: plain vs
``enable_ll_split`` with every column a split variable, n = 20,000, p = 5 and 10,
200 trees.

One process. Run: ``python benchmarks/bench_ll_split.py [--seeds 5]``; writes the "Local
linear splits (issue 38)" section of RESULTS.md unless ``--no-write``.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402

from forest import RegressionForest  # noqa: E402
from native.comm import SelfCommunicator  # noqa: E402

SECTION = "Local linear splits (issue 38)"
SELF = SelfCommunicator()


def _design(name, rng):
    if name == "grf simple case":
        X = rng.normal(size=(600, 5))
        return X, X[:, 0] + X[:, 1] + X[:, 2] * X[:, 3], 500
    if name == "grf regulating":
        X = rng.uniform(-1, 1, size=(2000, 5))
        return X, 0.9 * np.exp(X[:, 0]) + 2 * X[:, 1] + 2 * X[:, 2] * X[:, 3], 500
    X = rng.uniform(-1, 1, size=(2000, 6))
    return X, 2 * X[:, 0] - X[:, 1] + (X[:, 2] > 0), 300


VARIANTS = (("plain", dict()), ("ll split", dict(enable_ll_split=True)),
            ("ll split, cutoff 0", dict(enable_ll_split=True, ll_split_cutoff=0)))


def accuracy_part(seeds):
    rows = []
    for name in ("grf simple case", "grf regulating", "trend + step"):
        out = {v: {"forest": [], "ll 0.1": [], "ll tuned": [], "fit": [], "lam": []} for v, _ in VARIANTS}
        for seed in range(seeds):
            rng = np.random.default_rng(3800 + seed)
            X, mu, trees = _design(name, rng)
            y = mu + rng.normal(size=len(mu))
            for variant, kw in VARIANTS:
                t0 = time.perf_counter()
                f = RegressionForest(trees, min_node_size=5, random_state=seed, **kw).fit(X, y, comm=SELF)
                out[variant]["fit"].append(time.perf_counter() - t0)
                path = f.tune_local_linear(X, y, comm=SELF)
                lams = list(path.lambdas)
                out[variant]["forest"].append(np.mean((f.oob_prediction_ - mu) ** 2))
                out[variant]["ll 0.1"].append(np.mean((path.oob_predictions[:, lams.index(0.1)] - mu) ** 2))
                out[variant]["ll tuned"].append(np.mean((path.oob_predictions[:, lams.index(path.ll_lambda)] - mu) ** 2))
                out[variant]["lam"].append(path.ll_lambda)
        base = out["plain"]
        for variant, _ in VARIANTS:
            o = out[variant]
            r01 = np.array(o["ll 0.1"]) / np.array(base["ll 0.1"])
            rt = np.array(o["ll tuned"]) / np.array(base["ll tuned"])
            rows.append([name, variant, f"{np.mean(o['forest']):.4f}", f"{np.mean(o['ll 0.1']):.4f}",
                         "" if variant == "plain" else f"{np.mean(r01):.2f} [{r01.min():.2f}, {r01.max():.2f}]",
                         f"{np.mean(o['ll tuned']):.4f}",
                         "" if variant == "plain" else f"{np.mean(rt):.2f} [{rt.min():.2f}, {rt.max():.2f}]",
                         " ".join(f"{v:g}" for v in o["lam"]), f"{np.median(o['fit']):.2f}"])
            print(rows[-1], flush=True)
        reg = np.array(out["ll split"]["ll tuned"]) / np.array(out["ll split, cutoff 0"]["ll tuned"])
        rows.append([name, "ll split / cutoff 0 (tuned)", "", "", "", "",
                     f"{np.mean(reg):.2f} [{reg.min():.2f}, {reg.max():.2f}]", "", ""])
    headers = ["design", "forest", "OOB MSE predict", "OOB MSE ll 0.1", "ratio to plain (mean [min, max])",
               "OOB MSE ll tuned", "ratio to plain", "lambda chosen", "fit s (median)"]
    return markdown_table(headers, rows)


def cost_part(n=20000, trees=200, reps=3):
    rows = []
    for p in (5, 10):
        rng = np.random.default_rng(p)
        X = rng.uniform(-1, 1, size=(n, p))
        y = 2 * X[:, 0] + np.sin(3 * X[:, 1]) + rng.normal(size=n)
        times = {}
        for variant, kw in VARIANTS[:2]:
            RegressionForest(4, random_state=0, **kw).fit(X[:2000], y[:2000], comm=SELF)   # compile first
            runs = []
            for r in range(reps):
                t0 = time.perf_counter()
                RegressionForest(trees, random_state=r, **kw).fit(X, y, comm=SELF)
                runs.append(time.perf_counter() - t0)
            times[variant] = float(np.median(runs))
        channels = 4 + 2 * p + p * (p + 1) // 2
        rows.append([n, p, trees, f"3 / {channels}", f"{times['plain']:.2f}", f"{times['ll split']:.2f}",
                     f"{times['ll split'] / times['plain']:.2f}"])
        print(rows[-1], flush=True)
    return markdown_table(["n", "p", "trees", "channels plain / ll", "fit s plain", "fit s ll split", "ratio"], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    acc = accuracy_part(args.seeds)
    cost = cost_part()
    body = (f"(a) Out-of-bag MSE against the true mean, {args.seeds} seeds (mean; ratios per seed, mean [min, max]); "
            f"`predict_local_linear` on every variable via `tune_local_linear` (grf's grid; the 0.1 column and the "
            f"chosen one); `min_node_size=5`:\n\n{acc}\n\n"
            f"(b) Fit time (warm, median of 3):\n\n{cost}")
    if not args.no_write:
        write_results_section(SECTION, body)
    print(body)


if __name__ == "__main__":
    main()

"""RegressionForest's size rules: scikit-learn's ``min_samples_leaf`` against grf's ``min_node_size`` (issue 38).

For each design: held-out MSE against the true conditional mean, coverage of the 95%
intervals (``predict_interval``) of the true mean at the held-out points, and fit time, for the
default rule (``min_samples_leaf=5``: children of at least 5 rows), grf's
(``min_node_size=5``: nodes of at most 5 rows stop, children >= ceil(0.05 n) rows) and
``min_samples_leaf=1``. Same trees (200), same seeds, one process.

Run: ``python benchmarks/bench_size_rules.py [--n 2000] [--reps 3]``
"""
import argparse
import time

import numpy as np

from forest import RegressionForest


def _design(name, rng, n, p=5):
    X = rng.normal(size=(n, p))
    if name == "smooth":            # |x0| + x1^2 / 2, noise 0.5
        mu = np.abs(X[:, 0]) + 0.5 * X[:, 1] ** 2
        noise = 0.5
    elif name == "step":            # grf's variance test: 1[x0 > 0], noise 2
        X = rng.uniform(-1, 1, size=(n, 6))
        mu = (X[:, 0] > 0).astype(float)
        noise = 2.0
    elif name == "polynomial":      # grf's local linear test: x0 + 2 x1 + 2 x2^2, noise 1
        mu = X[:, 0] + 2 * X[:, 1] + 2 * X[:, 2] ** 2
        noise = 1.0
    elif name == "interaction":     # 20 features, x0 * x1, noise 0.5
        X = rng.normal(size=(n, 20))
        mu = X[:, 0] * X[:, 1]
        noise = 0.5
    elif name == "clustered":       # rows in clusters of ~20 sharing a N(0, 1) effect; the target is E[y | x]
        clusters = rng.integers(0, max(n // 20, 2), n)
        effect = rng.normal(size=clusters.max() + 1)
        mu = X[:, 0]
        return X, mu + effect[clusters] + 0.5 * rng.normal(size=n), mu
    else:
        raise ValueError(name)
    return X, mu + noise * rng.normal(size=n), mu


RULES = {
    "min_samples_leaf=5 (default)": dict(),
    "min_node_size=5 (grf)": dict(min_node_size=5),
    "min_samples_leaf=1": dict(min_samples_leaf=1),
}
DESIGNS = ("smooth", "step", "polynomial", "interaction", "clustered")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--trees", type=int, default=200)
    args = ap.parse_args()
    print(f"n={args.n}, {args.trees} trees, {args.reps} replications; held-out MSE against the true mean / "
          f"coverage of its 95% intervals (means over replications) / fit seconds")
    print(f"| design | {' | '.join(RULES)} |")
    print("|---|" + "---|" * len(RULES))
    for design in DESIGNS:
        cells = []
        for kw in RULES.values():
            mses, secs, cover = [], [], []
            for rep in range(args.reps):
                rng = np.random.default_rng(100 * rep + 7)
                X, y, _ = _design(design, rng, args.n)
                Xt, _, mu_t = _design(design, rng, 5000)
                t0 = time.perf_counter()
                rf = RegressionForest(args.trees, random_state=rep, **kw).fit(X, y)
                secs.append(time.perf_counter() - t0)
                mses.append(np.mean((rf.predict(Xt) - mu_t) ** 2))
                lo, hi = rf.predict_interval(Xt)
                cover.append(np.mean((lo <= mu_t) & (mu_t <= hi)))
            cells.append(f"{np.mean(mses):.4f} / {np.mean(cover):.2f} / {np.mean(secs):.2f} s")
        print(f"| {design} | {' | '.join(cells)} |", flush=True)


if __name__ == "__main__":
    main()

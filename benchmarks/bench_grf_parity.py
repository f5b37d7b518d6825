"""grf's own statistical claims on RegressionForest, measured (issue 38).

Each line is one claim of grf's R test suite (its design, its size, its bound) and what
histforest measures on it, over several seeds:

* replication: weights of 2 on 100 of 500 rows against those rows duplicated
  (``max_samples=1, min_samples_leaf=1, honest=False``): max |prediction difference|;
* weighted mean: out-of-bag mean prediction minus the weighted mean of y (grf: < 0.05);
* variance: fraction of out-of-bag errors beyond one estimated standard deviation (grf: < 0.5);
* weighted coverage: 95% out-of-bag intervals with inverse-probability weights (grf: > 0.8)
  and without (grf: < 0.55);
* calibration: mean estimated variance over the variance across 40 training sets;
* local linear: held-out MSE of ``predict_local_linear`` and of ``predict`` (grf: ll < 1.5 and
  below the forest's), and its seconds for 1000 queries.

Run: ``python benchmarks/bench_grf_parity.py [--seeds 3]``
"""
import argparse
import time

import numpy as np

from forest import RegressionForest


def replication(seed):
    rng = np.random.default_rng(seed)
    n, p = 500, 10
    X = rng.normal(size=(n, p))
    y = X[:, 0] * rng.normal(size=n)
    dup = rng.choice(n, 100, replace=False)
    w = np.ones(n)
    w[dup] = 2.0
    XX, yy = np.vstack([X, X[dup]]), np.concatenate([y, y[dup]])
    kw = dict(n_estimators=100, max_samples=1.0, min_samples_leaf=1, honest=False, random_state=seed)
    a = RegressionForest(**kw).fit(X, y, sample_weight=w).predict(XX)
    b = RegressionForest(**kw).fit(XX, yy).predict(XX)
    return np.abs(a - b).max()


def weighted_mean(seed):
    rng = np.random.default_rng(seed)
    n, p, obs = 2000, 5, 1 / 20
    y0 = rng.binomial(1, obs / (1 + obs), n)
    y = y0 + 0.01 * rng.normal(size=n)
    X = rng.normal(size=(n, p))
    w = 1 + y0 * (1 / obs - 1)
    rf = RegressionForest(250, random_state=seed).fit(X, y, sample_weight=w)
    return rf.oob_predict().mean() - np.average(y, weights=w)


def variance_claim(seed):
    rng = np.random.default_rng(seed)
    n, p = 1000, 6
    X = 2 * rng.uniform(size=(n, p)) - 1
    y = (X[:, 0] > 0) + 2 * rng.normal(size=n)
    rf = RegressionForest(1000, ci_group_size=4, random_state=seed).fit(X, y)
    err = rf.oob_predict() - (X[:, 0] > 0)
    return np.mean(np.abs(err / np.sqrt(rf.oob_predict_var())) > 1)


def weighted_coverage(seed):
    rng = np.random.default_rng(seed)
    n, p, pA = 2500, 5, 0.2
    X = rng.normal(size=(n, p))
    A = rng.binomial(1, pA, n)
    gamma = A / pA + (1 - A) / (1 - pA)
    truth = 1 / (1 + np.exp(-3 * X[:, 0]))
    y = 2 * truth * A + rng.normal(size=n)
    out = []
    for w in (gamma, None):
        rf = RegressionForest(random_state=seed).fit(X, y, sample_weight=w)
        z = (rf.oob_predict() - truth) / np.sqrt(rf.oob_predict_var())
        out.append(np.mean(np.abs(z) < 1.96))
    return out


def calibration(seed, reps=40):
    x0 = np.array([[0.3, -0.2, 0.1, 0.0]])
    preds, variances = [], []
    for rep in range(reps):
        rng = np.random.default_rng(1000 * seed + rep)
        X = rng.uniform(-1, 1, size=(800, 4))
        y = X[:, 0] + rng.normal(size=800)
        rf = RegressionForest(400, random_state=rep).fit(X, y)
        preds.append(rf.predict(x0)[0])
        variances.append(rf.predict_var(x0)[0])
    return np.mean(variances) / np.var(preds)


def local_linear(seed):
    rng = np.random.default_rng(seed)
    f = lambda X: X[:, 0] + 2 * X[:, 1] + 2 * X[:, 2] ** 2   # noqa: E731
    n, p = 1000, 5
    X = rng.normal(size=(n, p))
    y = f(X) + rng.normal(size=n)
    Xq = rng.normal(size=(1000, p))
    rf = RegressionForest(random_state=seed).fit(X, y)
    t0 = time.perf_counter()
    ll = rf.predict_local_linear(Xq, X, y)
    secs = time.perf_counter() - t0
    return np.mean((ll - f(Xq)) ** 2), np.mean((rf.predict(Xq) - f(Xq)) ** 2), secs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    local_linear(99)        # compiles the kernels outside the timings
    seeds = range(args.seeds)
    print("| claim (grf's bound) | " + " | ".join(f"seed {s}" for s in seeds) + " |")
    print("|---|" + "---|" * len(seeds))
    rows = [
        ("replication: max abs difference (equal)", lambda s: f"{replication(s):.1e}"),
        ("weighted OOB mean - weighted mean of y (< 0.05)", lambda s: f"{weighted_mean(s):+.4f}"),
        ("OOB errors beyond 1 sd (< 0.5)", lambda s: f"{variance_claim(s):.3f}"),
        ("95% OOB coverage weighted (> 0.8) / unweighted (< 0.55)",
         lambda s: "{:.3f} / {:.3f}".format(*weighted_coverage(s))),
        ("estimated / sampling variance (40 training sets)", lambda s: f"{calibration(s):.2f}"),
        ("local linear MSE (< 1.5) / forest MSE / ll seconds",
         lambda s: "{:.3f} / {:.3f} / {:.2f} s".format(*local_linear(s))),
    ]
    for name, run in rows:
        print(f"| {name} | " + " | ".join(run(s) for s in seeds) + " |", flush=True)


if __name__ == "__main__":
    main()

"""Coverage of the instrumental forest's average-effect intervals (issue 38).

``forest.simulate.instrumental`` (a binary instrument, an unobserved confounder of treatment
and outcome, ``tau(x) = 1 + 2 * 1[x0 > 0.5] + x1`` everyone's effect at ``x``, so the local
effect): per seed, the 95% interval of ``InstrumentalForest.average_treatment_effect`` (the
compliance score from its own causal forest) against the sample mean of ``tau(x)``; also the
best-linear-projection slope on ``x1`` (truth 1).

Run: ``python benchmarks/bench_iv_analysis.py [--seeds 20] [--n 4000] [--trees 300]``
"""
import argparse
import time
import warnings

import numpy as np

from forest import InstrumentalForest, simulate


def design(seed, n):
    d = simulate.instrumental(n, seed=seed)
    return d.X, d.t, d.y, d.z, d.tau


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--trees", type=int, default=300)
    args = ap.parse_args()
    warnings.simplefilter("ignore")       # the training rows are recognised: a notice per call
    zs, covered, slope_cov, secs = [], 0, 0, []
    for seed in range(args.seeds):
        X, t, y, z, tau = design(seed, args.n)
        iv = InstrumentalForest(args.trees, random_state=seed).fit(X, t, y, z)
        t0 = time.perf_counter()
        est, se = iv.average_treatment_effect(X, t, y, z)
        secs.append(time.perf_counter() - t0)
        blp = iv.best_linear_projection(X, t, y, z, A=X[:, 1:2])
        zs.append((est - tau.mean()) / se)
        covered += abs(zs[-1]) < 1.96
        slope_cov += abs(blp.estimate[1] - 1) < 1.96 * blp.stderr[1]
    zs = np.array(zs)
    print(f"n={args.n}, {args.trees} trees, {args.seeds} seeds: ATE 95% coverage {covered / args.seeds:.2f}, "
          f"mean z {zs.mean():+.2f}, sd z {zs.std():.2f}; BLP slope coverage {slope_cov / args.seeds:.2f}; "
          f"average_treatment_effect {np.mean(secs):.2f} s per call (compliance forest included)")


if __name__ == "__main__":
    main()

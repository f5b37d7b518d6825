"""Micro-benchmark of the compiled causal criterion: ns per candidate split and per node.

Times :func:`forest.criteria.compiled.gains` over the cumulative splits of 4,000 rows
(about 8,000 candidates, the two children of every prefix of a random order) and
:func:`forest.criteria.compiled.prepare` over 2,000 random node sums, for ``K``
treatment columns (one outcome), best of 20 and 10 blocks. Run from the repository root:

    .venv/bin/python benchmarks/bench_criterion.py [--arms 1 2 4]

``--arms 1`` is the fused scalar record (binary treatment); ``K >= 2`` the general one.
"""
import argparse
import os
import sys
import time

import numba
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "forest"))

from forest.criteria import compiled as cc  # noqa: E402
from forest.criteria.causal import CausalCriterion  # noqa: E402


@numba.njit
def _many_prepares(p, parents, consts):
    acc = 0.0
    for i in range(parents.shape[0]):
        cc.prepare(p, parents[i], consts)
        acc += consts[0]
    return acc


def _channels(crit, rng, n):
    from causal_helpers import causal_rows

    wc, y, g, ind = causal_rows(rng, n, crit.K, crit.M, crit.constraint)
    return crit.make_channels(wc, y, g, ind)


def measure(K, rows=4000, repeats=20):
    """``(ns per candidate, ns per node)`` for ``K`` treatment columns."""
    crit = CausalCriterion(K, 1, min_samples_leaf=1)
    comp = crit.compiled()
    rng = np.random.default_rng(0)
    ch = _channels(crit, rng, rows)
    parent = ch.sum(axis=0)
    lefts = np.ascontiguousarray(np.cumsum(ch[rng.permutation(rows)], axis=0)[10:-10])
    rights = parent - lefts
    out = np.empty((1, len(lefts)))
    consts = np.zeros(comp.n_consts)
    cc.call_kernel(cc._eval_gains, comp.record, lefts, rights, parent, consts, out)
    gain_ns = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(10):
            cc.call_kernel(cc._eval_gains, comp.record, lefts, rights, parent, consts, out)
        gain_ns = min(gain_ns, (time.perf_counter() - start) / 10 / len(lefts) * 1e9)
    parents = np.array([ch[rng.random(rows) < 0.3].sum(axis=0) for _ in range(2000)])
    cc.call_kernel(_many_prepares, comp.record, parents, consts)
    prep_ns = np.inf
    for _ in range(repeats // 2):
        start = time.perf_counter()
        cc.call_kernel(_many_prepares, comp.record, parents, consts)
        prep_ns = min(prep_ns, (time.perf_counter() - start) / len(parents) * 1e9)
    return gain_ns, prep_ns


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arms", type=int, nargs="+", default=[1, 2, 4], help="treatment columns K")
    args = p.parse_args(argv)
    for K in args.arms:
        gain_ns, prep_ns = measure(K)
        print(f"K={K}: {gain_ns:.1f} ns per candidate split, {prep_ns:.0f} ns per node (prepare)", flush=True)


if __name__ == "__main__":
    main()

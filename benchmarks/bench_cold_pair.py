"""Paired cold-start runs of two commits: the empty-cache first fit of each, at the same moments.

Why: this machine's speed swings by 2x within an evening, and a first fit on an
empty Numba cache takes 15-30 s, so even alternating runs (bench_ab.py) mix slow and
fast minutes. Here both commits run *at the same time*, one single-threaded process
per core (``taskset``), and swap cores every pair, so both see the same machine;
the figure is the per-pair ratio head / base.

Each process imports ``forest`` from its worktree (``benchmarks/out/ab-<sha>``, as
bench_ab.py makes them) with a new, empty ``NUMBA_CACHE_DIR`` and fits
bench_cold_start.py's case once (``causal``: ``CausalForest(n_estimators=20)`` on
10,000 x 10 rows with its nuisance forests; ``gbdt``: ``GBDTClassifier(n_estimators=10)``),
reporting the seconds inside ``fit``.

Usage::

    .venv-bench/bin/python benchmarks/bench_cold_pair.py --base 3f10fb4 [--head HEAD] [--case causal] [--pairs 4]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from bench_ab import _worktree  # noqa: E402

_CHILD = """
import sys, time
sys.path.insert(0, {root!r}); sys.path.insert(0, {here!r})
import forest
assert forest.__file__.startswith({root!r}), forest.__file__
from bench_cold_start import _data
X, t, y = _data()
if {case!r} == "causal":
    model, args = forest.CausalForest(n_estimators=20, random_state=0), (X, t, y)
else:
    model, args = forest.GBDTClassifier(n_estimators=10, random_state=0), (X, (y > 0).astype(int))
start = time.perf_counter()
model.fit(*args)
print(time.perf_counter() - start)
"""


def _start(root, case, core, cache_dir):
    env = dict(os.environ, NUMBA_CACHE_DIR=cache_dir, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    code = _CHILD.format(root=root, here=HERE, case=case)
    return subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", code], env=env, cwd=root,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _seconds(proc):
    out, err = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(err[-2000:])
    return float(out.split()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True)
    p.add_argument("--head", default="HEAD")
    p.add_argument("--case", choices=("causal", "gbdt"), default="causal")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--keep-worktrees", action="store_true", help="leave benchmarks/out/ab-<sha> in place")
    args = p.parse_args(argv)
    refs = [_worktree(args.base), _worktree(args.head)]
    try:
        _pairs(args, refs)
    finally:
        if not args.keep_worktrees:
            for _, path in refs:
                subprocess.call(["git", "-C", ROOT, "worktree", "remove", "--force", path])


def _pairs(args, refs):
    (base_sha, base_root), (head_sha, head_root) = refs
    ratios = []
    print(f"| pair | {base_sha} fit s | {head_sha} fit s | ratio head/base |")
    print("|------|---------|---------|-----------------|")
    for i in range(args.pairs):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            cores = (0, 1) if i % 2 == 0 else (1, 0)
            procs = [_start(base_root, args.case, cores[0], a), _start(head_root, args.case, cores[1], b)]
            base_s, head_s = (_seconds(q) for q in procs)
        ratios.append(head_s / base_s)
        print(f"| {i + 1} | {base_s:.2f} | {head_s:.2f} | {ratios[-1]:.3f} |", flush=True)
    print(f"\nratio head/base: mean {statistics.mean(ratios):.3f}, min {min(ratios):.3f}, max {max(ratios):.3f} "
          f"({args.case}, {args.pairs} pairs)")


if __name__ == "__main__":
    main()

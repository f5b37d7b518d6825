"""Policy-tree benchmark (issue 15): exact histforest PolicyTree against EconML's greedy one.

Parts (each contender in its own process, with a timeout; a failure is recorded and the
rest go on):

1. ``econml``: 100,000 x 20 rewards of 3 actions on the XOR design
   (:func:`forest.policy.simulate.xor_design`: the best action depends on the
   interaction of x0 and x1, and no single split changes any action's mean, so a
   greedy tree has nothing to go on at its root), depth 2. Fit time (same rewards;
   ours after an untimed warm-up fit, i.e. without Numba compilation, which is also
   reported) and the true value of each learned policy on 100,000 fresh rows
   (best possible 0.65). Contenders: histforest ``PolicyTree(2)`` (exact over its
   default 64 bins per feature, and over 32 and 16), EconML ``econml.policy.PolicyTree(max_depth=2)`` with its
   defaults (honest, balancedness tolerance 0.45), and EconML with ``honest=False``.
   Targets: ours at least as fast as EconML's default, higher held-out value.
2. ``big``: depth 2 on 1,000,000 x 50 x 10 actions, 2 threads. Target: under 2 minutes.
3. ``depth3``: depth 3 (16 bins) on 100,000 x 20 x 3: time and held-out value.
4. ``mpi``: the 1M x 50 x 10 depth-2 search under ``mpirun -np 2`` (1 thread per rank)
   with each exchange (``rows``: allgather the binned rows; ``tables``: reduce-scatter
   the pair tables): fit time and the bytes each rank sent (``native.collectives.STATS``),
   against the prediction of :func:`forest.policy.exact.predicted_bytes`; the tree must
   equal the single-process one.

Usage::

    .venv-bench/bin/python benchmarks/bench_policy.py            # full size, writes RESULTS.md
    .venv-bench/bin/python benchmarks/bench_policy.py --quick    # small smoke run, prints only
    .venv-bench/bin/python benchmarks/bench_policy.py --parts econml depth3

The functions named ``contender_*`` run inside the worker processes.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402

SECTION = "Policy trees (issue 15)"
THIS = os.path.abspath(__file__)
PARTS = ("econml", "big", "depth3", "mpi")
N_TEST = 100_000


def _design(n, d, n_actions, seed):
    from forest.policy.simulate import xor_design

    return xor_design(n, d=d, n_actions=n_actions, seed=seed)


def _held_out_value(predict, d, n_actions, seed):
    test = _design(N_TEST, d, n_actions, seed + 1)
    return test.policy_value(predict(test.X)), test.best_value


# --------------------------------------------------------------------------- contenders

def contender_ours(n, d, n_actions, depth, seed, threads, max_bins=None, min_samples_leaf=1, exchange="auto",
                   warmup=True):
    """histforest PolicyTree on the XOR design (any rank count: each rank fits its block)."""
    from forest import PolicyTree
    from native.blocks import block_range
    from native.comm import world
    from native.stats import STATS

    comm = world()
    data = _design(n, d, n_actions, seed)
    lo, hi = block_range(n, comm.size, comm.rank)
    kw = dict(max_depth=depth, max_bins=max_bins, min_samples_leaf=min_samples_leaf, exchange=exchange)
    warm = None
    if warmup:
        # Compile (or load) every Numba kernel the real fit uses, untimed: the same fit
        # once. A small warm-up fit does not reach the threaded kernels the full size
        # takes, and the first contender then paid their compile inside its timed fit.
        start = time.perf_counter()
        PolicyTree(**kw).fit(data.X[lo:hi], data.rewards[lo:hi], comm=comm)
        warm = time.perf_counter() - start
    comm.barrier()
    STATS.reset()
    start = time.perf_counter()
    tree = PolicyTree(**kw).fit(data.X[lo:hi], data.rewards[lo:hi], comm=comm)
    fit_s = time.perf_counter() - start
    value, best = _held_out_value(tree.predict, d, n_actions, seed)
    t = tree.tree_
    return {"fit_s": fit_s, "warmup_s": warm, "metrics": {"held_out_value": value, "best_value": best},
            "search": tree.search_, "bytes_sent_rank": int(STATS.bytes_sent),
            "tree": [t.feature.tolist(), t.bin_threshold.tolist(), t.missing_left.tolist(), tree.action_.tolist()],
            "text": tree.export_text()}


def contender_econml(n, d, n_actions, depth, seed, threads, honest=True, min_samples_leaf=5):
    """EconML's greedy econml.policy.PolicyTree on the same rewards."""
    from econml.policy import PolicyTree as EconPolicyTree

    data = _design(n, d, n_actions, seed)
    est = EconPolicyTree(max_depth=depth, honest=honest, min_samples_leaf=min_samples_leaf, random_state=seed)
    start = time.perf_counter()
    est.fit(data.X, data.rewards)
    fit_s = time.perf_counter() - start
    value, best = _held_out_value(lambda X: np.asarray(est.predict(X), dtype=np.int64), d, n_actions, seed)
    return {"fit_s": fit_s, "metrics": {"held_out_value": value, "best_value": best}}


# --------------------------------------------------------------------------- driver

def _ok(r):
    return r.get("status") == "ok"


def _cell(r, get):
    if not _ok(r):
        return r.get("status", "failed")
    try:
        return get(r)
    except (KeyError, TypeError):
        return "n/a"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes; prints, does not write RESULTS.md")
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--write", action="store_true", default=None, help="write RESULTS.md even with --quick")
    p.add_argument("--no-write", dest="write", action="store_false")
    args = p.parse_args(argv)
    q = args.quick
    small = dict(n=10_000 if q else 100_000, d=20, n_actions=3)
    big = dict(n=50_000 if q else 1_000_000, d=50, n_actions=10)
    seed = args.seed

    def run(name, fn, kwargs, **o):
        return _harness.run_contender(name, THIS, fn, kwargs, timeout=args.timeout,
                                      threads=o.pop("threads", args.threads), **o)

    body = [f"XOR design (forest/policy/simulate.py `xor_design`: X uniform on [-1, 1]^d; action 1 pays +1 "
            f"where (x0 > 0) == (x1 > 0) and -1 elsewhere, action 2 pays 0.3, further actions less, action 0 "
            f"nothing; rewards = means + N(0, 1) noise, as doubly robust scores are). Best policy value 0.65; "
            f"the best single split is worth 0.3. Held-out value: true mean reward of the learned policy on "
            f"{N_TEST:,} fresh rows. {args.threads} threads per contender unless stated; each contender in a "
            f"fresh process; histforest times exclude Numba compilation (an untimed warm-up fit, reported)."]
    failed = []

    if "econml" in args.parts:
        kw = dict(small, depth=2, seed=seed)
        res = [("histforest PolicyTree(2), exact, 64 bins (default)", run("histforest depth 2", "contender_ours", kw)),
               ("EconML PolicyTree(max_depth=2), defaults (honest)", run("EconML depth 2", "contender_econml", kw)),
               ("histforest PolicyTree(2), exact, 32 bins",
                run("histforest depth 2, 32 bins", "contender_ours", dict(kw, max_bins=32))),
               ("histforest PolicyTree(2), exact, 16 bins",
                run("histforest depth 2, 16 bins", "contender_ours", dict(kw, max_bins=16))),
               ("EconML PolicyTree(max_depth=2, honest=False)",
                run("EconML depth 2 not honest", "contender_econml", dict(kw, honest=False)))]
        failed += [r for _, r in res if not _ok(r)]
        ref = res[1][1]
        rows = [[name, _cell(r, lambda r: r["fit_s"]),
                 _cell(r, lambda r: ref["fit_s"] / r["fit_s"]) if _ok(ref) else "n/a",
                 _cell(r, lambda r: r["metrics"]["held_out_value"]), _cell(r, lambda r: r.get("warmup_s") or "")]
                for name, r in res]
        body += ["", f"#### Depth 2 on {small['n']:,} x {small['d']} x {small['n_actions']} actions against EconML",
                 "", _harness.markdown_table(["contender", "fit s", "speed vs EconML default", "held-out value",
                                              "warm-up s"], rows)]
        if _ok(res[0][1]):
            body += ["", "histforest's tree:", "", "```", res[0][1]["text"], "```"]

    single_big = None
    if "big" in args.parts:
        single_big = run("histforest 1M x 50 x 10", "contender_ours", dict(big, depth=2, seed=seed))
        failed += [] if _ok(single_big) else [single_big]
        rows = [[f"{big['n']:,} x {big['d']} x {big['n_actions']}", args.threads,
                 _cell(single_big, lambda r: r["fit_s"]), _cell(single_big, lambda r: r["warmup_s"]),
                 _cell(single_big, lambda r: r["peak_rss_mb"]),
                 _cell(single_big, lambda r: r["metrics"]["held_out_value"])]]
        body += ["", "#### Depth 2 at scale (target: under 2 minutes on 2 cores)", "",
                 _harness.markdown_table(["rows x features x actions", "threads", "fit s", "warm-up s",
                                          "peak RSS MB", "held-out value"], rows)]

    if "depth3" in args.parts:
        r3 = run("histforest depth 3", "contender_ours", dict(small, depth=3, seed=seed))
        r2 = run("histforest depth 2 (16 bins)", "contender_ours", dict(small, depth=2, seed=seed, max_bins=16))
        failed += [r for r in (r3, r2) if not _ok(r)]
        rows = [[name, _cell(r, lambda r: r["fit_s"]), _cell(r, lambda r: r["metrics"]["held_out_value"]),
                 _cell(r, lambda r: r["peak_rss_mb"])]
                for name, r in (("depth 3, 16 bins (default)", r3), ("depth 2, 16 bins", r2))]
        body += ["", f"#### Depth 3 on {small['n']:,} x {small['d']} x {small['n_actions']}", "",
                 _harness.markdown_table(["tree", "fit s", "held-out value", "peak RSS MB"], rows)]

    if "mpi" in args.parts:
        kw = dict(big, depth=2, seed=seed)
        one = run("histforest mpirun -np 1", "contender_ours", kw, threads=1, launcher="mpirun", nprocs=1)
        runs = [(ex, run(f"histforest mpirun -np 2 exchange={ex}", "contender_ours", dict(kw, exchange=ex),
                         threads=1, launcher="mpirun", nprocs=2)) for ex in ("rows", "tables")]
        failed += [r for r in [one] + [r for _, r in runs] if not _ok(r)]
        rows = [["-np 1", "none", _cell(one, lambda r: r["fit_s"]), 0, 0, "yes"]]
        for ex, r in runs:
            same = _cell(r, lambda r: "yes" if _ok(one) and r["tree"] == one["tree"] else "NO")
            rows.append(["-np 2", ex, _cell(r, lambda r: r["fit_s"]),
                         _cell(r, lambda r: max(x["bytes_sent_rank"] for x in r["ranks"]) / 2**20),
                         _cell(r, lambda r: r["search"]["predicted_bytes"][ex] / 2**20), same])
        body += ["", f"#### Distributed depth 2 on {big['n']:,} x {big['d']} x {big['n_actions']}, "
                     f"1 thread per rank", "",
                 _harness.markdown_table(["ranks", "exchange", "fit s", "MiB sent by the fit (max rank)",
                                          "predicted MiB of the exchange alone", "same tree as -np 1"], rows),
                 "", "The fit's bytes also hold the binning's sample exchange and the records' combine."]

    for r in failed:
        body += ["", f"- {r['name']}: {r['status']}"]
    text = "\n".join(body)
    print("\n" + text)
    if args.write if args.write is not None else not q:
        _harness.write_results_section(SECTION, text, title="Quick smoke run" if q else "Full run")
        print(f"\nwritten to {_harness.RESULTS_PATH} under '## {SECTION}'")
    return 0


if __name__ == "__main__":
    sys.exit(main())

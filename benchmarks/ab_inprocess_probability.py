"""In-process A/B of ProbabilityForest's fit: two checkouts imported into one process, fits alternating.

Why one process: the 2-core machine is shared and its speed swings within minutes, so the
two contenders take turns inside one process (``old``, ``new``, then ``new``, ``old``, ...)
and the ratio is taken per pair. Each checkout's ``forest`` and ``histogram`` modules are
imported in turn (``sys.modules`` swapped before every fit), each warmed by a small fit.
Times are CPU seconds (``time.process_time``) of ``ProbabilityForest(n_estimators=--trees,
random_state=0).fit`` on bench_probability's simulated design; run it with
``NUMBA_NUM_THREADS=1``. Also checks that both give the same probabilities bit for bit.

Run it with an empty ``NUMBA_CACHE_DIR`` (both checkouts then compile in this process):
loading the second checkout's kernels from an on-disk cache written by another process
failed inside Numba (``NRT_adapt_ndarray_to_python: descr is NULL``).

Usage: ``rm -rf /tmp/ab_cache && NUMBA_CACHE_DIR=/tmp/ab_cache NUMBA_NUM_THREADS=1 .venv/bin/python
benchmarks/ab_inprocess_probability.py --old /tmp/base_worktree --new . [--rows 200000] [--trees 20] [--pairs 4]``
"""
import argparse
import importlib
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_probability import simulated  # noqa: E402

_PACKAGES = ("forest", "histogram")


def _ours(name):
    return any(name == p or name.startswith(p + ".") for p in _PACKAGES)


def _drop():
    for k in [k for k in sys.modules if _ours(k)]:
        del sys.modules[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--trees", type=int, default=20)
    ap.add_argument("--pairs", type=int, default=4, help="rounds of two fits each (old-new, then new-old, ...)")
    args = ap.parse_args()
    X, y, _ = simulated(args.rows, 0)
    loaded = {}
    for tag, root in (("old", args.old), ("new", args.new)):
        root = os.path.abspath(root)
        _drop()
        sys.path.insert(0, root)
        cls = importlib.import_module("forest.estimators.probability_forest").ProbabilityForest
        assert importlib.import_module("forest").__file__.startswith(root), (tag, root)
        cls(n_estimators=4, random_state=0).fit(X[:5000], y[:5000])
        sys.path.remove(root)
        loaded[tag] = ({k: v for k, v in sys.modules.items() if _ours(k)}, cls)
    times = {"old": [], "new": []}
    proba = {}
    for r in range(2 * args.pairs):
        for tag in (("old", "new") if r % 2 == 0 else ("new", "old")):
            _drop()
            sys.modules.update(loaded[tag][0])
            t0 = time.process_time()
            model = loaded[tag][1](n_estimators=args.trees, random_state=0).fit(X, y)
            times[tag].append(time.process_time() - t0)
            if tag not in proba:
                proba[tag] = model.predict_proba(X[:20000])
            print(f"{tag} {times[tag][-1]:.2f} s CPU, load {os.getloadavg()[0]:.2f}", flush=True)
    old, new = np.array(times["old"]), np.array(times["new"])
    print("identical probabilities:", proba["old"].tobytes() == proba["new"].tobytes())
    print(f"old median {np.median(old):.2f} min {old.min():.2f}; new median {np.median(new):.2f} min {new.min():.2f}; "
          f"old/new: medians {np.median(old) / np.median(new):.3f}, mins {old.min() / new.min():.3f}, "
          f"per pair median {np.median(old / new):.3f}")


if __name__ == "__main__":
    main()

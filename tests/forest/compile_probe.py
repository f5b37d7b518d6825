"""Run by tests/forest/test_warmup.py (alone or under mpirun): count the Numba compiles of
histforest's kernels during a warm-up step and during a fit; print one line per rank.

usage: compile_probe.py MODE VARIANT
  MODE "node": forest.cli.warmup.compile_once_per_node on the world, then a GBDT fit on it
  MODE "fit":  only the fit (this process alone), e.g. after forest-warmup
"""
import json
import sys

import numpy as np
from numba.core import event

import forest  # noqa: F401  (sets the cache directory)
from forest.cli.warmup import compile_once_per_node

OURS = ("native", "histogram", "forest")


class Counter(event.Listener):
    def __init__(self):
        self.names = []

    def on_start(self, evt):
        func = evt.data["dispatcher"].py_func
        if func.__module__.split(".")[0] in OURS:
            self.names.append(func.__qualname__)

    def on_end(self, evt):
        pass


def counted(fn):
    counter = Counter()
    event.register("numba:compile", counter)
    try:
        fn()
    finally:
        event.unregister("numba:compile", counter)
    return counter.names


def fit(variant, comm):
    from forest import GBDTClassifier, GBDTRegressor

    rng = np.random.default_rng(7 + comm.rank)
    X = rng.normal(size=(3000, 6))
    X[rng.uniform(size=X.shape) < 0.1] = np.nan
    y = np.nan_to_num(X[:, 1]) + rng.normal(size=3000)
    if variant == "gbdt-classifier":
        GBDTClassifier(n_estimators=3, random_state=1).fit(X, (y > 0).astype(int), comm=comm)
    elif variant == "gbdt-regressor":
        GBDTRegressor(n_estimators=3, random_state=1).fit(X, y, comm=comm)
    else:
        raise SystemExit(f"compile_probe: no fit for {variant}")


def main(mode, variant):
    if mode == "node":
        from native.comm import world

        comm = world()
        announced = []
        in_warmup = counted(lambda: compile_once_per_node(comm, [variant], announce=announced.append))
    else:
        from native.comm import SelfCommunicator

        comm = SelfCommunicator()
        announced, in_warmup = [], []
    in_fit = counted(lambda: fit(variant, comm))
    # One write per line, newline included: mpirun forwards each write of each rank as a
    # chunk, so a line printed in pieces can interleave with another rank's.
    sys.stdout.write("PROBE " + json.dumps({"rank": comm.rank, "announced": announced, "warmup": in_warmup,
                                            "fit": in_fit}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(*sys.argv[1:3])

"""Fits make no threaded BLAS call (histogram._thread_wait, "BLAS's workers").

A threaded BLAS call (NumPy's ``@`` or ``np.dot`` over more than ~10,000 rows) wakes
OpenBLAS's worker threads, which then spin for ~0.1 s of CPU before they sleep, on the
cores the fit's Numba threads use: it made a 50,000-row boosting fit 1.7x slower. The
workers are found first: the threads whose CPU time grows after a threaded dot product
while the process sleeps (``/proc/self/task``). Each estimator is then fitted on 12,000
rows (past OpenBLAS's threading thresholds), and those threads must not have run during
the fit or after it. Where a threaded dot product wakes no worker (one core, BLAS limited
to one thread) or the threads cannot be read, there is nothing to detect and the tests skip.
"""
import os
import time

import numpy as np
import pytest

from forest import (CausalForest, CausalSurvivalForest, GBDTClassifier, GBDTRegressor, InstrumentalForest,
                    ProbabilityForest, QuantileForest, RegressionForest, SurvivalForest)
from native.comm import SelfCommunicator

IDLE_S = 0.3     # how long the process sleeps while the workers' CPU time is read
SETTLE_S = 0.25  # longer than a BLAS worker spins (~0.1 s), so earlier calls' workers are asleep
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _thread_cpu_s():
    """{thread id: CPU seconds} of this process's threads (Linux /proc)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # the thread ended
        out[int(tid)] = (int(fields[11]) + int(fields[12])) * TICK_S  # utime, stime
    return out


def _grown(before, after, tids):
    return sum(after.get(t, 0.0) - before.get(t, 0.0) for t in tids)


@pytest.fixture(scope="module")
def blas_workers():
    """Thread ids that spin after a threaded BLAS dot product (skip if none)."""
    if not os.path.isdir("/proc/self/task"):
        pytest.skip("no /proc/self/task to read threads' CPU time from")
    a = np.ones(200_000)
    time.sleep(SETTLE_S)
    # A control window first: threads busy on their own (another library's background
    # thread left by an earlier test in this process) are not taken for BLAS's workers.
    start = _thread_cpu_s()
    time.sleep(IDLE_S)
    before = _thread_cpu_s()
    busy_anyway = {t for t in before if before[t] - start.get(t, 0.0) >= 1.5 * TICK_S}
    # Three dot products: on a loaded machine (the suite's other worker) a spinning worker
    # gets a share of a core, 0.04-0.05 s of CPU per call here with two busy processes.
    for _ in range(3):
        a @ a
        time.sleep(IDLE_S)
    after = _thread_cpu_s()
    workers = {t for t in after if t != os.getpid() and t not in busy_anyway
               and after[t] - before.get(t, 0.0) >= 0.05}
    if not workers:
        pytest.skip("a threaded BLAS call wakes no spinning worker here: nothing to detect")
    return workers


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    n = 12_000
    X = rng.normal(size=(n, 4))
    t = (rng.uniform(size=n) < 0.5).astype(np.float64)
    y = X[:, 0] + t * (1 + X[:, 1]) + rng.normal(size=n)
    time_ = rng.exponential(size=n) * np.exp(0.3 * X[:, 0])
    event = (rng.uniform(size=n) < 0.7).astype(np.int64)
    z = (rng.uniform(size=n) < 0.5).astype(np.float64)
    return {"X": X, "t": t, "y": y, "yb": (y > np.median(y)).astype(np.float64), "time": time_, "event": event,
            "z": z}


FITS = {
    "GBDTClassifier": lambda d: GBDTClassifier(n_estimators=3).fit(d["X"], d["yb"]),
    "GBDTRegressor": lambda d: GBDTRegressor(n_estimators=3).fit(d["X"], d["y"]),
    "RegressionForest": lambda d: RegressionForest(4, random_state=0).fit(d["X"], d["y"]),
    "ProbabilityForest": lambda d: ProbabilityForest(4, random_state=0).fit(d["X"], d["yb"]),
    "QuantileForest": lambda d: QuantileForest(4, random_state=0).fit(d["X"], d["y"]),
    "SurvivalForest": lambda d: SurvivalForest(4, random_state=0).fit(d["X"], d["time"], d["event"]),
    "CausalForest": lambda d: CausalForest(4, random_state=0).fit(d["X"], d["t"], d["y"]),
    "InstrumentalForest": lambda d: InstrumentalForest(4, random_state=0).fit(d["X"], d["t"], d["y"], d["z"]),
    "CausalSurvivalForest": lambda d: CausalSurvivalForest(n_estimators=4, horizon=1.0, random_state=0).fit(
        d["X"], d["t"], d["time"], d["event"], comm=SelfCommunicator()),
}


@pytest.mark.parametrize("name", sorted(FITS))
def test_fit_makes_no_threaded_blas_call(name, data, blas_workers):
    FITS[name](data)            # compile (or load) the kernels first: compilation may use BLAS
    time.sleep(SETTLE_S)
    before = _thread_cpu_s()
    FITS[name](data)
    time.sleep(IDLE_S)          # a call near the fit's end spins on into this
    spun = _grown(before, _thread_cpu_s(), blas_workers)
    # An idle worker sleeps and gathers no CPU time at all; a spinning one gathers several
    # clock ticks even on a loaded machine, so more than one tick means a threaded call.
    assert spun < 1.5 * TICK_S, (
        f"BLAS's worker threads ran {spun:.2f} CPU s during and after {name}.fit: a reduction over rows "
        f"went through BLAS (use np.einsum or np.sum; histogram._thread_wait)")


def test_a_threaded_call_is_seen(blas_workers):
    """The detector's positive control: one threaded dot product, as a fit would make it."""
    a = np.ones(200_000)
    time.sleep(SETTLE_S)
    before = _thread_cpu_s()
    a @ a
    time.sleep(IDLE_S)
    assert _grown(before, _thread_cpu_s(), blas_workers) >= 1.5 * TICK_S

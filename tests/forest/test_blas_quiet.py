"""Fits leave no BLAS worker spinning (histogram._thread_wait, "BLAS's workers").

A threaded BLAS call (NumPy's ``@`` or ``np.dot`` over more than ~10,000 rows) wakes
OpenBLAS's worker threads, which then spin for ~0.1 s of CPU before they sleep, on the
cores the fit's Numba threads use: it made a 50,000-row boosting fit 1.7x slower. Each
estimator here is fitted on 12,000 rows (past OpenBLAS's threading thresholds), and the
process's own CPU time while it then sleeps must stay near zero. The detector is
calibrated first: where a threaded dot product leaves no spinning worker (one core, or
BLAS limited to one thread), there is nothing to detect and the tests skip.
"""
import resource
import time

import numpy as np
import pytest

from forest import (CausalForest, CausalSurvivalForest, GBDTClassifier, GBDTRegressor, InstrumentalForest,
                    ProbabilityForest, QuantileForest, RegressionForest, SurvivalForest)
from native.comm import SelfCommunicator

IDLE_S = 0.3     # how long the process sleeps while its CPU time is read
SETTLE_S = 0.25  # longer than a BLAS worker spins (~0.1 s), so earlier calls' workers are asleep


def _cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_while_idle():
    start = _cpu_s()
    time.sleep(IDLE_S)
    return _cpu_s() - start


@pytest.fixture(scope="module")
def spin_s():
    """CPU seconds a threaded BLAS dot product's workers spend after it (skip if none)."""
    a = np.ones(200_000)
    time.sleep(SETTLE_S)
    a @ a
    spin = _cpu_while_idle()
    if spin < 0.03:
        pytest.skip(f"a threaded BLAS call leaves no spinning worker here ({spin:.3f} CPU s in {IDLE_S} s idle)")
    return spin


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
def test_fit_leaves_no_blas_worker_spinning(name, data, spin_s):
    FITS[name](data)            # compile (or load) the kernels first: compilation may use BLAS
    time.sleep(SETTLE_S)
    FITS[name](data)
    after = _cpu_while_idle()
    assert after < min(0.03, spin_s / 3), (
        f"{name}.fit left {after:.3f} CPU s of work in {IDLE_S} s idle (a threaded BLAS call spins "
        f"{spin_s:.3f} s here): a reduction over rows went through BLAS (use np.einsum or np.sum)")

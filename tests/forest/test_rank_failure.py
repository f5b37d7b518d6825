"""A bad input seen by one rank must end the whole mpirun job quickly, never hang it.

``native.comm.world()`` installs the abort-on-uncaught hook when the job has more than
one rank, so an estimator's ValueError on one rank aborts every rank with its message.
"""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# Bounds on wall-clock time: run with the machine to themselves (pyproject: solo).
pytestmark = pytest.mark.solo

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = Path(sys.executable).parent / "mpirun"

SCRIPT = textwrap.dedent("""
    import numpy as np
    from native.comm import world
    from forest.estimators.{module} import {cls}
    comm = world()
    rng = np.random.default_rng(0)
    X = rng.uniform(size=(300, 3))
    y = X[:, 0].copy()
    t = (rng.uniform(size=300) < 0.5).astype(float)
    if comm.rank == 1:
        y[5] = np.nan          # only rank 1 sees the bad value
    est = {cls}(n_estimators=4)
    est.fit(X, {args}, comm=comm)
    print("finished on rank", comm.rank)
""")


@pytest.mark.skipif(not MPIRUN.exists(), reason="mpirun from the mpich wheel is not installed")
@pytest.mark.parametrize("module, cls, args", [
    ("regression_forest", "RegressionForest", "y"),
    ("causal_forest", "CausalForest", "t, y"),
    ("gbdt", "GBDTRegressor", "y"),
])
def test_bad_input_on_one_rank_aborts_the_job(tmp_path, module, cls, args):
    script = tmp_path / "bad_rank.py"
    script.write_text(SCRIPT.format(module=module, cls=cls, args=args))
    env = dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    start = time.monotonic()
    proc = subprocess.run([str(MPIRUN), "-np", "2", sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    elapsed = time.monotonic() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "NaN" in out, out
    assert "finished on rank" not in out, out
    assert elapsed < 60, f"job took {elapsed:.1f} s to come down"

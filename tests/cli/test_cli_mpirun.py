"""The tools under real `mpirun`: same model for 1 and 32 ranks, errors printed once,
a crashing rank takes the job down, predictions keep the input order."""
import os
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import make_table, run_mpi, tool
from forest.io import model_io
from forest.cli import train

def causal(n_trees=4):
    return ["--treatment", "t", "--outcome", "y", "--features", "a", "b", "c", "--n-estimators", str(n_trees),
            "--param", "nuisance_estimators=4", "--no-progress"]


CAUSAL = causal()


@pytest.fixture(scope="module")
def tiny_parquet(tmp_path_factory):
    """120 rows in 6 row groups: under -np 32, 26 ranks hold no rows at all."""
    path = str(tmp_path_factory.mktemp("tiny") / "tiny.parquet")
    pq.write_table(make_table(120, seed=11), path, row_group_size=20)
    return path


def _assert_same_model(path_a, path_b, X):
    a, b = model_io.load(path_a), model_io.load(path_b)
    for key in ("feature", "bin_threshold", "missing_left", "left", "right"):
        np.testing.assert_array_equal(a.estimators_[key], b.estimators_[key])
    np.testing.assert_allclose(a.estimators_["value"], b.estimators_["value"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.predict(X), b.predict(X), rtol=1e-10, atol=1e-12)


def test_np32_trains_the_np1_model(tiny_parquet, tmp_path):
    one, many = str(tmp_path / "np1.model"), str(tmp_path / "np32.model")
    assert train.main([tiny_parquet, "--out", one] + CAUSAL) == 0
    start = time.perf_counter()
    proc = run_mpi(32, [tool("forest-train"), tiny_parquet, "--out", many] + CAUSAL, timeout=400)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "32 rank(s)" in proc.stderr
    table = pq.read_table(tiny_parquet)
    X = np.column_stack([table[c].to_numpy() for c in ("a", "b", "c")])
    _assert_same_model(one, many, X)
    print(f"mpirun -np 32 forest-train on 120 rows: {elapsed:.1f} s")


def test_bad_input_on_one_rank_is_reported_once(tmp_path):
    table = make_table(300)
    y = table["y"].to_numpy().copy()
    y[290] = np.nan  # in the last row group: only the last rank sees it
    table = table.set_column(table.schema.get_field_index("y"), "y", pa.array(y))
    path = str(tmp_path / "bad.parquet")
    pq.write_table(table, path, row_group_size=50)
    start = time.perf_counter()
    proc = run_mpi(3, [tool("forest-train"), path, "--out", str(tmp_path / "m")] + CAUSAL, timeout=120)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert lines == ["forest-train: error: column 'y' has 1 NaN/infinite value(s) (first: NaN at row 290); "
                     "it must be finite"], proc.stderr
    assert not os.path.exists(tmp_path / "m")
    assert time.perf_counter() - start < 100


CRASH = """
import sys
from forest.cli import train
from native.comm import world

real = train.TreeProgress.__call__
def crash(self, done, total=None):
    if world().rank == 1 and done >= 1:
        raise RuntimeError("injected crash on rank 1 after its first tree")
    return real(self, done, total)
train.TreeProgress.__call__ = crash
sys.exit(train.main(sys.argv[1:]))
"""


def test_rank_crash_mid_training_ends_the_job(small_parquet, tmp_path):
    import sys

    out = str(tmp_path / "m.model")
    args = [sys.executable, "-c", CRASH, small_parquet, "--out", out] + causal(40)
    start = time.perf_counter()
    proc = run_mpi(2, args, timeout=120)
    elapsed = time.perf_counter() - start
    assert proc.returncode != 0
    assert "injected crash on rank 1" in proc.stderr
    assert not os.path.exists(out)
    assert elapsed < 90, elapsed


def test_predict_np3_keeps_order_and_ids(small_parquet, tmp_path):
    model = str(tmp_path / "cf.model")
    assert train.main([small_parquet, "--out", model] + causal(8)) == 0
    out = str(tmp_path / "pred.parquet")
    proc = run_mpi(3, [tool("forest-predict"), model, small_parquet, "--out", out, "--keep", "id", "name",
                       "--interval"], timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("wrote 400 rows") == 1
    got = pq.read_table(out)
    assert got.column_names == ["id", "name", "tau", "tau_lower", "tau_upper"]
    src = pq.read_table(small_parquet)
    assert got["id"].to_pylist() == src["id"].to_pylist()
    assert got["name"].to_pylist() == src["name"].to_pylist()
    est = model_io.load(model)
    X = np.column_stack([src[c].to_numpy() for c in ("a", "b", "c")])
    np.testing.assert_allclose(got["tau"].to_numpy(), est.predict(X), rtol=1e-12, atol=1e-12)
    lo, hi = est.predict_interval(X, alpha=0.05)
    np.testing.assert_allclose(got["tau_lower"].to_numpy(), lo, rtol=1e-12, atol=1e-12)
    assert (got["tau_lower"].to_numpy() <= got["tau"].to_numpy()).all()

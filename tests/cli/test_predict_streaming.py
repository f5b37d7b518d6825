"""``forest-predict`` streams: row groups predicted in slices, ranks spill to a temporary
file and hand over in rank order; the output equals the estimator's predictions on all
rows, in input order, for any rank count; rows per second are reported; no spill file
is left behind."""
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from cli_helpers import make_table, run_mpi, tool
from forest.io import model_io
from forest.cli import predict, train


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """700 rows in 7 row groups of 100 (so -np 4 leaves one rank with a single group)."""
    path = str(tmp_path_factory.mktemp("stream") / "grouped.parquet")
    pq.write_table(make_table(700, seed=21), path, row_group_size=100)
    return path


@pytest.fixture(scope="module")
def models(grouped, tmp_path_factory):
    out = {}
    folder = tmp_path_factory.mktemp("models")
    for kind, extra in (("causal", ["--treatment", "t", "--param", "nuisance_estimators=4"]),
                        ("gbdt-classifier", [])):
        path = str(folder / f"{kind}.model")
        outcome = "t" if kind == "gbdt-classifier" else "y"
        assert train.main([grouped, "--model", kind, "--outcome", outcome, "--features", "a", "b", "c",
                           "--n-estimators", "6", "--no-progress", "--out", path] + extra) == 0
        out[kind] = path
    return out


def _expected(model_path, data):
    est = model_io.load(model_path)
    src = pq.read_table(data)
    X = src.select(["a", "b", "c"])
    return est, src, X


def test_slices_equal_whole_prediction(models, grouped, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(predict, "PREDICT_BATCH_ROWS", 37)     # slices cut across row groups' ends
    out = str(tmp_path / "p.parquet")
    assert predict.main([models["causal"], grouped, "--out", out, "--keep", "id", "--interval"]) == 0
    err = capsys.readouterr().err
    assert "wrote 700 rows" in err and "rows/s" in err, err
    est, src, X = _expected(models["causal"], grouped)
    got = pq.read_table(out)
    assert got["id"].to_pylist() == src["id"].to_pylist()
    np.testing.assert_array_equal(got["tau"].to_numpy(), est.predict(X))
    lo, hi = est.predict_interval(X)
    np.testing.assert_array_equal(got["tau_lower"].to_numpy(), lo)
    np.testing.assert_array_equal(got["tau_upper"].to_numpy(), hi)


@pytest.mark.parametrize("np_", [2, 4])
def test_mpirun_keeps_order_and_cleans_up(models, grouped, tmp_path, np_):
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    out = str(tmp_path / "p.parquet")
    proc = run_mpi(np_, [tool("forest-predict"), models["gbdt-classifier"], grouped, "--out", out, "--keep", "id",
                         "name"], timeout=180, env={"TMPDIR": str(spill_dir)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.count("wrote 700 rows") == 1 and "rows/s" in proc.stderr
    est, src, X = _expected(models["gbdt-classifier"], grouped)
    got = pq.read_table(out)
    assert got.column_names[:2] == ["id", "name"]
    assert got["id"].to_pylist() == src["id"].to_pylist()
    assert got["name"].to_pylist() == src["name"].to_pylist()
    np.testing.assert_array_equal(got["prediction"].to_numpy(), est.predict(X))
    proba = est.predict_proba(X)
    for k, c in enumerate(est.classes_):
        np.testing.assert_array_equal(got[f"proba_{c}"].to_numpy(), proba[:, k])
    assert os.listdir(spill_dir) == []                          # spill files removed
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []


def test_failed_run_leaves_no_output_or_spill(models, grouped, tmp_path):
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    out = str(tmp_path / "p.parquet")
    # --interval on a classifier fails on every rank before any row is read
    proc = run_mpi(2, [tool("forest-predict"), models["gbdt-classifier"], grouped, "--out", out, "--interval"],
                   timeout=120, env={"TMPDIR": str(spill_dir)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("forest-predict: error:") == 1
    assert not os.path.exists(out)
    assert os.listdir(spill_dir) == []


def test_failure_mid_stream_leaves_no_output_or_spill(models, tmp_path):
    """Rank 1's last row group holds an infinite feature: every rank stops with one
    message after rank 0 and rank 1 have already written predictions."""
    table = make_table(700, seed=21)
    a = table["a"].to_numpy().copy()
    a[650] = np.inf
    data = str(tmp_path / "bad.parquet")
    pq.write_table(table.set_column(table.column_names.index("a"), "a", [a]), data, row_group_size=100)
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    out = str(tmp_path / "p.parquet")
    proc = run_mpi(2, [tool("forest-predict"), models["causal"], data, "--out", out], timeout=120,
                   env={"TMPDIR": str(spill_dir)})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.count("forest-predict: error:") == 1, proc.stderr
    assert not os.path.exists(out)
    assert os.listdir(spill_dir) == []
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []

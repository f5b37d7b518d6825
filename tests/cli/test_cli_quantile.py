"""forest-train --model quantile, forest-predict's quantile columns, forest-report (issue 34)."""
import contextlib
import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import run_mpi, tool
from forest.cli import predict, report, train
from forest.io import model_io


def _table(n=1200, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 3))
    y = x[:, 0] + np.where(x[:, 1] > 0, 2.0, 0.5) * rng.normal(size=n)
    return pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "region": rng.choice(["n", "s", "e"], n), "y": y})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("q") / "q.parquet")
    pq.write_table(_table(), path, row_group_size=300)
    return path


def test_train_predict_report(data, tmp_path):
    model = str(tmp_path / "q.model")
    with contextlib.redirect_stderr(io.StringIO()):
        assert train.main([data, "--model", "quantile", "--outcome", "y", "--quantiles", "0.05,0.5,0.95",
                           "--n-estimators", "12", "--out", model]) == 0
    est = model_io.load(model)
    assert type(est).__name__ == "QuantileForest" and tuple(est.quantiles) == (0.05, 0.5, 0.95)
    out = str(tmp_path / "p.parquet")
    with contextlib.redirect_stderr(io.StringIO()):
        assert predict.main([model, data, "--out", out]) == 0
    got = pq.read_table(out)
    assert got.column_names == ["prediction_q0.05", "prediction_q0.5", "prediction_q0.95"]
    cols = np.column_stack([got.column(c).to_numpy() for c in got.column_names])
    assert np.all(np.diff(cols, axis=1) >= 0)
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
        assert report.main([model, "--data", data]) == 0
    assert "out-of-bag" in text.getvalue() and "prediction_q0.95" in text.getvalue()


def test_bad_quantiles_is_one_line(data, tmp_path, capsys):
    assert train.main([data, "--model", "quantile", "--outcome", "y", "--quantiles", "0.5,0.1",
                       "--out", str(tmp_path / "m")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "increasing" in err[0]


def test_quantile_model_under_mpirun_equals_one_process(data, tmp_path):
    one, three = str(tmp_path / "one.model"), str(tmp_path / "three.model")
    args = [data, "--model", "quantile", "--outcome", "y", "--n-estimators", "8"]
    with contextlib.redirect_stderr(io.StringIO()):
        assert train.main(args + ["--out", one]) == 0
    proc = run_mpi(3, [tool("forest-train")] + args + ["--out", three], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = model_io.load(one), model_io.load(three)
    X = _table(200, 9).drop(["y"])
    np.testing.assert_array_equal(a.predict(X), b.predict(X))

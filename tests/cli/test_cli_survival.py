"""forest-train --model survival, forest-predict --times, forest-report's survival section (issue 33)."""
import contextlib
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import run_mpi, tool
from forest.cli import predict, report, train
from forest.io import model_io


def _table(n=1500, seed=3, event_values=None):
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 3))
    rate = np.exp(x[:, 0])
    failure, censor = rng.exponential(1 / rate), rng.exponential(2.0, n)
    event = (failure <= censor).astype(np.int64) if event_values is None else event_values
    return pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "region": rng.choice(["n", "s", "e"], n),
                     "days": np.minimum(failure, censor), "died": event})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("s") / "s.parquet")
    pq.write_table(_table(), path, row_group_size=400)
    return path


def _quiet(fn, *args):
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


def test_train_predict_report(data, tmp_path):
    model = str(tmp_path / "s.model")
    assert _quiet(train.main, [data, "--model", "survival", "--time", "days", "--event", "died",
                               "--n-estimators", "16", "--out", model]) == 0
    est = model_io.load(model)
    assert type(est).__name__ == "SurvivalForest" and est.category_coder_ is not None
    out = str(tmp_path / "p.parquet")
    assert _quiet(predict.main, [model, data, "--times", "0.5,1.5", "--keep", "days", "--out", out]) == 0
    got = pq.read_table(out)
    assert got.column_names == ["days", "prediction", "survival_0.5", "survival_1.5"]
    s05, s15 = got.column("survival_0.5").to_numpy(), got.column("survival_1.5").to_numpy()
    assert np.all(s15 <= s05) and np.all((s05 >= 0) & (s05 <= 1))
    X = _table().drop(["days", "died"])
    np.testing.assert_allclose(got.column("prediction").to_numpy(), est.predict(X), rtol=1e-12)
    text, js = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
        assert report.main([model, "--data", data]) == 0
    assert "Survival by predicted risk (out of bag)" in text.getvalue()
    with contextlib.redirect_stdout(js), contextlib.redirect_stderr(io.StringIO()):
        assert report.main([model, "--data", data, "--json"]) == 0
    part = json.loads(js.getvalue())["survival"]
    assert len(part["groups"]) == 4 and part["concordance"] > 0.6
    # risk groups are ordered: the highest-risk group's observed survival is the lowest
    last = [g["observed"][-1] for g in part["groups"]]
    assert last[0] > last[-1]


def test_role_options_and_bad_events_are_one_line(data, tmp_path, capsys):
    out = str(tmp_path / "m")
    for argv, message in (([data, "--model", "survival", "--time", "days", "--out", out], "--event COL is required"),
                          ([data, "--model", "survival", "--time", "days", "--event", "died", "--outcome", "a",
                            "--out", out], "--outcome is only used"),
                          ([data, "--model", "regression", "--outcome", "a", "--time", "days", "--out", out],
                           "--time is only used by the survival and causal-survival models")):
        assert train.main(argv) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    bad = str(tmp_path / "bad.parquet")
    pq.write_table(_table(200, 4, event_values=np.full(200, 2)), bad)
    assert train.main([bad, "--model", "survival", "--time", "days", "--event", "died", "--out", out]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "0 (censored) or 1" in err[0], err


def test_times_need_a_survival_model(data, tmp_path, capsys):
    model = str(tmp_path / "r.model")
    assert _quiet(train.main, [data, "--model", "regression", "--outcome", "a", "--n-estimators", "4",
                               "--out", model]) == 0
    assert predict.main([model, data, "--times", "1", "--out", str(tmp_path / "p.parquet")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--times needs a survival model" in err[0], err


def test_survival_model_under_mpirun_equals_one_process(data, tmp_path):
    one, three = str(tmp_path / "one.model"), str(tmp_path / "three.model")
    args = [data, "--model", "survival", "--time", "days", "--event", "died", "--n-estimators", "8"]
    assert _quiet(train.main, args + ["--out", one]) == 0
    proc = run_mpi(3, [tool("forest-train")] + args + ["--out", three], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = model_io.load(one), model_io.load(three)
    X = _table(200, 9).drop(["days", "died"])
    np.testing.assert_allclose(a.predict_survival_function(X), b.predict_survival_function(X), rtol=0, atol=1e-12)

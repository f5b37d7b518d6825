"""forest-train --model causal-survival --horizon, forest-predict and forest-report's effect on survival (issue 33)."""
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


def _table(n=1200, seed=5):
    """A randomized trial: treatment adds 0.5 to the failure time where a > 0; uniform censoring."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(n, 3))
    arm = rng.binomial(1, 0.5, n)
    failure = rng.exponential(1.0, n) + 0.5 * arm * (x[:, 0] > 0)
    censor = rng.uniform(0, 3, n)
    return pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "arm": arm,
                     "days": np.minimum(failure, censor), "died": (failure <= censor).astype(np.int64)})


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cs") / "cs.parquet")
    pq.write_table(_table(), path, row_group_size=300)
    return path


def _quiet(fn, *args):
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


ARGS = ["--model", "causal-survival", "--treatment", "arm", "--time", "days", "--event", "died", "--horizon", "1.5"]


def test_train_predict_report(data, tmp_path):
    model = str(tmp_path / "cs.model")
    assert _quiet(train.main, [data] + ARGS + ["--n-estimators", "100", "--out", model]) == 0
    est = model_io.load(model)
    assert type(est).__name__ == "CausalSurvivalForest" and est.horizon_ == 1.5 and est.target_ == "RMST"
    out = str(tmp_path / "p.parquet")
    assert _quiet(predict.main, [model, data, "--out", out]) == 0
    X = _table().select(["a", "b", "c"])
    got = pq.read_table(out).column(0).to_numpy()
    np.testing.assert_allclose(got, est.predict(X), rtol=1e-12)
    # the effect lives where a > 0
    assert got[X.column("a").to_numpy() > 0.3].mean() > got[X.column("a").to_numpy() < -0.3].mean() + 0.1
    text, js = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
        assert report.main([model, "--data", data]) == 0
    assert "Observed restricted mean survival time up to 1.5 by arm" in text.getvalue()
    assert "Causal survival forest's average effect" in text.getvalue()
    with contextlib.redirect_stdout(js), contextlib.redirect_stderr(io.StringIO()):
        assert report.main([model, "--data", data, "--json"]) == 0
    part = json.loads(js.getvalue())
    arms = part["survival_arms"]
    # a randomized trial: the unadjusted difference and the forest's effect agree within a few standard errors
    est_all = part["analysis"]["average_effect"]["all"] if "average_effect" in part["analysis"] else None
    assert arms["difference"] > 0.05
    if est_all is not None:
        assert abs(est_all["estimate"] - arms["difference"]) < 4 * est_all["stderr"]
    # the robustness table and the summary tree, in the JSON and on the page
    analysis = part["analysis"]
    assert [b["c_y"] for b in analysis["sensitivity"]["bounds"]] == [0.01, 0.05, 0.1]
    assert analysis["summary_tree"]["text"].startswith("if ") and analysis["summary_tree"]["leaves"]
    page = str(tmp_path / "r.html")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert report.main([model, "--data", data, "--html", page]) == 0
    html = open(page).read()
    for anchor in ("survival-arms", "sensitivity", "summary-tree", "average-effects"):
        assert f'<section id="{anchor}">' in html, anchor


def test_horizon_is_required_and_checked(data, tmp_path, capsys):
    out = str(tmp_path / "m")
    for argv, message in (([data] + ARGS[:-2] + ["--out", out], "horizon is required"),
                          ([data] + ARGS[:-1] + ["99", "--out", out], "beyond the last observed time"),
                          ([data] + ARGS + ["--target", "median", "--out", out], "target must be one of")):
        assert train.main(argv) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err


def test_causal_survival_under_mpirun_equals_one_process(data, tmp_path):
    one, three = str(tmp_path / "one.model"), str(tmp_path / "three.model")
    args = [data] + ARGS + ["--n-estimators", "12", "--param", "survival_estimators=8",
                            "--param", "nuisance_estimators=8", "--param", "max_grid_times=16"]
    assert _quiet(train.main, args + ["--out", one]) == 0
    proc = run_mpi(3, [tool("forest-train")] + args + ["--out", three], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = model_io.load(one), model_io.load(three)
    X = _table(200, 9).select(["a", "b", "c"])
    np.testing.assert_allclose(a.predict(X), b.predict(X), rtol=0, atol=1e-9)
    np.testing.assert_allclose(a.ate_, b.ate_, rtol=0, atol=1e-9)

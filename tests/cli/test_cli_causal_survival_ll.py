"""forest-train --model causal-survival --local-linear [--ll-lambda L|oob] [--ll-variables COL ...] (issue 33):
the model file holds the correction and its penalty, equals the in-memory fit, and under mpirun the
out-of-bag penalty is the one-process one."""
import contextlib
import io
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest

from cli_helpers import run_mpi, tool
from test_cli_causal_survival import ARGS, _table
from forest import CausalSurvivalForest
from forest.analysis.local_linear import LAMBDA_PATH
from forest.cli import predict, train
from forest.io import model_io

SMALL = ["--n-estimators", "40", "--param", "survival_estimators=20", "--param", "nuisance_estimators=20",
         "--param", "max_grid_times=24"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("csll") / "cs.parquet")
    pq.write_table(_table(), path, row_group_size=300)
    return path


def _quiet(fn, *args):
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


def test_out_of_bag_penalty_in_the_model_file_equals_the_in_memory_fit(data, tmp_path):
    model = str(tmp_path / "ll.model")
    assert _quiet(train.main, [data] + ARGS + SMALL + ["--local-linear", "--ll-lambda", "oob", "--out", model]) == 0
    est = model_io.load(model)
    assert est.local_linear and est.ll_lambda is None and est.ll_lambda_ in LAMBDA_PATH
    assert est.ll_columns_.tolist() == [0, 1, 2] and est.ll_tables_ is not None
    table = _table()
    X = table.select(["a", "b", "c"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = CausalSurvivalForest(horizon=1.5, n_estimators=40, survival_estimators=20, nuisance_estimators=20,
                                   max_grid_times=24, local_linear=True, ll_lambda=None).fit(
            X, table.column("arm").to_numpy(), table.column("days").to_numpy(), table.column("died").to_numpy())
    assert est.ll_lambda_ == ref.ll_lambda_
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=0, atol=1e-9)
    out = str(tmp_path / "p.parquet")
    assert _quiet(predict.main, [model, data, "--out", out]) == 0
    np.testing.assert_allclose(pq.read_table(out).column(0).to_numpy(), est.predict(X), rtol=1e-12)
    # a fixed penalty on chosen variables
    fixed = str(tmp_path / "fixed.model")
    assert _quiet(train.main, [data] + ARGS + SMALL + ["--local-linear", "--ll-lambda", "0.05", "--ll-variables",
                                                       "c", "a", "--out", fixed]) == 0
    est = model_io.load(fixed)
    assert est.ll_lambda == est.ll_lambda_ == 0.05 and est.ll_columns_.tolist() == [0, 2]
    plain = model_io.load(fixed)
    plain.set_params(local_linear=False)
    assert np.abs(est.predict(X) - plain.predict(X)).max() > 1e-4


@pytest.mark.parametrize("extra,message", [
    (["--ll-lambda", "0.1"], "--ll-lambda goes with --local-linear"),
    (["--ll-variables", "a"], "--ll-variables goes with --local-linear"),
    (["--local-linear", "--ll-lambda", "small"], "--ll-lambda expects a number >= 0 or 'oob'"),
    (["--local-linear", "--ll-lambda", "-1"], "--ll-lambda -1: ll_lambda must be a finite number >= 0"),
    (["--local-linear", "--ll-variables", "zz"], "--ll-variables names 'zz', which is not a feature column"),
    (["--local-linear", "--ll-variables", "a", "a"], "--ll-variables"),
    (["--local-linear", "--param", "local_linear=false"], "given twice"),
    (["--ll-importance"], "--ll-importance goes with --local-linear"),
    (["--local-linear", "--ll-importance", "--ll-variables", "a"], "give one"),
])
def test_bad_options_get_one_clear_line(data, tmp_path, capsys, extra, message):
    assert train.main([data] + ARGS + extra + ["--out", str(tmp_path / "m")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_correction_variables_chosen_by_importance_equal_the_in_memory_fit(data, tmp_path):
    """--ll-importance reads every numeric feature as a candidate and keeps what the effect forest's
    split frequencies keep, as CausalSurvivalForest(linear_correction_variables="importance") does."""
    model = str(tmp_path / "imp.model")
    assert _quiet(train.main, [data] + ARGS + SMALL + ["--local-linear", "--ll-importance", "--ll-lambda", "oob",
                                                       "--out", model]) == 0
    est = model_io.load(model)
    assert est.linear_correction_variables == "importance" and est.ll_lambda_ in LAMBDA_PATH
    table = _table()
    X = table.select(["a", "b", "c"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = CausalSurvivalForest(horizon=1.5, n_estimators=40, survival_estimators=20, nuisance_estimators=20,
                                   max_grid_times=24, local_linear=True, ll_lambda=None,
                                   linear_correction_variables="importance").fit(
            X, table.column("arm").to_numpy(), table.column("days").to_numpy(), table.column("died").to_numpy())
    assert est.ll_columns_.tolist() == ref.ll_columns_.tolist() and 1 <= len(est.ll_columns_) <= 3
    assert est.ll_lambda_ == ref.ll_lambda_
    np.testing.assert_allclose(est.predict(X), ref.predict(X), rtol=0, atol=1e-9)


def test_local_linear_is_the_causal_survival_forests(data, tmp_path, capsys):
    argv = [data, "--model", "survival", "--time", "days", "--event", "died", "--local-linear",
            "--out", str(tmp_path / "m")]
    assert train.main(argv) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "only used by the causal-survival model, not 'survival'" in err[0], err


def test_out_of_bag_penalty_under_mpirun_equals_one_process(data, tmp_path):
    one, two = str(tmp_path / "one.model"), str(tmp_path / "two.model")
    args = [data] + ARGS + ["--n-estimators", "12", "--param", "survival_estimators=8", "--param",
                            "nuisance_estimators=8", "--param", "max_grid_times=16", "--local-linear",
                            "--ll-lambda", "oob", "--ll-variables", "a", "b"]
    assert _quiet(train.main, args + ["--out", one]) == 0
    proc = run_mpi(2, [tool("forest-train")] + args + ["--out", two], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    a, b = model_io.load(one), model_io.load(two)
    assert a.ll_lambda_ == b.ll_lambda_
    X = _table(200, 9).select(["a", "b", "c"])
    np.testing.assert_allclose(a.predict(X), b.predict(X), rtol=0, atol=1e-9)

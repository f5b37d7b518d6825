"""Bad input: one-line error naming the problem, exit code 2, nothing written."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forest.cli import predict, report, train

from cli_helpers import make_table

TRAIN_CAUSAL = ["--treatment", "t", "--outcome", "y", "--features", "a", "b", "c", "--n-estimators", "4",
                "--no-progress"]
TRAIN_REG = ["--model", "regression", "--outcome", "y", "--features", "a", "b", "c", "--n-estimators", "4",
             "--no-progress"]


def _run(main, argv, capsys):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def _expect_error(main, argv, capsys, pattern, prog="forest-train"):
    import re

    code, err = _run(main, argv, capsys)
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith(f"{prog}: error: ")
    assert re.search(pattern, err[0]), err[0]


def _write(tmp_path, name, table, **kw):
    path = str(tmp_path / name)
    pq.write_table(table, path, **kw)
    return path


def _with(table, name, values):
    return table.set_column(table.schema.get_field_index(name), name, pa.array(values))


def test_missing_and_non_numeric_columns(small_parquet, tmp_path, capsys):
    out = str(tmp_path / "m.model")
    base = [small_parquet, "--out", out, "--model", "regression", "--outcome", "y", "--features", "a"]
    _expect_error(train.main, base + ["zz"], capsys, r"missing column 'zz'")
    # a string column is categorical now (issue 32); a timestamp is neither a number nor a category
    stamped = make_table()
    stamped = stamped.append_column("when", pa.array(np.arange(stamped.num_rows).astype("datetime64[s]")))
    stamped_path = _write(tmp_path, "stamped.parquet", stamped)
    _expect_error(train.main, [stamped_path] + base[1:] + ["when"], capsys,
                  r"feature column 'when' cannot be used \(timestamp")
    _expect_error(train.main, [small_parquet, "--out", out, "--model", "regression", "--outcome", "nope"],
                  capsys, r"missing column 'nope'")
    assert not os.path.exists(out)


@pytest.mark.parametrize("column,value,pattern", [
    ("y", np.nan, r"column 'y' has 1 NaN/infinite value\(s\) \(first: NaN at row 333\)"),
    ("y", np.inf, r"column 'y' has 1 NaN/infinite value\(s\) \(first: infinite value at row 333\)"),
])
def test_nan_or_inf_in_outcome(tmp_path, capsys, column, value, pattern):
    table = make_table()
    y = table["y"].to_numpy().copy()
    y[333] = value
    path = _write(tmp_path, "d.parquet", _with(table, "y", y), row_group_size=80)
    _expect_error(train.main, [path, "--out", str(tmp_path / "m")] + TRAIN_REG, capsys, pattern)


def test_nan_in_treatment_and_single_arm(tmp_path, capsys):
    table = make_table()
    t = table["t"].to_numpy().astype(float)
    t[5] = np.nan
    path = _write(tmp_path, "d.parquet", _with(table, "t", t))
    _expect_error(train.main, [path, "--out", str(tmp_path / "m")] + TRAIN_CAUSAL, capsys,
                  r"column 't' has 1 NaN/infinite value")
    path = _write(tmp_path, "one.parquet", _with(table, "t", np.ones(table.num_rows, np.int8)))
    _expect_error(train.main, [path, "--out", str(tmp_path / "m")] + TRAIN_CAUSAL, capsys,
                  r"treatment column 't' has a single arm \(every row is 1.0\)")


def test_empty_unreadable_and_mismatched_files(tmp_path, capsys):
    out = str(tmp_path / "m")
    empty = _write(tmp_path, "empty.parquet", make_table().slice(0, 0))
    _expect_error(train.main, [empty, "--out", out] + TRAIN_REG, capsys, r"holds no rows \(empty file\)")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not a parquet file" * 10)
    _expect_error(train.main, [str(bad), "--out", out] + TRAIN_REG, capsys, r"cannot read parquet file .*bad.parquet")
    os.mkdir(tmp_path / "parts")
    _write(tmp_path, "parts/p0.parquet", make_table(50))
    other = make_table(50)
    _write(tmp_path, "parts/p1.parquet", _with(other, "a", other["a"].to_numpy().astype(np.float32)))
    _expect_error(train.main, [str(tmp_path / "parts"), "--out", out] + TRAIN_REG, capsys,
                  r"mismatched schema across files: column 'a' is float in .*p1.parquet")
    _expect_error(train.main, [str(tmp_path / "none.parquet"), "--out", out] + TRAIN_REG, capsys, r"does not exist")
    assert not os.path.exists(out)


def test_option_errors(small_parquet, tmp_path, capsys):
    out = str(tmp_path / "m")
    _expect_error(train.main, [small_parquet, "--out", out, "--param", "no_such=1"] + TRAIN_REG, capsys,
                  r"has no parameter 'no_such'")
    _expect_error(train.main, [small_parquet, "--out", str(tmp_path / "nodir" / "m")] + TRAIN_REG, capsys,
                  r"output directory .*nodir' does not exist")
    _expect_error(train.main, [small_parquet, "--out", out, "--model", "causal", "--outcome", "y"], capsys,
                  r"--treatment COL is required")
    _expect_error(train.main, [small_parquet, "--out", out] + TRAIN_REG + ["--features", "a", "y"], capsys,
                  r"column 'y' is both a feature")


def test_model_file_problems(small_parquet, tmp_path, capsys):
    model = str(tmp_path / "reg.model")
    assert train.main([small_parquet, "--out", model] + TRAIN_REG) == 0
    capsys.readouterr()
    pred = str(tmp_path / "p.parquet")
    gbdt = str(tmp_path / "gb.model")
    assert train.main([small_parquet, "--out", gbdt] + TRAIN_REG[2:] + ["--model", "gbdt-regressor"]) == 0
    capsys.readouterr()
    _expect_error(predict.main, [gbdt, small_parquet, "--out", pred, "--interval"], capsys,
                  r"holds a GBDTRegressor; --interval needs a causal, instrumental or regression forest",
                  prog="forest-predict")
    # a regression forest has intervals (little bags of 2 trees by default)
    written = str(tmp_path / "intervals.parquet")
    assert predict.main([model, small_parquet, "--out", written, "--interval"]) == 0
    capsys.readouterr()
    import pyarrow.parquet as pq

    table = pq.read_table(written)
    assert {"prediction", "prediction_lower", "prediction_upper"} <= set(table.column_names)
    lower, mid, upper = (table[c].to_numpy() for c in ("prediction_lower", "prediction", "prediction_upper"))
    assert (lower <= mid).all() and (mid <= upper).all() and (upper > lower).any()
    _expect_error(predict.main, [small_parquet, small_parquet, "--out", pred], capsys,
                  r"is not a histforest model file", prog="forest-predict")
    data = open(model, "rb").read()
    with open(model, "wb") as f:
        f.write(data[: len(data) // 2])
    _expect_error(report.main, [model], capsys, r"truncated or corrupted", prog="forest-report")
    assert not os.path.exists(pred)


def test_nan_features_are_legal_and_report_works(small_parquet, tmp_path, capsys):
    model = str(tmp_path / "reg.model")
    assert train.main([small_parquet, "--out", model] + TRAIN_REG) == 0  # column c has NaNs
    capsys.readouterr()
    assert report.main([model, "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "depth-weighted" in out and len([ln for ln in out.splitlines() if ln.strip()[:1].isdigit()]) == 2


def test_keep_column_clashing_with_a_model_output(tmp_path, capsys):
    """A classifier writes proba_<class> columns: keeping a data column of that name fails."""
    table = make_table(200)
    table = table.append_column("label", pa.array((table["y"].to_numpy() > 1).astype(np.int64)))
    table = table.append_column("proba_1", pa.array(np.arange(200)))
    path = _write(tmp_path, "clf.parquet", table)
    model = str(tmp_path / "clf.model")
    assert train.main([path, "--out", model, "--model", "gbdt-classifier", "--outcome", "label",
                       "--features", "a", "b", "--n-estimators", "3", "--no-progress"]) == 0
    capsys.readouterr()
    out = str(tmp_path / "p.parquet")
    _expect_error(predict.main, [model, path, "--out", out, "--keep", "id", "proba_1"], capsys,
                  r"--keep column 'proba_1' would clash with an output column \(outputs: prediction, proba_0, proba_1\)",
                  prog="forest-predict")
    assert not os.path.exists(out)
    assert predict.main([model, path, "--out", out, "--keep", "id"]) == 0


@pytest.mark.parametrize("value, pattern", [("0", "HISTFOREST_MPI=0, but this process is one of 2"),
                                            ("maybe", "HISTFOREST_MPI must be 1 or 0")])
def test_a_bad_histforest_mpi_setting_is_one_line(small_parquet, tmp_path, value, pattern):
    # Under mpirun -np 2, HISTFOREST_MPI=0 would have each rank train on its own rows.
    from cli_helpers import run_mpi, tool

    out = str(tmp_path / "m.model")
    proc = run_mpi(2, [tool("forest-train"), small_parquet, *TRAIN_CAUSAL, "--out", out], timeout=300,
                   env={"HISTFOREST_MPI": value})
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("forest-train: error: ") and pattern in lines[0], proc.stderr
    assert not os.path.exists(out)

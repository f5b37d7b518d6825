"""Categorical feature columns in the tools (issue 32): forest-train reads dictionary and string
columns as categories and says which columns it leaves out and why, forest-predict codes them
with the model's categories, forest-report names them and draws one bar per category; bad input
is one line; any rank count trains the same model."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import run_mpi, tool
from forest.cli import predict, report, train
from forest.engine.tree import CATEGORICAL_SPLIT
from forest.io import dataio, model_io
from forest.report import summary as rep

REG = ["--model", "regression", "--outcome", "y", "--n-estimators", "8", "--no-progress"]
RACES = np.array(["black", "other", "white"])


def categorical_table(n=1500, seed=5):
    """race (dictionary), edu (strings with nulls), x (float), when (timestamp), t, y.

    Rows are sorted so that race "asian" lives in the last 150 rows only: under
    ``mpirun -np 2`` and ``-np 3`` only the last rank holds it.
    """
    rng = np.random.default_rng(seed)
    race = RACES[rng.integers(0, 3, n)].astype(object)
    tail = n - n // 10
    race[tail:][rng.random(n - tail) < 0.5] = "asian"
    edu = np.array(["college", "grad", "hs", "none"])[rng.integers(0, 4, n)].astype(object)
    edu[rng.random(n) < 0.05] = None
    x = rng.normal(size=n)
    t = (rng.random(n) < 0.5).astype(np.int8)
    y = x + t * (1.0 + 2.0 * (race == "black")) + 1.5 * (race == "asian") + 0.3 * rng.normal(size=n)
    return pa.table({"race": pa.array(list(race)).dictionary_encode(), "edu": pa.array(list(edu), pa.string()),
                     "x": x, "when": pa.array(np.arange(n).astype("datetime64[ns]")), "t": t, "y": y})


@pytest.fixture(scope="module")
def cat_parquet(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("cat") / "cat.parquet")
    pq.write_table(categorical_table(), path, row_group_size=250)
    return path


@pytest.fixture(scope="module")
def cat_model(cat_parquet, tmp_path_factory):
    """forest-train's regression forest on :func:`categorical_table` (one process) and its stderr."""
    import contextlib
    import io

    out = str(tmp_path_factory.mktemp("model") / "cat.model")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert train.main([cat_parquet, "--out", out] + REG) == 0
    return out, err.getvalue()


def _lines(text):
    return [line for line in text.strip().splitlines() if line.strip()]


# ------------------------------------------------------------------ which columns are features

def test_feature_choice_rules(tmp_path):
    path = str(tmp_path / "c.parquet")
    table = categorical_table(40).append_column("code", pa.array(np.arange(40) % 4)) \
        .append_column("empty", pa.nulls(40, pa.float64()))
    pq.write_table(table, path)
    source = dataio.open_source(path)
    choice = dataio.choose_features(source, exclude=["y"])
    assert choice.features == ["race", "edu", "x", "t", "code"]
    assert choice.categorical.tolist() == [True, True, False, False, False]
    assert choice.left_out_line() == ("left out: when (timestamp[ns]: not a number or a category), "
                                      "empty (no value at all)")
    forced = dataio.choose_features(source, exclude=["y"], categorical=["code"])
    assert forced.categorical.tolist() == [True, True, False, False, True]
    plain = dataio.choose_features(source, exclude=["y"], use_categories=False)
    assert plain.features == ["x", "t", "code"]
    assert "race (dictionary<values=string, indices=int32, ordered=0>: categories, and --no-categorical is given)" \
        in plain.left_out_line()
    named = dataio.choose_features(source, named=["x", "edu"])
    assert named.features == ["x", "edu"] and named.categorical.tolist() == [False, True] and not named.left_out
    with pytest.raises(dataio.DataError, match=r"feature column 'when' cannot be used \(timestamp\[ns\]: not a number or a category\)"):
        dataio.choose_features(source, named=["x", "when"])
    with pytest.raises(dataio.DataError, match="drop --no-categorical"):
        dataio.choose_features(source, named=["race"], use_categories=False)
    with pytest.raises(dataio.DataError, match="--categorical names 'code', which is not a feature column"):
        dataio.choose_features(source, named=["x"], categorical=["code"])


def test_dictionary_in_one_file_and_strings_in_another_are_one_column(tmp_path):
    table = categorical_table(200)
    parts = tmp_path / "parts"
    parts.mkdir()
    pq.write_table(table.slice(0, 100), str(parts / "a.parquet"))
    plain = table.slice(100).set_column(0, "race", table.column("race").slice(100).cast(pa.string()))
    pq.write_table(plain, str(parts / "b.parquet"))
    source = dataio.open_source(str(parts))
    assert dataio.choose_features(source, exclude=["y", "t"]).categorical.tolist() == [True, True, False]
    shard = dataio.read_shard(source, (0, len(source.groups)), keep=["race"])
    assert shard.keep.column("race").to_pylist() == table.column("race").to_pylist()


# ------------------------------------------------------------------ train, predict, report

def test_train_reads_categories_and_says_what_it_leaves_out(cat_model):
    path, err = cat_model
    lines = _lines(err)
    assert "forest-train: left out: when (timestamp[ns]: not a number or a category)" in lines
    assert any("trained RegressionForest on 1500 rows x 4 features (2 categorical)" in line for line in lines), err
    est = model_io.load(path)
    assert list(est.feature_names_in_) == ["race", "edu", "x", "t"]
    assert est.is_categorical_.tolist() == [True, True, False, False]
    assert est.category_coder_.categories_[0].tolist() == ["asian", "black", "other", "white"]
    assert est.bin_mapper_.categorical_.tolist() == [True, True, False, False]
    assert (est.estimators_["bin_threshold"] == CATEGORICAL_SPLIT).any()
    header = model_io.read_header(path)
    assert header["metadata"]["categorical_features"] == ["race", "edu"]


def test_predict_codes_categories_unseen_and_null_as_missing(cat_model, cat_parquet, tmp_path):
    path, _ = cat_model
    rows = pq.read_table(cat_parquet).slice(0, 4)
    rows = pa.concat_tables([rows, rows, rows]).combine_chunks()
    data = str(tmp_path / "new.parquet")
    # as strings, not a dictionary: seen categories, then unseen ones, then nulls
    race = pa.array(["black", "white", "asian", "other"] + ["martian"] * 4 + [None] * 4)
    pq.write_table(rows.set_column(0, "race", race), data)
    out = str(tmp_path / "pred.parquet")
    assert predict.main([path, data, "--out", out]) == 0
    got = pq.read_table(out)["prediction"].to_numpy()
    assert len(got) == 12 and np.isfinite(got).all()
    np.testing.assert_array_equal(got[4:8], got[8:])     # an unseen category goes where a missing value goes
    est = model_io.load(path)
    np.testing.assert_array_equal(got, est.predict(pq.read_table(data).select(["race", "edu", "x", "t"])))


def test_a_column_numeric_at_fit_and_categorical_at_predict_is_one_line(tmp_path, capsys):
    table = categorical_table(300).append_column("code", pa.array(np.arange(300) % 5))
    fit_data, new_data = str(tmp_path / "fit.parquet"), str(tmp_path / "new.parquet")
    pq.write_table(table, fit_data)
    model = str(tmp_path / "m.model")
    assert train.main([fit_data, "--out", model, "--features", "x", "code"] + REG) == 0
    capsys.readouterr()
    pq.write_table(table.set_column(table.column_names.index("code"), "code",
                                    pa.array([f"c{i % 5}" for i in range(300)])), new_data)
    assert predict.main([model, new_data, "--out", str(tmp_path / "p.parquet")]) == 2
    err = _lines(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("forest-predict: error: column 'code' holds categories (string)")
    assert "numeric when the model was fitted" in err[0]


def test_report_names_categorical_features_and_draws_bars(cat_model, cat_parquet, tmp_path, capsys):
    path, _ = cat_model
    page = str(tmp_path / "r.html")
    assert report.main([path, "--data", cat_parquet, "--html", page]) == 0
    text = capsys.readouterr().out
    assert "4 features (2 categorical)" in text
    assert "race (categorical, 4 levels)" in text and "edu (categorical, 4 levels)" in text
    assert "race (categorical; range" in text
    bars = [line.split() for line in text.splitlines() if line.startswith("    ") and "#" in line]
    assert {b[0] for b in bars} >= {"asian", "black", "other", "white"}
    html = open(page, encoding="utf-8").read()
    assert "race (categorical, 4 levels)" in html
    assert "race (categorical): one bar per category" in html


def test_report_json_lists_categories(cat_model, cat_parquet, capsys):
    import json

    path, _ = cat_model
    assert report.main([path, "--data", cat_parquet, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["categorical"]["race"]["levels"] == 4
    curve = out["partial_dependence"]["features"]["race"]
    assert curve["categories"] == ["asian", "black", "other", "white"] and len(curve["mean"]) == 4
    means = dict(zip(curve["categories"], curve["mean"]))
    assert means["black"] > means["white"]


def test_a_categorical_split_reads_as_a_set_of_categories(cat_model):
    est = model_io.load(cat_model[0])
    trees = rep.model_trees(est)
    names = list(est.feature_names_in_)
    for tree in trees:
        nodes = np.flatnonzero((tree.bin_threshold == CATEGORICAL_SPLIT) & (tree.feature == 0))
        if len(nodes):
            text = rep.split_condition(tree, int(nodes[0]), names, est.category_coder_)
            assert text.startswith("race in {") and text.endswith("}")
            members = text[len("race in {"):-1].split(", ")
            assert set(members) <= {"asian", "black", "other", "white"} and members
            break
    else:
        pytest.fail("no split on race")
    numeric = next(int(n) for n in range(trees[0].node_count) if trees[0].feature[n] == 2)
    assert rep.split_condition(trees[0], numeric, names).startswith("x <= ")


# ------------------------------------------------------------------ bad input, one line

def test_strings_in_one_file_and_numbers_in_another_is_one_line(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    table = categorical_table(200)
    pq.write_table(table.slice(0, 100), str(parts / "a.parquet"))
    pq.write_table(table.slice(100).set_column(0, "race", pa.array(np.arange(100) % 3)), str(parts / "b.parquet"))
    proc = run_mpi(2, [tool("forest-train"), str(parts), "--out", str(tmp_path / "m.model")] + REG, timeout=240)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = _lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("forest-train: error: mismatched schema across files: categorical column 'race' "
                               "holds numbers (int64) in")
    assert "but strings (dictionary<" in lines[0] and "give it one type in every file" in lines[0]


def test_more_levels_than_the_limit_is_one_line_with_a_hint(tmp_path, capsys, monkeypatch):
    import histogram.categories

    monkeypatch.setattr(histogram.categories, "MAX_LEVELS", 3)
    path = str(tmp_path / "c.parquet")
    pq.write_table(categorical_table(300), path)
    assert train.main([path, "--out", str(tmp_path / "m.model"), "--features", "x", "edu"] + REG) == 2
    err = _lines(capsys.readouterr().err)
    assert len(err) == 1, err
    assert err[0].startswith("forest-train: error: categorical column 'edu' has 4 distinct values, more than the 3")
    assert "forest-train: leave it out" in err[0]


def test_categorical_option_clashes_are_refused(cat_parquet, tmp_path, capsys):
    out = str(tmp_path / "m.model")
    assert train.main([cat_parquet, "--out", out, "--categorical", "y"] + REG) == 2
    assert "only features can be categorical" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train.main([cat_parquet, "--out", out, "--categorical", "x", "--no-categorical"] + REG)


def test_no_categorical_leaves_category_columns_out(cat_parquet, tmp_path, capsys):
    out = str(tmp_path / "m.model")
    assert train.main([cat_parquet, "--out", out, "--no-categorical", "--n-estimators", "2"] + REG[:-3]
                      + ["--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "left out: race (dictionary<values=string, indices=int32, ordered=0>: categories, and --no-categorical " \
           "is given), edu (string: categories, and --no-categorical is given), when (timestamp[ns]" in err
    assert "x 2 features (0 categorical)" in err
    assert not hasattr(model_io.load(out), "category_coder_")


def test_integer_codes_as_categories(cat_parquet, tmp_path, capsys):
    path = str(tmp_path / "codes.parquet")
    table = categorical_table(600)
    codes = pa.array(np.searchsorted(["asian", "black", "other", "white"], table.column("race").to_pylist()))
    pq.write_table(pa.table({"race": codes, "x": table["x"], "y": table["y"]}), path)
    out = str(tmp_path / "m.model")
    assert train.main([path, "--out", out, "--categorical", "race"] + REG) == 0
    assert "x 2 features (1 categorical)" in capsys.readouterr().err
    est = model_io.load(out)
    assert est.category_coder_.kinds_ == ["number"] and est.is_categorical_.tolist() == [True, False]
    pred = str(tmp_path / "p.parquet")
    assert predict.main([out, path, "--out", pred]) == 0


# ------------------------------------------------------------------ any rank count, the same model

def _assert_same_model(path_a, path_b, rows):
    a, b = model_io.load(path_a), model_io.load(path_b)
    for key in ("feature", "bin_threshold", "missing_left", "left", "right", "cat_bits"):
        np.testing.assert_array_equal(a.estimators_[key], b.estimators_[key])
    for ca, cb in zip(a.category_coder_.categories_, b.category_coder_.categories_):
        assert ca.tolist() == cb.tolist()
    np.testing.assert_allclose(a.estimators_["value"], b.estimators_["value"], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(a.predict(rows), b.predict(rows), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("np_", [2, 3])
def test_any_rank_count_trains_the_one_rank_model(cat_model, cat_parquet, tmp_path, np_):
    one, _ = cat_model
    many = str(tmp_path / f"np{np_}.model")
    proc = run_mpi(np_, [tool("forest-train"), cat_parquet, "--out", many] + REG, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = _lines(proc.stderr)
    assert lines.count("forest-train: left out: when (timestamp[ns]: not a number or a category)") == 1
    assert f"with {np_} rank(s)" in proc.stderr
    rows = pq.read_table(cat_parquet).select(["race", "edu", "x", "t"])
    _assert_same_model(one, many, rows)
    # "asian" lives in the last rank's rows only, and every rank codes it the same
    assert model_io.load(many).category_coder_.categories_[0].tolist()[0] == "asian"


# ------------------------------------------------------------------ causal models

def test_causal_model_with_categories_trains_predicts_and_reports(cat_parquet, tmp_path, capsys):
    out = str(tmp_path / "cf.model")
    assert train.main([cat_parquet, "--out", out, "--treatment", "t", "--outcome", "y", "--n-estimators", "8",
                       "--param", "nuisance_estimators=4", "--no-progress"]) == 0
    assert "x 3 features (2 categorical)" in capsys.readouterr().err
    pred = str(tmp_path / "tau.parquet")
    assert predict.main([out, cat_parquet, "--out", pred, "--interval"]) == 0
    assert report.main([out, "--data", cat_parquet]) == 0
    assert "race (categorical, 4 levels)" in capsys.readouterr().out
    assert os.path.exists(pred)


def test_a_pandas_index_written_with_the_table_is_left_out(tmp_path):
    import pandas as pd

    df = pd.DataFrame({"x": np.arange(6.0), "c": list("abcabc"), "y": np.arange(6.0)}, index=[9, 4, 7, 1, 3, 0])
    path = str(tmp_path / "indexed.parquet")
    df.to_parquet(path)            # a non-default index: pandas writes __index_level_0__
    choice = dataio.choose_features(dataio.open_source(path), exclude=["y"])
    assert choice.features == ["x", "c"] and choice.categorical.tolist() == [False, True]
    assert "__index_level_0__ (the pandas index written with the table)" in choice.left_out_line()

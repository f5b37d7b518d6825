"""A classifier's outcome column may hold text labels (forest.io.dataio.class_labels): forest-train
reads them as the Python classifier takes them, at any rank count, and forest-predict writes them."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import run_mpi, tool
from forest.io import dataio
from forest.io import model_io
from forest.cli import train


def test_class_labels_of_each_column_type():
    ints, msg = dataio.class_labels(pa.chunked_array([[3, 1], [2]], pa.int32()), "y")
    assert msg is None and ints.dtype == np.int64 and ints.tolist() == [3, 1, 2]
    bools, _ = dataio.class_labels(pa.array([True, False]), "y")
    assert bools.dtype == np.int64 and bools.tolist() == [1, 0]
    floats, msg = dataio.class_labels(pa.array([0.0, 1.0]), "y")
    assert msg is None and floats.dtype == np.float64
    text, msg = dataio.class_labels(pa.chunked_array([["yes", "no"], ["yes"]]), "y")
    assert msg is None and text.dtype == object and text.tolist() == ["yes", "no", "yes"]
    large, _ = dataio.class_labels(pa.array(["a", "b"], pa.large_string()), "y")
    assert large.tolist() == ["a", "b"]
    categories, _ = dataio.class_labels(pa.array(["a", "b", "a"]).dictionary_encode(), "y")
    assert categories.tolist() == ["a", "b", "a"]


@pytest.mark.parametrize("column,expected", [
    (pa.array(["a", None, "b"]), "column 'y' has 1 missing value(s) (first at row 11)"),
    (pa.array([1.0, float("nan")]), "column 'y' has 1 NaN/infinite value(s) (first: NaN at row 11)"),
    (pa.array([1, 2], pa.timestamp("s")), "column 'y' has type timestamp[s], which cannot hold class labels"),
])
def test_unusable_labels_are_named(column, expected):
    labels, message = dataio.class_labels(column, "y", first_row=10)
    assert labels is None or message is not None
    assert message.startswith(expected), message


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    root = tmp_path_factory.mktemp("labels")
    rng = np.random.default_rng(3)
    n = 1200
    X = rng.normal(size=(n, 3))
    label = np.where(X[:, 0] + 0.3 * rng.normal(size=n) > 0, "churned", "stayed")
    table = pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "label": label,
                      "category": pa.array(label).dictionary_encode()})
    path = str(root / "labels.parquet")
    pq.write_table(table, path, row_group_size=200)
    holey = table.set_column(3, "label", pa.array(list(label[:900]) + [None] + list(label[901:])))
    holey_path = str(root / "holey.parquet")
    pq.write_table(holey, holey_path, row_group_size=200)
    return root, path, holey_path, label


ARGS = ["--model", "gbdt-classifier", "--features", "a", "b", "c", "--n-estimators", "8", "--no-progress"]


@pytest.mark.parametrize("column", ["label", "category"])
def test_text_labels_train_and_predict(labelled, column, tmp_path):
    root, path, _, label = labelled
    out = str(tmp_path / "m.model")
    assert train.main([path, "--outcome", column, "--out", out] + ARGS) == 0
    model = model_io.load(out)
    assert list(model.classes_) == ["churned", "stayed"]
    pred = str(tmp_path / "p.parquet")
    proc = run_mpi(1, [tool("forest-predict"), out, path, "--out", pred])
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pq.read_table(pred)
    assert table.schema.field("prediction").type == pa.string()
    assert {"proba_churned", "proba_stayed"} <= set(table.column_names)
    assert np.mean(np.asarray(table.column("prediction").to_pylist()) == label) > 0.9


@pytest.mark.parametrize("np_", [2, 3])
def test_text_labels_give_the_same_model_at_any_rank_count(labelled, tmp_path, np_):
    _, path, _, _ = labelled
    one, many = str(tmp_path / "one.model"), str(tmp_path / "many.model")
    assert train.main([path, "--outcome", "label", "--out", one] + ARGS) == 0
    proc = run_mpi(np_, [tool("forest-train"), path, "--outcome", "label", "--out", many] + ARGS, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    X = pq.read_table(path).select(["a", "b", "c"])
    a, b = model_io.load(one), model_io.load(many)
    assert list(a.classes_) == list(b.classes_)
    # GBDT sums over ranks in another order: the same model up to rounding (README)
    np.testing.assert_allclose(a.predict_proba(X), b.predict_proba(X), rtol=0, atol=1e-12)
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


def test_a_missing_label_is_one_line_at_any_rank_count(labelled, tmp_path):
    _, _, holey, _ = labelled
    out = str(tmp_path / "m.model")
    proc = run_mpi(3, [tool("forest-train"), holey, "--outcome", "label", "--out", out] + ARGS, timeout=240)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower()]
    assert lines == ["forest-train: error: column 'label' has 1 missing value(s) (first at row 900); class labels "
                     "must all be present"], proc.stderr[-3000:]
    assert not os.path.exists(out)


def test_text_outcome_of_a_regressor_is_still_refused(labelled, tmp_path, capsys):
    _, path, _, _ = labelled
    argv = [path, "--outcome", "label", "--out", str(tmp_path / "r.model"), "--model", "gbdt-regressor",
            "--features", "a", "b", "c", "--no-progress"]
    assert train.main(argv) == 2
    assert "non-numeric column 'label'" in capsys.readouterr().err


def test_report_on_data_with_text_labels(labelled, tmp_path):
    from forest.cli import report

    _, path, _, _ = labelled
    out = str(tmp_path / "m.model")
    assert train.main([path, "--outcome", "label", "--out", out] + ARGS) == 0
    _, _, text = report.build_report(out, data=path)
    assert "P(stayed)" in text  # the positive (second) class of a binary classifier

"""forest-train --model probability on a text class column; forest-predict writes one column per class;
forest-report summarises the probabilities (issue 34)."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import run_mpi, tool
from forest.cli import report, train
from forest.estimators.probability_forest import ProbabilityForest
from forest.io import model_io

CLASSES = ["bear", "cat", "dog"]
ARGS = ["--model", "probability", "--outcome", "animal", "--features", "a", "b", "c", "--n-estimators", "20",
        "--no-progress"]


@pytest.fixture(scope="module")
def animals(tmp_path_factory):
    """900 rows sorted by label (so with two ranks or more, rank 0 holds no "dog"), row groups of 100."""
    rng = np.random.default_rng(11)
    n = 900
    X = rng.normal(size=(n, 3))
    y = np.digitize(X[:, 0] + 0.5 * rng.normal(size=n), [-0.5, 0.5])
    order = np.argsort(y, kind="stable")
    X, y = X[order], y[order]
    table = pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "animal": np.array(CLASSES)[y]})
    path = str(tmp_path_factory.mktemp("animals") / "animals.parquet")
    pq.write_table(table, path, row_group_size=100)
    return path, X, np.array(CLASSES)[y]


def test_train_predict_and_report(animals, tmp_path):
    path, X, labels = animals
    out = str(tmp_path / "p.model")
    assert train.main([path, "--out", out] + ARGS) == 0
    model = model_io.load(out)
    assert type(model) is ProbabilityForest and model.classes_.tolist() == CLASSES
    pred = str(tmp_path / "pred.parquet")
    proc = run_mpi(2, [tool("forest-predict"), out, path, "--out", pred], timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = pq.read_table(pred)
    assert table.column_names == ["prediction"] + [f"proba_{c}" for c in CLASSES]
    assert table.schema.field("prediction").type == pa.string()
    proba = np.column_stack([table.column(f"proba_{c}").to_numpy() for c in CLASSES])
    np.testing.assert_array_equal(proba, model.predict_proba(X))
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.mean(np.asarray(table.column("prediction").to_pylist()) == labels) > 0.6
    # the report: importances and the class probabilities (out of bag: these are its training rows)
    rep_, _, text = report.build_report(out, data=path)
    assert "Feature importance (sorted by GRF depth-weighted split frequency):" in text
    assert list(rep_["predictions"]["columns"]) == [f"P({c})" for c in CLASSES]
    assert rep_["rows"]["source"] == "out-of-bag"


def test_same_model_when_a_rank_lacks_a_class(animals, tmp_path):
    path, X, _ = animals
    one, two = str(tmp_path / "one.model"), str(tmp_path / "two.model")
    assert train.main([path, "--out", one] + ARGS) == 0
    proc = run_mpi(2, [tool("forest-train"), path, "--out", two] + ARGS, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = model_io.load(one), model_io.load(two)
    assert b.classes_.tolist() == CLASSES
    np.testing.assert_array_equal(a.predict_proba(X), b.predict_proba(X))


def test_a_single_class_is_one_line(tmp_path, capsys):
    rng = np.random.default_rng(0)
    path = str(tmp_path / "one.parquet")
    pq.write_table(pa.table({"a": rng.normal(size=50), "b": rng.normal(size=50), "c": rng.normal(size=50),
                             "animal": ["cat"] * 50}), path)
    assert train.main([path, "--out", str(tmp_path / "m.model")] + ARGS) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if "error" in ln]
    assert err == ["forest-train: error: ProbabilityForest refused the input: ProbabilityForest needs at least 2 "
                   "classes in y, got 1 class over all rows"]

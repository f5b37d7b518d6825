"""The CLIs and the estimator's feature names (issue 11): recorded at training, used by name.

``forest-train`` fits on pre-binned codes and passes the feature columns' names, so the
model holds ``feature_names_in_`` like one fitted on a DataFrame; ``forest-predict`` and
``forest-report`` read those columns by name (any order in the data) and hand the
estimator a named table, so no scikit-learn warning about feature names appears.
"""
import warnings

import numpy as np
import pyarrow.parquet as pq
import pytest

from forest.io import model_io
from forest.cli import predict, report, train

from cli_helpers import make_table

FEATURES = ["a", "b", "c"]


@pytest.mark.parametrize("model", ["causal", "regression", "gbdt-regressor"])
def test_trained_model_records_and_uses_feature_names(model, small_parquet, tmp_path, capsys):
    path = str(tmp_path / "m.model")
    args = [small_parquet, "--out", path, "--model", model, "--outcome", "y", "--features", *FEATURES,
            "--n-estimators", "4", "--no-progress"] + (["--treatment", "t"] if model == "causal" else [])
    assert train.main(args) == 0
    est = model_io.load(path)
    assert list(est.feature_names_in_) == FEATURES
    assert model_io.read_header(path)["feature_names"] == FEATURES

    # prediction data with the columns in another order (and extra ones)
    table = make_table()
    shuffled = table.select(["y", "c", "id", "b", "a"])
    data = str(tmp_path / "shuffled.parquet")
    pq.write_table(shuffled, data, row_group_size=100)
    out = str(tmp_path / "pred.parquet")
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a feature-name warning would fail here
        assert predict.main([path, data, "--out", out, "--keep", "id"]) == 0
        assert report.main([path, "--data", data, "--top", "3"]) == 0
    err = capsys.readouterr().err
    assert "feature names" not in err
    got = pq.read_table(out)
    want = est.predict(table.select(FEATURES))
    np.testing.assert_array_equal(got.column(1).to_numpy(), want)
    np.testing.assert_array_equal(got["id"].to_numpy(), table["id"].to_numpy())


def test_model_without_estimator_names_still_predicts(small_parquet, tmp_path, capsys):
    """Files written before estimators recorded names carry them in the header only."""
    path = str(tmp_path / "old.model")
    assert train.main([small_parquet, "--out", path, "--model", "regression", "--outcome", "y", "--features",
                       *FEATURES, "--n-estimators", "4", "--no-progress"]) == 0
    est = model_io.load(path)
    del est.feature_names_in_
    model_io.save(est, path, metadata={"model": "regression", "feature_names": FEATURES})
    out = str(tmp_path / "pred.parquet")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert predict.main([path, small_parquet, "--out", out]) == 0
    table = pq.read_table(small_parquet)
    X = np.column_stack([table[c].to_numpy(zero_copy_only=False) for c in FEATURES])
    np.testing.assert_array_equal(pq.read_table(out)["prediction"].to_numpy(), est.predict(X))

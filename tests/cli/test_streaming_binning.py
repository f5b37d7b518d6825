"""forest-train bins row groups as it reads them: the model equals an in-memory fit,
the estimators never receive float features, and the read path's peak memory stays
far below one float64 copy of a rank's features."""
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import make_table
from forest.io import dataio
from forest.io import model_io
from forest.estimators.causal_forest import CausalForest
from forest.cli import train
from forest.estimators.regression_forest import RegressionForest
from histogram.binning import BinMapper
from histogram.binning_stream import StreamingBinFit
from native.comm import SelfCommunicator


def _xty(path):
    table = pq.read_table(path)
    X = np.column_stack([table[c].to_numpy(zero_copy_only=False) for c in ("a", "b", "c")]).astype(float)
    return X, table["t"].to_numpy(), table["y"].to_numpy()


def test_cli_causal_model_equals_in_memory_fit(small_parquet, tmp_path):
    out = str(tmp_path / "cf.model")
    assert train.main([small_parquet, "--out", out, "--treatment", "t", "--outcome", "y",
                       "--features", "a", "b", "c", "--n-estimators", "8", "--random-state", "4",
                       "--param", "nuisance_estimators=6", "--no-progress"]) == 0
    X, t, y = _xty(small_parquet)
    ref = CausalForest(n_estimators=8, random_state=4, nuisance_estimators=6).fit(X, t.astype(np.int64), y)
    got = model_io.load(out)
    np.testing.assert_array_equal(got.bin_mapper_.thresholds_flat_, ref.bin_mapper_.thresholds_flat_)
    for key in ("feature", "bin_threshold", "left", "right"):
        np.testing.assert_array_equal(got.estimators_[key], ref.estimators_[key])
    np.testing.assert_allclose(got.predict(X), ref.predict(X), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.ate_, ref.ate_, rtol=1e-12)


def test_cli_regression_model_equals_in_memory_fit(small_parquet, tmp_path):
    out = str(tmp_path / "rf.model")
    assert train.main([small_parquet, "--out", out, "--model", "regression", "--outcome", "y",
                       "--features", "a", "b", "c", "--n-estimators", "6", "--no-progress"]) == 0
    X, _, y = _xty(small_parquet)
    ref = RegressionForest(n_estimators=6).fit(X, y)
    np.testing.assert_allclose(model_io.load(out).predict(X), ref.predict(X), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("model", ["causal", "regression", "gbdt-regressor"])
def test_estimator_gets_codes_not_float_features(model, small_parquet, tmp_path, monkeypatch):
    """The CLI passes X=None plus (mapper, codes); feature blocks are single row groups."""
    calls, blocks = [], []
    real_fit = {cls: cls.fit for cls in (CausalForest, RegressionForest)}
    from forest.estimators.gbdt import GBDTRegressor
    real_fit[GBDTRegressor] = GBDTRegressor.fit

    def spy(cls):
        def fit(self, X, *args, **kwargs):
            calls.append((X, kwargs.get("binned")))
            return real_fit[cls](self, X, *args, **kwargs)
        return fit

    for cls in real_fit:
        monkeypatch.setattr(cls, "fit", spy(cls))
    # On a cold kernel cache forest-train first fits a small warm-up model from raw X
    # (forest.cli.warmup); that fit is not the one under test.
    from forest.cli import warmup
    monkeypatch.setattr(warmup, "compile_once_per_node", lambda *args, **kwargs: False)
    real_block = dataio.feature_block
    monkeypatch.setattr(dataio, "feature_block", lambda table, names: blocks.append(table.num_rows)
                        or real_block(table, names))
    args = [small_parquet, "--out", str(tmp_path / "m.model"), "--model", model, "--outcome", "y",
            "--features", "a", "b", "c", "--n-estimators", "3", "--no-progress"]
    if model == "causal":
        args += ["--treatment", "t", "--param", "nuisance_estimators=2"]
    assert train.main(args) == 0
    assert calls and all(X is None for X, _ in calls)
    mapper, codes = calls[0][1]
    assert codes.dtype == np.uint8 and codes.shape == (3, 400)
    # 5 row groups of 80 rows, read twice (edges, then codes); never a bigger block
    assert blocks == [80] * 10


def test_infinite_feature_is_a_clear_error(tmp_path, capsys):
    table = make_table(200)
    a = table["a"].to_numpy().copy()
    a[123] = np.inf
    table = table.set_column(table.schema.get_field_index("a"), "a", pa.array(a))
    path = str(tmp_path / "inf.parquet")
    pq.write_table(table, path, row_group_size=50)
    code = train.main([path, "--out", str(tmp_path / "m.model"), "--model", "regression", "--outcome", "y",
                       "--features", "a", "b", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "feature column 'a' has an infinite value at row 123" in err


def test_streaming_read_peak_memory_is_far_below_a_float64_copy(tmp_path):
    """400k rows x 10 features: the float64 copy the old path built is 32 MB; the
    streaming path holds the uint8 codes (4 MB), one row group (0.8 MB as float64)
    and a 20k-row binning sample."""
    n, d, group = 400_000, 10, 10_000
    rng = np.random.default_rng(0)
    cols = {f"x{j}": rng.normal(size=n) for j in range(d)}
    cols["y"] = rng.normal(size=n)
    path = str(tmp_path / "big.parquet")
    pq.write_table(pa.table(cols), path, row_group_size=group)
    del cols
    source = dataio.open_source(path)
    features = [f"x{j}" for j in range(d)]
    run = (0, len(source.groups))
    comm = SelfCommunicator()

    tracemalloc.start()
    fitter = StreamingBinFit(BinMapper(max_bins=255, subsample=20_000), d, 0, n, n)
    shard = dataio.read_shard(source, run, numeric=["y"], features=features, on_features=fitter.add)
    mapper = fitter.finish(comm)
    codes, _ = dataio.bin_features(source, run, features, mapper.transform, n)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()

    float_copy = n * d * 8
    print(f"streaming read+bin peak {peak / 1e6:.1f} MB; float64 copy {float_copy / 1e6:.0f} MB")
    assert codes.shape == (d, n) and shard.columns["y"].shape == (n,)
    # y (3.2 MB) + codes (4 MB) + one row group and the sample: well under the 32 MB copy
    assert peak < 0.4 * float_copy, f"peak {peak / 1e6:.1f} MB vs a {float_copy / 1e6:.0f} MB float64 copy"
    # and the codes are those of binning the whole matrix at once
    X = np.column_stack([pq.read_table(path, columns=[f])[f].to_numpy() for f in features])
    ref = BinMapper(max_bins=255, subsample=20_000).fit(X, comm=comm)
    np.testing.assert_array_equal(ref.thresholds_flat_, mapper.thresholds_flat_)
    np.testing.assert_array_equal(ref.transform(X), codes)

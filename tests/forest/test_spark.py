"""forest.spark under pyspark local[3] (issue 36): the same model as one process, predictions, failure.

Skipped, with the reason, where pyspark or Java is missing. The rows are kept small
(20k) so the suite stays fast; ``benchmarks/bench_spark.py`` checks 200k rows and
times the fit against mpirun.
"""
import os
import shutil
import sys
import time
import warnings

import numpy as np
import pandas as pd
import pytest

pyspark = pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'histforest[spark]')")
if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("no Java runtime (pyspark needs java on PATH or JAVA_HOME)", allow_module_level=True)

from forest import CausalForest, GBDTClassifier, GBDTRegressor  # noqa: E402
from forest import spark as fs  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FEATURES = ["x0", "x1", "x2", "x3"]
N = 20_000


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "PYTHONPATH")}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # The JVM and its Python workers inherit this: they import forest from this checkout.
    os.environ["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in [saved["PYTHONPATH"]] if p])
    warnings.filterwarnings("ignore", message=".*pandas >= 3.0.0.*")
    session = (SparkSession.builder.master("local[3]").appName("histforest-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "3")
               # three workers share the machine's cores: one Numba thread each
               .config("spark.executorEnv.NUMBA_NUM_THREADS", "1").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(36)
    X = rng.standard_normal((N, 4))
    t = rng.integers(0, 2, N)
    pdf = pd.DataFrame(X, columns=FEATURES)
    pdf["t"] = t
    pdf["y"] = X[:, 0] * t + X[:, 1] + 0.5 * rng.standard_normal(N)
    pdf["label"] = np.where(pdf["y"] > 0.3, "hi", np.where(pdf["y"] < -0.3, "lo", "mid"))
    return pdf


@pytest.fixture(scope="module")
def df(spark, rows):
    data = spark.createDataFrame(rows)
    assert data.rdd.getNumPartitions() == 3  # local[3] slices the rows in order
    return data.cache()


def test_causal_forest_through_spark_is_the_one_process_fit(spark, df, rows):
    timings = {}
    model = fs.fit(CausalForest(n_estimators=16, random_state=1), df, features=FEATURES, treatment="t",
                   outcome="y", num_workers=3, timings=timings)
    # The model came straight to the driver's socket; every rank's stages are reported.
    ranks = timings["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2] and sum(r["rows"] for r in ranks) == N
    assert ranks[0]["via"] == "socket" and ranks[0]["model_bytes"] > 0
    assert all(r["fit"] > 0 and r["numba_threads"] >= 1 for r in ranks)
    assert set(timings["driver"]) == {"prepare", "stage", "loads", "task_start", "back"}
    alone = CausalForest(n_estimators=16, random_state=1).fit(rows[FEATURES], rows["t"].to_numpy(),
                                                            rows["y"].to_numpy())
    expected = alone.predict(rows[FEATURES])
    assert np.abs(model.predict(rows[FEATURES]) - expected).max() <= 1e-9
    scored = fs.predict(model, df, output_col="tau").toPandas()
    assert list(scored.columns) == list(rows.columns) + ["tau"]
    np.testing.assert_array_equal(scored["y"].to_numpy(), rows["y"].to_numpy())  # same rows, same order
    assert np.abs(scored["tau"].to_numpy() - expected).max() <= 1e-9


def test_gbdt_on_fewer_workers_than_partitions_keeps_the_row_order(spark, df, rows):
    model = fs.fit(GBDTRegressor(n_estimators=15, random_state=0), df, features=FEATURES, outcome="y",
                   num_workers=2)
    alone = GBDTRegressor(n_estimators=15, random_state=0).fit(rows[FEATURES], rows["y"].to_numpy())
    assert np.abs(model.predict(rows[FEATURES]) - alone.predict(rows[FEATURES])).max() <= 1e-9


def test_a_driver_the_tasks_cannot_reach_gets_the_model_through_the_stage(spark, df, rows, monkeypatch):
    class Unreachable(fs._ModelReceiver):
        def __init__(self, host, token):
            super().__init__(host, token)
            closed = fs.listen(advertise="127.0.0.1")  # a port nobody listens on any more
            self.address = closed.address
            closed.close()

    monkeypatch.setattr(fs, "_CHUNK_BYTES", 4096)  # several pieces, reassembled in order
    monkeypatch.setattr(fs, "_ModelReceiver", Unreachable)
    timings = {}
    model = fs.fit(GBDTRegressor(n_estimators=4, random_state=0), df, features=FEATURES, outcome="y",
                   num_workers=3, timings=timings)
    assert timings["ranks"][0]["via"] == "spark" and timings["ranks"][0]["model_bytes"] > 3 * 4096
    alone = GBDTRegressor(n_estimators=4, random_state=0).fit(rows[FEATURES], rows["y"].to_numpy())
    assert np.abs(model.predict(rows[FEATURES]) - alone.predict(rows[FEATURES])).max() <= 1e-9


def test_the_model_receiver_takes_only_its_fits_transfers(tmp_path):
    import socket

    receiver = fs._ModelReceiver("127.0.0.1", "a" * 32)
    try:
        host, port = receiver.address.rsplit(":", 1)
        with socket.create_connection((host, int(port))) as stranger:  # another fit's token: dropped
            stranger.sendall(fs._HEAD.pack(fs._MAGIC, b"b" * 32, b"c" * 32, 5))
            assert stranger.recv(1) == b""
        assert not fs._send_model(f"{host}:1", "a" * 32, "d" * 32, b"x")  # nobody there: the caller falls back
        payload = bytes(range(256)) * 1000
        assert fs._send_model(receiver.address, "a" * 32, "d" * 32, payload)
        path = receiver.received["d" * 32]
        with open(path, "rb") as f:
            assert f.read() == payload
        assert list(receiver.received) == ["d" * 32]
    finally:
        receiver.discard()
    assert not os.path.exists(path)


def test_gbdt_classifier_and_probabilities_as_array_columns(spark, df, rows):
    model = fs.fit(GBDTClassifier(n_estimators=8, random_state=0), df, features=FEATURES, outcome="label",
                   num_workers=3)
    alone = GBDTClassifier(n_estimators=8, random_state=0).fit(rows[FEATURES], rows["label"].to_numpy())
    np.testing.assert_array_equal(model.predict(rows[FEATURES]), alone.predict(rows[FEATURES]))
    out = fs.predict(model, df, output_col="p", method="predict_proba").toPandas()
    proba = np.stack(out["p"].to_numpy())
    assert proba.shape == (N, 3)
    assert np.abs(proba - alone.predict_proba(rows[FEATURES])).max() <= 1e-9


def test_a_task_killed_mid_fit_fails_the_stage_and_a_retry_starts_clean(spark, df, rows):
    def die_on_rank_1(done, total):
        from pyspark import BarrierTaskContext

        if BarrierTaskContext.get().partitionId() == 1:
            os._exit(7)

    start = time.monotonic()
    with pytest.raises(fs.SparkFitError, match=r"barrier stage failed: .*rank 1 \("):
        fs.fit(CausalForest(n_estimators=16, random_state=2), df, features=FEATURES, treatment="t", outcome="y",
               num_workers=3, fit_params={"progress": die_on_rank_1})
    assert time.monotonic() - start < 120
    model = fs.fit(CausalForest(n_estimators=16, random_state=2), df, features=FEATURES, treatment="t",
                   outcome="y", num_workers=3)
    alone = CausalForest(n_estimators=16, random_state=2).fit(rows[FEATURES], rows["t"].to_numpy(),
                                                            rows["y"].to_numpy())
    assert np.abs(model.predict(rows[FEATURES]) - alone.predict(rows[FEATURES])).max() <= 1e-9


def test_bad_arguments_fail_before_any_job(df):
    with pytest.raises(ValueError, match="needs the column"):
        fs.fit(CausalForest(), df, features=FEATURES, outcome="y")
    with pytest.raises(ValueError, match=r"columns \['nope'\] are not in the DataFrame"):
        fs.fit(GBDTRegressor(), df, features=FEATURES + ["nope"], outcome="y")

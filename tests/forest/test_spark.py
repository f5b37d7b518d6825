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
    model = fs.fit(CausalForest(n_estimators=16, random_state=1), df, features=FEATURES, treatment="t",
                   outcome="y", num_workers=3)
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

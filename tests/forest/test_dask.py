"""forest.dask over a distributed LocalCluster (issue 36): one rank per worker, the one-process model.

Skipped, with the reason, where ``distributed`` is missing.
"""
import os

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("distributed", reason="distributed (Dask) is not installed (pip install 'histforest[dask]')")
dd = pytest.importorskip("dask.dataframe", reason="dask.dataframe is not installed")

from forest import CausalForest, GBDTRegressor  # noqa: E402
from forest import dask as fdask  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FEATURES = ["x0", "x1", "x2"]


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    # Worker processes import forest from this checkout, one Numba thread each.
    env = {"PYTHONPATH": os.pathsep.join([REPO] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
           "NUMBA_NUM_THREADS": "1"}
    cluster = LocalCluster(n_workers=3, threads_per_worker=1, processes=True, dashboard_address=None, env=env)
    with Client(cluster) as c:
        # On a loaded machine the worker processes can register after the cluster object
        # exists (seen once in a clean-clone run: "the cluster has 0 workers").
        c.wait_for_workers(3, timeout=180)
        yield c
    cluster.close()


@pytest.fixture(scope="module")
def rows():
    rng = np.random.default_rng(7)
    n = 12_000
    X = rng.standard_normal((n, 3))
    pdf = pd.DataFrame(X, columns=FEATURES)
    pdf["t"] = rng.integers(0, 2, n)
    pdf["y"] = X[:, 0] * pdf["t"] + X[:, 1] + rng.standard_normal(n)
    return pdf


def test_gbdt_over_every_worker_is_the_one_process_fit(client, rows):
    ddf = dd.from_pandas(rows, npartitions=5)  # cut again into one partition per worker, order kept
    model = fdask.fit(GBDTRegressor(n_estimators=10, random_state=0), ddf, features=FEATURES, outcome="y",
                      client=client)
    alone = GBDTRegressor(n_estimators=10, random_state=0).fit(rows[FEATURES], rows["y"].to_numpy())
    assert np.abs(model.predict(rows[FEATURES]) - alone.predict(rows[FEATURES])).max() <= 1e-9


def test_causal_forest_on_two_workers_and_a_failing_rank(client, rows):
    ddf = dd.from_pandas(rows, npartitions=2)
    model = fdask.fit(CausalForest(n_estimators=8, random_state=0), ddf, features=FEATURES, treatment="t",
                      outcome="y", client=client, num_workers=2)
    alone = CausalForest(n_estimators=8, random_state=0).fit(rows[FEATURES], rows["t"].to_numpy(),
                                                           rows["y"].to_numpy())
    assert np.abs(model.predict(rows[FEATURES]) - alone.predict(rows[FEATURES])).max() <= 1e-9
    with pytest.raises(fdask.DaskFitError, match="not callable"):
        fdask.fit(CausalForest(n_estimators=8), ddf, features=FEATURES, treatment="t", outcome="y", client=client,
                  num_workers=2, fit_params={"progress": "not a function"})
    with pytest.raises(ValueError, match="the cluster has 3 workers"):
        fdask.fit(GBDTRegressor(), ddf, features=FEATURES, outcome="y", client=client, num_workers=4)

"""forest.distributed without a cluster: the rank body over socket ranks, column specs, model bytes.

What every Spark or Dask rank runs (:func:`forest.distributed.ranks.fit_rows` over a
socket world) is checked here on thread ranks joined by loopback TCP, so it is tested
even where pyspark or Java is missing (``test_spark.py`` runs the real thing).
"""
import os
import sys

import numpy as np
import pandas as pd
import pytest

from forest import CausalForest, GBDTClassifier, RegressionForest, model_io
from forest.distributed.ranks import fit_rows, fit_spec
from forest.io.model_io import ModelFormatError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "native"))
from socket_world import run_ok  # noqa: E402


def frame(n, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, 3))
    t = rng.integers(0, 2, n)
    df = pd.DataFrame(X, columns=["a", "b", "c"])
    df["t"] = t
    df["y"] = X[:, 0] * t + X[:, 1] + rng.standard_normal(n)
    df["w"] = rng.uniform(0.5, 2.0, n)
    df["label"] = np.where(df["y"] > 0, "hi", "lo")
    return df


@pytest.mark.parametrize("p", [2, 3])
def test_ranks_over_sockets_fit_the_one_process_model(p):
    df = frame(3000)
    est = CausalForest(n_estimators=8, random_state=3)
    spec = fit_spec(est, ["a", "b", "c"], {"treatment": "t", "outcome": "y"}, sample_weight="w")
    blocks = np.array_split(np.arange(len(df)), p)
    payload = model_io.dumps(est)

    def body(comm):
        mine = df.iloc[blocks[comm.rank]].reset_index(drop=True)
        return model_io.dumps(fit_rows(model_io.loads(payload), mine, spec, comm))

    models = [model_io.loads(b) for b in run_ok(p, body)]
    alone = CausalForest(n_estimators=8, random_state=3).fit(df[["a", "b", "c"]], df["t"].to_numpy(),
                                                           df["y"].to_numpy(), sample_weight=df["w"].to_numpy())
    X = df[["a", "b", "c"]]
    for m in models:
        assert np.abs(m.predict(X) - alone.predict(X)).max() <= 1e-9
    assert list(models[0].feature_names_in_) == ["a", "b", "c"]


def test_column_roles_follow_the_kinds_table():
    with pytest.raises(ValueError, match=r"needs the column\(s\) for \['treatment'\]"):
        fit_spec(CausalForest(), ["a"], {"outcome": "y"})
    with pytest.raises(ValueError, match=r"takes no \['treatment'\]"):
        fit_spec(GBDTClassifier(), ["a"], {"outcome": "label", "treatment": "t"})
    with pytest.raises(ValueError, match="takes no clusters"):
        fit_spec(GBDTClassifier(), ["a"], {"outcome": "label"}, clusters="g")
    with pytest.raises(ValueError, match="not a model kind"):
        fit_spec(object(), ["a"], {"outcome": "y"})
    spec = fit_spec(RegressionForest(), ["a", "b"], {"outcome": "y", "treatment": None}, sample_weight="a")
    assert spec.targets == ("y",) and spec.columns == ["a", "b", "y"]


def test_model_bytes_round_trip_and_refuse_damage():
    est = RegressionForest(n_estimators=3, random_state=0)
    df = frame(500)
    est.fit(df[["a", "b"]], df["y"].to_numpy())
    data = model_io.dumps(est)
    back = model_io.loads(data, expect=RegressionForest)
    np.testing.assert_array_equal(back.predict(df[["a", "b"]]), est.predict(df[["a", "b"]]))
    with pytest.raises(ModelFormatError, match=r"\(model bytes\) is truncated or corrupted"):
        model_io.loads(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match="GBDTClassifier is needed"):
        model_io.loads(data, expect=GBDTClassifier)


@pytest.mark.parametrize("kind", ["survival", "causal-survival"])
def test_survival_kinds_over_three_socket_ranks(kind):
    """The survival roles (time, event) reach fit through a launcher's rank body, as the CLI's do."""
    import warnings

    from forest import CausalSurvivalForest, SurvivalForest

    df = frame(1200, seed=4)
    rng = np.random.default_rng(5)
    failure = rng.exponential(np.exp(-df["a"].to_numpy())) + 0.5 * df["t"].to_numpy()
    censor = rng.uniform(0, 3, len(df))
    df["days"], df["died"] = np.minimum(failure, censor), (failure <= censor).astype(int)
    if kind == "survival":
        make = lambda: SurvivalForest(n_estimators=6, random_state=2)           # noqa: E731
        roles, targets = {"time": "days", "event": "died"}, ["days", "died"]
    else:
        make = lambda: CausalSurvivalForest(horizon=1.5, n_estimators=6, nuisance_estimators=4,  # noqa: E731
                                            survival_estimators=4, max_grid_times=16, random_state=2)
        roles, targets = {"treatment": "t", "time": "days", "event": "died"}, ["t", "days", "died"]
    spec = fit_spec(make(), ["a", "b", "c"], roles)
    blocks = np.array_split(np.arange(len(df)), 3)
    payload = model_io.dumps(make())

    def body(comm):
        mine = df.iloc[blocks[comm.rank]].reset_index(drop=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return model_io.dumps(fit_rows(model_io.loads(payload), mine, spec, comm))

    models = [model_io.loads(b) for b in run_ok(3, body)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone = make().fit(df[["a", "b", "c"]], *[df[c].to_numpy() for c in targets])
    X = df[["a", "b", "c"]]
    for m in models:
        assert np.abs(m.predict(X) - alone.predict(X)).max() <= 1e-9

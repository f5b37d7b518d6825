"""InstrumentalForest: known LATE(x) under confounding, intervals, model files, inputs, rank-count invariance."""
import json
import subprocess

import numpy as np
import pytest

from forest import simulate

from forest.io import model_io
from forest.estimators.causal_forest import CausalForest
from forest.estimators.instrumental_forest import InstrumentalForest
from native.comm import SelfCommunicator
from tests.conftest import block_slice

SELF = SelfCommunicator()
FAST = dict(max_bins=32, random_state=0)


def _rmse(a, b):
    return float(np.sqrt(np.mean((a - b) ** 2)))


@pytest.fixture(scope="module")
def strong():
    """A strong-instrument fit (compliance 0.40) and its test points.

    Confounding 0.5 and noise 0.5 keep the residual variance (about 1.5) small enough
    for 4000 rows to pin the LATE down; at the default (about 5) the RMSE is about 0.8.
    """
    kw = dict(d=5, strength=1.5, confounding=0.5, noise=0.5)
    d = simulate.instrumental(4000, seed=1, **kw)
    iv = InstrumentalForest(200, nuisance_estimators=50, **FAST).fit(d.X, d.t, d.y, d.z, comm=SELF)
    return d, iv, simulate.instrumental(500, seed=2, **kw)


def test_late_recovered_where_a_causal_forest_is_confounded(strong):
    d, iv, test = strong
    late = iv.predict(test.X)
    assert late.shape == (500,) and np.isfinite(late).all()
    err_iv = _rmse(late, test.tau)
    # The same data through a causal forest on (X, t, y): U confounds t and y, so it
    # estimates tau(x) + about 1, whatever the trees. A forest that does not split
    # (the mean LATE everywhere) has RMSE sd(tau) = 1.04.
    cf = CausalForest(100, nuisance_estimators=50, **FAST).fit(d.X, d.t, d.y, comm=SELF)
    bias_cf = float(np.mean(cf.predict(test.X) - test.tau))
    assert bias_cf > 0.7, bias_cf
    assert err_iv < 0.6, err_iv
    assert abs(float(np.mean(late - test.tau))) < 0.25
    # the heterogeneity is found: the step in x0 (2.0) shows between the halves
    step = late[test.X[:, 0] > 0.6].mean() - late[test.X[:, 0] < 0.4].mean()
    assert 1.3 < step < 2.7, step
    imp = iv.feature_importances_
    assert imp.shape == (5,) and np.argmax(imp) == 0


def test_weak_instrument_still_unbiased():
    d = simulate.instrumental(4000, d=5, strength=0.8, seed=3)
    iv = InstrumentalForest(200, nuisance_estimators=50, min_samples_leaf=10, **FAST).fit(d.X, d.t, d.y, d.z,
                                                                                         comm=SELF)
    test = simulate.instrumental(400, d=5, seed=4)
    late = iv.predict(test.X)
    assert abs(float(np.mean(late - test.tau))) < 0.6
    assert _rmse(late, test.tau) < 1.3


def test_intervals_cover_the_truth(strong):
    _, iv, test = strong
    lo, hi = iv.predict_interval(test.X)
    theta = iv.predict(test.X)
    assert np.all(lo <= theta) and np.all(theta <= hi)
    covered = float(np.mean((lo <= test.tau) & (test.tau <= hi)))
    width = float(np.mean(hi - lo))
    # Wide enough to cover most points, narrow enough to say something (tau spans 1 to 4).
    assert covered >= 0.7, covered
    assert 0.2 < width < 3.0, width
    var = iv.predict_var(test.X)
    np.testing.assert_allclose(hi - lo, 2 * 1.959963984540054 * np.sqrt(var), rtol=1e-12)


def test_oob_predict_and_given_nuisance(strong):
    d, iv, _ = strong
    oob = iv.oob_predict(d.X, comm=SELF)
    assert oob.shape == (4000,) and _rmse(oob, d.tau) < 0.8
    assert set(iv.nuisance_) == {"n_estimators", "y_hat", "t_hat", "z_hat"}
    assert iv.instrument_forest_ is not None
    # centring on given estimates: no nuisance forests, and they are recorded as given
    small = InstrumentalForest(8, ci_group_size=1, **FAST)
    zeros = np.zeros(len(d.y))
    small.fit(d.X, d.t, d.y, d.z, y_hat=zeros, t_hat=zeros, z_hat=zeros, comm=SELF)
    assert small.outcome_forest_ is None and small.instrument_forest_ is None
    assert small.nuisance_["z_hat"]["source"] == "given"


def test_model_file_round_trip_and_report(strong, tmp_path):
    from cli_helpers import tool

    _, iv, test = strong
    path = str(tmp_path / "iv.model")
    model_io.save(iv, path, metadata={"model": "instrumental"})
    loaded = model_io.load(path, expect=InstrumentalForest)
    assert loaded.get_params() == iv.get_params()
    np.testing.assert_array_equal(loaded.predict(test.X), iv.predict(test.X))
    np.testing.assert_array_equal(loaded.predict_interval(test.X)[1], iv.predict_interval(test.X)[1])
    np.testing.assert_array_equal(loaded.feature_importances_, iv.feature_importances_)
    out = subprocess.run([tool("forest-report"), path, "--json"], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    np.testing.assert_allclose(report["importance"]["depth_weighted"], iv.feature_importances_, rtol=1e-12)


def test_bad_inputs_fail_in_one_line():
    d = simulate.instrumental(300, d=4, seed=5)
    iv = InstrumentalForest(8, **FAST)
    with pytest.raises(ValueError, match="z is constant"):
        iv.fit(d.X, d.t, d.y, np.ones(300), comm=SELF)
    with pytest.raises(ValueError, match="t is constant"):
        iv.fit(d.X, np.zeros(300), d.y, d.z, comm=SELF)
    with pytest.raises(ValueError, match="z"):
        iv.fit(d.X, d.t, d.y, d.z[:10], comm=SELF)
    with pytest.raises(ValueError):
        iv.fit(d.X, np.c_[d.t, d.t], d.y, d.z, comm=SELF)
    bad = d.z.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="z"):
        iv.fit(d.X, d.t, d.y, bad, comm=SELF)
    with pytest.raises(ValueError, match="alpha"):
        InstrumentalForest(8, alpha=0.7).fit(d.X, d.t, d.y, d.z, comm=SELF)


def test_cli_train_predict(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from cli_helpers import tool

    d = simulate.instrumental(600, d=4, seed=6)
    cols = {f"x{j}": d.X[:, j] for j in range(4)}
    pq.write_table(pa.table(dict(cols, t=d.t, y=d.y, z=d.z)), tmp_path / "iv.parquet")
    model = str(tmp_path / "iv.model")
    subprocess.run([tool("forest-train"), str(tmp_path / "iv.parquet"), "--model", "instrumental", "--treatment", "t",
                    "--instrument", "z", "--outcome", "y", "--n-estimators", "16", "--max-bins", "32", "--out", model,
                    "--no-progress"], check=True, capture_output=True, text=True)
    est = model_io.load(model, expect=InstrumentalForest)
    ref = InstrumentalForest(16, max_bins=32).fit(d.X, d.t, d.y, d.z, comm=SELF)
    np.testing.assert_array_equal(est.estimators_["value"], ref.estimators_["value"])
    out = tmp_path / "pred.parquet"
    subprocess.run([tool("forest-predict"), model, str(tmp_path / "iv.parquet"), "--out", str(out), "--interval"],
                   check=True, capture_output=True, text=True)
    assert out.stat().st_size > 0
    missing = subprocess.run([tool("forest-train"), str(tmp_path / "iv.parquet"), "--model", "instrumental",
                              "--treatment", "t", "--outcome", "y", "--out", model], capture_output=True, text=True)
    assert missing.returncode != 0 and "--instrument COL is required" in missing.stderr


@pytest.mark.mpi
def test_same_forest_for_any_rank_count(comm):
    """Each rank fits its block; the forest is the single-process fit on all rows.

    The same trees bit for bit (every split, child, count and depth); sums of floats
    over ranks add in another order than one process does, so leaf values, gains and
    what is computed from them agree to rounding (as the causal and regression
    forests' own tests require).
    """
    d = simulate.instrumental(900, d=4, seed=13)
    kw = dict(n_estimators=12, nuisance_estimators=6, max_bins=32, random_state=3)
    sl = block_slice(900, comm.size, comm.rank)
    dist = InstrumentalForest(**kw).fit(d.X[sl], d.t[sl], d.y[sl], d.z[sl], comm=comm)
    ref = InstrumentalForest(**kw).fit(d.X, d.t, d.y, d.z, comm=SELF)
    test = simulate.instrumental(200, d=4, seed=14).X
    structure = ("feature", "bin_threshold", "missing_left", "left", "right", "count", "depth", "tree_offsets")
    same = all(np.array_equal(dist.estimators_[k], ref.estimators_[k]) for k in structure)
    value_diff = np.max(np.abs(dist.estimators_["value"] - ref.estimators_["value"]))
    pred_diff = np.max(np.abs(dist.predict(test) - ref.predict(test)))
    var_diff = np.max(np.abs(dist.predict_var(test) - ref.predict_var(test)))
    oob_diff = np.max(np.abs(dist.oob_predict(d.X[sl], comm=comm) - ref.oob_predict(d.X, comm=SELF)[sl]))
    imp_same = np.array_equal(dist.feature_importances_, ref.feature_importances_)
    assert same and imp_same
    assert value_diff < 1e-9 and pred_diff < 1e-9 and var_diff < 1e-9 and oob_diff < 1e-9

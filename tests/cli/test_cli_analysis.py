"""forest-train --cluster and the analysis part of forest-report (average effects, calibration, BLP, RATE)."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import make_table, run_mpi, tool
from forest.io import model_io
from forest.cli import report, train
from native.comm import SelfCommunicator

ARGS = ["--treatment", "t", "--outcome", "y", "--features", "a", "b", "c", "--n-estimators", "40",
        "--param", "nuisance_estimators=20", "--max-bins", "32", "--no-progress"]


@pytest.fixture(scope="module")
def clustered_parquet(tmp_path_factory):
    table = make_table(1200, seed=21)
    table = table.append_column("school", pa.array(np.arange(1200, dtype=np.int64) // 30))
    path = str(tmp_path_factory.mktemp("cl") / "cl.parquet")
    pq.write_table(table, path, row_group_size=200)
    return path, table


def test_cluster_training_under_mpirun_equals_the_fit(clustered_parquet, tmp_path):
    path, table = clustered_parquet
    out = str(tmp_path / "cl.model")
    proc = run_mpi(2, [tool("forest-train"), path, "--cluster", "school", "--out", out] + ARGS, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model = model_io.load(out)
    assert model.sampling_["clusters"] and model_io.read_header(out)["metadata"]["cluster"] == "school"
    X = np.column_stack([table[c].to_numpy() for c in ("a", "b", "c")])
    t, y = table["t"].to_numpy(), table["y"].to_numpy()
    ref = type(model)(**model.get_params()).fit(X, t, y, clusters=table["school"].to_numpy(),
                                                comm=SelfCommunicator())
    np.testing.assert_allclose(model.predict(X[:50]), ref.predict(X[:50]), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(model.ate_stderr_, ref.ate_stderr_, rtol=1e-9)


def test_report_adds_the_analysis(clustered_parquet, tmp_path, capsys):
    path, _ = clustered_parquet
    out = str(tmp_path / "m.model")
    assert train.main([path, "--cluster", "school", "--out", out] + ARGS) == 0
    capsys.readouterr()
    html = str(tmp_path / "r.html")
    assert report.main([out, "--data", path, "--json", "--html", html]) == 0
    doc = json.loads(capsys.readouterr().out)
    part = doc["analysis"]
    assert set(part["average_effects"]) == {"all", "treated", "control", "overlap"}
    ate = part["average_effects"]["all"]
    assert ate["conf_low"][0] < 2.0 < ate["conf_high"][0]                # tau = 1 + 2 [a > 0]: ATE 2
    assert part["calibration"]["terms"] == ["mean.forest.prediction", "differential.forest.prediction"]
    blp_terms = part["best_linear_projection"]["terms"]
    assert blp_terms[0] == "(Intercept)" and "a" in blp_terms
    # The data are the training rows: every figure is out of bag (with 40 clusters of 30
    # rows the out-of-bag RATE is too noisy to have a known sign, so only its form is checked).
    assert doc["rows"]["source"] == "out-of-bag" and part["rows"] == "out-of-bag"
    for target in ("AUTOC", "QINI"):
        assert np.isfinite(part["rate"][target]["estimate"][0]) and len(part["rate"][target]["toc"]["q"]) == 10
    assert "cluster-robust" in part["calibration"]["note"]
    with open(html, encoding="utf-8") as f:
        page = f.read()
    assert "rank-weighted average treatment effect (RATE)" in page and page.count("data:image/png;base64") >= 4
    assert report.main([out, "--data", path]) == 0
    text = capsys.readouterr().out
    assert "Doubly robust average effects" in text and "AUTOC" in text and "mean.forest.prediction" in text


def test_bad_cluster_column_is_one_line(clustered_parquet, tmp_path, capsys):
    path, table = clustered_parquet
    bad = table.set_column(table.schema.get_field_index("school"), "school",
                           pa.array(np.linspace(0, 3, 1200)))
    bad_path = str(tmp_path / "bad.parquet")
    pq.write_table(bad, bad_path)
    assert train.main([bad_path, "--cluster", "school", "--out", str(tmp_path / "x.model")] + ARGS) == 2
    assert "integer labels" in capsys.readouterr().err
    assert train.main([path, "--model", "gbdt-regressor", "--outcome", "y", "--cluster", "school",
                       "--out", str(tmp_path / "g.model")]) == 2
    assert "--cluster" in capsys.readouterr().err


def test_report_on_data_with_a_missing_outcome_names_it(clustered_parquet, tmp_path, capsys):
    # a NaN outcome used to print "Qini coefficient nan, AUUC nan"
    path, table = clustered_parquet
    out = str(tmp_path / "m.model")
    assert train.main([path, "--out", out] + ARGS) == 0
    y = table["y"].to_numpy().copy()
    y[::50] = np.nan
    holes = str(tmp_path / "holes.parquet")
    pq.write_table(table.set_column(table.schema.get_field_index("y"), "y", pa.array(y)), holes)
    capsys.readouterr()
    assert report.main([out, "--data", holes]) == 0
    text = capsys.readouterr().out
    assert "no Qini curve: 'y' holds NaN" in text and "coefficient nan" not in text.lower(), text


def test_report_under_mpirun_prints_once(clustered_parquet, tmp_path):
    # every rank used to print the report: two JSON documents, not one
    path, _ = clustered_parquet
    out = str(tmp_path / "m.model")
    assert train.main([path, "--out", out] + ARGS) == 0
    proc = run_mpi(2, [tool("forest-report"), out, "--json"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["model"]


def test_report_on_an_instrumental_forest_draws_no_qini_curve(tmp_path, capsys):
    # the observed treatment of an IV design is confounded: a Qini curve of it would mislead
    rng = np.random.default_rng(4)
    n = 600
    a, b, u = rng.normal(size=(3, n))
    z = (rng.uniform(size=n) < 0.5).astype(np.int64)
    t = ((0.8 * z + 0.5 * u + 0.2 * rng.normal(size=n)) > 0.5).astype(np.int64)
    y = a + 2.0 * t + 2.0 * u + 0.1 * rng.normal(size=n)
    path = str(tmp_path / "iv.parquet")
    pq.write_table(pa.table({"a": a, "b": b, "z": z, "t": t, "y": y}), path)
    out = str(tmp_path / "iv.model")
    assert train.main([path, "--model", "instrumental", "--treatment", "t", "--instrument", "z", "--outcome", "y",
                       "--features", "a", "b", "--n-estimators", "20", "--param", "nuisance_estimators=10",
                       "--no-progress", "--out", out]) == 0
    capsys.readouterr()
    assert report.main([out, "--data", path]) == 0
    text = capsys.readouterr().out
    assert "no Qini curve: 't' is instrumented" in text and "Qini coefficient" not in text, text

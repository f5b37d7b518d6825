"""forest-report fits the model: tree counts, the importance it sorts by, what it summarises, PDP scale."""
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forest.io import model_io
from forest.report import summary as rep
from forest.cli import report
from forest.cli.report import build_report
from native.comm import SelfCommunicator

N_TREES = 20


def _table(n=600, seed=4):
    rng = np.random.default_rng(seed)
    a, b, c = rng.normal(size=(3, n))
    t = (rng.uniform(size=n) < 0.5).astype(np.int64)
    y = 2.0 * a + t * (1.0 + (b > 0)) + 0.3 * rng.normal(size=n)
    return pa.table({"a": a, "b": b, "c": c, "t": t, "y": y, "label": (y > 0.5).astype(np.int64),
                     "klass": np.digitize(y, [-1.0, 1.0]).astype(np.int64)})


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from forest import CausalForest, GBDTClassifier, GBDTRegressor, ProbabilityForest

    folder = tmp_path_factory.mktemp("report")
    table = _table()
    data = str(folder / "data.parquet")
    pq.write_table(table, data)
    X = np.column_stack([table[c].to_numpy() for c in "abc"])
    comm = SelfCommunicator()
    gbdt = dict(n_estimators=N_TREES, max_leaf_nodes=4, early_stopping=False, random_state=0)
    models = {
        "gbdt-classifier": (GBDTClassifier(**gbdt).fit(X, table["label"].to_numpy(), comm=comm), "label"),
        "gbdt-multiclass": (GBDTClassifier(**gbdt).fit(X, table["klass"].to_numpy(), comm=comm), "klass"),
        "gbdt-regressor": (GBDTRegressor(**gbdt).fit(X, table["y"].to_numpy(), comm=comm), "y"),
        "causal": (CausalForest(n_estimators=8, nuisance_estimators=4, random_state=0).fit(
            X, table["t"].to_numpy(), table["y"].to_numpy(), comm=comm), "y"),
        "probability": (ProbabilityForest(n_estimators=N_TREES, random_state=0).fit(
            X, table["klass"].to_numpy(), comm=comm), "klass"),
    }
    paths = {}
    for kind, (est, outcome) in models.items():
        paths[kind] = str(folder / f"{kind}.model")
        meta = {"model": kind, "feature_names": list("abc"), "outcome": outcome,
                "treatment": "t" if kind == "causal" else None}
        model_io.save(est, paths[kind], metadata=meta)
    return data, X, paths, {k: m[0] for k, m in models.items()}


@pytest.mark.parametrize("kind", ["gbdt-classifier", "gbdt-multiclass", "gbdt-regressor"])
def test_gbdt_report_counts_each_tree_once(files, kind, capsys):
    _, _, paths, models = files
    est = models[kind]
    assert len(est.trees_) == N_TREES
    assert report.main([paths[kind], "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_trees"] == N_TREES
    np.testing.assert_array_equal(out["importance"]["splits"], est.split_counts_)
    np.testing.assert_allclose(out["importance"]["gain"], est.feature_importances_, rtol=1e-12)
    assert report.main([paths[kind]]) == 0
    text = capsys.readouterr().out
    assert f": {N_TREES} trees, 3 features" in text


def test_gbdt_report_sorts_by_gain_and_says_so(files):
    _, _, paths, models = files
    rep_, _, text = build_report(paths["gbdt-regressor"])
    assert "Feature importance (sorted by share of split gain):" in text and "GRF" not in text
    assert rep_["importance_sorted_by"] == "gain"
    rows = [ln.split()[1] for ln in text.splitlines() if re.match(r"\s+\d+\s", ln)]
    assert rows == [list("abc")[j] for j in np.argsort(-models["gbdt-regressor"].feature_importances_,
                                                       kind="stable")]
    _, _, text = build_report(paths["causal"])
    assert "Feature importance (sorted by GRF depth-weighted split frequency):" in text


def test_classifier_report_summarises_probabilities(files):
    data, X, paths, models = files
    rep_, _, text = build_report(paths["gbdt-classifier"], data=data)
    pred = rep_["predictions"]
    assert pred["what"] == "probability" and list(pred["columns"]) == ["P(1)"]
    p1 = models["gbdt-classifier"].predict_proba(X)[:, 1]
    col = pred["columns"]["P(1)"]
    assert col["mean"] == pytest.approx(p1.mean(), rel=1e-12)
    assert col["quantiles"]["p50"] == pytest.approx(np.median(p1), rel=1e-12)
    assert 0.0 < col["quantiles"]["min"] < col["quantiles"]["max"] < 1.0  # probabilities, not 0/1 labels
    assert "Predicted probability on 600 rows" in text and "effect" not in text and "Qini" not in text
    # multiclass: one column per class, each row sums to one
    rep_, _, _ = build_report(paths["gbdt-multiclass"], data=data)
    cols = rep_["predictions"]["columns"]
    assert list(cols) == ["P(0)", "P(1)", "P(2)"]
    assert sum(c["mean"] for c in cols.values()) == pytest.approx(1.0, abs=1e-12)
    pdp = rep_["partial_dependence"]["features"]
    assert all(np.asarray(v["mean"]).shape[1] == 3 for v in pdp.values())


def test_probability_forest_report_summarises_out_of_bag_probabilities(files):
    data, X, paths, models = files
    est = models["probability"]
    rep_, _, text = build_report(paths["probability"], data=data)
    assert "Feature importance (sorted by GRF depth-weighted split frequency):" in text
    np.testing.assert_allclose(rep_["importance"]["depth_weighted"], est.feature_importances_, rtol=1e-12)
    pred = rep_["predictions"]
    assert pred["what"] == "probability" and list(pred["columns"]) == ["P(0)", "P(1)", "P(2)"]
    # the data are its training rows: out-of-bag probabilities, as the regression forests report
    assert rep_["rows"]["source"] == "out-of-bag" and "(out of bag):" in text
    oob = est.oob_predict_proba(X, comm=SelfCommunicator())
    for k, col in enumerate(pred["columns"].values()):
        assert col["mean"] == pytest.approx(oob[:, k].mean(), rel=1e-12)
    assert sum(c["mean"] for c in pred["columns"].values()) == pytest.approx(1.0, abs=1e-12)
    pdp = rep_["partial_dependence"]["features"]
    assert all(np.asarray(v["mean"]).shape[1] == 3 for v in pdp.values())


def test_regressor_and_causal_reports_summarise_their_own_quantity(files):
    data, X, paths, models = files
    rep_, _, text = build_report(paths["gbdt-regressor"], data=data)
    assert rep_["predictions"]["what"] == "value"
    assert rep_["predictions"]["columns"]["prediction"]["mean"] == pytest.approx(
        models["gbdt-regressor"].predict(X).mean(), rel=1e-12)
    assert "Partial dependence of the predicted value" in text
    rep_, _, text = build_report(paths["causal"], data=data)
    assert rep_["predictions"]["what"] == "effect tau(x)"
    # the data are the causal model's training rows: the report summarises out-of-bag effects
    assert rep_["rows"]["source"] == "out-of-bag" and "Rows: these are the model's training rows" in text
    assert rep_["predictions"]["columns"]["tau"]["mean"] == pytest.approx(
        models["causal"].oob_predict(X).mean(), rel=1e-12)
    assert rep_["predictions"]["columns"]["tau"]["mean"] != pytest.approx(models["causal"].predict(X).mean(),
                                                                          rel=1e-6)
    assert "qini" in rep_ and "Qini coefficient" in text


def test_pdp_panels_share_one_scale_and_show_their_range():
    grid = np.linspace(0, 1, 10)
    strong = 3.0 * grid                                       # a real effect, range 3
    null = 1.5 + 1e-3 * np.sin(40 * grid)                     # noise around a constant
    fig = rep.pdp_axes([("strong", grid, strong), ("null", grid, null)], "effect tau(x)")
    limits = {ax.get_ylim() for ax in fig.axes}
    assert len(limits) == 1                                   # one y scale for every panel
    low, high = limits.pop()
    assert low <= 0.0 and high >= 3.0                         # the null panel is drawn flat on it
    assert [ax.get_title() for ax in fig.axes] == ["range 3", f"range {np.ptp(null):.3g}"]
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_html_sections_fit_the_model(files, tmp_path):
    data, _, paths, _ = files
    page = str(tmp_path / "r.html")
    assert report.main([paths["gbdt-classifier"], "--data", data, "--html", page]) == 0
    html = open(page, encoding="utf-8").read()
    # one section per analysis, each with its table (forest/report/html.py)
    assert "<h2>Predicted probability</h2>" in html and "effect" not in html.lower().replace("feature", "")
    assert "<h2>Partial dependence of the predicted probability</h2>" in html and "<table" in html

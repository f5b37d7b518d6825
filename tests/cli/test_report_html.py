"""The forest-report HTML page (forest.report.html): sections, readings, rows, escaping, self-containment."""
import base64
import copy
import html
import re

import numpy as np
import pytest

from forest.report import html as report_html
from forest.report.html import report_page

#: A 1x1 PNG: the page embeds whatever base64 text the report renders.
PNG = base64.b64encode(bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")).decode("ascii")

FIGURES = {key: PNG for key in ("importance", "distribution", "pdp", "qini", "toc")}


def _estimate_table(terms, estimate, stderr, pvalue, alternative="two-sided", contrasts=None, z=1.96):
    """An ``EstimateTable.to_dict()`` layout (the page reads only this dict)."""
    est, se = np.asarray(estimate, dtype=float), np.asarray(stderr, dtype=float)
    return {"title": "t", "note": "HC3 heteroskedasticity-robust standard errors", "terms": list(terms),
            "contrasts": contrasts, "estimate": est.tolist(), "stderr": se.tolist(),
            "statistic": (est / se).tolist(), "pvalue": np.asarray(pvalue, dtype=float).tolist(),
            "alternative": alternative, "dof": None, "alpha": 0.05,
            "conf_low": (est - z * se).tolist(), "conf_high": (est + z * se).tolist()}


def _calibration(p_differential, mean=(0.98, 0.01), differential=0.39):
    return _estimate_table(["mean.forest.prediction", "differential.forest.prediction"],
                           [mean[0], differential], [mean[1], 0.2], [1e-20, p_differential], alternative="greater")


def _rate(target, estimate, stderr):
    out = _estimate_table([target], [estimate], [stderr], [0.01])
    out.update(target=target, n_bootstrap=200, toc={"q": [0.5, 1.0], "estimate": [1.0, 0.0], "stderr": [0.1, 0.0]})
    return out


def make_report(rows_source="held-out"):
    """A causal-forest report with every section, as build_report lays it out."""
    report = {
        "model": "CausalForest", "model_file": "/models/cf.model", "library_version": "0.1.0",
        "format_version": 1, "n_trees": 100, "n_training_rows": 6000, "treatment": "t", "outcome": "y",
        "features": ["x0", "<b>x</b>", "x2"],
        "importance": {"depth_weighted": np.array([0.2, 0.7, 0.1]), "gain": np.array([0.3, 0.6, 0.1]),
                       "splits": np.array([10, 30, 5])},
        "importance_sorted_by": "depth_weighted",
        "predictions": {"what": "effect tau(x)", "n_rows": 500,
                        "columns": {"tau": {"mean": 2.49, "std": 0.97,
                                            "quantiles": {"min": 1.1, "p10": 1.3, "p25": 1.527, "p50": 1.9,
                                                          "p75": 3.426, "p90": 3.6, "max": 3.9}}}},
        "partial_dependence": {"what": "effect tau(x)", "columns": ["tau"],
                               "features": {"<b>x</b>": {"grid": np.array([0.0, 0.5, 1.0]),
                                                         "mean": np.array([[1.5], [2.0], [3.5]])},
                                            "x0": {"grid": [0.0, 1.0], "mean": [2.5, 2.6]}}},
        "qini": {"qini_coefficient": 0.1516, "auuc": 1.732, "n_rows": 500},
        "analysis": {
            "average_effects": {"all": {"estimate": [3.1], "stderr": [0.46], "conf_low": [2.2],
                                        "conf_high": [4.0]},
                                "treated": {"estimate": [0.2], "stderr": [0.3], "conf_low": [-0.4],
                                            "conf_high": [0.8]}},
            "calibration": _calibration(0.25),
            "best_linear_projection": _estimate_table(["(Intercept)", "x0", "<b>x</b>", "x2"],
                                                      [0.7, 2.9, -0.8, 0.04], [0.1, 0.1, 0.1, 0.1],
                                                      [1e-10, 1e-20, 1e-9, 0.7]),
            "rate": {"AUTOC": _rate("AUTOC", 0.97, 0.03), "QINI": _rate("QINI", 0.31, 0.01)},
            "unavailable": {"average_effect_overlap": "overlap weights need a <binary> treatment"},
        },
    }
    if rows_source is not None:
        report["rows"] = {"source": rows_source, "sentence": f"these are {rows_source} rows"}
    return report


def _section(page, anchor):
    """The HTML of one section of the page ('' when it is absent)."""
    match = re.search(rf'<section id="{anchor}">(.*?)</section>', page, re.S)
    return match.group(1) if match else ""


def _readings(section):
    """Text of the reading sentences of a section."""
    return re.findall(r'class="reading">(.*?)</(?:p|ul)>', section, re.S)


SECTIONS = ("overview", "importance", "predictions", "partial-dependence", "qini", "average-effects",
            "calibration", "best-linear-projection", "rate", "unavailable")


def test_every_section_has_its_table_reading_and_rows():
    page = report_page(make_report(), FIGURES, "report")
    for anchor in SECTIONS:
        section = _section(page, anchor)
        assert "<table" in section, anchor
        if anchor == "overview":
            assert 'class="rowsbox"' in section
            continue
        assert _readings(section), anchor
        if anchor != "unavailable":
            assert 'class="rows">Rows: ' in section, anchor


def test_absent_keys_give_no_section():
    report = make_report()
    for key in ("predictions", "partial_dependence", "qini", "analysis"):
        del report[key]
    page = report_page(report, {"importance": PNG}, "report")
    assert _section(page, "overview") and _section(page, "importance")
    for anchor in SECTIONS[2:]:
        assert not _section(page, anchor), anchor
        assert f'href="#{anchor}"' not in page


def test_analysis_parts_appear_only_when_present():
    report = make_report()
    del report["analysis"]["rate"], report["analysis"]["unavailable"]
    report["analysis"]["average_effects"] = {}  # none could be computed: nothing to show
    page = report_page(report, FIGURES, "report")
    assert _section(page, "calibration") and _section(page, "best-linear-projection")
    for anchor in ("average-effects", "rate", "unavailable"):
        assert not _section(page, anchor), anchor
    assert page.count("data:image/png;base64,") == 4  # the TOC figure goes with the RATE section


def test_rows_sentence_is_highlighted_and_named_in_each_analysis():
    report = make_report("out-of-bag")
    page = report_page(report, FIGURES, "report")
    assert '<div class="rowsbox">These are out-of-bag rows.</div>' in page
    for anchor in ("predictions", "average-effects", "calibration", "best-linear-projection"):
        assert "Rows: the training rows, out-of-bag estimates" in _section(page, anchor), anchor
    # Qini and RATE on training rows rank a hashed half by a forest refitted on the other half
    report["analysis"]["rate_ranking"] = {"rank_rows": 251, "fit_rows": 249, "how": "..."}
    page = report_page(report, FIGURES, "report")
    for anchor in ("qini", "rate"):
        assert "Rows: 251 of the training rows" in _section(page, anchor) and "other 249" in _section(page, anchor)
    page = report_page(make_report("held-out"), FIGURES, "report")
    assert "Rows: held-out rows (500 rows)." in _section(page, "calibration")
    # partial dependence predicts made-up rows: never out of bag, whatever the data are
    assert "whole model" in _section(page, "partial-dependence")


@pytest.mark.parametrize("source, words", [("unknown", "whether the model trained on them is unknown"),
                                           ("in-sample", "in-sample predictions"),
                                           ("something new", "whether the model trained on them is unknown")])
def test_other_row_sources_are_named(source, words):
    page = report_page(make_report(source), FIGURES, "report")
    line = re.search(r'class="rows">(.*?)</p>', _section(page, "average-effects")).group(1)
    assert line.startswith("Rows: the given rows") and words in line


def test_missing_rows_key_counts_as_none():
    report = make_report(rows_source=None)
    page = report_page(report, FIGURES, "report")
    assert "Rows: not recorded" in _section(page, "calibration")
    assert "does not record which rows" in _section(page, "overview")
    bare = {k: report[k] for k in ("model", "model_file", "n_trees", "features", "importance",
                                   "importance_sorted_by")}
    page = report_page(bare, {}, "report")
    assert "No data given" in _section(page, "overview")


def test_calibration_reads_the_differential_p_value():
    (no,) = report_html.calibration_reading(_calibration(0.25))
    assert no.startswith("No evidence of heterogeneity beyond the average effect (differential forest "
                         "prediction 0.39, p = 0.25)")
    (yes,) = report_html.calibration_reading(_calibration(0.001, differential=1.02))
    assert yes.startswith("Evidence that the forest captures heterogeneity (differential forest prediction "
                          "1.02, p = 0.001)")
    page = report_page(make_report(), FIGURES, "report")
    assert "No evidence of heterogeneity" in _section(page, "calibration")


def test_calibration_reads_the_mean_forest_prediction():
    (good,) = report_html.calibration_reading(_calibration(0.25, mean=(0.98, 0.02)))
    assert "well calibrated" in good
    (near,) = report_html.calibration_reading(_calibration(0.25, mean=(0.97, 0.01)))
    assert "well calibrated" in near and "near 1" in near
    (low,) = report_html.calibration_reading(_calibration(0.25, mean=(0.5, 0.05)))
    assert "overstates the average effect" in low
    (vague,) = report_html.calibration_reading(_calibration(0.25, mean=(0.9, 0.5)))
    assert "too uncertain" in vague


def test_average_effect_reading():
    page = report_page(make_report(), FIGURES, "report")
    assert "The average effect is 3.1 (95% CI 2.2 to 4): clearly above zero." in _section(page, "average-effects")
    report = make_report()
    report["analysis"]["average_effects"] = {"all": {"estimate": [0.2], "stderr": [0.3], "conf_low": [-0.4],
                                                     "conf_high": [0.8]}}
    page = report_page(report, FIGURES, "report")
    assert "the interval covers zero" in _section(page, "average-effects")


def test_rate_reading_follows_the_interval():
    (beats,) = report_html.rate_reading({"AUTOC": _rate("AUTOC", 0.97, 0.03)})
    assert beats.startswith("Targeting by the predicted effect beats treating at random")
    (covers,) = report_html.rate_reading({"AUTOC": _rate("AUTOC", 0.01, 0.03)})
    assert "does not beat treating at random" in covers


def test_blp_reading_names_covariates_whose_interval_excludes_zero():
    (reading,) = report_html.blp_reading(make_report()["analysis"]["best_linear_projection"])
    assert "rises with x0" in reading and "falls with <b>x</b>" in reading
    assert "no clear link to x2" in reading and "Intercept" not in reading


def test_several_contrasts_read_one_sentence_each():
    tab = _estimate_table(["mean.forest.prediction", "differential.forest.prediction"],
                          [[1.0, 1.0], [0.9, 0.2]], [[0.05, 0.1], [0.5, 0.3]], [[1e-9, 1e-9], [0.03, 0.3]],
                          alternative="greater", contrasts=["1 - 0", "2 - 0"])
    first, second = report_html.calibration_reading(tab)
    assert first.startswith("For 1 - 0: evidence") and second.startswith("For 2 - 0: no evidence")
    report = make_report()
    report["analysis"]["calibration"] = tab
    report["analysis"]["average_effects"] = {"all": {"estimate": [1.4, 0.1], "stderr": [0.07, 0.07],
                                                     "conf_low": [1.2, -0.02], "conf_high": [1.5, 0.25]}}
    page = report_page(report, FIGURES, "report")
    effects = _section(page, "average-effects")
    # the average effects carry no contrast names: the page borrows the calibration table's
    assert "<li>For 1 - 0: the average effect is 1.4" in effects and "<td>2 - 0</td>" in effects


def test_strings_are_escaped():
    report = make_report()
    report["model_file"] = "/tmp/<script>alert(1)</script>.model"
    page = report_page(report, FIGURES, "<b>title</b>")
    assert "<b>x</b>" not in page and "<script>" not in page and "<b>title</b>" not in page
    assert "&lt;b&gt;x&lt;/b&gt;" in _section(page, "importance")
    assert "relies most on &lt;b&gt;x&lt;/b&gt;" in page
    assert "&lt;binary&gt;" in _section(page, "unavailable")


def test_figures_are_embedded_and_nothing_is_external():
    page = report_page(make_report(), FIGURES, "report", text="plain <text> form")
    sources = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert sources and not [s for s in sources if "http" in s or "//" in s]
    assert page.count(f'src="data:image/png;base64,{PNG}"') == len(FIGURES)
    assert "<link" not in page and "<script" not in page and "@import" not in page
    # each figure sits in the section of its analysis
    for anchor in ("importance", "predictions", "partial-dependence", "qini", "rate"):
        assert "data:image/png;base64," in _section(page, anchor), anchor
    assert "<details><summary>Text form</summary><pre>plain &lt;text&gt; form</pre></details>" in page


def test_bad_figure_text_is_dropped():
    page = report_page(make_report(), {"importance": '" onerror="x'}, "report")
    assert "onerror" not in page and "<img" not in _section(page, "importance")


def test_json_round_trip_and_flat_pdp_means():
    from forest.report.summary import to_json

    report = to_json(make_report())
    report["partial_dependence"]["features"]["<b>x</b>"]["mean"] = [1.5, 2.0, 3.5]
    page = report_page(copy.deepcopy(report), FIGURES, "report")
    pdp = _section(page, "partial-dependence")
    assert re.search(r"<td>&lt;b&gt;x&lt;/b&gt;</td><td class=\"num\">1.5</td><td class=\"num\">3.5</td>"
                     r"<td class=\"num\">2</td>", pdp)
    assert "Changing &lt;b&gt;x&lt;/b&gt; alone moves the predicted effect tau(x) the most" in pdp


def test_numbers_have_four_significant_digits():
    assert report_html.fmt(0.123456) == "0.1235"
    assert report_html.fmt(2.0) == "2"
    assert report_html.fmt(123456.7) == "123,500"
    assert report_html.fmt(6000) == "6,000"
    assert report_html.fmt(None) == report_html.fmt(float("nan")) == "n/a"
    assert report_html.fmt_p(3e-300) == "< 0.0001" and report_html.fmt_p(0.25) == "= 0.25"


def test_real_report_renders(tmp_path):
    """build_report's own dict (a tiny causal forest) renders with every section it holds."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from forest.io import model_io
    from forest.estimators.causal_forest import (CausalForest)  # a submodule: plain `pytest` finds tests/forest as `forest`
    from forest.cli.report import build_report
    from native.comm import SelfCommunicator

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    t = (rng.uniform(size=300) < 0.5).astype(np.int64)
    y = X[:, 0] + t * (1.0 + (X[:, 1] > 0)) + 0.3 * rng.normal(size=300)
    data, model = str(tmp_path / "d.parquet"), str(tmp_path / "cf.model")
    pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1], "c": X[:, 2], "t": t, "y": y}), data)
    est = CausalForest(n_estimators=8, nuisance_estimators=4, random_state=0).fit(X, t, y, comm=SelfCommunicator())
    model_io.save(est, model, metadata={"feature_names": list("abc"), "treatment": "t", "outcome": "y"})
    report, figures, text = build_report(model, data=data)
    page = report_page(report, figures, "real", text=text)
    if "rows" in report:  # the training rows: their sentence heads the page
        assert html.escape(report_html.rows_sentence(report)) in _section(page, "overview")
        assert "Rows: the training rows, out-of-bag estimates" in _section(page, "predictions")
    for anchor in ("overview", "importance", "predictions", "partial-dependence", "qini"):
        assert _readings(_section(page, anchor)) or anchor == "overview", anchor
    for key in report.get("analysis", {}):
        anchor = key.replace("_", "-")
        if key in ("average_effects", "calibration", "best_linear_projection", "rate") and report["analysis"][key]:
            assert _readings(_section(page, anchor)), anchor


@pytest.mark.parametrize("sort_by", ["depth_weighted", "gain"])
def test_importance_rows_follow_the_text_tables_order(sort_by):
    from forest.report.summary import importance_order

    rng = np.random.default_rng(1)
    imp = {"depth_weighted": rng.integers(0, 3, 12) / 10.0, "gain": rng.integers(0, 3, 12) / 10.0,
           "splits": rng.integers(0, 9, 12)}
    names = [f"f{j}" for j in range(12)]
    report = {"model": "M", "features": names, "importance": imp, "importance_sorted_by": sort_by, "top": 12}
    page = report_page(report, {}, "report")
    listed = re.findall(r"<tr><td>\d+</td><td>(f\d+)</td>", _section(page, "importance"))
    assert listed == [names[j] for j in importance_order(imp, sort_by)]

"""The report's analysis part: per-arm numbers for multi-arm models, reasons for what cannot be computed."""
import json

import numpy as np
import pytest

from forest import simulate
from forest.estimators.causal_forest import CausalForest
from forest.report.analysis import analysis_report
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def test_multi_arm_report_has_per_arm_effects_and_rate():
    d = simulate.multi_arm(1500, d=4, n_arms=2, seed=1)
    cf = CausalForest(20, max_bins=32, random_state=0).fit(d.X, d.t, d.y, comm=SELF)
    held = simulate.multi_arm(800, d=4, n_arms=2, seed=2)
    names = [f"x{j}" for j in range(4)]
    report, lines, figures = analysis_report(cf, held.X, held.t, held.y, names, cf.feature_importances_,
                                             want_figures=True)
    json.dumps(report)
    assert len(report["average_effects"]["treated"]["estimate"]) == 2
    for target in ("AUTOC", "QINI"):
        rate = report["rate"][target]
        assert rate["contrasts"] == ["1 - 0", "2 - 0"]
        assert np.shape(rate["toc"]["estimate"]) == (2, 10)
    assert np.shape(report["best_linear_projection"]["estimate"]) == (2, 5)
    assert "toc" in figures and "unavailable" not in report
    text = "\n".join(lines)
    assert "treated [2 - 0]" in text and "AUTOC [1 - 0]" in text


def test_continuous_report_says_what_is_not_available():
    d = simulate.continuous_treatment(1000, d=4, seed=3)
    cf = CausalForest(20, max_bins=32, random_state=0).fit(d.X, d.t, d.y, comm=SELF)
    held = simulate.continuous_treatment(500, d=4, seed=4)
    report, lines, _ = analysis_report(cf, held.X, held.t, held.y, ["a", "b", "c", "d"], cf.feature_importances_)
    assert set(report["average_effects"]) == {"all", "overlap"}
    assert set(report["unavailable"]) == {"average_effect_treated", "average_effect_control", "rate", "sensitivity"}
    assert "Not available on these data:" in lines


def test_report_on_a_model_with_feature_names_warns_nothing():
    """forest-report hands the analysis a matrix in the model's column order; a model fitted with names
    gets the rows as a table of them, so no 'X does not have valid feature names' warning (9 before)."""
    import warnings

    pd = pytest.importorskip("pandas")
    d = simulate.linear_confounded(600, seed=1)
    names = [f"f{j}" for j in range(d.X.shape[1])]
    cf = CausalForest(20, max_bins=32, random_state=0).fit(pd.DataFrame(d.X, columns=names), d.t, d.y, comm=SELF)
    held = simulate.linear_confounded(300, seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report, _, _ = analysis_report(cf, held.X, held.t, held.y, names, cf.feature_importances_)
    assert "unavailable" not in report
    ate, se = cf.average_treatment_effect(X=pd.DataFrame(held.X, columns=names), t=held.t, y=held.y, comm=SELF)
    assert report["average_effects"]["all"]["estimate"] == [pytest.approx(float(ate), abs=1e-12)]
    blp = report["best_linear_projection"]
    assert set(blp["terms"]) - {"(Intercept)"} <= set(names)

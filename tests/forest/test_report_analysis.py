"""The report's analysis part: per-arm numbers for multi-arm models, reasons for what cannot be computed."""
import json

import numpy as np

from forest import simulate
from forest.causal_forest import CausalForest
from forest.report_analysis import analysis_report
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
    report, lines, _ = analysis_report(cf, d.X[:500], d.t[:500], d.y[:500], ["a", "b", "c", "d"],
                                       cf.feature_importances_)
    assert set(report["average_effects"]) == {"all", "overlap"}
    assert set(report["unavailable"]) == {"average_effect_treated", "average_effect_control", "rate"}
    assert "Not available on these data:" in lines

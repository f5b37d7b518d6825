"""Result objects: tests, intervals, tables and JSON."""
import json

import numpy as np
import pytest
from scipy import stats

from forest.analysis.result import EstimateTable, RATEResult


def test_two_sided_t_tests_and_intervals():
    tab = EstimateTable(["(Intercept)", "x"], [1.0, -0.2], [0.5, 0.1], title="BLP", dof=20)
    np.testing.assert_allclose(tab.statistic, [2.0, -2.0])
    np.testing.assert_allclose(tab.pvalue, 2 * stats.t(20).sf([2.0, 2.0]))
    lo, hi = tab.conf_int(0.1)
    half = stats.t(20).ppf(0.95) * np.array([0.5, 0.1])
    np.testing.assert_allclose(lo, [1.0, -0.2] - half)
    np.testing.assert_allclose(hi, [1.0, -0.2] + half)
    text = str(tab)
    assert text.splitlines()[0] == "BLP" and "Pr(>|t|)" in text and "(Intercept)" in text


def test_one_sided_normal_and_contrasts():
    tab = EstimateTable(["a", "b"], [[1.0, -1.0], [0.0, 3.0]], [[1.0, 1.0], [1.0, 1.0]], title="cal",
                        alternative="greater", contrasts=["1 - 0", "2 - 0"])
    np.testing.assert_allclose(tab.pvalue, stats.norm.sf([[1.0, -1.0], [0.0, 3.0]]))
    assert "1 - 0: a" in str(tab) and "Pr(>z)" in str(tab)
    d = json.loads(json.dumps(tab.to_dict()))
    assert d["contrasts"] == ["1 - 0", "2 - 0"] and np.shape(d["estimate"]) == (2, 2)
    assert d["alternative"] == "greater"


def test_rate_result_and_validation():
    r = RATEResult("AUTOC", 0.3, 0.1, q=[0.5, 1.0], toc=[0.4, 0.0], toc_stderr=[0.1, 0.0], n_bootstrap=50)
    assert r.estimate.shape == (1,) and r.terms == ["AUTOC"]
    assert r.pvalue[0] == pytest.approx(2 * stats.norm.sf(3.0))
    d = r.to_dict()
    assert d["toc"]["q"] == [0.5, 1.0] and d["n_bootstrap"] == 50
    assert "q=0.5" in str(r)
    json.dumps(EstimateTable(["a"], [np.nan], [0.0], title="t").to_dict())       # NaN -> null
    with pytest.raises(ValueError, match="terms"):
        EstimateTable(["a"], [1.0, 2.0], [1.0, 1.0], title="t")
    with pytest.raises(ValueError, match="contrast"):
        EstimateTable(["a"], [[1.0]], [[1.0]], title="t")
    with pytest.raises(ValueError, match="alternative"):
        EstimateTable(["a"], [1.0], [1.0], title="t", alternative="less")
    with pytest.raises(ValueError, match="alpha"):
        EstimateTable(["a"], [1.0], [1.0], title="t").conf_int(1.5)

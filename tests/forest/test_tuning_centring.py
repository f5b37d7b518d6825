"""tune_parameters' centring choice (issue 35): the corrected nuisances only where the effect's R-loss is lower.

Known answers: two designs where the nuisance forests' local linear corrections have the
lower out-of-bag nuisance error, so the nuisance error alone would take them in both; on one
they give the better effect, on the other the worse one, and the choice must follow the
effect.
"""
import numpy as np
import pytest

from forest import CausalForest
from forest.estimators import tuning
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _design(kind, n=500, seed=0):
    """Confounded binary treatment (propensity 0.2 + 0.6 x0); ``(X, W, Y, tau)``.

    ``linear``: outcome linear in x, effect 1 (the forests' leaves smooth a linear m(x), its
    correction removes that). ``exp``: control surface ``exp(2.5 x0 + 1.5 x1)``, treated
    surface linear (as IHDP's surface B), so the effect is heterogeneous and large where
    the correction's linear fit of the exponential is worst.
    """
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 5))
    W = (rng.uniform(size=n) < 0.2 + 0.6 * X[:, 0]).astype(float)
    if kind == "linear":
        y0 = 4 * X[:, 0] + 3 * X[:, 1] + 2 * X[:, 2]
        y1 = y0 + 1.0
    else:
        y0 = np.exp(2.5 * X[:, 0] + 1.5 * X[:, 1])
        y1 = 3 * X[:, 0] + 3 * X[:, 1]
    return X, W, np.where(W > 0, y1, y0) + 0.5 * rng.normal(size=n), y1 - y0


@pytest.mark.parametrize("kind, seed, expected", [("linear", 0, "local linear"), ("exp", 1, "forest"),
                                                  ("exp", 4, "forest")])
def test_the_centring_with_the_better_effect_is_chosen(kind, seed, expected, monkeypatch):
    X, W, Y, tau = _design(kind, seed=seed)
    seen = {}
    choose = tuning._Tuner._choose_centring

    def spy(self, first, corrected):            # keep both centrings to fit the effect on each
        seen["forest"] = {k: v.copy() for k, v in self.hats.items()}
        seen["local linear"] = {**seen["forest"], **{k: v.copy() for k, v in corrected.items()}}
        return choose(self, first, corrected)

    monkeypatch.setattr(tuning._Tuner, "_choose_centring", spy)
    tuned = CausalForest(100, random_state=1, tune_parameters=["nuisance"], tune_num_trees=100).fit(X, W, Y, comm=SELF)
    rec = tuned.tuning_
    # the corrections had the lower nuisance error: the rule this replaces would have taken them
    assert "y_hat" in rec["centring"]["candidates"]
    assert min(rec["nuisance"]["y_hat"]["errors"][1:]) < rec["nuisance"]["y_hat"]["errors"][0]
    assert rec["centring"]["model"] == expected
    # the known answer: the chosen centring's effect forest is the closer to the true effect
    rmse = {}
    for name, hats in seen.items():
        est = CausalForest(100, random_state=1).fit(X, W, Y, comm=SELF, **hats)
        rmse[name] = float(np.sqrt(np.mean((est.predict(X) - tau) ** 2)))
    other = "forest" if expected == "local linear" else "local linear"
    assert rmse[expected] < 0.97 * rmse[other], rmse
    if expected == "forest":
        # nothing changed: the untuned fit, bit for bit, its nuisance forests kept
        plain = CausalForest(100, random_state=1).fit(X, W, Y, comm=SELF)
        np.testing.assert_array_equal(tuned.predict(X), plain.predict(X))
        assert all(c["model"] == "forest" and c["ll_lambda"] is None for c in rec["nuisance"].values())
        assert tuned.outcome_forest_ is not None and tuned.treatment_forest_ is not None
    else:
        assert tuned.outcome_forest_ is None and tuned.nuisance_["y_hat"]["source"] == "local linear forest"
        np.testing.assert_array_equal(tuned._oob_rows_.y_hat.ravel(), seen["local linear"]["y_hat"].ravel())

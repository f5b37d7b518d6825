"""best_linear_projection(target="overlap"): grf's overlap-weighted projection (issue 38)."""
import numpy as np
import pytest

from forest import CausalForest
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def test_overlap_projection_is_the_e_one_minus_e_weighted_regression_of_the_scores():
    rng = np.random.default_rng(0)
    n = 3000
    X = rng.normal(size=(n, 3))
    e = 1 / (1 + np.exp(-1.5 * X[:, 0]))
    t = (rng.random(n) < e).astype(float)
    tau = 1 + (X[:, 0] > 0)                      # larger where treatment is likely
    y = X[:, 1] + tau * t + rng.normal(size=n)
    cf = CausalForest(200, random_state=0).fit(X, t, y, comm=SELF)
    scores = cf.get_scores()
    t_hat = cf._oob_rows_.t_hat[:, 0]
    ow = t_hat * (1 - t_hat)
    table = cf.best_linear_projection(A=X[:, :1], target="overlap", comm=SELF)
    D = np.column_stack([np.ones(n), X[:, 0]])
    sw = np.sqrt(ow)
    coef = np.linalg.lstsq(D * sw[:, None], scores * sw, rcond=None)[0]
    np.testing.assert_allclose(table.estimate, coef, rtol=1e-9)
    # intercept only: the overlap-weighted mean of the scores, grf's overlap average effect's point estimate
    only = cf.best_linear_projection(target="overlap", comm=SELF)
    np.testing.assert_allclose(only.estimate[0], np.average(scores, weights=ow), rtol=1e-9)
    truth = np.average(tau, weights=e * (1 - e))
    assert abs(only.estimate[0] - truth) < 3 * only.stderr[0]
    overlap_ate, _ = cf.average_treatment_effect(target="overlap")
    assert abs(only.estimate[0] - overlap_ate) < 2 * only.stderr[0]
    with pytest.raises(ValueError, match="target must be one of"):
        cf.best_linear_projection(target="treated", comm=SELF)


def test_overlap_projection_needs_a_binary_treatment():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(600, 3))
    t = rng.normal(size=600)
    y = X[:, 0] + t + rng.normal(size=600)
    cf = CausalForest(20, random_state=0).fit(X, t, y, comm=SELF)
    with pytest.raises(ValueError, match="needs a binary treatment"):
        cf.best_linear_projection(target="overlap", comm=SELF)

"""The instrumental forest's average effect and best linear projection (grf's, issue 38)."""
import warnings

import numpy as np
import pytest

from forest import InstrumentalForest, simulate
from forest.analysis.inference import PROPENSITY_CLIP, instrumental_scores
from native.comm import SelfCommunicator
from tests.conftest import block_slice

SELF = SelfCommunicator()


def _design(seed, n=4000):
    """forest.simulate.instrumental: a binary instrument, an unobserved confounder of treatment and
    outcome, and tau(x) everyone's effect at x (so the local effect), with the true compliance."""
    d = simulate.instrumental(n, seed=seed)
    return d.X, d.t, d.y, d.z, d.tau, d.compliance


def test_scores_are_grf_formula():
    rng = np.random.default_rng(0)
    tau, t, y, y_hat, t_hat = rng.normal(size=(5, 50))
    z = rng.integers(0, 2, 50).astype(float)
    z_hat = rng.uniform(0, 1, 50)
    z_hat[0] = 0.0
    c = rng.uniform(0.2, 1.0, 50)
    e = np.clip(z_hat, PROPENSITY_CLIP, 1 - PROPENSITY_CLIP)
    want = tau + (z - e) / (e * (1 - e)) / c * (y - y_hat - tau * (t - t_hat))
    np.testing.assert_allclose(instrumental_scores(tau, t, y, z, y_hat, t_hat, z_hat, c), want, rtol=1e-13)


@pytest.mark.parametrize("seed", [0, 3])
def test_average_effect_and_projection_recover_the_truth(seed):
    X, t, y, z, tau, compliance = _design(seed)
    iv = InstrumentalForest(300, random_state=seed).fit(X, t, y, z, comm=SELF)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the training rows are recognised (a notice)
        est, se = iv.average_treatment_effect(X, t, y, z, comm=SELF)
        blp = iv.best_linear_projection(X, t, y, z, A=X[:, 1:2], comm=SELF)
        given, _ = iv.average_treatment_effect(X, t, y, z, compliance_score=compliance, comm=SELF)
        scores = iv.get_scores(X, t, y, z, compliance_score=compliance, comm=SELF)
    assert 0.05 < se < 0.4
    assert abs(est - tau.mean()) < 3 * se, (est, se, tau.mean())
    assert abs(given - tau.mean()) < 3 * se
    np.testing.assert_allclose(given, scores.mean(), rtol=1e-12)
    # tau = 1 + 2 * 1[x0 > 0.5] + x1 with x uniform on [0, 1]: projection on (1, x1) is 2 + x1
    assert abs(blp.estimate[0] - 2) < 3 * blp.stderr[0] and abs(blp.estimate[1] - 1) < 3 * blp.stderr[1]


def test_held_out_rows_and_refusals():
    X, t, y, z, tau, _ = _design(1, n=3000)
    iv = InstrumentalForest(100, random_state=0).fit(X[:2000], t[:2000], y[:2000], z[:2000], comm=SELF)
    rows = iv._iv_rows(X[2000:], t[2000:], y[2000:], z[2000:], None, None, None, SELF)
    assert rows.source == "held-out" and rows.n == 1000
    est, se = iv.average_treatment_effect(X[2000:], t[2000:], y[2000:], z[2000:], comm=SELF)
    assert abs(est - tau[2000:].mean()) < 4 * se
    with pytest.raises(ValueError, match="binary 0/1 instrument"):
        iv.average_treatment_effect(X[2000:], t[2000:], y[2000:], z[2000:] + 0.5, comm=SELF)
    with pytest.raises(ValueError, match="target='all' only"):
        iv.average_treatment_effect(X[2000:], t[2000:], y[2000:], z[2000:], target="treated", comm=SELF)
    with pytest.raises(ValueError, match="compliance_score must hold 1000"):
        iv.average_treatment_effect(X[2000:], t[2000:], y[2000:], z[2000:], compliance_score=np.ones(3), comm=SELF)
    given = InstrumentalForest(20, random_state=0).fit(X[:500], t[:500], y[:500], z[:500], y_hat=np.zeros(500),
                                                       t_hat=np.full(500, 0.5), z_hat=np.full(500, 0.5), comm=SELF)
    with pytest.raises(ValueError, match="nuisance forests"):
        given.average_treatment_effect(X[:500], t[:500], y[:500], z[:500], comm=SELF)


@pytest.mark.mpi
def test_same_average_effect_for_any_rank_count(comm):
    X, t, y, z, _, _ = _design(2, n=900)
    sl = block_slice(900, comm.size, comm.rank)
    kw = dict(n_estimators=40, nuisance_estimators=20, max_bins=32, random_state=4)
    dist = InstrumentalForest(**kw).fit(X[sl], t[sl], y[sl], z[sl], comm=comm)
    ref = InstrumentalForest(**kw).fit(X, t, y, z, comm=SELF)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = dist.average_treatment_effect(X[sl], t[sl], y[sl], z[sl], comm=comm)
        want = ref.average_treatment_effect(X, t, y, z, comm=SELF)
        got_blp = dist.best_linear_projection(X[sl], t[sl], y[sl], z[sl], A=X[sl, :2], comm=comm)
        want_blp = ref.best_linear_projection(X, t, y, z, A=X[:, :2], comm=SELF)
    np.testing.assert_allclose(got, want, rtol=1e-9)
    np.testing.assert_allclose(got_blp.estimate, want_blp.estimate, rtol=1e-8)
    np.testing.assert_allclose(got_blp.stderr, want_blp.stderr, rtol=1e-8)

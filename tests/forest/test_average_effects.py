"""Average effects (all / treated / control / overlap) against grf's formulas and known answers."""
import numpy as np
import pytest

from forest import simulate
from forest.analysis.average_effects import average_treatment_effect
from forest.engine.clusters import cluster_layout
from forest.analysis.effect_rows import make_effect_rows
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _binary_rows(d, tau_hat=None, weight=None, labels=None, equalize=False):
    n = len(d.y)
    tau = d.tau if tau_hat is None else tau_hat
    layout = None if labels is None else cluster_layout(SELF, labels, n, equalize)
    w = np.ones(n) if weight is None else weight
    return make_effect_rows("binary", tau.reshape(n, 1, 1), d.t[:, None], d.t.astype(np.int64), d.y, d.m, d.e, None,
                            w, np.arange(n), layout)


def _grf_targeted_reference(y, W, e, m, tau, w, target):
    """grf's average_treatment_effect for target.sample treated/control, binary W, no clusters (a transcription
    of its documented steps in plain loops)."""
    treated, control = W == 1, W == 0
    group = treated if target == "treated" else control
    raw = np.sum(w[group] * tau[group]) / np.sum(w[group])
    raw_var = np.sum(w[group] ** 2 * (tau[group] - raw) ** 2) / np.sum(w[group]) ** 2
    mu0, mu1 = m - e * tau, m + (1 - e) * tau
    gamma = np.zeros(len(y))
    if target == "treated":
        g_c, g_t = e[control] / (1 - e[control]), np.ones(treated.sum())
    else:
        g_c, g_t = np.ones(control.sum()), (1 - e[treated]) / e[treated]
    gamma[control] = g_c / np.sum(w[control] * g_c) * np.sum(w)
    gamma[treated] = g_t / np.sum(w[treated] * g_t) * np.sum(w)
    corr = W * gamma * (y - mu1) - (1 - W) * gamma * (y - mu0)
    n_pos = np.sum(w != 0)
    sigma2 = np.sum(w ** 2 * corr ** 2 / np.sum(w) ** 2) * n_pos / (n_pos - 1)
    return raw + np.sum(w * corr) / np.sum(w), np.sqrt(raw_var + sigma2)


@pytest.mark.parametrize("target", ["treated", "control"])
def test_targeted_effects_follow_grf(target):
    d = simulate.linear_confounded(500, seed=1)
    rng = np.random.default_rng(2)
    tau_hat = d.tau + 0.3 * rng.normal(size=500)
    w = rng.uniform(0.5, 2, size=500)
    est, se = average_treatment_effect(SELF, _binary_rows(d, tau_hat, w), target)
    ref = _grf_targeted_reference(d.y, d.t, d.e, d.m, tau_hat, w, target)
    assert est[0, 0] == pytest.approx(ref[0], rel=1e-12)
    assert se[0, 0] == pytest.approx(ref[1], rel=1e-12)


def test_all_is_the_mean_score_with_grf_standard_error():
    d = simulate.linear_confounded(400, seed=3)
    w = np.random.default_rng(4).uniform(0.5, 2, size=400)
    rows = _binary_rows(d, weight=w)
    est, se = average_treatment_effect(SELF, rows, "all")
    G = rows.scores[:, 0, 0]
    mean = np.sum(w * G) / np.sum(w)
    assert est[0, 0] == pytest.approx(mean, rel=1e-12)
    assert se[0, 0] == pytest.approx(np.sqrt(np.sum(w ** 2 * (G - mean) ** 2) * 400 / 399) / np.sum(w), rel=1e-12)


def test_overlap_is_the_residual_on_residual_slope():
    d = simulate.linear_confounded(600, seed=5)
    est, se = average_treatment_effect(SELF, _binary_rows(d), "overlap")
    yr, wr = d.y - d.m, d.t - d.e
    slope = np.cov(yr, wr, bias=True)[0, 1] / np.var(wr)
    assert est[0, 0] == pytest.approx(slope, rel=1e-10)
    assert 0.0 < se[0, 0] < 0.2


def test_known_answers_under_confounding_with_heterogeneity():
    """ATT 2.3 > ATE 2.0 > ATC 1.7, recovered from the true nuisances and a wrong CATE (double robustness)."""
    d = simulate.linear_confounded(40000, seed=6)
    rows = _binary_rows(d, tau_hat=np.full(40000, 2.0))
    truth = {"all": d.tau.mean(), "treated": d.tau[d.t == 1].mean(), "control": d.tau[d.t == 0].mean()}
    assert truth["treated"] - truth["all"] > 0.25 and truth["all"] - truth["control"] > 0.25
    for target, value in truth.items():
        est, se = average_treatment_effect(SELF, rows, target)
        assert abs(est[0, 0] - value) < 3.5 * se[0, 0], (target, est, se, value)
        assert se[0, 0] < 0.04
    overlap_truth = np.sum(d.e * (1 - d.e) * d.tau) / np.sum(d.e * (1 - d.e))
    est, se = average_treatment_effect(SELF, rows, "overlap")
    assert abs(est[0, 0] - overlap_truth) < 3.5 * se[0, 0]


def test_multi_arm_targets_are_per_arm_against_control():
    d = simulate.multi_arm(30000, n_arms=2, seed=7)
    n = len(d.y)
    W = np.zeros((n, 2))
    W[d.t == 1, 0] = 1
    W[d.t == 2, 1] = 1
    rows = make_effect_rows("categorical", np.zeros((n, 2, 1)), W, d.t, d.y, d.m, d.e, None, np.ones(n),
                            np.arange(n), None)
    for target, mask in (("treated", None), ("control", d.t == 0)):
        est, se = average_treatment_effect(SELF, rows, target)
        for k in range(2):
            group = (d.t == k + 1) if mask is None else mask
            assert abs(est[k, 0] - d.tau[group, k].mean()) < 3.5 * se[k, 0], (target, k)


def test_clustered_standard_errors_and_equal_cluster_weights():
    d = simulate.linear_confounded(3000, seed=8)
    labels = np.repeat(np.arange(30), 100)
    shock = np.random.default_rng(9).normal(size=30)[labels]
    d = d._replace(y=d.y + d.t * shock)               # each cluster has its own effect shift
    plain = average_treatment_effect(SELF, _binary_rows(d), "all")
    clustered = average_treatment_effect(SELF, _binary_rows(d, labels=labels), "all")
    assert clustered[0][0, 0] == pytest.approx(plain[0][0, 0])
    assert clustered[1][0, 0] > 1.5 * plain[1][0, 0]
    # grf's example: 10 clusters of 1 row with effect 1, 10 of 19 rows with effect 0
    labels = np.concatenate([np.arange(10), np.repeat(np.arange(10, 20), 19)])
    n = len(labels)
    tau = np.where(labels < 10, 1.0, 0.0)
    rows = make_effect_rows("binary", tau.reshape(n, 1, 1), np.full((n, 1), 0.5), np.zeros(n, np.int64),
                            np.zeros(n), np.zeros(n), np.full(n, 0.5), None, np.ones(n), np.arange(n), None)
    rows = rows._replace(scores=tau.reshape(n, 1, 1))
    per_row = average_treatment_effect(SELF, rows._replace(layout=cluster_layout(SELF, labels, n)), "all")[0]
    eq_layout = cluster_layout(SELF, labels, n, equalize=True)
    equal = average_treatment_effect(SELF, rows._replace(layout=eq_layout, weight=1.0 / eq_layout.row_sizes), "all")
    assert per_row[0, 0] == pytest.approx(0.05) and equal[0][0, 0] == pytest.approx(0.5)


def test_errors():
    c = simulate.continuous_treatment(200, seed=1)
    rows = make_effect_rows("continuous", c.tau.reshape(200, 1, 1), c.t[:, None], None, c.y, c.m, c.e,
                            np.ones((200, 1, 1)), np.ones(200), np.arange(200), None)
    with pytest.raises(ValueError, match="continuous"):
        average_treatment_effect(SELF, rows, "treated")
    with pytest.raises(ValueError, match="target"):
        average_treatment_effect(SELF, rows, "everyone")
    with pytest.raises(ValueError, match="subset"):
        average_treatment_effect(SELF, rows, "all", subset=np.ones(10, bool))
    est, _ = average_treatment_effect(SELF, rows, "overlap")
    assert abs(est[0, 0] - np.mean(c.tau)) < 0.3


@pytest.mark.mpi
def test_same_effects_for_any_rank_count(comm, rank_slice):
    d = simulate.linear_confounded(700, seed=10)
    labels = np.arange(700) // 9
    sl = rank_slice(700)
    n_loc = len(d.y[sl])
    part = simulate.CausalData(*(a[sl] for a in d))
    out = {}
    for clustered in (False, True):
        dist_layout = cluster_layout(comm, labels[sl], n_loc) if clustered else None
        dist_rows = make_effect_rows("binary", part.tau.reshape(n_loc, 1, 1) * 0.9, part.t[:, None],
                                     part.t.astype(np.int64), part.y, part.m, part.e, None, np.ones(n_loc),
                                     np.arange(700)[sl], dist_layout)
        ref_rows = _binary_rows(d, tau_hat=d.tau * 0.9, labels=labels if clustered else None)
        for target in ("all", "treated", "control", "overlap"):
            out[clustered, target] = (average_treatment_effect(comm, dist_rows, target),
                                      average_treatment_effect(SELF, ref_rows, target))
    for (dist_est, dist_se), (ref_est, ref_se) in out.values():
        np.testing.assert_allclose(dist_est, ref_est, rtol=1e-10)
        np.testing.assert_allclose(dist_se, ref_se, rtol=1e-9)

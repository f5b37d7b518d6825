"""RATE / TOC: grf's estimator against a slow reference, bootstrap behaviour, any rank count."""
import numpy as np
import pytest

from forest.analysis.global_sort import sort_descending
from forest.analysis.rate import _statistics_reference, check_q, rank_average_treatment_effect, rate_statistics
from native.comm import SelfCommunicator

SELF = SelfCommunicator()
Q = np.array([0.05, 0.1, 0.25, 0.5, 0.75, 1.0])


def _sample(n, seed, heterogeneity=1.0):
    rng = np.random.default_rng(seed)
    x = rng.uniform(size=n)
    tau = 1.0 + heterogeneity * 2.0 * (x - 0.5)
    scores = tau + 2.0 * rng.normal(size=n)              # doubly robust scores: unbiased, noisy
    priority = np.round(x, 2)                            # ties
    w = rng.uniform(0.5, 2.0, size=n)
    return scores, priority, w, tau


def test_statistics_match_reference_with_ties_and_weights():
    scores, prio, w, _ = _sample(700, 0)
    st = rate_statistics(SELF, scores, prio, w, np.arange(700), np.arange(700), q=Q, n_bootstrap=3, seed=1)
    autoc, qini, toc = _statistics_reference(prio, w, scores, Q)
    assert st["autoc"][0] == pytest.approx(autoc, rel=1e-12)
    assert st["qini"][0] == pytest.approx(qini, rel=1e-12)
    np.testing.assert_allclose(st["toc"][0], toc, atol=1e-12)
    assert st["toc"][0][-1] == pytest.approx(0.0, abs=1e-12)


def test_known_answer_with_true_effects():
    """Priorities = the true effect: AUTOC and QINI are positive; no heterogeneity gives about 0."""
    n = 6000
    scores, prio, w, tau = _sample(n, 2)
    w = np.ones(n)
    res = rank_average_treatment_effect(SELF, scores[:, None], prio, w, np.arange(n), np.arange(n), n_bootstrap=100)
    # population AUTOC for tau = 1 + 2(x - 1/2), x uniform: int_0^1 (1 - q) dq - 0 = 1/2 ... of TOC(q) = 1 - q
    assert abs(res.estimate[0] - 0.5) < 3 * res.stderr[0] + 0.02
    assert res.estimate[0] / res.stderr[0] > 5
    flat, prio0, _, _ = _sample(n, 3, heterogeneity=0.0)
    null = rank_average_treatment_effect(SELF, flat[:, None], prio0, w, np.arange(n), np.arange(n), n_bootstrap=100)
    assert abs(null.estimate[0]) < 3 * null.stderr[0]
    qini = rank_average_treatment_effect(SELF, scores[:, None], prio, w, np.arange(n), np.arange(n),
                                         target="QINI", n_bootstrap=100)
    # population QINI: int_0^1 q (1 - q) dq = 1/6
    assert abs(qini.estimate[0] - 1 / 6) < 3 * qini.stderr[0] + 0.01
    np.testing.assert_allclose(res.toc, 1 - res.q, atol=4 * res.toc_stderr.max() + 0.02)


def test_bootstrap_standard_error_is_calibrated():
    """Half-sample bootstrap SE against the spread of the estimate over fresh samples."""
    reps, ses = [], []
    for seed in range(40):
        scores, prio, _, _ = _sample(800, 100 + seed)
        res = rank_average_treatment_effect(SELF, scores[:, None], prio, np.ones(800), np.arange(800),
                                            np.arange(800), n_bootstrap=60, seed=seed)
        reps.append(res.estimate[0])
        ses.append(res.stderr[0])
    ratio = np.mean(ses) / np.std(reps, ddof=1)
    assert 0.75 < ratio < 1.35, ratio


def test_cluster_bootstrap_draws_whole_clusters():
    n = 2000
    scores, prio, w, _ = _sample(n, 4)
    clusters = np.repeat(np.arange(20), 100)
    shock = np.random.default_rng(5).normal(size=20)[clusters] * 3.0
    prio = np.random.default_rng(6).normal(size=20)[clusters] + 0.01 * prio   # priorities vary by cluster
    by_row = rank_average_treatment_effect(SELF, (scores + shock)[:, None], prio, w, np.arange(n), np.arange(n),
                                           n_bootstrap=100)
    by_cluster = rank_average_treatment_effect(SELF, (scores + shock)[:, None], prio, w, clusters, np.arange(n),
                                               n_bootstrap=100)
    assert by_cluster.stderr[0] > 2 * by_row.stderr[0]


def test_input_checks():
    with pytest.raises(ValueError, match="grid"):
        check_q([0.5, 0.2, 1.0])
    with pytest.raises(ValueError, match="grid"):
        check_q([0.1, 0.9])
    s = np.zeros((10, 1))
    with pytest.raises(ValueError, match="target"):
        rank_average_treatment_effect(SELF, s, np.arange(10.0), np.ones(10), np.arange(10), np.arange(10),
                                      target="AUC")
    with pytest.raises(ValueError, match="NaN"):
        rank_average_treatment_effect(SELF, s, np.full(10, np.nan), np.ones(10), np.arange(10), np.arange(10))
    with pytest.raises(ValueError, match="at least 4 units"):
        rank_average_treatment_effect(SELF, s, np.arange(10.0), np.ones(10), np.arange(10), np.arange(10),
                                      n_units=3)


@pytest.mark.mpi
def test_sort_and_rate_do_not_depend_on_rank_count(comm, rank_slice):
    n = 900
    scores, prio, w, _ = _sample(n, 7)
    prio[::3] = 0.5                                     # a large tie group
    gids = np.arange(n)
    units = gids // 7                                   # clusters of 7 rows straddling rank borders
    sl = rank_slice(n)
    key, g, pay = sort_descending(comm, prio[sl], gids[sl], scores[sl, None])
    from native import collectives as col
    all_keys = col.allgatherv(comm, key)
    all_gids = col.allgatherv(comm, g)
    all_pay = col.allgatherv(comm, pay)
    tie_ranks = col.allgather_object(comm, bool((key == 0.5).any()))
    dist = rate_statistics(comm, scores[sl], prio[sl], w[sl], units[sl], gids[sl], q=Q, n_bootstrap=20, seed=3)
    ref = rate_statistics(SELF, scores, prio, w, units, gids, q=Q, n_bootstrap=20, seed=3)
    w_hole = w.copy()
    w_hole[: n // 3] = 0.0                              # the first rank (or ranks) hold no row with weight
    dist_hole = rate_statistics(comm, scores[sl], prio[sl], w_hole[sl], units[sl], gids[sl], q=Q, n_bootstrap=5)
    ref_hole = rate_statistics(SELF, scores, prio, w_hole, units, gids, q=Q, n_bootstrap=5)
    order = np.lexsort((gids, -prio))
    np.testing.assert_array_equal(all_gids, gids[order])
    np.testing.assert_array_equal(all_keys, prio[order])
    np.testing.assert_array_equal(all_pay[:, 0], scores[order])
    assert sum(tie_ranks) == 1                          # a tie group is never split
    for k in ("autoc", "qini", "toc"):
        np.testing.assert_allclose(dist[k], ref[k], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(dist_hole[k], ref_hole[k], rtol=1e-9, atol=1e-12)

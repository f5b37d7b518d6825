"""Leaf-moment estimates, BLB variance, AIPW and the row-sampling scheme."""
import numpy as np
import pytest

from forest import simulate
from forest.criteria.causal import CausalChannels
from forest.analysis.inference import _psi, aipw_scores, blb_variance, solve_theta
from forest.engine.subsample import BOTH, ESTIMATION, OUT, STRUCTURE, tree_row_codes, tree_row_codes_reference


def _moments(layout, w, y, g):
    ind = np.zeros_like(w)
    from forest.criteria.causal import CausalCriterion
    ch = CausalCriterion(layout.K, layout.M).make_channels(w, y, g, ind)
    return ch[:, :layout.n_moments].mean(axis=0)


@pytest.mark.parametrize("K,M", [(1, 1), (2, 1), (2, 2)])
def test_solve_theta_is_weighted_regression_with_intercept(K, M):
    rng = np.random.default_rng(K + M)
    n = 300
    w = rng.normal(size=(n, K)) + 1.0
    beta = rng.normal(size=(K, M))
    y = 3.0 + w @ beta + 0.1 * rng.normal(size=(n, M))
    g = rng.uniform(0.5, 2, size=n)
    layout = CausalChannels(K, M)
    theta, _ = solve_theta(_moments(layout, w, y, g)[None], layout)
    design = np.column_stack([np.ones(n), w]) * np.sqrt(g)[:, None]
    coef = np.linalg.lstsq(design, y * np.sqrt(g)[:, None], rcond=None)[0][1:]
    np.testing.assert_allclose(theta[0], coef, rtol=1e-9)


def test_solve_theta_singular_gives_nan():
    layout = CausalChannels(1, 1)
    m = _moments(layout, np.ones((10, 1)), np.arange(10.0)[:, None], np.ones(10))
    theta, _ = solve_theta(m[None], layout)
    assert np.isnan(theta).all()


def test_psi_averages_to_zero():
    rng = np.random.default_rng(0)
    layout = CausalChannels(2, 2)
    B = 12
    tree_m = np.stack([_moments(layout, rng.normal(size=(30, 2)), rng.normal(size=(30, 2)),
                                rng.uniform(1, 2, 30)) for _ in range(B)])[None]
    mbar = tree_m.mean(axis=1)
    theta, _ = solve_theta(mbar, layout)
    u = _psi(tree_m, mbar, theta, layout)
    np.testing.assert_allclose(u.mean(axis=1), 0.0, atol=1e-12)


def _synthetic_trees(rng, n_points, G, L, sd_between, sd_within):
    """K=M=1 leaf moments with g=1, w=0, ww=1, y=0 so that theta_b = wy_b exactly."""
    layout = CausalChannels(1, 1)
    tm = np.zeros((n_points, G * L, layout.n_moments + 1))
    tm[..., 0] = 1.0
    tm[..., layout.s_ww] = 1.0
    h = rng.normal(scale=sd_between, size=(n_points, G, 1))
    e = rng.normal(scale=sd_within, size=(n_points, G, L))
    tm[..., layout.s_wy.start] = (2.0 + h + e).reshape(n_points, G * L)
    tm[..., layout.n_moments] = 10
    return layout, tm


def test_blb_variance_recovers_between_group_variance():
    rng = np.random.default_rng(1)
    layout, tm = _synthetic_trees(rng, 20, 1000, 2, sd_between=0.5, sd_within=1.0)
    theta, var = blb_variance(tm, layout, 2)
    np.testing.assert_allclose(theta[:, 0, 0], tm[..., layout.s_wy.start].mean(axis=1), rtol=1e-12)
    # truth 0.25: within-group noise (1/L = 0.5 added to between) must be removed
    assert abs(var.mean() - 0.25) < 0.025
    assert var.min() > 0.15


def test_blb_variance_is_small_and_positive_without_signal():
    rng = np.random.default_rng(2)
    layout, tm = _synthetic_trees(rng, 50, 500, 2, sd_between=0.0, sd_within=1.0)
    _, var = blb_variance(tm, layout, 2)
    assert np.all(var >= 0)
    assert var.mean() < 0.05          # the naive between-group variance would be 0.5


def test_blb_variance_skips_groups_with_empty_leaves():
    rng = np.random.default_rng(3)
    layout, tm = _synthetic_trees(rng, 3, 200, 2, 0.3, 1.0)
    tm[0, 0, :] = 0.0                 # empty leaf in group 0 of point 0
    tm[0, 0, layout.s_wy.start] = 1e6
    theta, var = blb_variance(tm, layout, 2)
    assert abs(theta[0, 0, 0] - 2.0) < 0.2
    with pytest.raises(ValueError, match="ci_group_size"):
        blb_variance(tm, layout, 1)


def _leaf_trees(rng, layout, n_points, G, L, rows, group_shift, weighted=False):
    """Per-tree leaf moments from simulated leaf samples, shape (n_points, G*L, n_moments+1).

    Each group shares an effect shift (between-group signal), each tree draws its own
    leaf rows (within-group noise), as trees sharing a half-sample do.
    """
    K, M = layout.K, layout.M
    beta = rng.normal(size=(K, M))
    out = np.zeros((n_points, G * L, layout.n_moments + 1))
    for p in range(n_points):
        for q in range(G):
            shift = group_shift * rng.normal(size=(K, M))
            for j in range(L):
                w = rng.normal(size=(rows, K)) + 0.3
                y = 0.5 + w @ (beta + shift) + rng.normal(size=(rows, M))
                g = rng.uniform(0.5, 2.0, size=rows) if weighted else np.ones(rows)
                out[p, q * L + j, :layout.n_moments] = _moments(layout, w, y, g)
                out[p, q * L + j, layout.n_moments] = rows
    return out


def _objective_bayes(var_between, group_noise, n_groups):
    """GRF's o-Bayes debiasing, written out from the paper's description (flat prior on [0, inf))."""
    import math
    est = var_between - group_noise
    se = max(var_between, group_noise) * math.sqrt(2.0 / n_groups)
    r = est / se
    return est + se * math.exp(-0.5 * r * r) / math.sqrt(2 * math.pi) / (0.5 * math.erfc(-r / math.sqrt(2)))


def test_blb_variance_matches_grf_moment_sandwich():
    """K = M = 1, unit weights: GRF's estimator (ATW 2019, eq. 16) with the moment function
    psi = ((Y - W tau - mu) W, Y - W tau - mu) on each tree's leaf averages, the sandwich
    xi' V^-1 H V^-T xi with V = [[E WW, E W], [E W, 1]], between-group H debiased by
    the within-group noise and o-Bayes. Written with loops, independently of _psi."""
    rng = np.random.default_rng(11)
    layout = CausalChannels(1, 1)
    G, L = 60, 2
    tm = _leaf_trees(rng, layout, 4, G, L, rows=12, group_shift=0.4)
    _, var = blb_variance(tm, layout, L)
    i_w, i_y, i_wy, i_ww = layout.s_w.start, layout.s_y.start, layout.s_wy.start, layout.s_ww.start
    for p in range(tm.shape[0]):
        avg = tm[p].mean(axis=0)
        D = avg[i_ww] - avg[i_w] ** 2
        tau = (avg[i_wy] - avg[i_w] * avg[i_y]) / D
        mu = avg[i_y] - avg[i_w] * tau
        v = []
        for b in range(G * L):
            m = tm[p, b]
            psi1 = m[i_wy] - m[i_ww] * tau - m[i_w] * mu
            psi2 = m[i_y] - m[i_w] * tau - mu
            v.append((psi1 - avg[i_w] * psi2) / D)      # xi' V^-1 psi
        v = np.array(v).reshape(G, L)
        between = np.mean(v.mean(axis=1) ** 2)
        total = np.mean(v ** 2)
        ref = _objective_bayes(between, (total - between) / (L - 1), G)
        np.testing.assert_allclose(var[p, 0, 0], ref, rtol=1e-9)


def test_blb_variance_is_delta_method_of_theta():
    """K = 2 arms, M = 2 outcomes, sample weights: each tree's psi is the Jacobian of
    theta(mbar) (central finite differences of solve_theta) times its moment deviation,
    and the variance is between-group minus within-group/L of those (strong signal,
    so the o-Bayes step changes nothing measurable)."""
    rng = np.random.default_rng(12)
    layout = CausalChannels(2, 2)
    G, L = 200, 3
    tm = _leaf_trees(rng, layout, 2, G, L, rows=40, group_shift=0.5, weighted=True)
    theta, var = blb_variance(tm, layout, L)
    nm = layout.n_moments
    for p in range(tm.shape[0]):
        mbar = tm[p, :, :nm].mean(axis=0)
        J = np.empty((4, nm))
        for c in range(nm):
            h = 1e-6 * max(abs(mbar[c]), 1e-3)
            up, dn = mbar.copy(), mbar.copy()
            up[c] += h
            dn[c] -= h
            J[:, c] = (solve_theta(up[None], layout)[0] - solve_theta(dn[None], layout)[0]).ravel() / (2 * h)
        psi = (tm[p, :, :nm] - mbar) @ J.T                      # (G*L, K*M)
        psi = psi.reshape(G, L, 4)
        gm = psi.mean(axis=1)
        between = (gm ** 2).mean(axis=0)
        within = ((psi - gm[:, None]) ** 2).sum(axis=(0, 1)) / (G * (L - 1))
        np.testing.assert_allclose(theta[p].ravel(), solve_theta(mbar[None], layout)[0].ravel(), rtol=1e-12)
        np.testing.assert_allclose(var[p].ravel(), between - within / L, rtol=1e-5)


def test_blb_raw_variance_matches_sampling_variance_of_fitted_forests():
    """End to end on simulated data (constant effect): over independent training sets, the
    method-of-moments BLB variance (between-group minus within-group/L, before the o-Bayes
    step) of fitted CausalForests has the size of the forests' actual sampling variance at
    fixed test points. It is about zero if the trees of a group do not share a
    half-sample (e.g. tree order or group hashing broken), which the o-Bayes floor alone
    would hide at this forest size."""
    from forest.estimators.causal_forest import CausalForest
    from forest.engine.honest_forest import tree_values
    from native.comm import SelfCommunicator

    layout = CausalChannels(1, 1)
    X_test = simulate.constant_effect(40, d=4, seed=999).X
    thetas, raws = [], []
    for r in range(10):
        d = simulate.constant_effect(1000, d=4, tau=1.0, seed=30 + r)
        cf = CausalForest(200, max_bins=32, random_state=r).fit(d.X, d.t, d.y, comm=SelfCommunicator())
        tm = tree_values(cf.estimators_, X_test)[..., :layout.n_moments]
        mbar = tm.mean(axis=1)
        theta, A = solve_theta(mbar, layout)
        psi = (_psi(tm, mbar, theta, layout)[..., 0, 0] / A[:, None, 0, 0]).reshape(len(X_test), -1, 2)
        gm = psi.mean(axis=2)
        raws.append((gm ** 2).mean(axis=1) - ((psi - gm[..., None]) ** 2).sum(axis=2).mean(axis=1) / 2)
        thetas.append(theta[:, 0, 0])
    ratio = np.mean(raws) / np.var(thetas, axis=0, ddof=1).mean()
    # measured 0.57 .. 1.48 over five seed blocks; about 0 with groups broken
    assert 0.3 < ratio < 3.0, ratio


def _mean_and_se(G):
    return G.mean(axis=0), G.std(axis=0, ddof=1) / np.sqrt(len(G))


def test_aipw_binary_doubly_robust_with_true_nuisances():
    d = simulate.constant_effect(20000, seed=5)
    n = len(d.y)
    for tau_guess in (d.tau, np.zeros(n)):          # a wrong CATE is corrected by the weights
        G = aipw_scores("binary", tau_guess.reshape(n, 1, 1), d.t, d.y[:, None], d.m[:, None], d.e[:, None])
        est, se = _mean_and_se(G)
        assert abs(est[0, 0] - 2.0) < 3 * se[0, 0] + 0.02, (est, se)
        assert 0.01 < se[0, 0] < 0.1


def test_aipw_multi_arm_and_continuous():
    d = simulate.multi_arm(30000, n_arms=2, seed=6)
    n = len(d.y)
    G = aipw_scores("categorical", np.zeros((n, 2, 1)), d.t, d.y[:, None], d.m[:, None], d.e)
    est, se = _mean_and_se(G)
    truth = d.tau.mean(axis=0)
    assert np.all(np.abs(est[:, 0] - truth) < 3.5 * se[:, 0] + 0.02), (est, truth, se)
    c = simulate.continuous_treatment(30000, seed=7)
    cov = np.ones((n, 1, 1))                           # W = x0 + N(0,1): Var(W|x) = 1
    G = aipw_scores("continuous", np.zeros((n, 1, 1)), c.t, c.y[:, None], c.m[:, None], c.e[:, None], cov)
    est, se = _mean_and_se(G)
    assert abs(est[0, 0] - c.tau.mean()) < 3.5 * se[0, 0] + 0.02
    with pytest.raises(ValueError, match="local_cov"):
        aipw_scores("continuous", np.zeros((n, 1, 1)), c.t, c.y, c.m, c.e)


@pytest.mark.parametrize("group,frac,honest", [(1, 0.5, True), (2, 0.5, True), (2, 0.3, False), (1, 0.7, False)])
def test_tree_row_codes_match_reference_and_rates(group, frac, honest):
    gids = np.arange(5000, dtype=np.int64) * 7 + 3
    trees = np.arange(6)
    kw = dict(sample_fraction=frac, ci_group_size=group, honest=honest, honesty_fraction=0.5)
    fast = tree_row_codes(42, trees, gids, **kw)
    np.testing.assert_array_equal(fast, tree_row_codes_reference(42, trees, gids, **kw))
    kept = (fast != OUT).mean()
    assert abs(kept - frac) < 0.03
    if honest:
        assert abs((fast == STRUCTURE).mean() - frac / 2) < 0.03
        assert set(np.unique(fast)) <= {OUT, STRUCTURE, ESTIMATION}
    else:
        assert set(np.unique(fast)) <= {OUT, BOTH}
    if group == 2 and frac == 0.5:
        # a group's trees share a half-sample: with fraction 1/2 each takes all of it
        np.testing.assert_array_equal(fast[0] != OUT, fast[1] != OUT)
        assert (fast[0] != fast[1]).any()
    # codes depend on the global id only, not on the position in the local array
    perm = np.random.default_rng(0).permutation(len(gids))
    np.testing.assert_array_equal(tree_row_codes(42, trees, gids[perm], **kw), fast[:, perm])


def test_oob_effects_falls_back_to_all_trees_where_singular():
    """A row whose out-of-bag moments are singular takes the all-tree moments; a row
    singular even then gets effect 0 (never NaN, which would poison the AIPW mean)."""
    layout = CausalChannels(1, 1)
    rng = np.random.default_rng(3)
    w = rng.normal(size=(40, 1))
    y = 2.0 * w + rng.normal(size=(40, 1))
    good = _moments(layout, w, y, np.ones(40))
    one_arm = _moments(layout, np.ones((40, 1)), y, np.ones(40))      # no spread in W
    other = _moments(layout, w, -w, np.ones(40))                        # slope -1 exactly
    mbar = np.stack([good, one_arm, one_arm])
    asked = []

    def all_trees(mask):
        asked.append(mask.copy())
        # row 1 is rescued by its all-tree moments, row 2 stays singular
        return np.stack([other, one_arm])

    from forest.analysis.inference import oob_effects
    tau = oob_effects(mbar, layout, all_trees)
    np.testing.assert_array_equal(asked[0], [False, True, True])
    np.testing.assert_allclose(tau[0], solve_theta(good[None], layout)[0][0], rtol=1e-12)
    np.testing.assert_allclose(tau[1, 0, 0], -1.0, rtol=1e-9)
    assert tau[2, 0, 0] == 0.0
    np.testing.assert_array_equal(mbar[1], other)          # the fallback moments were kept
    assert np.isfinite(tau).all()


def test_oob_effects_leaves_regular_rows_alone():
    layout = CausalChannels(2, 1)
    rng = np.random.default_rng(4)
    mbar = np.stack([_moments(layout, rng.normal(size=(30, 2)), rng.normal(size=(30, 1)), np.ones(30))
                     for _ in range(5)])

    def never(mask):
        raise AssertionError("no row is singular")

    from forest.analysis.inference import oob_effects
    np.testing.assert_array_equal(oob_effects(mbar.copy(), layout, never), solve_theta(mbar, layout)[0])

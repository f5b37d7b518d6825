"""The histogram causal criterion against row-by-row GRF pseudo-outcomes."""
import numpy as np
import pytest

from forest.criteria.causal import CausalChannels, CausalCriterion, pseudo_outcomes_reference, split_gain_reference


def _node_histograms(binned, channels, node_of_row, n_nodes, n_bins):
    """(n_nodes, n_features, n_bins, C) per-bin sums by np.add.at (independent of the kernels)."""
    n_features = binned.shape[1]
    hist = np.zeros((n_nodes, n_features, n_bins, channels.shape[1]))
    for f in range(n_features):
        np.add.at(hist[:, f], (node_of_row, binned[:, f]), channels)
    return hist


def _make(rng, n, K, M, kind):
    if kind == "arms":
        arm = rng.integers(0, K + 1, size=n)
        W = np.zeros((n, K))
        W[arm > 0, arm[arm > 0] - 1] = 1.0
        e = rng.uniform(0.2, 0.4, size=(n, K))
        wc = W - e
        ind = W
    else:
        wc = rng.normal(size=(n, K)) + 0.3
        ind = (wc > 0).astype(float)
    y = rng.normal(size=(n, M)) + wc.sum(axis=1, keepdims=True) * rng.uniform(0.5, 2.0, size=(n, 1)) + 5.0
    g = rng.uniform(0.5, 2.0, size=n)
    return wc, y, g, ind


CASES = [(1, 1, "arms"), (1, 1, "sign"), (2, 1, "arms"), (3, 1, "arms"), (2, 2, "sign"), (1, 2, "sign")]


@pytest.mark.parametrize("K,M,kind", CASES)
def test_gain_matches_rowwise_pseudo_outcomes(K, M, kind):
    rng = np.random.default_rng(K * 100 + M * 10 + len(kind))
    n, n_features, n_bins, n_nodes = 240, 3, 9, 3
    wc, y, g, ind = _make(rng, n, K, M, kind)
    binned = rng.integers(0, n_bins, size=(n, n_features))
    node = rng.integers(0, n_nodes, size=n)
    crit = CausalCriterion(K, M, min_samples_leaf=1, alpha=0.0, constraint=kind)
    ch = crit.make_channels(wc, y, g, ind)
    hist = _node_histograms(binned, ch, node, n_nodes, n_bins)
    left = np.cumsum(hist, axis=2)
    parent = hist.sum(axis=2, keepdims=True)[:, :1]          # (n_nodes, 1, 1, C)
    right = parent - left
    gain = crit.gain(left, right, parent)
    assert gain.shape == (n_nodes, n_features, n_bins)
    checked = 0
    for p in range(n_nodes):
        rows = node == p
        for f in range(n_features):
            for b in range(n_bins):
                goes_left = binned[rows, f] <= b
                nl, nr = goes_left.sum(), (~goes_left).sum()
                if nl == 0 or nr == 0:
                    assert gain[p, f, b] == -np.inf
                    continue
                # every arm (control included) / each sign present on both sides
                if kind == "arms":
                    arms = np.column_stack([1 - ind[rows].sum(1), ind[rows]])
                else:
                    arms = np.column_stack([ind[rows], 1 - ind[rows]])
                feasible = all(arms[side].sum(axis=0).min() >= 1 for side in (goes_left, ~goes_left))
                if not feasible:
                    assert gain[p, f, b] == -np.inf
                    continue
                ref = split_gain_reference(wc[rows], y[rows], g[rows], goes_left)
                assert gain[p, f, b] == pytest.approx(ref, rel=1e-10, abs=1e-10 * (1 + abs(ref)))
                checked += 1
    assert checked > n_nodes * n_features * n_bins // 2


def test_general_path_equals_scalar_fast_path():
    rng = np.random.default_rng(3)
    wc, y, g, ind = _make(rng, 200, 1, 1, "arms")
    crit = CausalCriterion(1, 1, min_samples_leaf=1, alpha=0.0)
    ch = crit.make_channels(wc, y, g, ind)
    parent = ch.sum(axis=0)
    left = np.cumsum(ch[:150], axis=0)
    wbar, ybar, tau, a_inv, _, _ = crit._parent_terms(parent)
    fast = crit._score_scalar(left, wbar, ybar, tau, a_inv)
    general = crit._child_sum_rho(left, wbar, ybar, tau, a_inv)[..., 0, 0]
    np.testing.assert_allclose(fast, general, rtol=1e-11, atol=1e-9)


@pytest.mark.parametrize("K,M", [(1, 1), (2, 1), (2, 3)])
def test_pseudo_outcomes_sum_to_zero_and_parent_gain_zero(K, M):
    """sum g rho = 0 at the parent: the gain of the trivial split equals the child score."""
    rng = np.random.default_rng(7)
    wc, y, g, ind = _make(rng, 100, K, M, "sign")
    rho = pseudo_outcomes_reference(wc, y, g)
    np.testing.assert_allclose((g[:, None, None] * rho).sum(axis=0), 0.0, atol=1e-9)
    crit = CausalCriterion(K, M, min_samples_leaf=1, alpha=0.0, constraint="sign")
    ch = crit.make_channels(wc, y, g, ind)
    wbar, ybar, tau, a_inv, _, _ = crit._parent_terms(ch.sum(axis=0))
    np.testing.assert_allclose(crit._child_sum_rho(ch.sum(axis=0), wbar, ybar, tau, a_inv), 0.0, atol=1e-8)


def test_constraints_alpha_counts_and_penalty():
    rng = np.random.default_rng(11)
    n = 400
    wc, y, g, ind = _make(rng, n, 1, 1, "arms")
    order = np.argsort(rng.uniform(size=n))
    wc, y, g, ind = wc[order], y[order], g[order], ind[order]
    m, alpha, pen = 7, 0.2, 3.0
    crit = CausalCriterion(1, 1, min_samples_leaf=m, alpha=alpha, imbalance_penalty=pen)
    plain = CausalCriterion(1, 1, min_samples_leaf=1, alpha=0.0)
    ch = crit.make_channels(wc, y, g, ind)
    parent = ch.sum(axis=0)
    left = np.cumsum(ch, axis=0)[:-1]
    right = parent - left
    got = crit.gain(left, right, parent)
    base = plain.gain(left, right, parent)

    def spread(rows):
        w = wc[rows, 0]
        return (g[rows] * (w - np.average(w, weights=g[rows])) ** 2).sum()

    sp = spread(np.arange(n))
    n_finite = 0
    for i in range(n - 1):
        L, R = np.arange(i + 1), np.arange(i + 1, n)
        ok = all(ind[s, 0].sum() >= m and (1 - ind[s, 0]).sum() >= m and spread(s) >= alpha * sp for s in (L, R))
        if not ok:
            assert got[i] == -np.inf, i
            continue
        n_finite += 1
        expect = base[i] - pen * (1 / spread(L) + 1 / spread(R))
        assert got[i] == pytest.approx(expect, rel=1e-9)
    assert n_finite > 100


def test_continuous_sign_constraint():
    crit = CausalCriterion(1, 1, min_samples_leaf=3, alpha=0.0, constraint="sign")
    L = crit.layout
    stats = np.zeros((3, L.n_channels))
    stats[:, 0] = 10.0
    stats[:, L.s_ww] = 5.0
    stats[:, L.i_count] = 10
    stats[:, L.s_arm] = [[3], [2], [8]]     # positives: ok, too few, too few negatives (2)
    parent = stats.sum(axis=0)
    assert np.isfinite(crit.gain(stats[0], stats[0], parent))
    assert crit.gain(stats[1], stats[0], parent) == -np.inf
    assert crit.gain(stats[0], stats[2], parent) == -np.inf


def test_singular_parent_cannot_split():
    crit = CausalCriterion(1, 1, min_samples_leaf=1, alpha=0.0, constraint="sign")
    w = np.ones((20, 1))                       # constant treatment: tau_P undefined
    ch = crit.make_channels(w, np.arange(20.0)[:, None], np.ones(20), np.ones((20, 1)) * 0)
    parent = ch.sum(0)
    left = np.cumsum(ch, 0)[:-1]
    assert np.all(crit.gain(left, parent - left, parent) == -np.inf)


def test_node_value_and_layout():
    L = CausalChannels(2, 3)
    assert L.n_moments == 1 + 2 + 3 + 6 + 3
    assert L.n_channels == L.n_moments + 1 + 2
    crit = CausalCriterion(2, 3)
    rng = np.random.default_rng(0)
    wc, y, g, ind = _make(rng, 50, 2, 3, "arms")
    ch = crit.make_channels(wc, y, g, ind)
    v = crit.node_value(ch.sum(axis=0))
    assert v.shape == (crit.n_outputs,)
    np.testing.assert_allclose(v[:L.n_moments], ch[:, :L.n_moments].mean(axis=0))
    assert v[-1] == 50
    g_, w_, y_, wy_, ww_ = L.moments(ch.sum(axis=0))
    np.testing.assert_allclose(ww_, (g[:, None] * wc).T @ wc)
    np.testing.assert_allclose(wy_, (g[:, None] * wc).T @ y)
    assert np.all(crit.node_value(np.zeros(L.n_channels)) == 0)
    with pytest.raises(ValueError, match="channels"):
        crit.node_value(np.zeros(3))
    with pytest.raises(ValueError, match="constraint"):
        CausalCriterion(constraint="bogus")

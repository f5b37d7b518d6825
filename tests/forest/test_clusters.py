"""Cluster layouts, cluster-robust sums and sampling by cluster, on one rank and under mpirun."""
import numpy as np
import pytest

from forest.engine.clusters import ClusterLayout, cluster_layout, cluster_moments, observation_weights, resolve_clusters
from forest.engine.subsample import BOTH, ESTIMATION, OUT, STRUCTURE, UNUSED, tree_row_codes, tree_row_codes_reference
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _labels(n, n_clusters, seed, scattered=True):
    rng = np.random.default_rng(seed)
    lab = rng.integers(0, n_clusters, size=n) if scattered else np.sort(rng.integers(0, n_clusters, size=n))
    return lab * 13 - 40                      # arbitrary integer labels, negative ones included


def test_layout_codes_sizes_and_within_positions():
    lab = _labels(500, 17, 0)
    lay = cluster_layout(SELF, lab, 500, equalize=True)
    uniq = np.unique(lab)
    assert lay.n_clusters == 17
    np.testing.assert_array_equal(uniq[lay.codes], lab)
    np.testing.assert_array_equal(lay.sizes, [np.sum(lab == u) for u in uniq])
    assert lay.samples_per_cluster == lay.sizes.min() and lay.equalize
    for c in range(17):
        rows = np.flatnonzero(lay.codes == c)
        np.testing.assert_array_equal(lay.within[rows], np.arange(len(rows)))   # global row order
    assert cluster_layout(SELF, lab, 500).samples_per_cluster == lay.sizes.max()
    assert (lay.shared == -1).all()


def test_labels_are_checked():
    with pytest.raises(ValueError, match="integer"):
        cluster_layout(SELF, np.array([0.5, 1.0, 2.0]), 3)
    with pytest.raises(ValueError, match="integer"):
        cluster_layout(SELF, np.array(["a", "b", "c"]), 3)
    with pytest.raises(ValueError, match="shape"):
        cluster_layout(SELF, np.arange(4), 3)
    with pytest.raises(ValueError, match="two distinct"):
        cluster_layout(SELF, np.zeros(5, int), 5)
    lay = cluster_layout(SELF, np.array([1.0, 2.0, 2.0]), 3)
    np.testing.assert_array_equal(lay.codes, [0, 1, 1])
    with pytest.raises(ValueError, match="sample_weight"):
        resolve_clusters(np.arange(4) % 2, SELF, 4, True, np.ones(4))
    with pytest.raises(ValueError, match="fitted with clusters"):
        resolve_clusters(None, SELF, 4, False, None, fitted=True)
    with pytest.raises(ValueError, match="without clusters"):
        resolve_clusters(np.arange(4) % 2, SELF, 4, False, None, fitted=False)


def test_observation_weights_follow_grf():
    lay = cluster_layout(SELF, np.array([0, 0, 0, 1]), 4, equalize=True)
    np.testing.assert_allclose(observation_weights(None, lay, 4), [1 / 3, 1 / 3, 1 / 3, 1.0])
    lay = cluster_layout(SELF, np.array([0, 0, 0, 1]), 4, equalize=False)
    np.testing.assert_allclose(observation_weights(np.arange(4.0), lay, 4), np.arange(4.0))
    np.testing.assert_allclose(observation_weights(None, None, 3), np.ones(3))


def _moments_reference(values, codes, transform, include):
    first, second, count = 0.0, 0.0, 0
    groups = np.arange(len(values)) if codes is None else codes
    for g in np.unique(groups[include]):
        t = transform(values[groups == g].sum(axis=0)[None])[0]
        first = first + t
        second = second + np.outer(t, t)
        count += 1
    return first, second, count


@pytest.mark.parametrize("with_clusters", [False, True])
def test_cluster_moments_match_brute_force(with_clusters):
    rng = np.random.default_rng(1)
    n = 300
    values = rng.normal(size=(n, 3))
    include = rng.uniform(size=n) < 0.8
    values[~include] = 0.0
    lay = cluster_layout(SELF, _labels(n, 25, 2), n) if with_clusters else None

    def transform(V):
        return np.column_stack([V[:, 0] * V[:, 1], V[:, 2] ** 2])

    got = cluster_moments(SELF, values, lay, transform, include)
    ref = _moments_reference(values, None if lay is None else lay.codes, transform, include)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-12)
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-12)
    assert got[2] == ref[2]


@pytest.mark.parametrize("group,frac,honest", [(1, 0.5, True), (2, 0.4, True), (2, 0.25, False)])
def test_cluster_sampling_matches_reference_and_grf_semantics(group, frac, honest):
    n = 1500
    lay = cluster_layout(SELF, _labels(n, 40, 3), n, equalize=True)
    trees = np.arange(12)
    codes = tree_row_codes(7, trees, np.arange(n), sample_fraction=frac, ci_group_size=group, honest=honest,
                           clusters=lay)
    ref = tree_row_codes_reference(7, trees, np.arange(n), sample_fraction=frac, ci_group_size=group, honest=honest,
                                   clusters=lay)
    np.testing.assert_array_equal(codes, ref)
    spc = lay.samples_per_cluster
    drawn_share = []
    for b in range(len(trees)):
        c = codes[b]
        drawn = np.bincount(lay.codes[c != OUT], minlength=lay.n_clusters) > 0
        used = np.bincount(lay.codes[(c != OUT) & (c != UNUSED)], minlength=lay.n_clusters)
        # a drawn cluster gives exactly min(size, samples_per_cluster) rows; an undrawn one none
        np.testing.assert_array_equal(used[drawn], np.minimum(lay.sizes[drawn], spc))
        assert (used[~drawn] == 0).all()
        # out of bag exactly when the cluster was not drawn
        assert ((c == OUT) == ~drawn[lay.codes]).all()
        if honest:                            # honesty keeps a cluster on one side
            for k in np.flatnonzero(drawn):
                roles = set(c[(lay.codes == k) & (c != UNUSED)].tolist())
                assert roles in ({STRUCTURE}, {ESTIMATION})
        else:
            assert set(c[c != OUT].tolist()) <= {BOTH, UNUSED}
        drawn_share.append(drawn.mean())
    assert abs(np.mean(drawn_share) - frac) < 0.12


def test_rows_kept_in_a_cluster_vary_between_trees():
    n = 400
    lay = cluster_layout(SELF, np.repeat([0, 1], [40, 360]), n, equalize=True)        # spc = 40
    codes = tree_row_codes(1, np.arange(60), np.arange(n), sample_fraction=0.5, clusters=lay)
    big = lay.codes == 1
    used = (codes[:, big] != OUT) & (codes[:, big] != UNUSED)
    drawn = (codes[:, big] != OUT).any(axis=1)
    assert drawn.sum() > 10
    share = used[drawn].mean(axis=0)                     # each row's share of the trees that drew its cluster
    assert abs(share.mean() - 40 / 360) < 1e-12
    assert share.max() < 0.5 and (share > 0).mean() > 0.9


@pytest.mark.mpi
def test_layout_and_moments_do_not_depend_on_rank_count(comm, rank_slice):
    n = 600
    lab = _labels(n, 30, 4)
    rng = np.random.default_rng(5)
    values = rng.normal(size=(n, 2))
    sl = rank_slice(n)
    dist = cluster_layout(comm, lab[sl], len(lab[sl]), equalize=True)
    ref = cluster_layout(SELF, lab, n, equalize=True)
    m_dist = cluster_moments(comm, values[sl], dist, lambda V: V ** 2)
    m_ref = cluster_moments(SELF, values, ref, lambda V: V ** 2)
    r_dist = cluster_moments(comm, values[sl], None, lambda V: V ** 2)
    r_ref = cluster_moments(SELF, values, None, lambda V: V ** 2)
    codes_dist = tree_row_codes(3, np.arange(8), np.arange(n)[sl], sample_fraction=0.4, ci_group_size=2,
                                clusters=dist)
    codes_ref = tree_row_codes(3, np.arange(8), np.arange(n), sample_fraction=0.4, ci_group_size=2, clusters=ref)
    assert isinstance(dist, ClusterLayout)
    np.testing.assert_array_equal(dist.codes, ref.codes[sl])
    np.testing.assert_array_equal(dist.within, ref.within[sl])
    np.testing.assert_array_equal(dist.sizes, ref.sizes)
    assert dist.samples_per_cluster == ref.samples_per_cluster
    assert comm.size == 1 or dist.n_shared > 0
    for a, b in ((m_dist, m_ref), (r_dist, r_ref)):
        np.testing.assert_allclose(a[0], b[0], rtol=1e-10)
        np.testing.assert_allclose(a[1], b[1], rtol=1e-10)
        assert a[2] == b[2]
    np.testing.assert_array_equal(codes_dist, codes_ref[:, sl])


def test_a_single_cluster_is_said_in_words():
    """grf parity (issue 38): a subset holding one cluster is refused with what is wrong, not 'Singular matrix'."""
    from forest import simulate
    from forest.estimators.causal_forest import CausalForest

    d = simulate.linear_confounded(400, d=3, seed=5)
    labels = np.arange(400) // 40
    cf = CausalForest(n_estimators=8, nuisance_estimators=4, max_bins=16, random_state=0).fit(
        d.X, d.t, d.y, clusters=labels, comm=SelfCommunicator())
    with pytest.raises(ValueError, match="lie in 1 cluster: cluster-robust standard errors need at least two"):
        cf.best_linear_projection(d.X[:, :1], subset=labels == 3, comm=SelfCommunicator())
    with pytest.raises(ValueError, match="at least two clusters"):
        cf.average_treatment_effect(subset=labels == 3, comm=SelfCommunicator())
    with pytest.raises(ValueError, match="at least two distinct labels"):     # held-out rows of one cluster
        cf.test_calibration(X=d.X[labels == 3] + 10.0, t=d.t[labels == 3], y=d.y[labels == 3],
                            clusters=labels[labels == 3], comm=SelfCommunicator())

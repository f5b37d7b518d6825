"""Split finding: vectorised search vs the loop reference, ties, missing values, mtry."""
import numpy as np
import pytest

from forest.criteria.basic import NewtonCriterion, VarianceCriterion
from forest.engine.splitting import find_best_splits, find_best_splits_reference


def _random_hist(rng, n_nodes, n_features, n_value_bins, crit):
    """Histograms of random rows: (n_nodes, F, n_value_bins + 1, C) and parent sums."""
    n_bins = n_value_bins + 1
    hist = np.zeros((n_nodes, n_features, n_bins, crit.n_channels))
    parent = np.zeros((n_nodes, crit.n_channels))
    for n in range(n_nodes):
        m = int(rng.integers(20, 80))
        codes = rng.integers(0, n_bins, size=(n_features, m))
        if isinstance(crit, VarianceCriterion):
            y = rng.normal(size=(m, crit.n_targets))
            ch = crit.make_channels(y, sample_weight=rng.uniform(0.5, 2.0, size=m))
        else:
            g = rng.normal(size=(m, crit.n_outputs))
            h = rng.uniform(0.1, 1.0, size=g.shape)
            ch = NewtonCriterion.make_channels(g, h)
        for f in range(n_features):
            for c in range(ch.shape[1]):
                hist[n, f, :, c] = np.bincount(codes[f], weights=ch[:, c], minlength=n_bins)
        parent[n] = ch.sum(axis=0)
    return hist, parent


@pytest.mark.parametrize("crit", [VarianceCriterion(min_samples_leaf=3),
                                  VarianceCriterion(n_targets=2, count_channel=True, min_samples_leaf=2),
                                  NewtonCriterion(l2_regularization=1.0, min_samples_leaf=4),
                                  NewtonCriterion(n_outputs=3, min_child_weight=0.5)])
def test_vectorised_matches_reference(rng, crit):
    hist, parent = _random_hist(rng, 6, 4, 7, crit)
    nb = np.array([7, 5, 1, 3])  # feature 2 has a single value bin: only "missing vs not"
    hist[:, 1, 5:7] = 0.0
    hist[:, 2, 1:7] = 0.0
    hist[:, 3, 3:7] = 0.0
    parent = hist[:, 0].sum(axis=1)
    mask = rng.random((6, 4)) < 0.8
    fast = find_best_splits(hist, parent, crit, nb, 7, feature_mask=mask)
    ref = find_best_splits_reference(hist, parent, crit, nb, 7, feature_mask=mask)
    np.testing.assert_array_equal(fast.feature, ref.feature)
    np.testing.assert_array_equal(fast.bin, ref.bin)
    np.testing.assert_array_equal(fast.missing_left, ref.missing_left)
    np.testing.assert_allclose(fast.gain, ref.gain, rtol=1e-10)
    np.testing.assert_allclose(fast.left_stats, ref.left_stats, atol=1e-10)
    np.testing.assert_allclose(fast.right_stats, ref.right_stats, atol=1e-10)
    assert fast.valid.any()
    assert np.all(mask[np.flatnonzero(fast.valid), fast.feature[fast.valid]])


class _NumpyNewton(NewtonCriterion):
    numba_search = None  # force the generic vectorised search


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k", [1, 3])
def test_newton_numba_search_matches_vectorised(rng, k, threads, monkeypatch):
    """The compiled search (nodes one per thread at 2 threads, at any size) against the vectorised one."""
    import numba

    from forest.criteria import basic

    if threads > numba.config.NUMBA_NUM_THREADS:
        pytest.skip("needs two Numba threads")
    monkeypatch.setattr(basic, "PARALLEL_SEARCH_BINS", 0)
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        _newton_numba_search_matches_vectorised(rng, k)
    finally:
        numba.set_num_threads(before)


def _newton_numba_search_matches_vectorised(rng, k):
    crit = NewtonCriterion(n_outputs=k, l2_regularization=0.3, min_samples_leaf=5, min_child_weight=0.2)
    plain = _NumpyNewton(n_outputs=k, l2_regularization=0.3, min_samples_leaf=5, min_child_weight=0.2)
    hist, parent = _random_hist(rng, 9, 5, 12, crit)
    nb = np.array([12, 12, 4, 1, 9])
    for f, n in enumerate(nb):
        hist[:, f, n:12] = 0.0
    hist[3, :, 12] = 0.0  # a node without missing values
    parent = hist[:, 0].sum(axis=1)
    mask = rng.random((9, 5)) < 0.7
    counts = rng.uniform(20, 80, size=9)
    a = find_best_splits(hist, parent, crit, nb, 12, feature_mask=mask, parent_count=counts, min_gain=0.01)
    b = find_best_splits(hist, parent, plain, nb, 12, feature_mask=mask, parent_count=counts, min_gain=0.01)
    np.testing.assert_array_equal(a.feature, b.feature)
    np.testing.assert_array_equal(a.bin, b.bin)
    np.testing.assert_array_equal(a.missing_left, b.missing_left)
    np.testing.assert_allclose(a.gain, b.gain, rtol=1e-12)
    np.testing.assert_allclose(a.left_stats, b.left_stats, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(a.right_stats, b.right_stats, rtol=1e-12, atol=1e-12)
    assert a.valid.sum() >= 5


def test_best_split_is_the_known_step():
    # y jumps between value bins 2 and 3 of feature 1; feature 0 is noise.
    rng = np.random.default_rng(0)
    m = 400
    codes = rng.integers(0, 6, size=(2, m))
    y = np.where(codes[1] <= 2, -1.0, 2.0) + 0.01 * rng.normal(size=m)
    crit = VarianceCriterion()
    ch = crit.make_channels(y)
    hist = np.zeros((1, 2, 7, 2))
    for f in range(2):
        for c in range(2):
            hist[0, f, :, c] = np.bincount(codes[f], weights=ch[:, c], minlength=7)
    res = find_best_splits(hist, ch.sum(0), crit, [6, 6], 6)
    assert (res.feature[0], res.bin[0]) == (1, 2)
    left = codes[1] <= 2
    np.testing.assert_allclose(res.left_stats[0], ch[left].sum(0))
    expected_gain = ch[left, 1].sum() ** 2 / left.sum() + ch[~left, 1].sum() ** 2 / (~left).sum() - y.sum() ** 2 / m
    np.testing.assert_allclose(res.gain[0], expected_gain, rtol=1e-12)


def test_ties_go_to_lowest_feature_then_bin():
    # Two identical features: the split must be on feature 0; within a feature two
    # equally good thresholds pick the lower bin.
    crit = VarianceCriterion()
    h = np.zeros((1, 2, 5, 2))
    # bins 0..3: y = [+1, 0(empty), 0(empty), -1]; thresholds b=0,1,2 give the same split
    for f in range(2):
        h[0, f, 0] = [10, 10]
        h[0, f, 3] = [10, -10]
    res = find_best_splits(h, h[0, 0].sum(0)[None], crit, [4, 4], 4)
    assert (res.feature[0], res.bin[0]) == (0, 0)
    # Perturb feature 1 by a relative 1e-15 (summation noise): still a tie.
    h2 = h.copy()
    h2[0, 1, 0, 1] *= 1 + 1e-15
    res2 = find_best_splits(h2, h[0, 0].sum(0)[None], crit, [4, 4], 4)
    assert res2.feature[0] == 0


def test_missing_values_go_to_the_better_side():
    crit = VarianceCriterion()
    h = np.zeros((1, 1, 4, 2))
    h[0, 0, 0] = [10, -10]   # bin 0: y=-1
    h[0, 0, 2] = [10, 10]    # bin 2: y=+1
    h[0, 0, 3] = [5, 5]      # missing: y=+1 -> belongs right
    res = find_best_splits(h, h[0, 0].sum(0)[None], crit, [3], 3)
    assert (res.feature[0], res.bin[0], bool(res.missing_left[0])) == (0, 0, False)
    h[0, 0, 3] = [5, -5]     # missing: y=-1 -> belongs left
    res = find_best_splits(h, h[0, 0].sum(0)[None], crit, [3], 3)
    assert (res.feature[0], res.bin[0], bool(res.missing_left[0])) == (0, 0, True)


def test_missing_only_split_and_no_missing_default():
    crit = VarianceCriterion()
    h = np.zeros((1, 1, 3, 2))
    h[0, 0, 0] = [10, 10]
    h[0, 0, 2] = [10, -10]   # single value bin + missing: only "missing vs not"
    res = find_best_splits(h, h[0, 0].sum(0)[None], crit, [1], 2)
    assert (res.feature[0], res.bin[0], bool(res.missing_left[0])) == (0, 0, False)
    # No missing rows: NaNs at prediction go to the heavier child.
    h = np.zeros((1, 1, 4, 2))
    h[0, 0, 0] = [3, 3]
    h[0, 0, 1] = [9, -9]
    res = find_best_splits(h, h[0, 0].sum(0)[None], crit, [2], 3)
    assert res.feature[0] == 0 and bool(res.missing_left[0]) is False
    h[0, 0, 0], h[0, 0, 1] = [9, 9], [3, -3]
    res = find_best_splits(h, h[0, 0].sum(0)[None], crit, [2], 3)
    assert bool(res.missing_left[0]) is True


def test_constraints_and_min_gain():
    crit = VarianceCriterion(min_samples_leaf=11)
    h = np.zeros((1, 1, 3, 2))
    h[0, 0, 0] = [10, -10]
    h[0, 0, 1] = [10, 10]
    res = find_best_splits(h, h[0, 0].sum(0)[None], crit, [2], 2)
    assert not res.valid[0] and res.gain[0] == -np.inf
    res = find_best_splits(h, h[0, 0].sum(0)[None], VarianceCriterion(), [2], 2, min_gain=20.0)
    assert not res.valid[0]  # the gain is exactly 20: not > 20
    res = find_best_splits(h, h[0, 0].sum(0)[None], VarianceCriterion(), [2], 2, min_gain=19.9)
    assert res.valid[0] and res.gain[0] == pytest.approx(20.0)


def test_newton_count_estimate_from_parent_count():
    crit = NewtonCriterion(min_samples_leaf=30)
    h = np.zeros((1, 1, 3, 2))
    h[0, 0, 0] = [-5.0, 2.0]
    h[0, 0, 1] = [5.0, 2.0]
    parent = h[0, 0].sum(0)[None]
    # hessian mass 2 per side; 100 rows in the node -> ~50 per side >= 30
    assert find_best_splits(h, parent, crit, [2], 2, parent_count=np.array([100.0])).valid[0]
    assert not find_best_splits(h, parent, crit, [2], 2, parent_count=np.array([50.0])).valid[0]


def test_bad_inputs():
    crit = VarianceCriterion()
    with pytest.raises(ValueError, match="shape"):
        find_best_splits(np.zeros((2, 3, 4)), np.zeros((2, 2)), crit, [3, 3, 3], 3)
    with pytest.raises(ValueError, match="n_bins_non_missing"):
        find_best_splits(np.zeros((1, 2, 4, 2)), np.zeros((1, 2)), crit, [3], 3)
    with pytest.raises(ValueError, match="feature_mask"):
        find_best_splits(np.zeros((1, 2, 4, 2)), np.zeros((1, 2)), crit, [3, 3], 3, feature_mask=np.ones((2, 2), bool))

"""Per-node feature draws (forest.engine.mtry): compiled draw against the NumPy reference."""
import numpy as np
import pytest

from forest.engine.mtry import mtry_feature_mask, mtry_feature_mask_reference, mtry_keys, node_mask


@pytest.mark.parametrize("seed", [0, 1, 2, 2 ** 40])
def test_batch_and_node_draws_match_reference(seed):
    rng = np.random.default_rng(seed % 7)
    trees = rng.integers(0, 1000, 40)
    nodes = rng.integers(0, 100000, 40)
    k1, k2 = mtry_keys(seed)
    for n_features, mtry in ((7, 3), (20, 5), (20, 1), (5, None), (5, 9)):
        ref = mtry_feature_mask_reference(seed, trees, nodes, n_features, mtry)
        np.testing.assert_array_equal(mtry_feature_mask(seed, trees, nodes, n_features, mtry), ref)
        out = np.empty(n_features, dtype=bool)
        for i in range(len(trees)):
            node_mask(k1, k2, trees[i], nodes[i], n_features, 0 if mtry is None else mtry, out)
            np.testing.assert_array_equal(out, ref[i])


def test_mask_is_a_pure_function():
    trees = np.array([0, 0, 1, 5, 5])
    nodes = np.array([0, 1, 0, 3, 3])
    m1 = mtry_feature_mask(7, trees, nodes, 10, 3)
    m2 = mtry_feature_mask(7, trees[::-1], nodes[::-1], 10, 3)[::-1]
    np.testing.assert_array_equal(m1, m2)
    assert (m1.sum(axis=1) == 3).all()
    np.testing.assert_array_equal(m1[3], m1[4])
    assert not np.array_equal(m1, mtry_feature_mask(8, trees, nodes, 10, 3))
    assert mtry_feature_mask(7, trees, nodes, 10, None).all()
    assert mtry_feature_mask(7, [], [], 10, 3).shape == (0, 10)
    # Roughly uniform over features across many nodes.
    freq = mtry_feature_mask(1, np.zeros(5000, int), np.arange(5000), 10, 3).mean(axis=0)
    np.testing.assert_allclose(freq, 0.3, atol=0.03)
    with pytest.raises(ValueError, match="mtry"):
        mtry_feature_mask(7, trees, nodes, 10, 0)


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 8, 33, 1000])
def test_stable_order_matches_numpy_stable_argsort(n):
    from forest.engine.mtry import _stable_order

    rng = np.random.default_rng(n)
    wide = rng.integers(0, 2 ** 63, n, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    ties = rng.integers(0, 4, n).astype(np.uint64)  # many equal keys: index order must hold
    for keys in (wide, ties, np.sort(wide), np.sort(wide)[::-1].copy()):
        np.testing.assert_array_equal(_stable_order(keys), np.argsort(keys, kind="stable"))

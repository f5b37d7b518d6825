"""Importances: gain, split counts, GRF depth-weighted split frequency."""
import numpy as np
import pytest

from forest.engine.importance import depth_weighted_importance, gain_importance, split_counts, split_frequencies
from forest.engine.tree import Tree, pack_trees


def _chain_tree(features, gains):
    """A tree splitting on ``features[d]`` at depth d along the left spine."""
    t = Tree(1)
    node = t.add_node(0, 1.0, [0.0])
    for d, (f, g) in enumerate(zip(features, gains)):
        left = t.add_node(d + 1, 1.0, [0.0])
        right = t.add_node(d + 1, 1.0, [0.0])
        t.set_split(node, f, 0, 0.0, False, g, left, right)
        node = left
    return t


def test_gain_and_counts():
    trees = [_chain_tree([0, 2, 0], [4.0, 1.0, 3.0]), _chain_tree([1], [2.0])]
    np.testing.assert_allclose(gain_importance(trees, 4, normalize=False), [7.0, 2.0, 1.0, 0.0])
    np.testing.assert_allclose(gain_importance(trees, 4), [0.7, 0.2, 0.1, 0.0])
    np.testing.assert_array_equal(split_counts(trees, 4), [2, 1, 1, 0])
    np.testing.assert_allclose(gain_importance(pack_trees(trees), 4), [0.7, 0.2, 0.1, 0.0])
    assert gain_importance([_chain_tree([], [])], 3).sum() == 0.0
    with pytest.raises(ValueError, match="n_features"):
        split_counts(trees, 2)


def test_depth_weighted_matches_grf_formula():
    trees = [_chain_tree([0, 1, 1, 2, 0], [1] * 5), _chain_tree([1, 1], [1, 1]), _chain_tree([2], [1])]
    freq = split_frequencies(trees, 3, max_depth=4)
    np.testing.assert_array_equal(freq, [[1, 1, 1], [0, 2, 0], [0, 1, 0], [0, 0, 1]])  # depth-5 split ignored
    # GRF: share per depth, weights k^-2, divided by the sum of weights
    w = np.array([1, 1 / 4, 1 / 9, 1 / 16])
    share = np.array([[1 / 3, 1 / 3, 1 / 3], [0, 1, 0], [0, 1, 0], [0, 0, 1]])
    expected = share.T @ w / w.sum()
    np.testing.assert_allclose(depth_weighted_importance(trees, 3), expected)
    assert depth_weighted_importance(trees, 3).sum() == pytest.approx(1.0)
    # a depth with no splits contributes zero (GRF divides by max(1, row sum))
    only_root = [_chain_tree([2], [1.0])]
    np.testing.assert_allclose(depth_weighted_importance(only_root, 3), [0, 0, 1 / w.sum()])

"""LeafwiseGrower's boosting fast paths grow exactly the trees of its generic path.

The fast paths (packed root codes, direct Newton split-kernel call, scalar node
values for one output) repeat the generic code's arithmetic; switching them off on
the same grower must give bit-identical trees.
"""
import numpy as np
import pytest

from forest.criteria import NewtonCriterion
from forest.grower import LeafwiseGrower
from histogram.binning import BinMapper


def _grow(binned, bm, crit, channels, fast, rows=None):
    g = LeafwiseGrower(binned, bm, crit, max_leaf_nodes=15)
    if not fast:
        g._packed, g._direct_search, g._scalar = None, False, False
    return g.grow(channels, rows=rows, shrinkage=0.3)


@pytest.mark.parametrize("n", [2000, 2003])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("subset", [False, True])
def test_fast_paths_grow_identical_trees(rng, n, k, subset):
    X = rng.normal(size=(n, 6))
    X[rng.random(n) < 0.05, 2] = np.nan  # missing values exercise the missing bin
    X[:, 4] = rng.integers(0, 3, n)      # a three-bin feature
    bm = BinMapper(max_bins=63).fit(X)
    binned = bm.transform(X)
    g = np.sin(3 * X[:, :1]) + 0.1 * rng.normal(size=(n, k))
    h = 0.2 + rng.random((n, k))
    crit = NewtonCriterion(k, l2_regularization=0.5, min_samples_leaf=5)
    channels = np.hstack([g, h])
    rows = np.sort(rng.permutation(n)[: n // 2]).astype(np.int32) if subset else None
    fast = _grow(binned, bm, crit, channels, True, rows)
    slow = _grow(binned, bm, crit, channels, False, rows)
    assert fast.tree.node_count > 5
    for name in ("feature", "bin_threshold", "missing_left", "left", "right", "gain", "count"):
        np.testing.assert_array_equal(getattr(fast.tree, name), getattr(slow.tree, name), err_msg=name)
    np.testing.assert_array_equal(fast.tree.value, slow.tree.value)
    np.testing.assert_array_equal(fast.rows, slow.rows)
    np.testing.assert_array_equal(fast.leaf_starts, slow.leaf_starts)
    # Leaf values are -G / (H + lambda) * shrinkage of the rows each leaf holds.
    for node, a, b in zip(fast.leaf_nodes, fast.leaf_starts, fast.leaf_stops):
        r = fast.rows[a:b]
        expect = -g[r].sum(axis=0) / (h[r].sum(axis=0) + 0.5) * 0.3
        np.testing.assert_allclose(fast.tree.value[node], expect, rtol=1e-9, atol=1e-12)

"""LeafwiseGrower's boosting fast paths grow exactly the trees of its generic path.

The fast paths (packed root codes, direct Newton split-kernel call, scalar node
values for one output) repeat the generic code's arithmetic; switching them off on
the same grower must give bit-identical trees.
"""
import numpy as np
import pytest

from forest.criteria.basic import Criterion, NewtonCriterion
from forest.engine.expansion import LeafwiseGrower
from forest.engine.growth_options import EngineOptions
from histogram.binning import BinMapper


class _GenericNewton(NewtonCriterion):
    """Newton boosting through the generic node methods (no scalar node_summary)."""

    node_summary = Criterion.node_summary


def _grow(binned, bm, crit, channels, fast, rows=None, engine=None):
    if not fast:
        crit = _GenericNewton(crit.n_outputs, crit.l2_regularization, crit.min_samples_leaf, crit.min_child_weight)
    g = LeafwiseGrower(binned, bm, crit, max_leaf_nodes=15, engine=engine)
    if not fast:
        # unpacked root codes; the split search through find_best_splits
        g.builder._packed, g._fused = None, None
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


@pytest.mark.parametrize("subset", [False, True])
def test_threaded_row_split_and_block_partition_grow_the_same_tree(rng, subset):
    """Two threads with every node built by row-split partial histograms and partitioned
    by per-thread blocks (thresholds forced down) grow the one-thread tree: same
    structure and rows, values equal up to summation order."""
    import numba

    n = 3001
    X = rng.normal(size=(n, 6))
    X[rng.random(n) < 0.05, 1] = np.nan
    bm = BinMapper(max_bins=63).fit(X)
    binned = bm.transform(X)
    channels = np.hstack([np.sin(3 * X[:, :1]) + 0.1 * rng.normal(size=(n, 1)), 0.2 + rng.random((n, 1))])
    crit = NewtonCriterion(1, l2_regularization=0.5, min_samples_leaf=5)
    rows = np.sort(rng.permutation(n)[: 2 * n // 3]).astype(np.int32) if subset else None
    one = _grow(binned, bm, crit, channels, True, rows)
    old = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        two = _grow(binned, bm, crit, channels, True, rows,
                    engine=EngineOptions(gh_parallel_rows=16, partition_blocks_min_rows=16))
    finally:
        numba.set_num_threads(old)
    assert one.tree.node_count > 5
    for name in ("feature", "bin_threshold", "missing_left", "left", "right"):
        np.testing.assert_array_equal(getattr(two.tree, name), getattr(one.tree, name), err_msg=name)
    # counts of the last split's leaves are estimated from hessian shares (floats)
    np.testing.assert_allclose(two.tree.count, one.tree.count, rtol=1e-12)
    np.testing.assert_allclose(two.tree.value, one.tree.value, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(two.tree.gain, one.tree.gain, rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(two.rows, one.rows)
    np.testing.assert_array_equal(two.leaf_starts, one.leaf_starts)

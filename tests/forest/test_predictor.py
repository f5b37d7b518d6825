"""Numba predictor vs the plain-Python traversal, raw and binned, NaN routing."""
import numpy as np
import pytest

from forest.engine.predictor import (accumulate_oob_binned, predict_leaves, predict_leaves_binned, predict_reference,
                                     predict_values, predict_values_binned)
from forest.engine.tree import Tree, pack_trees
from random_trees import random_tree


def _bin(X, thresholds, missing_bin):
    out = np.empty(X.shape[::-1], dtype=np.uint8)
    for f in range(X.shape[1]):
        codes = np.searchsorted(thresholds[f], X[:, f], side="left")
        out[f] = np.where(np.isnan(X[:, f]), missing_bin, codes)
    return out


@pytest.mark.parametrize("n_outputs", [1, 3])
def test_numba_matches_reference(rng, n_outputs):
    n_features = 4
    thresholds = [np.sort(rng.normal(size=int(rng.integers(1, 9)))) for _ in range(n_features)]
    trees = [random_tree(rng, n_features, n_outputs, thresholds) for _ in range(7)]
    X = rng.normal(size=(300, n_features))
    X[rng.random(X.shape) < 0.1] = np.nan
    X[:5, 0] = thresholds[0][0]  # exactly on a threshold goes left
    ref_leaves, ref_values = predict_reference(trees, X)
    np.testing.assert_array_equal(predict_leaves(trees, X), ref_leaves)
    np.testing.assert_allclose(predict_values(trees, X), ref_values, rtol=1e-12)
    packed = pack_trees(trees)
    np.testing.assert_allclose(predict_values(packed, X), ref_values, rtol=1e-12)
    binned = _bin(X, thresholds, 9)
    np.testing.assert_array_equal(predict_leaves_binned(packed, binned, 9), ref_leaves)
    np.testing.assert_allclose(predict_values_binned(packed, binned, 9), ref_values, rtol=1e-12)
    rows = np.array([5, 0, 299, 17])
    np.testing.assert_array_equal(predict_leaves_binned(packed, binned, 9, rows=rows), ref_leaves[rows])
    base = np.ones((300, n_outputs))
    out = predict_values(packed, X, out=base)
    assert out is base
    np.testing.assert_allclose(out, ref_values + 1.0, rtol=1e-12)


@pytest.mark.parametrize("n_rows", [300, 9000])  # serial and parallel drivers
def test_accumulate_oob_binned_matches_masked_reference(rng, n_rows):
    n_features, n_outputs, missing_bin = 4, 2, 9
    thresholds = [np.sort(rng.normal(size=int(rng.integers(1, 9)))) for _ in range(n_features)]
    trees = [random_tree(rng, n_features, n_outputs, thresholds) for _ in range(6)]
    X = rng.normal(size=(n_rows, n_features))
    X[rng.random(X.shape) < 0.1] = np.nan
    ref_leaves, _ = predict_reference(trees, X)
    packed = pack_trees(trees)
    codes = rng.integers(0, 4, size=(len(trees), n_rows)).astype(np.int8)
    acc = np.full((n_rows, n_outputs), 0.5)
    cnt = np.ones(n_rows)
    accumulate_oob_binned(packed, _bin(X, thresholds, missing_bin), missing_bin, codes, acc, cnt)
    ref_acc = np.full((n_rows, n_outputs), 0.5)
    ref_cnt = np.ones(n_rows)
    for t in range(len(trees)):
        out = codes[t] == 0
        ref_acc[out] += packed["value"][packed["tree_offsets"][t] + ref_leaves[out, t]]
        ref_cnt[out] += 1
    np.testing.assert_array_equal(cnt, ref_cnt)
    np.testing.assert_allclose(acc, ref_acc, rtol=1e-12)
    with pytest.raises(ValueError, match="codes"):
        accumulate_oob_binned(packed, _bin(X, thresholds, missing_bin), missing_bin, codes[:2], acc, cnt)


@pytest.mark.parametrize("n_rows", [300, 70000])  # one chunk, serial; several chunks, parallel
def test_oob_binned_batch_walk_equals_blocked_walk_bit_for_bit(rng, monkeypatch, n_rows):
    """The batch route of accumulate_oob_binned (codes as floats against bin thresholds)
    gives the blocked per-tree walk's sums exactly, also for a chunk of a forest's trees."""
    import forest.engine.predictor as pr

    n_features, n_outputs, missing_bin = 5, 3, 9
    thresholds = [np.sort(rng.normal(size=int(rng.integers(1, 9)))) for _ in range(n_features)]
    trees = [random_tree(rng, n_features, n_outputs, thresholds) for _ in range(9)]
    X = rng.normal(size=(n_rows, n_features))
    X[rng.random(X.shape) < 0.1] = np.nan
    X[:5, 0] = thresholds[0][0]
    binned = _bin(X, thresholds, missing_bin)
    packed = pack_trees(trees)
    offsets = packed["tree_offsets"]
    codes = rng.integers(0, 3, size=(len(trees), n_rows)).astype(np.int8)
    start = rng.normal(size=(n_rows, n_outputs))
    if n_rows > 300:
        monkeypatch.setattr(pr, "_OOB_BATCH_CHUNK_CELLS", 30_000)  # chunks of 6,000 rows, bounded by cells
    for sub, sub_codes in ((packed, codes), (dict(packed, tree_offsets=offsets[3:8]), codes[3:7])):
        results = []
        for min_pairs in (np.iinfo(np.int64).max, 0):  # blocked walk, then batch walk
            monkeypatch.setattr(pr, "OOB_BATCH_MIN_PAIRS", min_pairs)
            acc, cnt = start.copy(), np.full(n_rows, 2.0)
            accumulate_oob_binned(sub, binned, missing_bin, sub_codes, acc, cnt)
            results.append((acc, cnt))
        np.testing.assert_array_equal(results[0][0], results[1][0])
        np.testing.assert_array_equal(results[0][1], results[1][1])
        assert (results[1][1] > 2.0).any()
        # the second run did take the batch route
        assert pr._oob_binned_batch(sub, binned, missing_bin, sub_codes, start.copy(), np.zeros(n_rows))


def test_nan_follows_missing_left():
    t = Tree(1)
    t.add_node(0, 1.0, [0.0])
    left = t.add_node(1, 1.0, [-1.0])
    right = t.add_node(1, 1.0, [1.0])
    t.set_split(0, 0, 0, 0.0, True, 1.0, left, right)
    X = np.array([[np.nan], [-1.0], [1.0], [0.0]])
    np.testing.assert_array_equal(predict_values(t, X)[:, 0], [-1, -1, 1, -1])
    t.set_split(0, 0, 0, 0.0, False, 1.0, left, right)
    np.testing.assert_array_equal(predict_values(t, X)[:, 0], [1, -1, 1, -1])


def test_bad_input():
    t = Tree(1)
    t.add_node(0, 1.0, [0.0])
    a = t.add_node(1, 1.0, [0.0])
    b = t.add_node(1, 1.0, [0.0])
    t.set_split(0, 2, 0, 0.0, True, 1.0, a, b)
    with pytest.raises(ValueError, match="features"):
        predict_values(t, np.zeros((3, 2)))
    with pytest.raises(ValueError, match="2-D"):
        predict_values(t, np.zeros(3))
    with pytest.raises(ValueError, match="uint8"):
        predict_values_binned(t, np.zeros((3, 4)), 255)

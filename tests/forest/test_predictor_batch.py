"""Batch prediction (blocked walk over node records) against the per-row walk and the
plain-Python reference: bitwise equal leaves, values, out-of-bag sums and BLB variances."""
import numba
import numpy as np
import pytest

from forest.analysis.inference import _blb_sums, _pairwise_sum, blb_predict, blb_variance
from forest.criteria.causal import CausalChannels
from forest.engine.predictor import (accumulate_oob, batch_forest, batch_layout, leaf_value_index, oob_average,
                                     predict_leaves,
                                     predict_reference, predict_values, tree_values)
from forest.engine.routing import (RECORD_MAX_THRESHOLDS, code_rows, encode_records, goes_left_code, goes_left_shifted)
from forest.engine.tree import Tree, pack_trees
from random_trees import random_tree


def _forest(rng, n_trees=9, n_features=6, n_outputs=3, depth=9):
    thresholds = [np.sort(rng.normal(size=int(rng.integers(1, 40)))) for _ in range(n_features - 1)]
    thresholds.append(np.array([]))                      # a feature no tree splits on
    trees = [random_tree(rng, n_features, n_outputs, thresholds, depth, p_stop=0.15) for _ in range(n_trees)]
    stump = Tree(n_outputs)
    stump.add_node(0, 1.0, rng.normal(size=n_outputs))
    trees.insert(3, stump)                                # a single-leaf tree
    return trees, thresholds


def _rows(rng, n, thresholds):
    X = rng.normal(size=(n, len(thresholds)))
    X[rng.random(X.shape) < 0.1] = np.nan
    for f, thr in enumerate(thresholds):                  # values exactly on thresholds go left
        if len(thr):
            on = rng.random(n) < 0.1
            X[on, f] = rng.choice(thr, size=on.sum())
    X[:3, 0] = [np.inf, -np.inf, -0.0]
    return X


@numba.njit
def _both_rules(out):
    for b in range(RECORD_MAX_THRESHOLDS):
        for ml in range(2):
            for c in range(256):
                out[b, ml, c, 0] = goes_left_code(np.int32(c), np.int32(b), np.uint8(ml), np.int32(255))
                out[b, ml, c, 1] = goes_left_shifted(np.uint64(c), np.uint64(b + ml), np.uint64(ml))


def test_shifted_rule_is_the_code_rule():
    out = np.zeros((RECORD_MAX_THRESHOLDS, 2, 256, 2), dtype=np.bool_)
    _both_rules(out)
    np.testing.assert_array_equal(out[..., 1], out[..., 0])
    assert out[..., 255, 0].tolist() == [[False, True]] * RECORD_MAX_THRESHOLDS


def test_codes_count_thresholds_below(rng):
    trees, thresholds = _forest(rng)
    packed = pack_trees(trees)
    layout = encode_records(packed, len(thresholds))
    X = _rows(rng, 700, thresholds)
    codes = np.zeros(len(thresholds) * 1000, dtype=np.uint8)
    code_rows(X, 0, len(X), layout["table"], layout["width"], layout["used"], codes, 1000)
    inner = packed["feature"] >= 0
    for f in layout["used"]:
        distinct = np.unique(packed["threshold"][inner & (packed["feature"] == f)])
        want = np.where(np.isnan(X[:, f]), 255, np.searchsorted(distinct, X[:, f], side="left"))
        np.testing.assert_array_equal(codes[f * 1000: f * 1000 + len(X)], want)
        # the claim the walk rests on: x <= T_f[b] exactly when code <= b
        for b, t in enumerate(distinct):
            ok = ~np.isnan(X[:, f])
            np.testing.assert_array_equal(X[ok, f] <= t, want[ok] <= b)


@pytest.mark.parametrize("n_rows", [300, 2500, 9000])   # partial block, several blocks, parallel driver
def test_batch_matches_reference(rng, threads, n_rows, batch_always):
    trees, thresholds = _forest(rng)
    packed = pack_trees(trees)
    assert batch_forest(packed, n_rows, len(thresholds)) is not None
    X = _rows(rng, n_rows, thresholds)
    ref_leaves, ref_values = predict_reference(trees, X)
    np.testing.assert_array_equal(predict_leaves(packed, X), ref_leaves)
    np.testing.assert_array_equal(predict_values(packed, X), ref_values)    # same sums, same order
    base = rng.normal(size=(n_rows, 3))
    np.testing.assert_array_equal(predict_values(packed, X, out=base.copy()),
                                  predict_values(packed, X, out=base.copy()))
    out = base.copy()
    for t in range(len(trees)):                     # baseline first, then trees in order
        out += packed["value"][packed["tree_offsets"][t] + ref_leaves[:, t]]
    np.testing.assert_array_equal(predict_values(packed, X, out=base.copy()), out)
    index, values = leaf_value_index(packed, X)
    np.testing.assert_array_equal(values[index], packed["value"][ref_leaves + packed["tree_offsets"][:-1]])
    np.testing.assert_array_equal(tree_values(packed, X), values[index])


@pytest.mark.parametrize("p_stop", [0.0, 0.05, 0.5])   # full trees (every level sure), a few, hardly any
def test_sure_passes_are_the_levels_above_the_shallowest_leaf(rng, threads, p_stop, batch_always):
    thresholds = [np.sort(rng.normal(size=30)) for _ in range(5)]
    trees = [random_tree(rng, 5, 2, thresholds, depth=int(rng.integers(1, 9)), p_stop=p_stop) for _ in range(15)]
    stump = Tree(2)
    stump.add_node(0, 1.0, rng.normal(size=2))
    trees.append(stump)
    packed = pack_trees(trees)
    layout = encode_records(packed, 5)
    want = []
    for tree in trees:                                   # plain reference: depth of the shallowest leaf
        leaf_depths = [tree.depth[i] for i in range(tree.node_count) if tree.feature[i] < 0]
        want.append(max(min(leaf_depths) - 1, 0))
    np.testing.assert_array_equal(layout["sure_passes"], want)
    if p_stop == 0.0:
        assert max(want) >= 5                            # the in-place passes are really taken
    X = _rows(rng, 3000, thresholds)
    ref_leaves, ref_values = predict_reference(trees, X)
    np.testing.assert_array_equal(predict_leaves(packed, X), ref_leaves)
    np.testing.assert_array_equal(predict_values(packed, X), ref_values)


def test_batch_equals_per_row_walk(rng, threads, per_row_walk):
    trees, thresholds = _forest(rng, n_trees=20, depth=12)
    packed = pack_trees(trees)
    X = _rows(rng, 5000, thresholds)
    np.testing.assert_array_equal(predict_values(packed, X), per_row_walk(predict_values, packed, X))
    np.testing.assert_array_equal(predict_leaves(packed, X), per_row_walk(predict_leaves, packed, X))


@pytest.mark.parametrize("n_rows", [7, 300, 2500, 9000])   # per-row walk below BATCH_MIN_ROWS, then batch
def test_kept_batch_layout_gives_the_reference_leaves(rng, threads, n_rows):
    # a layout kept over calls (QuantileForest keeps one) routes as the per-call one
    trees, thresholds = _forest(rng, n_trees=30, depth=12)
    packed = pack_trees(trees)
    batch = batch_layout(packed, len(thresholds))
    assert batch is not False
    X = _rows(rng, n_rows, thresholds)
    ref_leaves, _ = predict_reference(trees, X)
    np.testing.assert_array_equal(predict_leaves(packed, X, batch=batch), ref_leaves)
    np.testing.assert_array_equal(predict_leaves(packed, X, batch=batch), predict_leaves(packed, X))
    # a forest outside the record layout: False, and the per-row walk
    many = [np.sort(rng.normal(size=RECORD_MAX_THRESHOLDS + 40)), np.sort(rng.normal(size=5))]
    wide = [random_tree(rng, 2, 1, many, depth=12, p_stop=0.0) for _ in range(4)]
    assert batch_layout(pack_trees(wide), 2) is False
    Xw = _rows(rng, n_rows, many)
    np.testing.assert_array_equal(predict_leaves(pack_trees(wide), Xw, batch=False), predict_reference(wide, Xw)[0])


def test_forest_outside_the_record_layout_falls_back(rng, batch_always):
    many = [np.sort(rng.normal(size=RECORD_MAX_THRESHOLDS + 40)), np.sort(rng.normal(size=5))]
    trees = [random_tree(rng, 2, 1, many, depth=12, p_stop=0.0) for _ in range(4)]
    packed = pack_trees(trees)
    assert encode_records(packed, 2) is None
    X = _rows(rng, 500, many)
    ref_leaves, ref_values = predict_reference(trees, X)
    np.testing.assert_array_equal(predict_values(packed, X), ref_values)
    np.testing.assert_array_equal(predict_leaves(packed, X), ref_leaves)


@pytest.mark.parametrize("n_rows", [700, 9000])
def test_accumulate_oob_matches_masked_reference(rng, threads, n_rows, batch_always):
    trees, thresholds = _forest(rng)
    packed = pack_trees(trees)
    X = _rows(rng, n_rows, thresholds)
    ref_leaves, _ = predict_reference(trees, X)
    codes = rng.integers(0, 4, size=(len(trees), n_rows)).astype(np.int8)
    acc, cnt = np.full((n_rows, 3), 0.5), np.ones(n_rows)
    accumulate_oob(packed, X, codes, acc, cnt)
    ref_acc, ref_cnt = np.full((n_rows, 3), 0.5), np.ones(n_rows)
    for t in range(len(trees)):
        out = codes[t] == 0
        ref_acc[out] += packed["value"][packed["tree_offsets"][t] + ref_leaves[out, t]]
        ref_cnt[out] += 1
    np.testing.assert_array_equal(cnt, ref_cnt)
    np.testing.assert_array_equal(acc, ref_acc)
    with pytest.raises(ValueError, match="codes"):
        accumulate_oob(packed, X, codes[:2], acc, cnt)


def test_oob_average_equals_per_row_walk(rng, per_row_walk):
    trees, thresholds = _forest(rng, n_trees=12)
    packed = pack_trees(trees)
    X = _rows(rng, 3000, thresholds)
    gids = np.arange(1000, 4000, dtype=np.int64)
    sampling = dict(seed=3, sample_fraction=0.4, ci_group_size=2, honest=True, honesty_fraction=0.5)
    avg, cnt = oob_average(packed, X, gids, sampling, chunk_rows=700)
    ref_avg, ref_cnt = per_row_walk(oob_average, packed, X, gids, sampling)
    np.testing.assert_array_equal(cnt, ref_cnt)
    np.testing.assert_array_equal(avg, ref_avg)


def test_pairwise_sum_is_numpys():
    rng = np.random.default_rng(4)
    stack, partial = np.empty(3 * 64, dtype=np.int64), np.empty(64)
    for n in list(range(0, 140)) + [255, 256, 257, 1000, 1031, 4099, 20000]:
        a = rng.normal(size=(1, n, 1, 1)) * np.exp(3 * rng.normal(size=(1, n, 1, 1)))
        assert _pairwise_sum(a.ravel(), 0, n, stack, partial) == a.sum(axis=1)[0, 0, 0], n


def _moment_forest(rng, n_trees, n_features=5, layout=CausalChannels(1, 1), p_empty=0.05, depth=7):
    """Trees whose leaves hold causal moment vectors (g, w, y, wy, ww, ..., count)."""
    thresholds = [np.sort(rng.uniform(size=20)) for _ in range(n_features)]
    trees = []
    for _ in range(n_trees):
        t = random_tree(rng, n_features, layout.n_moments + 1, thresholds, depth)
        v = t.value.copy()
        n = len(v)
        g = rng.uniform(0.5, 2.0, size=n)
        w = rng.uniform(0.1, 0.9, size=(n, layout.K)) * g[:, None]
        v[:, 0] = g
        v[:, layout.s_w] = w
        v[:, layout.s_y] = rng.normal(size=(n, layout.M)) * g[:, None]
        v[:, layout.s_wy] = rng.normal(size=(n, layout.K * layout.M)) * g[:, None]
        v[:, layout.s_ww] = rng.uniform(0.3, 1.0, size=(n, layout.n_tri)) * g[:, None]
        if layout.K == 1:
            v[:, layout.s_ww] = np.maximum(v[:, layout.s_ww], w ** 2 / g[:, None] + 0.01)
        else:
            for k in range(n):                          # a positive definite ww
                W = rng.normal(size=(layout.K, layout.K))
                full = (W @ W.T + np.eye(layout.K)) * g[k]
                v[k, layout.s_ww] = full[np.triu_indices(layout.K)]
        v[:, layout.n_moments] = np.where(rng.random(n) < p_empty, 0.0, rng.integers(1, 30, size=n))
        t.value = v
        trees.append(t)
    return pack_trees(trees), thresholds


@pytest.mark.parametrize("n_trees,L", [(40, 2), (45, 3), (300, 2), (36, 9), (1030, 2)])
def test_blb_predict_is_blb_variance_bitwise(rng, threads, n_trees, L, batch_always):
    layout = CausalChannels(1, 1)
    packed, thresholds = _moment_forest(rng, n_trees, depth=5)
    X = rng.uniform(size=(5000 if n_trees < 1000 else 600, len(thresholds)))
    X[rng.random(X.shape) < 0.05] = np.nan
    theta, var = blb_predict(packed, X, layout, L, chunk_rows=1700)
    ref_theta, ref_var = blb_variance(tree_values(packed, X), layout, L)
    np.testing.assert_array_equal(theta, ref_theta)
    np.testing.assert_array_equal(var, ref_var)
    assert np.isfinite(var).mean() > 0.9


def test_blb_predict_degenerate_rows(rng):
    """Singular local covariance (NaN theta) and rows with fewer than two usable groups."""
    layout = CausalChannels(1, 1)
    packed, thresholds = _moment_forest(rng, 8, p_empty=0.6)
    value = packed["value"]
    value[::7, 4] = value[::7, 1] ** 2 / value[::7, 0]          # ww = w^2/g: A = 0 in those leaves
    X = rng.uniform(size=(400, len(thresholds)))
    idx, values = leaf_value_index(packed, X)
    n_trees = idx.shape[1]
    th, between, within, n_good = (np.empty(400), np.empty(400), np.empty(400), np.empty(400, dtype=np.int64))
    from forest.analysis.inference import _blb_sums_scalar
    _blb_sums_scalar(idx, values, 2, n_trees // 2, th, between, within, n_good, 0, 400)
    ref = _blb_sums(values[idx], layout, 2, n_trees // 2)
    np.testing.assert_array_equal(th, ref[0].ravel())
    np.testing.assert_array_equal(between, ref[1].ravel())
    np.testing.assert_array_equal(within, ref[2].ravel())
    np.testing.assert_array_equal(n_good, ref[3])
    assert (n_good < 2).any()


def test_blb_predict_multi_arm_goes_through_numpy(rng):
    layout = CausalChannels(2, 1)
    packed, thresholds = _moment_forest(rng, 20, layout=layout)
    X = rng.uniform(size=(300, len(thresholds)))
    theta, var = blb_predict(packed, X, layout, 2, chunk_rows=130)
    ref_theta, ref_var = blb_variance(tree_values(packed, X), layout, 2)
    np.testing.assert_array_equal(theta, ref_theta)
    np.testing.assert_array_equal(var, ref_var)

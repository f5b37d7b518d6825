"""Tree growth: brute force on tiny data, level-wise vs leaf-wise, partition kernels,
leaf re-estimation, and identical trees across rank counts (mpi)."""
import numpy as np
import pytest

from forest.criteria.basic import NewtonCriterion, VarianceCriterion
from forest.engine.expansion import LeafwiseGrower, grow_levelwise
from forest.engine.growth_options import EngineOptions, TreeParams
from forest.engine.leaf_estimation import reestimate_leaves
from forest.engine.partition import partition_rows, partition_rows_reference
from forest.engine.predictor import predict_leaves_binned, predict_values, predict_values_binned
from histogram.binning import BinMapper
from native import collectives as col
from native.comm import SelfCommunicator

from native.blocks import block_range


def block_slice(n, size, rank):
    """This rank's contiguous block of n global rows (same blocks as native.blocks)."""
    return slice(*block_range(n, size, rank))

SELF = SelfCommunicator()


def _data(rng, n=300, d=4, missing=0.05):
    X = np.round(rng.normal(size=(n, d)), 1)
    X[rng.random(X.shape) < missing] = np.nan
    x0 = np.nan_to_num(X[:, 0], nan=1.0)
    y = np.where(x0 > 0.3, 2.0, -1.0) + np.where(np.nan_to_num(X[:, 1]) > -0.5, 1.0, 0.0) + 0.3 * rng.normal(size=n)
    return X, y


def _brute_split(codes, y, w, rows, nb, missing_bin, min_leaf):
    """Best (gain, f, b, missing_left) by direct enumeration over rows."""
    def score(idx):
        return (w[idx] * y[idx]).sum() ** 2 / w[idx].sum()
    parent = score(rows)
    cands = []
    for f in range(codes.shape[0]):
        c = codes[f, rows].astype(int)
        miss = c == missing_bin
        for b in range(nb[f]):
            for d in (0, 1):
                if d == 1 and b == nb[f] - 1:
                    continue
                left = np.where(miss, d == 1, c <= b)
                if left.sum() < min_leaf or (~left).sum() < min_leaf:
                    cands.append((-np.inf, f, b, d, left))
                    continue
                cands.append((score(rows[left]) + score(rows[~left]) - parent, f, b, d, left))
    best = max(c[0] for c in cands)
    if not np.isfinite(best) or best <= 0:
        return None
    g, f, b, d, left = next(c for c in cands if c[0] >= best - 1e-12 * abs(best))
    ml = bool(d)
    if not (codes[f, rows] == missing_bin).any():
        ml = bool(left.sum() >= (~left).sum())
    return f, b, ml, left


def _check_against_brute(tree, node, codes, y, w, rows, nb, missing_bin, min_leaf, depth, max_depth):
    split = _brute_split(codes, y, w, rows, nb, missing_bin, min_leaf) if depth < max_depth else None
    if split is None:
        assert tree.feature[node] == -1
        np.testing.assert_allclose(tree.value[node, 0], (w[rows] * y[rows]).sum() / w[rows].sum(), rtol=1e-10)
        return 1
    f, b, ml, left = split
    assert (tree.feature[node], tree.bin_threshold[node], bool(tree.missing_left[node])) == (f, b, ml)
    return 1 + _check_against_brute(tree, tree.left[node], codes, y, w, rows[left], nb, missing_bin, min_leaf,
                                    depth + 1, max_depth) \
        + _check_against_brute(tree, tree.right[node], codes, y, w, rows[~left], nb, missing_bin, min_leaf,
                               depth + 1, max_depth)


@pytest.mark.parametrize("local_threshold", [0, float("inf")])  # histogram path only / subtree kernel
def test_levelwise_matches_brute_force(rng, local_threshold):
    X, y = _data(rng)
    w = rng.uniform(0.5, 2.0, size=len(y))
    bm = BinMapper(max_bins=16).fit(X, comm=SELF)
    codes = bm.transform(X)
    crit = VarianceCriterion(min_samples_leaf=8, count_channel=True)
    ch = crit.make_channels(y, w)
    sets = [np.arange(len(y), dtype=np.int32), np.flatnonzero(rng.random(len(y)) < 0.6).astype(np.int32)]
    trees = grow_levelwise(codes, ch, sets, crit, bm, TreeParams(max_depth=3), comm=SELF,
                           engine=EngineOptions(local_threshold=local_threshold))
    for tree, rows in zip(trees, sets):
        n = _check_against_brute(tree, 0, codes, y, w, rows, bm.n_bins_non_missing_, bm.missing_bin_, 8, 0, 3)
        assert n == tree.node_count and tree.node_count >= 7
        np.testing.assert_allclose(tree.weight[0], w[rows].sum())
        np.testing.assert_allclose(tree.count[0], len(rows))
        assert tree.max_depth <= 3


def test_leafwise_unlimited_equals_levelwise(rng):
    X, y = _data(rng, n=500)
    bm = BinMapper(max_bins=32).fit(X, comm=SELF)
    codes = bm.transform(X)
    crit = NewtonCriterion(min_samples_leaf=10, l2_regularization=0.5)
    ch = NewtonCriterion.make_channels(-y, np.ones_like(y))
    level = grow_levelwise(codes, ch, [np.arange(len(y), dtype=np.int32)], crit, bm,
                           TreeParams(max_depth=3, min_samples_split=20), comm=SELF)[0]
    grown = LeafwiseGrower(codes, bm, crit, max_leaf_nodes=None, max_depth=3, comm=SELF).grow(ch)
    leaf = grown.tree
    assert leaf.n_leaves == level.n_leaves and leaf.node_count == level.node_count
    np.testing.assert_allclose(predict_values(leaf, X), predict_values(level, X), rtol=1e-12)
    # Exact row counts and the row grouping by leaf.
    leaves = predict_leaves_binned(leaf, codes, bm.missing_bin_)[:, 0]
    for node, a, b in zip(grown.leaf_nodes, grown.leaf_starts, grown.leaf_stops):
        assert set(grown.rows[a:b]) == set(np.flatnonzero(leaves == node))
        assert leaf.count[node] == b - a


def test_leafwise_is_best_first(rng):
    X, y = _data(rng, n=400)
    bm = BinMapper(max_bins=32).fit(X, comm=SELF)
    codes = bm.transform(X)
    crit = NewtonCriterion(min_samples_leaf=5)
    ch = NewtonCriterion.make_channels(-y, np.ones_like(y))
    full = LeafwiseGrower(codes, bm, crit, max_leaf_nodes=None, max_depth=12, comm=SELF).grow(ch).tree
    for k in (2, 3, 5, 8, 13):
        t = LeafwiseGrower(codes, bm, crit, max_leaf_nodes=k, comm=SELF).grow(ch).tree
        assert t.n_leaves == k
        # Replay best-first on the unlimited tree (a node's split depends only on its
        # rows): expand the frontier leaf of largest gain, k - 1 times.
        frontier, chosen = {0}, []
        for _ in range(k - 1):
            node = max((n for n in frontier if full.feature[n] >= 0), key=lambda n: full.gain[n])
            chosen.append((full.feature[node], full.bin_threshold[node], full.gain[node]))
            frontier.remove(node)
            frontier |= {full.left[node], full.right[node]}
        got = sorted(zip(t.feature[t.feature >= 0], t.bin_threshold[t.feature >= 0], t.gain[t.feature >= 0]),
                     key=lambda r: -r[2])
        chosen.sort(key=lambda r: -r[2])
        assert [(f, b) for f, b, _ in got] == [(f, b) for f, b, _ in chosen]
        np.testing.assert_allclose([g for *_, g in got], [g for *_, g in chosen], rtol=1e-9)
    t = LeafwiseGrower(codes, bm, crit, max_leaf_nodes=31, max_depth=2, comm=SELF).grow(ch).tree
    assert t.max_depth <= 2 and t.n_leaves <= 4


def test_mtry_restricts_features(rng):
    X, y = _data(rng, n=400, d=6)
    bm = BinMapper(max_bins=16).fit(X, comm=SELF)
    codes = bm.transform(X)
    crit = VarianceCriterion(min_samples_leaf=5)
    ch = crit.make_channels(y)
    rows = [np.arange(400, dtype=np.int32)] * 6
    params = TreeParams(max_depth=4, mtry=2, seed=3)
    a = grow_levelwise(codes, ch, rows, crit, bm, params, tree_indices=np.arange(10, 16), comm=SELF)
    b = grow_levelwise(codes, ch, rows[:3], crit, bm, params, tree_indices=np.arange(10, 13), comm=SELF)
    for x, z in zip(a[:3], b):  # a tree depends on its global index, not the batch
        assert x == z
    assert len({tuple(t.feature) for t in a}) > 1  # mtry makes trees differ
    from forest.engine.mtry import mtry_feature_mask
    for i, t in enumerate(a):
        inner = np.flatnonzero(t.feature >= 0)
        mask = mtry_feature_mask(3, np.full(len(inner), 10 + i), inner, 6, 2)
        assert mask[np.arange(len(inner)), t.feature[inner]].all()


def test_partition_matches_reference(rng):
    codes = rng.integers(0, 9, size=(3, 200000)).astype(np.uint8)
    rows = rng.permutation(200000).astype(np.int32)
    starts = np.array([0, 50, 70000])
    stops = np.array([50, 60000, 200000])
    feats, thr, ml = np.array([0, 2, 1]), np.array([3, 0, 7]), np.array([1, 0, 1], np.uint8)
    ref_rows, ref_left = partition_rows_reference(rows, starts, stops, codes, feats, thr, ml, 8)
    got = rows.copy()
    n_left = partition_rows(got, np.empty_like(got), starts, stops, codes, feats, thr, ml, 8)
    np.testing.assert_array_equal(n_left, ref_left)
    np.testing.assert_array_equal(got, ref_rows)
    # the single long segment takes the multi-threaded path
    got = rows.copy()
    n_left = partition_rows(got, np.empty_like(got), starts[2:], stops[2:], codes, feats[2:], thr[2:], ml[2:], 8)
    r2, l2 = partition_rows_reference(rows, starts[2:], stops[2:], codes, feats[2:], thr[2:], ml[2:], 8)
    np.testing.assert_array_equal(got, r2)
    np.testing.assert_array_equal(n_left, l2)


def test_reestimate_leaves(rng):
    X, y = _data(rng, n=400)
    bm = BinMapper(max_bins=16).fit(X, comm=SELF)
    codes = bm.transform(X)
    crit = VarianceCriterion(min_samples_leaf=5)
    half = rng.random(400) < 0.5
    grow_rows, est_rows = np.flatnonzero(half).astype(np.int32), np.flatnonzero(~half).astype(np.int32)
    trees = grow_levelwise(codes, crit.make_channels(y), [grow_rows], crit, bm, TreeParams(max_depth=3), comm=SELF)
    est_ch = np.stack([np.ones(400), y, y ** 2], axis=1)
    sums = reestimate_leaves(trees, codes, est_ch, [est_rows], lambda s: s[:, 1:2] / np.maximum(s[:, :1], 1),
                             bm.missing_bin_, comm=SELF)
    tree = trees[0]
    leaves = predict_leaves_binned(tree, codes, bm.missing_bin_, rows=est_rows)[:, 0]
    for node in np.flatnonzero(tree.feature < 0):
        sel = est_rows[leaves == node]
        np.testing.assert_allclose(sums[0][node], est_ch[sel].sum(0), atol=1e-12)
        np.testing.assert_allclose(tree.value[node, 0], y[sel].mean() if len(sel) else 0.0, atol=1e-12)
    np.testing.assert_allclose(sums[0][0], est_ch[est_rows].sum(0))


def test_bad_inputs(rng):
    X, y = _data(rng, n=50)
    bm = BinMapper(max_bins=8).fit(X, comm=SELF)
    codes = bm.transform(X)
    crit = VarianceCriterion()
    with pytest.raises(ValueError, match="channels"):
        grow_levelwise(codes, np.ones((50, 3)), [np.arange(50, dtype=np.int32)], crit, bm, comm=SELF)
    with pytest.raises(ValueError, match="uint8"):
        grow_levelwise(codes.astype(float), crit.make_channels(y), [np.arange(50)], crit, bm, comm=SELF)
    with pytest.raises(ValueError, match="split_mode"):
        grow_levelwise(codes, crit.make_channels(y), [np.arange(50)], crit, bm, comm=SELF,
                       engine=EngineOptions(split_mode="bcast"))
    with pytest.raises(ValueError, match="max_leaf_nodes"):
        LeafwiseGrower(codes, bm, NewtonCriterion(), max_leaf_nodes=1, comm=SELF)


@pytest.mark.mpi
@pytest.mark.parametrize("split_mode", ["allreduce", "reduce_scatter"])
def test_trees_identical_across_ranks(comm, split_mode):
    rng = np.random.default_rng(7)
    X, y = _data(rng, n=600, d=5)
    sl = block_slice(len(y), comm.size, comm.rank)
    # Reference: the full data on this process alone.
    bm_full = BinMapper(max_bins=32).fit(X, comm=SELF)
    codes_full = bm_full.transform(X)
    crit = VarianceCriterion(min_samples_leaf=5, count_channel=True)
    ch_full = crit.make_channels(y)
    sets_full = [np.flatnonzero(rng.random(600) < p).astype(np.int32) for p in (0.5, 0.7, 1.0)]
    params = TreeParams(max_depth=4, mtry=3, seed=1)
    ref = grow_levelwise(codes_full, ch_full, sets_full, crit, bm_full, params, comm=SELF)
    newton = NewtonCriterion(min_samples_leaf=10)
    gch_full = NewtonCriterion.make_channels(-y, np.ones_like(y))
    ref_leaf = LeafwiseGrower(codes_full, bm_full, newton, max_leaf_nodes=12, comm=SELF).grow(gch_full).tree

    bm = BinMapper(max_bins=32).fit(X[sl], comm=comm)
    codes = bm.transform(X[sl])
    sets = [(s[(s >= sl.start) & (s < sl.stop)] - sl.start).astype(np.int32) for s in sets_full]
    gids = np.arange(sl.start, sl.stop, dtype=np.int64)
    dist = grow_levelwise(codes, ch_full[sl], sets, crit, bm, params, comm=comm, gids=gids,
                          engine=EngineOptions(split_mode=split_mode))
    # The pure histogram path (no exact small-node finishing) must agree with it too.
    hist_only = EngineOptions(split_mode=split_mode, local_threshold=0)
    dist_hist = grow_levelwise(codes, ch_full[sl], sets, crit, bm, params, comm=comm, engine=hist_only)
    ref_hist = grow_levelwise(codes_full, ch_full, sets_full, crit, bm_full, params, comm=SELF,
                              engine=EngineOptions(local_threshold=0))
    dist_leaf = LeafwiseGrower(codes, bm, newton, max_leaf_nodes=12, comm=comm,
                               split_mode=split_mode).grow(gch_full[sl]).tree
    # Honest re-estimation on the other rows, one collective.
    est = [np.setdiff1d(np.arange(sl.stop - sl.start), s).astype(np.int32) for s in sets]
    sums = reestimate_leaves(dist, codes, ch_full[sl], est, crit.node_value, bm.missing_bin_, comm=comm)
    est_full = [np.setdiff1d(np.arange(600), s) for s in sets_full]
    sums_ref = reestimate_leaves(ref, codes_full, ch_full, est_full, crit.node_value, bm_full.missing_bin_, comm=SELF)
    gathered = col.allgather_object(comm, [t.to_arrays()["feature"].tolist() for t in dist])

    for a, b in zip(ref + ref_hist, dist + dist_hist):
        for x, z in zip(a.structure(), b.structure()):
            np.testing.assert_array_equal(x, z)
        np.testing.assert_allclose(a.value, b.value, rtol=1e-9, atol=1e-12)
    for x, z in zip(ref_leaf.structure(), dist_leaf.structure()):
        np.testing.assert_array_equal(x, z)
    np.testing.assert_array_equal(ref_leaf.count, dist_leaf.count)
    np.testing.assert_allclose(predict_values(ref_leaf, X), predict_values(dist_leaf, X), rtol=0, atol=1e-9)
    for s, r in zip(sums, sums_ref):
        np.testing.assert_allclose(s, r, rtol=1e-12, atol=1e-9)
    assert all(g == gathered[0] for g in gathered)

"""QuantileForest (issue 34): criterion vs reference, known quantiles, weights identity, files, ranks."""
import numpy as np
import pytest
from scipy.stats import norm

from native.comm import SelfCommunicator
from forest import QuantileForest, model_io
from forest.criteria.quantile import MAX_SPLIT_LEVELS, QuantileCriterion, relabel_map, split_levels
from forest.engine.leaf_outcomes import (PredictionLayout, outcome_ranks, weighted_quantile_reference,
                                         weighted_quantiles)

SELF = SelfCommunicator()
LEVELS = (0.1, 0.5, 0.9)


def _hetero(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 4))
    scale = 0.5 + 1.5 * (X[:, 1] > 0)
    return X, X[:, 0] + scale * rng.normal(size=n), rng


def _truth(X, levels=LEVELS):
    scale = 0.5 + 1.5 * (X[:, 1] > 0)
    return X[:, [0]] + scale[:, None] * norm.ppf(levels)


@pytest.mark.parametrize("levels", [(0.5,), LEVELS, (0.05, 0.2, 0.4, 0.6, 0.8, 0.95)])
def test_compiled_gain_equals_reference(levels):
    rng = np.random.default_rng(len(levels))
    crit = QuantileCriterion(levels, 12, min_samples_leaf=3)
    for _ in range(4):
        bins = rng.integers(0, 12, size=300)
        ch = crit.make_channels(bins, rng.uniform(0.2, 2.0, size=300))
        parent = ch.sum(axis=0)
        masks = [rng.uniform(size=300) < rng.uniform() for _ in range(30)] + [np.arange(300) < 2]
        left = np.array([ch[m].sum(axis=0) for m in masks])
        ref = crit.gain(left, parent - left, parent)
        got = crit.compiled().gains_of(left, parent - left, parent)
        assert np.isinf(ref).any()                            # the min_samples_leaf constraint binds
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_relabel_is_the_node_quantiles():
    # Outcome bins 0..9 with equal weight: the median's bin is 4, the 0.1 quantile's 0, 0.9's 8.
    parent = np.zeros(12)
    parent[0], parent[1:11], parent[11] = 10.0, 1.0, 10.0
    assert relabel_map(parent, LEVELS).tolist() == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    # every row in one bin: one class, no split gains anything
    one = np.zeros(12)
    one[[0, 4, 11]] = [5.0, 5.0, 5.0]
    crit = QuantileCriterion(LEVELS, 10)
    left = one.copy()
    left[[0, 4, 11]] = 2.0
    assert crit.gain(left, one - left, one) == 0.0


def test_split_levels_cap():
    many = tuple(np.linspace(0.05, 0.95, 19))
    picked = split_levels(many)
    assert len(picked) == MAX_SPLIT_LEVELS and picked[0] == many[0] and picked[-1] == many[-1]
    assert split_levels(LEVELS) == LEVELS


def test_weighted_quantile_kernel_equals_reference():
    rng = np.random.default_rng(0)
    X, y, _ = _hetero(800, 1)
    f = QuantileForest(15, random_state=2, min_samples_leaf=2).fit(X, y, comm=SELF)
    Xq = rng.uniform(-1, 1, size=(40, 4))
    levels = np.array([0.01, 0.1, 0.33, 0.5, 0.9, 0.999])
    got = f.predict(Xq, quantiles=levels)
    W = f.get_forest_weights(Xq, comm=SELF).toarray()
    for i in range(len(Xq)):
        # equal up to ties broken by rounding: between the reference at tau -/+ 1e-9
        lo = weighted_quantile_reference(y, W[i], levels - 1e-9)
        hi = weighted_quantile_reference(y, W[i], levels + 1e-9)
        assert np.all((got[i] >= lo) & (got[i] <= hi))
    assert np.all(np.diff(got, axis=1) >= 0)                          # monotone in the level


def test_known_quantiles_and_coverage():
    X, y, rng = _hetero(6000, 3)
    f = QuantileForest(100, random_state=0).fit(X, y, comm=SELF)
    Xt, yt, _ = _hetero(4000, 4)
    pred = f.predict(Xt)
    coverage = np.mean((yt >= pred[:, 0]) & (yt <= pred[:, 2]))
    assert abs(coverage - 0.8) < 0.04
    err = np.sqrt(np.mean((pred - _truth(Xt)) ** 2, axis=0))
    assert np.all(err < [0.45, 0.3, 0.45]), err
    # the spread follows the noise scale: the wide half's 0.1-0.9 width is about 4x the narrow's
    width = pred[:, 2] - pred[:, 0]
    ratio = width[Xt[:, 1] > 0].mean() / width[Xt[:, 1] <= 0].mean()
    assert 2.5 < ratio < 5.0, ratio
    # the relabelling sees the scale: X[:, 1] (scale only) is split on far more than pure noise
    imp = f.feature_importances_
    assert imp[1] > 2 * max(imp[2], imp[3]), imp


def test_weights_and_sample_weight():
    X, y, rng = _hetero(700, 5)
    w = rng.uniform(0.2, 3.0, size=len(y))
    f = QuantileForest(20, random_state=1).fit(X, y, sample_weight=w, comm=SELF)
    Xq = rng.uniform(-1, 1, size=(20, 4))
    W = f.get_forest_weights(Xq, comm=SELF).toarray()
    np.testing.assert_allclose(W.sum(axis=1), 1.0, atol=1e-12)
    got = f.predict(Xq, quantiles=[0.5])[:, 0]
    for i in range(len(Xq)):
        lo, hi = (weighted_quantile_reference(y, W[i], [0.5 + d])[0] for d in (-1e-9, 1e-9))
        assert lo <= got[i] <= hi


def test_model_file_predicts_alone_and_errors():
    X, y, _ = _hetero(400, 6)
    f = QuantileForest(8, random_state=1).fit(X, y, comm=SELF)
    restored = model_io.loads(model_io.dumps(f))
    np.testing.assert_array_equal(restored.predict(X[:50]), f.predict(X[:50]))
    bad = model_io.dumps(f)
    f.leaf_outcomes_["weight"][0] = -1.0
    with pytest.raises(model_io.ModelFormatError):
        model_io.loads(model_io.dumps(f))
    assert bad
    with pytest.raises(ValueError, match="increasing"):
        QuantileForest(quantiles=(0.5, 0.1)).fit(X, y, comm=SELF)
    with pytest.raises(ValueError, match="in \\(0, 1\\)"):
        f.predict(X, quantiles=[1.5])
    with pytest.raises(ValueError, match="1-D"):
        QuantileForest(4).fit(X, np.column_stack([y, y]), comm=SELF)


def test_outcome_list_kernel_reference_tree():
    # weighted_quantiles on a hand-built one-tree forest: a root split into two leaves
    packed = {"feature": np.array([0, -1, -1]), "left": np.array([1, -1, -1]), "right": np.array([2, -1, -1]),
              "tree_offsets": np.array([0, 3]), "value": np.array([[4.0, 1.0], [3.0, 1.0], [1.0, 1.0]])}
    outcomes = {"offsets": np.array([0, 0, 3, 4]), "y": np.array([1.0, 2.0, 5.0, 7.0]),
                "weight": np.array([1 / 3, 1 / 3, 1 / 3, 1.0])}
    leaves = np.array([[1], [2]], dtype=np.int32)
    got = weighted_quantiles(packed, outcomes, leaves, np.array([0.2, 0.5, 0.7]), 0)
    np.testing.assert_array_equal(got, [[1.0, 2.0, 5.0], [7.0, 7.0, 7.0]])


def test_outcome_ranks_are_searchsorted():
    rng = np.random.default_rng(11)
    for n in (1, 2, 5, 64, 65, 1000, 5000):
        pool = np.r_[rng.normal(size=n), 0.0, -0.0, 1e300, -1e300, 5e-324, -5e-324]
        ys = rng.choice(pool, size=4 * n + 3)
        values, ranks = outcome_ranks(ys)
        np.testing.assert_array_equal(values, np.unique(ys))
        assert ranks.dtype == np.uint32
        np.testing.assert_array_equal(ranks, np.searchsorted(values, ys))
    values, ranks = outcome_ranks(np.zeros(0))
    assert len(values) == 0 and len(ranks) == 0
    with pytest.raises(ValueError, match="finite"):
        outcome_ranks(np.array([1.0, np.nan]))


def _stump_forest(rng, n_trees, pool, uniform):
    # n_trees one-split trees; each leaf's list its own, or (an empty leaf given its
    # parent's count) the root's; weights f_i / count as gather_leaf_outcomes stores them
    feature, left, right, value, offsets = [], [], [], [], [0]
    offs, ys, ws = [0], [], []
    for t in range(n_trees):
        n1, n2 = rng.integers(1, 9, size=2)
        filled = rng.uniform() < 0.3
        root = n1 + n2 if not filled else int(rng.integers(1, 9))
        counts = [root, n1, root if filled else n2]
        holders = [filled, True, not filled]          # which nodes keep a list
        base = 3 * t
        feature += [0, -1, -1]
        left += [base + 1, -1, -1]
        right += [base + 2, -1, -1]
        for c, keep in zip(counts, holders):
            value.append([float(c), 1.0])
            k = c if keep else 0
            y = np.sort(rng.choice(pool, size=k))
            f = np.ones(k) if uniform else rng.uniform(0.1, 3.0, size=k)
            ys.append(y)
            ws.append(f / c)
            offs.append(offs[-1] + k)
        offsets.append(base + 3)
    packed = {"feature": np.array(feature), "left": np.array(left), "right": np.array(right),
              "tree_offsets": np.array(offsets), "value": np.array(value)}
    outcomes = {"offsets": np.array(offs, dtype=np.int64), "y": np.concatenate(ys), "weight": np.concatenate(ws)}
    return packed, outcomes


@pytest.mark.parametrize("uniform", [True, False])
def test_rank_kernel_equals_reference_at_any_bin_count(uniform):
    # the compiled kernel against the NumPy reference on the union of each query's
    # lists: equal at every bin count (one bin: a full sort; 2**20: a bin per value),
    # with ties, trees left out (out-of-bag) and rows with no tree (NaN)
    rng = np.random.default_rng(3 + uniform)
    pool = np.round(rng.normal(size=40), 1)               # ties within and across lists
    packed, outcomes = _stump_forest(rng, 12, pool, uniform)
    n_q = 300
    leaves = rng.integers(1, 3, size=(n_q, 12)).astype(np.int32)
    use = rng.uniform(size=(n_q, 12)) < 0.6
    use[:3] = False
    use[3:, 0] = True
    levels = np.array([0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.999])
    node_of = np.asarray(packed["tree_offsets"])[:-1]
    from forest.engine.forest_weights import value_nodes
    vnode = value_nodes(packed, 0)
    off = outcomes["offsets"]
    expected = np.empty((n_q, len(levels)))
    for q in range(n_q):
        parts = [vnode[node_of[t] + leaves[q, t]] for t in range(12) if use[q, t]]
        y = np.concatenate([outcomes["y"][off[v]:off[v + 1]] for v in parts] + [np.zeros(0)])
        w = np.concatenate([outcomes["weight"][off[v]:off[v + 1]] for v in parts] + [np.zeros(0)])
        expected[q] = weighted_quantile_reference(y, w, levels)
    assert np.isnan(expected[:3]).all() and not np.isnan(expected[3:]).any()
    for bins_log2 in (0, 2, 8, 20):
        layout = PredictionLayout(packed, outcomes, 0, bins_log2=bins_log2)
        assert layout.uniform == uniform
        got = weighted_quantiles(packed, outcomes, leaves, levels, 0, use=use, layout=layout)
        np.testing.assert_array_equal(got, expected)
        # levels in any order: each level's quantile as alone
        back = weighted_quantiles(packed, outcomes, leaves, levels[::-1], 0, use=use, layout=layout)
        np.testing.assert_array_equal(back, expected[:, ::-1])
    if uniform:
        # the stored weights read instead of 1 / count: the same bits, the same quantiles
        layout.uniform, layout.weights = False, np.ascontiguousarray(outcomes["weight"])
        np.testing.assert_array_equal(
            weighted_quantiles(packed, outcomes, leaves, levels, 0, use=use, layout=layout), expected)


@pytest.mark.parametrize("categorical", [False, True])
def test_predict_with_kept_layouts_equals_reference_leaves(categorical):
    # predict keeps the trees' batch layout and the lists' layout from fit; its quantiles
    # are those of the plain-Python traversal's leaves through freshly built lists, with
    # missing values, and with a categorical feature (unseen categories too)
    from forest.engine.predictor import predict_reference
    from forest.engine.tree import unpack_trees
    from forest.estimators.quantile_forest import COUNT_COL
    X, y, rng = _hetero(1500, 9)
    X[:, 3] = rng.integers(0, 6, size=len(y))
    y = y + 0.7 * (X[:, 3] % 2)
    X[rng.uniform(size=X.shape) < 0.05] = np.nan
    kw = dict(categorical_features=[3]) if categorical else {}
    f = QuantileForest(20, random_state=4, **kw).fit(X, y, comm=SELF)
    assert f._prediction_layout_ is not None and f._batch_walk_ is not None   # built by fit
    Xq = rng.uniform(-1, 1, size=(700, 4))
    Xq[:, 3] = rng.integers(0, 9, size=len(Xq))
    Xq[rng.uniform(size=Xq.shape) < 0.05] = np.nan
    from forest._validation import validate_features
    coded = validate_features(f, Xq, reset=False, min_samples=0)         # categories as their codes
    leaves, _ = predict_reference(unpack_trees(f.estimators_), coded)
    want = weighted_quantiles(f.estimators_, f.leaf_outcomes_, leaves, np.array(LEVELS), COUNT_COL)
    np.testing.assert_array_equal(f.predict(Xq), want)
    np.testing.assert_array_equal(f.predict(Xq[:5]), want[:5])          # few rows: the per-row walk
    if categorical:
        assert f._batch_walk_[1] is False                                # category sets: no record layout
    else:
        assert f._batch_walk_[1] is not False
    restored = model_io.loads(model_io.dumps(f))                         # layouts rebuilt on first use
    assert getattr(restored, "_batch_walk_", None) is None and getattr(restored, "_prediction_layout_", None) is None
    np.testing.assert_array_equal(restored.predict(Xq), want)


@pytest.mark.mpi
def test_quantiles_identical_at_any_rank_count(comm, same_model_file):
    X, y, rng = _hetero(900, 7)
    lo, hi = len(y) * comm.rank // comm.size, len(y) * (comm.rank + 1) // comm.size
    kw = dict(n_estimators=12, random_state=5)
    dist = QuantileForest(**kw).fit(X[lo:hi], y[lo:hi], comm=comm)
    ref = QuantileForest(**kw).fit(X, y, comm=SELF)
    Xq = rng.uniform(-1, 1, size=(100, 4))
    np.testing.assert_array_equal(dist.predict(Xq), ref.predict(Xq))
    for key in ("offsets", "y", "weight"):
        np.testing.assert_array_equal(dist.leaf_outcomes_[key], ref.leaf_outcomes_[key])
    for key in ("feature", "bin_threshold", "left", "right"):
        np.testing.assert_array_equal(dist.estimators_[key], ref.estimators_[key])


def test_out_of_bag_quantiles_leave_the_row_out():
    X, y, _ = _hetero(1500, 8)
    f = QuantileForest(60, random_state=2).fit(X, y, comm=SELF)
    oob = f.oob_predict()
    np.testing.assert_array_equal(f.oob_predict(X, comm=SELF), oob)
    in_sample = f.predict(X)
    # out of bag, the 0.1-0.9 interval covers about 80% of the training rows; in sample
    # (each row's own outcome in its leaves) it covers more
    cover_oob = np.mean((y >= oob[:, 0]) & (y <= oob[:, 2]))
    cover_in = np.mean((y >= in_sample[:, 0]) & (y <= in_sample[:, 2]))
    assert abs(cover_oob - 0.8) < 0.04 and cover_in > cover_oob

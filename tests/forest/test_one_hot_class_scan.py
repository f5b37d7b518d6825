"""The one-hot criterion's class-count scan (row-class pieces) against the channel scan.

With the row-class pieces (:mod:`forest.criteria.compiled`) the subtree kernel scores
scan-mode candidates from per-class row counts and builds histograms from per-class bin
counts; the trees, split gains and children's sums must be bit for bit those of the
channel sums the same kernel uses without them (``class_bound`` 0), and the pieces must
equal the channel pieces on exact sums.
"""
from collections import namedtuple

import numpy as np
import pytest

from forest.criteria import compiled as cc
from forest.criteria.one_hot import OneHotCriterion, _class_constants
from forest.engine.local_growth import grow_subtrees, grow_subtrees_reference
from forest.estimators.probability_forest import one_hot
from histogram.jit import kernel

from subtree_tasks import random_tasks


def _criterion(K, **kw):
    return OneHotCriterion(K, 1.0 - K / 2.0, **kw)


def _channel_scan(compiled):
    """The same criterion and kernel specialisation without the class scan."""
    off = cc.CompiledCriterion(compiled.record._replace(class_bound=0.0), compiled.weight_channel,
                               compiled.min_child_rows, compiled.n_consts, compiled.size_channel)
    return off


def _same(a, b):
    np.testing.assert_array_equal(a.tree_starts, b.tree_starts)
    np.testing.assert_array_equal(a.ints, b.ints)
    assert a.floats.tobytes() == b.floats.tobytes()       # gains and sums, bit for bit (signed zeros too)


@pytest.mark.parametrize("K", [2, 3, 10])
@pytest.mark.parametrize("hist_rows,slots", [(None, None), (64, None), (64, 1)])
def test_class_scan_grows_the_channel_scans_trees(K, hist_rows, slots):
    rng = np.random.default_rng(100 + K)
    n_rows, n_features, missing_bin = 1500, 5, 255
    codes = rng.integers(0, 255, size=(n_features, n_rows))
    codes[2] = rng.integers(0, 6, n_rows)                          # few codes: long runs
    codes[rng.random((n_features, n_rows)) < 0.08] = missing_bin
    codes[4, rng.random(n_rows) < 0.5] = missing_bin               # many missing rows
    binned = codes.astype(np.uint8)
    cls = np.where(rng.random(n_rows) < 0.5, (binned[0] // 40) % K, rng.integers(0, K, n_rows))
    categorical = np.array([False, False, True, False, False])
    y = one_hot(cls, np.arange(K)) - 0.5
    rows, starts, tree, node, depth, nxt = random_tasks(rng, 3, n_rows, [900, 40, 3, 300])
    args = (rows, starts, tree, node, depth, nxt, np.array([4, 9, 2]))
    for kw in (dict(min_samples_leaf=1), dict(min_samples_leaf=3, alpha=0.1, imbalance_penalty=0.3)):
        hot = _criterion(K, **kw)
        ch = hot.make_channels(y)
        comp = hot.compiled()
        assert comp.record.class_bound > 0
        opts = dict(min_samples_split=2.0, seed=5, hist_rows=hist_rows, max_hist_slots=slots, mtry=4)
        for cat in (None, categorical):
            got = grow_subtrees(binned, ch, *args, comp, missing_bin, categorical=cat, **opts)
            ref = grow_subtrees(binned, ch, *args, _channel_scan(comp), missing_bin, categorical=cat, **opts)
            assert len(got.ints) > 100
            _same(got, ref)


def test_class_scan_matches_the_slow_reference():
    rng = np.random.default_rng(3)
    K, n_rows, n_features, missing_bin = 4, 400, 3, 40
    codes = rng.integers(0, 30, size=(n_features, n_rows))
    codes[rng.random((n_features, n_rows)) < 0.15] = missing_bin
    binned = codes.astype(np.uint8)
    y = one_hot(np.where(rng.random(n_rows) < 0.7, binned[1] % K, rng.integers(0, K, n_rows)), np.arange(K)) - 0.5
    hot = _criterion(K, min_samples_leaf=2)
    ch = hot.make_channels(y)
    args = random_tasks(rng, 2, n_rows, [300, 50]) + (np.array([0, 1]),)
    got = grow_subtrees(binned, ch, *args, hot.compiled(), missing_bin, seed=2)
    ref = grow_subtrees_reference(binned, ch, *args, hot, np.full(n_features, 30), missing_bin, seed=2)
    assert len(got.ints) > 40
    np.testing.assert_array_equal(got.ints, ref.ints)
    np.testing.assert_array_equal(got.floats[:, 1:], ref.floats[:, 1:])
    np.testing.assert_allclose(got.floats[:, 0], ref.floats[:, 0], rtol=1e-12)


@pytest.mark.parametrize("hist_rows", [None, 64])
def test_rows_without_a_class_fall_back_to_channels(hist_rows):
    # A row that is no class vector (weight 2) sends its task's histograms and subtrees to
    # channel sums: the result is then the channel scan's, whatever the class pieces would say.
    rng = np.random.default_rng(9)
    K, n_rows, missing_bin = 3, 500, 255
    binned = rng.integers(0, 255, size=(4, n_rows)).astype(np.uint8)
    hot = _criterion(K)
    ch = hot.make_channels(one_hot(rng.integers(0, K, n_rows), np.arange(K)) - 0.5)
    ch[7] *= 2.0
    args = random_tasks(rng, 2, n_rows, [400, 60], random_depth=False) + (np.array([0, 1]),)
    comp = hot.compiled()
    got = grow_subtrees(binned, ch, *args, comp, missing_bin, hist_rows=hist_rows)
    assert len(got.ints) > 50
    _same(got, grow_subtrees(binned, ch, *args, _channel_scan(comp), missing_bin, hist_rows=hist_rows))


@kernel
def _class_pieces(p, cnts, st, consts, parent, sums, gains):
    # Row i of cnts: a left side's class counts; st: the sides' (rows, class_side) per candidate.
    cc.prepare(p, parent, consts)
    k = cnts.shape[1]
    n = 0
    for g in range(k):
        n += cnts[-1, g]
    for i in range(cnts.shape[0]):
        n_l = 0
        q_l = 0
        q_r = 0
        for g in range(k):
            n_l += cnts[i, g]
            q_l += cnts[i, g] * cnts[i, g]
            q_r += (cnts[-1, g] - cnts[i, g]) * (cnts[-1, g] - cnts[i, g])
        cc.class_sums(p, cnts[i], n_l, sums[i])
        st[0, i] = n_l
        st[1, i] = cc.class_side(p, q_l, n_l)
        st[2, i] = n - n_l
        st[3, i] = cc.class_side(p, q_r, n - n_l)
    cc.class_gains(p, st, consts, gains, 0, cnts.shape[0])


@pytest.mark.parametrize("K", [2, 5])
@pytest.mark.parametrize("kw", [dict(min_samples_leaf=1), dict(min_samples_leaf=4, alpha=0.2, imbalance_penalty=0.5)])
def test_class_pieces_equal_the_channel_pieces(K, kw):
    rng = np.random.default_rng(K)
    hot = _criterion(K, **kw)
    comp = hot.compiled()
    n = 60
    y = rng.integers(0, K, n)
    ch = hot.make_channels(one_hot(y, np.arange(K)) - 0.5)
    cuts = np.vstack([rng.random((40, n)) < rng.uniform(0.05, 0.95, (40, 1)), np.ones((1, n), bool)])
    cnts = np.stack([np.bincount(y[c], minlength=K) for c in cuts]).astype(np.int64)
    m = len(cnts)
    st, sums, gains = np.zeros((4, m)), np.zeros((m, K)), np.zeros((1, m))
    parent = ch.sum(axis=0)
    cc.call_kernel(_class_pieces, comp.record, cnts, st, np.zeros(comp.n_consts), parent, sums, gains)
    ch_sums = cuts.astype(float) @ ch
    assert sums.tobytes() == ch_sums.tobytes()                     # class_sums: the channel sums' bits
    full = hot.class_sums(ch_sums)
    np.testing.assert_array_equal(st[1], (full ** 2).sum(axis=1))
    np.testing.assert_array_equal(st[3], (hot.class_sums(parent - ch_sums) ** 2).sum(axis=1))
    ref = comp.gains_of(ch_sums, parent - ch_sums, parent)
    assert gains[0].tobytes() == ref.tobytes()                      # class_gains == gains, bit for bit
    assert np.isinf(ref).any() and np.isfinite(ref).any()


def test_class_constants_and_bounds():
    # the +-0.5 coding: exact; other shifts: no class scan
    hot, cold, coef, bound = _class_constants(4, 1.0 - 4 / 2.0)
    assert (hot, cold, coef) == (0.5, -0.5, 0) and bound > 0
    assert _class_constants(3, 1.0 - 3 * 0.3)[3] == 0.0
    p = _criterion(4).compiled().record
    assert cc.n_row_classes(p, 10_000) == 4
    assert cc.n_row_classes(p, 2 ** 26) == 0                       # too many rows for exact quarters
    assert cc.n_row_classes(p._replace(class_bound=0.0), 10) == 0
    ch = np.array([[1.0, -0.5, 0.5, -0.5], [1.0, -0.5, -0.5, -0.5], [2.0, -1.0, 1.0, -1.0], [1.0, 0.5, 0.5, -0.5]])
    assert [cc.row_class(p, ch, i) for i in range(4)] == [1, 3, -1, -1]


Rec = namedtuple("Rec", ["a"])


def test_register_takes_the_class_pieces_together_only():
    def prep(p, parent, consts):
        pass

    def gains(p, lefts, rights, consts, out, row, n):
        pass

    def nrc(p, n):
        return 0

    def sides(p, n_l, n_r, cum, miss, with_miss, parent):
        return True

    with pytest.raises(TypeError, match="go together"):
        cc.register(Rec, prepare=prep, gains=gains, n_row_classes=nrc)
    full = dict(n_row_classes=nrc, row_class=lambda p, ch, i: -1, class_sums=lambda p, cnt, n, out: None,
                class_side=lambda p, q2, n: 0.0, class_gains=lambda p, st, consts, out, row, n: None)
    with pytest.raises(TypeError, match="cannot give them"):
        cc.register(Rec, prepare=prep, gains=gains, sides_ok=sides, **full)
    assert not cc.is_registered(Rec) and not cc.has_row_classes(Rec)

"""OneHotCriterion (the probability forest's unit-weight criterion) against the variance criterion.

It grows on one channel fewer (the last class rebuilt) and scores a side with one
division: node sums, values, objectives, category keys and size limits must equal
:class:`VarianceCriterion`'s bit for bit on one-hot targets, its gains the exact
(rational) Gini decrease, and the subtree kernel must grow what the slow reference and
the variance criterion grow.
"""
from fractions import Fraction

import numpy as np
import pytest

from forest.criteria.basic import VarianceCriterion
from forest.criteria.one_hot import OneHotCriterion
from forest.engine.local_growth import grow_subtrees, grow_subtrees_reference
from forest.estimators.probability_forest import one_hot

from subtree_tasks import random_tasks


def _pair(K, **kw):
    """The variance criterion on the ``+-0.5`` one-hot coding and the one-hot criterion."""
    return (VarianceCriterion(K, rows_are_weights=True, **kw),
            OneHotCriterion(K, 1.0 - K / 2.0, **kw))


def _targets(rng, n, K):
    return one_hot(rng.integers(0, K, n), np.arange(K)) - 0.5


def _exact_gain(left, right, K):
    """The Gini gain as fractions (no rounding) from full variance-criterion sums."""
    def score(s):
        return sum(Fraction(x) ** 2 for x in s[1:1 + K]) / Fraction(s[0]) if s[0] > 0 else Fraction(0)
    return score(left) + score(right) - score(left + right)


@pytest.mark.parametrize("K", [2, 3, 5])
@pytest.mark.parametrize("kw", [dict(min_samples_leaf=1), dict(min_samples_leaf=3, alpha=0.15),
                                dict(min_samples_leaf=2, imbalance_penalty=0.4)])
def test_gains_values_and_keys_are_the_variance_criterions(K, kw):
    rng = np.random.default_rng(K)
    var, hot = _pair(K, **kw)
    comp_v, comp_h = var.compiled(), hot.compiled()
    n_inf = n_fin = 0
    for _ in range(25):
        n = int(rng.integers(2, 40))
        y = _targets(rng, n, K)
        full, ch = var.make_channels(y), hot.make_channels(y)
        assert ch.shape == (n, K) and np.array_equal(ch, full[:, :K])
        parent_v, parent = full.sum(axis=0), ch.sum(axis=0)
        cuts = rng.random((15, n)) < rng.uniform(0.1, 0.9)
        lv, lh = cuts.astype(float) @ full, cuts.astype(float) @ ch
        # the rebuilt last class is the summed one, exactly
        np.testing.assert_array_equal(hot.class_sums(lh), lv[:, 1:])
        np.testing.assert_array_equal(hot.node_value(lh), var.node_value(lv))
        np.testing.assert_array_equal(hot.node_objective(lh), var.node_objective(lv))
        np.testing.assert_array_equal(hot.node_size(lh), var.node_size(lv))
        np.testing.assert_array_equal(hot.min_child_size(parent), var.min_child_size(parent_v))
        got = comp_h.gains_of(lh, parent - lh, parent)
        ref = hot.gain(lh, parent - lh, parent)
        np.testing.assert_array_equal(got, ref)           # compiled == vectorised, bit for bit
        ref_v = var.gain(lv, parent_v - lv, parent_v)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref_v))
        fin = np.isfinite(got)
        n_inf += int((~fin).sum())
        n_fin += int(fin.sum())
        np.testing.assert_allclose(got[fin], ref_v[fin], rtol=1e-12, atol=1e-12)
        if not kw.get("imbalance_penalty"):
            # one rounding from the exact gain's terms (the variance criterion's has K per side)
            for i in np.flatnonzero(fin)[:4]:
                exact = _exact_gain(lv[i], parent_v - lv[i], K)
                assert abs(Fraction(got[i]) - exact) <= Fraction(4 * float(np.spacing(abs(got[i]) + parent[0])))
        # categorical keys: the variance criterion's, bit for bit
        stats = np.stack([lh, parent - lh], axis=1)[None]
        stats_v = np.stack([lv, parent_v - lv], axis=1)[None]
        np.testing.assert_array_equal(hot.category_keys(stats, parent[None]),
                                      var.category_keys(stats_v, parent_v[None]))
    assert n_inf > 0 and n_fin > 0


def _binned(rng, n_rows, n_features, n_values, missing_bin, p_missing):
    codes = rng.integers(0, n_values, size=(n_features, n_rows))
    codes[rng.random((n_features, n_rows)) < p_missing] = missing_bin
    return codes.astype(np.uint8)


# hist_rows None: the sorted-code scan; 0 and 20: histograms with sibling subtraction.
@pytest.mark.parametrize("hist_rows", [None, 0, 20])
@pytest.mark.parametrize("K,sizes", [(2, (1, 0.0, 4.0)), (4, (3, 0.1, 6.0))])
def test_subtrees_match_reference_and_the_variance_criterion(hist_rows, K, sizes):
    rng = np.random.default_rng(7 + K)
    n_rows, n_features, missing_bin = 300, 4, 16
    binned = _binned(rng, n_rows, n_features, 12, missing_bin, 0.1)
    cls = np.where(rng.random(n_rows) < 0.6, binned[1] % K, rng.integers(0, K, n_rows))
    y = one_hot(cls, np.arange(K)) - 0.5
    leaf, alpha, min_split = sizes
    var, hot = _pair(K, min_samples_leaf=leaf, alpha=alpha)
    ch, full = hot.make_channels(y), var.make_channels(y)
    rows, starts, tree, node, depth, nxt = random_tasks(rng, 3, n_rows, [60, 7, 1, 25])
    kw = dict(min_samples_split=min_split, seed=11)
    args = (rows, starts, tree, node, depth, nxt, np.array([4, 9, 2]))
    got = grow_subtrees(binned, ch, *args, hot.compiled(), missing_bin, hist_rows=hist_rows, **kw)
    ref = grow_subtrees_reference(binned, ch, *args, hot, np.full(n_features, 12), missing_bin, **kw)
    grown_v = grow_subtrees(binned, full, *args, var.compiled(), missing_bin, hist_rows=hist_rows, **kw)
    assert len(got.ints) > 30
    for other in (ref, grown_v):
        np.testing.assert_array_equal(got.tree_starts, other.tree_starts)
        np.testing.assert_array_equal(got.ints, other.ints)
    # the children's sums: the reference's and the variance criterion's without the last class
    c = K
    np.testing.assert_array_equal(got.floats[:, 1:], ref.floats[:, 1:])
    keep = [1 + side * (c + 1) + k for side in (0, 1) for k in range(c)]
    np.testing.assert_array_equal(got.floats[:, 1:], grown_v.floats[:, keep])
    np.testing.assert_allclose(got.floats[:, 0], ref.floats[:, 0], rtol=1e-12)
    np.testing.assert_allclose(got.floats[:, 0], grown_v.floats[:, 0], rtol=1e-12)


def test_refuses_a_single_class():
    with pytest.raises(ValueError, match="n_classes must be >= 2"):
        OneHotCriterion(1, 0.5)

"""Exact small-node growth (forest.engine.local_growth) against slow references."""
import numpy as np
import pytest

from forest.criteria.causal import CausalCriterion
from forest.criteria.basic import VarianceCriterion
from forest.engine.local_growth import grow_subtrees, grow_subtrees_reference

from causal_helpers import causal_rows
from subtree_tasks import random_tasks


def _causal_channels(rng, n, crit, p_treat=0.4):
    w = (rng.random(n) < p_treat).astype(float)
    y = rng.normal(size=n) + w * rng.normal(size=n)
    wc = w - p_treat
    yc = y - y.mean()
    return crit.make_channels(wc, yc, rng.uniform(0.5, 2.0, n), w)


def test_variance_scalar_gain_equals_vectorised():
    rng = np.random.default_rng(3)
    for n_targets in (1, 3):
        crit = VarianceCriterion(n_targets, min_samples_leaf=3, min_weight_leaf=0.5, count_channel=True)
        ng = crit.compiled()
        for _ in range(300):
            nl, nr = rng.integers(0, 8, 2)
            left = np.concatenate([[rng.uniform(0, 5) * (nl > 0)], rng.normal(size=n_targets), [nl]])
            right = np.concatenate([[rng.uniform(0, 5) * (nr > 0)], rng.normal(size=n_targets), [nr]])
            parent = left + right
            ref = float(crit.gain(left, right, parent))
            got = ng(left, right, parent)
            if np.isinf(ref):
                assert got == ref
            else:
                assert got == pytest.approx(ref, rel=1e-12, abs=1e-12)
    # without a count channel the weight is the count
    crit = VarianceCriterion(1, min_samples_leaf=2)
    ng = crit.compiled()
    for wl in (0.0, 1.0, 2.0, 3.0):
        left, right = np.array([wl, 0.3 * wl]), np.array([2.0, -1.0])
        assert ng(left, right, left + right) == float(crit.gain(left, right, left + right))


@pytest.mark.parametrize("penalty", [0.0, 0.5])
def test_causal_scalar_gain_equals_vectorised(penalty):
    rng = np.random.default_rng(4)
    crit = CausalCriterion(1, 1, min_samples_leaf=3, alpha=0.05, imbalance_penalty=penalty)
    ng = crit.compiled()
    n_inf = 0
    for _ in range(300):
        n = int(rng.integers(2, 40))
        ch = _causal_channels(rng, n, crit)
        cut = int(rng.integers(0, n + 1))
        left, right = ch[:cut].sum(axis=0), ch[cut:].sum(axis=0)
        parent = ch.sum(axis=0)
        ref = float(crit.gain(left, right, parent))
        got = ng(left, right, parent)
        if np.isinf(ref):
            n_inf += 1
            assert got == ref
        else:
            assert got == ref  # same operations in the same order
    assert 0 < n_inf < 300
    # degenerate parent (no treatment spread): every split is invalid
    ch = _causal_channels(rng, 20, crit)
    ch[:, 1] = 0.0
    ch[:, 3] = 0.0
    ch[:, 4] = 0.0
    assert ng(ch[:10].sum(0), ch[10:].sum(0), ch.sum(0)) == -np.inf




def _binned(rng, n_rows, n_features, n_values, missing_bin, p_missing):
    codes = rng.integers(0, n_values, size=(n_features, n_rows))
    codes[rng.random((n_features, n_rows)) < p_missing] = missing_bin
    codes[0, :] = rng.integers(2, n_values, size=n_rows)  # feature 0 never uses bins 0, 1
    return codes.astype(np.uint8)


def _compare(a, b, c):
    assert np.array_equal(a.tree_starts, b.tree_starts)
    assert np.array_equal(a.ints, b.ints)
    np.testing.assert_allclose(a.floats, b.floats, rtol=1e-9, atol=1e-9)


# hist_rows: None keeps these small tasks on the sorted-code scan; 0 and 20 put every
# node (of more than 0 / 20 rows) on the histogram path with sibling subtraction.
# sizes: (min_samples_leaf, alpha, min_samples_split, imbalance_penalty) of scikit-learn's rules and of grf's
# (forest.estimators.regression_forest.size_rules); the weights are not 1, so a size limit
# that compared weights instead of the count channel would grow other trees than the reference.
@pytest.mark.parametrize("hist_rows", [None, 0, 20])
@pytest.mark.parametrize("mtry,max_depth,missing", [(None, None, 0.0), (None, 4, 0.15), (2, None, 0.15)])
@pytest.mark.parametrize("sizes", [(3, 0.0, 6.0, 0.0), (1, 0.1, 6.0, 0.0), (1, 0.0, 4.0, 0.2)])
def test_grow_subtrees_variance_matches_reference(mtry, max_depth, missing, hist_rows, sizes):
    rng = np.random.default_rng(5)
    n_rows, n_features, missing_bin = 300, 4, 16
    binned = _binned(rng, n_rows, n_features, 12, missing_bin, missing)
    nb = np.full(n_features, 12)
    y = rng.normal(size=n_rows) + binned[1] * 0.1
    leaf, alpha, min_split, penalty = sizes
    crit = VarianceCriterion(1, min_samples_leaf=leaf, count_channel=True, alpha=alpha, imbalance_penalty=penalty)
    ch = crit.make_channels(y, rng.uniform(0.5, 2, n_rows))
    rows, starts, tree, node, depth, nxt = random_tasks(rng, 3, n_rows, [60, 7, 1, 25])
    kw = dict(min_samples_split=min_split, max_depth=max_depth, mtry=mtry, seed=11)
    got = grow_subtrees(binned, ch, rows, starts, tree, node, depth, nxt, np.array([4, 9, 2]), crit.compiled(),
                        missing_bin, hist_rows=hist_rows, **kw)
    ref = grow_subtrees_reference(binned, ch, rows, starts, tree, node, depth, nxt, np.array([4, 9, 2]), crit, nb,
                                  missing_bin, **kw)
    assert len(got.ints) > 30
    _compare(got, ref, ch.shape[1])
    if missing:
        assert set(got.ints[:, 5]) == {0, 1}


@pytest.mark.parametrize("hist_rows", [None, 0, 20])
@pytest.mark.parametrize("sizes", [(3, 0.0, 6.0, 0.0), (1, 0.1, 6.0, 0.0), (2, 0.0, 4.0, 0.2)])
def test_unit_weights_need_no_count_channel(hist_rows, sizes):
    """rows_are_weights (RegressionForest without weights): the weight channel counts the rows,
    so the subtrees, gains and node sums equal the count channel's bit for bit."""
    rng = np.random.default_rng(12)
    n_rows, n_features, missing_bin = 300, 4, 16
    binned = _binned(rng, n_rows, n_features, 12, missing_bin, 0.1)
    y = rng.normal(size=(n_rows, 2)) + binned[1][:, None] * 0.1
    leaf, alpha, min_split, penalty = sizes
    rows, starts, tree, node, depth, nxt = random_tasks(rng, 3, n_rows, [60, 7, 1, 25])
    grown = []
    for layout in (dict(count_channel=True), dict(rows_are_weights=True)):
        crit = VarianceCriterion(2, min_samples_leaf=leaf, alpha=alpha, imbalance_penalty=penalty, **layout)
        ch = crit.make_channels(y)
        grown.append((grow_subtrees(binned, ch, rows, starts, tree, node, depth, nxt, np.array([4, 9, 2]),
                                    crit.compiled(), missing_bin, hist_rows=hist_rows, min_samples_split=min_split,
                                    seed=11), ch.shape[1]))
    (counted, c_full), (unit, c_unit) = grown
    assert c_unit == c_full - 1 and len(unit.ints) > 30
    np.testing.assert_array_equal(unit.tree_starts, counted.tree_starts)
    np.testing.assert_array_equal(unit.ints, counted.ints)
    np.testing.assert_array_equal(unit.floats, _without_count(counted.floats, c_full))


def _without_count(floats, c, i_count=None):
    """Split records' floats (gain, left sums (C), right sums (C)) without the sums' count channel
    (channel ``i_count``, the last by default)."""
    i_count = c - 1 if i_count is None else i_count
    keep = [0] + [1 + side * c + k for side in (0, 1) for k in range(c) if k != i_count]
    return floats[:, keep]


@pytest.mark.parametrize("hist_rows", [None, 0, 30])
def test_grow_subtrees_causal_matches_reference(hist_rows):
    rng = np.random.default_rng(6)
    n_rows, n_features, missing_bin = 400, 3, 10
    binned = _binned(rng, n_rows, n_features, 8, missing_bin, 0.1)
    crit = CausalCriterion(1, 1, min_samples_leaf=4)
    ch = _causal_channels(rng, n_rows, crit)
    rows, starts, tree, node, depth, nxt = random_tasks(rng, 2, n_rows, [150, 40])
    nb = np.full(n_features, 8)
    got = grow_subtrees(binned, ch, rows, starts, tree, node, depth, nxt, np.array([0, 1]), crit.compiled(),
                        missing_bin, min_samples_split=8.0, hist_rows=hist_rows)
    ref = grow_subtrees_reference(binned, ch, rows, starts, tree, node, depth, nxt, np.array([0, 1]), crit, nb,
                                  missing_bin, min_samples_split=8.0)
    assert len(got.ints) > 10
    _compare(got, ref, ch.shape[1])


@pytest.mark.parametrize("max_hist_slots", [1, 2, 3])
def test_histogram_slots_exhausted_fall_back_to_the_scan(max_hist_slots):
    """With every node on the histogram path (hist_rows 0) and only 1-3 slots, most
    big nodes meet all slots live and take the sorted-code scan instead: the trees
    must not change (variance and causal, against the reference and the default)."""
    rng = np.random.default_rng(8)
    n_rows, n_features, missing_bin = 400, 3, 10
    binned = _binned(rng, n_rows, n_features, 8, missing_bin, 0.1)
    nb = np.full(n_features, 8)
    for crit, ch in [(VarianceCriterion(1, min_samples_leaf=2, count_channel=True), None),
                     (CausalCriterion(1, 1, min_samples_leaf=3), None)]:
        if isinstance(crit, VarianceCriterion):
            ch = crit.make_channels(rng.normal(size=n_rows) + binned[1] * 0.2, rng.uniform(0.5, 2, n_rows))
        else:
            ch = _causal_channels(rng, n_rows, crit)
        rows, starts, tree, node, depth, nxt = random_tasks(rng, 2, n_rows, [200, 90])
        args = (binned, ch, rows, starts, tree, node, depth, nxt, np.array([0, 1]))
        few = grow_subtrees(*args, crit.compiled(), missing_bin, min_samples_split=4.0, hist_rows=0,
                            max_hist_slots=max_hist_slots)
        plenty = grow_subtrees(*args, crit.compiled(), missing_bin, min_samples_split=4.0, hist_rows=0)
        ref = grow_subtrees_reference(*args, crit, nb, missing_bin, min_samples_split=4.0)
        assert len(few.ints) > 20
        _compare(few, ref, ch.shape[1])
        _compare(few, plenty, ch.shape[1])


@pytest.mark.parametrize("hist_rows", [None, 40])
@pytest.mark.parametrize("p_treat", [0.12, 0.88])
def test_grow_subtrees_causal_rare_arm_matches_reference(p_treat, hist_rows):
    # Many distinct codes and a rare arm: the per-arm minimum binds at both ends of
    # most scans, where the kernel skips candidates and stops scans early without
    # scoring them; the reference scores every threshold.
    rng = np.random.default_rng(7)
    n_rows, n_features, missing_bin = 500, 3, 80
    binned = _binned(rng, n_rows, n_features, 70, missing_bin, 0.05)
    crit = CausalCriterion(1, 1, min_samples_leaf=3)
    ch = _causal_channels(rng, n_rows, crit, p_treat)
    rows, starts, tree, node, depth, nxt = random_tasks(rng, 2, n_rows, [300, 60])
    nb = np.full(n_features, 70)
    got = grow_subtrees(binned, ch, rows, starts, tree, node, depth, nxt, np.array([3, 5]), crit.compiled(),
                        missing_bin, min_samples_split=6.0, hist_rows=hist_rows)
    ref = grow_subtrees_reference(binned, ch, rows, starts, tree, node, depth, nxt, np.array([3, 5]), crit, nb,
                                  missing_bin, min_samples_split=6.0)
    assert len(got.ints) > 10
    _compare(got, ref, ch.shape[1])

def test_grow_subtrees_ids_and_row_order_invariance():
    """Ids are contiguous per tree (parents first); the result depends on the rows only."""
    rng = np.random.default_rng(7)
    n_rows, missing_bin = 200, 16
    binned = _binned(rng, n_rows, 3, 16, missing_bin, 0.0)
    crit = VarianceCriterion(1, min_samples_leaf=2, count_channel=True)
    ch = crit.make_channels(rng.normal(size=n_rows))
    rows = np.arange(n_rows)
    args = (np.array([0, n_rows]), np.array([0]), np.array([5]), np.array([2]), np.array([6]), np.array([0]),
            crit.compiled(), missing_bin)
    a = grow_subtrees(binned, ch, rows, *args)
    ids = a.ints[:, 1]
    assert np.array_equal(ids, 6 + 2 * np.arange(len(ids)))
    assert np.all(a.ints[:, 0] < a.ints[:, 1])
    # the same rows stored elsewhere (a permuted copy, addressed in the same order)
    perm = rng.permutation(n_rows)
    inv = np.argsort(perm)
    b = grow_subtrees(np.ascontiguousarray(binned[:, perm]), ch[perm], inv, *args)
    assert np.array_equal(a.ints, b.ints) and np.array_equal(a.floats, b.floats)


#: (K, M, constraint): multi-arm, a 2-column continuous treatment, two outcomes.
VECTOR_CASES = [(2, 1, "arms"), (3, 1, "arms"), (5, 1, "arms"), (2, 1, "sign"), (1, 2, "arms"), (2, 2, "arms")]


@pytest.mark.parametrize("hist_rows", [None, 0, 40])
@pytest.mark.parametrize("K,M,kind", VECTOR_CASES)
def test_grow_subtrees_vector_causal_matches_reference(K, M, kind, hist_rows):
    rng = np.random.default_rng(K * 10 + M + len(kind))
    n_rows, n_features, missing_bin = 500, 3, 12
    binned = _binned(rng, n_rows, n_features, 10, missing_bin, 0.08)
    crit = CausalCriterion(K, M, min_samples_leaf=2, constraint=kind)
    wc, y, g, ind = causal_rows(rng, n_rows, K, M, kind)
    y[:, 0] += 2.0 * wc[:, 0] * (binned[1] > 5)   # an effect that splits on feature 1
    ch = crit.make_channels(wc, y, g, ind)
    rows, starts, tree, node, depth, nxt = random_tasks(rng, 2, n_rows, [300, 90])
    nb = np.full(n_features, 10)
    kw = dict(min_samples_split=4.0, mtry=2, seed=3)
    got = grow_subtrees(binned, ch, rows, starts, tree, node, depth, nxt, np.array([1, 4]), crit.compiled(),
                        missing_bin, hist_rows=hist_rows, **kw)
    ref = grow_subtrees_reference(binned, ch, rows, starts, tree, node, depth, nxt, np.array([1, 4]), crit, nb,
                                  missing_bin, **kw)
    assert len(got.ints) > 8
    _compare(got, ref, ch.shape[1])


@pytest.mark.parametrize("hist_rows", [None, 0])
@pytest.mark.parametrize("K,M,kind,penalty", [(1, 1, "arms", 0.0), (1, 1, "arms", 0.3), (1, 1, "rows", 0.3),
                                              (2, 1, "arms", 0.0), (2, 1, "rows", 0.0), (2, 1, "sign", 0.2)])
def test_unit_weights_causal_needs_no_count_channel(K, M, kind, penalty, hist_rows):
    """rows_are_weights (a CausalForest without weights): channel g counts the rows, so the
    subtrees, gains and sums equal the count channel's bit for bit, in the scalar, general
    and "rows" kernels alike."""
    rng = np.random.default_rng(20 + K + len(kind))
    n_rows, n_features, missing_bin = 400, 3, 12
    binned = _binned(rng, n_rows, n_features, 10, missing_bin, 0.08)
    wc, y, _, ind = causal_rows(rng, n_rows, K, M, "sign" if kind == "sign" else "arms")
    y[:, 0] += 2.0 * wc[:, 0] * (binned[1] > 5)
    rows, starts, tree, node, depth, nxt = random_tasks(rng, 2, n_rows, [250, 90])
    grown = []
    for unit in (False, True):
        crit = CausalCriterion(K, M, min_samples_leaf=3, constraint=kind, imbalance_penalty=penalty,
                               rows_are_weights=unit)
        ch = crit.make_channels(wc, y, np.ones(n_rows), ind)
        grown.append((grow_subtrees(binned, ch, rows, starts, tree, node, depth, nxt, np.array([1, 4]),
                                    crit.compiled(), missing_bin, hist_rows=hist_rows, min_samples_split=6.0,
                                    seed=3), ch, crit))
    (counted, ch_full, crit_full), (unit, ch_unit, crit_unit) = grown
    keep = [c for c in range(ch_full.shape[1]) if c != crit_full.layout.i_count]
    np.testing.assert_array_equal(ch_unit, ch_full[:, keep])
    assert len(unit.ints) > 8
    np.testing.assert_array_equal(unit.ints, counted.ints)
    np.testing.assert_array_equal(unit.floats, _without_count(counted.floats, ch_full.shape[1],
                                                              crit_full.layout.i_count))
    # the NumPy criterion and the leaf values agree too
    lefts = ch_full[:150].sum(axis=0)
    parent = ch_full.sum(axis=0)
    assert crit_unit.gain(lefts[keep], (parent - lefts)[keep], parent[keep]) == \
        crit_full.gain(lefts, parent - lefts, parent)
    np.testing.assert_array_equal(crit_unit.node_value(parent[keep]), crit_full.node_value(parent))


@pytest.mark.parametrize("n_rows,sizes", [(300, [150, 40]), (6000, [2500, 2400])])
def test_shared_specialisation_grows_the_same_subtrees_in_one_kernel(n_rows, sizes):
    """Nuisance (variance) and causal subtrees through one paired kernel: the same records.

    The larger case has enough rows for the multi-threaded kernel (trees in parallel).
    """
    import numba

    from forest.criteria import compiled as cc
    from forest.engine import local_growth

    rng = np.random.default_rng(8)
    n_features, missing_bin = 3, 10
    binned = _binned(rng, n_rows, n_features, 8, missing_bin, 0.1)
    cau = CausalCriterion(1, 1, min_samples_leaf=4)
    var = VarianceCriterion(1, min_samples_leaf=4, count_channel=True)
    rows, starts, tree, node, depth, nxt = random_tasks(rng, 2, n_rows, sizes)
    chans = {"var": var.make_channels(rng.normal(size=n_rows), rng.uniform(0.5, 2, n_rows)),
             "cau": _causal_channels(rng, n_rows, cau)}

    def grow(crit, ch):
        return grow_subtrees(binned, ch, rows, starts, tree, node, depth, nxt, np.array([0, 1]), crit.compiled(),
                             missing_bin, min_samples_split=8.0, hist_rows=30)

    threads = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        alone = {"var": grow(var, chans["var"]), "cau": grow(cau, chans["cau"])}
        with cc.shared_specialisation(cau.compiled()):
            shared = {"var": grow(var, chans["var"]), "cau": grow(cau, chans["cau"])}
    finally:
        numba.set_num_threads(threads)
    for k in alone:
        assert len(alone[k].ints) > 10
        np.testing.assert_array_equal(shared[k].ints, alone[k].ints)
        np.testing.assert_array_equal(shared[k].floats, alone[k].floats)
    # both fits ran one specialisation, the pair's (other tests may have compiled other pairs)
    kernel = local_growth._grow_trees
    if n_rows > local_growth._SERIAL_ROWS and numba.config.NUMBA_NUM_THREADS > 1:
        kernel = local_growth._grow_trees_parallel_paired  # the pair travels as its parts
    assert any("VarianceRecord" in str(s) and "CausalScalarRecord" in str(s) for s in kernel.signatures)

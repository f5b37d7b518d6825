"""The compiled best-first loop (forest.engine.best_first) grows the Python loop's trees, bit for bit.

``LeafwiseGrower`` grows one process's numeric boosting trees in one compiled call; the
Python loop (``compiled_best_first=False``) is its reference, itself checked against brute
force in test_grower.py. Every field of every node, the rows' order and the leaves' row
segments must be equal, including where the parallel kernels run (thresholds lowered so
that small data reach them) and where the histogram pool has to grow.
"""
import numba
import numpy as np
import pytest

from forest import GBDTClassifier, GBDTRegressor
from forest.criteria.basic import NewtonCriterion
from forest.engine.expansion import LeafwiseGrower
from forest.engine.growth_options import engine_options
from forest.profiling import TIMER, FitTrace
from histogram.binning import BinMapper
from native.comm import SelfCommunicator

SELF = SelfCommunicator()
FIELDS = ("feature", "bin_threshold", "threshold", "missing_left", "left", "right", "gain", "weight", "count",
          "impurity", "depth", "value")


def _assert_same_grown(a, b):
    assert a.tree.node_count == b.tree.node_count
    for name in FIELDS:
        np.testing.assert_array_equal(getattr(a.tree, name), getattr(b.tree, name), err_msg=name)
    np.testing.assert_array_equal(a.rows, b.rows)
    np.testing.assert_array_equal(a.leaf_nodes, b.leaf_nodes)
    np.testing.assert_array_equal(a.leaf_starts, b.leaf_starts)
    np.testing.assert_array_equal(a.leaf_stops, b.leaf_stops)


def _design(rng, n, d, missing=0.1, max_bins=255):
    X = rng.normal(size=(n, d))
    X[:, -1] = np.round(X[:, -1])  # a feature with few distinct values (empty bins)
    X[rng.random(X.shape) < missing] = np.nan
    z = np.nan_to_num(X[:, 0] * X[:, 1] + np.sin(3 * X[:, 2]) + (d > 3) * X[:, 3])
    mapper = BinMapper(max_bins=max_bins).fit(X)
    g = -(z + 0.5 * rng.normal(size=n))
    h = rng.uniform(0.2, 1.0, size=n)
    return mapper, mapper.transform(X), np.column_stack([g, h])


def _grow_both(mapper, binned, channels, rows=None, engine=None, **grower_kw):
    out = []
    crit = grower_kw.pop("criterion", None) or NewtonCriterion(min_samples_leaf=5)
    for compiled in (False, True):
        with engine_options(compiled_best_first=compiled, **(engine or {})):
            grower = LeafwiseGrower(binned, mapper, crit, comm=SELF, **grower_kw)
            assert grower._compiled == compiled
            out.append(grower.grow(channels, rows=rows, shrinkage=0.1))
    return out


@pytest.fixture
def two_threads():
    """Two Numba threads where the machine allows it (the parallel kernels' paths)."""
    before = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    yield numba.get_num_threads()
    numba.set_num_threads(before)


@pytest.mark.parametrize("seed, n, d, kw", [
    (0, 400, 4, {}),
    (1, 3000, 12, {"max_leaf_nodes": 63}),
    (2, 3000, 6, {"max_depth": 3, "max_leaf_nodes": 31}),
    (3, 2000, 5, {"min_gain": 5.0}),
    (4, 2500, 8, {"max_leaf_nodes": 2}),
    (5, 3000, 8, {"max_leaf_nodes": 255, "criterion": NewtonCriterion(l2_regularization=1.0, min_samples_leaf=1)}),
])
def test_compiled_loop_grows_the_python_loops_tree(seed, n, d, kw):
    mapper, binned, channels = _design(np.random.default_rng(seed), n, d)
    a, b = _grow_both(mapper, binned, channels, **kw)
    _assert_same_grown(a, b)
    assert a.tree.node_count > 1


def test_many_live_histograms_grow_the_pool():
    """Depth-limited, leaf-unlimited in practice: hundreds of splittable leaves at once."""
    mapper, binned, channels = _design(np.random.default_rng(7), 6000, 6, missing=0.0)
    a, b = _grow_both(mapper, binned, channels, max_leaf_nodes=400,
                      criterion=NewtonCriterion(min_samples_leaf=2, min_child_weight=0.0))
    _assert_same_grown(a, b)
    assert b.tree.node_count > 2 * 64  # more leaves than the pool's first pairs


def test_row_subset_few_bins_and_no_missing():
    rng = np.random.default_rng(8)
    mapper, binned, channels = _design(rng, 4000, 5, missing=0.0, max_bins=20)
    rows = np.sort(rng.choice(4000, size=2500, replace=False)).astype(np.int32)
    a, b = _grow_both(mapper, binned, channels, rows=rows, max_leaf_nodes=40)
    _assert_same_grown(a, b)


def test_parallel_kernels_inside_the_loop(two_threads):
    """Thresholds lowered so small nodes take the row-split histogram builds (whose sums depend
    on the thread count) and, in the Python loop, the block partition and the two-node parallel
    search (40 features x 255 bins >= 8,192), which the compiled loop runs serially: the same
    results."""
    mapper, binned, channels = _design(np.random.default_rng(9), 5000, 40)
    for split in ("rows", "features"):
        engine = {"gh_parallel_rows": 64, "partition_blocks_min_rows": 256, "gh_hist_split": split}
        a, b = _grow_both(mapper, binned, channels, engine=engine, max_leaf_nodes=31)
        _assert_same_grown(a, b)


@pytest.mark.parametrize("est, kw", [
    (GBDTClassifier, {"early_stopping": True, "validation_fraction": 0.2}),
    (GBDTRegressor, {"min_samples_leaf": 30, "max_depth": 5, "l2_regularization": 2.0}),
])
def test_gbdt_fits_are_equal(est, kw):
    rng = np.random.default_rng(10)
    X = rng.normal(size=(3000, 7))
    X[rng.random(X.shape) < 0.05] = np.nan
    z = np.nan_to_num(X[:, 0] * X[:, 1] + X[:, 2])
    y = (z + rng.normal(size=3000) > 0).astype(int) if est is GBDTClassifier else z + rng.normal(size=3000)
    w = rng.uniform(0.5, 2.0, size=3000)
    preds = []
    for compiled in (False, True):
        with engine_options(compiled_best_first=compiled):
            model = est(n_estimators=25, random_state=0, **kw).fit(X, y, sample_weight=w, comm=SELF)
        preds.append(model.predict(X) if est is GBDTRegressor else model.predict_proba(X))
    np.testing.assert_array_equal(preds[0], preds[1])


def test_traced_fits_take_the_python_loop():
    """A FitTrace prices the cost model's phases, so its fits keep them; others are one "local" phase."""
    mapper, binned, channels = _design(np.random.default_rng(11), 2000, 5)
    grower = LeafwiseGrower(binned, mapper, NewtonCriterion(min_samples_leaf=5), comm=SELF)
    assert grower._compiled
    before = dict(TIMER.calls)
    untraced = grower.grow(channels)
    assert TIMER.calls["local"] == before["local"] + 1
    assert TIMER.calls["split"] == before["split"]
    with FitTrace() as trace:
        traced = grower.grow(channels)
    assert {"histogram", "split", "partition"} <= set(trace.phase_seconds())
    assert "local" not in trace.phase_seconds()
    _assert_same_grown(untraced, traced)


def _categorical_design(rng, n, n_cats=(12, 300)):
    """Two numeric columns and categorical ones of ``n_cats`` categories (the wide one past 256
    codes, so uint16 codes), missing values in both kinds."""
    cols = [rng.normal(size=n), rng.normal(size=n)] + [rng.integers(0, k, size=n).astype(float) for k in n_cats]
    X = np.column_stack(cols)
    X[rng.random(X.shape) < 0.05] = np.nan
    effect = {j: rng.normal(size=k) for j, k in enumerate(n_cats)}
    z = np.nan_to_num(X[:, 0]) + sum(effect[j][np.nan_to_num(X[:, 2 + j]).astype(int)] for j in effect)
    mask = np.array([False, False] + [True] * len(n_cats))
    mapper = BinMapper(max_bins=255).fit(X, categorical=mask, n_codes=np.array([0, 0] + list(n_cats)))
    return mapper, mapper.transform(X), np.column_stack([-(z + rng.normal(size=n)), rng.uniform(0.2, 1.0, size=n)])


def test_categorical_features_take_the_python_loop():
    """Categorical features stay in the Python loop (the compiled loop's cold compile would
    grow by the categorical search's; forest.engine.best_first)."""
    mapper, binned, _ = _categorical_design(np.random.default_rng(12), 2000, (12, 40))
    grower = LeafwiseGrower(binned, mapper, NewtonCriterion(min_samples_leaf=10), comm=SELF)
    assert not grower._compiled


def test_categorical_gbdt_fits_are_equal():
    rng = np.random.default_rng(13)
    n = 4000
    X = np.column_stack([rng.normal(size=n), rng.integers(0, 30, size=n).astype(float), rng.normal(size=n)])
    y = (np.sin(X[:, 1]) + X[:, 0] + rng.normal(size=n) > 0).astype(int)
    preds = []
    for compiled in (False, True):  # the option changes nothing for them
        with engine_options(compiled_best_first=compiled):
            model = GBDTClassifier(n_estimators=20, categorical_features=[1], random_state=0).fit(X, y, comm=SELF)
        preds.append(model.predict_proba(X))
    np.testing.assert_array_equal(preds[0], preds[1])

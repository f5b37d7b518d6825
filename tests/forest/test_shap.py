"""TreeSHAP (issue 35): the compiled kernel against brute-force Shapley values and the
shap package, additivity of every estimator's ``shap_values``, and the same values at
any rank count."""
import warnings

import numba
import numpy as np
import pandas as pd
import pytest

from forest import CausalForest, GBDTClassifier, GBDTRegressor, InstrumentalForest, RegressionForest
from forest._validation import validate_features
from forest.analysis.inference import solve_theta
from forest.engine.predictor import predict_values
from forest.engine.tree import Tree, pack_trees
from forest.engine.treeshap import (BLOCK, count_fractions, expected_values, honest_fractions, shap_tree_dicts,
                                    tree_shap, tree_shap_reference)
from native import collectives as col
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _data(n=600, p=5, seed=0, nan=0.08):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    X[rng.random(X.shape) < nan] = np.nan
    z = np.nan_to_num(X)
    y = 2 * z[:, 0] + z[:, 1] * z[:, 2] + np.sin(3 * z[:, 3]) + rng.normal(scale=0.5, size=n)
    return X, y, rng


def _check_reference(packed, X, frac, value=None):
    phi = tree_shap(packed, X, frac, value)
    ref, expected = tree_shap_reference(packed, X, frac, value)
    np.testing.assert_allclose(phi, ref, rtol=0, atol=1e-12)
    np.testing.assert_allclose(expected_values(packed, frac, value).sum(axis=0), expected, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------- kernel vs brute force
def test_kernel_matches_brute_force_with_missing_values_and_repeated_features():
    X, y, _ = _data()
    # few features and many leaves: features repeat on paths (the merge of path elements)
    g = GBDTRegressor(n_estimators=4, max_leaf_nodes=12, early_stopping=False, random_state=0)
    g.fit(X[:, :3], y, comm=SELF)
    packed = g._packed_forest()
    feats = [packed["feature"][packed["tree_offsets"][0]:packed["tree_offsets"][1]]]
    assert any(len(set(f[f >= 0])) < (f >= 0).sum() for f in feats)
    _check_reference(packed, X[:40, :3], count_fractions(packed))


def test_kernel_matches_brute_force_on_multiclass_vectors():
    X, y, _ = _data(seed=1)
    c = GBDTClassifier(n_estimators=3, max_leaf_nodes=8, early_stopping=False, random_state=0)
    c.fit(X, np.digitize(y, [-1, 1]), comm=SELF)
    packed = c._packed_forest()
    assert packed["value"].shape[1] == 3
    _check_reference(packed, X[:30], count_fractions(packed))


def test_kernel_matches_brute_force_on_categorical_splits():
    rng = np.random.default_rng(3)
    n = 1500
    names = np.array([f"L{i}" for i in range(12)])
    cat = rng.integers(0, 12, n)
    x = rng.normal(size=(n, 2))
    X = pd.DataFrame({"x0": x[:, 0], "c": pd.Categorical(names[cat], categories=names), "x1": x[:, 1]})
    X.loc[rng.random(n) < 0.05, "x0"] = np.nan
    y = 2.0 * np.isin(cat, [0, 3, 5, 8]) + x[:, 0] + rng.normal(scale=0.3, size=n)
    g = GBDTRegressor(n_estimators=4, max_leaf_nodes=8, early_stopping=False, random_state=0).fit(X, y, comm=SELF)
    packed = g._packed_forest()
    assert (packed["bin_threshold"][packed["feature"] >= 0] < 0).any(), "no categorical split to test"
    Xc = validate_features(g, X.iloc[:40], reset=False)
    Xc[3, 1] = np.nan          # a missing category takes the missing direction
    Xc[4, 1] = 40.0            # a code the forest never saw, likewise
    _check_reference(packed, Xc, count_fractions(packed))
    sv = g.shap_values(X.iloc[:40])
    np.testing.assert_allclose(sv.sum(axis=1), g.predict(X.iloc[:40]), rtol=0, atol=1e-12)


def test_honest_covers_give_filled_nodes_no_weight_and_match_brute_force():
    X, y, _ = _data(n=300, seed=4)
    rf = RegressionForest(n_estimators=6, min_samples_leaf=2, random_state=3).fit(X, y, comm=SELF)
    packed = rf.estimators_
    frac = honest_fractions(packed, count_col=1)
    assert (frac == 0).any(), "expected leaves no estimation row reached"
    assert np.all((frac >= 0) & (frac <= 1))
    _check_reference(packed, X[:25], frac, np.ascontiguousarray(packed["value"][:, :1]))


def test_honest_fractions_of_a_hand_made_tree():
    # root (4 rows) -> left (all 4 rows: the same value row as the root) and right (no
    # row: given the root's value row, count included)
    t = Tree(n_outputs=2)
    t.add_node(0, 4.0, [1.0, 4.0])
    t.add_node(1, 3.0, [1.0, 4.0])
    t.add_node(1, 1.0, [1.0, 4.0])
    t.set_split(0, 0, 0, 0.0, 0, 1.0, 1, 2)
    # the left child is the real one: it splits further into leaves of 3 and 1 rows
    t.add_node(2, 2.0, [2.0, 3.0])
    t.add_node(2, 1.0, [-2.0, 1.0])
    t.set_split(1, 1, 0, 0.0, 0, 1.0, 3, 4)
    frac = honest_fractions(pack_trees([t]), count_col=1)
    np.testing.assert_array_equal(frac, [1.0, 1.0, 0.0, 0.75, 0.25])


def test_threads_do_not_change_a_bit():
    X, y, _ = _data(n=400, seed=5)
    g = GBDTRegressor(n_estimators=8, max_leaf_nodes=16, early_stopping=False, random_state=0).fit(X, y, comm=SELF)
    packed = g._packed_forest()
    frac = count_fractions(packed)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = tree_shap(packed, X, frac)
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = tree_shap(packed, X, frac)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(one, many)


def test_a_rows_values_do_not_depend_on_the_block_it_is_explained_in():
    # the kernel explains BLOCK rows per walk of a tree (a shorter last block); a
    # zero-cover child is skipped only when no row of the block takes it
    X, y, _ = _data(n=700, p=4, seed=12)
    g = GBDTRegressor(n_estimators=3, max_leaf_nodes=16, early_stopping=False, random_state=0).fit(X, y, comm=SELF)
    rf = RegressionForest(n_estimators=4, min_samples_leaf=2, random_state=3).fit(X, y, comm=SELF)
    n = 2 * BLOCK + 37
    for packed, frac, value in [
        (g._packed_forest(), count_fractions(g._packed_forest()), None),
        (rf.estimators_, honest_fractions(rf.estimators_, count_col=1),
         np.ascontiguousarray(rf.estimators_["value"][:, :1])),
    ]:
        together = tree_shap(packed, X[:n], frac, value)
        for i in (0, BLOCK - 1, BLOCK, 2 * BLOCK, n - 1):
            np.testing.assert_array_equal(tree_shap(packed, X[i:i + 1], frac, value)[0], together[i])
        picks = np.r_[0:5, BLOCK - 3:BLOCK + 3, n - 5:n]
        _check_reference(packed, X[picks], frac, value)


# ----------------------------------------------------------------------- against the shap package
def _shap_explainer(packed, frac, value=None):
    shap = pytest.importorskip("shap")
    return shap.TreeExplainer({"trees": shap_tree_dicts(packed, frac, value, root_cover=100.0)})


@pytest.mark.parametrize("kind", ["regressor", "binary", "multiclass"])
def test_gbdt_equals_shap_tree_explainer(kind):
    X, y, _ = _data(n=2000, p=6, seed=6)
    if kind == "regressor":
        est = GBDTRegressor(n_estimators=20, max_leaf_nodes=31, early_stopping=False, random_state=0)
        est.fit(X, y, comm=SELF)
    else:
        est = GBDTClassifier(n_estimators=15, max_leaf_nodes=31, early_stopping=False, random_state=0)
        est.fit(X, y > 0 if kind == "binary" else np.digitize(y, [-1, 1]), comm=SELF)
    ours = est.shap_values(X[:300])
    packed = est._packed_forest()
    explainer = _shap_explainer(packed, count_fractions(packed))
    theirs = np.asarray(explainer.shap_values(X[:300]))
    expected = np.asarray(explainer.expected_value, dtype=np.float64).ravel() + est.baseline_
    if kind == "multiclass":
        theirs = theirs.reshape(300, 6, 3)
        np.testing.assert_allclose(ours[:, :6, :], theirs, rtol=0, atol=1e-9)
        np.testing.assert_allclose(ours[:, 6, :], np.broadcast_to(expected, (300, 3)), rtol=0, atol=1e-9)
        raw = est.decision_function(X[:300])
    else:
        np.testing.assert_allclose(ours[:, :6], theirs.reshape(300, 6), rtol=0, atol=1e-9)
        np.testing.assert_allclose(ours[:, 6], expected[0], rtol=0, atol=1e-9)
        raw = est.predict(X[:300]) if kind == "regressor" else est.decision_function(X[:300])
    np.testing.assert_allclose(ours.sum(axis=1), raw, rtol=0, atol=1e-9)


def test_regression_forest_equals_shap_tree_explainer():
    X, y, _ = _data(n=3000, p=5, seed=7)
    rf = RegressionForest(n_estimators=30, min_samples_leaf=25, random_state=1).fit(X, y, comm=SELF)
    packed = rf.estimators_
    frac = honest_fractions(packed, count_col=1)
    # shap's dictionaries hold absolute covers: a zero cover would be 0 / 0 there
    assert (frac > 0).all()
    n_trees = len(packed["tree_offsets"]) - 1
    explainer = _shap_explainer(packed, frac, np.ascontiguousarray(packed["value"][:, :1]) / n_trees)
    ours = rf.shap_values(X[:300])
    np.testing.assert_allclose(ours[:, :5], np.asarray(explainer.shap_values(X[:300])), rtol=0, atol=1e-9)
    np.testing.assert_allclose(ours[:, 5], float(np.ravel(explainer.expected_value)[0]), rtol=0, atol=1e-9)
    np.testing.assert_allclose(ours.sum(axis=1), rf.predict(X[:300]), rtol=0, atol=1e-9)


# ----------------------------------------------------------------------- additivity
def _fits(X, y, rng):
    n = len(y)
    t = (rng.random(n) < 0.5).astype(float)
    arms = rng.integers(0, 3, n)
    z = (rng.random(n) < 0.5).astype(float)
    w = rng.random(n) + 0.5
    kw = dict(n_estimators=24, random_state=0)
    return [
        ("gbdt-reg", GBDTRegressor(n_estimators=10).fit(X, y, comm=SELF), "predict"),
        ("gbdt-binary", GBDTClassifier(n_estimators=10).fit(X, y > 0, comm=SELF), "decision_function"),
        ("gbdt-multi", GBDTClassifier(n_estimators=10).fit(X, np.digitize(y, [-1, 1]), comm=SELF),
         "decision_function"),
        ("rf", RegressionForest(**kw).fit(X, y, comm=SELF), "predict"),
        ("rf-weighted", RegressionForest(**kw).fit(X, y, sample_weight=w, comm=SELF), "predict"),
        ("rf-2-outputs", RegressionForest(**kw).fit(X, np.c_[y, -2 * y], comm=SELF), "predict"),
        ("causal", CausalForest(**kw).fit(X, t, y + t * np.nan_to_num(X[:, 0]), comm=SELF), "predict"),
        ("causal-weighted", CausalForest(**kw).fit(X, t, y, sample_weight=w, comm=SELF), "predict"),
        ("causal-3-arms", CausalForest(**kw).fit(X, arms, y + (arms == 1), comm=SELF), "predict"),
        ("causal-2-outcomes", CausalForest(**kw).fit(X, t, np.c_[y, y + t], comm=SELF), "predict"),
        ("instrumental", InstrumentalForest(**kw).fit(X, t, y, z, comm=SELF), "predict"),
    ]


def test_every_estimator_adds_up_to_its_output():
    X, y, rng = _data(n=800, p=4, seed=8)
    Xq = X[:200]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fits = _fits(X, y, rng)
    for name, est, method in fits:
        sv = est.shap_values(Xq)
        out = getattr(est, method)(Xq)
        assert sv.shape == out.shape[:1] + (X.shape[1] + 1,) + out.shape[1:], name
        ok = np.isfinite(out)
        assert ok.mean() > 0.9, name
        scale = 1.0 + np.abs(out[ok])
        assert np.all(np.abs(sv.sum(axis=1)[ok] - out[ok]) <= 1e-9 * scale), name
        if name.startswith(("gbdt", "rf-2", "rf")) and name != "rf-weighted":
            # exact TreeSHAP of a sum of trees: one base value for every row
            assert np.ptp(sv[:, -1], axis=0).max() < 1e-12, name


def test_effect_contributions_are_the_linearised_effect_of_each_features_moments():
    X, y, rng = _data(n=800, p=4, seed=9)
    t = (rng.random(len(y)) < 0.5).astype(float)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cf = CausalForest(n_estimators=24, random_state=0).fit(X, t, y + t * np.nan_to_num(X[:, 0]), comm=SELF)
    Xq = X[:20]
    sv = cf.shap_values(Xq)
    layout = cf._layout()
    packed = cf.estimators_
    frac = honest_fractions(packed, layout.n_moments)
    d_m = tree_shap(packed, Xq, frac, np.ascontiguousarray(packed["value"][:, :layout.n_moments]))
    d_m /= len(packed["tree_offsets"]) - 1
    mbar = cf._mean_moments(Xq)[:, :layout.n_moments]
    h = 1e-6
    for j in range(X.shape[1]):
        up = solve_theta(mbar + h * d_m[:, j], layout)[0][:, 0, 0]
        down = solve_theta(mbar - h * d_m[:, j], layout)[0][:, 0, 0]
        np.testing.assert_allclose(sv[:, j], (up - down) / (2 * h), rtol=1e-5, atol=1e-7)


def test_weighted_regression_forest_linearises_the_ratio():
    X, y, rng = _data(n=600, p=4, seed=10)
    rf = RegressionForest(n_estimators=16, random_state=0).fit(X, y, sample_weight=rng.random(600) + 0.5,
                                                                comm=SELF)
    Xq = X[:15]
    sv = rf.shap_values(Xq)
    packed = rf.estimators_
    n_trees = len(packed["tree_offsets"]) - 1
    parts = tree_shap(packed, Xq, honest_fractions(packed, 1), np.ascontiguousarray(packed["value"][:, [0, 2]]))
    parts /= n_trees
    mean = predict_values(packed, Xq) / n_trees
    pred = mean[:, 0] / mean[:, 2]
    h = 1e-6
    for j in range(X.shape[1]):
        up = (mean[:, 0] + h * parts[:, j, 0]) / (mean[:, 2] + h * parts[:, j, 1])
        down = (mean[:, 0] - h * parts[:, j, 0]) / (mean[:, 2] - h * parts[:, j, 1])
        np.testing.assert_allclose(sv[:, j], (up - down) / (2 * h), rtol=1e-5, atol=1e-8)
    np.testing.assert_allclose(sv.sum(axis=1), pred, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------- under mpirun
@pytest.mark.mpi
def test_shap_values_are_the_same_at_any_rank_count(comm):
    X, y, rng = _data(n=1200, p=4, seed=11)
    t = (rng.random(len(y)) < 0.5).astype(float)
    lo, hi = len(y) * comm.rank // comm.size, len(y) * (comm.rank + 1) // comm.size
    Xq = X[:150]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pairs = [
            (GBDTRegressor(n_estimators=10, random_state=0, early_stopping=False), (y,)),
            (RegressionForest(n_estimators=16, random_state=0), (y,)),
            (CausalForest(n_estimators=16, nuisance_estimators=8, random_state=0), (t, y + t)),
        ]
        for est, targets in pairs:
            dist = type(est)(**est.get_params()).fit(X[lo:hi], *(v[lo:hi] for v in targets), comm=comm)
            ref = type(est)(**est.get_params()).fit(X, *targets, comm=SELF)
            got = dist.shap_values(Xq)
            # the ranks hold one model: the same values, bit for bit, on every rank
            everyone = col.allgather_object(comm, got.tobytes())
            assert all(b == everyone[0] for b in everyone)
            # and it is the one-process model up to the summation order of leaf values
            np.testing.assert_allclose(got, ref.shap_values(Xq), rtol=1e-10, atol=1e-10)

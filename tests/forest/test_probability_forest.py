"""ProbabilityForest (issue 34): grf's probability forest, a RegressionForest on one-hot labels.

Known answers (a logistic design, weighted frequencies, calibration), bit-for-bit
agreement with the regression forest on one-hot targets, labels of every kind, input
errors, warm start, model files, and the same probabilities at any rank count (also
with a class that one rank lacks).
"""
import warnings

import numpy as np
import pytest

from forest.estimators.probability_forest import ProbabilityForest, one_hot
from forest.estimators.regression_forest import RegressionForest
from forest.io import model_io
from forest.io.merge import merge_forests
from native.blocks import block_range
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def logistic_design(n, seed=0):
    """``P(y = 1 | x) = logistic(2 x0)``, four noise features."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    p = 1.0 / (1.0 + np.exp(-2.0 * X[:, 0]))
    y = (rng.uniform(size=n) < p).astype(np.int64)
    return X, y, p


def three_class_design(n, seed=1):
    """Three classes by a softmax of (0, x0, x1 - x0): probabilities known at every x."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    logits = np.column_stack([np.zeros(n), 1.5 * X[:, 0], 1.5 * (X[:, 1] - X[:, 0])])
    P = np.exp(logits - logits.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    u = rng.uniform(size=n)
    y = (u[:, None] > np.cumsum(P, axis=1)).sum(axis=1)
    return X, np.array(["red", "green", "blue"])[y], P


def test_probabilities_near_the_truth_and_calibrated():
    X, y, _ = logistic_design(6000)
    Xt, yt, pt = logistic_design(2000, seed=9)
    forest = ProbabilityForest(n_estimators=100, random_state=3, oob_score=True).fit(X, y, comm=SELF)
    proba = forest.predict_proba(Xt)
    assert proba.shape == (2000, 2) and forest.classes_.tolist() == [0, 1] and forest.n_classes_ == 2
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    # The honest forest's error against the true probability: about 0.035 here. A swapped
    # class order, a leaf frequency off by one row, or no honesty adjustment exceed 0.06.
    assert np.mean(np.abs(proba[:, 1] - pt)) < 0.06
    # Calibration: mean predicted probability equals the class frequency (held-out and out of bag).
    assert abs(proba[:, 1].mean() - yt.mean()) < 0.02
    assert abs(forest.oob_decision_function_[:, 1].mean() - y.mean()) < 0.01
    assert np.mean(forest.predict(Xt) == yt) > 0.7
    assert forest.score(Xt, yt) == np.mean(forest.predict(Xt) == yt)
    assert forest.oob_score_ == np.mean(forest.oob_predict() == y) and forest.oob_score_ > 0.7


def test_three_text_classes():
    X, y, P = three_class_design(6000)
    Xt, yt, Pt = three_class_design(1500, seed=4)
    forest = ProbabilityForest(n_estimators=60, random_state=0, oob_score=True).fit(X, y, comm=SELF)
    assert forest.classes_.tolist() == ["blue", "green", "red"]      # sorted, as scikit-learn's
    proba = forest.predict_proba(Xt)
    truth = Pt[:, [2, 1, 0]]                                         # columns in classes_ order
    assert np.mean(np.abs(proba - truth)) < 0.07
    np.testing.assert_allclose(proba.mean(axis=0), [np.mean(yt == c) for c in forest.classes_], atol=0.03)
    assert set(forest.predict(Xt)) <= set(forest.classes_)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(forest.predict_log_proba(Xt), np.log(proba))
    labels = forest.oob_predict()
    assert labels.shape == (6000,) and np.mean(labels == y) > 0.6
    np.testing.assert_array_equal(forest.oob_predict(X, comm=SELF), labels)
    np.testing.assert_array_equal(forest.oob_predict_proba(X, comm=SELF), forest.oob_decision_function_)


@pytest.mark.parametrize("weighted", [False, True])
def test_bitwise_the_regression_forest_on_one_hot_targets(weighted):
    X, y, P = three_class_design(1500, seed=2)
    w = np.random.default_rng(5).uniform(0.2, 3.0, size=len(y)) if weighted else None
    kw = dict(n_estimators=12, random_state=11, min_samples_leaf=3, max_samples=0.7)
    prob = ProbabilityForest(oob_score=True, honest=True, **kw).fit(X, y, sample_weight=w, comm=SELF)
    reg = RegressionForest(**kw).fit(X, one_hot(y, np.unique(y)), sample_weight=w, comm=SELF)
    for key in prob.estimators_:
        if key == "gain" and not weighted:
            # unit weights grow on forest.criteria.one_hot's criterion: the same splits and sums,
            # gains one rounding from the exact ones (the variance criterion's: K per side)
            np.testing.assert_allclose(prob.estimators_[key], reg.estimators_[key], rtol=1e-12, atol=1e-12)
            continue
        np.testing.assert_array_equal(prob.estimators_[key], reg.estimators_[key])
    np.testing.assert_array_equal(prob.predict_proba(X), reg.predict(X))
    np.testing.assert_array_equal(prob.oob_decision_function_, reg.oob_prediction_)
    np.testing.assert_array_equal(prob.feature_importances_, reg.feature_importances_)
    np.testing.assert_allclose(prob.gain_importances_, reg.gain_importances_, rtol=1e-12)


def test_defaults_are_the_regression_forests_but_max_samples_and_honest():
    prob, reg = ProbabilityForest().get_params(), RegressionForest().get_params()
    assert prob.pop("max_samples") == 0.8 and reg.pop("max_samples") == 0.5
    assert prob.pop("oob_score") is False
    # honest="auto": the honest forest but on small data (forest.estimators.probability_choice)
    assert prob.pop("honest") == "auto" and reg.pop("honest") is True
    # grf's probability_forest has neither tune.parameters nor local linear splits
    for name in list(reg):
        if name.startswith(("tune_", "ll_split_")) or name == "enable_ll_split":
            del reg[name]
    assert prob == reg


def test_out_of_bag_in_fit_only_with_oob_score():
    X, y, _ = logistic_design(600)
    plain = ProbabilityForest(n_estimators=8, random_state=0).fit(X, y, comm=SELF)
    assert not hasattr(plain, "oob_decision_function_") and not hasattr(plain, "oob_score_")
    with pytest.raises(ValueError, match="oob_score=True; pass the training rows"):
        plain.oob_predict_proba()
    scored = ProbabilityForest(n_estimators=8, random_state=0, oob_score=True).fit(X, y, comm=SELF)
    np.testing.assert_array_equal(scored.predict_proba(X), plain.predict_proba(X))
    np.testing.assert_array_equal(plain.oob_predict_proba(X, comm=SELF), scored.oob_decision_function_)
    # a refit without it drops the earlier fit's
    scored.set_params(oob_score=False).fit(X, y, comm=SELF)
    assert not hasattr(scored, "oob_decision_function_") and not hasattr(scored, "oob_score_")
    with pytest.raises(TypeError, match="oob_score must be a bool"):
        ProbabilityForest(oob_score=1).fit(X, y, comm=SELF)


def test_weights_are_class_weights_in_the_frequencies():
    # y independent of X, class 1 given weight 3: every probability of class 1 is near 3/4.
    rng = np.random.default_rng(7)
    X = rng.normal(size=(4000, 3))
    y = rng.integers(0, 2, size=4000)
    w = np.where(y == 1, 3.0, 1.0)
    forest = ProbabilityForest(n_estimators=40, random_state=1).fit(X, y, sample_weight=w, comm=SELF)
    proba = forest.predict_proba(X[:500])
    assert abs(proba[:, 1].mean() - 0.75) < 0.02
    # a common factor changes nothing (a power of two: the rescaling to mean 1 is then exact;
    # other factors round the weights, which may flip near-tied splits of this pure-noise design)
    scaled = ProbabilityForest(n_estimators=40, random_state=1).fit(X, y, sample_weight=4 * w, comm=SELF)
    np.testing.assert_array_equal(scaled.predict_proba(X[:500]), proba)


@pytest.mark.parametrize("labels", [
    np.array([3, 7]), np.array([False, True]), np.array(["no", "yes"]), np.array(["no", "yes"], dtype=object),
    np.array([-1.0, 2.0])])
def test_label_types(labels):
    X, y01, _ = logistic_design(400)
    y = labels[y01]
    forest = ProbabilityForest(n_estimators=6, random_state=0).fit(X, y, comm=SELF)
    assert forest.classes_.tolist() == sorted(labels.tolist())
    pred = forest.predict(X)
    assert set(pred.tolist()) <= set(labels.tolist())
    assert forest.training_row_match(X, y).kind == "training"


@pytest.mark.parametrize("y, message", [
    (np.zeros(40, int), "needs at least 2 classes in y, got 1 class"),
    (np.r_[np.nan, np.ones(39)], "Input y contains NaN"),
    (np.array(["a", None] * 20, dtype=object), "y has 20 missing label(s) (None or NaN; first at row 1)"),
    (np.zeros((40, 2), int), "y should be a 1d array"),
    (np.linspace(0, 1, 40), "Unknown label type: continuous"),
    (np.array(["a", 1] * 20, dtype=object), "y mixes text and numeric labels"),
])
def test_bad_labels_are_refused_with_one_line(y, message):
    X = np.random.default_rng(0).normal(size=(40, 2))
    with pytest.raises(ValueError) as info:
        ProbabilityForest(n_estimators=2).fit(X, y, comm=SELF)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_warm_start_adds_trees_and_keeps_the_classes():
    X, y, _ = three_class_design(800)
    once = ProbabilityForest(n_estimators=10, random_state=2).fit(X, y, comm=SELF)
    warm = ProbabilityForest(n_estimators=5, random_state=2, warm_start=True).fit(X, y, comm=SELF)
    warm.set_params(n_estimators=10).fit(X, y, comm=SELF)
    np.testing.assert_array_equal(warm.predict_proba(X), once.predict_proba(X))
    with pytest.raises(ValueError, match="warm start: y has classes"):
        warm.set_params(n_estimators=12).fit(X, np.where(y == "red", "pink", y), comm=SELF)


def test_model_file_round_trip(tmp_path):
    X, y, _ = three_class_design(800)
    forest = ProbabilityForest(n_estimators=8, random_state=4, oob_score=True).fit(X, y, comm=SELF)
    path = str(tmp_path / "p.model")
    model_io.save(forest, path)
    back = model_io.load(path)
    assert type(back) is ProbabilityForest
    assert back.classes_.tolist() == forest.classes_.tolist() and back.n_classes_ == 3
    np.testing.assert_array_equal(back.predict_proba(X), forest.predict_proba(X))
    np.testing.assert_array_equal(back.predict(X), forest.predict(X))
    np.testing.assert_array_equal(back.oob_decision_function_, forest.oob_decision_function_)
    assert back.oob_score_ == forest.oob_score_ and back.oob_score is True


def test_rows_every_tree_drew_take_the_whole_forest_out_of_bag():
    # 600 rows, 10 trees of 80%: about 0.8**10 = 11% of the rows are in every tree
    X, y, _ = logistic_design(600)
    forest = ProbabilityForest(n_estimators=10, random_state=0, oob_score=True).fit(X, y, comm=SELF)
    proba = forest.oob_predict_proba(X, comm=SELF)
    assert not np.isnan(proba).any()
    np.testing.assert_array_equal(proba, forest.oob_decision_function_)
    np.testing.assert_array_equal(forest.oob_predict(X, comm=SELF), forest.classes_[proba.argmax(axis=1)])


def test_merged_forests_are_one_forest():
    X, y, _ = three_class_design(800)
    # honest=True: under "auto" each fit makes its own choice, and forests of different
    # choices are refused (tests/forest/test_probability_choice.py)
    a = ProbabilityForest(n_estimators=6, random_state=1, honest=True).fit(X, y, comm=SELF)
    b = ProbabilityForest(n_estimators=4, random_state=2, honest=True).fit(X, y, comm=SELF)
    merged = merge_forests([a, b])
    assert merged.classes_.tolist() == a.classes_.tolist() and "oob_decision_function_" not in vars(merged)
    proba = merged.predict_proba(X)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    np.testing.assert_allclose(proba, (6 * a.predict_proba(X) + 4 * b.predict_proba(X)) / 10, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(model_io.loads(model_io.dumps(merged)).predict_proba(X), proba)
    other = ProbabilityForest(n_estimators=4, random_state=3, honest=True).fit(X, np.where(y == "red", "pink", y),
                                                                              comm=SELF)
    with pytest.raises(ValueError, match="classes_"):
        merge_forests([a, other])


def test_model_file_of_another_kind_is_refused(tmp_path):
    X, y, _ = logistic_design(300)
    forest = ProbabilityForest(n_estimators=2).fit(X, y, comm=SELF)
    forest.n_classes_ = 3
    with pytest.raises(ValueError, match="n_classes_ is 3 but classes_ holds 2 labels"):
        model_io.loads(model_io.dumps(forest))


@pytest.mark.mpi
def test_same_probabilities_at_any_rank_count(comm):
    X, y, _ = three_class_design(900, seed=6)
    lo, hi = block_range(len(y), comm.size, comm.rank)
    kw = dict(n_estimators=10, random_state=5, max_bins=64, oob_score=True)
    dist = ProbabilityForest(**kw).fit(X[lo:hi], y[lo:hi], comm=comm)
    ref = ProbabilityForest(**kw).fit(X, y, comm=SELF)
    same_trees = all(np.array_equal(dist.estimators_[k], ref.estimators_[k], equal_nan=True)
                     for k in ref.estimators_)
    same_proba = np.array_equal(dist.predict_proba(X), ref.predict_proba(X))
    same_oob = np.array_equal(dist.oob_decision_function_, ref.oob_decision_function_[lo:hi])
    assert dist.classes_.tolist() == ref.classes_.tolist() and dist.oob_score_ == ref.oob_score_
    assert same_trees and same_proba and same_oob


@pytest.mark.mpi
def test_a_class_missing_on_a_rank(comm):
    # Rows sorted by label: with several ranks, rank 0 holds no "red" and the last rank no
    # "blue"; the classes are the union, coded alike on every rank, and weighted too.
    X, y, _ = three_class_design(900, seed=8)
    order = np.argsort(y, kind="stable")
    X, y = X[order], y[order]
    w = np.random.default_rng(1).uniform(0.5, 2.0, size=len(y))
    lo, hi = block_range(len(y), comm.size, comm.rank)
    kw = dict(n_estimators=8, random_state=3, max_bins=64)
    dist = ProbabilityForest(**kw).fit(X[lo:hi], y[lo:hi], sample_weight=w[lo:hi], comm=comm)
    ref = ProbabilityForest(**kw).fit(X, y, sample_weight=w, comm=SELF)
    assert dist.classes_.tolist() == ["blue", "green", "red"]
    assert comm.size == 1 or comm.rank != 0 or "red" not in set(y[lo:hi])
    # weighted leaf sums are added over ranks: equal up to the summation order
    np.testing.assert_allclose(dist.predict_proba(X), ref.predict_proba(X), rtol=0, atol=1e-12)


@pytest.mark.mpi
def test_ranks_with_labels_of_different_kinds_fail_together(comm):
    X, y, _ = logistic_design(200)
    lo, hi = block_range(len(y), comm.size, comm.rank)
    labels = y[lo:hi].astype(str) if comm.rank == 1 else y[lo:hi]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if comm.size == 1:
            pytest.skip("needs two ranks")
        with pytest.raises(ValueError, match="y holds text labels on rank 1 but number labels on rank 0"):
            ProbabilityForest(n_estimators=2).fit(X[lo:hi], labels, comm=comm)

"""ProbabilityForest's ``honest="auto"`` (forest.estimators.probability_choice, issue 34).

Known answers (the adaptive forest on a small nearly separable set, the honest forest on a
noisy design and above the row threshold, bit for bit ``honest=True`` there), the
candidates a user's settings leave, warm start, checkpoints, model files, and the same
choice and model at any rank count.
"""
import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer

from forest.estimators import probability_choice
from forest.estimators.probability_forest import ProbabilityForest
from forest.io import model_io
from forest.io.checkpoint import Checkpoint
from native.blocks import block_range
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def logistic_design(n, seed=0):
    """``P(y = 1 | x) = logistic(2 x0)``, four noise features: far from separable."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 5))
    p = 1.0 / (1.0 + np.exp(-2.0 * X[:, 0]))
    return X, (rng.uniform(size=n) < p).astype(np.int64)


def breast_cancer():
    X, y = load_breast_cancer(return_X_y=True)
    return X.astype(np.float64), y


def brier(model, X, y):
    proba = model.predict_proba(X)
    return float(np.mean(np.sum((proba - (y[:, None] == model.classes_[None, :])) ** 2, axis=1)))


def same_forest(a, b):
    return all(np.array_equal(a.estimators_[k], b.estimators_[k], equal_nan=True) for k in b.estimators_)


def test_small_separable_set_gets_the_adaptive_forest():
    X, y = breast_cancer()
    train = np.arange(len(y)) % 3 != 0
    auto = ProbabilityForest(n_estimators=100, random_state=0).fit(X[train], y[train], comm=SELF)
    honest = ProbabilityForest(n_estimators=100, random_state=0, honest=True).fit(X[train], y[train], comm=SELF)
    record = auto.tuning_
    assert record["rows"] == train.sum() and record["status"] == "chosen by debiased out-of-bag Brier score"
    assert [c["name"] for c in record["candidates"]] == ["honest", "sharp", "smooth"]
    scores = {c["name"]: c["oob_brier"] for c in record["candidates"]}
    # out of bag, the adaptive forests are clearly sharper here (about 0.064 against 0.084) ...
    assert record["chosen"] != "honest" and scores[record["chosen"]] < 0.9 * scores["honest"]
    assert auto.honest_ is False and auto.tuned_params_["honest"] is False
    assert auto.tuned_params_["max_features"] == "sqrt" and auto.get_params()["honest"] == "auto"
    # ... and on the held-out third too
    assert brier(auto, X[~train], y[~train]) < brier(honest, X[~train], y[~train])
    # the model is the chosen candidate's forest, as a plain fit with those settings grows it
    plain = ProbabilityForest(n_estimators=100, random_state=0, **auto.tuned_params_).fit(X[train], y[train],
                                                                                          comm=SELF)
    assert same_forest(auto, plain) and not hasattr(auto, "oob_decision_function_")


def test_noisy_design_keeps_the_honest_forest_bit_for_bit():
    X, y = logistic_design(1500)
    auto = ProbabilityForest(n_estimators=30, random_state=1, oob_score=True).fit(X, y, comm=SELF)
    honest = ProbabilityForest(n_estimators=30, random_state=1, oob_score=True, honest=True).fit(X, y, comm=SELF)
    assert auto.tuning_["chosen"] == "honest" and auto.honest_ is True and auto.tuned_params_ == {"honest": True}
    assert same_forest(auto, honest)
    np.testing.assert_array_equal(auto.predict_proba(X), honest.predict_proba(X))
    np.testing.assert_array_equal(auto.oob_decision_function_, honest.oob_decision_function_)
    assert auto.oob_score_ == honest.oob_score_


def test_above_the_threshold_only_the_honest_forest_is_fitted(monkeypatch):
    X, y = breast_cancer()
    monkeypatch.setattr(probability_choice, "AUTO_MAX_ROWS", len(y) - 1)
    fitted = []
    original = ProbabilityForest.fit

    def counting_fit(self, *args, **kwargs):
        fitted.append(self.honest)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ProbabilityForest, "fit", counting_fit)
    auto = ProbabilityForest(n_estimators=10, random_state=2).fit(X, y, comm=SELF)
    honest = original(ProbabilityForest(n_estimators=10, random_state=2, honest=True), X, y, comm=SELF)
    assert fitted == ["auto", True]                 # the auto fit and its one honest forest: nothing else
    assert auto.tuning_["status"] == f"honest: more than {len(y) - 1} rows" and auto.honest_ is True
    assert auto.tuning_["candidates"][0]["oob_brier"] is None
    assert same_forest(auto, honest)
    np.testing.assert_array_equal(auto.predict_proba(X), honest.predict_proba(X))


def test_candidates_keep_what_the_user_set():
    est = ProbabilityForest(max_features=3, min_samples_leaf=4)
    options = dict(probability_choice.candidates(est, 500))
    assert options == {"honest": {"honest": True}, "sharp": {"honest": False, "max_samples": 0.8},
                       "smooth": {"honest": False, "max_samples": 0.632}}
    assert dict(probability_choice.candidates(ProbabilityForest(), 500))["sharp"] == {
        "honest": False, "max_features": "sqrt", "min_samples_leaf": 1, "max_samples": 0.8}
    # little bags (variance estimates) need honest trees; above the threshold: honest
    little = ProbabilityForest(max_samples=0.5, ci_group_size=2)
    assert probability_choice.candidates(little, 500) == [("honest", {"honest": True})]
    big = probability_choice.AUTO_MAX_ROWS + 1
    assert probability_choice.candidates(ProbabilityForest(), big) == [("honest", {"honest": True})]
    with pytest.raises(ValueError, match="honest must be a bool or 'auto'"):
        ProbabilityForest(honest="yes").fit(np.zeros((4, 1)), [0, 1, 0, 1], comm=SELF)


def test_model_file_keeps_the_choice(tmp_path):
    X, y = breast_cancer()
    forest = ProbabilityForest(n_estimators=20, random_state=3).fit(X, y, comm=SELF)
    path = str(tmp_path / "auto.model")
    model_io.save(forest, path)
    back = model_io.load(path)
    assert back.get_params()["honest"] == "auto"
    assert back.tuning_ == forest.tuning_ and back.tuned_params_ == forest.tuned_params_
    assert back.honest_ is forest.honest_
    np.testing.assert_array_equal(back.predict_proba(X), forest.predict_proba(X))


def test_warm_start_continues_the_chosen_forest():
    X, y = breast_cancer()
    warm = ProbabilityForest(n_estimators=10, random_state=4, warm_start=True).fit(X, y, comm=SELF)
    chosen = dict(warm.tuned_params_)
    warm.set_params(n_estimators=20).fit(X, y, comm=SELF)
    assert warm.tuned_params_ == chosen and len(warm.estimators_["tree_offsets"]) == 21
    once = ProbabilityForest(n_estimators=20, random_state=4, **chosen).fit(X, y, comm=SELF)
    np.testing.assert_array_equal(warm.predict_proba(X), once.predict_proba(X))


def test_checkpoint_with_auto(tmp_path):
    X, y = breast_cancer()
    kw = dict(n_estimators=12, batch_size=4, random_state=5)
    plain = ProbabilityForest(**kw).fit(X, y, comm=SELF)
    ckpt = ProbabilityForest(**kw).fit(X, y, comm=SELF, checkpoint=Checkpoint(tmp_path / "c", every=4))
    assert ckpt.tuning_ == plain.tuning_ and same_forest(ckpt, plain)


@pytest.mark.mpi
@pytest.mark.parametrize("design", ["breast_cancer", "logistic"])
def test_same_choice_and_model_at_any_rank_count(comm, design):
    X, y = breast_cancer() if design == "breast_cancer" else logistic_design(900, seed=6)
    lo, hi = block_range(len(y), comm.size, comm.rank)
    kw = dict(n_estimators=20, random_state=7, max_bins=64, oob_score=True)
    dist = ProbabilityForest(**kw).fit(X[lo:hi], y[lo:hi], comm=comm)
    ref = ProbabilityForest(**kw).fit(X, y, comm=SELF)
    # the candidates' scores are the same bits on any rank count, so the choice is too
    assert dist.tuning_ == ref.tuning_ and dist.tuned_params_ == ref.tuned_params_
    assert same_forest(dist, ref)
    assert np.array_equal(dist.predict_proba(X), ref.predict_proba(X))
    assert np.array_equal(dist.oob_decision_function_, ref.oob_decision_function_[lo:hi])


def test_merge_refuses_forests_of_different_choices():
    from forest.io.merge import merge_forests

    X, y = breast_cancer()
    auto = ProbabilityForest(n_estimators=6, random_state=1).fit(X, y, comm=SELF)
    assert auto.tuned_params_["honest"] is False
    same = ProbabilityForest(n_estimators=4, random_state=2).fit(X, y, comm=SELF)
    honest = ProbabilityForest(n_estimators=4, random_state=3).fit(X, y, comm=SELF)
    honest.tuned_params_ = {"honest": True}      # as a fit that chose the honest forest records it
    if same.tuned_params_ == auto.tuned_params_:
        merged = merge_forests([auto, same])
        assert len(merged.estimators_["tree_offsets"]) == 11 and merged.tuned_params_ == auto.tuned_params_
    with pytest.raises(ValueError, match="different fitted choices"):
        merge_forests([auto, honest])

"""forest.estimators.base: scikit-learn's estimator protocol without importing scikit-learn.

The slow reference of the validators' plain path is scikit-learn itself: the same inputs
go through both and must come out the same (array, attributes, warnings), and whatever
the plain path declines must still get scikit-learn's own message.
"""
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest
import sklearn
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.exceptions import NotFittedError
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, validate_data

from forest import CausalForest, GBDTClassifier, GBDTRegressor, PolicyTree, RegressionForest
from forest import _validation as V
from forest.estimators.base import EstimatorBase, check_is_fitted

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class _Names(EstimatorBase):
    """A bare estimator that validators record attributes on (NaN allowed, as ours)."""

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags


def _sklearn_validate(est, X, reset):
    return validate_data(est, X, reset=reset, dtype=np.float64, order="C", ensure_all_finite="allow-nan")


def _ours_validate(est, X, reset):
    return V.validate_features(est, X, reset=reset)


def _run_validator(validator, X, reset, fitted=None):
    """``(array, attributes set on a fresh estimator, warning messages)`` of one validator."""
    est = _Names()
    if fitted is not None:
        est.__dict__.update(fitted)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = validator(est, X, reset)
    return out, vars(est), [str(w.message) for w in caught]


def _reference_features(X, reset, fitted=None):
    return _run_validator(_sklearn_validate, X, reset, fitted)


def _ours_features(X, reset, fitted=None):
    return _run_validator(_ours_validate, X, reset, fitted)


rng = np.random.default_rng(0)
BASE = rng.normal(size=(7, 3))
WITH_NAN = BASE.copy()
WITH_NAN[2, 1] = np.nan

FEATURE_CASES = {
    "float64": BASE,
    "fortran order": np.asfortranarray(BASE),
    "float32": BASE.astype(np.float32),
    "int": (BASE * 10).astype(np.int64),
    "uint8": np.arange(21, dtype=np.uint8).reshape(7, 3),
    "bool": BASE > 0,
    "NaN (missing)": WITH_NAN,
    "strided view": rng.normal(size=(7, 6))[:, ::2],
    "huge finite values": np.full((4, 2), 1e308),
}


@pytest.mark.parametrize("name", sorted(FEATURE_CASES))
def test_plain_features_equal_scikit_learns(name):
    X = FEATURE_CASES[name]
    assert V._plain_features(_Names(), X, True, 1) is not None, "the plain path should take this input"
    ours, ours_attrs, ours_warn = _ours_features(X, reset=True)
    ref, ref_attrs, ref_warn = _reference_features(X, reset=True)
    np.testing.assert_array_equal(ours, ref)
    assert ours.dtype == np.float64 and ours.flags.c_contiguous
    assert ours_attrs == ref_attrs and ours_warn == ref_warn == []
    # predict-time check against the fitted attributes
    ours2, _, w1 = _ours_features(X, reset=False, fitted=ours_attrs)
    ref2, _, w2 = _reference_features(X, reset=False, fitted=ref_attrs)
    np.testing.assert_array_equal(ours2, ref2)
    assert w1 == w2 == []


def test_plain_features_keep_a_float64_c_array_uncopied_as_scikit_learn_does():
    X = np.ascontiguousarray(BASE)
    assert V.validate_features(_Names(), X, reset=True) is X
    assert validate_data(_Names(), X, reset=True, dtype=np.float64, order="C", ensure_all_finite="allow-nan") is X


def test_refitting_on_an_array_drops_column_names_as_scikit_learn_does():
    ours, ref = _Names(), _Names()
    for est in (ours, ref):
        est.feature_names_in_ = np.array(["a", "b", "c"], dtype=object)
        est.n_features_in_ = 3
    V.validate_features(ours, BASE, reset=True)
    validate_data(ref, BASE, reset=True, dtype=np.float64, order="C", ensure_all_finite="allow-nan")
    assert vars(ours) == vars(ref) == {"n_features_in_": 3}


DECLINED = {
    "infinity": (np.array([[1.0, np.inf], [0.0, 1.0]]), True, None),
    "1-D": (np.ones(4), True, None),
    "3-D": (np.ones((2, 2, 2)), True, None),
    "no rows": (np.ones((0, 3)), True, None),
    "no columns": (np.ones((3, 0)), True, None),
    "complex": (np.ones((3, 2), dtype=complex), True, None),
    "object": (np.array([[1, "a"], [2, "b"]], dtype=object), True, None),
    "list": ([[1.0, 2.0], [3.0, 4.0]], True, None),
    "wrong feature count": (BASE[:, :2], False, {"n_features_in_": 3}),
    "fitted with names": (BASE, False, {"n_features_in_": 3,
                                        "feature_names_in_": np.array(["a", "b", "c"], dtype=object)}),
}


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_what_the_plain_path_declines_gets_scikit_learns_answer(name):
    X, reset, fitted = DECLINED[name]
    est = _Names()
    est.__dict__.update(fitted or {})
    assert V._plain_features(est, X, reset, 1) is None
    try:
        ref = _reference_features(X, reset, fitted)
    except (ValueError, TypeError) as exc:
        with pytest.raises(type(exc)) as ours:
            _ours_features(X, reset, fitted)
        assert str(ours.value) == str(exc) or "not numeric" in str(ours.value)
    else:
        ours = _ours_features(X, reset, fitted)
        np.testing.assert_array_equal(ours[0], ref[0])
        assert ours[1] == ref[1] and ours[2] == ref[2]


TARGETS = {
    "float": rng.normal(size=6),
    "int": np.arange(6),
    "bool": np.arange(6) % 2 == 0,
    "float32": rng.normal(size=6).astype(np.float32),
    "2-D": rng.normal(size=(6, 2)),
}


@pytest.mark.parametrize("dtype", [np.float64, "numeric", None], ids=["float64", "numeric", "any"])
@pytest.mark.parametrize("name", sorted(TARGETS))
def test_plain_targets_equal_scikit_learns(name, dtype):
    y = TARGETS[name]
    ours = V.check_target(y, "y", 6, estimator=_Names(), dtype=dtype)
    ref = check_array(y, ensure_2d=False, dtype=dtype, ensure_all_finite=True, input_name="y",
                      ensure_min_samples=0)
    np.testing.assert_array_equal(ours, ref)
    assert ours.dtype == ref.dtype and ours.shape == ref.shape


@pytest.mark.parametrize("bad", [np.array([1.0, np.nan, 2.0]), np.array([1.0, np.inf, 2.0])], ids=["nan", "inf"])
def test_non_finite_targets_and_weights_keep_scikit_learns_message(bad):
    with pytest.raises(ValueError, match="Input y contains (NaN|infinity)"):
        V.check_target(bad, "y", 3, estimator=_Names())
    with pytest.raises(ValueError, match="Input sample_weight contains (NaN|infinity)"):
        V.check_weight(bad, 3)


def test_plain_weights_equal_scikit_learns():
    for g in (np.arange(5), np.linspace(0, 1, 5), np.ones(5, dtype=np.float32), np.ones(5, dtype=bool)):
        ours = V.check_weight(g, 5)
        ref = check_array(g, ensure_2d=False, dtype=np.float64, input_name="sample_weight", ensure_min_samples=0)
        np.testing.assert_array_equal(ours, ref)
        assert ours.dtype == np.float64


@pytest.mark.parametrize("y", [np.array([0, 1, 1]), np.array([True, False]), np.array([3], dtype=np.uint8),
                               np.array([], dtype=int), np.array([0.0, 1.0]), np.array([0.5, 1.0]),
                               np.array(["a", "b"], dtype=object)])
def test_class_labels_are_checked_as_scikit_learn_does(y):
    try:
        check_classification_targets(y)
    except ValueError as exc:
        with pytest.raises(ValueError, match="Unknown label type"):
            V.check_class_labels(y)
        assert "Unknown label type" in str(exc)
    else:
        V.check_class_labels(y)


# ---------------------------------------------------------------- the protocol

def test_params_repr_clone_and_tags():
    est = GBDTClassifier(n_estimators=7, learning_rate=0.3)
    assert repr(est) == "GBDTClassifier(learning_rate=0.3, n_estimators=7)"
    assert repr(GBDTRegressor()) == "GBDTRegressor()"
    assert est.get_params()["n_estimators"] == 7 and "quantized_bins" in est.get_params()
    twin = clone(est)
    assert twin is not est and twin.get_params() == est.get_params()
    est.set_params(n_estimators=9)
    assert est.n_estimators == 9
    with pytest.raises(ValueError, match="Invalid parameter 'n_trees' for estimator"):
        est.set_params(n_trees=3)
    assert is_classifier(est) and not is_regressor(est)
    assert is_regressor(GBDTRegressor()) and is_regressor(RegressionForest())
    assert not is_classifier(CausalForest()) and not is_regressor(CausalForest())
    assert est.__sklearn_tags__().input_tags.allow_nan
    assert "<div" in est._repr_html_()
    with sklearn.config_context(display="text"):
        assert not hasattr(est, "_repr_html_")   # notebooks then show the text repr, as for scikit-learn's


def test_repr_and_diagram_follow_scikit_learns_settings():
    assert repr(GBDTRegressor(random_state=list(range(100)))).endswith("28, 29, ...])")
    assert len(repr(GBDTRegressor(n_estimators="x" * 900))) <= 703
    with sklearn.config_context(print_changed_only=False):
        assert "learning_rate=0.1" in repr(GBDTRegressor())
    est = GBDTRegressor(n_estimators=3)
    assert "Parameters" in est._repr_html_()
    X = rng.normal(size=(200, 3))
    est.fit(X, X[:, 0])
    assert "Fitted attributes" in est._repr_html_()
    assert set(est._repr_mimebundle_()) == {"text/plain", "text/html"}
    with sklearn.config_context(display="text"):
        assert set(est._repr_mimebundle_()) == {"text/plain"}


def test_nested_params_reach_inside_a_pipeline():
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    pipe = make_pipeline(StandardScaler(), RegressionForest(n_estimators=5))
    pipe.set_params(regressionforest__n_estimators=8)
    assert pipe.get_params()["regressionforest__n_estimators"] == 8
    assert "RegressionForest(n_estimators=8)" in repr(pipe)


def test_a_nan_default_is_not_shown_as_changed():
    class WithNaN(GBDTRegressor):
        def __init__(self, *, missing=float("nan")):
            self.missing = missing

    assert repr(WithNaN()) == "WithNaN()"
    assert repr(WithNaN(missing=1.0)) == "WithNaN(missing=1.0)"


def test_unfitted_estimators_raise_scikit_learns_not_fitted_error():
    for est in (GBDTClassifier(), RegressionForest(), CausalForest(), PolicyTree()):
        with pytest.raises(NotFittedError, match="is not fitted yet"):
            est.predict(np.ones((2, 3)))
    with pytest.raises(NotFittedError):
        PolicyTree().predict_value(np.ones((2, 3)))  # was an AttributeError on action_ / tree_
    check_is_fitted(type("Fitted", (), {"trees_": []})(), "trees_")  # present: no error


def test_sample_weight_routing_follows_scikit_learns_protocol(tmp_path):
    from sklearn.model_selection import cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from forest.io import model_io

    X = rng.normal(size=(300, 3))
    y = (X[:, 0] > 0).astype(int)
    w = np.ones(300)
    with pytest.raises(RuntimeError, match="enable_metadata_routing"):
        GBDTClassifier().set_fit_request(sample_weight=True)
    with sklearn.config_context(enable_metadata_routing=True):
        est = GBDTClassifier(n_estimators=3).set_fit_request(sample_weight=True).set_score_request(
            sample_weight=True)
        pipe = make_pipeline(StandardScaler().set_fit_request(sample_weight=False), est)
        scores = cross_val_score(pipe, X, y, cv=2, params={"sample_weight": w})   # clones keep the requests
        assert scores.shape == (2,) and np.all(scores > 0.9)
        with pytest.raises(Exception, match="set_fit_request"):
            make_pipeline(GBDTClassifier(n_estimators=3)).fit(X, y, sample_weight=w)
        est.fit(X, y)
        model_io.save(est, tmp_path / "m.model")
        assert not hasattr(model_io.load(tmp_path / "m.model"), "_metadata_request")


def test_a_fit_on_numpy_arrays_does_not_import_scikit_learn():
    """Issue 11's warm start: scikit-learn's import alone costs a fresh process about 1 s."""
    script = (
        "import sys\n"
        "import numpy as np\n"
        "import forest\n"
        "rng = np.random.default_rng(0)\n"
        "X = rng.normal(size=(400, 4)); t = (rng.uniform(size=400) < .5).astype(float)\n"
        "y = X[:, 0] + t + rng.normal(size=400)\n"
        "forest.GBDTClassifier(n_estimators=2, random_state=0).fit(X, (y > 0).astype(int)).predict_proba(X)\n"
        "forest.GBDTRegressor(n_estimators=2).fit(X, y).predict(X)\n"
        "forest.RegressionForest(n_estimators=4).fit(X, y).predict(X)\n"
        "forest.CausalForest(n_estimators=4, random_state=0).fit(X, t, y).predict(X)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sklearn', 'pandas')"
        " or m.startswith('scipy.stats')))\n")
    env = dict(os.environ, NUMBA_NUM_THREADS="1", PYTHONPATH=REPO)
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout


def _table_cases():
    import pyarrow as pa

    return {
        "floats with nulls": pa.table({"a": [1.0, None, 3.0], "b": [0.5, 2.0, -1.0]}),
        "ints, bools, all-null": pa.table({"a": pa.array([1, None, 3], pa.int64()), "b": [True, False, None],
                                           "c": pa.array([None, None, None]),
                                           "d": pa.array([1, 2, 3], pa.uint8())}),
        "chunked": pa.concat_tables([pa.table({"a": [1.0, 2.0], "b": [1, 2]}),
                                     pa.table({"a": [3.0, None], "b": [3, 4]})]),
    }


@pytest.mark.parametrize("name", ["floats with nulls", "ints, bools, all-null", "chunked"])
def test_plain_tables_equal_scikit_learns(name):
    """forest-predict passes pyarrow tables named like the model's features: no scikit-learn import."""
    X = _table_cases()[name]
    assert V._plain_table(_Names(), X, True, 1) is not None
    ours, ours_attrs, ours_warn = _ours_features(X, reset=True)
    ref, ref_attrs, ref_warn = _reference_features(X, reset=True)
    np.testing.assert_array_equal(ours, ref)
    assert ours.dtype == np.float64 and ours.flags.c_contiguous
    assert ours_attrs.keys() == ref_attrs.keys() and ours_attrs["n_features_in_"] == ref_attrs["n_features_in_"]
    np.testing.assert_array_equal(ours_attrs["feature_names_in_"], ref_attrs["feature_names_in_"])
    assert ours_attrs["feature_names_in_"].dtype == object and ours_warn == ref_warn == []
    assert V._plain_table(_Names(), X, False, 1) is None  # predict on a model fitted without names: scikit-learn
    est = _Names()
    est.__dict__.update(ours_attrs)
    np.testing.assert_array_equal(V.validate_features(est, X, reset=False), ref)


def test_tables_the_plain_path_declines_keep_scikit_learns_answer():
    import pyarrow as pa

    fitted = {"n_features_in_": 2, "feature_names_in_": np.array(["a", "b"], dtype=object)}
    for X in (pa.table({"b": [1.0], "a": [2.0]}),               # reordered columns
              pa.table({"a": [1.0], "b": [float("inf")]}),       # infinity
              pa.table({"a": ["x"], "b": [1.0]})):               # not numeric
        est = _Names()
        est.__dict__.update(fitted)
        assert V._plain_table(est, X, False, 1) is None
        with pytest.raises(ValueError):
            V.validate_features(est, X, reset=False)


def test_a_record_batch_keeps_scikit_learns_treatment():
    """scikit-learn takes no column names from a pyarrow RecordBatch; neither does the plain path."""
    import pyarrow as pa

    batch = pa.record_batch({"a": [1.0, 2.0], "b": [3.0, 4.0]})
    assert V._plain_table(_Names(), batch, True, 1) is None
    ours, ours_attrs, _ = _ours_features(batch, reset=True)
    ref, ref_attrs, _ = _reference_features(batch, reset=True)
    np.testing.assert_array_equal(ours, ref)
    assert ours_attrs.keys() == ref_attrs.keys()


def test_a_strided_one_dimensional_target_arrives_contiguous():
    y = np.arange(20.0)[::2]
    ours = V.check_target(y, "y", 10, estimator=_Names(), multi_output=False)
    assert ours.flags.c_contiguous
    np.testing.assert_array_equal(ours, y)


def test_routing_requests_are_generated_from_each_methods_signature():
    import inspect

    params = inspect.signature(RegressionForest.set_fit_request).parameters
    assert {"sample_weight", "clusters"} <= set(params)
    assert hasattr(CausalForest, "set_fit_request") and hasattr(PolicyTree, "set_fit_request")
    with sklearn.config_context(enable_metadata_routing=True):
        est = RegressionForest().set_fit_request(clusters=True)
        assert est.get_metadata_routing().fit.requests["clusters"] is True
        est.get_metadata_routing().fit.add_request(param="clusters", alias=False)   # a copy
        assert est.get_metadata_routing().fit.requests["clusters"] is True
        with pytest.raises(TypeError, match="Unexpected args"):
            RegressionForest().set_fit_request(colour=True)
        X = rng.normal(size=(200, 3))
        R = rng.normal(size=(200, 2))
        PolicyTree(max_depth=1).set_fit_request(sample_weight=True).fit(X, R, sample_weight=np.ones(200))

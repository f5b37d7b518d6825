"""Input contracts of the estimators (issue 11, "Inputs in Python").

Feature names (``feature_names_in_``, checked at predict time and stored in model files),
pandas / arrow tables (nulls and nullable ``NA`` mean missing in X, are errors naming
the argument elsewhere), non-numeric columns named, treatment coding, too few rows, and
values whose moments would overflow float64.
"""
import warnings

import numpy as np
import pytest

from forest.io import model_io
from forest.estimators.causal_forest import CausalForest
from forest.estimators.gbdt import GBDTClassifier, GBDTRegressor
from forest.estimators.regression_forest import RegressionForest
from native.comm import SelfCommunicator

pd = pytest.importorskip("pandas")
pa = pytest.importorskip("pyarrow")

SELF = SelfCommunicator()
CF_KW = dict(n_estimators=8, nuisance_estimators=4, max_bins=32, random_state=0)
RF_KW = dict(n_estimators=8, max_bins=32, random_state=0)


def _design(n=300, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, 3))
    t = (rng.uniform(size=n) < 0.5).astype(np.int64)
    y = X[:, 0] + t * (1.0 + X[:, 1]) + 0.1 * rng.normal(size=n)
    return X, t, y


def _frame(X):
    return pd.DataFrame(X, columns=["age", "income", "score"])


def _fit(est, X, t, y, **kw):
    if isinstance(est, CausalForest):
        return est.fit(X, t, y, comm=SELF, **kw)
    return est.fit(X, y, comm=SELF, **kw)


FORESTS = [pytest.param(lambda: CausalForest(**CF_KW), id="causal"),
           pytest.param(lambda: RegressionForest(**RF_KW), id="regression")]


# ---------------------------------------------------------------- feature names
@pytest.mark.parametrize("make", FORESTS)
def test_feature_names_are_recorded_and_checked(make):
    X, t, y = _design()
    df = _frame(X)
    est = _fit(make(), df, t, y)
    assert list(est.feature_names_in_) == ["age", "income", "score"]
    with pytest.raises(ValueError, match="same order as they were in fit"):
        est.predict(df[df.columns[::-1]])
    with pytest.raises(ValueError, match="unseen at fit time"):
        est.predict(df.rename(columns={"score": "grade"}))
    with pytest.warns(UserWarning, match="does not have valid feature names"):
        plain = est.predict(X)
    np.testing.assert_array_equal(plain, est.predict(df))
    # a pyarrow Table is a named table too
    table = pa.table({c: df[c].to_numpy() for c in df.columns})
    np.testing.assert_array_equal(est.predict(table), est.predict(df))
    with pytest.raises(ValueError, match="same order"):
        est.predict(table.select(["score", "age", "income"]))
    # fitted on an array: no names, and a table at predict time only warns (scikit-learn's rule)
    bare = _fit(make(), X, t, y)
    assert not hasattr(bare, "feature_names_in_")


def test_causal_interval_and_oob_check_names_too():
    X, t, y = _design()
    df = _frame(X)
    cf = CausalForest(**CF_KW).fit(df, t, y, comm=SELF)
    reordered = df[df.columns[::-1]]
    for call in (lambda: cf.predict_interval(reordered), lambda: cf.predict_var(reordered),
                 lambda: cf.oob_predict(reordered, comm=SELF)):
        with pytest.raises(ValueError, match="Feature names"):
            call()
    with pytest.raises(ValueError, match="X has 2 features, but CausalForest is expecting 3"), \
            pytest.warns(UserWarning, match="valid feature names"):
        cf.predict(X[:, :2])


@pytest.mark.parametrize("make", FORESTS)
def test_feature_names_in_model_files(make, tmp_path):
    X, t, y = _design()
    df = _frame(X)
    est = _fit(make(), df, t, y)
    path = str(tmp_path / "m.model")
    model_io.save(est, path)
    assert model_io.read_header(path)["feature_names"] == ["age", "income", "score"]
    back = model_io.load(path)
    assert list(back.feature_names_in_) == ["age", "income", "score"]
    np.testing.assert_array_equal(back.predict(df), est.predict(df))
    with pytest.raises(ValueError, match="Feature names"):
        back.predict(df[df.columns[::-1]])


@pytest.mark.parametrize("make", FORESTS + [pytest.param(lambda: GBDTRegressor(n_estimators=3), id="gbdt")])
def test_binned_input_takes_feature_names(make):
    from histogram.binning import BinMapper

    X, t, y = _design()
    mapper = BinMapper(max_bins=32, random_state=0).fit(X, comm=SELF)
    pair = (mapper, mapper.transform(X))
    est = _fit(make(), None, t, y, binned=pair, feature_names=["a", "b", "c"])
    assert list(est.feature_names_in_) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="feature_names must be 3 distinct strings"):
        _fit(make(), None, t, y, binned=pair, feature_names=["a", "a", "c"])
    with pytest.raises(ValueError, match="feature_names goes with binned input"):
        _fit(make(), X, t, y, feature_names=["a", "b", "c"])
    with pytest.raises(ValueError, match="differ from the columns of X"):
        _fit(make(), pd.DataFrame(X, columns=["x", "b", "c"]), t, y, binned=pair, feature_names=["a", "b", "c"])


# ---------------------------------------------------------------- tables: types and missing values
@pytest.mark.parametrize("make", FORESTS + [pytest.param(lambda: GBDTRegressor(n_estimators=3), id="gbdt")])
def test_non_numeric_column_is_named(make):
    X, t, y = _design()
    df = _frame(X).assign(city=["Paris", "Oslo", "Rome"] * 100)
    with pytest.raises(ValueError, match="X column 'city' is not numeric"):
        _fit(make().set_params(categorical_features=None), df, t, y)
    table = pa.table({"age": X[:, 0], "city": ["Paris", "Oslo", "Rome"] * 100})
    with pytest.raises(ValueError, match="X column 'city' is not numeric"):
        _fit(make().set_params(categorical_features=None), table, t, y)
    # by default a string column is categorical (issue 32); a timestamp is neither
    assert _fit(make(), table, t, y).is_categorical_.tolist() == [False, True]
    stamps = pd.DataFrame({"age": X[:, 0], "when": pd.date_range("2020-01-01", periods=300)})
    with pytest.raises(ValueError, match="X column 'when'"):
        _fit(make(), stamps, t, y)
    # object columns that hold numbers are fine
    ok = _frame(X).astype({"score": object})
    assert _fit(make(), ok, t, y).n_features_in_ == 3


@pytest.mark.parametrize("make", FORESTS)
def test_pandas_na_in_X_is_missing(make):
    """A nullable Int64 / boolean column with <NA> is read as missing values, like NaN."""
    X, t, y = _design()
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 5, size=len(y)).astype(float)
    codes[::7] = np.nan
    flags = (rng.uniform(size=len(y)) < 0.5).astype(float)
    flags[::11] = np.nan
    nullable = pd.DataFrame({"age": X[:, 0], "level": pd.array(codes, dtype="Int64"),
                             "flag": pd.array(flags, dtype="boolean")})
    floats = pd.DataFrame({"age": X[:, 0], "level": codes, "flag": flags})
    a = _fit(make(), nullable, t, y)
    b = _fit(make(), floats, t, y)
    np.testing.assert_array_equal(a.predict(nullable), b.predict(floats))
    assert np.isfinite(a.predict(nullable)).all()


@pytest.mark.parametrize("argument", ["t", "y", "sample_weight"])
def test_na_in_causal_arguments_is_an_error_naming_them(argument):
    X, t, y = _design()
    args = dict(t=pd.Series(t, dtype="Int64"), y=pd.Series(y, dtype="Float64"),
                sample_weight=pd.Series(np.ones(len(y)), dtype="Float64"))
    args[argument] = args[argument].copy()
    args[argument].iloc[3] = pd.NA
    with pytest.raises(ValueError, match=f"Input {argument} contains NaN"):
        CausalForest(**CF_KW).fit(X, args["t"], args["y"], sample_weight=args["sample_weight"], comm=SELF)


@pytest.mark.parametrize("argument", ["y", "sample_weight"])
def test_na_in_regression_arguments_is_an_error_naming_them(argument):
    X, _, y = _design()
    args = dict(y=pd.Series(y, dtype="Float64"), sample_weight=pd.Series(np.ones(len(y)), dtype="Float64"))
    args[argument].iloc[0] = pd.NA
    with pytest.raises(ValueError, match=f"Input {argument} contains NaN"):
        RegressionForest(**RF_KW).fit(X, args["y"], sample_weight=args["sample_weight"], comm=SELF)


def test_nuisance_estimates_are_checked_by_name():
    X, t, y = _design()
    bad = np.zeros(len(y))
    bad[5] = np.inf
    with pytest.raises(ValueError, match="Input y_hat contains infinity"):
        CausalForest(**CF_KW).fit(X, t, y, y_hat=bad, comm=SELF)
    with pytest.raises(ValueError, match="t_hat has 5 rows but X has 300"):
        CausalForest(**CF_KW).fit(X, t, y, t_hat=np.zeros(5), comm=SELF)
    with pytest.raises(ValueError, match=r"t_hat must have shape \(n, 1\)"):
        CausalForest(**CF_KW).fit(X, t, y, t_hat=np.zeros((len(y), 2)), comm=SELF)


def test_validate_features_reads_arrow_and_lists():
    from forest._validation import validate_features

    est = RegressionForest()
    chunked = pa.table({"x": pa.chunked_array([[1.5, None], [3.0]]), "n": pa.array([1, 2, None], pa.int32())})
    X = validate_features(est, chunked, reset=True)
    assert X.dtype == np.float64 and X.flags.c_contiguous and list(est.feature_names_in_) == ["x", "n"]
    np.testing.assert_array_equal(np.isnan(X), [[0, 0], [1, 0], [0, 1]])
    assert validate_features(est, [[1, 2], [3, np.nan]], reset=True).shape == (2, 2)
    with pytest.raises(ValueError, match="Reshape your data"):
        validate_features(est, np.zeros(3), reset=True)
    with pytest.raises(ValueError, match="infinity"):
        validate_features(est, [[np.inf, 1.0]], reset=True)
    with pytest.raises(ValueError, match="0 sample"):
        validate_features(est, np.zeros((0, 3)), reset=True)
    assert validate_features(est, np.zeros((0, 3)), reset=True, min_samples=0).shape == (0, 3)
    with pytest.raises(TypeError, match="Sparse data was passed"):
        import scipy.sparse

        validate_features(est, scipy.sparse.csr_matrix(np.eye(3)), reset=True)


# ---------------------------------------------------------------- treatment coding
@pytest.mark.parametrize("codes", [(1, 2), (-1.5, 3.0), (False, True), (0, 1)])
def test_two_values_are_binary_whatever_the_codes(codes):
    """The smaller value is the control; the forest equals the one fitted on 0/1."""
    X, t01, y = _design()
    t = np.where(t01 == 1, codes[1], codes[0])
    cf = CausalForest(**CF_KW).fit(X, t, y, comm=SELF)
    ref = CausalForest(**CF_KW).fit(X, t01, y, comm=SELF)
    assert cf.treatment_type_ == "binary"
    np.testing.assert_array_equal(cf.classes_, np.asarray(codes))
    np.testing.assert_array_equal(cf.predict(X[:20]), ref.predict(X[:20]))
    assert cf.ate_ == ref.ate_


def test_binary_treatment_from_a_nullable_column():
    X, t, y = _design()
    cf = CausalForest(**CF_KW).fit(X, pd.Series(t + 1, dtype="Int64"), y, comm=SELF)
    assert cf.treatment_type_ == "binary" and list(cf.classes_) == [1, 2]


def test_integer_treatment_levels():
    from forest.estimators.treatment import AUTO_MAX_LEVELS, MAX_LEVELS

    X, _, y = _design()
    rng = np.random.default_rng(4)
    arms = rng.integers(0, 3, size=len(y))
    cf = CausalForest(**CF_KW).fit(X, pd.Series(arms, dtype="Int64"), y, comm=SELF)
    assert cf.treatment_type_ == "categorical" and list(cf.classes_) == [0, 1, 2]
    many = rng.integers(0, 3 * AUTO_MAX_LEVELS, size=len(y))
    with pytest.raises(ValueError, match=f"more than {AUTO_MAX_LEVELS} distinct values.*treatment_type"):
        CausalForest(**CF_KW).fit(X, many, y, comm=SELF)
    dose = CausalForest(treatment_type="continuous", **CF_KW).fit(X, many, y, comm=SELF)
    assert dose.treatment_type_ == "continuous" and dose.classes_ is None
    with pytest.raises(ValueError, match=f"at most {MAX_LEVELS} levels"):
        CausalForest(treatment_type="categorical", **CF_KW).fit(X, np.arange(len(y)) % 70, y, comm=SELF)
    with pytest.raises(ValueError, match="exactly two values"):
        CausalForest(treatment_type="binary", **CF_KW).fit(X, arms, y, comm=SELF)
    # floats with more than two values are a dose
    assert CausalForest(**CF_KW).fit(X, arms * 0.5, y, comm=SELF).treatment_type_ == "continuous"


def test_single_valued_treatment():
    X, t, y = _design()
    for kind in ("auto", "binary", "continuous"):
        with pytest.raises(ValueError, match=r"takes a single value \(1(\.0)?\)"):
            CausalForest(treatment_type=kind, **CF_KW).fit(X, np.ones(len(y)), y, comm=SELF)
    with pytest.raises(ValueError, match="t column 1 takes a single value"):
        CausalForest(**CF_KW).fit(X, np.column_stack([t, np.zeros(len(y))]), y, comm=SELF)


def test_distinct_values_stops_early():
    from forest.estimators.treatment import distinct_values

    assert list(distinct_values(np.array([3, 1, 3, 2, 1]), 5)) == [1, 2, 3]
    assert len(distinct_values(np.arange(1000.0), 2)) == 3
    assert distinct_values(np.zeros(0, dtype=np.int64), 2).size == 0


# ---------------------------------------------------------------- too few rows
def test_fit_on_zero_or_one_row_says_so():
    X, t, y = _design()
    with pytest.raises(ValueError, match="0 sample"):
        CausalForest(**CF_KW).fit(X[:0], t[:0], y[:0], comm=SELF)
    with pytest.raises(ValueError, match=r"CausalForest needs at least 4 rows to fit, got n_samples = 1"):
        CausalForest(**CF_KW).fit(X[:1], t[:1], y[:1], comm=SELF)
    with pytest.raises(ValueError, match=r"RegressionForest needs at least 2 rows to fit, got n_samples = 1"):
        RegressionForest(**RF_KW).fit(X[:1], y[:1], comm=SELF)
    with pytest.raises(ValueError, match="0 sample"):
        RegressionForest(**RF_KW).fit(X[:0], y[:0], comm=SELF)


# ---------------------------------------------------------------- overflow
def test_overflowing_outcomes_and_treatments_are_rejected():
    X, t, y = _design()
    # a regression forest grows on the standardised y: any finite magnitude is fine
    np.testing.assert_allclose(RegressionForest(**RF_KW).fit(X, y * 1e300, comm=SELF).predict(X) / 1e300,
                               RegressionForest(**RF_KW).fit(X, y, comm=SELF).predict(X), rtol=1e-9)
    with pytest.raises(ValueError, match=r"^y too large in magnitude"):
        GBDTRegressor(n_estimators=3).fit(X, y * 1e300, comm=SELF)
    with pytest.raises(ValueError, match=r"^y too large in magnitude"):
        CausalForest(**CF_KW).fit(X, t, y * 1e300, comm=SELF)
    dose = np.random.default_rng(2).normal(size=len(y)) * 1e200
    with pytest.raises(ValueError, match=r"^t too large in magnitude"):
        CausalForest(**CF_KW).fit(X, dose, y, comm=SELF)
    with pytest.raises(ValueError, match=r"^sample_weight too large"):
        CausalForest(**CF_KW).fit(X, t, y, sample_weight=np.full(len(y), 1e300), comm=SELF)
    with pytest.raises(ValueError, match=r"sample_weight sums to inf"):
        RegressionForest(**RF_KW).fit(X, y, sample_weight=np.full(len(y), 1e308), comm=SELF)
    # user nuisances far from the data: the centered moments overflow
    with pytest.raises(ValueError, match=r"^y - y_hat too large in magnitude"):
        CausalForest(**CF_KW).fit(X, t, y, y_hat=np.full(len(y), 1e160), comm=SELF)
    # large but safe values, and huge treatment codes of a binary treatment, are fine
    RegressionForest(**RF_KW).fit(X, y * 1e100, comm=SELF)
    assert CausalForest(**CF_KW).fit(X, t * 1e200, y, comm=SELF).treatment_type_ == "binary"
    GBDTClassifier(n_estimators=2).fit(X, t, comm=SELF)


def test_underflowing_outcomes_and_treatments_are_rejected():
    # squares of sums ~1e-200 underflow: every gain was zero and the model a constant
    X, t, y = _design()
    for fit, arg in ((lambda: GBDTRegressor(n_estimators=3).fit(X, y * 1e-200, comm=SELF), "y"),
                     (lambda: CausalForest(**CF_KW).fit(X, t, y * 1e-200, comm=SELF), "y"),
                     (lambda: CausalForest(**CF_KW).fit(X, np.random.default_rng(3).normal(size=len(y)) * 1e-200, y,
                                                       comm=SELF), "t"),
                     (lambda: GBDTRegressor(n_estimators=3).fit(X, y, sample_weight=np.full(len(y), 1e-160),
                                                                comm=SELF), "sample_weight")):
        with pytest.raises(ValueError, match=rf"^{arg} too small in magnitude"):
            fit()
    # zero is not small: a constant zero outcome fits; a regression forest standardises y
    CausalForest(**CF_KW).fit(X, t, np.zeros(len(y)), comm=SELF)
    RegressionForest(**RF_KW).fit(X, y * 1e-200, comm=SELF)


def test_moment_sums_reference():
    """The vectorised sums against plain loops."""
    from forest._validation import MAX_MOMENT_SUM, moment_sums

    rng = np.random.default_rng(5)
    g, Y, W = rng.uniform(size=7), rng.normal(size=(7, 2)), rng.normal(size=(7, 3))
    want = [np.abs(g).sum(),
            max(sum(abs(g[i] * Y[i, m]) for i in range(7)) for m in range(2)),
            max(sum(abs(g[i] * W[i, k]) for i in range(7)) for k in range(3)),
            max(sum(abs(g[i] * W[i, k] * W[i, j]) for i in range(7)) for k in range(3) for j in range(3)),
            max(sum(abs(g[i] * W[i, k] * Y[i, m]) for i in range(7)) for k in range(3) for m in range(2))]
    np.testing.assert_allclose(moment_sums(g, Y, W), want, rtol=1e-12)
    np.testing.assert_array_equal(moment_sums(g, Y)[2:], 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not moment_sums(np.ones(2), np.array([1e300, 1e300]), np.array([1e200, 1.0]))[3] <= MAX_MOMENT_SUM

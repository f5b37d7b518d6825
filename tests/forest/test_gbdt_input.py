"""forest._validation: numpy / pandas / pyarrow tables to float64 matrices."""
import numpy as np
import pytest

from forest._validation import as_float_matrix, check_feature_names


def test_numpy_and_lists():
    X, names = as_float_matrix([[1, 2], [3, np.nan]])
    assert X.dtype == np.float64 and X.flags.c_contiguous and names is None
    assert np.isnan(X[1, 1])
    with pytest.raises(ValueError, match="2-D"):
        as_float_matrix(np.zeros(3))
    with pytest.raises(ValueError, match="no rows"):
        as_float_matrix(np.zeros((0, 3)))
    assert as_float_matrix(np.zeros((0, 3)), allow_empty=True)[0].shape == (0, 3)
    with pytest.raises(ValueError, match="infinite"):
        as_float_matrix([[np.inf, 1.0]])
    with pytest.raises(ValueError, match="NaN"):
        as_float_matrix([[np.nan, 1.0]], allow_nan=False)
    with pytest.raises(ValueError, match="numeric"):
        as_float_matrix(np.array([["a", "b"]], dtype=object))


def test_pandas():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [1, 2, None], "b": [True, False, True], "c": pd.array([1, None, 3], dtype="Int64")})
    X, names = as_float_matrix(df)
    assert names == ["a", "b", "c"]
    np.testing.assert_array_equal(np.isnan(X), [[0, 0, 0], [0, 0, 1], [1, 0, 0]])
    assert X[0, 1] == 1.0 and X[2, 2] == 3.0
    with pytest.raises(ValueError, match="non-numeric"):
        as_float_matrix(pd.DataFrame({"a": [1.0], "s": ["x"]}))


def test_pyarrow():
    pa = pytest.importorskip("pyarrow")
    t = pa.table({"x": pa.chunked_array([[1.5, None], [3.0]]), "n": pa.array([1, 2, None], pa.int32())})
    X, names = as_float_matrix(t)
    assert names == ["x", "n"]
    np.testing.assert_array_equal(X[:, 0][~np.isnan(X[:, 0])], [1.5, 3.0])
    assert np.isnan(X[1, 0]) and np.isnan(X[2, 1])
    X2, _ = as_float_matrix(t.to_batches()[0])
    assert X2.shape == (2, 2)
    with pytest.raises(ValueError, match="non-numeric"):
        as_float_matrix(pa.table({"s": ["a", "b"]}))


def test_feature_names():
    check_feature_names(["a", "b"], ["a", "b"])
    check_feature_names(None, ["a"])
    with pytest.raises(ValueError, match="columns"):
        check_feature_names(["a", "b"], ["b", "a"])

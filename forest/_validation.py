"""Shared input checks: tables and arrays to float64 feature matrices.

This module owns the conversion every ``forest`` entry point applies to feature
input: numpy arrays, array-likes, pandas DataFrames and pyarrow Tables /
RecordBatches become a C-contiguous ``float64`` array of shape ``(n, d)`` (nulls and
NaN become NaN, meaning "missing") plus the column names when the input had them.
Estimators go through scikit-learn's ``validate_data`` (which also records
``feature_names_in_``); code outside estimators (CLI, causal forest helpers) calls
:func:`as_float_matrix` directly.

It also owns :func:`check_param_types`, the type half of every estimator's parameter
check (``_check_params``; the ranges stay with each estimator), which ``fit``,
``forest-train`` and model-file loading all run.
"""
import numbers

import numpy as np


def _is_pandas(X):
    return type(X).__module__.startswith("pandas") and hasattr(X, "columns") and hasattr(X, "to_numpy")


def _is_arrow(X):
    return type(X).__module__.startswith("pyarrow") and hasattr(X, "column_names") and hasattr(X, "column")


def _numeric_dtype(dt):
    """Whether a pandas column dtype (numpy or extension) holds numbers or booleans."""
    try:
        np_dt = np.dtype(getattr(dt, "numpy_dtype", dt))
    except TypeError:  # string, categorical and other extension dtypes
        return False
    return np_dt.kind in "biuf"


def _arrow_column(col, name):
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    t = col.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_decimal(t) or pa.types.is_null(t)):
        raise ValueError(f"column {name!r} has non-numeric type {t}; encode it as numbers first")
    col = pc.cast(col, pa.float64())
    return col.to_numpy(zero_copy_only=False)


def as_float_matrix(X, *, name="X", allow_nan=True, allow_empty=False):
    """Convert tabular input to a float64 matrix and its feature names.

    Parameters
    ----------
    X : ndarray, array-like, pandas.DataFrame, pyarrow.Table or pyarrow.RecordBatch
        Shape (n, d).
    name : str
        Used in error messages.
    allow_nan : bool, default True
        NaN (and nulls) mean missing; with False they raise.
    allow_empty : bool, default False
        Allow ``n == 0`` (a rank may hold no rows).

    Returns
    -------
    X : ndarray of float64, shape (n, d), C-contiguous
    feature_names : list of str or None

    Raises
    ------
    ValueError
        Non-numeric columns, wrong dimensionality, infinities, NaN when not allowed,
        or no rows/columns.
    """
    names = None
    if _is_arrow(X):
        names = [str(c) for c in X.column_names]
        cols = [_arrow_column(X.column(i), names[i]) for i in range(len(names))]
        arr = np.stack(cols, axis=1) if cols else np.zeros((X.num_rows, 0))
    elif _is_pandas(X):
        names = [str(c) for c in X.columns]
        bad = [c for c, dt in zip(names, X.dtypes) if not _numeric_dtype(dt)]
        if bad:
            raise ValueError(f"{name} has non-numeric columns {bad}; encode them as numbers first")
        arr = X.to_numpy(dtype=np.float64, na_value=np.nan)
    else:
        arr = np.asarray(X)
        if arr.dtype.kind not in "biuf":
            try:
                arr = arr.astype(np.float64)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"{name} must be numeric, got dtype {arr.dtype}") from exc
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape {arr.shape}")
    if arr.shape[1] == 0:
        raise ValueError(f"{name} has no features (shape {arr.shape})")
    if arr.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name} has no rows (shape {arr.shape})")
    if np.isinf(arr).any():
        raise ValueError(f"{name} contains infinite values")
    if not allow_nan and np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN or missing values")
    return arr, names


def check_feature_names(expected, got, name="X"):
    """Raise when column names at predict time disagree with those seen in fit.

    Parameters
    ----------
    expected, got : list of str or None
        ``None`` (plain arrays) is accepted on either side.
    """
    if expected is None or got is None:
        return
    if list(expected) != list(got):
        raise ValueError(f"{name} columns {list(got)} differ from the columns seen in fit {list(expected)}")


def as_columns(a):
    """View a 1-D or 2-D array as 2-D columns, shape (n,) -> (n, 1).

    ``a.reshape(len(a), -1)`` would do the same except on a rank that holds no rows,
    where NumPy cannot infer the ``-1``; distributed fits meet that case whenever there
    are fewer row groups than ranks.

    Parameters
    ----------
    a : array-like, shape (n,) or (n, k)

    Returns
    -------
    ndarray of float64, shape (n, 1) or (n, k)
    """
    a = np.asarray(a, dtype=np.float64)
    if a.ndim == 1:
        return a.reshape(len(a), 1)
    if a.ndim == 2:
        return a
    raise ValueError(f"expected a 1-D or 2-D array, got shape {a.shape}")


def check_binned(binned, X=None):
    """Validate pre-binned input ``(mapper, codes)`` given to an estimator's ``fit``.

    ``forest-train`` bins parquet row groups as it reads them and hands the
    estimators the codes, never a float64 copy of the features; callers that
    already binned (the causal forest for its nuisance forests) do the same.

    Parameters
    ----------
    binned : tuple (BinMapper, ndarray)
        A fitted :class:`histogram.binning.BinMapper` (fitted on the rows of all
        ranks) and this rank's codes, uint8 of shape ``(n_features, n_local)`` as
        returned by ``mapper.transform``.
    X : ndarray of float64, shape (n_local, n_features), optional
        The raw rows, when the caller also has them (checked for agreement).

    Returns
    -------
    mapper : BinMapper
    codes : ndarray of uint8, shape (n_features, n_local)
    """
    from histogram.binning import BinMapper

    try:
        mapper, codes = binned
    except (TypeError, ValueError):
        raise ValueError("binned must be a (BinMapper, codes) pair") from None
    if not isinstance(mapper, BinMapper) or not hasattr(mapper, "thresholds_flat_"):
        raise ValueError(f"binned[0] must be a fitted BinMapper, got {type(mapper).__name__}")
    codes = np.asarray(codes)
    if codes.dtype != np.uint8 or codes.ndim != 2 or codes.shape[0] != mapper.n_features_in_:
        raise ValueError(f"binned codes must be uint8 of shape ({mapper.n_features_in_}, n_rows) "
                         f"(features first), got {codes.dtype} {codes.shape}")
    if X is not None and (X.shape[0] != codes.shape[1] or X.shape[1] != codes.shape[0]):
        raise ValueError(f"X has shape {X.shape} but the binned codes hold {codes.shape[1]} rows "
                         f"of {codes.shape[0]} features")
    return mapper, np.ascontiguousarray(codes)


def check_param_types(est, *, ints=(), optional_ints=(), reals=(), bools=()):
    """Raise ``TypeError`` naming the first parameter of ``est`` whose value has the wrong type.

    Booleans are not numbers here (``n_estimators=True`` is refused), and numbers are
    not booleans (``honest=1`` is refused), so a value parsed from text or read from
    a model file is taken only when it is what the parameter means. Ranges are left
    to the estimator's own checks.

    Parameters
    ----------
    est : estimator
    ints, optional_ints, reals, bools : tuple of str
        Parameter names: integers, integers or None, real numbers, booleans.
    """
    def is_int(v):
        return isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_))

    def is_real(v):
        return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_))

    rules = [(ints, is_int, "an int"), (optional_ints, lambda v: v is None or is_int(v), "an int or None"),
             (reals, is_real, "a real number"), (bools, lambda v: isinstance(v, (bool, np.bool_)), "true or false")]
    for names, ok, what in rules:
        for name in names:
            value = getattr(est, name)
            if not ok(value):
                raise TypeError(f"{name} must be {what}, got {value!r}")

"""Feature tables with categorical columns: which columns are categorical, and their codes.

This module owns the estimators' ``categorical_features=`` parameter and the step that
turns a table holding categorical columns into the float matrix the engine bins:
numeric columns as numbers (NaN missing), categorical columns as the codes of
:class:`histogram.categories.CategoryCoder` (NaN missing or unseen).

``categorical_features``
    ``"from_dtype"`` (the default): pandas ``category`` and string columns, object
    columns holding strings, Arrow ``dictionary`` and string columns are categorical
    (scikit-learn's HistGradientBoosting rule, plus strings); a list of column names
    or indices; a boolean mask of length ``n_features``; ``None``: none. A plain
    numeric NumPy matrix has no categorical column unless named by index or mask.
At fit (:func:`fit_columns`)
    Each rank codes its rows against its own sorted categories and returns their
    summaries; after the input-check exchange every rank builds the same coder from
    all ranks' summaries and recodes (:func:`finish_fit`).
At predict (:func:`predict_columns`)
    The fitted coder codes the categorical columns; a column that is categorical now
    but was numeric at fit is refused with one line.
"""
import numbers

import numpy as np

from histogram.categories import CategoryCoder, local_categories

#: The default of ``categorical_features``.
FROM_DTYPE = "from_dtype"


def is_pandas_frame(X):
    """Whether ``X`` is a pandas DataFrame (duck-typed: pandas need not be imported)."""
    return type(X).__module__.startswith("pandas") and hasattr(X, "columns") and hasattr(X, "to_numpy")


def is_arrow_table(X):
    """Whether ``X`` is a pyarrow Table or RecordBatch (duck-typed)."""
    return type(X).__module__.startswith("pyarrow") and hasattr(X, "column_names") and hasattr(X, "column")


def column_names(X):
    """Column names of a pandas DataFrame or pyarrow Table (None for arrays)."""
    if is_pandas_frame(X):
        return [str(c) for c in X.columns]
    if is_arrow_table(X):
        return [str(c) for c in X.column_names]
    return None


def n_columns(X):
    if is_pandas_frame(X) or is_arrow_table(X):
        return len(column_names(X))
    shape = np.shape(X)
    return shape[1] if len(shape) == 2 else 0


def column(X, j):
    """Column ``j`` of a table or a 2-D array (a Series, an Arrow ChunkedArray or a 1-D array)."""
    if is_pandas_frame(X):
        return X.iloc[:, j]
    if is_arrow_table(X):
        return X.column(j)
    return np.asarray(X, dtype=object)[:, j] if np.asarray(X).dtype.kind == "O" else np.asarray(X)[:, j]


def _dtype_is_categorical(X, j):
    """Whether column ``j`` holds categories by its type (the ``"from_dtype"`` rule)."""
    if is_arrow_table(X):
        import pyarrow as pa

        t = X.schema.types[j]
        return bool(pa.types.is_dictionary(t) or pa.types.is_string(t) or pa.types.is_large_string(t))
    if is_pandas_frame(X):
        import pandas as pd

        dt = X.dtypes.iloc[j]
        name = str(dt)
        # pandas 3 names its default string dtype "str", earlier ones "string[...]"
        if name == "category" or isinstance(dt, pd.StringDtype) or name.startswith("string"):
            return True
        if name == "object":
            return _holds_strings(X.iloc[:, j].to_numpy())
        return False
    arr = np.asarray(X)
    if arr.dtype.kind == "U":
        return True
    return arr.dtype.kind == "O" and arr.ndim == 2 and _holds_strings(arr[:, j])


def _holds_strings(values):
    return any(isinstance(v, str) for v in values)


def categorical_mask(spec, X, n_features):
    """Which of ``X``'s ``n_features`` columns are categorical under ``spec``.

    Parameters
    ----------
    spec : "from_dtype", None, list of str or int, or array-like of bool
        The ``categorical_features`` parameter.
    X : array-like, pandas.DataFrame or pyarrow.Table
    n_features : int

    Returns
    -------
    ndarray of bool, shape (n_features,)

    Raises
    ------
    ValueError
        An unknown name, an index out of range, a mask of the wrong length or type.
    """
    mask = np.zeros(n_features, dtype=bool)
    if spec is None:
        return mask
    if isinstance(spec, str):
        if spec != FROM_DTYPE:
            raise ValueError(f"categorical_features must be 'from_dtype', None, a list of column names or indices, "
                             f"or a boolean mask; got {spec!r}")
        for j in range(n_features):
            mask[j] = _dtype_is_categorical(X, j)
        return mask
    items = list(np.asarray(spec, dtype=object).ravel()) if not isinstance(spec, (list, tuple)) else list(spec)
    if items and all(isinstance(v, (bool, np.bool_)) for v in items):
        if len(items) != n_features:
            raise ValueError(f"categorical_features as a mask needs {n_features} entries (one per feature), "
                             f"got {len(items)}")
        return np.asarray(items, dtype=bool)
    return named_columns(items, column_names(X), n_features, "categorical_features")


def named_columns(items, names, n_features, what):
    """Mask of the columns that a list of column names or indices selects.

    Parameters
    ----------
    items : list of str or int
        Names (of ``names``) or indices (negative ones count from the end).
    names : list of str or None
        The columns' names, when they have any.
    n_features : int
    what : str
        The parameter's name, for the error messages.

    Returns
    -------
    ndarray of bool, shape (n_features,)

    Raises
    ------
    ValueError
        An unknown name, an index out of range, an entry of another type.
    """
    mask = np.zeros(n_features, dtype=bool)
    for v in items:
        if isinstance(v, str):
            if names is None or v not in names:
                raise ValueError(f"{what} names {v!r}, which is not a column of X"
                                 + ("" if names is None else f" (columns: {names[:10]}{' ...' if len(names) > 10 else ''})"))
            mask[names.index(v)] = True
        elif isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)):
            if not -n_features <= int(v) < n_features:
                raise ValueError(f"{what} index {v} is out of range for {n_features} features")
            mask[int(v)] = True
        else:
            raise ValueError(f"{what} entries must be column names, indices or booleans, got {v!r}")
    return mask


def _numeric_column(X, j, name):
    """Column ``j`` as float64 (NaN missing); a non-numeric column is refused by name."""
    col = column(X, j)
    try:
        if hasattr(col, "to_numpy") and is_pandas_frame(X):
            out = col.to_numpy(dtype=np.float64, na_value=np.nan)
        elif is_arrow_table(X):
            import pyarrow as pa
            import pyarrow.compute as pc

            out = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
        else:
            out = np.asarray(col, dtype=np.float64)
    except (TypeError, ValueError, Exception) as exc:  # noqa: BLE001 - arrow raises its own types
        raise ValueError(f"X column {name!r} is not numeric (it holds {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else 'values that are not numbers'}); "
                         "mark it categorical (categorical_features) or encode it as numbers") from None
    if np.isinf(out).any():
        raise ValueError(f"Input X contains infinity or a value too large for dtype('float64') (column {name!r}).")
    return np.ascontiguousarray(out, dtype=np.float64)


def _labels(X, n_features):
    names = column_names(X)
    return names if names is not None else [str(j) for j in range(n_features)]


def fit_columns(X, mask):
    """This rank's float matrix with local category codes, and the categories' summaries.

    Parameters
    ----------
    X : pandas.DataFrame, pyarrow.Table or 2-D array-like
    mask : ndarray of bool, shape (n_features,)

    Returns
    -------
    matrix : ndarray of float64, shape (n, n_features)
        Numeric columns as numbers; categorical ones as local codes (index into their
        summary's ``values``), NaN missing.
    summaries : list of dict
        :func:`histogram.categories.local_categories` of each categorical column.
    """
    n_features = len(mask)
    labels = _labels(X, n_features)
    n = X.num_rows if is_arrow_table(X) else len(X)
    matrix = np.empty((n, n_features), dtype=np.float64)
    summaries = []
    for j in range(n_features):
        if mask[j]:
            try:
                summary, codes = local_categories(column(X, j))
            except ValueError as exc:
                raise ValueError(f"categorical column {labels[j]!r} {exc}") from None
            summaries.append(summary)
            matrix[:, j] = codes
        else:
            matrix[:, j] = _numeric_column(X, j, labels[j])
    return matrix, summaries


def finish_fit(matrix, mask, local_summaries, all_summaries, max_bins, names=None, max_codes=None):
    """Build the coder from every rank's summaries and recode this rank's categorical columns.

    Parameters
    ----------
    matrix : ndarray of float64, shape (n, n_features)
        From :func:`fit_columns`; modified in place.
    mask : ndarray of bool, shape (n_features,)
    local_summaries : list of dict
        This rank's summaries (from :func:`fit_columns`).
    all_summaries : list of list of dict
        Every rank's, in rank order (this rank's among them).
    max_bins : int
    names : sequence of str, optional
    max_codes : int, optional
        Wide codes up to this many per column (gradient boosting); None folds past
        ``max_bins`` (:meth:`histogram.categories.CategoryCoder.from_summaries`).

    Returns
    -------
    CategoryCoder
    """
    columns = np.flatnonzero(mask)
    coder = CategoryCoder.from_summaries(len(mask), columns, all_summaries, int(max_bins), names,
                                         max_codes=max_codes)
    for j, f in enumerate(columns):
        matrix[:, f] = coder.encode_local(j, matrix[:, f], local_summaries[j])
    return coder


def predict_columns(X, coder, names_in, n_features):
    """The float matrix of a table for a model with categorical features.

    Parameters
    ----------
    X : pandas.DataFrame, pyarrow.Table or 2-D array-like
    coder : histogram.categories.CategoryCoder
    names_in : sequence of str or None
        The fitted ``feature_names_in_``: a table's columns must be these, in order.
    n_features : int

    Returns
    -------
    ndarray of float64, shape (n, n_features)
    """
    got = n_columns(X)
    if got != n_features:
        raise ValueError(f"X has {got} features, but the model is expecting {n_features} features as input.")
    names = column_names(X)
    if names_in is not None and names is not None and list(names) != [str(n) for n in names_in]:
        raise ValueError(f"The feature names should match those that were passed during fit: got {names[:10]}, "
                         f"expected {[str(n) for n in names_in][:10]}")
    labels = _labels(X, n_features)
    position = {int(f): j for j, f in enumerate(coder.columns_)}
    n = X.num_rows if is_arrow_table(X) else len(X)
    matrix = np.empty((n, n_features), dtype=np.float64)
    for f in range(n_features):
        j = position.get(f)
        if j is None:
            if _dtype_is_categorical(X, f):
                raise ValueError(f"X column {labels[f]!r} holds categories, but it was numeric when the model was "
                                 "fitted; pass it as numbers")
            matrix[:, f] = _numeric_column(X, f, labels[f])
        else:
            try:
                matrix[:, f] = coder.encode(j, column(X, f))
            except ValueError as exc:
                raise ValueError(f"categorical column {labels[f]!r} {exc}") from None
    return matrix

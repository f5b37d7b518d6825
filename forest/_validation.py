"""Input checks shared by every estimator: features, per-row arguments, weights, magnitudes.

This module owns what ``fit`` and ``predict`` accept and the messages they give:

- features (:func:`validate_features`, :func:`fit_features`): numpy arrays, array-likes,
  pandas DataFrames and pyarrow Tables become C-contiguous float64 ``(n, d)`` through
  scikit-learn's ``validate_data``, so ``n_features_in_`` / ``feature_names_in_`` and the
  messages (wrong feature count, reordered or renamed columns, 1-D input, sparse or
  complex input, no rows) are the ones scikit-learn users know. NaN and pandas / arrow
  nulls mean "missing"; infinities are errors; a column that is not numeric is named.
  Pre-binned codes (``binned=(mapper, codes)``) take their names from ``feature_names``.
- per-row arguments (:func:`check_target`: ``y``, ``t``, ``y_hat``, ``t_hat``) and
  :func:`check_weight`: NaN, pandas ``NA`` and infinities are errors naming the argument.
- magnitudes (:func:`moment_sums`, :func:`check_moment_sums`): split scores square sums
  of ``weight * y`` (and of treatment products), so values that would overflow float64
  there (``y * 1e300``, ``t ~ 1e200``) are rejected instead of giving NaN or constant
  predictions.
- row counts over all ranks (:func:`check_row_count`).
- parameter types (:func:`check_param_types`), the type half of every estimator's
  ``_check_params`` (ranges stay with each estimator), which ``fit``, ``forest-train``
  and model-file loading all run.

Every check here is local to one rank; :mod:`forest.collective_checks` makes the
outcome the same on every rank.
"""
import numbers
import warnings

import numpy as np

from histogram.dtypes import is_bin_dtype

from forest.collective_checks import AgreedError, require_same
from forest.io.feature_table import is_arrow_table, is_pandas_frame

# scikit-learn is imported only off the common path. A numpy array of numbers, which
# scikit-learn's validators would accept unchanged and without a warning, is checked
# here (the ``_plain_*`` functions: same result, same attributes set); anything else
# (DataFrames, lists, sparse or complex input, infinities, wrong shapes) goes to
# scikit-learn, whose messages users know. Importing scikit-learn costs a fresh
# process about 1 s (see forest.estimators.base); tests/forest/test_estimator_base.py
# compares both paths on the same inputs.

#: numpy kinds taken by the plain path: booleans, signed and unsigned integers, floats.
_PLAIN_KINDS = "biuf"


def _validate_data(estimator, X, **kwargs):
    from sklearn.utils.validation import validate_data  # imported on first use (see above)

    return validate_data(estimator, X, **kwargs)


def _all_finite(a):
    """Whether a float array holds no NaN or infinity (one pass, no temporary in the common case)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(a.sum()):
            return True
    return bool(np.isfinite(a).all())


def _plain_features(estimator, X, reset, min_samples):
    """``validate_data``'s result for a plain numpy matrix it would take silently, else None.

    Sets ``n_features_in_`` (and drops ``feature_names_in_``) with ``reset`` as
    scikit-learn does; with ``reset=False`` only an estimator fitted without column
    names and with the same feature count qualifies.
    """
    if (type(X) is not np.ndarray or X.ndim != 2 or X.dtype.kind not in _PLAIN_KINDS or X.shape[1] == 0
            or X.shape[0] < max(min_samples, 1)):
        return None
    if not reset and (getattr(estimator, "n_features_in_", None) != X.shape[1]
                      or hasattr(estimator, "feature_names_in_")):
        return None
    X = np.ascontiguousarray(X, dtype=np.float64)   # X itself when it already is
    if not _all_finite(X) and np.isinf(X).any():    # NaN is "missing"; infinity gets scikit-learn's message
        return None
    if reset:
        estimator.n_features_in_ = X.shape[1]
        if hasattr(estimator, "feature_names_in_"):
            del estimator.feature_names_in_
    return X


def _numeric_dtype(dt):
    """Whether a pandas column dtype (numpy or extension) holds numbers or booleans."""
    try:
        np_dt = np.dtype(getattr(dt, "numpy_dtype", dt))
    except TypeError:  # string, categorical and other extension dtypes
        return False
    return np_dt.kind in "biufc"  # complex passes here: scikit-learn rejects it with its own message


def _non_numeric_column(X):
    """``(name, type)`` of the first column of a table that cannot be read as numbers, or None."""
    if is_arrow_table(X):
        from forest.io.dataio import is_numeric_type

        for name, typ in zip(X.column_names, X.schema.types):
            if not is_numeric_type(typ):
                return str(name), str(typ)
        return None
    if is_pandas_frame(X):
        for name, dt in zip(X.columns, X.dtypes):
            if _numeric_dtype(dt):
                continue
            if getattr(dt, "kind", "") in "Mm" and getattr(dt, "kind", ""):   # dates and durations
                return str(name), str(dt)
            try:  # object columns may still hold numbers; scikit-learn accepts those
                X[name].to_numpy(dtype=np.float64, na_value=np.nan)
            except (TypeError, ValueError):
                return str(name), str(dt)
    return None


def _plain_table(estimator, X, reset, min_samples):
    """``validate_data``'s result for a pyarrow Table of numbers it would take silently, else None.

    Columns of :func:`forest.io.dataio.is_numeric_type` become float64 with NaN for nulls
    (:func:`forest.io.dataio.feature_block`, the tools' own conversion); with ``reset``
    the column names become ``feature_names_in_``, otherwise they must equal it
    exactly (``forest-predict`` passes such tables, so scoring need not import
    scikit-learn).
    """
    if not is_arrow_table(X):
        return None
    import pyarrow as pa

    # A Table only: scikit-learn takes no column names from a RecordBatch.
    if not isinstance(X, pa.Table) or X.num_columns == 0 or X.num_rows < max(min_samples, 1):
        return None

    from forest.io.dataio import feature_block, is_numeric_type

    names = list(X.column_names)
    if not all(is_numeric_type(t) for t in X.schema.types) or len(set(names)) != len(names):
        return None
    if not reset:
        seen = getattr(estimator, "feature_names_in_", None)
        if seen is None or list(seen) != names or getattr(estimator, "n_features_in_", None) != len(names):
            return None

    block = feature_block(X, names)
    if not _all_finite(block) and np.isinf(block).any():
        return None
    if reset:
        estimator.n_features_in_ = len(names)
        estimator.feature_names_in_ = np.asarray(names, dtype=object)
    return block


def validate_features(estimator, X, *, reset, min_samples=1):
    """Feature matrix of ``fit`` (``reset=True``) or ``predict`` (``reset=False``).

    Parameters
    ----------
    estimator : forest.estimators.base.EstimatorBase
        ``reset=True`` records ``n_features_in_`` and ``feature_names_in_`` on it;
        ``reset=False`` checks ``X`` against them.
    X : array-like, pandas.DataFrame or pyarrow.Table, shape (n, d)
    reset : bool
    min_samples : int, default 1
        0 where a rank may hold no rows.

    Returns
    -------
    ndarray of float64, shape (n, d), C-contiguous
        NaN where a value is missing.

    Raises
    ------
    ValueError
        Infinite values, a non-numeric column (named), wrong dimensionality or feature
        count, column names that differ from fit's, complex values, too few rows.
    TypeError
        Sparse input (not supported: ``X.toarray()`` converts it).
    """
    categorical = _categorical_features(estimator, X, reset, min_samples)
    if categorical is not None:
        return categorical
    return _numeric_features(estimator, X, reset, min_samples)


def _numeric_features(estimator, X, reset, min_samples):
    """``validate_features`` for a matrix or table of numbers."""
    plain = _plain_features(estimator, X, reset, min_samples)
    if plain is None:
        plain = _plain_table(estimator, X, reset, min_samples)
    if plain is not None:
        return plain
    column = _non_numeric_column(X)
    if column is not None:
        if not reset:   # a fitted model without categorical columns (a coder would have taken it above)
            raise ValueError(f"X column {column[0]!r} holds categories (type {column[1]}), but it was numeric when "
                             "the model was fitted; pass it as numbers")
        raise ValueError(f"X column {column[0]!r} is not numeric (type {column[1]}); mark it categorical "
                         "(categorical_features) or encode it as numbers")
    return _validate_data(estimator, X, reset=reset, dtype=np.float64, order="C", ensure_all_finite="allow-nan",
                          ensure_min_samples=min_samples)


def _categorical_features(estimator, X, reset, min_samples):
    """``validate_features``'s result when categorical columns are involved, else None.

    At fit (``reset``) with categorical columns (:func:`forest.io.feature_table.categorical_mask`
    of the estimator's ``categorical_features``): the matrix with this rank's local
    category codes, the categories pending for :func:`agreed_features`, which builds the
    coder from every rank's. At predict with a fitted coder: the coded matrix.
    """
    from forest.io import feature_table as ft

    if reset:
        if hasattr(estimator, "category_coder_"):
            # kept for a warm start's check (finish_categories): trees grown on other codes
            estimator._previous_coder = estimator.category_coder_
        for name in ("category_coder_", "_pending_categories"):
            if hasattr(estimator, name):
                delattr(estimator, name)
        if hasattr(estimator, "is_categorical_"):
            del estimator.is_categorical_
        spec = getattr(estimator, "categorical_features", None)
        table = is_pandas_frame(X) or is_arrow_table(X)
        if spec is None or (isinstance(spec, str) and not table and not (
                isinstance(X, np.ndarray) and X.dtype.kind in "OU")):
            return None     # numbers only: validate_features' own paths (any array-like scikit-learn takes)
        if not table:
            X = np.asarray(X)
            if X.ndim != 2:
                return None
        n_features = ft.n_columns(X)
        if n_features == 0:
            return None
        mask = ft.categorical_mask(spec, X, n_features)
        if not mask.any():
            return None
        estimator.is_categorical_ = mask
        matrix, summaries = ft.fit_columns(X, mask)
        _check_rows(estimator, matrix, min_samples)
        estimator.n_features_in_ = n_features
        names = ft.column_names(X)
        if names is not None:
            estimator.feature_names_in_ = np.asarray(names, dtype=object)
        elif hasattr(estimator, "feature_names_in_"):
            del estimator.feature_names_in_
        estimator._pending_categories = (mask, summaries, matrix)
        return matrix
    coder = getattr(estimator, "category_coder_", None)
    if coder is None:
        return None
    names = getattr(estimator, "feature_names_in_", None)
    matrix = ft.predict_columns(X, coder, None if names is None else list(names), int(estimator.n_features_in_))
    _check_rows(estimator, matrix, min_samples)
    return matrix


def _check_rows(estimator, matrix, min_samples):
    if matrix.shape[0] < max(min_samples, 0):
        raise ValueError(f"Found array with {matrix.shape[0]} sample(s) (shape={matrix.shape}) while a minimum of "
                         f"{min_samples} is required by {type(estimator).__name__}.")


def finish_categories(estimator, summaries):
    """Build the fitted category coder from every rank's categories (after the input exchange).

    Every rank calls this with the same ``summaries`` (:func:`feature_summary` shared
    them) and gets the same coder; this rank's pending matrix is recoded in place.
    """
    pending = getattr(estimator, "_pending_categories", None)
    if pending is None:
        return
    from forest.io import feature_table as ft

    mask, local, matrix = pending
    del estimator._pending_categories
    names = getattr(estimator, "feature_names_in_", None)
    estimator.category_coder_ = ft.finish_fit(matrix, mask, local, [s["categories"] for s in summaries],
                                              int(getattr(estimator, "max_bins", None) or 255),
                                              None if names is None else [str(n) for n in names],
                                              max_codes=getattr(estimator, "_category_code_cap", None))


def _check_feature_names(feature_names, n_features):
    names = list(feature_names)
    if len(names) != n_features or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise ValueError(f"feature_names must be {n_features} distinct strings (one per feature), "
                         f"got {len(names)}: {names[:5]}{' ...' if len(names) > 5 else ''}")
    return names


def fit_features(estimator, X, binned=None, feature_names=None, *, min_samples=1):
    """Features of ``fit``: a matrix ``X`` or pre-binned codes, recorded on the estimator.

    Sets ``estimator.n_features_in_`` and ``estimator.feature_names_in_`` (the latter
    only when the features have names: the columns of a DataFrame / Table ``X``, or
    ``feature_names`` given with ``binned``).

    Parameters
    ----------
    estimator : forest.estimators.base.EstimatorBase
    X : array-like, pandas.DataFrame or pyarrow.Table, shape (n, d), or None
        ``None`` only with ``binned``.
    binned : tuple (BinMapper, ndarray), optional
        See :func:`check_binned`.
    feature_names : sequence of str, optional
        Names of the binned features (length ``d``); ``X``, if also given with names,
        must carry the same ones.
    min_samples : int, default 1

    Returns
    -------
    X : ndarray of float64, shape (n, d), or None
    binned : tuple (BinMapper, ndarray of uint8, shape (d, n)) or None
    n_rows : int
    """
    if binned is None:
        if X is None:
            raise ValueError("fit needs X, or binned=(mapper, codes) with X=None; both are None")
        if feature_names is not None:
            raise ValueError("feature_names goes with binned input; a DataFrame or pyarrow Table X names its "
                             "own columns")
        X = validate_features(estimator, X, reset=True, min_samples=min_samples)
        return X, None, X.shape[0]
    if X is not None:
        X = validate_features(estimator, X, reset=True, min_samples=0)
    mapper, codes = check_binned(binned, X)
    n_features, n_rows = codes.shape
    if n_rows < min_samples:
        raise ValueError(f"Found array with {n_rows} sample(s) (binned codes of shape {codes.shape}) while a "
                         f"minimum of {min_samples} is required by {type(estimator).__name__}.")
    if X is None:
        estimator.n_features_in_ = int(n_features)
        if hasattr(estimator, "feature_names_in_"):
            del estimator.feature_names_in_
    if feature_names is not None:
        names = _check_feature_names(feature_names, n_features)
        seen = getattr(estimator, "feature_names_in_", None)
        if seen is not None and list(seen) != names:
            raise ValueError(f"feature_names {names} differ from the columns of X {list(seen)}")
        estimator.feature_names_in_ = np.asarray(names, dtype=object)
    return X, (mapper, codes), int(n_rows)


def agreed_features(summaries, estimator=None):
    """Check that every rank's ``X`` has the same features; used after ``collective_checks``.

    Parameters
    ----------
    summaries : list of dict
        Each with ``features`` (``n_features_in_``) and ``names`` (``feature_names_in_``
        as a list, or None), as shared by :func:`feature_summary`.
    estimator : optional
        The estimator being fitted: its categorical columns' coder is built from every
        rank's categories (:func:`finish_categories`).
    """
    require_same(summaries, "features", lambda d: f"X has {d} features")
    require_same(summaries, "names", lambda names: f"X has columns {names}" if names else "X has no column names")
    require_same(summaries, "categorical", lambda cols: f"X has categorical columns {cols}" if cols
                 else "X has no categorical column")
    if estimator is not None:
        finish_categories(estimator, summaries)
        _check_warm_categories(estimator)


def _check_warm_categories(estimator):
    """A warm start adds trees that read the same codes as the first fit's: same categories, or stop."""
    previous = getattr(estimator, "_previous_coder", None)
    if hasattr(estimator, "_previous_coder"):
        del estimator._previous_coder
    fitted = any(hasattr(estimator, a) for a in ("estimators_", "trees_", "tree_"))
    if not (getattr(estimator, "warm_start", False) and fitted):
        return
    now = getattr(estimator, "category_coder_", None)

    def same(a, b):
        if a is None or b is None:
            return a is None and b is None
        sa, sb = a.get_state(), b.get_state()
        return all(np.array_equal(x, y) if isinstance(x, np.ndarray) else
                   (all(np.array_equal(u, v) for u, v in zip(x, y)) and len(x) == len(y))
                   if isinstance(x, list) else x == y for x, y in ((sa[k], sb[k]) for k in sa))

    if not same(previous, now):
        raise AgreedError("warm_start: the categorical columns or their categories differ from the first fit's; "
                          "the trees read category codes, so fit a new model (warm_start=False)")


def feature_summary(est):
    """``features``, ``names`` and categorical columns (with their categories) of a just-validated
    estimator, for :func:`agreed_features` and :func:`finish_categories`."""
    names = getattr(est, "feature_names_in_", None)
    pending = getattr(est, "_pending_categories", None)
    mask = getattr(est, "is_categorical_", None)
    return dict(features=int(est.n_features_in_), names=None if names is None else [str(n) for n in names],
                categorical=[] if mask is None else np.flatnonzero(mask).tolist(),
                categories=None if pending is None else pending[1])


def _exact_integers(values):
    """A pandas nullable integer/boolean Series without NA as numpy integers/booleans.

    scikit-learn turns such columns into float64, which would make an integer
    treatment look like a continuous dose.
    """
    numpy_dtype = getattr(getattr(values, "dtype", None), "numpy_dtype", None)
    if (numpy_dtype is not None and _is_pandas_series(values) and np.dtype(numpy_dtype).kind in "biu"
            and not values.isna().any()):
        return values.to_numpy(dtype=numpy_dtype)
    return values


def _is_pandas_series(values):
    return type(values).__module__.startswith("pandas") and hasattr(values, "isna") and getattr(values, "ndim", 0) == 1


def _named(name, exc):
    """``exc``'s message, prefixed with the argument's name unless scikit-learn named it."""
    text = str(exc)
    return text if text.startswith(f"Input {name} ") else f"{name}: {text}"


def check_target(values, name, n_rows, *, estimator, dtype=np.float64, multi_output=True, warn_column=False):
    """A per-row argument of ``fit`` (``y``, ``t``, ``y_hat``, ``t_hat``), finite, ``n_rows`` long.

    Parameters
    ----------
    values : array-like or pandas Series / DataFrame, shape (n,) or (n, k)
        pandas ``NA`` counts as missing, which is an error here.
    name : str
        The argument's name, used in every message.
    n_rows : int
        Rows of ``X`` on this rank.
    estimator : forest.estimators.base.EstimatorBase
        For the message when ``values`` is None.
    dtype : numpy dtype, "numeric" or None, default float64
        "numeric" keeps integer and boolean values (treatment codes); None keeps
        any dtype (class labels).
    multi_output : bool, default True
        Accept shape (n, k); with False a column vector is raveled with
        scikit-learn's ``DataConversionWarning`` and wider arrays are errors.
    warn_column : bool, default False
        With ``multi_output``, warn as scikit-learn's forests do when shape is (n, 1).

    Returns
    -------
    ndarray, shape (n,) or (n, k)
    """
    if values is None:
        raise ValueError(f"This {type(estimator).__name__} estimator requires {name} to be passed, "
                         f"but the target {name} is None.")
    values = _exact_integers(values)
    arr = _plain_target(values, dtype, multi_output)
    if arr is not None:
        return _check_target_shape(arr, name, n_rows, warn_column)
    from sklearn.utils.validation import assert_all_finite, check_array, column_or_1d

    try:
        if multi_output:
            arr = check_array(values, ensure_2d=False, dtype=dtype, ensure_all_finite=True, input_name=name,
                              ensure_min_samples=0)
        else:
            arr = column_or_1d(values, warn=True)
            if arr.dtype.kind == "c":
                raise ValueError("Complex data not supported")
            if dtype == "numeric":
                # integers and booleans stay as they are (codes, flags); anything else becomes float
                if arr.dtype.kind not in "biuf":
                    arr = arr.astype(np.float64, copy=False)
            elif dtype is not None:
                arr = arr.astype(dtype, copy=False)
            if arr.dtype.kind in "fc":
                assert_all_finite(arr, input_name=name)
    except ValueError as exc:
        raise ValueError(_named(name, exc)) from exc
    return _check_target_shape(arr, name, n_rows, warn_column)


def _plain_target(values, dtype, multi_output):
    """:func:`check_target`'s array for a numpy array of finite numbers of an accepted shape, else None."""
    if type(values) is not np.ndarray or values.dtype.kind not in _PLAIN_KINDS:
        return None
    if not (values.ndim == 1 or (multi_output and values.ndim == 2 and values.shape[1] > 0)):
        return None
    arr = values.astype(np.float64, copy=False) if dtype is np.float64 else values
    if arr.dtype.kind == "f" and not _all_finite(arr):
        return None
    # scikit-learn's column_or_1d ravels a 1-D target, so a strided y arrives contiguous
    # (and sums in the same order as a contiguous one); check_array keeps the layout.
    return arr if multi_output else np.ravel(arr)


def _check_target_shape(arr, name, n_rows, warn_column):
    if arr.ndim not in (1, 2) or (arr.ndim == 2 and arr.shape[1] == 0):
        raise ValueError(f"{name} must have shape (n,) or (n, k), got {arr.shape}")
    if len(arr) != n_rows:
        raise ValueError(f"{name} has {len(arr)} rows but X has {n_rows} (inconsistent numbers of samples)")
    if warn_column and arr.ndim == 2 and arr.shape[1] == 1:
        from sklearn.exceptions import DataConversionWarning

        warnings.warn(f"A column-vector {name} was passed when a 1d array was expected. Please change the shape "
                      f"of {name} to (n_samples,), for example using ravel().", DataConversionWarning, stacklevel=4)
    return arr


def check_weight(sample_weight, n_rows):
    """Sample weights, shape (n_rows,), finite and non-negative (ones when None).

    A rank may hold only zero weights; the total over all ranks is checked by the
    caller once the ranks have shared it.

    Returns
    -------
    ndarray of float64, shape (n_rows,)
    """
    if sample_weight is None:
        return np.ones(n_rows)
    if isinstance(sample_weight, numbers.Number):
        return np.full(n_rows, float(sample_weight))
    g = _plain_target(sample_weight, np.float64, multi_output=False)
    if g is None:
        from sklearn.utils.validation import check_array

        g = check_array(sample_weight, ensure_2d=False, dtype=np.float64, input_name="sample_weight",
                        ensure_min_samples=0)
    if g.shape != (n_rows,):
        raise ValueError(f"sample_weight.shape == {g.shape}, expected {(n_rows,)}!")
    if (g < 0).any():
        raise ValueError("Negative values in data passed to sample_weight")
    return g


def is_seed(value):
    """Whether ``value`` is an int numpy can seed with, ``[0, 2**32 - 1]`` (the estimators' one seed rule)."""
    return isinstance(value, (int, np.integer)) and 0 <= value <= 2**32 - 1


def check_class_labels(y):
    """Raise scikit-learn's error unless ``y`` (1-D) holds class labels rather than a continuous target.

    Integers and booleans always are; other dtypes go to scikit-learn's
    ``check_classification_targets`` (floats that are whole numbers pass, others not).
    """
    if type(y) is np.ndarray and y.ndim == 1 and y.dtype.kind in "biu":
        return
    from sklearn.utils.multiclass import check_classification_targets

    check_classification_targets(y)


def check_labels(values, n_rows, *, estimator):
    """A classifier's ``y``: one class label per row, as scikit-learn's classifiers accept them.

    Integers, booleans, strings and whole-number floats are labels; continuous floats,
    NaN, missing values (None, pandas ``NA``), multi-output ``y`` and labels that mix
    text and numbers are refused with one line. A column vector ``(n, 1)`` is raveled
    with scikit-learn's ``DataConversionWarning``.

    Parameters
    ----------
    values : array-like or pandas Series, shape (n_rows,)
    n_rows : int
        Rows of ``X`` on this rank.
    estimator : forest.estimators.base.EstimatorBase
        For the message when ``values`` is None.

    Returns
    -------
    ndarray, shape (n_rows,)
        The labels, of their own dtype (int, bool, float, str or object).
    """
    y = check_target(values, "y", n_rows, estimator=estimator, dtype=None, multi_output=False)
    if y.dtype.kind == "O":
        missing = np.array([v is None or (isinstance(v, float) and v != v) or type(v).__name__ == "NAType"
                            for v in y], dtype=bool)
        if missing.any():
            raise ValueError(f"y has {int(missing.sum())} missing label(s) (None or NaN; first at row "
                             f"{int(np.flatnonzero(missing)[0])})")
        kinds = {isinstance(v, (str, bytes)) for v in y}
        if len(kinds) > 1:
            raise ValueError("y mixes text and numeric labels; give every label the same type")
    try:
        check_class_labels(y)
    except TypeError as exc:  # labels numpy cannot order
        raise ValueError(f"y holds labels that cannot be sorted: {exc}") from None
    return y


def label_kind(labels):
    """``"text"`` or ``"number"`` for an array of labels (booleans count as numbers, as in NumPy)."""
    if labels.dtype.kind in "US" or (labels.dtype.kind == "O" and len(labels)
                                     and isinstance(labels.flat[0], (str, bytes))):
        return "text"
    return "number"


def agreed_classes(label_sets):
    """The sorted union of every rank's labels: the same ``classes_`` at any rank count.

    Parameters
    ----------
    label_sets : list of ndarray
        Each rank's ``np.unique(labels)`` in rank order (the same list on every rank);
        a rank without rows gives an empty array of any dtype.

    Returns
    -------
    ndarray, shape (n_classes,)

    Raises
    ------
    forest.collective_checks.AgreedError
        When ranks hold labels of different kinds (text on one, numbers on another).
    """
    held = [(r, np.asarray(s)) for r, s in enumerate(label_sets) if len(s)]
    if not held:
        return np.zeros(0)
    kinds = {label_kind(s) for _, s in held}
    if len(kinds) > 1:
        first, first_labels = held[0]
        rank, labels = next((r, s) for r, s in held if label_kind(s) != label_kind(first_labels))
        raise AgreedError(f"y holds {label_kind(labels)} labels on rank {rank} but {label_kind(first_labels)} labels "
                          f"on rank {first}; give every rank labels of one kind")
    return np.unique(np.concatenate([s for _, s in held]))


def check_row_count(estimator, n_rows, minimum, n_ranks=1):
    """Raise unless ``n_rows`` (over all ranks) reaches the estimator's ``minimum``.

    Raises
    ------
    forest.collective_checks.AgreedError
        A ``ValueError`` every rank raises alike (``n_rows`` is a shared total).
    """
    where = " over all ranks" if n_ranks > 1 else ""
    name = type(estimator).__name__
    if n_rows == 0:
        raise AgreedError(f"Found array with 0 sample(s){where} while a minimum of {minimum} is required by {name}.")
    if n_rows < minimum:
        raise AgreedError(f"{name} needs at least {minimum} rows to fit, got n_samples = {n_rows}{where}")


def check_weight_total(weight_total):
    """Raise unless the sample weights' sum over all ranks' rows is positive.

    Raises
    ------
    forest.collective_checks.AgreedError
        A ``ValueError`` every rank raises alike (``weight_total`` is a shared total).
    """
    if not weight_total > 0:  # also NaN
        raise AgreedError("sample_weight sums to zero over all rows")


#: Largest accepted sum over all rows of ``|weight * value|`` for the quantities of
#: :func:`moment_sums`. Split criteria square node sums of these products and add a few
#: such squares, so the sums must stay well below ``sqrt(float64 max) ~ 1.3e154``.
MAX_MOMENT_SUM = float(np.sqrt(np.finfo(np.float64).max) / 8)

#: Smallest non-zero sum of :func:`moment_sums` the split statistics can square without
#: underflowing into float64's subnormals (2.2e-308); y ~ 1e-200 made every gain zero.
MIN_MOMENT_SUM = 1e-100

#: What each entry of :func:`moment_sums` sums (absolute values), and the argument blamed.
_MOMENTS = (("sample_weight", "sample_weight"), ("sample_weight * {y}", "{y}"), ("sample_weight * {t}", "{t}"),
            ("sample_weight * {t} * {t}", "{t}"), ("sample_weight * {t} * {y}", "{t} and {y}"))


def moment_sums(g, Y, W=None):
    """This rank's sums of the absolute products split statistics are built from.

    Parameters
    ----------
    g : ndarray, shape (n,)
        Sample weights.
    Y : ndarray, shape (n,) or (n, M), or None
        Outcome (None: class labels, which are not summed).
    W : ndarray, shape (n,) or (n, K), optional
        Treatment (causal forests).

    Returns
    -------
    ndarray of float64, shape (5,)
        ``sum|g|``, ``max_m sum|g y_m|``, ``max_k sum|g w_k|``, ``max_kl sum|g w_k w_l|``,
        ``max_km sum|g w_k y_m|`` (0 for what is not given); inf or NaN where a
        product overflows. Sum them over ranks and pass to :func:`check_moment_sums`.
    """
    ag = np.abs(g)
    ay = np.abs(as_columns(Y)) if Y is not None else np.zeros((len(g), 1))
    out = np.zeros(5)
    # einsum, not ``@``: fits make no threaded BLAS call (histogram._thread_wait).
    with np.errstate(over="ignore", invalid="ignore"):
        out[0] = ag.sum()
        out[1] = np.max(np.einsum("i,im->m", ag, ay))
        if W is not None:
            aw = np.abs(as_columns(W))
            gw = ag[:, None] * aw
            out[2] = np.max(gw.sum(axis=0))
            out[3] = np.max(np.einsum("ik,il->kl", gw, aw))
            out[4] = np.max(np.einsum("ik,im->km", gw, ay))
    return out


def check_moment_sums(sums, y_name="y", t_name="t"):
    """Raise when a sum of :func:`moment_sums` (over all rows) would overflow, or underflow, the split statistics.

    Parameters
    ----------
    sums : ndarray, shape (5,)
    y_name, t_name : str
        How to call the outcome and treatment in the message.

    Raises
    ------
    forest.collective_checks.AgreedError
        A ``ValueError`` every rank raises alike (the sums are totals over all ranks).
    """
    for value, (expr, arg) in zip(sums, _MOMENTS):
        expr, arg = expr.format(y=y_name, t=t_name), arg.format(y=y_name, t=t_name)
        if not value <= MAX_MOMENT_SUM:  # also catches NaN
            raise AgreedError(f"{arg} too large in magnitude: the sum over all rows of |{expr}| is {value:.3g}, "
                             f"above {MAX_MOMENT_SUM:.3g}, so float64 split statistics (squares of such sums) "
                             f"would overflow; rescale {arg}")
        if 0.0 < value < MIN_MOMENT_SUM:  # zero is fine: a constant zero column
            raise AgreedError(f"{arg} too small in magnitude: the sum over all rows of |{expr}| is {value:.3g}, "
                             f"below {MIN_MOMENT_SUM:.3g}, so float64 split statistics (squares of such sums) "
                             f"would underflow; rescale {arg}")


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
    codes = check_codes(codes, mapper.n_features_in_, name="binned codes", dtype=mapper.bin_dtype_)
    if X is not None and (X.shape[0] != codes.shape[1] or X.shape[1] != codes.shape[0]):
        raise ValueError(f"X has shape {X.shape} but the binned codes hold {codes.shape[1]} rows "
                         f"of {codes.shape[0]} features")
    return mapper, np.ascontiguousarray(codes)


def check_codes(binned, n_features=None, name="binned", dtype=np.uint8):
    """Validate feature-major bin codes: uint8 of shape ``(n_features, n_rows)``.

    ``dtype``: the code dtype required (uint16 for a mapper with wide categorical codes,
    ``BinMapper.bin_dtype_``); None accepts either.

    The one home of this check: estimators, growers and predictors all take codes in
    this layout (``BinMapper.transform``), and the compiled kernels read them unchecked.

    Parameters
    ----------
    binned : ndarray
    n_features : int, optional
        Required first-axis length.
    name : str
        Used in error messages.

    Returns
    -------
    ndarray of uint8, shape (n_features, n_rows)
        ``binned`` itself (no copy).
    """
    binned = np.asarray(binned)
    ok = is_bin_dtype(binned.dtype) if dtype is None else binned.dtype == dtype
    if not ok or binned.ndim != 2 or (n_features is not None and binned.shape[0] != n_features):
        want = "n_features" if n_features is None else str(int(n_features))
        kind = "uint8 or uint16" if dtype is None else np.dtype(dtype).name
        raise ValueError(f"{name} must be {kind} of shape ({want}, n_rows) (features first, as BinMapper.transform "
                         f"returns), got {binned.dtype} {binned.shape}")
    return binned


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

"""Categorical feature columns as integer codes: the global category list and its codes.

This module owns how a column of categories (pandas ``category``, Arrow ``dictionary``,
strings, or any column the user names) becomes the numbers the engine bins: each
category gets an integer code, and the code *is* its value bin (the bin mapper's
edges fall at ``code + 0.5``), so a forest's categorical split (a bitset over bins,
:mod:`forest.engine.tree`) reads raw codes and binned codes alike.

Agreement over ranks
    Every rank lists the distinct categories of its own rows with their counts
    (:func:`local_categories`); the lists travel in the fit's one input-check exchange
    (:mod:`forest.collective_checks`), and every rank builds the same coder from all of
    them (:meth:`CategoryCoder.from_summaries`): the union of the ranks' categories in
    sorted order (strings by code point, numbers by value), counts summed. So the codes
    do not depend on how rows are spread over ranks, and a category present on one
    rank only is coded the same everywhere.
More categories than value bins (``max_bins``, at most 255)
    Two policies, chosen by the caller (``max_codes`` of :meth:`CategoryCoder.from_summaries`).
    *Folding* (the default, and what the forests use): the ``max_bins - 1`` most frequent
    categories (ties: sorted order) keep a code each, in sorted order; the rarer ones
    share the last code (``"other"``), as LightGBM folds the tail of a high-cardinality
    column. *Wide codes* (gradient boosting): every category keeps its own code, up to
    ``max_codes`` (at most :data:`histogram.dtypes.MAX_CATEGORY_CODES`, 4,095) codes, past
    which the rarest fold as above; the fit's binned matrix is then ``uint16`` and its
    histogram bin axis as wide as that column (:func:`histogram.dtypes.bin_dtype`). Folding
    a 1,000-level column to 255 codes cost 0.0072 AUC against LightGBM (which keeps a bin
    per level); wide codes close that gap (benchmarks/RESULTS.md, "Categorical features").
    Columns of at most ``max_bins`` categories get the same codes under both policies.
    More than :data:`MAX_LEVELS` distinct values is refused: such a column is an
    identifier, not a category.
Unseen categories and missing values
    NaN / None / pandas NA are missing (the missing bin). A category not seen in
    training is coded as missing at prediction time, so it goes where missing values
    go at each split; it never raises.
"""
import numpy as np

from .dtypes import MAX_CATEGORY_CODES

#: Most distinct values a categorical column may have.
MAX_LEVELS = 100_000

#: Kinds of category values: every non-missing value of a column is a string, or every
#: one is a number (booleans count as numbers).
KINDS = ("str", "number")


def _is_missing_scalar(v):
    if v is None:
        return True
    try:
        return bool(v != v)  # NaN, pandas NA raises TypeError in bool()
    except TypeError:
        return True


def column_values(column):
    """A column's values as ``(kind, values, present)``.

    Parameters
    ----------
    column : pandas.Series, pyarrow.ChunkedArray/Array, or 1-D array-like

    Returns
    -------
    kind : {"str", "number"} or None
        None when the column holds no value at all.
    values : ndarray, shape (n,)
        Unicode strings or float64; missing entries hold an arbitrary filler.
    present : ndarray of bool, shape (n,)

    Raises
    ------
    ValueError
        A column mixing strings and numbers (or holding other objects).
    """
    if hasattr(column, "to_pandas") and not hasattr(column, "cat"):
        column = column.to_pandas()
    if hasattr(column, "cat"):
        # pandas categorical: its categories once, then their integer codes (decoding every
        # row to a Python object cost ~1 us per row)
        cats = column.cat.categories
        codes = np.asarray(column.cat.codes, dtype=np.int64)
        kind, values, ok = column_values(np.asarray(cats, dtype=object) if len(cats) else np.zeros(0, object))
        present = codes >= 0
        if kind is None:
            return None, np.zeros(len(codes)), np.zeros(len(codes), dtype=bool)
        present &= ok[np.where(present, codes, 0)] if len(ok) else present
        return kind, values[np.where(present, codes, 0)], present
    arr = np.asarray(column, dtype=object) if not isinstance(column, np.ndarray) else column
    if arr.dtype.kind in "biuf":
        values = arr.astype(np.float64)
        present = ~np.isnan(values)
        return ("number" if present.any() else None), np.where(present, values, 0.0), present
    if arr.dtype.kind == "U":
        return ("str" if len(arr) else None), arr, np.ones(len(arr), dtype=bool)
    arr = arr.astype(object)
    present = np.fromiter((not _is_missing_scalar(v) for v in arr), dtype=bool, count=len(arr))
    vals = arr[present]
    if len(vals) == 0:
        return None, np.zeros(len(arr)), present
    is_str = np.fromiter((isinstance(v, (str, np.str_)) for v in vals), dtype=bool, count=len(vals))
    if is_str.all():
        out = np.full(len(arr), "", dtype=object)
        out[present] = vals
        return "str", out.astype(str), present
    is_num = np.fromiter((isinstance(v, (int, float, bool, np.number, np.bool_)) for v in vals), dtype=bool,
                         count=len(vals))
    if is_num.all():
        out = np.zeros(len(arr))
        out[present] = vals.astype(np.float64)
        return "number", out, present
    bad = vals[~(is_str | is_num)]
    kind = type(bad[0]).__name__ if len(bad) else "strings and numbers"
    raise ValueError(f"holds {kind if len(bad) else 'both strings and numbers'}; a categorical column needs "
                     f"all strings or all numbers")


def local_categories(column):
    """Distinct categories of this rank's rows, their counts, and the rows' local codes.

    Returns
    -------
    summary : dict
        ``kind`` (``"str"``, ``"number"`` or None), ``values`` (sorted distinct values, a
        list of str or float) and ``counts`` (list of int).
    local_codes : ndarray of float64, shape (n,)
        Index into ``values``, NaN where missing.
    """
    kind, values, present = column_values(column)
    codes = np.full(len(present), np.nan)
    if kind is None:
        return {"kind": None, "values": [], "counts": []}, codes
    uniq, inverse, counts = np.unique(values[present], return_inverse=True, return_counts=True)
    if len(uniq) > MAX_LEVELS:
        raise ValueError(f"has {len(uniq)} distinct values, more than the {MAX_LEVELS} a categorical column may have "
                         "(an identifier? drop it, or pass categorical_features without it to use it as a number)")
    codes[present] = inverse
    return {"kind": kind, "values": uniq.tolist(), "counts": counts.astype(np.int64).tolist()}, codes


class CategoryCoder:
    """Codes of the categorical columns of a fitted model.

    Attributes
    ----------
    n_features_in_ : int
    columns_ : ndarray of int64, shape (n_cat,)
        Which features are categorical, increasing.
    kinds_ : list of str
        ``"str"`` or ``"number"`` per categorical column.
    categories_ : list of ndarray
        Per categorical column, every category seen in training, sorted (unicode or
        float64).
    codes_ : list of ndarray of int64
        The code (value bin) of each category; folded rare categories share the last.
    counts_ : list of ndarray of int64
        Training rows per category.
    n_codes_ : ndarray of int64, shape (n_cat,)
        Codes (value bins) per categorical column.
    """

    _STATE_KEYS = ("n_features_in_", "columns_", "kinds_", "categories_", "codes_", "counts_", "n_codes_")

    @classmethod
    def from_summaries(cls, n_features, columns, summaries, max_bins, names=None, max_codes=None):
        """The coder every rank builds from all ranks' :func:`local_categories` summaries.

        Parameters
        ----------
        n_features : int
        columns : array-like of int
            The categorical features.
        summaries : list of list of dict
            Per rank, one summary per categorical column (in ``columns`` order).
        max_bins : int
            Value bins available per feature (at most 255).
        names : sequence of str, optional
            Feature names, for messages.
        max_codes : int, optional
            Most codes per column (wide codes, in ``[max_bins, MAX_CATEGORY_CODES]``);
            None folds past ``max_bins`` (module docstring).

        Raises
        ------
        ValueError
            A column whose values are strings on one rank and numbers on another.
        """
        cap = int(max_bins) if max_codes is None else int(max_codes)
        if not int(max_bins) <= cap <= MAX_CATEGORY_CODES:
            raise ValueError(f"max_codes must lie in [max_bins={max_bins}, {MAX_CATEGORY_CODES}], got {max_codes!r}")
        self = cls()
        self.n_features_in_ = int(n_features)
        self.columns_ = np.asarray(columns, dtype=np.int64)
        self.kinds_, self.categories_, self.codes_, self.counts_ = [], [], [], []
        for j, f in enumerate(self.columns_):
            label = repr(names[f]) if names is not None else str(int(f))
            parts = [rank[j] for rank in summaries if rank[j]["kind"] is not None]
            kinds = sorted({p["kind"] for p in parts})
            if len(kinds) > 1:
                raise ValueError(f"categorical column {label} holds strings on some ranks and numbers on others; "
                                 "give it one type on every rank")
            kind = kinds[0] if kinds else "number"
            dtype = str if kind == "str" else np.float64
            if parts:
                allv = np.concatenate([np.asarray(p["values"], dtype=dtype) for p in parts])
                allc = np.concatenate([np.asarray(p["counts"], dtype=np.int64) for p in parts])
                cats, inverse = np.unique(allv, return_inverse=True)
                counts = np.bincount(inverse, weights=allc, minlength=len(cats)).astype(np.int64)
            else:
                cats, counts = np.zeros(0, dtype=dtype), np.zeros(0, dtype=np.int64)
            if len(cats) > MAX_LEVELS:
                raise ValueError(f"categorical column {label} has {len(cats)} distinct values over all ranks, more "
                                 f"than {MAX_LEVELS} (an identifier? drop it)")
            self.kinds_.append(kind)
            self.categories_.append(cats if kind == "number" else cats.astype(str))
            self.codes_.append(fold_codes(counts, cap))
            self.counts_.append(counts)
        self.n_codes_ = np.array([int(c.max()) + 1 if len(c) else 1 for c in self.codes_], dtype=np.int64)
        return self

    def encode_local(self, j, local_codes, summary):
        """Global codes (float64, NaN missing) of this rank's rows of column ``j``, from their
        local codes into the rank's own sorted ``summary['values']``."""
        if summary["kind"] is None or len(summary["values"]) == 0:
            return np.full(len(local_codes), np.nan)
        cats = self.categories_[j]
        vals = np.asarray(summary["values"], dtype=str if self.kinds_[j] == "str" else np.float64)
        remap = self.codes_[j][np.searchsorted(cats, vals)].astype(np.float64)
        out = np.full(len(local_codes), np.nan)
        ok = ~np.isnan(local_codes)
        out[ok] = remap[local_codes[ok].astype(np.int64)]
        return out

    def encode(self, j, column):
        """Codes (float64) of a column of category values: NaN for missing and unseen values.

        Raises
        ------
        ValueError
            Strings for a column of numbers or the reverse (never both kinds are seen).
        """
        kind, values, present = column_values(column)
        out = np.full(len(present), np.nan)
        if kind is None:
            return out
        if kind != self.kinds_[j]:
            raise ValueError(f"holds {'strings' if kind == 'str' else 'numbers'}, but its categories in training "
                             f"were {'strings' if self.kinds_[j] == 'str' else 'numbers'}")
        cats = self.categories_[j]
        if len(cats) == 0:
            return out
        v = values[present]
        pos = np.minimum(np.searchsorted(cats, v), len(cats) - 1)
        known = cats[pos] == v
        codes = np.where(known, self.codes_[j][pos].astype(np.float64), np.nan)
        out[np.flatnonzero(present)] = codes
        return out

    def category_names(self, j):
        """Labels of column ``j``'s codes (a folded code lists ``"other (k categories)"``)."""
        labels = []
        cats, codes = self.categories_[j], self.codes_[j]
        for code in range(int(self.n_codes_[j])):
            members = cats[codes == code]
            if len(members) == 1:
                labels.append(str(members[0]) if self.kinds_[j] == "str" else f"{members[0]:g}")
            else:
                labels.append(f"other ({len(members)} categories)")
        return labels

    # ------------------------------------------------------------------ model files
    def get_state(self):
        return {k: getattr(self, k) for k in self._STATE_KEYS}

    @classmethod
    def validate_state(cls, state):
        """Check a state read from a model file (types, shapes, codes in range, sorted categories)."""
        if not isinstance(state, dict) or any(k not in state for k in cls._STATE_KEYS):
            raise ValueError("category coder state lacks fields")
        n = state["n_features_in_"]
        cols = state["columns_"]
        if not isinstance(n, int) or n < 1 or not isinstance(cols, np.ndarray) or cols.dtype != np.int64 \
                or cols.ndim != 1 or (cols < 0).any() or (cols >= n).any() or (np.diff(cols) <= 0).any():
            raise ValueError("category coder columns_ must be increasing feature indices")
        k = len(cols)
        for name in ("kinds_", "categories_", "codes_", "counts_"):
            if not isinstance(state[name], list) or len(state[name]) != k:
                raise ValueError(f"category coder {name} must be a list of {k} entries")
        nc = state["n_codes_"]
        if not isinstance(nc, np.ndarray) or nc.dtype != np.int64 or nc.shape != (k,):
            raise ValueError("category coder n_codes_ must be int64 of one entry per column")
        for j in range(k):
            kind, cats, codes, counts = (state[x][j] for x in ("kinds_", "categories_", "codes_", "counts_"))
            want = "U" if kind == "str" else "f"
            if kind not in KINDS or not isinstance(cats, np.ndarray) or cats.dtype.kind != want or cats.ndim != 1:
                raise ValueError(f"category coder column {j}: categories must be a 1-D {kind} array")
            if len(cats) > 1 and not (cats[1:] > cats[:-1]).all():
                raise ValueError(f"category coder column {j}: categories are not sorted and distinct")
            for name, arr in (("codes", codes), ("counts", counts)):
                if not isinstance(arr, np.ndarray) or arr.dtype != np.int64 or arr.shape != cats.shape:
                    raise ValueError(f"category coder column {j}: {name} must be int64 of one entry per category")
            if len(codes) and ((codes < 0).any() or (codes >= nc[j]).any()):
                raise ValueError(f"category coder column {j}: codes outside 0..{nc[j] - 1}")
            if nc[j] < 1 or nc[j] > MAX_CATEGORY_CODES:
                raise ValueError(f"category coder column {j}: {nc[j]} codes (1..{MAX_CATEGORY_CODES} allowed)")

    @classmethod
    def from_state(cls, state):
        cls.validate_state(state)
        self = cls()
        for k in cls._STATE_KEYS:
            setattr(self, k, state[k])
        return self


def fold_codes(counts, max_bins):
    """Code of each category (sorted order): its rank, or the shared last code for the rarest.

    Parameters
    ----------
    counts : ndarray of int64, shape (K,)
        Training rows per category.
    max_bins : int
        Codes available.

    Returns
    -------
    ndarray of int64, shape (K,)
    """
    k = len(counts)
    if k <= max_bins:
        return np.arange(k, dtype=np.int64)
    keep = np.sort(np.argsort(-counts, kind="stable")[:max_bins - 1])
    codes = np.full(k, max_bins - 1, dtype=np.int64)
    codes[keep] = np.arange(len(keep), dtype=np.int64)
    return codes

"""Treatment coding of the causal forest: which kind a treatment is, its levels, its matrix W.

This module owns the rules that turn the user's ``t`` into the treatment matrix the
forest's moments are built from:

``treatment_type="auto"`` (the default) decides from the values over all ranks:

- a 1-D ``t`` with exactly two distinct values is **binary**, whatever the codes
  (``{0, 1}``, ``{1, 2}``, ``{False, True}``, ``{-1.5, 3.0}``): the smaller value is the
  control, the larger the treated arm; ``classes_`` lists them in that order and the
  effect is the one of moving from the first to the second;
- a 1-D integer (or boolean) ``t`` with 3 to :data:`AUTO_MAX_LEVELS` distinct values is
  **categorical** (arms; the smallest level is the control);
- a 1-D float ``t`` with more than two values, and any 2-D ``t``, is **continuous**
  (a dose; the effect is per unit of ``t``);
- a 1-D integer ``t`` with more than :data:`AUTO_MAX_LEVELS` values is ambiguous (many
  arms, or a count used as a dose?) and is an error asking for ``treatment_type``.

Explicit ``"binary"`` needs exactly two values; ``"categorical"`` at most
:data:`MAX_LEVELS`; ``"continuous"`` takes the values as numbers. A treatment with a
single value (over all ranks) is an error for every kind.

The functions are split by where they run: :func:`treatment_summary` on each rank's
own values (no communication), :func:`resolve_treatment` on the summaries of all ranks
(so every rank decides the same), :func:`encode_treatment` on each rank's values again.
"""
import numpy as np

from forest._validation import as_columns
from forest.collective_checks import AgreedError

TREATMENT_TYPES = ("auto", "binary", "categorical", "continuous")

#: Most distinct values of an integer treatment that ``treatment_type="auto"`` reads as arms.
AUTO_MAX_LEVELS = 10

#: Most levels of a categorical treatment (control included): ``K = MAX_LEVELS - 1`` arms,
#: whose moment channels grow as ``K^2 / 2``.
MAX_LEVELS = 64


def check_treatment_type(kind):
    """Raise unless ``kind`` is one of :data:`TREATMENT_TYPES`."""
    if kind not in TREATMENT_TYPES:
        raise ValueError(f"treatment_type must be one of {TREATMENT_TYPES}, got {kind!r}")


def distinct_values(values, limit):
    """Sorted distinct values of a 1-D array, stopping after ``limit + 1`` of them.

    Each pass removes one value, so this costs ``O(n * min(levels, limit + 1))`` and
    never sorts a long float column just to learn that it has many values.

    Returns
    -------
    ndarray, shape (min(levels, limit + 1),)
        All distinct values when there are at most ``limit``.
    """
    found = []
    rest = np.asarray(values).ravel()
    while rest.size and len(found) <= limit:
        found.append(rest[0])
        rest = rest[rest != rest[0]]
    return np.sort(np.asarray(found, dtype=np.asarray(values).dtype))


def treatment_summary(t, kind):
    """What the other ranks need to know about this rank's treatment values.

    Parameters
    ----------
    t : ndarray, shape (n,) or (n, K)
        Finite numeric values (checked by the caller).
    kind : str
        ``treatment_type`` as given.

    Returns
    -------
    dict
        ``shape`` (``()`` for 1-D, ``(K,)`` for 2-D), ``integer`` (integer or boolean
        dtype), ``levels`` (distinct values up to the limit the kind needs, for 1-D
        ``t``), ``low`` / ``high`` (column minima and maxima; None on an empty rank).
    """
    integer = t.dtype.kind in "biu"
    summary = dict(shape=t.shape[1:], integer=integer, levels=None,
                   low=t.min(axis=0) if len(t) else None, high=t.max(axis=0) if len(t) else None)
    if t.ndim == 1 and kind != "continuous":
        limit = {"binary": 2, "categorical": MAX_LEVELS}.get(kind, AUTO_MAX_LEVELS if integer else 2)
        summary["levels"] = distinct_values(t, limit)
    return summary


def resolve_treatment(kind, summaries):
    """Kind and levels of the treatment from every rank's :func:`treatment_summary`.

    Runs on identical summaries on every rank, so every rank decides the same or
    raises the same error.

    Returns
    -------
    kind : {"binary", "categorical", "continuous"}
    classes : ndarray or None
        Levels in increasing order (control first) for binary and categorical.
    """
    shape = summaries[0]["shape"]
    low = np.min([s["low"] for s in summaries if s["low"] is not None], axis=0)
    high = np.max([s["high"] for s in summaries if s["high"] is not None], axis=0)
    single = np.flatnonzero(np.atleast_1d(low == high))
    if single.size:
        column = "" if shape == () else f" column {single[0]}"
        raise AgreedError(f"the treatment t{column} takes a single value ({np.atleast_1d(low)[single[0]]}) on every "
                         f"row; no effect can be estimated without rows at another treatment level")
    integer = all(s["integer"] for s in summaries)
    if kind == "continuous":
        return "continuous", None
    if shape != ():
        if kind != "auto":
            raise AgreedError(f"a {kind} treatment must be 1-D, got t with {shape[0]} columns")
        return "continuous", None
    parts = [s["levels"] for s in summaries if s["levels"] is not None and len(s["levels"])]
    levels = np.unique(np.concatenate(parts))
    if kind == "auto":
        if len(levels) == 2:
            kind = "binary"
        elif not integer:
            return "continuous", None
        elif len(levels) > AUTO_MAX_LEVELS:
            raise AgreedError(f"t is an integer treatment with more than {AUTO_MAX_LEVELS} distinct values; say what "
                             f"it is: treatment_type='categorical' for arms (at most {MAX_LEVELS} levels) or "
                             f"'continuous' for a dose")
        else:
            kind = "categorical"
    if kind == "binary" and len(levels) != 2:
        raise AgreedError(f"a binary treatment takes exactly two values, t has {len(levels)}"
                         f"{'+' if len(levels) > 2 else ''} ({levels[:5]}{' ...' if len(levels) > 5 else ''})")
    if kind == "categorical" and len(levels) > MAX_LEVELS:
        raise AgreedError(f"a categorical treatment has at most {MAX_LEVELS} levels, t has more")
    return kind, levels


def encode_treatment(t, kind, classes):
    """Treatment matrix of this rank's rows.

    Parameters
    ----------
    t : ndarray, shape (n,) or (n, K)
    kind : str
        From :func:`resolve_treatment`.
    classes : ndarray or None
        From :func:`resolve_treatment`.

    Returns
    -------
    W : ndarray of float64, shape (n, K)
        Arm indicators (binary: 1 for ``classes[1]``; categorical: one column per
        non-control level) or the values themselves (continuous).
    codes : ndarray of int64, shape (n,), or None
        Index of each row's level in ``classes`` (binary and categorical).
    """
    if kind == "continuous":
        return as_columns(t), None
    codes = np.searchsorted(classes, t).astype(np.int64)
    W = np.zeros((len(t), len(classes) - 1))
    treated = codes > 0
    W[treated, codes[treated] - 1] = 1.0
    return W, codes

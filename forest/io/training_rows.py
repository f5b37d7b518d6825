"""Recognising a model's training rows wherever the model meets data.

This module owns one question: are these rows the ones the forest was trained on?
A forest's prediction for one of its own training rows has seen that row's outcome
(the row sits in the leaves it is predicted from), so every analysis that treats such
predictions as held out (calibration, best linear projection, RATE, Qini, a policy
tree's rewards) finds heterogeneity that is not there. grf avoids this by analysing
training rows out of bag; this module lets every entry point (the analysis methods,
``forest-report``, ``forest-policy``) tell training rows from held-out rows, so they
can do the same.

What a fit records (:func:`training_signature`, kept on the estimator as
``training_rows_`` and in its model file; no training row is stored):

* ``rows``: the global row count;
* ``content``: :func:`forest.io.fingerprint.content_hash` of every row's feature codes
  and target columns, keyed by global row id: equal only for the same rows in the
  same order, at any rank count (the checkpoints' fingerprint);
* ``features``: the same hash of the feature codes alone, for data that carries no
  targets (predictions of X only);
* a sketch for partial overlaps: the ``SKETCH_SIZE`` smallest *position-free* row
  keys (a hash of a row's codes and targets without its row id) with their
  multiplicities. Keys are kept by value, so a query row whose key falls at or below
  the sketch's largest key is in the sketch exactly when some training row has its
  content: a sample of the query is checked against a sample of the training rows
  chosen by the same rule (bottom-k sampling). Up to ``SKETCH_SIZE`` distinct keys
  the sketch holds every training row and the check is exact.

What a query gets (:func:`match_rows`, collective): ``"training"`` (the exact rows in
training order: out-of-bag estimates are exact), ``"overlap"`` (some rows are training
rows, but not the training data as trained: a superset, a subset, a shuffle; callers
refuse these with one line), or ``"held-out"``.

Duplicated content is the one ambiguity: a held-out row identical in codes and
targets to a training row (e.g. all-binary features and outcome) looks like a
training row. The sketch's multiplicities give the rate at which a training row
shares its content with another training row, which estimates how often a fresh row
from the same population would; overlap is declared only when the query's hit rate
is clearly above that baseline (a one-sided binomial bound). Data made only of such
duplicates cannot be told apart, and is treated as held out.
"""
import math
import warnings
from typing import NamedTuple

import numpy as np

from native import collectives as col
from native.comm import world

from forest._validation import as_columns, validate_features
from forest.collective_checks import collective_checks
from forest.io.fingerprint import content_hash, row_hashes
from forest.engine.honest_forest import global_ids

#: Distinct row keys a signature keeps (two 8-byte arrays: 512 KiB at most).
SKETCH_SIZE = 32768
#: Largest possible key: the sketch threshold of a complete sketch.
_ALL_KEYS = np.uint64(0xFFFFFFFFFFFFFFFF)
#: Standard deviations above the duplicate baseline before a hit rate means overlap.
_OVERLAP_Z = 4.0


class RowMatch(NamedTuple):
    """How query rows relate to a model's training rows (the same on every rank).

    Attributes
    ----------
    kind : {"training", "overlap", "held-out", "unknown"}
        ``"unknown"``: the model records no signature (written by an older histforest).
    n_rows : int
        Query rows over all ranks.
    n_training : int
        The model's training rows (0 when unknown).
    overlap : float
        Estimated share of the query rows that are training rows (1.0 for
        ``"training"``, 0.0 for ``"held-out"``).
    """

    kind: str
    n_rows: int
    n_training: int
    overlap: float = 0.0

    def sentence(self):
        """One line that says which rows the figures use."""
        if self.kind == "training":
            return (f"these are the model's training rows ({self.n_rows} rows, fingerprint matches): "
                    f"out-of-bag estimates")
        if self.kind == "held-out":
            return f"these {self.n_rows} rows are not the model's training rows: held-out estimates"
        if self.kind == "unknown":
            return ("the model file records no training-data fingerprint (written by an older histforest): the rows "
                    "are treated as held out; if they are training rows, the figures are in-sample and biased")
        return (f"about {round(self.overlap * self.n_rows)} of these {self.n_rows} rows are training rows of the model "
                f"(trained on {self.n_training} rows), but they are not its training data as trained")

    def refusal(self, what="the data"):
        """The one-line error of an ``"overlap"`` match: what to pass instead."""
        return (f"{what} holds training rows of this model: about {round(self.overlap * self.n_rows)} of its "
                f"{self.n_rows} rows were among the {self.n_training} it was trained on, so its estimates there "
                f"would be in-sample and biased; pass held-out rows only, or the training data unchanged (the same "
                f"rows in the same order) for out-of-bag estimates")


def row_keys(codes, columns):
    """Position-free key of each row: a hash of its feature codes and target values.

    Parameters
    ----------
    codes : ndarray of uint8, shape (n_features, n)
    columns : sequence of array-like, each shape (n,) or (n, k)

    Returns
    -------
    ndarray of uint64, shape (n,)
    """
    n = codes.shape[1]
    return row_hashes(np.zeros(n, dtype=np.int64), codes, [as_columns(c) for c in columns])


def _bottom_unique(keys, k):
    """The ``k`` smallest distinct keys and their multiplicities, ascending, and whether that is all of them."""
    values, counts = _smallest_distinct(keys, k + 1)
    return values[:k], counts[:k], len(values) <= k


def _smallest_distinct(keys, k):
    """The ``k`` smallest distinct keys (or all) and their multiplicities, ascending."""
    m = min(len(keys), 4 * k)
    while True:
        # Partial selection instead of sorting every key: once the keys at or below
        # the m-th smallest hold k distinct values, they hold every copy of the k
        # smallest distinct ones. Duplicates can leave fewer: widen and retry.
        below = keys if m == len(keys) else keys[keys <= np.partition(keys, m - 1)[m - 1]]
        values, counts = np.unique(below, return_counts=True)
        if len(values) >= k or m == len(keys):
            return values[:k], counts[:k].astype(np.int64)
        m = min(len(keys), 4 * m)


def _merge(values, counts, k):
    """Union of per-rank ``(values, counts)`` summing the counts; the ``k`` smallest values."""
    order = np.argsort(values, kind="stable")
    values, counts = values[order], counts[order]
    starts = np.flatnonzero(np.r_[True, values[1:] != values[:-1]]) if len(values) else np.zeros(0, np.int64)
    merged = values[starts]
    summed = np.add.reduceat(counts, starts) if len(values) else np.zeros(0, np.int64)
    return merged[:k], summed[:k].astype(np.int64), len(merged) <= k


def training_signature(comm, gids, n_global, codes, columns, sketch_size=SKETCH_SIZE):
    """What a fit records about its rows (collective; identical on every rank and rank count).

    Parameters
    ----------
    comm : native.comm.Communicator
    gids : ndarray of int64, shape (n_local,)
        Global row ids of this rank's rows.
    n_global : int
    codes : ndarray of uint8, shape (n_features, n_local)
        The rows' feature codes.
    columns : sequence of array-like, each shape (n_local,) or (n_local, k)
        The targets as the estimator coded them (see each estimator's ``_row_columns``).
    sketch_size : int

    Returns
    -------
    dict
        ``rows`` (int), ``content`` and ``features`` (16 hex digits), ``keys``
        (uint64, ascending, at most ``sketch_size``), ``counts`` (int64, >= 1, same
        length), ``complete`` (bool: the sketch holds every distinct key).
    """
    columns = [as_columns(c) for c in columns]
    keys = row_keys(codes, columns)
    values, counts, complete = _bottom_unique(keys, sketch_size)
    if comm.size > 1:
        values = col.allgatherv(comm, values)
        counts = col.allgatherv(comm, counts)
        complete = bool(col.allreduce(comm, np.array([0 if complete else 1], dtype=np.int64))[0] == 0)
    values, counts, merged_complete = _merge(values, counts, sketch_size)
    # Complete only when no rank cut its list short and the union fits.
    complete = complete and merged_complete
    return {"rows": int(n_global),
            "content": content_hash(comm, gids, codes, columns),
            "features": content_hash(comm, gids, codes),
            "keys": values, "counts": counts, "complete": bool(complete)}


def validate_signature(sig):
    """Raise ``ValueError`` unless ``sig`` is a well-formed :func:`training_signature` (model files)."""
    if not isinstance(sig, dict):
        raise ValueError(f"training_rows_ must be a dict, got {type(sig).__name__}")
    expected = {"rows", "content", "features", "keys", "counts", "complete"}
    if set(sig) != expected:
        raise ValueError(f"training_rows_ must have the keys {sorted(expected)}, got {sorted(sig)}")
    rows = sig["rows"]
    if not isinstance(rows, (int, np.integer)) or isinstance(rows, (bool, np.bool_)) or rows < 0:
        raise ValueError(f"training_rows_['rows'] must be a non-negative int, got {rows!r}")
    for name in ("content", "features"):
        h = sig[name]
        if not (isinstance(h, str) and len(h) == 16 and all(c in "0123456789abcdef" for c in h)):
            raise ValueError(f"training_rows_[{name!r}] must be 16 hex digits")
    keys, counts = sig["keys"], sig["counts"]
    if not (isinstance(keys, np.ndarray) and keys.dtype == np.uint64 and keys.ndim == 1
            and isinstance(counts, np.ndarray) and counts.dtype == np.int64 and counts.shape == keys.shape):
        raise ValueError("training_rows_ keys and counts must be 1-D uint64 and int64 arrays of one length")
    if len(keys) > SKETCH_SIZE or (len(keys) > 1 and not (keys[1:] > keys[:-1]).all()):
        raise ValueError(f"training_rows_ keys must be strictly increasing, at most {SKETCH_SIZE} of them")
    if (counts < 1).any() or int(counts.sum()) > rows:
        raise ValueError("training_rows_ counts must be >= 1 and sum to at most the row count")
    if not isinstance(sig["complete"], (bool, np.bool_)):
        raise ValueError("training_rows_['complete'] must be a bool")


def _duplicate_rate(sig):
    """Share of sketched training rows whose content another training row shares."""
    counts = sig["counts"]
    total = counts.sum()
    return float(counts[counts > 1].sum() / total) if total else 0.0


def match_rows(sig, comm, gids, n_global, codes, columns=None):
    """Compare this data with a model's training rows (collective).

    Parameters
    ----------
    sig : dict or None
        The model's ``training_rows_`` (:func:`training_signature`); None for a model
        that records none.
    comm, gids, n_global, codes
        As :func:`training_signature`, for the query rows.
    columns : sequence of array-like, optional
        The query's targets coded as in the fit; None when the data has none (then
        only an exact match of the feature codes is recognised: ``"training"`` or
        ``"held-out"``).

    Returns
    -------
    RowMatch
    """
    if sig is None:
        return RowMatch("unknown", int(n_global), 0)
    n_train = int(sig["rows"])
    if columns is None:
        same = n_global == n_train and content_hash(comm, gids, codes) == sig["features"]
        return RowMatch("training" if same else "held-out", int(n_global), n_train, float(same))
    columns = [as_columns(c) for c in columns]
    if n_global == n_train and content_hash(comm, gids, codes, columns) == sig["content"]:
        return RowMatch("training", int(n_global), n_train, 1.0)
    keys = row_keys(codes, columns)
    threshold = _ALL_KEYS if sig["complete"] or not len(sig["keys"]) else sig["keys"][-1]
    candidates = keys[keys <= threshold]
    hits = np.isin(candidates, sig["keys"]).sum()
    tally = np.array([len(candidates), hits], dtype=np.int64)
    if comm.size > 1:
        tally = col.allreduce(comm, tally)
    n_cand, n_hits = int(tally[0]), int(tally[1])
    if n_cand == 0 or n_hits == 0:
        return RowMatch("held-out", int(n_global), n_train)
    base = _duplicate_rate(sig)
    rate = n_hits / n_cand
    # A held-out row hits with probability about `base` (its content repeats a
    # training row's as often as a training row's repeats another's); overlap only
    # when the hits are clearly more than that. A sketch of m rows cannot see rates
    # much below 3 / m (none seen is no proof of none), hence the floor.
    floor = max(base, 3.0 / max(1, int(sig["counts"].sum())))
    bound = floor + _OVERLAP_Z * math.sqrt(floor * (1.0 - min(floor, 0.5)) / n_cand)
    if base >= 1.0 or rate <= bound:
        return RowMatch("held-out", int(n_global), n_train)
    share = min(1.0, max(0.0, (rate - base) / (1.0 - base)))
    return RowMatch("overlap", int(n_global), n_train, share)


class TrainingRowsNotice(UserWarning):
    """Rows passed as held out are the model's training rows: out-of-bag estimates are used instead.

    A warning category of its own, so that a program that knows can silence it
    (``warnings.simplefilter("ignore", TrainingRowsNotice)``).
    """


class TrainingRowsMixin:
    """The estimator side: record the signature in ``fit``, compare rows later.

    Host classes define ``_row_columns(*targets, n)`` -> list of float arrays: the
    targets as their ``fit`` codes them (the same list ``fit`` passes to
    :meth:`_record_training_rows`), and have ``bin_mapper_`` once fitted.
    """

    def _record_training_rows(self, comm, gids, n_global, codes, columns):
        """Set ``training_rows_`` (collective: every rank of the fit calls it)."""
        self.training_rows_ = training_signature(comm, gids, n_global, codes, columns)

    def _match_codes(self, X, columns, comm):
        """``(RowMatch, codes, gids)`` of validated float rows ``X`` (collective)."""
        codes = self.bin_mapper_.transform(X)
        gids, n_global = global_ids(comm, len(X))
        match = match_rows(getattr(self, "training_rows_", None), comm, gids, n_global, codes, columns)
        return match, codes, gids

    def training_row_match(self, X, *targets, comm=None):
        """Are these rows the model's training rows? (collective under ``mpirun``)

        Parameters
        ----------
        X : array-like, shape (n_local, n_features)
            This rank's rows, in the order of the data set (ranks hold consecutive
            blocks, as in ``fit``).
        *targets : array-like
            The fit's target arguments in ``fit``'s order (the causal forest's ``t, y``,
            the instrumental forest's ``t, y, z``, the regression forest's ``y``), or
            none: then only the features are compared, and only an exact match of the
            training features in training order is recognised.
        comm : native.comm.Communicator, optional
            ``None`` means ``native.comm.world()``.

        Returns
        -------
        RowMatch
            The same on every rank.
        """
        comm = world() if comm is None else comm
        with collective_checks(comm):
            X = validate_features(self, X, reset=False, min_samples=0)
            columns = self._row_columns(*targets, n=len(X)) if targets else None
        return self._match_codes(X, columns, comm)[0]


def notify_training_rows(match, stacklevel=3):
    """Warn (:class:`TrainingRowsNotice`) that ``match``'s rows get out-of-bag estimates."""
    warnings.warn(match.sentence(), TrainingRowsNotice, stacklevel=stacklevel)

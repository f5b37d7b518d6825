"""ProbabilityForest: honest class probabilities (grf's ``probability_forest``).

This module owns the forest classifier. It is :class:`RegressionForest` on the one-hot
coding of the class labels, and nothing else: the same sampling, honesty, splitting,
leaf layout, forest-level weighted estimator, out-of-bag sums, checkpoints and model
files. What it adds is the classifier's face: class labels agreed over the ranks
(``classes_``), the one-hot target, ``predict_proba`` / ``predict`` /
``predict_log_proba`` and scikit-learn's classifier tags.

Why the regression machinery is the right one: with ``y_ik = 1[y_i = k]`` the
multi-target variance gain of :class:`forest.criteria.basic.VarianceCriterion`,
``sum_k S_Lk^2 / W_L + S_Rk^2 / W_R - S_k^2 / W`` (``S_k`` the weight of class ``k``
in a node, ``W`` the node's weight), equals ``W G - W_L G_L - W_R G_R`` with
``G = 1 - sum_k (S_k / W)^2``: the weighted Gini decrease, grf's probability
splitting rule. And the weighted mean of the one-hot columns over a leaf is the
leaf's weighted class frequency, so the forest-level estimator
``sum_i alpha_i(x) w_i 1[y_i = k] / sum_i alpha_i(x) w_i`` is grf's probability
estimate.

One thing is its own, for speed: without sample weights the trees grow on
:class:`forest.criteria.one_hot.OneHotCriterion` (:meth:`ProbabilityForest._split_criterion`),
the same gain on one channel fewer (the last class's sum is the rest) with one division
per side. Trees, leaves and probabilities stay the regression forest's bit for bit; the
stored split gains (``gain_importances_``) are the correctly rounded ones, within 1e-12
of the regression forest's.
"""
import copy

import numpy as np

from native import collectives as col
from native.comm import world

from forest._validation import agreed_classes, check_labels, validate_features
from forest.collective_checks import AgreedError
from forest.criteria.one_hot import OneHotCriterion
from forest.estimators.base import ClassifierMixin, check_is_fitted
from forest.estimators.probability_choice import fit_auto
from forest.estimators.regression_forest import RegressionForest, target_standardisation
from forest.io import model_checks, model_io


def one_hot(labels, classes):
    """The indicator columns of each row's class.

    Parameters
    ----------
    labels : ndarray, shape (n,)
    classes : ndarray, shape (n_classes,)
        Sorted.

    Returns
    -------
    ndarray of float64, shape (n, n_classes)
        ``out[i, k] = 1`` where ``labels[i] == classes[k]``; a row whose label is not
        in ``classes`` is all zeros.
    """
    out = np.zeros((len(labels), len(classes)))
    if len(labels) == 0:
        return out
    index = np.minimum(np.searchsorted(classes, labels), len(classes) - 1)
    known = np.asarray(classes[index] == labels, dtype=bool)
    out[np.flatnonzero(known), index[known]] = 1.0
    return out


class ProbabilityForest(ClassifierMixin, RegressionForest):
    """Honest random forest class probabilities on binned histograms (grf's ``probability_forest``).

    Each tree splits by weighted Gini decrease on the structure half of its subsample
    and estimates its leaves' class frequencies on the other half; the probability of
    class ``k`` at ``x`` is ``sum_i alpha_i(x) w_i 1[y_i = k] / sum_i alpha_i(x) w_i``
    with ``alpha_i(x)`` the forest weights (each tree's ``1 / leaf rows``) and ``w_i``
    the sample weights. This is exactly :class:`RegressionForest` fitted on the
    one-hot coding of ``y``: the multi-target variance gain on one-hot columns *is* the
    Gini decrease (module docstring), and the forests agree bit for bit (but for the split
    gains' last bits without sample weights, module docstring).

    Parameters
    ----------
    n_estimators : int, default 200
    max_samples : float, default 0.8
        Fraction of the rows each tree is drawn from (without replacement). Larger than
        :class:`RegressionForest`'s (and grf's) 0.5 by measurement: 0.8 gave a lower
        held-out log loss and Brier score on every data set of
        ``benchmarks/bench_probability.py`` (RESULTS.md, "ProbabilityForest (issue 34)").
        Little bags (``ci_group_size > 1``) need 0.5 or less.
    oob_score : bool, default False
        Compute the training rows' out-of-bag probabilities in ``fit``
        (``oob_decision_function_``) and their accuracy (``oob_score_``), as scikit-learn's
        forests do with ``oob_score=True``. Off by default, as there: it walks every training
        row through the trees it was left out of (200k rows, 200 trees: 46.4 s against
        43.4 s without, RESULTS.md). :meth:`oob_predict_proba` with the training rows
        computes the same probabilities later, either way.
    honest : bool or "auto", default "auto"
        True: grf's honest trees (split on one half of each tree's subsample, leaf frequencies
        from the other). False: adaptive trees (both from the whole subsample). ``"auto"``:
        honest on more than 5,000 rows over all ranks (``probability_choice.AUTO_MAX_ROWS``),
        where it fits exactly what ``honest=True`` fits and nothing more; on at most 5,000 rows
        the honest forest and two adaptive forests grown as scikit-learn's
        ``RandomForestClassifier`` (``max_features="sqrt"``; ``min_samples_leaf=1`` at
        ``max_samples=0.8``, or ``min_samples_leaf=2`` at ``max_samples=0.632``; only for those
        of the three left at their defaults) are each fitted with ``n_estimators`` trees and the
        one of lowest debiased out-of-bag Brier score is kept (about three fits' time; honest on ties, and
        always with ``ci_group_size > 1``). The same choice on every rank and rank count.
        Why and how: :mod:`forest.estimators.probability_choice`. Measured (RESULTS.md,
        "ProbabilityForest (issue 34)"): honest trees win at scale (200,000 simulated rows) and
        lose on small nearly separable sets (breast_cancer, digits), where the adaptive forests
        win.
    honesty_fraction, min_samples_leaf, min_node_size, alpha, imbalance_penalty, max_depth, max_features,
    max_bins, honesty_prune_leaves
        As in :class:`RegressionForest`, with its defaults.
    ci_group_size, batch_size, categorical_features, random_state, equalize_cluster_weights, warm_start
        As in :class:`RegressionForest`, with its defaults (``ci_group_size=None`` gives no
        little bags at the default ``max_samples=0.8``: ``predict_var`` and
        ``predict_interval``, of the class probabilities, need ``max_samples <= 0.5``).

    Attributes
    ----------
    classes_ : ndarray, shape (n_classes,)
        The sorted union of every rank's labels (so a rank that lacks a class still
        codes it as the others do); text labels are kept as ``str``.
    n_classes_ : int
    n_outputs_ : int
        The one-hot columns the trees grow on (``n_classes_``).
    estimators_ : dict
        Packed forest; node values are ``[sum w 1[y=k] / rows for each class, rows, sum w / rows]``.
    oob_decision_function_ : ndarray, shape (n_local, n_classes)
        With ``oob_score=True``: out-of-bag class probabilities of the rows this rank
        passed to ``fit`` (scikit-learn's name).
    oob_score_ : float
        With ``oob_score=True``: the out-of-bag accuracy over all ranks' rows
        (unweighted, as scikit-learn's).
    honest_ : bool
        Whether the fitted trees are honest (``honest`` itself, or what ``"auto"`` chose).
    tuned_params_ : dict
        With ``honest="auto"``: the parameters the chosen forest changed, e.g. ``{"honest": True}``
        or ``{"honest": False, "max_features": "sqrt", "min_samples_leaf": 1, "max_samples": 0.8}``.
    tuning_ : dict
        With ``honest="auto"``: ``rule``, ``rows`` (over all ranks), ``max_rows``, ``status``,
        ``chosen`` and ``candidates`` (each ``name``, ``params`` and ``oob_brier``, None where not
        compared). Both are kept in model files; a warm start continues the chosen forest.
    bin_mapper_, n_features_in_, feature_names_in_, feature_importances_, gain_importances_, sampling_
        As in :class:`RegressionForest`.

    Notes
    -----
    scikit-learn's estimator checks pass except those in ``_expected_failed_checks``
    (inherited from :class:`RegressionForest`: sample weights are not repeated rows).
    Probabilities of a row sum to 1 up to rounding (a few ulps): they are forest-level
    ratios per class, not renormalised, so they stay bitwise those of the regression
    forest on one-hot targets.
    """

    def __init__(self, n_estimators=200, *, max_samples=0.8, honest="auto", honesty_fraction=0.5, min_samples_leaf=None,
                 min_node_size=None, alpha=None, imbalance_penalty=0.0, max_depth=None, max_features=None,
                 max_bins=255, ci_group_size=None, batch_size=None, random_state=None, equalize_cluster_weights=False,
                 warm_start=False, categorical_features="from_dtype", oob_score=False, honesty_prune_leaves=True):
        # max_samples's default differs from RegressionForest's, and oob_score is the
        # classifier's own (see the docstring); scikit-learn reads the parameters from this signature.
        self.oob_score = oob_score
        super().__init__(n_estimators, max_samples=max_samples, honest=honest, honesty_fraction=honesty_fraction,
                         min_samples_leaf=min_samples_leaf, min_node_size=min_node_size, alpha=alpha,
                         imbalance_penalty=imbalance_penalty, max_depth=max_depth, max_features=max_features,
                         max_bins=max_bins, ci_group_size=ci_group_size, batch_size=batch_size,
                         random_state=random_state, equalize_cluster_weights=equalize_cluster_weights,
                         warm_start=warm_start, categorical_features=categorical_features,
                         honesty_prune_leaves=honesty_prune_leaves)

    _oob_attribute = "oob_decision_function_"   # scikit-learn's name for a classifier's

    def _oob_in_fit(self):
        return bool(self.oob_score)

    def _model_io_restore_(self):
        super()._model_io_restore_()
        self.__dict__.setdefault("oob_score", False)
        sampling = self.__dict__.get("sampling_")
        if isinstance(sampling, dict) and "honest" in sampling:   # files written before honest="auto"
            self.__dict__.setdefault("honest_", bool(sampling["honest"]))

    def _check_params(self):
        target = self
        if isinstance(self.honest, str):
            if self.honest != "auto":
                raise ValueError(f"honest must be a bool or 'auto', got {self.honest!r}")
            # the other parameters are checked as for the honest forest, the first candidate
            target = copy.copy(self)
            target.honest = True
        seed = super(ProbabilityForest, target)._check_params()
        if not isinstance(self.oob_score, (bool, np.bool_)):
            raise TypeError(f"oob_score must be a bool, got {self.oob_score!r}")
        return seed

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = False    # one label per row (the one-hot columns are internal)
        tags.classifier_tags.multi_class = True
        tags.classifier_tags.multi_label = False
        return tags

    def fit(self, X, y, sample_weight=None, *, comm=None, progress=None, binned=None, feature_names=None,
            clusters=None, checkpoint=None):
        """Fit on this rank's rows.

        Input checks are collective (:mod:`forest.collective_checks`): when any rank's
        input is bad, every rank raises the same ``ValueError`` naming that rank. The
        classes are the union of every rank's labels.

        Parameters
        ----------
        X : array-like, pandas DataFrame or pyarrow Table, shape (n_local, n_features), or None
            NaN (or a null) means missing. ``None`` when ``binned`` is given.
        y : array-like, shape (n_local,)
            Class labels: integers, booleans, strings, or floats that are whole numbers
            (scikit-learn's ``check_classification_targets``); at least two classes over
            all ranks. A column vector is raveled with a ``DataConversionWarning``.
        sample_weight : array-like, shape (n_local,), optional
        comm, progress, binned, feature_names, clusters, checkpoint
            As in :meth:`RegressionForest.fit`.

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        if isinstance(self.honest, str):
            # honest="auto": forest.estimators.probability_choice fits the candidates (each through here)
            return fit_auto(self, dict(X=X, y=y, sample_weight=sample_weight, binned=binned,
                                       feature_names=feature_names, clusters=clusters, checkpoint=checkpoint),
                            comm, progress)
        super().fit(X, y, sample_weight, comm=comm, progress=progress, binned=binned, feature_names=feature_names,
                    clusters=clusters, checkpoint=checkpoint)
        self.honest_ = bool(self.honest)
        for key in ("tuned_params_", "tuning_"):       # an earlier honest="auto" fit's
            self.__dict__.pop(key, None)
        self.__dict__.pop("oob_score_", None)
        if self.oob_score:
            # y passed fit's checks; the accuracy's two counts are summed over the ranks
            labels = check_labels(y, len(self.oob_decision_function_), estimator=self)
            right = self.classes_[np.argmax(self.oob_decision_function_, axis=1)] == labels
            counts = np.array([np.count_nonzero(right), len(right)], dtype=np.float64)
            if comm.size > 1:
                counts = col.allreduce(comm, counts)
            self.oob_score_ = float(counts[0] / counts[1])
        return self

    def _local_target(self, y, n):
        """This rank's labels, checked, and its sorted distinct labels for the other ranks."""
        labels = check_labels(y, n, estimator=self)
        try:
            present = np.unique(labels)
        except TypeError as exc:  # e.g. Python objects numpy cannot order
            raise ValueError(f"y holds labels that cannot be sorted: {exc}") from None
        return labels, {"labels": present}

    def _agreed_target(self, summaries, labels):
        """The one-hot target over the classes of all ranks, and its standardisation.

        Returns
        -------
        y : ndarray of float64, shape (n_local, n_classes)
        standardisation : tuple of ndarray, shape (n_classes,) each
        """
        classes = agreed_classes([s["target"]["labels"] for s in summaries])
        if classes.dtype.kind == "O":
            classes = classes.astype(str)  # text labels: one dtype whatever the ranks held
        if len(classes) < 2:
            raise AgreedError(f"{type(self).__name__} needs at least 2 classes in y, got {len(classes)} class "
                              f"over all rows")
        fitted = getattr(self, "classes_", None)
        if self.warm_start and hasattr(self, "estimators_") and fitted is not None and not (
                len(fitted) == len(classes) and np.array_equal(fitted, classes)):
            raise AgreedError(f"warm start: y has classes {classes.tolist()}, the forest was fitted on "
                              f"{np.asarray(fitted).tolist()}; adding trees needs the first fit's classes "
                              f"(or warm_start=False)")
        self.classes_ = classes
        self.n_classes_ = len(classes)
        # Every one-hot column spans [0, 1] over all rows (each class occurs somewhere and,
        # with two classes or more, is absent somewhere): the standardisation a regression
        # forest computes from the ranks' ranges, without sharing them.
        K = len(classes)
        return one_hot(labels, classes), target_standardisation([([0.0] * K, [1.0] * K)])

    def _split_criterion(self, n_out, min_leaf, alpha, penalty, unit, standardisation):
        """With unit weights, :class:`forest.criteria.one_hot.OneHotCriterion`: the same Gini
        decrease on one channel fewer (the last class is the rest) with one division per side.

        Its node sums, values and size limits are the variance criterion's bit for bit and its
        gains are the correctly rounded ones (that module's docstring); with other weights the
        implied class sum would not be exact, so those fits keep the variance criterion.
        """
        shift, scale = standardisation
        # Each class's standardised one-hot row; they must all sum to one number.
        rows = (np.eye(n_out) - shift) / scale
        totals = rows.sum(axis=1)
        if unit and n_out >= 2 and np.all(totals == totals[0]):
            return OneHotCriterion(n_out, totals[0], min_samples_leaf=min_leaf, alpha=alpha,
                                   imbalance_penalty=penalty)
        return super()._split_criterion(n_out, min_leaf, alpha, penalty, unit, standardisation)

    def predict_proba(self, X):
        """Class probabilities (honest leaf frequencies through the forest weights).

        Parameters
        ----------
        X : array-like, shape (n, n_features)

        Returns
        -------
        ndarray of float64, shape (n, n_classes)
            Columns in ``classes_`` order; each row sums to 1 up to rounding.
        """
        check_is_fitted(self, "estimators_")
        X = validate_features(self, X, reset=False, min_samples=0)
        return self._predict_raw(X)

    def predict_log_proba(self, X):
        """``log(predict_proba(X))``; ``-inf`` where a class has probability 0.

        Returns
        -------
        ndarray of float64, shape (n, n_classes)
        """
        proba = self.predict_proba(X)
        with np.errstate(divide="ignore"):
            return np.log(proba)

    def predict(self, X):
        """The most probable class (the first of ``classes_`` among ties).

        Parameters
        ----------
        X : array-like, shape (n, n_features)

        Returns
        -------
        ndarray, shape (n,)
            Labels of ``classes_``'s dtype.
        """
        proba = self.predict_proba(X)  # checks fitted before classes_ is read
        return self.classes_[np.argmax(proba, axis=1)]

    def oob_predict_proba(self, X=None, *, comm=None, clusters=None):
        """Out-of-bag class probabilities of this rank's training rows (same order as in ``fit``).

        Parameters
        ----------
        X : array-like, shape (n_local, n_features), optional
            Exactly the rows this rank passed to ``fit``. Without it, the fitting
            process's own ``oob_decision_function_`` (``oob_score=True``).
        comm : native.comm.Communicator, optional
            The communicator used in ``fit`` (global row ids are recomputed from it).
        clusters : array-like, optional
            The cluster labels passed to ``fit`` (needed when it had clusters).

        Returns
        -------
        ndarray of float64, shape (n_local, n_classes)
            A row that every tree drew (likely only with few trees: ``max_samples ** n_estimators``)
            takes the whole forest's probabilities, as in the fit's ``oob_decision_function_``.
        """
        if X is None:
            check_is_fitted(self, "estimators_")
            if clusters is not None:
                raise ValueError("clusters go with X: without X the fit's own rows and clusters are used")
            if getattr(self, "oob_decision_function_", None) is None:
                raise ValueError("out-of-bag probabilities without X exist only in the process that ran fit with "
                                 "oob_score=True; pass the training rows: oob_predict_proba(X)")
            return self.oob_decision_function_
        proba = super().oob_predict(X, comm=comm, clusters=clusters)
        # RegressionForest.oob_predict leaves such rows NaN; a classifier's summaries (forest-report,
        # oob_predict's labels) need a probability for every row, and fit gives them this one.
        missing = np.isnan(proba).any(axis=1)
        if missing.any():
            proba[missing] = self.predict_proba(X)[missing]
        return proba

    def _interval_center(self, X):
        return self.predict_proba(X)

    def _oob_interval_center(self, X, comm, clusters):
        return self.oob_predict_proba(X, comm=comm, clusters=clusters)

    def oob_predict(self, X=None, *, comm=None, clusters=None):
        """Out-of-bag class labels of this rank's training rows (the argmax of :meth:`oob_predict_proba`).

        Returns
        -------
        ndarray, shape (n_local,)
        """
        return self.classes_[np.argmax(self.oob_predict_proba(X, comm=comm, clusters=clusters), axis=1)]

    def _row_columns(self, y, *, n):
        """The target as ``fit`` codes it for :attr:`training_rows_`: ``[one-hot labels (n, n_classes)]``."""
        return [one_hot(check_labels(y, n, estimator=self), self.classes_)]


# Model files: the class by its module path; its restored state's checks.
model_io.register(ProbabilityForest, check=model_checks.check_probability_forest)

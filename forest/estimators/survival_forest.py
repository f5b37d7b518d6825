"""SurvivalForest: survival curves of censored times from an honest forest (grf's ``survival_forest``).

Splits follow grf's log-rank rule on a global failure-time grid
(:mod:`forest.criteria.survival`). Predictions are grf's: the Kaplan-Meier (or
Nelson-Aalen) estimate of the training rows weighted by the forest weights, from the
times and failure flags the leaves keep (:mod:`forest.engine.leaf_survival`), so a model
file predicts on its own, on any process.
"""
import numpy as np

from native.comm import world

from forest._validation import (agreed_features, check_row_count, check_target, check_weight,
                                feature_summary, fit_features, validate_features)
from forest.analysis.survival import concordance_index
from forest.collective_checks import AgreedError, collective_checks, total
from forest.criteria.survival import (DEFAULT_SPLIT_TIMES, MAX_SPLIT_TIMES, LogRankCriterion, failure_grid,
                                      time_labels)
from forest.engine.clusters import resolve_clusters
from forest.engine.honest_forest import global_ids, grow_honest_forest
from forest.engine.importance import depth_weighted_importance, gain_importance
from forest.engine.leaf_outcomes import cached_layout, gather_leaf_outcomes
from forest.engine.leaf_survival import SurvivalLayout, survival_curves
from forest.engine.predictor import predict_leaves, predict_leaves_binned
from forest.engine.subsample import OUT, forest_row_codes
from forest.estimators.base import EstimatorBase, check_is_fitted
from forest.estimators.forest_weights import ForestWeightsMixin, WeightsSource
from forest.estimators.regression_forest import (check_forest_params, forest_spec, rescaled_weights_again,
                                                 resolve_mtry, scaled_weights, size_rules, weight_range)
from forest.io import model_checks, model_io
from forest.io.continuation import begin_forest
from forest.io.training_rows import TrainingRowsMixin

#: Column of the leaf values holding the estimation rows, and the one holding their mean weight.
COUNT_COL, NORM_COL = 0, 1
#: ``prediction_type`` values of :meth:`SurvivalForest.predict_survival_function`.
PREDICTION_TYPES = ("Kaplan-Meier", "Nelson-Aalen")


def check_survival_targets(time, event, n, estimator):
    """``(time float64 (n,), event bool (n,))`` checked; one clear ``ValueError`` otherwise.

    Times must be finite and non-negative; ``event`` 1 (or True) for an observed
    failure, 0 (False) for a censored time.
    """
    time = check_target(time, "time", n, estimator=estimator, multi_output=False)
    event_raw = check_target(event, "event", n, estimator=estimator, dtype="numeric", multi_output=False)
    if np.any(time < 0):
        raise ValueError(f"time must be non-negative; found {float(time.min())!r}")
    flags = np.asarray(event_raw)
    if flags.dtype != bool and not np.all((flags == 0) | (flags == 1)):
        bad = flags[(flags != 0) & (flags != 1)][0]
        raise ValueError(f"event must be 0 (censored) or 1 (failure observed), found {bad.item()!r}")
    return np.ascontiguousarray(time, dtype=np.float64), flags.astype(bool)


class SurvivalForest(ForestWeightsMixin, TrainingRowsMixin, EstimatorBase):
    """Honest random survival forest (grf's ``survival_forest``), distributed.

    Parameters
    ----------
    n_estimators : int, default 200
    max_samples : float, default 0.5
        Fraction of the rows each tree is drawn from (without replacement).
    honest : bool, default True
        Grow on one part of each tree's subsample, keep the other part's times in the
        leaves.
    honesty_fraction : float, default 0.5
    min_node_size : int, default 15
        A node of at most this many rows is not split (grf's ``min.node.size``).
    alpha : float, default 0.0
        Each child needs ``max(ceil(alpha * rows of the node), 1)`` failures, in ``[0,
        0.25]``. grf's default is 0.05; measured on the five data sets scikit-survival
        ships, 0.05 lost concordance and Brier score on every one (up to 0.04 of C on
        AIDS, 25 % of the integrated Brier score on FLCHAIN; RESULTS.md, "SurvivalForest
        (issue 33)"), so the default is 0: one failure per child. Pass 0.05 for grf's forest.
    min_samples_leaf : int or None, default None
        Fewest rows per child (None: 1, grf's rules).
    max_depth : int or None, default None
    max_features : None, int, float, "sqrt" or "log2", default None
        ``None`` is grf's ``min(ceil(sqrt(d) + 20), d)``.
    max_bins : int, default 255
    max_split_times : int, default 32
        Size of the failure grid the log-rank rule splits on (at most 255): all distinct
        failure times when there are no more, else that many quantiles of them
        (:func:`forest.criteria.survival.failure_grid`). Predictions always use the
        exact times.
    batch_size : int or None, default None
    categorical_features : "from_dtype", list of str or int, array-like of bool, or None, default "from_dtype"
        As for :class:`forest.RegressionForest`.
    random_state : int or None, default None (means 0)
    equalize_cluster_weights : bool, default False
        With ``clusters``: each tree draws the same number of rows from every cluster
        (grf's ``equalize.cluster.weights``).

    Attributes
    ----------
    estimators_ : dict
        Packed forest; node values are ``[rows, mean weight]``.
    leaf_outcomes_ : dict
        The leaves' lists: ``offsets`` (n_nodes + 1,), ``y`` (the times), ``weight`` and
        ``event`` (n_entries,): about ``n_estimators * n * max_samples * (1 -
        honesty_fraction)`` entries.
    failure_times_ : ndarray of float64, shape (G,)
        The failure grid (``predict``'s risk sums the cumulative hazard over it; the
        default times of the curves).
    bin_mapper_, n_features_in_, feature_names_in_, feature_importances_, gain_importances_
        As for :class:`forest.RegressionForest`.

    Notes
    -----
    ``sample_weight`` weighs the log-rank statistic and the curves (frequency weights);
    the size rules count rows. Times equal to a failure time are at risk at it, so a
    row censored at ``t`` counts in the risk set of failures at ``t`` (the usual
    convention).
    """

    #: Sampling parameters of :func:`forest.estimators.regression_forest.check_forest_params`
    #: this forest does not offer (no variance estimates, no warm start).
    ci_group_size = 1
    warm_start = False

    _model_io_exclude_ = ("_prediction_layout_",)

    def __init__(self, n_estimators=200, *, max_samples=0.5, honest=True, honesty_fraction=0.5, min_node_size=15,
                 alpha=0.0, min_samples_leaf=None, max_depth=None, max_features=None, max_bins=255,
                 max_split_times=DEFAULT_SPLIT_TIMES, batch_size=None, random_state=None,
                 equalize_cluster_weights=False, categorical_features="from_dtype"):
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.honest = honest
        self.honesty_fraction = honesty_fraction
        self.min_node_size = min_node_size
        self.alpha = alpha
        self.min_samples_leaf = min_samples_leaf
        self.max_depth = max_depth
        self.max_features = max_features
        self.max_bins = max_bins
        self.max_split_times = max_split_times
        self.batch_size = batch_size
        self.random_state = random_state
        self.equalize_cluster_weights = equalize_cluster_weights
        self.categorical_features = categorical_features

    def _model_io_restore_(self):
        """Defaults for the parameters that older model files lack."""
        self.__dict__.setdefault("equalize_cluster_weights", False)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags

    def _check_params(self):
        """Validate the parameters before any data is touched; returns the seed."""
        seed = check_forest_params(self)
        m = self.max_split_times
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 2 <= m <= MAX_SPLIT_TIMES:
            raise ValueError(f"max_split_times must be an int in [2, {MAX_SPLIT_TIMES}], got {m!r}")
        return seed

    def fit(self, X, time, event, sample_weight=None, *, comm=None, progress=None, binned=None, feature_names=None,
            clusters=None, checkpoint=None):
        """Fit on this rank's rows (collective under ``mpirun``: every rank ends with the same model).

        Parameters
        ----------
        X : array-like, pandas DataFrame or pyarrow Table, shape (n_local, n_features), or None
            NaN means missing; ``None`` with ``binned``.
        time : array-like, shape (n_local,)
            Failure or censoring times, finite and non-negative.
        event : array-like, shape (n_local,)
            1 (True) where the failure was observed, 0 (False) where censored.
        sample_weight : array-like, shape (n_local,), optional
        comm : native.comm.Communicator, optional
        progress : callable, optional
            ``progress(n_trees_done, n_trees_total)``.
        binned : tuple (BinMapper, ndarray), optional
            As for :meth:`forest.RegressionForest.fit`.
        feature_names : sequence of str, optional
        clusters : array-like of int, shape (n_local,), or forest.engine.clusters.ClusterLayout, optional
            Cluster labels (grf's ``clusters``): trees sample whole clusters, and a row is
            out of bag when its cluster is; the out-of-bag methods then need them again.
        checkpoint : None
            Not offered: the leaves' lists are not part of a checkpoint.

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        with collective_checks(comm) as checks:
            if checkpoint is not None:
                raise ValueError("SurvivalForest does not checkpoint (its leaves' lists are not part of a "
                                 "checkpoint); fit without checkpoint")
            seed = self._check_params()
            X, binned, n = fit_features(self, X, binned, feature_names, min_samples=1 if comm.size == 1 else 0)
            resolve_mtry(self.max_features, self.n_features_in_)
            time, event = check_survival_targets(time, event, n, self)
            g = check_weight(sample_weight, n)
            checks.share(rows=n, weight_sum=float(g.sum()), weights=weight_range(g),
                         failures=int(event.sum()), **feature_summary(self))
        summaries = checks.summaries
        agreed_features(summaries, self)
        n_global = total(summaries, "rows")
        check_row_count(self, n_global, 2, comm.size)
        if total(summaries, "failures") == 0:
            raise AgreedError("event holds no failure (every time is censored): there is nothing to estimate a "
                             "survival curve from")
        g = scaled_weights(g, n_global, total(summaries, "weight_sum"), [s["weights"] for s in summaries])

        gids, _ = global_ids(comm, n)
        layout = resolve_clusters(clusters, comm, n, self.equalize_cluster_weights, sample_weight)
        sampling, _, mapper, codes = begin_forest(self, X, binned, self.n_features_in_, seed, comm,
                                                  clustered=layout is not None)
        grid = failure_grid(time, event, self.max_split_times, comm, seed=seed)
        _, leaf, _ = size_rules(self)
        crit = LogRankCriterion(len(grid), alpha=0.0 if self.alpha is None else float(self.alpha),
                                min_samples_leaf=leaf)
        channels = crit.make_channels(time_labels(time, grid), event, g)
        self.sampling_ = sampling
        packed, _, _ = grow_honest_forest(
            codes, mapper, gids, channels, crit, forest_spec(self, sampling, self.n_features_in_, crit.node_value,
                                                             COUNT_COL),
            n_global=n_global, comm=comm, oob=False, progress=progress, clusters=layout)
        self.estimators_ = packed
        self.bin_mapper_ = mapper
        self.failure_times_ = grid
        source = WeightsSource(codes, gids, g, layout)
        self.leaf_outcomes_ = gather_leaf_outcomes(packed, self._estimation_slices(packed, source), time, g, gids,
                                                   COUNT_COL, comm, event=event)
        self._weights_source_ = source
        self._record_training_rows(comm, gids, n_global, codes, [time[:, None], event[:, None].astype(np.float64)])
        self.feature_importances_ = depth_weighted_importance(packed, self.n_features_in_)
        self.gain_importances_ = gain_importance(packed, self.n_features_in_)
        return self

    def _weights_columns(self):
        return COUNT_COL, NORM_COL

    def _weights_factor(self, sample_weight, n_local, comm):
        return rescaled_weights_again(sample_weight, n_local, comm)

    def _row_columns(self, time, event, *, n):
        """The targets as ``fit`` codes them for :attr:`training_rows_`: ``[time (n, 1), event (n, 1)]``."""
        time, event = check_survival_targets(time, event, n, self)
        return [time[:, None], event[:, None].astype(np.float64)]

    # ------------------------------------------------------------------ prediction
    def _layout(self):
        """The lists laid out for prediction (:func:`forest.engine.leaf_outcomes.cached_layout`)."""
        return cached_layout(self, SurvivalLayout, COUNT_COL)

    def _times(self, times):
        if times is None:
            return self.failure_times_
        times = np.asarray(times, dtype=np.float64).reshape(-1)
        if not np.all(np.isfinite(times)):
            raise ValueError("times must be finite numbers")
        return times

    def _curves(self, X, times, use=None, codes=None):
        check_is_fitted(self, "estimators_")
        if codes is None:
            X = validate_features(self, X, reset=False, min_samples=0)
            leaves = predict_leaves(self.estimators_, X)
        else:
            leaves = predict_leaves_binned(self.estimators_, codes, self.bin_mapper_.missing_bin_)
        return survival_curves(self.estimators_, self.leaf_outcomes_, leaves, times, COUNT_COL, use=use,
                               layout=self._layout())

    def curves_binned(self, codes, times, gids=None, clusters=None):
        """Kaplan-Meier and Nelson-Aalen curves of rows given as codes, out of bag with ``gids``.

        For forests that predict nuisance curves of their own rows (the causal survival
        forest): with the rows' global ids, each row's curve comes from the trees that
        did not draw it, or from every tree where all drew it.

        Parameters
        ----------
        codes : ndarray of uint8, shape (n_features, n)
            Rows binned with ``bin_mapper_``.
        times : ndarray of float64, shape (n_times,)
        gids : ndarray of int64, shape (n,), optional
            Global row ids in the fit (out-of-bag curves); None: every tree.
        clusters : forest.engine.clusters.ClusterLayout, optional
            The fit's, for out-of-bag curves of a clustered fit.

        Returns
        -------
        survival, cumulative_hazard : ndarray of float64, shape (n, n_times) each
        """
        check_is_fitted(self, "estimators_")
        times = np.asarray(times, dtype=np.float64)
        use = None
        if gids is not None:
            n_trees = len(self.estimators_["tree_offsets"]) - 1
            use = (forest_row_codes(self.sampling_, n_trees, gids, clusters) == OUT).T
        surv, chf = self._curves(None, times, use=use, codes=codes)
        if use is not None:
            lost = ~use.any(axis=1)
            if lost.any():
                surv[lost], chf[lost] = self._curves(None, times, codes=np.ascontiguousarray(codes[:, lost]))
        return surv, chf

    def predict_survival_function(self, X, times=None, prediction_type="Kaplan-Meier"):
        """``S(t | x)``: the forest-weighted Kaplan-Meier (or Nelson-Aalen) estimate.

        Parameters
        ----------
        X : array-like, shape (n, n_features)
        times : array-like of float, shape (n_times,), optional
            Default :attr:`failure_times_`.
        prediction_type : {"Kaplan-Meier", "Nelson-Aalen"}, default "Kaplan-Meier"
            Nelson-Aalen gives ``exp(-H(t | x))``.

        Returns
        -------
        ndarray of float64, shape (n, n_times)
            Non-increasing in time, 1 before the first failure time of the weighted sample.
        """
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")
        surv, chf = self._curves(X, self._times(times))
        return surv if prediction_type == "Kaplan-Meier" else np.exp(-chf)

    def predict_cumulative_hazard(self, X, times=None):
        """``H(t | x)``: the forest-weighted Nelson-Aalen cumulative hazard, shape (n, n_times)."""
        return self._curves(X, self._times(times))[1]

    def predict(self, X):
        """Risk score: the cumulative hazard summed over the failure grid (larger = earlier failure).

        As scikit-survival's forests define it, so Harrell's concordance of ``predict``
        with the observed times is the model's discrimination.

        Returns
        -------
        ndarray of float64, shape (n,)
        """
        return self.predict_cumulative_hazard(X, self.failure_times_).sum(axis=1)

    def oob_predict(self, X=None, *, times=None, comm=None, clusters=None, prediction_type="Kaplan-Meier"):
        """Out-of-bag survival curves of this rank's training rows (same rows and order as in ``fit``).

        Each row's curve comes from the trees that did not draw it.

        Parameters
        ----------
        X : array-like, shape (n_local, n_features), optional
            This rank's training rows exactly as passed to ``fit``; without it the rows
            kept by the process that ran ``fit``.
        times : array-like, optional
            Default :attr:`failure_times_`.
        comm : native.comm.Communicator, optional
        clusters : array-like, optional
            The cluster labels passed to ``fit`` (needed when it had clusters).
        prediction_type : {"Kaplan-Meier", "Nelson-Aalen"}

        Returns
        -------
        ndarray of float64, shape (n_local, n_times)
            NaN for rows that every tree drew.
        """
        if prediction_type not in PREDICTION_TYPES:
            raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")
        codes, gids, layout = self._training_codes(X, comm, clusters)
        n_trees = len(self.estimators_["tree_offsets"]) - 1
        out_of_bag = (forest_row_codes(self.sampling_, n_trees, gids, layout) == OUT).T
        surv, chf = self._curves(None, self._times(times), use=out_of_bag, codes=codes)
        return surv if prediction_type == "Kaplan-Meier" else np.exp(-chf)

    def oob_risk(self, X=None, *, comm=None, clusters=None):
        """Out-of-bag risk scores of this rank's training rows, shape (n_local,) (NaN where every tree drew the row)."""
        codes, gids, layout = self._training_codes(X, comm, clusters)
        n_trees = len(self.estimators_["tree_offsets"]) - 1
        out_of_bag = (forest_row_codes(self.sampling_, n_trees, gids, layout) == OUT).T
        return self._curves(None, self.failure_times_, use=out_of_bag, codes=codes)[1].sum(axis=1)

    def score(self, X, time, event):
        """Harrell's concordance index of :meth:`predict` against the observed ``(time, event)``."""
        time, event = check_survival_targets(time, event, len(X), self)
        return concordance_index(time, event, self.predict(X))


model_io.register(SurvivalForest, check=model_checks.check_survival_forest)

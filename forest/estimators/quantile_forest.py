"""QuantileForest: conditional quantiles from an honest forest (grf's ``quantile_forest``).

Splits follow grf's quantile rule (relabel a node's outcomes by its quantiles, split as
a classification; on histograms through outcome bins, :mod:`forest.criteria.quantile`).
Predictions are Meinshausen's: the weighted quantiles of the training outcomes under the
forest weights ``alpha_i(x)``, from outcome lists the leaves keep
(:mod:`forest.engine.leaf_outcomes`), so a model file predicts on its own, on any
process, without the training rows.
"""
import numpy as np

from native.comm import world

from forest._validation import (agreed_features, check_row_count, check_target, check_weight,
                                feature_summary, fit_features, validate_features)
from forest.collective_checks import collective_checks, total
from forest.criteria.quantile import DEFAULT_OUTCOME_BINS, QuantileCriterion, split_levels
from forest.engine.honest_forest import global_ids, grow_honest_forest
from forest.engine.importance import depth_weighted_importance, gain_importance
from forest.engine.leaf_outcomes import PredictionLayout, cached_layout, gather_leaf_outcomes, weighted_quantiles
from forest.engine.predictor import BATCH_MIN_ROWS, batch_layout, predict_leaves, predict_leaves_binned
from forest.engine.subsample import OUT, forest_row_codes
from forest.estimators.base import EstimatorBase, RegressorMixin, check_is_fitted
from forest.estimators.forest_weights import ForestWeightsMixin, WeightsSource
from forest.estimators.regression_forest import (check_forest_params, forest_spec, rescaled_weights_again,
                                                 resolve_mtry, scaled_weights, weight_range)
from forest.io import model_checks, model_io
from forest.io.continuation import begin_forest
from forest.io.training_rows import TrainingRowsMixin
from histogram.binning import BinMapper

#: Column of the leaf values holding the estimation rows, and the one holding their mean weight.
COUNT_COL, NORM_COL = 0, 1


def check_levels(quantiles, name="quantiles"):
    """Quantile levels as a float64 array, increasing, distinct, in (0, 1); else ``ValueError``."""
    try:
        levels = np.asarray(quantiles, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a sequence of numbers in (0, 1), got {quantiles!r}") from None
    if (not len(levels) or not np.all(np.isfinite(levels)) or np.any(levels <= 0) or np.any(levels >= 1)
            or np.any(np.diff(levels) <= 0)):
        raise ValueError(f"{name} must be distinct, increasing and in (0, 1), got {levels.tolist()}")
    return levels


class QuantileForest(ForestWeightsMixin, TrainingRowsMixin, RegressorMixin, EstimatorBase):
    """Honest quantile regression forest (grf's ``quantile_forest``), distributed.

    Parameters
    ----------
    n_estimators : int, default 200
    quantiles : sequence of float, default (0.1, 0.5, 0.9)
        Levels the trees split on (grf's relabelling) and ``predict``'s default levels.
    max_samples : float, default 0.5
        Fraction of the rows each tree is drawn from (without replacement).
    honest : bool, default True
        Grow on one part of each tree's subsample, keep the other part's outcomes in
        the leaves.
    honesty_fraction : float, default 0.5
    min_samples_leaf : int, default 5
    max_depth : int or None, default None
    max_features : None, int, float, "sqrt" or "log2", default None
        ``None`` is grf's ``min(ceil(sqrt(d) + 20), d)``.
    max_bins : int, default 255
    batch_size : int or None, default None
    categorical_features : "from_dtype", list of str or int, array-like of bool, or None, default "from_dtype"
        As for :class:`forest.RegressionForest`.
    random_state : int or None, default None (means 0)

    Attributes
    ----------
    estimators_ : dict
        Packed forest; node values are ``[rows, mean weight]``.
    leaf_outcomes_ : dict
        The leaves' outcome lists (:func:`forest.engine.leaf_outcomes.gather_leaf_outcomes`):
        ``offsets`` (n_nodes + 1,), ``y`` and ``weight`` (n_entries,). They hold the
        estimation rows' outcomes, about ``n_estimators * n * max_samples * (1 -
        honesty_fraction)`` of them: the model file's size.
    outcome_bin_mapper_ : histogram.binning.BinMapper
        The outcome bins of the splitting rule.
    bin_mapper_, n_features_in_, feature_names_in_, feature_importances_, gain_importances_
        As for :class:`forest.RegressionForest`.
    """

    #: The sampling parameters of :func:`forest.estimators.regression_forest.check_forest_params`
    #: that this forest does not offer (no variance estimates, no clusters, no warm start).
    ci_group_size = 1
    equalize_cluster_weights = False
    warm_start = False

    #: The prediction layouts (outcome lists, tree records) are rebuilt from the model, never stored.
    _model_io_exclude_ = ("_prediction_layout_", "_batch_walk_")

    _expected_failed_checks = {
        "check_sample_weight_equivalence_on_dense_data": (
            "sample_weight is not equivalent to repeating rows: each tree subsamples rows by a hash of the row "
            "id, so a row of weight 2 is drawn once where its two copies would be drawn independently"),
    }

    def __init__(self, n_estimators=200, *, quantiles=(0.1, 0.5, 0.9), max_samples=0.5, honest=True,
                 honesty_fraction=0.5, min_samples_leaf=5, max_depth=None, max_features=None, max_bins=255,
                 batch_size=None, random_state=None, categorical_features="from_dtype"):
        self.n_estimators = n_estimators
        self.quantiles = quantiles
        self.max_samples = max_samples
        self.honest = honest
        self.honesty_fraction = honesty_fraction
        self.min_samples_leaf = min_samples_leaf
        self.max_depth = max_depth
        self.max_features = max_features
        self.max_bins = max_bins
        self.batch_size = batch_size
        self.random_state = random_state
        self.categorical_features = categorical_features

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags

    def _check_params(self):
        """Validate the parameters before any data is touched; returns the seed."""
        seed = check_forest_params(self)
        check_levels(self.quantiles)
        return seed

    def fit(self, X, y, sample_weight=None, *, comm=None, progress=None, binned=None, feature_names=None,
            checkpoint=None):
        """Fit on this rank's rows (collective under ``mpirun``: every rank ends with the same model).

        Parameters
        ----------
        X : array-like, pandas DataFrame or pyarrow Table, shape (n_local, n_features), or None
            NaN means missing; ``None`` with ``binned``.
        y : array-like, shape (n_local,)
        sample_weight : array-like, shape (n_local,), optional
        comm : native.comm.Communicator, optional
        progress : callable, optional
            ``progress(n_trees_done, n_trees_total)``.
        binned : tuple (BinMapper, ndarray), optional
            As for :meth:`forest.RegressionForest.fit`.
        feature_names : sequence of str, optional
        checkpoint : None
            Not offered yet: the leaves' outcome lists are not part of a checkpoint.

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        with collective_checks(comm) as checks:
            if checkpoint is not None:
                raise ValueError("QuantileForest does not checkpoint yet (its leaves' outcome lists are not part of "
                                 "a checkpoint); fit without checkpoint")
            seed = self._check_params()
            X, binned, n = fit_features(self, X, binned, feature_names, min_samples=1 if comm.size == 1 else 0)
            resolve_mtry(self.max_features, self.n_features_in_)
            y = check_target(y, "y", n, estimator=self)
            if y.ndim != 1:
                raise ValueError(f"QuantileForest takes one outcome: y must be 1-D, got shape {y.shape}")
            g = check_weight(sample_weight, n)
            checks.share(rows=n, weight_sum=float(g.sum()), weights=weight_range(g), **feature_summary(self))
        summaries = checks.summaries
        agreed_features(summaries, self)
        n_global = total(summaries, "rows")
        check_row_count(self, n_global, 2, comm.size)
        g = scaled_weights(g, n_global, total(summaries, "weight_sum"), [s["weights"] for s in summaries])
        levels = check_levels(self.quantiles)

        gids, _ = global_ids(comm, n)
        sampling, _, mapper, codes = begin_forest(self, X, binned, self.n_features_in_, seed, comm)
        # the relabelling's outcome bins: weighted-quantile edges, the same at any rank count
        n_bins = max(DEFAULT_OUTCOME_BINS, 2 * (len(split_levels(levels)) + 1))
        outcome_mapper = BinMapper(max_bins=n_bins, random_state=seed).fit(y[:, None], comm=comm)
        outcome_bins = outcome_mapper.transform(y[:, None])[0]
        crit = QuantileCriterion(levels, int(outcome_mapper.n_bins_non_missing_[0]),
                                 min_samples_leaf=self.min_samples_leaf)
        channels = crit.make_channels(outcome_bins, g)
        self.sampling_ = sampling
        packed, _, _ = grow_honest_forest(
            codes, mapper, gids, channels, crit, forest_spec(self, sampling, self.n_features_in_, crit.node_value,
                                                             COUNT_COL),
            n_global=n_global, comm=comm, oob=False, progress=progress)
        self.estimators_ = packed
        self.bin_mapper_ = mapper
        self.outcome_bin_mapper_ = outcome_mapper
        source = WeightsSource(codes, gids, g, None)
        self.leaf_outcomes_ = gather_leaf_outcomes(packed, self._estimation_slices(packed, source), y, g, gids,
                                                   COUNT_COL, comm)
        self._weights_source_ = source
        self._record_training_rows(comm, gids, n_global, codes, [y[:, None]])
        self.feature_importances_ = depth_weighted_importance(packed, self.n_features_in_)
        self.gain_importances_ = gain_importance(packed, self.n_features_in_)
        # the prediction layouts as part of the fit, not of the first predict (0.2-0.3 s at
        # 200k rows and 100 trees; a loaded model builds them on its first predict)
        self._layout()
        self._batch_walk()
        return self

    def _weights_columns(self):
        return COUNT_COL, NORM_COL

    def _weights_factor(self, sample_weight, n_local, comm):
        return rescaled_weights_again(sample_weight, n_local, comm)

    def _row_columns(self, y, *, n):
        """The target as ``fit`` codes it for :attr:`training_rows_`: ``[y (n, 1)]``."""
        return [check_target(y, "y", n, estimator=self).reshape(n, -1)]

    def predict(self, X, quantiles=None):
        """Conditional quantiles: the forest-weighted quantiles of the training outcomes.

        The quantile at level ``tau`` is the smallest training outcome whose cumulative
        forest weight reaches ``tau`` (grf's definition), so predictions are training
        outcomes and increase with ``tau``.

        Parameters
        ----------
        X : array-like, shape (n, n_features)
        quantiles : sequence of float, optional
            Levels in (0, 1), increasing; default the forest's ``quantiles``.

        Returns
        -------
        ndarray of float64, shape (n, n_quantiles)
        """
        check_is_fitted(self, "estimators_")
        levels = check_levels(self.quantiles if quantiles is None else quantiles)
        X = validate_features(self, X, reset=False, min_samples=0)
        batch = self._batch_walk() if len(X) >= BATCH_MIN_ROWS else None
        leaves = predict_leaves(self.estimators_, X, batch=batch)
        return weighted_quantiles(self.estimators_, self.leaf_outcomes_, leaves, levels, COUNT_COL,
                                  layout=self._layout())

    def _layout(self):
        """The lists laid out for prediction (:func:`forest.engine.leaf_outcomes.cached_layout`)."""
        return cached_layout(self, PredictionLayout, COUNT_COL)

    def _batch_walk(self):
        """The trees' batch-walk layout (:func:`forest.engine.predictor.batch_layout`), built on
        first use and kept on ``_batch_walk_``, keyed by the forest's node array (a new forest
        rebuilds it; never in model files)."""
        cached = getattr(self, "_batch_walk_", None)
        if cached is None or cached[0] is not self.estimators_["feature"]:
            cached = (self.estimators_["feature"], batch_layout(self.estimators_, self.n_features_in_))
            self._batch_walk_ = cached
        return cached[1]

    def oob_predict(self, X=None, *, quantiles=None, comm=None, clusters=None):
        """Out-of-bag quantiles of this rank's training rows (same rows and order as in ``fit``).

        Each row's quantiles come from the trees that did not draw it, so its own
        outcome is in none of the lists used (training rows predicted by ``predict``
        see their own outcome).

        Parameters
        ----------
        X : array-like, shape (n_local, n_features), optional
            This rank's training rows exactly as passed to ``fit``; without it the rows
            kept by the process that ran ``fit``.
        quantiles : sequence of float, optional
        comm : native.comm.Communicator, optional
            The communicator of ``fit`` (global row ids are recomputed from it).
        clusters : None
            For the other forests' signature: this forest is fitted without clusters.

        Returns
        -------
        ndarray of float64, shape (n_local, n_quantiles)
            NaN for rows that every tree drew.
        """
        levels = check_levels(self.quantiles if quantiles is None else quantiles)
        codes, gids, _ = self._training_codes(X, comm, clusters)
        packed = self.estimators_
        n_trees = len(packed["tree_offsets"]) - 1
        out_of_bag = (forest_row_codes(self.sampling_, n_trees, gids) == OUT).T
        leaves = predict_leaves_binned(packed, codes, self.bin_mapper_.missing_bin_)
        return weighted_quantiles(packed, self.leaf_outcomes_, leaves, levels, COUNT_COL, use=out_of_bag,
                                  layout=self._layout())

    def score(self, X, y, sample_weight=None):
        """Coefficient of determination of the median prediction (scikit-learn's regressor score)."""
        from sklearn.metrics import r2_score
        return r2_score(y, self.predict(X, quantiles=[0.5])[:, 0], sample_weight=sample_weight)


model_io.register(QuantileForest, check=model_checks.check_quantile_forest)

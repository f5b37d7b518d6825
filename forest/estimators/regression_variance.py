"""Variance estimates and confidence intervals of a regression forest (grf's ``estimate.variance``).

:class:`RegressionVarianceMixin` gives :class:`forest.estimators.regression_forest.RegressionForest`
(and the forests built on it) ``predict_var``, ``predict_interval`` and their out-of-bag
counterparts. The statistic is the bootstrap of little bags of the forest's ratio
estimate (:func:`forest.analysis.inference.ratio_blb_variance`): trees grown in groups of
``ci_group_size`` that share a half-sample (the default ``ci_group_size=None`` is grf's 2
when ``max_samples <= 0.5``). Each rank computes the variance of its own query rows
from the model alone: no collective, the same numbers at any rank count.

Out of bag, a group enters a training row's estimate only when every tree of the group
left the row out (grf's rule: the row is outside the group's half-sample), so about half
the groups count and the variance is that of an estimate from those groups.
"""
import numpy as np

from forest._validation import as_columns, check_target, check_weight, validate_features
from forest.analysis.linear_projection import regression_calibration
from forest.analysis.inference import check_interval_alpha, normal_interval, ratio_blb_variance, tree_jackknife_error
from forest.engine.clusters import layout_rows, observation_weights
from forest.engine.predictor import predict_leaves, predict_leaves_binned
from forest.engine.subsample import OUT, forest_row_codes
from forest.estimators.base import check_is_fitted
from native.comm import world
from forest.collective_checks import collective_checks

#: Tree-row cells per chunk of query rows (bounds the (rows, trees, values) buffer: 64 MB of
#: float64 for one output).
CHUNK_CELLS = 8_000_000


class RegressionVarianceMixin:
    """``predict_var`` / ``predict_interval`` (new rows) and ``oob_predict_var`` / ``oob_predict_interval``.

    The variances are of the forest's ratio estimate: the prediction of a regression
    forest, the class probabilities of a probability forest (``(n, n_classes)``, with
    intervals around ``predict_proba``).
    """

    def _group_size(self):
        """The fit's trees per little bag, checked (>= 2)."""
        check_is_fitted(self, "estimators_")
        group = int(self.sampling_["ci_group_size"])
        if group < 2:
            raise ValueError(f"variance estimates need little bags: this forest was fitted with ci_group_size="
                             f"{group}; refit with ci_group_size >= 2 (the default None gives 2 when max_samples "
                             f"<= 0.5)")
        k = self.n_outputs_
        if self.estimators_["value"].shape[1] != k + 2:
            raise ValueError("this forest stores per-tree leaf means (written by a histforest before the "
                             "forest-level weighted estimator); refit it for variance estimates")
        return group

    def _chunks(self, n):
        n_trees = len(self.estimators_["tree_offsets"]) - 1
        step = max(1, CHUNK_CELLS // max(n_trees * (self.n_outputs_ + 2), 1))
        return [(lo, min(n, lo + step)) for lo in range(0, n, step)]

    def _ratio_var(self, leaves, valid=None):
        """``(mu, var)`` (m, k) from tree-local leaf ids (m, n_trees)."""
        values = self.estimators_["value"]
        offsets = self.estimators_["tree_offsets"][:-1]
        return ratio_blb_variance(values[leaves + offsets[None, :]], self.n_outputs_, self._group_size(), valid)

    def _shape(self, a):
        return a[:, 0] if self.n_outputs_ == 1 else a

    def _interval_center(self, X):
        """What the intervals are of, at new rows: ``predict`` (a classifier overrides it: ``predict_proba``)."""
        return self.predict(X)

    def _oob_interval_center(self, X, comm, clusters):
        """What the out-of-bag intervals are of: ``oob_predict`` (a classifier: ``oob_predict_proba``)."""
        return self.oob_predict(X, comm=comm, clusters=clusters)

    def predict_var(self, X):
        """Variance of the prediction at each row (bootstrap of little bags).

        Parameters
        ----------
        X : array-like, shape (n, n_features)

        Returns
        -------
        ndarray, shape (n,) or (n, n_outputs)
            NaN where fewer than two little bags are usable (a point whose leaves all
            lack estimation weight in some tree of every group but one).
        """
        self._group_size()
        X = validate_features(self, X, reset=False, min_samples=0)
        var = np.empty((len(X), self.n_outputs_))
        for lo, hi in self._chunks(len(X)):
            var[lo:hi] = self._ratio_var(predict_leaves(self.estimators_, X[lo:hi]))[1]
        return self._shape(var)

    def predict_interval(self, X, alpha=0.05):
        """Normal ``1 - alpha`` confidence intervals around :meth:`predict` from :meth:`predict_var`.

        Returns
        -------
        lower, upper : ndarray, shape of ``predict``
        """
        check_interval_alpha(alpha)
        return normal_interval(self._interval_center(X), self.predict_var(X), alpha)

    def oob_predict_var(self, X=None, *, comm=None, clusters=None):
        """Out-of-bag variance of the training rows of this rank (same order as in ``fit``).

        Parameters
        ----------
        X : array-like, shape (n_local, n_features), optional
            Exactly the rows this rank passed to ``fit``; without it, the fitting
            process's own rows (kept in that process only, never in model files).
        comm : native.comm.Communicator, optional
            The communicator used in ``fit`` (global row ids are recomputed from it).
        clusters : array-like, optional
            The cluster labels passed to ``fit`` (needed when it had clusters).

        Returns
        -------
        ndarray, shape (n_local,) or (n_local, n_outputs)
            NaN for rows with fewer than two little bags that all left them out.
        """
        codes, gids, layout = self._training_codes(X, comm, clusters)
        var = np.empty((len(gids), self.n_outputs_))
        n_trees = len(self.estimators_["tree_offsets"]) - 1
        missing_bin = self.bin_mapper_.missing_bin_
        for lo, hi in self._chunks(len(gids)):
            rows = np.arange(lo, hi)
            leaves = predict_leaves_binned(self.estimators_, codes, missing_bin, rows=rows)
            sub = layout_rows(layout, lo, hi)
            roles = forest_row_codes(self.sampling_, n_trees, gids[lo:hi], sub)
            var[lo:hi] = self._ratio_var(leaves, valid=(roles == OUT).T)[1]
        return self._shape(var)

    def oob_predict_interval(self, X=None, alpha=0.05, *, comm=None, clusters=None):
        """Normal ``1 - alpha`` intervals around :meth:`oob_predict` from :meth:`oob_predict_var`.

        Returns
        -------
        lower, upper : ndarray, shape of ``oob_predict``
        """
        check_interval_alpha(alpha)
        center = self._oob_interval_center(X, comm, clusters)
        return normal_interval(center, self.oob_predict_var(X, comm=comm, clusters=clusters), alpha)

    def test_calibration(self, y, X=None, *, sample_weight=None, clusters=None, comm=None):
        """grf's calibration test of the out-of-bag predictions (``test_calibration`` on a regression forest).

        Regresses ``y`` on the mean out-of-bag prediction and the prediction's deviation
        from it (:func:`forest.analysis.linear_projection.regression_calibration`).

        Parameters
        ----------
        y : array-like, shape (n_local,) or (n_local, n_outputs)
            This rank's training outcomes, as passed to ``fit``.
        X : array-like, optional
            This rank's training rows; without it the fitting process's own.
        sample_weight, clusters : array-like, optional
            The fit's (the observation weights are the sample weights, or with
            ``equalize_cluster_weights`` one over the cluster size, as grf's). Without
            ``X``, the fit's own weights and clusters are used.
        comm : native.comm.Communicator, optional

        Returns
        -------
        forest.analysis.result.EstimateTable
        """
        comm = world() if comm is None else comm
        if getattr(self, "_target_kind", None) != "regressor":
            raise ValueError(f"the calibration test is for regression forests, not a {type(self).__name__}")
        codes, gids, layout = self._training_codes(X, comm, clusters, need_groups=False)
        with collective_checks(comm):       # one rank's bad y or weights: every rank raises
            if X is None and sample_weight is not None:
                raise ValueError("sample_weight goes with X: without X the fit's own weights are used")
            given = None if sample_weight is None else check_weight(sample_weight, len(gids))
            y = self._training_outcomes(y, len(gids))
        if X is None:
            weight = observation_weights(self._weights_source_.factor, layout, len(gids))
            pred = self.oob_predict()
        else:
            weight = observation_weights(given, layout, len(gids))
            pred = self.oob_predict(X, comm=comm, clusters=clusters)
        return regression_calibration(comm, as_columns(np.asarray(pred, dtype=np.float64)), y, weight, layout)

    def _training_outcomes(self, y, n):
        """``y`` checked as ``(n, n_outputs_)`` (inside the caller's collective checks)."""
        y = as_columns(check_target(y, "y", n, estimator=self))
        if y.shape[1] != self.n_outputs_:
            raise ValueError(f"y has {y.shape[1]} output(s), the forest {self.n_outputs_}")
        return y

    def oob_error_estimates(self, y, X=None, *, comm=None, clusters=None):
        """grf's out-of-bag error estimates of the training rows: ``(debiased_error, excess_error)``.

        ``excess_error`` is the Monte-Carlo part of the squared out-of-bag error, what a
        forest of finitely many trees adds to an infinite forest's: the jackknife
        ``sum_b (mu_b - mu)^2 / (B (B - 1))`` over the ``B`` trees that left the row out
        (``mu_b`` a tree's leaf mean, ``mu`` the out-of-bag prediction). ``debiased_error``
        is ``(mu - y)^2 - excess_error``, an estimate of the infinite forest's squared
        error (grf's ``debiased.error``; its mean is what grf's tuning minimises).

        Parameters
        ----------
        y : array-like, shape (n_local,) or (n_local, n_outputs)
            The training outcomes of this rank, as passed to ``fit``.
        X, comm, clusters
            As :meth:`oob_predict_var`.

        Returns
        -------
        debiased_error, excess_error : ndarray, shape (n_local,) or (n_local, n_outputs)
            NaN for rows left out by fewer than two trees.
        """
        comm = world() if comm is None else comm
        codes, gids, layout = self._training_codes(X, comm, clusters, need_groups=False)
        with collective_checks(comm):       # one rank's bad y: every rank raises
            y = self._training_outcomes(y, len(gids))
        k = self.n_outputs_
        debiased = np.empty((len(gids), k))
        excess = np.empty((len(gids), k))
        n_trees = len(self.estimators_["tree_offsets"]) - 1
        offsets = self.estimators_["tree_offsets"][:-1]
        for lo, hi in self._chunks(len(gids)):
            leaves = predict_leaves_binned(self.estimators_, codes, self.bin_mapper_.missing_bin_,
                                           rows=np.arange(lo, hi))
            roles = forest_row_codes(self.sampling_, n_trees, gids[lo:hi], layout_rows(layout, lo, hi))
            debiased[lo:hi], excess[lo:hi] = tree_jackknife_error(
                self.estimators_["value"][leaves + offsets[None, :]], k, (roles == OUT).T, y[lo:hi])
        return self._shape(debiased), self._shape(excess)

    def _training_codes(self, X, comm, clusters, need_groups=True):
        """``(codes (n_features, n), gids (n,), cluster layout or None)`` of this rank's training rows
        (:meth:`forest.estimators.forest_weights.ForestWeightsMixin._training_codes`), after the
        little-bag check the variance estimates need."""
        if need_groups:
            self._group_size()
        return super()._training_codes(X, comm, clusters)


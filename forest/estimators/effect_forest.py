"""What the honest effect forests share: centering, and effects from averaged leaf moments.

This module owns the parts of :class:`forest.CausalForest` and
:class:`forest.InstrumentalForest` that do not depend on their criterion: the
parameter checks they have in common, local centering with out-of-bag
:class:`forest.RegressionForest` nuisance estimates, and the user-facing estimates
from the trees' averaged leaf moments (``predict``, BLB ``predict_var`` and
``predict_interval``, ``oob_predict``). The statistics live in :mod:`forest.analysis.inference`,
which reads the moments through the subclass's layout (``_layout()``:
:class:`forest.criteria.causal.CausalChannels` or
:class:`forest.criteria.instrumental.InstrumentalChannels`).
"""

import numpy as np

from native.comm import world

from forest.engine.clusters import resolve_clusters
from forest.collective_checks import collective_checks
from forest.estimators.base import EstimatorBase, check_is_fitted
from forest.estimators.explanations import ShapMixin
from forest.io.fingerprint import content_hash
from forest.engine.honest_forest import global_ids, oob_average, oob_sums_binned
from forest.analysis.inference import (blb_predict, check_interval_alpha, normal_interval, oob_effects,
                                      solve_theta)
from forest.engine.predictor import predict_values, predict_values_binned
from forest.profiling import phase
from forest._validation import check_param_types, validate_features
from forest.estimators.regression_forest import RegressionForest, check_forest_params
from forest.io.training_rows import TrainingRowsMixin
from forest.estimators.forest_weights import ForestWeightsMixin


class EffectForestBase(ShapMixin, ForestWeightsMixin, TrainingRowsMixin, EstimatorBase):
    """Base class of the honest effect forests (see the module docstring).

    Subclasses define ``_layout()`` (the moment layout of their leaves),
    :attr:`_nuisance_specs`, the parameters used here (``n_estimators``,
    ``min_samples_leaf``, ``max_bins``, ``max_features``, ``batch_size``,
    ``nuisance_estimators``, ``ci_group_size``, ``equalize_cluster_weights``, the
    forest parameters of :func:`forest.estimators.regression_forest.check_forest_params`) and the
    fitted ``estimators_``, ``bin_mapper_``, ``n_treatments_``, ``n_outcomes_``,
    ``y_ndim_`` and ``sampling_``.
    """

    _predicts_effects = True      # forest.estimators.base.predicts_effects

    #: scikit-learn checks that cannot hold for these estimators, with the reason: the same
    #: as the regression forest's (their trees subsample rows the same way).
    _expected_failed_checks = dict(RegressionForest._expected_failed_checks)

    #: shap_values explains theta through its linearisation (forest.estimators.explanations).
    _shap_kind = "effect"

    #: Nuisance estimates of the centering: (estimate name, seed offset, checkpoint
    #: stage, attribute of the fitted nuisance forest).
    _nuisance_specs = (("y_hat", 7919, "nuisance-y", "outcome_forest_"),
                       ("t_hat", 104729, "nuisance-t", "treatment_forest_"))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True          # NaN is a missing value, with its own bin
        return tags

    def _check_effect_params(self):
        """The parameter checks all effect forests share; returns the seed."""
        seed = check_forest_params(self)
        check_param_types(self, optional_ints=("nuisance_estimators",), reals=("alpha", "imbalance_penalty"))
        if self.nuisance_estimators is not None and self.nuisance_estimators < 1:
            raise ValueError(f"nuisance_estimators must be >= 1 or None, got {self.nuisance_estimators}")
        return seed

    def _nuisance_params(self):
        """Parameters of the nuisance forests (besides their tree count and seed)."""
        # no little bags (grf's nuisance forests: ci.group.size = 1): only their out-of-bag means are used
        return dict(max_samples=0.5, honest=True, min_samples_leaf=self.min_samples_leaf, max_bins=self.max_bins,
                    max_features=self.max_features, batch_size=self.batch_size, ci_group_size=1)

    def _centering(self, X, targets, g, given, binned, seed, comm, stage, warm, layout, gids):
        """Nuisance estimates (centering) of each target in :attr:`_nuisance_specs`, and :attr:`nuisance_`.

        Each is given, or the out-of-bag prediction of a nuisance forest: fitted here
        (checkpointed as a stage of ``stage``'s run), or on a warm start the first fit's
        forest, whose out-of-bag predictions are recomputed from its trees (the same
        bits). Sets the spec's forest attribute (``outcome_forest_``, ...).

        Parameters
        ----------
        targets : dict
            Estimate name (``"y_hat"``, ...) -> its target, shape (n, width).
        given : dict
            Estimate name -> the user's estimates or None.

        Returns
        -------
        hats : dict
            Estimate name -> ndarray, shape (n, width).
        record : dict
            :attr:`nuisance_`; a warm start must not change it.
        """
        prior = getattr(self, "nuisance_", {}) if warm else {}
        n_nuis = int(prior.get("n_estimators", self.nuisance_estimators or max(50, int(self.n_estimators) // 4)))
        params = self._nuisance_params()
        out, record = {}, {"n_estimators": n_nuis}
        for name, offset, stage_name, attr in self._nuisance_specs:
            target = targets[name]
            width = target.shape[1]
            if given[name] is not None:
                out[name] = np.asarray(given[name], dtype=np.float64).reshape(len(target), width)
                record[name] = {"source": "given", "content": content_hash(comm, gids, columns=[out[name]])}
                setattr(self, attr, None)
                continue
            record[name] = {"source": "forest", "seed": int(seed + offset)}
            kept = getattr(self, attr, None) if warm and prior.get(name) == record[name] else None
            if kept is None:
                kept = RegressionForest(n_nuis, random_state=seed + offset, **params).fit(
                    X, target[:, 0] if width == 1 else target, g, comm=comm, binned=binned, clusters=layout,
                    checkpoint=None if stage is None else stage.run.stage(stage_name))
                pred = kept.oob_prediction_
                del kept.oob_prediction_        # kept for new rows; training rows are not part of the model
                del kept.training_rows_         # this forest's own signature records them
            else:
                pred = kept.oob_prediction_binned(binned[1], gids, layout)
            out[name] = np.asarray(pred).reshape(len(target), width)
            setattr(self, attr, kept)
        if warm and record != prior:
            changed = next(k for k in record if record[k] != prior.get(k))
            raise ValueError(f"warm start: the nuisance {changed} differs from the first fit's ({prior.get(changed)} "
                             f"-> {record[changed]}); the trees already grown were centred on it")
        return out, record

    def _weights_columns(self):
        """``(count_col, norm_col)`` for :meth:`get_forest_weights`: leaves hold per-row moment means, then the rows."""
        return self._layout().n_moments, None

    # ------------------------------------------------------------------ shapes
    def _shape(self, theta):
        """(n, K, M) -> (n,) / (n, K) for a 1-D outcome, (n, M) / (n, K, M) for a 2-D one."""
        K = self.n_treatments_
        if self.y_ndim_ == 1:
            return theta[:, 0, 0] if K == 1 else theta[:, :, 0]
        return theta[:, 0, :] if K == 1 else theta

    def _shape_one(self, v):
        return self._shape(np.asarray(v)[None])[0]

    def _mean_moments_binned(self, codes, rows):
        """Mean leaf moments over all trees for training rows ``rows`` (bool mask) given as codes.

        With ``honesty_prune_leaves=False`` an empty leaf holds zero moments, so these are
        the non-empty trees' mean times their share of the trees: ``theta``, which solves an
        equation homogeneous in the moments (:func:`forest.analysis.inference.solve_theta`),
        is the non-empty trees' estimate (grf's), and NaN where every tree is empty.
        """
        n_trees = len(self.estimators_["tree_offsets"]) - 1
        idx = np.flatnonzero(rows).astype(np.int64)
        return predict_values_binned(self.estimators_, codes, self.bin_mapper_.missing_bin_, rows=idx) / n_trees

    def _mean_moments(self, X):
        n_trees = len(self.estimators_["tree_offsets"]) - 1
        return predict_values(self.estimators_, X) / n_trees

    # ------------------------------------------------------------------ predictions
    def predict(self, X):
        """Estimated effect ``theta(x)`` (the causal forest's CATE, the instrumental forest's LATE).

        Parameters
        ----------
        X : array-like, shape (n, n_features)

        Returns
        -------
        ndarray
            ``(n,)`` for one treatment column (binary, two-level categorical, scalar
            continuous) and a 1-D outcome; ``(n, K)`` for ``K > 1`` arms or treatment
            components; ``(n, M)`` / ``(n, K, M)`` for a 2-D outcome. NaN where the local treatment
            (instrumental forest: first-stage) covariance is singular.
        """
        check_is_fitted(self, "estimators_")
        X = validate_features(self, X, reset=False, min_samples=0)
        theta, _ = solve_theta(self._mean_moments(X), self._layout())
        return self._shape(theta)

    def predict_var(self, X, chunk_rows=None):
        """Bootstrap-of-little-bags variance of each effect component (shape of ``predict``)."""
        return self._theta_var(X, chunk_rows)[1]

    def _theta_var(self, X, chunk_rows=None):
        check_is_fitted(self, "estimators_")
        if self.ci_group_size < 2:
            raise ValueError("variance estimates need ci_group_size >= 2 at fit time")
        X = validate_features(self, X, reset=False, min_samples=0)
        with phase("prediction"):
            th, var = blb_predict(self.estimators_, X, self._layout(), self.ci_group_size, chunk_rows)
        if not getattr(self, "honesty_prune_leaves", True):
            # Little bags holding an empty leaf are left out of the variance (grf), not out
            # of the estimate: the intervals are around predict's theta, over every tree.
            th = solve_theta(self._mean_moments(X), self._layout())[0]
        return self._shape(th), self._shape(var)

    def predict_interval(self, X, alpha=0.05):
        """Normal ``1 - alpha`` confidence intervals from the BLB variance.

        Returns
        -------
        lower, upper : ndarray
            Shape of ``predict``.
        """
        check_interval_alpha(alpha)
        return normal_interval(*self._theta_var(X), alpha)

    def _oob_theta_binned(self, codes, gids, layout, fallback):
        """Out-of-bag effects ``(n, K, M)`` of training rows given as codes, recomputed from the trees.

        Parameters
        ----------
        codes : ndarray of uint8, shape (n_features, n)
        gids : ndarray of int64, shape (n,)
            Their global row ids in the fit.
        layout : forest.engine.clusters.ClusterLayout or None
            As in the fit.
        fallback : bool
            Rows whose out-of-bag moments are singular take all trees' moments (and
            zero where those are singular too), as the causal forest's fit does
            (:func:`forest.analysis.inference.oob_effects`); without it they are NaN.
        """
        acc, cnt = oob_sums_binned(self.estimators_, codes, self.bin_mapper_.missing_bin_, gids, self.sampling_,
                                   layout)
        with np.errstate(invalid="ignore", divide="ignore"):
            mbar = acc / cnt[:, None]
        if (cnt == 0).any():
            mbar[cnt == 0] = self._mean_moments_binned(codes, cnt == 0)
        if fallback:
            return oob_effects(mbar, self._layout(), lambda rows: self._mean_moments_binned(codes, rows))
        return solve_theta(mbar, self._layout())[0]

    def _oob_in_fit(self):
        """Out-of-bag effects of this rank's training rows kept by the fitting process (shape of ``predict``)."""
        rows = getattr(self, "_oob_rows_", None)
        if rows is not None:
            return self._shape(rows.tau)
        source = getattr(self, "_oob_source_", None)
        if source is None:
            raise ValueError("out-of-bag estimates without X exist only in the process that ran fit (a model file "
                             "holds no training rows); pass the training rows: oob_predict(X)")
        codes, gids, layout = source
        return self._shape(self._oob_theta_binned(codes, gids, layout, fallback=False))

    def oob_predict(self, X=None, *, comm=None, clusters=None):
        """Out-of-bag effects for the training rows of this rank (same rows and order as in ``fit``).

        Parameters
        ----------
        X : array-like, shape (n_local, n_features), optional
            This rank's training rows. Without it, the fitting process's own
            out-of-bag effects (the ones ``fit`` computed; under ``mpirun`` each rank's
            rows, the same figures at any rank count).
        comm : native.comm.Communicator, optional
            The communicator used in ``fit``.
        clusters : array-like, optional
            The cluster labels passed to ``fit`` (needed when it had clusters).

        Returns
        -------
        ndarray
            Shape of ``predict``.
        """
        if X is None:
            check_is_fitted(self, "estimators_")
            if clusters is not None:
                raise ValueError("clusters go with X: without X the fit's own rows and clusters are used")
            return self._oob_in_fit()
        comm = world() if comm is None else comm
        with collective_checks(comm):
            check_is_fitted(self, "estimators_")
            X = validate_features(self, X, reset=False, min_samples=0)
        gids, _ = global_ids(comm, len(X))
        layout = resolve_clusters(clusters, comm, len(X), self.equalize_cluster_weights, None,
                                  fitted=self.sampling_.get("clusters", False))
        mbar, cnt = oob_average(self.estimators_, X, gids, self.sampling_, clusters=layout)
        if (cnt == 0).any():
            mbar[cnt == 0] = self._mean_moments(X[cnt == 0])
        theta, _ = solve_theta(mbar, self._layout())
        return self._shape(theta)

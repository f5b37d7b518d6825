"""The instrumental forest's analysis toolkit: average effect and best linear projection (grf's, issue 38).

grf's ``average_treatment_effect`` and ``best_linear_projection`` on an instrumental
forest average doubly robust scores of the local effect ``tau(x)`` built with the
*compliance score* ``c(x) = E[t | z=1, x] - E[t | z=0, x]``
(:func:`forest.analysis.inference.instrumental_scores`). As in grf, the instrument must be
binary, and ``c(x)`` comes from a causal forest of the treatment on the instrument
(centred on the instrumental forest's own nuisance estimates) unless the caller gives it.

The rows are passed (``X, t, y, z``): the training rows (recognised by the model's
fingerprint, :mod:`forest.io.training_rows`) get the out-of-bag effect and nuisance
estimates, other rows the whole forests'; the compliance forest is fitted on the rows
passed and gives its own out-of-bag estimates. Everything after the scores is the causal
forest's machinery (:mod:`forest.analysis.average_effects`, :mod:`forest.analysis.linear_projection`),
one allreduce per statistic, under ``mpirun`` as everywhere.
"""
import numpy as np

from native.comm import world

from forest._validation import check_weight, validate_features
from forest.analysis import average_effects, linear_projection
from forest.analysis.effect_rows import make_instrumental_rows
from forest.collective_checks import collective_checks
from forest.engine.clusters import observation_weights, resolve_clusters
from forest.estimators.base import check_is_fitted
from forest.estimators.causal_forest import CausalForest
from forest.io.training_rows import notify_training_rows

#: Trees of the compliance forest (grf's ``num.trees.for.weights``).
COMPLIANCE_TREES = 500


class InstrumentalAnalysisMixin:
    """``get_scores``, ``average_treatment_effect`` and ``best_linear_projection`` of an instrumental forest."""

    def get_scores(self, X, t, y, z, *, compliance_score=None, sample_weight=None, clusters=None, comm=None):
        """Doubly robust scores of the local effect at this rank's rows (grf's ``get_scores``).

        Parameters
        ----------
        X : array-like, shape (n_local, n_features)
        t, y : array-like, shape (n_local,)
            Treatment and outcome.
        z : array-like, shape (n_local,)
            The instrument, binary 0/1.
        compliance_score : array-like, shape (n_local,), optional
            ``E[t | z=1, x] - E[t | z=0, x]`` of the rows; by default the out-of-bag
            estimate of a causal forest of ``t`` on ``z`` (500 trees) fitted here.
        sample_weight, clusters : array-like, shape (n_local,), optional
            Observation weights and cluster labels of the rows (the fit's for the
            training rows).
        comm : native.comm.Communicator, optional

        Returns
        -------
        ndarray, shape (n_local,)
        """
        return self._iv_rows(X, t, y, z, compliance_score, sample_weight, clusters, comm).scores[:, 0, 0]

    def average_treatment_effect(self, X, t, y, z, *, target="all", subset=None, compliance_score=None,
                                 sample_weight=None, clusters=None, comm=None):
        """Average of the local effect ``tau(x)`` over the rows and its standard error.

        grf's ``average_treatment_effect`` of an instrumental forest (``target="all"``, the
        only one it defines): the weighted mean of :meth:`get_scores`, with a
        heteroskedasticity- or cluster-robust standard error.

        Parameters
        ----------
        X, t, y, z, compliance_score, sample_weight, clusters, comm
            As :meth:`get_scores`.
        target : {"all"}
        subset : array-like of bool, shape (n_local,), optional

        Returns
        -------
        estimate, stderr : float
        """
        if target != "all":
            raise ValueError(f"an instrumental forest's average effect has target='all' only (grf's), got {target!r}")
        rows = self._iv_rows(X, t, y, z, compliance_score, sample_weight, clusters, comm)
        est, se = average_effects.average_treatment_effect(world() if comm is None else comm, rows, "all", subset)
        return float(est[0, 0]), float(se[0, 0])

    def best_linear_projection(self, X, t, y, z, A=None, *, subset=None, names=None, compliance_score=None,
                               sample_weight=None, clusters=None, comm=None):
        """Best linear projection of the local effect on covariates ``A`` (grf's, from :meth:`get_scores`).

        Returns
        -------
        forest.analysis.result.EstimateTable
            Terms ``(Intercept)`` then ``A``'s columns, HC3 (cluster-robust) standard errors.
        """
        rows = self._iv_rows(X, t, y, z, compliance_score, sample_weight, clusters, comm)
        return linear_projection.best_linear_projection(world() if comm is None else comm, rows, A, subset, names)

    # ------------------------------------------------------------------ rows
    def _iv_rows(self, X, t, y, z, compliance_score, sample_weight, clusters, comm):
        """:class:`forest.analysis.effect_rows.EffectRows` of the rows passed (collective)."""
        comm = world() if comm is None else comm
        with collective_checks(comm):
            check_is_fitted(self, "estimators_")
            if any(getattr(self, name, None) is None
                   for name in ("outcome_forest_", "treatment_forest_", "instrument_forest_")):
                raise ValueError("the instrumental forest's analyses need its nuisance forests, but this forest has "
                                 "none (fitted with user-supplied y_hat / t_hat / z_hat): refit without them")
            X = validate_features(self, X, reset=False, min_samples=0)
            n = len(X)
            ycol, tcol, zcol = (c[:, 0] for c in self._row_columns(t, y, z, n=n))
            if not np.isin(zcol, (0.0, 1.0)).all():
                raise ValueError("the average effect of an instrumental forest needs a binary 0/1 instrument z "
                                 "(as grf's); this z has other values")
            if sample_weight is not None:
                sample_weight = check_weight(sample_weight, n)
            if compliance_score is not None:
                compliance_score = np.asarray(compliance_score, dtype=np.float64).reshape(-1)
                if compliance_score.shape != (n,) or not np.isfinite(compliance_score).all():
                    raise ValueError(f"compliance_score must hold {n} finite values (one per row)")
        match, codes, gids = self._match_codes(X, self._row_columns(t, y, z, n=n), comm)
        if match.kind == "overlap":
            raise ValueError(match.refusal("X, t, y, z"))
        fitted = bool(self.sampling_.get("clusters", False))
        if match.kind == "training":
            if fitted and clusters is None:
                raise ValueError("these are the training rows of a forest fitted with clusters: pass the fit's "
                                 "cluster labels (clusters=) for their out-of-bag estimates")
            layout = resolve_clusters(clusters, comm, n, self.equalize_cluster_weights, sample_weight, fitted=fitted)
            tau = self._oob_theta_binned(codes, gids, layout, fallback=True).reshape(n)
            y_hat, t_hat, z_hat = (forest.oob_prediction_binned(codes, gids, layout).reshape(n) for forest in
                                   (self.outcome_forest_, self.treatment_forest_, self.instrument_forest_))
            source = "out-of-bag"
            notify_training_rows(match, stacklevel=4)
        else:
            layout = resolve_clusters(clusters, comm, n, self.equalize_cluster_weights, sample_weight)
            tau = np.nan_to_num(np.asarray(self.predict(X), dtype=np.float64).reshape(n))
            y_hat, t_hat, z_hat = (np.asarray(forest.predict(X), dtype=np.float64).reshape(n) for forest in
                                   (self.outcome_forest_, self.treatment_forest_, self.instrument_forest_))
            source = "held-out"
        if compliance_score is None:
            compliance_score = self._compliance(X, tcol, zcol, t_hat, z_hat, sample_weight, clusters, comm)
        weight = observation_weights(sample_weight, layout, n)
        return make_instrumental_rows(tau, tcol, ycol, zcol, y_hat, t_hat, z_hat, compliance_score, weight, gids,
                                      layout, source)

    def _compliance(self, X, t, z, t_hat, z_hat, sample_weight, clusters, comm):
        """Out-of-bag ``E[t | z=1, x] - E[t | z=0, x]``: a causal forest of ``t`` on ``z`` centred on ``t_hat, z_hat``."""
        seed = int(self.sampling_["seed"])
        forest = CausalForest(COMPLIANCE_TREES, random_state=(seed + 7919) % 2 ** 32,
                              min_samples_leaf=self.min_samples_leaf, max_bins=self.max_bins,
                              max_features=self.max_features, equalize_cluster_weights=self.equalize_cluster_weights)
        forest.fit(X, z, t, sample_weight, y_hat=t_hat, t_hat=z_hat, clusters=clusters, comm=comm)
        return np.asarray(forest.oob_predict(), dtype=np.float64).reshape(-1)

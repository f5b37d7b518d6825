"""grf's causal-analysis toolkit as methods of a fitted :class:`forest.CausalForest`.

This module owns the user-facing analysis methods, mixed into ``CausalForest``
(:class:`CausalAnalysisMixin`), and the two ways of getting the per-row inputs
they need (:class:`forest.analysis.effect_rows.EffectRows`):

* out of bag, on the training rows of this rank: built at the end of ``fit`` from
  the out-of-bag effects and the out-of-bag nuisance estimates (kept only in the
  fitting process; a model file does not carry training rows);
* held out: rows passed as ``X, t, y``, scored with the forest and its nuisance
  forests (kept on the model and saved with it).

Methods (each a handful of sums over rows; under ``mpirun`` every rank passes its
own rows and all ranks return the same figures as one process on all rows):
``get_scores``/``dr_scores_`` and ``dr_scores(X, t, y)`` (doubly robust scores),
``average_treatment_effect`` (:mod:`forest.analysis.average_effects`),
``best_linear_projection`` and ``test_calibration``
(:mod:`forest.analysis.linear_projection`), ``rank_average_treatment_effect``
(:mod:`forest.analysis.rate`). Continuous treatments use grf's partial-effect score with
``Var[W|x]`` from an auxiliary regression forest fitted on ``(W - e(x))^2`` (all
products of the centred components for a vector treatment).
"""
import numpy as np

from native.comm import SelfCommunicator, world

from forest.analysis import average_effects

from forest.analysis import linear_projection

from forest.analysis import rate
from forest.analysis import sensitivity
from forest._validation import as_columns, check_target, check_weight, validate_features
from forest.engine.clusters import cluster_moments, observation_weights, resolve_clusters
from forest.analysis.effect_rows import ScoredRows, make_effect_rows, subset_weights
from forest.analysis.inference import solve_theta
from forest.collective_checks import collective_checks
from forest.estimators.base import check_is_fitted
from forest.estimators.regression_forest import RegressionForest
from forest.io.training_rows import notify_training_rows


def variance_targets(wc):
    """Products ``(W~_j W~_l)`` for ``j <= l`` whose conditional means form ``Var[W|x]``.

    Parameters
    ----------
    wc : ndarray, shape (n, K)
        Centred treatment ``W - e(x)``.

    Returns
    -------
    ndarray, shape (n, K (K + 1) / 2)
    """
    K = wc.shape[1]
    j, k = np.triu_indices(K)
    return wc[:, j] * wc[:, k]


def variance_matrix(pred, K):
    """Symmetric ``(n, K, K)`` matrices from predictions of :func:`variance_targets`' columns."""
    pred = np.asarray(pred, dtype=np.float64).reshape(len(pred), -1)
    j, k = np.triu_indices(K)
    V = np.zeros((len(pred), K, K))
    V[:, j, k] = pred
    V[:, k, j] = pred
    return V


class CausalAnalysisMixin:
    """Doubly robust analyses of a fitted causal forest (see the module docstring).

    Needs from the host class: ``_shape``, ``_shape_one``, ``_layout``,
    ``_mean_moments`` and the fitted attributes of ``CausalForest``.
    """

    #: Per-row training state stays out of model files (each rank holds its own rows).
    _model_io_exclude_ = ("dr_scores_", "_oob_rows_")

    def _model_io_restore_(self):
        """Defaults for attributes that model files written before the analysis toolkit lack."""
        self.__dict__.setdefault("equalize_cluster_weights", False)
        self.__dict__.setdefault("outcome_forest_", None)
        self.__dict__.setdefault("treatment_forest_", None)
        self.__dict__.setdefault("warm_start", False)

    # ------------------------------------------------------------------ fitting helpers
    def _fit_variance_forest(self, X, binned, W, t_hat, g, comm, layout, n_trees, seed, nuisance, checkpoint=None):
        """Auxiliary forest of ``Var[W|x]`` (continuous treatments); returns out-of-bag V (n, K, K)."""
        wc = W - t_hat
        targets = variance_targets(wc)
        # A scalar treatment has one product: pass it 1-D, as the centering forests get
        # theirs; a column vector would make RegressionForest warn (DataConversionWarning).
        forest = RegressionForest(n_trees, random_state=seed + 1299709, **nuisance).fit(
            X, targets[:, 0] if targets.shape[1] == 1 else targets, g, comm=comm, binned=binned, clusters=layout,
            checkpoint=checkpoint)
        V = variance_matrix(forest.oob_prediction_, W.shape[1])
        del forest.oob_prediction_          # training rows: not part of the model
        del forest.training_rows_           # the causal forest's own signature records them
        self.treatment_variance_forest_ = forest
        return V

    def _store_oob_rows(self, kind, tau, W, arm, Y, y_hat, t_hat, V, sample_weight, gids, layout):
        """Out-of-bag analysis rows and ``dr_scores_`` of this rank's training rows."""
        weight = observation_weights(sample_weight, layout, len(W))
        self._oob_rows_ = make_effect_rows(kind, tau, W, arm, Y, y_hat, t_hat, V, weight, gids, layout,
                                           source="out-of-bag")
        self.dr_scores_ = self._shape(self._oob_rows_.scores)
        return self._oob_rows_

    def _row_columns(self, t, y, *, n):
        """The targets as ``fit`` codes them for :attr:`training_rows_`: ``[W (n, K), Y (n, M)]``."""
        W, _ = self._code_heldout_treatment(t, n)
        return [W, as_columns(check_target(y, "y", n, estimator=self))]

    # ------------------------------------------------------------------ rows
    def _rows(self, X=None, t=None, y=None, sample_weight=None, clusters=None, comm=None):
        """Out-of-bag rows (no ``X, t, y``) or held-out rows."""
        check_is_fitted(self, "estimators_")
        given = [v is not None for v in (X, t, y)]
        if not any(given):
            if sample_weight is not None or clusters is not None:
                raise ValueError("sample_weight and clusters describe held-out rows: pass them with X, t and y")
            rows = getattr(self, "_oob_rows_", None)
            if rows is None:
                raise ValueError("out-of-bag scores exist only in the process that ran fit (a model file holds no "
                                 "training rows); pass held-out rows as X, t and y")
            return rows
        if not all(given):
            raise ValueError("held-out rows need all of X, t and y")
        return self._heldout_rows(X, t, y, sample_weight, clusters, comm)

    def _heldout_rows(self, X, t, y, sample_weight=None, clusters=None, comm=None):
        """Rows passed as ``X, t, y``: out of bag when they are the training rows, else held out.

        The rows are compared with the fit's :attr:`training_rows_`
        (:mod:`forest.io.training_rows`, collective): the training rows in training
        order get out-of-bag effects and nuisance estimates recomputed from the
        trees (:meth:`_training_oob_rows`, with a :class:`TrainingRowsNotice`);
        rows that only partly overlap the training rows are refused; others are
        scored as held out by the forest and its nuisance forests.
        """
        if getattr(self, "outcome_forest_", None) is None or getattr(self, "treatment_forest_", None) is None or \
                (self.treatment_type_ == "continuous" and getattr(self, "treatment_variance_forest_", None) is None):
            raise ValueError("scores of rows passed as X, t, y need the nuisance forests, but this forest has none "
                             "(fitted with user-supplied y_hat / t_hat, with a nuisance that tune_parameters replaced by its "
                             "local linear correction, or saved by an older histforest): refit it, "
                             "or use the out-of-bag scores in the fitting process (no X, t, y)")
        if comm is None:
            comm = world()
        # Collective: a bad input on one rank raises the same error on every rank
        # (global_ids and the cluster layout below are collectives).
        with collective_checks(comm):
            X = validate_features(self, X, reset=False, min_samples=0)
            n = len(X)
            W, arm = self._code_heldout_treatment(t, n)
            Y = check_target(y, "y", n, estimator=self)
            if Y.ndim != self.y_ndim_ or (Y.ndim == 2 and Y.shape[1] != self.n_outcomes_):
                raise ValueError(f"y must have the training outcome's shape (n, {self.n_outcomes_}) or (n,), "
                                 f"got {Y.shape}")
            if sample_weight is not None:
                sample_weight = check_weight(sample_weight, n)
        K, M = self.n_treatments_, self.n_outcomes_
        Y = as_columns(Y)
        match, codes, gids = self._match_codes(X, [W, Y], comm)
        if match.kind == "overlap":
            raise ValueError(match.refusal("X, t, y"))
        if match.kind == "training":
            rows = self._training_oob_rows(codes, W, arm, Y, sample_weight, clusters, gids, comm)
            notify_training_rows(match, stacklevel=5)        # the user's call of a public method
            return rows
        theta, _ = solve_theta(self._mean_moments(X), self._layout())
        tau = np.nan_to_num(theta, nan=0.0, posinf=0.0, neginf=0.0)
        y_hat = np.asarray(self.outcome_forest_.predict(X), dtype=np.float64).reshape(n, M)
        t_hat = np.asarray(self.treatment_forest_.predict(X), dtype=np.float64).reshape(n, K)
        V = None
        if self.treatment_type_ == "continuous":
            V = variance_matrix(self.treatment_variance_forest_.predict(X), K)
        layout = resolve_clusters(clusters, comm, n, self.equalize_cluster_weights, sample_weight)
        weight = observation_weights(sample_weight, layout, n)
        return make_effect_rows(self.treatment_type_, tau, W, arm, Y, y_hat, t_hat, V, weight, gids, layout)

    def _training_oob_rows(self, codes, W, arm, Y, sample_weight, clusters, gids, comm):
        """Analysis rows of the training rows, out of bag, recomputed from the trees.

        Each tree's sample and honesty halves are a hash of the global row id (and
        cluster), so the trees a row was out of bag for are known without storing
        them: the effects and every nuisance estimate are those ``fit`` computed,
        at any rank count.

        Parameters
        ----------
        codes : ndarray of uint8, shape (n_features, n)
        W : ndarray, shape (n, K)
        arm : ndarray of int64, shape (n,), or None
        Y : ndarray, shape (n, M)
        sample_weight, clusters : array-like or None
            As passed with the rows (a clustered fit needs its cluster labels again).
        gids : ndarray of int64, shape (n,)
        comm : native.comm.Communicator

        Returns
        -------
        EffectRows
        """
        n, K, M = len(W), self.n_treatments_, self.n_outcomes_
        fitted = bool(self.sampling_.get("clusters", False))
        if fitted and clusters is None:
            raise ValueError("these are the training rows of a forest fitted with clusters: pass the fit's cluster "
                             "labels (clusters=) for their out-of-bag estimates")
        layout = resolve_clusters(clusters, comm, n, self.equalize_cluster_weights, sample_weight, fitted=fitted)
        tau = self._oob_theta_binned(codes, gids, layout, fallback=True)
        y_hat = self.outcome_forest_.oob_prediction_binned(codes, gids, layout).reshape(n, M)
        t_hat = self.treatment_forest_.oob_prediction_binned(codes, gids, layout).reshape(n, K)
        V = None
        if self.treatment_type_ == "continuous":
            V = variance_matrix(self.treatment_variance_forest_.oob_prediction_binned(codes, gids, layout), K)
        weight = observation_weights(sample_weight, layout, n)
        return make_effect_rows(self.treatment_type_, tau, W, arm, Y, y_hat, t_hat, V, weight, gids, layout,
                                source="out-of-bag")

    def _code_heldout_treatment(self, t, n):
        """``(W (n, K), arm codes (n,) or None)`` of new rows, coded as in training."""
        t = np.asarray(t)
        K = self.n_treatments_
        if self.treatment_type_ == "continuous":
            W = np.asarray(t, dtype=np.float64).reshape(len(t), -1) if t.ndim in (1, 2) else None
            if W is None or W.shape != (n, K):
                raise ValueError(f"t must have shape ({n},) or ({n}, {K}) like the training treatment, got {t.shape}")
            if not np.all(np.isfinite(W)):
                raise ValueError("t contains NaN or infinite values")
            return W, None
        if t.shape != (n,):
            raise ValueError(f"t must have shape ({n},), got {t.shape}")
        classes = np.asarray(self.classes_)
        codes = np.clip(np.searchsorted(classes, t), 0, len(classes) - 1)
        unknown = classes[codes] != t
        if unknown.any():
            raise ValueError(f"t holds levels the forest was not trained on (e.g. {t[unknown][0]!r}); "
                             f"training levels: {classes.tolist()}")
        W = np.zeros((n, K))
        treated = codes > 0
        W[treated, codes[treated] - 1] = 1.0
        return W, codes.astype(np.int64)

    def contrast_names(self):
        """Names of the effect columns: ``"B - A"`` per arm against the control, ``W<j>`` per treatment
        component, with ``[Y<m>]`` per outcome when there are several.

        Returns
        -------
        list of str, length ``K * M``
        """
        K, M = self.n_treatments_, self.n_outcomes_
        if self.treatment_type_ == "continuous":
            arms = [f"W{j}" for j in range(K)] if K > 1 else ["W"]
        else:
            classes = list(np.asarray(self.classes_).tolist())
            arms = [f"{c} - {classes[0]}" for c in classes[1:]]
        if M == 1:
            return arms
        return [f"{a} [Y{m}]" for a in arms for m in range(M)]

    # ------------------------------------------------------------------ public methods
    def get_scores(self, subset=None):
        """Out-of-bag doubly robust scores of this rank's training rows (grf's ``get_scores``).

        Parameters
        ----------
        subset : array-like of bool, shape (n_local,), optional

        Returns
        -------
        ndarray
            Shape of ``predict`` on the (selected) rows: ``(n,)``, ``(n, K)``, ...
            Binary: ``tau + (W - e)/(e(1-e)) (Y - m - (W - e) tau)``; multi-arm: per
            arm against the control; continuous: the partial-effect score
            ``tau + V^{-1}(W - e)(Y - m - (W - e) tau)``.
        """
        rows = self._rows()
        scores = self._shape(rows.scores)
        if subset is None:
            return scores
        subset_weights(rows, subset)            # validates the mask
        return scores[np.asarray(subset)]

    def score_rows(self, X=None, t=None, y=None, *, sample_weight=None, clusters=None, comm=None):
        """Effects and doubly robust scores of rows, out of bag where they are the training rows.

        The rows every analysis method works on, for callers that build their own
        (a policy tree's rewards, a custom targeting rule): without ``X, t, y`` the
        fitting process's out-of-bag training rows; with them, the training rows
        (recognised by :attr:`training_rows_`, :mod:`forest.io.training_rows`) out of bag,
        other rows held out, and rows that partly overlap the training rows refused.

        Parameters
        ----------
        X, t, y, sample_weight, clusters, comm
            As in :meth:`average_treatment_effect` (collective under ``mpirun``).

        Returns
        -------
        forest.analysis.effect_rows.ScoredRows
            ``effects``, ``scores`` (each the shape of ``predict``) and ``source``
            (``"out-of-bag"`` or ``"held-out"``).
        """
        comm = world() if comm is None else comm
        rows = self._rows(X, t, y, sample_weight, clusters, comm)
        return ScoredRows(self._shape(rows.tau), self._shape(rows.scores), rows.source)

    def dr_scores(self, X, t, y):
        """Doubly robust scores of held-out rows, from the forest and its nuisance forests.

        No communication: safe to call on any rank for any rows. The rows are compared
        with the training rows on this process alone: the whole training data of a
        one-process fit gets its out-of-bag scores (with a :class:`TrainingRowsNotice`),
        and rows that are partly training rows (a rank's share of an ``mpirun`` fit
        among them) are refused; use :meth:`score_rows` (collective) for those.

        Parameters
        ----------
        X : array-like, shape (n, n_features)
        t : array-like, shape (n,) or (n, K)
            Treatment, coded as in training (levels of a categorical treatment).
        y : array-like, shape (n,) or (n, M)

        Returns
        -------
        ndarray
            Shape of ``predict``: ``(n,)`` for one treatment column, ``(n, K)`` per arm
            against the control (multi-arm) or per component (vector treatment).
        """
        return self._shape(self._heldout_rows(X, t, y, comm=SelfCommunicator()).scores)

    def average_treatment_effect(self, target="all", subset=None, *, method="AIPW", X=None, t=None, y=None,
                                 sample_weight=None, clusters=None, comm=None):
        """Doubly robust average effect and its standard error (grf's ``average_treatment_effect``).

        Parameters
        ----------
        target : {"all", "treated", "control", "overlap"}
            Population: all rows, the treated (ATT), the controls (ATC), or grf's
            overlap-weighted effect (see :mod:`forest.analysis.average_effects`). Multi-arm
            forests give each arm against the control; continuous treatments support
            ``"all"`` (average partial effect) and ``"overlap"``.
        subset : array-like of bool, shape (n_local,), optional
            Rows of this rank to average over (define it from ``X`` only).
        method : {"AIPW", "TMLE"}, default "AIPW"
            grf's ``method``: augmented inverse-propensity weighting, or targeted maximum
            likelihood (:mod:`forest.analysis.tmle`: a linear fluctuation of the regression
            surfaces on the clever covariates, grf's HC3 standard errors). TMLE, as in grf,
            needs a binary treatment and rows without clusters or sample weights, and
            offers ``"all"``, ``"treated"`` and ``"control"`` (``"overlap"`` is AIPW only);
            otherwise it raises ``ValueError``.
        X, t, y : array-like, optional
            Held-out rows of this rank (default: the out-of-bag training rows).
        sample_weight, clusters : array-like, shape (n_local,), optional
            Weights and cluster labels of the held-out rows.
        comm : native.comm.Communicator, optional
            ``None`` means ``native.comm.world()``.

        Returns
        -------
        estimate, stderr : float or ndarray
            Shape of one row of ``predict``.
        """
        comm = world() if comm is None else comm
        if (target == "all" and method == "AIPW" and subset is None and X is None and t is None and y is None
                and getattr(self, "_oob_rows_", None) is None and hasattr(self, "ate_")):
            return self.ate_, self.ate_stderr_      # a loaded model keeps the out-of-bag average
        rows = self._rows(X, t, y, sample_weight, clusters, comm)
        if target != "overlap":
            sensitivity.warn_overlap(comm, rows.t_hat, rows.kind, stacklevel=3)
        est, se = average_effects.average_treatment_effect(comm, rows, target, subset, method=method)
        return self._shape_one(est), self._shape_one(se)

    def sensitivity_analysis(self, c_y=0.05, c_t=0.05, rho=1.0, alpha=0.05, subset=None, *, X=None, t=None, y=None,
                             sample_weight=None, clusters=None, comm=None):
        """Bounds on the average effect under hidden confounding (omitted-variable bias, EconML's parameters).

        With a latent confounder explaining a share ``c_y`` of the outcome's residual
        variation and ``c_t`` of the treatment's (its Riesz representer's), correlated
        ``rho``, the doubly robust ATE could be off by at most ``|rho| sqrt(c_y c_t / (1 -
        c_t)) sqrt(sigma^2 nu^2)`` (:mod:`forest.analysis.sensitivity`).

        Parameters
        ----------
        c_y, c_t : float in [0, 1), default 0.05
        rho : float in [-1, 1], default 1.0
        alpha : float, default 0.05
            The confidence interval around the bounds is ``1 - alpha``.
        subset, X, t, y, sample_weight, clusters, comm
            As for :meth:`average_treatment_effect`.

        Returns
        -------
        dict
            ``estimate``, ``lower``, ``upper`` (the bounds), ``ci_lower``, ``ci_upper`` (their
            confidence interval), each the shape of one row of ``predict``; and
            ``c_y``, ``c_t``, ``rho``, ``alpha``, ``sigma2``, ``nu2``.
        """
        comm = world() if comm is None else comm
        rows = self._rows(X, t, y, sample_weight, clusters, comm)
        params = sensitivity.sensitivity_parameters(comm, rows, subset)
        lower, upper, ci_lower, ci_upper = sensitivity.sensitivity_bounds(params, c_y, c_t, rho, alpha)
        shape = self._shape_one
        return {"estimate": shape(params.theta), "lower": shape(lower), "upper": shape(upper),
                "ci_lower": shape(ci_lower), "ci_upper": shape(ci_upper), "c_y": float(c_y), "c_t": float(c_t),
                "rho": float(rho), "alpha": float(alpha), "sigma2": shape(params.sigma2), "nu2": shape(params.nu2)}

    def robustness_value(self, alpha=0.05, null_hypothesis=0.0, interval="ci", subset=None, *, X=None, t=None,
                         y=None, sample_weight=None, clusters=None, comm=None):
        """The confounding strength ``c_y = c_t = r`` (``rho = 1``) that would bring the average effect to the null.

        Parameters
        ----------
        alpha : float, default 0.05
        null_hypothesis : float, default 0.0
        interval : {"ci", "estimate"}, default "ci"
            Whether the bounds' confidence interval or the bounds themselves must reach the null.
        subset, X, t, y, sample_weight, clusters, comm
            As for :meth:`average_treatment_effect`.

        Returns
        -------
        float or ndarray
            In ``[0, 1)``, the shape of one row of ``predict``; 0 when the interval already
            holds the null. Larger is more robust.
        """
        comm = world() if comm is None else comm
        rows = self._rows(X, t, y, sample_weight, clusters, comm)
        params = sensitivity.sensitivity_parameters(comm, rows, subset)
        return self._shape_one(sensitivity.robustness_value(params, alpha, null_hypothesis, interval))

    def best_linear_projection(self, A=None, subset=None, *, names=None, target="all", X=None, t=None, y=None,
                               sample_weight=None, clusters=None, comm=None):
        """Linear projection of the effect on covariates, fitted on the doubly robust scores.

        Parameters
        ----------
        A : array-like, shape (n_local, q), optional
            Covariates of this rank's rows (default: intercept only, whose
            coefficient is the average effect). Rows with a NaN in ``A`` are left out.
        subset : array-like of bool, shape (n_local,), optional
        names : sequence of str, optional
            Names of ``A``'s columns (default ``A1 .. Aq``).
        target : {"all", "overlap"}
            grf's ``target.sample``: all rows, or rows weighted by ``e(x)(1 - e(x))``
            (binary treatment), the projection over the population with overlap.
        X, t, y, sample_weight, clusters, comm
            As in :meth:`average_treatment_effect`.

        Returns
        -------
        forest.analysis.result.EstimateTable
            ``estimate``, ``stderr``, ``pvalue`` (intercept first, then ``A``'s
            columns; one row per arm for multi-arm forests), ``conf_int(alpha)``;
            HC3 standard errors, cluster-robust with clusters.
        """
        comm = world() if comm is None else comm
        rows = self._rows(X, t, y, sample_weight, clusters, comm)
        return linear_projection.best_linear_projection(comm, rows, A, subset, names, self.contrast_names(),
                                                        target=target)

    def test_calibration(self, *, X=None, t=None, y=None, sample_weight=None, clusters=None, comm=None):
        """grf's calibration test: mean and differential forest prediction coefficients.

        Parameters
        ----------
        X, t, y, sample_weight, clusters, comm
            As in :meth:`average_treatment_effect`.

        Returns
        -------
        forest.analysis.result.EstimateTable
            Terms ``mean.forest.prediction`` and ``differential.forest.prediction``
            (in that order) with HC3 standard errors and one-sided p-values.
        """
        comm = world() if comm is None else comm
        rows = self._rows(X, t, y, sample_weight, clusters, comm)
        return linear_projection.test_calibration(comm, rows, self.contrast_names())

    def compare_priorities(self, priorities, other_priorities, X=None, t=None, y=None, *, target="AUTOC", q=None,
                           n_bootstrap=200, seed=None, subset=None, sample_weight=None, clusters=None, comm=None):
        """RATE of two prioritisation rules and of their difference (grf's RATE with two priority columns).

        Parameters
        ----------
        priorities, other_priorities : array-like, shape (n_local,) or (n_local, K)
            The two rules (as ``priorities`` of :meth:`rank_average_treatment_effect`).
        X, t, y, target, q, n_bootstrap, seed, subset, sample_weight, clusters, comm
            As in :meth:`rank_average_treatment_effect`.

        Returns
        -------
        forest.analysis.result.EstimateTable
            ``priority 1``, ``priority 2`` and ``priority 1 - priority 2`` with paired
            half-sample bootstrap standard errors (:func:`forest.analysis.rate.compare_priorities`).
        """
        comm = world() if comm is None else comm
        rows, w, prios, n_units, seed = self._rate_inputs((priorities, other_priorities), X, t, y, seed, subset,
                                                          sample_weight, clusters, comm)
        if n_units < 4:
            raise ValueError(f"the half-sample bootstrap needs at least 4 units (clusters, or rows), got {n_units}")
        K, M = rows.shape
        return rate.compare_priorities(comm, rows.scores.reshape(rows.n, K * M), prios[0], prios[1], w,
                                       rows.unit_ids(), rows.gids, target=target, q=q, n_bootstrap=n_bootstrap,
                                       seed=seed, contrasts=self.contrast_names() if K * M > 1 else None)

    def _rate_inputs(self, priority_sets, X, t, y, seed, subset, sample_weight, clusters, comm):
        """Rows, weights, priority arrays (one column per effect column, or one), unit count and seed."""
        if self.treatment_type_ == "continuous":
            raise ValueError("rank_average_treatment_effect needs a binary or categorical treatment (as in grf)")
        rows = self._rows(X, t, y, sample_weight, clusters, comm)
        w = subset_weights(rows, subset)
        K, M = rows.shape
        prios = []
        for priorities in priority_sets:
            prio = np.asarray(priorities, dtype=np.float64)
            if prio.ndim == 2 and prio.shape[1] == 1:
                prio = prio[:, 0]
            if prio.ndim == 2 and M > 1:
                prio = np.repeat(prio, M, axis=1)                # one column per arm, shared by outcomes
            prios.append(prio)
        with collective_checks(comm):       # one rank's bad priorities: every rank raises, none waits
            for prio in prios:
                if prio.shape not in ((rows.n,), (rows.n, K * M)):
                    raise ValueError(f"priorities must have shape ({rows.n},) or ({rows.n}, {K * M}), got "
                                     f"{prio.shape}")
                if not np.all(np.isfinite(prio)):
                    raise ValueError("priorities contain NaN or infinite values")
        _, _, n_units = cluster_moments(comm, np.zeros((rows.n, 1)), rows.layout, include=w > 0)
        seed = self.sampling_["seed"] if seed is None else int(seed)
        return rows, w, prios, n_units, seed

    def rank_average_treatment_effect(self, priorities, X=None, t=None, y=None, *, target="AUTOC", q=None,
                                      n_bootstrap=200, seed=None, subset=None, sample_weight=None, clusters=None,
                                      comm=None):
        """Rank-weighted average treatment effect of a prioritisation rule, with its TOC curve.

        Parameters
        ----------
        priorities : array-like, shape (n_local,) or (n_local, K)
            Priority of each row (higher first), built without these rows' outcomes
            (e.g. a forest's predictions from other data). Multi-arm: one column
            per arm, or one shared column.
        X, t, y : array-like, optional
            Held-out rows of this rank to evaluate on (their scores come from this
            forest's nuisance forests); default: the out-of-bag training rows.
        target : {"AUTOC", "QINI"}
        q : array-like, optional
            TOC grid of treated fractions (default 0.1, 0.2, ..., 1).
        n_bootstrap : int, default 200
            Half-sample bootstrap replicates (over clusters when there are clusters).
        seed : int, optional
            Bootstrap seed (default: the forest's ``random_state``).
        subset : array-like of bool, shape (n_local,), optional
        sample_weight, clusters, comm
            As in :meth:`average_treatment_effect`.

        Returns
        -------
        forest.analysis.result.RATEResult
            ``estimate``, ``stderr``, ``conf_int``, and ``q``, ``toc``,
            ``toc_stderr``; per arm against the control for multi-arm forests.
        """
        comm = world() if comm is None else comm
        rows, w, (prio,), n_units, seed = self._rate_inputs((priorities,), X, t, y, seed, subset, sample_weight,
                                                            clusters, comm)
        K, M = rows.shape
        names = self.contrast_names()
        return rate.rank_average_treatment_effect(
            comm, rows.scores.reshape(rows.n, K * M), prio, w, rows.unit_ids(), rows.gids, target=target, q=q,
            n_bootstrap=n_bootstrap, seed=seed, contrasts=names if K * M > 1 else None, n_units=n_units)

"""CausalSurvivalForest: effects on survival from censored times (grf's ``causal_survival_forest``).

The estimand is ``tau(x) = E[f(T(1)) - f(T(0)) | X = x]`` with ``f(T) = min(T, horizon)``
(the restricted mean survival time, "RMST") or ``f(T) = 1[T > horizon]``
("survival_probability"), for a binary treatment.

The fit follows grf: out of bag, a regression forest estimates the propensity
``e(x)``; a :class:`forest.SurvivalForest` of the times on ``(X, W)`` (an "S-learner")
gives the survival curves ``S(t | x, w)`` at ``w`` = 0, 1 and the observed ``W``, hence
``m(x) = e S(. | x, 1) + (1 - e) S(. | x, 0)`` integrated into ``E[f(T) | x]``; a second
survival forest of the censoring times (the events flipped) gives the censoring curve
``C(t | x, w)`` for the inverse-probability-of-censoring weights. Both use the
Nelson-Aalen estimate, which is never zero (grf's choice). From these,
:func:`forest.analysis.causal_survival.adjusted_outcomes` turns each row into a
censoring-adjusted outcome ``Y~`` whose causal forest on ``W`` (centred by ``m`` and
``e``) solves grf's estimating equation, and whose doubly robust scores are grf's
(``get_scores.causal_survival_forest``). The effect forest itself is
:class:`forest.CausalForest`'s: its BLB intervals, average effects (all, treated,
control, overlap), best linear projection, calibration test and RATE apply unchanged.

Where this differs from grf (said here so that no one looks for it): grf's leaf
estimate is ``sum alpha (W - e) r / sum alpha (W - e)^2``, ours the causal forest's
locally centred ``sum alpha (W~ - wbar)(r - rbar) / sum alpha (W~ - wbar)^2`` (the same
limit, as ``wbar -> 0``), and grf's splits also require ``alpha`` times the node's rows
of observed events in each child, which ours do not (each child needs
``min_samples_leaf`` rows of each arm, as in the causal forest).

The failure grid of the scores: every distinct capped time when there are at most
``max_grid_times`` (grf's default grid), else that many quantile times of them
(:func:`forest.criteria.survival.failure_grid`), plus the horizon. Under ``mpirun``
every piece is a forest of this engine and the grid is global, so the model does not
depend on the rank count.
"""
import warnings

import numpy as np
from scipy import sparse

from native import collectives as col
from native.comm import world

from forest._validation import (agreed_features, check_row_count, check_target, check_weight, feature_summary,
                                fit_features, validate_features)
from forest.analysis.causal_survival import (TARGETS, adjusted_outcomes, horizon_targets, restricted_mean,
                                             time_index)
from forest.analysis.effect_rows import make_effect_rows
from forest.analysis.inference import solve_theta
from forest.analysis.local_linear import DEFAULT_LAMBDA, check_lambda_path, local_linear_causal_solve
from forest.analysis.local_linear_leaves import (TABLE_CHUNK_CELLS, leaf_terms, local_linear_blb, local_linear_effect,
                                                 local_sums, table_columns, table_width, value_node_sums)
from forest.collective_checks import AgreedError, collective_checks, total
from forest.criteria.survival import MAX_SPLIT_TIMES, failure_grid
from forest.engine.clusters import layout_rows, observation_weights, resolve_clusters
from forest.engine.honest_forest import fit_binning, global_ids
from forest.engine.predictor import predict_leaves, predict_leaves_binned
from forest.engine.subsample import BOTH, ESTIMATION, OUT, forest_row_codes
from forest.estimators.base import check_is_fitted
from forest.estimators.causal_forest import CausalForest
from forest.estimators.local_linear import check_ll_lambda
from forest.estimators.regression_forest import RegressionForest, resolve_mtry, scaled_weights, weight_range
from forest.estimators.survival_forest import SurvivalForest, check_survival_targets
from forest.io import model_checks, model_io
from forest.io.training_rows import notify_training_rows
from forest.profiling import phase
from histogram.binning import append_indicator

#: Default size of the scores' failure grid (:class:`CausalSurvivalForest` ``max_grid_times``).
DEFAULT_GRID_TIMES = 128
#: Seed offsets of the nuisance forests (the propensity forest's is the causal forest's).
SURVIVAL_SEED, CENSORING_SEED, PROPENSITY_SEED = 15485863, 32452843, 104729
#: Query rows per chunk of nuisance curves (bounds the (rows, grid) buffers).
CHUNK_CELLS = 4_000_000
#: ``linear_correction_variables`` value that chooses the correction variables from the effect forest.
BY_IMPORTANCE = "importance"


class CausalSurvivalForest(CausalForest):
    """Honest causal forest of a treatment's effect on survival (grf's ``causal_survival_forest``).

    Parameters
    ----------
    horizon : float
        The horizon ``h``: required, within the observed times.
    target : {"RMST", "survival_probability"}, default "RMST"
        Effect on ``E[min(T, h)]`` or on ``P(T > h)``.
    n_estimators : int, default 200
    max_samples, honest, honesty_fraction, min_samples_leaf, max_depth, max_features, alpha,
    imbalance_penalty, ci_group_size, max_bins, nuisance_estimators, batch_size, random_state,
    equalize_cluster_weights, categorical_features
        As for :class:`forest.CausalForest` (the nuisance forests share the clusters).
    survival_estimators : int or None, default None
        Trees of each nuisance survival forest; None is grf's ``max(50, min(n_estimators
        / 4, 500))``.
    max_grid_times : int, default 128
        Most times on the scores' failure grid (at most 255; the module docstring).
    local_linear : bool, default False
        Correct ``predict``, ``predict_var`` and ``predict_interval`` by grf's local linear
        regression (``ll.causal``): at ``x``, the forest-weighted ridge regression of the
        adjusted outcome on ``[1, X - x, W~, W~ (X - x)]``, whose ``W~`` coefficient is the
        effect; the variance is the little bags' of that estimate
        (:mod:`forest.analysis.local_linear_leaves`). The fit keeps each leaf's mean of
        the regression's products (``ll_tables_``), so a model file predicts without its
        training rows. Read at prediction: ``set_params(local_linear=False)`` on a forest
        fitted with it gives the plain forest's estimates from the same trees. It needs
        the correction variables' values at fit (``X``, or ``correction_values`` beside
        binned codes, as ``forest-train --local-linear`` passes them), complete there.
        Off by default: on the simulated
        designs of ``benchmarks/bench_causal_survival.py`` (RESULTS.md, issue 33; 8
        training sets each) the correction on every feature raised the RMSE of
        ``tau(x)`` on all four designs (by 16 to 26 %) and moved the 95 % intervals'
        coverage from 0.83-0.89 to 0.87-0.91, still 0.87 on one design; on the effect's
        own variables only the RMSE was about unchanged and coverage 0.85-0.91. With
        ``ll_lambda=None`` (chosen out of bag) on every feature the RMSE stayed within
        0-12 % of the plain forest's and coverage at its level (0.84-0.89: lambda 10 was
        chosen on 24 of 32 training sets); on the effect's own variables coverage was
        0.86-0.91. With ``linear_correction_variables="importance"`` and ``ll_lambda=None``
        (no knowledge of the truth) coverage was 0.932, 0.882, 0.904 and 0.885 against the
        plain forest's 0.889, 0.894, 0.885 and 0.834, and the RMSE -21 %, +8 %, -4 % and
        -12 % of the plain forest's: 0.90 is still missed on a design whose effect steps in
        x0, and on the survival-probability design, whose standard errors fall where the
        estimate nears the bound 1.
    linear_correction_variables : sequence of int or str, None or "importance", optional
        The correction variables (grf's ``linear.correction.variables``): column indices
        or names, no categorical one; default every non-categorical column.
        ``"importance"`` chooses them at fit, without the truth: the non-categorical
        columns on which the effect forest splits at least an even share of the time
        (depth-weighted split frequency, grf's ``variable_importance``, kept as
        ``feature_importances_``, at least ``1 / n_features``; at least the most important
        one). The correction is then fitted on those alone (``ll_columns_``), and an
        ``ll_lambda=None`` penalty is chosen for them. The fit reads the values of every
        non-categorical column (the candidates; ``correction_values`` holds them all
        beside binned codes). On the simulated designs (RESULTS.md, issue 33) it kept only
        variables the effect depends on, in all 32 training sets (the effect's one variable
        where it has one; one or both of its two otherwise); the figures are under
        ``local_linear``.
    ll_lambda : float or None, default 0.1
        Ridge penalty of the slopes (grf's ``ll.lambda``, standard penalty); read at
        prediction, so it can be changed without refitting. None: chosen out of bag at
        fit over grf's grid ``(0, 0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 1, 10)``, as
        grf's ``tune_ll_causal_forest`` chooses it but on this forest's own scores: every
        training row's local linear effect ``tau_oob(x_i)`` from the trees that left it
        out (the mean of their leaf tables), and the criterion is the R-loss of the
        forest's out-of-bag scores, ``sum_i g_i (Y~_i - m_i - (W_i - e_i) tau_oob(x_i))^2
        / sum_i g_i``, with ``Y~`` the censoring-adjusted outcome and ``m``, ``e`` the
        out-of-bag nuisances of the fit (the quantities whose estimating equation the
        forest solves; a regression loss on the censored times would not measure the
        effect). The first lambda of least loss is kept as ``ll_lambda_`` (the same on
        every rank: the loss is summed over all ranks' rows), the path as
        ``local_linear_tuning_``; predictions with ``ll_lambda=None`` use ``ll_lambda_``.

    Attributes
    ----------
    horizon_, target_ : float, str
    failure_times_ : ndarray of float64, shape (G,)
        The scores' grid; its last time is the horizon.
    survival_forest_, censoring_forest_ : SurvivalForest or None
        The nuisance survival forests on ``(X, W)`` (the treatment their last feature);
        ``censoring_forest_`` is None when no time is censored before the horizon.
    treatment_forest_ : RegressionForest or None
        The propensity forest (None when ``t_hat`` was given).
    ate_, ate_stderr_, estimators_, ...
        As for :class:`forest.CausalForest`; ``ate_`` is the effect on the target.
    ll_columns_, ll_center_, ll_tables_ : ndarray or None
        With ``local_linear``: the correction variables' columns (p,), the training mean
        they are centred by (p,), and each leaf's table, shape (n_leaves,
        ``table_width(p)``), leaves in packed node order; None otherwise.
    ll_lambda_ : float or None
        With ``local_linear``: the fit's ridge penalty, chosen out of bag where
        ``ll_lambda`` was None, else ``ll_lambda``; the penalty of predictions made with
        ``ll_lambda=None``. None without ``local_linear``.
    local_linear_tuning_ : forest.analysis.local_linear.LambdaPath
        Where the fit chose ``ll_lambda``: the grid, the R-loss at each lambda, the choice
        and this rank's training rows' out-of-bag effects at each lambda (``(n_local, L)``).
        Kept by the fitting process only (not written to model files).

    Notes
    -----
    The analyses (``average_treatment_effect``, ``best_linear_projection``,
    ``test_calibration``, ``rank_average_treatment_effect``, ``get_scores``) use the
    out-of-bag rows of the fitting process; rows passed again take ``y=(time, event)``
    for the outcome: the training rows get their out-of-bag scores, other rows
    held-out scores from the nuisance forests.

    With ``local_linear`` the out-of-bag effects, scores and average effects stay the
    forest's (the scores are doubly robust: the average effect does not need the
    correction); only ``predict``, ``predict_var`` and ``predict_interval`` change.

    ``predict_interval`` is the effect forest's bootstrap of little bags (grf's), which
    leaves out the nuisance curves' noise; on the simulated designs of
    ``benchmarks/bench_causal_survival.py`` its standard errors are 0.97 to 1.17 times
    the sampling sd of ``tau_hat(x)``, and the intervals miss where the forest's
    smoothing bias is large, as the causal forest's do on the same rows without censoring
    (RESULTS.md, issue 33).
    """

    #: The CausalForest parameters this forest does not offer.
    treatment_type = "binary"
    warm_start = False
    stabilize_splits = True
    honesty_prune_leaves = True

    def __init__(self, horizon=None, *, target="RMST", n_estimators=200, max_samples=0.5, honest=True,
                 honesty_fraction=0.5, min_samples_leaf=5, max_depth=None, max_features=None, alpha=0.05,
                 imbalance_penalty=0.0, ci_group_size=2, max_bins=255, nuisance_estimators=None,
                 survival_estimators=None, max_grid_times=DEFAULT_GRID_TIMES, local_linear=False,
                 linear_correction_variables=None, ll_lambda=DEFAULT_LAMBDA, batch_size=None, random_state=None,
                 equalize_cluster_weights=False, categorical_features="from_dtype"):
        self.horizon = horizon
        self.target = target
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.honest = honest
        self.honesty_fraction = honesty_fraction
        self.min_samples_leaf = min_samples_leaf
        self.max_depth = max_depth
        self.max_features = max_features
        self.alpha = alpha
        self.imbalance_penalty = imbalance_penalty
        self.ci_group_size = ci_group_size
        self.max_bins = max_bins
        self.nuisance_estimators = nuisance_estimators
        self.survival_estimators = survival_estimators
        self.max_grid_times = max_grid_times
        self.local_linear = local_linear
        self.linear_correction_variables = linear_correction_variables
        self.ll_lambda = ll_lambda
        self.batch_size = batch_size
        self.random_state = random_state
        self.equalize_cluster_weights = equalize_cluster_weights
        self.categorical_features = categorical_features

    def _check_params(self):
        seed = super()._check_params()
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}, got {self.target!r}")
        h = self.horizon
        if h is None:
            raise ValueError("horizon is required: the time up to which the effect is measured (RMST) or at which "
                             "survival is compared (survival_probability)")
        if isinstance(h, bool) or not isinstance(h, (int, float, np.integer, np.floating)) or not np.isfinite(h) \
                or h <= 0:
            raise ValueError(f"horizon must be a finite positive number, got {h!r}")
        m = self.max_grid_times
        if isinstance(m, bool) or not isinstance(m, (int, np.integer)) or not 2 <= m <= MAX_SPLIT_TIMES:
            raise ValueError(f"max_grid_times must be an int in [2, {MAX_SPLIT_TIMES}], got {m!r}")
        s = self.survival_estimators
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 1):
            raise ValueError(f"survival_estimators must be an int >= 1 or None, got {s!r}")
        if not isinstance(self.local_linear, (bool, np.bool_)):
            raise ValueError(f"local_linear must be True or False, got {self.local_linear!r}")
        check_ll_lambda(self.ll_lambda)
        return seed

    # ------------------------------------------------------------------ fit
    def fit(self, X, t, time, event, sample_weight=None, *, t_hat=None, comm=None, progress=None, binned=None,
            feature_names=None, clusters=None, checkpoint=None, correction_values=None):
        """Fit on this rank's rows (collective under ``mpirun``).

        Parameters
        ----------
        X : array-like, pandas DataFrame or pyarrow Table, shape (n_local, n_features), or None
            NaN means missing; None with ``binned``.
        t : array-like of 0/1, shape (n_local,)
            The treatment.
        time : array-like, shape (n_local,)
            Failure or censoring times, finite and non-negative.
        event : array-like, shape (n_local,)
            1 where the failure was observed, 0 where censored.
        sample_weight : array-like, shape (n_local,), optional
        t_hat : array-like, shape (n_local,), optional
            Propensities ``P(W = 1 | x)``; estimated out of bag when not given.
        comm, binned, feature_names
            As for :meth:`forest.CausalForest.fit`.
        progress : callable, optional
            ``progress(done, total)`` over the whole fit: the nuisance forests' trees, the
            nuisance curves (one unit per chunk of rows) and the effect forest's trees.
        clusters : array-like of int, shape (n_local,), optional
            Cluster labels (grf's ``clusters``), shared by every forest of the fit; the
            analyses' standard errors are then cluster-robust.
        checkpoint : None
            Not offered (the nuisance survival forests do not checkpoint).
        correction_values : array-like of float, shape (n_local, p), optional
            With ``local_linear`` and ``X=None`` (binned codes alone): this rank's values of
            the ``p`` correction variables, columns in the features' order (the
            ``linear_correction_variables``, or every non-categorical feature of the bin
            mapper). Not with ``X``, which holds them.

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        with collective_checks(comm) as checks:
            if checkpoint is not None:
                raise ValueError("CausalSurvivalForest does not checkpoint (nor do its nuisance survival forests); "
                                 "fit without checkpoint")
            seed = self._check_params()
            X, binned, n = fit_features(self, X, binned, feature_names, min_samples=1 if comm.size == 1 else 0)
            resolve_mtry(self.max_features, self.n_features_in_)
            W = _binary_treatment(t, n, self)
            time, event = check_survival_targets(time, event, n, self)
            g = check_weight(sample_weight, n)
            if t_hat is not None:
                t_hat = check_target(t_hat, "t_hat", n, estimator=self, multi_output=False)
                if np.any((t_hat <= 0) | (t_hat >= 1)):
                    raise ValueError("t_hat must hold propensities strictly between 0 and 1")
            ll_columns, ll_values = self._ll_fit_columns(X, binned, correction_values, n)
            checks.share(rows=n, failures=int(event.sum()), treated=int(W.sum()), weights=weight_range(g),
                         t_min=float(time.min()) if n else np.inf, t_max=float(time.max()) if n else -np.inf,
                         **feature_summary(self))
        summaries = checks.summaries
        agreed_features(summaries, self)
        n_global = total(summaries, "rows")
        check_row_count(self, n_global, 4, comm.size)
        horizon = float(self.horizon)
        self._check_data(summaries, n_global, horizon)
        names = None if getattr(self, "feature_names_in_", None) is None else list(self.feature_names_in_)
        mapper, codes = binned if binned is not None else fit_binning(
            X, self.max_bins, seed, comm, getattr(self, "is_categorical_", None))
        gids, _ = global_ids(comm, n)
        layout = resolve_clusters(clusters, comm, n, self.equalize_cluster_weights, sample_weight)

        # The scores' time grid (global), then propensities, the survival and censoring forests on (X, W),
        # all out of bag.
        capped, _, _ = horizon_targets(time, event, horizon, self.target)
        grid = failure_grid(capped, np.ones(n, dtype=bool), int(self.max_grid_times), comm, seed=seed)
        self.failure_times_ = np.append(grid[grid < horizon], horizon)
        n_nuis = int(self.nuisance_estimators or max(50, int(self.n_estimators) // 4))
        n_surv = int(self.survival_estimators or max(50, min(int(self.n_estimators) // 4, 500)))
        stages = _Stages(progress, [0 if t_hat is not None else n_nuis, n_surv, n_surv, self._n_chunks(n, comm),
                                    int(self.n_estimators)])
        if t_hat is None:
            prop = RegressionForest(n_nuis, random_state=seed + PROPENSITY_SEED, **self._nuisance_params()).fit(
                None, W, g, comm=comm, binned=(mapper, codes), clusters=layout, progress=stages.of(0))
            e = np.asarray(prop.oob_prediction_, dtype=np.float64).reshape(n)
            del prop.oob_prediction_, prop.training_rows_
        else:
            prop, e = None, np.asarray(t_hat, dtype=np.float64)
        nuis_time, nuis_event = (horizon_targets(time, event, horizon, "RMST")[:2] if self.target == "RMST"
                                 else (time, event))
        aug = append_indicator(mapper, codes, W)
        survival = self._survival_forest(n_surv, seed + SURVIVAL_SEED).fit(
            None, nuis_time, nuis_event, g, comm=comm, binned=aug, clusters=layout, progress=stages.of(1))
        censored = int(col.allgather(comm, np.array([[int((~nuis_event).sum())]], dtype=np.int64)).sum())
        censoring = None
        if censored:
            censoring = self._survival_forest(n_surv, seed + CENSORING_SEED).fit(
                None, nuis_time, ~nuis_event, g, comm=comm, binned=aug, clusters=layout, progress=stages.of(2))
        for forest in (survival, censoring):
            if forest is not None:
                del forest._weights_source_, forest.training_rows_     # training rows: not part of the model
        self.survival_forest_, self.censoring_forest_, self.treatment_forest_ = survival, censoring, prop
        self.horizon_, self.target_ = horizon, self.target
        y_tilde, m, c_low = self._adjusted(codes, W, e, time, event, gids, layout, progress=stages.of(3))
        _warn_censoring(float(col.allgather(comm, np.array([[c_low]])).min()), self.target)

        super().fit(None, W, y_tilde, sample_weight, y_hat=m, t_hat=e, comm=comm, progress=stages.of(4),
                    binned=(mapper, codes), feature_names=names, clusters=layout)
        # restore what the causal fit set from its own arguments
        self.treatment_forest_ = prop
        self.ll_columns_ = self.ll_center_ = self.ll_tables_ = self.ll_lambda_ = None
        if hasattr(self, "local_linear_tuning_"):
            del self.local_linear_tuning_
        if self.local_linear:
            g_scaled = scaled_weights(g, n_global, float(col.allreduce(comm, np.array([g.sum()]))[0]),
                                      [s["weights"] for s in summaries])
            packed = self.estimators_
            roles = forest_row_codes(self.sampling_, len(packed["tree_offsets"]) - 1, gids, layout)   # (trees, n)
            leaves = predict_leaves_binned(packed, codes, self.bin_mapper_.missing_bin_)            # (n, trees)
            self._fit_leaf_tables(ll_columns, ll_values, W - e, y_tilde - m, g_scaled, roles, leaves, comm)
            if isinstance(self.linear_correction_variables, str):     # BY_IMPORTANCE (checked above)
                ll_values = ll_values[:, self._keep_important_tables()]
            if self.ll_lambda is None:
                self.ll_lambda_ = self._tune_leaf_tables(None, ll_values, W - e, y_tilde - m, g, roles, leaves,
                                                         comm).ll_lambda
            else:
                self.ll_lambda_ = float(self.ll_lambda)
        self._record_training_rows(comm, gids, n_global, codes, [W[:, None], time[:, None],
                                                                 event[:, None].astype(np.float64)])
        return self

    # ------------------------------------------------------------------ local linear correction
    def _ll_fit_columns(self, X, binned, values, n):
        """``(columns (p,), values (n, p))`` of the correction variables, checked (inside the checks).

        ``(None, None)`` without ``local_linear``. The values come from ``X``, or from
        ``correction_values`` where the fit has binned codes alone.
        """
        if not self.local_linear:
            if values is not None:
                raise ValueError("correction_values are the local linear correction's: give them with "
                                 "local_linear=True")
            return None, None
        if X is not None:
            if values is not None:
                raise ValueError("correction_values go with binned codes and X=None; X holds the correction "
                                 "variables' values")
            columns = self._correction_columns(self._named_correction(), "linear_correction_variables")
            Z, what = X[:, columns], "X"
        else:
            categorical = getattr(binned[0], "categorical_", None)
            columns = self._correction_columns(self._named_correction(), "linear_correction_variables",
                                               categorical=categorical)
            if values is None:
                raise ValueError("local_linear with binned codes (X=None) needs correction_values: the correction "
                                 "variables' values, which codes do not carry")
            Z = np.asarray(values, dtype=np.float64)
            if Z.ndim == 1 and len(columns) == 1:
                Z = Z[:, None]
            if Z.shape != (n, len(columns)):
                raise ValueError(f"correction_values must have shape ({n}, {len(columns)}) (this rank's rows by the "
                                 f"correction variables, in the features' order), got {Z.shape}")
            if np.isinf(Z).any():
                raise ValueError("correction_values has infinite values")
            what = "correction_values"
        if np.isnan(Z).any():
            raise ValueError(f"{what} has missing values in the correction variables; local_linear needs complete "
                             f"values there (choose linear_correction_variables=)")
        return columns, np.ascontiguousarray(Z, dtype=np.float64)

    def _named_correction(self):
        """The correction variables named by the user, None for every non-categorical one (also the
        candidates of ``"importance"``)."""
        named = self.linear_correction_variables
        if isinstance(named, str) and named == BY_IMPORTANCE:
            return None
        if isinstance(named, str):
            raise ValueError(f"linear_correction_variables must be a sequence of columns, None or "
                             f"{BY_IMPORTANCE!r}, got {named!r}")
        return named

    def _keep_important_tables(self):
        """Narrow the leaf tables to the correction variables the effect forest splits on most.

        The variables kept are the candidates (``ll_columns_``) whose depth-weighted split
        frequency (grf's ``variable_importance``, ``feature_importances_``) is at least an
        even share, ``1 / n_features``; at least the most important candidate. The effect
        forest's trees are the same on every rank, so is the choice. Narrowing selects
        columns of the tables (:func:`forest.analysis.local_linear_leaves.table_columns`):
        the same tables as a fit on those variables alone.

        Returns
        -------
        ndarray of int64
            Positions of the kept variables among the candidates (increasing).
        """
        importance = np.asarray(self.feature_importances_, dtype=np.float64)[self.ll_columns_]
        keep = np.flatnonzero(importance >= 1.0 / self.n_features_in_)
        if not len(keep):
            keep = np.array([int(np.argmax(importance))])
        self.ll_tables_ = np.ascontiguousarray(self.ll_tables_[:, table_columns(len(self.ll_columns_), keep)])
        self.ll_columns_, self.ll_center_ = self.ll_columns_[keep], self.ll_center_[keep]
        return keep

    def _fit_leaf_tables(self, columns, Z, wc, yc, g, roles, leaves, comm):
        """``ll_columns_``, ``ll_center_`` and ``ll_tables_`` from this rank's training rows (collective).

        Each leaf's table is the mean over its estimation rows (all ranks') of
        :func:`forest.analysis.local_linear_leaves.leaf_terms`, the rows found as
        :meth:`get_forest_weights` finds them (their role in each tree, ``roles`` (trees, n)
        from :func:`forest.engine.subsample.forest_row_codes`, their leaf, ``leaves`` (n, trees)).
        """
        packed = self.estimators_
        offsets = np.asarray(packed["tree_offsets"], dtype=np.int64)
        n_trees, n_nodes = len(offsets) - 1, len(packed["feature"])
        n, p = Z.shape
        sums = col.allreduce(comm, np.concatenate([Z.sum(axis=0), [n]]))
        center = sums[:p] / max(sums[p], 1.0)
        terms = leaf_terms(Z - center, wc, yc, g)
        width = terms.shape[1]
        node_sums = np.zeros((n_nodes, width + 1))
        step = max(1, TABLE_CHUNK_CELLS // max(n * width, 1))
        for lo in range(0, n_trees, step):
            hi = min(n_trees, lo + step)
            part = roles[lo:hi]
            tree, row = np.nonzero((part == ESTIMATION) | (part == BOTH))
            node = offsets[lo + tree] + leaves[row, lo + tree]
            for k in range(width):
                node_sums[:, k] += np.bincount(node, weights=terms[row, k], minlength=n_nodes)
            node_sums[:, width] += np.bincount(node, minlength=n_nodes)
        leaf = np.flatnonzero(np.asarray(packed["feature"]) < 0)
        if comm.size > 1:
            node_sums[leaf] = col.allreduce(comm, np.ascontiguousarray(node_sums[leaf]))
        count_col = self._layout().n_moments
        leaf_sums = value_node_sums(packed, node_sums, count_col)[leaf]
        count = leaf_sums[:, width]
        stored = np.asarray(packed["value"], dtype=np.float64)[leaf, count_col]
        if not np.array_equal(count, stored) or (count <= 0).any():
            # a leaf's value comes from its value node's estimation rows: anything else is a bug here
            raise RuntimeError("local linear tables: the leaves' estimation rows do not match the forest's counts")
        self.ll_columns_ = np.asarray(columns, dtype=np.int64)
        self.ll_center_ = center
        self.ll_tables_ = leaf_sums[:, :width] / count[:, None]

    def _tune_leaf_tables(self, lambdas, Z, wc, yc, g, roles, leaves, comm):
        """Choose ``ll_lambda`` out of bag on the fit's scores (the ``ll_lambda`` parameter); collective.

        Row ``i``'s out-of-bag local linear effect at each lambda solves the ridge of
        :func:`forest.analysis.local_linear_leaves.local_sums` on the mean of the leaf
        tables of the trees that left it out (subsample code ``OUT``: never in their
        estimation rows, so its own terms are in none of those tables), which is the
        local linear regression on its out-of-bag forest weights
        (:mod:`forest.engine.oob_forest_weights`). The R-loss residual is
        ``yc - wc tau``; :meth:`_finish_path` sums it over all ranks and chooses. Each
        row's sum runs over its trees in tree order, so it does not depend on the rank count.

        Parameters
        ----------
        lambdas : sequence of float or None
            The grid (None: grf's).
        Z : ndarray of float64, shape (n, p)
            The training rows' correction variables (not centred).
        wc, yc : ndarray of float64, shape (n,)
            ``W - e`` and ``Y~ - m``, out of bag.
        g : ndarray of float64, shape (n,)
            Sample weights (ones without).
        roles : ndarray of int8, shape (n_trees, n)
        leaves : ndarray of int, shape (n, n_trees)

        Returns
        -------
        forest.analysis.local_linear.LambdaPath
            Also ``local_linear_tuning_``; its ``oob_predictions`` are ``(n, L)``, NaN
            for a row with no out-of-bag tree (left out of the loss).
        """
        grid = check_lambda_path(lambdas)
        offsets, row_of = self._leaf_table_rows()
        n_trees = len(offsets) - 1
        tables = self.ll_tables_
        z = Z - self.ll_center_
        n = len(z)
        tau = np.full((n, len(grid)), np.nan)
        step = max(1, TABLE_CHUNK_CELLS // max(n_trees, 1))
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            row, tree = np.nonzero(roles[:, lo:hi].T == OUT)
            leaf = row_of[offsets[tree] + leaves[lo + row, tree]]
            oob = sparse.csr_matrix((np.ones(len(row)), (row, leaf)), shape=(hi - lo, len(tables)))
            count = np.bincount(row, minlength=hi - lo)
            has = np.flatnonzero(count > 0)
            if len(has):
                M, b = local_sums((oob[has] @ tables) / count[has, None], z[lo + has])
                tau[lo + has] = local_linear_causal_solve(M, b, grid)[:, :, 0]
        residuals = (yc[:, None] - wc[:, None] * tau)[:, :, None]
        return self._finish_path(grid, residuals, g, "R-loss", tau, comm)

    def _leaf_table_rows(self):
        """Where each packed node's leaf table is: ``(tree offsets (T + 1,), row (n_nodes,))``,
        ``row[v]`` the row of ``ll_tables_`` of leaf ``v`` (leaves in packed node order), -1 for
        inner nodes."""
        packed = self.estimators_
        feature = np.asarray(packed["feature"])
        row_of = np.full(len(feature), -1, dtype=np.int64)
        row_of[feature < 0] = np.arange(int((feature < 0).sum()))
        return np.asarray(packed["tree_offsets"], dtype=np.int64), row_of

    def _ll_chunks(self, X, chunk_rows=None):
        """``(rows slice, tree tables (m, B, width), centred x (m, p))`` over chunks of validated ``X``."""
        packed = self.estimators_
        offsets, row_of = self._leaf_table_rows()
        n_trees = len(offsets) - 1
        Z = X[:, self.ll_columns_]
        if np.isnan(Z).any():
            raise ValueError("X has missing values in the correction variables of this forest's local linear "
                             "correction; it needs complete values there")
        Z = Z - self.ll_center_
        width = self.ll_tables_.shape[1]
        if chunk_rows is None:
            chunk_rows = max(1, TABLE_CHUNK_CELLS // max(n_trees * width, 1))
        for lo in range(0, len(X), chunk_rows):
            hi = min(len(X), lo + chunk_rows)
            leaves = predict_leaves(packed, X[lo:hi]).astype(np.int64) + offsets[:-1]
            yield slice(lo, hi), self.ll_tables_[row_of[leaves]], Z[lo:hi]

    def _ll_active(self):
        """Whether predictions take the local linear correction (``local_linear`` read at prediction)."""
        check_is_fitted(self, "estimators_")
        if not self.local_linear:
            return False
        if getattr(self, "ll_tables_", None) is None:
            raise ValueError("this forest was fitted without local_linear (it has no leaf tables): refit it with "
                             "local_linear=True")
        self._ll_penalty()
        return True

    def _ll_penalty(self):
        """The ridge penalty of predictions: ``ll_lambda``, or the fit's ``ll_lambda_`` where it is None."""
        given = check_ll_lambda(self.ll_lambda)
        if given is not None:
            return given
        chosen = getattr(self, "ll_lambda_", None)
        if chosen is None:
            raise ValueError("ll_lambda=None takes the fit's penalty (ll_lambda_), which this model does not have: "
                             "set ll_lambda to a number, or refit")
        return chosen

    def predict(self, X):
        """Estimated effect ``tau(x)`` on the target (``(n,)``); local linear with ``local_linear``."""
        if not self._ll_active():
            return super().predict(X)
        X = validate_features(self, X, reset=False, min_samples=0)
        out = np.empty(len(X))
        for rows, tables, z in self._ll_chunks(X):
            out[rows] = local_linear_effect(tables.mean(axis=1), z, self._ll_penalty())
        return out

    def predict_local_linear(self, *args, **kwargs):
        """Refused: the causal forest's local linear prediction regresses a training outcome
        ``y_train`` on the forest weights, which censored times do not give. A causal survival
        forest fitted with ``local_linear=True`` applies its correction in :meth:`predict` and
        :meth:`predict_interval`, from the censoring-adjusted scores kept at fit."""
        raise TypeError("CausalSurvivalForest has no predict_local_linear: fit with local_linear=True, then "
                        "predict(X) and predict_interval(X) give the locally linear effects")

    def tune_local_linear(self, *args, **kwargs):
        """Refused: a causal survival forest chooses its penalty at fit (``ll_lambda=None``, the
        out-of-bag R-loss of its own scores), where the censoring-adjusted outcomes exist."""
        raise TypeError("CausalSurvivalForest has no tune_local_linear: fit with local_linear=True, "
                        "ll_lambda=None to choose the penalty out of bag (the choice is ll_lambda_)")

    def _theta_var(self, X, chunk_rows=None):
        if not self._ll_active():
            return super()._theta_var(X, chunk_rows)
        if self.ci_group_size < 2:
            raise ValueError("variance estimates need ci_group_size >= 2 at fit time")
        X = validate_features(self, X, reset=False, min_samples=0)
        tau, var = np.empty(len(X)), np.empty(len(X))
        with phase("prediction"):
            for rows, tables, z in self._ll_chunks(X, chunk_rows):
                tau[rows], var[rows] = local_linear_blb(tables, z, self._ll_penalty(), False, self.ci_group_size)
        return tau, var

    def _check_data(self, summaries, n_global, horizon):
        """The global checks of the times, events, treatment and horizon (one clear line each).

        :class:`forest.collective_checks.AgreedError`: decided from values every rank shares, so every rank
        raises it together (the command-line tools print it as one line).
        """
        if total(summaries, "failures") == 0:
            raise AgreedError("event holds no failure (every time is censored): there is no survival to compare")
        treated = total(summaries, "treated")
        if treated == 0 or treated == n_global:
            raise AgreedError("t must hold both arms (0 and 1): found only " + ("0" if treated == 0 else "1"))
        t_min = min(s["t_min"] for s in summaries)
        t_max = max(s["t_max"] for s in summaries)
        if horizon > t_max:
            raise AgreedError(f"horizon {horizon:g} is beyond the last observed time {t_max:g}: nothing is observed "
                             f"up to it; choose a horizon within the follow-up")
        if horizon < t_min:
            raise AgreedError(f"horizon {horizon:g} is before the first observed time {t_min:g}")

    def _survival_forest(self, n_trees, seed):
        """A nuisance survival forest (grf's: Nelson-Aalen curves, ``min.node.size`` 15)."""
        return SurvivalForest(n_trees, max_samples=self.max_samples, min_node_size=15,
                              max_features=self.max_features, max_bins=self.max_bins, batch_size=self.batch_size,
                              random_state=seed, equalize_cluster_weights=self.equalize_cluster_weights)

    # ------------------------------------------------------------------ scores
    def _nuisance_curves(self, forest, codes, W, gids, layout):
        """Nelson-Aalen survival ``exp(-H)`` at the grid, shape (n, G), of rows with treatment ``W``."""
        aug = np.empty((codes.shape[0] + 1, codes.shape[1]), dtype=codes.dtype)
        aug[:-1] = codes
        aug[-1] = W
        _, chf = forest.curves_binned(aug, self.failure_times_, gids, layout)
        return np.exp(-chf)

    def _n_chunks(self, n_local, comm):
        """Chunks of rows :meth:`_adjusted` takes on the rank with the most rows (the progress units)."""
        most = int(col.allgather(comm, np.array([[n_local]], dtype=np.int64)).max())
        step = max(1, CHUNK_CELLS // max(len(self.failure_times_), 1))
        return max(1, -(-most // step))

    def _adjusted(self, codes, W, e, time, event, gids, layout=None, progress=None):
        """``(Y~, m, smallest C(Y))`` of rows (out of bag with ``gids``, else from every tree).

        Parameters
        ----------
        codes : ndarray of uint8, shape (n_features, n)
        W, e, time : ndarray of float64, shape (n,)
        event : ndarray of bool, shape (n,)
        gids : ndarray of int64, shape (n,), or None
        layout : forest.engine.clusters.ClusterLayout, optional
            The fit's clusters (out-of-bag rows of a clustered fit).

        Returns
        -------
        y_tilde, m : ndarray of float64, shape (n,)
        c_low : float
            The smallest censoring probability ``C(Y_i | x_i)`` (inf for no rows).
        """
        grid, horizon, target = self.failure_times_, self.horizon_, self.target_
        n = len(W)
        y_tilde, m_all = np.empty(n), np.empty(n)
        capped, observed, f = horizon_targets(time, event, horizon, target)
        c_low = np.inf
        step = max(1, CHUNK_CELLS // max(len(grid), 1))
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            part = np.ascontiguousarray(codes[:, lo:hi])
            ids = None if gids is None else gids[lo:hi]
            part_layout = None if gids is None else layout_rows(layout, lo, hi)
            w = W[lo:hi]
            S1 = self._nuisance_curves(self.survival_forest_, part, np.ones(hi - lo, dtype=np.uint8), ids,
                                       part_layout)
            S0 = self._nuisance_curves(self.survival_forest_, part, np.zeros(hi - lo, dtype=np.uint8), ids,
                                       part_layout)
            S = np.where(w[:, None] == 1, S1, S0)
            if self.censoring_forest_ is None:
                C = np.ones_like(S)
            else:
                C = self._nuisance_curves(self.censoring_forest_, part, w.astype(np.uint8), ids, part_layout)
            if target == "RMST":
                mean1, mean0 = restricted_mean(S1, grid, horizon), restricted_mean(S0, grid, horizon)
            else:
                mean1, mean0 = S1[:, -1], S0[:, -1]
            m = e[lo:hi] * mean1 + (1.0 - e[lo:hi]) * mean0
            r = adjusted_outcomes(S, C, grid, capped[lo:hi], observed[lo:hi], f[lo:hi], m, target)
            y_tilde[lo:hi], m_all[lo:hi] = m + r, m
            k = time_index(grid, capped[lo:hi])
            c_low = min(c_low, float(C[np.arange(hi - lo), k].min()))
            if progress is not None:
                progress(lo // step + 1, -(-n // step))
        return y_tilde, m_all, c_low

    # ------------------------------------------------------------------ rows passed again
    def _row_columns(self, t, time, event=None, *, n):
        """``[W, time, event]`` (n, 1) each, as ``fit`` records them (``time`` may be the pair ``(time, event)``)."""
        W = _binary_treatment(t, n, self)
        time, event = _time_event(time if event is None else (time, event), n, self)
        return [W[:, None], time[:, None], event[:, None].astype(np.float64)]

    def _heldout_rows(self, X, t, y, sample_weight=None, clusters=None, comm=None):
        """Rows passed as ``X, t, y=(time, event)``: out of bag when they are the training rows, else held out."""
        check_is_fitted(self, "estimators_")
        if self.treatment_forest_ is None:
            raise ValueError("scores of rows passed again need the propensity forest, but this forest was fitted "
                             "with t_hat: use the out-of-bag scores in the fitting process (no X, t, y)")
        comm = world() if comm is None else comm
        with collective_checks(comm):
            X = validate_features(self, X, reset=False, min_samples=0)
            n = len(X)
            W = _binary_treatment(t, n, self)
            time, event = _time_event(y, n, self)
            if sample_weight is not None:
                sample_weight = check_weight(sample_weight, n)
        match, codes, gids = self._match_codes(X, [W[:, None], time[:, None], event[:, None].astype(np.float64)],
                                               comm)
        if match.kind == "overlap":
            raise ValueError(match.refusal("X, t, y"))
        training = match.kind == "training"
        fitted = bool(self.sampling_.get("clusters", False))
        if training and fitted and clusters is None:
            raise ValueError("these are the training rows of a forest fitted with clusters: pass the fit's cluster "
                             "labels (clusters=) for their out-of-bag estimates")
        layout = resolve_clusters(clusters, comm, n, self.equalize_cluster_weights, sample_weight,
                                  fitted=fitted if training else None)
        if training:
            tau = self._oob_theta_binned(codes, gids, layout, fallback=True)
            e = self.treatment_forest_.oob_prediction_binned(codes, gids, layout).reshape(n)
        else:
            theta, _ = solve_theta(self._mean_moments(X), self._layout())
            tau = np.nan_to_num(theta, nan=0.0, posinf=0.0, neginf=0.0)
            e = np.asarray(self.treatment_forest_.predict(X), dtype=np.float64).reshape(n)
        y_tilde, m, _ = self._adjusted(codes, W, e, time, event, gids if training else None, layout)
        weight = observation_weights(sample_weight, layout, n)
        rows = make_effect_rows("binary", tau, W[:, None], W.astype(np.int64), y_tilde[:, None], m[:, None],
                                e[:, None], None, weight, gids, layout,
                                source="out-of-bag" if training else "held-out")
        if training:
            notify_training_rows(match, stacklevel=5)
        return rows


class _Stages:
    """One ``progress(done, total)`` over consecutive stages of known sizes (trees, chunks)."""

    def __init__(self, progress, sizes):
        self.progress, self.sizes = progress, [int(s) for s in sizes]
        self.total = sum(self.sizes)

    def of(self, k):
        """The callback of stage ``k``: its own ``(done, n)`` placed after the stages before it."""
        if self.progress is None:
            return None
        offset, size = sum(self.sizes[:k]), self.sizes[k]
        return lambda done, n: self.progress(offset + min(int(done), size), self.total)


def _binary_treatment(t, n, est):
    """``t`` as float64 0/1 (n,); one clear line otherwise."""
    t = check_target(t, "t", n, estimator=est, dtype="numeric", multi_output=False)
    flags = np.asarray(t)
    if not np.all((flags == 0) | (flags == 1)):
        bad = flags[(flags != 0) & (flags != 1)][0]
        raise ValueError(f"t must be a binary 0/1 treatment, found {bad.item()!r}")
    return flags.astype(np.float64)


def _time_event(y, n, est):
    """The outcome of rows passed again: ``y = (time, event)`` (or an (n, 2) array), checked."""
    if isinstance(y, tuple) and len(y) == 2:
        time, event = y
    else:
        arr = np.asarray(y)
        if arr.ndim != 2 or arr.shape[1] != 2:
            raise ValueError("for a causal survival forest y is the pair (time, event) (or an (n, 2) array of "
                             f"them), got shape {arr.shape}")
        time, event = arr[:, 0], arr[:, 1]
    return check_survival_targets(time, event, n, est)


def _warn_censoring(c_low, target):
    """grf's warnings when the estimated censoring probabilities come near zero."""
    if not np.isfinite(c_low):
        return
    if target == "RMST" and c_low <= 0.05:
        warnings.warn(f"estimated censoring probabilities go as low as {c_low:.4g}: identification needs P(C > T "
                      f"| X) bounded away from 0 up to the horizon; below 0.05 the estimates are not reliable "
                      f"(a smaller horizon may help)", UserWarning, stacklevel=3)
    elif target == "RMST" and c_low < 0.2:
        warnings.warn(f"estimated censoring probabilities are as low as {c_low:.4g} (below 0.2)", UserWarning,
                      stacklevel=3)
    elif target == "survival_probability" and c_low < 0.05:
        warnings.warn(f"estimated censoring probabilities are as low as {c_low:.4g}: the estimates may be "
                      f"unstable; a smaller horizon may help", UserWarning, stacklevel=3)


def _check_ll_tables(est):
    """A restored forest's local linear tables: all three or none, shapes that fit the trees, finite values."""
    state = vars(est)
    parts = [state.get(k) for k in ("ll_columns_", "ll_center_", "ll_tables_")]
    chosen = state.get("ll_lambda_")
    if chosen is not None and (isinstance(chosen, bool) or not isinstance(chosen, float) or not np.isfinite(chosen)
                               or chosen < 0 or parts[2] is None):
        raise ValueError(f"ll_lambda_ must be a finite float >= 0 beside the leaf tables, got {chosen!r}")
    if all(v is None for v in parts) or "estimators_" not in state:
        return
    columns, center, tables = parts
    n_leaves = int((np.asarray(est.estimators_["feature"]) < 0).sum())
    if not (isinstance(columns, np.ndarray) and columns.dtype == np.int64 and columns.ndim == 1 and len(columns)
            and len(np.unique(columns)) == len(columns) and columns.min() >= 0
            and columns.max() < est.n_features_in_):
        raise ValueError("ll_columns_ must be distinct int64 feature indices")
    p = len(columns)
    for name, value, shape in (("ll_center_", center, (p,)), ("ll_tables_", tables, (n_leaves, table_width(p)))):
        if not (isinstance(value, np.ndarray) and value.dtype == np.float64 and value.shape == shape
                and np.all(np.isfinite(value))):
            raise ValueError(f"{name} must be a finite float64 array of shape {shape}")


def _check_causal_survival_forest(est):
    model_checks.check_causal_forest(est, RegressionForest)
    model_checks.check_causal_survival_parts(est, SurvivalForest)
    _check_ll_tables(est)


model_io.register(CausalSurvivalForest, check=_check_causal_survival_forest)

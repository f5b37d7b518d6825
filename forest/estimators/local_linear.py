"""``predict_local_linear``: grf's local linear correction on the regression and causal forests (issue 38).

The statistics live in :mod:`forest.analysis.local_linear`; these mixins gather what they
need: the forest weights of the query rows over this rank's training rows (the
training rows passed again and checked against the model's fingerprint), the
correction variables of both, and one allreduce of the per-query sums. Training rows
are never part of a model, so ``X_train`` and the training targets are arguments (the
forest weights and out-of-bag state have the same rule).

* :class:`LocalLinearMixin` (regression and probability forests' class; regression
  only): grf's ``predict(regression_forest, X, linear.correction.variables = ...)``.
* :class:`CausalLocalLinearMixin` (:class:`forest.CausalForest`): grf's
  ``predict(causal_forest, X, linear.correction.variables = ...)``, on the forest's
  out-of-bag centring of its training rows (binary or scalar continuous treatment).

``ll_lambda=None`` chooses the penalty as grf does when ``ll.lambda`` is not given:
``tune_local_linear`` computes every training row's out-of-bag local linear estimate
(:mod:`forest.engine.oob_forest_weights`) at each lambda of grf's grid and takes the
first lambda of least out-of-bag squared error (regression) or R-loss (causal). The
training rows are taken in rounds of :data:`OOB_QUERY_ROWS` global rows: each round
gathers those rows' leaves (the trees that held them masked out), every rank adds its
own training rows' sums, one allreduce completes them and each rank solves its own
rows; the criterion is one more allreduce, so every rank makes the same choice. The
result (:class:`forest.analysis.local_linear.LambdaPath`) is returned and kept as
``local_linear_tuning_`` (not written to model files: it describes training rows).

Local linear *splitting* (grf's ``ll_regression_forest(enable.ll.split = TRUE)``) is
``RegressionForest(enable_ll_split=True, ...)``: the criterion
:mod:`forest.criteria.local_linear_split` (the node's ridge solved in ``prepare`` from
subtractable channel sums, the variance gain of the residual sums), its wiring in
:mod:`forest.estimators.ll_split` (parameters, the whole-data ridge from exact sums, no
missing values in the split variables). The leaves hold outcome means as before; these
mixins apply the correction at prediction.
"""
import numpy as np
from scipy import sparse

from native import collectives as col
from native.comm import world

from forest._validation import as_columns, check_target, check_weight, validate_features
from forest.analysis.local_linear import (DEFAULT_LAMBDA, LambdaPath, check_lambda_path, choose_lambda,
                                          local_linear_causal_solve, local_linear_causal_sums, local_linear_solve,
                                          local_linear_sums, path_errors, ridge_coefficient)
from forest.collective_checks import collective_checks
from forest.engine.clusters import resolve_clusters
from forest.engine.forest_weights import estimation_slices, forest_weights
from forest.engine.oob_forest_weights import oob_forest_weights, oob_query_leaves
from forest.engine.predictor import predict_leaves, predict_leaves_binned
from forest.engine.subsample import forest_row_codes
from forest.estimators.base import check_is_fitted
from forest.estimators.forest_weights import WeightsSource
from forest.io.feature_table import named_columns

#: Global training rows per round of the out-of-bag pass of ``tune_local_linear``.
OOB_QUERY_ROWS = 2048


def check_ll_lambda(ll_lambda, allow_none=True):
    """``ll_lambda`` as a float: a finite number >= 0, or None where ``allow_none`` (chosen
    out of bag); one clear line otherwise. The one check of every local linear estimator's
    ridge penalty."""
    if ll_lambda is None and allow_none:
        return None
    if isinstance(ll_lambda, bool) or not isinstance(ll_lambda, (int, float, np.integer, np.floating)) \
            or not np.isfinite(ll_lambda) or ll_lambda < 0:
        hint = " (or None: chosen out of bag)" if allow_none else ""
        raise ValueError(f"ll_lambda must be a finite number >= 0{hint}, got {ll_lambda!r}")
    return float(ll_lambda)


def _allreduce_sums(comm, M, b):
    """``(M, b)`` summed over ranks (one allreduce)."""
    if comm.size == 1:
        return M, b
    total = col.allreduce(comm, np.concatenate([M.ravel(), b.ravel()]))
    return total[:M.size].reshape(M.shape), total[M.size:].reshape(b.shape)


class _TrainingLayout:
    """This rank's training rows as the forest's trees see them: leaves, roles, estimation slices."""

    def __init__(self, est, source):
        packed = est.estimators_
        n_trees = len(packed["tree_offsets"]) - 1
        self.source = source
        self.codes = forest_row_codes(est.sampling_, n_trees, source.gids, source.clusters)
        self.leaves = predict_leaves_binned(packed, source.codes, est.bin_mapper_.missing_bin_)
        self.slices = estimation_slices(packed, self.leaves, self.codes)


class _LocalLinearBase:
    """What the two mixins share: correction columns, forest weights from a source, the out-of-bag pass."""

    #: A lambda choice describes training rows: never in model files.
    _model_io_exclude_ = ("local_linear_tuning_",)

    def _correction_columns(self, variables, name="variables", categorical=None):
        """Column indices of the correction variables (default: the non-categorical ones).

        ``categorical`` (bool, shape (n_features,)) replaces ``is_categorical_`` where the
        fit has only binned codes (the bin mapper's ``categorical_``, as ``forest-train``
        passes them).
        """
        n = self.n_features_in_
        if categorical is None:
            categorical = getattr(self, "is_categorical_", np.zeros(n, bool))
        categorical = np.asarray(categorical, dtype=bool)
        if variables is None:
            cols = np.flatnonzero(~categorical)
            if not len(cols):
                raise ValueError("every feature is categorical: local linear correction needs numeric variables")
            return cols
        names = getattr(self, "feature_names_in_", None)
        selected = named_columns(list(variables), None if names is None else list(names), n, name)
        cols = np.flatnonzero(selected)
        if not len(cols) or categorical[cols].any():
            raise ValueError(f"{name} must name at least one feature, and no categorical one")
        return cols

    def _weights_from(self, layout, Xq, comm):
        """Forest weights (CSR, all ranks' query rows by this rank's training rows) of validated ``Xq``."""
        count_col, norm_col = self._weights_columns()
        packed = self.estimators_
        queries = col.allgatherv(comm, np.ascontiguousarray(Xq, dtype=np.float64).reshape(len(Xq), -1))
        query_leaves = predict_leaves(packed, queries)
        indptr, indices, data = forest_weights(packed, query_leaves, layout.slices, layout.source.factor, count_col,
                                               norm_col)
        return sparse.csr_matrix((data, indices, indptr), shape=(len(queries), len(layout.source.gids)))

    def _oob_path(self, layout, Z, sums, solve, shape, comm):
        """Out-of-bag estimates of this rank's training rows (see the module docstring).

        Parameters
        ----------
        layout : _TrainingLayout
        Z : ndarray, shape (n_local, p)
            The training rows' correction variables (the query points).
        sums : callable
            ``sums(weights, queries) -> (M, b)`` over this rank's training rows.
        solve : callable
            ``solve(M, b) -> ndarray (n, L, k)``.
        shape : tuple
            ``(L, k)``.
        comm : native.comm.Communicator

        Returns
        -------
        ndarray, shape (n_local, L, k)
        """
        count_col, norm_col = self._weights_columns()
        packed = self.estimators_
        n_local = len(layout.source.gids)
        qleaves = oob_query_leaves(layout.leaves, layout.codes)
        first, n_global = col.global_row_offset(comm, n_local)
        pieces = []
        for lo in range(0, n_global, OOB_QUERY_ROWS):
            hi = min(n_global, lo + OOB_QUERY_ROWS)
            a = min(max(lo - first, 0), n_local)
            b = min(max(hi - first, 0), n_local)
            chunk_leaves = col.allgatherv(comm, qleaves[a:b])
            chunk_z = col.allgatherv(comm, np.ascontiguousarray(Z[a:b], dtype=np.float64))
            indptr, indices, data = oob_forest_weights(packed, chunk_leaves, layout.slices, layout.source.factor,
                                                       count_col, norm_col)
            weights = sparse.csr_matrix((data, indices, indptr), shape=(len(chunk_leaves), n_local))
            M, rhs = _allreduce_sums(comm, *sums(weights, chunk_z))
            own = slice(first + a - lo, first + b - lo)
            if b > a:
                pieces.append(solve(M[own], rhs[own]))
        return np.concatenate(pieces) if pieces else np.zeros((0,) + tuple(shape))

    def _finish_path(self, lambdas, residuals, weight, criterion, predictions, comm):
        """Errors over all ranks and the choice; kept as ``local_linear_tuning_``."""
        totals = path_errors(residuals, weight)
        if comm.size > 1:
            totals = col.allreduce(comm, totals)
        with collective_checks(comm):
            errors, chosen, n_rows = choose_lambda(lambdas, totals)
        path = LambdaPath(lambdas, errors, chosen, criterion, n_rows, predictions)
        self.local_linear_tuning_ = path
        return path

class LocalLinearMixin(_LocalLinearBase):
    """Adds :meth:`predict_local_linear` and :meth:`tune_local_linear` to a forest with forest weights
    (a regression forest)."""

    def predict_local_linear(self, X, X_train, y_train, *, ll_lambda=DEFAULT_LAMBDA, weight_penalty=False,
                             variables=None, sample_weight=None, clusters=None, comm=None):
        """Local linear predictions (grf's ``predict(forest, X, local.linear = TRUE)``).

        At each row ``x`` of ``X``: the intercept of the ridge regression of the training
        outcomes on ``X_train - x`` (the ``variables`` columns) weighted by the forest
        weights ``alpha_i(x)`` (:mod:`forest.analysis.local_linear`).

        Parameters
        ----------
        X : array-like, shape (n, n_features)
            Query rows (this rank's; under ``mpirun`` every rank passes its own).
        X_train : array-like, shape (n_local, n_features)
            This rank's training rows exactly as passed to ``fit`` (checked).
        y_train : array-like, shape (n_local,) or (n_local, n_outputs)
            Their outcomes.
        ll_lambda : float or None, default 0.1
            Ridge penalty, ``>= 0`` (grf's ``ll.lambda``). ``None`` chooses it out of bag
            over grf's grid as grf does (:meth:`tune_local_linear`; the choice is kept in
            ``local_linear_tuning_.ll_lambda``).
        weight_penalty : bool, default False
            grf's ``ll.weight.penalty``: scale each coefficient's penalty by its weighted
            second moment.
        variables : sequence of int or str, optional
            The correction variables (grf's ``linear.correction.variables``): column
            indices or names; default every non-categorical column.
        sample_weight, clusters : array-like, optional
            The fit's, when it had them (as :meth:`get_forest_weights`).
        comm : native.comm.Communicator, optional

        Returns
        -------
        ndarray, shape (n,) or (n, n_outputs)
            NaN where the weighted ridge problem is singular.
        """
        comm = world() if comm is None else comm
        with collective_checks(comm):
            ll_lambda = check_ll_lambda(ll_lambda)
            Xq, Xt, y, columns = self._regression_inputs(X, X_train, y_train, variables, sample_weight)
        layout = _TrainingLayout(self, self._source_from(Xt, sample_weight, clusters, comm))
        if ll_lambda is None:
            ll_lambda = self._tune_regression(layout, Xt[:, columns], y, None, weight_penalty, sample_weight,
                                              comm).ll_lambda
        weights = self._weights_from(layout, Xq, comm)
        queries = col.allgatherv(comm, np.ascontiguousarray(Xq[:, columns], dtype=np.float64))
        M, b = _allreduce_sums(comm, *local_linear_sums(weights, Xt[:, columns], y, queries))
        first, _ = col.global_row_offset(comm, len(Xq))
        own = slice(first, first + len(Xq))
        out = local_linear_solve(M[own], b[own], ll_lambda, bool(weight_penalty))
        return out[:, 0] if self.n_outputs_ == 1 else out

    def tune_local_linear(self, X_train, y_train, *, lambdas=None, weight_penalty=False, variables=None,
                          sample_weight=None, clusters=None, comm=None):
        """Choose ``ll_lambda`` out of bag (grf's ``tune_ll_regression_forest``).

        Every training row's local linear prediction from the trees that left it out,
        at each lambda of the grid; the error of a lambda is the mean squared
        out-of-bag error over the training rows (weighted by ``sample_weight`` when
        given; summed over outputs), and the choice is the first lambda of least error
        (:mod:`forest.analysis.local_linear`). Collective under ``mpirun``: every rank
        passes its own training rows and gets the same choice.

        Parameters
        ----------
        X_train, y_train, weight_penalty, variables, sample_weight, clusters, comm
            As :meth:`predict_local_linear`.
        lambdas : sequence of float, optional
            The grid; default grf's ``(0, 0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 1, 10)``.

        Returns
        -------
        forest.analysis.local_linear.LambdaPath
            Also kept as ``local_linear_tuning_`` (not in model files).
        """
        comm = world() if comm is None else comm
        with collective_checks(comm):
            grid = check_lambda_path(lambdas)
            _, Xt, y, columns = self._regression_inputs(None, X_train, y_train, variables, sample_weight)
        layout = _TrainingLayout(self, self._source_from(Xt, sample_weight, clusters, comm))
        return self._tune_regression(layout, Xt[:, columns], y, grid, weight_penalty, sample_weight, comm)

    def tune_local_linear_on_fit_rows(self, X_train, y_train, *, lambdas, weight_penalty=False, sample_weight=None,
                                      comm=None):
        """:meth:`tune_local_linear` on the rows of this process's own fit, as that fit laid them out.

        For a forest fitted inside a larger fit and never saved, such as the causal forest's
        nuisance forests when tuning chooses their centring (:mod:`forest.estimators.tuning`):
        they keep their fit's codes, weights and clusters (``_weights_source_``) but no
        training-data fingerprint, so ``X_train`` (the fit's own rows, each rank its block, with
        the fit's ``sample_weight``) is not checked against one. Every feature is a correction
        variable. Collective.

        Returns
        -------
        forest.analysis.local_linear.LambdaPath
            Its ``oob_predictions``: ``(n, len(lambdas))``, or ``(n, len(lambdas), k)`` for
            ``k`` outputs.
        """
        comm = world() if comm is None else comm
        source = getattr(self, "_weights_source_", None)
        with collective_checks(comm):
            if source is None:
                raise ValueError("this forest keeps no rows of its fit (a loaded model, or the fit's state was "
                                 "dropped); use tune_local_linear with the training rows")
            _, Xt, y, columns = self._regression_inputs(None, X_train, y_train, None, sample_weight)
        return self._tune_regression(_TrainingLayout(self, source), Xt[:, columns], y, lambdas, weight_penalty,
                                     sample_weight, comm)

    def _regression_inputs(self, X, X_train, y_train, variables, sample_weight):
        """Validated ``(Xq or None, X_train, y (n, k), correction columns)`` (inside collective checks)."""
        check_is_fitted(self, "estimators_")
        if getattr(self, "_target_kind", None) != "regressor":
            raise ValueError(f"local linear correction is for regression forests, not a {type(self).__name__}")
        columns = self._correction_columns(variables)
        Xq = None if X is None else validate_features(self, X, reset=False, min_samples=0)
        Xt = validate_features(self, X_train, reset=False, min_samples=0)
        check_weight(sample_weight, len(Xt))
        y = as_columns(check_target(y_train, "y_train", len(Xt), estimator=self))
        if y.shape[1] != self.n_outputs_:
            raise ValueError(f"y_train has {y.shape[1]} output(s), the forest {self.n_outputs_}")
        for name, rows in (("X", Xq), ("X_train", Xt)):
            if rows is not None and np.isnan(rows[:, columns]).any():
                raise ValueError(f"{name} has missing values in the correction variables; local linear "
                                 f"correction needs complete values there (choose variables=)")
        return Xq, Xt, y, columns

    def _tune_regression(self, layout, Z, y, grid, weight_penalty, sample_weight, comm):
        grid = check_lambda_path(grid)
        pred = self._oob_path(layout, Z, lambda W, q: local_linear_sums(W, Z, y, q),
                              lambda M, b: ridge_coefficient(M, b, grid, bool(weight_penalty), (0,), 0),
                              (len(grid), y.shape[1]), comm)
        weight = check_weight(sample_weight, len(y))
        predictions = pred[:, :, 0] if self.n_outputs_ == 1 else pred
        return self._finish_path(grid, y[:, None, :] - pred, weight, "out-of-bag squared error", predictions, comm)


class CausalLocalLinearMixin(_LocalLinearBase):
    """Adds :meth:`predict_local_linear` and :meth:`tune_local_linear` to :class:`forest.CausalForest`."""

    def predict_local_linear(self, X, X_train, t_train, y_train, *, linear_correction_variables=None,
                             ll_lambda=DEFAULT_LAMBDA, weight_penalty=False, sample_weight=None, clusters=None,
                             comm=None):
        """Local linear effects (grf's ``predict(causal_forest, X, linear.correction.variables = ...)``).

        At each row ``x`` of ``X``: the ridge regression, weighted by the forest weights
        ``alpha_i(x)``, of the training rows' centred outcome ``Y - m(X_i)`` on
        ``[1, X_i - x, W~_i, W~_i (X_i - x)]`` with ``W~ = W - e(X_i)`` (the correction
        variables' columns of ``X``); the effect is the coefficient of ``W~``. Every
        coefficient but the intercept and ``W~``'s carries the penalty. The centring is
        the forest's own: the out-of-bag ``m`` and ``e`` of its training rows (kept by the
        fitting process, else recomputed from the nuisance forests).

        Parameters
        ----------
        X : array-like, shape (n, n_features)
            Query rows (this rank's; under ``mpirun`` every rank passes its own).
        X_train, t_train, y_train : array-like
            This rank's training rows, treatment and outcome exactly as passed to ``fit``
            (checked against the fit's fingerprint).
        linear_correction_variables : sequence of int or str, optional
            Column indices or names; default every non-categorical column.
        ll_lambda : float or None, default 0.1
            Ridge penalty ``>= 0`` (grf's ``ll.lambda``); ``None`` chooses it out of bag
            by grf's R-loss over grf's grid (:meth:`tune_local_linear`; kept in
            ``local_linear_tuning_``).
        weight_penalty : bool, default False
            grf's ``ll.weight.penalty`` (each coefficient penalised by its weighted
            second moment).
        sample_weight : array-like, shape (n_local,), optional
            The fit's sample weights, when it had them: row ``i`` then weighs
            ``alpha_i(x) w_i``, as in the forest's own estimate (grf refuses weights here).
        clusters : array-like, optional
            The fit's cluster labels, when it had clusters.
        comm : native.comm.Communicator, optional

        Returns
        -------
        ndarray
            The shape of :meth:`predict` (``(n,)``, or ``(n, M)`` for a 2-D outcome); NaN
            where the weighted ridge problem is singular.
        """
        comm = world() if comm is None else comm
        with collective_checks(comm):
            ll_lambda = check_ll_lambda(ll_lambda)
            columns = self._causal_ll_checks(linear_correction_variables)
            Xq = validate_features(self, X, reset=False, min_samples=0)
            if np.isnan(Xq[:, columns]).any():
                raise ValueError("X has missing values in the correction variables; local linear correction needs "
                                 "complete values there (choose linear_correction_variables=)")
        layout, Z, wc, yc, weight = self._causal_training(X_train, t_train, y_train, columns, sample_weight, clusters,
                                                          comm)
        if ll_lambda is None:
            ll_lambda = self._tune_causal(layout, Z, wc, yc, weight, None, weight_penalty, comm).ll_lambda
        weights = self._weights_from(layout, Xq, comm)
        queries = col.allgatherv(comm, np.ascontiguousarray(Xq[:, columns], dtype=np.float64))
        M, b = _allreduce_sums(comm, *local_linear_causal_sums(weights, Z, wc, yc, queries))
        first, _ = col.global_row_offset(comm, len(Xq))
        own = slice(first, first + len(Xq))
        tau = local_linear_causal_solve(M[own], b[own], ll_lambda, bool(weight_penalty))
        return self._shape(tau[:, None, :])

    def tune_local_linear(self, X_train, t_train, y_train, *, lambdas=None, linear_correction_variables=None,
                          weight_penalty=False, sample_weight=None, clusters=None, comm=None):
        """Choose ``ll_lambda`` out of bag (grf's ``tune_ll_causal_forest``).

        Every training row's local linear effect from the trees that left it out, at
        each lambda of the grid; the error of a lambda is grf's R-loss, the mean of
        ``(Y~ - W~ tau)^2`` over the training rows (weighted by ``sample_weight`` when
        given; summed over outcomes), and the choice is the first lambda of least error.
        Collective under ``mpirun`` (every rank gets the same choice).

        Parameters
        ----------
        X_train, t_train, y_train, linear_correction_variables, weight_penalty, sample_weight, clusters, comm
            As :meth:`predict_local_linear`.
        lambdas : sequence of float, optional
            The grid; default grf's ``(0, 0.001, 0.01, 0.05, 0.1, 0.3, 0.5, 0.7, 1, 10)``.

        Returns
        -------
        forest.analysis.local_linear.LambdaPath
            Also kept as ``local_linear_tuning_`` (not in model files).
        """
        comm = world() if comm is None else comm
        with collective_checks(comm):
            grid = check_lambda_path(lambdas)
            columns = self._causal_ll_checks(linear_correction_variables)
        layout, Z, wc, yc, weight = self._causal_training(X_train, t_train, y_train, columns, sample_weight, clusters,
                                                          comm)
        return self._tune_causal(layout, Z, wc, yc, weight, grid, weight_penalty, comm)

    def _causal_ll_checks(self, variables):
        """Fitted, a treatment with one column; the correction columns (inside collective checks)."""
        check_is_fitted(self, "estimators_")
        if self.n_treatments_ != 1 or self.treatment_type_ not in ("binary", "continuous"):
            what = (f"a categorical treatment with {self.n_treatments_ + 1} levels"
                    if self.treatment_type_ == "categorical" else
                    f"a {self.treatment_type_} treatment with {self.n_treatments_} columns")
            raise ValueError(f"local linear correction needs a binary or scalar continuous treatment (grf's causal "
                             f"forest), this forest has {what}")
        return self._correction_columns(variables, "linear_correction_variables")

    def _causal_training(self, X_train, t_train, y_train, columns, sample_weight, clusters, comm):
        """``(layout, Z, W~ (n,), Y~ (n, M), row weights)`` of this rank's training rows (collective)."""
        with collective_checks(comm):
            Xt = validate_features(self, X_train, reset=False, min_samples=0)
            n = len(Xt)
            W, _ = self._code_heldout_treatment(t_train, n)
            Y = check_target(y_train, "y_train", n, estimator=self)
            if Y.ndim != self.y_ndim_ or (Y.ndim == 2 and Y.shape[1] != self.n_outcomes_):
                raise ValueError(f"y_train must have the training outcome's shape, got {Y.shape}")
            weight = check_weight(sample_weight, n)
            if np.isnan(Xt[:, columns]).any():
                raise ValueError("X_train has missing values in the correction variables; local linear correction "
                                 "needs complete values there (choose linear_correction_variables=)")
        Y = as_columns(Y)
        match, codes, gids = self._match_codes(Xt, [W, Y], comm)
        fitted = bool(self.sampling_.get("clusters", False))
        rows = getattr(self, "_oob_rows_", None)
        kept = rows is not None and len(rows.gids) == n and np.array_equal(rows.gids, gids)
        with collective_checks(comm):
            if match.kind != "training":
                raise ValueError("X_train, t_train, y_train are not this model's training data as fitted (the same "
                                 "rows in the same order, each rank its own block): local linear correction needs "
                                 "the training rows' forest weights and out-of-bag centring")
            if fitted and clusters is None:
                raise ValueError("this forest was fitted with clusters: pass the fit's cluster labels (clusters=)")
            if not kept and (getattr(self, "outcome_forest_", None) is None
                             or getattr(self, "treatment_forest_", None) is None):
                raise ValueError("the out-of-bag centring of the training rows exists only in the process that ran "
                                 "fit when y_hat / t_hat were given (no nuisance forests); refit, or call this in "
                                 "the fitting process")
        layout = resolve_clusters(clusters, comm, n, self.equalize_cluster_weights, None, fitted=fitted)
        if kept:
            y_hat, t_hat = rows.y_hat, rows.t_hat
        else:
            y_hat = self.outcome_forest_.oob_prediction_binned(codes, gids, layout).reshape(n, -1)
            t_hat = self.treatment_forest_.oob_prediction_binned(codes, gids, layout).reshape(n, -1)
        wc = np.ascontiguousarray((W - t_hat)[:, 0], dtype=np.float64)
        yc = np.ascontiguousarray(Y - y_hat, dtype=np.float64)
        source = WeightsSource(codes, gids, np.ascontiguousarray(weight, dtype=np.float64), layout)
        Z = np.ascontiguousarray(Xt[:, columns], dtype=np.float64)
        return _TrainingLayout(self, source), Z, wc, yc, weight

    def _tune_causal(self, layout, Z, wc, yc, weight, grid, weight_penalty, comm):
        grid = check_lambda_path(grid)
        tau = self._oob_path(layout, Z, lambda W, q: local_linear_causal_sums(W, Z, wc, yc, q),
                             lambda M, b: local_linear_causal_solve(M, b, grid, bool(weight_penalty)),
                             (len(grid), yc.shape[1]), comm)
        predictions = tau[:, :, 0] if self.y_ndim_ == 1 else tau
        return self._finish_path(grid, yc[:, None, :] - wc[:, None, None] * tau, weight, "R-loss", predictions, comm)

"""``predict_local_linear``: grf's local linear correction on the regression forests (issue 38).

The statistics live in :mod:`forest.analysis.local_linear`; this mixin gathers what they
need: the forest weights of the query rows over this rank's training rows
(:meth:`get_forest_weights`, with the training rows passed again and checked against the
model's fingerprint), the correction variables of both, and one allreduce of the per-query
sums. Training rows are never part of a model, so ``X_train`` and ``y_train`` are
arguments (the forest weights and out-of-bag state have the same rule).

Not built: grf's ``ll_regression_forest`` *splitting* (``enable.ll.split``: trees split on
ridge residuals); the correction applies to forests grown by the usual variance rule,
which is grf's ``regression_forest`` + ``predict(..., local.linear = TRUE)`` path.
"""
import numpy as np

from native import collectives as col
from native.comm import world

from forest._validation import as_columns, check_target, validate_features
from forest.analysis.local_linear import DEFAULT_LAMBDA, local_linear_solve, local_linear_sums
from forest.collective_checks import collective_checks
from forest.estimators.base import check_is_fitted
from forest.io.feature_table import named_columns


class LocalLinearMixin:
    """Adds :meth:`predict_local_linear` to a forest with forest weights (a regression forest)."""

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
        ll_lambda : float, default 0.1
            Ridge penalty, ``>= 0`` (grf's ``ll.lambda``; grf tunes it when not given,
            here it is the caller's choice).
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
            check_is_fitted(self, "estimators_")
            if getattr(self, "_target_kind", None) != "regressor":
                raise ValueError(f"local linear correction is for regression forests, not a {type(self).__name__}")
            if isinstance(ll_lambda, bool) or not isinstance(ll_lambda, (int, float, np.integer, np.floating)) \
                    or not np.isfinite(ll_lambda) or ll_lambda < 0:
                raise ValueError(f"ll_lambda must be a finite number >= 0, got {ll_lambda!r}")
            columns = self._correction_columns(variables)
            Xq = validate_features(self, X, reset=False, min_samples=0)
            Xt = validate_features(self, X_train, reset=False, min_samples=0)
            y = as_columns(check_target(y_train, "y_train", len(Xt), estimator=self))
            if y.shape[1] != self.n_outputs_:
                raise ValueError(f"y_train has {y.shape[1]} output(s), the forest {self.n_outputs_}")
            for name, rows in (("X", Xq), ("X_train", Xt)):
                if np.isnan(rows[:, columns]).any():
                    raise ValueError(f"{name} has missing values in the correction variables; local linear "
                                     f"correction needs complete values there (choose variables=)")
        weights = self.get_forest_weights(Xq, X_train=Xt, sample_weight=sample_weight, clusters=clusters, comm=comm)
        queries = col.allgatherv(comm, np.ascontiguousarray(Xq[:, columns], dtype=np.float64))
        M, b = local_linear_sums(weights, Xt[:, columns], y, queries)
        if comm.size > 1:
            shape_m, shape_b = M.shape, b.shape
            total = col.allreduce(comm, np.concatenate([M.ravel(), b.ravel()]))
            M = total[:M.size].reshape(shape_m)
            b = total[M.size:].reshape(shape_b)
        first, _ = col.global_row_offset(comm, len(Xq))
        own = slice(first, first + len(Xq))
        out = local_linear_solve(M[own], b[own], float(ll_lambda), bool(weight_penalty))
        return out[:, 0] if self.n_outputs_ == 1 else out

    def _correction_columns(self, variables):
        """Column indices of the correction variables (default: the non-categorical ones)."""
        n = self.n_features_in_
        categorical = np.asarray(getattr(self, "is_categorical_", np.zeros(n, bool)), dtype=bool)
        if variables is None:
            cols = np.flatnonzero(~categorical)
            if not len(cols):
                raise ValueError("every feature is categorical: local linear correction needs numeric variables")
            return cols
        names = getattr(self, "feature_names_in_", None)
        selected = named_columns(list(variables), None if names is None else list(names), n, "variables")
        cols = np.flatnonzero(selected)
        if not len(cols) or categorical[cols].any():
            raise ValueError("variables must name at least one feature, and no categorical one")
        return cols

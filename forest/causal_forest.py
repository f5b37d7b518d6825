"""CausalForest: GRF's causal forest grown from per-bin moment histograms.

This module owns the public causal-forest estimator: treatment handling (binary,
multi-arm categorical, continuous scalar or vector), local centering with
out-of-bag :class:`forest.RegressionForest` nuisance estimates, honest growth with
:class:`forest.causal_criterion.CausalCriterion`, and the user-facing estimates
(CATE, BLB variances and intervals, out-of-bag CATE, AIPW average effect, feature
importances). The statistics live in :mod:`forest.inference`; the forest loop in
:mod:`forest.honest_forest`.

Leaves store only averaged moment vectors and counts, never sample lists: the model
is the packed node arrays plus the bin mapper. Out-of-bag membership is recomputed
from the global row id (:mod:`forest.subsample`).

Under ``mpirun`` each rank passes its own consecutive block of rows (ranks in order);
sampling keyed by global row id, global bin edges and bitwise-identical reduced
histograms make the forest the one a single process grows on all rows.
"""
from statistics import NormalDist

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from native import collectives as col
from native.comm import world

from .causal_criterion import CausalChannels, CausalCriterion
from .honest_forest import fit_binning, global_ids, grow_honest_forest, oob_average
from .importance import depth_weighted_importance, gain_importance
from .inference import (aipw_scores, average_effect, average_effect_sums, blb_predict, local_treatment_cov,
                        oob_effects, solve_theta)
from .predictor import predict_values, predict_values_binned
from .profiling import phase
from ._validation import as_columns
from .regression_forest import (RegressionForest, features_or_codes, check_forest_params, check_weight, check_X,
                                resolve_mtry)

TREATMENT_TYPES = ("auto", "binary", "categorical", "continuous")


def _global_unique(comm, values, limit=64):
    """Sorted distinct values over all ranks, or None if there are more than ``limit``."""
    local = np.unique(values)
    local = local if len(local) <= limit else local[: limit + 1]
    if comm.size == 1:
        merged = local
    else:
        merged = np.unique(np.concatenate([np.asarray(v) for v in col.allgather_object(comm, local)]))
    return merged if len(merged) <= limit else None


class CausalForest(BaseEstimator):
    """Generalized random forest for heterogeneous treatment effects, on histograms.

    Parameters
    ----------
    n_estimators : int, default 200
    max_samples : float, default 0.5
        Sample fraction per tree (``<= 0.5`` when ``ci_group_size > 1``).
    honest : bool, default True
    honesty_fraction : float, default 0.5
    min_samples_leaf : int, default 5
        Fewest rows per child and per treatment arm (or sign of the centered
        treatment, for continuous treatments) in each child: GRF's ``min.node.size``
        rule, so at the same value the leaves hold about twice the rows of EconML's
        (which counts all rows). Smaller leaves mean less smoothing bias and wider
        intervals at about the same RMSE: on the Wager-Athey design (n = 4000,
        d = 10, 2000 trees) 95% intervals covered 0.84 of test points at 5, 0.90
        at 2 and 0.94 at 1 (``benchmarks/RESULTS.md``, coverage audit). Use 1 or 2
        when the intervals matter more than the point estimate.
    max_depth : int or None, default None
    max_features : None, int, float, "sqrt" or "log2", default None
        ``mtry``; ``None`` is GRF's ``min(ceil(sqrt(d) + 20), d)``.
    alpha : float, default 0.05
        Each child keeps at least this share of the parent's treatment spread.
    imbalance_penalty : float, default 0.0
    ci_group_size : int, default 2
        Trees per little bag; ``>= 2`` enables ``predict_var``/``predict_interval``.
    max_bins : int, default 255
    treatment_type : {"auto", "binary", "categorical", "continuous"}, default "auto"
        ``auto``: 1-D values in {0, 1} are binary; 1-D integer (or bool) values with
        more than two levels are categorical (the smallest level is the control);
        anything else is continuous.
    nuisance_estimators : int or None, default None
        Trees of each centering forest; ``None`` is ``max(50, n_estimators // 4)``.
    batch_size : int or None, default None
    random_state : int or None, default None (means 0)

    Attributes
    ----------
    estimators_ : dict
        Packed forest; node values are averaged moments plus the estimation count.
    bin_mapper_ : histogram.binning.BinMapper
    treatment_type_ : str
    classes_ : ndarray or None
        Treatment levels (categorical and binary), control first.
    n_treatments_, n_outcomes_ : int
        ``K`` and ``M``.
    ate_, ate_stderr_ : ndarray
        AIPW average effect and standard error (shape of one row of ``predict``).
    feature_importances_ : ndarray, shape (n_features,)
        GRF's depth-weighted split frequency.
    gain_importances_ : ndarray, shape (n_features,)
    """

    def __init__(self, n_estimators=200, *, max_samples=0.5, honest=True, honesty_fraction=0.5, min_samples_leaf=5,
                 max_depth=None, max_features=None, alpha=0.05, imbalance_penalty=0.0, ci_group_size=2, max_bins=255,
                 treatment_type="auto", nuisance_estimators=None, batch_size=None, random_state=None):
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
        self.treatment_type = treatment_type
        self.nuisance_estimators = nuisance_estimators
        self.batch_size = batch_size
        self.random_state = random_state

    # ------------------------------------------------------------------ fit
    def _treatment_matrix(self, t, comm):
        """Resolve the treatment type; returns ``W (n, K)`` float and the constraint kind."""
        t = np.asarray(t)
        if t.ndim not in (1, 2):
            raise ValueError(f"t must have shape (n,) or (n, K), got {t.shape}")
        kind = self.treatment_type
        if kind not in TREATMENT_TYPES:
            raise ValueError(f"treatment_type must be one of {TREATMENT_TYPES}, got {kind!r}")
        if t.dtype.kind not in "biuf":
            raise ValueError(f"t must be numeric, got dtype {t.dtype}")
        if t.dtype.kind == "f" and not np.all(np.isfinite(t)):
            raise ValueError("t contains NaN or infinite values")
        levels = _global_unique(comm, t.ravel()) if t.ndim == 1 and kind != "continuous" else None
        if kind == "auto":
            if levels is not None and len(levels) <= 2 and np.all(np.isin(levels, (0, 1))):
                kind = "binary"
            elif levels is not None and len(levels) > 2 and t.dtype.kind in "biu":
                kind = "categorical"
            else:
                kind = "continuous"
        if kind in ("binary", "categorical"):
            if t.ndim != 1:
                raise ValueError(f"a {kind} treatment must be 1-D, got shape {t.shape}")
            if levels is None:
                raise ValueError(f"a {kind} treatment has too many distinct levels (> 64)")
            if kind == "binary" and not np.all(np.isin(levels, (0, 1))):
                raise ValueError(f"a binary treatment must be coded 0/1, got levels {levels[:5]}")
            if len(levels) < 2:
                raise ValueError(f"the treatment takes a single value ({levels}); no effect can be estimated")
            classes = np.array([0, 1]) if kind == "binary" else levels
            codes = np.searchsorted(classes, t)
            W = np.zeros((len(t), len(classes) - 1))
            rows = codes > 0
            W[rows, codes[rows] - 1] = 1.0
            return kind, W, classes, codes
        W = as_columns(t)
        return "continuous", W, None, None

    def fit(self, X, t, y, sample_weight=None, *, y_hat=None, t_hat=None, comm=None, progress=None, binned=None):
        """Fit on this rank's rows.

        Parameters
        ----------
        X : array-like, shape (n_local, n_features), or None
            ``None`` when ``binned`` is given.
        t : array-like, shape (n_local,) or (n_local, K)
            Treatment (see ``treatment_type``).
        y : array-like, shape (n_local,) or (n_local, M)
        sample_weight : array-like, shape (n_local,), optional
        y_hat : array-like, shape like ``y``, optional
            ``E[Y|x]`` estimates for centering (out-of-bag forest when omitted).
        t_hat : array-like, shape (n_local,) or (n_local, K), optional
            ``E[W|x]`` (propensities of arms 1..K for categorical treatments).
        comm : native.comm.Communicator, optional
            ``None`` means ``native.comm.world()``.
        progress : callable, optional
            ``progress(n_trees_done, n_trees_total)`` for the causal forest's trees.
        binned : tuple (BinMapper, ndarray), optional
            Pre-binned features: a ``BinMapper`` fitted on the rows of all ranks and
            this rank's codes, uint8 of shape ``(n_features, n_local)``
            (``mapper.transform(X)``). The forest and its nuisance forests then grow
            on the codes and need no float features (``forest-train`` bins parquet
            row groups as it reads them).

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        seed = check_forest_params(self)
        if self.nuisance_estimators is not None and self.nuisance_estimators < 1:
            raise ValueError(f"nuisance_estimators must be >= 1 or None, got {self.nuisance_estimators}")
        X, codes_given = features_or_codes(X, binned)
        n, n_features = codes_given[1].shape[::-1] if codes_given is not None else X.shape
        y = np.asarray(y, dtype=np.float64)
        if y.ndim not in (1, 2) or len(y) != n:
            raise ValueError(f"y must have shape (n,) or (n, M) with n = {n}, got {y.shape}")
        if not np.all(np.isfinite(y)):
            raise ValueError("y contains NaN or infinite values")
        if len(t) != n:
            raise ValueError(f"t has {len(t)} rows, X has {n}")
        g = check_weight(sample_weight, n)
        kind, W, classes, codes = self._treatment_matrix(t, comm)
        Y = as_columns(y)
        K, M = W.shape[1], Y.shape[1]
        gids, n_global = global_ids(comm, n)
        if n_global < 4:
            raise ValueError(f"need at least 4 rows in total, got {n_global}")
        # The criterion validates alpha and imbalance_penalty: build it before the two
        # nuisance forests so a bad value fails in milliseconds, not after their fits.
        constraint = "sign" if kind == "continuous" else "arms"
        crit = CausalCriterion(K, M, min_samples_leaf=self.min_samples_leaf, alpha=self.alpha,
                               imbalance_penalty=self.imbalance_penalty, constraint=constraint)
        mapper, binned = fit_binning(X, self.max_bins, seed, comm) if codes_given is None else codes_given

        n_nuis = self.nuisance_estimators or max(50, int(self.n_estimators) // 4)
        nuisance = dict(max_samples=0.5, honest=True, min_samples_leaf=self.min_samples_leaf, max_bins=self.max_bins,
                        max_features=self.max_features, batch_size=self.batch_size)
        if y_hat is None:
            m = RegressionForest(n_nuis, random_state=seed + 7919, **nuisance).fit(X, Y, g, comm=comm,
                                                                                    binned=(mapper, binned))
            y_hat = m.oob_prediction_
        if t_hat is None:
            e = RegressionForest(n_nuis, random_state=seed + 104729, **nuisance).fit(X, W, g, comm=comm,
                                                                                     binned=(mapper, binned))
            t_hat = e.oob_prediction_
        y_hat = np.asarray(y_hat, dtype=np.float64)
        t_hat = np.asarray(t_hat, dtype=np.float64)
        if y_hat.size != n * M or t_hat.size != n * K or len(y_hat) != n or len(t_hat) != n:
            raise ValueError(f"y_hat must have shape ({n}, {M}) and t_hat ({n}, {K}) (or 1-D), got "
                             f"{y_hat.shape}, {t_hat.shape}")
        y_hat, t_hat = y_hat.reshape(n, M), t_hat.reshape(n, K)
        if not (np.all(np.isfinite(y_hat)) and np.all(np.isfinite(t_hat))):
            raise ValueError("y_hat / t_hat contain NaN or infinite values")
        wc = W - t_hat
        yc = Y - y_hat
        indicator = (wc > 0).astype(np.float64) if constraint == "sign" else W
        with phase("other"):
            channels = crit.make_channels(wc, yc, g, indicator)
        layout = crit.layout
        packed, acc, cnt = grow_honest_forest(
            binned, mapper, gids, channels, crit, n_estimators=int(self.n_estimators), seed=seed,
            sample_fraction=float(self.max_samples), ci_group_size=int(self.ci_group_size), honest=bool(self.honest),
            honesty_fraction=float(self.honesty_fraction), max_depth=self.max_depth,
            min_samples_split=2 * self.min_samples_leaf, mtry=resolve_mtry(self.max_features, n_features),
            batch_size=self.batch_size, n_global=n_global, value_fn=crit.node_value, count_col=layout.n_moments,
            comm=comm, oob=True, progress=progress)
        self.estimators_ = packed
        self.bin_mapper_ = mapper
        self.treatment_type_ = kind
        self.classes_ = classes
        self.n_treatments_, self.n_outcomes_ = K, M
        self.n_features_in_ = n_features
        self.y_ndim_ = y.ndim
        self.sampling_ = dict(seed=seed, sample_fraction=float(self.max_samples),
                              ci_group_size=int(self.ci_group_size), honest=bool(self.honest),
                              honesty_fraction=float(self.honesty_fraction))

        # Out-of-bag CATE on this rank's rows, then the AIPW average effect (global sums).
        with phase("prediction"):
            with np.errstate(invalid="ignore", divide="ignore"):
                mbar = acc / cnt[:, None]
            if (cnt == 0).any():
                mbar[cnt == 0] = self._mean_moments_binned(binned, cnt == 0)
            tau_oob = oob_effects(mbar, layout, lambda rows: self._mean_moments_binned(binned, rows))
            cov = local_treatment_cov(mbar, layout) if kind == "continuous" else None
            t_arg = codes if kind == "categorical" else (W[:, 0] if kind == "binary" else W)
            scores = aipw_scores(kind, tau_oob, t_arg, Y, y_hat, t_hat, cov)
            sums = average_effect_sums(scores, g)
        if comm.size > 1:
            sums = col.allreduce(comm, np.ascontiguousarray(sums)).reshape(sums.shape)
        est, se = average_effect(sums)
        self.ate_ = self._shape_one(est)
        self.ate_stderr_ = self._shape_one(se)
        self.feature_importances_ = depth_weighted_importance(packed, n_features)
        self.gain_importances_ = gain_importance(packed, n_features)
        return self

    # ------------------------------------------------------------------ shapes
    def _layout(self):
        return CausalChannels(self.n_treatments_, self.n_outcomes_)

    def _shape(self, theta):
        """(n, K, M) -> (n,) / (n, K) for a 1-D outcome, (n, M) / (n, K, M) for a 2-D one."""
        K = self.n_treatments_
        if self.y_ndim_ == 1:
            return theta[:, 0, 0] if K == 1 else theta[:, :, 0]
        return theta[:, 0, :] if K == 1 else theta

    def _shape_one(self, v):
        return self._shape(np.asarray(v)[None])[0]

    def _mean_moments_binned(self, codes, rows):
        """Mean leaf moments over all trees for training rows ``rows`` (bool mask) given as codes."""
        n_trees = len(self.estimators_["tree_offsets"]) - 1
        idx = np.flatnonzero(rows).astype(np.int64)
        return predict_values_binned(self.estimators_, codes, self.bin_mapper_.missing_bin_, rows=idx) / n_trees

    def _mean_moments(self, X):
        n_trees = len(self.estimators_["tree_offsets"]) - 1
        return predict_values(self.estimators_, X) / n_trees

    # ------------------------------------------------------------------ predictions
    def predict(self, X):
        """Conditional average treatment effect.

        Parameters
        ----------
        X : array-like, shape (n, n_features)

        Returns
        -------
        ndarray
            ``(n,)`` for one treatment column (binary, two-level categorical, scalar
            continuous) and a 1-D outcome; ``(n, K)`` for ``K > 1`` arms or treatment
            components; ``(n, M)`` / ``(n, K, M)`` for a 2-D outcome. NaN where the local treatment covariance is singular.
        """
        check_is_fitted(self, "estimators_")
        X = check_X(X, self.n_features_in_)
        theta, _ = solve_theta(self._mean_moments(X), self._layout())
        return self._shape(theta)

    def predict_var(self, X, chunk_rows=None):
        """Bootstrap-of-little-bags variance of each effect component (shape of ``predict``)."""
        return self._theta_var(X, chunk_rows)[1]

    def _theta_var(self, X, chunk_rows=None):
        check_is_fitted(self, "estimators_")
        if self.ci_group_size < 2:
            raise ValueError("variance estimates need ci_group_size >= 2 at fit time")
        X = check_X(X, self.n_features_in_)
        with phase("prediction"):
            th, var = blb_predict(self.estimators_, X, self._layout(), self.ci_group_size, chunk_rows)
        return self._shape(th), self._shape(var)

    def predict_interval(self, X, alpha=0.05):
        """Normal ``1 - alpha`` confidence intervals from the BLB variance.

        Returns
        -------
        lower, upper : ndarray
            Shape of ``predict``.
        """
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        theta, var = self._theta_var(X)
        z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
        half = z * np.sqrt(var)
        return theta - half, theta + half

    def oob_predict(self, X, comm=None):
        """Out-of-bag CATE for the training rows of this rank (same rows and order as in ``fit``).

        Parameters
        ----------
        X : array-like, shape (n_local, n_features)
        comm : native.comm.Communicator, optional
            The communicator used in ``fit``.

        Returns
        -------
        ndarray
            Shape of ``predict``.
        """
        check_is_fitted(self, "estimators_")
        comm = world() if comm is None else comm
        X = check_X(X, self.n_features_in_)
        gids, _ = global_ids(comm, len(X))
        mbar, cnt = oob_average(self.estimators_, X, gids, self.sampling_)
        if (cnt == 0).any():
            mbar[cnt == 0] = self._mean_moments(X[cnt == 0])
        theta, _ = solve_theta(mbar, self._layout())
        return self._shape(theta)

    def average_treatment_effect(self):
        """AIPW average treatment effect over the training rows and its standard error.

        Returns
        -------
        estimate, stderr : float or ndarray
            Shape of one row of ``predict``.
        """
        check_is_fitted(self, "ate_")
        return self.ate_, self.ate_stderr_

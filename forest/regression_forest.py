"""RegressionForest: an honest, subsampled (GRF-style) random forest on histograms.

This module owns the public regression forest. It is also the nuisance model of the
causal forest (``E[Y|x]`` and ``E[W|x]`` for local centering), which needs its
out-of-bag predictions on the training rows; these are computed during ``fit``
without storing sample lists (:mod:`forest.honest_forest`).

Each tree is grown by weighted variance reduction on the structure half of its
subsample and its nodes are re-estimated (weighted means) on the estimation half.
The forest prediction is the average of the trees' leaf means, i.e. GRF's forest
weights ``alpha_i(x) = (1/B) sum_b 1[i in leaf_b(x)] / |leaf_b(x)|``.
"""
import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.utils.validation import check_is_fitted

from native import collectives as col
from native.comm import world

from ._validation import as_columns, check_binned, check_param_types
from .criteria import VarianceCriterion
from .honest_forest import (fit_binning, global_ids, grow_honest_forest,
                            oob_average)
from .importance import depth_weighted_importance, gain_importance
from .predictor import predict_values, predict_values_binned


def default_mtry(n_features):
    """GRF's default number of features tried per split, ``min(ceil(sqrt(d) + 20), d)``."""
    return int(min(np.ceil(np.sqrt(n_features) + 20), n_features))


def resolve_mtry(max_features, n_features):
    """Number of features tried per node from ``max_features``.

    ``None`` -> GRF's default; int -> itself (capped at ``n_features``); float in
    (0, 1] -> that fraction; ``"sqrt"`` / ``"log2"``.
    """
    if max_features is None:
        return default_mtry(n_features)
    if isinstance(max_features, str):
        if max_features == "sqrt":
            return max(1, int(np.sqrt(n_features)))
        if max_features == "log2":
            return max(1, int(np.log2(n_features)))
        raise ValueError(f"max_features must be None, int, float, 'sqrt' or 'log2', got {max_features!r}")
    if isinstance(max_features, (int, np.integer)) and not isinstance(max_features, bool):
        if max_features < 1:
            raise ValueError(f"max_features must be >= 1, got {max_features}")
        return int(min(max_features, n_features))
    if isinstance(max_features, float) and 0.0 < max_features <= 1.0:
        return max(1, int(round(max_features * n_features)))
    raise ValueError(f"max_features must be None, int >= 1, float in (0, 1], 'sqrt' or 'log2', got {max_features!r}")


def _normalise_weights(g, n_global, comm):
    """Rescale sample weights to mean 1 over all ranks' rows.

    The growers compare ``min_samples_split`` with a node's summed weight, so weights
    on an arbitrary scale (e.g. summing to 1) would stop every tree at its root. Node
    values and split choices are invariant to a common factor, so rescaling makes the
    forest independent of the weights' scale and keeps "weighted rows" comparable to
    rows.

    Parameters
    ----------
    g : ndarray of float64, shape (n_local,)
    n_global : int
    comm : native.comm.Communicator

    Returns
    -------
    ndarray of float64, shape (n_local,)
    """
    total = float(g.sum())
    if comm.size > 1:
        total = float(col.allreduce(comm, np.array([total]))[0])
    if not total > 0:
        raise ValueError("sample_weight sums to zero over all rows")
    return g * (n_global / total)


def check_forest_params(est):
    """Validate the sampling/growth parameters shared by both forests.

    Raises
    ------
    TypeError
        A parameter of the wrong type (:func:`forest._validation.check_param_types`).
    ValueError
        A parameter out of range.
    """
    check_param_types(est, ints=("n_estimators", "min_samples_leaf", "max_bins", "ci_group_size"),
                      optional_ints=("max_depth", "batch_size", "random_state"),
                      reals=("max_samples", "honesty_fraction"), bools=("honest",))
    resolve_mtry(est.max_features, 1)  # every accepted form of max_features, whatever the data
    if not isinstance(est.n_estimators, (int, np.integer)) or est.n_estimators < 1:
        raise ValueError(f"n_estimators must be a positive int, got {est.n_estimators!r}")
    if not 0.0 < est.max_samples <= 1.0:
        raise ValueError(f"max_samples (the sample fraction) must be in (0, 1], got {est.max_samples}")
    if not 0.0 < est.honesty_fraction < 1.0:
        raise ValueError(f"honesty_fraction must be in (0, 1), got {est.honesty_fraction}")
    if est.min_samples_leaf < 1:
        raise ValueError(f"min_samples_leaf must be >= 1, got {est.min_samples_leaf}")
    if est.max_depth is not None and est.max_depth < 0:
        raise ValueError(f"max_depth must be >= 0 or None, got {est.max_depth}")
    if not 2 <= est.max_bins <= 255:
        raise ValueError(f"max_bins must be in [2, 255], got {est.max_bins}")
    if est.batch_size is not None and est.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {est.batch_size}")
    # Little bags of ci_group_size trees share a half-sample, so each tree's subsample
    # must fit inside half of the data.
    if est.ci_group_size < 1 or (est.ci_group_size > 1 and est.max_samples > 0.5):
        raise ValueError(f"ci_group_size must be >= 1, and max_samples <= 0.5 when it is > 1; got "
                         f"{est.ci_group_size}, {est.max_samples}")
    seed = 0 if est.random_state is None else est.random_state
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"random_state must be a non-negative int or None, got {est.random_state!r}")
    return int(seed)


def check_X(X, n_features=None):
    """Float64 2-D features (NaN allowed: it goes to the missing bin)."""
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features), got shape {X.shape}")
    if n_features is not None and X.shape[1] != n_features:
        raise ValueError(f"X has {X.shape[1]} features, the forest was fitted with {n_features}")
    if np.isinf(X).any():
        raise ValueError("X contains infinite values")
    return X


def features_or_codes(X, binned):
    """``(X or None, (mapper, codes) or None)`` from ``fit``'s X and ``binned`` arguments."""
    if binned is None:
        if X is None:
            raise ValueError("X is None and no binned input was given")
        return check_X(X), None
    X = None if X is None else check_X(X)
    return X, check_binned(binned, X)


def n_estimators_fitted(packed):
    """Number of trees in a packed forest."""
    return len(packed["tree_offsets"]) - 1


def check_weight(sample_weight, n):
    if sample_weight is None:
        return np.ones(n)
    g = np.asarray(sample_weight, dtype=np.float64)
    if g.shape != (n,):
        raise ValueError(f"sample_weight must have shape ({n},), got {g.shape}")
    if not np.all(np.isfinite(g)) or (g < 0).any():
        raise ValueError("sample_weight must be finite and non-negative")
    return g


class RegressionForest(RegressorMixin, BaseEstimator):
    """Honest random forest regression on binned histograms (GRF's ``regression_forest``).

    Parameters
    ----------
    n_estimators : int, default 200
    max_samples : float, default 0.5
        Fraction of the rows each tree is drawn from (without replacement).
    honest : bool, default True
        Grow on one part of each tree's subsample, estimate leaves on the other.
    honesty_fraction : float, default 0.5
        Share of the subsample used for growing.
    min_samples_leaf : int, default 5
    max_depth : int or None, default None
    max_features : None, int, float, "sqrt" or "log2", default None
        Features tried per node; ``None`` is GRF's ``min(ceil(sqrt(d) + 20), d)``.
    max_bins : int, default 255
    ci_group_size : int, default 1
        Trees per little bag (only the sampling scheme; the regression forest does
        not report variances).
    batch_size : int or None, default None
        Trees grown together level by level (``None``: chosen from a memory budget).
    random_state : int or None, default None (means 0)

    Attributes
    ----------
    estimators_ : dict
        Packed forest; node values are ``[mean_0 .. mean_{T-1}, count]``.
    bin_mapper_ : histogram.binning.BinMapper
    n_features_in_ : int
    n_outputs_ : int
    oob_prediction_ : ndarray, shape (n_local,) or (n_local, n_outputs)
        Out-of-bag predictions for the rows this rank passed to ``fit``.
    feature_importances_ : ndarray, shape (n_features,)
        GRF's depth-weighted split frequency.
    gain_importances_ : ndarray, shape (n_features,)
    """

    def __init__(self, n_estimators=200, *, max_samples=0.5, honest=True, honesty_fraction=0.5, min_samples_leaf=5,
                 max_depth=None, max_features=None, max_bins=255, ci_group_size=1, batch_size=None,
                 random_state=None):
        self.n_estimators = n_estimators
        self.max_samples = max_samples
        self.honest = honest
        self.honesty_fraction = honesty_fraction
        self.min_samples_leaf = min_samples_leaf
        self.max_depth = max_depth
        self.max_features = max_features
        self.max_bins = max_bins
        self.ci_group_size = ci_group_size
        self.batch_size = batch_size
        self.random_state = random_state

    def _check_params(self):
        """Validate the parameters before any data is touched; returns the seed.

        ``fit`` runs it first; ``forest-train`` and model-file loading run it too.
        """
        return check_forest_params(self)

    def fit(self, X, y, sample_weight=None, *, comm=None, progress=None, binned=None):
        """Fit on this rank's rows.

        Parameters
        ----------
        X : array-like, shape (n_local, n_features), or None
            ``None`` when ``binned`` is given.
        y : array-like, shape (n_local,) or (n_local, n_outputs)
        sample_weight : array-like, shape (n_local,), optional
        comm : native.comm.Communicator, optional
            ``None`` means ``native.comm.world()``.
        progress : callable, optional
            ``progress(n_trees_done, n_trees_total)``.
        binned : tuple (BinMapper, ndarray), optional
            Pre-computed ``(mapper, codes)``: a ``BinMapper`` fitted on the rows of
            all ranks and this rank's codes, uint8 of shape ``(n_features, n_local)``
            (``mapper.transform(X)``). The forest then grows on the codes and never
            needs float features (the causal forest shares its binning with its
            nuisance forests; ``forest-train`` bins parquet row groups as it reads).

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        seed = self._check_params()
        X, codes_given = features_or_codes(X, binned)
        n, n_features = codes_given[1].shape[::-1] if codes_given is not None else X.shape
        y = np.asarray(y, dtype=np.float64)
        if y.ndim not in (1, 2) or len(y) != n:
            raise ValueError(f"y must have shape (n,) or (n, n_outputs) with n = {n}, got {y.shape}")
        if not np.all(np.isfinite(y)):
            raise ValueError("y contains NaN or infinite values")
        y2 = as_columns(y)
        g = check_weight(sample_weight, n)
        n_out = y2.shape[1]
        gids, n_global = global_ids(comm, n)
        if n_global < 2:
            raise ValueError(f"need at least 2 rows in total, got {n_global}")
        if sample_weight is not None:
            g = _normalise_weights(g, n_global, comm)
        mapper, codes = fit_binning(X, self.max_bins, seed, comm) if codes_given is None else codes_given
        crit = VarianceCriterion(n_out, min_samples_leaf=self.min_samples_leaf, count_channel=True)
        channels = crit.make_channels(y2, g)

        def value_fn(sums):
            out = np.empty((len(sums), n_out + 1))
            out[:, :n_out] = crit.node_value(sums)
            out[:, n_out] = sums[:, -1]
            return out

        self.n_features_in_ = n_features
        self.n_outputs_ = n_out
        self.sampling_ = dict(seed=seed, sample_fraction=float(self.max_samples), ci_group_size=int(self.ci_group_size),
                              honest=bool(self.honest), honesty_fraction=float(self.honesty_fraction))
        packed, acc, cnt = grow_honest_forest(
            codes, mapper, gids, channels, crit, n_estimators=int(self.n_estimators), seed=seed,
            sample_fraction=float(self.max_samples), ci_group_size=int(self.ci_group_size), honest=bool(self.honest),
            honesty_fraction=float(self.honesty_fraction), max_depth=self.max_depth,
            min_samples_split=2 * self.min_samples_leaf, mtry=resolve_mtry(self.max_features, n_features),
            batch_size=self.batch_size, n_global=n_global, value_fn=value_fn, count_col=n_out, comm=comm, oob=True,
            progress=progress)
        self.estimators_ = packed
        self.bin_mapper_ = mapper
        full = None
        if (cnt == 0).any():
            # rows every tree sampled (rare): fall back to the in-sample prediction
            full = predict_values_binned(packed, codes, mapper.missing_bin_)[:, :n_out] / n_estimators_fitted(packed)
        with np.errstate(invalid="ignore", divide="ignore"):
            oob = acc[:, :n_out] / cnt[:, None]
        if full is not None:
            oob[cnt == 0] = full[cnt == 0]
        self.oob_prediction_ = oob[:, 0] if y.ndim == 1 else oob
        self.feature_importances_ = depth_weighted_importance(packed, n_features)
        self.gain_importances_ = gain_importance(packed, n_features)
        return self

    def _predict_raw(self, X):
        n_trees = len(self.estimators_["tree_offsets"]) - 1
        return predict_values(self.estimators_, X)[:, :self.n_outputs_] / n_trees

    def predict(self, X):
        """Forest prediction.

        Parameters
        ----------
        X : array-like, shape (n, n_features)

        Returns
        -------
        ndarray, shape (n,) or (n, n_outputs)
        """
        check_is_fitted(self, "estimators_")
        X = check_X(X, self.n_features_in_)
        out = self._predict_raw(X)
        return out[:, 0] if self.n_outputs_ == 1 else out

    def oob_predict(self, X, comm=None):
        """Out-of-bag predictions for the training rows of this rank (same order as in ``fit``).

        Parameters
        ----------
        X : array-like, shape (n_local, n_features)
            Exactly the rows this rank passed to ``fit``.
        comm : native.comm.Communicator, optional
            The communicator used in ``fit`` (global row ids are recomputed from it).

        Returns
        -------
        ndarray, shape (n_local,) or (n_local, n_outputs)
            NaN for rows no tree left out.
        """
        check_is_fitted(self, "estimators_")
        comm = world() if comm is None else comm
        X = check_X(X, self.n_features_in_)
        gids, _ = global_ids(comm, len(X))
        avg, _ = oob_average(self.estimators_, X, gids, self.sampling_)
        avg = avg[:, :self.n_outputs_]
        return avg[:, 0] if self.n_outputs_ == 1 else avg

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

from native.comm import world

from ._validation import (agreed_features, as_columns, check_moment_sums, check_row_count, check_target, check_weight,
                          feature_summary, fit_features, moment_sums, validate_features)
from .collective_checks import collective_checks, require_same, total
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


def normalise_weights(g, n_global, weight_total):
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
    weight_total : float
        ``g.sum()`` over all ranks.

    Returns
    -------
    ndarray of float64, shape (n_local,)
    """
    if not weight_total > 0:
        raise ValueError("sample_weight sums to zero over all rows")
    if not np.isfinite(weight_total):
        raise ValueError(f"sample_weight sums to {weight_total} over all rows; rescale sample_weight")
    return g * (n_global / weight_total)


def check_forest_params(est):
    """Validate the sampling/growth parameters shared by both forests (raises ValueError)."""
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


def n_estimators_fitted(packed):
    """Number of trees in a packed forest."""
    return len(packed["tree_offsets"]) - 1


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
    feature_names_in_ : ndarray of str
        Only when fitted on a table with string column names (or with ``feature_names``).
    n_outputs_ : int
    oob_prediction_ : ndarray, shape (n_local,) or (n_local, n_outputs)
        Out-of-bag predictions for the rows this rank passed to ``fit``.
    feature_importances_ : ndarray, shape (n_features,)
        GRF's depth-weighted split frequency.
    gain_importances_ : ndarray, shape (n_features,)

    Notes
    -----
    scikit-learn's estimator checks pass except those in ``_expected_failed_checks``,
    which fail by design (scikit-learn's own forests list the same one); give it to
    ``parametrize_with_checks`` or ``check_estimator`` as ``expected_failed_checks``.
    """

    #: scikit-learn checks that cannot hold for this estimator, with the reason.
    #: (scikit-learn >= 1.6 dropped the ``_xfail_checks`` tag; its own forests keep
    #: this list in its test suite and pass it as ``expected_failed_checks``.)
    _expected_failed_checks = {
        "check_sample_weight_equivalence_on_dense_data": (
            "sample_weight is not equivalent to repeating rows: each tree subsamples rows by a hash of the row "
            "id, so a row of weight 2 is drawn once where its two copies would be drawn independently"),
    }

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

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True          # NaN is a missing value, with its own bin
        tags.target_tags.multi_output = True
        return tags

    def fit(self, X, y, sample_weight=None, *, comm=None, progress=None, binned=None, feature_names=None):
        """Fit on this rank's rows.

        Input checks are collective (:mod:`forest.collective_checks`): when any rank's
        input is bad, every rank raises the same ``ValueError`` naming that rank.

        Parameters
        ----------
        X : array-like, pandas DataFrame or pyarrow Table, shape (n_local, n_features), or None
            NaN (or a null) means missing. ``None`` when ``binned`` is given. A table's
            column names become ``feature_names_in_`` and are checked by ``predict``.
        y : array-like, shape (n_local,) or (n_local, n_outputs)
            A column vector (n_local, 1) is kept 2-D with scikit-learn's
            ``DataConversionWarning``; predictions are then 1-D as for ``(n,)``.
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
        feature_names : sequence of str, optional
            Names of the binned features (``feature_names_in_``) when ``X`` is None.

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        seed, X, binned, y, g, n_global = self._fit_inputs(X, y, sample_weight, binned, feature_names, comm)
        n_features = self.n_features_in_
        y2 = as_columns(y)
        n_out = y2.shape[1]
        gids, _ = global_ids(comm, len(y))
        mapper, codes = fit_binning(X, self.max_bins, seed, comm) if binned is None else binned
        crit = VarianceCriterion(n_out, min_samples_leaf=self.min_samples_leaf, count_channel=True)
        channels = crit.make_channels(y2, g)

        def value_fn(sums):
            out = np.empty((len(sums), n_out + 1))
            out[:, :n_out] = crit.node_value(sums)
            out[:, n_out] = sums[:, -1]
            return out

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

    def _fit_inputs(self, X, y, sample_weight, binned, feature_names, comm):
        """Validate ``fit``'s arguments on every rank together.

        Returns
        -------
        seed : int
        X : ndarray of float64, shape (n_local, n_features), or None
        binned : tuple (BinMapper, ndarray) or None
        y : ndarray of float64, shape (n_local,) or (n_local, n_outputs)
        g : ndarray of float64, shape (n_local,)
            Sample weights rescaled to mean 1 over all ranks' rows.
        n_global : int
        """
        with collective_checks(comm) as checks:
            seed = check_forest_params(self)
            X, binned, n = fit_features(self, X, binned, feature_names, min_samples=1 if comm.size == 1 else 0)
            resolve_mtry(self.max_features, self.n_features_in_)
            y = check_target(y, "y", n, estimator=self, warn_column=True)
            g = check_weight(sample_weight, n)
            checks.share(rows=n, outputs=y.shape[1:], moments=moment_sums(g, y), **feature_summary(self))
        summaries = checks.summaries
        agreed_features(summaries)
        require_same(summaries, "outputs", lambda s: f"y has shape (n, {s[0]})" if s else "y is 1-D")
        n_global = total(summaries, "rows")
        check_row_count(self, n_global, 2, comm.size)
        moments = total(summaries, "moments")
        weight_total = moments[0]  # sum |g| = sum g: weights are non-negative
        g = normalise_weights(g, n_global, weight_total)
        check_moment_sums(moments * (n_global / weight_total))  # the channels hold the rescaled weights
        return seed, X, binned, y, g, n_global

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
        X = validate_features(self, X, reset=False, min_samples=0)
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
        comm = world() if comm is None else comm
        with collective_checks(comm):
            check_is_fitted(self, "estimators_")
            X = validate_features(self, X, reset=False, min_samples=0)
        gids, _ = global_ids(comm, len(X))
        avg, _ = oob_average(self.estimators_, X, gids, self.sampling_)
        avg = avg[:, :self.n_outputs_]
        return avg[:, 0] if self.n_outputs_ == 1 else avg

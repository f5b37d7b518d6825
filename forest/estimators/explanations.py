"""``shap_values``: TreeSHAP explanations of the tree models, one home (issue 35).

:class:`ShapMixin` gives every tree estimator the same method; what differs between
models is *what* is explained, chosen by the class attribute ``_shap_kind``:

``"margin"`` (GBDTRegressor, GBDTClassifier)
    The raw score before the link (``decision_function`` for classifiers, the
    prediction for regression): a sum of trees, so path-dependent TreeSHAP is exact.
    Covers are the training rows that reached each node (``Tree.count``; LightGBM's
    choice, not XGBoost's hessian sums), so a tree's expected value is the mean of its
    output over the training rows (sample weights do not enter the covers), and the
    base value is ``baseline_`` plus the trees' expected values.
``"ratio"`` (RegressionForest)
    A forest predicts ``mean_t(num_t) / mean_t(den_t)`` (:meth:`RegressionForest._forest_ratio`:
    leaves hold ``sum w y / rows`` and ``sum w / rows``). Without sample weights every
    ``den`` is exactly 1, the prediction is the mean of the trees' leaf means, and its
    TreeSHAP values are exact (the base value is the trees' mean expected value). With
    weights the ratio is linearised at the row's own averages: feature ``j`` gets
    ``(phi_j(num) - pred(x) phi_j(den)) / den(x)``, with ``phi_j(.)`` the TreeSHAP values
    of the averaged leaf vectors, and the base value is ``pred(x)`` minus their sum (so
    it varies with the row).
``"effect"`` (CausalForest, InstrumentalForest)
    ``theta(x)`` solves the local estimating equation ``A(m) theta = b(m)`` at the
    forest's averaged leaf moments ``m(x)`` (:func:`forest.analysis.inference.solve_theta`).
    The moments are a mean of trees, explained exactly by TreeSHAP (``phi_j(m)``); the
    effect is attributed through the linearisation of ``theta`` at the row's own
    moments: ``phi_j(theta) = A^{-1} (b'(phi_j(m)) - A'(phi_j(m)) theta)`` with ``A'``,
    ``b'`` the (linear) differentials of ``A`` and ``b``. EconML explains its forests
    through the trees' own parameter estimates instead, whose mean is not the forest's
    prediction; this attribution adds up to ``predict``. The last column is
    ``theta(x)`` minus the features' sum: the first-order extrapolation from ``x`` to the
    effect at the forest's average moments, a per-row base value.

Honest forests' covers are the estimation rows their node values come from
(:func:`forest.engine.treeshap.honest_fractions`; nodes no estimation row reached,
whose values were copied from their parent, have cover zero).

Every kind returns the LightGBM ``pred_contrib`` layout: features first, the base value
last, each row summing to the explained output (up to rounding).
"""
import contextlib

import numpy as np

from forest._validation import validate_features
from forest.analysis.inference import solve_theta
from forest.engine.predictor import predict_values
from forest.engine.treeshap import count_fractions, expected_values, honest_fractions, tree_shap
from forest.estimators.base import check_is_fitted


def _layout(phi, base):
    """``(n, F, k)`` contributions and ``(n, k)`` (or ``(k,)``) base -> ``(n, F + 1, k)``."""
    n = phi.shape[0]
    base = np.broadcast_to(np.asarray(base, dtype=np.float64), (n, phi.shape[2]))
    return np.concatenate([phi, base[:, None, :]], axis=1)


def _n_trees(packed):
    return len(packed["tree_offsets"]) - 1


def margin_shap(est, X):
    """GBDT: TreeSHAP of the raw score; ``(n, F + 1, K)``."""
    X = est._check_predict_X(X)
    packed = est._packed_forest()
    frac = count_fractions(packed)
    with est._numba_threads():
        phi = tree_shap(packed, X, frac)
    base = np.asarray(est.baseline_, dtype=np.float64) + expected_values(packed, frac).sum(axis=0)
    return _layout(phi, base)


def ratio_shap(est, X):
    """RegressionForest: TreeSHAP of the forest ratio; ``(n, F + 1, n_outputs)``."""
    check_is_fitted(est, "estimators_")
    X = validate_features(est, X, reset=False, min_samples=0)
    packed = est.estimators_
    k = int(est.n_outputs_)
    value = packed["value"]
    trees = _n_trees(packed)
    frac = honest_fractions(packed, count_col=k)
    leaves = packed["feature"] < 0
    if value.shape[1] == k + 1 or bool((value[leaves, k + 1] == 1.0).all()):
        # every denominator is exactly 1: the prediction is the mean of the trees' leaf means
        explained = np.ascontiguousarray(value[:, :k])
        phi = tree_shap(packed, X, frac, explained) / trees
        return _layout(phi, expected_values(packed, frac, explained).sum(axis=0) / trees)
    columns = np.ascontiguousarray(value[:, list(range(k)) + [k + 1]])
    phi = tree_shap(packed, X, frac, columns) / trees
    mean_values = predict_values(packed, X) / trees        # what predict divides
    pred = est._forest_ratio(mean_values)
    den = mean_values[:, k + 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        contrib = (phi[:, :, :k] - pred[:, None, :] * phi[:, :, k:]) / den[:, None, None]
    return _layout(contrib, pred - contrib.sum(axis=1))


def effect_shap(est, X):
    """Causal and instrumental forests: linearised attribution of ``theta``; ``(n, F + 1, K, M)``."""
    check_is_fitted(est, "estimators_")
    X = validate_features(est, X, reset=False, min_samples=0)
    packed = est.estimators_
    layout = est._layout()
    n_moments = layout.n_moments
    frac = honest_fractions(packed, count_col=n_moments)
    moments = np.ascontiguousarray(packed["value"][:, :n_moments])
    d_m = tree_shap(packed, X, frac, moments) / _n_trees(packed)          # (n, F, n_moments)
    mbar = est._mean_moments(X)                                            # as predict computes it
    theta, A = solve_theta(mbar, layout)                                   # (n, K, M), (n, K, K)
    g, z, w, y, zy, zw = (v[:, None] for v in layout.equation_moments(mbar[:, :n_moments]))
    dg, dz, dw, dy, dzy, dzw = layout.equation_moments(d_m)
    # Differentials of A = g zw - z w^T and b = g zy - z y^T along each feature's moments.
    dA = dg[..., None, None] * zw + g[..., None, None] * dzw - dz[..., :, None] * w[..., None, :] \
        - z[..., :, None] * dw[..., None, :]
    db = dg[..., None, None] * zy + g[..., None, None] * dzy - dz[..., :, None] * y[..., None, :] \
        - z[..., :, None] * dy[..., None, :]
    rhs = db - dA @ theta[:, None]                                         # (n, F, K, M)
    contrib = np.full(rhs.shape, np.nan)
    ok = np.isfinite(theta).all(axis=(1, 2))                               # predict's NaN rows stay NaN
    if ok.any():
        contrib[ok] = np.linalg.solve(A[ok][:, None], rhs[ok])
    base = theta - contrib.sum(axis=1)
    return np.concatenate([contrib, base[:, None]], axis=1)                # (n, F + 1, K, M)


_KINDS = {"margin": margin_shap, "ratio": ratio_shap, "effect": effect_shap}


class ShapMixin:
    """``shap_values`` for a tree estimator; the class sets ``_shap_kind`` (module docstring)."""

    _shap_kind = None

    def _numba_threads(self):
        """Context for the kernel's Numba threads (GBDT honours ``n_threads``)."""
        return contextlib.nullcontext()

    def shap_values(self, X):
        """Exact path-dependent TreeSHAP values of the model's output.

        Parameters
        ----------
        X : array-like, shape (n, n_features)
            NaN takes each split's missing direction; categorical columns as in ``predict``.

        Returns
        -------
        ndarray
            LightGBM's ``pred_contrib`` layout: ``(n, n_features + 1)`` for a single
            output, feature contributions first and the base value in the last column;
            ``(n, n_features + 1, K)`` for ``K`` outputs (multiclass GBDT: one per
            class; multi-output regression forest; effect forests with ``K`` arms,
            treatment components or outcomes, and ``(n, n_features + 1, K, M)`` for
            ``K`` treatments and ``M`` outcomes, in ``predict``'s order). Each row sums
            over its second axis to the model's raw output: GBDT's margin
            (``decision_function`` / ``predict`` of the regressor), the forest's
            ``predict``. What a contribution means for ratio and effect models (a
            linearisation at the row's own averaged leaves, with a per-row base value):
            :mod:`forest.estimators.explanations`.
        """
        out = _KINDS[self._shap_kind](self, X)
        return self._shap_shape(out)

    def _shap_shape(self, out):
        """Drop the output axes ``predict`` drops (a single output)."""
        if out.ndim == 3:
            return out[:, :, 0] if out.shape[2] == 1 else out
        n, width = out.shape[:2]
        flat = self._shape(out.reshape((n * width,) + out.shape[2:]))   # the effect forests' own rule
        return flat.reshape((n, width) + flat.shape[1:])


__all__ = ["ShapMixin", "margin_shap", "ratio_shap", "effect_shap"]

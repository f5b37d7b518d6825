"""Linear summaries of a causal forest: best linear projection and the calibration test.

This module owns grf's ``best_linear_projection`` and ``test_calibration`` on
:class:`forest.analysis.effect_rows.EffectRows`, both weighted least squares over all ranks'
rows (:func:`forest.analysis.robust_ols.robust_ols`, HC3 standard errors, cluster-robust
with clusters; t reference distribution with the residual degrees of freedom):

* best linear projection: the doubly robust scores ``G`` regressed on ``(1, A)``;
  the coefficients estimate the projection of ``tau(X)`` on the covariates ``A``
  (Semenova and Chernozhukov). With ``A = None`` the intercept is the average
  treatment effect.
* calibration test: ``Y - m(X)`` regressed, without intercept, on
  ``(W - e(X)) * mean(tau)`` and ``(W - e(X)) * (tau(X) - mean(tau))`` with ``tau``
  the forest's (out-of-bag or held-out) predictions and the mean weighted by the
  observation weights. The coefficients are grf's "mean forest prediction"
  (1 when the average effect is right) and "differential forest prediction" (1
  when the heterogeneity is right; significantly above 0 rejects "no
  heterogeneity"); p-values are one-sided (``H1: coefficient > 0``), as in grf.
  Multi-arm and vector treatments regress on both columns of every treatment
  column at once (for one column this is exactly grf's regression).
"""
import numpy as np

from native import collectives as col

from forest.analysis.result import EstimateTable
from forest.analysis.effect_rows import subset_weights
from forest.analysis.robust_ols import robust_ols

CALIBRATION_TERMS = ("mean.forest.prediction", "differential.forest.prediction")


def _covariance_note(rows):
    if rows.layout is None:
        return "HC3 heteroskedasticity-robust standard errors"
    return f"HC3 cluster-robust standard errors ({rows.layout.n_clusters} clusters)"


#: Populations of :func:`best_linear_projection` (grf's ``target.sample``).
PROJECTION_TARGETS = ("all", "overlap")


def best_linear_projection(comm, rows, A=None, subset=None, names=None, contrasts=None, target="all"):
    """Best linear projection of the effect on covariates ``A``.

    Parameters
    ----------
    comm : native.comm.Communicator
    rows : forest.analysis.effect_rows.EffectRows
    A : array-like, shape (n_local, q), optional
        Covariates of this rank's rows (default: intercept only). Rows with a NaN
        in ``A`` are left out (as R's ``lm`` leaves out rows with ``NA``).
    subset : array-like of bool, shape (n_local,), optional
    names : sequence of str, optional
        Names of ``A``'s columns (default: a DataFrame's or Series' column names, else
        ``A1 .. Aq``).
    contrasts : sequence of str, optional
        Names of the ``K * M`` effect columns (needed when there is more than one).
    target : {"all", "overlap"}
        ``"overlap"`` multiplies each row's weight by ``e(x)(1 - e(x))`` (grf's
        ``target.sample = "overlap"``; binary treatments only).

    Returns
    -------
    forest.analysis.result.EstimateTable
        Terms ``(Intercept)`` then ``A``'s columns.
    """
    if target not in PROJECTION_TARGETS:
        raise ValueError(f"target must be one of {PROJECTION_TARGETS}, got {target!r}")
    if target == "overlap" and rows.kind != "binary":
        raise ValueError(f"target='overlap' needs a binary treatment (weights e(x)(1 - e(x))), not a {rows.kind} one")
    n = rows.n
    if A is None:
        A = np.zeros((n, 0))
    if names is None and hasattr(A, "columns"):      # a pandas DataFrame
        names = [str(c) for c in A.columns]
    elif names is None and getattr(A, "name", None) is not None and getattr(A, "ndim", 0) == 1:  # a Series
        names = [str(A.name)]
    A = np.asarray(A, dtype=np.float64)
    if A.ndim == 1:
        A = A[:, None]
    if A.ndim != 2 or len(A) != n:
        raise ValueError(f"A must have shape ({n}, q) (this rank's rows), got {A.shape}")
    if np.isinf(A).any():
        raise ValueError("A contains infinite values")
    missing = np.isnan(A).any(axis=1)          # left out, as R's lm does with NA rows
    A = np.where(np.isnan(A), 0.0, A)
    q = A.shape[1]
    names = [f"A{j + 1}" for j in range(q)] if names is None else [str(v) for v in names]
    if len(names) != q:
        raise ValueError(f"names has {len(names)} entries for {q} columns of A")
    w = np.where(missing, 0.0, subset_weights(rows, subset))
    if target == "overlap":
        e = rows.t_hat[:, 0]
        w = w * e * (1.0 - e)
    design = np.concatenate([np.ones((n, 1)), A], axis=1)
    K, M = rows.shape
    G = rows.scores.reshape(n, K * M)
    fits = [robust_ols(comm, design, G[:, j], w, rows.layout, vcov="HC3") for j in range(K * M)]
    title = "Best linear projection of the conditional average treatment effect" + \
        (" (overlap-weighted)" if target == "overlap" else "")
    return _table(fits, ["(Intercept)"] + names, contrasts, title, _covariance_note(rows))


def test_calibration(comm, rows, contrasts=None):
    """grf's calibration test of the forest's predictions.

    Parameters
    ----------
    comm : native.comm.Communicator
    rows : forest.analysis.effect_rows.EffectRows
    contrasts : sequence of str, optional
        Names of the ``K * M`` effect columns.

    Returns
    -------
    forest.analysis.result.EstimateTable
        Terms ``mean.forest.prediction``, ``differential.forest.prediction``;
        one-sided p-values.
    """
    n = rows.n
    K, M = rows.shape
    w = rows.weight
    sums = np.concatenate([(w[:, None, None] * rows.tau).sum(axis=0).ravel(), [w.sum()]])
    if comm.size > 1:
        sums = col.allreduce(comm, sums)
    mean_tau = (sums[:-1] / sums[-1]).reshape(K, M)
    wc = rows.W - rows.t_hat                                                 # (n, K)
    fits = []
    for m in range(M):
        design = np.empty((n, 2 * K))
        design[:, 0::2] = wc * mean_tau[None, :, m]
        design[:, 1::2] = wc * (rows.tau[:, :, m] - mean_tau[None, :, m])
        try:
            fit = robust_ols(comm, design, rows.Y[:, m] - rows.y_hat[:, m], w, rows.layout, vcov="HC3")
        except ValueError as exc:
            if "singular" not in str(exc):
                raise
            raise ValueError("the calibration test is undefined here: the forest's predictions are constant "
                             "(or their mean is zero), so its two regressors are collinear") from None
        fits.append(fit)
    coef = np.stack([f.coef.reshape(K, 2) for f in fits], axis=1).reshape(K * M, 2)   # arm-major, like tau
    se = np.stack([f.stderr.reshape(K, 2) for f in fits], axis=1).reshape(K * M, 2)
    title = "Best linear fit using forest predictions (held-out or out-of-bag) and their mean"
    if K * M == 1:
        return EstimateTable(CALIBRATION_TERMS, coef[0], se[0], title=title, dof=fits[0].dof,
                             alternative="greater", note=_covariance_note(rows) + "; one-sided p-values")
    return EstimateTable(CALIBRATION_TERMS, coef, se, title=title, dof=min(f.dof for f in fits),
                         alternative="greater", contrasts=_contrast_names(contrasts, K * M),
                         note=_covariance_note(rows) + "; one-sided p-values")


def regression_calibration(comm, predictions, y, weight, layout=None):
    """grf's calibration test of a regression forest's (out-of-bag) predictions.

    Weighted least squares of ``y`` on the weighted mean prediction (a constant column)
    and the prediction's deviation from it, without intercept: both coefficients are 1
    for a calibrated forest; a differential coefficient above 0 says the forest's
    variation is real.

    Parameters
    ----------
    comm : native.comm.Communicator
    predictions, y : ndarray, shape (n_local, k)
    weight : ndarray, shape (n_local,)
    layout : forest.engine.clusters.ClusterLayout, optional
        Cluster-robust standard errors over these clusters.

    Returns
    -------
    forest.analysis.result.EstimateTable
        Terms ``mean.forest.prediction``, ``differential.forest.prediction`` (one row per
        output when ``k > 1``), HC3 standard errors, one-sided p-values.
    """
    k = predictions.shape[1]
    sums = np.concatenate([(weight[:, None] * predictions).sum(axis=0), [weight.sum()]])
    if comm.size > 1:
        sums = col.allreduce(comm, sums)
    mean = sums[:-1] / sums[-1]
    fits = []
    for j in range(k):
        design = np.column_stack([np.full(len(y), mean[j]), predictions[:, j] - mean[j]])
        try:
            fits.append(robust_ols(comm, design, y[:, j], weight, layout, vcov="HC3"))
        except ValueError as exc:
            if "singular" not in str(exc):
                raise
            raise ValueError("the calibration test is undefined here: the forest's predictions are constant "
                             "(or their mean is zero), so its two regressors are collinear") from None
    note = ("HC3 heteroskedasticity-robust standard errors" if layout is None else
            f"HC3 cluster-robust standard errors ({layout.n_clusters} clusters)") + "; one-sided p-values"
    title = "Best linear fit using forest predictions (out-of-bag) and their mean"
    if k == 1:
        return EstimateTable(CALIBRATION_TERMS, fits[0].coef, fits[0].stderr, title=title, dof=fits[0].dof,
                             alternative="greater", note=note)
    return EstimateTable(CALIBRATION_TERMS, np.stack([f.coef for f in fits]), np.stack([f.stderr for f in fits]),
                         title=title, dof=min(f.dof for f in fits), alternative="greater",
                         contrasts=[f"output {j}" for j in range(k)], note=note)


def _contrast_names(contrasts, E):
    names = [f"effect {j}" for j in range(E)] if contrasts is None else list(contrasts)
    if len(names) != E:
        raise ValueError(f"need {E} contrast names, got {len(names)}")
    return names


def _table(fits, terms, contrasts, title, note):
    if len(fits) == 1:
        f = fits[0]
        return EstimateTable(terms, f.coef, f.stderr, title=title, dof=f.dof, note=note)
    return EstimateTable(terms, np.stack([f.coef for f in fits]), np.stack([f.stderr for f in fits]), title=title,
                         dof=min(f.dof for f in fits), contrasts=_contrast_names(contrasts, len(fits)), note=note)

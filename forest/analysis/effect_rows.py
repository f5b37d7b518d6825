"""The per-row inputs of the doubly robust analyses of a causal forest.

This module owns :class:`EffectRows`: for each of this rank's rows (out-of-bag
training rows, or held-out rows), the effect estimate ``tau(x)``, the observed
treatment and outcome, the nuisance estimates ``m(x) = E[Y|x]`` and
``e(x) = E[W|x]`` (and ``V(x) = Var[W|x]`` for continuous treatments), the
observation weight, the global row id and the cluster layout, together with the
doubly robust scores built from them (:func:`forest.analysis.inference.aipw_scores`). The
estimators in :mod:`forest.analysis.average_effects`, :mod:`forest.analysis.linear_projection` and
:mod:`forest.analysis.rate` read nothing else, so they work the same on out-of-bag and on
held-out rows.
"""
from typing import NamedTuple, Optional

import numpy as np

from forest.engine.clusters import ClusterLayout
from forest.analysis.inference import aipw_scores, instrumental_scores


class EffectRows(NamedTuple):
    """One rank's rows for the doubly robust analyses.

    Attributes
    ----------
    kind : {"binary", "categorical", "continuous", "instrumental"}
    tau : ndarray, shape (n, K, M)
        Effect estimates (out-of-bag for training rows).
    W : ndarray, shape (n, K)
        Treatment: arm indicators (binary, categorical) or values (continuous).
    arm : ndarray of int64, shape (n,), or None
        Arm code, 0 the control (binary, categorical).
    Y, y_hat : ndarray, shape (n, M)
    t_hat : ndarray, shape (n, K)
        ``E[W|x]`` (propensities of arms 1..K).
    V : ndarray, shape (n, K, K), or None
        ``Var[W|x]`` (continuous treatments only).
    weight : ndarray, shape (n,)
        Observation weights (:func:`forest.engine.clusters.observation_weights`).
    gids : ndarray of int64, shape (n,)
        Global row ids (over all ranks' rows of this data set).
    layout : ClusterLayout or None
    scores : ndarray, shape (n, K, M)
        Doubly robust scores.
    source : {"out-of-bag", "held-out"}
        Which estimates the rows carry: the training rows' out-of-bag ones, or the
        full forest's on rows it was not trained on.
    """

    kind: str
    tau: np.ndarray
    W: np.ndarray
    arm: Optional[np.ndarray]
    Y: np.ndarray
    y_hat: np.ndarray
    t_hat: np.ndarray
    V: Optional[np.ndarray]
    weight: np.ndarray
    gids: np.ndarray
    layout: Optional[ClusterLayout]
    scores: np.ndarray
    source: str = "held-out"

    @property
    def n(self):
        return len(self.weight)

    @property
    def shape(self):
        """``(K, M)``: treatment columns and outcomes."""
        return self.tau.shape[1:]

    def unit_ids(self):
        """Global id of each row's resampling unit: its cluster code, or its row id."""
        return self.gids if self.layout is None else self.layout.codes


class ScoredRows(NamedTuple):
    """What :meth:`forest.CausalForest.score_rows` returns.

    Attributes
    ----------
    effects, scores : ndarray
        Effect estimates and doubly robust scores, each of the shape of ``predict``.
    source : {"out-of-bag", "held-out"}
        Out-of-bag estimates of the training rows, or the forest's on held-out rows.
    """

    effects: np.ndarray
    scores: np.ndarray
    source: str


def make_effect_rows(kind, tau, W, arm, Y, y_hat, t_hat, V, weight, gids, layout, source="held-out"):
    """Assemble :class:`EffectRows` and compute the doubly robust scores.

    Parameters are the attributes of :class:`EffectRows` (without ``scores``).

    Returns
    -------
    EffectRows
    """
    tau = np.asarray(tau, dtype=np.float64)
    n, K, M = tau.shape
    W = np.asarray(W, dtype=np.float64).reshape(n, K)
    Y = np.asarray(Y, dtype=np.float64).reshape(n, M)
    y_hat = np.asarray(y_hat, dtype=np.float64).reshape(n, M)
    t_hat = np.asarray(t_hat, dtype=np.float64).reshape(n, K)
    t_arg = arm if kind == "categorical" else (W[:, 0] if kind == "binary" else W)
    scores = aipw_scores(kind, tau, t_arg, Y, y_hat, t_hat, V)
    return EffectRows(kind, tau, W, arm, Y, y_hat, t_hat, V, np.asarray(weight, dtype=np.float64),
                      np.asarray(gids, dtype=np.int64), layout, scores, source)


def make_instrumental_rows(tau, t, y, z, y_hat, t_hat, z_hat, compliance, weight, gids, layout,
                           source="held-out"):
    """:class:`EffectRows` of an instrumental forest (kind ``"instrumental"``, one treatment and outcome).

    The scores are :func:`forest.analysis.inference.instrumental_scores`; ``W`` holds the
    treatment, ``t_hat`` its estimate, and the instrument enters only through the scores.

    Parameters
    ----------
    tau, t, y, z, y_hat, t_hat, z_hat, compliance, weight : ndarray, shape (n,)
    gids : ndarray of int64, shape (n,)
    layout : ClusterLayout or None
    source : {"out-of-bag", "held-out"}

    Returns
    -------
    EffectRows
    """
    tau, t, y, z, y_hat, t_hat, z_hat, compliance = (np.asarray(a, dtype=np.float64).reshape(-1) for a in
                                                     (tau, t, y, z, y_hat, t_hat, z_hat, compliance))
    n = len(tau)
    scores = instrumental_scores(tau, t, y, z, y_hat, t_hat, z_hat, compliance)
    return EffectRows("instrumental", tau.reshape(n, 1, 1), t.reshape(n, 1), None, y.reshape(n, 1),
                      y_hat.reshape(n, 1), t_hat.reshape(n, 1), None, np.asarray(weight, dtype=np.float64),
                      np.asarray(gids, dtype=np.int64), layout, scores.reshape(n, 1, 1), source)


def subset_weights(rows, subset):
    """Observation weights with rows outside ``subset`` set to zero.

    Parameters
    ----------
    rows : EffectRows
    subset : array-like of bool, shape (n,), or None

    Returns
    -------
    ndarray, shape (n,)
    """
    if subset is None:
        return rows.weight
    mask = np.asarray(subset)
    if mask.dtype != bool or mask.shape != (rows.n,):
        raise ValueError(f"subset must be a boolean mask of shape ({rows.n},) over this rank's rows, got "
                         f"{mask.dtype} {mask.shape}")
    return np.where(mask, rows.weight, 0.0)

"""Weighted means of per-row scores and their standard errors from additive sums.

Used where per-row scores (rewards, policy values) are averaged over rows spread
across ranks: each rank forms :func:`average_effect_sums` of its rows, one
allreduce adds them, and :func:`average_effect` turns the totals into the mean and
its standard error. The causal forest's cluster-aware averages live in
:mod:`forest.analysis.average_effects` (they reduce over clusters, not rows).
"""
import numpy as np


def average_effect_sums(scores, sample_weight=None):
    """Sums that :func:`average_effect` needs, additive across ranks.

    Parameters
    ----------
    scores : ndarray, shape (n, ...)
    sample_weight : ndarray, shape (n,), optional

    Returns
    -------
    ndarray, shape (5, ...)
        ``sum g, sum g G, sum g^2, sum g^2 G, sum g^2 G^2`` (broadcast over the score shape).
    """
    s = np.asarray(scores, dtype=np.float64)
    g = np.ones(len(s)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    gb = g.reshape((-1,) + (1,) * (s.ndim - 1))
    ones = np.ones(s.shape[1:])
    return np.stack([g.sum() * ones, (gb * s).sum(0), (g * g).sum() * ones,
                     (gb * gb * s).sum(0), (gb * gb * s * s).sum(0)])


def average_effect(sums):
    """Weighted mean of the scores and its standard error from :func:`average_effect_sums`.

    Parameters
    ----------
    sums : ndarray, shape (5, ...)

    Returns
    -------
    estimate, stderr : ndarray, shape (...)
        ``sum g G / sum g`` and ``sqrt(sum g^2 (G - est)^2) / sum g``, the latter
        with the ``n/(n-1)`` small-sample factor (``n`` the effective row count
        ``(sum g)^2 / sum g^2``).
    """
    sg, sgG, sg2, sg2G, sg2G2 = np.asarray(sums, dtype=np.float64)
    est = sgG / sg
    ss = sg2G2 - 2.0 * est * sg2G + est * est * sg2
    n_eff = sg * sg / sg2
    factor = n_eff / np.maximum(n_eff - 1.0, 1.0)
    return est, np.sqrt(np.maximum(ss, 0.0) * factor) / sg

"""Clusters of rows (grf's ``clusters``): global cluster codes and cluster-robust sums.

This module owns what a cluster label means to the rest of ``forest``:

* :func:`cluster_layout` turns each rank's integer labels into a
  :class:`ClusterLayout`: dense global codes ``0 .. C-1`` (the rank of the label
  among all distinct labels of all ranks, so a code does not depend on the rank
  count), the global size of every cluster, which clusters have rows on more than
  one rank, each row's index among its cluster's rows in global row order, and
  grf's ``samples_per_cluster`` (the smallest cluster size with
  ``equalize_cluster_weights``, else the largest, i.e. every row);
* :func:`observation_weights` gives grf's weights for average effects (sample
  weights, or ``1 / cluster size`` with ``equalize_cluster_weights``);
* :func:`cluster_moments` is the one reduction every cluster-robust variance in
  :mod:`forest.analysis.average_effects`, :mod:`forest.analysis.robust_ols` and :mod:`forest.analysis.rate`
  goes through: for per-row vectors ``v_i`` it returns, identical on all ranks,
  ``sum_c t(V_c)`` and ``sum_c t(V_c) t(V_c)^T`` with ``V_c = sum_{i in c} v_i`` the
  cluster totals and ``t`` an optional per-cluster map. Without clusters every row
  is its own cluster, so ``t`` is applied row by row and the sums need one
  allreduce of ``k + k^2`` numbers. With clusters, totals of clusters whose rows
  all live on one rank are formed locally; only clusters split across ranks send
  their totals through the (single) allreduce.

Sampling by cluster (trees draw clusters, then at most ``samples_per_cluster`` rows
of each) lives in :mod:`forest.engine.subsample`, which reads the layout's arrays.
"""
from typing import NamedTuple

import numpy as np

from native import collectives as col


class ClusterLayout(NamedTuple):
    """Where this rank's rows sit among all ranks' clusters.

    Attributes
    ----------
    codes : ndarray of int64, shape (n_local,)
        Global dense cluster code of each row, ``0 .. n_clusters - 1``.
    n_clusters : int
    sizes : ndarray of int64, shape (n_clusters,)
        Rows per cluster over all ranks.
    shared : ndarray of int64, shape (n_clusters,)
        Index of the cluster among the clusters that have rows on more than one
        rank, ``-1`` for clusters whose rows all live on one rank (same on all ranks).
    n_shared : int
    within : ndarray of int64, shape (n_local,)
        Index of the row among its cluster's rows, in global row order.
    samples_per_cluster : int
        Most rows a tree takes from a drawn cluster.
    equalize : bool
        ``equalize_cluster_weights`` as fitted.
    """

    codes: np.ndarray
    n_clusters: int
    sizes: np.ndarray
    shared: np.ndarray
    n_shared: int
    within: np.ndarray
    samples_per_cluster: int
    equalize: bool

    @property
    def row_sizes(self):
        """Size of each row's cluster, shape (n_local,)."""
        return self.sizes[self.codes]


def layout_rows(layout, lo, hi):
    """The layout of rows ``lo:hi`` of this rank (None stays None).

    Sampling reads only per-row fields (``codes``, ``within``) and whole-forest
    tables (``sizes``, ...), so a row slice samples exactly as the full layout does.
    """
    if layout is None:
        return None
    return layout._replace(codes=layout.codes[lo:hi], within=layout.within[lo:hi])


def check_labels(labels, n_local, name="clusters"):
    """Integer cluster labels of this rank's rows as int64 (raises ValueError with one line).

    Parameters
    ----------
    labels : array-like, shape (n_local,)
        Integers, or floats holding integer values.
    n_local : int

    Returns
    -------
    ndarray of int64, shape (n_local,)
    """
    arr = np.asarray(labels)
    if arr.ndim != 1 or len(arr) != n_local:
        raise ValueError(f"{name} must have shape ({n_local},), got {arr.shape}")
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int64)
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)) or np.any(arr != np.floor(arr)) or np.any(np.abs(arr) > 2.0 ** 53):
            raise ValueError(f"{name} must hold integer labels (finite whole numbers), got non-integer values")
        arr = arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must hold integer labels, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and len(arr) and arr.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{name} labels must fit in int64")
    return arr.astype(np.int64, copy=False)


def cluster_layout(comm, labels, n_local, equalize=False):
    """Global codes, sizes and within-cluster positions of this rank's clusters.

    Collective: every rank calls it with its own rows' labels (ranks hold
    consecutive blocks of rows in rank order).

    Parameters
    ----------
    comm : native.comm.Communicator
    labels : array-like of int, shape (n_local,)
    n_local : int
    equalize : bool
        grf's ``equalize_cluster_weights``: trees take ``min(cluster size)`` rows of
        each drawn cluster and average effects weight clusters equally.

    Returns
    -------
    ClusterLayout
    """
    lab = check_labels(labels, n_local)
    local_unique = np.unique(lab)
    all_labels = np.unique(col.allgatherv(comm, local_unique)) if comm.size > 1 else local_unique
    C = len(all_labels)
    if C < 2:
        raise ValueError(f"clusters must hold at least two distinct labels over all rows, got {C}")
    codes = np.searchsorted(all_labels, lab).astype(np.int64)
    counts = np.bincount(codes, minlength=C).astype(np.int64)
    both = np.stack([counts, (counts > 0).astype(np.int64)])
    if comm.size > 1:
        both = col.allreduce(comm, both)
    sizes, presence = both[0], both[1]
    is_shared = presence > 1
    shared = np.full(C, -1, dtype=np.int64)
    shared[is_shared] = np.arange(int(is_shared.sum()), dtype=np.int64)
    n_shared = int(is_shared.sum())
    within = _within_positions(comm, codes, counts, shared, n_shared)
    spc = int(sizes.min() if equalize else sizes.max())
    return ClusterLayout(codes, C, sizes, shared, n_shared, within, spc, bool(equalize))


def resolve_clusters(clusters, comm, n_local, equalize, sample_weight, fitted=None):
    """The cluster layout an estimator's ``fit`` (or ``oob_predict``) works with.

    Parameters
    ----------
    clusters : array-like of int, ClusterLayout or None
        Labels of this rank's rows, or a layout already built (a causal forest
        shares its layout with its nuisance forests).
    comm : native.comm.Communicator
    n_local : int
    equalize : bool
        The estimator's ``equalize_cluster_weights``.
    sample_weight : array-like or None
        grf does not combine equalised cluster weights with sample weights.
    fitted : bool, optional
        For methods of a fitted estimator: whether ``fit`` had clusters (the same
        labels must then be passed again).

    Returns
    -------
    ClusterLayout or None
    """
    if fitted is not None and bool(fitted) != (clusters is not None):
        raise ValueError("this forest was fitted with clusters: pass the same cluster labels again" if fitted
                         else "this forest was fitted without clusters; clusters must be None")
    if clusters is None:
        return None
    if isinstance(clusters, ClusterLayout):
        if len(clusters.codes) != n_local:
            raise ValueError(f"cluster layout holds {len(clusters.codes)} rows, the data {n_local}")
        return clusters
    if equalize and sample_weight is not None:
        raise ValueError("equalize_cluster_weights=True cannot be combined with sample_weight "
                         "(each cluster then weighs the same; pass one or the other)")
    return cluster_layout(comm, clusters, n_local, equalize)


def _within_positions(comm, codes, counts, shared, n_shared):
    """Index of each row among its cluster's rows in global row order (rows of lower ranks first)."""
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.searchsorted(sorted_codes, sorted_codes, side="left")
    local_pos = np.empty(n, dtype=np.int64)
    local_pos[order] = np.arange(n, dtype=np.int64) - starts
    if comm.size == 1 or n_shared == 0:
        return local_pos
    mine = np.zeros(n_shared, dtype=np.int64)
    here = shared >= 0
    mine[shared[here]] = counts[here]
    table = col.allgather(comm, mine[None, :])                     # (p, n_shared)
    before = table[:comm.rank].sum(axis=0)
    offset = np.where(shared[codes] >= 0, before[np.maximum(shared[codes], 0)], 0)
    return local_pos + offset


def observation_weights(sample_weight, layout, n_local):
    """grf's per-row weights of average effects.

    Parameters
    ----------
    sample_weight : ndarray of float64, shape (n_local,), or None
    layout : ClusterLayout or None
    n_local : int

    Returns
    -------
    ndarray of float64, shape (n_local,)
        ``1 / cluster size`` with ``equalize_cluster_weights`` (every cluster then
        weighs the same), otherwise the sample weights (ones by default). Only
        ratios matter to the estimators, so no normalisation is applied.
    """
    if layout is not None and layout.equalize:
        return 1.0 / layout.row_sizes.astype(np.float64)
    if sample_weight is None:
        return np.ones(n_local)
    return np.asarray(sample_weight, dtype=np.float64)


def _totals(codes, values, n):
    """Column sums of ``values`` (m, k) grouped by ``codes`` into ``n`` groups -> (n, k)."""
    out = np.empty((n, values.shape[1]))
    for j in range(values.shape[1]):
        out[:, j] = np.bincount(codes, weights=values[:, j], minlength=n)
    return out


def cluster_moments(comm, values, layout=None, transform=None, include=None):
    """First and second moments of (transformed) cluster totals, over all ranks.

    Parameters
    ----------
    comm : native.comm.Communicator
    values : ndarray of float64, shape (n_local, k)
        Per-row vectors ``v_i``; rows outside ``include`` must be zero.
    layout : ClusterLayout or None
        ``None``: every row is its own cluster.
    transform : callable, optional
        ``transform(V) -> T`` mapping cluster totals ``V`` (m, k) to (m, k_out), row
        by row (the same on every rank). Default: identity.
    include : ndarray of bool, shape (n_local,), optional
        Rows that count; a cluster counts when it holds at least one such row.

    Returns
    -------
    first : ndarray, shape (k_out,)
        ``sum_c t(V_c)``.
    second : ndarray, shape (k_out, k_out)
        ``sum_c t(V_c) t(V_c)^T``.
    n_clusters : int
        Clusters (rows without clusters) with at least one included row.

    Notes
    -----
    One allreduce on every rank count. Clusters split across ranks have their totals
    summed in that allreduce before ``transform`` runs; all other clusters are
    transformed where their rows live and only their moments travel.
    """
    values = np.asarray(values, dtype=np.float64)
    n, k = values.shape
    inc = np.ones(n, bool) if include is None else np.asarray(include, bool)
    t = (lambda V: V) if transform is None else transform
    if layout is None:
        local = t(values[inc])
        k_out = local.shape[1] if local.ndim == 2 else _out_width(t, k)
        flat = _pack_moments(local, k_out, float(inc.sum()))
        if comm.size > 1:
            flat = col.allreduce(comm, flat)
        return _unpack_moments(flat, k_out)
    codes = layout.codes
    here = np.bincount(codes[inc], minlength=layout.n_clusters) > 0
    sh = layout.shared[codes]
    own = (sh < 0)
    own_totals = _totals(codes[own], values[own], layout.n_clusters)
    own_present = np.zeros(layout.n_clusters, bool)
    own_present[np.unique(codes[own & inc])] = True
    own_present &= layout.shared < 0
    local = t(own_totals[own_present])
    k_out = local.shape[1] if local.ndim == 2 and len(local) else _out_width(t, k)
    shared_tot = np.zeros((layout.n_shared, k + 1))
    if layout.n_shared:
        rows = ~own
        shared_tot[:, :k] = _totals(sh[rows], values[rows], layout.n_shared)
        present_here = here & (layout.shared >= 0)
        shared_tot[layout.shared[present_here], k] = 1.0
    flat = np.concatenate([_pack_moments(local, k_out, float(own_present.sum())), shared_tot.ravel()])
    if comm.size > 1:
        flat = col.allreduce(comm, flat)
    first, second, count = _unpack_moments(flat[: k_out + k_out * k_out + 1], k_out)
    if layout.n_shared:
        shared_tot = flat[k_out + k_out * k_out + 1:].reshape(layout.n_shared, k + 1)
        keep = shared_tot[:, k] > 0
        ts = t(shared_tot[keep, :k])
        first = first + ts.sum(axis=0)
        second = second + ts.T @ ts
        count += int(keep.sum())
    return first, second, count


def _out_width(transform, k):
    return transform(np.zeros((1, k))).shape[1]


def _pack_moments(T, k_out, count):
    T = np.asarray(T, dtype=np.float64).reshape(-1, k_out)
    return np.concatenate([T.sum(axis=0), (T.T @ T).ravel(), [count]])


def _unpack_moments(flat, k_out):
    first = flat[:k_out].copy()
    second = flat[k_out: k_out + k_out * k_out].reshape(k_out, k_out).copy()
    return first, second, int(round(flat[-1]))

"""Local linear effects from per-leaf tables, with bootstrap-of-little-bags variance.

:mod:`forest.analysis.local_linear` corrects a causal forest's effect at ``x`` by grf's
local linear regression (``ll.causal``): with forest weights ``alpha_i(x)``, the ridge
regression of ``Y~`` on ``d_i(x) = [1, X_i - x, W~_i, W~_i (X_i - x)]`` (``p`` correction
variables, ``D = 2p + 2`` regressors), whose ``W~`` coefficient is the effect. There the
sums ``M(x) = sum_i alpha_i g_i d_i d_i^T`` and ``b(x) = sum_i alpha_i g_i d_i Y~_i`` are
taken over the training rows at prediction, so the training rows must be passed again.

This module takes them from the trees instead. ``d_i(x) = T(x) u_i`` with
``u_i = [1, X_i, W~_i, W~_i X_i]`` and ``T(x)`` the identity less ``x`` in the two
shifted blocks, so ``M(x) = T(x) (sum_i alpha_i g_i u_i u_i^T) T(x)^T``, and because
``alpha_i(x)`` is the mean over trees of ``1[i in leaf_b(x)] / rows_b(x)``, the inner sum
is the mean over trees of per-leaf means of ``g u u^T`` (likewise ``b``). A forest that
keeps, per leaf, the mean over its estimation rows of :func:`leaf_terms` (the upper
triangle of ``g u u^T``, then ``g u Y~``) therefore has the local linear estimate at any
``x`` without its training rows (:func:`local_linear_effect`), and each tree's own share
of it, which gives the variance the way :mod:`forest.analysis.inference` gives the
forest's:

``tau(x) = beta_W`` solves ``(M + lambda P(M)) beta = b`` (``P`` the penalty of
:func:`forest.analysis.local_linear.ridge_penalty`, linear in ``M``). Linearised in the
per-tree tables, tree ``b`` deviates by

    psi_b = c^T (b_b - M_b beta - lambda P(M_b) beta),   c = (M + lambda P(M))^{-1} e_W,

whose forest average is exactly zero (the normal equations); ``psi_b`` is a linear
function ``l(x)`` of tree ``b``'s table, so it costs one dot product per tree. The
bootstrap of little bags of the forest average of ``psi_b`` is
:func:`forest.analysis.inference.ratio_blb_variance` with unit denominators (the same
between-group / within-group correction and non-negative posterior mean as the causal
forest's :func:`forest.analysis.inference.blb_variance`). With a huge ``lambda`` every
slope is penalised away, the regression is of ``Y~`` on ``[1, W~]``, and both the
estimate and ``psi_b`` become the causal forest's (tests).

The correction variables are centred by a fixed reference (the training mean) before
the tables are formed, so the products stay well scaled; ``x`` is centred by the same.
A leaf that no estimation row reached holds its nearest non-empty ancestor's value, so
its table is that ancestor's: :func:`value_node_sums` sums the rows of each node's
subtree and gives every leaf its value node's sums. :func:`local_linear_reference` is
the slow statement (dense forest weights and the rows) the tables are tested against.
"""
import numpy as np

from forest.analysis.inference import ratio_blb_variance
from forest.analysis.local_linear import (_solve_stack, local_linear_causal_reference, local_linear_causal_solve,
                                          ridge_penalty)
from forest.engine.forest_weights import value_nodes

#: Query-tree-table cells per chunk of :func:`local_linear_blb` callers (bounds the gathered tables).
TABLE_CHUNK_CELLS = 8_000_000


def table_width(p):
    """Columns of a leaf table for ``p`` correction variables: ``D (D + 1) / 2 + D``, ``D = 2p + 2``."""
    D = 2 * int(p) + 2
    return D * (D + 1) // 2 + D


def table_columns(p, keep):
    """The columns of a ``p``-variable leaf table that make the table of the variables ``keep``.

    A table's entries are products of ``u = [1, Z, wc, wc Z]`` (:func:`leaf_terms`); those
    of a subset of the variables are the products of the sub-vector of ``u``, whose
    positions keep their order, so the smaller table is a column selection of the larger.

    Parameters
    ----------
    p : int
        Variables of the full table.
    keep : sequence of int
        Increasing positions (in ``0 .. p - 1``) of the variables kept.

    Returns
    -------
    ndarray of int64, shape (table_width(len(keep)),)
    """
    keep = [int(j) for j in keep]
    if not keep or sorted(set(keep)) != keep or keep[0] < 0 or keep[-1] >= p:
        raise ValueError(f"keep must be increasing distinct positions in [0, {p}), got {keep}")
    D = 2 * int(p) + 2
    sub = [0] + [1 + j for j in keep] + [p + 1] + [p + 2 + j for j in keep]
    row = np.concatenate([[0], np.cumsum(np.arange(D, 1, -1))])    # where row a of the upper triangle starts
    tri = [row[a] + (b - a) for i, a in enumerate(sub) for b in sub[i:]]
    return np.asarray(tri + [D * (D + 1) // 2 + a for a in sub], dtype=np.int64)


def leaf_terms(Z, wc, yc, g):
    """Per-row terms whose leaf means make a leaf table.

    Parameters
    ----------
    Z : ndarray of float64, shape (n, p)
        The rows' correction variables, centred by the fit's reference.
    wc, yc : ndarray of float64, shape (n,)
        Centred treatment ``W - e(X)`` and outcome ``Y - m(X)``.
    g : ndarray of float64, shape (n,)
        Row weights (as in the forest's leaf moments).

    Returns
    -------
    ndarray of float64, shape (n, table_width(p))
        The upper triangle of ``g u u^T`` (row-major), then ``g u yc``; ``u = [1, Z, wc, wc Z]``.
    """
    Z = np.asarray(Z, dtype=np.float64)
    n, p = Z.shape
    wc = np.asarray(wc, dtype=np.float64).reshape(n, 1)
    u = np.hstack([np.ones((n, 1)), Z, wc, wc * Z])
    iu, ju = np.triu_indices(2 * p + 2)
    gu = np.asarray(g, dtype=np.float64).reshape(n, 1) * u
    return np.hstack([gu[:, iu] * u[:, ju], gu * np.asarray(yc, dtype=np.float64).reshape(n, 1)])


def value_node_sums(packed, leaf_sums, count_col):
    """Each node's sums over the estimation rows its value comes from.

    A leaf no estimation row reached took its nearest non-empty ancestor's value
    (:func:`forest.engine.honest_forest.fill_empty_from_parent`); that ancestor's rows
    are the estimation rows of every leaf below it (:mod:`forest.engine.forest_weights`).

    Parameters
    ----------
    packed : dict
        Packed forest (children have larger ids than their parents).
    leaf_sums : ndarray, shape (n_nodes, k)
        Sums over the estimation rows that end in each leaf (zero rows for inner nodes).
    count_col : int
        Column of ``packed["value"]`` holding the node's estimation row count.

    Returns
    -------
    ndarray, shape (n_nodes, k)
        Row ``v``: the sums of node ``value_nodes(packed)[v]``'s subtree.
    """
    feature = np.asarray(packed["feature"])
    left, right = np.asarray(packed["left"], dtype=np.int64), np.asarray(packed["right"], dtype=np.int64)
    sums = np.array(leaf_sums, dtype=np.float64, copy=True)
    # inner nodes level by level from the roots; then subtree sums from the deepest level up
    frontier = np.asarray(packed["tree_offsets"], dtype=np.int64)[:-1]
    levels = []
    while len(frontier):
        inner = frontier[feature[frontier] >= 0]
        levels.append(inner)
        frontier = np.concatenate([left[inner], right[inner]])
    for inner in reversed(levels):
        sums[inner] = sums[left[inner]] + sums[right[inner]]
    return sums[value_nodes(packed, count_col)]


def _shift(x):
    """``T(x)``, shape (n, D, D): ``d = T(x) u``."""
    n, p = x.shape
    D = 2 * p + 2
    T = np.broadcast_to(np.eye(D), (n, D, D)).copy()
    T[:, 1:p + 1, 0] = -x
    T[:, p + 2:, p + 1] = -x
    return T


def local_sums(tables, x):
    """``(M(x), b(x))`` from averaged leaf tables.

    Parameters
    ----------
    tables : ndarray, shape (n, table_width(p))
        Mean over trees of the leaf tables each query reaches.
    x : ndarray of float64, shape (n, p)
        Query points, centred by the same reference as the tables.

    Returns
    -------
    M : ndarray, shape (n, D, D)
    b : ndarray, shape (n, D, 1)
        :func:`forest.analysis.local_linear.local_linear_causal_sums`' sums over the
        forest weights (up to one positive factor per query, which the solve ignores).
    """
    x = np.asarray(x, dtype=np.float64)
    n, p = x.shape
    D = 2 * p + 2
    n_tri = D * (D + 1) // 2
    iu, ju = np.triu_indices(D)
    Mu = np.empty((n, D, D))
    Mu[:, iu, ju] = tables[:, :n_tri]
    Mu[:, ju, iu] = tables[:, :n_tri]
    T = _shift(x)
    M = T @ Mu @ np.swapaxes(T, 1, 2)
    b = T @ tables[:, n_tri:n_tri + D, None]
    return M, b


def local_linear_effect(tables, x, ll_lambda, weight_penalty=False):
    """Local linear effects from averaged leaf tables (grf's ``ll.causal`` estimate).

    Parameters
    ----------
    tables : ndarray, shape (n, table_width(p))
    x : ndarray, shape (n, p)
    ll_lambda : float
    weight_penalty : bool

    Returns
    -------
    ndarray, shape (n,)
        NaN where the penalised system is singular.
    """
    M, b = local_sums(np.asarray(tables, dtype=np.float64), x)
    return local_linear_causal_solve(M, b, float(ll_lambda), bool(weight_penalty))[:, 0]


def tree_functional(tables, x, ll_lambda, weight_penalty=False):
    """The estimate and the linear map from one tree's table to its deviation ``psi_b``.

    Parameters
    ----------
    tables : ndarray, shape (n, table_width(p))
        Mean over trees of the tables each query reaches.
    x : ndarray, shape (n, p)
    ll_lambda : float
    weight_penalty : bool

    Returns
    -------
    tau : ndarray, shape (n,)
        NaN where the penalised system is singular.
    ell : ndarray, shape (n, table_width(p))
        ``psi_b = tree_table_b . ell`` (zeros where ``tau`` is NaN); ``tables . ell = 0``.
    """
    tables = np.asarray(tables, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    n, p = x.shape
    D = 2 * p + 2
    w = p + 1                                   # the W~ coefficient
    unpen = (0, w)
    M, b = local_sums(tables, x)
    idx, scale = ridge_penalty(M, weight_penalty, unpen)
    A = M.copy()
    A[:, idx, idx] += ll_lambda * scale
    rhs = np.zeros((n, D, 2))
    rhs[:, :, 0] = b[:, :, 0]
    rhs[:, w, 1] = 1.0
    sol = _solve_stack(A, rhs) if n else rhs
    beta, c = sol[:, :, 0], sol[:, :, 1]        # A symmetric: c is the W~ row of A^{-1}
    tau = beta[:, w].copy()
    bad = ~np.isfinite(sol).all(axis=(1, 2))
    beta[bad], c[bad] = 0.0, 0.0
    # d/dM of c^T (M beta + lambda P(M) beta): c beta^T plus the penalty's adjoint, read off
    # ridge_penalty applied to unit matrices (it is linear in M)
    units = np.eye(D * D).reshape(D * D, D, D)
    _, unit_scale = ridge_penalty(units, weight_penalty, unpen)          # (D*D, q)
    G = c[:, :, None] * beta[:, None, :]
    G += ll_lambda * ((c[:, idx] * beta[:, idx]) @ unit_scale.T).reshape(n, D, D)
    T = _shift(x)
    TT = np.swapaxes(T, 1, 2)
    ell_M = TT @ G @ T
    ell_b = (TT @ c[:, :, None])[:, :, 0]
    iu, ju = np.triu_indices(D)
    fold = ell_M[:, iu, ju] + np.where(iu != ju, ell_M[:, ju, iu], 0.0)
    ell = np.hstack([-fold, ell_b])
    ell[bad] = 0.0
    tau[bad] = np.nan
    return tau, ell


def local_linear_blb(tree_tables, x, ll_lambda, weight_penalty=False, ci_group_size=2):
    """Local linear effect and its bootstrap-of-little-bags variance at query points.

    Parameters
    ----------
    tree_tables : ndarray, shape (n, B, table_width(p))
        The table of the leaf each query reaches in each tree; trees ``q*L .. q*L+L-1``
        form little bag ``q`` (``L = ci_group_size``), as the forest grew them.
    x : ndarray, shape (n, p)
    ll_lambda : float
    weight_penalty : bool
    ci_group_size : int
        ``L >= 2``.

    Returns
    -------
    tau, var : ndarray, shape (n,)
        The estimate over all trees, and its variance (module docstring); NaN where the
        penalised system is singular.
    """
    tree_tables = np.asarray(tree_tables, dtype=np.float64)
    n, B, _ = tree_tables.shape
    tau, ell = tree_functional(tree_tables.mean(axis=1), x, ll_lambda, weight_penalty)
    psi = np.einsum("nbw,nw->nb", tree_tables, ell)
    ones = np.ones((n, B, 1))
    _, var = ratio_blb_variance(np.concatenate([psi[..., None], ones, ones], axis=2), 1, ci_group_size)
    var = var[:, 0]
    var[~np.isfinite(tau)] = np.nan
    return tau, var


def local_linear_reference(alpha, Z, wc, yc, g, x, ll_lambda, weight_penalty=False):
    """One query's estimate from dense forest weights ``alpha (n,)`` and the rows (the tables' meaning).

    ``g`` enters as a factor of each row's weight, as in the forest's leaf moments.
    """
    return local_linear_causal_reference(np.asarray(alpha) * np.asarray(g), Z, wc, np.asarray(yc).reshape(-1, 1), x,
                                         ll_lambda, weight_penalty)[0]

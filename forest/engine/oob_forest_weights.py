"""Out-of-bag forest weights: a training row's weights over the trees that left it out.

grf's out-of-bag predictions of its weight-based estimators (local linear prediction and
its ``ll.lambda`` tuning among them) give a training row ``j`` the forest weights of the
trees whose subsample did not hold ``j``:

    alpha_i^oob(x_j) = sum_{b: j out of bag} 1[i in V_b(x_j)] f_i / rows_b(x_j)  /  D^oob(x_j),

with ``V_b``, ``rows_b``, ``f_i`` and the normaliser as in :mod:`forest.engine.forest_weights`
(``D^oob`` sums only the out-of-bag trees). Row ``j`` itself never gets weight: it is in
no estimation half of a tree that left it out. "Out of bag" is subsample code ``OUT``
(:mod:`forest.engine.subsample`): a row of a drawn cluster that the tree did not keep
is not out of bag (grf draws clusters).

The query rows are given by their leaves with the trees they were in the bag for
masked out (leaf ``-1``), so under ``mpirun`` a rank gathers the other ranks' training
rows as one int32 array (:func:`oob_query_leaves`) and adds its own estimation rows, as
:func:`forest.engine.forest_weights.forest_weights` does for ordinary queries. The
weights themselves are that function's (a ``-1`` leaf is a tree that does not count):
this module only masks the leaves.
"""
import numpy as np

from forest.engine.forest_weights import forest_weights, forest_weights_reference
from forest.engine.subsample import OUT


def oob_query_leaves(leaves, codes):
    """Leaves of training rows as out-of-bag queries: ``-1`` where the row was in the tree's bag.

    Parameters
    ----------
    leaves : ndarray of int, shape (n, n_trees)
        Tree-local leaf of each row (:func:`forest.engine.predictor.predict_leaves_binned`).
    codes : ndarray of int8, shape (n_trees, n)
        The rows' roles (:func:`forest.engine.subsample.forest_row_codes`).

    Returns
    -------
    ndarray of int32, shape (n, n_trees)
    """
    return np.ascontiguousarray(np.where(np.asarray(codes).T == OUT, leaves, -1), dtype=np.int32)


def oob_forest_weights(packed, query_leaves, slices, factor, count_col, norm_col=None):
    """Out-of-bag forest weights of training rows (as queries) over this rank's training rows.

    Parameters
    ----------
    packed : dict
        Packed forest.
    query_leaves : ndarray of int32, shape (n_query, n_trees)
        :func:`oob_query_leaves` of the query rows (``-1``: the tree does not count).
    slices : forest.engine.forest_weights.EstimationSlices
        This rank's estimation rows.
    factor : ndarray of float64, shape (n_local,)
    count_col, norm_col : int
        As :func:`forest.engine.forest_weights.forest_weights`.

    Returns
    -------
    indptr, indices, data
        CSR arrays of the ``(n_query, n_local)`` weights; a row with no out-of-bag tree
        (or only empty ones) has no entry.
    """
    return forest_weights(packed, query_leaves, slices, factor, count_col, norm_col)


def oob_forest_weights_reference(packed, query_leaves, train_leaves, codes, factor, count_col, norm_col=None):
    """Slow reference of :func:`oob_forest_weights`: the dense ``(n_query, n_local)`` matrix
    (:func:`forest.engine.forest_weights.forest_weights_reference`, which skips a query's ``-1`` trees)."""
    return forest_weights_reference(packed, query_leaves, train_leaves, codes, factor, count_col, norm_col)

"""``get_forest_weights``: one method for every honest forest (grf's ``get_forest_weights``).

The weights are computed by :mod:`forest.engine.forest_weights`; this module owns what the
estimators add: where the training rows come from, and how ranks share the work.

Training rows are not part of a model (a model file holds no training row). The weights
therefore need them: the fitting process keeps this rank's binned training rows, their
global row ids, per-row factors and cluster layout (``_weights_source_``, never written
to a file: the same codes the fit grew on, no copy), so ``get_forest_weights(X)`` works
right after ``fit``; a model loaded from a file takes the training data again,
``get_forest_weights(X, X_train=..., sample_weight=..., clusters=...)``, and checks that
these are exactly the fit's rows in the fit's order (the ``training_rows_`` fingerprint),
since the estimation halves are keyed by global row id.

Under ``mpirun`` each rank passes its own query rows; they are gathered in rank order, and
each rank returns the columns of its own training rows: ``(n_query over all ranks,
n_train on this rank)``. Concatenating the ranks' matrices along the columns in rank order
gives the single-process matrix, whose rows each sum to 1.
"""
import numpy as np

from native import collectives as col
from native.comm import world

from forest._validation import check_weight, validate_features
from forest.collective_checks import collective_checks
from forest.engine.clusters import resolve_clusters
from forest.engine.forest_weights import estimation_slices, forest_weights
from forest.engine.honest_forest import global_ids
from forest.engine.predictor import predict_leaves, predict_leaves_binned
from forest.engine.subsample import forest_row_codes
from forest.estimators.base import check_is_fitted

class WeightsSource:
    """This rank's training rows as a forest's weights need them.

    Attributes
    ----------
    codes : ndarray of uint8, shape (n_features, n_local)
    gids : ndarray of int64, shape (n_local,)
        Global row ids in the fit.
    factor : ndarray of float64, shape (n_local,)
        Per-row factor ``f_i`` (:mod:`forest.engine.forest_weights`).
    clusters : forest.engine.clusters.ClusterLayout or None
    """

    def __init__(self, codes, gids, factor, clusters):
        self.codes, self.gids, self.factor, self.clusters = codes, gids, factor, clusters


class ForestWeightsMixin:
    """Adds :meth:`get_forest_weights` to an honest forest.

    The estimator provides ``_weights_columns()`` -> ``(count_col, norm_col)`` of its
    leaf values, ``_weights_factor(sample_weight, n_local, comm)`` -> the per-row
    factors of rows passed again, and sets ``_weights_source_`` (a :class:`WeightsSource`)
    in ``fit``.
    """

    #: Never in model files: training rows are not part of a model.
    _model_io_exclude_ = ("_weights_source_",)

    def _keep_weights_source(self, codes, gids, factor, clusters):
        """Record this rank's training rows for :meth:`get_forest_weights` (fitting process only)."""
        self._weights_source_ = WeightsSource(codes, gids, np.ascontiguousarray(factor, dtype=np.float64), clusters)

    def apply(self, X):
        """The leaf each row reaches in each tree (grf's ``get_leaf_node``, scikit-learn's ``apply``).

        The leaves the forest weights are built from: two rows share a tree's leaf
        exactly when the tree counts each in the other's estimate.

        Parameters
        ----------
        X : array-like, shape (n, n_features)

        Returns
        -------
        ndarray of int32, shape (n, n_estimators)
            Node ids local to each tree (0 is the root), as ``export`` and the packed
            arrays number them from the tree's offset.
        """
        check_is_fitted(self, "estimators_")
        X = validate_features(self, X, reset=False, min_samples=0)
        return predict_leaves(self.estimators_, X)

    def _weights_factor(self, sample_weight, n_local, comm):
        """Per-row factors of training rows passed again (default: 1, the weight lives in the moments)."""
        return np.ones(n_local)

    def get_forest_weights(self, X, X_train=None, *, sample_weight=None, clusters=None, comm=None):
        """grf's forest weights ``alpha_i(x)`` of the query rows over the training rows.

        ``alpha_i(x)`` is how much training row ``i`` counts in the forest's estimate at
        ``x``: each tree gives the estimation rows of the leaf ``x`` falls in (an empty
        leaf: its nearest non-empty ancestor's) ``f_i / rows`` each, summed over trees
        and divided by the total, so each row of the result sums to 1. ``f_i`` is 1, or
        the rescaled sample weight for a regression or probability forest, whose
        prediction is the forest-level weighted mean: ``get_forest_weights(X) @ y``
        is ``predict(X)`` there. The effect forests' moments already carry the sample
        weights, so their ``alpha`` is grf's unweighted one.

        Parameters
        ----------
        X : array-like, shape (n_query_local, n_features)
            Query rows. Under ``mpirun`` each rank's rows are gathered in rank order.
        X_train : array-like, shape (n_local, n_features), optional
            This rank's training rows exactly as passed to ``fit`` (same rows, same
            order; checked against the model's training-row fingerprint). Without it
            the rows kept by the process that ran ``fit``; a model loaded from a file
            needs them.
        sample_weight : array-like, shape (n_local,), optional
            With ``X_train``: the fit's sample weights (regression and probability
            forests; the others ignore them).
        clusters : array-like, optional
            With ``X_train``: the fit's cluster labels, when it had clusters.
        comm : native.comm.Communicator, optional
            ``None`` means ``native.comm.world()``.

        Returns
        -------
        scipy.sparse.csr_matrix, shape (n_query, n_train_local)
            ``n_query`` counts every rank's query rows; the columns are this rank's
            training rows in ``fit``'s order.
        """
        from scipy import sparse

        comm = world() if comm is None else comm
        with collective_checks(comm):
            check_is_fitted(self, "estimators_")
            Xq = validate_features(self, X, reset=False, min_samples=0)
            if X_train is None:
                if sample_weight is not None or clusters is not None:
                    raise ValueError("sample_weight and clusters go with X_train: without X_train the fit's own rows "
                                     "are used")
                source = getattr(self, "_weights_source_", None)
                if source is None:
                    raise ValueError("forest weights need the training rows, which a model file does not hold: pass "
                                     "them again, get_forest_weights(X, X_train=..., sample_weight=...) (only the "
                                     "process that ran fit keeps them)")
                Xt = None
            else:
                Xt = validate_features(self, X_train, reset=False, min_samples=0)
                check_weight(sample_weight, len(Xt))
        if Xt is not None:
            source = self._source_from(Xt, sample_weight, clusters, comm)
        count_col, norm_col = self._weights_columns()
        packed = self.estimators_
        queries = col.allgatherv(comm, np.ascontiguousarray(Xq, dtype=np.float64).reshape(len(Xq), -1))
        query_leaves = predict_leaves(packed, queries)
        slices = self._estimation_slices(packed, source)
        indptr, indices, data = forest_weights(packed, query_leaves, slices, source.factor, count_col, norm_col)
        return sparse.csr_matrix((data, indices, indptr), shape=(len(queries), len(source.gids)))

    def _training_codes(self, X, comm, clusters=None):
        """``(codes (n_features, n), gids (n,), cluster layout or None)`` of this rank's training rows.

        The rows the process that ran ``fit`` kept (``X`` None), or ``X`` again, validated over
        the ranks (collective), with the fit's clusters when it had them. Every out-of-bag
        method reads its rows through this.
        """
        check_is_fitted(self, "estimators_")
        fitted_clusters = self.sampling_.get("clusters", False)
        if X is None:
            if clusters is not None:
                raise ValueError("clusters go with X: without X the fit's own rows and clusters are used")
            source = getattr(self, "_weights_source_", None)
            if source is None:
                raise ValueError("out-of-bag estimates without X exist only in the process that ran fit; pass the "
                                 "training rows X")
            return source.codes, source.gids, source.clusters
        comm = world() if comm is None else comm
        with collective_checks(comm):
            X = validate_features(self, X, reset=False, min_samples=0)
        gids, _ = global_ids(comm, len(X))
        layout = resolve_clusters(clusters, comm, len(X), getattr(self, "equalize_cluster_weights", False), None,
                                  fitted=fitted_clusters)
        return self.bin_mapper_.transform(X), gids, layout

    def _estimation_slices(self, packed, source):
        """:func:`forest.engine.forest_weights.estimation_slices` of this rank's training rows."""
        n_trees = len(packed["tree_offsets"]) - 1
        codes = forest_row_codes(self.sampling_, n_trees, source.gids, source.clusters)
        leaves = predict_leaves_binned(packed, source.codes, self.bin_mapper_.missing_bin_)
        return estimation_slices(packed, leaves, codes)

    def _source_from(self, X_train, sample_weight, clusters, comm):
        """A :class:`WeightsSource` of training rows passed again, checked against the fingerprint (collective)."""
        fitted_clusters = self.sampling_.get("clusters", False)
        match, codes, gids = self._match_codes(X_train, None, comm)
        with collective_checks(comm):
            if getattr(self, "training_rows_", None) is None:
                raise ValueError("this model records no training-data fingerprint, so X_train cannot be checked "
                                 "against its training rows; refit it to compute forest weights")
            if match.kind != "training":
                raise ValueError("X_train is not this model's training data as fitted (the same rows in the same "
                                 "order, each rank its own block): the trees' estimation halves are keyed by row "
                                 "position, so other rows have no forest weights")
        layout = resolve_clusters(clusters, comm, len(X_train), getattr(self, "equalize_cluster_weights", False),
                                  None, fitted=fitted_clusters)
        factor = self._weights_factor(sample_weight, len(X_train), comm)
        return WeightsSource(codes, gids, factor, layout)

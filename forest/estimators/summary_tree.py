"""CateSummaryTree: one shallow honest tree that tells the effect's story in a few groups.

EconML's ``SingleTreeCateInterpreter`` fits a shallow tree to a model's CATE estimates;
this one fits it to the doubly robust scores (grf's ``get_scores``), honestly: the tree is
grown on one half of the rows (a one-tree :class:`forest.RegressionForest` with the whole
sample, honesty and every feature tried), and each node's effect is the weighted mean of
the scores of the other half, with a standard error from those rows (cluster-robust when
the forest had clusters). So a leaf's interval is a valid interval for the average effect
of the rows it describes, which a tree fitted to CATE estimates cannot give.

The scores are the forest's out-of-bag ones (training rows) or held-out ones; everything
is collective under ``mpirun`` and the same at any rank count.
"""
from statistics import NormalDist

import numpy as np

from native.comm import world

from forest._validation import _check_feature_names
from forest.engine.clusters import cluster_moments
from forest.engine.honest_forest import global_ids
from forest.engine.subsample import ESTIMATION, forest_row_codes
from forest.engine.tree import unpack_trees
from forest.engine.tree_text import tree_text
from forest.estimators.base import EstimatorBase, check_is_fitted
from forest.estimators.regression_forest import RegressionForest
from forest.io import model_checks, model_io

#: Structure-half rows per leaf when ``min_samples_leaf`` is not given.
DEFAULT_MIN_SAMPLES_LEAF = 50


class CateSummaryTree(EstimatorBase):
    """A shallow honest tree of a causal forest's doubly robust scores (see the module docstring).

    Parameters
    ----------
    max_depth : int, default 2
    min_samples_leaf : int or None, default None
        Fewest structure-half rows per leaf (None: 50).
    honesty_fraction : float, default 0.5
        Share of the rows that grow the tree; the others estimate its nodes' effects.
    max_bins : int, default 255
    random_state : int or None, default None (means 0)
        Seed of the honest split and of the binning sample.

    Attributes
    ----------
    tree_ : forest.engine.tree.Tree
    node_effect_, node_stderr_ : ndarray of float64, shape (node_count,)
        Each node's average effect (the weighted mean score of its estimation rows) and its
        standard error; NaN for a node without estimation rows.
    node_rows_ : ndarray of int64, shape (node_count,)
        Estimation rows per node (over all ranks).
    forest_ : RegressionForest
        The one-tree forest that routes rows.
    n_features_in_, feature_names_in_
    """

    #: The tree is the routing forest's one tree, unpacked again on loading (not stored twice).
    _model_io_exclude_ = ("tree_",)

    def _model_io_restore_(self):
        if "forest_" in self.__dict__:
            self.tree_ = unpack_trees(self.forest_.estimators_)[0]

    def __init__(self, max_depth=2, *, min_samples_leaf=None, honesty_fraction=0.5, max_bins=255, random_state=None):
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.honesty_fraction = honesty_fraction
        self.max_bins = max_bins
        self.random_state = random_state

    def _check_params(self):
        """Validate the parameters (``fit`` and model-file loading run it); returns the seed."""
        if isinstance(self.max_depth, bool) or not isinstance(self.max_depth, (int, np.integer)) or \
                not 1 <= self.max_depth <= 6:
            raise ValueError(f"max_depth must be an int in [1, 6], got {self.max_depth!r}")
        m = self.min_samples_leaf
        if m is not None and (isinstance(m, bool) or not isinstance(m, (int, np.integer)) or m < 1):
            raise ValueError(f"min_samples_leaf must be an int >= 1 or None, got {m!r}")
        # the routing forest checks the rest (honesty_fraction, max_bins, random_state)
        return self._routing_forest()._check_params()

    def _routing_forest(self):
        leaf_min = DEFAULT_MIN_SAMPLES_LEAF if self.min_samples_leaf is None else self.min_samples_leaf
        return RegressionForest(1, max_samples=1.0, honest=True, honesty_fraction=self.honesty_fraction,
                                min_samples_leaf=leaf_min, max_depth=int(self.max_depth), max_features=1.0,
                                max_bins=self.max_bins, ci_group_size=1, random_state=self.random_state)

    def fit(self, forest, X, t=None, y=None, *, sample_weight=None, clusters=None, comm=None):
        """Grow the tree on half of the rows' scores and estimate its nodes on the other half.

        Parameters
        ----------
        forest : CausalForest (or another forest with doubly robust scores)
            Fitted; one effect column.
        X : array-like, shape (n_local, n_features)
            The rows' features. Without ``t, y``: the forest's own training rows in
            training order (its out-of-bag scores, in the fitting process).
        t, y, sample_weight, clusters : optional
            Rows passed again, as in ``forest.average_treatment_effect(X=, t=, y=)``:
            the training rows get out-of-bag scores, other rows held-out ones.
        comm : native.comm.Communicator, optional

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        self._check_params()
        rows = forest._rows() if t is None and y is None else forest._rows(X, t, y, sample_weight, clusters, comm)
        K, M = rows.shape
        if K * M != 1:
            raise ValueError(f"a summary tree describes one effect; this forest has {K * M} effect columns")
        if len(X) != rows.n:
            raise ValueError(f"X has {len(X)} rows, the forest's scores {rows.n}: pass the rows the scores are of")
        score = rows.scores.reshape(rows.n)
        reg = self._routing_forest()
        reg.fit(X, score, sample_weight=rows.weight, comm=comm, clusters=rows.layout)
        del reg.oob_prediction_, reg.training_rows_                 # rows are not part of the model
        reg.__dict__.pop("_weights_source_", None)
        tree = unpack_trees(reg.estimators_)[0]
        gids, _ = global_ids(comm, rows.n)
        estimation = forest_row_codes(reg.sampling_, 1, gids, rows.layout)[0] == ESTIMATION
        on_path = _paths(tree, reg.apply(X)[:, 0])                # (n, node_count)
        self.node_effect_, self.node_stderr_, self.node_rows_ = _node_estimates(
            comm, on_path & estimation[:, None], score, rows.weight, rows.layout)
        self.forest_, self.tree_ = reg, tree
        self.n_features_in_ = reg.n_features_in_
        if getattr(reg, "feature_names_in_", None) is not None:
            self.feature_names_in_ = reg.feature_names_in_
        return self

    def apply(self, X):
        """Leaf (node id of ``tree_``) of each row, shape (n,)."""
        check_is_fitted(self, "tree_")
        return self.forest_.apply(X)[:, 0].astype(np.int64)

    def predict(self, X):
        """The average effect of each row's leaf, shape (n,)."""
        return self.node_effect_[self.apply(X)]

    def export_text(self, feature_names=None, decimals=4, alpha=0.05):
        """The tree as indented text, each leaf with its effect, ``1 - alpha`` interval and rows.

        Parameters
        ----------
        feature_names : list of str, optional
            Default: ``feature_names_in_`` (or ``x0, x1, ...``).
        decimals : int
        alpha : float

        Returns
        -------
        str
        """
        check_is_fitted(self, "tree_")
        names = getattr(self, "feature_names_in_", None) if feature_names is None else \
            _check_feature_names(feature_names, self.n_features_in_)
        fname = (lambda f: str(names[f])) if names is not None else (lambda f: f"x{f}")
        z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
        level = f"{100 * (1 - alpha):g}%"

        def leaf_text(node):
            e, s = self.node_effect_[node], self.node_stderr_[node]
            return (f"effect {e:.{decimals}g}  ({level} CI [{e - z * s:.{decimals}g}, {e + z * s:.{decimals}g}], "
                    f"se {s:.{decimals}g}; {int(self.node_rows_[node])} estimation rows)")

        return tree_text(self.tree_, fname, leaf_text, getattr(self.forest_, "category_coder_", None), decimals)


def _paths(tree, leaves):
    """``(n, node_count)`` bool: the nodes on each row's path from the root to its leaf."""
    parent = np.full(tree.node_count, -1, dtype=np.int64)
    for node in range(tree.node_count):
        for child in (tree.left[node], tree.right[node]):
            if child >= 0:
                parent[child] = node
    out = np.zeros((len(leaves), tree.node_count), dtype=bool)
    node = np.asarray(leaves, dtype=np.int64).copy()
    rows = np.arange(len(leaves))
    while len(rows):
        out[rows, node] = True
        node = parent[node]
        keep = node >= 0
        rows, node = rows[keep], node[keep]
    return out


def _node_estimates(comm, member, score, weight, layout):
    """Weighted mean score per node over its member rows, its standard error and row count (collective).

    The variance is the average's sandwich over clusters (rows without clusters), with the
    ``C / (C - 1)`` factor of :mod:`forest.analysis.average_effects`.
    """
    N = member.shape[1]
    w = np.where(member, weight[:, None], 0.0)                                    # (n, N)
    values = np.concatenate([w, w * score[:, None], member.astype(np.float64)], axis=1)
    effect, stderr, count = np.full(N, np.nan), np.full(N, np.nan), np.zeros(N, dtype=np.int64)
    for j in range(N):
        cols = [j, N + j, 2 * N + j]
        inc = member[:, j] & (weight > 0)
        first, second, C = cluster_moments(comm, values[:, cols] * inc[:, None], layout, include=inc)
        count[j] = int(round(first[2]))
        if first[0] <= 0:
            continue
        est = first[1] / first[0]
        effect[j] = est
        if C >= 2:
            ss = second[1, 1] - 2.0 * est * second[0, 1] + est * est * second[0, 0]
            stderr[j] = np.sqrt(max(ss, 0.0) * C / (C - 1)) / first[0]
    return effect, stderr, count


model_io.register(CateSummaryTree,
                  check=lambda est: model_checks.check_summary_tree(est, RegressionForest))

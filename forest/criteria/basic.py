"""Split criteria: from per-bin channel sums to split gains and node outputs.

This module owns the criterion *interface* every model in ``forest`` implements and
the two criteria the engine itself needs: Newton boosting (:class:`NewtonCriterion`)
and weighted variance reduction (:class:`VarianceCriterion`). The causal-forest
criterion lives with the causal forest and implements the same interface.

The interface (see :class:`Criterion`)
--------------------------------------
A criterion knows the meaning of its ``C`` channels (the per-row statistics that the
histogram kernel sums), so it also owns its constraints:

``gain(left, right, parent, parent_count=None) -> ndarray (...)``
    ``left`` and ``right`` are channel sums of the two children, shape ``(..., C)``;
    ``parent`` broadcasts against them (the splitter passes ``(n_nodes, 1, 1, 1, C)``
    against ``(n_nodes, n_features, n_bins, 2, C)``). Returns the improvement of the
    split over the unsplit parent, ``-inf`` wherever a constraint fails (too few rows
    or too little weight/hessian on a side, ...). ``parent_count`` (broadcastable to
    the result, optional) is the exact global row count of the parent, for criteria
    whose channels carry no count (Newton boosting); criteria with a count channel
    ignore it.
``node_value(stats (..., C)) -> (..., n_outputs)``
    The output vector a leaf with these sums gets.
``node_weight(stats (..., C)) -> (...)``
    The node's weight (count, sum of sample weights or hessian mass): the heavier
    child takes the missing values when the node has none.
``node_size(stats (..., C)) -> (...)``
    What growers compare with ``min_samples_split`` (and the local-finishing
    threshold); the base class returns ``node_weight``. Forests with sample weights
    count rows here, as grf does (:class:`VarianceCriterion` with a count channel).
``node_objective(stats (..., C)) -> (...)``
    The node's objective (stored as the tree's ``impurity``).
``node_count(stats (..., C)) -> (...)``
    The node's row count where the channels carry one (stored as the tree's
    ``count``); the base class returns ``node_weight``.

All four are vectorised NumPy over any leading shape and must be pure functions of
their inputs (every rank evaluates them on bitwise-identical reduced histograms, so
identical inputs must give identical outputs).
"""
from collections import namedtuple

import functools

import numpy as np

from forest._validation import as_columns
from histogram.jit import compiled_only

from forest.criteria.compiled import CompiledCriterion, register


def rows_and_mean_weight(stats):
    """Node values of forests whose leaves keep lists (quantile, survival): ``[rows, mean weight]``.

    Parameters
    ----------
    stats : ndarray of float64, shape (..., C)
        Channel sums with the weight first and the row count last.

    Returns
    -------
    ndarray of float64, shape (..., 2)
        Rows 0 when the weight is 0 (such a node counts as empty).
    """
    w = stats[..., 0]
    rows = np.where(w > 0, stats[..., -1], 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_weight = np.where(rows > 0, w / np.where(rows > 0, rows, 1.0), 0.0)
    return np.stack([rows, mean_weight], axis=-1)


class Criterion:
    """Base class of split criteria (see the module docstring).

    Attributes
    ----------
    n_channels : int
        ``C``, the channel count the histograms carry.
    n_outputs : int
        Length of a node's output vector.
    """

    n_channels = 0
    n_outputs = 0

    def gain(self, left, right, parent, parent_count=None):
        raise NotImplementedError

    def node_value(self, stats):
        raise NotImplementedError

    def node_weight(self, stats):
        raise NotImplementedError

    def node_objective(self, stats):
        return np.zeros(np.shape(stats)[:-1])

    def node_count(self, stats):
        return self.node_weight(stats)

    def node_size(self, stats):
        return self.node_weight(stats)

    def node_summary(self, stats, shrinkage=1.0):
        """``(weight, value * shrinkage, objective)`` of one node with sums ``stats (C,)``.

        The best-first grower calls this once per new node; a criterion may return the
        same numbers faster than the vectorised methods (:class:`NewtonCriterion`).
        """
        return (float(self.node_weight(stats)), self.node_value(stats) * shrinkage,
                float(self.node_objective(stats)))

    def compiled(self):
        """The criterion's pieces for the compiled growth kernels, or ``None``.

        Returns
        -------
        forest.criteria.compiled.CompiledCriterion or None
            ``None`` (the default) keeps the vectorised ``gain`` for every node.
        """
        return None

    def categorical_criterion(self):
        """The criterion that scores splits of categorical features (the same one by default)."""
        return self

    def category_keys(self, stats, parent, parent_count=None):
        """Sort keys of categories (:mod:`forest.engine.categorical_split`).

        The default evaluates the compiled ``bin_key`` piece, so both search paths sort
        by one rule.

        Parameters
        ----------
        stats : ndarray of float64, shape (N, F, B, C)
            Per-category channel sums of ``F`` features at ``N`` nodes.
        parent : ndarray of float64, shape (N, C)
            The nodes' channel sums.
        parent_count : ndarray, shape (N,), optional
            The nodes' row counts (unused here).

        Returns
        -------
        ndarray of float64, shape (N, F, B)
        """
        compiled = self.compiled()
        if compiled is None:
            raise ValueError(f"{type(self).__name__} has no rule to order categories; categorical features "
                             "need a criterion with one")
        stats = np.asarray(stats, dtype=np.float64)
        n, f, b, c = stats.shape
        return compiled.keys_of(stats.reshape(n, f * b, c), parent).reshape(n, f, b)

    def _check_stats(self, stats):
        stats = np.asarray(stats, dtype=np.float64)
        if stats.shape[-1] != self.n_channels:
            raise ValueError(f"{type(self).__name__} expects {self.n_channels} channels, got array of shape {stats.shape}")
        return stats


#: LightGBM's ``max_cat_threshold`` default: most categories on the small side of a boosting
#: split (:meth:`NewtonCriterion.categorical_scan`).
MAX_CAT_THRESHOLD = 32

#: Placeholder feature mask of the compiled Newton search (read only when masks are used).
#: Bins (features x value bins) from which boosting's numeric search runs a split step's two
#: children on two threads. Measured, 100 trees x 31 leaves on 2 threads, alternating with the
#: serial search: 200k x 100 features 4.0-4.3 -> 3.7-3.9 s a fit; 20k x 28 (7,168 bins) 0.52-0.56
#: -> 0.57-0.60 s, where waking a thread costs about what it saves.
PARALLEL_SEARCH_BINS = 8192
_NO_MASK = np.ones((1, 1), dtype=np.bool_)


@functools.lru_cache(maxsize=64)
def _categorical_positions(mask_bytes):
    """``(cat_index, cat_pos)`` of a categorical mask given as bool bytes: the categorical
    features' indices, and each feature's position among them (-1 if numeric).

    Cached: a grower passes the same mask at every split step (~3,000 a boosting fit), and
    building the two arrays is four NumPy calls each time. Callers must not write
    into the returned arrays (left writeable: a read-only array is another Numba type, so
    another compilation of the search kernel).
    """
    categorical = np.frombuffer(mask_bytes, dtype=bool)
    cat_index = np.flatnonzero(categorical).astype(np.int64)
    cat_pos = np.full(len(categorical), -1, dtype=np.int64)
    cat_pos[cat_index] = np.arange(len(cat_index))
    return cat_index, cat_pos


class NewtonCriterion(Criterion):
    """Second-order (Newton) boosting criterion, one or ``K`` outputs.

    Channels: ``[g_0 .. g_{K-1}, h_0 .. h_{K-1}]`` (gradient then hessian sums, with
    sample weights already multiplied in). The node score is
    ``sum_k G_k^2 / (H_k + lambda)``; the gain of a split is
    ``score(left) + score(right) - score(parent)`` and a leaf's value is
    ``-G_k / (H_k + lambda)``. With ``K > 1`` one tree carries a vector leaf (the
    multiclass model grows one tree per iteration, not ``K``).

    Parameters
    ----------
    n_outputs : int, default 1
        ``K``.
    l2_regularization : float, default 0.0
        ``lambda`` above.
    min_samples_leaf : int, default 1
        Fewest rows per child. The channels carry no count, so the child's count is
        estimated from its share of the parent's hessian mass times the parent's exact
        row count (``parent_count``), as LightGBM does; this is exact when every row has
        the same hessian (squared error without sample weights). Without
        ``parent_count`` the hessian mass itself is used.
    min_child_weight : float, default 1e-3
        Fewest total hessian per child.
    cat_smooth, cat_l2, min_data_per_group, max_cat_threshold
        Categorical splits, LightGBM's parameters of the same names: :meth:`category_keys`,
        :meth:`categorical_criterion`, :meth:`categorical_scan`.
    """

    def __init__(self, n_outputs=1, l2_regularization=0.0, min_samples_leaf=1, min_child_weight=1e-3,
                 cat_smooth=10.0, cat_l2=10.0, min_data_per_group=100, max_cat_threshold=MAX_CAT_THRESHOLD):
        if n_outputs < 1:
            raise ValueError(f"n_outputs must be >= 1, got {n_outputs}")
        if l2_regularization < 0:
            raise ValueError(f"l2_regularization must be >= 0, got {l2_regularization}")
        self.n_outputs = int(n_outputs)
        self.n_channels = 2 * self.n_outputs
        self.l2_regularization = float(l2_regularization)
        self.min_samples_leaf = max(int(min_samples_leaf), 1)
        self.min_child_weight = float(min_child_weight)
        self.cat_smooth = float(cat_smooth)
        self.cat_l2 = float(cat_l2)
        self.min_data_per_group = float(min_data_per_group)
        self.max_cat_threshold = int(max_cat_threshold)
        if self.max_cat_threshold < 1:
            raise ValueError(f"max_cat_threshold must be >= 1, got {max_cat_threshold}")

    def categorical_scan(self):
        """``(max_cat_threshold, min_data_per_group)``: which category subsets a split may take.

        LightGBM's scan of a node's sorted categories: the ``i`` lowest or the ``i`` highest
        judged categories (:meth:`category_keys`) on one side, ``i`` at most
        ``max_cat_threshold`` and half the judged ones, at points where the categories added
        since the last candidate hold ``min_data_per_group`` rows
        (:func:`forest.engine.categorical_split.group_categories_kernel`). Scanning every
        prefix of up to 1,000 sorted categories overfit: benchmarks/bench_categorical.py's
        design at 200,000 rows lost 0.004 AUC that way once the categories of 10 to 100 rows
        were judged.
        """
        return self.max_cat_threshold, self.min_data_per_group

    def category_keys(self, stats, parent, parent_count=None):
        """Category keys of boosting: ``G / (H + cat_smooth)`` summed over outputs (LightGBM's
        order; the smoothing keeps a category of few rows from sorting to an end on noise).

        With the nodes' row counts, a category of fewer than ``cat_smooth`` rows (estimated
        from its share of the node's hessian, as ``min_samples_leaf`` is) gets an infinite
        key: it is not judged, and goes with the middle of the order
        (:meth:`categorical_scan`; LightGBM leaves such categories out of its sorted scan).

        An earlier rule left out every category under ``min_data_per_group`` (100) rows:
        where categories hold a few dozen rows each, nearly all were then scanned in code
        order (benchmarks/bench_categorical.py's design at 20,000 rows: held-out AUC 0.779
        against LightGBM's 0.805).

        Parameters and result as :meth:`Criterion.category_keys`; ``parent_count`` (N,).
        """
        stats = np.asarray(stats, dtype=np.float64)
        k = self.n_outputs
        keys = (stats[..., :k] / (stats[..., k:] + self.cat_smooth)).sum(axis=-1)
        if parent_count is not None and self.cat_smooth > 1:
            hp = self._hess(np.asarray(parent, dtype=np.float64))
            with np.errstate(invalid="ignore", divide="ignore"):
                per_hess = np.where(hp > 0, np.asarray(parent_count, dtype=np.float64) / hp, 0.0)
            rows = self._hess(stats) * per_hess.reshape((-1,) + (1,) * (stats.ndim - 2))
            keys = np.where(rows < self.cat_smooth, np.inf, keys)
        return keys

    def categorical_criterion(self):
        """The criterion that scores categorical splits: ``cat_l2`` more L2 regularisation
        (LightGBM's ``cat_l2``: a category subset is chosen among many more candidates than a
        threshold, so its gain is shrunk against that selection)."""
        if self.cat_l2 == 0.0:
            return self
        return NewtonCriterion(self.n_outputs, self.l2_regularization + self.cat_l2, self.min_samples_leaf,
                               self.min_child_weight, self.cat_smooth, 0.0, self.min_data_per_group,
                               self.max_cat_threshold)

    @staticmethod
    def make_channels(gradient, hessian, out=None):
        """Pack gradients and hessians into the ``(n, 2K)`` channel array."""
        g = as_columns(gradient)
        h = as_columns(hessian)
        if out is None:
            out = np.empty((g.shape[0], g.shape[1] + h.shape[1]), dtype=np.float64)
        out[:, : g.shape[1]] = g
        out[:, g.shape[1]:] = h
        return out

    def _score(self, stats):
        k = self.n_outputs
        g = stats[..., :k]
        h = stats[..., k:]
        denom = h + self.l2_regularization
        with np.errstate(divide="ignore", invalid="ignore"):
            s = np.where(denom > 0, g * g / np.where(denom > 0, denom, 1.0), 0.0)
        return s.sum(axis=-1) if k > 1 else s[..., 0]

    def _hess(self, stats):
        k = self.n_outputs
        return stats[..., k:].sum(axis=-1) if k > 1 else stats[..., k]

    def gain(self, left, right, parent, parent_count=None):
        left = np.asarray(left, dtype=np.float64)
        right = np.asarray(right, dtype=np.float64)
        parent = np.asarray(parent, dtype=np.float64)
        g = self._score(left) + self._score(right) - self._score(parent)
        hl, hr = self._hess(left), self._hess(right)
        ok = (hl >= self.min_child_weight) & (hr >= self.min_child_weight)
        if parent_count is None:
            cl, cr = hl, hr
        else:
            hp = self._hess(parent)
            with np.errstate(divide="ignore", invalid="ignore"):
                factor = np.where(hp > 0, np.asarray(parent_count, dtype=np.float64) / np.where(hp > 0, hp, 1.0), 0.0)
            cl, cr = hl * factor, hr * factor
        ok &= (cl >= self.min_samples_leaf) & (cr >= self.min_samples_leaf)
        return np.where(ok, g, -np.inf)

    def node_value(self, stats):
        stats = self._check_stats(stats)
        k = self.n_outputs
        denom = stats[..., k:] + self.l2_regularization
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(denom > 0, -stats[..., :k] / np.where(denom > 0, denom, 1.0), 0.0)

    def node_weight(self, stats):
        return self._hess(self._check_stats(stats))

    def numba_search(self, hist, parent, nb, missing_bin, feature_mask, parent_count, min_gain, rel_tol, result):
        """Compiled split search for this criterion (see :mod:`forest.engine.splitting`).

        Fills ``result`` (a ``SplitResult`` of ``hist.shape[0]`` nodes) in place with
        what the vectorised search would return.
        """
        import numba

        from forest.engine.splitting import _newton_nodes_parallel, _newton_search_kernel

        n_nodes, n_features = hist.shape[:2]
        mask = _NO_MASK if feature_mask is None else feature_mask.astype(np.bool_)
        count = np.zeros(1) if parent_count is None else parent_count
        # Nodes on separate threads when there are two or more (a split step's children) and each
        # node's scan is long enough to pay for waking a thread (PARALLEL_SEARCH_BINS).
        parallel = n_nodes > 1 and n_features * missing_bin >= PARALLEL_SEARCH_BINS and numba.get_num_threads() > 1
        search = _newton_nodes_parallel if parallel else _newton_search_kernel
        search(hist, np.ascontiguousarray(parent, dtype=np.float64), np.asarray(nb, dtype=np.int64), missing_bin,
               mask, feature_mask is not None, count, parent_count is not None, self.n_outputs,
               self.l2_regularization, float(self.min_samples_leaf), self.min_child_weight, min_gain, rel_tol,
               result.feature, result.bin, result.missing_left, result.gain, result.left_stats, result.right_stats)

    def numba_categorical_search(self, hist, parent, nb, missing_bin, feature_mask, parent_count, min_gain, rel_tol,
                                 result, categorical):
        """Compiled split search with categorical features (``categorical`` bool ``(n_features,)``).

        Fills ``result`` in place (its ``cat_bits`` zero on entry) with what
        :func:`forest.engine.splitting.find_best_splits`' NumPy categorical branch returns for
        this criterion: keys of :meth:`category_keys`, the subset scan at ``cat_l2`` more
        regularisation (:meth:`categorical_criterion`), bitsets of the left categories.
        """
        import numba

        from forest.engine.splitting import _newton_categorical_kernel, _newton_categorical_nodes_parallel

        cat_index, cat_pos = _categorical_positions(np.asarray(categorical, dtype=bool).tobytes())
        mask = _NO_MASK if feature_mask is None else feature_mask.astype(np.bool_)
        count = np.zeros(1) if parent_count is None else parent_count
        # Nodes on separate threads when there are two or more (a split step's children).
        search = _newton_categorical_nodes_parallel if hist.shape[0] > 1 and numba.get_num_threads() > 1 \
            else _newton_categorical_kernel
        search(hist, np.ascontiguousarray(parent, dtype=np.float64), np.asarray(nb, dtype=np.int64), missing_bin,
               mask, feature_mask is not None, count, parent_count is not None, cat_index, cat_pos, self.n_outputs,
               self.l2_regularization, self.cat_l2 != 0.0, self.l2_regularization + self.cat_l2, self.cat_smooth,
               self.max_cat_threshold, self.min_data_per_group, float(self.min_samples_leaf), self.min_child_weight,
               min_gain, rel_tol,
               result.feature, result.bin, result.missing_left, result.gain, result.left_stats, result.right_stats,
               result.cat_bits)

    def node_objective(self, stats):
        return -self._score(self._check_stats(stats))

    def node_summary(self, stats, shrinkage=1.0):
        """:meth:`Criterion.node_summary`; one output in Python arithmetic on ``(G, H)``.

        The same IEEE operations as the array methods, without their per-call
        overhead (boosting adds two nodes per split step).
        """
        if self.n_outputs != 1:
            return super().node_summary(stats, shrinkage)
        g, h = float(stats[0]), float(stats[1])
        d = h + self.l2_regularization
        value, score = (-g / d, g * g / d) if d > 0 else (0.0, 0.0)
        return h, (value * shrinkage,), -score


class VarianceCriterion(Criterion):
    """Weighted variance reduction (CART regression), one or more targets.

    Channels: ``[w, w*y_0 .. w*y_{T-1}]`` plus, with ``count_channel=True``, a last
    channel of ones (the row count). With it every size limit counts rows, as grf's
    do: ``min_samples_leaf`` per child and ``min_samples_split`` (:meth:`node_size`);
    the weights weigh the gain, the node values and the missing-value direction only.
    So the forest is the same whatever the weights' scale, and a weight of 2 equals two
    copies of the row wherever no size limit binds (grf's trade: weights that counted
    as rows in the limits would make the forest change with their scale).
    The gain ``sum_t S_L^2/W_L + S_R^2/W_R - S_P^2/W_P`` equals the drop in the
    weighted sum of squared errors; the node value is ``S / W``.

    Parameters
    ----------
    n_targets : int, default 1
    min_samples_leaf : int, default 1
        Fewest rows per child (count channel if present, else weight).
    min_weight_leaf : float, default 0.0
        Fewest total sample weight per child (always ``> 0``).
    count_channel : bool, default False
    alpha : float, default 0.0
        grf's balance rule: each child also needs ``ceil(alpha * rows of the node)`` rows
        (count channel if present, else weight), in ``[0, 0.25]``.
    imbalance_penalty : float, default 0.0
        grf's ``imbalance.penalty``: a split's gain loses ``imbalance_penalty * (1/n_L +
        1/n_R)`` (rows, or weight without a count channel), in the gain's own units.
    rows_are_weights : bool, default False
        Every row weighs exactly 1, so the weight channel counts the rows: no count
        channel (``count_channel`` is ignored), and the compiled kernels may skip sides
        of fewer than ``min_samples_leaf`` rows before scoring them, as with a count
        channel. The same gains, splits and node sums as ``count_channel=True`` on those
        rows, with one channel fewer.
    """

    def __init__(self, n_targets=1, min_samples_leaf=1, min_weight_leaf=0.0, count_channel=False, alpha=0.0,
                 imbalance_penalty=0.0, rows_are_weights=False):
        if n_targets < 1:
            raise ValueError(f"n_targets must be >= 1, got {n_targets}")
        self.n_targets = int(n_targets)
        self.n_outputs = self.n_targets
        self.rows_are_weights = bool(rows_are_weights)
        self.count_channel = bool(count_channel) and not self.rows_are_weights
        self.n_channels = 1 + self.n_targets + (1 if self.count_channel else 0)
        self.min_samples_leaf = max(int(min_samples_leaf), 1)
        self.min_weight_leaf = float(min_weight_leaf)
        self.alpha = float(alpha)
        if not imbalance_penalty >= 0:
            raise ValueError(f"imbalance_penalty must be >= 0, got {imbalance_penalty}")
        self.imbalance_penalty = float(imbalance_penalty)

    def min_child_size(self, parent):
        """Fewest rows (or weight) a child of a node with sums ``parent`` (..., C) needs, shape (...).

        ``max(min_samples_leaf, ceil(alpha * size))``; the compiled kernels compute the
        same number in :func:`variance_prepare`.
        """
        return np.maximum(float(self.min_samples_leaf), np.ceil(self.alpha * self.node_size(parent)))

    def make_channels(self, y, sample_weight=None):
        """Build the ``(n, C)`` channel array.

        Parameters
        ----------
        y : array-like, shape (n,) or (n, n_targets)
        sample_weight : array-like, shape (n,), optional
        """
        y, w = self._targets_and_weight(y, sample_weight)
        out = np.empty((len(y), self.n_channels), dtype=np.float64)
        out[:, 0] = w
        out[:, 1:1 + self.n_targets] = w[:, None] * y
        if self.count_channel:
            out[:, -1] = 1.0
        return out

    def _targets_and_weight(self, y, sample_weight):
        """``(y (n, n_targets), w (n,))``: the targets checked and the weights (ones when None)."""
        y = as_columns(y)
        if y.shape[1] != self.n_targets:
            raise ValueError(f"expected {self.n_targets} targets, got y of shape {y.shape}")
        w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        return y, w

    def _score(self, stats):
        w = stats[..., 0]
        s = stats[..., 1:1 + self.n_targets]
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(w[..., None] > 0, s * s / np.where(w > 0, w, 1.0)[..., None], 0.0)
        return q.sum(axis=-1)

    def gain(self, left, right, parent, parent_count=None):
        left = np.asarray(left, dtype=np.float64)
        right = np.asarray(right, dtype=np.float64)
        parent = np.asarray(parent, dtype=np.float64)
        g = self._score(left) + self._score(right) - self._score(parent)
        wl, wr = left[..., 0], right[..., 0]
        # A child needs positive weight (its value is S / W) and at least min_weight_leaf.
        ok = (wl > 0) & (wr > 0) & (wl >= self.min_weight_leaf) & (wr >= self.min_weight_leaf)
        if self.count_channel:
            cl, cr = left[..., -1], right[..., -1]
        else:
            cl, cr = wl, wr
        least = self.min_child_size(parent)
        ok &= (cl >= least) & (cr >= least)
        if self.imbalance_penalty > 0:
            with np.errstate(divide="ignore"):
                g = g - self.imbalance_penalty * (1.0 / cl + 1.0 / cr)
        return np.where(ok, g, -np.inf)

    def node_value(self, stats):
        stats = self._check_stats(stats)
        w = stats[..., 0:1]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(w > 0, stats[..., 1:1 + self.n_targets] / np.where(w > 0, w, 1.0), 0.0)

    def node_weight(self, stats):
        return self._check_stats(stats)[..., 0]

    def node_count(self, stats):
        stats = self._check_stats(stats)
        return stats[..., -1] if self.count_channel else stats[..., 0]

    def node_size(self, stats):
        """Rows with a count channel, else the weight (what ``min_samples_split`` compares)."""
        return self.node_count(stats)

    def node_objective(self, stats):
        return -self._score(self._check_stats(stats))

    def compiled(self):
        """Compiled pieces for the growth kernels (:class:`forest.criteria.compiled.CompiledCriterion`)."""
        record = VarianceRecord(self.n_targets, self.count_channel, float(self.min_samples_leaf),
                                self.min_weight_leaf, self.alpha, self.imbalance_penalty)
        # With a count channel (or unit weights) a child needs min_samples_leaf rows; else weights decide.
        rows = self.count_channel or self.rows_are_weights
        return CompiledCriterion(record, 0, self.min_samples_leaf if rows else 1, n_consts=2,
                                 size_channel=self.n_channels - 1 if self.count_channel else 0)


# ---------------------------------------------------------------------- compiled pieces
# :class:`VarianceCriterion.gain` per candidate, for the compiled growth kernels
# (:mod:`forest.criteria.compiled`). ``prepare`` turns a parent's channel sums into
# the node constant the gain needs (the parent's score), once per node.

#: Parameter record of :class:`VarianceCriterion` in the compiled kernels.
VarianceRecord = namedtuple("VarianceRecord", ["n_targets", "count_channel", "min_samples_leaf", "min_weight_leaf",
                                               "alpha", "imbalance_penalty"])


@compiled_only
def _variance_score(st, n_targets):
    w = st[0]
    s = 0.0
    if w > 0:
        for t in range(n_targets):
            s += st[1 + t] * st[1 + t] / w
    return s


def variance_prepare(p, parent, consts):
    """Node constants of :class:`VarianceCriterion`: ``consts[0]`` = the parent's score,
    ``consts[1]`` = the fewest rows a child needs (:meth:`VarianceCriterion.min_child_size`)."""
    consts[0] = _variance_score(parent, p.n_targets)
    size = parent[parent.shape[0] - 1] if p.count_channel else parent[0]
    consts[1] = max(p.min_samples_leaf, np.ceil(p.alpha * size))


def variance_gains_rows(p, lefts, rights, consts, out, row, n):
    """Scalar :meth:`VarianceCriterion.gain` of ``n`` candidates of one node into ``out[row, :n]``.

    Parameters
    ----------
    p : VarianceRecord
    lefts, rights : ndarray of float64, shape (>= n, C)
        Children's channel sums, one candidate per row.
    consts : ndarray of float64, shape (>= 2,)
        From :func:`variance_prepare` on the node's sums.
    out : ndarray of float64, shape (>= row + 1, >= n)
        Gains (``-inf`` where a constraint fails).
    row, n : int

    The loop keeps all candidates in one call; an inlined per-candidate helper taking
    the arrays was measured 2x slower for the whole kernel (atomic reference counts
    per candidate).
    """
    c = lefts.shape[1] - 1
    for i in range(n):
        wl = lefts[i, 0]
        wr = rights[i, 0]
        cl = lefts[i, c] if p.count_channel else wl
        cr = rights[i, c] if p.count_channel else wr
        ok = ((wl > 0) & (wr > 0) & (wl >= p.min_weight_leaf) & (wr >= p.min_weight_leaf)
              & (cl >= consts[1]) & (cr >= consts[1]))
        g = -np.inf
        if ok:
            sl = 0.0
            sr = 0.0
            for t in range(p.n_targets):
                sl += lefts[i, 1 + t] * lefts[i, 1 + t] / wl
                sr += rights[i, 1 + t] * rights[i, 1 + t] / wr
            g = sl + sr - consts[0]
            if p.imbalance_penalty > 0:
                g -= p.imbalance_penalty * (1.0 / cl + 1.0 / cr)
        out[row, i] = g


def variance_bin_key(p, stats, i, consts):
    """Category sort key of :class:`VarianceCriterion`: its weighted mean outcome (summed over
    targets). With one target, sorting by the mean makes the best prefix the best subset
    (Fisher 1958), so the categorical search is exact."""
    w = stats[i, 0]
    key = 0.0
    if w > 0:
        for t in range(p.n_targets):
            key += stats[i, 1 + t] / w
    return key


register(VarianceRecord, prepare=variance_prepare, gains=variance_gains_rows, bin_key=variance_bin_key)

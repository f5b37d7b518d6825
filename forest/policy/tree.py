"""PolicyTree: the exact best depth-k decision tree for choosing actions from rewards.

This module owns the policy-tree estimator: input checks, binning, the fixed-point
rewards, building the fitted :class:`forest.engine.tree.Tree` from the search result, its
leaf statistics, the policy's value with a standard error, prediction and the text
form. The search itself lives in :mod:`forest.policy.exact` (distribution) and
:mod:`forest.policy.search` (kernels).

Given rewards ``Gamma`` of shape (n, A) (typically doubly robust scores of each action,
from a causal forest on held-out data, control as action 0), the tree maximises
``sum_i w_i Gamma[i, pi(x_i)]`` over every tree of depth ``max_depth`` whose splits lie
on the bin boundaries of a :class:`histogram.binning.BinMapper` (global edges, the
same at any rank count). Missing values may go either way at each split. Ties go to
the smaller tree, then to the lowest feature and bin, then to the lowest action. This
is policytree's exact search (Sverdrup et al.) on a grid of ``max_bins`` quantile
boundaries per feature instead of every distinct value.

Default ``max_bins`` by depth (:data:`DEFAULT_MAX_BINS`): the depth-2 search reads
``S (S + 1) / 2 * nb^2 * (A + 1)`` table cells (S features, nb = max_bins + 1) and
the depth-3 search ``S^3 / 6 * nb^3 * (A + 1)``; 255 bins at depth 2 would be 16
times the work and bytes of 64 bins. A coarser grid costs little value: a threshold
off by at most one bin mis-assigns at most that bin's rows (1/64 of them), and
where effects vary smoothly the loss is second order in the threshold error.
"""
import numpy as np

from native import collectives as col
from native.comm import world
from native.stats import STATS

from forest.policy import exact as policy_exact
from forest.engine.honest_forest import fit_binning, global_ids
from forest.analysis.score_means import average_effect, average_effect_sums
from forest.engine.predictor import predict_leaves, predict_leaves_binned
from forest._validation import _check_feature_names, agreed_features, check_weight, feature_summary, validate_features
from forest.collective_checks import collective_checks, require_same
from forest.estimators.base import EstimatorBase, check_is_fitted
from forest.engine.tree_text import tree_text
from forest.engine.tree import CATEGORICAL_SPLIT, Tree, cat_bitset
from forest.io import model_checks, model_io

#: ``max_bins=None`` by depth: the search grows as nb^(depth) per feature tuple.
DEFAULT_MAX_BINS = {0: 255, 1: 255, 2: 64, 3: 16}
MAX_DEPTH = 3
#: Depth 3 keeps records per (feature pair, bin pair): beyond this the memory is prohibitive.
MAX_BINS_DEPTH3 = 64


def check_rewards(rewards, n):
    """Rewards as float64 (n, A), finite, A >= 1."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim == 1:
        r = r.reshape(len(r), 1)
    if r.ndim != 2 or r.shape[0] != n:
        raise ValueError(f"rewards must have shape (n, n_actions) with n = {n}, got {np.shape(rewards)}")
    if r.shape[1] < 1:
        raise ValueError("rewards needs at least one action column")
    if not np.all(np.isfinite(r)):
        raise ValueError("rewards contain NaN or infinite values")
    return r


def _category_ranks(mapper, codes, channels, n_actions, comm):
    """Search order of each categorical feature's categories: ``{feature: rank per code}``.

    The exact search scans thresholds, so a categorical feature is searched over its
    categories in one order fixed at the root: by the mean reward gap between the two
    actions with the largest total reward (ties by code). With two actions, the best
    depth-1 split on the feature is a prefix of this order (the categories where the
    second action wins), so the search is exact there; deeper, and with more actions, it
    is the sorted scan of the forests, with one order per feature instead of per node.
    Sums are of the fixed-point rewards (exact integers), so every rank count finds the
    same order.
    """
    cats = np.flatnonzero(getattr(mapper, "categorical_", np.zeros(codes.shape[0], bool)))
    if len(cats) == 0:
        return {}
    nb = mapper.n_bins_non_missing_
    width = int(nb[cats].max())
    sums = np.zeros((len(cats), width, n_actions + 1))
    for j, f in enumerate(cats):
        c = codes[f].astype(np.int64)
        ok = c < nb[f]
        for k in range(n_actions + 1):
            sums[j, :, k] = np.bincount(c[ok], weights=channels[ok, k], minlength=width)[:width]
    if comm.size > 1:
        sums = col.allreduce(comm, sums)
    totals = sums[:, :, :n_actions].sum(axis=(0, 1)) / max(len(cats), 1)
    top = np.argsort(-totals, kind="stable")[:2]
    out = {}
    for j, f in enumerate(cats):
        k = int(nb[f])
        rows = sums[j, :k, n_actions]
        with np.errstate(invalid="ignore", divide="ignore"):
            gap = np.where(rows > 0, (sums[j, :k, top[-1]] - sums[j, :k, top[0]]) / np.where(rows > 0, rows, 1),
                           np.inf)
        order = np.lexsort((np.arange(k), gap))
        rank = np.empty(k, dtype=np.int64)
        rank[order] = np.arange(k)
        out[int(f)] = rank
    return out


def _node_sums(leaf, n_nodes, columns):
    """Per-node column sums of the rows reaching each leaf, shape (n_nodes, k) (leaves only)."""
    out = np.zeros((n_nodes, columns.shape[1]))
    for k in range(columns.shape[1]):
        out[:, k] = np.bincount(leaf, weights=columns[:, k], minlength=n_nodes)
    return out


def _add_up(tree, sums):
    """Fill inner nodes of per-node ``sums`` (axis 0) with their children's totals, in place.

    Node ids are in pre-order (children after their parent), so a reverse sweep sees
    both children of a node before the node.
    """
    is_leaf = tree.is_leaf
    for node in range(tree.node_count - 1, -1, -1):
        if not is_leaf[node]:
            sums[node] = sums[tree.left[node]] + sums[tree.right[node]]
    return sums


class PolicyTree(EstimatorBase):
    """Exact depth-k policy tree over binned features (policytree's search, distributed).

    Parameters
    ----------
    max_depth : int, default 2
        0 (one action for everyone) to 3.
    min_samples_leaf : int, default 1
        Fewest rows (unweighted, over all ranks) in every leaf a split creates. As in
        scikit-learn's trees it limits splits, not the root: when no split can keep
        ``min_samples_leaf`` rows on both sides (e.g. ``min_samples_leaf > n / 2``),
        the tree is the root alone, giving everyone the best single action.
    max_bins : int or None, default None
        Value bins per feature (2..255); ``None`` takes :data:`DEFAULT_MAX_BINS` of the
        depth (255, 255, 64, 16 for depths 0-3). Depth 3 needs ``max_bins <= 64``.
    exchange : {"auto", "rows", "tables"}, default "auto"
        How ranks share the depth-2/3 search (:mod:`forest.policy.exact`); the tree is
        the same for every choice.
    categorical_features : "from_dtype", list of str or int, array-like of bool, or None, default "from_dtype"
        Columns split by category subsets instead of thresholds (README, "Categorical
        features"): ``"from_dtype"`` takes pandas ``category`` and string columns, object
        columns of strings and Arrow ``dictionary``/string columns; or name them, give their
        indices or a boolean mask; ``None``: every column is numeric. A category unseen in
        training goes where missing values go. ``is_categorical_`` and ``category_coder_`` (set when
        there are categorical columns) record them.
    random_state : int or None, default None (means 0)
        Seed of the binning sample.

    Attributes
    ----------
    tree_ : forest.engine.tree.Tree
        ``value[node]``: the node's weighted mean reward of each action, shape (A,).
    action_ : ndarray of int64, shape (node_count,)
        Action of each node (leaves: the policy); the first action with the largest
        reward sum.
    value_stderr_per_action_ : ndarray, shape (node_count, A)
        Standard errors of ``tree_.value``.
    bin_mapper_ : histogram.binning.BinMapper
    n_actions_, n_features_in_ : int
    value_, value_stderr_ : float
        Weighted mean reward of the policy on the training rows and its standard
        error. In-sample: the tree was chosen to make it large, so it is optimistic;
        use :meth:`evaluate` on held-out rewards for an honest figure.
    action_value_, action_value_stderr_ : ndarray, shape (A,)
        Mean reward of giving everyone the same action.
    gain_, gain_stderr_ : float
        ``value_`` minus the best single action's mean reward (paired standard error).
    objective_ : float
        The maximised total ``sum w Gamma`` (fixed point, in reward units).
    search_ : dict
        ``exchange`` used, ``n_ranks``, ``bytes_sent_total`` and ``bytes_sent_max_rank``
        (measured by ``native.collectives.STATS`` over the whole fit),
        ``predicted_bytes`` per exchange, ``max_bins``, ``n_search_features``,
        ``fixed_point_exponent``.
    """

    def __init__(self, max_depth=2, *, min_samples_leaf=1, max_bins=None, exchange="auto", random_state=None,
                 categorical_features="from_dtype"):
        self.max_depth = max_depth
        self.categorical_features = categorical_features
        self.min_samples_leaf = min_samples_leaf
        self.max_bins = max_bins
        self.exchange = exchange
        self.random_state = random_state

    # ------------------------------------------------------------------ fit
    def _check_params(self):
        d = self.max_depth
        if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or not 0 <= d <= MAX_DEPTH:
            raise ValueError(f"max_depth must be an int in 0..{MAX_DEPTH} (the exact search grows as "
                             f"(features x bins)^depth), got {d!r}")
        msl = self.min_samples_leaf
        if not isinstance(msl, (int, np.integer)) or isinstance(msl, bool) or msl < 1:
            raise ValueError(f"min_samples_leaf must be an int >= 1, got {msl!r}")
        bins = DEFAULT_MAX_BINS[int(d)] if self.max_bins is None else self.max_bins
        if not isinstance(bins, (int, np.integer)) or isinstance(bins, bool) or not 2 <= bins <= 255:
            raise ValueError(f"max_bins must be None or an int in [2, 255], got {self.max_bins!r}")
        if d == 3 and bins > MAX_BINS_DEPTH3:
            raise ValueError(f"max_depth=3 needs max_bins <= {MAX_BINS_DEPTH3} (its search keeps a record per "
                             f"pair of features and pair of bins), got {bins}")
        if self.exchange not in policy_exact.EXCHANGES:
            raise ValueError(f"exchange must be one of {policy_exact.EXCHANGES}, got {self.exchange!r}")
        seed = 0 if self.random_state is None else self.random_state
        if not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"random_state must be a non-negative int or None, got {self.random_state!r}")
        return int(d), int(msl), int(bins), int(seed)

    def fit(self, X, rewards, sample_weight=None, *, comm=None):
        """Find the best tree for this rank's rows together with every other rank's.

        Parameters
        ----------
        X : array-like, shape (n_local, n_features)
            NaN means missing; infinite values are an error.
        rewards : array-like, shape (n_local, n_actions)
            Reward of each action for each row (e.g. doubly robust scores).
        sample_weight : array-like, shape (n_local,), optional
            Non-negative row weights: the tree maximises ``sum w Gamma``.
        comm : native.comm.Communicator, optional
            ``None`` means ``native.comm.world()``; every rank passes its own rows and
            ends with the same tree.

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        # Collective input checks: a bad input on one rank raises the same error on all.
        with collective_checks(comm) as checks:
            depth, min_rows, bins, seed = self._check_params()
            X = validate_features(self, X, reset=True, min_samples=1 if comm.size == 1 else 0)
            n, n_features = X.shape
            R = check_rewards(rewards, n)
            g = check_weight(sample_weight, n)
            checks.share(actions=R.shape[1], **feature_summary(self))
        agreed_features(checks.summaries, self)
        require_same(checks.summaries, "actions", lambda a: f"rewards have {a} actions")
        bytes_before = STATS.bytes_sent
        _, n_global = global_ids(comm, n)
        if n_global == 0:
            raise ValueError("no rows on any rank")
        mapper, codes = fit_binning(X, bins, seed, comm, getattr(self, "is_categorical_", None))
        missing = np.count_nonzero(codes == mapper.missing_bin_, axis=1).astype(np.int64)
        if comm.size > 1:
            missing = col.allreduce(comm, missing)

        A = R.shape[1]
        weighted = g[:, None] * R
        max_abs = policy_exact.global_max(comm, np.max(np.abs(weighted)) if weighted.size else 0.0)
        exponent = policy_exact.fixed_point_exponent(max_abs, n_global)
        channels = np.empty((n, A + 1))
        channels[:, :A] = policy_exact.fixed_point(weighted, exponent)
        channels[:, A] = 1.0
        ranks = _category_ranks(mapper, codes, channels, A, comm)
        search_codes = codes
        if ranks:
            search_codes = codes.copy()
            for f, rank in ranks.items():
                search_codes[f] = np.append(rank, mapper.missing_bin_).astype(np.uint8)[
                    np.minimum(codes[f], len(rank))] if len(rank) else codes[f]
        space = policy_exact.SearchSpace(mapper, search_codes, missing > 0)
        result = policy_exact.exact_search(space, channels, A, depth, min_rows, comm, self.exchange)

        self.tree_ = self._build_tree(space, result.structure(depth), A, ranks)
        self.bin_mapper_ = mapper
        self.n_actions_ = A
        self.n_features_in_ = n_features
        self.objective_ = float(np.ldexp(result.value, -exponent))
        self._leaf_statistics(codes, channels, R, g, result.value, exponent, comm)
        sent = np.array([STATS.bytes_sent - bytes_before], dtype=np.int64)
        total_sent = int(col.allreduce(comm, sent)[0]) if comm.size > 1 else int(sent[0])
        max_sent = int(policy_exact.global_max(comm, sent[0]))
        self.search_ = {"exchange": result.exchange, "n_ranks": int(comm.size), "bytes_sent_total": total_sent,
                        "bytes_sent_max_rank": max_sent, "predicted_bytes": dict(result.predicted_bytes),
                        "max_bins": bins, "n_search_features": int(space.n_search),
                        "fixed_point_exponent": int(exponent)}
        return self

    @staticmethod
    def _build_tree(space, structure, n_actions, ranks=None):
        """A :class:`Tree` with the splits of ``structure`` (node ids in pre-order).

        ``ranks`` (categorical feature -> rank of each category code in the search order):
        a threshold on such a feature's ranks becomes the category set it sends left.
        """
        tree = Tree(n_actions)
        ranks = ranks or {}

        def add(node, depth):
            me = tree.add_node(depth, 0.0, np.zeros(n_actions))
            if node is not None:
                s, b, left, right = node
                f, bin_threshold, threshold, missing_left = space.split(s, b)
                lid = add(left, depth + 1)
                rid = add(right, depth + 1)
                if f in ranks:
                    tree.set_split(me, f, CATEGORICAL_SPLIT, np.nan, missing_left, 0.0, lid, rid,
                                   cat_bitset(np.flatnonzero(ranks[f] <= bin_threshold)))
                else:
                    tree.set_split(me, f, bin_threshold, threshold, missing_left, 0.0, lid, rid)
            return me

        add(structure, 0)
        return tree

    def _leaf_statistics(self, codes, channels, R, g, search_value, exponent, comm):
        """Node actions, means, standard errors, gains and the policy's value (collective)."""
        tree = self.tree_
        n_nodes, A = tree.node_count, self.n_actions_
        leaf = predict_leaves_binned(tree, codes, self.bin_mapper_.missing_bin_)[:, 0].astype(np.int64)
        fixed = _node_sums(leaf, n_nodes, channels)                       # (nodes, A + 1) exact
        per_row = np.concatenate([np.broadcast_to(g[:, None], R.shape), g[:, None] * R,
                                  np.broadcast_to((g * g)[:, None], R.shape), (g * g)[:, None] * R,
                                  (g * g)[:, None] * R * R], axis=1)
        floats = _node_sums(leaf, n_nodes, per_row)                      # (nodes, 5 A)
        buf = np.concatenate([fixed.reshape(-1), floats.reshape(-1)])
        if comm.size > 1:
            buf = col.allreduce(comm, buf)
        fixed = buf[:fixed.size].reshape(fixed.shape)
        floats = buf[fixed.size:].reshape(n_nodes, 5, A)
        _add_up(tree, fixed)
        _add_up(tree, floats)
        is_leaf = tree.is_leaf
        action = np.argmax(fixed[:, :A], axis=1).astype(np.int64)
        best = fixed[np.arange(n_nodes), action]
        subtree = _add_up(tree, best.copy())
        if subtree[0] != search_value:
            raise RuntimeError(f"policy tree: leaf sums {subtree[0]!r} differ from the search value "
                               f"{search_value!r} (a bug; please report it)")
        with np.errstate(invalid="ignore", divide="ignore"):
            mean, se = average_effect(np.moveaxis(floats, 1, 0))
        tree.value = mean
        a = tree._arrays
        a["weight"][:n_nodes] = floats[:, 0, 0]
        a["count"][:n_nodes] = fixed[:, A]
        a["gain"][:n_nodes] = np.where(is_leaf, 0.0, np.ldexp(subtree - best, -exponent))
        self.action_ = action
        self.value_stderr_per_action_ = se

        # the policy's value, each constant action's, and the gain over the best one
        pi = action[leaf]
        r_pi = R[np.arange(len(R)), pi]
        self.action_value_, self.action_value_stderr_ = average_effect(floats[0])  # the root: all rows
        best_const = int(np.argmax(self.action_value_))
        own = np.stack([average_effect_sums(r_pi, g), average_effect_sums(r_pi - R[:, best_const], g)], axis=1)
        if comm.size > 1:
            own = col.allreduce(comm, np.ascontiguousarray(own))
        (self.value_, self.gain_), (self.value_stderr_, self.gain_stderr_) = (
            tuple(float(v) for v in arr) for arr in average_effect(own))

    # ------------------------------------------------------------------ use
    def apply(self, X):
        """Leaf (node id of ``tree_``) of each row, shape (n,)."""
        check_is_fitted(self, "tree_")
        X = validate_features(self, X, reset=False, min_samples=0)
        return predict_leaves(self.tree_, X)[:, 0].astype(np.int64)

    def predict(self, X):
        """Recommended action of each row.

        Parameters
        ----------
        X : array-like, shape (n, n_features)

        Returns
        -------
        ndarray of int64, shape (n,)
            Action index (a column of the training ``rewards``).
        """
        leaves = self.apply(X)  # first: an unfitted tree raises NotFittedError, not AttributeError
        return self.action_[leaves]

    def predict_value(self, X):
        """Training mean reward of every action in each row's leaf, shape (n, A)."""
        leaves = self.apply(X)
        return self.tree_.value[leaves]

    def _rows(self, X, values, sample_weight, comm):
        """Checked ``(comm, X, values (n, k), weights)`` of per-row methods."""
        check_is_fitted(self, "tree_")
        X = validate_features(self, X, reset=False, min_samples=0)
        return (world() if comm is None else comm), X, check_rewards(values, len(X)), \
            check_weight(sample_weight, len(X))

    def evaluate(self, X, rewards, sample_weight=None, *, comm=None):
        """Mean reward of this policy on other rows (held-out rewards give an honest value).

        Parameters
        ----------
        X : array-like, shape (n_local, n_features)
        rewards : array-like, shape (n_local, n_actions)
        sample_weight : array-like, shape (n_local,), optional
        comm : native.comm.Communicator, optional
            Rows spread over ranks are summed (collective).

        Returns
        -------
        value, stderr : float
        """
        comm, X, R, g = self._rows(X, rewards, sample_weight, comm)
        if R.shape[1] != self.n_actions_:
            raise ValueError(f"rewards have {R.shape[1]} actions, the tree was fitted with {self.n_actions_}")
        r_pi = R[np.arange(len(R)), self.predict(X)] if len(X) else np.zeros(0)
        sums = average_effect_sums(r_pi, g)
        if comm.size > 1:
            sums = col.allreduce(comm, np.ascontiguousarray(sums))
        est, se = average_effect(sums)
        return float(est), float(se)

    def node_means(self, X, values, sample_weight=None, *, comm=None):
        """Weighted mean of per-row ``values`` over the rows reaching each node (collective).

        Parameters
        ----------
        X : array-like, shape (n_local, n_features)
        values : array-like, shape (n_local, k)
        sample_weight : array-like, shape (n_local,), optional
        comm : native.comm.Communicator, optional

        Returns
        -------
        ndarray, shape (node_count, k)
            NaN for a node no row (of positive weight) reaches.
        """
        comm, X, V, g = self._rows(X, values, sample_weight, comm)
        leaf = self.apply(X) if len(X) else np.zeros(0, dtype=np.int64)
        sums = _node_sums(leaf, self.tree_.node_count, np.column_stack([g, g[:, None] * V]))
        if comm.size > 1:
            sums = col.allreduce(comm, sums)
        _add_up(self.tree_, sums)
        with np.errstate(invalid="ignore", divide="ignore"):
            return sums[:, 1:] / sums[:, :1]

    def export_text(self, feature_names=None, action_names=None, decimals=4):
        """The tree as indented ``if/else`` text.

        Parameters
        ----------
        feature_names : list of str, optional
            One name per feature. Default: ``feature_names_in_`` when the tree was
            fitted on a table with column names, else ``x0, x1, ...``.
        action_names : list of str, optional
        decimals : int

        Returns
        -------
        str
        """
        check_is_fitted(self, "tree_")
        t = self.tree_
        if feature_names is None:
            feature_names = getattr(self, "feature_names_in_", None)
        else:
            feature_names = _check_feature_names(feature_names, self.n_features_in_)
        fname = (lambda f: str(feature_names[f])) if feature_names is not None else (lambda f: f"x{f}")
        aname = (lambda a: str(action_names[a])) if action_names is not None else (lambda a: f"action {a}")

        def leaf_text(node):
            a = int(self.action_[node])
            return (f"{aname(a)}  ({int(t.count[node])} rows, mean reward {t.value[node, a]:.{decimals}g} "
                    f"+/- {self.value_stderr_per_action_[node, a]:.{decimals}g})")

        return tree_text(t, fname, leaf_text, getattr(self, "category_coder_", None), decimals)


# Model files name it as they always have (forest.io.model_io.register); its restored state's checks.
model_io.register(PolicyTree, name="forest.policy_tree.PolicyTree", check=model_checks.check_policy_tree)

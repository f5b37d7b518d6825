"""RegressionForest: an honest, subsampled (GRF-style) random forest on histograms.

This module owns the public regression forest. It is also the nuisance model of the
causal forest (``E[Y|x]`` and ``E[W|x]`` for local centering), which needs its
out-of-bag predictions on the training rows; these are computed during ``fit``
without storing sample lists (:mod:`forest.engine.honest_forest`).

Each tree is grown by weighted variance reduction on the structure half of its
subsample and its nodes are re-estimated (weighted means) on the estimation half.
The forest prediction is the average of the trees' leaf means, i.e. GRF's forest
weights ``alpha_i(x) = (1/B) sum_b 1[i in leaf_b(x)] / |leaf_b(x)|``.
"""
import numpy as np

from native import collectives as col
from native.comm import world

from forest._validation import (agreed_features, as_columns, check_moment_sums, check_param_types, check_row_count,
                                check_target, check_weight, check_weight_total, feature_summary, fit_features, is_seed,
                                moment_sums, validate_features)
from forest.engine.clusters import resolve_clusters
from forest.collective_checks import AgreedError, collective_checks, require_same, total
from forest.io.continuation import begin_forest, continue_forest, fit_fingerprint, open_stage
from forest.criteria.basic import VarianceCriterion
from forest.estimators.base import EstimatorBase, RegressorMixin, check_is_fitted
from forest.estimators.explanations import ShapMixin
from forest.engine.growth_options import TreeParams
from forest.engine.honest_forest import ForestSpec, global_ids, grow_honest_forest, oob_average, oob_sums_binned
from forest.engine.importance import depth_weighted_importance, gain_importance
from forest.engine.subsample import little_bag_size
from forest.engine.predictor import predict_values, predict_values_binned
from forest.io.training_rows import TrainingRowsMixin
from forest.estimators.forest_weights import ForestWeightsMixin
from forest.estimators.regression_variance import RegressionVarianceMixin
from forest.estimators.local_linear import LocalLinearMixin
from forest.estimators.tuning import check_tuning_params, fit_tuned
from forest.estimators.ll_split import check_ll_split_params, ll_split_channels
from forest.io import model_checks, model_io


def default_mtry(n_features):
    """GRF's default number of features tried per split, ``min(ceil(sqrt(d) + 20), d)``."""
    return int(min(np.ceil(np.sqrt(n_features) + 20), n_features))


def resolve_mtry(max_features, n_features):
    """Number of features tried per node from ``max_features``.

    ``None`` -> GRF's default; int -> itself (capped at ``n_features``); float in
    (0, 1] -> that fraction; ``"sqrt"`` / ``"log2"``.
    """
    if max_features is None:
        return default_mtry(n_features)
    if isinstance(max_features, str):
        if max_features == "sqrt":
            return max(1, int(np.sqrt(n_features)))
        if max_features == "log2":
            return max(1, int(np.log2(n_features)))
        raise ValueError(f"max_features must be None, int, float, 'sqrt' or 'log2', got {max_features!r}")
    if isinstance(max_features, (int, np.integer)) and not isinstance(max_features, bool):
        if max_features < 1:
            raise ValueError(f"max_features must be >= 1, got {max_features}")
        return int(min(max_features, n_features))
    if isinstance(max_features, float) and 0.0 < max_features <= 1.0:
        return max(1, int(round(max_features * n_features)))
    raise ValueError(f"max_features must be None, int >= 1, float in (0, 1], 'sqrt' or 'log2', got {max_features!r}")


def normalise_weights(g, n_global, weight_total):
    """Rescale sample weights to mean 1 over all ranks' rows.

    The growers compare ``min_samples_split`` with a node's summed weight, so weights
    on an arbitrary scale (e.g. summing to 1) would stop every tree at its root. Node
    values and split choices are invariant to a common factor, so rescaling makes the
    forest independent of the weights' scale and keeps "weighted rows" comparable to
    rows.

    Parameters
    ----------
    g : ndarray of float64, shape (n_local,)
    n_global : int
    weight_total : float
        ``g.sum()`` over all ranks.

    Returns
    -------
    ndarray of float64, shape (n_local,)

    Raises
    ------
    forest.collective_checks.AgreedError
        A ``ValueError`` every rank raises alike (``weight_total`` is a shared total).
    """
    check_weight_total(weight_total)
    if not np.isfinite(weight_total):
        raise AgreedError(f"sample_weight sums to {weight_total} over all rows; rescale sample_weight")
    return g * (n_global / weight_total)


def weight_range(g):
    """This rank's ``(min, max)`` of the sample weights, or None without rows (to share)."""
    return (float(g.min()), float(g.max())) if len(g) else None


def scaled_weights(g, n_global, weight_total, ranges):
    """:func:`normalise_weights`, except that equal weights on every rank become exactly 1.

    ``g * (n / total)`` rounds: equal weights of 0.1 or 1e-6 become ``1 - 2**-52`` and a
    node of ten such rows weighs ``9.999...`` < ``min_samples_split`` = 10, so the forest
    would change with the weights' scale. Equal weights are an unweighted fit.

    Parameters
    ----------
    g : ndarray of float64, shape (n_local,)
    n_global : int
    weight_total : float
    ranges : list
        Every rank's :func:`weight_range` (the same list on every rank).

    Returns
    -------
    ndarray of float64, shape (n_local,)
    """
    g = normalise_weights(g, n_global, weight_total)
    return g if common_weight(ranges) is None else np.ones_like(g)


def common_weight(ranges):
    """The weight every row of every rank has, or None when they differ (or no rank has rows).

    Parameters
    ----------
    ranges : list
        Every rank's :func:`weight_range`.
    """
    seen = [r for r in ranges if r is not None]
    if seen and min(r[0] for r in seen) == max(r[1] for r in seen):
        return seen[0][0]
    return None


def g_scale(n_global, weight_total, ranges):
    """The factor :func:`scaled_weights` multiplies the given weights by (up to its rounding to 1).

    Used to express parameters given in units of the raw weights (grf's imbalance penalty)
    in the units the trees grow in.
    """
    common = common_weight(ranges)
    return n_global / weight_total if common is None else 1.0 / common


def rescaled_weights_again(sample_weight, n_local, comm):
    """:func:`scaled_weights` of training rows passed again, as ``fit`` computed them (collective).

    Parameters
    ----------
    sample_weight : array-like, shape (n_local,), or None
    n_local : int
    comm : native.comm.Communicator

    Returns
    -------
    ndarray of float64, shape (n_local,)
    """
    g = check_weight(sample_weight, n_local)
    shared = col.allgather_object(comm, (float(np.abs(g).sum()), n_local, weight_range(g)))
    weight_total = total([{"w": s[0]} for s in shared], "w")     # rank order, as fit adds them
    return scaled_weights(g, sum(s[1] for s in shared), weight_total, [s[2] for s in shared])


def target_range(y):
    """This rank's per-output ``(min, max)`` of ``y`` (n, M) as lists, or None without rows."""
    return (y.min(axis=0).tolist(), y.max(axis=0).tolist()) if len(y) else None


def target_standardisation(ranges):
    """Per output: the shift and power-of-two scale the split statistics see ``y`` through.

    The variance criterion compares sums of squares, ``S_l**2 / W_l + S_r**2 / W_r -
    S**2 / W``: with ``y = 1e9 + noise`` the squares lose the noise to rounding and the
    trees turn to noise too (timestamps, revenues), and with ``|y| ~ 1e-200`` they
    underflow and no split gains anything. Splits and node values are equivariant to
    ``y -> (y - shift) / scale``, so the forest grows on the standardised outcome and
    node values are mapped back. The shift is the midrange and the scale a power of two
    near the half-range: both come from the global minimum and maximum, exact and
    order-free, so every rank count computes the same bits (a mean would depend on
    the summation order), and dividing by a power of two is exact.

    Parameters
    ----------
    ranges : list
        Every rank's :func:`target_range` (the same list on every rank).

    Returns
    -------
    shift, scale : ndarray of float64, shape (M,)
    """
    seen = [r for r in ranges if r is not None]
    lo = np.min([r[0] for r in seen], axis=0)
    hi = np.max([r[1] for r in seen], axis=0)
    shift = lo / 2 + hi / 2          # halves first: lo + hi may overflow
    half = hi / 2 - lo / 2
    _, exponent = np.frexp(half)     # half = m * 2**exponent, 0.5 <= m < 1
    scale = np.where(half > 0, np.ldexp(1.0, exponent), 1.0)
    return shift, scale


def check_forest_params(est):
    """Validate the sampling/growth parameters shared by both forests.

    Raises
    ------
    TypeError
        A parameter of the wrong type (:func:`forest._validation.check_param_types`).
    ValueError
        A parameter out of range.
    """
    grf_sizes = hasattr(est, "min_node_size")      # the forests that offer grf's size rules
    check_param_types(est, ints=("n_estimators", "max_bins") + (() if grf_sizes else
                                                               ("min_samples_leaf", "ci_group_size")),
                      optional_ints=("max_depth", "batch_size", "random_state")
                      + (("min_samples_leaf", "min_node_size", "ci_group_size") if grf_sizes else ()),
                      reals=("max_samples", "honesty_fraction"),
                      bools=("honest", "equalize_cluster_weights")
                      + (("honesty_prune_leaves",) if hasattr(est, "honesty_prune_leaves") else ())
                      + (("stabilize_splits",) if hasattr(est, "stabilize_splits") else ()))
    resolve_mtry(est.max_features, 1)  # every accepted form of max_features, whatever the data
    if not isinstance(est.n_estimators, (int, np.integer)) or est.n_estimators < 1:
        raise ValueError(f"n_estimators must be a positive int, got {est.n_estimators!r}")
    if not 0.0 < est.max_samples <= 1.0:
        raise ValueError(f"max_samples (the sample fraction) must be in (0, 1], got {est.max_samples}")
    if not 0.0 < est.honesty_fraction < 1.0:
        raise ValueError(f"honesty_fraction must be in (0, 1), got {est.honesty_fraction}")
    if est.min_samples_leaf is not None and est.min_samples_leaf < 1:
        raise ValueError(f"min_samples_leaf must be >= 1 (or None), got {est.min_samples_leaf}")
    if grf_sizes:
        if est.min_node_size is not None and est.min_node_size < 1:
            raise ValueError(f"min_node_size must be >= 1 or None, got {est.min_node_size}")
        penalty = getattr(est, "imbalance_penalty", 0.0)
        if isinstance(penalty, bool) or not isinstance(penalty, (int, float, np.integer, np.floating)) \
                or not np.isfinite(penalty) or penalty < 0:
            raise ValueError(f"imbalance_penalty must be a finite number >= 0, got {penalty!r}")
        alpha = est.alpha
        if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.integer,
                                                                                   np.floating))
                                  or not 0.0 <= alpha <= 0.25):
            raise ValueError(f"alpha must be a number in [0, 0.25] or None, got {alpha!r}")
    if est.max_depth is not None and est.max_depth < 0:
        raise ValueError(f"max_depth must be >= 0 or None, got {est.max_depth}")
    if not 2 <= est.max_bins <= 255:
        raise ValueError(f"max_bins must be in [2, 255], got {est.max_bins}")
    if est.batch_size is not None and est.batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 or None, got {est.batch_size}")
    # Little bags of ci_group_size trees share a half-sample, so each tree's subsample
    # must fit inside half of the data.
    group = little_bag_size(est.ci_group_size, est.max_samples)
    if group < 1 or (group > 1 and est.max_samples > 0.5):
        raise ValueError(f"ci_group_size must be >= 1, and max_samples <= 0.5 when it is > 1; got "
                         f"{est.ci_group_size}, {est.max_samples}")
    if hasattr(est, "tune_parameters"):
        check_tuning_params(est)
    seed = 0 if est.random_state is None else est.random_state
    # numpy's and scikit-learn's range for an integer seed (RandomState, check_random_state)
    if not is_seed(seed):
        raise ValueError(f"random_state must be an int in [0, 2**32 - 1] or None, got {est.random_state!r}")
    return int(seed)


def size_rules(est):
    """``(min_samples_split, min_samples_leaf, alpha)`` the trees of a forest grow under.

    Two sets of rules, counted in rows of the tree's split half (sample weights never
    count: see :class:`forest.criteria.basic.VarianceCriterion`):

    scikit-learn's (``min_node_size=None``, the default)
        Each child has at least ``min_samples_leaf`` rows (default 5), so a node splits
        only if it has ``2 * min_samples_leaf`` rows; no balance rule (``alpha`` 0).
    grf's (``min_node_size`` given)
        A node of at most ``min_node_size`` rows is not split (grf's ``min.node.size``);
        each child needs ``max(min_samples_leaf, ceil(alpha * rows of the node))`` rows
        with ``min_samples_leaf`` 1 and ``alpha`` grf's 0.05 unless given. Trees grow
        deeper than under the first rules at the same number.

    Parameters
    ----------
    est : RegressionForest or a forest with ``min_samples_leaf`` (and possibly
        ``min_node_size`` and ``alpha``)

    Returns
    -------
    min_samples_split : float
    min_samples_leaf : int
    alpha : float
    """
    node = getattr(est, "min_node_size", None)
    leaf = est.min_samples_leaf
    alpha = getattr(est, "alpha", None) if hasattr(est, "min_node_size") else None
    if node is None:
        leaf = DEFAULT_MIN_SAMPLES_LEAF if leaf is None else int(leaf)
        return float(2 * leaf), leaf, 0.0 if alpha is None else float(alpha)
    leaf = 1 if leaf is None else int(leaf)
    return float(int(node) + 1), leaf, GRF_ALPHA if alpha is None else float(alpha)


#: ``min_samples_leaf`` of the scikit-learn size rules when not given (:func:`size_rules`).
DEFAULT_MIN_SAMPLES_LEAF = 5
#: grf's default ``alpha`` (regression_forest), the balance rule under ``min_node_size``.
GRF_ALPHA = 0.05


def forest_spec(est, sampling, n_features, value_fn, count_col):
    """:class:`forest.engine.honest_forest.ForestSpec` of a forest estimator's parameters.

    Parameters
    ----------
    est : RegressionForest or CausalForest
    sampling : dict
        The fit's ``sampling_`` (:func:`forest.io.continuation.forest_sampling`); its
        ``seed`` also keys the mtry draw.
    n_features : int
    value_fn : callable
        Node sums (n_nodes, C) -> node values (n_nodes, n_outputs).
    count_col : int
        Column of the node values holding the estimation count.

    Returns
    -------
    ForestSpec
    """
    tree = TreeParams(max_depth=est.max_depth, min_samples_split=size_rules(est)[0],
                      mtry=resolve_mtry(est.max_features, n_features), seed=sampling["seed"])
    return ForestSpec(int(est.n_estimators), sampling, tree, value_fn=value_fn, count_col=count_col,
                      batch_size=est.batch_size, fill_empty=bool(getattr(est, "honesty_prune_leaves", True)))


def _check_value_width(trees, width):
    """Refuse to add trees to trees of another leaf layout (a forest of an older histforest)."""
    widths = {int(t.value.shape[1]) for t in trees}
    if widths != {width}:
        raise ValueError("the trees to continue store per-tree leaf means (written by a histforest before the "
                         "forest-level weighted estimator); they cannot be continued with new trees: refit without "
                         "warm_start, or restart the checkpoint (Checkpoint(dir, restart=True))")


def n_estimators_fitted(packed):
    """Number of trees in a packed forest."""
    return len(packed["tree_offsets"]) - 1


class RegressionForest(RegressionVarianceMixin, LocalLinearMixin, ShapMixin, ForestWeightsMixin, TrainingRowsMixin,
                       RegressorMixin, EstimatorBase):
    """Honest random forest regression on binned histograms (GRF's ``regression_forest``).

    Parameters
    ----------
    n_estimators : int, default 200
    max_samples : float, default 0.5
        Fraction of the rows each tree is drawn from (without replacement).
    honest : bool, default True
        Grow on one part of each tree's subsample, estimate leaves on the other.
    honesty_fraction : float, default 0.5
        Share of the subsample used for growing.
    min_samples_leaf : int or None, default None
        Fewest rows of the tree's split half in a child: 5 when None, or 1 with
        ``min_node_size`` (:func:`size_rules`). Rows, not sample weights, as in grf.
    min_node_size : int or None, default None
        grf's ``min.node.size``: nodes of at most this many rows are not split and
        children may be smaller (down to ``min_samples_leaf`` and the ``alpha`` rule).
        ``None``: scikit-learn's rule, a node splits only into two children of
        ``min_samples_leaf`` rows each.
    alpha : float or None, default None
        grf's balance rule: each child needs ``ceil(alpha * rows of the node)`` rows, in
        ``[0, 0.25]``. None: grf's 0.05 with ``min_node_size``, else 0.
    imbalance_penalty : float, default 0.0
        grf's ``imbalance.penalty``: a split's gain (in the units of ``y`` and the sample
        weights as given) loses ``imbalance_penalty * (1/n_left + 1/n_right)`` (rows).
    honesty_prune_leaves : bool, default True
        grf's ``honesty.prune.leaves``, for leaves that no estimation row reaches (or
        only rows of zero weight). True: such a leaf takes its nearest non-empty
        ancestor's value, so every tree counts in every prediction (close to grf's
        pruning, not the same: :mod:`forest.engine.honest_forest`). False: grf's
        unpruned trees; a tree whose leaf is empty for a point is left out of that
        point's average (NaN where every tree is), which may help small data sets but
        needs more trees.
    max_depth : int or None, default None
    max_features : None, int, float, "sqrt" or "log2", default None
        Features tried per node; ``None`` is GRF's ``min(ceil(sqrt(d) + 20), d)``.
    max_bins : int, default 255
    ci_group_size : int or None, default None
        Trees per little bag (groups of trees sharing a half-sample), which
        :meth:`predict_var` and :meth:`predict_interval` need (2 or more). ``None``: grf's
        2 when ``max_samples <= 0.5``, else 1 (no variance estimates).
    batch_size : int or None, default None
        Trees grown together level by level (``None``: chosen from a memory budget).
    categorical_features : "from_dtype", list of str or int, array-like of bool, or None, default "from_dtype"
        Columns split by category subsets instead of thresholds (README, "Categorical
        features"): ``"from_dtype"`` takes pandas ``category`` and string columns, object
        columns of strings and Arrow ``dictionary``/string columns; or name them, give their
        indices or a boolean mask; ``None``: every column is numeric. A category unseen in
        training goes where missing values go. ``is_categorical_`` and ``category_coder_`` (set when
        there are categorical columns) record them.
    random_state : int or None, default None (means 0)
    equalize_cluster_weights : bool, default False
        With ``clusters`` in ``fit``: trees take ``min(cluster size)`` rows of each
        drawn cluster (grf), instead of all of them.
    warm_start : bool, default False
        When True and the forest is fitted, ``fit`` keeps its trees and adds trees up
        to ``n_estimators``: the result is the forest a single fit with that
        ``n_estimators`` grows (see :mod:`forest.io.continuation`).
    tune_parameters : None, "all" or list of str, default None
        grf's ``tune.parameters``: choose these parameters by the debiased out-of-bag
        error of small forests at random draws, smoothed by kriging
        (:mod:`forest.estimators.tuning`); ``"all"`` is the size rule in use
        (``min_samples_leaf``, or ``min_node_size`` when set), ``max_samples``,
        ``max_features``, ``honesty_fraction``, ``alpha`` and ``imbalance_penalty``.
    tune_num_trees, tune_num_reps, tune_num_draws : int, default 200, 50, 1000
        Trees of each small forest, small forests fitted, and kriging candidates.
    enable_ll_split : bool, default False
        grf's ``enable.ll.split`` (``ll_regression_forest``): split each node on the
        residuals of a ridge regression of ``y`` on the split variables fitted on the
        node's rows (:mod:`forest.criteria.local_linear_split`), for forests whose
        predictions go through :meth:`predict_local_linear`. Leaves still hold outcome
        means. One outcome; needs ``X`` (not binned codes alone); no missing values in
        the split variables; histograms widen to ``4 + 2p + p(p+1)/2`` channels.
    ll_split_lambda : float, default 0.1
        grf's ``ll.split.lambda``, the ridge penalty of the node fits.
    ll_split_weight_penalty : bool, default False
        grf's ``ll.split.weight.penalty``: penalise each coefficient by its second
        moment instead of the trace-normalised identity.
    ll_split_variables : list of int or str, or None, default None
        The split variables ``p``; None: every non-categorical column.
    ll_split_cutoff : int or None, default None
        grf's ``ll.split.cutoff``: nodes of fewer rows use the residuals of the ridge
        fitted once on the whole data; None is grf's ``floor(sqrt(n))``, 0 fits every node.

    Attributes
    ----------
    estimators_ : dict
        Packed forest; node values are ``[mean_0 .. mean_{T-1}, count]``.
    bin_mapper_ : histogram.binning.BinMapper
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when fitted on a table with string column names (or with ``feature_names``).
    n_outputs_ : int
    oob_prediction_ : ndarray, shape (n_local,) or (n_local, n_outputs)
        Out-of-bag predictions for the rows this rank passed to ``fit``.
    feature_importances_ : ndarray, shape (n_features,)
        GRF's depth-weighted split frequency.
    gain_importances_ : ndarray, shape (n_features,)
    tuned_params_, tuning_ : dict
        With ``tune_parameters``: the values the forest was grown with, and the tuning
        record (status, draws and their errors).

    Notes
    -----
    scikit-learn's estimator checks pass except those in ``_expected_failed_checks``,
    which fail by design (scikit-learn's own forests list the same one); give it to
    ``parametrize_with_checks`` or ``check_estimator`` as ``expected_failed_checks``.
    """

    #: scikit-learn checks that cannot hold for this estimator, with the reason.
    #: (scikit-learn >= 1.6 dropped the ``_xfail_checks`` tag; its own forests keep
    #: this list in its test suite and pass it as ``expected_failed_checks``.)
    _shap_kind = "ratio"      # shap_values explains the forest ratio (forest.estimators.explanations)

    _expected_failed_checks = {
        "check_sample_weight_equivalence_on_dense_data": (
            "sample_weight is not equivalent to repeating rows: each tree subsamples rows by a hash of the row "
            "id, so a row of weight 2 is drawn once where its two copies would be drawn independently"),
    }

    def __init__(self, n_estimators=200, *, max_samples=0.5, honest=True, honesty_fraction=0.5, min_samples_leaf=None,
                 min_node_size=None, alpha=None, imbalance_penalty=0.0, max_depth=None, max_features=None, max_bins=255, ci_group_size=None,
                 batch_size=None, random_state=None, equalize_cluster_weights=False, warm_start=False,
                 enable_ll_split=False, ll_split_lambda=0.1, ll_split_weight_penalty=False, ll_split_variables=None,
                 ll_split_cutoff=None,
                 categorical_features="from_dtype", tune_parameters=None, tune_num_trees=200, tune_num_reps=50,
                 tune_num_draws=1000, honesty_prune_leaves=True):
        self.n_estimators = n_estimators
        self.honesty_prune_leaves = honesty_prune_leaves
        self.tune_parameters = tune_parameters
        self.tune_num_trees = tune_num_trees
        self.tune_num_reps = tune_num_reps
        self.tune_num_draws = tune_num_draws
        self.min_node_size = min_node_size
        self.alpha = alpha
        self.imbalance_penalty = imbalance_penalty
        self.categorical_features = categorical_features
        self.max_samples = max_samples
        self.honest = honest
        self.honesty_fraction = honesty_fraction
        self.min_samples_leaf = min_samples_leaf
        self.max_depth = max_depth
        self.max_features = max_features
        self.max_bins = max_bins
        self.ci_group_size = ci_group_size
        self.batch_size = batch_size
        self.random_state = random_state
        self.equalize_cluster_weights = equalize_cluster_weights
        self.warm_start = warm_start
        self.enable_ll_split = enable_ll_split
        self.ll_split_lambda = ll_split_lambda
        self.ll_split_weight_penalty = ll_split_weight_penalty
        self.ll_split_variables = ll_split_variables
        self.ll_split_cutoff = ll_split_cutoff

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True          # NaN is a missing value, with its own bin
        tags.target_tags.multi_output = True
        return tags

    #: Where ``fit`` keeps its out-of-bag estimates of the training rows.
    _oob_attribute = "oob_prediction_"

    def _oob_in_fit(self):
        """Whether ``fit`` computes out-of-bag estimates of its rows: always (the causal forest's centering needs
        them); a subclass may make them optional (they cost a walk of every training row through its trees)."""
        return True

    def _model_io_restore_(self):
        """Defaults for the parameters that older model files lack (clusters, warm start)."""
        self.__dict__.setdefault("equalize_cluster_weights", False)
        self.__dict__.setdefault("warm_start", False)
        self.__dict__.setdefault("min_node_size", None)
        self.__dict__.setdefault("alpha", None)
        self.__dict__.setdefault("imbalance_penalty", 0.0)
        self.__dict__.setdefault("honesty_prune_leaves", True)

    def _check_params(self):
        """Validate the parameters before any data is touched; returns the seed.

        ``fit`` runs it first; ``forest-train`` and model-file loading run it too.
        """
        seed = check_forest_params(self)
        check_ll_split_params(self)
        return seed

    def fit(self, X, y, sample_weight=None, *, comm=None, progress=None, binned=None, feature_names=None,
            clusters=None, checkpoint=None):
        """Fit on this rank's rows.

        Input checks are collective (:mod:`forest.collective_checks`): when any rank's
        input is bad, every rank raises the same ``ValueError`` naming that rank.

        Parameters
        ----------
        X : array-like, pandas DataFrame or pyarrow Table, shape (n_local, n_features), or None
            NaN (or a null) means missing. ``None`` when ``binned`` is given. A table's
            column names become ``feature_names_in_`` and are checked by ``predict``.
        y : array-like, shape (n_local,) or (n_local, n_outputs)
            A column vector (n_local, 1) is kept 2-D with scikit-learn's
            ``DataConversionWarning``; predictions are then 1-D as for ``(n,)``.
        sample_weight : array-like, shape (n_local,), optional
        comm : native.comm.Communicator, optional
            ``None`` means ``native.comm.world()``.
        progress : callable, optional
            ``progress(n_trees_done, n_trees_total)``.
        binned : tuple (BinMapper, ndarray), optional
            Pre-computed ``(mapper, codes)``: a ``BinMapper`` fitted on the rows of
            all ranks and this rank's codes, uint8 of shape ``(n_features, n_local)``
            (``mapper.transform(X)``). The forest then grows on the codes and never
            needs float features (the causal forest shares its binning with its
            nuisance forests; ``forest-train`` bins parquet row groups as it reads).
        feature_names : sequence of str, optional
            Names of the binned features (``feature_names_in_``) when ``X`` is None.
        clusters : array-like of int, shape (n_local,), or forest.engine.clusters.ClusterLayout, optional
            Cluster labels (grf's ``clusters``): trees sample whole clusters, and a row
            is out of bag when its cluster is (:mod:`forest.engine.subsample`).
        checkpoint : str, os.PathLike or forest.io.checkpoint.Checkpoint, optional
            Directory where rank 0 writes the trees after every batch; a fit whose
            directory holds a checkpoint of the same data and parameters resumes from
            it, on any number of ranks (:mod:`forest.io.checkpoint`).

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        if getattr(self, "tune_parameters", None) is not None:
            return fit_tuned(self, dict(X=X, y=y, sample_weight=sample_weight, binned=binned,
                                        feature_names=feature_names, clusters=clusters, checkpoint=checkpoint),
                             comm, progress)
        seed, X, binned, y, g, n_global, (shift, scale), w_scale, unit = self._fit_inputs(
            X, y, sample_weight, binned, feature_names, comm)
        n_features = self.n_features_in_
        y2 = as_columns(y)
        n_out = y2.shape[1]
        gids, _ = global_ids(comm, len(y))
        layout = resolve_clusters(clusters, comm, len(y), self.equalize_cluster_weights, sample_weight)
        begun = begin_forest(self, X, binned, n_features, seed, comm, clustered=layout is not None)
        if begun is None:
            return self
        sampling, earlier, mapper, codes = begun
        if earlier is not None and int(self.n_outputs_) != n_out:
            raise ValueError(f"warm start: y has {n_out} output(s), the forest was fitted on {int(self.n_outputs_)}; "
                             f"adding trees needs the first fit's outputs (or warm_start=False)")
        # weights as given: the rescaled ones depend on the rank count's summation order
        given = {"y": y2, "sample_weight": check_weight(sample_weight, len(y))}
        if layout is not None:
            given["clusters"] = layout.codes
        oob = self._oob_in_fit()
        stage = open_stage(checkpoint, comm, self, stage="forest", n_total=int(self.n_estimators),
                           fingerprint=lambda: fit_fingerprint(self, comm, gids, n_global, codes, mapper, given))
        start, on_batch = continue_forest(stage, earlier, binned=codes, missing_bin=mapper.missing_bin_, gids=gids,
                                          sampling=sampling, n_estimators=int(self.n_estimators), oob=oob,
                                          clusters=layout)
        if start is not None and start.trees:
            _check_value_width(start.trees, n_out + 2)
        _, min_leaf, alpha = size_rules(self)
        # grf's penalty is in units of the raw outcome and weights' gain; the trees grow on
        # (y - shift) / scale with weights times w_scale, whose gains are w_scale / scale**2 times
        # as large (several outputs: their mean).
        penalty = 0.0
        if self.imbalance_penalty > 0:
            with np.errstate(over="ignore", divide="ignore"):
                penalty = float(np.float64(self.imbalance_penalty) * w_scale / np.mean(scale * scale))
        # Without weights (or with equal ones: exactly 1 after scaled_weights, on every rank) the
        # weight channel counts the rows, so the count channel would repeat it: one channel
        # fewer in every histogram and scan, the same splits and leaves bit for bit.
        crit = self._split_criterion(n_out, min_leaf, alpha, penalty, unit, (shift, scale))
        # Trees grow on the standardised outcome (target_standardisation); values map back.
        channels = crit.make_channels((y2 - shift) / scale, g)
        if getattr(self, "enable_ll_split", False):     # grf's ll splits: same leaves, other criterion
            crit, channels = ll_split_channels(self, X, (y2 - shift) / scale, g, n_global, comm, crit)

        def value_fn(sums):
            # grf's weighted estimator is forest-level: sum_i alpha_i w_i y_i / sum_i alpha_i w_i with
            # alpha_i the forest weights (each tree's 1 / leaf rows). So a leaf holds its weighted
            # mean times its mean weight (sum w y / rows), the rows, and its mean weight (sum w / rows),
            # and a prediction is the ratio of the trees' sums (forest_ratio). Without weights the
            # mean weight is exactly 1 and every prediction the mean of the trees' leaf means.
            out = np.empty((len(sums), n_out + 2))
            weight = crit.node_weight(sums)
            # A node whose estimation rows all have zero weight knows nothing of y: it
            # counts as empty and takes its parent's value (fill_empty_from_parent).
            rows = np.where(weight > 0, crit.node_count(sums), 0.0)
            with np.errstate(invalid="ignore", divide="ignore"):
                mean_weight = np.where(rows > 0, weight / np.where(rows > 0, rows, 1.0), 0.0)
            out[:, :n_out] = (crit.node_value(sums) * scale + shift) * mean_weight[:, None]
            out[:, n_out] = rows
            out[:, n_out + 1] = mean_weight
            return out

        self.n_outputs_ = n_out
        self.sampling_ = sampling
        packed, acc, cnt = grow_honest_forest(
            codes, mapper, gids, channels, crit, forest_spec(self, sampling, n_features, value_fn, n_out),
            n_global=n_global, comm=comm, oob=oob, progress=progress, clusters=layout, start=start,
            on_batch=on_batch)
        self.estimators_ = packed
        self.bin_mapper_ = mapper
        if oob:
            values = self._oob_from_sums(acc, cnt, codes)
            setattr(self, self._oob_attribute, values[:, 0] if y.ndim == 1 else values)
        else:
            self.__dict__.pop(self._oob_attribute, None)   # an earlier fit's, of other rows perhaps
        self._record_training_rows(comm, gids, n_global, codes, [y2])
        self._keep_weights_source(codes, gids, g, layout)
        self.feature_importances_ = depth_weighted_importance(packed, n_features)
        self.gain_importances_ = gain_importance(packed, n_features)
        return self

    def _split_criterion(self, n_out, min_leaf, alpha, penalty, unit, standardisation):
        """The criterion ``fit`` grows on (a subclass on recoded targets may take a cheaper one).

        Parameters
        ----------
        n_out : int
            Target columns.
        min_leaf, alpha, penalty
            The size rules and the imbalance penalty in the gain's units.
        unit : bool
            Every row of every rank weighs exactly 1.
        standardisation : tuple of ndarray, shape (n_out,) each
            ``(shift, scale)`` of :func:`target_standardisation`.

        Returns
        -------
        forest.criteria.basic.VarianceCriterion
        """
        return VarianceCriterion(n_out, min_samples_leaf=min_leaf, count_channel=not unit, rows_are_weights=unit,
                                 alpha=alpha, imbalance_penalty=penalty)

    def _fit_inputs(self, X, y, sample_weight, binned, feature_names, comm):
        """Validate ``fit``'s arguments on every rank together.

        Returns
        -------
        seed : int
        X : ndarray of float64, shape (n_local, n_features), or None
        binned : tuple (BinMapper, ndarray) or None
        y : ndarray of float64, shape (n_local,) or (n_local, n_outputs)
        g : ndarray of float64, shape (n_local,)
            Sample weights rescaled to mean 1 over all ranks' rows (:func:`scaled_weights`).
        n_global : int
        standardisation : tuple of ndarray, shape (n_outputs,) each
            ``(shift, scale)`` of :func:`target_standardisation`.
        weight_scale : float
            About ``g / sample_weight`` (:func:`g_scale`).
        unit : bool
            Every row of every rank weighs exactly 1 (no weights, or equal ones).
        """
        with collective_checks(comm) as checks:
            seed = self._check_params()
            X, binned, n = fit_features(self, X, binned, feature_names, min_samples=1 if comm.size == 1 else 0)
            resolve_mtry(self.max_features, self.n_features_in_)
            y, target_summary = self._local_target(y, n)
            g = check_weight(sample_weight, n)
            # The channels hold the rescaled weights and the standardised y (|y| < 1): only
            # the weights' sum is left to check, whatever the magnitude of y.
            checks.share(rows=n, moments=moment_sums(g, None), weights=weight_range(g), target=target_summary,
                         **feature_summary(self))
        summaries = checks.summaries
        agreed_features(summaries, self)
        y, standardisation = self._agreed_target(summaries, y)
        n_global = total(summaries, "rows")
        check_row_count(self, n_global, 2, comm.size)
        moments = total(summaries, "moments")
        weight_total = moments[0]  # sum |g| = sum g: weights are non-negative
        g = scaled_weights(g, n_global, weight_total, [s["weights"] for s in summaries])   # checks the total first
        w_scale = g_scale(n_global, weight_total, [s["weights"] for s in summaries])
        check_moment_sums(moments[:1] * (n_global / weight_total))
        unit = common_weight([s["weights"] for s in summaries]) is not None
        return seed, X, binned, y, g, n_global, standardisation, w_scale, unit

    def _weights_columns(self):
        """``(count_col, norm_col)`` of the leaves for :meth:`get_forest_weights`."""
        k = self.n_outputs_
        if self.estimators_["value"].shape[1] != k + 2:
            raise ValueError("this forest stores per-tree leaf means (written by a histforest before the forest-level "
                             "weighted estimator): its predictions are not a forest-weighted mean; refit it to get "
                             "forest weights")
        return k, k + 1

    def _weights_factor(self, sample_weight, n_local, comm):
        """The fit's rescaled sample weights of training rows passed again (collective)."""
        return rescaled_weights_again(sample_weight, n_local, comm)

    def _local_target(self, y, n):
        """This rank's ``y``, checked, and what every rank shares of it (inside ``fit``'s collective checks).

        The hook a forest of another target kind overrides (:class:`ProbabilityForest` codes class
        labels) to reuse the rest of ``fit``.

        Parameters
        ----------
        y : array-like, shape (n,) or (n, n_outputs)
        n : int
            Rows of ``X`` on this rank.

        Returns
        -------
        y : ndarray of float64, shape (n,) or (n, n_outputs)
        summary : dict
            Small picklable values, read back by :meth:`_agreed_target` from every rank.
        """
        y = check_target(y, "y", n, estimator=self, warn_column=True)
        return y, {"outputs": y.shape[1:], "y_range": target_range(as_columns(y))}

    def _agreed_target(self, summaries, y):
        """The target the trees grow on, from every rank's :meth:`_local_target` summary (the same on every rank).

        Parameters
        ----------
        summaries : list of dict
            :func:`forest.collective_checks.collective_checks`'s summaries; each holds ``target``.
        y : ndarray
            This rank's checked target.

        Returns
        -------
        y : ndarray of float64, shape (n,) or (n, n_outputs)
        standardisation : tuple of ndarray, shape (n_outputs,) each
            ``(shift, scale)`` of :func:`target_standardisation`.
        """
        require_same([s["target"] for s in summaries], "outputs",
                     lambda s: f"y has shape (n, {s[0]})" if s else "y is 1-D")
        return y, target_standardisation([s["target"]["y_range"] for s in summaries])

    def _oob_from_sums(self, acc, cnt, codes):
        """Out-of-bag means (n, n_outputs_) from out-of-bag sums; rows every tree sampled get the forest mean."""
        full = None
        if (cnt == 0).any():
            # rows every tree sampled (rare): fall back to the in-sample prediction
            full = self._forest_ratio(predict_values_binned(self.estimators_, codes, self.bin_mapper_.missing_bin_)
                                      / n_estimators_fitted(self.estimators_))
        with np.errstate(invalid="ignore", divide="ignore"):
            oob = self._forest_ratio(acc / cnt[:, None])
        if full is not None:
            oob[cnt == 0] = full[cnt == 0]
        return oob

    def oob_prediction_binned(self, codes, gids, clusters=None):
        """Out-of-bag predictions of training rows given as codes, recomputed from the trees.

        The fit's ``oob_prediction_`` bit for bit (each row adds its trees in the same
        order); a causal forest's warm start takes its kept nuisance forests' estimates
        from here.

        Parameters
        ----------
        codes : ndarray of uint8, shape (n_features, n_local)
            This rank's training rows, binned with ``bin_mapper_``.
        gids : ndarray of int64, shape (n_local,)
            Their global row ids in the fit.
        clusters : forest.engine.clusters.ClusterLayout, optional
            As in the fit.

        Returns
        -------
        ndarray, shape (n_local, n_outputs_)
        """
        check_is_fitted(self, "estimators_")
        acc, cnt = oob_sums_binned(self.estimators_, codes, self.bin_mapper_.missing_bin_, gids, self.sampling_,
                                   clusters)
        return self._oob_from_sums(acc, cnt, codes)

    def _forest_ratio(self, mean_values):
        """Predictions ``(n, n_outputs_)`` from leaf vectors averaged over trees (grf's weighted estimator).

        Leaves hold ``sum w y / rows, rows, sum w / rows``: the prediction is the ratio of the
        first and the last, the forest-weighted mean ``sum_i alpha_i w_i y_i / sum_i alpha_i w_i``.
        Forests written before that (``n_outputs_ + 1`` values: the weighted leaf mean and the
        rows) predict the mean of their trees' leaf means, as they did.
        """
        k = self.n_outputs_
        if mean_values.shape[1] == k + 1:
            return mean_values[:, :k]
        with np.errstate(invalid="ignore", divide="ignore"):
            return mean_values[:, :k] / mean_values[:, k + 1:k + 2]

    def _predict_raw(self, X):
        n_trees = len(self.estimators_["tree_offsets"]) - 1
        return self._forest_ratio(predict_values(self.estimators_, X) / n_trees)

    def predict(self, X):
        """Forest prediction.

        Parameters
        ----------
        X : array-like, shape (n, n_features)

        Returns
        -------
        ndarray, shape (n,) or (n, n_outputs)
        """
        check_is_fitted(self, "estimators_")
        X = validate_features(self, X, reset=False, min_samples=0)
        out = self._predict_raw(X)
        return out[:, 0] if self.n_outputs_ == 1 else out

    def _row_columns(self, y, *, n):
        """The target as ``fit`` codes it for :attr:`training_rows_`: ``[y (n, n_outputs)]``."""
        return [as_columns(check_target(y, "y", n, estimator=self))]

    def oob_predict(self, X=None, *, comm=None, clusters=None):
        """Out-of-bag predictions for the training rows of this rank (same order as in ``fit``).

        Parameters
        ----------
        X : array-like, shape (n_local, n_features), optional
            Exactly the rows this rank passed to ``fit``. Without it, the fitting
            process's own ``oob_prediction_``.
        comm : native.comm.Communicator, optional
            The communicator used in ``fit`` (global row ids are recomputed from it).
        clusters : array-like, optional
            The cluster labels passed to ``fit`` (needed when it had clusters).

        Returns
        -------
        ndarray, shape (n_local,) or (n_local, n_outputs)
            A row that every tree drew (few trees, or little bags: a group's trees share
            its half-sample) takes the whole forest's prediction, as in ``oob_prediction_``.
        """
        if X is None:
            check_is_fitted(self, "estimators_")
            if clusters is not None:
                raise ValueError("clusters go with X: without X the fit's own rows and clusters are used")
            if getattr(self, "oob_prediction_", None) is None:
                raise ValueError("out-of-bag predictions without X exist only in the process that ran fit; pass the "
                                 "training rows: oob_predict(X)")
            return self.oob_prediction_
        comm = world() if comm is None else comm
        with collective_checks(comm):
            check_is_fitted(self, "estimators_")
            X = validate_features(self, X, reset=False, min_samples=0)
        gids, _ = global_ids(comm, len(X))
        layout = resolve_clusters(clusters, comm, len(X), self.equalize_cluster_weights, None,
                                  fitted=self.sampling_.get("clusters", False))
        avg, cnt = oob_average(self.estimators_, X, gids, self.sampling_, clusters=layout)
        avg = self._forest_ratio(avg)
        if (cnt == 0).any():
            # rows every tree drew: the whole forest's prediction, as fit's oob_prediction_ has
            avg[cnt == 0] = self._predict_raw(X[cnt == 0])
        return avg[:, 0] if self.n_outputs_ == 1 else avg


# Model files name it as they always have (forest.io.model_io.register); its restored state's checks.
model_io.register(RegressionForest, name="forest.regression_forest.RegressionForest",
                  check=model_checks.check_regression_forest)

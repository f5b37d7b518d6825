"""What a fitted estimator read from a model file must satisfy before any method runs.

This module owns the consistency of an estimator's state *as a whole*. Each piece is
checked where it lives: trees and packed forests by :mod:`forest.engine.tree`
(:func:`~forest.engine.tree.validate_packed`, :meth:`~forest.engine.tree.Tree.validate_state`), bin
mappers by :meth:`histogram.binning.BinMapper.validate_state`, parameters by the
estimator's own ``_check_params``. What is left, and lives here, is how the pieces fit:

* which fitted attributes each estimator has (an estimator with none of them is an
  unfitted one, which is fine; one with only some is not of the class it names);
* their types and shapes (``n_features_in_``, ``feature_names_in_``, class labels,
  baselines, sampling settings, average effects, importances);
* agreement between pieces: the splits' features and bins against ``n_features_in_``
  and the bin mapper, the width of the node values against the outputs the
  estimator reads, a gradient-boosting model's trees against its packed copy.

The prediction kernels trust the structure (an index out of range would read outside
an array, a cycle would never end), and every estimator method trusts its attributes,
so :func:`forest.io.model_io.load` runs :func:`check_estimator` on every estimator it
restores and a file that fails is refused with one line.
"""
import numbers

import numpy as np

from histogram.binning import BinMapper

from forest.criteria.causal import CausalChannels
from forest.criteria.instrumental import InstrumentalChannels
from forest.io.training_rows import validate_signature
from forest.engine.tree import Tree, pack_trees, validate_categorical, validate_packed
from histogram.categories import CategoryCoder


class ContentMismatch(ValueError):
    """The state in a file is not one of the class its header names (it lacks what that class has).

    Raised by the checks of a restored object; :func:`forest.io.model_io.load` turns it
    into a :class:`~forest.io.model_io.ModelFormatError` saying that the contents do not
    match the class.
    """


#: Parameters added after model files of their estimators were first written: a file
#: without one gets its default (the behaviour the older model had: it could not have
#: been fitted on categorical columns, and ``cat_smooth`` only acts on them).
ADDED_PARAMS = ("categorical_features", "cat_smooth", "cat_l2", "min_data_per_group", "max_cat_threshold",
                "min_node_size", "tune_parameters",
                "enable_ll_split", "ll_split_lambda", "ll_split_weight_penalty", "ll_split_variables", "ll_split_cutoff",
                "tune_num_trees", "tune_num_reps", "tune_num_draws", "honesty_prune_leaves", "stabilize_splits")


def _init_defaults(cls):
    import inspect

    return {name: p.default for name, p in inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


def check_estimator(est, check):
    """Check a restored estimator's parameters and fitted state.

    The checks of each kind are chosen by the estimator's module: it registers its
    class with the format together with the ``check_*`` function of this module that
    fits it (:func:`forest.io.model_io.register`); this module knows no estimator
    class, so the format below the estimators never imports them.

    Parameters
    ----------
    est : object
        A restored object.
    check : callable or None
        ``check(est)``: its kind's checks; None (trees, bin mappers, classes registered
        by other code) passes unchecked here.

    Raises
    ------
    ContentMismatch
        The state lacks parameters or fitted attributes of ``type(est)`` (or holds
        ones another estimator kind has).
    ValueError, TypeError
        A parameter, attribute or structure is invalid or inconsistent.
    """
    if check is None:
        return  # a class registered by other code: its own business
    defaults = _init_defaults(type(est))
    for name in ADDED_PARAMS:
        if name in defaults and name not in vars(est):
            setattr(est, name, defaults[name])   # a file written before the parameter existed
    missing = [p for p in type(est)._get_param_names() if p not in vars(est)]
    if missing:
        raise ContentMismatch(f"it has no parameter {missing[0]!r}")
    est._check_params()
    check(est)
    if "training_rows_" in vars(est):       # absent in files written before it existed
        validate_signature(vars(est)["training_rows_"])


# ------------------------------------------------------------------ attribute checks

def _is_fitted(est, required):
    """False for an unfitted estimator; raises when only some fitted attributes exist."""
    present = [a for a in required if a in vars(est)]
    if not present:
        return False
    missing = [a for a in required if a not in vars(est)]
    if missing:
        raise ContentMismatch(f"it has no fitted attribute {missing[0]!r}")
    return True


def _int(est, name, lo, hi=None):
    v = vars(est)[name]
    if not isinstance(v, numbers.Integral) or isinstance(v, (bool, np.bool_)) or v < lo \
            or (hi is not None and v > hi):
        raise ValueError(f"{name} must be an int in [{lo}, {'inf' if hi is None else hi}], got {v!r}")
    return int(v)


def _float_array(est, name, shape):
    v = vars(est)[name]
    if not isinstance(v, (np.ndarray, np.floating)) or v.dtype != np.float64 or np.shape(v) != shape:
        got = f"{v.dtype} of shape {np.shape(v)}" if isinstance(v, (np.ndarray, np.generic)) else type(v).__name__
        raise ValueError(f"{name} must be float64 of shape {shape}, got {got}")
    return v


def _n_features(est):
    """``n_features_in_`` and, when present, ``feature_names_in_`` (one str per feature)."""
    n = _int(est, "n_features_in_", 1)
    names = vars(est).get("feature_names_in_")
    if names is not None and not (isinstance(names, np.ndarray) and names.shape == (n,)
                                  and all(isinstance(s, str) for s in names.tolist())):
        raise ValueError(f"feature_names_in_ must hold {n} column names")
    return n


def _bin_thresholds(est, n_features):
    """The validated bin mapper's thresholds per feature."""
    mapper = vars(est)["bin_mapper_"]
    if not isinstance(mapper, BinMapper):
        raise ValueError(f"bin_mapper_ must be a BinMapper, got {type(mapper).__name__}")
    BinMapper.validate_state(mapper.get_state())
    if mapper.n_features_in_ != n_features:
        raise ValueError(f"the bin mapper has {mapper.n_features_in_} features, the model {n_features}")
    _check_categories(est, mapper, n_features)
    return mapper.bin_thresholds_


def _check_categories(est, mapper, n_features):
    """The category coder, the estimator's ``is_categorical_`` and the bin mapper agree."""
    coder = vars(est).get("category_coder_")
    marked = np.flatnonzero(getattr(mapper, "categorical_", np.zeros(n_features, bool)))
    coded = n_features
    if coder is None and _PARENT_CODER:
        # a nuisance forest: fitted on its parent's codes (binned input), it reads coded
        # matrices from the parent and is checked against the parent's coder (a causal survival
        # forest's survival forests have the treatment as one more, numeric, feature)
        coder, extra = _PARENT_CODER[-1]
        coded = n_features - extra
    if coder is None:
        if len(marked):
            raise ValueError(f"the bin mapper marks features {marked.tolist()} categorical, but the model has no "
                             "category_coder_")
        return
    if not isinstance(coder, CategoryCoder):
        raise ValueError(f"category_coder_ must be a CategoryCoder, got {type(coder).__name__}")
    CategoryCoder.validate_state(coder.get_state())
    if coder.n_features_in_ != coded or not np.array_equal(coder.columns_, marked):
        raise ValueError(f"category_coder_ codes features {coder.columns_.tolist()}, the bin mapper marks "
                         f"{marked.tolist()} categorical")
    if not np.array_equal(mapper.n_bins_non_missing_[marked], coder.n_codes_):
        raise ValueError("category_coder_'s code counts differ from the bin mapper's value bins")


def _categorical_features(est):
    mapper = vars(est).get("bin_mapper_")
    return getattr(mapper, "categorical_", None)


def _forest(est, name, n_features, bins, width):
    validate_packed(vars(est)[name], n_features, bins, width, what=name)
    validate_categorical(vars(est)[name], _categorical_features(est), what=name)


# ------------------------------------------------------------------ gradient boosting

_GBDT_FITTED = ("n_features_in_", "bin_mapper_", "baseline_", "trees_", "n_iter_", "validation_loss_",
                "do_early_stopping_", "n_outputs_")


def _check_gbdt(est, n_outputs_of):
    n_features = _n_features(est)
    bins = _bin_thresholds(est, n_features)
    k = _int(est, "n_outputs_", 1)
    if k != n_outputs_of:
        raise ValueError(f"n_outputs_ is {k}, the model needs {n_outputs_of}")
    _float_array(est, "baseline_", (k,))
    if not np.isfinite(est.baseline_).all():
        raise ValueError("baseline_ is not finite")
    trees = est.trees_
    if not isinstance(trees, list) or not trees or not all(isinstance(t, Tree) for t in trees):
        raise ValueError("trees_ must be a non-empty list of trees")
    for i, tree in enumerate(trees):
        try:
            tree.validate(n_features, bins)
            validate_categorical(pack_trees([tree]), _categorical_features(est))
        except ValueError as exc:
            raise ValueError(f"trees_[{i}]: {exc}") from None
        if tree.n_outputs != k:
            raise ValueError(f"trees_[{i}] holds {tree.n_outputs} outputs, the model needs {k}")
    if _int(est, "n_iter_", 1) != len(trees):
        raise ValueError(f"n_iter_ is {est.n_iter_} but there are {len(trees)} trees")
    if "_packed" in vars(est):
        # Prediction reads the packed copy, reports read the trees: they must be one model.
        _forest(est, "_packed", n_features, bins, k)
        expected = pack_trees(trees)
        if any(not np.array_equal(est._packed[key], v, equal_nan=v.dtype.kind == "f") for key, v in expected.items()):
            raise ValueError("the packed forest _packed is not the packing of trees_")
    loss = est.validation_loss_
    if not (isinstance(loss, np.ndarray) and loss.ndim == 1 and loss.dtype == np.float64):
        raise ValueError("validation_loss_ must be a 1-D float64 array")
    if not isinstance(est.do_early_stopping_, (bool, np.bool_)):
        raise ValueError(f"do_early_stopping_ must be true or false, got {est.do_early_stopping_!r}")


def check_gbdt_regressor(est):
    foreign = [a for a in ("classes_", "n_classes_") if a in vars(est)]
    if foreign:
        raise ContentMismatch(f"it has {foreign[0]!r}, which a regressor does not have")
    if _is_fitted(est, _GBDT_FITTED):
        _check_gbdt(est, 1)


def _check_classes(est):
    """A classifier's ``classes_`` (at least two distinct sorted labels) and ``n_classes_``; returns the count."""
    classes = est.classes_
    # String labels from pandas (or an object array) keep the object dtype fit gave them.
    labels = isinstance(classes, np.ndarray) and classes.ndim == 1 and (
        classes.dtype.kind in "biufU" or (classes.dtype.kind == "O" and all(isinstance(c, str) for c in classes)))
    if not (labels and classes.size >= 2 and np.array_equal(np.unique(classes), classes)):
        raise ValueError("classes_ must be at least two distinct sorted labels")
    n_classes = _int(est, "n_classes_", 2)
    if n_classes != classes.size:
        raise ValueError(f"n_classes_ is {n_classes} but classes_ holds {classes.size} labels")
    return n_classes


def check_gbdt_classifier(est):
    if not _is_fitted(est, _GBDT_FITTED + ("classes_", "n_classes_")):
        return
    n_classes = _check_classes(est)
    _check_gbdt(est, 1 if n_classes == 2 else n_classes)


# ------------------------------------------------------------------ honest forests

_SAMPLING_TYPES = {"seed": numbers.Integral, "sample_fraction": numbers.Real, "ci_group_size": numbers.Integral,
                   "honest": (bool, np.bool_), "honesty_fraction": numbers.Real}
#: Keys of ``sampling_`` that files written before they existed may lack.
_SAMPLING_OPTIONAL = {"clusters": (bool, np.bool_), "segments": list}


def _check_forest(est, width):
    """What both honest forests share; ``width`` is the node value width they read."""
    n_features = _n_features(est)
    bins = _bin_thresholds(est, n_features)
    _forest(est, "estimators_", n_features, bins, width)
    sampling = est.sampling_
    types = dict(_SAMPLING_TYPES, **{k: t for k, t in _SAMPLING_OPTIONAL.items()
                                     if isinstance(sampling, dict) and k in sampling})
    if not (isinstance(sampling, dict) and set(sampling) == set(types)
            and all(isinstance(sampling[k], t) for k, t in types.items())
            and all(not isinstance(sampling[k], (bool, np.bool_)) for k in _SAMPLING_TYPES if k != "honest")):
        raise ValueError(f"sampling_ must map {sorted(_SAMPLING_TYPES)} to values of their types")
    segments = sampling.get("segments")
    if segments is not None:
        # A merged forest (forest.io.merge): [seed, first tree, count] per part, in packed order.
        n_trees = len(est.estimators_["tree_offsets"]) - 1
        if not (all(isinstance(seg, list) and len(seg) == 3 and all(isinstance(v, numbers.Integral)
                                                                    and not isinstance(v, (bool, np.bool_))
                                                                    and v >= 0 for v in seg) for seg in segments)
                and sum(seg[2] for seg in segments) == n_trees):
            raise ValueError(f"sampling_['segments'] must list [seed, first tree, count] parts of all {n_trees} trees")
    if not (sampling["seed"] >= 0 and 0 < sampling["sample_fraction"] <= 1 and sampling["ci_group_size"] >= 1
            and 0 < sampling["honesty_fraction"] < 1):
        raise ValueError(f"sampling_ holds values out of range: {sampling}")
    for name in ("feature_importances_", "gain_importances_"):
        _float_array(est, name, (n_features,))


_FOREST_FITTED = ("estimators_", "bin_mapper_", "n_features_in_", "n_outputs_", "sampling_", "feature_importances_",
                  "gain_importances_")


def check_regression_forest(est):
    foreign = [a for a in ("classes_", "n_classes_", "oob_decision_function_", "oob_score_") if a in vars(est)]
    if foreign:
        raise ContentMismatch(f"it has {foreign[0]!r}, which a regression forest does not have")
    _check_regression_state(est)


def check_probability_forest(est):
    """A regression forest on one-hot targets, one output per class of ``classes_``."""
    if "oob_prediction_" in vars(est):
        raise ContentMismatch("it has 'oob_prediction_', which a probability forest keeps as oob_decision_function_")
    if not _is_fitted(est, _FOREST_FITTED + ("classes_", "n_classes_")):
        return
    n_classes = _check_classes(est)
    _check_regression_state(est)
    if est.n_outputs_ != n_classes:
        raise ValueError(f"n_outputs_ is {est.n_outputs_} but the forest has {n_classes} classes")
    oob = vars(est).get("oob_decision_function_")
    if oob is not None and not (isinstance(oob, np.ndarray) and oob.dtype == np.float64 and oob.ndim == 2
                                and oob.shape[1] == n_classes):
        raise ValueError(f"oob_decision_function_ must be float64 of shape (n, {n_classes})")
    score = vars(est).get("oob_score_")
    if score is not None and not (isinstance(score, float) and 0.0 <= score <= 1.0):
        raise ValueError(f"oob_score_ must be a float in [0, 1], got {score!r}")


def _check_regression_state(est):
    """What a regression forest's fitted state must satisfy (the probability forest's too)."""
    if not _is_fitted(est, _FOREST_FITTED):
        return
    k = _int(est, "n_outputs_", 1)
    # node values: k weighted sums over rows, the estimation rows, their mean weight (grf's
    # forest-level weighted estimator); files of before it: k means, then the rows
    values = est.estimators_.get("value") if isinstance(est.estimators_, dict) else None
    width = values.shape[1] if isinstance(values, np.ndarray) and values.ndim == 2 else k + 2
    _check_forest(est, width if width in (k + 1, k + 2) else k + 2)
    oob = vars(est).get("oob_prediction_")  # a causal forest's nuisance forests drop theirs
    if oob is not None and not (isinstance(oob, np.ndarray) and oob.dtype == np.float64
                                and (oob.ndim == 1 and k == 1 or oob.ndim == 2 and oob.shape[1] == k)):
        raise ValueError(f"oob_prediction_ must be float64 of shape (n,) or (n, {k})")


def check_quantile_forest(est):
    """A restored :class:`forest.QuantileForest`: the forest, its outcome bins and its leaves' outcome lists."""
    if not _is_fitted(est, ("estimators_", "bin_mapper_", "n_features_in_", "sampling_", "leaf_outcomes_",
                            "outcome_bin_mapper_", "feature_importances_", "gain_importances_")):
        return
    _check_forest(est, 2)
    mapper = est.outcome_bin_mapper_
    if not isinstance(mapper, BinMapper):
        raise ValueError(f"outcome_bin_mapper_ must be a BinMapper, got {type(mapper).__name__}")
    BinMapper.validate_state(mapper.get_state())
    _check_leaf_lists(est, ("offsets", "y", "weight"))


def _check_leaf_lists(est, keys):
    """``est.leaf_outcomes_``: the leaves' lists (:func:`forest.engine.leaf_outcomes.gather_leaf_outcomes`)."""
    lists = est.leaf_outcomes_
    n_nodes = len(est.estimators_["feature"])
    if not (isinstance(lists, dict) and set(lists) == set(keys)
            and all(isinstance(v, np.ndarray) and v.ndim == 1 for v in lists.values())):
        raise ValueError(f"leaf_outcomes_ must map {', '.join(keys)} to 1-D arrays")
    offsets, y, weight = lists["offsets"], lists["y"], lists["weight"]
    if not (offsets.dtype == np.int64 and len(offsets) == n_nodes + 1 and offsets[0] == 0
            and np.all(np.diff(offsets) >= 0) and offsets[-1] == len(y) == len(weight)):
        raise ValueError(f"leaf_outcomes_['offsets'] must be int64 of shape ({n_nodes + 1},), from 0, non-decreasing, "
                         f"ending at the number of outcomes")
    if not (y.dtype == np.float64 and weight.dtype == np.float64 and np.all(np.isfinite(y))
            and np.all(np.isfinite(weight)) and np.all(weight >= 0)):
        raise ValueError("leaf_outcomes_ must hold finite float64 outcomes and non-negative finite weights")
    if "event" in keys:
        event = lists["event"]
        if not (event.dtype == np.uint8 and len(event) == len(y) and np.all(event <= 1)):
            raise ValueError("leaf_outcomes_['event'] must be uint8 flags (0 or 1), one per outcome")


def check_survival_forest(est):
    """A restored :class:`forest.SurvivalForest`: the forest, its failure grid and its leaves' lists."""
    if not _is_fitted(est, ("estimators_", "bin_mapper_", "n_features_in_", "sampling_", "leaf_outcomes_",
                            "failure_times_", "feature_importances_", "gain_importances_")):
        return
    _check_forest(est, 2)
    grid = est.failure_times_
    if not (isinstance(grid, np.ndarray) and grid.dtype == np.float64 and grid.ndim == 1 and len(grid)
            and np.all(np.isfinite(grid)) and np.all(np.diff(grid) > 0)):
        raise ValueError("failure_times_ must be a non-empty increasing float64 array of finite times")
    _check_leaf_lists(est, ("offsets", "y", "weight", "event"))
    if np.any(est.leaf_outcomes_["y"] < 0):
        raise ValueError("leaf_outcomes_['y'] (the times) must be non-negative")


def check_causal_survival_parts(est, survival_class):
    """What a restored :class:`forest.CausalSurvivalForest` adds to a causal forest: its horizon, target,
    scores' grid and nuisance survival forests (on the features plus the treatment)."""
    if not _is_fitted(est, ("horizon_", "target_", "failure_times_", "survival_forest_")):
        return
    h = est.horizon_
    if not isinstance(h, float) or not np.isfinite(h) or h <= 0:
        raise ValueError(f"horizon_ must be a finite positive float, got {h!r}")
    if est.target_ not in ("RMST", "survival_probability"):
        raise ValueError(f"target_ must be 'RMST' or 'survival_probability', got {est.target_!r}")
    grid = est.failure_times_
    if not (isinstance(grid, np.ndarray) and grid.dtype == np.float64 and grid.ndim == 1 and len(grid)
            and np.all(np.isfinite(grid)) and np.all(np.diff(grid) > 0) and grid[-1] == h):
        raise ValueError("failure_times_ must be increasing finite float64 times ending at the horizon")
    for name in ("survival_forest_", "censoring_forest_"):
        forest = vars(est).get(name)
        if forest is None and name == "censoring_forest_":
            continue
        if type(forest) is not survival_class:
            raise ValueError(f"{name} must be a {survival_class.__name__}, got {type(forest).__name__}")
        # its own content too (leaf lists, trees, bin edges): the kernels trust them
        _check_nested(est, name, forest, check_survival_forest, extra_features=1)
        if getattr(forest, "n_features_in_", None) != est.n_features_in_ + 1:
            raise ValueError(f"{name} must have the forest's features plus the treatment "
                             f"({est.n_features_in_ + 1}), got {getattr(forest, 'n_features_in_', None)}")


def check_summary_tree(est, forest_class):
    """A restored :class:`forest.CateSummaryTree`: its one-tree routing forest and per-node estimates."""
    if not _is_fitted(est, ("forest_", "node_effect_", "node_stderr_", "node_rows_", "n_features_in_")):
        return
    forest = vars(est)["forest_"]
    if type(forest) is not forest_class or not isinstance(getattr(forest, "estimators_", None), dict):
        raise ValueError(f"forest_ must be a fitted {forest_class.__name__}, got {type(forest).__name__}")
    offsets = forest.estimators_.get("tree_offsets")
    if not isinstance(offsets, np.ndarray) or offsets.shape != (2,):
        raise ValueError("forest_ of a summary tree holds exactly one tree")
    n_nodes = int(offsets[1] - offsets[0])
    for name in ("node_effect_", "node_stderr_"):
        _float_array(est, name, (n_nodes,))
    rows = vars(est)["node_rows_"]
    if not (isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.shape == (n_nodes,)
            and np.all(rows >= 0)):
        raise ValueError(f"node_rows_ must be non-negative int64 of shape ({n_nodes},)")
    if _int(est, "n_features_in_", 1) != forest.n_features_in_:
        raise ValueError("n_features_in_ differs from the routing forest's")


#: ``(coder, extra features)`` of the effect forest whose nuisance forests are being checked (a stack).
_PARENT_CODER = []


def _check_nested(est, name, forest, check, extra_features=0):
    """A forest held by ``est`` (fitted on its codes, plus ``extra_features`` numeric columns): its own
    checks against ``est``'s category coder; it must be fitted."""
    _PARENT_CODER.append((vars(est).get("category_coder_"), extra_features))
    try:
        check_estimator(forest, check)
    except (ValueError, TypeError) as exc:  # a mismatch inside is corruption of this file
        raise ValueError(f"{name}: {exc}") from None
    finally:
        _PARENT_CODER.pop()
    if "estimators_" not in vars(forest):
        raise ValueError(f"{name} is not fitted")


def _check_nuisance(est, name, n_outputs, nuisance_class):
    """An effect forest's nuisance forest ``name``: None, or a fitted ``nuisance_class`` on its features."""
    forest = vars(est).get(name)
    if forest is None:
        return
    if type(forest) is not nuisance_class:
        raise ValueError(f"{name} must be a {nuisance_class.__name__} or None, got {type(forest).__name__}")
    _check_nested(est, name, forest, check_regression_forest)
    if forest.n_features_in_ != est.n_features_in_ or forest.n_outputs_ != n_outputs:
        raise ValueError(f"{name} has {forest.n_features_in_} features and {forest.n_outputs_} outputs, the model "
                         f"needs {est.n_features_in_} and {n_outputs}")


_TREATMENT_KINDS = ("binary", "categorical", "continuous")


def check_causal_forest(est, nuisance_class):
    if not _is_fitted(est, ("estimators_", "bin_mapper_", "treatment_type_", "classes_", "n_treatments_",
                            "n_outcomes_", "n_features_in_", "y_ndim_", "sampling_",
                            "feature_importances_", "gain_importances_")):
        return
    # A merged forest (forest.io.merge) has no average effect: its rows' out-of-bag trees
    # span several fits. Every other fitted causal forest has one.
    merged = isinstance(est.sampling_, dict) and est.sampling_.get("segments") is not None
    if not merged:
        _is_fitted(est, ("ate_", "ate_stderr_", "treatment_type_"))
    kind = est.treatment_type_
    if kind not in _TREATMENT_KINDS:
        raise ValueError(f"treatment_type_ must be one of {_TREATMENT_KINDS}, got {kind!r}")
    values = est.estimators_.get("value") if isinstance(est.estimators_, dict) else None
    width = values.shape[1] if isinstance(values, np.ndarray) and values.ndim == 2 else 0
    # The moment layout has more than K + M columns: bounding K and M by the stored width
    # first keeps a corrupted K from building a huge layout.
    K = _int(est, "n_treatments_", 1, max(width, 1))
    M = _int(est, "n_outcomes_", 1, max(width, 1))
    y_ndim = _int(est, "y_ndim_", 1, 2)
    if y_ndim == 1 and M != 1:
        raise ValueError(f"a 1-D outcome has one column, but n_outcomes_ is {M}")
    classes = est.classes_
    if kind == "continuous":
        if classes is not None:
            raise ValueError("a continuous treatment has no classes_")
    elif not (isinstance(classes, np.ndarray) and classes.dtype.kind in "biuf" and classes.shape == (K + 1,)
              and np.array_equal(np.unique(classes), classes)):
        raise ValueError(f"classes_ of a {kind} treatment must be {K + 1} distinct sorted levels")
    elif kind == "binary" and K != 1:
        raise ValueError(f"a binary treatment has one effect column, but n_treatments_ is {K}")
    _check_forest(est, CausalChannels(K, M).n_moments + 1)  # moments, then the estimation count
    one_row = (() if K == 1 else (K,)) if y_ndim == 1 else ((M,) if K == 1 else (K, M))
    for name in ("ate_", "ate_stderr_"):
        if name in vars(est):
            _float_array(est, name, one_row)
    # Held-out doubly robust scores predict with the nuisance forests of E[Y|x], E[W|x]
    # and, for continuous treatments, of Var[W|x] (its K (K + 1) / 2 products).
    for name, n_outputs in (("outcome_forest_", M), ("treatment_forest_", K),
                            ("treatment_variance_forest_", K * (K + 1) // 2)):
        _check_nuisance(est, name, n_outputs, nuisance_class)


def check_instrumental_forest(est, nuisance_class):
    if not _is_fitted(est, ("estimators_", "bin_mapper_", "n_treatments_", "n_outcomes_", "n_features_in_", "y_ndim_",
                            "sampling_", "nuisance_", "feature_importances_", "gain_importances_")):
        return
    for name in ("n_treatments_", "n_outcomes_", "y_ndim_"):
        _int(est, name, 1, 1)
    _check_forest(est, InstrumentalChannels.n_moments + 1)  # equation moments, then the estimation count
    for name in ("outcome_forest_", "treatment_forest_", "instrument_forest_"):
        _check_nuisance(est, name, 1, nuisance_class)


# ------------------------------------------------------------------ policy trees

def check_policy_tree(est):
    required = ("tree_", "bin_mapper_", "n_actions_", "n_features_in_", "objective_", "action_",
                "value_stderr_per_action_", "action_value_", "action_value_stderr_", "value_", "gain_",
                "value_stderr_", "gain_stderr_")
    if not _is_fitted(est, required):
        return
    n_features = _n_features(est)
    A = _int(est, "n_actions_", 1)
    bins = _bin_thresholds(est, n_features)
    tree = vars(est)["tree_"]
    if not isinstance(tree, Tree):
        raise ValueError(f"tree_ must be a Tree, got {type(tree).__name__}")
    validate_packed(pack_trees([tree]), n_features, bins, A, what="tree_")
    nodes = tree.node_count
    action = vars(est)["action_"]
    if not (isinstance(action, np.ndarray) and action.dtype == np.int64 and action.shape == (nodes,)
            and np.all((action >= 0) & (action < A))):
        raise ValueError(f"action_ must be int64 of shape ({nodes},) with actions in [0, {A})")
    _float_array(est, "value_stderr_per_action_", (nodes, A))
    _float_array(est, "action_value_", (A,))
    _float_array(est, "action_value_stderr_", (A,))
    for name in ("objective_", "value_", "gain_", "value_stderr_", "gain_stderr_"):
        if not isinstance(vars(est)[name], numbers.Real) or isinstance(vars(est)[name], (bool, np.bool_)):
            raise ValueError(f"{name} must be a number, got {type(vars(est)[name]).__name__}")

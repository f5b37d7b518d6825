"""Merging forests grown on the same data into one (grf's ``merge_forests``).

This module owns :func:`merge_forests` and the rule for when forests may be merged:
same class, same parameters apart from the tree count, seed and batching, the same
bin edges, the same fitted shapes (features, outputs, treatment arms) and, for
causal forests, the same centering (:attr:`CausalForest.nuisance_`). A forest's
trees are independent draws given their seed and tree index, so a merged forest is a
forest with more trees: its predictions average all the trees' leaf moments, and
out-of-bag predictions (``oob_predict``) and bootstrap-of-little-bags intervals keep
working, because the merged forest records the ``(seed, first tree, count)`` of each
part (``sampling_["segments"]``, read by :func:`forest.engine.subsample.sampling_segments`).

Not carried over: what ``fit`` computed on the training rows (``oob_prediction_`` of
a regression forest, ``oob_decision_function_`` and ``oob_score_`` of a probability
forest; ``ate_``, ``ate_stderr_``, ``dr_scores_`` and the out-of-bag analysis rows of a
causal forest): they are those of one part. A merged causal forest
keeps the (shared) nuisance forests, so its analyses run on rows passed as ``X, t, y``.

Causal forests draw their nuisance forests' seeds from ``random_state``, so two
causal forests with different seeds are centred differently and are refused; fit
them with the same ``y_hat`` / ``t_hat`` (e.g. one fit's ``RegressionForest``
out-of-bag predictions) to merge them.
"""
import copy

import numpy as np

from forest.io.fingerprint import mapper_digest
from forest.estimators.base import check_is_fitted
from forest.engine.subsample import sampling_segments
from forest.engine.importance import depth_weighted_importance, gain_importance
from forest.engine.tree import pack_trees, unpack_trees

#: Parameters that may differ between merged forests.
FREE_PARAMS = ("n_estimators", "random_state", "warm_start", "batch_size")
#: Fitted attributes that must agree, per class name.
SHAPE_ATTRIBUTES = {
    "RegressionForest": ("n_features_in_", "n_outputs_"),
    "ProbabilityForest": ("n_features_in_", "n_outputs_", "classes_", "n_classes_"),
    "CausalForest": ("n_features_in_", "treatment_type_", "classes_", "n_treatments_", "n_outcomes_", "y_ndim_"),
}
#: Fitted attributes that describe the training rows of one part only.
ROW_SUMMARIES = ("oob_prediction_", "oob_decision_function_", "oob_score_", "ate_", "ate_stderr_", "dr_scores_",
                 "_oob_rows_", "_weights_source_")


def _same(a, b):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return a is not None and b is not None and np.array_equal(a, b)
    return a == b


def _check_compatible(forests):
    first = forests[0]
    kind = type(first).__name__
    if kind not in SHAPE_ATTRIBUTES:
        raise TypeError(f"merge_forests merges RegressionForest, ProbabilityForest or CausalForest objects, not "
                        f"{kind} "
                        f"(boosted trees are a sequence, not a vote)")
    for i, other in enumerate(forests):
        if type(other) is not type(first):
            raise TypeError(f"forest {i} is a {type(other).__name__}, forest 0 a {kind}")
        check_is_fitted(other, "estimators_")
    params0 = first.get_params(deep=False)
    for i, other in enumerate(forests[1:], start=1):
        params = other.get_params(deep=False)
        differ = sorted(k for k in params0 if k not in FREE_PARAMS and not _same(params0[k], params[k]))
        if differ:
            k = differ[0]
            raise ValueError(f"forests 0 and {i} differ in {k} ({params0[k]!r} vs {params[k]!r}); only "
                             f"{', '.join(FREE_PARAMS)} may differ")
        # parameters chosen at fit (tune_parameters, ProbabilityForest's honest="auto") must agree too
        chosen0, chosen = getattr(first, "tuned_params_", None), getattr(other, "tuned_params_", None)
        if chosen0 != chosen:
            raise ValueError(f"forests 0 and {i} were grown with different fitted choices (tuned_params_ {chosen0!r} "
                             f"vs {chosen!r}); refit one with the other's values to merge them")
        for attr in SHAPE_ATTRIBUTES[kind]:
            if not _same(getattr(first, attr), getattr(other, attr)):
                raise ValueError(f"forests 0 and {i} were fitted on different data ({attr}: "
                                 f"{getattr(first, attr)!r} vs {getattr(other, attr)!r})")
        if first.estimators_["value"].shape[1] != other.estimators_["value"].shape[1]:
            raise ValueError(f"forests 0 and {i} store different leaf values (one was written by an older "
                             f"histforest); refit it to merge them")
        if mapper_digest(first.bin_mapper_) != mapper_digest(other.bin_mapper_):
            raise ValueError(f"forests 0 and {i} use different bin edges: they were not fitted on the same data "
                             f"(or with different max_bins)")
        if kind == "CausalForest" and first.nuisance_ != other.nuisance_:
            raise ValueError(f"forests 0 and {i} were centred on different nuisance estimates ({first.nuisance_} vs "
                             f"{other.nuisance_}); fit both with the same y_hat and t_hat to merge them")


def _segments(forests):
    """Every part's ``(seed, first, count)`` in order, refusing trees that appear twice."""
    out, owner = [], []
    for i, est in enumerate(forests):
        n_trees = len(est.estimators_["tree_offsets"]) - 1
        for seg in sampling_segments(est.sampling_, n_trees):
            out.append(seg)
            owner.append(i)
    for a in range(len(out)):
        for b in range(a + 1, len(out)):
            (sa, fa, ca), (sb, fb, cb) = out[a], out[b]
            lo, hi = max(fa, fb), min(fa + ca, fb + cb)
            if sa == sb and lo < hi:
                raise ValueError(f"forests {owner[a]} and {owner[b]} both hold trees {lo}-{hi - 1} of seed {sa}: "
                                 f"merging would count them twice (give the forests different random_state)")
    group = int(forests[0].sampling_["ci_group_size"])
    if group > 1 and any(count % group for _, _, count in out[:-1]):
        raise ValueError(f"with ci_group_size={group} every forest but the last must hold a multiple of {group} "
                         f"trees, so that little bags stay whole")
    return [list(seg) for seg in out]


def merge_forests(forests):
    """One forest holding the trees of several forests grown on the same data.

    Parameters
    ----------
    forests : sequence of RegressionForest or sequence of CausalForest
        Fitted on the same rows with the same parameters, except ``n_estimators``,
        ``random_state``, ``warm_start`` and ``batch_size``; causal forests also
        with the same centering (``nuisance_``).

    Returns
    -------
    RegressionForest or CausalForest
        A new estimator (the inputs are not modified) whose ``estimators_`` holds the
        trees of ``forests[0]``, then ``forests[1]``, ...; ``n_estimators`` is their
        total and ``random_state`` that of ``forests[0]``. Importances are recomputed;
        the training rows' summaries are not carried over (see the module docstring).
        One forest is returned as a copy.

    Raises
    ------
    TypeError
        Not forests of one class.
    ValueError
        Forests that cannot be merged; the message names the first difference.
    """
    forests = list(forests)
    if not forests:
        raise ValueError("merge_forests needs at least one forest")
    _check_compatible(forests)
    if len(forests) == 1:
        return copy.deepcopy(forests[0])
    segments = _segments(forests)
    first = forests[0]
    merged = copy.copy(first)
    merged.__dict__ = {k: v for k, v in first.__dict__.items() if k not in ROW_SUMMARIES}
    trees = [tree for est in forests for tree in unpack_trees(est.estimators_)]
    merged.estimators_ = pack_trees(trees)
    merged.n_estimators = len(trees)
    merged.sampling_ = dict(first.sampling_, segments=segments)
    merged.feature_importances_ = depth_weighted_importance(merged.estimators_, first.n_features_in_)
    merged.gain_importances_ = gain_importance(merged.estimators_, first.n_features_in_)
    signatures = [vars(f).get("training_rows_") for f in forests]
    if any(s is None or not _same_signature(s, signatures[0]) for s in signatures):
        merged.__dict__.pop("training_rows_", None)  # parts fitted on different rows: nothing to recognise
    return merged


def _same_signature(a, b):
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)

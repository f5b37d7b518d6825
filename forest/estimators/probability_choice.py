"""``honest="auto"``: ProbabilityForest's out-of-bag choice of growth on small data sets.

This module owns the rule behind :class:`forest.estimators.probability_forest.ProbabilityForest`'s
default ``honest="auto"``, a switch on the data's size after scikit-learn's
``HistGradientBoosting*(early_stopping="auto")`` (there: early stopping above 10,000 rows;
here: a comparison of candidates at most at :data:`AUTO_MAX_ROWS` rows, where its extra
fits are cheap):

* More than :data:`AUTO_MAX_ROWS` rows over all ranks: the honest forest (grf's
  ``probability_forest``), exactly what ``honest=True`` fits; nothing else runs.
* At most :data:`AUTO_MAX_ROWS` rows: the candidates of :func:`candidates` (the honest
  forest and two adaptive forests grown as scikit-learn's ``RandomForestClassifier`` grows
  them) are each fitted with ``n_estimators`` trees, and the one of lowest debiased
  out-of-bag Brier score (:func:`oob_brier`) is the model (the others are dropped; a tie
  keeps the earlier candidate, the honest forest first).

Why: honesty halves the rows each tree splits on and estimates its leaves on the other half.
At scale that is what makes the leaf frequencies calibrated (200,000 simulated rows: log
loss 1.1012 against RandomForestClassifier's 1.1108). On small, nearly separable sets the
halves cost the sharpness those data reward: digits (1,797 rows) 0.507 against 0.333
(benchmarks/RESULTS.md, "ProbabilityForest (issue 34)"). No single setting won on every data
set measured, so on small sets the data choose, by an estimate of held-out error that needs
no held-out rows.

Why the Brier score and not the log loss: a row's out-of-bag probabilities average only
the trees that did not draw it (a fifth of them at ``max_samples=0.8``), so a sharp forest's
out-of-bag estimate puts probability 0 on a row's class far more often than the whole
forest does; the log loss of such a zero is about 36 (clipped), and out-of-bag log loss
ranked the adaptive forests last on breast_cancer and iris where their held-out log loss was
the lowest. The Brier score is a proper scoring rule bounded by 2 per row, so a few zeros do
not decide. Why debiased (grf's debiased out-of-bag error, the one its tuning minimises):
the few out-of-bag trees' Monte-Carlo noise, which the whole forest averages away, would
otherwise count against the forests of deep trees, more the fewer the trees (on a 1,500-row
logistic design the plain out-of-bag Brier gap between the honest and the sharp forest was
0.106 at 20 trees and 0.058 at 50; debiased 0.019 and 0.028).

The candidates (:func:`candidates`): ``honest`` is the forest as configured with
``honest=True``. The adaptive ones set ``honest=False`` and, for each of ``max_features``,
``min_samples_leaf`` and ``max_samples`` left at ``ProbabilityForest``'s defaults,
RandomForestClassifier's growth: ``max_features="sqrt"``, and either ``min_samples_leaf=1``
with ``max_samples=0.8`` (``sharp``: fully grown trees) or ``min_samples_leaf=2`` with
``max_samples=0.632`` (``smooth``: the share of distinct rows in a bootstrap sample,
``1 - 1/e``, and one row more per leaf). A parameter the user set otherwise is kept in every
candidate. Little bags (``ci_group_size`` of 2 or more, for ``predict_var``) need honest
trees: then the honest forest is the only candidate.

Under mpirun the choice is the same on every rank and on any rank count: each row's
out-of-bag probabilities are the same bits on any rank count (its trees are summed in tree
order), and the per-rank sums of the per-row scores are formed in fixed point and summed as
integers (:func:`forest.engine.quantized.exact_sum`), so every rank compares the same two
numbers; no broadcast is needed.

What is recorded on the fitted forest (and kept in model files): ``honest_`` (whether its
trees are honest), ``tuned_params_`` (the parameters the chosen candidate changed) and
``tuning_`` (the rule, the global row count, each candidate's parameters and out-of-bag
Brier score, the choice). A warm start continues the chosen forest without choosing again.
The honest forest is always fitted first, with ``checkpoint=`` (it is the model above the
threshold, and its fit gives the global row count); the other candidates, on at most
:data:`AUTO_MAX_ROWS` rows, fit without a checkpoint, and a resumed job chooses again,
identically. ``progress`` counts the honest forest's trees, then every candidate's.
"""
import numpy as np

from native import collectives as col

from forest._validation import check_weight
from forest.engine.quantized import exact_sum

#: Most rows (over all ranks) at which ``honest="auto"`` compares candidates; above it the
#: forest is honest and fits once. The comparison costs about three fits and a walk of the
#: training rows through the trees: at 2,000 simulated rows the two adaptive forests took
#: 1.1 s and 0.7 s against 0.45 s for the honest one (200 trees, 2 threads, a shared
#: machine), at 10,000 rows 6.2 s and 2.4 s against 1.3 s; hence half scikit-learn's 10,000.
AUTO_MAX_ROWS = 5_000

#: The adaptive candidates: RandomForestClassifier's growth, where the user left the default.
ADAPTIVE = (
    ("sharp", {"max_features": "sqrt", "min_samples_leaf": 1, "max_samples": 0.8}),
    ("smooth", {"max_features": "sqrt", "min_samples_leaf": 2, "max_samples": 0.632}),
)

#: ProbabilityForest's defaults of the parameters the adaptive candidates may change.
_DEFAULTS = {"max_features": None, "min_samples_leaf": None, "max_samples": 0.8}


def candidates(est, n_global):
    """The configurations ``honest="auto"`` compares, in tie-breaking order.

    Parameters
    ----------
    est : ProbabilityForest
        With ``honest="auto"``.
    n_global : int
        Training rows over all ranks.

    Returns
    -------
    list of (str, dict)
        ``(name, parameter changes)``; the first is ``("honest", {"honest": True})``.
    """
    out = [("honest", {"honest": True})]
    little_bags = est.ci_group_size is not None and int(est.ci_group_size) > 1
    if n_global > AUTO_MAX_ROWS or little_bags:
        return out
    for name, growth in ADAPTIVE:
        change = {"honest": False}
        for key, value in growth.items():
            given = getattr(est, key)
            if given is None and _DEFAULTS[key] is None or given is not None and given == _DEFAULTS[key]:
                change[key] = value
        out.append((name, change))
    return out


def oob_brier(forest, y, sample_weight, comm, n_global):
    """Debiased out-of-bag Brier score over every rank's rows, the same bits on any rank count.

    Per row, grf's debiased out-of-bag squared error of each one-hot column
    (:meth:`~forest.estimators.regression_variance.RegressionVarianceMixin.oob_error_estimates`:
    the squared error less the jackknife estimate of the Monte-Carlo variance its out-of-bag
    trees add), summed over the classes: the Brier score an infinite forest of these settings
    would have. Without the correction the out-of-bag estimate of a forest of deep trees,
    averaged over a fifth of them at ``max_samples=0.8``, carries much more Monte-Carlo noise
    than its whole forest does, and the choice would depend on ``n_estimators``.

    Parameters
    ----------
    forest : ProbabilityForest
        Fitted on this rank's rows (the codes it kept are its training rows).
    y : array-like, shape (n_local,)
        The labels passed to ``fit``.
    sample_weight : array-like, shape (n_local,), or None
        As passed to ``fit``: the score is their weighted mean.
    comm : native.comm.Communicator
    n_global : int

    Returns
    -------
    float
        ``sum_i w_i e_i / sum_i w_i`` over the rows whose ``e_i`` is finite (rows left out by
        fewer than two trees have none); NaN if no row has one.
    """
    n = len(forest._weights_source_.gids)
    target = forest._row_columns(y, n=n)[0]        # the one-hot labels, as fit coded them
    debiased, _ = forest.oob_error_estimates(target, comm=comm)
    per_row = np.asarray(debiased, dtype=np.float64).reshape(n, -1).sum(axis=1)
    w = check_weight(sample_weight, n)
    ok = np.isfinite(per_row)
    w = np.where(ok, w, 0.0)
    sums = exact_sum(comm, np.column_stack([w * np.where(ok, per_row, 0.0), w]), n_global)
    return float(sums[0] / sums[1]) if sums[1] > 0 else float("nan")


def fit_auto(est, args, comm, progress=None):
    """Fit ``est`` (``honest="auto"``) by the rule of the module docstring.

    Parameters
    ----------
    est : ProbabilityForest
    args : dict
        ``fit``'s keyword arguments (``X``, ``y``, ``sample_weight``, ``binned``,
        ``feature_names``, ``clusters``, ``checkpoint``).
    comm : native.comm.Communicator
    progress : callable, optional
        ``progress(trees_done, trees_total)`` over every forest fitted.

    Returns
    -------
    est
        Fitted, with ``honest_``, ``tuned_params_`` and ``tuning_``.
    """
    est._check_params()
    params = est.get_params(deep=False)
    if est.warm_start and hasattr(est, "estimators_"):
        # continue the chosen forest (an honest one if it was fitted before this rule):
        # choosing again could change the trees already grown
        chosen = getattr(est, "tuned_params_", None) or {"honest": True}
        forest = type(est)(**{**params, **chosen})
        for key, value in vars(est).items():
            if _fitted(key, params):
                setattr(forest, key, value)
        forest.fit(**args, comm=comm, progress=progress)
        return _adopt(est, forest, params, chosen, getattr(est, "tuning_", None))
    trees = int(est.n_estimators)
    # checkpoint= goes to the honest forest only (the model above the threshold); the
    # others are fitted on at most AUTO_MAX_ROWS rows, in seconds
    choice_args = {k: v for k, v in args.items() if k != "checkpoint"}
    report = None if progress is None else (lambda done, _t: progress(done, total))
    total = trees
    # The honest forest first: it is the model above the threshold (fitted as honest=True
    # fits it, checkpoint included), and its fit tells the global row count.
    first = type(est)(**{**params, "honest": True, "warm_start": False})
    first.fit(**args, comm=comm, progress=report)
    n_global = int(col.global_row_offset(comm, len(first._weights_source_.gids))[1])
    options = candidates(est, n_global)
    if len(options) == 1:
        why = "little bags (ci_group_size > 1) need honest trees" if n_global <= AUTO_MAX_ROWS else \
            f"more than {AUTO_MAX_ROWS} rows"
        record = {"rule": "honest='auto'", "rows": n_global, "max_rows": AUTO_MAX_ROWS, "chosen": "honest",
                  "status": f"honest: {why}",
                  "candidates": [{"name": "honest", "params": {"honest": True}, "oob_brier": None}]}
        return _adopt(est, first, params, options[0][1], record)
    total = trees * len(options)
    fits, scores = [first], [oob_brier(first, args["y"], args.get("sample_weight"), comm, n_global)]
    for j, (name, change) in enumerate(options[1:], start=1):
        report = None if progress is None else (lambda done, _t, o=j * trees: progress(o + done, total))
        forest = type(est)(**{**params, **change, "warm_start": False})
        forest.fit(**choice_args, comm=comm, progress=report)
        scores.append(oob_brier(forest, args["y"], args.get("sample_weight"), comm, n_global))
        fits.append(forest)
    finite = [j for j, value in enumerate(scores) if np.isfinite(value)]
    best = min(finite, key=lambda j: scores[j]) if finite else 0      # ties: the earlier candidate
    name, change = options[best]
    forest = fits[best]
    record = {"rule": "honest='auto'", "rows": n_global, "max_rows": AUTO_MAX_ROWS, "chosen": name,
              "status": "chosen by debiased out-of-bag Brier score",
              "candidates": [{"name": n, "params": dict(c), "oob_brier": float(v)}
                             for (n, c), v in zip(options, scores)]}
    return _adopt(est, forest, params, change, record)


def _adopt(est, forest, params, change, record):
    """Move ``forest``'s fitted state into ``est`` (whose parameters stay as given) and record the choice.

    Fitted state is the attributes named with a trailing underscore; others (scikit-learn's
    ``_parent_callback_ctx``, set by a pipeline around ``fit``) are left as they are.
    """
    for key in [k for k in vars(est) if _fitted(k, params)]:
        delattr(est, key)
    for key, value in vars(forest).items():
        if _fitted(key, params):
            setattr(est, key, value)
    est.honest_ = bool(forest.honest)
    est.tuned_params_ = dict(change)
    est.tuning_ = record
    return est


def _fitted(key, params):
    return key not in params and key.endswith("_") and not key.startswith("__")

"""The causal-analysis part of ``forest-report``: average effects, calibration, BLP, RATE and TOC.

This module owns what ``forest-report MODEL --data DATA`` adds for a causal forest
when ``DATA`` holds the training treatment and outcome columns. When ``DATA`` is
the model's training data (the same rows in the same order: :mod:`forest.io.training_rows`)
every figure is out of bag, as grf computes them: effects and nuisance estimates
from the trees each row was not drawn for. Other rows are held out, scored with the
model's forest and nuisance forests; rows that are partly training rows are
refused (``forest-report`` says so in one line). The report shows

* the doubly robust average effects (all, treated, control, overlap-weighted; per
  arm against the control for multi-arm models) with 95% confidence intervals;
* grf's calibration test;
* the best linear projection of the effect on the most important features;
* RATE (AUTOC and QINI) of prioritising rows by the predicted effect, with 95%
  intervals, and the TOC curve (per arm for multi-arm models);

cluster-robust when the model was trained with ``--cluster`` and ``DATA`` holds that
column. The JSON form carries the same numbers (:func:`analysis_report`).
A part that cannot be computed on these data (e.g. the treated-only effect of a
continuous treatment) is reported as unavailable with its reason, the rest goes on.
"""
import numpy as np

from histogram.rowhash import uniform
from native.comm import SelfCommunicator

#: Features of the best linear projection table (by depth-weighted importance).
BLP_FEATURES = 4
#: rowhash stream of the training rows' ranking split ("RANK").
RANKING_STREAM = 0x52414E4B
AVERAGE_TARGETS = ("all", "treated", "control", "overlap")
RATE_BOOTSTRAP = 200


def _interval(est, se, z=1.959963984540054):
    est, se = np.atleast_1d(est).astype(float), np.atleast_1d(se).astype(float)
    return {"estimate": est.tolist(), "stderr": se.tolist(), "conf_low": (est - z * se).tolist(),
            "conf_high": (est + z * se).tolist()}


def _attempt(fn):
    """``(result, None)`` or ``(None, reason)`` for one part of the analysis."""
    try:
        return fn(), None
    except ValueError as exc:
        return None, str(exc).splitlines()[0]


#: Depth of the report's summary tree.
SUMMARY_TREE_DEPTH = 2


def _summary_tree(est, table, held, names, seed):
    """The report's :class:`forest.CateSummaryTree` of the analysed rows, as JSON-able parts."""
    from forest.estimators.summary_tree import CateSummaryTree

    rows = {k: v for k, v in held.items() if k in ("t", "y", "clusters", "comm")}
    tree = CateSummaryTree(max_depth=SUMMARY_TREE_DEPTH, random_state=seed).fit(est, table, **rows)
    leaves = [int(j) for j in range(tree.tree_.node_count) if tree.tree_.feature[j] < 0]
    return {"max_depth": SUMMARY_TREE_DEPTH, "text": tree.export_text(feature_names=list(names)),
            "leaves": [{"node": j, "effect": float(tree.node_effect_[j]), "stderr": float(tree.node_stderr_[j]),
                        "rows": int(tree.node_rows_[j])} for j in leaves]}


#: Confounding strengths (c_y = c_t) of the report's robustness table.
SENSITIVITY_STRENGTHS = (0.01, 0.05, 0.1)


def _robustness(est, held):
    """``(part, lines, why)``: the average effect's bounds under hidden confounding and its robustness value
    (:mod:`forest.analysis.sensitivity`), each effect column (``why`` when not available)."""
    bounds = []
    for c in SENSITIVITY_STRENGTHS:
        res, why = _attempt(lambda: est.sensitivity_analysis(c, c, **held))
        if why:
            return None, [], why
        bounds.append({k: np.atleast_1d(np.asarray(v, dtype=np.float64)).tolist() if k not in ("c_y", "c_t", "rho",
                                                                                               "alpha") else v
                       for k, v in res.items()})
    rv, why = _attempt(lambda: est.robustness_value(**held))
    if why:
        return None, [], why
    rv_est, _ = _attempt(lambda: est.robustness_value(interval="estimate", **held))
    part = {"bounds": bounds, "robustness_value": np.atleast_1d(rv).tolist(),
            "robustness_value_estimate": np.atleast_1d(rv_est).tolist()}
    lines = ["", "Robustness to hidden confounding (omitted-variable bounds of the average effect; a confounder "
                 "explaining a share c of the outcome's and of the treatment's residual variation, rho = 1):"]
    for b in bounds:
        for j in range(len(b["estimate"])):
            lines.append(f"  c = {b['c_y']:<5g} bounds [{b['lower'][j]:.4g}, {b['upper'][j]:.4g}]  "
                         f"95% CI [{b['ci_lower'][j]:.4g}, {b['ci_upper'][j]:.4g}]")
    for j, (r, r_est) in enumerate(zip(part["robustness_value"], part["robustness_value_estimate"])):
        lines.append(f"  robustness value {r:.3g} (the confounding strength whose 95% CI reaches 0; {r_est:.3g} "
                     f"for the bounds themselves)")
    return part, lines, None


def analysis_report(est, X, t, y, names, importance, clusters=None, want_figures=False, seed=0, priorities=None,
                    rows="held-out", ranking=None, ranking_error=None, model_input=None):
    """Average effects, calibration, BLP and RATE of a causal forest on held-out or training rows.

    The estimator's methods recognise training rows themselves
    (:mod:`forest.io.training_rows`) and then analyse them out of bag; ``priorities``
    must then be out-of-bag effects too (the caller computed them for the
    distribution), or the RATE would rank rows by in-sample effects.

    Parameters
    ----------
    est : forest.CausalForest
    X : ndarray, shape (n, n_features)
        Features in ``names`` order; a model fitted with feature names gets them as a
        table of those columns.
    t, y : ndarray, shape (n,)
        Treatment and outcome columns of the data.
    names : list of str
        Feature names (the model's ``feature_names_in_`` when it has them).
    importance : ndarray, shape (n_features,)
        Depth-weighted importances (choose the BLP features).
    clusters : ndarray, shape (n,), optional
        Cluster labels of the rows (cluster-robust errors).
    want_figures : bool
        Also render the TOC figure (base64 PNG).
    seed : int
        Bootstrap seed of RATE.
    priorities : ndarray, shape (n,) or (n, n_effects), optional
        Effects that rank the rows for RATE (default: ``est.predict(X)``, right for
        held-out rows only).
    rows : str
        ``"out-of-bag"`` or ``"held-out"``: named in each part of the report.
    ranking : HeldOutRanking, optional
        On training rows: RATE ranks its ``rank`` half by its priorities (then
        ``priorities`` is not used).
    ranking_error : str, optional
        Why no :class:`HeldOutRanking` could be built on training rows: RATE is then
        reported unavailable (out-of-bag priorities would bias it).
    model_input : callable, optional
        ``model_input(X)``: the rows as the model takes them, for a model with
        categorical features (``X`` then holds their codes; see
        :func:`forest.cli.report.model_rows`). Categorical features are left out of the
        linear projection (a code is no quantity to project on).

    Returns
    -------
    report : dict
        JSON-able: ``average_effects``, ``calibration``, ``best_linear_projection``,
        ``rate`` (``AUTOC``, ``QINI``), and ``unavailable`` reasons.
    lines : list of str
        The text form.
    figures : dict of str -> str
        ``{"toc": base64 PNG}`` when asked for and available.
    """
    from forest.io.dataio import feature_input
    import pyarrow as pa

    comm = SelfCommunicator()
    # A model that records its feature names takes the rows as a table of those
    # columns (forest-report predicts the same way); a bare matrix would make every
    # method below warn that X has no feature names.
    table = model_input(X) if model_input is not None else \
        feature_input(est, pa.table({n: X[:, j] for j, n in enumerate(names)}), names)
    held = dict(X=table, t=t, y=y, clusters=clusters, comm=comm)
    report, lines, figures, unavailable = {"rows": rows}, [], {}, {}
    contrasts = est.contrast_names() if _n_effects(est) > 1 else None

    effects = {}
    for target in AVERAGE_TARGETS:
        res, why = _attempt(lambda: est.average_treatment_effect(target, **held))
        if why:
            unavailable[f"average_effect_{target}"] = why
            continue
        effects[target] = _interval(*res)
    report["average_effects"] = effects
    if contrasts:
        report["contrasts"] = list(contrasts)       # names of the entries of each estimate list
    if effects:
        lines += ["", f"Doubly robust average effects on {len(X)} rows, {rows} (95% CI"
                      + (", cluster-robust)" if clusters is not None else ")") + ":"]
        for target, v in effects.items():
            for j, (e, lo, hi, s) in enumerate(zip(v["estimate"], v["conf_low"], v["conf_high"], v["stderr"])):
                label = f"{target}" + (f" [{contrasts[j]}]" if contrasts else "")
                lines.append(f"  {label:<24} {e:>10.4g}  [{lo:.4g}, {hi:.4g}]  (se {s:.3g})")

    if hasattr(est, "sensitivity_analysis"):
        part, text, why = _robustness(est, held)
        if why:
            unavailable["sensitivity"] = why
        else:
            report["sensitivity"] = part
            lines += text

    cal, why = _attempt(lambda: est.test_calibration(**held))
    if why:
        unavailable["calibration"] = why
    else:
        report["calibration"] = cal.to_dict()
        lines += ["", str(cal)]

    categorical = set(int(f) for f in getattr(getattr(est, "category_coder_", None), "columns_", ()))
    ranked = [int(j) for j in np.argsort(-np.asarray(importance), kind="stable") if int(j) not in categorical]
    top = ranked[:BLP_FEATURES]
    blp, why = _attempt(lambda: est.best_linear_projection(X[:, top], names=[names[j] for j in top], **held))
    if why:
        unavailable["best_linear_projection"] = why
    else:
        report["best_linear_projection"] = blp.to_dict()
        lines += ["", str(blp)]

    if contrasts is None:
        tree, why = _attempt(lambda: _summary_tree(est, table, held, names, seed))
        if why:
            unavailable["summary_tree"] = why
        else:
            report["summary_tree"] = tree
            lines += ["", f"Summary tree of the effect (depth {tree['max_depth']}, honest: grown on half of the "
                          f"rows' doubly robust scores, each group's effect and interval from the other half):",
                      tree["text"]]

    rates = {}
    if est.treatment_type_ == "continuous":
        unavailable["rate"] = "RATE needs a binary or categorical treatment"
    elif ranking_error is not None:
        unavailable["rate"] = (f"RATE on training rows ranks half of them by a forest refitted on the other half, "
                               f"which failed: {ranking_error}")
    else:
        subset = None
        if ranking is not None:
            priorities, subset = ranking.priorities, ranking.mask
        priorities = np.asarray(est.predict(table) if priorities is None else priorities, dtype=np.float64)
        if priorities.ndim == 2 and priorities.shape[1] == 1:
            priorities = priorities[:, 0]
        for target in ("AUTOC", "QINI"):
            res, why = _attempt(lambda: est.rank_average_treatment_effect(
                priorities, table, t, y, target=target, n_bootstrap=RATE_BOOTSTRAP, seed=seed, clusters=clusters,
                subset=subset, comm=comm))
            if why:
                unavailable[f"rate_{target}"] = why
                continue
            rates[target] = res
        report["rate"] = {k: v.to_dict() for k, v in rates.items()}
        if rates:
            lines += ["", "Rank-weighted average treatment effect of targeting by the predicted effect (95% CI"
                          + (f"; the {ranking.n_rank} held-out ranked rows" if ranking is not None else "") + "):"]
            if ranking is not None:
                report["rate_ranking"] = {"rank_rows": ranking.n_rank, "fit_rows": ranking.n_fit,
                                          "how": ranking.describe()}
            for target, res in rates.items():
                lo, hi = res.conf_int(0.05)
                for j in range(np.atleast_2d(res.estimate).shape[0]):
                    label = target + (f" [{contrasts[j]}]" if contrasts else "")
                    e, a, b = (float(np.ravel(v)[j]) for v in (res.estimate, lo, hi))
                    lines.append(f"  {label:<20} {e:>10.4g}  [{a:.4g}, {b:.4g}]")
            if want_figures and "AUTOC" in rates:
                figures["toc"] = toc_figure(rates["AUTOC"])
    if unavailable:
        report["unavailable"] = unavailable
        lines += ["", "Not available on these data:"] + [f"  {k}: {v}" for k, v in unavailable.items()]
    return report, lines, figures


class HeldOutRanking:
    """Priorities for RATE and Qini on a model's own training rows, from a forest that did not see them.

    grf asks for priorities estimated without the evaluated rows' outcomes. Out-of-bag
    effects do not qualify as priorities: a row's own outcome noise enters its
    neighbours' out-of-bag effects (it sits in their leaves), so rows with large noise
    rank lower than their neighbours and the ranking is anti-correlated with the rows'
    own scores. Measured on a null design (no heterogeneity, 500 rows, 20 seeds) the
    out-of-bag AUTOC's 95% interval missed zero, below it, in a quarter of the seeds.
    So the training rows are split in two by a hash of the global row id (of the
    cluster when there are clusters): a forest with the model's parameters is fitted
    on the ``fit`` half, and the ``rank`` half is ranked by its predictions and
    evaluated with the model's out-of-bag scores, as grf's documentation does with a
    train/test split.

    Attributes
    ----------
    priorities : ndarray, shape (n,) or (n, K)
        The refitted forest's effects on the ``rank`` half (zero elsewhere).
    mask : ndarray of bool, shape (n,)
        The ``rank`` half.
    """

    def __init__(self, est, table, t, y, gids, clusters=None, seed=0):
        import warnings

        units = np.asarray(gids if clusters is None else clusters).astype(np.int64)
        self.mask = uniform(seed, RANKING_STREAM, units) < 0.5
        fit_rows = ~self.mask
        if fit_rows.sum() < 8 or self.mask.sum() < 2:
            raise ValueError(f"too few training rows ({len(units)}) to rank half of them by a forest fitted on the "
                             f"other half")
        half = type(est)(**est.get_params())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")      # a feature-named table of a subset is still named
            half.fit(_take(table, fit_rows), t[fit_rows], y[fit_rows],
                     clusters=None if clusters is None else np.asarray(clusters)[fit_rows], comm=SelfCommunicator())
            rank_rows = half.predict(_take(table, self.mask))
        prio = np.zeros((len(units),) + np.shape(rank_rows)[1:])
        prio[self.mask] = rank_rows
        self.priorities = prio
        self.n_fit, self.n_rank = int(fit_rows.sum()), int(self.mask.sum())

    def describe(self):
        """One line for the report."""
        return (f"rank {self.n_rank} of the training rows (picked by a hash of the row id) by a forest with the "
                f"model's parameters refitted on the other {self.n_fit}: out-of-bag effects as priorities would be "
                f"anti-correlated with the rows' own scores")


def _take(table, mask):
    """Rows ``mask`` of a model input (ndarray, pandas DataFrame or pyarrow Table)."""
    if hasattr(table, "filter") and hasattr(table, "schema"):        # pyarrow Table
        import pyarrow as pa

        return table.filter(pa.array(mask))
    if hasattr(table, "iloc"):
        return table.iloc[np.flatnonzero(mask)]
    return np.asarray(table)[mask]


def _n_effects(est):
    return est.n_treatments_ * est.n_outcomes_


def toc_figure(res):
    """TOC curve(s) with 95% pointwise bands; base64 PNG."""
    from forest.report.summary import _figure_png, _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    toc, se = np.atleast_2d(res.toc), np.atleast_2d(res.toc_stderr)
    labels = res.contrasts or ["TOC"]
    for c in range(toc.shape[0]):
        line, = ax.plot(res.q, toc[c], marker="o", ms=3, label=labels[c])
        ax.fill_between(res.q, toc[c] - 1.96 * se[c], toc[c] + 1.96 * se[c], color=line.get_color(), alpha=0.2)
    ax.axhline(0.0, color="gray", linestyle="--", linewidth=1)
    ax.set_xlabel("fraction treated q (by decreasing predicted effect)")
    ax.set_ylabel("TOC(q)")
    ax.legend()
    return _figure_png(fig)

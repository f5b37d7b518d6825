"""``forest-report``: feature importances of a model file, as text, JSON or an HTML page.

Importances are sorted by the measure the model itself reports (GRF's depth-weighted
split frequency for the forests, share of split gain for boosting). With ``--data``
the report adds the distribution of what the model predicts (effects for a causal
forest, class probabilities for a classifier, predictions for a regressor) and its
partial dependence on the top three features, drawn on one y-axis scale; for a
causal model whose data holds the training treatment (binary) and outcome columns,
also the Qini curve with its coefficient and AUUC (not for an instrumental forest, whose
observed treatment is confounded). The tool runs on one process: it reads the whole
``--data`` set; under ``mpirun`` rank 0 alone makes the report.

Which rows: ``--data`` may be held-out rows, or the model's training data as it was
trained (same rows, same order, recognised by the fingerprint the model file records:
:mod:`forest.io.training_rows`). On training rows every figure that depends on the
predictions (their distribution, the Qini curve, the average effects, calibration,
linear projection, RATE) uses out-of-bag estimates, as grf does: a forest's own
prediction for a training row has seen that row's outcome, and treated as held out
it shows heterogeneity that is not there. Data that only partly overlaps the
training rows is refused with one line. The report says which rows it used.
"""
import json
import sys

from forest.estimators.base import predicts_effects
from forest.cli.common import (CLIError, Parser, categorical_names, check_not_input, env_rank, feature_input,
                               load_model, model_feature_names, numeric_columns, run_tool)

PROG = "forest-report"


def build_parser():
    """The argument parser of ``forest-report``."""
    p = Parser(
        prog=PROG,
        description="Report a model's feature importances (GRF depth-weighted split frequency, "
                    "share of split gain, split counts) and, with --data, what it predicts there "
                    "(effects, class probabilities or predictions).",
        epilog="examples:\n"
               "  forest-report cf.model\n"
               "  forest-report cf.model --data holdout.parquet --html report.html\n"
               "  forest-report cf.model --json > importances.json",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="model file written by forest-train")
    p.add_argument("--data", help="data (parquet file/dir/glob or CSV) to predict on")
    p.add_argument("--html", metavar="PATH", help="write a self-contained HTML report here")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    p.add_argument("--top", type=int, default=20, help="rows of the importance table (default 20)")
    return p


def _feature_names(est, header):
    names = model_feature_names(est, header)
    return names if names is not None else [f"x{j}" for j in range(getattr(est, "n_features_in_", 0))]


def open_data(data, names, meta, html=None, targets=True, est=None):
    """Open ``--data`` and read every row: ``(source, shard, X)``; errors are ``DataError``.

    ``html`` (the page to write) is refused before any row is read when it names a data
    file or lies among the data (:func:`forest.cli.common.check_not_input`). With
    ``targets`` the training treatment, outcome and cluster columns are read too when
    the data holds them (the causal sections use them, and the training-row check; a
    class-label outcome, which may hold text, is read as labels by
    :func:`forest.io.dataio.class_labels`, and left out when it cannot be). ``X`` holds the model's categorical features (its
    ``category_coder_``) as their codes, NaN missing or unseen (:func:`model_rows` turns
    them back into a table the model takes).
    """
    import numpy as np

    from forest.io import dataio

    source = dataio.open_source(data)
    if html is not None:
        check_not_input(html, source.paths, "--html", data=data)
    extra = [c for c in (meta.get("treatment"), meta.get("instrument"), meta.get("outcome"), meta.get("time"),
                         meta.get("event"), meta.get("cluster"))
             if targets and isinstance(c, str) and c in source.columns]
    numeric = names if est is None else numeric_columns(source, est, names)
    cats = [] if est is None else categorical_names(est, names)
    from forest.estimators.kinds import kind_of

    kind = None if est is None else kind_of(est)
    labels = [c for c in extra if kind is not None and kind.class_labels and c == meta.get("outcome") and c not in cats]
    extra = [c for c in extra if c not in labels]
    dataio.check_columns(source, numeric=numeric + extra, any_type=cats + labels)
    if source.n_rows == 0:
        raise CLIError(f"{data!r} holds no rows (empty file)")
    shard = dataio.read_shard(source, (0, len(source.groups)), numeric=numeric + extra, keep=cats + labels)
    for c in labels:
        values, message = dataio.class_labels(shard.keep.column(c), c)
        if message is None:  # unusable labels: the rows are recognised by their features alone
            shard.columns[c] = values
    coder = getattr(est, "category_coder_", None)
    X = np.empty((shard.n_local, len(names)))
    for j, n in enumerate(names):
        X[:, j] = shard.columns[n] if n not in cats else _codes(coder, list(coder.columns_).index(j), shard.keep, n)
    return source, shard, X


def _codes(coder, j, table, name):
    """Codes of categorical column ``name`` of ``table`` (NaN missing or unseen); a bad column is named."""
    try:
        return coder.encode(j, table.column(name))
    except ValueError as exc:
        raise ValueError(f"categorical column {name!r} {exc}") from None


def model_rows(est, names, Z):
    """Rows ``Z`` (ndarray, columns ``names``, categorical ones as codes) as the model takes them.

    A model with feature names takes a table of those columns (categorical ones as
    category values, :func:`forest.report.summary.category_values`), an older one a matrix.
    """
    import pyarrow as pa

    from forest.report.summary import categorical_positions, category_values

    coder = getattr(est, "category_coder_", None)
    where = categorical_positions(coder)
    columns = {n: category_values(coder, where[j], Z[:, j]) if j in where else Z[:, j] for j, n in enumerate(names)}
    return feature_input(est, pa.table(columns), names)


def build_report(path, data=None, top=20, want_figures=False, html=None):
    """Compute the report of model file ``path``.

    The sections fit the model: importances sorted by the measure the model itself
    reports (:func:`forest.report.summary.primary_importance`); with ``data``, the
    distribution and partial dependence of what the model predicts
    (:func:`forest.report.summary.summarised_quantity`: effects, class probabilities or
    predictions) and, for a causal model whose data holds the binary training
    treatment and the outcome, the Qini curve.

    Parameters
    ----------
    path : str
    data : str, optional
        Data to predict on.
    top : int
        Features listed (and partial dependence of the first three).
    want_figures : bool
        Also render the figures (base64 PNG) for the HTML page.
    html : str, optional
        The page that will be written: refused when it names the model or a data file.

    Returns
    -------
    report : dict
        JSON-able after :func:`forest.report.summary.to_json`.
    figures : dict of str -> str
        base64 PNG images (empty unless ``want_figures``).
    text : str
        The text form.
    """
    import numpy as np

    from forest.report import html as rep_html, summary as rep

    if html is not None:
        check_not_input(html, [path], "--html")
    header, est = load_model(path)
    meta = header.get("metadata", {})
    names = _feature_names(est, header)
    source = shard = X = None
    if data is not None:
        source, shard, X = open_data(data, names, meta, html=html, targets=hasattr(est, "training_row_match"),
                                     est=est)
    trees = rep.model_trees(est)
    if not trees:
        raise CLIError(f"model file {path!r} holds no trees (is the model fitted?)")
    imp = rep.importances(trees, len(names))
    sort_by = rep.primary_importance(est)
    report = {
        "model": header["estimator"].rsplit(".", 1)[-1], "model_file": path,
        "library_version": header.get("library_version"), "format_version": header.get("format_version"),
        "n_trees": len(trees), "n_training_rows": meta.get("n_rows"),
        "treatment": meta.get("treatment"), "outcome": meta.get("outcome"),
        "features": names, "categorical": categorical_summary(est, names),
        "importance": {k: v for k, v in imp.items()},
        "importance_sorted_by": sort_by, "top": top, "data": data,
    }
    if getattr(est, "tuned_params_", None) is not None:
        report["tuning"] = {"values": dict(est.tuned_params_), "status": est.tuning_["status"]}
    figures = {}
    coder = getattr(est, "category_coder_", None)
    labelled = rep.feature_labels(names, coder)
    n_cat = len(report["categorical"])
    lines = [f"{report['model']} from {path}: {len(trees)} trees, {len(names)} features"
             + (f" ({n_cat} categorical)" if n_cat else "")
             + (f", trained on {meta['n_rows']} rows" if meta.get("n_rows") else "")
             + f" (histforest {header.get('library_version')}, format {header.get('format_version')})",
             *([f"Tuned parameters: {rep_html.tuned_sentence(report['tuning'])}"] if "tuning" in report else []),
             "", f"Feature importance (sorted by {rep.IMPORTANCE_TITLES[sort_by]}):",
             rep.text_table(labelled, imp, limit=top, sort_by=sort_by)]
    if want_figures:
        figures["importance"] = rep.importance_figure(labelled, imp, limit=top, sort_by=sort_by)
    if data is None:
        return report, figures, "\n".join(lines)

    def model_input(Z):
        return model_rows(est, names, Z)

    match = recognise_rows(est, model_input(X), shard, meta)
    if match is not None and match.kind == "overlap":
        raise CLIError(match.refusal(repr(data)))
    report["rows"] = rows_summary(est, match)
    lines += ["", f"Rows: {report['rows']['sentence']}."]
    training = match is not None and match.kind == "training"
    what, predict = rep.summarised_quantity(est)
    _, predict_rows = rep.summarised_quantity(est, out_of_bag=training_oob(est, shard, meta) if training else None)
    labels, values = predict_rows(model_input(X))
    report["predictions"] = {"what": what, "n_rows": int(len(values)),
                             "columns": {label: rep.distribution(values[:, j]) for j, label in enumerate(labels)}}
    lines += ["", f"Predicted {what} on {len(values)} rows of {data}"
                  + (" (out of bag):" if training else ":")]
    for label, summary in report["predictions"]["columns"].items():
        lines += [f"  {label}: mean {summary['mean']:.4g}, sd {summary['std']:.4g}; "
                  + "  ".join(f"{k} {v:.4g}" for k, v in summary["quantiles"].items())]
    order = rep.importance_order(imp, sort_by)[:3]
    curves = pdp_curves(est, names, X, [int(j) for j in order], lambda Z: predict(model_input(Z))[1])
    report["partial_dependence"] = {"what": what, "columns": labels,
                                    "features": {c[0]: dict(grid=c[1], mean=c[2], **({} if c[3] is None else
                                                                                     {"categories": c[3]}))
                                                 for c in curves}}
    # Partial dependence evaluates the whole forest at grid values (a summary of the
    # fitted function, not of any row's own outcome): the same on any rows.
    lines += ["", f"Partial dependence of the predicted {what} (whole forest, mean over rows; grid min -> max, "
                  f"range; a categorical feature: one bar per category):"]
    for n, g, m, cats in curves:
        if m.size:
            m = m.reshape(len(g), -1)
            for j, label in enumerate(labels):
                head = f"  {n}" + (f" {label}" if len(labels) > 1 else "")
                if cats is None:
                    lines.append(head + f": {m[0, j]:.4g} -> {m[-1, j]:.4g} (range {np.ptp(m[:, j]):.4g})")
                else:
                    lines.append(head + f" (categorical; range {np.ptp(m[:, j]):.4g}):")
                    lines += ["    " + bar for bar in rep.text_bars(cats, m[:, j])]
    if want_figures:
        figures["distribution"] = rep.distribution_figure(values, labels, what)
        if curves:
            figures["pdp"] = rep.pdp_figure(curves, what, labels)
    t_col, y_col = meta.get("treatment"), meta.get("outcome")
    observed = all(isinstance(c, str) and c in shard.columns for c in (t_col, y_col))
    ranking = ranking_error = None
    if training and observed and hasattr(est, "dr_scores"):
        try:
            ranking = _held_out_ranking(est, model_input(X), shard, meta)
            lines += ["", f"Qini and RATE {ranking.describe()}."]
        except ValueError as exc:     # e.g. an outcome with NaN: no half forest, so no honest ranking
            ranking_error = str(exc).strip().splitlines()[0]
    if predicts_effects(est) and observed and len(labels) == 1:
        t, y = shard.columns[t_col], shard.columns[y_col]
        if type(est).__name__ == "InstrumentalForest":
            # the observed treatment is endogenous: treated minus control is confounded
            lines += ["", f"(no Qini curve: {t_col!r} is instrumented, so its treated-control gaps are confounded)"]
        elif not np.isfinite(y).all():
            lines += ["", f"(no Qini curve: {y_col!r} holds NaN, nulls or inf)"]
        elif ranking_error is not None:
            lines += ["", f"(no Qini curve on the training rows: no forest could be refitted on half of them to "
                          f"rank the other half: {ranking_error})"]
        elif np.isin(t, (0.0, 1.0)).all() and 0 < t.sum() < t.size:
            if ranking is None:
                qc = rep.qini_curve(values[:, 0], t, y)
            else:
                m = ranking.mask
                qc = rep.qini_curve(np.asarray(ranking.priorities).reshape(len(m), -1)[m, 0], t[m], y[m])
            report["qini"] = {"qini_coefficient": qc["qini_coefficient"], "auuc": qc["auuc"],
                              "n_rows": int(t.size if ranking is None else ranking.n_rank)}
            lines += ["", f"Qini coefficient {qc['qini_coefficient']:.4g}, AUUC {qc['auuc']:.4g} "
                          f"(targeting by predicted effect; observed {t_col!r}, {y_col!r})"]
            if want_figures:
                figures["qini"] = rep.qini_figure(qc)
        else:
            lines += ["", f"(no Qini curve: {t_col!r} is not a binary 0/1 treatment with both arms)"]
    if hasattr(est, "predict_survival_function"):
        _add_survival(report, lines, figures, est, model_input(X), shard, meta, values[:, 0], training, want_figures)
    if predicts_effects(est) and observed and hasattr(est, "dr_scores"):
        _add_analysis(report, lines, figures, est, X, shard, meta, names, imp, want_figures, values, ranking,
                      ranking_error)
    if hasattr(est, "horizon_"):
        _add_causal_survival(report, lines, figures, est, X, shard, meta, names, imp, want_figures, values)
    return report, figures, "\n".join(lines)


def categorical_summary(est, names):
    """``{feature: {"levels": k, "categories": [...]}}`` of the model's categorical features."""
    coder = getattr(est, "category_coder_", None)
    if coder is None:
        return {}
    return {names[int(f)]: {"levels": int(len(coder.categories_[j])), "categories": coder.category_names(j)}
            for j, f in enumerate(coder.columns_)}


def pdp_curves(est, names, X, features, predict):
    """Partial dependence of ``features``: ``[(name, grid, mean, categories or None), ...]``.

    A categorical feature is set to each of its categories in the data (the most
    frequent :data:`forest.report.summary.PDP_MAX_CATEGORIES`), named by the model's
    coder; a numeric one to quantiles of its values.
    """
    from forest.report import summary as rep

    coder = getattr(est, "category_coder_", None)
    where = rep.categorical_positions(coder)
    curves = []
    for j in features:
        if j not in where:
            grid, mean = rep.partial_dependence(predict, X, j)
            curves.append((names[j], grid, mean, None))
            continue
        grid, mean = rep.partial_dependence(predict, X, j, grid=rep.categorical_grid(X[:, j]))
        every = coder.category_names(where[j])
        curves.append((names[j], grid, mean, [every[int(c)] for c in grid]))
    return curves


def _held_out_ranking(est, rows, shard, meta):
    """:class:`forest.report.analysis.HeldOutRanking` of the training rows (a forest refitted on half)."""
    import numpy as np

    from forest.report.analysis import HeldOutRanking

    col = meta.get("cluster")
    clusters = shard.columns[col] if est.sampling_.get("clusters", False) else None
    t = shard.columns[meta["treatment"]]
    return HeldOutRanking(est, rows, t, shard.columns[meta["outcome"]], np.arange(len(t)), clusters=clusters,
                          seed=int(est.sampling_["seed"]))


def _targets(est, shard, meta):
    """The data's columns of the fit's targets (``fit``'s order, :mod:`forest.estimators.kinds`), or None."""
    from forest.estimators.kinds import kind_of

    kind = kind_of(est)
    cols = [meta.get(role) for role in kind.targets] if kind is not None else None
    if not cols or not all(isinstance(c, str) and c in shard.columns for c in cols):
        return None
    return [shard.columns[c] for c in cols]


def recognise_rows(est, rows, shard, meta):
    """How the data's rows relate to the model's training rows (:mod:`forest.io.training_rows`).

    Parameters
    ----------
    est : fitted estimator
    rows : model input (the data's feature columns)
    shard : forest.io.dataio.Shard
        Every row of the data (the report runs on one process).
    meta : dict
        The model file's metadata (target column names).

    Returns
    -------
    forest.io.training_rows.RowMatch or None
        None for a model that cannot tell (gradient boosting keeps no out-of-bag state).
    """
    from native.comm import SelfCommunicator

    if not hasattr(est, "training_row_match"):
        return None
    targets = _targets(est, shard, meta)
    try:
        return est.training_row_match(rows, *(targets or ()), comm=SelfCommunicator())
    except ValueError:
        # Targets the model cannot code (e.g. a treatment level it never saw) are not its
        # training rows' targets: compare the features alone.
        return est.training_row_match(rows, comm=SelfCommunicator())


def rows_summary(est, match):
    """``{"source", "sentence"}``: which rows the report's figures use."""
    if match is None:
        return {"source": "in-sample",
                "sentence": f"{type(est).__name__} keeps no out-of-bag state: if these are its training rows, its "
                            f"predictions on them are in-sample"}
    source = {"training": "out-of-bag", "held-out": "held-out", "unknown": "unknown"}[match.kind]
    return {"source": source, "sentence": match.sentence()}


def training_oob(est, shard, meta):
    """``oob_predict(X)`` of the training rows (a classifier's ``oob_predict_proba(X)``), with the fit's clusters
    when it had them."""
    from native.comm import SelfCommunicator

    col = meta.get("cluster")
    clusters = shard.columns[col] if est.sampling_.get("clusters", False) and col in shard.columns else None
    if est.sampling_.get("clusters", False) and clusters is None:
        raise CLIError("these are the training rows of a model fitted with --cluster, but the data has no "
                       f"{col!r} column: out-of-bag estimates need it")
    # A classifier's summary is its class probabilities (forest.report.summary.summarised_quantity)
    # a survival forest's summary is its risk score (its oob_predict gives curves)
    out_of_bag = (est.oob_predict_proba if hasattr(est, "oob_predict_proba")
                  else est.oob_risk if hasattr(est, "oob_risk") else est.oob_predict)
    return lambda X: out_of_bag(X, comm=SelfCommunicator(), clusters=clusters)


def _add_survival(report, lines, figures, est, X, shard, meta, risk, training, want_figures):
    """Survival curves by risk group (:func:`forest.report.survival.survival_groups`), with the data's own
    Kaplan-Meier curve of each group and the concordance when it holds the time and event columns."""
    import numpy as np

    from forest.report import survival as rep
    from native.comm import SelfCommunicator

    time_col, event_col = meta.get("time"), meta.get("event")
    observed = all(isinstance(c, str) and c in shard.columns for c in (time_col, event_col))
    time_, event = (shard.columns[time_col], shard.columns[event_col]) if observed else (None, None)
    if observed and not (np.all(np.isfinite(time_)) and np.all(np.isin(event, (0.0, 1.0)))):
        lines += ["", f"(no observed curves: {time_col!r} or {event_col!r} holds values a survival fit refuses)"]
        observed, time_, event = False, None, None
    groups = rep.survival_groups(est, X, risk, time_, event,
                                 oob=(lambda: est.oob_predict(X, comm=SelfCommunicator())) if training else None)
    report["survival"] = groups
    lines += ["", rep.survival_text(groups, time_col, event_col, training)]
    if want_figures:
        figures["survival"] = rep.survival_figure(groups)


def _add_causal_survival(report, lines, figures, est, X, shard, meta, names, imp, want_figures, effects):
    """A causal survival forest's part: the arms' observed curves and restricted means (or survival at the
    horizon), then the doubly robust analyses with the outcome ``(time, event)``."""
    import warnings

    import numpy as np

    from forest.io.training_rows import TrainingRowsNotice
    from forest.report import survival as rep

    cols = [meta.get(role) for role in ("treatment", "time", "event")]
    if not all(isinstance(c, str) and c in shard.columns for c in cols):
        lines += ["", "(no effect on survival: the data lacks the treatment, time or event column)"]
        return
    t, time_, event = (shard.columns[c] for c in cols)
    if not (np.all(np.isfinite(time_)) and np.all(time_ >= 0) and np.all(np.isin(event, (0.0, 1.0)))
            and np.all(np.isin(t, (0.0, 1.0))) and 0 < t.sum() < t.size):
        lines += ["", f"(no effect on survival: {cols[0]!r}, {cols[1]!r} or {cols[2]!r} holds values a fit refuses)"]
        return
    arms = rep.arm_curves(time_, event, t, est.horizon_, est.target_)
    report["survival_arms"] = arms
    effect = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainingRowsNotice)     # the report says which rows it uses
        try:
            effect = tuple(float(v) for v in est.average_treatment_effect(X=model_rows(est, names, X), t=t,
                                                                              y=(time_, event)))
        except ValueError:
            pass
    lines += ["", rep.arm_text(arms, effect)]
    if want_figures:
        figures["survival_arms"] = rep.arm_figure(arms)
    _add_analysis(report, lines, figures, est, X, shard, meta, names, imp, want_figures, effects, y=(time_, event))


def _add_analysis(report, lines, figures, est, X, shard, meta, names, imp, want_figures, effects, ranking=None,
                  ranking_error=None, y=None):
    """Average effects, calibration, BLP and RATE on the data (:mod:`forest.report.analysis`)."""
    import warnings

    from forest.report.analysis import analysis_report
    from forest.io.training_rows import TrainingRowsNotice

    clusters = shard.columns.get(meta.get("cluster")) if meta.get("cluster") else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainingRowsNotice)     # the report says it once, in its own words
        part, text, figs = analysis_report(est, X, shard.columns[meta["treatment"]],
                                           shard.columns[meta["outcome"]] if y is None else y,
                                           names, imp["depth_weighted"], clusters=clusters,
                                           want_figures=want_figures, priorities=effects,
                                           rows=report["rows"]["source"], ranking=ranking,
                                           ranking_error=ranking_error,
                                           model_input=lambda Z: model_rows(est, names, Z))
    report["analysis"] = part
    lines += text
    figures.update(figs)


def _body(argv):
    args = build_parser().parse_args(argv)
    if args.top < 1:
        raise CLIError("--top must be at least 1")
    if env_rank() != 0:
        # One process makes the report (see the module docstring); under mpirun the
        # other ranks would print it again (invalid --json) and rewrite the --html page.
        return 0
    from forest.cli import policy
    if policy.is_policy_model(args.model):  # policy trees: the tree, its value and cost curves
        return policy.report(args.model, html=args.html, as_json=args.json, data=args.data)
    from forest.report import summary as rep
    from forest.io.dataio import DataError
    from forest.io.model_io import check_writable

    try:
        if args.html is not None:
            check_writable(args.html)
        report, figures, text = build_report(args.model, data=args.data, top=args.top,
                                             want_figures=args.html is not None, html=args.html)
    except (ValueError, DataError) as exc:  # ModelFormatError, DataError, check_not_input, check_writable
        raise CLIError(str(exc).strip().splitlines()[0]) from None
    if args.html:
        from forest.report.html import report_page

        page = report_page(report, figures, f"histforest report: {report['model']} ({args.model})", text=text)
        try:
            with open(args.html, "w", encoding="utf-8") as f:
                f.write(page)
        except OSError as exc:
            raise CLIError(f"cannot write {args.html!r}: {exc.strerror or exc}") from None
    if args.json:
        json.dump(rep.to_json(report), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(text)
        if args.html:
            print(f"\nwrote {args.html}")
    return 0


def main(argv=None):
    """Console entry point of ``forest-report``."""
    return run_tool(PROG, _body, argv)


if __name__ == "__main__":
    sys.exit(main())

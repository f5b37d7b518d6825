"""``forest-report``: feature importances of a model file, as text, JSON or an HTML page.

With ``--data`` and a causal model the report adds the distribution of predicted
effects, the partial dependence of the effect on the top features, and, when the
data holds the training treatment and outcome columns (binary treatment), the Qini
curve with its coefficient and AUUC. The tool runs on one process: it reads the
whole ``--data`` set (meant for a held-out sample, not the full training data).
"""
import json
import sys

from forest.cli.common import CLIError, Parser, run_tool

PROG = "forest-report"


def build_parser():
    """The argument parser of ``forest-report``."""
    p = Parser(
        prog=PROG,
        description="Report a model's feature importances (GRF depth-weighted split frequency, "
                    "share of split gain, split counts) and, with --data, its predicted effects.",
        epilog="examples:\n"
               "  forest-report cf.model\n"
               "  forest-report cf.model --data holdout.parquet --html report.html\n"
               "  forest-report cf.model --json > importances.json",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="model file written by forest-train")
    p.add_argument("--data", help="data (parquet file/dir/glob or CSV) to predict effects on")
    p.add_argument("--html", metavar="PATH", help="write a self-contained HTML report here")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of text")
    p.add_argument("--top", type=int, default=20, help="rows of the importance table (default 20)")
    return p


def _feature_names(header, n_features=None):
    names = header.get("feature_names") or header.get("metadata", {}).get("feature_names")
    if names is None:
        names = [f"x{j}" for j in range(n_features or 0)]
    return [str(n) for n in names]


def _is_causal(header, est):
    return header.get("metadata", {}).get("model") == "causal" or hasattr(est, "predict_interval")


def _predict_1d(est, X):
    import numpy as np

    pred = np.asarray(est.predict(X), dtype=np.float64)
    if pred.ndim == 2 and pred.shape[1] == 1:
        pred = pred[:, 0]
    return pred


def build_report(path, data=None, top=20, want_figures=False):
    """Compute the report of model file ``path``.

    Parameters
    ----------
    path : str
    data : str, optional
        Data to predict on.
    top : int
        Features listed (and partial dependence of the first three).
    want_figures : bool
        Also render the figures (base64 PNG) for the HTML page.

    Returns
    -------
    report : dict
        JSON-able after :func:`forest.report.to_json`.
    figures : dict of str -> str
        base64 PNG images (empty unless ``want_figures``).
    text : str
        The text form.
    """
    import numpy as np

    from forest import dataio, model_io
    from forest import report as rep

    header = model_io.read_header(path)
    est = model_io.load(path)
    names = _feature_names(header, getattr(est, "n_features_in_", None))
    trees = rep.model_trees(est)
    if not trees:
        raise CLIError(f"model file {path!r} holds no trees (is the model fitted?)")
    imp = rep.importances(trees, len(names))
    meta = header.get("metadata", {})
    report = {
        "model": header["estimator"].rsplit(".", 1)[-1], "model_file": path,
        "library_version": header.get("library_version"), "format_version": header.get("format_version"),
        "n_trees": len(trees), "n_training_rows": meta.get("n_rows"),
        "treatment": meta.get("treatment"), "outcome": meta.get("outcome"),
        "features": names,
        "importance": {k: v for k, v in imp.items()},
    }
    figures = {}
    lines = [f"{report['model']} from {path}: {len(trees)} trees, {len(names)} features"
             + (f", trained on {meta['n_rows']} rows" if meta.get("n_rows") else "")
             + f" (histforest {header.get('library_version')}, format {header.get('format_version')})",
             "", "Feature importance (sorted by GRF depth-weighted split frequency):",
             rep.text_table(names, imp, limit=top)]
    if want_figures:
        figures["importance"] = rep.importance_figure(names, imp, limit=top)

    if data is not None:
        source = dataio.open_source(data)
        extra = [c for c in (meta.get("treatment"), meta.get("outcome")) if c and c in source.columns]
        dataio.check_columns(source, numeric=names + extra)
        if source.n_rows == 0:
            raise CLIError(f"{data!r} holds no rows (empty file)")
        shard = dataio.read_shard(source, (0, len(source.groups)), numeric=names + extra)
        X = np.column_stack([shard.columns[n] for n in names]) if names else np.zeros((shard.n_local, 0))
        pred = _predict_1d(est, X)
        q = np.quantile(pred, [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
        what = "effect tau(x)" if _is_causal(header, est) else "value"
        report["predictions"] = {"n_rows": int(pred.size), "what": what, "mean": float(pred.mean()),
                                 "std": float(pred.std()), "quantiles": dict(zip(
                                     ["min", "p10", "p25", "p50", "p75", "p90", "max"], q.tolist()))}
        lines += ["", f"Predicted {what} on {pred.size} rows of {data}: mean {pred.mean():.4g}, "
                      f"sd {pred.std():.4g}",
                  "  " + "  ".join(f"{k} {v:.4g}" for k, v in report["predictions"]["quantiles"].items())]
        if _is_causal(header, est):
            order = np.lexsort((np.arange(len(names)), -imp["gain"], -imp["depth_weighted"]))[:3]
            curves = []
            for j in order:
                grid, mean = rep.partial_dependence(lambda Z: _predict_1d(est, Z), X, int(j))
                curves.append((names[j], grid, mean))
            report["partial_dependence"] = {n: {"grid": g, "mean_tau": m} for n, g, m in curves}
            lines += ["", "Partial dependence of tau (mean over rows; grid min -> max):"]
            lines += [f"  {n}: {m[0]:.4g} -> {m[-1]:.4g}" for n, g, m in curves if m.size]
            t_col, y_col = meta.get("treatment"), meta.get("outcome")
            if t_col in shard.columns and y_col in shard.columns:
                t, y = shard.columns[t_col], shard.columns[y_col]
                if np.isin(t, (0.0, 1.0)).all() and 0 < t.sum() < t.size:
                    qc = rep.qini_curve(pred, t, y)
                    report["qini"] = {"qini_coefficient": qc["qini_coefficient"], "auuc": qc["auuc"],
                                      "n_rows": int(t.size)}
                    lines += ["", f"Qini coefficient {qc['qini_coefficient']:.4g}, AUUC {qc['auuc']:.4g} "
                                  f"(targeting by predicted effect; observed {t_col!r}, {y_col!r})"]
                    if want_figures:
                        figures["qini"] = rep.qini_figure(qc)
                else:
                    lines += ["", f"(no Qini curve: {t_col!r} is not a binary 0/1 treatment with both arms)"]
            if want_figures:
                figures["effects"] = rep.effects_figure(pred)
                if curves:
                    figures["pdp"] = rep.pdp_figure(curves)
    return report, figures, "\n".join(lines)


def _body(argv):
    args = build_parser().parse_args(argv)
    if args.top < 1:
        raise CLIError("--top must be at least 1")
    from forest.cli import policy
    if policy.is_policy_model(args.model):  # policy trees: the tree, its value and cost curves
        return policy.report(args.model, html=args.html, as_json=args.json, data=args.data)
    from forest import report as rep
    from forest.dataio import DataError
    from forest.model_io import ModelFormatError

    try:
        report, figures, text = build_report(args.model, data=args.data, top=args.top,
                                             want_figures=args.html is not None)
    except (ModelFormatError, DataError) as exc:
        raise CLIError(str(exc)) from None
    if args.html:
        sections = [("Feature importance", text.split("\n\n", 2)[-1] if args.data is None else text,
                     figures.get("importance"))]
        for key, heading in (("effects", "Distribution of predicted effects"),
                             ("pdp", "Partial dependence of the effect on the top features"),
                             ("qini", "Qini curve")):
            if key in figures:
                sections.append((heading, "", figures[key]))
        page = rep.html_page(f"histforest report: {report['model']} ({args.model})", sections)
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

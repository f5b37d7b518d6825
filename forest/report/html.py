"""The HTML page of ``forest-report``: one section per analysis, each with its table, reading and plot.

This module owns how a report dict (:func:`forest.cli.report.build_report`) becomes
a page for a reader who is not a statistician. Every section shows

* an HTML table of the section's numbers (4 significant digits);
* one plain sentence that reads the result (computed from the numbers: a p-value
  against 0.05, whether a 95% interval covers zero, which feature matters most),
  one per effect contrast for a multi-arm model;
* which rows the numbers come from (``report["rows"]["source"]``: the training
  rows with out-of-bag estimates, held-out rows, unknown, in-sample for a model
  without out-of-bag state, or no data);
* its figure beside the table (below it on a narrow screen).

The page is self-contained: figures are embedded as base64 PNG, the CSS is inline,
and nothing is loaded from the network. Every string from the report is escaped.
"""
import html
import math
import re

import numpy as np

#: Rows of the importance table when the report does not say (forest-report's --top default).
DEFAULT_TOP = 20
#: Significance level of every reading on the page (the report's intervals are 95%).
ALPHA = 0.05
#: A mean forest prediction this close to 1 reads as well calibrated even when a tight
#: interval excludes 1: a 2% miss in the average effect is no practical miscalibration.
CALIBRATION_TOLERANCE = 0.1

_ROW_SOURCES = ("out-of-bag", "held-out", "unknown", "in-sample", "none")

_IMPORTANCE_TITLES = {"depth_weighted": "GRF depth-weighted split frequency", "gain": "share of split gain",
                      "splits": "split count"}

_AVERAGE_TARGETS = {"all": "all rows (ATE)", "treated": "treated rows (ATT)", "control": "control rows (ATC)",
                    "overlap": "overlap-weighted"}

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#222;max-width:1200px;
     margin:1.5em auto;padding:0 1em;line-height:1.45}
h1{font-size:1.5em;margin-bottom:.3em;overflow-wrap:anywhere}
h2{font-size:1.2em;margin:0 0 .4em 0}
nav{font-size:.9em;margin-bottom:1em}
nav a{margin-right:1em;color:#3b6ea5;text-decoration:none}
section{border-top:1px solid #ddd;padding:1em 0 1.2em 0}
.rowsbox{background:#fff6d6;border:1px solid #e0c35c;border-left:6px solid #d4a017;padding:.7em 1em;
         margin:.8em 0;font-size:1.05em}
.reading{font-size:1.08em;margin:.3em 0 .4em 0;padding-left:.7em;border-left:4px solid #3b6ea5}
ul.reading{padding-left:1.8em}
ul.reading li{margin:.15em 0}
.rows{color:#555;font-size:.9em;margin:0 0 .8em 0}
.pair{display:flex;flex-wrap:wrap;gap:1.5em;align-items:flex-start}
.numbers{flex:0 1 auto;max-width:100%;overflow-x:auto}
.plot{flex:1 1 420px;min-width:0}
.plot.wide{flex-basis:100%}
.plot img{max-width:100%;height:auto;border:1px solid #eee}
table{border-collapse:collapse;font-size:.9em}
caption{text-align:left;font-weight:600;padding:.2em 0}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#e9eef5}
table.facts th{font-weight:normal;text-align:left}
tbody tr:nth-child(even){background:#f6f8fb}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
details{margin-top:1.5em}
pre{background:#f4f4f4;padding:1em;overflow-x:auto;font-size:.85em}
@media (max-width:760px){table{font-size:.8em}th,td{padding:.2em .4em}.reading{font-size:1em}}
"""


# ------------------------------------------------------------------ formatting

def _esc(value):
    return html.escape(str(value), quote=True)


def _is_missing(x):
    return x is None or (isinstance(x, (float, np.floating)) and not math.isfinite(float(x)))


def fmt(x):
    """A number with 4 significant digits, as text (``n/a`` for None or non-finite).

    Integers print whole; large floats print as grouped whole numbers rather than in
    exponent notation, which readers outside statistics do not read at a glance.
    """
    if _is_missing(x):
        return "n/a"
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return f"{int(x):,}"
    x = float(x)
    if 1e4 <= abs(x) < 1e15:
        return f"{float(f'{x:.4g}'):,.0f}"
    return f"{x:.4g}"


def fmt_p(p):
    """A p-value as ``"= 0.25"`` or ``"< 0.0001"`` (to follow ``p``)."""
    if _is_missing(p):
        return "= n/a"
    return "< 0.0001" if float(p) < 1e-4 else f"= {float(p):.4g}"


class PValue(float):
    """A p-value table cell: printed as ``< 0.0001`` when tiny, not as ``3.9e-309`` or ``0``."""


def _cell(x):
    """Text of a numeric table cell."""
    if isinstance(x, PValue) and not _is_missing(x):
        return fmt_p(x).lstrip("= ")
    return fmt(x)


def _floats(values):
    """``values`` (nested lists, possibly holding None) as a float array, None -> nan."""
    return np.array(values if values is not None else [], dtype=np.float64)


def _join(words):
    words = list(words)
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


# ------------------------------------------------------------------ building blocks

def _table(header, rows, numeric_from=1, caption=None):
    """An HTML table; cells from column ``numeric_from`` on are numbers (right-aligned)."""
    parts = ["<table>"]
    if caption:
        parts.append(f"<caption>{_esc(caption)}</caption>")
    parts.append("<thead><tr>" + "".join(f"<th>{_esc(h)}</th>" for h in header) + "</tr></thead><tbody>")
    for row in rows:
        cells = []
        for j, cell in enumerate(row):
            if j >= numeric_from and not isinstance(cell, str):
                cells.append(f'<td class="num">{_esc(_cell(cell))}</td>')
            else:
                cells.append(f"<td>{_esc(cell)}</td>")
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</tbody></table>")
    return "".join(parts)


def _image(png, alt):
    # A figure is base64 text from our own renderer; anything else is dropped rather
    # than pasted into a src attribute.
    if not png or not re.fullmatch(r"[A-Za-z0-9+/=\s]+", png):
        return ""
    return f'<img alt="{_esc(alt)}" src="data:image/png;base64,{png.strip()}">'


def _section(anchor, heading, reading, rows_line, tables, png=None, wide_plot=False):
    """One analysis: heading, the reading, the rows it used, tables beside the plot.

    ``reading`` is one sentence, or a list of them (one per effect contrast), shown as a list.
    """
    plot = _image(png, heading)
    parts = [f'<section id="{_esc(anchor)}">', f"<h2>{_esc(heading)}</h2>"]
    sentences = [reading] if isinstance(reading, str) else list(reading or [])
    sentences = [x for x in sentences if x]
    if len(sentences) == 1:
        parts.append(f'<p class="reading">{_esc(sentences[0])}</p>')
    elif sentences:
        parts.append('<ul class="reading">' + "".join(f"<li>{_esc(x)}</li>" for x in sentences) + "</ul>")
    if rows_line:
        parts.append(f'<p class="rows">{_esc(rows_line)}</p>')
    parts.append('<div class="pair"><div class="numbers">' + "".join(tables) + "</div>")
    if plot:
        parts.append(f'<div class="plot{" wide" if wide_plot else ""}">{plot}</div>')
    parts.append("</div></section>")
    return "\n".join(parts)


# ------------------------------------------------------------------ rows

def rows_source(report):
    """Which rows the report's figures use: ``report["rows"]["source"]``.

    ``"none"`` when the report does not record it; an unfamiliar source counts as
    ``"unknown"`` so the page never claims more than the report does.
    """
    rows = report.get("rows")
    source = rows.get("source", "none") if isinstance(rows, dict) else "none"
    return source if source in _ROW_SOURCES else "unknown"


def rows_sentence(report):
    """The sentence of the highlighted rows box (capitalised, ending in a full stop)."""
    rows = report.get("rows")
    sentence = str(rows.get("sentence") or "").strip() if isinstance(rows, dict) else ""
    if not sentence:
        if "predictions" in report:
            sentence = "this report does not record which rows its figures use"
        else:
            sentence = "no data given: the page shows only what the model file holds"
    return sentence[0].upper() + sentence[1:] + ("" if sentence.endswith(".") else ".")


def rows_line(report, n_rows=None):
    """``Rows: ...`` under an analysis computed from the data's rows (and their predictions)."""
    count = f" ({fmt(int(n_rows))} rows)" if n_rows is not None else ""
    return {
        "out-of-bag": f"Rows: the training rows, out-of-bag estimates{count}.",
        "held-out": f"Rows: held-out rows{count}.",
        "unknown": f"Rows: the given rows, treated as held out{count}; whether the model trained on them is "
                   "unknown (the model file records no fingerprint).",
        "in-sample": f"Rows: the given rows{count}; the model keeps no out-of-bag state, so on its training "
                     "rows these are in-sample predictions.",
        "none": f"Rows: not recorded{count}.",
    }[rows_source(report)]


#: Partial dependence predicts made-up rows (one feature set to each grid value), which
#: no tree left out: it always uses the whole model, whichever rows the data are.
PDP_ROWS_LINE = ("Rows: the given rows with one feature set to each grid value; predictions of the whole model "
                 "(not out of bag), so this reads the fitted function, not these rows' outcomes.")


def _data_rows(report):
    return (report.get("predictions") or {}).get("n_rows")


def ranked_rows_line(report, n_rows):
    """``Rows: ...`` of Qini and RATE: on training rows a hashed half, ranked by a forest refitted on the rest."""
    ranking = (report.get("analysis") or {}).get("rate_ranking")
    if rows_source(report) != "out-of-bag":
        return rows_line(report, n_rows)
    if ranking:
        return (f"Rows: {fmt(int(ranking['rank_rows']))} of the training rows (picked by a hash of the row id), "
                f"ranked by a forest with the model's parameters refitted on the other "
                f"{fmt(int(ranking['fit_rows']))}; their scores out of bag.")
    return (f"Rows: half of the training rows ({fmt(int(n_rows))}), ranked by a forest refitted on the other half; "
            f"their scores out of bag." if n_rows is not None else rows_line(report, n_rows))


# ------------------------------------------------------------------ overview

def tuned_sentence(tuning):
    """``report["tuning"]`` as one line: the values the forest was grown with and whether tuning chose them."""
    if not tuning:
        return None
    values = ", ".join(f"{k} = {fmt(v) if isinstance(v, (float, np.floating)) else v}"
                       for k, v in tuning["values"].items())
    return f"{values} ({tuning['status']})"


def overview_section(report):
    """Model class, file, trees, features, training rows, versions and the highlighted rows box."""
    items = [("Model", report.get("model")), ("Model file", report.get("model_file")),
             ("Trees", report.get("n_trees")), ("Features", len(report.get("features") or [])),
             ("Training rows", report.get("n_training_rows")), ("Treatment column", report.get("treatment")),
             ("Outcome column", report.get("outcome")), ("histforest version", report.get("library_version")),
             ("Model format version", report.get("format_version")),
             ("Tuned parameters", tuned_sentence(report.get("tuning")))]
    # every value reads as text here (a version number is no quantity to right-align)
    body = "".join(f"<tr><th>{_esc(k)}</th><td>{_esc(fmt(v) if isinstance(v, (int, np.integer)) else v)}</td></tr>"
                   for k, v in items if v is not None)
    return "\n".join(['<section id="overview">', "<h2>Overview</h2>",
                      f'<div class="rowsbox">{_esc(rows_sentence(report))}</div>',
                      f'<table class="facts"><tbody>{body}</tbody></table>', "</section>"])


# ------------------------------------------------------------------ importance

def _importance_order(imp, sort_by):
    """Feature indices by decreasing ``imp[sort_by]``, ties by the other measure then index.

    The order of :func:`forest.report.summary.importance_order`, so the page lists features as
    the text table does; done here on float arrays because a JSON round trip leaves lists.
    """
    primary = _floats(imp[sort_by])
    other_key = "gain" if sort_by == "depth_weighted" else "depth_weighted"
    other = _floats(imp[other_key]) if other_key in imp else np.zeros_like(primary)
    return np.lexsort((np.arange(primary.size), -other, -primary))


def feature_label(report, name):
    """``name``, or ``race (categorical, 5 levels)`` for a categorical feature (``report["categorical"]``)."""
    info = (report.get("categorical") or {}).get(name)
    return f"{name} (categorical, {info.get('levels')} levels)" if isinstance(info, dict) else str(name)


def importance_section(report, png=None):
    """Table of the top features (categorical ones named as such), a sentence naming the most important one."""
    names = [feature_label(report, str(n)) for n in report.get("features") or []]
    imp = report["importance"]
    sort_by = report.get("importance_sorted_by") or next(iter(imp))
    order = _importance_order(imp, sort_by)[:int(report.get("top") or DEFAULT_TOP)]
    # the measure the rows are sorted by comes first, so the ranking reads left to right
    measures = [sort_by] + [k for k in ("depth_weighted", "gain", "splits") if k in imp and k != sort_by] + \
        [k for k in imp if k not in _IMPORTANCE_TITLES and k != sort_by]
    columns = {k: _floats(imp[k]) for k in measures}
    rows = [[r + 1, names[j] if j < len(names) else f"x{j}"]
            + [int(columns[k][j]) if k == "splits" else float(columns[k][j]) for k in measures]
            for r, j in enumerate(order)]
    header = ["rank", "feature"] + [_IMPORTANCE_TITLES.get(k, k) for k in measures]
    title = _IMPORTANCE_TITLES.get(sort_by, sort_by)
    reading = ""
    if len(order):
        first = rows[0][1]
        value = columns[sort_by][order[0]]
        reading = f"The model relies most on {first} ({title} {fmt(value)})"
        if len(order) > 1:
            reading += f", followed by {rows[1][1]} ({fmt(columns[sort_by][order[1]])})"
        reading += "."
    table = _table(header, rows, numeric_from=2,
                   caption=f"Top {len(order)} of {len(names)} features, sorted by {title}")
    line = "Rows: none of the data; read from the trees' splits, which were grown on the training rows."
    return _section("importance", "Feature importance", reading, line, [table], png, wide_plot=True)


# ------------------------------------------------------------------ predictions

def predictions_section(report, png=None):
    """Mean, sd and quantiles of each predicted column; a sentence on the typical value and spread."""
    pred = report["predictions"]
    what = str(pred.get("what", "value"))
    columns = pred.get("columns") or {}
    labels = list(columns)
    stats = ["mean", "std"] + list(next(iter(columns.values()), {}).get("quantiles", {}))
    names = {"std": "sd", "p10": "10%", "p25": "25%", "p50": "median", "p75": "75%", "p90": "90%"}

    def value(summary, stat):
        return summary.get(stat) if stat in ("mean", "std") else summary.get("quantiles", {}).get(stat)

    rows = [[names.get(s, s)] + [value(columns[c], s) for c in labels] for s in stats]
    table = _table(["statistic"] + labels, rows)
    clauses = []
    for label, summary in columns.items():
        q = summary.get("quantiles", {})
        clause = f"{label} averages {fmt(summary.get('mean'))}" if len(labels) > 1 else \
            f"the predicted {what} averages {fmt(summary.get('mean'))}"
        if "p25" in q and "p75" in q:
            clause += f" (the middle half of rows lie between {fmt(q['p25'])} and {fmt(q['p75'])})"
        clauses.append(clause)
    n = pred.get("n_rows")
    lead = f"Across the {fmt(int(n))} rows, " if n is not None else "Across the rows, "
    reading = lead + "; ".join(clauses) + "." if clauses else ""
    return _section("predictions", f"Predicted {what}", reading, rows_line(report, n), [table], png)


# ------------------------------------------------------------------ partial dependence

def _pdp_rows(pd):
    """``(feature, column or None, at grid min, at grid max, range, categories or None)`` per curve."""
    labels = [str(c) for c in pd.get("columns") or []]
    rows = []
    for name, curve in (pd.get("features") or {}).items():
        grid = _floats(curve.get("grid"))
        mean = _floats(curve.get("mean"))
        if not grid.size or not mean.size:
            continue
        # ``mean`` is (m,), (m, k) or flattened (m * k,): one column per predicted label
        mean = mean.reshape(grid.size, -1)
        for j in range(mean.shape[1]):
            label = labels[j] if mean.shape[1] > 1 and j < len(labels) else None
            col = mean[:, j]
            rows.append((str(name), label, float(col[0]), float(col[-1]), float(np.nanmax(col) - np.nanmin(col)),
                         curve.get("categories")))
    return rows


def _category_table(pd, name, curve):
    """One categorical feature's partial dependence: a row per category, a column per predicted label."""
    labels = [str(c) for c in pd.get("columns") or []]
    grid = _floats(curve.get("grid"))
    mean = _floats(curve.get("mean")).reshape(grid.size, -1)
    heads = labels if mean.shape[1] > 1 and len(labels) == mean.shape[1] else ["mean predicted"]
    rows = [[str(c)] + [float(v) for v in mean[i]] for i, c in enumerate(curve.get("categories") or [])]
    return _table(["category"] + heads, rows, caption=f"{name} (categorical): one bar per category")


def pdp_section(report, png=None):
    """Value at the feature's lowest and highest grid point and the range, per feature."""
    pd = report["partial_dependence"]
    what = str(pd.get("what", "value"))
    curves = _pdp_rows(pd)
    several = any(c[1] is not None for c in curves)
    header = ["feature"] + (["column"] if several else []) + ["at lowest value", "at highest value", "range"]
    # a categorical feature has no lowest or highest value: its own table lists every category
    rows = [[c[0]] + ([c[1] or ""] if several else []) + list(c[2:5]) for c in curves if c[5] is None]
    tables = [_table(header, rows, numeric_from=2 if several else 1)] if rows else []
    tables += [_category_table(pd, name, curve) for name, curve in (pd.get("features") or {}).items()
               if curve.get("categories") and _floats(curve.get("mean")).size]
    reading = ""
    if curves:
        ranges = {}
        for c in curves:  # a feature's reach: its largest range over the predicted columns
            ranges[c[0]] = max(ranges.get(c[0], 0.0), c[4])
        top = max(ranges, key=ranges.get)
        reading = (f"Changing {top} alone moves the predicted {what} the most "
                   f"(by up to {fmt(ranges[top])} on average)")
        low = min(ranges, key=ranges.get)
        if len(ranges) > 1 and low != top:
            reading += f"; changing {low} moves it the least (by {fmt(ranges[low])})"
        reading += "."
    return _section("partial-dependence", f"Partial dependence of the predicted {what}", reading,
                    PDP_ROWS_LINE, tables, png, wide_plot=True)


# ------------------------------------------------------------------ qini

def qini_section(report, png=None):
    """Qini coefficient and AUUC; a sentence on whether targeting beats random on these rows."""
    q = report["qini"]
    coef = q.get("qini_coefficient")
    table = _table(["measure", "value"], [["Qini coefficient", coef], ["AUUC", q.get("auuc")],
                                          ["rows", q.get("n_rows")]])
    if _is_missing(coef):
        reading = "The Qini coefficient could not be computed on these rows."
    elif coef > 0:
        reading = (f"Treating the rows with the largest predicted effect first gains more than treating "
                   f"rows at random (Qini coefficient {fmt(coef)}, above 0).")
    else:
        reading = (f"Treating the rows with the largest predicted effect first does not gain more than "
                   f"treating rows at random (Qini coefficient {fmt(coef)}, not above 0).")
    return _section("qini", "Qini curve", reading, ranked_rows_line(report, q.get("n_rows")), [table], png)


# ------------------------------------------------------------------ causal analysis

def _contrast_names(report, n):
    """Names of ``n`` effect contrasts: the analysis's own ``contrasts``, its tables', else the predicted columns."""
    if n <= 1:
        return [None] * n
    analysis = report.get("analysis") or {}
    tables = [analysis, analysis.get("calibration"), analysis.get("best_linear_projection")] + \
        list((analysis.get("rate") or {}).values())
    for tab in tables:
        names = (tab or {}).get("contrasts")
        if names and len(names) == n:
            return [str(c) for c in names]
    labels = list(((report.get("predictions") or {}).get("columns") or {}))
    if len(labels) == n:
        return [str(c) for c in labels]
    return [f"contrast {i + 1}" for i in range(n)]


def _interval_verdict(lo, hi):
    """``"above"``, ``"below"`` or ``"covers"`` (zero), ``None`` when an end is missing."""
    if _is_missing(lo) or _is_missing(hi):
        return None
    return "above" if lo > 0 else "below" if hi < 0 else "covers"


def average_effects_section(report):
    """Doubly robust average effects with 95% intervals; a sentence on the all-rows effect."""
    effects = report["analysis"]["average_effects"]
    n = max((len(_floats(v.get("estimate")).ravel()) for v in effects.values()), default=0)
    contrasts = _contrast_names(report, n)
    rows, clauses = [], []
    for target, v in effects.items():
        est, se, lo, hi = (_floats(v.get(k)).ravel() for k in ("estimate", "stderr", "conf_low", "conf_high"))
        for j in range(est.size):
            name = _AVERAGE_TARGETS.get(target, str(target))
            rows.append([name] + ([contrasts[j]] if n > 1 else []) + [est[j], se[j], lo[j], hi[j]])
    head = "all" if "all" in effects else next(iter(effects), None)
    if head is not None:
        v = effects[head]
        est, lo, hi = (_floats(v.get(k)).ravel() for k in ("estimate", "conf_low", "conf_high"))
        who = "" if head == "all" else f" on {_AVERAGE_TARGETS.get(head, head)}"
        for j in range(est.size):
            verdict = {"above": "clearly above zero", "below": "clearly below zero",
                       "covers": "the interval covers zero", None: "no interval available"}[
                _interval_verdict(lo[j], hi[j])]
            prefix = f"for {contrasts[j]}: " if n > 1 else ""
            clauses.append(f"{prefix}the average effect{who} is {fmt(est[j])} "
                           f"(95% CI {fmt(lo[j])} to {fmt(hi[j])}): {verdict}")
    reading = _sentences(clauses)
    header = ["rows"] + (["contrast"] if n > 1 else []) + ["estimate", "std. error", "95% CI low", "95% CI high"]
    table = _table(header, rows, numeric_from=2 if n > 1 else 1)
    return _section("average-effects", "Average treatment effects", reading, rows_line(report, _data_rows(report)),
                    [table])


def _sentences(clauses):
    """Each clause as a sentence: first letter capitalised, full stop (one per contrast)."""
    return [c[0].upper() + c[1:] + "." for c in clauses if c]


def _estimate_rows(tab):
    """``(contrast or None, term, estimate, stderr, pvalue, low, high)`` of an ``EstimateTable.to_dict()``."""
    terms = [str(t) for t in tab.get("terms") or []]
    k = len(terms)
    arrays = [_floats(tab.get(key)).reshape(-1, k) if k else np.zeros((0, 0))
              for key in ("estimate", "stderr", "pvalue", "conf_low", "conf_high")]
    n_contrasts = arrays[0].shape[0]
    names = tab.get("contrasts") or [None] * n_contrasts
    rows = []
    for c in range(n_contrasts):
        for j, term in enumerate(terms):
            rows.append((None if names[c] is None else str(names[c]), term)
                        + tuple(float(a[c, j]) for a in arrays))
    return rows


def _by_contrast(tab):
    """``{contrast: {term: (estimate, stderr, pvalue, low, high)}}`` of an ``EstimateTable.to_dict()``, in order."""
    out = {}
    for contrast, term, *values in _estimate_rows(tab):
        out.setdefault(contrast, {})[term] = tuple(values)
    return out


def _estimate_table(tab, p_label="p-value"):
    rows = _estimate_rows(tab)
    several = any(r[0] is not None for r in rows)
    header = (["contrast"] if several else []) + ["term", "estimate", "std. error", p_label, "95% CI low",
                                                  "95% CI high"]
    body = [([r[0]] if several else []) + [r[1], r[2], r[3], PValue(r[4]), r[5], r[6]] for r in rows]
    return _table(header, body, numeric_from=2 if several else 1, caption=tab.get("note") or None)


def calibration_reading(tab):
    """Read grf's calibration test: heterogeneity, then the average's calibration.

    Returns
    -------
    list of str
        One sentence per effect contrast.
    """
    clauses = []
    for contrast, terms in _by_contrast(tab).items():
        prefix = f"for {contrast}: " if contrast is not None else ""
        parts = []
        if "differential.forest.prediction" in terms:
            est, _, p, _, _ = terms["differential.forest.prediction"]
            numbers = f"(differential forest prediction {fmt(est)}, p {fmt_p(p)})"
            if _is_missing(p):
                parts.append(f"the heterogeneity test could not be computed {numbers}")
            elif p <= ALPHA:
                parts.append(f"evidence that the forest captures heterogeneity {numbers}")
            else:
                parts.append(f"no evidence of heterogeneity beyond the average effect {numbers}")
        if "mean.forest.prediction" in terms:
            est, _, _, lo, hi = terms["mean.forest.prediction"]
            numbers = f"mean forest prediction {fmt(est)}, 95% CI {fmt(lo)} to {fmt(hi)}"
            if _is_missing(lo) or _is_missing(hi):
                parts.append(f"the average effect's calibration is unknown ({numbers})")
            elif lo <= 0.0 <= 1.0 <= hi:
                # an interval that holds 0 as well as 1 cannot tell good calibration from none
                parts.append(f"too uncertain to tell whether the average effect is well calibrated "
                             f"({numbers}, covers both 0 and 1)")
            elif lo <= 1.0 <= hi:
                parts.append(f"the average effect is well calibrated ({numbers}, covers 1)")
            elif abs(est - 1.0) <= CALIBRATION_TOLERANCE:
                parts.append(f"the average effect is well calibrated ({numbers}, near 1)")
            elif lo > 1.0:
                parts.append(f"the forest understates the average effect ({numbers}, above 1)")
            else:
                parts.append(f"the forest overstates the average effect ({numbers}, below 1)")
        if parts:
            clauses.append(prefix + ", and ".join(parts))
    return _sentences(clauses)


def calibration_section(report):
    """grf's calibration test; a sentence on heterogeneity and the average's calibration."""
    tab = report["analysis"]["calibration"]
    p_label = "p (one-sided)" if tab.get("alternative") == "greater" else "p-value"
    return _section("calibration", "Calibration test", calibration_reading(tab),
                    rows_line(report, _data_rows(report)), [_estimate_table(tab, p_label)])


def blp_reading(tab):
    """Which covariates have a coefficient whose 95% interval excludes zero, and in which direction.

    Returns
    -------
    list of str
        One sentence per effect contrast.
    """
    by_contrast = {contrast: [(term, _interval_verdict(v[3], v[4])) for term, v in terms.items()
                              if term != "(Intercept)"]
                   for contrast, terms in _by_contrast(tab).items()}
    clauses = []
    for contrast, terms in by_contrast.items():
        prefix = f"for {contrast}: " if contrast is not None else ""
        rises = [t for t, v in terms if v == "above"]
        falls = [t for t, v in terms if v == "below"]
        unclear = [t for t, v in terms if v not in ("above", "below")]
        if not rises and not falls:
            clauses.append(f"{prefix}no covariate has a coefficient whose 95% interval excludes zero "
                           f"({_join(unclear)}): none clearly shifts the effect")
            continue
        moves = []
        if rises:
            moves.append(f"rises with {_join(rises)}")
        if falls:
            moves.append(f"falls with {_join(falls)}")
        clause = f"{prefix}the effect clearly {' and '.join(moves)} (95% intervals exclude zero)"
        if unclear:
            clause += f", with no clear link to {_join(unclear)}"
        clauses.append(clause)
    return _sentences(clauses)


def blp_section(report):
    """Best linear projection of the effect on the top features."""
    tab = report["analysis"]["best_linear_projection"]
    return _section("best-linear-projection", "Best linear projection of the effect", blp_reading(tab),
                    rows_line(report, _data_rows(report)), [_estimate_table(tab)])


def rate_reading(rates):
    """Whether targeting by the predicted effect beats treating at random, per RATE measure's 95% CI.

    Returns
    -------
    list of str
        One sentence per effect contrast.
    """
    by_contrast = {}
    for target, tab in rates.items():
        for contrast, term, est, _, _, lo, hi in _estimate_rows(tab):
            by_contrast.setdefault(contrast, []).append((str(target), est, lo, hi, _interval_verdict(lo, hi)))
    clauses = []
    for contrast, entries in by_contrast.items():
        prefix = f"for {contrast}: " if contrast is not None else ""
        numbers = "; ".join(f"{t} {fmt(e)}, 95% CI {fmt(lo)} to {fmt(hi)}" for t, e, lo, hi, _ in entries)
        verdicts = {v for *_, v in entries}
        if verdicts == {"above"}:
            clauses.append(f"{prefix}targeting by the predicted effect beats treating at random ({numbers})")
        elif verdicts == {"below"}:
            clauses.append(f"{prefix}targeting by the predicted effect does worse than treating at random "
                           f"({numbers})")
        elif verdicts <= {"covers", None} and "covers" in verdicts:
            clauses.append(f"{prefix}targeting by the predicted effect does not beat treating at random: "
                           f"the interval covers 0 ({numbers})")
        elif verdicts == {None}:
            clauses.append(f"{prefix}the RATE intervals could not be computed ({numbers})")
        else:
            clauses.append(f"{prefix}the RATE measures disagree on whether targeting by the predicted effect "
                           f"beats treating at random ({numbers})")
    return _sentences(clauses)


def rate_section(report, png=None):
    """RATE (AUTOC, QINI) with 95% intervals; the TOC figure."""
    rates = report["analysis"]["rate"]
    rows = []
    for target, tab in rates.items():
        for contrast, term, est, se, p, lo, hi in _estimate_rows(tab):
            rows.append((contrast, str(target), est, se, lo, hi))
    several = any(r[0] is not None for r in rows)
    header = (["contrast"] if several else []) + ["measure", "estimate", "std. error", "95% CI low", "95% CI high"]
    body = [([r[0]] if several else []) + list(r[1:]) for r in rows]
    notes = {tab.get("note") for tab in rates.values() if tab.get("note")}
    table = _table(header, body, numeric_from=2 if several else 1, caption="; ".join(sorted(notes)) or None)
    return _section("rate", "Targeting: rank-weighted average treatment effect (RATE)", rate_reading(rates),
                    ranked_rows_line(report, _data_rows(report)), [table], png)


def unavailable_section(report):
    """Parts of the causal analysis that could not be computed on these data, with the reasons."""
    reasons = report["analysis"]["unavailable"]
    table = _table(["part", "reason"], [[str(k), str(v)] for k, v in reasons.items()], numeric_from=2)
    reading = f"{len(reasons)} part{'s' if len(reasons) != 1 else ''} of the analysis could not be computed " \
              "on these data; the table gives the reasons."
    return _section("unavailable", "Not available on these data", reading, "", [table])


def sensitivity_section(report):
    """The average effect's bounds under hidden confounding and its robustness value."""
    part = report["analysis"]["sensitivity"]
    rows = []
    for b in part["bounds"]:
        for j in range(len(b["estimate"])):
            rows.append([f"c = {b['c_y']:g}", b["lower"][j], b["upper"][j], b["ci_lower"][j], b["ci_upper"][j]])
    table = _table(["confounder strength", "bound low", "bound high", "95% CI low", "95% CI high"], rows,
                   caption="a hidden confounder explaining a share c of the outcome's and of the treatment's "
                           "residual variation (rho = 1)")
    rv = part["robustness_value"][0]
    reading = (f"A hidden confounder as strong as c = {fmt(rv)} on both the outcome and the treatment could bring "
               f"the average effect's 95% interval to 0; weaker ones cannot." if rv > 0 else
               "The average effect's interval already holds 0: no confounding is needed to explain it away.")
    return _section("sensitivity", "Robustness to hidden confounding", reading, rows_line(report, _data_rows(report)),
                    [table])


def summary_tree_section(report):
    """The shallow honest summary tree of the effect, as indented text."""
    part = report["analysis"]["summary_tree"]
    leaves = part["leaves"]
    lo = min(leaves, key=lambda x: x["effect"])
    hi = max(leaves, key=lambda x: x["effect"])
    reading = (f"{len(leaves)} groups from a depth-{part['max_depth']} tree grown on half of the rows; the effects, "
               f"estimated on the other half, range from {fmt(lo['effect'])} (se {fmt(lo['stderr'])}) to "
               f"{fmt(hi['effect'])} (se {fmt(hi['stderr'])}).")
    return _section("summary-tree", "Summary tree of the effect", reading, rows_line(report, _data_rows(report)),
                    [f"<pre>{_esc(part['text'])}</pre>"])


def survival_arms_section(report, png=None):
    """A causal survival forest's arms: observed Kaplan-Meier target per arm and the unadjusted difference."""
    part = report["survival_arms"]
    what = "restricted mean survival time" if part["target"] == "RMST" else "survival probability"
    rows = [[label, part[label]["n"], part[label]["value"]] for label in ("control", "treated")]
    rows.append(["difference (unadjusted)", "", part["difference"]])
    table = _table(["arm", "rows", f"observed {what}"], rows,
                   caption=f"Kaplan-Meier up to the horizon {fmt(part['horizon'])}")
    reading = (f"The arms' observed {what} differ by {fmt(part['difference'])}; the forest's doubly robust average "
               f"effect (below) adjusts it for the features and for censoring.")
    return _section("survival-arms", f"Observed {what} by arm", reading, rows_line(report), [table], png)


# ------------------------------------------------------------------ survival

def survival_section(report, png=None):
    """Predicted (and observed) survival per risk group at a few times; concordance."""
    from forest.report.survival import text_times

    part = report["survival"]
    times = part["times"]
    idx = text_times(times)
    observed = bool(part["groups"]) and "observed" in part["groups"][0]
    header = ["risk group", "rows"] + [f"t = {fmt(times[i])}" for i in idx]
    rows = []
    for g in part["groups"]:
        cells = [f"{g['predicted'][i]:.3f}" + (f" / {g['observed'][i]:.3f}" if observed else "") for i in idx]
        rows.append([g["label"], g["n"]] + cells)
    caption = "P(T > t): predicted" + (" / observed Kaplan-Meier of the group's rows" if observed else "")
    table = _table(header, rows, numeric_from=1, caption=caption)
    c = part.get("concordance")
    reading = (f"Rows with a higher predicted risk fail sooner: Harrell's concordance {fmt(c)} (0.5 would be no "
               f"better than chance; 1 a perfect ordering)." if c is not None and c > 0.5 else
               f"The risk score does not order these rows' failures better than chance (concordance {fmt(c)})."
               if c is not None else "Predicted survival curves by predicted risk (the data hold no observed "
                                     "times to compare with).")
    if observed:
        reading += " Solid lines are predicted, dashed lines the groups' observed curves: close lines mean " \
                   "calibrated predictions."
    return _section("survival", "Survival by predicted risk", reading, rows_line(report, part.get("n_rows")),
                    [table], png)


# ------------------------------------------------------------------ page

#: Sections of ``report["analysis"]``: key, builder, figure key.
_ANALYSIS = (("average_effects", average_effects_section, None), ("calibration", calibration_section, None),
             ("sensitivity", sensitivity_section, None), ("best_linear_projection", blp_section, None),
             ("summary_tree", summary_tree_section, None), ("rate", rate_section, "toc"),
             ("unavailable", unavailable_section, None))

_TOP = (("importance", importance_section, "importance"), ("predictions", predictions_section, "distribution"),
        ("partial_dependence", pdp_section, "pdp"), ("survival", survival_section, "survival"),
        ("survival_arms", survival_arms_section, "survival_arms"), ("qini", qini_section, "qini"))

_NAV = {"overview": "Overview", "importance": "Importance", "predictions": "Predictions",
        "partial-dependence": "Partial dependence", "survival": "Survival", "qini": "Qini", "average-effects": "Average effects",
        "calibration": "Calibration", "best-linear-projection": "Linear projection", "rate": "RATE",
        "unavailable": "Not available", "text-form": "Text form", "sensitivity": "Robustness",
        "summary-tree": "Summary tree", "survival-arms": "Survival by arm"}


def report_page(report, figures, title, text=None):
    """A self-contained HTML page of a ``forest-report`` report: one section per analysis.

    Parameters
    ----------
    report : dict
        First element of :func:`forest.cli.report.build_report`'s result (or its
        :func:`forest.report.summary.to_json` copy). A section appears only when its key is
        present: ``importance``, ``predictions``, ``partial_dependence``, ``qini`` and,
        under ``analysis``, ``average_effects``, ``calibration``,
        ``best_linear_projection``, ``rate`` and ``unavailable``. ``rows`` (``source``,
        ``sentence``) says which rows the figures use; absent, it counts as ``"none"``.
    figures : dict of str -> str
        base64 PNG images by key (``importance``, ``distribution``, ``pdp``, ``qini``,
        ``toc``); each is shown beside its section's table, a missing one is skipped.
    title : str
        Page title and top heading.
    text : str, optional
        The text form of the report, appended in a collapsed ``<details>`` block.

    Returns
    -------
    str
        The page: inline CSS, embedded images, no external resources.
    """
    figures = figures or {}
    sections = [overview_section(report)]
    for key, build, figure in _TOP:
        if key in report and report[key] is not None:
            sections.append(build(report, figures.get(figure)))
    analysis = report.get("analysis") or {}
    for key, build, figure in _ANALYSIS:
        if analysis.get(key):  # an empty part (no effect or RATE could be computed) has nothing to show
            sections.append(build(report, figures.get(figure)) if figure else build(report))
    if text:
        sections.append('<section id="text-form"><details><summary>Text form</summary>'
                        f"<pre>{_esc(text)}</pre></details></section>")
    anchors = re.findall(r'<section id="([^"]+)"', "\n".join(sections))
    nav = "<nav>" + "".join(f'<a href="#{a}">{_esc(_NAV.get(a, a))}</a>' for a in anchors) + "</nav>"
    return "\n".join(["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
                      '<meta name="viewport" content="width=device-width, initial-scale=1">',
                      f"<title>{_esc(title)}</title>", f"<style>{_CSS}</style>", "</head><body>",
                      f"<h1>{_esc(title)}</h1>", nav] + sections + ["</body></html>"])

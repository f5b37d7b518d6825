"""Model reports: feature-importance tables, effect summaries, Qini curves, HTML pages.

This module owns what ``forest-report`` shows about a fitted model:

* :func:`model_trees` collects the estimator's own trees, and :func:`importances`
  gives three importance measures (computed by :mod:`forest.engine.importance`, the one
  home of importances): GRF's depth-weighted split frequency (``variable_importance`` with decay
  exponent 2 and maximum depth 4: at each depth ``k = 1..4`` (root ``k = 1``) the
  share of that depth's splits made on each feature, averaged with weights
  ``k**-2``), the share of total split gain, and raw split counts;
* :func:`primary_importance` names the measure a model's own ``feature_importances_``
  gives (GRF's for the forests, gain for boosting), which the report sorts by;
* :func:`summarised_quantity` says what the report summarises about a model's
  predictions: effects ``tau(x)`` for a causal forest, class probabilities for a
  classifier, predictions for a regressor;
* :func:`qini_curve` scores a ranking of rows by predicted effect against observed
  treatment and outcome (binary treatment);
* :func:`partial_dependence` averages predictions over a sample with one feature set
  to grid values; :func:`pdp_figure` draws all features on one y-axis scale, so a
  flat curve (a feature without effect) looks flat next to a real one;
* categorical features (:mod:`histogram.categories`): :func:`feature_labels` names them
  as such, :func:`category_values` turns their codes back into category values a model
  takes, :func:`categorical_grid` picks the categories partial dependence shows as
  bars (:func:`text_bars`, :func:`pdp_axes`), and :func:`split_condition` reads a
  category-set split as ``race in {white, black}``;
* :func:`text_table`, :func:`to_json` and :func:`html_page` render a report; the
  HTML embeds its matplotlib figures as base64 PNG, so it is one self-contained
  file that needs no network.
"""
import base64
import html
import io

import numpy as np

from forest.engine import importance
from forest.engine.tree import Tree
from forest.estimators.base import predicts_effects

#: GRF's defaults for the depth-weighted split frequency.
GRF_DECAY_EXPONENT = 2.0
GRF_MAX_DEPTH = 4


# ------------------------------------------------------------------ collecting splits

def _trees_in(value):
    """Trees held directly by an attribute value (list/tuple/dict nesting, packed dicts)."""
    if isinstance(value, Tree):
        return [value]
    if isinstance(value, dict) and "tree_offsets" in value and "feature" in value:
        from forest.engine.tree import unpack_trees

        return unpack_trees(value)
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _trees_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _trees_in(v)]
    return []


def model_trees(estimator):
    """The estimator's own trees, each once.

    Only public fitted attributes count (``trees_``, ``estimators_``): private ones are
    caches of them (gradient boosting keeps ``_packed``, a packed copy of ``trees_``,
    which would count every tree twice), and models held as attributes (nuisance
    models) are not the estimator's trees.

    Parameters
    ----------
    estimator : object
        A fitted histforest estimator.

    Returns
    -------
    list of forest.engine.tree.Tree
    """
    trees = []
    for name, value in vars(estimator).items():
        if name.endswith("_") and not name.startswith("_"):
            trees.extend(_trees_in(value))
    return trees


#: Column names of :func:`importances` and how the report titles them.
IMPORTANCE_TITLES = {"depth_weighted": "GRF depth-weighted split frequency", "gain": "share of split gain",
                     "splits": "split count"}


def primary_importance(estimator):
    """The importance a model itself reports as ``feature_importances_``, which the report sorts by.

    Returns
    -------
    str
        ``"gain"`` for gradient boosting (split gain is what boosting's trees
        optimise), ``"depth_weighted"`` (GRF's measure) for the honest forests.
    """
    from forest.estimators.gbdt import _BaseGBDT

    return "gain" if isinstance(estimator, _BaseGBDT) else "depth_weighted"


def column_names(estimator, prefix, trailing_shape):
    """Names of the columns of predictions with ``trailing_shape`` after the row axis.

    One name per entry, in C order (that of ``values.reshape(n, -1)``): ``prefix`` and
    a suffix per axis longer than one. A quantile forest's axis is named by the level
    (``prediction_q0.9``). The first axis of a categorical treatment's
    effects is named by the arm's level (``tau_2``: arm 2 minus the control, as
    ``classes_`` lists it), any other axis by position from 0 (treatment components,
    outcomes): ``tau_2_0`` is arm 2's effect on the first outcome.

    Parameters
    ----------
    estimator : fitted histforest estimator
    prefix : str
        E.g. ``"tau"``, ``"tau_lower"``, ``"prediction"``.
    trailing_shape : tuple of int

    Returns
    -------
    list of str
    """
    arms = None
    if getattr(estimator, "treatment_type_", None) == "categorical" and predicts_effects(estimator):
        arms = [str(c) for c in np.asarray(estimator.classes_)[1:]]
    elif hasattr(estimator, "leaf_outcomes_") and hasattr(estimator, "quantiles"):
        # a quantile forest's columns are its quantile levels: prediction_q0.1, ...
        arms = [f"q{level:g}" for level in np.asarray(estimator.quantiles, dtype=np.float64).reshape(-1)]
    names = []
    for index in np.ndindex(tuple(trailing_shape)):
        parts = [arms[i] if axis == 0 and arms is not None and size == len(arms) else str(i)
                 for axis, (i, size) in enumerate(zip(index, trailing_shape)) if size > 1]
        names.append(prefix + "".join(f"_{p}" for p in parts))
    return names


def summarised_quantity(estimator, out_of_bag=None):
    """What a report summarises about a model's predictions.

    Parameters
    ----------
    estimator : fitted histforest estimator
    out_of_bag : callable, optional
        ``out_of_bag(X)``: the forest's out-of-bag form of what is summarised (shape of
        ``predict``, or of ``predict_proba`` for a classifier), used instead of it when
        the rows are the training rows.

    Returns
    -------
    what : str
        ``"effect tau(x)"`` (causal forest), ``"probability"`` (classifier), ``"risk
        score"`` (survival forest) or ``"value"`` (regressor), as in "the predicted ...".
    predict : callable
        ``predict(X)`` -> (labels, ndarray of shape (n, len(labels))): effects (one
        column per effect component), class probabilities (of the second class only
        when there are two; one column per class otherwise) or predictions.
    """
    if predicts_effects(estimator):
        def effects(X):
            tau = np.asarray((out_of_bag or estimator.predict)(X), dtype=np.float64)
            width = int(np.prod(tau.shape[1:], dtype=np.int64))
            return column_names(estimator, "tau", tau.shape[1:]), tau.reshape(tau.shape[0], width)
        return "effect tau(x)", effects
    if hasattr(estimator, "predict_proba") and hasattr(estimator, "classes_"):
        def probabilities(X):
            proba = np.asarray((out_of_bag or estimator.predict_proba)(X), dtype=np.float64)
            classes = [str(c) for c in estimator.classes_]
            if len(classes) == 2:
                return [f"P({classes[1]})"], proba[:, 1:]
            return [f"P({c})" for c in classes], proba
        return "probability", probabilities

    if hasattr(estimator, "predict_survival_function"):
        def risks(X):
            risk = np.asarray((out_of_bag or estimator.predict)(X), dtype=np.float64)
            return ["risk"], risk.reshape(len(risk), 1)
        return "risk score", risks

    def predictions(X):
        pred = np.asarray((out_of_bag or estimator.predict)(X), dtype=np.float64)
        width = int(np.prod(pred.shape[1:], dtype=np.int64))
        return column_names(estimator, "prediction", pred.shape[1:]), pred.reshape(pred.shape[0], width)
    return "value", predictions


def distribution(values):
    """Mean, sd and quantiles of one column of predictions (JSON-able floats)."""
    q = np.quantile(values, [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0])
    return {"mean": float(np.mean(values)), "std": float(np.std(values)),
            "quantiles": dict(zip(["min", "p10", "p25", "p50", "p75", "p90", "max"], q.tolist()))}


def importances(trees, n_features, decay_exponent=GRF_DECAY_EXPONENT, max_depth=GRF_MAX_DEPTH):
    """The three importance measures the report shows, from :mod:`forest.engine.importance`.

    The estimators' ``feature_importances_`` come from the same functions, so the
    report and the fitted attribute always agree.

    Parameters
    ----------
    trees : sequence of forest.engine.tree.Tree
    n_features : int
    decay_exponent, max_depth : float, int
        GRF's parameters of the depth-weighted measure.

    Returns
    -------
    dict of str -> ndarray, shape (n_features,)
        ``depth_weighted`` (GRF's ``variable_importance``), ``gain`` (share of the
        summed positive gain), ``splits`` (counts, int64).
    """
    return {"depth_weighted": importance.depth_weighted_importance(trees, n_features, max_depth, decay_exponent),
            "gain": importance.gain_importance(trees, n_features, normalize=True),
            "splits": importance.split_counts(trees, n_features)}


# ------------------------------------------------------------------ effect diagnostics

def qini_curve(tau_hat, t, y):
    """Qini and cumulative-gain curves of targeting rows by decreasing predicted effect.

    For the top ``k`` rows: ``n_t, n_c`` treated/control counts and ``Y_t, Y_c`` their
    outcome sums. Qini ``q(k) = Y_t - Y_c n_t / n_c`` (``0`` while ``n_c = 0``);
    cumulative gain ``g(k) = (Y_t / n_t - Y_c / n_c) k`` (``0`` while an arm is empty).
    Both are divided by ``N``. The Qini coefficient is the mean gap between the Qini
    curve and the straight line from ``(0, 0)`` to ``(N, q(N))`` (random targeting);
    AUUC is the mean of the cumulative-gain curve. Ties in ``tau_hat`` keep input
    order (stable sort), so the curve is deterministic.

    Parameters
    ----------
    tau_hat : ndarray, shape (n,)
    t : ndarray, shape (n,)
        Binary treatment (0/1).
    y : ndarray, shape (n,)

    Returns
    -------
    dict
        ``fraction`` (n + 1,), ``qini`` (n + 1,), ``gain`` (n + 1,), ``random``
        (n + 1,), ``qini_coefficient`` (float), ``auuc`` (float).
    """
    tau_hat, t, y = (np.asarray(a, dtype=np.float64) for a in (tau_hat, t, y))
    n = tau_hat.size
    order = np.argsort(-tau_hat, kind="stable")
    tt, yy = t[order], y[order]
    n_t = np.concatenate([[0.0], np.cumsum(tt)])
    n_c = np.concatenate([[0.0], np.cumsum(1.0 - tt)])
    y_t = np.concatenate([[0.0], np.cumsum(yy * tt)])
    y_c = np.concatenate([[0.0], np.cumsum(yy * (1.0 - tt))])
    k = np.arange(n + 1, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        qini = np.where(n_c > 0, y_t - y_c * n_t / n_c, 0.0) / n
        gain = np.where((n_t > 0) & (n_c > 0), (y_t / n_t - y_c / n_c) * k, 0.0) / n
    random = qini[-1] * k / n
    return {"fraction": k / n, "qini": qini, "gain": gain, "random": random,
            "qini_coefficient": float(np.mean(qini - random)), "auuc": float(np.mean(gain))}


def partial_dependence(predict, X, feature, grid_size=20, max_rows=500, seed=0, grid=None):
    """Average prediction with ``X[:, feature]`` set to each grid value.

    Parameters
    ----------
    predict : callable
        ``predict(X) -> (n,)`` or ``(n, k)``.
    X : ndarray, shape (n, n_features)
    feature : int
    grid_size : int
        Grid of quantiles of the feature's non-missing values.
    max_rows : int
        Rows averaged over (a fixed random subset when ``n`` is larger).
    grid : array-like, optional
        The values to set instead of quantiles (a categorical feature's codes,
        :func:`categorical_grid`).

    Returns
    -------
    grid : ndarray, shape (m,)
        Distinct grid values, ``m <= grid_size``.
    mean : ndarray, shape (m,) or (m, k)
        Like one row of ``predict``'s output per grid value.
    """
    X = np.asarray(X, dtype=np.float64)
    rng = np.random.default_rng(seed)
    rows = X if X.shape[0] <= max_rows else X[np.sort(rng.choice(X.shape[0], max_rows, replace=False))]
    if grid is None:
        values = X[:, feature]
        values = values[np.isfinite(values)]
        if values.size == 0:
            return np.zeros(0), np.zeros(0)
        grid = np.unique(np.quantile(values, np.linspace(0.0, 1.0, grid_size)))
    grid = np.asarray(grid, dtype=np.float64)
    if grid.size == 0:
        return np.zeros(0), np.zeros(0)
    stacked = np.repeat(rows[None], grid.size, axis=0)  # (m, rows, features)
    stacked[:, :, feature] = grid[:, None]
    pred = np.asarray(predict(stacked.reshape(-1, X.shape[1])), dtype=np.float64)
    return grid, pred.reshape((grid.size, rows.shape[0]) + pred.shape[1:]).mean(axis=1)


# ------------------------------------------------------------------ categorical features

#: Most categories partial dependence shows (the most frequent in the data).
PDP_MAX_CATEGORIES = 20


def categorical_positions(coder):
    """``{feature index: position in the coder's columns}`` (empty without a coder)."""
    return {} if coder is None else {int(f): j for j, f in enumerate(coder.columns_)}


def feature_labels(names, coder):
    """Feature names for tables, categorical ones named as such: ``race (categorical, 5 levels)``.

    Parameters
    ----------
    names : list of str
    coder : histogram.categories.CategoryCoder or None
        The model's ``category_coder_``; levels are the categories seen in training.

    Returns
    -------
    list of str
    """
    where = categorical_positions(coder)
    return [f"{n} (categorical, {len(coder.categories_[where[f]])} levels)" if f in where else str(n)
            for f, n in enumerate(names)]


def category_values(coder, j, codes):
    """Category values (a pyarrow array) that ``coder`` codes as ``codes``; NaN -> null.

    A folded code (rare categories sharing one) becomes one of its categories, which the
    coder maps back to the same code: a model sees the same rows.

    Parameters
    ----------
    coder : histogram.categories.CategoryCoder
    j : int
        Position of the feature among the coder's columns.
    codes : ndarray of float64, shape (n,)
    """
    import pyarrow as pa

    cats = coder.categories_[j]
    kind = pa.string() if coder.kinds_[j] == "str" else pa.float64()
    codes = np.asarray(codes, dtype=np.float64)
    present = np.isfinite(codes)
    if not len(cats) or not present.any():
        return pa.nulls(len(codes), kind)
    _, first = np.unique(coder.codes_[j], return_index=True)      # one category per code
    values = cats[first][codes[present].astype(np.int64)]
    out = np.full(len(codes), None, dtype=object)
    out[present] = values.tolist()
    return pa.array(out, type=kind)


def categorical_grid(codes, limit=PDP_MAX_CATEGORIES):
    """The codes partial dependence shows: those in the data, at most the ``limit`` most frequent, in code order."""
    codes = np.asarray(codes, dtype=np.float64)
    codes = codes[np.isfinite(codes)]
    values, counts = np.unique(codes, return_counts=True)
    if len(values) > limit:
        values = np.sort(values[np.argsort(-counts, kind="stable")[:limit]])
    return values


def text_bars(labels, values, width=30):
    """One text bar per category: ``label  value  ####`` (negative values ``====``), longest ``width``.

    Returns
    -------
    list of str
    """
    values = np.asarray(values, dtype=np.float64)
    top = float(np.nanmax(np.abs(values))) if values.size else 0.0
    pad = max([len(str(c)) for c in labels] + [1])
    lines = []
    for label, v in zip(labels, values):
        n = int(round(width * abs(v) / top)) if top > 0 and np.isfinite(v) else 0
        lines.append(f"{str(label):<{pad}}  {v:>10.4g}  {('#' if v >= 0 else '=') * n}")
    return lines


def split_condition(tree, node, names, coder=None, decimals=3):
    """The condition that sends rows of ``node`` left: ``x <= 0.5``, ``race in {white, black}``.

    Parameters
    ----------
    tree : forest.engine.tree.Tree
    node : int
    names : list of str
    coder : histogram.categories.CategoryCoder, optional
        Names a categorical split's categories (else their codes).
    """
    from forest.engine.tree import CATEGORICAL_SPLIT, bitset_bins

    f = int(tree.feature[node])
    name = names[f]
    if int(tree.bin_threshold[node]) == CATEGORICAL_SPLIT:
        bins = bitset_bins(tree.cat_bits[node])
        where = categorical_positions(coder)
        labels = coder.category_names(where[f]) if f in where else None
        members = [labels[b] if labels is not None and b < len(labels) else str(b) for b in bins]
        return f"{name} in {{{', '.join(members)}}}"
    thr = tree.threshold[node]
    return f"{name} <= {thr:.{decimals}g}" if np.isfinite(thr) else f"{name} not missing"


# ------------------------------------------------------------------ rendering

def importance_order(imp, sort_by="depth_weighted"):
    """Feature indices by decreasing ``imp[sort_by]``, ties by the other measure, then index."""
    other = "gain" if sort_by == "depth_weighted" else "depth_weighted"
    return np.lexsort((np.arange(len(imp[sort_by])), -imp[other], -imp[sort_by]))


def text_table(names, imp, limit=None, sort_by="depth_weighted"):
    """Importance table as text, rows sorted by one measure.

    Parameters
    ----------
    names : list of str, length n_features
        Feature names (:func:`feature_labels` names categorical ones as such).
    imp : dict
        Output of :func:`importances`.
    limit : int, optional
        Show only the first ``limit`` rows.
    sort_by : {"depth_weighted", "gain"}
        See :func:`primary_importance`.

    Returns
    -------
    str
    """
    order = importance_order(imp, sort_by)
    if limit is not None:
        order = order[:limit]
    width = max([len("feature")] + [len(str(n)) for n in names])
    lines = [f"{'rank':>4}  {'feature':<{width}}  {'depth-weighted':>14}  {'gain share':>10}  {'splits':>8}"]
    for r, j in enumerate(order, 1):
        lines.append(f"{r:>4}  {names[j]:<{width}}  {imp['depth_weighted'][j]:>14.4f}  "
                     f"{imp['gain'][j]:>10.4f}  {int(imp['splits'][j]):>8d}")
    return "\n".join(lines)


def to_json(report):
    """A JSON-able copy of a report dict (arrays become lists, floats stay exact)."""
    if isinstance(report, dict):
        return {str(k): to_json(v) for k, v in report.items()}
    if isinstance(report, (list, tuple)):
        return [to_json(v) for v in report]
    if isinstance(report, np.ndarray):
        return to_json(report.tolist())
    if isinstance(report, np.generic):
        return report.item()
    if isinstance(report, float) and not np.isfinite(report):
        return None
    return report


def _figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def importance_figure(names, imp, limit=20, sort_by="depth_weighted"):
    """Horizontal bar charts of the three importance measures; base64 PNG."""
    plt = _pyplot()
    order = importance_order(imp, sort_by)[:limit][::-1]
    labels = [names[j] for j in order]
    fig, axes = plt.subplots(1, 3, figsize=(12, 0.35 * len(order) + 1.5), sharey=True)
    for ax, key in zip(axes, ("depth_weighted", "gain", "splits")):
        title = IMPORTANCE_TITLES[key]
        ax.barh(range(len(order)), np.asarray(imp[key], dtype=float)[order], color="#3b6ea5")
        ax.set_title(title, fontsize=10)
        ax.set_yticks(range(len(order)))
        ax.set_yticklabels(labels)
    return _figure_png(fig)


def distribution_figure(values, labels, what):
    """Histogram of each column of predictions ``values`` (n, k); base64 PNG."""
    plt = _pyplot()
    values = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bins = min(50, max(10, int(np.sqrt(len(values)))))
    for j, label in enumerate(labels):
        col = values[:, j]
        ax.hist(col, bins=bins, histtype="stepfilled" if len(labels) == 1 else "step",
                color="#3b6ea5" if len(labels) == 1 else None, label=f"{label}: mean {np.mean(col):.3g}")
    ax.set_xlabel(f"predicted {what}")
    ax.set_ylabel("rows")
    ax.legend()
    return _figure_png(fig)


def pdp_axes(curves, what, labels=None):
    """The partial-dependence figure, as a matplotlib Figure (see :func:`pdp_figure`).

    A curve ``(name, grid, mean, categories)`` with ``categories`` (labels of the grid's
    codes) is a categorical feature: one bar per category (grouped per column).
    """
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(4 * len(curves), 3.2), squeeze=False, sharey=True)
    for ax, (name, grid, mean, *rest) in zip(axes[0], curves):
        categories = rest[0] if rest else None
        mean = np.asarray(mean, dtype=np.float64).reshape(len(grid), -1)
        for j in range(mean.shape[1]):
            label = labels[j] if labels and mean.shape[1] > 1 else None
            if categories is None:
                ax.plot(grid, mean[:, j], marker="o", ms=3, label=label)
                continue
            step = 0.8 / mean.shape[1]
            ax.bar(np.arange(len(grid)) + j * step - 0.4 + step / 2, mean[:, j], width=step, label=label)
        if categories is not None:
            ax.set_xticks(np.arange(len(grid)))
            ax.set_xticklabels([str(c) for c in categories], rotation=45 if len(grid) > 4 else 0, ha="right"
                               if len(grid) > 4 else "center", fontsize=8)
        ax.set_xlabel(name + (" (categorical)" if categories is not None else ""))
        ax.set_title(f"range {np.ptp(mean) if mean.size else 0.0:.3g}", fontsize=9)
        if mean.shape[1] > 1:
            ax.legend(fontsize=8)
    axes[0][0].set_ylabel(f"mean predicted {what}")
    return fig


def pdp_figure(curves, what="effect tau(x)", labels=None):
    """Partial-dependence curves ``[(name, grid, mean), ...]`` side by side; base64 PNG.

    The panels share one y-axis and each states its range, so a feature without
    effect shows a flat line instead of its noise stretched to the panel's height.
    ``mean`` is (m,) or (m, k) (one line per column, named by ``labels``).
    """
    return _figure_png(pdp_axes(curves, what, labels))


def qini_figure(q):
    """Qini curve against random targeting; base64 PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(q["fraction"], q["qini"], label=f"model (Qini coef. {q['qini_coefficient']:.4g})")
    ax.plot(q["fraction"], q["random"], linestyle="--", color="gray", label="random targeting")
    ax.set_xlabel("fraction of rows targeted (by decreasing predicted effect)")
    ax.set_ylabel("incremental outcome / N")
    ax.legend()
    return _figure_png(fig)


def html_page(title, sections):
    """A self-contained HTML page.

    Parameters
    ----------
    title : str
    sections : list of (str, str, str or None)
        ``(heading, preformatted text or "", base64 PNG or None)``.

    Returns
    -------
    str
    """
    parts = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
             f"<title>{html.escape(title)}</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:2em auto;}"
             "pre{background:#f4f4f4;padding:1em;overflow-x:auto;}img{max-width:100%;}</style>",
             "</head><body>", f"<h1>{html.escape(title)}</h1>"]
    for heading, text, png in sections:
        parts.append(f"<h2>{html.escape(heading)}</h2>")
        if text:
            parts.append(f"<pre>{html.escape(text)}</pre>")
        if png:
            parts.append(f"<img alt=\"{html.escape(heading)}\" src=\"data:image/png;base64,{png}\">")
    parts.append("</body></html>")
    return "\n".join(parts)


# ------------------------------------------------------------------ policy trees

def policy_tree_figure(tree, actions, feature_names, action_names, decimals=3, coder=None):
    """A drawing of a policy tree (splits as boxes, leaves with their action); base64 PNG.

    Parameters
    ----------
    tree : forest.engine.tree.Tree
        ``value[node]`` holds each action's mean reward in the node.
    actions : ndarray of int, shape (node_count,)
    feature_names, action_names : list of str
    coder : histogram.categories.CategoryCoder, optional
        Names the categories of a categorical split (:func:`split_condition`).
    """
    plt = _pyplot()
    leaves = [0]
    x = {}

    def place(node):  # leaves left to right, parents centred over their children
        if tree.feature[node] < 0:
            x[node] = leaves[0]
            leaves[0] += 1
        else:
            place(int(tree.left[node]))
            place(int(tree.right[node]))
            x[node] = (x[int(tree.left[node])] + x[int(tree.right[node])]) / 2.0
    place(0)
    depth = int(tree.depth.max()) if tree.node_count else 0
    fig, ax = plt.subplots(figsize=(max(4.0, 2.4 * leaves[0]), 1.6 * (depth + 1) + 0.6))
    for node in range(tree.node_count):
        y = -float(tree.depth[node])
        if tree.feature[node] >= 0:
            cond = split_condition(tree, node, feature_names, coder, decimals)
            label = f"{cond}\nmissing {'left' if tree.missing_left[node] else 'right'}\n{int(tree.count[node])} rows"
            colour = "#dde6f0"
            for child, tag in ((int(tree.left[node]), "yes"), (int(tree.right[node]), "no")):
                ax.annotate("", xy=(x[child], y - 1 + 0.22), xytext=(x[node], y - 0.22),
                            arrowprops=dict(arrowstyle="->", color="#555555"))
                ax.text((x[node] + x[child]) / 2, y - 0.5, tag, fontsize=8, ha="center", color="#555555")
        else:
            a = int(actions[node])
            label = f"{action_names[a]}\nmean reward {tree.value[node, a]:.{decimals}g}\n{int(tree.count[node])} rows"
            colour = "#f3e3c3"
        ax.text(x[node], y, label, ha="center", va="center", fontsize=8,
                bbox=dict(boxstyle="round", facecolor=colour, edgecolor="#666666"))
    ax.set_xlim(-0.7, leaves[0] - 0.3)
    ax.set_ylim(-depth - 0.5, 0.5)
    ax.axis("off")
    return _figure_png(fig)


def cost_curve_figure(curves):
    """Cost curves ``{name: (spend, gain)}`` with random targeting for the first; base64 PNG."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for i, (name, (spend, gain)) in enumerate(curves.items()):
        ax.plot(spend, gain, label=name, linewidth=2.0 if i == 0 else 1.2)
        if i == 0 and len(spend):
            ax.plot([0, spend[-1]], [0, gain[-1]], linestyle="--", color="gray", label="random order")
    ax.set_xlabel("spend")
    ax.set_ylabel("incremental gain (doubly robust)")
    ax.legend(fontsize=8)
    return _figure_png(fig)

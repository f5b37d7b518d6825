"""The survival part of a report: predicted curves by risk group, the data's own curves, concordance.

Rows are cut into groups of equal size by their predicted risk (the forest's risk score,
out of bag on the training rows). Each group's predicted curve is the mean of its rows'
predicted survival curves; where the data hold the time and event columns, the group's
observed Kaplan-Meier curve sits beside it (calibration: the two should agree) and
Harrell's concordance of the risk with the observed times is reported (discrimination).
"""
import numpy as np

from forest.analysis.causal_survival import restricted_mean
from forest.analysis.survival import concordance_index, kaplan_meier

#: Risk groups of the report (quartiles).
N_GROUPS = 4
#: Times of the text table: these quantiles of the model's failure grid.
TEXT_QUANTILES = (0.25, 0.5, 0.75, 1.0)


def survival_groups(est, X, risk, time=None, event=None, oob=None, n_groups=N_GROUPS):
    """Predicted (and observed) survival curves of risk groups.

    Parameters
    ----------
    est : forest.SurvivalForest
    X : model input, shape (n, n_features)
    risk : ndarray of float64, shape (n,)
        The rows' risk scores (out of bag on training rows).
    time, event : ndarray, shape (n,), optional
        The data's observed times and 0/1 events.
    oob : callable, optional
        ``oob() -> (n, len(est.failure_times_))``: out-of-bag curves (training rows).
    n_groups : int

    Returns
    -------
    dict
        ``times`` (the failure grid), ``groups`` (each: ``label``, ``n``, ``risk_min``,
        ``risk_max``, ``predicted`` and, with observed data, ``observed`` curves at
        ``times``), ``concordance`` (or None).
    """
    times = np.asarray(est.failure_times_, dtype=np.float64)
    curves = oob() if oob is not None else est.predict_survival_function(X, times)
    risk = np.asarray(risk, dtype=np.float64)
    usable = np.isfinite(risk) & np.all(np.isfinite(curves), axis=1)
    rows = np.flatnonzero(usable)
    order = rows[np.argsort(risk[rows], kind="stable")]
    groups = []
    k = min(n_groups, len(order))
    for g in range(k):
        members = order[g * len(order) // k:(g + 1) * len(order) // k]
        label = ("lowest risk" if g == 0 else "highest risk" if g == k - 1 else f"risk group {g + 1}") \
            + f" ({100 * g // k}-{100 * (g + 1) // k}%)"
        group = {"label": label, "n": int(len(members)), "risk_min": float(risk[members].min()),
                 "risk_max": float(risk[members].max()), "predicted": curves[members].mean(axis=0).tolist()}
        if time is not None:
            group["observed"] = kaplan_meier(time[members], event[members], np.ones(len(members)), times)[0].tolist()
            group["events"] = int(np.sum(event[members]))
        groups.append(group)
    concordance = None
    if time is not None and len(rows) and np.any(event[rows] > 0):
        try:
            concordance = float(concordance_index(time[rows], event[rows] > 0, risk[rows]))
        except ValueError:
            concordance = None
    return {"times": times.tolist(), "groups": groups, "concordance": concordance, "n_rows": int(len(rows)),
            "n_dropped": int(len(risk) - len(rows))}


def text_times(times):
    """Indices of the grid times the text table shows."""
    times = np.asarray(times)
    return sorted({int(round(q * (len(times) - 1))) for q in TEXT_QUANTILES})


def survival_text(part, time_col=None, event_col=None, training=False):
    """The text form: a table of predicted (observed) survival per risk group at a few times."""
    times = part["times"]
    idx = text_times(times)
    where = " (out of bag)" if training else ""
    lines = [f"Survival by predicted risk{where}: P(T > t) predicted"
             + (" / observed Kaplan-Meier" if part["groups"] and "observed" in part["groups"][0] else "")
             + " at t = " + ", ".join(f"{times[i]:.4g}" for i in idx) + ":"]
    for g in part["groups"]:
        cells = []
        for i in idx:
            cell = f"{g['predicted'][i]:.3f}"
            if "observed" in g:
                cell += f"/{g['observed'][i]:.3f}"
            cells.append(cell)
        lines.append(f"  {g['label']:<28} n={g['n']:<7} " + "  ".join(cells))
    if part["concordance"] is not None:
        lines.append(f"Harrell's concordance of the risk score with {time_col!r}/{event_col!r}: "
                     f"{part['concordance']:.4f} (0.5 = no discrimination)")
    if part["n_dropped"]:
        lines.append(f"({part['n_dropped']} rows drawn by every tree have no out-of-bag curve and are left out)")
    return "\n".join(lines)


def survival_figure(part):
    """Predicted (solid) and observed (dashed) curves per risk group; base64 PNG."""
    from forest.report.summary import _figure_png, _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    times = np.asarray(part["times"])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, g in enumerate(part["groups"]):
        c = colors[j % len(colors)]
        ax.step(times, g["predicted"], where="post", color=c, label=f"{g['label']} predicted")
        if "observed" in g:
            ax.step(times, g["observed"], where="post", color=c, linestyle="--", alpha=0.8,
                    label=f"{g['label']} observed")
    ax.set_xlabel("time")
    ax.set_ylabel("P(T > t)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7)
    return _figure_png(fig)


def arm_curves(time, event, treatment, horizon, target, n_times=50):
    """The data's Kaplan-Meier curve of each arm and its unadjusted effect at the horizon.

    The causal survival forest's report sets these beside the forest's doubly robust
    effect: the difference of the arms' restricted means (or survival at the horizon) is
    what a randomized trial would report, confounded otherwise.

    Parameters
    ----------
    time, event, treatment : ndarray, shape (n,)
        Observed times, 0/1 events and 0/1 treatment.
    horizon : float
    target : {"RMST", "survival_probability"}
    n_times : int
        Curve points up to the horizon.

    Returns
    -------
    dict
        ``times``, and per arm (``"control"``, ``"treated"``) ``n``, ``curve`` (survival at
        ``times``) and ``value`` (RMST up to the horizon or survival at it), and ``difference``.
    """
    times = np.linspace(0.0, horizon, n_times + 1)[1:]
    out = {"times": times.tolist(), "target": target, "horizon": float(horizon)}
    values = {}
    for arm, label in ((0, "control"), (1, "treated")):
        rows = treatment == arm
        surv, _ = kaplan_meier(time[rows], event[rows], np.ones(int(rows.sum())), times)
        if target == "RMST":
            # the step curve's integral up to the horizon, exact at the distinct times of the arm
            cuts = np.unique(np.concatenate([[0.0], time[rows][time[rows] < horizon]]))
            at, _ = kaplan_meier(time[rows], event[rows], np.ones(int(rows.sum())), cuts)
            value = float(restricted_mean(at[None, :], cuts, horizon)[0])
        else:
            value = float(kaplan_meier(time[rows], event[rows], np.ones(int(rows.sum())), [horizon])[0][0])
        values[label] = value
        out[label] = {"n": int(rows.sum()), "curve": surv.tolist(), "value": value}
    out["difference"] = values["treated"] - values["control"]
    return out


def arm_text(part, effect=None):
    """Text of :func:`arm_curves`, with the forest's average effect ``(estimate, stderr)`` when given."""
    what = (f"restricted mean survival time up to {part['horizon']:.4g}" if part["target"] == "RMST"
            else f"survival probability at {part['horizon']:.4g}")
    lines = [f"Observed {what} by arm (Kaplan-Meier): control {part['control']['value']:.4g} "
             f"(n={part['control']['n']}), treated {part['treated']['value']:.4g} (n={part['treated']['n']}), "
             f"difference {part['difference']:.4g} (unadjusted)"]
    if effect is not None:
        est, se = effect
        lines.append(f"Causal survival forest's average effect on it: {est:.4g} (std. err. {se:.4g}; doubly "
                     f"robust, adjusted for the features and for censoring)")
    return "\n".join(lines)


def arm_figure(part):
    """The arms' observed Kaplan-Meier curves up to the horizon; base64 PNG."""
    from forest.report.summary import _figure_png, _pyplot

    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.8))
    times = np.concatenate([[0.0], part["times"]])
    for label in ("control", "treated"):
        ax.step(times, np.concatenate([[1.0], part[label]["curve"]]), where="post",
                label=f"{label} (n={part[label]['n']})")
    ax.set_xlabel("time")
    ax.set_ylabel("P(T > t), observed")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8)
    return _figure_png(fig)

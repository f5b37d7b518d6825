"""CausalSurvivalForest (issue 33) on designs with a known effect, and on a randomized trial.

Simulated designs (grf's ``generate_survival_data``, written anew from its formulas; X
uniform on [0, 1]^5):

``simple1``   T = Exp(1) x0 + W, C ~ U(0, 2), W ~ Bernoulli(0.5); RMST up to h = 1.
``type1``     accelerated failure time T = exp(-1.85 - 0.8 I + 0.7 sqrt(x1) + 0.2 x2 + (0.7 - 0.4 I -
              0.4 sqrt(x1)) W + N(0, 1)), I = 1[x0 < 0.5], Cox censoring; confounded:
              e(x) = (1 + Beta(2, 4) density at x0) / 4; RMST up to h = 1.5.
``type2``     proportional hazards T = (E / exp(x0 + (x1 - 0.4) W))^2, E ~ Exp(1), AFT censoring
              C = exp(x0 - x2 W + N(0, 1)), e(x) as type1; RMST up to h = 2.
``simple1-p`` simple1's times with C ~ U(0, 2.5); the effect on P(T > 0.8).

The true tau(x) is a Monte-Carlo mean over 20 000 draws of the noise at each test point
(numerical integration of the potential outcomes' distributions). Figures per design,
over ``--repeats`` training sets of ``--n`` rows with ``--trees`` trees: RMSE of tau(x) on
``--test-points`` fixed test points, the coverage of the 95 % intervals
(``predict_interval``), the doubly robust ATE's coverage of the true average effect (of
the training population's tau, 1 - 0.95 expected misses), and the fit time. A T-learner
from two :class:`forest.SurvivalForest` fits (the RMST difference of the arms' curves)
gives context for the RMSE: no Python library has a causal survival forest to anchor on.

Where the intervals miss (:func:`split_miss`): the test points are the same in every
training set, so each point's bias (mean estimate less the truth) and sampling sd (over
the training sets) are measured and set against the mean standard error; the same split
for a :class:`forest.CausalForest` of ``f(T)`` on the same rows without the censoring
(the complete data) tells the forest's own miss from the censoring's.

Randomized trial: scikit-survival's AIDS clinical trial data (ACTG 320, indinavir ``tx``
against control, time to AIDS or death; ``txgrp`` and ``strat2`` left out: they code the
arm and a stratum). The forest's RMST ATE up to a horizon against the difference of the
arms' Kaplan-Meier restricted means; target: within one of the forest's standard errors.

Scale: fit time at ``--speed-rows`` rows (simple1, 200 trees).

Run: ``python benchmarks/bench_causal_survival.py [--n 2000] [--trees 2000] [--repeats 5]
[--speed-rows 100000]`` (the AIDS part needs scikit-survival: the anchors' venv); ``--ll-compare``: only
the local linear correction (lambda fixed at ``--ll-lambda`` and chosen out of bag) against the plain forest
on the same fits. Writes the
"CausalSurvivalForest (issue 33)" section of RESULTS.md unless ``--no-write``.
"""
import argparse
import os
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402

SECTION = "CausalSurvivalForest (issue 33)"
N_MC = 20_000
P = 5


def _beta24(x):
    return 20.0 * x * (1.0 - x) ** 3


def design(name, n, rng, X=None, complete=False):
    """``(X, W, time, event, tau(X), horizon, target)`` of one design (module docstring).

    With ``complete`` the same draws without the censoring: ``time`` is the failure time
    (capped at the horizon where the design caps it) and every ``event`` is 1.
    """
    X = rng.uniform(size=(n, P)) if X is None else X
    n = len(X)
    mc = np.random.default_rng(12345)
    if name in ("simple1", "simple1-p"):
        W = rng.binomial(1, 0.5, n)
        failure = rng.exponential(size=n) * X[:, 0] + W
        censor = (2.0 if name == "simple1" else 2.5) * rng.uniform(size=n)
        eps = mc.exponential(size=N_MC)
        if name == "simple1":
            h, target = 1.0, "RMST"
            failure = np.minimum(failure, h)
            tau = np.array([np.mean(np.minimum(eps * x + 1, h) - np.minimum(eps * x, h)) for x in X[:, 0]])
        else:
            h, target = 0.8, "survival_probability"
            tau = np.array([np.mean(eps * x + 1 > h) - np.mean(eps * x > h) for x in X[:, 0]])
    elif name == "type1":
        h, target = 1.5, "RMST"
        W = rng.binomial(1, (1 + _beta24(X[:, 0])) / 4)
        I = X[:, 0] < 0.5
        base = -1.85 - 0.8 * I + 0.7 * np.sqrt(X[:, 1]) + 0.2 * X[:, 2]
        lift = 0.7 - 0.4 * I - 0.4 * np.sqrt(X[:, 1])
        failure = np.minimum(np.exp(base + lift * W + rng.normal(size=n)), h)
        rate = np.exp(-1.75 - 0.5 * np.sqrt(X[:, 1]) + 0.2 * X[:, 2] + (1.15 + 0.5 * I - 0.3 * np.sqrt(X[:, 1])) * W)
        censor = (-np.log(rng.uniform(size=n)) / rate) ** 0.5
        eps = mc.normal(size=N_MC)
        tau = np.array([np.mean(np.minimum(np.exp(b + l + eps), h) - np.minimum(np.exp(b + eps), h))
                        for b, l in zip(base, lift)])
    elif name == "type2":
        h, target = 2.0, "RMST"
        W = rng.binomial(1, (1 + _beta24(X[:, 0])) / 4)
        failure = np.minimum((-np.log(rng.uniform(size=n)) / np.exp(X[:, 0] + (X[:, 1] - 0.4) * W)) ** 2, h)
        censor = np.exp(X[:, 0] - X[:, 2] * W + rng.normal(size=n))
        e = -np.log(mc.uniform(size=N_MC))
        tau = np.array([np.mean(np.minimum((e / np.exp(a + b - 0.4)) ** 2, h) - np.minimum((e / np.exp(a)) ** 2, h))
                        for a, b in zip(X[:, 0], X[:, 1])])
    else:
        raise ValueError(name)
    if complete:
        return X, W.astype(float), failure, np.ones(n, dtype=int), tau, h, target
    time_ = np.minimum(failure, censor)
    return X, W.astype(float), time_, (failure <= censor).astype(int), tau, h, target


def t_learner(X, W, time_, event, Xq, h, target, trees, seed):
    """RMST (or survival at h) difference of two SurvivalForest fits, one per arm."""
    from forest import SurvivalForest
    from forest.analysis.causal_survival import restricted_mean
    from native.comm import SelfCommunicator

    out = []
    for arm in (1, 0):
        rows = W == arm
        f = SurvivalForest(trees, random_state=seed).fit(X[rows], time_[rows], event[rows], comm=SelfCommunicator())
        grid = np.append(f.failure_times_[f.failure_times_ < h], h)
        S = f.predict_survival_function(Xq, grid)
        out.append(restricted_mean(S, grid, h) if target == "RMST" else S[:, -1])
    return out[0] - out[1]


def complete_data_forest(name, n, seed, trees, Xq):
    """``(tau_hat, se)`` at ``Xq`` of a CausalForest of ``f(T)`` on the same rows without censoring."""
    from forest import CausalForest
    from native.comm import SelfCommunicator

    X, W, failure, _, _, h, target = design(name, n, np.random.default_rng(seed), complete=True)
    y = np.minimum(failure, h) if target == "RMST" else (failure > h).astype(float)
    f = CausalForest(trees, random_state=seed).fit(X, W, y, comm=SelfCommunicator())
    return f.predict(Xq), np.sqrt(f.predict_var(Xq))


def split_miss(pred, se, truth):
    """Coverage and its split into bias and variance at fixed points over training sets.

    Parameters
    ----------
    pred, se : ndarray, shape (R, m)
        Estimates and standard errors at ``m`` fixed points from ``R`` training sets.
    truth : ndarray, shape (m,)

    Returns
    -------
    coverage : float
        Share of the ``R * m`` 95 % intervals that hold the truth.
    se_over_sd : float
        Mean over points of the mean standard error over the Monte Carlo sd of the
        estimate (1: the variance is right; below 1: under-estimated).
    bias_over_sd : float
        Root mean square over points of ``(mean estimate - truth) / sd``.
    coverage_unbiased : float
        Coverage of the intervals re-centred by the bias (what the variance alone gives).
    """
    sd = pred.std(axis=0, ddof=1)
    bias = pred.mean(axis=0) - truth
    z = 1.959964
    return (float(np.mean(np.abs(pred - truth) <= z * se)), float(np.mean(se.mean(axis=0) / sd)),
            float(np.sqrt(np.mean((bias / sd) ** 2))), float(np.mean(np.abs(pred - bias - truth) <= z * se)))


def fit_training_set(name, args, r, **params):
    """Training set ``r`` of design ``name`` and the CausalSurvivalForest fitted on it.

    Returns
    -------
    data : tuple
        :func:`design`'s ``(X, W, time, event, tau, horizon, target)``.
    forest : CausalSurvivalForest
    seconds : float
        The fit's wall time.
    """
    from forest import CausalSurvivalForest
    from native.comm import SelfCommunicator

    data = design(name, args.n, np.random.default_rng(1000 * r + 7))
    X, W, time_, event, _, h, target = data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        f = CausalSurvivalForest(horizon=h, target=target, n_estimators=args.trees, random_state=r,
                                 **params).fit(X, W, time_, event, comm=SelfCommunicator())
    return data, f, time.perf_counter() - t0


def simulated(args):
    rows, split_rows = [], []
    for name in ("simple1", "type1", "type2", "simple1-p"):
        # fixed test points: the bias and the sampling sd of tau_hat(x) are over training sets
        Xq, _, _, _, tau_q, _, _ = design(name, args.test_points, np.random.default_rng(99))
        rmse, ate_hits, ate_err, fit_s, rmse_t, se_sum = [], 0, [], [], [], []
        preds, ses, cf_preds, cf_ses = [], [], [], []
        for r in range(args.repeats):
            seed = 1000 * r + 7
            (X, W, time_, event, tau_train, h, target), f, seconds = fit_training_set(name, args, r)
            fit_s.append(seconds)
            pred = f.predict(Xq)
            preds.append(pred)
            ses.append(np.sqrt(f.predict_var(Xq)))
            rmse.append(float(np.sqrt(np.mean((pred - tau_q) ** 2))))
            truth = float(tau_train.mean())
            ate_err.append(float(f.ate_ - truth))
            se_sum.append(float(f.ate_stderr_))
            ate_hits += abs(f.ate_ - truth) <= 1.96 * f.ate_stderr_
            rmse_t.append(float(np.sqrt(np.mean((t_learner(X, W, time_, event, Xq, h, target, args.trees // 4, r)
                                                 - tau_q) ** 2))))
            cf_p, cf_s = complete_data_forest(name, args.n, seed, args.trees, Xq)
            cf_preds.append(cf_p)
            cf_ses.append(cf_s)
            cover = np.mean(np.abs(pred - tau_q) <= 1.959964 * ses[-1])
            print(name, r, rmse[-1], cover, f.ate_, truth, f.ate_stderr_, rmse_t[-1], flush=True)
        csf = split_miss(np.array(preds), np.array(ses), tau_q)
        cf = split_miss(np.array(cf_preds), np.array(cf_ses), tau_q)
        rows.append([name, target, f"{h:g}", f"{np.std(tau_q):.3f}", f"{np.mean(rmse):.4f}", f"{np.mean(rmse_t):.4f}",
                     f"{csf[0]:.3f}", f"{ate_hits}/{args.repeats}", f"{np.mean(ate_err):+.4f}",
                     f"{np.mean(se_sum):.4f}", f"{np.mean(fit_s):.2f}"])
        split_rows.append([name, f"{csf[0]:.3f}", f"{csf[1]:.2f}", f"{csf[2]:.2f}", f"{csf[3]:.3f}",
                           f"{cf[0]:.3f}", f"{cf[1]:.2f}", f"{cf[2]:.2f}", f"{cf[3]:.3f}"])
    return rows, split_rows


def local_linear_compare(args):
    """Plain, fixed-lambda and out-of-bag-lambda local linear estimates of the same fits (``--ll-compare``).

    Each training set is fitted once with ``local_linear=True, ll_lambda=None`` (the
    penalty chosen out of bag at fit by the R-loss of the forest's scores, kept as
    ``ll_lambda_``); ``set_params`` then gives, from the same trees, the plain forest
    (``local_linear=False``), the correction at the fixed ``--ll-lambda`` and the
    correction at the chosen penalty (``ll_lambda=None``), so the columns differ only by
    the correction and its penalty.

    Returns
    -------
    list of list of str
        One row per design: per variant RMSE, coverage, se / sd, bias / sd and the
        re-centred coverage; the chosen penalties; the mean seconds of the OOB-lambda
        intervals and of the fit.
    """
    variants = (("plain", dict(local_linear=False)), ("fixed", dict(local_linear=True, ll_lambda=args.ll_lambda)),
                ("oob", dict(local_linear=True, ll_lambda=None)))
    rows = []
    for name in ("simple1", "type1", "type2", "simple1-p"):
        Xq, _, _, _, tau_q, _, _ = design(name, args.test_points, np.random.default_rng(99))
        out = {v: ([], [], [], []) for v, _ in variants}      # preds, ses, per-set coverage, interval s
        fit_s, chosen, kept = [], [], []
        for r in range(args.repeats):
            _, f, seconds = fit_training_set(name, args, r, local_linear=True,
                                             linear_correction_variables=args.ll_variables, ll_lambda=None)
            fit_s.append(seconds)
            chosen.append(f.ll_lambda_)
            kept.append("".join(map(str, f.ll_columns_)))
            for v, params in variants:
                f.set_params(**params)
                t0 = time.perf_counter()
                lo, hi = f.predict_interval(Xq)
                pred, se = (lo + hi) / 2, (hi - lo) / (2 * 1.959964)
                elapsed = time.perf_counter() - t0
                for store, value in zip(out[v], (pred, se, np.mean((lo <= tau_q) & (tau_q <= hi)), elapsed)):
                    store.append(value)
            print(name, r, "variables", kept[-1], "lambda", f.ll_lambda_, "coverage", *(f"{v} {out[v][2][-1]:.3f}" for v, _ in variants),
                  "RMSE", *(f"{v} {np.sqrt(np.mean((out[v][0][-1] - tau_q) ** 2)):.4f}" for v, _ in variants),
                  flush=True)
        row = [name]
        for v, _ in variants:
            preds, ses, cover, secs = (np.array(x) for x in out[v])
            cov, se_sd, bias_sd, unbiased = split_miss(preds, ses, tau_q)
            rmse = np.sqrt(np.mean((preds - tau_q) ** 2, axis=1)).mean()
            row += [f"{rmse:.4f}", f"{cov:.3f} +- {cover.std(ddof=1) / np.sqrt(len(cover)):.3f}", f"{se_sd:.2f}",
                    f"{bias_sd:.2f}", f"{unbiased:.3f}"]
        rows.append(row + [" ".join(kept), " ".join(f"{c:g}" for c in chosen), f"{np.mean(out['oob'][3]):.2f}",
                           f"{np.mean(fit_s):.1f}"])
    return rows


def aids(args):
    """``(rows, note)``: the forest's RMST ATE against the arms' Kaplan-Meier difference."""
    from sksurv.datasets import load_aids

    from forest import CausalSurvivalForest
    from forest.report.survival import arm_curves
    from native.comm import SelfCommunicator

    X, y = load_aids()
    event_field, time_field = y.dtype.names
    time_, event = y[time_field].astype(float), y[event_field].astype(int)
    W = X["tx"].astype(float).to_numpy()
    feats = X.drop(columns=[c for c in ("tx", "txgrp", "strat2") if c in X.columns])
    out = []
    for h in (200.0, 300.0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f = CausalSurvivalForest(horizon=h, n_estimators=args.trees, random_state=0).fit(
                feats, W, time_, event, comm=SelfCommunicator())
        km = arm_curves(time_, event, W, h, "RMST")["difference"]
        boot = []
        rng = np.random.default_rng(0)
        for _ in range(200):
            i = rng.integers(0, len(W), len(W))
            boot.append(arm_curves(time_[i], event[i], W[i], h, "RMST")["difference"])
        out.append([f"{h:g}", f"{f.ate_:.3f}", f"{f.ate_stderr_:.3f}", f"{km:.3f}", f"{np.std(boot):.3f}",
                    f"{abs(f.ate_ - km) / f.ate_stderr_:.2f}"])
        print("aids", out[-1], flush=True)
    return out


def speed(args):
    from forest import CausalSurvivalForest
    from native.comm import SelfCommunicator

    X, W, time_, event, _, h, target = design("simple1", args.speed_rows, np.random.default_rng(3),
                                              X=np.random.default_rng(4).uniform(size=(args.speed_rows, P)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        CausalSurvivalForest(horizon=h, n_estimators=200, random_state=0).fit(X, W, time_, event,
                                                                              comm=SelfCommunicator())
    return time.perf_counter() - t0


def ate_check(args):
    """z-scores ``(ATE - truth) / se`` over ``--ate-check`` training sets of simple1 (500 trees)."""
    from forest import CausalSurvivalForest
    from native.comm import SelfCommunicator

    rows = []
    for grid in (128, 255):
        z = []
        for r in range(args.ate_check):
            X, W, time_, event, tau, h, target = design("simple1", args.n, np.random.default_rng(500 + r))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                f = CausalSurvivalForest(horizon=h, n_estimators=500, max_grid_times=grid, random_state=r).fit(
                    X, W, time_, event, comm=SelfCommunicator())
            z.append((f.ate_ - tau.mean()) / f.ate_stderr_)
        z = np.asarray(z)
        rows.append([grid, args.ate_check, f"{z.mean():+.3f}", f"{z.std():.3f}", int(np.sum(np.abs(z) > 1.96))])
        print("ate-check", rows[-1], flush=True)
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--trees", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--speed-rows", type=int, default=100_000)
    p.add_argument("--test-points", type=int, default=500,
                   help="fixed test points of the coverage (the same in every training set)")
    p.add_argument("--no-aids", action="store_true")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--ate-check", type=int, default=0, metavar="N",
                   help="only the ATE's calibration: z-scores over N simple1 training sets, grids of 128 and 255")
    p.add_argument("--ll-compare", action="store_true",
                   help="only the local linear correction against the plain forest, on the same fits")
    p.add_argument("--ll-variables", nargs="+", default=None, metavar="J",
                   help="--ll-compare: the correction variables, column indices or 'importance' (chosen at fit "
                        "by the effect forest's split frequencies); default every feature")
    p.add_argument("--ll-lambda", type=float, default=0.1,
                   help="--ll-compare: the fixed ridge penalty set against the one chosen out of bag")
    args = p.parse_args(argv)
    os.environ.setdefault("NUMBA_NUM_THREADS", "2")
    if args.ll_variables == ["importance"]:
        args.ll_variables = "importance"
    elif args.ll_variables is not None:
        args.ll_variables = [int(j) for j in args.ll_variables]
    if args.ll_compare:
        which = ("every feature" if args.ll_variables is None else
                 "chosen at fit by the effect forest's split frequencies, `linear_correction_variables="
                 "\"importance\"`" if args.ll_variables == "importance" else
                 "x" + ", x".join(map(str, args.ll_variables)))
        text = (f"Local linear correction (`local_linear=True`, correction variables {which}) against the plain "
                f"forest, on the same fits: lambda fixed at {args.ll_lambda:g} and lambda chosen out of bag at fit "
                f"(`ll_lambda=None`: the first of grf's grid of least R-loss on the forest's out-of-bag scores). "
                f"{args.n} training rows, {args.trees} trees, {args.repeats} training sets per design (seeds as in "
                f"the tables above), {args.test_points} fixed test points. Coverage +- the sd of the per-set "
                f"coverage over sqrt(sets); se / sd, bias / sd and 'unbiased' (coverage re-centred by the bias) "
                f"as in the table above; 'variables': the correction variables of each training set (01: x0 "
                f"and x1); 'OOB lambdas': the penalty chosen on each training set; 'interval s': "
                f"seconds of `predict_interval` at the test points with the chosen lambda; 'fit s' includes the "
                f"leaf tables and the lambda choice.\n\n"
                + markdown_table(["design"] + [f"{h} {v}" for v in ("plain", f"lambda {args.ll_lambda:g}", "OOB lambda")
                                               for h in ("RMSE", "coverage", "se / sd", "bias / sd", "unbiased")]
                                 + ["variables", "OOB lambdas", "interval s", "fit s"], local_linear_compare(args)))
        print(text)
        if not args.no_write:
            write_results_section(SECTION, text)
        return
    if args.ate_check:
        text = (f"The average effect's calibration on simple1 ({args.n} rows, 500 trees): z = (ATE - mean tau of "
                f"the training rows) / se over {args.ate_check} training sets, at two score grids.\n\n"
                + markdown_table(["max_grid_times", "training sets", "mean z", "sd z", "abs(z) > 1.96"],
                                 ate_check(args)))
        print(text)
        if not args.no_write:
            write_results_section(SECTION, text)
        return
    sim, split = simulated(args)
    trial = [] if args.no_aids else aids(args)
    fit_big = speed(args) if args.speed_rows else None
    parts = ["2 threads, one process. Truths by Monte Carlo (module docstring).", "",
             f"Simulated designs, {args.n} training rows, {args.trees} trees, {args.repeats} training sets each; "
             f"{args.test_points} test points, the same in every training set. RMSE T-learner: two SurvivalForest "
             f"fits ({args.trees // 4} trees), the difference of their curves' target.", "",
             markdown_table(["design", "target", "horizon", "sd tau(x)", "RMSE", "RMSE T-learner",
                             "95% CI coverage of tau(x)", "ATE CI covers", "mean ATE error", "mean ATE se",
                             "fit s"], sim), "",
             "Where the intervals miss, at the fixed test points over the training sets: se / sd = mean over "
             "points of the mean standard error over the sampling sd of tau_hat(x) (below 1: variance "
             "under-estimated); bias / sd = root mean square of (mean tau_hat(x) - tau(x)) / sd; 'unbiased' = "
             "the coverage of the intervals re-centred by that bias. 'Complete data': a CausalForest of f(T) "
             "on the same rows without the censoring (same trees), what the forest itself achieves.", "",
             markdown_table(["design", "coverage", "se / sd", "bias / sd", "coverage unbiased",
                             "complete data: coverage", "se / sd", "bias / sd", "coverage unbiased"], split)]
    if trial:
        parts += ["", "AIDS clinical trial (scikit-survival's `load_aids`, 1151 patients, indinavir `tx`): the "
                      "forest's doubly robust RMST effect against the difference of the arms' Kaplan-Meier "
                      "restricted means (its standard error from 200 bootstrap resamples).", "",
                  markdown_table(["horizon (days)", "forest ATE", "forest se", "KM difference", "KM se (bootstrap)",
                                  "abs(ATE - KM) / forest se"], trial)]
    if fit_big is not None:
        parts += ["", f"Fit at {args.speed_rows} rows (simple1, 200 trees, nuisance forests included): "
                      f"{fit_big:.1f} s. Most of it is the nuisance survival curves of the treated arm: its "
                      f"failures all fall at the horizon, so the survival forest cannot split it and its leaves "
                      f"hold thousands of rows, each of which every query's curve visits (the cost of grf's "
                      f"forest-weighted Kaplan-Meier too)."]
    text = "\n".join(parts)
    print(text)
    if not args.no_write:
        write_results_section(SECTION, text)


if __name__ == "__main__":
    main()

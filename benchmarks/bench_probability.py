"""ProbabilityForest (issue 34) against scikit-learn's RandomForestClassifier.

Held-out log loss and (multiclass) Brier score, fit and predict seconds, the same tree
count for both, on:

* ``sim``: a simulated design with known class probabilities: ``--rows`` training rows
  (200k by default) and 50k test rows, 10 features (6 informative, 4 noise), 4 classes
  whose logits are nonlinear in x (a sine, a product, a step, a quadratic); the true
  probabilities give the floor (the "oracle" row).
* ``breast_cancer`` (binary, 569 rows, 30 features) and ``digits`` (10 classes, 1,797
  rows, 64 features), the classification data sets scikit-learn ships without a
  download: repeated stratified 2:1 splits (``--splits``), figures averaged over them;
  likewise ``wine``, ``iris`` and the small designs of :data:`SMALL` (the simulated design at
  2,000 rows, three ``make_classification`` designs), where ``honest="auto"`` chooses
  (``forest.estimators.probability_choice``; the tables say which candidate each split got).

RandomForestClassifier runs with its defaults and ``n_jobs=--threads``; ProbabilityForest
with its defaults on Numba's ``--threads`` threads, after one small warm-up fit in the
same process (the kernels load from the on-disk cache; first-fit compilation is not
what is compared). Log loss is scikit-learn's ``log_loss`` (probabilities clipped at
float64's eps, so a predicted 0 for the true class costs about 36); Brier is
``mean_i sum_k (p_ik - 1[y_i = k])^2``.

``--alternatives [NAME ...]`` also measures other ProbabilityForest settings
(:data:`ALTERNATIVES`: oob_score, max_samples, min_samples_leaf, honesty) on every data
set, to choose defaults by measurement.

Targets (issue 34): log loss and Brier no worse than RandomForestClassifier, fit >= 5x
faster at 200k rows.

``--repeats N`` (simulated design) fits every contender ``N`` times, alternating, and
reports medians with the speed-up over RandomForestClassifier from the same run.

Run (anchors venv): ``PYTHONPATH=. .venv-bench/bin/python benchmarks/bench_probability.py
[--rows 200000] [--trees 200] [--threads 2] [--splits 5] [--alternatives] [--repeats N] [--no-write]``.
Writes the "ProbabilityForest (issue 34)" section of RESULTS.md unless ``--no-write``.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402

SECTION = "ProbabilityForest (issue 34)"

#: ProbabilityForest settings measured with --alternatives (the defaults first).
ALTERNATIVES = {
    "defaults": {},
    "honest=True (the default before honest='auto')": {"honest": True},
    "oob_score=True": {"oob_score": True},
    "max_samples=0.5 (RegressionForest's and grf's)": {"max_samples": 0.5},
    "max_samples=0.9, min_samples_leaf=3": {"max_samples": 0.9, "min_samples_leaf": 3},
    "honest=False, max_samples=0.5, min_samples_leaf=10": {"honest": False, "max_samples": 0.5,
                                                           "min_samples_leaf": 10},
    "honest=False, min_samples_leaf=3": {"honest": False, "min_samples_leaf": 3},
}


def simulated(n, seed):
    """``(X, y, P)``: 10 features, 4 classes with nonlinear logits; ``P`` the true probabilities."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, size=(n, 10))
    logits = np.column_stack([
        np.zeros(n),
        1.5 * np.sin(1.5 * X[:, 0]) + 0.5 * X[:, 1],
        X[:, 2] * X[:, 3],
        2.0 * (X[:, 4] > 0.5) - 0.4 * X[:, 5] ** 2,
    ])
    P = np.exp(logits - logits.max(axis=1, keepdims=True))
    P /= P.sum(axis=1, keepdims=True)
    y = (rng.uniform(size=n)[:, None] > np.cumsum(P, axis=1)).sum(axis=1)
    return X, np.minimum(y, 3), P


def scores(y, proba, classes):
    """``(log loss, Brier)`` of probabilities ``proba`` (n, K) for labels ``y`` over ``classes``."""
    from sklearn.metrics import log_loss

    onehot = (np.asarray(y)[:, None] == np.asarray(classes)[None, :]).astype(np.float64)
    return float(log_loss(y, proba, labels=classes)), float(np.mean(np.sum((proba - onehot) ** 2, axis=1)))


#: The candidate each fit of ours chose under honest="auto" (``tuning_["chosen"]``), for the tables.
CHOICES = []


def fit_ours(X, y, Xt, trees, threads, seed, **params):
    from forest import ProbabilityForest
    from native.comm import SelfCommunicator

    start = time.perf_counter()
    model = ProbabilityForest(n_estimators=trees, random_state=seed, **params).fit(X, y, comm=SelfCommunicator())
    fit_s = time.perf_counter() - start
    CHOICES.append(getattr(model, "tuning_", {}).get("chosen", "-"))
    start = time.perf_counter()
    proba = model.predict_proba(Xt)
    return proba, model.classes_, fit_s, time.perf_counter() - start


def fit_sklearn(X, y, Xt, trees, threads, seed):
    from sklearn.ensemble import RandomForestClassifier

    start = time.perf_counter()
    model = RandomForestClassifier(n_estimators=trees, n_jobs=threads, random_state=seed).fit(X, y)
    fit_s = time.perf_counter() - start
    start = time.perf_counter()
    proba = model.predict_proba(Xt)
    return proba, model.classes_, fit_s, time.perf_counter() - start


def warm_up(threads):
    """Small fits and a prediction, so the timed fits load no kernel: 2,000 rows reach only the
    exact small-node path; 50,000 rows (2 trees) the histogram path too, which the first timed
    fit otherwise compiled (a 56 s first round against 33 s for the second, at 200,000 rows)."""
    for n, trees in ((2000, 4), (50_000, 2)):
        X, y, _ = simulated(n, 99)
        fit_ours(X, y, X[:300], trees, threads, 0)


def contenders(alternatives):
    out = [("RandomForestClassifier", fit_sklearn, {})]
    if alternatives is True:
        alternatives = list(ALTERNATIVES)
    names = ["defaults"] + [name for name in (alternatives or []) if name != "defaults"]
    chosen = {name: ALTERNATIVES[name] for name in names}
    out += [(f"ProbabilityForest ({name})", fit_ours, params) for name, params in chosen.items()]
    return out


def run_simulated(rows, trees, threads, alternatives, seed=0, repeats=1):
    """The simulated design's table. With ``repeats > 1`` the contenders' fits alternate
    (all of them once, then again), each row shows its median fit and predict seconds,
    and ``fit speed-up`` is RandomForestClassifier's median fit over the row's: on a shared
    machine, alternation spreads the other sessions' load over every contender."""
    X, y, _ = simulated(rows, seed)
    Xt, yt, Pt = simulated(50_000, seed + 1)
    oracle = scores(yt, Pt, np.arange(4))
    table = [{"model": "oracle (true probabilities)", "log loss": f"{oracle[0]:.4f}", "Brier": f"{oracle[1]:.4f}",
              "fit s": "", "predict s": "", "fit speed-up": ""}]
    chosen = contenders(alternatives)
    times = {name: ([], []) for name, _, _ in chosen}
    quality = {}
    for rep in range(repeats):
        for name, fn, params in chosen:
            proba, classes, fit_s, pred_s = fn(X, y, Xt, trees, threads, seed, **params)
            quality[name] = scores(yt, proba, classes)
            times[name][0].append(fit_s)
            times[name][1].append(pred_s)
            print(f"sim {rows} (round {rep + 1}): {name} log loss {quality[name][0]:.4f}, fit {fit_s:.2f} s, "
                  f"predict {pred_s:.2f} s", file=sys.stderr, flush=True)
    anchor = float(np.median(times["RandomForestClassifier"][0]))
    for name, _, _ in chosen:
        fit_s, pred_s = float(np.median(times[name][0])), float(np.median(times[name][1]))
        table.append({"model": name, "log loss": f"{quality[name][0]:.4f}", "Brier": f"{quality[name][1]:.4f}",
                      "fit s": f"{fit_s:.2f}" + (f" ({', '.join(f'{t:.2f}' for t in times[name][0])})"
                                                 if repeats > 1 else ""),
                      "predict s": f"{pred_s:.2f}", "fit speed-up": f"{anchor / fit_s:.2f}x"})
    return table


#: Small designs of ``--datasets`` besides scikit-learn's data sets: (title, loader).
SMALL = {
    "sim2000": ("the simulated design, 2,000 rows", lambda: simulated(2000, 7)[:2]),
    "mc_binary": ("make_classification(1000, 20, n_informative=5, random_state=0)",
                  lambda: _make_classification(1000, 20, n_informative=5, random_state=0)),
    "mc_3class": ("make_classification(1500, 20, n_informative=6, n_classes=3, flip_y=0.1, random_state=1)",
                  lambda: _make_classification(1500, 20, n_informative=6, n_classes=3, flip_y=0.1, random_state=1)),
    "mc_noisy": ("make_classification(3000, 10, n_informative=4, flip_y=0.3, class_sep=0.5, random_state=2)",
                 lambda: _make_classification(3000, 10, n_informative=4, flip_y=0.3, class_sep=0.5,
                                              random_state=2)),
}


def _make_classification(*args, **kwargs):
    from sklearn.datasets import make_classification

    return make_classification(*args, **kwargs)


def small_data(name):
    """``(title, X, y)`` of a small data set: scikit-learn's ``load_<name>`` or one of :data:`SMALL`."""
    from sklearn import datasets

    if name in SMALL:
        title, load = SMALL[name]
        X, y = load()
        return title, np.asarray(X, dtype=np.float64), y
    data = getattr(datasets, f"load_{name}")()
    return f"{name} (scikit-learn)", data.data.astype(np.float64), data.target


def run_real(name, trees, threads, splits, alternatives):
    from sklearn.model_selection import StratifiedShuffleSplit

    _, X, y = small_data(name)
    cut = StratifiedShuffleSplit(n_splits=splits, test_size=1 / 3, random_state=0)
    table = []
    for model, fn, params in contenders(alternatives):
        got = []
        CHOICES.clear()
        for seed, (train, test) in enumerate(cut.split(X, y)):
            proba, classes, fit_s, pred_s = fn(X[train], y[train], X[test], trees, threads, seed, **params)
            got.append(scores(y[test], proba, classes) + (fit_s, pred_s))
        ll, brier, fit_s, pred_s = np.mean(got, axis=0)
        chose = ", ".join(f"{c} {CHOICES.count(c)}" for c in dict.fromkeys(CHOICES) if c != "-")
        table.append({"model": model, "log loss": f"{ll:.4f}", "Brier": f"{brier:.4f}", "fit s": f"{fit_s:.2f}",
                      "predict s": f"{pred_s:.3f}", "honest='auto' chose": chose})
        print(f"{name}: {table[-1]}", file=sys.stderr, flush=True)
    return table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--trees", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--splits", type=int, default=5)
    ap.add_argument("--datasets", nargs="+", default=["sim", "breast_cancer", "digits"])
    ap.add_argument("--alternatives", nargs="*", metavar="NAME", default=None,
                    help="also these ProbabilityForest settings (names of ALTERNATIVES; none given: all)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="sim: fit every contender this many times, alternating; medians (default 1)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    os.environ.setdefault("NUMBA_NUM_THREADS", str(args.threads))
    if args.alternatives == []:
        args.alternatives = True
    load = os.getloadavg()
    warm_up(args.threads)
    blocks = [f"Load average before the run: {load[0]:.2f} (1 min), {load[1]:.2f} (5 min); {args.trees} trees, "
              f"{args.threads} threads."]
    for name in args.datasets:
        if name == "sim":
            table = run_simulated(args.rows, args.trees, args.threads, args.alternatives, repeats=args.repeats)
            title = f"Simulated, 4 classes, {args.rows:,} training rows, 50,000 test rows"
        else:
            table = run_real(name, args.trees, args.threads, args.splits, args.alternatives)
            title = f"{small_data(name)[0]}, {args.splits} stratified 2:1 splits, means"
        headers = list(table[0])
        blocks.append(f"{title}:\n\n" + markdown_table(headers, [[r[h] for h in headers] for r in table]))
    text = "\n\n".join(blocks)
    print(text)
    if not args.no_write:
        write_results_section(SECTION, text)


if __name__ == "__main__":
    main()

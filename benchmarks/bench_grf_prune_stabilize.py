"""``honesty_prune_leaves`` and ``stabilize_splits`` (grf parity, issue 38), measured.

Three rules for a leaf that no estimation row reaches, on the *same* trees (one fit with
``honesty_prune_leaves=False`` keeps every node's estimation count and sums, so all three
are computed from it):

* ``fill``: histforest's default, the nearest non-empty ancestor's value
  (``honesty_prune_leaves=True``; checked here against that model's own predictions);
* ``skip``: grf's ``honesty.prune.leaves = FALSE``, the tree is left out of the point's
  average (``honesty_prune_leaves=False``, the model's predictions);
* ``grf prune``: grf's ``Tree::prune_empty_leaves``, a split with an empty child replaced by
  the other child, so the point walks on down the sibling's splits (a NumPy walk here, not
  offered by the estimators).

Designs: a regression forest with grf's size rule (``min_node_size=5``) on small training
sets, and a causal forest whose treatment is rare (10% treated), where
``stabilize_splits=False`` (grf's regression rule on the pseudo-outcomes) also matters.
Figures are held-out mean squared errors against the true function / effect, averaged
over seeds, and the share of (point, tree) pairs whose leaf is empty.

Run: ``python benchmarks/bench_grf_prune_stabilize.py [--seeds 5] [--write]``
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from forest import CausalForest, RegressionForest   # noqa: E402

HEADING = "honesty_prune_leaves and stabilize_splits (issue 38)"


def _walk(packed, X, count_col, rule):
    """Per tree, the node whose value each row of ``X`` takes: (n, trees) packed node ids, -1 for none.

    ``rule``: ``"fill"`` (the leaf, or its nearest ancestor with estimation rows), ``"skip"`` (the
    leaf, -1 when empty), ``"grf"`` (grf's pruned tree: a split with an empty child is passed
    straight to the other child).
    """
    feature, threshold = packed["feature"], packed["threshold"]
    left, right, offsets = packed["left"], packed["right"], packed["tree_offsets"]
    count = packed["value"][:, count_col]
    n, n_trees = len(X), len(offsets) - 1
    out = np.empty((n, n_trees), dtype=np.int64)
    rows = np.arange(n)
    for t in range(n_trees):
        node = np.full(n, offsets[t])
        seen = node.copy()                                  # deepest node with rows on the way
        while True:
            inner = feature[node] >= 0
            if not inner.any():
                break
            i, v = rows[inner], node[inner]
            go_left = X[i, feature[v]] <= threshold[v]
            if rule == "grf":
                lc, rc = count[left[v]], count[right[v]]
                go_left = np.where(lc <= 0, False, np.where(rc <= 0, True, go_left))
            node[i] = np.where(go_left, left[v], right[v])
            seen[i] = np.where(count[node[i]] > 0, node[i], seen[i])
        if rule == "fill":
            out[:, t] = seen
        else:
            out[:, t] = np.where(count[node] > 0, node, -1)
    return out


def _tree_values(packed, nodes):
    values = packed["value"][np.maximum(nodes, 0)]
    return np.where((nodes >= 0)[..., None], values, 0.0)


def _ratio(values, k):
    with np.errstate(invalid="ignore", divide="ignore"):
        return values[..., :k].sum(1)[:, 0] / values[..., k + 1].sum(1)


def _theta(values):
    g, w, y, wy, ww = (values[..., j].sum(1) for j in range(5))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (g * wy - w * y) / (g * ww - w * w)


def _mse(pred, truth):
    ok = np.isfinite(pred)
    return float(np.mean((pred[ok] - truth[ok]) ** 2)), float(1 - ok.mean())


def regression(seed, n, trees):
    rng = np.random.default_rng(seed)
    f = lambda X: np.sin(2 * X[:, 0]) + X[:, 1] ** 2 / 2 + X[:, 2]     # noqa: E731
    X, Xq = rng.normal(size=(n, 5)), rng.normal(size=(2000, 5))
    y = f(X) + rng.normal(size=n)
    kw = dict(n_estimators=trees, min_node_size=5, random_state=seed)
    skip = RegressionForest(honesty_prune_leaves=False, **kw).fit(X, y)
    fill = RegressionForest(**kw).fit(X, y)
    packed = skip.estimators_
    out = {}
    for rule in ("fill", "skip", "grf"):
        nodes = _walk(packed, Xq, 1, rule)
        out[rule] = _ratio(_tree_values(packed, nodes), 1)
    assert np.allclose(out["fill"], fill.predict(Xq), rtol=1e-10)        # the walk is the model's rule
    assert np.allclose(out["skip"], skip.predict(Xq), rtol=1e-10, equal_nan=True)
    empty = float((_walk(packed, Xq, 1, "skip") < 0).mean())
    return {rule: _mse(p, f(Xq)) for rule, p in out.items()}, empty


def causal(seed, n, trees, stabilize):
    rng = np.random.default_rng(seed)
    tau = lambda X: 1 + 1 / (1 + np.exp(-4 * X[:, 0]))                   # noqa: E731
    X, Xq = rng.normal(size=(n, 5)), rng.normal(size=(2000, 5))
    t = (rng.random(n) < 0.1).astype(float)
    y = X[:, 1] + tau(X) * t + rng.normal(size=n)
    cf = CausalForest(trees, random_state=seed, stabilize_splits=stabilize, honesty_prune_leaves=False).fit(X, t, y)
    packed = cf.estimators_
    out = {}
    for rule in ("fill", "skip", "grf"):
        out[rule] = _theta(_tree_values(packed, _walk(packed, Xq, 5, rule)))
    assert np.allclose(out["skip"], cf.predict(Xq), rtol=1e-8, equal_nan=True)
    empty = float((_walk(packed, Xq, 5, "skip") < 0).mean())
    leaves = float((packed["feature"] < 0).sum() / trees)
    return {rule: _mse(p, tau(Xq)) for rule, p in out.items()}, empty, leaves


def _cells(results):
    """Mean MSE per rule over seeds, with the share of NaN points for ``skip``."""
    mean = {r: np.mean([res[r][0] for res in results]) for r in ("fill", "skip", "grf")}
    nan = np.mean([res["skip"][1] for res in results])
    return mean, nan


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--write", action="store_true", help="record the tables in benchmarks/RESULTS.md")
    args = ap.parse_args()
    seeds = range(args.seeds)
    lines = ["Held-out MSE, mean over %d seeds (2000 test points each); the three empty-leaf rules on the "
             "same trees. `empty`: share of (point, tree) pairs whose leaf has no estimation row; `NaN`: "
             "share of points every tree of which is empty (`skip` gives NaN there, grf too; left out of "
             "its MSE)." % args.seeds, "",
             "| design | trees | empty | fill (default) | skip (`honesty_prune_leaves=False`) | grf prune | NaN |",
             "|---|---|---|---|---|---|---|"]
    for n, trees in ((100, 500), (300, 500), (1000, 500)):
        runs = [regression(s, n, trees) for s in seeds]
        mean, nan = _cells([r[0] for r in runs])
        lines.append(f"| regression, n={n}, min_node_size=5 | {trees} | {np.mean([r[1] for r in runs]):.3f} | "
                     f"{mean['fill']:.4f} | {mean['skip']:.4f} | {mean['grf']:.4f} | {nan:.4f} |")
        print(lines[-1], flush=True)
    lines += ["", "| causal, 10% treated | trees | leaves per tree | empty | fill (default) | skip | grf prune "
                  "| NaN |", "|---|---|---|---|---|---|---|---|"]
    for n in (500, 2000):
        for stabilize in (True, False):
            runs = [causal(s, n, 500, stabilize) for s in seeds]
            mean, nan = _cells([r[0] for r in runs])
            lines.append(f"| n={n}, `stabilize_splits={stabilize}` | 500 | {np.mean([r[2] for r in runs]):.1f} | "
                         f"{np.mean([r[1] for r in runs]):.3f} | {mean['fill']:.4f} | {mean['skip']:.4f} | "
                         f"{mean['grf']:.4f} | {nan:.4f} |")
            print(lines[-1], flush=True)
    if args.write:
        from _harness import write_results_section

        write_results_section(HEADING, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

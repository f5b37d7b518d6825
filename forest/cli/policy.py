"""``forest-policy``: learn a policy tree (and a budgeted allocation) from sharded data.

Two sources of rewards:

* ``forest-policy CAUSAL_MODEL DATA``: the causal model's doubly robust scores on DATA
  (``model.score_rows(X, t, y)``, one column per arm against control), with the control
  as action 0 and reward 0. DATA may be rows the causal model was not trained on, or
  its training data as trained (same rows, same order): those get out-of-bag effects
  and scores, as grf's policy trees use, so the scores (and the cost curves built
  from them) are honest either way; data that is partly training rows is refused. The
  causal model's effect estimates (out of bag on training rows) rank the rows for the
  cost curves.
* ``forest-policy DATA --rewards COL ...``: any reward columns, one per action, and
  optionally ``--effects COL ...``: estimated effects of actions 1.. over action 0 (a
  model's predictions) for the budget's price and the cost curves, whose gains are
  then the reward differences.

Costs (``--costs COL ...`` per row, or ``--cost-per-arm C ...`` constants) are given for
every action, or for every action but action 0 (which then costs nothing). Without a
budget they are in reward units and the tree maximises reward minus cost. With
``--budget B`` they are in budget units: the allocation of DATA's rows under B (the
greedy of :func:`forest.policy.allocation.allocate` on the effect estimates; with
``--rewards`` and no ``--effects``, on the per-row reward differences, which are
noisy and so overstate the price) prices the budget at ``lambda``, the ROI of the
last option it could not afford, and the tree maximises ``reward - lambda * cost``.
The budget is kept in the model file with each node's mean (gross) reward per
action, and ``forest-predict`` allocates the budget over the rows it predicts.

This module also holds the policy-model parts of ``forest-predict`` (:func:`predict`)
and ``forest-report`` (:func:`report`); those tools call them for policy model files.
"""
import sys
import time

from forest.cli.common import (CLIError, Parser, agree, check_not_input, check_unique, feature_input, guarded,
                               load_rows, run_tool, world)

PROG = "forest-policy"


def build_parser():
    """The argument parser of ``forest-policy``."""
    p = Parser(
        prog=PROG,
        description="Fit an exact depth-k policy tree (which action for whom) on doubly robust "
                    "scores from a causal model, or on given reward columns. Run it under "
                    "`mpirun -np K`: every rank reads its share of the rows and all ranks find "
                    "the same tree.",
        epilog="examples:\n"
               "  mpirun -np 8 forest-policy cf.model holdout.parquet --depth 2 --out policy.model\n"
               "  forest-policy cf.model holdout.parquet --cost-per-arm 1.5 --budget 2000 --out policy.model\n"
               "  forest-policy scores.parquet --rewards r0 r1 r2 --costs c0 c1 c2 --depth 3 --out policy.model",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
    )
    p.add_argument("inputs", nargs="+", metavar="CAUSAL_MODEL DATA",
                   help="a causal model file and the data (with --rewards: the data only)")
    p.add_argument("--rewards", nargs="+", metavar="COL", help="reward columns, one per action (no causal model)")
    p.add_argument("--effects", nargs="+", metavar="COL",
                   help="with --rewards: estimated effects of actions 1.. over action 0 (ranking and price)")
    p.add_argument("--features", nargs="+", metavar="COL",
                   help="features the tree may split on (default: the causal model's, or every other "
                        "numeric column)")
    p.add_argument("--treatment", metavar="COL", help="treatment column (default: the causal model's)")
    p.add_argument("--outcome", metavar="COL", help="outcome column (default: the causal model's)")
    p.add_argument("--weight", metavar="COL", help="sample-weight column")
    costs = p.add_mutually_exclusive_group()
    costs.add_argument("--costs", nargs="+", metavar="COL", help="per-row cost columns, one per action "
                       "(or one per action after the first, which then costs 0)")
    costs.add_argument("--cost-per-arm", nargs="+", type=float, metavar="C",
                       help="constant cost of each action (or of each action after the first)")
    p.add_argument("--budget", type=float, metavar="B", help="total budget (needs costs); see the module help")
    p.add_argument("--depth", type=int, default=2, help="tree depth, 0-3 (default 2)")
    p.add_argument("--min-samples-leaf", type=int, default=1, help="fewest rows per leaf (default 1)")
    p.add_argument("--max-bins", type=int, help="value bins per feature (default by depth: 255, 64, 16)")
    p.add_argument("--random-state", type=int, help="seed of the binning sample")
    p.add_argument("--exchange", choices=("auto", "rows", "tables"), default="auto",
                   help="how ranks share the depth-2/3 search (default auto); the tree is the same")
    p.add_argument("--out", required=True, metavar="POLICY.model", help="policy model file to write")
    return p


def _resolve(args):
    """(causal model path or None, data path) and the checks that need no data."""
    for flag, names in (("--rewards", args.rewards), ("--effects", args.effects), ("--features", args.features)):
        check_unique(names, flag)
    if args.rewards is not None:
        if len(args.inputs) != 1:
            raise CLIError("with --rewards give only DATA (no causal model)")
        if args.treatment or args.outcome:
            raise CLIError("--treatment/--outcome are used with a causal model, not with --rewards")
        model, data = None, args.inputs[0]
        if args.effects is not None and len(args.effects) != len(args.rewards) - 1:
            raise CLIError(f"--effects needs one column per action after the first ({len(args.rewards) - 1}), "
                           f"got {len(args.effects)}")
    else:
        if args.effects is not None:
            raise CLIError("--effects is used with --rewards; a causal model gives its own effects")
        if len(args.inputs) != 2:
            raise CLIError("give CAUSAL_MODEL DATA, or DATA with --rewards COL ...")
        model, data = args.inputs
    if not 0 <= args.depth <= 3:
        raise CLIError(f"--depth must be 0-3, got {args.depth}")
    if args.budget is not None:
        if not args.budget >= 0:
            raise CLIError(f"--budget must be >= 0, got {args.budget}")
        if args.costs is None and args.cost_per_arm is None:
            raise CLIError("--budget needs costs (--costs COL ... or --cost-per-arm C ...)")
    if args.cost_per_arm is not None and any(not c >= 0 or c == float("inf") for c in args.cost_per_arm):
        raise CLIError("--cost-per-arm values must be finite and >= 0")
    return model, data


def _load_causal(path, treatment, outcome):
    """The causal model, its feature names and the treatment/outcome columns to read."""
    from forest.io import model_io
    from forest.estimators.causal_forest import CausalForest

    header = model_io.read_header(path)
    est = model_io.load(path, expect=CausalForest)
    meta = header.get("metadata", {})
    names = header.get("feature_names") or meta.get("feature_names")
    if not names:
        raise ValueError(f"causal model {path!r} does not record its feature names")
    t_col, y_col = treatment or meta.get("treatment"), outcome or meta.get("outcome")
    if not t_col or not y_col:
        raise ValueError(f"causal model {path!r} does not name its treatment/outcome columns; "
                         f"give --treatment and --outcome")
    if not callable(getattr(est, "dr_scores", None)):
        raise ValueError(f"causal model {path!r}: this histforest's CausalForest has no dr_scores(X, t, y) "
                         f"(doubly robust scores); use --rewards COL ... with scores you computed")
    levels = [f"{t_col}={c}" for c in est.classes_] if est.classes_ is not None else ["control", "treated"]
    return est, [str(n) for n in names], t_col, y_col, levels


def _columns(args, causal_features, t_col, y_col, source_columns, source_numeric):
    """Tree features and every numeric column to read."""
    others = [c for c in (args.rewards or []) + (args.effects or []) + (args.costs or []) + [t_col, y_col, args.weight]
              if c]
    if args.features is not None:
        features = list(args.features)
    elif causal_features is not None:
        features = list(causal_features)
    else:
        features = [c for c in source_columns if source_numeric[c] and c not in others]
    if not features:
        raise ValueError("no feature columns for the tree")
    clash = sorted(set(features) & set(others))
    if clash:
        raise ValueError(f"column {clash[0]!r} is both a tree feature and a reward/cost/treatment/outcome/weight")
    return features, list(dict.fromkeys(features + list(causal_features or []) + others))


def cost_matrix(n, n_actions, columns=None, per_action=None, shard=None):
    """Costs of every action for every row, shape (n, n_actions).

    ``columns`` / ``per_action`` hold ``n_actions`` entries, or ``n_actions - 1`` for
    actions 1.. (action 0 then costs 0). Returns None when no costs are given.
    """
    import numpy as np

    spec = columns if columns is not None else per_action
    if spec is None:
        return None
    if len(spec) not in (n_actions, n_actions - 1):
        raise ValueError(f"costs: {len(spec)} given for {n_actions} actions (give {n_actions}, or "
                         f"{n_actions - 1} when action 0 is free)")
    out = np.zeros((n, n_actions))
    first = n_actions - len(spec)
    for j, item in enumerate(spec):
        out[:, first + j] = shard.columns[item] if columns is not None else float(item)
    return out


def _check_rows(shard, finite, nonneg, features, offset):
    """This rank's first data problem, or None."""
    import numpy as np

    from forest.io.dataio import bad_values

    for name in finite:
        message = bad_values(name, shard.columns[name], offset)
        if message is not None:
            return message
    for name in nonneg:
        if (shard.columns[name] < 0).any():
            return f"column {name!r} has negative values"
    for name in features:
        if np.isinf(shard.columns[name]).any():
            return f"feature column {name!r} has infinite values (NaN means missing; infinity is not allowed)"
    return None


def _arm_costs(costs, n, n_arms):
    """Costs of arms 1.. over action 0's, shape (n, n_arms): 1 per arm when no costs."""
    import numpy as np

    if costs is None:
        return np.ones((n, n_arms))
    extra = costs[:, 1:] - costs[:, :1]
    if (extra < 0).any():
        raise ValueError("an action costs less than action 0; the allocation measures spend above action 0")
    return extra


def _body(argv):
    args = build_parser().parse_args(argv)
    model_path, data = _resolve(args)
    t_start = time.perf_counter()

    import numpy as np
    import pyarrow as pa

    from forest.io import model_io
    from forest.report import summary as rep
    from forest._validation import as_columns
    from forest.policy.allocation import allocate, cost_curves
    import warnings

    from forest.policy.tree import PolicyTree
    from forest.io.training_rows import TrainingRowsNotice
    from native import collectives as col
    from native.stats import STATS

    comm = world()
    causal, message = (None, None), None
    if model_path is not None:
        causal, message = guarded(_load_causal, model_path, args.treatment, args.outcome)
    if message is None and comm.rank == 0:
        def _output():
            check_not_input(args.out, [model_path] if model_path is not None else [])
            model_io.check_writable(args.out)
        _, message = guarded(_output)
    agree(comm, message)
    est, causal_features, t_col, y_col, levels = causal if model_path is not None else (None,) * 5

    def choose(source):
        return _columns(args, causal_features, t_col, y_col, source.columns, source.numeric)[1]

    source, names, shard, offset = load_rows(comm, data, choose, out=args.out)
    features, _ = _columns(args, causal_features, t_col, y_col, source.columns, source.numeric)
    finite = [c for c in (args.rewards or []) + (args.effects or []) + (args.costs or []) + [t_col, y_col, args.weight]
              if c]
    message = _check_rows(shard, finite, [c for c in (args.costs or []) + [args.weight] if c], features, offset)
    agree(comm, message)
    n = shard.n_local
    X = np.column_stack([shard.columns[c] for c in features]) if n else np.zeros((0, len(features)))
    weight = shard.columns[args.weight] if args.weight else None

    tau = scores = None
    if est is not None:
        # named columns, as the causal model was fitted (a bare matrix makes it warn)
        Xc = feature_input(est, pa.table({c: shard.columns[c] if n else np.zeros(0) for c in causal_features}),
                           causal_features)
        t = shard.columns[t_col]
        if str(source.types.get(t_col, "")).startswith(("int", "uint", "bool")):
            t = t.astype(np.int64)  # integer treatments are arms, as in forest-train
        # Collective: the training rows (as trained) get out-of-bag effects and scores,
        # rows that are partly training rows are refused (forest.io.training_rows).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TrainingRowsNotice)    # said below, once, in the tool's words
            scored, message = guarded(lambda: est.score_rows(Xc, t, shard.columns[y_col], comm=comm))
        agree(comm, message)
        tau, scores = as_columns(scored.effects), as_columns(scored.scores)
        if comm.rank == 0:
            print(f"{PROG}: rewards from {'out-of-bag' if scored.source == 'out-of-bag' else 'held-out'} doubly robust "
                  f"scores" + (" (these are the causal model's training rows)" if scored.source == "out-of-bag"
                               else ""), file=sys.stderr)
        rewards = np.column_stack([np.zeros(n), scores])
        action_names = levels[:scores.shape[1] + 1]  # action 0: the control level
    else:
        rewards = np.column_stack([shard.columns[c] for c in args.rewards]) if n else np.zeros((0, len(args.rewards)))
        action_names = list(args.rewards)
        scores = rewards[:, 1:] - rewards[:, :1]
        if args.effects is not None:
            tau = np.column_stack([shard.columns[c] for c in args.effects]) if n else np.zeros((0, len(args.effects)))
    A = rewards.shape[1]
    costs, message = guarded(cost_matrix, n, A, args.costs, args.cost_per_arm, shard)
    agree(comm, message)
    arm_costs, message = guarded(_arm_costs, costs, n, A - 1)
    agree(comm, message)

    STATS.reset()
    price, allocation = None, None
    if costs is not None:
        price = 1.0
    if args.budget is not None:
        alloc = allocate(tau if tau is not None else scores, arm_costs, args.budget, comm=comm)
        price = alloc.roi_threshold
        chosen = alloc.action + 1
        per_action = np.bincount(chosen, minlength=A).astype(np.int64)
        dr_gain = scores[np.flatnonzero(alloc.action >= 0), alloc.action[alloc.action >= 0]].sum()
        sums = col.allreduce(comm, np.concatenate([per_action, [dr_gain]]).astype(np.float64)) \
            if comm.size > 1 else np.concatenate([per_action, [dr_gain]]).astype(np.float64)
        allocation = {"budget": args.budget, "spend": alloc.spend, "estimated_gain": alloc.value,
                      "evaluated_gain": float(sums[-1]), "lp_bound": alloc.lp_bound, "price": price,
                      "rows_per_action": sums[:A].astype(np.int64).tolist()}
    net = rewards if costs is None else rewards - price * costs
    params = {"max_depth": args.depth, "min_samples_leaf": args.min_samples_leaf, "max_bins": args.max_bins,
              "exchange": args.exchange, "random_state": args.random_state}
    tree, message = guarded(lambda: PolicyTree(**params).fit(X, net, sample_weight=weight, comm=comm))
    agree(comm, message)
    gross = tree.evaluate(X, rewards, sample_weight=weight, comm=comm)
    node_rewards = tree.node_means(X, rewards, sample_weight=weight, comm=comm)
    spend = tree.evaluate(X, costs, sample_weight=weight, comm=comm) if costs is not None else None
    curves = None
    if tau is not None:
        curves = {k: c.as_dict() for k, c in cost_curves(tau, arm_costs, scores, comm=comm).items()}

    metadata = rep.to_json({
        "model": "policy", "feature_names": features, "action_names": action_names,
        "rewards": ({"from": "causal_model", "causal_model": model_path, "treatment": t_col, "outcome": y_col}
                    if est is not None else {"from": "columns", "columns": list(args.rewards)}),
        "cost_columns": args.costs, "cost_per_action": args.cost_per_arm, "budget": args.budget, "price": price,
        "value": {"objective": [tree.value_, tree.value_stderr_], "reward": list(gross),
                  "cost": list(spend) if spend is not None else None, "in_sample": True},
        "node_rewards": node_rewards, "allocation": allocation, "cost_curves": curves, "n_rows": int(tree.tree_.count[0]),
        "n_ranks": comm.size, "data": data})
    message = None
    if comm.rank == 0:
        _, message = guarded(model_io.save, tree, args.out, metadata)
    agree(comm, message)
    if comm.rank == 0:
        print(tree.export_text(features, action_names), file=sys.stderr)
        lo, hi = tree.value_ - 1.96 * tree.value_stderr_, tree.value_ + 1.96 * tree.value_stderr_
        print(f"{PROG}: depth-{args.depth} policy on {int(tree.tree_.count[0])} rows x {len(features)} features, "
              f"{A} actions, {comm.size} rank(s): mean reward {tree.value_:.4g} (95% CI {lo:.4g} to {hi:.4g}, "
              f"in-sample) in {time.perf_counter() - t_start:.2f} s; search exchange "
              f"{tree.search_['exchange']}, {tree.search_['bytes_sent_total']} bytes sent; wrote {args.out}",
              file=sys.stderr)
        if allocation is not None:
            print(f"{PROG}: budget {args.budget:g}: spend {allocation['spend']:.4g}, price {price:.4g} per unit "
                  f"of cost, rows per action {allocation['rows_per_action']}", file=sys.stderr)
    return 0


def main(argv=None):
    """Console entry point of ``forest-policy``."""
    return run_tool(PROG, _body, argv)


# ---------------------------------------------------------------------------- forest-predict

def is_policy_model(path):
    """Whether ``path`` is a policy model file (False for anything unreadable: the caller reports it)."""
    from forest.io import model_io

    try:
        return model_io.read_header(path).get("estimator", "").endswith(".PolicyTree")
    except (model_io.ModelFormatError, OSError):
        return False


def predict(model_path, data, out, keep=(), interval=False):
    """``forest-predict`` for a policy model: ``action`` (and ``allocated`` under a budget) per row.

    Every rank reads its rows, routes them through the tree and, when the model holds
    a budget, joins a distributed :func:`forest.policy.allocation.allocate` of that budget over
    all rows of DATA, with the effects of each action taken from the row's leaf
    (its mean reward minus action 0's) and the costs from the model's cost columns or
    constants, and the effects from the model's ``node_rewards`` (each node's mean reward
    per action on the policy data, before costs). Output columns: the ``--keep`` columns, ``action``, ``action_name``, and
    with a budget ``allocated`` (action 0 where nothing is bought) and
    ``allocated_name``. Rank 0 writes the rows in input order.

    Returns
    -------
    int
        Exit status (0); input problems raise :class:`CLIError` on every rank.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from forest.io import model_io
    from forest.policy.allocation import allocate
    from forest.cli.output import gather_to_parquet
    from forest.policy.tree import PolicyTree

    if interval:
        raise CLIError("--interval needs a causal model; this is a policy model")
    comm = world()

    def _load():
        header = model_io.read_header(model_path)
        est = model_io.load(model_path, expect=PolicyTree)
        if comm.rank == 0:
            check_not_input(out, [model_path])
            model_io.check_writable(out)
        return header.get("metadata", {}), est

    loaded, message = guarded(_load)
    agree(comm, message)
    meta, est = loaded
    names = [str(c) for c in meta.get("feature_names") or []]
    action_names = [str(a) for a in meta.get("action_names") or range(est.n_actions_)]
    cost_cols = meta.get("cost_columns") or []
    budget = meta.get("budget")
    outputs = ["action", "action_name"] + (["allocated", "allocated_name"] if budget is not None else [])
    clash = sorted(set(keep) & set(outputs))
    if clash:
        raise CLIError(f"--keep column {clash[0]!r} would clash with an output column (outputs: {', '.join(outputs)})")
    source, _, shard, offset = load_rows(comm, data, list(dict.fromkeys(names + cost_cols)), keep=list(keep),
                                         require_rows=False, out=out)
    message = _check_rows(shard, cost_cols, cost_cols, names, offset)
    agree(comm, message)
    n = shard.n_local
    X = np.column_stack([shard.columns[c] for c in names]) if n else np.zeros((0, len(names)))
    leaf = est.apply(X) if n else np.zeros(0, dtype=np.int64)
    action = est.action_[leaf]
    columns = {"action": action, "action_name": [action_names[a] for a in action]}
    if budget is not None:
        A = est.n_actions_
        costs = cost_matrix(n, A, meta.get("cost_columns"), meta.get("cost_per_action"), shard)
        value = np.nan_to_num(np.asarray(meta["node_rewards"], dtype=np.float64)[leaf])
        alloc = allocate(value[:, 1:] - value[:, :1], _arm_costs(costs, n, A - 1), float(budget), comm=comm)
        allocated = alloc.action + 1
        columns.update(allocated=allocated, allocated_name=[action_names[a] for a in allocated])
    table = pa.table({name: pa.array(values, type=pa.int64() if name in ("action", "allocated") else pa.string())
                      for name, values in columns.items()})
    for j, name in enumerate(shard.keep.column_names if shard.keep is not None else []):
        table = table.add_column(j, name, shard.keep.column(name))
    agree(comm, gather_to_parquet(comm, table, out))
    if comm.rank == 0:
        total = pq.ParquetFile(out).metadata.num_rows
        print(f"forest-predict: wrote {total} rows ({', '.join(table.column_names)}) to {out}", file=sys.stderr)
    return 0


# ---------------------------------------------------------------------------- forest-report

def report(model_path, html=None, as_json=False, data=None):
    """``forest-report`` for a policy model: the tree, its value with a CI and the cost curves.

    Returns
    -------
    int
        Exit status.
    """
    import json

    import numpy as np

    from forest.io import model_io
    from forest.report import summary as rep
    from forest.policy.tree import PolicyTree

    if data is not None:
        raise CLIError("--data is not used for a policy model (its cost curves were evaluated by forest-policy)")
    if html is not None:
        try:
            check_not_input(html, [model_path], "--html")
            model_io.check_writable(html)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    try:
        header = model_io.read_header(model_path)
        est = model_io.load(model_path, expect=PolicyTree)
    except model_io.ModelFormatError as exc:
        raise CLIError(str(exc)) from None
    meta = header.get("metadata", {})
    names = meta.get("feature_names") or [f"x{j}" for j in range(est.n_features_in_)]
    actions = meta.get("action_names") or [f"action {a}" for a in range(est.n_actions_)]
    z = 1.959963984540054
    value, se = est.value_, est.value_stderr_
    out = {"model": "PolicyTree", "model_file": model_path, "depth": int(est.max_depth),
           "features": names, "actions": actions, "tree": est.export_text(names, actions),
           "value": value, "value_stderr": se, "value_ci95": [value - z * se, value + z * se],
           "gain_over_best_single_action": est.gain_, "gain_stderr": est.gain_stderr_,
           "search": est.search_, "metadata": meta}
    lines = [f"PolicyTree from {model_path}: depth {est.max_depth}, {est.tree_.n_leaves} leaves, "
             f"{len(actions)} actions, {int(est.tree_.count[0])} training rows", "", out["tree"], "",
             f"Mean reward of the policy: {value:.4g} (95% CI {value - z * se:.4g} to {value + z * se:.4g}; "
             f"in-sample, so optimistic)",
             f"Gain over the best single action: {est.gain_:.4g} (standard error {est.gain_stderr_:.4g})",
             f"Search: exchange {est.search_['exchange']}, {est.search_['n_ranks']} rank(s), "
             f"{est.search_['bytes_sent_total']} bytes sent, max_bins {est.search_['max_bins']}"]
    curves = meta.get("cost_curves")
    if curves:
        lines += ["", "Cost curves (gain evaluated with doubly robust scores on the policy data):"]
        for key, c in curves.items():
            aucc = c["aucc"] if c["aucc"] is not None else float("nan")
            lines.append(f"  {key}: total spend {c['total_spend']:.4g}, total gain {c['total_gain']:.4g}, "
                         f"AUCC {aucc:.3f} (random targeting 0.5)")
    else:
        lines += ["", "(no cost curves: they need a causal model's effect estimates)"]
    if meta.get("allocation"):
        a = meta["allocation"]
        lines += ["", f"Allocation of budget {a['budget']:g} on the policy data: spend {a['spend']:.4g}, "
                      f"estimated gain {a['estimated_gain']:.4g}, evaluated gain {a['evaluated_gain']:.4g}, "
                      f"rows per action {a['rows_per_action']}"]
    text = "\n".join(lines)
    if html:
        sections = [("Policy tree", text, rep.policy_tree_figure(est.tree_, est.action_, names, actions))]
        if curves:
            sections.append(("Cost curves", "", rep.cost_curve_figure(
                {k: (np.asarray(c["spend"], float), np.asarray(c["gain"], float)) for k, c in curves.items()})))
        try:
            with open(html, "w", encoding="utf-8") as f:
                f.write(rep.html_page(f"histforest report: PolicyTree ({model_path})", sections))
        except OSError as exc:
            raise CLIError(f"cannot write {html!r}: {exc.strerror or exc}") from None
    if as_json:
        json.dump(rep.to_json(out), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(text)
        if html:
            print(f"\nwrote {html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

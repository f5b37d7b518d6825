"""``forest-train``: fit an estimator on sharded parquet/CSV data, under ``mpirun`` or alone.

Every rank reads its own row groups (:mod:`forest.io.dataio`), checks them, agrees
with the others on the first error (:mod:`forest.cli.common`), bins its features
row group by row group (:mod:`histogram.binning_stream`; no float64 copy of all
features is ever made), then calls the estimator's ``fit`` with the codes, its
targets and the world communicator; every rank ends with the same model and rank 0
writes it atomically (:mod:`forest.io.model_io`).

Heavy imports (numpy, Numba, MPI, the estimators) happen inside :func:`main` after
the arguments are parsed, so ``forest-train --help`` answers at once.
"""
import sys
import time

import numpy as np

from forest.cli.common import (CLIError, Parser, agree, check_not_input, check_unique, fit_input_error, guarded,
                               numbers, plan_source, run_tool, world)
from forest.estimators.kinds import KINDS, ROLES, fit_targets

PROG = "forest-train"

#: ``--model`` choices: the model kinds (:mod:`forest.estimators.kinds`, the one table of them).
MODELS = KINDS

def tune_names(text):
    """``--tune-parameters``: ``"all"`` or a comma-separated list of parameter names."""
    text = text.strip()
    return "all" if text == "all" else [name.strip() for name in text.split(",") if name.strip()]


#: Named model options -> estimator parameter name (passed only when given).
PARAM_OPTIONS = (
    ("--n-estimators", "n_estimators", int, "number of trees (forests) or boosting iterations"),
    ("--max-depth", "max_depth", int, "maximum tree depth"),
    ("--max-leaf-nodes", "max_leaf_nodes", int, "maximum leaves per tree (GBDT)"),
    ("--min-samples-leaf", "min_samples_leaf", int, "minimum rows per leaf"),
    ("--min-node-size", "min_node_size", int, "grf's min.node.size (regression and probability forests): nodes of "
                                              "at most this many rows are not split, children may be smaller"),
    ("--max-features", "max_features", None, "features tried per split (int, float fraction, 'sqrt')"),
    ("--learning-rate", "learning_rate", float, "shrinkage (GBDT)"),
    ("--max-bins", "max_bins", int, "value bins per feature (<= 255)"),
    ("--random-state", "random_state", int, "seed of every random choice"),
    ("--quantized-bins", "quantized_bins", int, "gradient levels of --quantized training (even, default 4)"),
    ("--horizon", "horizon", float, "horizon of --model causal-survival: the effect on the mean survival time "
                                    "up to it (RMST) or on survival past it (--target survival_probability)"),
    ("--target", "target", str, "estimand of --model causal-survival: RMST (default) or survival_probability"),
    ("--tune-parameters", "tune_parameters", tune_names, "tune these parameters first (regression, causal and "
                                                         "instrumental forests; grf's tune.parameters): 'all' or a "
                                                         "comma-separated list, e.g. min_samples_leaf,max_samples"),
    ("--quantiles", "quantiles", numbers, "quantile levels of --model quantile, comma-separated (default "
                                          "0.1,0.5,0.9): its splits and forest-predict's columns"),
)


def build_parser():
    """The argument parser of ``forest-train``."""
    p = Parser(
        prog=PROG,
        description="Train a causal forest, instrumental forest, regression forest or gradient-boosted trees on "
                    "parquet/CSV data. Run it under `mpirun -np K` to train on K ranks: each "
                    "rank reads only its share of the row groups and all ranks produce the "
                    "same model.",
        epilog="examples:\n"
               "  mpirun -np 32 forest-train data/ --treatment t --outcome y --out cf.model\n"
               "  forest-train iv.parquet --model instrumental --treatment t --instrument z --outcome y \\\n"
               "      --out iv.model\n"
               "  forest-train train.csv --model gbdt-regressor --outcome y --n-estimators 200 --out gb.model\n"
               "  forest-train trial.parquet --model survival --time days --event died --out sf.model\n"
               "  forest-train trial.parquet --model causal-survival --treatment arm --time days --event died \\\n"
               "      --horizon 365 --local-linear --ll-lambda oob --out csf.model\n"
               "  mpirun -np 2 forest-train --demo --verbose --out /tmp/demo.model",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
    )
    p.add_argument("data", nargs="?", help="parquet file, directory of parquet files, glob, or CSV file")
    p.add_argument("--demo", action="store_true",
                   help="train a causal forest on the embedded demo data set (no DATA needed)")
    p.add_argument("--model", choices=sorted(MODELS), default="causal", help="estimator (default: causal)")
    p.add_argument("--treatment", help="treatment column (causal and instrumental models)")
    p.add_argument("--instrument", metavar="COL", help="instrument column (instrumental model)")
    p.add_argument("--outcome", help="outcome column")
    p.add_argument("--time", metavar="COL", help="failure or censoring time column (survival model)")
    p.add_argument("--event", metavar="COL",
                   help="event column of the survival model: 1 where the failure was observed, 0 where censored")
    p.add_argument("--features", nargs="+", metavar="COL",
                   help="feature columns (default: every other column that holds numbers or categories; the "
                        "columns left out are listed with the reason)")
    cats = p.add_mutually_exclusive_group()
    cats.add_argument("--categorical", nargs="+", metavar="COL",
                      help="also treat these numeric feature columns (e.g. integer codes) as categorical; "
                           "dictionary and string columns always are")
    cats.add_argument("--no-categorical", action="store_true",
                      help="treat no column as categorical: dictionary and string columns are left out")
    p.add_argument("--weight", metavar="COL", help="sample-weight column")
    p.add_argument("--cluster", metavar="COL",
                   help="cluster column (integer labels; causal, instrumental and regression forests): trees "
                        "sample whole clusters and standard errors are cluster-robust, as grf's clusters")
    p.add_argument("--out", required=True, metavar="MODEL", help="model file to write")
    g = p.add_argument_group("model parameters (default: the estimator's own)")
    for flag, dest, _, text in PARAM_OPTIONS:
        # Collected as a list, so a parameter given twice is refused rather than the last one kept.
        g.add_argument(flag, dest=dest, default=None, action="append", help=text)
    g.add_argument("--quantized", action="store_true",
                   help="quantized training (GBDT): integer gradients, integer histograms and collectives, "
                        "leaf values refit from full-precision sums")
    g.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="any other estimator parameter, e.g. --param honest=false (repeatable)")
    ll = p.add_argument_group("local linear correction (--model causal-survival)")
    ll.add_argument("--local-linear", action="store_true",
                    help="correct the effect forest's estimates and intervals by grf's local linear regression on "
                         "the correction variables (CausalSurvivalForest(local_linear=True)); their values are "
                         "read as float64 columns beside the binned features")
    ll.add_argument("--ll-lambda", metavar="L",
                    help="ridge penalty of the correction: a number >= 0, or 'oob' to choose it out of bag at fit "
                         "(the R-loss of the forest's out-of-bag scores over grf's grid; default 0.1)")
    ll.add_argument("--ll-variables", nargs="+", metavar="COL",
                    help="the correction variables (numeric feature columns; default every non-categorical "
                         "feature)")
    ll.add_argument("--ll-importance", action="store_true",
                    help="choose the correction variables at fit: the non-categorical features the effect "
                         "forest splits on at least an even share of the time "
                         "(linear_correction_variables='importance'; with --ll-lambda oob the penalty is chosen "
                         "on them)")
    c = p.add_argument_group("checkpoints (a rerun of the same command resumes, on any number of ranks)")
    c.add_argument("--checkpoint", metavar="DIR",
                   help="rank 0 writes the trees and the state needed to continue into DIR after every batch "
                        "of trees (GBDT: every --checkpoint-every iterations)")
    c.add_argument("--checkpoint-every", type=int, default=10, metavar="N",
                   help="GBDT iterations between checkpoints (default 10)")
    c.add_argument("--restart", action="store_true",
                   help="discard the checkpoint in DIR and start from the first tree")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="print a per-phase timing table and bytes communicated at the end")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--plan", action="store_true",
                   help="print the estimated fit time, peak memory per rank and bytes sent (from the file "
                        "footers and the cost model) and stop")
    p.add_argument("--force", action="store_true",
                   help="start even when the estimated peak memory exceeds what a rank may use")
    return p


def parse_value(text):
    """Parse a ``--param`` value: int, float, true/false, none, or the string itself."""
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def collect_params(args):
    """Estimator parameters the user set, and how each was given.

    Returns
    -------
    params : dict
        Parameter name -> parsed value (checked by the estimator in :func:`make_estimator`).
    given : dict
        Parameter name -> the option as typed, e.g. ``"--max-features foo"``.
    """
    params, given = {}, {}

    def once(name, how):
        if name in given:
            raise CLIError(f"parameter {name!r} is given twice ({given[name]} and {how}); give it once")

    for flag, dest, kind, _ in PARAM_OPTIONS:
        raw = getattr(args, dest)
        if raw is None:
            continue
        if isinstance(raw, list):
            if len(raw) > 1:
                raise CLIError(f"{flag} is given twice ({flag} {raw[0]} and {flag} {raw[1]}); give it once")
            raw = raw[0]
        try:
            params[dest] = kind(raw) if kind is not None else parse_value(raw)
        except ValueError:
            raise CLIError(f"{flag} expects {kind.__name__}, got {raw!r}") from None
        given[dest] = f"{flag} {raw}"
    if args.quantized:
        params["quantized"], given["quantized"] = True, "--quantized"
    _local_linear_params(args, params, given)
    for item in args.param:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise CLIError(f"--param expects NAME=VALUE, got {item!r}")
        name = _param_name(name)
        once(name, f"--param {item}")
        params[name] = parse_value(value)
        given[name] = f"--param {item}"
    return params, given


def _local_linear_params(args, params, given):
    """``--local-linear``, ``--ll-lambda``, ``--ll-variables`` as CausalSurvivalForest parameters."""
    if not args.local_linear:
        for flag, value in (("--ll-lambda", args.ll_lambda), ("--ll-variables", args.ll_variables),
                            ("--ll-importance", args.ll_importance or None)):
            if value is not None:
                raise CLIError(f"{flag} goes with --local-linear")
        return
    if args.model != "causal-survival":
        raise CLIError(f"--local-linear is only used by the causal-survival model, not {args.model!r}")
    params["local_linear"], given["local_linear"] = True, "--local-linear"
    if args.ll_lambda is not None:
        text = args.ll_lambda.strip()
        if text.lower() == "oob":
            params["ll_lambda"] = None
        else:
            try:
                params["ll_lambda"] = float(text)
            except ValueError:
                raise CLIError(f"--ll-lambda expects a number >= 0 or 'oob', got {args.ll_lambda!r}") from None
        given["ll_lambda"] = f"--ll-lambda {args.ll_lambda}"
    if args.ll_variables is not None and args.ll_importance:
        raise CLIError("--ll-variables names the correction variables, --ll-importance chooses them: give one")
    if args.ll_variables is not None:
        check_unique(args.ll_variables, "--ll-variables")
        params["linear_correction_variables"] = list(args.ll_variables)
        given["linear_correction_variables"] = "--ll-variables " + " ".join(args.ll_variables)
    if args.ll_importance:
        from forest.estimators.causal_survival_forest import BY_IMPORTANCE

        params["linear_correction_variables"] = BY_IMPORTANCE
        given["linear_correction_variables"] = "--ll-importance"


def correction_columns(est, features, categorical):
    """The columns whose float values a local linear fit reads (``[]`` without one), in the features' order.

    Parameters
    ----------
    est : estimator
        ``local_linear`` and ``linear_correction_variables`` are read (a CausalSurvivalForest's).
    features : list of str
    categorical : ndarray of bool, shape (len(features),)

    Raises
    ------
    CLIError
        A correction variable that is not a feature, or a categorical one.
    """
    if not getattr(est, "local_linear", False):
        return []
    from forest.estimators.causal_survival_forest import BY_IMPORTANCE

    named = est.linear_correction_variables
    if named is None or (isinstance(named, str) and named == BY_IMPORTANCE):   # every candidate is read
        return [f for f, c in zip(features, categorical) if not c]
    if isinstance(named, str) or not all(isinstance(c, str) for c in named):
        raise CLIError("name the correction variables by column with --ll-variables COL ...")
    kinds = dict(zip(features, categorical))
    for name in named:
        if name not in kinds:
            raise CLIError(f"--ll-variables names {name!r}, which is not a feature column")
        if kinds[name]:
            raise CLIError(f"--ll-variables names {name!r}, a categorical feature: the correction needs numbers")
    return [f for f in features if f in set(named)]


def _param_name(text):
    """The estimator parameter a ``--param NAME=...`` names (``n-estimators`` -> ``n_estimators``)."""
    return text.strip().replace("-", "_")


def make_estimator(kind, params, given=None):
    """Instantiate the estimator of ``--model kind`` and run its own parameter checks.

    Parameters
    ----------
    kind : str
        A key of :data:`MODELS`.
    params : dict
        Parameter values parsed from the command line.
    given : dict, optional
        ``{parameter: how the user gave it}`` (e.g. ``"--param alpha=abc"``), named in
        the error when the estimator refuses that parameter.

    Raises
    ------
    CLIError
        An unknown parameter, or a value the estimator's ``_check_params`` refuses
        (the same check ``fit`` runs first), so nothing is read or trained.
    """
    name = MODELS[kind].class_name
    try:
        cls = MODELS[kind].estimator_class()
    except (ImportError, AttributeError) as exc:
        raise CLIError(f"model {kind!r} is not available in this installation ({exc})") from None
    known = cls._get_param_names()
    unknown = sorted(set(params) - set(known))
    if unknown:
        raise CLIError(f"model {kind!r} ({name}) has no parameter {unknown[0]!r}; "
                       f"its parameters: {', '.join(sorted(known))}")
    est = cls(**params)
    try:
        est._check_params()
    except (TypeError, ValueError) as exc:
        text = str(exc).strip().splitlines()[0]
        culprit = next((how for param, how in (given or {}).items() if text.startswith(param)), None)
        raise CLIError(f"{culprit}: {text}" if culprit else f"invalid model parameter: {text}") from None
    return est


def _models_taking(what):
    """``"causal and instrumental models"``: the kinds whose ``fit`` takes a role (or ``"clusters"``)."""
    names = [k.name for k in KINDS.values() if (k.clusters if what == "clusters" else k.takes(what))]
    if len(names) == 1:
        return f"{names[0]} model"
    return ", ".join(names[:-1]) + " and " + names[-1] + " models"


def _resolve_columns(args):
    """Fill in demo defaults and check the column options that do not need the data."""
    if args.demo:
        from forest.data import DEMO_FEATURES, DEMO_OUTCOME, DEMO_PATH, DEMO_TREATMENT, DEMO_TREES

        if args.data is not None:
            raise CLIError("give either DATA or --demo, not both")
        args.data = DEMO_PATH
        if KINDS[args.model].takes("treatment"):
            args.treatment = args.treatment or DEMO_TREATMENT
        if KINDS[args.model].takes("outcome"):
            args.outcome = args.outcome or DEMO_OUTCOME
        args.features = args.features or list(DEMO_FEATURES)
        # 100 trees keep `make demo` to tens of seconds on a laptop; --n-estimators (or
        # --param n_estimators=N) overrides.
        if args.n_estimators is None and not any(_param_name(p.partition("=")[0]) == "n_estimators"
                                                 for p in args.param):
            args.n_estimators = [str(DEMO_TREES)]
    if args.data is None:
        raise CLIError("no DATA given (a parquet file, directory, glob or CSV file; or --demo)")
    kind = KINDS[args.model]
    if kind.takes("outcome") and args.outcome is None:
        raise CLIError("--outcome COL is required")
    for role in ROLES:
        if kind.takes(role) and getattr(args, role) is None:
            raise CLIError(f"--{role} COL is required for the {args.model} model")
        if not kind.takes(role) and getattr(args, role) is not None:
            raise CLIError(f"--{role} is only used by the {_models_taking(role)}, not {args.model!r}")
    if args.cluster is not None and not kind.clusters:
        raise CLIError(f"--cluster is only used by the {_models_taking('clusters')}, not {args.model!r}")
    targets = [c for c in [getattr(args, role) for role in ROLES] + [args.weight, args.cluster] if c is not None]
    if len(set(targets)) != len(targets):
        raise CLIError("treatment, instrument, outcome, time, event, weight and cluster must be different columns")
    if args.features is not None:
        clash = sorted(set(args.features) & set(targets))
        if clash:
            raise CLIError(f"column {clash[0]!r} is both a feature and the "
                           "treatment/instrument/outcome/time/event/weight")
        check_unique(args.features, "--features")
    if args.categorical is not None:
        check_unique(args.categorical, "--categorical")
        clash = sorted(set(args.categorical) & set(targets))
        if clash:
            raise CLIError(f"--categorical names {clash[0]!r}, the "
                           "treatment/instrument/outcome/time/event/weight/cluster; "
                           "only features can be categorical")
    return targets


def _validate_shard(args, shard, offset, labels=()):
    """This rank's data problems as one message (or None), plus its treatment values.

    ``labels`` (a classifier's outcome, read as it is) are converted into
    ``shard.columns`` here by :func:`forest.io.dataio.class_labels`, which also checks them.
    """
    import numpy as np

    from forest.io.dataio import bad_values, class_labels

    for name in labels:
        shard.columns[name], message = class_labels(shard.keep.column(name), name, offset)
        if message is not None:
            return message, None
    for name in (args.treatment, args.instrument, args.outcome, args.time, args.event, args.weight):
        if name is None or name in labels:
            continue
        message = bad_values(name, shard.columns[name], offset)
        if message is not None:
            return message, None
    if args.weight is not None and (shard.columns[args.weight] < 0).any():
        return f"weight column {args.weight!r} has negative values", None
    message = _cluster_message(args, shard, offset)
    if message is not None:
        return message, None
    arms = None
    if args.treatment is not None:
        # At most three distinct values are needed to know whether there are >= 2 arms.
        arms = np.unique(shard.columns[args.treatment])[:3].tolist()
    return None, arms


def _cluster_message(args, shard, offset):
    """The cluster column's problem on this rank (non-integer labels), or None."""
    if args.cluster is None:
        return None
    labels = shard.columns[args.cluster]
    bad = np.flatnonzero(~np.isfinite(labels) | (labels != np.floor(labels)))
    if len(bad):
        return (f"cluster column {args.cluster!r} must hold integer labels; row {offset + int(bad[0])} "
                f"holds {labels[bad[0]]!r}")
    return None


class TreeProgress:
    """Progress bar over trees on rank 0 (a no-op elsewhere); passed as ``progress=``.

    The estimator calls it as ``progress(n_done, n_total)`` after each finished tree
    (or batch of trees).
    """

    def __init__(self, enabled, desc):
        self.enabled = enabled
        self.desc = desc
        self.bar = None

    def __call__(self, n_done, n_total=None):
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm import tqdm

            # A resumed fit reports first the trees it starts from: the bar starts there.
            self.bar = tqdm(total=n_total, desc=self.desc, unit="tree", file=sys.stderr,
                            dynamic_ncols=True, leave=True, initial=int(n_done))
        if n_total is not None and self.bar.total != n_total:
            self.bar.total = n_total
        self.bar.update(int(n_done) - self.bar.n)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def bin_mapper_for(est, comm, checkpoint=None):
    """The unfitted BinMapper the estimator's own ``fit`` would use on float input.

    Forests seed their binning sample with ``random_state`` (0 for None), so a
    forest trained here equals one fitted on the same rows in memory; gradient
    boosting draws its seed on rank 0 when ``random_state`` is None (or takes the
    seed of the checkpoint it resumes) and then sets ``random_state`` to it.
    """
    from histogram.binning import BinMapper

    if hasattr(est, "_seed"):
        seed = est._seed(comm, checkpoint)
        if est.random_state is None:
            # One seed for the bin edges and the fit (validation rows, checkpoint): the
            # model records it, and a resumed run takes it from the checkpoint.
            est.set_params(random_state=seed)
    else:
        from forest.estimators.regression_forest import check_forest_params

        # honest="auto" (ProbabilityForest) is checked by the estimator's own checks
        seed = est._check_params() if isinstance(getattr(est, "honest", None), str) else check_forest_params(est)
    return BinMapper(max_bins=int(est.max_bins), random_state=int(seed))


def _fit(est, kind, binned, features, shard, args, comm, progress, treatment_type=None, checkpoint=None,
         correction=()):
    """Fit ``est`` on pre-binned features ``binned = (mapper, codes)`` named ``features`` and the shard's targets.

    ``correction``: the local linear correction variables' columns (:func:`correction_columns`),
    read from the shard as float64 and passed as ``correction_values``.
    """
    t = shard.columns[args.treatment] if args.treatment else None
    if t is not None and treatment_type is not None and treatment_type.startswith(("int", "uint", "bool")):
        # Integer treatments keep an integer dtype: the causal forest reads integer
        # codes with more than two levels as arms, floats as a continuous dose.
        t = t.astype(np.int64)
    # a classifier's outcome: already its labels (dataio.class_labels)
    y = shard.columns[args.outcome] if args.outcome else None
    w = shard.columns[args.weight] if args.weight else None
    extra = dict(feature_names=features)  # the model records its feature names (feature_names_in_)
    if args.cluster is not None:
        extra["clusters"] = shard.columns[args.cluster]
    if correction:
        extra["correction_values"] = np.column_stack([shard.columns[c] for c in correction])
    columns = {"treatment": t, "outcome": y}
    for role in ("instrument", "time", "event"):
        columns[role] = shard.columns[getattr(args, role)] if getattr(args, role) else None
    return est.fit(None, *fit_targets(KINDS[kind], columns), sample_weight=w, comm=comm, progress=progress,
                   binned=binned, checkpoint=checkpoint, **extra)


#: What forest-train adds to the refusal of a column with too many categories.
LEVELS_HINT = ("; forest-train: leave it out (list the other columns in --features), or use it as a number "
               "(it must then hold numbers)")


def agree_categories(comm, source, run, choice, max_bins):
    """The category coder of the categorical features, the same on every rank (one collective).

    Each rank lists the categories of its own rows (one pass over its row groups,
    reading only the categorical columns); the lists are all-gathered and every rank
    builds the coder from all of them (:meth:`histogram.categories.CategoryCoder.from_summaries`),
    so codes do not depend on how rows are spread over ranks.

    Returns
    -------
    histogram.categories.CategoryCoder or None
        None when no feature is categorical.

    Raises
    ------
    CLIError
        On every rank: a column with more distinct values than a categorical column may
        have, or (defensively) one holding strings on some ranks and numbers on others.
    """
    from forest.io import dataio
    from histogram.categories import CategoryCoder
    from native import collectives as col

    columns = np.flatnonzero(choice.categorical)
    if not len(columns):
        return None
    names = [choice.features[f] for f in columns]
    local, message = guarded(dataio.local_category_summaries, source, run, names)
    gathered = col.allgather_object(comm, (message, local))
    for m, _ in gathered:
        if m is not None:
            raise CLIError(m + (LEVELS_HINT if "distinct values" in m else ""))
    parts = [part for _, rank in gathered for part in rank]
    coder, message = guarded(CategoryCoder.from_summaries, len(choice.features), columns, parts, int(max_bins),
                             choice.features)
    if message is not None:     # from the same gathered lists on every rank: every rank raises it
        raise CLIError(message + (LEVELS_HINT if "distinct values" in message else ""))
    return coder


def record_categories(est, coder, choice):
    """Give a model fitted on pre-binned codes its categorical features (as ``fit`` on a table would).

    ``fit(binned=...)`` sees codes only: the coder and the mask that turn a table's
    columns into those codes at prediction time are set here, before the model is
    saved (the model file checks that they match the bin mapper's ``categorical_``).
    """
    est.is_categorical_ = np.asarray(choice.categorical, dtype=bool).copy()
    if coder is not None:
        est.category_coder_ = coder


def check_checkpoint_path(path, out, data):
    """Raise ``ValueError`` when ``--checkpoint path`` cannot be a checkpoint directory of this run.

    Refused: the ``--out`` model file, a data file or the data directory, an existing
    path that is not a directory, and a directory that cannot be created or written.
    (Rank 0 runs it: only rank 0 writes checkpoints.)
    """
    import os

    from forest.io import dataio

    from forest.io import model_io

    if os.path.realpath(path) == os.path.realpath(out) or (os.path.exists(path) and os.path.exists(out)
                                                           and os.path.samefile(path, out)):
        raise ValueError(f"--checkpoint {path!r} is the --out model file; give the checkpoint a directory of its own")
    try:
        inputs = dataio.resolve_paths(data)
    except dataio.DataError:
        inputs = []   # reported when the data is opened
    check_not_input(path, inputs, "--checkpoint")
    if os.path.isdir(data) and os.path.exists(path) and os.path.samefile(path, data):
        raise ValueError(f"--checkpoint {path!r} is the input directory {data!r}; give the checkpoint a "
                         f"directory of its own")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--checkpoint {path!r} exists and is not a directory: a checkpoint is a directory "
                         f"(give a new path, or the directory of an earlier run's checkpoint)")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"cannot create checkpoint directory {path!r}: {existing!r} is not a directory")
    problem = model_io.directory_write_error(existing)
    if problem is not None:
        raise ValueError(f"cannot write checkpoint directory {path!r}: cannot create a file in {existing!r} "
                         f"({problem})")


def make_checkpoint(args):
    """The :class:`forest.io.checkpoint.Checkpoint` of ``--checkpoint`` (None without it)."""
    if args.checkpoint is None:
        if args.restart:
            raise CLIError("--restart discards a checkpoint: give --checkpoint DIR too")
        return None
    from forest.io.checkpoint import Checkpoint

    if args.checkpoint_every < 1:
        raise CLIError(f"--checkpoint-every must be >= 1, got {args.checkpoint_every}")

    def log(line):
        print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    return Checkpoint(args.checkpoint, restart=args.restart, every=args.checkpoint_every, log=log,
                      restart_hint="rerun with --restart to discard it")


def _body(argv):
    args = build_parser().parse_args(argv)
    targets = _resolve_columns(args)
    # Every option is checked before MPI starts or any data is read: each rank fails
    # the same way on the same arguments, and rank 0 alone prints (run_tool).
    params, given = collect_params(args)
    est = make_estimator(args.model, params, given)
    checkpoint = make_checkpoint(args)
    from forest.cli.plan import check_settings

    check_settings()
    t_start = time.perf_counter()

    from forest.io import dataio

    from forest.io import model_io
    from forest.io.dataio import DataError
    from forest.profiling import TIMER, phase
    from histogram.binning_stream import StreamingBinFit
    from native import collectives as col
    from native.stats import STATS

    comm = world()
    message = None
    if comm.rank == 0:  # what the file system says is rank 0's to check, the others agree
        def _outputs():
            model_io.check_writable(args.out)
            if args.checkpoint is not None:
                check_checkpoint_path(args.checkpoint, args.out, args.data)
        _, message = guarded(_outputs)
    agree(comm, message)

    # A classifier's outcome may hold text labels: it is read as it is and converted
    # by dataio.class_labels; every other target must be numeric.
    labels = [args.outcome] if KINDS[args.model].class_labels else []
    numeric_targets = [c for c in targets if c not in labels]

    def select(source):
        # A function of the footers alone: rank 0 runs it inside plan_source (where its
        # errors are agreed on), every other rank again on the broadcast source.
        return dataio.choose_features(source, exclude=targets + labels, named=args.features,
                                      categorical=args.categorical or (),
                                      use_categories=not args.no_categorical)

    # Streaming binning, two passes over this rank's row groups. Pass 1 reads the
    # targets into float64 columns and streams each row group's features past the
    # bin-edge sampler; the edges are then fitted over all ranks; pass 2 reads the
    # features again and bins each row group into the uint8 matrix the trees grow on.
    # No rank ever holds its features as one float64 block (8x the codes' bytes).
    t_read = time.perf_counter()
    source, _, run, offset, n_local = plan_source(comm, args.data, lambda s: select(s).numeric + numeric_targets,
                                                  keep=labels, out=args.out)
    choice = select(source)
    features = choice.features
    correction = correction_columns(est, features, choice.categorical)
    if comm.rank == 0 and choice.left_out_line() is not None:
        print(f"{PROG}: {choice.left_out_line()}", file=sys.stderr, flush=True)
    from forest.cli.plan import plan_or_check  # --plan, and the memory check before reading

    if plan_or_check(args, params, source, features, comm):
        return 0
    mapper, message = guarded(bin_mapper_for, est, comm, checkpoint)
    agree(comm, message)
    coder = agree_categories(comm, source, run, choice, mapper.max_bins)
    # Categorical features are read as their codes (NaN missing): the codes are their value bins.
    encoders = {} if coder is None else {choice.features[f]: (lambda c, j=j: coder.encode(j, c))
                                         for j, f in enumerate(coder.columns_)}
    fitter = StreamingBinFit(mapper, len(features), offset, n_local, source.n_rows)
    rows_seen = [offset]

    def take_features(block):
        inf = np.isinf(block)
        if inf.any():
            i, j = np.argwhere(inf)[0]
            raise DataError(f"feature column {features[j]!r} has an infinite value at row {rows_seen[0] + i}; "
                            f"features may be NaN (missing) but not infinite")
        fitter.add(block)
        rows_seen[0] += len(block)

    shard, message = guarded(dataio.read_shard, source, run, numeric=numeric_targets + correction, keep=labels,
                             features=features, on_features=take_features, encoders=encoders)
    agree(comm, message)
    message, arms = _validate_shard(args, shard, offset, labels)
    gathered = col.allgather_object(comm, (message, arms))
    for m, _ in gathered:
        if m is not None:
            raise CLIError(m)
    if args.treatment is not None:
        values = sorted({v for _, a in gathered for v in a})
        if len(values) < 2:
            raise CLIError(f"treatment column {args.treatment!r} has a single arm "
                           f"(every row is {values[0] if values else '?'}); a causal model needs "
                           f"treated and control rows")
    read_seconds = time.perf_counter() - t_read

    TIMER.reset()
    STATS.reset()
    from forest.cli.warmup import compile_once_per_node, variants_for

    with phase("compile"):
        # Before the progress bar starts: a first run on a machine compiles the
        # kernels (once per node), announced on rank 0 instead of a frozen bar.
        compile_once_per_node(comm, variants_for(args.model, values if args.treatment else None,
                                                 source.types.get(args.treatment) if args.treatment else None,
                                                 n_rows=source.n_rows,
                                                 n_estimators=est.get_params().get("n_estimators", 0),
                                                 quantized=bool(est.get_params().get("quantized", False))),
                              announce=lambda line: print(f"{PROG}: {line}", file=sys.stderr, flush=True))
    with phase("binning"):
        mapper = fitter.finish(comm)
        mapper.mark_categorical(choice.categorical)
        binned, message = guarded(dataio.bin_features, source, run, features, mapper.transform, n_local, encoders)
        agree(comm, message)
    codes, _ = binned
    progress = TreeProgress(comm.rank == 0 and not args.no_progress, f"{PROG} [{comm.size} rank(s)]")
    t_fit = time.perf_counter()
    from forest.io.checkpoint import CheckpointError

    try:
        _fit(est, args.model, (mapper, codes), features, shard, args, comm, progress,
             source.types.get(args.treatment) if args.treatment else None, checkpoint, correction)
    except CheckpointError as exc:   # raised on every rank at once: safe to turn into the one-line error
        raise CLIError(str(exc)) from None
    except ValueError as exc:
        # The estimator's own input checks (e.g. class labels of a classifier) fail on
        # every rank at once (forest.collective_checks): one line too. Anything else
        # may have failed on one rank alone and must abort the job.
        text = fit_input_error(exc)
        if text is None:
            raise
        if KINDS[args.model].class_labels and "label type" in text:
            text += f" (--outcome {args.outcome!r} of a gbdt-classifier must hold class labels)"
        raise CLIError(f"{type(est).__name__} refused the input: {text}") from None
    finally:
        progress.close()
    fit_seconds = time.perf_counter() - t_fit
    record_categories(est, coder, choice)

    metadata = {
        "model": args.model, "feature_names": features,
        "categorical_features": [f for f, c in zip(features, choice.categorical) if c],
        "treatment": args.treatment, "instrument": args.instrument,
        "outcome": args.outcome, "time": args.time, "event": args.event, "weight": args.weight,
        "cluster": args.cluster, "n_rows": source.n_rows,
        "n_ranks": comm.size, "data": [str(p) for p in source.paths],
    }
    message = None
    if comm.rank == 0:
        _, message = guarded(model_io.save, est, args.out, metadata)
    agree(comm, message)

    sent = col.allgather_object(comm, int(STATS.bytes_sent))
    if comm.rank == 0:
        n_cat = int(choice.categorical.sum())
        print(f"{PROG}: trained {type(est).__name__} on {source.n_rows} rows x {len(features)} features "
              f"({n_cat} categorical) with {comm.size} rank(s) in {fit_seconds:.2f} s; wrote {args.out}", file=sys.stderr)
        if args.verbose:
            rows = [("read data", f"{read_seconds:.3f}"), ("fit (wall)", f"{fit_seconds:.3f}"),
                    ("total (wall)", f"{time.perf_counter() - t_start:.3f}"),
                    ("bytes sent", _human_bytes(sum(sent))),
                    ("per rank max", _human_bytes(max(sent)))]
            print("per-phase time on rank 0 (seconds):", file=sys.stderr)
            print(TIMER.table(extra_rows=rows), file=sys.stderr)
    return 0


def _human_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024.0
    return f"{n} B"


def main(argv=None):
    """Console entry point of ``forest-train``."""
    return run_tool(PROG, _body, argv)


if __name__ == "__main__":
    sys.exit(main())

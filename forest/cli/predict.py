"""``forest-predict``: predict a model file on sharded data, keeping the input row order.

Every rank loads the model, reads its own contiguous run of row groups
(:mod:`forest.io.dataio`) one at a time and predicts it in slices of at most
:data:`PREDICT_BATCH_ROWS` rows, so a rank holds one row group of input and one
slice of float features and predictions, never its whole share. Rank 0 appends its
predictions to the output parquet file as it goes; every other rank appends its own
to a temporary Arrow IPC file (:func:`tempfile.gettempdir`, deleted at the end), so
all ranks predict at the same time with flat memory. Then rank 0 receives each
other rank's spilled batches in rank order, one Arrow IPC message per batch, and
appends them. Because row-group runs are contiguous and in file order, rank order is
input order. The file is written to a temporary name and renamed, so a failed run
never leaves a partial output at the target path. The last line reports the rows
written and the rows per second (slowest rank's prediction, and the whole run).
"""
import sys
import time

from forest.cli.common import (CLIError, Parser, agree, categorical_names, check_not_input, check_unique,
                               feature_input, guarded, load_model, model_feature_names, numbers, numeric_columns,
                               plan_source,
                               run_tool, world)
from forest.estimators.base import predicts_effects
from forest.cli.output import ParquetOutput, Spill, receive_in_rank_order, send_spill

PROG = "forest-predict"

#: Rows predicted at once: bounds a rank's float feature slice and its predictions.
PREDICT_BATCH_ROWS = 65_536


def build_parser():
    """The argument parser of ``forest-predict``."""
    p = Parser(
        prog=PROG,
        description="Predict with a model written by forest-train. Under `mpirun -np K` each "
                    "rank predicts its share of the row groups; the output keeps the input row order.",
        epilog="examples:\n"
               "  mpirun -np 8 forest-predict cf.model new.parquet --keep id --interval --out effects.parquet\n"
               "  forest-predict gb.model test.csv --out pred.parquet\n"
               "  forest-predict sf.model patients.parquet --times 365,730 --out survival.parquet",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="model file written by forest-train")
    p.add_argument("data", help="parquet file, directory of parquet files, glob, or CSV file")
    p.add_argument("--out", required=True, metavar="PRED.parquet", help="output parquet file")
    p.add_argument("--keep", nargs="+", default=[], metavar="COL",
                   help="input columns (e.g. ids) copied to the output")
    p.add_argument("--interval", action="store_true",
                   help="add confidence bounds: tau_lower/tau_upper (causal and instrumental models), "
                        "prediction_lower/prediction_upper (regression forests)")
    p.add_argument("--alpha", type=float, default=0.05,
                   help="1 - confidence level of --interval (default 0.05)")
    p.add_argument("--times", type=numbers, metavar="T1,T2,...",
                   help="survival models: add the predicted survival probability P(T > t | x) at these times, "
                        "one column survival_<t> each (the prediction column is the risk score)")
    return p


def prediction_columns(est, X, interval, alpha, is_causal, times=None):
    """Prediction columns for rows ``X``.

    Parameters
    ----------
    est : fitted estimator
    X : ndarray or pyarrow.Table, shape (n, n_features)
        See :func:`forest.cli.common.feature_input`.
    interval : bool
    alpha : float
    is_causal : bool
    times : sequence of float, optional
        A survival model's times: ``survival_<t>`` columns.

    Returns
    -------
    dict of str -> ndarray, shape (n,)
        ``tau`` (+ ``tau_lower``, ``tau_upper``) for causal models; ``prediction``
        (+ ``proba_<class>`` for classifiers) otherwise; ``prediction_q<level>`` per level of a
        quantile forest; ``survival_<t>`` per time of a survival model. Several effects get
        ``tau_<k>`` columns (``k``: the arm of a categorical treatment, its level as in
        ``classes_``; else the treatment component or outcome, from 0), several arms and
        outcomes ``tau_<arm>_<m>``.
    """
    import numpy as np

    name = "tau" if is_causal else "prediction"
    out = {}

    from forest.report.summary import column_names

    def put(prefix, arr):
        # One column per entry of the trailing axes (forest.report.summary.column_names: effects
        # of a categorical treatment named by arm, tau_2 = arm 2 minus the control).
        arr = np.asarray(arr)
        flat = arr.reshape(arr.shape[0], int(np.prod(arr.shape[1:], dtype=np.int64)))  # also for 0 rows
        for j, label in enumerate(column_names(est, prefix, arr.shape[1:])):
            out[label] = flat[:, j]

    put(name, est.predict(X))
    if interval:
        lower, upper = est.predict_interval(X, alpha=alpha)
        put(f"{name}_lower", lower)
        put(f"{name}_upper", upper)
    if hasattr(est, "predict_proba") and hasattr(est, "classes_"):
        proba = np.asarray(est.predict_proba(X))
        for k, c in enumerate(est.classes_):
            out[f"proba_{c}"] = proba[:, k]
    if times is not None:
        surv = est.predict_survival_function(X, times)
        for k, t in enumerate(times):
            out[f"survival_{t:g}"] = surv[:, k]
    return out


def _probe_columns(est, names, interval, alpha, is_causal, times=None):
    """The output columns, by predicting one dummy row: ``{name: array of one value}``.

    The row's categorical features are missing (a null reads as missing whatever the
    categories' type), its numeric ones 0.
    """
    import pyarrow as pa

    cats = set(categorical_names(est, names))
    row = {n: pa.nulls(1, pa.string()) if n in cats else pa.array([0.0]) for n in names}
    return prediction_columns(est, feature_input(est, pa.table(row), names), interval, alpha, is_causal, times)


def _body(argv):
    args = build_parser().parse_args(argv)
    if not 0.0 < args.alpha < 1.0:
        raise CLIError(f"--alpha must be in (0, 1), got {args.alpha}")
    check_unique(args.keep, "--keep")  # an output with two columns of one name cannot be read back
    if args.out.lower().endswith((".csv", ".tsv", ".txt", ".json")):
        # the output is always Parquet: a .csv name would hold bytes no CSV reader takes
        raise CLIError(f"--out {args.out!r}: forest-predict writes Parquet; give the file a .parquet name")
    from forest.cli import policy
    if policy.is_policy_model(args.model):  # policy trees: action (and budget allocation) per row
        return policy.predict(args.model, args.data, args.out, args.keep, interval=args.interval)

    import pyarrow as pa
    import pyarrow.parquet as pq

    from forest.io import model_io
    from native import collectives as col

    comm = world()

    def _load():
        if comm.rank == 0:
            check_not_input(args.out, [args.model])
        header, est = load_model(args.model)
        meta = header.get("metadata", {})
        names = model_feature_names(est, header)
        if not names:
            raise ValueError(f"model file {args.model!r} does not record its feature names")
        causal = meta.get("model") == "causal" or predicts_effects(est)
        if args.interval and not (hasattr(est, "predict_interval") and not hasattr(est, "predict_proba")):
            raise ValueError(f"model file {args.model!r} holds a {type(est).__name__}; --interval "
                             f"needs a causal, instrumental or regression forest")
        if args.times is not None:
            if not hasattr(est, "predict_survival_function"):
                raise ValueError(f"model file {args.model!r} holds a {type(est).__name__}; --times needs a survival "
                                 "model")
            if len({f"{t:g}" for t in args.times}) != len(args.times):
                raise ValueError("--times must be distinct")
        if comm.rank == 0:
            model_io.check_writable(args.out)
        return est, names, causal

    loaded, message = guarded(_load)
    agree(comm, message)
    est, names, causal = loaded
    # The output columns are known before any data is read (proba_<class>, tau_<k>
    # and the interval columns depend on the model): a kept id column of the same
    # name would make the output ambiguous.
    outputs, message = guarded(_probe_columns, est, names, args.interval, args.alpha, causal, args.times)
    agree(comm, message)
    clash = sorted(set(args.keep) & set(outputs))
    if clash:
        raise CLIError(f"--keep column {clash[0]!r} would clash with an output column "
                       f"(outputs: {', '.join(outputs)})")

    # Categorical features are read as they are (dictionary, string or numbers) and coded
    # by the model itself (its category_coder_), as for any pyarrow table.
    source, _, run, _, _ = plan_source(comm, args.data, lambda s: numeric_columns(s, est, names),
                                       keep=list(dict.fromkeys(list(args.keep) + categorical_names(est, names))),
                                       out=args.out)
    schema = source.arrow_schema().empty_table().select(list(args.keep)).schema
    for k, v in outputs.items():
        schema = schema.append(pa.field(k, pa.array(v).type))
    start = time.perf_counter()

    def _open():
        return ParquetOutput(args.out, schema) if comm.rank == 0 else Spill(schema)

    sink, message = guarded(_open)
    agree(comm, message)

    def _predict():
        # One row group at a time, predicted in slices: only a slice's float features exist at once.
        from forest.io import dataio

        rows, seconds = 0, 0.0
        wanted = list(dict.fromkeys(list(names) + list(args.keep)))
        for group in dataio.iter_row_groups(source, run, wanted, dataio.ReadStats()):
            for lo in range(0, group.num_rows, PREDICT_BATCH_ROWS):
                part = group.slice(lo, PREDICT_BATCH_ROWS)
                t0 = time.perf_counter()
                cols = prediction_columns(est, feature_input(est, part, names), args.interval, args.alpha, causal,
                                          args.times)
                seconds += time.perf_counter() - t0
                table = part.select(list(args.keep))
                for k, v in cols.items():
                    table = table.append_column(k, pa.array(v))
                sink.write(table)
                if getattr(sink, "error", None):
                    raise OSError(sink.error)
                rows += part.num_rows
        return rows, seconds

    try:
        counts, message = guarded(_predict)
        agree(comm, message)
        if comm.rank == 0:
            receive_in_rank_order(comm, sink)
            message = sink.finish()
        else:
            send_spill(comm, sink)
            message = None
        agree(comm, message)
    finally:
        sink.discard()
    per_rank = col.allgather_object(comm, counts)
    if comm.rank == 0:
        total = pq.ParquetFile(args.out).metadata.num_rows
        wall = time.perf_counter() - start
        slowest = max(per_rank, key=lambda c: c[1])
        rate = f"{slowest[0] / slowest[1]:,.0f} rows/s per rank" if slowest[1] > 0 else "no rows"
        print(f"{PROG}: wrote {total} rows ({', '.join(schema.names)}) to {args.out} in {wall:.2f} s "
              f"({total / max(wall, 1e-9):,.0f} rows/s; prediction: {rate}, slowest of {comm.size})",
              file=sys.stderr)
    return 0


def main(argv=None):
    """Console entry point of ``forest-predict``."""
    return run_tool(PROG, _body, argv)


if __name__ == "__main__":
    sys.exit(main())

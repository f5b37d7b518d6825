"""``forest-predict``: predict a model file on sharded data, keeping the input row order.

Every rank loads the model, reads its own contiguous run of row groups
(:mod:`forest.dataio`) and predicts those rows. Rank 0 then writes the output
parquet file: its own rows first, then each other rank's rows as they arrive, in
rank order (each rank sends its result as one Arrow IPC message over the
communicator). Because row-group runs are contiguous and in file order, rank order
is input order. Rank 0 holds at most one rank's predictions at a time besides its
own. The file is written to a temporary name and renamed, so a failed run never
leaves a partial output at the target path.
"""
import sys

from forest.cli.common import CLIError, Parser, agree, guarded, plan_source, run_tool, world

PROG = "forest-predict"
_TAG = 7421  # point-to-point tag of the output hand-over to rank 0


def build_parser():
    """The argument parser of ``forest-predict``."""
    p = Parser(
        prog=PROG,
        description="Predict with a model written by forest-train. Under `mpirun -np K` each "
                    "rank predicts its share of the row groups; the output keeps the input row order.",
        epilog="examples:\n"
               "  mpirun -np 8 forest-predict cf.model new.parquet --keep id --interval --out effects.parquet\n"
               "  forest-predict gb.model test.csv --out pred.parquet",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter,
    )
    p.add_argument("model", help="model file written by forest-train")
    p.add_argument("data", help="parquet file, directory of parquet files, glob, or CSV file")
    p.add_argument("--out", required=True, metavar="PRED.parquet", help="output parquet file")
    p.add_argument("--keep", nargs="+", default=[], metavar="COL",
                   help="input columns (e.g. ids) copied to the output")
    p.add_argument("--interval", action="store_true",
                   help="add tau_lower/tau_upper confidence bounds (causal models)")
    p.add_argument("--alpha", type=float, default=0.05,
                   help="1 - confidence level of --interval (default 0.05)")
    return p


def prediction_columns(est, X, interval, alpha, is_causal):
    """Prediction columns for rows ``X``.

    Parameters
    ----------
    est : fitted estimator
    X : ndarray, shape (n, n_features)
    interval : bool
    alpha : float
    is_causal : bool

    Returns
    -------
    dict of str -> ndarray, shape (n,)
        ``tau`` (+ ``tau_lower``, ``tau_upper``) for causal models; ``prediction``
        (+ ``proba_<class>`` for classifiers) otherwise. Multi-output effects get
        ``tau_<k>`` columns.
    """
    import numpy as np

    name = "tau" if is_causal else "prediction"
    out = {}

    def put(prefix, arr):
        arr = np.asarray(arr)
        if arr.ndim == 1:
            out[prefix] = arr
        else:
            for k in range(arr.shape[1]):
                out[f"{prefix}_{k}" if arr.shape[1] > 1 else prefix] = arr[:, k]

    put(name, est.predict(X))
    if interval:
        lower, upper = est.predict_interval(X, alpha=alpha)
        put(f"{name}_lower", lower)
        put(f"{name}_upper", upper)
    if hasattr(est, "predict_proba") and hasattr(est, "classes_"):
        proba = np.asarray(est.predict_proba(X))
        for k, c in enumerate(est.classes_):
            out[f"proba_{c}"] = proba[:, k]
    return out


def _empty_columns(est, n_features, interval, alpha, is_causal):
    """Column names and dtypes for a rank with no rows, by predicting one dummy row."""
    import numpy as np

    probe = prediction_columns(est, np.zeros((1, n_features)), interval, alpha, is_causal)
    return {k: v[:0] for k, v in probe.items()}


def _table_bytes(table):
    import numpy as np
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return np.frombuffer(sink.getvalue(), dtype=np.uint8)


def _table_from(buf):
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(buf.tobytes())).read_all()


def _write_in_rank_order(comm, table, path):
    """Rank 0: write its table, then every other rank's, in rank order; atomic rename.

    Every other rank's message is received even after a write error, so no rank is
    left blocked in its send.

    Returns
    -------
    str or None
        The error message, if writing failed.
    """
    import os
    import tempfile

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    os.close(fd)
    message, writer = None, None
    try:
        writer = pq.ParquetWriter(tmp, table.schema)
        writer.write_table(table)
    except (OSError, pa.ArrowException) as exc:
        message = f"cannot write {path!r}: {exc}"
    for r in range(1, comm.size):
        n = np.zeros(1, dtype=np.int64)
        comm.recv(n, r, _TAG)
        buf = np.empty(int(n[0]), dtype=np.uint8)
        comm.recv(buf, r, _TAG)
        if message is None:
            try:
                part = _table_from(buf)
                if part.num_rows:
                    writer.write_table(part.cast(table.schema))
            except (OSError, pa.ArrowException) as exc:
                message = f"cannot write {path!r}: {exc}"
    try:
        if writer is not None:
            writer.close()
        if message is None:
            os.chmod(tmp, 0o666 & ~_umask())
            os.replace(tmp, path)
    except OSError as exc:
        message = message or f"cannot write {path!r}: {exc}"
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return message


def _umask():
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def _body(argv):
    args = build_parser().parse_args(argv)
    if not 0.0 < args.alpha < 1.0:
        raise CLIError(f"--alpha must be in (0, 1), got {args.alpha}")
    from forest.cli import policy
    if policy.is_policy_model(args.model):  # policy trees: action (and budget allocation) per row
        return policy.predict(args.model, args.data, args.out, args.keep, interval=args.interval)

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from forest import model_io

    comm = world()

    def _load():
        header = model_io.read_header(args.model)
        est = model_io.load(args.model)
        meta = header.get("metadata", {})
        names = header.get("feature_names") or meta.get("feature_names")
        if not names:
            raise ValueError(f"model file {args.model!r} does not record its feature names")
        causal = meta.get("model") == "causal" or hasattr(est, "predict_interval")
        if args.interval and not hasattr(est, "predict_interval"):
            raise ValueError(f"model file {args.model!r} holds a {type(est).__name__}; --interval "
                             f"needs a causal model")
        if comm.rank == 0:
            model_io.check_writable(args.out)
        return est, [str(n) for n in names], causal

    loaded, message = guarded(_load)
    agree(comm, message)
    est, names, causal = loaded
    # The output columns are known before any data is read (proba_<class>, tau_<k>
    # and the interval columns depend on the model): a kept id column of the same
    # name would make the output ambiguous.
    outputs, message = guarded(_empty_columns, est, len(names), args.interval, args.alpha, causal)
    agree(comm, message)
    clash = sorted(set(args.keep) & set(outputs))
    if clash:
        raise CLIError(f"--keep column {clash[0]!r} would clash with an output column "
                       f"(outputs: {', '.join(outputs)})")

    source, _, run, _, _ = plan_source(comm, args.data, names, keep=args.keep)

    def _predict():
        # One row group at a time: only that group's float features exist at once.
        from forest import dataio

        parts = []
        wanted = list(dict.fromkeys(list(names) + list(args.keep)))
        for group in dataio.iter_row_groups(source, run, wanted, dataio.ReadStats()):
            if group.num_rows == 0:
                continue
            cols = prediction_columns(est, dataio.feature_block(group, names), args.interval, args.alpha, causal)
            table = group.select(list(args.keep))
            for k, v in cols.items():
                table = table.append_column(k, pa.array(v))
            parts.append(table)
        if parts:
            return pa.concat_tables(parts)
        table = source.arrow_schema().empty_table().select(list(args.keep))
        for k, v in _empty_columns(est, len(names), args.interval, args.alpha, causal).items():
            table = table.append_column(k, pa.array(v))
        return table

    table, message = guarded(_predict)
    agree(comm, message)

    message = None
    if comm.rank == 0:
        message = _write_in_rank_order(comm, table, args.out)
    else:
        buf = _table_bytes(table)
        comm.send(np.array([buf.size], dtype=np.int64), 0, _TAG)
        comm.send(buf, 0, _TAG)
    agree(comm, message)
    if comm.rank == 0:
        total = pq.ParquetFile(args.out).metadata.num_rows
        print(f"{PROG}: wrote {total} rows ({', '.join(c for c in table.column_names)}) to {args.out}",
              file=sys.stderr)
    return 0


def main(argv=None):
    """Console entry point of ``forest-predict``."""
    return run_tool(PROG, _body, argv)


if __name__ == "__main__":
    sys.exit(main())

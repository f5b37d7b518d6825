"""What the three tools share: rank-aware parsing and printing, agreed errors, data loading.

Error policy under ``mpirun``
-----------------------------
A bad input must end every rank with a non-zero exit code and one message, never a
hang. Every check that could fail differently on different ranks (reading a row
group, NaN in the outcome, ...) is turned into an error string on the rank that
saw it; :func:`agree` then all-gathers those strings, so every rank learns the
first one (in rank order) at the same collective and raises :class:`CLIError`
together. :func:`run_tool` prints that message on rank 0 only and exits with
status 2 on every rank. Anything else that escapes (a bug, a crash mid-training)
goes to :func:`native.errors.abort_on_uncaught`, which aborts the whole job with
the failing rank's message.

The rank is taken from the launcher's environment (``PMI_RANK`` and friends) for
``--help`` and argument errors, so those answer before MPI is even started.
"""
import argparse
import os
import sys

EXIT_BAD_INPUT = 2

#: Environment variables launchers set to the process's rank (MPICH/Hydra, Open MPI, Slurm).
_RANK_VARS = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID", "SLURM_PROCID")


class CLIError(Exception):
    """An input problem every rank agrees on; the message is printed once."""


def env_rank():
    """This process's rank according to the launcher's environment (0 when not launched)."""
    for var in _RANK_VARS:
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


class Parser(argparse.ArgumentParser):
    """ArgumentParser that prints help and usage errors on rank 0 only."""

    def _print_message(self, message, file=None):
        if env_rank() == 0:
            super()._print_message(message, file)

    def exit(self, status=0, message=None):
        if message and env_rank() == 0:
            sys.stderr.write(message)
        sys.exit(status)


def world():
    """The world communicator; installs the job-wide abort on uncaught exceptions."""
    from native.comm import world as _world
    from native.errors import abort_on_uncaught

    comm = _world()
    abort_on_uncaught(comm)
    return comm


def agree(comm, message):
    """Raise :class:`CLIError` on every rank if any rank has an error message.

    Parameters
    ----------
    comm : native.comm.Communicator
    message : str or None
        This rank's error, or None.

    Raises
    ------
    CLIError
        With the first message in rank order, on every rank.
    """
    from native import collectives as col

    messages = col.allgather_object(comm, message)
    for m in messages:
        if m is not None:
            raise CLIError(m)


def guarded(fn, *args, **kwargs):
    """Call ``fn`` and return ``(result, None)``, or ``(None, message)`` on a ValueError/OSError.

    Used around per-rank work whose failure must be agreed on with :func:`agree`.
    """
    try:
        return fn(*args, **kwargs), None
    except (ValueError, OSError) as exc:
        return None, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def run_tool(prog, body, argv=None):
    """Run a tool's ``body(argv)`` with the shared error policy; return its exit status.

    Parameters
    ----------
    prog : str
        Tool name, the prefix of error lines.
    body : callable
        ``body(argv) -> int``.
    argv : list of str, optional
    """
    try:
        return body(argv)
    except CLIError as exc:
        if env_rank() == 0:
            sys.stderr.write(f"{prog}: error: {exc}\n")
            sys.stderr.flush()
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


def model_feature_names(est, header):
    """The feature columns a loaded model reads: its ``feature_names_in_``.

    Files written before estimators recorded their names carry them only in the
    header (``feature_names``, or ``metadata.feature_names``); None when neither has them.
    """
    names = getattr(est, "feature_names_in_", None)
    if names is None:
        names = header.get("feature_names") or header.get("metadata", {}).get("feature_names")
    return None if names is None else [str(n) for n in names]


def feature_input(est, table, names):
    """What to pass to ``est.predict`` for the columns ``names`` of an Arrow table.

    A model that records its feature names gets the named columns, so the estimator
    checks them as it does for any table; an older model gets a float64 matrix in
    ``names`` order (and no warning about the names it does not know).
    """
    if getattr(est, "feature_names_in_", None) is not None:
        return table.select(list(names))
    from forest import dataio

    return dataio.feature_block(table, list(names))


#: The estimators a model file read by forest-predict / forest-report may hold.
ESTIMATORS = (("forest.causal_forest", "CausalForest"), ("forest.instrumental_forest", "InstrumentalForest"),
              ("forest.regression_forest", "RegressionForest"),
              ("forest.gbdt", "GBDTRegressor"), ("forest.gbdt", "GBDTClassifier"))


def load_model(path):
    """The header and estimator of a model file; ``ModelFormatError`` (one line) otherwise.

    Parameters
    ----------
    path : str

    Returns
    -------
    header : dict
    estimator : CausalForest, RegressionForest, GBDTRegressor or GBDTClassifier
        Checked as a whole on load (:mod:`forest.model_checks`); a file holding
        anything else (a bare tree or bin mapper) is refused.
    """
    import importlib

    from forest import model_io

    classes = tuple(getattr(importlib.import_module(m), c) for m, c in ESTIMATORS)
    return model_io.read_header(path), model_io.load(path, expect=classes)


def check_not_input(out, inputs, flag="--out"):
    """Raise ``ValueError`` when the output path names one of the input files.

    Paths are compared after resolving ``..`` and symbolic links, and by file identity
    where both exist (hard links, bind mounts), so no spelling of an input slips by.

    Parameters
    ----------
    out : str
        The output path the tool would write (replace).
    inputs : iterable of str
        Files the tool reads (the model, every data file).
    flag : str
        The option that named ``out``, for the message.
    """
    target = os.path.realpath(out)
    for path in inputs:
        same = os.path.realpath(path) == target
        if not same and os.path.exists(out) and os.path.exists(path):
            same = os.path.samefile(out, path)
        if same:
            raise ValueError(f"{flag} {out!r} is an input of this run ({path!r}); refusing to overwrite it")


def plan_source(comm, spec, numeric, keep=(), require_rows=True, out=None):
    """Open the data on rank 0, check the columns, broadcast the plan; errors are agreed on.

    Parameters
    ----------
    comm : native.comm.Communicator
    spec : str
        Data argument (file, directory, glob, CSV).
    numeric : list of str or callable
        Columns that must be numeric, or ``numeric(source) -> list of str`` to choose
        them from the schema (run on rank 0; may raise ``DataError``).
    keep : list of str
        Columns carried through unchanged (any type).
    require_rows : bool
        Fail when the data holds no rows at all.
    out : str, optional
        The tool's ``--out`` path: fail when it is one of the data files.

    Returns
    -------
    source : forest.dataio.DataSource
    numeric : list of str
    run : (int, int)
        This rank's ``(first row group, stop row group)``.
    offset : int
        Global row id of this rank's first row.
    n_local : int
        Rows this rank holds.
    """
    from forest import dataio
    from native import collectives as col

    plan, message = None, None
    if comm.rank == 0:
        def _plan():
            source = dataio.open_source(spec)
            names = list(numeric(source) if callable(numeric) else numeric)
            dataio.check_columns(source, numeric=names, any_type=keep)
            if require_rows and source.n_rows == 0:
                raise dataio.DataError(f"{spec!r} holds no rows (empty file)")
            if out is not None:
                check_not_input(out, source.paths)
            return source, names
        plan, message = guarded(_plan)
    plan, message = col.bcast_object(comm, (plan, message), root=0)
    if message is not None:
        raise CLIError(message)
    source, names = plan
    rows = [g[2] for g in source.groups]
    runs = dataio.assign_row_groups(rows, comm.size)
    per_rank = [sum(rows[a:b]) for a, b in runs]
    run = runs[comm.rank]
    # Rows held by lower ranks: also right for a rank with no row group, whose run
    # (0, 0) says nothing about where it sits.
    offset = sum(per_rank[:comm.rank])
    n_local = per_rank[comm.rank]
    return source, names, run, offset, n_local


def load_rows(comm, spec, numeric, keep=(), require_rows=True):
    """Plan on rank 0, then read this rank's row groups; errors are agreed on.

    Parameters are those of :func:`plan_source`.

    Returns
    -------
    source : forest.dataio.DataSource
    numeric : list of str
        The columns read as float64.
    shard : forest.dataio.Shard
    offset : int
        Global row id of this rank's first row.
    """
    from forest import dataio

    source, names, run, offset, _ = plan_source(comm, spec, numeric, keep, require_rows)
    shard, message = guarded(dataio.read_shard, source, run, numeric=names, keep=keep)
    agree(comm, message)
    return source, names, shard, offset

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


def numbers(text):
    """A comma-separated list of numbers (``--quantiles 0.1,0.5,0.9``, ``--times 365,730``) as a tuple of floats."""
    return tuple(float(part) for part in text.split(","))


def __getattr__(name):
    # forest.io.dataio.feature_input under the tools' usual import, loaded on use: this
    # module stays light (numpy-free) for a start-up that only parses arguments.
    if name == "feature_input":
        from forest.io.dataio import feature_input

        return feature_input
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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

    try:
        comm = _world()
    except ValueError as exc:  # a bad HISTFOREST_* setting: the same on every rank
        raise CLIError(str(exc)) from None
    abort_on_uncaught(comm)
    share_cores(comm)
    return comm


def usable_cores():
    """Cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def share_cores(comm, environ=None):
    """Give each rank its share of the node's cores as Numba threads.

    Numba starts as many threads per process as the machine has cores, so ``k`` ranks
    on one node would run ``k`` times too many threads, each rank's work fighting the
    others' for cores (and a collective waits for the slowest). Unless the user set
    ``NUMBA_NUM_THREADS``, each rank uses ``max(1, usable cores // ranks on its node)``
    threads; the ranks of a node are those that share memory (the communicator's
    ``node_keys``; ``HISTFOREST_RANKS_PER_NODE`` does not change it). A rank whose
    launcher bound it to fewer cores than the machine has (Slurm's ``--cpus-per-task``,
    ``mpirun --bind-to``) already holds its share: it uses all of its cores.

    Parameters
    ----------
    comm : native.comm.Communicator
    environ : Mapping, optional
        Where ``NUMBA_NUM_THREADS`` is looked up (``os.environ`` by default).

    Returns
    -------
    int or None
        The threads set, or None when left alone (one rank, or the user's setting).
    """
    env = os.environ if environ is None else environ
    if comm.size == 1 or env.get("NUMBA_NUM_THREADS"):
        return None
    keys = comm.node_keys()
    on_node = sum(1 for k in keys if k == keys[comm.rank])
    import numba

    cores = usable_cores()
    share = cores if cores < (os.cpu_count() or cores) else cores // on_node
    threads = max(1, min(share, numba.config.NUMBA_NUM_THREADS))
    numba.set_num_threads(threads)
    return threads


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


def categorical_names(est, names):
    """The model's categorical feature columns (those its ``category_coder_`` codes), in ``names``."""
    coder = getattr(est, "category_coder_", None)
    return [] if coder is None else [names[int(f)] for f in coder.columns_]


def numeric_columns(source, est, names):
    """The model's numeric feature columns, refusing one that holds categories in the data.

    A categorical column (dictionary, string) that was numeric when the model was fitted
    gets one line here, before any row is read (the estimator would refuse each batch).

    Raises
    ------
    forest.io.dataio.DataError
    """
    from forest.io.dataio import DataError, is_category_type

    cats = set(categorical_names(est, names))
    schema = source.arrow_schema()
    for name in names:
        if name not in cats and name in source.types and is_category_type(schema.field(name).type):
            raise DataError(f"column {name!r} holds categories ({source.types[name]}) in {source.paths[0]!r}, but "
                            "it was numeric when the model was fitted; pass it as numbers (or retrain with it in the "
                            "data as categories)")
    return [n for n in names if n not in cats]


def load_model(path):
    """The header and estimator of a model file; ``ModelFormatError`` (one line) otherwise.

    Parameters
    ----------
    path : str

    Returns
    -------
    header : dict
    estimator : CausalForest, RegressionForest, GBDTRegressor or GBDTClassifier
        Checked as a whole on load (:mod:`forest.io.model_checks`); a file holding
        anything else (a bare tree or bin mapper) is refused.
    """
    from forest.estimators.kinds import estimator_classes
    from forest.io import model_io

    return model_io.read_header(path), model_io.load(path, expect=estimator_classes())


def _same_path(a, b):
    """Whether two paths name the same file or directory (after ``..`` and links; by identity when both exist)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    if os.path.exists(a) and os.path.exists(b):
        try:
            return os.path.samefile(a, b)
        except OSError:
            return False
    return False


def check_not_input(out, inputs, flag="--out", data=None):
    """Raise ``ValueError`` when the output path names one of the inputs, or lies among the data.

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
    data : str, optional
        The data argument as given (see :func:`forest.io.dataio.resolve_paths`): an output
        in that directory, or matching that glob, is refused too, since a later run on
        the same data argument would take it for data (or fail on its schema).
    """
    for path in inputs:
        if _same_path(out, path):
            raise ValueError(f"{flag} {out!r} is an input of this run ({path!r}); refusing to overwrite it")
    if data is not None:
        check_not_in_data(out, data, flag)


def check_not_in_data(out, data, flag="--out"):
    """Raise ``ValueError`` when ``out`` lies in the data directory or matches the data glob ``data``.

    Mirrors :func:`forest.io.dataio.resolve_paths`: a directory means the files in it, a
    glob (that is not itself a file) the files it matches.
    """
    import fnmatch
    import glob

    if os.path.isdir(data):
        if _same_path(out, data):
            raise ValueError(f"{flag} {out!r} is the input directory {data!r}")
        parent = os.path.dirname(os.path.abspath(out)) or "."
        if _same_path(parent, data):
            why = (f" (a later run on {data!r} would read it as data)"
                   if out.lower().endswith((".parquet", ".parq", ".csv")) else "")
            raise ValueError(f"{flag} {out!r} lies in the input directory {data!r}; write it outside the "
                             f"data directory{why}")
        return
    if os.path.isfile(data) or not glob.has_magic(data):
        return
    pattern = os.path.normpath(os.path.abspath(data)).split(os.sep)
    for spelling in {os.path.normpath(os.path.abspath(out)), os.path.realpath(out)}:
        parts = spelling.split(os.sep)
        if len(parts) == len(pattern) and all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts, pattern)):
            raise ValueError(f"{flag} {out!r} matches the input pattern {data!r}; write it elsewhere "
                             f"(a later run on {data!r} would read it as data)")


def check_unique(names, flag):
    """Raise :class:`CLIError` when the column list of option ``flag`` names a column twice."""
    seen = set()
    for name in names or ():
        if name in seen:
            raise CLIError(f"{flag} names column {name!r} twice")
        seen.add(name)


def fit_input_error(exc):
    """The one-line message of an estimator's input error raised by ``fit``, or None for anything else.

    Estimators validate ``fit``'s input collectively (:mod:`forest.collective_checks`,
    in their ``_fit_inputs``): a bad input raises the same :class:`RankInputError` on
    every rank (with one rank the check's own ``ValueError``, marked), and the checks
    after the exchange, on identical summaries, raise :class:`AgreedError` on every
    rank. Such an error (:func:`forest.collective_checks.is_agreed`) may become the
    tools' one-line error (every rank raises :class:`CLIError` together). Any other
    exception, which may have been raised on one rank alone while the others wait in
    a collective, gets None: it must abort the job.

    Parameters
    ----------
    exc : BaseException

    Returns
    -------
    str or None
    """
    from forest.collective_checks import RankInputError, is_agreed

    if not is_agreed(exc):
        return None
    text = str(exc.messages[0] if isinstance(exc, RankInputError) else exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


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
        The tool's ``--out`` path: fail when it is one of the data files, or lies in the
        data directory or matches the data glob (:func:`check_not_input`).

    Returns
    -------
    source : forest.io.dataio.DataSource
    numeric : list of str
    run : (int, int)
        This rank's ``(first row group, stop row group)``.
    offset : int
        Global row id of this rank's first row.
    n_local : int
        Rows this rank holds.
    """
    from forest.io import dataio
    from native import collectives as col

    plan, message = None, None
    if comm.rank == 0:
        def _plan():
            source = dataio.open_source(spec)
            if out is not None:
                check_not_input(out, source.paths, data=spec)
            names = list(numeric(source) if callable(numeric) else numeric)
            dataio.check_columns(source, numeric=names, any_type=keep)
            if require_rows and source.n_rows == 0:
                raise dataio.DataError(f"{spec!r} holds no rows (empty file)")
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


def load_rows(comm, spec, numeric, keep=(), require_rows=True, out=None):
    """Plan on rank 0, then read this rank's row groups; errors are agreed on.

    Parameters are those of :func:`plan_source`.

    Returns
    -------
    source : forest.io.dataio.DataSource
    numeric : list of str
        The columns read as float64.
    shard : forest.io.dataio.Shard
    offset : int
        Global row id of this rank's first row.
    """
    from forest.io import dataio

    source, names, run, offset, _ = plan_source(comm, spec, numeric, keep, require_rows, out=out)
    shard, message = guarded(dataio.read_shard, source, run, numeric=names, keep=keep)
    agree(comm, message)
    return source, names, shard, offset

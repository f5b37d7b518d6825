"""The mechanics of ending a whole MPI job when one rank fails, given its communicator.

:mod:`native.comm` installs the hook when it creates the world; :mod:`native.errors`
offers both to programs, with the world as their default communicator.
"""
import contextlib
import sys
import traceback


def abort_with_traceback(comm, etype, value, tb):
    """``comm.abort`` with the rank's traceback, every line prefixed with its rank."""
    lines = "".join(traceback.format_exception(etype, value, tb)).rstrip().splitlines()
    # comm.abort prefixes the first line; prefix the rest so interleaved output from
    # several ranks stays attributable.
    body = "\n".join([lines[-1]] + [f"[rank {comm.rank}] {line}" for line in lines])
    comm.abort(f"uncaught exception, aborting all ranks: {body}", code=1)


def install_abort_hook(comm):
    """Install the ``sys.excepthook`` of :func:`native.errors.abort_on_uncaught` for ``comm``; returns it."""
    previous = getattr(sys.excepthook, "_histforest_previous", sys.excepthook)

    def hook(etype, value, tb):
        if comm.size <= 1:
            previous(etype, value, tb)
            return
        abort_with_traceback(comm, etype, value, tb)

    hook._histforest_previous = previous
    sys.excepthook = hook
    return hook


@contextlib.contextmanager
def guard(comm):
    """The context manager of :func:`native.errors.job_guard` for ``comm``."""
    try:
        yield comm
    except SystemExit as exc:
        if comm.size > 1 and exc.code not in (None, 0):
            comm.abort(f"exited with status {exc.code!r}, aborting all ranks", code=1)
        raise
    except BaseException as exc:
        if comm.size > 1:
            abort_with_traceback(comm, type(exc), exc, exc.__traceback__)
        raise

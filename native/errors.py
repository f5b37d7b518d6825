"""Failure handling across ranks: mismatch errors and job-wide abort on a crash.

Under ``mpirun`` an exception on one rank would otherwise leave every other rank
blocked in its next collective forever. :func:`abort_on_uncaught` turns an uncaught
exception anywhere into ``MPI_Abort`` with the rank's traceback, which the launcher
propagates to every rank within seconds; :func:`job_guard` does the same for a block
of code and also catches ``sys.exit`` with a non-zero status.
"""
import contextlib
import sys
import traceback


class CollectiveMismatchError(RuntimeError):
    """Ranks called different collectives, sizes or dtypes (raised on every rank)."""


class CollectiveTimeoutError(CollectiveMismatchError):
    """In check mode, a rank never arrived at the collective the others are in."""


def _world(comm):
    if comm is None:
        from .comm import world

        comm = world()
    return comm


def _abort_with_traceback(comm, etype, value, tb):
    lines = "".join(traceback.format_exception(etype, value, tb)).rstrip().splitlines()
    # comm.abort prefixes the first line; prefix the rest so interleaved output from
    # several ranks stays attributable.
    body = "\n".join([lines[-1]] + [f"[rank {comm.rank}] {line}" for line in lines])
    comm.abort(f"uncaught exception, aborting all ranks: {body}", code=1)


def abort_on_uncaught(comm=None):
    """Install a ``sys.excepthook`` that aborts the whole job on an uncaught exception.

    With ``comm.size > 1`` the hook writes ``[rank r] <traceback>`` to stderr and calls
    ``comm.abort`` (``MPI_Abort``), so the launcher ends every rank and exits non-zero
    instead of leaving the others waiting. With one rank the previous hook runs
    unchanged. Calling it again replaces the hook installed before (it never chains
    onto itself).

    ``sys.exit(code)`` does not reach an excepthook, and a rank that exits while the
    others wait in a collective hangs the job just the same; wrap the program's main
    body in :func:`job_guard` to cover that too.

    Parameters
    ----------
    comm : native.comm.Communicator, optional
        Defaults to :func:`native.comm.world`.

    Returns
    -------
    callable
        The installed hook.
    """
    comm = _world(comm)
    previous = getattr(sys.excepthook, "_histforest_previous", sys.excepthook)

    def hook(etype, value, tb):
        if comm.size <= 1:
            previous(etype, value, tb)
            return
        _abort_with_traceback(comm, etype, value, tb)

    hook._histforest_previous = previous
    sys.excepthook = hook
    return hook


@contextlib.contextmanager
def job_guard(comm=None):
    """Context manager: if its body fails on any rank, end the whole MPI job.

    An exception, or ``SystemExit`` with a non-zero code (``sys.exit(1)``,
    ``argparse`` errors), leaving the body on a job of more than one rank calls
    ``comm.abort`` with the rank's message, so no other rank is left waiting in a
    collective. With one rank, or on success, it does nothing. ``SystemExit(0)``
    passes through (a clean early exit is the program's own business).

    Parameters
    ----------
    comm : native.comm.Communicator, optional
        Defaults to :func:`native.comm.world`.
    """
    comm = _world(comm)
    try:
        yield comm
    except SystemExit as exc:
        if comm.size > 1 and exc.code not in (None, 0):
            comm.abort(f"exited with status {exc.code!r}, aborting all ranks", code=1)
        raise
    except BaseException as exc:
        if comm.size > 1:
            _abort_with_traceback(comm, type(exc), exc, exc.__traceback__)
        raise

"""Failure handling across ranks: mismatch errors and job-wide abort on a crash.

Under ``mpirun`` an exception on one rank would otherwise leave every other rank
blocked in its next collective forever. :func:`abort_on_uncaught` turns an uncaught
exception anywhere into ``MPI_Abort`` with the rank's traceback, which the launcher
propagates to every rank within seconds; :func:`job_guard` does the same for a block
of code and also catches ``sys.exit`` with a non-zero status.
"""
from .abort import guard, install_abort_hook
from .comm import world
from .exceptions import CollectiveMismatchError, CollectiveTimeoutError  # noqa: F401 (re-exported)


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
    return install_abort_hook(world() if comm is None else comm)


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
    return guard(world() if comm is None else comm)

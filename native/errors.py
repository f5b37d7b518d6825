"""Failure handling across ranks: mismatch errors and job-wide abort on a crash.

Under ``mpirun`` an exception on one rank would otherwise leave every other rank
blocked in its next collective forever. :func:`abort_on_uncaught` turns an uncaught
exception anywhere into ``MPI_Abort`` with the rank's traceback, which the launcher
propagates to every rank within seconds.
"""
import sys
import traceback


class CollectiveMismatchError(RuntimeError):
    """Ranks called different collectives, sizes or dtypes (raised on every rank)."""


class CollectiveTimeoutError(CollectiveMismatchError):
    """In check mode, a rank never arrived at the collective the others are in."""


def abort_on_uncaught(comm=None):
    """Install a ``sys.excepthook`` that aborts the whole job on an uncaught exception.

    With ``comm.size > 1`` the hook writes ``[rank r] <traceback>`` to stderr and calls
    ``comm.abort`` (``MPI_Abort``), so the launcher ends every rank and exits non-zero
    instead of leaving the others waiting. With one rank the previous hook runs
    unchanged. Calling it again replaces the hook installed before (it never chains
    onto itself).

    Parameters
    ----------
    comm : native.comm.Communicator, optional
        Defaults to :func:`native.comm.world`.

    Returns
    -------
    callable
        The installed hook.
    """
    if comm is None:
        from .comm import world

        comm = world()
    previous = getattr(sys.excepthook, "_histforest_previous", sys.excepthook)

    def hook(etype, value, tb):
        if comm.size <= 1:
            previous(etype, value, tb)
            return
        lines = "".join(traceback.format_exception(etype, value, tb)).rstrip().splitlines()
        # comm.abort prefixes the first line; prefix the rest so interleaved output from
        # several ranks stays attributable.
        body = "\n".join([lines[-1]] + [f"[rank {comm.rank}] {line}" for line in lines])
        comm.abort(f"uncaught exception, aborting all ranks: {body}", code=1)

    hook._histforest_previous = previous
    sys.excepthook = hook
    return hook

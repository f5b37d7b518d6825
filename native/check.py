"""Check mode: make sure every rank is in the same collective before moving data.

A collective whose ranks disagree (different operation, length, dtype, root or
algorithm) hangs or silently corrupts data. In check mode each public collective
first exchanges a fixed-size signature record (a Bruck allgather of 8 int64 values,
``ceil(log2 p)`` tiny messages) and compares them. All ranks see the same table, so
all raise the same :class:`~native.errors.CollectiveMismatchError` naming the
collective, sizes and dtypes per rank.

Enable with ``HISTFOREST_CHECK_COLLECTIVES=1`` in the environment (``mpirun``
forwards it to every rank) or ``check=True`` on a call; ranks must agree on whether
checking is on. The handshake itself cannot mismatch: its size is fixed. A rank
that never reaches the collective (it skipped it, or is stuck elsewhere) would still
hang the others, so the handshake waits at most ``HISTFOREST_CHECK_TIMEOUT`` seconds
(default 300) and then raises :class:`~native.errors.CollectiveTimeoutError` naming
the missing rank; with :func:`native.errors.abort_on_uncaught` that ends the job.
"""
import time

import numpy as np

from .algorithms.bruck import bruck_allgather
from .exceptions import CollectiveMismatchError, CollectiveTimeoutError
from .settings import flag, positive_number
from .stats import STATS
from .transport import TAG_CHECK, ExchangeTimeout

ENV_VAR = "HISTFOREST_CHECK_COLLECTIVES"
TIMEOUT_ENV_VAR = "HISTFOREST_CHECK_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0

OPS = ("allreduce", "reduce_scatter", "allgather", "allgatherv", "bcast",
       "bcast_object", "allgather_object", "allreduce_best", "global_row_offset", "alltoallv")
ALGORITHMS = ("-", "ring", "rabenseifner", "doubling", "mpi", "halving", "bruck",
              "binomial", "scatter_allgather", "pairwise", "direct", "hierarchical")
FIELDS = ("op", "algorithm", "dtype", "root", "n", "shape0", "trailing")

_sequence = [0]


def enabled(check):
    """Resolve a ``check`` argument: ``None`` means the environment variable decides."""
    if check is None:
        return flag(ENV_VAR, False)
    return bool(check)


def timeout_seconds():
    """The handshake deadline in seconds (``HISTFOREST_CHECK_TIMEOUT``, default 300)."""
    return positive_number(TIMEOUT_ENV_VAR, DEFAULT_TIMEOUT_S, unit="a number of seconds")


def _dtype_code(dtype):
    if dtype is None:
        return 0
    raw = np.dtype(dtype).str.encode("ascii")[:8].ljust(8, b"\0")
    return int(np.frombuffer(raw, dtype="<i8")[0])


def _dtype_name(code):
    if code == 0:
        return "-"
    raw = np.array([code], dtype="<i8").tobytes().rstrip(b"\0").decode("ascii", "replace")
    try:
        return np.dtype(raw).name
    except TypeError:
        return raw


def verify(comm, op, algorithm="-", dtype=None, n=0, shape0=0, trailing=0, root=0,
           free=()):
    """Compare this call's signature with every other rank's; raise on any difference.

    Parameters
    ----------
    comm : native.comm.Communicator
    op : str
        Public collective name, one of :data:`OPS`.
    algorithm : str
        Resolved algorithm (one of :data:`ALGORITHMS`).
    dtype : numpy dtype or None
    n, shape0, trailing : int
        Total elements, length of axis 0, elements per axis-0 row.
    root : int
    free : tuple of str
        Fields of :data:`FIELDS` allowed to differ between ranks (e.g. ``"n"`` and
        ``"shape0"`` for ``allgatherv``).

    Raises
    ------
    CollectiveMismatchError
        On every rank, if any compared field differs between ranks.
    CollectiveTimeoutError
        If some rank has not joined the handshake within :func:`timeout_seconds`.
    """
    _sequence[0] += 1
    if comm.size == 1:
        return
    mine = np.array([_sequence[0], OPS.index(op), ALGORITHMS.index(algorithm),
                     _dtype_code(dtype), root, n, shape0, trailing], dtype=np.int64)
    table = np.empty(comm.size * mine.size, dtype=np.int64)
    previous = STATS._current
    STATS._current = "check"
    timeout = timeout_seconds()
    try:
        bruck_allgather(comm, mine, table, tag=TAG_CHECK,
                        deadline=time.monotonic() + timeout)
    except ExchangeTimeout as exc:
        raise CollectiveTimeoutError(
            f"rank {comm.rank} waited {exc.waited:.1f} s (limit {timeout:g} s, "
            f"{TIMEOUT_ENV_VAR}) in collective {op!r} (its collective call "
            f"#{_sequence[0]}) for rank {exc.peer}: some rank has not reached this "
            f"collective (rank {exc.peer}, or one it waits for in turn): it skipped "
            "it, failed, or is stuck elsewhere") from None
    finally:
        STATS._current = previous
    table = table.reshape(comm.size, mine.size)
    cols = [1 + i for i, f in enumerate(FIELDS) if f not in free]
    if (table[:, cols] == table[0, cols]).all():
        return
    rows = []
    for r, rec in enumerate(table):
        o = OPS[rec[1]] if 0 <= rec[1] < len(OPS) else f"op#{rec[1]}"
        a = ALGORITHMS[rec[2]] if 0 <= rec[2] < len(ALGORITHMS) else f"#{rec[2]}"
        rows.append(f"  rank {r} (collective call #{rec[0]}): {o}(algorithm={a}, "
                    f"n={rec[5]}, shape[0]={rec[6]}, row elements={rec[7]}, "
                    f"dtype={_dtype_name(rec[3])}, root={rec[4]})")
    raise CollectiveMismatchError(
        f"ranks disagree on collective {op!r} (check mode, {ENV_VAR}); each rank "
        "called:\n" + "\n".join(rows))

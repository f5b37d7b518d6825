"""Check mode: make sure every rank is in the same collective before moving data.

A collective whose ranks disagree (different operation, length, dtype, root or
algorithm) hangs or silently corrupts data. In check mode each public collective
first exchanges a fixed-size signature record (a Bruck allgather of 8 int64 values,
``ceil(log2 p)`` tiny messages) and compares them. All ranks see the same table, so
all raise the same :class:`~native.errors.CollectiveMismatchError` naming the
collective, sizes and dtypes per rank.

Enable with ``HISTFOREST_CHECK_COLLECTIVES=1`` in the environment (``mpirun``
forwards it to every rank) or ``check=True`` on a call; ranks must agree on whether
checking is on. The handshake itself cannot mismatch: its size is fixed.
"""
import os

import numpy as np

from .algorithms.bruck import bruck_allgather
from .errors import CollectiveMismatchError
from .stats import STATS

ENV_VAR = "HISTFOREST_CHECK_COLLECTIVES"

OPS = ("allreduce", "reduce_scatter", "allgather", "allgatherv", "bcast",
       "bcast_object", "allgather_object", "allreduce_best", "global_row_offset")
ALGORITHMS = ("-", "ring", "rabenseifner", "doubling", "mpi", "halving", "bruck",
              "binomial", "scatter_allgather")
FIELDS = ("op", "algorithm", "dtype", "root", "n", "shape0", "trailing")

_sequence = [0]


def enabled(check):
    """Resolve a ``check`` argument: ``None`` means the environment variable decides."""
    if check is None:
        return os.environ.get(ENV_VAR, "").strip().lower() not in ("", "0", "false", "no")
    return bool(check)


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
    """
    _sequence[0] += 1
    if comm.size == 1:
        return
    mine = np.array([_sequence[0], OPS.index(op), ALGORITHMS.index(algorithm),
                     _dtype_code(dtype), root, n, shape0, trailing], dtype=np.int64)
    table = np.empty(comm.size * mine.size, dtype=np.int64)
    previous = STATS._current
    STATS._current = "check"
    try:
        bruck_allgather(comm, mine, table)
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

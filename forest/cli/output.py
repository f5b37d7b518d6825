"""Rank-ordered Parquet output of the command-line tools: every rank's rows in one file, in rank order.

``forest-predict`` streams its predictions through it (rank 0 appends its own batches,
the other ranks spill theirs to temporary Arrow IPC files, then hand them to rank 0
in rank order); ``forest-policy``'s per-row decisions, small enough to hold, go
through :func:`gather_to_parquet`. The file is written to a temporary name and
renamed, so a failed run never leaves a partial output at the target path.
"""
_TAG = 7421  # point-to-point tag of the output hand-over to rank 0


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


class ParquetOutput:
    """Rank 0's output: a parquet file under a temporary name, renamed when complete.

    After the first failed write, later writes are skipped (the error is kept), so
    rank 0 still drains every other rank's messages.
    """

    def __init__(self, path, schema):
        import os
        import tempfile

        import pyarrow.parquet as pq

        self.path, self.schema, self.error = path, schema, None
        directory = os.path.dirname(os.path.abspath(path))
        fd, self.tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
        os.close(fd)
        self._writer = pq.ParquetWriter(self.tmp, schema)

    def write(self, table):
        import pyarrow as pa

        if self.error is not None or table.num_rows == 0:
            return
        try:
            self._writer.write_table(table.cast(self.schema))
        except (OSError, pa.ArrowException) as exc:
            self.error = f"cannot write {self.path!r}: {exc}"

    def finish(self):
        """Close and rename into place; returns the error message or None."""
        import os

        try:
            self._writer.close()
            if self.error is None:
                os.chmod(self.tmp, 0o666 & ~_umask())
                os.replace(self.tmp, self.path)
        except OSError as exc:
            self.error = self.error or f"cannot write {self.path!r}: {exc}"
        finally:
            self.discard()
        return self.error

    def discard(self):
        import os

        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - closing after a failed write may fail again
            pass
        if os.path.exists(self.tmp):
            os.unlink(self.tmp)


class Spill:
    """A rank's predictions in a temporary Arrow IPC stream file until rank 0 takes them."""

    def __init__(self, schema):
        import os
        import tempfile

        import pyarrow as pa

        self.schema = schema
        fd, self.path = tempfile.mkstemp(prefix="forest-predict-", suffix=".arrows")
        os.close(fd)
        self._sink = pa.OSFile(self.path, "wb")
        self._writer = pa.ipc.new_stream(self._sink, schema)

    def write(self, table):
        if table.num_rows:
            self._writer.write_table(table.cast(self.schema))

    def batches(self):
        """Close for writing; yield the spilled record batches in order."""
        import pyarrow as pa

        self._writer.close()
        self._sink.close()
        with pa.memory_map(self.path) as source:
            yield from pa.ipc.open_stream(source)

    def discard(self):
        import os

        try:
            self._writer.close()
            self._sink.close()
        except Exception:  # noqa: BLE001 - closing after a failed write may fail again
            pass
        if os.path.exists(self.path):
            os.unlink(self.path)


def receive_in_rank_order(comm, output):
    """Rank 0: append every other rank's batches, rank by rank, until each one's end mark."""
    import numpy as np

    size = np.zeros(1, dtype=np.int64)
    for r in range(1, comm.size):
        while True:
            comm.recv(size, r, _TAG)
            if size[0] < 0:
                break
            buf = np.empty(int(size[0]), dtype=np.uint8)
            comm.recv(buf, r, _TAG)
            output.write(_table_from(buf))


def send_spill(comm, spill):
    """Ranks > 0: send the spilled batches to rank 0, then the end mark (size -1)."""
    import numpy as np
    import pyarrow as pa

    if spill is not None:
        for batch in spill.batches():
            buf = _table_bytes(pa.Table.from_batches([batch]))
            comm.send(np.array([buf.size], dtype=np.int64), 0, _TAG)
            comm.send(buf, 0, _TAG)
    comm.send(np.array([-1], dtype=np.int64), 0, _TAG)


class Drain:
    """Stands in for rank 0's output when it could not be opened: takes and drops rows."""

    def __init__(self, error):
        self.error = error

    def write(self, table):
        pass

    def finish(self):
        return self.error

    def discard(self):
        pass


def gather_to_parquet(comm, table, path):
    """Write every rank's ``table`` to ``path`` in rank order (collective; atomic rename).

    For outputs small enough to hold per rank (policy decisions); ``forest-predict``'s
    own rows stream through :class:`Spill` instead. Rank 0 drains every other rank's
    message even after a write error, so no rank is left blocked in its send.

    Returns
    -------
    str or None
        On rank 0 the error message if writing failed; None elsewhere.
    """
    import numpy as np
    import pyarrow as pa

    if comm.rank != 0:
        buf = _table_bytes(table)
        comm.send(np.array([buf.size], dtype=np.int64), 0, _TAG)
        comm.send(buf, 0, _TAG)
        comm.send(np.array([-1], dtype=np.int64), 0, _TAG)
        return None
    try:
        sink = ParquetOutput(path, table.schema)
    except (OSError, pa.ArrowException) as exc:
        sink = Drain(f"cannot write {path!r}: {exc}")
    try:
        sink.write(table)
        receive_in_rank_order(comm, sink)
        return sink.finish()
    finally:
        sink.discard()


def _umask():
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask

"""Fit and predict on a Spark DataFrame: one barrier stage, each task a rank over its partition.

::

    from forest import CausalForest, spark
    model = spark.fit(CausalForest(n_estimators=200), df, features=["x0", "x1"],
                      treatment="t", outcome="y", num_workers=8)
    scored = spark.predict(model, df, output_col="tau")

:func:`fit` runs the estimator's ordinary ``fit`` in one barrier stage of
``num_workers`` tasks (Spark starts them together or not at all, the gang a collective
needs). Task ``r`` is rank ``r`` over partition ``r``; the global row order is partition
index, then position, so the model is the one a single process fits on the rows in
that order (a DataFrame with another number of partitions is first cut into
``num_workers`` contiguous ranges, order kept). The tasks read their rows as Arrow
record batches (``mapInArrow(..., barrier=True)``, Spark >= 3.5: the same barrier stage
as ``rdd.barrier().mapPartitions``, without turning every row into a Python object),
open a listening socket each, exchange the addresses with
``BarrierTaskContext.allGather`` and fit over :mod:`native.socket_comm`. Rank 0's model
comes back as model-file bytes (:func:`forest.io.model_io.dumps`) over one TCP
connection to the driver (through the stage's result rows where the executors cannot
reach the driver). ``fit(..., timings={})`` says where the time went.

Failure: a task that dies closes its sockets, every other rank raises
:class:`native.socket_comm.PeerLostError` at once, and the stage fails;
:func:`fit` raises :class:`SparkFitError` with the ranks' messages. A stalled or frozen
task is the watchdog's (``HISTFOREST_WATCHDOG_*``). Nothing survives an attempt: a
retry (Spark's, or calling :func:`fit` again) opens new sockets under a new token.

Each task should have the cores its fit uses: ``--conf spark.task.cpus=C`` and
``NUMBA_NUM_THREADS=C`` in the executors' environment (README, "Spark").
"""
import functools
import json
import os
import re
import struct
import time as _time
import uuid

import numpy as np

from native.rendezvous import RendezvousError, parse_endpoint, read_exact

# forest's model_io name imports every estimator module first: any kind's bytes load.
from forest import model_io

from .ranks import ROLES, fit_spec, listen, run_rank

_ROW_ID = "__histforest_row"
#: Bytes of a model per collected row.
_CHUNK_BYTES = 16 << 20
_CACHE = {}
#: Fit tasks this Python worker has run (0 in a fresh interpreter).
_TASKS_RUN = 0
#: The barrier stage's rows: rank 0's model pieces (or, ``chunk`` = :data:`_SENT_DIRECT`,
#: the id of its transfer to the driver) and every rank's stage clock (JSON).
_OUT_SCHEMA = "rank long, chunk long, model binary, clock string"
_SENT_DIRECT = -1
#: Model transfer to the driver: magic, fit token (32 hex), transfer id (32 hex), length.
_HEAD = struct.Struct("<8s32s32sq")
_MAGIC = b"HFMODEL1"
_CONNECT_TIMEOUT_S = 10.0
_SEND_TIMEOUT_S = 300.0


class SparkFitError(RuntimeError):
    """The barrier stage of :func:`fit` failed; the message carries the ranks' errors."""


def fit(estimator, df, features, treatment=None, outcome=None, instrument=None, time=None, event=None,
        sample_weight=None, clusters=None, num_workers=None, fit_params=None, timings=None):
    """Fit ``estimator`` on ``df`` in one Spark barrier stage; returns the fitted estimator.

    Parameters
    ----------
    estimator : object
        An unfitted estimator of a kind in :data:`forest.estimators.kinds.KINDS`
        (``CausalForest``, ``InstrumentalForest``, ``RegressionForest``,
        ``GBDTRegressor``, ``GBDTClassifier``); its parameters travel as model-file bytes.
    df : pyspark.sql.DataFrame
    features : sequence of str
        Feature columns, in the model's feature order.
    treatment, outcome, instrument, time, event : str, optional
        Target columns, by role; the estimator's kind says which it takes
        (``ModelKind.targets``), in which order ``fit`` gets them.
    sample_weight, clusters : str, optional
        Columns.
    num_workers : int, optional
        Ranks (tasks); default: ``df``'s number of partitions. The cluster must have that
        many free task slots at once.
    fit_params : dict, optional
        Further keyword arguments of ``fit`` (e.g. ``{"progress": callback}``).
    timings : dict, optional
        Filled with where the time went (for benchmarks and diagnosis): ``"driver"``, a
        dict of the driver's seconds (``prepare``: the plan and the estimator's bytes;
        ``stage``: the barrier stage, from submission until the last row is back;
        ``loads``: the model from its bytes; ``task_start``: per rank, from
        submission until its task began; ``back``: from the last task's end until
        the driver had every row) and ``"ranks"``, one dict per rank (see
        :func:`_fit_task`). The wall-clock offsets compare clocks of different hosts
        on a cluster.

    Returns
    -------
    object
        A new estimator, restored from rank 0's model bytes; every rank fitted the same.

    Raises
    ------
    ValueError
        Columns that do not fit the kind.
    SparkFitError
        A task failed (its error and the ones it caused are in the message).
    """
    t_start = _time.perf_counter()
    roles = {"treatment": treatment, "outcome": outcome, "instrument": instrument, "time": time, "event": event}
    assert set(roles) == set(ROLES)
    spec = fit_spec(estimator, features, roles, sample_weight, clusters, fit_params)
    missing = [c for c in spec.columns if c not in df.columns]
    if missing:
        raise ValueError(f"columns {missing} are not in the DataFrame")
    data = df.select(*spec.columns)
    k = int(num_workers) if num_workers is not None else data.rdd.getNumPartitions()
    if k < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    data = ordered_partitions(data, k)
    job = uuid.uuid4().hex
    receiver = _ModelReceiver(_driver_host(df), job)
    task = functools.partial(_fit_task, spec=spec, estimator_bytes=model_io.dumps(estimator), job=job,
                             driver=receiver.address, chunk_bytes=_CHUNK_BYTES)
    t_submit, wall_submit = _time.perf_counter(), _time.time()
    try:
        try:
            rows = data.mapInArrow(task, _OUT_SCHEMA, barrier=True).collect()
        except Exception as exc:  # py4j / PythonException: the Java trace buries the cause
            raise SparkFitError(f"the fit's barrier stage failed: {_cause(exc)}") from exc
        t_back, wall_back = _time.perf_counter(), _time.time()
        receiver.close()
        direct = [r for r in rows if r["rank"] == 0 and r["chunk"] == _SENT_DIRECT]
        pieces = sorted((r["chunk"], bytes(r["model"])) for r in rows if r["rank"] == 0 and r["chunk"] >= 0)
        if direct:
            path = receiver.received.get(bytes(direct[-1]["model"]).decode())
            if path is None:
                raise SparkFitError("rank 0 reported its model sent to the driver, but no such model arrived")
            model = model_io.load(path)
        elif pieces:
            model = model_io.loads(b"".join(piece for _, piece in pieces))
        else:
            raise SparkFitError("the barrier stage ended without rank 0's model")
    finally:
        receiver.discard()
    if timings is not None:
        ranks = sorted((json.loads(r["clock"]) for r in rows if r["clock"]), key=lambda c: c["rank"])
        timings["ranks"] = ranks
        timings["driver"] = {
            "prepare": t_submit - t_start, "stage": t_back - t_submit, "loads": _time.perf_counter() - t_back,
            "task_start": [c["wall_enter"] - wall_submit for c in ranks],
            "back": wall_back - max(c["wall_exit"] for c in ranks)}
    return model


def ordered_partitions(data, k):
    """``data`` in ``k`` partitions whose concatenation keeps its row order.

    A DataFrame already in ``k`` partitions is used as it is (no shuffle). Otherwise
    every row gets its position (``monotonically_increasing_id``: partition index, then
    position), and a range partitioning on it cuts ``k`` contiguous, roughly equal
    ranges, sorted inside each.
    """
    if data.rdd.getNumPartitions() == k:
        return data
    from pyspark.sql import functions as F

    ranged = (data.withColumn(_ROW_ID, F.monotonically_increasing_id())
              .repartitionByRange(k, _ROW_ID).sortWithinPartitions(_ROW_ID).drop(_ROW_ID))
    got = ranged.rdd.getNumPartitions()
    if got != k:
        raise ValueError(f"cannot cut the DataFrame into {k} partitions of rows (got {got}); fewer rows than "
                         "workers?")
    return ranged


def _fit_task(batches, spec, estimator_bytes, job, driver, chunk_bytes=_CHUNK_BYTES):
    """The barrier task: this partition's Arrow batches -> one rank; yields record batches of :data:`_OUT_SCHEMA`.

    Rank 0 sends its model bytes straight to the driver (:class:`_ModelReceiver` at
    ``driver``) and yields a row ``chunk = -1`` holding the transfer's id; where the
    driver cannot be reached it yields the bytes themselves, in pieces, through the
    stage's result instead.

    ``clock`` (JSON, on each rank's first row) holds the task's stages in seconds:
    ``read`` (the Arrow batches, as they arrive), ``frame`` (one pandas frame of them),
    ``rendezvous`` (listener and ``allGather``), then :func:`~.ranks.run_rank`'s
    ``connect``, ``fit`` and ``dumps``, and rank 0's ``send`` (model bytes to the
    driver, ``via`` ``"socket"`` or ``"spark"``); ``wall_enter``/``wall_exit``
    (``time.time()`` at the task's start and before its rows go back), ``worker_age``
    (seconds since this Python worker started), ``worker_tasks`` (fit tasks this
    worker ran before: 0 is a fresh interpreter), ``pid``, ``numba_threads``, ``rows``
    and ``model_bytes``.
    """
    import pyarrow as pa
    from numba import get_num_threads
    from pyspark import BarrierTaskContext

    global _TASKS_RUN
    clock = {"wall_enter": _time.time(), "worker_age": _process_age(), "worker_tasks": _TASKS_RUN,
             "pid": os.getpid(), "numba_threads": get_num_threads()}
    _TASKS_RUN += 1
    t0 = _time.perf_counter()
    ctx = BarrierTaskContext.get()
    rank = clock["rank"] = ctx.partitionId()
    parts = list(batches)
    t1 = _time.perf_counter()
    # One copy, Arrow columns -> one pandas block (mapInPandas converted every batch,
    # then concatenated: two).
    frame = _frame_of(parts, spec.columns, pa)
    del parts
    t2 = _time.perf_counter()
    host = ctx.getTaskInfos()[rank].address.rpartition(":")[0] or None
    listener = listen(advertise=host)
    try:
        endpoints = ctx.allGather(listener.address)
    except BaseException:
        listener.close()
        raise
    t3 = _time.perf_counter()
    clock.update(read=t1 - t0, frame=t2 - t1, rendezvous=t3 - t2, rows=len(frame))
    # One token per fit call and attempt: the endpoints are new sockets every attempt.
    token = f"{job}|{ctx.stageId()}|{','.join(endpoints)}".encode()
    model = run_rank(listener, endpoints, rank, token, estimator_bytes, frame, spec, clock=clock)
    del frame
    clock["model_bytes"] = len(model) if model is not None else 0
    t4 = _time.perf_counter()
    if model is None:
        out = [(0, b"")]
    else:
        sent = uuid.uuid4().hex  # this attempt's transfer: a retried stage sends again
        if _send_model(driver, job, sent, model):
            out, clock["via"] = [(_SENT_DIRECT, sent.encode())], "socket"
        else:
            # In pieces: one binary cell of a large model (hundreds of MB for a forest that
            # keeps per-row training state) exhausted the driver JVM's heap when collected.
            out = [(i // chunk_bytes, model[i:i + chunk_bytes]) for i in range(0, max(len(model), 1), chunk_bytes)]
            clock["via"] = "spark"
    clock.update(send=_time.perf_counter() - t4, wall_exit=_time.time())
    for i, (chunk, payload) in enumerate(out):  # one record batch per piece: Arrow's binary offsets are 32-bit
        yield pa.RecordBatch.from_arrays(
            [pa.array([rank], pa.int64()), pa.array([chunk], pa.int64()), pa.array([payload], pa.binary()),
             pa.array([json.dumps(clock) if i == 0 else None], pa.string())], schema=_out_arrow_schema(pa))


def _frame_of(batches, columns, pa):
    """A pandas frame of a task's Arrow record batches (columns in ``columns``' order)."""
    if not batches:
        import pandas as pd

        return pd.DataFrame(columns=columns)
    return pa.Table.from_batches(batches).select(columns).to_pandas()


def _out_arrow_schema(pa):
    return pa.schema([("rank", pa.int64()), ("chunk", pa.int64()), ("model", pa.binary()), ("clock", pa.string())])


def _driver_host(df):
    """The address the executors reach the driver at (``spark.driver.host``)."""
    conf = df.sparkSession.sparkContext.getConf()
    return conf.get("spark.driver.host", None) or None


class _ModelReceiver:
    """A socket on the driver that rank 0 streams its model bytes to.

    Through the stage's result, the bytes of a 1M-row forest (760 MB) were copied from
    the task into Arrow, the JVM's rows, the compressed task result, the driver's
    pickled rows and Python: 10-50 s. Here they cross one TCP connection into a file
    the driver reads with :func:`forest.io.model_io.load` (the same checks as any model
    file). Each transfer states the fit's token (a connection without it is dropped),
    a transfer id and its length; rank 0 waits for the driver's acknowledgement, so
    its task ends only once the model is on the driver. Anything that fails here (no
    route from the executors to the driver) makes rank 0 fall back to the result rows.
    """

    def __init__(self, host, token):
        import threading

        self.listener = listen(advertise=host)
        self.address = self.listener.address
        self.token = token
        self.received = {}
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="histforest-model-receiver", daemon=True)
        self._thread.start()

    def _serve(self):
        import socket

        # accept() with a timeout: closing a socket does not wake a thread blocked in it.
        self.listener.sock.settimeout(0.2)
        while not self._closed:
            try:
                conn, _ = self.listener.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return  # closed
            try:
                conn.settimeout(_SEND_TIMEOUT_S)
                self._take(conn)
            except (OSError, ValueError, EOFError):
                pass  # a broken or foreign connection: rank 0 falls back or its stage fails
            finally:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()

    def _take(self, conn):
        import tempfile

        head = read_exact(conn, _HEAD.size)
        magic, token, sent, length = _HEAD.unpack(head)
        if magic != _MAGIC or token.decode("ascii", "replace") != self.token:
            return
        fd, path = tempfile.mkstemp(prefix=".histforest-spark-model.", suffix=".bytes")
        done = False
        try:
            with os.fdopen(fd, "wb") as f:
                buf = memoryview(bytearray(min(length, 8 << 20) or 1))
                left = length
                while left:
                    got = conn.recv_into(buf, min(left, len(buf)))
                    if not got:
                        raise ValueError("the model's sender closed early")
                    f.write(buf[:got])
                    left -= got
            self.received[sent.decode("ascii")] = path
            done = True
            conn.sendall(b"\x01")
        finally:
            if not done:
                os.unlink(path)

    def close(self):
        """Stop accepting (the stage is over)."""
        self._closed = True
        self._thread.join(timeout=_SEND_TIMEOUT_S)
        self.listener.close()

    def discard(self):
        """Close, and remove every received file."""
        self.close()
        for path in self.received.values():
            try:
                os.unlink(path)
            except OSError:
                pass
        self.received.clear()


def _send_model(driver, token, sent, model):
    """Rank 0's model bytes to the driver's :class:`_ModelReceiver`; False where that failed."""
    import socket

    try:
        host, port = parse_endpoint(driver)
        with socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S) as sock:
            sock.settimeout(_SEND_TIMEOUT_S)
            sock.sendall(_HEAD.pack(_MAGIC, token.encode("ascii"), sent.encode("ascii"), len(model)))
            sock.sendall(memoryview(model))
            return sock.recv(1) == b"\x01"
    except (OSError, RendezvousError):
        return False


def _process_age():
    """Seconds since this process started (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rpartition(")")[2].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _cause(exc):
    """The ranks' errors of a failed Spark job in a few words, without the JVM's stack."""
    text = str(exc)
    parts = []
    first = re.search(r"barrier task \w*Task\(\d+, (\d+)\) finished unsuccessfully", text)
    if first:
        parts.append(f"rank {first.group(1)} (partition {first.group(1)}) failed first")
    for line in text.splitlines():
        line = line.strip()
        if "Python worker exited unexpectedly" in line:
            parts.append("its Python worker exited unexpectedly (killed or crashed)")
        elif re.match(r"^[\w.]*(Error|Exception): ", line) and not line.startswith(("org.", "java.", "py4j.")):
            parts.append(line)  # a Python exception's last line, e.g. PeerLostError: rank 1 ...
    unique = list(dict.fromkeys(parts))
    return "; ".join(unique[:6]) if unique else text[:2000]


def predict(model, df, output_col="prediction", features=None, method="predict"):
    """``df`` with ``model``'s predictions added as column ``output_col`` (lazy).

    The model is broadcast once, as model-file bytes, and restored once per Python
    worker; each Arrow batch is predicted by ``getattr(model, method)`` on its feature
    columns (``mapInPandas``).

    Parameters
    ----------
    model : object
        A fitted estimator.
    df : pyspark.sql.DataFrame
        Holds the model's feature columns (``features``, default the names it was
        fitted with).
    output_col : str
    features : sequence of str, optional
    method : str
        ``"predict"``, ``"predict_proba"``, ...: one value per row (a double, integer,
        boolean or string column) or a row vector (an array column).

    Returns
    -------
    pyspark.sql.DataFrame
    """
    from pyspark.sql import types as T

    if features is None:
        names = getattr(model, "feature_names_in_", None)
        if names is None:
            raise ValueError("the model has no feature names: pass features=[...]")
        features = [str(n) for n in names]
    features = list(features)
    if output_col in df.columns:
        raise ValueError(f"column {output_col!r} already exists")
    # The output type, from a row of zeros (every feature numeric), without a Spark job.
    import pandas as pd

    probe = np.asarray(getattr(model, method)(pd.DataFrame(np.zeros((1, len(features))), columns=features)))
    schema = T.StructType(df.schema.fields + [T.StructField(output_col, _spark_type(probe, T), True)])
    payload = df.sparkSession.sparkContext.broadcast(model_io.dumps(model))
    task = functools.partial(_predict_task, payload=payload, key=uuid.uuid4().hex, features=features,
                             output_col=output_col, method=method, vector=probe.ndim > 1)
    return df.mapInPandas(task, schema)


def _spark_type(probe, T):
    kind = probe.dtype.kind
    base = (T.DoubleType() if kind == "f" else T.LongType() if kind in "iu" else T.BooleanType() if kind == "b"
            else T.StringType())
    return T.ArrayType(base) if probe.ndim > 1 else base


def _predict_task(batches, payload, key, features, output_col, method, vector):
    model = _CACHE.get(key)
    if model is None:
        _CACHE.clear()  # one model per worker at a time: the latest broadcast
        model = _CACHE[key] = model_io.loads(payload.value)
    fn = getattr(model, method)
    for batch in batches:
        out = np.asarray(fn(batch[features]))
        batch = batch.copy()
        batch[output_col] = list(out) if vector else out
        yield batch

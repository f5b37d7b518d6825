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
``num_workers`` contiguous ranges, order kept). The tasks read their rows through Arrow
(``mapInPandas(..., barrier=True)``, Spark >= 3.5: the same barrier stage as
``rdd.barrier().mapPartitions``, without turning every row into a Python object), open
a listening socket each, exchange the addresses with
``BarrierTaskContext.allGather`` and fit over :mod:`native.socket_comm`. Rank 0's model
comes back as model-file bytes (:func:`forest.io.model_io.dumps`).

Failure: a task that dies closes its sockets, every other rank raises
:class:`native.socket_comm.PeerLostError` at once, and the stage fails;
:func:`fit` raises :class:`SparkFitError` with the ranks' messages. A stalled or frozen
task is the watchdog's (``HISTFOREST_WATCHDOG_*``). Nothing survives an attempt: a
retry (Spark's, or calling :func:`fit` again) opens new sockets under a new token.

Each task should have the cores its fit uses: ``--conf spark.task.cpus=C`` and
``NUMBA_NUM_THREADS=C`` in the executors' environment (README, "Spark").
"""
import functools
import re
import uuid

import numpy as np

# forest's model_io name imports every estimator module first: any kind's bytes load.
from forest import model_io

from .ranks import ROLES, fit_spec, listen, run_rank

_ROW_ID = "__histforest_row"
#: Bytes of a model per collected row.
_CHUNK_BYTES = 16 << 20
_CACHE = {}


class SparkFitError(RuntimeError):
    """The barrier stage of :func:`fit` failed; the message carries the ranks' errors."""


def fit(estimator, df, features, treatment=None, outcome=None, instrument=None, time=None, event=None,
        sample_weight=None, clusters=None, num_workers=None, fit_params=None):
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
    task = functools.partial(_fit_task, spec=spec, estimator_bytes=model_io.dumps(estimator),
                             job=uuid.uuid4().hex)
    try:
        rows = data.mapInPandas(task, "rank long, chunk long, model binary", barrier=True).collect()
    except Exception as exc:  # py4j / PythonException: the Java trace buries the cause
        raise SparkFitError(f"the fit's barrier stage failed: {_cause(exc)}") from exc
    pieces = sorted((r["chunk"], bytes(r["model"])) for r in rows if r["rank"] == 0)
    if not pieces:
        raise SparkFitError("the barrier stage ended without rank 0's model")
    return model_io.loads(b"".join(piece for _, piece in pieces))


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


def _fit_task(batches, spec, estimator_bytes, job):
    """The barrier task: this partition's rows -> one rank; yields ``(rank, model bytes)``."""
    import pandas as pd
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    rank = ctx.partitionId()
    parts = list(batches)
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=spec.columns)
    host = ctx.getTaskInfos()[rank].address.rpartition(":")[0] or None
    listener = listen(advertise=host)
    try:
        endpoints = ctx.allGather(listener.address)
    except BaseException:
        listener.close()
        raise
    # One token per fit call and attempt: the endpoints are new sockets every attempt.
    token = f"{job}|{ctx.stageId()}|{','.join(endpoints)}".encode()
    model = run_rank(listener, endpoints, rank, token, estimator_bytes, frame, spec)
    if model is None:
        yield pd.DataFrame({"rank": [rank], "chunk": [0], "model": [b""]})
        return
    # In pieces: one binary cell of a large model (hundreds of MB for a forest that
    # keeps per-row training state) exhausted the driver JVM's heap when collected.
    pieces = range(0, max(len(model), 1), _CHUNK_BYTES)
    yield pd.DataFrame({"rank": [rank] * len(pieces), "chunk": list(range(len(pieces))),
                        "model": [model[i:i + _CHUNK_BYTES] for i in pieces]})


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

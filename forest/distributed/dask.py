"""Fit on a Dask DataFrame over a ``distributed`` cluster: one rank per worker.

::

    from distributed import Client, LocalCluster
    from forest import GBDTRegressor, dask
    client = Client(LocalCluster(n_workers=4, threads_per_worker=2))
    model = dask.fit(GBDTRegressor(), ddf, features=["x0", "x1"], outcome="y", client=client)

The same rank body as Spark's (:mod:`forest.distributed.ranks`), launched differently:
the DataFrame is cut into one partition per rank (``repartition``, which keeps the row
order), each partition is computed, and rank ``r``'s task is pinned to worker ``r``
(``workers=[...]``, no other allowed), so all ranks run at once. Dask has no barrier
primitive, so the ranks exchange their ``host:port`` through the scheduler: each sets a
``distributed.Variable`` named after the fit and its rank, then reads everyone's.
Workers must be processes (the default of ``LocalCluster`` and ``dask worker``): a
process is one rank's world (:func:`native.comm.use_world`).

Failure: a rank that raises tells its peers (they raise
:class:`native.socket_comm.PeerLostError`), and :func:`fit` raises
:class:`DaskFitError` with the first error. A worker killed mid-fit closes its sockets
and the others fail at once too; Dask itself may then re-run the lost task on the
restarted worker, which cannot rejoin the finished ranks and fails its rendezvous
within ``HISTFOREST_SOCKET_CONNECT_TIMEOUT``. Unlike a Spark barrier stage, Dask does
not restart the whole gang: call :func:`fit` again (a new fit has new names and
sockets).
"""
import uuid

# forest's model_io name imports every estimator module first: any kind's bytes load.
from forest import model_io

from .ranks import ROLES, fit_spec, listen, run_rank

#: Seconds a rank waits for the others' addresses (all tasks start together normally).
ADDRESS_TIMEOUT_S = 120.0


class DaskFitError(RuntimeError):
    """A rank of :func:`fit` failed; the message carries its error."""


def fit(estimator, ddf, features, treatment=None, outcome=None, instrument=None, time=None, event=None,
        sample_weight=None, clusters=None, client=None, num_workers=None, fit_params=None):
    """Fit ``estimator`` on a Dask DataFrame, one rank per worker; returns the fitted estimator.

    Parameters
    ----------
    estimator : object
        An unfitted estimator of a kind in :data:`forest.estimators.kinds.KINDS`.
    ddf : dask.dataframe.DataFrame
        Rows in order (partition, then position).
    features, treatment, outcome, instrument, time, event, sample_weight, clusters, fit_params
        As in :func:`forest.distributed.spark.fit`.
    client : distributed.Client, optional
        Default: the current client (``distributed.get_client()``).
    num_workers : int, optional
        Ranks; default every worker of the cluster. At most the number of workers.

    Returns
    -------
    object
        A new estimator restored from rank 0's model bytes.

    Raises
    ------
    ValueError
        Columns that do not fit the kind, or more ranks than workers.
    DaskFitError
        A rank failed.
    """
    from distributed import get_client

    roles = {"treatment": treatment, "outcome": outcome, "instrument": instrument, "time": time, "event": event}
    assert set(roles) == set(ROLES)
    spec = fit_spec(estimator, features, roles, sample_weight, clusters, fit_params)
    missing = [c for c in spec.columns if c not in ddf.columns]
    if missing:
        raise ValueError(f"columns {missing} are not in the DataFrame")
    client = get_client() if client is None else client
    workers = sorted(client.scheduler_info()["workers"])
    k = len(workers) if num_workers is None else int(num_workers)
    if not 1 <= k <= len(workers):
        raise ValueError(f"num_workers={num_workers}: the cluster has {len(workers)} workers (one rank each)")
    data = ddf[spec.columns]
    if data.npartitions != k:
        data = data.repartition(npartitions=k)
    parts = client.compute(data.to_delayed())
    job = f"histforest-{uuid.uuid4().hex}"
    estimator_bytes = model_io.dumps(estimator)
    futures = [client.submit(_rank_task, part, rank, k, job, spec, estimator_bytes, key=f"{job}-rank-{rank}",
                             workers=[workers[rank]], allow_other_workers=False, pure=False)
               for rank, part in enumerate(parts)]
    try:
        results = client.gather(futures)
    except Exception as exc:
        raise DaskFitError(f"the fit failed on a rank: {type(exc).__name__}: {exc}") from exc
    finally:
        client.cancel(futures + parts)
    return model_io.loads(results[0])


def _rank_task(frame, rank, size, job, spec, estimator_bytes):
    """Rank ``rank``'s task on its worker: publish its address, read everyone's, fit."""
    from distributed import Variable, get_worker

    host = get_worker().address.split("://")[-1].rpartition(":")[0] or None
    listener = listen(advertise=host)
    mine = Variable(f"{job}-{rank}")
    try:
        mine.set(listener.address)
        endpoints = [Variable(f"{job}-{q}").get(timeout=ADDRESS_TIMEOUT_S) for q in range(size)]
    except BaseException:
        listener.close()
        raise
    token = f"{job}|{','.join(endpoints)}".encode()
    try:
        return run_rank(listener, endpoints, rank, token, estimator_bytes, frame.reset_index(drop=True), spec)
    finally:
        mine.delete()

"""Fit where the data lives: estimators fitted inside Spark or Dask, one rank per task or worker.

``forest.distributed.spark`` (``from forest import spark``) and
``forest.distributed.dask`` (``from forest import dask``) run an estimator's ordinary
``fit`` on every task of one gang (a Spark barrier stage, or one Dask task per worker),
each task a rank over its own rows, the ranks connected by the socket transport
(:mod:`native.socket_comm`) instead of MPI. The fitted model comes back to the driver
through the model-file format (:func:`forest.io.model_io.dumps`), never pickle.

Modules: ``ranks`` (what every rank does, whichever the launcher: read its rows into
the columns the estimator's kind takes, connect, fit, hand back the model bytes),
``spark``, ``dask``.
"""

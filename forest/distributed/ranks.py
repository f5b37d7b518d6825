"""What every rank of a distributed fit does, whichever the launcher (Spark or Dask).

A launcher gives each rank its rows (a pandas DataFrame), the ``host:port`` of every
rank and a listener at its own; :func:`run_rank` connects the socket world, starts the
watchdog on it, fits the estimator over the world and returns rank 0's model bytes.
The columns each kind of estimator takes come from :mod:`forest.estimators.kinds` (one
table for the command-line tools and for this), not from a table of our own.
"""
import dataclasses
import time

import numpy as np

from forest.estimators.kinds import ROLES as KIND_ROLES, kind_of
# forest's model_io name imports every estimator module first: any kind's bytes load.
from forest import model_io
from native import watchdog
from native.comm import use_world
from native.rendezvous import Listener
from native.socket_comm import connect

#: Target roles a launcher's ``fit`` accepts by keyword (the kinds table's); a kind takes those of its ``targets``.
ROLES = KIND_ROLES


@dataclasses.dataclass(frozen=True)
class FitSpec:
    """Which columns feed which ``fit`` argument (plain data: shipped to every task).

    Attributes
    ----------
    features : tuple of str
    targets : tuple of str
        The target columns in ``fit``'s order (the kind's ``targets``).
    sample_weight, clusters : str or None
    fit_params : dict
        Further keyword arguments of ``fit`` (plain values).
    """

    features: tuple
    targets: tuple
    sample_weight: str = None
    clusters: str = None
    fit_params: dict = dataclasses.field(default_factory=dict)

    @property
    def columns(self):
        """Every column a rank needs, each once, features first."""
        out = []
        for name in self.features + self.targets + (self.sample_weight, self.clusters):
            if name is not None and name not in out:
                out.append(name)
        return out


def fit_spec(estimator, features, roles, sample_weight=None, clusters=None, fit_params=None):
    """Check the column arguments against the estimator's kind; the :class:`FitSpec`.

    Parameters
    ----------
    estimator : object
        An estimator of a kind in :data:`forest.estimators.kinds.KINDS`.
    features : sequence of str
    roles : dict
        Role name (:data:`ROLES`) -> column name or None.
    sample_weight, clusters : str, optional
    fit_params : dict, optional

    Raises
    ------
    ValueError
        Not a known kind, a target the kind takes is missing, a role it does not take is
        given, or ``clusters`` for a kind without clusters.
    """
    kind = kind_of(estimator)
    if kind is None:
        raise ValueError(f"{type(estimator).__name__} is not a model kind that can be fitted this way "
                         "(see forest.estimators.kinds.KINDS)")
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown target role(s) {unknown}; roles: {list(ROLES)}")
    missing = [r for r in kind.targets if roles.get(r) is None]
    extra = [r for r, col in roles.items() if col is not None and r not in kind.targets]
    if missing:
        raise ValueError(f"a {kind.class_name} needs the column(s) for {missing} (it takes {list(kind.targets)})")
    if extra:
        raise ValueError(f"a {kind.class_name} takes no {extra} (it takes {list(kind.targets)})")
    if clusters is not None and not kind.clusters:
        raise ValueError(f"a {kind.class_name} takes no clusters")
    features = tuple(str(f) for f in features)
    if not features:
        raise ValueError("features must name at least one column")
    return FitSpec(features, tuple(roles[r] for r in kind.targets), sample_weight, clusters, dict(fit_params or {}))


def fit_rows(estimator, frame, spec, comm):
    """Fit ``estimator`` on this rank's rows over ``comm`` (collective); returns it.

    Parameters
    ----------
    estimator : object
    frame : pandas.DataFrame, shape (n_local, len(spec.columns))
        This rank's rows, in global order.
    spec : FitSpec
    comm : native.comm.Communicator
    """
    X = frame.loc[:, list(spec.features)]
    targets = [frame[name].to_numpy() for name in spec.targets]
    kwargs = dict(spec.fit_params)
    if spec.sample_weight is not None:
        kwargs["sample_weight"] = frame[spec.sample_weight].to_numpy(dtype=np.float64)
    if spec.clusters is not None:
        kwargs["clusters"] = frame[spec.clusters].to_numpy()
    # use_world: anything the fit calls without a communicator also gets this one.
    with use_world(comm):
        estimator.fit(X, *targets, comm=comm, **kwargs)
    return estimator


def run_rank(listener, endpoints, rank, token, estimator_bytes, frame, spec, clock=None):
    """One rank of a distributed fit: connect, watch, fit; rank 0's model bytes (else None).

    Parameters
    ----------
    listener : native.rendezvous.Listener
        Listening at ``endpoints[rank]``.
    endpoints : list of str
        Every rank's ``host:port``, in rank order.
    rank : int
    token : bytes
        The same on every rank of this attempt (stale ranks of another are refused).
    estimator_bytes : bytes
        The unfitted estimator (:func:`forest.io.model_io.dumps`: parameters only).
    frame : pandas.DataFrame
    spec : FitSpec
    clock : dict, optional
        Filled with the seconds of this rank's stages (``connect``, ``fit``, ``dumps``),
        for a launcher's timing report.

    Returns
    -------
    bytes or None

    Raises
    ------
    Exception
        Whatever the fit raised; the peers are told first (they raise
        :class:`native.socket_comm.PeerLostError` quoting it), so no rank waits for one
        that has failed.
    """
    clock = {} if clock is None else clock
    t0 = time.perf_counter()
    comm = connect(listener, endpoints, rank, token=token)
    t1 = time.perf_counter()
    dog = None
    try:
        # A peer that stalls or freezes (not one that dies: its sockets close and the
        # others learn it at once) ends the fit within the watchdog's bounds.
        dog = watchdog.start(comm)
        estimator = model_io.loads(estimator_bytes)
        fit_rows(estimator, frame, spec, comm)
        t2 = time.perf_counter()
        result = model_io.dumps(estimator) if rank == 0 else None
        clock.update(connect=t1 - t0, fit=t2 - t1, dumps=time.perf_counter() - t2)
    except BaseException as exc:
        watchdog.stop(dog)
        comm.close(reason=f"rank {rank} failed: {type(exc).__name__}: {exc}")
        raise
    watchdog.stop(dog)
    comm.close()
    return result


def listen(advertise=None):
    """A listener on a free port of every interface, advertised as ``advertise``."""
    return Listener("", 0, advertise=advertise)

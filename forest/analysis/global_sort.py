"""Sorting rows by a key over all ranks (sample sort), for statistics that need a global order.

This module owns :func:`sort_descending`: after it, rank 0 holds the rows with the
largest keys, rank 1 the next ones, and so on, each rank's segment sorted by
decreasing key and then increasing global row id, and all rows that share a key
value on one rank (a tie group is never split, so statistics that average over
ties stay local). The order equals the single-process order of the concatenated
rows, whatever the rank count.

Sample sort: every rank sends evenly spaced samples of its sorted keys (each
standing for its share of the rank's rows), all ranks pick the same ``p - 1``
splitter values from the pooled weighted sample, rows travel to the rank whose key
range holds them in one :func:`native.collectives.alltoallv`, and each rank sorts
what it received. Very unequal segments happen only when one key value holds many
rows (it cannot be split).
"""
import numpy as np

from native import collectives as col

#: Samples per rank and per destination rank used to choose the splitters.
SAMPLES_PER_RANK = 32


def _order(key, gids):
    return np.lexsort((gids, -key))


def sort_descending(comm, key, gids, payload):
    """This rank's segment of all rows in decreasing ``key`` order (ties: increasing ``gids``).

    Parameters
    ----------
    comm : native.comm.Communicator
    key : ndarray of float64, shape (n_local,)
        Finite keys.
    gids : ndarray of int64, shape (n_local,)
        Global row ids (below 2**53).
    payload : ndarray of float64, shape (n_local, c)
        Columns carried along.

    Returns
    -------
    key, gids, payload : ndarray
        This rank's rows after the sort, shapes (m,), (m,), (m, c).
    """
    key = np.asarray(key, dtype=np.float64)
    gids = np.asarray(gids, dtype=np.int64)
    payload = np.asarray(payload, dtype=np.float64)
    if payload.ndim == 1:
        payload = payload[:, None]
    if not np.all(np.isfinite(key)):
        raise ValueError("sort keys must be finite")
    if comm.size == 1:
        o = _order(key, gids)
        return key[o], gids[o], payload[o]
    p = comm.size
    desc = np.sort(key)[::-1]
    n = len(desc)
    s = min(n, SAMPLES_PER_RANK * p)
    picks = desc[(np.arange(s) * n) // max(s, 1)] if s else np.zeros(0)
    sample = np.stack([picks, np.full(s, n / max(s, 1))], axis=1) if s else np.zeros((0, 2))
    pooled = col.allgatherv(comm, sample)
    splitters = _splitters(pooled, p)
    # destination = number of splitters strictly greater than the key: ties stay together
    dest = np.searchsorted(-splitters, -key, side="left") if len(splitters) else np.zeros(len(key), np.int64)
    rows = np.concatenate([key[:, None], gids[:, None].astype(np.float64), payload], axis=1)
    blocks = [rows[dest == r] for r in range(p)]
    got = col.alltoallv(comm, blocks)
    k2, g2 = got[:, 0], got[:, 1].astype(np.int64)
    o = _order(k2, g2)
    return k2[o], g2[o], got[o, 2:]


def _splitters(pooled, p):
    """``p - 1`` non-increasing key values cutting the pooled weighted sample into equal shares."""
    if len(pooled) == 0:
        return np.zeros(0)
    o = np.argsort(-pooled[:, 0], kind="stable")
    keys, weight = pooled[o, 0], pooled[o, 1]
    cum = np.cumsum(weight)
    targets = cum[-1] * np.arange(1, p) / p
    idx = np.minimum(np.searchsorted(cum, targets, side="left"), len(keys) - 1)
    return keys[idx]

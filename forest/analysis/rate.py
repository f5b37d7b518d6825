"""Rank-weighted average treatment effects (RATE) and TOC curves over all ranks' rows.

This module owns grf's ``rank_average_treatment_effect`` (Yadlowsky, Fleming, Shah,
Brunskill and Wager): rows are ranked by a priority score ``S`` (highest first);
with doubly robust scores ``G``, weights ``w`` and ties in ``S`` replaced by their
group's weighted mean score, let ``C_i`` and ``S_i`` be the cumulative sums of
``w G`` and ``w`` down the ranking and ``ATE = C_n / S_n``. Then

* ``TOC(q)``: the mean score of the top ``q`` share of the weight minus ``ATE``,
  i.e. ``C(qW)/(qW) - ATE`` with ``C`` interpolated linearly inside a row (grf's
  fractional use of a row at a grid point);
* ``AUTOC = sum_i w_i (C_i / S_i - ATE) / W``, the area under the TOC curve;
* ``QINI = sum_i w_i (S_i / W) (C_i / S_i - ATE) / W``, its ``q``-weighted area.

Standard errors come from a half-sample bootstrap over units (clusters, or rows
without clusters), as in grf, but with unit ``u`` in replicate ``b`` exactly when
``uniform(seed, stream(b), u) < 1/2`` (:mod:`histogram.rowhash`) instead of an
exactly half-size draw: a unit's membership is a pure function of its global id,
so every rank count draws the same replicates; the half-sample size varies by
``O(sqrt(units))``, which changes the variance only to ``O(1/units)``. Ties are
averaged inside each replicate, as grf does.

Distributed: :func:`forest.analysis.global_sort.sort_descending` gives each rank a segment of
the global ranking (tie groups whole); every rank sums its segment per replicate,
the per-rank totals are all-gathered (small: ranks x replicates x 2) so each rank
knows the cumulative sums before its segment, and each rank's share of the AUTOC,
QINI and TOC sums goes through one allreduce. Replicates are processed in chunks
that bound the membership matrix to about :data:`MASK_BYTES`.
"""
import numpy as np
from numba import prange

from histogram.jit import kernel, zeros
from histogram.rowhash import uniform
from native import collectives as col

from forest.analysis.result import EstimateTable, RATEResult
from forest.analysis.global_sort import sort_descending

TARGETS = ("AUTOC", "QINI")
DEFAULT_Q = np.round(np.arange(1, 11) / 10.0, 10)
#: Stream purpose code of the bootstrap membership hash (stream = code + 16 * replicate).
_BOOT = 5
#: Memory budget of one chunk's (replicates x rows) membership matrix.
MASK_BYTES = 2 ** 25


def check_q(q):
    """The TOC grid as float64: strictly increasing fractions in (0, 1] ending at 1."""
    q = DEFAULT_Q if q is None else np.asarray(q, dtype=np.float64).ravel()
    if len(q) == 0 or np.any(np.diff(q) <= 0) or q[0] <= 0 or q[-1] != 1.0:
        raise ValueError("q must be a strictly increasing grid of fractions in (0, 1] ending at 1")
    return q


@kernel
def _segment_totals(w, G, member):
    R, m = member.shape
    out = zeros((R, 2), np.float64)
    for b in range(R):
        sw = 0.0
        swg = 0.0
        for i in range(m):
            if member[b, i]:
                sw += w[i]
                swg += w[i] * G[i]
        out[b, 0] = sw
        out[b, 1] = swg
    return out


@kernel(parallel=True)
def _segment_sums(key, w, G, member, S0, C0, ate, xq, claim, out):
    """Per replicate: sum w C/S, sum w (C - S ate), and C(x) at the grid points this rank claims."""
    R, m = member.shape
    nq = xq.shape[1]
    for b in prange(R):
        S = S0[b]
        C = C0[b]
        a = 0.0
        qn = 0.0
        done = zeros(nq, np.bool_)
        last = 0.0
        i = 0
        while i < m:
            j = i
            sw = 0.0
            swg = 0.0
            while j < m and key[j] == key[i]:
                if member[b, j]:
                    sw += w[j]
                    swg += w[j] * G[j]
                j += 1
            if sw > 0.0:
                gbar = swg / sw
                last = gbar
                for r in range(i, j):
                    if member[b, r]:
                        prev_s = S
                        prev_c = C
                        S += w[r]
                        C += w[r] * gbar
                        a += w[r] * C / S
                        qn += w[r] * (C - S * ate[b])
                        for t in range(nq):
                            if claim[b, t] and not done[t] and xq[b, t] <= S:
                                out[b, 2 + t] = prev_c + (xq[b, t] - prev_s) * gbar
                                done[t] = True
            i = j
        for t in range(nq):
            if claim[b, t] and not done[t]:
                # the grid point lies past this segment's last row only by rounding
                out[b, 2 + t] = C + (xq[b, t] - S) * last
        out[b, 0] = a
        out[b, 1] = qn


def _statistics_reference(key, w, G, q):
    """Slow single-process AUTOC, QINI and TOC(q) of one sample (tests)."""
    o = np.lexsort((np.arange(len(key)), -key))
    key, w, G = key[o], w[o], G[o]
    Gbar = G.copy()
    for v in np.unique(key):
        rows = key == v
        Gbar[rows] = (w[rows] * G[rows]).sum() / w[rows].sum()
    S = np.cumsum(w)
    C = np.cumsum(w * Gbar)
    W, ate = S[-1], C[-1] / S[-1]
    toc_rows = C / S - ate
    autoc = (w * toc_rows).sum() / W
    qini = (S / W * w * toc_rows).sum() / W
    toc = []
    for x in q * W:
        i = int(np.searchsorted(S, x - 1e-12 * W))
        prev_s = S[i - 1] if i else 0.0
        prev_c = C[i - 1] if i else 0.0
        toc.append((prev_c + (x - prev_s) * Gbar[i]) / x - ate)
    return autoc, qini, np.array(toc)


def rate_statistics(comm, scores, priorities, weight, unit_ids, gids, *, q=None, n_bootstrap=200, seed=0):
    """AUTOC, QINI and TOC of one effect column, for the full sample and every bootstrap replicate.

    Parameters
    ----------
    comm : native.comm.Communicator
    scores, priorities, weight : ndarray, shape (n_local,)
        Rows with zero weight are left out.
    unit_ids : ndarray of int64, shape (n_local,)
        Global id of each row's bootstrap unit (cluster code, or row id).
    gids : ndarray of int64, shape (n_local,)
        Global row ids (break ties in the ranking order).
    q : array-like, optional
        TOC grid (default ``0.1, 0.2, ..., 1``).
    n_bootstrap : int
    seed : int

    Returns
    -------
    dict
        ``autoc``, ``qini`` (arrays of length ``1 + n_bootstrap``, the full sample
        first) and ``toc`` (``(1 + n_bootstrap, len(q))``), and ``q``.
    """
    q = check_q(q)
    keep = np.asarray(weight) > 0
    key, gid_sorted, pay = sort_descending(comm, np.asarray(priorities, dtype=np.float64)[keep],
                                           np.asarray(gids, dtype=np.int64)[keep],
                                           np.column_stack([np.asarray(weight, np.float64)[keep],
                                                            np.asarray(scores, np.float64)[keep],
                                                            np.asarray(unit_ids)[keep].astype(np.float64)]))
    w, G, units = pay[:, 0].copy(), pay[:, 1].copy(), pay[:, 2].astype(np.int64)
    m = len(key)
    sizes = col.allgatherv(comm, np.array([m], dtype=np.int64)) if comm.size > 1 else np.array([m])
    R1 = int(n_bootstrap) + 1
    chunk = int(max(1, min(R1, MASK_BYTES // max(1, int(sizes.max())))))
    autoc = np.empty(R1)
    qini = np.empty(R1)
    toc = np.empty((R1, len(q)))
    for lo in range(0, R1, chunk):
        reps = np.arange(lo, min(R1, lo + chunk))
        member = np.empty((len(reps), m), dtype=np.bool_)
        for j, b in enumerate(reps):
            member[j] = True if b == 0 else uniform(seed, _BOOT + 16 * int(b), units) < 0.5
        mine = _segment_totals(w, G, member)                       # (r, 2)
        table = col.allgather(comm, mine[None]) if comm.size > 1 else mine[None]   # (p, r, 2)
        # Cumulative sums over ranks, the same numbers on every rank: the intervals
        # (S0, S1] of the ranks partition (0, W] exactly, so each grid point is claimed once.
        cum = np.cumsum(table, axis=0)
        S0 = cum[comm.rank - 1, :, 0] if comm.rank else np.zeros(len(reps))
        C0 = cum[comm.rank - 1, :, 1] if comm.rank else np.zeros(len(reps))
        S1 = cum[comm.rank, :, 0]
        W = cum[-1, :, 0]
        ate = np.where(W > 0, cum[-1, :, 1] / np.where(W > 0, W, 1.0), np.nan)
        xq = W[:, None] * q[None, :]
        claim = (S0[:, None] < xq) & (xq <= S1[:, None])
        out = np.zeros((len(reps), 2 + len(q)))
        _segment_sums(key, w, G, member, S0, C0, ate, xq, claim, out)
        if comm.size > 1:
            out = col.allreduce(comm, out)
        with np.errstate(divide="ignore", invalid="ignore"):
            autoc[reps] = out[:, 0] / W - ate
            qini[reps] = out[:, 1] / (W * W)
            toc[reps] = out[:, 2:] / xq - ate[:, None]
    return {"autoc": autoc, "qini": qini, "toc": toc, "q": q}


def rank_average_treatment_effect(comm, scores, priorities, weight, unit_ids, gids, *, target="AUTOC", q=None,
                                  n_bootstrap=200, seed=0, contrasts=None, n_units=None):
    """RATE of a prioritisation rule with half-sample bootstrap standard errors.

    Parameters
    ----------
    comm : native.comm.Communicator
    scores : ndarray, shape (n_local, E)
        Doubly robust scores of ``E`` effect columns (arms against control).
    priorities : ndarray, shape (n_local,) or (n_local, E)
        Priority scores (higher is treated first); one column per effect column
        or one shared by all.
    weight : ndarray, shape (n_local,)
        Observation weights (0 leaves a row out).
    unit_ids, gids : ndarray of int64, shape (n_local,)
        Bootstrap units (cluster codes or row ids) and global row ids.
    target : {"AUTOC", "QINI"}
    q : array-like, optional
    n_bootstrap : int
        Replicates (grf's ``R``, default 200).
    seed : int
    contrasts : sequence of str, optional
        Names of the ``E`` effect columns (needed when ``E > 1``).
    n_units : int, optional
        Number of bootstrap units with positive weight (all ranks), checked against
        the half-sample's needs.

    Returns
    -------
    forest.analysis.result.RATEResult
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if int(n_bootstrap) < 2:
        raise ValueError(f"n_bootstrap must be at least 2, got {n_bootstrap}")
    if n_units is not None and n_units < 4:
        raise ValueError(f"the half-sample bootstrap needs at least 4 units (clusters, or rows), got {n_units}")
    scores = np.asarray(scores, dtype=np.float64)
    n, E = scores.shape
    prio = np.asarray(priorities, dtype=np.float64)
    if prio.shape not in ((n,), (n, E)):
        raise ValueError(f"priorities must have shape ({n},) or ({n}, {E}), got {prio.shape}")
    if not np.all(np.isfinite(prio)):
        raise ValueError("priorities contain NaN or infinite values")
    est, se, toc, toc_se = [], [], [], []
    for e in range(E):
        stats = rate_statistics(comm, scores[:, e], prio if prio.ndim == 1 else prio[:, e], weight, unit_ids, gids,
                                q=q, n_bootstrap=n_bootstrap, seed=seed)
        value = stats["autoc"] if target == "AUTOC" else stats["qini"]
        est.append(value[0])
        se.append(np.std(value[1:], ddof=1))
        toc.append(stats["toc"][0])
        toc_se.append(np.std(stats["toc"][1:], axis=0, ddof=1))
        q_used = stats["q"]
    if E == 1:
        return RATEResult(target, est[0], se[0], q=q_used, toc=toc[0], toc_stderr=toc_se[0], n_bootstrap=n_bootstrap)
    names = [f"effect {j}" for j in range(E)] if contrasts is None else list(contrasts)
    return RATEResult(target, np.array(est), np.array(se), q=q_used, toc=np.array(toc), toc_stderr=np.array(toc_se),
                      n_bootstrap=n_bootstrap, contrasts=names)



#: Terms of :func:`compare_priorities`, grf's names for two priority columns.
COMPARISON_TERMS = ("priority 1", "priority 2", "priority 1 - priority 2")


def compare_priorities(comm, scores, first, second, weight, unit_ids, gids, *, target="AUTOC", q=None,
                       n_bootstrap=200, seed=0, contrasts=None):
    """RATE of two prioritisation rules and of their difference, from the same bootstrap replicates.

    grf's ``rank_average_treatment_effect`` with two priority columns: each rule's RATE and
    ``RATE(first) - RATE(second)``, whose standard error is the spread of the paired
    differences over replicates (a unit is in replicate ``b`` for both rules or for
    neither), so what the two rules share cancels.

    Parameters
    ----------
    comm : native.comm.Communicator
    scores : ndarray, shape (n_local, E)
    first, second : ndarray, shape (n_local,) or (n_local, E)
        The two rules' priorities (higher treated first).
    weight, unit_ids, gids, target, q, n_bootstrap, seed, contrasts
        As :func:`rank_average_treatment_effect`.

    Returns
    -------
    forest.analysis.result.EstimateTable
        Terms :data:`COMPARISON_TERMS`; one row per effect column when ``E > 1``.
    """
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if int(n_bootstrap) < 2:
        raise ValueError(f"n_bootstrap must be at least 2, got {n_bootstrap}")
    scores = np.asarray(scores, dtype=np.float64)
    n, E = scores.shape
    rules = []
    for prio in (first, second):
        prio = np.asarray(prio, dtype=np.float64)
        if prio.shape not in ((n,), (n, E)):
            raise ValueError(f"priorities must have shape ({n},) or ({n}, {E}), got {prio.shape}")
        if not np.all(np.isfinite(prio)):
            raise ValueError("priorities contain NaN or infinite values")
        rules.append(prio)
    key = "autoc" if target == "AUTOC" else "qini"
    est, se = [], []
    for e in range(E):
        values = [rate_statistics(comm, scores[:, e], p if p.ndim == 1 else p[:, e], weight, unit_ids, gids, q=q,
                                  n_bootstrap=n_bootstrap, seed=seed)[key] for p in rules]
        diff = values[0] - values[1]
        est.append([values[0][0], values[1][0], diff[0]])
        se.append([np.std(v[1:], ddof=1) for v in (values[0], values[1], diff)])
    title = f"RATE ({target}) of two prioritisation rules and their difference ({n_bootstrap} paired half-sample " \
            f"bootstrap replicates)"
    if E == 1:
        return EstimateTable(COMPARISON_TERMS, est[0], se[0], title=title)
    names = [f"effect {j}" for j in range(E)] if contrasts is None else list(contrasts)
    return EstimateTable(COMPARISON_TERMS, np.array(est), np.array(se), title=title, contrasts=names)

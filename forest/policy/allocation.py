"""Budgeted targeting: choose at most one action per unit under a global budget; cost curves.

This module owns :func:`allocate` (the multiple-choice knapsack of targeting), its
distributed form, and :func:`cost_curves` (incremental gain against spend).

The problem
-----------
Unit ``i`` may get one action ``a`` with estimated gain ``v[i, a]`` (over doing
nothing) at cost ``c[i, a] >= 0``, or nothing. Maximise ``sum v`` subject to
``sum c <= B``. This is the multiple-choice knapsack problem (NP-hard in general).

The algorithm: the LP relaxation's greedy, then a fill
------------------------------------------------------
1. Per unit, the options worth considering lie on the *upper concave hull* of the
   points ``(c, v)`` with ``v > 0`` (and, optionally, a lower confidence bound > 0),
   starting from "nothing" at ``(0, 0)``; every other option is dominated, in the LP
   sense, by a mix of two hull neighbours. Walking the hull gives *segments*
   (upgrade from one option to the next) with incremental cost, gain and ROI
   ``dv / dc``, ROIs decreasing along each unit's hull (a free option has ROI
   ``+inf``).
2. The LP relaxation (Sinha and Zoltners, 1979) is solved exactly by taking segments
   in decreasing ROI until the budget runs out, the last one fractionally. Its
   value ``lp_bound`` is an upper bound on every integer allocation.
3. Rounding down (dropping the fractional segment, whose unit keeps its previous
   option) loses at most that segment's gain ``dv <= max_a v[i, a]``. So the
   result is within one unit's gain of the optimum:
   ``OPT - max_{i,a} v[i, a] <= value <= OPT <= lp_bound``.
4. Fill: the scan then goes on in the same order over the remaining segments,
   taking each that still fits; a unit whose segment does not fit stays where it
   is (its later segments need that one). This only adds gain.

Ties in ROI go to the lower global row id, then to the lower hull segment, so the
order is total and the same at any rank count. Costs are rounded *up* to multiples
of ``2^-e`` (one exponent, :func:`forest.policy.exact.fixed_point_exponent`) and the
budget down, so every spend is an exact integer sum, identical on all ranks, and the
allocation never exceeds the true budget.

Distributed
-----------
Ranks hold their units; the budget is global. The cut-off of the greedy (the first
segment, in the global order, at which the cumulative cost exceeds what is left) is
found by a 64-way search over the order keys: each step is one small allreduce of
64 partial sums per cut-off, about 11 steps per key, and the ROI key and the row key
are searched one after the other. The fill repeats this per round; each round takes
at least one segment, and a segment costing more than what is left drops out for
good, so rounds are few in practice (``n_rounds`` says how many).
"""
import numpy as np

from histogram.jit import kernel, empty
from native import collectives as col
from native.comm import world

from forest.policy.exact import fixed_point_exponent, global_max

#: Probes per step of the distributed cut-off search.
_PROBES = 64


# ---------------------------------------------------------------------------- inputs

def check_allocation_inputs(effects, costs, lower=None):
    """Effects (n, A), costs broadcast to (n, A), eligibility mask (n, A).

    Costs must be >= 0 and not NaN; ``+inf`` marks an action a unit cannot get.
    Effects must be finite. An option is eligible when its effect (and ``lower``,
    if given) is > 0 and its cost is finite.

    Returns
    -------
    effects, costs : ndarray of float64, shape (n, A)
    eligible : ndarray of bool, shape (n, A)
    """
    v = np.asarray(effects, dtype=np.float64)
    if v.ndim == 1:
        v = v.reshape(-1, 1)
    if v.ndim != 2 or v.shape[1] < 1:
        raise ValueError(f"effects must have shape (n, n_actions), got {np.shape(effects)}")
    if not np.all(np.isfinite(v)):
        raise ValueError("effects contain NaN or infinite values")
    c = np.asarray(costs, dtype=np.float64)
    if c.ndim == 1 and c.shape[0] == v.shape[1]:
        c = np.broadcast_to(c, v.shape)
    elif c.ndim == 1 and v.shape[1] == 1 and c.shape[0] == v.shape[0]:
        c = c.reshape(-1, 1)
    if c.shape != v.shape:
        raise ValueError(f"costs must have shape (n_actions,) = ({v.shape[1]},) or (n, n_actions) = {v.shape}, "
                         f"got {np.shape(costs)}")
    if np.isnan(c).any() or (c < 0).any():
        raise ValueError("costs must be >= 0 (use +inf for an action a unit cannot get), got NaN or negative values")
    eligible = (v > 0) & np.isfinite(c)
    if lower is not None:
        lo = np.asarray(lower, dtype=np.float64)
        if lo.ndim == 1 and v.shape[1] == 1:
            lo = lo.reshape(-1, 1)
        if lo.shape != v.shape:
            raise ValueError(f"lower must have the shape of effects {v.shape}, got {lo.shape}")
        eligible &= lo > 0
    return v, np.ascontiguousarray(c), eligible


# ---------------------------------------------------------------------------- hulls

@kernel
def _hulls(v, c, eligible, order):
    """Upper concave hull segments of every unit (see :func:`hull_segments`)."""
    n, A = v.shape
    unit = empty(n * A, np.int64)
    seg = empty(n * A, np.int64)
    src = empty(n * A, np.int64)
    dst = empty(n * A, np.int64)
    k = 0
    hull = empty(A + 1, np.int64)
    for i in range(n):
        # the best free option (if any) is where the hull starts; -1 is "nothing" at (0, 0)
        start = -1
        for a in range(A):
            if eligible[i, a] and c[i, a] == 0.0 and (start < 0 or v[i, a] > v[i, start]):
                start = a
        hull[0] = start
        h = 1
        best_v = 0.0 if start < 0 else v[i, start]
        for r in range(A):
            a = order[i, r]
            if not eligible[i, a] or c[i, a] == 0.0 or v[i, a] <= best_v:
                continue  # dominated: costs at least as much as a better option
            best_v = v[i, a]
            # drop hull points below the chord (collinear points stay: each is an option)
            while h >= 2:
                p, q = hull[h - 2], hull[h - 1]
                vp = 0.0 if p < 0 else v[i, p]
                cp = 0.0 if p < 0 else c[i, p]
                if (v[i, q] - vp) * (c[i, a] - c[i, q]) < (v[i, a] - v[i, q]) * (c[i, q] - cp):
                    h -= 1
                else:
                    break
            hull[h] = a
            h += 1
        s = 0
        if start >= 0:  # getting the free option is a segment of its own, ROI +inf
            unit[k], seg[k], src[k], dst[k] = i, 0, -1, start
            k += 1
            s = 1
        for j in range(1, h):
            unit[k], seg[k], src[k], dst[k] = i, s, hull[j - 1], hull[j]
            k += 1
            s += 1
    return unit[:k], seg[:k], src[:k], dst[:k]


def hull_segments(v, c, eligible):
    """Upper-concave-hull segments of every unit's options.

    Parameters
    ----------
    v, c : ndarray of float64, shape (n, A)
    eligible : ndarray of bool, shape (n, A)

    Returns
    -------
    unit, seg, src, dst : ndarray of int64, shape (n_segments,)
        Segment ``seg`` (0, 1, ... along the hull) of unit ``unit`` moves it from
        option ``src`` (``-1``: nothing) to ``dst``. Segments of a unit are
        consecutive and their ROIs do not increase.
    """
    # options by increasing cost, higher effect first among equal costs, then lower index
    order = np.lexsort((np.arange(v.shape[1])[None, :].repeat(len(v), 0), -v, c), axis=1) if len(v) else \
        np.zeros(v.shape, dtype=np.int64)
    return _hulls(v, c, eligible, np.ascontiguousarray(order, dtype=np.int64))


def hull_segments_reference(v, c, eligible):
    """NumPy/Python reference of :func:`hull_segments` (tests)."""
    out = ([], [], [], [])
    for i in range(len(v)):
        opts = [a for a in range(v.shape[1]) if eligible[i, a]]
        free = [a for a in opts if c[i, a] == 0]
        start = max(free, key=lambda a: (v[i, a], -a)) if free else -1
        pts = [(0.0, 0.0 if start < 0 else v[i, start], start)]
        best = pts[0][1]
        for a in sorted((a for a in opts if c[i, a] > 0), key=lambda a: (c[i, a], -v[i, a], a)):
            if v[i, a] <= best:
                continue
            best = v[i, a]
            while len(pts) >= 2:
                (c0, v0, _), (c1, v1, _) = pts[-2], pts[-1]
                if (v1 - v0) * (c[i, a] - c1) < (v[i, a] - v1) * (c1 - c0):
                    pts.pop()
                else:
                    break
            pts.append((c[i, a], v[i, a], a))
        chain = ([(-1, start)] if start >= 0 else []) + [(pts[j - 1][2], pts[j][2]) for j in range(1, len(pts))]
        for s, (a, b) in enumerate(chain):
            for lst, x in zip(out, (i, s, a, b)):
                lst.append(x)
    return tuple(np.array(x, dtype=np.int64) for x in out)


# ---------------------------------------------------------------------------- order keys

def _roi_key(dv, dc):
    """uint64 keys whose ascending order is decreasing ROI ``dv / dc`` (``dc = 0``: +inf)."""
    with np.errstate(divide="ignore"):
        roi = np.where(dc > 0, dv / np.where(dc > 0, dc, 1.0), np.inf)
    bits = (-roi).view(np.uint64)
    flip = np.where(bits >> np.uint64(63) == 1, np.uint64(0xFFFFFFFFFFFFFFFF), np.uint64(1) << np.uint64(63))
    return bits ^ flip, roi


class Segments:
    """This rank's hull segments with their global order keys and exact integer costs.

    Attributes
    ----------
    unit, seg, src, dst : ndarray of int64
    k1 : ndarray of uint64
        Primary key (ascending = decreasing ROI).
    k2 : ndarray of int64
        Secondary key: ``global row * n_actions + seg``.
    cost_q : ndarray of float64
        Incremental cost in units of ``2^-exponent`` (exact integers).
    dv, dc, roi : ndarray of float64
    """

    def __init__(self, v, c, eligible, first_row, exponent):
        self.unit, self.seg, self.src, self.dst = hull_segments(v, c, eligible)
        rows = self.unit
        cq = np.ceil(np.ldexp(np.where(np.isfinite(c), c, 0.0), exponent))
        pick = lambda m, a: np.where(a >= 0, m[rows, np.maximum(a, 0)], 0.0)  # noqa: E731
        self.dv = pick(v, self.dst) - pick(v, self.src)
        self.dc = pick(c, self.dst) - pick(c, self.src)
        self.cost_q = pick(cq, self.dst) - pick(cq, self.src)
        self.k1, self.roi = _roi_key(self.dv, self.dc)
        self.k2 = (first_row + rows) * v.shape[1] + self.seg
        order = np.lexsort((self.k2, self.k1))
        for name in ("unit", "seg", "src", "dst", "dv", "dc", "cost_q", "k1", "roi", "k2"):
            setattr(self, name, getattr(self, name)[order])


def _kary_search(comm, lo, hi, local_weight, limits):
    """Per cut-off, the smallest key ``t`` in ``[lo, hi]`` with ``W(t) > limit`` (global W).

    ``local_weight(probes)`` gives this rank's ``W`` at keys ``probes`` of shape
    (n_cuts, m); ``W`` is non-decreasing and ``W(hi) > limit`` must hold.
    Keys are uint64 (python ints fit: both key kinds are non-negative).
    """
    lo = np.array(lo, dtype=np.uint64)
    hi = np.array(hi, dtype=np.uint64)
    steps = np.arange(_PROBES, dtype=np.uint64)
    rows = np.arange(len(lo))
    while (lo < hi).any():
        # probes lo = p_0 < p_1 < ... inside [lo, hi): the answer is hi, or follows the last
        # probe at or under the limit
        span = hi - lo
        step = np.maximum(span // np.uint64(_PROBES), np.uint64(1))
        probes = lo[:, None] + np.minimum(step[:, None] * steps[None, :], (span - (span > 0))[:, None])
        w = np.ascontiguousarray(local_weight(probes), dtype=np.float64)
        if comm.size > 1:
            w = col.allreduce(comm, w)
        over = w > limits[:, None]
        first = np.where(over.any(axis=1), over.argmax(axis=1), _PROBES)
        new_hi = np.where(first < _PROBES, probes[rows, np.minimum(first, _PROBES - 1)], hi)
        new_lo = np.where(first > 0, probes[rows, np.maximum(first - 1, 0)] + np.uint64(1), lo)
        busy = lo < hi
        lo, hi = np.where(busy, new_lo, lo), np.where(busy, new_hi, hi)
    return lo


def global_cutoffs(comm, segs, active, limits):
    """The first segment, in the global order, where the cumulative cost passes each limit.

    Parameters
    ----------
    comm : native.comm.Communicator
    segs : Segments
    active : ndarray of bool
        Segments still in play (sorted like ``segs``).
    limits : ndarray of float64, shape (n_cuts,)
        Integer-valued cost limits (units of ``2^-exponent``).

    Returns
    -------
    found : ndarray of bool, shape (n_cuts,)
        False where every active segment fits.
    k1, k2 : ndarray, shape (n_cuts,)
        Keys of the cut-off segment (meaningless where not found).
    """
    limits = np.asarray(limits, dtype=np.float64)
    k1, k2 = segs.k1[active], segs.k2[active]
    cum = np.concatenate([[0.0], np.cumsum(segs.cost_q[active])])
    total = np.array([cum[-1]])
    if comm.size > 1:
        total = col.allreduce(comm, total)
    found = total[0] > limits
    n_cut = len(limits)
    top = np.iinfo(np.uint64).max
    t = _kary_search(comm, np.zeros(n_cut, dtype=np.uint64), np.where(found, top, 0).astype(np.uint64),
                     lambda p: cum[np.searchsorted(k1, p.reshape(-1), side="right")].reshape(p.shape), limits)
    # within the ROI tie t: the row key
    left = np.searchsorted(k1, t, side="left")
    right = np.searchsorted(k1, t, side="right")

    def within(p):
        out = np.empty(p.shape)
        for j in range(n_cut):
            sub = k2[left[j]:right[j]].view(np.uint64) if right[j] > left[j] else np.zeros(0, dtype=np.uint64)
            out[j] = cum[left[j] + np.searchsorted(sub, p[j], side="right")]
        return out

    u = _kary_search(comm, np.zeros(n_cut, dtype=np.uint64),
                     np.where(found, np.uint64(np.iinfo(np.int64).max), 0).astype(np.uint64), within, limits)
    return found, t, u.astype(np.int64)


def _before(segs, active, t, u):
    """Active segments strictly before the key (t, u)."""
    return active & ((segs.k1 < t) | ((segs.k1 == t) & (segs.k2 < u)))


def final_actions(segs, taken, n):
    """Each unit's option after its taken segments (the first ones of its hull), -1 for none."""
    last = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last, segs.unit[taken], segs.seg[taken])
    end = taken & (segs.seg == last[segs.unit])
    action = np.full(n, -1, dtype=np.int64)
    action[segs.unit[end]] = segs.dst[end]
    return action


def _global_sum(comm, x):
    x = np.ascontiguousarray(np.atleast_1d(np.asarray(x, dtype=np.float64)))
    return col.allreduce(comm, x) if comm.size > 1 else x


# ---------------------------------------------------------------------------- allocate

class Allocation:
    """Result of :func:`allocate`.

    Attributes
    ----------
    action : ndarray of int64, shape (n_local,)
        Chosen action per unit of this rank, ``-1`` for none.
    value : float
        Total estimated gain ``sum v[i, action_i]`` over all ranks.
    spend : float
        Total cost over all ranks (``<= budget``).
    lp_bound : float
        Value of the LP relaxation: no allocation can beat it.
    roi_threshold : float
        ROI of the segment the budget cut (the LP's price of the budget); ``0.0``
        when every worthwhile option fits.
    n_rounds : int
        Cut-off searches run (1 + fill rounds).
    """

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        return (f"Allocation(value={self.value:.6g}, spend={self.spend:.6g}, lp_bound={self.lp_bound:.6g}, "
                f"roi_threshold={self.roi_threshold:.6g}, n_rounds={self.n_rounds})")


def _layout(v, c, comm):
    """This rank's first global row and the fixed-point exponent of the costs (collective)."""
    if comm.size == 1:
        first, n_global = 0, len(v)
    else:
        widths = col.allgather_object(comm, int(v.shape[1]))
        if len(set(widths)) != 1:
            raise ValueError(f"ranks disagree on the number of actions: {widths}")
        first, n_global = col.global_row_offset(comm, len(v))
    finite = c[np.isfinite(c)]
    exponent = fixed_point_exponent(global_max(comm, finite.max() if finite.size else 0.0), max(n_global, 1))
    return first, exponent


def allocate(effects, costs, budget, *, lower=None, comm=None):
    """At most one action per unit, maximising total estimated gain within a budget.

    Parameters
    ----------
    effects : array-like, shape (n_local, A)
        Estimated gain of each action over doing nothing (e.g. CATE per arm).
    costs : array-like, shape (A,) or (n_local, A)
        Cost of each action (per unit); ``+inf`` where a unit cannot get it.
    budget : float
        Total budget over all ranks' units (``>= 0``; ``inf`` for none).
    lower : array-like, shape (n_local, A), optional
        Lower confidence bounds of the effects: only options with ``lower > 0``
        are considered.
    comm : native.comm.Communicator, optional
        Units spread over ranks (collective); ``None`` means ``native.comm.world()``.

    Returns
    -------
    Allocation
        The same actions for every unit at any rank count.

    Notes
    -----
    The LP relaxation's greedy on incremental ROI, rounded down, then a fill (module
    docstring): ``OPT - max v <= value <= OPT <= lp_bound``.
    """
    comm = world() if comm is None else comm
    budget = float(budget)
    if np.isnan(budget) or budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    v, c, eligible = check_allocation_inputs(effects, costs, lower)
    first, exponent = _layout(v, c, comm)
    segs = Segments(v, c, eligible, first, exponent)
    left = np.floor(min(np.ldexp(budget, exponent), 2.0 ** 53))
    active = np.ones(len(segs.k1), dtype=bool)
    taken = np.zeros(len(segs.k1), dtype=bool)
    lp_bound, roi_threshold, rounds = None, 0.0, 0
    while True:
        found, t, u = global_cutoffs(comm, segs, active, np.array([left]))
        rounds += 1
        if not found[0]:
            taken |= active
            break
        prefix = _before(segs, active, t[0], u[0])
        cut = active & (segs.k1 == t[0]) & (segs.k2 == u[0])  # on one rank only
        spent, cut_cost, cut_dv, cut_roi, prefix_dv = _global_sum(comm, [
            segs.cost_q[prefix].sum(), segs.cost_q[cut].sum(), segs.dv[cut].sum(), segs.roi[cut].sum(),
            segs.dv[prefix].sum()])
        if rounds == 1:  # the LP optimum: this prefix plus the fitting fraction of the cut segment
            lp_bound = prefix_dv + cut_dv * (left - spent) / cut_cost
            roi_threshold = float(cut_roi)
        taken |= prefix
        left -= spent
        # the cut unit stays where it is, and so does every unit whose next segment no longer fits
        stuck = active & ~prefix & (cut | (segs.cost_q > left))
        first_stuck = np.full(len(v), np.iinfo(np.int64).max)
        np.minimum.at(first_stuck, segs.unit[stuck], segs.seg[stuck])
        active &= ~prefix & (segs.seg < first_stuck[segs.unit])
        if _global_sum(comm, [active.sum()])[0] == 0:
            break
    action = final_actions(segs, taken, len(v))
    rows = np.flatnonzero(action >= 0)
    value, spend = _global_sum(comm, [v[rows, action[rows]].sum(), c[rows, action[rows]].sum()])
    return Allocation(action=action, value=float(value), spend=float(spend),
                      lp_bound=float(value if lp_bound is None else lp_bound), roi_threshold=roi_threshold,
                      n_rounds=rounds)


def allocate_reference(effects, costs, budget, lower=None):
    """Single-process reference of :func:`allocate`: one scan of the globally sorted segments.

    Returns
    -------
    ndarray of int64, shape (n,)
        Actions (``-1`` none).
    """
    v, c, eligible = check_allocation_inputs(effects, costs, lower)
    unit, seg, src, dst = hull_segments_reference(v, c, eligible)
    finite = c[np.isfinite(c)]
    e = fixed_point_exponent(finite.max() if finite.size else 0.0, max(len(v), 1))
    cq = np.ceil(np.ldexp(np.where(np.isfinite(c), c, 0.0), e))
    val = lambda m, a: np.where(a >= 0, m[unit, np.maximum(a, 0)], 0.0)  # noqa: E731
    dv, dc, dq = val(v, dst) - val(v, src), val(c, dst) - val(c, src), val(cq, dst) - val(cq, src)
    with np.errstate(divide="ignore"):
        roi = np.where(dc > 0, dv / np.where(dc > 0, dc, 1.0), np.inf)
    left = np.floor(min(np.ldexp(float(budget), e), 2.0 ** 53))
    action = np.full(len(v), -1, dtype=np.int64)
    frozen = np.zeros(len(v), dtype=bool)
    for k in sorted(range(len(unit)), key=lambda k: (-roi[k], unit[k], seg[k])):
        i = unit[k]
        if frozen[i]:
            continue
        if dq[k] <= left:
            left -= dq[k]
            action[i] = dst[k]
        else:
            frozen[i] = True
    return action


# ---------------------------------------------------------------------------- cost curves

class CostCurve:
    """Gain against spend when buying options in decreasing estimated ROI.

    Attributes
    ----------
    spend : ndarray, shape (n_points,)
        Equally spaced spend levels from 0 to ``total_spend``.
    gain : ndarray, shape (n_points,)
        Summed evaluation scores of what that spend buys (linear within a segment).
    total_spend, total_gain : float
    area : float
        Mean of the gain over the spend range (trapezoid rule), in outcome units.
    aucc : float
        Area under the cost curve over ``total_spend * total_gain``: 0.5 for
        targeting in random order, towards 1 for a ranking that front-loads the gain;
        NaN when ``total_gain <= 0``.
    """

    def __init__(self, spend, gain):
        self.spend, self.gain = spend, gain
        self.total_spend, self.total_gain = float(spend[-1]), float(gain[-1])
        span = self.total_spend
        self.area = float(np.trapezoid(gain, spend) / span) if span > 0 else 0.0
        self.aucc = self.area / self.total_gain if self.total_gain > 0 else float("nan")

    def as_dict(self):
        return {"spend": self.spend, "gain": self.gain, "total_spend": self.total_spend,
                "total_gain": self.total_gain, "area": self.area, "aucc": self.aucc}


def _curve(comm, v, c, eligible, scores, first, exponent, n_points):
    segs = Segments(v, c, eligible, first, exponent)
    pick = lambda a: np.where(a >= 0, scores[segs.unit, np.maximum(a, 0)], 0.0)  # noqa: E731
    ds = pick(segs.dst) - pick(segs.src)
    active = np.ones(len(segs.k1), dtype=bool)
    total = _global_sum(comm, [segs.cost_q.sum()])[0]
    levels = np.floor(np.linspace(0.0, total, n_points))
    found, t, u = global_cutoffs(comm, segs, active, levels)
    lo = np.searchsorted(segs.k1, t, side="left")
    hi = np.searchsorted(segs.k1, t, side="right")
    m = np.array([lo[j] + np.searchsorted(segs.k2[lo[j]:hi[j]], u[j]) if found[j] else len(segs.k1)
                  for j in range(n_points)], dtype=np.int64)
    cum_q = np.concatenate([[0.0], np.cumsum(segs.cost_q)])
    cum_s = np.concatenate([[0.0], np.cumsum(ds)])
    here = found & (m < len(segs.k1))
    here[here] &= (segs.k1[m[here]] == t[here]) & (segs.k2[m[here]] == u[here])
    mm = np.minimum(m, max(len(segs.k1) - 1, 0))
    cut_q = np.where(here, segs.cost_q[mm] if len(segs.k1) else 0.0, 0.0)
    cut_s = np.where(here, ds[mm] if len(segs.k1) else 0.0, 0.0)
    sums = _global_sum(comm, np.concatenate([cum_q[m], cum_s[m], cut_q, cut_s])).reshape(4, n_points)
    with np.errstate(invalid="ignore", divide="ignore"):
        frac = np.where(sums[2] > 0, (levels - sums[0]) / sums[2], 0.0)
    gain = sums[1] + frac * sums[3]
    return CostCurve(np.ldexp(levels, -exponent), gain)


def cost_curves(effects, costs, scores, *, lower=None, n_points=101, per_arm=True, comm=None):
    """Cost curves of targeting by estimated ROI, evaluated with (held-out) scores.

    Options are bought in the order :func:`allocate` would buy them with an ever
    larger budget (decreasing incremental ROI of ``effects``); what each purchase
    adds is measured by ``scores`` instead (e.g. doubly robust scores of each arm
    against control on rows the effect model never saw, which makes the curve an
    honest estimate). The multi-arm curve follows the hull walk across arms; the
    per-arm curves offer one arm alone.

    Parameters
    ----------
    effects : array-like, shape (n_local, A)
    costs : array-like, shape (A,) or (n_local, A)
    scores : array-like, shape (n_local, A)
        Evaluation score of each action against doing nothing.
    lower : array-like, shape (n_local, A), optional
        As in :func:`allocate`.
    n_points : int
        Spend levels (>= 2).
    per_arm : bool
        Also one curve per action.
    comm : native.comm.Communicator, optional

    Returns
    -------
    dict of str -> CostCurve
        ``"all"`` and, with ``per_arm``, ``"arm 0"``, ``"arm 1"``, ...
    """
    comm = world() if comm is None else comm
    if n_points < 2:
        raise ValueError(f"n_points must be >= 2, got {n_points}")
    v, c, eligible = check_allocation_inputs(effects, costs, lower)
    S = np.asarray(scores, dtype=np.float64)
    S = S.reshape(len(S), 1) if S.ndim == 1 else S
    if S.shape != v.shape or not np.all(np.isfinite(S)):
        raise ValueError(f"scores must be finite with the shape of effects {v.shape}, got {np.shape(scores)}")
    first, exponent = _layout(v, c, comm)
    curves = {"all": _curve(comm, v, c, eligible, S, first, exponent, n_points)}
    if per_arm:
        for a in range(v.shape[1]):
            one = np.zeros_like(eligible)
            one[:, a] = eligible[:, a]
            curves[f"arm {a}"] = _curve(comm, v, c, one, S, first, exponent, n_points)
    return curves

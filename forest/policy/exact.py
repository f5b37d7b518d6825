"""The distributed exact policy-tree search: which reward tables, who builds them, how they travel.

This module owns the search of :class:`forest.policy.tree.PolicyTree` from binned
features and rewards spread over ranks; the arithmetic on tables lives in
:mod:`forest.policy.search`.

The problem
-----------
Find the depth-``k`` tree over the bin boundaries (of one :class:`BinMapper`) whose
leaves, each assigned its best action, maximise the summed reward. A depth-``k``
tree's leaf sums are sums over rows inside at most ``k`` half-spaces, so the
sufficient statistic is the table of reward sums over every ``k``-tuple of features
and their bins (depth 1: per-bin sums; depth 2: per pair of features, per pair of
bins; depth 3: triples). ``max_a`` is not additive, so ranks must add their tables
*before* the search, and the table is what is large: at depth 2 it has
``S (S + 1) / 2 * nb^2 * (A + 1)`` cells, 6.5 GB at 50 features, 256 bins and 10
actions, and the search reads each cell once (``O(S^2 nb^2 A)`` work).

Exactness that does not depend on the rank count
------------------------------------------------
Rewards (times sample weights) are rounded to multiples of ``2^-e``, one exponent for
all rows (:func:`fixed_point_exponent`), chosen so every possible sum stays below
``2^52``: every table cell is then an exact integer in float64, whatever order rows
or ranks added it in, and every comparison of two trees is exact. Ties follow one
strict order (:mod:`forest.policy.search`), so every rank count finds the same tree,
bit for bit. The rounding changes a tree's total reward by at most
``n 2^-(e+1)``, about ``n / 2^52`` of ``n max|reward|`` (2e-10 relative at a million
rows); it can only matter between trees that tie to that precision.

Two ways to share the work (``exchange``)
----------------------------------------
Tables are built and searched in blocks (one root-table feature, or pair, and a
range of the remaining features, sized to :data:`BLOCK_BUDGET_BYTES`).

``"tables"``
    Every rank builds each block from its own rows with the histogram kernel
    (:func:`histogram.kernels.build_histograms`, rows grouped by the bin of the block's
    first feature(s)), the block is reduce-scattered along its feature axis, and
    each rank searches its slice. Bytes per rank: about the table size, whatever
    the number of rows; memory: one block.
``"rows"``
    Ranks allgather the binned codes and fixed-point rewards (``S + 8 (A + 1)``
    bytes per row), and each rank builds and searches its share of the blocks from
    all rows. Bytes per rank: about the data size; memory: all rows.
``"auto"``
    The one predicted to send fewer bytes (:func:`predicted_bytes`). At one million
    rows, 50 features, 10 actions and 64 bins the data is 138 MB and the depth-2
    table 474 MB, so rows travel; at a hundred million rows the table does.

Either way each rank ends with records for part of the candidates; one
``allreduce_best`` of the records (a few MB) gives every rank all of them, and the
upper levels of the search (tiny maxima) run on every rank.
"""
import math

import numpy as np

from histogram.kernels import build_histograms
from native import collectives as col

from forest.policy import search as ps

#: Largest reward table block built at once (bytes).
BLOCK_BUDGET_BYTES = 64 * 2**20
EXCHANGES = ("auto", "rows", "tables")
#: Sums of fixed-point rewards stay below 2**FIXED_POINT_BITS (float64 integers are exact below 2**53).
FIXED_POINT_BITS = 52


# ------------------------------------------------------------------------ fixed point

def fixed_point_exponent(max_abs, n_global):
    """Exponent ``e`` so that ``n_global`` rows of ``|x| <= max_abs`` sum exactly in units of ``2^-e``.

    Parameters
    ----------
    max_abs : float
        Largest ``|weight * reward|`` over all rows of all ranks.
    n_global : int

    Returns
    -------
    int
        ``n_global * (max_abs 2^e + 1/2) < 2^52``; 0 when every reward is 0.
    """
    if not max_abs > 0:
        return 0
    # n (max 2^e + 1/2) <= 2^51 + n/2 < 2^52 for n < 2^51
    # in logs: n_global * max_abs may overflow a float
    return int(math.floor(FIXED_POINT_BITS - 1 - math.log2(n_global) - math.log2(max_abs)))


def fixed_point(x, exponent):
    """``round(x 2^e)`` as integer-valued float64 (exact: scaling by a power of two)."""
    return np.rint(np.ldexp(np.asarray(x, dtype=np.float64), exponent))


def global_max(comm, x):
    """Largest ``x`` over the ranks (an exact selection, identical on all ranks)."""
    return float(col.allreduce_best(comm, np.array([[float(x)]]))[0, 0]) if comm.size > 1 else float(x)


# ------------------------------------------------------------------------ search space

class SearchSpace:
    """Search features: every feature, plus a twin with missing values first where needed.

    A feature with missing values anywhere (on any rank) can send them left or right.
    Its twin carries the same codes with the missing bin moved in front (missing ->
    0, value bin ``v`` -> ``v + 1``), so "codes <= b go left" on the twin is "missing
    and values up to bin ``b - 1`` go left", and every split of both kinds is a
    threshold on some search feature. The twin's position 0 (only missing left) is
    left out: it is the original's last position with the sides swapped.

    Parameters
    ----------
    mapper : histogram.binning.BinMapper
    codes : ndarray of uint8, shape (n_features, n_local)
    has_missing : ndarray of bool, shape (n_features,)
        Whether any rank has a missing value in the feature (global).

    Attributes
    ----------
    codes : ndarray of uint8, shape (S, n_local)
    feature : ndarray of int64, shape (S,)
        Original feature of each search feature.
    missing_first : ndarray of bool, shape (S,)
    lo, hi : ndarray of int64, shape (S,)
        Candidate split positions ``lo <= b < hi``.
    n_bins : int
        Code range ``[0, n_bins)`` (``mapper.n_bins_``).
    """

    def __init__(self, mapper, codes, has_missing):
        self.mapper = mapper
        self.n_bins = int(mapper.n_bins_)
        n_values = np.asarray(mapper.n_bins_non_missing_, dtype=np.int64)
        twins = np.flatnonzero(has_missing)
        self.feature = np.concatenate([np.arange(codes.shape[0]), twins]).astype(np.int64)
        self.missing_first = np.zeros(len(self.feature), dtype=bool)
        self.missing_first[codes.shape[0]:] = True
        # real feature: values 0..m-1; position m-1 (all values left, missing right)
        # exists only when there are missing values
        hi_real = np.where(has_missing, n_values, n_values - 1)
        self.lo = np.concatenate([np.zeros(codes.shape[0], dtype=np.int64), np.ones(len(twins), dtype=np.int64)])
        self.hi = np.concatenate([hi_real, n_values[twins]]).astype(np.int64)
        self.hi = np.maximum(self.hi, self.lo)
        if len(twins):
            twin_codes = codes[twins].astype(np.int16) + 1
            twin_codes[codes[twins] == mapper.missing_bin_] = 0
            self.codes = np.ascontiguousarray(np.concatenate([codes, twin_codes.astype(np.uint8)]))
        else:
            self.codes = np.ascontiguousarray(codes)

    @property
    def n_search(self):
        return len(self.feature)

    def split(self, s, b):
        """The tree split of position ``b`` of search feature ``s``.

        Returns
        -------
        feature : int
        bin_threshold : int
            Value bins ``<= bin_threshold`` go left.
        threshold : float
            Raw ``x <= threshold`` goes left (``+inf``: every value goes left).
        missing_left : bool
        """
        f = int(self.feature[s])
        bin_threshold = int(b) - 1 if self.missing_first[s] else int(b)
        thresholds = self.mapper.bin_thresholds_[f]
        threshold = float(thresholds[bin_threshold]) if bin_threshold < len(thresholds) else np.inf
        return f, bin_threshold, threshold, bool(self.missing_first[s])


# ------------------------------------------------------------------------ blocks

def blocks(depth, n_search, n_bins, n_channels, budget=BLOCK_BUDGET_BYTES):
    """The table blocks of an exact search, in a fixed order.

    Parameters
    ----------
    depth : int
        2 (pair tables) or 3 (triple tables).
    n_search, n_bins, n_channels : int

    Returns
    -------
    list of tuple
        ``(head, lo, hi)``: ``head`` is ``(s1,)`` or ``(s1, s2)``, the block holds the
        tables of ``head`` with each feature ``lo <= s < hi`` (``lo >= head[-1]``).
    """
    per_feature = n_bins ** depth * n_channels * 8
    width = max(1, budget // per_feature)
    out = []
    if depth == 2:
        heads = [(s1,) for s1 in range(n_search)]
    else:
        heads = [(s1, s2) for s1 in range(n_search) for s2 in range(s1, n_search)]
    for head in heads:
        for lo in range(head[-1], n_search, width):
            out.append((head, lo, min(n_search, lo + width)))
    return out


def block_bytes(block, n_bins, n_channels):
    """Bytes of one block's table."""
    head, lo, hi = block
    return (hi - lo) * n_bins ** (len(head) + 1) * n_channels * 8


def predicted_bytes(depth, n_global, n_search, n_bins, n_channels, p):
    """Bytes each rank is predicted to send for the tables, per exchange.

    Ring/halving collectives send about ``(p - 1) / p`` of the buffer per rank for
    both a reduce-scatter of the tables and an allgather of the rows.

    Returns
    -------
    dict
        ``{"rows": int, "tables": int}`` (0 for one rank).
    """
    if p == 1 or depth < 2:
        return {"rows": 0, "tables": 0}
    frac = (p - 1) / p
    tables = sum(block_bytes(b, n_bins, n_channels) for b in blocks(depth, n_search, n_bins, n_channels))
    rows = n_global * (n_search + 8 * n_channels)
    return {"rows": int(frac * rows), "tables": int(frac * tables)}


def assign_blocks(block_list, n_rows, n_bins, n_actions, p):
    """Owner rank of each block for the ``"rows"`` exchange (longest block first).

    The cost of a block is its table build (rows x features) plus its search
    (cells x actions); blocks go, longest first, to the least loaded rank (ties to
    the lowest rank), so the assignment is the same on every rank.

    Returns
    -------
    ndarray of int64, shape (len(block_list),)
    """
    cost = np.array([(hi - lo) * (n_rows + n_bins ** (len(head) + 1) * n_actions)
                     for head, lo, hi in block_list], dtype=np.float64)
    owner = np.zeros(len(block_list), dtype=np.int64)
    load = np.zeros(p)
    for i in np.lexsort((np.arange(len(cost)), -cost)):
        r = int(np.argmin(load))
        owner[i] = r
        load[r] += cost[i]
    return owner


def block_table(codes, channels, block, n_bins):
    """Raw (not cumulated) reward table of one block from these rows.

    Rows are grouped by the codes of the block's head features, and the histogram
    kernel sums their channels per (group, feature, bin) for the block's features.

    Returns
    -------
    ndarray of float64
        Pairs: ``(nb, m, nb, C)``; triples: ``(nb, nb, m, nb, C)``; ``m = hi - lo``.
    """
    head, lo, hi = block
    # uint8 / uint16 keys: NumPy's stable sort is then a radix sort
    key = codes[head[0]]
    if len(head) == 2:
        key = key.astype(np.uint16) * np.uint16(n_bins) + codes[head[1]]
    n_groups = n_bins ** len(head)
    counts = np.bincount(key, minlength=n_groups)
    starts = np.zeros(n_groups + 1, dtype=np.int64)
    np.cumsum(counts, out=starts[1:])
    order = np.argsort(key, kind="stable").astype(np.int32)
    hist = build_histograms(codes[lo:hi], channels, order, starts, n_bins)
    return hist.reshape((n_bins,) * len(head) + hist.shape[1:])


# ------------------------------------------------------------------------ the search

class SearchResult:
    """What the search found (identical on every rank).

    Attributes
    ----------
    value : float
        Best total fixed-point reward.
    root : tuple (s, b) or None
    halves : (value, feature, position), each (2, S, nb), or None
        Best subtree records of the half-spaces (depth >= 2).
    quadrants : (value, feature, position), each (S, S, nb, nb, 2, 2), or None (depth 3)
    exchange : str
        The exchange used (``"none"`` on one rank or at depth <= 1).
    predicted_bytes : dict
    """

    def __init__(self, value, root, halves=None, quadrants=None, exchange="none", predicted=None):
        self.value = value
        self.root = root
        self.halves = halves
        self.quadrants = quadrants
        self.exchange = exchange
        self.predicted_bytes = predicted or {}

    def structure(self, depth):
        """The tree as nested tuples: ``None`` for a leaf, else ``(s, b, left, right)``."""
        if self.root is None:
            return None
        s, b = self.root
        if depth == 1:
            return (s, b, None, None)
        return (s, b, self._half(0, s, b, depth - 1), self._half(1, s, b, depth - 1))

    def _half(self, side, s, b, depth):
        hv, hf, hb = self.halves
        c, bc = int(hf[side, s, b]), int(hb[side, s, b])
        if c < 0:
            return None
        if depth == 1:
            return (c, bc, None, None)
        qv, qf, qb = self.quadrants
        kids = []
        for sc in range(2):
            g, bg = int(qf[s, c, b, bc, side, sc]), int(qb[s, c, b, bc, side, sc])
            kids.append(None if g < 0 else (g, bg, None, None))
        return (c, bc, kids[0], kids[1])


def combine_records(comm, records):
    """Best record per cell over all ranks (exact: values are fixed-point integers)."""
    v, f, b = records
    if comm.size == 1:
        return records
    flat = np.column_stack([v.reshape(-1), f.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)])
    best = col.allreduce_best(comm, flat, n_keys=2)
    return (best[:, 0].reshape(v.shape), best[:, 1].astype(np.int32).reshape(f.shape),
            best[:, 2].astype(np.int32).reshape(b.shape))


def exact_search(space, channels, n_actions, depth, min_rows, comm, exchange="auto"):
    """The best tree of depth ``depth`` over the search features (collective).

    Parameters
    ----------
    space : SearchSpace
    channels : ndarray of float64, shape (n_local, n_actions + 1)
        Fixed-point rewards and a column of ones.
    n_actions, depth, min_rows : int
        ``0 <= depth <= 3``; ``min_rows``: fewest rows in each leaf of a split (the
        root alone is always a candidate, so the result is the best single action
        when no split can keep ``min_rows`` rows on both sides).
    comm : native.comm.Communicator
    exchange : {"auto", "rows", "tables"}

    Returns
    -------
    SearchResult
    """
    if exchange not in EXCHANGES:
        raise ValueError(f"exchange must be one of {EXCHANGES}, got {exchange!r}")
    nb, S, C = space.n_bins, space.n_search, n_actions + 1
    one = np.array([0, space.codes.shape[1]], dtype=np.int64)
    hist1 = build_histograms(space.codes, channels, None, one, nb)[0]
    if comm.size > 1:
        hist1 = col.allreduce(comm, hist1)
    cum1 = np.cumsum(hist1, axis=1)
    total = cum1[0, nb - 1].copy()
    # The root as one leaf (one action for everyone) is a policy whatever min_rows:
    # min_rows limits the leaves a split creates, as min_samples_leaf does in
    # scikit-learn's trees. Were the root held to it too, min_rows > n would leave no
    # tree at all (search value -inf).
    root_leaf = float(ps.leaf_value(total, n_actions, 0))
    if depth == 0:
        return SearchResult(root_leaf, None)
    half = ps.half_leaf_records(cum1, total, space.lo, space.hi, n_actions, min_rows)
    if depth == 1:
        value, s, b = ps.best_root(half[0], space.lo, space.hi, root_leaf)
        return SearchResult(value, None if s < 0 else (s, b))

    n_global = int(total[n_actions])
    predicted = predicted_bytes(depth, n_global, S, nb, C, comm.size)
    if comm.size == 1:
        chosen = "none"
    elif exchange == "auto":
        chosen = "rows" if predicted["rows"] <= predicted["tables"] else "tables"
    else:
        chosen = exchange
    records = half if depth == 2 else ps.new_records((S, S, nb, nb, 2, 2))
    block_list = blocks(depth, S, nb, C)
    codes = space.codes
    if chosen == "rows":
        codes = np.ascontiguousarray(col.allgatherv(comm, np.ascontiguousarray(space.codes.T)).T)
        channels = col.allgatherv(comm, np.ascontiguousarray(channels))
        owner = assign_blocks(block_list, codes.shape[1], nb, n_actions, comm.size)
        mine = [blk for blk, r in zip(block_list, owner) if r == comm.rank]
    else:
        mine = block_list
    for block in mine:
        table = block_table(codes, channels, block, nb)
        head, lo, hi = block
        axis = len(head)
        if chosen == "tables":
            table, (start, stop) = col.reduce_scatter(comm, table, axis=axis)
            lo, hi = lo + start, lo + stop
            if hi == lo:
                continue
        table = ps.cumulate_block(np.ascontiguousarray(table))
        if depth == 2:
            ps.pair_block_search(table, head[0], lo, space.lo, space.hi, total, n_actions, min_rows, *records)
        else:
            ps.triple_block_search(table, head[0], head[1], lo, space.lo, space.hi, total, n_actions, min_rows,
                                   *records)
    if chosen != "none":
        records = combine_records(comm, records)
    if depth == 2:
        halves, quadrants = records, None
    else:
        quadrants = records
        halves = ps.halves_from_quadrants(quadrants, half[0], space.lo, space.hi)
    value, s, b = ps.best_root(halves[0], space.lo, space.hi, root_leaf)
    return SearchResult(value, None if s < 0 else (s, b), halves, quadrants, chosen, predicted)

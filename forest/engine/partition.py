"""Row partition and per-leaf accumulation kernels used by the growers.

This module owns the row-level Numba loops of tree growth that are not histogram
builds: moving a node's local row ids to its two children (a stable partition, so
that row order inside a node never depends on anything but the split), and summing
channels per node for leaf re-estimation. Each kernel has a slow NumPy reference
next to it; tests compare them.

Indices are cast to unsigned types (``np.uint32(row)``, ``np.uint64(position)``) where the
kernels read or write by a computed index: Numba turns a signed index into a
negative-index wraparound (a compare and select per access), and in these loops that
cost more than the work. Row ids and positions are never negative, so the cast changes
nothing but the code: ``_partition_table`` went from 3.5 to 1.4 ns/row (one thread,
100k of 200k rows, uint8 codes, quiet machine).
"""
import numba
import numpy as np

from histogram.jit import kernel, compiled_only, zeros
from forest.engine.routing import goes_left_code, goes_left_codes, goes_left_set
from forest.engine.tree import CATEGORICAL_SPLIT, bitset_bins

#: Work (rows over all segments) from which several segments are partitioned in parallel.
_PARALLEL_MIN_ROWS = 1 << 18
#: partition_rows splits one segment across threads (:func:`_partition_blocks_parallel`)
#: only from this many rows: the serial branch-free loop does ~1.4 ns/row, so below this a
#: tree's root partition costs a few ms.
_PARALLEL_ONE_SEGMENT_MIN_ROWS = 1 << 21
#: partition_segment splits one segment across threads by per-thread blocks (codes read
#: once, :func:`_partition_blocks_parallel`) from this many rows. Main-thread CPU time per
#: call, 2 threads vs serial (HIGGS codes, OMP_WAIT_POLICY=passive, minima of 25 on a
#: loaded machine): 1M rows 1.87 vs 3.19 ms, 500k 0.99 vs 1.51, 125k 0.34 vs 0.37,
#: 31k 0.16 vs 0.10 ms (there the wake-up of the pool costs more than half the loop).
PARALLEL_BLOCKS_MIN_ROWS = 1 << 17
#: Rows from which :func:`add_leaf_values` runs its leaves in parallel. Each row is one
#: scattered read-modify-write (no partition's two passes), so threads pay off early: per
#: call, 2 threads vs serial on a loaded 2-core machine, 31 leaves: 50k rows 101 vs 134 us,
#: 100k 193 vs 300 us, 200k 360 vs 720 us (boosting calls it once per tree).
_PARALLEL_LEAF_VALUES_MIN_ROWS = 1 << 16


@kernel
def numeric_side_table(thr, ml, missing_bin):
    """Per code ``0 .. missing_bin``, 1 when a numeric split (bin threshold ``thr``, missing
    rows left when ``ml``) sends it left: :func:`goes_left_code` tabulated.

    Returns
    -------
    ndarray of uint8, shape (missing_bin + 1,)
    """
    table = zeros(missing_bin + 1, np.uint8)
    for code in range(missing_bin + 1):
        table[code] = np.uint8(goes_left_code(np.int32(code), thr, ml, missing_bin))
    return table


@kernel
def _partition_one(rows, scratch, lo, hi, binned, f, thr, ml, missing_bin):
    # A numeric split partitions through its side table, as a categorical one does: one
    # load from a table of <= 4,096 bytes (L1-resident) per row beat the threshold test's
    # compare-and-combine, 3.5 against 4.3 ns/row (one thread, 20k and 100k of 500k rows,
    # uint8 codes, quiet machine); the table costs one pass over the codes per split.
    return _partition_table(rows, scratch, lo, hi, binned, f, numeric_side_table(thr, ml, missing_bin))


@kernel
def _partition_segments(rows, scratch, starts, stops, binned, features, thresholds, missing_left, missing_bin,
                        n_left):
    for s in range(starts.shape[0]):
        n_left[s] = _partition_one(rows, scratch, starts[s], stops[s], binned, features[s], thresholds[s],
                                   missing_left[s], missing_bin)


@kernel(parallel=True)
def _par_partition_segments(rows, scratch, starts, stops, binned, features, thresholds, missing_left, missing_bin,
                            n_left):
    for s in numba.prange(starts.shape[0]):
        n_left[s] = _partition_one(rows, scratch, starts[s], stops[s], binned, features[s], thresholds[s],
                                   missing_left[s], missing_bin)


@compiled_only
def _split_block(rows, scratch, a, b, binned, f, table):
    # One pass over rows[a:b]: left rows to scratch[a:] ascending, right rows to
    # scratch[:b] descending (so reading scratch[b-1], scratch[b-2], ... gives them in
    # their original order). Branch-free as _partition_table, whose in-place layout the
    # blocks cannot use (pass 2 reads every block's rows from scratch while others write
    # rows): every row is written to both ends and only the counts move; an uncommitted
    # write lands in the gap scratch[a+nl : b-nr], which later rows fill.
    nl = 0
    nr = 0
    codes = binned[f]
    for i in range(a, b):
        r = rows[i]
        go = np.int64(table[codes[np.uint32(r)]])
        scratch[np.uint64(a + nl)] = r
        scratch[np.uint64(b - 1 - nr)] = r
        nl += go
        nr += 1 - go
    return nl


@compiled_only
def _place_block(rows, scratch, a, b, nl, left_dst, right_dst):
    for i in range(nl):
        rows[np.uint64(left_dst + i)] = scratch[np.uint64(a + i)]
    for j in range(b - a - nl):
        rows[np.uint64(right_dst + j)] = scratch[np.uint64(b - 1 - j)]


@kernel(parallel=True)
def _partition_blocks_parallel(rows, scratch, lo, hi, binned, f, table, n_blocks):
    # Pass 1: each block splits its rows once into its own slice of scratch (codes are
    # read once). Pass 2: each block copies its left and right rows to their final
    # offsets (prefix sums of the block counts); destinations are disjoint and the
    # sources are in scratch, so the blocks never race. Stable: blocks are in row order
    # and each keeps its rows' order. The block bodies are separate serial functions
    # (inline row loops were turned ~40x slower by Numba's parfor pass, see below).
    # ``table``: the split's side per code (side_table, numeric_side_table).
    n = hi - lo
    size = (n + n_blocks - 1) // n_blocks
    counts = zeros(n_blocks, np.int64)
    for c in numba.prange(n_blocks):
        a = min(hi, lo + c * size)
        counts[c] = _split_block(rows, scratch, a, min(hi, a + size), binned, f, table)
    left_off = zeros(n_blocks, np.int64)
    right_off = zeros(n_blocks, np.int64)
    total_left = 0
    acc_right = 0
    for c in range(n_blocks):
        a = min(hi, lo + c * size)
        b = min(hi, a + size)
        left_off[c] = total_left
        total_left += counts[c]
        right_off[c] = acc_right
        acc_right += (b - a) - counts[c]
    for c in numba.prange(n_blocks):
        a = min(hi, lo + c * size)
        _place_block(rows, scratch, a, min(hi, a + size), counts[c], lo + left_off[c], lo + total_left + right_off[c])
    return total_left


@kernel
def _partition_table(rows, scratch, lo, hi, binned, f, table):
    # ``table[code]`` (0/1 per code, the missing bin included) says which side a row takes.
    # Branch-free: whether a row goes left is close to a coin flip, so an if/else
    # mispredicts about every other row. Each row is written to both destinations (left
    # rows compacted in place, right rows into the scratch slots of the same range; the
    # write index never passes the read index) and only the counts move. Measured 7.2 ->
    # 3.1 ns/row (one thread, 200k rows, 50/50 split) against the branchy loop.
    nl = 0
    nr = 0
    codes = binned[f]
    for i in range(lo, hi):
        r = rows[i]
        go = np.int64(table[codes[np.uint32(r)]])
        rows[np.uint64(lo + nl)] = r
        scratch[np.uint64(lo + nr)] = r
        nl += go
        nr += 1 - go
    for j in range(nr):
        rows[np.uint64(lo + nl + j)] = scratch[np.uint64(lo + j)]
    return nl


@kernel
def _side_table(bits, missing_left, missing_bin):
    # Compiled: boosting makes one table per categorical split, and NumPy's version of
    # these few lines cost ~33 us per call at 1,000 codes (a 200k-row fit: ~1,300 calls).
    table = zeros(missing_bin + 1, np.uint8)
    for code in range(missing_bin):
        table[code] = np.uint8((bits[code >> 6] >> np.uint64(code & 63)) & np.uint64(1))
    table[missing_bin] = np.uint8(1 if missing_left else 0)
    return table


def side_table(bits, missing_left, missing_bin):
    """Per code, 1 when a categorical split with bitset ``bits (CAT_WORDS,)`` sends it left.

    Returns
    -------
    ndarray of uint8, shape (missing_bin + 1,)
    """
    return _side_table(np.ascontiguousarray(bits, dtype=np.uint64), bool(missing_left), int(missing_bin))


def side_table_reference(bits, missing_left, missing_bin):
    """NumPy reference of :func:`side_table`."""
    codes = np.arange(missing_bin, dtype=np.uint64)
    bits = np.asarray(bits, dtype=np.uint64)
    table = np.zeros(missing_bin + 1, dtype=np.uint8)
    table[:missing_bin] = (bits[(codes >> np.uint64(6)).astype(np.int64)] >> (codes & np.uint64(63))) & np.uint64(1)
    table[missing_bin] = 1 if missing_left else 0
    return table


def _partition_categorical(rows, scratch, starts, stops, binned, features, missing_left, missing_bin, cat_bits,
                           n_left, which):
    for s in which:
        table = side_table(cat_bits[s], missing_left[s], missing_bin)
        n_left[s] = _partition_table(rows, scratch, int(starts[s]), int(stops[s]), binned, int(features[s]), table)


def partition_rows(rows, scratch, starts, stops, binned, features, bin_thresholds, missing_left, missing_bin,
                   cat_bits=None):
    """Stable in-place partition of node segments of ``rows`` into left | right.

    Parameters
    ----------
    rows : ndarray of int32, shape (m,)
        Local row ids grouped by node; modified in place.
    scratch : ndarray of int32, shape (m,)
        Work space.
    starts, stops : ndarray of int64, shape (s,)
        Segments ``rows[starts[i]:stops[i]]`` to split (disjoint).
    binned : ndarray of uint8, shape (n_features, n_rows)
    features, bin_thresholds : ndarray of int32, shape (s,)
    missing_left : ndarray of uint8, shape (s,)
    missing_bin : int
    cat_bits : ndarray of uint64, shape (s, CAT_WORDS), optional
        Category sets of the categorical splits (``bin_thresholds == CATEGORICAL_SPLIT``).

    Returns
    -------
    ndarray of int64, shape (s,)
        Rows that went left in each segment (they now occupy the segment's front).
    """
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    stops = np.ascontiguousarray(stops, dtype=np.int64)
    features = np.ascontiguousarray(features, dtype=np.int32)
    bin_thresholds = np.ascontiguousarray(bin_thresholds, dtype=np.int32)
    missing_left = np.ascontiguousarray(missing_left, dtype=np.uint8)
    cats = bin_thresholds == CATEGORICAL_SPLIT
    if cats.any():
        n_left = np.zeros(len(starts), dtype=np.int64)
        numeric = np.flatnonzero(~cats)
        if len(numeric):
            n_left[numeric] = partition_rows(rows, scratch, starts[numeric], stops[numeric], binned, features[numeric],
                                             bin_thresholds[numeric], missing_left[numeric], missing_bin)
        _partition_categorical(rows, scratch, starts, stops, binned, features, missing_left, int(missing_bin),
                               cat_bits, n_left, np.flatnonzero(cats))
        return n_left
    n_left = np.zeros(len(starts), dtype=np.int64)
    threads = numba.get_num_threads()
    total = int((stops - starts).sum())
    if threads == 1 or total < _PARALLEL_MIN_ROWS or (len(starts) == 1 and total < _PARALLEL_ONE_SEGMENT_MIN_ROWS):
        # Small work: starting the thread pool would cost more than the loop.
        _partition_segments(rows, scratch, starts, stops, binned, features, bin_thresholds, missing_left,
                            int(missing_bin), n_left)
    elif len(starts) == 1:
        # One long segment: split it across threads by blocks (codes read once). A stable
        # partition is unique, so this is the serial loop's result.
        table = numeric_side_table(int(bin_thresholds[0]), int(missing_left[0]), int(missing_bin))
        n_left[0] = _partition_blocks_parallel(rows, scratch, int(starts[0]), int(stops[0]), binned,
                                               int(features[0]), table, threads)
    else:
        _par_partition_segments(rows, scratch, starts, stops, binned, features, bin_thresholds, missing_left,
                                int(missing_bin), n_left)
    return n_left


def partition_segment(rows, scratch, lo, hi, binned, feature, bin_threshold, missing_left, missing_bin,
                      parallel_min_rows=None, cat_bits=None):
    """Stable in-place partition of one segment ``rows[lo:hi]``; scalar split arguments.

    The boosting grower splits one node at a time; this entry point skips the
    per-call array conversions of :func:`partition_rows` (six small arrays per split).

    Parameters
    ----------
    rows, scratch : ndarray of int32, shape (m,)
        As in :func:`partition_rows`.
    lo, hi : int
    binned : ndarray of uint8, shape (n_features, n_rows)
    feature, bin_threshold : int
    missing_left : bool
    missing_bin : int
    parallel_min_rows : int, optional
        Segments of this many rows are split across threads by per-thread blocks;
        default :data:`PARALLEL_BLOCKS_MIN_ROWS`.
    cat_bits : ndarray of uint64, shape (CAT_WORDS,), optional
        The category set when ``bin_threshold == CATEGORICAL_SPLIT``.

    Returns
    -------
    int
        Rows that went left (they now occupy ``rows[lo:lo + n_left]``).
    """
    if not 0 <= lo <= hi <= len(rows) or len(scratch) < hi:
        raise ValueError(f"segment {lo}:{hi} outside rows of length {len(rows)} / scratch of length {len(scratch)}")
    threads = numba.get_num_threads()
    blocks = threads > 1 and hi - lo >= (PARALLEL_BLOCKS_MIN_ROWS if parallel_min_rows is None else parallel_min_rows)
    if bin_threshold == CATEGORICAL_SPLIT:
        table = side_table(cat_bits, missing_left, int(missing_bin))
    else:
        table = numeric_side_table(int(bin_threshold), int(bool(missing_left)), int(missing_bin))
    if blocks:
        return int(_partition_blocks_parallel(rows, scratch, int(lo), int(hi), binned, int(feature), table, threads))
    return int(_partition_table(rows, scratch, int(lo), int(hi), binned, int(feature), table))


def partition_rows_reference(rows, starts, stops, binned, features, bin_thresholds, missing_left, missing_bin,
                             cat_bits=None):
    """NumPy reference of :func:`partition_rows` (returns new rows and left counts)."""
    rows = np.array(rows, copy=True)
    n_left = np.zeros(len(starts), dtype=np.int64)
    for s in range(len(starts)):
        seg = rows[starts[s]:stops[s]]
        codes = binned[features[s], seg].astype(np.int64)
        if bin_thresholds[s] == CATEGORICAL_SPLIT:
            left = goes_left_set(codes, bitset_bins(cat_bits[s]), missing_left[s], missing_bin)
        else:
            left = goes_left_codes(codes, bin_thresholds[s], missing_left[s], missing_bin)
        rows[starts[s]:stops[s]] = np.concatenate([seg[left], seg[~left]])
        n_left[s] = left.sum()
    return rows, n_left


@kernel
def _sum_by_node(channels, rows, nodes, n_nodes):
    out = zeros((n_nodes, channels.shape[1]), np.float64)
    for i in range(rows.shape[0]):
        r = rows[i]
        node = nodes[i]
        for c in range(channels.shape[1]):
            out[node, c] += channels[r, c]
    return out


def sum_channels_by_node(channels, rows, nodes, n_nodes):
    """Channel sums per node.

    Parameters
    ----------
    channels : ndarray of float64, shape (n_rows, C)
    rows : ndarray of int, shape (m,)
        Local row ids.
    nodes : ndarray of int, shape (m,)
        Node of each of those rows, in ``[0, n_nodes)``.
    n_nodes : int

    Returns
    -------
    ndarray of float64, shape (n_nodes, C)
    """
    channels = np.ascontiguousarray(channels, dtype=np.float64)
    return _sum_by_node(channels, np.ascontiguousarray(rows, dtype=np.int64),
                        np.ascontiguousarray(nodes, dtype=np.int64), int(n_nodes))


@kernel
def _add_leaf_values(raw, rows, seg_starts, seg_stops, values):
    k = values.shape[1]
    for s in range(seg_starts.shape[0]):
        for i in range(seg_starts[s], seg_stops[s]):
            r = np.uint32(rows[i])
            for j in range(k):
                raw[r, j] += values[s, j]


@kernel(parallel=True)
def _par_add_leaf_values(raw, rows, seg_starts, seg_stops, values):
    k = values.shape[1]
    for s in numba.prange(seg_starts.shape[0]):
        for i in range(seg_starts[s], seg_stops[s]):
            r = np.uint32(rows[i])
            for j in range(k):
                raw[r, j] += values[s, j]


def add_leaf_values(raw, rows, seg_starts, seg_stops, values):
    """``raw[rows[a:b]] += values[s]`` for every leaf segment ``s = (a, b)``.

    Parameters
    ----------
    raw : ndarray of float64, shape (n_rows, K)
        Updated in place.
    rows : ndarray of int32, shape (m,)
    seg_starts, seg_stops : ndarray of int64, shape (s,)
    values : ndarray of float64, shape (s, K)
    """
    seg_starts = np.ascontiguousarray(seg_starts, dtype=np.int64)
    seg_stops = np.ascontiguousarray(seg_stops, dtype=np.int64)
    values = np.ascontiguousarray(values, dtype=np.float64)
    small = int((seg_stops - seg_starts).sum()) < _PARALLEL_LEAF_VALUES_MIN_ROWS or numba.get_num_threads() == 1
    (_add_leaf_values if small else _par_add_leaf_values)(raw, rows, seg_starts, seg_stops, values)

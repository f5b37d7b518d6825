"""Numba CPU histogram kernels (``parallel=True``, race-free by construction).

Layout: ``binned`` is feature-major ``(n_features, n_rows)`` uint8 and ``channels`` is
row-major ``(n_rows, n_channels)`` float64; the output is
``(n_nodes, n_features, n_bins, n_channels)``, so one (node, feature) slab is a small
contiguous ``(n_bins, n_channels)`` block.

Two work decompositions, chosen per node by :func:`plan_tasks`:

* **(node, feature-range) tasks** for ordinary nodes. A task owns its output slabs,
  so no two threads ever write the same memory. Tasks are laid out node-outer and cut
  into one chunk per thread with equal row work, so consecutive tasks of a thread
  share a node and its channel rows stay in cache across features. Inside a task the
  node's rows are walked in blocks of ``ROW_BLOCK`` rows, feature after feature, so a
  block's channel rows (a few tens of KiB) are read from memory once and then from L1/L2
  for every other feature of the task.
* **row-split tasks** for nodes too big to balance by features alone (the root with
  more threads than a few features each). Each part sums its own row range over all
  features into a private partial histogram; a second parallel pass over
  (node, feature) adds the partials into the output.

Inner loops update four features per row (one channel load, four independent
read-modify-write chains). An even number of channels is viewed as complex128 pairs,
and each pair is updated by :func:`_pair_add`, one ``<2 x double>`` load/add/store
(Numba alone emits two scalar ones per complex add). One thread, 1M x 28 HIGGS codes,
CPU time, bit-identical sums: root 2 channels 22.7 -> 14.6 ms, 6 channels 68.8 ->
41.3 ms; 32-node level (500k rows) 14.9 -> 9.5 ms and 45.9 -> 25.5 ms. Nodes whose rows are a contiguous range
(``identity=True``: the root) never read a row-index array.

Row ids and row positions index arrays as unsigned integers (``np.uint32(rows[k])``,
``np.uint64(position)``): Numba gives a signed index a negative-index wraparound (a
compare and select per access) that these loops paid on every code and channel load.
They are never negative, so only the code changes: bit-identical sums, and on one thread
(500k x 10 codes, a sorted quarter or half of the rows) 1.27 -> 0.92 ns per row and
feature for a gathered (g, h) child, 1.2-1.3x for one channel, 1.0-1.15x for 3-7
channels (:mod:`forest.engine.partition` gained most: its loops do little else).

Measured and rejected (one thread, 1M rows x 28 features, CPU time): a row-wise kernel
over a row-major copy of the codes for thinly spread nodes was 1.7-2.4x slower than
the feature-major kernel for a 32-node level (its 28 feature histograms do not stay
in L1); eight features per pass spilled registers and was slower than four.
"""
import sys

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic, overload

from .jit import kernel, compiled_only

#: Rows per cache block: 4096 rows x 14 channels x 8 B = 448 KiB worst case,
#: 64 KiB for the common 2-channel case.
ROW_BLOCK = 4096
#: Work (in row-feature visits) added per (node, feature) slab for zeroing and
#: loop overhead when balancing tasks.
SLAB_OVERHEAD = 64
#: (g, h) kernels prefetch codes this many rows ahead for thinly spread rows ...
PREFETCH_ROWS = 24
#: ... i.e. rows that are fewer than 1 in SPARSE_SPAN of the row-id range they span
#: (about one row per 16-byte quarter line of codes or less). Kernel alone, 1M rows,
#: one thread: 4k-16k rows gain 1.5-2x, 60k rows (1 in 17) -7 % cold / +15 % warm,
#: 250k+ rows +25 % (not prefetched). In a 1M-row, 10-tree fit (1 thread), children of
#: 16k-65k rows: 53.5 ns/row with 1 in 32, 46.6-49.1 with 1 in 16.
SPARSE_SPAN = 16


@intrinsic
def _pair_add(typingctx, hist, idx, v):
    """``hist[idx] += v`` for a complex128 (g, h) pair as ONE 16-byte vector update.

    Numba lowers a complex add to two scalar loads, adds and stores (its SLP vectorizer
    is off by default), so a (g, h) bin update cost two store slots; the scatter-add is
    bound by stores. Here the pair is loaded, added and stored as ``<2 x double>``;
    each lane is the same IEEE addition, so the sums are bit-for-bit those of
    ``hist[idx] += v``. Measured on one thread, 1M x 28 HIGGS codes, CPU time: packed
    root 17.0 -> 12.6 ms, a half-rows child 11.3 -> 8.0 ms. ``hist`` must be a
    C-contiguous 1-D complex128 array (typing refuses others). No bounds check (as the
    plain indexing it replaces, with Numba's default boundscheck off).
    """
    if not (isinstance(hist, types.Array) and hist.ndim == 1 and hist.layout == "C"
            and hist.dtype == types.complex128 and isinstance(idx, types.Integer) and v == types.complex128):
        return None
    sig = types.void(hist, idx, v)

    def codegen(context, builder, sig, args):
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        vty = ir.VectorType(ir.DoubleType(), 2)
        ptr = builder.bitcast(builder.gep(arr.data, [i]), vty.as_pointer())  # C-contiguous: element i
        c = context.make_complex(builder, types.complex128, value=args[2])
        zero, one = ir.Constant(ir.IntType(32), 0), ir.Constant(ir.IntType(32), 1)
        vec = builder.insert_element(builder.insert_element(ir.Constant(vty, ir.Undefined), c.real, zero),
                                     c.imag, one)
        builder.store(builder.fadd(builder.load(ptr, align=8), vec), ptr, align=8)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def prefetch(typingctx, arr, idx):
    """Hint the cache to load ``arr[idx]`` (``llvm.prefetch``: read, high locality)."""
    if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C" and isinstance(idx, types.Integer)):
        return None
    sig = types.void(arr, idx)

    def codegen(context, builder, sig, args):
        a = context.make_array(sig.args[0])(context, builder, args[0])
        i = context.cast(builder, args[1], sig.args[1], types.intp)
        i8p = ir.IntType(8).as_pointer()
        ptr = builder.bitcast(builder.gep(a.data, [i]), i8p)
        i32 = ir.IntType(32)
        fn = builder.module.globals.get("llvm.prefetch.p0i8")
        if fn is None:
            fn = ir.Function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), "llvm.prefetch.p0i8")
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


def _hadd(h, i, v):
    """``h[i] += v``; a C-contiguous complex128 ``h`` takes the vector :func:`_pair_add`."""
    h[i] += v


@overload(_hadd, inline="always")
def _hadd_overload(h, i, v):
    if isinstance(h, types.Array) and h.ndim == 1 and h.layout == "C" and h.dtype == types.complex128 \
            and v == types.complex128:
        def impl(h, i, v):
            _pair_add(h, i, v)
    else:
        def impl(h, i, v):
            h[i] += v
    return impl


@compiled_only
def _accumulate(h, codes, channels, rows, r0, r1, identity):
    """h[codes[r], :] += channels[r, :] for r = rows[r0:r1] (or r0:r1 if identity)."""
    n_channels = channels.shape[1]
    if n_channels == 1:
        if identity:
            for ri in range(r0, r1):
                r = np.uint64(ri)
                h[codes[r], 0] += channels[r, 0]
        else:
            for k in range(r0, r1):
                r = np.uint64(rows[k])
                h[codes[r], 0] += channels[r, 0]
    else:
        if identity:
            for ri in range(r0, r1):
                r = np.uint64(ri)
                b = codes[r]
                for c in range(n_channels):
                    h[b, c] += channels[r, c]
        else:
            for k in range(r0, r1):
                r = np.uint64(rows[k])
                b = codes[r]
                for c in range(n_channels):
                    h[b, c] += channels[r, c]


@compiled_only
def _accumulate4(h0, h1, h2, h3, c0, c1, c2, c3, channels, rows, r0, r1, identity):
    """Four features at once: each row's channels are loaded once for four updates.

    ``h0..h3`` are flat ``(n_bins * n_channels,)`` slabs (flat indexing saves a
    multiply per update). Four independent read-modify-write chains per row keep the
    core busy while one update waits on its histogram load; eight spilled the array
    pointers out of registers and measured slower.
    """
    n_channels = channels.shape[1]
    if n_channels == 1:
        if identity:
            for ri in range(r0, r1):
                r = np.uint64(ri)
                v = channels[r, 0]
                _hadd(h0, c0[r], v)
                _hadd(h1, c1[r], v)
                _hadd(h2, c2[r], v)
                _hadd(h3, c3[r], v)
        else:
            for k in range(r0, r1):
                r = np.uint64(rows[k])
                v = channels[r, 0]
                _hadd(h0, c0[r], v)
                _hadd(h1, c1[r], v)
                _hadd(h2, c2[r], v)
                _hadd(h3, c3[r], v)
    else:
        if identity:
            for ri in range(r0, r1):
                r = np.uint64(ri)
                b0 = c0[r] * n_channels
                b1 = c1[r] * n_channels
                b2 = c2[r] * n_channels
                b3 = c3[r] * n_channels
                for c in range(n_channels):
                    v = channels[r, c]
                    _hadd(h0, b0 + c, v)
                    _hadd(h1, b1 + c, v)
                    _hadd(h2, b2 + c, v)
                    _hadd(h3, b3 + c, v)
        else:
            for k in range(r0, r1):
                r = np.uint64(rows[k])
                b0 = c0[r] * n_channels
                b1 = c1[r] * n_channels
                b2 = c2[r] * n_channels
                b3 = c3[r] * n_channels
                for c in range(n_channels):
                    v = channels[r, c]
                    _hadd(h0, b0 + c, v)
                    _hadd(h1, b1 + c, v)
                    _hadd(h2, b2 + c, v)
                    _hadd(h3, b3 + c, v)


@compiled_only
def _accumulate_features(hist, binned, channels, rows, r0, r1, f0, f1, identity):
    """hist[f] += histogram of rows r0:r1 for features f0:f1 (hist indexed by feature)."""
    f = f0
    while f + 4 <= f1:
        _accumulate4(hist[f].ravel(), hist[f + 1].ravel(), hist[f + 2].ravel(),
                     hist[f + 3].ravel(),
                     binned[f], binned[f + 1], binned[f + 2], binned[f + 3],
                     channels, rows, r0, r1, identity)
        f += 4
    while f < f1:
        _accumulate(hist[f], binned[f], channels, rows, r0, r1, identity)
        f += 1


@kernel(parallel=True)
def _build_by_feature(binned, channels, rows, node_starts, identity,
                      task_node, task_f0, task_f1, chunk_starts, out):
    """Run (node, feature-range) tasks; chunk ``c`` runs tasks chunk_starts[c]:[c+1].

    Each (node, feature) slab of ``out`` belongs to exactly one task, which zeroes
    it and then accumulates into it: no two threads share an output byte.
    """
    n_chunks = chunk_starts.shape[0] - 1
    n_channels = channels.shape[1]
    ch1 = channels.ravel()  # contiguous 1-D: ch1[r] is channels[r, 0] when n_channels == 1
    for chunk in prange(n_chunks):
        for t in range(chunk_starts[chunk], chunk_starts[chunk + 1]):
            node = task_node[t]
            f0 = task_f0[t]
            f1 = task_f1[t]
            for f in range(f0, f1):
                out[node, f, :, :] = 0.0
            s = node_starts[node]
            e = node_starts[node + 1]
            hist = out[node]
            for r0 in range(s, e, ROW_BLOCK):
                r1 = min(r0 + ROW_BLOCK, e)
                f = f0
                # The hot loop is written out here rather than called: measured ~30 %
                # faster than the same loop in a helper function.
                if n_channels == 1 and identity:
                    while f + 4 <= f1:
                        h0 = hist[f].ravel()
                        h1 = hist[f + 1].ravel()
                        h2 = hist[f + 2].ravel()
                        h3 = hist[f + 3].ravel()
                        c0 = binned[f]
                        c1 = binned[f + 1]
                        c2 = binned[f + 2]
                        c3 = binned[f + 3]
                        for ri in range(r0, r1):
                            r = np.uint64(ri)
                            v = ch1[r]
                            _hadd(h0, c0[r], v)
                            _hadd(h1, c1[r], v)
                            _hadd(h2, c2[r], v)
                            _hadd(h3, c3[r], v)
                        f += 4
                elif n_channels == 1:
                    while f + 4 <= f1:
                        h0 = hist[f].ravel()
                        h1 = hist[f + 1].ravel()
                        h2 = hist[f + 2].ravel()
                        h3 = hist[f + 3].ravel()
                        c0 = binned[f]
                        c1 = binned[f + 1]
                        c2 = binned[f + 2]
                        c3 = binned[f + 3]
                        for k in range(r0, r1):
                            r = np.uint64(rows[k])
                            v = ch1[r]
                            _hadd(h0, c0[r], v)
                            _hadd(h1, c1[r], v)
                            _hadd(h2, c2[r], v)
                            _hadd(h3, c3[r], v)
                        f += 4
                _accumulate_features(hist, binned, channels, rows, r0, r1, f, f1, identity)


@kernel(parallel=True)
def _build_by_rows(binned, channels, rows, identity, part_start, part_stop, partial):
    """Part ``p`` sums rows[part_start[p]:part_stop[p]] over all features into partial[p]."""
    n_parts = part_start.shape[0]
    n_features = binned.shape[0]
    for p in prange(n_parts):
        partial[p] = 0.0
        s = part_start[p]
        e = part_stop[p]
        hist = partial[p]
        for r0 in range(s, e, ROW_BLOCK):
            r1 = min(r0 + ROW_BLOCK, e)
            _accumulate_features(hist, binned, channels, rows, r0, r1, 0, n_features, identity)


@kernel(parallel=True)
def _reduce_parts(partial, part_offsets, big_nodes, out):
    """out[big_nodes[j], f] = sum of partial[part_offsets[j]:part_offsets[j+1], f]."""
    n_big = big_nodes.shape[0]
    n_features = partial.shape[1]
    for task in prange(n_big * n_features):
        j = task // n_features
        f = task % n_features
        dst = out[big_nodes[j], f]
        p0 = part_offsets[j]
        dst[:, :] = partial[p0, f]
        for p in range(p0 + 1, part_offsets[j + 1]):
            dst += partial[p, f]


def plan_tasks(node_starts, n_features, n_threads, big_rows):
    """Split the work into per-thread chunks of (node, feature-range) tasks.

    Parameters
    ----------
    node_starts : ndarray of int64, shape (n_nodes + 1,)
    n_features, n_threads : int
    big_rows : int
        Nodes with at least this many rows are returned separately for row splitting.

    Returns
    -------
    task_node, task_f0, task_f1 : ndarray of int64, shape (n_tasks,)
    chunk_starts : ndarray of int64, shape (n_chunks + 1,)
    big_nodes : ndarray of int64, shape (n_big,)
    """
    sizes = np.diff(node_starts)
    is_big = sizes >= big_rows
    big_nodes = np.flatnonzero(is_big).astype(np.int64)
    small = np.flatnonzero(~is_big).astype(np.int64)
    if small.shape[0] == 0:
        z = np.zeros(0, dtype=np.int64)
        return z, z, z, np.zeros(1, dtype=np.int64), big_nodes
    # Cost of each (node, feature) unit, node-outer; cumulative cost picks the cuts.
    unit_cost = sizes[small] + SLAB_OVERHEAD
    n_units = small.shape[0] * n_features
    cum = np.cumsum(np.repeat(unit_cost, n_features))
    total = cum[-1]
    n_chunks = max(1, min(n_threads, n_units))
    # Unit index where chunk c starts: first unit whose cumulative cost exceeds c/n * total.
    bounds = np.searchsorted(cum, total * np.arange(1, n_chunks) / n_chunks, side="right")
    chunk_unit_starts = np.unique(np.concatenate(([0], bounds, [n_units])))
    node_unit_starts = np.arange(small.shape[0] + 1, dtype=np.int64) * n_features
    cuts = np.union1d(chunk_unit_starts, node_unit_starts)
    starts, stops = cuts[:-1], cuts[1:]
    node_idx = starts // n_features
    task_node = small[node_idx]
    task_f0 = starts - node_idx * n_features
    task_f1 = task_f0 + (stops - starts)
    chunk_starts = np.searchsorted(starts, chunk_unit_starts).astype(np.int64)
    return (task_node.astype(np.int64), task_f0.astype(np.int64),
            task_f1.astype(np.int64), chunk_starts, big_nodes)


def build_histograms_numba(binned, channels, rows, node_starts, n_bins, out,
                           identity=False, n_threads=None, big_rows=None):
    """Fill ``out`` with per (node, feature, bin) channel sums on the CPU.

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows), C-contiguous
    channels : ndarray of float64, shape (n_rows, n_channels), C-contiguous
    rows : ndarray of int32, shape (m,)
        Ignored (may be a dummy) when ``identity`` is True.
    node_starts : ndarray of int64, shape (n_nodes + 1,)
        With ``identity``, node ``i`` owns rows ``node_starts[i]:node_starts[i+1]``.
    n_bins : int
    out : ndarray of float64, shape (n_nodes, n_features, n_bins, n_channels), C-contiguous
        Overwritten.
    identity : bool
        Rows are the positions themselves (``rows == arange``); the index array is not read.
    n_threads : int, optional
        Defaults to ``numba.get_num_threads()``.
    big_rows : int, optional
        Row count from which a node is summed by row-split parts; default chooses
        row splitting only when features alone cannot keep every thread busy.

    Returns
    -------
    out
    """
    n_features = binned.shape[0]
    if n_threads is None:
        n_threads = numba.get_num_threads()
    if rows is None:
        rows = np.zeros(0, dtype=np.int32)
    if identity and big_rows is None and channels.shape[1] == 2 and n_features:
        # Contiguous nodes with (g, h)-like two channels: the boosting root kernel reads
        # four codes per 32-bit load (only when packing is a free view, n % 4 == 0).
        packed = pack_codes(binned)
        if packed is not None and packed.base is not None and np.shares_memory(packed, binned):
            for i in range(node_starts.shape[0] - 1):
                build_gh_histogram(binned, channels, None, int(node_starts[i]), int(node_starts[i + 1]), out[i],
                                   _NO_BUF, n_threads=n_threads, packed=packed, split="rows")
            return out
    if channels.shape[1] % 2 == 0:
        # Pairs of float64 channels as one complex128: a pair is then loaded, added and
        # stored as one 16-byte unit, which measured ~20-40 % faster for (g, h) than
        # two scalar updates. Complex addition adds real and imaginary parts separately,
        # so the sums are bit-for-bit those of the float64 code.
        channels = channels.view(np.complex128)
        hist_view = out.view(np.complex128)
    else:
        hist_view = out
    _fill(binned, channels, rows, node_starts, n_bins, hist_view, identity, n_threads,
          big_rows)
    return out


def _fill(binned, channels, rows, node_starts, n_bins, out, identity, n_threads, big_rows):
    """Plan and run the kernels; ``channels``/``out`` are float64 or complex128 views."""
    n_features = binned.shape[0]
    total_rows = int(node_starts[-1] - node_starts[0])
    if big_rows is None:
        big_rows = _default_big_rows(total_rows, n_features, n_threads)
    task_node, task_f0, task_f1, chunk_starts, big_nodes = plan_tasks(
        node_starts, n_features, n_threads, big_rows)
    if task_node.shape[0]:
        _build_by_feature(binned, channels, rows, node_starts, identity,
                          task_node, task_f0, task_f1, chunk_starts, out)
    if big_nodes.shape[0]:
        sizes = node_starts[big_nodes + 1] - node_starts[big_nodes]
        parts_per_node = np.maximum(1, np.minimum(n_threads, sizes // ROW_BLOCK))
        part_offsets = np.concatenate(([0], np.cumsum(parts_per_node))).astype(np.int64)
        part_start = np.empty(part_offsets[-1], dtype=np.int64)
        part_stop = np.empty(part_offsets[-1], dtype=np.int64)
        for j, node in enumerate(big_nodes):
            edges = np.linspace(node_starts[node], node_starts[node + 1],
                                parts_per_node[j] + 1).astype(np.int64)
            part_start[part_offsets[j]:part_offsets[j + 1]] = edges[:-1]
            part_stop[part_offsets[j]:part_offsets[j + 1]] = edges[1:]
        partial = np.empty((part_offsets[-1], n_features, n_bins, channels.shape[1]),
                           dtype=out.dtype)
        _build_by_rows(binned, channels, rows, identity, part_start, part_stop, partial)
        _reduce_parts(partial, part_offsets, big_nodes, out)


def _default_big_rows(total_rows, n_features, n_threads):
    """Row count from which a node is row-split instead of feature-split.

    Feature-split tasks read a node's channel rows once per thread that works on it.
    With few threads per feature that is cheap and needs no partial histograms; once
    threads outnumber a quarter of the features, row splitting reads everything once.
    A node must also be at least a thread's fair share of all rows to be worth it.
    """
    if n_threads <= 1 or 4 * n_threads <= n_features:
        return np.iinfo(np.int64).max
    return max(4 * ROW_BLOCK, total_rows // n_threads)


# --------------------------------------------------------------------------------------
# Single-node (gradient, hessian) kernels: the boosting engine's trusted fast path.
#
# Leaf-wise boosting builds one node at a time (the root, then each split's smaller
# child) with exactly two channels. The general entry point above pays per call for
# validation scans and task planning (~0.2 ms, a tenth of a small child's build) and
# reads channels through the row index once per feature. Here (g, h) is one complex128
# per row, and a row subset first gathers its (g, h) pairs into a contiguous buffer
# ("ordered gradients", as LightGBM does), so each of the 28 feature passes streams
# that buffer instead of chasing indices into the full channel array. Measured on one
# thread, 200k x 28 random codes, CPU time per row: root 25 -> 18 ns; a random half /
# quarter / 1/16 of the rows 37 / 41 / 44 -> 26 / 24-33 / 27 ns. Blocking the gather
# into 1-4k-row pieces (to keep the buffer in L1) measured no better, and a row-major
# (n_rows, n_features) copy of the codes was no better either (its 28 histograms, 114
# KiB, fall out of L1).


@kernel
def _gh_features(binned, gh, rows, s, e, identity, f0, f1, out):
    """out[f] = histogram of complex (g, h) over rows s:e for f in f0:f1 (out zeroed here).

    With ``identity`` the rows are the positions ``s:e`` and ``gh`` is the full array;
    otherwise ``gh[k - s]`` is the pair of row ``rows[k]`` (already gathered).

    Rows spread thinly over the code arrays (fewer than one in SPARSE_SPAN of the row
    ids they span, so code reads keep missing cache) are walked with software
    prefetches of the codes a few rows ahead. Measured on one thread, 1M x 28
    HIGGS codes, cold caches: 4k sorted random rows 226 -> 108 ns/row, 16k 94 -> 63;
    at 250k+ rows the prefetches cost 16 -> 20 ns/row, hence the density test.
    """
    for f in range(f0, f1):
        out[f, :] = 0
    sparse = False
    if not identity and e - s > PREFETCH_ROWS:
        span = np.int64(rows[e - 1]) - np.int64(rows[s])
        sparse = (e - s) * SPARSE_SPAN < span
    f = f0
    while f + 4 <= f1:
        h0 = out[f]
        h1 = out[f + 1]
        h2 = out[f + 2]
        h3 = out[f + 3]
        c0 = binned[f]
        c1 = binned[f + 1]
        c2 = binned[f + 2]
        c3 = binned[f + 3]
        if identity:
            for ri in range(s, e):
                r = np.uint64(ri)
                v = gh[r]
                _hadd(h0, c0[r], v)
                _hadd(h1, c1[r], v)
                _hadd(h2, c2[r], v)
                _hadd(h3, c3[r], v)
        else:
            k = s
            if sparse:
                # Ask for the codes PREFETCH_ROWS rows ahead: each is a cache miss here.
                while k < e - PREFETCH_ROWS:
                    rp = np.uint32(rows[k + PREFETCH_ROWS])
                    prefetch(c0, rp)
                    prefetch(c1, rp)
                    prefetch(c2, rp)
                    prefetch(c3, rp)
                    r = np.uint32(rows[k])
                    v = gh[np.uint64(k - s)]
                    _hadd(h0, c0[r], v)
                    _hadd(h1, c1[r], v)
                    _hadd(h2, c2[r], v)
                    _hadd(h3, c3[r], v)
                    k += 1
            for k in range(k, e):
                r = np.uint32(rows[k])
                v = gh[np.uint64(k - s)]
                _hadd(h0, c0[r], v)
                _hadd(h1, c1[r], v)
                _hadd(h2, c2[r], v)
                _hadd(h3, c3[r], v)
        f += 4
    while f < f1:
        h0 = out[f]
        c0 = binned[f]
        if identity:
            for ri in range(s, e):
                r = np.uint64(ri)
                _hadd(h0, c0[r], gh[r])
        else:
            for k in range(s, e):
                _hadd(h0, c0[np.uint32(rows[k])], gh[np.uint64(k - s)])
        f += 1


@kernel(inline="always")
def _packed_code(codes4, f, r):
    # Byte r % 4 of word r // 4: code of row r (little-endian packing).
    return (codes4[f, r >> 2] >> ((r & 3) << 3)) & 255


@kernel
def _gh_features_packed(codes4, gh, s, e, f0, f1, out):
    """As :func:`_gh_features` for a contiguous row range, reading four codes per load.

    ``codes4[f, q]`` holds the codes of rows ``4q .. 4q+3`` of feature ``f`` (the
    uint32 view of the little-endian code bytes, zero-padded to a multiple of four
    rows). One 32-bit load then serves four rows, so a feature pass issues a quarter
    of the code loads; rows are still added in order, so the sums equal the byte
    kernel's bit for bit. Measured on one thread, 200k x 28 random codes, CPU time:
    0.70-0.76 -> 0.55 ns per bin update.
    """
    for f in range(f0, f1):
        out[f, :] = 0
    q0 = (s + 3) >> 2  # first whole word at or after s
    q1 = e >> 2        # words q0:q1 are whole and inside s:e
    if q1 < q0:
        # No whole word inside s:e: every row goes through the head loop.
        q1 = q0
        head = e
        tail = e
    else:
        head = q0 << 2
        tail = q1 << 2
    f = f0
    while f + 4 <= f1:
        h0 = out[f]
        h1 = out[f + 1]
        h2 = out[f + 2]
        h3 = out[f + 3]
        for r in range(s, head):
            v = gh[r]
            _hadd(h0, _packed_code(codes4, f, r), v)
            _hadd(h1, _packed_code(codes4, f + 1, r), v)
            _hadd(h2, _packed_code(codes4, f + 2, r), v)
            _hadd(h3, _packed_code(codes4, f + 3, r), v)
        w0s = codes4[f]
        w1s = codes4[f + 1]
        w2s = codes4[f + 2]
        w3s = codes4[f + 3]
        for qi in range(q0, q1):
            q = np.uint64(qi)
            w0 = w0s[q]
            w1 = w1s[q]
            w2 = w2s[q]
            w3 = w3s[q]
            r = qi << 2
            for j in range(4):
                v = gh[np.uint64(r + j)]
                sh = j << 3
                _hadd(h0, (w0 >> sh) & 255, v)
                _hadd(h1, (w1 >> sh) & 255, v)
                _hadd(h2, (w2 >> sh) & 255, v)
                _hadd(h3, (w3 >> sh) & 255, v)
        for r in range(tail, e):
            v = gh[r]
            _hadd(h0, _packed_code(codes4, f, r), v)
            _hadd(h1, _packed_code(codes4, f + 1, r), v)
            _hadd(h2, _packed_code(codes4, f + 2, r), v)
            _hadd(h3, _packed_code(codes4, f + 3, r), v)
        f += 4
    while f < f1:
        h0 = out[f]
        for r in range(s, e):
            _hadd(h0, _packed_code(codes4, f, r), gh[r])
        f += 1


@kernel(parallel=True)
def _gh_packed_parallel(codes4, gh, s, e, out, n_parts):
    n_features = codes4.shape[0]
    for p in prange(n_parts):
        _gh_features_packed(codes4, gh, s, e, p * n_features // n_parts, (p + 1) * n_features // n_parts, out)


def pack_codes(binned):
    """Four row codes per uint32 word, for the contiguous-rows (root) histogram path.

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows)

    Returns
    -------
    ndarray of uint32, shape (n_features, ceil(n_rows / 4)), or None
        A view of ``binned`` when it is C-contiguous with ``n_rows % 4 == 0``, else a
        zero-padded copy; None on a big-endian machine (the byte order is assumed).
    """
    if sys.byteorder != "little" or binned.dtype != np.uint8 or binned.ndim != 2:
        return None
    n_features, n = binned.shape
    if n % 4 == 0 and binned.flags.c_contiguous:
        return binned.view(np.uint32)
    padded = np.zeros((n_features, n + (-n) % 4), dtype=np.uint8)
    padded[:, :n] = binned
    return padded.view(np.uint32)


@kernel
def _gather(gh, rows, s, e, buf):
    for k in range(s, e):
        buf[np.uint64(k - s)] = gh[np.uint32(rows[k])]


@kernel(parallel=True)
def _gh_parallel(binned, gh, rows, s, e, identity, buf, out, n_parts):
    # Gather in row chunks, then one feature range per part (parts own their slabs).
    n_features = binned.shape[0]
    if not identity:
        chunk = (e - s + n_parts - 1) // n_parts
        for p in prange(n_parts):
            a = min(e, s + p * chunk)
            _gather(gh, rows, a, min(e, a + chunk), buf[a - s:])
    for p in prange(n_parts):
        f0 = p * n_features // n_parts
        f1 = (p + 1) * n_features // n_parts
        if identity:
            _gh_features(binned, gh, rows, s, e, True, f0, f1, out)
        else:
            _gh_features(binned, buf, rows, s, e, False, f0, f1, out)


@compiled_only
def _gh_part(binned, codes4, gh, rows, a, b, s, identity, use_packed, buf, hist):
    """One row part ``a:b`` of a node over all features into ``hist`` (zeroed here).

    ``buf[k - s]`` receives the gathered pair of ``rows[k]``; the part gathers only its
    own rows, so no other thread reads them.
    """
    n_features = hist.shape[0]
    if identity:
        if use_packed:
            _gh_features_packed(codes4, gh, a, b, 0, n_features, hist)
        else:
            _gh_features(binned, gh, rows, a, b, True, 0, n_features, hist)
    else:
        part = buf[a - s:b - s]
        _gather(gh, rows, a, b, part)
        _gh_features(binned, part, rows, a, b, False, 0, n_features, hist)


@kernel(parallel=True)
def _gh_rows_parallel(binned, codes4, gh, rows, s, e, identity, use_packed, buf, out, partial):
    """Row-split build: part 0 sums its rows into ``out``, part p >= 1 into
    ``partial[p - 1]``; then ``out[f] += partial[p - 1, f]`` in part order, by feature.

    Each part reads only its own rows' codes and (g, h) pairs, which it gathers itself
    (one parallel region for gather and build, and each thread's histogram work sees a
    contiguous half of the node's row ids, as a rank does under mpirun). The sum order
    is fixed by the part count: out = ((part0 + part1) + part2) + ...
    """
    n_parts = partial.shape[0] + 1
    n_features = out.shape[0]
    chunk = (e - s + n_parts - 1) // n_parts
    for p in prange(n_parts):
        a = min(e, s + p * chunk)
        b = min(e, a + chunk)
        if p == 0:
            _gh_part(binned, codes4, gh, rows, a, b, s, identity, use_packed, buf, out)
        else:
            _gh_part(binned, codes4, gh, rows, a, b, s, identity, use_packed, buf, partial[p - 1])
    for f in prange(n_features):
        for p in range(n_parts - 1):
            out[f, :] += partial[p, f, :]


def build_gh_histogram(binned, channels, rows, start, stop, out, buf, n_threads=1, packed=None, split="features",
                       partial=None):
    """One node's (gradient, hessian) histogram; the engine's unchecked fast path.

    No input scan is made (callers validate ``binned`` once, at construction): codes
    must be ``< out.shape[1]`` and row ids in range, or memory is read out of bounds.

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows), C-contiguous
    channels : ndarray of float64, shape (n_rows, 2), C-contiguous
        Gradient and hessian per row.
    rows : ndarray of int32, shape (m,), or None
        Local row ids; the node owns ``rows[start:stop]``. ``None``: the node owns the
        positions ``start:stop`` themselves (the root).
    start, stop : int
    out : ndarray of float64, shape (n_features, n_bins, 2), C-contiguous
        Overwritten and returned.
    buf : ndarray of float64, shape (>= 2 * (stop - start),)
        Scratch for the gathered (g, h) pairs (unused when ``rows`` is None).
    n_threads : int
        Threads (feature ranges); 1 runs the serial kernel without touching the pool.
    packed : ndarray of uint32, shape (n_features, ceil(n_rows / 4)), optional
        :func:`pack_codes` of ``binned``; used for contiguous rows (``rows`` None),
        where it reads four codes per load.
    split : {"features", "rows"}
        How ``n_threads > 1`` share the node: each thread a feature range over all
        rows (sums bit-identical to one thread), or each thread a row part over all
        features into its own partial histogram, added into ``out`` afterwards (one
        parallel region for gather and build; the float sums then depend on the
        thread count, by rounding only).
    partial : ndarray of float64, shape (>= n_threads - 1, n_features, n_bins, 2), optional
        Scratch for ``split="rows"`` (allocated when None).

    Returns
    -------
    out
    """
    if channels.shape[1] != 2 or out.shape[2] != 2 or out.shape[0] != binned.shape[0]:
        raise ValueError(f"build_gh_histogram needs 2 channels and out of shape ({binned.shape[0]}, n_bins, 2); "
                         f"got channels {channels.shape}, out {out.shape}")
    gh = channels.reshape(-1).view(np.complex128)
    hv = out.reshape(out.shape[0], -1).view(np.complex128)
    if partial is not None and (partial.dtype != np.float64 or partial.shape[1:] != out.shape
                                or not partial.flags.c_contiguous):
        raise ValueError(f"partial must be C-contiguous float64 of shape (>= n_threads - 1,) + {out.shape}, "
                         f"got {partial.dtype} {partial.shape}")
    pv = None if partial is None else partial.reshape(partial.shape[0], out.shape[0], -1).view(np.complex128)
    _build_node(binned, gh, rows, start, stop, hv, buf.view(np.complex128), n_threads, packed, split, pv)
    return out


def build_int_histogram(binned, codes, rows, start, stop, out, buf, n_threads=1, packed=None, split="features",
                        partial=None):
    """One node's histogram of packed integer codes (quantized boosting, :mod:`histogram.quantize`).

    The same kernels as :func:`build_gh_histogram` with one int64 per row instead
    of a complex (g, h) pair: a row's code ``g * 2**32 + h`` is added to its bin by
    ONE integer add, and the bin sums are exact (so independent of the thread count
    and of the order of rows) while the fields do not overflow. Unchecked as
    :func:`build_gh_histogram` (codes ``< n_bins``, row ids in range).

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows), C-contiguous
    codes : ndarray of int64, shape (n_rows,), C-contiguous
        One packed code per row (one output channel).
    rows : ndarray of int32, shape (m,), or None
        As in :func:`build_gh_histogram`.
    start, stop : int
    out : ndarray of int64, shape (n_features, n_bins), C-contiguous
        Overwritten and returned.
    buf : ndarray of int64, shape (>= stop - start,)
        Scratch for the gathered codes (unused when ``rows`` is None).
    n_threads : int
    packed : ndarray of uint32, shape (n_features, ceil(n_rows / 4)), optional
        :func:`pack_codes` of ``binned`` (contiguous rows only).
    split : {"features", "rows"}
        As in :func:`build_gh_histogram`; integer sums are the same either way.
    partial : ndarray of int64, shape (>= n_threads - 1, n_features, n_bins), optional
        Scratch for ``split="rows"`` (allocated when None).

    Returns
    -------
    out
    """
    if codes.ndim != 1 or codes.dtype != np.int64 or out.dtype != np.int64 or out.ndim != 2 \
            or out.shape[0] != binned.shape[0] or buf.dtype != np.int64:
        raise ValueError(f"build_int_histogram needs int64 codes (n_rows,), out (n_features={binned.shape[0]}, "
                         f"n_bins) and buf; got codes {codes.dtype} {codes.shape}, out {out.dtype} {out.shape}, "
                         f"buf {buf.dtype}")
    if partial is not None and (partial.dtype != np.int64 or partial.shape[1:] != out.shape
                                or not partial.flags.c_contiguous):
        raise ValueError(f"partial must be C-contiguous int64 of shape (>= n_threads - 1,) + {out.shape}, "
                         f"got {partial.dtype} {partial.shape}")
    _build_node(binned, codes, rows, start, stop, out, buf, n_threads, packed, split, partial)
    return out


def _build_node(binned, gh, rows, start, stop, hv, bv, n_threads, packed, split, pv):
    """Dispatch of :func:`build_gh_histogram` / :func:`build_int_histogram` on element views.

    ``gh`` (n_rows,) one element per row (complex128 pair or int64 code), ``hv``
    (n_features, n_bins) the output, ``bv`` the gather scratch, ``pv`` (>= parts - 1,
    n_features, n_bins) the row-split scratch or None; all of one element type.
    """
    identity = rows is None
    if identity:
        rows = _NO_ROWS
    elif bv.shape[0] < stop - start:
        raise ValueError(f"buf holds {bv.shape[0]} pairs, the node has {stop - start} rows")
    if split not in ("features", "rows"):
        raise ValueError(f"split must be 'features' or 'rows', got {split!r}")
    if identity and packed is not None:
        if packed.shape != (binned.shape[0], (binned.shape[1] + 3) // 4) or packed.dtype != np.uint32:
            raise ValueError(f"packed must be uint32 of shape ({binned.shape[0]}, {(binned.shape[1] + 3) // 4}), "
                             f"got {packed.dtype} {packed.shape}")
    if split == "rows" and int(n_threads) > 1 and binned.shape[0] > 0:
        n_parts = min(int(n_threads), max(1, stop - start))
        if n_parts > 1:
            if pv is None:
                pv = np.empty((n_parts - 1,) + hv.shape, dtype=hv.dtype)
            elif pv.shape[0] < n_parts - 1:
                raise ValueError(f"partial must hold >= {n_parts - 1} histograms, got {pv.shape[0]}")
            use_packed = identity and packed is not None
            codes4 = packed if use_packed else _NO_PACKED
            _gh_rows_parallel(binned, codes4, gh, rows, int(start), int(stop), identity, use_packed, bv, hv,
                              pv[:n_parts - 1])
            return
    n_parts = min(int(n_threads), binned.shape[0])
    start, stop = int(start), int(stop)
    # One thread: the feature kernels straight from here. A jitted wrapper around them
    # would compile their machine code a second time (Numba links a callee into its
    # caller and LLVM optimises it again there), about a second of cold start each.
    if identity and packed is not None:
        if n_parts <= 1:
            _gh_features_packed(packed, gh, start, stop, 0, packed.shape[0], hv)
        else:
            _gh_packed_parallel(packed, gh, start, stop, hv, n_parts)
        return
    if n_parts > 1:
        _gh_parallel(binned, gh, rows, start, stop, identity, bv, hv, n_parts)
    elif identity:
        _gh_features(binned, gh, rows, start, stop, identity, 0, binned.shape[0], hv)
    else:
        _gather(gh, rows, start, stop, bv)
        _gh_features(binned, bv, rows, start, stop, identity, 0, binned.shape[0], hv)


_NO_ROWS = np.zeros(0, dtype=np.int32)
_NO_PACKED = np.zeros((0, 0), dtype=np.uint32)
_NO_BUF = np.zeros(0, dtype=np.float64)

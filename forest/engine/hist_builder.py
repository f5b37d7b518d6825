"""Local histograms of node row sets, and the sibling by subtraction.

This module owns histogram *building* for the growth loops (:mod:`forest.engine.expansion`):
one call per level or step over every node being built, the choice of threads, the
boosting ``(g, h)`` fast path, and the subtraction trick: of each pair of children
only the one with the smaller *global* weight (decided from the reduced parent
sums, so every rank builds the same child) is built and reduced; its sibling's
histogram is the parent's minus it.
"""
from contextlib import contextmanager

import numba
import numpy as np

from forest.engine.growth_options import current_engine_options
from forest.profiling import phase

#: Histogram builds over fewer rows than this run on one Numba thread: waking the
#: thread pool costs ~1 ms (tens of ms on an oversubscribed machine), more than
#: the work itself.
SERIAL_BUILD_ROWS = 16384


def gather_segments(rows, lo, hi):
    """Concatenate ``rows[lo[i]:hi[i]]`` and return ``(gathered int32, node_starts int64)``."""
    lengths = (hi - lo).astype(np.int64)
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    idx = np.arange(starts[-1], dtype=np.int64) + np.repeat(lo.astype(np.int64) - starts[:-1], lengths)
    return np.ascontiguousarray(rows[idx], dtype=np.int32), starts


def build(binned, channels, rows, node_starts, n_bins, backend):
    """``histogram.kernels.build_histograms``, on one thread below :data:`SERIAL_BUILD_ROWS` rows."""
    from histogram.kernels import build_histograms

    node_starts = np.asarray(node_starts, dtype=np.int64)
    n_rows = int(node_starts[-1] - node_starts[0])
    with phase("histogram"):
        threads = numba.get_num_threads()
        if n_rows >= SERIAL_BUILD_ROWS or threads == 1:
            return build_histograms(binned, channels, rows, node_starts, n_bins, backend=backend)
        numba.set_num_threads(1)
        try:
            return build_histograms(binned, channels, rows, node_starts, n_bins, backend=backend)
        finally:
            numba.set_num_threads(threads)


class HistogramBuilder:
    """Builds the local histograms of one fit's nodes.

    Parameters
    ----------
    binned : ndarray of uint8, shape (n_features, n_rows)
    n_bins : int
    n_channels : int
    engine : forest.engine.growth_options.EngineOptions, optional
        ``backend``, and for two-channel ``(g, h)`` data ``gh_parallel_rows`` and
        ``gh_hist_split`` (the fast path of :meth:`build_node`).
    quantized : bool, default False
        Whether :meth:`build_codes` (integer histograms) will be used.
    """

    def __init__(self, binned, n_bins, n_channels, engine=None, quantized=False):
        engine = current_engine_options() if engine is None else engine
        self.binned = binned
        self.n_bins = int(n_bins)
        self.backend = engine.backend
        self.engine = engine
        # The (g, h) fast path reads codes unchecked, so they are checked here, once
        # per fit, instead of by every histogram call.
        self.fast = engine.backend in ("auto", "numba")
        self.gh = self.fast and n_channels == 2
        self._gh_buf = None
        self._gh_partial = None
        self._int_buf = None
        self._int_partial = None
        self._packed = None
        self._cuda = None
        self._held = None  # channels promised unchanged (hold / release)
        if self.fast and (self.gh or quantized):
            from histogram.cpu_kernels import pack_codes

            self.binned = np.ascontiguousarray(binned)
            if self.binned.size and self.n_bins <= np.iinfo(self.binned.dtype).max \
                    and int(self.binned.max()) >= self.n_bins:
                raise ValueError(f"binned holds code {int(self.binned.max())} >= n_bins={self.n_bins}")
            # Root histograms read the codes four rows per 32-bit load (a view when the
            # row count is a multiple of 4, else a padded copy made once per fit; None for
            # uint16 codes, which take the unpacked kernels).
            self._packed = pack_codes(self.binned)

    def build(self, channels, rows, node_starts):
        """Histograms of node segments ``rows[node_starts[i]:node_starts[i+1]]`` (``rows`` None: all rows).

        Returns
        -------
        ndarray of float64, shape (n_nodes, n_features, n_bins, C)
        """
        if self.backend == "cuda":
            return self._build_cuda(channels, rows, node_starts)
        return build(self.binned, channels, rows, node_starts, self.n_bins, self.backend)

    def hold(self, channels):
        """Promise that ``channels`` stays unchanged until :meth:`release`.

        Builds that pass this same array may then reuse one copy of it: the CUDA
        backend uploads it once instead of at every build (a boosting tree builds
        one histogram per node from one channel array). It recognises the array by
        identity, so hold the C-contiguous float64 array the builds get (as both
        growers do). The CPU backends read the host array anyway; for them this only
        records the promise.
        """
        self._held = channels
        if self._cuda is not None:
            self._cuda.hold_channels(channels)

    def release(self):
        """End the promise of :meth:`hold`."""
        self._held = None
        if self._cuda is not None:
            self._cuda.release_channels()

    @contextmanager
    def holding(self, channels):
        """:meth:`hold` for the ``with`` block, then :meth:`release`."""
        self.hold(channels)
        try:
            yield self
        finally:
            self.release()

    def _build_cuda(self, channels, rows, node_starts):
        """:meth:`build` on the GPU, over codes uploaded once per fit (the first call)."""
        from histogram.kernels import validate_inputs

        with phase("histogram"):
            first = self._cuda is None
            binned, channels, rows, node_starts, identity = validate_inputs(
                self.binned, channels, rows, node_starts, self.n_bins, check_codes=first)
            if first:
                from histogram.cuda_kernels import CudaHistogramContext

                self._cuda = CudaHistogramContext(binned, self.n_bins)
                if self._held is not None:
                    self._cuda.hold_channels(self._held)
            if identity:
                rows = np.arange(binned.shape[1], dtype=np.int32)
            # A held C-contiguous float64 array passes the checks as itself, so the
            # context still knows it by identity.
            return self._cuda.build(channels, rows, node_starts)

    def build_segments(self, channels, rows, lo, hi):
        """Histograms of the segments ``rows[lo[i]:hi[i]]``, shape (len(lo), n_features, n_bins, C)."""
        gathered, starts = gather_segments(rows, lo, hi)
        return self.build(channels, gathered, starts)

    def build_node(self, channels, rows, start, stop):
        """Local histogram of one node, shape (1, n_features, n_bins, C).

        ``rows`` None: the node is the positions ``start:stop`` (the root over all rows).
        """
        if not self.gh:
            if rows is None:
                return self.build(channels, None, np.array([start, stop]))
            return self.build(channels, rows[start:stop], np.array([0, stop - start]))
        from histogram.cpu_kernels import build_gh_histogram

        with phase("histogram"):
            out = np.empty((1, self.binned.shape[0], self.n_bins, 2))
            m = stop - start
            if rows is not None and (self._gh_buf is None or len(self._gh_buf) < 2 * m):
                self._gh_buf = np.empty(2 * len(rows))
            threads = 1 if m < self.engine.gh_parallel_rows else numba.get_num_threads()
            buf = self._gh_buf if rows is not None else np.empty(0)
            partial = None
            if threads > 1:
                shape = (threads - 1,) + out.shape[1:]
                if self._gh_partial is None or self._gh_partial.shape != shape:
                    self._gh_partial = np.empty(shape)
                partial = self._gh_partial
            # Threads split the node's rows (each its own partial histogram, then
            # added), not its features: see EngineOptions.gh_hist_split.
            build_gh_histogram(self.binned, channels, rows, start, stop, out[0], buf, n_threads=threads,
                               packed=self._packed, split=self.engine.gh_hist_split, partial=partial)
            return out

    def build_codes(self, codes, rows, start, stop):
        """Local histogram of packed integer codes of one node (quantized boosting).

        Parameters
        ----------
        codes : ndarray of int64, shape (K, n_rows)
            :func:`histogram.quantize.quantize` codes, one row per output.
        rows : ndarray of int32, or None
            As in :meth:`build_node`.
        start, stop : int

        Returns
        -------
        ndarray of int64, shape (n_features * n_bins * K,)
            Packed sums in (feature, bin, output) order; exact.
        """
        from histogram.cpu_kernels import build_int_histogram
        from histogram.reference import build_int_histogram_numpy

        k, n_features = codes.shape[0], self.binned.shape[0]
        out = np.empty((n_features, self.n_bins, k), dtype=np.int64)
        with phase("histogram"):
            if not self.fast:
                idx = np.arange(start, stop) if rows is None else rows[start:stop]
                for j in range(k):
                    out[:, :, j] = build_int_histogram_numpy(self.binned, codes[j], idx)[:, :self.n_bins]
                return out.reshape(-1)
            m = stop - start
            if rows is not None and (self._int_buf is None or len(self._int_buf) < m):
                self._int_buf = np.empty(len(rows), dtype=np.int64)
            threads = 1 if m < self.engine.gh_parallel_rows else numba.get_num_threads()
            buf = self._int_buf if rows is not None else np.empty(0, dtype=np.int64)
            partial = None
            if threads > 1:
                shape = (threads - 1, n_features, self.n_bins)
                if self._int_partial is None or self._int_partial.shape != shape:
                    self._int_partial = np.empty(shape, dtype=np.int64)
                partial = self._int_partial
            one = out[:, :, 0] if k == 1 else np.empty((n_features, self.n_bins), dtype=np.int64)
            for j in range(k):
                build_int_histogram(self.binned, codes[j], rows, start, stop, one, buf, n_threads=threads,
                                    packed=self._packed, split=self.engine.gh_hist_split, partial=partial)
                if k > 1:
                    out[:, :, j] = one
        return out.reshape(-1)

    def children(self, reducer, channels, rows, parent_hist, lo, mid, hi, build_left):
        """Reduced histograms of both children of each split, by subtraction.

        Parameters
        ----------
        reducer : forest.engine.reducers.LocalReducer
        channels : ndarray of float64, shape (n_rows, C)
        rows : ndarray of int32
            Local rows grouped by node; split ``i``'s children own ``rows[lo[i]:mid[i]]``
            (left) and ``rows[mid[i]:hi[i]]`` (right).
        parent_hist : ndarray, shape (n_splits, f1 - f0, n_bins, C)
            The parents' reduced histograms (this rank's features).
        lo, mid, hi : ndarray of int64, shape (n_splits,)
        build_left : ndarray of bool, shape (n_splits,)
            Which child to build: the one of smaller global weight (every rank
            decides alike from reduced sums).

        Returns
        -------
        left, right : ndarray, shape (n_splits, f1 - f0, n_bins, C)
        """
        local = self.build_segments(channels, rows, np.where(build_left, lo, mid), np.where(build_left, mid, hi))
        built, _ = reducer.reduce(local, np.zeros(0))
        sibling = parent_hist - built
        sel = build_left[:, None, None, None]
        return np.where(sel, built, sibling), np.where(sel, sibling, built)

    def child_pair(self, reducer, channels, rows, parent_hist, lo, mid, hi, build_left, extra):
        """:meth:`children` of one split in scalars (the best-first step).

        The built child goes through :meth:`build_node` (the ``(g, h)`` fast path) and
        ``extra`` (small values, e.g. its row count) rides in the same collective.

        Returns
        -------
        pair : ndarray, shape (2, f1 - f0, n_bins, C), C-contiguous
            ``pair[0]`` the left child's histogram, ``pair[1]`` the right one's: stacked
            already, so the split search reads both without another copy.
        extra : ndarray of float64
        """
        b_lo, b_hi = (lo, mid) if build_left else (mid, hi)
        built, extra = reducer.reduce(self.build_node(channels, rows, b_lo, b_hi), extra)
        pair = np.empty((2,) + parent_hist.shape)
        k = 0 if build_left else 1
        pair[k] = built[0]
        np.subtract(parent_hist, built[0], out=pair[1 - k])
        return pair, extra

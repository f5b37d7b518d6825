"""Narrow wire packing of integer (quantized) histograms for the collectives.

Quantized boosting (:mod:`forest.engine.quantized`) builds local histograms of packed
int64 codes (``G * 2**32 + H`` per bin and output, :mod:`histogram.quantize`). Before
an allreduce they are re-packed per bin into the narrowest form that a *bound on
the global sums* proves exact, so the reduced sums are exact and independent of the
rank count and the reduction order:

* **absent**: the bin holds no training row on any rank (its sums are 0);
* **narrow**: one slot ``G * 2**half + H`` (16|16 bits in an int32 slot), when
  ``|G| < 2**(half-1)`` and ``H < 2**half`` are guaranteed;
* **wide**: two slots ``G`` and ``H``.

The slot type is int32 (``half = 16``) when every wide bin fits in int32, else
int64 (``half = 32``). Integer additions wrap modulo ``2**bits``, so only the final
sums need to fit, which the bounds guarantee.

The bounds are known to every rank without a message: the global row count of the
bin over the whole training set (one reduction per fit), capped by the global row
count of the node's parent, times the largest integer a row carries (``levels / 2``
for ``|G|``, ``levels`` for ``H``; both fields then fit in ``half`` bits under the same
condition). Every rank computes the same layout from the same numbers. With the
default 4 levels a bin is narrow when it holds fewer than 16384 rows: with 255
quantile bins that is every ordinary bin of a 4M-row training set.
"""
import numpy as np

from histogram.jit import kernel
from histogram.quantize import FIELD_BITS, split_code, unpack


@kernel
def _layout(bin_rows, row_cap, k_out, g_max, h_max, half, slot, wide):
    """Slot of each (bin, output) entry: -1 absent, else its first slot; ``wide`` marks two slots.

    ``bin_rows`` (n_bins_total,) global rows per bin. Returns the number of slots.
    """
    n = 0
    lim_g = np.int64(1) << (half - 1)
    lim_h = np.int64(1) << half
    for b in range(bin_rows.shape[0]):
        rows = min(bin_rows[b], row_cap)
        for k in range(k_out):
            e = b * k_out + k
            if rows <= 0:
                slot[e] = -1
                wide[e] = False
                continue
            slot[e] = n
            narrow = rows * g_max < lim_g and rows * h_max < lim_h
            wide[e] = not narrow
            n += 1 if narrow else 2
    return n


@kernel
def _encode(codes, slot, wide, half, out):
    for e in range(codes.shape[0]):
        s = slot[e]
        if s < 0:
            continue
        g, h = split_code(codes[e])
        if wide[e]:
            out[s] = g
            out[s + 1] = h
        else:
            out[s] = (g << half) + h


@kernel
def _decode(buf, slot, wide, half, k_out, out):
    """Reduced slots into ``out`` (n_bins_total, 2K): ``G`` in columns ``0..K-1``, ``H`` in ``K..2K-1``."""
    low = (np.int64(1) << half) - 1
    for e in range(slot.shape[0]):
        b = e // k_out
        k = e - b * k_out
        s = slot[e]
        if s < 0:
            out[b, k] = 0
            out[b, k_out + k] = 0
        elif wide[e]:
            out[b, k] = np.int64(buf[s])
            out[b, k_out + k] = np.int64(buf[s + 1])
        else:
            v = np.int64(buf[s])
            h = v & low
            out[b, k] = (v - h) >> half
            out[b, k_out + k] = h


class WireLayout:
    """How one node's integer histogram travels (see the module docstring).

    Parameters
    ----------
    bin_rows : ndarray of int64, shape (n_features * n_bins,)
        Global training rows per (feature, bin).
    row_cap : int
        Global rows of the node's parent (or of the training set for the root).
    n_outputs : int
    levels : int

    Attributes
    ----------
    dtype : numpy dtype
        int32 or int64 slots.
    n_slots : int
    """

    def __init__(self, bin_rows, row_cap, n_outputs, levels):
        n_entries = bin_rows.shape[0] * n_outputs
        self.n_outputs = int(n_outputs)
        self.slot = np.empty(n_entries, dtype=np.int64)
        self.wide = np.empty(n_entries, dtype=np.bool_)
        g_max, h_max = levels // 2, levels
        # int32 slots unless a wide bin's sums could leave int32.
        top = min(int(bin_rows.max()) if len(bin_rows) else 0, int(row_cap))
        self.half = 16 if top * h_max < 2 ** 31 else FIELD_BITS
        self.dtype = np.dtype(np.int32 if self.half == 16 else np.int64)
        self.n_slots = int(_layout(bin_rows, np.int64(row_cap), self.n_outputs, np.int64(g_max),
                                   np.int64(h_max), np.int64(self.half), self.slot, self.wide))

    def encode(self, codes, out=None):
        """Local packed codes (n_entries,) int64 -> wire buffer (n_slots + extra,) of ``dtype``."""
        if out is None:
            out = np.empty(self.n_slots, dtype=self.dtype)
        _encode(codes, self.slot, self.wide, np.int64(self.half), out)
        return out

    def decode(self, buf):
        """Reduced wire buffer -> exact sums, int64 of shape (n_entries // K, 2K)."""
        out = np.empty((self.slot.shape[0] // self.n_outputs, 2 * self.n_outputs), dtype=np.int64)
        _decode(buf, self.slot, self.wide, np.int64(self.half), self.n_outputs, out)
        return out


def unpack_histogram(codes, n_outputs):
    """Packed codes (n_entries,) int64 -> sums (n_entries // K, 2K) int64, without a wire."""
    g, h = unpack(np.asarray(codes).reshape(-1, n_outputs))
    return np.concatenate([g, h], axis=1)

"""The parts of a fitted bin mapper that growers use (:class:`BinInfo`).

This module owns the growers' view of the binning: the bin-axis length, the missing
bin, the value bins in use per feature and the raw threshold of every "bin <= b goes
left" split, as one lookup table.
"""
import numpy as np

from histogram.dtypes import WIDE_BIN_DTYPE, bin_dtype

from forest.engine.tree import cat_words


class BinInfo:
    """The parts of a fitted :class:`histogram.binning.BinMapper` that growers use.

    Parameters
    ----------
    n_bins : int
        Histogram bin-axis length (value bins plus the missing bin).
    missing_bin : int
    n_bins_non_missing : array-like of int, shape (n_features,)
    bin_thresholds : list of ndarray of float64
        ``bin_thresholds[f]`` has shape ``(n_bins_non_missing[f] - 1,)``; value bin
        ``b`` holds ``thresholds[b-1] < x <= thresholds[b]``.
    categorical : array-like of bool, shape (n_features,), optional
        Features whose value bins are categories (split by category subsets,
        :mod:`forest.engine.categorical_split`); none when omitted.

    Attributes
    ----------
    cat_words : int
        Words of the categorical bitsets of a model grown on this binning.
    wide : bool
        Whether the bin axis is wider than 256 (uint16 codes).
    threshold_table : ndarray of float64, shape (n_features, width)
        ``threshold_table[f, b]`` = :meth:`threshold` for every bin a split of
        feature ``f`` can use (``+inf`` past its last edge), so a batch of
        (feature, bin) pairs maps to raw thresholds in one lookup.
    """

    def __init__(self, n_bins, missing_bin, n_bins_non_missing, bin_thresholds, categorical=None):
        self.n_bins = int(n_bins)
        self.missing_bin = int(missing_bin)
        self.n_bins_non_missing = np.asarray(n_bins_non_missing, dtype=np.int64)
        self.bin_thresholds = [np.asarray(t, dtype=np.float64) for t in bin_thresholds]
        self.n_features = len(self.n_bins_non_missing)
        self.categorical = np.zeros(self.n_features, dtype=bool) if categorical is None \
            else np.asarray(categorical, dtype=bool).copy()
        self.any_categorical = bool(self.categorical.any())
        #: uint64 words of this binning's categorical bitsets (:func:`forest.engine.tree.cat_words`).
        self.cat_words = cat_words(self.missing_bin)
        #: Whether the bin axis is wider than 256 (wide categorical codes, uint16).
        self.wide = bin_dtype(self.n_bins) == WIDE_BIN_DTYPE
        width = max([len(t) for t in self.bin_thresholds] + [0]) + 1
        self.threshold_table = np.full((self.n_features, width), np.inf)
        for f, t in enumerate(self.bin_thresholds):
            self.threshold_table[f, :len(t)] = t

    @classmethod
    def from_mapper(cls, mapper):
        """From a fitted BinMapper (or anything with the same attributes)."""
        if isinstance(mapper, BinInfo):
            return mapper
        return cls(mapper.n_bins_, mapper.missing_bin_, mapper.n_bins_non_missing_, mapper.bin_thresholds_,
                   getattr(mapper, "categorical_", None))

    def threshold(self, feature, bin_index):
        """Raw threshold of "bin <= bin_index goes left" (``+inf``: every value left)."""
        t = self.bin_thresholds[feature]
        return float(t[bin_index]) if bin_index < len(t) else np.inf

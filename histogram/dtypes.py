"""The dtypes of the data path, kept in one place.

Binned codes are ``uint8`` (:data:`BIN_DTYPE`): at most 255 value bins plus one
missing-value bin. The one exception is a model with a categorical column of more than
255 categories that keeps one code per category (wide codes, issue 32: gradient
boosting; :mod:`histogram.categories`): its codes are ``uint16``
(:data:`WIDE_BIN_DTYPE`), chosen per fit by :func:`bin_dtype` from the bin axis length,
so every fit whose columns fit 255 value bins keeps ``uint8`` codes.
Channels (the per-sample statistics the histograms sum) are ``float64``.
Local row indices are ``int32`` (a rank holds fewer than 2**31 rows); global row
ids are ``int64`` because the whole data set may not fit that.
"""
import numpy as np

BIN_DTYPE = np.uint8
WIDE_BIN_DTYPE = np.uint16
CHANNEL_DTYPE = np.float64
ROW_INDEX_DTYPE = np.int32
GLOBAL_ROW_DTYPE = np.int64
X_DTYPE = np.float64

#: Most value bins a feature may have; the missing-value bin comes on top.
MAX_VALUE_BINS = 255

#: Most codes (value bins) a categorical column with wide codes may have: past it the
#: rarest categories share the last code. The histogram bin axis of such a fit is as
#: wide as its widest column (plus the missing bin), for every feature, so the cap bounds
#: histogram memory: 4,096 bins x 8 bytes x 2 channels = 64 KiB per feature and node.
MAX_CATEGORY_CODES = 4095


def bin_dtype(n_bins):
    """Dtype of the codes of a bin axis of ``n_bins`` entries (missing bin included).

    ``uint8`` up to 256 entries, else ``uint16`` (at most ``MAX_CATEGORY_CODES + 1``).
    """
    n_bins = int(n_bins)
    if not 1 <= n_bins <= MAX_CATEGORY_CODES + 1:
        raise ValueError(f"a bin axis has 1..{MAX_CATEGORY_CODES + 1} entries, got {n_bins}")
    return np.dtype(BIN_DTYPE) if n_bins <= MAX_VALUE_BINS + 1 else np.dtype(WIDE_BIN_DTYPE)


def codes_dtype(codes):
    """The code dtype an array of codes is read as: ``uint16`` (wide codes) when it is one,
    else ``uint8`` (integer codes of other dtypes are taken as narrow codes)."""
    return np.dtype(WIDE_BIN_DTYPE) if np.asarray(codes).dtype == WIDE_BIN_DTYPE else np.dtype(BIN_DTYPE)


def is_bin_dtype(dtype):
    """Whether ``dtype`` is one of the code dtypes (``uint8`` or ``uint16``)."""
    return np.dtype(dtype) in (np.dtype(BIN_DTYPE), np.dtype(WIDE_BIN_DTYPE))

"""The dtypes of the data path, kept in one place.

Binned codes are ``uint8``: at most 255 value bins plus one missing-value bin.
Channels (the per-sample statistics the histograms sum) are ``float64``.
Local row indices are ``int32`` (a rank holds fewer than 2**31 rows); global row
ids are ``int64`` because the whole data set may not fit that.
"""
import numpy as np

BIN_DTYPE = np.uint8
CHANNEL_DTYPE = np.float64
ROW_INDEX_DTYPE = np.int32
GLOBAL_ROW_DTYPE = np.int64
X_DTYPE = np.float64

#: Most value bins a feature may have; the missing-value bin comes on top.
MAX_VALUE_BINS = 255

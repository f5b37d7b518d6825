"""BinMapper.transform (two-level counting kernel) against the searchsorted reference."""
import numpy as np
import pytest

from histogram.binning import BinMapper, transform_reference


@pytest.mark.parametrize("max_bins", [2, 15, 16, 17, 255])
def test_transform_matches_reference_at_edges(rng, max_bins):
    n = 6000
    X = np.column_stack([rng.normal(size=n), rng.integers(0, 40, size=n).astype(float),
                         rng.exponential(size=n), np.zeros(n), np.full(n, np.nan)])
    X[rng.random(n) < 0.05, 0] = np.nan
    X[:7, 2] = [-np.inf, np.inf, np.nan, 0.0, -0.0, 1e300, -1e300]
    bm = BinMapper(max_bins=max_bins, random_state=1).fit(X)
    # New values: every threshold itself, its float neighbours, infinities and NaN.
    probe = [np.concatenate([t, np.nextafter(t, np.inf), np.nextafter(t, -np.inf), [-np.inf, np.inf, np.nan]])
             for t in bm.bin_thresholds_]
    width = max(len(p) for p in probe)
    Z = np.column_stack([np.resize(p, width) for p in probe])
    for data in (X, Z):
        got = bm.transform(data)
        np.testing.assert_array_equal(got, transform_reference(data, bm.bin_thresholds_, bm.missing_bin_))
    assert bm.transform(X)[0].max() == bm.missing_bin_ and bm.transform(X)[2].max() > 0  # the test can fail

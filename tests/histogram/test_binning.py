"""BinMapper: threshold convention, edge cases, quantile quality, state round trip."""
import numpy as np
import pytest

from histogram.binning import BinMapper, _greedy_cuts, _midpoints, transform_reference
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def fit(X, **kw):
    return BinMapper(**kw).fit(X, comm=SELF)


def check_contract(bm, X):
    """transform == reference, and 'bin <= b' == 'x <= thresholds[b]' on raw values."""
    binned = bm.transform(X)
    assert binned.dtype == np.uint8 and binned.flags.c_contiguous
    assert binned.shape == (X.shape[1], X.shape[0])
    np.testing.assert_array_equal(binned, transform_reference(X, bm.bin_thresholds_,
                                                              bm.missing_bin_))
    for f, t in enumerate(bm.bin_thresholds_):
        assert t.shape == (bm.n_bins_non_missing_[f] - 1,)
        assert np.all(np.diff(t) > 0) and not np.isnan(t).any() and not (t == np.inf).any()
        x = X[:, f]
        ok = ~np.isnan(x)
        assert np.all(binned[f][~ok] == bm.missing_bin_)
        assert np.all(binned[f][ok] < bm.n_bins_non_missing_[f])
        for b in range(t.shape[0]):
            np.testing.assert_array_equal(binned[f][ok] <= b, x[ok] <= t[b])
    return binned


def test_continuous_features_use_all_bins(rng):
    X = np.column_stack([rng.normal(size=3000), rng.exponential(size=3000)])
    bm = fit(X, max_bins=32)
    assert bm.missing_bin_ == 32 and bm.n_bins_ == 33
    assert bm.n_bins_non_missing_.tolist() == [32, 32]
    assert not bm.is_exact_.any()
    binned = check_contract(bm, X)
    # each of the 32 bins holds about 3000/32 rows when all rows are the sample
    counts = np.stack([np.bincount(b, minlength=32) for b in binned])
    assert counts.min() >= 0.8 * 3000 / 32 and counts.max() <= 1.2 * 3000 / 32


def test_few_distinct_values_are_exact_midpoints(rng):
    X = rng.integers(-3, 7, size=(4000, 1)).astype(float)
    bm = fit(X)
    np.testing.assert_array_equal(bm.bin_thresholds_[0], np.arange(-3, 6) + 0.5)
    assert bm.is_exact_.all()
    binned = check_contract(bm, X)
    np.testing.assert_array_equal(binned[0], X[:, 0] + 3)


def test_rare_value_missed_by_sample_still_gets_its_own_bin(rng):
    # 60k rows, sample of ~2000: the single row holding 99 is almost surely not
    # sampled, but the feature has 6 distinct values and must stay exact.
    x = rng.integers(0, 5, size=60_000).astype(float)
    x[12345] = 99.0
    X = x[:, None]
    bm = fit(X, subsample=2000)
    assert bm.n_samples_fit_ < 3000
    np.testing.assert_array_equal(bm.bin_thresholds_[0], [0.5, 1.5, 2.5, 3.5, 51.5])
    assert bm.is_exact_[0]
    assert bm.transform(X)[0, 12345] == 5


def test_feature_with_exactly_max_bins_values_and_one_more():
    x = np.repeat(np.arange(16.0), 10)
    assert fit(x[:, None], max_bins=16).n_bins_non_missing_[0] == 16
    x17 = np.repeat(np.arange(17.0), 10)
    bm = fit(x17[:, None], max_bins=16)
    assert bm.n_bins_non_missing_[0] == 16 and not bm.is_exact_[0]
    check_contract(bm, x17[:, None])


def test_constant_and_all_nan_features(rng):
    X = np.column_stack([np.full(500, 4.2), np.full(500, np.nan), rng.normal(size=500)])
    X[::5, 0] = np.nan
    bm = fit(X)
    assert bm.n_bins_non_missing_[:2].tolist() == [1, 1]
    assert bm.bin_thresholds_[0].shape == (0,) and bm.bin_thresholds_[1].shape == (0,)
    binned = check_contract(bm, X)
    assert set(np.unique(binned[0])) == {0, bm.missing_bin_}
    assert np.all(binned[1] == bm.missing_bin_)
    # finite values met later in an all-NaN feature land in its only value bin
    later = bm.transform(np.array([[4.2, -1e9, 0.0], [1.0, np.inf, 0.0]]))
    assert later[1].tolist() == [0, 0] and later[0].tolist() == [0, 0]


def test_infinities_are_ordinary_extreme_values(rng):
    x = np.array([-np.inf, -1.0, 0.0, 2.0, np.inf, np.nan] * 20)
    bm = fit(x[:, None])
    t = bm.bin_thresholds_[0]
    # -inf | -1 | 0 | 2 | +inf: threshold below -1 is -inf itself, above 2 is 2 itself
    np.testing.assert_array_equal(t, [-np.inf, -0.5, 1.0, 2.0])
    binned = check_contract(bm, x[:, None])
    assert binned[0, :6].tolist() == [0, 1, 2, 3, 4, bm.missing_bin_]
    # many distinct values plus infinities: infinities sit in the outermost bins
    y = rng.normal(size=5000)
    y[:40] = np.inf
    y[40:70] = -np.inf
    bm = fit(y[:, None], max_bins=64)
    b = check_contract(bm, y[:, None])[0]
    assert np.all(b[:40] == bm.n_bins_non_missing_[0] - 1) and np.all(b[40:70] == 0)
    assert np.isfinite(bm.bin_thresholds_[0]).any()


def test_only_infinities():
    x = np.array([np.inf, -np.inf, np.inf])
    bm = fit(x[:, None])
    np.testing.assert_array_equal(bm.bin_thresholds_[0], [-np.inf])
    assert bm.transform(x[:, None])[0].tolist() == [1, 0, 1]


def test_midpoints_never_collapse():
    lo = np.array([1.0, -np.inf, 5.0, 1e308, -1e308, 0.0, 1.0])
    hi = np.array([2.0, 3.0, np.inf, np.inf, 1e308, 5e-324, np.nextafter(1.0, 2.0)])
    t = _midpoints(lo, hi)
    assert np.all(lo <= t) and np.all(t < hi)
    assert t[0] == 1.5 and t[4] == 0.0


def test_input_dtypes_are_converted(rng):
    Xi = rng.integers(0, 1000, size=(2000, 3))
    a = fit(Xi, max_bins=50)
    b = fit(Xi.astype(np.float64), max_bins=50)
    np.testing.assert_array_equal(a.thresholds_flat_, b.thresholds_flat_)
    Xf = rng.normal(size=(2000, 2)).astype(np.float32)
    c = fit(Xf, max_bins=50)
    check_contract(c, Xf.astype(np.float64))
    np.testing.assert_array_equal(c.transform(Xf), c.transform(Xf.astype(np.float64)))


def test_sample_depends_on_seed_not_row_order(rng):
    X = rng.normal(size=(20_000, 1))
    a = fit(X, subsample=1000, random_state=1)
    b = fit(X, subsample=1000, random_state=1)
    c = fit(X, subsample=1000, random_state=2)
    np.testing.assert_array_equal(a.thresholds_flat_, b.thresholds_flat_)
    assert not np.array_equal(a.thresholds_flat_, c.thresholds_flat_)
    assert 800 < a.n_samples_fit_ < 1200


def test_greedy_cuts_gives_heavy_tie_its_own_bin():
    counts = np.array([1] * 100 + [500] + [1] * 100, dtype=np.int64)
    cuts = _greedy_cuts(counts, 10)
    assert len(cuts) == 9
    assert 99 in cuts and 100 in cuts  # value 100 (the tie) is a bin on its own
    sizes = np.diff(np.concatenate(([0], cuts + 1, [len(counts)])))
    bin_counts = np.add.reduceat(counts, np.concatenate(([0], cuts + 1)))
    others = bin_counts[bin_counts != 500]
    assert sizes.sum() == len(counts) and others.max() <= 2 * others.min()


def test_greedy_cuts_invariants_on_random_counts():
    rng = np.random.default_rng(5)
    for _ in range(500):
        n = int(rng.integers(2, 400))
        max_bins = int(rng.integers(2, 40))
        # mostly light values with a few heavy ties
        counts = (1 + (rng.random(n) < 0.05) * rng.integers(1, 400, n)).astype(np.int64)
        cuts = _greedy_cuts(counts, max_bins)
        assert np.all(np.diff(cuts) > 0)
        assert len(cuts) == 0 or (cuts[0] >= 0 and cuts[-1] < n - 1)
        assert len(cuts) == min(n, max_bins) - 1


def test_quantile_quality_on_one_million_skewed_rows():
    """Every bin within 2x of n/max_bins rows on 1M lognormal rows (sigma 2: skewed)."""
    rng = np.random.default_rng(2024)
    n = 1_000_000
    x = rng.lognormal(mean=0.0, sigma=2.0, size=n)
    # second feature: 20 % of rows tied at exactly 0, the rest skewed
    z = rng.exponential(size=n) ** 3
    z[rng.random(n) < 0.2] = 0.0
    X = np.column_stack([x, z])
    bm = fit(X)
    binned = bm.transform(X)
    target = n / bm.max_bins
    counts = np.bincount(binned[0], minlength=bm.n_bins_)
    assert bm.n_bins_non_missing_[0] == 255
    assert counts[:255].min() >= target / 2 and counts[:255].max() <= 2 * target
    counts = np.bincount(binned[1], minlength=bm.n_bins_)[:bm.n_bins_non_missing_[1]]
    tie_bin = binned[1][z == 0.0][0]
    # the tie is (nearly) a bin of its own, forced above 2x; a few tiny values the
    # sample never saw may share it
    n_zero = np.sum(z == 0.0)
    assert n_zero <= counts[tie_bin] < n_zero + target / 2
    others = np.delete(counts, tie_bin)
    assert others.min() >= target / 2 and others.max() <= 2 * target


def test_state_round_trip_is_plain_arrays(rng):
    X = np.column_stack([rng.normal(size=800), rng.integers(0, 4, 800), np.full(800, np.nan)])
    bm = fit(X, max_bins=40)
    state = bm.get_state()
    for v in state.values():
        assert v is None or isinstance(v, (np.ndarray, int, float, bool))
    again = BinMapper.from_state(state)
    np.testing.assert_array_equal(again.transform(X), bm.transform(X))
    for a, b in zip(again.bin_thresholds_, bm.bin_thresholds_):
        np.testing.assert_array_equal(a, b)
    assert again.n_bins_ == bm.n_bins_ and again.missing_bin_ == 40
    with pytest.raises(ValueError, match="missing keys"):
        BinMapper.from_state({"max_bins": 3})


def test_bin_to_threshold(rng):
    bm = fit(rng.integers(0, 3, size=(100, 1)))
    assert bm.bin_to_threshold(0, 1) == 1.5
    with pytest.raises(ValueError, match="no threshold"):
        bm.bin_to_threshold(0, 2)


@pytest.mark.parametrize("params, X, match", [
    (dict(max_bins=1), np.zeros((3, 1)), "max_bins"),
    (dict(max_bins=256), np.zeros((3, 1)), "max_bins"),
    (dict(subsample=0), np.zeros((3, 1)), "subsample"),
    (dict(), np.zeros(3), "2-D"),
    (dict(), np.zeros((3, 0)), "no features"),
    (dict(), np.array([["a"]]), "numeric"),
    (dict(), np.zeros((0, 2)), "no rows"),
])
def test_bad_fit_input_raises(params, X, match):
    with pytest.raises(ValueError, match=match):
        BinMapper(**params).fit(X, comm=SELF)


def test_transform_checks():
    with pytest.raises(ValueError, match="not fitted"):
        BinMapper().transform(np.zeros((2, 2)))
    bm = fit(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="features"):
        bm.transform(np.zeros((4, 3)))

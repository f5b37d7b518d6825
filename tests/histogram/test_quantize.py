"""Quantized boosting's histogram side: stochastic rounding against its NumPy reference,
the int64 packing, and the integer histogram kernel against the NumPy reference."""
import numba
import numpy as np
import pytest

from histogram.cpu_kernels import build_int_histogram, pack_codes
from histogram.quantize import column_abs_max, pack, quantize, quantize_reference, scales, unpack
from histogram.reference import build_int_histogram_numpy


def _channels(rng, n, k):
    g = rng.normal(size=(n, k)) * rng.uniform(0.1, 3.0, size=k)
    h = rng.uniform(0, 2, size=(n, k))
    return np.concatenate([g, h], axis=1)


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("levels", [2, 4, 16])
def test_quantize_matches_reference_and_stays_in_range(rng, k, levels):
    n = 20011  # above the parallel threshold
    ch = _channels(rng, n, k)
    ch[::7] = 0.0  # rows of weight 0
    gids = rng.permutation(10 * n)[:n].astype(np.int64)
    s = scales(np.abs(ch[:, :k]).max(axis=0), ch[:, k:].max(axis=0), levels)
    got = quantize(ch, gids, 11, 5, s, levels)
    np.testing.assert_array_equal(got, quantize_reference(ch, gids, 11, 5, s, levels))
    g, h = unpack(got)
    assert g.min() >= -levels // 2 and g.max() <= levels // 2 and h.min() >= 0 and h.max() <= levels
    assert not g[:, ::7].any() and not h[:, ::7].any()  # weight-0 rows add nothing
    # Unbiased: the mean of g_int * scale is the mean of g within a few standard errors.
    for j in range(k):
        err = (g[j] * s[j]).mean() - ch[:, j].mean()
        assert abs(err) < 5 * s[j] / np.sqrt(n), (j, err)
        err_h = (h[j] * s[k + j]).mean() - ch[:, k + j].mean()
        assert abs(err_h) < 5 * s[k + j] / np.sqrt(n), (j, err_h)


def test_quantize_depends_on_global_ids_not_positions(rng):
    ch = _channels(rng, 500, 1)
    gids = np.arange(1000, 1500, dtype=np.int64)
    s = scales([np.abs(ch[:, 0]).max()], [ch[:, 1].max()], 4)
    full = quantize(ch, gids, 3, 9, s, 4)
    part = quantize(ch[200:], gids[200:], 3, 9, s, 4)  # another rank's share
    np.testing.assert_array_equal(full[:, 200:], part)
    assert not np.array_equal(full, quantize(ch, gids, 3, 10, s, 4))  # the stream (iteration) matters


def test_quantize_rejects_bad_input(rng):
    ch = _channels(rng, 10, 1)
    with pytest.raises(ValueError, match="levels"):
        quantize(ch, np.arange(10), 0, 0, np.ones(2), 3)
    with pytest.raises(ValueError, match="channels"):
        quantize(ch[:, :1], np.arange(10), 0, 0, np.ones(2), 4)
    with pytest.raises(ValueError, match="scales"):
        quantize(ch, np.arange(10), 0, 0, np.zeros(2), 4)
    np.testing.assert_array_equal(scales([0.0], [0.0], 4), [1.0, 1.0])


def test_pack_unpack_round_trip_and_sums(rng):
    g = rng.integers(-2 ** 31 // 4, 2 ** 31 // 4, size=1000)
    h = rng.integers(0, 2 ** 32 // 4, size=1000)
    gg, hh = unpack(pack(g, h))
    np.testing.assert_array_equal(gg, g)
    np.testing.assert_array_equal(hh, h)
    # Sums of codes are the codes of the sums (negative totals included).
    sg, sh = unpack(pack(g[:4], h[:4]).sum())
    assert (sg, sh) == (g[:4].sum(), h[:4].sum())
    assert unpack(pack(-3, 0).sum()) == (-3, 0)
    assert unpack(pack([-2, -2, 1], [4, 0, 4]).sum()) == (-3, 8)


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("mode", ["root", "root_packed", "subset"])
@pytest.mark.parametrize("split", ["features", "rows"])
def test_int_histogram_matches_reference(rng, n_threads, mode, split):
    n, n_bins, n_features = 3001, 200, 7
    binned = rng.integers(0, n_bins, size=(n_features, n)).astype(np.uint8)
    codes = pack(rng.integers(-2, 3, size=n), rng.integers(0, 5, size=n))
    rows = rng.permutation(n).astype(np.int32) if mode == "subset" else None
    packed = pack_codes(binned) if mode == "root_packed" else None
    threads = min(n_threads, numba.config.NUMBA_NUM_THREADS)
    for start, stop in [(0, n), (113, 2170), (5, 6), (9, 9)]:
        out = np.full((n_features, n_bins), 77, dtype=np.int64)  # stale contents must be overwritten
        got = build_int_histogram(binned, codes, rows, start, stop, out, np.empty(n, dtype=np.int64),
                                  n_threads=threads, packed=packed, split=split)
        idx = np.arange(start, stop) if rows is None else rows[start:stop]
        np.testing.assert_array_equal(got, build_int_histogram_numpy(binned, codes, idx)[:, :n_bins])


def test_int_histogram_rejects_bad_arrays(rng):
    binned = np.zeros((3, 10), np.uint8)
    codes = np.zeros(10, dtype=np.int64)
    with pytest.raises(ValueError, match="int64"):
        build_int_histogram(binned, codes.astype(np.float64), None, 0, 10, np.zeros((3, 4), np.int64),
                            np.empty(0, np.int64))
    with pytest.raises(ValueError, match="int64"):
        build_int_histogram(binned, codes, None, 0, 10, np.zeros((3, 4)), np.empty(0, np.int64))
    with pytest.raises(ValueError, match="buf holds"):
        build_int_histogram(binned, codes, np.arange(10, dtype=np.int32), 0, 10, np.zeros((3, 4), np.int64),
                            np.empty(3, np.int64))


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("n", [0, 5, 40_000])
def test_column_abs_max_matches_numpy(rng, n_threads, n):
    x = rng.normal(size=(n, 4)) * np.array([1.0, 1e-3, 50.0, 0.0])
    old = numba.get_num_threads()
    numba.set_num_threads(min(n_threads, numba.config.NUMBA_NUM_THREADS))
    try:
        got = column_abs_max(x)
    finally:
        numba.set_num_threads(old)
    want = np.abs(x).max(axis=0) if n else np.zeros(4)
    np.testing.assert_array_equal(got, want)

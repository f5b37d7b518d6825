"""The boosting fast path ``build_gh_histogram`` against the NumPy reference."""
import numba
import numpy as np
import pytest

from histogram.cpu_kernels import build_gh_histogram
from histogram.reference import build_histograms_numpy


def _reference(binned, channels, rows, start, stop, n_bins):
    idx = np.arange(start, stop, dtype=np.int32) if rows is None else rows[start:stop]
    return build_histograms_numpy(binned, channels, idx, np.array([0, len(idx)]), n_bins)[0]


@pytest.mark.parametrize("n_threads", [1, 2, 3])
@pytest.mark.parametrize("n_features", [1, 4, 7, 9])
@pytest.mark.parametrize("subset", [False, True])
def test_gh_histogram_matches_reference(rng, n_threads, n_features, subset):
    n, n_bins = 3001, 256
    binned = rng.integers(0, n_bins, size=(n_features, n)).astype(np.uint8)
    channels = rng.normal(size=(n, 2))
    if subset:
        rows = rng.permutation(n).astype(np.int32)
        start, stop = 113, 2170
    else:
        rows, start, stop = None, 17, 2999
    out = np.full((n_features, n_bins, 2), np.nan)  # stale contents must be overwritten
    buf = np.empty(2 * n)
    threads = min(n_threads, numba.config.NUMBA_NUM_THREADS)
    got = build_gh_histogram(binned, channels, rows, start, stop, out, buf, n_threads=threads)
    assert got is out
    ref = _reference(binned, channels, rows, start, stop, n_bins)
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)
    # Bin sums are the node's channel totals (independent of the binning).
    idx = np.arange(start, stop) if rows is None else rows[start:stop]
    np.testing.assert_allclose(got.sum(axis=1), np.broadcast_to(channels[idx].sum(axis=0), (n_features, 2)),
                               rtol=1e-9)


def test_gh_histogram_empty_node_and_small_bins(rng):
    binned = rng.integers(0, 8, size=(5, 100)).astype(np.uint8)
    channels = rng.normal(size=(100, 2))
    rows = np.arange(100, dtype=np.int32)
    out = np.ones((5, 8, 2))
    build_gh_histogram(binned, channels, rows, 40, 40, out, np.empty(0))
    assert not out.any()
    build_gh_histogram(binned, channels, rows, 0, 100, out, np.empty(200))
    np.testing.assert_allclose(out, _reference(binned, channels, rows, 0, 100, 8), rtol=1e-12, atol=1e-12)


def test_gh_histogram_rejects_bad_shapes(rng):
    binned = np.zeros((3, 10), np.uint8)
    with pytest.raises(ValueError, match="2 channels"):
        build_gh_histogram(binned, np.zeros((10, 3)), None, 0, 10, np.zeros((3, 4, 2)), np.empty(0))
    with pytest.raises(ValueError, match="buf holds"):
        build_gh_histogram(binned, np.zeros((10, 2)), np.arange(10, dtype=np.int32), 0, 10, np.zeros((3, 4, 2)),
                           np.empty(4))


@pytest.mark.parametrize("n_threads", [1, 2])
@pytest.mark.parametrize("n", [4, 7, 1001, 1200])
@pytest.mark.parametrize("n_features", [1, 5, 8])
def test_gh_histogram_packed_codes_match_reference(rng, n_threads, n, n_features):
    from histogram.cpu_kernels import pack_codes

    n_bins = 256
    binned = rng.integers(0, n_bins, size=(n_features, n)).astype(np.uint8)
    channels = rng.normal(size=(n, 2))
    packed = pack_codes(binned)
    assert packed.shape == (n_features, (n + 3) // 4)
    threads = min(n_threads, numba.config.NUMBA_NUM_THREADS)
    # Ranges starting and ending on and off word boundaries, inside one word, and empty.
    for start, stop in [(0, n), (1, n - 1), (3, min(n, 6)), (n // 2, n // 2), (2, 3)]:
        if stop < start:
            continue
        out = np.full((n_features, n_bins, 2), np.nan)
        build_gh_histogram(binned, channels, None, start, stop, out, np.empty(0), n_threads=threads, packed=packed)
        plain = build_gh_histogram(binned, channels, None, start, stop, np.empty_like(out), np.empty(0),
                                   n_threads=threads)
        ref = _reference(binned, channels, None, start, stop, n_bins)
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)
        # Same rows in the same order: identical to the byte kernel, bit for bit.
        np.testing.assert_array_equal(out, plain)


def test_gh_histogram_rejects_wrong_packing(rng):
    binned = np.zeros((3, 10), np.uint8)
    with pytest.raises(ValueError, match="packed must be"):
        build_gh_histogram(binned, np.zeros((10, 2)), None, 0, 10, np.zeros((3, 4, 2)), np.empty(0),
                           packed=np.zeros((3, 2), np.uint32))


@pytest.mark.parametrize("n_threads", [2, 3])
@pytest.mark.parametrize("mode", ["subset", "root", "root_packed"])
def test_gh_histogram_row_split_matches_reference(rng, n_threads, mode):
    """split="rows": per-thread partial histograms added into out, against the reference,
    on nodes with more and with fewer rows than parts, and with stale scratch."""
    from histogram.cpu_kernels import pack_codes

    n, n_bins, n_features = 2003, 256, 6
    binned = rng.integers(0, n_bins, size=(n_features, n)).astype(np.uint8)
    channels = rng.normal(size=(n, 2))
    rows = rng.permutation(n).astype(np.int32) if mode == "subset" else None
    packed = pack_codes(binned) if mode == "root_packed" else None
    partial = np.full((n_threads - 1, n_features, n_bins, 2), np.nan)
    for start, stop in [(0, n), (113, 1999), (5, 6), (9, 9)]:
        out = np.full((n_features, n_bins, 2), np.nan)
        build_gh_histogram(binned, channels, rows, start, stop, out, np.empty(2 * n), n_threads=n_threads,
                           packed=packed, split="rows", partial=partial if start else None)
        ref = _reference(binned, channels, rows, start, stop, n_bins)
        np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12)


def test_gh_histogram_row_split_rejects_bad_scratch(rng):
    binned = np.zeros((3, 10), np.uint8)
    with pytest.raises(ValueError, match="partial must be"):
        build_gh_histogram(binned, np.zeros((10, 2)), None, 0, 10, np.zeros((3, 4, 2)), np.empty(0), n_threads=2,
                           split="rows", partial=np.zeros((1, 3, 5, 2)))
    with pytest.raises(ValueError, match="split must be"):
        build_gh_histogram(binned, np.zeros((10, 2)), None, 0, 10, np.zeros((3, 4, 2)), np.empty(0), split="bins")


def test_pair_add_is_bitwise_complex_add(rng):
    """The vector (g, h) update equals ``h[i] += v`` bit for bit, repeated bins included."""
    from numba import njit

    from histogram.cpu_kernels import _pair_add

    @njit
    def vec(h, idx, vals):
        for k in range(idx.shape[0]):
            _pair_add(h, idx[k], vals[k])

    @njit
    def plain(h, idx, vals):
        for k in range(idx.shape[0]):
            h[idx[k]] += vals[k]

    idx = rng.integers(0, 7, size=5000).astype(np.uint8)
    vals = (rng.normal(size=5000) * 10.0 ** rng.integers(-8, 8, 5000)
            + 1j * rng.normal(size=5000) * 10.0 ** rng.integers(-8, 8, 5000))
    a = np.zeros(7, np.complex128)
    b = np.zeros(7, np.complex128)
    vec(a, idx, vals)
    plain(b, idx, vals)
    np.testing.assert_array_equal(a.view(np.float64), b.view(np.float64))
    assert np.abs(a).min() > 0


@pytest.mark.parametrize("n_threads", [1, 2])
def test_gh_histogram_sparse_rows_prefetch_path(rng, n_threads):
    """Thinly spread sorted rows take the prefetching loop (checked via the density
    rule); results equal the reference, for node sizes around the prefetch distance."""
    from histogram.cpu_kernels import PREFETCH_ROWS, SPARSE_SPAN

    n, n_bins, n_features = 40000, 256, 9
    binned = rng.integers(0, n_bins, size=(n_features, n)).astype(np.uint8)
    channels = rng.normal(size=(n, 2))
    for m in (PREFETCH_ROWS + 1, 2 * PREFETCH_ROWS + 3, 600):
        sub = np.sort(rng.choice(n, m, replace=False)).astype(np.int32)
        rows = np.concatenate([np.arange(5, dtype=np.int32), sub])  # node = rows[5:]
        assert m * SPARSE_SPAN < int(sub[-1] - sub[0])  # the prefetch path is taken
        out = np.full((n_features, n_bins, 2), np.nan)
        build_gh_histogram(binned, channels, rows, 5, 5 + m, out, np.empty(2 * len(rows)), n_threads=n_threads,
                           split="rows")
        np.testing.assert_allclose(out, _reference(binned, channels, rows, 5, 5 + m, n_bins), rtol=1e-12,
                                   atol=1e-12)

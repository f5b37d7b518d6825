"""forest.engine.partition kernels against their NumPy references, every code path forced."""
import numba
import numpy as np
import pytest

from forest.engine import partition as P


@pytest.mark.parametrize("path", ["serial", "one_segment_parallel", "segments_parallel"])
def test_partition_paths_match_reference(rng, monkeypatch, path):
    n, missing_bin = 5000, 8
    codes = rng.integers(0, missing_bin + 1, size=(3, n)).astype(np.uint8)  # includes the missing code
    rows = rng.permutation(n).astype(np.int32)
    if path == "one_segment_parallel":
        starts, stops = np.array([100]), np.array([4900])
        monkeypatch.setattr(P, "_PARALLEL_MIN_ROWS", 1)
        monkeypatch.setattr(P, "_PARALLEL_ONE_SEGMENT_MIN_ROWS", 1)
    else:
        starts, stops = np.array([0, 50, 1700]), np.array([50, 1600, 5000])
        if path == "segments_parallel":
            monkeypatch.setattr(P, "_PARALLEL_MIN_ROWS", 1)
    s = len(starts)
    feats = rng.integers(0, 3, size=s)
    thr = rng.integers(0, missing_bin, size=s)
    ml = rng.integers(0, 2, size=s).astype(np.uint8)
    ref_rows, ref_left = P.partition_rows_reference(rows, starts, stops, codes, feats, thr, ml, missing_bin)
    got = rows.copy()
    with_threads = min(2, numba.config.NUMBA_NUM_THREADS)
    old = numba.get_num_threads()
    numba.set_num_threads(with_threads)
    try:
        n_left = P.partition_rows(got, np.empty_like(got), starts, stops, codes, feats, thr, ml, missing_bin)
    finally:
        numba.set_num_threads(old)
    np.testing.assert_array_equal(n_left, ref_left)
    np.testing.assert_array_equal(got, ref_rows)
    assert 0 < ref_left.sum() < (stops - starts).sum()  # both sides non-empty: the test can fail


def test_partition_missing_rows_follow_missing_left(rng):
    codes = np.array([[8, 0, 8, 5, 8]], dtype=np.uint8)
    for ml in (1, 0):
        rows = np.arange(5, dtype=np.int32)
        n_left = P.partition_rows(rows, np.empty(5, np.int32), np.array([0]), np.array([5]), codes,
                                  np.array([0]), np.array([2]), np.array([ml], np.uint8), 8)
        if ml:
            np.testing.assert_array_equal(rows, [0, 1, 2, 4, 3])  # 8,0,8,8 left (stable), 5 right
            assert n_left[0] == 4
        else:
            np.testing.assert_array_equal(rows, [1, 0, 2, 3, 4])  # only code 0 left
            assert n_left[0] == 1


@pytest.mark.parametrize("parallel", [False, True])
def test_partition_segment_matches_reference(rng, parallel):
    n, missing_bin = 4000, 8
    codes = rng.integers(0, missing_bin + 1, size=(3, n)).astype(np.uint8)
    rows = rng.permutation(n).astype(np.int32)
    min_rows = 1 if parallel else None
    old = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        for lo, hi, f, thr, ml in [(0, n, 1, 3, True), (17, 2500, 2, 0, False), (300, 300, 0, 4, True)]:
            ref_rows, ref_left = P.partition_rows_reference(rows, [lo], [hi], codes, [f], [thr], [ml], missing_bin)
            got = rows.copy()
            n_left = P.partition_segment(got, np.empty_like(got), lo, hi, codes, f, thr, ml, missing_bin, min_rows)
            assert n_left == ref_left[0]
            np.testing.assert_array_equal(got, ref_rows)
    finally:
        numba.set_num_threads(old)
    with pytest.raises(ValueError, match="outside rows"):
        P.partition_segment(rows, np.empty_like(rows), 10, n + 1, codes, 0, 1, False, missing_bin)


@pytest.mark.parametrize("n_blocks", [1, 2, 3, 8])
def test_partition_blocks_matches_reference(rng, n_blocks):
    """The per-block parallel partition (codes read once) on segments of every size
    class: empty, fewer rows than blocks, blocks that end up all-left or all-right."""
    n, missing_bin = 3001, 8
    codes = rng.integers(0, missing_bin + 1, size=(2, n)).astype(np.uint8)
    codes[1, :1500] = 0  # feature 1: the first half all left at threshold 0
    base = rng.permutation(n).astype(np.int32)
    base[:1500] = np.sort(base[:1500])
    for lo, hi, f, thr, ml in [(0, n, 0, 3, True), (5, 2990, 0, 0, False), (7, 7, 0, 2, True), (10, 12, 1, 4, True),
                               (0, 1500, 1, 0, False), (100, 2900, 1, 0, True)]:
        ref_rows, ref_left = P.partition_rows_reference(base, [lo], [hi], codes, [f], [thr], [ml], missing_bin)
        got = base.copy()
        scratch = np.full(n, -1, dtype=np.int32)
        n_left = P._partition_blocks_parallel(got, scratch, lo, hi, codes, f, thr, int(ml), missing_bin, n_blocks)
        assert n_left == ref_left[0]
        np.testing.assert_array_equal(got, ref_rows)

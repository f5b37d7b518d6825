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
        n_left = P._partition_blocks_parallel(got, scratch, lo, hi, codes, f,
                                               P.numeric_side_table(thr, int(ml), missing_bin), n_blocks)
        assert n_left == ref_left[0]
        np.testing.assert_array_equal(got, ref_rows)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("n_blocks", [1, 2, 3, 8])
def test_categorical_partition_blocks_match_reference(rng, dtype, n_blocks):
    """The per-block parallel partition of a categorical split (side table per code), narrow
    and wide codes, on segments of every size class, against the NumPy reference."""
    from forest.engine.tree import CATEGORICAL_SPLIT, cat_bitset, cat_words

    n, missing_bin = 3001, 300 if dtype == np.uint16 else 40
    codes = rng.integers(0, missing_bin + 1, size=(2, n)).astype(dtype)
    codes[1, :1500] = 0  # feature 1: the first half on one side
    base = rng.permutation(n).astype(np.int32)
    words = cat_words(missing_bin)
    for lo, hi, f, ml, left_set in [(0, n, 0, True, rng.choice(missing_bin, missing_bin // 3, replace=False)),
                                    (5, 2990, 0, False, [0, missing_bin - 1]), (7, 7, 0, True, [1]),
                                    (10, 12, 1, True, [0]), (0, 1500, 1, False, [0]), (100, 2900, 1, True, [5])]:
        bits = cat_bitset(left_set, words)
        ref_rows, ref_left = P.partition_rows_reference(base, [lo], [hi], codes, [f], [CATEGORICAL_SPLIT], [ml],
                                                        missing_bin, bits[None])
        table = P.side_table(bits, ml, missing_bin)
        np.testing.assert_array_equal(table, P.side_table_reference(bits, ml, missing_bin))
        got = base.copy()
        scratch = np.full(n, -1, dtype=np.int32)
        n_left = P._partition_blocks_parallel(got, scratch, lo, hi, codes, f, table, n_blocks)
        assert n_left == ref_left[0]
        np.testing.assert_array_equal(got, ref_rows)
        got = base.copy()  # and through partition_segment's block branch
        n_left = P.partition_segment(got, np.empty_like(got), lo, hi, codes, f, CATEGORICAL_SPLIT, ml, missing_bin,
                                     parallel_min_rows=1, cat_bits=bits)
        assert n_left == ref_left[0]
        np.testing.assert_array_equal(got, ref_rows)


@pytest.mark.parametrize("parallel", [False, True])
def test_add_leaf_values_matches_reference(rng, monkeypatch, parallel):
    """Both paths of add_leaf_values: each row of a leaf segment gains that leaf's value."""
    monkeypatch.setattr(P, "_PARALLEL_LEAF_VALUES_MIN_ROWS", 1 if parallel else 1 << 62)
    old = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        n, k = 4000, 2
        rows = rng.permutation(n).astype(np.int32)
        cuts = np.sort(rng.choice(np.arange(1, n), 9, replace=False))
        starts, stops = np.r_[0, cuts], np.r_[cuts, n]
        starts[3] = stops[3] = cuts[2]  # an empty leaf segment
        values = rng.normal(size=(len(starts), k))
        raw = rng.normal(size=(n, k))
        want = raw.copy()
        for s in range(len(starts)):
            want[rows[starts[s]:stops[s]]] += values[s]
        P.add_leaf_values(raw, rows, starts, stops, values)
        np.testing.assert_array_equal(raw, want)
    finally:
        numba.set_num_threads(old)


def test_numeric_side_table_is_the_threshold_rule():
    from forest.engine.routing import goes_left_codes

    for missing_bin in (8, 255, 1000):
        codes = np.arange(missing_bin + 1)
        for thr in (0, missing_bin // 2, missing_bin - 1):
            for ml in (0, 1):
                np.testing.assert_array_equal(P.numeric_side_table(thr, ml, missing_bin),
                                              goes_left_codes(codes, thr, ml, missing_bin).astype(np.uint8))

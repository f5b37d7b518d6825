"""Fast histogram kernels against the NumPy reference, plus subtraction and input checks."""
import numpy as np
import pytest

from histogram.cpu_kernels import build_histograms_numba, plan_tasks
from histogram.kernels import build_histograms, subtract_histograms
from histogram.reference import build_histograms_numpy


def _problem(rng, n_rows, n_features, n_channels, node_sizes, n_bins=256, sort=False):
    """Random binned matrix, channels, and rows grouped into nodes (unsorted by default)."""
    binned = rng.integers(0, n_bins, size=(n_features, n_rows)).astype(np.uint8)
    channels = rng.normal(size=(n_rows, n_channels))
    m = int(sum(node_sizes))
    rows = rng.choice(n_rows, size=m, replace=m > n_rows).astype(np.int32)
    node_starts = np.concatenate(([0], np.cumsum(node_sizes))).astype(np.int64)
    if sort:
        for i in range(len(node_sizes)):
            rows[node_starts[i]:node_starts[i + 1]].sort()
    return binned, channels, rows, node_starts


def assert_hist_close(got, binned, channels, rows, node_starts, n_bins):
    """|got - exact| <= 1e-9 * (sum of |channel| in the same cell): a relative bound on
    the summation error that stays meaningful when a cell's sum is near zero."""
    ref = build_histograms_numpy(binned, channels, rows, node_starts, n_bins)
    scale = build_histograms_numpy(binned, np.abs(channels), rows, node_starts, n_bins)
    assert got.shape == ref.shape
    bad = np.abs(got - ref) > 1e-9 * scale + 1e-300
    assert not bad.any(), f"{bad.sum()} cells differ, max |diff| {np.abs(got - ref).max()}"


NODE_LAYOUTS = {
    "one_node": [1001],
    "three_odd_with_empty": [0, 517, 3],
    "thirty_two": list(np.random.default_rng(3).integers(0, 90, size=32)),
}


@pytest.mark.parametrize("n_channels", [1, 2, 6, 14])
@pytest.mark.parametrize("layout", sorted(NODE_LAYOUTS))
def test_numba_matches_reference(rng, n_channels, layout):
    sizes = NODE_LAYOUTS[layout]
    binned, channels, rows, node_starts = _problem(rng, 1237, 7, n_channels, sizes)
    got = build_histograms(binned, channels, rows, node_starts, 256, backend="numba")
    assert_hist_close(got, binned, channels, rows, node_starts, 256)
    # The row sums are the channel totals of each node (a check independent of bins).
    for i in range(len(sizes)):
        idx = rows[node_starts[i]:node_starts[i + 1]]
        np.testing.assert_allclose(got[i].sum(axis=1),
                                   np.broadcast_to(channels[idx].sum(axis=0), (7, n_channels)),
                                   rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("n_channels", [1, 2, 6, 14])
@pytest.mark.parametrize("n_threads", [1, 2, 3])
def test_row_split_path_matches_reference(rng, n_channels, n_threads):
    """Force the row-split (private partial histograms + reduction) path."""
    sizes = [9000, 17, 0, 12000]
    binned, channels, rows, node_starts = _problem(rng, 15001, 5, n_channels, sizes, n_bins=64)
    out = np.full((4, 5, 64, n_channels), np.nan)
    build_histograms_numba(binned, channels, rows, node_starts, 64, out,
                           n_threads=n_threads, big_rows=5000)
    assert_hist_close(out, binned, channels, rows, node_starts, 64)


@pytest.mark.parametrize("n_channels", [2, 6])
def test_identity_rows_fast_path(rng, n_channels):
    binned, channels, _, _ = _problem(rng, 20011, 6, n_channels, [1])
    node_starts = np.array([0, 20011])
    got = build_histograms(binned, channels, None, node_starts, 256, backend="numba")
    assert_hist_close(got, binned, channels, np.arange(20011, dtype=np.int32), node_starts, 256)
    split = np.empty_like(got)
    build_histograms_numba(binned, channels, np.zeros(0, np.int32), node_starts, 256, split,
                           identity=True, n_threads=2, big_rows=1000)
    assert_hist_close(split, binned, channels, np.arange(20011, dtype=np.int32), node_starts, 256)
    # identity over several contiguous nodes: node i owns positions node_starts[i]:[i+1]
    ns = np.array([0, 5, 5, 10000, 20011])
    got = build_histograms(binned, channels, None, ns, 256, backend="numba")
    assert_hist_close(got, binned, channels, np.arange(20011, dtype=np.int32), ns, 256)


def test_sorted_and_duplicate_rows_and_subset(rng):
    # A node may list a row more than once (bootstrap), rows of sorted order, and nodes
    # may cover only a subset of the rows.
    binned, channels, rows, node_starts = _problem(rng, 300, 4, 3, [400, 250], sort=True)
    got = build_histograms(binned, channels, rows, node_starts, 256)
    assert_hist_close(got, binned, channels, rows, node_starts, 256)


def test_numpy_backend_and_out_buffer(rng):
    binned, channels, rows, node_starts = _problem(rng, 500, 3, 2, [100, 200])
    out = np.full((2, 3, 256, 2), 7.0)
    got = build_histograms(binned, channels, rows, node_starts, 256, backend="numba", out=out)
    assert got is out
    assert_hist_close(out, binned, channels, rows, node_starts, 256)
    out2 = np.full((2, 3, 256, 2), 7.0)
    build_histograms(binned, channels, rows, node_starts, 256, backend="numpy", out=out2)
    assert_hist_close(out2, binned, channels, rows, node_starts, 256)


def test_smaller_bin_axis(rng):
    binned, channels, rows, node_starts = _problem(rng, 800, 4, 2, [300, 301], n_bins=17)
    got = build_histograms(binned, channels, rows, node_starts, 17)
    assert got.shape == (2, 4, 17, 2)
    assert_hist_close(got, binned, channels, rows, node_starts, 17)


def test_zero_nodes_and_all_empty(rng):
    binned, channels, _, _ = _problem(rng, 50, 3, 2, [1])
    rows = np.zeros(0, np.int32)
    assert build_histograms(binned, channels, rows, np.array([0]), 256).shape == (0, 3, 256, 2)
    got = build_histograms(binned, channels, rows, np.array([0, 0, 0]), 256)
    assert got.shape == (2, 3, 256, 2) and not got.any()


def test_subtraction_gives_sibling(rng):
    binned, channels, rows, node_starts = _problem(rng, 2000, 5, 6, [700, 1300])
    parent = build_histograms(binned, channels, rows, np.array([0, 2000]), 256)
    kids = build_histograms(binned, channels, rows, node_starts, 256)
    sibling = subtract_histograms(parent[0], kids[0])
    scale = build_histograms_numpy(binned, np.abs(channels), rows, np.array([0, 2000]), 256)[0]
    assert np.all(np.abs(sibling - kids[1]) <= 1e-9 * scale + 1e-300)
    buf = parent[0].copy()
    assert subtract_histograms(buf, kids[0], out=buf) is buf
    np.testing.assert_array_equal(buf, sibling)
    with pytest.raises(ValueError, match="shapes differ"):
        subtract_histograms(parent, kids)


def test_plan_tasks_covers_each_slab_once_and_balances():
    sizes = np.array([5000, 0, 3, 800, 800, 12000, 1])
    node_starts = np.concatenate(([0], np.cumsum(sizes)))
    F = 9
    tn, f0, f1, chunks, big = plan_tasks(node_starts, F, 3, big_rows=10000)
    assert big.tolist() == [5]
    seen = np.zeros((len(sizes), F), int)
    for n, a, b in zip(tn, f0, f1):
        seen[n, a:b] += 1
    expected = np.ones((len(sizes), F), int)
    expected[5] = 0
    np.testing.assert_array_equal(seen, expected)
    assert chunks[0] == 0 and chunks[-1] == len(tn) and np.all(np.diff(chunks) > 0)
    work = [sum((sizes[tn[t]] + 64) * (f1[t] - f0[t]) for t in range(chunks[c], chunks[c + 1]))
            for c in range(len(chunks) - 1)]
    assert max(work) <= 1.1 * sum(work) / len(work) + 5064  # within one unit of even


@pytest.mark.parametrize("bad, match", [
    (dict(binned=np.zeros((2, 5), np.int8)), "uint8"),
    (dict(channels=np.zeros((5, 2), np.float32)), "float64"),
    (dict(channels=np.zeros((4, 2))), "rows but binned"),
    (dict(rows=np.array([0, 5], np.int32)), r"rows must lie"),
    (dict(node_starts=np.array([0, 3, 2])), "non-decreasing"),
    (dict(node_starts=np.array([0, 3])), "non-decreasing"),
    (dict(n_bins=3), "code"),
    (dict(n_bins=300), "n_bins"),
    (dict(backend="gpu"), "backend"),
])
def test_bad_input_raises(bad, match):
    args = dict(binned=np.full((2, 5), 3, np.uint8), channels=np.zeros((5, 2)),
                rows=np.array([0, 4], np.int32), node_starts=np.array([0, 2]), n_bins=256)
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        build_histograms(**args)


@pytest.mark.parametrize("n_threads", [1, 2])
def test_identity_two_channels_packed_path(rng, n_threads):
    """Contiguous nodes, two channels, n % 4 == 0: build_histograms_numba takes the
    packed (four codes per load) root kernel; it must agree with the reference, on
    node bounds on and off word boundaries and an empty node."""
    from histogram.cpu_kernels import pack_codes

    binned, channels, _, _ = _problem(rng, 20012, 6, 2, [1])
    assert np.shares_memory(pack_codes(binned), binned)  # the path's precondition
    for ns in (np.array([0, 20012]), np.array([0, 5, 5, 10001, 20012])):
        got = np.full((len(ns) - 1, 6, 256, 2), np.nan)
        build_histograms_numba(binned, channels, np.zeros(0, np.int32), ns, 256, got, identity=True,
                               n_threads=n_threads)
        assert_hist_close(got, binned, channels, np.arange(20012, dtype=np.int32), ns, 256)

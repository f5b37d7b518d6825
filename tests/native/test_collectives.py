"""Correctness of every collective under real ranks (and on one rank).

Each rank's input is a deterministic function of (rank, case), so every rank can
compute the exact reference (``numpy.sum`` over all ranks' inputs) locally, with no
communication that could share a bug with the code under test. Results are also
compared with the MPI library's own Allreduce (``algorithm="mpi"``), and at the end
of each test the ranks exchange checksums of every result to prove they hold
bitwise-identical bytes. All collectives run first; assertions come after, so a
failure on one rank cannot strand the others.
"""
import hashlib

import numpy as np
import pytest

from native import collectives as col
from native_reference import split_range


pytestmark = pytest.mark.mpi

FLOAT_RTOL = {np.dtype(np.float64): 1e-12, np.dtype(np.float32): 1e-5}


def lengths(p):
    """0, 1, fewer than p, odd, and large (~100k, odd)."""
    return sorted({0, 1, max(p - 1, 0), p + 1, 7, 100_003})


def contribution(rank, shape, dtype, case=0):
    """Rank ``rank``'s input for one case: wide-range values, ints within int64."""
    n = int(np.prod(shape, dtype=np.int64))
    rng = np.random.default_rng([case, rank, n, np.dtype(dtype).num])
    dtype = np.dtype(dtype)
    if dtype.kind == "i":
        bound = 2**40 if dtype.itemsize == 8 else 2**20
        x = rng.integers(-bound, bound, n)
    else:
        x = rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)
    return x.astype(dtype).reshape(shape)


def reference_sum(p, shape, dtype, case=0):
    """Exact-as-possible sum over ranks and the sum of magnitudes (float error scale)."""
    parts = np.stack([contribution(r, shape, dtype, case) for r in range(p)])
    if np.dtype(dtype).kind == "i":
        return parts.sum(axis=0, dtype=dtype), None
    wide = parts.astype(np.longdouble)
    return wide.sum(axis=0), np.abs(wide).sum(axis=0)


def mismatch(result, ref, scale, dtype):
    """Empty string if ``result`` equals the reference (exact ints, 1e-12 floats)."""
    if result.shape != ref.shape or result.dtype != np.dtype(dtype):
        return f"shape/dtype {result.shape}/{result.dtype} vs {ref.shape}/{dtype}"
    if scale is None:
        bad = np.flatnonzero(result != ref)
    else:
        tol = FLOAT_RTOL[np.dtype(dtype)] * scale
        bad = np.flatnonzero(np.abs(result.astype(np.longdouble) - ref) > tol)
    return "" if bad.size == 0 else f"{bad.size} wrong elements, first at {bad[0]}"


def digest(arr):
    """64-bit checksum of an array's bytes (as int64)."""
    h = hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=8).digest()
    return int(np.frombuffer(h, dtype=np.int64)[0])


def same_on_all_ranks(comm, digests):
    """Row per rank of checksums; True where every rank's checksum agrees."""
    table = col.allgather(comm, np.array(digests, dtype=np.int64)[None, :],
                          algorithm="ring")
    return (table == table[0]).all(axis=0)


@pytest.mark.parametrize("dtype", [np.float64, np.int64, np.float32])
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "doubling", "auto", "mpi"])
def test_allreduce_matches_numpy_sum(comm, algorithm, dtype):
    p, r = comm.size, comm.rank
    failures, digests = [], []
    for n in lengths(p):
        for inplace in (False, True):
            x = contribution(r, (n,), dtype)
            keep = x.copy()
            y = col.allreduce(comm, x, algorithm=algorithm, out=x if inplace else None)
            ref, scale = reference_sum(p, (n,), dtype)
            msg = mismatch(y, ref, scale, dtype)
            if inplace and y is not x:
                msg += " in-place call did not return out"
            if not inplace and not np.array_equal(x, keep):
                msg += " out-of-place call modified its input"
            if msg:
                failures.append(f"n={n} inplace={inplace}: {msg}")
            digests.append(digest(y))
    identical = same_on_all_ranks(comm, digests)
    assert not failures, f"rank {r}: {failures}"
    assert identical.all(), f"results differ between ranks in cases {np.flatnonzero(~identical)}"


@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "doubling"])
def test_allreduce_agrees_with_mpi_allreduce_on_nd_arrays(comm, algorithm):
    shape = (3, 5, 7)
    x = contribution(comm.rank, shape, np.float64, case=1)
    ours = col.allreduce(comm, x, algorithm=algorithm)
    theirs = col.allreduce(comm, x, algorithm="mpi")
    ints = col.allreduce(comm, (x * 1e6).astype(np.int64), algorithm=algorithm)
    ints_mpi = col.allreduce(comm, (x * 1e6).astype(np.int64), algorithm="mpi")
    scale = col.allreduce(comm, np.abs(x), algorithm="mpi")
    assert ours.shape == shape
    np.testing.assert_array_less(np.abs(ours - theirs), 1e-12 * scale + 1e-300)
    np.testing.assert_array_equal(ints, ints_mpi)


@pytest.mark.parametrize("algorithm", ["ring", "halving", "auto"])
@pytest.mark.parametrize("dtype", [np.float64, np.int64])
def test_reduce_scatter_returns_my_block_of_the_sum(comm, algorithm, dtype):
    p, r = comm.size, comm.rank
    failures, digests = [], []
    for shape in [(n,) for n in lengths(p)] + [(0, 3), (p - 1, 2), (7, 3), (5003, 4)]:
        x = contribution(r, shape, dtype, case=2)
        block, (start, stop) = col.reduce_scatter(comm, x, algorithm=algorithm)
        ref, scale = reference_sum(p, shape, dtype, case=2)
        expect = split_range(shape[0], p, r)
        msg = ""
        if (start, stop) != (expect.start, expect.stop):
            msg = f"block {(start, stop)} != {expect}"
        msg += mismatch(block, ref[start:stop], None if scale is None else scale[start:stop],
                        dtype)
        if msg:
            failures.append(f"shape={shape}: {msg}")
        digests.append(digest(block))
    # Each rank owns a different block: check the blocks tile the whole sum instead.
    table = col.allgather(comm, np.array(digests, dtype=np.int64)[None, :], algorithm="ring")
    assert not failures, f"rank {r}: {failures}"
    assert table.shape == (p, len(digests))


@pytest.mark.parametrize("algorithm", ["ring", "halving"])
def test_reduce_scatter_along_another_axis(comm, algorithm):
    p, r = comm.size, comm.rank
    shape = (3, 2 * p + 1, 4, 2)  # (node, feature, bin, channel): feature blocks
    x = contribution(r, shape, np.int64, case=8)
    block, (start, stop) = col.reduce_scatter(comm, x, algorithm=algorithm, axis=1)
    last, (s2, e2) = col.reduce_scatter(comm, x, algorithm=algorithm, axis=-1)
    ref, _ = reference_sum(p, shape, np.int64, case=8)
    expect = split_range(shape[1], p, r)
    assert (start, stop) == (expect.start, expect.stop)
    assert block.flags.c_contiguous
    np.testing.assert_array_equal(block, ref[:, start:stop])
    np.testing.assert_array_equal(last, ref[..., s2:e2])
    with pytest.raises(ValueError, match="axis"):
        col.reduce_scatter(comm, x, axis=4)


@pytest.mark.parametrize("algorithm", ["ring", "bruck", "auto"])
@pytest.mark.parametrize("dtype", [np.int64, np.float32, "<U3", np.bool_])
def test_allgather_concatenates_in_rank_order(comm, algorithm, dtype):
    p, r = comm.size, comm.rank
    results = []
    for m in (0, 1, 3, 257):
        block = contribution(r, (m, 2), np.int64, case=3).astype(dtype)
        results.append((m, col.allgather(comm, block, algorithm=algorithm)))
    scalar = col.allgather(comm, np.float64(r), algorithm=algorithm)
    for m, got in results:
        want = np.concatenate([contribution(q, (m, 2), np.int64, case=3).astype(dtype)
                               for q in range(p)])
        assert got.dtype == want.dtype and got.shape == (p * m, 2)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(scalar, np.arange(p, dtype=np.float64))


def test_allgatherv_variable_lengths(comm):
    p, r = comm.size, comm.rank
    got = col.allgatherv(comm, contribution(r, (r, 2, 3), np.int64, case=4).astype(np.int16))
    got_f = col.allgatherv(comm, np.full(2 * r + 1, r, dtype=np.float64))
    empty = col.allgatherv(comm, np.zeros((0, 4)))
    want = np.concatenate([contribution(q, (q, 2, 3), np.int64, case=4).astype(np.int16)
                           for q in range(p)])
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int16 and got.shape == (p * (p - 1) // 2, 2, 3)
    np.testing.assert_array_equal(got_f, np.repeat(np.arange(p), 2 * np.arange(p) + 1))
    assert empty.shape == (0, 4)


def test_allgatherv_rejects_different_trailing_shapes(comm):
    if comm.size == 1:
        pytest.skip("needs two ranks to disagree")
    trailing = 3 if comm.rank == 1 else 2
    with pytest.raises(ValueError, match="trailing shape or dtype"):
        col.allgatherv(comm, np.zeros((2, trailing)), check=False)


def _a2a_block(src, dst):
    """What rank ``src`` sends rank ``dst``: (src + dst) % 3 rows of dst + 1 int32 columns."""
    rows = (src + dst) % 3
    return (1000 * src + 10 * dst + np.arange(rows * (dst + 1))).astype(np.int32).reshape(rows, dst + 1)


def test_alltoallv_blocks_reach_their_rank(comm):
    """Varying rows (0 included) and per-destination widths; output in source order."""
    p, r = comm.size, comm.rank
    from native.stats import STATS
    sent0 = STATS.bytes_sent
    got = col.alltoallv(comm, [_a2a_block(r, q) for q in range(p)])
    sent = STATS.bytes_sent - sent0
    big = col.alltoallv(comm, [np.full((50_001 if q != r else 3, 2), r + 0.5) for q in range(p)])
    want = np.concatenate([_a2a_block(s, r) for s in range(p)])
    np.testing.assert_array_equal(got, want)
    assert got.dtype == np.int32 and got.shape == want.shape
    # only other ranks' blocks travel, plus two int64 counts per peer
    assert sent == sum(_a2a_block(r, q).nbytes + 16 for q in range(p) if q != r)
    lengths = [3 if s == r else 50_001 for s in range(p)]
    np.testing.assert_array_equal(big, np.repeat(np.arange(p) + 0.5, lengths)[:, None].repeat(2, 1))


def test_alltoallv_rejects_bad_blocks(comm):
    with pytest.raises(ValueError, match="one per rank"):
        col.alltoallv(comm, [np.zeros(1)] * (comm.size + 1))
    if comm.size > 1:
        with pytest.raises(ValueError, match="mix dtypes"):
            col.alltoallv(comm, [np.zeros(1, np.int64)] + [np.zeros(1)] * (comm.size - 1))


@pytest.mark.parametrize("algorithm", ["binomial", "scatter_allgather", "auto"])
def test_bcast_from_every_root(comm, algorithm):
    p, r = comm.size, comm.rank
    got = []
    for root in sorted({0, p - 1, p // 2}):
        for shape, dtype in [((5, 4), np.float64), ((0,), np.int64), ((33,), np.uint8),
                             ((2, p - 1), np.int32), ((70_001,), np.float64)]:
            data = contribution(root, shape, np.int64, case=5).astype(dtype)
            buf = data.copy() if r == root else np.zeros(shape, dtype)
            got.append((data, col.bcast(comm, buf, root=root, algorithm=algorithm)))
    obj = col.bcast_object(comm, {"rank": r, "a": np.arange(r + 3)} if r == p - 1 else None,
                           root=p - 1)
    for data, out in got:
        np.testing.assert_array_equal(out, data)
    assert obj["rank"] == p - 1
    np.testing.assert_array_equal(obj["a"], np.arange(p + 2))


def test_allgather_object_and_global_row_offset(comm):
    p, r = comm.size, comm.rank
    objs = col.allgather_object(comm, ("rank", r, list(range(r))))
    offset, n_global = col.global_row_offset(comm, 3 * r + 1)
    assert objs == [("rank", q, list(range(q))) for q in range(p)]
    assert offset == sum(3 * q + 1 for q in range(r))
    assert n_global == sum(3 * q + 1 for q in range(p))


def best_records(rank, n=60, k=4):
    """Records with many exact gain ties across ranks, some NaN and -0.0 gains."""
    rng = np.random.default_rng([6, rank])
    rec = np.empty((n, k))
    rec[:, 0] = rng.integers(-2, 3, n).astype(np.float64)
    rec[rng.random(n) < 0.1, 0] = np.nan
    rec[rng.random(n) < 0.1, 0] = -0.0
    rec[rng.random(n) < 0.05, 0] = -np.inf
    rec[:, 1:] = rng.integers(0, 3, (n, k - 1))
    return rec


def slow_best(rows):
    """Reference selection by Python sorting: max gain (NaN as -inf), smallest keys."""
    def key(row):
        g = -np.inf if np.isnan(row[0]) else row[0] + 0.0
        return (-g, *row[1:])
    return min(rows, key=key)


def test_allreduce_best_selects_max_gain_with_deterministic_ties(comm):
    p, r = comm.size, comm.rank
    got = col.allreduce_best(comm, best_records(r))
    near = np.array([[1.0 + r * 1e-14, p - r, 0.0]])
    near_exact = col.allreduce_best(comm, near)
    near_tol = col.allreduce_best(comm, near, rtol=1e-12)
    digests = same_on_all_ranks(comm, [digest(got), digest(near_tol)])
    everyone = [best_records(q) for q in range(p)]
    want = np.array([slow_best([e[i] for e in everyone]) for i in range(len(got))])
    want[np.isnan(want[:, 0]), 0] = -np.inf
    want += 0.0
    assert digests.all()
    np.testing.assert_array_equal(got, want)
    assert not np.signbit(got[got[:, 0] == 0, 0]).any()
    # exact: the largest gain (last rank) wins; with rtol the gains tie and the
    # smallest key (also the last rank: key p - r) wins
    np.testing.assert_array_equal(near_exact, [[1.0 + (p - 1) * 1e-14, 1.0, 0.0]])
    np.testing.assert_array_equal(near_tol, [[1.0 + (p - 1) * 1e-14, 1.0, 0.0]])


def test_allreduce_best_rtol_tie_goes_to_smallest_key(comm):
    p, r = comm.size, comm.rank
    # rank 0 has the smallest key but a gain 1e-14 lower than everyone else
    gain = 1.0 if r == 0 else 1.0 + 1e-14
    exact = col.allreduce_best(comm, [[gain, r, 0.0]])
    tol = col.allreduce_best(comm, [[gain, r, 0.0]], rtol=1e-12)
    if p > 1:
        assert exact[0, 0] == 1.0 + 1e-14 and exact[0, 1] == 1.0
    np.testing.assert_array_equal(tol, [[1.0, 0.0, 0.0]])


def test_allreduce_best_rejects_bad_records(comm):
    with pytest.raises(ValueError, match="shape"):
        col.allreduce_best(comm, np.zeros(3))
    with pytest.raises(ValueError, match="NaN"):
        col.allreduce_best(comm, [[1.0, np.nan]])
    with pytest.raises(ValueError, match="n_keys"):
        col.allreduce_best(comm, [[1.0, 2.0]], n_keys=2)
    # NaN is fine in payload columns
    assert np.isnan(col.allreduce_best(comm, [[1.0, 2.0, np.nan]], n_keys=1)[0, 2])


def test_bytes_sent_reduce_scatter_is_half_of_allreduce(comm):
    p = comm.size
    n = p * 1024
    x = np.ones(n)
    sent = {}
    for name, call in [
        # check=False: check-mode handshakes (if the environment enables them) are
        # real traffic too, but not what this test measures
        ("ring_allreduce", lambda: col.allreduce(comm, x, "ring", check=False)),
        ("ring_reduce_scatter", lambda: col.reduce_scatter(comm, x, "ring", check=False)),
        ("rab_allreduce", lambda: col.allreduce(comm, x, "rabenseifner", check=False)),
        ("halving_reduce_scatter",
         lambda: col.reduce_scatter(comm, x, "halving", check=False)),
    ]:
        col.STATS.reset()
        call()
        sent[name] = col.STATS.bytes_sent
    block = 1024 * 8
    assert sent["ring_allreduce"] == 2 * (p - 1) * block
    assert sent["ring_reduce_scatter"] == (p - 1) * block
    if p & (p - 1) == 0:  # the fold of non-powers of two sends whole buffers
        assert sent["rab_allreduce"] == 2 * (p - 1) * block
        assert sent["halving_reduce_scatter"] == (p - 1) * block


def test_check_mode_passes_matching_calls(comm, monkeypatch):
    monkeypatch.setenv("HISTFOREST_CHECK_COLLECTIVES", "1")
    col.STATS.reset()
    total = col.allreduce(comm, np.ones(10), algorithm="ring")
    best = col.allreduce_best(comm, [[float(comm.rank), 0.0]])
    parts = col.allgatherv(comm, np.arange(comm.rank))
    checked_bytes = col.STATS.bytes_by_op.get("check", 0)
    np.testing.assert_array_equal(total, np.full(10, comm.size))
    assert best[0, 0] == comm.size - 1
    assert parts.size == comm.size * (comm.size - 1) // 2
    assert (checked_bytes > 0) == (comm.size > 1)


def test_bad_arguments_raise_clear_errors(comm):
    with pytest.raises(ValueError, match="algorithm"):
        col.allreduce(comm, np.ones(3), algorithm="tree")
    with pytest.raises(ValueError, match="dtype"):
        col.allreduce(comm, np.ones(3, dtype=np.complex128))
    with pytest.raises(ValueError, match="out"):
        col.allreduce(comm, np.ones(3), out=np.ones(4))
    with pytest.raises(ValueError, match="root"):
        col.bcast(comm, np.ones(3), root=comm.size)
    with pytest.raises(ValueError, match="axis"):
        col.reduce_scatter(comm, np.float64(1.0))


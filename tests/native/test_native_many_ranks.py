"""Every algorithm at rank counts mpirun cannot afford here (p up to 16), on threads.

Covers the folds with 2 and 3 folded pairs (p = 6, 7), 5 extra ranks (p = 13) and
the powers of two 8 and 16, against exact NumPy references, with bitwise equality
across ranks. Ranks are threads behind the same communicator seam (see
``native.threads``), so these are the same algorithm functions mpirun runs.
"""
import numpy as np
import pytest

from native import collectives as col
from native.fusion import fused_allreduce
from native.threads import ThreadWorld
from native_reference import split_range


SIZES = [6, 7, 8, 13, 16]


def data(rank, n, dtype):
    rng = np.random.default_rng([9, rank, n])
    if np.dtype(dtype).kind == "i":
        return rng.integers(-2**40, 2**40, n).astype(dtype)
    return (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, n)).astype(dtype)


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("algorithm", ["ring", "rabenseifner", "doubling"])
def test_allreduce_any_rank_count(p, algorithm):
    lengths = [0, 1, p - 1, p + 3, 1001]

    def body(comm):
        out = []
        for n in lengths:
            out.append(col.allreduce(comm, data(comm.rank, n, np.int64), algorithm=algorithm))
            x = data(comm.rank, n, np.float64)
            out.append(col.allreduce(comm, x, algorithm=algorithm, out=x))
        return out

    results = ThreadWorld(p).run(body)
    k = 0
    for n in lengths:
        ints = sum(data(r, n, np.int64) for r in range(p))
        parts = np.stack([data(r, n, np.float64) for r in range(p)]).astype(np.longdouble)
        np.testing.assert_array_equal(results[0][k], ints)
        err = np.abs(results[0][k + 1] - parts.sum(axis=0))
        assert (err <= 1e-12 * np.abs(parts).sum(axis=0)).all()
        for r in range(1, p):  # bitwise identical on every rank
            assert results[r][k].tobytes() == results[0][k].tobytes()
            assert results[r][k + 1].tobytes() == results[0][k + 1].tobytes()
        k += 2


@pytest.mark.parametrize("p", SIZES)
@pytest.mark.parametrize("algorithm", ["ring", "halving"])
def test_reduce_scatter_any_rank_count(p, algorithm):
    shapes = [(0,), (1,), (p - 1,), (2 * p + 1, 3)]

    def body(comm):
        return [col.reduce_scatter(comm, data(comm.rank, int(np.prod(s)), np.int64)
                                   .reshape(s), algorithm=algorithm) for s in shapes]

    results = ThreadWorld(p).run(body)
    for i, s in enumerate(shapes):
        total = sum(data(r, int(np.prod(s)), np.int64) for r in range(p)).reshape(s)
        for r in range(p):
            block, (start, stop) = results[r][i]
            sl = split_range(s[0], p, r)
            assert (start, stop) == (sl.start, sl.stop)
            np.testing.assert_array_equal(block, total[start:stop])


@pytest.mark.parametrize("p", SIZES)
def test_gathers_broadcasts_and_best_any_rank_count(p):
    def body(comm):
        r = comm.rank
        root = p - 2
        buf = data(root, 9, np.float64) if r == root else np.zeros(9)
        rec = np.array([[float(r % 3), float(p - r), 0.0], [-np.inf, float(r), 1.0]])
        return (col.allgather(comm, np.array([r, -r]), algorithm="bruck"),
                col.allgather(comm, np.array([r, -r]), algorithm="ring"),
                col.allgatherv(comm, np.full((r % 3, 2), r)),
                col.bcast(comm, buf, root=root, algorithm="binomial"),
                col.bcast(comm, buf.copy() if r == root else np.zeros(9), root=root,
                          algorithm="scatter_allgather"),
                col.bcast_object(comm, {"root": r} if r == root else None, root=root),
                col.allgather_object(comm, r * r),
                col.allreduce_best(comm, rec),
                col.global_row_offset(comm, r + 1),
                fused_allreduce(comm, [np.full(3, r), np.full((2, 2), 1.0 * r)],
                                threshold_bytes=16, algorithm="auto"))

    results = ThreadWorld(p).run(body)
    ranks = np.arange(p)
    best_rank = max(ranks, key=lambda r: (r % 3, -(p - r)))  # max gain, then smallest key
    for r, (ag_b, ag_r, agv, bc, bc_sa, bco, ago, best, off, fused) in enumerate(results):
        np.testing.assert_array_equal(ag_b, np.column_stack([ranks, -ranks]).ravel())
        np.testing.assert_array_equal(ag_r, ag_b)
        np.testing.assert_array_equal(agv, np.repeat(ranks, ranks % 3)[:, None] * [1, 1])
        np.testing.assert_array_equal(bc, data(p - 2, 9, np.float64))
        np.testing.assert_array_equal(bc_sa, bc)
        assert bco == {"root": p - 2}
        assert ago == [q * q for q in ranks]
        np.testing.assert_array_equal(best, [[best_rank % 3, p - best_rank, 0.0],
                                             [-np.inf, 0.0, 1.0]])
        assert off == (r * (r + 1) // 2, p * (p + 1) // 2)
        np.testing.assert_array_equal(fused[0], np.full(3, ranks.sum()))
        np.testing.assert_array_equal(fused[1], np.full((2, 2), float(ranks.sum())))


def test_check_mode_mismatch_any_rank_count():
    from native.errors import CollectiveMismatchError

    def body(comm):
        n = 5 if comm.rank == 4 else 4
        try:
            col.allreduce(comm, np.ones(n), algorithm="ring", check=True)
        except CollectiveMismatchError as exc:
            return str(exc)
        return "no error"

    messages = ThreadWorld(7).run(body)
    assert all("n=5" in m and "rank 4" in m for m in messages), messages


def test_check_mode_timeout_on_threads(monkeypatch):
    from native.errors import CollectiveTimeoutError

    monkeypatch.setenv("HISTFOREST_CHECK_TIMEOUT", "0.5")

    def body(comm):
        if comm.rank == 2:
            return "skipped"  # never joins the collective
        try:
            col.allreduce(comm, np.ones(3), check=True)
        except CollectiveTimeoutError as exc:
            return str(exc)
        return "no error"

    out = ThreadWorld(4).run(body)
    assert out[2] == "skipped"
    # every rank that entered gives up with a message naming a rank it waited for
    assert all("has not reached this collective" in m for i, m in enumerate(out) if i != 2), out


@pytest.mark.parametrize("p", [5, 8])
def test_allreduce_best_payload_and_near_ties_identical_on_all_ranks(p):
    # Same keys everywhere; gains within rtol of each other; payload differs (with
    # NaN): the winner must still be one and the same row on every rank.
    def body(comm):
        r = comm.rank
        rec = np.array([[1.0 + r * 1e-15, 2.0, 0.0, np.nan if r % 2 else float(r)],
                        [-np.inf, 5.0, 1.0, float(-r)]])
        return col.allreduce_best(comm, rec, rtol=1e-12, n_keys=2)

    out = ThreadWorld(p).run(body)
    for r in range(1, p):
        assert out[r].tobytes() == out[0].tobytes()
    assert out[0][0, 1] == 2.0 and out[0][1, 0] == -np.inf


def test_thread_world_reports_the_failing_rank():
    def body(comm):
        if comm.rank == 1:
            raise KeyError("boom")
        return col.allreduce(comm, np.ones(2), algorithm="ring")

    with pytest.raises(RuntimeError, match="rank 1 of 3 failed: KeyError"):
        ThreadWorld(3, timeout=1.0).run(body)


@pytest.mark.parametrize("p", [5, 7, 16])
def test_alltoallv_any_rank_count(p):
    """Pairwise alltoallv: rank s sends rank q (s * q) % 4 rows of q % 3 + 1 columns."""
    def block(s, q):
        rows = (s * q) % 4
        return np.arange(rows * (q % 3 + 1), dtype=np.float64).reshape(rows, q % 3 + 1) + 100 * s + q

    results = ThreadWorld(p).run(lambda comm: col.alltoallv(comm, [block(comm.rank, q) for q in range(p)]))
    for q in range(p):
        np.testing.assert_array_equal(results[q], np.concatenate([block(s, q) for s in range(p)]))


NODE_LAYOUTS = {
    "blocks of 4": lambda p: [r // 4 for r in range(p)],
    "blocks of 3": lambda p: [r // 3 for r in range(p)],
    "round robin 3": lambda p: [r % 3 for r in range(p)],
    "one per node": lambda p: list(range(p)),
    "uneven": lambda p: [0] * (p // 2 + 1) + [1] * (p - p // 2 - 1),
}


@pytest.mark.parametrize("p", [6, 7, 12, 16, 24])
@pytest.mark.parametrize("layout", sorted(NODE_LAYOUTS))
def test_canonical_algorithms_agree_bitwise_on_node_layouts(p, layout):
    from native_reference import canonical_sum
    from native.topology import Topology

    node_of = NODE_LAYOUTS[layout](p)
    topo = Topology(node_of, 0)
    algs = ["direct", "hierarchical", "auto"] + (["doubling", "rabenseifner"] if topo.flat_is_canonical else [])
    rs_algs = ["direct", "hierarchical", "auto"] + (["halving"] if topo.flat_is_canonical else [])
    n = 2 * p + 5

    def body(comm):
        out = [col.allreduce(comm, data(comm.rank, n, np.float64), algorithm=a) for a in algs]
        out += [col.reduce_scatter(comm, data(comm.rank, n, np.float64), algorithm=a) for a in rs_algs]
        return out

    results = ThreadWorld(p, node_of=node_of).run(body)
    ref = canonical_sum([data(r, n, np.float64) for r in range(p)], node_of)
    for r in range(p):
        for k, a in enumerate(algs):
            assert results[r][k].tobytes() == ref.tobytes(), (a, r)
        for k, a in enumerate(rs_algs):
            block, (s0, s1) = results[r][len(algs) + k]
            sl = split_range(n, p, r)
            assert (s0, s1) == (sl.start, sl.stop) and block.tobytes() == ref[sl].tobytes(), (a, r)

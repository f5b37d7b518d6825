"""Single-process behaviour: block partition, fusion planning, SelfCommunicator copies."""
import numpy as np
import pytest

from native import collectives as col
from native.blocks import block_bounds, block_range
from native.comm import SelfCommunicator
from native.fusion import fused_allreduce, plan_fusion
from native_reference import split_range


def test_block_bounds_match_numpy_array_split():
    for n in (0, 1, 4, 7, 100):
        for p in (1, 2, 3, 5, 8):
            b = block_bounds(n, p)
            assert b[0] == 0 and b[-1] == n and b.dtype == np.int64
            assert [(b[i], b[i + 1]) for i in range(p)] == [
                (split_range(n, p, i).start, split_range(n, p, i).stop) for i in range(p)]
            assert block_range(n, p, p - 1) == (b[p - 1], b[p])


def test_block_bounds_rejects_bad_sizes():
    with pytest.raises(ValueError, match="n >= 0"):
        block_bounds(-1, 2)
    with pytest.raises(ValueError, match="p >= 1"):
        block_bounds(3, 0)


def test_plan_fusion_respects_threshold_and_groups_dtypes():
    arrays = [np.zeros(10), np.zeros(10), np.zeros(30), np.zeros(5, dtype=np.int64),
              np.zeros(5, dtype=np.int64), np.zeros(3)]
    # 80 B per 10 float64: [0, 1] fill 160 B, [2] alone (240 B > threshold), then the
    # open float bucket [5] and the open int bucket [3, 4]
    assert plan_fusion(arrays, threshold_bytes=160) == [[0, 1], [2], [5], [3, 4]]
    assert plan_fusion(arrays, threshold_bytes=10**6) == [[0, 1, 2, 5], [3, 4]]
    with pytest.raises(ValueError, match="threshold"):
        plan_fusion(arrays, threshold_bytes=0)


def test_self_communicator_collectives_are_copies():
    comm = SelfCommunicator()
    x = np.arange(12.0).reshape(3, 4)
    y = col.allreduce(comm, x)
    assert not np.shares_memory(x, y)
    np.testing.assert_array_equal(y, x)
    block, bounds = col.reduce_scatter(comm, x)
    assert bounds == (0, 3) and not np.shares_memory(block, x)
    np.testing.assert_array_equal(block, x)
    np.testing.assert_array_equal(col.allgather(comm, x), x)
    np.testing.assert_array_equal(col.allgatherv(comm, x), x)
    np.testing.assert_array_equal(col.bcast(comm, x.copy()), x)
    assert col.bcast_object(comm, {"a": 1}) == {"a": 1}
    assert col.allgather_object(comm, "m") == ["m"]
    assert col.global_row_offset(comm, 7) == (0, 7)
    best = col.allreduce_best(comm, [[np.nan, 1.0], [-0.0, 2.0]])
    assert best[0, 0] == -np.inf and not np.signbit(best[1, 0])
    parts = fused_allreduce(comm, [x, np.ones(3, dtype=np.int64)], threshold_bytes=8)
    np.testing.assert_array_equal(parts[0], x)
    assert parts[1].dtype == np.int64


def test_auto_choice_follows_the_cost_model():
    kib, mib = 2**10, 2**20
    for p in (2, 3, 4, 5, 8):
        # latency-bound: fewest steps
        assert col.choose_allreduce(kib, p) == "doubling"
    # bandwidth-bound: Rabenseifner on powers of two; the direct reduce-scatter (the
    # ring's costs, canonical order) where the fold would cost two whole-buffer transfers
    assert col.choose_allreduce(64 * mib, 4) == "rabenseifner"
    assert col.choose_allreduce(64 * mib, 8) == "rabenseifner"
    assert col.choose_allreduce(64 * mib, 3) == "direct"
    assert col.choose_allreduce(64 * mib, 5) == "direct"
    assert col.choose_reduce_scatter(64 * mib, 4) == "halving"
    for alg in ("ring", "rabenseifner", "doubling", "direct"):
        small = col.predicted_seconds("allreduce", alg, kib, 4)
        large = col.predicted_seconds("allreduce", alg, 64 * mib, 4)
        assert 0 < small < large
    with pytest.raises(ValueError, match="cost model"):
        col.predicted_seconds("allreduce", "bruck", kib, 4)


def test_check_timeout_setting(monkeypatch):
    from native.check import timeout_seconds

    monkeypatch.setenv("HISTFOREST_CHECK_TIMEOUT", "2.5")
    assert timeout_seconds() == 2.5
    monkeypatch.setenv("HISTFOREST_CHECK_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="HISTFOREST_CHECK_TIMEOUT"):
        timeout_seconds()


def test_job_guard_on_one_rank_lets_errors_through():
    from native.errors import job_guard

    with pytest.raises(ValueError, match="plain"):
        with job_guard(SelfCommunicator()):
            raise ValueError("plain error")
    with pytest.raises(SystemExit):
        with job_guard(SelfCommunicator()) as comm:
            assert comm.size == 1
            raise SystemExit(2)

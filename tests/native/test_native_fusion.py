"""Fused allreduce under real ranks: many arrays, several buckets, in place or not."""
import numpy as np
import pytest

from native import collectives as col
from native.fusion import fused_allreduce, plan_fusion

pytestmark = pytest.mark.mpi

SHAPES = [((4, 3, 2), np.float64), ((7,), np.float64), ((0,), np.float64),
          ((5, 5), np.int64), ((1,), np.int64), ((300,), np.float64)]


def make(rank):
    rng = np.random.default_rng([7, rank])
    return [rng.integers(-1000, 1000, s).astype(d) for s, d in SHAPES]


@pytest.mark.parametrize("inplace", [False, True])
@pytest.mark.parametrize("threshold", [64, 10**6])
def test_fused_allreduce_equals_separate_sums(comm, inplace, threshold):
    p, r = comm.size, comm.rank
    arrays = make(r)
    col.STATS.reset()
    out = fused_allreduce(comm, arrays, threshold_bytes=threshold, inplace=inplace,
                          algorithm="ring")
    calls = col.STATS.calls["allreduce"]
    want = [sum(make(q)[i] for q in range(p)) for i in range(len(SHAPES))]
    assert calls == len(plan_fusion(make(r), threshold))
    if threshold == 10**6:
        assert calls == 2  # one buffer per dtype
    for i, (got, w) in enumerate(zip(out, want)):
        assert got.shape == w.shape and got.dtype == w.dtype
        np.testing.assert_array_equal(got, w)
        if inplace:
            assert got is arrays[i]

"""Distributed bin fitting: every rank count gives the edges of a one-process fit.

Each rank fits its ``block_slice`` of one global X with the world communicator; the
reference is a fit of the whole X on ``SelfCommunicator``. Bitwise equality against the
same reference on every rank proves identity across ranks and across K = 1..4.
"""
import numpy as np
import pytest

from histogram.binning import BinMapper
from native.comm import SelfCommunicator
from tests.conftest import block_slice


def global_data(n=24_001):
    """Mixed features: continuous, skewed with ties and infinities, integer-coded with a
    value rarer than the sample rate, constant, all-NaN, NaN-riddled."""
    g = np.random.default_rng(99)
    cont = g.normal(size=n)
    skew = g.lognormal(sigma=2.0, size=n)
    skew[g.random(n) < 0.1] = 0.0
    skew[[5, n // 3, n - 2]] = [np.inf, -np.inf, np.inf]
    codes = g.integers(0, 30, size=n).astype(float)
    codes[[17, (5 * n) // 6]] = [1000.0, -7.0]  # rare values the hashed sample misses
    const = np.full(n, 3.0)
    allnan = np.full(n, np.nan)
    holes = g.normal(size=n)
    holes[g.random(n) < 0.3] = np.nan
    return np.column_stack([cont, skew, codes, const, allnan, holes])


@pytest.mark.mpi
@pytest.mark.parametrize("subsample", [3000, None])
def test_distributed_edges_equal_single_process_fit(comm, subsample):
    X = global_data()
    mine = X[block_slice(X.shape[0], comm.size, comm.rank)]
    dist = BinMapper(max_bins=64, subsample=subsample, random_state=3).fit(mine, comm=comm)
    ref = BinMapper(max_bins=64, subsample=subsample, random_state=3).fit(
        X, comm=SelfCommunicator())
    # all collectives are done; assert freely
    assert dist.thresholds_flat_.tobytes() == ref.thresholds_flat_.tobytes()
    np.testing.assert_array_equal(dist.threshold_offsets_, ref.threshold_offsets_)
    np.testing.assert_array_equal(dist.n_bins_non_missing_, ref.n_bins_non_missing_)
    np.testing.assert_array_equal(dist.is_exact_, ref.is_exact_)
    assert dist.n_samples_fit_ == ref.n_samples_fit_
    # the rare integer codes made it in although the sample missed them
    assert ref.is_exact_[2] and ref.n_bins_non_missing_[2] == 32
    assert ref.n_bins_non_missing_[3] == 1 and ref.n_bins_non_missing_[4] == 1
    np.testing.assert_array_equal(dist.transform(mine), ref.transform(mine))


@pytest.mark.mpi
def test_ranks_with_no_rows(comm):
    """A rank may hold no rows at all (more ranks than data blocks)."""
    X = global_data(n=50)
    sl = slice(0, 50) if comm.rank == comm.size - 1 else slice(0, 0)
    dist = BinMapper(max_bins=16, subsample=20, random_state=0).fit(X[sl], comm=comm)
    ref = BinMapper(max_bins=16, subsample=20, random_state=0).fit(X, comm=SelfCommunicator())
    assert dist.thresholds_flat_.tobytes() == ref.thresholds_flat_.tobytes()

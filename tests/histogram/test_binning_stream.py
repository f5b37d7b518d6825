"""Streaming bin fitting (:class:`histogram.binning_stream.StreamingBinFit`) gives
bitwise the edges of :meth:`BinMapper.fit` on the same rows, whatever the block sizes
and the rank count."""
import numpy as np
import pytest

from histogram.binning import BinMapper
from histogram.binning_stream import StreamingBinFit
from native.comm import SelfCommunicator
from tests.conftest import block_slice
from tests.histogram.test_binning_mpi import global_data


def with_many_rare_values(n=24_001):
    """``global_data`` plus a feature whose sample sees <= max_bins values while the
    data holds more: 40 common codes and 60 codes that occur once, all in the last
    fifth of the rows (one rank's block), so streaming hits its distinct-value cap."""
    X = global_data(n)
    g = np.random.default_rng(5)
    codes = g.integers(0, 40, size=n).astype(float)
    rare_rows = n - 1 - np.arange(60) * 7
    codes[rare_rows] = 100.0 + np.arange(60)
    return np.column_stack([X, codes])


def stream_fit(mapper, X, first_row, n_global, comm, block_sizes):
    fitter = StreamingBinFit(mapper, X.shape[1], first_row, X.shape[0], n_global)
    pos = 0
    for size in block_sizes:
        fitter.add(X[pos:pos + size])
        pos += size
    fitter.add(X[pos:])
    return fitter.finish(comm)


def assert_same_edges(a, b):
    assert a.thresholds_flat_.tobytes() == b.thresholds_flat_.tobytes()
    np.testing.assert_array_equal(a.threshold_offsets_, b.threshold_offsets_)
    np.testing.assert_array_equal(a.is_exact_, b.is_exact_)
    assert a.n_samples_fit_ == b.n_samples_fit_


@pytest.mark.parametrize("subsample", [3000, None])
@pytest.mark.parametrize("blocks", [[], [1, 0, 999, 5000], [7] * 300])
def test_stream_equals_fit_one_process(subsample, blocks):
    X = with_many_rare_values()
    ref = BinMapper(max_bins=64, subsample=subsample, random_state=3).fit(X, comm=SelfCommunicator())
    got = stream_fit(BinMapper(max_bins=64, subsample=subsample, random_state=3), X, 0, X.shape[0],
                     SelfCommunicator(), blocks)
    assert_same_edges(got, ref)
    if subsample is not None:
        assert ref.is_exact_[2] and not ref.is_exact_[6]  # rare codes found; too many codes seen
        assert ref.n_bins_non_missing_[6] <= 64


def test_wrong_row_counts_fail_clearly():
    X = global_data(100)
    fitter = StreamingBinFit(BinMapper(max_bins=16), X.shape[1], 0, 50, 100)
    with pytest.raises(ValueError, match="more rows added"):
        fitter.add(X)
    fitter.add(X[:10])
    with pytest.raises(ValueError, match="10 rows added, 50 announced"):
        fitter.finish(SelfCommunicator())
    with pytest.raises(ValueError, match="features"):
        StreamingBinFit(BinMapper(max_bins=16), X.shape[1], 0, 100, 100).add(X[:, :3])
    with pytest.raises(ValueError, match="do not fit"):
        StreamingBinFit(BinMapper(max_bins=16), X.shape[1], 60, 50, 100)


@pytest.mark.mpi
@pytest.mark.parametrize("subsample", [3000, None])
def test_stream_equals_fit_under_mpirun(comm, subsample):
    X = with_many_rare_values()
    sl = block_slice(X.shape[0], comm.size, comm.rank)
    mine = X[sl]
    streamed = stream_fit(BinMapper(max_bins=64, subsample=subsample, random_state=3), mine, sl.start,
                          X.shape[0], comm, [13, 0, 2000])
    ref = BinMapper(max_bins=64, subsample=subsample, random_state=3).fit(X, comm=SelfCommunicator())
    assert_same_edges(streamed, ref)

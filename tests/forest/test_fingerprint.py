"""Data fingerprints: the compiled row hash against its NumPy reference, one content hash
for every rank count, and sensitivity to any change of a value or of row order."""
import numpy as np
import pytest

from histogram.binning import BinMapper
from native.comm import SelfCommunicator
from forest.io.fingerprint import (content_hash, data_fingerprint, describe_difference, mapper_digest, row_hashes,
                                   row_hashes_reference)

SELF = SelfCommunicator()


def _data(n=500, seed=0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, size=(4, n)).astype(np.uint8)
    y = rng.normal(size=n)
    y[3] = np.nan
    y[4] = -0.0
    w = rng.normal(size=(n, 2))
    return codes, y, w


@pytest.mark.parametrize("n", [0, 1, 7, 500])
def test_row_hashes_match_reference(n):
    codes, y, w = _data(max(n, 5))
    codes, y, w = codes[:, :n], y[:n], w[:n]
    gids = np.arange(10**12, 10**12 + n)             # ids beyond 32 bits
    for args in ((), (codes,), (codes, [y, w]), (None, [w])):
        np.testing.assert_array_equal(row_hashes(gids, *args), row_hashes_reference(gids, *args))


def test_zero_signs_and_nan_payloads_hash_alike():
    gids = np.arange(3)
    a = np.array([0.0, np.nan, 1.0])
    b = np.array([-0.0, np.float64(np.nan) * -1, 1.0])
    np.testing.assert_array_equal(row_hashes(gids, None, [a]), row_hashes(gids, None, [b]))


def test_content_hash_sees_every_change():
    codes, y, w = _data()
    gids = np.arange(len(y))
    base = content_hash(SELF, gids, codes, [y, w])
    assert content_hash(SELF, gids[::-1], codes[:, ::-1], [y[::-1], w[::-1]]) == base   # order-free
    changed = []
    c2 = codes.copy()
    c2[2, 17] ^= 1
    changed.append(content_hash(SELF, gids, c2, [y, w]))
    y2 = y.copy()
    y2[10] = np.nextafter(y2[10], np.inf)
    changed.append(content_hash(SELF, gids, codes, [y2, w]))
    swap = np.arange(len(y))
    swap[[5, 6]] = swap[[6, 5]]                               # two rows exchange their places
    changed.append(content_hash(SELF, gids, codes[:, swap], [y[swap], w[swap]]))
    changed.append(content_hash(SELF, gids, codes, [y]))      # a column left out
    assert base not in changed and len(set(changed)) == len(changed)


@pytest.mark.mpi
def test_content_hash_and_fingerprint_do_not_depend_on_rank_count(comm, rank_slice):
    codes, y, w = _data(n=777, seed=3)
    X = np.random.default_rng(4).normal(size=(777, 4))
    sl = rank_slice(777)
    gids = np.arange(777)[sl]
    mapper = BinMapper(max_bins=31, random_state=0).fit(X[sl], comm=comm)
    local = mapper.transform(X[sl])
    mine = data_fingerprint(comm, gids, 777, local, mapper, {"y": y[sl], "w": w[sl]}, feature_names=list("abcd"))
    single_mapper = BinMapper(max_bins=31, random_state=0).fit(X, comm=SELF)
    single = data_fingerprint(SELF, np.arange(777), 777, single_mapper.transform(X), single_mapper,
                              {"y": y, "w": w}, feature_names=list("abcd"))
    assert mine == single
    assert mine["columns"] == {"y": 1, "w": 2} and mine["rows"] == 777 and mine["features"] == 4


def test_describe_difference_names_what_changed():
    codes, y, _ = _data()
    X = np.random.default_rng(1).normal(size=(len(y), 4))
    mapper = BinMapper(max_bins=15, random_state=0).fit(X, comm=SELF)
    gids = np.arange(len(y))
    fp = data_fingerprint(SELF, gids, len(y), codes, mapper, {"y": y})
    assert describe_difference(fp, dict(fp)) is None
    assert "500 rows x 4 features there, 499 rows x 4 features here" == describe_difference(fp, dict(fp, rows=499))
    other = BinMapper(max_bins=15, random_state=1).fit(X[::2], comm=SELF)
    assert mapper_digest(other) != mapper_digest(mapper)
    # all rows fit in the binning sample: another seed gives the same edges, the same digest
    assert mapper_digest(BinMapper(max_bins=15, random_state=7).fit(X, comm=SELF)) == mapper_digest(mapper)
    assert "different bin edges" in describe_difference(fp, data_fingerprint(SELF, gids, len(y), codes, other,
                                                                              {"y": y}))
    assert "different values" in describe_difference(fp, data_fingerprint(SELF, gids, len(y), codes, mapper,
                                                                            {"y": y + 1}))
    assert "feature columns" in describe_difference(fp, dict(fp, feature_names=["a", "b", "c", "d"]))

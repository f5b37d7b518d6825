"""The one hash (histogram.rowhash) against its NumPy reference and SplitMix64's known output."""
import numpy as np
import pytest

from histogram.rowhash import GOLDEN, hash64, hash64_reference, hash_id, mix64, stream_key, uniform, unit_id


def test_mix64_is_splitmix64():
    # SplitMix64 seeded with 0 first returns mix(0 + golden) = 0xE220A8397B1DCDAF.
    assert int(mix64(GOLDEN)) == 0xE220A8397B1DCDAF


@pytest.mark.parametrize("seed, stream", [(0, 0), (7, 3), (2 ** 63 + 5, 2 ** 64 - 1), (-1, -2)])
def test_array_and_scalar_hashes_match_reference(seed, stream):
    rng = np.random.default_rng(0)
    ids = np.concatenate([rng.integers(0, 2 ** 62, 500), [0, 1, -1, -(2 ** 63)]]).astype(np.int64)
    ref = hash64_reference(seed, stream, ids)
    np.testing.assert_array_equal(hash64(seed, stream, ids), ref)
    np.testing.assert_array_equal(hash64(seed, stream, ids.astype(np.uint64)), ref)
    key = stream_key(seed, stream)
    assert [int(hash_id(key, i)) for i in ids[:20]] == [int(v) for v in ref[:20]]
    u = uniform(seed, stream, ids)
    np.testing.assert_array_equal(u, (ref >> np.uint64(11)).astype(np.float64) / 2.0 ** 53)
    assert unit_id(key, ids[3]) == u[3]
    assert (u >= 0).all() and (u < 1).all()

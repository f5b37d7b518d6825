"""The goes-left rule (forest.engine.routing): compiled scalar form against the NumPy form."""
import numba
import numpy as np
import pytest

from forest.engine.routing import goes_left_code, goes_left_codes, goes_left_value


@numba.njit
def _apply(codes, thr, ml, missing_bin, out):
    for i in range(codes.shape[0]):
        out[i] = goes_left_code(np.int32(codes[i]), thr, ml, missing_bin)


@pytest.mark.parametrize("missing_left", [False, True])
@pytest.mark.parametrize("thr", [0, 3, 254])
def test_code_rule_matches_numpy(thr, missing_left):
    codes = np.arange(256, dtype=np.uint8)
    out = np.empty(256, dtype=np.bool_)
    _apply(codes, thr, np.uint8(missing_left), 255, out)
    ref = goes_left_codes(codes, thr, missing_left, 255)
    np.testing.assert_array_equal(out, ref)
    assert ref[255] == missing_left
    assert ref[:thr + 1].all() and not ref[thr + 1:255].any()


def test_value_rule():
    assert goes_left_value(0.5, 0.5, 0) and not goes_left_value(0.6, 0.5, 1)
    assert goes_left_value(np.nan, 0.5, 1) and not goes_left_value(np.nan, 0.5, 0)

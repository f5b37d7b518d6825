"""Exact policy search: Numba kernels against their NumPy references, and the whole
search against a brute-force recursion over row subsets (depths 0-3, ties, missing values)."""
import numpy as np
import pytest

from forest.policy import exact as pe
from forest.policy import search as ps
from forest.engine.honest_forest import fit_binning
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _space(X, max_bins, seed=0):
    mapper, codes = fit_binning(X, max_bins, seed, SELF)
    return pe.SearchSpace(mapper, codes, (codes == mapper.missing_bin_).any(axis=1)), codes


def _channels(R, exponent=0):
    return np.column_stack([pe.fixed_point(R, exponent), np.ones(len(R))])


def _data(n, p, A, seed, missing=0.1, integer=True):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    X[rng.uniform(size=(n, p)) < missing] = np.nan
    R = rng.integers(-3, 4, size=(n, A)).astype(float) if integer else rng.normal(size=(n, A))
    R[:, 1 % A] += 2.0 * (np.nan_to_num(X[:, 0]) > 0) * (np.nan_to_num(X[:, 1 % p], nan=1.0) > 0.3)
    return X, R


def _records_equal(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.fixture(params=["serial", "parallel"])
def driver(request, monkeypatch):
    """Run the kernels serially, or through their parallel chunk drivers (even for tiny blocks)."""
    if request.param == "parallel":
        monkeypatch.setattr(ps, "PARALLEL_MIN_WORK", 0)
    return request.param


@pytest.mark.parametrize("seed", [0, 1])
def test_pair_kernel_matches_reference(seed, driver):
    X, R = _data(400, 3, 3, seed)
    space, _ = _space(X, 6)
    ch = _channels(R)
    nb, S = space.n_bins, space.n_search
    one = np.array([0, len(X)])
    from histogram.kernels import build_histograms
    cum1 = np.cumsum(build_histograms(space.codes, ch, None, one, nb)[0], axis=1)
    total = cum1[0, -1]
    fast = ps.half_leaf_records(cum1, total, space.lo, space.hi, 3, 4)
    slow = tuple(a.copy() for a in fast)
    for block in pe.blocks(2, S, nb, 4):
        raw = pe.block_table(space.codes, ch, block, nb)
        Jc = ps.cumulate_block(raw.copy())
        assert np.array_equal(Jc, ps.cumulate(raw, [0, 2]))
        (s1,), lo, hi = block
        ps.pair_block_search(Jc, s1, lo, space.lo, space.hi, total, 3, 4, *fast)
        ps.pair_block_search_reference(Jc, s1, lo, space.lo, space.hi, total, 3, 4, slow)
    assert _records_equal(fast, slow)
    assert (fast[1] >= 0).any()  # some half-spaces do split


@pytest.mark.parametrize("seed", [0, 1])
def test_triple_kernel_matches_reference(seed, driver):
    X, R = _data(300, 3, 2, seed)
    space, _ = _space(X, 4)
    ch = _channels(R)
    nb, S = space.n_bins, space.n_search
    total = ch.sum(axis=0)
    fast = ps.new_records((S, S, nb, nb, 2, 2))
    slow = tuple(a.copy() for a in fast)
    for block in pe.blocks(3, S, nb, 3):
        raw = pe.block_table(space.codes, ch, block, nb)
        Jc = ps.cumulate_block(raw.copy())
        assert np.array_equal(Jc, ps.cumulate(raw, [0, 1, 3]))
        (s1, s2), lo, hi = block
        ps.triple_block_search(Jc, s1, s2, lo, space.lo, space.hi, total, 2, 3, *fast)
        ps.triple_block_search_reference(Jc, s1, s2, lo, space.lo, space.hi, 2, 3, slow)
    assert _records_equal(fast, slow)
    assert (fast[1] >= 0).any() and (fast[1] == -1).any()


def test_blocks_cover_every_tuple_once():
    for depth, head_len in ((2, 1), (3, 2)):
        seen = []
        for head, lo, hi in pe.blocks(depth, 5, 9, 3, budget=9 ** depth * 3 * 8 * 2):
            assert hi - lo <= 2 and lo >= head[-1]
            seen += [head + (s,) for s in range(lo, hi)]
        expected = [t for t in np.ndindex(*(5,) * (head_len + 1)) if list(t) == sorted(t)]
        assert sorted(seen) == sorted(expected)


CASES = [  # (n, p, A, max_bins, depth, min_rows, seed)
    (120, 3, 3, 5, 0, 1, 0), (150, 3, 3, 6, 1, 1, 1), (200, 3, 3, 5, 2, 1, 2), (200, 2, 4, 6, 2, 7, 3),
    (160, 2, 3, 4, 3, 1, 4), (160, 3, 2, 3, 3, 5, 5),
]


@pytest.mark.parametrize("n,p,A,max_bins,depth,min_rows,seed", CASES)
def test_exact_search_equals_brute_force(n, p, A, max_bins, depth, min_rows, seed):
    """Same optimum and the same tree (ties included) as the recursion over row subsets."""
    X, R = _data(n, p, A, seed)
    space, _ = _space(X, max_bins)
    ch = _channels(R)
    result = pe.exact_search(space, ch, A, depth, min_rows, SELF)
    value, structure = ps.brute_force_search(space.codes, ch, space.lo, space.hi, A, depth, min_rows)
    assert result.value == value
    assert result.structure(depth) == structure


def test_exact_search_float_rewards_and_twins():
    """Non-integer rewards (fixed point) and missing values sent either way."""
    X, R = _data(180, 2, 3, 9, missing=0.25, integer=False)
    space, _ = _space(X, 5)
    assert space.n_search == 4 and space.missing_first[2:].all()
    e = pe.fixed_point_exponent(np.abs(R).max(), len(R))
    ch = _channels(R, e)
    for depth in (1, 2):
        result = pe.exact_search(space, ch, 3, depth, 2, SELF)
        value, structure = ps.brute_force_search(space.codes, ch, space.lo, space.hi, 3, depth, 2)
        assert result.value == value and result.structure(depth) == structure


def test_fixed_point_sums_are_exact():
    rng = np.random.default_rng(0)
    x = rng.normal(size=10_000) * 1e3
    e = pe.fixed_point_exponent(np.abs(x).max(), len(x))
    q = pe.fixed_point(x, e)
    assert np.all(q == np.round(q)) and np.abs(q).sum() < 2.0 ** 52
    assert np.sum(q) == np.sum(q[::-1]) == np.sum(np.sort(q))
    assert abs(np.ldexp(q.sum(), -e) - x.sum()) <= len(x) * 2.0 ** (-e - 1)
    assert pe.fixed_point_exponent(0.0, 10) == 0

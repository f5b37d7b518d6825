"""Compiled criterion pieces (forest.criteria.compiled) against the vectorised criteria."""
from collections import namedtuple

import numpy as np
import pytest
from numba.core.errors import TypingError

from forest.criteria import compiled as cc
from forest.criteria.causal import CausalCriterion, CausalRecord, CausalScalarRecord
from forest.criteria.basic import NewtonCriterion, VarianceCriterion
from forest.engine.splitting import find_best_splits, find_best_splits_reference

from causal_helpers import causal_rows
from criterion_checks import assert_count_shortcuts_sound, random_cuts


#: (K, M, constraint, min_samples_leaf, alpha, imbalance_penalty, precondition)
CAUSAL_CASES = [(1, 1, "arms", 3, 0.05, 0.0, None), (1, 1, "sign", 2, 0.05, 0.5, None),
                (2, 1, "arms", 3, 0.05, 0.0, None), (3, 1, "arms", 2, 0.1, 0.0, None),
                (5, 1, "arms", 1, 0.05, 0.3, None), (2, 1, "sign", 3, 0.05, 0.0, None),
                (1, 2, "arms", 3, 0.05, 0.0, None), (2, 2, "arms", 2, 0.05, 0.0, None),
                (1, 1, "arms", 2, 0.05, 0.0, True), (2, 1, "arms", 2, 0.05, 0.0, False)]


def _causal(case):
    K, M, kind, leaf, alpha, pen, pre = case
    return CausalCriterion(K, M, min_samples_leaf=leaf, alpha=alpha, imbalance_penalty=pen, constraint=kind,
                           precondition=pre)


def _causal_channels(rng, crit, n):
    wc, y, g, ind = causal_rows(rng, n, crit.K, crit.M, crit.constraint)
    return crit.make_channels(wc, y, g, ind)


@pytest.mark.parametrize("case", CAUSAL_CASES)
def test_causal_compiled_gains_equal_vectorised(case):
    rng = np.random.default_rng(sum(map(hash, map(str, case))) % 2 ** 32)
    crit = _causal(case)
    comp = crit.compiled()
    scalar = crit.K == 1 and crit.M == 1 and not crit.precondition
    assert isinstance(comp.record, CausalScalarRecord if scalar else CausalRecord)
    n_inf = n_fin = 0
    for _ in range(40):
        n = int(rng.integers(4, 60))
        ch = _causal_channels(rng, crit, n)
        parent = ch.sum(axis=0)
        cuts, lefts = random_cuts(rng, ch, 25)
        rights = parent - lefts
        ref = crit.gain(lefts, rights, parent)
        got = comp.gains_of(lefts, rights, parent)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-9, atol=1e-12)
        if scalar:
            np.testing.assert_array_equal(got, ref)  # the same scalar core
        n_inf += (~fin).sum()
        n_fin += fin.sum()
    assert n_inf > 50 and n_fin > 50


@pytest.mark.parametrize("case", CAUSAL_CASES[:6])
def test_causal_singular_parent_cannot_split(case):
    crit = _causal(case)
    rng = np.random.default_rng(1)
    ch = _causal_channels(rng, crit, 30)
    L = crit.layout
    ch[:, L.s_w] = 0.0
    ch[:, L.s_wy] = 0.0
    ch[:, L.s_ww] = 0.0
    got = crit.compiled().gains_of(ch[:15].sum(0)[None], ch[15:].sum(0)[None], ch.sum(0))
    assert got[0] == -np.inf == crit.gain(ch[:15].sum(0), ch[15:].sum(0), ch.sum(0))


@pytest.mark.parametrize("case", CAUSAL_CASES)
def test_count_shortcuts_never_drop_a_finite_gain(case):
    """sides_ok false => gain -inf; right_exhausted true => every later cut of a scan is -inf."""
    crit = _causal(case)
    assert_count_shortcuts_sound(crit, lambda rng, n: _causal_channels(rng, crit, n), np.random.default_rng(2), 30)


@pytest.mark.parametrize("crit", [VarianceCriterion(1, min_samples_leaf=3, min_weight_leaf=0.5, count_channel=True),
                                  VarianceCriterion(3, min_samples_leaf=2), VarianceCriterion(2),
                                  VarianceCriterion(1, min_samples_leaf=1, count_channel=True, alpha=0.2),
                                  VarianceCriterion(2, min_samples_leaf=2, alpha=0.15),
                                  VarianceCriterion(1, min_samples_leaf=1, count_channel=True, imbalance_penalty=0.3)])
def test_variance_compiled_gains_equal_vectorised(crit):
    rng = np.random.default_rng(3)
    comp = crit.compiled()
    for _ in range(30):
        n = int(rng.integers(2, 30))
        ch = crit.make_channels(rng.normal(size=(n, crit.n_targets)), rng.uniform(0.1, 2.0, n))
        parent = ch.sum(axis=0)
        cuts = rng.random((20, n)) < 0.5
        lefts = cuts.astype(float) @ ch
        ref = crit.gain(lefts, parent - lefts, parent)
        got = comp.gains_of(lefts, parent - lefts, parent)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
        np.testing.assert_allclose(got[np.isfinite(ref)], ref[np.isfinite(ref)], rtol=1e-12)


def test_unregistered_record_is_an_error():
    Rogue = namedtuple("Rogue", ["a"])
    with pytest.raises(TypeError, match="not a registered criterion record"):
        cc.CompiledCriterion(Rogue(1.0), 0)
    with pytest.raises(TypingError, match="no compiled criterion is registered"):
        cc._eval_gains(Rogue(1.0), np.zeros((1, 2)), np.zeros((1, 2)), np.zeros(2), np.zeros(1), np.zeros((1, 1)))
    with pytest.raises(TypeError, match="namedtuple"):
        cc.register(dict, prepare=None, gains=None)
    assert NewtonCriterion().compiled() is None


def test_pieces_must_take_the_entry_points_argument_names():
    # Numba's overloads require the implementation's argument names; a piece named
    # otherwise is refused at registration, not deep inside the first kernel compile.
    Rogue = namedtuple("Rogue", ["a"])

    def prepare_out(p, parent, out):
        out[0] = 0.0

    def gains_ok(p, lefts, rights, consts, out, row, n):
        out[row, :n] = 0.0

    def sides_swapped(p, n_r, n_l, cum, miss, with_miss, parent):
        return True

    with pytest.raises(TypeError, match=r"prepare piece .*prepare_out takes \('p', 'parent', 'out'\)"):
        cc.register(Rogue, prepare=prepare_out, gains=gains_ok)
    with pytest.raises(TypeError, match="sides_ok piece"):
        cc.register(Rogue, prepare=lambda p, parent, consts: None, gains=gains_ok, sides_ok=sides_swapped)
    assert not cc.is_registered(Rogue)


# ---------------------------------------------------------------------- histogram search
class _Vectorised:
    """The same criterion without compiled pieces: find_best_splits' NumPy search."""

    def __init__(self, crit):
        self._crit = crit

    def __getattr__(self, name):
        return getattr(self._crit, name)

    def compiled(self):
        return None


def _hist(rng, crit, n_nodes, n_features, n_value_bins):
    n_bins = n_value_bins + 1
    hist = np.zeros((n_nodes, n_features, n_bins, crit.n_channels))
    for n in range(n_nodes):
        m = int(rng.integers(30, 90))
        if isinstance(crit, VarianceCriterion):
            ch = crit.make_channels(rng.normal(size=(m, crit.n_targets)), rng.uniform(0.5, 2.0, m))
        else:
            ch = _causal_channels(rng, crit, m)
        codes = rng.integers(0, n_bins, size=(n_features, m))
        codes[rng.random(codes.shape) < 0.6] = 2  # a crowded bin, and empty ones elsewhere
        for f in range(n_features):
            for c in range(ch.shape[1]):
                hist[n, f, :, c] = np.bincount(codes[f], weights=ch[:, c], minlength=n_bins)
    hist[:, 1, 5:n_value_bins] = 0.0     # feature 1: 5 value bins in use
    hist[:, 2, 1:n_value_bins] = 0.0     # feature 2: one value bin (missing vs not)
    hist[:, 3, n_value_bins] = 0.0       # feature 3: no missing rows
    return hist, hist[:, 0].sum(axis=1)


@pytest.mark.parametrize("crit", [VarianceCriterion(1, min_samples_leaf=3, count_channel=True),
                                  VarianceCriterion(2, min_samples_leaf=2)]
                         + [_causal(c) for c in CAUSAL_CASES])
def test_compiled_search_matches_vectorised_and_reference(crit):
    rng = np.random.default_rng(crit.n_channels)
    hist, parent = _hist(rng, crit, 5, 4, 8)
    nb = np.array([8, 5, 1, 8])
    mask = rng.random((5, 4)) < 0.85
    fast = find_best_splits(hist, parent, crit, nb, 8, feature_mask=mask)
    vec = find_best_splits(hist, parent, _Vectorised(crit), nb, 8, feature_mask=mask)
    ref = find_best_splits_reference(hist, parent, crit, nb, 8, feature_mask=mask)
    assert fast.valid.sum() >= 3
    for other in (vec, ref):
        np.testing.assert_array_equal(fast.feature, other.feature)
        np.testing.assert_array_equal(fast.bin, other.bin)
        np.testing.assert_array_equal(fast.missing_left, other.missing_left)
        np.testing.assert_allclose(fast.gain, other.gain, rtol=1e-9)
        np.testing.assert_allclose(fast.left_stats, other.left_stats, rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(fast.right_stats, other.right_stats, rtol=1e-12, atol=1e-9)
    # the compiled search reads the sums the vectorised one forms: bitwise equal
    np.testing.assert_array_equal(fast.left_stats, vec.left_stats)
    np.testing.assert_array_equal(fast.right_stats, vec.right_stats)


# ---------------------------------------------------------------------- shared specialisation
def test_kernel_record_pairs_helpers_with_the_main_criterion():
    main = CausalCriterion(1, 1, min_samples_leaf=3).compiled()
    helper = VarianceCriterion(1, min_samples_leaf=3, count_channel=True).compiled()
    other_helper = VarianceCriterion(1, min_samples_leaf=5, count_channel=True).compiled()
    assert cc.kernel_record(helper) is helper.record               # outside a block: unchanged
    with cc.shared_specialisation(main):
        assert cc.kernel_record(main) is main.record               # no helper ran yet: unpaired
        assert cc.kernel_record(helper) == cc.PairedRecord(0, helper.record, main.record)
        assert cc.kernel_record(other_helper) == cc.PairedRecord(0, other_helper.record, main.record)
        assert cc.kernel_record(main) == cc.PairedRecord(1, helper.record, main.record)
        # another criterion of the main one's class is not the main one: unpaired
        stranger = CausalCriterion(1, 1, min_samples_leaf=9).compiled()
        assert cc.kernel_record(stranger) is stranger.record
    assert cc.kernel_record(main) is main.record


def test_a_main_criterion_registered_apart_shares_nothing():
    """Several arms (the general causal record, shares_kernels=False): every criterion inside
    the block runs on its own record, as outside it."""
    main = CausalCriterion(2, 1, min_samples_leaf=3).compiled()
    helper = VarianceCriterion(1, min_samples_leaf=3, count_channel=True).compiled()
    assert type(main.record).__name__ == "CausalRecord"
    with cc.shared_specialisation(main):
        assert cc.kernel_record(helper) is helper.record
        assert cc.kernel_record(main) is main.record
    assert not cc._SHARING


@pytest.mark.parametrize("which", [0, 1])
def test_paired_record_runs_the_chosen_criterions_pieces(which):
    rng = np.random.default_rng(4 + which)
    var = VarianceCriterion(1, min_samples_leaf=2, count_channel=True)
    cau = _causal(CAUSAL_CASES[1])
    crit = (var, cau)[which]
    paired = cc.CompiledCriterion(cc.PairedRecord(which, var.compiled().record, cau.compiled().record),
                                  crit.compiled().weight_channel, n_consts=8)
    for _ in range(20):
        n = int(rng.integers(6, 40))
        ch = (crit.make_channels(rng.normal(size=(n, 1)), rng.uniform(0.1, 2.0, n)) if which == 0
              else _causal_channels(rng, crit, n))
        parent = ch.sum(axis=0)
        lefts = (rng.random((15, n)) < 0.5).astype(float) @ ch
        np.testing.assert_array_equal(paired.gains_of(lefts, parent - lefts, parent),
                                      crit.compiled().gains_of(lefts, parent - lefts, parent))
        cum, miss = lefts[0], lefts[1] * 0.0
        n_l = n // 2
        assert (cc.sides_ok(paired.record, n_l, n - n_l, cum, miss, False, parent)
                == cc.sides_ok(crit.compiled().record, n_l, n - n_l, cum, miss, False, parent))

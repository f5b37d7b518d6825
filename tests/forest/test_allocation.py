"""Budgeted allocation: hull kernel against its reference, the greedy against a single-process
scan and a brute-force optimum, known answers, cost curves."""
import itertools

import numpy as np
import pytest

from forest.policy import allocation as al
from forest.policy.simulate import budget_design
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _random_case(rng, n_max=6, a_max=3):
    n, A = int(rng.integers(1, n_max + 1)), int(rng.integers(1, a_max + 1))
    v = np.round(rng.normal(0.5, 1, size=(n, A)), 1)          # ties in effects and ROIs
    c = np.round(rng.uniform(0, 3, size=(n, A)), 1)
    c[rng.uniform(size=(n, A)) < 0.1] = 0.0                    # free options
    c[rng.uniform(size=(n, A)) < 0.05] = np.inf                # unavailable options
    return v, c, float(rng.uniform(0, 6))


def _brute_force(v, c, budget):
    n, A = v.shape
    best = 0.0
    for choice in itertools.product(range(-1, A), repeat=n):
        ch = np.array(choice)
        rows = np.flatnonzero(ch >= 0)
        if c[rows, ch[rows]].sum() <= budget:
            best = max(best, v[rows, ch[rows]].sum())
    return best


def test_hull_kernel_matches_reference():
    rng = np.random.default_rng(0)
    for _ in range(200):
        v, c, _ = _random_case(rng, n_max=8, a_max=5)
        eligible = (v > 0) & np.isfinite(c)
        fast = al.hull_segments(v, c, eligible)
        slow = al.hull_segments_reference(v, c, eligible)
        assert all(np.array_equal(a, b) for a, b in zip(fast, slow))


def test_greedy_is_the_reference_scan_and_within_one_unit_of_the_optimum():
    rng = np.random.default_rng(1)
    gaps = []
    for _ in range(120):
        v, c, budget = _random_case(rng)
        res = al.allocate(v, c, budget, comm=SELF)
        assert np.array_equal(res.action, al.allocate_reference(v, c, budget))
        opt = _brute_force(v, c, budget)
        rows = np.flatnonzero(res.action >= 0)
        assert res.spend == pytest.approx(c[rows, res.action[rows]].sum()) and res.spend <= budget
        assert res.value == pytest.approx(v[rows, res.action[rows]].sum())
        assert opt - max(v.max(), 0.0) - 1e-9 <= res.value <= opt + 1e-9
        assert res.lp_bound >= opt - 1e-9
        gaps.append(opt - res.value)
    assert np.mean(np.array(gaps) < 1e-9) > 0.8  # mostly optimal, never worse than one unit


def test_equal_costs_take_the_largest_effects():
    v = np.array([0.5, 2.0, -1.0, 1.5, 3.0, 0.1])
    res = al.allocate(v[:, None], np.array([1.0]), 3.5, comm=SELF)
    assert res.action.tolist() == [-1, 0, -1, 0, 0, -1] and res.spend == 3.0 and res.value == 6.5
    assert res.lp_bound == pytest.approx(6.75) and res.roi_threshold == 0.5


def test_multi_arm_upgrades_follow_incremental_roi():
    """Unit 0: arm 0 (cost 1, +2) or arm 1 (cost 3, +3: +1 for 2 more); unit 1: arm 0 (cost 2, +3)."""
    v = np.array([[2.0, 3.0], [3.0, 1.0]])
    c = np.array([[1.0, 3.0], [2.0, 2.0]])
    assert al.allocate(v, c, 3.0, comm=SELF).action.tolist() == [0, 0]   # ROI 2, 1.5 before 0.5
    assert al.allocate(v, c, 5.0, comm=SELF).action.tolist() == [1, 0]
    assert al.allocate(v, c, 1.0, comm=SELF).action.tolist() == [0, -1]
    # the fill: the cut segment (unit 0's arm 1 upgrade) does not fit, a later one does
    fill = al.allocate(np.array([[10.0], [1.0]]), np.array([[5.0], [1.0]]), 4.0, comm=SELF)
    assert fill.action.tolist() == [-1, 0] and fill.n_rounds >= 2


def test_lower_bounds_free_options_and_no_budget():
    v = np.array([[1.0, 2.0], [0.5, 0.2], [3.0, 1.0]])
    c = np.array([[0.0, 1.0], [1.0, 1.0], [2.0, np.inf]])
    lower = np.array([[-0.1, 0.5], [0.1, 0.1], [1.0, 1.0]])
    assert al.allocate(v, c, 0.0, comm=SELF).action.tolist() == [0, -1, -1]
    assert al.allocate(v, c, np.inf, comm=SELF).action.tolist() == [1, 0, 0]
    assert al.allocate(v, c, np.inf, lower=lower, comm=SELF).action.tolist() == [1, 0, 0]
    assert al.allocate(v, c, 1.0, lower=lower, comm=SELF).action.tolist() == [1, -1, -1]


@pytest.mark.parametrize("args,match", [
    ((np.ones((3, 2)), np.ones(3), 1.0), "costs must have shape"),
    ((np.ones((3, 2)), -np.ones(2), 1.0), "costs must be >= 0"),
    ((np.full((3, 2), np.nan), np.ones(2), 1.0), "effects contain NaN"),
    ((np.ones((3, 2)), np.ones(2), -1.0), "budget must be >= 0"),
])
def test_bad_inputs(args, match):
    with pytest.raises(ValueError, match=match):
        al.allocate(*args, comm=SELF)


def _curve_reference(v, c, s, n_points):
    """Loop over the reference order: piecewise-linear gain through the segment ends."""
    eligible = (v > 0) & np.isfinite(c)
    unit, seg, src, dst = al.hull_segments_reference(v, c, eligible)
    val = lambda m, a: np.where(a >= 0, m[unit, np.maximum(a, 0)], 0.0)  # noqa: E731
    dv, dc, ds = val(v, dst) - val(v, src), val(c, dst) - val(c, src), val(s, dst) - val(s, src)
    with np.errstate(divide="ignore"):
        roi = np.where(dc > 0, dv / np.where(dc > 0, dc, 1.0), np.inf)
    order = sorted(range(len(unit)), key=lambda k: (-roi[k], unit[k], seg[k]))
    total = dc.sum()
    out = []
    for level in np.linspace(0, total, n_points):
        spent = gain = 0.0
        for k in order:
            if spent + dc[k] <= level + 1e-12:
                spent += dc[k]
                gain += ds[k]
            else:
                gain += (level - spent) / dc[k] * ds[k]
                break
        out.append(gain)
    return np.array(out)


def test_cost_curves_match_a_direct_loop_and_rank_better_than_random():
    X, tau, costs, scores = budget_design(400, n_arms=3, seed=3)
    est = tau + 0.3 * np.random.default_rng(4).normal(size=tau.shape)
    curves = al.cost_curves(est, costs, scores, n_points=21, comm=SELF)
    assert set(curves) == {"all", "arm 0", "arm 1", "arm 2"}
    ref = _curve_reference(est, costs, scores, 21)
    np.testing.assert_allclose(curves["all"].gain, ref, rtol=1e-6, atol=1e-6)
    full = al.allocate(est, costs, np.inf, comm=SELF)
    rows = np.flatnonzero(full.action >= 0)
    assert curves["all"].total_gain == pytest.approx(scores[rows, full.action[rows]].sum())
    assert curves["all"].total_spend == pytest.approx(full.spend, rel=1e-9)
    one = np.zeros_like(est)
    one[:, 1] = est[:, 1]
    ref1 = _curve_reference(one[:, [1]], costs[:, [1]], scores[:, [1]], 21)
    np.testing.assert_allclose(curves["arm 1"].gain, ref1, rtol=1e-6, atol=1e-6)
    # an informative ranking front-loads the gain; a shuffled one does not
    assert curves["all"].aucc > 0.6
    shuffled = al.cost_curves(np.random.default_rng(5).permutation(est), costs, scores, n_points=21,
                              per_arm=False, comm=SELF)["all"]
    assert shuffled.aucc < curves["all"].aucc - 0.05
    assert curves["all"].spend[0] == 0 and np.all(np.diff(curves["all"].spend) > 0)

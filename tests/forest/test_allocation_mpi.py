"""Allocation and cost curves under real ranks: units spread over ranks, one global budget,
the -np 1 answer at any rank count (run by `make test` with mpirun -np 2, 3, 4)."""
import numpy as np
import pytest

from forest.policy import allocation as al
from forest.policy.simulate import budget_design
from native.blocks import block_range
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


@pytest.mark.mpi
@pytest.mark.parametrize("budget", [0.0, 40.0, 150.0, np.inf])
def test_same_allocation_for_any_rank_count(comm, rank_slice, budget):
    X, tau, costs, scores = budget_design(700, n_arms=3, seed=8)
    est = np.round(tau + 0.2 * np.random.default_rng(9).normal(size=tau.shape), 2)  # ROI ties across ranks
    costs = np.round(costs, 1)
    costs[::50, 0] = 0.0
    lower = est - 0.1
    sl = rank_slice(700)
    dist = al.allocate(est[sl], costs[sl], budget, lower=lower[sl], comm=comm)
    ref = al.allocate(est, costs, budget, lower=lower, comm=SELF)
    same = np.array_equal(dist.action, ref.action[sl])
    diffs = [abs(dist.value - ref.value), abs(dist.spend - ref.spend), abs(dist.lp_bound - ref.lp_bound),
             abs(dist.roi_threshold - ref.roi_threshold)]
    assert same and dist.n_rounds == ref.n_rounds
    assert max(diffs) < 1e-8
    assert dist.spend <= budget


@pytest.mark.mpi
def test_same_cost_curves_for_any_rank_count(comm, rank_slice):
    X, tau, costs, scores = budget_design(500, n_arms=2, seed=10)
    est = tau + 0.3 * np.random.default_rng(11).normal(size=tau.shape)
    sl = rank_slice(500)
    dist = al.cost_curves(est[sl], costs[sl], scores[sl], n_points=31, comm=comm)
    ref = al.cost_curves(est, costs, scores, n_points=31, comm=SELF)
    gaps = [np.max(np.abs(dist[k].gain - ref[k].gain)) + np.max(np.abs(dist[k].spend - ref[k].spend))
            for k in ref]
    assert sorted(dist) == sorted(ref)
    assert max(gaps) < 1e-8


@pytest.mark.mpi
def test_rank_without_units(comm):
    """The last rank holds no units (when there are several): the others still agree with -np 1."""
    X, tau, costs, scores = budget_design(300, n_arms=2, seed=12)
    lo, hi = block_range(300, max(comm.size - 1, 1), comm.rank) if comm.rank < max(comm.size - 1, 1) else (300, 300)
    dist = al.allocate(tau[lo:hi], costs[lo:hi], 25.0, comm=comm)
    curve = al.cost_curves(tau[lo:hi], costs[lo:hi], scores[lo:hi], n_points=11, per_arm=False, comm=comm)["all"]
    ref = al.allocate(tau, costs, 25.0, comm=SELF)
    ref_curve = al.cost_curves(tau, costs, scores, n_points=11, per_arm=False, comm=SELF)["all"]
    assert np.array_equal(dist.action, ref.action[lo:hi]) and abs(dist.value - ref.value) < 1e-9
    assert np.max(np.abs(curve.gain - ref_curve.gain)) < 1e-8

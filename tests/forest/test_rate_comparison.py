"""RATE of two prioritisation rules and their paired difference (grf's RATE with two priorities; issue 38)."""
import numpy as np
import pytest

from forest import CausalForest
from native.comm import SelfCommunicator
from tests.conftest import block_slice

SELF = SelfCommunicator()


def _data(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    t = (rng.random(n) < 0.5).astype(float)
    tau = np.maximum(X[:, 0], 0.0) * 2
    y = X[:, 1] + tau * t + rng.normal(size=n)
    return X, t, y, tau, rng


def test_difference_of_a_good_and_a_useless_rule():
    X, t, y, tau, rng = _data()
    cf = CausalForest(100, random_state=0).fit(X, t, y, comm=SELF)
    good, noise = tau + 0.1 * rng.normal(size=len(tau)), rng.normal(size=len(tau))
    table = cf.compare_priorities(good, noise, n_bootstrap=100, comm=SELF)
    assert table.terms == ["priority 1", "priority 2", "priority 1 - priority 2"]
    one = cf.rank_average_treatment_effect(good, n_bootstrap=100, comm=SELF)
    two = cf.rank_average_treatment_effect(noise, n_bootstrap=100, comm=SELF)
    np.testing.assert_allclose(table.estimate[:2], np.ravel([one.estimate, two.estimate]), rtol=1e-12)
    np.testing.assert_allclose(table.stderr[:2], np.ravel([one.stderr, two.stderr]), rtol=1e-12)
    np.testing.assert_allclose(table.estimate[2], np.ravel(one.estimate - two.estimate)[0], rtol=1e-12)
    assert table.estimate[2] > 3 * table.stderr[2] and table.pvalue[2] < 1e-3
    # the same rule twice: exactly no difference; a near copy: the pairing removes what they share
    same = cf.compare_priorities(good, good, n_bootstrap=50, comm=SELF)
    assert same.estimate[2] == 0.0 and same.stderr[2] == 0.0
    near = cf.compare_priorities(good, good + 0.05 * rng.normal(size=len(tau)), n_bootstrap=100, comm=SELF)
    assert near.stderr[2] < 0.5 * np.hypot(near.stderr[0], near.stderr[1])
    with pytest.raises(ValueError, match="priorities must have shape"):
        cf.compare_priorities(good, noise[:10], comm=SELF)


@pytest.mark.mpi
def test_same_comparison_for_any_rank_count(comm):
    X, t, y, tau, rng = _data(900, seed=1)
    other = rng.normal(size=900)
    sl = block_slice(900, comm.size, comm.rank)
    kw = dict(n_estimators=30, nuisance_estimators=20, max_bins=32, random_state=2)
    dist = CausalForest(**kw).fit(X[sl], t[sl], y[sl], comm=comm)
    ref = CausalForest(**kw).fit(X, t, y, comm=SELF)
    got = dist.compare_priorities(tau[sl], other[sl], n_bootstrap=30, comm=comm)
    want = ref.compare_priorities(tau, other, n_bootstrap=30, comm=SELF)
    np.testing.assert_allclose(got.estimate, want.estimate, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(got.stderr, want.stderr, rtol=1e-9, atol=1e-12)


@pytest.mark.mpi
def test_one_ranks_bad_priorities_raise_on_every_rank(comm):
    X, t, y, tau, rng = _data(600, seed=3)
    sl = block_slice(600, comm.size, comm.rank)
    cf = CausalForest(n_estimators=10, nuisance_estimators=10, max_bins=32, random_state=0).fit(X[sl], t[sl], y[sl],
                                                                                            comm=comm)
    bad = tau[sl].copy()
    if comm.rank == comm.size - 1:
        bad[0] = np.nan
    with pytest.raises(ValueError, match="priorities contain NaN"):
        cf.compare_priorities(tau[sl], bad, n_bootstrap=10, comm=comm)
    with pytest.raises(ValueError, match="priorities contain NaN"):
        cf.rank_average_treatment_effect(bad, n_bootstrap=10, comm=comm)

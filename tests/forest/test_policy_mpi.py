"""PolicyTree under real ranks: every rank count and both exchanges give the -np 1 tree,
bit for bit, and the bytes sent are counted (run by `make test` with mpirun -np 2, 3, 4)."""
import numpy as np
import pytest

from forest import PolicyTree
from forest.policy.simulate import xor_design
from native.blocks import block_range
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _data(n, seed):
    d = xor_design(n, d=4, n_actions=4, seed=seed)
    X = d.X.copy()
    X[np.random.default_rng(seed).uniform(size=n) < 0.05, 2] = np.nan   # twins in the search space
    w = np.random.default_rng(seed + 1).uniform(0.2, 3.0, size=n)
    return X, d.rewards, w


def _summary(tree):
    t = tree.tree_
    return (t.feature.tolist(), t.bin_threshold.tolist(), t.missing_left.tolist(), t.left.tolist(),
            np.nan_to_num(t.threshold, nan=-1e300).tolist(), tree.action_.tolist(), t.count.tolist(), tree.objective_)


@pytest.mark.mpi
@pytest.mark.parametrize("depth,max_bins", [(1, 255), (2, 24), (3, 6)])
@pytest.mark.parametrize("exchange", ["rows", "tables", "auto"])
def test_same_tree_for_any_rank_count(comm, rank_slice, depth, max_bins, exchange):
    X, R, w = _data(1200, seed=depth)
    sl = rank_slice(len(X))
    kw = dict(max_depth=depth, max_bins=max_bins, min_samples_leaf=15, exchange=exchange)
    dist = PolicyTree(**kw).fit(X[sl], R[sl], sample_weight=w[sl], comm=comm)
    ref = PolicyTree(**kw).fit(X, R, sample_weight=w, comm=SELF)
    same = _summary(dist) == _summary(ref)
    value_diff = abs(dist.value_ - ref.value_) + abs(dist.value_stderr_ - ref.value_stderr_)
    node_diff = np.nanmax(np.abs(dist.tree_.value - ref.tree_.value))
    search = dist.search_
    assert same, (dist.export_text(), ref.export_text())
    assert value_diff < 1e-9 and node_diff < 1e-9
    assert search["n_ranks"] == comm.size
    if comm.size > 1:
        assert search["bytes_sent_total"] > 0 and search["bytes_sent_max_rank"] > 0
        if depth >= 2:
            predicted = search["predicted_bytes"]
            expected = exchange if exchange != "auto" else min(predicted, key=lambda k: (predicted[k], k))
            assert search["exchange"] == expected
    else:
        assert search["exchange"] in ("none",) and search["bytes_sent_total"] == 0


@pytest.mark.mpi
def test_ranks_without_rows_and_held_out_value(comm):
    """Rank 0 holds no rows (when there are several ranks); evaluate() sums over ranks."""
    X, R, w = _data(900, seed=11)
    cut = np.linspace(0, 900, comm.size + 1).astype(int) if comm.size == 1 else \
        np.concatenate([[0, 0], np.linspace(0, 900, comm.size).astype(int)[1:]])
    sl = slice(cut[comm.rank], cut[comm.rank + 1])
    dist = PolicyTree(2, max_bins=16).fit(X[sl], R[sl], comm=comm)
    ref = PolicyTree(2, max_bins=16).fit(X, R, comm=SELF)
    test_X, test_R, _ = _data(600, seed=12)
    lo, hi = block_range(600, comm.size, comm.rank)
    held = dist.evaluate(test_X[lo:hi], test_R[lo:hi], comm=comm)
    held_ref = ref.evaluate(test_X, test_R, comm=SELF)
    assert _summary(dist) == _summary(ref)
    assert abs(held[0] - held_ref[0]) < 1e-12 and abs(held[1] - held_ref[1]) < 1e-12


@pytest.mark.mpi
@pytest.mark.parametrize("depth", [0, 1, 2, 3])
def test_min_samples_leaf_of_all_rows_over_ranks(comm, rank_slice, depth):
    """min_samples_leaf counts rows over all ranks: above half of them every rank count gives the root
    leaf with the best single action, the -np 1 tree."""
    X, R, w = _data(300, seed=20 + depth)
    sl = rank_slice(len(X))
    trees = []
    for msl in (301, 300, 299, 151):
        kw = dict(max_depth=depth, max_bins=6, min_samples_leaf=msl)
        dist = PolicyTree(**kw).fit(X[sl], R[sl], sample_weight=w[sl], comm=comm)
        ref = PolicyTree(**kw).fit(X, R, sample_weight=w, comm=SELF)
        trees.append((_summary(dist), _summary(ref), dist.tree_.node_count, int(dist.action_[0])))
    best = int(np.argmax((w[:, None] * R).sum(axis=0)))
    for got, want, nodes, action in trees:
        assert got == want and nodes == 1 and action == best

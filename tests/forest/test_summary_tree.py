"""CateSummaryTree (issue 35): a shallow honest tree of the doubly robust scores; node effects against a
NumPy reference, a known two-group effect, model files, refusals, and the same tree at any rank count."""
import numpy as np
import pytest

from native.comm import SelfCommunicator
from forest import CateSummaryTree, CausalForest, model_io
from forest.engine.honest_forest import global_ids
from forest.engine.subsample import ESTIMATION, forest_row_codes

SELF = SelfCommunicator()


def _two_groups(n, seed):
    """tau = 1 + 2 [x0 > 0], randomized treatment."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, 4))
    W = rng.binomial(1, 0.5, n).astype(float)
    return X, W, (1 + 2 * (X[:, 0] > 0)) * W + X[:, 1] + rng.normal(size=n)


@pytest.fixture(scope="module")
def fitted():
    X, W, Y = _two_groups(4000, 0)
    cf = CausalForest(150, random_state=0).fit(X, W, Y, comm=SELF)
    return cf, CateSummaryTree(max_depth=2, random_state=1).fit(cf, X, comm=SELF), X


def test_the_root_split_finds_the_two_groups(fitted):
    cf, st, X = fitted
    t = st.tree_
    assert t.feature[0] == 0 and abs(t.threshold[0]) < 0.1
    for child, truth in ((t.left[0], 1.0), (t.right[0], 3.0)):
        assert abs(st.node_effect_[child] - truth) < 3 * st.node_stderr_[child]
        assert 0.03 < st.node_stderr_[child] < 0.2
    assert st.node_effect_[0] == pytest.approx(np.average(st.predict(X)), abs=0.3)
    text = st.export_text(feature_names=["a", "b", "c", "d"])
    assert text.startswith("if a <= ") and "effect " in text and "95% CI" in text


def test_node_estimates_equal_the_numpy_reference(fitted):
    cf, st, X = fitted
    score = cf.get_scores()
    gids, _ = global_ids(SELF, len(X))
    est = forest_row_codes(st.forest_.sampling_, 1, gids)[0] == ESTIMATION
    leaf = st.apply(X)
    t = st.tree_
    for node in range(t.node_count):
        if t.feature[node] >= 0:
            continue
        s = score[est & (leaf == node)]
        n = len(s)
        assert st.node_rows_[node] == n
        assert st.node_effect_[node] == pytest.approx(s.mean(), rel=1e-12)
        se = np.sqrt(((s - s.mean()) ** 2).sum() * n / (n - 1)) / n
        assert st.node_stderr_[node] == pytest.approx(se, rel=1e-10)


def test_model_file_and_refusals(fitted):
    cf, st, X = fitted
    back = model_io.loads(model_io.dumps(st))
    np.testing.assert_array_equal(back.predict(X), st.predict(X))
    assert back.export_text() == st.export_text()
    with pytest.raises(ValueError, match="max_depth"):
        CateSummaryTree(max_depth=0).fit(cf, X, comm=SELF)
    with pytest.raises(ValueError, match="rows"):
        CateSummaryTree().fit(cf, X[:10], comm=SELF)
    rng = np.random.default_rng(2)
    arms = rng.integers(0, 3, len(X))
    multi = CausalForest(8, random_state=0).fit(X, arms, X[:, 0] * (arms > 0) + rng.normal(size=len(X)), comm=SELF)
    with pytest.raises(ValueError, match="one effect"):
        CateSummaryTree().fit(multi, X, comm=SELF)


@pytest.mark.mpi
def test_same_tree_at_any_rank_count(comm):
    X, W, Y = _two_groups(1600, 3)
    lo, hi = len(W) * comm.rank // comm.size, len(W) * (comm.rank + 1) // comm.size
    kw = dict(n_estimators=16, nuisance_estimators=20, random_state=2)
    dist_cf = CausalForest(**kw).fit(X[lo:hi], W[lo:hi], Y[lo:hi], comm=comm)
    ref_cf = CausalForest(**kw).fit(X, W, Y, comm=SELF)
    dist = CateSummaryTree(random_state=4).fit(dist_cf, X[lo:hi], comm=comm)
    ref = CateSummaryTree(random_state=4).fit(ref_cf, X, comm=SELF)
    for key in ("feature", "bin_threshold", "left", "right"):
        np.testing.assert_array_equal(getattr(dist.tree_, key), getattr(ref.tree_, key))
    np.testing.assert_array_equal(dist.node_rows_, ref.node_rows_)
    np.testing.assert_allclose(dist.node_effect_, ref.node_effect_, rtol=0, atol=1e-9)
    np.testing.assert_allclose(dist.node_stderr_, ref.node_stderr_, rtol=0, atol=1e-9)

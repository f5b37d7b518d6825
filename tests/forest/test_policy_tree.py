"""PolicyTree: known answers (an interaction greedy search cannot see), the value and its
standard error, weights, prediction, text, model files and input errors."""
import numpy as np
import pytest

from forest import PolicyTree

from forest.io import model_io
from forest.policy.simulate import xor_design
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def _greedy_depth2(X, R, **kw):
    """Greedy reference: best depth-1 split at the root, then the best depth-1 tree per child."""
    root = PolicyTree(1, **kw).fit(X, R, comm=SELF)
    if root.tree_.node_count == 1:
        return lambda Z: root.predict(Z)
    side = root.apply(X)
    kids = {leaf: PolicyTree(1, **kw).fit(X[side == leaf], R[side == leaf], comm=SELF)
            for leaf in np.unique(side)}

    def predict(Z):
        leaf = root.apply(Z)
        out = np.empty(len(Z), dtype=np.int64)
        for k, tree in kids.items():
            out[leaf == k] = tree.predict(Z[leaf == k])
        return out
    return predict


def test_exact_depth2_finds_the_interaction_greedy_misses():
    """XOR design: the best policy is worth 0.65, the best single split 0.3."""
    train, test = xor_design(4000, d=5, seed=1), xor_design(20000, d=5, seed=2)
    exact = PolicyTree(2, max_bins=32).fit(train.X, train.rewards, comm=SELF)
    greedy = _greedy_depth2(train.X, train.rewards, max_bins=32)
    v_exact = test.policy_value(exact.predict(test.X))
    v_greedy = test.policy_value(greedy(test.X))
    assert test.best_value == pytest.approx(0.65, abs=0.01)
    assert v_exact > 0.62, exact.export_text()
    assert v_greedy < 0.5
    # the splits are the two informative features, at (about) zero
    t = exact.tree_
    inner = ~t.is_leaf
    assert set(t.feature[inner].tolist()) == {0, 1}
    assert np.all(np.abs(t.threshold[inner]) < 0.07)
    # honest value on held-out rewards agrees with the truth within its standard error
    value, se = exact.evaluate(test.X, test.rewards, comm=SELF)
    assert abs(value - v_exact) < 4 * se and se < 0.02


def test_value_and_standard_errors_match_direct_formulas():
    d = xor_design(3000, d=3, seed=5)
    w = np.random.default_rng(0).uniform(0.5, 2.0, size=3000)
    tree = PolicyTree(2, max_bins=16, min_samples_leaf=20).fit(d.X, d.rewards, sample_weight=w, comm=SELF)
    pi = tree.predict(d.X)
    r = d.rewards[np.arange(3000), pi]
    mean = np.sum(w * r) / w.sum()
    n_eff = w.sum() ** 2 / np.sum(w ** 2)
    se = np.sqrt(np.sum(w ** 2 * (r - mean) ** 2) * n_eff / (n_eff - 1)) / w.sum()
    assert tree.value_ == pytest.approx(mean, rel=1e-10)
    assert tree.value_stderr_ == pytest.approx(se, rel=1e-6)
    consts = (w[:, None] * d.rewards).sum(0) / w.sum()
    np.testing.assert_allclose(tree.action_value_, consts, rtol=1e-10)
    assert tree.gain_ == pytest.approx(mean - consts.max(), rel=1e-9)
    assert tree.objective_ == pytest.approx(np.sum(w * r), rel=1e-9)
    leaf = tree.apply(d.X)
    for node in np.unique(leaf):
        rows = leaf == node
        np.testing.assert_allclose(tree.tree_.value[node], (w[rows, None] * d.rewards[rows]).sum(0) / w[rows].sum(),
                                   rtol=1e-10)
        assert tree.tree_.count[node] == rows.sum() >= 20
    assert tree.tree_.gain[0] > 0


def test_integer_weights_equal_repeated_rows():
    d = xor_design(600, d=3, seed=7)
    X = np.round(d.X * 3) / 3  # 7 distinct values: one bin each, whichever rows are binned
    w = np.random.default_rng(1).integers(1, 4, size=600)
    weighted = PolicyTree(2, max_bins=8).fit(X, d.rewards, sample_weight=w, comm=SELF)
    rep = np.repeat(np.arange(600), w)
    repeated = PolicyTree(2, max_bins=8).fit(X[rep], d.rewards[rep], comm=SELF)
    assert weighted.objective_ == pytest.approx(repeated.objective_, rel=1e-9)
    assert np.array_equal(weighted.predict(X), repeated.predict(X))
    assert weighted.tree_.structure()[0].tolist() == repeated.tree_.structure()[0].tolist()


def test_missing_values_go_where_they_pay():
    """Rows with x0 missing prefer action 1: the split must send them to action 1's side."""
    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, size=(2000, 2))
    miss = rng.uniform(size=2000) < 0.2
    X[miss, 0] = np.nan
    mu = np.zeros((2000, 2))
    mu[:, 1] = np.where(miss | (np.nan_to_num(X[:, 0]) < -0.5), 1.0, -1.0)
    tree = PolicyTree(1, max_bins=16).fit(X, mu + 0.1 * rng.normal(size=mu.shape), comm=SELF)
    pred = tree.predict(X)
    assert np.all(pred[miss] == 1)
    assert np.mean(pred == (mu[:, 1] > 0)) > 0.98  # the boundary -0.5 lies inside a bin
    assert np.all(tree.predict(np.array([[np.nan, 0.0], [-0.9, 0.0], [0.3, 0.0]])) == [1, 1, 0])


def test_depth_zero_and_constant_rewards():
    d = xor_design(200, d=2, seed=0)
    zero = PolicyTree(0).fit(d.X, d.rewards, comm=SELF)
    assert zero.tree_.node_count == 1 and zero.action_[0] == np.argmax(d.rewards.sum(0))
    flat = PolicyTree(2).fit(d.X, np.ones((200, 3)), comm=SELF)
    assert flat.tree_.node_count == 1 and flat.action_[0] == 0  # ties: no split, lowest action


def test_export_text_and_model_file_round_trip(tmp_path):
    d = xor_design(1500, d=3, seed=4)
    tree = PolicyTree(2, max_bins=16).fit(d.X, d.rewards, comm=SELF)
    text = tree.export_text(feature_names=["age", "score", "noise"], action_names=["none", "coupon", "email"])
    assert text.startswith("if ") and "else:" in text and "coupon" in text and "rows" in text
    assert text.count("\n") == 2 * (tree.tree_.node_count - tree.tree_.n_leaves) + tree.tree_.n_leaves - 1
    path = str(tmp_path / "policy.model")
    model_io.save(tree, path)
    back = model_io.load(path, expect=PolicyTree)
    assert np.array_equal(back.predict(d.X), tree.predict(d.X))
    assert back.export_text() == tree.export_text() and back.search_ == tree.search_


@pytest.mark.parametrize("kwargs,match", [
    (dict(max_depth=4), "max_depth"), (dict(max_depth=2, min_samples_leaf=0), "min_samples_leaf"),
    (dict(max_bins=1), "max_bins"), (dict(max_depth=3, max_bins=100), "max_bins <= 64"),
    (dict(exchange="bogus"), "exchange"), (dict(random_state=-1), "random_state"),
])
def test_bad_parameters(kwargs, match):
    d = xor_design(100, d=2, seed=0)
    with pytest.raises(ValueError, match=match):
        PolicyTree(**kwargs).fit(d.X, d.rewards, comm=SELF)


def test_bad_inputs():
    d = xor_design(100, d=2, seed=0)
    bad = d.rewards.copy()
    bad[3, 1] = np.nan
    with pytest.raises(ValueError, match="rewards contain NaN"):
        PolicyTree().fit(d.X, bad, comm=SELF)
    with pytest.raises(ValueError, match="rewards must have shape"):
        PolicyTree().fit(d.X, d.rewards[:50], comm=SELF)
    with pytest.raises(ValueError, match="sample_weight"):
        PolicyTree().fit(d.X, d.rewards, sample_weight=-np.ones(100), comm=SELF)
    X = d.X.copy()
    X[0, 0] = np.inf
    with pytest.raises(ValueError, match="infinity"):
        PolicyTree().fit(X, d.rewards, comm=SELF)
    tree = PolicyTree(1).fit(d.X, d.rewards, comm=SELF)
    with pytest.raises(ValueError, match="features"):
        tree.predict(d.X[:, :1])
    with pytest.raises(ValueError, match="actions"):
        tree.evaluate(d.X, d.rewards[:, :2], comm=SELF)


@pytest.mark.parametrize("depth", [0, 1, 2, 3])
@pytest.mark.parametrize("extra", [1, 0, -1, -99])   # min_samples_leaf = n + extra > n / 2
def test_min_samples_leaf_beyond_half_the_rows_gives_the_root_leaf(depth, extra):
    """No split can keep min_samples_leaf rows on both sides: the tree is the root alone with the best
    single action (as scikit-learn's trees), never the 'differ from the search value -inf' RuntimeError."""
    rng = np.random.default_rng(depth)
    X, R = rng.normal(size=(200, 3)), rng.normal(size=(200, 4))
    w = rng.uniform(0.5, 2.0, size=200)
    tree = PolicyTree(depth, min_samples_leaf=200 + extra, max_bins=8).fit(X, R, sample_weight=w, comm=SELF)
    best = int(np.argmax((w[:, None] * R).sum(axis=0)))
    assert tree.tree_.node_count == 1 and tree.action_.tolist() == [best]
    assert np.array_equal(tree.predict(X), np.full(200, best))
    assert abs(tree.objective_ - (w * R[:, best]).sum()) < 1e-9
    assert tree.gain_ == 0.0 and abs(tree.value_ - tree.action_value_[best]) < 1e-12
    assert tree.export_text().startswith(f"action {best}  (200 rows")


def test_export_text_names_the_fitted_columns():
    pd = pytest.importorskip("pandas")
    d = xor_design(1500, d=3, seed=4)
    df = pd.DataFrame(d.X, columns=["age", "score", "noise"])
    tree = PolicyTree(2, max_bins=16).fit(df, d.rewards, comm=SELF)
    plain = PolicyTree(2, max_bins=16).fit(d.X, d.rewards, comm=SELF)
    assert list(tree.feature_names_in_) == ["age", "score", "noise"]
    text = tree.export_text()
    assert text == plain.export_text(feature_names=["age", "score", "noise"])
    assert "age <= " in text and "x0" not in text and "x1" not in text
    assert "x0 <= " in plain.export_text()          # no names fitted: x0, x1, ...
    assert "a <= " in tree.export_text(feature_names=["a", "b", "c"])   # an explicit argument still wins
    with pytest.raises(ValueError, match="feature_names must be 3 distinct strings"):
        tree.export_text(feature_names=["a", "b"])

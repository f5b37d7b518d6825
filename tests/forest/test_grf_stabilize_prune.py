"""grf's ``stabilize.splits`` and ``honesty.prune.leaves`` (issue 38).

``stabilize_splits=False`` (CausalForest, InstrumentalForest): the ``"rows"`` constraint of
the effect criteria, grf's regression rule on the pseudo-outcomes. Its compiled gains
against a row-by-row reference (grf's score from per-row pseudo-outcomes, the rows rule
counted on the rows), and forests that grow past the treated-row count.

``honesty_prune_leaves=False``: empty leaves stay empty and a tree whose leaf is empty for
a point is left out of that point's estimate. Predictions, out-of-bag predictions and
forest weights against a NumPy reference over the trees' leaf values; model files; the
same forest at any rank count.
"""
import numpy as np
import pytest

from forest import model_io
from forest.criteria.causal import (CausalCriterion, CausalRowsRecord, CausalScalarRowsRecord,
                                    split_gain_reference)
from forest.criteria.instrumental import InstrumentalCriterion, InstrumentalRowsRecord
from forest.criteria.instrumental import split_gain_reference as iv_split_gain_reference
from forest.engine.predictor import predict_leaves
from forest.engine.subsample import BOTH, OUT, STRUCTURE, forest_row_codes
from forest.estimators.causal_forest import CausalForest
from forest.estimators.instrumental_forest import InstrumentalForest
from forest.estimators.regression_forest import RegressionForest
from native.comm import SelfCommunicator
from tests.conftest import block_slice

from causal_helpers import causal_rows
from criterion_checks import assert_count_shortcuts_sound, random_cuts

SELF = SelfCommunicator()


# ---------------------------------------------------------------------- the "rows" constraint
def _least(leaf, alpha, n):
    return max(leaf, int(np.ceil(alpha * n)))


#: (K, M, min_samples_leaf, alpha): the scalar record, arms, outcomes.
ROWS_CASES = [(1, 1, 3, 0.1), (2, 1, 3, 0.2), (1, 2, 4, 0.2)]


@pytest.mark.parametrize("case", ROWS_CASES)
def test_causal_rows_gain_equals_rowwise_reference(case):
    """grf's score from per-row pseudo-outcomes where each child has its rows, else -inf; a child
    without treated rows (which "arms" refuses) passes."""
    K, M, leaf, alpha = case
    crit = CausalCriterion(K, M, min_samples_leaf=leaf, alpha=alpha, constraint="rows")
    arms = CausalCriterion(K, M, min_samples_leaf=leaf, alpha=alpha, constraint="arms")
    comp = crit.compiled()
    scalar = K == 1 and M == 1
    assert isinstance(comp.record, CausalScalarRowsRecord if scalar else CausalRowsRecord)
    rng = np.random.default_rng(K * 10 + M)
    n_fin = n_inf = n_no_treated = 0
    for _ in range(25):
        n = int(rng.integers(12, 50))
        wc, y, g, ind = causal_rows(rng, n, K, M, "arms", p_arm=[0.8] + [0.2 / K] * K)
        ch = crit.make_channels(wc, y, g, ind)
        parent = ch.sum(axis=0)
        cuts, lefts = random_cuts(rng, ch, 15)
        ref = np.array([split_gain_reference(wc, y, g, c, crit.precondition)
                        if min(c.sum(), n - c.sum()) >= _least(leaf, alpha, n) else -np.inf for c in cuts])
        got = comp.gains_of(lefts, parent - lefts, parent)
        vec = crit.gain(lefts, parent - lefts, parent)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
        np.testing.assert_array_equal(np.isinf(vec), np.isinf(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-8)
        np.testing.assert_allclose(vec[fin], got[fin], rtol=1e-9, atol=1e-12)
        treated_l = cuts.astype(float) @ ind                 # each arm's rows on the left
        no_treated = fin & ((treated_l == 0).any(axis=1) | (treated_l == ind.sum(axis=0)).any(axis=1))
        assert np.isinf(arms.gain(lefts[no_treated], parent - lefts[no_treated], parent)).all()
        n_no_treated += no_treated.sum()
        n_fin += fin.sum()
        n_inf += (~fin).sum()
    assert n_fin > 40 and n_inf > 40 and n_no_treated > 5


def _iv_rows(rng, n):
    z = (rng.random(n) < 0.2).astype(float)
    u = rng.normal(size=n)
    w = 0.8 * z + u + rng.normal(size=n)
    y = w + 2.0 * u + rng.normal(size=n)
    return z - 0.2, w - w.mean(), y - y.mean(), rng.uniform(0.5, 2.0, n)


def test_instrumental_rows_gain_equals_rowwise_reference():
    leaf, alpha = 3, 0.1
    crit = InstrumentalCriterion(min_samples_leaf=leaf, alpha=alpha, constraint="rows")
    comp = crit.compiled()
    assert isinstance(comp.record, InstrumentalRowsRecord)
    rng = np.random.default_rng(5)
    n_fin = n_inf = 0
    for _ in range(25):
        n = int(rng.integers(12, 50))
        z, w, y, g = _iv_rows(rng, n)
        ch = crit.make_channels(z, w, y, g)
        parent = ch.sum(axis=0)
        cuts, lefts = random_cuts(rng, ch, 15)
        ref = np.array([iv_split_gain_reference(z, w, y, g, c)
                        if min(c.sum(), n - c.sum()) >= _least(leaf, alpha, n) else -np.inf for c in cuts])
        got = comp.gains_of(lefts, parent - lefts, parent)
        vec = crit.gain(lefts, parent - lefts, parent)
        np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
        np.testing.assert_array_equal(np.isinf(vec), np.isinf(ref))
        fin = np.isfinite(ref)
        np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-8)
        np.testing.assert_allclose(vec[fin], got[fin], rtol=1e-9, atol=1e-12)
        n_fin += fin.sum()
        n_inf += (~fin).sum()
    assert n_fin > 40 and n_inf > 40


def _rows_criteria(pen):
    return [CausalCriterion(1, 1, min_samples_leaf=3, alpha=0.1, imbalance_penalty=pen, constraint="rows"),
            CausalCriterion(2, 1, min_samples_leaf=2, alpha=0.2, imbalance_penalty=pen, constraint="rows"),
            InstrumentalCriterion(min_samples_leaf=3, alpha=0.1, imbalance_penalty=pen, constraint="rows")]


def _channels(rng, crit, n):
    if isinstance(crit, InstrumentalCriterion):
        return crit.make_channels(*_iv_rows(rng, n))
    wc, y, g, ind = causal_rows(rng, n, crit.K, crit.M, "arms")
    return crit.make_channels(wc, y, g, ind)


@pytest.mark.parametrize("which", range(3))
def test_rows_penalty_is_in_rows(which):
    rng = np.random.default_rng(7)
    plain, pen = _rows_criteria(0.0)[which], _rows_criteria(0.7)[which]
    ch = _channels(rng, plain, 40)
    parent = ch.sum(axis=0)
    cuts = rng.random((30, 40)) < 0.5
    lefts = cuts.astype(float) @ ch
    a = plain.compiled().gains_of(lefts, parent - lefts, parent)
    b = pen.compiled().gains_of(lefts, parent - lefts, parent)
    nl = cuts.sum(axis=1)
    fin = np.isfinite(a)
    assert fin.sum() > 10
    np.testing.assert_allclose(b[fin], a[fin] - 0.7 * (1.0 / nl[fin] + 1.0 / (40 - nl[fin])), rtol=1e-12)
    np.testing.assert_allclose(pen.gain(lefts, parent - lefts, parent)[fin], b[fin], rtol=1e-12)


@pytest.mark.parametrize("which", range(3))
def test_rows_count_shortcuts_never_drop_a_finite_gain(which):
    """sides_ok false => gain -inf; right_exhausted true => every later cut of a scan is -inf."""
    crit = _rows_criteria(0.0)[which]
    assert_count_shortcuts_sound(crit, lambda rng, n: _channels(rng, crit, n), np.random.default_rng(2), 20)


# ---------------------------------------------------------------------- stabilize_splits on forests
def _rare_arm(n=600, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    t = (rng.random(n) < 0.05).astype(float)
    y = X[:, 0] * t + X[:, 1] + rng.normal(size=n)
    return X, t, y


def _treated_structure_rows(est, X, t):
    """Per leaf of every tree: (structure rows, treated structure rows)."""
    packed = est.estimators_
    n_trees = len(packed["tree_offsets"]) - 1
    codes = forest_row_codes(est.sampling_, n_trees, np.arange(len(X)))
    leaves = predict_leaves(packed, X)
    out = []
    for b in range(n_trees):
        grow = (codes[b] == STRUCTURE) | (codes[b] == BOTH)
        leaf = leaves[grow, b]
        out.append(np.stack([np.bincount(leaf), np.bincount(leaf, weights=t[grow])], axis=1)[np.unique(leaf)])
    return np.concatenate(out)


def test_stabilize_splits_false_grows_past_the_rare_arm():
    """5% treated: with the treatment taken into account every leaf holds min_samples_leaf treated
    and control structure rows; without, trees grow deeper and leaves may hold fewer treated rows."""
    X, t, y = _rare_arm()
    n = len(y)
    leaf = 5
    fits = {}
    for stab in (True, False):
        kw = dict(n_estimators=8, min_samples_leaf=leaf, max_bins=32, random_state=0, stabilize_splits=stab)
        # centring given: no nuisance forests (and the rows record's kernels compile on their own)
        fits[stab] = CausalForest(**kw).fit(X, t, y, y_hat=np.zeros(n), t_hat=np.full(n, 0.05), comm=SELF)
    n_leaves = {s: int((f.estimators_["feature"] < 0).sum()) for s, f in fits.items()}
    assert n_leaves[False] > 2 * n_leaves[True]
    stable, rows = _treated_structure_rows(fits[True], X, t), _treated_structure_rows(fits[False], X, t)
    assert (stable[:, 1] >= leaf).all() and (stable[:, 0] - stable[:, 1] >= leaf).all()
    assert (rows[:, 0] >= leaf).all()                       # the rows rule still holds
    assert (rows[:, 1] < leaf).mean() > 0.3                 # the treated count does not
    assert np.isfinite(fits[False].predict(X[:50])).mean() > 0.5


def test_instrumental_forest_passes_the_constraint_on():
    """The instrumental forest's rows record is the one tested above (its forest-level growth is the
    causal forest's loop; not grown here, to spare a compilation of the growth kernels)."""
    assert isinstance(InstrumentalForest(stabilize_splits=False)._criterion().compiled().record,
                      InstrumentalRowsRecord)
    assert InstrumentalForest()._criterion().constraint == "sign"


# ---------------------------------------------------------------------- honesty_prune_leaves
def _regression_data(n=400, seed=1):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 3))
    return X, X[:, 0] + np.sin(2 * X[:, 1]) + 0.5 * rng.normal(size=n)


def _tree_values(est, X):
    packed = est.estimators_
    index = predict_leaves(packed, X) + packed["tree_offsets"][None, :-1]
    return packed["value"][index]                            # (n, trees, width)


def _ratio_reference(values, k, use):
    """The forest ratio over the trees in ``use`` (n, trees): sum num / sum den, NaN without trees."""
    use = use & (values[..., k] > 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (np.where(use[..., None], values[..., :k], 0).sum(1)
                / np.where(use, values[..., k + 1], 0).sum(1)[:, None])[:, 0]


@pytest.fixture(scope="module")
def unpruned():
    X, y = _regression_data()
    kw = dict(n_estimators=4, min_node_size=1, max_bins=32, random_state=0)
    return (X, y, RegressionForest(honesty_prune_leaves=False, **kw).fit(X, y, comm=SELF),
            RegressionForest(**kw).fit(X, y, comm=SELF))


def test_unpruned_regression_predictions_skip_empty_trees(unpruned):
    X, y, est, pruned = unpruned
    Xq = np.random.default_rng(2).normal(size=(3000, 3))
    values = _tree_values(est, Xq)
    empty = values[..., 1] == 0
    assert empty.any(axis=1).mean() > 0.5                   # most points meet an empty leaf
    ref = _ratio_reference(values, 1, np.ones(empty.shape, bool))
    got = est.predict(Xq)
    assert np.isnan(got).sum() == empty.all(axis=1).sum() > 0      # NaN where every tree is empty (grf)
    np.testing.assert_allclose(got, ref, rtol=1e-12, equal_nan=True)
    # the pruned forest of the same trees: no empty leaf, every point predicted
    assert (pruned.estimators_["value"][:, 1] > 0).all() and np.isfinite(pruned.predict(Xq)).all()
    np.testing.assert_array_equal(pruned.estimators_["feature"], est.estimators_["feature"])


def test_unpruned_forest_weights_sum_to_one_and_reproduce_predict(unpruned):
    X, y, est, _ = unpruned
    Xq = np.random.default_rng(2).normal(size=(400, 3))
    pred = est.predict(Xq)
    w = est.get_forest_weights(Xq).toarray()
    ok = np.isfinite(pred)
    np.testing.assert_allclose(w[ok].sum(axis=1), 1.0, rtol=1e-12)
    assert (w[~ok] == 0).all()
    np.testing.assert_allclose(w[ok] @ y, pred[ok], rtol=1e-10)


def test_unpruned_out_of_bag_predictions_skip_empty_trees(unpruned):
    X, y, est, _ = unpruned
    values = _tree_values(est, X)
    codes = forest_row_codes(est.sampling_, values.shape[1], np.arange(len(X)))
    oob = (codes == OUT).T
    ref = _ratio_reference(values, 1, oob)
    every = ~oob.any(axis=1)                                 # rows every tree drew: the forest's prediction
    ref[every] = est.predict(X[every])
    np.testing.assert_allclose(est.oob_prediction_, ref, rtol=1e-12, equal_nan=True)
    np.testing.assert_allclose(est.oob_predict(X, comm=SELF), ref, rtol=1e-12, equal_nan=True)
    var = est.predict_var(X[:50])
    assert var.shape == (50,) and np.isfinite(var).any()


def test_unpruned_causal_forest_matches_the_reference():
    rng = np.random.default_rng(3)
    n = 400
    X = rng.normal(size=(n, 3))
    t = (rng.random(n) < 0.5).astype(float)
    y = X[:, 0] * t + X[:, 1] + rng.normal(size=n)
    kw = dict(n_estimators=8, min_samples_leaf=1, max_bins=32, random_state=0, honesty_prune_leaves=False)
    cf = CausalForest(**kw).fit(X, t, y, y_hat=np.zeros(n), t_hat=np.full(n, 0.5), comm=SELF)
    Xq = rng.normal(size=(300, 3))
    v = _tree_values(cf, Xq)                                 # (g, w, y, wy, ww, count) per tree
    use = v[..., 5] > 0
    assert (~use).any(axis=1).mean() > 0.2
    g, w, yy, wy, ww = (np.where(use, v[..., j], 0).sum(1) / use.sum(1) for j in range(5))
    with np.errstate(invalid="ignore", divide="ignore"):
        ref = (g * wy - w * yy) / (g * ww - w * w)
    got = cf.predict(Xq)
    np.testing.assert_allclose(got, ref, rtol=1e-9, equal_nan=True)
    lo, hi = cf.predict_interval(Xq)
    ok = np.isfinite(lo)
    assert ok.mean() > 0.5
    np.testing.assert_allclose((lo + hi)[ok] / 2, got[ok], rtol=1e-9, atol=1e-9)   # around predict
    weights = cf.get_forest_weights(Xq).toarray()
    np.testing.assert_allclose(weights.sum(axis=1)[np.isfinite(got)], 1.0, rtol=1e-12)


def test_model_files_keep_both_parameters(unpruned, tmp_path):
    X, y, est, _ = unpruned
    path = str(tmp_path / "rf.model")
    model_io.save(est, path)
    back = model_io.load(path)
    assert back.honesty_prune_leaves is False
    Xq = np.random.default_rng(4).normal(size=(100, 3))
    np.testing.assert_array_equal(back.predict(Xq), est.predict(Xq))
    rng = np.random.default_rng(5)
    t = (rng.random(300) < 0.5).astype(float)
    cf = CausalForest(4, max_bins=32, random_state=0, stabilize_splits=False, honesty_prune_leaves=False).fit(
        X[:300], t, y[:300], y_hat=np.zeros(300), t_hat=np.full(300, 0.5), comm=SELF)
    model_io.save(cf, path)
    back = model_io.load(path)
    assert back.get_params()["stabilize_splits"] is False and back.get_params()["honesty_prune_leaves"] is False
    np.testing.assert_array_equal(back.predict(Xq), cf.predict(Xq))


@pytest.mark.parametrize("make", [lambda: RegressionForest(honesty_prune_leaves=1),
                                  lambda: CausalForest(stabilize_splits="no"),
                                  lambda: InstrumentalForest(honesty_prune_leaves=None)])
def test_parameters_are_booleans(make):
    with pytest.raises(TypeError, match="must be true or false"):
        make()._check_params()


# ---------------------------------------------------------------------- rank counts
@pytest.mark.mpi
def test_same_unpruned_unstabilised_forests_at_any_rank_count(comm):
    """Each rank fits its block; the forests equal the single-process fits on all rows (the leaf sums
    to rounding: the histograms' reduction order depends on the rank count), empty leaves alike."""
    X, y = _regression_data(360, seed=6)
    t = (np.random.default_rng(7).random(360) < 0.5).astype(float)
    sl = block_slice(360, comm.size, comm.rank)
    Xq = np.random.default_rng(8).normal(size=(300, 3))
    kw = dict(n_estimators=6, min_node_size=1, max_bins=32, random_state=0, honesty_prune_leaves=False)
    dist = RegressionForest(**kw).fit(X[sl], y[sl], comm=comm)
    ref = RegressionForest(**kw).fit(X, y, comm=SELF)
    pairs = [(dist.predict(Xq), ref.predict(Xq)), (dist.oob_prediction_, ref.oob_prediction_[sl]),
             (dist.predict_var(Xq), ref.predict_var(Xq))]
    same = [np.array_equal(dist.estimators_["feature"], ref.estimators_["feature"]),
            np.array_equal(dist.estimators_["value"][:, 1], ref.estimators_["value"][:, 1]),   # counts
            (ref.estimators_["value"][:, 1] == 0).any()]                                     # empty leaves
    hats = dict(y_hat=np.zeros(360), t_hat=np.full(360, 0.5))
    kw = dict(n_estimators=6, min_samples_leaf=2, max_bins=32, random_state=0, stabilize_splits=False,
              honesty_prune_leaves=False)
    dist = CausalForest(**kw).fit(X[sl], t[sl], y[sl], comm=comm, **{k: v[sl] for k, v in hats.items()})
    ref = CausalForest(**kw).fit(X, t, y, comm=SELF, **hats)
    pairs += [(dist.predict(Xq), ref.predict(Xq)), (dist.oob_predict(), ref.oob_predict()[sl]),
              (dist.predict_var(Xq), ref.predict_var(Xq))]
    same += [np.array_equal(dist.estimators_["feature"], ref.estimators_["feature"]),
             np.array_equal(dist.estimators_["value"][:, 5], ref.estimators_["value"][:, 5]),
             (ref.estimators_["value"][:, 5] == 0).any()]
    same += [np.array_equal(np.isnan(a), np.isnan(b)) and np.allclose(a, b, rtol=1e-9, atol=1e-12, equal_nan=True)
             for a, b in pairs]
    assert all(same), str(same)

"""SurvivalForest (issue 33): the log-rank rule against a raw-row reference, the curves against
forest-weighted Kaplan-Meier, known survival curves, out of bag, files, bad input, ranks."""
import numpy as np
import pytest

from native.comm import SelfCommunicator
from forest import SurvivalForest, model_io
from forest.analysis.survival import concordance_index, kaplan_meier
from forest.criteria.survival import LogRankCriterion, failure_grid, time_labels
from forest.engine.leaf_survival import survival_curves
from forest.engine.local_growth import grow_subtrees, grow_subtrees_reference

SELF = SelfCommunicator()


def _design(n, seed, p=5, censor_scale=2.0):
    """Exponential failures with rate exp(x0 + 0.5 [x1 > 0]), exponential censoring."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, size=(n, p))
    rate = np.exp(X[:, 0] + 0.5 * (X[:, 1] > 0))
    failure = rng.exponential(1 / rate)
    censor = rng.exponential(censor_scale, n)
    return X, np.minimum(failure, censor), failure <= censor, rng


def _true_survival(X, times):
    rate = np.exp(X[:, 0] + 0.5 * (X[:, 1] > 0))
    return np.exp(-rate[:, None] * np.asarray(times)[None, :])


def _log_rank_reference(time, event, left):
    """The two-sample log-rank chi-square from raw rows (grf's terms: stop where fewer than 2 are at risk)."""
    num = var = 0.0
    for tk in np.unique(time[event]):
        at_risk = time >= tk
        y, yl = at_risk.sum(), (at_risk & left).sum()
        if y < 2:
            break
        d, dl = (event & (time == tk)).sum(), (event & (time == tk) & left).sum()
        num += dl - yl * d / y
        var += yl / y * (1 - yl / y) * (y - d) / (y - 1) * d
    return num * num / var if var > 0 else 0.0


def test_log_rank_gain_is_the_two_sample_statistic():
    rng = np.random.default_rng(0)
    n = 200
    time = np.round(rng.exponential(1.0, n), 1)          # ties, censored rows tied with failures
    event = rng.random(n) < 0.7
    grid = failure_grid(time, event, 255, SELF)
    np.testing.assert_array_equal(grid, np.unique(time[event]))   # few failure times: the grid is all of them
    crit = LogRankCriterion(len(grid), alpha=0.0)
    ch = crit.make_channels(time_labels(time, grid), event, None)
    parent = ch.sum(0)
    for trial in range(20):
        left = rng.random(n) < rng.uniform(0.1, 0.9)
        gain = crit.gain(ch[left].sum(0), ch[~left].sum(0), parent)
        assert gain == pytest.approx(_log_rank_reference(time, event, left), rel=1e-10, abs=1e-12)
    # symmetric in the two children
    left = rng.random(n) < 0.4
    assert crit.gain(ch[left].sum(0), ch[~left].sum(0), parent) == pytest.approx(
        crit.gain(ch[~left].sum(0), ch[left].sum(0), parent), rel=1e-12)


def test_compiled_gain_equals_vectorised_and_constraints_bind():
    rng = np.random.default_rng(1)
    n = 120
    time = rng.exponential(1.0, n)
    event = rng.random(n) < 0.6
    grid = failure_grid(time, event, 16, SELF)
    assert len(grid) <= 16
    for alpha, leaf in ((0.0, 1), (0.2, 10), (0.05, 30)):
        crit = LogRankCriterion(len(grid), alpha=alpha, min_samples_leaf=leaf)
        ch = crit.make_channels(time_labels(time, grid), event, rng.uniform(0.5, 2.0, n))
        parent = ch.sum(0)
        order = np.argsort(rng.normal(size=n))
        lefts = np.cumsum(ch[order], axis=0)[:-1]
        rights = parent - lefts
        ref = crit.gain(lefts, rights, parent)
        got = crit.compiled().gains_of(lefts, rights, parent)
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(ref))
        np.testing.assert_allclose(got[np.isfinite(got)], ref[np.isfinite(ref)], rtol=1e-12, atol=1e-12)
        assert 0 < np.isfinite(ref).sum() < n - 1 or (alpha == 0 and leaf == 1)
        need = max(np.ceil(alpha * n), 1)
        fails_left = np.cumsum(event[order])[:-1]
        assert np.all(np.isinf(ref[(fails_left < need) | (event.sum() - fails_left < need)]))
    # one failure time in the node: nothing to split on
    crit = LogRankCriterion(1, alpha=0.0)
    ch = crit.make_channels(np.ones(10, dtype=int), np.ones(10, bool), None)
    assert np.all(np.isinf(crit.gain(ch[:5].sum(0), ch[5:].sum(0), ch.sum(0))))


@pytest.mark.parametrize("hist_rows", [None, 0])
def test_grow_subtrees_log_rank_matches_reference(hist_rows):
    rng = np.random.default_rng(3)
    n_rows, n_features, missing_bin = 300, 3, 12
    binned = rng.integers(0, 10, size=(n_features, n_rows)).astype(np.uint8)
    binned[rng.random((n_features, n_rows)) < 0.1] = missing_bin
    time = rng.exponential(1.0 / np.exp(0.2 * binned[0]))
    event = rng.random(n_rows) < 0.75
    grid = failure_grid(time, event, 24, SELF)
    crit = LogRankCriterion(len(grid), alpha=0.05, min_samples_leaf=2)
    ch = crit.make_channels(time_labels(time, grid), event, rng.uniform(0.5, 2.0, n_rows))
    rows = np.concatenate([np.sort(rng.choice(n_rows, 180, replace=False)), np.sort(rng.choice(n_rows, 60,
                                                                                            replace=False))])
    starts, tree, node, depth, nxt = np.array([0, 180, 240]), np.array([0, 1]), np.array([0, 0]), np.zeros(2, int), \
        np.array([1, 1])
    kw = dict(min_samples_split=16.0, mtry=None, seed=4)
    got = grow_subtrees(binned, ch, rows, starts, tree, node, depth, nxt, np.array([0, 1]), crit.compiled(),
                        missing_bin, hist_rows=hist_rows, **kw)
    ref = grow_subtrees_reference(binned, ch, rows, starts, tree, node, depth, nxt, np.array([0, 1]), crit,
                                  np.full(n_features, 10), missing_bin, **kw)
    assert len(got.ints) > 6
    np.testing.assert_array_equal(got.ints, ref.ints)
    np.testing.assert_allclose(got.floats, ref.floats, rtol=1e-9, atol=1e-9)


def test_curves_are_forest_weighted_kaplan_meier():
    X, time, event, rng = _design(800, 4)
    w = rng.uniform(0.5, 2.0, len(time))
    f = SurvivalForest(20, random_state=2, min_node_size=5).fit(X, time, event, sample_weight=w, comm=SELF)
    Xq = rng.uniform(-1, 1, size=(25, 5))
    at = np.concatenate([[0.0], np.quantile(time, [0.1, 0.3, 0.5, 0.8, 0.99]), [time.max() + 1]])
    surv = f.predict_survival_function(Xq, at)
    chf = f.predict_cumulative_hazard(Xq, at)
    W = f.get_forest_weights(Xq, X_train=X, sample_weight=w, comm=SELF).toarray()
    for q in range(len(Xq)):
        s_ref, h_ref = kaplan_meier(time, event, W[q], at)
        np.testing.assert_allclose(surv[q], s_ref, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(chf[q], h_ref, rtol=1e-9, atol=1e-12)
    assert np.all(np.diff(surv, axis=1) <= 0) and np.all(surv[:, 0] == 1.0)
    na = f.predict_survival_function(Xq, at, prediction_type="Nelson-Aalen")
    np.testing.assert_allclose(na, np.exp(-chf))
    # risk: the cumulative hazard summed over the failure grid; any order of times
    np.testing.assert_allclose(f.predict(Xq), f.predict_cumulative_hazard(Xq).sum(1))
    shuffled = at[::-1]
    np.testing.assert_array_equal(f.predict_survival_function(Xq, shuffled), surv[:, ::-1])


def test_kernel_on_a_hand_built_tree():
    packed = {"feature": np.array([0, -1, -1]), "left": np.array([1, -1, -1]), "right": np.array([2, -1, -1]),
              "tree_offsets": np.array([0, 3]), "value": np.array([[4.0, 1.0], [3.0, 1.0], [1.0, 1.0]])}
    # leaf 1: times 1 (failure), 2 (censored), 3 (failure); leaf 2: time 5 censored
    lists = {"offsets": np.array([0, 0, 3, 4]), "y": np.array([1.0, 2.0, 3.0, 5.0]),
             "weight": np.array([1 / 3, 1 / 3, 1 / 3, 1.0]), "event": np.array([1, 0, 1, 0], dtype=np.uint8)}
    s, h = survival_curves(packed, lists, np.array([[1], [2]], dtype=np.int32), np.array([0.5, 1, 2.5, 3, 9]), 0)
    np.testing.assert_allclose(s[0], [1, 2 / 3, 2 / 3, 0, 0])
    np.testing.assert_allclose(h[0], [0, 1 / 3, 1 / 3, 4 / 3, 4 / 3])
    np.testing.assert_array_equal(s[1], np.ones(5))


def test_known_survival_curves_and_concordance():
    X, time, event, rng = _design(4000, 5)
    f = SurvivalForest(100, random_state=0).fit(X, time, event, comm=SELF)
    Xq = rng.uniform(-1, 1, size=(400, 5))
    at = np.array([0.25, 0.5, 1.0])
    truth = _true_survival(Xq, at)
    rmse = np.sqrt(((f.predict_survival_function(Xq, at) - truth) ** 2).mean(axis=0))
    marginal = kaplan_meier(time, event, np.ones(len(time)), at)[0]
    rmse_marginal = np.sqrt(((marginal[None, :] - truth) ** 2).mean(axis=0))
    assert np.all(rmse < 0.06), rmse
    assert np.all(rmse < 0.4 * rmse_marginal), (rmse, rmse_marginal)
    # discrimination close to the true rate's (an oracle) on fresh uncensored failures
    rate = np.exp(Xq[:, 0] + 0.5 * (Xq[:, 1] > 0))
    t_new = rng.exponential(1 / rate)
    ours = concordance_index(t_new, np.ones(len(t_new), bool), f.predict(Xq))
    oracle = concordance_index(t_new, np.ones(len(t_new), bool), rate)
    assert ours > oracle - 0.02, (ours, oracle)
    assert np.argmax(f.feature_importances_) == 0


def test_concordance_index_equals_pairwise_count():
    rng = np.random.default_rng(6)
    time = np.round(rng.exponential(1.0, 60), 1)
    event = rng.random(60) < 0.6
    risk = np.round(rng.normal(size=60), 1)
    conc = comp = 0.0
    for i in range(60):
        for j in range(60):
            if event[i] and (time[j] > time[i] or (time[j] == time[i] and not event[j])):
                comp += 1
                conc += 1.0 if risk[i] > risk[j] else 0.5 if risk[i] == risk[j] else 0.0
    assert concordance_index(time, event, risk) == pytest.approx(conc / comp, rel=1e-12)


def test_out_of_bag_curves_leave_the_row_out():
    X, time, event, _ = _design(1200, 7)
    f = SurvivalForest(40, random_state=3).fit(X, time, event, comm=SELF)
    oob = f.oob_predict()
    np.testing.assert_array_equal(f.oob_predict(X, comm=SELF), oob)
    risk_oob, risk_in = f.oob_risk(), f.predict(X)
    # in sample each failure's own time lowers its curve: in-sample concordance is optimistic
    c_oob = concordance_index(time, event, risk_oob)
    c_in = concordance_index(time, event, risk_in)
    assert c_in > c_oob > 0.6


def test_model_file_round_trip_and_refusals():
    X, time, event, rng = _design(600, 8)
    f = SurvivalForest(8, random_state=1).fit(X, time, event, comm=SELF)
    g = model_io.loads(model_io.dumps(f))
    Xq = rng.uniform(-1, 1, size=(30, 5))
    np.testing.assert_array_equal(g.predict_survival_function(Xq), f.predict_survival_function(Xq))
    np.testing.assert_array_equal(g.predict(Xq), f.predict(Xq))
    np.testing.assert_array_equal(g.failure_times_, f.failure_times_)
    for edit in (lambda m: m.leaf_outcomes_["event"].__setitem__(0, 3),
                 lambda m: m.leaf_outcomes_["y"].__setitem__(0, -1.0),
                 lambda m: setattr(m, "failure_times_", m.failure_times_[::-1].copy())):
        bad = model_io.loads(model_io.dumps(f))
        edit(bad)
        with pytest.raises(model_io.ModelFormatError):
            model_io.loads(model_io.dumps(bad))


@pytest.mark.parametrize("time_edit,event_edit,message", [
    (lambda t: -t, None, "non-negative"),
    (lambda t: np.where(np.arange(len(t)) == 3, np.nan, t), None, "time"),
    (None, lambda e: e.astype(int) * 2, "0 \\(censored\\) or 1"),
    (None, lambda e: np.zeros(len(e), bool), "no failure"),
])
def test_bad_input_gets_one_clear_line(time_edit, event_edit, message):
    X, time, event, _ = _design(100, 9)
    time = time_edit(time) if time_edit else time
    event = event_edit(event) if event_edit else event
    with pytest.raises(ValueError, match=message):
        SurvivalForest(4).fit(X, time, event, comm=SELF)


def test_pandas_targets_are_taken_as_they_are():
    pd = pytest.importorskip("pandas")
    X, time, event, rng = _design(300, 14)
    a = SurvivalForest(6, random_state=0).fit(X, time, event, comm=SELF)
    b = SurvivalForest(6, random_state=0).fit(pd.DataFrame(X), pd.Series(time), pd.Series(event.astype(int)),
                                              comm=SELF)
    np.testing.assert_array_equal(a.predict(X), b.predict(X))


def test_bad_parameters():
    X, time, event, _ = _design(100, 9)
    for bad in (1, 256, 2.5):
        with pytest.raises(ValueError, match="max_split_times"):
            SurvivalForest(4, max_split_times=bad).fit(X, time, event, comm=SELF)
    with pytest.raises(ValueError, match="prediction_type"):
        SurvivalForest(4).fit(X, time, event, comm=SELF).predict_survival_function(X, prediction_type="km")


@pytest.mark.mpi
def test_identical_at_any_rank_count(comm, same_model_file):
    X, time, event, rng = _design(900, 10)
    lo, hi = len(time) * comm.rank // comm.size, len(time) * (comm.rank + 1) // comm.size
    kw = dict(n_estimators=10, random_state=5, max_split_times=16)
    dist = SurvivalForest(**kw).fit(X[lo:hi], time[lo:hi], event[lo:hi], comm=comm)
    ref = SurvivalForest(**kw).fit(X, time, event, comm=SELF)
    np.testing.assert_array_equal(dist.failure_times_, ref.failure_times_)
    for key in ("feature", "bin_threshold", "left", "right"):
        np.testing.assert_array_equal(dist.estimators_[key], ref.estimators_[key])
    for key in ("offsets", "y", "event"):
        np.testing.assert_array_equal(dist.leaf_outcomes_[key], ref.leaf_outcomes_[key])
    Xq = rng.uniform(-1, 1, size=(60, 5))
    np.testing.assert_allclose(dist.predict_survival_function(Xq), ref.predict_survival_function(Xq),
                               rtol=0, atol=1e-12)
    np.testing.assert_allclose(dist.predict(Xq), ref.predict(Xq), rtol=1e-12)


def test_clusters_sample_whole_clusters():
    X, time, event, rng = _design(800, 11)
    labels = np.arange(800) // 4                        # clusters of four consecutive rows
    f = SurvivalForest(20, random_state=6).fit(X, time, event, clusters=labels, comm=SELF)
    from forest.engine.subsample import OUT, forest_row_codes
    codes = forest_row_codes(f.sampling_, 20, np.arange(800, dtype=np.int64), f._weights_source_.clusters)
    out = (codes == OUT).reshape(20, 200, 4)
    assert np.all(out.all(axis=2) | ~out.any(axis=2))   # a cluster is out of a tree's sample whole
    oob = f.oob_predict(X, clusters=labels, comm=SELF)
    np.testing.assert_array_equal(oob, f.oob_predict())
    with pytest.raises(ValueError, match="fitted with clusters"):
        f.oob_predict(X, comm=SELF)
    unclustered = SurvivalForest(20, random_state=6).fit(X, time, event, comm=SELF)
    assert not np.array_equal(unclustered.oob_risk(), f.oob_risk())


@pytest.mark.mpi
def test_clustered_fit_identical_at_any_rank_count(comm):
    X, time, event, rng = _design(600, 12)
    labels = (np.arange(600) * 7) % 150                  # clusters spread over every rank's block
    lo, hi = len(time) * comm.rank // comm.size, len(time) * (comm.rank + 1) // comm.size
    kw = dict(n_estimators=8, random_state=5, max_split_times=16)
    dist = SurvivalForest(**kw).fit(X[lo:hi], time[lo:hi], event[lo:hi], clusters=labels[lo:hi], comm=comm)
    ref = SurvivalForest(**kw).fit(X, time, event, clusters=labels, comm=SELF)
    for key in ("feature", "bin_threshold", "left", "right"):
        np.testing.assert_array_equal(dist.estimators_[key], ref.estimators_[key])
    np.testing.assert_allclose(dist.oob_risk(), ref.oob_risk()[lo:hi], rtol=1e-12)


def test_repeated_query_rows_get_the_curves_of_each_row():
    X, time, event, rng = _design(500, 13)
    f = SurvivalForest(10, random_state=1).fit(X, time, event, comm=SELF)
    Xq = np.repeat(rng.uniform(-1, 1, size=(5, 5)), 40, axis=0)        # 200 rows, 5 distinct
    together = f.predict_survival_function(Xq)
    one_by_one = np.concatenate([f.predict_survival_function(Xq[i:i + 1]) for i in range(0, 200, 40)])
    np.testing.assert_array_equal(together[::40], one_by_one)
    np.testing.assert_array_equal(together, np.repeat(one_by_one, 40, axis=0))

"""Training rows are recognised wherever a model meets data (issue 30), at any rank count."""
import warnings

import numpy as np
import pytest

from forest import simulate

from forest.io import model_io
from forest.estimators.causal_forest import CausalForest
from forest.io.fingerprint import row_hashes_reference
from forest.estimators.instrumental_forest import InstrumentalForest
from forest.estimators.regression_forest import RegressionForest
from forest.report.analysis import HeldOutRanking
from forest.io.training_rows import (SKETCH_SIZE, TrainingRowsNotice, _merge, match_rows, row_keys, training_signature,
                                     validate_signature)
from native import collectives as col
from native.comm import SelfCommunicator
from native.threads import ThreadWorld

SELF = SelfCommunicator()
KW = dict(n_estimators=16, nuisance_estimators=8, max_bins=32, random_state=3)


@pytest.fixture(scope="module")
def fitted():
    d = simulate.linear_confounded(600, d=4, seed=31)
    return d, CausalForest(**KW).fit(d.X, d.t, d.y, comm=SELF)


def _codes(n, f, seed, levels=256):
    return np.random.default_rng(seed).integers(0, levels, size=(f, n)).astype(np.uint8)


# ------------------------------------------------------------------ the signature itself

def test_row_keys_are_the_reference_hash_without_row_ids():
    codes, y = _codes(50, 3, 0), np.random.default_rng(1).normal(size=(50, 2))
    keys = row_keys(codes, [y])
    np.testing.assert_array_equal(keys, row_hashes_reference(np.zeros(50, np.int64), codes, [y]))
    # position-free: permuting rows permutes the keys
    perm = np.random.default_rng(2).permutation(50)
    np.testing.assert_array_equal(row_keys(codes[:, perm], [y[perm]]), keys[perm])


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_bottom_k_sketch_equals_brute_force_at_any_rank_count(p):
    """The sketch is the k smallest distinct keys of all rows with their exact multiplicities."""
    n, k = 500, 37
    codes = _codes(n, 2, 5, levels=12)          # 144 distinct code pairs: many duplicated rows
    keys = row_keys(codes, [])
    values, counts = np.unique(keys, return_counts=True)

    def body(comm):
        lo, hi = n * comm.rank // p, n * (comm.rank + 1) // p
        gids = np.arange(lo, hi, dtype=np.int64)
        return training_signature(comm, gids, n, codes[:, lo:hi], [], sketch_size=k)

    sigs = ThreadWorld(p).run(body)
    for sig in sigs:
        np.testing.assert_array_equal(sig["keys"], values[:k])
        np.testing.assert_array_equal(sig["counts"], counts[:k])
        assert not sig["complete"] and sig["content"] == sigs[0]["content"]
    whole = training_signature(SELF, np.arange(n), n, codes, [], sketch_size=k)
    assert whole["content"] == sigs[0]["content"] and whole["features"] == sigs[0]["features"]


def test_merge_sums_counts_and_knows_when_it_is_complete():
    v, c, complete = _merge(np.array([5, 3, 9, 3], np.uint64), np.array([1, 2, 1, 4]), 3)
    assert v.tolist() == [3, 5, 9] and c.tolist() == [6, 1, 1] and complete
    v, c, complete = _merge(np.array([5, 3, 9, 1], np.uint64), np.array([1, 1, 1, 1]), 3)
    assert v.tolist() == [1, 3, 5] and not complete


def test_match_kinds():
    rng = np.random.default_rng(7)
    n = 3000
    codes, y = _codes(n, 4, 8), rng.normal(size=n)
    gids = np.arange(n)
    for k in (SKETCH_SIZE, 200):                 # complete sketch, and bottom-k sampling
        sig = training_signature(SELF, gids, n, codes, [y], sketch_size=k)

        def match(c, yy):
            m = c.shape[1]
            return match_rows(sig, SELF, np.arange(m), m, c, [yy])

        assert match(codes, y).kind == "training"
        held = match(_codes(1000, 4, 9), rng.normal(size=1000))
        assert held.kind == "held-out" and held.overlap == 0.0
        sub = match(codes[:, :1500], y[:1500])               # a subset of the training rows
        assert sub.kind == "overlap" and sub.overlap > 0.8
        sup = match(np.hstack([codes, _codes(1000, 4, 10)]), np.r_[y, rng.normal(size=1000)])
        assert sup.kind == "overlap" and 0.6 < sup.overlap < 0.9       # 3000 of 4000
        perm = rng.permutation(n)                            # the training rows, shuffled
        assert match(codes[:, perm], y[perm]).kind == "overlap"
        changed = y.copy()
        changed[0] += 1e-9                                   # one value off: not the training data
        assert match(codes, changed).kind == "overlap"
    # without targets only the features in training order are recognised
    assert match_rows(sig, SELF, gids, n, codes).kind == "training"
    assert match_rows(sig, SELF, gids[:10], 10, codes[:, :10]).kind == "held-out"
    assert match_rows(None, SELF, gids, n, codes, [y]).kind == "unknown"


def test_duplicated_content_is_not_taken_for_overlap():
    """All-binary rows repeat: fresh rows from the same population hit the sketch as often as
    training rows repeat each other, which is no evidence of overlap."""
    def draw(n, seed):
        rng = np.random.default_rng(seed)
        return rng.integers(0, 2, size=(3, n)).astype(np.uint8), rng.integers(0, 2, size=n).astype(np.float64)

    codes, y = draw(2000, 1)
    sig = training_signature(SELF, np.arange(2000), 2000, codes, [y])
    c2, y2 = draw(800, 2)
    assert match_rows(sig, SELF, np.arange(800), 800, c2, [y2]).kind == "held-out"


def test_validate_signature_refuses_malformed_states():
    sig = training_signature(SELF, np.arange(100), 100, _codes(100, 2, 3), [np.arange(100.0)])
    validate_signature(sig)
    bad = [dict(sig, rows=-1), dict(sig, content="xyz"), dict(sig, keys=sig["keys"][::-1].copy()),
           dict(sig, counts=sig["counts"].astype(np.float64)), dict(sig, counts=sig["counts"] * 0),
           dict(sig, complete="yes"), {k: v for k, v in sig.items() if k != "features"},
           dict(sig, counts=sig["counts"] + 5)]
    for b in bad:
        with pytest.raises(ValueError, match="training_rows_"):
            validate_signature(b)


# ------------------------------------------------------------------ estimators

def test_analysis_methods_use_out_of_bag_estimates_on_training_rows(fitted, tmp_path):
    d, cf = fitted
    held = dict(X=d.X, t=d.t, y=d.y, comm=SELF)
    with pytest.warns(TrainingRowsNotice, match="training rows"):
        cal = cf.test_calibration(**held)
    oob = cf.test_calibration(comm=SELF)
    np.testing.assert_array_equal(cal.estimate, oob.estimate)
    np.testing.assert_array_equal(cal.stderr, oob.stderr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainingRowsNotice)
        assert cf.average_treatment_effect(**held) == pytest.approx(cf.average_treatment_effect(comm=SELF),
                                                                    rel=1e-12)
        blp = cf.best_linear_projection(d.X[:, :2], **held)
        np.testing.assert_allclose(blp.estimate, cf.best_linear_projection(d.X[:, :2], comm=SELF).estimate,
                                   rtol=1e-12)
        scored = cf.score_rows(d.X, d.t, d.y, comm=SELF)
        assert scored.source == "out-of-bag"
        np.testing.assert_array_equal(scored.effects, cf.oob_predict())
        np.testing.assert_array_equal(scored.scores, cf.get_scores())
        np.testing.assert_array_equal(cf.dr_scores(d.X, d.t, d.y), cf.get_scores())
        # a model file keeps the signature, not the rows: the same figures from a loaded model
        path = str(tmp_path / "cf.model")
        model_io.save(cf, path)
        loaded = model_io.load(path, expect=CausalForest)
        again = loaded.test_calibration(**held)
    np.testing.assert_array_equal(again.estimate, oob.estimate)
    # in-sample predictions differ: the out-of-bag route is really taken
    assert not np.allclose(cf.oob_predict(), cf.predict(d.X))


def test_partly_training_rows_are_refused_in_one_line(fitted):
    d, cf = fitted
    test = simulate.linear_confounded(200, d=4, seed=32)
    X = np.vstack([d.X[:300], test.X])
    t, y = np.r_[d.t[:300], test.t], np.r_[d.y[:300], test.y]
    for call in (lambda: cf.test_calibration(X=X, t=t, y=y, comm=SELF), lambda: cf.dr_scores(X, t, y),
                 lambda: cf.score_rows(d.X[:100], d.t[:100], d.y[:100], comm=SELF)):
        with pytest.raises(ValueError, match="holds training rows of this model") as info:
            call()
        assert "\n" not in str(info.value) and "held-out rows" in str(info.value)
    # held-out rows are scored by the whole forest, with no notice
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingRowsNotice)
        assert cf.score_rows(test.X, test.t, test.y, comm=SELF).source == "held-out"


def test_oob_predict_without_x_in_the_fitting_process(fitted, tmp_path):
    d, cf = fitted
    np.testing.assert_array_equal(cf.oob_predict(), cf.oob_predict(d.X, comm=SELF))
    rf = RegressionForest(n_estimators=16, random_state=1).fit(d.X, d.y, comm=SELF)
    np.testing.assert_array_equal(rf.oob_predict(), rf.oob_predict(d.X, comm=SELF))
    assert rf.training_row_match(d.X, d.y, comm=SELF).kind == "training"
    z = (d.X[:, 1] > np.median(d.X[:, 1])).astype(float)
    iv = InstrumentalForest(n_estimators=16, nuisance_estimators=8, random_state=1).fit(d.X, d.t, d.y, z, comm=SELF)
    np.testing.assert_array_equal(iv.oob_predict(), iv.oob_predict(d.X, comm=SELF))
    assert iv.training_row_match(d.X, d.t, d.y, z, comm=SELF).kind == "training"
    z2 = z.copy()
    z2[:10] = 1.0 - z2[:10]                       # ten rows changed: the rest are still training rows
    assert iv.training_row_match(d.X, d.t, d.y, z2, comm=SELF).kind == "overlap"
    assert iv.training_row_match(d.X, d.t, d.y, 1.0 - z, comm=SELF).kind == "held-out"   # every row changed
    path = str(tmp_path / "iv.model")
    model_io.save(iv, path)
    loaded = model_io.load(path, expect=InstrumentalForest)
    assert not hasattr(loaded, "_oob_source_")
    with pytest.raises(ValueError, match="only in the process that ran fit"):
        loaded.oob_predict()
    # the nuisance forests carry no signature of their own
    assert not hasattr(cf.outcome_forest_, "training_rows_")


def test_a_clustered_fit_needs_its_clusters_for_out_of_bag_rows():
    d = simulate.linear_confounded(400, d=3, seed=33)
    labels = np.arange(400) // 10
    cf = CausalForest(**KW).fit(d.X, d.t, d.y, clusters=labels, comm=SELF)
    with pytest.raises(ValueError, match="clusters"):
        cf.test_calibration(X=d.X, t=d.t, y=d.y, comm=SELF)
    with pytest.warns(TrainingRowsNotice):
        cal = cf.test_calibration(X=d.X, t=d.t, y=d.y, clusters=labels, comm=SELF)
    np.testing.assert_array_equal(cal.estimate, cf.test_calibration(comm=SELF).estimate)


@pytest.mark.mpi
def test_training_rows_out_of_bag_at_any_rank_count(comm, rank_slice):
    """Each rank passes its block of the training rows: every rank gets one process's out-of-bag figures."""
    n = 700
    d = simulate.linear_confounded(n, d=4, seed=34)
    sl = rank_slice(n)
    dist = CausalForest(**KW).fit(d.X[sl], d.t[sl], d.y[sl], comm=comm)
    ref = CausalForest(**KW).fit(d.X, d.t, d.y, comm=SELF)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrainingRowsNotice)
        cal = dist.test_calibration(X=d.X[sl], t=d.t[sl], y=d.y[sl], comm=comm)
        ate = dist.average_treatment_effect(X=d.X[sl], t=d.t[sl], y=d.y[sl], comm=comm)
        scored = dist.score_rows(d.X[sl], d.t[sl], d.y[sl], comm=comm)
        match = dist.training_row_match(d.X[sl], d.t[sl], d.y[sl], comm=comm)
        part = dist.training_row_match(d.X[sl][:5], d.t[sl][:5], d.y[sl][:5], comm=comm)
    effects = col.allgatherv(comm, scored.effects)
    oob = col.allgatherv(comm, dist.oob_predict())
    want_cal = ref.test_calibration(comm=SELF)
    assert dist.training_rows_["content"] == ref.training_rows_["content"]
    np.testing.assert_array_equal(dist.training_rows_["keys"], ref.training_rows_["keys"])
    assert match.kind == "training" and part.kind == "overlap" and scored.source == "out-of-bag"
    np.testing.assert_allclose(cal.estimate, want_cal.estimate, rtol=1e-9)
    np.testing.assert_allclose(cal.stderr, want_cal.stderr, rtol=1e-9)
    np.testing.assert_allclose(ate, ref.average_treatment_effect(comm=SELF), rtol=1e-9)
    np.testing.assert_allclose(effects, ref.oob_predict(), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(oob, ref.oob_predict(), rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ the false discovery itself

def _null(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    t = (rng.random(n) < 1.0 / (1.0 + np.exp(-X[:, 1]))).astype(np.float64)
    return X, t, X[:, 0] + X[:, 1] + t + rng.normal(size=n)   # effect 1 everywhere


def test_no_heterogeneity_found_on_the_training_rows_of_a_null_design():
    """Fast version of benchmarks/bench_null_report.py: a constant effect, analysed on the training rows.

    Out of bag, calibration's one-sided test keeps its size; RATE ranked by a forest refitted
    on the other half covers 0. The same forests analysed in sample (as the report did before
    issue 30: a model with no signature treats the rows as held out) find heterogeneity in
    nearly every seed, so this test fails on that bug.
    """
    seeds, n = range(16), 300
    p_oob, p_in, covers = [], [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for seed in seeds:
            X, t, y = _null(n, seed)
            cf = CausalForest(n_estimators=60, nuisance_estimators=30, random_state=seed).fit(X, t, y, comm=SELF)
            p_oob.append(cf.test_calibration(X=X, t=t, y=y, comm=SELF).pvalue[1])
            rank = HeldOutRanking(cf, X, t, y, np.arange(n), seed=seed)
            lo, hi = cf.rank_average_treatment_effect(rank.priorities, X, t, y, subset=rank.mask, n_bootstrap=100,
                                                      comm=SELF).conf_int(0.05)
            covers.append(lo[0] <= 0.0 <= hi[0])
            del cf.training_rows_
            p_in.append(cf.test_calibration(X=X, t=t, y=y, comm=SELF).pvalue[1])
    assert sum(p <= 0.01 for p in p_oob) <= 1
    assert sum(covers) >= 13
    assert sum(p <= 0.01 for p in p_in) >= 12          # the bug this guards against

"""Quantized GBDT training: the narrow integer wire packing, accuracy against the float
fit on simulated tasks, parameters, model files, and the same model on any rank count (mpi)."""
import numpy as np
import pytest
from sklearn.metrics import accuracy_score, r2_score, roc_auc_score

from forest.io import model_io
from forest.estimators.gbdt import GBDTClassifier, GBDTRegressor
from forest.engine.int_packing import WireLayout, unpack_histogram
from histogram.quantize import pack, unpack
from native import collectives as col
from native.blocks import block_range
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


# ---------------------------------------------------------------- wire packing
def _ranks_codes(rng, bin_rows, k, levels, p):
    """Per-rank packed codes whose global sums respect the per-bin row counts."""
    codes = np.zeros((p, len(bin_rows) * k), dtype=np.int64)
    for b, rows in enumerate(bin_rows):
        owner = rng.integers(0, p, size=rows)
        for j in range(k):
            g = rng.integers(-(levels // 2), levels // 2 + 1, size=rows)
            if b % 5 == 0:
                g[:] = -(levels // 2)  # extreme negative totals
            h = rng.integers(0, levels + 1, size=rows)
            np.add.at(codes[:, b * k + j], owner, pack(g, h))
    return codes


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("p", [1, 2, 4])
def test_wire_round_trip_is_the_exact_sum(rng, k, p):
    levels = 4
    # Empty bins, bins that fit 16|16 bits, and bins that need wide slots.
    bin_rows = np.array([0, 3, 100, 4000, 8191, 8192, 20000, 0, 1, 16383, 5], dtype=np.int64)
    codes = _ranks_codes(rng, bin_rows, k, levels, p)
    truth = unpack_histogram(codes.sum(axis=0), k)
    layout = WireLayout(bin_rows, int(bin_rows.sum()), k, levels)
    assert layout.dtype == np.int32
    wire = np.zeros(layout.n_slots, dtype=layout.dtype)
    for r in range(p):
        wire += layout.encode(codes[r])  # int32 additions wrap, as a collective's do
    np.testing.assert_array_equal(layout.decode(wire), truth)
    # Absent bins take no slot, narrow bins one, wide bins two.
    narrow = (bin_rows > 0) & (bin_rows * 2 < 2 ** 15) & (bin_rows * 4 < 2 ** 16)
    wide = (bin_rows > 0) & ~narrow
    assert layout.n_slots == k * (narrow.sum() + 2 * wide.sum())
    assert (truth[:, :k].min() < 0) and truth[:, :k].min() >= -2 * bin_rows.max()


def test_wire_bins_capped_by_the_parent_rows(rng):
    """A bin never holds more rows than the node's parent: big bins of a small parent fit narrow."""
    levels, k = 4, 1
    bin_rows = np.array([50000, 50000, 7, 0], dtype=np.int64)
    assert WireLayout(bin_rows, 10 ** 6, k, levels).n_slots == 5
    by_rows = WireLayout(bin_rows, 8000, k, levels)  # parent of 8000 rows: every bin fits 16|16 bits
    assert by_rows.n_slots == 3
    codes = _ranks_codes(rng, np.array([4000, 3990, 7, 0]), k, levels, 3)
    wire = sum(by_rows.encode(c) for c in codes)
    np.testing.assert_array_equal(by_rows.decode(wire), unpack_histogram(codes.sum(axis=0), k))


def test_wire_falls_back_to_int64_slots():
    bin_rows = np.array([2 ** 30, 10], dtype=np.int64)
    layout = WireLayout(bin_rows, 2 ** 31, 1, 4)
    assert layout.dtype == np.int64
    codes = np.array([pack(-2 ** 30, 2 ** 31), pack(-20, 40)], dtype=np.int64)
    np.testing.assert_array_equal(layout.decode(layout.encode(codes)), unpack_histogram(codes, 1))
    assert unpack(codes[0]) == (-2 ** 30, 2 ** 31)


# ---------------------------------------------------------------- accuracy
def _binary(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 8))
    logit = 1.2 * X[:, 0] - 0.8 * X[:, 1] * X[:, 2] + np.sin(2 * X[:, 3]) + 0.5 * (X[:, 4] > 0.5)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(int)
    return X, y, logit


def test_binary_auc_close_to_the_float_fit():
    X, y, _ = _binary(20000, 0)
    Xt, yt, logit_t = _binary(20000, 1)
    kw = dict(n_estimators=100, max_leaf_nodes=15, early_stopping=False, random_state=3)
    fl = GBDTClassifier(**kw).fit(X, y, comm=SELF)
    qu = GBDTClassifier(quantized=True, **kw).fit(X, y, comm=SELF)
    auc_f = roc_auc_score(yt, fl.predict_proba(Xt)[:, 1])
    auc_q = roc_auc_score(yt, qu.predict_proba(Xt)[:, 1])
    oracle = roc_auc_score(yt, logit_t)
    assert abs(auc_q - auc_f) < 0.005, (auc_f, auc_q)
    assert auc_q > oracle - 0.02, (auc_q, oracle)
    # The refit leaves are Newton values of float sums: no leaf is a multiple of a coarse grid.
    assert len(np.unique(np.round(qu.trees_[5].value[qu.trees_[5].is_leaf], 12))) == qu.trees_[5].n_leaves


def test_regression_close_to_the_float_fit():
    rng = np.random.default_rng(4)
    X = rng.uniform(-1, 1, size=(8000, 6))
    f = 2 * X[:, 0] + np.sin(3 * X[:, 1]) + X[:, 2] * X[:, 3]
    y = f + rng.normal(scale=0.3, size=len(f))
    w = rng.uniform(0.5, 2.0, size=len(y))
    w[::9] = 0.0  # rows of weight 0 must not move anything
    kw = dict(n_estimators=80, max_leaf_nodes=15, early_stopping=False, random_state=1)
    fl = GBDTRegressor(**kw).fit(X, y, sample_weight=w, comm=SELF)
    qu = GBDTRegressor(quantized=True, **kw).fit(X, y, sample_weight=w, comm=SELF)
    r2_f, r2_q = r2_score(f, fl.predict(X)), r2_score(f, qu.predict(X))
    assert r2_q > r2_f - 0.01 and r2_q > 0.95, (r2_f, r2_q)
    # Rows of weight 0 change nothing, wherever their y is.
    y2 = y.copy()
    y2[::9] = 1e6
    qu2 = GBDTRegressor(quantized=True, **kw).fit(X, y2, sample_weight=w, comm=SELF)
    np.testing.assert_array_equal(qu2.predict(X), qu.predict(X))


def test_multiclass_works():
    rng = np.random.default_rng(2)
    X = rng.normal(size=(6000, 5))
    y = np.argmax(X[:, :3] + 0.5 * rng.normal(size=(6000, 3)), axis=1)
    kw = dict(n_estimators=40, max_leaf_nodes=15, early_stopping=False, random_state=1)
    fl = GBDTClassifier(**kw).fit(X[:4000], y[:4000], comm=SELF)
    qu = GBDTClassifier(quantized=True, **kw).fit(X[:4000], y[:4000], comm=SELF)
    assert qu.trees_[0].n_outputs == 3
    acc_f = accuracy_score(y[4000:], fl.predict(X[4000:]))
    acc_q = accuracy_score(y[4000:], qu.predict(X[4000:]))
    assert acc_q > acc_f - 0.02 and acc_q > 0.75, (acc_f, acc_q)


def test_numpy_backend_grows_the_same_trees():
    X, y, _ = _binary(3000, 5)
    kw = dict(n_estimators=10, max_leaf_nodes=7, early_stopping=False, random_state=3, quantized=True)
    a = GBDTClassifier(**kw).fit(X, y, comm=SELF)
    b = GBDTClassifier(backend="numpy", **kw).fit(X, y, comm=SELF)
    for s, t in zip(a.trees_, b.trees_):
        for u, v in zip(s.to_arrays().values(), t.to_arrays().values()):
            np.testing.assert_array_equal(u, v)


@pytest.mark.parametrize("bad, match", [
    (dict(quantized=1), "quantized must be True or False"),
    (dict(quantized=True, quantized_bins=3), "quantized_bins must be an even int"),
    (dict(quantized=True, quantized_bins=0), "quantized_bins must be an even int"),
    (dict(quantized=True, quantized_bins=4.0), "quantized_bins"),
    (dict(quantized=True, split_mode="reduce_scatter"), "split_mode='allreduce'"),
    (dict(quantized=True, backend="cuda"), "CPU backends"),
])
def test_bad_parameters_are_refused(bad, match):
    X, y, _ = _binary(100, 0)
    with pytest.raises((ValueError, TypeError), match=match):
        GBDTClassifier(**bad).fit(X, y, comm=SELF)


def test_model_file_round_trip(tmp_path):
    X, y, _ = _binary(2000, 6)
    est = GBDTClassifier(n_estimators=8, quantized=True, quantized_bins=8, random_state=0).fit(X, y, comm=SELF)
    path = str(tmp_path / "q.hfm")
    model_io.save(est, path)
    loaded = model_io.load(path, expect=GBDTClassifier)
    assert loaded.get_params()["quantized"] is True and loaded.quantized_bins == 8
    np.testing.assert_array_equal(loaded.predict_proba(X), est.predict_proba(X))
    # A file written before the parameters existed loads as a float model.
    old = model_io.load(path, expect=GBDTClassifier)
    del old.__dict__["quantized"], old.__dict__["quantized_bins"]
    old._model_io_restore_()
    assert old.quantized is False and old.quantized_bins == 4


# ---------------------------------------------------------------- distributed
@pytest.mark.mpi
def test_same_model_bitwise_on_any_rank_count(comm):
    X, y, _ = _binary(4000, 7)
    X[::13, 2] = np.nan
    w = 1.0 + (np.arange(len(y)) % 3)
    w[::17] = 0.0
    y3 = y + (X[:, 5] > 0.8)
    kw = dict(n_estimators=10, max_leaf_nodes=15, early_stopping=True, validation_fraction=0.2,
              n_iter_no_change=50, random_state=4, quantized=True)
    sl = slice(*block_range(len(y), comm.size, comm.rank))
    runs = []
    for cls, target in ((GBDTClassifier, y), (GBDTClassifier, y3), (GBDTRegressor, X[:, 0] + y)):
        ref = cls(**kw).fit(X, target, sample_weight=w, comm=SELF)
        dist = cls(**kw).fit(X[sl], target[sl], sample_weight=w[sl], comm=comm)
        runs.append((ref, dist))
    seen = col.allgather_object(comm, [t.to_arrays()["value"].tolist() for t in runs[1][1].trees_])

    for ref, dist in runs:
        assert dist.n_iter_ == ref.n_iter_
        for a, b in zip(ref.trees_, dist.trees_):
            for key, u in a.to_arrays().items():
                u, v = np.asarray(u), np.asarray(b.to_arrays()[key])
                assert np.array_equal(u, v, equal_nan=u.dtype.kind == "f"), key
        # Validation losses are float sums over ranks (as in the float path): equal to rounding.
        np.testing.assert_allclose(dist.validation_loss_, ref.validation_loss_, rtol=1e-12)
    for s in seen:
        assert s == seen[0]


@pytest.mark.parametrize("n_threads", [1, 2])
def test_fixed_leaf_sums_match_reference(rng, n_threads):
    """The refit's fixed-point leaf sums against NumPy, with segments large enough to be
    cut into pieces for the threads (and an empty one)."""
    import numba

    from forest.engine.quantized import _fine_units, fixed_leaf_sums, fixed_leaf_sums_reference

    n = 150_000
    channels = np.column_stack([rng.normal(size=n), rng.uniform(0, 0.25, size=n)])
    rows = rng.permutation(n).astype(np.int32)
    bounds = np.array([0, 7, 7, 90_000, n])
    starts, stops = bounds[:-1], bounds[1:]
    fine = _fine_units(np.abs(channels).max(axis=0), n)
    old = numba.get_num_threads()
    numba.set_num_threads(min(n_threads, numba.config.NUMBA_NUM_THREADS))
    try:
        got = fixed_leaf_sums(channels, rows, starts, stops, fine)
    finally:
        numba.set_num_threads(old)
    np.testing.assert_array_equal(got, fixed_leaf_sums_reference(channels, rows, starts, stops, fine))
    assert got[1].tolist() == [0, 0]

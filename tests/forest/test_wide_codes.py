"""Wide categorical codes (issue 32): a column of more than 255 categories keeps one code per category.

Gradient boosting bins such a column into uint16 codes with a bin axis as wide as the column,
and its categorical splits carry bitsets of more than 4 words; the forests keep folding into
``max_bins`` codes. Each fast kernel is checked against its NumPy reference on codes > 255.
"""
import numpy as np
import pandas as pd
import pytest

from forest import GBDTClassifier, GBDTRegressor, RegressionForest
from forest.criteria.basic import NewtonCriterion, VarianceCriterion
from forest.engine.expansion import grow_levelwise
from forest.engine.hist_builder import HistogramBuilder
from forest.engine.partition import partition_rows, partition_rows_reference, partition_segment
from forest.engine.predictor import predict_reference, predict_values, predict_values_binned
from forest.engine.splitting import find_best_splits, find_best_splits_reference
from forest.engine.tree import (CAT_WORDS, CATEGORICAL_SPLIT, MAX_CAT_WORDS, bitset_bins, cat_bitset, cat_words,
                                pack_trees, validate_packed)
from forest.io import model_io
from histogram.binning import BinMapper, transform_reference
from histogram.categories import CategoryCoder
from histogram.cpu_kernels import build_int_histogram
from histogram.dtypes import MAX_CATEGORY_CODES, bin_dtype
from histogram.kernels import build_histograms
from histogram.reference import build_int_histogram_numpy
from native.comm import SelfCommunicator

SELF = SelfCommunicator()
LEVELS = 300


def _summary(values, counts):
    return {"kind": "number", "values": [float(v) for v in values], "counts": [int(c) for c in counts]}


def test_coder_keeps_a_code_per_category_up_to_max_codes():
    counts = np.arange(1, 601)
    summary = _summary(np.arange(600), counts)
    folded = CategoryCoder.from_summaries(1, [0], [[summary]], 255)
    assert folded.n_codes_[0] == 255
    wide = CategoryCoder.from_summaries(1, [0], [[summary]], 255, max_codes=MAX_CATEGORY_CODES)
    assert wide.n_codes_[0] == 600 and wide.codes_[0].tolist() == list(range(600))
    capped = CategoryCoder.from_summaries(1, [0], [[summary]], 255, max_codes=400)
    assert capped.n_codes_[0] == 400
    # the 399 most frequent (the last ones) keep codes in sorted order, the rest share code 399
    assert (capped.codes_[0][:201] == 399).all() and capped.codes_[0][201:].tolist() == list(range(399))
    CategoryCoder.validate_state(wide.get_state())
    with pytest.raises(ValueError, match="max_codes"):
        CategoryCoder.from_summaries(1, [0], [[summary]], 255, max_codes=MAX_CATEGORY_CODES + 1)
    state = wide.get_state()
    state["n_codes_"] = np.array([MAX_CATEGORY_CODES + 1], dtype=np.int64)
    with pytest.raises(ValueError, match="codes"):
        CategoryCoder.validate_state(state)


def _wide_matrix(n, rng, levels=LEVELS):
    X = np.column_stack([rng.integers(0, levels, n).astype(float), rng.normal(size=n),
                         rng.integers(0, 20, n).astype(float)])
    X[rng.random(n) < 0.05, 0] = np.nan
    X[:levels, 0] = np.arange(levels)  # every code present
    return X


def test_mapper_bins_a_wide_column_by_its_codes_into_uint16():
    rng = np.random.default_rng(0)
    X = _wide_matrix(3000, rng)
    cats = np.array([True, False, True])
    narrow = BinMapper(max_bins=64, random_state=0).fit(X, SELF, categorical=None)
    wide = BinMapper(max_bins=64, random_state=0).fit(X, SELF, categorical=cats, n_codes=np.array([LEVELS, 0, 20]))
    assert wide.missing_bin_ == LEVELS and wide.n_bins_ == LEVELS + 1 and wide.bin_dtype_ == np.uint16
    np.testing.assert_array_equal(wide.bin_thresholds_[0], np.arange(LEVELS - 1) + 0.5)
    # the other features keep their edges
    for f in (1, 2):
        np.testing.assert_array_equal(wide.bin_thresholds_[f], narrow.bin_thresholds_[f])
    codes = wide.transform(X)
    assert codes.dtype == np.uint16
    np.testing.assert_array_equal(codes, transform_reference(X, wide.bin_thresholds_, wide.missing_bin_))
    assert codes[0].max() == LEVELS and (codes[0][np.isnan(X[:, 0])] == LEVELS).all()
    # a column that fits max_bins changes nothing: uint8 codes, the same state
    small = BinMapper(max_bins=64, random_state=0).fit(X[:, 1:], SELF, categorical=[False, True],
                                                       n_codes=np.array([0, 20]))
    plain = BinMapper(max_bins=64, random_state=0).fit(X[:, 1:], SELF, categorical=[False, True])
    assert small.transform(X[:, 1:]).dtype == np.uint8
    for key, value in plain.get_state().items():
        np.testing.assert_array_equal(small.get_state()[key], value)
    # state round trip, and a hostile state: a numeric feature may not have more than max_bins bins
    state = wide.get_state()
    BinMapper.validate_state(state)
    np.testing.assert_array_equal(BinMapper.from_state(state).transform(X), codes)
    bad = dict(state, categorical_=np.array([False, False, True]))
    with pytest.raises(ValueError, match="n_bins_non_missing_"):
        BinMapper.validate_state(bad)
    bad = dict(state, missing_bin_=64, n_bins_=65)
    with pytest.raises(ValueError, match="missing_bin_"):
        BinMapper.validate_state(bad)


def _codes(rng, n, n_bins):
    codes = np.empty((3, n), dtype=np.uint16)
    codes[0] = rng.integers(0, n_bins, n)          # wide categorical, missing bin included
    codes[1] = rng.integers(0, 40, n)               # numeric
    codes[1, rng.random(n) < 0.1] = n_bins - 1
    codes[2] = rng.integers(250, 270, n)            # codes either side of 255
    return codes


def test_histogram_kernels_on_uint16_codes_equal_the_reference():
    rng = np.random.default_rng(1)
    n, n_bins = 4000, LEVELS + 1
    codes = _codes(rng, n, n_bins)
    channels = rng.normal(size=(n, 3))
    rows = rng.permutation(n).astype(np.int32)[:3000]
    starts = np.array([0, 1000, 1000, 3000])
    ref = build_histograms(codes, channels, rows, starts, n_bins, backend="numpy")
    np.testing.assert_allclose(build_histograms(codes, channels, rows, starts, n_bins, backend="numba"), ref,
                               rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(build_histograms(codes, channels, None, np.array([0, n]), n_bins, backend="numba"),
                               build_histograms(codes, channels, None, np.array([0, n]), n_bins, backend="numpy"),
                               rtol=1e-12, atol=1e-12)
    # the boosting (g, h) fast path and the integer (quantized) kernel
    gh = np.ascontiguousarray(channels[:, :2])
    builder = HistogramBuilder(codes, n_bins, 2, quantized=True)
    for r, s, e in ((None, 0, n), (rows, 1000, 3000)):
        got = builder.build_node(gh, r, s, e)[0]
        idx = np.arange(s, e, dtype=np.int32) if r is None else r[s:e]
        want = build_histograms(codes, gh, idx, np.array([0, len(idx)]), n_bins, backend="numpy")[0]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    q = rng.integers(-1000, 1000, n).astype(np.int64)
    out = np.empty((3, n_bins), dtype=np.int64)
    build_int_histogram(codes, q, rows, 0, 3000, out, np.empty(3000, dtype=np.int64))
    np.testing.assert_array_equal(out, build_int_histogram_numpy(codes, q, rows[:3000])[:, :n_bins])


def _wide_hist(rng, n_nodes, missing_bin, k=1):
    hist = np.zeros((n_nodes, 3, missing_bin + 1, 2 * k))
    for n in range(n_nodes):
        for f in range(3):
            present = rng.random(missing_bin) < 0.8
            m = rng.integers(1, 30, missing_bin) * present
            hist[n, f, :missing_bin, :k] = (rng.normal(size=(missing_bin, k)) + (np.arange(missing_bin) % 7)[:, None]
                                            - 3.0) * m[:, None]
            hist[n, f, :missing_bin, k:] = rng.uniform(0.1, 0.3, size=(missing_bin, k)) * m[:, None]
    parent = hist[:, 0].sum(axis=1)
    for f in (1, 2):
        hist[:, f, missing_bin] = np.maximum(parent - hist[:, f].sum(axis=1), 0.0)
    return hist, hist[:, 0].sum(axis=1)


@pytest.mark.parametrize("crit", ["newton", "variance"])
def test_split_search_over_wide_categories_equals_the_reference(crit):
    rng = np.random.default_rng(2)
    missing_bin = LEVELS
    hist, parent = _wide_hist(rng, 6, missing_bin)
    if crit == "newton":
        criterion = NewtonCriterion(1, l2_regularization=1.0, min_samples_leaf=2, cat_smooth=1.0, cat_l2=1.0,
                                    min_data_per_group=1)
    else:
        criterion = VarianceCriterion(1, min_samples_leaf=2)
        hist[..., 1] = np.abs(hist[..., 1]) * 50  # weights
        parent = hist[:, 0].sum(axis=1)
    nb = np.array([LEVELS, 200, LEVELS])
    categorical = np.array([True, False, True])
    got = find_best_splits(hist, parent, criterion, nb, missing_bin, categorical=categorical)
    ref = find_best_splits_reference(hist, parent, criterion, nb, missing_bin, categorical=categorical)
    assert got.cat_bits.shape == (6, cat_words(missing_bin)) == (6, 5)
    for name in ("feature", "bin", "missing_left", "cat_bits"):
        np.testing.assert_array_equal(getattr(got, name), getattr(ref, name), err_msg=name)
    np.testing.assert_allclose(got.gain, ref.gain, rtol=1e-9)
    assert (got.bin == CATEGORICAL_SPLIT).any()
    assert any(bitset_bins(b).max(initial=0) > 255 for b in got.cat_bits)


def test_partition_by_a_wide_bitset_equals_the_reference():
    rng = np.random.default_rng(3)
    n, missing_bin = 3000, LEVELS
    codes = _codes(rng, n, missing_bin + 1)
    rows = np.arange(n, dtype=np.int32)
    starts, stops = np.array([0, 1000]), np.array([1000, n])
    feats = np.array([0, 2], np.int32)
    thr = np.array([CATEGORICAL_SPLIT, CATEGORICAL_SPLIT], np.int32)
    ml = np.array([1, 0], np.uint8)
    w = cat_words(missing_bin)
    bits = np.stack([cat_bitset(rng.choice(missing_bin, 150, replace=False), w), cat_bitset([250, 256, 260, 269], w)])
    got = rows.copy()
    n_left = partition_rows(got, np.empty_like(got), starts, stops, codes, feats, thr, ml, missing_bin, bits)
    want, want_left = partition_rows_reference(rows, starts, stops, codes, feats, thr, ml, missing_bin, bits)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(n_left, want_left)
    one = rows.copy()
    k = partition_segment(one, np.empty_like(one), 1000, n, codes, 2, CATEGORICAL_SPLIT, False, missing_bin,
                          cat_bits=bits[1])
    assert k == want_left[1]
    np.testing.assert_array_equal(one[1000:], want[1000:])


def _frame(n, seed, levels=LEVELS):
    rng = np.random.default_rng(seed)
    cat = rng.integers(0, levels, n)
    cat[:levels] = np.arange(levels)
    effect = np.where(np.arange(levels) >= 256, 2.0, 0.0) + rng.normal(scale=0.3, size=levels)
    x = rng.normal(size=n)
    y = effect[cat] + 0.5 * x + rng.normal(scale=0.5, size=n)
    frame = pd.DataFrame({"c": pd.Categorical(cat, categories=np.arange(levels)), "x": x})
    return frame, y, cat


GBDT_KW = dict(n_estimators=8, random_state=0, early_stopping=False, min_samples_leaf=5, cat_smooth=1.0,
               min_data_per_group=5)


def test_gbdt_with_wide_codes_predicts_alike_binned_raw_and_from_its_file(tmp_path):
    frame, y, cat = _frame(4000, 4)
    est = GBDTRegressor(**GBDT_KW).fit(frame, y)
    mapper = est.bin_mapper_
    assert est.category_coder_.n_codes_.tolist() == [LEVELS] and mapper.bin_dtype_ == np.uint16
    packed = est._packed_forest()
    assert packed["cat_bits"].shape[1] == cat_words(LEVELS) > CAT_WORDS
    cats = packed["bin_threshold"] == CATEGORICAL_SPLIT
    assert cats.any() and max(bitset_bins(b).max() for b in packed["cat_bits"][cats]) > 255
    # binned, raw and the slow reference walk agree bit for bit
    raw = est.predict(frame)
    codes = mapper.transform(est._check_predict_X(frame))
    binned = predict_values_binned(packed, codes, mapper.missing_bin_,
                                   out=np.tile(est.baseline_, (codes.shape[1], 1)))[:, 0]
    np.testing.assert_array_equal(raw, binned)
    np.testing.assert_array_equal(predict_values(packed, est._check_predict_X(frame))[:, 0],
                                  predict_reference(est.trees_, est._check_predict_X(frame))[1][:, 0])
    # an unseen category goes where missing goes
    unseen = frame.iloc[:5].copy()
    unseen["c"] = pd.Categorical([LEVELS + 7] * 5)
    missing = frame.iloc[:5].copy()
    missing["c"] = pd.Categorical([np.nan] * 5, categories=np.arange(LEVELS))
    np.testing.assert_array_equal(est.predict(unseen), est.predict(missing))
    # the model file keeps the wide bitsets and codes
    path = str(tmp_path / "wide.hfm")
    model_io.save(est, path)
    again = model_io.load(path)
    np.testing.assert_array_equal(again.predict(frame), raw)
    np.testing.assert_array_equal(again._packed_forest()["cat_bits"], packed["cat_bits"])


def test_hostile_bitset_widths_are_refused():
    frame, y, _ = _frame(2000, 5)
    est = GBDTRegressor(**dict(GBDT_KW, n_estimators=3)).fit(frame, y)
    packed = est._packed_forest()
    bins = est.bin_mapper_.bin_thresholds_
    validate_packed(packed, 2, bins)
    for width in (CAT_WORDS - 1, MAX_CAT_WORDS + 1):
        bits = np.zeros((len(packed["feature"]), width), dtype=np.uint64)
        with pytest.raises(ValueError, match="'cat_bits' has shape"):
            validate_packed(dict(packed, cat_bits=bits), 2, bins)
    # a bit past the column's codes (a word more than the model needs, bit 400 set)
    bits = np.zeros((len(packed["feature"]), cat_words(LEVELS) + 2), dtype=np.uint64)
    bits[:, :packed["cat_bits"].shape[1]] = packed["cat_bits"]
    node = int(np.flatnonzero(packed["bin_threshold"] == CATEGORICAL_SPLIT)[0])
    bits[node, 400 // 64] |= np.uint64(1) << np.uint64(400 % 64)
    with pytest.raises(ValueError, match="beyond"):
        validate_packed(dict(packed, cat_bits=bits), 2, bins)
    # the same two defects in a model file: the loader refuses each in one line
    data = model_io.dumps(est)
    for width, bit in ((MAX_CAT_WORDS + 1, 0), (cat_words(LEVELS) + 2, 400)):
        bad = model_io.loads(data)
        tree = bad.trees_[0]
        node = int(np.flatnonzero(tree.bin_threshold == CATEGORICAL_SPLIT)[0])
        wider = np.zeros((tree._capacity, width), dtype=np.uint64)
        wider[:, :tree._cat_bits.shape[1]] = tree._cat_bits
        wider[node, bit // 64] |= np.uint64(1) << np.uint64(bit % 64)
        tree._cat_bits = wider
        vars(bad).pop("_packed", None)
        with pytest.raises(ValueError, match="corrupted.*(cat_bits' has shape|beyond the 300 value bins)") as err:
            model_io.loads(model_io.dumps(bad))
        assert "\n" not in str(err.value)


def test_forests_fold_and_the_level_wise_grower_refuses_wide_codes():
    frame, y, _ = _frame(1500, 6)
    rf = RegressionForest(n_estimators=4, random_state=0).fit(frame, y)
    assert rf.category_coder_.n_codes_.tolist() == [255] and rf.bin_mapper_.n_bins_ == 256
    rng = np.random.default_rng(7)
    X = _wide_matrix(600, rng)
    mapper = BinMapper(max_bins=64).fit(X, SELF, categorical=[True, False, False], n_codes=np.array([LEVELS, 0, 0]))
    crit = VarianceCriterion(1)
    with pytest.raises(ValueError, match="level-wise grower takes bin axes of up to 256"):
        grow_levelwise(mapper.transform(X), crit.make_channels(rng.normal(size=600)),
                       [np.arange(600, dtype=np.int32)], crit, mapper, comm=SELF)


def test_cuda_backend_folds_and_its_kernel_refuses_uint16():
    from histogram.cuda_kernels import check_narrow_codes

    assert GBDTClassifier(backend="cuda")._category_code_cap is None
    assert GBDTClassifier()._category_code_cap == MAX_CATEGORY_CODES
    check_narrow_codes(np.zeros((1, 3), np.uint8))
    with pytest.raises(ValueError, match="uint8 codes"):
        check_narrow_codes(np.zeros((1, 3), np.uint16))
    assert bin_dtype(256) == np.uint8 and bin_dtype(257) == np.uint16


def test_fingerprint_of_uint16_codes_equals_the_reference():
    from forest.io.fingerprint import row_hashes, row_hashes_reference

    rng = np.random.default_rng(10)
    gids = np.arange(500, dtype=np.int64) * 7
    codes = _codes(rng, 500, LEVELS + 1)
    got = row_hashes(gids, codes)
    np.testing.assert_array_equal(got, row_hashes_reference(gids, codes))
    # codes that fit a byte hash alike as uint8 and uint16
    np.testing.assert_array_equal(row_hashes(gids, codes % 200), row_hashes(gids, (codes % 200).astype(np.uint8)))
    assert not np.array_equal(got, row_hashes(gids, codes % 256))


def _sorted_frame(n, seed):
    """Rows sorted by category: over ranks of contiguous blocks most categories live on one rank."""
    frame, y, cat = _frame(n, seed)
    order = np.argsort(cat, kind="stable")
    return frame.iloc[order].reset_index(drop=True), y[order]


def _same_model(est, ref, frame):
    assert est.bin_mapper_.bin_dtype_ == np.uint16
    assert est.category_coder_.categories_[0].tolist() == ref.category_coder_.categories_[0].tolist()
    a, b = est._packed_forest(), ref._packed_forest()
    for key in ("feature", "bin_threshold", "missing_left", "cat_bits", "tree_offsets"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    # leaf values are sums over ranks: equal up to the summation order
    np.testing.assert_allclose(est.predict(frame), ref.predict(frame), rtol=1e-12, atol=1e-12)


def test_same_wide_model_at_any_rank_count_with_categories_on_some_ranks_only():
    from native.threads import ThreadWorld

    frame, y = _sorted_frame(2400, 8)
    kw = dict(GBDT_KW, n_estimators=5)
    ref = GBDTRegressor(**kw).fit(frame, y, comm=SELF)
    assert (ref._packed_forest()["bin_threshold"] == CATEGORICAL_SPLIT).any()
    # two ranks with the histograms reduce-scattered (each rank searches some features, the
    # wide bitsets travel in the split record), three with them allreduced
    for p, mode in ((2, "reduce_scatter"), (3, "allreduce")):
        def body(comm):
            lo, hi = len(y) * comm.rank // p, len(y) * (comm.rank + 1) // p
            return GBDTRegressor(**kw, split_mode=mode).fit(frame.iloc[lo:hi], y[lo:hi], comm=comm)

        for est in ThreadWorld(p).run(body):
            _same_model(est, ref, frame)


@pytest.mark.mpi
def test_wide_codes_under_mpirun(comm):
    frame, y = _sorted_frame(2400, 9)
    kw = dict(GBDT_KW, n_estimators=5)
    lo, hi = len(y) * comm.rank // comm.size, len(y) * (comm.rank + 1) // comm.size
    est = GBDTRegressor(**kw).fit(frame.iloc[lo:hi], y[lo:hi], comm=comm)
    _same_model(est, GBDTRegressor(**kw).fit(frame, y, comm=SELF), frame)


def test_rounding_only_categories_of_a_subtracted_sibling_are_dropped():
    from forest.engine.categorical_split import drop_stray_categories

    parent = np.zeros((2, 5, 2))
    parent[:, :4] = [[3.0, 10.0], [-1.0, 5.0], [0.5, 2.0], [1.0, 1e-20]]
    parent[:, 4] = [0.25, 1.0]
    sib = parent.copy()
    sib[1] = 0.0                   # feature 1 (categorical) of the sibling: no rows, but...
    sib[1, 0] = [1e-17, 0.0]       # rounding residue of the gradient: dropped
    sib[1, 1] = [1e-17, 1e-16]     # and of both channels: dropped
    sib[1, 2] = [0.5, 0.25]        # a real category: kept
    sib[1, 3] = [0.0, 1e-20]       # a real one of tiny hessian (< rel_tol of the total): dropped
    sib[1, 4] = [1e-17, 0.0]       # the missing bin is not a category: kept
    want = sib.copy()
    want[1, [0, 1, 3]] = 0.0
    drop_stray_categories(sib, parent, np.array([1]), 1, 2, 4, 1e-12)
    np.testing.assert_array_equal(sib, want)

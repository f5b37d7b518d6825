"""Model files: exact round trips, the no-pickle guarantee, clear failures, atomic writes."""
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from forest.io import model_io
from forest.io.model_io import ModelFormatError
from forest.engine.tree import Tree


class Holder:
    """A container standing in for an estimator with a rich fitted state."""

    def get_params(self, deep=False):
        return {"alpha": self.alpha}


@pytest.fixture
def holder_registered(monkeypatch):
    # Tests may not register classes outside histforest through the public API;
    # the registry dict is patched directly for the walker tests.
    monkeypatch.setitem(model_io._REGISTRY, model_io._class_name(Holder), Holder)
    monkeypatch.setattr(model_io, "_ALLOWED_PACKAGES", model_io._ALLOWED_PACKAGES + (Holder.__module__.split(".")[0],))
    return Holder


def _tree(rng, n_outputs=3):
    t = Tree(n_outputs)
    root = t.add_node(0, 10.0, rng.normal(size=n_outputs))
    left = t.add_node(1, 4.0, rng.normal(size=n_outputs))
    right = t.add_node(1, 6.0, rng.normal(size=n_outputs))
    t.set_split(root, 2, 17, 0.123456789, True, 3.5, left, right)
    return t


def _rich(holder, rng):
    h = holder()
    h.alpha = 0.05
    h.coef_ = rng.normal(size=(4, 3))
    h.classes_ = np.array(["a", "b"], dtype=object)
    h.names_ = np.array(["x0", "x1"])
    h.n_ = np.int64(7)
    h.scale_ = np.float32(1.5)
    h.bad_ = float("nan")
    h.inf_ = float("-inf")
    h.pair_ = (1, "two", [3.0, None])
    h.by_int_ = {0: np.arange(3), 5: {"nested": True}}
    h.dtype_ = np.dtype("int16")
    h.trees_ = [_tree(rng), _tree(rng, 1)]
    h.empty_ = np.zeros((0, 2))
    return h


def test_round_trip_generic_state(tmp_path, rng, holder_registered):
    h = _rich(holder_registered, rng)
    path = tmp_path / "m.hfm"
    model_io.save(h, str(path), metadata={"treatment": "t"})
    g = model_io.load(str(path))
    assert type(g) is holder_registered
    np.testing.assert_array_equal(g.coef_, h.coef_)
    assert g.classes_.dtype == object and list(g.classes_) == ["a", "b"]
    assert g.names_.dtype == h.names_.dtype and list(g.names_) == ["x0", "x1"]
    assert type(g.n_) is np.int64 and g.n_ == 7
    assert type(g.scale_) is np.float32 and g.scale_ == np.float32(1.5)
    assert np.isnan(g.bad_) and g.inf_ == -np.inf
    assert g.pair_ == (1, "two", [3.0, None])
    assert set(g.by_int_) == {0, 5} and g.by_int_[5] == {"nested": True}
    np.testing.assert_array_equal(g.by_int_[0], np.arange(3))
    assert g.dtype_ == np.dtype("int16")
    assert g.trees_ == h.trees_ and isinstance(g.trees_[0], Tree)
    assert g.empty_.shape == (0, 2)
    header = model_io.read_header(str(path))
    assert header["format"] == "histforest-model" and header["format_version"] == model_io.FORMAT_VERSION
    assert header["metadata"] == {"treatment": "t"}
    assert header["params"] == {"$dict": [["alpha", 0.05]]}


def test_tree_uses_compact_state(tmp_path, rng):
    t = _tree(rng)
    model_io.save(t, str(tmp_path / "t.hfm"))
    header = model_io.read_header(str(tmp_path / "t.hfm"))
    assert header["via"] == "from_arrays"
    # trimmed arrays: 3 nodes, not the 16-slot capacity
    assert all(info["shape"][0] == 3 for info in header["arrays"].values())
    assert model_io.load(str(tmp_path / "t.hfm")) == t


def test_bin_mapper_round_trip(tmp_path, rng):
    from histogram.binning import BinMapper

    X = rng.normal(size=(500, 3))
    X[::7, 1] = np.nan
    bm = BinMapper(max_bins=31).fit(X)
    model_io.save(bm, str(tmp_path / "b.hfm"))
    bm2 = model_io.load(str(tmp_path / "b.hfm"))
    np.testing.assert_array_equal(bm2.transform(X), bm.transform(X))
    for a, b in zip(bm.bin_thresholds_, bm2.bin_thresholds_):
        np.testing.assert_array_equal(a, b)


def test_unregistered_class_is_refused_on_save(tmp_path, rng, holder_registered):
    h = _rich(holder_registered, rng)
    h.callback_ = lambda: None
    with pytest.raises(TypeError, match="callback_"):
        model_io.save(h, str(tmp_path / "m.hfm"))
    assert not os.listdir(tmp_path)


def _saved(tmp_path, rng):
    path = str(tmp_path / "t.hfm")
    model_io.save(_tree(rng), path)
    return path


def test_truncated_file_fails_clearly(tmp_path, rng):
    path = _saved(tmp_path, rng)
    data = open(path, "rb").read()
    for cut in (len(data) // 2, len(data) - 10, 100):
        with open(path, "wb") as f:
            f.write(data[:cut])
        with pytest.raises(ModelFormatError, match="truncated or corrupted"):
            model_io.load(path)


def test_corrupted_array_bytes_fail_clearly(tmp_path, rng):
    path = _saved(tmp_path, rng)
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("arrays/0.npy")
    data = bytearray(open(path, "rb").read())
    # flip a byte inside the first array's stored payload (after its local header)
    pos = info.header_offset + 30 + len(info.filename) + info.file_size - 3
    data[pos] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(ModelFormatError, match="truncated or corrupted"):
        model_io.load(path)


def _rewrite_header(path, change):
    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    header = json.loads(entries[model_io.HEADER_NAME])
    change(header)
    entries[model_io.HEADER_NAME] = json.dumps(header).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for n, b in entries.items():
            zf.writestr(n, b)


def test_newer_format_version_fails_clearly(tmp_path, rng):
    path = _saved(tmp_path, rng)
    _rewrite_header(path, lambda h: h.update(format_version=model_io.FORMAT_VERSION + 1))
    with pytest.raises(ModelFormatError, match="newer than this histforest"):
        model_io.load(path)


def test_not_a_model_file(tmp_path):
    p = tmp_path / "x.parquet"
    p.write_bytes(b"PAR1" + b"\0" * 100)
    with pytest.raises(ModelFormatError, match="not a histforest model file"):
        model_io.load(str(p))
    z = tmp_path / "x.npz"
    np.savez(z, a=np.arange(3))
    with pytest.raises(ModelFormatError, match="not a histforest model file"):
        model_io.load(str(z))
    with pytest.raises(ModelFormatError, match="cannot read model file"):
        model_io.load(str(tmp_path / "missing.hfm"))


def test_wrong_kind_fails_clearly(tmp_path, rng):
    from histogram.binning import BinMapper

    path = _saved(tmp_path, rng)
    with pytest.raises(ModelFormatError, match="holds a Tree, but a BinMapper is needed"):
        model_io.load(path, expect=BinMapper)


def test_file_cannot_name_foreign_classes(tmp_path, rng):
    path = _saved(tmp_path, rng)
    _rewrite_header(path, lambda h: h.update(estimator="os.system"))
    with pytest.raises(ModelFormatError, match="not a histforest class"):
        model_io.load(path)
    _rewrite_header(path, lambda h: h.update(estimator="forest.io.model_io.ModelFormatError"))
    with pytest.raises(ModelFormatError, match="not registered"):
        model_io.load(path)


def test_object_arrays_are_never_unpickled(tmp_path, rng):
    path = _saved(tmp_path, rng)
    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    import io

    buf = io.BytesIO()
    np.save(buf, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    entries["arrays/0.npy"] = buf.getvalue()
    with zipfile.ZipFile(path, "w") as zf:
        for n, b in entries.items():
            zf.writestr(n, b)
    with pytest.raises(ModelFormatError, match="is corrupted: arrays/0.npy does not match the header"):
        model_io.load(path)
    # The header table naming the object dtype as well does not make it acceptable.
    _rewrite_header(path, lambda h: h["arrays"]["0"].update(dtype="|O"))
    with pytest.raises(ModelFormatError, match=r"dtype '\|O' is not allowed"):
        model_io.load(path)


def test_crash_during_write_leaves_target_untouched(tmp_path, rng, monkeypatch):
    path = str(tmp_path / "m.hfm")
    old = _tree(rng)
    model_io.save(old, path)
    before = open(path, "rb").read()
    calls = []
    real = np.lib.format.write_array

    def wrapper(f, arr, allow_pickle=False):
        calls.append(1)
        if len(calls) == 3:
            f.write(b"partial")
            raise OSError("disk full")
        return real(f, arr, allow_pickle=allow_pickle)

    monkeypatch.setattr(np.lib.format, "write_array", wrapper)
    with pytest.raises(OSError, match="disk full"):
        model_io.save(_tree(rng, 2), path)
    assert open(path, "rb").read() == before
    assert os.listdir(tmp_path) == ["m.hfm"]  # no temporary file left behind


def test_hard_kill_during_write_leaves_target_untouched(tmp_path):
    # A process killed mid-write (no Python cleanup at all) must not leave a partial
    # model at the target path.
    path = str(tmp_path / "m.hfm")
    code = f"""
import os, numpy as np
from forest.io import model_io
from forest.engine.tree import Tree
t = Tree(2); t.add_node(0, 1.0, [1.0, 2.0])
model_io.save(t, {path!r})
real = np.lib.format.write_array
def dying(f, arr, allow_pickle=False):
    f.write(b"x" * 1000); f.flush()
    os._exit(9)
np.lib.format.write_array = dying
model_io.save(t, {path!r})
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert proc.returncode == 9, proc.stderr.decode()
    t = model_io.load(path)
    assert t.node_count == 1


def test_estimator_attribute_errors_name_the_path(tmp_path, holder_registered):
    h = holder_registered()
    h.alpha = 1.0
    h.nested_ = {"k": [1, object()]}
    with pytest.raises(TypeError, match=r"estimator\.nested_\['k'\]\[1\]"):
        model_io.save(h, str(tmp_path / "m.hfm"))


def test_classifier_on_pandas_string_labels_round_trips(tmp_path):
    # pandas string labels give classes_ of dtype object: the file used to be refused as corrupted
    import pandas as pd

    from forest import GBDTClassifier

    rng = np.random.default_rng(0)
    X = rng.uniform(size=(300, 3))
    y = pd.Series(np.array(["a", "b", "c"])[(X[:, 0] * 3).astype(int)])
    model = GBDTClassifier(n_estimators=5, random_state=0).fit(X, y)
    assert model.classes_.dtype == object
    path = str(tmp_path / "labels.model")
    model_io.save(model, path)
    loaded = model_io.load(path)
    assert list(loaded.classes_) == ["a", "b", "c"]
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    np.testing.assert_array_equal(loaded.predict_proba(X), model.predict_proba(X))

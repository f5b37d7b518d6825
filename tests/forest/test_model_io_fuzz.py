"""Hostile model files: targeted edits that used to crash or hang, and a mutation fuzzer.

A child index out of range used to make prediction read outside the node arrays
(a segfault in the Numba kernel), and a child pointing back up made it loop forever;
loading now checks the whole structure and fails with one line. The fuzzer
(``model_fuzzer.py``) runs in a subprocess, so a crash fails the test instead of
killing pytest, with a watchdog for hangs.
"""
import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from forest.io import model_io
from forest.io.model_io import HEADER_NAME, ModelFormatError
from native.comm import SelfCommunicator

HERE = os.path.dirname(os.path.abspath(__file__))
KINDS = ("causal", "regression", "gbdt-regressor", "gbdt-classifier", "gbdt-multiclass")


def _fit(kind):
    from forest import CausalForest, GBDTClassifier, GBDTRegressor, RegressionForest

    rng = np.random.default_rng(5)
    n = 300
    X = rng.normal(size=(n, 4))
    X[rng.uniform(size=n) < 0.1, 1] = np.nan
    t = (rng.uniform(size=n) < 0.5).astype(float)
    y = X[:, 0] + t * (1 + (X[:, 2] > 0)) + 0.3 * rng.normal(size=n)
    comm = SelfCommunicator()
    if kind == "causal":
        return CausalForest(n_estimators=8, nuisance_estimators=4, random_state=1).fit(X, t, y, comm=comm)
    if kind == "regression":
        return RegressionForest(n_estimators=6, random_state=2).fit(X, y, comm=comm)
    if kind == "gbdt-regressor":
        return GBDTRegressor(n_estimators=5, max_leaf_nodes=6, random_state=0).fit(X, y, comm=comm)
    labels = (y > 0.5).astype(int) if kind == "gbdt-classifier" else np.digitize(y, [0.0, 1.5])
    return GBDTClassifier(n_estimators=5, max_leaf_nodes=6, random_state=0).fit(X, labels, comm=comm)


@pytest.fixture(scope="module")
def seed_models(tmp_path_factory):
    """One small fitted model file per estimator kind."""
    folder = tmp_path_factory.mktemp("seeds")
    paths = {}
    for kind in KINDS:
        paths[kind] = str(folder / f"{kind}.model")
        model_io.save(_fit(kind), paths[kind], metadata={"model": kind})
    return paths


def _edit(path, out, change_arrays=None, change_header=None):
    """Copy model file ``path`` to ``out`` with edited arrays ``{attribute: fn(array) -> array}``."""
    with zipfile.ZipFile(path) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    header = json.loads(entries[HEADER_NAME])
    refs = _array_refs(header["state"])
    for attr, fn in (change_arrays or {}).items():
        key = refs[attr]
        import io

        arr = np.lib.format.read_array(io.BytesIO(entries[f"arrays/{key}.npy"]))
        arr = fn(arr.copy())
        buf = io.BytesIO()
        np.lib.format.write_array(buf, arr)
        entries[f"arrays/{key}.npy"] = buf.getvalue()
        header["arrays"][key] = {"dtype": arr.dtype.str, "shape": list(arr.shape)}
    if change_header is not None:
        change_header(header)
    entries[HEADER_NAME] = json.dumps(header).encode()
    with zipfile.ZipFile(out, "w") as zf:
        for n, b in entries.items():
            zf.writestr(n, b)
    return out


def _array_refs(state, prefix=""):
    """``{"estimators_.left": array key, ...}`` for the arrays of a state."""
    out = {}
    for key, value in state["$dict"]:
        if isinstance(value, dict) and "$array" in value:
            out[prefix + key] = value["$array"]
        elif isinstance(value, dict) and "$dict" in value:
            out.update(_array_refs(value, f"{prefix}{key}."))
        elif isinstance(value, dict) and "$object" in value:
            out.update(_array_refs(value["state"], f"{prefix}{key}."))
    return out


def _set(i, v):
    def change(a):
        a[i] = v
        return a
    return change


@pytest.mark.parametrize("forest,field,value,pattern", [
    ("estimators_", "left", 10 ** 6, r"left child 1000000 is not a later node of the same tree"),
    ("estimators_", "right", 0, r"right child 0 is not a later node"),          # back to the root: a cycle
    ("estimators_", "left", -5, r"left child -5 is not a later node"),
    ("estimators_", "feature", 7, r"splits on feature 7, but the model has 4 features"),
    ("estimators_", "bin_threshold", 300, r"bin threshold 300 is not a value bin of feature"),
    ("estimators_", "threshold", np.nan, r"threshold nan is not the upper edge"),
    ("estimators_", "tree_offsets", 10 ** 9, r"'tree_offsets' must rise strictly from 0"),
])
def test_edited_causal_structure_is_refused_in_one_line(seed_models, tmp_path, forest, field, value, pattern):
    est = model_io.load(seed_models["causal"])
    root_split = int(np.flatnonzero(est.estimators_["feature"] >= 0)[0])
    index = 2 if field == "tree_offsets" else root_split
    bad = _edit(seed_models["causal"], str(tmp_path / "bad.model"), {f"{forest}.{field}": _set(index, value)})
    with pytest.raises(ModelFormatError, match=pattern) as info:
        model_io.load(bad)
    assert "\n" not in str(info.value) and "is corrupted" in str(info.value)


def test_edited_nuisance_forest_is_refused(seed_models, tmp_path):
    # Held-out doubly robust scores predict with the causal forest's nuisance forests.
    est = model_io.load(seed_models["causal"])
    split = int(np.flatnonzero(est.outcome_forest_.estimators_["feature"] >= 0)[0])
    bad = _edit(seed_models["causal"], str(tmp_path / "bad.model"),
                {"outcome_forest_.estimators_.right": _set(split, split)})
    with pytest.raises(ModelFormatError, match=r"is corrupted: outcome_forest_: estimators_: tree \d+, node \d+: "
                                               r"right child \d+ is not a later node"):
        model_io.load(bad)


def test_cycle_and_out_of_range_child_in_gbdt_are_refused(seed_models, tmp_path):
    # GBDT keeps its trees and a packed copy: the packed copy is what prediction walks.
    est = model_io.load(seed_models["gbdt-regressor"])
    split = int(np.flatnonzero(est._packed["feature"] >= 0)[-1])
    for value, pattern in ((split, "is not a later node"), (10 ** 6, "is not a later node")):
        bad = _edit(seed_models["gbdt-regressor"], str(tmp_path / "bad.model"),
                    {"_packed.left": _set(split, value)})
        with pytest.raises(ModelFormatError, match=pattern):
            model_io.load(bad)


def test_packed_copy_that_disagrees_with_the_trees_is_refused(seed_models, tmp_path):
    est = model_io.load(seed_models["gbdt-regressor"])
    leaf = int(np.flatnonzero(est._packed["feature"] < 0)[0])
    bad = _edit(seed_models["gbdt-regressor"], str(tmp_path / "bad.model"), {"_packed.value": _set(leaf, 123.0)})
    with pytest.raises(ModelFormatError, match="_packed is not the packing of trees_"):
        model_io.load(bad)


def test_bin_mapper_state_is_checked(seed_models, tmp_path):
    bad = _edit(seed_models["regression"], str(tmp_path / "bad.model"),
                {"bin_mapper_.thresholds_flat_": lambda a: a[::-1].copy()})
    with pytest.raises(ModelFormatError, match="bin mapper thresholds of feature 0 do not increase strictly"):
        model_io.load(bad)


@pytest.mark.parametrize("source,named", [
    ("causal", "forest.gbdt.GBDTClassifier"), ("gbdt-classifier", "forest.gbdt.GBDTRegressor"),
    ("regression", "forest.causal_forest.CausalForest"), ("gbdt-regressor", "forest.gbdt.GBDTClassifier"),
    ("causal", "forest.tree.Tree"), ("regression", "histogram.binning.BinMapper"),
])
def test_header_naming_another_class_says_the_contents_do_not_match(seed_models, tmp_path, source, named):
    bad = _edit(seed_models[source], str(tmp_path / "bad.model"), change_header=lambda h: h.update(estimator=named))
    with pytest.raises(ModelFormatError, match=f"names class {named.rsplit('.', 1)[-1]}, but its contents do "
                                               f"not match that class"):
        model_io.load(bad)


def test_unfitted_model_file_still_loads(tmp_path):
    from forest import GBDTClassifier

    path = str(tmp_path / "unfitted.model")
    model_io.save(GBDTClassifier(n_estimators=3), path)
    assert model_io.load(path).get_params()["n_estimators"] == 3


def test_every_seed_model_round_trips_through_the_checks(seed_models):
    X = np.random.default_rng(1).normal(size=(10, 4))
    for kind, path in seed_models.items():
        est = model_io.load(path)
        assert np.isfinite(np.asarray(est.predict(X), dtype=float)).all(), kind


def test_fuzzed_model_files_load_cleanly_or_fail_in_one_line(seed_models, tmp_path):
    """Thousands of mutants over all estimator kinds: one-line refusal or a working model."""
    cases_per_model = int(os.environ.get("HISTFOREST_FUZZ_CASES", "400"))  # more for a long local run
    proc = subprocess.run([sys.executable, os.path.join(HERE, "model_fuzzer.py"), "20250611", str(cases_per_model),
                           str(tmp_path)] + [seed_models[k] for k in KINDS],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, NUMBA_NUM_THREADS="1"))
    lines = proc.stderr.strip().splitlines()
    last_case = [ln for ln in lines if ln.startswith("case ")][-1:]
    assert proc.returncode == 0, (f"fuzzer died (status {proc.returncode}) in " + "".join(last_case) + "\n"
                                  + "\n".join(ln for ln in lines[-12:] if not ln.startswith("case ")))
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["failures"] == [], "\n".join(summary["failures"][:20])
    assert summary["cases"] == cases_per_model * len(KINDS)
    # Both outcomes occur for every kind: the mutations reach the content checks, and
    # some edits (a leaf value of a forest, a validation loss) leave a model that loads
    # and must then predict.
    for kind, counts in summary["by_model"].items():
        assert counts["refused"] > cases_per_model // 2 and counts["loaded"] >= 1, (kind, counts)
    assert summary["loaded"] >= 20, summary
    print(f"fuzzer: {summary['cases']} cases, {summary['refused']} refused, {summary['loaded']} loaded, "
          f"max CPU per case {summary['max_cpu_s']:.3f} s")

"""Model files written before the layout of issue 31 still load and predict as they did.

``tests/forest/data/*.model`` were written by the code of git 6c10034, when the
estimators lived in ``forest/causal_forest.py`` and so on (the generator beside them),
together with their predictions on 40 rows. Files name classes by the names they were
written with (``forest.causal_forest.CausalForest``); each estimator registers under
that name wherever its module lives now.
"""
import os

import numpy as np
import pytest

from forest import model_io
from forest.io.model_checks import ADDED_PARAMS

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
KINDS = ("causal", "regression", "instrumental", "gbdt", "policy")


@pytest.mark.parametrize("kind", KINDS)
def test_a_file_of_before_the_move_predicts_as_it_did(kind):
    expected = np.load(os.path.join(DATA, "predictions.npz"))
    path = os.path.join(DATA, f"{kind}.model")
    est = model_io.load(path)
    got = est.predict_proba(expected["X"]) if kind == "gbdt" else est.predict(expected["X"])
    np.testing.assert_array_equal(got, expected[kind])
    assert model_io.read_header(path)["estimator"].count(".") == 2      # forest.<old module>.<Class>


#: Parameters added since the files were written: the model-file defaults of ADDED_PARAMS, and
#: alpha and imbalance_penalty, RegressionForest parameters since issue 38 (restored by its
#: _model_io_restore_) that the CausalForest had before, so they are dropped only where the old
#: file lacks them.
ADDED_SINCE = tuple(ADDED_PARAMS) + ("alpha", "imbalance_penalty")


def _without_added(node, then):
    """A header tree without the entries of parameters added after the file was written (nested ones too),
    walked beside the old file's tree ``then``."""
    if isinstance(node, dict):
        then = then if isinstance(then, dict) else {}
        out = {k: _without_added(v, then.get(k)) for k, v in node.items() if k != "$dict"}
        if "$dict" in node:
            old = {kv[0]: kv[1] for kv in then.get("$dict", []) if isinstance(kv[0], str)}
            out["$dict"] = [[kv[0], _without_added(kv[1], old.get(kv[0]))] for kv in node["$dict"]
                            if not (isinstance(kv[0], str) and kv[0] in ADDED_SINCE and kv[0] not in old)]
        return out
    if isinstance(node, list):
        then = then if isinstance(then, list) and len(then) == len(node) else [None] * len(node)
        return [_without_added(v, t) for v, t in zip(node, then)]
    return node


def test_files_written_now_use_the_same_class_names(tmp_path):
    est = model_io.load(os.path.join(DATA, "causal.model"))
    path = str(tmp_path / "again.model")
    model_io.save(est, path)
    assert model_io.read_header(path)["estimator"] == "forest.causal_forest.CausalForest"
    header_then = model_io.read_header(os.path.join(DATA, "causal.model"))
    header_now = model_io.read_header(path)
    # parameters added since (forest.io.model_checks.ADDED_PARAMS) are written with their defaults
    for key in ("params", "state"):
        header_now[key] = _without_added(header_now[key], header_then[key])
    for key in ("estimator", "params", "state", "arrays"):
        assert header_now[key] == header_then[key]

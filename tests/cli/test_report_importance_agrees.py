"""The importances a user reads in ``forest-report`` are the estimator's own attributes."""
import json
import subprocess

import numpy as np
import pytest

from cli_helpers import tool
from forest.io import model_io
from forest.report import summary as rep
from forest.engine.importance import depth_weighted_importance
from forest.engine.tree import Tree, pack_trees


def _stump(feature):
    t = Tree(1)
    root = t.add_node(0, 2.0, [0.0])
    t.set_split(root, feature, 0, 0.5, False, 1.0, t.add_node(1, 1.0, [0.0]), t.add_node(1, 1.0, [0.0]))
    return t


def test_two_stumps_give_grfs_value():
    # GRF divides by the weights of all max_depth levels, also the ones without splits:
    # 0.5 / (1 + 1/4 + 1/9 + 1/16) = 0.3512..., not 0.5.
    trees = [_stump(0), _stump(1)]
    expected = 0.5 / sum(k ** -2.0 for k in range(1, 5))
    for source in (trees, pack_trees(trees)):
        np.testing.assert_allclose(depth_weighted_importance(source, 2), [expected, expected], rtol=1e-14)
    np.testing.assert_allclose(rep.importances(trees, 2)["depth_weighted"], [expected, expected], rtol=1e-14)


@pytest.mark.parametrize("kind", ["causal", "regression"])
def test_estimator_attribute_equals_report_json(kind, tmp_path):
    from forest import CausalForest, RegressionForest

    rng = np.random.default_rng(0)
    X = rng.normal(size=(600, 4))
    t = (rng.uniform(size=600) < 0.5).astype(float)
    y = X[:, 0] + t * (1 + (X[:, 1] > 0)) + 0.1 * rng.normal(size=600)
    if kind == "causal":
        est = CausalForest(n_estimators=8, nuisance_estimators=4, max_depth=3, random_state=1).fit(X, t, y)
    else:
        est = RegressionForest(n_estimators=8, max_depth=3, random_state=1).fit(X, y)
    path = str(tmp_path / "m.model")
    model_io.save(est, path)
    out = subprocess.run([tool("forest-report"), path, "--json"], capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)["importance"]
    np.testing.assert_allclose(report["depth_weighted"], est.feature_importances_, rtol=1e-12)
    np.testing.assert_allclose(report["gain"], est.gain_importances_, rtol=1e-12)

"""The model-kind table (forest.estimators.kinds) agrees with the estimators and drives forest-train."""
import inspect

import pytest

from forest.cli import train
from forest.estimators.kinds import KINDS, ROLES, estimator_classes, kind_of

#: How each estimator's ``fit`` names the argument of a role.
ARGUMENT = {"treatment": "t", "outcome": "y", "instrument": "z", "time": "time", "event": "event"}


@pytest.mark.parametrize("name", sorted(KINDS))
def test_each_kind_names_fits_targets_in_fits_order(name):
    kind = KINDS[name]
    cls = kind.estimator_class()
    params = list(inspect.signature(cls.fit).parameters)
    assert params[:2] == ["self", "X"]
    assert params[2:2 + len(kind.targets)] == [ARGUMENT[r] for r in kind.targets]
    assert set(kind.targets) <= set(ROLES)
    assert ("clusters" in params) == kind.clusters
    assert kind_of(cls()) is kind


def test_the_tools_read_the_table():
    assert set(train.MODELS) == set(KINDS)
    assert len(estimator_classes()) == len(KINDS)
    assert kind_of(object()) is None


@pytest.mark.parametrize("argv, message", [
    (["--demo", "--model", "regression", "--treatment", "t"], "--treatment is only used by the causal, "
                                                                "instrumental and causal-survival models, not "
                                                                "'regression'"),
    (["--demo", "--model", "instrumental"], "--instrument COL is required for the instrumental model"),
    (["--demo", "--model", "gbdt-regressor", "--cluster", "x0"], "--cluster is only used by the causal, "
                                                                  "instrumental, regression, survival, "
                                                                  "causal-survival and probability models"),
])
def test_forest_train_refuses_options_a_kind_does_not_take(argv, message, capsys, tmp_path):
    assert train.main(argv + ["--out", str(tmp_path / "m.model")]) == 2
    assert message in capsys.readouterr().err

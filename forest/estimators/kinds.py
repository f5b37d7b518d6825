"""The model kinds: one record per estimator the command-line tools offer, read by everything that asks.

Before this module the answer to "which estimators exist, and what does each take?"
was written in several places (``forest-train``'s ``--model`` table and its fit call
per kind, the classes ``forest-predict`` and ``forest-report`` accept, the target
columns the report reads to recognise training rows). Now each kind is one
:class:`ModelKind` in :data:`KINDS`, and the tools read it:

* ``forest-train``: ``--model`` choices, which of ``--treatment`` / ``--instrument`` /
  ``--cluster`` a kind takes, and the ``fit`` call (the target columns in ``fit``'s
  order, :func:`fit_targets`);
* ``forest-predict`` / ``forest-report``: the classes a model file may hold
  (:func:`estimator_classes`);
* ``forest-report``: the columns of a kind's targets (:attr:`ModelKind.targets`).

Classes are named by module path and imported when asked for, so listing the kinds
(``forest-train --help``) imports no estimator. This module imports nothing of
``forest``: the estimators do not import it, and nothing it names imports it back.

A new kind is one more record (and, for ``forest-train --plan`` and
``forest-warmup``, a cost family and warm-up variants in ``forest/cli/cost_model.py``
and ``forest/cli/warmup.py``; a kind without them is trained without a plan and warmed
up by its first fit).
"""
import importlib
from dataclasses import dataclass

#: Target roles, as ``forest-train`` options and model-file metadata keys name them.
ROLES = ("treatment", "instrument", "outcome", "time", "event")


@dataclass(frozen=True)
class ModelKind:
    """One estimator as the command-line tools see it.

    Attributes
    ----------
    name : str
        ``forest-train --model NAME``.
    module, class_name : str
        Where the estimator class lives.
    targets : tuple of str
        ``fit``'s target arguments in ``fit``'s order, by role (:data:`ROLES`):
        ``fit(X, *targets, sample_weight=...)``.
    clusters : bool
        ``fit`` takes ``clusters=`` (``--cluster``).
    class_labels : bool
        The outcome holds class labels (read as labels, not numbers).
    """

    name: str
    module: str
    class_name: str
    targets: tuple
    clusters: bool = False
    class_labels: bool = False

    def estimator_class(self):
        """The class (imports its module)."""
        return getattr(importlib.import_module(self.module), self.class_name)

    def takes(self, role):
        """Whether ``fit`` takes the target of ``role``."""
        return role in self.targets


KINDS = {k.name: k for k in (
    ModelKind("causal", "forest.estimators.causal_forest", "CausalForest", ("treatment", "outcome"), clusters=True),
    ModelKind("instrumental", "forest.estimators.instrumental_forest", "InstrumentalForest",
              ("treatment", "outcome", "instrument"), clusters=True),
    ModelKind("regression", "forest.estimators.regression_forest", "RegressionForest", ("outcome",), clusters=True),
    ModelKind("quantile", "forest.estimators.quantile_forest", "QuantileForest", ("outcome",)),
    ModelKind("survival", "forest.estimators.survival_forest", "SurvivalForest", ("time", "event"), clusters=True),
    ModelKind("causal-survival", "forest.estimators.causal_survival_forest", "CausalSurvivalForest",
              ("treatment", "time", "event"), clusters=True),
    ModelKind("probability", "forest.estimators.probability_forest", "ProbabilityForest", ("outcome",), clusters=True,
              class_labels=True),
    ModelKind("gbdt-regressor", "forest.estimators.gbdt", "GBDTRegressor", ("outcome",)),
    ModelKind("gbdt-classifier", "forest.estimators.gbdt", "GBDTClassifier", ("outcome",), class_labels=True),
)}


def kind_of(estimator):
    """The :class:`ModelKind` of a fitted estimator (by its class), or None."""
    cls = type(estimator)
    return next((k for k in KINDS.values() if k.class_name == cls.__name__ and k.module == cls.__module__), None)


def estimator_classes():
    """Every kind's class, in :data:`KINDS` order, each once (imports their modules)."""
    seen = []
    for kind in KINDS.values():
        cls = kind.estimator_class()
        if cls not in seen:
            seen.append(cls)
    return tuple(seen)


def fit_targets(kind, columns):
    """``fit``'s target arguments of ``kind`` from ``columns`` (role -> array), in ``fit``'s order."""
    return [columns[role] for role in kind.targets]

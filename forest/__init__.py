"""forest: tree engine, estimators, model files, command-line tools and reports.

The estimators are exported lazily (PEP 562), so ``import forest`` (and therefore
``forest-train --help``) does not pay for importing scikit-learn and compiling
Numba kernels until an estimator is actually used::

    from forest import CausalForest, InstrumentalForest, RegressionForest, GBDTRegressor, GBDTClassifier
    from forest import Checkpoint, merge_forests    # checkpoint/resume, merging forests
    from forest import TrainingRowsNotice           # training rows passed as data: out of bag
"""
import importlib

import histogram  # noqa: F401  (first: sets Numba's cache directory, see histogram._jit_cache)

_EXPORTS = {
    "CausalForest": "forest.causal_forest",
    "InstrumentalForest": "forest.instrumental_forest",
    "RegressionForest": "forest.regression_forest",
    "GBDTRegressor": "forest.gbdt",
    "GBDTClassifier": "forest.gbdt",
    "Checkpoint": "forest.checkpoint",
    "merge_forests": "forest.merge",
    "PolicyTree": "forest.policy_tree",
    "TrainingRowsNotice": "forest.training_rows",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'forest' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)

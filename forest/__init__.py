"""forest: tree engine, estimators, model files, command-line tools and reports.

The estimators are exported lazily (PEP 562), so ``import forest`` (and therefore
``forest-train --help``) does not pay for importing scikit-learn and compiling
Numba kernels until an estimator is actually used::

    from forest import CausalForest, InstrumentalForest, RegressionForest, ProbabilityForest
    from forest import GBDTRegressor, GBDTClassifier
    from forest import Checkpoint, merge_forests    # checkpoint/resume, merging forests
    from forest import TrainingRowsNotice           # training rows passed as data: out of bag
    from forest import model_io, simulate           # model files; simulated designs with known answers
    from forest import spark, dask                  # fit inside Spark / Dask (forest/distributed/)

The package's rooms (``docs/ARCHITECTURE.md``): ``engine/`` (growth, histograms, splits,
prediction), ``criteria/`` (split criteria), ``estimators/`` (the public estimators),
``analysis/`` (doubly robust analyses), ``policy/``, ``io/`` (data and model files,
checkpoints), ``report/``, ``cli/`` and ``distributed/`` (fit inside Spark or Dask).
"""
import importlib

import histogram  # noqa: F401  (first: sets Numba's cache directory, see histogram._jit_cache)

_EXPORTS = {
    "CausalForest": "forest.estimators.causal_forest",
    "InstrumentalForest": "forest.estimators.instrumental_forest",
    "RegressionForest": "forest.estimators.regression_forest",
    "QuantileForest": "forest.estimators.quantile_forest",
    "SurvivalForest": "forest.estimators.survival_forest",
    "CausalSurvivalForest": "forest.estimators.causal_survival_forest",
    "ProbabilityForest": "forest.estimators.probability_forest",
    "GBDTRegressor": "forest.estimators.gbdt",
    "GBDTClassifier": "forest.estimators.gbdt",
    "Checkpoint": "forest.io.checkpoint",
    "merge_forests": "forest.io.merge",
    "PolicyTree": "forest.policy.tree",
    "CateSummaryTree": "forest.estimators.summary_tree",
    "TrainingRowsNotice": "forest.io.training_rows",
}

#: The model-file format, by its short name. The format knows no estimator (each
#: estimator module registers its class when imported), so this name imports every
#: estimator module first: ``from forest import model_io`` loads any model file.
_MODEL_IO = "forest.io.model_io"

#: Fitting where the data lives (``forest/distributed/``): ``from forest import spark``.
_LAUNCHERS = {"spark": "forest.distributed.spark", "dask": "forest.distributed.dask"}

__all__ = sorted(_EXPORTS) + ["model_io"] + sorted(_LAUNCHERS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name == "model_io":
        for module in sorted(set(_EXPORTS.values())):
            importlib.import_module(module)
        return importlib.import_module(_MODEL_IO)
    if name in _LAUNCHERS:
        return importlib.import_module(_LAUNCHERS[name])
    raise AttributeError(f"module 'forest' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)

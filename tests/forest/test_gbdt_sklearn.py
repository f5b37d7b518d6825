"""scikit-learn compatibility: estimator checks, Pipeline, GridSearchCV, clone."""
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from forest.estimators.gbdt import GBDTClassifier, GBDTRegressor

# No expected failures: every scikit-learn check passes (sample-weight equivalence
# included: on these small data sets every feature is binned exactly).
@parametrize_with_checks([GBDTRegressor(n_estimators=10), GBDTClassifier(n_estimators=10)])
def test_sklearn_compatible(estimator, check):
    check(estimator)

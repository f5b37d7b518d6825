"""CausalSurvivalForest's correction variables chosen by the effect forest's split frequencies
(``linear_correction_variables="importance"``, issue 33): the leaf tables' column selection, the
choice on a design whose effect depends on x0 alone, the same forest as naming the chosen
variables, model files, binned fits, bad input, and the same choice at any rank count."""
import functools
import warnings

import numpy as np
import pytest

from forest import CausalSurvivalForest, model_io
from forest.analysis.local_linear_leaves import leaf_terms, table_columns, table_width
from native.comm import SelfCommunicator

from survival_helpers import simple1 as simple1_design, fit_causal_survival  # (conftest path)

SELF = SelfCommunicator()
KW = dict(horizon=1.0, n_estimators=60, nuisance_estimators=20, survival_estimators=20, random_state=2,
          max_grid_times=24, local_linear=True, linear_correction_variables="importance")


_design = functools.partial(simple1_design, p=5, with_effect=False)   # grf's "simple1", no effect
_fit = functools.partial(fit_causal_survival, KW)


@pytest.fixture(scope="module")
def simple1():
    X, W, time, event = _design(800, 3)
    return (X, W, time, event), _fit(X, W, time, event, ll_lambda=None)


@pytest.mark.parametrize("keep", [[0], [1, 3], [4], [0, 1, 2, 3, 4]])
def test_table_columns_give_the_table_of_the_kept_variables(keep):
    rng = np.random.default_rng(0)
    Z, wc, yc, g = rng.normal(size=(9, 5)), rng.normal(size=9), rng.normal(size=9), rng.uniform(size=9)
    cols = table_columns(5, keep)
    assert len(cols) == table_width(len(keep))
    np.testing.assert_array_equal(leaf_terms(Z, wc, yc, g)[:, cols], leaf_terms(Z[:, keep], wc, yc, g))


@pytest.mark.parametrize("keep", [[], [1, 0], [0, 0], [5], [-1]])
def test_table_columns_refuse_positions_out_of_order_or_range(keep):
    with pytest.raises(ValueError, match="increasing distinct positions"):
        table_columns(5, keep)


def test_an_effect_of_x0_alone_keeps_x0_and_equals_the_fit_that_names_it(simple1):
    (X, W, time, event), f = simple1
    assert f.ll_columns_.tolist() == [0], f.feature_importances_
    assert f.feature_importances_[0] >= 1 / 5 > f.feature_importances_[1:].max()
    named = _fit(X, W, time, event, ll_lambda=None, linear_correction_variables=[0])
    # the effect forest does not depend on the correction: same trees, the same tables and penalty (up to
    # the rounding of the centre, a column mean summed over five columns or one)
    np.testing.assert_allclose(f.ll_center_, named.ll_center_, rtol=1e-14, atol=0)
    np.testing.assert_allclose(f.ll_tables_, named.ll_tables_, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(f.local_linear_tuning_.errors, named.local_linear_tuning_.errors, rtol=1e-10)
    assert f.ll_lambda_ == named.ll_lambda_
    Xq = np.random.default_rng(4).uniform(size=(40, 5))
    np.testing.assert_allclose(f.predict(Xq), named.predict(Xq), rtol=0, atol=1e-10)
    np.testing.assert_allclose(f.predict_interval(Xq), named.predict_interval(Xq), rtol=0, atol=1e-10)


def test_model_file_keeps_the_chosen_variables(simple1):
    _, f = simple1
    g = model_io.loads(model_io.dumps(f))
    assert g.linear_correction_variables == "importance" and g.ll_columns_.tolist() == [0]
    Xq = np.random.default_rng(5).uniform(size=(20, 5))
    np.testing.assert_array_equal(g.predict(Xq), f.predict(Xq))


def test_binned_codes_take_every_candidate_column_as_correction_values():
    X, W, time, event = _design(300, 7)
    ref = _fit(X, W, time, event, n_estimators=20)
    mapper = ref.bin_mapper_
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        binned = CausalSurvivalForest(**dict(KW, n_estimators=20)).fit(
            None, W, time, event, binned=(mapper, np.ascontiguousarray(mapper.transform(X))), comm=SELF,
            correction_values=X)
    np.testing.assert_array_equal(binned.ll_columns_, ref.ll_columns_)
    np.testing.assert_array_equal(binned.ll_tables_, ref.ll_tables_)
    np.testing.assert_array_equal(binned.predict(X), ref.predict(X))


def test_another_string_is_refused_in_one_line():
    X, W, time, event = _design(100, 8)
    with pytest.raises(ValueError, match="None or 'importance'") as info:
        _fit(X, W, time, event, n_estimators=4, linear_correction_variables="importances")
    assert "\n" not in str(info.value)


@pytest.mark.mpi
def test_the_chosen_variables_are_the_same_at_any_rank_count(comm):
    X, W, time, event = _design(400, 11)
    Xq = np.random.default_rng(12).uniform(size=(30, 5))
    lo, hi = len(W) * comm.rank // comm.size, len(W) * (comm.rank + 1) // comm.size
    dist = _fit(X[lo:hi], W[lo:hi], time[lo:hi], event[lo:hi], comm=comm, n_estimators=30, ll_lambda=None)
    ref = _fit(X, W, time, event, n_estimators=30, ll_lambda=None)
    assert dist.ll_columns_.tolist() == ref.ll_columns_.tolist() and dist.ll_lambda_ == ref.ll_lambda_
    np.testing.assert_allclose(dist.ll_tables_, ref.ll_tables_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(dist.predict(Xq), ref.predict(Xq), rtol=0, atol=1e-9)

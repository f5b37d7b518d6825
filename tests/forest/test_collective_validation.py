"""Input validation is collective: bad input on one rank raises the same error on every rank.

Issue 14, "No hangs from the Python API". The user code in these tests catches the
``ValueError`` and then calls another collective; if any rank had gone on into the fit
(or stopped short of the exchange) that collective would never complete, so the
``pytest-timeout`` marks (thread method: it kills a rank blocked inside MPI) turn a
hang into a failure. The mechanism itself (:mod:`forest.collective_checks`) is also
tested on thread ranks, at rank counts mpirun cannot reach on a small machine.
"""
import re

import numpy as np
import pytest

from forest.estimators.causal_forest import CausalForest
from forest.estimators.gbdt import GBDTClassifier, GBDTRegressor
from forest.estimators.regression_forest import RegressionForest
from native import collectives as col
from native.blocks import block_range
from native.threads import ThreadWorld

N_ROWS = 160


# ---------------------------------------------------------------- the mechanism, on thread ranks
def _run(p, body):
    """Run ``body(comm)`` on p thread ranks; each returns (error message or None, follow-up result)."""
    def rank_body(comm):
        try:
            result, message = body(comm), None
        except ValueError as exc:
            result, message = exc, str(exc)
        # user code carries on after catching: the next collective must complete
        after = col.allgather_object(comm, comm.rank)
        return message, result, after
    return ThreadWorld(p).run(rank_body)


@pytest.mark.parametrize("p", [2, 3, 7])
def test_one_bad_rank_raises_the_same_error_everywhere(p):
    from forest.collective_checks import RankInputError, collective_checks

    def body(comm):
        with collective_checks(comm) as checks:
            if comm.rank == 1:
                raise ValueError("Input y contains NaN.")
            checks.share(rows=comm.rank)
        return checks.summaries

    results = _run(p, body)
    messages = {m for m, _, _ in results}
    assert messages == {"rank 1: Input y contains NaN."}
    assert all(isinstance(r, RankInputError) and r.ranks == [1] for _, r, _ in results)
    assert all(after == list(range(p)) for _, _, after in results)


def test_several_bad_ranks_and_other_exception_types():
    from forest.collective_checks import collective_checks

    def body(comm):
        with collective_checks(comm):
            if comm.rank == 1:
                raise TypeError("Sparse data was passed for X")
            if comm.rank == 3:
                raise ValueError("X has 4 features")
        return "ok"

    results = _run(4, body)
    assert {m for m, _, _ in results} == {"rank 1: TypeError: Sparse data was passed for X "
                                          "(input also rejected on rank 3)"}
    assert all(r.ranks == [1, 3] and r.messages[1] == "X has 4 features" for _, r, _ in results)


def test_summaries_and_cross_rank_checks():
    from forest.collective_checks import collective_checks, require_same, total

    def body(comm):
        with collective_checks(comm) as checks:
            checks.share(rows=10 * comm.rank, features=3 if comm.rank != 2 else 4)
        assert total(checks.summaries, "rows") == 10 * sum(range(comm.size))
        require_same(checks.summaries, "features", lambda d: f"X has {d} features")
        return "ok"

    results = _run(3, body)
    assert {m for m, _, _ in results} == {"rank 2: X has 4 features, but on rank 0 X has 3 features"}


def test_one_rank_keeps_the_original_exception():
    from forest.collective_checks import collective_checks
    from native.comm import SelfCommunicator

    with pytest.raises(TypeError, match="^plain$"):
        with collective_checks(SelfCommunicator()):
            raise TypeError("plain")
    with collective_checks(SelfCommunicator()) as checks:
        checks.share(rows=5)
    assert checks.summaries == [{"rows": 5}]


# ---------------------------------------------------------------- estimators under mpirun
def _data(comm, seed=0, n_features=3):
    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(N_ROWS, n_features))
    t = (rng.uniform(size=N_ROWS) < 0.5).astype(np.int64)
    y = X[:, 0] + t + 0.1 * rng.normal(size=N_ROWS)
    lo, hi = block_range(N_ROWS, comm.size, comm.rank)
    return X[lo:hi].copy(), t[lo:hi].copy(), y[lo:hi].copy()


def _nan_y(X, t, y):
    y[0] = np.nan
    return X, t, y, {}


def _extra_column(X, t, y):
    return np.column_stack([X, X[:, 0]]), t, y, {}


def _nan_t(X, t, y):
    return X, np.where(np.arange(len(t)) == 2, np.nan, t.astype(float)), y, {}


def _negative_weight(X, t, y):
    w = np.ones(len(y))
    w[1] = -1.0
    return X, t, y, {"sample_weight": w}


def _inf_X(X, t, y):
    X[3, 1] = np.inf
    return X, t, y, {}


def _renamed_columns(X, t, y):
    pd = pytest.importorskip("pandas")
    return pd.DataFrame(X, columns=["a", "b", "z"]), t, y, {}


SMALL = {
    "regression": lambda: RegressionForest(n_estimators=4, max_bins=16),
    "causal": lambda: CausalForest(n_estimators=4, nuisance_estimators=2, max_bins=16),
    "gbdt-regressor": lambda: GBDTRegressor(n_estimators=2),
    "gbdt-classifier": lambda: GBDTClassifier(n_estimators=2),
}

# (estimator, corruption of the bad rank's input, a pattern of the message on that rank)
CASES = [
    ("regression", _nan_y, "Input y contains NaN"),
    ("regression", _extra_column, "X has 4 features, but on rank 0 X has 3 features"),
    ("regression", _renamed_columns, r"X has columns \['a', 'b', 'z'\], but on rank 0 X has columns"),
    ("causal", _nan_t, "Input t contains NaN"),
    ("causal", _extra_column, "X has 4 features, but on rank 0 X has 3 features"),
    ("causal", _negative_weight, "Negative values in data passed to sample_weight"),
    ("gbdt-regressor", _inf_X, "Input X contains infinity"),
    ("gbdt-classifier", _extra_column, "X has 4 features, but on rank 0 X has 3 features"),
]


def _fit(est, X, t, y, comm, **kw):
    if isinstance(est, CausalForest):
        return est.fit(X, t, y, comm=comm, **kw)
    if isinstance(est, GBDTClassifier):
        return est.fit(X, t, comm=comm, **kw)
    return est.fit(X, y, comm=comm, **kw)


@pytest.mark.mpi
@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("model, corrupt, pattern", CASES, ids=[f"{m}-{c.__name__[1:]}" for m, c, _ in CASES])
def test_bad_input_on_one_rank_raises_everywhere(comm, model, corrupt, pattern):
    cross_rank = corrupt in (_extra_column, _renamed_columns)
    if cross_rank and comm.size == 1:
        pytest.skip("a disagreement between ranks needs two ranks")
    bad = comm.size - 1
    X, t, y = _data(comm)
    kw = {}
    if corrupt is _renamed_columns:  # every rank passes a DataFrame; the bad rank renames a column
        X = pytest.importorskip("pandas").DataFrame(X, columns=["a", "b", "c"])
    if comm.rank == bad:
        X, t, y, kw = corrupt(np.asarray(X), t, y)
    message = None
    try:
        _fit(SMALL[model](), X, t, y, comm, **kw)
    except ValueError as exc:  # the user catches it and carries on
        message = str(exc)
    messages = col.allgather_object(comm, message)

    assert messages[0] is not None, "no rank raised"
    assert all(m == messages[0] for m in messages), messages
    if comm.size > 1:
        assert messages[0].startswith(f"rank {bad}: "), messages[0]
    assert re.search(pattern, messages[0]), messages[0]


@pytest.mark.mpi
@pytest.mark.timeout(180, method="thread")
def test_single_valued_treatment_over_all_ranks(comm):
    X, t, y = _data(comm)
    message = None
    try:
        CausalForest(n_estimators=4, nuisance_estimators=2).fit(X, np.zeros(len(t)), y, comm=comm)
    except ValueError as exc:
        message = str(exc)
    messages = col.allgather_object(comm, message)
    assert messages[0] is not None and "takes a single value" in messages[0]
    assert all(m == messages[0] for m in messages)


@pytest.mark.mpi
@pytest.mark.timeout(600, method="thread")  # it fits: leave room for a cold Numba cache on busy ranks
def test_oob_predict_and_a_later_fit_after_a_caught_error(comm):
    """oob_predict's checks are collective too, and the communicator stays usable."""
    X, t, y = _data(comm)
    rf = RegressionForest(n_estimators=4, max_bins=16, random_state=1).fit(X, y, comm=comm)
    bad = comm.size - 1
    message = None
    try:
        rf.oob_predict(X[:, :2] if comm.rank == bad else X, comm=comm)
    except ValueError as exc:
        message = str(exc)
    oob = rf.oob_predict(X, comm=comm)           # the same forest, good input, every rank
    refit = RegressionForest(n_estimators=4, max_bins=16, random_state=1).fit(X, y, comm=comm)
    messages = col.allgather_object(comm, message)

    assert messages[0] is not None and all(m == messages[0] for m in messages)
    assert "X has 2 features, but RegressionForest is expecting 3" in messages[0]
    if comm.size > 1:
        assert messages[0].startswith(f"rank {bad}: ")
    np.testing.assert_array_equal(refit.predict(X), rf.predict(X))
    assert oob.shape == (len(y),)

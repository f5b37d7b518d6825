"""Fixtures of the forest tests: Numba thread counts and the per-row prediction route."""
import numba
import pytest

from forest.engine import predictor


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    """Run the test with 1 and with 2 Numba threads (1 where only one is available)."""
    old = numba.get_num_threads()
    numba.set_num_threads(min(request.param, numba.config.NUMBA_NUM_THREADS))
    yield request.param
    numba.set_num_threads(old)


@pytest.fixture
def per_row_walk(monkeypatch):
    """``per_row_walk(fn, *args)``: the same call through the per-row walk (the route
    every prediction took before the batch walk)."""
    def run(fn, *args, **kwargs):
        with monkeypatch.context() as m:
            m.setattr(predictor, "batch_worthwhile", lambda *a: False)
            return fn(*args, **kwargs)
    return run


@pytest.fixture
def batch_always(monkeypatch):
    """Send every input, however small, through the batch walk."""
    monkeypatch.setattr(predictor, "batch_worthwhile", lambda *a: True)

"""histogram.jit: the kernel decorators and the in-place array constructors.

The constructors are compared against NumPy's; compiled-only helpers must give the
same answers from compiled callers and from Python (through their twin), keep their
own cache entries apart from the twin's, and the library itself must never need a
twin (that would mean a helper classified as compiled-only is called from Python on
a real path, compiling on every warm start).
"""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from numba.core.errors import TypingError

from histogram.jit import arange, compiled_only, empty, kernel, python_twins, zeros

REPO = Path(__file__).resolve().parents[2]


@kernel
def _allocate(n, m):
    # One array of every kind the kernels allocate, with its shape and dtype reported.
    a = empty(n, np.float64)
    b = zeros((n, m), np.int64)
    c = zeros(n, np.bool_)
    d = empty((m, n, 2), np.uint8)
    e = zeros(m, a.dtype)
    f = zeros((2, m), np.int32)
    g = zeros(n, float)
    h = zeros(n, int)
    return a, b, c, d, e, f, g, h


def test_constructors_match_numpy_shapes_dtypes_and_zero_fill():
    for n, m in ((0, 0), (1, 3), (7, 5)):
        a, b, c, d, e, f, g, h = _allocate(n, m)
        expected = [np.empty(n, np.float64), np.zeros((n, m), np.int64), np.zeros(n, np.bool_),
                    np.empty((m, n, 2), np.uint8), np.zeros(m, np.float64), np.zeros((2, m), np.int32),
                    np.zeros(n, float), np.zeros(n, int)]
        for got, want in zip((a, b, c, d, e, f, g, h), expected):
            assert got.shape == want.shape and got.dtype == want.dtype and got.flags.c_contiguous
        for got, want in zip((b, c, e, f, g, h), expected[1:3] + expected[4:]):
            np.testing.assert_array_equal(got, want)


@kernel
def _arange(n):
    return arange(n)


def test_arange_matches_numpy():
    for n in (0, 1, 9):
        got = _arange(n)
        np.testing.assert_array_equal(got, np.arange(n, dtype=np.int64))
        assert got.dtype == np.int64


@kernel
def _negative(n):
    return empty(n - 5, np.float64)


def test_negative_dimension_raises_as_numpy_does():
    with pytest.raises(ValueError, match="negative dimensions"):
        _negative(2)
    with pytest.raises(ValueError, match="negative dimensions"):
        np.empty(-3)


@kernel
def _float_shape(x):
    return zeros(x, np.float64)


def test_non_integer_shape_is_a_typing_error():
    with pytest.raises(TypingError, match="integer or a tuple of integers"):
        _float_shape(2.5)


@compiled_only
def _helper(a, k):
    s = 0.0
    for v in a:
        s += v * k
    return s


@kernel
def _caller(a):
    return _helper(a, 2.0) + 1.0


def test_compiled_only_helper_answers_the_same_from_python():
    a = np.arange(5.0)
    assert _caller(a) == 21.0
    assert _helper(a, 2.0) == 20.0           # through the twin
    assert _helper(a, 3) == 30.0             # another signature, same twin
    assert f"{__name__}._helper" in python_twins()


@compiled_only
def _threaded_helper(a):
    return a.sum()


def test_threads_calling_a_helper_first_share_one_twin():
    import threading

    barrier = threading.Barrier(4)
    results = []

    def call():
        barrier.wait()
        results.append(_threaded_helper(np.ones(3)))

    threads = [threading.Thread(target=call) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [3.0] * 4
    assert python_twins().count(f"{__name__}._threaded_helper") == 1


_MODULE = '''
import numpy as np
from histogram.jit import compiled_only, kernel, python_twins

@compiled_only
def helper(a):
    return a.sum() * 2.0

@kernel
def caller(a):
    return helper(a) + 1.0
'''


def test_twin_and_helper_keep_apart_cache_entries(tmp_path):
    # A helper's cached compilation has no Python entry point: a twin that loaded it
    # would crash the interpreter. Caller first (the helper's entry is written), then
    # Python calls in fresh processes that load from the same cache.
    (tmp_path / "twinmod.py").write_text(_MODULE)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    runs = ["print(m.caller(np.ones(3)))", "print(m.helper(np.ones(3)), m.python_twins())",
            "print(m.helper(np.ones(3)), m.caller(np.ones(3)))"]
    outputs = []
    for body in runs:
        code = "import numpy as np, twinmod as m\n" + body
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.split())
    assert outputs == [["7.0"], ["6.0", "['twinmod.helper']"], ["6.0", "7.0"]]
    names = sorted(p.name.split("-")[0] for p in (tmp_path / "cache").rglob("*.nbi"))
    assert names == ["twinmod.caller", "twinmod.helper", "twinmod.helper__python_twin"]


_EVERY_MODEL = textwrap.dedent('''
    import numpy as np
    import forest
    from histogram.jit import python_twins

    rng = np.random.default_rng(0)
    n = 3000
    X = rng.normal(size=(n, 5))
    t = (rng.uniform(size=n) < 0.5).astype(float)
    z = (rng.uniform(size=n) < 0.5).astype(float)
    y = X[:, 0] + t * (1.0 + (X[:, 1] > 0)) + rng.normal(size=n)
    forest.GBDTClassifier(n_estimators=3).fit(X, (y > 0).astype(int)).predict_proba(X)
    forest.GBDTRegressor(n_estimators=3, quantized=True).fit(X, y).predict(X)
    forest.RegressionForest(n_estimators=8, random_state=0).fit(X, y).predict(X)
    cf = forest.CausalForest(n_estimators=8, random_state=0).fit(X, t, y)
    cf.predict(X)
    cf.average_treatment_effect()
    arms = rng.integers(0, 3, size=n)
    forest.CausalForest(n_estimators=8, random_state=0).fit(X, arms, y).predict(X)
    forest.InstrumentalForest(n_estimators=8, random_state=0).fit(X, t, y, z).predict(X)
    rewards = np.column_stack([np.zeros(n), X[:, 1]])
    forest.PolicyTree(max_depth=2).fit(X, rewards).predict(X)
    print("TWINS", python_twins())
''')


def test_library_paths_never_call_a_compiled_only_helper_from_python():
    done = subprocess.run([sys.executable, "-c", _EVERY_MODEL], capture_output=True, text=True, timeout=900,
                          cwd=REPO, env=dict(os.environ, NUMBA_NUM_THREADS="2"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "TWINS []" in done.stdout, done.stdout

"""histogram._thread_wait: idle OpenMP workers spin briefly unless the user chose otherwise."""
import os
import subprocess
import sys

import pytest

from histogram._thread_wait import SPIN_COUNT, configure_thread_wait


def test_sets_the_spin_count_when_nothing_was_chosen():
    env = {}
    assert configure_thread_wait(env) == str(SPIN_COUNT)
    assert env == {"GOMP_SPINCOUNT": str(SPIN_COUNT)}


@pytest.mark.parametrize("name, value", [("OMP_WAIT_POLICY", "active"), ("OMP_WAIT_POLICY", "passive"),
                                         ("GOMP_SPINCOUNT", "300000")])
def test_a_users_choice_stands(name, value):
    env = {name: value}
    assert configure_thread_wait(env) is None
    assert env == {name: value}


def test_histforest_spincount():
    env = {"HISTFOREST_SPINCOUNT": "default"}
    assert configure_thread_wait(env) is None and "GOMP_SPINCOUNT" not in env
    env = {"HISTFOREST_SPINCOUNT": "500"}
    assert configure_thread_wait(env) == "500" and env["GOMP_SPINCOUNT"] == "500"
    env = {"HISTFOREST_SPINCOUNT": "fast"}
    with pytest.warns(UserWarning, match="HISTFOREST_SPINCOUNT must be a count"):
        assert configure_thread_wait(env) == str(SPIN_COUNT)
    assert env["GOMP_SPINCOUNT"] == str(SPIN_COUNT)


def test_importing_histogram_sets_it_before_numba_loads_libgomp():
    code = ("import os, histogram, numba, numpy as np\n"
            "@numba.njit(parallel=True)\n"
            "def f(a):\n"
            "    for i in numba.prange(a.shape[0]):\n"
            "        a[i] += 1\n"
            "f(np.zeros(4))\n"
            "print(os.environ.get('GOMP_SPINCOUNT'))\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "HISTFOREST_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(SPIN_COUNT)

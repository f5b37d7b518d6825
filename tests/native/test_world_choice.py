"""Which communicator ``native.comm.world()`` gives: MPI only for a process of an MPI job.

A process that no launcher started gets a world of one without loading MPI (0.1 s of
every start, issue 11); any sign of a launcher, or a program that loaded MPI itself,
keeps MPI (a rank that believed itself alone would train on its own rows only).
"""
import os
import subprocess
import sys

import pytest

from native import comm as comm_mod
from native_mpirun import REPO, run_script


def _no_mpi_loaded(monkeypatch):
    # The answer also depends on whether mpi4py.MPI is loaded; these cases test the
    # environment alone (monkeypatch puts the module back afterwards).
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)


@pytest.mark.parametrize("env, expected", [
    ({}, False),
    ({"HOME": "/root", "PATH": "/usr/bin", "SLURM_JOB_ID": "7"}, False),
    ({"PMI_RANK": "0", "PMI_SIZE": "2"}, True),             # MPICH's Hydra, Intel MPI
    ({"PMIX_RANK": "1"}, True),                              # Open MPI 5, Slurm pmix
    ({"OMPI_COMM_WORLD_SIZE": "4"}, True),                   # Open MPI
    ({"SLURM_PROCID": "0"}, True),                           # srun, sbatch
    ({"PALS_RANKID": "3"}, True),                            # Cray PALS
    ({"HISTFOREST_MPI": "1"}, True),                         # a launcher the list misses
    ({"HISTFOREST_MPI": "0", "PMI_RANK": "0"}, False),       # the user says: one process
    ({"HISTFOREST_MPI": "", "PMI_RANK": "0"}, True),         # empty: not set
    ({"HISTFOREST_MPI": "off", "PMI_RANK": "0", "PMI_SIZE": "1"}, False),
    ({"ALPS_APP_PE": "0"}, True),                            # Cray ALPS
    ({"MP_CHILD": "2"}, True),                               # IBM Parallel Environment
])
def test_launcher_variables_decide(monkeypatch, env, expected):
    _no_mpi_loaded(monkeypatch)
    assert comm_mod.launched_by_mpi(env) is expected


@pytest.mark.parametrize("env", [{"HISTFOREST_MPI": "0", "PMI_RANK": "1", "PMI_SIZE": "4"},
                                 {"HISTFOREST_MPI": "no", "OMPI_COMM_WORLD_SIZE": "2"}])
def test_forcing_one_process_in_a_job_of_several_is_an_error(monkeypatch, env):
    # Every rank would train on its own rows only, without a word.
    _no_mpi_loaded(monkeypatch)
    with pytest.raises(ValueError, match="HISTFOREST_MPI=0, but this process is one of"):
        comm_mod.launched_by_mpi(env)


@pytest.mark.parametrize("value", ["maybe", "2", "auto"])
def test_an_unknown_value_is_an_error(monkeypatch, value):
    _no_mpi_loaded(monkeypatch)
    with pytest.raises(ValueError, match="HISTFOREST_MPI must be 1 or 0"):
        comm_mod.launched_by_mpi({"HISTFOREST_MPI": value})


def test_a_program_that_loaded_mpi_keeps_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", object())
    assert comm_mod.launched_by_mpi({}) is True
    assert comm_mod.launched_by_mpi({"HISTFOREST_MPI": "0"}) is False


_PROBE = """
import sys
import numpy as np
from native.comm import world
comm = world()
X = np.random.default_rng(0).normal(size=(300, 3))
y = (X[:, 0] > 0).astype(int)
import forest
forest.GBDTClassifier(n_estimators=2).fit(X, y)
# One write per line: mpirun forwards each write of each rank as a chunk, and print's
# separate writes of its arguments could interleave with another rank's line.
sys.stdout.write(f"{type(comm).__name__} {comm.size} {'mpi4py.MPI' in sys.modules}\\n")
sys.stdout.flush()
"""


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(comm_mod.LAUNCHER_VARIABLE_PREFIXES)
           and k != "HISTFOREST_MPI"}
    env.update(extra, PYTHONPATH=str(REPO))
    return env


def _probe(**extra):
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=REPO, env=_clean_env(**extra), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_a_plain_process_fits_without_loading_mpi():
    assert _probe() == ["SelfCommunicator", "1", "False"]


def test_forcing_mpi_in_a_plain_process():
    assert _probe(HISTFOREST_MPI="1") == ["MPICommunicator", "1", "True"]


@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_ranks_under_mpirun_use_mpi(tmp_path, np_):
    # -np 1 included: a one-rank job is still a job (its launcher's variables are set).
    rc, output, _ = run_script(np_, _PROBE.replace("forest.GBDTClassifier(n_estimators=2).fit(X, y)\n", ""),
                               tmp_path, timeout=300, env={"HISTFOREST_MPI": ""})
    assert rc == 0, output
    lines = sorted(line for line in output.splitlines() if line.startswith("MPICommunicator"))
    assert lines == [f"MPICommunicator {np_} True"] * np_, output

"""Helpers shared by the command-line tests (data, mpirun launcher)."""
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV_BIN = os.path.dirname(sys.executable)
MPIRUN = os.path.join(VENV_BIN, "mpirun")


def make_table(n=400, seed=3):
    """Causal design with known effect tau = 1 + 2 [a > 0]; c has missing values."""
    rng = np.random.default_rng(seed)
    a, b, c = rng.normal(size=(3, n))
    c[rng.uniform(size=n) < 0.05] = np.nan
    t = (rng.uniform(size=n) < 0.5).astype(np.int8)
    tau = 1.0 + 2.0 * (a > 0)
    y = b + t * tau + 0.3 * rng.normal(size=n)
    return pa.table({"id": np.arange(n, dtype=np.int64), "a": a, "b": b, "c": c, "t": t, "y": y,
                     "name": pa.array([f"row{i}" for i in range(n)])})


def run_mpi(np_, args, timeout=120, env=None):
    """Run ``mpirun -np np_ <args>`` with one Numba thread per rank; returns CompletedProcess."""
    full_env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    return subprocess.run([MPIRUN, "-np", str(np_)] + list(args), capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


def tool(name):
    return os.path.join(VENV_BIN, name)


def _children(pid):
    """Direct child process ids of ``pid`` (from /proc)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            # the command name (field 2) may hold spaces; fields after its ')' are fixed
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def rank_pid(launcher_pid, rank):
    """Process id of MPI rank ``rank`` below an mpirun process, or None while it is not up yet."""
    stack = [launcher_pid]
    while stack:
        pid = stack.pop()
        for child in _children(pid):
            stack.append(child)
            try:
                with open(f"/proc/{child}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if f"PMI_RANK={rank}".encode() in env:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    if b"python" in f.read():
                        return child
    return None


def start_mpi(np_, args, env=None):
    """Start ``mpirun -np np_ <args>`` like :func:`run_mpi` without waiting; returns the Popen."""
    full_env = dict(os.environ, NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    full_env.update(env or {})
    return subprocess.Popen([MPIRUN, "-np", str(np_)] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env, cwd=ROOT)

"""Launch a small script under a real ``mpirun -np K`` from a (serial) test.

Used for the behaviours that only exist with several processes and that must be
watched from outside: a crash on one rank, a mismatch on one rank, and the K = 5 run.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from native.comm import LAUNCHER_VARIABLE_PREFIXES

REPO = Path(__file__).resolve().parents[2]
MPIRUN = Path(sys.executable).parent / "mpirun"


def run_mpirun(np_, args, timeout, env=None):
    """Run ``mpirun -np np_ <args>`` in the repository root.

    Returns
    -------
    rc : int
        Exit status (``None`` if it had to be killed after ``timeout`` seconds).
    output : str
        stdout and stderr together.
    elapsed : float
        Wall seconds.
    """
    if not MPIRUN.exists():
        pytest.skip(f"no mpirun next to {sys.executable}")
    full_env = {k: v for k, v in os.environ.items()
                # A parent launched by mpirun must not leak its process-manager
                # wiring into the child job.
                if not k.startswith(LAUNCHER_VARIABLE_PREFIXES + ("MPIR_",))}
    full_env.update(env or {})
    full_env.setdefault("PYTHONPATH", str(REPO))
    start = time.monotonic()
    try:
        proc = subprocess.run([str(MPIRUN), "-np", str(np_), *map(str, args)],
                              cwd=REPO, env=full_env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        if isinstance(out, bytes):
            out = out.decode(errors="replace")
        return None, out, time.monotonic() - start
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def run_script(np_, source, tmp_path, timeout, env=None):
    """Write ``source`` to a file and run it with this Python under ``mpirun``."""
    script = tmp_path / "script.py"
    script.write_text(source)
    return run_mpirun(np_, [sys.executable, script], timeout, env=env)


def under_mpirun(comm):
    """True inside an mpirun job of more than one rank (nested launches are avoided)."""
    return comm.size > 1

"""Whole-job behaviour watched from outside: crash, mismatch, and the K = 5 run.

These tests start their own ``mpirun`` and so are not marked ``mpi``; inside an
mpirun job (size > 1) they skip rather than nest launches.
"""
import re
import sys
import time

import pytest

from native_mpirun import REPO, run_mpirun, run_script

# Bounds on wall-clock time: run with the machine to themselves (pyproject: solo).
pytestmark = pytest.mark.solo

# One write per line: mpirun forwards each write of each rank as a chunk, so a line printed
# in pieces (print writes its arguments and the newline separately when unbuffered) can
# interleave with another rank's line.
SAY = """
import sys


def say(*words):
    sys.stdout.write(" ".join(map(str, words)) + "\\n")
    sys.stdout.flush()
"""

CRASH = SAY + """
import time
import numpy as np
from native.comm import world
from native import collectives as col
from native.errors import abort_on_uncaught
abort_on_uncaught()
comm = world()
if comm.rank == 1:
    say("RAISE_AT", time.time())
    raise ValueError("rank one fails on purpose")
col.allreduce(comm, np.ones(4))  # the others would wait here forever
say("rank", comm.rank, "passed the collective")
"""

EXITER = SAY + """
import sys
import time
import numpy as np
from native.comm import world
from native import collectives as col
from native.errors import job_guard
with job_guard() as comm:
    if comm.rank == 1:
        say("EXIT_AT", time.time())
        sys.exit(3)  # no exception hook sees this
    col.allreduce(comm, np.ones(4))
    say("rank", comm.rank, "passed the collective")
"""

MISMATCH = SAY + """
import os
import numpy as np
from native.comm import world
from native import collectives as col
from native.errors import CollectiveMismatchError
comm = world()
n = 11 if comm.rank == 1 else 10
try:
    col.allreduce(comm, np.ones(n), algorithm="ring", check=True)
    say(f"rank {comm.rank}: first call passed")
except CollectiveMismatchError as exc:
    say(f"rank {comm.rank}: caught1 {exc}")
# Second case through the environment variable: a different collective on rank 1.
os.environ["HISTFOREST_CHECK_COLLECTIVES"] = "1"
try:
    if comm.rank == 1:
        col.bcast(comm, np.ones(3, dtype=np.int64))
    else:
        col.allreduce(comm, np.ones(3, dtype=np.int64))
    say(f"rank {comm.rank}: second call passed")
except CollectiveMismatchError as exc:
    say(f"rank {comm.rank}: caught2 {exc}")
# The ranks are still in step afterwards.
total = col.allreduce(comm, np.ones(2))
say(f"rank {comm.rank}: after {total.tolist()}")
"""


@pytest.fixture(autouse=True)
def not_nested(comm):
    if comm.size > 1:
        pytest.skip("launches its own mpirun; run from the serial suite")


def seconds_since(marker, out):
    """Seconds from the latest ``<marker> <unix time>`` line printed by the job until now.

    mpirun forwards the ranks' output in chunks, so two ranks' marker lines can arrive
    interleaved (seen: ``"CHECK_AT CHECK_AT1796288226.11\n 1796288226.11"``), so every
    unix time in the output counts once the marker is there (each job prints only its
    marker's times).
    """
    assert marker in out, f"the job printed no {marker} line:\n{out}"
    stamps = [float(t) for t in re.findall(r"(?<![0-9.])([0-9]{9,}\.[0-9]+)", out)]
    assert stamps, f"the job printed no time after {marker}:\n{out}"
    return time.time() - max(stamps)


def test_uncaught_exception_on_one_rank_ends_the_job_fast(tmp_path):
    rc, out, elapsed = run_script(3, CRASH, tmp_path, timeout=120)
    assert rc is not None, f"job hung for {elapsed:.0f} s:\n{out}"
    assert rc != 0, out
    # measured from the raise, so slow interpreter start-up on a loaded machine
    # does not count
    took = seconds_since("RAISE_AT", out)
    assert took < 15, f"abort took {took:.1f} s after the exception"
    assert "[rank 1]" in out and "rank one fails on purpose" in out, out
    assert "passed the collective" not in out


def test_job_guard_ends_the_job_when_one_rank_calls_sys_exit(tmp_path):
    rc, out, elapsed = run_script(3, EXITER, tmp_path, timeout=120)
    assert rc is not None, f"job hung for {elapsed:.0f} s:\n{out}"
    assert rc != 0, out
    took = seconds_since("EXIT_AT", out)
    assert took < 15, f"abort took {took:.1f} s after sys.exit"
    assert "[rank 1] exited with status 3" in out, out
    assert "passed the collective" not in out


def test_check_mode_turns_mismatch_into_error_on_every_rank(tmp_path):
    rc, out, elapsed = run_script(3, MISMATCH, tmp_path, timeout=120)
    assert rc == 0, out
    for r in range(3):
        first = re.search(rf"rank {r}: caught1 (.*)", out)
        assert first, f"rank {r} raised no error for the size mismatch:\n{out}"
        assert f"rank {r}: caught2 ranks disagree on collective" in out, out
        assert f"rank {r}: after [3.0, 3.0]" in out, out
    # the message names the collective, every rank's size and dtype
    assert "allreduce(algorithm=ring, n=10" in out and "n=11" in out, out
    assert "dtype=float64" in out
    assert re.search(r"rank 1 \(collective call #2\): bcast", out), out


def test_native_mpi_tests_pass_on_five_ranks():
    # `make test` runs the mpi suite for K = 2, 3, 4; the issue also asks for K = 5.
    # Only tests/native (about 10 s on 5 ranks oversubscribing 2 cores).
    rc, out, elapsed = run_mpirun(
        5, [REPO / "tests" / "mpi_pytest.sh", "-q", "-m", "mpi", "-p", "no:cacheprovider",
            REPO / "tests" / "native"],
        timeout=300, env={"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                          "PYTHON": sys.executable})
    assert rc == 0, out[-4000:]
    assert re.search(r"\d+ passed", out), out[-2000:]


SKIPPER = SAY + """
import time
import numpy as np
from native.comm import world
from native import collectives as col
from native.errors import abort_on_uncaught
abort_on_uncaught()
comm = world()
if comm.rank == 2:
    time.sleep(120)  # never reaches the collective: stuck elsewhere
else:
    say("CHECK_AT", time.time())
col.allreduce(comm, np.ones(4), check=True)
say("rank", comm.rank, "passed the collective")
"""


def test_check_mode_timeout_turns_missing_rank_into_abort(tmp_path):
    rc, out, elapsed = run_script(3, SKIPPER, tmp_path, timeout=110,
                                  env={"HISTFOREST_CHECK_TIMEOUT": "2"})
    assert rc is not None, f"job hung for {elapsed:.0f} s:\n{out}"
    assert rc != 0, out
    took = seconds_since("CHECK_AT", out)  # rank 2 would sleep for 120 s
    assert took < 2 + 15, f"the job ended {took:.1f} s after the check began"
    assert "CollectiveTimeoutError" in out and "for rank 2" in out, out
    assert "passed the collective" not in out


PSEUDO = SAY + """
import numpy as np
from native.comm import world
from native import collectives as col
from native.topology import topology
comm = world()
topo = topology(comm)
x = np.random.default_rng(comm.rank).standard_normal(1001) * 1e6
a = col.allreduce(comm, x, algorithm="hierarchical")
b = col.allreduce(comm, x, algorithm="direct")
say(f"rank {comm.rank}: nodes={[list(n) for n in topo.nodes]} same={a.tobytes() == b.tobytes()}")
"""


def test_pseudo_nodes_from_the_environment(tmp_path):
    rc, out, elapsed = run_script(3, PSEUDO, tmp_path, timeout=120,
                                  env={"HISTFOREST_RANKS_PER_NODE": "2"})
    assert rc == 0, out
    for r in range(3):
        assert f"rank {r}: nodes=[[0, 1], [2]] same=True" in out, out

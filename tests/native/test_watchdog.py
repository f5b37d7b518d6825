"""The default watchdog under real mpirun jobs: stalls, frozen and killed ranks, disagreeing
collectives end the job within the bound; a rank that is merely slow does not.

Each test starts its own ``mpirun`` (serial suite only) with short bounds and measures
from a time stamp the job prints just before the trouble starts.
"""
import pytest

from native_mpirun import run_script
from test_native_launch import seconds_since

# Bounds on wall-clock time: run with the machine to themselves (pyproject: solo).
pytestmark = pytest.mark.solo

FAST = {"HISTFOREST_WATCHDOG_PROBE": "1", "HISTFOREST_WATCHDOG_STALL": "3",
        "HISTFOREST_WATCHDOG_SILENT": "4"}

HEAD = """
import os, signal, sys, threading, time
import numpy as np
from native.comm import world
from native import collectives as col
comm = world()


def say(*words):
    # One write per line: mpirun forwards each write of each rank as a chunk, so a line
    # printed in pieces (print with several arguments, unbuffered) can interleave with
    # another rank's.
    sys.stdout.write(" ".join(map(str, words)) + "\\n")
    sys.stdout.flush()


for _ in range(3):
    col.allreduce(comm, np.ones(1000))   # everyone healthy first
"""

STALL = HEAD + """
if comm.rank == 2:
    say("TROUBLE_AT", time.time())
    time.sleep(3600)                      # alive, answering its watchdog, doing nothing
col.allreduce(comm, np.ones(100_000))
say("rank", comm.rank, "passed")
"""

FROZEN = HEAD + """
if comm.rank == 1:
    say("TROUBLE_AT", time.time())
    os.kill(os.getpid(), signal.SIGSTOP)  # the whole process frozen, watchdog thread too
for _ in range(100):
    col.allreduce(comm, np.ones(100_000))
say("rank", comm.rank, "passed")
"""

KILLED = HEAD + """
if comm.rank == 1:
    def die():
        say("TROUBLE_AT", time.time())
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Timer(0.5, die).start()     # dies in the middle of the collectives below
for _ in range(100000):
    col.allreduce(comm, np.ones(100_000))
say("rank", comm.rank, "passed")
"""

DISAGREE = HEAD + """
say("TROUBLE_AT", time.time())
if comm.rank == 1:
    col.bcast(comm, np.ones(10), root=0)  # the others are in an allreduce
else:
    col.allreduce(comm, np.ones(10), algorithm="ring")
say("rank", comm.rank, "passed")
"""

SLOW = HEAD + """
if comm.rank == 1:
    say("TROUBLE_AT", time.time())
    end = time.time() + 8                 # busy for longer than PROBE + STALL
    x = 0
    while time.time() < end:
        x += 1
col.allreduce(comm, np.ones(1000))
say("rank", comm.rank, "passed")
"""


@pytest.fixture(autouse=True)
def not_nested(comm):
    if comm.size > 1:
        pytest.skip("launches its own mpirun; run from the serial suite")


def run_job(source, tmp_path, env=FAST, timeout=120):
    rc, out, elapsed = run_script(3, source, tmp_path, timeout=timeout, env=env)
    assert rc is not None, f"job hung for {elapsed:.0f} s:\n{out}"
    return rc, out


@pytest.mark.parametrize("source,message,bound", [
    (STALL, "watchdog: rank 2 is stalled", 1 + 3 + 10),            # PROBE + STALL + slack
    (FROZEN, "rank 1 has not answered the watchdog", 1 + 4 + 10),  # PROBE + SILENT + slack
    # mpirun (Hydra) ends the job as soon as one process dies; the watchdog's silence
    # bound covers launchers that do not
    (KILLED, "", 1 + 4 + 10),
    (DISAGREE, "called different collectives", 2 + 10),             # two probes + slack
], ids=["stalled", "frozen", "killed", "different collectives"])
def test_a_rank_in_trouble_ends_the_job_within_the_bound(tmp_path, source, message, bound):
    rc, out = run_job(source, tmp_path)
    took = seconds_since("TROUBLE_AT", out)
    assert rc != 0 and "passed" not in out, out
    assert message in out, out
    assert took < bound, f"took {took:.1f} s"
    if message:
        assert "HISTFOREST_WATCHDOG" in out, out  # the line says which bound to change


def test_a_slow_but_busy_rank_is_waited_for(tmp_path):
    rc, out = run_job(SLOW, tmp_path)
    assert rc == 0, out
    assert out.count("passed") == 3, out


# A watchdog question still unreceived when the job ends (its peer had stopped
# listening). On the data communicator it made MPI_Finalize fail on that rank (MPICH 5:
# "being freed has 1 unmatched message(s)") and mpirun then killed a job that had
# succeeded: the slow-rank test above failed about two runs in three that way.
UNRECEIVED = HEAD + """
from native import watchdog
dog = watchdog._ACTIVE[0]
if comm.rank == 0:
    dog.channel.isend(np.ones(1), 1, watchdog.TAG_REPLY)   # no one will ever receive it
col.allreduce(comm, np.ones(10))
say("rank", comm.rank, "passed")
"""


def test_a_watchdog_message_left_unreceived_does_not_fail_the_exit(tmp_path):
    rc, out = run_job(UNRECEIVED, tmp_path)
    assert rc == 0, out
    assert out.count("passed") == 3, out


ACTIVITY = "say('rank', comm.rank, 'activity', comm.activity is None)\n"


def test_watchdog_can_be_switched_off(tmp_path):
    rc, out = run_job(HEAD + ACTIVITY,
                      tmp_path, env={"HISTFOREST_WATCHDOG": "0"})
    assert rc == 0 and out.count("activity True") == 3, out
    rc, out = run_job(HEAD + ACTIVITY,
                      tmp_path, env={})
    assert rc == 0 and out.count("activity False") == 3, out


def test_settings_are_read_and_checked(monkeypatch):
    from native import watchdog

    monkeypatch.delenv(watchdog.ENV_STALL, raising=False)
    assert watchdog.setting(watchdog.ENV_STALL) == watchdog.DEFAULTS[watchdog.ENV_STALL]
    monkeypatch.setenv(watchdog.ENV_STALL, "2.5")
    assert watchdog.setting(watchdog.ENV_STALL) == 2.5
    for bad in ("soon", "0", "-1"):
        monkeypatch.setenv(watchdog.ENV_STALL, bad)
        with pytest.raises(ValueError, match=watchdog.ENV_STALL):
            watchdog.setting(watchdog.ENV_STALL)
    monkeypatch.setenv(watchdog.ENV, "off")
    assert not watchdog.enabled()
    monkeypatch.setenv(watchdog.ENV, "1")
    assert watchdog.enabled()
    from native.comm import SelfCommunicator

    assert watchdog.start(SelfCommunicator()) is None  # one rank: nothing to watch

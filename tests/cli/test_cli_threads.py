"""forest-* tools under mpirun: each rank takes its share of the node's cores as Numba threads."""
import os
import subprocess
import sys

import numba
import pytest

from forest.cli.common import share_cores, usable_cores

from cli_helpers import MPIRUN, ROOT


class _Comm:
    def __init__(self, size, rank, keys):
        self.size, self.rank, self._keys = size, rank, keys

    def node_keys(self):
        return list(self._keys)


@pytest.fixture
def restore_threads():
    before = numba.get_num_threads()
    yield
    numba.set_num_threads(before)


def _share(on_node):
    cores = usable_cores()
    share = cores if cores < os.cpu_count() else cores // on_node
    return max(1, min(share, numba.config.NUMBA_NUM_THREADS))


def test_share_is_the_usable_cores_over_the_ranks_of_the_node(restore_threads):
    # ranks 0 and 1 on one node, rank 2 alone on another
    expect = _share(2)
    assert share_cores(_Comm(3, 1, [0, 0, 2]), environ={}) == expect
    assert numba.get_num_threads() == expect
    alone = _share(1)
    assert share_cores(_Comm(3, 2, [0, 0, 2]), environ={}) == alone


def test_one_rank_or_the_users_setting_is_left_alone(restore_threads):
    assert share_cores(_Comm(1, 0, [0]), environ={}) is None
    assert share_cores(_Comm(4, 0, [0, 0, 0, 0]), environ={"NUMBA_NUM_THREADS": "2"}) is None


@pytest.mark.parametrize("user", [None, "1"])
def test_ranks_under_mpirun(user):
    """On a machine of 2 or more cores two unbound ranks take half each (1 thread on 2 cores,
    where Numba alone would start 2); the user's NUMBA_NUM_THREADS stands."""
    # rank 0 prints every rank's line (two ranks printing at once can interleave on mpirun's stdout)
    code = ("import numba\n"
            "from forest.cli.common import world\n"
            "from native import collectives as col\n"
            "comm = world()\n"
            "mine = (comm.rank, numba.get_num_threads(), numba.config.NUMBA_NUM_THREADS)\n"
            "rows = col.allgather_object(comm, mine)\n"
            "if comm.rank == 0:\n"
            "    print('\\n'.join(' '.join(map(str, r)) for r in rows), flush=True)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS")}
    if user is not None:
        env["NUMBA_NUM_THREADS"] = user
    out = subprocess.run([MPIRUN, "-np", "2", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = sorted(line.split() for line in out.stdout.strip().splitlines())
    assert [int(line[0]) for line in lines] == [0, 1]
    for _, threads, pool in lines:
        want = 1 if user == "1" else max(1, min(usable_cores() // 2 if usable_cores() >= os.cpu_count()
                                                else usable_cores(), int(pool)))
        assert int(threads) == want

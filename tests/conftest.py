"""Shared fixtures.

Tests marked ``mpi`` are written once and run twice by ``make test``: in the serial
suite (a world of one rank) and under ``mpirun -np K`` for K in 2, 3, 4. Inside such a
test, ``comm`` is the real world communicator; every rank runs the same test body.
A test that fails on one rank while others wait in a collective would hang, so mpi
tests compute first and assert after the last collective (or use ``comm.abort``).
"""
import numpy as np
import pytest

from native.blocks import block_range
from native.comm import world


@pytest.fixture(scope="session")
def comm():
    """The world communicator (size 1 outside mpirun)."""
    return world()


def block_slice(n, size, rank):
    """Contiguous block of ``n`` global rows owned by ``rank`` (sizes differ by <= 1).

    Test modules should not import this (``conftest`` names collide between test
    folders); use the ``rank_slice`` fixture or ``native.blocks.block_range``.

    Returns
    -------
    slice
    """
    return slice(*block_range(n, size, rank))


@pytest.fixture
def rank_slice(comm):
    """``rank_slice(n)`` -> this rank's slice of ``n`` global rows."""
    return lambda n: block_slice(n, comm.size, comm.rank)


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def _model_contents(est):
    from forest.io import model_io

    header, arrays = model_io.dumps_header_and_arrays(est)
    return header["params"], header["state"], [(a.dtype.str, a.shape, a.tobytes()) for a in arrays]


@pytest.fixture
def same_model_file():
    """``same_model_file(a, b)``: True when two estimators' model files hold the same
    parameters, state and arrays, bit for bit (only the creation time may differ)."""
    return lambda a, b: _model_contents(a) == _model_contents(b)

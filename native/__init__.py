"""native: communicators and collectives that histforest owns.

This package owns every byte that crosses ranks. It depends on numpy and mpi4py
only; nothing outside ``native`` imports mpi4py (and inside it, only ``comm``).

Modules
-------
comm         the communicator seam (point-to-point on numpy buffers, abort);
             ``MPICommunicator`` over mpi4py, ``SelfCommunicator`` for one process.
collectives  the public collectives, algorithm choice (cost model), check mode.
fusion       many arrays reduced as few fused buffers (tensor fusion).
blocks       block partition shared by every blocked collective (``block_bounds``).
algorithms/  ring, recursive halving/doubling (Rabenseifner), Bruck, binomial tree.
transport    the counted send/receive layer and the message tags.
stats        ``STATS``: calls and bytes sent by this rank.
check        the check-mode handshake (same collective, sizes, dtypes on all ranks).
threads      ``ThreadWorld``: p ranks as threads of one process (tests, experiments).
errors       mismatch errors and ``abort_on_uncaught``.
"""

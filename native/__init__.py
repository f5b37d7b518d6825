"""native: communicators and collectives that histforest owns.

This package owns every byte that crosses ranks. It depends on numpy and mpi4py
only; nothing outside ``native`` imports mpi4py (and inside it, only ``comm``).

Modules
-------
comm         the communicator seam (point-to-point on numpy buffers, abort);
             ``MPICommunicator`` over mpi4py, ``SelfCommunicator`` for one process,
             ``use_world`` (hand another communicator to ``world()``).
collectives  the public collectives, algorithm choice (cost model), check mode.
order        the canonical summation order every sum algorithm ``auto`` picks follows.
topology     which ranks share a node (``MPI_Comm_split_type`` SHARED, pseudo-nodes).
subcomm      a subset of a communicator's ranks as a communicator (nodes, leaders).
costs        alpha-beta-gamma model of every algorithm on a node layout.
fusion       many arrays reduced as few fused buffers (tensor fusion).
blocks       block partition shared by every blocked collective (``block_bounds``).
algorithms/  ring, recursive halving/doubling (Rabenseifner), direct (pairwise)
             reduce-scatter, hierarchical (node-aware), Bruck, binomial tree.
transport    the counted send/receive layer and the message tags.
stats        ``STATS``: calls and bytes sent by this rank; optional call traces.
check        the check-mode handshake (same collective, sizes, dtypes on all ranks).
watchdog     the default watchdog: a dead or stalled rank ends the job, not hangs it.
settings     ``HISTFOREST_*`` environment settings.
threads      ``ThreadWorld``: p ranks as threads of one process (tests, experiments).
socket_comm  ``SocketCommunicator``: the seam over TCP (Spark, Dask, any launcher; no MPI).
rendezvous   ``host:port`` endpoints -> a checked full mesh of TCP links.
errors       mismatch errors, ``abort_on_uncaught`` and ``job_guard`` (the public face of the
             leaf modules ``exceptions`` and ``abort``).
activity     what a rank's main thread is blocked on (written by ``comm``, read by ``watchdog``).
"""

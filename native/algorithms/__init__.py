"""Collective algorithms on flat 1-D buffers, written against the communicator seam.

Each module holds one family: ``ring`` (ring reduce-scatter and allgather),
``halving`` (recursive halving / doubling, Rabenseifner's allreduce and the
non-power-of-two fold), ``bruck`` (Bruck's allgather) and ``tree`` (binomial
broadcast). They operate in place on contiguous 1-D arrays and know nothing of
shapes, dtypes policy, algorithm choice or check mode; :mod:`native.collectives`
does that.
"""

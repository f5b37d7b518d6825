"""native: communicators and collectives that histforest owns.

This package owns every byte that crosses ranks. It depends on numpy and mpi4py
only; nothing outside ``native`` imports mpi4py.
"""

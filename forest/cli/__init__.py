"""Command-line tools: ``forest-train``, ``forest-predict`` and ``forest-report``.

Each tool module keeps its imports of the numerical stack inside ``main`` so that
``--help`` answers without loading Numba, MPI or the estimators.
"""

"""histogram: binning of raw features and per-(node, feature, bin) channel sums.

Depends on ``native`` (for distributed bin fitting) and numpy/numba; knows nothing
about the models that consume the histograms.
"""
from ._jit_cache import configure_numba_cache as _configure_numba_cache
from ._thread_wait import configure_thread_wait as _configure_thread_wait

# Before any kernel module is imported: a cache directory per source version, so a
# kernel can never load another module's stale inlined code (see _jit_cache).
_configure_numba_cache()
# Before Numba loads libgomp (its first parallel call): idle workers spin briefly, then
# sleep, instead of holding a core another process needs (see _thread_wait).
_configure_thread_wait()

"""Where Numba keeps its compiled kernels: one cache directory per source version.

Numba invalidates a cached function only when *its own* source file changes. Our
kernels call across modules (``forest.engine.local_growth`` inlines the causal gain of
``forest.criteria.causal``, the growers call ``histogram.cpu_kernels``), so editing
a callee's file would leave its callers' cached machine code running the old
callee: wrong splits with no error. Keying the cache directory by a hash of every
source file of the three packages makes any change start from an empty cache (one
cold compile, about 30 s), and no stale kernel can ever be loaded.

The directory is ``$XDG_CACHE_HOME/histforest/numba-<key>`` (``~/.cache`` when
``XDG_CACHE_HOME`` is unset), set through ``NUMBA_CACHE_DIR`` before Numba is
imported (child processes and MPI ranks inherit it). A user's own
``NUMBA_CACHE_DIR`` always wins. Directories of other source versions untouched
for :data:`PRUNE_AFTER_DAYS` days are removed.
"""
import functools
import hashlib
import os
import shutil
import sys
import time
from pathlib import Path

#: The packages whose source keys the cache (all of histforest's Numba code).
PACKAGES = ("native", "histogram", "forest")

#: Cache directories of other source versions older than this are deleted.
PRUNE_AFTER_DAYS = 30

def source_key(root):
    """Hex digest over the relative paths and bytes of every ``.py`` file of PACKAGES.

    Parameters
    ----------
    root : pathlib.Path
        Directory that holds the package folders.

    Returns
    -------
    str
        16 hex digits.
    """
    digest = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode())
            digest.update(b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@functools.cache
def configure_numba_cache():
    """Point Numba's on-disk cache at this source version's directory (idempotent).

    Returns
    -------
    str or None
        The cache directory in use, or None when left to Numba's default (no
        writable cache home).
    """
    if os.environ.get("NUMBA_CACHE_DIR"):
        return os.environ["NUMBA_CACHE_DIR"]
    chosen = _keyed_directory()
    if chosen:
        os.environ["NUMBA_CACHE_DIR"] = chosen
        config = sys.modules.get("numba.core.config")
        if config is not None:  # Numba already imported: its config read the env before
            config.CACHE_DIR = chosen
    return chosen


def _keyed_directory():
    home = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(home):  # no home directory to expand: keep Numba's default
        return None
    base = Path(home) / "histforest"
    target = base / f"numba-{source_key(Path(__file__).resolve().parent.parent)}"
    try:
        target.mkdir(parents=True, exist_ok=True)
        if not os.access(target, os.W_OK):
            return None
    except OSError:
        return None
    _prune(base, target)
    return str(target)


def _prune(base, keep):
    cutoff = time.time() - PRUNE_AFTER_DAYS * 86400
    try:
        others = [p for p in base.iterdir() if p.name.startswith("numba-") and p != keep]
    except OSError:
        return
    for path in others:
        try:
            if path.stat().st_mtime < cutoff:
                shutil.rmtree(path, ignore_errors=True)
        except OSError:
            pass

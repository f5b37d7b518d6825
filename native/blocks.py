"""Block partitions: which contiguous piece of a buffer each rank owns.

Every blocked collective (reduce-scatter, the reduce-scatter half of the allreduces,
allgather) splits its buffer with :func:`block_bounds`, so a rank's block is the same
whichever algorithm produced it. Blocks differ in length by at most one and the
longer blocks come first, exactly like ``tests.conftest.block_slice``.
"""
import numpy as np


def block_bounds(n, p):
    """Boundaries of ``p`` contiguous blocks covering ``range(n)``.

    Parameters
    ----------
    n : int
        Number of items (elements, or rows along axis 0), ``n >= 0``.
    p : int
        Number of blocks, ``p >= 1``.

    Returns
    -------
    bounds : ndarray of int64, shape (p + 1,)
        Block ``i`` is ``range(bounds[i], bounds[i + 1])``; ``bounds[0] == 0`` and
        ``bounds[p] == n``. The first ``n % p`` blocks hold ``n // p + 1`` items, the
        rest ``n // p``.
    """
    n = int(n)
    p = int(p)
    if n < 0:
        raise ValueError(f"block_bounds needs n >= 0, got n={n}")
    if p < 1:
        raise ValueError(f"block_bounds needs p >= 1, got p={p}")
    base, extra = divmod(n, p)
    sizes = np.full(p, base, dtype=np.int64)
    sizes[:extra] += 1
    bounds = np.zeros(p + 1, dtype=np.int64)
    np.cumsum(sizes, out=bounds[1:])
    return bounds


def block_range(n, p, i):
    """``(start, stop)`` of block ``i`` among ``p`` blocks of ``range(n)``."""
    bounds = block_bounds(n, p)
    return int(bounds[i]), int(bounds[i + 1])

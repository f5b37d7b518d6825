"""Independent references shared by the native tests."""
import numpy as np


def split_range(n, p, r):
    """Rank ``r``'s block of ``range(n)`` among ``p``, as ``numpy.array_split`` cuts it.

    The same convention as ``tests/conftest.block_slice``, from an independent
    implementation (and importable: a conftest is not, once several conftest.py
    files are collected together).

    Returns
    -------
    slice
    """
    sizes = [len(part) for part in np.array_split(np.arange(n), p)]
    start = sum(sizes[:r])
    return slice(start, start + sizes[r])

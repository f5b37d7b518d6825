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


def pair_sum(values):
    """Sum ``values`` (a list of arrays) by the pair tree, written from its definition.

    Independent of ``native.order``: the first ``2 rem`` items are added in neighbouring
    pairs (``rem = k - `` the largest power of two ``<= k``), then neighbours are added
    level by level until one sum is left.
    """
    k = len(values)
    q = 1
    while 2 * q <= k:
        q *= 2
    rem = k - q
    level = [values[2 * i] + values[2 * i + 1] for i in range(rem)] + list(values[2 * rem:])
    while len(level) > 1:
        level = [level[2 * i] + level[2 * i + 1] for i in range(len(level) // 2)]
    return level[0]


def canonical_sum(parts, node_of):
    """Reference of the canonical order: pair sum inside each node, then over nodes.

    Parameters
    ----------
    parts : sequence of ndarray
        Contribution of each rank.
    node_of : sequence of int
        Node label of each rank; nodes are ordered by their lowest rank.
    """
    nodes = {}
    for r, label in enumerate(node_of):
        nodes.setdefault(label, []).append(r)
    ordered = sorted(nodes.values(), key=lambda rs: rs[0])
    return pair_sum([pair_sum([parts[r] for r in rs]) for rs in ordered])

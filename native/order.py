"""The canonical summation order of histforest's sum collectives.

Floating-point addition commutes exactly but does not associate, so a sum over ranks
is defined by the *shape* of the binary tree that combines the ranks' contributions
(which operand sits left or right of an addition does not matter). Every sum
collective that ``algorithm="auto"`` may choose produces the same tree for a given
node layout, so the choice between algorithms (recursive doubling, Rabenseifner,
direct reduce-scatter, hierarchical) never changes a single bit of the result.

The tree (:func:`canonical_tree`)
    Inside each node, the node's ranks in increasing order are combined by the
    *pair tree* (:func:`pair_tree`); the node sums are then combined by the pair tree
    over the nodes, ordered by their lowest rank. With one node, or one rank per node,
    this is the pair tree over all ranks.

The pair tree of ``k`` items (:func:`pair_tree`)
    With ``q`` the largest power of two ``<= k`` and ``rem = k - q``: items
    ``(0, 1), (2, 3), ..., (2 rem - 2, 2 rem - 1)`` are added first (the "fold"),
    which leaves ``q`` partial sums in order; these are combined as a complete binary
    tree, neighbours first. This is exactly what recursive doubling computes (its fold
    and then partners ``v ^ 1, v ^ 2, ...``), and what recursive halving computes when
    it pairs ``v ^ 1`` first (:mod:`native.algorithms.halving`).

Why a node-level tree: a hierarchical collective adds each node's ranks before
anything crosses the network; that is its whole point. A node sum is a subtree of the
result, so the canonical tree has to contain one subtree per node. Flat algorithms
whose own tree differs from it (the pair tree over all ranks, when nodes are not
aligned with it) are not offered by ``"auto"`` on that layout; the direct
reduce-scatter (:mod:`native.algorithms.direct`) gathers every contribution of a
block at its owner and can add them in any order, so it is always available. When the
nodes hold equal power-of-two numbers of consecutive ranks, the canonical tree *is*
the pair tree over all ranks (tested), so every algorithm qualifies.

The ring algorithms and MPI's own ``Allreduce`` add along a chain (or in the
library's order): they stay available by name, with their own order, and ``"auto"``
never picks them.

A tree is a nested tuple: a leaf is an ``int`` (a rank), an inner node a pair
``(left, right)``. :func:`schedule` turns a tree into the list of pairwise additions
that computes it; :func:`tree_sum` runs that list on stacked contributions (the NumPy
reference of the tests, and the owner's sum in the direct algorithm).
"""
import functools

import numpy as np


def pair_tree(items):
    """The pair tree over ``items`` (see the module docstring).

    Parameters
    ----------
    items : sequence
        Leaves (ranks) or subtrees, in order; at least one.

    Returns
    -------
    int or tuple
        The single item if there is one, else a nested pair ``(left, right)``.
    """
    items = list(items)
    if not items:
        raise ValueError("pair_tree needs at least one item")
    k = len(items)
    q = 1 << (k.bit_length() - 1)
    rem = k - q
    level = [(items[2 * i], items[2 * i + 1]) for i in range(rem)] + items[2 * rem:]
    while len(level) > 1:
        level = [(level[2 * i], level[2 * i + 1]) for i in range(len(level) // 2)]
    return level[0]


def canonical_tree(nodes):
    """The canonical tree for a node layout.

    Parameters
    ----------
    nodes : sequence of sequence of int
        The ranks of each node, nodes ordered by their lowest rank, ranks increasing
        (as :class:`native.topology.Topology` lists them).

    Returns
    -------
    int or tuple
    """
    return pair_tree([pair_tree(list(node)) for node in nodes])


def flat_tree(p):
    """The pair tree over ranks ``0 .. p - 1``: what doubling and halving compute."""
    return pair_tree(list(range(p)))


def normalized(tree):
    """``tree`` with the two children of every inner node ordered by their lowest leaf.

    Two trees give bitwise-equal sums for all inputs iff their normalized forms are
    equal (addition commutes, so only the unordered shape matters).
    """
    return _normalized(tree)[0]


def _normalized(tree):
    if isinstance(tree, tuple):
        a, lo_a = _normalized(tree[0])
        b, lo_b = _normalized(tree[1])
        return ((a, b), lo_a) if lo_a <= lo_b else ((b, a), lo_b)
    return tree, tree


def same_sum(tree_a, tree_b):
    """True if the two trees add their leaves in the same way (bitwise-equal sums)."""
    return normalized(tree_a) == normalized(tree_b)


@functools.lru_cache(maxsize=256)
def schedule(tree):
    """Pairwise additions that compute ``tree``, children before parents.

    Each inner node is computed at the lowest leaf of its subtree ("the subtree's
    owner"): entry ``(dst, src)`` means "the owner ``dst`` of the left subtree adds the
    partial sum of ``src``, the owner of the right subtree". A leaf appears as ``dst``
    only after all of its own subtree's additions, and as ``src`` exactly once (except
    the root's owner), so the list is also a deadlock-free plan for a distributed tree
    reduction.

    Parameters
    ----------
    tree : int or tuple
        Hashable nested tuple.

    Returns
    -------
    tuple of (int, int)
        ``len == leaves - 1``.
    """
    out = []

    def walk(node):
        if not isinstance(node, tuple):
            return node
        a = walk(node[0])
        b = walk(node[1])
        dst, src = (a, b) if a <= b else (b, a)
        out.append((dst, src))
        return dst

    walk(tree)
    return tuple(out)


def root(tree):
    """Leaf that holds the total after :func:`schedule`: the lowest leaf."""
    if isinstance(tree, tuple):
        return min(root(tree[0]), root(tree[1]))
    return tree


def tree_sum(parts, tree, out=None):
    """Sum the rows of ``parts`` in the order ``tree`` prescribes.

    Parameters
    ----------
    parts : ndarray, shape (p, m)
        Row ``r`` is rank ``r``'s contribution; used as scratch (rows are
        overwritten by partial sums).
    tree : int or tuple
        Over leaves ``0 .. p - 1``.
    out : ndarray, shape (m,), optional

    Returns
    -------
    ndarray, shape (m,)
        The sum (``out`` if given, else a row view of ``parts``).
    """
    for dst, src in schedule(tree):
        np.add(parts[dst], parts[src], out=parts[dst])
    total = parts[root(tree)]
    if out is not None:
        np.copyto(out, total)
        return out
    return total

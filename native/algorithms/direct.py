"""Direct (pairwise-exchange) reduce-scatter: every block is summed once, at its owner.

In step ``k = 1 .. p-1`` rank ``r`` sends its contribution to block ``r + k`` to rank
``r + k`` and receives rank ``r - k``'s contribution to its own block (mod p), so each
pair of ranks exchanges exactly once. The owner then holds all ``p`` raw contributions
to its block and adds them in whatever order it is told: the canonical tree of
:mod:`native.order`, for any node layout. That is what makes this the flat algorithm
that always agrees bitwise with the hierarchical one (and with recursive doubling and
halving where their trees are canonical).

Cost: ``(p-1)`` messages of ``n/p`` bytes per rank and ``(p-1)/p n`` additions, the same
as the ring's reduce-scatter; unlike the ring it holds the ``p`` contributions of a
block at once, so the block is processed in rounds of at most
:data:`SCRATCH_BYTES` of scratch (each round costs another ``p - 1`` messages).
"""
import numpy as np

from ..blocks import block_bounds
from ..order import tree_sum
from ..transport import TAG_DIRECT, exchange

#: Largest scratch buffer (all ``p`` contributions of one round of a block), bytes.
SCRATCH_BYTES = 32 * 2**20


def rounds_for(max_block_bytes, p):
    """Rounds the direct reduce-scatter uses when the largest block has ``max_block_bytes``."""
    return max(1, -(-int(max_block_bytes) * p // SCRATCH_BYTES))


def direct_reduce_scatter(comm, acc, bounds, tree):
    """Sum ``acc`` over ranks so that each rank's own block ends complete.

    Parameters
    ----------
    comm : native.comm.Communicator
    acc : ndarray, shape (n,)
        Contiguous; this rank's contribution on entry. On return
        ``acc[bounds[rank]:bounds[rank + 1]]`` holds the sum, added in the order of
        ``tree``; the rest of ``acc`` is unchanged.
    bounds : ndarray of int64, shape (size + 1,)
    tree : int or tuple
        Summation tree over ranks ``0 .. size - 1`` (:mod:`native.order`).
    """
    p, r = comm.size, comm.rank
    if p == 1:
        return acc
    sizes = np.diff(bounds)
    n_rounds = rounds_for(int(sizes.max()) * acc.itemsize, p)
    # Sub-ranges of every block per round, the same on all ranks.
    sub = [block_bounds(int(s), n_rounds) for s in sizes]
    mine = sub[r]
    parts = np.empty((p, int(np.diff(mine).max()) if sizes[r] else 0), dtype=acc.dtype)
    for j in range(n_rounds):
        lo, hi = bounds[r] + mine[j], bounds[r] + mine[j + 1]
        view = parts[:, :hi - lo]
        view[r] = acc[lo:hi]
        for step in range(1, p):
            dst, src = (r + step) % p, (r - step) % p
            d0 = bounds[dst] + sub[dst][j]
            d1 = bounds[dst] + sub[dst][j + 1]
            exchange(comm, acc[d0:d1], dst, parts[src, :hi - lo], src, TAG_DIRECT)
        tree_sum(view, tree, out=acc[lo:hi])
    return acc

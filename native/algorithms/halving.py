"""Recursive halving and doubling: Rabenseifner's allreduce and its pieces.

Power-of-two core (``q = 2**k`` active ranks, "virtual ranks" ``v``):

- recursive-halving reduce-scatter: at distance ``d = q/2, q/4, ..., 1`` rank ``v``
  swaps half of its current segment range with ``v ^ d``, keeps the half that
  contains ``v`` and adds the partner's partial into it. After ``log2 q`` steps ``v``
  holds segment ``v`` complete; each element was added at exactly one rank per step.
- recursive-doubling allgather: at distance ``d = 1, 2, ..., q/2`` ``v`` swaps its
  aligned run of ``d`` complete segments with ``v ^ d``'s run (copies only).

Non-power-of-two ``p = q + rem`` (the "fold"): among ranks ``0 .. 2 rem - 1`` each
even rank hands its whole buffer to the odd rank above it, which adds it and
becomes virtual rank ``r // 2``; ranks ``>= 2 rem`` become ``r - rem``. At the end the
odd rank hands the result (the whole buffer for allreduce, the even rank's block
for reduce-scatter) back. Every element is summed in one place and then copied, so
all ranks end bitwise identical.

Costs (alpha latency, beta seconds per byte, n bytes): allreduce
``2 log2(q) alpha + 2 (q-1)/q n beta``, plus ``2 alpha + 2 n beta`` for the fold when p
is not a power of two.

Also here: the latency-optimal recursive-doubling allreduce (whole buffer at each
of ``log2 q`` steps) with a caller-supplied commutative combine, used for tiny
sums and for the best-split selection.
"""
import numpy as np

from ..blocks import block_bounds
from ..transport import (TAG_DOUBLING, TAG_FOLD, TAG_HALVING, TAG_RD_ALLREDUCE,
                         exchange, recv, send)


class Fold:
    """Map real ranks to the power-of-two set of active ("virtual") ranks.

    Attributes
    ----------
    pof2 : int
        Largest power of two ``<= size``.
    rem : int
        ``size - pof2``: the number of ranks that fold in.
    vrank : int
        This rank's virtual rank, or ``-1`` if it folds into ``partner`` and waits.
    partner : int or None
        Real rank this rank exchanges with in the fold (``None`` if it takes no part).
    """

    def __init__(self, size, rank):
        self.pof2 = 1 << (size.bit_length() - 1)
        self.rem = size - self.pof2
        self.partner = None
        if rank < 2 * self.rem:
            if rank % 2 == 0:
                self.vrank, self.partner = -1, rank + 1
            else:
                self.vrank, self.partner = rank // 2, rank - 1
        else:
            self.vrank = rank - self.rem

    def real(self, v):
        """Real rank of virtual rank ``v``."""
        return 2 * v + 1 if v < self.rem else v + self.rem

    def first_block(self, v):
        """First real block owned by virtual rank ``v`` (it owns blocks of its fold pair)."""
        return 2 * v if v < self.rem else v + self.rem


def halving_reduce_scatter(comm, acc, seg, fold):
    """Recursive-halving reduce-scatter among the active ranks.

    Parameters
    ----------
    comm : native.comm.Communicator
    acc : ndarray, shape (n,)
        This active rank's (folded) contribution; on return segment ``fold.vrank``
        of it is complete and the rest is scratch.
    seg : ndarray of int64, shape (fold.pof2 + 1,)
        Segment boundaries: virtual rank ``v`` ends owning ``acc[seg[v]:seg[v + 1]]``.
    fold : Fold
    """
    v, q = fold.vrank, fold.pof2
    if q == 1:
        return acc
    half = q // 2
    tmp = np.empty(int(max(seg[half] - seg[0], seg[q] - seg[half])), dtype=acc.dtype)
    lo, hi, d = 0, q, half
    while d >= 1:
        pv = v ^ d
        mid = lo + d
        keep, give = ((lo, mid), (mid, hi)) if v < pv else ((mid, hi), (lo, mid))
        k0, k1 = seg[keep[0]], seg[keep[1]]
        incoming = tmp[: k1 - k0]
        peer = fold.real(pv)
        exchange(comm, acc[seg[give[0]]:seg[give[1]]], peer, incoming, peer, TAG_HALVING)
        np.add(acc[k0:k1], incoming, out=acc[k0:k1])
        lo, hi = keep
        d //= 2
    return acc


def doubling_allgather(comm, buf, seg, fold):
    """Recursive-doubling allgather of segments among the active ranks.

    Parameters
    ----------
    comm : native.comm.Communicator
    buf : ndarray, shape (n,)
        Segment ``fold.vrank`` valid on entry; all of ``buf`` on return.
    seg : ndarray of int64, shape (fold.pof2 + 1,)
    fold : Fold
    """
    v, q = fold.vrank, fold.pof2
    d = 1
    while d < q:
        pv = v ^ d
        mine, theirs = (v // d) * d, (pv // d) * d
        peer = fold.real(pv)
        exchange(comm, buf[seg[mine]:seg[mine + d]], peer,
                 buf[seg[theirs]:seg[theirs + d]], peer, TAG_DOUBLING)
        d *= 2
    return buf


def _fold_in(comm, acc, fold):
    """Odd partner receives the even rank's buffer and adds it (even rank sends)."""
    if fold.vrank < 0:
        send(comm, acc, fold.partner, TAG_FOLD)
    elif fold.partner is not None:
        incoming = recv(comm, np.empty_like(acc), fold.partner, TAG_FOLD)
        np.add(acc, incoming, out=acc)


def rabenseifner_allreduce(comm, acc):
    """Sum ``acc`` over ranks in place (Rabenseifner; any ``size``).

    Parameters
    ----------
    comm : native.comm.Communicator
    acc : ndarray, shape (n,)
        Contiguous; this rank's contribution on entry, the sum on return
        (bitwise identical on every rank).
    """
    fold = Fold(comm.size, comm.rank)
    _fold_in(comm, acc, fold)
    if fold.vrank < 0:
        return recv(comm, acc, fold.partner, TAG_FOLD)
    seg = block_bounds(acc.size, fold.pof2)
    halving_reduce_scatter(comm, acc, seg, fold)
    doubling_allgather(comm, acc, seg, fold)
    if fold.partner is not None:
        send(comm, acc, fold.partner, TAG_FOLD)
    return acc


def halving_reduce_scatter_blocks(comm, acc, bounds):
    """Reduce-scatter by recursive halving onto ``size`` blocks (any ``size``).

    Parameters
    ----------
    comm : native.comm.Communicator
    acc : ndarray, shape (n,)
        Contribution on entry; on return ``acc[bounds[rank]:bounds[rank + 1]]`` is
        the complete sum of this rank's block (the rest is scratch).
    bounds : ndarray of int64, shape (size + 1,)
    """
    p, r = comm.size, comm.rank
    fold = Fold(p, r)
    _fold_in(comm, acc, fold)
    if fold.vrank < 0:
        return recv(comm, acc[bounds[r]:bounds[r + 1]], fold.partner, TAG_FOLD)
    # Virtual rank v's segment is the run of real blocks of its fold pair, so segments
    # are contiguous, in order, and cut only at real block boundaries.
    seg = np.empty(fold.pof2 + 1, dtype=np.int64)
    seg[:-1] = bounds[[fold.first_block(v) for v in range(fold.pof2)]]
    seg[-1] = bounds[p]
    halving_reduce_scatter(comm, acc, seg, fold)
    if fold.partner is not None:
        e = fold.partner
        send(comm, acc[bounds[e]:bounds[e + 1]], e, TAG_FOLD)
    return acc


def doubling_allreduce(comm, acc, combine):
    """Latency-optimal allreduce: whole buffer exchanged at each of ``log2`` steps.

    Parameters
    ----------
    comm : native.comm.Communicator
    acc : ndarray, shape (n,)
        Contribution on entry, the reduction on return.
    combine : callable ``(mine, theirs) -> ndarray``
        Elementwise reduction of two flat buffers of shape (n,). Must be commutative
        bit for bit (``combine(a, b)`` equals ``combine(b, a)`` exactly, as IEEE
        addition is): partners at each step combine the same two operands in
        opposite roles, and that is what makes every rank end identical.
    """
    fold = Fold(comm.size, comm.rank)
    if fold.vrank < 0:
        send(comm, acc, fold.partner, TAG_FOLD)
        return recv(comm, acc, fold.partner, TAG_FOLD)
    tmp = np.empty_like(acc)
    if fold.partner is not None:
        recv(comm, tmp, fold.partner, TAG_FOLD)
        acc[...] = combine(acc, tmp)
    d = 1
    while d < fold.pof2:
        peer = fold.real(fold.vrank ^ d)
        exchange(comm, acc, peer, tmp, peer, TAG_RD_ALLREDUCE)
        acc[...] = combine(acc, tmp)
        d *= 2
    if fold.partner is not None:
        send(comm, acc, fold.partner, TAG_FOLD)
    return acc

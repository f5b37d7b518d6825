"""Recursive halving and doubling: Rabenseifner's allreduce and its pieces.

Power-of-two core (``q = 2**k`` active ranks, "virtual ranks" ``v``):

- recursive-halving reduce-scatter: at distance ``d = 1, 2, 4, ..., q/2`` rank ``v``
  swaps half of its current range of segment *positions* with ``v ^ d``, keeps the
  lower half if bit ``d`` of ``v`` is 0 (else the upper) and adds the partner's partial
  into it. After ``log2 q`` steps ``v`` holds position ``bitrev(v)`` complete. Pairing
  the nearest partners first makes the sum the *pair tree* of
  :mod:`native.order` (neighbours ``v, v ^ 1`` first, then pairs of pairs), the same
  tree recursive doubling computes; the bit-reversed positions keep every message one
  contiguous slice.
- recursive-doubling allgather: the same steps in reverse (``d = q/2, ..., 1``),
  copies only.

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


def bit_reverse(v, bits):
    """``v`` with its lowest ``bits`` bits in reverse order."""
    out = 0
    for _ in range(bits):
        out = (out << 1) | (v & 1)
        v >>= 1
    return out


def halving_reduce_scatter(comm, acc, seg, fold):
    """Recursive-halving reduce-scatter among the active ranks, nearest partners first.

    Parameters
    ----------
    comm : native.comm.Communicator
    acc : ndarray, shape (n,)
        This active rank's (folded) contribution; on return position
        ``bit_reverse(fold.vrank)`` of it is complete and the rest is scratch.
    seg : ndarray of int64, shape (fold.pof2 + 1,)
        Position boundaries: position ``s`` is ``acc[seg[s]:seg[s + 1]]``.
    fold : Fold
    """
    v, q = fold.vrank, fold.pof2
    if q == 1:
        return acc
    half = q // 2
    tmp = np.empty(int(max(seg[half] - seg[0], seg[q] - seg[half])), dtype=acc.dtype)
    lo, hi, d = 0, q, 1
    while d < q:
        mid = (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if not v & d else ((mid, hi), (lo, mid))
        k0, k1 = seg[keep[0]], seg[keep[1]]
        incoming = tmp[: k1 - k0]
        peer = fold.real(v ^ d)
        exchange(comm, acc[seg[give[0]]:seg[give[1]]], peer, incoming, peer, TAG_HALVING)
        np.add(acc[k0:k1], incoming, out=acc[k0:k1])
        lo, hi = keep
        d *= 2
    return acc


def doubling_allgather(comm, buf, seg, fold):
    """Recursive-doubling allgather of positions among the active ranks.

    The reverse of :func:`halving_reduce_scatter`: position ``bit_reverse(v)`` valid on
    entry, all of ``buf`` on return (copies only).

    Parameters
    ----------
    comm : native.comm.Communicator
    buf : ndarray, shape (n,)
    seg : ndarray of int64, shape (fold.pof2 + 1,)
    fold : Fold
    """
    v, q = fold.vrank, fold.pof2
    bits = q.bit_length() - 1
    lo = bit_reverse(v, bits)
    hi = lo + 1
    d = q // 2
    while d >= 1:
        size = hi - lo
        theirs = (hi, hi + size) if not v & d else (lo - size, lo)
        peer = fold.real(v ^ d)
        exchange(comm, buf[seg[lo]:seg[hi]], peer, buf[seg[theirs[0]]:seg[theirs[1]]], peer,
                 TAG_DOUBLING)
        lo, hi = min(lo, theirs[0]), max(hi, theirs[1])
        d //= 2
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
    seg = block_bounds(acc.size, fold.pof2)  # positions; v ends with bit_reverse(v)
    halving_reduce_scatter(comm, acc, seg, fold)
    doubling_allgather(comm, acc, seg, fold)
    if fold.partner is not None:
        send(comm, acc, fold.partner, TAG_FOLD)
    return acc


def halving_block_order(p):
    """Order in which :func:`halving_reduce_scatter_blocks` wants the ``p`` blocks laid out.

    Position ``s`` of the halving holds the blocks of virtual rank
    ``u = bit_reverse(s)`` (both real blocks of a folded pair, in order), so that each
    virtual rank ends owning its own blocks.

    Returns
    -------
    list of int
        A permutation of ``range(p)``.
    """
    fold = Fold(p, 0)
    bits = fold.pof2.bit_length() - 1
    out = []
    for s in range(fold.pof2):
        u = bit_reverse(s, bits)
        out += [2 * u, 2 * u + 1] if u < fold.rem else [u + fold.rem]
    return out


def halving_reduce_scatter_blocks(comm, acc, starts, stops):
    """Reduce-scatter by recursive halving onto ``size`` blocks (any ``size``).

    Parameters
    ----------
    comm : native.comm.Communicator
    acc : ndarray, shape (n,)
        Contribution on entry, its blocks laid out in :func:`halving_block_order`.
        On return ``acc[starts[rank]:stops[rank]]`` is the complete sum of this rank's
        block (the rest is scratch).
    starts, stops : ndarray of int64, shape (size,)
        Where real block ``b`` lies in ``acc``.
    """
    p, r = comm.size, comm.rank
    fold = Fold(p, r)
    _fold_in(comm, acc, fold)
    if fold.vrank < 0:
        return recv(comm, acc[starts[r]:stops[r]], fold.partner, TAG_FOLD)
    bits = fold.pof2.bit_length() - 1
    seg = np.empty(fold.pof2 + 1, dtype=np.int64)
    seg[:-1] = [starts[fold.first_block(bit_reverse(s, bits))] for s in range(fold.pof2)]
    seg[-1] = acc.size
    halving_reduce_scatter(comm, acc, seg, fold)
    if fold.partner is not None:
        e = fold.partner
        send(comm, acc[starts[e]:stops[e]], e, TAG_FOLD)
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

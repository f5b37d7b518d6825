"""Checks every compiled criterion's tests share (imported through the tests' conftest path).

:func:`random_cuts` draws candidate splits of a node's rows; :func:`assert_count_shortcuts_sound`
checks that a criterion's count shortcuts (``sides_ok``, ``right_exhausted``: the scans skip
candidates on them) never drop a candidate whose gain is finite.
"""
import numpy as np

from forest.criteria import compiled as cc


def random_cuts(rng, ch, n_cuts, lo=0.05, hi=0.95):
    """Random left/right cuts of a node's rows, each with its own left share.

    Parameters
    ----------
    rng : numpy.random.Generator
    ch : ndarray, shape (n, C)
        The rows' channels.
    n_cuts : int
    lo, hi : float
        Range of each cut's probability of sending a row left.

    Returns
    -------
    cuts : ndarray of bool, shape (n_cuts, n)
    lefts : ndarray of float64, shape (n_cuts, C)
        Channel sums of each cut's left side.
    """
    cuts = rng.random((n_cuts, len(ch))) < rng.uniform(lo, hi, size=(n_cuts, 1))
    return cuts, cuts.astype(float) @ ch


def assert_count_shortcuts_sound(crit, channels, rng, trials):
    """``sides_ok`` false => gain -inf; ``right_exhausted`` true => every later cut of a scan is -inf.

    Parameters
    ----------
    crit : forest.criteria.basic.Criterion
    channels : callable
        ``channels(rng, n) -> ndarray (n, C)``: the rows of one node.
    rng : numpy.random.Generator
    trials : int
        Nodes of 6 to 39 rows, each scanned in a random order with 0 to 3 missing rows.
    """
    rec = crit.compiled().record
    for _ in range(trials):
        n = int(rng.integers(6, 40))
        ch = channels(rng, n)
        parent = ch.sum(axis=0)
        order = rng.permutation(n)
        miss_rows = order[: int(rng.integers(0, 4))]
        rest = order[len(miss_rows):]
        miss = ch[miss_rows].sum(axis=0)
        cum = np.zeros_like(parent)
        exhausted = False
        for i, r in enumerate(rest[:-1]):
            cum = cum + ch[r]
            n_l = i + 1
            for with_miss in (False, True):
                left = cum + miss if with_miss else cum
                nl = n_l + (len(miss_rows) if with_miss else 0)
                g = float(crit.gain(left, parent - left, parent))
                if not cc.sides_ok(rec, nl, n - nl, cum, miss, with_miss, parent) or exhausted:
                    assert g == -np.inf
            exhausted = exhausted or cc.right_exhausted(rec, n - n_l, cum, parent)

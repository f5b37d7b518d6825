"""Harrell's concordance index of risk scores against censored times."""
import numpy as np


def concordance_index(time, event, risk):
    """Harrell's C: among comparable pairs (the earlier time is a failure), the share where the
    earlier failure has the larger risk (ties in risk count one half).

    Pairs with equal times are comparable when exactly one is a failure (that one
    comes first), as in scikit-survival's ``concordance_index_censored``.

    Parameters
    ----------
    time, risk : array-like of float, shape (n,)
    event : array-like of bool, shape (n,)

    Returns
    -------
    float
    """
    time = np.asarray(time, dtype=np.float64)
    event = np.asarray(event, dtype=bool)
    risk = np.asarray(risk, dtype=np.float64)
    order = np.argsort(time, kind="stable")
    time, event, risk = time[order], event[order], risk[order]
    concordant = 0.0
    comparable = 0.0
    # O(n^2 / blocks) in NumPy: each failure against every later-or-tied non-failure-first row
    for i in np.flatnonzero(event):
        later = (time > time[i]) | ((time == time[i]) & ~event)
        m = int(later.sum())
        if m:
            comparable += m
            concordant += float((risk[later] < risk[i]).sum()) + 0.5 * float((risk[later] == risk[i]).sum())
    if comparable == 0:
        raise ValueError("no comparable pairs: concordance needs a failure before some other time")
    return concordant / comparable

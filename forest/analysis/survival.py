"""Statistics of censored times: Harrell's concordance of risk scores, weighted Kaplan-Meier curves."""
import numpy as np

from histogram.jit import kernel


def concordance_index(time, event, risk):
    """Harrell's C: among comparable pairs (the earlier time is a failure), the share where the
    earlier failure has the larger risk (ties in risk count one half).

    Pairs with equal times are comparable when exactly one is a failure (that one
    comes first), as in scikit-survival's ``concordance_index_censored``. O(n log n):
    rows are added to a Fenwick tree over risk ranks from the latest time back.

    Parameters
    ----------
    time, risk : array-like of float, shape (n,)
    event : array-like of bool, shape (n,)

    Returns
    -------
    float
    """
    time = np.asarray(time, dtype=np.float64).reshape(-1)
    event = np.asarray(event, dtype=bool).reshape(-1)
    risk = np.asarray(risk, dtype=np.float64).reshape(-1)
    if not (len(time) == len(event) == len(risk)):
        raise ValueError(f"time, event and risk must have one length, got {len(time)}, {len(event)}, {len(risk)}")
    if not np.all(np.isfinite(risk)):
        raise ValueError("risk holds NaN or inf")
    order = np.lexsort((risk, -time))           # latest time first
    _, ranks = np.unique(risk, return_inverse=True)
    concordant, comparable = _concordance_counts(time[order], event[order], ranks[order].astype(np.int64),
                                                 int(ranks.max()) + 1 if len(ranks) else 1)
    if comparable == 0:
        raise ValueError("no comparable pairs: concordance needs a failure before some other time")
    return concordant / comparable


@kernel
def _concordance_counts(time, event, rank, n_ranks):
    # time decreasing; tree[k] counts the inserted rows (strictly later times) by risk rank
    tree = np.zeros(n_ranks + 1, dtype=np.int64)
    inserted = 0
    concordant = 0.0
    comparable = 0.0
    n = time.shape[0]
    a = 0
    while a < n:
        b = a
        while b < n and time[b] == time[a]:
            b += 1
        for i in range(a, b):
            if not event[i]:
                continue
            below = 0                      # inserted rows with a smaller risk rank
            k = rank[i]
            while k > 0:
                below += tree[k]
                k -= k & (-k)
            upto = 0                       # ... with a rank <= the row's
            k = rank[i] + 1
            while k > 0:
                upto += tree[k]
                k -= k & (-k)
            concordant += below + 0.5 * (upto - below)
            comparable += inserted
            for j in range(a, b):          # censored at the same time: after the failure
                if not event[j]:
                    comparable += 1
                    if rank[j] < rank[i]:
                        concordant += 1.0
                    elif rank[j] == rank[i]:
                        concordant += 0.5
        for i in range(a, b):
            k = rank[i] + 1
            while k <= n_ranks:
                tree[k] += 1
                k += k & (-k)
            inserted += 1
        a = b
    return concordant, comparable


def kaplan_meier(time, event, weight, at):
    """Weighted Kaplan-Meier and Nelson-Aalen curves of one sample at times ``at``.

    Plain NumPy, a loop over distinct times: the reference of the forest's kernel
    (:mod:`forest.engine.leaf_survival`) and the observed curves of a report.

    Parameters
    ----------
    time, event, weight : array-like, shape (m,)
    at : array-like, shape (k,)

    Returns
    -------
    survival, cumulative_hazard : ndarray of float64, shape (k,)
    """
    time = np.asarray(time, dtype=np.float64)
    event = np.asarray(event, dtype=np.float64)
    weight = np.asarray(weight, dtype=np.float64)
    at = np.asarray(at, dtype=np.float64)
    if not len(time):
        return np.full(len(at), np.nan), np.full(len(at), np.nan)
    distinct = np.unique(time)
    s, h = np.ones(len(distinct)), np.zeros(len(distinct))
    surv_k, chf_k = 1.0, 0.0
    for i, tk in enumerate(distinct):
        at_risk = weight[time >= tk].sum()
        d = (weight * event)[time == tk].sum()
        if d > 0 and at_risk > 0:
            hazard = min(d / at_risk, 1.0)
            surv_k *= 1.0 - hazard
            chf_k += hazard
        s[i], h[i] = surv_k, chf_k
    pos = np.searchsorted(distinct, at, side="right") - 1
    return np.where(pos >= 0, s[np.maximum(pos, 0)], 1.0), np.where(pos >= 0, h[np.maximum(pos, 0)], 0.0)

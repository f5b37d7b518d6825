"""Under mpirun every analysis returns, on every rank, what one process returns on all rows."""
import numpy as np
import pytest

from forest import simulate
from forest.estimators.causal_forest import CausalForest
from native import collectives as col
from native.comm import SelfCommunicator

SELF = SelfCommunicator()
KW = dict(n_estimators=12, nuisance_estimators=6, max_bins=32, random_state=5)


def _analyses(cf, comm, d, test, test_clusters):
    """Every analysis of the fitted forest, on its out-of-bag rows and on held-out rows."""
    out = {}
    for target in ("all", "treated", "control", "overlap"):
        out["ate", target] = cf.average_treatment_effect(target, comm=comm)
        out["ate-held", target] = cf.average_treatment_effect(target, X=test.X, t=test.t, y=test.y,
                                                              clusters=test_clusters, comm=comm)
    out["ate-subset"] = cf.average_treatment_effect(subset=d.X[:, 2] > 0.3, comm=comm)
    blp = cf.best_linear_projection(d.X[:, :2], comm=comm)
    out["blp"] = (blp.estimate, blp.stderr)
    cal = cf.test_calibration(comm=comm)
    out["cal"] = (cal.estimate, cal.stderr)
    for target in ("AUTOC", "QINI"):
        r = cf.rank_average_treatment_effect(d.X[:, 0], target=target, n_bootstrap=20, comm=comm)
        out["rate", target] = (r.estimate, r.stderr, r.toc, r.toc_stderr)
        h = cf.rank_average_treatment_effect(test.X[:, 0], test.X, test.t, test.y, target=target, n_bootstrap=20,
                                             clusters=test_clusters, comm=comm)
        out["rate-held", target] = (h.estimate, h.stderr, h.toc, h.toc_stderr)
    return out


@pytest.mark.mpi
@pytest.mark.parametrize("with_clusters", [False, True])
def test_analyses_do_not_depend_on_rank_count(comm, rank_slice, with_clusters):
    n, n_test = 800, 500
    d = simulate.linear_confounded(n, d=4, seed=20)
    test = simulate.linear_confounded(n_test, d=4, seed=21)
    labels = (np.arange(n) // 11) if with_clusters else None          # clusters straddle rank borders
    test_labels = (np.arange(n_test) // 7) if with_clusters else None
    sl, tsl = rank_slice(n), rank_slice(n_test)
    part = simulate.CausalData(*(a[sl] for a in d))
    tpart = simulate.CausalData(*(a[tsl] for a in test))
    dist = CausalForest(**KW).fit(part.X, part.t, part.y, comm=comm,
                                  clusters=None if labels is None else labels[sl])
    ref = CausalForest(**KW).fit(d.X, d.t, d.y, comm=SELF, clusters=labels)
    got = _analyses(dist, comm, part, tpart, None if test_labels is None else test_labels[tsl])
    want = _analyses(ref, SELF, d, test, test_labels)
    scores = col.allgatherv(comm, dist.dr_scores_)
    held = dist.dr_scores(tpart.X, tpart.t, tpart.y)
    np.testing.assert_allclose(scores, ref.dr_scores_, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(held, ref.dr_scores(tpart.X, tpart.t, tpart.y), rtol=1e-9, atol=1e-9)
    assert got.keys() == want.keys()
    for key in want:
        for a, b in zip(got[key], want[key]):
            np.testing.assert_allclose(a, b, rtol=1e-8, atol=1e-10, err_msg=str(key))

"""The instrumental splitting rule: compiled gains == vectorised gains == row-wise NumPy reference."""
import numpy as np
import pytest

from forest.analysis.inference import solve_theta
from forest.criteria.instrumental import InstrumentalCriterion, pseudo_outcomes_reference, split_gain_reference
from forest.engine.local_growth import grow_subtrees, grow_subtrees_reference

from subtree_tasks import random_tasks
from test_local_growth import _binned, _compare


def _rows(rng, n, binary_z=True):
    """Centred instrument, treatment, outcome and weights of ``n`` rows with a first stage."""
    z = (rng.random(n) < 0.5).astype(float) if binary_z else rng.normal(size=n)
    u = rng.normal(size=n)
    w = 0.8 * z + u + rng.normal(size=n)
    y = (1.0 + rng.normal(size=n) * 0.3) * w + 2.0 * u + rng.normal(size=n)
    return z - 0.5 if binary_z else z, w - w.mean(), y - y.mean(), rng.uniform(0.5, 2.0, n)


@pytest.mark.parametrize("precondition", [False, True])
@pytest.mark.parametrize("binary_z", [True, False])
def test_gain_equals_rowwise_reference(precondition, binary_z):
    """Without binding constraints the histogram gain is grf's score from per-row pseudo-outcomes."""
    rng = np.random.default_rng(1)
    crit = InstrumentalCriterion(min_samples_leaf=1, alpha=0.0, precondition=precondition)
    for _ in range(40):
        n = int(rng.integers(30, 120))
        z, w, y, g = _rows(rng, n, binary_z)
        ch = crit.make_channels(z, w, y, g)
        left = rng.random(n) < rng.uniform(0.2, 0.8)
        ref = split_gain_reference(z, w, y, g, left, precondition)
        got = float(crit.gain(ch[left].sum(0), ch[~left].sum(0), ch.sum(0)))
        if not np.isfinite(got):  # a side without rows of both instrument signs
            continue
        assert got == pytest.approx(ref, rel=1e-8)
    # the parent's pseudo-outcomes sum to zero: the score is already the improvement
    rho = pseudo_outcomes_reference(z, w, y, g, precondition)
    assert abs(g @ rho) < 1e-8 * np.abs(g * rho).sum()


def test_gain_uses_the_instrument_not_the_treatment():
    """A causal-forest-like score (W in place of Z) differs: the rule is the instrumental one."""
    rng = np.random.default_rng(2)
    z, w, y, g = _rows(rng, 200, binary_z=False)
    left = rng.random(200) < 0.5
    crit = InstrumentalCriterion(min_samples_leaf=1, alpha=0.0)
    ch = crit.make_channels(z, w, y, g)
    got = float(crit.gain(ch[left].sum(0), ch[~left].sum(0), ch.sum(0)))
    assert got == pytest.approx(split_gain_reference(z, w, y, g, left), rel=1e-8)
    assert got != pytest.approx(split_gain_reference(w, w, y, g, left), rel=1e-3)


@pytest.mark.parametrize("penalty,precondition", [(0.0, False), (0.5, False), (0.5, True)])
def test_compiled_gains_equal_vectorised_with_binding_constraints(penalty, precondition):
    """Every candidate of a scan: the compiled piece's gains are the vectorised ones, -inf included."""
    rng = np.random.default_rng(3)
    crit = InstrumentalCriterion(min_samples_leaf=6, alpha=0.1, imbalance_penalty=penalty,
                                 precondition=precondition)
    compiled = crit.compiled()
    n_inf = n_fin = 0
    for _ in range(30):
        n = int(rng.integers(10, 80))
        z, w, y, g = _rows(rng, n, binary_z=bool(rng.integers(2)))
        ch = crit.make_channels(z, w, y, g)[rng.permutation(n)]
        cum = np.cumsum(ch, axis=0)[:-1]
        parent = ch.sum(0)
        lefts, rights = cum, parent - cum
        vec = crit.gain(lefts, rights, parent)
        got = compiled.gains_of(lefts, rights, parent)
        np.testing.assert_array_equal(got, vec)   # the same scalar core on the same constants
        # the constraints, recounted from the rows
        for i in range(n - 1):
            sides = (ch[:i + 1], ch[i + 1:])
            counts_ok = all(len(s) >= 6 and s[:, 8].sum() >= 6 and len(s) - s[:, 8].sum() >= 6 for s in sides)
            spread = [s[:, 6].sum() - s[:, 1].sum() ** 2 / s[:, 0].sum() for s in sides]
            floor = 0.1 * (parent[6] - parent[1] ** 2 / parent[0])
            feasible = counts_ok and min(spread) >= floor and (penalty == 0 or min(spread) > 0)
            assert np.isfinite(vec[i]) == feasible
            n_inf += not feasible
            n_fin += feasible
    assert n_inf > 50 and n_fin > 50


def test_no_split_without_a_first_stage():
    rng = np.random.default_rng(4)
    crit = InstrumentalCriterion(min_samples_leaf=1, alpha=0.0)
    z = rng.normal(size=100)
    w = np.ones(100) * 2.0           # the instrument cannot move a constant treatment
    y = rng.normal(size=100)
    ch = crit.make_channels(z - z.mean(), w, y, np.ones(100))
    left = np.arange(100) < 50
    assert crit.gain(ch[left].sum(0), ch[~left].sum(0), ch.sum(0)) == -np.inf
    assert crit.compiled()(ch[left].sum(0), ch[~left].sum(0), ch.sum(0)) == -np.inf


def test_leaf_moments_give_the_weighted_wald_estimate():
    """node_value -> solve_theta is the weighted IV (Wald) estimate of the leaf's rows; negative first stages too."""
    rng = np.random.default_rng(5)
    crit = InstrumentalCriterion()
    for sign in (1.0, -1.0):
        z, w, y, g = _rows(rng, 300, binary_z=False)
        w = sign * w
        value = crit.node_value(crit.make_channels(z, w, y, g).sum(0))
        assert value[-1] == 300
        theta, _ = solve_theta(value[None], crit.layout)
        zc = z - (g @ z) / g.sum()
        wald = (g * zc) @ (y - (g @ y) / g.sum()) / ((g * zc) @ (w - (g @ w) / g.sum()))
        assert theta[0, 0, 0] == pytest.approx(wald, rel=1e-10)


@pytest.mark.parametrize("hist_rows", [None, 0, 30])
def test_grow_subtrees_instrumental_matches_reference(hist_rows):
    """The compiled subtree kernel with the instrumental pieces grows the reference's trees."""
    rng = np.random.default_rng(6)
    n_rows, n_features, missing_bin = 400, 3, 10
    binned = _binned(rng, n_rows, n_features, 8, missing_bin, 0.1)
    crit = InstrumentalCriterion(min_samples_leaf=4)
    z, w, y, g = _rows(rng, n_rows)
    y = y + binned[1] * w * 0.5        # an effect that varies with feature 1
    ch = crit.make_channels(z, w, y, g)
    rows, starts, tree, node, depth, nxt = random_tasks(rng, 2, n_rows, [150, 40])
    nb = np.full(n_features, 8)
    got = grow_subtrees(binned, ch, rows, starts, tree, node, depth, nxt, np.array([0, 1]), crit.compiled(),
                        missing_bin, min_samples_split=8.0, hist_rows=hist_rows)
    ref = grow_subtrees_reference(binned, ch, rows, starts, tree, node, depth, nxt, np.array([0, 1]), crit, nb,
                                  missing_bin, min_samples_split=8.0)
    assert len(got.ints) > 10
    _compare(got, ref, ch.shape[1])

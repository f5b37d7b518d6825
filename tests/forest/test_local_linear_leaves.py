"""forest.analysis.local_linear_leaves: local linear effects from per-leaf tables against the direct
weighted regression on the rows, the per-tree functional against finite differences, the value
nodes' sums against a walk of each subtree, and the huge-lambda limit (the causal forest's estimate)."""
import numpy as np
import pytest

from forest.analysis.local_linear import local_linear_causal_sums_reference
from forest.analysis.local_linear_leaves import (leaf_terms, local_linear_blb, local_linear_effect,
                                                 local_linear_reference, local_sums, table_width, tree_functional,
                                                 value_node_sums)


def _forest(rng, n=120, p=2, trees=6, leaves=5, queries=4):
    """Rows, random leaves per tree (every leaf holds rows), each query's leaf per tree, and the tables."""
    Z = rng.normal(size=(n, p))
    wc = rng.uniform(-0.5, 0.5, n)
    yc = rng.normal(size=n) + wc * (1 + Z[:, 0])
    g = rng.uniform(0.5, 2.0, n)
    leaf = np.array([rng.permutation(np.arange(n) % leaves) for _ in range(trees)])     # (trees, n)
    terms = leaf_terms(Z, wc, yc, g)
    means = np.array([[terms[leaf[b] == k].mean(axis=0) for k in range(leaves)] for b in range(trees)])
    qleaf = rng.integers(0, leaves, size=(queries, trees))
    tree_tables = means[np.arange(trees)[None, :], qleaf]                                # (queries, trees, width)
    alpha = np.array([np.mean([(leaf[b] == qleaf[q, b]) / (leaf[b] == qleaf[q, b]).sum() for b in range(trees)],
                              axis=0) for q in range(queries)])                           # grf's forest weights
    x = rng.normal(size=(queries, p)) * 0.5
    return Z, wc, yc, g, tree_tables, alpha, x


@pytest.mark.parametrize("weight_penalty", [False, True])
@pytest.mark.parametrize("ll_lambda", [0.0, 0.1, 3.0])
def test_tables_give_the_direct_weighted_regression(ll_lambda, weight_penalty):
    rng = np.random.default_rng(0)
    Z, wc, yc, g, tree_tables, alpha, x = _forest(rng)
    assert tree_tables.shape[2] == table_width(2) == 6 * 7 // 2 + 6
    M, b = local_sums(tree_tables.mean(axis=1), x)
    M_ref, b_ref = local_linear_causal_sums_reference(alpha * g, Z, wc, yc[:, None], x)
    np.testing.assert_allclose(M, M_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b, b_ref, rtol=1e-10, atol=1e-12)
    got = local_linear_effect(tree_tables.mean(axis=1), x, ll_lambda, weight_penalty)
    want = [local_linear_reference(alpha[q], Z, wc, yc, g, x[q], ll_lambda, weight_penalty) for q in range(len(x))]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9)
    tau, _ = tree_functional(tree_tables.mean(axis=1), x, ll_lambda, weight_penalty)
    np.testing.assert_allclose(tau, got, rtol=0, atol=1e-12)


@pytest.mark.parametrize("weight_penalty", [False, True])
def test_tree_functional_is_the_derivative_of_the_estimate(weight_penalty):
    rng = np.random.default_rng(1)
    _, _, _, _, tree_tables, _, x = _forest(rng)
    mean = tree_tables.mean(axis=1)
    tau, ell = tree_functional(mean, x, 0.3, weight_penalty)
    np.testing.assert_allclose(np.einsum("nw,nw->n", mean, ell), 0.0, atol=1e-10)     # the normal equations
    step = 1e-6
    for k in rng.choice(mean.shape[1], 12, replace=False):
        bumped = mean.copy()
        bumped[:, k] += step * (1 + np.abs(mean[:, k]))
        numeric = (local_linear_effect(bumped, x, 0.3, weight_penalty) - tau) / (bumped[:, k] - mean[:, k])
        np.testing.assert_allclose(numeric, ell[:, k], rtol=1e-4, atol=1e-5)


def test_huge_lambda_is_the_regression_on_the_treatment_alone():
    # every slope penalised away: the forest-weighted regression of Y~ on [1, W~] (the causal forest's
    # locally centred estimate), whose per-tree deviation is its own linearisation
    rng = np.random.default_rng(2)
    Z, wc, yc, g, tree_tables, alpha, x = _forest(rng)
    tau, var = local_linear_blb(tree_tables, x, 1e12, False, 2)
    a = alpha * g
    for q in range(len(x)):
        w_bar, y_bar = a[q] @ wc / a[q].sum(), a[q] @ yc / a[q].sum()
        want = (a[q] @ ((wc - w_bar) * (yc - y_bar))) / (a[q] @ (wc - w_bar) ** 2)
        assert abs(tau[q] - want) < 1e-9
    assert np.all(var >= 0) and np.all(np.isfinite(var))


def test_singular_queries_are_nan():
    rng = np.random.default_rng(3)
    _, _, _, _, tree_tables, _, x = _forest(rng)
    tree_tables[0] = 0.0
    tau, var = local_linear_blb(tree_tables, x, 0.1, False, 2)
    assert np.isnan(tau[0]) and np.isnan(var[0]) and np.isfinite(tau[1:]).all()


def test_value_node_sums_follow_filled_leaves():
    # tree 0: 0 -> (1, 2), 2 -> (3, 4), leaf 4 empty (took node 2's count); tree 1: a single leaf
    feature = np.array([0, -1, 1, -1, -1, -1])
    left = np.array([1, -1, 3, -1, -1, -1])
    right = np.array([2, -1, 4, -1, -1, -1])
    count = np.array([9.0, 4.0, 5.0, 5.0, 5.0, 7.0])
    packed = dict(feature=feature, left=left, right=right, tree_offsets=np.array([0, 5, 6]),
                  value=np.column_stack([np.zeros(6), count]))
    sums = np.zeros((6, 2))
    sums[[1, 3, 5]] = [[1.0, 4.0], [2.0, 5.0], [3.0, 7.0]]
    got = value_node_sums(packed, sums, 1)
    np.testing.assert_array_equal(got[[1, 3, 4, 5]], [[1, 4], [2, 5], [2, 5], [3, 7]])
    np.testing.assert_array_equal(got[0], [3, 9])

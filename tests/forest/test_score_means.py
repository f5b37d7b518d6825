import numpy as np

from forest.analysis.score_means import average_effect, average_effect_sums


def test_unit_weights_give_mean_and_classical_stderr():
    rng = np.random.default_rng(0)
    s = rng.normal(2.0, 3.0, size=500)
    est, se = average_effect(average_effect_sums(s))
    assert np.isclose(est, s.mean())
    assert np.isclose(se, s.std(ddof=1) / np.sqrt(len(s)))


def test_sums_add_across_row_blocks_and_weights_scale_free():
    rng = np.random.default_rng(1)
    s = rng.normal(size=(300, 3))
    g = rng.uniform(0.5, 2.0, size=300)
    whole = average_effect(average_effect_sums(s, g))
    parts = average_effect_sums(s[:100], g[:100]) + average_effect_sums(s[100:], g[100:])
    split = average_effect(parts)
    scaled = average_effect(average_effect_sums(s, 7.0 * g))
    for a, b, c in zip(whole, split, scaled):
        assert np.allclose(a, b) and np.allclose(a, c)
    assert np.allclose(whole[0], (g[:, None] * s).sum(0) / g.sum())

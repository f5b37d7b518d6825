"""Simulated causal-forest rows shared by the criterion and growth tests."""
import numpy as np


def causal_rows(rng, n, K, M, kind, p_arm=None):
    """Centered treatment ``(n, K)``, outcome ``(n, M)``, weights ``(n,)`` and constraint indicators ``(n, K)``.

    ``kind`` "arms": a categorical treatment with ``K`` arms besides control (arm
    probabilities ``p_arm``); "sign": a continuous ``K``-vector.
    """
    if kind == "arms":
        arm = rng.choice(K + 1, size=n, p=p_arm)
        W = np.zeros((n, K))
        W[arm > 0, arm[arm > 0] - 1] = 1.0
        wc = W - rng.uniform(0.15, 0.35, size=(n, K))
        ind = W
    else:
        wc = rng.normal(size=(n, K)) + 0.2
        ind = (wc > 0).astype(float)
    y = rng.normal(size=(n, M)) + wc @ rng.uniform(0.5, 2.0, size=(K, M)) + 3.0
    return wc, y, rng.uniform(0.5, 2.0, size=n), ind

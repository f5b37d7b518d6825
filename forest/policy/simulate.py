"""Known-answer designs for policy learning and budgeted targeting (tests and benchmarks).

This module owns the simulated data sets whose best policy is known, so that tests
and ``benchmarks/bench_policy.py`` measure the same thing:

* :func:`xor_design`: the best action depends on the *interaction* of two features,
  and every single split leaves each action's mean reward unchanged on both sides,
  so a greedy tree (best split first) has nothing to go on at the root, while an
  exact depth-2 search finds the optimum.
* :func:`budget_design`: several arms with heterogeneous effects and per-unit costs,
  for allocation under a budget.
"""
import numpy as np


class PolicyData:
    """A simulated policy-learning sample.

    Attributes
    ----------
    X : ndarray, shape (n, d)
    mu : ndarray, shape (n, A)
        True mean reward of each action.
    rewards : ndarray, shape (n, A)
        ``mu`` plus noise (what a doubly robust score gives: unbiased, noisy).
    best_value : float
        Mean of ``max_a mu`` over the sample: the value of the best policy.
    """

    def __init__(self, X, mu, rewards):
        self.X, self.mu, self.rewards = X, mu, rewards
        self.best_value = float(mu.max(axis=1).mean())

    def policy_value(self, actions):
        """True mean reward of giving row ``i`` action ``actions[i]``."""
        return float(self.mu[np.arange(len(self.mu)), np.asarray(actions)].mean())


def xor_design(n, d=5, n_actions=3, noise=1.0, seed=0):
    """Action 1 pays +1 where ``(x0 > 0) == (x1 > 0)`` and -1 elsewhere; action 2 pays 0.3.

    ``X`` is uniform on ``[-1, 1]^d``; action 0 pays 0 and any further actions pay
    ``0.3 - 0.1 k``. A depth-2 tree splitting at ``x0 = 0`` and ``x1 = 0`` reaches the
    best value ``0.65``; any single split leaves action 1's mean at 0 on both sides,
    so the best depth-1 tree is "action 2 for everyone" (value 0.3).

    Parameters
    ----------
    n, d : int
        Rows and features (``d >= 2``; features 2.. are noise).
    n_actions : int
        At least 3.
    noise : float
        Standard deviation of the reward noise.
    seed : int

    Returns
    -------
    PolicyData
    """
    if d < 2 or n_actions < 3:
        raise ValueError("xor_design needs d >= 2 and n_actions >= 3")
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1.0, 1.0, size=(n, d))
    mu = np.zeros((n, n_actions))
    mu[:, 1] = np.where((X[:, 0] > 0) == (X[:, 1] > 0), 1.0, -1.0)
    for k in range(2, n_actions):
        mu[:, k] = 0.3 - 0.1 * (k - 2)
    return PolicyData(X, mu, mu + noise * rng.normal(size=mu.shape))


def budget_design(n, n_arms=3, d=4, noise=1.0, seed=0):
    """Arms with heterogeneous effects and per-unit costs (for allocation tests).

    For arm ``k = 1..n_arms`` and ``x ~ U[0, 1]^d``: effect
    ``tau_k(x) = k * max(x_{(k-1) mod d} - 0.3, 0)`` and cost
    ``c_k(x) = k * (0.5 + x_{d-1})``; control costs nothing.

    Returns
    -------
    X : ndarray, shape (n, d)
    tau : ndarray, shape (n, n_arms)
        True effects of each arm against control.
    costs : ndarray, shape (n, n_arms)
    scores : ndarray, shape (n, n_arms)
        ``tau`` plus noise: stand-ins for held-out doubly robust scores.
    """
    rng = np.random.default_rng(seed)
    X = rng.uniform(0.0, 1.0, size=(n, d))
    k = np.arange(1, n_arms + 1)
    tau = k * np.maximum(X[:, (k - 1) % d] - 0.3, 0.0)
    costs = k * (0.5 + X[:, [d - 1]])
    return X, tau, costs, tau + noise * rng.normal(size=tau.shape)

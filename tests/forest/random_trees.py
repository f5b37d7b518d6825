"""Random trees for predictor tests (imported by name: pytest puts this folder on sys.path)."""
from forest.engine.tree import Tree


def random_tree(rng, n_features, n_outputs, thresholds, depth=4, p_stop=0.2):
    """A random tree whose float thresholds are drawn from ``thresholds[f]`` or +inf.

    ``thresholds[f]`` being bin edges, bin threshold ``b`` of a split is the index of
    its float threshold (``len(thresholds[f])`` for +inf), as the growers store them.
    Each frontier node stops as a leaf with probability ``p_stop``; ``missing_left``
    is a coin flip.
    """
    t = Tree(n_outputs)
    t.add_node(0, 1.0, rng.normal(size=n_outputs))
    frontier = [0]
    for d in range(depth):
        nxt = []
        for node in frontier:
            if rng.random() < p_stop:
                continue
            f = int(rng.integers(n_features))
            b = int(rng.integers(len(thresholds[f]) + 1))
            thr = thresholds[f][b] if b < len(thresholds[f]) else float("inf")
            left = t.add_node(d + 1, 1.0, rng.normal(size=n_outputs))
            right = t.add_node(d + 1, 1.0, rng.normal(size=n_outputs))
            t.set_split(node, f, b, thr, bool(rng.random() < 0.5), 1.0, left, right)
            nxt += [left, right]
        frontier = nxt
    return t

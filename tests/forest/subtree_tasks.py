"""Random subtree-growth tasks for the tests of ``forest.engine.local_growth.grow_subtrees``."""
import numpy as np


def random_tasks(rng, n_trees, n_rows, sizes, random_depth=True):
    """Per tree, one task per size: a random subset of rows (ascending) rooted at node ``j``.

    Parameters
    ----------
    rng : numpy.random.Generator
    n_trees, n_rows : int
    sizes : sequence of int
        Rows of each task of a tree.
    random_depth : bool, default True
        Each task's root depth drawn from 0-2; else 0 (and no draw).

    Returns
    -------
    tuple
        ``(rows, task_starts, task_tree, task_node, task_depth, tree_next)`` as ``grow_subtrees``
        takes them (``tree_next``: ``len(sizes)`` for every tree).
    """
    rows, starts, tree, node, depth = [], [0], [], [], []
    for t in range(n_trees):
        for j, m in enumerate(sizes):
            rows.append(np.sort(rng.choice(n_rows, size=m, replace=False)))
            starts.append(starts[-1] + m)
            tree.append(t)
            node.append(j)
            depth.append(int(rng.integers(0, 3)) if random_depth else 0)
    return (np.concatenate(rows), np.array(starts), np.array(tree), np.array(node), np.array(depth),
            np.full(n_trees, len(sizes)))

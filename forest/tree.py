"""Flat-array decision trees and the packed-forest layout.

This module owns the *representation* of a fitted tree, shared by every model in
``forest`` (gradient boosting, regression forests, causal forests). A tree is a set
of parallel per-node arrays; node 0 is the root and a node is a leaf when its
``feature`` is ``-1``.

innerNode fields (meaningful where ``feature >= 0``)
    ``feature`` (int32), ``bin_threshold`` (int32: binned value ``<= b`` goes left),
    ``threshold`` (float64: raw ``x <= t`` goes left), ``missing_left`` (uint8: NaN /
    the missing bin goes left), ``left`` / ``right`` (int32 child node ids), ``gain``
    (float64, the criterion's improvement of the split).
Fields of every node
    ``weight`` (float64: the criterion's weight/count/hessian mass of the training rows
    that reached the node, summed over all ranks), ``count`` (float64: number of
    training rows, when the grower knows it, else equal to ``weight``), ``impurity``
    (float64: the criterion's objective value of the node), ``depth`` (int32, root 0)
    and ``value`` (float64, shape ``(n_nodes, n_outputs)``: the leafNode output vector;
    inner nodes hold the value they would have as leaves, which staged/partial
    prediction and importance reports can use).

``Tree`` keeps its state as a dict of numpy arrays plus python scalars, so the model
file code can store it without pickle (``to_arrays`` / ``from_arrays``).

A *packed forest* (:func:`pack_trees`) concatenates the node arrays of many trees,
rewrites child ids to packed (global) ids and records ``tree_offsets``; the
predictor and model files work on that layout.
"""
import numpy as np

#: Per-node arrays and their dtypes (``value`` is 2-D and handled separately).
NODE_FIELDS = {
    "feature": np.int32,
    "bin_threshold": np.int32,
    "threshold": np.float64,
    "missing_left": np.uint8,
    "left": np.int32,
    "right": np.int32,
    "gain": np.float64,
    "weight": np.float64,
    "count": np.float64,
    "impurity": np.float64,
    "depth": np.int32,
}

LEAF = -1


class Tree:
    """One decision tree stored as flat per-node arrays.

    Parameters
    ----------
    n_outputs : int
        Length of each node's output vector.
    capacity : int, default 16
        Initial number of node slots; the arrays grow by doubling.

    Attributes
    ----------
    node_count : int
        Number of nodes in use.
    n_outputs : int
    feature, bin_threshold, threshold, missing_left, left, right, gain, weight,
    count, impurity, depth : ndarray, shape (node_count,)
        See the module docstring.
    value : ndarray of float64, shape (node_count, n_outputs)
    """

    def __init__(self, n_outputs, capacity=16):
        self.n_outputs = int(n_outputs)
        self.node_count = 0
        self._capacity = max(int(capacity), 1)
        self._arrays = {name: np.zeros(self._capacity, dtype=dt) for name, dt in NODE_FIELDS.items()}
        self._value = np.zeros((self._capacity, self.n_outputs), dtype=np.float64)

    # ------------------------------------------------------------------ building
    def _grow(self, needed):
        if needed <= self._capacity:
            return
        cap = self._capacity
        while cap < needed:
            cap *= 2
        for name, arr in self._arrays.items():
            new = np.zeros(cap, dtype=arr.dtype)
            new[: self.node_count] = arr[: self.node_count]
            self._arrays[name] = new
        newv = np.zeros((cap, self.n_outputs), dtype=np.float64)
        newv[: self.node_count] = self._value[: self.node_count]
        self._value = newv
        self._capacity = cap

    def add_node(self, depth, weight, value, impurity=0.0, count=None):
        """Append a leaf node and return its id.

        Parameters
        ----------
        depth : int
        weight : float
            Weight/hessian mass of the node (all ranks).
        value : array-like, shape (n_outputs,)
        impurity : float
        count : float, optional
            Row count; defaults to ``weight``.

        Returns
        -------
        int
            The new node id.
        """
        return self.append_leaves(np.array([weight], dtype=np.float64),
                                  np.array([weight if count is None else count], dtype=np.float64),
                                  np.asarray(value, dtype=np.float64).reshape(1, self.n_outputs),
                                  np.array([impurity], dtype=np.float64), np.array([depth]))

    def append_leaves(self, weight, count, value, impurity, depth):
        """Append ``k`` leaves at once (vectorised :meth:`add_node`).

        Parameters
        ----------
        weight, count, impurity : ndarray of float64, shape (k,)
        value : ndarray of float64, shape (k, n_outputs)
        depth : ndarray of int, shape (k,)

        Returns
        -------
        int
            Id of the first new leaf; the others follow in order.
        """
        k = len(weight)
        first = self.node_count
        self._grow(first + k)
        new = slice(first, first + k)
        a = self._arrays
        a["feature"][new] = LEAF
        a["bin_threshold"][new] = 0
        a["threshold"][new] = np.nan
        a["missing_left"][new] = 0
        a["left"][new] = LEAF
        a["right"][new] = LEAF
        a["gain"][new] = 0.0
        a["weight"][new] = weight
        a["count"][new] = count
        a["impurity"][new] = impurity
        a["depth"][new] = depth
        self._value[new] = value
        self.node_count = first + k
        return first

    def set_splits(self, nodes, features, bin_thresholds, thresholds, missing_left, gains, left):
        """Vectorised :meth:`set_split` for children stored in pairs (right = left + 1).

        Parameters
        ----------
        nodes, features, bin_thresholds, left : ndarray of int, shape (m,)
        thresholds, gains : ndarray of float64, shape (m,)
        missing_left : ndarray of bool or uint8, shape (m,)
        """
        a = self._arrays
        a["feature"][nodes] = features
        a["bin_threshold"][nodes] = bin_thresholds
        a["threshold"][nodes] = thresholds
        a["missing_left"][nodes] = missing_left
        a["gain"][nodes] = gains
        a["left"][nodes] = left
        a["right"][nodes] = np.asarray(left) + 1

    def set_count(self, node, count):
        """Overwrite the row count of ``node`` (known only once a sibling is reduced)."""
        self._arrays["count"][node] = count

    def set_split(self, node, feature, bin_threshold, threshold, missing_left, gain, left, right):
        """Turn leaf ``node`` into an innerNode pointing at ``left`` / ``right``."""
        a = self._arrays
        a["feature"][node] = feature
        a["bin_threshold"][node] = bin_threshold
        a["threshold"][node] = threshold
        a["missing_left"][node] = 1 if missing_left else 0
        a["gain"][node] = gain
        a["left"][node] = left
        a["right"][node] = right

    def split_nodes(self, nodes, features, bin_thresholds, thresholds, missing_left, gains, depth, weights,
                    counts, impurities, values):
        """Split several leaves at once, appending children ``(l_0, r_0, l_1, r_1, ...)``.

        Parameters
        ----------
        nodes : ndarray of int, shape (m,)
            Leaves to split.
        features, bin_thresholds : ndarray of int, shape (m,)
        thresholds : ndarray of float64, shape (m,)
        missing_left : ndarray of bool, shape (m,)
        gains : ndarray of float64, shape (m,)
        depth : int
            Depth of the new children.
        weights, counts, impurities : ndarray of float64, shape (m, 2)
            Per split, the (left, right) children's fields.
        values : ndarray of float64, shape (m, 2, n_outputs)

        Returns
        -------
        left, right : ndarray of int64, shape (m,)
        """
        m = len(nodes)
        first = self.append_leaves(np.asarray(weights, dtype=np.float64).reshape(-1),
                                   np.asarray(counts, dtype=np.float64).reshape(-1),
                                   np.asarray(values, dtype=np.float64).reshape(2 * m, self.n_outputs),
                                   np.asarray(impurities, dtype=np.float64).reshape(-1), depth)
        left = first + 2 * np.arange(m, dtype=np.int64)
        right = left + 1
        self.set_splits(np.asarray(nodes, dtype=np.int64), features, bin_thresholds, thresholds,
                        np.asarray(missing_left, dtype=bool), gains, left)
        return left, right

    # ------------------------------------------------------------------ access
    def __getattr__(self, name):
        # Only reached for attributes not found normally: expose trimmed node arrays.
        arrays = self.__dict__.get("_arrays")
        if arrays is not None and name in arrays:
            return arrays[name][: self.node_count]
        raise AttributeError(name)

    @property
    def value(self):
        return self._value[: self.node_count]

    @value.setter
    def value(self, new):
        new = np.asarray(new, dtype=np.float64)
        if new.ndim != 2 or new.shape[0] != self.node_count:
            raise ValueError(f"value must have shape (node_count={self.node_count}, n_outputs), got {new.shape}")
        self.n_outputs = new.shape[1]
        self._value = np.array(new, dtype=np.float64, copy=True)
        self._capacity = max(self._capacity, self.node_count)
        for name, arr in self._arrays.items():
            self._arrays[name] = arr[: self.node_count].copy()
        self._capacity = self.node_count

    @property
    def is_leaf(self):
        """ndarray of bool, shape (node_count,)."""
        return self.feature < 0

    @property
    def n_leaves(self):
        return int(np.count_nonzero(self.is_leaf))

    @property
    def max_depth(self):
        return int(self.depth.max()) if self.node_count else 0

    # ------------------------------------------------------------------ state
    def to_arrays(self):
        """State as a dict of numpy arrays (trimmed copies) and python scalars.

        Returns
        -------
        dict
            Keys: every name of ``NODE_FIELDS``, ``"value"`` (node_count, n_outputs),
            ``"n_outputs"`` (int).
        """
        state = {name: arr[: self.node_count].copy() for name, arr in self._arrays.items()}
        state["value"] = self._value[: self.node_count].copy()
        state["n_outputs"] = int(self.n_outputs)
        return state

    @classmethod
    def from_arrays(cls, state):
        """Rebuild a tree from :meth:`to_arrays` output.

        Raises
        ------
        ValueError
            If a field is missing or the lengths disagree.
        """
        missing = [k for k in list(NODE_FIELDS) + ["value"] if k not in state]
        if missing:
            raise ValueError(f"tree state lacks fields {missing}")
        value = np.asarray(state["value"], dtype=np.float64)
        if value.ndim != 2:
            raise ValueError(f"tree value must be 2-D, got shape {value.shape}")
        n = value.shape[0]
        tree = cls(value.shape[1], capacity=max(n, 1))
        for name, dt in NODE_FIELDS.items():
            arr = np.asarray(state[name], dtype=dt)
            if arr.shape != (n,):
                raise ValueError(f"tree field {name!r} has shape {arr.shape}, expected ({n},)")
            tree._arrays[name][:n] = arr
        tree._value[:n] = value
        tree.node_count = n
        return tree

    def __getstate__(self):
        return self.to_arrays()

    def __setstate__(self, state):
        other = Tree.from_arrays(state)
        self.__dict__.update(other.__dict__)

    def __eq__(self, other):
        if not isinstance(other, Tree):
            return NotImplemented
        a, b = self.to_arrays(), other.to_arrays()
        return all(np.array_equal(a[k], b[k], equal_nan=(np.asarray(a[k]).dtype.kind == "f"))
                   if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a)

    __hash__ = None

    def structure(self):
        """The split structure (what must agree across rank counts).

        Returns
        -------
        tuple of ndarray
            ``(feature, bin_threshold, missing_left, left, right)``.
        """
        return (self.feature.copy(), self.bin_threshold.copy(), self.missing_left.copy(),
                self.left.copy(), self.right.copy())

    def __repr__(self):
        return f"Tree(node_count={self.node_count}, n_leaves={self.n_leaves}, n_outputs={self.n_outputs})"


def pack_trees(trees):
    """Concatenate trees into the packed-forest layout.

    Parameters
    ----------
    trees : sequence of Tree
        All trees must have the same ``n_outputs``.

    Returns
    -------
    dict
        Every field of ``NODE_FIELDS`` concatenated (shape ``(n_total_nodes,)``), with
        ``left`` / ``right`` rewritten to packed ids (``-1`` stays for leaves);
        ``"value"`` of shape ``(n_total_nodes, n_outputs)``; ``"tree_offsets"`` int64
        of shape ``(n_trees + 1,)`` (tree ``t`` owns packed nodes
        ``tree_offsets[t]:tree_offsets[t+1]``, its root is ``tree_offsets[t]``).
    """
    trees = list(trees)
    if not trees:
        raise ValueError("pack_trees needs at least one tree")
    n_outputs = {t.n_outputs for t in trees}
    if len(n_outputs) != 1:
        raise ValueError(f"trees disagree on n_outputs: {sorted(n_outputs)}")
    sizes = np.array([t.node_count for t in trees], dtype=np.int64)
    offsets = np.zeros(len(trees) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    packed = {}
    for name, dt in NODE_FIELDS.items():
        packed[name] = np.concatenate([getattr(t, name) for t in trees]).astype(dt, copy=False)
    for name in ("left", "right"):
        shift = np.repeat(offsets[:-1], sizes).astype(np.int32)
        child = packed[name]
        packed[name] = np.where(child >= 0, child + shift, child).astype(np.int32)
    packed["value"] = np.ascontiguousarray(np.concatenate([t.value for t in trees], axis=0))
    packed["tree_offsets"] = offsets
    return packed


def unpack_trees(packed):
    """Inverse of :func:`pack_trees`.

    Returns
    -------
    list of Tree
    """
    offsets = np.asarray(packed["tree_offsets"], dtype=np.int64)
    trees = []
    for t in range(len(offsets) - 1):
        lo, hi = int(offsets[t]), int(offsets[t + 1])
        state = {name: np.asarray(packed[name][lo:hi]) for name in NODE_FIELDS}
        for name in ("left", "right"):
            c = state[name].astype(np.int64)
            state[name] = np.where(c >= 0, c - lo, c).astype(np.int32)
        state["value"] = np.asarray(packed["value"][lo:hi])
        trees.append(Tree.from_arrays(state))
    return trees

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
Categorical splits (issue 32)
    A split on a categorical feature sends a *set* of categories left: its
    ``bin_threshold`` is :data:`CATEGORICAL_SPLIT` (-1), its raw ``threshold`` is NaN
    and ``cat_bits[node]`` (uint64, ``W`` words) holds the set as a bitset
    over the feature's value bins (bin ``b`` left when bit ``b % 64`` of word
    ``b // 64`` is set); the missing bin goes by ``missing_left`` as elsewhere. A
    categorical feature's value bin is its category code (:mod:`histogram.categories`),
    so the raw and binned walks test the same bit. A forest without categorical
    splits keeps ``cat_bits`` of width 0 (no memory, no model-file bytes). The width
    ``W`` is one per model: :data:`CAT_WORDS` (4 words, 256 bits) for bin axes of up to
    256 bins, more for wide categorical codes (:func:`cat_words`: enough words for the
    widest column, at most :data:`MAX_CAT_WORDS`); the model file stores it as the
    array's shape, and loading checks it.

``Tree`` keeps its state as a dict of numpy arrays plus python scalars, so the model
file code can store it without pickle (``to_arrays`` / ``from_arrays``).

A *packed forest* (:func:`pack_trees`) concatenates the node arrays of many trees,
rewrites child ids to packed (global) ids and records ``tree_offsets``; the
predictor and model files work on that layout.

Structure invariants (:func:`validate_packed`, :meth:`Tree.validate_state`; model files
are checked against them on load, because the prediction kernels trust them: a child
id out of range reads outside the arrays, a child pointing back up loops forever)
    every array has its ``NODE_FIELDS`` dtype and one entry per node; a leaf has
    ``feature == left == right == -1``; an innerNode's children lie after it and inside
    its own tree, every node but a root has exactly one parent (so each tree is a tree
    rooted at its first node, and every walk ends at a leaf within ``depth`` steps);
    ``depth`` counts edges from the root; ``missing_left`` is 0 or 1; an innerNode's
    ``bin_threshold`` is a value bin of its feature and its raw ``threshold`` is that
    bin's upper edge (``+inf`` for the last value bin, the split "missing vs not"), so
    raw and binned routing agree; a categorical split's bitset is a non-empty set of
    value bins of its feature that leaves at least one value bin or the missing bin
    right; node values are finite.
"""
import numpy as np

from histogram.dtypes import MAX_CATEGORY_CODES

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

#: ``bin_threshold`` of a categorical split (its category set is in ``cat_bits``).
CATEGORICAL_SPLIT = -1

#: uint64 words of a categorical split's bitset for a bin axis of up to 256 bins (255
#: value bins, uint8 codes, the missing bin being the 256th): the width of every model
#: without wide categorical codes, and the least width a model's bitsets have.
CAT_WORDS = 4

#: Most words a bitset may have: one bit per value bin of the widest categorical column
#: with wide codes (:data:`histogram.dtypes.MAX_CATEGORY_CODES`).
MAX_CAT_WORDS = (MAX_CATEGORY_CODES + 63) // 64


def cat_words(missing_bin):
    """Bitset words of a model whose bin axis has ``missing_bin`` value-bin slots.

    :data:`CAT_WORDS` up to 256 (uint8 codes), else one bit per value bin below the
    missing bin (wide categorical codes).
    """
    return max(CAT_WORDS, -(-int(missing_bin) // 64))

#: Fields a packed forest holds besides ``NODE_FIELDS`` (``value`` float64 2-D,
#: ``tree_offsets`` int64 1-D).
PACKED_EXTRA = {"value": np.float64, "tree_offsets": np.int64}

#: Optional packed field: ``cat_bits`` uint64 ``(n_nodes, W)``, ``CAT_WORDS <= W <=
#: MAX_CAT_WORDS`` (files written before categorical features lack it and read as width 0).
CAT_BITS_DTYPE = np.uint64


def cat_bitset(bins, n_words=CAT_WORDS):
    """Bitset (uint64, ``(n_words,)``) of a set of value bins.

    Parameters
    ----------
    bins : array-like of int, shape (k,)
    n_words : int

    Returns
    -------
    ndarray of uint64, shape (n_words,)
    """
    out = np.zeros(n_words, dtype=np.uint64)
    for b in np.asarray(bins, dtype=np.int64).ravel():
        out[b >> 6] |= np.uint64(1) << np.uint64(b & 63)
    return out


def bitset_bins(bits):
    """Inverse of :func:`cat_bitset`: sorted value bins of a bitset ``(n_words,)``."""
    bits = np.asarray(bits, dtype=np.uint64)
    out = [w * 64 + j for w in range(bits.shape[0]) for j in range(64) if (int(bits[w]) >> j) & 1]
    return np.asarray(out, dtype=np.int64)


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

    def __init__(self, n_outputs, capacity=16, n_cat_words=0):
        self.n_outputs = int(n_outputs)
        self.node_count = 0
        self._capacity = max(int(capacity), 1)
        self._arrays = {name: np.zeros(self._capacity, dtype=dt) for name, dt in NODE_FIELDS.items()}
        self._value = np.zeros((self._capacity, self.n_outputs), dtype=np.float64)
        self._cat_bits = np.zeros((self._capacity, int(n_cat_words)), dtype=CAT_BITS_DTYPE)

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
        newb = np.zeros((cap, self._cat_bits.shape[1]), dtype=CAT_BITS_DTYPE)
        newb[: self.node_count] = self._cat_bits[: self.node_count]
        self._cat_bits = newb
        self._capacity = cap

    def _widen_cat_bits(self, width=CAT_WORDS):
        """Give the tree bitset room (``width`` words per node, at least ``CAT_WORDS``) at its
        first categorical split."""
        width = max(int(width), CAT_WORDS)
        if self._cat_bits.shape[1] >= width:
            return
        new = np.zeros((self._capacity, width), dtype=CAT_BITS_DTYPE)
        new[:, :self._cat_bits.shape[1]] = self._cat_bits
        self._cat_bits = new

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
        self._cat_bits[new] = 0
        self.node_count = first + k
        return first

    def set_splits(self, nodes, features, bin_thresholds, thresholds, missing_left, gains, left, cat_bits=None):
        """Vectorised :meth:`set_split` for children stored in pairs (right = left + 1).

        Parameters
        ----------
        nodes, features, bin_thresholds, left : ndarray of int, shape (m,)
        thresholds, gains : ndarray of float64, shape (m,)
        missing_left : ndarray of bool or uint8, shape (m,)
        cat_bits : ndarray of uint64, shape (m, W), optional
            Bitsets of the categorical splits (rows of numeric splits are ignored);
            ``W`` the model's width (:func:`cat_words`).
        """
        if cat_bits is not None:
            cats = np.asarray(bin_thresholds) == CATEGORICAL_SPLIT
            if cats.any():
                cat_bits = np.asarray(cat_bits, dtype=CAT_BITS_DTYPE)
                self._widen_cat_bits(cat_bits.shape[1])
                self._cat_bits[np.asarray(nodes)[cats], :cat_bits.shape[1]] = cat_bits[cats]
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

    def set_summaries(self, weight, value, impurity):
        """Overwrite every node's weight, value and impurity (a refit from other sums).

        Parameters
        ----------
        weight, impurity : ndarray of float64, shape (node_count,)
        value : ndarray of float64, shape (node_count, n_outputs)
        """
        n = self.node_count
        self._arrays["weight"][:n] = weight
        self._arrays["impurity"][:n] = impurity
        self._value[:n] = np.asarray(value, dtype=np.float64).reshape(n, self.n_outputs)

    def set_split(self, node, feature, bin_threshold, threshold, missing_left, gain, left, right, cat_bits=None):
        """Turn leaf ``node`` into an innerNode pointing at ``left`` / ``right``.

        ``cat_bits`` (uint64, ``(W,)``): the category set of a categorical split
        (``bin_threshold == CATEGORICAL_SPLIT``, ``threshold`` NaN).
        """
        if bin_threshold == CATEGORICAL_SPLIT:
            cat_bits = np.asarray(cat_bits, dtype=CAT_BITS_DTYPE)
            self._widen_cat_bits(cat_bits.shape[0])
            self._cat_bits[node, :cat_bits.shape[0]] = cat_bits
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

    @property
    def cat_bits(self):
        """ndarray of uint64, shape (node_count, 0 or W): categorical splits' bitsets."""
        return self._cat_bits[: self.node_count]

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
        self._cat_bits = self._cat_bits[: self.node_count].copy()
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
            ``"n_outputs"`` (int), and ``"cat_bits"`` (node_count, W) when the
            tree has categorical splits.
        """
        state = {name: arr[: self.node_count].copy() for name, arr in self._arrays.items()}
        state["value"] = self._value[: self.node_count].copy()
        state["n_outputs"] = int(self.n_outputs)
        if self._cat_bits.shape[1]:
            state["cat_bits"] = self._cat_bits[: self.node_count].copy()
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
        bits = state.get("cat_bits")
        if bits is not None and np.asarray(bits).size:
            bits = np.asarray(bits, dtype=CAT_BITS_DTYPE)
            if bits.ndim != 2 or bits.shape[0] != n or not CAT_WORDS <= bits.shape[1] <= MAX_CAT_WORDS:
                raise ValueError(f"tree field 'cat_bits' has shape {bits.shape}, expected ({n}, W) with "
                                 f"{CAT_WORDS} <= W <= {MAX_CAT_WORDS} words")
            tree._widen_cat_bits(bits.shape[1])
            tree._cat_bits[:n] = bits
        tree.node_count = n
        return tree

    @classmethod
    def validate_state(cls, state, n_features=None, bin_thresholds=None):
        """Check a :meth:`to_arrays` state (e.g. read from a model file) before use.

        Parameters
        ----------
        state : dict
            Any content: dtypes are checked exactly, not cast.
        n_features, bin_thresholds : optional
            As in :func:`validate_packed`.

        Raises
        ------
        ValueError
            Naming the first violated structure invariant (module docstring).
        """
        if not isinstance(state, dict):
            raise ValueError(f"tree state must be a mapping, got {type(state).__name__}")
        missing = [k for k in list(NODE_FIELDS) + ["value", "n_outputs"] if k not in state]
        if missing:
            raise ValueError(f"tree state lacks fields {missing}")
        n_outputs, value = state["n_outputs"], state["value"]
        if not _is_int(n_outputs) or n_outputs < 1:
            raise ValueError(f"tree n_outputs must be an int >= 1, got {n_outputs!r}")
        if isinstance(value, np.ndarray) and value.ndim == 2 and value.shape[1] != n_outputs:
            raise ValueError(f"tree value has {value.shape[1]} columns but n_outputs is {n_outputs}")
        n = len(state["feature"]) if isinstance(state["feature"], np.ndarray) and state["feature"].ndim == 1 else 0
        packed = {name: state[name] for name in list(NODE_FIELDS) + ["value"]}
        if "cat_bits" in state:
            packed["cat_bits"] = state["cat_bits"]
        packed["tree_offsets"] = np.array([0, n], dtype=np.int64)
        validate_packed(packed, n_features, bin_thresholds, what="tree")

    def validate(self, n_features=None, bin_thresholds=None):
        """:meth:`validate_state` of this tree's state (see there)."""
        Tree.validate_state(self.to_arrays(), n_features, bin_thresholds)

    def __getstate__(self):
        return self.to_arrays()

    def __setstate__(self, state):
        other = Tree.from_arrays(state)
        self.__dict__.update(other.__dict__)

    def __eq__(self, other):
        if not isinstance(other, Tree):
            return NotImplemented
        a, b = self.to_arrays(), other.to_arrays()
        if a.keys() != b.keys():
            return False
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
        ``"value"`` of shape ``(n_total_nodes, n_outputs)``; ``"cat_bits"`` uint64 of
        shape ``(n_total_nodes, W)`` (the widest tree's width) when any tree has a categorical split
        (absent otherwise, as in files written before them); ``"tree_offsets"`` int64
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
    if any(t.cat_bits.shape[1] for t in trees):
        packed["cat_bits"] = stacked_cat_bits(trees)
    packed["tree_offsets"] = offsets
    return packed


def stacked_cat_bits(trees):
    """The trees' ``cat_bits`` concatenated (packed node order), ``(n_nodes, 0)`` when none has any.

    Narrower trees are padded with zero words to the widest tree's width."""
    width = max(t.cat_bits.shape[1] for t in trees)
    if not width:
        return np.zeros((sum(t.node_count for t in trees), 0), dtype=CAT_BITS_DTYPE)
    out = np.zeros((sum(t.node_count for t in trees), width), dtype=CAT_BITS_DTYPE)
    at = 0
    for t in trees:
        out[at:at + t.node_count, :t.cat_bits.shape[1]] = t.cat_bits
        at += t.node_count
    return out


def packed_cat_bits(packed):
    """The packed forest's ``cat_bits``, width 0 when it has none (kernels take this)."""
    bits = packed.get("cat_bits")
    if bits is None:
        return np.zeros((packed["feature"].shape[0], 0), dtype=CAT_BITS_DTYPE)
    return bits


def has_categorical_splits(packed):
    """Whether any node of a packed forest splits on a category set."""
    return bool(((packed["bin_threshold"] == CATEGORICAL_SPLIT) & (packed["feature"] >= 0)).any())


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
        if "cat_bits" in packed:
            state["cat_bits"] = np.asarray(packed["cat_bits"][lo:hi])
        trees.append(Tree.from_arrays(state))
    return trees


def _is_int(x):
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _describe(x):
    if isinstance(x, np.ndarray):
        return f"{x.dtype} array of shape {x.shape}"
    return type(x).__name__


def validate_packed(packed, n_features=None, bin_thresholds=None, n_outputs=None, what="forest"):
    """Check that a packed forest satisfies the structure invariants (module docstring).

    Vectorised over all nodes: a few passes over the node arrays, no walk, so a
    corrupted forest is refused in time linear in its size.

    Parameters
    ----------
    packed : dict
        As :func:`pack_trees` returns it; any content (a model file is untrusted):
        dtypes must match exactly, nothing is cast.
    n_features : int, optional
        Features the model was fitted on; split features must be below it.
    bin_thresholds : list of ndarray, optional
        The bin mapper's ``bin_thresholds_``: each split's ``bin_threshold`` must be a
        value bin of its feature and its ``threshold`` that bin's upper edge (``+inf``
        for the last value bin). Without it, split thresholds need only not be NaN.
    n_outputs : int, optional
        Required width of ``value``.
    what : str
        Name of the forest in messages.

    Raises
    ------
    ValueError
        Naming the first violated invariant and where (tree, node).
    """
    if not isinstance(packed, dict):
        raise ValueError(f"{what} must be a packed forest (a dict), got {type(packed).__name__}")
    fields = dict(NODE_FIELDS, **PACKED_EXTRA)
    missing = [k for k in fields if k not in packed]
    if missing:
        raise ValueError(f"{what} lacks fields {missing}")
    for name, dt in fields.items():
        arr = packed[name]
        if not isinstance(arr, np.ndarray) or arr.dtype != np.dtype(dt):
            raise ValueError(f"{what}: {name!r} must be a {np.dtype(dt)} array, got {_describe(arr)}")
    bits = packed.get("cat_bits")
    if bits is not None and (not isinstance(bits, np.ndarray) or bits.dtype != np.dtype(CAT_BITS_DTYPE)):
        raise ValueError(f"{what}: 'cat_bits' must be a uint64 array, got {_describe(bits)}")
    feature = packed["feature"]
    if feature.ndim != 1:
        raise ValueError(f"{what}: 'feature' must be 1-D, got shape {feature.shape}")
    n = feature.shape[0]
    for name in NODE_FIELDS:
        if packed[name].shape != (n,):
            raise ValueError(f"{what}: {name!r} has shape {packed[name].shape}, expected ({n},) like 'feature'")
    if bits is not None and (bits.ndim != 2 or bits.shape[0] != n
                             or not CAT_WORDS <= bits.shape[1] <= MAX_CAT_WORDS):
        raise ValueError(f"{what}: 'cat_bits' has shape {bits.shape}, expected ({n}, W) with "
                         f"{CAT_WORDS} <= W <= {MAX_CAT_WORDS} words")
    value = packed["value"]
    if value.ndim != 2 or value.shape[0] != n or value.shape[1] < 1:
        raise ValueError(f"{what}: 'value' has shape {value.shape}, expected ({n}, n_outputs >= 1)")
    if n_outputs is not None and value.shape[1] != n_outputs:
        raise ValueError(f"{what}: nodes hold {value.shape[1]} outputs, the model needs {n_outputs}")
    offsets = packed["tree_offsets"]
    if offsets.ndim != 1 or offsets.shape[0] < 2 or offsets[0] != 0 or offsets[-1] != n \
            or (np.diff(offsets) <= 0).any():
        raise ValueError(f"{what}: 'tree_offsets' must rise strictly from 0 to the node count {n} "
                         f"(every tree has a root), got {offsets[:8].tolist()}{'...' if offsets.size > 8 else ''}")
    _check_structure(packed, offsets, n_features, bin_thresholds, what)


def validate_categorical(packed, categorical, what="forest"):
    """Check a packed forest's categorical splits against the features' kinds.

    Parameters
    ----------
    packed : dict
        Already passed :func:`validate_packed`.
    categorical : ndarray of bool, shape (n_features,) or None
        Which features are categorical (the bin mapper's ``categorical_``); None: none.

    Raises
    ------
    ValueError
        A categorical split on a numeric feature or a numeric split on a categorical one.
    """
    feature = packed["feature"].astype(np.int64)
    split = feature >= 0
    is_cat = split & (packed["bin_threshold"] == CATEGORICAL_SPLIT)
    kinds = np.zeros(int(feature.max(initial=0)) + 1, dtype=bool)
    if categorical is not None:
        kinds[:min(len(categorical), len(kinds))] = np.asarray(categorical, dtype=bool)[:len(kinds)]
    f = np.where(split, feature, 0)
    bad = split & (is_cat != kinds[f])
    if bad.any():
        node = int(np.flatnonzero(bad)[0])
        kind = "categorical" if is_cat[node] else "numeric"
        raise ValueError(f"{what}: node {node} makes a {kind} split on feature {feature[node]}, which is "
                         f"{'categorical' if kinds[feature[node]] else 'numeric'}")


def _check_structure(packed, offsets, n_features, bin_thresholds, what):
    """The invariants of the module docstring, given well-typed arrays (see validate_packed)."""
    n = packed["feature"].shape[0]
    nodes = np.arange(n, dtype=np.int64)
    tree_of = np.searchsorted(offsets, nodes, side="right") - 1

    def fail(mask, text):
        node = int(np.flatnonzero(mask)[0])
        t = int(tree_of[node])
        raise ValueError(f"{what}: tree {t}, node {node - int(offsets[t])}: {text(node)}")

    feature = packed["feature"].astype(np.int64)
    left = packed["left"].astype(np.int64)
    right = packed["right"].astype(np.int64)
    split = feature >= 0
    bad = ~split & ((feature != LEAF) | (left != LEAF) | (right != LEAF))
    if bad.any():
        fail(bad, lambda i: f"a leaf needs feature, left and right all -1, got {feature[i]}, {left[i]}, {right[i]}")
    end = offsets[tree_of + 1]
    for name, child in (("left", left), ("right", right)):
        bad = split & ((child <= nodes) | (child >= end))
        if bad.any():
            fail(bad, lambda i: f"{name} child {child[i]} is not a later node of the same tree "
                                f"(nodes {offsets[tree_of[i]]}..{end[i] - 1})")
    bad = split & (left == right)
    if bad.any():
        fail(bad, lambda i: f"both children are node {left[i]}")
    parents = np.bincount(np.concatenate([left[split], right[split]]), minlength=n)
    expected = np.ones(n, dtype=np.int64)
    expected[offsets[:-1]] = 0
    bad = parents != expected
    if bad.any():
        fail(bad, lambda i: f"has {parents[i]} parents, expected {expected[i]}")
    depth = packed["depth"].astype(np.int64)
    want = np.zeros(n, dtype=np.int64)
    want[left[split]] = depth[split] + 1
    want[right[split]] = depth[split] + 1
    bad = depth != want
    if bad.any():
        fail(bad, lambda i: f"depth {depth[i]}, but it is {want[i]} edges below its root")
    bad = packed["missing_left"] > 1
    if bad.any():
        fail(bad, lambda i: f"missing_left must be 0 or 1, got {packed['missing_left'][i]}")
    if n_features is not None:
        bad = feature >= n_features
        if bad.any():
            fail(bad, lambda i: f"splits on feature {feature[i]}, but the model has {n_features} features")
    bins = packed["bin_threshold"].astype(np.int64)
    threshold = packed["threshold"]
    categorical = split & (bins == CATEGORICAL_SPLIT)
    bad = split & (bins < 0) & ~categorical
    if bad.any():
        fail(bad, lambda i: f"bin threshold {bins[i]} is negative")
    if categorical.any():
        bits = packed.get("cat_bits")
        if bits is None:
            fail(categorical, lambda i: "categorical split without a 'cat_bits' bitset")
        bad = categorical & ~np.isnan(threshold)
        if bad.any():
            fail(bad, lambda i: f"categorical split with a raw threshold {float(threshold[i])!r} (must be NaN)")
        bad = categorical & ~(bits != 0).any(axis=1)
        if bad.any():
            fail(bad, lambda i: "categorical split sends no category left")
        if bin_thresholds is not None:
            n_value = np.array([len(t) + 1 for t in bin_thresholds], dtype=np.int64)
            f = np.where(categorical, feature, 0)
            f = np.minimum(f, len(n_value) - 1)
            words = np.arange(bits.shape[1], dtype=np.int64)[None, :] * 64
            room = np.clip(n_value[f][:, None] - words, 0, 64)
            allowed = np.where(room >= 64, np.uint64(0xFFFFFFFFFFFFFFFF),
                               (np.uint64(1) << room.astype(np.uint64)) - np.uint64(1))
            bad = categorical & ((bits & ~allowed) != 0).any(axis=1)
            if bad.any():
                fail(bad, lambda i: f"categorical split sends bins beyond the {n_value[feature[i]]} value bins of "
                                    f"feature {feature[i]} left")
    numeric = split & ~categorical
    if bin_thresholds is None:
        bad = numeric & np.isnan(threshold)
        if bad.any():
            fail(bad, lambda i: "split threshold is NaN")
    else:
        edges = np.array([len(t) for t in bin_thresholds], dtype=np.int64)
        bad = feature >= len(edges)
        if bad.any():
            fail(bad, lambda i: f"splits on feature {feature[i]}, but the bin mapper has {len(edges)} features")
        f = np.where(split, feature, 0)
        b = np.where(numeric, bins, 0)
        bad = numeric & (b > edges[f])
        if bad.any():
            fail(bad, lambda i: f"bin threshold {bins[i]} is not a value bin of feature {feature[i]} "
                                f"({edges[feature[i]] + 1} value bins)")
        table = np.full((len(edges), int(edges.max(initial=0)) + 1), np.inf)
        for j, t in enumerate(bin_thresholds):
            table[j, :len(t)] = t
        upper = table[f, b]
        bad = numeric & (threshold != upper)
        if bad.any():
            fail(bad, lambda i: f"threshold {float(threshold[i])!r} is not the upper edge {float(upper[i])!r} of its "
                                f"bin {bins[i]} (feature {feature[i]})")
    bad = ~np.isfinite(packed["value"]).all(axis=1)
    if bad.any():
        fail(bad, lambda i: "node value is not finite")

"""Tree arrays, state round trip and the packed-forest layout."""
import pickle

import numpy as np
import pytest

from forest.tree import NODE_FIELDS, Tree, pack_trees, unpack_trees


def _stump(value_left, value_right, feature=1, thr=0.5):
    t = Tree(2, capacity=1)
    root = t.add_node(0, 10.0, [0.0, 0.0], impurity=3.0)
    left = t.add_node(1, 4.0, value_left)
    right = t.add_node(1, 6.0, value_right, count=7.0)
    t.set_split(root, feature, 3, thr, True, 2.5, left, right)
    return t


def test_build_and_fields():
    t = _stump([1.0, 2.0], [3.0, 4.0])
    assert t.node_count == 3 and t.n_leaves == 2 and t.max_depth == 1
    np.testing.assert_array_equal(t.feature, [1, -1, -1])
    np.testing.assert_array_equal(t.left, [1, -1, -1])
    np.testing.assert_array_equal(t.right, [2, -1, -1])
    np.testing.assert_array_equal(t.count, [10.0, 4.0, 7.0])
    assert t.missing_left[0] == 1 and t.gain[0] == 2.5 and t.bin_threshold[0] == 3
    np.testing.assert_array_equal(t.value, [[0, 0], [1, 2], [3, 4]])
    np.testing.assert_array_equal(t.is_leaf, [False, True, True])


def test_state_round_trip_and_pickle():
    t = _stump([1.0, 2.0], [3.0, 4.0])
    state = t.to_arrays()
    assert set(state) == set(NODE_FIELDS) | {"value", "n_outputs"}
    assert all(isinstance(v, (np.ndarray, int)) for v in state.values())
    t2 = Tree.from_arrays(state)
    assert t2 == t
    t3 = pickle.loads(pickle.dumps(t))
    assert t3 == t
    state["feature"] = state["feature"][:2]
    with pytest.raises(ValueError, match="feature"):
        Tree.from_arrays(state)


def test_value_setter_changes_outputs():
    t = _stump([1.0, 2.0], [3.0, 4.0])
    t.value = np.arange(9.0).reshape(3, 3)
    assert t.n_outputs == 3
    with pytest.raises(ValueError, match="node_count"):
        t.value = np.zeros((2, 3))
    # the tree can still grow after the reset
    t.add_node(2, 1.0, [0.0, 0.0, 1.0])
    assert t.node_count == 4 and t.value.shape == (4, 3)


def test_pack_unpack():
    a = _stump([1.0, 2.0], [3.0, 4.0])
    b = Tree(2)
    b.add_node(0, 5.0, [9.0, 9.0])
    c = _stump([5.0, 6.0], [7.0, 8.0], feature=0)
    packed = pack_trees([a, b, c])
    np.testing.assert_array_equal(packed["tree_offsets"], [0, 3, 4, 7])
    np.testing.assert_array_equal(packed["left"], [1, -1, -1, -1, 5, -1, -1])
    np.testing.assert_array_equal(packed["right"], [2, -1, -1, -1, 6, -1, -1])
    assert packed["value"].shape == (7, 2)
    back = unpack_trees(packed)
    assert back[0] == a and back[1] == b and back[2] == c
    with pytest.raises(ValueError, match="n_outputs"):
        pack_trees([a, Tree(1)])

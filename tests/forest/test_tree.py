"""Tree arrays, state round trip and the packed-forest layout."""
import pickle

import numpy as np
import pytest

from forest.engine.tree import NODE_FIELDS, Tree, pack_trees, unpack_trees


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


def test_bulk_append_equals_node_by_node():
    """append_leaves / set_splits / set_count build the tree add_node / set_split build."""
    one = Tree(2, capacity=1)
    root = one.add_node(0, 10.0, [0.5, 0.5], impurity=3.0)
    kids = [one.add_node(1, w, v, impurity=i, count=c)
            for w, v, i, c in [(4.0, [1, 2], 1.0, 4.0), (6.0, [3, 4], 2.0, 5.0)]]
    one.set_split(root, 1, 3, 0.5, True, 2.5, kids[0], kids[1])
    grand = [one.add_node(2, w, v, impurity=0.0, count=w) for w, v in [(1.0, [5, 6]), (3.0, [7, 8])]]
    one.set_split(kids[1], 0, 9, -1.0, False, 0.25, grand[0], grand[1])
    one._arrays["count"][kids[0]] = 4.5

    bulk = Tree(2, capacity=1)
    bulk.append_leaves([10.0], [10.0], [[0.5, 0.5]], [3.0], [0])
    first = bulk.append_leaves([4.0, 6.0], [4.0, 5.0], [[1, 2], [3, 4]], [1.0, 2.0], [1, 1])
    bulk.set_splits(np.array([0]), [1], [3], [0.5], [True], [2.5], np.array([first]))
    first2 = bulk.append_leaves([1.0, 3.0], [1.0, 3.0], [[5, 6], [7, 8]], [0.0, 0.0], [2, 2])
    bulk.set_splits(np.array([2]), [0], [9], [-1.0], [False], [0.25], np.array([first2]))
    bulk.set_count(1, 4.5)
    assert bulk == one
    for name in NODE_FIELDS:
        np.testing.assert_array_equal(getattr(bulk, name), getattr(one, name), err_msg=name)
    np.testing.assert_array_equal(bulk.value, one.value)


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

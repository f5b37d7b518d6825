"""Importance measures, Qini curve and HTML page of forest.report.summary, against slow references."""
from html.parser import HTMLParser
import base64

import numpy as np
import pytest

from forest.report import summary as rep
from forest.engine.tree import Tree


def _chain_tree(features, gains):
    """A tree splitting along its left spine: split k at depth k on features[k]."""
    t = Tree(1)
    node = t.add_node(0, 1.0, [0.0])
    for depth, (f, g) in enumerate(zip(features, gains)):
        left = t.add_node(depth + 1, 1.0, [0.0])
        right = t.add_node(depth + 1, 1.0, [0.0])
        t.set_split(node, f, 0, 0.5, False, g, left, right)
        node = left
    return t


def test_importances_match_grf_definition():
    trees = [_chain_tree([0, 1, 2, 0, 1], [5.0, 1.0, 1.0, 1.0, 9.0]),
             _chain_tree([1, 1], [2.0, -1.0])]
    imp = rep.importances(trees, 4)
    # by depth (1-based): d1: {0, 1}, d2: {1, 1}, d3: {2}, d4: {0}; d5 ignored (max depth 4)
    freq = np.array([[0.5, 0.5, 0, 0], [0, 1.0, 0, 0], [0, 0, 1.0, 0], [1.0, 0, 0, 0]])
    w = np.array([1, 1 / 4, 1 / 9, 1 / 16])
    np.testing.assert_allclose(imp["depth_weighted"], w @ freq / w.sum(), rtol=1e-14)
    assert imp["depth_weighted"].sum() == pytest.approx(1.0)
    np.testing.assert_array_equal(imp["splits"], [2, 4, 1, 0])
    gains = np.array([5 + 1, 1 + 9 + 2, 1, 0.0])  # negative gain counts as 0
    np.testing.assert_allclose(imp["gain"], gains / gains.sum(), rtol=1e-14)


def test_model_trees_skips_nested_models():
    class Inner:
        pass

    class Outer:
        pass

    inner = Inner()
    inner.trees_ = [_chain_tree([0], [1.0])]
    outer = Outer()
    outer.trees_ = [[_chain_tree([1], [1.0]), _chain_tree([2], [1.0])]]
    outer.nuisance_ = inner
    outer.n_features_in_ = 3
    assert len(rep.model_trees(outer)) == 2


def _qini_slow(tau, t, y):
    order = sorted(range(len(tau)), key=lambda i: (-tau[i], i))
    n = len(tau)
    out = [0.0]
    for k in range(1, n + 1):
        top = order[:k]
        nt = sum(t[i] for i in top)
        nc = k - nt
        yt = sum(y[i] for i in top if t[i] == 1)
        yc = sum(y[i] for i in top if t[i] == 0)
        out.append((yt - yc * nt / nc) / n if nc > 0 else 0.0)
    return np.array(out)


def test_qini_curve_matches_slow_reference(rng):
    n = 60
    tau = np.round(rng.normal(size=n), 1)  # ties on purpose
    t = (rng.uniform(size=n) < 0.5).astype(float)
    y = rng.normal(size=n) + t * tau
    q = rep.qini_curve(tau, t, y)
    np.testing.assert_allclose(q["qini"], _qini_slow(tau, t, y), rtol=1e-12, atol=1e-15)
    assert q["fraction"][0] == 0 and q["fraction"][-1] == 1
    np.testing.assert_allclose(q["random"][-1], q["qini"][-1])


def test_qini_rewards_a_good_ranking(rng):
    n = 4000
    tau = rng.uniform(-1, 3, size=n)
    t = (rng.uniform(size=n) < 0.5).astype(float)
    y = rng.normal(size=n) * 0.5 + t * tau
    good = rep.qini_curve(tau, t, y)
    bad = rep.qini_curve(-tau, t, y)
    noise = rep.qini_curve(rng.normal(size=n), t, y)
    assert good["qini_coefficient"] > 0.1 > abs(noise["qini_coefficient"])
    assert bad["qini_coefficient"] < -0.1
    assert good["auuc"] > noise["auuc"] > bad["auuc"]


def test_partial_dependence_recovers_a_step():
    X = np.random.default_rng(0).uniform(size=(300, 3))
    grid, mean = rep.partial_dependence(lambda Z: 1.0 + 2.0 * (Z[:, 0] > 0.5) + 0 * Z[:, 1], X, 0)
    np.testing.assert_allclose(mean, 1.0 + 2.0 * (grid > 0.5))


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.tags = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])


def test_html_page_embeds_images():
    names = ["a", "b<c>", "d"]
    imp = {"depth_weighted": np.array([0.5, 0.3, 0.2]), "gain": np.array([0.6, 0.2, 0.2]),
           "splits": np.array([4, 2, 1])}
    png = rep.importance_figure(names, imp)
    page = rep.html_page("t", [("Feature importance", rep.text_table(names, imp), png)])
    p = _Images()
    p.feed(page)
    assert "script" not in p.tags and "b&lt;c&gt;" in page
    assert len(p.images) == 1 and p.images[0].startswith("data:image/png;base64,")
    data = base64.b64decode(p.images[0].split(",", 1)[1])
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_text_table_order():
    names = ["a", "b", "c"]
    imp = {"depth_weighted": np.array([0.2, 0.5, 0.2]), "gain": np.array([0.1, 0.5, 0.4]),
           "splits": np.array([1, 5, 3])}
    lines = rep.text_table(names, imp).splitlines()
    assert [line.split()[1] for line in lines[1:]] == ["b", "c", "a"]

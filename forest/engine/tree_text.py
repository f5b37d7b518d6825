"""A fitted tree as indented ``if/else`` text: the one home of how a split reads.

:meth:`forest.PolicyTree.export_text` and :meth:`forest.CateSummaryTree.export_text` call
:func:`tree_text` with their own leaf text; a categorical split lists the categories it
sends left by name (:func:`category_labels`).
"""
import numpy as np

from forest.engine.tree import CATEGORICAL_SPLIT, bitset_bins


def category_labels(coder, feature, bits):
    """Labels of the categories a categorical split's bitset holds (their codes without a coder).

    Parameters
    ----------
    coder : histogram.categories.CategoryCoder or None
        The estimator's ``category_coder_``.
    feature : int
    bits : ndarray of uint64
        The split's bitset.

    Returns
    -------
    list of str
    """
    codes = bitset_bins(bits)
    if coder is None or feature not in coder.columns_.tolist():
        return [str(int(c)) for c in codes]
    labels = coder.category_names(coder.columns_.tolist().index(feature))
    return [labels[int(c)] for c in codes]


def tree_text(tree, feature_name, leaf_text, coder=None, decimals=4):
    """Indented ``if <condition>: ... else: ...`` lines of a tree.

    Parameters
    ----------
    tree : forest.engine.tree.Tree
    feature_name : callable
        ``feature_name(f) -> str``.
    leaf_text : callable
        ``leaf_text(node) -> str``, the line of a leaf.
    coder : histogram.categories.CategoryCoder, optional
        Names the categories of categorical splits.
    decimals : int
        Significant digits of thresholds.

    Returns
    -------
    str
    """
    t = tree
    lines = []

    def walk(node, indent):
        pad = "    " * indent
        if t.feature[node] < 0:
            lines.append(pad + leaf_text(node))
            return
        f = int(t.feature[node])
        name = feature_name(f)
        missing = "missing goes left" if t.missing_left[node] else "missing goes right"
        if t.bin_threshold[node] == CATEGORICAL_SPLIT:
            cond = f"{name} in {{{', '.join(category_labels(coder, f, t.cat_bits[node]))}}}"
        else:
            cond = (f"{name} is not missing" if not np.isfinite(t.threshold[node])
                    else f"{name} <= {t.threshold[node]:.{decimals}g}")
            if not np.isfinite(t.threshold[node]):
                missing = "missing goes right" if not t.missing_left[node] else "everything goes left"
        lines.append(f"{pad}if {cond}:  ({missing}; {int(t.count[node])} rows)")
        walk(int(t.left[node]), indent + 1)
        lines.append(f"{pad}else:")
        walk(int(t.right[node]), indent + 1)

    walk(0, 0)
    return "\n".join(lines)

"""Tree growth from histograms: the engine's entry points, one concept per module.

This module only gathers the public API of growth; each concept lives in its own
module:

================================  ====================================================
:mod:`forest.expansion`           the expansion step and its policies: level-wise
                                  batches of trees (:func:`grow_levelwise`, forests)
                                  and best-first single trees
                                  (:class:`LeafwiseGrower`, boosting)
:mod:`forest.hist_builder`        histogram building (threads, the ``(g, h)`` fast
                                  path) and the smaller-child / subtraction trick
:mod:`forest.reducers`            the communicating hooks: one rank, allreduce,
                                  reduce-scatter by feature blocks
:mod:`forest.tree_parallel`       tree-parallel finishing: whole subtrees grown by the
                                  compiled kernel (:mod:`forest.local_growth`), one
                                  rank per tree
:mod:`forest.leaf_estimation`     honest leaf re-estimation
                                  (:func:`reestimate_leaves`)
:mod:`forest.node_records`        writing roots, splits and children into trees
:mod:`forest.bin_info`            the growers' view of a fitted bin mapper
                                  (:class:`BinInfo`)
:mod:`forest.growth_options`      :class:`TreeParams` (what to grow) and
                                  :class:`EngineOptions` (how), with
                                  :func:`engine_options` to change settings for a
                                  block
:mod:`forest.splitting`           split finding from reduced histograms and the one
                                  split rule (ties, :data:`REL_TOL`)
:mod:`forest.compiled_criterion`  how a criterion's jitted pieces reach the kernels
:mod:`forest.honest_forest`       the forest loop above the engine
                                  (:class:`~forest.honest_forest.ForestSpec`)
================================  ====================================================
"""
from .bin_info import BinInfo
from .expansion import GrownTree, LeafwiseGrower, grow_levelwise
from .growth_options import SPLIT_MODES, EngineOptions, TreeParams, current_engine_options, engine_options
from .leaf_estimation import reestimate_leaves
from .splitting import REL_TOL

__all__ = ["BinInfo", "EngineOptions", "GrownTree", "LeafwiseGrower", "REL_TOL", "SPLIT_MODES", "TreeParams",
           "current_engine_options", "engine_options", "grow_levelwise", "reestimate_leaves"]

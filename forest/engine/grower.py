"""Tree growth from histograms: the engine's entry points, one concept per module.

This module only gathers the public API of growth; each concept lives in its own
module:

================================  ====================================================
:mod:`forest.engine.expansion`           the expansion step and its policies: level-wise
                                  batches of trees (:func:`grow_levelwise`, forests)
                                  and best-first single trees
                                  (:class:`LeafwiseGrower`, boosting)
:mod:`forest.engine.hist_builder`        histogram building (threads, the ``(g, h)`` fast
                                  path) and the smaller-child / subtraction trick
:mod:`forest.engine.reducers`            the communicating hooks: one rank, allreduce,
                                  reduce-scatter by feature blocks
:mod:`forest.engine.tree_parallel`       tree-parallel finishing: whole subtrees grown by the
                                  compiled kernel (:mod:`forest.engine.local_growth`), one
                                  rank per tree
:mod:`forest.engine.leaf_estimation`     honest leaf re-estimation
                                  (:func:`reestimate_leaves`)
:mod:`forest.engine.node_records`        writing roots, splits and children into trees
:mod:`forest.engine.bin_info`            the growers' view of a fitted bin mapper
                                  (:class:`BinInfo`)
:mod:`forest.engine.growth_options`      :class:`TreeParams` (what to grow) and
                                  :class:`EngineOptions` (how), with
                                  :func:`engine_options` to change settings for a
                                  block
:mod:`forest.engine.splitting`           split finding from reduced histograms and the one
                                  split rule (ties, :data:`REL_TOL`)
:mod:`forest.criteria.compiled`  how a criterion's jitted pieces reach the kernels
:mod:`forest.engine.honest_forest`       the forest loop above the engine
                                  (:class:`~forest.engine.honest_forest.ForestSpec`)
================================  ====================================================
"""
from forest.engine.bin_info import BinInfo
from forest.engine.expansion import GrownTree, LeafwiseGrower, grow_levelwise
from forest.engine.growth_options import SPLIT_MODES, EngineOptions, TreeParams, current_engine_options, engine_options
from forest.engine.leaf_estimation import reestimate_leaves
from forest.engine.splitting import REL_TOL

__all__ = ["BinInfo", "EngineOptions", "GrownTree", "LeafwiseGrower", "REL_TOL", "SPLIT_MODES", "TreeParams",
           "current_engine_options", "engine_options", "grow_levelwise", "reestimate_leaves"]

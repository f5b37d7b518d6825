"""Settings of the growth engine: what trees to grow, and how the engine grows them.

This module owns the two option objects the growers take instead of long parameter
lists, and the one supported way to change engine settings for a block of code:

:class:`TreeParams`
    What to grow, from the estimator's parameters: ``max_depth``,
    ``min_samples_split``, ``min_gain``, ``mtry`` and the ``seed`` of the mtry draw.
    Two fits with equal ``TreeParams`` (and data) grow the same trees whatever the
    engine settings (up to ties of equal gains; see :mod:`forest.engine.splitting`).
:class:`EngineOptions`
    How to grow them: histogram backend, collective algorithm and split mode, where
    level-wise growth hands nodes to the subtree kernel, the kernel's histogram
    threshold, memory bounds, and the boosting grower's threading thresholds. Each
    default is a measured choice (the field docs say where it is measured).
:func:`engine_options`
    A context manager that changes the defaults for the code inside it (benchmarks
    and profiles compare settings with it instead of patching module constants):
    ``with engine_options(local_threshold=0): est.fit(...)``.

Options are read when a growth call starts, on every rank; all ranks must use the
same settings (they decide which collectives run).
"""
import contextlib
import dataclasses
import threading
from dataclasses import dataclass
from typing import Optional

from forest.engine.partition import PARALLEL_BLOCKS_MIN_ROWS

SPLIT_MODES = ("allreduce", "reduce_scatter")
HIST_SPLITS = ("rows", "features")


def task_row_bytes(n_features, n_channels):
    """Bytes per row of one subtree task (:func:`forest.engine.local_growth.grow_subtrees` copies a
    node's codes and channels and keeps per-feature orders): ``6 F + 8 C + 48``."""
    return 6 * n_features + 8 * n_channels + 48


@dataclass(frozen=True)
class TreeParams:
    """What trees to grow.

    Attributes
    ----------
    max_depth : int or None
        Root has depth 0; ``None`` means unlimited.
    min_samples_split : float
        A node splits only if ``criterion.node_size`` of its rows (all ranks) is at
        least this.
    min_gain : float
        A split needs ``gain > min_gain``.
    mtry : int or None
        Features tried per node (:mod:`forest.engine.mtry`); ``None`` means all.
    seed : int
        Seed of the mtry draw.
    """

    max_depth: Optional[int] = None
    min_samples_split: float = 2.0
    min_gain: float = 0.0
    mtry: Optional[int] = None
    seed: int = 0

    @property
    def depth_limit(self):
        """``max_depth`` as an int (a huge one for ``None``)."""
        return 2 ** 31 - 1 if self.max_depth is None else int(self.max_depth)


@dataclass(frozen=True)
class EngineOptions:
    """How the engine grows trees (not model parameters; see the module docstring).

    Attributes
    ----------
    backend : str
        Histogram backend (:func:`histogram.kernels.build_histograms`).
    split_mode : {"allreduce", "reduce_scatter"}
        How histograms are combined across ranks (:mod:`forest.engine.reducers`).
    algorithm : str
        Collective algorithm (``"auto"`` lets :mod:`native` choose).
    local_threshold : float
        Level-wise growth hands frontier nodes of at most this global weight (rows,
        for the forests' criteria) to the compiled subtree kernel
        (:mod:`forest.engine.tree_parallel`); ``inf`` (default) means every node, i.e.
        tree-parallel growth from the root, ``0`` histograms for every node.
        Measured (CausalForest, d = 20, 200 trees + 2 x 50 nuisance, one thread per
        rank, CPU s): n = 20k, one rank 7.25 (threshold 2048) vs 7.28 (all local);
        -np 2 wall 10.95 vs 7.09 s (with the later kernel and exchange changes, n = 100k:
        -np 1 42 s, -np 2 20.7 s wall). A tree's structure rows gathered onto the rank
        that grows it cost ``rows x (F + 8 C + 16)`` bytes once (about 1 MB per tree
        per rank at n = 100k, d = 20), where the histogram path allreduces
        ``F x B x C x 8`` bytes (286 KB for the causal forest) per node of every
        top level and makes all ranks wait for each level.
    local_task_bytes : int
        Bound on one subtree task's memory (it copies a node's codes and channels and
        keeps per-feature orders: :func:`task_row_bytes` per row). Heavier nodes take the histogram path whatever ``local_threshold``
        says, so huge data never has to fit one tree's rows into one task.
    local_gather_bytes : int
        Bound on the node rows one exchange of tree-parallel finishing moves (all
        ranks together); a level with more is finished in several chunks of trees.
    hist_rows : float
        Inside a subtree task, nodes of more rows split from in-task histograms,
        the others by the sorted-code scan (:mod:`forest.engine.local_growth`). Measured on
        25k rows, F = 20, causal channels, one thread: 104-117 ms per tree with the
        scan only, 82-85 ms at 256..1024 (92 at 2048, 100 at 4096).
    max_hist_slots : int
        Histograms one subtree task may hold at once (pending big nodes of a
        depth-first growth: about one per level); past it big nodes take the scan.
    gh_parallel_rows : int
        Boosting's ``(g, h)`` histogram builds from this many rows use all Numba
        threads. A small child of a 1M-row fit is a sparse subset whose code reads
        miss cache (cold, one thread: 2k rows 1.05 ms, 4k 1.55 ms, 16k 2.09 ms), and
        two threads split those misses (main-thread CPU 0.59 / 0.93 / 1.23 ms), far
        more than an idle pool's wake-up on a quiet machine (~20 us measured).
    partition_blocks_min_rows : int
        The best-first step partitions a node of this many rows across threads by
        per-thread blocks (:func:`forest.engine.partition.partition_segment`, where the
        measurement is).
    gh_hist_split : {"rows", "features"}
        How threads share one node's ``(g, h)`` histogram: by rows (each thread its own
        partial histogram, then added) or by features. Process CPU per build (1M x 28
        HIGGS codes, 2 threads, minima of 25): half the rows 14.1 (features) vs 13.4 ms
        (rows; 1 thread 13.3), root 19.3 vs 17.1 (1 thread 16.8).
    compiled_best_first : bool
        Boosting on one process grows each tree in one compiled loop
        (:mod:`forest.engine.best_first`, where it applies and what it measured); False
        keeps the Python loop of :class:`forest.engine.expansion.LeafwiseGrower` (the same
        trees, slower: the reference the tests compare it with).
    """

    backend: str = "auto"
    split_mode: str = "allreduce"
    algorithm: str = "auto"
    local_threshold: float = float("inf")
    local_task_bytes: int = 1024 * 2 ** 20
    local_gather_bytes: int = 256 * 2 ** 20
    hist_rows: float = 1024
    max_hist_slots: int = 32
    gh_parallel_rows: int = 4096
    partition_blocks_min_rows: int = PARALLEL_BLOCKS_MIN_ROWS
    gh_hist_split: str = "rows"
    compiled_best_first: bool = True

    def __post_init__(self):
        if self.split_mode not in SPLIT_MODES:
            raise ValueError(f"split_mode must be one of {SPLIT_MODES}, got {self.split_mode!r}")
        if self.gh_hist_split not in HIST_SPLITS:
            raise ValueError(f"gh_hist_split must be one of {HIST_SPLITS}, got {self.gh_hist_split!r}")
        if not self.local_threshold >= 0 or not self.hist_rows >= 0:
            raise ValueError("local_threshold and hist_rows must be >= 0")
        if self.max_hist_slots < 1 or self.local_task_bytes <= 0 or self.local_gather_bytes <= 0:
            raise ValueError("max_hist_slots, local_task_bytes and local_gather_bytes must be positive")

    def task_rows(self, n_features, n_channels):
        """Most rows one subtree task may hold (``local_task_bytes`` / :func:`task_row_bytes`)."""
        return self.local_task_bytes / task_row_bytes(n_features, n_channels)

    def replace(self, **changes):
        """A copy with some fields changed (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


_state = threading.local()


def current_engine_options():
    """The engine settings in effect (the defaults outside :func:`engine_options`)."""
    return getattr(_state, "options", None) or _DEFAULT


@contextlib.contextmanager
def engine_options(**changes):
    """Change engine settings for the code inside the block (this thread only).

    Parameters
    ----------
    **changes
        Fields of :class:`EngineOptions`.

    Yields
    ------
    EngineOptions
        The settings in effect inside the block.
    """
    previous = getattr(_state, "options", None)
    _state.options = current_engine_options().replace(**changes)
    try:
        yield _state.options
    finally:
        _state.options = previous


_DEFAULT = EngineOptions()

"""Trace-driven model of a fit: time and peak memory per rank, for any rank count.

One home for the estimate that ``forest-train --plan`` prints and that
``benchmarks/bench_scaling.py`` validates and extrapolates.

How it works
------------
1. **The fit as steps** (:func:`fit_steps`). For a workload (model, rows, features,
   parameters) and a rank count ``p``, the engine's work is listed as the sequence the
   engine runs, written from the estimators' own rules (default parameters, the
   forests' batch sizes, mtry, channel counts): compute steps (a phase of
   ``forest.profiling`` with *work units*, e.g. rows x features of histogram builds on
   the busiest rank) and collective steps (operation, bytes, count). Tests compare this
   list with real traces (``forest.profiling.FitTrace``): same collectives, same bytes.
2. **Compute prices**: each phase costs ``a * units + b * calls`` seconds on one
   core. ``a`` and ``b`` are measured by ``python benchmarks/bench_scaling.py
   --calibrate`` from traced single-rank fits at two sizes (minima over repetitions)
   and written, with that command, the host and the date, to
   ``forest/cli/calibration.json``. Phases whose work grows with tree depth use
   ``log2(rows per tree / min_samples_leaf)`` as the depth.
3. **Collective prices**: :func:`native.costs.seconds` of the algorithm
   ``algorithm="auto"`` would pick, on the cluster's node layout (nodes of
   ``ranks_per_node`` consecutive ranks; inter-node latency and bandwidth are
   parameters of :class:`Cluster`).
4. **Ranks per core**: when a node runs more rank-threads than it has cores, compute
   runs at the pace of the busiest core (``ceil`` of rank-threads per core: ranks
   wait for each other at every collective) and every message step costs the
   oversubscribed step latency, measured between compute phases as fits meet it
   (milliseconds: a step completes only once its partner gets a core). This
   machine's validation runs up to 4 ranks on 2 cores.
5. **Memory** (:func:`peak_memory`): measured base (interpreter, libraries, compiled
   kernels) + the arrays the fit holds per local row (features as codes, plus the
   caller's float features in Python) + a calibrated number of bytes per local row for
   the rest + the forest itself on every rank (nodes per tree from the calibration
   traces) + the rows a rank gathers to grow its trees.

What it leaves out: load from other jobs, NUMA, the file system, the network's
topology beyond one shared link per node, and early stopping (GBDT is priced for all
``n_estimators`` iterations).
"""
import dataclasses
import json
import math
import os
import types
from pathlib import Path

CALIBRATION_PATH = Path(__file__).with_name("calibration.json")

#: Environment variable for ``forest-train --plan``: the job's cores' speed relative to
#: the calibrating machine (:attr:`Cluster.core_speed`; default 1).
ENV_CORE_SPEED = "HISTFOREST_CORE_SPEED"

MODELS = ("gbdt-regressor", "gbdt-classifier", "regression", "causal", "instrumental")

# ----------------------------------------------------------------------------- cluster
#: How long the operating system takes to even out ranks over shared cores, seconds.
#: A judgment, not a fitted constant: Linux balances its run queues every few to
#: some tens of milliseconds on a small machine, so phases of about 2 ms between
#: collectives (a 1M-row GBDT at 3 ranks) run at the busiest core's pace and phases
#: of about 0.3 s (a causal forest, whose trees grow without collectives) at the
#: average. Matters only when ranks outnumber cores.
BALANCE_HORIZON_S = 0.05

@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where the ranks run.

    Attributes
    ----------
    cores_per_node : int
    ranks_per_node : int or None
        Ranks placed on one node, in rank order (``None``: ``cores_per_node //
        threads_per_rank``).
    threads_per_rank : int
        Numba threads per rank (compute is priced per core: ``threads_per_rank``
        cores give each rank ``thread_speedup`` of one core's speed).
    latency_us, gbits : float
        Inter-node latency (microseconds) and bandwidth of one node's link (Gb/s).
    memory_gb_per_node : float or None
    thread_efficiency : float
        Parallel efficiency of a rank's threads (speedup = 1 + eff * (threads - 1)).
    single_node : bool
        All ranks on one node whatever their number (this machine).
    core_speed : float
        Speed of one of these cores relative to the calibrating machine's core when it
        was calibrated (2.0: compute takes half the calibrated seconds). The phase
        prices are seconds on that machine; a cluster with other processors, or the
        same virtual machine on a slower day, differs by about one factor for every
        phase of one family (``bench_scaling.py --validate`` measures it with a speed
        probe, see there). Collectives are priced from the network constants alone.
    """

    cores_per_node: int = 32
    ranks_per_node: int = None
    threads_per_rank: int = 1
    latency_us: float = 5.0
    gbits: float = 25.0
    memory_gb_per_node: float = None
    thread_efficiency: float = 0.8
    single_node: bool = False
    core_speed: float = 1.0

    def __post_init__(self):
        if not (isinstance(self.core_speed, (int, float)) and math.isfinite(self.core_speed)
                and self.core_speed > 0):
            raise ValueError(f"core_speed must be a finite number > 0, got {self.core_speed!r}")

    @classmethod
    def this_machine(cls, threads_per_rank=1, core_speed=1.0):
        """Every rank on this host (shared memory), its cores and memory."""
        return cls(cores_per_node=os.cpu_count() or 1, ranks_per_node=None, threads_per_rank=threads_per_rank,
                   memory_gb_per_node=_mem_total_gb(), single_node=True, core_speed=core_speed)

    def rpn(self, p):
        if self.single_node:
            return p
        return self.ranks_per_node or max(1, self.cores_per_node // max(self.threads_per_rank, 1))

    def layout(self, p):
        """Node label of each of ``p`` ranks."""
        k = self.rpn(p)
        return [r // k for r in range(p)]

    def oversubscription(self, p):
        """Rank-threads per core on the busiest node (>= 1)."""
        return max(1.0, min(p, self.rpn(p)) * self.threads_per_rank / self.cores_per_node)

    def busiest_core(self, p):
        """Rank-threads time-sharing the busiest core (>= 1): ``ceil`` of :meth:`oversubscription`."""
        return float(math.ceil(self.oversubscription(p) - 1e-9))

    def sharing_factor(self, p, phase_s=None):
        """Slowdown of a rank's compute when rank-threads share cores (1 when they do not).

        Ranks meet at every collective, so a short phase ends when the ranks of the
        most crowded core have done their work: three ranks on two cores then run at
        the pace of the two that share a core (2x), not at the average (1.5x). Over
        long phases the scheduler moves ranks between cores and the average holds.
        Between the two, the weight of the busiest core is ``H / (H + phase_s)`` with
        ``H`` = :data:`BALANCE_HORIZON_S`.

        Parameters
        ----------
        p : int
        phase_s : float, optional
            Single-core seconds of compute between two collectives on one rank
            (``None``: the busiest core's pace).
        """
        avg, busiest = self.oversubscription(p), self.busiest_core(p)
        if phase_s is None:
            return busiest
        weight = BALANCE_HORIZON_S / (BALANCE_HORIZON_S + max(phase_s, 0.0))
        return avg + (busiest - avg) * weight

    def compute_factor(self, p, phase_s=None):
        """Wall seconds per calibrated single-core second of compute on one rank
        (:meth:`sharing_factor`, threads, :attr:`core_speed`)."""
        speedup = 1.0 + self.thread_efficiency * (self.threads_per_rank - 1)
        return self.sharing_factor(p, phase_s) / (speedup * self.core_speed)

    def network(self, p, constants=None):
        """:class:`native.costs.Network` for ``p`` ranks of this cluster."""
        from native import costs

        base = costs.measured()
        if self.single_node:
            net = base
        else:
            net = costs.Network.cluster(self.latency_us, self.gbits, base=base)
        over = _oversubscribed_alpha((constants or calibration()).get("oversubscribed_alpha"), p)
        if self.oversubscription(p) > 1.0 and over:
            net = dataclasses.replace(net, alpha_intra=max(net.alpha_intra, over),
                                      alpha_inter=max(net.alpha_inter, over))
        return net

    def describe(self):
        speed = "" if self.core_speed == 1.0 else f", cores at {self.core_speed:.3g}x the calibrated speed"
        if self.single_node:
            return f"this machine ({self.cores_per_node} cores, shared memory{speed})"
        return (f"{self.cores_per_node} cores/node, {self.ranks_per_node or 'one rank per core'} ranks/node, "
                f"{self.threads_per_rank} thread(s)/rank, {self.latency_us:g} us, {self.gbits:g} Gb/s links{speed}")


def core_speed_setting():
    """:data:`ENV_CORE_SPEED` as a number > 0 (1.0 if unset); ValueError if malformed."""
    from native.settings import positive_number

    return positive_number(ENV_CORE_SPEED, 1.0, unit="a core speed relative to the calibrating machine (e.g. 1.5)")


def growth_family(workload):
    """``"gbdt"`` or ``"forest"``: boosting (a collective per tree node) or forests (trees
    grown locally between rare collectives); the key of the calibration's ``memory``
    (:func:`peak_memory`) and ``pace`` (:func:`measured_pace`) entries."""
    return "gbdt" if workload.model.startswith("gbdt") else "forest"


def measured_pace(constants, workload, p, cluster):
    """Wall seconds per single-core compute second of ``p`` ranks on *this* machine, if measured.

    ``bench_scaling.py --calibrate`` fits a GBDT and a forest at 2 .. 4 ranks on the
    calibrating machine and keeps, per family and rank count, the pace that makes the
    model's compute plus its collectives equal the measured fit. It captures what
    the sharing formula (:meth:`Cluster.sharing_factor`) can only approximate there:
    logical cores that are hyperthreads of one physical core, ranks that spin in
    MPI waits on a core another rank needs, the operating system's placement. Only
    for :meth:`Cluster.this_machine` (a described cluster has its own cores) and
    only for a rank count that was measured; else ``None``.

    Parameters
    ----------
    constants : dict
        :func:`calibration`'s document (its ``"pace"`` entry).
    workload : Workload
    p : int
    cluster : Cluster

    Returns
    -------
    float or None
    """
    if not cluster.single_node or p < 2 or cluster.threads_per_rank != 1:
        return None
    if cluster.cores_per_node != (os.cpu_count() or 1):
        return None
    value = (constants.get("pace") or {}).get(growth_family(workload), {}).get(str(p))
    return None if value is None else float(value)


def _oversubscribed_alpha(measured, p):
    """Latency of a message step at ``p`` ranks when ranks share cores.

    ``measured``: seconds per step by rank count (``bench_scaling.py --calibrate``
    measures each count from the cores + 1 to 4), or one number (older files). A
    count that was not measured takes the largest measured value.
    """
    if not measured:
        return None
    if not isinstance(measured, dict):
        return float(measured)
    return float(measured.get(str(p), max(measured.values())))


def _mem_total_gb():
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2 ** 20
    except OSError:
        pass
    return None


# ----------------------------------------------------------------------------- workload
@dataclasses.dataclass
class Workload:
    """What is fitted.

    Attributes
    ----------
    model : {"gbdt-regressor", "gbdt-classifier", "regression", "causal", "instrumental"}
    n_rows, n_features : int
    params : dict
        Estimator parameters given by the user (the estimator's defaults fill the rest).
    n_classes : int
        Classes of a classifier (``> 2``: one tree per class per iteration).
    n_treatments, n_outcomes : int
        Causal forest: treatment arms / dose columns and outcome columns.
    entry : {"python", "cli"}
        ``"python"``: the caller holds float64 features; ``"cli"``: ``forest-train``
        streams them into codes (one row group at a time) and shows progress.
    row_group_rows : int
        Largest row group (``cli``): the float block held while binning.
    nuisance_given : bool
        Causal / instrumental forest: the caller passes the nuisance estimates
        (``y_hat``, ``t_hat``, ...), so no nuisance forest is grown.
    weighted : bool
        The fit has sample weights: the regression and causal forests then grow a row-count
        channel beside the weight channel (without weights the weight channel counts the rows).
    """

    model: str
    n_rows: int
    n_features: int
    params: dict = dataclasses.field(default_factory=dict)
    n_classes: int = 2
    n_treatments: int = 1
    n_outcomes: int = 1
    entry: str = "python"
    row_group_rows: int = 0
    nuisance_given: bool = False
    weighted: bool = False

    def __post_init__(self):
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")

    def resolved(self):
        """All estimator parameters: the user's on top of the estimator's defaults."""
        return dict(_estimator_class(self.model)(**self.params).get_params(deep=False))


def _estimator_class(model):
    if model.startswith("gbdt"):
        from forest.estimators.gbdt import GBDTClassifier, GBDTRegressor

        return GBDTClassifier if model == "gbdt-classifier" else GBDTRegressor
    if model == "regression":
        from forest.estimators.regression_forest import RegressionForest

        return RegressionForest
    if model == "instrumental":
        from forest.estimators.instrumental_forest import InstrumentalForest

        return InstrumentalForest
    from forest.estimators.causal_forest import CausalForest

    return CausalForest


# ----------------------------------------------------------------------------- steps
@dataclasses.dataclass
class Compute:
    """Compute on the busiest rank: ``units`` of work in ``calls`` entries of ``phase``.

    ``priced_as`` names the family whose calibrated prices apply when it differs
    (forests' top levels grown from histograms use the GBDT histogram kernels' prices,
    per channel pair).
    """

    family: str
    phase: str
    units: float
    calls: float = 1.0
    priced_as: str = None


@dataclasses.dataclass
class Collective:
    """``count`` calls of ``op`` on ``nbytes`` (the buffer; alltoallv: bytes a rank sends)."""

    label: str
    op: str
    nbytes: float
    count: float = 1.0


def _ceil_div(a, b):
    return -(-int(a) // int(b))


def fit_steps(workload, p, constants=None):
    """The modeled trace of one fit on ``p`` ranks (busiest rank).

    Returns
    -------
    list of Compute and Collective
    """
    constants = calibration() if constants is None else constants
    if workload.model.startswith("gbdt"):
        return _gbdt_steps(workload, p)
    return _forest_fit_steps(workload, p, constants)


def _gbdt_steps(w, p):
    prm = w.resolved()
    n, F = int(w.n_rows), int(w.n_features)
    k = w.n_classes if (w.model == "gbdt-classifier" and w.n_classes > 2) else 1
    channels = 2 * k
    bins = int(prm["max_bins"]) + 1
    leaves = prm["max_leaf_nodes"] or 2 ** int(prm["max_depth"])
    T = int(prm["n_estimators"])
    es = prm["early_stopping"] is True or (prm["early_stopping"] == "auto" and n > 10_000)
    n_val = n * float(prm["validation_fraction"]) if es else 0.0
    n_local = _ceil_div(n, p)
    tr_local = n_local * (1.0 - (float(prm["validation_fraction"]) if es else 0.0))
    hist_bytes = F * bins * channels * 8
    steps = [Compute("gbdt", "binning", n_local * F)]
    steps += _binning_collectives(n, F, p)
    steps.append(Collective("baseline", "allreduce", 8 * (k + 1)))
    builds = max(leaves - 1, 1)  # the root and the smaller child of every split but the last
    steps += [
        Compute("gbdt", "other", T * tr_local, T),
        Compute("gbdt", "histogram", T * tr_local * F, T * builds),
        Compute("gbdt", "split", T * builds * F * bins, T * builds),
        Compute("gbdt", "partition", T * tr_local, T * builds),
        Compute("gbdt", "prediction", T * tr_local, T),
        Collective("root histograms", "allreduce", hist_bytes + 8 * (channels + 1), T),
        Collective("child histograms", "allreduce", hist_bytes + 8, T * max(leaves - 2, 0)),
    ]
    if es:
        steps += [Compute("gbdt", "prediction", T * n_val / p * math.log2(max(leaves, 2)), T),
                  Collective("validation loss", "allreduce", 16, T + 1)]
    return steps


def _binning_collectives(n, F, p, subsample=200_000):
    # BinMapper: each rank sends every other rank that rank's feature block of its
    # sample rows (alltoallv), then the edges are shared (allgatherv, small).
    sample = min(n, subsample)
    return [Collective("binning sample", "alltoallv", sample / p * F * 8 * (p - 1) / p),
            Collective("bin edges", "allgatherv", 256 * 8 * F / p)]


@dataclasses.dataclass
class ForestSpec:
    """One forest of a fit (the causal forest's nuisance forests are two more)."""

    family: str          # "regression" or "causal": which calibrated prices apply
    n_trees: int
    channels: int
    oob: bool
    progress: bool       # a progress callback bounds the batch size (forest-train)
    held_trees: int = 0  # trees held at once when fewer than n_trees (tuning drops each small forest)


def _tuning_spec(prm, main, centring=False):
    """The small forests of ``tune_parameters`` (:mod:`forest.estimators.tuning`) as one forest, or none.

    The probe, ``tune_num_reps`` draws and the refitted winner, each ``tune_num_trees``
    trees (an effect forest's two halves of half as many), with out-of-bag estimates;
    priced at the given parameters (the draws' leaf sizes and sample fractions vary around them).
    ``centring``: the causal forest's centring choice is tuned (``"all"`` or ``"nuisance"``);
    it fits ``tune_num_trees`` more trees where a local linear correction is a candidate, which
    depends on the data, so the plan prices the upper bound (the corrections' out-of-bag pass
    over the nuisance forests is not priced).
    """
    if prm.get("tune_parameters") is None:
        return []
    n_trees = (int(prm["tune_num_reps"]) + 2 + int(centring)) * int(prm["tune_num_trees"])
    # held at once: the probe (its nuisance forests' centring) and the candidate being scored
    return [dataclasses.replace(main, n_trees=n_trees, oob=True, progress=False,
                                held_trees=2 * int(prm["tune_num_trees"]))]


def forest_specs(workload):
    """The forests a fit grows, in order (nuisance forests first, then tuning's small forests)."""
    prm = workload.resolved()
    unit = not workload.weighted          # the channels the fit grows (VarianceCriterion, CausalChannels)
    if workload.model == "regression":
        from forest.criteria.basic import VarianceCriterion

        c = VarianceCriterion(workload.n_outcomes, count_channel=True, rows_are_weights=unit).n_channels
        main = ForestSpec("regression", int(prm["n_estimators"]), c, True, workload.entry == "cli")
        return _tuning_spec(prm, main) + [main]
    from forest.criteria.causal import CausalCriterion
    from forest.criteria.basic import VarianceCriterion

    n_nuis = prm["nuisance_estimators"] or max(50, int(prm["n_estimators"]) // 4)
    if workload.model == "instrumental":
        # Three one-output nuisance forests (y, t, z), then the forest, priced as a
        # causal forest of its channel count (no out-of-bag pass).
        from forest.criteria.instrumental import InstrumentalCriterion

        nuisance = ForestSpec("regression", n_nuis,
                              VarianceCriterion(1, count_channel=True, rows_are_weights=unit).n_channels, True, False)
        main = ForestSpec("causal", int(prm["n_estimators"]), InstrumentalCriterion().n_channels, False,
                          workload.entry == "cli")
        return [nuisance] * (0 if workload.nuisance_given else 3) + _tuning_spec(prm, main) + [main]
    nuisance = [ForestSpec("regression", n_nuis,
                           VarianceCriterion(width, count_channel=True, rows_are_weights=unit).n_channels, True, False)
                for width in (workload.n_outcomes, workload.n_treatments)]
    main = ForestSpec("causal", int(prm["n_estimators"]),
                      CausalCriterion(workload.n_treatments, workload.n_outcomes, rows_are_weights=unit).n_channels,
                      True,
                      workload.entry == "cli")
    spec = prm.get("tune_parameters")
    centring = not workload.nuisance_given and spec is not None and (spec == "all" or "nuisance" in list(spec))
    return ([] if workload.nuisance_given else nuisance) + _tuning_spec(prm, main, centring) + [main]


def forest_geometry(workload, spec, constants=None):
    """Per-tree sizes of one forest: structure rows, estimation rows, depth, batches, nodes.

    Returns
    -------
    dict
        ``rows`` (structure rows per tree), ``est_rows``, ``depth`` (log2 of rows per
        tree over min_samples_leaf), ``mtry``, ``batches`` (list of trees per batch),
        ``nodes`` (nodes per tree), ``hist_levels`` (top levels grown from histograms
        because their nodes exceed one local-growth task), ``task_rows``.
    """
    from forest.engine.growth_options import current_engine_options
    from forest.engine.honest_forest import PROGRESS_MIN_BATCH, auto_batch_size
    from forest.engine.subsample import little_bag_size
    from forest.estimators.regression_forest import resolve_mtry, size_rules

    constants = calibration() if constants is None else constants
    prm = workload.resolved()
    n, F = float(workload.n_rows), int(workload.n_features)
    s = float(prm["max_samples"])
    honest = bool(prm["honest"])
    hf = float(prm["honesty_fraction"]) if honest else 1.0
    rows = n * s * hf
    est = n * s * (1.0 - hf) if honest else rows
    # rows a leaf ends with: half the smallest node that splits (forest.estimators.regression_forest.size_rules)
    m = max(int(size_rules(types.SimpleNamespace(**prm))[0] // 2), 1)
    depth = max(1.0, math.log2(max(rows / m, 2.0)))
    if prm["max_depth"] is not None:
        depth = min(depth, float(prm["max_depth"]))
    engine = current_engine_options()
    task_rows = engine.task_rows(F, spec.channels)
    bins = int(prm["max_bins"]) + 1
    batch = auto_batch_size(rows, F, bins, spec.channels, m, prm["max_depth"], spec.n_trees,
                            engine.local_threshold)
    if prm["batch_size"] is not None:
        batch = int(prm["batch_size"])
    if spec.progress:  # grow_honest_forest's rule: at least ten progress updates
        batch = min(batch, max(PROGRESS_MIN_BATCH, _ceil_div(spec.n_trees, 10)))
    # the causal forest's nuisance forests are RegressionForests with ci_group_size 1
    ci = little_bag_size(prm.get("ci_group_size", 1), float(prm["max_samples"])) \
        if spec.family == workload_family(workload) else 1
    if ci > 1:
        batch = max(ci, batch - batch % ci)
    batches = [min(batch, spec.n_trees - i) for i in range(0, spec.n_trees, batch)]
    nodes_per_row = constants.get("trace", {}).get(f"{spec.family}_nodes_per_row", 2.0 / (1.6 * m))
    return {"rows": rows, "est_rows": est, "depth": depth, "mtry": resolve_mtry(prm["max_features"], F),
            "batches": batches, "nodes": max(1.0, nodes_per_row * rows), "task_rows": task_rows,
            "hist_levels": max(0, math.ceil(math.log2(rows / task_rows))) if rows > task_rows else 0,
            "bins": bins}


def workload_family(workload):
    """``"gbdt"``, ``"regression"`` or ``"causal"``: the family of the main model."""
    if workload.model == "instrumental":
        return "causal"  # the same growth, priced with the causal forest's constants
    return "gbdt" if workload.model.startswith("gbdt") else workload.model


def _forest_fit_steps(w, p, constants):
    n, F = int(w.n_rows), int(w.n_features)
    n_local = _ceil_div(n, p)
    steps = [Compute("forest", "binning", n_local * F)] + _binning_collectives(n, F, p)
    steps.append(Collective("row offsets", "global_row_offset", 8))
    trace = constants.get("trace", {})
    for spec in forest_specs(w):
        g = forest_geometry(w, spec, constants)
        fam, c = spec.family, spec.channels
        row_bytes = 16 + F + 8 * c
        rec_bytes = trace.get("record_bytes_per_split", 8 * (8 + 2 * c))
        for b in g["batches"]:
            steps.append(Compute(fam, "other", b * n_local))
            local_rows = g["rows"]
            if p > 1:
                steps.append(Collective("tree totals", "allreduce", b * c * 8))
            for level in range(g["hist_levels"]):
                # nodes too big for one local-growth task: level-wise histograms, as GBDT
                # builds them (its prices, per pair of channels)
                nodes = b * 2 ** level
                steps += [Compute(fam, "histogram", b * g["rows"] / p * F * c / 2, priced_as="gbdt"),
                          Compute(fam, "split", nodes * F * g["bins"] * c / 2, priced_as="gbdt"),
                          Compute(fam, "partition", b * g["rows"] / p, priced_as="gbdt")]
                if p > 1:
                    steps.append(Collective("level histograms", "allreduce",
                                            max(nodes // 2, b) * F * g["bins"] * c * 8))
            owned = _ceil_div(b, p) if p > 1 else b
            local_depth = max(1.0, g["depth"] - g["hist_levels"])
            if p > 1:
                sent = b * g["rows"] / p * (p - 1) / p * row_bytes
                steps.append(Collective("rows to tree owners", "alltoallv", sent))
            steps.append(Compute(fam, "local", owned * local_rows * local_depth * g["mtry"]))
            if p > 1:
                steps.append(Collective("split records", "allgatherv", b * g["nodes"] / 2 * rec_bytes / p))
            steps.append(Compute(fam, "leaves", b * g["est_rows"] / p * g["depth"]))
            if p > 1:
                steps.append(Collective("node sums", "allreduce", b * g["nodes"] * c * 8))
            if spec.oob:
                steps.append(Compute(fam, "prediction", b * n_local * g["depth"]))
    if w.model == "causal":
        steps.append(Collective("average effect", "allreduce", 64))
    return steps


# ----------------------------------------------------------------------------- pricing
@dataclasses.dataclass
class Prediction:
    """A priced fit.

    Attributes
    ----------
    seconds : float
        Predicted fit wall time (the busiest rank).
    phases : dict
        Seconds per compute phase (``"family/phase"``).
    collectives : dict
        ``label -> (calls, bytes each rank sends, seconds)``.
    peak_bytes : float
        Predicted peak resident memory of one rank.
    memory : dict
        Parts of ``peak_bytes``.
    p : int
    single_core_seconds : float
        The busiest rank's compute priced on one uncontended core (before the
        pace of ``p`` ranks: :func:`measured_pace` or :meth:`Cluster.compute_factor`).
    """

    seconds: float
    phases: dict
    collectives: dict
    peak_bytes: float
    memory: dict
    p: int
    single_core_seconds: float = 0.0

    @property
    def compute_seconds(self):
        return sum(self.phases.values())

    @property
    def communication_seconds(self):
        return sum(v[2] for v in self.collectives.values())


def _bytes_sent(op, nbytes, p):
    """Bytes one rank sends in one call (bandwidth-optimal algorithms)."""
    if p == 1:
        return 0.0
    if op == "allreduce":
        return 2.0 * (p - 1) / p * nbytes
    if op in ("reduce_scatter", "allgather"):
        return (p - 1) / p * nbytes
    if op == "allgatherv":
        return (p - 1) * nbytes
    return float(nbytes)  # alltoallv (already what a rank sends), bcast, small calls


def predict(workload, p, cluster=None, constants=None):
    """Predicted fit time and peak memory per rank of ``workload`` on ``p`` ranks.

    Parameters
    ----------
    workload : Workload
    p : int
    cluster : Cluster, optional
        Default: :meth:`Cluster.this_machine`.
    constants : dict, optional
        Default: :func:`calibration`.

    Returns
    -------
    Prediction
    """
    from native import costs

    cluster = Cluster.this_machine() if cluster is None else cluster
    constants = calibration() if constants is None else constants
    prices = constants.get("phases", {})
    net = cluster.network(p, constants)
    layout = tuple(cluster.layout(p))
    steps = list(fit_steps(workload, p, constants))
    single_core, calls = {}, 0
    for step in steps:
        if isinstance(step, Compute):
            a, b = prices.get(step.priced_as or step.family, {}).get(step.phase, (0.0, 0.0))
            key = f"{step.family}/{step.phase}"
            single_core[key] = single_core.get(key, 0.0) + a * step.units + b * step.calls
        else:
            calls += step.count
    factor = measured_pace(constants, workload, p, cluster)
    if factor is None:
        # phase_s is the time between collectives on these cores, hence the speed.
        factor = cluster.compute_factor(p, sum(single_core.values()) / cluster.core_speed / (calls + 1))
    else:
        factor = factor / cluster.core_speed
    phases = {key: factor * seconds for key, seconds in single_core.items()}
    comms = {}
    for step in steps:
        if isinstance(step, Compute) or p == 1:
            continue
        seconds = step.count * _collective_seconds(step.op, step.nbytes, p, layout, net, costs)
        n_calls, sent, secs = comms.get(step.label, (0, 0.0, 0.0))
        comms[step.label] = (n_calls + step.count, sent + step.count * _bytes_sent(step.op, step.nbytes, p),
                             secs + seconds)
    total = sum(phases.values()) + sum(v[2] for v in comms.values())
    memory = peak_memory(workload, p, constants)
    return Prediction(total, phases, comms, sum(memory.values()), memory, p, sum(single_core.values()))


def _collective_seconds(op, nbytes, p, layout, net, costs):
    nbytes = max(float(nbytes), 0.0)
    if op in ("allreduce", "reduce_scatter"):
        from native.collectives import auto_plan

        alg, leader, nb = auto_plan(op, int(nbytes), list(layout), net)
        return costs.seconds(op, alg, nbytes, list(layout), net, leader=leader, node_bcast=nb or "binomial")
    if op == "alltoallv":
        # pairwise exchange: p - 1 steps of (sent / (p - 1)) bytes each, plus the counts round
        per = nbytes / max(p - 1, 1)
        return net.call_overhead + 2 * (p - 1) * net.alpha_inter + _pairwise_bytes_seconds(per, p, layout, net)
    if op == "allgatherv":
        # nbytes = one rank's block: a ring over p blocks, plus the sizes (Bruck)
        return costs.seconds("allgather", "ring", nbytes * p, layout, net) + \
            costs.seconds("allgather", "bruck", 32 * p, layout, net, call=False)
    return costs.seconds("allgather", "bruck", 8 * p, layout, net)  # small metadata calls


def _pairwise_bytes_seconds(per_message, p, layout, net):
    nodes = max(layout) + 1 if layout else 1
    if nodes == 1:
        return (p - 1) * per_message * net.beta_intra
    k = p / nodes  # ranks of a node share its link: most partners are off-node
    return (p - 1) * per_message * max(net.beta_intra, k * (1 - 1 / nodes) * net.beta_inter)


# ----------------------------------------------------------------------------- memory
def peak_memory(workload, p, constants=None):
    """Parts of the predicted peak resident memory of one rank, in bytes.

    Returns
    -------
    dict
        ``base``, ``features``, ``per_row``, ``model``, ``gathered`` (bytes).
    """
    from forest.engine.growth_options import current_engine_options, task_row_bytes

    constants = calibration() if constants is None else constants
    mem = constants.get("memory", {})
    fam = growth_family(workload)
    m = mem.get(fam, {"base": 250e6, "per_row": 200.0})
    n_local = _ceil_div(workload.n_rows, p)
    F = workload.n_features
    feature_bytes = n_local * F * (1 + (8 if workload.entry == "python" else 0))
    if workload.entry == "cli":
        feature_bytes += workload.row_group_rows * F * 8
    out = {"base": float(m["base"]), "features": float(feature_bytes), "per_row": float(m["per_row"]) * n_local,
           "model": 0.0, "gathered": 0.0}
    if fam == "forest":
        node_bytes = constants.get("trace", {}).get("node_bytes", 120.0)
        sizes, gathered = [], 0.0
        chunk = current_engine_options().local_gather_bytes
        for spec in forest_specs(workload):
            g = forest_geometry(workload, spec, constants)
            sizes.append((spec.held_trees or spec.n_trees) * g["nodes"] * node_bytes)
            row_bytes = 16 + F + 8 * spec.channels
            task = min(g["rows"], g["task_rows"]) * task_row_bytes(F, spec.channels)
            held = 0.0
            if p > 1:
                # one chunk of the batch's rows on the wire (all ranks together), held
                # four times per rank: packed to send, received, reordered, unpacked
                wire = max(g["batches"]) * g["rows"] * row_bytes
                held = 4.0 * max(min(wire, chunk), g["rows"] * row_bytes) / p
            gathered = max(gathered, held + task)
        # every forest of the fit stays referenced until it ends (the causal forest's
        # nuisance forests too), and the last one is packed once more
        out["model"] = sum(sizes) + max(sizes)
        out["gathered"] = gathered
    return out


# ----------------------------------------------------------------------------- calibration
def calibration():
    """The calibrated constants (``{}`` before the first calibration)."""
    try:
        return json.loads(CALIBRATION_PATH.read_text())
    except (OSError, ValueError):
        return {}


def phase_units(steps):
    """``{(family, phase): [units, calls]}`` summed over a step list (own prices only)."""
    out = {}
    for st in steps:
        if isinstance(st, Compute) and st.priced_as is None:
            u = out.setdefault((st.family, st.phase), [0.0, 0.0])
            u[0] += st.units
            u[1] += st.calls
    return out


def fit_prices(samples):
    """Least-squares ``(a, b)`` per phase from measured single-rank fits.

    Parameters
    ----------
    samples : list of (Workload, {phase: seconds})
        Seconds per ``forest.profiling`` phase of traced fits on one rank, one thread
        (minima over repetitions). Fits of a causal forest must have been given
        ``y_hat`` and ``t_hat`` (no nuisance forests), so that their phases are the
        causal forest's alone.

    Returns
    -------
    dict
        ``{family: {phase: [a, b]}}``; ``b`` (per call) is clipped at 0 (then ``a``
        refitted alone).
    """
    rows = {}
    for workload, measured in samples:
        steps = fit_steps(workload, 1, {})
        if workload.model == "causal":  # calibration fits skip the nuisance forests
            steps = [s for s in steps if not (isinstance(s, Compute) and s.family == "regression")]
        units = phase_units(steps)
        for (family, phase), (u, c) in units.items():
            rows.setdefault((family, phase), []).append((u, c, float(measured.get(phase, 0.0))))
    out = {}
    for (family, phase), pts in rows.items():
        a, b = _two_parameter_fit(pts)
        out.setdefault(family, {})[phase] = [a, b]
    return out


def _two_parameter_fit(points):
    """Non-negative least squares of ``t = a u + b c`` (two unknowns, tiny system)."""
    import numpy as np

    A = np.array([[u, c] for u, c, _ in points], dtype=np.float64)
    t = np.array([s for _, _, s in points], dtype=np.float64)
    if len(points) >= 2 and np.linalg.matrix_rank(A) == 2:
        (a, b), *_ = np.linalg.lstsq(A, t, rcond=None)
        if a >= 0 and b >= 0:
            return float(a), float(b)
    # one unknown: whichever column explains more, through the origin
    best = (0.0, 0.0, np.inf)
    for j in (0, 1):
        col = A[:, j]
        denom = float(col @ col)
        coef = float(col @ t) / denom if denom > 0 else 0.0
        coef = max(coef, 0.0)
        err = float(((col * coef - t) ** 2).sum())
        if err < best[2]:
            best = (coef, 0.0, err) if j == 0 else (0.0, coef, err)
    return best[0], best[1]

"""The cost model's picture of a fit (forest.cli.cost_model) against traces of real fits.

Under mpirun (K = 1..4) a small GBDT and a small regression forest are fitted inside
``forest.profiling.FitTrace``; the collectives the engine issued must be the ones
``fit_steps`` lists (counts exactly; bytes exactly where they do not depend on the data,
within a tolerance where they follow random subsamples). Pricing and calibration are
checked on synthetic constants.
"""
import numpy as np
import pytest

from forest.cli import cost_model as cm
from forest.profiling import FitTrace


def _data(n, f, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, f))
    y = (X[:, 0] + 0.5 * X[:, 1] * X[:, 2] + rng.normal(size=n) > 0).astype(np.float64)
    return X, y


def _by_label(steps):
    out = {}
    for s in steps:
        if isinstance(s, cm.Collective):
            calls, nbytes = out.get(s.label, (0, []))
            out[s.label] = (calls + s.count, nbytes + [s.nbytes])
    return out


@pytest.mark.mpi
def test_gbdt_trace_has_the_modeled_collectives(comm, rank_slice):
    from forest.estimators.gbdt import GBDTClassifier

    n, f = 6000, 6
    X, y = _data(n, f)
    params = {"n_estimators": 3, "max_leaf_nodes": 8, "early_stopping": False, "min_samples_leaf": 5,
              "random_state": 0}
    sl = rank_slice(n)
    with FitTrace() as tr:
        model = GBDTClassifier(**params).fit(X[sl], y[sl], comm=comm)
    p = comm.size
    steps = cm.fit_steps(cm.Workload("gbdt-classifier", n, f, params), p, {})
    hist = [ev for ev in tr.collectives if ev.op == "allreduce" and ev.nbytes > 1000]
    leaves = [t.n_leaves for t in model.trees_]
    if p == 1:
        assert hist == []
        return
    model_hist = _by_label(steps)
    assert leaves == [8, 8, 8]
    root_bytes = model_hist["root histograms"][1][0]
    child_bytes = model_hist["child histograms"][1][0]
    assert [ev.nbytes for ev in hist] == ([root_bytes] + [child_bytes] * 6) * 3
    sample = [ev for ev in tr.collectives if ev.op == "alltoallv"]
    assert len(sample) == 1
    # feature blocks differ by one feature between ranks
    assert sample[0].sent == pytest.approx(model_hist["binning sample"][1][0], rel=0.35)


@pytest.mark.mpi
def test_forest_trace_has_the_modeled_collectives_and_batches(comm, rank_slice):
    from forest.estimators.regression_forest import RegressionForest

    n, f = 3000, 5
    X, y = _data(n, f, seed=1)
    params = {"n_estimators": 12, "random_state": 0}
    sl = rank_slice(n)
    with FitTrace() as tr:
        RegressionForest(**params).fit(X[sl], y[sl], comm=comm, progress=tr)
    p = comm.size
    w = cm.Workload("regression", n, f, params, entry="cli")  # cli: a progress callback bounds the batches
    spec = cm.forest_specs(w)[0]
    geo = cm.forest_geometry(w, spec, {})
    assert [m.done for m in tr.marks] == list(np.cumsum(geo["batches"]))
    if p == 1:
        return
    steps = _by_label(cm.fit_steps(w, p, {}))
    evs = tr.collectives
    sizes = set(steps["tree totals"][1])
    totals = [ev.nbytes for ev in evs if ev.op == "allreduce" and ev.nbytes in sizes]
    assert totals == steps["tree totals"][1] and len(totals) == len(geo["batches"])
    moved = [ev.sent for ev in evs if ev.op == "alltoallv"][1:]  # the first one is the binning sample
    assert len(moved) == steps["rows to tree owners"][0]
    assert sum(moved) == pytest.approx(sum(steps["rows to tree owners"][1]), rel=0.25)
    first_growth = min(ev.start for ev in evs if ev.op == "allreduce" and ev.nbytes in sizes)
    # the fit's last two allgathervs gather its training-row signature (forest.training_rows: the
    # sketch's keys and counts), not split records
    records = [ev for ev in evs if ev.op == "allgatherv" and ev.start > first_growth][:-2]
    assert len(records) == steps["split records"][0]


def test_prices_are_recovered_from_exact_measurements():
    true = {"gbdt": {"histogram": [2e-9, 3e-5], "split": [1e-9, 0.0], "partition": [4e-9, 1e-5],
                     "prediction": [3e-9, 0.0], "other": [5e-9, 2e-4], "binning": [7e-9, 0.0]}}
    samples = []
    for n in (50_000, 200_000, 800_000):
        w = cm.Workload("gbdt-regressor", n, 10, {"n_estimators": 7, "early_stopping": False})
        units = cm.phase_units(cm.fit_steps(w, 1, {}))
        measured = {ph: true["gbdt"][ph][0] * u + true["gbdt"][ph][1] * c for (_, ph), (u, c) in units.items()}
        samples.append((w, measured))
    got = cm.fit_prices(samples)
    for ph, (a, b) in true["gbdt"].items():
        assert got["gbdt"][ph][0] == pytest.approx(a, rel=1e-6, abs=1e-15)
        assert got["gbdt"][ph][1] == pytest.approx(b, rel=1e-6, abs=1e-12)


def test_prediction_adds_priced_steps_and_scales_with_ranks():
    consts = {"phases": {"gbdt": {ph: [1e-8, 1e-5] for ph in
                                  ("binning", "histogram", "split", "partition", "prediction", "other")}},
              "memory": {"gbdt": {"base": 1e8, "per_row": 100.0}}}
    w = cm.Workload("gbdt-regressor", 1_000_000, 20, {"n_estimators": 10, "early_stopping": False})
    one_core = cm.Cluster(cores_per_node=1, single_node=True)
    steps = cm.fit_steps(w, 1, consts)
    by_hand = sum(1e-8 * s.units + 1e-5 * s.calls for s in steps if isinstance(s, cm.Compute))
    p1 = cm.predict(w, 1, one_core, consts)
    assert p1.seconds == pytest.approx(by_hand) and p1.collectives == {}
    # two ranks on one core: half the rows each, each at half speed, plus collectives
    p2 = cm.predict(w, 2, one_core, consts)
    assert p2.communication_seconds > 0 and set(p2.collectives) >= {"root histograms", "child histograms"}
    hist2 = [s for s in cm.fit_steps(w, 2, consts) if isinstance(s, cm.Compute) and s.phase == "histogram"]
    assert hist2[0].units == pytest.approx(
        [s for s in steps if isinstance(s, cm.Compute) and s.phase == "histogram"][0].units / 2)
    assert p2.phases["gbdt/histogram"] == pytest.approx(2 * (1e-8 * hist2[0].units + 1e-5 * hist2[0].calls))
    # on a cluster with a core per rank only the per-row part halves
    big = cm.Cluster(cores_per_node=32)
    assert cm.predict(w, 2, big, consts).phases["gbdt/histogram"] == pytest.approx(
        1e-8 * hist2[0].units + 1e-5 * hist2[0].calls)
    mem = cm.peak_memory(w, 4, consts)
    assert mem["base"] == 1e8 and mem["per_row"] == 100.0 * 250_000
    assert mem["features"] == 250_000 * 20 * 9  # float64 features held by the caller + uint8 codes


def test_cluster_layout_and_oversubscription():
    c = cm.Cluster(cores_per_node=4, ranks_per_node=2)
    assert c.layout(5) == [0, 0, 1, 1, 2]
    assert c.oversubscription(8) == 1.0
    assert cm.Cluster(cores_per_node=2, single_node=True).oversubscription(4) == 2.0
    two = cm.Cluster(cores_per_node=2, single_node=True)
    assert [two.busiest_core(p) for p in (1, 2, 3, 4, 5)] == [1.0, 1.0, 2.0, 2.0, 3.0]
    assert [two.compute_factor(p) for p in (2, 3, 4)] == [1.0, 2.0, 2.0]   # 3 ranks: the pace of the shared core
    assert cm.Cluster(cores_per_node=32, threads_per_rank=4).busiest_core(8) == 1.0


def test_oversubscribed_step_latency_by_rank_count():
    assert cm._oversubscribed_alpha(None, 3) is None
    assert cm._oversubscribed_alpha(1.5e-5, 3) == 1.5e-5                  # older files: one number
    measured = {"3": 2e-3, "4": 1e-3}
    assert cm._oversubscribed_alpha(measured, 3) == 2e-3
    assert cm._oversubscribed_alpha(measured, 8) == 2e-3                  # not measured: the largest
    consts = {"oversubscribed_alpha": measured}
    net = cm.Cluster(cores_per_node=2, single_node=True).network(4, consts)
    assert net.alpha_intra == 1e-3
    assert cm.Cluster(cores_per_node=2, single_node=True).network(2, consts).alpha_intra < 1e-3
    assert cm.Cluster(cores_per_node=32, threads_per_rank=4).rpn(100) == 8
    with pytest.raises(ValueError, match="model"):
        cm.Workload("svm", 10, 2)


def test_measured_pace_replaces_the_sharing_formula_on_this_machine():
    consts = {"phases": {"gbdt": {ph: [1e-8, 1e-5] for ph in
                                  ("binning", "histogram", "split", "partition", "prediction", "other")}},
              "memory": {"gbdt": {"base": 1e8, "per_row": 100.0}},
              "pace": {"gbdt": {"3": 2.7}, "forest": {"3": 1.6}}}
    w = cm.Workload("gbdt-regressor", 1_000_000, 20, {"n_estimators": 10, "early_stopping": False})
    here = cm.Cluster.this_machine()
    p3 = cm.predict(w, 3, here, consts)
    # compute = the measured pace times the busiest rank's single-core seconds
    assert p3.compute_seconds == pytest.approx(2.7 * p3.single_core_seconds)
    assert p3.seconds == pytest.approx(p3.compute_seconds + p3.communication_seconds)
    assert cm.measured_pace(consts, w, 3, here) == 2.7
    forest = cm.Workload("causal", 1000, 5)
    assert cm.measured_pace(consts, forest, 3, here) == 1.6
    # not measured (p = 4, p = 1) or not this machine: the sharing formula
    assert cm.measured_pace(consts, w, 4, here) is None and cm.measured_pace(consts, w, 1, here) is None
    big = cm.Cluster(cores_per_node=32)
    assert cm.measured_pace(consts, w, 3, big) is None
    p4 = cm.predict(w, 4, here, consts)
    assert p4.compute_seconds == pytest.approx(here.compute_factor(4, None) * p4.single_core_seconds, rel=0.5)


def test_core_speed_scales_compute_only():
    consts = {"phases": {"gbdt": {ph: [1e-8, 1e-5] for ph in
                                  ("binning", "histogram", "split", "partition", "prediction", "other")}},
              "memory": {"gbdt": {"base": 1e8, "per_row": 100.0}},
              "pace": {"gbdt": {"3": 2.7}}}
    w = cm.Workload("gbdt-regressor", 1_000_000, 20, {"n_estimators": 10, "early_stopping": False})
    for make in (lambda s: cm.Cluster(cores_per_node=32, core_speed=s),
                 lambda s: cm.Cluster.this_machine(core_speed=s)):
        for p in (1, 3, 8):
            base, fast = cm.predict(w, p, make(1.0), consts), cm.predict(w, p, make(2.0), consts)
            assert fast.compute_seconds == pytest.approx(base.compute_seconds / 2)
            assert fast.communication_seconds == pytest.approx(base.communication_seconds)
            assert fast.single_core_seconds == pytest.approx(base.single_core_seconds)
            assert fast.peak_bytes == base.peak_bytes
    assert "0.5x the calibrated speed" in cm.Cluster(core_speed=0.5).describe()
    for bad in (0, -1.0, float("nan"), float("inf"), "2"):
        with pytest.raises(ValueError, match="core_speed"):
            cm.Cluster(core_speed=bad)


def test_given_nuisance_estimates_grow_no_nuisance_forest():
    full = cm.forest_specs(cm.Workload("causal", 10_000, 5, {"n_estimators": 40}))
    given = cm.forest_specs(cm.Workload("causal", 10_000, 5, {"n_estimators": 40}, nuisance_given=True))
    assert [s.family for s in full] == ["regression", "regression", "causal"]
    assert given == full[-1:]
    iv = cm.forest_specs(cm.Workload("instrumental", 10_000, 5, nuisance_given=True))
    assert [s.family for s in iv] == ["causal"]
    assert len(cm.forest_specs(cm.Workload("instrumental", 10_000, 5))) == 4


def test_tuning_prices_its_small_forests():
    base = {"n_estimators": 40, "tune_num_trees": 20, "tune_num_reps": 8}
    plain = cm.Workload("regression", 10_000, 5, dict(base))
    tuned = cm.Workload("regression", 10_000, 5, dict(base, tune_parameters="all"))
    specs = cm.forest_specs(tuned)
    assert [s.n_trees for s in specs] == [(8 + 2) * 20, 40] and specs[0].oob and specs[0].held_trees == 40
    assert cm.forest_specs(plain) == specs[-1:]
    assert cm.predict(tuned, 1).seconds > cm.predict(plain, 1).seconds
    causal = cm.forest_specs(cm.Workload("causal", 10_000, 5, dict(base, tune_parameters=["alpha"])))
    assert [s.family for s in causal] == ["regression", "regression", "causal", "causal"]
    assert causal[2].n_trees == (8 + 2) * 20
    # the causal forest's centring choice (part of "all", or "nuisance"): one more pair of halves, at most
    for spec in ("all", ["alpha", "nuisance"]):
        assert cm.forest_specs(cm.Workload("causal", 10_000, 5, dict(base, tune_parameters=spec)))[2].n_trees == \
            (8 + 3) * 20
    given = cm.forest_specs(cm.Workload("causal", 10_000, 5, dict(base, tune_parameters="all"), nuisance_given=True))
    assert given[0].n_trees == (8 + 2) * 20  # no forest-made centring to correct

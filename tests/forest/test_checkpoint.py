"""Checkpoint and resume through the estimators' ``fit(checkpoint=...)``.

A crash is simulated by a progress callback that raises on every rank at the same tree
(after the checkpoint of that batch is written), so mpi tests cannot hang; the kill of
a real rank by SIGKILL is tested in tests/cli/test_checkpoint_cli.py.
"""
import os
import shutil

import numpy as np
import pytest

from native.comm import SelfCommunicator
from forest import CausalForest, GBDTClassifier, GBDTRegressor, ProbabilityForest, RegressionForest
from forest.io import model_io
from forest.io.checkpoint import MANIFEST_NAME, Checkpoint, CheckpointError, CheckpointManifest
from forest.engine.tree import unpack_trees

from resume_helpers import N, Crash, crash_at, data

SELF = SelfCommunicator()

MODELS = {
    "regression": lambda: RegressionForest(n_estimators=24, batch_size=4, random_state=2),
    "probability": lambda: ProbabilityForest(n_estimators=24, batch_size=4, random_state=2, oob_score=True),
    "causal": lambda: CausalForest(n_estimators=16, batch_size=4, nuisance_estimators=8, random_state=2),
    "gbdt-regressor": lambda: GBDTRegressor(n_estimators=30, max_leaf_nodes=7, early_stopping=True,
                                            n_iter_no_change=50, random_state=1),
    "gbdt-classifier": lambda: GBDTClassifier(n_estimators=20, max_leaf_nodes=7, early_stopping=True,
                                              n_iter_no_change=50, random_state=1),
    "gbdt-quantized": lambda: GBDTRegressor(n_estimators=20, max_leaf_nodes=7, early_stopping=True,
                                            n_iter_no_change=50, random_state=1, quantized=True),
}


def fit(kind, comm, sl=slice(None), est=None, **kwargs):
    X, t, y = data()
    est = MODELS[kind]() if est is None else est
    if kind == "causal":
        return est.fit(X[sl], t[sl], y[sl], comm=comm, **kwargs)
    if kind == "probability":   # text labels, the out-of-bag sums resumed too
        return est.fit(X[sl], np.array(["low", "mid", "high"])[(y[sl] > 1.0).astype(int) + (y[sl] > 2.5)],
                       comm=comm, **kwargs)
    if kind == "gbdt-classifier":
        return est.fit(X[sl], (y[sl] > 1.0).astype(int) + (y[sl] > 2.5), comm=comm, **kwargs)
    return est.fit(X[sl], y[sl], comm=comm, **kwargs)


def every(kind):
    return 4 if kind.startswith("gbdt") else 10


def trees_of(est):
    return list(est.trees_) if hasattr(est, "trees_") else unpack_trees(est.estimators_)


@pytest.mark.mpi
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_resume_on_the_same_ranks_is_bitwise_the_uninterrupted_fit(kind, comm, rank_slice, tmp_path, same_model_file):
    sl = rank_slice(N)
    ckpt = Checkpoint(tmp_path / "ckpt", every=every(kind), log=lambda line: None)
    with pytest.raises(Crash):
        fit(kind, comm, sl, checkpoint=ckpt, progress=crash_at(8))
    resumed = fit(kind, comm, sl, checkpoint=Checkpoint(tmp_path / "ckpt", every=every(kind)))
    reference = fit(kind, comm, sl)
    assert same_model_file(resumed, reference)


@pytest.mark.mpi
@pytest.mark.parametrize("kind", ["causal", "gbdt-regressor"])
def test_k_rank_checkpoint_resumed_on_one_rank(kind, comm, rank_slice, tmp_path):
    """Crash on K ranks, resume on rank 0 alone: the K-rank trees are kept bit for bit,
    the later ones grown on one rank have the uninterrupted splits."""
    k_dir = tmp_path / "k"
    with pytest.raises(Crash):
        fit(kind, comm, rank_slice(N), checkpoint=Checkpoint(k_dir, every=every(kind)), progress=crash_at(8))
    k_reference = fit(kind, comm, rank_slice(N))        # uninterrupted on K ranks (last collective)
    if comm.rank != 0:
        return
    stage = "boosting" if kind.startswith("gbdt") else "forest"
    written = model_io.load(str(k_dir / MANIFEST_NAME), expect=CheckpointManifest).stages[stage]["n_done"]
    resumed = fit(kind, SELF, checkpoint=Checkpoint(k_dir, log=lambda line: None))
    one_reference = fit(kind, SELF)
    kept, grown, one = trees_of(resumed), trees_of(k_reference), trees_of(one_reference)
    assert 8 <= written < len(kept) == len(grown) == len(one)
    assert kept[:written] == grown[:written]
    for s, t in zip(kept, one):
        for x, y in zip(s.structure(), t.structure()):
            np.testing.assert_array_equal(x, y)
        np.testing.assert_allclose(s.value, t.value, rtol=1e-9, atol=1e-12)


@pytest.mark.mpi
def test_write_error_raises_on_every_rank(comm, rank_slice, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    with pytest.raises(CheckpointError) as info:
        fit("regression", comm, rank_slice(N), checkpoint=str(blocker / "ckpt"))
    assert "a_file" in str(info.value)


def test_other_parameters_data_or_estimator_are_refused(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    fit("regression", SELF, checkpoint=ckpt)
    with pytest.raises(CheckpointError, match=r"other parameters \(max_depth=None there, 4 here\); pass "
                                              r"restart=True to discard it"):
        fit("regression", SELF, est=RegressionForest(n_estimators=24, batch_size=4, random_state=2, max_depth=4),
            checkpoint=ckpt)
    X, _, y = data()
    with pytest.raises(CheckpointError, match="other data .*different values"):
        RegressionForest(n_estimators=24, batch_size=4, random_state=2).fit(X, y + 1e-9, comm=SELF, checkpoint=ckpt)
    with pytest.raises(CheckpointError, match="other data .*600 rows x 4 features there, 599 rows"):
        RegressionForest(n_estimators=24, batch_size=4, random_state=2).fit(X[1:], y[1:], comm=SELF,
                                                                            checkpoint=ckpt)
    with pytest.raises(CheckpointError, match="is of a RegressionForest fit, not a GBDTRegressor"):
        fit("gbdt-regressor", SELF, checkpoint=ckpt)
    # warm_start is the one parameter that may change
    fit("regression", SELF, est=RegressionForest(n_estimators=24, batch_size=4, random_state=2, warm_start=True),
        checkpoint=ckpt)
    # restart discards it
    lines = []
    fit("gbdt-regressor", SELF, checkpoint=Checkpoint(ckpt, restart=True, log=lines.append))
    assert lines == [] and not any(name.startswith("forest-") for name in os.listdir(ckpt))
    fit("gbdt-regressor", SELF, checkpoint=Checkpoint(ckpt, log=lines.append))
    assert lines == [f"resuming from 30 of 30 trees (checkpoint {ckpt})"]


def test_damaged_checkpoint_is_refused_clearly(tmp_path):
    ckpt = tmp_path / "ckpt"
    with pytest.raises(Crash):
        fit("regression", SELF, checkpoint=str(ckpt), progress=crash_at(8))
    segment = sorted(p for p in os.listdir(ckpt) if p.startswith("forest-"))[0]
    (ckpt / segment).write_bytes((ckpt / segment).read_bytes()[:100])
    with pytest.raises(CheckpointError, match="is damaged .*restart=True"):
        fit("regression", SELF, checkpoint=str(ckpt))
    (ckpt / MANIFEST_NAME).write_bytes(b"PK\x03\x04 garbage")
    with pytest.raises(CheckpointError, match="cannot be read"):
        fit("regression", SELF, checkpoint=str(ckpt))
    fit("regression", SELF, checkpoint=Checkpoint(ckpt, restart=True))


def test_stray_files_are_left_alone_and_orphans_removed(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "notes.txt").write_text("mine")
    (ckpt / "forest-notes.ckpt").write_text("mine too")
    with pytest.raises(Crash):
        fit("regression", SELF, checkpoint=str(ckpt), progress=crash_at(8))
    # what a crash between a segment's write and the manifest's (or mid-write) leaves
    shutil.copy(ckpt / "forest-0000004-0000008.ckpt", ckpt / "forest-0000100-0000104.ckpt")
    (ckpt / ".manifest.ckpt.x1y2.tmp").write_bytes(b"partial")
    with pytest.raises(Crash):
        fit("regression", SELF, checkpoint=Checkpoint(ckpt, log=lambda line: None), progress=crash_at(12))
    assert sorted(os.listdir(ckpt)) == ["forest-0000000-0000004.ckpt", "forest-0000004-0000008.ckpt",
                                        "forest-0000008-0000012.ckpt", "forest-notes.ckpt", MANIFEST_NAME,
                                        "notes.txt"]


def test_gbdt_without_random_state_resumes_with_the_drawn_seed(tmp_path, same_model_file):
    est = GBDTRegressor(n_estimators=16, max_leaf_nodes=7, early_stopping=True, n_iter_no_change=50)
    with pytest.raises(Crash):
        fit("gbdt-regressor", SELF, est=est, checkpoint=Checkpoint(tmp_path, every=4), progress=crash_at(5))
    seed = model_io.load(str(tmp_path / MANIFEST_NAME), expect=CheckpointManifest).seed
    resumed = fit("gbdt-regressor", SELF, est=GBDTRegressor(**est.get_params()),
                  checkpoint=Checkpoint(tmp_path, every=4, log=lambda line: None))
    reference = fit("gbdt-regressor", SELF, est=GBDTRegressor(**dict(est.get_params(), random_state=seed)))
    assert resumed._random_seed == seed
    assert resumed.trees_ == reference.trees_
    np.testing.assert_array_equal(resumed.validation_loss_, reference.validation_loss_)


def test_gbdt_that_stopped_early_resumes_as_stopped(tmp_path, same_model_file):
    make = lambda: GBDTRegressor(n_estimators=300, learning_rate=0.5, max_leaf_nodes=7, early_stopping=True,  # noqa
                                 n_iter_no_change=3, random_state=4)
    reference = fit("gbdt-regressor", SELF, est=make())
    assert reference.n_iter_ < 300
    with pytest.raises(Crash):
        fit("gbdt-regressor", SELF, est=make(), checkpoint=Checkpoint(tmp_path, every=50),
            progress=crash_at(reference.n_iter_))
    lines = []
    resumed = fit("gbdt-regressor", SELF, est=make(), checkpoint=Checkpoint(tmp_path, log=lines.append))
    assert lines == [f"resuming from {reference.n_iter_} of 300 trees (checkpoint {tmp_path})"]
    assert same_model_file(resumed, reference)


def test_resumed_causal_forest_reports_the_nuisance_stages(tmp_path, same_model_file):
    import forest.estimators.regression_forest as rf

    calls, real = [], rf.grow_honest_forest

    def second_nuisance_crashes(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            hook = kwargs["on_batch"]

            def on_batch(new, done, batch):
                hook(new, done, batch)
                raise Crash("in the second nuisance forest")
            kwargs["on_batch"] = on_batch
        return real(*args, **kwargs)

    rf.grow_honest_forest = second_nuisance_crashes
    try:
        with pytest.raises(Crash):
            fit("causal", SELF, checkpoint=str(tmp_path))
    finally:
        rf.grow_honest_forest = real
    lines = []
    resumed = fit("causal", SELF, checkpoint=Checkpoint(tmp_path, log=lines.append))
    assert lines == [f"resuming from 0 of 16 trees (checkpoint {tmp_path}); nuisance-y done, "
                     f"nuisance-t 4 of 8 trees"]
    assert same_model_file(resumed, fit("causal", SELF))


def test_clustered_forest_resumes_and_other_clusters_are_refused(tmp_path, same_model_file):
    X, _, y = data()
    clusters = np.arange(N) // 7
    make = lambda: RegressionForest(n_estimators=16, batch_size=4, random_state=3)  # noqa: E731
    with pytest.raises(Crash):
        make().fit(X, y, clusters=clusters, comm=SELF, checkpoint=str(tmp_path), progress=crash_at(8))
    with pytest.raises(CheckpointError, match="other data"):
        make().fit(X, y, clusters=np.arange(N) // 8, comm=SELF, checkpoint=str(tmp_path))
    resumed = make().fit(X, y, clusters=clusters, comm=SELF, checkpoint=Checkpoint(tmp_path, log=lambda line: None))
    assert same_model_file(resumed, make().fit(X, y, clusters=clusters, comm=SELF))

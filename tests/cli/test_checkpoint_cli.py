"""forest-train --checkpoint: a job whose rank is killed by SIGKILL mid-fit resumes, on
another rank count too, and writes the model of an uninterrupted run; a checkpoint of
other data or parameters is refused with one line; --restart discards it."""
import os
import signal
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import make_table, rank_pid, run_mpi, start_mpi, tool
# Loading a checkpoint file checks it through the estimators' modules; import them now,
# so the first poll of a running job's manifest does not spend seconds importing
# scikit-learn while the job runs past the point where it should be killed.
import forest.estimators.causal_forest  # noqa: F401
import forest.estimators.gbdt  # noqa: F401
from forest.io import model_io
from forest.io.checkpoint import MANIFEST_NAME, CheckpointManifest, TreeSegment
from forest.cli import train
from forest.engine.tree import unpack_trees

pytestmark = pytest.mark.skipif(not os.path.exists(os.path.join(os.path.dirname(sys.executable), "mpirun")),
                                reason="mpirun from the mpich wheel is not installed")

@pytest.fixture(scope="module")
def parquet_4k(tmp_path_factory):
    """4000 rows in 8 row groups (ranks hold different row counts at -np 2 and -np 3)."""
    path = str(tmp_path_factory.mktemp("ckpt") / "d.parquet")
    pq.write_table(make_table(4000, seed=5), path, row_group_size=500)
    return path


def causal_args(n_trees):
    return ["--treatment", "t", "--outcome", "y", "--features", "a", "b", "c", "--n-estimators", str(n_trees),
            "--param", "batch_size=8", "--param", "nuisance_estimators=16"]


def gbdt_args(n_iter):
    # Early stopping on (validation rows drawn from the seed, losses carried over) but
    # never triggered, so the job is still running when it is killed.
    return ["--model", "gbdt-regressor", "--outcome", "y", "--features", "a", "b", "c", "--n-estimators",
            str(n_iter), "--param", "early_stopping=true", "--param", "n_iter_no_change=1000"]


def stage_done(directory, stage):
    """Trees of ``stage`` recorded in the directory's manifest (0 while there is none)."""
    path = os.path.join(directory, MANIFEST_NAME)
    if not os.path.exists(path):
        return 0
    try:
        return model_io.load(path, expect=CheckpointManifest).stages.get(stage, {}).get("n_done", 0)
    except model_io.ModelFormatError:
        return 0


def kill_rank_mid_fit(np_, args, directory, stage, at_least, rank=1, timeout=300):
    """Run a job, SIGKILL ``rank`` once ``stage`` has ``at_least`` trees checkpointed; return (done, stderr)."""
    proc = start_mpi(np_, args)
    deadline = time.monotonic() + timeout
    killed = False
    while proc.poll() is None and time.monotonic() < deadline:
        if stage_done(directory, stage) >= at_least:
            pid = rank_pid(proc.pid, rank)
            if pid is not None:
                os.kill(pid, signal.SIGKILL)
                killed = True
                break
        time.sleep(0.02)
    try:
        _, err = proc.communicate(timeout=max(10, deadline - time.monotonic()))
    except Exception:  # noqa: BLE001 - a hung job must not hang the suite
        proc.kill()
        _, err = proc.communicate()
    assert killed, f"the job ended before it could be killed (rc {proc.returncode}):\n{err[-2000:]}"
    assert proc.returncode != 0, err[-2000:]
    return stage_done(directory, stage), err


def segments_trees(directory, stage, n):
    """The first ``n`` trees of ``stage`` as written in the checkpoint's segment files."""
    manifest = model_io.load(os.path.join(directory, MANIFEST_NAME), expect=CheckpointManifest)
    trees = []
    for name, lo, hi in manifest.stages[stage]["segments"]:
        trees.extend(unpack_trees(model_io.load(os.path.join(directory, name), expect=TreeSegment).trees))
    return trees[:n]


def test_causal_killed_at_np3_resumes_at_np2(parquet_4k, tmp_path):
    ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "resumed.model")
    command = [tool("forest-train"), parquet_4k, "--checkpoint", ckpt] + causal_args(120)
    done, _ = kill_rank_mid_fit(3, command + ["--out", str(tmp_path / "never.model"), "--no-progress"], ckpt,
                                "forest", at_least=16)
    assert 16 <= done < 120
    assert not os.path.exists(tmp_path / "never.model")
    written = segments_trees(ckpt, "forest", done)
    # The rerun on two ranks resumes (with its progress bar starting there) and finishes.
    proc = run_mpi(2, command + ["--out", out], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"forest-train: resuming from {done} of 120 trees (checkpoint {ckpt}); nuisance-t done, " \
           f"nuisance-y done" in proc.stderr
    first_bar = proc.stderr[proc.stderr.index("/120") - 8:proc.stderr.index("/120")]
    assert first_bar.endswith(f" {done}"), first_bar
    resumed = model_io.load(out)
    # The trees written before the kill are kept bit for bit ...
    for kept, tree in zip(written, unpack_trees(resumed.estimators_)):
        assert kept == tree
    # ... and the whole forest is the uninterrupted one: same splits everywhere, values
    # up to the summation order of another rank count.
    reference = str(tmp_path / "reference.model")
    assert train.main([parquet_4k, "--out", reference, "--no-progress"] + causal_args(120)) == 0
    ref = model_io.load(reference)
    for key in ("feature", "bin_threshold", "missing_left", "left", "right", "tree_offsets"):
        np.testing.assert_array_equal(resumed.estimators_[key], ref.estimators_[key])
    np.testing.assert_allclose(resumed.estimators_["value"], ref.estimators_["value"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(resumed.ate_, ref.ate_, rtol=1e-9)


def test_gbdt_killed_resumes_bitwise(parquet_4k, tmp_path, same_model_file):
    ckpt = str(tmp_path / "ckpt")
    # No --random-state: the seed drawn by the killed run must be the one the rerun uses.
    command = [tool("forest-train"), parquet_4k, "--checkpoint", ckpt, "--checkpoint-every", "5",
               "--no-progress"] + gbdt_args(300)
    done, _ = kill_rank_mid_fit(2, command + ["--out", str(tmp_path / "never.model")], ckpt, "boosting",
                                at_least=20)
    assert 20 <= done < 300 and done % 5 == 0
    resumed, uninterrupted = str(tmp_path / "resumed.model"), str(tmp_path / "uninterrupted.model")
    proc = run_mpi(2, command + ["--out", resumed], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resuming from {done} of 300 trees" in proc.stderr
    a = model_io.load(resumed)
    proc = run_mpi(2, [tool("forest-train"), parquet_4k, "--out", uninterrupted, "--no-progress",
                       "--random-state", str(a.random_state)] + gbdt_args(300), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    b = model_io.load(uninterrupted)
    assert a.n_iter_ == 300 and len(a.validation_loss_) == 301
    assert a.trees_ == b.trees_
    assert same_model_file(a, b)


def test_other_data_or_parameters_are_refused_and_restart_discards(small_parquet, tmp_path, capsys, same_model_file):
    ckpt = str(tmp_path / "ckpt")
    base = [small_parquet, "--checkpoint", ckpt, "--no-progress", "--model", "regression", "--outcome", "y",
            "--features", "a", "b", "--n-estimators", "16"]
    assert train.main(base + ["--out", str(tmp_path / "a.model")]) == 0
    capsys.readouterr()
    assert train.main(base + ["--out", str(tmp_path / "b.model"), "--max-depth", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"forest-train: error: checkpoint in {ckpt!r} was written with other parameters "
                   f"(max_depth=None there, 3 here); rerun with --restart to discard it"]
    other = str(tmp_path / "other.parquet")
    table = pq.read_table(small_parquet)
    pq.write_table(table.set_column(table.schema.get_field_index("y"), "y", pa.array(table["y"].to_numpy() * 2.0)), other)
    assert train.main([other] + base[1:] + ["--out", str(tmp_path / "c.model")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "written for other data (same shape (400 rows x 2 features) but different values" \
        in err[0] and "--restart" in err[0], err
    assert train.main([other] + base[1:] + ["--out", str(tmp_path / "c.model"), "--restart"]) == 0
    assert "resuming" not in capsys.readouterr().err
    assert train.main([other] + base[1:] + ["--out", str(tmp_path / "d.model")]) == 0
    assert f"resuming from 16 of 16 trees (checkpoint {ckpt})" in capsys.readouterr().err
    a, d = model_io.load(str(tmp_path / "c.model")), model_io.load(str(tmp_path / "d.model"))
    assert same_model_file(a, d)
    assert train.main(base + ["--out", str(tmp_path / "e.model"), "--restart", "--checkpoint-every", "0"]) == 2
    assert train.main([small_parquet, "--restart", "--out", str(tmp_path / "f.model"), "--outcome", "y",
                       "--treatment", "t"]) == 2
    assert "--restart discards a checkpoint: give --checkpoint DIR too" in capsys.readouterr().err

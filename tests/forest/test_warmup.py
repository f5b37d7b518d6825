"""Cold start (issue 11): forest-warmup, the compile message and phase, one compile per node.

Each test that needs an empty Numba cache gets its own directory (``NUMBA_CACHE_DIR``)
and compiles the boosting kernels there (the cheapest set, ~10 s of CPU); evidence of
"compiles nothing" is Numba's own compile events for histforest's dispatchers, counted
by ``tests/forest/compile_probe.py`` in the child processes.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forest.cli import warmup

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BIN = os.path.dirname(sys.executable)
PROBE = os.path.join(HERE, "compile_probe.py")


def _env(cache_dir, threads=1):
    return dict(os.environ, NUMBA_CACHE_DIR=str(cache_dir), NUMBA_NUM_THREADS=str(threads), OMP_NUM_THREADS="1",
                PYTHONUNBUFFERED="1")


def _probes(stdout):
    return sorted((json.loads(line[len("PROBE "):]) for line in stdout.splitlines() if line.startswith("PROBE ")),
                  key=lambda r: r["rank"])


def test_variants_cover_every_model_and_reject_unknown_names():
    assert set(warmup.MODEL_VARIANTS) == {"causal", "regression", "gbdt-regressor", "gbdt-classifier", "instrumental",
                                          "quantile", "survival", "causal-survival", "probability"}
    from forest.cli.train import MODELS
    assert set(warmup.MODEL_VARIANTS) == set(MODELS)  # every model forest-train fits can be warmed up
    assert warmup.variants_for("instrumental") == ("instrumental",)
    assert warmup.variants_for("gbdt-classifier", quantized=True) == ("gbdt-classifier-quantized",)
    for variants in warmup.MODEL_VARIANTS.values():
        assert variants and set(variants) <= set(warmup.VARIANTS)
    assert warmup.variants_for("causal", [0, 1], "int8") == ("causal-binary",)
    assert warmup.variants_for("causal", [0, 1, 2], "int64") == ("causal-multiarm",)
    assert warmup.variants_for("causal", [0.1, 0.5, 0.9], "double") == ("causal-continuous",)
    assert warmup.variants_for("gbdt-regressor") == ("gbdt-regressor",)
    with pytest.raises(ValueError, match="unknown warm-up variant"):
        warmup.warm_up(["gbdt-nonsense"])


def test_forest_warmup_fills_a_fresh_cache_so_the_first_fit_compiles_nothing(tmp_path):
    env = _env(tmp_path / "cache")

    def run(*args):
        return subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=900, cwd=ROOT)

    warm = run(os.path.join(BIN, "forest-warmup"), "--model", "gbdt-classifier")
    after = run(sys.executable, PROBE, "fit", "gbdt-classifier")
    # The probe does see compiles: the regressor's loss kernels were not warmed up.
    other = run(sys.executable, PROBE, "fit", "gbdt-regressor")
    again = run(os.path.join(BIN, "forest-warmup"), "--model", "gbdt-classifier")
    assert warm.returncode == 0, warm.stderr[-2000:]
    assert "gbdt-classifier:" in warm.stderr and "0 of 1 variant(s) already warm" in warm.stderr
    assert after.returncode == 0, after.stderr[-2000:]
    assert _probes(after.stdout)[0]["fit"] == []
    assert other.returncode == 0, other.stderr[-2000:]
    assert len(_probes(other.stdout)[0]["fit"]) > 0
    assert again.returncode == 0 and "1 of 1 variant(s) already warm" in again.stderr


def _table(path, n=600, seed=5):
    rng = np.random.default_rng(seed)
    a, b, c = rng.normal(size=(3, n))
    c[rng.uniform(size=n) < 0.05] = np.nan
    pq.write_table(pa.table({"a": a, "b": b, "c": c, "y": a + 0.5 * rng.normal(size=n)}), path)
    return path


@pytest.mark.parametrize("nprocs", [2])
def test_forest_train_announces_compiling_once_and_times_it_as_a_phase(tmp_path, nprocs):
    data = _table(tmp_path / "d.parquet")
    cmd = [os.path.join(BIN, "mpirun"), "-np", str(nprocs), os.path.join(BIN, "forest-train"), str(data),
           "--model", "gbdt-regressor", "--outcome", "y", "--n-estimators", "3", "--no-progress", "--verbose"]
    env = _env(tmp_path / "cache")
    cold = subprocess.run(cmd + ["--out", str(tmp_path / "a.model")], env=env, capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    warm = subprocess.run(cmd + ["--out", str(tmp_path / "b.model")], env=env, capture_output=True, text=True,
                          timeout=900, cwd=ROOT)
    assert cold.returncode == 0, cold.stderr[-2000:]
    assert cold.stderr.count(warmup.COMPILE_MESSAGE) == 1
    phase_rows = [line.split() for line in cold.stderr.splitlines() if line.startswith("compile ")]
    assert len(phase_rows) == 1 and float(phase_rows[0][1]) > 0.5
    assert warm.returncode == 0, warm.stderr[-2000:]
    assert warmup.COMPILE_MESSAGE not in warm.stderr


@pytest.mark.parametrize("nprocs", [3])
def test_ranks_of_a_node_compile_once_and_the_others_load(tmp_path, nprocs):
    """mpirun with an empty cache: rank 0 compiles, the others compile nothing in the
    warm-up step and nothing in the distributed fit after it."""
    out = subprocess.run([os.path.join(BIN, "mpirun"), "-np", str(nprocs), sys.executable, PROBE, "node",
                          "gbdt-regressor"], env=_env(tmp_path / "cache"), capture_output=True, text=True,
                         timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    probes = _probes(out.stdout)
    assert [p["rank"] for p in probes] == list(range(nprocs))
    assert probes[0]["announced"] == [warmup.COMPILE_MESSAGE]
    assert len(probes[0]["warmup"]) > 0
    for p in probes[1:]:
        assert p["announced"] == [] and p["warmup"] == [], p
    for p in probes:
        assert p["fit"] == [], p


def test_causal_warmup_covers_fits_with_given_nuisance_estimates():
    """A causal forest with its nuisance forests compiles the paired kernel; one given
    ``y_hat`` / ``t_hat`` grows no nuisance forest and needs the causal record alone."""
    from forest.engine import local_growth

    assert "causal-given" in warmup.MODEL_VARIANTS["causal"]
    warmup._fit_variant("causal-given")
    # The fit runs the serial or the parallel subtree kernel by its thread count (which
    # depends on what ran before in this worker); either carries the record type.
    sigs = [str(s) for kernel in (local_growth._grow_trees, local_growth._grow_trees_parallel)
            for s in kernel.signatures]
    assert any("CausalScalarRecord" in s and "PairedRecord" not in s for s in sigs)


def test_forest_warmup_reaches_the_batch_out_of_bag_walk(monkeypatch):
    """Big forest fits sum out-of-bag values by the batch walk (the kernels predict
    shares); the warm-up's small fits must reach it too, or a big first fit compiles it."""
    from forest.engine import predictor

    taken = []
    original = predictor._oob_binned_batch

    def recording(*args):
        taken.append(original(*args))
        return taken[-1]

    monkeypatch.setattr(predictor, "_oob_binned_batch", recording)
    monkeypatch.setattr(warmup, "_stamp", lambda variant: None)
    done = warmup.warm_up(["regression"])
    assert isinstance(done["regression"], float), done
    assert taken and not any(taken)  # small fits: the blocked walk
    taken.clear()
    done = warmup.warm_up(["batch-walk"])
    assert isinstance(done["batch-walk"], float), done
    assert taken and all(taken)
    assert predictor.OOB_BATCH_MIN_PAIRS > 0  # restored after the warm-up
    # forest-train asks for it when its fit is big enough to take that route
    big = predictor.OOB_BATCH_MIN_PAIRS
    assert warmup.variants_for("regression", n_rows=big // 100, n_estimators=100) == ("regression", "batch-walk")
    assert warmup.variants_for("regression", n_rows=big // 100 - 1, n_estimators=100) == ("regression",)
    # a causal fit's nuisance forests have at least 50 trees
    assert warmup.variants_for("causal", [0, 1], "int8", n_rows=big // 50, n_estimators=10) == \
        ("causal-binary", "batch-walk")
    assert warmup.variants_for("gbdt-classifier", n_rows=10 ** 9, n_estimators=1000) == ("gbdt-classifier",)

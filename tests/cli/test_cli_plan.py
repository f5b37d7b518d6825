"""forest-train --plan and the memory check before a run."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from forest.cli import plan, train

from cli_helpers import make_table, run_mpi, tool

CAUSAL = ["--treatment", "t", "--outcome", "y", "--features", "a", "b", "c", "--n-estimators", "4", "--no-progress"]


def test_plan_prints_the_estimate_and_writes_nothing(small_parquet, tmp_path, capsys):
    out = str(tmp_path / "m.model")
    code = train.main([small_parquet, "--out", out, "--plan"] + CAUSAL)
    text = capsys.readouterr().out
    assert code == 0 and not os.path.exists(out)
    assert "plan: causal on 400 rows x 3 features" in text, text
    for label in ("fit time", "peak memory", "memory available", "collectives: none (one rank)",
                  "model: forest/cli/cost_model.py"):
        assert label in text, text


def test_plan_prices_compute_at_the_stated_core_speed(small_parquet, tmp_path, capsys, monkeypatch):
    from native.comm import SelfCommunicator

    out = str(tmp_path / "m.model")
    monkeypatch.delenv("HISTFOREST_CORE_SPEED", raising=False)
    assert plan.cluster(SelfCommunicator()).core_speed == 1.0
    assert train.main([small_parquet, "--out", out, "--plan"] + CAUSAL) == 0
    assert "HISTFOREST_CORE_SPEED" not in capsys.readouterr().out
    monkeypatch.setenv("HISTFOREST_CORE_SPEED", "4")
    assert plan.cluster(SelfCommunicator()).core_speed == 4.0
    assert train.main([small_parquet, "--out", out, "--plan"] + CAUSAL) == 0
    text = capsys.readouterr().out
    assert "cores at 4x its speed (HISTFOREST_CORE_SPEED)" in text, text
    monkeypatch.setenv("HISTFOREST_CORE_SPEED", "fast")
    code = train.main([small_parquet, "--out", out, "--plan"] + CAUSAL)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "HISTFOREST_CORE_SPEED" in err[0], err
    monkeypatch.delenv("HISTFOREST_CORE_SPEED")
    for var in ("HISTFOREST_NET_GBITS", "HISTFOREST_NET_LATENCY_US"):   # checked before any work too
        monkeypatch.setenv(var, "-1")
        code = train.main([small_parquet, "--out", out] + CAUSAL)
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith(f"forest-train: error: {var}"), err
        monkeypatch.delenv(var)
    assert not os.path.exists(out)


def test_run_is_refused_when_memory_does_not_fit_unless_forced(small_parquet, tmp_path, capsys, monkeypatch):
    out = str(tmp_path / "m.model")
    monkeypatch.setattr(plan, "_mem_available", lambda: 2 ** 20)   # 1 MiB left on this node
    monkeypatch.setattr(plan, "_read_int", lambda path: None)      # no cgroup limit
    monkeypatch.setattr(plan, "_rss", lambda: 0)                   # nothing held yet
    code = train.main([small_parquet, "--out", out] + CAUSAL)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("forest-train: error: estimated peak memory") and "--force" in err[0], err
    assert "MemAvailable 0.0 GiB / 1 rank(s) on this node" in err[0], err
    assert not os.path.exists(out)
    assert train.main([small_parquet, "--out", out, "--force"] + CAUSAL) == 0
    assert os.path.exists(out)


def test_cgroup_limit_counts_when_smaller(monkeypatch):
    from native.comm import SelfCommunicator

    files = {"/sys/fs/cgroup/memory.max": 3 * 2 ** 30, "/sys/fs/cgroup/memory.current": 2 ** 30}
    monkeypatch.setattr(plan, "_read_int", files.get)
    monkeypatch.setattr(plan, "_mem_available", lambda: 10 * 2 ** 30)
    per_rank, what = plan.available_memory(SelfCommunicator())
    assert per_rank == 2 * 2 ** 30 and "cgroup room 2.0 GiB" in what


def test_workload_reads_arms_and_classes_from_footers(tmp_path):
    from forest.io.dataio import open_source

    rng = np.random.default_rng(0)
    n = 300
    table = pa.table({"x": rng.normal(size=n), "t": rng.integers(0, 3, n).astype(np.int64),
                      "y": rng.integers(0, 4, n).astype(np.int64)})
    path = str(tmp_path / "arms.parquet")
    pq.write_table(table, path, row_group_size=100)
    source = open_source(path)

    class Args:
        model, treatment, outcome = "causal", "t", "y"

    w = plan.workload(Args, {}, source, ["x"])
    assert (w.n_rows, w.n_features, w.n_treatments, w.row_group_rows, w.entry) == (300, 1, 2, 100, "cli")
    Args.model = "gbdt-classifier"
    assert plan.workload(Args, {}, source, ["x"]).n_classes == 4


def test_plan_under_mpirun_prints_once_with_collectives(small_parquet, tmp_path):
    proc = run_mpi(2, [tool("forest-train"), small_parquet, "--out", str(tmp_path / "m.model"), "--plan"] + CAUSAL)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("plan: causal on 400 rows") == 1, proc.stdout
    assert "2 rank(s) on 1 node(s)" in proc.stdout and "rows to tree owners" in proc.stdout, proc.stdout

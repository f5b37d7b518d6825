"""Tests of the benchmark support code (harness, data sets), not of the estimators.

Run with ``.venv-bench/bin/python -m pytest -q benchmarks/test_benchmarks_support.py``
(IHDP tests skip where EconML is not installed; the rest also run under ``.venv``).
They live beside the benchmarks, outside the project's ``tests/`` suite, because the
benchmarks are not part of the installed package.
"""
import os
import sys
import textwrap

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402
import datasets  # noqa: E402

RESULTS = textwrap.dedent("""\
    # Measured results

    Intro.

    ## Histogram kernels (issue 2)

    _not measured yet_

    ## Gradient boosting (issue 4)

    _not measured yet_

    ## Causal forest (issue 5)

    kept text
    """)


# --------------------------------------------------------------------------- RESULTS.md

def test_insert_block_replaces_placeholder_only_in_its_section():
    out = _harness.insert_block(RESULTS, "Gradient boosting (issue 4)", "TABLE\n")
    assert out.count("_not measured yet_") == 1
    head, rest = out.split("## Gradient boosting (issue 4)\n")
    assert head == RESULTS.split("## Gradient boosting (issue 4)\n")[0]
    assert rest.startswith("\nTABLE\n\n## Causal forest (issue 5)")


def test_insert_block_appends_after_existing_content_and_keeps_later_sections():
    once = _harness.insert_block(RESULTS, "Gradient boosting (issue 4)", "FIRST\n")
    twice = _harness.insert_block(once, "Gradient boosting (issue 4)", "SECOND\n")
    section = twice.split("## Gradient boosting (issue 4)\n")[1].split("## Causal")[0]
    assert section == "\nFIRST\n\nSECOND\n\n"
    last = _harness.insert_block(twice, "Causal forest (issue 5)", "THIRD\n")
    assert last.endswith("kept text\n\nTHIRD\n")
    assert last.startswith(twice.split("## Causal forest")[0])


def test_insert_block_adds_missing_section_at_end():
    out = _harness.insert_block(RESULTS, "New part", "X\n")
    assert out.startswith(RESULTS)
    assert out.endswith("\n## New part\n\nX\n")


def test_write_results_section_records_command_and_machine(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text(RESULTS)
    _harness.write_results_section("Histogram kernels (issue 2)", "| a |\n|---|\n| 1 |",
                                   command="python bench.py --quick", machine="test box",
                                   path=str(path), title="Smoke")
    text = path.read_text()
    section = text.split("## Histogram kernels (issue 2)\n")[1].split("## Gradient")[0]
    assert "### Smoke" in section and "Command: `python bench.py --quick`" in section
    assert "Machine: test box" in section and "| 1 |" in section
    assert text.count("_not measured yet_") == 1


def test_machine_description_names_cpu_and_versions():
    text = _harness.machine_description()
    assert "logical cores" in text and "numpy" in text and "load average" in text


def test_markdown_table_formats_and_checks_width():
    table = _harness.markdown_table(["a", "b"], [[1.23456, None], ["x", float("nan")]])
    lines = table.splitlines()
    assert lines[0].startswith("| a") and "1.23" in lines[2] and lines[2].rstrip().endswith("- |")
    with pytest.raises(ValueError, match="cells"):
        _harness.markdown_table(["a", "b"], [[1]])


# --------------------------------------------------------------------------- run_contender

CONTENDERS = textwrap.dedent("""\
    import os, time
    import numpy as np

    def good(threads, scale=1.0, **_):
        block = np.ones(int(scale * 2**20) // 8)   # touch about `scale` MiB
        block[::512] = 2.0
        return {"fit_s": 0.5, "predict_s": 0.25, "metrics": {"value": float(block.sum())},
                "omp": os.environ["OMP_NUM_THREADS"], "numba": os.environ["NUMBA_NUM_THREADS"],
                "threads": threads}

    def bad(threads, **_):
        raise RuntimeError("contender broke on purpose")

    def slow(threads, **_):
        time.sleep(60)

    def grouped(threads, rank, size, ports, **_):
        return {"fit_s": 1.0 + rank, "metrics": {"rank": rank, "size": size, "ports": ports}}

    def mpi(threads, **_):
        from native.comm import world
        comm = world()
        comm.barrier()
        return {"fit_s": float(comm.rank), "metrics": {"size": comm.size}}
    """)


@pytest.fixture
def contenders(tmp_path):
    path = tmp_path / "contenders.py"
    path.write_text(CONTENDERS)
    return str(path)


def test_run_contender_reports_result_threads_and_peak_memory(contenders):
    small = _harness.run_contender("small", contenders, "good", {"scale": 1}, threads=3, verbose=False)
    big = _harness.run_contender("big", contenders, "good", {"scale": 200}, threads=3, verbose=False)
    assert small["status"] == "ok" and big["status"] == "ok"
    assert small["omp"] == "3" and small["numba"] == "3" and small["threads"] == 3
    assert small["fit_s"] == 0.5 and small["predict_s"] == 0.25
    # The 200 MiB array must show in that process's peak and not in the other's.
    assert big["peak_rss_mb"] - small["peak_rss_mb"] > 150


def test_run_contender_records_exception_and_timeout(contenders):
    broke = _harness.run_contender("broke", contenders, "bad", timeout=60, verbose=False)
    assert broke["status"].startswith("failed: exit code")
    assert "contender broke on purpose" in broke["status"]
    slow = _harness.run_contender("slow", contenders, "slow", timeout=1.5, verbose=False)
    assert slow["status"] == "failed: timeout after 2s"
    assert slow["wall_s"] < 30


def test_run_contender_group_merges_ranks(contenders):
    res = _harness.run_contender("group", contenders, "grouped", launcher="group", nprocs=2,
                                 threads=1, verbose=False)
    assert res["status"] == "ok"
    assert res["fit_s"] == 2.0                     # the slowest rank
    assert res["metrics"]["rank"] == 0 and res["metrics"]["size"] == 2
    assert len(set(res["metrics"]["ports"])) == 2
    assert res["n_procs"] == 2 and res["peak_rss_total_mb"] >= res["peak_rss_mb"]


@pytest.mark.skipif(not os.path.exists(_harness.default_mpirun()), reason="no mpirun")
def test_run_contender_under_mpirun(contenders):
    res = _harness.run_contender("mpi", contenders, "mpi", launcher="mpirun", nprocs=2, threads=1,
                                 timeout=120, verbose=False)
    assert res["status"] == "ok", res.get("log_tail")
    assert res["metrics"]["size"] == 2 and res["fit_s"] == 1.0 and res["n_procs"] == 2


# --------------------------------------------------------------------------- data sets

def test_higgs_like_is_deterministic_prefix_and_blocks_partition(tmp_path):
    small = datasets.higgs_like(1000, seed=5, n_test=500, out_dir=str(tmp_path))
    large = datasets.higgs_like(3000, seed=5, n_test=500, out_dir=str(tmp_path))
    Xs, Xl = np.load(small["X_train"]), np.load(large["X_train"])
    assert Xs.shape == (1000, 28) and Xl.shape == (3000, 28) and Xl.dtype == np.float64
    np.testing.assert_array_equal(Xs, Xl[:1000])
    yl = np.load(large["y_train"])
    assert set(np.unique(yl)) == {0.0, 1.0}
    blocks = [datasets.load_rows(large["X_train"], r, 3) for r in range(3)]
    assert [len(b) for b in blocks] == [1000, 1000, 1000]
    np.testing.assert_array_equal(np.concatenate(blocks), Xl)
    other = datasets.higgs_like(1000, seed=6, n_test=500, out_dir=str(tmp_path))
    assert not np.array_equal(np.load(other["X_train"]), Xs)


def test_higgs_like_signal_strength():
    """Bayes AUC of the generator lies in the intended 0.8-0.9 band, classes balanced-ish."""
    from sklearn.metrics import roc_auc_score

    _, y, p = datasets._generate_higgs(50_000, 0, 0)
    assert 0.35 < y.mean() < 0.6
    assert 0.83 < roc_auc_score(y, p) < 0.92


def test_dense_interactions_prefix_dtype_and_signal():
    """float32 rows, a prefix of any larger draw, held-out rows from their own stream,
    and a label that really depends on the recipe's log-odds (Bayes AUC 0.75-0.9)."""
    from sklearn.metrics import roc_auc_score

    small = datasets.dense_interactions(1000, 12, seed=3, n_test=500)
    large = datasets.dense_interactions(150_000, 12, seed=3, n_test=20_000)
    assert small["X"].dtype == np.float32 and small["X"].shape == (1000, 12) and small["X"].flags.c_contiguous
    np.testing.assert_array_equal(small["X"], large["X"][:1000])
    np.testing.assert_array_equal(small["X_test"], large["X_test"][:500])
    assert not np.array_equal(small["X"][:500], small["X_test"])
    assert set(np.unique(large["y"])) == {0.0, 1.0} and 0.3 < large["y"].mean() < 0.7
    logit = datasets._interaction_logit(large["X_test"].astype(np.float64), datasets._interaction_recipe(12, 3))
    assert 0.75 < roc_auc_score(large["y_test"], logit) < 0.9
    with pytest.raises(ValueError, match="d >= 2"):
        datasets.dense_interactions(10, 1)


def test_block_bounds_cover_rows_once():
    for n, size in [(10, 3), (7, 7), (5, 1), (100, 4)]:
        bounds = [datasets.block_bounds(n, r, size) for r in range(size)]
        assert bounds[0][0] == 0 and bounds[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert max(b - a for a, b in bounds) - min(b - a for a, b in bounds) <= 1
    with pytest.raises(ValueError, match="rank"):
        datasets.block_bounds(10, 3, 3)


def test_wa_tau_known_values():
    X = np.array([[1 / 3, 1 / 3, 0, 0], [-10.0, -10.0, 0, 0], [10.0, 10.0, 0, 0]])
    np.testing.assert_allclose(datasets.wa_tau(X), [1 + 1.5 ** 2, 2.0, 5.0])


def test_wager_athey_moments_recover_tau_and_prefix():
    data = datasets.wager_athey(200_000, d=6, n_test=100, seed=1, cache=False)
    X, t, y = data["X"], data["t"], data["y"]
    assert X.shape == (200_000, 6) and data["X_test"].shape == (100, 6)
    np.testing.assert_allclose(data["tau"], datasets.wa_tau(X))
    assert abs(t.mean() - 0.5) < 0.01
    # E[(y - m)(t - e) | x] = tau(x) Var(t) = tau / 4: the average recovers mean tau.
    est = np.mean((y - datasets.wa_main_effect(X)) * (t - 0.5)) * 4
    assert abs(est - data["tau"].mean()) < 0.03
    # The main effect really is in y: regressing out m lowers the residual variance.
    assert np.var(y - datasets.wa_main_effect(X)) < np.var(y) - 0.3
    small = datasets.wager_athey(1000, d=6, n_test=100, seed=1, cache=False)
    np.testing.assert_array_equal(small["X"], X[:1000])
    np.testing.assert_array_equal(small["X_test"], data["X_test"])
    with pytest.raises(ValueError, match="d >= 4"):
        datasets.wager_athey(10, d=3, cache=False)


def test_pehe():
    assert datasets.pehe([1.0, 3.0], [2.0, 2.0]) == 1.0
    with pytest.raises(ValueError, match="shape"):
        datasets.pehe([1.0], [1.0, 2.0])


def _have_ihdp():
    try:
        datasets.ihdp_csv_path()
        return True
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _have_ihdp(), reason="econml (IHDP covariates) not installed")
def test_ihdp_surface_b():
    a, b = datasets.ihdp(0), datasets.ihdp(1)
    assert a["X"].shape == (747, 25) and a["t"].sum() == 139
    treated = a["t"] == 1
    assert abs(a["tau"][treated].mean() - 4.0) < 1e-9          # CATT fixed at 4 by omega
    np.testing.assert_allclose(a["tau"], a["mu1"] - a["mu0"])
    np.testing.assert_allclose(a["y"][treated] - a["mu1"][treated], (a["y"] - a["mu1"])[treated])
    assert np.std(a["y"] - np.where(treated, a["mu1"], a["mu0"])) == pytest.approx(1.0, abs=0.1)
    np.testing.assert_array_equal(a["X"], b["X"])
    assert not np.allclose(a["tau"], b["tau"])
    np.testing.assert_allclose(a["X"][:, :6].mean(axis=0), 0, atol=1e-12)

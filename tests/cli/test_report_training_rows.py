"""forest-report and forest-policy on a model's own training rows: out of bag, at -np 1 and 3 (issue 30)."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import run_mpi, tool
from forest.cli import policy, report

ARGS = ["--treatment", "t", "--outcome", "y", "--n-estimators", "100", "--param", "nuisance_estimators=50",
        "--no-progress"]


def null_table(n, seed):
    """No heterogeneity: the effect is 1 everywhere (confounded through x1)."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 4))
    t = (rng.random(n) < 1.0 / (1.0 + np.exp(-X[:, 1]))).astype(np.int64)
    y = X[:, 0] + X[:, 1] + t + rng.normal(size=n)
    return pa.table({**{f"x{j}": X[:, j] for j in range(4)}, "t": t, "y": y})


@pytest.fixture(scope="module")
def null_models(tmp_path_factory):
    """Per seed: the training parquet and the model files trained on it under mpirun -np 1 and 3."""
    folder = tmp_path_factory.mktemp("null")
    out = {}
    for seed in (0, 1, 2):
        data = str(folder / f"null-{seed}.parquet")
        pq.write_table(null_table(400, seed), data, row_group_size=50)
        models = {}
        for k in (1, 3):
            models[k] = str(folder / f"null-{seed}-np{k}.model")
            proc = run_mpi(k, [tool("forest-train"), data, "--out", models[k], "--random-state", str(seed)] + ARGS,
                           timeout=600)
            assert proc.returncode == 0, proc.stderr[-3000:]
        out[seed] = data, models
    return out


def _report(capsys, model, data):
    assert report.main([model, "--data", data, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_report_on_training_rows_finds_no_heterogeneity_at_any_rank_count(null_models, capsys):
    for seed, (data, models) in null_models.items():
        docs = {k: _report(capsys, m, data) for k, m in models.items()}
        for doc in docs.values():
            assert doc["rows"]["source"] == "out-of-bag"
            cal = doc["analysis"]["calibration"]
            assert cal["pvalue"][1] > 0.01, (seed, cal)          # no false discovery of heterogeneity
            autoc = doc["analysis"]["rate"]["AUTOC"]
            assert autoc["conf_low"][0] <= 0.0 <= autoc["conf_high"][0], (seed, autoc)
        a, b = docs[1]["analysis"], docs[3]["analysis"]       # the same figures from -np 1 and -np 3 models
        np.testing.assert_allclose(a["calibration"]["estimate"], b["calibration"]["estimate"], rtol=1e-9)
        np.testing.assert_allclose(a["rate"]["AUTOC"]["estimate"], b["rate"]["AUTOC"]["estimate"], rtol=1e-9)


def test_report_says_which_rows_and_refuses_partial_overlap(null_models, tmp_path, capsys):
    data, models = null_models[0]
    assert report.main([models[3], "--data", data]) == 0
    text = capsys.readouterr().out
    assert "Rows: these are the model's training rows (400 rows, fingerprint matches): out-of-bag estimates." in text
    # held-out rows of the same design: the whole forest, said so
    held = str(tmp_path / "held.parquet")
    pq.write_table(null_table(300, 99), held)
    doc = _report(capsys, models[3], held)
    assert doc["rows"]["source"] == "held-out" and "rate_ranking" not in doc["analysis"]
    # the training rows plus others: one line, exit 2
    both = str(tmp_path / "both.parquet")
    pq.write_table(pa.concat_tables([pq.read_table(data), null_table(300, 99)]), both)
    assert report.main([models[3], "--data", both]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "holds training rows of this model" in err and "about 400 of its 700" in err
    # the HTML page states the rows used, in its own highlighted line
    page = str(tmp_path / "r.html")
    assert report.main([models[3], "--data", data, "--html", page]) == 0
    capsys.readouterr()
    with open(page, encoding="utf-8") as f:
        html = f.read()
    assert "out-of-bag estimates" in html and "<table" in html


def test_policy_on_training_rows_uses_out_of_bag_scores(null_models, tmp_path, capsys):
    data, models = null_models[1]
    out = str(tmp_path / "p.model")
    assert policy.main([models[1], data, "--depth", "1", "--out", out]) == 0
    assert "rewards from out-of-bag doubly robust scores" in capsys.readouterr().err
    both = str(tmp_path / "both.parquet")
    pq.write_table(pa.concat_tables([pq.read_table(data), null_table(100, 98)]), both)
    assert policy.main([models[1], both, "--depth", "1", "--out", out]) == 2
    assert "holds training rows of this model" in capsys.readouterr().err

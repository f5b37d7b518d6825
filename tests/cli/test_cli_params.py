"""Every option is checked before any work: one line, exit 2, on every rank; no overwritten inputs."""
import os
import re

import pyarrow.parquet as pq
import pytest

from cli_helpers import make_table, run_mpi, tool
from forest.cli import predict, report, train

FEATURES = ["--features", "a", "b", "c", "--n-estimators", "4", "--no-progress"]
CAUSAL = ["--treatment", "t", "--outcome", "y", "--param", "nuisance_estimators=4"] + FEATURES
REGRESSION = ["--model", "regression", "--outcome", "y"] + FEATURES
GBDT = ["--model", "gbdt-regressor", "--outcome", "y"] + FEATURES


def _one_error(main, argv, capsys, prog="forest-train"):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith(f"{prog}: error: "), err
    return err[0]


@pytest.mark.parametrize("model,extra,pattern", [
    (CAUSAL, ["--max-features", "foo"], r"--max-features foo: max_features must be None, int, float, .sqrt. or .log2., got .foo."),
    (CAUSAL, ["--max-features", "0"], r"--max-features 0: max_features must be >= 1, got 0"),
    (CAUSAL, ["--max-features", "1.5"], r"--max-features 1.5: max_features must be .*got 1.5"),
    (CAUSAL, ["--param", "alpha=abc"], r"--param alpha=abc: alpha must be a real number, got 'abc'"),
    (CAUSAL, ["--param", "alpha=0.7"], r"--param alpha=0.7: alpha must be in \[0, 0.5\), got 0.7"),
    (CAUSAL, ["--param", "max_depth=abc"], r"--param max_depth=abc: max_depth must be an int or None, got 'abc'"),
    (CAUSAL, ["--param", "honest=maybe"], r"--param honest=maybe: honest must be true or false, got 'maybe'"),
    (CAUSAL, ["--param", "honest=1"], r"honest must be true or false, got 1"),
    (CAUSAL, ["--param", "treatment_type=weird"], r"treatment_type must be one of"),
    (CAUSAL[:4] + FEATURES, ["--param", "nuisance_estimators=0"], r"nuisance_estimators must be >= 1"),
    (CAUSAL, ["--param", "imbalance_penalty=-1"], r"imbalance_penalty must be >= 0"),
    (REGRESSION, ["--param", "ci_group_size=2.5"], r"ci_group_size must be an int or None, got 2.5"),
    (REGRESSION, ["--max-bins", "300"], r"--max-bins 300: max_bins must be in \[2, 255\]"),
    (REGRESSION, ["--min-samples-leaf", "x"], r"--min-samples-leaf expects int, got 'x'"),
    (REGRESSION, ["--min-node-size", "0"], r"--min-node-size 0: min_node_size must be >= 1 or None, got 0"),
    (REGRESSION, ["--param", "alpha=0.3"], r"--param alpha=0.3: alpha must be a number in \[0, 0.25\] or None"),
    (CAUSAL, ["--min-node-size", "3"], r"model 'causal' \(CausalForest\) has no parameter 'min_node_size'"),
    (CAUSAL, ["--tune-parameters", "min_samples_leaf,depth"], r"--tune-parameters min_samples_leaf,depth: "
                                                              r"tune_parameters: unknown 'depth'"),
    (GBDT, ["--tune-parameters", "all"], r"has no parameter 'tune_parameters'"),
    (GBDT, ["--learning-rate", "-1"], r"--learning-rate -1: learning_rate must be > 0"),
    (GBDT, ["--param", "l2_regularization=abc"], r"l2_regularization must be a real number, got 'abc'"),
    (GBDT, ["--param", "backend=gpu"], r"--param backend=gpu: backend must be one of"),
    (GBDT, ["--param", "split_mode=tree"], r"split_mode must be one of"),
    (GBDT, ["--param", "random_state=abc"], r"random_state must be None, an int"),
    (GBDT, ["--quantized", "--quantized-bins", "3"], r"--quantized-bins 3: quantized_bins must be an even int"),
    (GBDT, ["--quantized", "--param", "split_mode=reduce_scatter"], r"quantized=True needs split_mode='allreduce'"),
    (REGRESSION, ["--quantized"], r"model 'regression' \(RegressionForest\) has no parameter 'quantized'"),
])
def test_bad_parameters_fail_before_any_work(tmp_path, capsys, model, extra, pattern):
    # The data does not exist: a parameter error must come first, before anything is read.
    out = str(tmp_path / "m.model")
    line = _one_error(train.main, [str(tmp_path / "missing.parquet"), "--out", out] + model + extra, capsys)
    assert re.search(pattern, line), line
    assert not os.path.exists(out)


def test_good_parameters_are_accepted(small_parquet, tmp_path):
    out = str(tmp_path / "m.model")
    assert train.main([small_parquet, "--out", out] + CAUSAL + ["--max-features", "sqrt", "--param", "honest=false",
                                                                "--param", "alpha=0.1", "--param", "max_depth=none"]) == 0
    from forest.io import model_io

    params = model_io.load(out).get_params()
    assert params["max_features"] == "sqrt" and params["honest"] is False and params["alpha"] == 0.1
    assert params["max_depth"] is None


def test_grf_size_rules_reach_the_regression_forest(small_parquet, tmp_path):
    out = str(tmp_path / "m.model")
    assert train.main([small_parquet, "--out", out] + REGRESSION + ["--min-node-size", "3", "--param", "alpha=0.1"]) == 0
    from forest.io import model_io

    params = model_io.load(out).get_params()
    assert (params["min_node_size"], params["alpha"], params["min_samples_leaf"]) == (3, 0.1, None)


def test_tuned_parameters_reach_the_model_and_the_report(small_parquet, tmp_path, capsys):
    out = str(tmp_path / "m.model")
    assert train.main([small_parquet, "--out", out] + REGRESSION + ["--tune-parameters", "min_samples_leaf,alpha",
                                                                    "--param", "tune_num_trees=4",
                                                                    "--param", "tune_num_reps=3"]) == 0
    from forest.io import model_io

    est = model_io.load(out)
    assert est.get_params()["tune_parameters"] == ["min_samples_leaf", "alpha"]
    assert set(est.tuned_params_) == {"min_samples_leaf", "alpha"}
    capsys.readouterr()
    assert report.main([out]) == 0
    assert "Tuned parameters: min_samples_leaf = " in capsys.readouterr().out


def test_quantized_option_trains_a_quantized_model(small_parquet, tmp_path):
    out = str(tmp_path / "q.model")
    assert train.main([small_parquet, "--out", out] + GBDT + ["--quantized", "--quantized-bins", "8"]) == 0
    from forest.io import model_io

    params = model_io.load(out).get_params()
    assert params["quantized"] is True and params["quantized_bins"] == 8


@pytest.mark.parametrize("extra", [["--max-features", "foo"], ["--param", "honest=maybe"]])
def test_bad_parameter_under_mpirun_is_one_line_and_exit_2(small_parquet, tmp_path, extra):
    out = str(tmp_path / "m.model")
    proc = run_mpi(3, [tool("forest-train"), small_parquet, "--out", out] + CAUSAL + extra, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("forest-train: error: --"), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not os.path.exists(out)


# ------------------------------------------------------------------ --out must not be an input

@pytest.fixture
def data_and_model(small_parquet, tmp_path):
    data = str(tmp_path / "data.parquet")
    pq.write_table(pq.read_table(small_parquet), data, row_group_size=80)
    model = str(tmp_path / "m.model")
    assert train.main([data, "--out", model] + REGRESSION) == 0
    return data, model


def _spellings(path, tmp_path):
    """The path itself, through a ``..`` detour, through a symbolic link and a hard link."""
    link = tmp_path / f"link-{os.path.basename(path)}"
    os.symlink(path, link)
    hard = tmp_path / f"hard-{os.path.basename(path)}"
    os.link(path, hard)
    detour = os.path.join(os.path.dirname(path), "..", os.path.basename(os.path.dirname(path)),
                          os.path.basename(path))
    return [path, detour, str(link), str(hard)]


def _unchanged(path, before):
    with open(path, "rb") as f:
        assert f.read() == before


def test_train_refuses_to_overwrite_its_data(data_and_model, tmp_path, capsys):
    data, _ = data_and_model
    before = open(data, "rb").read()
    capsys.readouterr()
    for out in _spellings(data, tmp_path):
        line = _one_error(train.main, [data, "--out", out] + REGRESSION, capsys)
        assert "is an input of this run" in line and "refusing to overwrite it" in line, line
    _unchanged(data, before)


def test_predict_refuses_to_overwrite_the_model_or_the_data(data_and_model, tmp_path, capsys):
    data, model = data_and_model
    before = {p: open(p, "rb").read() for p in (data, model)}
    capsys.readouterr()
    for target in (model, data):
        for out in _spellings(target, tmp_path):
            line = _one_error(predict.main, [model, data, "--out", out], capsys, prog="forest-predict")
            assert re.search(r"--out .* is an input of this run", line), line
    for p, b in before.items():
        _unchanged(p, b)
    good = str(tmp_path / "pred.parquet")
    assert predict.main([model, data, "--out", good]) == 0


def test_predict_refuses_to_overwrite_its_data_under_mpirun(data_and_model, tmp_path):
    data, model = data_and_model
    before = open(data, "rb").read()
    proc = run_mpi(2, [tool("forest-predict"), model, data, "--out", data], timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "is an input of this run" in lines[0], proc.stderr[-2000:]
    _unchanged(data, before)


def test_report_refuses_to_write_its_page_over_an_input(data_and_model, tmp_path, capsys):
    data, model = data_and_model
    before = {p: open(p, "rb").read() for p in (data, model)}
    capsys.readouterr()
    for args in ([model, "--html", model], [model, "--data", data, "--html", data]):
        line = _one_error(report.main, args, capsys, prog="forest-report")
        assert "--html" in line and "is an input of this run" in line, line
    line = _one_error(report.main, [model, "--html", str(tmp_path / "nodir" / "r.html")], capsys, prog="forest-report")
    assert "does not exist" in line
    for p, b in before.items():
        _unchanged(p, b)


def test_predict_and_report_refuse_a_file_that_is_not_an_estimator(tmp_path, capsys):
    from forest.io import model_io
    from forest.engine.tree import Tree

    tree = Tree(1)
    tree.add_node(0, 1.0, [0.0])
    path = str(tmp_path / "tree.model")
    model_io.save(tree, path)
    data = str(tmp_path / "d.parquet")
    pq.write_table(make_table(50), data)
    line = _one_error(predict.main, [path, data, "--out", str(tmp_path / "p.parquet")], capsys,
                      prog="forest-predict")
    assert ("holds a Tree, but a CausalForest or InstrumentalForest or RegressionForest or QuantileForest or "
            "SurvivalForest or CausalSurvivalForest or ProbabilityForest or GBDTRegressor or GBDTClassifier") in line
    line = _one_error(report.main, [path], capsys, prog="forest-report")
    assert "holds a Tree" in line


def test_predict_on_an_edited_model_fails_in_one_line(data_and_model, tmp_path):
    """A child index pointing past the arrays used to crash forest-predict (out-of-bounds read)."""
    import io
    import json
    import subprocess
    import zipfile

    import numpy as np

    data, model = data_and_model
    with zipfile.ZipFile(model) as zf:
        entries = {n: zf.read(n) for n in zf.namelist()}
    header = json.loads(entries["histforest-model.json"])
    packed = dict(header["state"]["$dict"])["estimators_"]["$dict"]
    key = dict(packed)["left"]["$array"]
    left = np.lib.format.read_array(io.BytesIO(entries[f"arrays/{key}.npy"]))
    left[np.flatnonzero(left >= 0)[0]] = 2 ** 30
    buf = io.BytesIO()
    np.lib.format.write_array(buf, left)
    entries[f"arrays/{key}.npy"] = buf.getvalue()
    bad = str(tmp_path / "edited.model")
    with zipfile.ZipFile(bad, "w") as zf:
        for name, blob in entries.items():
            zf.writestr(name, blob)
    proc = subprocess.run([tool("forest-predict"), bad, data, "--out", str(tmp_path / "p.parquet")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(r"forest-predict: error: model file .* is corrupted: estimators_: tree \d+, "
                                        r"node \d+: left child 1073741824 is not a later node", lines[0]), lines

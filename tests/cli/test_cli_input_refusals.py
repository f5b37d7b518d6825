"""Input problems the tools refuse with one line and exit status 2, before the work is done:
unwritable output locations, duplicated column names, a classifier's continuous outcome,
duplicated --keep/--rewards columns, outputs inside an input directory, a bad --checkpoint
path and a model parameter given twice; alone and under mpirun."""
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_helpers import make_table, run_mpi, tool
from forest.io import dataio
from forest.cli import policy, predict, report, train
from forest.collective_checks import RankInputError

REG = ["--model", "regression", "--outcome", "y", "--features", "a", "b", "c", "--n-estimators", "4",
       "--no-progress"]
CAUSAL = ["--treatment", "t", "--outcome", "y", "--features", "a", "b", "c", "--n-estimators", "4",
          "--param", "nuisance_estimators=4", "--no-progress"]
REWARDS = ["--rewards", "a", "b", "--features", "c", "--depth", "1", "--max-bins", "8"]


def _one_error(main, argv, capsys, prog):
    """Run ``main(argv)``: exit status 2 and exactly one line ``<prog>: error: ...``; return that line.

    (A first fit in the process may announce that it compiles the kernels first.)
    """
    capsys.readouterr()
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.strip().splitlines() if not ln.startswith(f"{prog}: compiling")]
    assert len(err) == 1, err
    assert err[0].startswith(f"{prog}: error: "), err
    return err[0]


def _mpi_error(np_, argv, timeout=240):
    """Run a tool under ``mpirun -np np_``: exit status 2 and one error line, printed once; return it."""
    proc = run_mpi(np_, argv, timeout=timeout)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "error" in ln.lower() or "Traceback" in ln]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A data file, a directory of two parquet files, a causal model and a policy model."""
    root = tmp_path_factory.mktemp("refusals")
    table = make_table(300, seed=5)
    data = str(root / "d.parquet")
    pq.write_table(table, data, row_group_size=100)
    parts = root / "parts"
    parts.mkdir()
    pq.write_table(table.slice(0, 150), str(parts / "p0.parquet"), row_group_size=50)
    pq.write_table(table.slice(150), str(parts / "p1.parquet"), row_group_size=50)
    model = str(root / "cf.model")
    assert train.main([data, "--out", model] + CAUSAL) == 0
    pol = str(root / "policy.model")
    assert policy.main([data] + REWARDS + ["--out", pol]) == 0
    return {"root": root, "data": data, "parts": str(parts), "model": model, "policy": pol}


# ---------------------------------------------------------------- 1. unwritable output location

NO_WRITE = "/proc"  # an existing directory where no regular file can be created (even by root)


def _refuses_unwritable(line, path):
    assert ".tmp" not in line, line
    assert path in line and re.search(r"cannot write|not writable", line), line


@pytest.mark.skipif(not os.path.isdir(NO_WRITE), reason="needs /proc")
def test_unwritable_output_directory_is_refused_before_any_work(files, capsys, monkeypatch):
    # Nothing may be read: the data is never opened when the output cannot be written.
    opened = []
    real = dataio.open_source
    monkeypatch.setattr(dataio, "open_source", lambda spec: opened.append(spec) or real(spec))
    out = f"{NO_WRITE}/a.model"
    _refuses_unwritable(_one_error(train.main, [files["data"], "--out", out] + REG, capsys, "forest-train"), out)
    pred = f"{NO_WRITE}/p.parquet"
    for model in (files["model"], files["policy"]):
        _refuses_unwritable(_one_error(predict.main, [model, files["data"], "--out", pred], capsys,
                                       "forest-predict"), pred)
    _refuses_unwritable(_one_error(policy.main, [files["data"]] + REWARDS + ["--out", out], capsys,
                                   "forest-policy"), out)
    html = f"{NO_WRITE}/r.html"
    for model in (files["model"], files["policy"]):
        _refuses_unwritable(_one_error(report.main, [model, "--html", html], capsys, "forest-report"), html)
    assert opened == []


@pytest.mark.skipif(not os.path.isdir(NO_WRITE), reason="needs /proc")
def test_unwritable_output_directory_under_mpirun(files):
    out = f"{NO_WRITE}/a.model"
    _refuses_unwritable(_mpi_error(2, [tool("forest-train"), files["data"], "--out", out] + REG), out)
    pred = f"{NO_WRITE}/p.parquet"
    _refuses_unwritable(_mpi_error(2, [tool("forest-predict"), files["model"], files["data"], "--out", pred]), pred)


def test_output_that_is_not_a_regular_file_is_refused(files, tmp_path, capsys):
    # A FIFO of our own, never a system device: without the check the rename would replace it.
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    line = _one_error(train.main, [files["data"], "--out", fifo] + REG, capsys, "forest-train")
    assert "is not a regular file" in line, line
    assert not os.path.isfile(fifo)


def test_the_writability_probe_leaves_nothing_behind(files, tmp_path):
    assert predict.main([files["model"], files["data"], "--out", str(tmp_path / "p.parquet")]) == 0
    assert sorted(os.listdir(tmp_path)) == ["p.parquet"]


# ---------------------------------------------------------------- 2. duplicated column names

@pytest.fixture(scope="module")
def duplicated(tmp_path_factory):
    """The same columns x0, x0, t, y as parquet and as CSV."""
    root = tmp_path_factory.mktemp("dup")
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2, 200))
    t = (rng.uniform(size=200) < 0.5).astype(np.int64)
    y = x[0] + t + 0.1 * rng.normal(size=200)
    table = pa.Table.from_arrays([pa.array(x[0]), pa.array(x[1]), pa.array(t), pa.array(y)],
                                 names=["x0", "x0", "t", "y"])
    path = str(root / "dup.parquet")
    pq.write_table(table, path)
    csv = str(root / "dup.csv")
    with open(csv, "w") as f:
        f.write("x0,x0,t,y\n")
        for i in range(200):
            f.write(f"{x[0, i]},{x[1, i]},{t[i]},{y[i]}\n")
    return [path, csv]


def test_open_source_refuses_duplicated_column_names(duplicated):
    for path in duplicated:
        with pytest.raises(dataio.DataError, match=r"column 'x0' appears 2 times in .*dup\.(parquet|csv)"):
            dataio.open_source(path)


def test_duplicated_column_names_are_one_line_for_every_tool(files, duplicated, tmp_path, capsys):
    pattern = r"column 'x0' appears 2 times in .*dup\.(parquet|csv)'; column names must be unique"
    out = str(tmp_path / "m.model")
    for path in duplicated:
        for args in (["--treatment", "t", "--outcome", "y", "--no-progress"],
                     ["--model", "regression", "--outcome", "y", "--no-progress"]):
            assert re.search(pattern, _one_error(train.main, [path, "--out", out] + args, capsys, "forest-train"))
        pred = str(tmp_path / "p.parquet")
        assert re.search(pattern, _one_error(predict.main, [files["model"], path, "--out", pred], capsys,
                                             "forest-predict"))
        assert re.search(pattern, _one_error(report.main, [files["model"], "--data", path], capsys,
                                             "forest-report"))
        assert re.search(pattern, _one_error(policy.main, [path, "--rewards", "t", "y", "--out", out], capsys,
                                             "forest-policy"))
        assert not os.path.exists(out) and not os.path.exists(pred)


def test_duplicated_column_names_under_mpirun(duplicated, tmp_path):
    line = _mpi_error(2, [tool("forest-train"), duplicated[0], "--treatment", "t", "--outcome", "y",
                          "--no-progress", "--out", str(tmp_path / "m.model")])
    assert "column 'x0' appears 2 times" in line, line


# ---------------------------------------------------------------- 3. estimator input errors in fit

@pytest.fixture(scope="module")
def continuous_outcome(tmp_path_factory):
    """A float outcome: 0/1 in the first half (valid labels), continuous in the second."""
    table = make_table(300, seed=9)
    y = table["y"].to_numpy().copy()
    y[:150] = (y[:150] > 1).astype(float)
    table = table.set_column(table.schema.get_field_index("y"), "y", pa.array(y))
    path = str(tmp_path_factory.mktemp("clf") / "clf.parquet")
    pq.write_table(table, path, row_group_size=50)
    return path


CLASSIFIER = ["--model", "gbdt-classifier", "--outcome", "y", "--features", "a", "b", "--n-estimators", "3",
              "--no-progress"]


def test_classifier_on_a_continuous_outcome_is_one_line(continuous_outcome, tmp_path, capsys):
    out = str(tmp_path / "g.model")
    line = _one_error(train.main, [continuous_outcome, "--out", out] + CLASSIFIER, capsys, "forest-train")
    assert "Unknown label type: continuous" in line and "--outcome 'y'" in line, line
    assert not os.path.exists(out)


@pytest.mark.parametrize("np_", [2, 3])
def test_classifier_on_a_continuous_outcome_under_mpirun(continuous_outcome, tmp_path, np_):
    # Rank 0's rows hold valid labels; only the later ranks' rows are continuous.
    out = str(tmp_path / "g.model")
    line = _mpi_error(np_, [tool("forest-train"), continuous_outcome, "--out", out] + CLASSIFIER)
    assert line.startswith("forest-train: error: GBDTClassifier refused the input: Unknown label type: continuous")
    assert "MPI_Abort" not in line and not os.path.exists(out)


def test_fit_input_error_accepts_only_agreed_input_checks():
    from forest.cli.common import fit_input_error

    from forest.collective_checks import AgreedError, collective_checks, input_error
    from native.comm import SelfCommunicator

    assert fit_input_error(RankInputError([1], ["y has NaN\nmore"])) == "y has NaN"
    assert fit_input_error(AgreedError("sample_weight sums to zero over all rows")) == \
        "sample_weight sums to zero over all rows"
    assert fit_input_error(input_error([{}], 0, "t_hat has the wrong shape")) == "t_hat has the wrong shape"
    assert fit_input_error(ValueError("raised anywhere else")) is None
    assert fit_input_error(RuntimeError("a crash")) is None
    # One rank: a check's own ValueError inside collective_checks, type and message kept.
    with pytest.raises(ValueError) as caught:
        with collective_checks(SelfCommunicator()):
            raise ValueError("bad labels\ndetail")
    assert type(caught.value) is ValueError and fit_input_error(caught.value) == "bad labels"
    with pytest.raises(TypeError) as caught:
        with collective_checks(SelfCommunicator()):
            raise TypeError("a bug, not an input check")
    assert fit_input_error(caught.value) is None
    # The checks after the exchange, through an estimator.
    import forest

    with pytest.raises(ValueError) as caught:
        forest.GBDTRegressor(n_estimators=1).fit(np.zeros((5, 2)), np.zeros(5), sample_weight=np.zeros(5))
    assert fit_input_error(caught.value) == "sample_weight sums to zero over all rows"
    with pytest.raises(ValueError) as caught:
        forest.CausalForest(n_estimators=4).fit(np.zeros((8, 2)), np.ones(8), np.zeros(8))
    assert fit_input_error(caught.value).startswith("the treatment t takes a single value")
    for weight, message in ((np.zeros(5), "sample_weight sums to zero over all rows"),
                            (np.full(5, 1e308), "sample_weight sums to inf over all rows")):
        with pytest.raises(ValueError) as caught:
            forest.RegressionForest(n_estimators=4).fit(np.zeros((5, 2)), np.arange(5.0), sample_weight=weight)
        assert fit_input_error(caught.value).startswith(message)


def test_diverging_boosting_is_one_line(files, tmp_path, capsys):
    # raised identically on every rank (forest.collective_checks.AgreedError): the tool's one line
    out = str(tmp_path / "g.model")
    line = _one_error(train.main, [files["data"], "--model", "gbdt-regressor", "--outcome", "y", "--features", "a",
                                   "b", "c", "--n-estimators", "3", "--no-progress", "--learning-rate", "1e308",
                                   "--out", out], capsys, "forest-train")
    assert "boosting diverged" in line, line
    assert not os.path.exists(out)


# ---------------------------------------------------------------- 4. duplicated --keep / --rewards

def test_predictions_named_as_csv_are_refused(files, tmp_path, capsys):
    for name in ("p.csv", "P.CSV", "p.json"):
        out = str(tmp_path / name)
        line = _one_error(predict.main, [files["model"], files["data"], "--out", out], capsys, "forest-predict")
        assert "writes Parquet" in line and not os.path.exists(out), line


def test_duplicated_keep_columns_are_refused(files, tmp_path, capsys):
    out = str(tmp_path / "p.parquet")
    for model in (files["model"], files["policy"]):
        line = _one_error(predict.main, [model, files["data"], "--keep", "id", "id", "--out", out], capsys,
                          "forest-predict")
        assert "--keep names column 'id' twice" in line, line
    line = _one_error(predict.main, [files["model"], files["data"], "--keep", "id", "tau", "--out", out], capsys,
                      "forest-predict")
    assert "--keep column 'tau' would clash with an output column" in line, line
    line = _one_error(predict.main, [files["policy"], files["data"], "--keep", "action", "--out", out], capsys,
                      "forest-predict")
    assert "--keep column 'action' would clash with an output column" in line, line
    assert not os.path.exists(out)
    assert predict.main([files["model"], files["data"], "--keep", "id", "name", "--out", out]) == 0
    assert pq.read_table(out).column_names == ["id", "name", "tau"]


@pytest.mark.parametrize("args,flag,column", [
    (["--rewards", "a", "a"], "--rewards", "a"),
    (["--rewards", "a", "b", "c", "--effects", "y", "y"], "--effects", "y"),
    (["--rewards", "a", "b", "--features", "c", "c"], "--features", "c"),
])
def test_duplicated_policy_columns_are_refused(files, tmp_path, capsys, args, flag, column):
    out = str(tmp_path / "p.model")
    line = _one_error(policy.main, [files["data"]] + args + ["--out", out], capsys, "forest-policy")
    assert f"{flag} names column {column!r} twice" in line, line
    assert not os.path.exists(out)


# ---------------------------------------------------------------- 5. output inside an input directory

def test_output_inside_an_input_directory_is_refused(files, capsys):
    parts = files["parts"]
    before = sorted(os.listdir(parts))
    out = os.path.join(parts, "out.parquet")
    line = _one_error(predict.main, [files["model"], parts, "--out", out], capsys, "forest-predict")
    assert "lies in the input directory" in line and "would read it as data" in line, line
    line = _one_error(predict.main, [files["model"], os.path.join(parts, "*.parquet"), "--out", out], capsys,
                      "forest-predict")
    assert "matches the input pattern" in line, line
    line = _one_error(predict.main, [files["policy"], parts, "--out", out], capsys, "forest-predict")
    assert "lies in the input directory" in line, line
    line = _one_error(train.main, [parts, "--out", os.path.join(parts, "m.model")] + REG, capsys, "forest-train")
    assert "lies in the input directory" in line, line
    line = _one_error(policy.main, [parts] + REWARDS + ["--out", os.path.join(parts, "p.model")], capsys,
                      "forest-policy")
    assert "lies in the input directory" in line, line
    line = _one_error(report.main, [files["model"], "--data", parts, "--html", os.path.join(parts, "r.html")],
                      capsys, "forest-report")
    assert "--html" in line and "lies in the input directory" in line, line
    assert sorted(os.listdir(parts)) == before
    # Outside the directory is fine, and a later run on the directory still works.
    good = str(files["root"] / "parts-pred.parquet")
    assert predict.main([files["model"], parts, "--out", good]) == 0
    assert predict.main([files["model"], parts, "--out", good]) == 0


def test_output_inside_an_input_directory_under_mpirun(files):
    out = os.path.join(files["parts"], "out.parquet")
    line = _mpi_error(2, [tool("forest-predict"), files["model"], files["parts"], "--out", out])
    assert "lies in the input directory" in line, line
    assert not os.path.exists(out)


def test_policy_refuses_to_overwrite_its_inputs(files, capsys):
    before = open(files["data"], "rb").read()
    line = _one_error(policy.main, [files["data"]] + REWARDS + ["--out", files["data"]], capsys, "forest-policy")
    assert "is an input of this run" in line, line
    line = _one_error(predict.main, [files["policy"], files["data"], "--out", files["policy"]], capsys,
                      "forest-predict")
    assert "is an input of this run" in line, line
    with open(files["data"], "rb") as f:
        assert f.read() == before


# ---------------------------------------------------------------- 6. --checkpoint path

def test_checkpoint_path_problems_are_named(files, tmp_path, capsys):
    out = str(tmp_path / "m.model")
    base = [files["data"], "--out", out] + REG
    line = _one_error(train.main, base + ["--checkpoint", files["data"]], capsys, "forest-train")
    assert re.search(r"--checkpoint .*d\.parquet' is an input of this run", line), line
    other = tmp_path / "notes.txt"
    other.write_text("not a checkpoint")
    line = _one_error(train.main, base + ["--checkpoint", str(other)], capsys, "forest-train")
    assert "exists and is not a directory" in line and "Errno" not in line, line
    line = _one_error(train.main, base + ["--checkpoint", out], capsys, "forest-train")
    assert "is the --out model file" in line, line
    line = _one_error(train.main, [files["parts"], "--out", out, "--checkpoint", files["parts"]] + REG, capsys,
                      "forest-train")
    assert "is the input directory" in line, line
    assert not os.path.exists(out) and other.read_text() == "not a checkpoint"


def test_checkpoint_path_problem_under_mpirun(files, tmp_path):
    line = _mpi_error(2, [tool("forest-train"), files["data"], "--out", str(tmp_path / "m.model"),
                          "--checkpoint", files["data"]] + REG)
    assert "is an input of this run" in line, line


# ---------------------------------------------------------------- 7. a parameter given twice

@pytest.mark.parametrize("extra,pattern", [
    (["--param", "n_estimators=5", "--n-estimators", "7"],
     r"parameter 'n_estimators' is given twice \(--n-estimators 7 and --param n_estimators=5\)"),
    (["--n-estimators", "5", "--n-estimators", "7"], r"--n-estimators is given twice"),
    (["--param", "min_samples_leaf=3", "--param", "min-samples-leaf=4"],
     r"parameter 'min_samples_leaf' is given twice"),
    (["--min-samples-leaf", "3", "--param", "min_samples_leaf=3"], r"parameter 'min_samples_leaf' is given twice"),
])
def test_parameter_given_twice_is_refused(files, tmp_path, capsys, extra, pattern):
    out = str(tmp_path / "m.model")
    argv = [files["data"], "--out", out, "--model", "regression", "--outcome", "y", "--no-progress"] + extra
    assert re.search(pattern, _one_error(train.main, argv, capsys, "forest-train"))
    assert not os.path.exists(out)


def test_demo_default_tree_count_yields_to_param(tmp_path):
    out = str(tmp_path / "demo.model")
    assert train.main(["--demo", "--param", "n_estimators=3", "--no-progress", "--out", out]) == 0
    from forest.io import model_io

    assert model_io.load(out).n_estimators == 3

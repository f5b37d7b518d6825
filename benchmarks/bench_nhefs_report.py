"""forest-report on NHEFS's training file: out-of-bag calibration, as grf computes it (issue 30).

NHEFS (the causaldata package's copy; quitting smoking ``qsmk`` and weight change
``wt82_71``; the 1,566 rows with an outcome) with the nine covariates of the standard
analysis, categories coded as numbers (sex, race, age, education, smokeintensity,
smokeyrs, exercise, active, wt71). Trained with ``mpirun -np 2 forest-train ...
--n-estimators 2000``, then ``forest-report --json`` on the same file, three ways:

* the report now (the model recognises its training rows: out of bag);
* the same model file without its training-row signature (a file of before issue 30:
  the rows are treated as held out, in-sample predictions);
* the same forest fitted in Python, ``cf.test_calibration()`` (out of bag, grf's way).

Needs ``.venv-bench`` (``make bench-env``: causaldata). Run:
``.venv-bench/bin/python benchmarks/bench_nhefs_report.py``.
"""
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402

BIN = os.path.dirname(sys.executable)
COVARIATES = ("sex", "race", "age", "education", "smokeintensity", "smokeyrs", "exercise", "active", "wt71")
TREES = 2000


def nhefs_table():
    from causaldata import nhefs

    d = nhefs.load_pandas().data
    d = d[d["wt82_71"].notna()]
    cols = {c: (d[c].cat.codes.to_numpy() if str(d[c].dtype) == "category" else d[c].to_numpy()).astype(np.float64)
            for c in COVARIATES}
    cols["qsmk"] = d["qsmk"].to_numpy().astype(np.int64)
    cols["wt82_71"] = d["wt82_71"].to_numpy().astype(np.float64)
    return pa.table(cols)


def _figures(doc):
    cal = doc["analysis"]["calibration"]
    autoc = doc["analysis"]["rate"]["AUTOC"]
    return [doc["rows"]["source"], cal["estimate"][1], cal["stderr"][1], cal["pvalue"][1], autoc["estimate"][0],
            f"[{autoc['conf_low'][0]:.3g}, {autoc['conf_high'][0]:.3g}]"]


def main():
    start = time.time()
    table = nhefs_table()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        data = os.path.join(folder, "nhefs.parquet")
        pq.write_table(table, data, row_group_size=200)
        model = os.path.join(folder, "nhefs.model")
        subprocess.run([os.path.join(BIN, "mpirun"), "-np", "2", os.path.join(BIN, "forest-train"), data,
                        "--treatment", "qsmk", "--outcome", "wt82_71", "--n-estimators", str(TREES),
                        "--random-state", "0", "--no-progress", "--out", model], check=True)
        report = [os.path.join(BIN, "forest-report"), model, "--data", data, "--json"]
        doc = json.loads(subprocess.run(report, check=True, capture_output=True, text=True).stdout)
        rows.append(["forest-report on the training file (now)"] + _figures(doc))

        from forest.io import model_io

        header = model_io.read_header(model)
        est = model_io.load(model)
        del est.training_rows_                  # a model file written before issue 30
        old = os.path.join(folder, "old.model")
        model_io.save(est, old, metadata=header["metadata"])
        report[1] = old
        doc = json.loads(subprocess.run(report, check=True, capture_output=True, text=True).stdout)
        rows.append(["the same without its training-row signature (before issue 30)"] + _figures(doc))

        from forest import CausalForest

        X = np.column_stack([table[c].to_numpy() for c in COVARIATES])
        cf = CausalForest(TREES, random_state=0).fit(X, table["qsmk"].to_numpy(), table["wt82_71"].to_numpy())
        cal = cf.test_calibration()
        rows.append(["Python: CausalForest(2000).fit, cf.test_calibration() (out of bag)", "out-of-bag",
                     cal.estimate[1], cal.stderr[1], cal.pvalue[1], "", ""])
    body = (f"NHEFS from the causaldata package: {table.num_rows} rows with an outcome, covariates "
            f"{', '.join(COVARIATES)} (categories as codes), treatment qsmk, outcome wt82_71; {TREES} trees, "
            f"random_state 0, other parameters at their defaults; training under `mpirun -np 2 forest-train`.\n\n"
            + markdown_table(["report", "rows", "differential.forest.prediction", "se", "p (one-sided)",
                              "AUTOC", "AUTOC 95% CI"], rows)
            + f"\n\nWall time {time.time() - start:.0f} s.\n")
    print(body)
    write_results_section("Reports on training rows (issue 30)", body, title="NHEFS: report on the training file")


if __name__ == "__main__":
    main()

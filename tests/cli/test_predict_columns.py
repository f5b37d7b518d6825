"""forest-predict's output columns for effects of several arms and outcomes."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from forest import CausalForest

from forest.io import model_io
from forest.cli import predict
from native.comm import SelfCommunicator


def test_several_arms_and_outcomes_get_one_column_each(tmp_path):
    # (n, arms, outcomes) effects reached pyarrow as a 3-D array: a traceback
    rng = np.random.default_rng(2)
    n = 400
    a, b = rng.normal(size=(2, n))
    t = rng.integers(0, 3, n)
    y = a + (t == 1) * (1 + b) + (t == 2) * 2.0 + 0.3 * rng.normal(size=n)
    table = pa.table({"a": a, "b": b})
    cf = CausalForest(12, nuisance_estimators=6, random_state=0).fit(table, t, np.column_stack([y, -y]),
                                                                      comm=SelfCommunicator())
    effects = cf.predict(table)
    assert effects.shape == (n, 2, 2)
    cols = predict.prediction_columns(cf, table, True, 0.05, True)
    # arms by their level (arm 1 and arm 2 against control 0), outcomes by position
    assert {"tau_1_0", "tau_1_1", "tau_2_0", "tau_2_1", "tau_lower_2_0", "tau_upper_1_1"} <= set(cols)
    np.testing.assert_array_equal(cols["tau_2_0"], effects[:, 1, 0])
    model = str(tmp_path / "arms.model")
    model_io.save(cf, model)
    data = str(tmp_path / "x.parquet")
    pq.write_table(table, data)
    out = str(tmp_path / "p.parquet")
    assert predict.main([model, data, "--out", out, "--interval"]) == 0
    written = pq.read_table(out)
    np.testing.assert_array_equal(written["tau_1_1"].to_numpy(), effects[:, 0, 1])
    one = CausalForest(12, nuisance_estimators=6, random_state=0).fit(table, t + 5, y, comm=SelfCommunicator())
    assert set(predict.prediction_columns(one, table, False, 0.05, True)) == {"tau_6", "tau_7"}
    # forest-report labels them by the same rule
    from forest.report import summary as report

    labels, values = report.summarised_quantity(cf)[1](table)
    assert labels == ["tau_1_0", "tau_1_1", "tau_2_0", "tau_2_1"] and values.shape == (n, 4)
    np.testing.assert_array_equal(values[:, 2], effects[:, 1, 0])
    assert set(predict.prediction_columns(one, table.slice(0, 0), False, 0.05, True)) == {"tau_6", "tau_7"}

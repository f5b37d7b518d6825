"""Write ``demo.parquet``: the embedded data set behind ``forest-train --demo``.

Design (known answers, so the demo's report can be judged by eye):

- ``n = 6000`` rows, features ``x0..x7 ~ U(0, 1)`` stored as float32; 2 % of ``x7``
  is missing (NaN is a legal feature value);
- propensity ``e(x) = 0.25 + 0.5 x2`` and baseline ``m(x) = 2 x2 + x3``: ``x2``
  confounds treatment and outcome, which local centering must remove;
- effect ``tau(x) = 1 + 2 [x0 > 0.5] + x1``: only ``x0`` and ``x1`` modify the
  effect, so the causal forest's importance should rank them first;
- ``y = m(x) + t tau(x) + N(0, 1)``, ``t ~ Bernoulli(e(x))`` stored as int8;
- ``id`` (int64 row id) for ``forest-predict --keep id``, and ``tau_true`` (the true
  effect, not a feature) for checking predictions.

Six row groups of 1000 rows, so ``mpirun -np 2..6`` splits the file by row groups.
Run ``python -m forest.data.make_demo_data`` to regenerate it (deterministic).
"""
import os

import numpy as np

N_ROWS = 6000
N_FEATURES = 8
ROW_GROUP_SIZE = 1000
SEED = 20240601


def demo_table(n=N_ROWS, seed=SEED):
    """Build the demo data as a pyarrow Table.

    Parameters
    ----------
    n : int
        Number of rows.
    seed : int

    Returns
    -------
    pyarrow.Table
        Columns ``id, x0..x7, t, y, tau_true``.
    """
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    X = rng.uniform(size=(n, N_FEATURES)).astype(np.float32)
    x = X.astype(np.float64)
    e = 0.25 + 0.5 * x[:, 2]
    t = (rng.uniform(size=n) < e).astype(np.int8)
    tau = 1.0 + 2.0 * (x[:, 0] > 0.5) + x[:, 1]
    y = 2.0 * x[:, 2] + x[:, 3] + t * tau + rng.standard_normal(n)
    X[rng.uniform(size=n) < 0.02, 7] = np.nan
    cols = {"id": pa.array(np.arange(n, dtype=np.int64))}
    for j in range(N_FEATURES):
        cols[f"x{j}"] = pa.array(X[:, j], from_pandas=False)
    cols["t"] = pa.array(t)
    cols["y"] = pa.array(y)
    cols["tau_true"] = pa.array(tau)
    return pa.table(cols)


def main(path=None):
    """Write the demo parquet file (default: next to this script)."""
    import pyarrow.parquet as pq

    from forest.data import DEMO_PATH

    path = path or DEMO_PATH
    pq.write_table(demo_table(), path, row_group_size=ROW_GROUP_SIZE, compression="zstd")
    print(f"wrote {path} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Start-up measurements for issue 6 (run on a quiet machine, after `make setup`):
# forest-train --help, 10k-row mpirun -np 2 runs with a warm Numba cache, and one cold run.
cd "$(dirname "$0")/.."
export NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1
.venv/bin/python -c "
import sys; sys.path.insert(0, 'tests/cli')
import pyarrow.parquet as pq
from cli_helpers import make_table
pq.write_table(make_table(10000, seed=1), '/tmp/10k.parquet', row_group_size=1000)
"
echo "--help (3 runs, warm):"
for i in 1 2 3; do /usr/bin/time -f "%e s" .venv/bin/forest-train --help > /dev/null; done
for model in "gbdt-regressor --n-estimators 100" "causal --treatment t --n-estimators 200"; do
  echo "mpirun -np 2 forest-train 10k $model (warm cache):"
  for i in 1 2; do
    /usr/bin/time -f "%e s wall" .venv/bin/mpirun -np 2 .venv/bin/forest-train /tmp/10k.parquet --model $model --outcome y --features a b c --out /tmp/10k.model --no-progress 2>&1 | tail -2
  done
done
echo "cold Numba cache (empty NUMBA_CACHE_DIR), causal 200 trees:"
rm -rf /tmp/coldcache; mkdir /tmp/coldcache
NUMBA_CACHE_DIR=/tmp/coldcache /usr/bin/time -f "%e s wall" .venv/bin/mpirun -np 2 .venv/bin/forest-train /tmp/10k.parquet --model causal --treatment t --n-estimators 200 --outcome y --features a b c --out /tmp/10k.model --no-progress 2>&1 | tail -2

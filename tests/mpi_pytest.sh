#!/usr/bin/env bash
# Runs pytest on one MPI rank (launched as `mpirun -np K tests/mpi_pytest.sh ARGS...`).
# Rank 0 prints as usual; other ranks write to a log that is shown only if their run
# fails, so K interleaved progress lines do not bury the result.
rank=${PMI_RANK:-${OMPI_COMM_WORLD_RANK:-0}}
here=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$here/.venv/bin/python}
if [[ "$rank" == 0 ]]; then
  exec "$py" -m pytest "$@"
fi
log=$(mktemp "/tmp/histforest-rank${rank}.XXXXXX.log")
"$py" -m pytest "$@" >"$log" 2>&1
rc=$?
if [[ $rc -ne 0 ]]; then
  echo "---- rank $rank: pytest exit $rc ----" >&2
  tail -n 80 "$log" >&2
fi
rm -f "$log"
exit $rc

# The README's two commands: `make demo` and `make test`. Each does its own set-up.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# The demo needs the package alone: the test extra brings the CUDA toolchain wheels
# (numba-cuda[cu13], ~450 MB) that only `make test`'s PTX checks use.
DEMO_STAMP := $(VENV)/.installed-package-stamp
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed-stamp
# Oversubscribing a 2-core machine is how the MPI tests run; MPICH allows it by default.
MPIRUN = $(VENV)/bin/mpirun
MPI_TIMEOUT ?= 900

.PHONY: all setup test test-serial test-mpi demo bench bench-env clean

all: test

# The editable install records the top-level packages when it runs, so a changed
# package __init__ also triggers a reinstall (quick: the dependencies are already there).
$(STAMP): pyproject.toml native/__init__.py histogram/__init__.py forest/__init__.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# Package only (a reinstall keeps whatever the test extra already added to the venv).
$(DEMO_STAMP): pyproject.toml native/__init__.py histogram/__init__.py forest/__init__.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(DEMO_STAMP)

# Serial first: it also fills the Numba cache that the K ranks then share
# (~/.cache/histforest/numba-<source hash>, see histogram/_jit_cache.py).
test: $(STAMP)
	$(MAKE) --no-print-directory test-serial
	$(MAKE) --no-print-directory test-mpi

# The serial suite (collectives run on a world of size 1) in TEST_WORKERS pytest
# processes, a test file per worker at a time. Two, because most of a cold run is
# single-threaded: Numba compiling kernels into the (shared, atomically written) cache
# and tests waiting on the mpirun jobs they launch; one worker left a core idle. Tests
# marked `solo` bound the wall time of whole mpirun jobs, so they run afterwards, alone.
TEST_WORKERS ?= 2
test-serial: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not solo" tests
	$(PY) -m pytest -q -m solo tests

# Every test marked `mpi` runs again under real ranks, odd counts included. One Numba
# thread per rank: K ranks already oversubscribe the 2 cores; threads are covered serially.
test-mpi: $(STAMP)
	@for K in 2 3 4; do \
	  echo "== mpirun -np $$K pytest -m mpi"; \
	  NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 timeout $(MPI_TIMEOUT) $(MPIRUN) -np $$K tests/mpi_pytest.sh -q -m mpi -p no:cacheprovider tests || exit 1; \
	done

# The report reads the demo's own training rows: the model recognises them and reports
# out-of-bag estimates (README, "Training rows are analysed out of bag").
demo: $(DEMO_STAMP)
	$(VENV)/bin/mpirun -np 2 $(VENV)/bin/forest-train --demo --verbose --out /tmp/histforest-demo.model
	$(VENV)/bin/forest-report /tmp/histforest-demo.model --data forest/data/demo.parquet

# Anchors (LightGBM, XGBoost, EconML, causalml) live in their own venv: never runtime deps.
$(BENCH_STAMP): pyproject.toml benchmarks/requirements-anchors.txt
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install --quiet -e . -r benchmarks/requirements-anchors.txt
	touch $(BENCH_STAMP)

bench-env: $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python benchmarks/bench_histogram.py
	$(BENCH_VENV)/bin/python benchmarks/bench_collectives.py
	$(BENCH_VENV)/bin/python benchmarks/bench_gbdt.py
	$(BENCH_VENV)/bin/python benchmarks/bench_causal.py
	$(BENCH_VENV)/bin/python benchmarks/bench_analysis.py

clean:
	rm -rf $(VENV) $(BENCH_VENV) build *.egg-info

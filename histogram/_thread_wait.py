"""How Numba's idle worker threads wait between parallel regions.

Numba runs our parallel kernels on its OpenMP threading layer (GNU libgomp where no
TBB is installed). Between two parallel regions libgomp keeps each idle worker
spinning for ``GOMP_SPINCOUNT`` iterations (300,000 by default, a millisecond or so)
before it sleeps. A boosting fit enters a parallel region several times per split
step, a fraction of a millisecond apart, so its workers spin nearly all the time the
main thread runs Python. On cores of their own that costs nothing; on cores that
other processes want (a shared server, a notebook beside a browser, two pytest
workers, MPI ranks with threads on fewer cores) the spinning worker takes the core
the main thread or the other process needs, and a fit slows down many times over.
Measured on the 2-core machine (benchmarks/RESULTS.md, "Threads that wait"), the
categorical GBDT fit of ``benchmarks/bench_categorical.py`` at 200,000 rows, 2 threads:

* with two other processes busy (load 4-6): 15-38 s with libgomp's default, 51-66 s
  with ``OMP_WAIT_POLICY=active``, 5-7 s with ``GOMP_SPINCOUNT=20000``, 2.6-2.7 s with
  ``GOMP_SPINCOUNT=2000``, 3.1-4.6 s with ``OMP_WAIT_POLICY=passive``;
* on the quiet machine (medians of 3 fits, separate processes, alternating): 1.29-1.46 s
  with the default, 1.33-1.6 s with 20,000 spins (the same within the machine's drift),
  1.45-1.56 s with 2,000 (about 15 % slower: a worker that sleeps between a split step's
  regions must be woken), 1.9-2.1 s passive. LightGBM's own fit of the same data, which
  shares the process's libgomp when both are loaded: 1.25-1.35 s with the default or
  20,000 spins, 1.36-1.61 s with 2,000.

20,000 spins (tens of microseconds) cost nothing measurable on a quiet machine and cut
the loaded fit 3-5x; ``HISTFOREST_SPINCOUNT=2000`` halves it again on a machine known to
be crowded, at the quiet machine's 15 %.

BLAS's workers wait the same way, and no setting of ours reaches them: OpenBLAS (NumPy's)
keeps a worker spinning for about 0.1 s of CPU after every threaded call, which is any
``@`` / ``np.dot`` over more than ~10,000 rows. In a fit that spin lands on the core the
Numba threads are about to use. Two such dot products in the input checks and the boosting
baseline made a 50,000 x 10 boosting fit take 0.24 s instead of 0.14 s on 2 cores
(benchmarks/RESULTS.md, "GBDT shapes"). So code that runs during a fit sums over rows with
NumPy's own loops (``np.einsum``, ``np.sum``), never BLAS, and
``tests/forest/test_blas_quiet.py`` checks that no fit leaves a worker spinning.

So, unless the user chose a policy (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``; or
``HISTFOREST_SPINCOUNT``, ours, which ``default`` turns off), importing
:mod:`histogram` sets ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` in the environment:
libgomp reads it once, when it is loaded, which Numba does at the first parallel
kernel call. It is process-wide: another library in the same process that loads the
same libgomp later (LightGBM, XGBoost) waits the same way, and a libgomp already
loaded keeps its setting. Child processes inherit it.
"""
import os

#: Spins before an idle libgomp worker sleeps: long enough to catch the next region of a
#: split step without a sleep and wake-up, short enough that a worker gives its core back
#: within tens of microseconds (the measurements above).
SPIN_COUNT = 20000

#: Environment variables by which a user has already chosen how threads wait.
USER_CHOICES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def configure_thread_wait(environ=None):
    """Set ``GOMP_SPINCOUNT`` unless a wait policy was chosen (idempotent).

    Parameters
    ----------
    environ : MutableMapping, optional
        The environment to read and change (``os.environ`` by default; tests pass a dict).

    Returns
    -------
    str or None
        The spin count now set by this call, or None when the user's choice (or
        ``HISTFOREST_SPINCOUNT=default``) stands.
    """
    env = os.environ if environ is None else environ
    if any(env.get(name) for name in USER_CHOICES):
        return None
    ours = env.get("HISTFOREST_SPINCOUNT", "").strip()
    if ours.lower() == "default":
        return None
    if ours:
        if not ours.isdigit():
            # read at import: a bad value must not make every tool fail with a traceback
            import warnings

            warnings.warn(f"HISTFOREST_SPINCOUNT must be a count of spins or 'default', got {ours!r}: "
                          f"using {SPIN_COUNT}", stacklevel=2)
            ours = str(SPIN_COUNT)
        value = ours
    else:
        value = str(SPIN_COUNT)
    env["GOMP_SPINCOUNT"] = value
    return value

"""Compiling the Numba kernels before the first fit: warm-up fits, stamps, one compile per node.

The first fit on a machine compiles the kernels its model needs (seconds to tens of
seconds, see ``benchmarks/bench_cold_start.py``); later processes load them from
Numba's on-disk cache (:mod:`histogram._jit_cache`). This module makes that step
visible and shared:

* :func:`warm_up` fits a small model of each named *variant* on synthetic data, so
  that every kernel that variant's fits call is compiled into the cache, and leaves a
  *stamp* file per variant next to the cache (:func:`is_warm`). A variant is a model
  kind plus whatever selects different compiled specialisations (the causal forest's
  binary, multi-arm and continuous treatments; boosting's two losses).
* :func:`compile_once_per_node` is what ``forest-train`` calls before binning: when a
  variant is not stamped on some rank, rank 0 prints one line, the lowest rank of each
  node (:mod:`native.topology`) runs the warm-up while the node's other ranks wait
  for it, and those then load the kernels from the cache instead of all compiling
  the same code at once. The time shows as the ``compile`` phase of ``--verbose``.
* ``forest-warmup`` (:func:`main`) fills the cache ahead of time, e.g. in a container
  image build, for all variants or those of ``--model``.

The synthetic data have 5,000 rows (above the row counts at which kernels switch to
their multi-threaded versions), four features with missing values, and the targets
each variant needs; each is fitted with one thread and, when the process has more
(``NUMBA_NUM_THREADS``), again with all of them. A warm-up is best effort: a failure inside it is reported and the
real fit goes on (compiling what is still missing, or raising its own error).
"""
import argparse
import contextlib
import os
import sys
import time

import histogram  # noqa: F401  (first: sets Numba's cache directory, see histogram._jit_cache)

PROG = "forest-warmup"

#: Variant name -> one-line description (the keys of :data:`_FITS`).
VARIANTS = {
    "gbdt-classifier": "GBDTClassifier, binary labels (logistic loss)",
    "gbdt-regressor": "GBDTRegressor (squared error)",
    "gbdt-classifier-quantized": "GBDTClassifier with quantized=True (integer histograms)",
    "gbdt-regressor-quantized": "GBDTRegressor with quantized=True",
    "regression": "RegressionForest (also the causal forest's nuisance forests)",
    "probability": "ProbabilityForest without sample weights (its one-hot criterion, forest.criteria.one_hot; "
                   "weighted fits use the regression variant's kernels)",
    "causal-binary": "CausalForest, binary treatment, with its nuisance forests",
    "causal-multiarm": "CausalForest, three-arm treatment",
    "causal-continuous": "CausalForest, continuous treatment",
    "causal-given": "CausalForest, binary treatment, nuisance estimates given (y_hat, t_hat): no nuisance "
                    "forest, so its kernels are not shared with them (forest.criteria.compiled.PairedRecord)",
    "instrumental": "InstrumentalForest, with its nuisance forests",
    "quantile": "QuantileForest (its relabelling split, outcome lists and quantile prediction)",
    "survival": "SurvivalForest (its log-rank split, time lists and survival curves)",
    "causal-survival": "CausalSurvivalForest (its survival nuisance forests, censoring-adjusted outcomes and the "
                       "causal forest of them, nuisance given)",
    "batch-walk": "the batch tree walk: out-of-bag sums of big forest fits (forest.engine.predictor."
                  "OOB_BATCH_MIN_PAIRS) and predict() on many rows",
}

#: ``--model`` names (as forest-train spells them) -> their variants.
MODEL_VARIANTS = {
    # quantized=True GBDT has its own kernels: variants gbdt-*-quantized, warmed by a
    # plain forest-warmup, by --model gbdt-classifier-quantized, or by forest-train's
    # first quantized fit (variants_for); most users never need them.
    "gbdt-classifier": ("gbdt-classifier",),
    "gbdt-regressor": ("gbdt-regressor",),
    "regression": ("regression", "batch-walk"),
    "causal": ("causal-binary", "causal-multiarm", "causal-continuous", "causal-given", "batch-walk"),
    "instrumental": ("instrumental", "batch-walk"),
    "quantile": ("quantile",),
    "survival": ("survival",),
    "causal-survival": ("causal-survival",),
    # a probability forest is a regression forest on one-hot labels, with its own criterion without weights
    "probability": ("probability", "regression", "batch-walk"),
}

#: Rows of the synthetic warm-up data.
WARMUP_ROWS = 5000

#: The line rank 0 prints before compiling.
COMPILE_MESSAGE = "compiling kernels (first run on this machine)..."


def _data(n=WARMUP_ROWS, n_features=4, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, n_features))
    X[rng.uniform(size=X.shape) < 0.05] = np.nan
    return rng, X, np.nan_to_num(X[:, 0]) + rng.normal(size=n)


def _fit_variant(variant):
    import warnings

    import numpy as np

    from forest import CausalForest, GBDTClassifier, GBDTRegressor, InstrumentalForest, RegressionForest
    from forest.engine.growth_options import engine_options
    from native.comm import SelfCommunicator

    # This process alone (under mpirun the other ranks wait, outside any collective).
    comm = SelfCommunicator()
    rng, X, y = _data()
    quantized = variant.endswith("-quantized")
    if variant.startswith("gbdt"):
        # Both best-first loops: one process grows its trees in the compiled loop, several
        # ranks in the Python one (forest.engine.best_first), and the stamp serves both.
        for compiled in (False,) if quantized else (True, False):
            with engine_options(compiled_best_first=compiled):
                if variant.startswith("gbdt-classifier"):
                    GBDTClassifier(n_estimators=2, random_state=0, quantized=quantized).fit(
                        X, (y > 0).astype(int), comm=comm)
                else:
                    GBDTRegressor(n_estimators=2, random_state=0, quantized=quantized).fit(X, y, comm=comm)
    elif variant == "instrumental":
        z = (rng.uniform(size=len(y)) < 0.5).astype(float)
        t = z * (rng.uniform(size=len(y)) < 0.8)
        InstrumentalForest(n_estimators=4, nuisance_estimators=4, random_state=0).fit(X, t, y + t, z, comm=comm)
    elif variant == "regression":
        RegressionForest(n_estimators=4, random_state=0).fit(X, y, comm=comm)
    elif variant == "probability":
        from forest import ProbabilityForest
        ProbabilityForest(n_estimators=4, random_state=0).fit(X, np.digitize(y, [-0.5, 0.5]), comm=comm)
    elif variant == "quantile":
        from forest import QuantileForest
        QuantileForest(n_estimators=4, random_state=0).fit(X, y, comm=comm).predict(X[:10])
    elif variant == "survival":
        from forest import SurvivalForest
        time = rng.exponential(size=len(y)) * np.exp(-np.nan_to_num(X[:, 0]))
        SurvivalForest(n_estimators=4, random_state=0).fit(X, time, rng.uniform(size=len(y)) < 0.7,
                                                           comm=comm).predict(X[:10])
    elif variant == "causal-survival":
        from forest import CausalSurvivalForest
        time = rng.exponential(size=len(y)) * np.exp(-np.nan_to_num(X[:, 0]))
        t = (rng.uniform(size=len(y)) < 0.5).astype(float)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # censoring-probability warnings of random data
            CausalSurvivalForest(horizon=float(np.median(time)), n_estimators=4, nuisance_estimators=4,
                                 survival_estimators=4, random_state=0).fit(
                X, t, time, rng.uniform(size=len(y)) < 0.7, comm=comm).predict(X[:10])
    elif variant == "batch-walk":
        with _batch_oob_forced():
            RegressionForest(n_estimators=4, random_state=0).fit(X, y, comm=comm)
    elif variant == "causal-given":
        t = (rng.uniform(size=len(y)) < 0.5).astype(float)
        CausalForest(n_estimators=4, random_state=0).fit(X, t, y + t, y_hat=np.full(len(y), float(np.mean(y + t))),
                                                         t_hat=np.full(len(y), 0.5), comm=comm)
    elif variant.startswith("causal-"):
        t = {"causal-binary": lambda: (rng.uniform(size=len(y)) < 0.5).astype(float),
             "causal-multiarm": lambda: rng.integers(0, 3, size=len(y)),
             "causal-continuous": lambda: rng.normal(size=len(y))}[variant]()
        CausalForest(n_estimators=4, nuisance_estimators=4, random_state=0).fit(X, t, y + t, comm=comm)
    else:
        raise ValueError(f"unknown warm-up variant {variant!r}; expected one of {sorted(VARIANTS)}")


# ----------------------------------------------------------------------------- stamps

def _stamp_dir():
    from histogram._jit_cache import configure_numba_cache, source_key
    from pathlib import Path

    cache = configure_numba_cache()
    if not cache:
        return None
    # The source key in the name: a user's own NUMBA_CACHE_DIR outlives source edits.
    key = source_key(Path(__file__).resolve().parent.parent)
    return os.path.join(cache, "histforest-warm", key)


def is_warm(variant):
    """Whether :func:`warm_up` has completed ``variant`` in this cache directory.

    Returns
    -------
    bool
    """
    d = _stamp_dir()
    return d is not None and os.path.exists(os.path.join(d, variant))


def _stamp(variant):
    d = _stamp_dir()
    if d is None:
        return
    try:
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, variant), "w") as fh:
            fh.write(f"{time.time():.0f}\n")
    except OSError:
        pass  # a read-only cache: the next process warms up again, harmlessly


def _thread_counts():
    """One thread, then all of this process's Numba threads: kernels choose their serial
    or their ``parallel=True`` version by the thread count at the call, so both run."""
    import numba

    return sorted({1, numba.config.NUMBA_NUM_THREADS})


@contextlib.contextmanager
def _numba_threads(n):
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(n)
    try:
        yield
    finally:
        numba.set_num_threads(before)


@contextlib.contextmanager
def _batch_oob_forced():
    """Out-of-bag sums by the batch walk whatever the size (the ``batch-walk`` variant).

    A big forest fit takes that route (:data:`forest.engine.predictor.OOB_BATCH_MIN_PAIRS`),
    and ``predict`` shares its compiled kernels; a small warm-up fit would skip it.
    """
    from forest.engine import predictor

    before = predictor.OOB_BATCH_MIN_PAIRS
    predictor.OOB_BATCH_MIN_PAIRS = 0
    try:
        yield
    finally:
        predictor.OOB_BATCH_MIN_PAIRS = before


def warm_up(variants, log=None):
    """Fit each variant's small model (compiling or loading its kernels) and stamp it.

    Parameters
    ----------
    variants : iterable of str
        Keys of :data:`VARIANTS`.
    log : callable or None
        ``log(line)`` receives one line per variant (name, seconds) and any failure.

    Returns
    -------
    dict
        Variant -> seconds it took, or the failure message (str).
    """
    import warnings

    done = {}
    for variant in variants:
        if variant not in VARIANTS:
            raise ValueError(f"unknown warm-up variant {variant!r}; expected one of {sorted(VARIANTS)}")
        start = time.perf_counter()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for threads in _thread_counts():
                    with _numba_threads(threads):
                        _fit_variant(variant)
        except Exception as exc:  # best effort: the real fit reports real problems
            done[variant] = f"failed: {type(exc).__name__}: {exc}"
        else:
            done[variant] = time.perf_counter() - start
            _stamp(variant)
        if log is not None:
            result = done[variant]
            log(f"{variant}: {result:.1f} s" if isinstance(result, float) else f"{variant}: {result}")
    return done


def compile_once_per_node(comm, variants, announce=None):
    """Warm ``variants`` up on one rank per node while the node's other ranks wait.

    Collective over ``comm``. Does nothing (one all-gather) when every rank finds
    every variant stamped.

    Parameters
    ----------
    comm : native.comm.Communicator
    variants : sequence of str
    announce : callable or None
        Called on rank 0 with :data:`COMPILE_MESSAGE` when some rank compiles.

    Returns
    -------
    bool
        Whether a warm-up ran on some rank.
    """
    from native import collectives as col
    from native.topology import topology

    variants = [v for v in variants if v in VARIANTS]
    missing = [v for v in variants if not is_warm(v)]
    if not any(col.allgather_object(comm, bool(missing))):
        return False
    if comm.rank == 0 and announce is not None:
        announce(COMPILE_MESSAGE)
    node = topology(comm).node_comm(comm) if comm.size > 1 else comm
    if node.rank == 0 and missing:
        warm_up(missing)
    # The others wait in this broadcast (their watchdogs see the leader burning CPU
    # time, not a stall), then load what it compiled from the cache at first use.
    col.bcast_object(node, None)
    return True


def variants_for(kind, treatment_values=None, treatment_type=None, n_rows=0, n_estimators=0, quantized=False):
    """The warm-up variants ``forest-train --model kind`` needs.

    Parameters
    ----------
    kind : str
        A ``--model`` name.
    treatment_values : sequence or None
        Up to three distinct treatment values (causal models).
    treatment_type : str or None
        The treatment column's type name (an integer type with more than two values
        means arms, a float type a continuous dose).
    n_rows, n_estimators : int
        Rows (over all ranks) and trees of the fit: a forest fit whose out-of-bag
        sums walk at least :data:`forest.engine.predictor.OOB_BATCH_MIN_PAIRS` (row, tree)
        pairs (a causal forest's nuisance forests have at least 50 trees) also needs
        ``batch-walk``.
    quantized : bool
        A GBDT fit with ``quantized=True``.

    Returns
    -------
    tuple of str
    """
    from forest.engine.predictor import OOB_BATCH_MIN_PAIRS

    if kind in ("gbdt-classifier", "gbdt-regressor"):
        return (f"{kind}-quantized",) if quantized else (kind,)
    if kind not in ("causal", "regression", "instrumental"):
        return MODEL_VARIANTS.get(kind, ())
    trees = max(int(n_estimators), 50) if kind in ("causal", "instrumental") else int(n_estimators)
    batch = ("batch-walk",) if int(n_rows) * trees >= OOB_BATCH_MIN_PAIRS else ()
    if kind in ("regression", "instrumental"):
        return (kind,) + batch
    if treatment_values is not None and len(treatment_values) <= 2:
        return ("causal-binary",) + batch
    if treatment_type is not None and treatment_type.startswith(("int", "uint", "bool")):
        return ("causal-multiarm",) + batch
    return ("causal-continuous",) + batch


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Compile histforest's Numba kernels into the on-disk cache ahead of the first fit "
                    "(e.g. while building a container image), so that later processes only load them.",
        epilog="variants: " + "; ".join(f"{k} ({v})" for k, v in VARIANTS.items()))
    p.add_argument("--model", action="append", choices=sorted(set(MODEL_VARIANTS) | set(VARIANTS)),
                   help="a forest-train model name or a variant (repeatable; default: all variants)")
    p.add_argument("--force", action="store_true", help="run the warm-up fits even where stamped")
    p.add_argument("--quiet", "-q", action="store_true", help="print nothing but errors")
    return p


def main(argv=None):
    """``forest-warmup``: fill the kernel cache; exit 1 if a variant failed."""
    args = build_parser().parse_args(argv)
    chosen = []
    for name in args.model or list(VARIANTS):
        for v in MODEL_VARIANTS.get(name, (name,)):
            if v not in chosen:
                chosen.append(v)
    todo = [v for v in chosen if args.force or not is_warm(v)]
    from histogram._jit_cache import configure_numba_cache

    def log(line):
        if not args.quiet:
            print(f"{PROG}: {line}", file=sys.stderr, flush=True)

    log(f"cache directory {configure_numba_cache() or '(Numba default)'}; "
        f"{len(chosen) - len(todo)} of {len(chosen)} variant(s) already warm")
    done = warm_up(todo, log=log)
    failed = [v for v, r in done.items() if isinstance(r, str)]
    for v in failed:
        print(f"{PROG}: {v} {done[v]}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

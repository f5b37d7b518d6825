"""Does a narrower histogram element make the histogram kernel faster? (issue 16, quantized)

Quantized boosting was expected to speed up the histogram kernels because each bin
update adds a small integer instead of a (gradient, hessian) float pair. This script
isolates that question: it runs the engine's own single-node kernels
(:func:`histogram.cpu_kernels._gh_features`, and :func:`_gh_features_packed` for the
root) over the same codes with one element per row of each type:

* ``complex128``: the float path's (g, h) pair (16 bytes, a vector add);
* ``int64``: the quantized path's packed ``g * 2**32 + h`` code (what ships today);
* ``int32`` and ``int16``: the 16|16-bit and 8|8-bit packings a narrower accumulator
  would use (the kernel is the same; only the element type changes).

Cases: the root (every row, contiguous) and a node holding a random quarter of the
rows (gathered pairs, sorted row ids), 1,000,000 rows x 28 features x 256 bins,
one thread. Reported: nanoseconds per bin update (rows x features), best of
``--repeats`` runs after one compile-and-warm run.

Usage::

    NUMBA_NUM_THREADS=1 .venv/bin/python benchmarks/bench_hist_width.py
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from histogram.cpu_kernels import _gh_features, _gh_features_packed, pack_codes  # noqa: E402

ELEMENTS = ("complex128", "int64", "int32", "int16")


def _best(fn, repeats):
    fn()
    best = np.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure(n_rows, n_features, n_bins, repeats, seed=0):
    """Rows of ``(case, kernel, element, ns per update)``."""
    rng = np.random.default_rng(seed)
    binned = rng.integers(0, n_bins - 1, (n_features, n_rows)).astype(np.uint8)
    packed = pack_codes(binned)
    rows = np.sort(rng.choice(n_rows, n_rows // 4, replace=False)).astype(np.int32)
    out_rows = []
    for element in ELEMENTS:
        dtype = np.dtype(element)
        if dtype.kind == "c":
            values = (rng.normal(size=n_rows) + 1j * rng.normal(size=n_rows)).astype(dtype)
        else:
            values = rng.integers(-8, 9, n_rows).astype(dtype)
        hist = np.zeros((n_features, n_bins), dtype=dtype)
        root = _best(lambda: _gh_features(binned, values, rows, 0, n_rows, True, 0, n_features, hist), repeats)
        out_rows.append(("root", "byte codes", element, root / (n_rows * n_features) * 1e9))
        root_p = _best(lambda: _gh_features_packed(packed, values, 0, n_rows, 0, n_features, hist), repeats)
        out_rows.append(("root", "4 codes per load", element, root_p / (n_rows * n_features) * 1e9))
        gathered = np.ascontiguousarray(values[rows])
        part = _best(lambda: _gh_features(binned, gathered, rows, 0, len(rows), False, 0, n_features, hist), repeats)
        out_rows.append(("quarter of the rows", "byte codes", element, part / (len(rows) * n_features) * 1e9))
    return out_rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--features", type=int, default=28)
    p.add_argument("--bins", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    import numba

    print(f"{args.rows:,} rows x {args.features} features x {args.bins} bins, "
          f"{numba.get_num_threads()} Numba thread(s), best of {args.repeats}")
    print("| node | kernel | element | ns per bin update |")
    print("|------|--------|---------|-------------------|")
    for case, kernel, element, ns in measure(args.rows, args.features, args.bins, args.repeats):
        print(f"| {case} | {kernel} | {element} | {ns:.3f} |")


if __name__ == "__main__":
    main()

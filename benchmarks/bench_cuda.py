"""CUDA histogram kernel on a real GPU: checked against the NumPy reference, timed against Numba CPU.

Meant for a machine with an NVIDIA GPU (CI and the 2-core dev machine have none; their
tests run the same kernel on Numba's simulator and compile it to PTX). One run does:

1. **Correctness on the device**: :func:`histogram.kernels.build_histograms` with
   ``backend="cuda"`` against :func:`histogram.reference.build_histograms_numpy` for
   1..40 channels, 16..256 bins, empty nodes, nodes spanning many tiles and several
   launch shapes; then 1M rows x 28 features against the Numba CPU kernel. Tolerance:
   ``1e-9`` of the sum of absolute values in the bin (atomics add in any order).
2. **Kernel timings** for ``n`` rows x 28 features x 256 bins, 2 and 6 float64
   channels, the root (all rows) and one 32-node level (every row in one of 32 nodes):

   * ``gpu kernel``: the launch alone (zeroing + histogram kernel) on inputs already on
     the device, timed with CUDA events;
   * ``gpu build``: :meth:`histogram.cuda_kernels.CudaHistogramContext.build`, what a
     fit pays per level: channels and row ids up, histograms back, codes already there;
   * ``gpu one-shot``: ``build_histograms(backend="cuda")``, which also uploads the codes;
   * ``cpu numba``: ``build_histograms(backend="numba")`` on all CPU threads and on 2.

3. **Launch shapes**: threads per block x rows per tile for the root, kernel alone.
4. **One boosting fit** end to end: ``GBDTClassifier`` on ``--fit-rows`` rows, CUDA
   backend vs Numba backend on all threads, same trees up to summation order.

Usage::

    python benchmarks/bench_cuda.py --out DIR        # writes DIR/cuda.md and DIR/cuda.json
    python benchmarks/bench_cuda.py --quick          # small sizes (works on the simulator)
"""
import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from _harness import cpu_model  # noqa: E402
from bench_histogram import best_time  # noqa: E402

N_FEATURES = 28
N_BINS = 256


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or "unknown GPU"
    except (OSError, subprocess.SubprocessError):
        return "simulator" if os.environ.get("NUMBA_ENABLE_CUDASIM") else "unknown GPU"


def level_rows(rng, n, n_nodes):
    """Row ids grouped into ``n_nodes`` random nodes, sorted within a node (as a partition leaves them)."""
    node = rng.integers(0, n_nodes, size=n)
    order = np.argsort(node, kind="stable").astype(np.int32)
    starts = np.searchsorted(node[order], np.arange(n_nodes + 1)).astype(np.int64)
    return order, starts


def check_correctness(rng, big_rows, n=5000):
    """Device results against the NumPy reference (small) and the Numba kernel (big)."""
    from histogram.kernels import build_histograms
    from histogram.reference import build_histograms_numpy

    worst = 0.0
    cases = 0
    F = 7
    for n_bins in (16, 64, 256):
        binned = rng.integers(0, n_bins, size=(F, n)).astype(np.uint8)
        for n_channels in (1, 2, 3, 6, 14, 40):
            for sizes in ([n], [0, n // 4, 1, n // 2, 0], [n // 200] * 40):
                channels = rng.normal(size=(n, n_channels))
                rows = rng.permutation(n)[:sum(sizes)].astype(np.int32)
                ns = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
                ref = build_histograms_numpy(binned, channels, rows, ns, n_bins)
                scale = build_histograms_numpy(binned, np.abs(channels), rows, ns, n_bins)
                got = build_histograms(binned, channels, rows, ns, n_bins, backend="cuda")
                err = np.abs(got - ref) / (scale + 1e-300)
                worst = max(worst, float(err.max()))
                assert np.all(np.abs(got - ref) <= 1e-9 * scale + 1e-300), (n_bins, n_channels, sizes)
                cases += 1
    # odd launch shapes: tiny tiles and blocks, so nodes span many blocks and threads stride
    from histogram.cuda_kernels import CudaHistogramContext
    binned = rng.integers(0, 256, size=(F, n)).astype(np.uint8)
    for rpb, tpb in ((64, 32), (1000, 96), (100000, 1024)):
        ctx = CudaHistogramContext(binned, 256, rows_per_block=rpb, threads_per_block=tpb)
        channels = rng.normal(size=(n, 3))
        rows, ns = level_rows(rng, n, 5)
        ref = build_histograms_numpy(binned, channels, rows, ns, 256)
        scale = build_histograms_numpy(binned, np.abs(channels), rows, ns, 256)
        got = ctx.build(channels, rows, ns)
        assert np.all(np.abs(got - ref) <= 1e-9 * scale + 1e-300), (rpb, tpb)
        cases += 1
    # full size against the Numba CPU kernel (the reference is too slow there)
    binned = rng.integers(0, 256, size=(N_FEATURES, big_rows)).astype(np.uint8)
    channels = rng.normal(size=(big_rows, 6))
    rows, ns = level_rows(rng, big_rows, 32)
    cpu = build_histograms(binned, channels, rows, ns, 256, backend="numba")
    gpu = build_histograms(binned, channels, rows, ns, 256, backend="cuda")
    scale = build_histograms(binned, np.abs(channels), rows, ns, 256, backend="numba")
    big_err = float((np.abs(gpu - cpu) / (scale + 1e-300)).max())
    assert big_err <= 1e-9, big_err
    return dict(cases=cases + 1, worst_rel=worst, big_rel=big_err, big_rows=big_rows)


def gpu_kernel_ms(ctx, d_channels, d_rows, ns, repeat):
    """Best launch time in ms (zeroing + histogram kernel) by CUDA events."""
    from numba import cuda

    ctx.launch(d_channels, d_rows, ns)
    ctx.stream.synchronize()
    best = float("inf")
    for _ in range(repeat):
        start, stop = cuda.event(), cuda.event()
        start.record(ctx.stream)
        ctx.launch(d_channels, d_rows, ns)
        stop.record(ctx.stream)
        stop.synchronize()
        best = min(best, start.elapsed_time(stop))
    return best


def kernel_table(rng, n, repeat):
    import numba
    from numba import cuda

    from histogram.cuda_kernels import CudaHistogramContext
    from histogram.kernels import build_histograms

    all_threads = numba.config.NUMBA_NUM_THREADS
    binned = rng.integers(0, 256, size=(N_FEATURES, n)).astype(np.uint8)
    ctx = CudaHistogramContext(binned, N_BINS)
    out_rows = []
    for n_channels in (2, 6):
        channels = rng.normal(size=(n, n_channels))
        d_channels = cuda.to_device(channels)
        for case in ("root", "32-node level"):
            if case == "root":
                rows = np.arange(n, dtype=np.int32)
                ns = np.array([0, n], dtype=np.int64)
                cpu_rows = None
            else:
                rows, ns = level_rows(rng, n, 32)
                cpu_rows = rows
            d_rows = cuda.to_device(rows)
            n_nodes = ns.shape[0] - 1
            out = np.empty((n_nodes, N_FEATURES, N_BINS, n_channels))
            timings = {}
            timings["gpu kernel"] = gpu_kernel_ms(ctx, d_channels, d_rows, ns, repeat)
            timings["gpu build"] = 1e3 * best_time(lambda: ctx.build(channels, rows, ns, out=out), repeat)
            timings["gpu one-shot"] = 1e3 * best_time(
                lambda: build_histograms(binned, channels, rows, ns, N_BINS, backend="cuda", out=out), repeat)
            for threads in sorted({all_threads, 2}, reverse=True):
                numba.set_num_threads(threads)
                timings[f"cpu numba {threads} thr"] = 1e3 * best_time(
                    lambda: build_histograms(binned, channels, cpu_rows, ns, N_BINS, backend="numba", out=out),
                    repeat)
            numba.set_num_threads(all_threads)
            out_rows.append(dict(channels=n_channels, case=case, ms=timings))
            print(f"  {n:,} rows, {n_channels} ch, {case}: "
                  + ", ".join(f"{k} {v:.2f} ms" for k, v in timings.items()), flush=True)
    return out_rows


def launch_sweep(rng, n, repeat):
    from numba import cuda

    from histogram.cuda_kernels import CudaHistogramContext

    binned = rng.integers(0, 256, size=(N_FEATURES, n)).astype(np.uint8)
    d_binned_ctx = CudaHistogramContext(binned, N_BINS)
    results = []
    ns = np.array([0, n], dtype=np.int64)
    d_rows = cuda.to_device(np.arange(n, dtype=np.int32))
    for n_channels in (2, 6):
        d_channels = cuda.to_device(rng.normal(size=(n, n_channels)))
        for tpb in (128, 256, 512):
            for rpb in (1024, 4096, 16384, 65536):
                d_binned_ctx.threads_per_block = tpb
                d_binned_ctx.rows_per_block = rpb
                ms = gpu_kernel_ms(d_binned_ctx, d_channels, d_rows, ns, repeat)
                results.append(dict(channels=n_channels, threads=tpb, rows_per_tile=rpb, ms=ms))
    return results


def fit_compare(rng, n, n_estimators):
    import numba

    from forest import GBDTClassifier

    X = rng.normal(size=(n, N_FEATURES))
    logit = X[:, 0] - 0.5 * X[:, 1] + 0.5 * X[:, 2] * X[:, 3]
    y = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    import histogram.cuda_kernels as ck

    # Count the timed fit's host-to-device bytes: record the contexts it creates.
    contexts = []
    init = ck.CudaHistogramContext.__init__

    def recording_init(self, *a, **k):
        init(self, *a, **k)
        contexts.append(self)

    res = {}
    preds = {}
    for backend in ("numba", "cuda"):
        # warm-up on a slice so the timed fit pays no compilation
        GBDTClassifier(n_estimators=2, backend=backend, random_state=0).fit(X[:20000], y[:20000])
        ck.CudaHistogramContext.__init__ = recording_init
        try:
            t0 = time.perf_counter()
            model = GBDTClassifier(n_estimators=n_estimators, backend=backend, random_state=0).fit(X, y)
            res[backend] = time.perf_counter() - t0
        finally:
            ck.CudaHistogramContext.__init__ = init
        preds[backend] = model.predict_proba(X[:100000])[:, 1]
    res["max_prob_diff"] = float(np.abs(preds["numba"] - preds["cuda"]).max())
    res["uploaded_mb"] = sum(c.uploaded_bytes for c in contexts) / 1e6
    res["channel_uploads"] = sum(c.channel_uploads for c in contexts)
    res["threads"] = numba.config.NUMBA_NUM_THREADS
    return res


def render(info, correct, table, sweep, fit, args):
    lines = [f"Command: `python benchmarks/bench_cuda.py{' --quick' if args.quick else ''} --out DIR` "
             f"(run on the lent GPU machine; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
             "",
             f"GPU: {info['gpu']}. CPU: {info['cpu']}, {info['cpus']} logical CPUs. "
             f"numba {info['numba']}, numba-cuda {info['numba_cuda']}, numpy {info['numpy']}.",
             ""]
    if correct:
        lines += [f"Correctness on the device: {correct['cases']} cases (1-40 channels, 16-256 bins, "
                  f"empty nodes, odd launch shapes) within 1e-9 of the bin's absolute sum of the NumPy "
                  f"reference (worst {correct['worst_rel']:.1e}); {correct['big_rows']:,} rows x 28 features "
                  f"x 6 channels, 32 nodes, against the Numba CPU kernel: worst {correct['big_rel']:.1e}.", ""]
    if table:
        keys = list(table[0]["ms"])
        lines += [f"Kernel timings, {args.rows:,} rows x 28 features x 256 bins, best of {args.repeat} "
                  f"(ms; `gpu kernel` by CUDA events, the rest wall clock):", "",
                  "| channels | case | " + " | ".join(keys) + " | cpu best / gpu build |",
                  "|---:|---|" + "---:|" * (len(keys) + 1)]
        for r in table:
            cpu_best = min(v for k, v in r["ms"].items() if k.startswith("cpu"))
            lines.append(f"| {r['channels']} | {r['case']} | "
                         + " | ".join(f"{r['ms'][k]:.2f}" for k in keys)
                         + f" | {cpu_best / r['ms']['gpu build']:.1f}x |")
        lines.append("")
    if sweep:
        lines += ["Launch shapes, root, kernel alone (ms):", "",
                  "| channels | threads/block | rows/tile | ms |", "|---:|---:|---:|---:|"]
        for r in sweep:
            lines.append(f"| {r['channels']} | {r['threads']} | {r['rows_per_tile']} | {r['ms']:.3f} |")
        lines.append("")
    if fit:
        lines += [f"One fit: `GBDTClassifier(n_estimators={args.fit_trees})` on {args.fit_rows:,} rows x 28 "
                  f"features: Numba backend ({fit['threads']} threads) {fit['numba']:.2f} s, CUDA backend "
                  f"{fit['cuda']:.2f} s; largest difference in predicted probability "
                  f"{fit['max_prob_diff']:.1e}; the CUDA fit moved {fit['uploaded_mb']:.1f} MB host to "
                  f"device ({fit['channel_uploads']} gradient uploads: one per tree).", ""]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (simulator-friendly)")
    p.add_argument("--rows", type=int, default=None)
    p.add_argument("--out", default=None, help="folder for cuda.md and cuda.json")
    p.add_argument("--steps", default="correct,table,sweep,fit",
                   help="comma-separated subset of correct,table,sweep,fit")
    args = p.parse_args(argv)
    args.rows = args.rows or (2000 if args.quick else 10_000_000)
    args.repeat = 1 if args.quick else 10
    args.fit_rows = 3000 if args.quick else 1_000_000
    args.fit_trees = 2 if args.quick else 50

    import numba
    from numba import cuda
    try:
        import numba_cuda
        numba_cuda_version = numba_cuda.__version__
    except Exception:  # older layouts ship CUDA inside numba
        numba_cuda_version = "in numba"
    info = dict(gpu=gpu_name(), cpu=cpu_model(), cpus=os.cpu_count(), numba=numba.__version__,
                numba_cuda=numba_cuda_version, numpy=np.__version__)
    print(info, flush=True)
    if not cuda.is_available():
        sys.exit("no CUDA device (set NUMBA_ENABLE_CUDASIM=1 for the simulator)")
    rng = np.random.default_rng(0)
    results = dict(info=info)
    failed = False
    steps = [("correct", lambda: check_correctness(rng, 3000 if args.quick else 1_000_000, 400 if args.quick else 5000)),
             ("table", lambda: kernel_table(rng, args.rows, args.repeat)),
             ("sweep", lambda: launch_sweep(rng, 2000 if args.quick else 1_000_000, max(1, args.repeat // 2))),
             ("fit", lambda: fit_compare(rng, args.fit_rows, args.fit_trees))]
    wanted = set(args.steps.split(","))
    for name, step in steps:
        results[name] = None
        if name not in wanted:
            continue
        t0 = time.perf_counter()
        try:
            results[name] = step()
            print(f"{name}: done in {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception:  # report and go on: one broken step must not lose the others
            failed = True
            results[name] = None
            print(f"{name}: FAILED\n{traceback.format_exc()}", flush=True)
    text = render(info, results["correct"], results["table"], results["sweep"], results["fit"], args)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "cuda.md").write_text(text)
        (out / "cuda.json").write_text(json.dumps(results, indent=1, default=str))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

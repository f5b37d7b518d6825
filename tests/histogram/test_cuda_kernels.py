"""The CUDA kernel: on Numba's simulator against the NumPy reference, and compiled to PTX.

The simulator must be switched on before ``numba.cuda`` is first imported, so those
checks run in a fresh subprocess with ``NUMBA_ENABLE_CUDASIM=1``. PTX compilation needs
NVVM (from the ``numba-cuda[cu13]`` wheels) but no GPU.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from histogram.cuda_kernels import block_shape, plan_tiles

SIM_SCRIPT = textwrap.dedent("""
    import numpy as np
    from numba import config
    assert config.ENABLE_CUDASIM, "simulator not enabled"
    from histogram.kernels import build_histograms
    from histogram.cuda_kernels import build_histograms_cuda
    from histogram.reference import build_histograms_numpy

    rng = np.random.default_rng(7)
    n, F = 157, 5
    binned = rng.integers(0, 16, size=(F, n)).astype(np.uint8)
    cases = [(1, [0, 60, 1, 96]), (2, [157]), (6, [3, 0, 80]), (14, [40, 41])]
    for n_channels, sizes in cases:
        channels = rng.normal(size=(n, n_channels))
        rows = rng.permutation(n)[:sum(sizes)].astype(np.int32)
        ns = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        ref = build_histograms_numpy(binned, channels, rows, ns, 16)
        scale = build_histograms_numpy(binned, np.abs(channels), rows, ns, 16)
        # small tiles and blocks so one node spans several blocks and threads stride
        got = build_histograms_cuda(binned, channels, rows, ns, 16,
                                    rows_per_block=32, threads_per_block=8)
        assert np.all(np.abs(got - ref) <= 1e-9 * scale + 1e-300), (n_channels, sizes)
    # through the public API, with the identity-rows shortcut
    channels = rng.normal(size=(n, 2))
    got = build_histograms(binned, channels, None, np.array([0, n]), 16, backend="cuda")
    ref = build_histograms_numpy(binned, channels, np.arange(n, dtype=np.int32),
                                 np.array([0, n]), 16)
    assert np.allclose(got, ref, rtol=1e-9, atol=1e-12)

    # a fit's builder uploads the codes once and reuses them for every level
    from forest.engine.hist_builder import HistogramBuilder
    from forest.engine.growth_options import EngineOptions
    builder = HistogramBuilder(binned, 16, 3, EngineOptions(backend="cuda"))
    contexts = set()
    for sizes in ([157], [50, 0, 60], [10, 20, 30, 40]):
        channels = rng.normal(size=(n, 3))
        rows = rng.permutation(n)[:sum(sizes)].astype(np.int32)
        ns = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        got = builder.build(channels, rows, ns)
        contexts.add(id(builder._cuda.d_binned))
        ref = build_histograms_numpy(binned, channels, rows, ns, 16)
        assert np.allclose(got, ref, rtol=1e-9, atol=1e-12), sizes
    assert len(contexts) == 1
    got = builder.build(channels, None, np.array([0, n]))
    ref = build_histograms_numpy(binned, channels, np.arange(n, dtype=np.int32), np.array([0, n]), 16)
    assert np.allclose(got, ref, rtol=1e-9, atol=1e-12)
    # held channels are uploaded once for every build that passes the same array
    held_ch = rng.normal(size=(n, 3))
    before = builder._cuda.channel_uploads
    with builder.holding(held_ch):
        for sizes in ([157], [50, 60], [7, 0, 9]):
            rows = rng.permutation(n)[:sum(sizes)].astype(np.int32)
            ns = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
            got = builder.build(held_ch, rows, ns)
            assert np.allclose(got, build_histograms_numpy(binned, held_ch, rows, ns, 16), rtol=1e-9, atol=1e-12)
        assert builder._cuda.channel_uploads == before + 1
        other = held_ch + 1.0  # another array: uploaded on its own, the held copy kept
        got = builder.build(other, None, np.array([0, n]))
        assert np.allclose(got, build_histograms_numpy(binned, other, np.arange(n, dtype=np.int32),
                                                       np.array([0, n]), 16), rtol=1e-9, atol=1e-12)
        builder.build(held_ch, None, np.array([0, n]))
        assert builder._cuda.channel_uploads == before + 2
    # released: the caller may change the array, so the next build uploads it again
    held_ch[:] = rng.normal(size=(n, 3))
    got = builder.build(held_ch, None, np.array([0, n]))
    assert builder._cuda.channel_uploads == before + 3
    assert np.allclose(got, build_histograms_numpy(binned, held_ch, np.arange(n, dtype=np.int32),
                                                   np.array([0, n]), 16), rtol=1e-9, atol=1e-12)
    # a code past n_bins is refused on the first build, before any launch
    bad = binned.copy(); bad[0, 0] = 16
    try:
        HistogramBuilder(bad, 16, 3, EngineOptions(backend="cuda")).build(channels, None, np.array([0, n]))
    except ValueError as exc:
        assert "n_bins" in str(exc)
    else:
        raise AssertionError("code >= n_bins accepted")

    # a whole boosting fit on the CUDA backend grows the NumPy backend's trees, and
    # uploads each tree's gradients once (not once per node)
    from forest import GBDTRegressor
    import histogram.cuda_kernels as ck
    made = []
    init = ck.CudaHistogramContext.__init__
    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)
    ck.CudaHistogramContext.__init__ = recording_init
    X = rng.normal(size=(300, 4)); y = X[:, 0] + 0.1 * rng.normal(size=300)
    a = GBDTRegressor(n_estimators=3, max_depth=3, backend="cuda", random_state=0).fit(X, y)
    b = GBDTRegressor(n_estimators=3, max_depth=3, backend="numpy", random_state=0).fit(X, y)
    assert np.allclose(a.predict(X), b.predict(X), rtol=1e-9, atol=1e-9)
    assert len(made) == 1 and made[0].channel_uploads == 3, [m.channel_uploads for m in made]
    assert sum(t.node_count for t in a.trees_) > 3 * 3  # several builds per tree
    print("SIM-OK")
""")


def test_cuda_kernel_on_simulator_matches_reference():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", SIM_SCRIPT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "SIM-OK" in proc.stdout, proc.stdout + proc.stderr


def test_cuda_kernel_compiles_to_ptx_for_sm90():
    # Run apart from the simulator subprocess: compile_ptx needs the real CUDA target.
    code = ("from histogram.cuda_kernels import compile_ptx\n"
            "import sys; sys.stdout.write(compile_ptx((9, 0)))\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    ptx = proc.stdout
    assert ".target sm_90" in ptx
    assert ".entry" in ptx and "hist_kernel" in ptx
    # the block histogram lives in shared memory and is flushed with global atomics
    assert "atom.shared.add.f64" in ptx
    assert "atom.global.add.f64" in ptx


def test_plan_tiles():
    ns = np.array([0, 10, 10, 11, 30], dtype=np.int64)
    node, start, stop = plan_tiles(ns, 4)
    assert node.tolist() == [0, 0, 0, 2, 3, 3, 3, 3, 3]
    assert start.tolist() == [0, 4, 8, 10, 11, 15, 19, 23, 27]
    assert stop.tolist() == [4, 8, 10, 11, 15, 19, 23, 27, 30]


def test_block_shape_fits_shared_memory():
    for C in (1, 2, 6, 14, 40):
        fpb, cpb = block_shape(28, 256, C)
        assert 8 * 256 * fpb * cpb <= 48 * 1024
        assert cpb == min(C, 24)
    assert block_shape(28, 256, 2) == (12, 2)
    with pytest.raises(ValueError):
        block_shape(3, 256, 1, shared_bytes=1024)

"""How idle worker threads wait, on a quiet and on a busy machine (histogram._thread_wait).

Fits issue 32's categorical GBDT design (200,000 rows, a 200- and a 1,000-level column and
5 numeric features, 100 trees x 31 leaves, 2 threads) in a fresh process per setting of
libgomp's wait (``GOMP_SPINCOUNT`` / ``OMP_WAIT_POLICY``; ``HISTFOREST_SPINCOUNT=default``
for libgomp's own 300,000 spins), the settings alternating over rounds. With ``--busy K``,
K processes spinning on the CPU run beside every fit: a shared machine. LightGBM's fit of
the same data, in its own processes, shows how the anchor responds to the same settings.

Usage: ``python benchmarks/bench_thread_wait.py [--rounds 3] [--fits 3] [--busy 0 3]``
"""
import argparse
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import markdown_table, write_results_section  # noqa: E402

SECTION = "Threads that wait"

#: (label, environment) of each setting; ours sets GOMP_SPINCOUNT=20000 when none is given.
SETTINGS = [
    ("libgomp default (300,000 spins)", {"HISTFOREST_SPINCOUNT": "default"}),
    ("histforest default (20,000 spins)", {}),
    ("GOMP_SPINCOUNT=2000", {"GOMP_SPINCOUNT": "2000"}),
    ("OMP_WAIT_POLICY=passive", {"OMP_WAIT_POLICY": "passive"}),
]

_CHILD = r"""
import sys, time
sys.path.insert(0, {bench!r})
import bench_categorical as BC
frame, codes, y = BC.gbdt_design(200000, 0)
out = []
if {who!r} == "ours":
    from forest import GBDTClassifier
    from native.comm import SelfCommunicator
    comm = SelfCommunicator()
    GBDTClassifier(n_estimators=3, max_leaf_nodes=31, early_stopping=False, n_threads=2).fit(
        frame.iloc[:20000], y[:20000], comm=comm)
    for _ in range({fits}):
        t = time.perf_counter()
        GBDTClassifier(n_estimators=100, max_leaf_nodes=31, early_stopping=False, random_state=0,
                       n_threads=2).fit(frame, y, comm=comm)
        out.append(time.perf_counter() - t)
else:
    import anchors, lightgbm as lgb
    params, n_trees = anchors.lightgbm_gbdt_params(threads=2)
    for _ in range({fits}):
        t = time.perf_counter()
        data = lgb.Dataset(codes, label=y, categorical_feature=[0, 1],
                           params={{"max_bin": params["max_bin"], "verbosity": -1}}, free_raw_data=True)
        lgb.train(params, data, num_boost_round=n_trees)
        out.append(time.perf_counter() - t)
print(" ".join(f"{{v:.3f}}" for v in out))
"""


def fit_times(who, env_extra, fits):
    """Seconds of ``fits`` fits in one fresh process with ``env_extra`` added to the environment."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "HISTFOREST_SPINCOUNT")}
    env.update(env_extra)
    env.setdefault("NUMBA_NUM_THREADS", "2")
    code = _CHILD.format(bench=os.path.dirname(os.path.abspath(__file__)), who=who, fits=fits)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return [float(v) for v in out.stdout.split()]


def run(busy, rounds, fits, lightgbm_settings):
    """Median and range of fit seconds per setting, with ``busy`` spinning processes beside."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    try:
        time.sleep(1.0 if busy else 0.0)
        times = {(who, label): [] for who in ("ours", "lightgbm") for label, _ in SETTINGS}
        for _ in range(rounds):
            for label, extra in SETTINGS:
                times[("ours", label)] += fit_times("ours", extra, fits)
                if label in lightgbm_settings:
                    # histforest's default reaches LightGBM when both share the process's libgomp
                    times[("lightgbm", label)] += fit_times("lightgbm", extra or {"GOMP_SPINCOUNT": "20000"}, fits)
                print(f"busy {busy}: {label}: ours {np.round(times[('ours', label)], 2).tolist()}, LightGBM "
                      f"{np.round(times[('lightgbm', label)], 2).tolist()}", flush=True)
    finally:
        for p in spinners:
            p.kill()
    rows = []
    for label, _ in SETTINGS:
        for who in ("ours", "lightgbm"):
            t = times[(who, label)]
            if t:
                rows.append([busy, who, label, len(t), float(np.median(t)), float(min(t)), float(max(t))])
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fits", type=int, default=3)
    ap.add_argument("--busy", type=int, nargs="+", default=[0, 3])
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    for busy in args.busy:
        # LightGBM under the settings that differ for it (it has no HISTFOREST_SPINCOUNT of its own)
        lgb = {SETTINGS[0][0], SETTINGS[1][0], SETTINGS[2][0]} if busy == 0 else {SETTINGS[0][0], SETTINGS[1][0]}
        rows += run(busy, args.rounds if busy == 0 else 1, args.fits if busy == 0 else 2, lgb)
    text = ("Categorical GBDT of bench_categorical (200,000 rows, 100 trees x 31 leaves, 2 threads), a fresh "
            "process per setting and contender, settings alternating; 'busy': processes spinning on the CPU "
            "beside the fits (2 cores). Seconds per fit:\n\n" + markdown_table(
                ["busy", "fit", "wait setting", "fits", "median s", "min s", "max s"], rows))
    print(text)
    if not args.no_write:
        write_results_section(SECTION, text)


if __name__ == "__main__":
    main()

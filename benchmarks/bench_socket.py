"""Allreduce over the socket transport against the same algorithms over MPI (issue 36).

Run without mpirun: the script launches itself under ``mpirun -np P`` for each P in
``--procs`` (default 2 3 4). In the job every rank has two communicators over the same
ranks: MPI's world (MPICH; on one machine its point-to-point runs over shared
memory) and a :class:`native.socket_comm.SocketCommunicator` whose links are TCP over
loopback (endpoints exchanged through MPI, then no MPI on its path). Like MPI, the
socket ranks move large messages between ranks of one machine without TCP
(:mod:`native.shm_link`: the receiver reads the sender's memory in one copy, as
MPICH over UCX does, or slots in ``/dev/shm``), so the two are compared like for like;
``--path slots`` or ``--path tcp`` measures the fallbacks instead. For every size
(float64, 1-64 MiB) and algorithm, repetitions interleave the two transports, so a
burst of load from other processes slows both alike; the table gives the median over
repetitions of the slowest rank's time, the bus bandwidth (NCCL's convention,
``bytes / time * 2 (p - 1) / p``) and socket / MPI bus bandwidth. MPI's own Allreduce is
listed as well (MPI only). The results are checked bitwise: the same algorithm gives the
same bits over both transports.

    python benchmarks/bench_socket.py --procs 2 3 4          # writes RESULTS.md
    python benchmarks/bench_socket.py --procs 2 --quick --no-write
    python benchmarks/bench_socket.py --procs 4 --path tcp --no-write   # TCP only
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

SECTION = "Socket transport and Spark (issue 36)"
SIZES = [2**20, 2**22, 2**24, 2**26]       # 1, 4, 16, 64 MiB
QUICK_SIZES = [2**20, 2**22]
ALGORITHMS = ("auto", "ring", "rabenseifner")
#: --path -> environment of the job (native.shm_link's switches).
PATHS = {"auto": {}, "slots": {"HISTFOREST_SOCKET_CMA": "0"}, "tcp": {"HISTFOREST_SOCKET_SHM": "0"}}


def worker(sizes, out_path, reps):
    """Under mpirun: time each (size, algorithm) over MPI and over sockets; rank 0 writes JSON."""
    from native import collectives as col
    from native.comm import world
    from native.rendezvous import Listener
    from native.socket_comm import connect

    mpi = world()
    p, r = mpi.size, mpi.rank
    listener = Listener("127.0.0.1", 0)
    endpoints = col.allgather_object(mpi, listener.address)
    sock = connect(listener, endpoints, r, token=b"bench_socket")
    rows = []
    try:
        for nbytes in sizes:
            n = nbytes // 8
            x = np.random.default_rng([r, n]).standard_normal(n)
            cases = [("mpi", "mpi")] + [(t, a) for a in ALGORITHMS for t in ("mpi", "socket")]
            comms = {"mpi": mpi, "socket": sock}
            for t, a in cases:  # warm-up and bitwise check against the other transport
                col.allreduce(comms[t], x, algorithm=a)
            for a in ALGORITHMS:
                same = col.allreduce(mpi, x, algorithm=a).tobytes() == col.allreduce(sock, x, algorithm=a).tobytes()
                if not same:
                    raise AssertionError(f"{a} at {nbytes} B: socket and MPI results differ")
            k = reps or int(max(3, min(20, 4e8 // nbytes)))
            times = np.empty((k, len(cases)))
            for rep in range(k):
                for j, (t, a) in enumerate(cases):
                    comms[t].barrier()
                    t0 = time.perf_counter()
                    col.allreduce(comms[t], x, algorithm=a)
                    times[rep, j] = time.perf_counter() - t0
            slowest = col.allgather(mpi, times[None], algorithm="ring").max(axis=0)
            for j, (t, a) in enumerate(cases):
                label = "MPI_Allreduce" if (t, a) == ("mpi", "mpi") and j == 0 else a
                rows.append({"p": p, "bytes": nbytes, "transport": t, "algorithm": label,
                             "time": float(np.median(slowest[:, j])), "reps": k})
    finally:
        sock.close()
    if r == 0:
        Path(out_path).write_text(json.dumps(rows))


def table(rows):
    """Markdown: one line per (p, size, algorithm) with both transports and their ratio."""
    lines = ["| p | size | algorithm | MPI (ms) | socket (ms) | MPI busbw (GB/s) | socket busbw (GB/s) "
             "| socket / MPI |", "|---|---|---|---|---|---|---|---|"]
    by = {(x["p"], x["bytes"], x["transport"], x["algorithm"]): x["time"] for x in rows}
    for p in sorted({x["p"] for x in rows}):
        for size in sorted({x["bytes"] for x in rows}):
            factor = 2 * (p - 1) / p

            def bw(t):
                return size / t / 1e9 * factor

            lib = by.get((p, size, "mpi", "MPI_Allreduce"))
            if lib:
                lines.append(f"| {p} | {size >> 20} MiB | MPI_Allreduce (library) | {lib * 1e3:.2f} | - "
                             f"| {bw(lib):.2f} | - | - |")
            for a in ALGORITHMS:
                tm, ts = by.get((p, size, "mpi", a)), by.get((p, size, "socket", a))
                if tm and ts:
                    lines.append(f"| {p} | {size >> 20} MiB | {a} | {tm * 1e3:.2f} | {ts * 1e3:.2f} | {bw(tm):.2f} "
                                 f"| {bw(ts):.2f} | {tm / ts:.2f}x |")
    return "\n".join(lines)


def _load():
    """The 1/5/15-minute load averages (other processes share the cores)."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv=None):
    from _harness import default_mpirun, thread_env, write_results_section

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, nargs="+", default=[2, 3, 4])
    ap.add_argument("--quick", action="store_true", help="1 and 4 MiB only")
    ap.add_argument("--reps", type=int, default=0, help="repetitions per case (default: by size)")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--path", choices=sorted(PATHS), default="auto",
                    help="same-machine path of the socket ranks: auto (single copy where permitted, else "
                         "shared-memory slots), slots, or tcp (every byte over TCP loopback)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else SIZES
    if args.worker:
        worker(sizes, args.worker, args.reps)
        return 0
    rows = []
    load_before = _load()
    for p in args.procs:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "rows.json")
            cmd = [default_mpirun(), "-np", str(p), sys.executable, str(Path(__file__).resolve()),
                   "--worker", out] + (["--quick"] if args.quick else []) + (["--reps", str(args.reps)]
                                                                             if args.reps else [])
            env = thread_env(1)
            for k in ("HISTFOREST_SOCKET_CMA", "HISTFOREST_SOCKET_SHM"):
                env.pop(k, None)
            env.update(PATHS[args.path])
            subprocess.run(cmd, check=True, env=env, timeout=1800)
            rows += json.loads(Path(out).read_text())
    body = table(rows)
    print(f"socket path: {args.path}; load average before / after: {load_before} / {_load()}")
    print(body)
    if not args.no_write:
        what = {"auto": "same-machine single copy / shared memory, TCP for signalling",
                "slots": "shared-memory slots, TCP for signalling", "tcp": "TCP loopback only"}[args.path]
        write_results_section(SECTION, f"#### Allreduce bus bandwidth, socket ({what}) vs MPI (MPICH)\n\n"
                              + body, title="Socket transport vs MPI")
    return 0


if __name__ == "__main__":
    sys.exit(main())

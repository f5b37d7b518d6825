"""Child side of :func:`_harness.run_contender`: run one contender function, report.

Invoked as ``python benchmarks/_worker.py SPEC.json``. The spec names a python file, a
function in it and its keyword arguments; the function's returned dict is written, with
this process's peak resident memory (``VmHWM``, so memory of the harness or of other
contenders never counts) and its rank, to the spec's result path. Under ``mpirun`` the
rank comes from the launcher's environment (``PMI_RANK`` for MPICH's Hydra), so every
rank writes its own file and the harness merges them.
"""
import importlib.util
import json
import os
import sys
import traceback


def _rank(kwargs):
    if "rank" in kwargs:
        return int(kwargs["rank"])
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


def _jsonable(obj):
    """Turn numpy scalars/arrays into plain python for json.dump."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is always there in practice
        np = None
    if np is not None:
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, np.ndarray):
            return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def main(spec_path):
    with open(spec_path) as fh:
        spec = json.load(fh)
    kwargs = spec["kwargs"]
    rank = _rank(kwargs)
    module_path = spec["module"]
    sys.path.insert(0, os.path.dirname(module_path))
    name = os.path.splitext(os.path.basename(module_path))[0]
    mod_spec = importlib.util.spec_from_file_location(f"_bench_{name}", module_path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    func = getattr(module, spec["function"])
    try:
        result = func(**kwargs)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        # Under mpirun a rank that raised must not leave its peers in a collective.
        if "PMI_RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ:
            os._exit(3)
        raise
    import _harness

    result = dict(result or {})
    result["rank"] = rank
    result["peak_rss_mb"] = _harness.proc_status_mb("VmHWM")
    path = spec["result"].format(rank=rank)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(result, fh, default=_jsonable)
    os.replace(tmp, path)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: _worker.py SPEC.json")
    main(sys.argv[1])

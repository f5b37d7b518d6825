"""Mutation fuzzer of model files, run as a script by ``test_model_io_fuzz.py``.

Usage: ``python model_fuzzer.py SEED CASES_PER_MODEL WORKDIR MODEL...``

For each seed model file it writes ``CASES_PER_MODEL`` mutated copies (flipped and
truncated bytes, edited, retyped and reshaped arrays, edited, deleted and swapped
state members, swapped zip members, another class in the header, huge shapes, odd
dtypes in the array table, deep nesting, compressed and duplicated entries, damaged
header text) and loads each one. A case passes when the load fails with
``ModelFormatError`` and a one-line message, or succeeds and the estimator then
predicts on a few rows (and reports its importances) without any exception. Each
case must take under a second of CPU time; a watchdog kills the process when a block
of cases runs past ``WATCHDOG_S`` seconds (a hang), and a crash kills it outright.
Before each case its description goes to stderr, so the parent names the case that
crashed or hung. The last stdout line is a JSON summary.
"""
import copy
import faulthandler
import io
import json
import os
import sys
import time
import traceback
import warnings
import zipfile

import numpy as np

from forest import model_io  # the public face: every estimator kind registered
from forest.io.model_io import HEADER_NAME, ModelFormatError

CPU_LIMIT_S = 1.0
#: A block of ``WATCHDOG_CASES`` cases (about a second of work) that has not ended after
#: ``WATCHDOG_S`` seconds of wall time holds a hang: the process dumps its stack and exits.
WATCHDOG_CASES = 100
WATCHDOG_S = 120.0
#: Arrays whose values steer prediction (edited more often than the rest).
STRUCTURAL = ("left", "right", "feature", "bin_threshold", "tree_offsets", "threshold", "depth", "missing_left",
              "value", "thresholds_flat_", "threshold_offsets_", "n_bins_non_missing_", "baseline_", "classes_")


# ------------------------------------------------------------------ container access

def container_bytes(header, entries, compress=None, replace=None):
    """A ZIP like model_io writes; ``compress`` names one entry to deflate; ``replace``
    is a ``(placeholder, text)`` substitution in the header's JSON text."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, data in entries.items():
            if name == HEADER_NAME:
                text = json.dumps(header, separators=(",", ":"))
                if replace is not None:
                    text = text.replace(json.dumps(replace[0]), replace[1])
                data = text.encode()
            zf.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED if name == compress else None)
    return buf.getvalue()


def npy_bytes(arr):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
    return buf.getvalue()


def npy_array(data):
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)


def array_names(state, path=""):
    """``{array key: attribute path}`` of every ``$array`` reference in a state."""
    out = {}
    if isinstance(state, dict):
        if "$array" in state and isinstance(state["$array"], str):
            out[state["$array"]] = path
        elif "$dict" in state and isinstance(state["$dict"], list):
            for kv in state["$dict"]:
                if isinstance(kv, list) and len(kv) == 2:
                    out.update(array_names(kv[1], f"{path}.{kv[0]}"))
        else:
            for k, v in state.items():
                out.update(array_names(v, path))
    elif isinstance(state, list):
        for v in state:
            out.update(array_names(v, path))
    return out


def scalar_slots(node, out):
    """Every place in a decoded-JSON state holding a plain scalar: (container, key)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("$array", "$object", "via", "$scalar", "$dtype", "$float"):
                continue
            if isinstance(v, (dict, list)):
                scalar_slots(v, out)
            else:
                out.append((node, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, (dict, list)):
                scalar_slots(v, out)
            else:
                out.append((node, i))
    return out


def dict_pairs(node, out):
    """Every ``$dict`` list of [key, value] pairs in a state."""
    if isinstance(node, dict):
        if isinstance(node.get("$dict"), list):
            out.append(node["$dict"])
        for v in node.values():
            dict_pairs(v, out)
    elif isinstance(node, list):
        for v in node:
            dict_pairs(v, out)
    return out


# ------------------------------------------------------------------ mutations

SPECIAL_JSON = [0, 1, -1, 2, 3, 255, 256, 10 ** 12, -10 ** 12, 2 ** 63, 1.5, -0.5, 1e308, {"$float": "nan"},
                {"$float": "inf"}, "abc", "", None, True, False, [], {}, {"$array": "0"}, {"$tuple": []},
                {"$scalar": "<i8", "value": 7}, {"$scalar": "|O", "value": 1}, {"$dtype": "|O"}]


def special_values(rng, arr, i):
    """Values likely to break an index or a threshold at position ``i`` of ``arr``."""
    n = arr.size
    if arr.dtype.kind in "iu":
        info = np.iinfo(arr.dtype)
        cands = [0, -1, -2, i, max(i - 1, 0), i + 1, n - 1, n, n + 1, 2 * n, info.max, info.min,
                 int(rng.integers(-n - 2, 2 * n + 3))]
        return np.array(cands[int(rng.integers(len(cands)))]).astype(arr.dtype)
    if arr.dtype.kind == "f":
        cands = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e308, -1e308, 5e-324, float(rng.normal() * 10)]
        return arr.dtype.type(cands[int(rng.integers(len(cands)))])
    if arr.dtype.kind == "b":
        return np.bool_(not bool(arr.flat[i]))
    return arr.flat[int(rng.integers(n))]


class Seed:
    """A seed model file, read once: its bytes, entries, header text and array names."""

    def __init__(self, path):
        self.raw = open(path, "rb").read()
        with zipfile.ZipFile(path) as zf:
            self.entries = {n: zf.read(n) for n in zf.namelist()}
        self.header_text = self.entries[HEADER_NAME].decode()
        self.refs = array_names(json.loads(self.header_text)["state"])
        self.keys = sorted(self.refs, key=int)


def mutate(rng, seed):
    """One random mutation of a :class:`Seed`: returns ``(description, file bytes)``."""
    kind = str(rng.choice(MUTATIONS, p=WEIGHTS))
    raw, refs, keys = seed.raw, seed.refs, seed.keys
    if kind == "flip_bytes":
        data = bytearray(raw)
        for _ in range(int(rng.integers(1, 9))):
            data[int(rng.integers(len(data)))] ^= int(rng.integers(1, 256))
        return kind, bytes(data)
    if kind == "truncate":
        return kind, raw[: int(rng.integers(len(raw)))]
    header = json.loads(seed.header_text)  # a fresh copy to edit
    entries = dict(seed.entries)
    if kind in ("array_values", "array_dtype", "array_shape"):
        structural = [k for k in keys if refs[k].rsplit(".", 1)[-1] in STRUCTURAL]
        key = str(rng.choice(structural if structural and rng.uniform() < 0.8 else keys))
        name = f"arrays/{key}.npy"
        arr = npy_array(entries[name])
        desc = f"{kind} {refs[key]}"
        if kind == "array_values":
            if arr.size == 0:
                return desc + " (empty)", container_bytes(header, entries)
            arr = arr.copy()
            for _ in range(int(rng.integers(1, 4))):
                i = int(rng.integers(arr.size))
                arr.flat[i] = special_values(rng, arr, i)
        elif kind == "array_dtype":
            dt = str(rng.choice(["<i1", "<i4", "<i8", "<u1", "<u8", "<f4", "<f8", "|b1", ">i4", "<U3"]))
            with np.errstate(all="ignore"):
                arr = arr.astype(dt)
            desc += f" -> {dt}"
        else:
            choice = int(rng.integers(5))
            arr = [arr[:-1] if arr.ndim else arr.reshape(1),
                   np.concatenate([arr, arr[-1:]]) if arr.ndim and arr.size else arr.reshape(-1),
                   arr.reshape(-1)[:0], arr.reshape(1, -1), arr.reshape(-1)[:1].reshape(())][choice]
            desc += f" -> shape {arr.shape}"
        entries[name] = npy_bytes(arr)
        if rng.uniform() < 0.9:  # mostly keep the table consistent, so the content checks are reached
            header["arrays"][key] = {"dtype": arr.dtype.str, "shape": list(arr.shape)}
        return desc, container_bytes(header, entries)
    if kind == "huge_shape":
        key = str(rng.choice(keys))
        shape = [int(rng.choice([2 ** 31, 2 ** 40, 10 ** 15]))]
        dt = header["arrays"][key]["dtype"]
        npy = io.BytesIO()
        np.lib.format.write_array_header_1_0(npy, {"descr": dt, "fortran_order": False, "shape": tuple(shape)})
        entries[f"arrays/{key}.npy"] = npy.getvalue() + b"\0" * 64
        header["arrays"][key] = {"dtype": dt, "shape": shape}
        return f"huge_shape {refs[key]} {shape}", container_bytes(header, entries)
    if kind == "table_dtype":
        key = str(rng.choice(keys))
        if rng.uniform() < 0.2:
            header["arrays"][key]["shape"] = [1] * int(rng.choice([65, 20000]))
            return f"table_shape {refs[key]} -> many dimensions", container_bytes(header, entries)
        bad = ["|S0", "<U0", "|V8", "<f8,<i4", "(3,)<f8", "|O", "<M8[xx]", "garbage", 5, None, "<U99999999999",
               "<f8,", "f8)"]
        header["arrays"][key]["dtype"] = bad[int(rng.integers(len(bad)))]
        return f"table_dtype {refs[key]} -> {header['arrays'][key]['dtype']!r}", container_bytes(header, entries)
    if kind == "state_scalar":
        slots = scalar_slots(header["state"], [])
        node, k = slots[int(rng.integers(len(slots)))]
        old = node[k]
        node[k] = copy.deepcopy(SPECIAL_JSON[int(rng.integers(len(SPECIAL_JSON)))])
        return f"state_scalar {old!r} -> {node[k]!r}", container_bytes(header, entries)
    if kind == "state_delete":
        pairs = dict_pairs(header["state"], [])
        pairs = [p for p in pairs if p]
        p = pairs[int(rng.integers(len(pairs)))]
        gone = p.pop(int(rng.integers(len(p))))
        return f"state_delete {gone[0]!r}", container_bytes(header, entries)
    if kind == "state_swap":
        pairs = [p for p in dict_pairs(header["state"], []) if len(p) >= 2]
        p = pairs[int(rng.integers(len(pairs)))]
        i, j = rng.choice(len(p), 2, replace=False)
        p[i][1], p[j][1] = p[j][1], p[i][1]
        return f"state_swap {p[i][0]!r} <-> {p[j][0]!r}", container_bytes(header, entries)
    if kind == "member_swap":
        i, j = rng.choice(keys, 2, replace=False)
        a, b = f"arrays/{i}.npy", f"arrays/{j}.npy"
        entries[a], entries[b] = entries[b], entries[a]
        if rng.uniform() < 0.5:
            header["arrays"][i], header["arrays"][j] = header["arrays"][j], header["arrays"][i]
        return f"member_swap {refs[i]} <-> {refs[j]}", container_bytes(header, entries)
    if kind == "class_swap":
        # the estimator kinds and the pieces of their state (a checkpoint's classes are no models)
        names = [n for n in model_io.registered_names() if not n.startswith("forest.checkpoint.")]
        header["estimator"] = str(rng.choice(names))
        if rng.uniform() < 0.5:
            header.pop("via", None)
        return f"class_swap -> {header['estimator']}", container_bytes(header, entries)
    if kind == "deep_nesting":
        depth = int(rng.choice([50, 5000, 200000]))
        header["state"]["$dict"].append(["deep_", "@DEEP@"])
        return f"deep_nesting {depth}", container_bytes(header, entries,
                                                       replace=("@DEEP@", "[" * depth + "0" + "]" * depth))
    if kind == "duplicate_entry":
        name = f"arrays/{rng.choice(keys)}.npy"
        data = container_bytes(header, entries)
        buf = io.BytesIO(data)
        with warnings.catch_warnings(), zipfile.ZipFile(buf, "a") as zf:
            warnings.simplefilter("ignore")  # zipfile warns about the duplicate name it writes
            zf.writestr(name, entries[str(rng.choice(list(entries)))])
        return f"duplicate_entry {name}", buf.getvalue()
    if kind == "compressed_entry":
        return "compressed_entry", container_bytes(header, entries, compress=f"arrays/{rng.choice(keys)}.npy")
    if kind == "header_bytes":
        data = bytearray(entries[HEADER_NAME])
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(len(data)))] = int(rng.choice(list(b'{}[]",:0-9ae$ ')))
        entries[HEADER_NAME] = bytes(data)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w") as zf:
            for name, d in entries.items():
                zf.writestr(name, d)
        return "header_bytes", buf.getvalue()
    raise AssertionError(kind)


MUTATIONS = ["flip_bytes", "truncate", "array_values", "array_dtype", "array_shape", "huge_shape", "state_scalar",
             "state_delete", "state_swap", "member_swap", "class_swap", "deep_nesting", "compressed_entry",
             "header_bytes", "table_dtype", "duplicate_entry"]
WEIGHTS = np.array([6, 3, 30, 6, 6, 2, 18, 6, 6, 5, 4, 1, 1, 6, 2, 1], dtype=float)
WEIGHTS /= WEIGHTS.sum()


# ------------------------------------------------------------------ one case

def exercise(est, X):
    """What a loaded model must do without any exception."""
    from forest.report.summary import importances, model_trees

    est.predict(X)
    if hasattr(est, "predict_proba"):
        est.predict_proba(X)
    if hasattr(est, "predict_interval"):
        try:
            est.predict_interval(X)
        except ValueError as exc:  # documented: fewer than two little bags of trees
            if "variance estimates need" not in str(exc):
                raise
    if hasattr(est, "dr_scores"):
        # Held-out doubly robust scores walk the nuisance forests too.
        levels = est.classes_ if est.classes_ is not None else np.array([0.0, 1.0])
        t = levels[np.arange(len(X)) % len(levels)]
        try:
            est.dr_scores(X, t, np.linspace(-1.0, 1.0, len(X)))
        except ValueError as exc:  # documented: fitted with given y_hat / t_hat
            if "need the nuisance forests" not in str(exc):
                raise
    importances(model_trees(est), est.n_features_in_)


def run_case(path, X):
    """``("refused" | "loaded", None)`` or ``("failed", message)``."""
    try:
        est = model_io.load(path)
    except ModelFormatError as exc:
        text = str(exc)
        if not text or "\n" in text:
            return "failed", f"ModelFormatError message is not one line: {text!r}"
        return "refused", None
    except BaseException:  # noqa: BLE001 - anything else escaping load is the bug we look for
        return "failed", "load raised " + traceback.format_exc(limit=3).strip().splitlines()[-1]
    if not hasattr(est, "predict"):
        return "failed", f"load returned a {type(est).__name__}, not an estimator"
    try:
        exercise(est, X)
    except BaseException:  # noqa: BLE001
        return "failed", "a loaded model raised " + traceback.format_exc(limit=3).strip().splitlines()[-1]
    return "loaded", None


def main(argv):
    seed, n_cases, workdir, models = int(argv[0]), int(argv[1]), argv[2], argv[3:]
    rng = np.random.default_rng(seed)
    path = os.path.join(workdir, "mutant.model")
    summary = {"cases": 0, "refused": 0, "loaded": 0, "failures": [], "max_cpu_s": 0.0, "total_cpu_s": 0.0,
               "by_model": {}}
    # Some refusals (and NotFittedError) import scikit-learn on first use, about 1.2 s once per
    # process: paid here, so the per-case CPU limit measures the cases, not which case happened
    # to be the first refusal of its kind (it moved when the RNG stream's earlier cases changed).
    import sklearn.utils.validation  # noqa: F401
    for model in models:
        seed = Seed(model)
        est = model_io.load(model)
        X = np.random.default_rng(0).normal(size=(25, est.n_features_in_))
        X[::4, 0] = np.nan
        exercise(est, X)  # the seed itself loads and predicts (and compiles the kernels once)
        counts = summary["by_model"].setdefault(os.path.basename(model), {"refused": 0, "loaded": 0})
        for case in range(n_cases):
            if case % WATCHDOG_CASES == 0:
                # Re-armed per block, not per case: cancelling the watchdog thread costs
                # milliseconds on a loaded machine, as much as a case itself.
                faulthandler.dump_traceback_later(WATCHDOG_S, exit=True)
            desc, data = mutate(rng, seed)
            with open(path, "wb") as f:
                f.write(data)
            sys.stderr.write(f"case {os.path.basename(model)}#{case}: {desc}\n")
            sys.stderr.flush()
            cpu = time.process_time()
            outcome, message = run_case(path, X)
            cpu = time.process_time() - cpu
            summary["cases"] += 1
            summary["max_cpu_s"] = max(summary["max_cpu_s"], cpu)
            summary["total_cpu_s"] += cpu
            if outcome == "failed" or cpu > CPU_LIMIT_S:
                summary["failures"].append(f"{os.path.basename(model)}#{case} {desc}: "
                                           f"{message or f'took {cpu:.2f} s of CPU'}")
            else:
                summary[outcome] += 1
                counts[outcome] += 1
    faulthandler.cancel_dump_traceback_later()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    faulthandler.enable()
    sys.exit(main(sys.argv[1:]))

"""Model files: a documented, versioned, portable format that loads without pickle.

This module owns the on-disk form of every fitted estimator.

Format (``format_version`` 1)
-----------------------------
A model file is a ZIP container (stored, not compressed, so arrays can be read
quickly; every entry carries a CRC-32 that the reader checks) holding:

``histforest-model.json``
    The header, UTF-8 JSON::

        {"format": "histforest-model", "format_version": 1,
         "library_version": "0.1.0", "created": "2025-...Z",
         "estimator": "forest.causal_forest.CausalForest",
         "params": {...},            # get_params(deep=False), encoded as below
         "feature_names": [...],     # or null
         "metadata": {...},          # e.g. treatment/outcome column names
         "arrays": {"0": {"dtype": "<f8", "shape": [n]}, ...},
         "state": <encoded object tree of the estimator>}

``arrays/<k>.npy``
    One ``.npy`` file per array referenced from the state (NumPy's format, never
    with object dtype; read back with ``allow_pickle=False``).

The state is the estimator's ``__dict__`` (parameters and fitted attributes,
including nested trees and bin mappers), written by a generic walker:

============================  ===================================================
Python value                  JSON
============================  ===================================================
None, bool, int, str          itself
float                         itself; NaN/inf as ``{"$float": "nan"}``
list                          JSON list
tuple                         ``{"$tuple": [...]}``
dict                          ``{"$dict": [[key, value], ...]}`` (any key type)
numpy scalar                  ``{"$scalar": dtype, "value": ...}``
numpy dtype                   ``{"$dtype": "<f8"}``
numeric/str ndarray           ``{"$array": "k"}`` -> ``arrays/k.npy``
object ndarray                ``{"$objarray": [...], "shape": [...]}``
registered class instance     ``{"$object": "module.Class", "state": {...}}``,
                              plus ``"via": "from_arrays"`` when the class
                              rebuilds itself from a compact state
============================  ===================================================

Only classes in the registry can be named by ``$object``: the built-in whitelist
below plus classes added with :func:`register`, and only from the ``forest``,
``histogram`` and ``native`` packages. Loading therefore never executes code taken
from the file: it parses JSON, reads plain arrays and sets attributes of
whitelisted classes. A class with a ``to_arrays``/``from_arrays`` (or
``get_state``/``from_state``) pair (``Tree``, ``BinMapper``) is stored through it;
for other classes ``__init__`` is not called (a class may define
``_model_io_restore_(self)`` to rebuild caches from the restored attributes, and
``_model_io_exclude_`` (a tuple of attribute names) to leave transient attributes
such as compiled kernels out of the file).

Writing is atomic: the container goes to a temporary file in the target's
directory, is flushed to disk, and is renamed over the target, so a crash leaves
either the old file or the new one, never a half-written model.

Version policy: readers accept any ``format_version`` up to their own; a file from a
newer format fails with a message asking for a newer histforest.
"""
import datetime
import importlib
import io
import json
import os
import tempfile
import zipfile

import numpy as np

FORMAT_NAME = "histforest-model"
FORMAT_VERSION = 1
HEADER_NAME = "histforest-model.json"
_ARRAY_DIR = "arrays/"
_ALLOWED_PACKAGES = ("forest", "histogram", "native")

#: Classes a model file may name. Estimators and the pieces of their fitted state.
BUILTIN_CLASSES = (
    "forest.causal_forest.CausalForest",
    "forest.regression_forest.RegressionForest",
    "forest.gbdt.GBDTRegressor",
    "forest.gbdt.GBDTClassifier",
    "forest.policy_tree.PolicyTree",
    "forest.tree.Tree",
    "histogram.binning.BinMapper",
)

_REGISTRY = {}


class ModelFormatError(ValueError):
    """A model file that cannot be read: not a model, corrupted, truncated or too new."""


def _class_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def register(cls):
    """Allow instances of ``cls`` inside model files (usable as a class decorator).

    Parameters
    ----------
    cls : type
        A class from the ``forest``, ``histogram`` or ``native`` packages whose
        ``__dict__`` holds only values this format can store.

    Returns
    -------
    type
        ``cls`` itself.
    """
    name = _class_name(cls)
    if name.split(".")[0] not in _ALLOWED_PACKAGES:
        raise ValueError(f"only histforest classes can be registered, not {name}")
    _REGISTRY[name] = cls
    return cls


def _resolve_class(name):
    """The class a file names, if it is whitelisted; imports only histforest modules."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    module_name, _, qualname = name.rpartition(".")
    if module_name.split(".")[0] not in _ALLOWED_PACKAGES:
        raise ModelFormatError(f"model file names class {name!r}, which is not a histforest class")
    if name in BUILTIN_CLASSES:
        try:
            return getattr(importlib.import_module(module_name), qualname)
        except (ImportError, AttributeError) as exc:
            raise ModelFormatError(
                f"model file needs class {name!r}, which this installation lacks ({exc})") from None
    # A class registered by its own module may not be imported yet. Importing one of
    # our own package modules is safe; the name must still be registered afterwards.
    try:
        importlib.import_module(module_name)
    except ImportError:
        pass
    if name in _REGISTRY:
        return _REGISTRY[name]
    raise ModelFormatError(f"model file names class {name!r}, which is not registered for model files")


def _is_allowed_instance(obj):
    name = _class_name(type(obj))
    return name in _REGISTRY or name in BUILTIN_CLASSES


# ---------------------------------------------------------------------------- encoding

class _Encoder:
    """Walks an object tree, returning JSON-able data and collecting arrays."""

    def __init__(self):
        self.arrays = []

    def encode(self, obj, where):
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, int) and not isinstance(obj, np.generic):
            return int(obj)
        if isinstance(obj, float) and not isinstance(obj, np.generic):
            return _encode_float(obj)
        if isinstance(obj, np.generic):
            if obj.dtype.kind not in "biuf":
                raise TypeError(f"cannot store numpy scalar of dtype {obj.dtype} at {where}")
            return {"$scalar": obj.dtype.str, "value": self.encode(obj.item(), where)}
        if isinstance(obj, np.dtype):
            if obj.kind == "O" or obj.fields is not None:
                raise TypeError(f"cannot store dtype {obj} at {where}")
            return {"$dtype": obj.str}
        if isinstance(obj, np.ndarray):
            if obj.dtype.kind == "O":
                return {"$objarray": [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj.ravel().tolist())],
                        "shape": list(obj.shape)}
            if obj.dtype.kind not in "biufcUSMm" or obj.dtype.fields is not None:
                raise TypeError(f"cannot store array of dtype {obj.dtype} at {where}")
            key = str(len(self.arrays))
            self.arrays.append(np.ascontiguousarray(obj))
            return {"$array": key}
        if isinstance(obj, list):
            return [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        if isinstance(obj, tuple):
            return {"$tuple": [self.encode(v, f"{where}[{i}]") for i, v in enumerate(obj)]}
        if isinstance(obj, dict):
            return {"$dict": [[self.encode(k, f"{where} key"), self.encode(v, f"{where}[{k!r}]")]
                              for k, v in obj.items()]}
        if _is_allowed_instance(obj):
            state, via = _state_of(obj)
            out = {"$object": _class_name(type(obj)), "state": self.encode_state(state, where)}
            if via is not None:
                out["via"] = via
            return out
        raise TypeError(
            f"cannot store {where} of type {_class_name(type(obj))} in a model file: only numpy arrays, "
            f"python scalars/str/list/dict and classes registered with forest.model_io.register are allowed")


    def encode_state(self, state, where):
        """Encode an object's attribute dict, naming paths ``where.attr`` in errors."""
        return {"$dict": [[k, self.encode(v, f"{where}.{k}")] for k, v in state.items()]}


def _encode_float(x):
    if np.isfinite(x):
        return x
    return {"$float": "nan" if np.isnan(x) else ("inf" if x > 0 else "-inf")}


#: (state getter, classmethod rebuilding from that state), tried in order. Classes
#: that define such a pair (Tree, BinMapper) store their compact, validated state;
#: others store their ``__dict__``.
_STATE_PROTOCOLS = (("to_arrays", "from_arrays"), ("get_state", "from_state"))


def _state_of(obj):
    """``(state dict, name of the rebuilding classmethod or None)`` of a registered object."""
    cls = type(obj)
    for getter, loader in _STATE_PROTOCOLS:
        if callable(getattr(cls, getter, None)) and callable(getattr(cls, loader, None)):
            try:
                return getattr(obj, getter)(), loader
            except ValueError:
                break  # e.g. an unfitted BinMapper: fall back to its attributes
    exclude = set(getattr(cls, "_model_io_exclude_", ()))
    return {k: v for k, v in vars(obj).items() if k not in exclude}, None


class _Decoder:
    def __init__(self, arrays):
        self.arrays = arrays

    def decode(self, data):
        if data is None or isinstance(data, (bool, str, int, float)):
            return data
        if isinstance(data, list):
            return [self.decode(v) for v in data]
        if not isinstance(data, dict) or len(data) == 0:
            raise ModelFormatError("corrupted model file: unexpected value in the state")
        tag = next(iter(data))
        if tag == "$float":
            return {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}[data["$float"]]
        if tag == "$scalar":
            return np.dtype(data["$scalar"]).type(self.decode(data["value"]))
        if tag == "$dtype":
            return np.dtype(data["$dtype"])
        if tag == "$array":
            try:
                return self.arrays[data["$array"]]
            except KeyError:
                raise ModelFormatError(f"corrupted model file: array {data['$array']} is missing") from None
        if tag == "$objarray":
            out = np.empty(len(data["$objarray"]), dtype=object)
            for i, v in enumerate(data["$objarray"]):
                out[i] = self.decode(v)
            return out.reshape(data["shape"])
        if tag == "$tuple":
            return tuple(self.decode(v) for v in data["$tuple"])
        if tag == "$dict":
            return {_hashable(self.decode(k)): self.decode(v) for k, v in data["$dict"]}
        if tag == "$object":
            cls = _resolve_class(data["$object"])
            state = self.decode(data["state"])
            if not isinstance(state, dict):
                raise ModelFormatError(f"corrupted model file: state of {data['$object']} is not a mapping")
            via = data.get("via")
            if via is not None:
                if via not in {loader for _, loader in _STATE_PROTOCOLS}:
                    raise ModelFormatError(f"corrupted model file: unknown loader {via!r}")
                return getattr(cls, via)(state)
            obj = cls.__new__(cls)
            obj.__dict__.update(state)
            restore = getattr(obj, "_model_io_restore_", None)
            if restore is not None:
                restore()
            return obj
        raise ModelFormatError(f"corrupted model file: unknown tag {tag!r}")


def _hashable(key):
    return tuple(key) if isinstance(key, list) else key


# ---------------------------------------------------------------------------- writing

def library_version():
    """The installed histforest version (``"unknown"`` when not installed)."""
    try:
        from importlib.metadata import version

        return version("histforest")
    except Exception:  # noqa: BLE001 - metadata lookup failing must not block saving
        return "unknown"


def check_writable(path):
    """Raise ``ValueError`` early when ``path``'s directory cannot take a new file.

    Parameters
    ----------
    path : str
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(directory):
        raise ValueError(f"output directory {directory!r} does not exist")
    if not os.access(directory, os.W_OK):
        raise ValueError(f"output directory {directory!r} is not writable")
    if os.path.isdir(path):
        raise ValueError(f"output path {path!r} is a directory")


def dumps_header_and_arrays(estimator, metadata=None):
    """Encode ``estimator`` into the header dict and the list of arrays it references.

    Parameters
    ----------
    estimator : object
        An instance of a registered estimator class.
    metadata : dict, optional
        JSON-able extra information (column names, training size, ...).

    Returns
    -------
    header : dict
    arrays : list of ndarray
    """
    if not _is_allowed_instance(estimator):
        raise TypeError(f"{_class_name(type(estimator))} is not a class model files can hold")
    enc = _Encoder()
    raw_state, via = _state_of(estimator)
    state = enc.encode_state(raw_state, "estimator")
    params = {}
    if hasattr(estimator, "get_params"):
        params = enc.encode(estimator.get_params(deep=False), "params")
    names = getattr(estimator, "feature_names_in_", None)
    feature_names = [str(n) for n in names] if names is not None else (metadata or {}).get("feature_names")
    header = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "library_version": library_version(),
        "created": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "estimator": _class_name(type(estimator)),
        "params": params,
        "feature_names": feature_names,
        "metadata": metadata or {},
        "arrays": {str(i): {"dtype": a.dtype.str, "shape": list(a.shape)} for i, a in enumerate(enc.arrays)},
        "state": state,
    }
    if via is not None:
        header["via"] = via
    return header, enc.arrays


def _write_container(fileobj, header, arrays):
    with zipfile.ZipFile(fileobj, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        zf.writestr(HEADER_NAME, json.dumps(header, allow_nan=False, separators=(",", ":")))
        for i, arr in enumerate(arrays):
            with zf.open(f"{_ARRAY_DIR}{i}.npy", "w", force_zip64=arr.nbytes > 2**30) as f:
                np.lib.format.write_array(f, arr, allow_pickle=False)


def save(estimator, path, metadata=None):
    """Write ``estimator`` to ``path`` atomically.

    Parameters
    ----------
    estimator : object
        A fitted (or unfitted) estimator of a registered class.
    path : str
        Target file; replaced only once the new file is complete on disk.
    metadata : dict, optional
        JSON-able extras stored in the header (e.g. ``{"treatment": "t"}``).
    """
    header, arrays = dumps_header_and_arrays(estimator, metadata)
    check_writable(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            _write_container(f, header, arrays)
            f.flush()
            os.fsync(f.fileno())
        _chmod_like_new_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:  # make the rename itself durable; not every filesystem allows this
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def _chmod_like_new_file(path):
    """Give a mkstemp file (mode 0600) the mode ``open()`` would have given it."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(path, 0o666 & ~mask)


# ---------------------------------------------------------------------------- reading

def _open_container(path):
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise ModelFormatError(f"cannot read model file {path!r}: {exc.strerror or exc}") from None
    if magic != b"PK\x03\x04":
        raise ModelFormatError(f"{path!r} is not a histforest model file (it is not a model container)")
    try:
        return zipfile.ZipFile(path, "r")
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ModelFormatError(f"model file {path!r} is truncated or corrupted ({exc})") from None


def read_header(path):
    """Read and check the JSON header of a model file.

    Parameters
    ----------
    path : str

    Returns
    -------
    dict
        The header (see the module docstring).

    Raises
    ------
    ModelFormatError
        Not a model file, corrupted, truncated, or written by a newer format version.
    """
    with _open_container(path) as zf:
        return _read_header(zf, path)


def _read_header(zf, path):
    try:
        raw = zf.read(HEADER_NAME)
    except KeyError:
        raise ModelFormatError(f"{path!r} is not a histforest model file (no {HEADER_NAME})") from None
    except Exception as exc:  # noqa: BLE001 - CRC, zlib and I/O errors all mean a damaged file
        raise ModelFormatError(f"model file {path!r} is truncated or corrupted ({exc})") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelFormatError(f"model file {path!r} has a corrupted header ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise ModelFormatError(f"{path!r} is not a histforest model file (format {header.get('format')!r})"
                               if isinstance(header, dict) else f"{path!r} is not a histforest model file")
    version = header.get("format_version")
    if not isinstance(version, int):
        raise ModelFormatError(f"model file {path!r} has no valid format_version")
    if version > FORMAT_VERSION:
        raise ModelFormatError(
            f"model file {path!r} uses format version {version}, newer than this histforest "
            f"({library_version()}) reads (up to {FORMAT_VERSION}); upgrade histforest to load it")
    return header


def load(path, expect=None):
    """Restore the estimator saved in ``path``.

    Parameters
    ----------
    path : str
    expect : type or tuple of type, optional
        Estimator class(es) the caller needs; another kind fails with a clear message.

    Returns
    -------
    estimator
        Equal in every fitted array to the one saved (bit for bit).

    Raises
    ------
    ModelFormatError
        Not a model file, corrupted, truncated, too new, or of the wrong kind.
    """
    with _open_container(path) as zf:
        header = _read_header(zf, path)
        if expect is not None:
            wanted = expect if isinstance(expect, tuple) else (expect,)
            names = [_class_name(c) for c in wanted]
            if header.get("estimator") not in names:
                raise ModelFormatError(
                    f"model file {path!r} holds a {header.get('estimator', '?').rsplit('.', 1)[-1]}, "
                    f"but a {' or '.join(n.rsplit('.', 1)[-1] for n in names)} is needed here")
        arrays = {}
        for key, info in header.get("arrays", {}).items():
            name = f"{_ARRAY_DIR}{key}.npy"
            try:
                data = zf.read(name)
                arr = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
            except KeyError:
                raise ModelFormatError(f"model file {path!r} is truncated or corrupted (missing {name})") from None
            except Exception as exc:  # noqa: BLE001 - CRC, zlib and npy parse errors all mean corruption
                raise ModelFormatError(f"model file {path!r} is truncated or corrupted ({name}: {exc})") from None
            if arr.dtype.str != info.get("dtype") or list(arr.shape) != info.get("shape"):
                raise ModelFormatError(f"model file {path!r} is corrupted: {name} does not match the header")
            arrays[key] = arr
        try:
            cls = _resolve_class(header["estimator"])
            top = {"$object": header["estimator"], "state": header["state"]}
            if "via" in header:
                top["via"] = header["via"]
            decoded = _Decoder(arrays).decode(top)
        except ModelFormatError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelFormatError(f"model file {path!r} has a corrupted state ({type(exc).__name__}: {exc})") from None
        if not isinstance(decoded, cls):
            raise ModelFormatError(f"model file {path!r} is corrupted: wrong estimator class")
        return decoded

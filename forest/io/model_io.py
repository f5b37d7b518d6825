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

Only classes in the registry can be named by ``$object``: classes added with
:func:`register` (each estimator module registers its estimator; this module the
trees and bin mappers), and only from the ``forest``, ``histogram`` and ``native``
packages. A class is named by the name it was registered under, which stays the
same when the class moves (:func:`file_name`). Loading therefore never executes code taken
from the file: it parses JSON, reads plain arrays and sets attributes of
whitelisted classes. A class with a ``to_arrays``/``from_arrays`` (or
``get_state``/``from_state``) pair (``Tree``, ``BinMapper``) is stored through it;
for other classes ``__init__`` is not called (a class may define
``_model_io_restore_(self)`` to rebuild caches from the restored attributes, and
``_model_io_exclude_`` (a tuple of attribute names) to leave transient attributes
such as compiled kernels out of the file).

Loading trusts nothing in the file. Every entry must be stored uncompressed (so
nothing can expand beyond the file's own size), every array's ``.npy`` header must
agree with the header's ``arrays`` table and its data length before anything is
allocated, nesting depth and dtypes are bounded, a class with a state protocol checks
its state (``validate_state``) before rebuilding from it, and the restored estimator
as a whole is checked by :func:`forest.io.model_checks.check_estimator` (structure of
every tree, bin mapper, shapes, agreement between the pieces). Anything wrong fails
with :class:`ModelFormatError` and a one-line message; a file whose state is not one
of the class its header names says so (:class:`ContentMismatch`).

Writing is atomic: the container goes to a temporary file in the target's
directory, is flushed to disk, and is renamed over the target, so a crash leaves
either the old file or the new one, never a half-written model.

Version policy: readers accept any ``format_version`` up to their own; a file from a
newer format fails with a message asking for a newer histforest.
"""
import datetime
import importlib
import inspect
import io
import json
import math
import os
import re
import tempfile
import zipfile

import numpy as np

from histogram.binning import BinMapper
from histogram.categories import CategoryCoder

from forest.engine.tree import Tree
from forest.io.model_checks import ContentMismatch, check_estimator  # noqa: F401 (ContentMismatch re-exported)

FORMAT_NAME = "histforest-model"
FORMAT_VERSION = 1
HEADER_NAME = "histforest-model.json"
_ARRAY_DIR = "arrays/"
_ALLOWED_PACKAGES = ("forest", "histogram", "native")

#: Classes a model file may name, by their name in files (:func:`file_name`). The
#: format knows no estimator: each estimator module registers its class
#: (:func:`register`); the pieces of their state below the estimators (trees, bin
#: mappers) are registered here.
_REGISTRY = {}
#: Class -> its name in files, and class -> the check of its restored state.
_FILE_NAMES = {}
_CHECKS = {}


class ModelFormatError(ValueError):
    """A model file that cannot be read: not a model, corrupted, truncated, too new or inconsistent.

    The message is always one line (the command-line tools print it as their error).
    """

    def __init__(self, message):
        super().__init__(" ".join(str(message).split()))




#: dtype kinds arrays and scalars in a model file may have (never object, void or structured).
_ARRAY_KINDS = "biufcUSMm"
_SCALAR_KINDS = "biuf"
_DTYPE_STR = re.compile(r"[<>|=][biufcmMUS][0-9]{1,9}(\[[0-9]*[A-Za-z]+\])?")


def file_name(cls):
    """The name model files give ``cls``: the one it was registered under, else ``module.qualname``.

    A class that moves to another module keeps the name its files were written with
    (``forest.causal_forest.CausalForest`` lives in ``forest.estimators.causal_forest``
    since the layout of issue 31): files written before a move still load, and the
    same fit writes the same bytes.
    """
    return _FILE_NAMES.get(cls) or f"{cls.__module__}.{cls.__qualname__}"


_class_name = file_name


def register(cls, name=None, check=None):
    """Allow instances of ``cls`` inside model files.

    Parameters
    ----------
    cls : type
        A class from the ``forest``, ``histogram`` or ``native`` packages whose
        ``__dict__`` holds only values this format can store.
    name : str, optional
        Its name in files (default ``module.qualname``); a class that moved keeps the
        name its files were written with.
    check : callable, optional
        ``check(restored)``: the checks of a restored instance's state as a whole
        (:func:`forest.io.model_checks.check_estimator` runs it after the parameter
        checks); an estimator registers one.

    Returns
    -------
    type
        ``cls`` itself.
    """
    name = name or f"{cls.__module__}.{cls.__qualname__}"
    if name.split(".")[0] not in _ALLOWED_PACKAGES or cls.__module__.split(".")[0] not in _ALLOWED_PACKAGES:
        raise ValueError(f"only histforest classes can be registered, not {name}")
    if _REGISTRY.get(name, cls) is not cls:
        raise ValueError(f"two classes registered as {name!r}: {_REGISTRY[name].__module__} and {cls.__module__}")
    _REGISTRY[name] = cls
    _FILE_NAMES[cls] = name
    if check is not None:
        _CHECKS[cls] = check
    return cls


def _resolve_class(name):
    """The registered class a file names; imports only histforest modules."""
    if name in _REGISTRY:
        return _REGISTRY[name]
    module_name, _, qualname = name.rpartition(".")
    if module_name.split(".")[0] not in _ALLOWED_PACKAGES:
        raise ModelFormatError(f"model file names class {name!r}, which is not a histforest class")
    # A class registered by its own module may not be imported yet. Importing one of
    # our own package modules is safe; the name must still be registered afterwards.
    try:
        importlib.import_module(module_name)
    except (ImportError, ValueError, TypeError):
        pass
    if name in _REGISTRY:
        return _REGISTRY[name]
    raise ModelFormatError(f"model file names class {name!r}, which is not registered for model files (the "
                           f"estimators register when imported: `from forest import model_io` loads any of them)")


def registered_names():
    """The class names model files may hold now (those of the kinds imported so far), sorted."""
    return sorted(_REGISTRY)


def _is_allowed_instance(obj):
    return _REGISTRY.get(_class_name(type(obj))) is type(obj)


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
            f"python scalars/str/list/dict and classes registered with forest.io.model_io.register are allowed")


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


def _state_protocol(cls):
    """``(getter, loader)`` names of the state protocol ``cls`` defines, or None."""
    for getter, loader in _STATE_PROTOCOLS:
        if callable(getattr(cls, getter, None)) and callable(getattr(cls, loader, None)):
            return getter, loader
    return None


def _state_of(obj):
    """``(state dict, name of the rebuilding classmethod or None)`` of a registered object."""
    cls = type(obj)
    protocol = _state_protocol(cls)
    if protocol is not None:
        try:
            return getattr(obj, protocol[0])(), protocol[1]
        except ValueError:
            pass  # e.g. an unfitted BinMapper: fall back to its attributes
    # Metadata-routing requests (forest.estimators.base) belong to the session that set
    # them, like scikit-learn's own: never stored.
    # Every class of the MRO may name its own transient attributes (mixins included).
    exclude = {"_metadata_request"}.union(*(vars(k).get("_model_io_exclude_", ()) for k in cls.__mro__))
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
            dtype = _plain_dtype(data["$scalar"], _SCALAR_KINDS)
            value = self.decode(data["value"])
            if not isinstance(value, (bool, int, float)):
                raise ModelFormatError(f"corrupted model file: scalar of dtype {dtype} holds {type(value).__name__}")
            return dtype.type(value)
        if tag == "$dtype":
            return _plain_dtype(data["$dtype"], _ARRAY_KINDS)
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
            if not all(isinstance(k, str) for k in state):
                raise ModelFormatError(f"corrupted model file: state of {data['$object']} has non-text keys")
            via = data.get("via")
            if via is not None:
                if via != (_state_protocol(cls) or (None, None))[1]:
                    raise ContentMismatch(f"{cls.__name__} has no loader {via!r}")
                check = getattr(cls, "validate_state", None)
                if check is not None:
                    check(state)  # before the loader casts or trusts anything
                return getattr(cls, via)(state)
            if _state_protocol(cls) is not None:
                # Stored without its protocol only when unfitted (the getter refused):
                # then the state can hold nothing but constructor parameters.
                extra = sorted(set(state) - set(inspect.signature(cls.__init__).parameters))
                if extra:
                    raise ContentMismatch(f"a {cls.__name__} stored without its state protocol has {extra[0]!r}")
            obj = cls.__new__(cls)
            obj.__dict__.update(state)
            restore = getattr(obj, "_model_io_restore_", None)
            if restore is not None:
                restore()
            return obj
        raise ModelFormatError(f"corrupted model file: unknown tag {tag!r}")


def _hashable(key):
    return tuple(key) if isinstance(key, list) else key


def _plain_dtype(name, kinds):
    """``np.dtype(name)`` if it is a plain dtype of one of ``kinds`` (no fields, no subarray)."""
    # Only the form ``dtype.str`` takes ("<f8", "|b1", "<U3", "<M8[ns]"): numpy parses other
    # strings with its own mini-language (commas, tuples, literal_eval) and all its errors.
    if not isinstance(name, str) or not _DTYPE_STR.fullmatch(name):
        raise ModelFormatError(f"corrupted model file: dtype {name!r} is not allowed here")
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError):
        raise ModelFormatError(f"corrupted model file: unknown dtype {name!r}") from None
    if dtype.kind not in kinds or dtype.fields is not None or dtype.subdtype is not None or dtype.itemsize == 0:
        raise ModelFormatError(f"corrupted model file: dtype {name!r} is not allowed here")
    return dtype


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

    The directory is probed by creating (and removing) a hidden temporary file in it,
    as :func:`save` will: permission bits do not tell everything (root, read-only
    mounts, pseudo file systems such as ``/proc``), so a run fails here, naming
    ``path``, before any data is read rather than after the work is done. An existing
    ``path`` that is not a regular file (a directory, a device) is refused.

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
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"output path {path!r} exists and is not a regular file")
    problem = directory_write_error(directory, prefix=f".{os.path.basename(path)}.")
    if problem is not None:
        raise ValueError(f"cannot write {path!r}: cannot create a file in {directory!r} ({problem})")


def directory_write_error(directory, prefix=".histforest-probe."):
    """Why a new file cannot be created in ``directory`` (the OS's words), or None when it can.

    Creates and removes a hidden temporary file there, the way :func:`save` writes.
    """
    try:
        fd, probe = tempfile.mkstemp(prefix=prefix, suffix=".tmp", dir=directory)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    os.close(fd)
    try:
        os.unlink(probe)
    except OSError:
        pass
    return None


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


def dumps(estimator, metadata=None):
    """The bytes of the model file :func:`save` would write (to ship a model, not a file).

    :mod:`forest.distributed` sends fitted models from a Spark task or Dask worker to
    the driver, and unfitted ones (parameters only) the other way, this way: the same
    checked, pickle-free format as files.

    Parameters
    ----------
    estimator : object
        A fitted or unfitted estimator of a registered class.
    metadata : dict, optional

    Returns
    -------
    bytes
    """
    header, arrays = dumps_header_and_arrays(estimator, metadata)
    buf = io.BytesIO()
    _write_container(buf, header, arrays)
    return buf.getvalue()


def loads(data, expect=None):
    """Restore an estimator from :func:`dumps`'s bytes, with every check of :func:`load`.

    Parameters
    ----------
    data : bytes
    expect : type or tuple of type, optional

    Returns
    -------
    estimator

    Raises
    ------
    ModelFormatError
    """
    # Through a private temporary file: load's checks (entry sizes against the file's,
    # CRCs) stay the single reading path.
    fd, tmp = tempfile.mkstemp(prefix=".histforest-model.", suffix=".bytes")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(bytes(data))
        try:
            return load(tmp, expect=expect)
        except ModelFormatError as exc:
            raise ModelFormatError(str(exc).replace(repr(tmp), "(model bytes)").replace(tmp, "(model bytes)")) \
                from None
    finally:
        os.unlink(tmp)


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
        zf = zipfile.ZipFile(path, "r")
    except Exception as exc:  # noqa: BLE001 - BadZipFile, EOFError, NotImplementedError, ...: all a damaged file
        raise ModelFormatError(f"model file {path!r} is truncated or corrupted ({exc})") from None
    try:
        _check_entries(zf, os.path.getsize(path), path)
    except BaseException:
        zf.close()
        raise
    return zf


def _check_entries(zf, file_size, path):
    """Refuse compressed, duplicated or oversized entries before any is read.

    The writer stores every entry uncompressed, so an entry can never be larger than
    the file holding it; a compressed entry could expand without bound.
    """
    infos = zf.infolist()
    names = [i.filename for i in infos]
    if len(set(names)) != len(names):
        raise ModelFormatError(f"model file {path!r} is corrupted (an entry appears twice)")
    for info in infos:
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size \
                or info.file_size > file_size:
            raise ModelFormatError(f"model file {path!r} is corrupted (entry {info.filename!r} is compressed "
                                   f"or larger than the file)")


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


def _read_entry(zf, name, path, missing):
    """Bytes of entry ``name``; ``ModelFormatError(missing)`` when it is absent."""
    try:
        return zf.read(name)
    except KeyError:
        raise ModelFormatError(missing) from None
    except Exception as exc:  # noqa: BLE001 - CRC, zlib and I/O errors all mean a damaged file
        raise ModelFormatError(f"model file {path!r} is truncated or corrupted ({name}: {exc})") from None


def _read_header(zf, path):
    raw = _read_entry(zf, HEADER_NAME, path, f"{path!r} is not a histforest model file (no {HEADER_NAME})")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ModelFormatError(f"model file {path!r} has a corrupted header ({type(exc).__name__})") from None
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
    _check_header_fields(header, path)
    return header


def _check_header_fields(header, path):
    """The header fields readers use directly must have their documented types."""
    def names_ok(v):
        return v is None or (isinstance(v, list) and all(isinstance(n, str) for n in v))

    arrays = header.get("arrays", {})
    problems = [
        (isinstance(header.get("estimator"), str), "'estimator' is not a class name"),
        ("state" in header, "there is no 'state'"),
        (isinstance(arrays, dict) and all(
            isinstance(a, dict) and isinstance(a.get("dtype"), str) and isinstance(a.get("shape"), list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in a["shape"])
            for a in arrays.values()), "the 'arrays' table is malformed"),
        (isinstance(header.get("metadata", {}), dict), "'metadata' is not a mapping"),
        (names_ok(header.get("feature_names")), "'feature_names' is not a list of names"),
        (names_ok(header.get("metadata", {}).get("feature_names") if isinstance(header.get("metadata", {}), dict)
                  else None), "metadata 'feature_names' is not a list of names"),
    ]
    for ok, what in problems:
        if not ok:
            raise ModelFormatError(f"model file {path!r} has a corrupted header ({what})")


def _npy_header(dtype, shape):
    """The ``.npy`` header ``np.lib.format.write_array`` writes for a C-ordered array."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": tuple(shape)})
    return buf.getvalue()


def _read_array(zf, key, info, path):
    """Entry ``arrays/<key>.npy``, checked against its ``arrays`` table entry before allocation."""
    name = f"{_ARRAY_DIR}{key}.npy"
    data = _read_entry(zf, name, path, f"model file {path!r} is truncated or corrupted (missing {name})")
    expected = _plain_dtype(info["dtype"], _ARRAY_KINDS)
    count = math.prod(info["shape"])
    canonical = _npy_header(expected, info["shape"])
    if data.startswith(canonical) and len(data) == len(canonical) + count * expected.itemsize:
        # What the writer produces: no header parse needed (that costs more than small arrays' data).
        return np.frombuffer(data, dtype=expected, count=count, offset=len(canonical)).reshape(info["shape"]).copy()
    f = io.BytesIO(data)
    try:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"unsupported .npy version {version}")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(f)
    except Exception as exc:  # noqa: BLE001 - any parse failure of the .npy header means corruption
        raise ModelFormatError(f"model file {path!r} is corrupted ({name}: {exc})") from None
    if dtype != expected or dtype.str != info["dtype"] or list(shape) != info["shape"]:
        raise ModelFormatError(f"model file {path!r} is corrupted: {name} does not match the header")
    if count * dtype.itemsize != len(data) - f.tell():
        raise ModelFormatError(f"model file {path!r} is truncated or corrupted ({name} holds "
                               f"{len(data) - f.tell()} data bytes, its shape needs {count * dtype.itemsize})")
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=f.tell())
    return flat.reshape(shape, order="F" if fortran else "C").copy()


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
        try:
            arrays = {key: _read_array(zf, key, info, path) for key, info in header.get("arrays", {}).items()}
        except (ValueError, TypeError, OverflowError, MemoryError) as exc:
            if isinstance(exc, ModelFormatError):
                raise
            # e.g. more dimensions than numpy has, a header too long to write for comparison
            raise ModelFormatError(f"model file {path!r} is corrupted ({type(exc).__name__}: {exc})") from None
    name = header["estimator"]
    cls = _resolve_class(name)
    short = name.rsplit(".", 1)[-1]
    try:
        top = {"$object": name, "state": header["state"]}
        if "via" in header:
            top["via"] = header["via"]
        decoded = _Decoder(arrays).decode(top)
        if not isinstance(decoded, cls):
            raise ContentMismatch(f"it restores a {type(decoded).__name__}")
        _check_restored(decoded, header)
    except ContentMismatch as exc:
        raise ModelFormatError(f"model file {path!r} names class {short}, but its contents do not match "
                               f"that class ({exc})") from None
    except ModelFormatError as exc:
        raise ModelFormatError(str(exc).replace("corrupted model file", f"model file {path!r} is corrupted", 1)) \
            from None
    except _STATE_ERRORS as exc:
        detail = f": {exc}" if type(exc) is ValueError else f" ({type(exc).__name__}: {exc})"
        raise ModelFormatError(f"model file {path!r} is corrupted{detail}") from None
    return decoded


#: What interpreting an untrusted state may raise (bad types, values, shapes, nesting).
_STATE_ERRORS = (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError, RecursionError)


def _check_restored(obj, header):
    """:func:`forest.io.model_checks.check_estimator`, and the header's feature names against the model."""
    check_estimator(obj, _CHECKS.get(type(obj)))
    names = header.get("feature_names")
    n_features = vars(obj).get("n_features_in_")
    if names is not None and isinstance(n_features, int) and len(names) != n_features:
        raise ValueError(f"the header names {len(names)} features, the model has {n_features}")


# The pieces of fitted state below the estimators; estimators register themselves.
register(Tree, name="forest.tree.Tree")
register(BinMapper)
register(CategoryCoder)

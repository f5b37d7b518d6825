"""Checkpoints of a fit in progress, and resuming from them at any rank count.

This module owns the checkpoint directory: what is in it, when rank 0 writes it, how
a rerun reads it back, and when it is refused.

What is written
    ``manifest.ckpt``: the estimator's class, its parameters (canonical JSON, all but
    ``warm_start``), the data fingerprint (:func:`forest.io.fingerprint.data_fingerprint`:
    row count, feature count and names, target widths, a digest of the bin edges and a
    content hash summed over global row ids), the seed the fit used, and per *stage*
    (a forest, a nuisance forest, a boosting run) the number of trees done, the batch
    grid, the state a stage needs beyond its trees (GBDT: the baseline, the validation
    losses, whether it stopped) and the list of tree segments.
    ``<stage>-<lo>-<hi>.ckpt``: trees ``lo .. hi-1`` of one stage, written once.
    Both are :mod:`forest.io.model_io` containers (no pickle) written atomically
    (temporary file, fsync, rename): a crash leaves the previous manifest, whose
    segments are all complete. Writing a segment before the manifest that lists it
    makes every checkpoint cost the bytes of the new trees only.

What is not written
    Per-row state: out-of-bag sums, the nuisance estimates of a causal forest, the
    boosting scores. They are recomputed from the trees on resume, each row adding
    its trees in tree order as the uninterrupted fit did, so they come out the same
    bits, at any rank count, without storing 1e8-row arrays.

Resuming
    Rank 0 reads the directory and broadcasts it, so it need not be visible to the
    other ranks. A rerun with other data or parameters is refused with one line
    (:class:`CheckpointError`, a ``ValueError``); ``restart=True`` (``--restart``)
    discards the directory's checkpoint first. A resumed fit says ``resuming from N of
    M trees`` once (``Checkpoint.log``) and reports progress from ``N``.

What "the same model" means
    Resumed on as many ranks (and threads) as before, the model equals the
    uninterrupted run's bit for bit. On another rank count the trees written before
    the crash are kept bit for bit and the later ones are grown there: every split
    equals the uninterrupted run's, and node values differ from it by float summation
    order only (about 1e-16 relative), exactly as two uninterrupted runs on those two
    rank counts differ from each other: sums over rows split differently across ranks
    are added in a different order.
"""
import json
import os
import re
import sys

import numpy as np

from native import collectives as col

from forest.io import model_io
from forest.engine.tree import pack_trees, unpack_trees

MANIFEST_NAME = "manifest.ckpt"
MANIFEST_VERSION = 1
#: Our files in a checkpoint directory (and model_io's temporary files for them);
#: nothing else there is ever removed.
_OUR_FILE = re.compile(r"^(manifest|[a-z0-9-]+-\d{7}-\d{7})\.ckpt$")
_OUR_TEMP = re.compile(r"^\.(manifest|[a-z0-9-]+-\d{7}-\d{7})\.ckpt\..+\.tmp$")
#: Parameters that may differ between the run that wrote a checkpoint and the one resuming it.
_FREE_PARAMS = ("warm_start",)


class CheckpointError(ValueError):
    """A checkpoint that belongs to another fit, or that cannot be read or written."""


class Checkpoint:
    """Where and how a fit checkpoints; pass it (or just a directory) as ``fit(..., checkpoint=)``.

    Parameters
    ----------
    directory : str or os.PathLike
        Created if missing. Rank 0 writes it; it need not be shared with other ranks.
    restart : bool, default False
        Discard the checkpoint the directory holds, once: when the first fit given this
        object starts.
    every : int, default 10
        Boosting iterations between two checkpoints of a GBDT fit (forests write one
        after every batch of trees).
    log : callable, optional
        ``log(line)`` on rank 0 when a fit resumes; default: print to stderr.
    restart_hint : str, optional
        How to discard a refused checkpoint, named in the refusal message.
    """

    def __init__(self, directory, *, restart=False, every=10, log=None, restart_hint=None):
        self.directory = os.fspath(directory)
        self.restart = bool(restart)
        if not isinstance(every, (int, np.integer)) or every < 1:
            raise ValueError(f"checkpoint every must be an int >= 1, got {every!r}")
        self.every = int(every)
        self.log = log
        self.restart_hint = restart_hint or "pass restart=True to discard it"
        self._discarded = False

    def __repr__(self):
        return f"Checkpoint({self.directory!r}, restart={self.restart}, every={self.every})"

    def say(self, line):
        """Print ``line`` (the caller is rank 0)."""
        if self.log is not None:
            self.log(line)
        else:
            print(f"histforest: {line}", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------ rank 0 only
    def _path(self, name):
        return os.path.join(self.directory, name)

    def _prepare(self):
        """Create the directory, discard once if asked; return the manifest or None (rank 0)."""
        os.makedirs(self.directory, exist_ok=True)
        if not os.access(self.directory, os.W_OK):
            raise CheckpointError(f"checkpoint directory {self.directory!r} is not writable")
        if self.restart and not self._discarded:
            self._remove(lambda name: True)
            self._discarded = True
        path = self._path(MANIFEST_NAME)
        if not os.path.exists(path):
            return None
        try:
            manifest = model_io.load(path, expect=CheckpointManifest)
        except model_io.ModelFormatError as exc:
            raise CheckpointError(f"checkpoint in {self.directory!r} cannot be read ({exc}); "
                                  f"{self.restart_hint}") from None
        version = getattr(manifest, "version", None)
        if version != MANIFEST_VERSION:
            raise CheckpointError(f"checkpoint in {self.directory!r} has version {version!r}, this "
                                  f"histforest reads {MANIFEST_VERSION}; {self.restart_hint}")
        return manifest

    def _remove(self, unwanted):
        """Delete our files (and temporaries) for which ``unwanted(name)`` is true."""
        for name in os.listdir(self.directory):
            if (_OUR_FILE.match(name) and unwanted(name)) or _OUR_TEMP.match(name):
                try:
                    os.unlink(self._path(name))
                except FileNotFoundError:
                    pass


def as_checkpoint(checkpoint):
    """``None``, a :class:`Checkpoint`, a :class:`Stage` (handed down by a parent fit) or a
    directory -> ``None``, that object, or a :class:`Checkpoint` of the directory."""
    if checkpoint is None or isinstance(checkpoint, (Checkpoint, Stage)):
        return checkpoint
    if isinstance(checkpoint, (str, os.PathLike)):
        return Checkpoint(checkpoint)
    raise TypeError(f"checkpoint must be None, a directory or a forest.io.checkpoint.Checkpoint, "
                    f"got {type(checkpoint).__name__}")


class CheckpointManifest:
    """Index of a checkpoint directory (the object in ``manifest.ckpt``).

    Attributes
    ----------
    version : int
    estimator : str
        Class name of the estimator.
    params : str
        Canonical JSON of its parameters (:func:`canonical_params`).
    data : dict
        :func:`forest.io.fingerprint.data_fingerprint` of the fit's input.
    seed : int or None
        Seed the fit used (GBDT draws one when ``random_state`` is None).
    stages : dict
        Stage name -> ``{"n_done", "n_total", "batch_size", "segments": [[file, lo, hi], ...],
        "extra": dict, "complete": bool}``.
    """

    def __init__(self, estimator, params, data, seed=None):
        self.version = MANIFEST_VERSION
        self.estimator = estimator
        self.params = params
        self.data = data
        self.seed = seed
        self.stages = {}


class TreeSegment:
    """Trees ``lo .. hi - 1`` of one stage (the object in a segment file).

    Attributes
    ----------
    stage : str
    lo, hi : int
    trees : dict
        Packed forest (:func:`forest.engine.tree.pack_trees`) of the ``hi - lo`` trees.
    """

    def __init__(self, stage, lo, hi, trees):
        self.stage, self.lo, self.hi, self.trees = stage, int(lo), int(hi), trees


# Checkpoint files name them as they did before the layout of issue 31, so a checkpoint
# written then still resumes.
model_io.register(CheckpointManifest, name="forest.checkpoint.CheckpointManifest")
model_io.register(TreeSegment, name="forest.checkpoint.TreeSegment")


def _jsonable(value, name):
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, name) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v, name) for k, v in value.items()}
    raise CheckpointError(f"parameter {name}={value!r} cannot be recorded in a checkpoint "
                          f"(use an int, float, str or None)")


def canonical_params(estimator):
    """The estimator's parameters as canonical JSON (all but ``warm_start``)."""
    params = {k: _jsonable(v, k) for k, v in estimator.get_params(deep=False).items() if k not in _FREE_PARAMS}
    return json.dumps(params, sort_keys=True)


def _class_name(obj):
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _refusal(checkpoint, manifest, estimator, params, data):
    """Why this checkpoint is not this fit's (None if it is)."""
    from forest.io.fingerprint import describe_difference

    where = f"checkpoint in {checkpoint.directory!r}"
    if manifest.estimator != _class_name(estimator):
        return (f"{where} is of a {manifest.estimator.rsplit('.', 1)[-1]} fit, not a "
                f"{type(estimator).__name__}; {checkpoint.restart_hint}")
    if manifest.params != params:
        old, new = json.loads(manifest.params), json.loads(params)
        name = sorted(k for k in set(old) | set(new) if old.get(k, "<unset>") != new.get(k, "<unset>"))[0]
        return (f"{where} was written with other parameters ({name}={old.get(name, '<unset>')!r} there, "
                f"{new.get(name, '<unset>')!r} here); {checkpoint.restart_hint}")
    difference = describe_difference(manifest.data, data)
    if difference is not None:
        return f"{where} was written for other data ({difference}); {checkpoint.restart_hint}"
    return None


def _error_text(exc):
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _on_rank0(comm, work, failure=str, share=True):
    """Run ``work()`` on rank 0; every rank gets its result or the same CheckpointError (collective).

    Parameters
    ----------
    comm : native.comm.Communicator
    work : callable
        Rank 0's I/O. A :class:`CheckpointError` it raises is passed on as is; another
        ``OSError`` / ``ValueError`` / ``TypeError`` becomes ``failure(its first line)``.
    failure : callable
    share : bool
        Broadcast the (small) result; else other ranks get None.
    """
    result, message = None, None
    if comm.rank == 0:
        try:
            result = work()
        except CheckpointError as exc:
            message = str(exc)
        except (OSError, ValueError, TypeError) as exc:
            message = failure(_error_text(exc))
    if comm.size > 1:
        # Rank 0 keeps its own result: with share=False only the message travels.
        shared, message = col.bcast_object(comm, (result if share else None, message), root=0)
        if comm.rank != 0 or share:
            result = shared
    if message is not None:
        raise CheckpointError(message)
    return result


def stored_seed(checkpoint, comm):
    """Seed recorded by the checkpoint, or None (collective; discards first on restart).

    A boosting fit with ``random_state=None`` draws its seed; a resumed fit must bin
    and hold out validation rows with the seed of the run it continues.
    """
    checkpoint = as_checkpoint(checkpoint)
    if checkpoint is None:
        return None
    if isinstance(checkpoint, Stage):
        return checkpoint.run.manifest.seed
    return _on_rank0(comm, lambda: getattr(checkpoint._prepare(), "seed", None))


class Run:
    """One fit's view of a checkpoint directory (every rank holds one; rank 0 does the I/O).

    Open it with :func:`open_run`; take its stages with :meth:`stage`.
    """

    def __init__(self, checkpoint, comm, manifest):
        self.checkpoint = checkpoint
        self.comm = comm
        self.manifest = manifest

    def stage(self, name):
        """The :class:`Stage` called ``name`` (new stages start empty)."""
        return Stage(self, name)

    def _write_manifest(self):
        model_io.save(self.manifest, self.checkpoint._path(MANIFEST_NAME))


def open_run(checkpoint, comm, estimator, data, *, main_stage, n_main, seed=None, unit="trees"):
    """Check the checkpoint directory against this fit and open it (collective).

    Parameters
    ----------
    checkpoint : Checkpoint, str or os.PathLike
    comm : native.comm.Communicator
    estimator : object
        The estimator being fitted (its class and parameters are compared).
    data : dict
        :func:`forest.io.fingerprint.data_fingerprint` of this fit's input.
    main_stage : str
        Stage whose progress the resume line reports.
    n_main : int
        Trees (or iterations) of the main stage in the whole fit.
    seed : int, optional
        Seed of this fit, recorded in a new checkpoint.
    unit : str
        What the resume line counts.

    Returns
    -------
    Run

    Raises
    ------
    CheckpointError
        On every rank, when the directory holds another fit's checkpoint or cannot be used.
    """
    checkpoint = as_checkpoint(checkpoint)
    params = canonical_params(estimator)

    def read():
        manifest = checkpoint._prepare()
        if manifest is None:
            return CheckpointManifest(_class_name(estimator), params, data, seed)
        refusal = _refusal(checkpoint, manifest, estimator, params, data)
        if refusal is not None:
            raise CheckpointError(refusal)
        listed = {seg[0] for st in manifest.stages.values() for seg in st["segments"]}
        checkpoint._remove(lambda name: name != MANIFEST_NAME and name not in listed)   # orphans of a crash
        return manifest

    manifest = _on_rank0(comm, read)
    if comm.rank == 0 and manifest.stages:
        checkpoint.say(_resume_line(checkpoint, manifest, main_stage, n_main, unit))
    return Run(checkpoint, comm, manifest)


def _resume_line(checkpoint, manifest, main_stage, n_main, unit):
    done = manifest.stages.get(main_stage, {}).get("n_done", 0)
    line = f"resuming from {done} of {n_main} {unit} (checkpoint {checkpoint.directory})"
    others = [f"{name} {st['n_done']} of {st['n_total']} {unit}" for name, st in sorted(manifest.stages.items())
              if name != main_stage and not st["complete"]]
    done_others = [name for name, st in sorted(manifest.stages.items()) if name != main_stage and st["complete"]]
    if done_others or others:
        line += "; " + ", ".join([f"{name} done" for name in done_others] + others)
    return line


class Stage:
    """Progress of one growing loop in a checkpoint (a forest, a nuisance forest, a boosting run).

    Attributes read from the checkpoint: ``n_done`` (trees written), ``batch_size``
    (the batch grid of the run that wrote them, or None), ``extra`` (stage-specific
    state), ``complete``.
    """

    def __init__(self, run, name):
        self.run = run
        self.name = name

    @property
    def _entry(self):
        return self.run.manifest.stages.get(self.name, {"n_done": 0, "n_total": None, "batch_size": None,
                                                          "segments": [], "extra": {}, "complete": False})

    @property
    def n_done(self):
        return int(self._entry["n_done"])

    @property
    def batch_size(self):
        return self._entry["batch_size"]

    @property
    def extra(self):
        return self._entry["extra"]

    @property
    def complete(self):
        return bool(self._entry["complete"])

    @property
    def every(self):
        return self.run.checkpoint.every

    def load_trees(self):
        """The stage's trees, in order, on every rank (collective).

        Returns
        -------
        list of forest.engine.tree.Tree
            ``n_done`` trees.
        """
        comm, checkpoint = self.run.comm, self.run.checkpoint
        if self.n_done == 0:
            return []

        def read():
            trees, expected = [], 0
            for name, lo, hi in self._entry["segments"]:
                seg = model_io.load(checkpoint._path(name), expect=TreeSegment)
                if (seg.stage, seg.lo, seg.hi) != (self.name, lo, hi) or lo != expected:
                    raise ValueError(f"segment {name} does not hold trees {lo}-{hi} of {self.name}")
                part = unpack_trees(seg.trees)
                if len(part) != hi - lo:
                    raise ValueError(f"segment {name} holds {len(part)} trees, not {hi - lo}")
                trees.extend(part)
                expected = hi
            if expected != self.n_done:
                raise ValueError(f"segments of {self.name} end at tree {expected}, not {self.n_done}")
            return pack_trees(trees)

        packed = _on_rank0(comm, read, share=False,
                           failure=lambda text: f"checkpoint in {checkpoint.directory!r} is damaged ({text}); "
                                                f"{checkpoint.restart_hint}")
        return unpack_trees(_bcast_arrays(comm, packed))

    def save(self, new_trees, n_done, n_total, *, batch_size=None, extra=None, complete=False):
        """Record ``new_trees`` (trees ``self.n_done .. n_done - 1``) and the stage state (collective).

        Rank 0 writes a segment with the new trees (if any), then the manifest; a write
        error raises :class:`CheckpointError` on every rank.

        Parameters
        ----------
        new_trees : sequence of Tree
        n_done, n_total : int
        batch_size : int, optional
        extra : dict, optional
            Replaces the stage's extra state (arrays, scalars, lists).
        complete : bool
        """
        comm, checkpoint = self.run.comm, self.run.checkpoint
        lo = self.n_done
        if n_done - lo != len(new_trees):
            raise ValueError(f"stage {self.name}: {len(new_trees)} new trees do not take it from {lo} to {n_done}")
        entry = dict(self._entry)
        entry["segments"] = list(entry["segments"])
        if new_trees:
            name = f"{self.name}-{lo:07d}-{n_done:07d}.ckpt"
            entry["segments"].append([name, lo, n_done])
        entry.update(n_done=int(n_done), n_total=int(n_total), complete=bool(complete),
                     batch_size=None if batch_size is None else int(batch_size),
                     extra=entry["extra"] if extra is None else extra)

        def write():
            if new_trees:
                model_io.save(TreeSegment(self.name, lo, n_done, pack_trees(new_trees)), checkpoint._path(name))
            self.run.manifest.stages[self.name] = entry
            self.run._write_manifest()     # after the segment: a crash between them leaves an orphan only

        _on_rank0(comm, write, share=False,
                  failure=lambda text: f"cannot write checkpoint in {checkpoint.directory!r}: {text}")
        self.run.manifest.stages[self.name] = entry


def _bcast_arrays(comm, arrays):
    """Broadcast a dict of arrays from rank 0 (collective): layout by object, data by array."""
    if comm.size == 1:
        return arrays
    layout = None if comm.rank else {k: (v.dtype.str, v.shape) for k, v in arrays.items()}
    layout = col.bcast_object(comm, layout, root=0)
    out = {}
    for key, (dtype, shape) in layout.items():
        buf = np.ascontiguousarray(arrays[key]) if comm.rank == 0 else np.empty(shape, dtype=np.dtype(dtype))
        out[key] = col.bcast(comm, buf, root=0)
    return out

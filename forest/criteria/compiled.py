"""Criteria at the compiled level: the pieces a criterion gives the Numba kernels.

This module owns the seam between split criteria (:mod:`forest.criteria.basic`,
:mod:`forest.criteria.causal`, ...) and the compiled growth kernels
(:mod:`forest.engine.local_growth`'s subtree kernel, :mod:`forest.engine.splitting`'s histogram
search). No kernel tests a criterion's type or kind: a kernel takes the criterion's
*parameter record* (an instance of a ``collections.namedtuple`` class that the
criterion registers here) and calls the generic functions below; Numba types the
record by its class, so every kernel is compiled once per registered criterion, and
each call resolves, at compile time, to that criterion's own pieces.

The pieces a criterion supplies (:func:`register`)
--------------------------------------------------
All are Numba-compilable functions whose first argument is the record ``p``:

``prepare(p, parent, consts)``
    Node constants from the node's channel sums ``parent (C,)`` into ``consts``
    (``n_consts`` float64 slots; what is not a constant may serve as scratch for
    ``gains``). Called once per node.
``gains(p, lefts, rights, consts, out, row, n)``
    Gains of ``n`` candidate splits of one node into ``out[row, :n]``: ``lefts`` and
    ``rights`` (``>= n`` rows, ``C`` columns) are the two children's channel sums.
    Within one call every candidate splits the same total (``lefts[i] + rights[i]``
    equal for all ``i``: the node's sums, or a histogram search's per-feature total),
    so a piece may derive one side from the other.
    Must equal the criterion's vectorised ``gain`` (``-inf`` where a constraint
    fails): tests compare the two. Called once per (node, feature), so the loop over
    candidates belongs inside it (a call per candidate costs more than the gain).
``sides_ok(p, n_l, n_r, cum, miss, with_miss, parent)`` (optional)
    Whether a candidate whose left child holds the running sums ``cum`` (plus
    ``miss`` when ``with_miss``) and ``n_l`` rows (``n_r`` on the right) can pass the
    criterion's *row-count* constraints beyond ``min_child_rows`` rows per side
    (the causal forest's rows per treatment arm). Only a shortcut: a candidate it
    rejects must score ``-inf``, so skipping it changes nothing. Default: true.
``right_exhausted(p, n_r, cum, parent)`` (optional)
    Whether no later candidate of a left-to-right scan can pass: the right side,
    which only shrinks as the scan moves on, already fails those count constraints.
    Default: false.
``bin_key(p, stats, i, consts)`` (optional; needed for categorical features)
    The sort key of one category (row ``i`` of ``stats``, its channel sums in the
    node, positive weight) given the node constants of ``prepare``: a node's
    categories are scanned in increasing key order, so a category subset that goes
    left is a prefix of that order (:mod:`forest.engine.categorical_split`). It should
    be the per-category estimate whose squared deviations the criterion rewards:
    the mean outcome (variance), the mean GRF pseudo-outcome (causal, instrumental).
    Default: 0 for every category (their code order: what integer codes would give).
Row classes (optional, all five together; not with ``sides_ok`` / ``right_exhausted``)
    For a criterion whose rows can carry only ``G`` distinct channel vectors (the
    probability forest's one-hot classes) and whose gain depends on a side's class
    counts ``cnt (G,)`` only through its rows ``n`` and ``q2 = sum_g cnt_g**2`` (a Gini-type
    score). The subtree kernel's sorted-code scan then counts rows per class, keeps
    ``q2`` of both sides by integer updates, and scores a candidate from
    ``(n, class_side)`` pairs instead of adding ``C`` channels per row and writing ``C``
    sums per side (:mod:`forest.engine.local_growth`). The trees must not change:

    ``n_row_classes(p, n)``
        ``G`` for a subtree of up to ``n`` rows, or 0 where the pieces below would not be
        exact for that many rows (the kernel then adds channels, as without the pieces).
    ``row_class(p, ch, i)``
        The class ``0..G-1`` of row ``i`` of ``ch (m, C)``, or -1 when that row is none of
        them (its subtree adds channels).
    ``class_sums(p, cnt, n, out)``
        The channel sums of ``n`` rows, ``cnt[g]`` of class ``g``, into ``out (C,)``: bit
        for bit what adding the rows' channels in any order gives (exact sums).
    ``class_side(p, q2, n)``
        A side's statistic from its rows ``n`` and ``q2`` (integers).
    ``class_gains(p, st, consts, out, row, n)``
        As ``gains``, from ``st (4, >= n)``: per candidate ``i`` the left side's rows (as a
        float) ``st[0, i]`` and ``class_side`` ``st[1, i]``, the right side's ``st[2, i]``
        and ``st[3, i]`` (rows of contiguous numbers, so a branch-free loop vectorises):
        must equal ``gains`` on the candidates' channel sums bit for bit (tests compare).
        Compiled with NumPy's error model (division by zero gives inf, no exception check).

    The scan does not call ``sides_ok`` / ``right_exhausted``, hence the exclusion. Not
    given: ``n_row_classes`` is 0 and the kernels compile to the channel scan alone.

and, as plain numbers on the :class:`CompiledCriterion` it returns from its
``compiled()`` method: ``weight_channel`` (the channel ``node_weight`` reads; growth
uses it for the missing-value direction), ``size_channel`` (the channel ``node_size``
reads, what ``min_samples_split`` compares; the weight channel unless given),
``min_child_rows`` (fewest rows a child can have and pass) and
``n_consts``. Node values stay with the criterion's vectorised ``node_value``: the
growers call it once on all new nodes' sums.

Adding a criterion
------------------
1. A module with its vectorised :class:`forest.criteria.basic.Criterion` (the truth, used by
   the NumPy references), a ``namedtuple`` record class for its parameters, the
   jitted pieces above, and ``register(RecordClass, prepare=..., gains=..., ...)`` at
   import time.
2. ``Criterion.compiled()`` returning ``CompiledCriterion(record, weight_channel,
   min_child_rows, n_consts)``.
3. A test that ``CompiledCriterion.gains_of`` equals ``Criterion.gain`` on random
   channel sums (constraints binding and not), and a ``grow_subtrees`` vs
   ``grow_subtrees_reference`` test (see tests/forest/test_local_growth.py).
Nothing in the growth loops changes.

Why typed dispatch (measured; numba 0.68, loaded 2-core machine)
----------------------------------------------------------------
Three ways to specialise one kernel per criterion were tried on a toy kernel, each
in two fresh processes sharing an empty cache directory:

* closures from a factory (``make_kernel(gain)`` returning an ``njit(cache=True)``
  inner function): the second process compiled again. Numba keys a cached closure
  by a pickle of its cells, and a captured dispatcher pickles with a per-process
  UUID (numba issue 6264), so every process misses and the index grows by one
  entry per run;
* jitted functions passed as arguments (dispatcher-typed arguments): the second
  process compiled again too (the dispatcher type in the signature does not match
  across processes);
* a record class per criterion and ``numba.extending.overload`` resolving the
  pieces by that class at typing time (this module): the second process loaded
  both specialisations from the cache.

A fixed table of criterion "kinds" (the previous design) caches, but compiles every
criterion into every kernel and lets an unknown kind fall through to another
criterion's code; here an unregistered record is a typing error. Cold start: a
model compiles only the specialisations it uses (a causal forest: one pair of its
nuisance forests' variance criterion and its causal one, :class:`PairedRecord`;
boosting: none of the subtree kernels).

Pieces are called, not inlined at Numba's IR level (measured with
benchmarks/bench_cold_pair.py, empty-cache causal first fit). An overload declared
``inline="always"`` is still compiled whole for every signature it meets (Numba's
``get_call_template``), then typed once more to be inlined, and each of its call sites
carries the body through the caller's typing and lowering; an ``inline`` cost-model
callable (once used to inline single criteria and call pairs) also re-types the body
per signature. Called: each piece compiles once per signature, and LLVM still inlines
the small ones into the kernel where that pays, as it links them in. First fit: 0.845x
(inline callable -> one inline overload and one called) then 0.973x (all called), with
the warm fit unchanged (bench_ab, ratio of medians 0.989, the same RMSE).
"""
import inspect
import warnings
from collections import namedtuple
from contextlib import contextmanager

import numpy as np
from numba.core.errors import NumbaIRAssumptionWarning, TypingError
from numba.extending import overload

from histogram.jit import WRAPPERLESS, kernel

_Pieces = namedtuple("_Pieces", ["prepare", "gains", "sides_ok", "right_exhausted", "bin_key", "n_row_classes",
                                 "row_class", "class_sums", "class_side", "class_gains"])

#: Record class -> its pieces (plain Python functions; the overloads below compile each
#: once per signature, with :data:`_PIECE_OPTIONS`).
_REGISTRY = {}


def _py(fn):
    """The Python function of a jitted function: the overloads compile it with their own
    options (:data:`_PIECE_OPTIONS`), so a jitted piece's own options (``parallel``,
    ``inline``, caching) do not apply."""
    return getattr(fn, "py_func", fn)


def _sides_always(p, n_l, n_r, cum, miss, with_miss, parent):
    return True


def _never_exhausted(p, n_r, cum, parent):
    return False


def _code_order_key(p, stats, i, consts):
    return 0.0


def _no_row_classes(p, n):
    return 0


def _no_row_class(p, ch, i):
    return -1


def _no_class_sums(p, cnt, n, out):
    pass


def _no_class_side(p, q2, n):
    return 0.0


def _no_class_gains(p, st, consts, out, row, n):
    pass


def register(record_class, *, prepare, gains, sides_ok=None, right_exhausted=None, bin_key=None,
             n_row_classes=None, row_class=None, class_sums=None, class_side=None, class_gains=None,
             shares_kernels=True):
    """Register a criterion's compiled pieces under its parameter-record class.

    Parameters
    ----------
    record_class : type
        A ``collections.namedtuple`` class defined at module level (Numba types a
        record by its class; caching needs the class importable by name).
    prepare, gains : callable
        Numba-compilable functions (jitted or plain), see the module docstring, with
        the entry points' argument names (Numba's overloads require them).
    sides_ok, right_exhausted, bin_key : callable, optional
    n_row_classes, row_class, class_sums, class_side, class_gains : callable, optional
        All five or none; not with ``sides_ok`` or ``right_exhausted`` (module docstring).
    shares_kernels : bool, default True
        Whether a forest whose main criterion this is may share its kernels' specialisation
        with its nuisance forests (:func:`shared_specialisation`). False where the shared
        kernel was measured to run slower than the criterion's own.
    """
    if not (isinstance(record_class, type) and issubclass(record_class, tuple) and hasattr(record_class, "_fields")):
        raise TypeError(f"record_class must be a namedtuple class, got {record_class!r}")
    classes = (n_row_classes, row_class, class_sums, class_side, class_gains)
    if any(x is not None for x in classes):
        if any(x is None for x in classes):
            raise TypeError(f"{record_class.__name__}: the five row-class pieces go together")
        if sides_ok is not None or right_exhausted is not None:
            raise TypeError(f"{record_class.__name__}: the class-count scan does not call sides_ok or "
                            "right_exhausted; a criterion with row classes cannot give them")
        _ROW_CLASSES.add(record_class)
    else:
        _ROW_CLASSES.discard(record_class)
    pieces = _Pieces(_py(prepare), _py(gains), _py(sides_ok or _sides_always), _py(right_exhausted or _never_exhausted),
                     _py(bin_key or _code_order_key), _py(n_row_classes or _no_row_classes),
                     _py(row_class or _no_row_class), _py(class_sums or _no_class_sums),
                     _py(class_side or _no_class_side), _py(class_gains or _no_class_gains))
    for name, piece in zip(_Pieces._fields, pieces):
        # Here rather than as a typing error deep inside the first kernel compile.
        expected = tuple(inspect.signature(globals()[name]).parameters)
        got = tuple(inspect.signature(piece).parameters)
        if got != expected:
            raise TypeError(f"{record_class.__name__}'s {name} piece {piece.__qualname__} takes {got}; it must take "
                            f"{expected}, the names of {__name__}.{name} (Numba's overloads require them)")
    _REGISTRY[record_class] = pieces
    if not shares_kernels:
        _OWN_KERNELS.add(record_class)


def is_registered(record_class):
    return record_class in _REGISTRY


#: Record classes registered with the row-class pieces.
_ROW_CLASSES = set()


def has_row_classes(record_class):
    """Whether ``record_class`` registered the row-class pieces (module docstring).

    Kernels choose at typing time (by the record's class) whether to compile the
    class-count scan at all (:mod:`forest.engine.local_growth`).
    """
    return record_class in _ROW_CLASSES


def _pieces(p):
    cls = getattr(p, "instance_class", None)
    if cls not in _REGISTRY:
        raise TypingError(f"no compiled criterion is registered for the record type {p} "
                          "(forest.criteria.compiled.register)")
    return _REGISTRY[cls]


# ---------------------------------------------------------------------- generic entry points
# The Python bodies run only outside Numba (tests, debugging); inside a kernel each
# call is replaced by the registered piece of the record's class.
def prepare(p, parent, consts):
    """Node constants of criterion record ``p`` (see the module docstring)."""
    _REGISTRY[type(p)].prepare(p, parent, consts)


def gains(p, lefts, rights, consts, out, row, n):
    """Candidate gains of criterion record ``p`` into ``out[row, :n]``."""
    _REGISTRY[type(p)].gains(p, lefts, rights, consts, out, row, n)


def sides_ok(p, n_l, n_r, cum, miss, with_miss, parent):
    """Row-count feasibility of a candidate (see the module docstring)."""
    return _REGISTRY[type(p)].sides_ok(p, n_l, n_r, cum, miss, with_miss, parent)


def right_exhausted(p, n_r, cum, parent):
    """Whether no later candidate of a scan can pass (see the module docstring)."""
    return _REGISTRY[type(p)].right_exhausted(p, n_r, cum, parent)


def bin_key(p, stats, i, consts):
    """Sort key of the category in row ``i`` of ``stats`` (see the module docstring)."""
    return _REGISTRY[type(p)].bin_key(p, stats, i, consts)


def n_row_classes(p, n):
    """Row classes of criterion record ``p`` for up to ``n`` rows (0: none; module docstring)."""
    return _REGISTRY[type(p)].n_row_classes(p, n)


def row_class(p, ch, i):
    """Class of row ``i`` of ``ch``, or -1 (module docstring)."""
    return _REGISTRY[type(p)].row_class(p, ch, i)


def class_sums(p, cnt, n, out):
    """Channel sums of ``n`` rows with class counts ``cnt`` into ``out`` (module docstring)."""
    _REGISTRY[type(p)].class_sums(p, cnt, n, out)


def class_side(p, q2, n):
    """A side's statistic from its rows and summed squared class counts (module docstring)."""
    return _REGISTRY[type(p)].class_side(p, q2, n)


def class_gains(p, st, consts, out, row, n):
    """Gains from the sides' rows and ``class_side`` in ``st`` into ``out[row, :n]`` (module docstring)."""
    _REGISTRY[type(p)].class_gains(p, st, consts, out, row, n)


#: How Numba compiles a piece behind the overloads: as histogram.jit.compiled_only does,
#: without the Python and C wrappers nothing calls (a compile unit costs less without them).
_PIECE_OPTIONS = WRAPPERLESS


@overload(prepare, jit_options=_PIECE_OPTIONS)
def _ov_prepare(p, parent, consts):
    return _pieces(p).prepare


@overload(gains, jit_options=_PIECE_OPTIONS)
def _ov_gains(p, lefts, rights, consts, out, row, n):
    return _pieces(p).gains


@overload(sides_ok, jit_options=_PIECE_OPTIONS)
def _ov_sides_ok(p, n_l, n_r, cum, miss, with_miss, parent):
    return _pieces(p).sides_ok


@overload(right_exhausted, jit_options=_PIECE_OPTIONS)
def _ov_right_exhausted(p, n_r, cum, parent):
    return _pieces(p).right_exhausted


@overload(bin_key, jit_options=_PIECE_OPTIONS)
def _ov_bin_key(p, stats, i, consts):
    return _pieces(p).bin_key


@overload(n_row_classes, jit_options=_PIECE_OPTIONS)
def _ov_n_row_classes(p, n):
    return _pieces(p).n_row_classes


@overload(row_class, jit_options=_PIECE_OPTIONS)
def _ov_row_class(p, ch, i):
    return _pieces(p).row_class


@overload(class_sums, jit_options=_PIECE_OPTIONS)
def _ov_class_sums(p, cnt, n, out):
    return _pieces(p).class_sums


@overload(class_side, jit_options=_PIECE_OPTIONS)
def _ov_class_side(p, q2, n):
    return _pieces(p).class_side


#: The class gains piece divides for every candidate and masks the failing ones, so it
#: compiles with NumPy's error model (a division by zero gives inf, not an exception
#: check per division): the checks kept LLVM from vectorising the loop.
_CLASS_GAINS_OPTIONS = {**_PIECE_OPTIONS, "error_model": "numpy"}


@overload(class_gains, jit_options=_CLASS_GAINS_OPTIONS)
def _ov_class_gains(p, st, consts, out, row, n):
    return _pieces(p).class_gains


# ---------------------------------------------------------------------- one specialisation for two criteria
# A causal (or instrumental) forest grows its nuisance forests with the variance
# criterion and then its own trees with the causal one: two records, so every
# growth kernel compiled twice on a fresh machine (the subtree kernel, about 12 s
# each on the 2-core dev machine). Behind a PairedRecord both fits call one
# specialisation that holds both criteria's pieces and picks one by ``which`` at run
# time, per node: a branch on a constant, against a whole second compilation.

#: Two criteria's records behind one record type: ``which`` 0 runs ``first``'s
#: pieces, 1 ``second``'s. Numba types it by its members' types, so one pair of
#: criterion classes is one specialisation.
PairedRecord = namedtuple("PairedRecord", ["which", "first", "second"])


def _paired_prepare(p, parent, consts):
    if p.which == 0:
        prepare(p.first, parent, consts)
    else:
        prepare(p.second, parent, consts)


def _paired_gains(p, lefts, rights, consts, out, row, n):
    if p.which == 0:
        gains(p.first, lefts, rights, consts, out, row, n)
    else:
        gains(p.second, lefts, rights, consts, out, row, n)


def _paired_sides_ok(p, n_l, n_r, cum, miss, with_miss, parent):
    ok = True
    if p.which == 0:
        ok = sides_ok(p.first, n_l, n_r, cum, miss, with_miss, parent)
    else:
        ok = sides_ok(p.second, n_l, n_r, cum, miss, with_miss, parent)
    return ok


def _paired_right_exhausted(p, n_r, cum, parent):
    done = False
    if p.which == 0:
        done = right_exhausted(p.first, n_r, cum, parent)
    else:
        done = right_exhausted(p.second, n_r, cum, parent)
    return done


class _Sharing:
    """State of one :func:`shared_specialisation` block."""

    def __init__(self, main):
        self.main = main
        self.helper = None      # record of the first other criterion the block's kernels ran


_SHARING = []

#: Record classes registered with ``shares_kernels=False``.
_OWN_KERNELS = set()


@contextmanager
def shared_specialisation(main):
    """Kernels called inside this block for ``main`` and one other criterion share a specialisation.

    Inside the block, :func:`kernel_record` gives a kernel call for any other
    criterion a :class:`PairedRecord` ``(0, its record, main's record)`` and, once
    such a call has happened, a call for ``main`` ``(1, that record, main's
    record)``: both compile into one kernel. Results are unchanged (the same pieces
    run); only what Numba compiles changes. With no other criterion used in the
    block (nuisance estimates given), ``main`` runs on its own record.

    Parameters
    ----------
    main : CompiledCriterion
        The block's main criterion (a causal forest's), built before its helpers run.
        A main criterion registered with ``shares_kernels=False`` shares nothing: inside
        the block every criterion runs on its own record, as outside it.
    """
    if type(main.record) in _OWN_KERNELS:
        yield
        return
    _SHARING.append(_Sharing(main))
    try:
        yield
    finally:
        _SHARING.pop()


def kernel_record(compiled):
    """The record a growth kernel is called with for ``compiled`` (see :func:`shared_specialisation`).

    Parameters
    ----------
    compiled : CompiledCriterion

    Returns
    -------
    namedtuple
        ``compiled.record``, or a :class:`PairedRecord` holding it.
    """
    if not _SHARING:
        return compiled.record
    sharing = _SHARING[-1]
    main = sharing.main.record
    record = compiled.record
    if type(record) is type(main):
        if record == main:
            return record if sharing.helper is None else PairedRecord(1, sharing.helper, record)
        return record
    if sharing.helper is None or type(sharing.helper) is not type(record):
        sharing.helper = record
    return PairedRecord(0, record, main)


def call_kernel(kernel, *args):
    """Call a growth kernel that takes a criterion record.

    The first call compiles it, and Numba's SSA pass may then warn "variable ... is
    not in scope" for a variable that a function inlined at Numba's IR level
    (``inline="always"``) assigns twice: a pedantic check of its own IR bookkeeping
    (numba issues 7802, 9489, Python 3.11), not a fault in the code. The criterion
    pieces themselves are no longer inlined that way (module docstring), but the
    kernels still inline small helpers. Only that message is hidden, only here.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"variable '.*' is not in scope",
                                category=NumbaIRAssumptionWarning)
        return kernel(*args)


def _paired_bin_key(p, stats, i, consts):
    key = 0.0
    if p.which == 0:
        key = bin_key(p.first, stats, i, consts)
    else:
        key = bin_key(p.second, stats, i, consts)
    return key


register(PairedRecord, prepare=_paired_prepare, gains=_paired_gains, sides_ok=_paired_sides_ok,
         right_exhausted=_paired_right_exhausted, bin_key=_paired_bin_key)


@kernel
def _eval_gains(p, lefts, rights, parent, consts, out):
    prepare(p, parent, consts)
    gains(p, lefts, rights, consts, out, 0, lefts.shape[0])


@kernel
def _eval_keys(p, stats, parent, consts, out):
    # stats (N, B, C), parent (N, C): keys of every bin of every node, empty or not.
    for n in range(stats.shape[0]):
        prepare(p, parent[n], consts)
        for b in range(stats.shape[1]):
            out[n, b] = bin_key(p, stats[n], b, consts)


class CompiledCriterion:
    """What a criterion's ``compiled()`` returns: its record and growth constants.

    Parameters
    ----------
    record : namedtuple
        Parameters of the criterion, an instance of a class passed to :func:`register`.
    weight_channel : int
        The channel ``node_weight`` returns (the missing-value direction's heavier child).
    min_child_rows : int
        Fewest rows a child can have and pass the constraints (``gains`` is ``-inf``
        below it), so candidates with fewer need not be scored; at least 1.
    n_consts : int
        Length of the node-constant array ``prepare`` fills.
    size_channel : int, optional
        The channel ``node_size`` returns (what ``min_samples_split`` compares); defaults
        to ``weight_channel``.
    """

    def __init__(self, record, weight_channel, min_child_rows=1, n_consts=8, size_channel=None):
        if not is_registered(type(record)):
            raise TypeError(f"{type(record).__name__} is not a registered criterion record "
                            "(forest.criteria.compiled.register)")
        self.record = record
        self.weight_channel = int(weight_channel)
        self.size_channel = self.weight_channel if size_channel is None else int(size_channel)
        self.min_child_rows = max(int(min_child_rows), 1)
        self.n_consts = max(int(n_consts), 1)

    def gains_of(self, lefts, rights, parent):
        """Compiled gains of candidate splits of one node (for tests and checks).

        Parameters
        ----------
        lefts, rights : array-like, shape (k, C)
        parent : array-like, shape (C,)

        Returns
        -------
        ndarray of float64, shape (k,)
        """
        lefts = np.ascontiguousarray(np.atleast_2d(lefts), dtype=np.float64)
        rights = np.ascontiguousarray(np.atleast_2d(rights), dtype=np.float64)
        out = np.empty((1, lefts.shape[0]))
        call_kernel(_eval_gains, self.record, lefts, rights, np.ascontiguousarray(parent, dtype=np.float64),
                    np.zeros(self.n_consts), out)
        return out[0]

    def keys_of(self, stats, parent):
        """Compiled category sort keys (the ``bin_key`` piece) of every bin of every node.

        Parameters
        ----------
        stats : array-like, shape (N, B, C)
            Per-category channel sums of each node.
        parent : array-like, shape (N, C)
            The nodes' channel sums.

        Returns
        -------
        ndarray of float64, shape (N, B)
        """
        stats = np.ascontiguousarray(stats, dtype=np.float64)
        out = np.empty(stats.shape[:2])
        call_kernel(_eval_keys, self.record, stats, np.ascontiguousarray(parent, dtype=np.float64),
                    np.zeros(self.n_consts), out)
        return out

    def __call__(self, left, right, parent):
        """Gain of one candidate from NumPy vectors."""
        return float(self.gains_of(left, right, parent)[0])

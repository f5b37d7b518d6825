"""How histforest compiles its Numba code: one home for the decorators and array constructors.

Every jitted function of forest/ and histogram/ is declared through this module (the
lazily built ``vectorize`` ufuncs of the NumPy split search and the low-level
``intrinsic`` / ``overload`` definitions excepted), so the options that decide how
long a first fit spends compiling live in one place (issue 11's cold start: a fresh
machine compiled about a hundred units before the first causal fit, each with a
fixed cost whatever its body). What each choice saves was
measured on the empty-cache causal fit of ``benchmarks/bench_cold_start.py`` (see
RESULTS.md, "Cold start"):

* :func:`kernel` compiles without the C-callable (``cfunc``) wrapper that Numba
  builds for every function by default. Nothing here takes a kernel's address, and
  the wrapper is a second function per compile unit for LLVM to optimise and emit.
* :func:`compiled_only` is for helpers that only other compiled code calls (the
  split-candidate scans, the criterion pieces, the sort inside mtry): no Python
  wrapper either. Such a function cannot be called from Python through Numba's own
  dispatcher (its entry point would be missing, and the call would crash the
  interpreter), so a Python call is served by a twin compiled with wrappers, under
  its own cache entry; the tests call helpers that way. :func:`python_twins` lists
  the twins a process built: the library itself must never need one (tested).
* :func:`empty` and :func:`zeros` allocate arrays inside compiled code. NumPy's
  ``np.empty`` / ``np.zeros`` are Numba overloads compiled as a separate function
  per (shape type, dtype, caller's flags), about forty units in a causal fit; these
  are lowered in place at each call site (Numba's own allocation routine): no unit
  per signature (Numba's allocator call compiles once per process). :func:`arange`
  is built on them. Callable only from compiled code.
"""
import threading
import types as _pytypes

import numba
import numpy as np
from numba.core import cgutils, types
from numba.core.errors import TypingError
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic
from numba.np.arrayobj import _empty_nd_impl, _parse_shape

#: Options shared by every compiled function: on-disk caching (histogram._jit_cache
#: keys the directory by the package sources) and no C-callable wrapper.
_COMMON = {"cache": True, "no_cfunc_wrapper": True}

#: Options of a function only compiled code calls: neither the Python nor the C wrapper
#: (:func:`compiled_only`; forest.criteria.compiled compiles criterion pieces with them).
WRAPPERLESS = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}

#: Names of the compiled-only helpers that were called from Python in this process.
_TWINS = []
_TWIN_LOCK = threading.Lock()


def kernel(func=None, *, parallel=False, inline="never"):
    """Decorate a function compiled by Numba and callable from Python.

    Parameters
    ----------
    func : callable, optional
        The function (``@kernel``), or None for ``@kernel(parallel=True)``.
    parallel : bool
        Numba's ``parallel`` (``prange`` loops run on its thread pool).
    inline : {"never", "always"}
        Numba's ``inline``: "always" inlines the body into compiled callers at
        Numba's IR level (for small functions on hot paths).

    Returns
    -------
    numba dispatcher, or a decorator when ``func`` is None.
    """
    decorate = numba.njit(parallel=parallel, inline=inline, **_COMMON)
    return decorate if func is None else decorate(func)


class _CompiledOnlyDispatcher(CPUDispatcher):
    """A dispatcher whose compilations carry no Python or C wrapper.

    Compiled callers reach it through Numba's typing (``self.overloads``); the C
    dispatcher's own table stays empty (``add_overload`` does not fill it), so a
    call from Python always lands in ``_compile_for_args``, which hands back the
    wrapped twin for the C dispatcher to call.
    """

    _python_twin = None

    def add_overload(self, cres):
        self.overloads[tuple(cres.signature.args)] = cres

    def _compile_for_args(self, *args, **kwargs):
        with _TWIN_LOCK:  # one twin even when threads make their first Python calls together
            if self._python_twin is None:
                self._python_twin = self._make_twin()
        return self._python_twin

    def _make_twin(self):
        func = self.py_func
        twin = _pytypes.FunctionType(func.__code__, func.__globals__, func.__name__, func.__defaults__,
                                     func.__closure__)
        # Its own name, hence its own cache entry: the helper's entries have no
        # Python entry point, and loading one here would crash the call.
        twin.__qualname__ = func.__qualname__ + "__python_twin"
        twin.__module__ = func.__module__
        twin.__doc__ = func.__doc__
        _TWINS.append(f"{func.__module__}.{func.__qualname__}")
        return kernel(twin)


def compiled_only(func=None, *, inline="never"):
    """Decorate a helper that compiled code calls (no Python or C wrapper).

    Parameters
    ----------
    func : callable, optional
        The function (``@compiled_only``), or None for ``@compiled_only(...)``.
    inline : {"never", "always"}
        Numba's ``inline`` option.

    Returns
    -------
    numba dispatcher, or a decorator when ``func`` is None.

    Notes
    -----
    Python may still call it (tests do), through a twin compiled on first such
    call; see the module docstring.
    """
    def decorate(f):
        options = {"nopython": True, "inline": inline, **WRAPPERLESS}
        dispatcher = _CompiledOnlyDispatcher(f, locals={}, targetoptions=options)
        dispatcher.enable_caching()
        return dispatcher
    return decorate if func is None else decorate(func)


def python_twins():
    """Names of the compiled-only helpers that Python has called in this process.

    Returns
    -------
    list of str
        ``module.qualname`` per helper, in the order of their first Python call.
    """
    return list(_TWINS)


def _element_type(dtype):
    """Numba element type named by a dtype argument's type, or None."""
    if isinstance(dtype, types.NumberClass):
        return dtype.instance_type
    if isinstance(dtype, types.DType):
        return dtype.dtype
    if isinstance(dtype, types.Function):  # Python's float / int / bool, as NumPy reads them
        return {float: types.float64, int: types.intp, bool: types.boolean}.get(dtype.typing_key)
    return None


def _array_type(shape, dtype, constructor):
    element = _element_type(dtype)
    if isinstance(shape, types.Integer):
        ndim = 1
    elif isinstance(shape, types.BaseTuple) and all(isinstance(s, types.Integer) for s in shape):
        ndim = len(shape)
    else:
        ndim = None
    if element is None or ndim is None:
        raise TypingError(f"{constructor}(shape, dtype) takes an integer or a tuple of integers and a NumPy "
                          f"scalar type or dtype, got ({shape}, {dtype})")
    return types.Array(element, ndim, "C")


def _allocate(context, builder, sig, args):
    array_type = sig.return_type
    dims = _parse_shape(context, builder, sig.args[0], args[0])
    return _empty_nd_impl(context, builder, array_type, dims)


@intrinsic
def empty(typingctx, shape, dtype):
    """``np.empty(shape, dtype)`` inside compiled code, lowered at the call site.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : NumPy scalar type or dtype (``np.float64``, ``np.uint8``, ``a.dtype``)

    Returns
    -------
    ndarray of dtype, C order, uninitialised.
    """
    array_type = _array_type(shape, dtype, "empty")

    def codegen(context, builder, sig, args):
        return _allocate(context, builder, sig, args)._getvalue()
    return array_type(shape, dtype), codegen


@intrinsic
def zeros(typingctx, shape, dtype):
    """``np.zeros(shape, dtype)`` inside compiled code, lowered at the call site.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : NumPy scalar type or dtype

    Returns
    -------
    ndarray of dtype, C order, every byte zero.
    """
    array_type = _array_type(shape, dtype, "zeros")

    def codegen(context, builder, sig, args):
        array = _allocate(context, builder, sig, args)
        cgutils.memset(builder, array.data, builder.mul(array.itemsize, array.nitems), 0)
        return array._getvalue()
    return array_type(shape, dtype), codegen


@kernel(inline="always")
def arange(n):
    """``np.arange(n)`` (int64) inside compiled code, built from :func:`empty` and a loop.

    Inlined into its callers at Numba's IR level: NumPy's ``np.arange`` is another
    overload compiled per signature and caller flags.

    Parameters
    ----------
    n : int
        At least 0 (NumPy's ``np.arange`` gives an empty array below; this raises
        ``ValueError``, as :func:`empty` does for a negative dimension).

    Returns
    -------
    ndarray of int64, shape (n,)
    """
    out = empty(n, np.int64)
    for i in range(n):
        out[i] = i
    return out


__all__ = ["kernel", "compiled_only", "python_twins", "empty", "zeros", "arange", "WRAPPERLESS"]

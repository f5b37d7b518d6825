"""Boosting losses: baselines, gradient/hessian channels and loss values.

This module owns the per-row mathematics of gradient boosting on raw scores
``raw`` of shape ``(n, K)``:

* :class:`SquaredError` (regression, ``K = 1``): loss ``w (y - raw)^2 / 2``,
  gradient ``w (raw - y)``, hessian ``w``, baseline the weighted mean of ``y``;
* :class:`LogLoss` (binary, ``K = 1``): ``p = sigmoid(raw)``, gradient ``w (p - y)``,
  hessian ``w p (1 - p)``, baseline the log-odds of the weighted mean;
* :class:`SoftmaxLoss` (``K`` classes, one vector-leaf tree per iteration):
  ``p = softmax(raw)``, gradient ``w (p_k - [y = k])``, hessian ``w p_k (1 - p_k)``
  (the diagonal of the softmax Hessian, as scikit-learn uses), baseline the log of
  the weighted class priors.

Gradients are written straight into the ``(n, 2K)`` channel layout of
:class:`forest.criteria.basic.NewtonCriterion` by Numba kernels parallel over rows.
Baselines and loss sums are *local* sums here; the estimator reduces them over
ranks, so they are rank-count independent.
"""
import numba
import numpy as np

from histogram.jit import kernel

_EPS = 1e-15


# Row-range kernels [a, b) plus one parallel driver over row chunks; small inputs
# run serially because starting the thread pool costs more than the loop.
_PARALLEL_MIN_ROWS = 16384


@kernel
def _squared_grad(y, raw, w, out, a, b):
    for ii in range(a, b):
        i = np.uint64(ii)  # unsigned: no negative-index wraparound (forest.engine.partition)
        out[i, 0] = w[i] * (raw[i, 0] - y[i])
        out[i, 1] = w[i]


@kernel
def _logistic_grad(y, raw, w, out, a, b):
    for ii in range(a, b):
        i = np.uint64(ii)
        p = 1.0 / (1.0 + np.exp(-raw[i, 0]))
        out[i, 0] = w[i] * (p - y[i])
        out[i, 1] = w[i] * p * (1.0 - p)


@kernel
def _softmax_grad(y, raw, w, out, a, b):
    k = raw.shape[1]
    for i in range(a, b):
        m = raw[i, 0]
        for j in range(1, k):
            if raw[i, j] > m:
                m = raw[i, j]
        s = 0.0
        for j in range(k):
            s += np.exp(raw[i, j] - m)
        for j in range(k):
            p = np.exp(raw[i, j] - m) / s
            out[i, j] = w[i] * (p - (1.0 if y[i] == j else 0.0))
            out[i, k + j] = w[i] * p * (1.0 - p)


@kernel(parallel=True)
def _par_grad(kind, y, raw, w, out, n_chunks):
    n = y.shape[0]
    chunk = (n + n_chunks - 1) // n_chunks
    for c in numba.prange(n_chunks):
        a = c * chunk
        b = min(n, a + chunk)
        if kind == 0:
            _squared_grad(y, raw, w, out, a, b)
        elif kind == 1:
            _logistic_grad(y, raw, w, out, a, b)
        else:
            _softmax_grad(y, raw, w, out, a, b)


_KERNELS = (_squared_grad, _logistic_grad, _softmax_grad)


def _gradients(kind, y, raw, w, out):
    y = np.ascontiguousarray(y, dtype=np.float64)
    raw = np.ascontiguousarray(raw, dtype=np.float64)
    w = np.ascontiguousarray(w, dtype=np.float64)
    if out.shape != (raw.shape[0], 2 * raw.shape[1]) or not out.flags.c_contiguous:
        raise ValueError(f"out must be C-contiguous of shape {(raw.shape[0], 2 * raw.shape[1])}, got {out.shape}")
    threads = numba.get_num_threads()
    if len(y) < _PARALLEL_MIN_ROWS or threads == 1:
        _KERNELS[kind](y, raw, w, out, 0, len(y))
    else:
        _par_grad(kind, y, raw, w, out, 4 * threads)
    return out


def _dot(a, b):
    """``sum(a * b)`` by NumPy's pairwise sum, not BLAS.

    ``np.dot`` of two long vectors goes to BLAS, whose result depends on its thread
    count (so a baseline would differ between machines) and whose threaded dot leaves a
    worker spinning for ~0.1 s after the call, on the core the fit's Numba threads are
    about to use (histogram._thread_wait: a 50,000-row boosting fit ran 1.7x slower).
    """
    return np.sum(np.multiply(a, b))


def _sigmoid(x):
    return np.where(x >= 0, 1.0 / (1.0 + np.exp(-np.abs(x))), np.exp(-np.abs(x)) / (1.0 + np.exp(-np.abs(x))))


def _log_softmax(raw):
    m = raw.max(axis=1, keepdims=True)
    # Scores of opposite sign near float64's limit overflow to -inf here, which is the
    # right limit (probability 0), so the overflow is not worth a warning.
    with np.errstate(over="ignore"):
        z = raw - m
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


class Loss:
    """Interface of a boosting loss.

    Attributes
    ----------
    n_outputs : int
        ``K``, the columns of ``raw``.
    """

    n_outputs = 1

    def baseline_sums(self, y, w):
        """Local sums the baseline is computed from (reduced over ranks by the caller).

        Returns
        -------
        ndarray of float64, shape (k,)
        """
        raise NotImplementedError

    def baseline_terms(self, y, w):
        """Per-row terms whose column sums are :meth:`baseline_sums` (for exact sums).

        Returns
        -------
        ndarray of float64, shape (n, k)
        """
        raise NotImplementedError

    def baseline(self, sums):
        """Baseline raw score from the global sums.

        Returns
        -------
        ndarray of float64, shape (K,)
        """
        raise NotImplementedError

    def gradients(self, y, raw, w, out):
        """Write ``[g_0..g_{K-1}, h_0..h_{K-1}]`` per row into ``out`` (n, 2K)."""
        raise NotImplementedError

    def loss_sum(self, y, raw, w):
        """Sum of the weighted per-row losses (local)."""
        raise NotImplementedError


class SquaredError(Loss):
    """Half squared error; see the module docstring."""

    n_outputs = 1

    def baseline_sums(self, y, w):
        return np.array([_dot(w, y), w.sum()])

    def baseline_terms(self, y, w):
        return np.stack([w * y, w], axis=1)

    def baseline(self, sums):
        return np.array([sums[0] / sums[1] if sums[1] > 0 else 0.0])

    def gradients(self, y, raw, w, out):
        return _gradients(0, y, raw, w, out)

    def loss_sum(self, y, raw, w):
        return float(0.5 * _dot(w, (y - raw[:, 0]) ** 2))


class LogLoss(Loss):
    """Binary cross-entropy on ``y in {0, 1}``; see the module docstring."""

    n_outputs = 1

    def baseline_sums(self, y, w):
        return np.array([_dot(w, y), w.sum()])

    def baseline_terms(self, y, w):
        return np.stack([w * y, w], axis=1)

    def baseline(self, sums):
        p = sums[0] / sums[1] if sums[1] > 0 else 0.5
        p = min(max(p, _EPS), 1.0 - _EPS)
        return np.array([np.log(p / (1.0 - p))])

    def gradients(self, y, raw, w, out):
        return _gradients(1, y, raw, w, out)

    def loss_sum(self, y, raw, w):
        r = raw[:, 0]
        # log(1 + exp(r)) - y r, computed without overflow
        return float(_dot(w, np.logaddexp(0.0, r) - y * r))

    @staticmethod
    def proba(raw):
        p1 = _sigmoid(raw[:, 0])
        return np.stack([1.0 - p1, p1], axis=1)


class SoftmaxLoss(Loss):
    """Multinomial cross-entropy on ``y in {0..K-1}``; see the module docstring."""

    def __init__(self, n_classes):
        if n_classes < 3:
            raise ValueError(f"SoftmaxLoss needs >= 3 classes, got {n_classes}")
        self.n_outputs = int(n_classes)

    def baseline_sums(self, y, w):
        return np.bincount(y.astype(np.int64), weights=w, minlength=self.n_outputs).astype(np.float64)

    def baseline_terms(self, y, w):
        out = np.zeros((len(y), self.n_outputs))
        out[np.arange(len(y)), y.astype(np.int64)] = w
        return out

    def baseline(self, sums):
        total = sums.sum()
        p = sums / total if total > 0 else np.full(self.n_outputs, 1.0 / self.n_outputs)
        return np.log(np.clip(p, _EPS, 1.0))

    def gradients(self, y, raw, w, out):
        return _gradients(2, y, raw, w, out)

    def loss_sum(self, y, raw, w):
        logp = _log_softmax(raw)
        return float(-_dot(w, logp[np.arange(len(y)), y.astype(np.int64)]))

    @staticmethod
    def proba(raw):
        return np.exp(_log_softmax(raw))

"""grf's local linear splitting rule (``ll_regression_forest(enable.ll.split = TRUE)``) on histograms.

grf's rule, per node of a tree (its structure rows): fit a ridge regression of the
outcome on ``z = [1, x_S]`` (the split variables ``S``, raw values) over the node's
rows, replace each outcome by its residual, and split those residuals by the
regression forest's variance rule. Below ``ll_split_cutoff`` rows a node does not fit
its own ridge: the residuals are those of the ridge fitted once on the whole data
(grf's ``overall.beta``). The penalty leaves the intercept alone and adds, to each
other diagonal entry of ``M = sum_i w_i z_i z_i^T``, either ``lambda * trace(M) /
(|S| + 1)`` (grf's default) or ``lambda * M_jj`` (``weight_penalty``, grf's
``ll.split.weight.penalty``).

The residuals depend on the node, so no per-row channel can hold them; but a side's
residual sum is linear in channel sums, ``S_r = S_y - S_z^T beta`` for the node's
``beta``, and ``beta`` solves ``(M + penalty) beta = sum_i w_i z_i y_i``, which is a
function of the node's sums too. So the channels are plain sums and the histograms
stay subtractable:

    ``[w, w y, w x_j (j in S), w x_j y (j in S), w x_j x_l (j <= l in S), w r, 1]``

(``r`` the residual of the whole-data ridge; ``1`` counts rows). ``prepare`` builds the
node's ``(|S| + 1)``-square system from the node's sums and solves it (a Cholesky
factorisation; a pivot that vanishes, a variable constant in the node with ``lambda =
0``, drops that variable, which leaves the fitted values, hence the residuals, those
of any least-squares solution), or, below the cutoff, marks the node to read the
``w r`` channel. ``gains`` is the variance gain of the residual sums under the same
size and balance rules as :class:`forest.criteria.basic.VarianceCriterion` (count
channel), ``bin_key`` a category's mean residual, and the node values are the
outcome's weighted means (the leaves of an ll forest are those of a regression forest;
grf applies the local linear correction at prediction).

The residual sum of the parent is zero up to rounding (the intercept is not
penalised), so the gain is ``S_rL^2 / W_L + S_rR^2 / W_R``, computed with the
parent's term as the variance rule does. The width grows as ``|S|^2 / 2``: 5
variables take 28 channels (the variance rule 3), 10 take 78.

Sample weights (grf's ll forest takes none) weigh every sum; with unit weights the
rule is grf's.

Where this is not grf's code (read in grf's sources, ``ll_regression_forest.R``, the
R bindings and ``LLRegressionRelabelingStrategy``): grf's R wrapper passes
``ll.split.variables`` to the C++ core as R's 1-based indices (``1:ncol(X)`` by default)
and the core reads them 0-based, without the ``- 1`` its prediction path applies to
``linear.correction.variables``. grf's node ridges are thus on columns 2..p and the
outcome column (the training matrix is ``[X, Y]``), and its ``overall.beta`` (fitted on
all of ``X``) is applied to those shifted columns. This module fits the documented ridge
on the named variables. grf's tests that depend on the shift hold here in direction only
(tests/forest/test_ll_split.py, benchmarks/RESULTS.md, "Local linear splits"). grf's
whole-data fit fails on collinear columns (grf issue 1228); the pivot rule here drops them. :class:`LocalLinearSplitCriterion` is the truth (NumPy, any leading
shape), the compiled pieces below follow it operation for operation.
"""
from collections import namedtuple

import numpy as np

from histogram.jit import compiled_only

from forest.criteria.basic import VarianceCriterion
from forest.criteria.compiled import CompiledCriterion, register

#: A Cholesky pivot at most this fraction of its (penalised) diagonal entry drops the
#: variable (see the module docstring).
DROP_TOL = 1e-10


def channel_layout(n_vars):
    """Channel offsets of ``n_vars`` split variables.

    Returns
    -------
    dict
        ``x``, ``xy``, ``xx`` (first channel of each group), ``r`` (the whole-data
        residual) and ``n_channels``.
    """
    p = int(n_vars)
    q = p * (p + 1) // 2
    return {"x": 2, "xy": 2 + p, "xx": 2 + 2 * p, "r": 2 + 2 * p + q, "n_channels": 4 + 2 * p + q}


def pair_index(j, l, p):
    """Position of ``x_j x_l`` (``j <= l``) among the ``xx`` channels (upper triangle, row-major)."""
    return j * p - j * (j - 1) // 2 + (l - j)


def ridge_system(sums, n_vars):
    """``(M, b)`` of the weighted least squares of ``y`` on ``[1, x_S]`` from channel sums.

    Parameters
    ----------
    sums : ndarray of float64, shape (..., C)
    n_vars : int

    Returns
    -------
    M : ndarray, shape (..., k, k)
    b : ndarray, shape (..., k)
        ``k = n_vars + 1``; no penalty added.
    """
    sums = np.asarray(sums, dtype=np.float64)
    p = int(n_vars)
    lay = channel_layout(p)
    k = p + 1
    M = np.empty(sums.shape[:-1] + (k, k))
    b = np.empty(sums.shape[:-1] + (k,))
    M[..., 0, 0] = sums[..., 0]
    b[..., 0] = sums[..., 1]
    for j in range(p):
        M[..., 0, j + 1] = M[..., j + 1, 0] = sums[..., lay["x"] + j]
        b[..., j + 1] = sums[..., lay["xy"] + j]
        for l in range(j, p):
            M[..., j + 1, l + 1] = M[..., l + 1, j + 1] = sums[..., lay["xx"] + pair_index(j, l, p)]
    return M, b


def node_penalty(M, ll_lambda, weight_penalty):
    """``M`` with grf's splitting penalty on every diagonal entry but the intercept's (a copy)."""
    A = np.array(M, dtype=np.float64)
    k = A.shape[-1]
    if weight_penalty:
        for j in range(1, k):
            A[..., j, j] = A[..., j, j] + ll_lambda * A[..., j, j]
    else:
        trace = A[..., 0, 0]
        for j in range(1, k):
            trace = trace + A[..., j, j]
        norm = trace / k
        for j in range(1, k):
            A[..., j, j] = A[..., j, j] + ll_lambda * norm
    return A


def solve_dropping(A, b):
    """Solve ``A x = b`` (``A`` symmetric positive semi-definite) by Cholesky, dropping vanishing pivots.

    The NumPy statement of the compiled solve in ``prepare`` (same operations in the same
    order). A pivot ``d_j <= DROP_TOL * A_jj`` (or not positive) sets ``x_j = 0`` and
    factorises the rest as if variable ``j`` were absent.

    Parameters
    ----------
    A : ndarray, shape (..., k, k)
    b : ndarray, shape (..., k)

    Returns
    -------
    ndarray, shape (..., k)
    """
    A = np.asarray(A, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    shape = np.broadcast_shapes(A.shape[:-2], b.shape[:-1])
    k = A.shape[-1]
    L = np.zeros(shape + (k, k))
    Ab = np.broadcast_to(A, shape + (k, k))
    for j in range(k):
        ajj = Ab[..., j, j]
        d = ajj
        for m in range(j):
            d = d - L[..., j, m] * L[..., j, m]
        keep = d > DROP_TOL * ajj
        s = np.sqrt(np.where(keep, d, 1.0))
        L[..., j, j] = np.where(keep, s, 0.0)
        for i in range(j + 1, k):
            v = Ab[..., i, j]
            for m in range(j):
                v = v - L[..., i, m] * L[..., j, m]
            L[..., i, j] = np.where(keep, v / s, 0.0)
    u = np.zeros(shape + (k,))
    bb = np.broadcast_to(b, shape + (k,))
    for j in range(k):
        s = L[..., j, j]
        v = bb[..., j]
        for m in range(j):
            v = v - L[..., j, m] * u[..., m]
        u[..., j] = np.where(s != 0.0, v / np.where(s != 0.0, s, 1.0), 0.0)
    x = np.zeros(shape + (k,))
    for j in range(k - 1, -1, -1):
        s = L[..., j, j]
        v = u[..., j]
        for m in range(j + 1, k):
            v = v - L[..., m, j] * x[..., m]
        x[..., j] = np.where(s != 0.0, v / np.where(s != 0.0, s, 1.0), 0.0)
    return x


def overall_beta(sums, n_vars, ll_lambda):
    """grf's ``overall.beta`` from the whole data's channel sums: ``(D^T D + lambda J)^-1 D^T y``.

    ``D = [1, x_S]``, ``J`` the identity without its intercept entry: the raw ``lambda``
    (grf's whole-data fit is not normalised by the trace, unlike its node fits).

    Parameters
    ----------
    sums : ndarray of float64, shape (C,) or at least the first ``C - 2`` channels
    n_vars : int
    ll_lambda : float

    Returns
    -------
    ndarray of float64, shape (n_vars + 1,)
    """
    M, b = ridge_system(sums, n_vars)
    for j in range(1, n_vars + 1):
        M[j, j] += ll_lambda
    return solve_dropping(M, b)


class LocalLinearSplitCriterion(VarianceCriterion):
    """Variance reduction of ridge residuals (grf's ``enable.ll.split``; see the module docstring).

    Node values, weights, sizes and objectives are :class:`VarianceCriterion`'s on the
    outcome channel (one target, count channel).

    Parameters
    ----------
    n_vars : int
        ``|S|``, the split variables (at least 1).
    ll_lambda : float, default 0.1
        grf's ``ll.split.lambda``.
    weight_penalty : bool, default False
        grf's ``ll.split.weight.penalty``.
    cutoff : int, default 0
        grf's ``ll.split.cutoff``: nodes of fewer rows use the whole-data residuals
        (the ``w r`` channel); 0 fits every node's own ridge.
    min_samples_leaf, min_weight_leaf, alpha, imbalance_penalty
        As :class:`VarianceCriterion` (rows of the count channel).
    """

    def __init__(self, n_vars, ll_lambda=0.1, weight_penalty=False, cutoff=0, min_samples_leaf=1,
                 min_weight_leaf=0.0, alpha=0.0, imbalance_penalty=0.0):
        super().__init__(1, min_samples_leaf=min_samples_leaf, min_weight_leaf=min_weight_leaf, count_channel=True,
                         alpha=alpha, imbalance_penalty=imbalance_penalty)
        if int(n_vars) < 1:
            raise ValueError(f"local linear splits need at least one split variable, got {n_vars}")
        if not (np.isfinite(ll_lambda) and ll_lambda >= 0):
            raise ValueError(f"ll_split_lambda must be a finite number >= 0, got {ll_lambda!r}")
        if int(cutoff) < 0:
            raise ValueError(f"ll_split_cutoff must be >= 0, got {cutoff}")
        self.n_vars = int(n_vars)
        self.ll_lambda = float(ll_lambda)
        self.weight_penalty = bool(weight_penalty)
        self.cutoff = int(cutoff)
        self.layout = channel_layout(self.n_vars)
        self.n_channels = self.layout["n_channels"]

    def make_channels(self, y, Z, sample_weight=None, residual=None):
        """Channels ``(n, C)`` of outcomes ``y (n,)``, split variables ``Z (n, |S|)`` and the whole-data
        residuals ``residual (n,)`` (zeros when None: a cutoff of 0 never reads them)."""
        y = np.asarray(y, dtype=np.float64).reshape(-1)
        Z = np.asarray(Z, dtype=np.float64).reshape(len(y), self.n_vars)
        w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        p, lay = self.n_vars, self.layout
        out = np.empty((len(y), self.n_channels))
        out[:, 0] = w
        out[:, 1] = w * y
        wz = w[:, None] * Z
        out[:, lay["x"]:lay["x"] + p] = wz
        out[:, lay["xy"]:lay["xy"] + p] = wz * y[:, None]
        for j in range(p):
            for l in range(j, p):
                out[:, lay["xx"] + pair_index(j, l, p)] = wz[:, j] * Z[:, l]
        out[:, lay["r"]] = 0.0 if residual is None else w * np.asarray(residual, dtype=np.float64)
        out[:, -1] = 1.0
        return out

    def node_fit(self, parent):
        """``(beta (..., k), uses_node_fit (...))`` of nodes with sums ``parent (..., C)``."""
        parent = np.asarray(parent, dtype=np.float64)
        key = parent.tobytes() if parent.ndim == 1 else None
        last = getattr(self, "_last_fit", None)
        if key is not None and last is not None and last[0] == key:
            return last[1]          # the reference growers score one node's candidates one by one
        M, b = ridge_system(parent, self.n_vars)
        beta = solve_dropping(node_penalty(M, self.ll_lambda, self.weight_penalty), b)
        fit = beta, ~(parent[..., -1] < self.cutoff)
        if key is not None:
            self._last_fit = (key, fit)
        return fit

    def residual_sums(self, stats, beta, node):
        """Residual sums of ``stats (..., C)`` under the node fit ``(beta, node)`` of :meth:`node_fit`."""
        stats = np.asarray(stats, dtype=np.float64)
        r = stats[..., 1] - beta[..., 0] * stats[..., 0]
        for j in range(self.n_vars):
            r = r - beta[..., 1 + j] * stats[..., self.layout["x"] + j]
        return np.where(node, r, stats[..., self.layout["r"]])

    @staticmethod
    def _residual_score(r, w):
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(w > 0, r * r / np.where(w > 0, w, 1.0), 0.0)

    def gain(self, left, right, parent, parent_count=None):
        left = np.asarray(left, dtype=np.float64)
        right = np.asarray(right, dtype=np.float64)
        parent = np.asarray(parent, dtype=np.float64)
        beta, node = self.node_fit(parent)
        g = (self._residual_score(self.residual_sums(left, beta, node), left[..., 0])
             + self._residual_score(self.residual_sums(right, beta, node), right[..., 0])
             - self._residual_score(self.residual_sums(parent, beta, node), parent[..., 0]))
        wl, wr = left[..., 0], right[..., 0]
        ok = (wl > 0) & (wr > 0) & (wl >= self.min_weight_leaf) & (wr >= self.min_weight_leaf)
        cl, cr = left[..., -1], right[..., -1]
        least = self.min_child_size(parent)
        ok &= (cl >= least) & (cr >= least)
        if self.imbalance_penalty > 0:
            with np.errstate(divide="ignore"):
                g = g - self.imbalance_penalty * (1.0 / cl + 1.0 / cr)
        return np.where(ok, g, -np.inf)

    def compiled(self):
        record = LLSplitRecord(self.n_vars, float(self.min_samples_leaf), self.min_weight_leaf, self.alpha,
                               self.imbalance_penalty, self.ll_lambda, self.weight_penalty, float(self.cutoff))
        k = self.n_vars + 1
        # consts: parent score, fewest child rows, node-fit flag, beta (k), then the system (k*k + k) as scratch
        return CompiledCriterion(record, 0, self.min_samples_leaf, n_consts=3 + 2 * k + k * k,
                                 size_channel=self.n_channels - 1)


# ---------------------------------------------------------------------- compiled pieces

#: Parameter record of :class:`LocalLinearSplitCriterion` in the compiled kernels.
LLSplitRecord = namedtuple("LLSplitRecord", ["n_vars", "min_samples_leaf", "min_weight_leaf", "alpha",
                                             "imbalance_penalty", "ll_lambda", "weight_penalty", "cutoff"])


@compiled_only
def _node_beta(p, parent, consts):
    # The node's penalised system in consts[3 + k:], solved into consts[3:3 + k] (solve_dropping).
    P = p.n_vars
    k = P + 1
    ob = 3                    # beta
    oa = 3 + k                # matrix, row-major
    oy = 3 + k + k * k        # right-hand side, then the forward solution
    cx = 2
    cxy = 2 + P
    cxx = 2 + 2 * P
    consts[oa] = parent[0]
    consts[oy] = parent[1]
    for j in range(P):
        consts[oa + j + 1] = parent[cx + j]
        consts[oa + (j + 1) * k] = parent[cx + j]
        consts[oy + j + 1] = parent[cxy + j]
        for l in range(j, P):
            v = parent[cxx + j * P - j * (j - 1) // 2 + (l - j)]
            consts[oa + (j + 1) * k + l + 1] = v
            consts[oa + (l + 1) * k + j + 1] = v
    if p.weight_penalty:
        for j in range(1, k):
            consts[oa + j * k + j] = consts[oa + j * k + j] + p.ll_lambda * consts[oa + j * k + j]
    else:
        trace = consts[oa]
        for j in range(1, k):
            trace = trace + consts[oa + j * k + j]
        norm = trace / k
        for j in range(1, k):
            consts[oa + j * k + j] = consts[oa + j * k + j] + p.ll_lambda * norm
    # Cholesky, lower triangle in place; a dropped pivot zeroes its column.
    for j in range(k):
        ajj = consts[oa + j * k + j]
        d = ajj
        for m in range(j):
            d = d - consts[oa + j * k + m] * consts[oa + j * k + m]
        keep = d > 1e-10 * ajj
        s = np.sqrt(d) if keep else 1.0
        consts[oa + j * k + j] = s if keep else 0.0
        for i in range(j + 1, k):
            v = consts[oa + i * k + j]
            for m in range(j):
                v = v - consts[oa + i * k + m] * consts[oa + j * k + m]
            consts[oa + i * k + j] = v / s if keep else 0.0
    for j in range(k):
        s = consts[oa + j * k + j]
        v = consts[oy + j]
        for m in range(j):
            v = v - consts[oa + j * k + m] * consts[oy + m]
        consts[oy + j] = v / s if s != 0.0 else 0.0
    for j in range(k - 1, -1, -1):
        s = consts[oa + j * k + j]
        v = consts[oy + j]
        for m in range(j + 1, k):
            v = v - consts[oa + m * k + j] * consts[ob + m]
        consts[ob + j] = v / s if s != 0.0 else 0.0


@compiled_only
def _residual(p, st, consts):
    # The residual sum of one channel-sum row under the node's fit (consts[2] the flag).
    P = p.n_vars
    if consts[2] > 0.5:
        r = st[1] - consts[3] * st[0]
        for j in range(P):
            r = r - consts[4 + j] * st[2 + j]
        return r
    return st[2 + 2 * P + P * (P + 1) // 2]


def ll_split_prepare(p, parent, consts):
    """Node constants: ``consts[0]`` the parent's residual score, ``consts[1]`` the fewest rows a
    child needs, ``consts[2]`` 1 for the node's own fit (0: the whole-data residuals), ``consts[3:3 + k]``
    the node's beta."""
    size = parent[parent.shape[0] - 1]
    consts[1] = max(p.min_samples_leaf, np.ceil(p.alpha * size))
    if size < p.cutoff:
        consts[2] = 0.0
    else:
        consts[2] = 1.0
        _node_beta(p, parent, consts)
    w = parent[0]
    r = _residual(p, parent, consts)
    consts[0] = r * r / w if w > 0 else 0.0


def ll_split_gains(p, lefts, rights, consts, out, row, n):
    """:meth:`LocalLinearSplitCriterion.gain` of ``n`` candidates of one node into ``out[row, :n]``."""
    c = lefts.shape[1] - 1
    for i in range(n):
        wl = lefts[i, 0]
        wr = rights[i, 0]
        cl = lefts[i, c]
        cr = rights[i, c]
        ok = ((wl > 0) & (wr > 0) & (wl >= p.min_weight_leaf) & (wr >= p.min_weight_leaf)
              & (cl >= consts[1]) & (cr >= consts[1]))
        g = -np.inf
        if ok:
            rl = _residual(p, lefts[i], consts)
            rr = _residual(p, rights[i], consts)
            g = rl * rl / wl + rr * rr / wr - consts[0]
            if p.imbalance_penalty > 0:
                g -= p.imbalance_penalty * (1.0 / cl + 1.0 / cr)
        out[row, i] = g


def ll_split_bin_key(p, stats, i, consts):
    """Category sort key: the category's mean residual under the node's fit."""
    w = stats[i, 0]
    key = 0.0
    if w > 0:
        key = _residual(p, stats[i], consts) / w
    return key


register(LLSplitRecord, prepare=ll_split_prepare, gains=ll_split_gains, bin_key=ll_split_bin_key)

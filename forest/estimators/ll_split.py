"""RegressionForest's local linear splits (grf's ``ll_regression_forest(enable.ll.split = TRUE)``).

The rule is :mod:`forest.criteria.local_linear_split`; this module gives
:class:`forest.RegressionForest` its parameters' checks (:func:`check_ll_split_params`)
and, in ``fit``, the criterion and its channels (:func:`ll_split_channels`):

* the split variables: ``ll_split_variables`` (indices or names), by default every
  non-categorical column (grf: every column; a category code is no linear regressor);
  they must have no missing values (the ridge needs them; ``fit`` refuses, naming the
  rank, before any tree is grown);
* ``ll_split_cutoff``: grf's default ``floor(sqrt(n))`` over all ranks' rows, at most
  ``n``; 0 fits every node's own ridge;
* the whole-data ridge (grf's ``overall.beta``, used below the cutoff): its sums
  ``sum w z z^T`` and ``sum w z y`` are the first channels summed over every row. Each
  term is rounded to a fixed-point unit (``2**-b`` of the column's largest ``|term|``
  over all ranks, ``b = 62 - bits(n)``, as :mod:`forest.engine.quantized` sums) and
  added in int64, so the sums, the coefficients and every row's residual are the same
  bits at any rank count. The column peaks ride on the input checks' exchange, the
  sums on one int64 allreduce.

Sample weights (grf's ll forest takes none) weigh every sum, the rescaled weights of
``fit`` (mean 1): with unit weights the rule is grf's. Trees grow on the standardised
outcome of ``fit``; ridge residuals are equivariant to it (the intercept is not
penalised), so the splits are those of the raw outcome.
"""
import numpy as np

from native import collectives as col

from forest._validation import check_param_types
from forest.collective_checks import AgreedError, collective_checks
from forest.criteria.local_linear_split import LocalLinearSplitCriterion, overall_beta

#: RegressionForest's parameters of local linear splitting.
LL_SPLIT_PARAMS = ("enable_ll_split", "ll_split_lambda", "ll_split_weight_penalty", "ll_split_variables",
                   "ll_split_cutoff")


def check_ll_split_params(est):
    """Validate the ``ll_split_*`` parameters (types and ranges; data-free).

    Raises
    ------
    TypeError, ValueError
    """
    if not hasattr(est, "enable_ll_split"):
        return
    check_param_types(est, optional_ints=("ll_split_cutoff",), reals=("ll_split_lambda",),
                      bools=("enable_ll_split", "ll_split_weight_penalty"))
    lam = est.ll_split_lambda
    if not (np.isfinite(lam) and lam >= 0):
        raise ValueError(f"ll_split_lambda must be a finite number >= 0, got {lam!r}")
    if est.ll_split_cutoff is not None and est.ll_split_cutoff < 0:
        raise ValueError(f"ll_split_cutoff must be an int >= 0 or None, got {est.ll_split_cutoff!r}")
    variables = est.ll_split_variables
    if variables is not None and (isinstance(variables, (str, bytes)) or not hasattr(variables, "__len__")
                                  or len(variables) == 0):
        raise ValueError(f"ll_split_variables must be None or a non-empty sequence of column indices or names, "
                         f"got {variables!r}")
    if est.enable_ll_split and getattr(est, "tune_parameters", None) is not None:
        raise ValueError("tune_parameters is not supported with enable_ll_split=True (grf tunes only forests "
                         "without local linear splits)")


def resolve_cutoff(cutoff, n_global):
    """grf's ``ll.split.cutoff``: ``floor(sqrt(n))`` when None; a given one must be at most ``n``."""
    if cutoff is None:
        return int(np.floor(np.sqrt(n_global)))
    if cutoff > n_global:
        raise AgreedError(f"ll_split_cutoff ({cutoff}) must be at most the number of rows ({n_global})")
    return int(cutoff)


def _fixed_units(peak, n_global):
    bits = 62 - int(n_global).bit_length()
    if bits < 24:
        raise AgreedError(f"enable_ll_split supports up to 2**38 rows, got {n_global}")
    return np.where(peak > 0, peak, 1.0) * 2.0 ** -bits


def ll_split_channels(est, X, y, g, n_global, comm, base):
    """The criterion and channels of a fit with ``enable_ll_split=True`` (collective).

    Parameters
    ----------
    est : RegressionForest
        Its ``is_categorical_`` and feature names are set (``fit`` checked ``X``).
    X : ndarray of float64, shape (n_local, n_features), or None
        ``fit``'s validated features (None: only binned codes were given; refused).
    y : ndarray of float64, shape (n_local, n_outputs)
        The standardised outcome the trees grow on.
    g : ndarray of float64, shape (n_local,)
        ``fit``'s rescaled sample weights.
    n_global : int
    comm : native.comm.Communicator
    base : forest.criteria.basic.VarianceCriterion
        The regression forest's criterion: its size rules, balance rule and penalty.

    Returns
    -------
    criterion : LocalLinearSplitCriterion
    channels : ndarray of float64, shape (n_local, criterion.n_channels)
    """
    cutoff = resolve_cutoff(est.ll_split_cutoff, n_global)
    with collective_checks(comm) as checks:
        if X is None:
            raise ValueError("enable_ll_split needs X: the ridge fits read the split variables' values, which binned "
                             "codes alone do not give (pass X with binned)")
        if y.shape[1] != 1:
            raise ValueError(f"enable_ll_split supports one outcome (grf's ll_regression_forest); y has {y.shape[1]}")
        columns = est._correction_columns(est.ll_split_variables, name="ll_split_variables")
        Z = np.ascontiguousarray(X[:, columns], dtype=np.float64)
        bad = ~np.isfinite(Z)
        if bad.any():
            row, col_ = np.argwhere(bad)[0]
            raise ValueError(f"X has a missing value in split variable {int(columns[col_])} (row {int(row)}): "
                             f"enable_ll_split needs complete values in the split variables (choose "
                             f"ll_split_variables=, or impute)")
        crit = LocalLinearSplitCriterion(len(columns), float(est.ll_split_lambda), bool(est.ll_split_weight_penalty),
                                         cutoff, min_samples_leaf=base.min_samples_leaf,
                                         min_weight_leaf=base.min_weight_leaf, alpha=base.alpha,
                                         imbalance_penalty=base.imbalance_penalty)
        channels = crit.make_channels(y[:, 0], Z, g)
        m = crit.layout["r"]           # the channels before it hold the ridge's sums
        checks.share(peak=np.abs(channels[:, :m]).max(axis=0) if len(channels) else np.zeros(m))
    if cutoff > 0:
        peak = np.max([s["peak"] for s in checks.summaries], axis=0)
        unit = _fixed_units(peak, n_global)
        fixed = np.rint(channels[:, :m] / unit).astype(np.int64).sum(axis=0)
        if comm.size > 1:
            fixed = col.allreduce(comm, fixed)
        beta = overall_beta(fixed * unit, crit.n_vars, crit.ll_lambda)
        # elementwise in a fixed order: every row's residual is the same bits wherever it lies
        r = y[:, 0] - beta[0]
        for j in range(crit.n_vars):
            r = r - beta[1 + j] * Z[:, j]
        channels[:, m] = g * r
    return crit, channels

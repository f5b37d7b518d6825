"""InstrumentalForest: grf's instrumental forest (local average treatment effects) on histograms.

This module owns the public instrumental-forest estimator: its input checks (a scalar
treatment ``t``, an instrument ``z``, binary or continuous), local centering of ``y``,
``t`` and ``z`` with out-of-bag nuisance forests, and honest growth with
:class:`forest.criteria.instrumental.InstrumentalCriterion`. Everything downstream of
the trees (``predict``, BLB ``predict_var`` / ``predict_interval``, ``oob_predict``)
is the causal forest's (:mod:`forest.estimators.effect_forest`), reading the leaves through
:class:`forest.criteria.instrumental.InstrumentalChannels`: the forest-weighted local
Wald estimate ``theta(x) = Cov_x(Z, Y) / Cov_x(Z, W)``.

Assumptions are the instrumental-variable ones (relevance, exclusion, independence of
the instrument given ``x``, and monotonicity for the LATE reading); nothing here tests
them. Where the local first stage ``Cov_x(Z, W)`` vanishes the estimate is NaN.

Under ``mpirun`` each rank passes its own consecutive block of rows (ranks in order);
the forest is the one a single process grows on all rows, bit for bit.
"""
from types import SimpleNamespace

import numpy as np

from native import collectives as col
from native.comm import world

from forest.criteria.compiled import shared_specialisation
from forest.engine.clusters import resolve_clusters
from forest.collective_checks import AgreedError, collective_checks, total
from forest.io.continuation import begin_forest, continue_forest, fit_fingerprint, open_stage
from forest.estimators.effect_forest import EffectForestBase
from forest.estimators.instrumental_analysis import InstrumentalAnalysisMixin
from forest.engine.honest_forest import global_ids, grow_honest_forest
from forest.engine.importance import depth_weighted_importance, gain_importance
from forest.criteria.instrumental import InstrumentalChannels, InstrumentalCriterion
from forest.profiling import phase
from forest._validation import (agreed_features, check_moment_sums, check_row_count, check_target, check_weight,
                                check_weight_total, feature_summary, fit_features, moment_sums)
from forest.estimators.regression_forest import RegressionForest, forest_spec, resolve_mtry
from forest.estimators.tuning import fit_tuned
from forest.io import model_checks, model_io

#: The variables of a fit: argument name -> how messages call it.
_VARIABLES = (("y", "outcome"), ("t", "treatment"), ("z", "instrument"))


def _value_range(v):
    """``(min, max)`` of this rank's values, or None without rows."""
    return (float(v.min()), float(v.max())) if len(v) else None


def _overflow_sums(g, y, t, z):
    """:func:`forest._validation.moment_sums` of the pairs whose products the channels hold, shape (3, 5)."""
    return np.stack([moment_sums(g, y, t), moment_sums(g, y, z), moment_sums(g, t, z)])


def _check_overflow(sums, names):
    """Raise when the summed channel products of (y, t), (y, z), (t, z) would overflow."""
    y, t, z = names
    for row, (a, b) in zip(sums, ((y, t), (y, z), (t, z))):
        check_moment_sums(row, y_name=a, t_name=b)


class InstrumentalForest(InstrumentalAnalysisMixin, EffectForestBase):
    """Generalized random forest for heterogeneous local average treatment effects.

    grf's ``instrumental_forest``: the effect ``theta(x)`` of a scalar treatment ``t``
    on ``y``, identified by an instrument ``z`` (binary or continuous) that moves ``t``
    and affects ``y`` only through ``t``. With a binary instrument and treatment it is
    the local average treatment effect of the compliers at ``x``.

    Parameters
    ----------
    n_estimators : int, default 200
    max_samples : float, default 0.5
        Sample fraction per tree (``<= 0.5`` when ``ci_group_size > 1``).
    honest : bool, default True
    honesty_fraction : float, default 0.5
    min_samples_leaf : int, default 5
        Fewest rows per child, and per side of the centred instrument
        (``z - z_hat(x) > 0`` and ``<= 0``) in each child: grf's ``min.node.size``
        rule on the instrument.
    max_depth : int or None, default None
    max_features : None, int, float, "sqrt" or "log2", default None
        ``mtry``; ``None`` is GRF's ``min(ceil(sqrt(d) + 20), d)``.
    alpha : float, default 0.05
        Each child keeps at least this share of the parent's instrument spread
        (``stabilize_splits=False``: of the parent's rows).
    imbalance_penalty : float, default 0.0
    stabilize_splits : bool, default True
        grf's ``stabilize.splits``: whether the instrument counts when judging a split's
        balance. True: the ``min_samples_leaf`` and ``alpha`` rules above, per side of the
        centred instrument and on its spread. False: grf's regression rule on the
        pseudo-outcomes, each child needs ``max(min_samples_leaf, ceil(alpha * rows of the
        node))`` rows, and ``imbalance_penalty`` is in rows
        (:class:`forest.criteria.instrumental.InstrumentalCriterion`).
    honesty_prune_leaves : bool, default True
        grf's ``honesty.prune.leaves``, as :class:`forest.CausalForest`'s: False leaves a
        tree whose leaf is empty for a point out of that point's estimate.
    ci_group_size : int, default 2
        Trees per little bag; ``>= 2`` enables ``predict_var``/``predict_interval``.
    max_bins : int, default 255
    nuisance_estimators : int or None, default None
        Trees of each centering forest (of ``y``, ``t`` and ``z``); ``None`` is
        ``max(50, n_estimators // 4)``.
    batch_size : int or None, default None
    categorical_features : "from_dtype", list of str or int, array-like of bool, or None, default "from_dtype"
        Columns split by category subsets instead of thresholds (README, "Categorical
        features"): ``"from_dtype"`` takes pandas ``category`` and string columns, object
        columns of strings and Arrow ``dictionary``/string columns; or name them, give their
        indices or a boolean mask; ``None``: every column is numeric. A category unseen in
        training goes where missing values go. ``is_categorical_`` and ``category_coder_`` (set when
        there are categorical columns) record them.
    random_state : int or None, default None (means 0)
    equalize_cluster_weights : bool, default False
        With ``clusters`` in ``fit``: trees take ``min(cluster size)`` rows of each
        drawn cluster (grf's rule).
    warm_start : bool, default False
        Keep the fitted trees and add trees up to ``n_estimators`` (the nuisance
        forests of the first fit are kept), as :class:`forest.CausalForest`.
    tune_parameters : None, "all" or list of str, default None
        grf's ``tune.parameters`` (:mod:`forest.estimators.tuning`), as :class:`forest.CausalForest`:
        the R-loss ``(Y - m(x) - tau(x) (W - e(x)))^2`` of small forests' out-of-bag effects.
    tune_num_trees, tune_num_reps, tune_num_draws : int, default 200, 50, 1000

    Attributes
    ----------
    estimators_ : dict
        Packed forest; node values are the averaged equation moments
        ``(g, gZ~, gW~, gY~, gZ~Y~, gZ~W~)`` plus the estimation count.
    bin_mapper_ : histogram.binning.BinMapper
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when fitted on a table with string column names (or with ``feature_names``).
    n_treatments_, n_outcomes_ : int
        Both 1.
    outcome_forest_, treatment_forest_, instrument_forest_ : RegressionForest or None
        The nuisance forests of ``E[Y|x]``, ``E[W|x]`` and ``E[Z|x]`` (None when the
        estimate was given).
    nuisance_ : dict
        Where the centering came from (see :class:`forest.CausalForest`), with
        ``"z_hat"`` too.
    feature_importances_ : ndarray, shape (n_features,)
        GRF's depth-weighted split frequency.
    gain_importances_ : ndarray, shape (n_features,)
    tuned_params_, tuning_ : dict
        With ``tune_parameters``: the values the forest was grown with, and the tuning record.
    """

    _nuisance_specs = EffectForestBase._nuisance_specs + (("z_hat", 15485863, "nuisance-z", "instrument_forest_"),)

    def __init__(self, n_estimators=200, *, max_samples=0.5, honest=True, honesty_fraction=0.5, min_samples_leaf=5,
                 max_depth=None, max_features=None, alpha=0.05, imbalance_penalty=0.0, ci_group_size=2, max_bins=255,
                 nuisance_estimators=None, batch_size=None, random_state=None, equalize_cluster_weights=False,
                 warm_start=False, categorical_features="from_dtype", tune_parameters=None, tune_num_trees=200,
                 tune_num_reps=50, tune_num_draws=1000, stabilize_splits=True, honesty_prune_leaves=True):
        self.n_estimators = n_estimators
        self.stabilize_splits = stabilize_splits
        self.honesty_prune_leaves = honesty_prune_leaves
        self.tune_parameters = tune_parameters
        self.tune_num_trees = tune_num_trees
        self.tune_num_reps = tune_num_reps
        self.tune_num_draws = tune_num_draws
        self.categorical_features = categorical_features
        self.max_samples = max_samples
        self.honest = honest
        self.honesty_fraction = honesty_fraction
        self.min_samples_leaf = min_samples_leaf
        self.max_depth = max_depth
        self.max_features = max_features
        self.alpha = alpha
        self.imbalance_penalty = imbalance_penalty
        self.ci_group_size = ci_group_size
        self.max_bins = max_bins
        self.nuisance_estimators = nuisance_estimators
        self.batch_size = batch_size
        self.random_state = random_state
        self.equalize_cluster_weights = equalize_cluster_weights
        self.warm_start = warm_start

    def _check_params(self):
        """Validate the parameters before any data is touched; returns the seed.

        ``fit`` runs it first; ``forest-train`` and model-file loading run it too.
        """
        seed = self._check_effect_params()
        self._criterion()  # the criterion's own checks of alpha and the penalty
        return seed

    #: The fitting process's training codes (``oob_predict()`` without X) stay out of model files.
    _model_io_exclude_ = ("_oob_source_",)

    def _row_columns(self, t, y, z, *, n):
        """The targets as ``fit`` codes them for :attr:`training_rows_` (``y, t, z``, each (n, 1))."""
        given = {"t": t, "y": y, "z": z}
        return [check_target(given[name], name, n, estimator=self, multi_output=False).reshape(n, 1)
                for name, _ in _VARIABLES]

    def _criterion(self):
        return InstrumentalCriterion(min_samples_leaf=self.min_samples_leaf, alpha=self.alpha,
                                     imbalance_penalty=self.imbalance_penalty,
                                     constraint="sign" if self.stabilize_splits else "rows")

    def _layout(self):
        return InstrumentalChannels()

    # ------------------------------------------------------------------ fit
    def _fit_inputs(self, X, t, y, z, sample_weight, given, binned, feature_names, comm):
        """Validate ``fit``'s arguments on every rank together.

        Returns
        -------
        SimpleNamespace
            ``seed, X, binned, n_global, values`` (``{"y", "t", "z"}`` -> (n, 1)),
            ``g`` and ``given`` (``{"y_hat", "t_hat", "z_hat"}`` -> (n, 1) or None).
        """
        with collective_checks(comm) as checks:
            seed = self._check_params()
            X, binned, n = fit_features(self, X, binned, feature_names, min_samples=1 if comm.size == 1 else 0)
            resolve_mtry(self.max_features, self.n_features_in_)
            values = {name: check_target(v, name, n, estimator=self, multi_output=False).reshape(n, 1)
                      for name, v in (("y", y), ("t", t), ("z", z))}
            g = check_weight(sample_weight, n)
            given = {name: None if v is None else check_target(v, name, n, estimator=self,
                                                               multi_output=False).reshape(n, 1)
                     for name, v in given.items()}
            checks.share(rows=n, ranges={k: _value_range(v) for k, v in values.items()},
                         overflow=_overflow_sums(g, values["y"], values["t"], values["z"]), **feature_summary(self))
        summaries = checks.summaries
        agreed_features(summaries, self)
        n_global = total(summaries, "rows")
        check_row_count(self, n_global, 4, comm.size)
        for name, what in _VARIABLES:
            ranges = [s["ranges"][name] for s in summaries if s["ranges"][name] is not None]
            if min(lo for lo, _ in ranges) == max(hi for _, hi in ranges):
                raise AgreedError(f"{name} is constant over all rows: the {what} must vary")
        sums = total(summaries, "overflow")
        check_weight_total(sums[0, 0])
        # The nuisance forests rescale the weights to mean 1; check what they will sum too.
        _check_overflow(sums * max(1.0, n_global / sums[0, 0]), ("y", "t", "z"))
        return SimpleNamespace(seed=seed, X=X, binned=binned, n_global=n_global, values=values, g=g, given=given)

    def fit(self, X, t, y, z, sample_weight=None, *, y_hat=None, t_hat=None, z_hat=None, comm=None, progress=None,
            binned=None, feature_names=None, clusters=None, checkpoint=None):
        """Fit on this rank's rows.

        Input checks are collective (:mod:`forest.collective_checks`): when any rank's
        input is bad, every rank raises the same ``ValueError`` naming that rank.

        Parameters
        ----------
        X : array-like, pandas DataFrame or pyarrow Table, shape (n_local, n_features), or None
            NaN means missing. ``None`` when ``binned`` is given.
        t : array-like, shape (n_local,)
            Treatment (binary 0/1 or continuous), finite.
        y : array-like, shape (n_local,)
            Outcome.
        z : array-like, shape (n_local,)
            Instrument (binary 0/1 or continuous), finite.
        sample_weight : array-like, shape (n_local,), optional
        y_hat, t_hat, z_hat : array-like, shape (n_local,), optional
            ``E[Y|x]``, ``E[W|x]``, ``E[Z|x]`` for centering (out-of-bag forests when omitted).
        comm : native.comm.Communicator, optional
            ``None`` means ``native.comm.world()``.
        progress : callable, optional
            ``progress(n_trees_done, n_trees_total)`` for the forest's trees.
        binned : tuple (BinMapper, ndarray), optional
            Pre-binned features (see :meth:`forest.CausalForest.fit`).
        feature_names : sequence of str, optional
        clusters : array-like of int, shape (n_local,), optional
            Cluster labels: trees and little bags sample whole clusters.
        checkpoint : str, os.PathLike or forest.io.checkpoint.Checkpoint, optional
            Directory for checkpoints of the nuisance forests and the forest.

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        if getattr(self, "tune_parameters", None) is not None:
            return fit_tuned(self, dict(X=X, t=t, y=y, z=z, sample_weight=sample_weight, y_hat=y_hat, t_hat=t_hat,
                                        z_hat=z_hat, binned=binned, feature_names=feature_names, clusters=clusters,
                                        checkpoint=checkpoint), comm, progress)
        inputs = self._fit_inputs(X, t, y, z, sample_weight, {"y_hat": y_hat, "t_hat": t_hat, "z_hat": z_hat},
                                  binned, feature_names, comm)
        seed, X, g, values, n_global = inputs.seed, inputs.X, inputs.g, inputs.values, inputs.n_global
        n, n_features = len(g), self.n_features_in_
        gids, _ = global_ids(comm, n)
        clusters_layout = resolve_clusters(clusters, comm, n, self.equalize_cluster_weights, sample_weight)
        crit = self._criterion()
        begun = begin_forest(self, X, inputs.binned, n_features, seed, comm, clustered=clusters_layout is not None)
        if begun is None:
            return self
        sampling, earlier, mapper, binned = begun
        data = {"t": values["t"], "y": values["y"], "z": values["z"], "sample_weight": g}
        data.update((k, v) for k, v in inputs.given.items() if v is not None)
        if clusters_layout is not None:
            data["clusters"] = clusters_layout.codes
        stage = open_stage(checkpoint, comm, self, stage="forest", n_total=int(self.n_estimators),
                           fingerprint=lambda: fit_fingerprint(self, comm, gids, n_global, binned, mapper, data))
        # The nuisance forests and this forest's trees share one compiled kernel
        # (forest.criteria.compiled.shared_specialisation): one compilation on a cold start, not two.
        with shared_specialisation(crit.compiled()):
            hats, nuisance_record = self._centering(
                X, {f"{name}_hat": values[name] for name, _ in _VARIABLES}, g, inputs.given, (mapper, binned), seed,
                comm, stage, earlier is not None, clusters_layout, gids)
            centred = {name: values[name] - hats[f"{name}_hat"] for name, _ in _VARIABLES}
            sums = _overflow_sums(g, centred["y"], centred["t"], centred["z"])
            if comm.size > 1:
                sums = col.allreduce(comm, np.ascontiguousarray(sums).reshape(-1)).reshape(sums.shape)
            _check_overflow(sums, ("y - y_hat", "t - t_hat", "z - z_hat"))
            with phase("other"):
                channels = crit.make_channels(centred["z"], centred["t"], centred["y"], g)
            start, on_batch = continue_forest(stage, earlier, binned=binned, missing_bin=mapper.missing_bin_, gids=gids,
                                              sampling=sampling, n_estimators=int(self.n_estimators), oob=False,
                                              clusters=clusters_layout)
            packed, _, _ = grow_honest_forest(
                binned, mapper, gids, channels, crit,
                forest_spec(self, sampling, n_features, crit.node_value, crit.layout.n_moments), n_global=n_global,
                comm=comm, oob=False, progress=progress, clusters=clusters_layout, start=start, on_batch=on_batch)
        self.estimators_ = packed
        self.bin_mapper_ = mapper
        self.n_treatments_ = self.n_outcomes_ = self.y_ndim_ = 1
        self.sampling_ = sampling
        self.nuisance_ = nuisance_record
        self.feature_importances_ = depth_weighted_importance(packed, n_features)
        self.gain_importances_ = gain_importance(packed, n_features)
        self._record_training_rows(comm, gids, n_global, binned, [values[name] for name, _ in _VARIABLES])
        # oob_predict() without X: recomputed from the trees on demand (fit grows without
        # out-of-bag sums); the codes are kept in this process only, never in model files.
        self._oob_source_ = (binned, gids, clusters_layout)
        self._keep_weights_source(binned, gids, np.ones(len(gids)), clusters_layout)
        return self

    def _tuning_residuals(self, fit_args):
        """``(Y - y_hat (n, 1), W - t_hat (n, 1), out-of-bag tau (n, 1, 1), weights (n,))`` of this rank's
        training rows, for :mod:`forest.estimators.tuning`'s R-loss; ``fit_args`` holds the fit's
        ``t``, ``y``, ``sample_weight`` and the centring estimates."""
        def column(name):
            return np.asarray(fit_args[name], dtype=np.float64).reshape(-1, 1)

        tau = np.asarray(self.oob_predict(), dtype=np.float64).reshape(-1, 1, 1)
        weight = fit_args.get("sample_weight")
        weight = np.ones(len(tau)) if weight is None else np.asarray(weight, dtype=np.float64).reshape(-1)
        return column("y") - column("y_hat"), column("t") - column("t_hat"), tau, weight


# Model files name it as they always have (forest.io.model_io.register); its restored state's checks.
model_io.register(InstrumentalForest, name="forest.instrumental_forest.InstrumentalForest",
                  check=lambda est: model_checks.check_instrumental_forest(est, RegressionForest))

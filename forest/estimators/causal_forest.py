"""CausalForest: GRF's causal forest grown from per-bin moment histograms.

This module owns the public causal-forest estimator: treatment handling (binary,
multi-arm categorical, continuous scalar or vector), honest growth with
:class:`forest.criteria.causal.CausalCriterion`, the out-of-bag CATE, the AIPW
average effect and feature importances. Local centering with out-of-bag
:class:`forest.RegressionForest` nuisance estimates and the estimates from leaf
moments (CATE, BLB variances and intervals) are shared with the instrumental forest
(:mod:`forest.estimators.effect_forest`). The statistics live in :mod:`forest.analysis.inference`; the
forest loop in :mod:`forest.engine.honest_forest`.

Leaves store only averaged moment vectors and counts, never sample lists: the model
is the packed node arrays plus the bin mapper. Out-of-bag membership is recomputed
from the global row id (:mod:`forest.engine.subsample`).

Under ``mpirun`` each rank passes its own consecutive block of rows (ranks in order);
sampling keyed by global row id, global bin edges and bitwise-identical reduced
histograms make the forest the one a single process grows on all rows.
"""
from types import SimpleNamespace

import numpy as np

from native import collectives as col
from native.comm import world

from forest.criteria.compiled import shared_specialisation
from forest.estimators.causal_analysis import CausalAnalysisMixin
from forest.estimators.local_linear import CausalLocalLinearMixin
from forest.criteria.causal import CausalChannels, CausalCriterion
from forest.engine.clusters import resolve_clusters
from forest.io.continuation import begin_forest, continue_forest, fit_fingerprint, open_stage
from forest.estimators.effect_forest import EffectForestBase
from forest.engine.honest_forest import global_ids, grow_honest_forest
from forest.analysis.average_effects import average_treatment_effect as _average_effect
from forest.engine.importance import depth_weighted_importance, gain_importance
from forest.analysis.inference import oob_effects
from forest.profiling import phase
from forest._validation import (agreed_features, as_columns, check_moment_sums, check_row_count, check_target,
                                check_weight, check_weight_total, feature_summary, fit_features, moment_sums)
from forest.collective_checks import collective_checks, input_error, require_same, total
from forest.estimators.regression_forest import (RegressionForest, common_weight, forest_spec, resolve_mtry,
                                                 scaled_weights, weight_range)
from forest.estimators.tuning import fit_tuned
from forest.estimators.treatment import check_treatment_type, encode_treatment, resolve_treatment, treatment_summary
from forest.io import model_checks, model_io


def _nuisance_shape_ok(tail, width):
    """Whether per-row nuisance estimates of trailing shape ``tail`` fit ``width`` columns."""
    return tail == (width,) or (tail == () and width == 1)


def _check_centered_moments(comm, g, yc, wc):
    """Reject centered outcomes/treatments whose moment sums would overflow (same error on every rank)."""
    sums = moment_sums(g, yc, wc)
    if comm.size > 1:
        sums = col.allreduce(comm, np.ascontiguousarray(sums))
    check_moment_sums(sums, y_name="y - y_hat", t_name="t - t_hat")


class CausalForest(CausalLocalLinearMixin, CausalAnalysisMixin, EffectForestBase):
    """Generalized random forest for heterogeneous treatment effects, on histograms.

    Parameters
    ----------
    n_estimators : int, default 200
    max_samples : float, default 0.5
        Sample fraction per tree (``<= 0.5`` when ``ci_group_size > 1``).
    honest : bool, default True
    honesty_fraction : float, default 0.5
    min_samples_leaf : int, default 5
        Fewest rows per child and per treatment arm (or sign of the centered
        treatment, for continuous treatments) in each child: GRF's ``min.node.size``
        rule, so at the same value the leaves hold about twice the rows of EconML's
        (which counts all rows). Smaller leaves mean less smoothing bias and wider
        intervals at about the same RMSE: on the Wager-Athey design (n = 4000,
        d = 10, 2000 trees) 95% intervals covered 0.84 of test points at 5, 0.90
        at 2 and 0.94 at 1 (``benchmarks/RESULTS.md``, coverage audit). Use 1 or 2
        when the intervals matter more than the point estimate.
    max_depth : int or None, default None
    max_features : None, int, float, "sqrt" or "log2", default None
        ``mtry``; ``None`` is GRF's ``min(ceil(sqrt(d) + 20), d)``.
    alpha : float, default 0.05
        Each child keeps at least this share of the parent's treatment spread
        (``stabilize_splits=False``: of the parent's rows).
    imbalance_penalty : float, default 0.0
    stabilize_splits : bool, default True
        grf's ``stabilize.splits``: whether the treatment counts when judging a split's
        balance. True: the ``min_samples_leaf`` and ``alpha`` rules above, per arm (or
        sign of the centred treatment) and on the treatment spread. False: grf's
        regression rule on the pseudo-outcomes, each child needs
        ``max(min_samples_leaf, ceil(alpha * rows of the node))`` rows of any arm, and
        ``imbalance_penalty`` is in rows; trees grow deeper where one arm is rare, and a
        leaf may hold fewer treated rows than ``min_samples_leaf`` (or none)
        (:mod:`forest.criteria.causal`).
    honesty_prune_leaves : bool, default True
        grf's ``honesty.prune.leaves``, for leaves no estimation row reaches. True: such a
        leaf takes its nearest non-empty ancestor's value (close to grf's pruning, not the
        same: :mod:`forest.engine.honest_forest`). False: a tree whose leaf is empty for a
        point is left out of that point's estimate, variance and forest weights (NaN where
        every tree is); may help on small data, needs more trees. The nuisance forests
        keep the default: their out-of-bag estimates centre every row.
    ci_group_size : int, default 2
        Trees per little bag; ``>= 2`` enables ``predict_var``/``predict_interval``.
    max_bins : int, default 255
    treatment_type : {"auto", "binary", "categorical", "continuous"}, default "auto"
        ``auto``: a 1-D ``t`` with two distinct (numeric) values is binary whatever the codes
        (the smaller value is the control); 1-D integer (or bool) values with 3 to
        ``forest.estimators.treatment.AUTO_MAX_LEVELS`` (10) levels are categorical (the smallest
        level is the control); more integer levels are an error asking for an explicit
        ``"categorical"`` (at most 64 levels) or ``"continuous"``; float values with
        more than two levels, and 2-D ``t``, are continuous. See :mod:`forest.estimators.treatment`.
    nuisance_estimators : int or None, default None
        Trees of each centering forest; ``None`` is ``max(50, n_estimators // 4)``.
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
        With ``clusters`` in ``fit`` (grf's rule): trees take ``min(cluster size)``
        rows of each drawn cluster and average effects weigh every cluster the
        same; otherwise every row weighs the same and trees take whole clusters.
    tune_parameters : None, "all" or list of str, default None
        grf's ``tune.parameters``: choose these parameters by the out-of-bag R-loss of
        small forests at random draws, smoothed by kriging (:mod:`forest.estimators.tuning`);
        ``"all"`` is ``min_samples_leaf, max_samples, max_features, honesty_fraction,
        alpha, imbalance_penalty`` and the centring, which a list names ``"nuisance"``:
        the nuisance forests' out-of-bag predictions, or their local linear corrections
        where those have the lower out-of-bag error and small effect forests on them the
        lower R-loss (a corrected one leaves its forest attribute None, as a given
        ``y_hat`` does; :mod:`forest.estimators.tuning`). The values used are in
        ``tuned_params_``, the centring choice in ``tuning_["nuisance"]`` and
        ``tuning_["centring"]``.
    tune_num_trees, tune_num_reps, tune_num_draws : int, default 200, 50, 1000
        Trees of each small forest, small forests fitted, and kriging candidates (grf's
        ``tune.num.trees``, ``tune.num.reps``, ``tune.num.draws``).
    warm_start : bool, default False
        When True and the forest is fitted, ``fit`` keeps its trees and adds trees up
        to ``n_estimators``. The nuisance forests of the first fit are kept (new
        centering would change the trees already grown), so with
        ``nuisance_estimators=None`` the result is the single fit with the larger
        ``n_estimators`` and ``nuisance_estimators`` set to the first fit's count
        (``nuisance_["n_estimators"]``), bit for bit.

    Attributes
    ----------
    estimators_ : dict
        Packed forest; node values are averaged moments plus the estimation count.
    bin_mapper_ : histogram.binning.BinMapper
    treatment_type_ : str
    classes_ : ndarray or None
        Treatment levels (categorical and binary), control first: for a binary
        ``t`` coded {1, 2}, ``[1, 2]`` and the effect is that of 2 against 1.
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when fitted on a table with string column names (or with ``feature_names``).
    n_treatments_, n_outcomes_ : int
        ``K`` and ``M``.
    ate_, ate_stderr_ : ndarray
        AIPW average effect and standard error (shape of one row of ``predict``).
    dr_scores_ : ndarray
        Out-of-bag doubly robust scores of this rank's training rows (shape of
        ``predict`` on them); not saved in model files.
    outcome_forest_, treatment_forest_ : RegressionForest or None
        The nuisance forests of ``E[Y|x]`` and ``E[W|x]`` (None when ``y_hat`` /
        ``t_hat`` were given); held-out scores (``dr_scores``) use them.
    treatment_variance_forest_ : RegressionForest
        Continuous treatments: the forest of ``Var[W|x]`` in the partial-effect score.
    feature_importances_ : ndarray, shape (n_features,)
        GRF's depth-weighted split frequency.
    gain_importances_ : ndarray, shape (n_features,)
    nuisance_ : dict
        Where the centering came from: ``"n_estimators"`` (trees of the nuisance
        forests) and, for ``"y_hat"`` and ``"t_hat"``, ``{"source": "forest", "seed"}``
        or ``{"source": "given", "content"}`` (a rank-count-free hash of the values,
        :func:`forest.io.fingerprint.content_hash`). Forests can be merged only when these
        agree.
    """

    # scikit-learn's checks reach ``fit(X, t, y)`` through an adapter that supplies ``t``
    # (tests/forest/test_sklearn_checks.py); the checks that cannot hold are the base class's.

    def __init__(self, n_estimators=200, *, max_samples=0.5, honest=True, honesty_fraction=0.5, min_samples_leaf=5,
                 max_depth=None, max_features=None, alpha=0.05, imbalance_penalty=0.0, ci_group_size=2, max_bins=255,
                 treatment_type="auto", nuisance_estimators=None, batch_size=None, random_state=None,
                 equalize_cluster_weights=False, warm_start=False, categorical_features="from_dtype",
                 tune_parameters=None, tune_num_trees=200, tune_num_reps=50, tune_num_draws=1000, stabilize_splits=True,
                 honesty_prune_leaves=True):
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
        self.treatment_type = treatment_type
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
        check_treatment_type(self.treatment_type)
        CausalCriterion(min_samples_leaf=self.min_samples_leaf, alpha=self.alpha,
                        imbalance_penalty=self.imbalance_penalty)  # the criterion's own checks of alpha, penalty
        return seed

    # ------------------------------------------------------------------ fit
    def _fit_inputs(self, X, t, y, sample_weight, y_hat, t_hat, binned, feature_names, comm):
        """Validate ``fit``'s arguments and code the treatment, on every rank together.

        Returns
        -------
        SimpleNamespace
            ``seed, X, binned, n_global, kind, classes, W (n, K), codes, Y (n, M),
            y_ndim, g, y_hat, t_hat`` (the last two None when not given).
        """
        with collective_checks(comm) as checks:
            seed = self._check_params()
            X, binned, n = fit_features(self, X, binned, feature_names, min_samples=1 if comm.size == 1 else 0)
            resolve_mtry(self.max_features, self.n_features_in_)
            t = check_target(t, "t", n, estimator=self, dtype="numeric")
            y = check_target(y, "y", n, estimator=self)
            Y = as_columns(y)
            g = check_weight(sample_weight, n)
            if y_hat is not None:
                y_hat = check_target(y_hat, "y_hat", n, estimator=self)
                if not _nuisance_shape_ok(y_hat.shape[1:], Y.shape[1]):
                    raise ValueError(f"y_hat must have the shape of y {y.shape}, got {y_hat.shape}")
            if t_hat is not None:
                t_hat = check_target(t_hat, "t_hat", n, estimator=self)
            checks.share(rows=n, outputs=y.shape[1:], t_shape=t.shape[1:],
                         treatment=treatment_summary(t, self.treatment_type),
                         t_hat=None if t_hat is None else t_hat.shape[1:],
                         moments=moment_sums(g, Y, as_columns(t)), weights=weight_range(g), **feature_summary(self))
        summaries = checks.summaries
        agreed_features(summaries, self)
        require_same(summaries, "outputs", lambda s: f"y has shape (n, {s[0]})" if s else "y is 1-D")
        require_same(summaries, "t_shape", lambda s: f"t has shape (n, {s[0]})" if s else "t is 1-D")
        n_global = total(summaries, "rows")
        check_row_count(self, n_global, 4, comm.size)
        kind, classes = resolve_treatment(self.treatment_type, [s["treatment"] for s in summaries])
        W, codes = encode_treatment(t, kind, classes)
        K = W.shape[1]
        for r, s in enumerate(summaries):
            if s["t_hat"] is not None and not _nuisance_shape_ok(s["t_hat"], K):
                got = f"(n, {s['t_hat'][0]})" if s["t_hat"] else "(n,)"
                raise input_error(summaries, r, f"t_hat must have shape (n, {K}) for this {kind} treatment "
                                                f"(or (n,) when K = 1), got {got}")
        moments = total(summaries, "moments")
        weight_total = moments[0]  # sum |g| = sum g: weights are non-negative
        check_weight_total(weight_total)
        if kind != "continuous":
            moments[2:] = 0.0  # arm indicators: their products are bounded by the weight and y sums
        # The nuisance forests rescale the weights to mean 1; check what they will sum too.
        check_moment_sums(moments * max(1.0, n_global / weight_total))
        # The moments and the average effect are ratios of weighted sums: rescaled to mean
        # 1 (equal weights exactly 1), weights such as 1e-160 cannot underflow in their
        # products (they gave NaN effects).
        g_scaled = scaled_weights(g, n_global, weight_total, [s["weights"] for s in summaries])
        # every row of every rank weighs exactly 1: the channel g counts the rows (CausalChannels)
        unit = common_weight([s["weights"] for s in summaries]) is not None
        return SimpleNamespace(seed=seed, X=X, binned=binned, n_global=n_global, kind=kind, classes=classes, W=W,
                               codes=codes, Y=Y, y_ndim=y.ndim, g=g, g_scaled=g_scaled, y_hat=y_hat, t_hat=t_hat,
                               unit=unit)

    def fit(self, X, t, y, sample_weight=None, *, y_hat=None, t_hat=None, comm=None, progress=None, binned=None,
            feature_names=None, clusters=None, checkpoint=None):
        """Fit on this rank's rows.

        Input checks are collective (:mod:`forest.collective_checks`): when any rank's
        input is bad, every rank raises the same ``ValueError`` naming that rank.

        Parameters
        ----------
        X : array-like, pandas DataFrame or pyarrow Table, shape (n_local, n_features), or None
            NaN (or a null, pandas ``NA``) means missing. ``None`` when ``binned`` is
            given. A table's column names become ``feature_names_in_`` and are checked
            by ``predict``.
        t : array-like, shape (n_local,) or (n_local, K)
            Treatment (see ``treatment_type``). NaN / ``NA`` / inf are errors.
        y : array-like, shape (n_local,) or (n_local, M)
        sample_weight : array-like, shape (n_local,), optional
        y_hat : array-like, shape like ``y``, optional
            ``E[Y|x]`` estimates for centering (out-of-bag forest when omitted).
        t_hat : array-like, shape (n_local,) or (n_local, K), optional
            ``E[W|x]`` (propensities of arms 1..K for categorical treatments).
        comm : native.comm.Communicator, optional
            ``None`` means ``native.comm.world()``.
        progress : callable, optional
            ``progress(n_trees_done, n_trees_total)`` for the causal forest's trees.
        binned : tuple (BinMapper, ndarray), optional
            Pre-binned features: a ``BinMapper`` fitted on the rows of all ranks and
            this rank's codes, uint8 of shape ``(n_features, n_local)``
            (``mapper.transform(X)``). The forest and its nuisance forests then grow
            on the codes and need no float features (``forest-train`` bins parquet
            row groups as it reads them).
        feature_names : sequence of str, optional
            Names of the binned features (``feature_names_in_``) when ``X`` is None.
        clusters : array-like of int, shape (n_local,), optional
            Cluster labels (grf's ``clusters``): trees and little bags sample whole
            clusters, honesty splits by cluster, at most ``samples_per_cluster``
            rows of a drawn cluster are used (see ``equalize_cluster_weights``), and
            every standard error (intervals, average effects, linear projection,
            RATE) is cluster-robust.
        checkpoint : str, os.PathLike or forest.io.checkpoint.Checkpoint, optional
            Directory where rank 0 writes the nuisance forests' and the forest's trees
            after every batch; a fit whose directory holds a checkpoint of the same data
            and parameters resumes from it, on any number of ranks (:mod:`forest.io.checkpoint`).

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        if getattr(self, "tune_parameters", None) is not None:
            return fit_tuned(self, dict(X=X, t=t, y=y, sample_weight=sample_weight, y_hat=y_hat, t_hat=t_hat,
                                        binned=binned, feature_names=feature_names, clusters=clusters,
                                        checkpoint=checkpoint), comm, progress)
        inputs = self._fit_inputs(X, t, y, sample_weight, y_hat, t_hat, binned, feature_names, comm)
        self._check_warm_targets(inputs)
        seed, X, W, Y, g, kind = inputs.seed, inputs.X, inputs.W, inputs.Y, inputs.g, inputs.kind
        n, n_features, n_global = len(Y), self.n_features_in_, inputs.n_global
        K, M = W.shape[1], Y.shape[1]
        gids, _ = global_ids(comm, n)
        clusters_layout = resolve_clusters(clusters, comm, n, self.equalize_cluster_weights, sample_weight)
        # The criterion validates alpha and imbalance_penalty: build it before the two
        # nuisance forests so a bad value fails in milliseconds, not after their fits.
        constraint = "rows" if not self.stabilize_splits else "sign" if kind == "continuous" else "arms"
        crit = CausalCriterion(K, M, min_samples_leaf=self.min_samples_leaf, alpha=self.alpha,
                               imbalance_penalty=self.imbalance_penalty, constraint=constraint,
                               rows_are_weights=inputs.unit)
        begun = begin_forest(self, X, inputs.binned, n_features, seed, comm, clustered=clusters_layout is not None)
        if begun is None:
            return self
        sampling, earlier, mapper, binned = begun
        data = {"t": W if kind != "categorical" else inputs.codes, "y": Y, "sample_weight": g}
        data.update((k, v) for k, v in (("y_hat", inputs.y_hat), ("t_hat", inputs.t_hat)) if v is not None)
        if clusters_layout is not None:
            data["clusters"] = clusters_layout.codes
        stage = open_stage(checkpoint, comm, self, stage="forest", n_total=int(self.n_estimators),
                           fingerprint=lambda: fit_fingerprint(self, comm, gids, n_global, binned, mapper, data))
        # The nuisance forests and this forest's trees share one compiled kernel
        # (forest.criteria.compiled.shared_specialisation): one compilation on a cold start, not two.
        with shared_specialisation(crit.compiled()):
            hats, nuisance_record = self._centering(X, {"y_hat": Y, "t_hat": W}, g,
                                                    {"y_hat": inputs.y_hat, "t_hat": inputs.t_hat}, (mapper, binned),
                                                    seed, comm, stage, earlier is not None, clusters_layout, gids)
            y_hat, t_hat = hats["y_hat"], hats["t_hat"]
            n_nuis = nuisance_record["n_estimators"]
            nuisance = self._nuisance_params()
            wc = W - t_hat
            yc = Y - y_hat
            _check_centered_moments(comm, inputs.g_scaled, yc, wc)
            indicator = (wc > 0).astype(np.float64) if constraint == "sign" else W
            with phase("other"):
                channels = crit.make_channels(wc, yc, inputs.g_scaled, indicator)
            layout = crit.layout
            start, on_batch = continue_forest(stage, earlier, binned=binned, missing_bin=mapper.missing_bin_, gids=gids,
                                              sampling=sampling, n_estimators=int(self.n_estimators), oob=True,
                                              clusters=clusters_layout)
            packed, acc, cnt = grow_honest_forest(
                binned, mapper, gids, channels, crit,
                forest_spec(self, sampling, n_features, crit.node_value, layout.n_moments), n_global=n_global,
                comm=comm, oob=True, progress=progress, clusters=clusters_layout, start=start, on_batch=on_batch)
            self.estimators_ = packed
            self.bin_mapper_ = mapper
            self.treatment_type_ = kind
            self.classes_ = inputs.classes
            self.n_treatments_, self.n_outcomes_ = K, M
            self.y_ndim_ = inputs.y_ndim
            self.sampling_ = sampling
            self.nuisance_ = nuisance_record
            self._keep_weights_source(binned, gids, np.ones(n), clusters_layout)

            # Out-of-bag CATE on this rank's rows, then the AIPW average effect (global sums).
            with phase("prediction"):
                with np.errstate(invalid="ignore", divide="ignore"):
                    mbar = acc / cnt[:, None]
                if (cnt == 0).any():
                    mbar[cnt == 0] = self._mean_moments_binned(binned, cnt == 0)
                tau_oob = oob_effects(mbar, layout, lambda rows: self._mean_moments_binned(binned, rows))
            V = None
            if kind == "continuous":
                V = self._fit_variance_forest(
                    X, (mapper, binned), W, t_hat, g, comm, clusters_layout, n_nuis, seed, nuisance,
                    checkpoint=None if stage is None else stage.run.stage("variance-t"))
        codes = inputs.codes
        arm = None if kind == "continuous" else (codes if kind == "categorical" else W[:, 0].astype(np.int64))
        rows = self._store_oob_rows(kind, tau_oob, W, arm, Y, y_hat, t_hat, V,
                                    None if sample_weight is None else inputs.g_scaled, gids, clusters_layout)
        est, se = _average_effect(comm, rows, "all")
        self.ate_ = self._shape_one(est)
        self.ate_stderr_ = self._shape_one(se)
        self.feature_importances_ = depth_weighted_importance(packed, n_features)
        self.gain_importances_ = gain_importance(packed, n_features)
        # What the analyses need to recognise these rows later (forest.io.training_rows).
        self._record_training_rows(comm, gids, n_global, binned, [W, Y])
        return self

    def _check_warm_targets(self, inputs):
        """Raise ``ValueError`` when a warm start's treatment or outcome differs from the fitted forest's.

        The trees already grown hold moments of the first fit's treatment columns (arms
        or components) and outcome columns, and the kept nuisance forests predict
        them; more trees can only be added for a treatment of the same type, levels and
        shape and an outcome of the same shape. Every input here was agreed over all
        ranks, so every rank raises the same error.

        Parameters
        ----------
        inputs : SimpleNamespace
            What :meth:`_fit_inputs` returned.
        """
        if not (self.warm_start and hasattr(self, "estimators_")):
            return

        def treatment(kind, classes, K):
            if kind == "continuous":
                return f"a continuous treatment with {K} column{'s' if K > 1 else ''}"
            return f"a {kind} treatment with levels {np.asarray(classes).tolist()}"

        def outcome(ndim, M):
            return "(n,)" if ndim == 1 else f"(n, {M})"

        K, M = inputs.W.shape[1], inputs.Y.shape[1]
        fitted_classes = self.classes_ if self.classes_ is not None else np.zeros(0)
        new_classes = inputs.classes if inputs.classes is not None else np.zeros(0)
        if (inputs.kind != self.treatment_type_ or K != self.n_treatments_
                or not np.array_equal(new_classes, fitted_classes)):
            raise ValueError(f"warm start: t is {treatment(inputs.kind, inputs.classes, K)}, the forest was fitted "
                             f"on {treatment(self.treatment_type_, self.classes_, self.n_treatments_)}; adding trees "
                             f"needs the first fit's treatment type, levels and shape (or warm_start=False)")
        if inputs.y_ndim != self.y_ndim_ or M != self.n_outcomes_:
            raise ValueError(f"warm start: y has shape {outcome(inputs.y_ndim, M)}, the forest was fitted on y of "
                             f"shape {outcome(self.y_ndim_, self.n_outcomes_)}; adding trees needs the first fit's "
                             f"outcome shape (or warm_start=False)")

    def _nuisance_targets(self):
        """What each centring estimate predicts on this rank's training rows, for
        :mod:`forest.estimators.tuning`'s nuisance choice: ``{"y_hat": (Y (n, M), False),
        "t_hat": (W (n, K), bounded)}``, ``bounded`` when the targets are 0/1 arm indicators."""
        rows = self._oob_rows_
        return {"y_hat": (rows.Y, False), "t_hat": (rows.W, self.treatment_type_ != "continuous")}

    def _tuning_residuals(self, fit_args):
        """``(Y - y_hat (n, M), W - t_hat (n, K), out-of-bag tau (n, K, M), weights (n,))`` of this
        rank's training rows, for :mod:`forest.estimators.tuning`'s R-loss."""
        rows = self._oob_rows_
        return rows.Y - rows.y_hat, rows.W - rows.t_hat, rows.tau, rows.weight

    # ------------------------------------------------------------------ shapes
    def _layout(self):
        return CausalChannels(self.n_treatments_, self.n_outcomes_)


# Model files name it as they always have (forest.io.model_io.register); its restored state's checks.
model_io.register(CausalForest, name="forest.causal_forest.CausalForest",
                  check=lambda est: model_checks.check_causal_forest(est, RegressionForest))

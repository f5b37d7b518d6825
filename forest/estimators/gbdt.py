"""Histogram gradient-boosting estimators: ``GBDTRegressor`` and ``GBDTClassifier``.

This module owns the boosting loop and the scikit-learn face of it. Each iteration:
the loss (:mod:`forest.criteria.losses`) writes gradients and hessians into an ``(n, 2K)``
channel array; :class:`forest.engine.expansion.LeafwiseGrower` grows one tree best-first
(``max_leaf_nodes``, optional ``max_depth``) from Newton gains
(:class:`forest.criteria.basic.NewtonCriterion`), one fused collective per split step; the
training scores are updated from the grower's row partition (no re-traversal) and the
validation scores by the binned predictor.

Models
    Regression: squared error. Binary classification: logistic loss, one output.
    Multiclass (``K >= 3`` classes): softmax with **vector leaves**: one tree per
    iteration whose leaves hold ``K`` values and whose split gain sums the ``K``
    Newton gains (the channels are ``K`` gradients and ``K`` hessians). This makes one
    histogram pass and one partition per iteration instead of ``K``.
Baselines
    Weighted mean, log-odds of the weighted positive rate, log of the weighted class
    priors; all from sums reduced over ranks.
Distribution
    ``fit(X, y, comm=...)``: under ``mpirun`` every rank passes its own rows. Bin edges,
    the validation split (a hash of the global row id, see :mod:`histogram.rowhash`),
    baselines, histograms and validation losses are all global, and every rank makes
    the same split decisions from identical reduced histograms, so all ranks end with
    the same model, and it is the model one process fits on all rows (up to float
    summation order, far below the 1e-12 tie tolerance).
Fitted state
    Only numpy arrays, python scalars/lists/dicts, :class:`forest.engine.tree.Tree` and
    :class:`histogram.binning.BinMapper` (model files need no pickle).
"""
import contextlib
import math

import numba
import numpy as np

from histogram.binning import BinMapper
from histogram.dtypes import MAX_CATEGORY_CODES
from histogram.kernels import BACKENDS
from histogram.rowhash import uniform
from native import collectives as col
from native.comm import world

from forest._validation import (agreed_features, check_class_labels, check_moment_sums, check_param_types,
                                check_row_count, check_target, check_weight, check_weight_total, feature_summary,
                                fit_features, is_seed, moment_sums, validate_features)
from forest.io.checkpoint import stored_seed
from forest.collective_checks import AgreedError, collective_checks, total
from forest.io.continuation import fit_fingerprint, open_stage, warm_mapper
from forest.criteria.basic import NewtonCriterion
from forest.estimators.base import ClassifierMixin, EstimatorBase, RegressorMixin, check_is_fitted
from forest.estimators.explanations import ShapMixin
from forest.engine.expansion import LeafwiseGrower
from forest.engine.growth_options import SPLIT_MODES
from forest.engine.importance import gain_importance, split_counts
from forest.criteria.losses import LogLoss, SoftmaxLoss, SquaredError
from forest.engine.partition import add_leaf_values
from forest.engine.predictor import predict_leaves, predict_values, predict_values_binned
from forest.profiling import phase
from forest.engine.quantized import GradientQuantizer, exact_sum, refit_leaves
from forest.engine.tree import pack_trees
from forest.io import model_checks, model_io

#: rowhash stream of the validation split (independent of the binning sample).
_VALIDATION_STREAM = 0x56414C  # "VAL"


@contextlib.contextmanager
def _threads(n_threads):
    """Run the block with ``n_threads`` Numba threads (None: leave as is)."""
    if n_threads is None:
        yield
        return
    old = numba.get_num_threads()
    numba.set_num_threads(max(1, min(int(n_threads), numba.config.NUMBA_NUM_THREADS)))
    try:
        yield
    finally:
        numba.set_num_threads(old)


def _finite(value):
    """Whether a real number is finite in float64 (a Python int beyond its range is not)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def _allreduce(comm, arr):
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if comm.size == 1:
        return arr
    with phase("communication"):
        return col.allreduce(comm, arr)


class _BaseGBDT(ShapMixin, EstimatorBase):
    """Shared parameters, fit loop and prediction of the two estimators."""

    _shap_kind = "margin"     # shap_values explains the raw score (forest.estimators.explanations)

    def __init__(self, *, learning_rate=0.1, n_estimators=100, max_leaf_nodes=31, max_depth=None,
                 min_samples_leaf=20, l2_regularization=0.0, min_child_weight=1e-3, min_gain_to_split=0.0,
                 max_bins=255, early_stopping="auto", validation_fraction=0.1, n_iter_no_change=10, tol=1e-7,
                 random_state=None, n_threads=None, backend="auto", split_mode="allreduce", warm_start=False,
                 quantized=False, quantized_bins=4, categorical_features="from_dtype", cat_smooth=10.0,
                 cat_l2=10.0, min_data_per_group=100, max_cat_threshold=32):
        self.categorical_features = categorical_features
        self.cat_smooth = cat_smooth
        self.cat_l2 = cat_l2
        self.min_data_per_group = min_data_per_group
        self.max_cat_threshold = max_cat_threshold
        self.learning_rate = learning_rate
        self.n_estimators = n_estimators
        self.max_leaf_nodes = max_leaf_nodes
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.l2_regularization = l2_regularization
        self.min_child_weight = min_child_weight
        self.min_gain_to_split = min_gain_to_split
        self.max_bins = max_bins
        self.early_stopping = early_stopping
        self.validation_fraction = validation_fraction
        self.n_iter_no_change = n_iter_no_change
        self.tol = tol
        self.random_state = random_state
        self.n_threads = n_threads
        self.backend = backend
        self.split_mode = split_mode
        self.warm_start = warm_start
        self.quantized = quantized
        self.quantized_bins = quantized_bins

    @property
    def _category_code_cap(self):
        """Most codes a categorical column keeps before its rarest categories fold (wide codes,
        :mod:`histogram.categories`); None (fold past ``max_bins``) on the CUDA backend, whose
        kernel takes uint8 codes only (:func:`histogram.cuda_kernels.check_narrow_codes`)."""
        return None if self.backend == "cuda" else MAX_CATEGORY_CODES

    def _category_n_codes(self):
        """Codes per feature (0 at numeric ones) for ``BinMapper.fit(n_codes=)``, or None."""
        coder = getattr(self, "category_coder_", None)
        if coder is None:
            return None
        n_codes = np.zeros(int(self.n_features_in_), dtype=np.int64)
        n_codes[coder.columns_] = coder.n_codes_
        return n_codes

    def _model_io_restore_(self):
        """Defaults for the parameters that older model files lack."""
        self.__dict__.setdefault("warm_start", False)
        self.__dict__.setdefault("quantized", False)
        self.__dict__.setdefault("quantized_bins", 4)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = True
        return tags

    # ------------------------------------------------------------------ checks
    def _check_params(self):
        """Validate the parameters before any data is touched (``TypeError`` / ``ValueError``).

        ``fit`` runs it first; ``forest-train`` and model-file loading run it too.
        """
        def need(cond, msg):
            if not cond:
                raise ValueError(msg)

        check_param_types(self, ints=("n_estimators", "min_samples_leaf", "max_bins", "n_iter_no_change",
                                      "quantized_bins", "min_data_per_group", "max_cat_threshold"),
                          optional_ints=("max_leaf_nodes", "max_depth", "n_threads"),
                          reals=("learning_rate", "l2_regularization", "min_child_weight", "min_gain_to_split",
                                 "validation_fraction", "tol", "cat_smooth", "cat_l2"))
        for name in ("cat_smooth", "cat_l2"):
            value = getattr(self, name)
            need(np.isfinite(value) and value >= 0, f"{name} must be a finite number >= 0, got {value!r}")
        need(self.min_data_per_group >= 1, f"min_data_per_group must be >= 1, got {self.min_data_per_group!r}")
        need(self.max_cat_threshold >= 1, f"max_cat_threshold must be >= 1, got {self.max_cat_threshold!r}")
        need(self.backend in BACKENDS, f"backend must be one of {BACKENDS}, got {self.backend!r}")
        need(self.split_mode in SPLIT_MODES, f"split_mode must be one of {SPLIT_MODES}, got {self.split_mode!r}")
        self._check_random_state()
        # Every real parameter must be finite: NaN fails the range checks silently
        # (tol=nan never stops early), and inf or an overflowing product makes leaf
        # values NaN, so the fit would end in a model that predicts NaN.
        for name, strict in (("learning_rate", True), ("l2_regularization", False), ("min_child_weight", False),
                             ("min_gain_to_split", False), ("tol", False)):
            value = getattr(self, name)
            need(_finite(value) and (value > 0 if strict else value >= 0),
                 f"{name} must be {'>' if strict else '>='} 0 and finite, got {value!r}")
        need(isinstance(self.n_estimators, (int, np.integer)) and self.n_estimators >= 1,
             f"n_estimators must be an int >= 1, got {self.n_estimators!r}")
        need(self.max_leaf_nodes is None or (isinstance(self.max_leaf_nodes, (int, np.integer))
                                             and self.max_leaf_nodes >= 2),
             f"max_leaf_nodes must be None or an int >= 2, got {self.max_leaf_nodes!r}")
        need(self.max_depth is None or (isinstance(self.max_depth, (int, np.integer)) and self.max_depth >= 1),
             f"max_depth must be None or an int >= 1, got {self.max_depth!r}")
        need(self.max_leaf_nodes is not None or self.max_depth is not None,
             "max_leaf_nodes and max_depth cannot both be None")
        need(isinstance(self.min_samples_leaf, (int, np.integer)) and self.min_samples_leaf >= 1,
             f"min_samples_leaf must be an int >= 1, got {self.min_samples_leaf!r}")
        need(isinstance(self.max_bins, (int, np.integer)) and 2 <= self.max_bins <= 255,
             f"max_bins must be an int in [2, 255], got {self.max_bins!r}")
        need(self.early_stopping in ("auto", True, False),
             f"early_stopping must be 'auto', True or False, got {self.early_stopping!r}")
        need(0 < self.validation_fraction < 1,
             f"validation_fraction must be in (0, 1), got {self.validation_fraction!r}")
        need(isinstance(self.n_iter_no_change, (int, np.integer)) and self.n_iter_no_change >= 1,
             f"n_iter_no_change must be an int >= 1, got {self.n_iter_no_change!r}")
        need(self.n_threads is None or (isinstance(self.n_threads, (int, np.integer)) and self.n_threads >= 1),
             f"n_threads must be None or an int >= 1, got {self.n_threads!r}")
        need(isinstance(self.quantized, (bool, np.bool_)), f"quantized must be True or False, got {self.quantized!r}")
        need(isinstance(self.quantized_bins, (int, np.integer)) and 2 <= self.quantized_bins <= 1024
             and self.quantized_bins % 2 == 0,
             f"quantized_bins must be an even int in [2, 1024], got {self.quantized_bins!r}")
        need(not self.quantized or self.split_mode == "allreduce",
             f"quantized=True needs split_mode='allreduce', got {self.split_mode!r}")
        need(not self.quantized or self.backend in ("auto", "numba", "numpy"),
             f"quantized=True runs on the CPU backends ('auto', 'numba', 'numpy'), got backend={self.backend!r}")

    def _check_random_state(self):
        """Raise ``ValueError`` unless scikit-learn's ``check_random_state`` takes ``random_state``.

        ``_seed`` keeps 31 bits of an int, so without this an int numpy cannot seed with
        (negative, or ``2**32`` and above) would be accepted here and fail elsewhere.
        """
        rs = self.random_state
        if rs is None or is_seed(rs):
            return  # the common cases, without importing scikit-learn (forest.estimators.base)
        from sklearn.utils import check_random_state

        try:
            check_random_state(rs)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"random_state must be None, an int in [0, 2**32 - 1] or a numpy RandomState, got "
                             f"{self.random_state!r}") from None

    def _seed(self, comm, checkpoint=None):
        """The fit's seed: a checkpoint's, a warm start's, ``random_state``, or one drawn on rank 0."""
        seed = stored_seed(checkpoint, comm)
        if seed is not None:
            return int(seed)
        if self._warm():
            return self._random_seed
        rs = self.random_state
        if isinstance(rs, (int, np.integer)):
            return int(rs) & 0x7FFFFFFF
        # None or a RandomState: draw once on rank 0 so every rank uses the same seed
        # (None: numpy's global RandomState, whose draws np.random.randint makes, the
        # generator scikit-learn's check_random_state(None) returns).
        state = np.random if rs is None else rs
        seed = int(state.randint(0, 2**31 - 1)) if comm.rank == 0 else 0
        return seed if comm.size == 1 else int(col.bcast_object(comm, seed))

    # ------------------------------------------------------------------ fit
    def _fit_inputs(self, X, y, sample_weight, binned, feature_names, comm, classifier):
        """Validate ``fit``'s arguments on every rank together (:mod:`forest.collective_checks`).

        With ``binned`` the codes define the rows and features; ``X``, if also given,
        only supplies feature names and must have the codes' shape transposed.

        Returns
        -------
        X : ndarray of float64, shape (n, n_features), or None
        y : ndarray, shape (n,)
            float64 for regression, the labels for classification.
        w : ndarray of float64, shape (n,)
        binned : tuple (BinMapper, ndarray) or None
        classes : ndarray or None
            Sorted labels seen on any rank (classification).
        """
        with collective_checks(comm) as checks:
            self._check_params()
            X, binned, n = fit_features(self, X, binned, feature_names, min_samples=1 if comm.size == 1 else 0)
            y = check_target(y, "y", n, estimator=self, dtype=None if classifier else np.float64, multi_output=False)
            if classifier:
                check_class_labels(y)
            w = check_weight(sample_weight, n)
            checks.share(rows=n, labels=np.unique(y) if classifier else None,
                         moments=moment_sums(w, None if classifier else y), **feature_summary(self))
        summaries = checks.summaries
        agreed_features(summaries, self)
        check_row_count(self, total(summaries, "rows"), 1, comm.size)
        moments = total(summaries, "moments")
        check_weight_total(moments[0])  # sum |w| = sum w: weights are non-negative
        check_moment_sums(moments)
        classes = np.unique(np.concatenate([s["labels"] for s in summaries])) if classifier else None
        return X, y, w, binned, classes

    def _warm(self):
        """Whether this fit continues the fitted model (``warm_start`` and fitted)."""
        return bool(self.warm_start) and hasattr(self, "trees_")

    def _no_progress(self, losses):
        """scikit-learn's early-stopping rule on the validation losses so far."""
        m = int(self.n_iter_no_change)
        # Stop when none of the last m iterations improved on the loss m+1 iterations
        # ago by more than tol (relative).
        return len(losses) > m and min(losses[-m:]) > losses[-m - 1] - self.tol * max(abs(losses[-m - 1]), 1.0)

    def _earlier(self, stage, warm, es):
        """Trees and boosting state to continue from (checkpoint or warm start), or None.

        Returns
        -------
        dict or None
            ``trees`` (list of Tree), ``baseline`` (ndarray), ``losses`` (list of float),
            ``stopped`` (bool).
        """
        state = None
        if warm:
            trees = list(self.trees_)
            losses = [float(v) for v in self.validation_loss_]
            state = dict(trees=trees, baseline=self.baseline_, losses=losses,
                         stopped=trees[-1].node_count == 1 or (es and self._no_progress(losses)))
        if stage is not None and stage.n_done > (len(state["trees"]) if state else 0):
            extra = stage.extra
            state = dict(trees=stage.load_trees(), baseline=np.asarray(extra["baseline"], dtype=np.float64),
                         losses=[float(v) for v in extra["losses"]], stopped=bool(extra["stopped"]))
        return state

    def _fit(self, X, y, w, comm, progress, loss, binned=None, checkpoint=None):
        """Boosting loop; ``y`` is float (regression) or class codes (classification).

        ``X`` (n, n_features) float64 or None when ``binned = (mapper, codes)`` is given;
        ``w`` (n,) the checked sample weights. A warm start or a checkpoint (:mod:`forest.io.checkpoint`) continues after the trees
        they hold: the training and validation scores are recomputed from those trees
        (each row adds the trees' values in order, as the loop does, so the same bits).
        """
        n = len(y)
        warm = self._warm()
        if warm and int(self.n_estimators) < self.n_iter_:
            raise ValueError(f"n_estimators={self.n_estimators} must be >= n_iter_={self.n_iter_} when "
                             f"warm_start=True")
        offset, n_global = col.global_row_offset(comm, n)
        seed = self._seed(comm, checkpoint)
        k = loss.n_outputs

        es = self.early_stopping is True or (self.early_stopping == "auto" and n_global > 10_000)
        if es:
            gid = np.arange(offset, offset + n, dtype=np.int64)
            val = uniform(seed, _VALIDATION_STREAM, gid) < self.validation_fraction
            n_val = int(_allreduce(comm, np.array([val.sum()], dtype=np.float64))[0])
            es = 0 < n_val < n_global
        if warm and es != self.do_early_stopping_:
            raise ValueError("warm start cannot switch early stopping on or off (early_stopping, or the row count "
                             "changed)")
        # Bin edges come from all rows of X, validation rows included (unsupervised;
        # it avoids a float64 copy of the training rows, 200 MB at 1M x 28, and makes
        # fit(X) and fit(binned=(mapper fitted on X, codes)) the same model). The
        # validation split then selects columns of the uint8 codes.
        if binned is None:
            with phase("binning"):
                mapper = self.bin_mapper_ if warm else \
                    BinMapper(max_bins=int(self.max_bins), random_state=seed).fit(
                        X, comm=comm, categorical=getattr(self, "is_categorical_", None),
                        n_codes=self._category_n_codes())
                codes = mapper.transform(X)
        else:
            mapper, codes = binned
            if warm:
                warm_mapper(self, binned)
        self.bin_mapper_ = mapper
        stage = open_stage(checkpoint, comm, self, stage="boosting", n_total=int(self.n_estimators), seed=seed,
                           fingerprint=lambda: fit_fingerprint(
                               self, comm, np.arange(offset, offset + n, dtype=np.int64), n_global, codes, mapper,
                               {"y": y, "sample_weight": w}))
        if es:
            train = ~val
            binned_tr, binned_val = codes[:, train], codes[:, val]
            y_tr, w_tr = y[train], w[train]
        else:
            binned_tr, binned_val = codes, None
            y_tr, w_tr = y, w
        del codes

        quantizer = None
        if self.quantized:
            gid_tr = np.arange(offset, offset + n, dtype=np.int64)
            gid_tr = gid_tr[train] if es else gid_tr
            quantizer = GradientQuantizer(comm, gid_tr, n_global - (n_val if es else 0), int(self.quantized_bins),
                                          seed)
        earlier = self._earlier(stage, warm, es)
        if earlier is None:
            if quantizer is not None:
                # Exact sums: the quantized model is the same bits on any rank count.
                sums = exact_sum(comm, loss.baseline_terms(y_tr, w_tr), quantizer.n_global)
            else:
                sums = _allreduce(comm, loss.baseline_sums(y_tr, w_tr))
            self.baseline_ = loss.baseline(sums)
            trees, stop = [], False
        else:
            self.baseline_ = earlier["baseline"]
            trees, stop = list(earlier["trees"]), earlier["stopped"]
        raw = np.tile(self.baseline_, (len(y_tr), 1))
        if trees:
            predict_values_binned(pack_trees(trees), binned_tr, mapper.missing_bin_, out=raw)
        criterion = NewtonCriterion(k, self.l2_regularization, self.min_samples_leaf, self.min_child_weight,
                                    float(self.cat_smooth), float(self.cat_l2), int(self.min_data_per_group),
                                    int(self.max_cat_threshold))
        grower = LeafwiseGrower(binned_tr, self.bin_mapper_, criterion, max_leaf_nodes=self.max_leaf_nodes,
                                max_depth=self.max_depth, min_gain=self.min_gain_to_split, comm=comm,
                                backend=self.backend, split_mode=self.split_mode, quantized=bool(self.quantized))
        channels = np.empty((len(y_tr), 2 * k))
        losses = []
        if es:
            y_val, w_val = y[val], w[val]
            raw_val = np.tile(self.baseline_, (len(y_val), 1))
            if trees:
                predict_values_binned(pack_trees(trees), binned_val, mapper.missing_bin_, out=raw_val)
                losses = list(earlier["losses"])
            else:
                losses = [self._global_loss(comm, loss, y_val, raw_val, w_val)]

        def save(complete):
            stage.save(trees[stage.n_done:], len(trees), int(self.n_estimators), complete=complete,
                       extra=dict(baseline=self.baseline_, losses=np.asarray(losses, dtype=np.float64),
                                  stopped=bool(stop)))

        # Largest |raw score| any row can reach: the baseline plus the largest value of
        # every tree. The same on every rank (the trees are), so a fit that overflows
        # raises everywhere at the same iteration.
        reach = float(np.max(np.abs(self.baseline_)))
        for earlier_tree in trees:
            reach += float(np.max(np.abs(earlier_tree.value)))
        if stage is not None and stage.n_done < len(trees):
            save(stop or len(trees) == int(self.n_estimators))  # warm trees the checkpoint lacks
        if progress is not None and trees:
            progress(len(trees), int(self.n_estimators))
        for it in range(len(trees), int(self.n_estimators) if not stop else 0):
            with phase("other"):
                loss.gradients(y_tr, raw, w_tr, channels)
            if quantizer is None:
                grown = grower.grow(channels, shrinkage=float(self.learning_rate))
            else:
                # Integer histograms grow the tree; its values come from the float sums.
                quant = quantizer.quantize(channels, it)
                grown = grower.grow(channels, shrinkage=float(self.learning_rate), quantized=quant)
                refit_leaves(grown, channels, quant, criterion, comm, float(self.learning_rate))
            tree = grown.tree
            reach = self._check_leaf_values(tree, it, reach)
            trees.append(tree)
            with phase("prediction"):
                add_leaf_values(raw, grown.rows, grown.leaf_starts, grown.leaf_stops, tree.value[grown.leaf_nodes])
            stop = tree.node_count == 1  # no admissible split: later trees would not split either
            if es:
                raw_val = predict_values_binned(tree, binned_val, self.bin_mapper_.missing_bin_, out=raw_val)
                losses.append(self._global_loss(comm, loss, y_val, raw_val, w_val))
                stop |= self._no_progress(losses)
            last = stop or it + 1 == int(self.n_estimators)
            if stage is not None and (last or (it + 1) % stage.every == 0):
                save(last)
            if progress is not None:
                progress(it + 1, int(self.n_estimators))
            if stop:
                break
        self.trees_ = trees
        self.n_iter_ = len(trees)
        self.validation_loss_ = np.asarray(losses) if es else np.zeros(0)
        self.do_early_stopping_ = bool(es)
        self.n_outputs_ = k
        self._random_seed = seed
        self._packed = pack_trees(trees)
        return self

    def _check_leaf_values(self, tree, it, reach):
        """Raise :class:`forest.collective_checks.AgreedError` (a ``ValueError``) when a new tree makes the model non-finite; returns the new reach.

        A huge ``learning_rate`` (or targets near float64's range) gives leaf values
        that are inf or NaN, or finite ones whose sum over trees overflows; the model
        would then predict NaN, and its model file would be refused as corrupted.

        Parameters
        ----------
        tree : Tree
            The tree of iteration ``it`` (0-based).
        it : int
        reach : float
            Largest ``|raw score|`` the trees before it can give a row (baseline included).

        Returns
        -------
        float
            ``reach`` plus the largest ``|value|`` of ``tree``.
        """
        with np.errstate(over="ignore", invalid="ignore"):
            largest = float(np.max(np.abs(tree.value)))
            total = reach + largest
        if not np.isfinite(total):
            what = "leaf values that are not finite" if not np.isfinite(largest) else \
                "leaf values whose sum over the trees overflows float64"
            raise AgreedError(f"boosting diverged: tree {it} has {what} (learning_rate={self.learning_rate!r}); "
                             f"lower learning_rate, raise l2_regularization or rescale y")
        return total

    @staticmethod
    def _global_loss(comm, loss, y, raw, w):
        s = _allreduce(comm, np.array([loss.loss_sum(y, raw, w), w.sum()]))
        return float(s[0] / s[1]) if s[1] > 0 else 0.0

    # ------------------------------------------------------------------ predict
    def _packed_forest(self):
        packed = getattr(self, "_packed", None)
        if packed is None:
            packed = self._packed = pack_trees(self.trees_)
        return packed

    def _check_predict_X(self, X):
        check_is_fitted(self, "trees_")
        return validate_features(self, X, reset=False)

    def _numba_threads(self):
        return _threads(self.n_threads)

    def _raw_predict(self, X):
        X = self._check_predict_X(X)
        with _threads(self.n_threads):
            out = np.tile(self.baseline_, (X.shape[0], 1))
            return predict_values(self._packed_forest(), X, out=out)

    def _staged_raw(self, X):
        X = self._check_predict_X(X)
        packed = self._packed_forest()
        with _threads(self.n_threads):
            leaves = predict_leaves(packed, X)
        raw = np.tile(self.baseline_, (X.shape[0], 1))
        offsets = packed["tree_offsets"]
        for t in range(len(offsets) - 1):
            raw = raw + packed["value"][offsets[t] + leaves[:, t]]
            yield raw

    # ------------------------------------------------------------------ importances
    @property
    def feature_importances_(self):
        """Total split gain per feature, normalised to sum to one; shape (n_features,)."""
        check_is_fitted(self, "trees_")
        return gain_importance(self.trees_, self.n_features_in_, normalize=True)

    @property
    def split_counts_(self):
        """Number of splits on each feature over all trees; int64, shape (n_features,)."""
        check_is_fitted(self, "trees_")
        return split_counts(self.trees_, self.n_features_in_)


class GBDTRegressor(RegressorMixin, _BaseGBDT):
    """Histogram gradient boosting for regression (squared error).

    Parameters
    ----------
    learning_rate : float, default 0.1
        Shrinkage applied to every leaf value. Like every real parameter it must be
        finite; a fit whose leaf values overflow float64 raises ``ValueError``.
    n_estimators : int, default 100
        Boosting iterations (trees), fewer if early stopping triggers.
    max_leaf_nodes : int or None, default 31
        Leaves per tree (best-first growth).
    max_depth : int or None, default None
        Depth limit (root = 0 edges); None: only ``max_leaf_nodes`` limits.
    min_samples_leaf : int, default 20
        Fewest training rows per leaf (over all ranks).
    l2_regularization : float, default 0.0
        L2 penalty on leaf values (``lambda`` in ``G^2 / (H + lambda)``).
    min_child_weight : float, default 1e-3
        Fewest hessian mass per leaf.
    min_gain_to_split : float, default 0.0
        A split needs a gain above this.
    max_bins : int, default 255
        Value bins per feature (one more bin holds missing values).
    early_stopping : 'auto' or bool, default 'auto'
        'auto' enables it when there are more than 10 000 rows (over all ranks).
    validation_fraction : float, default 0.1
        Share of rows held out for early stopping (chosen by a hash of the global row
        id, so the same rows whatever the number of ranks).
    n_iter_no_change : int, default 10
    tol : float, default 1e-7
        Relative improvement of the validation loss that counts as progress.
    categorical_features : "from_dtype", list of str or int, array-like of bool, or None, default "from_dtype"
        Columns split by category subsets instead of thresholds (README, "Categorical
        features"): ``"from_dtype"`` takes pandas ``category`` and string columns, object
        columns of strings and Arrow ``dictionary``/string columns; or name them, give their
        indices or a boolean mask; ``None``: every column is numeric. A category unseen in
        training goes where missing values go. ``is_categorical_`` and ``category_coder_`` (set when
        there are categorical columns) record them. A column of more than ``max_bins``
        categories keeps one code per category (up to 4,095, past which the rarest share
        one; wide codes: the binned matrix is then uint16 and every histogram as wide as
        that column); on ``backend='cuda'`` such a column folds into ``max_bins`` codes
        instead (``histogram.categories``).
    cat_smooth : float, default 10.0
        Added to a category's hessian sum when a node's categories are ordered for a split,
        so a category of few rows does not sort to an end on noise; categories of fewer rows
        than this in the node are not ordered and stay off the small side (LightGBM's
        ``cat_smooth``, both uses).
    cat_l2 : float, default 10.0
        L2 regularisation added to the gain of categorical splits (LightGBM's ``cat_l2``).
    min_data_per_group : int, default 100
        A categorical split is tried only where the categories added to its small side
        since the last try hold this many rows (LightGBM's ``min_data_per_group``).
    max_cat_threshold : int, default 32
        Most categories on the small side of a categorical split: the lowest or the highest
        of the node's ordered categories (LightGBM's ``max_cat_threshold``).
    random_state : int in [0, 2**32 - 1], RandomState or None
        Seeds binning subsample and validation split (what scikit-learn's
        ``check_random_state`` accepts).
    n_threads : int or None
        Numba threads during fit/predict (None: Numba's current setting).
    backend : {'auto', 'numba', 'numpy', 'cuda'}
        Histogram backend.
    split_mode : {'allreduce', 'reduce_scatter'}
        How histograms are combined across ranks (see :mod:`forest.engine.reducers`).
    warm_start : bool, default False
        When True and the model is fitted, ``fit`` keeps its trees, bin edges, seed,
        baseline and validation losses and boosts on up to ``n_estimators``: the trees
        are those of a single fit with that ``n_estimators`` (one that stopped early
        stays as it is).
    quantized : bool, default False
        Quantized training (as LightGBM's ``use_quantized_grad``): each iteration
        rounds gradients and hessians stochastically to ``quantized_bins`` integer
        levels (global per-iteration scales; noise keyed by the seed, the iteration
        and the global row id), trees grow from exact integer histograms (one
        integer add per row and feature, narrow integer collectives: the model is
        the same bits on any number of ranks), and the leaf values are then refit
        from the full-precision gradients. ``min_child_weight`` and the hessian
        share behind ``min_samples_leaf`` see the quantized hessians during the
        split search. Needs ``split_mode='allreduce'`` and a CPU backend.
    quantized_bins : int, default 4
        Gradient levels of quantized training (even; hessians get ``quantized_bins``
        levels on ``[0, max h]``, gradients ``quantized_bins / 2`` on each side of 0).

    Attributes
    ----------
    trees_ : list of Tree
    baseline_ : ndarray of float64, shape (1,)
    bin_mapper_ : BinMapper
    n_iter_ : int
    validation_loss_ : ndarray, shape (n_iter_ + 1,) or (0,)
        Mean validation loss after each iteration (index 0: the baseline).
    feature_importances_ : ndarray, shape (n_features,)
    split_counts_ : ndarray of int64, shape (n_features,)
    n_features_in_ : int
    feature_names_in_ : ndarray of str
        Only when fitted on a table with string column names.
    """

    def fit(self, X, y, sample_weight=None, *, comm=None, progress=None, binned=None, feature_names=None,
            checkpoint=None):
        """Fit on this rank's rows.

        Input checks are collective (:mod:`forest.collective_checks`): when any rank's
        input is bad, every rank raises the same ``ValueError`` naming that rank.

        Parameters
        ----------
        X : array-like, pandas DataFrame or pyarrow Table, shape (n, n_features), or None
            NaN / null means missing. May be None when ``binned`` is given.
        y : array-like, shape (n,)
        sample_weight : array-like, shape (n,), optional
        comm : native.comm.Communicator, optional
            None means ``native.comm.world()`` (every rank of an mpirun job calls fit).
        progress : callable, optional
            ``progress(n_trees_done, n_trees_total)``, called on every rank.
        binned : tuple (BinMapper, ndarray), optional
            Pre-binned rows ``(mapper, codes)``: ``mapper`` a fitted
            :class:`histogram.binning.BinMapper` (the same on every rank), ``codes`` the
            uint8 array of shape (n_features, n) from ``mapper.transform(X)``. The
            mapper is used as given (no refit); early stopping holds out columns of
            ``codes``; ``n_features_in_`` comes from ``codes``. ``X`` may then be None
            (if given, it only supplies feature names and must have shape ``codes.shape[::-1]``).
        feature_names : sequence of str, optional
            Names of the binned features (``feature_names_in_``) when ``X`` is None.
        checkpoint : str, os.PathLike or forest.io.checkpoint.Checkpoint, optional
            Directory where rank 0 writes the trees and the boosting state every
            ``Checkpoint.every`` iterations (default 10); a fit whose directory holds a
            checkpoint of the same data and parameters resumes from it, on any number of
            ranks (:mod:`forest.io.checkpoint`).

        Returns
        -------
        self
        """
        comm = world() if comm is None else comm
        X, y, w, binned, _ = self._fit_inputs(X, y, sample_weight, binned, feature_names, comm, classifier=False)
        with _threads(self.n_threads):
            return self._fit(X, y, w, comm, progress, SquaredError(), binned, checkpoint)

    def predict(self, X):
        """Predicted values, shape (n,)."""
        return self._raw_predict(X)[:, 0]

    def staged_predict(self, X):
        """Predictions after each iteration: a generator of arrays of shape (n,)."""
        for raw in self._staged_raw(X):
            yield raw[:, 0].copy()


class GBDTClassifier(ClassifierMixin, _BaseGBDT):
    """Histogram gradient boosting for classification (logistic / softmax).

    Binary problems use the logistic loss with one output; ``K >= 3`` classes use the
    softmax loss with vector leaves (one tree per iteration, ``K`` values per leaf).
    Parameters as :class:`GBDTRegressor`.

    Attributes
    ----------
    classes_ : ndarray, shape (n_classes,)
        Sorted class labels seen on any rank.
    n_classes_ : int
    trees_, baseline_, bin_mapper_, n_iter_, validation_loss_, feature_importances_,
    split_counts_, n_features_in_, feature_names_in_
        As in :class:`GBDTRegressor`; ``baseline_`` has shape (1,) or (n_classes,).
    """

    def fit(self, X, y, sample_weight=None, *, comm=None, progress=None, binned=None, feature_names=None,
            checkpoint=None):
        """Fit on this rank's rows; see :meth:`GBDTRegressor.fit` (``binned``, ``feature_names``,
        ``checkpoint`` included)."""
        comm = world() if comm is None else comm
        X, y, w, binned, classes = self._fit_inputs(X, y, sample_weight, binned, feature_names, comm,
                                                    classifier=True)
        if len(classes) < 2:
            raise ValueError(f"GBDTClassifier needs at least 2 classes in y, got {len(classes)} class")
        if self._warm() and not np.array_equal(classes, self.classes_):
            raise ValueError(f"warm start: y has classes {classes.tolist()}, the model was fitted on "
                             f"{self.classes_.tolist()}")
        self.classes_ = classes
        self.n_classes_ = len(classes)
        codes = np.searchsorted(classes, y).astype(np.float64)
        loss = LogLoss() if self.n_classes_ == 2 else SoftmaxLoss(self.n_classes_)
        with _threads(self.n_threads):
            return self._fit(X, codes, w, comm, progress, loss, binned, checkpoint)

    def _proba_from_raw(self, raw):
        return LogLoss.proba(raw) if self.n_classes_ == 2 else SoftmaxLoss.proba(raw)

    def decision_function(self, X):
        """Raw scores: shape (n,) for two classes (log-odds of ``classes_[1]``), else (n, n_classes)."""
        raw = self._raw_predict(X)
        return raw[:, 0] if self.n_classes_ == 2 else raw

    def predict_proba(self, X):
        """Class probabilities, shape (n, n_classes)."""
        return self._proba_from_raw(self._raw_predict(X))

    def predict(self, X):
        """Predicted class labels, shape (n,)."""
        proba = self.predict_proba(X)  # checks fitted before classes_ is read
        return self.classes_[np.argmax(proba, axis=1)]

    def staged_decision_function(self, X):
        for raw in self._staged_raw(X):
            yield raw[:, 0].copy() if self.n_classes_ == 2 else raw.copy()

    def staged_predict_proba(self, X):
        for raw in self._staged_raw(X):
            yield self._proba_from_raw(raw)

    def staged_predict(self, X):
        """Predicted labels after each iteration: a generator of arrays of shape (n,)."""
        for proba in self.staged_predict_proba(X):
            yield self.classes_[np.argmax(proba, axis=1)]


# Model files name it as they always have (forest.io.model_io.register); its restored state's checks.
model_io.register(GBDTRegressor, name="forest.gbdt.GBDTRegressor", check=model_checks.check_gbdt_regressor)
model_io.register(GBDTClassifier, name="forest.gbdt.GBDTClassifier", check=model_checks.check_gbdt_classifier)

"""Continuing a fit: what warm start and checkpoint resume share in the estimators.

This module owns the rules for taking up a fit where an earlier one stopped, whether
the earlier trees come from the estimator itself (``warm_start=True``, scikit-learn's
convention: raise ``n_estimators`` and call ``fit`` again) or from a checkpoint
directory (:mod:`forest.io.checkpoint`):

- the earlier trees are kept as they are (same bits), later trees are grown with
  the same seed and tree indices, so the result is the single fit with the larger
  ``n_estimators``;
- per-row state is recomputed from the trees (out-of-bag sums here, boosting scores
  in :mod:`forest.estimators.gbdt`), never stored;
- a checkpointed fit that starts from warm trees first writes them, so a crash after
  it resumes with them.

Warm start keeps what fixes the earlier trees: the bin mapper, the seed and the
sampling (``random_state``, ``max_samples``, ``honest``, ``honesty_fraction``,
``ci_group_size`` cannot change between the fits), and for a causal forest the
nuisance estimates.
"""
import warnings

from forest.engine.subsample import little_bag_size
from forest.io.checkpoint import Stage, as_checkpoint, open_run
from forest.io.fingerprint import data_fingerprint, mapper_digest
from forest.engine.honest_forest import ForestStart, fit_binning, oob_sums_binned
from forest.engine.tree import pack_trees, unpack_trees

#: Fitted ``sampling_`` keys a warm start must not change.
SAMPLING_KEYS = ("seed", "sample_fraction", "ci_group_size", "honest", "honesty_fraction", "clusters")


def forest_sampling(est, seed, clustered):
    """The ``sampling_`` dict of a forest fit (what decides each tree's rows)."""
    return dict(seed=int(seed), sample_fraction=float(est.max_samples), ci_group_size=little_bag_size(est.ci_group_size, est.max_samples),
                honest=bool(est.honest), honesty_fraction=float(est.honesty_fraction), clusters=bool(clustered))


def begin_forest(est, X, codes_given, n_features, seed, comm, clustered=False):
    """Sampling, warm-start trees and binned features of a forest fit.

    Parameters
    ----------
    est : RegressionForest or CausalForest
    X : ndarray of float64, shape (n_local, n_features), or None
    codes_given : tuple (BinMapper, ndarray) or None
        ``fit``'s ``binned`` argument, checked.
    n_features : int
    seed : int
    comm : native.comm.Communicator
    clustered : bool
        Whether the fit samples by cluster.

    Returns
    -------
    tuple or None
        ``(sampling, earlier, mapper, codes)`` (``earlier``: warm-start trees or
        None), or None when a warm start has no tree to add (``fit`` returns at once).
    """
    sampling = forest_sampling(est, seed, clustered)
    n_fitted = len(est.estimators_["tree_offsets"]) - 1 if hasattr(est, "estimators_") else None
    earlier = warm_trees(est, n_fitted, n_features, sampling)
    if earlier is not None and nothing_to_add(n_fitted, est.n_estimators):
        return None
    if earlier is not None:
        mapper = warm_mapper(est, codes_given)
        codes = codes_given[1] if codes_given is not None else mapper.transform(X)
    elif codes_given is not None:
        mapper, codes = codes_given
    else:
        mapper, codes = fit_binning(X, est.max_bins, seed, comm, getattr(est, "is_categorical_", None))
    return sampling, earlier, mapper, codes


def warm_trees(est, n_fitted, n_features, sampling):
    """Trees of a fitted forest that ``fit`` continues, or None for a fresh fit.

    Parameters
    ----------
    est : RegressionForest or CausalForest
    n_fitted : int or None
        Trees the estimator holds (None if it is not fitted).
    n_features : int
        Features of the new input.
    sampling : dict
        The sampling this fit would use (``sampling_`` form).

    Returns
    -------
    list of Tree or None

    Raises
    ------
    ValueError
        ``n_estimators`` below the trees held, another feature count, changed
        sampling, or a merged forest.
    """
    if not getattr(est, "warm_start", False) or n_fitted is None:
        return None
    if "segments" in est.sampling_:
        raise ValueError("warm start cannot continue a merged forest (its trees come from several seeds)")
    if est.n_estimators < n_fitted:
        raise ValueError(f"n_estimators={est.n_estimators} must be >= the {n_fitted} trees already fitted when "
                         f"warm_start=True")
    fitted_features = int(est.bin_mapper_.n_features_in_)    # fit's input checks already reset n_features_in_
    if n_features != fitted_features:
        raise ValueError(f"warm start: X has {n_features} features, the forest was fitted with {fitted_features}")
    changed = [k for k in SAMPLING_KEYS if est.sampling_.get(k, False) != sampling[k]]
    if changed:
        raise ValueError(f"warm start cannot change the sampling of the trees already grown ({changed[0]}: "
                         f"{est.sampling_[changed[0]]!r} -> {sampling[changed[0]]!r})")
    return unpack_trees(est.estimators_)


def nothing_to_add(n_fitted, n_estimators):
    """Warn and return True when a warm start has no tree to add (scikit-learn's behaviour)."""
    if n_fitted == n_estimators:
        warnings.warn("Warm-start fitting without increasing n_estimators does not fit new trees.", UserWarning,
                      stacklevel=4)
        return True
    return False


def warm_mapper(est, binned):
    """The fitted bin mapper a warm start bins with; a given ``(mapper, codes)`` must use the same edges."""
    if binned is not None and mapper_digest(binned[0]) != mapper_digest(est.bin_mapper_):
        raise ValueError("warm start: the binned input uses other bin edges than the fitted forest")
    return est.bin_mapper_


def open_stage(checkpoint, comm, est, *, stage, n_total, fingerprint, seed=None, unit="trees"):
    """The checkpoint stage a fit uses, or None without a checkpoint (collective).

    Parameters
    ----------
    checkpoint : None, str, os.PathLike, Checkpoint or Stage
        A :class:`forest.io.checkpoint.Stage` (a causal forest hands one to each
        nuisance forest) is used as is; anything else opens the directory, checking it
        against ``est`` and the data.
    comm : native.comm.Communicator
    est : estimator
    stage : str
    n_total : int
    fingerprint : callable
        ``fingerprint() -> dict`` (:func:`fit_fingerprint`), called only
        when a directory is opened.
    seed : int, optional
    unit : str

    Returns
    -------
    forest.io.checkpoint.Stage or None
    """
    checkpoint = as_checkpoint(checkpoint)
    if checkpoint is None or isinstance(checkpoint, Stage):
        return checkpoint
    return open_run(checkpoint, comm, est, fingerprint(), main_stage=stage, n_main=n_total, seed=seed,
                    unit=unit).stage(stage)


def fit_fingerprint(est, comm, gids, n_global, codes, mapper, columns):
    """:func:`forest.io.fingerprint.data_fingerprint` of a fit, with the estimator's feature names (collective)."""
    return data_fingerprint(comm, gids, n_global, codes, mapper, columns,
                            feature_names=getattr(est, "feature_names_in_", None))


def continue_forest(stage, earlier, *, binned, missing_bin, gids, sampling, n_estimators, oob, clusters=None):
    """Where a forest's growth loop starts, and its per-batch checkpoint hook.

    Parameters
    ----------
    stage : forest.io.checkpoint.Stage or None
    earlier : list of Tree or None
        Warm-start trees (tree indices 0..len-1).
    binned : ndarray of uint8, shape (n_features, n_local)
    missing_bin : int
    gids : ndarray of int64, shape (n_local,)
    sampling : dict
    n_estimators : int
    oob : bool
        Whether the loop accumulates out-of-bag sums (recomputed here for earlier trees).
    clusters : forest.engine.clusters.ClusterLayout, optional

    Returns
    -------
    start : forest.engine.honest_forest.ForestStart or None
    on_batch : callable or None
        For :func:`forest.engine.honest_forest.grow_honest_forest`.
    """
    trees = list(earlier or [])
    if stage is not None and stage.n_done > len(trees):
        trees = stage.load_trees()
    if len(trees) > n_estimators:
        raise ValueError(f"{len(trees)} trees are already grown, more than n_estimators={n_estimators}")
    if stage is not None and stage.n_done < len(trees):
        # Warm trees the checkpoint lacks: write them first, so a crash keeps them.
        stage.save(trees[stage.n_done:], len(trees), n_estimators, complete=len(trees) == n_estimators)
    start = None
    if trees:
        acc, cnt = oob_sums_binned(pack_trees(trees), binned, missing_bin, gids, sampling, clusters) if oob \
            else (None, None)
        start = ForestStart(trees, acc, cnt, stage.batch_size if stage is not None else None)
    on_batch = None
    if stage is not None:
        def on_batch(new_trees, n_done, batch_size):
            stage.save(new_trees, n_done, n_estimators, batch_size=batch_size, complete=n_done == n_estimators)
    return start, on_batch


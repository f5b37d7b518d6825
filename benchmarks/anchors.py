"""The anchor libraries, configured the way the benchmarks compare against them.

This module owns the settings of every reference implementation (which parameters
make "100 trees, 31 leaves, 255 bins, lr 0.1, 2 threads" mean the same thing in each
library) so both benchmark scripts use one definition. Each ``*_fit`` function times
the library's whole training call, including its own binning / dataset construction,
because histforest's ``fit`` includes binning too. Imports are local: a benchmark
process imports only the library it runs.

Anchors: LightGBM (GBDT, random-forest mode, socket data-parallel learner), XGBoost
``hist``, scikit-learn ``HistGradientBoostingClassifier`` and EconML's
``econml.grf.CausalForest``.
"""
import time

import numpy as np


def _timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


# --------------------------------------------------------------------------- LightGBM

def lightgbm_gbdt_params(threads=2, n_trees=100, num_leaves=31, max_bin=255, learning_rate=0.1,
                         min_data_in_leaf=20, seed=0):
    """LightGBM parameters of the GBDT comparison (binary log-loss).

    Returns
    -------
    (dict, int)
        Parameter dict for ``lightgbm.train`` and the number of boosting rounds.
    """
    params = {
        "objective": "binary",
        "num_leaves": int(num_leaves),
        "max_bin": int(max_bin),
        "learning_rate": float(learning_rate),
        "min_data_in_leaf": int(min_data_in_leaf),
        "num_threads": int(threads),
        "seed": int(seed),
        "deterministic": True,
        "force_col_wise": True,  # skip LightGBM's row/col-wise timing probe
        "verbosity": -1,
    }
    return params, int(n_trees)


def lightgbm_fit(X, y, params, n_trees):
    """Train a LightGBM booster (Dataset construction included in the time).

    Parameters
    ----------
    X : ndarray of shape (n, d)
    y : ndarray of shape (n,)
    params : dict
    n_trees : int

    Returns
    -------
    booster : lightgbm.Booster
    fit_s : float
    """
    import lightgbm as lgb

    def fit():
        data = lgb.Dataset(X, label=y, params={"max_bin": params["max_bin"], "verbosity": -1},
                           free_raw_data=True)
        return lgb.train(params, data, num_boost_round=n_trees)

    return _timed(fit)


def lightgbm_predict(booster, X):
    """Predicted probability (binary) or value (regression), shape (n,), and seconds."""
    return _timed(booster.predict, X)


def lightgbm_rf_params(threads=2, n_trees=200, num_leaves=31, max_bin=255, bagging_fraction=0.5,
                       feature_fraction=1.0, min_data_in_leaf=5, seed=0):
    """LightGBM random-forest mode (``boosting="rf"``), the C++ histogram reference.

    Each tree sees a ``bagging_fraction`` row subsample (redrawn every tree) and a
    ``feature_fraction`` of the columns, grows to ``num_leaves`` leaves on the raw
    outcome (L2), and the forest averages the trees.

    Returns
    -------
    (dict, int)
    """
    params = {
        "objective": "regression",
        "boosting": "rf",
        "num_leaves": int(num_leaves),
        "max_bin": int(max_bin),
        "bagging_fraction": float(bagging_fraction),
        "bagging_freq": 1,
        "feature_fraction_bynode": float(feature_fraction),
        "min_data_in_leaf": int(min_data_in_leaf),
        "num_threads": int(threads),
        "seed": int(seed),
        "deterministic": True,
        "force_col_wise": True,
        "verbosity": -1,
    }
    return params, int(n_trees)


def lightgbm_data_parallel_params(rank, size, ports, threads=1, **gbdt_kwargs):
    """LightGBM's socket data-parallel learner, one local process per machine.

    Parameters
    ----------
    rank, size : int
        This process's index and the number of processes.
    ports : list of int
        One free localhost port per process.
    threads : int
    **gbdt_kwargs
        Forwarded to :func:`lightgbm_gbdt_params`.

    Returns
    -------
    (dict, int)
    """
    params, n_trees = lightgbm_gbdt_params(threads=threads, **gbdt_kwargs)
    params.update({
        "tree_learner": "data",
        "num_machines": int(size),
        "machines": ",".join(f"127.0.0.1:{p}" for p in ports),
        "local_listen_port": int(ports[rank]),
        # Each process holds only its own rows; LightGBM must not re-partition them.
        "pre_partition": True,
        "time_out": 10,
    })
    return params, n_trees


# --------------------------------------------------------------------------- XGBoost

def xgboost_fit(X, y, threads=2, n_trees=100, max_leaves=31, max_bin=256, learning_rate=0.1,
                seed=0, extra=None):
    """XGBoost ``hist`` grown leaf-wise (``lossguide``, ``max_leaves``), binary log-loss.

    XGBoost's ``max_bin`` counts all bins, so 256 matches 255 value bins elsewhere.
    ``extra`` (dict, optional) overrides or adds booster parameters (e.g. ``lambda``,
    ``min_child_weight``, whose XGBoost defaults 1 and 1 differ from the other libraries').

    Returns
    -------
    booster : xgboost.Booster
    fit_s : float
    """
    import xgboost as xgb

    params = {
        "objective": "binary:logistic",
        "tree_method": "hist",
        "grow_policy": "lossguide",
        "max_leaves": int(max_leaves),
        "max_depth": 0,
        "max_bin": int(max_bin),
        "eta": float(learning_rate),
        "nthread": int(threads),
        "seed": int(seed),
        "verbosity": 0,
    }
    params.update(extra or {})

    def fit():
        dtrain = xgb.QuantileDMatrix(X, label=y, max_bin=int(max_bin), nthread=int(threads))
        return xgb.train(params, dtrain, num_boost_round=int(n_trees))

    return _timed(fit)


def xgboost_predict(booster, X, threads=2):
    """Predicted probabilities, shape (n,), and seconds (DMatrix construction included)."""
    import xgboost as xgb

    return _timed(lambda: booster.predict(xgb.DMatrix(X, nthread=int(threads))))


# --------------------------------------------------------------------------- scikit-learn

def sklearn_hgb_fit(X, y, threads=2, n_trees=100, max_leaf_nodes=31, max_bins=255, learning_rate=0.1,
                    min_samples_leaf=20, seed=0):
    """scikit-learn ``HistGradientBoostingClassifier`` with early stopping off.

    Its OpenMP pool is capped with threadpoolctl (and ``OMP_NUM_THREADS`` set by the
    harness before import).

    Returns
    -------
    model : HistGradientBoostingClassifier
    fit_s : float
    """
    from sklearn.ensemble import HistGradientBoostingClassifier
    from threadpoolctl import threadpool_limits

    model = HistGradientBoostingClassifier(
        max_iter=int(n_trees), max_leaf_nodes=int(max_leaf_nodes), max_bins=int(max_bins),
        learning_rate=float(learning_rate), min_samples_leaf=int(min_samples_leaf),
        early_stopping=False, random_state=seed)
    with threadpool_limits(limits=int(threads), user_api="openmp"):
        return _timed(model.fit, X, y)


def sklearn_hgb_predict(model, X, threads=2):
    """P(y = 1), shape (n,), and seconds."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=int(threads), user_api="openmp"):
        proba, sec = _timed(model.predict_proba, X)
    return proba[:, 1], sec


# --------------------------------------------------------------------------- EconML

def econml_causal_forest_fit(X, t, y, threads=2, n_estimators=200, min_samples_leaf=5,
                             max_samples=0.5, honest=True, mtry=None, seed=0):
    """EconML's GRF port ``econml.grf.CausalForest`` (no local centering of y or t).

    Parameters
    ----------
    X : ndarray of shape (n, d)
    t : ndarray of shape (n,)
    y : ndarray of shape (n,)
    threads : int
        ``n_jobs`` (joblib processes/threads over trees).
    n_estimators, min_samples_leaf, max_samples, honest
        As in GRF: ``max_samples`` is the subsample fraction per tree (drawn without
        replacement), half of which grows the structure under honesty.
    mtry : int or None
        Features tried per split (``max_features``); None means GRF's default
        ``min(ceil(sqrt(d) + 20), d)``.
    seed : int

    Returns
    -------
    model : econml.grf.CausalForest
    fit_s : float
    """
    from econml.grf import CausalForest

    d = X.shape[1]
    max_features = mtry if mtry is not None else min(int(np.ceil(np.sqrt(d) + 20)), d)
    # econml requires n_estimators divisible by its inference subforest size (default 4).
    model = CausalForest(n_estimators=int(n_estimators), min_samples_leaf=int(min_samples_leaf),
                         max_samples=float(max_samples), honest=bool(honest),
                         max_features=int(max_features), n_jobs=int(threads), random_state=seed,
                         inference=False)
    return _timed(model.fit, X, t, y)


def econml_causal_forest_predict(model, X):
    """tau-hat, shape (n,), and seconds."""
    tau, sec = _timed(model.predict, X)
    return np.asarray(tau).reshape(X.shape[0], -1)[:, 0], sec

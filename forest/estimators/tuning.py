"""``tune_parameters=``: grf's parameter tuning for the regression, causal and instrumental forests.

How a forest with ``tune_parameters`` set fits (grf's ``tune_forest``, on our engine):

1. **Probe.** A small forest (``tune_num_trees`` trees) with the parameters as given is
   fitted from ``X`` like any fit: it bins the features and, for the causal and
   instrumental forests, fits the nuisance forests (with the tree count the full fit
   will use). Their out-of-bag estimates centre every later forest, so all candidates
   are judged on the same residuals; the binned codes are reused (no re-binning).
2. **Draws.** ``tune_num_reps`` points ``u`` of the unit cube (one coordinate per tuned
   parameter, from the estimator's seed, the same on every rank) become parameter
   values by grf's maps (:data:`SPACE`: e.g. ``min_samples_leaf = floor(2^(u (log2 n -
   4))) + 1``, ``max_samples = 0.05 + (cap - 0.05) u``). A small forest is fitted at each;
   its *debiased* out-of-bag error is one number, the same on every rank (global sums).
3. **Smoothing.** A kriging model of error against ``u`` (:mod:`forest.analysis.kriging`,
   grf's choice) is fitted to those errors and evaluated at ``tune_num_draws`` more
   points; the lowest predicted error wins. One rank computes it and broadcasts the
   choice, so every rank fits the same forest whatever its floating-point libraries.
4. **Check.** A small forest at the winner is refitted; if its error is not below the
   probe's (the parameters as given), the given parameters are kept (grf's rule: tuning
   never returns something it measured to be worse).
5. **Fit.** The full forest is fitted with the chosen values; for the causal and
   instrumental forests with the probe's nuisance estimates, and the probe's nuisance
   forests become the model's (``outcome_forest_``, ...), so held-out analyses work as
   after any fit.

Centring (the causal forest; part of ``"all"``, or ``"nuisance"`` in a ``tune_parameters``
list): after the probe, each centring estimate the user did not give gets a candidate
correction: the nuisance forest's out-of-bag local linear correction (grf's
``ll_regression_forest`` prediction:
:meth:`~forest.estimators.local_linear.LocalLinearMixin.tune_local_linear`, every penalty of
:data:`NUISANCE_LAMBDAS`) with the lowest out-of-bag squared error over all ranks' rows
(weighted by the sample weights), if lower than the forest's own. Propensities of binary and
categorical treatments are clipped to [0, 1] (a 0/1 target is never further from a
clipped value). Where a correction is lower, the corrected centring (those estimates
replaced) competes with the forests' centring on what matters, the effect: small effect
forests at the given parameters (two halves, as every candidate below) are fitted on each,
and their out-of-bag effects are scored by the R-loss against one fixed reference, the
corrected centring (:meth:`_Tuner._choose_centring` says why that reference); the
corrected one is used only if its loss is strictly lower. Every later candidate is then
judged on the chosen centring. A lower nuisance error alone does not mean a better
effect: on IHDP surface A (outcome linear in x) the corrections lowered the tuned PEHE
from 0.285 to 0.188, on surface B (exponential control surface) they raised it from 2.37
to 2.49 while lowering the outcome's out-of-bag error by a third. The nuisance error is
lower on both; the R-loss took the corrections on 17 of 20 draws of A and 7 of 20 of B,
for tuned PEHEs of 0.197 and 2.39 (``benchmarks/RESULTS.md``, "Parameter tuning (issue 35)"). A corrected estimate cannot be recomputed from the model (the correction
needs the training rows): its forest is not kept (its attribute is None, as with a given
``y_hat``), and ``nuisance_`` records it as ``{"source": "local linear forest", "seed",
"ll_lambda"}``.

Errors (what is minimised):

regression forest
    the mean of grf's debiased out-of-bag squared error
    (:meth:`~forest.estimators.regression_variance.RegressionVarianceMixin.oob_error_estimates`:
    squared error minus the trees' jackknife Monte-Carlo variance), weighted by the
    sample weights.
causal and instrumental forests
    the R-loss of the out-of-bag effect, ``(Y - m(x) - tau(x) . (W - e(x)))^2``, minus its
    Monte-Carlo part. grf removes that part with a jackknife over the trees of the ratio
    estimate; here each candidate is two half forests (``tune_num_trees / 2`` trees each,
    two seeds) with out-of-bag effects ``tau_A``, ``tau_B``: the forest's effect is their
    mean and ``((tau_A - tau_B) . (W - e))^2 / 4`` estimates the squared error its finite
    number of trees adds (each half's Monte-Carlo error has twice the variance of the
    whole's), the same cost as one forest of ``tune_num_trees`` trees.

Without the debiasing, small forests with few rows per leaf would look worse than they
are (their Monte-Carlo noise is large at 200 trees and vanishes at 2,000), and tuning
would drift to large leaves.

What is recorded: ``tuned_params_`` (every tuned parameter's value in the fitted forest,
the given ones when tuning kept them) and ``tuning_`` (status, the draws and their
errors, the probe's and the winner's errors; ``"nuisance"``: each centring estimate's
model, penalty and out-of-bag errors; ``"centring"``: None where no correction was a
candidate, else the candidates' penalties, both centrings' R-losses and the one used). Both are in model files. Not checkpointed:
``checkpoint=`` applies to the final fit (a resumed job tunes again, identically).
"""
import math

import numpy as np

from native import collectives as col

from forest.analysis.kriging import fit_kriging, predict_kriging
from forest.analysis.local_linear import LAMBDA_PATH


def _min_size(u, n, d):
    return int(math.floor(2.0 ** (u * (math.log2(max(n, 2)) - 4.0)))) + 1


def _max_features(u, n, d):
    return max(1, int(math.ceil(min(d, math.sqrt(d) + 20.0) * u)))


#: Tunable parameters and grf's map from a draw ``u`` in [0, 1) (and the global row
#: count ``n``, feature count ``d``) to a value. ``max_samples`` is handled apart (its
#: cap depends on the little bags).
SPACE = {
    "min_samples_leaf": _min_size,
    "min_node_size": _min_size,
    "max_features": _max_features,
    "max_samples": None,
    "honesty_fraction": lambda u, n, d: 0.5 + 0.3 * u,
    "alpha": lambda u, n, d: u / 4.0,
    "imbalance_penalty": lambda u, n, d: -math.log(max(u, 1e-12)),
}

TUNING_PARAMS = ("tune_parameters", "tune_num_trees", "tune_num_reps", "tune_num_draws")

#: The name in ``tune_parameters`` of the centring choice (part of ``"all"``), offered by
#: estimators with ``_nuisance_targets`` (the causal forest).
NUISANCE = "nuisance"

#: Ridge penalties of the local linear nuisance candidates: grf's grid without 0 (unpenalised,
#: the local regression is singular wherever a leaf's rows share a value of a covariate, as
#: binary covariates often do).
NUISANCE_LAMBDAS = tuple(lam for lam in LAMBDA_PATH if lam > 0)


def tunable_names(est):
    """The parameters ``tune_parameters="all"`` tunes for this estimator, in a fixed order.

    The causal and instrumental forests: grf's causal-forest set (its ``honesty.prune.leaves``
    has no counterpart here). The regression forest: the same, with the size rule in use
    (``min_node_size`` when it is set, else ``min_samples_leaf``). ``honesty_fraction``
    only for honest forests.
    """
    size = "min_node_size" if getattr(est, "min_node_size", None) is not None else "min_samples_leaf"
    names = [size, "max_samples", "max_features", "alpha", "imbalance_penalty"]
    if est.honest:
        names.insert(3, "honesty_fraction")
    return names


def check_tuning_params(est):
    """Validate ``tune_parameters``, ``tune_num_trees``, ``tune_num_reps``, ``tune_num_draws``.

    Raises
    ------
    ValueError, TypeError
        With the parameter's name and what is allowed.
    """
    spec = est.tune_parameters
    if spec is not None:
        allowed = tunable_names(est) + ([NUISANCE] if hasattr(est, "_nuisance_targets") else [])
        if isinstance(spec, str):
            if spec != "all":
                raise ValueError(f"tune_parameters must be None, 'all' or a list of {allowed}, got {spec!r}")
        else:
            try:
                names = list(spec)
            except TypeError:
                raise TypeError(f"tune_parameters must be None, 'all' or a list of names, got {spec!r}") from None
            bad = [v for v in names if v not in allowed]
            if bad or not names or len(set(names)) != len(names):
                what = f"unknown {bad[0]!r}" if bad else ("an empty list" if not names else "a repeated name")
                raise ValueError(f"tune_parameters: {what}; {type(est).__name__} tunes {allowed} "
                                 f"(honesty_fraction only when honest=True)")
    for name, low in (("tune_num_trees", 4), ("tune_num_reps", 2), ("tune_num_draws", 1)):
        value = getattr(est, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def _names(est):
    """The parameters the kriging tunes (``tune_parameters`` less :data:`NUISANCE`)."""
    return tunable_names(est) if est.tune_parameters == "all" else [v for v in est.tune_parameters if v != NUISANCE]


def tunes_nuisance(est):
    """Whether tuning chooses ``est``'s nuisance models (see the module docstring)."""
    spec = est.tune_parameters
    return hasattr(est, "_nuisance_targets") and spec is not None and (spec == "all" or NUISANCE in list(spec))


def _sample_cap(est):
    """Largest ``max_samples`` a draw may give: 0.5 unless the forest has no little bags."""
    return 1.0 if est.ci_group_size == 1 else 0.5


def params_from_draws(est, names, draws, n, d):
    """Parameter values of each row of ``draws``.

    Parameters
    ----------
    est : forest estimator
    names : list of str
    draws : ndarray, shape (r, len(names))
        Points of the unit cube.
    n, d : int
        Global rows and features.

    Returns
    -------
    list of dict
    """
    out = []
    for row in np.asarray(draws, dtype=np.float64):
        values = {}
        for name, u in zip(names, row):
            if name == "max_samples":
                values[name] = 0.05 + (_sample_cap(est) - 0.05) * float(u)
            else:
                values[name] = SPACE[name](float(u), n, d)
        out.append(values)
    return out


def _global_mean(comm, losses, weights):
    """Weighted mean of the finite ``losses`` over every rank's rows (NaN if none)."""
    ok = np.isfinite(losses)
    sums = np.array([float(np.sum(weights[ok] * losses[ok])), float(np.sum(weights[ok]))])
    if comm.size > 1:
        sums = col.allreduce(comm, sums)
    return sums[0] / sums[1] if sums[1] > 0 else float("nan")


class _Tuner:
    """The small forests of one tuning run and their errors (see the module docstring)."""

    def __init__(self, est, args, comm, progress):
        self.est, self.args, self.comm, self.progress = est, args, comm, progress
        self.effect = hasattr(est, "_nuisance_specs")
        self.small_trees = int(est.tune_num_trees) // (2 if self.effect else 1)
        self.base = {**est.get_params(deep=False), "tune_parameters": None, "warm_start": False}
        self.seed = int(self.base["random_state"] or 0)
        self.done = 0
        n_fits = (est.tune_num_reps + 2 + tunes_nuisance(est)) * (2 if self.effect else 1)
        self.total = n_fits * self.small_trees + int(est.n_estimators)

    def _report(self, offset):
        if self.progress is None:
            return None
        return lambda done, _total: self.progress(offset + done, self.total)

    def _small(self, params, seed_shift, fit_args):
        small = type(self.est)(**{**self.base, **params, "n_estimators": self.small_trees, "ci_group_size": 1,
                                  "random_state": self.seed + seed_shift})
        small.fit(**fit_args, comm=self.comm, progress=self._report(self.done))
        self.done += self.small_trees
        return small

    def probe(self):
        """Fit the given parameters' first small forest from ``X``; set up the later fits' inputs."""
        args = dict(self.args)
        args.pop("checkpoint", None)
        extra = {}
        if self.effect:
            n_nuis = self.est.nuisance_estimators or max(50, int(self.est.n_estimators) // 4)
            extra["nuisance_estimators"] = int(n_nuis)
        first = self._small(extra, 0, args)
        self.first = first
        self.hats = {}
        source = first._weights_source_
        if self.effect:
            for name, _offset, _stage, attr in self.est._nuisance_specs:
                given = args.get(name)
                # the fit's own centring, bit for bit (the nuisance forest drops its out-of-bag array)
                hat = given if given is not None else getattr(first, attr).oob_prediction_binned(
                    source.codes, source.gids, source.clusters)
                hat = np.asarray(hat, dtype=np.float64)
                self.hats[name] = hat[:, 0] if hat.ndim == 2 and hat.shape[1] == 1 else hat
        self.nuisance, corrected = self._nuisance_candidates(first, args) if tunes_nuisance(self.est) else ({}, {})
        self.centring = None
        later = {k: v for k, v in args.items() if k not in ("X", "feature_names", "binned")}
        later.update(self.hats)
        # the probe's codes serve every later fit, the final one included: binning is keyed by
        # the seed every fit shares, so binning again would give these codes once more
        self.binned = later["binned"] = (first.bin_mapper_, source.codes)
        later["feature_names"] = getattr(first, "feature_names_in_", None)
        later["X"] = None
        self.later = later
        self.n_global = col.global_row_offset(self.comm, len(source.gids))[1]
        self.n_features = int(first.n_features_in_)
        if corrected:
            return self._choose_centring(first, corrected)
        return self.error({}, first=first)

    def _nuisance_candidates(self, first, args):
        """Each forest-made centring estimate's lowest-error local linear correction, where lower than the forest's.

        Returns ``({name: {"model", "ll_lambda", "errors"}}, {name: corrected estimate}}``
        (``errors``: the forest's out-of-bag error, then each penalty's; ``"reason"`` when the
        correction could not be computed; ``model`` says what the lower nuisance error chose,
        :meth:`_choose_centring` has the last word). Collective.
        """
        targets = first._nuisance_targets()
        weight = args.get("sample_weight")
        out, corrected = {}, {}
        for name, _offset, _stage, attr in self.est._nuisance_specs:
            if args.get(name) is not None or name not in targets:
                continue
            target, bounded = targets[name]
            n, width = target.shape
            w = np.ones(n) if weight is None else np.asarray(weight, dtype=np.float64).reshape(n)
            plain = self.hats[name].reshape(n, width)

            def error(pred):
                return float(_global_mean(self.comm, ((target - pred) ** 2).sum(axis=1), w))

            choice = {"model": "forest", "ll_lambda": None, "errors": [error(plain)]}
            out[name] = choice
            if args.get("X") is None:
                choice["reason"] = "binned input: the correction needs the features' values"
                continue
            try:
                # on the rows the nuisance forest grew on (it keeps no fingerprint to check rows
                # passed again against)
                path = getattr(first, attr).tune_local_linear_on_fit_rows(
                    args["X"], target, lambdas=NUISANCE_LAMBDAS, sample_weight=weight, comm=self.comm)
            except ValueError as exc:      # raised alike on every rank (collective checks)
                choice["reason"] = str(exc)
                continue
            preds = np.asarray(path.oob_predictions, dtype=np.float64).reshape(n, len(NUISANCE_LAMBDAS), width)
            best, best_pred = choice["errors"][0], None
            for j, lam in enumerate(NUISANCE_LAMBDAS):
                # a row whose local regression has no finite solution keeps the forest's estimate
                pred = np.where(np.isfinite(preds[:, j]), preds[:, j], plain)
                if bounded:
                    pred = np.clip(pred, 0.0, 1.0)
                err = error(pred)
                choice["errors"].append(err)
                if err < best:
                    best, best_pred, choice["model"], choice["ll_lambda"] = err, pred, "local linear", float(lam)
            if best_pred is not None:
                corrected[name] = best_pred.reshape(self.hats[name].shape)
        return out, corrected

    def _choose_centring(self, first, corrected):
        """The forests' centring or the corrected one (``corrected`` replacing its names), by the effect's R-loss.

        Small effect forests at the given parameters (two halves each, as :meth:`error`) are
        fitted on each centring; their out-of-bag effects are scored by one R-loss, against
        one fixed reference centring: the corrected one, every estimate at its lowest
        out-of-bag nuisance error. Sets ``self.centring`` and, where the forests' centring
        wins, puts each name's choice back to the forest. Returns the winner's error
        (:meth:`error` on its own centring, the probe's error). Collective.

        Why a fixed reference, and why that one. For a reference ``(m_r, e_r)`` and data
        ``Y = m(x) + (W - e(x)) tau*(x) + eps``, an out-of-bag effect ``tau`` (not fitted on the
        row) has the expected loss ``E[(Y - m_r - (W - e_r) tau)^2 | x] = sigma^2(x) +
        (dm - de tau)^2 + e(1 - e) (tau - tau*)^2`` with ``dm = m - m_r``, ``de = e - e_r``.
        Between two effects on the same reference, ``sigma^2`` and ``dm^2`` cancel, and what
        is left is their true error weighted by ``e(1 - e)``, plus terms in ``de dm`` and
        ``de^2``: second order in the reference's errors, so the most accurate centring we
        have (lowest out-of-bag nuisance error) distorts the comparison least, and its
        smaller residuals make the difference of the two losses least noisy (on IHDP A the
        difference's spread over draws was 0.010 with this reference, 0.015 with the
        average of the two centrings, 0.025 with the forests'). Scoring each forest on its
        own centring instead would put ``E[dm^2]``, the nuisance error itself, back into the
        comparison: that is the choice this one replaces, which could not tell IHDP's
        surface B (where the correction lowers the outcome's error and raises the effect's)
        from surface A.
        """
        # the forests' centring: the probe and its second half, as error({}, first=first) fits them
        plain_b = self._small({}, 1, self.later)
        later = {**self.later, **corrected}
        a, b = self._small({}, 0, later), self._small({}, 1, later)
        plain = first._tuning_residuals(self.later)        # (Y - m, W - e, tau, weight), forests' centring
        tau_plain_b = plain_b._tuning_residuals(self.later)[2]
        yc, wc, tau_a, weight = a._tuning_residuals(later)
        losses = [self._r_loss(yc, wc, plain[2], tau_plain_b, weight),
                  self._r_loss(yc, wc, tau_a, b._tuning_residuals(later)[2], weight)]
        use = bool(losses[1] < losses[0])
        self.centring = {"model": "local linear" if use else "forest", "reference": "local linear",
                         "r_loss": {"forest": float(losses[0]), "local linear": float(losses[1])},
                         "candidates": {name: self.nuisance[name]["ll_lambda"] for name in corrected}}
        if use:
            self.hats.update(corrected)
            self.later.update(corrected)
            return losses[1]                 # the reference is this centring: error({}) on it
        for name in corrected:
            self.nuisance[name].update(model="forest", ll_lambda=None)
        return self._r_loss(plain[0], plain[1], plain[2], tau_plain_b, plain[3])

    def _r_loss(self, yc, wc, tau_a, tau_b, weight):
        """Debiased R-loss of the half forests' mean effect (module docstring), global mean."""
        fitted = np.einsum("nk,nkm->nm", wc, 0.5 * (tau_a + tau_b))
        spread = np.einsum("nk,nkm->nm", wc, tau_a - tau_b)
        losses = ((yc - fitted) ** 2 - 0.25 * spread ** 2).sum(axis=1)
        return _global_mean(self.comm, losses, weight)

    def error(self, params, first=None):
        """Debiased out-of-bag error of a small forest (two halves for effect forests) with ``params``."""
        if not self.effect:
            small = first if first is not None else self._small(params, 0, self.later)
            debiased, _ = small.oob_error_estimates(self.args["y"], comm=self.comm, clusters=self.args.get("clusters"))
            debiased = np.asarray(debiased, dtype=np.float64).reshape(len(debiased), -1)
            weights = small._weights_source_.factor
            return _global_mean(self.comm, debiased.sum(axis=1), weights)
        a = first if first is not None else self._small(params, 0, self.later)
        b = self._small(params, 1, self.later)
        yc, wc, tau_a, weight = a._tuning_residuals(self.later)
        _, _, tau_b, _ = b._tuning_residuals(self.later)
        return self._r_loss(yc, wc, tau_a, tau_b, weight)


def _choose(names, draws, errors, rng, n_draws):
    """``(index of the lowest kriging prediction or None, candidates (n_draws, len(names)))`` (rank 0's work).

    None when fewer than two errors are finite or they are all equal (nothing to smooth).
    """
    candidates = rng.random((n_draws, len(names)))
    ok = np.isfinite(errors)
    if ok.sum() < 2 or np.ptp(errors[ok]) == 0:
        return None, candidates
    model = fit_kriging(draws[ok], errors[ok])
    return int(np.argmin(predict_kriging(model, candidates))), candidates


def fit_tuned(est, args, comm, progress=None):
    """Tune ``est``'s parameters on the data of ``args`` and fit it with the chosen ones.

    Parameters
    ----------
    est : RegressionForest, CausalForest or InstrumentalForest
        With ``tune_parameters`` set; its parameters are left as given.
    args : dict
        ``fit``'s keyword arguments (``X``, ``y``, ``t``, ``z``, ``sample_weight``, ``y_hat``, ...).
    comm : native.comm.Communicator
    progress : callable, optional
        ``progress(trees_done, trees_total)`` over every small forest and the final fit.

    Returns
    -------
    est
        Fitted, with ``tuned_params_`` and ``tuning_``.
    """
    est._check_params()
    if est.warm_start:
        raise ValueError("warm_start=True cannot be combined with tune_parameters: tuning chooses new parameters, "
                         "so the trees already grown could not be continued; fit without warm_start (or tune once, "
                         "then warm-start a forest built with tuned_params_)")
    names = _names(est)
    tuner = _Tuner(est, args, comm, progress)
    default_error = tuner.probe()
    given = {name: getattr(est, name) for name in names}
    rng = np.random.default_rng([tuner.seed, 0x7475])        # the same draws on every rank
    draws = rng.random((int(est.tune_num_reps) if names else 0, len(names)))
    drawn = params_from_draws(est, names, draws, tuner.n_global, tuner.n_features)
    errors = np.array([tuner.error(p) for p in drawn])
    pick = None
    if comm.rank == 0 and names:
        pick, candidates = _choose(names, draws, errors, rng, int(est.tune_num_draws))
        if pick is not None:
            pick = params_from_draws(est, names, candidates[pick:pick + 1], tuner.n_global, tuner.n_features)[0]
    pick = col.bcast_object(comm, pick) if comm.size > 1 else pick
    record = {"names": list(names), "draws": [dict(p) for p in drawn], "errors": errors.tolist(),
              "default_error": float(default_error), "n_trees": int(est.tune_num_trees), "nuisance": tuner.nuisance,
              "centring": tuner.centring}
    if pick is None:
        why = "the small forests' errors do not vary" if names else "no forest parameter to tune"
        chosen, record["status"], record["best_error"] = given, f"given: {why}", None
    else:
        best_error = tuner.error(pick)
        record["best_error"] = float(best_error)
        record["candidate"] = dict(pick)
        better = np.isfinite(best_error) and (not np.isfinite(default_error) or best_error < default_error)
        chosen = pick if better else given
        record["status"] = "tuned" if better else "given: the tuned parameters' error was not lower"
    final = type(est)(**{**tuner.base, **chosen})
    final_args = dict(args, binned=tuner.binned)   # with X: its names and category coder, no re-binning
    if tuner.effect:
        final_args.update(tuner.hats)
    tuner.done = tuner.total - int(est.n_estimators)
    final.fit(**final_args, comm=comm, progress=tuner._report(tuner.done))
    if tuner.effect:
        # The nuisance estimates came from the probe's forests: they are the model's.
        nuisance = dict(final.nuisance_)
        for name, _offset, _stage, attr in est._nuisance_specs:
            if args.get(name) is not None:
                continue
            choice = tuner.nuisance.get(name, {"model": "forest"})
            if choice["model"] == "forest":
                setattr(final, attr, getattr(tuner.first, attr))
                nuisance[name] = tuner.first.nuisance_[name]
            else:
                # the corrected estimates need the training rows: the forest alone would not give them
                setattr(final, attr, None)
                # (no content hash: the corrected values agree over rank counts to rounding, not bit for bit)
                nuisance[name] = {"source": "local linear forest", "seed": tuner.first.nuisance_[name]["seed"],
                                  "ll_lambda": choice["ll_lambda"]}
        nuisance["n_estimators"] = tuner.first.nuisance_["n_estimators"]
        final.nuisance_ = nuisance
    params = set(type(est)._get_param_names())
    for key in [k for k in vars(est) if k not in params]:
        delattr(est, key)
    for key, value in vars(final).items():
        if key not in params:
            setattr(est, key, value)
    est.tuned_params_ = {name: chosen[name] for name in names}
    est.tuning_ = record
    return est

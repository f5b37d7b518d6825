"""scikit-learn's estimator protocol without importing scikit-learn.

Every estimator here follows scikit-learn's conventions (parameters as ``__init__``
keywords, ``get_params`` / ``set_params``, ``clone``, tags, ``score``) and passes its
``check_estimator`` suite (``tests/forest/test_sklearn_checks.py``). It does not
subclass ``sklearn.base.BaseEstimator``, because importing that class costs a fresh
process about 1 s (``sklearn.utils.fixes`` imports scipy.stats and pandas): more than
loading every compiled kernel of a GBDT fit from the cache, and the larger part of
issue 11's warm-start budget (``import forest`` + first fit <= 1 s). So the parts of
the protocol that a fit uses live here, and the parts that only scikit-learn's own
code calls (tags, ``score``'s metrics, the not-fitted error) import scikit-learn when
called: by then the caller has imported it already.

Also here, importing scikit-learn only when used: the notebook diagram
(``_repr_html_``) and metadata routing (``set_fit_request(sample_weight=True)`` and
the other ``set_<method>_request``, generated from each method's signature as
scikit-learn generates them, over its public ``MetadataRequest``). scikit-learn's ``check_estimator`` warns that the
estimators do not inherit from its ``BaseEstimator``; its checks pass
(``tests/forest/test_sklearn_checks.py``).
"""
import inspect
import math


class EstimatorBase:
    """Parameters, ``get_params`` / ``set_params``, repr and tags of every estimator.

    Subclasses declare their parameters as keyword arguments of ``__init__`` and store
    each under its own name, unchanged (scikit-learn's rule, which ``clone`` and the
    parameter searches rely on).
    """

    def __init_subclass__(cls, **kwargs):
        # scikit-learn's metadata routing: a set_<method>_request for each method that
        # takes metadata (sample_weight, clusters, ...), generated from the signatures
        # as scikit-learn generates them, without importing it.
        super().__init_subclass__(**kwargs)
        for method, params in _metadata_params(cls).items():
            name = f"set_{method}_request"
            if name not in vars(cls) or getattr(vars(cls)[name], "_generated_request", False):
                setter = _request_setter(method, params)
                setter._generated_request = True
                setattr(cls, name, setter)

    def _routing_request(self):
        """A copy of this estimator's routing requests (scikit-learn's ``MetadataRequest``)."""
        import copy

        from sklearn.utils.metadata_routing import MetadataRequest

        request = self.__dict__.get("_metadata_request")
        if request is not None:
            return copy.deepcopy(request)
        request = MetadataRequest(owner=type(self).__name__)
        for method, params in _metadata_params(type(self)).items():
            for name in params:
                getattr(request, method).add_request(param=name, alias=None)
        return request

    def get_metadata_routing(self):
        """The metadata each method requests (scikit-learn's ``MetadataRequest``; a copy)."""
        return self._routing_request()

    @classmethod
    def _get_param_names(cls):
        """Names of the ``__init__`` parameters, sorted."""
        init = cls.__init__
        if init is object.__init__:
            return []
        names = []
        for p in inspect.signature(init).parameters.values():
            if p.name == "self" or p.kind == p.VAR_KEYWORD:
                continue
            if p.kind == p.VAR_POSITIONAL:
                raise RuntimeError(f"{cls.__name__}.__init__ takes *args; estimator parameters must be named")
            names.append(p.name)
        return sorted(names)

    def get_params(self, deep=True):
        """Parameters of this estimator (with ``deep``, also ``<param>__<sub>`` of nested estimators).

        Returns
        -------
        dict
        """
        out = {}
        for key in self._get_param_names():
            value = getattr(self, key)
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                out.update((f"{key}__{k}", v) for k, v in value.get_params().items())
            out[key] = value
        return out

    def set_params(self, **params):
        """Set parameters (``<param>__<sub>`` reaches into a nested estimator).

        Returns
        -------
        self
        """
        if not params:
            return self
        valid = self.get_params(deep=True)
        nested = {}
        for key, value in params.items():
            name, delim, sub = key.partition("__")
            if name not in valid:
                raise ValueError(f"Invalid parameter {name!r} for estimator {self}. "
                                 f"Valid parameters are: {self._get_param_names()!r}.")
            if delim:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
                valid[name] = value
        for name, sub_params in nested.items():
            valid[name].set_params(**sub_params)
        return self

    def __repr__(self, N_CHAR_MAX=700):
        """``Name(p=v, ...)`` with the parameters that differ from their defaults.

        All of them under scikit-learn's ``print_changed_only=False``; long sequences
        show their first 30 items, and a repr of more than ``N_CHAR_MAX`` characters
        keeps its two ends (scikit-learn's rules, without its line wrapping).
        """
        import sys

        changed_only = True
        if "sklearn" in sys.modules:  # its settings only matter once it is in use
            changed_only = sys.modules["sklearn"].get_config().get("print_changed_only", True)
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        shown = []
        for key, value in self.get_params(deep=False).items():
            default = defaults.get(key, inspect.Parameter.empty)
            if changed_only and default is not inspect.Parameter.empty and _same_default(value, default):
                continue
            shown.append(f"{key}={_short_repr(value)}")
        text = f"{type(self).__name__}({', '.join(shown)})"
        if len(text) > N_CHAR_MAX:
            half = N_CHAR_MAX // 2
            text = text[:half] + "..." + text[-half:]
        return text

    @property
    def _repr_html_(self):
        """The diagram scikit-learn's estimators show in notebooks (absent with ``display="text"``)."""
        from sklearn import get_config

        if get_config()["display"] != "diagram":
            raise AttributeError("_repr_html_ is only defined when scikit-learn's display is 'diagram'")
        from sklearn.utils import estimator_html_repr

        return lambda: estimator_html_repr(self)

    def _repr_mimebundle_(self, **kwargs):
        """What notebooks display: the text repr, and the diagram unless scikit-learn's display is 'text'."""
        from sklearn import get_config
        from sklearn.utils import estimator_html_repr

        output = {"text/plain": repr(self)}
        if get_config()["display"] == "diagram":
            output["text/html"] = estimator_html_repr(self)
        return output

    # The diagram's parameter and fitted-attribute tables: scikit-learn's own code,
    # which reads only get_params, __init__'s signature and vars(self).
    def _get_params_html(self, deep=True, doc_link=""):
        from sklearn.base import BaseEstimator

        return BaseEstimator._get_params_html(self, deep, doc_link)

    def _get_fitted_attr_html(self, doc_link=""):
        from sklearn.base import BaseEstimator

        return BaseEstimator._get_fitted_attr_html(self, doc_link)

    def __sklearn_tags__(self):
        from sklearn.utils import Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=False), transformer_tags=None,
                    regressor_tags=None, classifier_tags=None)


def _short_repr(value, max_items=30):
    """``repr(value)``, with a list or tuple of more than ``max_items`` items cut after them."""
    if isinstance(value, (list, tuple)) and len(value) > max_items:
        opening, closing = ("[", "]") if isinstance(value, list) else ("(", ")")
        return opening + ", ".join(repr(v) for v in value[:max_items]) + ", ..." + closing
    return repr(value)


def _same_default(value, default):
    if value is default:
        return True
    if isinstance(value, float) and isinstance(default, float) and math.isnan(value) and math.isnan(default):
        return True
    try:
        return repr(value) == repr(default)
    except Exception:  # a value whose repr fails is shown (and fails there, visibly)
        return False


#: scikit-learn's "leave this request as it is" marker (``metadata_routing.UNCHANGED``).
_UNCHANGED = "$UNCHANGED$"

#: Methods whose extra parameters scikit-learn's metadata routing can pass, and the
#: parameters that are data, never metadata (scikit-learn's own lists).
_ROUTED_METHODS = ("fit", "partial_fit", "predict", "predict_proba", "predict_log_proba", "decision_function",
                   "score", "split", "transform", "inverse_transform")
_DATA_PARAMS = frozenset(("X", "y", "Y", "Xt", "yt"))


def _metadata_params(cls):
    """``{method: [metadata parameter names]}`` of a class, from its methods' signatures."""
    out = {}
    for method in _ROUTED_METHODS:
        func = getattr(cls, method, None)
        if not inspect.isfunction(func):
            continue
        params = [p.name for p in list(inspect.signature(func).parameters.values())[1:]
                  if p.name not in _DATA_PARAMS and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if params:
            out[method] = params
    return out


def _request_setter(method, params):
    """``set_<method>_request(self, *, <params>)``: records routing requests (scikit-learn's protocol)."""

    def setter(self, **requests):
        unknown = set(requests) - set(params)
        if unknown:
            raise TypeError(f"Unexpected args: {sorted(unknown)} in set_{method}_request. Accepted arguments "
                            f"are: {set(params)}")
        from sklearn.utils.metadata_routing import _routing_enabled

        if not _routing_enabled():
            raise RuntimeError("This method is only available when metadata routing is enabled. You can enable it "
                               "using sklearn.set_config(enable_metadata_routing=True).")
        request = self._routing_request()
        for name, alias in requests.items():
            if alias != _UNCHANGED:
                getattr(request, method).add_request(param=name, alias=alias)
        # scikit-learn's clone() copies this attribute (nothing else that is not a
        # parameter); model files leave it out (forest.io.model_io).
        self._metadata_request = request
        return self

    setter.__name__ = setter.__qualname__ = f"set_{method}_request"
    setter.__signature__ = inspect.Signature(
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, default=_UNCHANGED) for p in params])
    setter.__doc__ = (f"Request metadata passed to ``{method}`` when metadata routing is enabled "
                      f"(True, False, None or an alias for each of: {', '.join(params)}).\n\nReturns\n-------\nself\n")
    return setter


class _SupervisedMixin:
    """Tags and ``score`` of a regressor or classifier (the subclass names its kind and metric)."""

    _target_kind = None   # "regressor" or "classifier": scikit-learn's estimator_type
    _score_metric = None  # name of the sklearn.metrics function ``score`` reports

    def __sklearn_tags__(self):
        from sklearn.utils import ClassifierTags, RegressorTags

        tags = super().__sklearn_tags__()
        tags.estimator_type = self._target_kind
        if self._target_kind == "classifier":
            tags.classifier_tags = ClassifierTags()
        else:
            tags.regressor_tags = RegressorTags()
        tags.target_tags.required = True
        return tags

    def score(self, X, y, sample_weight=None):
        """``_score_metric`` of ``predict(X)`` against ``y`` (R^2 for regressors, accuracy for classifiers).

        Returns
        -------
        float
        """
        import sklearn.metrics

        metric = getattr(sklearn.metrics, self._score_metric)
        return metric(y, self.predict(X), sample_weight=sample_weight)


class RegressorMixin(_SupervisedMixin):
    """A regressor's tags and ``score`` (R^2); list it before :class:`EstimatorBase`."""

    _target_kind = "regressor"
    _score_metric = "r2_score"


class ClassifierMixin(_SupervisedMixin):
    """A classifier's tags and ``score`` (accuracy); list it before :class:`EstimatorBase`."""

    _target_kind = "classifier"
    _score_metric = "accuracy_score"


def predicts_effects(estimator):
    """Whether an estimator's predictions are treatment effects (the causal and instrumental forests).

    The command-line tools and the report name such columns ``tau`` and add the effect
    analyses; other models with intervals (a regression forest's) are not effects.
    """
    return bool(getattr(type(estimator), "_predicts_effects", False))


def check_is_fitted(estimator, attribute):
    """Raise scikit-learn's ``NotFittedError`` unless ``estimator`` has ``attribute``.

    Only a failing check imports scikit-learn (for the exception users catch).
    """
    if hasattr(estimator, attribute):
        return
    from sklearn.utils.validation import check_is_fitted as sklearn_check_is_fitted

    sklearn_check_is_fitted(estimator, attribute)

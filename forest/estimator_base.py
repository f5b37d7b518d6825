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
(``_repr_html_``) and, for the regressors and classifiers, metadata routing of
``sample_weight`` (``set_fit_request`` / ``set_score_request``, through scikit-learn's
public ``MetadataRequest``). scikit-learn's ``check_estimator`` warns that the
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

    def __repr__(self):
        """``Name(p=v, ...)`` with the parameters that differ from their defaults."""
        defaults = {p.name: p.default for p in inspect.signature(type(self).__init__).parameters.values()}
        shown = []
        for key, value in self.get_params(deep=False).items():
            default = defaults.get(key, inspect.Parameter.empty)
            if default is not inspect.Parameter.empty and _same_default(value, default):
                continue
            shown.append(f"{key}={value!r}")
        return f"{type(self).__name__}({', '.join(shown)})"

    @property
    def _repr_html_(self):
        """The diagram scikit-learn's estimators show in notebooks (absent with ``display="text"``)."""
        from sklearn import get_config

        if get_config()["display"] != "diagram":
            raise AttributeError("_repr_html_ is only defined when scikit-learn's display is 'diagram'")
        from sklearn.utils import estimator_html_repr

        return lambda: estimator_html_repr(self)

    def __sklearn_tags__(self):
        from sklearn.utils import Tags, TargetTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=False), transformer_tags=None,
                    regressor_tags=None, classifier_tags=None)


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


class SampleWeightRoutingMixin:
    """Metadata routing of ``sample_weight`` to ``fit`` and ``score`` (scikit-learn >= 1.4).

    With ``sklearn.set_config(enable_metadata_routing=True)``, a pipeline or a search
    passes ``sample_weight`` to a step only if the step asked for it:
    ``GBDTRegressor().set_fit_request(sample_weight=True)``.
    """

    def set_fit_request(self, *, sample_weight=_UNCHANGED):
        """Whether ``fit`` takes ``sample_weight`` when metadata is routed (True, False, None or an alias).

        Returns
        -------
        self
        """
        return self._set_request("fit", sample_weight)

    def set_score_request(self, *, sample_weight=_UNCHANGED):
        """Whether ``score`` takes ``sample_weight`` when metadata is routed.

        Returns
        -------
        self
        """
        return self._set_request("score", sample_weight)

    def _set_request(self, method, alias):
        from sklearn.utils.metadata_routing import _routing_enabled

        if not _routing_enabled():
            raise RuntimeError("This method is only available when metadata routing is enabled. You can enable it "
                               "using sklearn.set_config(enable_metadata_routing=True).")
        if alias != _UNCHANGED:
            # scikit-learn's clone() copies this attribute (and nothing else that is
            # not a parameter); a model file does not keep it.
            request = self.get_metadata_routing()
            getattr(request, method).add_request(param="sample_weight", alias=alias)
            self._metadata_request = request
        return self

    def get_metadata_routing(self):
        """The ``sample_weight`` requests of ``fit`` and ``score``, as scikit-learn's ``MetadataRequest``."""
        from sklearn.utils.metadata_routing import MetadataRequest

        request = self.__dict__.get("_metadata_request")
        if request is None:
            request = MetadataRequest(owner=type(self).__name__)
            for method in ("fit", "score"):
                getattr(request, method).add_request(param="sample_weight", alias=None)
        return request


class _SupervisedMixin(SampleWeightRoutingMixin):
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


def check_is_fitted(estimator, attribute):
    """Raise scikit-learn's ``NotFittedError`` unless ``estimator`` has ``attribute``.

    Only a failing check imports scikit-learn (for the exception users catch).
    """
    if hasattr(estimator, attribute):
        return
    from sklearn.utils.validation import check_is_fitted as sklearn_check_is_fitted

    sklearn_check_is_fitted(estimator, attribute)

"""Result objects of the causal-forest diagnostics: estimates, standard errors, tests, tables.

This module owns how a diagnostic's numbers are presented: :class:`EstimateTable`
(best linear projection, calibration test) holds named coefficients with standard
errors and derives test statistics, p-values and confidence intervals from them
(Student t with the regression's residual degrees of freedom, as R's ``coeftest``
on an ``lm`` does, or the normal distribution when no degrees of freedom are
given); :class:`RATEResult` adds the TOC curve of a rank-weighted average
treatment effect. Both print as a readable table (``str``) and convert to plain
JSON-able dictionaries (``to_dict``).

Shapes: for one effect column ``estimate``/``stderr``/``pvalue`` have shape
``(n_terms,)``; for several (arms of a multi-arm forest, outcomes) they have shape
``(n_contrasts, n_terms)`` and ``contrasts`` names the rows.
"""
import numpy as np

ALTERNATIVES = ("two-sided", "greater")


def _dist(dof):
    from scipy import stats

    return stats.t(dof) if dof is not None else stats.norm()


class EstimateTable:
    """Named estimates with standard errors and the tests derived from them.

    Parameters
    ----------
    terms : sequence of str
        Coefficient names, length ``n_terms``.
    estimate, stderr : array-like, shape (n_terms,) or (n_contrasts, n_terms)
    title : str
        First line of the printed table.
    dof : int, optional
        Degrees of freedom of the t reference distribution (normal if None).
    alternative : {"two-sided", "greater"}
        ``"greater"``: one-sided p-values ``P(T >= t)`` (grf's calibration test).
    contrasts : sequence of str, optional
        Names of the rows of a 2-D ``estimate``.
    note : str, optional
        Extra line under the title (e.g. the covariance type).
    """

    def __init__(self, terms, estimate, stderr, *, title, dof=None, alternative="two-sided", contrasts=None,
                 note=""):
        if alternative not in ALTERNATIVES:
            raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
        self.terms = [str(t) for t in terms]
        self.estimate = np.asarray(estimate, dtype=np.float64)
        self.stderr = np.asarray(stderr, dtype=np.float64)
        if self.estimate.shape != self.stderr.shape or self.estimate.shape[-1] != len(self.terms):
            raise ValueError(f"estimate {self.estimate.shape} and stderr {self.stderr.shape} must both end in "
                             f"{len(self.terms)} terms")
        self.contrasts = None if contrasts is None else [str(c) for c in contrasts]
        if (self.estimate.ndim == 2) != (self.contrasts is not None) or \
                (self.contrasts is not None and len(self.contrasts) != self.estimate.shape[0]):
            raise ValueError("a 2-D estimate needs one contrast name per row (and a 1-D one none)")
        self.title = title
        self.dof = None if dof is None else int(dof)
        self.alternative = alternative
        self.note = note

    @property
    def statistic(self):
        """``estimate / stderr`` (t or z value), shape of ``estimate``."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self.estimate / self.stderr

    @property
    def pvalue(self):
        """p-values of ``H0: coefficient = 0`` against ``alternative``, shape of ``estimate``."""
        z = self.statistic
        d = _dist(self.dof)
        p = d.sf(z) if self.alternative == "greater" else 2.0 * d.sf(np.abs(z))
        return np.where(np.isfinite(z), p, np.nan)

    def conf_int(self, alpha=0.05):
        """Two-sided ``1 - alpha`` confidence intervals.

        Returns
        -------
        lower, upper : ndarray
            Shape of ``estimate``.
        """
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        half = _dist(self.dof).ppf(1.0 - alpha / 2.0) * self.stderr
        return self.estimate - half, self.estimate + half

    def _rows(self):
        """``(label, estimate, stderr, statistic, pvalue)`` per printed line."""
        est, se, st, pv = (np.atleast_2d(a) for a in (self.estimate, self.stderr, self.statistic, self.pvalue))
        rows = []
        for c in range(est.shape[0]):
            prefix = f"{self.contrasts[c]}: " if self.contrasts else ""
            rows += [(prefix + t, est[c, j], se[c, j], st[c, j], pv[c, j]) for j, t in enumerate(self.terms)]
        return rows

    def __str__(self):
        stat = "t value" if self.dof is not None else "z value"
        pname = ("Pr(>t)" if self.dof is not None else "Pr(>z)") if self.alternative == "greater" else \
            ("Pr(>|t|)" if self.dof is not None else "Pr(>|z|)")
        rows = self._rows()
        width = max([len("term")] + [len(r[0]) for r in rows])
        lines = [self.title]
        if self.note:
            lines.append(self.note)
        lines.append(f"{'term':<{width}}  {'estimate':>11}  {'std.err':>10}  {stat:>8}  {pname:>9}")
        for name, e, s, z, p in rows:
            lines.append(f"{name:<{width}}  {e:>11.5g}  {s:>10.4g}  {z:>8.3f}  {_format_p(p):>9}")
        return "\n".join(lines)

    def __repr__(self):
        return f"<{type(self).__name__}: {self.title}>\n{self}"

    def to_dict(self, alpha=0.05):
        """Plain (JSON-able) dictionary of the table, with ``1 - alpha`` intervals."""
        lo, hi = self.conf_int(alpha)
        out = {"title": self.title, "note": self.note, "terms": list(self.terms), "contrasts": self.contrasts,
               "estimate": self.estimate.tolist(), "stderr": self.stderr.tolist(),
               "statistic": self.statistic.tolist(), "pvalue": self.pvalue.tolist(),
               "alternative": self.alternative, "dof": self.dof, "alpha": alpha,
               "conf_low": lo.tolist(), "conf_high": hi.tolist()}
        return _clean(out)


class RATEResult(EstimateTable):
    """A rank-weighted average treatment effect with its TOC curve.

    Extra parameters
    ----------------
    target : {"AUTOC", "QINI"}
    q : ndarray, shape (n_q,)
        Grid of treated fractions.
    toc, toc_stderr : ndarray, shape (n_q,) or (n_contrasts, n_q)
        Targeting operator characteristic ``TOC(q)`` and its bootstrap standard error.
    n_bootstrap : int
    """

    def __init__(self, target, estimate, stderr, *, q, toc, toc_stderr, n_bootstrap, contrasts=None, note=""):
        est = np.asarray(estimate, dtype=np.float64)
        se = np.asarray(stderr, dtype=np.float64)
        super().__init__([target], est[..., None], se[..., None],
                         title=f"Rank-weighted average treatment effect ({target})", contrasts=contrasts,
                         note=note or f"half-sample bootstrap standard errors ({n_bootstrap} replicates)")
        self.target = target
        self.q = np.asarray(q, dtype=np.float64)
        self.toc = np.asarray(toc, dtype=np.float64)
        self.toc_stderr = np.asarray(toc_stderr, dtype=np.float64)
        self.n_bootstrap = int(n_bootstrap)

    def __str__(self):
        lines = [super().__str__(), "", "TOC(q) (std.err):"]
        toc, se = np.atleast_2d(self.toc), np.atleast_2d(self.toc_stderr)
        for c in range(toc.shape[0]):
            prefix = f"  {self.contrasts[c]}:" if self.contrasts else " "
            lines.append(prefix + "  ".join(f" q={q:.2g} {t:.4g} ({s:.3g})"
                                            for q, t, s in zip(self.q, toc[c], se[c])))
        return "\n".join(lines)

    def to_dict(self, alpha=0.05):
        out = super().to_dict(alpha)
        out.update(_clean({"target": self.target, "n_bootstrap": self.n_bootstrap,
                           "toc": {"q": self.q.tolist(), "estimate": self.toc.tolist(),
                                   "stderr": self.toc_stderr.tolist()}}))
        return out


def _format_p(p):
    if not np.isfinite(p):
        return "nan"
    return "<1e-16" if p < 1e-16 else f"{p:.3g}"


def _clean(obj):
    """Replace non-finite floats by None so the dictionary is valid JSON."""
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj

"""Fit a :class:`~histogram.binning.BinMapper` from row blocks read one at a time.

``forest-train`` reads a rank's parquet row groups one by one. Holding them all as
one float64 ``(n_local, n_features)`` matrix only to fit bin edges would cost 8 bytes
per value, eight times the uint8 codes the trees need. :class:`StreamingBinFit` keeps
only what :meth:`BinMapper.fit` actually uses from the rows:

* the sampled rows (chosen by the hash of the global row id, so the same rows
  :meth:`BinMapper.fit` would choose), at most ``subsample`` rows over all ranks;
* per feature, the sorted distinct values seen so far, capped at ``max_bins + 2``
  values. A feature with at most ``max_bins`` values gets exact bins only if the
  ranks' values missed by the sample are known; a feature with more than
  ``max_bins + 1`` distinct values on one rank is not exact whatever else is seen,
  so once the cap is reached the feature needs no more tracking (continuous features
  reach it in their first block).

:meth:`StreamingBinFit.finish` then runs the same collective steps as
:meth:`BinMapper.fit`, so the fitted edges are bitwise identical to a fit on the
concatenated blocks (``tests/histogram/test_binning_stream.py`` checks this under
``mpirun``).
"""
import numpy as np

from .binning import BinMapper, _as_float_matrix
from .dtypes import X_DTYPE


class StreamingBinFit:
    """Accumulate row blocks of one rank, then fit the mapper collectively.

    Parameters
    ----------
    mapper : BinMapper
        Unfitted mapper holding ``max_bins``, ``subsample`` and ``random_state``.
    n_features : int
    first_row : int
        Global row id of this rank's first row.
    n_local : int
        Rows this rank will add in total.
    n_global : int
        Rows over all ranks.

    Examples
    --------
    >>> fitter = StreamingBinFit(BinMapper(), 3, first_row, n_local, n_global)  # doctest: +SKIP
    >>> for block in blocks:                                   # (n_rows, 3) each
    ...     fitter.add(block)
    >>> mapper = fitter.finish(comm)
    """

    def __init__(self, mapper, n_features, first_row, n_local, n_global):
        if not isinstance(mapper, BinMapper):
            raise ValueError(f"mapper must be a BinMapper, got {type(mapper).__name__}")
        mapper._validate_params()
        if n_features < 1:
            raise ValueError("X has no features")
        if not (0 <= first_row and 0 <= n_local and first_row + n_local <= n_global):
            raise ValueError(f"rows {first_row}..{first_row + n_local} do not fit in {n_global} global rows")
        self.mapper = mapper
        self.n_features = int(n_features)
        self.first_row = int(first_row)
        self.n_local = int(n_local)
        self.n_global = int(n_global)
        self._cap = int(mapper.max_bins) + 2
        self._rows_seen = 0
        self._sample_parts = []
        self._distinct = [np.zeros(0, dtype=X_DTYPE) for _ in range(self.n_features)]
        self._full = np.zeros(self.n_features, dtype=bool)

    def add(self, block):
        """Take the next rows of this rank, in order.

        Parameters
        ----------
        block : array-like, shape (n_rows, n_features)
            Raw feature values; NaN is missing.
        """
        block = _as_float_matrix(block)
        if block.shape[1] != self.n_features:
            raise ValueError(f"block has {block.shape[1]} features, expected {self.n_features}")
        n = block.shape[0]
        if self._rows_seen + n > self.n_local:
            raise ValueError(f"more rows added ({self._rows_seen + n}) than announced ({self.n_local})")
        keep = self.mapper.sample_mask(self.first_row + self._rows_seen, n, self.n_global)
        if keep.all():
            self._sample_parts.append(block.copy())
        elif keep.any():
            self._sample_parts.append(block[keep])
        for f in np.flatnonzero(~self._full):
            col = block[:, f]
            merged = np.union1d(self._distinct[f], col[~np.isnan(col)])
            if merged.shape[0] >= self._cap:
                merged = merged[:self._cap]
                self._full[f] = True
            self._distinct[f] = merged
        self._rows_seen += n

    def finish(self, comm):
        """Fit the mapper over all ranks (collective: every rank of ``comm`` calls it).

        Returns
        -------
        BinMapper
            The fitted mapper, identical on every rank and identical to
            ``BinMapper.fit`` on the concatenated rows.
        """
        if self._rows_seen != self.n_local:
            raise ValueError(f"{self._rows_seen} rows added, {self.n_local} announced")
        mapper = self.mapper
        offset, n_global = mapper._global_layout(comm, self.n_features, self.n_local)
        if offset != self.first_row or n_global != self.n_global:
            raise ValueError(f"rank row layout disagrees with the plan: offset {offset} vs {self.first_row}, "
                             f"{n_global} vs {self.n_global} global rows")
        local_sample = (np.concatenate(self._sample_parts) if self._sample_parts
                        else np.zeros((0, self.n_features), dtype=X_DTYPE))
        self._sample_parts = []
        cap = mapper.max_bins + 1

        def local_missed(f, sample_values):
            seen = self._distinct[f]
            # Sorted, distinct: setdiff1d keeps both. With the cap reached, whatever
            # subset is sent still makes the union exceed max_bins, so the feature is
            # found inexact exactly as BinMapper.fit finds it.
            return np.setdiff1d(seen, sample_values, assume_unique=True)[:cap]

        use_all = mapper._uses_all_rows(n_global)
        mapper._fit_from_sample(comm, local_sample, self.n_features, use_all, local_missed)
        mapper.mark_categorical(None)
        return mapper

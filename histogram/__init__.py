"""histogram: binning of raw features and per-(node, feature, bin) channel sums.

Depends on ``native`` (for distributed bin fitting) and numpy/numba; knows nothing
about the models that consume the histograms.
"""

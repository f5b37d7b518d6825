"""The growth engine: binned trees, histograms, splits, partitions, sampling, routing and prediction."""

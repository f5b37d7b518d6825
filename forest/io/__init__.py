"""What crosses the process boundary: data files, model files, checkpoints, fingerprints, merging."""

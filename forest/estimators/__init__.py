"""The public estimators, their shared bases, and their registration with the model-file format."""

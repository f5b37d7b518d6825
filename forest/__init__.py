"""forest: tree engine, estimators, model files, command-line tools and reports."""

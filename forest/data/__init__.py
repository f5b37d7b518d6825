"""Embedded demo data set (``demo.parquet``) and the script that makes it."""
import os

#: Path of the embedded demo data set (see ``make_demo_data.py`` for its design).
DEMO_PATH = os.path.join(os.path.dirname(__file__), "demo.parquet")
#: Columns of the demo data set that ``forest-train --demo`` uses.
DEMO_FEATURES = [f"x{i}" for i in range(8)]
DEMO_TREATMENT = "t"
DEMO_OUTCOME = "y"
#: Trees of the demo's causal forest unless ``--n-estimators`` says otherwise.
DEMO_TREES = 100

"""Wrote the model files beside it with the code of before the layout of issue 31 (git 6c10034), as
`python write_pre_layout_models.py tests/forest/data`: keep them as they are (test_pre_layout_files.py)."""
import sys, numpy as np
out = sys.argv[1]
from forest import CausalForest, RegressionForest, InstrumentalForest, GBDTClassifier, PolicyTree, model_io
from native.comm import SelfCommunicator
S = SelfCommunicator()
rng = np.random.default_rng(0)
n = 300
X = rng.normal(size=(n, 3)); t = (rng.random(n) < 0.5).astype(float); z = (rng.random(n) < 0.5).astype(float)
y = X[:, 0] + t * (1 + (X[:, 1] > 0)) + rng.normal(size=n)
Xq = rng.normal(size=(40, 3))
models = {
    "causal": CausalForest(6, nuisance_estimators=4, max_bins=16, random_state=1).fit(X, t, y, comm=S),
    "regression": RegressionForest(6, max_bins=16, random_state=1).fit(X, y, comm=S),
    "instrumental": InstrumentalForest(6, nuisance_estimators=4, max_bins=16, random_state=1).fit(X, np.where(z == 1, t, 0.0), y, z, comm=S),
    "gbdt": GBDTClassifier(n_estimators=4, max_leaf_nodes=4, random_state=1).fit(X, (y > 0).astype(int), comm=S),
    "policy": PolicyTree(max_depth=1, max_bins=16).fit(X, np.column_stack([np.zeros(n), y]), comm=S),
}
preds = {"X": Xq}
for k, m in models.items():
    model_io.save(m, f"{out}/{k}.model", metadata={"written_by": "histforest before the layout of issue 31"})
    preds[k] = m.predict_proba(Xq) if k == "gbdt" else m.predict(Xq)
np.savez(f"{out}/predictions.npz", **preds)

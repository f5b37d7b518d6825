"""Engine settings: the options object and the block-scoped override that benchmarks use."""
import threading

import numpy as np
import pytest

from forest.criteria.basic import VarianceCriterion
from forest.engine.expansion import grow_levelwise
from forest.engine.growth_options import EngineOptions, TreeParams, current_engine_options, engine_options
from histogram.binning import BinMapper
from native.comm import SelfCommunicator

SELF = SelfCommunicator()


def test_engine_options_apply_inside_the_block_only():
    default = current_engine_options()
    assert default == EngineOptions()
    with pytest.raises(RuntimeError):
        with engine_options(local_threshold=0, hist_rows=None) as inside:
            # None leaves a field as it is
            assert inside.local_threshold == 0 and inside.hist_rows == default.hist_rows
            assert current_engine_options() is inside
            with engine_options(split_mode="reduce_scatter"):
                assert current_engine_options().local_threshold == 0  # nested blocks stack
            assert current_engine_options() is inside
            raise RuntimeError("leaves the block")
    assert current_engine_options() == default


def test_engine_options_are_per_thread():
    seen = []
    with engine_options(local_threshold=7):
        t = threading.Thread(target=lambda: seen.append(current_engine_options().local_threshold))
        t.start()
        t.join()
    assert seen == [EngineOptions().local_threshold]


@pytest.mark.parametrize("bad", [dict(split_mode="bcast"), dict(gh_hist_split="cols"), dict(local_threshold=-1),
                                 dict(hist_rows=float("nan")), dict(max_hist_slots=0), dict(local_gather_bytes=0)])
def test_bad_engine_options_raise_one_line(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        EngineOptions(**bad)


def test_growth_reads_the_block_settings(rng):
    X = rng.normal(size=(600, 4))
    y = X[:, 0] + np.sin(2 * X[:, 1]) + 0.1 * rng.normal(size=600)
    bm = BinMapper(max_bins=32).fit(X, comm=SELF)
    codes = bm.transform(X)
    crit = VarianceCriterion(min_samples_leaf=5, count_channel=True)
    ch = crit.make_channels(y)
    sets = [np.arange(600, dtype=np.int32)]
    params = TreeParams(max_depth=6)

    def nodes(trees):
        return [(t.feature.tolist(), t.bin_threshold.tolist()) for t in trees]

    default = grow_levelwise(codes, ch, sets, crit, bm, params, comm=SELF)
    explicit = grow_levelwise(codes, ch, sets, crit, bm, params, comm=SELF, engine=EngineOptions(local_threshold=0))
    with engine_options(local_threshold=0):
        scoped = grow_levelwise(codes, ch, sets, crit, bm, params, comm=SELF)
    assert nodes(scoped) == nodes(explicit)
    # level-wise histograms number nodes breadth-first, the subtree kernel depth-first
    assert nodes(default) != nodes(explicit)
    assert sorted(zip(*nodes(default)[0])) == sorted(zip(*nodes(explicit)[0]))

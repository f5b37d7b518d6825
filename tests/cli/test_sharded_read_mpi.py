"""Each rank reads only its own row groups (run under mpirun -np K by `make test`)."""
import numpy as np
import pyarrow.parquet as pq
import pytest

from cli_helpers import make_table
from forest.io import dataio
from forest.cli.common import load_rows
from native import collectives as col


@pytest.mark.mpi
def test_ranks_read_disjoint_row_groups_covering_the_file(comm, tmp_path):
    path = None
    if comm.rank == 0:
        path = str(tmp_path / "d.parquet")
        pq.write_table(make_table(500, seed=5), path, row_group_size=50)  # 10 row groups
    path = col.bcast_object(comm, path)
    comm.barrier()
    source, names, shard, offset = load_rows(comm, path, ["a", "c"], keep=["id"])
    runs = dataio.assign_row_groups([g[2] for g in source.groups], comm.size)
    mine = (shard.stats.row_groups, shard.stats.bytes_read, offset, shard.keep["id"].to_pylist(),
            shard.columns["a"].copy())
    everyone = col.allgather_object(comm, mine)
    meta = pq.ParquetFile(path).metadata
    file_bytes = sum(meta.row_group(g).column(c).total_compressed_size
                     for g in range(meta.num_row_groups) for c in range(meta.num_columns)
                     if meta.row_group(g).column(c).path_in_schema in ("a", "c", "id"))
    full = pq.read_table(path)

    assert names == ["a", "c"]
    assert shard.stats.row_groups == [(0, g) for g in range(*runs[comm.rank])]
    read = [g for groups, *_ in everyone for g in groups]
    assert read == [(0, g) for g in range(10)]  # every group exactly once, in order
    assert sum(b for _, b, *_ in everyone) == file_bytes
    if comm.size > 1:
        assert all(b < file_bytes for _, b, *_ in everyone)
    ids = [i for *_, rank_ids, _ in everyone for i in rank_ids]
    assert ids == list(range(500))
    assert shard.keep["id"].to_pylist() == list(range(offset, offset + shard.n_local))
    np.testing.assert_array_equal(np.concatenate([e[-1] for e in everyone]), full["a"].to_numpy())

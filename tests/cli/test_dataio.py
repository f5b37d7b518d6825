"""Sharded reading: row-group assignment, per-rank reads, schema and file errors."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from forest.io import dataio
from forest.io.dataio import DataError


def _write(path, n, row_group_size, seed=0, extra=None):
    rng = np.random.default_rng(seed)
    cols = {"a": rng.normal(size=n), "b": rng.integers(0, 5, size=n), "t": (np.arange(n) % 2).astype(np.int8),
            "name": pa.array([f"r{i}" for i in range(n)])}
    if extra:
        cols.update(extra)
    pq.write_table(pa.table(cols), path, row_group_size=row_group_size)


@pytest.mark.parametrize("rows", [[10] * 7, [3, 100, 1, 1, 50], [5], [0, 4, 0]])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 8, 32])
def test_assignment_is_contiguous_complete_and_balanced(rows, size):
    runs = dataio.assign_row_groups(rows, size)
    assert len(runs) == size
    owned = [g for a, b in runs for g in range(a, b)]
    nonzero = [g for g, n in enumerate(rows) if n > 0]
    assert [g for g in owned if rows[g] > 0] == nonzero  # each non-empty group once, in order
    ends = [b for a, b in runs if b > a]
    assert ends == sorted(ends)
    loads = [sum(rows[a:b]) for a, b in runs]
    ideal = sum(rows) / size
    assert max(loads) <= ideal + max(rows)  # within one group of the even split


def test_fewer_groups_than_ranks_leaves_ranks_empty():
    runs = dataio.assign_row_groups([10, 10], 5)
    assert sum(b > a for a, b in runs) == 2
    assert sum(sum([10, 10][a:b]) for a, b in runs) == 20


def test_each_rank_reads_only_its_row_groups(tmp_path, monkeypatch):
    path = str(tmp_path / "d.parquet")
    _write(path, 1000, 100)
    full = pq.read_table(path)
    source = dataio.open_source(path)
    calls = []
    real = pq.ParquetFile.read_row_group

    def spy(self, i, *a, **k):
        calls.append(i)
        return real(self, i, *a, **k)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    monkeypatch.setattr(pq.ParquetFile, "read", lambda *a, **k: pytest.fail("whole-file read"))
    total_bytes = sum(pq.ParquetFile(path).metadata.row_group(g).total_byte_size for g in range(10))
    for size in (1, 3, 4):
        runs = dataio.assign_row_groups([g[2] for g in source.groups], size)
        parts = []
        for rank in range(size):
            calls.clear()
            shard = dataio.read_shard(source, runs[rank], numeric=["a", "b"], keep=["name"])
            assert calls == list(range(*runs[rank]))
            assert [g for _, g in shard.stats.row_groups] == calls
            if size > 1:
                assert shard.stats.bytes_read < total_bytes
            parts.append(shard)
        a = np.concatenate([p.columns["a"] for p in parts])
        np.testing.assert_array_equal(a, full["a"].to_numpy())
        np.testing.assert_array_equal(np.concatenate([p.columns["b"] for p in parts]),
                                      full["b"].to_numpy().astype(float))
        names = sum((p.keep["name"].to_pylist() for p in parts), [])
        assert names == full["name"].to_pylist()


def test_directory_and_glob_in_order(tmp_path):
    for i in range(3):
        _write(str(tmp_path / f"part-{i}.parquet"), 50, 20, seed=i)
    by_dir = dataio.open_source(str(tmp_path))
    by_glob = dataio.open_source(str(tmp_path / "part-*.parquet"))
    assert by_dir.paths == by_glob.paths and len(by_dir.paths) == 3
    assert by_dir.n_rows == 150 and len(by_dir.groups) == 9
    shard = dataio.read_shard(by_dir, (0, 9), numeric=["a"])
    expect = np.concatenate([pq.read_table(p)["a"].to_numpy() for p in by_dir.paths])
    np.testing.assert_array_equal(shard.columns["a"], expect)


def test_nulls_become_nan_and_bools_numbers(tmp_path):
    path = str(tmp_path / "n.parquet")
    pq.write_table(pa.table({"a": pa.array([1.0, None, 3.0]), "i": pa.array([1, None, 2]),
                             "flag": pa.array([True, False, None])}), path)
    source = dataio.open_source(path)
    shard = dataio.read_shard(source, (0, 1), numeric=["a", "i", "flag"])
    np.testing.assert_array_equal(shard.columns["a"], [1.0, np.nan, 3.0])
    np.testing.assert_array_equal(shard.columns["i"], [1.0, np.nan, 2.0])
    np.testing.assert_array_equal(shard.columns["flag"], [1.0, 0.0, np.nan])


def test_a_column_without_any_value_is_all_missing(tmp_path):
    # an empty CSV column has Arrow type null: it was refused as non-numeric
    path = str(tmp_path / "e.csv")
    with open(path, "w") as f:
        f.write("a,empty\n1.5,\n2.5,\n")
    source = dataio.open_source(path)
    assert source.numeric["empty"]
    shard = dataio.read_shard(source, (0, len(source.groups)), numeric=["a", "empty"])
    np.testing.assert_array_equal(shard.columns["empty"], [np.nan, np.nan])
    np.testing.assert_array_equal(shard.columns["a"], [1.5, 2.5])


def test_csv_is_split_into_virtual_groups(tmp_path):
    path = str(tmp_path / "d.csv")
    n = 2500
    with open(path, "w") as f:
        f.write("a,b\n")
        for i in range(n):
            f.write(f"{i * 0.5},{i % 3}\n")
    source = dataio.open_source(path)
    assert source.kind == "csv" and source.n_rows == n and len(source.groups) == 3
    runs = dataio.assign_row_groups([g[2] for g in source.groups], 2)
    a = np.concatenate([dataio.read_shard(source, r, numeric=["a"]).columns["a"] for r in runs])
    np.testing.assert_array_equal(a, np.arange(n) * 0.5)


def test_mismatched_schema_is_named(tmp_path):
    _write(str(tmp_path / "p0.parquet"), 10, 5)
    pq.write_table(pa.table({"a": np.zeros(3), "b": np.zeros(3), "t": np.zeros(3, np.int8),
                             "name": pa.array(["x"] * 3)}), str(tmp_path / "p1.parquet"))
    with pytest.raises(DataError, match="mismatched schema.*column 'b'.*p1.parquet"):
        dataio.open_source(str(tmp_path))
    pq.write_table(pa.table({"a": np.zeros(3)}), str(tmp_path / "p1.parquet"))
    with pytest.raises(DataError, match="mismatched schema.*lacks columns"):
        dataio.open_source(str(tmp_path))


def test_unreadable_and_missing_inputs(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"this is not parquet at all")
    with pytest.raises(DataError, match="cannot read parquet file .*bad.parquet"):
        dataio.open_source(str(bad))
    with pytest.raises(DataError, match="does not exist"):
        dataio.open_source(str(tmp_path / "nope.parquet"))
    with pytest.raises(DataError, match="no files match"):
        dataio.open_source(str(tmp_path / "*.nothing"))
    os.mkdir(tmp_path / "emptydir")
    with pytest.raises(DataError, match="holds no .parquet"):
        dataio.open_source(str(tmp_path / "emptydir"))


def test_column_checks(tmp_path):
    path = str(tmp_path / "d.parquet")
    _write(path, 10, 5)
    source = dataio.open_source(path)
    with pytest.raises(DataError, match="missing column 'zz'"):
        dataio.check_columns(source, numeric=["a", "zz"])
    with pytest.raises(DataError, match="non-numeric column 'name'"):
        dataio.check_columns(source, numeric=["name"])
    dataio.check_columns(source, numeric=["a", "b", "t"], any_type=["name"])


def test_bad_values_message():
    assert dataio.bad_values("y", np.array([1.0, 2.0])) is None
    msg = dataio.bad_values("y", np.array([1.0, np.inf, np.nan]), first_row=10)
    assert "'y'" in msg and "2 NaN/infinite" in msg and "row 11" in msg


def test_empty_rank_keep_columns_have_types(tmp_path):
    path = str(tmp_path / "d.parquet")
    _write(path, 10, 10)
    source = dataio.open_source(path)
    shard = dataio.read_shard(source, (0, 0), numeric=["a"], keep=["name", "b"])
    assert shard.n_local == 0 and shard.columns["a"].shape == (0,)
    assert shard.keep.num_rows == 0 and shard.keep.schema.field("b").type == pa.int64()

"""Fixtures of the command-line tests."""
import pyarrow.parquet as pq
import pytest

from cli_helpers import make_table


@pytest.fixture(scope="session")
def small_parquet(tmp_path_factory):
    """400 rows in 5 row groups of 80."""
    path = str(tmp_path_factory.mktemp("data") / "small.parquet")
    pq.write_table(make_table(), path, row_group_size=80)
    return path

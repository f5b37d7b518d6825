"""Sharded reading of tabular training and prediction data (parquet or CSV).

This module owns how a data set named on the command line becomes each rank's
rows:

1. :func:`open_source` resolves the name (a parquet file, a directory of parquet
   files, a glob, or a CSV file) and reads only the parquet *footers*: the schema of
   every file (checked to agree) and the row count of every row group. The result,
   a :class:`DataSource`, is small and picklable, so one rank can build it and
   broadcast it.
2. :func:`assign_row_groups` gives every rank a contiguous run of row groups,
   balanced by rows. Contiguous runs in file order mean that concatenating the
   ranks' rows in rank order gives the rows in file order, so the global row id of
   a row (rank offset + local index) does not depend on the number of ranks, and
   predictions written in rank order keep the input order. A rank may get no row
   group at all (fewer row groups than ranks); it then holds zero rows and still
   takes part in every collective.
3. :func:`read_shard` reads the rank's row groups one at a time with pyarrow and
   copies the requested columns straight into preallocated float64 arrays, so the
   only transient copy is one row group's Arrow table. Feature columns can instead
   stream past a callback one row group at a time (the first pass of streaming
   binning), and :func:`bin_features` reads them a second time, binning each row
   group into uint8 codes, so no rank ever holds all its features as float64. It
   never opens a row group outside the rank's assignment; :class:`ReadStats`
   records which row groups and how many column-chunk bytes were read.

Nothing here communicates: callers combine the per-rank error strings and
statistics (see :mod:`forest.cli.common`), which keeps this module testable on one
process for any simulated rank count.

CSV is meant for small data: every rank parses the whole CSV file and keeps a
contiguous block of its rows.
"""
import glob
import os
from dataclasses import dataclass, field

import numpy as np

from histogram.dtypes import X_DTYPE


#: Rows per virtual row group of a CSV file (CSV has no row groups of its own).
CSV_GROUP_ROWS = 1024


class DataError(ValueError):
    """Bad input data: the message names the file or column and the problem."""


@dataclass
class DataSource:
    """What :func:`open_source` learned from the footers.

    Attributes
    ----------
    paths : list of str
        Files in reading order.
    kind : {"parquet", "csv"}
    columns : list of str
        Column names (identical in every file).
    types : dict of str -> str
        Arrow type name per column.
    numeric : dict of str -> bool
        Whether each column can be read as float64 (integer, float, boolean).
    schema : bytes
        The Arrow schema, serialized (so the plan stays picklable and small).
    groups : list of (int, int, int)
        ``(file index, row-group index, n_rows)`` for every row group, in reading
        order. A CSV file is cut into virtual groups of ``CSV_GROUP_ROWS`` rows.
    null_counts : dict of str -> int or None
        Nulls per column over all files, from the footers' statistics (None where a
        row group has none); a CSV file's null-typed columns count every row.
    """

    paths: list
    kind: str
    columns: list
    types: dict
    numeric: dict
    schema: bytes = b""
    groups: list = field(default_factory=list)
    null_counts: dict = field(default_factory=dict)

    def arrow_schema(self):
        """The files' schema as a ``pyarrow.Schema``."""
        import pyarrow as pa

        return pa.ipc.read_schema(pa.py_buffer(self.schema))

    @property
    def n_rows(self):
        """Total rows over all files."""
        return int(sum(g[2] for g in self.groups))


@dataclass
class ReadStats:
    """What one rank actually read.

    Attributes
    ----------
    row_groups : list of (int, int)
        ``(file index, row-group index)`` pairs read, in order.
    bytes_read : int
        Compressed bytes of the column chunks read (parquet), or the file size (CSV).
    """

    row_groups: list = field(default_factory=list)
    bytes_read: int = 0


@dataclass
class Shard:
    """One rank's rows of the requested columns.

    Attributes
    ----------
    columns : dict of str -> ndarray, shape (n_local,)
        float64 copies of the numeric columns asked for.
    keep : pyarrow.Table or None
        Columns kept as they are (ids to carry into prediction output), n_local rows.
    n_local : int
    stats : ReadStats
    """

    columns: dict
    keep: object
    n_local: int
    stats: ReadStats


def is_numeric_type(arrow_type):
    """Whether an Arrow column type reads as numbers (float64, nulls as NaN): the one rule of the tools and
    of the estimators' pyarrow input."""
    import pyarrow as pa

    # null: a column with no value at all (an empty CSV column); every entry is missing
    return bool(pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)
                or pa.types.is_boolean(arrow_type) or pa.types.is_decimal(arrow_type)
                or pa.types.is_null(arrow_type))


def is_category_type(arrow_type):
    """Whether an Arrow column type holds categories: dictionary and string columns.

    The rule of :func:`forest.io.feature_table.categorical_mask` (``"from_dtype"``) for
    a pyarrow table, asked of a schema's type without reading any row.
    """
    import pyarrow as pa

    from forest.io.feature_table import categorical_mask

    return bool(categorical_mask("from_dtype", pa.schema([("c", arrow_type)]).empty_table(), 1)[0])


def _value_kind(arrow_type):
    """``"str"``, ``"number"`` or None: what a column of this type holds as categories."""
    import pyarrow as pa

    if pa.types.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "str"
    return "number" if is_numeric_type(arrow_type) and not pa.types.is_null(arrow_type) else None


def _same_categories_type(a, b):
    """Whether two files' types of a column hold the same kind of categories.

    pandas writes a ``category`` column as a dictionary whose index width follows its
    category count (int8 up to 127 categories), and another file may hold the same
    column as plain strings: these read as the same categorical column.
    """
    return is_category_type(a) and is_category_type(b) and _value_kind(a) == _value_kind(b) is not None


def _kind_words(arrow_type):
    kind = _value_kind(arrow_type)
    return {"str": "strings", "number": "numbers"}.get(kind, str(arrow_type))


def resolve_paths(spec):
    """Expand a data argument into a sorted list of files.

    Parameters
    ----------
    spec : str
        A file, a directory (all ``*.parquet`` / ``*.parq`` / ``*.csv`` files in it),
        or a glob pattern.

    Returns
    -------
    list of str

    Raises
    ------
    DataError
        When nothing matches.
    """
    if os.path.isdir(spec):
        paths = sorted(p for p in glob.glob(os.path.join(spec, "*"))
                       if os.path.isfile(p) and p.lower().endswith((".parquet", ".parq", ".csv")))
        if not paths:
            raise DataError(f"directory {spec!r} holds no .parquet or .csv files")
        return paths
    if os.path.isfile(spec):
        return [spec]
    if any(ch in spec for ch in "*?["):
        paths = sorted(p for p in glob.glob(spec) if os.path.isfile(p))
        if not paths:
            raise DataError(f"no files match {spec!r}")
        return paths
    raise DataError(f"data file {spec!r} does not exist")


def _kind_of(path):
    return "csv" if path.lower().endswith((".csv", ".csv.gz")) else "parquet"


def open_source(spec):
    """Read the footers (schema, row-group sizes) of every file named by ``spec``.

    Parameters
    ----------
    spec : str
        See :func:`resolve_paths`.

    Returns
    -------
    DataSource

    Raises
    ------
    DataError
        Unreadable file, mixed parquet and CSV, a column name that appears twice, or
        schemas that differ across files.
    """
    import pyarrow as pa

    paths = resolve_paths(spec)
    kinds = {_kind_of(p) for p in paths}
    if len(kinds) > 1:
        raise DataError(f"{spec!r} mixes parquet and CSV files; use one format")
    kind = kinds.pop()
    if kind == "csv":
        if len(paths) > 1:
            raise DataError(f"{spec!r} names {len(paths)} CSV files; CSV input must be a single file")
        table = _read_csv(paths[0])
        schemas = [table.schema]
        # Virtual row groups, so that ranks share a CSV file's rows too.
        groups = [(0, k, min(CSV_GROUP_ROWS, table.num_rows - start))
                  for k, start in enumerate(range(0, table.num_rows, CSV_GROUP_ROWS))]
        nulls = {f.name: table.column(j).null_count for j, f in enumerate(table.schema)}
    else:
        import pyarrow.parquet as pq

        groups, schemas, nulls = [], [], {}
        for i, path in enumerate(paths):
            try:
                meta = pq.ParquetFile(path).metadata
                schema = meta.schema.to_arrow_schema()
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"cannot read parquet file {path!r}: {_first_line(exc)}") from None
            schemas.append(schema)
            for g in range(meta.num_row_groups):
                groups.append((i, g, int(meta.row_group(g).num_rows)))
            _add_null_counts(nulls, meta)
    for path, schema in zip(paths, schemas):
        _check_unique_names(path, schema.names)
    first = schemas[0]
    for path, schema in zip(paths[1:], schemas[1:]):
        if schema.names != first.names:
            missing = [n for n in first.names if n not in schema.names]
            extra = [n for n in schema.names if n not in first.names]
            what = (f"lacks columns {missing}" if missing else
                    f"has extra columns {extra}" if extra else "orders its columns differently")
            raise DataError(f"mismatched schema across files: {path!r} {what} compared with {paths[0]!r}")
        for name in first.names:
            here, there = schema.field(name).type, first.field(name).type
            if here.equals(there) or _same_categories_type(here, there):
                continue
            if is_category_type(here) or is_category_type(there):
                raise DataError(
                    f"mismatched schema across files: categorical column {name!r} holds {_kind_words(here)} "
                    f"({here}) in {path!r} but {_kind_words(there)} ({there}) in {paths[0]!r}; give it one type "
                    f"in every file")
            raise DataError(
                f"mismatched schema across files: column {name!r} is {here} in {path!r} but {there} in "
                f"{paths[0]!r}")
    return DataSource(
        paths=list(paths), kind=kind, columns=list(first.names),
        types={f.name: str(f.type) for f in first},
        numeric={f.name: is_numeric_type(f.type) for f in first},
        schema=first.serialize().to_pybytes(),
        groups=groups,
        null_counts={name: nulls.get(name) for name in first.names},
    )


def _add_null_counts(nulls, meta):
    """Add a parquet file's null counts per top-level column to ``nulls`` (None once unknown)."""
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            name = chunk.path_in_schema
            if "." in name:         # a leaf of a nested column: not a feature the tools read
                continue
            stats = chunk.statistics
            known = stats is not None and stats.has_null_count
            if name not in nulls or nulls[name] is not None:
                nulls[name] = (nulls.get(name) or 0) + int(stats.null_count) if known else None


def _check_unique_names(path, names):
    """Raise ``DataError`` naming the first column that ``path`` holds more than once.

    Columns are read by name, so two columns of one name are ambiguous (and pyarrow
    refuses to select either).
    """
    seen = set()
    for name in names:
        if name in seen:
            raise DataError(f"column {name!r} appears {list(names).count(name)} times in {path!r}; "
                            f"column names must be unique")
        seen.add(name)


def _first_line(exc):
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _read_csv(path):
    import pyarrow as pa
    import pyarrow.csv as pacsv

    try:
        return pacsv.read_csv(path)
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"cannot read CSV file {path!r}: {_first_line(exc)}") from None


def check_columns(source, numeric=(), any_type=()):
    """Check that columns exist and that ``numeric`` ones hold numbers.

    Parameters
    ----------
    source : DataSource
    numeric : sequence of str
        Columns that will be read as float64.
    any_type : sequence of str
        Columns only carried through (``--keep``).

    Raises
    ------
    DataError
        Naming the first missing or non-numeric column.
    """
    for name in list(numeric) + list(any_type):
        if name not in source.types:
            raise DataError(f"missing column {name!r} in {source.paths[0]!r} "
                            f"(columns: {', '.join(source.columns)})")
    for name in numeric:
        if not source.numeric[name]:
            raise DataError(f"non-numeric column {name!r} (type {source.types[name]}); "
                            f"features, treatment, outcome and weight must be numbers")


def assign_row_groups(group_rows, size):
    """Split row groups into ``size`` contiguous runs balanced by rows.

    Group ``g`` goes to the rank whose share of the global rows contains the group's
    middle row, so runs are contiguous, in order, and within one group of the ideal
    split.

    Parameters
    ----------
    group_rows : sequence of int, shape (n_groups,)
    size : int
        Number of ranks.

    Returns
    -------
    list of (int, int)
        ``(first group, stop group)`` per rank; empty runs have ``first == stop``.
    """
    rows = np.asarray(group_rows, dtype=np.int64)
    total = int(rows.sum())
    if total == 0 or rows.size == 0:
        return [(0, 0)] * size
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]])
    # 2 * middle * size // (2 * total): integer arithmetic, no float rounding.
    owner = np.minimum((2 * starts + rows) * size // (2 * total), size - 1)
    runs = []
    for r in range(size):
        idx = np.flatnonzero(owner == r)
        runs.append((int(idx[0]), int(idx[-1]) + 1) if idx.size else (0, 0))
    return runs


def iter_row_groups(source, run, columns, stats):
    """Yield this rank's row groups one at a time as Arrow tables.

    Parameters
    ----------
    source : DataSource
    run : (int, int)
        ``(first group, stop group)`` from :func:`assign_row_groups`.
    columns : list of str
        Columns to read.
    stats : ReadStats
        Updated with every row group and its column-chunk bytes.

    Yields
    ------
    pyarrow.Table
        One row group (parquet), or this rank's whole block (CSV).

    Raises
    ------
    DataError
        When a row group cannot be read or disagrees with its footer.
    """
    import pyarrow as pa

    first, stop = run
    groups = source.groups[first:stop]
    if source.kind == "csv":
        n_local = int(sum(g[2] for g in groups))
        table = _read_csv(source.paths[0])
        lo = int(sum(g[2] for g in source.groups[:first]))
        stats.row_groups.extend((0, g[1]) for g in groups)
        stats.bytes_read += os.path.getsize(source.paths[0])
        yield table.slice(lo, n_local).select(columns)
        return

    import pyarrow.parquet as pq

    current_file, handle = None, None
    for file_index, group_index, n in groups:
        path = source.paths[file_index]
        try:
            if file_index != current_file:
                handle = pq.ParquetFile(path)
                current_file = file_index
            table = handle.read_row_group(group_index, columns=columns)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read row group {group_index} of {path!r}: {_first_line(exc)}") from None
        if table.num_rows != n:
            raise DataError(f"row group {group_index} of {path!r} has {table.num_rows} rows, "
                            f"its footer says {n}")
        meta = handle.metadata.row_group(group_index)
        names = [meta.column(c).path_in_schema for c in range(meta.num_columns)]
        stats.bytes_read += sum(meta.column(c).total_compressed_size
                                for c, name in enumerate(names) if name in columns)
        stats.row_groups.append((file_index, group_index))
        yield table
        del table  # one row group's Arrow table alive at a time


@dataclass
class FeatureChoice:
    """The feature columns a training run reads, which are categorical, and what it leaves out.

    Attributes
    ----------
    features : list of str
        In file order (or ``--features`` order).
    categorical : ndarray of bool, shape (n_features,)
    left_out : list of (str, str)
        ``(column, why)`` of the columns a default selection skipped.
    """

    features: list
    categorical: np.ndarray
    left_out: list

    @property
    def numeric(self):
        """The features read as numbers."""
        return [f for f, c in zip(self.features, self.categorical) if not c]

    def left_out_line(self):
        """``left out: ts (timestamp[ns]: not a number or a category), ...`` or None."""
        if not self.left_out:
            return None
        return "left out: " + ", ".join(f"{name} ({why})" for name, why in self.left_out)


def _pandas_index_columns(schema):
    """Columns that pandas' ``to_parquet`` stored for a DataFrame's index (its schema metadata says so)."""
    import json

    meta = (schema.metadata or {}).get(b"pandas")
    if not meta:
        return []
    try:
        return [c for c in json.loads(meta).get("index_columns", []) if isinstance(c, str)]
    except ValueError:
        return []


def choose_features(source, exclude=(), named=None, categorical=(), use_categories=True):
    """Which columns a training run uses as features, and which of them are categorical.

    By default every column not in ``exclude`` whose type is a number (integer, float,
    boolean, decimal) or a category (:func:`is_category_type`: dictionary and string
    columns) is a feature; any other type (timestamps, lists, binary, ...) and columns
    without a single value are left out, each with the reason. Columns ``named``
    (``--features``) are used as given: one of an unusable type is refused.

    Parameters
    ----------
    source : DataSource
    exclude : sequence of str
        The targets (treatment, outcome, ...).
    named : sequence of str, optional
        The features as listed by the user.
    categorical : sequence of str
        Columns to treat as categorical whatever their type (``--categorical``):
        numeric ones hold category codes, e.g. integers.
    use_categories : bool
        False (``--no-categorical``): no column is categorical; dictionary and string
        columns are left out (refused when named).

    Returns
    -------
    FeatureChoice

    Raises
    ------
    DataError
        A missing column, a named feature of unusable type, a ``categorical`` column
        that is not a feature or not of a usable type.
    """
    schema = source.arrow_schema()
    for name in list(named or ()) + list(categorical):
        if name not in source.types:
            raise DataError(f"missing column {name!r} in {source.paths[0]!r} (columns: {', '.join(source.columns)})")
    forced = set(categorical)
    features, mask, left_out = [], [], []
    index = set(_pandas_index_columns(schema))
    for name in (named if named is not None else [c for c in source.columns if c not in exclude]):
        if named is None and name in index:
            left_out.append((name, "the pandas index written with the table"))
            continue
        kind, why = _feature_kind(schema.field(name).type, source.null_counts.get(name), source.n_rows,
                                  use_categories, name in forced)
        if kind is None and named is not None and why != "no value at all":
            raise DataError(f"feature column {name!r} cannot be used ({why})"
                            + ("" if use_categories or not is_category_type(schema.field(name).type)
                               else "; drop --no-categorical to use it as a categorical feature"))
        if kind is None and named is None:
            left_out.append((name, why))
            continue
        features.append(name)
        mask.append(kind == "categorical")
    stray = sorted(forced - set(features))
    if stray:
        raise DataError(f"--categorical names {stray[0]!r}, which is not a feature column"
                        + (" (not in --features)" if named is not None else f" (columns: {', '.join(features)})"))
    if not features:
        raise DataError(f"{source.paths[0]!r} has no numeric or categorical feature columns besides "
                        f"{list(exclude)}")
    return FeatureChoice(features=features, categorical=np.asarray(mask, dtype=bool), left_out=left_out)


def _feature_kind(arrow_type, nulls, n_rows, use_categories, forced):
    """``("numeric" | "categorical" | None, why left out)`` of a column type."""
    import pyarrow as pa

    if pa.types.is_null(arrow_type) or (nulls is not None and n_rows > 0 and nulls >= n_rows):
        return None, "no value at all"
    if is_category_type(arrow_type):
        if not use_categories:
            return None, f"{arrow_type}: categories, and --no-categorical is given"
        return "categorical", None
    if is_numeric_type(arrow_type):
        return ("categorical" if forced else "numeric"), None
    return None, f"{arrow_type}: not a number or a category"


def read_shard(source, run, numeric=(), keep=(), features=(), on_features=None, encoders=None):
    """Read this rank's row groups into float64 columns.

    Parameters
    ----------
    source : DataSource
    run : (int, int)
        ``(first group, stop group)`` from :func:`assign_row_groups`.
    numeric : sequence of str
        Columns converted to float64 (nulls become NaN).
    keep : sequence of str
        Columns kept as Arrow data, unchanged.
    features : sequence of str
        Columns handed, one row group at a time, to ``on_features`` as a float64
        block of shape ``(n_group_rows, len(features))`` and not kept: the caller
        bins them as they stream past (see :func:`bin_features`).
    on_features : callable, optional
        Required with ``features``.
    encoders : dict of str -> callable, optional
        Categorical features: ``encoders[name](column) -> float64 codes`` (see
        :func:`coded_block`).

    Returns
    -------
    Shard

    Raises
    ------
    DataError
        When a row group cannot be read.
    """
    import pyarrow as pa

    if features and on_features is None:
        raise ValueError("read_shard: features given without on_features")
    first, stop = run
    n_local = int(sum(g[2] for g in source.groups[first:stop]))
    out = {name: np.empty(n_local, dtype=X_DTYPE) for name in numeric}
    keep_parts = []
    stats = ReadStats()
    wanted = list(dict.fromkeys(list(numeric) + list(keep) + list(features)))
    pos = 0
    for table in iter_row_groups(source, run, wanted, stats):
        _fill(out, table, pos)
        if features:
            on_features(coded_block(table, features, encoders))
        if keep:
            keep_parts.append(table.select(list(keep)))
        pos += table.num_rows
    keep_table = None
    if keep:
        keep_table = (_concat(keep_parts) if keep_parts
                      else source.arrow_schema().empty_table().select(list(keep)))
    return Shard(columns=out, keep=keep_table, n_local=n_local, stats=stats)


def _concat(parts):
    """Row groups' tables as one; a categorical column stored as a dictionary in one file and
    as strings in another (:func:`_same_categories_type`) is decoded to its values."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if all(p.schema.equals(parts[0].schema) for p in parts[1:]):
        return pa.concat_tables(parts)

    def decoded(table):
        for j, f in enumerate(table.schema):
            if pa.types.is_dictionary(f.type):
                table = table.set_column(j, f.name, pc.cast(table.column(j), f.type.value_type))
        return table
    return pa.concat_tables([decoded(p) for p in parts], promote_options="permissive")


def bin_features(source, run, features, transform, n_local, encoders=None):
    """Second pass over this rank's row groups: bin the features one group at a time.

    Only one row group's float64 block ``(n_group_rows, n_features)`` exists at a
    time; the result is the feature-major uint8 matrix the trees grow on.

    Parameters
    ----------
    source : DataSource
    run : (int, int)
    features : sequence of str
    transform : callable
        ``transform(block) -> codes``, block ``(n, n_features)`` float64 to codes
        ``(n_features, n)`` uint8 (a fitted ``BinMapper.transform``).
    n_local : int
        Rows in the run.
    encoders : dict of str -> callable, optional
        See :func:`coded_block`.

    Returns
    -------
    codes : ndarray of uint8, shape (n_features, n_local)
    stats : ReadStats
    """
    stats = ReadStats()
    codes = np.empty((len(features), n_local), dtype=np.uint8)
    pos = 0
    for table in iter_row_groups(source, run, list(features), stats):
        n = table.num_rows
        codes[:, pos:pos + n] = transform(coded_block(table, features, encoders))
        pos += n
    if pos != n_local:
        raise DataError(f"read {pos} rows where the footers promise {n_local}")
    return codes, stats


def feature_block(table, features):
    """Columns ``features`` of ``table`` as one float64 block, shape (n_rows, n_features)."""
    block = np.empty((table.num_rows, len(features)), dtype=X_DTYPE)
    columns = {name: block[:, j] for j, name in enumerate(features)}
    _fill(columns, table, 0)
    return block


def coded_block(table, features, encoders=None):
    """Like :func:`feature_block`, with categorical columns as their category codes.

    Parameters
    ----------
    table : pyarrow.Table
    features : sequence of str
    encoders : dict of str -> callable, optional
        ``encoders[name](column)``: the codes (float64, NaN missing) of categorical
        column ``name``, e.g. a fitted :class:`histogram.categories.CategoryCoder`'s
        ``encode``. Without any, every feature is numeric.

    Returns
    -------
    ndarray of float64, shape (n_rows, n_features)
    """
    if not encoders:
        return feature_block(table, features)
    block = np.empty((table.num_rows, len(features)), dtype=X_DTYPE)
    numeric = {}
    for j, name in enumerate(features):
        if name in encoders:
            block[:, j] = encoders[name](table.column(name))
        else:
            numeric[name] = block[:, j]
    _fill(numeric, table, 0)
    return block


def local_category_summaries(source, run, names):
    """This rank's categories of columns ``names``, one row group at a time.

    Returns
    -------
    list of list of dict
        Per row group read, :func:`histogram.categories.local_categories` of each
        column; :meth:`histogram.categories.CategoryCoder.from_summaries` merges them
        (with every other rank's) as it merges ranks.

    Raises
    ------
    ValueError
        A column with more distinct values in one row group than a categorical column
        may have (named), or a row group that cannot be read.
    """
    from histogram.categories import local_categories

    out = []
    for table in iter_row_groups(source, run, list(names), ReadStats()):
        part = []
        for name in names:
            try:
                part.append(local_categories(table.column(name))[0])
            except ValueError as exc:
                raise DataError(f"categorical column {name!r} {exc}") from None
        out.append(part)
    return out


def _fill(out, table, pos):
    """Copy each numeric column of ``table`` into ``out[name][pos:pos + n]`` as float64."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    for name, dest in out.items():
        col = table.column(name)
        if pa.types.is_boolean(col.type) or pa.types.is_decimal(col.type):
            col = pc.cast(col, pa.float64())
        # to_numpy on a chunked column with nulls yields float NaN for nulls once cast.
        if col.null_count:
            col = pc.cast(col, pa.float64())
        values = col.to_numpy()
        dest[pos:pos + n] = values


def bad_values(name, values, first_row=0):
    """Describe NaN or infinite values in a column that must be finite.

    Parameters
    ----------
    name : str
    values : ndarray, shape (n,)
    first_row : int
        Global row id of ``values[0]`` (for the message).

    Returns
    -------
    str or None
        A one-line error, or None when every value is finite.
    """
    finite = np.isfinite(values)
    if finite.all():
        return None
    bad = np.flatnonzero(~finite)
    what = "NaN" if np.isnan(values[bad[0]]) else "infinite value"
    return (f"column {name!r} has {bad.size} NaN/infinite value(s) "
            f"(first: {what} at row {first_row + int(bad[0])}); it must be finite")


def class_labels(column, name, first_row=0):
    """Class labels of a classifier's outcome column, or a one-line error.

    Integer and boolean columns keep their values (int64), float columns stay float64
    (the classifier then accepts whole numbers only), text columns (string, or
    dictionary-encoded text as pandas' categoricals are stored) become Python strings.

    Parameters
    ----------
    column : pyarrow.ChunkedArray or Array, length n
    name : str
    first_row : int
        Global row id of the column's first value (for the message).

    Returns
    -------
    labels : ndarray, shape (n,), int64, float64 or object; None with a message
    message : str or None
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    typ = column.type
    if pa.types.is_dictionary(typ):
        column, typ = pc.cast(column, typ.value_type), typ.value_type
    if column.null_count:
        row = int(np.flatnonzero(np.asarray(pc.is_null(column)))[0])
        return None, (f"column {name!r} has {column.null_count} missing value(s) (first at row {first_row + row}); "
                      f"class labels must all be present")
    if pa.types.is_integer(typ) or pa.types.is_boolean(typ):
        return np.asarray(column.to_numpy(zero_copy_only=False)).astype(np.int64), None
    if pa.types.is_floating(typ):
        values = np.asarray(column.to_numpy(zero_copy_only=False), dtype=X_DTYPE)
        return values, bad_values(name, values, first_row)
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return np.asarray(column.to_pylist(), dtype=object), None
    return None, f"column {name!r} has type {typ}, which cannot hold class labels (numbers or text)"


def feature_input(est, table, names):
    """What to pass to ``est.predict`` for the columns ``names`` of an Arrow table.

    A model that records its feature names gets the named columns, so the estimator
    checks them as it does for any table; an older model gets a float64 matrix in
    ``names`` order (and no warning about the names it does not know).
    """
    if getattr(est, "feature_names_in_", None) is not None:
        return table.select(list(names))
    return feature_block(table, list(names))

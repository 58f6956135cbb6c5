"""Compaction: OPTIMIZE, clustered by user, on the tables where small files piled up.

Every micro-batch appends a few small files to most tables, and the changelog MERGE leaves
rewritten files and deletion vectors in ``open_sessions``; reads then pay per file. This
module rewrites them into few large files, while the stream keeps running.

How a table is judged (:func:`survey_table`):

* files and bytes come from Delta's ``DESCRIBE DETAIL`` (``DeltaTable.detail()``), before
  and after, and are what the report shows;
* a *small* file is a live file (an add action of the current snapshot, as
  ``DataFrame.inputFiles()`` lists them from the Delta log, without reading data) smaller
  than ``spark.databricks.delta.optimize.minFileSize``, the threshold Delta's own OPTIMIZE
  uses (1 GiB by default); sizes come from one listing of the table's folder;
* a table is compacted when it holds at least ``min_files`` small files, and then only in
  its partitions that hold two or more of them: a partition with a single file has nothing
  to merge, and Z-ordering rewrites every file of the partitions it is given, so handing it
  the whole table would rewrite every old day on every run.

Clustering by user: a table with a ``user_id`` data column (not a partition column) is
rewritten with ``OPTIMIZE ... ZORDER BY (user_id)``, so that a user's rows sit in few files
and per-user reads (the stream's state lookups, erasure, a user's history) skip the rest
by min/max statistics. ``batch_metrics`` has no user: it is bin-packed
(``executeCompaction``).

Beside the stream: OPTIMIZE only rewrites files (``dataChange=false``), so it never
conflicts with the stream's blind appends, but it can lose a race to the state MERGE (or
the MERGE to it) when both touch the same files of ``open_sessions``. Delta then fails the
loser with a concurrent-modification error and the loser has committed nothing; both sides
go through :func:`sessionlake.conflicts.retry_on_conflict`, which redoes the whole step
against the new version. OPTIMIZE's own check refuses to commit when a file it compacted
was removed or changed meanwhile, so a row deleted by the MERGE cannot come back.
"""

from __future__ import annotations

import difflib
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from urllib.parse import unquote

from delta.tables import DeltaTable
from pyspark.sql import Row, SparkSession
from pyspark.sql.types import StructType

from sessionlake import storage
from sessionlake.config import ActionableError
from sessionlake.conflicts import retry_on_conflict
from sessionlake.deltareader import NULL_PARTITION, OPTIMIZE_MIN_FILE_SIZE
from sessionlake.health_page import fmt_bytes
from sessionlake.tables import PUBLIC_TABLES, not_a_lake, table_path

log = logging.getLogger(__name__)

#: The column tables are clustered by.
CLUSTER_COLUMN = "user_id"
#: Delta's threshold below which OPTIMIZE treats a file as small.
MIN_FILE_SIZE_CONF = "spark.databricks.delta.optimize.minFileSize"

Partition = tuple[str | None, ...]


class CompactionError(ActionableError):
    """The request cannot be carried out as given (nothing was touched)."""


@dataclass(frozen=True)
class CompactionReport:
    """What compaction found in one table and what it did there.

    :ivar files_before: live files before (``DESCRIBE DETAIL``).
    :ivar files_after: live files after; a concurrent stream commit may have added some.
    :ivar small_files_before: live files below Delta's ``optimize.minFileSize``.
    :ivar compacted: whether an OPTIMIZE committed.
    :ivar reason: why the table was skipped, or what was rewritten.
    :ivar zorder_by: the clustering column, ``None`` for plain bin-packing.
    :ivar partitions: how many partitions were rewritten (0 for an unpartitioned table).
    :ivar attempts: OPTIMIZE attempts (more than 1 when it lost a race and was redone).
    """

    table: str
    files_before: int
    files_after: int
    small_files_before: int
    bytes_before: int
    bytes_after: int
    compacted: bool
    reason: str
    zorder_by: str | None = None
    partitions: int = 0
    attempts: int = 0

    def summary(self) -> str:
        """One line for people, e.g.
        ``sessions: 37 files, 1.2 MiB -> 4, 1.1 MiB (OPTIMIZE ZORDER BY user_id)``."""
        before = f"{_files(self.files_before)}, {fmt_bytes(self.bytes_before)}"
        if not self.compacted:
            small = (f" ({self.small_files_before} small)"
                     if self.small_files_before != self.files_before else "")
            return f"{self.table}: {before}{small}, {self.reason}: skipped"
        how = f"OPTIMIZE ZORDER BY {self.zorder_by}" if self.zorder_by else "OPTIMIZE"
        where = f", {self.partitions} partitions" if self.partitions else ""
        retried = f", {self.attempts} attempts" if self.attempts > 1 else ""
        return (f"{self.table}: {before} -> {self.files_after}, {fmt_bytes(self.bytes_after)} "
                f"({how}{where}{retried})")


def _files(count: int) -> str:
    return f"{count} file" if count == 1 else f"{count} files"


@dataclass(frozen=True)
class TableSurvey:
    """A table's files as compaction sees them (see the module docstring)."""

    files: int
    bytes: int
    small_files: int
    partition_columns: tuple[str, ...]
    #: Partitions holding two or more small files, as values of ``partition_columns``;
    #: ``None`` when the file paths do not show their partitions (then: the whole table).
    crowded: tuple[Partition, ...] | None
    zorder_by: str | None


def compact_lake(
    spark: SparkSession,
    lake: str,
    min_files: int,
    tables: Sequence[str] | None = None,
    on_table: Callable[[CompactionReport], None] | None = None,
) -> list[CompactionReport]:
    """OPTIMIZE every table of ``lake`` (or of ``tables``) with ``min_files`` small files.

    Safe while the stream runs: see the module docstring. Everything asked for is checked
    before any table is touched.

    Example::

        for report in compact_lake(spark, "/data/lake", min_files=16):
            print(report.summary())

    :param lake: the lake folder or URI.
    :param min_files: compact a table only when it has at least this many small files (>= 1).
    :param tables: names from :data:`sessionlake.tables.PUBLIC_TABLES`; default all of them.
    :param on_table: called with each table's report as soon as it is done (progress).
    :return: one report per table, in the order of ``tables`` (or PUBLIC_TABLES).
    :raises CompactionError: an unknown table name, ``min_files`` below 1, or no lake.
    """
    names = checked_tables(tables)
    if min_files < 1:
        raise CompactionError(f"min_files must be at least 1, got {min_files}")
    if (why := not_a_lake(spark, lake, names)) is not None:
        raise CompactionError(why)
    reports = []
    for name in names:
        reports.append(compact_table(spark, lake, name, min_files))
        if on_table is not None:
            on_table(reports[-1])
    return reports


def compact_table(
    spark: SparkSession, lake: str, table: str, min_files: int
) -> CompactionReport:
    """Survey ``table`` and OPTIMIZE it when it holds at least ``min_files`` small files."""
    path = table_path(lake, table)
    survey = survey_table(spark, path)
    skipped = CompactionReport(
        table=table, files_before=survey.files, files_after=survey.files,
        small_files_before=survey.small_files, bytes_before=survey.bytes,
        bytes_after=survey.bytes, compacted=False, reason="", zorder_by=survey.zorder_by,
    )
    if survey.small_files < min_files:
        return replace(skipped, reason=f"below --min-files {min_files}")
    if survey.crowded == ():
        return replace(skipped, reason="no partition holds two small files")
    predicate = (None if survey.crowded is None
                 else partition_predicate(survey.partition_columns, survey.crowded,
                                          spark.read.format("delta").load(path).schema))
    attempts = [0]

    def optimize() -> None:
        attempts[0] += 1
        builder = DeltaTable.forPath(spark, path).optimize()
        if predicate is not None:
            builder = builder.where(predicate)
        if survey.zorder_by:
            builder.executeZOrderBy(survey.zorder_by)
        else:
            builder.executeCompaction()

    retry_on_conflict(optimize, f"OPTIMIZE of {table}")
    after = _detail(spark, path)
    files_after, bytes_after = int(after["numFiles"] or 0), int(after["sizeInBytes"] or 0)
    partitions = len(survey.crowded or ()) if survey.partition_columns else 0
    log.info("compacted %s: %d files -> %d", table, survey.files, files_after)
    return CompactionReport(
        table=table, files_before=survey.files, files_after=files_after,
        small_files_before=survey.small_files, bytes_before=survey.bytes,
        bytes_after=bytes_after, compacted=True,
        reason=f"{survey.small_files} small files" + (
            f" in {partitions} partitions" if partitions else ""),
        zorder_by=survey.zorder_by, partitions=partitions, attempts=attempts[0],
    )


def survey_table(spark: SparkSession, path: str) -> TableSurvey:
    """Count the live and the small files of the Delta table at ``path``, all of one
    version (a stream committing beside it made the counts of two disagree: "0 files,
    0 B" before an OPTIMIZE of one small file, the concurrency review).

    Reads the Delta log and lists the folder; reads no data.
    """
    detail = _detail(spark, path)
    partition_columns = tuple(detail["partitionColumns"] or ())
    frame = spark.read.format("delta").load(path)
    live = frame.inputFiles()
    small_below = int(spark.conf.get(MIN_FILE_SIZE_CONF, None) or OPTIMIZE_MIN_FILE_SIZE)
    sizes = storage.file_sizes(spark, path)  # listed after the version was read: every file
    root = storage.qualified(spark, path).rstrip("/") + "/"
    small: list[str] = [name for name in live if sizes.get(name, 0) < small_below]
    crowded: tuple[Partition, ...] | None = ()
    if partition_columns:
        located = [_partition_of(name, root, partition_columns) for name in small]
        if any(p is None for p in located):
            crowded = None
        else:
            per_partition = Counter(p for p in located if p is not None)
            crowded = tuple(sorted((p for p, n in per_partition.items() if n >= 2),
                                   key=lambda p: tuple("" if v is None else v for v in p)))
    elif len(small) < 2:
        crowded = ()
    else:
        crowded = None
    data_columns = {f.name for f in frame.schema.fields} - set(partition_columns)
    return TableSurvey(
        files=len(live), bytes=sum(sizes.get(name, 0) for name in live),
        small_files=len(small),
        partition_columns=partition_columns, crowded=crowded,
        zorder_by=CLUSTER_COLUMN if CLUSTER_COLUMN in data_columns
        and _has_statistics(detail, CLUSTER_COLUMN) else None,
    )


def _has_statistics(detail: Row, column: str) -> bool:
    """Whether the table collects file statistics of ``column``, without which Delta
    refuses to Z-order by it (``quarantine`` and ``late_events`` keep none of their users,
    see their DDL)."""
    listed = (detail["properties"] or {}).get("delta.dataSkippingStatsColumns")
    return listed is None or column in (c.strip() for c in listed.split(","))


def partition_predicate(
    columns: Sequence[str], partitions: Sequence[Partition], schema: StructType
) -> str:
    """An OPTIMIZE ``WHERE`` clause that selects exactly ``partitions``.

    Values are written as typed literals (``CAST('3' AS INT)``), so that the clause means
    the same whatever the session's ANSI or casting settings.
    """
    types = {f.name: f.dataType.simpleString() for f in schema.fields}

    def literal(column: str, value: str) -> str:
        quoted = value.replace("\\", "\\\\").replace("'", "\\'")
        return f"CAST('{quoted}' AS {types[column]})"

    def test(column: str, value: str | None) -> str:
        return (f"`{column}` IS NULL" if value is None
                else f"`{column}` = {literal(column, value)}")

    if len(columns) == 1 and all(p[0] is not None for p in partitions):
        (column,) = columns
        values = ", ".join(literal(column, p[0]) for p in partitions if p[0] is not None)
        return f"`{column}` IN ({values})"
    return " OR ".join(
        "(" + " AND ".join(test(c, v) for c, v in zip(columns, p, strict=True)) + ")"
        for p in partitions
    )


def _partition_of(file: str, root: str, columns: Sequence[str]) -> Partition | None:
    """The partition values in ``file``'s Hive-style folders, ``None`` if it has none."""
    if not file.startswith(root):
        return None
    folders = file[len(root):].split("/")[:-1]
    values: dict[str, str | None] = {}
    for folder in folders:
        key, sep, value = folder.partition("=")
        if not sep:
            return None
        text = unquote(value)
        values[unquote(key)] = None if text == NULL_PARTITION else text
    if set(values) != set(columns):
        return None
    return tuple(values[c] for c in columns)


def _detail(spark: SparkSession, path: str) -> Row:
    """The ``DESCRIBE DETAIL`` row of the table (``numFiles``, ``sizeInBytes``, ...)."""
    row = DeltaTable.forPath(spark, path).detail().head()
    if row is None:
        raise RuntimeError(f"DESCRIBE DETAIL of {path} returned no row")
    return row


def checked_tables(tables: Sequence[str] | None) -> list[str]:
    """The tables asked for, known and without repeats; all public tables by default.

    The command line checks them before Spark starts, so a misspelt name costs no JVM.

    :raises CompactionError: naming the unknown ones, the closest known name of the first,
        and the lake's tables.
    """
    if tables is None or len(tables) == 0:
        return list(PUBLIC_TABLES)
    names = [tables] if isinstance(tables, str) else list(tables)
    unknown = [name for name in names if name not in PUBLIC_TABLES]
    if unknown:
        close = difflib.get_close_matches(unknown[0].lower(), PUBLIC_TABLES, n=1)
        raise CompactionError(
            f"unknown table {', '.join(repr(n) for n in unknown)}: "
            + (f"did you mean {close[0]}? " if close else "")
            + f"the lake's tables are {', '.join(PUBLIC_TABLES)}"
        )
    return list(dict.fromkeys(names))



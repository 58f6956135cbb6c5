"""Delta SQL over the lake's tables by their names: ad-hoc statements, the named analytic
queries of ``sql/queries/``, time travel, and result printing.

A named query is one ``.sql`` file: a ``-- description:`` line, optional
``-- param: <name> <type> <default> -- <what it is>`` lines, then one SELECT that reads its
params from the one-row view ``query_params`` (``CROSS JOIN query_params p`` ... ``p.name``).
User values reach Spark as the typed cells of that row, built with a DataFrame, never pasted
into SQL text. (Spark's own parameter markers, ``spark.sql(text, args=...)``, would be the
natural tool, but Delta 4.4's SQL extension leaves them unbound on Spark 4.2.) Every query
is also registered as a view under its name (one with params, with their defaults), so
``SELECT * FROM bounce_rate`` works too. ``sessionlake serve``'s catalog holds only those
without params: a catalog view cannot read the temporary ``query_params``.
"""

from __future__ import annotations

import base64
import csv
import difflib
import io
import json
import logging
import math
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, TextIO

from delta.tables import DeltaTable
from py4j.java_gateway import is_instance_of
from py4j.protocol import Py4JJavaError
from pyspark import SparkContext
from pyspark.errors.exceptions.captured import UnknownException, convert_exception
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    CalendarIntervalType,
    DataType,
    DecimalType,
    MapType,
    StructType,
    TimestampType,
    VariantVal,
    YearMonthIntervalType,
)

from sessionlake import deltareader
from sessionlake.config import DISPLAY_FORMATS, TABLE_ROWS, ActionableError
from sessionlake.deltalog import BatchKey, tag_batch
from sessionlake.tables import (
    BATCH_METRICS,
    PUBLIC_TABLES,
    SESSIONS,
    sql_dir,
    table_exists,
    table_path,
)

log = logging.getLogger(__name__)

PARAM_TYPES: tuple[str, ...] = ("string", "int", "date", "timestamp")

_PARAM_LINE = re.compile(r"^--\s*param:\s*(\w+)\s+(\w+)\s+(\S+)(?:\s+--\s*(.*))?$")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_DESCRIPTION_LINE = re.compile(r"^--\s*description:\s*(.+)$")


class LakeNotFound(ActionableError, RuntimeError):
    """The lake folder holds no sessionlake tables."""


class QueryError(ActionableError, ValueError):
    """A named query or one of its params is wrong: the message says which and why."""


@dataclass(frozen=True)
class QueryParam:
    """A named query's parameter: its type, the default, and what it means."""

    name: str
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class NamedQuery:
    """One analytic query of ``sql/queries/``."""

    name: str
    description: str
    params: tuple[QueryParam, ...]
    text: str


def queries_dir() -> Path:
    """The folder of the named queries."""
    return sql_dir() / "queries"


def parse_named_query(name: str, text: str) -> NamedQuery:
    """Read a named query's header (description, params) and keep its text."""
    if not _NAME.fullmatch(name):
        raise QueryError(f"query file {name}.sql: the name must be lower-case letters, digits, _")
    description, params = "", []
    for line in text.splitlines():
        if found := _DESCRIPTION_LINE.match(line.strip()):
            description = found.group(1).strip()
        elif found := _PARAM_LINE.match(line.strip()):
            param_name, kind, default, about = found.groups()
            if kind not in PARAM_TYPES:
                raise QueryError(f"query {name}: param {param_name} has unknown type {kind}")
            params.append(QueryParam(param_name, kind, default, (about or "").strip()))
    return NamedQuery(name, description, tuple(params), text)


def named_queries(folder: Path | None = None) -> dict[str, NamedQuery]:
    """Every named query, by name (the file name without ``.sql``), sorted by name."""
    files = sorted((folder or queries_dir()).glob("*.sql"))
    return {f.stem: parse_named_query(f.stem, f.read_text()) for f in files}


#: How a param of each type is written, for the message that refuses one.
_PARAM_FORMATS = {"int": "a whole number", "date": "YYYY-MM-DD, e.g. 2026-01-05",
                  "timestamp": "YYYY-MM-DDTHH:MM:SS, e.g. 2026-01-05T10:00:00"}


def _typed(param: QueryParam, text: str) -> Any:
    try:
        if param.type == "int":
            return int(text)
        if param.type == "date":
            return date.fromisoformat(text)
        if param.type == "timestamp":
            return datetime.fromisoformat(text)
    except ValueError:
        raise QueryError(
            f"param {param.name}={text!r} is not a valid {param.type} "
            f"({_PARAM_FORMATS[param.type]})"
        ) from None
    return text


def bind_params(query: NamedQuery, given: Mapping[str, str]) -> dict[str, Any]:
    """The query's params as typed values: given ones over defaults.

    :raises QueryError: for a param the query does not have, or a value of the wrong type.
    """
    known = {p.name: p for p in query.params}
    unknown = sorted(set(given) - set(known))
    if unknown:
        accepted = ", ".join(known) or "none"
        raise QueryError(
            f"query {query.name} has no param {unknown[0]} (its params: {accepted})"
        )
    return {name: _typed(p, given.get(name, p.default)) for name, p in known.items()}


def parse_param_assignments(items: Sequence[str]) -> dict[str, str]:
    """``["k=v", ...]`` from ``--param`` flags as a dict.

    :raises QueryError: for an item without ``=``, with an empty name, or a name given twice
        (the last one was taken silently).
    """
    values: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise QueryError(f"--param {item!r} must look like name=value")
        if name.strip() in values:
            raise QueryError(f"--param {name.strip()} is given twice: give it once")
        values[name.strip()] = value
    return values


@dataclass(frozen=True)
class AsOf:
    """A point in the lake's past: a version of ``sessions`` or a timestamp."""

    version: int | None = None
    timestamp: datetime | None = None


def parse_as_of(text: str) -> AsOf:
    """``--as-of``: a whole number (a version of ``sessions``) or an ISO date/timestamp (UTC).

    :raises QueryError: for anything else.
    """
    value = text.strip()
    if value.isdigit():
        return AsOf(version=int(value))
    try:
        return AsOf(timestamp=datetime.fromisoformat(value.replace("Z", "+00:00")))
    except ValueError:
        raise QueryError(
            f"--as-of {text!r} must be a version of sessions (12) or a time "
            "(2026-01-31 or 2026-01-31T18:00:00Z)"
        ) from None


#: Operations that rewrite files without changing a row: a walk back over a batch that was
#: not finished yet may step over them.
_NO_DATA_CHANGE: frozenset[str] = frozenset({"OPTIMIZE", "VACUUM START", "VACUUM END"})


@dataclass(frozen=True)
class Commit:
    """One commit of a table, as its history tells it.

    :param micros: the commit time, microseconds since the epoch (UTC).
    :param batch: the micro-batch that made it (its ``userMetadata`` tag), if one did.
    """

    version: int
    micros: int
    operation: str
    batch: BatchKey | None = None


def table_commits(spark: SparkSession, lake: str, table: str) -> list[Commit]:
    """Every commit of ``table`` still in its history, newest first."""
    rows = DeltaTable.forPath(spark, table_path(lake, table)).history().select(
        "version", F.unix_micros("timestamp").alias("micros"), "operation", "userMetadata"
    ).collect()
    commits = [Commit(int(r["version"]), int(r["micros"]), str(r["operation"]),
                      tag_batch(r["userMetadata"])) for r in rows]
    return sorted(commits, key=lambda c: c.version, reverse=True)


def finished_batches(metrics_commits: Sequence[Commit], moment: int) -> dict[str, int]:
    """The newest batch of each stream whose ``batch_metrics`` row was committed by ``moment``.

    That row is a batch's last write: a batch without it was not finished at that moment.
    """
    done: dict[str, int] = {}
    for commit in metrics_commits:
        if commit.micros <= moment and commit.batch is not None:
            app, batch = commit.batch
            done[app] = max(batch, done.get(app, -1))
    return done


def version_at(
    commits: Sequence[Commit], moment: int, finished: Mapping[str, int]
) -> int | None:
    """The newest version of a table at ``moment`` that holds no write of an unfinished batch.

    A micro-batch commits its tables side by side, so at any moment a table may already
    hold a batch that another table does not hold yet. Stepping back over such commits
    (and over compactions after them) gives every table the same finished batches.

    :param commits: the table's commits, newest first.
    :return: ``None`` when the table did not exist yet.
    """
    chosen: int | None = None
    for commit in commits:
        if commit.micros > moment:
            continue
        if chosen is None:
            chosen = commit.version
        if commit.batch is not None and commit.batch[1] > finished.get(commit.batch[0], -1):
            chosen = commit.version - 1
        elif commit.operation not in _NO_DATA_CHANGE:
            break
    return None if chosen is None or chosen < 0 else chosen


def _micros(stamp: datetime) -> int:
    """``stamp`` (UTC when naive) in microseconds since the epoch."""
    aware = stamp if stamp.tzinfo is not None else stamp.replace(tzinfo=UTC)
    return (aware - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def as_of_versions(spark: SparkSession, lake: str, as_of: AsOf) -> dict[str, int | None]:
    """The version of every table to read for ``as_of``: the lake between two batches.

    A time is the lake as it was then, without the batch that was being written (if any).
    A version of ``sessions`` written by a micro-batch is the lake just after that batch;
    any other version of ``sessions`` (its creation, a compaction, an erasure, a restore) is
    the lake at its commit time. Version numbers differ from table to table, so the other
    tables are found by the batch and its time, never by the number.

    :raises QueryError: when ``sessions`` has no such version.
    """
    histories = {table: table_commits(spark, lake, table)
                 for table in PUBLIC_TABLES if table_exists(spark, lake, table)}
    metrics = histories.get(BATCH_METRICS, [])
    if as_of.timestamp is not None:
        moment = _micros(as_of.timestamp)
    else:
        found = next((c for c in histories.get(SESSIONS, []) if c.version == as_of.version),
                     None)
        if found is None:
            kept = [c.version for c in histories.get(SESSIONS, [])]
            have = f"versions {min(kept)} to {max(kept)}" if kept else "no version"
            raise QueryError(f"--as-of {as_of.version}: sessions has no version "
                             f"{as_of.version} (it has {have})")
        batch_done = [c.micros for c in metrics if found.batch and c.batch == found.batch]
        moment = max([found.micros, *batch_done])
    finished = finished_batches(metrics, moment)
    versions = {table: version_at(history, moment, finished)
                for table, history in histories.items()}
    if histories and all(v is None for v in versions.values()):
        created = min(c.micros for history in histories.values() for c in history)
        raise QueryError(
            f"--as-of {_text(as_of.timestamp)}: the lake did not exist yet; its first table "
            f"was created at {_text(datetime.fromtimestamp(created / 1e6, UTC))}")
    if as_of.version is not None:
        versions[SESSIONS] = as_of.version
    return versions


def register_table(spark: SparkSession, name: str, path: str) -> None:
    """Make ``name`` the Delta table at ``path`` in the session catalog (by location: the
    catalog holds only the name), so that Delta's own SQL reaches it by name:
    ``DESCRIBE HISTORY sessions``, ``VERSION AS OF``, ``OPTIMIZE``.

    A view or an earlier registration of the name (another lake, in the same session) is
    replaced; a catalog table that owns its data is left alone, and the name refused.

    :raises QueryError: when the name belongs to such a table.
    """
    unregister_table(spark, name)
    spark.catalog.createTable(name, path=path, source="delta")


def unregister_table(spark: SparkSession, name: str) -> None:
    """Drop the session's view or by-location catalog table ``name`` (an earlier lake's),
    so that a statement on a lake without that table is told it is not found.

    :raises QueryError: when the name belongs to a catalog table that owns its data.
    """
    spark.catalog.dropTempView(name)
    if spark.catalog.tableExists(name):
        found = spark.catalog.getTable(name)
        if found.tableType != "EXTERNAL":
            raise QueryError(f"the catalog already holds a {found.tableType.lower()} "
                             f"table {name}, not sessionlake's: not replaced")
        spark.sql(f"DROP TABLE {name}")  # by location: its files stay


def register_tables(spark: SparkSession, lake: str, as_of: AsOf | None = None,
                    only: Collection[str] | None = None) -> list[str]:
    """Register every table of the lake under its name: as it is, as a catalog table
    (:func:`register_table`); as it was (``as_of``), as a view of its version then.

    :param only: register these tables alone (:func:`names_used`); ``None``: all of them.
    :return: the names registered.
    :raises LakeNotFound: when the lake has none of the tables.
    """
    wanted = [t for t in PUBLIC_TABLES if only is None or t in only]
    if as_of is None:
        versions: dict[str, int | None] = {
            table: None for table in wanted if table_exists(spark, lake, table)
        }
    else:
        versions = {t: v for t, v in as_of_versions(spark, lake, as_of).items()
                    if v is not None and t in wanted}
    for table in set(wanted) - set(versions):
        unregister_table(spark, table)
    names = []
    for table, version in versions.items():
        if version is None:
            register_table(spark, table, table_path(lake, table))
        else:
            spark.read.format("delta").option("versionAsOf", version).load(
                table_path(lake, table)).createOrReplaceTempView(table)
        names.append(table)
    if not names and (only is None or not any(table_exists(spark, lake, t)
                                              for t in PUBLIC_TABLES)):
        raise LakeNotFound(
            f"no sessionlake tables in {lake}: check --lake, or create them with "
            "`sessionlake run`"
        )
    return names


def register_views(spark: SparkSession, queries: Mapping[str, NamedQuery]) -> list[str]:
    """Register every named query as a temporary view under its name, a query with params
    with their defaults: ``SELECT * FROM funnel`` is ``--query funnel``.

    Each view keeps the plan analysed when it was made, in which ``query_params`` is the
    row of that query's defaults, so one ``query_params`` view serves them all in turn.
    """
    for name, query in queries.items():
        register_params(spark, query, bind_params(query, {}))
        spark.sql(query.text).createOrReplaceTempView(name)
    return list(queries)


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def names_used(statement: str, queries: Mapping[str, NamedQuery]) -> set[str] | None:
    """The tables and named queries ``statement`` reads, with what those queries read in
    turn: each is registered only when used, since every registration costs a query plan
    (all twenty took about 4 s of a cold ``sessionlake sql``). ``None`` when it names none
    of them (``SHOW TABLES``, ``SHOW VIEWS``): then all are registered.

    Names are found as words, whatever their case or quotes; a word that only looks like
    one (in a string, say) registers a name for nothing, never too few.
    """
    known = {*PUBLIC_TABLES, *queries}
    used = {w.lower() for w in _WORD.findall(statement)} & known
    if not used:
        return None
    todo = [name for name in used if name in queries]
    while todo:
        read = {w.lower() for w in _WORD.findall(queries[todo.pop()].text)} & known
        todo.extend(n for n in read - used if n in queries)
        used |= read
    return used


def bytes_to_read(lake: str, statement: str) -> int | None:
    """Bytes of the live files of the lake's tables that ``statement`` reads
    (:func:`names_used`; every table when it names none), from their Delta logs without
    Spark: what chooses the compiler of the query's driver
    (:func:`sessionlake.spark.quick_start_for_query`).

    The tables' newest versions, whatever ``--as-of`` reads; a table not there counts
    nothing (the query will say it is missing). ``None`` when a log cannot be read here:
    a lake not on this machine's disks, a reader feature this reader does not know, or a
    damaged log. The size only chooses a compiler, so whatever stops this reader leaves it
    unknown and the query runs as it would have, to report damage its own way.
    """
    used = names_used(statement, named_queries())
    total = 0
    try:
        for table in PUBLIC_TABLES:
            location = table_path(lake, table)
            if (used is None or table in used) and deltareader.is_delta_table(location):
                total += deltareader.read_state(location).total_bytes
    except Exception as error:  # whatever stops the reader: see above
        log.debug("the tables' size is unknown: %s", error)
        return None
    return total


def names_hint(missing: str, queries: Mapping[str, NamedQuery] | None = None) -> str:
    """What to read instead of a table or view ``missing`` that no name of the lake has:
    the closest name if one is close (a table or a named query), and the tables, since a
    misspelt name otherwise costs another try, with Spark's start, each time."""
    queries = named_queries() if queries is None else queries
    known = [*PUBLIC_TABLES, *queries]
    name = missing.strip("`").split(".")[-1].strip("`").lower()
    close = difflib.get_close_matches(name, known, n=1)
    return ((f"did you mean {close[0]}? " if close else "")
            + f"the lake's tables: {', '.join(PUBLIC_TABLES)}; `sessionlake sql --list` "
            "lists the named queries")


#: The statements besides queries that ``sessionlake sql`` runs: they read, never write.
READ_ONLY_STATEMENTS = frozenset({
    "DescribeRelation", "DescribeColumn", "DescribeDeltaHistory", "DescribeDeltaDetailCommand",
    "DescribeFunction", "DescribeNamespace", "DescribeQueryCommand", "ShowTables",
    "ShowTablesExtended", "ShowViews", "ShowColumns", "ShowCreateTable",
    "ShowTableProperties", "ShowPartitions", "ShowFunctions", "ShowNamespaces",
    "ShowCatalogsCommand", "ShowCurrentNamespaceCommand", "ExplainCommand",
})
#: Statements that write without being Spark commands (a command runs as soon as
#: ``spark.sql`` is called; these when their result is). Any ``...Statement`` node too.
_WRITES = frozenset({"InsertIntoDir", "UnresolvedExecuteImmediate", "Call", "CompoundBody"})


def check_read_only(spark: SparkSession, statement: str) -> None:
    """Refuse a statement that would change the lake, before it runs: a query, or a
    DESCRIBE, SHOW or EXPLAIN (:data:`READ_ONLY_STATEMENTS`) only.

    The tables change through the commands that keep the stream's locks and the audit
    (run, backfill, retention, restore, compact); a ``DELETE`` or ``UPDATE`` typed here
    changed closed sessions, or the state later batches build on, with neither, and
    ``doctor`` saw nothing. The whole parsed plan is looked through: a Hive multi-insert
    (``FROM t INSERT INTO ... INSERT INTO ...``) is a union of inserts, and a Delta
    ``CLONE`` a statement that is no command. A statement Spark cannot parse is left to
    Spark's own error.

    :raises QueryError: naming the statement refused and what changes the lake instead.
    """
    from py4j.protocol import Py4JJavaError

    try:
        plan = spark._jsparkSession.sessionState().sqlParser().parsePlan(statement)
    except Py4JJavaError:
        return  # spark.sql says what is wrong with it
    if plan.getClass().getSimpleName() in READ_ONLY_STATEMENTS:
        return
    jvm = spark._jvm
    assert jvm is not None  # a classic session's
    command = jvm.java.lang.Class.forName("org.apache.spark.sql.catalyst.plans.logical.Command")
    nodes = [plan]
    while nodes:
        node = nodes.pop()
        kind = node.getClass().getSimpleName()
        if command.isInstance(node) or kind in _WRITES or kind.endswith("Statement"):
            raise QueryError(
                f"sessionlake sql reads the lake and does not change it ({kind} refused; "
                "queries, DESCRIBE, SHOW and EXPLAIN run): the tables change through "
                "sessionlake run, backfill, retention, compact and restore, which keep the "
                "stream's locks and the audit")
        children = node.children()
        nodes.extend(children.apply(i) for i in range(children.size()))


def run_sql(
    spark: SparkSession, lake: str, statement: str, as_of: AsOf | None = None
) -> DataFrame:
    """Run ``statement`` with the lake's tables and the named queries by name (those it
    uses: :func:`names_used`), when it only reads (:func:`check_read_only`)."""
    check_read_only(spark, statement)
    queries = named_queries()
    used = names_used(statement, queries)
    register_tables(spark, lake, as_of, used)
    register_views(spark, {n: q for n, q in queries.items() if used is None or n in used})
    return spark.sql(statement)


_SPARK_TYPES = {"string": "string", "int": "bigint", "date": "date", "timestamp": "timestamp"}
PARAMS_VIEW = "query_params"


def register_params(spark: SparkSession, query: NamedQuery, values: Mapping[str, Any]) -> None:
    """Make ``values`` the one row of the ``query_params`` view, typed as the query declares.

    Each value is a literal of the plan (bound, never SQL text), which the optimizer folds
    into the query's filters: a date range then prunes the partitions it reads, where a
    row of ``createDataFrame`` read every day of ``sessions``.
    """
    def cell(value: Any) -> Column:
        # A date or time as its ISO text: py4j cannot hand Java 0001-01-01 as a date.
        return F.lit(value.isoformat() if isinstance(value, date | datetime) else value)

    cells = [cell(values[p.name]).cast(_SPARK_TYPES[p.type]).alias(p.name)
             for p in query.params]
    frame = spark.range(1).select(*cells) if cells else spark.range(1)
    frame.createOrReplaceTempView(PARAMS_VIEW)


def check_named_query(name: str, params: Mapping[str, str]) -> dict[str, Any]:
    """The typed params of the named query ``name``: a wrong name or param is told without
    Spark, before a session starts (5 s of a JVM for a typo).

    :raises QueryError: for an unknown name or bad params.
    """
    queries = named_queries()
    if name not in queries:
        close = difflib.get_close_matches(name, list(queries), n=1)
        raise QueryError(
            f"no query named {name!r}: " + (f"did you mean {close[0]}? " if close else "")
            + f"`sessionlake sql --list` shows the {len(queries)} there are"
        )
    return bind_params(queries[name], params)


def run_named_query(
    spark: SparkSession,
    lake: str,
    name: str,
    params: Mapping[str, str] | None = None,
    as_of: AsOf | None = None,
) -> DataFrame:
    """Run the named query ``name`` with ``params`` as the row of ``query_params``.

    :raises QueryError: for an unknown name or bad params (before reading any table).
    """
    queries = named_queries()
    values = check_named_query(name, params or {})
    register_tables(spark, lake, as_of, names_used(queries[name].text, queries))
    register_params(spark, queries[name], values)
    return spark.sql(queries[name].text)


def _text(value: Any, kind: DataType | None = None, exact: bool = False) -> str:
    """A collected value of Spark type ``kind`` as a cell, as Spark SQL spells it where
    Python would not (``true``, not ``True``): a double as :func:`_double_text` shows it or
    written to round-trip (``exact``, for CSV, which other programs read back), an interval
    as an ISO 8601 duration, binary in hex (as Spark's ``hex``), and an array, map, struct
    or variant as JSON text."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, float):
        return repr(value) if exact else _double_text(value)
    if isinstance(value, timedelta):
        return _iso_duration(value)
    if isinstance(value, bytes | bytearray):
        return value.hex().upper()
    if isinstance(value, VariantVal):
        return value.toJson()
    if isinstance(value, list | tuple | dict):
        return _json_text(_jsonable(value, kind), ensure_ascii=False)
    return str(value)


def _double_text(value: float) -> str:
    """A double to 15 significant digits, as many as any decimal of up to 15 digits keeps
    through a double (so ``0.1 + 0.2`` reads 0.3, and 1234567.89 is not cut to 1.23457e+06),
    with its decimal point kept (3.0, not 3) so that a column of doubles reads as one."""
    text = f"{value:.15g}"
    return text if any(c in text for c in ".eni") else f"{text}.0"


def _iso_duration(value: timedelta) -> str:
    """A day-time interval as an ISO 8601 duration (``PT36.5S``, ``P3DT2H``, ``-PT1S``),
    which other programs read back; Python's own text of it (``-1 day, 23:59:59``) is not."""
    micros = (value.days * 86_400 + value.seconds) * 10**6 + value.microseconds
    sign, micros = "-" if micros < 0 else "", abs(micros)
    days, micros = divmod(micros, 86_400 * 10**6)
    hours, micros = divmod(micros, 3_600 * 10**6)
    minutes, micros = divmod(micros, 60 * 10**6)
    seconds = f"{micros // 10**6}.{micros % 10**6:06d}".rstrip("0").rstrip(".")
    time = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "") + (
        f"{seconds}S" if micros else "")
    text = (f"{days}D" if days else "") + (f"T{time}" if time else "")
    return f"{sign}P{text or 'T0S'}"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float | Decimal) and not isinstance(value, bool)


def _jsonable(value: Any, kind: DataType | None = None) -> Any:
    """A collected value of Spark type ``kind`` as JSON. A ``TIMESTAMP`` is an instant:
    it is written with its zone (``+00:00``), so that no reader takes it for local time.
    PySpark hands it back as a naive datetime in the process's local time, which
    ``astimezone`` reads as such. A struct becomes an object with its field names, a
    variant the JSON it holds, binary base64 (as Spark's ``to_json``) and an interval an
    ISO 8601 duration."""
    if value is None:
        return None
    if isinstance(kind, TimestampType) and isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return _iso_duration(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, VariantVal):
        return json.loads(value.toJson())
    if isinstance(kind, StructType) and isinstance(value, tuple):
        return {f.name: _jsonable(v, f.dataType)
                for f, v in zip(kind.fields, value, strict=True)}
    if isinstance(kind, MapType) and isinstance(value, dict):
        return {_text(k, kind.keyType): _jsonable(v, kind.valueType) for k, v in value.items()}
    if isinstance(value, list | tuple):
        element = kind.elementType if isinstance(kind, ArrayType) else None
        return [_jsonable(v, element) for v in value]
    if isinstance(value, dict):
        return {_text(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return _SPARK_JSON_SPECIAL[str(value)]  # JSON has no NaN nor infinity
    return value


def _json_text(value: Any, ensure_ascii: bool = True) -> str:
    """``value`` (as :func:`_jsonable` makes it) as JSON, with each decimal written digit
    for digit as a number: a ``DECIMAL(38,2)`` sum keeps its cents, which a double would
    not past 15 or so digits."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=ensure_ascii)}: "
                               f"{_json_text(v, ensure_ascii)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_json_text(v, ensure_ascii) for v in value) + "]"
    return json.dumps(value, ensure_ascii=ensure_ascii)


#: How Spark's ``to_json`` writes the doubles JSON has no number for.
_SPARK_JSON_SPECIAL = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def format_rows(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], output: str,
    types: Sequence[DataType] | None = None, more: bool = False,
) -> str:
    """Rows as an aligned text table (numbers right-aligned) or vertically (a block per
    record, a line per column: for rows too wide for a table), either ending in a line that
    counts the rows or, when ``more`` rows were left out, says so and how to see them; CSV
    with a header (doubles written to read back the same); or JSON lines (whose values
    :func:`_jsonable` writes by the columns' Spark ``types``, when given)."""
    kinds: Sequence[DataType | None] = types or [None] * len(columns)
    if output == "table":
        return _table(columns, rows, kinds, more)
    if output == "vertical":
        return _vertical(columns, rows, kinds, more)
    buffer = io.StringIO()
    _write_lines(buffer, columns, rows, output, kinds)
    return buffer.getvalue()


def _write_lines(out: TextIO, columns: Sequence[str], rows: Iterable[Sequence[Any]],
                 output: str, kinds: Sequence[DataType | None]) -> None:
    """Write ``rows`` to ``out`` as CSV with a header or as JSON lines, one at a time."""
    if output == "json":
        # json.dumps is the fast path; it has no way to write a decimal exactly.
        encode = _json_text if any(k is None or _holds(k, DecimalType) for k in kinds) \
            else json.dumps
        out.writelines(encode({c: _jsonable(v, k)
                               for c, v, k in zip(columns, row, kinds, strict=True)}) + "\n"
                       for row in rows)
        return
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([_text(v, k, exact=True) for v, k in zip(row, kinds, strict=True)]
                     for row in rows)


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]],
           kinds: Sequence[DataType | None], more: bool) -> str:
    cells = [[_text(v, k) for v, k in zip(row, kinds, strict=True)] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    # Numbers are right-aligned, so that their digits line up by place.
    numeric = [any(row[i] is not None for row in rows)
               and all(row[i] is None or _is_number(row[i]) for row in rows)
               for i in range(len(columns))]

    def line(texts: Sequence[str]) -> str:
        return "  ".join(t.rjust(w) if right else t.ljust(w)
                         for t, w, right in zip(texts, widths, numeric, strict=True)).rstrip()

    lines = [line(columns), "  ".join("-" * w for w in widths), *(line(r) for r in cells),
             _count_line(len(rows), more)]
    return "\n".join(lines) + "\n"


def _vertical(columns: Sequence[str], rows: Sequence[Sequence[Any]],
              kinds: Sequence[DataType | None], more: bool) -> str:
    """A block per row, headed ``-[ RECORD n ]``, with a ``column | value`` line per
    column (as psql's expanded display): a row of long JSON cells reads without scrolling
    sideways."""
    width = max((len(c) for c in columns), default=0)
    lines: list[str] = []
    for n, row in enumerate(rows, start=1):
        lines.append(f"-[ RECORD {n} ]")
        lines.extend(f"{c.ljust(width)} | {_text(v, k)}".rstrip()
                     for c, v, k in zip(columns, row, kinds, strict=True))
    lines.append(_count_line(len(rows), more))
    return "\n".join(lines) + "\n"


def _count_line(count: int, more: bool) -> str:
    """A display's last line: how many rows it shows, or that the result has more."""
    if more:
        return (f"(the first {count:,} rows; the result has more: --limit N prints N, "
                "--output csv or json writes them all)")
    return f"({count} row{'s' if count != 1 else ''})"


def write_frame(frame: DataFrame, output: str, out: TextIO, limit: int | None = None) -> None:
    """Write ``frame``'s rows (up to ``limit``) to ``out`` as :func:`format_rows` formats
    them. CSV and JSON lines go out as the rows come, a partition at a time, so that an
    export need not fit in the driver's memory (nor in Spark's ``maxResultSize``). A table
    is written once all its rows are known, for its widths, so without a ``limit`` it (and
    the vertical display, also for reading) shows the first
    :data:`~sessionlake.config.TABLE_ROWS` and says when there are more: a
    ``SELECT * FROM events`` typed to look does not pull the whole table into the driver."""
    frame = collectable(frame)
    if limit is not None:
        frame = frame.limit(limit)
    kinds = [f.dataType for f in frame.schema.fields]
    if output in DISPLAY_FORMATS:
        shown = limit if limit is not None else TABLE_ROWS
        rows = [tuple(r) for r in frame.limit(shown + 1).collect()]
        out.write(format_rows(frame.columns, rows[:shown], output, kinds,
                              more=len(rows) > shown))
        return
    _write_lines(out, frame.columns, _rows_as_they_come(frame), output, kinds)


def _rows_as_they_come(frame: DataFrame) -> Iterator[tuple[Any, ...]]:
    """``frame``'s rows a partition at a time. A failure is raised as PySpark raises a
    collect's (``[DIVIDE_BY_ZERO] ...``), not as the Py4J error of the iterator's wait
    around it."""
    try:
        for row in frame.toLocalIterator(prefetchPartitions=True):
            yield tuple(row)
    except Py4JJavaError as error:
        # As PySpark raises a collect's failure: its own exception for the errors it knows,
        # else the Py4J error, around the Spark error itself.
        within = _spark_error_within(error.java_exception)
        converted = convert_exception(within)
        if not isinstance(converted, UnknownException):
            raise converted from None
        raise Py4JJavaError("An error occurred while reading the result", within) from None


def _spark_error_within(java_error: Any) -> Any:
    """The first exception along ``java_error``'s causes that names a Spark error condition
    (``DIVIDE_BY_ZERO``, ``FAILED_READ_FILE...``), else the innermost."""
    gateway = SparkContext._gateway
    error = java_error
    while True:
        if is_instance_of(gateway, error, "org.apache.spark.SparkThrowable") \
                and error.getCondition() is not None:
            return error
        if error.getCause() is None:
            return error
        error = error.getCause()


#: Types PySpark cannot bring back to Python (its collect raises NOT_IMPLEMENTED).
_UNCOLLECTABLE = (YearMonthIntervalType, CalendarIntervalType)


def _holds(kind: DataType, types: type[DataType] | tuple[type[DataType], ...]) -> bool:
    """Whether a value of ``kind`` is, or holds anywhere within it, one of ``types``."""
    if isinstance(kind, ArrayType):
        return _holds(kind.elementType, types)
    if isinstance(kind, MapType):
        return _holds(kind.keyType, types) or _holds(kind.valueType, types)
    if isinstance(kind, StructType):
        return any(_holds(f.dataType, types) for f in kind.fields)
    return isinstance(kind, types)


def collectable(frame: DataFrame) -> DataFrame:
    """``frame`` with each column that holds a year-month or calendar interval, which
    PySpark cannot collect, as Spark's own text of it (``INTERVAL '2-3' YEAR TO MONTH``)."""
    fields = frame.schema.fields
    if not any(_holds(f.dataType, _UNCOLLECTABLE) for f in fields):
        return frame
    # By position: a result may repeat a column name (SELECT a, a).
    positional = frame.toDF(*(f"_{i}" for i in range(len(fields))))
    return positional.select(*(
        (F.col(f"_{i}").cast("string") if _holds(f.dataType, _UNCOLLECTABLE)
         else F.col(f"_{i}")).alias(f.name)
        for i, f in enumerate(fields)))

"""The lake's Delta tables: their names, their DDL (kept in ``sql/tables/``), and the
small set of read and write primitives every stage uses.

The SQL files are the single source of each table's schema: :func:`ensure_tables` applies
them, so what a SQL user reads in ``sql/tables/sessions.sql`` is what the engine writes.
A micro-batch's writes go through :func:`append` and :func:`tagged_session`, which tag
each commit with the batch (:func:`sessionlake.deltalog.batch_tag`): a batch replayed after
a crash finds with :func:`batch_commit_metrics` what its first attempt already committed,
and skips it instead of writing it twice.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from sessionlake import storage
from sessionlake.checkpoint import LAKE_LOCK_DIR
from sessionlake.config import no_lake_message
from sessionlake.deltalog import (
    BatchKey,
    batch_keys,
    batch_tag,
    commit_actions,
    commit_file,
    read_log,
)
from sessionlake.spark import PROJECT_ROOT

EVENTS = "events"
OPEN_SESSIONS = "open_sessions"
SESSIONS = "sessions"
SESSION_CHANGELOG = "session_changelog"
LATE_EVENTS = "late_events"
QUARANTINE = "quarantine"
BATCH_METRICS = "batch_metrics"
RETENTION_AUDIT = "retention_audit"

#: The property of ``open_sessions`` that fixes its bucket count (set at its creation).
BUCKETS_PROPERTY = "sessionlake.userBuckets"
#: Properties of the DDL (``sql/tables/``) that tables created before they were added get
#: at the lake's next run (:func:`upgrade_table_properties`). Each changes how Delta writes
#: the table, never what it holds.
UPGRADABLE_PROPERTIES = ("delta.checkpointInterval", "delta.dataSkippingStatsColumns")
#: Values of those properties that an earlier release's DDL set and the DDL has since
#: replaced: a table holding one gets the DDL's value, like a table lacking the property.
#: ``events`` was created with this list between 16c45a0 and 1ce5698, which added
#: ``event_id`` so that the duplicate check can skip files by their ids.
SUPERSEDED_PROPERTY_VALUES: dict[tuple[str, str], tuple[str, ...]] = {
    (EVENTS, "delta.dataSkippingStatsColumns"): ("event_time,user_id,batch_id,ingested_at",),
}
#: Raised whenever the upgrade has something new to give: a lake whose note holds a lower
#: revision is checked again (a note without one was written at revision 1).
PROPERTIES_REVISION = 3  # 3: quarantine's and late_events' statistics without users
#: That the lake's tables were given them: ``{"revision": n, "properties": [...]}``.
PROPERTIES_NOTE = f"{LAKE_LOCK_DIR}/table-properties.json"
_DDL_PROPERTY = re.compile(r"'([\w.]+)'\s*=\s*'([^']*)'")

log = logging.getLogger("sessionlake.tables")

#: The tables the stream writes, in the order a micro-batch writes them: together they are
#: the state a snapshot captures and a restore returns to.
STREAM_TABLES: tuple[str, ...] = (
    EVENTS,
    OPEN_SESSIONS,
    SESSIONS,
    SESSION_CHANGELOG,
    LATE_EVENTS,
    QUARANTINE,
    BATCH_METRICS,
)
#: The tables that hold a user's data: what a per-user erasure must reach.
USER_TABLES: tuple[str, ...] = (
    EVENTS, OPEN_SESSIONS, SESSIONS, SESSION_CHANGELOG, LATE_EVENTS, QUARANTINE,
)
#: The tables SQL users query by name (SPEC). The retention audit is not restored with a
#: snapshot: it records erasures, which must outlive any restore.
PUBLIC_TABLES: tuple[str, ...] = (*STREAM_TABLES, RETENTION_AUDIT)
ALL_TABLES: tuple[str, ...] = PUBLIC_TABLES


def sql_dir() -> Path:
    """The folder of the project's SQL files (``$SESSIONLAKE_SQL_DIR`` or ``sql/``)."""
    return Path(os.environ.get("SESSIONLAKE_SQL_DIR") or PROJECT_ROOT / "sql")


def table_ddl(table: str, location: str, user_buckets: int = 16) -> str:
    """The ``CREATE TABLE IF NOT EXISTS`` statement of ``table`` at ``location``, named as
    every other statement names it (:func:`path_identifier`), so that any path a run can
    read and write, a backtick in it too, can also be created."""
    text = (sql_dir() / "tables" / f"{table}.sql").read_text(encoding="utf-8")
    return (text.replace("delta.`${location}`", path_identifier(location))
            .replace("${user_buckets}", str(user_buckets)))


def table_path(lake: str, table: str) -> str:
    """Where ``table`` lives inside the lake."""
    return f"{lake.rstrip('/')}/{table}"


def path_identifier(path: str) -> str:
    """The Delta table at ``path`` as a SQL identifier (``delta.`path```), for the APIs
    that take a table name: a backtick in the path is escaped, so it names that path."""
    return "delta.`" + path.replace("`", "``") + "`"


def _commit_versions(spark: SparkSession | None, lake: str, table: str) -> list[int]:
    """The versions of the commit files in ``table``'s log (empty when it has none)."""
    names = storage.list_names(spark, f"{table_path(lake, table)}/_delta_log")
    return [int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit()]


T = TypeVar("T")


def each_table(work: Callable[[str], T], tables: Iterable[str]) -> dict[str, T]:
    """``work(table)`` for each table, side by side; the results by table.

    Maintenance does the same to several tables, each a few Delta commits that wait on the
    file system and the scheduler more than they compute: side by side, those waits overlap.
    The first failure is raised once every table's work has ended.
    """
    names = list(tables)
    with ThreadPoolExecutor(max_workers=max(1, len(names))) as pool:
        futures = {table: pool.submit(work, table) for table in names}
    return {table: future.result() for table, future in futures.items()}


def table_exists(spark: SparkSession | None, lake: str, table: str) -> bool:
    """Whether ``table`` has been created: its log holds at least one commit.

    A process killed while creating a table can leave its ``_delta_log`` folder without a
    commit: Delta cannot open that, and ``CREATE TABLE IF NOT EXISTS`` leaves it as it is.
    """
    return bool(_commit_versions(spark, lake, table))


def no_lake_at(spark: SparkSession | None, lake: str) -> str | None:
    """Why ``lake`` is no lake at all, when none of the stream's tables is there (a
    misspelt ``--lake`` must say so, not pass for an empty or a damaged lake); else
    ``None``."""
    if any(table_exists(spark, lake, table) for table in STREAM_TABLES):
        return None
    return no_lake_message(lake)


def single_row(frame: DataFrame) -> Row:
    """The one row of an aggregate without grouping (Spark gives it even over no rows)."""
    row = frame.head()
    if row is None:
        raise RuntimeError("an aggregate returned no row")
    return row


def not_a_lake(spark: SparkSession | None, lake: str,
               tables: Sequence[str] = STREAM_TABLES) -> str | None:
    """Why a command cannot work on ``lake``: no lake there at all (:func:`no_lake_at`),
    or a lake without some of ``tables``, the ones the command needs (a first run cut off
    while it created them); ``None`` when every one is there."""
    if (no_lake := no_lake_at(spark, lake)) is not None:
        return no_lake
    missing = [table for table in tables if not table_exists(spark, lake, table)]
    if missing:
        return (f"{lake} is not a sessionlake lake: no Delta table {', '.join(missing)} in "
                "it (`sessionlake run` creates the tables)")
    return None


def ensure_tables(spark: SparkSession, lake: str, user_buckets: int = 16) -> int:
    """Create every table of the lake that does not exist yet (idempotent).

    :param spark: a Delta-enabled session.
    :param lake: the lake folder or URI.
    :param user_buckets: how many user buckets ``open_sessions`` gets, if it is created now.
    :return: the bucket count of the lake's ``open_sessions`` (fixed at its creation: a
        stream must use it whatever its settings say, or its MERGE would miss rows).
    """
    missing = [table for table in ALL_TABLES if not table_exists(spark, lake, table)]
    for table in missing:
        # A process killed while creating the table can leave a log folder without a
        # commit; CREATE TABLE IF NOT EXISTS would take it for a table and do nothing.
        storage.delete(spark, f"{table_path(lake, table)}/_delta_log")

    def create(table: str) -> None:
        spark.sql(table_ddl(table, table_path(lake, table), user_buckets))

    # Each creation is a commit of its own table, mostly waiting on the file system: side
    # by side they take less time than one after the other. But in a new process the first
    # creation runs Delta's and Spark's code cold, and eight threads doing that at once
    # stall each other: the first alone, then the rest side by side, created a new lake's
    # eight tables in 3.5-4.2 s (mean 3.8, six new processes) against 4.1-5.4 s (4.8) all
    # side by side and 4.0-4.5 s one after the other.
    if missing:
        create(missing[0])
    each_table(create, missing[1:])
    if len(missing) == len(ALL_TABLES):  # a new lake: its tables have every property
        _note_properties(spark, lake)
    return configured_user_buckets(spark, lake) or user_buckets


def ddl_properties(table: str) -> dict[str, str]:
    """The ``TBLPROPERTIES`` that ``table``'s DDL sets (comments aside)."""
    text = (sql_dir() / "tables" / f"{table}.sql").read_text(encoding="utf-8")
    code = "\n".join(line.split("--", 1)[0] for line in text.splitlines())
    start = code.find("TBLPROPERTIES")
    return dict(_DDL_PROPERTY.findall(code[start:])) if start >= 0 else {}


def _note_properties(spark: SparkSession, lake: str) -> None:
    storage.write_text(spark, f"{lake.rstrip('/')}/{PROPERTIES_NOTE}",
                       json.dumps({"revision": PROPERTIES_REVISION,
                                   "properties": sorted(UPGRADABLE_PROPERTIES)}))


def upgrade_table_properties(spark: SparkSession, lake: str) -> list[str]:
    """Give each table the :data:`UPGRADABLE_PROPERTIES` its DDL sets and it lacks or holds
    at a :data:`SUPERSEDED_PROPERTY_VALUES` value, once per lake (a note in the lake says
    so); the tables changed.

    A lake created before such a property was added to, or changed in, the DDL would
    otherwise keep Delta's default (a log checkpoint every 10 commits, statistics of every
    column) or the older value until someone ran the ``ALTER TABLE`` by hand. Any other
    value already set, by an operator say, is kept. A table whose log is damaged is left to
    ``sessionlake doctor`` and checked again at the next run. Called by a run, which holds
    the lake's lock: the change is a commit of each table, and no stream may write beside
    it.
    """
    note = f"{lake.rstrip('/')}/{PROPERTIES_NOTE}"
    text = storage.read_text(spark, note)
    if text and json.loads(text).get("revision", 1) >= PROPERTIES_REVISION:
        return []
    changed, damaged = [], False
    for table in ALL_TABLES:
        wanted = {k: v for k, v in ddl_properties(table).items() if k in UPGRADABLE_PROPERTIES}
        if not wanted or not table_exists(spark, lake, table):
            continue
        table_log = read_log(spark, table_path(lake, table))
        if table_log.log_damaged_from is not None:
            damaged = True
            continue
        held = table_log.configuration
        missing = {k: v for k, v in wanted.items()
                   if k not in held or held[k] in SUPERSEDED_PROPERTY_VALUES.get((table, k), ())}
        if missing:
            settings = ", ".join(f"'{k}' = '{v}'" for k, v in missing.items())
            spark.sql(f"ALTER TABLE {path_identifier(table_path(lake, table))} "
                      f"SET TBLPROPERTIES ({settings})")
            log.info("table %s given %s, which tables created since have", table, settings)
            changed.append(table)
    if not damaged:
        _note_properties(spark, lake)
    return changed


def configured_user_buckets(spark: SparkSession, lake: str) -> int | None:
    """The bucket count fixed in ``open_sessions``' properties at its creation, if any.

    Read from the table's log by hand (:func:`sessionlake.deltalog.read_log`): Delta's
    ``DESCRIBE DETAIL`` runs Spark jobs, and in a fresh process that was most of the
    start-up of a run on an existing lake. A damaged log is left to Delta, whose error
    then says what is wrong.
    """
    path = table_path(lake, OPEN_SESSIONS)
    log = read_log(spark, path)
    if log.log_damaged_from is None:
        configured = log.configuration.get(BUCKETS_PROPERTY)
    else:
        properties = DeltaTable.forPath(spark, path).detail().head()
        configured = (properties["properties"] or {}).get(BUCKETS_PROPERTY) \
            if properties else None
    return int(configured) if configured else None


def read_table(
    spark: SparkSession, lake: str, table: str, version: int | None = None
) -> DataFrame:
    """A table of the lake, optionally as it was at ``version`` (time travel)."""
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(table_path(lake, table))


def resolve_snapshot(spark: SparkSession, lake: str, table: str, version: int) -> None:
    """Have Delta resolve ``table``'s snapshot at ``version`` now, for a read of it later.

    Before a query reads a version of a table, Delta resolves that version's snapshot:
    Spark jobs replay the table's log and list its files, planned and waited for by the
    driver, before the query's own jobs start. Delta keeps the newest resolved snapshot of
    each table for the whole process, so a later read of the same version, from any
    session, starts at once. A version older than the table's newest is resolved anew at
    each read: resolving it ahead is then wasted, never wrong.
    """
    read_table(spark, lake, table, version).inputFiles()


def literal_row(spark: SparkSession, row: Mapping[str, Any], schema: StructType) -> DataFrame:
    """``row`` as a one-row DataFrame of ``schema``'s columns (missing values are null).

    Made of literals, it is computed in the JVM. ``createDataFrame`` of local rows is
    computed by a Python worker on an executor, and the first one of a process starts
    Spark's Python worker daemon, only to unpickle a row. In one partition: in as many as
    the cluster has cores, each of the others wrote an empty Parquet file, which Delta does
    not list, into the table's folder until a VACUUM (one a batch in ``batch_metrics``).
    """
    return spark.range(1, numPartitions=1).select(*[
        _literal(row.get(field.name)).cast(field.dataType).alias(field.name)
        for field in schema.fields
    ])


def _literal(value: Any) -> Column:
    """``value`` as a literal column; lists become arrays and mappings maps (of literals),
    which ``F.lit`` does not make."""
    if isinstance(value, Mapping):
        return F.create_map(*[part for key, item in value.items()
                              for part in (F.lit(key), _literal(item))])
    if isinstance(value, list | tuple):
        return F.array(*[_literal(item) for item in value])
    return F.lit(value)


def table_version(spark: SparkSession | None, lake: str, table: str) -> int:
    """The latest committed version of ``table``: the newest commit file in its log.

    Listing ``_delta_log`` costs one file-system call; asking for the history would run a
    Spark job.
    """
    versions = _commit_versions(spark, lake, table)
    if not versions:
        raise FileNotFoundError(f"{table_path(lake, table)} is not a Delta table")
    return max(versions)


def stream_gap_s(spark: SparkSession, lake: str) -> int | None:
    """The gap, in seconds, of the newest sessions the lake's stream closed (a backfill's
    carry no batch id); ``None`` before the first. A query of ``sessions``: read only where
    a lake has no note of its gap (:data:`~sessionlake.checkpoint.GAP_NOTE`)."""
    if not table_exists(spark, lake, SESSIONS) or never_written(spark, lake, SESSIONS):
        return None
    row = read_table(spark, lake, SESSIONS).where(F.col("closed_batch_id") >= 0).agg(
        F.max_by("gap_s", "closed_at").alias("gap_s")).head()
    return None if row is None or row["gap_s"] is None else int(row["gap_s"])


def never_written(spark: SparkSession | None, lake: str, table: str) -> bool:
    """Whether ``table`` holds no row because nothing was ever written to it: its log
    has only its creation, which added no file.

    One listing and one small file read, where a query of the table would load its
    snapshot with Spark (about 3 s for a new lake's first batch, cold).
    """
    versions = _commit_versions(spark, lake, table)
    return versions == [0] and not any(
        "add" in action for action in table_commit_actions(spark, lake, table, 0))


def append(
    frame: DataFrame,
    lake: str,
    table: str,
    batch: BatchKey | None = None,
    options: Mapping[str, str] | None = None,
) -> None:
    """Append ``frame`` to ``table``; with ``batch``, the commit carries its tag.

    :param options: Delta writer options for this write (``optimizeWrite``, say).

    The tag is not Delta's idempotent-write key (``txnAppId``/``txnVersion``): checking that
    key makes Delta reconstruct the table's state on every write, about a quarter of a small
    micro-batch's cost, while only a replayed batch can find its write already done. The
    batch looks for its tag itself on a replay (:func:`batch_commit_metrics`).
    """
    writer = frame.write.format("delta").mode("append").options(**(options or {}))
    if batch is not None:
        writer = writer.option("userMetadata", batch_tag(batch))
    writer.save(table_path(lake, table))


#: Where Delta takes the ``userMetadata`` of commands without writer options (MERGE).
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


def isolated_session(spark: SparkSession) -> SparkSession:
    """A clone of ``spark`` whose SQL configuration is its own.

    The clone shares the SparkContext, the cached data (so a persisted DataFrame of ``spark``
    is read from memory) and starts with a copy of ``spark``'s settings; what is set on it
    afterwards is seen by nobody else.
    """
    return SparkSession(spark.sparkContext, jsparkSession=spark._jsparkSession.cloneSession())


@contextmanager
def tagged_session(spark: SparkSession, batch: BatchKey | None) -> Iterator[SparkSession]:
    """The session on which a MERGE/UPDATE/DELETE commits with ``batch``'s tag.

    Delta reads the ``userMetadata`` of these commands from SQL configuration only (they
    have no writer options). Setting it on the shared session would hand it, for as long as
    the command runs, to every other command of every thread on that session: an UPDATE,
    DELETE or option-less append of another thread (say, maintenance beside the stream)
    would commit under the stream's tag, and a replay of that batch would take the other
    command's commit for its own and skip its write, losing its rows. So the tag is set on a
    private clone (:func:`isolated_session`), and the command must be built from the yielded
    session (``DeltaTable.forPath(session, ...)``). Without ``batch`` the block gets
    ``spark`` itself.

    Example::

        with tagged_session(spark, ("app", 7)) as session:
            DeltaTable.forPath(session, path).merge(...).execute()
    """
    if batch is None:
        yield spark
        return
    yield session_tagged(spark, batch_tag(batch))


def session_tagged(spark: SparkSession, tag: str) -> SparkSession:
    """A private clone of ``spark`` (:func:`isolated_session`) whose MERGE, UPDATE and
    DELETE commits carry ``tag`` as their ``userMetadata``, and no other thread's."""
    session = isolated_session(spark)
    session.conf.set(USER_METADATA_CONF, tag)
    return session


def last_operation_metrics(
    spark: SparkSession, lake: str, table: str, operation: str | None = None
) -> dict[str, int]:
    """The operation metrics of the newest commit of ``table`` (rows and files touched).

    :param operation: the newest commit of this operation (``"MERGE"``) instead: another
        writer (an OPTIMIZE beside the stream) may have committed after it. Only the last
        20 commits are looked at.
    """
    history = DeltaTable.forPath(spark, table_path(lake, table)).history(
        1 if operation is None else 20
    )
    if operation is not None:
        history = history.where(history["operation"] == operation)
    row = history.orderBy(history["version"].desc()).head()
    return _counts((row["operationMetrics"] if row is not None else None) or {})


def committed_by(
    spark: SparkSession | None, lake: str, table: str, version: int, batch: BatchKey
) -> bool:
    """Whether ``table``'s commit ``version`` is ``batch``'s (read from the commit file)."""
    return batch in batch_keys(table_commit_actions(spark, lake, table, version))


def table_commit_actions(spark: SparkSession | None, lake: str, table: str, version: int
                         ) -> list[dict[str, Any]]:
    """The actions of ``table``'s commit ``version``, from its commit file (none when the
    file is missing)."""
    text = storage.read_text(spark, f"{table_path(lake, table)}/{commit_file(version)}")
    return commit_actions(text or "")


def _counts(metrics: dict[str, Any]) -> dict[str, int]:
    """The numeric operation metrics (Delta records them as strings)."""
    return {key: int(value) for key, value in metrics.items() if str(value).isdigit()}


def _int_metrics(actions: list[dict[str, Any]]) -> dict[str, int]:
    info: dict[str, Any] = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    return _counts(info.get("operationMetrics") or {})


def commit_metrics_since(
    spark: SparkSession, lake: str, table: str, after: int, operation: str,
    user_metadata: str | None = None,
) -> list[dict[str, int]]:
    """The operation metrics of every ``operation`` commit of ``table`` after version
    ``after``; with ``user_metadata``, of those tagged with it only (one writer's own
    commits, not another's of the same operation beside it).

    Read from the commit files (a few small JSON files), not with ``DESCRIBE HISTORY``,
    which runs Spark jobs over the whole log: maintenance asks this once per table.
    """
    return [_int_metrics(actions) for actions, info in _commits_since(spark, lake, table, after)
            if info.get("operation") == operation
            and (user_metadata is None or info.get("userMetadata") == user_metadata)]


def written_by_others_since(
    spark: SparkSession, lake: str, table: str, after: int, user_metadata: str
) -> bool:
    """Whether a commit of ``table`` after version ``after`` is not tagged
    ``user_metadata``: another writer's (or one whose commit file is gone, unknown)."""
    return any(info.get("userMetadata") != user_metadata
               for _, info in _commits_since(spark, lake, table, after))


def _commits_since(spark: SparkSession, lake: str, table: str, after: int
                   ) -> Iterator[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """Each commit of ``table`` after version ``after``, oldest first: its actions and its
    ``commitInfo`` (empty when the commit file is gone)."""
    for version in range(after + 1, table_version(spark, lake, table) + 1):
        actions = table_commit_actions(spark, lake, table, version)
        yield actions, next((a["commitInfo"] for a in actions if "commitInfo" in a), {})


def batch_commit_metrics(
    spark: SparkSession, lake: str, table: str, batch: BatchKey, after: int | None = None,
    newest: int = 50,
) -> dict[str, int] | None:
    """The operation metrics of the commit of ``table`` made by ``batch``, if there is one.

    Read from the commit files themselves (no Spark job, no history query): the commit
    tagged with the batch is the batch's very write, whatever other writers (an OPTIMIZE
    beside the stream) committed around it.

    :param after: look only at commits after this version (the table's version before the
        batch, from its ledger entry); when unknown, at the ``newest`` commits.
    :return: the metrics, or ``None`` when no commit of the batch is there.
    """
    found = batch_commit(spark, lake, table, batch, after, newest)
    return None if found is None else found[1]


def batch_commit(
    spark: SparkSession, lake: str, table: str, batch: BatchKey, after: int | None = None,
    newest: int = 50,
) -> tuple[int, dict[str, int]] | None:
    """The version and operation metrics of ``batch``'s commit of ``table``, if there is
    one (see :func:`batch_commit_metrics`)."""
    latest = table_version(spark, lake, table)
    oldest = max(-1, latest - newest) if after is None else after
    for version in range(latest, oldest, -1):
        actions = table_commit_actions(spark, lake, table, version)
        if batch in batch_keys(actions):
            return version, _int_metrics(actions)
    return None

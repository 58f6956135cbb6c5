"""The lake's tables: creation, including after a process was killed while creating them."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import StructType
from pyspark.testing import assertDataFrameEqual

from sessionlake.compaction import CLUSTER_COLUMN
from sessionlake.config import settings_from
from sessionlake.deltalog import commit_actions, commit_file, read_log
from sessionlake.tables import (
    ALL_TABLES,
    BATCH_METRICS,
    EVENTS,
    LATE_EVENTS,
    OPEN_SESSIONS,
    PROPERTIES_NOTE,
    QUARANTINE,
    RETENTION_AUDIT,
    SESSION_CHANGELOG,
    SESSIONS,
    SUPERSEDED_PROPERTY_VALUES,
    UPGRADABLE_PROPERTIES,
    append,
    ddl_properties,
    ensure_tables,
    literal_row,
    never_written,
    path_identifier,
    read_table,
    resolve_snapshot,
    table_exists,
    table_path,
    table_version,
    upgrade_table_properties,
)
from tests.helpers import event, first, run_batches


def test_a_lake_made_before_a_property_was_added_gets_it_once_at_its_next_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Tables created before the DDL set a property get it, once; an operator's own value
    stays."""
    lake = str(tmp_path / "lake")
    ensure_tables(spark, lake)
    assert upgrade_table_properties(spark, lake) == []  # a new lake has them, and notes it
    given = {t: {k: v for k, v in ddl_properties(t).items() if k in UPGRADABLE_PROPERTIES}
             for t in ALL_TABLES}
    assert given[EVENTS]["delta.checkpointInterval"] == "100"
    # The lake as an older version left it: neither property, no note.
    for table in (t for t in ALL_TABLES if given[t]):
        spark.sql(f"ALTER TABLE {path_identifier(table_path(lake, table))} UNSET "
                  f"TBLPROPERTIES ({', '.join(repr(k) for k in given[table])})")
    spark.sql(f"ALTER TABLE {path_identifier(table_path(lake, EVENTS))} "
              "SET TBLPROPERTIES ('delta.checkpointInterval' = '50')")
    (tmp_path / "lake" / PROPERTIES_NOTE).unlink()

    assert sorted(upgrade_table_properties(spark, lake)) == sorted(t for t in given if given[t])
    for table, wanted in given.items():
        configuration = read_log(None, table_path(lake, table)).configuration
        assert {k: configuration.get(k) for k in wanted} == (
            {**wanted, "delta.checkpointInterval": "50"} if table == EVENTS else wanted)
    versions = {t: table_version(spark, lake, t) for t in ALL_TABLES}
    assert upgrade_table_properties(spark, lake) == []
    assert {t: table_version(spark, lake, t) for t in ALL_TABLES} == versions


def test_a_value_an_earlier_ddl_set_is_replaced_at_the_next_run_and_an_operators_kept(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A lake upgraded by the release before the DDL changed a value gets the new one."""
    lake = str(tmp_path / "lake")
    ensure_tables(spark, lake)
    stats = "delta.dataSkippingStatsColumns"
    ((table, key), (older, *_)), = SUPERSEDED_PROPERTY_VALUES.items()
    assert (table, key) == (EVENTS, stats) and "event_id" not in older.split(",")
    # events as created between 16c45a0 and 1ce5698, an operator's own list on sessions,
    # and the note that the release before the revision wrote.
    for name, value in ((EVENTS, older), (SESSIONS, "user_id")):
        spark.sql(f"ALTER TABLE {path_identifier(table_path(lake, name))} "
                  f"SET TBLPROPERTIES ('{stats}' = '{value}')")
    (tmp_path / "lake" / PROPERTIES_NOTE).write_text(
        json.dumps({"properties": sorted(UPGRADABLE_PROPERTIES)}))

    assert upgrade_table_properties(spark, lake) == [EVENTS]
    held = {t: read_log(None, table_path(lake, t)).configuration[stats] for t in (EVENTS, SESSIONS)}
    assert held == {EVENTS: ddl_properties(EVENTS)[stats], SESSIONS: "user_id"}
    assert "event_id" in held[EVENTS].split(",")
    versions = {t: table_version(spark, lake, t) for t in ALL_TABLES}
    assert upgrade_table_properties(spark, lake) == []
    assert {t: table_version(spark, lake, t) for t in ALL_TABLES} == versions


@pytest.mark.parametrize("half_created", [(OPEN_SESSIONS,), (EVENTS, OPEN_SESSIONS), ALL_TABLES])
def test_tables_a_kill_left_half_created_are_created_on_the_next_run(
    spark: SparkSession, lake: str, half_created: tuple[str, ...]
) -> None:
    # A SIGKILL during CREATE TABLE can leave a _delta_log folder without a commit (as a
    # random kill in tests/reliability did): CREATE TABLE IF NOT EXISTS then does nothing.
    for table in half_created:
        log = Path(table_path(lake, table)) / "_delta_log"
        (log / "_staged_commits").mkdir(parents=True)
        (log / ".00000000000000000000.json.0b1c.tmp").write_text("{")
    assert not table_exists(spark, lake, OPEN_SESSIONS)

    assert ensure_tables(spark, lake, user_buckets=4) == 4

    assert all(table_exists(spark, lake, table) for table in ALL_TABLES)
    assert read_table(spark, lake, OPEN_SESSIONS).count() == 0


@pytest.mark.parametrize("name", ["odd `lake`", "``", "lake `; DROP TABLE x; --"])
def test_a_lake_whose_path_holds_backticks_is_created_and_written(
    spark: SparkSession, tmp_path: Path, name: str
) -> None:
    # Every statement names a table by its path in backticks: one in the path is escaped
    # there, as in every other statement, so it names that path and nothing else.
    settings = settings_from({"lake": str(tmp_path / name)}, env={})
    ensure_tables(spark, settings.lake, settings.user_buckets)  # not run_batches' copy
    assert all((tmp_path / name / table / "_delta_log").is_dir() for table in ALL_TABLES)
    run_batches(spark, settings, [[event("u1", "10:00"), event("u1", "10:05")]])
    assert first(read_table(spark, settings.lake, OPEN_SESSIONS)).event_count == 2


def test_creating_tables_keeps_the_bucket_count_of_an_existing_lake(
    spark: SparkSession, lake: str
) -> None:
    assert ensure_tables(spark, lake, user_buckets=4) == 4
    assert ensure_tables(spark, lake, user_buckets=16) == 4


def test_a_table_is_never_written_until_a_commit_follows_its_creation(
    spark: SparkSession, lake: str
) -> None:
    ensure_tables(spark, lake, user_buckets=4)
    assert never_written(spark, lake, BATCH_METRICS)
    spark.sql(f"ALTER TABLE delta.`{table_path(lake, BATCH_METRICS)}` "
              "SET TBLPROPERTIES ('comment' = 'no rows yet')")
    # Any later commit counts as written: the check never reads more than the creation.
    assert not never_written(spark, lake, BATCH_METRICS)
    assert never_written(spark, lake, SESSIONS)


def test_a_literal_row_is_the_row_created_from_python(spark: SparkSession, lake: str) -> None:
    ensure_tables(spark, lake)
    schema = read_table(spark, lake, BATCH_METRICS).schema
    at = datetime(2026, 1, 5, 10, 30, 1, 250_000, tzinfo=UTC)
    row: dict[str, Any] = {
        field.name: 7 for field in schema.fields if field.dataType.typeName() == "long"
    }
    row.update(stream_id="s-1", started_at=at, finished_at=at, max_event_time=None,
               watermark_before=at, watermark_after=None)
    frame = literal_row(spark, row, schema)
    assert frame.schema.names == schema.names
    assert "Range" in frame._jdf.queryExecution().optimizedPlan().toString()  # no Python rows
    assertDataFrameEqual(frame, spark.createDataFrame([row], schema))
    del row["merge_duration_ms"]
    assert first(literal_row(spark, row, schema))["merge_duration_ms"] is None


@pytest.mark.parametrize(("hashes", "rows_deleted"), [
    (["a1", "b2"], {"events": 3, "sessions": 0}),
    ([], {}),
    (None, None),
])
def test_a_literal_row_holds_arrays_and_maps(
    spark: SparkSession, lake: str, hashes: list[str] | None, rows_deleted: dict[str, int] | None
) -> None:
    ensure_tables(spark, lake)
    schema = read_table(spark, lake, RETENTION_AUDIT).schema
    at = datetime(2026, 1, 5, 10, 30, tzinfo=UTC)
    row = {"run_id": "r-1", "started_at": at, "finished_at": at, "erased_users": 2,
           "erased_user_sha256": hashes, "sessions_cutoff": date(2025, 1, 5),
           "rows_deleted": rows_deleted, "versions_before": {"events": 4},
           "vacuum_retain_hours": 168.0, "files_vacuumed": 0, "time_travel_purged": False}
    frame = literal_row(spark, row, schema)
    assert "Range" in frame._jdf.queryExecution().optimizedPlan().toString()
    assertDataFrameEqual(frame, spark.createDataFrame([row], schema))


def _filled_row(schema: StructType) -> dict[str, Any]:
    """A row with a value in every column of ``schema`` (its NOT NULL columns included)."""
    at = datetime(2026, 1, 5, 10, 30, tzinfo=UTC)
    values: dict[str, Any] = {"string": "x", "long": 1, "integer": 1, "double": 1.0,
                              "boolean": True, "timestamp": at, "date": at.date(),
                              "map": {"k": "v"}, "array": ["x"]}
    return {field.name: values[field.dataType.typeName()] for field in schema.fields}


def test_a_version_resolved_ahead_is_read_without_replaying_its_log_again(
    spark: SparkSession, lake: str
) -> None:
    ensure_tables(spark, lake)
    schema = read_table(spark, lake, EVENTS).schema
    for _ in range(2):
        append(literal_row(spark, _filled_row(schema), schema), lake, EVENTS)

    def jobs_of_a_read(group: str, resolved_ahead: bool) -> list[int]:
        """Spark jobs a read of version 2 runs in a process that has not read the table."""
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()
        if resolved_ahead:
            resolve_snapshot(spark, lake, EVENTS, 2)
        spark.sparkContext.setJobGroup(group, "the batch's read of the version")
        try:
            assert len(read_table(spark, lake, EVENTS, 2).inputFiles()) == 2
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        return spark.sparkContext.statusTracker().getJobIdsForGroup(group)

    cold = jobs_of_a_read("cold", resolved_ahead=False)
    ahead = jobs_of_a_read("ahead", resolved_ahead=True)
    assert len(ahead) < len(cold), (ahead, cold)


@pytest.mark.parametrize(("table", "columns"), [
    (EVENTS, {"event_time", "user_id", "batch_id", "ingested_at", "event_id"}),
    (OPEN_SESSIONS, {"session_id", "user_id", "session_start", "session_end",
                     "updated_batch_id", "updated_at"}),
    (SESSIONS, {"user_id", "session_start", "session_end", "closed_batch_id", "closed_at"}),
    (SESSION_CHANGELOG, {"batch_id", "user_id", "session_start", "session_end", "changed_at"}),
    # No user, no text: the log keeps each file's min and max, where no erasure reaches
    # (an erased user's quarantined line stayed readable there; the README review).
    (QUARANTINE, {"batch_id", "quarantined_at", "source_line"}),
    (LATE_EVENTS, {"event_time", "batch_id", "recorded_at", "event_id"}),
])
def test_a_write_collects_statistics_only_where_they_can_skip_files(
    spark: SparkSession, lake: str, table: str, columns: set[str]
) -> None:
    ensure_tables(spark, lake)
    schema = read_table(spark, lake, table).schema
    append(literal_row(spark, _filled_row(schema), schema), lake, table)

    log = Path(table_path(lake, table)) / commit_file(1)
    [added] = [action["add"] for action in commit_actions(log.read_text()) if "add" in action]
    stats = json.loads(added["stats"])
    assert stats["numRecords"] == 1  # what the lake's reports count rows by
    assert set(stats["minValues"]) == set(stats["maxValues"]) == columns
    # OPTIMIZE ZORDER BY needs its statistics: compaction clusters only where they are.
    assert (CLUSTER_COLUMN in columns) is (table not in (QUARANTINE, LATE_EVENTS))


@pytest.mark.parametrize("table", ALL_TABLES)
def test_the_tables_a_stream_writes_every_batch_checkpoint_their_log_every_100_commits(
    spark: SparkSession, lake: str, table: str
) -> None:
    ensure_tables(spark, lake)
    properties = {row["key"]: row["value"] for row in spark.sql(
        f"SHOW TBLPROPERTIES {path_identifier(table_path(lake, table))}").collect()}

    expected = None if table == RETENTION_AUDIT else "100"
    assert properties.get("delta.checkpointInterval") == expected

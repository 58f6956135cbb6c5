"""Compaction: which tables it rewrites, that it changes no row, and that it (with retention)
can run while micro-batches commit without failing them or losing anything."""

from __future__ import annotations

import logging
import re
import shutil
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DateType, IntegerType, StringType, StructField, StructType
from pyspark.testing import assertDataFrameEqual

from sessionlake import compaction, retention
from sessionlake.cli import main
from sessionlake.compaction import (
    CompactionError,
    CompactionReport,
    compact_lake,
    compact_table,
    partition_predicate,
)
from sessionlake.deltalog import batch_tag
from sessionlake.health_page import fmt_bytes
from sessionlake.retention import RetentionReport, RetentionRequest, enforce_retention
from sessionlake.tables import (
    PUBLIC_TABLES,
    USER_METADATA_CONF,
    append,
    batch_commit_metrics,
    ensure_tables,
    read_table,
    table_path,
    table_version,
    tagged_session,
)
from tests.helpers import all_sessions, event, lake_settings, run_batches

#: batch_metrics rows hold timings and MERGE file counts, which a compaction may change.
METRICS_KEY = ("batch_id", "input_records", "accepted", "late", "quarantined", "duplicates",
               "sessions_opened", "closed_sessions", "open_sessions")


def at(batch: int, minutes: int = 0) -> str:
    """Batch ``batch``'s clock on 2026-01-05: 08:00 plus 25 minutes a batch."""
    moment = datetime(2026, 1, 5, 8) + timedelta(minutes=25 * batch + minutes)
    return moment.strftime("%H:%M")


def small_batches(count: int = 4) -> list[list[str]]:
    """Batches that leave small files in every table.

    Eight users stay active (every batch extends their sessions: MERGE updates of
    ``open_sessions``); six new users a batch leave after one event (their sessions close
    two batches later: appends to ``sessions``), and while they idle their rows keep the
    older files of their buckets alive beside the stay users' newer ones (``stay5`` and
    ``once2_1`` share bucket 0, for one); every batch has a malformed line; batch 3 brings
    an event next to a closed session (``late_events``).
    """
    batches = []
    for k in range(count):
        lines = [event(f"stay{i}", at(k, i % 3), f"/s{k}") for i in range(8)]
        lines += [event(f"once{k}_{i}", at(k), "/x") for i in range(6)]
        lines.append("not json")
        if k == 3:
            lines.append(event("once0_0", "08:10", "/late"))
        batches.append(lines)
    return batches


@pytest.fixture(scope="module")
def batched_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A lake after :func:`small_batches`, built once; tests work on copies of it."""
    lake = str(tmp_path_factory.mktemp("batched") / "lake")
    run_batches(spark, lake_settings(lake), small_batches())
    return lake


@pytest.fixture
def copied_lake(batched_lake: str, tmp_path: Path) -> str:
    """A private copy of the batched lake (Delta logs name their files relatively)."""
    lake = str(tmp_path / "lake")
    shutil.copytree(batched_lake, lake)
    return lake


def versions(spark: SparkSession, lake: str) -> dict[str, int]:
    return {table: table_version(spark, lake, table) for table in PUBLIC_TABLES}


def test_compaction_rewrites_small_files_and_changes_no_row(
    spark: SparkSession, copied_lake: str
) -> None:
    before = versions(spark, copied_lake)

    reports = {r.table: r for r in compact_lake(spark, copied_lake, min_files=2)}

    assert list(reports) == list(PUBLIC_TABLES)
    for table in ("events", "sessions", "open_sessions"):
        report = reports[table]
        assert report.compacted, report.summary()
        assert report.files_after < report.files_before, report.summary()
        assert report.zorder_by == "user_id"
        assert report.summary().startswith(
            f"{table}: {report.files_before} files, {fmt_bytes(report.bytes_before)} -> "
            f"{report.files_after}, {fmt_bytes(report.bytes_after)} (OPTIMIZE ZORDER BY user_id")
        assert report.bytes_after > 0
    assert reports["batch_metrics"].zorder_by is None  # no user: plain bin-packing
    # No statistics of their users (kept out of the log), so none to cluster by.
    assert reports["quarantine"].zorder_by is reports["late_events"].zorder_by is None
    assert reports["batch_metrics"].summary().endswith("(OPTIMIZE)")
    history = DeltaTable.forPath(spark, table_path(copied_lake, "events")).history(1).head()
    assert history is not None and history["operation"] == "OPTIMIZE"
    # Every row of every table is still there, unchanged, and nothing was added.
    for table in PUBLIC_TABLES:
        assertDataFrameEqual(read_table(spark, copied_lake, table),
                             read_table(spark, copied_lake, table, before[table]))


def test_the_survey_counts_one_version_of_a_table_another_writer_commits_to(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The concurrency review: beside a running stream, `compact` printed "events: 0 files,
    0 B -> 1" for a table with one small file: its counts and its small files were read
    at two versions."""
    path = str(tmp_path / "table")
    spark.range(3).write.format("delta").save(path)
    real = compaction._detail

    def then_a_commit(session: SparkSession, table: str) -> object:
        detail = real(session, table)
        spark.range(1).write.format("delta").mode("append").save(path)
        return detail

    monkeypatch.setattr(compaction, "_detail", then_a_commit)
    survey = compaction.survey_table(spark, path)
    live = spark.read.format("delta").load(path).inputFiles()
    assert (survey.files, survey.small_files) == (len(live), len(live))
    assert survey.bytes == sum(Path(name.removeprefix("file:")).stat().st_size for name in live)


def test_tables_below_min_files_are_skipped_and_untouched(
    spark: SparkSession, copied_lake: str
) -> None:
    before = versions(spark, copied_lake)

    reports = compact_lake(spark, copied_lake, min_files=1000)

    assert [r.compacted for r in reports] == [False] * len(PUBLIC_TABLES)
    assert all(r.files_after == r.files_before for r in reports)
    events = next(r for r in reports if r.table == "events")
    assert events.summary() == (
        f"events: {events.files_before} files, {fmt_bytes(events.bytes_before)}, "
        "below --min-files 1000: skipped")
    assert versions(spark, copied_lake) == before


def test_only_the_named_tables_are_compacted(spark: SparkSession, copied_lake: str) -> None:
    before = versions(spark, copied_lake)

    reports = compact_lake(spark, copied_lake, min_files=2,
                           tables=["batch_metrics", "events", "batch_metrics"])

    assert [(r.table, r.compacted) for r in reports] == [
        ("batch_metrics", True), ("events", True)]
    after = versions(spark, copied_lake)
    assert {t for t in PUBLIC_TABLES if after[t] != before[t]} == {"batch_metrics", "events"}


@pytest.mark.parametrize(
    ("tables", "named"),
    [
        (["events", "clicks"], "'clicks'"),
        (["Sessions"], "'Sessions'"),      # names are exact
        (["batch_ledger"], "'batch_ledger'"),
    ],
)
def test_an_unknown_table_fails_before_anything_is_touched(
    spark: SparkSession, copied_lake: str, tables: list[str], named: str
) -> None:
    before = versions(spark, copied_lake)
    with pytest.raises(CompactionError) as caught:
        compact_lake(spark, copied_lake, min_files=1, tables=tables)
    message = str(caught.value)
    assert named in message
    assert ", ".join(PUBLIC_TABLES) in message  # what the valid names are
    assert versions(spark, copied_lake) == before


@pytest.mark.parametrize("min_files", [0, -3])
def test_min_files_below_one_is_refused(
    spark: SparkSession, tmp_path: Path, min_files: int
) -> None:
    with pytest.raises(CompactionError, match=f"min_files must be at least 1, got {min_files}"):
        compact_lake(spark, str(tmp_path), min_files=min_files)


def test_a_missing_lake_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    nowhere = str(tmp_path / "nowhere")
    with pytest.raises(CompactionError, match=r"no lake at .*nowhere: `sessionlake run` creates"):
        compact_lake(spark, nowhere, min_files=1)
    assert not Path(nowhere).exists()


def test_a_folder_without_the_tables_is_no_lake(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "events").mkdir()  # a folder by a table's name, no Delta table in it
    with pytest.raises(CompactionError, match=r"no lake at .*: `sessionlake run` creates"):
        compact_lake(spark, str(tmp_path), min_files=1, tables=["events"])


def test_a_lake_without_the_table_asked_for_is_refused_naming_it(
    spark: SparkSession, copied_lake: str
) -> None:
    shutil.rmtree(Path(copied_lake) / "late_events")
    before = table_version(spark, copied_lake, "events")
    with pytest.raises(CompactionError,
                       match="not a sessionlake lake: no Delta table late_events in it"):
        compact_lake(spark, copied_lake, min_files=1, tables=["events", "late_events"])
    assert table_version(spark, copied_lake, "events") == before  # refused before any OPTIMIZE


def test_the_command_line_prints_a_line_per_table(
    spark: SparkSession, copied_lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["compact", "--lake", copied_lake, "--min-files", "1000",
            "--table", "quarantine", "--table", "late_events"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert re.fullmatch(r"quarantine: 4 files, [\d.]+ KiB, below --min-files 1000: skipped",
                        lines[0]), lines
    assert re.fullmatch(r"late_events: 1 file, [\d.]+ KiB, below --min-files 1000: skipped",
                        lines[1]), lines


@pytest.mark.parametrize(("table", "said"), [
    ("clicks", "unknown table 'clicks': the lake's tables are events, "),
    ("sesions", "unknown table 'sesions': did you mean sessions? the lake's tables are events, "),
    ("Open_Sessions", "unknown table 'Open_Sessions': did you mean open_sessions? the lake's "),
])
def test_the_command_line_refuses_an_unknown_table_in_one_line_before_spark_starts(
    copied_lake: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    table: str, said: str,
) -> None:
    def no_spark(*_: object, **__: object) -> None:
        raise AssertionError("Spark was started for a table the lake does not have")

    monkeypatch.setattr("sessionlake.cli._spark", no_spark)
    assert main(["compact", "--lake", copied_lake, "--table", "sessions", "--table", table]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"sessionlake: error: {said}"), err
    assert len(err.splitlines()) == 1


SCHEMA = StructType([
    StructField("user_id", StringType()),
    StructField("event_date", DateType()),
    StructField("user_bucket", IntegerType()),
    StructField("source", StringType()),
])


@pytest.mark.parametrize(
    ("columns", "partitions", "predicate"),
    [
        (["user_bucket"], [("3",), ("12",)],
         "`user_bucket` IN (CAST('3' AS int), CAST('12' AS int))"),
        (["event_date"], [("2026-01-05",)], "`event_date` IN (CAST('2026-01-05' AS date))"),
        (["source"], [("it's",), (None,)],      # quotes escaped; null as IS NULL
         "(`source` = CAST('it\\'s' AS string)) OR (`source` IS NULL)"),
        (["event_date", "user_bucket"], [("2026-01-05", "1"), ("2026-01-06", "2")],
         "(`event_date` = CAST('2026-01-05' AS date) AND `user_bucket` = CAST('1' AS int)) OR "
         "(`event_date` = CAST('2026-01-06' AS date) AND `user_bucket` = CAST('2' AS int))"),
    ],
)
def test_partition_predicate_selects_exactly_the_partitions(
    columns: list[str], partitions: list[tuple[str | None, ...]], predicate: str
) -> None:
    assert partition_predicate(columns, partitions, SCHEMA) == predicate


@pytest.mark.parametrize(
    ("report", "line"),
    [
        (CompactionReport("sessions", 37, 4, 37, 9000, 8000, True, "37 small files",
                          zorder_by="user_id"),
         "sessions: 37 files, 8.8 KiB -> 4, 7.8 KiB (OPTIMIZE ZORDER BY user_id)"),
        (CompactionReport("open_sessions", 20, 9, 18, 9000, 8000, True, "", "user_id",
                          partitions=3, attempts=2),
         "open_sessions: 20 files, 8.8 KiB -> 9, 7.8 KiB "
         "(OPTIMIZE ZORDER BY user_id, 3 partitions, 2 attempts)"),
        (CompactionReport("quarantine", 2, 2, 2, 10, 10, False, "below --min-files 16"),
         "quarantine: 2 files, 10 B, below --min-files 16: skipped"),
        (CompactionReport("events", 3, 3, 1, 10, 10, False, "below --min-files 2"),
         "events: 3 files, 10 B (1 small), below --min-files 2: skipped"),
    ],
)
def test_summary_lines(report: CompactionReport, line: str) -> None:
    assert report.summary() == line


def test_the_batch_tag_of_a_merge_is_not_seen_by_other_writers(
    spark: SparkSession, lake: str
) -> None:
    """Delta reads a MERGE's ``userMetadata`` from SQL configuration. Were the batch's tag
    set on the shared session, a write of another thread (here: an untagged append) would
    commit under it, and a replay of the batch would take that commit for its own write."""
    ensure_tables(spark, lake)
    row = spark.createDataFrame([("x", "bad", 1)], "raw string, reason string, n int").select(
        "raw", F.lit(False).alias("raw_truncated"), F.lit("f").alias("source_file"),
        F.lit(1).cast("long").alias("source_line"), F.lit(None).cast("string").alias("user_id"),
        "reason", F.lit(5).cast("long").alias("batch_id"),
        F.current_timestamp().alias("quarantined_at"))
    batch = ("stream-app", 5)

    with tagged_session(spark, batch) as session:
        assert session.conf.get(USER_METADATA_CONF) == batch_tag(batch)
        assert spark.conf.get(USER_METADATA_CONF, None) is None
        append(row, lake, "quarantine")  # another writer on the shared session, meanwhile
    assert batch_commit_metrics(spark, lake, "quarantine", batch) is None
    append(row, lake, "quarantine", batch)  # the stream's own write
    found = batch_commit_metrics(spark, lake, "quarantine", batch)
    assert found is not None and found["numOutputRows"] == 1


def test_writes_that_lose_a_race_to_an_optimize_are_redone_once(
    spark: SparkSession, batched_lake: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """A deterministic race: the first attempt of every write of a batch finds that an
    OPTIMIZE of its table has just committed, and fails as Delta would fail it. Each write
    is redone against the compacted version, once, and the batch ends as without races."""
    reference, raced = str(tmp_path / "reference"), str(tmp_path / "raced")
    shutil.copytree(batched_lake, reference)
    shutil.copytree(batched_lake, raced)
    next_batch = small_batches(5)[4]
    run_batches(spark, lake_settings(reference), [next_batch], first_batch_id=4)

    lost: set[str] = set()
    guard = threading.Lock()

    def lose_the_first_race(table: str) -> None:
        with guard:
            first = table not in lost
            lost.add(table)
        if first:
            compact_table(spark, raced, table, min_files=1)
            raise RuntimeError("io.delta.exceptions.ConcurrentDeleteReadException: "
                               f"[DELTA_CONCURRENT_DELETE_READ] an OPTIMIZE of {table} won")

    def racing_append(frame: DataFrame, lake: str, table: str,
                      batch: tuple[str, int] | None = None,
                      options: Mapping[str, str] | None = None) -> None:
        lose_the_first_race(table)
        append(frame, lake, table, batch, options)

    @contextmanager
    def racing_session(session: SparkSession, batch: tuple[str, int] | None
                       ) -> Iterator[SparkSession]:
        lose_the_first_race("open_sessions")
        with tagged_session(session, batch) as tagged:
            yield tagged

    monkeypatch.setattr("sessionlake.batch.append", racing_append)
    monkeypatch.setattr("sessionlake.state.tagged_session", racing_session)
    caplog.set_level(logging.WARNING, logger="sessionlake.conflicts")
    run_batches(spark, lake_settings(raced), [next_batch], first_batch_id=4)

    races = {r.getMessage().split(" lost")[0] for r in caplog.records
             if "lost a commit race" in r.getMessage()}
    assert "MERGE into open_sessions" in races
    assert {"append to events", "append to sessions", "append to batch_metrics"} <= races
    for table in PUBLIC_TABLES:
        operations = [r["operation"] for r in DeltaTable.forPath(
            spark, table_path(raced, table)).history().collect()]
        # Each batch writes each table once: appends, the state's MERGE (an append into
        # the empty table, for the first batch).
        assert sum(op in ("MERGE", "WRITE") for op in operations) == (
            DeltaTable.forPath(spark, table_path(reference, table)).history()
            .where(F.col("operation").isin("MERGE", "WRITE")).count()), table
    for table in [t for t in PUBLIC_TABLES if t != "batch_metrics"]:
        assertDataFrameEqual(read_table(spark, raced, table), read_table(spark, reference, table))
    assertDataFrameEqual(read_table(spark, raced, "batch_metrics").select(*METRICS_KEY),
                         read_table(spark, reference, "batch_metrics").select(*METRICS_KEY))


def stream_commits_around(spark: SparkSession, lake: str, operation: str) -> list[str]:
    """Tables whose history has ``operation`` between two commits of the stream."""
    found = []
    for table in PUBLIC_TABLES:
        history = DeltaTable.forPath(spark, table_path(lake, table)).history().collect()
        stream = [r["version"] for r in history if r["operation"] in ("WRITE", "MERGE")]
        others = [r["version"] for r in history if r["operation"] == operation]
        if stream and any(min(stream) < v < max(stream) for v in others):
            found.append(table)
    return found


#: A retention run that changes no row of the test's lake but does all its work: an
#: erasure (of nobody: it waits for the batch in flight all the same), age limits that
#: keep ten years, and a VACUUM that keeps what Delta's 7-day margin keeps.
NOTHING_TO_RETAIN = RetentionRequest(
    erase_users=("nobody",), sessions_max_age_days=3650, events_max_age_days=3650,
    vacuum_retain_hours=168,
)


def test_compaction_and_retention_beside_running_micro_batches_lose_nothing(
    spark: SparkSession, lake: str, batched_lake: str, caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same batches as ``batched_lake``, while another thread compacts over and over
    (every table with a file to merge) and runs retention: the result must be the same
    lake. (An erasure of a user the batches write is tested in test_retention.py.)"""
    # Every table VACUUMed, as on a lake of files older than the retention: the seconds-old
    # files here would let retention skip them all (retention.nothing_to_vacuum).
    monkeypatch.setattr(retention, "nothing_to_vacuum", lambda *_: False)
    batches = small_batches()
    cfg = lake_settings(lake)
    ensure_tables(spark, lake)
    caplog.set_level(logging.WARNING, logger="sessionlake.conflicts")
    done = threading.Event()
    passes = {"started": 0, "finished": 0}
    progress = threading.Condition()
    reports: list[CompactionReport] = []
    retained: list[RetentionReport] = []
    errors: list[BaseException] = []

    def compact_until_done() -> None:
        try:
            while not done.is_set():
                with progress:
                    passes["started"] += 1
                reports.extend(compact_lake(spark, lake, min_files=1))
                # Again the table the state MERGE contends for, to make races likelier.
                reports.extend(compact_lake(spark, lake, min_files=1, tables=["open_sessions"]))
                retained.append(enforce_retention(spark, cfg, NOTHING_TO_RETAIN))
                with progress:
                    passes["finished"] += 1
                    progress.notify_all()
        except BaseException as error:  # handed to the test thread
            errors.append(error)
            with progress:
                progress.notify_all()

    def wait_for_a_whole_pass() -> None:
        """Until a compaction pass that started after this moment has finished."""
        with progress:
            target = passes["started"] + 1
            progress.wait_for(lambda: passes["finished"] >= target or bool(errors),
                              timeout=600)

    compactor = threading.Thread(target=compact_until_done, name="compactor")
    compactor.start()
    try:
        for batch_id, lines in enumerate(batches):
            run_batches(spark, cfg, [lines], first_batch_id=batch_id)
            if batch_id == 1:
                # Once, for certain, an OPTIMIZE between two batches' commits; otherwise
                # the compactor races the batches freely.
                wait_for_a_whole_pass()
    finally:
        done.set()
        compactor.join()
    assert not errors, f"the compactor failed: {errors[0]}"
    races = [r.getMessage() for r in caplog.records if "lost a commit race" in r.getMessage()]
    print(f"{sum(r.compacted for r in reports)} OPTIMIZE commits, {len(retained)} retention "
          f"runs; commit races redone: {len(races)}", *races, sep="\n")

    assert any(r.compacted for r in reports)
    assert stream_commits_around(spark, lake, "OPTIMIZE") != []
    assert stream_commits_around(spark, lake, "VACUUM END") != []
    assert not any(any(r.rows_deleted.values()) for r in retained)
    # The same lake as without compaction: rows of every table but the metrics, which
    # hold timings and file counts, are compared whole.
    assertDataFrameEqual(all_sessions(spark, lake), all_sessions(spark, batched_lake))
    for table in ("events", "sessions", "open_sessions", "session_changelog", "late_events",
                  "quarantine"):
        assertDataFrameEqual(read_table(spark, lake, table),
                             read_table(spark, batched_lake, table))
    assertDataFrameEqual(read_table(spark, lake, "batch_metrics").select(*METRICS_KEY),
                         read_table(spark, batched_lake, "batch_metrics").select(*METRICS_KEY))
    assert read_table(spark, lake, "late_events").count() == 1
    assert read_table(spark, lake, "batch_metrics").count() == len(batches)

"""Health read without Spark: a missing lake, the running stream, compaction debt, the audit."""

from __future__ import annotations

import json
import os
import socket
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import Row, SparkSession

import sessionlake.checkpoint
from sessionlake.checkpoint import LAKE_HOLDER_FILE, PID_FILE, RESTORING_MARKER
from sessionlake.config import settings_from
from sessionlake.deltareader import DataFile, DeletionVector, TableState
from sessionlake.health import COMPACT_MIN_FILES, collect_health, table_health
from sessionlake.health_page import input_waiting_text, render_health_page
from sessionlake.tables import append, read_table, table_ddl, table_path
from tests.helpers import event, held_by_another_process, run_batches, write_source_log


def test_a_missing_lake_is_a_problem_not_an_error(tmp_path: Path) -> None:
    health = collect_health(settings_from({"lake": str(tmp_path / "none")}, env={}))
    data = json.loads(json.dumps(health.as_json()))
    assert data["lake_exists"] is False and data["open_sessions"] is None
    assert (data["last_batch_id"], data["watermark"], data["lag_seconds"]) == (None, None, None)
    assert data["problems"][0].startswith(f"no lake at {tmp_path / 'none'}")


def test_the_running_stream_is_found_by_its_locks_with_its_pid_and_checkpoint(
    tmp_path: Path,
) -> None:
    """The page names the stream writing the lake whatever its checkpoint, and not a dead
    run's files: a killed run leaves its holder file, and a pid may be reused."""
    lake, elsewhere = tmp_path / "lake", tmp_path / "elsewhere"
    settings = settings_from({"lake": str(lake)}, env={})
    assert collect_health(settings).stream_running is False  # no lake, no lock

    for locks, checkpoint in [("stream_locks", elsewhere), ("checkpoint_lock", None)]:
        paths = (lake, elsewhere) if checkpoint else (Path(settings.checkpoint),)
        with held_by_another_process(locks, *paths) as holder:
            health = collect_health(settings)
            assert (health.stream_running, health.stream_pid, health.stream_checkpoint) == (
                True, holder.pid, str(checkpoint or settings.checkpoint))
            assert health.as_json()["stream_pid"] == holder.pid
            # the lake's holder names its host: the page runs in another container
            assert health.stream_host == (socket.gethostname() if checkpoint else None)
        assert collect_health(settings).stream_running is False

    assert (lake / "_checkpoints" / LAKE_HOLDER_FILE).exists()  # left by the killed run
    (Path(settings.checkpoint) / PID_FILE).write_text(str(os.getpid()))  # a live pid
    assert collect_health(settings).stream_running is False


def _file(name: str, day: str, size: int, records: int, deleted: int = 0) -> DataFile:
    vector = DeletionVector("u", "x" * 20, 40, deleted, 1) if deleted else None
    return DataFile(f"day={day}/{name}", size, {"day": day}, records, 0, vector)


def test_compaction_debt_counts_small_files_sharing_a_partition() -> None:
    files = (
        *(_file(f"a{i}", "2026-01-05", 1000, 10) for i in range(COMPACT_MIN_FILES)),
        _file("b", "2026-01-06", 1000, 10, deleted=4),   # alone in its day: nothing to merge
        _file("c", "2026-01-07", 2 * 1024**3, 10),       # not small
    )
    state = TableState(Path("/nowhere"), 3, files, {"fields": []}, ("day",))
    health = table_health("events", state)
    assert (health.files, health.small_files, health.compactable_files) == (
        COMPACT_MIN_FILES + 2, COMPACT_MIN_FILES + 1, COMPACT_MIN_FILES)
    assert (health.deletion_vector_files, health.deleted_rows) == (1, 4)
    assert health.rows == 10 * (COMPACT_MIN_FILES + 2) - 4
    assert health.needs_compaction


def test_retention_runs_are_read_from_the_audit_table(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An audit row as ``sessionlake retention`` appends it (its schema, map columns)."""
    lake = str(tmp_path / "lake")
    spark.sql(table_ddl("retention_audit", table_path(lake, "retention_audit")))
    started = datetime(2026, 1, 6, 3, 0, tzinfo=UTC)
    row = Row(run_id="r1", started_at=started, finished_at=started + timedelta(seconds=30),
              erased_users=1, erased_user_sha256=["ab"], sessions_cutoff=None,
              events_cutoff=None, rows_deleted={"events": 4, "sessions": 1},
              versions_before={"events": 1}, versions_after={"events": 2},
              vacuum_retain_hours=None, vacuum_requested_hours=None, files_vacuumed=2,
              time_travel_purged=False, note="kept for a snapshot")
    schema = read_table(spark, lake, "retention_audit").schema
    append(spark.createDataFrame([row], schema), lake, "retention_audit")

    runs = collect_health(settings_from({"lake": lake}, env={})).retention
    assert [(r.run_id, r.started_at, r.rows_deleted, r.files_vacuumed, r.note)
            for r in runs] == [("r1", started, {"events": 4, "sessions": 1}, 2,
                                "kept for a snapshot")]


def test_the_input_waiting_is_what_no_committed_batch_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backlog a run would read now, and the read files a run lists again: read from
    the landing folder and the checkpoint's logs, as ``sessionlake run`` sizes them."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    (landing / "read.json").write_text("{}\n")
    (landing / "new.json").write_text('{"user_id": "u"}\n')
    (landing / "_copying.json").write_text("{}\n")  # hidden from Spark: not waiting
    write_source_log(lake / "_checkpoints" / "stream", {"0": [(str(landing / "read.json"), 0)]},
                     0)
    settings = settings_from({"lake": str(lake), "source": str(landing)}, env={})

    health = collect_health(settings)
    log = lake / "_checkpoints" / "stream" / "spark" / "sources" / "0" / "0"
    assert health.as_json()["input_waiting"] == {
        "bytes": 17, "files": 1, "read_left": 1, "log_bytes": log.stat().st_size,
        "archive_due": False}
    assert health.as_json()["source"] == str(landing)
    assert input_waiting_text(health) == "1 file, 17 B"
    page = render_health_page(health)
    assert '<p id="archive-due">1 file the stream has read is still' in page
    assert f"file source log, which every run reads back, holds {log.stat().st_size} B." in page

    monkeypatch.setattr(sessionlake.checkpoint, "ARCHIVE_HINT_FILES", 1)
    page = render_health_page(collect_health(settings))
    assert '<p class="warn" id="archive-due">' in page and "sessionlake_archive" in page


def test_a_stream_stalled_with_input_waiting_or_a_restore_cut_off_is_a_problem(
    spark: SparkSession, tmp_path: Path
) -> None:
    """What on-call must be told without reading a run's log: files wait and no batch has
    committed for longer than SESSIONLAKE_ALERT_STALLED_AFTER (a hung run, a paused DAG),
    or a restore was cut off (no run starts until it is run again)."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    settings = settings_from({"lake": str(lake), "source": str(landing),
                              "alert_stalled_after": "15m"}, env={})
    run_batches(spark, settings, [[event("u", "10:00")]])
    (landing / "waiting.jsonl").write_text(event("u", "10:05") + "\n")
    finished = collect_health(settings).last_batch
    assert finished is not None
    assert collect_health(settings, now=finished.finished_at + timedelta(minutes=14)
                          ).problems == []
    stalled = collect_health(settings, now=finished.finished_at + timedelta(minutes=16))
    assert stalled.problems == [
        "the stream has stalled: 1 file waits in the landing folder and the last batch "
        "committed 16m ago (over 15m, SESSIONLAKE_ALERT_STALLED_AFTER); no run holds the "
        "checkpoint: is the micro-batch DAG paused or failing?"]
    assert stalled.as_json()["status"] == "unhealthy"
    (landing / "waiting.jsonl").unlink()  # read since: nothing waits, nothing stalled
    assert collect_health(settings, now=finished.finished_at + timedelta(hours=5)
                          ).as_json()["status"] == "ok"

    marker = Path(settings.checkpoint) / RESTORING_MARKER
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(json.dumps({"snapshot_id": "20260105T101500Z-abc123"}))
    assert collect_health(settings).problems == [
        "a restore to snapshot 20260105T101500Z-abc123 was cut off half-way: no run starts "
        "until `sessionlake restore --snapshot 20260105T101500Z-abc123` is run again"]


def test_the_input_waiting_is_counted_on_the_running_stream_s_own_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream started with its own ``--checkpoint`` (here a relative one) is sized
    against that checkpoint, not the default the page's settings name, on which every file
    it read would count as waiting."""
    landing, lake, elsewhere = tmp_path / "landing", tmp_path / "lake", tmp_path / "elsewhere"
    landing.mkdir()
    (landing / "read.json").write_text("{}\n")
    write_source_log(elsewhere, {"0": [(str(landing / "read.json"), 0)]}, 0)
    settings = settings_from({"lake": str(lake), "source": str(landing)}, env={})
    waiting = collect_health(settings).input_waiting
    assert waiting is not None and (waiting.files, waiting.read_left) == (1, 0)

    monkeypatch.chdir(tmp_path)
    with held_by_another_process("stream_locks", lake, "elsewhere"):
        health = collect_health(settings)
    assert health.stream_checkpoint == str(elsewhere)
    assert health.input_waiting is not None
    assert (health.input_waiting.files, health.input_waiting.read_left) == (0, 1)


def test_a_kafka_stream_s_lake_is_told_as_one_from_its_checkpoint(tmp_path: Path) -> None:
    """``report`` and the page are mostly given only ``--lake``: a lake whose checkpoint
    read a Kafka topic names that topic, not "no landing folder set"."""
    lake = tmp_path / "lake"
    source_log = lake / "_checkpoints" / "stream" / "spark" / "sources" / "0"
    source_log.mkdir(parents=True)
    (source_log / "0").write_text('\0v1\n{"clicks":{"0":0,"1":0}}')
    health = collect_health(settings_from({"lake": str(lake)}, env={}))
    assert (health.source, health.kafka_topics) == ("kafka", ["clicks"])
    assert health.as_json()["kafka_topics"] == ["clicks"]
    assert input_waiting_text(health).startswith("not counted: Kafka topic clicks (")


@pytest.mark.parametrize(("source", "text", "problem"), [
    (None, "no landing folder set", None),
    ("kafka", "not counted: Kafka topic events (the offsets read are in the checkpoint: "
     "Spark commits none to a consumer group)", None),
    ("{landing}/2026-*", "not counted: the landing folder is a pattern, which only Spark lists",
     None),
    ("s3a://bucket/landing", "not counted: the landing folder is not on this machine", None),
    ("{landing}/missing", "not counted: no landing folder at {landing}/missing",
     "no landing folder at {landing}/missing"),
])
def test_input_that_cannot_be_sized_here_says_why(
    tmp_path: Path, source: str | None, text: str, problem: str | None
) -> None:
    values = {"lake": str(tmp_path / "lake"), "source": source}
    if source == "kafka":
        values |= {"kafka_bootstrap": "127.0.0.1:9", "kafka_topic": "events"}
    if source:
        values["source"] = source.format(landing=tmp_path)
    health = collect_health(settings_from(values, env={}))
    assert health.input_waiting is None and health.as_json()["input_waiting"] is None
    assert input_waiting_text(health) == text.format(landing=tmp_path)
    assert 'id="archive-due"' not in render_health_page(health)
    named = [p for p in health.problems if p.startswith("no landing folder")]
    assert named == ([problem.format(landing=tmp_path) + ": the stream has nothing to read"]
                     if problem else [])

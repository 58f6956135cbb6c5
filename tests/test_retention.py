"""Retention: erasure everywhere (time travel included), age limits, the VACUUM floor, audit."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionlake import erasure, faults, rebuild, retention, snapshots
from sessionlake.checkpoint import BATCH_LOCK_FILE, batch_locks, lake_lock_folder, lock_held
from sessionlake.cli import main
from sessionlake.config import Settings, settings_from
from sessionlake.erasure import (
    ERASED_REASON,
    ERASURES_UNDER_WAY,
    LANDING_MARGIN_MS,
    ErasureRun,
    erased_after_landing,
    erasure_noted,
    note_erasure,
    user_hash,
    users_hashed,
)
from sessionlake.ledger import stream_identity
from sessionlake.locks import lake_lock
from sessionlake.rebuild import rebuild_open_sessions
from sessionlake.registry import register_stream
from sessionlake.retention import (
    EXPIRE_HINT,
    NO_ROW_TO_ERASE,
    RUNNING_STREAM_HOURS,
    RetentionError,
    RetentionRequest,
    VacuumPlan,
    enforce_retention,
    plan_vacuum,
)
from sessionlake.snapshots import create_snapshot, list_snapshots, restore_snapshot
from sessionlake.stream import run_stream
from sessionlake.tables import (
    STREAM_TABLES,
    USER_TABLES,
    read_table,
    table_path,
    table_version,
)
from tests.conftest import REPO
from tests.helpers import NOW, erasure_stalled, event, kill_with_children, run_batches

#: A batch after BATCHES whose time moves the watermark past u2's open session: the batch
#: closes it, writing u2's session to `sessions` from the state it read when it started.
CLOSING_BATCH = [event("u1", "16:00", "/e")]

#: u2 ends up in every table that holds user data: events and sessions (10:00), the
#: changelog, open_sessions (13:00, still open), late_events (09:00 after the watermark
#: passed it) and quarantine (a record with a user but no readable time).
BATCHES = [
    [event("u1", "10:00", "/"), event("u2", "10:00", "/a"), event("u2", "10:10", "/b"),
     event("x", "2026-01-01T08:00:00Z", "/old")],
    [event("u1", "12:00", "/c"), event("u2", "13:00", "/d"), event("u2", "09:00", "/late"),
     json.dumps({"user_id": "u2", "event_time": "yesterday"}), event("u3", "13:05", "/")],
]
INJECTION_IDS = ["x' OR '1'='1", "' OR 1=1 --", "u1' --", "%", "u%", "*",
                 "u1 OR user_id IS NOT NULL"]


def user_rows(spark: SparkSession, lake: str, user: str) -> dict[str, int]:
    """Rows of ``user`` per table, in the current version."""
    return {t: read_table(spark, lake, t).where(F.col("user_id") == user).count()
            for t in USER_TABLES}


def rows_in_files(spark: SparkSession, lake: str, table: str, user: str) -> int:
    """Rows of ``user`` in every data file on disk, whatever the log says about them."""
    files = [str(p) for p in Path(table_path(lake, table)).rglob("*.parquet")
             if "_delta_log" not in p.parts]
    if not files:
        return 0
    return spark.read.parquet(*files).where(F.col("user_id") == user).count()


@pytest.fixture(scope="module")
def built_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BATCHES run once through the stream's batch code; each test gets a copy."""
    lake = tmp_path_factory.mktemp("retention") / "lake"
    run_batches(spark, settings_from({"lake": str(lake)}, env={}), BATCHES)
    return lake


@pytest.fixture
def settings(built_lake: Path, lake: str) -> Settings:
    shutil.copytree(built_lake, lake)
    return settings_from({"lake": lake}, env={})


def test_erasure_reaches_every_table_and_every_file(
    spark: SparkSession, settings: Settings
) -> None:
    before = user_rows(spark, settings.lake, "u2")
    assert all(before.values()), before  # the fixture put u2 everywhere
    others = user_rows(spark, settings.lake, "u1")
    versions = {t: table_version(spark, settings.lake, t) for t in USER_TABLES}

    report = enforce_retention(spark, settings, RetentionRequest(
        erase_users=("u2",), vacuum_retain_hours=0))

    assert report.rows_deleted == before
    assert report.time_travel_purged
    assert user_rows(spark, settings.lake, "u2") == dict.fromkeys(USER_TABLES, 0)
    # Delta keeps each DELETE's condition in the table's history: the id is not in it.
    for table in USER_TABLES:
        predicates = [str(r["operationParameters"].get("predicate")) for r in spark.sql(
            f"DESCRIBE HISTORY delta.`{settings.lake}/{table}`").where(
            "operation = 'DELETE'").collect()]
        assert predicates and not any("u2" in p for p in predicates), (table, predicates)
    assert user_rows(spark, settings.lake, "u1") == others
    for table in USER_TABLES:
        # No data file on disk holds u2, deletion vectors or not: so no version, old or
        # new, can show u2 to time travel.
        assert rows_in_files(spark, settings.lake, table, "u2") == 0, table
        # The version before the erasure, which held u2, can no longer be read at all.
        with pytest.raises(Exception, match=r"(?i)file|path"):
            read_table(spark, settings.lake, table, versions[table]).where(
                F.col("user_id") == "u2").count()
    # Nor the log of a table that keeps no file statistics of its users or text: an erased
    # user's quarantined line stayed readable in quarantine's (the README review).
    for table in ("quarantine", "late_events"):
        logs = (Path(settings.lake) / table / "_delta_log").glob("*.json")
        assert not [log.name for log in logs if '"u2' in log.read_text()], table


@pytest.mark.parametrize("user_id", INJECTION_IDS)
def test_an_injection_shaped_id_matches_only_itself(spark: SparkSession, user_id: str) -> None:
    users = spark.createDataFrame([(u,) for u in ["u1", "u2", "x", user_id]], "user_id string")
    assert [r["user_id"] for r in users.where(users_hashed([user_hash(user_id)])).collect()] \
        == [user_id]


def test_injection_shaped_ids_erase_nothing(spark: SparkSession, settings: Settings) -> None:
    counts = {t: read_table(spark, settings.lake, t).count() for t in STREAM_TABLES}
    request = RetentionRequest(erase_users=tuple(INJECTION_IDS))
    preview = enforce_retention(spark, settings, replace(request, dry_run=True))
    # Beside an age limit that reaches rows (x's old day), the dry run still tells that the
    # erasure reaches none.
    aged = enforce_retention(spark, settings, replace(request, dry_run=True,
                                                      events_max_age_days=3),
                             now=datetime(2026, 1, 6, tzinfo=UTC))
    report = enforce_retention(spark, settings, request)
    assert not any(report.rows_deleted.values())
    assert report.note == NO_ROW_TO_ERASE  # not read as an erasure done
    assert preview.note is not None and preview.note.startswith(NO_ROW_TO_ERASE)
    assert aged.rows_deleted["events"] == 1
    assert aged.note is not None and aged.note.startswith(NO_ROW_TO_ERASE), aged.note
    assert {t: read_table(spark, settings.lake, t).count() for t in STREAM_TABLES} == counts


def test_age_limits_delete_old_sessions_and_events_only(
    spark: SparkSession, settings: Settings
) -> None:
    now = datetime(2026, 1, 6, tzinfo=UTC)  # cut-off 2026-01-03: x's day goes, the 5th stays
    report = enforce_retention(spark, settings, RetentionRequest(
        sessions_max_age_days=3, events_max_age_days=3), now=now)
    assert report.rows_deleted["events"] == 1
    assert report.rows_deleted["sessions"] == 1
    assert read_table(spark, settings.lake, "events").where("user_id = 'x'").count() == 0
    assert read_table(spark, settings.lake, "sessions").where("user_id = 'x'").count() == 0
    assert read_table(spark, settings.lake, "events").where("user_id = 'u1'").count() == 2
    assert not report.time_travel_purged and "time travel" in (report.note or "")


def test_an_erasure_rerun_to_purge_time_travel_says_what_a_snapshot_keeps_readable(
    spark: SparkSession, settings: Settings
) -> None:
    """An erasure run again with VACUUM 0 to purge what an earlier run deleted, a snapshot
    taken between them: it deletes nothing, and its VACUUM keeps the files of the hours
    before the snapshot (VACUUM counts whole hours). Its line said only "time travel
    kept" (a hands-on review): it says the earlier deletes may stay readable, and for how
    long."""
    first = enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    assert any(first.rows_deleted.values())
    snapshot = create_snapshot(spark, settings)
    report = enforce_retention(spark, settings, RetentionRequest(
        erase_users=("u2",), vacuum_retain_hours=0), now=snapshot.created + timedelta(hours=2))
    assert not any(report.rows_deleted.values()) and not report.time_travel_purged
    assert report.note is not None and report.note.endswith(
        "rows of these users that earlier runs deleted may stay readable by time travel "
        f"while snapshot {snapshot.snapshot_id} is kept (expire it: `sessionlake snapshot "
        "--keep-last 1` takes a snapshot of the lake as it is now and expires the older ones, "
        "as does the snapshot DAG with keep_last 1 and max_age_days null; `--expire-only "
        "--max-age-days N` expires those older than N days, but never the newest; "
        "--force-vacuum removes them, and the snapshot can then not be restored)"), report.note


def test_vacuum_keeps_what_a_snapshot_needs_and_a_restore_keeps_the_erasure(
    spark: SparkSession, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    snapshot = create_snapshot(spark, settings)
    later = snapshot.created + timedelta(hours=5)
    report = enforce_retention(spark, settings, RetentionRequest(
        erase_users=("u2",), vacuum_retain_hours=0), now=later)
    assert report.vacuum is not None and report.vacuum.hours == 5
    assert not report.time_travel_purged
    # Not "until" five hours from now: each later VACUUM keeps the snapshot's files too.
    assert report.note is not None and report.note.endswith(
        f"deleted rows stay readable by time travel while snapshot {snapshot.snapshot_id} "
        f"is kept ({EXPIRE_HINT})")
    assert "until" not in report.note

    with caplog.at_level(logging.WARNING, logger="sessionlake.erasure"):
        restore_snapshot(spark, settings, snapshot.snapshot_id)
    # Told before the wait, then what it deleted.
    assert [r.getMessage() for r in caplog.records if r.name == "sessionlake.erasure"] == [
        f"re-applying 1 erasure(s) the snapshot may not hold (it was taken "
        f"{snapshot.created.isoformat(timespec='seconds')})",
        "re-applied 1 erasure(s): rows deleted " + ", ".join(
            f"{t} {n}" for t, n in report.rows_deleted.items() if n)]
    # The snapshot's files were kept, and the erasure made after it is applied again.
    assert read_table(spark, settings.lake, "events").where("user_id = 'u1'").count() == 2
    assert user_rows(spark, settings.lake, "u2") == dict.fromkeys(USER_TABLES, 0)


def test_once_the_snapshot_expires_vacuum_no_longer_keeps_files_for_it(
    spark: SparkSession, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """Daily snapshots kept for ever kept every erased row readable by time travel: VACUUM
    keeps what the oldest needs. Once it expires, VACUUM keeps only what the newest needs.
    (That the files then go is not shown here: the erasure's are seconds old, and the floor
    is a whole hour at least.)"""
    old = create_snapshot(None, settings, now=datetime.now(UTC) - timedelta(days=40))
    erased = enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",),
                                                                 vacuum_retain_hours=0))
    assert erased.vacuum is not None and erased.vacuum.hours >= 40 * 24
    assert rows_in_files(spark, settings.lake, "events", "u2") > 0  # kept for the snapshot
    assert f"while snapshot {old.snapshot_id} is kept (expire it: " in (erased.note or "")

    assert main(["snapshot", "--lake", settings.lake, "--max-age-days", "30"]) == 0
    out = capsys.readouterr().out
    assert f"expired {old.snapshot_id}" in out
    [new] = list_snapshots(settings.lake)
    report = enforce_retention(spark, settings, RetentionRequest(vacuum_retain_hours=0))
    assert report.vacuum is not None and report.vacuum.hours == 1
    assert (report.note or "").endswith(f"snapshot, taken {new.created.isoformat()}")


def test_a_restore_keeps_an_erasure_that_started_before_the_snapshot_was_taken(
    spark: SparkSession, settings: Settings
) -> None:
    """An erasure stamps its start, then waits for the batch locks; a snapshot takes none.
    One taken in that wait holds the user though the erasure "started" before it: the
    restore must erase the user again (it did not, going by the start time alone)."""
    snapshot = create_snapshot(spark, settings, now=datetime.now(UTC) + timedelta(minutes=5))
    enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    assert user_rows(spark, settings.lake, "u2")["events"] == 0
    restore_snapshot(spark, settings, snapshot.snapshot_id)
    assert user_rows(spark, settings.lake, "u2") == dict.fromkeys(USER_TABLES, 0)
    assert read_table(spark, settings.lake, "events").where("user_id = 'u1'").count() == 2


def test_vacuum_keeps_the_files_of_a_snapshot_taken_a_moment_ago(
    spark: SparkSession, settings: Settings
) -> None:
    """Delta rounds VACUUM's retention to whole hours: a floor of a few minutes must keep
    an hour, not round down to none and delete the snapshot's files."""
    snapshot = create_snapshot(spark, settings)
    report = enforce_retention(spark, settings, RetentionRequest(
        erase_users=("u2",), vacuum_retain_hours=0))
    assert report.vacuum is not None and report.vacuum.hours == 1
    assert "1h instead of 0h" in (report.note or "")

    restore_snapshot(spark, settings, snapshot.snapshot_id)
    assert read_table(spark, settings.lake, "events").where("user_id = 'u1'").count() == 2
    assert user_rows(spark, settings.lake, "u2") == dict.fromkeys(USER_TABLES, 0)


def test_force_vacuum_goes_below_the_snapshot_floor(
    spark: SparkSession, settings: Settings
) -> None:
    create_snapshot(spark, settings)
    report = enforce_retention(spark, settings, RetentionRequest(
        erase_users=("u2",), vacuum_retain_hours=0, force_vacuum=True))
    assert report.vacuum is not None and report.vacuum.hours == 0
    assert report.time_travel_purged


def test_every_run_appends_one_audit_row_without_the_erased_ids(
    spark: SparkSession, settings: Settings
) -> None:
    # u3 named by its hash (as the DAG names users), u2 by both: each erased, once.
    enforce_retention(spark, settings, RetentionRequest(
        erase_users=("u2",), erase_user_sha256=(user_hash("u3"), user_hash("u2"))))
    enforce_retention(spark, settings, RetentionRequest(vacuum_retain_hours=200))
    audit = read_table(spark, settings.lake, "retention_audit").orderBy("started_at").collect()
    assert len(audit) == 2
    first, second = audit
    assert first["erased_users"] == 2
    assert sorted(first["erased_user_sha256"]) == sorted([user_hash("u2"), user_hash("u3")])
    assert "u2" not in json.dumps(first.asDict(recursive=True), default=str)
    assert first["rows_deleted"]["events"] == 4  # u2 three, u3 one
    assert first["versions_after"]["events"] > first["versions_before"]["events"]
    assert first["vacuum_retain_hours"] is None
    assert second["vacuum_retain_hours"] == 200 and second["erased_users"] == 0


def delta_would_vacuum(spark: SparkSession, lake: str, table: str, hours: float) -> int:
    """How many files Delta's own ``VACUUM ... DRY RUN`` of ``table`` would delete."""
    with retention._retention_check_off(spark, hours):
        return spark.sql(f"VACUUM delta.`{table_path(lake, table)}` RETAIN {hours:g} HOURS "
                         "DRY RUN").count()


def test_a_vacuum_is_skipped_only_where_delta_s_would_delete_nothing(
    spark: SparkSession, settings: Settings
) -> None:
    """Each retention run VACUUMed all seven tables, a second or more each with nothing to
    delete; it now skips a table whose files are all live or younger than the retention."""
    tables = Path(settings.lake)
    # A data file no version lists, written two hours ago (a writer killed mid-write).
    stale = tables / "events" / "event_date=2026-01-05" / "part-stale.parquet"
    stale.write_bytes(b"PAR1")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    # The same written a moment ago (a writer at work), and an empty folder.
    (tables / "sessions" / "part-fresh.parquet").write_bytes(b"PAR1")
    (tables / "batch_metrics" / "empty").mkdir()

    skipped = {(table, hours): retention.nothing_to_vacuum(settings.lake, table, hours)
               for hours in (0, 1) for table in STREAM_TABLES}
    for (table, hours), skip in skipped.items():
        if skip:
            assert delta_would_vacuum(spark, settings.lake, table, hours) == 0, (table, hours)
    assert [key for key, skip in skipped.items() if not skip] == [
        # The files the MERGEs replaced, and the three above (the appends left none behind:
        # their idle tasks wrote empty files, test_batch.py::test_conservation).
        ("events", 0), ("open_sessions", 0), ("sessions", 0), ("batch_metrics", 0),
        # Whatever the retention: the stale file, and the empty folder (VACUUM's to judge).
        ("events", 1), ("batch_metrics", 1)]


def files_on_disk(lake: str) -> set[Path]:
    """Every file under the lake, logs included."""
    return {p for p in Path(lake).rglob("*") if p.is_file()}


def test_a_dry_run_counts_what_the_run_deletes_and_changes_nothing(
    spark: SparkSession, settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    now = datetime(2026, 1, 6, tzinfo=UTC)  # the age limits reach x's day (2026-01-01)
    rows = RetentionRequest(erase_users=("u2",), sessions_max_age_days=3, events_max_age_days=3)
    vacuum = RetentionRequest(vacuum_retain_hours=0)
    versions = {t: table_version(spark, settings.lake, t) for t in STREAM_TABLES}
    files = files_on_disk(settings.lake)

    assert main(["retention", "--lake", settings.lake, "--erase-user", "u2",
                 "--vacuum-retain-hours", "0", "--dry-run"]) == 0
    preview = enforce_retention(
        spark, settings, replace(rows, vacuum_retain_hours=0, dry_run=True), now=now)

    assert files_on_disk(settings.lake) == files  # no file written, no file deleted
    assert {t: table_version(spark, settings.lake, t) for t in STREAM_TABLES} == versions
    printed = capsys.readouterr().out
    assert re.fullmatch(r"retention dry run \S+: would delete events 3, open_sessions 1, "
                        r"sessions 1, session_changelog \d+, late_events 1, quarantine 1; "
                        r"VACUUM 0h would remove \d+ files; nothing changed \(rows counted in "
                        r"[\w@, ]+\)\n", printed), printed
    # Each table counted at one version, said (a running stream commits meanwhile).
    counted = printed.split("rows counted in ")[1].rstrip(")\n").split(", ")
    assert counted == [f"{t}@{v}" for t, v in versions.items()
                       if t in preview.rows_deleted], counted
    assert preview.files_vacuumed > 0  # the MERGEs left files behind
    # What the dry run counted is what the runs then do.
    assert enforce_retention(spark, settings, vacuum).files_vacuumed == preview.files_vacuumed
    done = enforce_retention(spark, settings, rows, now=now).rows_deleted
    assert {t: n for t, n in preview.rows_deleted.items() if n} == \
        {t: n for t, n in done.items() if n}
    assert preview.rows_deleted["events"] == 4  # u2's three, and x's, which is old


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (RetentionRequest(erase_users=(" ",)), "erase-user"),
        (RetentionRequest(erase_user_sha256=("u2",)), "erase-user-sha256 'u2' is not a SHA-256"),
        (RetentionRequest(sessions_max_age_days=0), "sessions-max-age-days"),
        (RetentionRequest(vacuum_retain_hours=-1), "vacuum-retain-hours"),
        # A digit too many: the cut-off date would lie before Python's first (year 1).
        (RetentionRequest(events_max_age_days=10**6),
         "events-max-age-days must be from 1 to 36500, got 1000000"),
        (RetentionRequest(), "nothing to do: give --erase-user ID"),  # no audit row either
        (RetentionRequest(force_vacuum=True), "nothing to do"),
    ],
)
def test_bad_requests_change_nothing(
    spark: SparkSession, settings: Settings, request_: RetentionRequest, message: str
) -> None:
    files = files_on_disk(settings.lake)  # no commit, no data file, no audit row
    with pytest.raises(RetentionError, match=message):
        enforce_retention(spark, settings, request_)
    assert files_on_disk(settings.lake) == files


def test_a_missing_lake_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    config = settings_from({"lake": str(tmp_path / "nowhere")}, env={})
    with pytest.raises(RetentionError, match="sessionlake run"):
        enforce_retention(spark, config, RetentionRequest(erase_users=("u1",)))
    assert not (tmp_path / "nowhere").exists()


def erase_in_thread(spark: SparkSession, settings: Settings, user: str,
                    done: threading.Event | None = None
                    ) -> tuple[threading.Thread, list[BaseException]]:
    """A thread, not started, that erases ``user`` (and then sets ``done``), with the list
    of what it raised, for the test thread to report."""
    failures: list[BaseException] = []

    def erase() -> None:
        try:
            enforce_retention(spark, settings, RetentionRequest(erase_users=(user,)))
        except BaseException as error:  # reported by the test thread
            failures.append(error)
        finally:
            if done is not None:
                done.set()

    return threading.Thread(target=erase), failures


@pytest.mark.parametrize("stream_checkpoint", ["the erasure's", "another"])
def test_an_erasure_waits_for_the_batch_in_flight_and_stays_erased(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, tmp_path: Path, stream_checkpoint: str,
) -> None:
    """Erasing u2 while a batch that closes u2's session is in flight leaves no u2 behind.

    The batch is held at its start (its input versions pinned, nothing written) until the
    erasure has either finished (the race this guards against: the batch would then write
    u2's session back) or is waiting for the batch; also when the stream runs on another
    checkpoint than the one the erasure was given.
    """
    caplog.set_level(logging.INFO, logger="sessionlake.checkpoint")
    done = threading.Event()
    eraser, failures = erase_in_thread(spark, settings, "u2", done)
    real_point = faults.point

    def erase_while_in_flight(name: str) -> None:
        if name == "ingest" and not eraser.is_alive() and not done.is_set():
            eraser.start()
            deadline = time.monotonic() + 300
            while not done.is_set() and time.monotonic() < deadline and not any(
                "waiting" in r.getMessage() for r in caplog.records
            ):
                time.sleep(0.2)
        real_point(name)

    monkeypatch.setattr(faults, "point", erase_while_in_flight)
    stream = settings if stream_checkpoint == "the erasure's" else settings.with_overrides(
        checkpoint=str(tmp_path / "another-checkpoint"))
    run_batches(spark, stream, [CLOSING_BATCH], first_batch_id=len(BATCHES))
    eraser.join(timeout=600)

    assert not failures, failures
    assert any("waiting" in r.getMessage() for r in caplog.records)
    assert user_rows(spark, settings.lake, "u2") == dict.fromkeys(USER_TABLES, 0)
    assert user_rows(spark, settings.lake, "u1")["events"] == 3


@pytest.mark.parametrize("stream_checkpoint", ["the erasure's", "another"])
def test_an_erasure_waits_for_a_cut_off_batch_to_be_replayed(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path, stream_checkpoint: str,
) -> None:
    """A batch cut off after its MERGE would replay u2's state from before an erasure;
    also when its stream ran on another checkpoint than the one the erasure was given."""
    def crash_after_merge(name: str) -> None:
        if name == "after_merge":
            raise RuntimeError("cut off")

    stream = settings if stream_checkpoint == "the erasure's" else settings.with_overrides(
        checkpoint=str(tmp_path / "another-checkpoint"))
    register_stream(spark, stream.lake, stream.checkpoint)  # as a run does
    identity = stream_identity(spark, stream.checkpoint)  # as a run keeps it
    monkeypatch.setattr(faults, "point", crash_after_merge)
    with pytest.raises(RuntimeError, match="cut off"):
        run_batches(spark, stream, [CLOSING_BATCH], identity, len(BATCHES))
    monkeypatch.undo()
    before = user_rows(spark, settings.lake, "u2")

    with pytest.raises(RetentionError, match=f"on {Path(stream.checkpoint).resolve()} started"):
        enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    assert user_rows(spark, settings.lake, "u2") == before

    run_batches(spark, stream, [CLOSING_BATCH], identity, len(BATCHES))  # the replay
    enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    assert user_rows(spark, settings.lake, "u2") == dict.fromkeys(USER_TABLES, 0)


def test_vacuum_keeps_what_a_stream_on_another_checkpoint_may_still_read(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    """The VACUUM floor counts the lake's streams, not only the checkpoint given: one
    running on another checkpoint (the lake's lock), and a batch of another checkpoint cut
    off and not yet replayed (the lake's register of streams)."""
    now = datetime.now(UTC)
    asked = RetentionRequest(vacuum_retain_hours=0)
    assert plan_vacuum(spark, settings, asked, now) == VacuumPlan(0, 0)

    elsewhere = settings.with_overrides(checkpoint=str(tmp_path / "another-checkpoint"))
    with lake_lock(settings.lake, elsewhere.checkpoint):
        plan = plan_vacuum(spark, settings, asked, now)
    assert plan is not None and (plan.hours, plan.reason) == (
        RUNNING_STREAM_HOURS, f"VACUUM kept {RUNNING_STREAM_HOURS:g}h instead of 0h for "
        "the running stream")

    register_stream(spark, elsewhere.lake, elsewhere.checkpoint)
    identity = stream_identity(spark, elsewhere.checkpoint)
    started = now - timedelta(hours=5)
    (Path(elsewhere.checkpoint) / "ledger").mkdir()
    (Path(elsewhere.checkpoint) / "ledger" / f"{identity.stream_id}-0-7.json").write_text(
        json.dumps({"processing_time": started.isoformat(), "done": False}))
    plan = plan_vacuum(spark, settings, asked, now)
    assert plan is not None and plan.hours == 5 and plan.reason is not None
    assert f"an unfinished batch that started {started.isoformat()}" in plan.reason


@pytest.mark.parametrize("what", ["restore", "rebuild-state"])
def test_a_restore_or_a_rebuild_holds_off_erasures_while_it_works(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """Either reads the lake, then writes back what it read (a snapshot's versions, open
    sessions from events): an erasure in between would be undone. Their work runs under
    the lake's batch lock, which an erasure takes (and waits for)."""
    snapshot = create_snapshot(None, settings)
    module, step = (snapshots, "_restore_locked") if what == "restore" else (
        rebuild, "_rebuild")
    real = getattr(module, step)
    held: list[bool] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        held.append(lock_held(Path(lake_lock_folder(settings.lake)), BATCH_LOCK_FILE))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, step, spy)
    if what == "restore":
        restore_snapshot(spark, settings, snapshot.snapshot_id)
    else:
        rebuild_open_sessions(spark, settings)
    assert held == [True]


def test_age_limits_beside_a_stream_leave_no_old_row_it_wrote_meanwhile(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The concurrency review: a stream reading old input committed a batch while a
    retention run deleted by age, after the tables' DELETEs and before the open sessions':
    the batch's events stayed while their open sessions went, and the audit counted none
    of them. The tables a batch wrote to meanwhile are now aged out again between batches."""
    later = datetime(2026, 3, 1, tzinfo=UTC)  # every row of the fixture is 30+ days old
    register_stream(spark, settings.lake, settings.checkpoint)
    identity = stream_identity(spark, settings.checkpoint)
    events_before = read_table(spark, settings.lake, "events").count()
    real, batch_ran = retention.batches_held, list[bool]()

    @contextmanager
    def after_a_batch(*args: Any, **kwargs: Any) -> Iterator[None]:
        if not batch_ran:  # the batch commits once the tables' first DELETEs are done
            run_batches(spark, settings, [[event("u4", "14:00", "/"), event("u4", "14:10", "/x")]],
                        identity, len(BATCHES))
            batch_ran.append(True)
        with real(*args, **kwargs):
            yield

    monkeypatch.setattr(retention, "batches_held", after_a_batch)
    report = enforce_retention(spark, settings, RetentionRequest(
        sessions_max_age_days=30, events_max_age_days=30), now=later)
    assert batch_ran
    assert "not aged out" not in (report.note or ""), report.note
    left = {t: read_table(spark, settings.lake, t).count()
            for t in ("events", "open_sessions", "sessions", "session_changelog")}
    assert left == dict.fromkeys(left, 0)
    assert report.rows_deleted["events"] == events_before + 2


def test_a_delete_counts_its_own_rows_not_another_writer_s_beside_it(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The concurrency review: an erasure and an age limit run side by side each counted
    the other's DELETE too, in their lines and audit rows."""
    events = read_table(spark, settings.lake, "events")
    u1, u2 = (events.where(F.col("user_id") == user).count() for user in ("u1", "u2"))
    assert u1 and u2
    real = erasure.retry_on_conflict

    def another_writer_first(action: Callable[[], Any], what: str) -> Any:
        DeltaTable.forPath(spark, table_path(settings.lake, "events")).delete(
            F.col("user_id") == "u1")
        return real(action, what)

    monkeypatch.setattr(erasure, "retry_on_conflict", another_writer_first)
    assert erasure.delete_rows(spark, settings.lake, "events", F.col("user_id") == "u2") == u2
    assert read_table(spark, settings.lake, "events").where(
        F.col("user_id").isin("u1", "u2")).count() == 0


@pytest.mark.parametrize("batch", ["none unfinished", "one cut off"])
def test_open_sessions_past_the_age_limit_are_deleted_between_batches(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch, batch: str
) -> None:
    """A stream whose input stalls keeps its sessions open: they age out like closed ones,
    but never under a batch that would write them back (one cut off is replayed first)."""
    later = datetime(2026, 3, 1, tzinfo=UTC)  # every session of the fixture is 30+ days old
    request = RetentionRequest(sessions_max_age_days=30)
    open_before = read_table(spark, settings.lake, "open_sessions").count()
    assert open_before > 0
    register_stream(spark, settings.lake, settings.checkpoint)  # as a run does
    identity = stream_identity(spark, settings.checkpoint)
    if batch == "one cut off":
        def crash_after_merge(name: str) -> None:
            if name == "after_merge":
                raise RuntimeError("cut off")

        monkeypatch.setattr(faults, "point", crash_after_merge)
        with pytest.raises(RuntimeError, match="cut off"):
            run_batches(spark, settings, [CLOSING_BATCH], identity, len(BATCHES))
        monkeypatch.undo()
        left = enforce_retention(spark, settings, request, now=later)
        assert "open_sessions" not in left.rows_deleted
        assert (left.note or "").startswith(
            "open sessions were not aged out, nor rows the stream may have written while "
            "this run deleted (a batch of the stream on "), left.note
        assert read_table(spark, settings.lake, "sessions").count() == 0  # closed: aged out

    run_batches(spark, settings, [CLOSING_BATCH], identity, len(BATCHES))
    report = enforce_retention(spark, settings, request, now=later)
    assert report.rows_deleted.get("open_sessions", 0) > 0
    assert read_table(spark, settings.lake, "open_sessions").count() == 0
    assert read_table(spark, settings.lake, "sessions").count() == 0
    # The next batch finds no old state to close or extend, and writes none back.
    run_batches(spark, settings, [[event("u3", "16:30", "/")]], identity, len(BATCHES) + 1)
    assert read_table(spark, settings.lake, "sessions").count() == 0
    assert [r["user_id"] for r in read_table(spark, settings.lake, "open_sessions").collect()
            ] == ["u3"]


def test_a_restore_deletes_again_what_age_limits_deleted_since_the_snapshot(
    spark: SparkSession, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The snapshot still holds x's old day: returned to it, the tables would show rows the
    retention promised were gone."""
    snapshot = create_snapshot(None, settings)
    now = datetime(2026, 1, 6, tzinfo=UTC)  # cut-off 2026-01-03: x's day (01-01) goes
    report = enforce_retention(spark, settings, RetentionRequest(
        sessions_max_age_days=3, events_max_age_days=3), now=now)
    assert report.rows_deleted["events"] == report.rows_deleted["sessions"] == 1

    with caplog.at_level(logging.WARNING, logger="sessionlake.erasure"):
        restore_snapshot(spark, settings, snapshot.snapshot_id)
    assert user_rows(spark, settings.lake, "x") == dict.fromkeys(USER_TABLES, 0)
    assert read_table(spark, settings.lake, "events").where("user_id = 'u1'").count() == 2
    assert next(r.getMessage() for r in caplog.records if r.name == "sessionlake.erasure") == (
        "re-applying the age limits (sessions before 2026-01-03, events before 2026-01-03) "
        f"the snapshot may not hold (it was taken {snapshot.created.isoformat('T', 'seconds')})")
    # The audit, the record of every deletion, has the restore's as a run of its own.
    last = read_table(spark, settings.lake, "retention_audit").orderBy(
        F.desc("finished_at")).head()
    assert last is not None and last["run_id"].endswith("-restore")
    assert (last["sessions_cutoff"], last["events_cutoff"]) == (date(2026, 1, 3),) * 2
    assert last["rows_deleted"]["events"] == last["rows_deleted"]["sessions"] == 1
    assert last["note"].startswith(f"re-applied by the restore to snapshot {snapshot.snapshot_id}")


def test_an_erasure_finds_the_user_named_only_in_quarantined_text(
    spark: SparkSession, settings: Settings
) -> None:
    """A record quarantined before its user was read (a line that did not parse, the id
    under another key) names the user in its raw text only; another user's stays."""
    naming = ["{not json u2 /a", json.dumps({"who": "u2", "event_time": "10:00"}),
              '10.0.0.9 - u2 [05/Jan/2026:10:00:00 +0000] "GET / HTTP/1.1" 200 5']
    others = ["{not json u22 /b", json.dumps({"who": "u2x"})]
    run_batches(spark, settings, [naming + others], first_batch_id=len(BATCHES))

    report = enforce_retention(spark, settings, RetentionRequest(
        erase_user_sha256=(user_hash("u2"),), vacuum_retain_hours=0))

    assert report.rows_deleted["quarantine"] == 1 + len(naming)  # and u2's own record
    left = read_table(spark, settings.lake, "quarantine").select("raw").collect()
    assert sorted(r["raw"] for r in left) == sorted(others)
    files = [str(p) for p in Path(table_path(settings.lake, "quarantine")).rglob("*.parquet")
             if "_delta_log" not in p.parts]
    assert sorted(r["raw"] for r in spark.read.parquet(*files).collect()) == sorted(others)


def test_records_that_landed_before_their_user_s_erasure_are_kept_out_when_read_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A restore to a snapshot from before an erasure applies it again to the tables, and
    the stream then reads again the files it had read since the snapshot: before, the
    erased user's events came back with them. A record that landed before its user's
    erasure is kept out whenever it is read (a quarantine row without its text or user);
    one that landed after the erasure is taken in."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    settings = settings_from({"lake": str(lake), "source": str(landing)}, env={})

    def run() -> None:
        run_stream(spark, settings, clock=lambda: NOW)

    (landing / "f1.jsonl").write_text(f"{event('u1', '10:00', '/a')}\n"
                                      f"{event('u2', '10:01', '/b')}\n")
    run()
    snapshot = create_snapshot(spark, settings)
    (landing / "f 2.jsonl").write_text(f"{event('u2', '10:05', '/c')}\n"
                                       f"{event('u1', '10:06', '/d')}\n")
    run()
    enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    restore_snapshot(spark, settings, snapshot.snapshot_id)
    (landing / "f3.jsonl").write_text(f"{event('u2', '10:20', '/e')}\n")  # u2 is back
    # ... well after the erasure: within LANDING_MARGIN_MS of it, a file is kept out of.
    later = time.time() + 60
    os.utime(landing / "f3.jsonl", (later, later))
    run()

    pages = read_table(spark, str(lake), "events").select("user_id", "page").collect()
    assert sorted(tuple(r) for r in pages) == [("u1", "/a"), ("u1", "/d"), ("u2", "/e")]
    [kept_out] = read_table(spark, str(lake), "quarantine").collect()
    assert (kept_out["source_file"], kept_out["source_line"], kept_out["raw"],
            kept_out["user_id"], kept_out["reason"]) == ("f%202.jsonl", 1, "", None,
                                                         ERASED_REASON)  # named as Spark does
    changelog = read_table(spark, str(lake), "session_changelog")
    assert changelog.where("user_id = 'u2' AND session_start < '2026-01-05 10:20:00'"
                           ).count() == 0


def test_an_erasure_cut_off_before_its_deletes_keeps_nobody_out_and_a_rerun_clears_notes(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An erasure notes itself before it deletes, for the batches between its deletes and
    its audit row. Cut off before its deletes (Ctrl-C; a mistyped id cancelled), its note
    stayed, and every later read of the user's earlier records kept them out, for good (a
    hands-on review). A run killed before any delete leaves its note, which the next
    erasure drops (its lock let go, no delete since its versions), of whichever users; a
    run still under way keeps its note, even when the next erasure covers its users."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    settings = settings_from({"lake": str(lake), "source": str(landing)}, env={})
    (landing / "f0.jsonl").write_text(f"{event('u1', '10:00', '/a')}\n")
    run_stream(spark, settings, clock=lambda: NOW)
    (landing / "f1.jsonl").write_text(f"{event('u2', '10:01', '/b')}\n")

    def cut_off(*args: Any) -> dict[str, int]:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(retention, "erase", cut_off)
        with pytest.raises(KeyboardInterrupt):
            enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    under_way = lake / "_checkpoints" / ERASURES_UNDER_WAY
    assert not list(under_way.iterdir())
    run_stream(spark, settings, clock=lambda: NOW)
    users = {r[0] for r in read_table(spark, str(lake), "events").select("user_id").collect()}
    assert users == {"u1", "u2"}

    # A run of u1's erasure that noted itself, then died (its lock let go by the kernel)
    # before any delete; its note is not one the next erasure, of u2, covers.
    versions = json.dumps({t: table_version(spark, str(lake), t) for t in USER_TABLES})
    subprocess.run(
        [sys.executable, "-c", "import json, sys; from sessionlake.erasure import "
         "note_erasure; from tests.helpers import NOW; note_erasure(None, *sys.argv[1:3], "
         "NOW, sys.argv[4:], json.loads(sys.argv[3]))", str(lake), "killed-run", versions,
         user_hash("u1")], cwd=REPO, check=True)
    assert sorted(p.name for p in under_way.iterdir()) == ["killed-run.json", "killed-run.lock"]
    note_erasure(None, str(lake), "other-run", NOW, [user_hash("u2")])
    enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    # Live: it writes its own audit row.
    assert sorted(p.name for p in under_way.glob("*.json")) == ["other-run.json"]
    erasure_noted(None, str(lake), "other-run")
    assert not list(under_way.iterdir())


def rerun_finishes(spark: SparkSession, settings: Settings, user: str,
                   before: dict[str, int], run_id: str) -> None:
    """``sessionlake retention --erase-user USER`` run again erases what is left of the
    user, and its audit row, the only one, counts every row the user had ``before`` and
    names the cut-off run ``run_id`` it finishes."""
    assert main(["retention", "--lake", settings.lake, "--erase-user", user]) == 0
    assert user_rows(spark, settings.lake, user) == dict.fromkeys(USER_TABLES, 0)
    [audit] = read_table(spark, settings.lake, "retention_audit").collect()
    assert {t: n for t, n in audit["rows_deleted"].items() if n} == before
    assert audit["note"].startswith(f"finishes erasure run(s) {run_id}, cut off after "
                                    "some of their deletes (counted here)"), audit["note"]


def test_ctrl_c_during_an_erasure_says_what_to_do_in_one_line_and_a_rerun_finishes_it(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    """Ctrl-C (SIGINT to the terminal's process group: the command and Spark's JVM, which
    ignores it) while `sessionlake retention` erases, its DELETEs done and their purge not:
    it printed a trace through the threads Python waited in and Spark's signal handler, and
    nothing of what the run left (the deletes done and no audit row). It says so in one
    line, exits 130 as a shell reports SIGINT, and the same command run again finishes."""
    before = user_rows(spark, settings.lake, "u2")
    with erasure_stalled(settings.lake, "u2", tmp_path) as process:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=120)
    out, err = (tmp_path / "retention.out").read_text(), (tmp_path / "retention.err").read_text()

    assert process.returncode == 130, err[-3000:]
    assert err.splitlines()[-1] == (
        "sessionlake: retention interrupted before it finished: its deletes may be done in "
        "some tables and not yet in others, and it wrote no audit row: run the same command "
        "again, which finishes them (its audit row counts this run's erasure deletes "
        "too)"), err[-3000:]
    assert "Traceback" not in err and "\tat org.apache." not in err, err[-3000:]
    assert out == ""
    assert read_table(spark, settings.lake, "retention_audit").count() == 0
    assert sum(user_rows(spark, settings.lake, "u2").values()) < sum(before.values())  # some done

    # Its note stays, keeping the user's waiting records out until the rerun.
    [cut_off] = (Path(settings.lake) / "_checkpoints" / ERASURES_UNDER_WAY).iterdir()

    # The rerun's audit row counts the cut-off run's deletes too (it said "deleted
    # nothing ... no row of the user(s) to erase was found": a hands-on review).
    rerun_finishes(spark, settings, "u2", before, cut_off.stem)
    assert not cut_off.exists()


def test_an_erasure_killed_after_some_deletes_is_counted_by_the_run_that_finishes_it(
    spark: SparkSession, settings: Settings, tmp_path: Path
) -> None:
    """SIGKILL (Airflow stopping a spark-submitted retention task, the OOM killer) after
    some of an erasure's deletes: nothing ran to mark its note, and the rerun's audit row
    counted only what was left to delete. The note's lock, let go by the kernel, tells the
    rerun the run is dead: it reads the dead run's deletes back from the commits."""
    before = user_rows(spark, settings.lake, "u2")
    with erasure_stalled(settings.lake, "u2", tmp_path) as process:
        kill_with_children(process)
    left = user_rows(spark, settings.lake, "u2")
    assert sum(left.values()) < sum(before.values())  # some deletes done
    [killed] = (Path(settings.lake) / "_checkpoints" / ERASURES_UNDER_WAY).glob("*.json")

    rerun_finishes(spark, settings, "u2", before, killed.stem)
    assert not list(killed.parent.iterdir())  # the note and its lock


def test_an_erasure_killed_beside_another_of_its_users_is_counted_by_a_later_one(
    spark: SparkSession, settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second erasure of a user runs while the first, its deletes done, is in its VACUUM;
    the first is killed before the second ends. The second's end dropped the first's note
    (it covers its users, and no process held its lock any more), and the first's deletes
    were in no audit row (a diff review). The note stays; the next erasure counts them."""
    before = user_rows(spark, settings.lake, "u2")
    under_way = Path(settings.lake) / "_checkpoints" / ERASURES_UNDER_WAY
    with erasure_stalled(settings.lake, "u2", tmp_path, point="vacuum") as first:
        age_limits = retention.age_limits

        def first_killed(*args: Any) -> Any:  # after the second's deletes and count
            kill_with_children(first)
            return age_limits(*args)

        with monkeypatch.context() as patched:
            patched.setattr(retention, "age_limits", first_killed)
            second = enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    assert not any(second.rows_deleted.values())
    assert len(list(under_way.glob("*.json"))) == 1  # the first's, to be counted

    third = enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    assert {t: n for t, n in third.rows_deleted.items() if n} == before
    assert not list(under_way.iterdir())


def test_an_erasure_killed_after_its_audit_row_is_not_counted_again(
    spark: SparkSession, settings: Settings
) -> None:
    """Killed between its audit row and the removal of its note: the next erasure took the
    note, its deletes noted, for a run still to count, and counted them again (a diff
    review). A dead run already in the audit only loses its note."""
    first = enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    assert any(first.rows_deleted.values())
    subprocess.run(  # what the kill left: the note, its deletes noted, and the lock, free
        [sys.executable, "-c", "import json, sys; from sessionlake.erasure import "
         "note_deleted, note_erasure; from tests.helpers import NOW; "
         "lake, run, deleted, user = sys.argv[1:]; note_erasure(None, lake, run, NOW, "
         "[user]); note_deleted(None, lake, run, json.loads(deleted))", settings.lake,
         first.run_id, json.dumps(first.rows_deleted), user_hash("u2")],
        cwd=REPO, check=True)

    second = enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    assert not any(second.rows_deleted.values())
    assert second.note is not None and "finishes" not in second.note
    assert not list((Path(settings.lake) / "_checkpoints" / ERASURES_UNDER_WAY).iterdir())


def test_an_erasure_of_some_users_of_a_cut_off_run_says_it_does_not_finish_it(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run erasing two users, cut off after its deletes, then each user erased alone (a
    hands-on review: the erasure DAG triggered again user by user): each rerun's row said
    only "no row of the user(s) to erase was found", and the cut-off run's deletes were in
    no audit row. It says the cut-off run is not finished, and how to finish it."""
    before = user_rows(spark, settings.lake, "u1")
    before = {t: n + user_rows(spark, settings.lake, "u2")[t] for t, n in before.items()}

    def ctrl_c(*args: Any) -> int:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(retention, "vacuum_tables", ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            enforce_retention(spark, settings, RetentionRequest(erase_users=("u1", "u2"),
                                                                vacuum_retain_hours=0))
    [cut_off] = (Path(settings.lake) / "_checkpoints" / ERASURES_UNDER_WAY).glob("*.json")

    alone = enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    assert alone.note is not None and (
        f"erasure run(s) {cut_off.stem} (with 1 other user(s)) erased these users with "
        "others and were cut off after some of their deletes") in alone.note, alone.note
    assert cut_off.exists()

    both = enforce_retention(spark, settings, RetentionRequest(erase_users=("u2", "u1")))
    assert {t: n for t, n in both.rows_deleted.items() if n} == {
        t: n for t, n in before.items() if n}
    assert not cut_off.exists()


def test_an_erasure_cut_off_after_its_deletes_is_counted_by_the_run_that_finishes_it(
    spark: SparkSession, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C during an erasure's VACUUM: its deletes were done and no audit row written.
    The rerun's row said "deleted nothing ... no row of the user(s) to erase was found" (a
    hands-on review). It counts the cut-off run's deletes and names it; the note of a run
    still under way (no mark: a second retention run beside it) is not taken for one."""
    before = user_rows(spark, settings.lake, "u2")
    under_way = Path(settings.lake) / "_checkpoints" / ERASURES_UNDER_WAY
    note_erasure(None, settings.lake, "beside", NOW, [user_hash("u2")], {"events": 0})

    def ctrl_c(*args: Any) -> int:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        patched.setattr(retention, "vacuum_tables", ctrl_c)
        with pytest.raises(KeyboardInterrupt):
            enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",),
                                                                vacuum_retain_hours=0))
    assert read_table(spark, settings.lake, "retention_audit").count() == 0
    [cut_off] = [p for p in under_way.iterdir() if p.stem != "beside"]
    assert json.loads(cut_off.read_text())["cut_off"] == before

    report = enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    assert {t: n for t, n in report.rows_deleted.items() if n} == before
    assert report.note is not None and report.note.startswith(
        f"finishes erasure run(s) {cut_off.stem}, cut off after some of their deletes "
        "(counted here)"), report.note
    assert NO_ROW_TO_ERASE not in report.note
    assert sorted(p.name for p in under_way.iterdir()) == ["beside.json", "beside.lock"]
    erasure_noted(None, settings.lake, "beside")


def test_a_file_that_landed_while_the_erasure_waited_for_the_batch_in_flight_is_kept_out(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An erasure waits for the batch in flight before it erases; a file of the user that
    landed meanwhile is older than the erasure, and is kept out when read after it (it
    counted from the run's start, before the wait, and came in)."""
    caplog.set_level(logging.INFO, logger="sessionlake.checkpoint")
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    settings = settings_from({"lake": str(lake), "source": str(landing)}, env={})
    (landing / "f0.jsonl").write_text(f"{event('u2', '10:00', '/a')}\n")
    run_stream(spark, settings, clock=lambda: NOW)
    eraser, failures = erase_in_thread(spark, settings, "u2")
    with batch_locks(settings.lake, settings.checkpoint):  # a batch in flight
        eraser.start()
        deadline = time.monotonic() + 120
        while not any("waiting" in r.getMessage() for r in caplog.records):
            assert time.monotonic() < deadline, "the erasure did not wait"
            time.sleep(0.2)
        time.sleep(LANDING_MARGIN_MS / 1000 + 1)
        (landing / "f1.jsonl").write_text(f"{event('u2', '10:05', '/b')}\n")
    eraser.join(timeout=300)
    assert not failures, failures
    run_stream(spark, settings, clock=lambda: NOW)
    assert read_table(spark, str(lake), "events").count() == 0
    assert [(r["source_file"], r["reason"]) for r in read_table(
        spark, str(lake), "quarantine").collect()] == [("f1.jsonl", ERASED_REASON)]


def test_a_batch_between_an_erasure_s_deletes_and_its_audit_row_keeps_the_user_out(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An erasure lets go of the batch locks after its deletes, then applies age limits
    and VACUUM before its audit row: a batch in between read an audit without it, and took
    in the erased user's waiting records (the diff review). It reads the erasure's note."""
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    settings = settings_from({"lake": str(lake), "source": str(landing)}, env={})
    (landing / "f0.jsonl").write_text(f"{event('u1', '10:00', '/a')}\n")
    run_stream(spark, settings, clock=lambda: NOW)
    (landing / "f1.jsonl").write_text(f"{event('u2', '10:01', '/b')}\n"
                                      f"{event('u3', '10:02', '/c')}\n")
    age_limits = retention.age_limits

    def batch_first(*args: Any, **kwargs: Any) -> Any:
        run_stream(spark, settings, clock=lambda: NOW)  # the stream's next trigger
        return age_limits(*args, **kwargs)

    monkeypatch.setattr(retention, "age_limits", batch_first)
    enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    users = {r[0] for r in read_table(spark, str(lake), "events").select("user_id").collect()}
    assert users == {"u1", "u3"}
    assert [r["reason"] for r in read_table(spark, str(lake), "quarantine").collect()] == [
        ERASED_REASON]
    assert not list((lake / "_checkpoints" / ERASURES_UNDER_WAY).iterdir())  # noted, gone


@pytest.mark.parametrize(("landed_after_s", "kept_out"), [
    (-60, True), (0, True), (2, True),  # within the margin: times come from two clocks
    (10, False), (None, True)])  # a file whose time is not known is kept out of
def test_a_file_is_kept_out_of_by_the_erasures_after_it_landed(
    landed_after_s: int | None, kept_out: bool
) -> None:
    run = ErasureRun(1_000_000, (user_hash("u2"),))
    landed = None if landed_after_s is None else run.started_ms + landed_after_s * 1000
    groups = erased_after_landing([run], {"f.jsonl": landed})
    assert groups == ([(["f.jsonl"], [user_hash("u2")])] if kept_out else [])

"""Snapshots and restore: a restored lake, fed the same input, ends where it would have."""

from __future__ import annotations

import html
import json
import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from sessionlake import retention, storage
from sessionlake.archive import archive_read_files
from sessionlake.checkpoint import (
    CATALOG_LOCK_FILE,
    CONTINUOUS_LOG,
    RESTORING_MARKER,
    batch_lock,
)
from sessionlake.cli import main
from sessionlake.config import Settings, settings_from
from sessionlake.doctor import check_lake
from sessionlake.erasure import erasures_under_way, user_hash
from sessionlake.health import collect_health
from sessionlake.health_page import render_health_page
from sessionlake.locks import checkpoint_lock, lake_lock
from sessionlake.retention import RetentionRequest, enforce_retention
from sessionlake.snapshots import (
    Snapshot,
    SnapshotError,
    create_snapshot,
    expire_snapshots,
    find_snapshot,
    list_snapshots,
    new_snapshot_id,
    restore_snapshot,
    snapshots_root,
    snapshots_to_expire,
)
from sessionlake.spark import SparkOnDemand
from sessionlake.stream import RestoreUnfinished, run_stream
from sessionlake.tables import STREAM_TABLES, USER_TABLES, read_table, table_version
from tests.conftest import ObservedLake
from tests.helpers import NOW, create_tables, erasure_stalled, event, kill_with_children

#: Four landing files; each adds users, extends sessions, closes some, and the third one
#: brings a late event and a malformed line, so that every table is written.
FILES = [
    [event("u1", "10:00", "/"), event("u2", "10:05", "/a")],
    [event("u1", "10:20", "/b"), event("u3", "11:00", "/"), "{not json"],
    [event("u1", "12:00", "/c"), event("u2", "10:06", "/late"), event("u4", "12:10", "/")],
    [event("u3", "12:30", "/d"), event("u5", "13:30", "/"), event("u4", "12:11", "/x")],
]

#: Columns that are the same whatever the wall clock (batch_metrics keeps durations too).
STABLE_METRICS = ("batch_id", "input_records", "accepted", "late", "quarantined",
                  "duplicates", "sessions_opened", "closed_sessions", "open_sessions",
                  "max_event_time", "watermark_before", "watermark_after")


def land(landing: Path, index: int) -> None:
    """Drop landing file ``index``, one minute newer than the one before."""
    landing.mkdir(parents=True, exist_ok=True)
    path = landing / f"part-{index:02d}.jsonl"
    path.write_text("\n".join(FILES[index]) + "\n")
    stamp = 1_700_000_000 + 60 * index
    os.utime(path, (stamp, stamp))


def settings(root: Path, name: str) -> Settings:
    return settings_from({"lake": str(root / name), "source": str(root / f"{name}-landing"),
                          "max_files_per_trigger": 2}, env={})


def run(spark: SparkSession, config: Settings) -> list[dict[str, Any]]:
    return run_stream(spark, config, clock=lambda: NOW).processed


def tables_of(spark: SparkSession, lake: str) -> dict[str, Any]:
    """Every table's rows, without the columns that name the stream."""
    frames = {t: read_table(spark, lake, t) for t in STREAM_TABLES}
    frames["batch_metrics"] = frames["batch_metrics"].select(*STABLE_METRICS)
    return frames


def assert_same_lake(spark: SparkSession, lake: str, expected: str) -> None:
    got, want = tables_of(spark, lake), tables_of(spark, expected)
    for table in STREAM_TABLES:
        assertDataFrameEqual(got[table], want[table], checkRowOrder=False)


@pytest.fixture(scope="module")
def uninterrupted(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The reference: files 0-1 in one run, files 2-3 in the next, nothing restored."""
    root = tmp_path_factory.mktemp("reference")
    config = settings(root, "lake")
    land(Path(config.source or ""), 0)
    land(Path(config.source or ""), 1)
    run(spark, config)
    land(Path(config.source or ""), 2)
    land(Path(config.source or ""), 3)
    run(spark, config)
    return config.lake


def test_restore_then_resume_ends_as_if_nothing_was_restored(
    spark: SparkSession, tmp_path: Path, uninterrupted: str
) -> None:
    config = settings(tmp_path, "lake")
    landing = Path(config.source or "")
    land(landing, 0)
    land(landing, 1)
    run(spark, config)
    # A continuous run's own output (the restart DAG's) is no part of the stream: not in
    # the snapshot, and left whole by the restores below.
    output = Path(config.checkpoint) / CONTINUOUS_LOG
    output.write_text("before the snapshot\n")
    snapshot = create_snapshot(spark, config, name="after-first-run")
    assert not list((Path(config.lake) / "_snapshots").rglob(CONTINUOUS_LOG))
    with output.open("a") as more:
        more.write("after it\n")
    land(landing, 2)
    land(landing, 3)
    run(spark, config)
    assert_same_lake(spark, config.lake, uninterrupted)
    # The files every restore point read leave the landing folder; those the snapshot has
    # not read stay, for the restores below to read again.
    archived = archive_read_files(config, str(tmp_path / "archive"))
    assert (archived.moved, archived.kept_for_snapshots) == (2, 2)
    assert sorted(p.name for p in landing.iterdir()) == ["part-02.jsonl", "part-03.jsonl"]
    assert run(spark, config) == []

    # Twice: the second restore of the same snapshot must not be skipped as "done" either.
    for _ in range(2):
        restore_snapshot(spark, config, snapshot.snapshot_id)
        assert read_table(spark, config.lake, "events").count() == 4
        assert [m["batch_id"] for m in run(spark, config)] == [1]
        assert_same_lake(spark, config.lake, uninterrupted)
    assert output.read_text() == "before the snapshot\nafter it\n"


def test_a_snapshot_taken_during_a_batch_holds_the_batches_before_it(
    spark: SparkSession, tmp_path: Path, uninterrupted: str
) -> None:
    """A checkpoint copied while batch 1 was in flight: its table writes are left out."""
    config = settings(tmp_path, "lake")
    for index in range(4):
        land(Path(config.source or ""), index)
    run(spark, config)  # batches 0 and 1, two files each
    commit = Path(config.checkpoint) / "spark" / "commits" / "1"
    saved = commit.read_text()
    commit.unlink()  # as copied a moment before batch 1 committed to Spark
    snapshot = create_snapshot(spark, config)
    commit.write_text(saved)

    assert snapshot.last_batch_id == 0
    assert snapshot.table_versions["batch_metrics"] < table_version(
        spark, config.lake, "batch_metrics")
    restore_snapshot(spark, config, snapshot.snapshot_id)
    assert read_table(spark, config.lake, "batch_metrics").count() == 1
    assert [m["batch_id"] for m in run(spark, config)] == [1]
    assert_same_lake(spark, config.lake, uninterrupted)


def test_the_catalog_lists_snapshots_oldest_first(spark: SparkSession, tmp_path: Path) -> None:
    config = settings(tmp_path, "lake")
    land(Path(config.source or ""), 0)
    run(spark, config)
    first = create_snapshot(spark, config, name="one")
    second = create_snapshot(spark, config)
    listed = list_snapshots(config.lake)
    assert [s.snapshot_id for s in listed] == [first.snapshot_id, second.snapshot_id]
    assert find_snapshot(config.lake, first.snapshot_id).name == "one"
    assert first.table_versions == second.table_versions
    assert "one" in first.summary() and "after batch 0" in first.summary()
    # Its name finds it too (the restore DAG wanted the id alone), while only it bears it.
    assert find_snapshot(config.lake, "one") == first
    third = create_snapshot(spark, config, name="one")
    with pytest.raises(SnapshotError, match=f"2 snapshots of {config.lake} are named 'one' "
                                            f"\\({first.snapshot_id}, {third.snapshot_id}\\): "
                                            "give the id of the one meant"):
        find_snapshot(config.lake, "one")
    assert find_snapshot(config.lake, third.snapshot_id) == third
    # A name that is another's id, or empty (which `restore --snapshot ""` then found), is
    # refused (a review).
    for name, why in ((first.snapshot_id, "is the id of another snapshot"),
                      ("", "must be words"), (" one", "must be words")):
        with pytest.raises(SnapshotError, match=why):
            create_snapshot(spark, config, name=name)
    assert len(list_snapshots(config.lake)) == 3


def user_rows(spark: SparkSession, lake: str, user: str) -> dict[str, int]:
    """Rows of ``user`` per table that holds user data."""
    return {t: read_table(spark, lake, t).where(F.col("user_id") == user).count()
            for t in USER_TABLES}


def snapshot_then_a_batch(spark: SparkSession, tmp_path: Path) -> tuple[Settings, Snapshot]:
    """A lake of one batch, a snapshot of it, then a second batch."""
    config = settings(tmp_path, "lake")
    land(Path(config.source or ""), 0)
    run(spark, config)
    snapshot = create_snapshot(spark, config)
    land(Path(config.source or ""), 1)
    run(spark, config)
    return config, snapshot


@pytest.mark.parametrize("on", ["its checkpoint", "another checkpoint"])
def test_restore_is_refused_while_a_stream_runs(spark: SparkSession, tmp_path: Path,
                                                on: str) -> None:
    config, snapshot = snapshot_then_a_batch(spark, tmp_path)
    versions = {t: table_version(spark, config.lake, t) for t in STREAM_TABLES}
    running = (checkpoint_lock(config.checkpoint) if on == "its checkpoint"
               else lake_lock(config.lake, str(tmp_path / "elsewhere")))
    with running, pytest.raises(SnapshotError, match="stopped"):
        restore_snapshot(spark, config, snapshot.snapshot_id)
    assert versions == {t: table_version(spark, config.lake, t) for t in STREAM_TABLES}


def test_a_cut_off_restore_blocks_the_stream_until_it_is_run_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    config = settings(tmp_path, "lake")
    land(Path(config.source or ""), 0)
    run(spark, config)
    snapshot = create_snapshot(spark, config)
    marker = Path(config.checkpoint) / RESTORING_MARKER
    storage.write_text(spark, str(marker), f'{{"snapshot_id": "{snapshot.snapshot_id}"}}')
    with pytest.raises(RestoreUnfinished, match=snapshot.snapshot_id):
        run(spark, config)
    restore_snapshot(spark, config, snapshot.snapshot_id)
    assert not marker.exists()
    assert run(spark, config) == []


def test_a_restore_whose_files_were_vacuumed_is_refused_before_anything_changes(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config, snapshot = snapshot_then_a_batch(spark, tmp_path)
    # The health page found it restorable (and remembers its versions whole: not for long).
    assert [s.unrestorable for s in collect_health(config).snapshots] == [None]
    # u1's rows rewritten, and the files that held them before deleted at once.
    forced = enforce_retention(spark, config, RetentionRequest(
        erase_users=("u1",), vacuum_retain_hours=0, force_vacuum=True))
    assert (forced.note or "").startswith(
        "VACUUM forced to 0h, under the 1h kept for the oldest kept snapshot, taken "), forced
    assert forced.note and forced.note.endswith(
        ": `sessionlake snapshot --list` and `sessionlake doctor` say what can no longer "
        "be restored"), forced
    versions = {t: table_version(spark, config.lake, t) for t in STREAM_TABLES}
    def lake_files() -> set[Path]:  # but the catalog's lock, which the restore takes
        return {p for p in Path(config.lake).rglob("*")
                if p.is_file() and p.name != CATALOG_LOCK_FILE}

    files = lake_files()

    with pytest.raises(SnapshotError, match=r"cannot return to version .* nothing was restored"):
        restore_snapshot(spark, config, snapshot.snapshot_id)

    assert versions == {t: table_version(spark, config.lake, t) for t in STREAM_TABLES}
    assert files == lake_files()  # none set aside
    assert not (Path(config.checkpoint) / RESTORING_MARKER).exists()
    # The doctor: not damage, but no restore point either.
    assert check_lake(None, config).lines()[-1] == (
        f"not damaged, but 1 problem(s); recover with: sessionlake snapshot --lake {config.lake}")
    # The catalog says so without a restore being tried; a snapshot taken since is fine.
    fresh = create_snapshot(spark, config)
    assert main(["snapshot", "--lake", config.lake, "--list"]) == 0
    listed = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "[cannot be restored: " in listed[snapshot.snapshot_id]
    assert "cannot" not in listed[fresh.snapshot_id]
    # So does the health page, from the same check.
    health = collect_health(config)
    marks = {s.snapshot_id: s.unrestorable for s in health.snapshots}
    assert marks[fresh.snapshot_id] is None
    assert marks[snapshot.snapshot_id] == listed[snapshot.snapshot_id].split(
        "[cannot be restored: ", 1)[1].rstrip("]")
    assert f"no: {marks[snapshot.snapshot_id]}" in html.unescape(render_health_page(health))
    # And the doctor, once a snapshot was taken since: only the old folder to move out.
    report = check_lake(None, config)
    [unusable] = [f for f in report.findings if not f.ok]
    assert (unusable.subject, unusable.lost, unusable.damage) == (
        "snapshots", snapshot.snapshot_id, False)
    assert unusable.problem == f"cannot be restored ({marks[snapshot.snapshot_id]})"
    assert unusable.recovery == ("move this folder out of the lake (files it needs are gone: "
                                 "a forced VACUUM, or a hand, removed them); snapshot "
                                 f"{fresh.snapshot_id}, taken since, is a restore point")
    assert report.lines()[-1] == ("not damaged, but 1 problem(s); move the snapshot folders "
                                  "named above out of the lake")
    land(Path(config.source or ""), 2)
    assert len(run(spark, config)) == 1  # the stream goes on


@pytest.mark.parametrize("case", ["unknown id", "no lake"])
def test_bad_requests_are_refused(spark: SparkSession, tmp_path: Path, case: str) -> None:
    config = settings(tmp_path, "lake")
    if case == "no lake":
        with pytest.raises(SnapshotError, match="sessionlake run"):
            create_snapshot(spark, config)
        assert not Path(config.lake).exists()
    else:
        land(Path(config.source or ""), 0)
        run(spark, config)
        with pytest.raises(SnapshotError, match="no snapshot 'nope'"):
            restore_snapshot(spark, config, "nope")


def assert_tables_at(spark: SparkSession, lake: str, versions: dict[str, int]) -> None:
    """Each table reads as it did at its version."""
    for table, version in versions.items():
        then = spark.read.format("delta").option("versionAsOf", version).load(f"{lake}/{table}")
        assertDataFrameEqual(read_table(spark, lake, table), then)


def test_the_cli_snapshots_and_restores_a_local_lake_without_a_jvm(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A wrong id, or a stream holding the checkpoint, is told at once; a snapshot copies
    files, and each table returns by a commit written from its log."""
    config, snapshot = snapshot_then_a_batch(spark, tmp_path)
    monkeypatch.setattr("sessionlake.cli._spark",
                        lambda *args, **kwargs: pytest.fail("Spark was started"))
    assert main(["restore", "--lake", config.lake, "--snapshot", "nosuch"]) == 2
    assert "no snapshot 'nosuch' in" in capsys.readouterr().err
    with checkpoint_lock(config.checkpoint):
        assert main(["restore", "--lake", config.lake, "--snapshot",
                     snapshot.snapshot_id]) == 2
    assert "(a restore needs the stream stopped)" in capsys.readouterr().err

    assert main(["snapshot", "--lake", config.lake, "--checkpoint", config.checkpoint]) == 0
    newest = find_snapshot(config.lake, capsys.readouterr().out.split()[-1])
    assert newest.last_batch_id == 1
    assert newest.table_versions == {t: table_version(spark, config.lake, t)
                                     for t in STREAM_TABLES}
    assert main(["restore", "--lake", config.lake, "--checkpoint", config.checkpoint,
                 "--snapshot", snapshot.snapshot_id]) == 0
    assert_tables_at(spark, config.lake, snapshot.table_versions)


def test_an_erasure_since_the_snapshot_starts_spark_to_erase_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    config, snapshot = snapshot_then_a_batch(spark, tmp_path)
    enforce_retention(spark, config, RetentionRequest(erase_users=("u1",)))
    on_demand = SparkOnDemand(lambda: spark)
    restore_snapshot(on_demand, config, snapshot.snapshot_id)
    assert on_demand.started is spark
    assert read_table(spark, config.lake, "events").where("user_id = 'u1'").count() == 0


@pytest.mark.parametrize("ended_by", ["Ctrl-C", "SIGKILL"])
def test_a_restore_erases_again_the_users_of_an_erasure_cut_off_after_its_deletes(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ended_by: str
) -> None:
    """An erasure cut off (Ctrl-C in its VACUUM) or killed after some of its deletes has no
    audit row yet: a restore to a snapshot from before it brought the user back, and the
    rerun that finished it counted deletes twice (the rows it deleted again, and the
    cut-off run's). The restore erases the users of erasures under way again, in a row of
    its own, after reading back what a killed one deleted (its own re-application would
    look like the killed run's deletes after it); the rerun deletes nothing more and
    counts the deletes of the run it finishes."""
    config, snapshot = snapshot_then_a_batch(spark, tmp_path)

    def ctrl_c(*args: Any) -> int:
        raise KeyboardInterrupt

    before = user_rows(spark, config.lake, "u1")
    if ended_by == "Ctrl-C":
        with monkeypatch.context() as patched:
            patched.setattr(retention, "vacuum_tables", ctrl_c)
            with pytest.raises(KeyboardInterrupt):
                enforce_retention(spark, config, RetentionRequest(erase_users=("u1",),
                                                                  vacuum_retain_hours=0))
    else:
        with erasure_stalled(config.lake, "u1", tmp_path) as process:
            kill_with_children(process)
    left = user_rows(spark, config.lake, "u1")
    done = {t: before[t] - left[t] for t in USER_TABLES if before[t] != left[t]}
    assert done
    [run] = erasures_under_way(None, config.lake)

    restore_snapshot(SparkOnDemand(lambda: spark), config, snapshot.snapshot_id)
    assert user_rows(spark, config.lake, "u1") == dict.fromkeys(USER_TABLES, 0)
    [restore_row] = read_table(spark, config.lake, "retention_audit").collect()
    assert restore_row["erased_user_sha256"] == [user_hash("u1")]
    assert sum(restore_row["rows_deleted"].values()) > 0

    report = enforce_retention(spark, config, RetentionRequest(erase_users=("u1",)))
    assert {t: n for t, n in report.rows_deleted.items() if n} == done
    assert report.note is not None and report.note.startswith(
        f"finishes erasure run(s) {run.run_id}"), report.note
    assert not list((Path(config.lake) / "_checkpoints" / "erasures-under-way").iterdir())


def test_an_erasure_killed_in_its_vacuum_after_a_restore_beside_it_is_counted_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An erasure whose deletes are done lets go of the batch locks for its VACUUM; a
    restore beside it re-applies it (it is under way). Killed after that, it was counted
    from the commits after its versions, the restore's DELETEs among them, which the
    restore's own audit row counts too (a diff review). It noted what its deletes did as
    they ended, and the run that finishes it counts that."""
    config, snapshot = snapshot_then_a_batch(spark, tmp_path)
    before = {t: n for t, n in user_rows(spark, config.lake, "u1").items() if n}
    with erasure_stalled(config.lake, "u1", tmp_path, point="vacuum") as process:
        assert sum(user_rows(spark, config.lake, "u1").values()) == 0
        restore_snapshot(SparkOnDemand(lambda: spark), config, snapshot.snapshot_id)
        kill_with_children(process)
    assert sum(user_rows(spark, config.lake, "u1").values()) == 0  # re-applied
    [restore_row] = read_table(spark, config.lake, "retention_audit").collect()
    assert sum(restore_row["rows_deleted"].values()) > 0

    report = enforce_retention(spark, config, RetentionRequest(erase_users=("u1",)))
    assert {t: n for t, n in report.rows_deleted.items() if n} == before


def test_a_table_the_log_writer_cannot_restore_goes_through_deltas_restore(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A table feature switched on since the snapshot (row tracking changes the protocol):
    that table is left to Delta's RESTORE, which starts the JVM; the others are not."""
    config, snapshot = snapshot_then_a_batch(spark, tmp_path)
    spark.sql(f"ALTER TABLE delta.`{config.lake}/sessions` "
              "SET TBLPROPERTIES ('delta.enableRowTracking' = 'true')")
    on_demand = SparkOnDemand(lambda: spark)
    restore_snapshot(on_demand, config, snapshot.snapshot_id)
    assert on_demand.started is spark
    history = spark.sql(f"DESCRIBE HISTORY delta.`{config.lake}/sessions` LIMIT 1").head()
    assert history is not None and history["engineInfo"].startswith("Apache-Spark")
    events = spark.sql(f"DESCRIBE HISTORY delta.`{config.lake}/events` LIMIT 1").head()
    assert events is not None and events["engineInfo"].startswith("sessionlake")
    assert_tables_at(spark, config.lake, snapshot.table_versions)


def snapshot_at(created: str, snapshot_id: str | None = None) -> Snapshot:
    """A catalog entry taken at ``created`` (an ISO time), for the expiry rules."""
    return Snapshot(snapshot_id=snapshot_id or created, created_at=created, name=None,
                    stream_id=None, epoch=None, last_batch_id=0)


#: Four snapshots, one a week (the newest the day before EXPIRY_NOW).
WEEKLY = [snapshot_at(f"2026-01-{day:02d}T00:00:00+00:00") for day in (7, 14, 21, 28)]
EXPIRY_NOW = datetime(2026, 1, 29, tzinfo=UTC)


@pytest.mark.parametrize(("max_age_days", "keep_last", "held", "expired"), [
    (None, None, (), []),                 # no rule: nothing expires
    (10, None, (), [7, 14]),              # older than 10 days (the 19th)
    (100, None, (), []),
    (1, None, (), [7, 14, 21]),           # the newest stays, however old
    (None, 2, (), [7, 14]),               # all but the two newest
    (None, 10, (), []),
    (10, 3, (), [7]),                     # older than 10 days, and not of the three newest
    (10, None, ("2026-01-07T00:00:00+00:00",), [14]),  # a cut-off restore needs the 7th
], ids=["no rule", "age", "age keeps all", "age keeps one", "count", "count keeps all",
        "both", "held"])
def test_the_expiry_rules(max_age_days: int | None, keep_last: int | None,
                          held: tuple[str, ...], expired: list[int]) -> None:
    chosen = snapshots_to_expire(WEEKLY, EXPIRY_NOW, max_age_days, keep_last,
                                 frozenset(held))
    assert [s.created.day for s in chosen] == expired


def test_expiry_removes_old_snapshots_and_keeps_what_a_cut_off_restore_needs(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = settings(tmp_path, "lake")
    land(Path(config.source or ""), 0)
    run(spark, config)
    now = datetime.now(UTC)
    old = [create_snapshot(None, config, now=now - timedelta(days=days))
           for days in (60, 50, 40)]
    recent = create_snapshot(None, config, now=now - timedelta(days=2))
    root = Path(snapshots_root(config.lake))
    # A cut-off snapshot's folder (no manifest) from long ago, and one being taken now.
    stale, fresh = (root / new_snapshot_id(when) for when in (now - timedelta(days=3), now))
    for folder in (stale, fresh):
        (folder / "checkpoint").mkdir(parents=True)
    # A restore to the oldest was cut off: that snapshot must stay until it is run again.
    marker = Path(config.checkpoint) / RESTORING_MARKER
    marker.write_text(json.dumps({"snapshot_id": old[0].snapshot_id}))

    expiry = expire_snapshots(None, config, max_age_days=30, keep_last=None)

    assert [s.snapshot_id for s in expiry.expired] == [s.snapshot_id for s in old[1:]]
    assert [s.snapshot_id for s in expiry.held] == [old[0].snapshot_id]
    assert [s.snapshot_id for s in list_snapshots(config.lake)] == [
        old[0].snapshot_id, recent.snapshot_id]
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [old[0].snapshot_id, recent.snapshot_id, fresh.name, ".catalog.lock"])
    assert expiry.leftovers == (stale.name,)
    assert expiry.lines()[-1] == (
        f"2 snapshot(s) expired, 2 kept; VACUUM keeps the files the oldest, "
        f"{old[0].snapshot_id} (taken {old[0].created_at}), needs")

    # Once the restore is run again (which removes its marker: above), the next expiry takes
    # that snapshot too; the command line takes a new one first, kept as the newest.
    marker.unlink()
    monkeypatch.setattr("sessionlake.cli._spark",
                        lambda *args, **kwargs: pytest.fail("Spark was started"))
    assert main(["snapshot", "--lake", config.lake, "--keep-last", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    [newest] = list_snapshots(config.lake)
    assert out[1] == f"snapshot {newest.snapshot_id}"
    assert [line.split()[1] for line in out if line.startswith("expired ")] == [
        old[0].snapshot_id, recent.snapshot_id]
    # Expiring alone: nothing left to expire, the one restore point stays.
    assert main(["snapshot", "--lake", config.lake, "--expire-only", "--max-age-days", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"0 snapshot(s) expired, 1 kept; VACUUM keeps the files the oldest, "
        f"{newest.snapshot_id} (taken {newest.created_at}), needs"]


def test_an_expiry_waits_for_a_restore_and_then_gives_up(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore holds the catalog from its first look to its end: an expiry in between
    would delete the copy of the checkpoint it is about to put in place."""
    config = settings(tmp_path, "lake")
    land(Path(config.source or ""), 0)
    run(spark, config)
    snapshot = create_snapshot(None, config, now=datetime.now(UTC) - timedelta(days=9))
    create_snapshot(None, config)
    monkeypatch.setattr("sessionlake.snapshots.EXPIRY_WAIT_S", 0.5)
    with batch_lock(Path(snapshots_root(config.lake)), lock_file=CATALOG_LOCK_FILE), \
            pytest.raises(SnapshotError, match=r"a restore held the snapshot catalog of .* "
                                               r"for 0.5 s: nothing expired"):
        expire_snapshots(None, config, max_age_days=1, keep_last=None)
    assert find_snapshot(config.lake, snapshot.snapshot_id)



@pytest.mark.parametrize("command", [
    ["snapshot"], ["restore", "--snapshot", "nightly", "--check-only"],
    ["restore", "--snapshot", "nightly"], ["rebuild-state"],
])
def test_a_misspelt_checkpoint_is_refused_before_anything_changes(
    spark: SparkSession, observed_lake: ObservedLake, tmp_path: Path, command: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A restore with a misspelt --checkpoint rolled the tables back and wrote the
    snapshot's checkpoint there; the stream's own went on from its later batch, whose
    records were never read again (a review). A snapshot with one kept no checkpoint."""
    lake = tmp_path / "lake"
    shutil.copytree(observed_lake.settings.lake, lake)
    typo = tmp_path / "chekpoint"
    before = {(p, p.stat().st_mtime_ns) for p in lake.rglob("*")}

    assert main([*command, "--lake", str(lake), "--checkpoint", str(typo)]) == 2
    assert capsys.readouterr().err == (
        f"sessionlake: error: no checkpoint at {typo}, and the lake's stream runs on "
        f"{lake}/_checkpoints/stream: give that (--checkpoint, SESSIONLAKE_CHECKPOINT), or "
        "move the checkpoint there first\n")
    assert {(p, p.stat().st_mtime_ns) for p in lake.rglob("*")} == before
    assert not typo.exists()


def test_the_list_of_a_lake_without_snapshots_says_so(
    spark: SparkSession, lake: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It printed nothing at all (a review)."""
    create_tables(spark, settings_from({"lake": lake}, env={}))
    assert main(["snapshot", "--lake", lake, "--list"]) == 0
    assert capsys.readouterr().out == (
        f"no snapshots of {lake}: `sessionlake snapshot` takes one\n")

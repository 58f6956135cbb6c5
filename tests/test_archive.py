"""Archiving read landing files: only what no restore point would read again moves.

The end-to-end case (a real stream, a snapshot, the archive, then restores that still end
as if nothing was restored) is in ``tests/test_snapshots.py``; these cases build the
checkpoints' logs by hand.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sessionlake.archive import (
    ArchiveError,
    ArchiveTargetError,
    archive_read_files,
    warn_of_read_files_left,
)
from sessionlake.checkpoint import (
    FORGET_REQUEST,
    MANIFEST,
    RESTORING_MARKER,
    SOURCE_LOG,
    files_read,
    first_logged_file,
    unread_input,
)
from sessionlake.cli import main
from sessionlake.config import Settings, settings_from
from sessionlake.registry import register_stream
from sessionlake.snapshots import Snapshot
from sessionlake.stream import RunSummary, run_stream
from sessionlake.tables import read_table
from tests.helpers import NOW, event, held_by_another_process, write_source_log

#: How often Spark's file source compacts its log (every tenth batch by default).
COMPACT_INTERVAL = "spark.sql.streaming.fileSource.log.compactInterval"


def settings(tmp_path: Path, source: str | None = None) -> Settings:
    return settings_from({"lake": str(tmp_path / "lake"),
                          "source": source or str(tmp_path / "landing")}, env={})


def landing_with(tmp_path: Path, *names: str) -> Path:
    """Files under the landing folder, each a line, with their checkpoint having read them
    in one committed batch."""
    landing = tmp_path / "landing"
    for name in names:
        (landing / name).parent.mkdir(parents=True, exist_ok=True)
        (landing / name).write_text('{"user_id": "u"}\n')
        os.utime(landing / name, (1_700_000_000, 1_700_000_000))
    write_source_log(tmp_path / "lake" / "_checkpoints" / "stream",
                     {"0": [(str(landing / n), 0) for n in names]}, 0)
    return landing


def snapshot_of(tmp_path: Path, snapshot_id: str, read: list[Path] | None) -> None:
    """A catalog entry, with a checkpoint copy that read ``read`` (``None``: no copy)."""
    folder = tmp_path / "lake" / "_snapshots" / snapshot_id
    folder.mkdir(parents=True)
    entry = Snapshot(snapshot_id, "2026-01-05T00:00:00+00:00", None, None, None,
                     last_batch_id=0 if read is not None else -1,
                     has_checkpoint=read is not None)
    (folder / MANIFEST).write_text(json.dumps(asdict(entry)))
    if read is not None:
        write_source_log(folder / "checkpoint", {"0": [(str(p), 0) for p in read]}, 0)


def test_read_files_move_with_their_paths_and_times(tmp_path: Path) -> None:
    landing = landing_with(tmp_path, "2026/01/05/a.jsonl", "b.jsonl")
    (landing / "unread.jsonl").write_text("{}\n")
    report = archive_read_files(settings(tmp_path), str(tmp_path / "archive"))
    assert (report.moved, report.kept_for_snapshots) == (2, 0)
    assert sorted(p.name for p in landing.rglob("*") if p.is_file()) == ["unread.jsonl"]
    moved = tmp_path / "archive" / "2026" / "01" / "05" / "a.jsonl"
    assert moved.read_text() == '{"user_id": "u"}\n'
    assert moved.stat().st_mtime == 1_700_000_000


def test_files_read_through_a_link_out_of_the_landing_folder_stay_where_they_are(
    tmp_path: Path,
) -> None:
    """Spark reads through symbolic links, and its log names a file by the path it read:
    moving landing/sub/f where sub leads to another folder (the lake's ``_delta_log``, say)
    would empty that folder. Before, it did."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "landing").mkdir()
    (tmp_path / "landing" / "sub").symlink_to(outside)
    landing_with(tmp_path, "a.jsonl", "sub/notes.jsonl")
    report = archive_read_files(settings(tmp_path), str(tmp_path / "archive"))
    assert (outside / "notes.jsonl").exists()
    assert (report.moved, report.leading_out) == (1, ("sub/notes.jsonl",))
    assert sorted(p.name for p in (tmp_path / "archive").rglob("*")) == ["a.jsonl"]
    assert ("1 read file(s) left, a symbolic link leads them out of the landing folder: "
            "sub/notes.jsonl") in report.summary()


@pytest.mark.parametrize("dry_run", [True, False])
def test_files_changed_after_they_were_read_are_named(tmp_path: Path, dry_run: bool) -> None:
    """Spark read each file once, as it was then: lines added later were never read, and
    the archive says so for the files it moves (they keep those lines in the archive)."""
    landing = landing_with(tmp_path, "a.jsonl", "b.jsonl", "2026/c.jsonl")
    for name in ("a.jsonl", "2026/c.jsonl"):
        with (landing / name).open("a") as appended:
            appended.write('{"user_id": "late"}\n')
        os.utime(landing / name, (1_700_000_060, 1_700_000_060))
    report = archive_read_files(settings(tmp_path), str(tmp_path / "archive"), dry_run=dry_run)
    assert (report.moved, report.changed_after_read) == (3, ("2026/c.jsonl", "a.jsonl"))
    assert ("; 2 of them changed after the stream read them, and what was added later was "
            "never read: 2026/c.jsonl, a.jsonl") in report.summary()


def test_a_dry_run_moves_nothing(tmp_path: Path) -> None:
    landing = landing_with(tmp_path, "a.jsonl")
    report = archive_read_files(settings(tmp_path), str(tmp_path / "archive"), dry_run=True)
    assert (report.moved, report.dry_run) == (1, True)
    assert (landing / "a.jsonl").exists() and not (tmp_path / "archive").exists()


@pytest.mark.parametrize(("snapshot_read", "moved", "kept"), [
    (["a.jsonl"], 1, 1),
    (None, 0, 2),  # a snapshot taken before any batch: a restore to it reads every file
])
def test_files_a_snapshot_has_not_read_stay(
    tmp_path: Path, snapshot_read: list[str] | None, moved: int, kept: int
) -> None:
    landing = landing_with(tmp_path, "a.jsonl", "b.jsonl")
    snapshot_of(tmp_path, "s1",
                None if snapshot_read is None else [landing / n for n in snapshot_read])
    report = archive_read_files(settings(tmp_path), str(tmp_path / "archive"))
    assert (report.moved, report.kept_for_snapshots) == (moved, kept)


def test_a_move_cut_off_is_finished_and_a_clash_is_left(tmp_path: Path) -> None:
    landing = landing_with(tmp_path, "a.jsonl", "b.jsonl", "c.jsonl")
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "a.jsonl").write_text('{"user_id": "u"}\n')  # copied, not yet deleted
    (archive / "b.jsonl").write_text("another file\n")
    (archive / "c.jsonl").write_text('{"user_id": "v"}\n')  # another file of the same size
    report = archive_read_files(settings(tmp_path), str(archive))
    assert report.moved == 1
    assert not (landing / "a.jsonl").exists()
    assert (landing / "b.jsonl").exists() and (archive / "b.jsonl").read_text() == "another file\n"
    assert (landing / "c.jsonl").read_text() == '{"user_id": "u"}\n'


@pytest.mark.parametrize(("source", "target", "message"), [
    ("kafka", "archive", "Kafka"),
    ("{landing}/*.jsonl", "archive", "glob"),
    ("{landing}", "landing/old", "inside the landing folder"),
    ("{landing}", "landing", "inside the landing folder"),
    ("{landing}", "lake/_archive", "inside the lake"),
    ("s3a://bucket/landing", "archive", "not on this machine"),
    ("{tmp}/nowhere", "archive", "does not exist"),
])
def test_bad_requests_are_refused_and_nothing_moves(
    tmp_path: Path, source: str, target: str, message: str
) -> None:
    landing = landing_with(tmp_path, "a.jsonl")
    config = settings(tmp_path, source.format(landing=landing, tmp=tmp_path))
    with pytest.raises(ArchiveError, match=message):
        archive_read_files(config, str(tmp_path / target))
    assert (landing / "a.jsonl").exists()


@pytest.mark.parametrize("target", ["a-file", "a-file/below", ""])
@pytest.mark.parametrize("dry_run", [True, False])
def test_a_target_that_is_no_folder_is_refused_and_nothing_moves(
    tmp_path: Path, target: str, dry_run: bool
) -> None:
    """A file as the target: the dry run said it would move the files, and the run failed
    with a stack trace; an empty one archived to the working folder (a review)."""
    landing = landing_with(tmp_path, "a.jsonl")
    (tmp_path / "a-file").write_text("not a folder\n")
    where = str(tmp_path / target) if target else ""
    with pytest.raises(ArchiveTargetError, match=r"is not a folder|is empty"):
        archive_read_files(settings(tmp_path), where, dry_run=dry_run)
    assert (landing / "a.jsonl").exists()
    assert not list((tmp_path / "lake").rglob("archived.json"))


def test_a_landing_folder_the_stream_does_not_read_is_refused(tmp_path: Path) -> None:
    """The archive of another folder moved nothing, without a word (a review)."""
    landing = landing_with(tmp_path, "a.jsonl")
    config = settings(tmp_path)
    register_stream(None, config.lake, config.checkpoint, source=str(landing))
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(ArchiveError, match=f"the stream on {config.checkpoint} reads "
                                           f"{landing}, not {tmp_path / 'elsewhere'}: give "):
        archive_read_files(settings(tmp_path, str(tmp_path / "elsewhere")),
                           str(tmp_path / "archive"))
    assert archive_read_files(config, str(tmp_path / "archive")).moved == 1


def test_a_snapshot_copy_whose_logs_cannot_be_read_moves_nothing(tmp_path: Path) -> None:
    landing = landing_with(tmp_path, "a.jsonl")
    snapshot_of(tmp_path, "s1", [landing / "a.jsonl"])
    offsets = tmp_path / "lake" / "_snapshots" / "s1" / "checkpoint" / "spark" / "offsets"
    (offsets / "0").unlink()
    with pytest.raises(ArchiveError, match="snapshot s1"):
        archive_read_files(settings(tmp_path), str(tmp_path / "archive"))
    assert (landing / "a.jsonl").exists()


def test_the_command_line_prints_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    landing = landing_with(tmp_path, "a.jsonl")
    snapshot_of(tmp_path, "s1", None)
    argv = ["archive", "--lake", str(tmp_path / "lake"), "--source", str(landing),
            "--to", str(tmp_path / "archive")]
    assert main([*argv, "--dry-run"]) == 0
    assert capsys.readouterr().out == (
        f"would move 0 file(s), 0 bytes, to {tmp_path / 'archive'}; 1 read file(s) kept in "
        "the landing folder: a snapshot had not read them, and a restore to it reads them "
        "again\n")


@pytest.mark.parametrize(("at_least", "warned"), [(2, True), (3, False)])
def test_a_run_says_when_read_files_pile_up_in_the_landing_folder(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, at_least: int, warned: bool
) -> None:
    landing = landing_with(tmp_path, "a.jsonl", "2026/01/05/b.jsonl")
    config = settings(tmp_path)
    unread = unread_input(str(landing), config.checkpoint)
    assert unread is not None and (unread.files, unread.read_left) == (0, 2)
    warn_of_read_files_left(unread, str(landing), at_least)
    assert ("2 files the stream has read are still in the landing folder" in caplog.text) \
        is warned


def compacted(tmp_path: Path) -> tuple[Path, Path]:
    """A landing folder whose checkpoint's newest compacted entry lists a and c (batch 0)
    and b (batch 1), both batches committed, and whose entry 2 lists d, of batch 2, not
    committed; c was then deleted by hand. The compacted entry has Hadoop's checksum."""
    landing = tmp_path / "landing"
    landing.mkdir()
    for name in ("a.jsonl", "b.jsonl", "d.jsonl"):
        (landing / name).write_text('{"user_id": "u"}\n')
    spark_checkpoint = tmp_path / "lake" / "_checkpoints" / "stream"
    write_source_log(spark_checkpoint, {
        "1.compact": [(str(landing / n), b) for n, b in [("a.jsonl", 0), ("c.jsonl", 0),
                                                          ("b.jsonl", 1)]],
        "2": [(str(landing / "d.jsonl"), 2)]}, committed=1, offsets={0: 0, 1: 1, 2: 2})
    log = spark_checkpoint / "spark" / "sources" / "0"
    (log / ".1.compact.crc").write_bytes(b"crc")
    return landing, log


def test_the_source_log_forgets_the_files_archived_and_only_those(tmp_path: Path) -> None:
    """a and b are forgotten; c, gone but not archived, and d, of a batch not committed,
    stay: a file merely missing would be read again as new if it came back."""
    landing, log = compacted(tmp_path)
    before = (log / "1.compact").read_text()
    report = archive_read_files(settings(tmp_path), str(tmp_path / "archive"))
    assert report.moved == 2 and report.log_trim is not None
    assert (report.log_trim.entry, report.log_trim.dropped, report.log_trim.kept) == (
        "1.compact", 2, 1)
    after = (log / "1.compact").read_text()
    assert after.splitlines() == [before.splitlines()[0], before.splitlines()[2]]
    assert len(after.encode()) == report.log_trim.bytes_after < report.log_trim.bytes_before
    assert not (log / ".1.compact.crc").exists()
    assert (log / "2").read_text().count("d.jsonl") == 1
    unread = unread_input(str(landing), settings(tmp_path).checkpoint)
    assert unread is not None and unread.log_bytes == len(after.encode()) + (
        log / "2").stat().st_size  # what each run reads back now
    assert files_read(tmp_path / "lake" / "_checkpoints" / "stream" / "spark") == {
        str(landing / "c.jsonl")}
    assert report.summary().endswith(
        f"; the checkpoint's source log forgot 2 archived file(s) (1.compact: "
        f"{len(before.encode())} -> {len(after.encode())} bytes)")
    again = archive_read_files(settings(tmp_path), str(tmp_path / "archive"))
    assert (again.moved, again.log_trim and again.log_trim.dropped) == (0, 0)


def test_a_dry_run_says_what_the_source_log_would_forget(tmp_path: Path) -> None:
    """What earlier archives moved while a stream ran, and the log still lists."""
    _, log = compacted(tmp_path)
    config, target = settings(tmp_path), str(tmp_path / "archive")
    nothing_yet = archive_read_files(config, target, dry_run=True).log_trim
    assert nothing_yet is not None and nothing_yet.dropped == 0
    with held_by_another_process("stream_locks", config.lake, config.checkpoint):
        archive_read_files(config, target)
    before = (log / "1.compact").read_text()
    report = archive_read_files(config, target, dry_run=True)
    assert report.log_trim is not None and report.log_trim.dropped == 2
    assert report.summary().endswith(
        f"; the checkpoint's source log would forget 2 archived file(s) (1.compact: "
        f"{len(before.encode())} -> {report.log_trim.bytes_after} bytes)")
    assert (log / "1.compact").read_text() == before and (log / ".1.compact.crc").exists()


@pytest.mark.parametrize("blocker", ["stream", "restore"])
def test_the_source_log_waits_for_no_stream_and_a_finished_restore(
    tmp_path: Path, blocker: str
) -> None:
    """The files move all the same; the next archive, with nothing in the way, forgets."""
    _, log = compacted(tmp_path)
    before = (log / "1.compact").read_text()
    config = settings(tmp_path)
    if blocker == "stream":
        with held_by_another_process("stream_locks", config.lake, config.checkpoint):
            report = archive_read_files(config, str(tmp_path / "archive"))
        why = "a stream is running"
    else:
        marker = Path(config.checkpoint) / RESTORING_MARKER
        marker.write_text('{"snapshot_id": "s1"}')
        report = archive_read_files(config, str(tmp_path / "archive"))
        marker.unlink()
        why = "a restore of the checkpoint did not finish"
    assert (report.moved, report.log_trim, report.log_trim_skipped) == (2, None, why)
    assert (log / "1.compact").read_text() == before
    assert report.summary().endswith(
        f"; the checkpoint's source log still lists the archived files ({why}): a "
        "continuous stream forgets them between two batches, any stream at its next start, "
        "or the next archive while none runs")
    request = Path(config.checkpoint) / FORGET_REQUEST
    assert request.exists() == (blocker == "stream")  # the running stream is asked
    later = archive_read_files(config, str(tmp_path / "archive"))
    assert later.log_trim is not None and later.log_trim.dropped == 2
    assert not request.exists()


def test_the_source_log_keeps_one_line_to_name_the_folder_read(tmp_path: Path) -> None:
    landing = landing_with(tmp_path, "a.jsonl", "b.jsonl")
    log = tmp_path / "lake" / "_checkpoints" / "stream" / "spark" / "sources" / "0"
    (log / "0").rename(log / "0.compact")
    report = archive_read_files(settings(tmp_path), str(tmp_path / "archive"))
    assert report.log_trim is not None and (report.log_trim.dropped, report.log_trim.kept) == (
        1, 1)
    assert first_logged_file((log / "0.compact").read_text()) == str(landing / "b.jsonl")


def test_a_stream_reads_on_after_its_source_log_forgot_the_files_archived(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Real Spark, compacting its source log every second batch: after the stream's start
    or the archive trims the compacted entry, the stream reads the new files once each,
    the archived ones never again, and compacts on from the trimmed entry."""
    config = settings_from({"lake": str(tmp_path / "lake"), "source": str(tmp_path / "landing"),
                            "max_files_per_trigger": 1}, env={})
    landing, log = Path(config.source or ""), Path(config.checkpoint) / SOURCE_LOG

    def land(*indexes: int) -> None:
        landing.mkdir(exist_ok=True)
        for index in indexes:
            path = landing / f"part-{index}.jsonl"
            path.write_text(event(f"u{index}", f"10:{index:02d}", "/") + "\n")
            os.utime(path, (1_700_000_000 + 60 * index,) * 2)

    def run() -> list[int]:
        return [m["input_records"] for m in run_stream(spark, config, clock=lambda: NOW).processed]

    spark.conf.set(COMPACT_INTERVAL, "2")
    try:
        land(0, 1, 2, 3)
        assert run() == [1, 1, 1, 1]  # batches 0-3; 1 and 3 compacted
        with held_by_another_process("stream_locks", config.lake, config.checkpoint):
            first = archive_read_files(config, str(tmp_path / "archive"))
        assert (first.moved, first.log_trim_skipped) == (4, "a stream is running")
        assert len((log / "3.compact").read_text().splitlines()) == 1 + 4
        land(4, 5)
        assert run() == [1, 1]  # its start forgot 3 of 4; 5 compacted from the trimmed entry
        assert len((log / "5.compact").read_text().splitlines()) == 1 + 3
        assert run() == []  # its start forgets the line kept of part 3: 4 and 5 remain
        assert len((log / "5.compact").read_text().splitlines()) == 1 + 2
        second = archive_read_files(config, str(tmp_path / "archive"))
        assert second.log_trim is not None  # one line stays, naming the folder read
        assert (second.moved, second.log_trim.entry, second.log_trim.dropped) == (
            2, "5.compact", 1)
        land(6)
        assert run() == [1]
    finally:
        spark.conf.unset(COMPACT_INTERVAL)
    events = read_table(spark, config.lake, "events")
    assert sorted(r.user_id for r in events.collect()) == [f"u{i}" for i in range(7)]


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


def test_a_continuous_stream_forgets_the_files_archived_while_it_runs(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An archive beside a continuous stream asks it to forget: the stream starts its query
    anew between two batches on the trimmed log, then reads each new file once, the
    archived ones never again, and compacts on from the trimmed entry."""
    config = settings_from({"lake": str(tmp_path / "lake"), "source": str(tmp_path / "landing"),
                            "max_files_per_trigger": 1, "trigger": "continuous",
                            "processing_interval": "1s"}, env={})
    landing, checkpoint = Path(config.source or ""), Path(config.checkpoint)
    log, commits = checkpoint / SOURCE_LOG, checkpoint / "spark" / "commits"
    landing.mkdir()

    def land(*indexes: int) -> None:
        for index in indexes:
            path = landing / f"part-{index}.jsonl"
            path.write_text(event(f"u{index}", f"10:{index:02d}", "/") + "\n")
            os.utime(path, (1_700_000_000 + 60 * index,) * 2)

    def lines(entry: str) -> int:
        return len((log / entry).read_text().splitlines()) if (log / entry).exists() else 0

    runs: list[RunSummary | BaseException] = []

    def run() -> None:
        try:
            runs.append(run_stream(spark, config, clock=lambda: NOW))
        except BaseException as error:  # handed to the test's thread
            runs.append(error)

    spark.conf.set(COMPACT_INTERVAL, "2")
    stream = threading.Thread(target=run, daemon=True)
    try:
        land(0, 1, 2, 3)
        stream.start()
        _wait_until(lambda: (commits / "3").exists() or bool(runs), "batches 0-3 committed")
        report = archive_read_files(config, str(tmp_path / "archive"))
        assert (report.moved, report.log_trim_skipped) == (4, "a stream is running")
        _wait_until(lambda: lines("3.compact") == 1 + 1 or bool(runs), "3.compact trimmed")
        assert not (checkpoint / FORGET_REQUEST).exists()
        land(4, 5)
        _wait_until(lambda: (commits / "5").exists() or bool(runs), "batches 4-5 committed")
        assert lines("5.compact") == 1 + 3  # compacted on from the trimmed entry
        (query,) = spark.streams.active
        _wait_until(lambda: not query.status["isTriggerActive"], "a quiet moment")
        query.stop()
        stream.join(60)
    finally:
        spark.conf.unset(COMPACT_INTERVAL)
        for query in spark.streams.active:
            query.stop()
    assert len(runs) == 1 and isinstance(runs[0], RunSummary), runs
    assert [m["input_records"] for m in runs[0].processed] == [1] * 6
    events = read_table(spark, config.lake, "events")
    assert sorted(r.user_id for r in events.collect()) == [f"u{i}" for i in range(6)]

"""Archiving read landing files: only what no restore point would read again moves.

The end-to-end case (a real stream, a snapshot, the archive, then restores that still end
as if nothing was restored) is in ``tests/test_snapshots.py``; these cases build the
checkpoints' logs by hand.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import pytest

from sessionlake.archive import ArchiveError, archive_read_files, warn_of_read_files_left
from sessionlake.checkpoint import MANIFEST, UnreadInput, unread_input
from sessionlake.cli import main
from sessionlake.config import Settings, settings_from
from sessionlake.snapshots import Snapshot
from tests.helpers import write_source_log


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
    landing = landing_with(tmp_path, "a.jsonl", "b.jsonl")
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / "a.jsonl").write_text('{"user_id": "u"}\n')  # copied, not yet deleted
    (archive / "b.jsonl").write_text("another file\n")
    report = archive_read_files(settings(tmp_path), str(archive))
    assert report.moved == 1
    assert not (landing / "a.jsonl").exists()
    assert (landing / "b.jsonl").exists() and (archive / "b.jsonl").read_text() == "another file\n"


@pytest.mark.parametrize(("source", "target", "message"), [
    ("kafka", "archive", "Kafka"),
    ("{landing}/*.jsonl", "archive", "glob"),
    ("{landing}", "landing/old", "inside the landing folder"),
    ("{landing}", "landing", "inside the landing folder"),
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
    assert unread == UnreadInput(0, files=0, read_left=2)
    warn_of_read_files_left(unread, str(landing), at_least)
    assert ("2 files the stream has read are still in the landing folder" in caplog.text) \
        is warned

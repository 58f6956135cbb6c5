"""What a checkpoint says without Spark: which landed files a run would still read."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sessionlake.checkpoint import (
    LANDING_NOTE,
    SOURCE_LOG,
    UnreadInput,
    batch_files,
    changed_since_read,
    files_read,
    local_file,
    logged_after,
    unread_input,
    warn_of_files_in_no_order,
)
from sessionlake.config import settings_from
from sessionlake.stream import run_stream
from tests.helpers import NOW, event, write_source_log


def _land(folder: Path, name: str, users: list[str], minute: int) -> Path:
    """A jsonl file of one event per user, given a modification time ``minute`` minutes
    after the previous ones (Spark's file source takes files oldest first)."""
    path = folder / name
    path.write_text("".join(event(user, "10:00") + "\n" for user in users))
    os.utime(path, (1_700_000_000 + 60 * minute, 1_700_000_000 + 60 * minute))
    return path


def sized(source: str, checkpoint: str) -> UnreadInput | None:
    """:func:`unread_input` without the source log's size (asserted on its own)."""
    unread = unread_input(source, checkpoint)
    return None if unread is None else replace(unread, log_bytes=0)


def test_a_real_checkpoint_counts_new_files_and_uncommitted_batches(
    spark: SparkSession, tmp_path: Path
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    first = _land(landing, "a.jsonl", ["u1", "u2"], 0)
    second = _land(landing, "b.jsonl", ["u3"], 1)
    settings = settings_from({"lake": str(tmp_path / "lake"), "source": str(landing),
                              "max_files_per_trigger": 1}, env={})
    assert sized(str(landing), settings.checkpoint) == UnreadInput(
        first.stat().st_size + second.stat().st_size, files=2)  # no checkpoint yet
    assert len(run_stream(spark, settings, clock=lambda: NOW).processed) == 2
    assert files_read(Path(settings.checkpoint) / "spark") == {str(first), str(second)}
    log, unread = Path(settings.checkpoint) / SOURCE_LOG, unread_input(str(landing),
                                                                      settings.checkpoint)
    assert unread is not None  # what each run reads back: both entries of the log
    assert unread.log_bytes == sum((log / entry).stat().st_size for entry in ("0", "1"))
    assert sized(str(landing), settings.checkpoint) == UnreadInput(0, 0, read_left=2)

    third = _land(landing, "c.jsonl", ["u4", "u5", "u6"], 2)
    (landing / ".c.jsonl.crc").write_text("hidden")  # Spark skips these; so does the count
    (landing / "_SUCCESS").write_text("")
    only_third = UnreadInput(third.stat().st_size, files=1, read_left=2)
    assert sized(str(landing), settings.checkpoint) == only_third
    assert sized(f"file://{landing}", f"file://{settings.checkpoint}") == only_third

    # A batch planned but not committed (a crash before its commit) is read again.
    (Path(settings.checkpoint) / "spark" / "commits" / "1").unlink()
    assert sized(str(landing), settings.checkpoint) == UnreadInput(
        second.stat().st_size + third.stat().st_size, files=2, read_left=1)


@pytest.mark.parametrize(("noted", "counted"), [
    (None, {"top.jsonl", "2026/01/05/deep.jsonl", "dt=2026-01-05/part.jsonl"}),  # new stream
    ({"subfolders": True}, {"top.jsonl", "2026/01/05/deep.jsonl", "dt=2026-01-05/part.jsonl"}),
    ("older stream", {"top.jsonl", "dt=2026-01-05/part.jsonl"}),
])
def test_the_unread_files_are_those_the_stream_would_list(
    tmp_path: Path, noted: dict[str, bool] | str | None, counted: set[str]
) -> None:
    """Subfolders count for a stream that reads them; hidden files never."""
    landing, checkpoint = tmp_path / "landing", tmp_path / "cp"
    for name, size in (("top.jsonl", 3), ("2026/01/05/deep.jsonl", 5),
                       ("dt=2026-01-05/part.jsonl", 7), ("_archive/old.jsonl", 11)):
        (landing / name).parent.mkdir(parents=True, exist_ok=True)
        (landing / name).write_text("x" * size)
    write_source_log(checkpoint, {"0": [("/elsewhere/read.jsonl", 0)]} if noted else {}, 0)
    if isinstance(noted, dict):
        (checkpoint / LANDING_NOTE).write_text(json.dumps(noted))
    unread = sized(str(landing), str(checkpoint))
    sizes = {"top.jsonl": 3, "2026/01/05/deep.jsonl": 5, "dt=2026-01-05/part.jsonl": 7}
    assert unread == UnreadInput(sum(sizes[n] for n in counted), files=len(counted))


#: A driver stopped after the file source listed b (entry 1) but before it planned batch 1:
#: the next run's batch 1 reads b with what it listed itself (entry 2, c).
LISTED_BEFORE_A_STOP = ({"0": [("/l/a", 0)], "1": [("/l/b", 1)], "2": [("/l/c", 2)]},
                        {0: 0, 1: 2})


@pytest.mark.parametrize(("batch_id", "files"), [
    (1, ["/l/a", "/l/b"]), (9, ["/l/c"]), (10, []), (11, None),  # 9's entry is compacted
])
def test_a_batch_s_files_are_found_in_the_source_log(
    tmp_path: Path, batch_id: int, files: list[str] | None
) -> None:
    write_source_log(tmp_path, {"1": [("/l/a", 1), ("/l/b", 1)],
                                "9.compact": [("/l/a", 1), ("/l/b", 1), ("/l/c", 9)], "10": []}, 10)
    found = batch_files(None, str(tmp_path), batch_id)
    assert files == (None if found is None else [file.path for file in found])


@pytest.mark.parametrize(("batch_id", "files"), [(0, 1), (1, 2), (2, None)])
def test_a_batch_s_files_are_those_of_the_source_log_entries_its_offset_spans(
    tmp_path: Path, batch_id: int, files: int | None
) -> None:
    entries, offsets = LISTED_BEFORE_A_STOP
    write_source_log(tmp_path, entries, 1, offsets)
    found = batch_files(None, str(tmp_path), batch_id)
    assert files == (None if found is None else len(found))


@pytest.mark.parametrize(("entries", "committed", "read"), [
    ({}, -1, set()),
    ({"0": [("/l/a", 0)], "1": [("/l/b", 1)]}, 0, {"/l/a"}),
    # The newest compact entry lists every file up to it; older entries may be gone.
    ({"8": [("/l/i", 8)], "9.compact": [("/l/a", 0), ("/l/j", 9)], "10": [("/l/k", 10)]},
     10, {"/l/a", "/l/j", "/l/k"}),
    ({"19.compact": [("/l/a%20b", 3)], "20": [("/l/c", 20)]}, 19, {"/l/a b"}),
    # Batch 1 read entries 1 and 2 (LISTED_BEFORE_A_STOP).
    (LISTED_BEFORE_A_STOP[0], 1, {"/l/a", "/l/b", "/l/c"}),
])
def test_files_read_follow_spark_s_source_log(
    tmp_path: Path, entries: dict[str, list[tuple[str, int]]], committed: int, read: set[str]
) -> None:
    offsets = LISTED_BEFORE_A_STOP[1] if entries is LISTED_BEFORE_A_STOP[0] else None
    write_source_log(tmp_path, entries, committed, offsets)
    assert files_read(tmp_path / "spark") == read


@pytest.mark.parametrize(("uri", "path"), [
    ("file:///l/a.json", "/l/a.json"),
    ("file:/l/a.json", "/l/a.json"),            # Hadoop's short form
    ("file:///l/a%20b%25.json", "/l/a b%.json"),  # special characters are %-escaped
    ("file://host/l/a.json", "/l/a.json"),
    ("s3a://bucket/l/a%20b.json", "/l/a b.json"),
])
def test_a_logged_uri_gives_the_path_spark_read(uri: str, path: str) -> None:
    assert local_file(uri) == path
    text = "v1\n" + json.dumps({"path": uri, "timestamp": 5, "batchId": 2}) + "\n\n"
    # The URI is kept as written too: the batch's records name their file by it.
    assert [tuple(f) for f in logged_after(text, -1)] == [(path, 2, 5, uri)]


@pytest.mark.parametrize(("batch_id", "batches"), [(-1, [0, 0, 1, 2, 3]), (1, [2, 3]),
                                                   (3, [])])
@pytest.mark.parametrize("end", ["", "\n"])
def test_an_entry_s_newest_batches_are_read_from_its_end(
    batch_id: int, batches: list[int], end: str
) -> None:
    text = "v1" + "".join(
        "\n" + json.dumps({"path": f"file:///l/{n}", "timestamp": n, "batchId": b})
        for n, b in enumerate([0, 0, 1, 2, 3])) + end
    assert [f.batch_id for f in logged_after(text, batch_id)] == batches


def test_a_changed_file_is_looked_for_among_the_newest_batches_of_a_compacted_entry(
    tmp_path: Path
) -> None:
    """Both files changed since they were listed; only the one of a newest batch is named
    (a run does not stat every file ever read)."""
    old, new = tmp_path / "old.jsonl", tmp_path / "new.jsonl"
    write_source_log(tmp_path / "cp", {"9.compact": [(str(old), 0), (str(new), 9)]}, 9)
    for path in (old, new):
        path.write_text("{}\n")  # modified now, long after the log's time 0
    assert changed_since_read(tmp_path / "cp" / "spark") == [new]


@pytest.mark.parametrize(("source", "checkpoint"), [
    ("kafka", "/c"),
    ("/landing/*.jsonl", "/c"),
    ("s3a://bucket/landing", "/c"),
    ("/landing", "hdfs://nn/c"),
    ("", "/c"),
])
def test_input_that_cannot_be_sized_here_is_unknown(source: str, checkpoint: str) -> None:
    assert unread_input(source, checkpoint) is None


@pytest.mark.parametrize("entry", ["not json", '{"timestamp": 0, "batchId": 0}'])
def test_a_source_log_spark_would_not_read_makes_the_size_unknown(
    tmp_path: Path, entry: str
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "a.jsonl").write_text("{}\n")
    write_source_log(tmp_path / "cp", {}, committed=0)
    (tmp_path / "cp" / "spark" / "sources" / "0" / "0").write_text(f"v1\n{entry}\n")
    assert unread_input(str(landing), str(tmp_path / "cp")) is None


@pytest.mark.parametrize(("minutes", "per_batch", "split"), [
    ([0, 0, 1], 1, 2),      # two files copied by a plain `cp`: no order between them
    ([0, 1, 2], 1, 0),      # written one after the other
    ([0, 0, 1], 2, 0),      # the two of one time are read in the same batch
    ([0, 1, 1, 2], 2, 2),   # ... and here in two
    ([0, 0, 0], None, 0),   # one batch of them all: their order does not matter
])
def test_files_sharing_a_modification_time_are_told_before_a_run_reads_them_in_batches(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, minutes: list[int],
    per_batch: int | None, split: int,
) -> None:
    landing = tmp_path / "landing"
    landing.mkdir()
    for n, minute in enumerate(minutes):
        _land(landing, f"part-{n}.jsonl", ["u"], minute)
    unread = unread_input(str(landing), str(tmp_path / "cp"))
    assert unread is not None
    with caplog.at_level(logging.WARNING, logger="sessionlake.checkpoint"):
        warn_of_files_in_no_order(unread, str(landing), per_batch)
    told = f"{split} of the {len(minutes)} files to read in {landing} share their " \
           "modification time with another that falls in another batch"
    assert (told in caplog.text) == (split > 0), caplog.text
    assert ("`cp -p`" in caplog.text) == (split > 0)


@pytest.mark.parametrize(("files", "per_batch", "batches"), [
    (0, None, 0), (0, 1, 0), (1, None, 1), (10, None, 1), (10, 1, 10), (10, 3, 4), (9, 3, 3),
])
def test_an_available_now_run_makes_batches_of_its_files(
    files: int, per_batch: int | None, batches: int
) -> None:
    assert UnreadInput(bytes=100 * files, files=files).batches(per_batch) == batches

"""The streaming job end to end on files: batching, parallelism and restarts change nothing."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from sessionlake import cli, faults, stream
from sessionlake.checkpoint import (
    GAP_NOTE,
    LANDING_NOTE,
    LOCK_FILE,
    PID_FILE,
    lock_held,
    recorded_source_file,
)
from sessionlake.config import ConfigError, settings_from
from sessionlake.doctor import check_lake
from sessionlake.ledger import ClockSetBack
from sessionlake.locks import StreamAlreadyRunning, checkpoint_lock
from sessionlake.rebuild import rebuild_open_sessions
from sessionlake.registry import (
    lake_streams,
)
from sessionlake.sessionize import sessionize_events
from sessionlake.sources import ApacheAccessLogAdapter
from sessionlake.stream import (
    BatchUnfinishedElsewhere,
    _BatchInFlight,
    _stop_on_signals,
    run_stream,
)
from sessionlake.tables import STREAM_TABLES, read_table, table_version
from sessionlake.validation import apply_guards, valid_events
from tests.conftest import DATA
from tests.helpers import (
    NOW,
    SESSION_KEY,
    all_sessions,
    event,
    held_by_another_process,
    hm,
    lines_frame,
    rows,
)

pytestmark = pytest.mark.slow
LOG = DATA / "apache_access_2015_head3000.log"


def split_log(folder: Path, parts: int) -> list[Path]:
    """The real log slice cut into ``parts`` files, in order.

    Spark's file source takes files oldest first, so each file is given a modification
    time one minute after the previous one, as files landing over time would have.
    """
    lines = LOG.read_text().splitlines(keepends=True)
    size = -(-len(lines) // parts)
    folder.mkdir(parents=True, exist_ok=True)
    files = []
    for i in range(parts):
        path = folder / f"access-{i:02d}.log"
        path.write_text("".join(lines[i * size:(i + 1) * size]))
        os.utime(path, (1_700_000_000 + 60 * i, 1_700_000_000 + 60 * i))
        files.append(path)
    return files


def reference_sessions(spark: SparkSession, files: list[Path]) -> DataFrame:
    """Batch sessionization of the same lines: what every stream must end with."""
    frames = [lines_frame(spark, f.read_text().splitlines(), f.name) for f in files]
    lines = frames[0]
    for frame in frames[1:]:
        lines = lines.unionByName(frame)
    events = valid_events(apply_guards(ApacheAccessLogAdapter().parse(lines), NOW,
                                       timedelta(hours=1)))
    return sessionize_events(events, timedelta(minutes=30), timedelta(hours=24))


def run(spark: SparkSession, source: Path, lake: Path, **values: object) -> list[dict]:
    settings = settings_from(
        {"lake": str(lake), "source": str(source), "input_format": "apache"} | values, env={}
    )
    return run_stream(spark, settings, clock=lambda: NOW).processed


def test_real_log_gives_the_same_sessions_in_one_batch_or_many(
    spark: SparkSession, tmp_path: Path
) -> None:
    files = split_log(tmp_path / "landing", 4)
    one = run(spark, tmp_path / "landing", tmp_path / "one")
    many = run(spark, tmp_path / "landing", tmp_path / "many", max_files_per_trigger=1)
    assert (len(one), len(many)) == (1, 4)
    for lake in ("one", "many"):
        assert read_table(spark, str(tmp_path / lake), "late_events").count() == 0
        assert read_table(spark, str(tmp_path / lake), "quarantine").count() == 0
    expected = reference_sessions(spark, files).select("session_id", *SESSION_KEY)
    assertDataFrameEqual(all_sessions(spark, str(tmp_path / "one")).drop("distinct_pages"),
                         expected, checkRowOrder=False)
    assertDataFrameEqual(all_sessions(spark, str(tmp_path / "many")).drop("distinct_pages"),
                         expected, checkRowOrder=False)
    # Every accepted line is in events exactly once, and every event in one session.
    assert sum(m["accepted"] for m in many) == 3000
    assert read_table(spark, str(tmp_path / "many"), "events").count() == 3000


def test_copies_of_an_event_in_files_named_against_their_times_keep_the_first_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Copies of an event (same user, id and day) at other times, in files whose names do
    not follow when they landed: the copy kept is the first read, in one batch as in one
    file per batch. One batch kept the first by file name before (a review of 2026-12-07):
    another session start, id and entry page than one file per batch."""
    landing = tmp_path / "landing"
    landing.mkdir()
    (landing / "b.jsonl").write_text(event("k", "10:10", "/from_b", event_id="k1") + "\n")
    (landing / "a.jsonl").write_text("\n".join([
        event("k", "10:05", "/from_a", event_id="k1"), event("k", "10:20", "/k2", event_id="k2"),
    ]) + "\n")
    os.utime(landing / "b.jsonl", (1_700_000_000, 1_700_000_000))  # b landed first
    os.utime(landing / "a.jsonl", (1_700_000_060, 1_700_000_060))

    def run_into(lake: str, **values: object) -> list[dict]:
        return run_stream(spark, settings_from(
            {"lake": str(tmp_path / lake), "source": str(landing)} | values, env={}),
            clock=lambda: NOW).processed

    assert (len(run_into("one")), len(run_into("many", max_files_per_trigger=1))) == (1, 2)
    for lake in ("one", "many"):
        events = read_table(spark, str(tmp_path / lake), "events")
        assert rows(events, "event_id", "source_file", "page") == [
            ("k1", "b.jsonl", "/from_b"), ("k2", "a.jsonl", "/k2")], lake
    assertDataFrameEqual(all_sessions(spark, str(tmp_path / "one")),
                         all_sessions(spark, str(tmp_path / "many")))
    assert rows(read_table(spark, str(tmp_path / "one"), "open_sessions"),
                "session_start", "entry_page") == [(hm("10:10"), "/from_b")]


def test_restart_on_the_same_checkpoint_at_another_parallelism(
    spark: SparkSession, tmp_path: Path
) -> None:
    files = split_log(tmp_path / "all", 4)
    landing = tmp_path / "landing"
    landing.mkdir()
    for f in files[:2]:
        f.rename(landing / f.name)
    first = run(spark, landing, tmp_path / "lake", max_files_per_trigger=1)
    for f in files[2:]:
        f.rename(landing / f.name)
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "7")
    try:
        second = run(spark, landing, tmp_path / "lake", shuffle_partitions=7)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", str(previous))
    # The restart picked up only the new files, from the checkpoint.
    assert [m["batch_id"] for m in first + second] == [0, 1, 2]
    expected = reference_sessions(spark, [landing / f.name for f in files])
    assertDataFrameEqual(
        all_sessions(spark, str(tmp_path / "lake")).drop("distinct_pages"),
        expected.select("session_id", *SESSION_KEY), checkRowOrder=False,
    )


def test_a_moved_landing_folder_is_refused_and_its_old_path_still_serves(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Spark's checkpoint keeps absolute paths: a moved landing folder is refused, naming
    the folder the checkpoint knows, before a batch starts; a link there resumes the stream."""
    first, second = split_log(tmp_path / "all", 2)
    landing, moved, lake = tmp_path / "landing", tmp_path / "moved", tmp_path / "lake"
    landing.mkdir()
    first.rename(landing / first.name)
    assert len(run(spark, landing, lake)) == 1
    landing.rename(moved)
    second.rename(moved / second.name)
    for input_format in ("apache", "jsonl"):  # the folder is named first, whatever else differs
        with pytest.raises(ConfigError, match=f"read its files from {landing}, not from "
                                              f"--source {moved}"):
            run(spark, moved, lake, input_format=input_format)
    assert read_table(spark, str(lake), "batch_metrics").count() == 1
    landing.symlink_to(moved)
    assert [m["batch_id"] for m in run(spark, landing, lake)] == [1]
    expected = reference_sessions(spark, [moved / first.name, moved / second.name])
    assertDataFrameEqual(all_sessions(spark, str(lake)).drop("distinct_pages"),
                         expected.select("session_id", *SESSION_KEY), checkRowOrder=False)


@pytest.mark.parametrize(("entries", "expected"), [
    ({}, None),
    ({"0": ["/a/x0"]}, "/a/x0"),
    ({"9.compact": ["/a/x0", "/a/x9"], "10": ["/a/x10"], ".10.crc": []}, "/a/x10"),
    ({"19.compact": ["/a/x0", "/a/x19"], "18": ["/a/x18"]}, "/a/x18"),
    ({"19.compact": ["/a/x0", "/a/x%20y"]}, "/a/x0"),
    ({"19.compact": ["/a/x%20y"]}, "/a/x y"),
])
def test_the_recorded_source_file_is_the_newest_batchs_own(
    tmp_path: Path, entries: dict[str, list[str]], expected: str | None
) -> None:
    folder = tmp_path / "spark" / "sources" / "0"
    folder.mkdir(parents=True)
    for name, paths in entries.items():
        (folder / name).write_text("v1\n" + "".join(
            f'{{"path":"file://{p}","timestamp":0,"batchId":0}}\n' for p in paths))
    assert recorded_source_file(None, str(tmp_path)) == expected


def test_a_garbled_source_log_is_refused_in_one_line_before_a_batch(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Spark would fail on it too, after the run had started."""
    split_log(tmp_path / "landing", 1)
    run(spark, tmp_path / "landing", tmp_path / "lake")
    entry = tmp_path / "lake" / "_checkpoints" / "stream" / "spark" / "sources" / "0" / "0"
    entry.write_text('v1\n{"path":"file:///landing/a.js')
    argv = ["run", "--lake", str(tmp_path / "lake"), "--source", str(tmp_path / "landing"),
            "--format", "apache"]
    assert cli.main(argv) == cli.EXIT_USAGE
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith(f"sessionlake: error: the checkpoint's file source log entry {entry} "
                           "cannot be read")
    assert line.endswith("restore a snapshot (`sessionlake restore --snapshot ID`), which "
                         "brings the checkpoint back as it was")
    assert read_table(spark, str(tmp_path / "lake"), "batch_metrics").count() == 1


def test_a_run_with_nothing_new_changes_nothing(spark: SparkSession, tmp_path: Path) -> None:
    split_log(tmp_path / "landing", 1)
    run(spark, tmp_path / "landing", tmp_path / "lake")
    assert run(spark, tmp_path / "landing", tmp_path / "lake") == []


def test_a_symbolic_link_out_of_the_landing_folder_is_refused_before_it_is_read(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark follows links: one in the landing folder to a file elsewhere put that file's
    lines in quarantine, for anyone who queries the lake. A run is refused at its start,
    naming the link; a link made after the start refuses its batch before it reads
    anything, and a file put in its place, as the refusal says, lets the batch run."""
    first, second = split_log(tmp_path / "all", 2)
    landing, lake, secret = tmp_path / "landing", tmp_path / "lake", tmp_path / "secret.txt"
    landing.mkdir()
    first.rename(landing / first.name)
    secret.write_text("PASSWORD=hunter2\n")
    (landing / "link.log").symlink_to(secret)
    with pytest.raises(ConfigError, match=f"holds symbolic links leading out of it: "
                                          f"{landing / 'link.log'} -> {secret}"):
        run(spark, landing, lake)
    assert not lake.exists()  # no lake folder holding only a lock
    (landing / "link.log").unlink()
    assert len(run(spark, landing, lake)) == 1

    second.rename(landing / second.name)
    (landing / "link.log").symlink_to(secret)
    monkeypatch.setattr(stream, "check_no_links_out", lambda settings: None)  # made after
    with pytest.raises(ConfigError, match=f"batch 1 would read {landing / 'link.log'}, a "
                                          "symbolic link leading out of the landing folder"):
        run(spark, landing, lake)
    assert read_table(spark, str(lake), "batch_metrics").count() == 1
    (landing / "link.log").unlink()
    (landing / "link.log").write_text("")
    assert [m["batch_id"] for m in run(spark, landing, lake)] == [1]
    assert read_table(spark, str(lake), "quarantine").where("raw LIKE '%hunter2%'").count() == 0
    expected = reference_sessions(spark, [landing / first.name, landing / second.name])
    assertDataFrameEqual(all_sessions(spark, str(lake)).drop("distinct_pages"),
                         expected.select("session_id", *SESSION_KEY), checkRowOrder=False)


def test_a_file_swapped_for_a_link_after_the_check_stops_its_batch_before_it_writes(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check comes before the batch waits for its locks and reads: a file replaced by
    a link in between was read through it (the diff review). The batch looks again once
    it has read, and writes nothing; the next run reads the folder as it is then."""
    first, second = split_log(tmp_path / "all", 2)
    landing, lake, secret = tmp_path / "landing", tmp_path / "lake", tmp_path / "secret.txt"
    landing.mkdir()
    first.rename(landing / first.name)
    secret.write_text("PASSWORD=hunter2\n")
    check = stream.check_batch_stays_in_landing

    def then_swap(settings: Any, batch_id: int, files: Any) -> None:
        check(settings, batch_id, files)
        (landing / first.name).rename(tmp_path / first.name)  # kept aside
        (landing / first.name).symlink_to(secret)

    monkeypatch.setattr(stream, "check_batch_stays_in_landing", then_swap)
    with pytest.raises(ConfigError, match=f"batch 0: {landing / first.name} was replaced "
                                          "while the batch read it"):
        run(spark, landing, lake)
    assert read_table(spark, str(lake), "batch_metrics").count() == 0
    assert read_table(spark, str(lake), "quarantine").count() == 0
    monkeypatch.undo()
    (landing / first.name).unlink()
    (tmp_path / first.name).rename(landing / first.name)
    second.rename(landing / second.name)
    assert [m["batch_id"] for m in run(spark, landing, lake)] == [0, 1]  # 0 planned before
    assert read_table(spark, str(lake), "quarantine").count() == 0


def test_missing_source_folder_is_refused_before_anything_is_written(
    spark: SparkSession, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        run(spark, tmp_path / "nowhere", tmp_path / "lake")
    assert not (tmp_path / "lake").exists()


def test_generated_stream_equals_batch_sessionization_at_any_split_and_parallelism(
    spark: SparkSession, tmp_path: Path
) -> None:
    from sessionlake.generate import generate_clickstream
    from sessionlake.sources import JsonLinesAdapter

    landing = tmp_path / "landing"
    generated = generate_clickstream(landing, users=200, events=3000, files=6, seed=11)
    settings = {"input_format": "jsonl"}
    one = run(spark, landing, tmp_path / "one", **settings)
    previous = spark.conf.get("spark.sql.shuffle.partitions")
    spark.conf.set("spark.sql.shuffle.partitions", "5")
    try:
        many = run(spark, landing, tmp_path / "many", max_files_per_trigger=2, **settings)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", str(previous))
    assert (len(one), len(many)) == (1, 3)

    frames = [lines_frame(spark, f.read_text().splitlines(), f.name) for f in generated.files]
    lines = frames[0]
    for frame in frames[1:]:
        lines = lines.unionByName(frame)
    events = valid_events(apply_guards(JsonLinesAdapter().parse(lines), NOW, timedelta(hours=1)))
    expected = sessionize_events(events, timedelta(minutes=30), timedelta(hours=24)).select(
        "session_id", *SESSION_KEY
    )
    for lake in ("one", "many"):
        assert read_table(spark, str(tmp_path / lake), "late_events").count() == 0
        assertDataFrameEqual(all_sessions(spark, str(tmp_path / lake)).drop("distinct_pages"),
                             expected, checkRowOrder=False)


def test_a_second_run_on_a_held_checkpoint_is_refused_before_touching_the_lake(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two runs on one checkpoint would commit the same batch ids: the second must not start."""
    split_log(tmp_path / "landing", 1)
    settings = settings_from({"lake": str(tmp_path / "lake"),
                              "source": str(tmp_path / "landing")}, env={})
    with held_by_another_process("checkpoint_lock", settings.checkpoint) as holder:
        with pytest.raises(StreamAlreadyRunning, match=f"pid {holder.pid}"):
            run_stream(spark, settings)
        assert not (tmp_path / "lake" / "events").exists()
    assert not lock_held(Path(settings.checkpoint))  # the kernel let go with the process


def test_a_run_starting_while_a_reader_probes_its_lock_waits_the_probe_out(
    tmp_path: Path,
) -> None:
    """The health page, `doctor`, VACUUM's plan and the restart DAG ask whether a stream
    runs by taking its lock for a moment; a run starting in that moment must not be refused."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    with open(checkpoint / LOCK_FILE, "a+") as probe:
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)
        probe_ends = threading.Timer(0.2, fcntl.flock, (probe, fcntl.LOCK_UN))
        probe_ends.start()
        try:
            with checkpoint_lock(str(checkpoint)):
                assert (checkpoint / PID_FILE).read_text() == str(os.getpid())
                assert lock_held(checkpoint)
        finally:
            probe_ends.join()


@pytest.mark.parametrize(("rule", "flag", "value", "lake_s", "said"), [
    ("gap", "--gap", "30", "30m", "30s"),  # a bare number is seconds: a mistake on a 30m lake
    ("gap", "--gap", "45m", "30m", "45m"),
    ("gap", "--gap", "1800s", "30m", None),  # the same gap, spelled otherwise
    ("max_session_duration", "--max-session-duration", "1h", "1d", "1h"),
    ("max_session_duration", "--max-session-duration", "24h", "1d", None),
])
def test_a_run_with_other_session_rules_than_the_lake_s_is_refused_before_any_batch(
    spark: SparkSession, tmp_path: Path, rule: str, flag: str, value: str, lake_s: str,
    said: str | None,
) -> None:
    """Open sessions cut with one rule and extended with another match no batch
    sessionization (the review's: an open session of two hours cut in two at 1h, then
    the second piece extended at 24h); so does a rebuild of the state with another rule."""
    files = split_log(tmp_path / "landing", 2)
    files[1].rename(tmp_path / "later.log")
    lake = tmp_path / "lake"
    assert len(run(spark, tmp_path / "landing", lake)) == 1  # the defaults, 30m and 24h
    (tmp_path / "later.log").rename(files[1])
    versions = {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    if said is None:
        assert len(run(spark, tmp_path / "landing", lake, **{rule: value})) == 1
        return
    refusal = (f"the stream of lake {lake} cuts its sessions with {flag} {lake_s}; {flag} "
               rf"{said} would cut the rest otherwise\. Pass {flag} {lake_s} \(a number "
               r"without a unit is seconds\)")
    with pytest.raises(ConfigError, match=refusal):
        run(spark, tmp_path / "landing", lake, **{rule: value})
    with pytest.raises(ConfigError, match=refusal):
        rebuild_open_sessions(spark, settings_from({"lake": str(lake), rule: value}, env={}))
    assert versions == {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}


def test_a_checkpoint_without_its_last_batch_s_offsets_is_refused_naming_doctor(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A file of Spark's offset log deleted by hand: Spark would stop on an assertion of
    its own in a 50-line trace (the day-30 review); the run says which file, and that
    ``doctor`` says how to go on, before it reads anything."""
    split_log(tmp_path / "landing", 2)
    lake = tmp_path / "lake"
    assert len(run(spark, tmp_path / "landing", lake)) == 1
    offsets = lake / "_checkpoints" / "stream" / "spark" / "offsets" / "0"
    offsets.unlink()
    versions = {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    with pytest.raises(ConfigError, match=(
            f"checkpoint {lake}/_checkpoints/stream is damaged: {offsets} is missing, "
            r"although batch 0 committed.* `sessionlake doctor` says what is lost")):
        run(spark, tmp_path / "landing", lake)
    assert versions == {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}


def test_a_lake_whose_gap_note_was_deleted_takes_its_gap_from_its_closed_sessions(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Deleting ``gap.json`` is no way round the refusal (the day-30 review: a run at 10m
    on a 30m lake then went through, and doctor said healthy): the newest sessions the
    stream closed tell the gap."""
    files = split_log(tmp_path / "landing", 2)
    files[1].rename(tmp_path / "later.log")
    lake = tmp_path / "lake"
    run(spark, tmp_path / "landing", lake)
    note = lake / "_checkpoints" / GAP_NOTE
    note.unlink()
    (tmp_path / "later.log").rename(files[1])
    for refused in (lambda: run(spark, tmp_path / "landing", lake, gap="10m"),
                    lambda: rebuild_open_sessions(
                        spark, settings_from({"lake": str(lake), "gap": "10m"}, env={}))):
        with pytest.raises(ConfigError,
                           match="cuts its sessions with --gap 30m; --gap 10m would"):
            refused()
    assert not note.exists()
    assert len(run(spark, tmp_path / "landing", lake)) == 1
    assert json.loads(note.read_text()) == {"gap_s": 1800.0, "max_session_duration_s": 86400.0}


@pytest.mark.parametrize("damage", ["cut short", "deleted"])
def test_a_table_whose_newest_commit_is_damaged_is_refused_before_any_read(
    spark: SparkSession, tmp_path: Path, damage: str
) -> None:
    """Delta skips a line of a commit it cannot parse, and reads a log without its newest
    commit as the version before: a run on a ``sessions`` commit cut short, or deleted by
    hand with its checksums left, exited 0, lost the sessions it added and committed on
    top (the day-30 review; cut short, no query read the table after). The run now stops
    first, naming it."""
    files = split_log(tmp_path / "landing", 2)
    files[1].rename(tmp_path / "later.log")
    lake = tmp_path / "lake"
    run(spark, tmp_path / "landing", lake)
    (tmp_path / "later.log").rename(files[1])
    log = lake / "sessions" / "_delta_log"
    commit = log / f"{table_version(spark, str(lake), 'sessions'):020d}.json"
    if damage == "cut short":
        text = commit.read_text()
        commit.write_text(text[: text.index("\n") + 10])  # ten characters into its 2nd action
        said = (rf"is cut short \({commit}: a line is not complete JSON\), and a run on it "
                "would lose what it added: nothing was read")
    else:
        commit.unlink()
        said = (rf"is gone \({commit}: its checksum is still there\), and a run on the "
                "version before would lose what it added: nothing was read")
    versions = {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    with pytest.raises(ConfigError, match=f"the newest commit of table sessions {said}"
                       ) as refused:
        run(spark, tmp_path / "landing", lake)
    assert versions == {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    # The way on without what the commit added, as the refusal says.
    version = commit.name.removesuffix(".json")
    checksums = [log / f"{version}.crc", log / f".{version}.json.crc"]
    if damage == "deleted":
        told = str(refused.value).rsplit("; to go on without what the commit added, delete ")
        assert sorted(told[1].split(" and ")) == sorted(
            str(path) for path in checksums if path.exists())
    else:
        assert str(refused.value).endswith("move it and its checksums out of the log")
    aside = tmp_path / "aside"
    aside.mkdir()
    for path in (commit, *checksums):
        if path.exists():
            path.rename(aside / path.name)
    assert len(run(spark, tmp_path / "landing", lake)) == 1


def test_a_lake_noted_with_its_gap_alone_notes_its_maximum_duration_at_the_next_run(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Lakes begun before 2026-12-06 noted the gap alone: their next run adds the maximum
    duration it runs with, and refuses another one after that."""
    files = split_log(tmp_path / "landing", 2)
    files[1].rename(tmp_path / "later.log")
    lake = tmp_path / "lake"
    run(spark, tmp_path / "landing", lake)
    note = lake / "_checkpoints" / GAP_NOTE
    note.write_text(json.dumps({"gap_s": 1800.0}))
    (tmp_path / "later.log").rename(files[1])
    assert len(run(spark, tmp_path / "landing", lake, max_session_duration="12h")) == 1
    assert json.loads(note.read_text()) == {"gap_s": 1800.0, "max_session_duration_s": 43200.0}


def test_a_run_with_another_format_than_its_stream_s_is_refused_and_doctor_names_it(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Run without ``--format apache`` (jsonl is the default), an access-log stream would
    quarantine every new line as invalid JSON."""
    files = split_log(tmp_path / "landing", 2)
    files[1].rename(tmp_path / "later.log")
    lake = tmp_path / "lake"
    assert len(run(spark, tmp_path / "landing", lake)) == 1  # --format apache
    (tmp_path / "later.log").rename(files[1])
    versions = {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    with pytest.raises(ConfigError, match=r"reads --format apache; --format jsonl would "
                       r"quarantine its input\. Pass --format apache") as refused:
        run(spark, tmp_path / "landing", lake, input_format="jsonl")
    assert "accepted no event" not in str(refused.value)  # its events are worth keeping
    assert versions == {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}

    # `run --check-only` says the same beside a running stream (the restart DAG asks it
    # before it stops one), and changes nothing.
    monkeypatch.setattr(cli, "_spark", lambda *args, **kwargs: spark)
    argv = ["run", "--source", str(tmp_path / "landing"), "--lake", str(lake), "--check-only"]
    capsys.readouterr()
    with checkpoint_lock(str(lake / "_checkpoints" / "stream")):
        listed = sorted((p, p.stat().st_mtime_ns) for p in lake.rglob("*"))
        assert cli.main(argv) == 2
        assert capsys.readouterr().err.strip().endswith(str(refused.value))
        assert cli.main([*argv, "--format", "apache"]) == 0
        assert capsys.readouterr().out == "run possible; nothing changed\n"
        assert sorted((p, p.stat().st_mtime_ns) for p in lake.rglob("*")) == listed

    moved = settings_from({"lake": str(lake), "source": str(tmp_path / "elsewhere")}, env={})
    [finding] = [f for f in check_lake(None, moved).findings if not f.ok]
    assert f"--source {tmp_path / 'landing'} --format apache`" in (finding.recovery or "")
    assert len(run(spark, tmp_path / "landing", lake)) == 1


def test_a_lake_whose_first_run_read_its_input_in_the_wrong_format_says_how_to_start_over(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An access log read without ``--format apache``: every line quarantined, and the
    checkpoint has read the files. The run with the right format says what gets out of it."""
    split_log(tmp_path / "landing", 1)
    lake = tmp_path / "lake"
    [first] = run(spark, tmp_path / "landing", lake, input_format="jsonl")
    assert first["accepted"] == 0 and first["quarantined"] == first["input_records"] > 0
    with pytest.raises(ConfigError, match=(
            r"reads --format jsonl; --format apache would quarantine its input.*The lake has "
            rf"accepted no event yet: if --format apache is what its input is, remove the lake "
            rf"{lake} and the checkpoint {lake}/_checkpoints/stream")):
        run(spark, tmp_path / "landing", lake)


@pytest.mark.parametrize(("set_back", "refused"), [
    (timedelta(hours=2), True),      # would quarantine every live event as from the future
    (timedelta(minutes=1), False),   # NTP's small steps pass
])
def test_a_batch_refuses_to_begin_on_a_clock_set_back_since_the_previous_one(
    spark: SparkSession, tmp_path: Path, set_back: timedelta, refused: bool
) -> None:
    files = split_log(tmp_path / "landing", 2)
    files[1].rename(tmp_path / "later.log")
    lake = tmp_path / "lake"
    settings = settings_from({"lake": str(lake), "source": str(tmp_path / "landing"),
                              "input_format": "apache"}, env={})
    run_stream(spark, settings, clock=lambda: NOW)
    (tmp_path / "later.log").rename(files[1])
    versions = {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    if refused:
        with pytest.raises(ClockSetBack, match=(
                r"this machine's clock reads .*, 2h before the processing time of batch 0 .* "
                r"Nothing was written: set the clock right \(NTP\) and run again")):
            run_stream(spark, settings, clock=lambda: NOW - set_back)
        assert versions == {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    # The batch runs once the clock is right (or was only a step behind).
    summary = run_stream(spark, settings, clock=lambda: NOW - (set_back if not refused
                                                                 else timedelta(0)))
    assert [b.row["batch_id"] for b in summary.batches] == [1]
    assert read_table(spark, str(lake), "quarantine").count() == 0


def test_a_second_stream_on_a_lake_is_refused_whatever_its_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Two streams on one lake would each MERGE open sessions read before the other's
    commit: a run on another checkpoint must not start beside one already writing."""
    split_log(tmp_path / "landing", 1)
    lake, elsewhere = tmp_path / "lake", tmp_path / "elsewhere" / "checkpoint"
    settings = settings_from({"lake": str(lake), "source": str(tmp_path / "landing")}, env={})
    with held_by_another_process("stream_locks", lake, elsewhere) as holder:
        with pytest.raises(StreamAlreadyRunning,
                           match=f"pid {holder.pid}.* from checkpoint {elsewhere}"):
            run_stream(spark, settings)
        assert not (lake / "events").exists()
        assert not lock_held(Path(settings.checkpoint))  # its own checkpoint let go
    run_stream(spark, settings)  # the lake is free again
    assert (lake / "events").exists()


@pytest.mark.parametrize("spelling", ["as first given", "through a symbolic link"])
def test_a_new_checkpoint_on_a_folder_another_checkpoint_read_is_refused(
    spark: SparkSession, tmp_path: Path, spelling: str
) -> None:
    """A run that forgot the `--checkpoint` its stream ran with would read every landing
    file again into the same lake, however the folder is spelled: refused before touching
    it, naming that checkpoint."""
    split_log(tmp_path / "landing", 1)
    first = settings_from({"lake": str(tmp_path / "lake"), "source": str(tmp_path / "landing"),
                           "checkpoint": str(tmp_path / "first")}, env={})
    run_stream(spark, first)
    versions = {t: table_version(spark, first.lake, t) for t in STREAM_TABLES}
    (tmp_path / "mnt").mkdir()
    (tmp_path / "mnt" / "landing").symlink_to(tmp_path / "landing")
    source = {"as first given": first.source,
              "through a symbolic link": str(tmp_path / "mnt" / "landing")}[spelling]
    forgot = settings_from({"lake": first.lake, "source": source}, env={})
    with pytest.raises(ConfigError, match=f"read by the lake's stream on checkpoint "
                                          f"{tmp_path / 'first'}.*--checkpoint {tmp_path}/first"):
        run_stream(spark, forgot)
    assert {t: table_version(spark, first.lake, t) for t in STREAM_TABLES} == versions
    assert lake_streams(spark, first.lake) == [str(tmp_path / "first")]  # not noted
    assert not os.path.exists(forgot.checkpoint)  # nor left behind, lock and all
    run_stream(spark, first)  # its own checkpoint still runs


def _land(landing: Path, files: dict[str, str]) -> None:
    """One event of each user into each named file, subfolders made as needed."""
    for name, user in files.items():
        (landing / name).parent.mkdir(parents=True, exist_ok=True)
        (landing / name).write_text(event(user, "10:00") + "\n")


def test_a_new_stream_reads_the_landing_folders_subfolders_but_hidden_ones(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Files laid out by date (as a Firehose or a Kafka Connect sink writes them) and
    `key=value` folders beside the folder's own files are read; hidden ones are not."""
    _land(tmp_path / "landing", {
        "top.jsonl": "u1", "2026/01/05/10/firehose.jsonl": "u2", "dt=2026-01-05/part.jsonl": "u3",
        "_archive/old.jsonl": "u4", ".staging/partial.jsonl": "u5", "2026/.part.jsonl": "u6",
    })
    settings = settings_from({"lake": str(tmp_path / "lake"),
                              "source": str(tmp_path / "landing")}, env={})
    run_stream(spark, settings, clock=lambda: NOW)
    assert rows(read_table(spark, settings.lake, "events"), "source_file", "user_id") == [
        ("2026/01/05/10/firehose.jsonl", "u2"), ("dt=2026-01-05/part.jsonl", "u3"),
        ("top.jsonl", "u1")]


def test_a_stream_begun_before_subfolders_were_read_keeps_to_its_folders_own_files_until_told(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Reading subfolders all at once could take in an archive nobody meant to be read."""
    landing = tmp_path / "landing"
    _land(landing, {"top.jsonl": "u1"})
    settings = settings_from({"lake": str(tmp_path / "lake"), "source": str(landing)}, env={})
    run_stream(spark, settings, clock=lambda: NOW)
    (Path(settings.checkpoint) / LANDING_NOTE).unlink()  # as a release before left it
    _land(landing, {"processed/top.jsonl": "u1", "later.jsonl": "u2"})

    run_stream(spark, settings, clock=lambda: NOW)
    events = read_table(spark, settings.lake, "events")
    assert rows(events, "source_file") == [("later.jsonl",), ("top.jsonl",)]
    assert "subfolders of the landing folder" in caplog.text and "processed" in caplog.text
    assert "--read-subfolders" in caplog.text

    run_stream(spark, settings.with_overrides(read_subfolders=True), clock=lambda: NOW)
    run_stream(spark, settings, clock=lambda: NOW)  # noted: it stays so
    assert rows(events, "source_file") == [
        ("later.jsonl",), ("processed/top.jsonl",), ("top.jsonl",)]


def test_a_file_landing_with_a_time_long_before_the_files_read_is_read(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A backfilled file copied in with its own time kept (`cp -p`), weeks older than the
    files already read: Spark's file source ignores such a file unless told otherwise."""
    landing = tmp_path / "landing"
    _land(landing, {"today.jsonl": "u1"})
    settings = settings_from({"lake": str(tmp_path / "lake"), "source": str(landing)}, env={})
    run_stream(spark, settings, clock=lambda: NOW)
    _land(landing, {"backfill.jsonl": "u2"})
    month_ago = (landing / "today.jsonl").stat().st_mtime - 30 * 86400
    os.utime(landing / "backfill.jsonl", (month_ago, month_ago))

    run_stream(spark, settings, clock=lambda: NOW)
    assert rows(read_table(spark, settings.lake, "events"), "source_file") == [
        ("backfill.jsonl",), ("today.jsonl",)]


def test_a_file_changed_after_it_was_read_is_named_at_the_next_run(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A log still being written when it landed: Spark read it once, as it was then, and
    never reads what was appended since; the next run says so."""
    landing = tmp_path / "landing"
    _land(landing, {"access.jsonl": "u1"})
    settings = settings_from({"lake": str(tmp_path / "lake"), "source": str(landing)}, env={})
    run_stream(spark, settings, clock=lambda: NOW)
    run_stream(spark, settings, clock=lambda: NOW)
    assert "changed after the stream read them" not in caplog.text
    with (landing / "access.jsonl").open("a") as log:
        log.write(event("u2", "10:05") + "\n")
    later = (landing / "access.jsonl").stat().st_mtime + 5
    os.utime(landing / "access.jsonl", (later, later))

    run_stream(spark, settings, clock=lambda: NOW)
    assert ("changed after the stream read them (written to, or put back under the same "
            "name), and a file is read once, so what they hold now is not read: "
            f"{landing / 'access.jsonl'}. A file must be whole when it lands") in caplog.text
    assert rows(read_table(spark, settings.lake, "events"), "user_id") == [("u1",)]


def test_a_stream_waits_for_another_checkpoints_cut_off_batch_to_be_replayed(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch cut off after its MERGE has changed the state but not appended its closed
    sessions: a stream on another checkpoint must not read the lake until it is replayed."""
    split_log(tmp_path / "landing", 1)
    (tmp_path / "other-landing").mkdir()
    first = settings_from({"lake": str(tmp_path / "lake"), "source": str(tmp_path / "landing"),
                           "checkpoint": str(tmp_path / "first")}, env={})
    second = first.with_overrides(checkpoint=str(tmp_path / "second"),
                                  source=str(tmp_path / "other-landing"))

    def cut_off(name: str) -> None:
        if name == "after_merge":
            raise RuntimeError("cut off")

    monkeypatch.setattr(faults, "point", cut_off)
    with pytest.raises(Exception, match="cut off"):
        run_stream(spark, first, clock=lambda: NOW)
    monkeypatch.undo()
    versions = {table: table_version(spark, first.lake, table) for table in STREAM_TABLES}

    with pytest.raises(BatchUnfinishedElsewhere, match=f"checkpoint {tmp_path / 'first'}, "):
        run_stream(spark, second, clock=lambda: NOW)
    assert versions == {t: table_version(spark, first.lake, t) for t in STREAM_TABLES}

    assert [r["batch_id"] for r in run_stream(spark, first, clock=lambda: NOW).processed] \
        == [0]  # the replay
    assert run_stream(spark, second, clock=lambda: NOW).processed == []  # free again




@pytest.mark.parametrize(("batch", "said"), [
    (None, "signal 15 received: stopping (no batch in flight)"),
    (3, "signal 15 received: stopping after batch 3, in flight (a second signal cancels it, "
        "and it runs again on restart)"),
])
def test_a_stop_signal_is_answered_with_what_the_stop_waits_for(
    batch: int | None, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A run between batches said it was "stopping after the batch in flight" (a review)."""
    # Off the main thread no handler is set, and SIGTERM would end the test process.
    assert threading.current_thread() is threading.main_thread()
    stop, stop_now, in_flight = threading.Event(), threading.Event(), _BatchInFlight()
    if batch is not None:
        in_flight.start(batch)
    with caplog.at_level(logging.WARNING, logger="sessionlake.stream"), \
            _stop_on_signals(stop, stop_now, in_flight):
        os.kill(os.getpid(), signal.SIGTERM)
        stop.wait(10)  # the handler runs on this thread, between two of its steps
    assert stop.is_set() and not stop_now.is_set()
    assert [r.getMessage() for r in caplog.records] == [said]

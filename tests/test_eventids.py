"""The bound of ``events``' ids that lets a batch skip reading the table for duplicates."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sessionlake import batch, eventids
from sessionlake.config import Settings
from sessionlake.deltalog import commit_file
from sessionlake.eventids import IdBound
from sessionlake.ledger import ID_BOUND_NOTES, StreamIdentity, read_ledger
from sessionlake.tables import EVENTS, LATE_EVENTS, read_table, table_path, table_version
from tests.helpers import event, lake_settings, run_batches


@pytest.mark.parametrize(
    ("largest", "least", "excludes"),
    [
        (None, "a1", True),     # no event at all
        ("b1", "b2", True),
        ("b1", "b1", False),    # the batch may repeat the greatest id
        ("b1", "a9", False),
        ("b1", None, False),    # the batch has no valid event: nothing to decide
    ],
)
def test_a_bound_excludes_only_ids_above_it(
    largest: str | None, least: str | None, excludes: bool
) -> None:
    assert IdBound(3, largest).excludes(least) is excludes


@pytest.mark.parametrize(
    ("add", "known"),
    [
        ({"path": "f"}, (False, None)),                                   # no statistics
        ({"stats": json.dumps({"numRecords": 0})}, (True, None)),          # no row
        ({"stats": json.dumps({"numRecords": 2, "maxValues": {"event_id": "e9"}})},
         (True, "e9")),
        ({"stats": json.dumps({"numRecords": 2, "maxValues": {"user_id": "u"}})},
         (False, None)),                                                   # ids not counted
    ],
)
def test_a_files_greatest_id_comes_from_its_statistics(
    add: dict[str, Any], known: tuple[bool, str | None]
) -> None:
    assert eventids.file_largest_id(add) == known


def ledger_bound(spark: SparkSession, cfg: Settings, identity: StreamIdentity,
                 batch_id: int) -> IdBound | None:
    entry = read_ledger(spark, cfg, identity, batch_id) or {}
    return eventids.from_json(entry.get(ID_BOUND_NOTES[EVENTS]))


def recording_into(read: list[str]) -> Any:
    """``read_table`` that also notes in ``read`` each table a batch reads."""
    def recording(spark: SparkSession, lake: str, table: str, *args: Any) -> Any:
        read.append(table)
        return read_table(spark, lake, table, *args)

    return recording


def test_each_batch_notes_the_bound_at_the_version_it_reads(
    spark: SparkSession, lake: str
) -> None:
    cfg = lake_settings(lake)
    identity = StreamIdentity("ids", 0)
    run_batches(spark, cfg, [[event("u", "10:00", event_id="a1"), event("v", "10:00",
                                                                         event_id="a2")],
                             [event("u", "10:01", event_id="b1")],
                             [event("u", "10:02", event_id="c1")]], identity=identity)
    bounds = [ledger_bound(spark, cfg, identity, b) for b in (0, 1, 2)]
    assert [b.largest if b else "?" for b in bounds] == [None, "a2", "b1"]
    assert [b.version if b else -1 for b in bounds] == [0, 1, 2]


def test_a_batch_above_the_bound_does_not_read_events(
    spark: SparkSession, lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither resolved ahead (the previous batch did not read it either) nor queried."""
    cfg = lake_settings(lake)
    identity = StreamIdentity("ids", 0)
    run_batches(spark, cfg, [[event("u", "10:00", event_id="a1")],
                             [event("u", "10:01", event_id="b1")]], identity=identity)
    read: list[str] = []
    monkeypatch.setattr(batch, "read_table", recording_into(read))
    monkeypatch.setattr(batch, "resolve_snapshot",
                        lambda spark, lake, table, version: read.append(table))
    [report] = run_batches(spark, cfg, [[event("u", "10:02", event_id="c1")]],
                           identity=identity, first_batch_id=2)
    assert report.row["accepted"] == 1
    assert EVENTS not in read
    # A batch that may repeat an id reads the table, and finds the repeat.
    [report] = run_batches(spark, cfg, [[event("u", "10:03", event_id="c1")]],
                           identity=identity, first_batch_id=3)
    assert report.row["duplicates"] == 1
    assert EVENTS in read


def test_late_events_has_a_bound_of_its_own(
    spark: SparkSession, lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy of a late event is a duplicate too, so ``late_events`` is searched as well,
    and skipped as ``events`` is when the batch's ids lie above every id it holds."""
    cfg = lake_settings(lake)
    identity = StreamIdentity("ids", 0)
    run_batches(spark, cfg, [[event("x", "12:00", event_id="a1")],
                             [event("u", "10:00", event_id="b5")]],  # late (rule 2)
                identity=identity)
    read: list[str] = []
    monkeypatch.setattr(batch, "read_table", recording_into(read))
    [report] = run_batches(spark, cfg, [[event("u", "12:01", event_id="c1")]],
                           identity=identity, first_batch_id=2)
    entry = read_ledger(spark, cfg, identity, 2) or {}
    assert eventids.from_json(entry.get(ID_BOUND_NOTES[LATE_EVENTS])) == IdBound(
        table_version(spark, lake, LATE_EVENTS), "b5")
    assert report.row["accepted"] == 1
    assert LATE_EVENTS not in read and EVENTS not in read
    [report] = run_batches(spark, cfg, [[event("u", "10:00", event_id="b5")]],
                           identity=identity, first_batch_id=3)
    assert (report.row["duplicates"], report.row["late"]) == (1, 0)
    assert LATE_EVENTS in read


def test_the_bound_counts_other_writers_commits(spark: SparkSession, lake: str) -> None:
    """Another writer's events (a second stream, a backfill) between two batches raise
    the bound: a repeat of one of them is still found."""
    cfg = lake_settings(lake)
    identity = StreamIdentity("ids", 0)
    run_batches(spark, cfg, [[event("u", "10:00", event_id="a1")],
                             [event("u", "10:01", event_id="b1")]], identity=identity)
    run_batches(spark, cfg, [[event("w", "10:02", event_id="c5")]],
                identity=StreamIdentity("other", 0))
    [report] = run_batches(spark, cfg, [[event("u", "10:03", event_id="c1"),
                                         event("w", "10:02", event_id="c5")]],
                           identity=identity, first_batch_id=2)
    assert report.row["duplicates"] == 1
    assert ledger_bound(spark, cfg, identity, 2) == IdBound(table_version(spark, lake, EVENTS)
                                                             - 1, "c5")
    assert read_table(spark, lake, EVENTS).where("event_id = 'c5'").count() == 1


def test_a_new_epoch_takes_the_bound_from_the_log(spark: SparkSession, lake: str) -> None:
    cfg = lake_settings(lake)
    run_batches(spark, cfg, [[event("u", "10:00", event_id="a1"), event("v", "10:00",
                                                                         event_id="a7")],
                             [event("u", "10:01", event_id="a3")]])
    version = table_version(spark, lake, EVENTS)
    assert eventids.id_bound(spark, lake, None, version, from_log=True) == IdBound(
        version, "a7")
    assert eventids.id_bound(spark, lake, None, version, from_log=False) is None
    # A stream's first batch on an existing lake (no previous batch) notes it.
    run_batches(spark, cfg, [[event("u", "10:02", event_id="b1")]],
                identity=StreamIdentity("restored", 1))
    assert ledger_bound(spark, cfg, StreamIdentity("restored", 1), 0) == IdBound(version, "a7")


def test_a_bound_that_cannot_be_carried_is_dropped(
    spark: SparkSession, lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit file gone (log clean-up) or too many commits to read: not carried."""
    cfg = lake_settings(lake)
    run_batches(spark, cfg, [[event("u", "10:00", event_id="a1")],
                             [event("u", "10:01", event_id="b1")],
                             [event("u", "10:02", event_id="c1")]])
    version = table_version(spark, lake, EVENTS)
    start = IdBound(1, "a1")
    assert eventids.carried_to(spark, lake, start, version) == IdBound(version, "c1")
    assert eventids.carried_to(spark, lake, start, 0) is None  # a version before the bound
    monkeypatch.setattr(eventids, "CARRIED_COMMITS_MAX", 1)
    assert eventids.carried_to(spark, lake, start, version) is None
    monkeypatch.undo()
    Path(table_path(lake, EVENTS), commit_file(version)).unlink()
    assert eventids.carried_to(spark, lake, start, version) is None


def test_a_bound_not_carried_is_taken_from_the_log_again(
    spark: SparkSession, lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One pause longer than the batch will read commits for (a backfill of many commits,
    say) must not cost the stream its bound for good: the batch after it takes the bound
    from the log, and still skips its read of ``events``."""
    cfg = lake_settings(lake)
    identity = StreamIdentity("ids", 0)
    monkeypatch.setattr(eventids, "CARRIED_COMMITS_MAX", 0)  # no bound is ever carried
    run_batches(spark, cfg, [[event("u", "10:00", event_id="a1")],
                             [event("u", "10:01", event_id="b1")]], identity=identity)
    version = table_version(spark, lake, EVENTS)
    assert eventids.id_bound(spark, lake, IdBound(0, None), version,
                                    from_log=False) == IdBound(version, "b1")
    read: list[str] = []
    monkeypatch.setattr(batch, "resolve_snapshot",
                        lambda spark, lake, table, version: read.append(table))
    monkeypatch.setattr(batch, "read_table", recording_into(read))
    [report] = run_batches(spark, cfg, [[event("u", "10:02", event_id="c1")]],
                           identity=identity, first_batch_id=2)
    assert report.row["accepted"] == 1
    assert ledger_bound(spark, cfg, identity, 2) == IdBound(version, "b1")
    assert EVENTS not in read


def test_without_a_noted_bound_the_log_is_read_only_in_a_new_epoch(
    spark: SparkSession, lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a batch that found no bound even in the log, the next ones do not replay the
    log again (it would most likely fail for the same reason, at every batch)."""
    cfg = lake_settings(lake)
    run_batches(spark, cfg, [[event("u", "10:00", event_id="a1")]])
    version = table_version(spark, lake, EVENTS)
    replays: list[str] = []
    monkeypatch.setattr(eventids, "bound_from_log", lambda lake, table: replays.append(lake))
    assert eventids.id_bound(spark, lake, None, version, from_log=False) is None
    assert replays == []
    assert eventids.id_bound(spark, lake, None, version, from_log=True) is None
    assert replays == [lake]


@pytest.mark.parametrize("tail", ["b", "é", "\U0001f600"])
def test_long_ids_are_bounded_from_above_though_delta_truncates_their_statistics(
    spark: SparkSession, lake: str, tail: str
) -> None:
    """Delta keeps a string's first 32 characters in its statistics and rounds the rest up
    (with U+007F, or U+10FFFF after a character beyond ASCII): a repeat of a long id that
    shares its first 32 characters with the greatest one is still looked for, and found."""
    prefix = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f"  # 32 characters, as a UUIDv7's start
    cfg = lake_settings(lake)
    identity = StreamIdentity("ids", 0)
    run_batches(spark, cfg, [[event("u", "10:00", event_id=prefix + tail + "9")]],
                identity=identity)
    [report] = run_batches(spark, cfg, [[event("u", "10:00", event_id=prefix + tail + "9")]],
                           identity=identity, first_batch_id=1)
    bound = ledger_bound(spark, cfg, identity, 1)
    assert bound is not None and bound.largest is not None
    assert bound.largest >= prefix + tail + "9"
    assert report.row["duplicates"] == 1

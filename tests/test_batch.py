"""Micro-batch semantics: lateness, bridging, duplicates, guards, conservation, idempotency."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionlake import batch, state
from sessionlake.deltalog import BatchKey
from sessionlake.deltareader import read_state
from sessionlake.ledger import BatchInputs, StreamIdentity
from sessionlake.tables import (
    BATCH_METRICS,
    PUBLIC_TABLES,
    STREAM_TABLES,
    read_table,
    table_commit_actions,
    table_path,
    table_version,
)
from tests.helpers import (
    NOW,
    all_sessions,
    create_tables,
    event,
    first,
    hm,
    lake_settings,
    lines_frame,
    rows,
    run_batches,
)


def late_reasons(spark: SparkSession, lake: str) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in rows(read_table(spark, lake, "late_events"), "event_id",
                                       "reason")]


def test_late_event_within_grace_extends_an_open_session(spark: SparkSession, lake: str) -> None:
    cfg = lake_settings(lake)
    run_batches(spark, cfg, [
        [event("u", "10:00", "/a"), event("x", "10:20")],  # W becomes 10:15
        [event("u", "09:58", "/early")],                   # behind W, but u's session is open
    ])
    assert late_reasons(spark, lake) == []
    assert rows(all_sessions(spark, lake).where("user_id = 'u'"),
                "session_start", "session_end", "event_count", "entry_page") == [
        (hm("09:58"), hm("10:00"), 2, "/early"),
    ]
    changes = rows(read_table(spark, lake, "session_changelog").where("user_id = 'u'"),
                   "batch_id", "change", "added_events")
    assert changes == [(0, "open", 1), (1, "extend", 1)]
    # The start moved, so the id changed: the old row is gone from the state.
    assert read_table(spark, lake, "open_sessions").where("user_id = 'u'").count() == 1


def test_event_beyond_grace_that_would_form_a_closed_session_is_late(
    spark: SparkSession, lake: str
) -> None:
    cfg = lake_settings(lake)
    run_batches(spark, cfg, [
        [event("x", "12:00")],                        # W becomes 11:55
        [event("u", "10:00", event_id="late-1")],     # alone it would end before W - gap
    ])
    [(event_id, reason)] = late_reasons(spark, lake)
    assert event_id == "late-1"
    assert "would already be closed" in reason
    assert all_sessions(spark, lake).where("user_id = 'u'").count() == 0


@pytest.mark.parametrize(
    ("at", "late"),
    [
        ("09:31", True),    # start - gap < t: within the gap before the closed session
        ("10:10", True),    # inside the closed session
        ("10:29", True),    # within the gap after it
        ("10:31", False),   # beyond the gap after it, and its own session is still open
    ],
)
def test_event_near_a_closed_session_is_late(
    spark: SparkSession, lake: str, at: str, late: bool
) -> None:
    cfg = lake_settings(lake)
    run_batches(spark, cfg, [
        [event("u", "10:00"), event("x", "11:00")],  # W 10:55 closes u's 10:00 session
        [event("u", at, event_id="probe")],
    ])
    reasons = dict(late_reasons(spark, lake))
    assert ("probe" in reasons) is late
    if late:
        assert reasons["probe"].startswith("within the gap of closed session")


@pytest.mark.parametrize("split", ["one batch", "two batches"])
def test_a_late_event_is_recorded_once_however_its_copies_are_split(
    spark: SparkSession, lake: str, split: str
) -> None:
    """A copy of an event already rejected as late counts as a duplicate, in its batch or
    in a later one: ``late_events`` holds the event once."""
    late = event("u", "10:00", event_id="e")  # alone it would end before W - gap
    copies = [[late, late]] if split == "one batch" else [[late], [late]]
    reports = run_batches(spark, lake_settings(lake), [[event("x", "12:00")], *copies])
    assert [event_id for event_id, _ in late_reasons(spark, lake)] == ["e"]
    assert sum(r.row["duplicates"] for r in reports) == 1
    assert sum(r.row["late"] for r in reports) == 1


def test_a_late_event_s_copy_is_a_duplicate_even_where_it_would_now_be_accepted(
    spark: SparkSession, lake: str
) -> None:
    """Later events can give a copy of a late event a run that reaches past the watermark;
    the copy still counts as a duplicate, so the event is not both late and in a session."""
    late = event("u", "10:00", event_id="e")
    bridge = [event("u", at) for at in ("10:25", "10:50", "11:15", "11:40")]
    reports = run_batches(spark, lake_settings(lake), [[event("x", "12:00")], [late],
                                                  [late, *bridge]])
    assert [r.row["duplicates"] for r in reports] == [0, 0, 1]
    assert [event_id for event_id, _ in late_reasons(spark, lake)] == ["e"]
    assert rows(all_sessions(spark, lake).where("user_id = 'u'"),
                "session_start", "event_count") == [(datetime(2026, 1, 5, 10, 25), 4)]
    assert read_table(spark, lake, "events").where("event_id = 'e'").count() == 0


@pytest.mark.parametrize("keys", ["named", "joined"])
@pytest.mark.parametrize("merge_source", ["shipped to every task", "shuffled"])
def test_late_event_bridges_two_open_sessions(
    spark: SparkSession, lake: str, merge_source: str, keys: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The MERGE updates one open session and deletes the other, whichever way it joins
    its source (small: broadcast, see ``state.BROADCAST_SOURCE_ROWS_MAX``) to the state,
    and whether its condition names the source's session ids (``state.names_session_ids``:
    a few rows of state are too few for that, unless the threshold says otherwise)."""
    if merge_source == "shuffled":
        monkeypatch.setattr(state, "BROADCAST_SOURCE_ROWS_MAX", 0)
    if keys == "named":
        monkeypatch.setattr(state, "STATE_ROWS_PER_LITERAL", 0)
    cfg = lake_settings(lake, grace="60m")
    run_batches(spark, cfg, [
        [event("u", "10:00", "/a"), event("u", "10:50", "/c")],  # two open sessions
        [event("u", "10:25", "/b")],                              # within the gap of both
    ])
    assert rows(all_sessions(spark, lake), "session_start", "session_end", "event_count",
                "entry_page", "exit_page") == [(hm("10:00"), hm("10:50"), 3, "/a", "/c")]
    [merge] = read_table(spark, lake, "session_changelog").where("change = 'merge'").collect()
    assert len(merge["previous_session_ids"]) == 2
    assert merge["session_id"] in merge["previous_session_ids"]
    assert read_table(spark, lake, "open_sessions").count() == 1


def test_the_merge_is_sized_by_the_rows_of_its_source(
    spark: SparkSession, lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """How the MERGE joins its source to the state (``state.BROADCAST_SOURCE_ROWS_MAX``,
    ``state.names_session_ids``) follows the size the batch observed while classifying:
    it must be the source's row count for every kind of change, including a session
    that opens and closes in one batch (a change that never reaches ``open_sessions``)."""
    sized: list[tuple[int, int | None]] = []
    apply = batch.apply_changelog_merge

    def counting(spark: SparkSession, lake: str, source: DataFrame, buckets: list[int],
                 key: BatchKey | None, replay_after: int | None = None,
                 source_rows: int | None = None, state_rows: int | None = None,
                 empty: bool = False) -> state.MergeResult:
        assert isinstance(source_rows, int)
        sized.append((source.count(), source_rows))
        return apply(spark, lake, source, buckets, key, replay_after, source_rows, state_rows,
                     empty)

    monkeypatch.setattr(batch, "apply_changelog_merge", counting)
    run_batches(spark, lake_settings(lake, grace="60m"), [
        # W 09:50: v opens and closes at once; u has two open sessions.
        [event("u", "10:00", "/a"), event("u", "10:50", "/c"), event("v", "08:00")],
        # u's two sessions bridged into one, which W 11:30 closes; x opens.
        [event("u", "10:25", "/b"), event("x", "12:30")],
        # W 13:10: x, not in the batch, expires; z opens.
        [event("z", "14:10")],
    ])
    assert [actual for actual, _ in sized] == [2, 3, 2]
    assert [observed for _, observed in sized] == [actual for actual, _ in sized]
    changes = {r["change"] for r in read_table(spark, lake, "session_changelog").collect()}
    assert {"open", "merge", "close"} <= changes


def test_a_first_batch_appends_its_open_sessions_and_the_next_merges_them(
    spark: SparkSession, lake: str
) -> None:
    """A new lake's ``open_sessions`` holds no row for a MERGE to match: the first batch
    appends its open sessions (``state.insert_into_empty``), reported as the MERGE's
    inserts; the next batch MERGEs into them."""
    run_batches(spark, lake_settings(lake), [
        [event("u", "10:00"), event("v", "10:05")],
        [event("u", "10:10"), event("w", "10:12")],
    ])
    history = DeltaTable.forPath(spark, table_path(lake, "open_sessions")).history()
    assert [r["operation"] for r in history.orderBy("version").collect()][1:] == [
        "WRITE", "MERGE"]
    metrics = {r["batch_id"]: r for r in read_table(spark, lake, "batch_metrics").collect()}
    assert (metrics[0]["merge_rows_inserted"], metrics[0]["open_sessions"]) == (2, 2)
    assert metrics[0]["merge_files_added"] > 0
    assert (metrics[1]["merge_rows_updated"], metrics[1]["merge_rows_inserted"],
            metrics[1]["open_sessions"]) == (1, 1, 3)


def test_a_batch_that_changes_no_open_session_reports_no_merge(
    spark: SparkSession, lake: str
) -> None:
    """A batch of late events only, by a user with an open session, changes no state: it
    commits no MERGE and reports zeros, not the figures of the batch before it."""
    reports = run_batches(spark, lake_settings(lake), [
        [event("u", "11:50"), event("w", "12:00")],
        [event("w", "12:01")],  # a MERGE that commits
        [event("u", "09:00"), event("u", "09:01")],  # late (rule 2) beside u's open session
    ])
    assert reports[1].row["merge_rows_updated"] == 1
    last = reports[2].row
    assert (last["late"], last["accepted"], last["open_sessions"]) == (2, 0, 2)
    assert {k: v for k, v in last.items() if k.startswith("merge_")} == {
        "merge_rows_inserted": 0, "merge_rows_updated": 0, "merge_rows_deleted": 0,
        "merge_rows_copied": 0, "merge_files_added": 0, "merge_files_removed": 0,
        "merge_duration_ms": 0}
    history = DeltaTable.forPath(spark, table_path(lake, "open_sessions")).history()
    assert history.where("operation = 'MERGE'").count() == 1


@pytest.mark.parametrize(("changed", "rewritten"), [
    (1, False),  # 30 open sessions for 1 change: deletion vectors
    (5, True),   # 30 for 5: at most state.COPY_ON_WRITE_STATE_ROWS_PER_SOURCE_ROW each
])
def test_the_merge_rewrites_the_touched_files_when_it_changes_much_of_their_state(
    spark: SparkSession, lake: str, changed: int, rewritten: bool
) -> None:
    """A MERGE that changes much of the state it touches rewrites those files whole (their
    unchanged rows copied); a few changes over much state are marked in deletion vectors.
    Either way the state holds the same rows."""
    users = [f"u{n:02d}" for n in range(30)]
    run_batches(spark, lake_settings(lake, user_buckets=1), [
        [event(user, "10:00") for user in users],
        [event(user, "10:05") for user in users[:changed]],
    ])
    actions = table_commit_actions(spark, lake, "open_sessions",
                                   table_version(spark, lake, "open_sessions"))
    assert [a["commitInfo"]["operation"] for a in actions if "commitInfo" in a] == ["MERGE"]
    vectors = [a["add"] for a in actions if a.get("add", {}).get("deletionVector")]
    assert bool(vectors) is not rewritten
    metrics = {r["batch_id"]: r for r in read_table(spark, lake, "batch_metrics").collect()}
    assert (metrics[1]["merge_rows_updated"], metrics[1]["merge_rows_copied"]) == (
        changed, 30 - changed if rewritten else 0)
    counts = {r["user_id"]: r["event_count"]
              for r in read_table(spark, lake, "open_sessions").collect()}
    assert counts == {user: 2 if n < changed else 1 for n, user in enumerate(users)}


#: Longer than the prefix of a string that Delta keeps in its file statistics (32).
LONG_ID = "x" * 40


@pytest.mark.parametrize(("repeated", "other_id"), [
    ("e1", "e2"),  # the repeated id is the batch's least: the check's range starts at it
    ("e1", "e0"),  # the repeated id is the batch's greatest: the range ends at it
    # Ids that differ only past the statistics' prefix: the file must not be skipped.
    (LONG_ID + "1", LONG_ID + "2"),
    (LONG_ID + "1", LONG_ID + "0"),
])
def test_duplicates_count_once_within_and_across_batches(
    spark: SparkSession, lake: str, repeated: str, other_id: str
) -> None:
    cfg = lake_settings(lake)
    reports = run_batches(spark, cfg, [
        [event("u", "10:00", event_id=repeated), event("u", "10:01", event_id=repeated),
         event("v", "10:00", event_id=repeated)],   # same id, other user: not a duplicate
        [event("u", "10:00", event_id=repeated), event("u", "10:02", event_id=other_id)],
    ])
    assert [r.row["duplicates"] for r in reports] == [1, 1]
    assert rows(all_sessions(spark, lake), "user_id", "event_count") == [("u", 2), ("v", 1)]
    assert read_table(spark, lake, "events").count() == 3


@pytest.mark.parametrize("batch_keys", ["shipped to every task", "shuffled"])
def test_a_batch_too_big_to_ship_its_keys_to_every_task_ends_in_the_same_tables(
    spark: SparkSession, lake: str, batch_keys: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of more records than ``batch.BROADCAST_KEYS_MAX`` (a Kafka catch-up without
    ``--max-offsets-per-trigger``) joins its users, its ids and its rejected records to
    what it reads without broadcasting them, and ends in the same tables."""
    threshold = spark.conf.get("spark.sql.autoBroadcastJoinThreshold") or "10485760"
    if batch_keys == "shuffled":
        monkeypatch.setattr(batch, "BROADCAST_KEYS_MAX", 0)
        # Else Spark would broadcast these few rows all the same, by their size.
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", "-1")
    cfg = lake_settings(lake, grace="60m")
    try:
        reports = run_batches(spark, cfg, [
            [event("u", "10:00", "/a", event_id="a"), event("u", "10:50", "/c", event_id="c")],
            [event("u", "10:25", "/b", event_id="b"), event("u", "10:00", "/a", event_id="a"),
             event("v", "09:00", "/x", event_id="late")],  # W 09:50: alone it would be closed
        ])
    finally:
        spark.conf.set("spark.sql.autoBroadcastJoinThreshold", threshold)
    assert [(r.row["duplicates"], r.row["late"]) for r in reports] == [(0, 0), (1, 1)]
    assert rows(all_sessions(spark, lake), "user_id", "session_start", "session_end",
                "event_count") == [("u", hm("10:00"), hm("10:50"), 3)]
    assert [event_id for event_id, _ in late_reasons(spark, lake)] == ["late"]
    assert rows(read_table(spark, lake, "events"), "event_id") == [("a",), ("b",), ("c",)]


def test_kafka_records_without_an_id_are_never_taken_for_earlier_ones(
    spark: SparkSession, lake: str
) -> None:
    """Their ids, ``<topic>/<partition>/<offset>``, are new by construction: the duplicate
    check leaves them out (it would read the day's events for ids that do not sort by
    time), so a topic created anew and read on a checkpoint of its own from offset 0 is
    not taken for the old one. A producer's own ids are still checked."""
    cfg = lake_settings(lake)
    create_tables(spark, cfg)
    identity = StreamIdentity("test", 0)

    def batch_of(batch_id: int, lines: list[str]) -> dict[str, Any]:
        frame = lines_frame(spark, lines, "kafka://clicks/0")
        return batch.process_lines(spark, frame, batch_id, cfg, identity, lambda: NOW).row

    old_topic = batch_of(0, [event("u", "10:00"), event("u", "10:01", event_id="p1")])
    # The topic anew: offsets from 1 again, and the producer's p1 sent again.
    new_topic = batch_of(1, [event("u", "10:02"), event("u", "10:01", event_id="p1")])
    assert (old_topic["duplicates"], new_topic["duplicates"]) == (0, 1)
    assert rows(read_table(spark, lake, "events"), "event_id", "event_time") == [
        ("clicks/0/1", hm("10:00")), ("clicks/0/1", hm("10:02")), ("p1", hm("10:01"))]


def test_the_duplicate_check_reads_only_files_whose_ids_reach_the_batchs(
    spark: SparkSession, lake: str
) -> None:
    cfg = lake_settings(lake)
    run_batches(spark, cfg, [[event("u", "10:00", event_id="a1")],
                             [event("u", "10:01", event_id="b1")]])
    versions = {table: table_version(spark, lake, table) for table in STREAM_TABLES}
    inputs = BatchInputs(versions, max_event_time_before=None, processing_time=NOW)
    repeated = spark.createDataFrame(
        [("u", "b1", datetime(2026, 1, 5, 10, 1), "b.jsonl", 1)],
        "user_id string, event_id string, event_time timestamp, source_file string, "
        "source_line long")

    seen = batch._seen_before(spark, cfg, inputs, repeated, 1, [date(2026, 1, 5)],
                              ("b1", "b1"), ["events"])

    assert seen is not None
    events = read_table(spark, lake, "events")
    assert sorted(seen.inputFiles()) == sorted(events.where("batch_id = 1").inputFiles())
    assert [tuple(r) for r in seen.collect()] == [("u", "b1", date(2026, 1, 5))]


@pytest.mark.parametrize("split", [1, 2], ids=["one-batch", "two-batches"])
def test_a_copy_is_an_event_of_the_same_day_however_the_input_is_split(
    spark: SparkSession, lake: str, split: int
) -> None:
    """The same user and id on the same day counts once, and on another day twice, in one
    batch or in two: the input's split does not change what is accepted."""
    records = [event("u", "23:50", event_id="e1"), event("u", "23:55", event_id="e1"),
               event("u", "2026-01-06T00:10:00Z", event_id="e1")]
    batches = [records] if split == 1 else [records[:2], records[2:]]
    reports = run_batches(spark, lake_settings(lake), batches)
    assert sum(r.row["duplicates"] for r in reports) == 1
    assert sorted(rows(read_table(spark, lake, "events"), "event_time")) == [
        (datetime(2026, 1, 5, 23, 50),), (datetime(2026, 1, 6, 0, 10),)]


@pytest.mark.parametrize(
    ("ahead", "quarantined"),
    [(timedelta(minutes=30), False), (timedelta(hours=2), True)],
)
def test_events_too_far_in_the_future_are_quarantined(
    spark: SparkSession, lake: str, ahead: timedelta, quarantined: bool
) -> None:
    stamp = (NOW + ahead).strftime("%Y-%m-%dT%H:%M:%SZ")
    run_batches(spark, lake_settings(lake), [[event("u", stamp)]])
    reasons = [r[0] for r in rows(read_table(spark, lake, "quarantine"), "reason")]
    assert bool(reasons) is quarantined
    if quarantined:
        assert "ahead of the processing time" in reasons[0]
        # One bad clock must not move the watermark.
        assert first(read_table(spark, lake, "batch_metrics"))["watermark_after"] is None


def test_an_event_ahead_of_the_clock_does_not_move_time_on(
    spark: SparkSession, lake: str
) -> None:
    """An event 50 minutes ahead of the batch clock (a wrong device clock, inside the hour
    --max-future-skew allows) is taken in, but the watermark stops at the clock minus the
    grace: before, it closed every open session and every live event after it was late
    (the Kafka Streams review)."""
    def at(minutes: int) -> str:
        return (NOW + timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")

    run_batches(spark, lake_settings(lake), [
        [event("alice", at(-5)), event("bob", at(-4))],
        [event("skewed", at(50))],
        [event("alice", at(0)), event("carol", at(0))],
    ])
    metrics = rows(read_table(spark, lake, "batch_metrics").orderBy("batch_id"),
                   "late", "closed_sessions", "watermark_after")
    grace = timedelta(minutes=5)
    assert metrics == [(0, 0, (NOW - timedelta(minutes=4) - grace).replace(tzinfo=None)),
                       (0, 0, (NOW - grace).replace(tzinfo=None)),
                       (0, 0, (NOW - grace).replace(tzinfo=None))]
    assert sorted(rows(read_table(spark, lake, "open_sessions"), "user_id", "event_count")
                  ) == [("alice", 2), ("bob", 1), ("carol", 1), ("skewed", 1)]


def test_long_sessions_split_across_batches_like_in_one_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    stamps = [f"{10 + m // 60:02d}:{m % 60:02d}" for m in range(0, 300, 20)]
    lines = [event("bot", s) for s in stamps]
    results = []
    for name, batches in (("one", [lines]), ("many", [lines[:5], lines[5:9], lines[9:]])):
        lake = str(tmp_path / name)
        run_batches(spark, lake_settings(lake, max_session_duration="2h"), batches)
        results.append(rows(all_sessions(spark, lake), "session_start", "event_count"))
    assert results[0] == results[1] == [(hm("10:00"), 6), (hm("12:00"), 6), (hm("14:00"), 3)]


@pytest.mark.parametrize(
    ("max_duration", "batches", "expected"),
    [
        pytest.param("10m", [["10:10", "10:15"], ["10:02"]],
                     [("10:02", "10:10", 2), ("10:15", "10:15", 1)], id="earlier-event"),
        pytest.param("20m", [["10:00", "10:12", "10:19", "10:26"], ["10:06"]],
                     [("10:00", "10:19", 4), ("10:26", "10:26", 1)], id="bridge"),
    ],
)
def test_an_open_session_is_cut_again_when_its_runs_start_moves_earlier(
    spark: SparkSession, tmp_path: Path, max_duration: str, batches: list[list[str]],
    expected: list[tuple[str, str, int]],
) -> None:
    """A later batch's event that starts the run earlier moves its cuts: an open session
    that now spans a cut is split as a batch sessionization of the same events would."""
    cfg = {"gap": "10m", "grace": "30m", "max_session_duration": max_duration}
    split = [[event("bot", at, f"/{at}", event_id=at) for at in ats] for ats in batches]
    results = []
    for name, lines in (("one", [[line for b in split for line in b]]), ("many", split)):
        lake = str(tmp_path / name)
        reports = run_batches(spark, lake_settings(lake, **cfg), lines)
        assert sum(r.row["late"] for r in reports) == 0
        results.append(rows(all_sessions(spark, lake), "session_start", "session_end",
                            "event_count"))
    assert results[0] == results[1] == [(hm(a), hm(b), n) for a, b, n in expected]
    changes = read_table(spark, lake, "session_changelog").where("batch_id = 1")
    assert {r[0] for r in changes.select("change").collect()} == {"split"}


def test_an_open_session_whose_run_now_starts_earlier_is_cut_from_there_later(
    spark: SparkSession, tmp_path: Path
) -> None:
    """10:12 bridges bot's two runs into one from 10:00, cut at 10:14 and 10:28: the open
    session 10:15-10:17 keeps its events but not its run's start, from which a later batch
    cuts once the run's first piece has closed (found by the random streams, seed 5241:
    the start had stayed 10:15, so 10:28 joined the session instead of opening the next)."""
    cfg = {"gap": "10m", "grace": "3m", "max_session_duration": "14m"}
    bot = [[event("bot", at, event_id=at) for at in ats]
           for ats in (["10:00", "10:05", "10:15", "10:17"], ["10:12"], [], ["10:24", "10:28"])]
    batches = [*bot[:2], [event("x", "10:26")], bot[3]]  # W 10:23 closes 10:00-10:12
    results = []
    for name, lines in (("one", [[line for b in batches for line in b]]), ("many", batches)):
        lake = str(tmp_path / name)
        reports = run_batches(spark, lake_settings(lake, **cfg), lines)
        assert sum(r.row["late"] for r in reports) == 0
        results.append(rows(all_sessions(spark, lake).where("user_id = 'bot'"),
                            "session_start", "session_end", "event_count"))
    assert results[0] == results[1] == [
        (hm("10:00"), hm("10:12"), 3), (hm("10:15"), hm("10:24"), 3), (hm("10:28"), hm("10:28"), 1),
    ]
    # The session was rewritten with its run's start, but told no change: none happened to it.
    changed = read_table(spark, lake, "session_changelog").where("batch_id = 1")
    assert rows(changed, "change", "session_start") == [("extend", hm("10:00"))]


def test_a_session_cut_anew_keeps_its_gap_closed_to_later_events(
    spark: SparkSession, lake: str
) -> None:
    """Once cut anew and closed, the pieces are what lateness rule 1 compares with: none
    is longer than the maximum, so the closed sessions near an event are all found."""
    cfg = lake_settings(lake, gap="10m", grace="0m", max_session_duration="10m")
    run_batches(spark, cfg, [
        [event("u", "2026-01-06T00:07:00Z", event_id="a"),
         event("u", "2026-01-06T00:12:00Z", event_id="b")],
        [event("u", "23:59", event_id="c")],  # the run now starts the day before
        [event("x", "2026-01-06T00:25:00Z", event_id="z")],  # W 00:25 closes u's sessions
        [event("u", "2026-01-06T00:21:00Z", event_id="d")],  # within the gap of 00:12
    ])
    closed = rows(read_table(spark, lake, "sessions").where("user_id = 'u'"),
                  "session_start", "session_end", "event_count")
    assert closed == [(hm("23:59"), datetime(2026, 1, 6, 0, 7), 2),
                      (datetime(2026, 1, 6, 0, 12), datetime(2026, 1, 6, 0, 12), 1)]
    assert [r[0] for r in late_reasons(spark, lake)] == ["d"]


@pytest.mark.parametrize(
    ("first_batch", "late_run"),
    [
        # The run reaches bot's open session (10:30-10:35); the cuts at 10:13, 10:23 and
        # 10:33 leave three pieces behind W 10:40, and cut the open session.
        pytest.param(["10:30", "10:35"], ["10:03", "10:08", "10:16", "10:24"],
                     id="reaches-an-open-session"),
        # The run's end, 10:32, is within the window; its first three pieces are not.
        pytest.param([], ["10:00", "10:08", "10:16", "10:24", "10:32"],
                     id="ends-within-the-window"),
    ],
)
def test_a_run_that_is_not_late_is_accepted_whole_with_its_pieces_behind_the_watermark(
    spark: SparkSession, tmp_path: Path, first_batch: list[str], late_run: list[str]
) -> None:
    """Rule 2 judges the gap session, before the maximum duration cuts it (as Kafka Streams
    judges a merged session): a run is late whole or not at all, so a late event never
    sets where an accepted run is cut, and the result is the one-batch result."""
    cfg = {"gap": "10m", "grace": "0m", "max_session_duration": "10m"}
    bot = {at: event("bot", at, f"/{at}", event_id=at) for at in first_batch + late_run}
    batches = [[event("x", "10:40")] + [bot[at] for at in first_batch],
               [bot[at] for at in late_run]]
    results = []
    for name, lines in (("one", [[line for b in batches for line in b]]), ("many", batches)):
        lake = str(tmp_path / name)
        reports = run_batches(spark, lake_settings(lake, **cfg), lines)
        assert sum(r.row["late"] for r in reports) == 0
        results.append((
            rows(all_sessions(spark, lake).where("user_id = 'bot'"),
                 "session_start", "event_count"),
            rows(read_table(spark, lake, "sessions"), "session_start"),
        ))
    assert results[0] == results[1]
    sessions, closed = results[1]
    assert [n for _, n in sessions] == ([2, 1, 2, 1] if first_batch else [2, 1, 1, 1])
    assert len(closed) == 3  # the pieces that end with gap to spare before 10:40


def test_watermark_survives_a_new_checkpoint(spark: SparkSession, lake: str) -> None:
    cfg = lake_settings(lake)
    run_batches(spark, cfg, [[event("x", "12:00")]], identity=StreamIdentity("first", 0))
    run_batches(spark, cfg, [[event("u", "10:00")]], identity=StreamIdentity("second", 0))
    assert len(late_reasons(spark, lake)) == 1


def test_a_stream_back_after_another_wrote_the_lake_is_judged_by_the_lakes_watermark(
    spark: SparkSession, lake: str
) -> None:
    """Stream a, then a stream on another checkpoint that moves the watermark on, then a
    again: a's next batch must not start from the watermark its own ledger noted, which
    the other stream's batch has overtaken."""
    cfg = lake_settings(lake)
    a = StreamIdentity("a", 0)
    run_batches(spark, cfg, [[event("x", "10:00")]], identity=a)
    run_batches(spark, cfg, [[event("y", "12:00")]], identity=StreamIdentity("b", 0))
    [report] = run_batches(spark, cfg, [[event("u", "10:30", event_id="u1")]], identity=a,
                             first_batch_id=1)

    assert report.row["watermark_before"] == datetime(2026, 1, 5, 11, 55, tzinfo=UTC)
    assert [event_id for event_id, _ in late_reasons(spark, lake)] == ["u1"]


def at_utc(at: str) -> datetime:
    return hm(at).replace(tzinfo=UTC)


@pytest.mark.parametrize("floor_from", ["ledger", "batch_metrics"])
def test_a_longer_grace_does_not_move_the_watermark_back(
    spark: SparkSession, lake: str, floor_from: str
) -> None:
    """A run with a longer ``--grace`` than the runs before it keeps the watermark they
    reached (the review's case: a at 10:00 closed at W 10:55 with grace 5m; a's 10:20,
    next at 60m, became a second session 20 minutes from it with a 30-minute gap, where
    it is late). Read from the previous batch's ledger note, or from ``batch_metrics``
    when another stream's batch came between (a new stream identity here)."""
    run_batches(spark, lake_settings(lake, grace="5m"),
                [[event("a", "10:00", "/a", event_id="a1"),
                  event("z", "11:00", "/z", event_id="z1")]])
    later = StreamIdentity("test", 0) if floor_from == "ledger" else StreamIdentity("other", 0)
    [report] = run_batches(spark, lake_settings(lake, grace="60m"),
                           [[event("a", "10:20", "/a2", event_id="a2")]], identity=later,
                           first_batch_id=1)
    assert (report.row["watermark_before"], report.row["watermark_after"]) == (
        at_utc("10:55"), at_utc("10:55"))
    [(event_id, reason)] = late_reasons(spark, lake)
    assert event_id == "a2" and reason.startswith("within the gap of closed session")
    assert rows(read_table(spark, lake, "sessions").where("user_id = 'a'"),
                "session_start", "event_count") == [(hm("10:00"), 1)]
    # A shorter grace moves it on at once.
    [report] = run_batches(spark, lake_settings(lake, grace="1m"),
                           [[event("z", "11:30", "/z", event_id="z2")]], identity=later,
                           first_batch_id=2)
    assert report.row["watermark_after"] == at_utc("11:29")


def test_the_watermark_is_carried_in_the_ledger_and_read_from_batch_metrics_without_it(
    spark: SparkSession, lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch starts from the previous batch's ledger note; a batch with no such note (the
    first after a restore: a new epoch), or after another commit to ``batch_metrics``, from
    ``batch_metrics``, where both agree."""
    from sessionlake import ledger
    from sessionlake.ledger import ledger_uri, max_event_time_before, previous_entry
    from sessionlake.storage import delete

    cfg = lake_settings(lake)
    identity = StreamIdentity("ledger", 0)
    run_batches(spark, cfg, [[event("x", "12:00")], [event("y", "11:00")]], identity=identity)
    version = table_version(spark, lake, BATCH_METRICS)
    previous = previous_entry(spark, cfg, identity, 2)
    noted = max_event_time_before(spark, cfg, previous, version)
    assert noted is not None and noted.isoformat() == "2026-01-05T12:00:00+00:00"
    # The note is not trusted once another commit came after the previous batch's row.
    reads: list[str] = []

    def read_table_noted(spark: SparkSession, lake: str, table: str,
                         version: int | None = None) -> DataFrame:
        reads.append(table)
        return read_table(spark, lake, table, version)

    monkeypatch.setattr(ledger, "read_table", read_table_noted)
    assert max_event_time_before(spark, cfg, previous, version) == noted
    assert reads == []
    read_earlier = {**previous["table_versions"], BATCH_METRICS: version - 2}
    assert max_event_time_before(spark, cfg, {**previous, "table_versions": read_earlier},
                                 version) == noted
    assert reads == [BATCH_METRICS]
    # Without the note, the maximum over batch_metrics gives the same instant.
    delete(spark, ledger_uri(cfg, identity, 1))
    assert max_event_time_before(spark, cfg, previous_entry(spark, cfg, identity, 2),
                                 version) == noted
    new_epoch = previous_entry(spark, cfg, StreamIdentity("ledger", 1), 2)
    assert new_epoch == {}
    assert max_event_time_before(spark, cfg, new_epoch, version) == noted


def test_a_new_lakes_first_batch_starts_without_a_watermark_and_without_a_query(
    spark: SparkSession, lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """batch_metrics has only its creation: nothing to take the maximum of, and no reason
    to load its snapshot (3 s of a new lake's first batch, cold)."""
    from sessionlake import ledger
    from sessionlake.tables import ensure_tables

    ensure_tables(spark, lake)

    def no_query(*args: object, **kwargs: object) -> None:
        raise AssertionError("batch_metrics was queried")

    monkeypatch.setattr(ledger, "read_table", no_query)
    assert ledger.max_event_time_before(spark, lake_settings(lake), {}, 0) is None


def test_the_open_session_count_is_carried_in_the_ledger_for_the_next_batch(
    spark: SparkSession, lake: str
) -> None:
    """The next batch sizes its code generation by it; the first batch of a stream or of a
    restore epoch has no note and counts none."""
    from sessionlake.ledger import open_sessions_estimate, previous_entry

    cfg = lake_settings(lake)
    identity = StreamIdentity("ledger", 0)
    reports = run_batches(spark, cfg, [[event("x", "12:00"), event("y", "12:01")],
                                       [event("z", "12:02")]], identity=identity)
    assert [r.row["open_sessions"] for r in reports] == [2, 3]
    assert [open_sessions_estimate(previous_entry(spark, cfg, identity, b))
            for b in (0, 1, 2)] == [0, 2, 3]
    assert open_sessions_estimate(previous_entry(spark, cfg, StreamIdentity("ledger", 1),
                                                 2)) == 0


def test_a_batch_reads_each_ledger_entry_once(
    spark: SparkSession, lake: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous batch's: its watermark, open-session counts and id bound come from the
    one read. On an object store every read of an entry is a request."""
    from sessionlake import storage
    from sessionlake.ledger import ledger_uri, read_ledger

    cfg = lake_settings(lake)
    identity = StreamIdentity("ledger", 0)
    run_batches(spark, cfg, [[event("x", "12:00")]], identity=identity)
    reads: list[str] = []
    read_text = storage.read_text

    def recording(spark: SparkSession | None, uri: str) -> str | None:
        reads.append(uri)
        return read_text(spark, uri)

    monkeypatch.setattr(storage, "read_text", recording)
    [report] = run_batches(spark, cfg, [[event("x", "12:01")]], identity=identity,
                           first_batch_id=1)
    assert report.row["open_sessions"] == 1
    assert reads.count(ledger_uri(cfg, identity, 0)) == 1
    # Its own entry is read once too, to tell a replay from a new batch; marking it done
    # completes the entry it recorded.
    assert reads.count(ledger_uri(cfg, identity, 1)) == 1
    assert (read_ledger(spark, cfg, identity, 1) or {}).get("done") is True


@pytest.mark.parametrize(("outside_write", "keys"), [(False, "named"), (True, "joined")])
def test_the_open_session_count_follows_the_table(
    spark: SparkSession, lake: str, outside_write: bool, keys: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each batch's ``open_sessions`` figure is the table's row count after it, whether it
    comes from the previous count and the MERGE's metrics or, after another writer changed
    the table between two batches, from counting it. The MERGEs (extensions, and sessions
    of users outside the batch that close) run with their session ids named in one case
    and joined in the other (``state.names_session_ids``)."""
    monkeypatch.setattr(state, "STATE_ROWS_PER_LITERAL", 0 if keys == "named" else 10**9)
    cfg = lake_settings(lake)
    identity = StreamIdentity("counts", 0)
    batches = [
        [event("a", "10:00"), event("b", "10:05"), event("c", "10:10")],   # 3 open
        [event("a", "10:20"), event("d", "10:25")],                        # extend a, open d
        [event("e", "11:30")],                                             # W 11:25 closes a-d
        [event("f", "11:31"), event("e", "11:40")],
    ]
    reports = run_batches(spark, cfg, batches[:2], identity=identity)
    if outside_write:  # say, an erasure of user b between two batches
        DeltaTable.forPath(spark, table_path(lake, "open_sessions")).delete("user_id = 'b'")
    reports += run_batches(spark, cfg, batches[2:], identity=identity, first_batch_id=2)
    figures = [r.row["open_sessions"] for r in reports]
    assert figures[:3] == [3, 4, 1]
    assert figures[-1] == read_table(spark, lake, "open_sessions").count() == 2


def test_conservation(spark: SparkSession, lake: str) -> None:
    cfg = lake_settings(lake)
    batches = [
        [event("u", "10:00", event_id="a"), event("u", "10:05", event_id="a"), "garbage",
         event("v", "10:10"), json.dumps({"user_id": "", "event_time": "2026-01-05T10:00:00Z"})],
        [event("x", "12:00"), event("w", "09:00"), event("u", "10:20", event_id="b")],
        [event("u", "10:20", event_id="b"), event("y", "12:40"), "[1, 2]"],
    ]
    reports = run_batches(spark, cfg, batches)
    metrics = [r.row for r in reports]
    inputs = sum(len(b) for b in batches)
    assert sum(m["input_records"] for m in metrics) == inputs
    in_sessions = first(all_sessions(spark, lake).agg(F.sum("event_count")))[0]
    late = read_table(spark, lake, "late_events").count()
    quarantined = read_table(spark, lake, "quarantine").count()
    duplicates = sum(m["duplicates"] for m in metrics)
    assert (in_sessions, late, quarantined, duplicates) == (5, 1, 3, 2)
    assert inputs == in_sessions + late + quarantined + duplicates
    assert sum(m["accepted"] for m in metrics) == read_table(spark, lake, "events").count()
    # Every file the batches appended is listed: the idle tasks of an append wrote empty
    # Parquet files, which Delta leaves unlisted until a VACUUM. (The MERGE replaces
    # files of open_sessions: those it replaced are unlisted, rightly.)
    for table in set(STREAM_TABLES) - {"open_sessions"}:
        state_ = read_state(table_path(lake, table))
        written = set(Path(table_path(lake, table)).rglob("part-*.parquet"))
        assert written == {state_.file_path(f) for f in state_.files}, table


def _stage_names(spark: SparkSession, since: set[int]) -> set[str]:
    """The names of the stages of the Spark jobs (of no job group) started after ``since``."""
    tracker = spark.sparkContext.statusTracker()
    jobs = (tracker.getJobInfo(job) for job in set(tracker.getJobIdsForGroup(None)) - since)
    stages = (tracker.getStageInfo(stage) for info in jobs if info is not None
              for stage in info.stageIds)
    return {info.name for info in stages if info is not None}


def test_a_batchs_spark_jobs_are_named_for_what_it_does(spark: SparkSession, lake: str) -> None:
    """The Spark UI lists a batch's jobs, and the long-batch alert its stages, by the
    batch and what it was doing (``sessionlake batch 1: sessionize``), not after py4j's
    ``NativeMethodAccessorImpl.java:0``; the threads that write name theirs by table, and
    no name outlives the batch: the thread's own description (a streaming query's) is
    its again after."""
    cfg = lake_settings(lake)
    run_batches(spark, cfg, [[event("u1", "10:00")]])
    context = spark.sparkContext
    tracker = context.statusTracker()
    before = set(tracker.getJobIdsForGroup(None))
    frame = lines_frame(spark, [event("u1", "10:05"), event("u2", "10:06"), "not json"],
                        "b1.jsonl")
    context.setJobDescription("the stream's batch 1")
    try:
        batch.process_lines(spark, frame, 1, cfg, StreamIdentity("test", 0), lambda: NOW)
        assert context.getLocalProperty("spark.job.description") == "the stream's batch 1"
    finally:
        context._jsc.setJobDescription(None)
    names = _stage_names(spark, before)
    assert {name.removeprefix("sessionlake batch 1: ") for name in names} >= {
        "parse", "sessionize", "classify", "append events", "append quarantine",
        "append session_changelog", "merge open_sessions", "metrics"}, names
    assert all(name.startswith("sessionlake batch 1: ") for name in names), names

    after = set(tracker.getJobIdsForGroup(None))
    spark.range(1).localCheckpoint(eager=True)  # as the batch's own jobs start: from py4j
    later = _stage_names(spark, after)
    assert later and all(name.startswith("localCheckpoint at ") for name in later), later


@pytest.mark.parametrize("ledger", ["current", "without table_versions (older release)"])
def test_a_batch_applied_twice_changes_nothing(
    spark: SparkSession, lake: str, ledger: str
) -> None:
    cfg = lake_settings(lake)
    batch = [event("u", "10:00"), event("v", "11:00"), "not json"]
    identity = StreamIdentity("twice", 0)
    assert not run_batches(spark, cfg, [batch], identity=identity)[0].resumed
    versions = {t: table_version(spark, lake, t) for t in PUBLIC_TABLES}

    # The same batch again, as after a crash right after its last write: the ledger entry
    # is there but not marked done, so every write looks for its tagged commit, finds it
    # and is skipped.
    path = Path(cfg.checkpoint.removeprefix("file:")) / "ledger" / "twice-0-0.json"
    entry = {**json.loads(path.read_text()), "done": False}
    if ledger != "current":
        del entry["table_versions"]
    path.write_text(json.dumps(entry))
    assert run_batches(spark, cfg, [batch], identity=identity)[0].resumed

    assert {t: table_version(spark, lake, t) for t in PUBLIC_TABLES} == versions  # no commit


def _rdds_with_blocks(spark: SparkSession) -> dict[int, str]:
    """The RDDs whose blocks the block managers hold now, by id, with their names."""
    return {info.id(): str(info.name())
            for info in spark.sparkContext._jsc.sc().getRDDStorageInfo()}


def test_a_batch_frees_the_blocks_of_its_frames(spark: SparkSession, lake: str) -> None:
    """The frames a batch materialized are gone from the block managers once it returns:
    kept, every batch's would pile up in a long run's memory. (That the batch waits for
    their removal shows only at scale, where a removal still running at Spark's shutdown
    printed stack traces: see ``batch.release``.)"""
    cfg = lake_settings(lake)
    newest = spark.range(1).rdd.id()  # RDD ids grow: the batch's are greater
    run_batches(spark, cfg, [[event("u1", "10:00"), event("u2", "10:01")],
                             [event("u1", "10:05"), event("u3", "10:06")]])
    kept = {rdd: name for rdd, name in _rdds_with_blocks(spark).items()
            if rdd > newest and not name.startswith("Delta Table State")}
    assert kept == {}

"""Backfill: a date range of ``sessions`` re-cut from ``events``, replaced atomically.

One small lake is built by the stream once per module (gap 30m); every test works on a
copy of it. The events, by user (UTC):

* ``e`` 01-04 12:00: a session before the range.
* ``b`` 01-04 23:50, 01-05 00:10, 00:30 (a session that starts the day before the range and
  runs into it), then 01-05 01:05 (35 minutes later: its own session, in the range).
* ``a`` 01-05 10:00, 10:08, 10:25 | 11:00, 11:05.
* ``f`` 01-06 14:00, 14:20 | 14:50 (exactly 30 minutes later: a new session).
* ``c`` 01-06 23:45, 01-07 00:05, 00:20 (starts on the range's last day, ends after it).
* ``d`` 01-07 05:00, 05:10 | 09:00, 09:20: the last one is still open (watermark 09:15).

The range is 01-05..01-06: six closed sessions, twelve events.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionlake.backfill import BackfillError, backfill_sessions, in_range
from sessionlake.config import Settings, settings_from
from sessionlake.tables import (
    EVENTS,
    OPEN_SESSIONS,
    SESSION_CHANGELOG,
    SESSIONS,
    read_table,
    table_path,
    table_version,
)
from tests.helpers import all_sessions, event, rows, run_batches

FIRST, LAST = date(2026, 1, 5), date(2026, 1, 6)

STREAM_EVENTS = [
    event("e", "2026-01-04T12:00:00Z", "/e1"),
    event("b", "2026-01-04T23:50:00Z", "/b1"),
    event("b", "2026-01-05T00:10:00Z", "/b2"),
    event("b", "2026-01-05T00:30:00Z", "/b3"),
    event("b", "2026-01-05T01:05:00Z", "/b4"),
    event("a", "2026-01-05T10:00:00Z", "/a1"),
    event("a", "2026-01-05T10:08:00Z", "/a2"),
    event("a", "2026-01-05T10:25:00Z", "/a3"),
    event("a", "2026-01-05T11:00:00Z", "/a4"),
    event("a", "2026-01-05T11:05:00Z", "/a5"),
    event("f", "2026-01-06T14:00:00Z", "/f1"),
    event("f", "2026-01-06T14:20:00Z", "/f2"),
    event("f", "2026-01-06T14:50:00Z", "/f3"),
    event("c", "2026-01-06T23:45:00Z", "/c1"),
    event("c", "2026-01-07T00:05:00Z", "/c2"),
    event("c", "2026-01-07T00:20:00Z", "/c3"),
    event("d", "2026-01-07T05:00:00Z", "/d1"),
    event("d", "2026-01-07T05:10:00Z", "/d2"),
    event("d", "2026-01-07T09:00:00Z", "/d3"),
    event("d", "2026-01-07T09:20:00Z", "/d4"),
]

#: (user, start, end, events, entry page, exit page, session date) of a session.
Key = tuple[str, datetime, datetime, int, str, str, date]
KEY_COLUMNS = ("user_id", "session_start", "session_end", "event_count", "entry_page",
               "exit_page", "session_date")


def t(day: int, at: str) -> datetime:
    """A naive UTC time on 2026-01-``day`` (as Spark returns timestamps)."""
    hours, minutes = (int(x) for x in at.split(":"))
    return datetime(2026, 1, day, hours, minutes)


def s(user: str, day: int, start: str, end: str, count: int, entry: str, exit_: str,
      end_day: int | None = None) -> Key:
    """One expected session; it ends on ``end_day`` when that is given."""
    return (user, t(day, start), t(end_day or day, end), count, entry, exit_,
            date(2026, 1, day))


#: The stream's sessions of the range (gap 30m).
STREAM_RANGE = [
    s("a", 5, "10:00", "10:25", 3, "/a1", "/a3"),
    s("a", 5, "11:00", "11:05", 2, "/a4", "/a5"),
    s("b", 5, "01:05", "01:05", 1, "/b4", "/b4"),
    s("c", 6, "23:45", "00:20", 3, "/c1", "/c3", end_day=7),
    s("f", 6, "14:00", "14:20", 2, "/f1", "/f2"),
    s("f", 6, "14:50", "14:50", 1, "/f3", "/f3"),
]


def settings(lake: str, **values: object) -> Settings:
    return settings_from({"lake": lake, **values}, env={})


@pytest.fixture(scope="module")
def stream_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The lake the stream made of ``STREAM_EVENTS`` (one micro-batch, gap 30m)."""
    lake = str(tmp_path_factory.mktemp("backfill") / "lake")
    run_batches(spark, settings(lake), [STREAM_EVENTS])
    return lake


@pytest.fixture
def lake_copy(stream_lake: str, tmp_path: Path) -> str:
    """A private copy of the stream's lake (Delta tables are plain folders)."""
    target = tmp_path / "lake"
    shutil.copytree(stream_lake, target)
    return str(target)


def sessions(spark: SparkSession, lake: str) -> DataFrame:
    return read_table(spark, lake, SESSIONS)


def keys(frame: DataFrame) -> list[tuple[Any, ...]]:
    return rows(frame, *KEY_COLUMNS)


def versions(spark: SparkSession, lake: str) -> dict[str, int]:
    return {table: table_version(spark, lake, table)
            for table in (SESSIONS, SESSION_CHANGELOG, OPEN_SESSIONS, EVENTS)}


def backfill_log(spark: SparkSession, lake: str) -> DataFrame:
    return read_table(spark, lake, SESSION_CHANGELOG).where("batch_id = -1")


def sessions_per_event(spark: SparkSession, lake: str) -> dict[str, int]:
    """How many sessions (closed or open) hold each accepted event, by page."""
    held = read_table(spark, lake, EVENTS).alias("e").join(
        all_sessions(spark, lake).alias("s"),
        (F.col("e.user_id") == F.col("s.user_id"))
        & F.col("e.event_time").between(F.col("s.session_start"), F.col("s.session_end")),
        "left",
    ).groupBy("e.page").agg(F.count("s.session_id").alias("n"))
    return {page: n for page, n in rows(held)}


def overlapping(old: Sequence[Any], user: str, start: datetime, end: datetime) -> list[str]:
    """Ids of the replaced sessions of ``user`` whose span overlaps ``start``..``end``."""
    return sorted(r["session_id"] for r in old
                  if r["user_id"] == user and r["session_start"] <= end
                  and r["session_end"] >= start)


@pytest.mark.parametrize(
    ("gap", "in_range", "spilled"),
    [
        pytest.param("30m", STREAM_RANGE, [], id="stream-gap"),
        pytest.param("10m", [
            s("a", 5, "10:00", "10:08", 2, "/a1", "/a2"),
            s("a", 5, "10:25", "10:25", 1, "/a3", "/a3"),
            s("a", 5, "11:00", "11:05", 2, "/a4", "/a5"),
            s("b", 5, "01:05", "01:05", 1, "/b4", "/b4"),
            s("c", 6, "23:45", "23:45", 1, "/c1", "/c1"),
            s("f", 6, "14:00", "14:00", 1, "/f1", "/f1"),
            s("f", 6, "14:20", "14:20", 1, "/f2", "/f2"),
            s("f", 6, "14:50", "14:50", 1, "/f3", "/f3"),
        ], [
            # c's session started on the last day; its later pieces start the day after.
            s("c", 7, "00:05", "00:05", 1, "/c2", "/c2"),
            s("c", 7, "00:20", "00:20", 1, "/c3", "/c3"),
        ], id="shorter-gap"),
        pytest.param("45m", [
            s("a", 5, "10:00", "11:05", 5, "/a1", "/a5"),
            # b's 01:05 event stays on its own: the session it would now join starts
            # before the range and is kept as it is.
            s("b", 5, "01:05", "01:05", 1, "/b4", "/b4"),
            s("c", 6, "23:45", "00:20", 3, "/c1", "/c3", end_day=7),
            s("f", 6, "14:00", "14:50", 3, "/f1", "/f3"),
        ], [], id="longer-gap"),
    ],
)
def test_backfill_replaces_the_range_once_and_only_the_range(
    spark: SparkSession, lake_copy: str, gap: str, in_range: list[Key], spilled: list[Key]
) -> None:
    lake = lake_copy
    cfg = settings(lake, gap=gap)
    before = sessions(spark, lake).collect()
    outside_before = rows(sessions(spark, lake).where(~in_range_of_test()))
    assert keys(sessions(spark, lake).where(in_range_of_test())) == STREAM_RANGE

    report = backfill_sessions(spark, cfg, FIRST, LAST)

    after = sessions(spark, lake)
    assert keys(after.where(in_range_of_test())) == in_range
    written = after.where("closed_batch_id = -1")
    assert keys(written.where(~in_range_of_test())) == spilled
    # Every other session is untouched, to the last column (b's session from the day
    # before included: not replaced, not duplicated).
    assert rows(after.where(~in_range_of_test() & (F.col("closed_batch_id") != -1))) \
        == outside_before
    assert rows(written, "gap_s") == [(cfg.gap.total_seconds(),)] * (len(in_range)
                                                                      + len(spilled))
    assert set(sessions_per_event(spark, lake).values()) == {1}
    if gap == "30m":  # the stream's own gap: the stream's sessions, ids and all
        def same(frame: DataFrame) -> list[tuple[Any, ...]]:
            return rows(frame.drop("closed_batch_id", "closed_at"))
        assert same(after) == same(spark.createDataFrame(before, after.schema))

    # One changelog row per written session, naming the sessions it replaced.
    old = [r for r in before if FIRST <= r["session_date"] <= LAST]
    logged = rows(backfill_log(spark, lake), "user_id", "session_start", "session_end",
                  "change", "added_events", "previous_session_ids")
    assert logged == sorted(
        (user, start, end, "backfill", count, overlapping(old, user, start, end))
        for user, start, end, count, *_ in in_range + spilled
    )
    assert (report.sessions_before, report.sessions_after, report.spilled,
            report.events_read, report.open_left) == (
        6, len(in_range), len(spilled), 12, 0)
    assert not report.already_applied and report.sessions_version is not None
    summary = report.summary()
    assert "\n" not in summary
    assert f"2026-01-05..2026-01-06 gap {gap}" in summary
    assert f"6 -> {len(in_range)}" in summary

    # Idempotent: a second run finds the range already backfilled and writes nothing.
    written_before = versions(spark, lake)
    table_rows = rows(sessions(spark, lake))
    again = backfill_sessions(spark, cfg, FIRST, LAST)
    assert again.already_applied
    assert rows(sessions(spark, lake)) == table_rows
    assert backfill_log(spark, lake).count() == len(in_range) + len(spilled)
    assert versions(spark, lake) == written_before


def in_range_of_test() -> Any:
    return in_range(FIRST, LAST)


def test_open_sessions_are_left_to_the_stream_and_counted_once(
    spark: SparkSession, lake_copy: str
) -> None:
    lake = lake_copy
    cfg = settings(lake)
    open_before = rows(read_table(spark, lake, OPEN_SESSIONS))
    day = date(2026, 1, 7)

    report = backfill_sessions(spark, cfg, day, day)

    # d's closed session of the day is re-cut; its open one stays in the stream's state.
    assert report.open_left == 1
    assert (report.sessions_before, report.sessions_after) == (1, 1)
    assert keys(sessions(spark, lake).where(F.col("session_date") == F.lit(day))) == [
        s("d", 7, "05:00", "05:10", 2, "/d1", "/d2"),
    ]
    assert rows(read_table(spark, lake, OPEN_SESSIONS)) == open_before

    # Later the watermark passes it: the stream closes it, and it is there once.
    run_batches(spark, cfg, [[event("x", "2026-01-07T12:00:00Z", "/x1")]], first_batch_id=1)
    assert keys(sessions(spark, lake).where("user_id = 'd'")) == [
        s("d", 7, "05:00", "05:10", 2, "/d1", "/d2"),
        s("d", 7, "09:00", "09:20", 2, "/d3", "/d4"),
    ]
    assert set(sessions_per_event(spark, lake).values()) == {1}


@pytest.mark.parametrize(
    ("first", "last", "lake_kind", "message"),
    [
        pytest.param(LAST, FIRST, "stream", "is after --to", id="from-after-to"),
        pytest.param(FIRST, LAST, "missing", "sessionlake run", id="no-lake"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    spark: SparkSession, stream_lake: str, tmp_path: Path,
    first: date, last: date, lake_kind: str, message: str,
) -> None:
    lake = stream_lake if lake_kind == "stream" else str(tmp_path / "nowhere")
    known = versions(spark, stream_lake)
    with pytest.raises(BackfillError, match=message):
        backfill_sessions(spark, settings(lake), first, last)
    assert versions(spark, stream_lake) == known
    assert not Path(tmp_path / "nowhere").exists()


@pytest.mark.parametrize(
    ("erased", "example"),
    [
        pytest.param("/a2", "user a from 2026-01-05T10:00:00Z has 2 of its 3 events",
                     id="some-events-of-a-session"),
        pytest.param("/b4", "user b from 2026-01-05T01:05:00Z has 0 of its 1 events",
                     id="all-events-of-a-session"),
    ],
)
def test_incomplete_events_are_refused_before_anything_is_written(
    spark: SparkSession, lake_copy: str, erased: str, example: str
) -> None:
    lake = lake_copy
    DeltaTable.forPath(spark, table_path(lake, EVENTS)).delete(F.col("page") == erased)
    known = versions(spark, lake)
    with pytest.raises(BackfillError, match="events missing") as refused:
        backfill_sessions(spark, settings(lake), FIRST, LAST)
    assert example in str(refused.value)
    assert versions(spark, lake) == known

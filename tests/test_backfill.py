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
from collections.abc import Iterable, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.sql import Row, SparkSession
from pyspark.sql import functions as F

from sessionlake import backfill
from sessionlake.backfill import BACKFILL_STEPS, BackfillError, backfill_sessions
from sessionlake.config import Settings
from sessionlake.retention import RetentionRequest, enforce_retention
from sessionlake.stream import check_session_rules_unchanged
from sessionlake.tables import (
    EVENTS,
    OPEN_SESSIONS,
    SESSION_CHANGELOG,
    SESSIONS,
    read_table,
    table_path,
    table_version,
)
from tests.helpers import event, lake_settings, run_batches

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


@pytest.fixture(scope="module")
def stream_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The lake the stream made of ``STREAM_EVENTS`` (one micro-batch, gap 30m)."""
    lake = str(tmp_path_factory.mktemp("backfill") / "lake")
    run_batches(spark, lake_settings(lake), [STREAM_EVENTS])
    return lake


@pytest.fixture
def lake_copy(stream_lake: str, tmp_path: Path) -> str:
    """A private copy of the stream's lake (Delta tables are plain folders)."""
    target = tmp_path / "lake"
    shutil.copytree(stream_lake, target)
    return str(target)


def table(spark: SparkSession, lake: str, name: str) -> list[Row]:
    """All rows of a table (the tables of these tests are tiny: one Spark job)."""
    return read_table(spark, lake, name).collect()


def key(row: Row) -> tuple[Any, ...]:
    return tuple(row[c] for c in KEY_COLUMNS)


def keys(found: Iterable[Row]) -> list[tuple[Any, ...]]:
    return sorted(key(r) for r in found)


def everything(found: Iterable[Row], *dropped: str) -> list[tuple[Any, ...]]:
    """Whole rows, sorted, without the ``dropped`` columns."""
    return sorted(tuple(v for c, v in r.asDict().items() if c not in dropped) for r in found)


def in_range(row: Row) -> bool:
    return bool(FIRST <= row["session_date"] <= LAST)


def versions(spark: SparkSession, lake: str) -> dict[str, int]:
    return {name: table_version(spark, lake, name)
            for name in (SESSIONS, SESSION_CHANGELOG, OPEN_SESSIONS, EVENTS)}


def sessions_per_event(spark: SparkSession, lake: str, closed: Sequence[Row]) -> list[int]:
    """How many sessions (closed or open) hold each accepted event."""
    held = [*closed, *table(spark, lake, OPEN_SESSIONS)]
    return [
        sum(1 for h in held if h["user_id"] == e["user_id"]
            and h["session_start"] <= e["event_time"] <= h["session_end"])
        for e in table(spark, lake, EVENTS)
    ]


def overlapping(old: Sequence[Row], user: str, start: datetime, end: datetime) -> list[str]:
    """Ids of the replaced sessions of ``user`` whose span overlaps ``start``..``end``."""
    return sorted(r["session_id"] for r in old
                  if r["user_id"] == user and r["session_start"] <= end
                  and r["session_end"] >= start)


@pytest.mark.parametrize(
    ("gap", "expected", "spilled", "rerun"),
    [
        pytest.param("30m", STREAM_RANGE, [], True, id="stream-gap"),
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
        ], True, id="shorter-gap"),
        pytest.param("45m", [
            s("a", 5, "10:00", "11:05", 5, "/a1", "/a5"),
            # b's 01:05 event stays on its own: the session it would now join starts
            # before the range and is kept as it is.
            s("b", 5, "01:05", "01:05", 1, "/b4", "/b4"),
            s("c", 6, "23:45", "00:20", 3, "/c1", "/c3", end_day=7),
            s("f", 6, "14:00", "14:50", 3, "/f1", "/f3"),
        ], [], False, id="longer-gap"),
    ],
)
def test_backfill_replaces_the_range_once_and_only_the_range(
    spark: SparkSession, lake_copy: str, gap: str, expected: list[Key], spilled: list[Key],
    rerun: bool,
) -> None:
    lake = lake_copy
    cfg = lake_settings(lake, gap=gap)
    before = table(spark, lake, SESSIONS)
    old = [r for r in before if in_range(r)]
    assert keys(old) == STREAM_RANGE

    report = backfill_sessions(spark, cfg, FIRST, LAST)

    after = table(spark, lake, SESSIONS)
    written = [r for r in after if r["closed_batch_id"] == -1]
    assert keys(r for r in after if in_range(r)) == expected
    assert keys(r for r in written if not in_range(r)) == spilled
    assert {r["gap_s"] for r in written} == {cfg.gap.total_seconds()}
    # Every other session is untouched, to the last column (b's session from the day
    # before included: not replaced, not duplicated).
    assert everything(r for r in after if r not in written) \
        == everything(r for r in before if not in_range(r))
    assert set(sessions_per_event(spark, lake, after)) == {1}
    if gap == "30m":  # the stream's own gap gives the stream's sessions, ids and all
        assert everything(after, "closed_batch_id", "closed_at") \
            == everything(before, "closed_batch_id", "closed_at")

    # One changelog row per written session, naming the sessions it replaced.
    logged = [r for r in table(spark, lake, SESSION_CHANGELOG) if r["batch_id"] == -1]
    assert sorted(
        (r["user_id"], r["session_start"], r["session_end"], r["change"], r["added_events"],
         r["previous_session_ids"]) for r in logged
    ) == sorted(
        (user, start, end, "backfill", count, overlapping(old, user, start, end))
        for user, start, end, count, *_ in expected + spilled
    )
    assert (report.sessions_before, report.sessions_after, report.spilled,
            report.events_read, report.open_left) == (
        6, len(expected), len(spilled), 12, 0)
    assert not report.already_applied and report.sessions_version is not None
    summary = report.summary()
    assert "\n" not in summary
    assert f"2026-01-05..2026-01-06 gap {gap}" in summary
    assert f"6 -> {len(expected)}" in summary

    if rerun:  # idempotent: the range is already backfilled, nothing is written again
        known = versions(spark, lake)
        again = backfill_sessions(spark, cfg, FIRST, LAST)
        assert again.already_applied
        assert versions(spark, lake) == known
        assert everything(table(spark, lake, SESSIONS)) == everything(after)


STAMP = datetime(2026, 1, 8, 12, 0, 0, 123456, tzinfo=UTC)


def test_the_line_counts_the_sessions_its_commit_replaced(
    spark: SparkSession, lake_copy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The concurrency review: a stream closed sessions of the range between the
    backfill's first look and its commit, and the line said "557 -> 919" for 732
    sessions replaced."""
    lake = lake_copy
    real = backfill.recut_sessions

    def after_a_stream_commit(*args: Any, **kwargs: Any) -> Any:
        # A session the stream closes meanwhile (a copy of one of the range, another id).
        one = read_table(spark, lake, SESSIONS).where(backfill.in_range(FIRST, LAST)).limit(1)
        one.withColumn("session_id", F.concat("session_id", F.lit("-again"))).write.format(
            "delta").mode("append").save(table_path(lake, SESSIONS))
        monkeypatch.setattr(backfill, "recut_sessions", real)
        return real(*args, **kwargs)

    monkeypatch.setattr(backfill, "recut_sessions", after_a_stream_commit)
    report = backfill_sessions(spark, lake_settings(lake, gap="45m"), FIRST, LAST)
    assert report.sessions_before == len(STREAM_RANGE) + 1, report.summary()
    assert report.summary().startswith(
        f"backfill 2026-01-05..2026-01-06 gap 45m: sessions in range {len(STREAM_RANGE) + 1} ->")


@pytest.mark.parametrize(
    ("day", "closed_batch_id", "closed_at", "replaced"),
    [
        pytest.param(4, -1, STAMP, False, id="before-the-range"),
        pytest.param(5, 3, STAMP, True, id="first-day"),
        pytest.param(6, -1, datetime(2026, 1, 1, tzinfo=UTC), True, id="last-day"),
        pytest.param(7, -1, STAMP, True, id="spilled-by-this-backfill"),
        pytest.param(7, -1, STAMP + timedelta(microseconds=1), False,
                     id="earlier-backfill-after-the-range"),
        pytest.param(7, 3, STAMP, False, id="stream-session-after-the-range"),
    ],
)
def test_the_overwrite_condition_names_the_range_and_this_backfills_spill(
    spark: SparkSession, day: int, closed_batch_id: int, closed_at: datetime, replaced: bool
) -> None:
    row = spark.createDataFrame(
        [(date(2026, 1, day), closed_batch_id, closed_at)],
        "session_date date, closed_batch_id long, closed_at timestamp",
    )
    found = row.where(backfill.replace_predicate(FIRST, LAST, STAMP)).count()
    assert found == (1 if replaced else 0)


def test_open_sessions_are_left_to_the_stream_and_counted_once(
    spark: SparkSession, lake_copy: str
) -> None:
    lake = lake_copy
    cfg = lake_settings(lake)
    open_before = everything(table(spark, lake, OPEN_SESSIONS))
    day = date(2026, 1, 7)

    report = backfill_sessions(spark, cfg, day, day)

    # d's closed session of the day is re-cut; its open one stays in the stream's state.
    assert report.open_left == 1
    assert (report.sessions_before, report.sessions_after) == (1, 1)
    assert "1 open session(s) in range left to the stream" in report.summary()
    assert keys(r for r in table(spark, lake, SESSIONS) if r["session_date"] == day) == [
        s("d", 7, "05:00", "05:10", 2, "/d1", "/d2"),
    ]
    assert everything(table(spark, lake, OPEN_SESSIONS)) == open_before

    # Later the watermark passes it: the stream closes it, and it is there once.
    run_batches(spark, cfg, [[event("x", "2026-01-07T12:00:00Z", "/x1")]], first_batch_id=1)
    closed = table(spark, lake, SESSIONS)
    assert keys(r for r in closed if r["user_id"] == "d") == [
        s("d", 7, "05:00", "05:10", 2, "/d1", "/d2"),
        s("d", 7, "09:00", "09:20", 2, "/d3", "/d4"),
    ]
    assert set(sessions_per_event(spark, lake, closed)) == {1}


@pytest.mark.parametrize(
    ("first", "last", "lake_kind", "message"),
    [
        pytest.param(LAST, FIRST, "stream", "is after --to", id="from-after-to"),
        pytest.param(FIRST, LAST, "missing", "sessionlake run", id="no-lake"),
        # A stack trace each, after the JVM started (a review).
        pytest.param(date(1, 1, 1), LAST, "stream", r"^--from 0001-01-01 is out of range: "
                     "give a day from 1900-01-01 to 9999-12-30$", id="year-1"),
        pytest.param(FIRST, date(9999, 12, 31), "stream", "^--to 9999-12-31 is out of range",
                     id="the-last-day"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    spark: SparkSession, stream_lake: str, tmp_path: Path,
    first: date, last: date, lake_kind: str, message: str,
) -> None:
    lake = stream_lake if lake_kind == "stream" else str(tmp_path / "nowhere")
    known = versions(spark, stream_lake)
    with pytest.raises(BackfillError, match=message):
        backfill_sessions(spark, lake_settings(lake), first, last)
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
        backfill_sessions(spark, lake_settings(lake), FIRST, LAST)
    assert example in str(refused.value)
    assert versions(spark, lake) == known


def crash_between_the_two_writes(spark: SparkSession, cfg: Settings,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A backfill killed after its ``sessions`` commit, before its changelog append."""
    def killed(*_: object) -> None:
        raise RuntimeError("killed after the sessions commit")

    monkeypatch.setattr(backfill, "_changelog_rows", killed)
    with pytest.raises(RuntimeError, match="killed"):
        backfill_sessions(spark, cfg, FIRST, LAST)
    monkeypatch.undo()


def test_a_crash_between_the_two_writes_is_repaired_by_running_again(
    spark: SparkSession, lake_copy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = lake_copy
    cfg = lake_settings(lake, gap="45m")
    old = [r for r in table(spark, lake, SESSIONS) if in_range(r)]
    crash_between_the_two_writes(spark, cfg, monkeypatch)
    replaced = table(spark, lake, SESSIONS)
    assert {r["closed_batch_id"] for r in replaced if in_range(r)} == {-1}
    assert not [r for r in table(spark, lake, SESSION_CHANGELOG) if r["batch_id"] == -1]

    report = backfill_sessions(spark, cfg, FIRST, LAST)

    assert report.already_applied and report.changelog_version is not None
    assert everything(table(spark, lake, SESSIONS)) == everything(replaced)
    logged = [r for r in table(spark, lake, SESSION_CHANGELOG) if r["batch_id"] == -1]
    # The changed_at of the rows is the closed_at of the commit they describe, and the
    # lineage is that of the first attempt (the stream's sessions it replaced).
    assert {r["changed_at"] for r in logged} == {r["closed_at"] for r in replaced
                                                if in_range(r)}
    assert sorted((r["session_id"], r["previous_session_ids"]) for r in logged) == sorted(
        (r["session_id"], overlapping(old, r["user_id"], r["session_start"], r["session_end"]))
        for r in replaced if in_range(r)
    )


@pytest.mark.parametrize("when", ["between the two writes", "before a rerun after a crash"])
def test_a_user_erased_during_a_backfill_gets_no_changelog_row_back(
    spark: SparkSession, lake_copy: str, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The changelog rows describe the version the replace wrote (time travel): a user
    erased since must not be appended back from it."""
    lake = lake_copy
    cfg = lake_settings(lake, gap="45m")

    def erase_a() -> None:
        enforce_retention(spark, cfg, RetentionRequest(erase_users=("a",)))

    if when == "between the two writes":
        report = backfill_sessions(spark, cfg, FIRST, LAST, on_step=lambda step: (
            erase_a() if step == BACKFILL_STEPS[0] else None))
    else:
        crash_between_the_two_writes(spark, cfg, monkeypatch)
        erase_a()
        report = backfill_sessions(spark, cfg, FIRST, LAST)

    logged = [r for r in table(spark, lake, SESSION_CHANGELOG) if r["batch_id"] == -1]
    assert sorted({r["user_id"] for r in logged}) == ["b", "c", "f"], report
    assert not [r for r in table(spark, lake, SESSIONS) if r["user_id"] == "a"]


def test_a_backfill_cuts_sessions_at_the_stream_s_maximum_duration(
    spark: SparkSession, lake: str
) -> None:
    """A backfill of a lake whose stream cuts sessions at 48 hours cut a 31-hour session in
    two at the configured 24 (a review)."""
    stream = lake_settings(lake, max_session_duration="48h")
    start = datetime(2026, 1, 5, tzinfo=UTC)
    steady = [event("u", (start + timedelta(minutes=20 * i)).isoformat().replace("+00:00", "Z"))
              for i in range(94)]  # 31 hours
    run_batches(spark, stream, [steady, [event("v", "2026-01-08T12:00:00Z")]])
    check_session_rules_unchanged(spark, stream)  # noted, as at the stream's first run
    closed = [(r["event_count"], r["session_start"]) for r in
              read_table(spark, lake, "sessions").where("user_id = 'u'").collect()]
    assert [count for count, _ in closed] == [94]

    report = backfill_sessions(spark, lake_settings(lake), date(2026, 1, 5), date(2026, 1, 6))
    assert (report.sessions_before, report.sessions_after) == (1, 1)
    assert [(r["event_count"], r["session_start"]) for r in read_table(
        spark, lake, "sessions").where("user_id = 'u'").collect()] == closed

    with pytest.raises(BackfillError, match=r"^the gap 3d is longer than the longest session "
                       r"the lake's stream cuts \(2d, its --max-session-duration\)"):
        backfill_sessions(spark, lake_settings(lake, gap="3d", max_session_duration="3d"),
                          date(2026, 1, 5), date(2026, 1, 6))

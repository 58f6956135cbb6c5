"""The named analytic queries on a small lake whose answers are worked out by hand below,
time travel with --as-of, bound params, and the command line's errors.

The lake (all times UTC; gap 30m):

    2026-01-05  S1 u1 10:00 /  10:05 /product  10:07 /checkout (purchase)  420 s, 3 events
                S2 u2 10:00 /                                               0 s, bounce
                S3 u3 11:00:00 /about  11:00:05 /about                     5 s, 2 page views
                S4 u1 13:00 /product (purchase)                             0 s, bounce, conversion
    2026-01-06  S5 u1 09:00 /  09:00:30 /checkout                         30 s, 2 events
                S6 u4 09:10 /                                               0 s, bounce
    2026-01-07  u9 12:00 /   still open (it moves the watermark past every session above)

Batch A holds 2026-01-05 and u4's event (which closes the first day); batch B the rest.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.types import (
    ArrayType,
    DecimalType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from sessionlake import faults
from sessionlake.cli import main
from sessionlake.config import TABLE_ROWS, settings_from
from sessionlake.deltareader import read_state
from sessionlake.query import (
    AsOf,
    Commit,
    LakeNotFound,
    QueryError,
    bind_params,
    bytes_to_read,
    format_rows,
    named_queries,
    names_used,
    parse_as_of,
    register_params,
    run_named_query,
    run_sql,
    version_at,
    write_frame,
)
from sessionlake.report import duration_classes
from sessionlake.retention import RetentionRequest, enforce_retention
from sessionlake.tables import PUBLIC_TABLES, table_path
from tests.helpers import event, run_batches


def format_frame(frame: DataFrame, output: str) -> str:
    """What ``write_frame`` writes of ``frame`` in ``output``, as a string."""
    buffer = io.StringIO()
    write_frame(frame, output, buffer)
    return buffer.getvalue()


def _at(day: int, clock: str) -> str:
    return f"2026-01-{day:02d}T{clock}Z"


BATCH_A = [
    event("u1", _at(5, "10:00:00"), "/", event_id="a1"),
    event("u1", _at(5, "10:05:00"), "/product", event_id="a2"),
    event("u1", _at(5, "10:07:00"), "/checkout", event_id="a3", event_type="purchase"),
    event("u2", _at(5, "10:00:00"), "/", event_id="b1"),
    event("u3", _at(5, "11:00:00"), "/about", event_id="c1"),
    event("u3", _at(5, "11:00:05"), "/about", event_id="c2"),
    event("u1", _at(5, "13:00:00"), "/product", event_id="a4", event_type="purchase"),
    event("u4", _at(6, "09:10:00"), "/", event_id="d1"),
]
BATCH_B = [
    event("u1", _at(6, "09:00:00"), "/", event_id="a5"),
    event("u1", _at(6, "09:00:30"), "/checkout", event_id="a6"),
    event("u9", _at(7, "12:00:00"), "/", event_id="z1"),
]
DAY5, DAY6 = date(2026, 1, 5), date(2026, 1, 6)


@pytest.fixture(scope="module")
def known_lake(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The lake above, with the version of ``sessions`` after batch A."""
    lake = str(tmp_path_factory.mktemp("query") / "lake")
    settings = settings_from({"lake": lake}, env={})
    run_batches(spark, settings, [BATCH_A])
    after_a = DeltaTable.forPath(spark, table_path(lake, "sessions")).history(1)
    version_a = after_a.collect()[0]["version"]
    run_batches(spark, settings, [BATCH_B], first_batch_id=1)
    return {"lake": lake, "version_a": version_a}


def _rows(spark: SparkSession, lake: str, name: str, **params: str) -> list[tuple[Any, ...]]:
    frame = run_named_query(spark, lake, name, params)
    return [tuple(row) for row in frame.collect()]



HAND_ANSWERS: dict[str, list[tuple[Any, ...]]] = {
    # date, sessions, users, events, avg duration (420+0+5+0)/4, bounce 2/4
    "sessions_per_day": [(DAY5, 4, 3, 7, 106.3, 50.0), (DAY6, 2, 2, 3, 15.0, 50.0)],
    "sessions_per_hour": [
        (datetime(2026, 1, 5, 10), 2, 2, 210.0),
        (datetime(2026, 1, 5, 11), 1, 1, 5.0),
        (datetime(2026, 1, 5, 13), 1, 1, 0.0),
        (datetime(2026, 1, 6, 9), 2, 2, 15.0),
    ],
    "bounce_rate": [(DAY5, 4, 2, 50.0), (DAY6, 2, 1, 50.0)],
    # S1 by duration, S3 by page views, S4 by its purchase; S5 by duration
    "engaged_sessions": [(DAY5, 4, 3, 75.0), (DAY6, 2, 1, 50.0)],
    "entry_pages": [("/", 4, 50.0), ("/about", 1, 0.0), ("/product", 1, 100.0)],
    "exit_pages": [("/", 2), ("/checkout", 2), ("/about", 1), ("/product", 1)],
    # durations 420, 0, 5, 0, 30, 0
    "duration_distribution": [(0, "0 s", 3, 50.0), (1, "<10 s", 1, 16.7),
                              (2, "10-60 s", 1, 16.7), (4, "5-15 min", 1, 16.7)],
    # event counts 3, 1, 2, 1, 2, 1
    "events_per_session_distribution": [(0, "1", 3, 50.0), (1, "2", 2, 33.3),
                                        (2, "3", 1, 16.7)],
    # page views (3+1+2+1)/4 and (2+1)/2; distinct pages (3+1+1+1)/4 and (2+1)/2
    "pages_per_session": [(DAY5, 4, 1.75, 1.5), (DAY6, 2, 1.5, 1.5)],
    # u1, u2, u3 first seen on the 5th; u1 returns on the 6th, u4 is new
    "returning_users": [(DAY5, 3, 0), (DAY6, 1, 1)],
    # sessions with "/": S1, S2, S5, S6; "/checkout" after it: S1, S5
    "funnel": [(4, 2, 50.0)],
}


@pytest.mark.parametrize("name", sorted(HAND_ANSWERS))
def test_named_query_gives_the_hand_worked_answer(
    spark: SparkSession, known_lake: dict[str, Any], name: str
) -> None:
    got = _rows(spark, known_lake["lake"], name)
    expected = HAND_ANSWERS[name]
    assert len(got) == len(expected)
    for row, want in zip(got, expected, strict=True):
        assert tuple(float(v) if isinstance(v, Decimal) else v for v in row) == want


def test_every_named_query_has_a_hand_worked_answer_or_its_own_test() -> None:
    assert set(named_queries()) == set(HAND_ANSWERS) | {"all_sessions"}
    assert all(q.description for q in named_queries().values())


def test_duration_distribution_uses_the_report_s_classes(spark: SparkSession) -> None:
    """The named query and ``sessionlake report`` count session lengths in the same classes,
    at every class's bounds."""
    seconds = [0.0, 0.001, 9.999, 10.0, 59.9, 60.0, 299.0, 300.0, 899.0, 900.0, 1799.0,
               1800.0, 3599.0, 3600.0, 7199.0, 7200.0, 86400.0, 86400.0]
    spark.createDataFrame([(s,) for s in seconds], "duration_s double") \
        .createOrReplaceTempView("sessions")
    try:
        rows = spark.sql(named_queries()["duration_distribution"].text).collect()
    finally:
        spark.catalog.dropTempView("sessions")
    assert [(r["duration"], r["sessions"]) for r in rows] == [
        (label, n) for label, n in duration_classes(seconds) if n
    ]


def _funnel(spark: SparkSession, events: list[tuple[Any, ...]], session_end: datetime,
            ) -> tuple[int, int]:
    """The funnel from /a to /b over ``events`` (user u) and u's one session of
    2026-01-05 10:00 to ``session_end``: its step1 and step2 sessions."""
    spark.createDataFrame(events, "user_id string, event_time timestamp, event_date date, "
                          "page string, event_id string").createOrReplaceTempView("events")
    spark.createDataFrame(
        [("s", "u", datetime(2026, 1, 5, 10), session_end, DAY5)],
        "session_id string, user_id string, session_start timestamp, session_end timestamp, "
        "session_date date").createOrReplaceTempView("sessions")
    query = named_queries()["funnel"]
    register_params(spark, query, {"step1": "/a", "step2": "/b"})
    try:
        [row] = spark.sql(query.text).collect()
    finally:
        for view in ("events", "sessions", "query_params"):
            spark.catalog.dropTempView(view)
    return row["step1_sessions"], row["step2_sessions"]


@pytest.mark.parametrize(("step1", "step2", "converts"), [
    (("10:00:00", "x.log#7"), ("10:00:00", "x.log#15"), True),   # #7 before #15, as a number
    (("10:00:00", "x.log#15"), ("10:00:00", "x.log#7"), False),
    (("10:00:00", "b"), ("10:00:00", "a"), False),              # by id, then, at one instant
    (("10:00:00", "z"), ("10:00:01", "a"), True),               # time first
    (("10:00:01", "a"), ("10:00:00", "z"), False),
])
def test_the_funnel_s_later_is_the_session_s_order_of_events(
    spark: SparkSession, step1: tuple[str, str], step2: tuple[str, str], converts: bool
) -> None:
    """Steps at the same instant count in the order the engine gives a session's events
    (entry and exit pages follow it): by time, then by id, its final number as a number."""
    events = [("u", datetime.fromisoformat(f"2026-01-05T{clock}"), DAY5, page, event_id)
              for (clock, event_id), page in ((step1, "/a"), (step2, "/b"))]
    assert _funnel(spark, events, datetime(2026, 1, 5, 10, 0, 1)) == (1, int(converts))


def test_the_funnel_reaches_a_step_on_a_session_s_third_day(spark: SparkSession) -> None:
    """A session may last as long as --max-session-duration allows, over 24 h: its events
    are joined over every day it spans (before, over its first two: a step on the third
    was missed, though the session's exit page was that step; the SQL review)."""
    day7 = DAY5 + timedelta(days=2)
    events = [("u", datetime(2026, 1, 5, 10), DAY5, "/a", "e1"),
              ("u", datetime(2026, 1, 7, 10), day7, "/b", "e2")]
    assert _funnel(spark, events, datetime(2026, 1, 7, 10)) == (1, 1)


@pytest.mark.parametrize("name", sorted(HAND_ANSWERS))
def test_named_query_answers_as_json_lines(
    spark: SparkSession, known_lake: dict[str, Any], name: str
) -> None:
    text = format_frame(run_named_query(spark, known_lake["lake"], name), "json")
    rows = [json.loads(line) for line in text.splitlines()]
    assert [tuple(r.values()) for r in rows] == [
        tuple(v.replace(tzinfo=UTC).isoformat() if isinstance(v, datetime)
              else v.isoformat() if isinstance(v, date) else v for v in want)
        for want in HAND_ANSWERS[name]
    ]


def test_json_lines_write_instants_with_their_zone_and_structs_as_objects(
    spark: SparkSession,
) -> None:
    frame = spark.sql(
        "SELECT 1.5 AS d, TIMESTAMP'2026-01-05 10:00:00' AS t,"
        " TIMESTAMP_NTZ'2026-01-05 10:00:00' AS n, DATE'2026-01-05' AS day,"
        " named_struct('a', 1, 't', TIMESTAMP'2026-01-05 10:00:00') AS s,"
        " array(TIMESTAMP'2026-01-05 10:00:00') AS ts,"
        " map('k', TIMESTAMP'2026-01-05 10:00:00') AS m, CAST(NULL AS TIMESTAMP) AS none"
    )
    at = "2026-01-05T10:00:00+00:00"
    assert json.loads(format_frame(frame, "json")) == {
        "d": 1.5, "t": at, "n": "2026-01-05T10:00:00", "day": "2026-01-05",
        "s": {"a": 1, "t": at}, "ts": [at], "m": {"k": at}, "none": None,
    }


def test_all_sessions_marks_open_and_closed(
    spark: SparkSession, known_lake: dict[str, Any]
) -> None:
    frame = run_named_query(spark, known_lake["lake"], "all_sessions")
    status = {(r["user_id"], r["session_start"]): r["status"] for r in frame.collect()}
    assert len(status) == 7
    assert status[("u9", datetime(2026, 1, 7, 12))] == "open"
    assert sorted(status.values()).count("closed") == 6


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"conversion_event": "nothing"}, [(DAY5, 4, 2, 50.0), (DAY6, 2, 1, 50.0)]),
        ({"conversion_event": "purchase' OR '1'='1"}, [(DAY5, 4, 2, 50.0), (DAY6, 2, 1, 50.0)]),
    ],
    ids=["other-conversion", "injection-is-a-literal"],
)
def test_params_are_bound_values(
    spark: SparkSession, known_lake: dict[str, Any], params: dict[str, str],
    expected: list[tuple[Any, ...]],
) -> None:
    got = _rows(spark, known_lake["lake"], "engaged_sessions", **params)
    assert [tuple(float(v) if isinstance(v, Decimal) else v for v in r) for r in got] == expected


def test_date_params_narrow_the_range(spark: SparkSession, known_lake: dict[str, Any]) -> None:
    got = _rows(spark, known_lake["lake"], "sessions_per_day", from_date="2026-01-06")
    assert [r[0] for r in got] == [DAY6]


def test_date_params_prune_the_partitions_read(
    spark: SparkSession, known_lake: dict[str, Any]
) -> None:
    """A day's sessions read that day's files, not every day of the lake's (the SQL
    review: the params' row came from createDataFrame, which the optimizer cannot fold)."""
    frame = run_named_query(spark, known_lake["lake"], "sessions_per_day",
                            {"from_date": "2026-01-06", "to_date": "2026-01-06"})
    plan = frame._jdf.queryExecution().executedPlan().toString()
    [scan] = [line for line in plan.splitlines() if "FileScan" in line and "sessions" in line]
    assert "PartitionFilters: [(session_date" in scan, scan


def test_as_of_a_version_of_sessions_sees_the_lake_as_it_was(
    spark: SparkSession, known_lake: dict[str, Any]
) -> None:
    lake = known_lake["lake"]
    then = run_named_query(spark, lake, "sessions_per_day",
                           as_of=AsOf(version=known_lake["version_a"]))
    assert [(r["session_date"], r["sessions"]) for r in then.collect()] == [(DAY5, 4)]
    # The other tables are read at the same moment: batch B's events are not there yet.
    events = run_sql(spark, lake, "SELECT count(*) AS n FROM events",
                     AsOf(version=known_lake["version_a"])).collect()[0]["n"]
    assert events == len(BATCH_A)
    now = run_sql(spark, lake, "SELECT count(*) AS n FROM events").collect()[0]["n"]
    assert now == len(BATCH_A) + len(BATCH_B)


def test_as_of_a_time_before_the_lake_says_when_it_began(
    spark: SparkSession, known_lake: dict[str, Any]
) -> None:
    with pytest.raises(QueryError, match=r"2000-01-01.*did not exist yet; its first table "
                                         r"was created at 20\d\d-"):
        run_sql(spark, known_lake["lake"], "SELECT 1", AsOf(timestamp=datetime(2000, 1, 1)))


def test_as_of_a_version_sessions_never_had_names_those_it_has(
    spark: SparkSession, known_lake: dict[str, Any]
) -> None:
    newest = run_sql(spark, known_lake["lake"], "DESCRIBE HISTORY sessions").collect()[0][
        "version"]
    with pytest.raises(QueryError, match=rf"--as-of 999: sessions has no version 999 \(it has "
                                         rf"versions 0 to {newest}\)$"):
        run_sql(spark, known_lake["lake"], "SELECT 1", AsOf(version=999))


def test_time_travel_to_a_vacuumed_version_says_so_in_one_line(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A version whose files a VACUUM removed is no damage: before, the error sent the user
    to `doctor`, which found none, and a subquery's failure printed 130 lines of trace."""
    settings = settings_from({"lake": str(tmp_path / "lake")}, env={})
    run_batches(spark, settings, [BATCH_A, BATCH_B])
    enforce_retention(spark, settings, RetentionRequest(erase_users=("u1",),
                                                        vacuum_retain_hours=0))
    for argv in (["--as-of", "1", "SELECT (SELECT count(DISTINCT user_id) FROM events) AS n"],
                 ["SELECT count(*) FROM events VERSION AS OF 1 WHERE user_id = 'u1'"]):
        assert main(["sql", "--lake", settings.lake, *argv]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert err.startswith("sessionlake: error: a data file of the version read is gone")


def test_delta_sql_reaches_the_tables_by_name(
    spark: SparkSession, known_lake: dict[str, Any]
) -> None:
    lake, version_a = known_lake["lake"], known_lake["version_a"]
    history = run_sql(spark, lake, "DESCRIBE HISTORY sessions").collect()
    assert version_a in {r["version"] for r in history}
    [detail] = run_sql(spark, lake, "DESCRIBE DETAIL events").collect()
    assert detail["location"].rstrip("/").endswith(table_path(lake, "events").rstrip("/"))
    then = run_sql(spark, lake, f"SELECT count(*) AS n FROM sessions VERSION AS OF {version_a}")
    assert then.collect()[0]["n"] == 4  # the first day's sessions, as after batch A


def test_tables_follow_the_lake_asked_for(
    spark: SparkSession, known_lake: dict[str, Any], tmp_path: Path
) -> None:
    """A second lake in the same session replaces the first one's tables, and an --as-of
    view of a table does not hide the table from the statements after it."""
    other = settings_from({"lake": str(tmp_path / "other")}, env={})
    run_batches(spark, other, [BATCH_B])
    known = known_lake["lake"]

    def count(lake: str, as_of: AsOf | None = None) -> int:
        return int(run_sql(spark, lake, "SELECT count(*) AS n FROM events", as_of)
                   .collect()[0]["n"])

    assert count(known, AsOf(version=known_lake["version_a"])) == len(BATCH_A)
    assert count(other.lake) == len(BATCH_B)
    assert count(known) == len(BATCH_A) + len(BATCH_B)
    assert len(run_sql(spark, known, "DESCRIBE HISTORY events").collect()) > 1


def test_a_table_of_the_catalog_that_owns_its_data_is_not_replaced(
    spark: SparkSession, known_lake: dict[str, Any]
) -> None:
    spark.sql("DROP TABLE IF EXISTS sessions")
    spark.sql("CREATE TABLE sessions (x INT) USING delta")
    try:
        with pytest.raises(QueryError, match="managed table sessions"):
            run_sql(spark, known_lake["lake"], "SELECT count(*) FROM sessions")
        assert spark.table("sessions").columns == ["x"]
    finally:
        spark.sql("DROP TABLE sessions")


class _CutOff(Exception):
    pass


def test_as_of_a_time_during_a_batch_sees_the_lake_before_it(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch commits its tables side by side: a time while it is written (here, cut off
    before its batch_metrics row) reads none of it, and the replay's end reads all of it."""
    settings = settings_from({"lake": str(tmp_path / "lake")}, env={})
    run_batches(spark, settings, [BATCH_A])

    def cut_off(name: str) -> None:
        if name == "after_sessions":
            raise _CutOff(name)

    monkeypatch.setattr(faults, "point", cut_off)
    with pytest.raises(_CutOff):
        run_batches(spark, settings, [BATCH_B], first_batch_id=1)
    later = AsOf(timestamp=datetime(2100, 1, 1))

    def count(table: str, as_of: AsOf | None) -> int:
        frame = run_sql(spark, settings.lake, f"SELECT count(*) AS n FROM {table}", as_of)
        return int(frame.collect()[0]["n"])

    assert count("events", None) == len(BATCH_A) + len(BATCH_B)  # the half-written lake
    assert count("events", later) == len(BATCH_A)
    assert count("batch_metrics", later) == 1
    monkeypatch.undo()
    run_batches(spark, settings, [BATCH_B], first_batch_id=1)  # the replay
    assert count("events", later) == len(BATCH_A) + len(BATCH_B)
    assert count("batch_metrics", later) == 2


def _commit(version: int, micros: int, operation: str = "WRITE",
            batch: int | None = None) -> Commit:
    return Commit(version, micros, operation, None if batch is None else ("app", batch))


@pytest.mark.parametrize(
    ("commits", "moment", "expected"),
    [
        ([_commit(1, 10, batch=0), _commit(0, 0, "CREATE TABLE")], 5, 0),
        ([_commit(1, 10, batch=0), _commit(0, 0, "CREATE TABLE")], 10, 1),
        ([_commit(0, 0, "CREATE TABLE")], -1, None),
        # batch 1 is not finished at the moment: its commit is stepped over
        ([_commit(2, 20, batch=1), _commit(1, 10, batch=0), _commit(0, 0)], 30, 1),
        # and so is a compaction after it, which holds its rows too
        ([_commit(3, 25, "OPTIMIZE"), _commit(2, 20, batch=1), _commit(1, 10, batch=0),
          _commit(0, 0)], 30, 1),
        # a compaction before it is kept
        ([_commit(3, 25, batch=1), _commit(2, 20, "OPTIMIZE"), _commit(1, 10, batch=0),
          _commit(0, 0)], 30, 2),
        # a restore after a batch that was never finished bounds the walk
        ([_commit(3, 25, "RESTORE"), _commit(2, 20, batch=1), _commit(1, 10, batch=0),
          _commit(0, 0)], 30, 3),
        # an erasure between batches is kept
        ([_commit(2, 20, "DELETE"), _commit(1, 10, batch=0), _commit(0, 0)], 30, 2),
        # a table whose only writes are unfinished
        ([_commit(1, 10, batch=1), _commit(0, 0, "CREATE TABLE")], 30, 0),
    ],
    ids=["before-a-batch", "at-a-batch", "before-creation", "unfinished-batch",
         "compaction-after-unfinished", "compaction-before-unfinished", "restore-bounds",
         "erasure-kept", "only-unfinished"],
)
def test_version_at_steps_over_unfinished_batches(
    commits: list[Commit], moment: int, expected: int | None
) -> None:
    assert version_at(commits, moment, {"app": 0}) == expected


@pytest.mark.parametrize("name", sorted(HAND_ANSWERS))
def test_named_queries_are_views_by_name_with_their_params_defaults(
    spark: SparkSession, known_lake: dict[str, Any], name: str
) -> None:
    frame = run_sql(spark, known_lake["lake"], f"SELECT * FROM {name}")
    got = [tuple(float(v) if isinstance(v, Decimal) else v for v in r) for r in frame.collect()]
    assert sorted(got) == sorted(HAND_ANSWERS[name])


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("nope", {}, "no query named 'nope': `sessionlake sql --list`"),
        ("funel", {}, "no query named 'funel': did you mean funnel\\? `sessionlake sql --list`"),
        ("funnel", {"step3": "x"}, "has no param step3"),
        ("sessions_per_day", {"from_date": "yesterday"}, r"is not a valid date \(YYYY-MM-DD, "),
    ],
)
def test_bad_query_or_params_are_rejected(
    spark: SparkSession, known_lake: dict[str, Any], name: str, params: dict[str, str],
    message: str,
) -> None:
    with pytest.raises(QueryError, match=message):
        run_named_query(spark, known_lake["lake"], name, params)


def test_bind_params_uses_defaults() -> None:
    query = named_queries()["funnel"]
    assert bind_params(query, {"step2": "/buy"}) == {"step1": "/", "step2": "/buy"}


@pytest.mark.parametrize("text", ["12", "2026-01-31", "2026-01-31T18:00:00Z"])
def test_as_of_accepts_versions_and_times(text: str) -> None:
    parsed = parse_as_of(text)
    assert (parsed.version is not None) != (parsed.timestamp is not None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["sql", "--query", "nope"], "no query named 'nope'"),
        (["sql", "--query", "funnel", "--param", "step3=x"], "has no param step3"),
        (["sql", "--query", "funnel", "--param", "nonsense"], "must look like name=value"),
        (["sql", "--query", "sessions_per_day", "--param", "to_date=soon"], "not a valid date"),
        (["sql", "SELECT 1", "--query", "funnel"], "either a SQL statement or --query"),
        (["sql", "SELECT 1", "--as-of", "last tuesday"], "--as-of 'last tuesday'"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(
    known_lake: dict[str, Any], argv: list[str], message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*argv, "--lake", known_lake["lake"]]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def _logs(lake: str) -> dict[str, int]:
    return {t: len(list((Path(table_path(lake, t)) / "_delta_log").glob("*.json")))
            for t in ("sessions", "open_sessions", "events")}


@pytest.mark.parametrize("statement", [
    "DELETE FROM sessions WHERE user_id = 'u1'",
    "UPDATE open_sessions SET event_count = 999",
    "MERGE INTO sessions t USING sessions s ON t.session_id = s.session_id "
    "WHEN MATCHED THEN DELETE",
    "INSERT INTO events SELECT * FROM events",
    "WITH gone AS (SELECT 1) DELETE FROM events",
    "DELETE FROM delta.`{lake}/events`",
    "DROP TABLE sessions",
    "TRUNCATE TABLE events",
    "OPTIMIZE sessions",
    "VACUUM sessions RETAIN 0 HOURS",
    "RESTORE TABLE sessions TO VERSION AS OF 0",
    "ALTER TABLE sessions SET TBLPROPERTIES ('delta.appendOnly' = 'false')",
    "CREATE TABLE copied AS SELECT * FROM sessions",
    "INSERT OVERWRITE DIRECTORY '{lake}/out' SELECT * FROM sessions",
    "EXECUTE IMMEDIATE 'DELETE FROM sessions'",
    # A Hive multi-insert is a union of inserts; a CLONE is no Spark command (the diff
    # review ran both through the first version of the check).
    "FROM delta.`{lake}/events` e INSERT INTO delta.`{lake}/events` SELECT * "
    "INSERT INTO delta.`{lake}/events` SELECT *",
    "CREATE TABLE delta.`{lake}/cloned` SHALLOW CLONE delta.`{lake}/sessions`",
])
def test_sql_refuses_a_statement_that_would_change_the_lake(
    known_lake: dict[str, Any], statement: str, capsys: pytest.CaptureFixture[str],
) -> None:
    """The tables change through the commands that keep the stream's locks and audit: a
    DELETE typed into `sessionlake sql` changed closed sessions with neither, and
    `doctor` saw nothing (the SQL review)."""
    lake = known_lake["lake"]
    before = _logs(lake)
    assert main(["sql", statement.format(lake=lake), "--lake", lake]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "sessionlake sql reads the lake and does not change it" in err
    assert _logs(lake) == before
    assert not (Path(lake) / "out").exists() and not (Path(lake) / "cloned").exists()


@pytest.mark.parametrize("statement", [
    "WITH s AS (SELECT * FROM sessions) SELECT count(*) FROM s",
    "VALUES (1)",
    "TABLE sessions",
    "DESCRIBE sessions",
    "DESCRIBE HISTORY sessions",
    "DESCRIBE DETAIL events",
    "SHOW TABLES",
    "SHOW TBLPROPERTIES sessions",
    "EXPLAIN DELETE FROM sessions",  # explained, not run
    "DESCRIBE QUERY SELECT * FROM sessions",
    "SHOW CATALOGS",
    "SHOW CURRENT NAMESPACE",
])
def test_sql_runs_queries_and_what_only_describes(
    known_lake: dict[str, Any], statement: str, capsys: pytest.CaptureFixture[str],
) -> None:
    lake = known_lake["lake"]
    before = _logs(lake)
    assert main(["sql", statement, "--lake", lake]) == 0, capsys.readouterr().err
    assert _logs(lake) == before


@pytest.mark.parametrize("argv", [["--query", "nope"],
                                  ["--query", "funnel", "--param", "step3=x"]])
def test_a_wrong_query_name_or_param_is_told_before_spark_starts(
    argv: list[str], tmp_path: Path
) -> None:
    """No JVM at all (none can start here): the error comes from the catalog alone."""
    done = subprocess.run(
        [sys.executable, "-m", "sessionlake.cli", "sql", "--lake", str(tmp_path), *argv],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "PATH": "/nonexistent"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("sessionlake: error: ") and "Java" not in done.stderr
    assert len(done.stderr.splitlines()) == 1


def test_cli_lists_and_runs_named_queries(
    known_lake: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sql", "--list"]) == 0
    listing = capsys.readouterr().out
    assert "funnel [--param step1=/] [--param step2=/checkout]" in listing
    assert main(["sql", "--lake", known_lake["lake"], "--query", "funnel", "--output", "csv",
                 "--param", "step2=/checkout"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "step1_sessions,step2_sessions,conversion_pct", "4,2,50.0"]


def test_sql_files_of_the_queries_are_the_ones_listed() -> None:
    folder = Path(__file__).resolve().parent.parent / "sql" / "queries"
    assert {p.stem for p in folder.glob("*.sql")} == set(named_queries())


@pytest.mark.parametrize(("statement", "used"), [
    ("SELECT count(*) FROM sessions", {"sessions"}),
    ("select * from `Events` e join SESSIONS s using (user_id)", {"events", "sessions"}),
    ("DESCRIBE HISTORY open_sessions", {"open_sessions"}),
    # A named query brings what it reads.
    ("SELECT * FROM all_sessions", {"all_sessions", "sessions", "open_sessions"}),
    ("SELECT * FROM funnel", {"funnel", "sessions", "events"}),
    # No name of the lake's: every name, as SHOW TABLES expects.
    ("SHOW TABLES", None),
    ("SELECT 1", None),
])
def test_a_statement_registers_the_names_it_uses(statement: str, used: set[str] | None) -> None:
    assert names_used(statement, named_queries()) == used


def test_a_statement_on_a_table_the_lake_lacks_names_that_table(
    spark: SparkSession, known_lake: dict[str, Any], tmp_path: Path
) -> None:
    """With only the tables used registered, a table the lake has not got is Spark's
    "not found", not "no sessionlake tables" (the lake has the others)."""
    lake = tmp_path / "copy"
    shutil.copytree(known_lake["lake"], lake)
    shutil.rmtree(table_path(str(lake), "retention_audit"), ignore_errors=True)
    with pytest.raises(AnalysisException, match="retention_audit"):
        run_sql(spark, str(lake), "SELECT * FROM retention_audit")
    with pytest.raises(LakeNotFound):
        run_sql(spark, str(tmp_path / "none"), "SELECT * FROM sessions")


def test_a_query_reads_the_bytes_of_the_tables_it_names(
    known_lake: dict[str, Any], tmp_path: Path
) -> None:
    """What chooses the query driver's compiler: the live files of the tables used, from
    their logs (a table's earlier files, removed by a MERGE, do not count)."""
    lake = known_lake["lake"]

    def live_bytes(table: str) -> int:
        return read_state(table_path(lake, table)).total_bytes

    assert bytes_to_read(lake, "SELECT count(*) FROM sessions") == live_bytes("sessions")
    assert bytes_to_read(lake, "SELECT * FROM funnel") == \
        live_bytes("sessions") + live_bytes("events")
    every_table = sum(live_bytes(t) for t in PUBLIC_TABLES)
    assert 0 < live_bytes("open_sessions") < every_table
    assert bytes_to_read(lake, "SHOW TABLES") == every_table
    # Nothing there yet counts nothing (the query says what is missing); a lake whose logs
    # cannot be read here has no known size.
    assert bytes_to_read(str(tmp_path / "none"), "SELECT * FROM sessions") == 0
    assert bytes_to_read("s3a://bucket/lake", "SELECT * FROM sessions") is None
    # Nor has a damaged log: the query then runs as before and reports the damage itself.
    damaged = tmp_path / "damaged"
    shutil.copytree(lake, damaged)
    commit = sorted((Path(table_path(str(damaged), "sessions")) / "_delta_log").glob("*.json"))[-1]
    commit.write_text(commit.read_text()[:40])
    assert bytes_to_read(str(damaged), "SELECT count(*) FROM sessions") is None
    assert bytes_to_read(str(damaged), "SELECT count(*) FROM events") == live_bytes("events")


@pytest.mark.parametrize(("jit", "quick"), [(None, True), ("full", False)])
def test_sql_on_a_small_lake_asks_for_a_quick_starting_driver(
    known_lake: dict[str, Any], monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], jit: str | None, quick: bool,
) -> None:
    """The choice reaches the session's builder (the suite's Spark is already running, so
    it changes nothing here; `tests/test_spark.py` checks the JVM options it gives)."""
    import sessionlake.cli as cli

    asked: list[bool] = []
    build = cli._spark

    def recording(settings: Any, app: str, **options: Any) -> Any:
        asked.append(options.get("quick_start", False))
        return build(settings, app, **options)

    monkeypatch.setattr(cli, "_spark", recording)
    if jit is None:
        monkeypatch.delenv("SESSIONLAKE_DRIVER_JIT", raising=False)
    else:
        monkeypatch.setenv("SESSIONLAKE_DRIVER_JIT", jit)
    assert main(["sql", "--lake", known_lake["lake"], "--query", "bounce_rate"]) == 0
    assert asked == [quick]
    assert "2026-01-05" in capsys.readouterr().out


@pytest.mark.parametrize(("value", "shown"), [
    (3.0, "3.0"), (16.4, "16.4"), (-2.0, "-2.0"), (0.1 + 0.2, "0.3"),
    (1234567.89, "1234567.89"), (1e20, "1e+20"), (2.5e-7, "2.5e-07"),
    (float("nan"), "nan"), (float("inf"), "inf"),
])
def test_a_table_shows_a_double_with_its_digits_and_its_point(value: float, shown: str) -> None:
    """Rounded averages must not read 3 beside 3.2, nor a sum lose its digits (1.23457e+06)."""
    assert format_rows(["x"], [(value,)], "table").splitlines()[2].strip() == shown


def test_a_table_right_aligns_its_numbers() -> None:
    table = format_rows(
        ["day", "sessions", "rate", "note"],
        [(date(2026, 1, 5), 512, 51.8, "a"), (date(2026, 1, 6), 7, None, None),
         (date(2026, 1, 7), 1024, Decimal("5.25"), "bc")],
        "table",
    )
    assert table == (
        "day         sessions  rate  note\n"
        "----------  --------  ----  ----\n"
        "2026-01-05       512  51.8  a\n"
        "2026-01-06         7\n"
        "2026-01-07      1024  5.25  bc\n"
        "(3 rows)\n"
    )


def test_csv_writes_doubles_that_read_back_the_same() -> None:
    values = [0.1 + 0.2, 1234567.891234567, 1 / 3, 1e-300, 3.0]
    text = format_rows(["x"], [(v,) for v in values], "csv")
    assert [float(cell) for cell in text.splitlines()[1:]] == values


_POINT = StructType([StructField("x", StringType()), StructField("y", StringType())])


@pytest.mark.parametrize(("value", "kind", "shown"), [
    (True, None, "true"),
    (False, None, "false"),
    (timedelta(seconds=36, microseconds=500_000), None, "PT36.5S"),
    (timedelta(days=3), None, "P3D"),
    (timedelta(days=1, hours=2, minutes=3, seconds=4), None, "P1DT2H3M4S"),
    (timedelta(minutes=1), None, "PT1M"),
    (-timedelta(seconds=1), None, "-PT1S"),
    (timedelta(0), None, "PT0S"),
    (b"\x01\x02\xff", None, "0102FF"),
    (["/", "/a"], ArrayType(StringType()), '["/", "/a"]'),
    ({"k": "v"}, MapType(StringType(), StringType()), '{"k": "v"}'),
    (Row(x="1", y="b"), _POINT, '{"x": "1", "y": "b"}'),
    ([Decimal("1.50"), None], ArrayType(DecimalType(3, 2)), "[1.50, null]"),
    ({"é": "ü"}, MapType(StringType(), StringType()), '{"é": "ü"}'),
])
def test_a_table_spells_values_as_spark_sql_does_not_as_python(
        value: Any, kind: Any, shown: str) -> None:
    """Not True, datetime.timedelta's '-1 day, 23:59:59', b'\\x01' or Row(x=...); CSV the same."""
    types = [kind] if kind else None
    assert format_rows(["c"], [(value,)], "table", types).splitlines()[2].strip() == shown
    [[cell]] = csv.reader(format_rows(["c"], [(value,)], "csv", types).splitlines()[1:])
    assert cell == shown


def test_json_lines_write_binary_intervals_and_non_numbers_as_spark_s_to_json() -> None:
    line = format_rows(["b", "i", "n", "inf"], [(b"\x01\x02", timedelta(hours=1), float("nan"),
                                                 float("-inf"))], "json")
    assert json.loads(line) == {"b": "AQI=", "i": "PT1H", "n": "NaN", "inf": "-Infinity"}


def test_a_result_of_any_type_prints_in_every_output(spark: SparkSession) -> None:
    """PySpark cannot collect a year-month interval, and JSON has no bytes: neither may
    end a query in a traceback. A repeated column name stays repeated."""
    frame = spark.sql(
        "SELECT X'01ff' AS b, interval 2 years 3 months AS ym, array(interval 1 year) AS yms, "
        "parse_json('{\"a\": [1]}') AS v, "
        "timestamp'2026-01-01 10:00:00' - timestamp'2026-01-01 09:59:23.5' AS i, 1 AS b")
    header, row = csv.reader(format_frame(frame, "csv").splitlines())
    assert header == ["b", "ym", "yms", "v", "i", "b"]
    assert row == ["01FF", "INTERVAL '2-3' YEAR TO MONTH", "[INTERVAL '1' YEAR]", '{"a":[1]}',
                   "PT36.5S", "1"]
    assert json.loads(format_frame(frame.drop("b"), "json")) == {
        "ym": "INTERVAL '2-3' YEAR TO MONTH", "yms": "[INTERVAL '1' YEAR]", "v": {"a": [1]},
        "i": "PT36.5S"}
    assert "INTERVAL '2-3' YEAR TO MONTH" in format_frame(frame, "table")


class _Recorded(io.StringIO):
    """Output that notes, at each write, how many of a job group's Spark jobs had run."""

    def __init__(self, spark: SparkSession, group: str) -> None:
        super().__init__()
        self.jobs_at_write: list[tuple[str, int]] = []
        self._jobs = lambda: len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))

    def write(self, text: str) -> int:
        self.jobs_at_write.append((text, self._jobs()))
        return super().write(text)


@pytest.mark.parametrize("output", ["csv", "json"])
def test_an_export_is_written_as_its_partitions_come(spark: SparkSession, output: str) -> None:
    """CSV and JSON lines need not hold the whole result in the driver: the first row goes
    out before the last partition is computed (a job each), and the rows keep their order."""
    frame = spark.range(0, 40, numPartitions=8)
    group = f"export-{output}-{uuid.uuid4()}"
    spark.sparkContext.setJobGroup(group, "an export, partition by partition")
    try:
        out = _Recorded(spark, group)
        write_frame(frame, output, out)
        jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
    finally:
        spark.sparkContext.setJobGroup("", "")
    assert out.getvalue() == format_rows(["id"], [(i,) for i in range(40)], output)
    first_row = next(n for text, n in out.jobs_at_write if "0" in text)
    assert first_row < jobs == 8


@pytest.mark.parametrize(
    ("rows", "output", "limit", "printed", "last_line"),
    [
        (TABLE_ROWS + 1, "table", None, TABLE_ROWS, f"(the first {TABLE_ROWS:,} rows; the "
         "result has more: --limit N prints N, --output csv or json writes them all)"),
        (TABLE_ROWS, "table", None, TABLE_ROWS, f"({TABLE_ROWS} rows)"),
        (TABLE_ROWS + 1, "table", TABLE_ROWS + 1, TABLE_ROWS + 1, f"({TABLE_ROWS + 1} rows)"),
        (10, "table", 3, 3, "(3 rows)"),
        (10, "table", 0, 0, "(0 rows)"),
        (TABLE_ROWS + 1, "vertical", None, TABLE_ROWS, f"(the first {TABLE_ROWS:,} rows; the "
         "result has more: --limit N prints N, --output csv or json writes them all)"),
        (10, "vertical", 3, 3, "(3 rows)"),
        (10, "vertical", 0, 0, "(0 rows)"),
        (TABLE_ROWS + 1, "csv", None, TABLE_ROWS + 1, str(TABLE_ROWS)),
        (10, "json", 0, 0, None),
    ],
)
def test_a_table_shows_the_first_rows_and_says_when_there_are_more(
    spark: SparkSession, rows: int, output: str, limit: int | None, printed: int,
    last_line: str | None,
) -> None:
    """A table typed to look at a large result shows its first rows, not a driver full of
    them, and says how to see the rest; ``--limit`` (even 0) and exports print what they are
    asked for."""
    out = io.StringIO()
    write_frame(spark.range(rows).orderBy("id"), output, out, limit)
    lines = out.getvalue().splitlines()
    body = {"table": lines[2:-1], "csv": lines[1:], "json": lines,
            "vertical": [line.removeprefix("id | ") for line in lines if line.startswith("id")],
            }[output]
    assert len(body) == printed
    assert [b.strip() for b in body[:1]] == ([] if printed == 0 else
                                             [{"json": '{"id": 0}'}.get(output, "0")])
    if last_line is not None:
        assert lines[-1] == last_line


def test_vertical_output_shows_a_record_a_block_and_a_column_a_line() -> None:
    """A row too wide for a table (the events' ``fields`` JSON) reads down, not across."""
    text = format_rows(["user_id", "fields", "n"],
                       [("u1", '{"page": "/pricing"}', 2), ("u22", None, 10)], "vertical")
    assert text == ("-[ RECORD 1 ]\n"
                    "user_id | u1\n"
                    'fields  | {"page": "/pricing"}\n'
                    "n       | 2\n"
                    "-[ RECORD 2 ]\n"
                    "user_id | u22\n"
                    "fields  |\n"
                    "n       | 10\n"
                    "(2 rows)\n")


@pytest.mark.parametrize("types", [[DecimalType(38, 2)], None])
def test_json_lines_write_a_decimal_digit_for_digit(types: list[DecimalType] | None) -> None:
    """A DECIMAL(38,2) sum keeps its cents: as a double it would read 1.2345678901234567e+19."""
    rows = [(Decimal("12345678901234567890.12"), [Decimal("-0.10")])]
    line = format_rows(["total", "parts"], rows, "json", [*types, ArrayType(DecimalType(3, 2))]
                       if types else None)
    assert line == '{"total": 12345678901234567890.12, "parts": [-0.10]}\n'
    assert json.loads(line, parse_float=Decimal)["total"] == rows[0][0]

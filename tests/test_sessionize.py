"""Batch sessionization: the gap boundary, ids, analytics columns, long-session splits."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from sessionlake.sessionize import (
    SESSIONIZED_EVENT_COLUMNS,
    as_open_sessions,
    batch_sessions,
    files_read_order,
    micros_at,
    moment_at,
    sessionize_batch,
    sessionize_events,
)
from sessionlake.sources import JsonLinesAdapter
from sessionlake.validation import apply_guards, valid_events
from tests.helpers import NOW, event, first, hm, lines_frame

GAP = timedelta(minutes=30)
DAY = timedelta(hours=24)


@pytest.mark.parametrize("moment", [
    datetime(1970, 1, 1, tzinfo=UTC),
    datetime(2026, 1, 5, 10, 0, 0, 123456, tzinfo=UTC),
    datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),  # before the epoch
    None,
])
def test_instants_in_microseconds_convert_both_ways(moment: datetime | None) -> None:
    assert moment_at(micros_at(moment)) == moment


def sessions_of(
    spark: SparkSession, lines: list[str], max_duration: timedelta = DAY
) -> DataFrame:
    parsed = apply_guards(JsonLinesAdapter().parse(lines_frame(spark, lines)), NOW,
                          timedelta(hours=1))
    return sessionize_events(valid_events(parsed), GAP, max_duration)


@pytest.mark.parametrize(
    ("second", "expected_sessions"),
    [
        ("10:29:59", 1),  # 1 s inside the gap: same session
        ("10:30:00", 2),  # exactly the gap: a new session (Spark's session_window boundary)
        ("10:30:01", 2),  # beyond the gap
    ],
)
def test_gap_boundary(spark: SparkSession, second: str, expected_sessions: int) -> None:
    sessions = sessions_of(spark, [event("u", "10:00"), event("u", second)])
    assert sessions.count() == expected_sessions


def test_analytics_columns(spark: SparkSession) -> None:
    sessions = sessions_of(spark, [
        event("u", "10:20", "/c"),          # arrives first, happens last
        event("u", "10:00", "/a"),
        event("u", "10:10", "/b"),
        event("u", "10:15", "/a"),
        event("v", "10:00", "/x"),
    ])
    expected = spark.createDataFrame(
        [
            # u: four events, entry /a at 10:00, exit /c at 10:20, pages a b c
            ("u", hm("10:00"), hm("10:20"), 4, 4, "/a", "/c", ["/a", "/b", "/c"]),
            # v: a single event
            ("v", hm("10:00"), hm("10:00"), 1, 1, "/x", "/x", ["/x"]),
        ],
        "user_id string, session_start timestamp, session_end timestamp, event_count long, "
        "page_views long, entry_page string, exit_page string, pages array<string>",
    )
    assertDataFrameEqual(
        sessions.select(*expected.columns), expected, checkRowOrder=False
    )


def test_session_id_is_deterministic_and_depends_on_user_and_start(spark: SparkSession) -> None:
    once = sessions_of(spark, [event("u", "10:00"), event("v", "10:00")])
    again = sessions_of(spark, [event("v", "10:00"), event("u", "10:00"), event("u", "10:05")])
    ids: dict[str, str] = dict(once.select("user_id", "session_id").collect())
    assert ids == dict(again.select("user_id", "session_id").collect())
    assert ids["u"] != ids["v"]
    assert len(ids["u"]) == 32


@pytest.mark.parametrize(("first_id", "second_id"), [
    ("a", "b"),
    # The ids given to events without one follow their lines and offsets, not their text.
    ("part-7.log#7", "part-7.log#15"),
    ("part-6.log#1250", "part-7.log#1"),
    ("clicks/0/9", "clicks/0/10"),
])
def test_equal_times_break_ties_by_event_id(
    spark: SparkSession, first_id: str, second_id: str
) -> None:
    sessions = sessions_of(spark, [
        event("u", "10:00", "/second", event_id=second_id),
        event("u", "10:00", "/first", event_id=first_id),
    ])
    row = first(sessions)
    assert (row["entry_page"], row["exit_page"]) == ("/first", "/second")


@pytest.mark.parametrize(("landed", "ranks"), [
    (None, None),  # Kafka, or files the checkpoint does not name
    ({"a.jsonl": 1}, None),  # one file: its lines order its copies
    ({"a.jsonl": 1, "b.jsonl": 2, "c.jsonl": 2}, None),  # names follow times: no join
    ({"a.jsonl": 2, "b.jsonl": 1}, [("a.jsonl", 1), ("b.jsonl", 0)]),
    ({"a.jsonl": None, "b.jsonl": 5}, [("a.jsonl", 1), ("b.jsonl", 0)]),  # unknown: last
    ({"b.jsonl": 1, "a.jsonl": 1, "c.jsonl": 0}, [("a.jsonl", 1), ("b.jsonl", 2),
                                                  ("c.jsonl", 0)]),  # ties by name
])
def test_files_are_ranked_as_the_stream_reads_them_when_names_do_not_say_it(
    spark: SparkSession, landed: dict[str, int | None] | None,
    ranks: list[tuple[str, int]] | None,
) -> None:
    order = files_read_order(spark, landed)
    assert (None if order is None else sorted(
        (r["source_file"], r["read_rank"]) for r in order.collect())) == ranks


def test_sessions_longer_than_max_duration_are_split(spark: SparkSession) -> None:
    # One event every 20 minutes for 5 hours: one gap-run, cut every 2 hours.
    lines = [event("bot", f"{10 + m // 60:02d}:{m % 60:02d}") for m in range(0, 300, 20)]
    sessions = sessions_of(spark, lines, max_duration=timedelta(hours=2))
    spans = sessions.orderBy("session_start").select(
        F.date_format("session_start", "HH:mm"), F.date_format("session_end", "HH:mm"),
        "event_count",
    ).collect()
    assert [tuple(r) for r in spans] == [
        ("10:00", "11:40", 6), ("12:00", "13:40", 6), ("14:00", "14:40", 3),
    ]


def test_the_windows_in_start_order_sort_the_rows_once(spark: SparkSession) -> None:
    """Runs are found by two windows over each user's fragments in start order; the second
    must use the rows as the first left them sorted, not sort them again."""
    sessions = sessions_of(spark, [event("u", "10:00"), event("u", "10:05")])
    plan = sessions._jdf.queryExecution().executedPlan().toString()
    in_start_order = re.findall(r"Sort \[user_id#\d+ ASC NULLS FIRST, start_us#", plan)
    assert len(in_start_order) == 1, plan


def rows_only(frame: DataFrame) -> DataFrame:
    """``frame``'s rows in a new frame, without the plan that computed them."""
    return frame.sparkSession.createDataFrame(frame.collect(), frame.schema)


def interpreted_expressions(frame: DataFrame) -> list[str]:
    """The row expressions of ``frame``'s physical plan that Spark cannot compile
    (``CodegenFallback``), by name. Aggregate functions are left out: the imperative ones
    (``collect_list``) update their buffers without generated code by design."""
    jvm = frame.sparkSession._jvm
    assert jvm is not None
    fallback, aggregate = (jvm.java.lang.Class.forName(f"org.apache.spark.sql.catalyst.{name}")
                           for name in ("expressions.codegen.CodegenFallback",
                                        "expressions.aggregate.AggregateFunction"))
    found: list[str] = []

    def each(seq: Any) -> list[Any]:
        return [seq.apply(i) for i in range(seq.size())]

    def visit_expression(expression: Any) -> None:
        if fallback.isInstance(expression) and not aggregate.isInstance(expression):
            found.append(expression.prettyName())
            return
        for child in each(expression.children()):
            visit_expression(child)

    def visit_plan(plan: Any) -> None:
        for expression in each(plan.expressions()):
            visit_expression(expression)
        for child in each(plan.children()):
            visit_plan(child)

    visit_plan(frame._jdf.queryExecution().sparkPlan())
    return found


def test_sessions_are_made_by_compiled_code_only(spark: SparkSession) -> None:
    """An expression Spark cannot compile (a higher-order function's, such as ``array_sort``'s)
    is evaluated row by row, its inputs with it: sorting each session's pages that way took
    about half of the sessionization's window work for 1M events."""
    parsed = apply_guards(JsonLinesAdapter().parse(lines_frame(spark, [
        event("u", "10:00", "/b"), event("u", "10:05", "/a"), event("v", "10:00", "/a"),
    ])), NOW, timedelta(hours=1))
    events = rows_only(valid_events(parsed).select(*SESSIONIZED_EVENT_COLUMNS))
    state = rows_only(as_open_sessions(sessionize_events(events, GAP, DAY), 16, 0, NOW))
    later = rows_only(events.withColumn("event_time", F.col("event_time") + F.expr(
        "INTERVAL 10 MINUTES")).withColumn("event_id", F.concat("event_id", F.lit("-2"))))
    assigned = sessionize_batch(later, state, None, None, None, GAP, DAY)
    assert interpreted_expressions(batch_sessions(assigned)) == []
    assert interpreted_expressions(sessionize_events(events, GAP, DAY)) == []
    # The pages stay sorted, as array_sort left them.
    assert [r["pages"] for r in batch_sessions(assigned).orderBy("user_id").collect()] == [
        ["/a", "/b"], ["/a"]]

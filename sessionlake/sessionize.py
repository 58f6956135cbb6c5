"""Sessionization: where an event's session, and its lateness, are decided.

The same functions serve the stream and the batch (backfills, tests): a micro-batch is a
batch whose users' open sessions are added as *fragments* beside the new events. A
fragment is anything with a start, an end and session aggregates: a single event, or an
open session carried over from earlier batches. Sorting one user's fragments by start, a
new run begins where a fragment starts ``gap`` or more after every earlier fragment ended
(the same boundary as Spark's ``session_window``); a run longer than the maximum duration
is cut into sessions every ``max_duration`` from the run's start. Because open sessions
are fragments, an event that lands between two open sessions bridges them into one.

Lateness (SPEC, judged against the watermark W before the batch):

1. :func:`closed_session_hits` — an event within ``gap`` of one of the
   user's closed sessions would reopen a final session: late.
2. :func:`mark_late_new_sessions` — a session made only of this batch's events that would
   already be closed (``end + gap <= W``): its events are late.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

_MICROS = 1_000_000

#: What sessionization reads of an event: its user, id, time and page, and where its record
#: sits (``source_file``, ``source_line``: the record's key within a batch). The rest of
#: the event stays where it was parsed and is not carried through the shuffles.
SESSIONIZED_EVENT_COLUMNS: tuple[str, ...] = (
    "user_id", "event_id", "event_time", "page", "source_file", "source_line",
)

FRAGMENT_COLUMNS: tuple[str, ...] = (
    "user_id", "start_us", "end_us", "run_start_us", "event_count", "page_views",
    "state_session_id", "is_state", "event_id", "event_time", "page", "source_file",
    "source_line", "entry_event_id", "entry_page", "exit_event_id", "exit_page", "pages",
)


def micros(value: timedelta) -> int:
    """A duration in whole microseconds, the unit sessionization computes in."""
    return round(value.total_seconds() * _MICROS)


def micros_at(moment: datetime | None) -> int | None:
    """An instant in microseconds since the epoch (``None`` stays ``None``)."""
    return None if moment is None else round(moment.timestamp() * _MICROS)


def session_id(user_id: Column | str, session_start: Column | str) -> Column:
    """Deterministic session id: the first 32 hex digits of SHA-256 of user and start.

    A replay or a backfill of the same events therefore produces the same ids.
    """
    start = F.date_format(session_start, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS")
    return F.substring(F.sha2(F.concat_ws("|", user_id, start), 256), 1, 32)


def user_bucket(user_id: Column | str, buckets: int) -> Column:
    """The hash bucket of a user: open sessions are partitioned by it."""
    return F.pmod(F.xxhash64(user_id), F.lit(buckets)).cast("int")


#: What an open session carries of its first and last event and its pages; an event
#: fragment has these null (its own id and page stand for them).
_STATE_ENDS: tuple[tuple[str, str], ...] = (
    ("entry_event_id", "string"), ("entry_page", "string"), ("exit_event_id", "string"),
    ("exit_page", "string"), ("pages", "array<string>"),
)


def events_as_fragments(events: DataFrame) -> DataFrame:
    """Each event as a one-point fragment (start = end = its time)."""
    t = F.unix_micros("event_time")
    return events.select(
        "user_id",
        t.alias("start_us"), t.alias("end_us"), t.alias("run_start_us"),
        F.lit(1).cast("long").alias("event_count"),
        F.col("page").isNotNull().cast("long").alias("page_views"),
        F.lit(None).cast("string").alias("state_session_id"),
        F.lit(False).alias("is_state"),
        "event_id", "event_time", "page", "source_file", "source_line",
        *[F.lit(None).cast(kind).alias(name) for name, kind in _STATE_ENDS],
    )


def open_sessions_as_fragments(open_sessions: DataFrame) -> DataFrame:
    """Each open session (``open_sessions`` rows) as one fragment with its aggregates."""
    return open_sessions.select(
        "user_id",
        F.unix_micros("session_start").alias("start_us"),
        F.unix_micros("session_end").alias("end_us"),
        F.unix_micros("run_start").alias("run_start_us"),
        "event_count", "page_views",
        F.col("session_id").alias("state_session_id"),
        F.lit(True).alias("is_state"),
        *[F.lit(None).cast(t).alias(c) for c, t in (
            ("event_id", "string"), ("event_time", "timestamp"), ("page", "string"),
            ("source_file", "string"), ("source_line", "long"),
        )],
        *[name for name, _ in _STATE_ENDS],
    )


def assign_sessions(
    fragments: DataFrame,
    gap: timedelta,
    max_duration: timedelta,
    active: Column | None = None,
) -> DataFrame:
    """Give every fragment its session key (``user_id``, ``run_no``, ``chunk``).

    Also adds, per session, ``session_end_us`` and ``session_has_state`` (whether an open
    session from earlier batches is part of it), which the lateness rule needs.

    :param active: which fragments take part (default: all). The others ride along in the
        same partitions, so that a micro-batch decides duplicates and sessions in one
        pass over its users' rows; their session columns mean nothing.
    """
    gap_us, max_us = micros(gap), micros(max_duration)
    taking_part = F.lit(True) if active is None else active

    def of_active(column: str) -> Column:
        return F.when(taking_part, F.col(column))

    by_start = Window.partitionBy("user_id").orderBy(
        "start_us", "end_us", F.coalesce("state_session_id", "event_id")
    )
    ended_before = F.max(of_active("end_us")).over(
        by_start.rowsBetween(Window.unboundedPreceding, -1)
    )
    starts_run = (ended_before.isNull() | (F.col("start_us") - ended_before >= gap_us))
    run_no = F.sum((taking_part & F.col("starts_run")).cast("int")).over(
        by_start.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    run = Window.partitionBy("user_id", "run_no")
    session = Window.partitionBy("user_id", "run_no", "chunk")
    return (
        fragments.withColumn("starts_run", starts_run)
        .withColumn("run_no", run_no)
        .withColumn("run_start_us", F.min(of_active("run_start_us")).over(run))
        .withColumn(
            "chunk",
            F.floor((F.col("start_us") - F.col("run_start_us")) / F.lit(max_us)).cast("long"),
        )
        .withColumn("session_end_us", F.max(of_active("end_us")).over(session))
        .withColumn("session_has_state", F.max(of_active("is_state")).over(session))
        .drop("starts_run")
    )


def closed_session_hits(
    events: DataFrame, closed_sessions: DataFrame, watermark: datetime, gap: timedelta
) -> DataFrame:
    """Lateness rule 1: the events that fall within ``gap`` of one of their user's closed
    sessions, by record (``source_file``, ``source_line``), with ``late_reason``.

    Only events before the watermark can qualify (a closed session ended at least ``gap``
    before it), so only those are compared with ``closed_sessions`` (``sessions`` rows).
    """
    gap_us = micros(gap)
    t = F.unix_micros(F.col("e.event_time"))
    candidates = events.where(F.col("event_time") < F.lit(watermark)).alias("e")
    closed = closed_sessions.select(
        "user_id", "session_id",
        F.unix_micros("session_start").alias("start_us"),
        F.unix_micros("session_end").alias("end_us"),
    ).alias("s")
    return (
        candidates.join(
            closed,
            (F.col("e.user_id") == F.col("s.user_id"))
            & (F.col("s.start_us") - gap_us < t)
            & (t < F.col("s.end_us") + gap_us),
        )
        .groupBy(F.col("e.source_file").alias("source_file"),
                 F.col("e.source_line").alias("source_line"))
        .agg(F.concat(F.lit("within the gap of closed session "), F.min("s.session_id"))
             .alias("late_reason"))
    )


def sessionize_batch(
    events: DataFrame,
    open_sessions: DataFrame,
    seen: DataFrame | None,
    near_closed: DataFrame | None,
    watermark: datetime | None,
    gap: timedelta,
    max_duration: timedelta,
) -> DataFrame:
    """One micro-batch's events with their users' open sessions, in one pass by user.

    The rows are shuffled by user once; duplicates, then sessions, then lateness rule 2
    are decided in the partitions that shuffle made.

    :param events: the batch's valid events (:data:`SESSIONIZED_EVENT_COLUMNS`).
    :param open_sessions: the ``open_sessions`` rows of the batch's users.
    :param seen: ``user_id``, ``event_id`` of accepted events of earlier batches that the
        batch's events repeat (``None``: none).
    :param near_closed: rule 1's hits (:func:`closed_session_hits`), or ``None``.
    :return: one row per event and per open session (``is_state``): the fragment columns,
        ``is_duplicate``, ``late_reason`` (rule 1 or 2; set for events that are not
        duplicates) and the session key of :func:`assign_sessions`. The sessions are the
        groups of fragments that are neither duplicate nor late.
    """
    rows = events_as_fragments(events).withColumn("kind", F.lit(_EVENT))
    if near_closed is not None:
        rows = rows.join(F.broadcast(near_closed.withColumnRenamed("late_reason", "late_1")),
                         ["source_file", "source_line"], "left")
    else:
        rows = rows.withColumn("late_1", F.lit(None).cast("string"))
    rows = rows.unionByName(
        open_sessions_as_fragments(open_sessions).withColumn("kind", F.lit(_STATE)),
        allowMissingColumns=True,
    )
    if seen is not None:
        rows = rows.unionByName(
            seen.select("user_id", "event_id", F.lit(_SEEN).alias("kind")),
            allowMissingColumns=True,
        )
    # Within the batch the first occurrence of an id by (file, line) is kept; an id seen in
    # an earlier batch sorts before every occurrence, so none is kept.
    first = Window.partitionBy("user_id", "event_id").orderBy("kind", "source_file",
                                                              "source_line")
    deduped = (
        rows.repartition("user_id")
        .withColumn("is_duplicate",
                    (F.col("kind") == _EVENT) & (F.row_number().over(first) > 1))
        .where(F.col("kind") != _SEEN)
    )
    pending = F.col("is_state") | (~F.col("is_duplicate") & F.col("late_1").isNull())
    assigned = mark_late_new_sessions(
        assign_sessions(deduped, gap, max_duration, active=pending), watermark, gap
    )
    return assigned.withColumn(
        "late_reason",
        F.when(~F.col("is_state") & ~F.col("is_duplicate"),
               F.coalesce("late_1", "late_reason")),
    ).drop("kind", "late_1")


#: Row kinds of :func:`sessionize_batch`, in the order duplicates are decided.
_SEEN, _EVENT, _STATE = 0, 1, 2


def mark_late_new_sessions(
    assigned: DataFrame, watermark: datetime | None, gap: timedelta
) -> DataFrame:
    """Add ``late_reason`` to the events of sessions that would already be closed.

    A session made only of this batch's events whose ``end + gap <= W`` has missed its
    window: accepting it would add a session behind the watermark, after downstream
    consumers were told that period was final.
    """
    if watermark is None:
        return assigned.withColumn("late_reason", F.lit(None).cast("string"))
    w_us = micros_at(watermark)
    too_late = (~F.col("session_has_state")) & (
        F.col("session_end_us") + F.lit(micros(gap)) <= F.lit(w_us)
    )
    return assigned.withColumn(
        "late_reason",
        F.when(
            too_late,
            F.lit(f"its session would already be closed (end + gap <= watermark "
                  f"{watermark.isoformat()})"),
        ),
    )


def aggregate_sessions(assigned: DataFrame) -> DataFrame:
    """One row per session from its fragments, with the analytics columns.

    Columns: ``session_id``, ``user_id``, ``session_start``, ``session_end``,
    ``run_start``, ``event_count``, ``page_views``, ``entry_page``, ``entry_event_id``,
    ``exit_page``, ``exit_event_id``, ``pages``, ``previous_session_ids`` (the open
    sessions it absorbed, sorted), ``added_events`` (events of this batch).
    """
    state = F.col("is_state")
    no_pages = F.array().cast("array<string>")
    # Ordered by time, then id: the entry and exit pages stay the same however the events
    # were split into batches, even when two events share a timestamp.
    entry = F.struct(F.col("start_us").alias("t"),
                     F.when(state, F.col("entry_event_id")).otherwise(F.col("event_id"))
                     .alias("event_id"),
                     F.when(state, F.col("entry_page")).otherwise(F.col("page")).alias("page"))
    exit_ = F.struct(F.col("end_us").alias("t"),
                     F.when(state, F.col("exit_event_id")).otherwise(F.col("event_id"))
                     .alias("event_id"),
                     F.when(state, F.col("exit_page")).otherwise(F.col("page")).alias("page"))
    pages = F.when(state, F.coalesce("pages", no_pages)).when(
        F.col("page").isNotNull(), F.array("page")).otherwise(no_pages)
    grouped = assigned.groupBy("user_id", "run_no", "chunk").agg(
        F.min("start_us").alias("start_us"),
        F.max("end_us").alias("end_us"),
        F.min("run_start_us").alias("run_start_us"),
        F.sum("event_count").alias("event_count"),
        F.sum("page_views").alias("page_views"),
        F.min(entry).alias("entry"),
        F.max(exit_).alias("exit"),
        F.array_sort(F.array_distinct(F.flatten(F.collect_list(pages)))).alias("pages"),
        F.array_sort(F.collect_list("state_session_id")).alias("previous_session_ids"),
        F.sum(F.when(~F.col("is_state"), F.col("event_count")).otherwise(0))
        .alias("added_events"),
    )
    start = F.timestamp_micros("start_us")
    return grouped.select(
        session_id("user_id", start).alias("session_id"),
        "user_id",
        start.alias("session_start"),
        F.timestamp_micros("end_us").alias("session_end"),
        F.timestamp_micros("run_start_us").alias("run_start"),
        "event_count", "page_views",
        F.col("entry.page").alias("entry_page"),
        F.col("entry.event_id").alias("entry_event_id"),
        F.col("exit.page").alias("exit_page"),
        F.col("exit.event_id").alias("exit_event_id"),
        "pages", "previous_session_ids", "added_events",
    )


def sessionize_events(events: DataFrame, gap: timedelta, max_duration: timedelta) -> DataFrame:
    """Batch sessionization of ``events`` alone (backfills, and the reference in tests).

    :return: the rows of :func:`aggregate_sessions`.
    """
    return aggregate_sessions(
        assign_sessions(events_as_fragments(events), gap, max_duration)
    )


def as_closed_sessions(
    sessions: DataFrame, gap: timedelta, batch_id: int, closed_at: datetime
) -> DataFrame:
    """Aggregated sessions in the shape of the ``sessions`` table."""
    return sessions.select(
        "session_id", "user_id", "session_start", "session_end",
        (F.unix_micros("session_end") - F.unix_micros("session_start")).cast("double")
        .__truediv__(_MICROS).alias("duration_s"),
        "event_count", "page_views",
        F.size("pages").cast("int").alias("distinct_pages"),
        "entry_page", "exit_page",
        (F.col("event_count") == 1).alias("is_bounce"),
        F.lit(int(gap.total_seconds())).cast("long").alias("gap_s"),
        F.lit(batch_id).cast("long").alias("closed_batch_id"),
        F.lit(closed_at).cast("timestamp").alias("closed_at"),
        F.to_date("session_start").alias("session_date"),
    )


def as_open_sessions(
    sessions: DataFrame, buckets: int, batch_id: int, updated_at: datetime
) -> DataFrame:
    """Aggregated sessions in the shape of the ``open_sessions`` table."""
    return sessions.select(
        "session_id", "user_id", user_bucket("user_id", buckets).alias("user_bucket"),
        "session_start", "session_end", "run_start", "event_count", "page_views",
        "entry_page", "entry_event_id", "exit_page", "exit_event_id", "pages",
        F.lit(batch_id).cast("long").alias("updated_batch_id"),
        F.lit(updated_at).cast("timestamp").alias("updated_at"),
    )

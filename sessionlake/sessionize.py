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

import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

_MICROS = 1_000_000

#: What sessionization reads of an event: its user, id, time and page, and where its record
#: sits (``source_file``, ``source_line``: the record's key within a batch). The rest of
#: the event stays where it was parsed and is not carried through the shuffles.
SESSIONIZED_EVENT_COLUMNS: tuple[str, ...] = (
    "user_id", "event_id", "event_time", "page", "source_file", "source_line",
)


def micros(value: timedelta) -> int:
    """A duration in whole microseconds, the unit sessionization computes in."""
    return round(value.total_seconds() * _MICROS)


def micros_at(moment: datetime | None) -> int | None:
    """An instant in microseconds since the epoch (``None`` stays ``None``)."""
    return None if moment is None else round(moment.timestamp() * _MICROS)


#: The zero of every instant counted in microseconds.
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def moment_at(micros: int | None) -> datetime | None:
    """An instant counted in microseconds since the epoch (Spark's ``unix_micros``) as a
    UTC datetime, :func:`micros_at` the other way (``None`` stays ``None``)."""
    return None if micros is None else EPOCH + timedelta(microseconds=int(micros))


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


def event_date() -> Column:
    """The UTC day of an event's time: the partition of ``events`` it is appended to, and
    the day on which copies of it are looked for (same user, id and day)."""
    return F.to_date("event_time")


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
        F.lit(None).cast("long").alias("stored_run_start_us"),
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
        # Kept apart from run_start_us, which sessionization replaces with the start of
        # the run the session is part of now (see _assign_runs).
        F.unix_micros("run_start").alias("stored_run_start_us"),
    )


def open_session_events(open_sessions: DataFrame, events: DataFrame) -> DataFrame:
    """Each open session as its accepted events, one ``open_sessions``-shaped row per event
    (keeping the session's id and run start), so that sessionization can cut it anew.

    An open session is one fragment, cut where its run's start put the cuts when it was
    written; a later event that starts the run earlier moves them (see
    :func:`straddles_a_cut`), and only its events can say where the session splits.

    :param events: ``events`` rows (``user_id``, ``event_id``, ``event_time``, ``page``).
    """
    s, e = open_sessions.alias("s"), events.alias("e")
    page = F.col("e.page")
    return s.join(
        e,
        (F.col("e.user_id") == F.col("s.user_id"))
        & F.col("e.event_time").between(F.col("s.session_start"), F.col("s.session_end")),
    ).select(
        F.col("s.session_id").alias("session_id"),
        F.col("s.user_id").alias("user_id"),
        F.col("e.event_time").alias("session_start"),
        F.col("e.event_time").alias("session_end"),
        F.col("s.run_start").alias("run_start"),
        F.lit(1).cast("long").alias("event_count"),
        page.isNotNull().cast("long").alias("page_views"),
        F.col("e.event_id").alias("entry_event_id"), page.alias("entry_page"),
        F.col("e.event_id").alias("exit_event_id"), page.alias("exit_page"),
        F.when(page.isNotNull(), F.array(page))
        .otherwise(F.array().cast("array<string>")).alias("pages"),
    )


def straddles_a_cut(max_duration: timedelta) -> Column:
    """On :func:`sessionize_batch`'s rows: an open session that now spans one of its run's
    cuts (its run starts earlier than when it was written), so it must be cut anew from
    its events (:func:`open_session_events`)."""
    return F.col("is_state") & (_chunk(F.col("end_us"), micros(max_duration)) != F.col("chunk"))


def _chunk(time_us: Column, max_us: int) -> Column:
    """Which ``max_us``-long piece of its run (from ``run_start_us``) a time falls in."""
    return F.floor((time_us - F.col("run_start_us")) / F.lit(max_us)).cast("long")


def assign_sessions(
    fragments: DataFrame, gap: timedelta, max_duration: timedelta
) -> DataFrame:
    """Give every fragment its session key (``user_id``, ``run_no``, ``chunk``).

    Also adds, per session, ``session_has_state``: whether one of the fragments given as
    sessions (``is_state``) is part of it.
    """
    session = Window.partitionBy("user_id", "run_no", "chunk")
    return _assign_runs(fragments, gap, max_duration, None).withColumn(
        "session_has_state", F.max("is_state").over(session))


def _assign_runs(
    fragments: DataFrame, gap: timedelta, max_duration: timedelta, active: Column | None
) -> DataFrame:
    """Add ``run_no``, the run's ``run_start_us``, ``run_end_us`` and ``run_has_state``
    (whether an open session from earlier batches is part of it), and ``chunk`` to every
    fragment.

    :param active: which fragments take part (``None``: all). The others ride along in the
        same partitions, so that a micro-batch decides duplicates and sessions in one
        pass over its users' rows; their run columns mean nothing.
    """
    gap_us, max_us = micros(gap), micros(max_duration)
    of_active = _only(active)
    # The two windows in start order sort by the same columns. Were the tie-breaker an
    # expression, each window would compute it anew, and Spark, not knowing the rows already
    # sorted by it, would sort them again.
    by_start = Window.partitionBy("user_id").orderBy("start_us", "end_us", _TIE_BREAK)
    ended_before = F.max(of_active(F.col("end_us"))).over(
        by_start.rowsBetween(Window.unboundedPreceding, -1)
    )
    starts_run = (ended_before.isNull() | (F.col("start_us") - ended_before >= gap_us))
    taking_part = F.lit(True) if active is None else active
    run_no = F.sum((taking_part & F.col("starts_run")).cast("int")).over(
        by_start.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    run = Window.partitionBy("user_id", "run_no")
    return (
        fragments.withColumn(_TIE_BREAK, _fragment_key())
        .withColumn("starts_run", starts_run)
        .withColumn("run_no", run_no)
        .withColumn("run_start_us", F.min(of_active(F.col("run_start_us"))).over(run))
        .withColumn("run_end_us", F.max(of_active(F.col("end_us"))).over(run))
        .withColumn("run_has_state", F.max(of_active(F.col("is_state"))).over(run))
        .withColumn("chunk", _chunk(F.col("start_us"), max_us))
        .drop("starts_run", _TIE_BREAK)
    )


#: The column of :func:`_fragment_key` while :func:`_assign_runs` orders fragments.
_TIE_BREAK = "fragment_key"


def _fragment_key() -> Column:
    """A fragment's id (its open session's, or its event's): what orders fragments that
    start and end at the same instant."""
    return F.coalesce("state_session_id", "event_id")


#: The digits :func:`id_order` reads as the number an id ends in.
_DIGITS = "0123456789"


def id_order(event_id: Column) -> Column:
    """What orders events of the same instant: the id, the number it ends in compared as a
    number (the text before it, then how many digits it has, then the id), so that the ids
    given to events without one follow their lines and offsets (``part-7.log#7`` before
    ``part-7.log#15``), not their text. Computed from the id alone, so the open session's
    stored first and last ids order the same way in every batch. (A trim and a length, not
    a regular expression: in a micro-benchmark of a million ids, warm, first and last id
    per user cost 0.2-0.4 s more with this order, 0.5 s more with a regular expression.)"""
    text = F.rtrim(event_id, F.lit(_DIGITS))
    return F.struct(text.alias("text"), (F.length(event_id) - F.length(text)).alias("digits"))


def _only(active: Column | None) -> Callable[[Column], Column]:
    """``column`` where ``active`` holds, else null (the identity when it always holds)."""
    if active is None:
        return lambda column: column
    condition = active
    return lambda column: F.when(condition, column)


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


def files_read_order(spark: SparkSession, landed: Mapping[str, int | None] | None
                     ) -> DataFrame | None:
    """The files of a batch (``landed``: each ``source_file``'s modification time when the
    stream listed it, in ms) ranked as Spark's file source takes files: oldest first, then
    by name; a file whose time is not known last. ``None`` when the names alone give that
    order (files named as they land, the usual case: the batch then orders copies by
    name with no join) and for fewer than two files.

    It decides which of an event's copies a batch of several files keeps, so that it is
    the copy a batch of each file would keep, whatever the files' names. Made from one
    JSON literal, it is computed in the JVM (see :func:`~sessionlake.tables.literal_row`)
    and its plan holds one node however many files the batch has."""
    if landed is None or len(landed) < 2:
        return None
    ordered = sorted(landed, key=lambda name: (landed[name] is None, landed[name] or 0, name))
    if ordered == sorted(landed):
        return None
    ranks = json.dumps([{"source_file": name, "read_rank": rank}
                        for rank, name in enumerate(ordered)])
    return spark.range(1).select(F.inline(F.from_json(
        F.lit(ranks), "array<struct<source_file: string, read_rank: int>>")))


def sessionize_batch(
    events: DataFrame,
    open_sessions: DataFrame | None,
    seen: DataFrame | None,
    near_closed: DataFrame | None,
    watermark: datetime | None,
    gap: timedelta,
    max_duration: timedelta,
    read_order: DataFrame | None = None,
) -> DataFrame:
    """One micro-batch's events with their users' open sessions, in one pass by user.

    The rows are shuffled by user once; duplicates, then sessions, then lateness rule 2
    are decided in the partitions that shuffle made.

    :param events: the batch's valid events (:data:`SESSIONIZED_EVENT_COLUMNS`).
    :param open_sessions: the ``open_sessions`` rows of the batch's users (``None``: none).
    :param seen: ``user_id``, ``event_id``, ``event_date`` of events earlier batches
        recorded (accepted or late) that the batch's events repeat (``None``: none).
    :param near_closed: rule 1's hits (:func:`closed_session_hits`), or ``None``.
    :param read_order: ``source_file`` and ``read_rank``: the batch's files in the order
        the stream takes files (:func:`files_read_order`), or ``None`` (one file, or not
        known): of an event's copies in two files the first read is kept.
    :return: one row per event and per open session (``is_state``): the fragment columns,
        ``is_duplicate``, ``late_reason`` (rule 1 or 2; set for events that are not
        duplicates), the run and session columns of :func:`_assign_runs`, and on one
        row of each session (``is_head``) its aggregates: :func:`batch_sessions` reads
        the sessions from there.
    """
    rows = events_as_fragments(events).withColumn("kind", F.lit(_EVENT))
    if read_order is not None:
        rows = rows.join(F.broadcast(read_order), "source_file", "left").select(
            *rows.columns, "read_rank")
    if near_closed is not None:
        rows = rows.join(F.broadcast(near_closed.withColumnRenamed("late_reason", "late_1")),
                         ["source_file", "source_line"], "left")
    else:
        rows = rows.withColumn("late_1", F.lit(None).cast("string"))
    if open_sessions is not None:
        rows = rows.unionByName(
            open_sessions_as_fragments(open_sessions).withColumn("kind", F.lit(_STATE)),
            allowMissingColumns=True,
        )
    if seen is not None:
        rows = rows.unionByName(
            seen.select("user_id", "event_id",
                        F.col("event_date").cast("timestamp").alias("event_time"),
                        F.lit(_SEEN).alias("kind")),
            allowMissingColumns=True,
        )
    # Copies of an event are its user's events with its id on its day (of event time), as
    # earlier batches are searched. Within the batch the first read is kept: the first by
    # file in the order the stream takes files, then by line, as a batch of each file
    # would keep it; an id seen in an earlier batch sorts before every occurrence, so none
    # is kept.
    first = Window.partitionBy("user_id", "event_id", event_date()).orderBy(
        "kind", *(["read_rank"] if read_order is not None else []),
        "source_file", "source_line")
    deduped = (
        rows.repartition("user_id")
        .withColumn("is_duplicate",
                    (F.col("kind") == _EVENT) & (F.row_number().over(first) > 1))
        .where(F.col("kind") != _SEEN)
    )
    if read_order is not None:
        deduped = deduped.drop("read_rank")
    pending = F.col("is_state") | (~F.col("is_duplicate") & F.col("late_1").isNull())
    # The session's aggregates come from the same sorted pass, on its first row (the head).
    session = Window.partitionBy("user_id", "run_no", "chunk").orderBy(
        F.when(pending, 0).otherwise(1), "start_us", "end_us",
        _fragment_key(),
    )
    whole = session.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    runs = _assign_runs(deduped, gap, max_duration, pending)
    assigned = mark_late_new_sessions(runs.select(
        *runs.columns,
        (pending & (F.row_number().over(session) == 1)).alias("is_head"),
        *[finish(aggregate.over(whole)).alias(_SESSION_PREFIX + name)
          for name, (aggregate, finish) in _session_parts(pending).items()],
    ), watermark, gap)
    return assigned.select(
        *[c for c in assigned.columns
          if c not in ("kind", "late_1", "late_reason") and not c.startswith(_SESSION_PREFIX)],
        F.when(~F.col("is_state") & ~F.col("is_duplicate"),
               F.coalesce("late_1", "late_reason")).alias("late_reason"),
        *[F.when(F.col("is_head"), F.col(c)).alias(c)
          for c in assigned.columns if c.startswith(_SESSION_PREFIX)],
    )


#: Row kinds of :func:`sessionize_batch`, in the order duplicates are decided.
_SEEN, _EVENT, _STATE = 0, 1, 2
#: Where :func:`sessionize_batch` puts a session's aggregates (on its head row).
_SESSION_PREFIX = "session_part_"


def mark_late_new_sessions(
    assigned: DataFrame, watermark: datetime | None, gap: timedelta
) -> DataFrame:
    """Add ``late_reason`` to the events of sessions that would already be closed.

    A session made only of this batch's events whose ``end + gap <= W`` has missed its
    window: accepting it would add a session behind the watermark, after downstream
    consumers were told that period was final.

    The session judged is the whole run (the gap session, before the maximum duration cuts
    it), as Kafka Streams judges a merged session: a run that reaches an open session or
    ends within the window is accepted whole, pieces cut off behind the watermark too. So a
    late event never shares a run with an accepted one, and cannot move where an accepted
    run is cut.
    """
    if watermark is None:
        return assigned.withColumn("late_reason", F.lit(None).cast("string"))
    w_us = micros_at(watermark)
    too_late = (~F.col("run_has_state")) & (
        F.col("run_end_us") + F.lit(micros(gap)) <= F.lit(w_us)
    )
    return assigned.withColumn(
        "late_reason",
        F.when(
            too_late,
            F.lit(f"its session would already be closed (end + gap <= watermark "
                  f"{watermark.isoformat()})"),
        ),
    )


def _session_parts(
    active: Column | None,
) -> dict[str, tuple[Column, Callable[[Column], Column]]]:
    """The aggregates that make a session of its fragments (those where ``active`` holds,
    or all), by name, each with what finishes its value (an aggregate in a window is
    finished after ``over``); :func:`_as_sessions` turns them into the session's columns."""
    of = _only(active)
    state = F.col("is_state")
    no_pages = F.array().cast("array<string>")
    # Ordered by time, then id (:func:`id_order`): the entry and exit pages stay the same
    # however the events were split into batches, even when two events share a timestamp.
    entry_id = F.when(state, F.col("entry_event_id")).otherwise(F.col("event_id"))
    exit_id = F.when(state, F.col("exit_event_id")).otherwise(F.col("event_id"))
    entry = F.struct(F.col("start_us").alias("t"), id_order(entry_id).alias("order"),
                     entry_id.alias("event_id"),
                     F.when(state, F.col("entry_page")).otherwise(F.col("page")).alias("page"))
    exit_ = F.struct(F.col("end_us").alias("t"), id_order(exit_id).alias("order"),
                     exit_id.alias("event_id"),
                     F.when(state, F.col("exit_page")).otherwise(F.col("page")).alias("page"))
    pages = F.when(state, F.coalesce("pages", no_pages)).when(
        F.col("page").isNotNull(), F.array("page")).otherwise(no_pages)
    def distinct_sorted(lists: Column) -> Column:
        return F.sort_array(F.array_distinct(F.flatten(lists)))

    return {
        "start_us": (F.min(of(F.col("start_us"))), _same),
        "end_us": (F.max(of(F.col("end_us"))), _same),
        "run_start_us": (F.min(of(F.col("run_start_us"))), _same),
        "run_start_before_us": (F.min(of(F.col("stored_run_start_us"))), _same),
        "event_count": (F.sum(of(F.col("event_count"))), _same),
        "page_views": (F.sum(of(F.col("page_views"))), _same),
        "entry": (F.min(of(entry)), _same),
        "exit": (F.max(of(exit_)), _same),
        "pages": (F.collect_list(of(pages)), distinct_sorted),
        "previous_session_ids": (F.collect_list(of(F.col("state_session_id"))),
                                 lambda ids: F.sort_array(F.array_distinct(ids))),
        "added_events": (F.sum(of(F.when(~state, F.col("event_count")).otherwise(0))), _same),
    }


def _same(column: Column) -> Column:
    return column


def _as_sessions(parts: DataFrame, prefix: str = "") -> DataFrame:
    """Sessions (see :func:`aggregate_sessions`) from ``user_id`` and the aggregates of
    :func:`_session_parts`, named with ``prefix``."""
    def part(name: str) -> Column:
        return F.col(prefix + name)

    start = F.timestamp_micros(part("start_us"))
    return parts.select(
        session_id("user_id", start).alias("session_id"),
        "user_id",
        start.alias("session_start"),
        F.timestamp_micros(part("end_us")).alias("session_end"),
        F.timestamp_micros(part("run_start_us")).alias("run_start"),
        F.timestamp_micros(part("run_start_before_us")).alias("run_start_before"),
        part("event_count").alias("event_count"),
        part("page_views").alias("page_views"),
        part("entry")["page"].alias("entry_page"),
        part("entry")["event_id"].alias("entry_event_id"),
        part("exit")["page"].alias("exit_page"),
        part("exit")["event_id"].alias("exit_event_id"),
        part("pages").alias("pages"),
        part("previous_session_ids").alias("previous_session_ids"),
        part("added_events").alias("added_events"),
    )


def aggregate_sessions(assigned: DataFrame) -> DataFrame:
    """One row per session from its fragments, with the analytics columns.

    Columns: ``session_id``, ``user_id``, ``session_start``, ``session_end``,
    ``run_start``, ``run_start_before`` (the earliest run start its open sessions were
    written with; null for a session of events alone), ``event_count``, ``page_views``,
    ``entry_page``, ``entry_event_id``, ``exit_page``, ``exit_event_id``, ``pages``,
    ``previous_session_ids`` (the open sessions it absorbed, sorted), ``added_events``
    (events of this batch).
    """
    grouped = assigned.groupBy("user_id", "run_no", "chunk").agg(
        *[finish(aggregate).alias(name)
          for name, (aggregate, finish) in _session_parts(None).items()]
    )
    return _as_sessions(grouped)


def batch_sessions(assigned: DataFrame) -> DataFrame:
    """The sessions of :func:`sessionize_batch`'s rows (see :func:`aggregate_sessions`)."""
    return _as_sessions(
        assigned.where(F.col("is_head") & F.col("late_reason").isNull()), _SESSION_PREFIX
    )


def drop_duplicate_events(events: DataFrame) -> DataFrame:
    """``events`` with one event of each user, id and day (of event time): the copies a
    micro-batch counts as duplicates (:func:`sessionize_batch`), for a sessionization of
    the whole input at once that must give the stream's sessions."""
    day = "__event_day"
    return events.withColumn(day, event_date()) \
        .dropDuplicates(["user_id", "event_id", day]).drop(day)


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

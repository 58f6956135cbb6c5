"""Backfill: re-cut the closed sessions of a date range from ``events``, with any gap.

``sessionlake backfill --from FIRST --to LAST [--gap G]`` (and the ``sessionlake_backfill``
DAG) replaces the sessions of the UTC dates FIRST..LAST in ``sessions`` by sessionizing
their events again, with the same functions as the stream (:func:`sessionize_events`),
the backfill's gap and the maximum duration the lake's stream cuts its sessions with (the
configured one on a lake whose stream noted none).

What is replaced, and which events are read
-------------------------------------------
Exactly the closed sessions whose ``session_date`` (UTC date of ``session_start``) lies in
the range, and exactly *their* events: for each such session, the user's events from its
start to its end in ``events`` (one user's sessions never overlap, so these are the
session's events). Reading the events of the sessions being replaced, rather than every
event of a window around the range, is what keeps the range's edges right whatever the gap:

* A session that starts before FIRST (at 23:50 the day before, running past midnight) or
  after LAST is not replaced, and its events are not read: it stays as it is, and none of
  its events can turn up a second time in a re-cut session of the range. For the same
  reason a re-cut never joins a session of the range to one outside it, even when the new
  gap would (the one outside is final and not part of the backfill).
* A shorter gap can split a session that started on LAST and ran past midnight; its later
  pieces then start on the next day. They are written too (their events were in the range)
  in the same commit, and reported as ``spilled``; a second run leaves them alone.
* A run longer than the maximum duration is split every ``max_session_duration`` from its
  first event *read*: for a run that began before FIRST, the split points inside the range
  can differ from the stream's (the same limit as a batch sessionization of the range).

Open sessions: only closed sessions are final
---------------------------------------------
Sessions still in ``open_sessions`` belong to the stream: a backfill never reads their
events, never writes them, and never touches ``open_sessions``. The stream closes them later
with its own gap and appends them to ``sessions`` as usual, so no event is counted twice
however far the range reaches (even up to today): an event is either in a closed session,
which a backfill may re-cut, or in an open one, which it leaves alone. The report counts the
open sessions that start in the range (``open_left``); run the backfill again once the
watermark has passed them to re-cut those days completely.

One atomic commit, safe beside a running stream
-----------------------------------------------
The range is replaced by one overwrite commit whose condition (Delta's ``replaceWhere``,
given as a DataFrame filter) is the dates FIRST to LAST, plus the spilled pieces
(``session_date > LAST`` with this backfill's ``closed_at``, which no other row has). The
condition's values are literals of validated :class:`~datetime.date` objects and a
timestamp, never SQL text. The rows to write are computed *inside*
that write: its plan reads ``sessions`` without a pinned version, and Delta scans a table
that a transaction is writing with that transaction's snapshot. So the rows removed are
exactly the rows whose events were re-cut; a session the stream appends meanwhile is
either in that snapshot (and re-cut) or committed after it (and kept: the stream's blind
appends do not conflict). A commit race lost to another writer (OPTIMIZE, retention) is
redone from the start by :func:`~sessionlake.conflicts.retry_on_conflict`.

If the events of a session in the range are incomplete in ``events`` (retention dropped
them before the sessions, an erasure was cut short), re-cutting would lose events: the
write's own plan checks the count of every replaced session and fails before anything is
committed, and the backfill raises :class:`BackfillError`.

Idempotency, and a crash between the two writes
------------------------------------------------
Sessions ids are a hash of user and start, so re-cutting the events of backfilled sessions
with the same gap gives the same rows. A run first checks whether the range already holds
exactly what it would write (every row written by one backfill with this gap, identical
once re-cut): then it rewrites nothing, and the first run's ``closed_at`` stays. The
``session_changelog`` rows (``batch_id = -1``, ``change = 'backfill'``, one per written
session, ``previous_session_ids`` = the replaced sessions it took events from) are appended
after the replace, with the Delta transaction key ``txnAppId =
sessionlake-backfill-<processing time in µs>``, ``txnVersion = 0``: the processing time is
the ``closed_at`` of the rows of that replace, so a rerun after a crash between the two
writes finds the range already applied, appends the missing changelog rows once, and a
rerun after both writes appends nothing.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from sessionlake.checkpoint import lake_batch_lock, noted_session_rules
from sessionlake.config import ActionableError, Settings, format_duration
from sessionlake.conflicts import retry_on_conflict
from sessionlake.ledger import Clock, utc_now
from sessionlake.sessionize import as_closed_sessions, micros_at, moment_at, sessionize_events
from sessionlake.spark import quiet_task_failures
from sessionlake.tables import (
    BATCH_METRICS,
    EVENTS,
    OPEN_SESSIONS,
    SESSION_CHANGELOG,
    SESSIONS,
    not_a_lake,
    path_identifier,
    read_table,
    single_row,
    table_path,
)
from sessionlake.validation import EVENT_COLUMNS

log = logging.getLogger("sessionlake.backfill")

#: ``closed_batch_id`` of backfilled sessions and ``batch_id`` of their changelog rows.
BACKFILL_BATCH_ID = -1
#: ``change`` of the changelog rows of a backfill.
BACKFILL_CHANGE = "backfill"
#: The tables a backfill reads or writes; all must exist (``sessionlake run`` creates them).
REQUIRED_TABLES: tuple[str, ...] = (EVENTS, SESSIONS, SESSION_CHANGELOG, OPEN_SESSIONS,
                                    BATCH_METRICS)

_GUARD = "sessionlake-backfill-incomplete-events"
_GUARD_DETAIL = re.compile(re.escape(_GUARD) + r"\{(.*?)\}")


class BackfillError(ActionableError):
    """A backfill refused before writing anything; the message says what to do."""


@dataclass(frozen=True)
class BackfillReport:
    """What a backfill found and did (``sessions_*`` count rows with a date in the range)."""

    first: date
    last: date
    gap: timedelta
    sessions_before: int
    sessions_after: int
    spilled: int
    events_read: int
    open_left: int
    watermark: datetime | None
    processing_time: datetime | None
    sessions_version: int | None
    changelog_version: int | None
    already_applied: bool = False

    def summary(self) -> str:
        """One line for the command line and the task log."""
        sessions = f"sessions in range {self.sessions_before} -> {self.sessions_after}"
        if self.spilled:
            sessions += f" (+{self.spilled} starting after {self.last.isoformat()})"
        if self.already_applied:
            writes = "already applied, sessions not rewritten"
            if self.changelog_version is not None:
                writes += f"; completed session_changelog v{self.changelog_version}"
        elif self.sessions_version is None:
            writes = "no closed session in range, nothing written"
        else:
            changelog = ("-" if self.changelog_version is None
                         else f"v{self.changelog_version}")
            writes = f"wrote sessions v{self.sessions_version}, session_changelog {changelog}"
        watermark = "none" if self.watermark is None else self.watermark.isoformat()
        return (
            f"backfill {self.first.isoformat()}..{self.last.isoformat()} "
            f"gap {format_duration(self.gap)}: {sessions}, {self.events_read} events read, "
            f"{self.open_left} open session(s) in range left to the stream "
            f"(watermark {watermark}); {writes}"
        )


@dataclass(frozen=True)
class _Replaced:
    """The outcome of the replace step."""

    processing_time: datetime | None  # None: no closed session in the range
    already_applied: bool
    rows_before: int


#: What a backfill does, in order: for a progress bar.
BACKFILL_STEPS = ("sessions replaced", "stream position read", "changelog recorded")


def backfill_sessions(
    spark: SparkSession,
    settings: Settings,
    first: date,
    last: date,
    clock: Clock = utc_now,
    on_step: Callable[[str], None] | None = None,
) -> BackfillReport:
    """Replace the closed sessions of the dates ``first``..``last`` (UTC, inclusive).

    Re-cuts the events of those sessions with ``settings.gap`` and
    ``settings.max_session_duration`` (see the module documentation for the exact rules:
    open sessions are left to the stream, the range's edges never move an event between a
    replaced and a kept session), in one atomic ``replaceWhere`` commit of ``sessions``,
    then records one ``session_changelog`` row per written session. Running it again with
    the same inputs changes nothing.

    :param clock: the processing time source (``closed_at``, ``changed_at``).
    :param on_step: called after each of its :data:`BACKFILL_STEPS` (progress).
    :raises BackfillError: before anything is written, when the dates or the gap are
        wrong, the lake does not exist, or the range's events are incomplete.
    """
    _validate(settings, first, last)
    if (why := not_a_lake(spark, settings.lake, REQUIRED_TABLES)) is not None:
        raise BackfillError(why)
    settings = with_the_stream_s_longest_session(spark, settings)
    what = f"backfill of sessions {first.isoformat()}..{last.isoformat()}"
    try:
        # The guard below fails a task on purpose; its refusal is said once, in one line,
        # instead of after Spark's log of the task's stack trace.
        with quiet_task_failures(spark):
            replaced = retry_on_conflict(
                lambda: _replace_range(spark, settings, first, last, clock), what
            )
    except Exception as error:
        detail = incomplete_events_detail(error)
        if detail is None:
            raise
        raise BackfillError(
            f"cannot backfill {first.isoformat()}..{last.isoformat()}: {detail}; "
            "re-cutting them would lose events, so nothing was written (if a micro-batch "
            "was committing at that moment, run the backfill again)"
        ) from None

    step = on_step or (lambda _name: None)
    step(BACKFILL_STEPS[0])
    watermark, open_left = _stream_position(spark, settings.lake, first, last)
    step(BACKFILL_STEPS[1])
    if replaced.processing_time is None:
        report = BackfillReport(
            first, last, settings.gap, 0, 0, 0, 0, open_left, watermark, None, None, None
        )
    else:
        with lake_batch_lock(settings.lake):
            report = _record_changelog(
                spark, settings, first, last, replaced, watermark, open_left
            )
    step(BACKFILL_STEPS[2])
    log.info("%s", report.summary())
    return report


def with_the_stream_s_longest_session(spark: SparkSession, settings: Settings) -> Settings:
    """``settings`` with the maximum session duration the lake's stream cuts its sessions
    with, where its first run noted one (:func:`~sessionlake.checkpoint.noted_session_rules`).

    A backfill re-cuts a range with any gap, but a session of the stream is never longer
    than its maximum: with the configured one instead (24 hours by default), a backfill
    cut the 31-hour session of a 48-hour lake in two (a review).

    :raises BackfillError: for a gap longer than that maximum.
    """
    try:
        noted = noted_session_rules(spark, settings.lake) or {}
    except (ValueError, KeyError, TypeError):
        noted = {}  # a damaged note: the doctor names it; the configured maximum holds
    if "max_session_duration_s" not in noted:
        return settings
    longest = timedelta(seconds=noted["max_session_duration_s"])
    if settings.gap > longest:
        raise BackfillError(
            f"the gap {format_duration(settings.gap)} is longer than the longest session "
            f"the lake's stream cuts ({format_duration(longest)}, its "
            "--max-session-duration): give a shorter --gap")
    if longest != settings.max_session_duration:
        log.info("sessions cut at most %s long, as the lake's stream cuts them",
                 format_duration(longest))
    return replace(settings, max_session_duration=longest)


#: The days a backfill range may name: Spark failed on 0001-01-01 with an error without a
#: message, and the day after 9999-12-31 is past Python's dates (a review).
BACKFILL_DAYS = (date(1900, 1, 1), date(9999, 12, 30))


def _validate(settings: Settings, first: date, last: date) -> None:
    for flag, value in (("--from", first), ("--to", last)):
        if isinstance(value, datetime) or not isinstance(value, date):
            raise BackfillError(f"{flag} must be a date such as 2026-01-05, got {value!r}")
    for flag, value in (("--from", first), ("--to", last)):
        if not BACKFILL_DAYS[0] <= value <= BACKFILL_DAYS[1]:
            raise BackfillError(
                f"{flag} {value.isoformat()} is out of range: give a day from "
                f"{BACKFILL_DAYS[0].isoformat()} to {BACKFILL_DAYS[1].isoformat()}")
    if first > last:
        raise BackfillError(
            f"--from {first.isoformat()} is after --to {last.isoformat()}: "
            "give the first day, then the last day (inclusive)"
        )
    if settings.gap <= timedelta(0):
        raise BackfillError(f"the gap must be longer than 0, got {settings.gap}")
    if settings.max_session_duration <= timedelta(0):
        raise BackfillError(
            f"the maximum session duration must be longer than 0, "
            f"got {settings.max_session_duration}"
        )


def _plain(day: date) -> date:
    """``day`` as an exact :class:`date` (no subclass can change how it is written)."""
    return date(day.year, day.month, day.day)


def in_range(first: date, last: date) -> Column:
    """Rows of ``sessions`` whose ``session_date`` is within ``first``..``last``."""
    return F.col("session_date").between(F.lit(_plain(first)), F.lit(_plain(last)))


def replace_predicate(first: date, last: date, processing_time: datetime) -> Column:
    """The rows of ``sessions`` a backfill replaces: its overwrite condition.

    The range's dates, plus the sessions this very backfill writes after ``last`` (pieces
    of a session that started on ``last`` and was split by a shorter gap): they are the
    only rows after ``last`` with ``closed_batch_id = -1`` and this ``closed_at``, so the
    condition deletes nothing that exists before the commit. Its values are literals of a
    DataFrame filter, never SQL text.
    """
    return in_range(first, last) | (
        (F.col("session_date") > F.lit(_plain(last)))
        & (F.col("closed_batch_id") == F.lit(BACKFILL_BATCH_ID))
        & (F.col("closed_at") == F.lit(processing_time.astimezone(UTC)))
    )


def recut_sessions(
    spark: SparkSession,
    settings: Settings,
    first: date,
    last: date,
    events_until: date,
    processing_time: datetime,
) -> DataFrame:
    """The range's closed sessions re-cut from their events, as ``sessions`` rows.

    Reads the current ``sessions`` (no pinned version: inside a Delta write of
    ``sessions`` the scan uses the writing transaction's snapshot) and the ``events``
    partitions ``first``..``events_until``. If any replaced session does not find all of its
    events, evaluating the frame fails with an error that :func:`incomplete_events_detail`
    recognises, so a write of it commits nothing.
    """
    gap, max_duration = settings.gap, settings.max_session_duration
    old = read_table(spark, settings.lake, SESSIONS).where(in_range(first, last)).select(
        F.col("session_id").alias("old_session_id"),
        F.col("user_id").alias("old_user_id"),
        F.col("session_start").alias("old_start"),
        F.col("session_end").alias("old_end"),
        F.col("event_count").alias("old_event_count"),
    )
    events = read_table(spark, settings.lake, EVENTS).where(
        F.col("event_date").between(F.lit(_plain(first)), F.lit(_plain(events_until)))
    ).select(*EVENT_COLUMNS)
    matched = old.join(
        events,
        (F.col("old_user_id") == F.col("user_id"))
        & F.col("event_time").between(F.col("old_start"), F.col("old_end")),
        "left",
    )
    selected = matched.where(F.col("event_id").isNotNull()).select(*EVENT_COLUMNS) \
        .dropDuplicates(["user_id", "event_id", "event_time"])
    sessions = as_closed_sessions(
        sessionize_events(selected, gap, max_duration), gap, BACKFILL_BATCH_ID, processing_time
    )

    # The guard: one extra row, present only when some session lacks events, whose
    # evaluation raises. (A filter on the frame itself could be optimised away.)
    incomplete = matched.groupBy(
        "old_session_id", "old_user_id", "old_start", "old_event_count"
    ).agg(F.count("event_id").alias("found")).where(
        F.col("found") != F.col("old_event_count")
    ).agg(
        F.count(F.lit(1)).alias("sessions"),
        F.min(F.concat(
            F.lit("user "), F.col("old_user_id"), F.lit(" from "),
            F.date_format("old_start", "yyyy-MM-dd'T'HH:mm:ss'Z'"), F.lit(" has "),
            F.col("found").cast("string"), F.lit(" of its "),
            F.col("old_event_count").cast("string"), F.lit(" events"),
        )).alias("example"),
    )
    message = F.concat(
        F.lit(_GUARD + "{"), F.col("sessions").cast("string"),
        F.lit(" session(s) of the range have events missing from `events`, e.g. "),
        F.col("example"), F.lit("}"),
    )
    alarm = incomplete.where(F.col("sessions") > 0).select(*[
        (F.raise_error(message) if field.name == "session_id" else F.lit(None))
        .cast(field.dataType).alias(field.name)
        for field in sessions.schema.fields
    ])
    return sessions.unionByName(alarm)


def incomplete_events_detail(error: BaseException) -> str | None:
    """The guard's message when ``error`` is the incomplete-events check of a re-cut."""
    match = _GUARD_DETAIL.search(str(error))
    return match.group(1) if match else None


def _same_rows(left: DataFrame, right: DataFrame) -> bool:
    """Whether two frames hold the same rows, duplicates counted (one Spark job)."""
    columns = left.columns
    tally = left.select(*columns, F.lit(1).alias("_side")).unionByName(
        right.select(*columns, F.lit(-1).alias("_side"))
    ).groupBy(*columns).agg(F.sum("_side").alias("_balance"))
    return tally.where(F.col("_balance") != 0).isEmpty()


def _marker(processing_time: datetime) -> str:
    """The identity of one backfill commit: its ``txnAppId`` and ``userMetadata`` tag."""
    return f"sessionlake-backfill-{micros_at(processing_time)}"


def _metadata(settings: Settings, first: date, last: date, processing_time: datetime) -> str:
    return json.dumps({
        "sessionlake": _marker(processing_time),
        "from": first.isoformat(),
        "to": last.isoformat(),
        "gap_s": int(settings.gap.total_seconds()),
        "max_session_duration_s": int(settings.max_session_duration.total_seconds()),
    }, sort_keys=True)


def _replace_range(
    spark: SparkSession, settings: Settings, first: date, last: date, clock: Clock
) -> _Replaced:
    """One attempt at the replace: check, re-cut and commit (redone whole on a conflict)."""
    lake, gap_s = settings.lake, int(settings.gap.total_seconds())
    current = read_table(spark, lake, SESSIONS).where(in_range(first, last))
    found = single_row(current.agg(
        F.count(F.lit(1)).alias("rows"),
        F.count(F.when((F.col("closed_batch_id") != BACKFILL_BATCH_ID)
                       | (F.col("gap_s") != gap_s), 1)).alias("other"),
        F.countDistinct("closed_at").alias("stamps"),
        F.max(F.unix_micros("closed_at")).alias("stamp_us"),
        F.max(F.to_date("session_end")).alias("last_end_date"),
    ))
    rows = int(found["rows"])
    if rows == 0:
        return _Replaced(None, False, 0)
    # Events of the range's sessions lie between ``first`` and their latest end.
    until = max(found["last_end_date"], last + timedelta(days=1))
    previous = moment_at(found["stamp_us"])
    if previous is not None and found["other"] == 0 and found["stamps"] == 1:
        again = recut_sessions(spark, settings, first, last, until, previous)
        if _same_rows(again, current):
            log.info("sessions %s..%s are already backfilled with this gap (at %s)",
                     first, last, previous.isoformat())
            return _Replaced(previous, True, rows)
    stamp = clock().astimezone(UTC)
    if previous is not None and stamp <= previous:
        stamp = previous + timedelta(microseconds=1)  # one commit, one processing time
    (
        recut_sessions(spark, settings, first, last, until, stamp)
        .writeTo(path_identifier(table_path(lake, SESSIONS)))
        .option("userMetadata", _metadata(settings, first, last, stamp))
        .overwrite(replace_predicate(first, last, stamp))
    )
    return _Replaced(stamp, False, rows)


def _find_commit(spark: SparkSession, lake: str, table: str, marker: str) -> Row | None:
    """The newest commit of ``table`` tagged with ``marker`` (version, readVersion)."""
    log_table = DeltaTable.forPath(spark, table_path(lake, table))
    for history in (log_table.history(50), log_table.history()):
        row = history.where(F.col("userMetadata").contains(f'"{marker}"')).orderBy(
            F.desc("version")
        ).select("version", "readVersion").head()
        if row is not None:
            return row
    return None


def _record_changelog(
    spark: SparkSession,
    settings: Settings,
    first: date,
    last: date,
    replaced: _Replaced,
    watermark: datetime | None,
    open_left: int,
) -> BackfillReport:
    """Append the changelog rows of the replace (once), and build the report.

    The rows come from the version the replace wrote, read by time travel; those of a
    session no longer in ``sessions`` (an erasure since, or an age limit) are left out.
    The caller holds the lake's batch lock from that look to the append, so that no
    erasure runs in between and finds nothing of a user the append then writes back.
    """
    lake = settings.lake
    stamp = replaced.processing_time
    assert stamp is not None
    marker, stamp_us = _marker(stamp), micros_at(stamp)
    commit = _find_commit(spark, lake, SESSIONS, marker)
    written = read_table(spark, lake, SESSIONS, None if commit is None else commit.version)
    new = written.where(
        (F.col("closed_batch_id") == BACKFILL_BATCH_ID)
        & (F.unix_micros("closed_at") == F.lit(stamp_us))
        & (F.col("session_date") >= F.lit(_plain(first)))
    )
    new_stats = single_row(new.agg(
        F.count(F.when(F.col("session_date") <= F.lit(_plain(last)), 1)).alias("in_range"),
        F.count(F.when(F.col("session_date") > F.lit(_plain(last)), 1)).alias("spilled"),
        F.coalesce(F.sum("event_count"), F.lit(0)).alias("events"),
    ))

    changelog_version: int | None = None
    sessions_before = replaced.rows_before
    recorded = replaced.already_applied and read_table(spark, lake, SESSION_CHANGELOG).where(
        (F.col("batch_id") == BACKFILL_BATCH_ID) & (F.col("change") == BACKFILL_CHANGE)
        & (F.unix_micros("changed_at") == F.lit(stamp_us))
    ).limit(1).count() > 0
    if not recorded:
        if commit is not None and commit.readVersion is not None:
            old = read_table(spark, lake, SESSIONS, int(commit.readVersion)).where(
                in_range(first, last)
            )
            # What the commit replaced: a stream may have closed sessions of the range
            # between the first look and the commit (the concurrency review: "557 -> 919"
            # for 732 sessions replaced).
            sessions_before = old.count()
        else:  # the commit left the log: its lineage is unknown
            old = new.limit(0)
        still_there = read_table(spark, lake, SESSIONS).where(
            in_range(first, last) | (F.col("session_date") > F.lit(_plain(last)))
        ).select("session_id")
        rows = _changelog_rows(new.join(still_there, "session_id", "left_semi"), old, stamp)

        def write() -> None:
            (rows.write.format("delta").mode("append")
             .option("txnAppId", marker).option("txnVersion", 0)
             .option("userMetadata", _metadata(settings, first, last, stamp))
             .save(table_path(lake, SESSION_CHANGELOG)))

        retry_on_conflict(write, f"changelog of the backfill {first}..{last}")
        logged = _find_commit(spark, lake, SESSION_CHANGELOG, marker)
        changelog_version = None if logged is None else int(logged.version)

    return BackfillReport(
        first=first,
        last=last,
        gap=settings.gap,
        sessions_before=sessions_before,
        sessions_after=int(new_stats["in_range"]),
        spilled=int(new_stats["spilled"]),
        events_read=int(new_stats["events"]),
        open_left=open_left,
        watermark=watermark,
        processing_time=stamp,
        sessions_version=(None if replaced.already_applied or commit is None
                          else int(commit.version)),
        changelog_version=changelog_version,
        already_applied=replaced.already_applied,
    )


def _changelog_rows(new: DataFrame, old: DataFrame, changed_at: datetime) -> DataFrame:
    """One ``backfill`` row per written session, with the replaced sessions it drew on.

    A written session took events from a replaced session exactly when they belong to the
    same user and their time spans overlap (both are runs of the same events).
    """
    replaced = old.select(
        F.col("user_id").alias("old_user_id"), F.col("session_id").alias("old_session_id"),
        F.col("session_start").alias("old_start"), F.col("session_end").alias("old_end"),
    )
    linked = new.join(
        replaced,
        (F.col("user_id") == F.col("old_user_id"))
        & (F.col("old_start") <= F.col("session_end"))
        & (F.col("old_end") >= F.col("session_start")),
        "left",
    ).groupBy("session_id", "user_id", "session_start", "session_end", "event_count").agg(
        F.sort_array(F.collect_list("old_session_id")).alias("previous_session_ids")
    )
    return linked.select(
        F.lit(BACKFILL_BATCH_ID).cast("long").alias("batch_id"),
        F.lit(BACKFILL_CHANGE).alias("change"),
        "session_id", "user_id", "session_start", "session_end", "event_count",
        F.col("event_count").alias("added_events"),
        "previous_session_ids",
        F.lit(changed_at).cast("timestamp").alias("changed_at"),
    )


def _stream_position(
    spark: SparkSession, lake: str, first: date, last: date
) -> tuple[datetime | None, int]:
    """The stream's watermark (max ``watermark_after``) and its open sessions in the range."""
    watermark = single_row(read_table(spark, lake, BATCH_METRICS).agg(
        F.max(F.unix_micros("watermark_after"))
    ))[0]
    open_left = read_table(spark, lake, OPEN_SESSIONS).where(
        F.to_date("session_start").between(F.lit(_plain(first)), F.lit(_plain(last)))
    ).count()
    return moment_at(watermark), int(open_left)

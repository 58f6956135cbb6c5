"""``sessionlake rebuild-state``: recompute ``open_sessions`` from ``events`` and ``sessions``.

``open_sessions`` is derived state: every accepted event is in ``events``, and every event
of a closed session is in a ``sessions`` row. So when the state table is damaged (its log
broken, a data file cut short, the folder deleted), it is recomputed with the stream's own
sessionization functions instead of being restored, and the result is the state the stream
had. Why that holds, per user:

* Open sessions come after all of the user's closed sessions: a session closes only when
  the watermark has passed its ``end + gap``, and from then on an event that would join it
  is late (SPEC, rule 1). So the open sessions' events are the user's events after the end
  of their last closed session (all their events when none closed).
* They are also recent: an open session ends less than ``gap`` before the watermark W and
  lasts less than the maximum duration, so only events after ``W - gap - max duration``
  are read. This also keeps events whose closed sessions retention has deleted from
  coming back as open sessions.
* A run longer than the maximum duration is cut every ``max_duration`` from the run's
  first event, and ``sessions`` does not record where its run started. The user's closed
  sessions therefore join the events as fragments: sessionized together, an open chunk of
  a run whose first chunks closed gets that run's start; every session holding a closed
  fragment is then dropped.
* ``updated_batch_id``/``updated_at`` are the last batch that changed a session, which is
  the last batch that added events to it: the newest (``ingested_at``, ``batch_id``) of its
  events (a batch stamps its events' ``ingested_at`` with its processing time).

A session the rebuild finds with ``end + gap <= W`` should have been closed already (the
lake is inconsistent, say ``sessions`` lost rows); it is kept, reported, and the next batch
closes it.

The rebuild refuses while a stream holds the checkpoint, while the newest batch of the
checkpoint's stream is unfinished, or while ``events`` holds rows of a batch without its
``batch_metrics`` row: a batch cut off mid-way must be replayed by ``sessionlake run``
first, or its half-written rows would be taken for state. It writes one overwrite commit
when ``open_sessions``' log is readable (versions and table properties kept); otherwise the
damaged folder is moved aside to ``open_sessions.damaged-<UTC time>`` and a fresh table is
created from ``sql/tables/open_sessions.sql``.
"""

from __future__ import annotations

import logging
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionlake import storage
from sessionlake.batch import watermark_of
from sessionlake.checkpoint import RESTORING_MARKER, lake_batch_lock
from sessionlake.config import ActionableError, Settings
from sessionlake.conflicts import retry_on_conflict
from sessionlake.deltalog import clear_delta_cache, inspect_table
from sessionlake.doctor import STATE_SOURCES, unfinished_batch
from sessionlake.ledger import Clock, utc_now
from sessionlake.locks import StreamAlreadyRunning, checkpoint_lock, lake_lock
from sessionlake.registry import check_checkpoint_of_lake
from sessionlake.sessionize import (
    EPOCH,
    aggregate_sessions,
    as_open_sessions,
    assign_sessions,
    events_as_fragments,
    open_sessions_as_fragments,
    session_id,
)
from sessionlake.state import OPEN_SESSION_COLUMNS
from sessionlake.stream import check_session_rules_unchanged
from sessionlake.tables import (
    BATCH_METRICS,
    BUCKETS_PROPERTY,
    EVENTS,
    OPEN_SESSIONS,
    SESSIONS,
    no_lake_at,
    read_table,
    table_ddl,
    table_path,
    table_version,
)

log = logging.getLogger("sessionlake.rebuild")

#: The tables the rebuild reads: they must be whole.
SOURCE_TABLES = STATE_SOURCES


class RebuildError(ActionableError):
    """The rebuild refused before writing anything; the message says why and what to do."""


@dataclass(frozen=True)
class RebuildReport:
    """What a rebuild found and wrote."""

    sessions: int
    events: int
    overdue: int
    buckets: int
    watermark: datetime | None
    version: int
    moved_to: str | None = None

    def summary(self) -> str:
        """What was rebuilt, for the command line (one line, two with a damaged copy)."""
        watermark = "none" if self.watermark is None else self.watermark.isoformat()
        text = (f"rebuilt open_sessions v{self.version}: {self.sessions} open session(s) from "
                f"{self.events} event(s), {self.buckets} user buckets, watermark {watermark}")
        if self.overdue:
            text += (f"; inconsistent: {self.overdue} of them end at least gap before the "
                     "watermark and should have closed already (the next batch closes them)")
        if self.moved_to:
            text += (f"\nthe damaged table was moved to {self.moved_to}; snapshots taken "
                     "before now name versions of it, not of the new table: take a new one "
                     "(`sessionlake snapshot`)")
        return text


def open_sessions_from(
    events: DataFrame,
    closed: DataFrame,
    gap: timedelta,
    max_duration: timedelta,
    buckets: int,
    since: datetime | None,
) -> DataFrame:
    """The open sessions that ``events`` and the closed ``sessions`` imply (see the module).

    :param events: ``events`` rows.
    :param closed: ``sessions`` rows.
    :param since: only events after this time can be in an open session (``None``: all).
    :return: rows in the shape of ``open_sessions``.
    """
    recent = events if since is None else events.where(
        (F.col("event_date") >= F.lit(since.date())) & (F.col("event_time") > F.lit(since))
    )
    closed_until = closed.groupBy("user_id").agg(F.max("session_end").alias("closed_until"))
    pending = recent.join(closed_until, "user_id", "left").where(
        F.col("closed_until").isNull() | (F.col("event_time") > F.col("closed_until"))
    ).drop("closed_until")
    closed_fragments = open_sessions_as_fragments(
        closed.join(pending.select("user_id").distinct(), "user_id", "left_semi").select(
            "session_id", "user_id", "session_start", "session_end",
            F.col("session_start").alias("run_start"), "event_count", "page_views",
            "entry_page", F.lit(None).cast("string").alias("entry_event_id"),
            "exit_page", F.lit(None).cast("string").alias("exit_event_id"),
            F.lit(None).cast("array<string>").alias("pages"),
        )
    )
    assigned = assign_sessions(
        events_as_fragments(pending).unionByName(closed_fragments), gap, max_duration
    ).where(~F.col("session_has_state"))
    stamps = assigned.join(
        pending.select("user_id", "event_id", "batch_id", "ingested_at"), ["user_id", "event_id"]
    ).groupBy("user_id", "run_no", "chunk").agg(
        F.timestamp_micros(F.min("start_us")).alias("start"),
        F.max(F.struct("ingested_at", "batch_id")).alias("last"),
    ).select(
        session_id("user_id", "start").alias("session_id"),
        F.col("last.batch_id").alias("updated_batch_id"),
        F.col("last.ingested_at").alias("updated_at"),
    )
    # as_open_sessions stamps one batch on every row; here each row gets its own instead.
    shaped = as_open_sessions(aggregate_sessions(assigned), buckets, -1, EPOCH)
    return shaped.drop("updated_batch_id", "updated_at").join(stamps, "session_id").select(
        *OPEN_SESSION_COLUMNS
    )


def _check_sources(spark: SparkSession, lake: str) -> None:
    """Refuse when a table the rebuild reads is damaged: it would rebuild from broken rows."""
    for table in SOURCE_TABLES:
        damage = inspect_table(spark, table_path(lake, table)).damage
        if damage:
            raise RebuildError(
                f"{table} is damaged ({damage[0].file}: {damage[0].problem}), and the state "
                "is rebuilt from it: repair it first. `sessionlake doctor` names the snapshot "
                "to restore, or, when none holds it, says what is lost"
            )


def _check_no_batch_pending(spark: SparkSession, settings: Settings) -> None:
    """Refuse while a restore or the newest batch of the checkpoint's stream is unfinished."""
    checkpoint = settings.checkpoint.rstrip("/")
    if storage.exists(spark, f"{checkpoint}/{RESTORING_MARKER}"):
        raise RebuildError(
            f"a restore did not finish on {checkpoint}: run `sessionlake restore` again first "
            "(`sessionlake doctor` names the snapshot)"
        )
    pending = unfinished_batch(spark, checkpoint)
    if pending is not None:
        raise RebuildError(
            f"batch {pending} was cut off mid-way (its ledger entry in {checkpoint} is not "
            "done): its rows may be half written, so run `sessionlake run` first to replay "
            "it, then rebuild-state"
        )


def _unfinished_batches(events: DataFrame, metrics: DataFrame) -> list[int]:
    """Batches that wrote ``events`` rows but no ``batch_metrics`` row (cut off mid-way).

    A batch stamps its events' ``ingested_at`` and its metrics' ``started_at`` with the same
    processing time, so (batch id, time) pairs find them even across streams.
    """
    missing = events.select("batch_id", F.col("ingested_at").alias("at")).distinct().join(
        metrics.select("batch_id", F.col("started_at").alias("at")), ["batch_id", "at"],
        "left_anti",
    )
    return sorted(int(r["batch_id"]) for r in missing.collect())


def _prepare_target(
    spark: SparkSession, settings: Settings, now: datetime
) -> tuple[int, str | None]:
    """The bucket count to use, and the damaged table moved aside when its log is broken.

    The bucket count is the table property ``sessionlake.userBuckets``, read from the log
    even when it is damaged past its first commits; ``settings`` only when nothing is left.
    """
    path = table_path(settings.lake, OPEN_SESSIONS)
    state = inspect_table(spark, path)
    configured = state.configuration.get(BUCKETS_PROPERTY)
    buckets = int(configured) if configured else settings.user_buckets
    moved_to = None
    if state.log_damaged_from is not None:
        if storage.exists(spark, path):
            moved_to = f"{path}.damaged-{now.strftime('%Y%m%dT%H%M%SZ')}"
            storage.move(spark, path, moved_to)
        clear_delta_cache(spark)
        spark.sql(table_ddl(OPEN_SESSIONS, path, buckets))
    return buckets, moved_to


def rebuild_open_sessions(
    spark: SparkSession, settings: Settings, clock: Clock = utc_now
) -> RebuildReport:
    """Recompute ``open_sessions`` from ``events`` and ``sessions`` and write it.

    ``settings`` must carry the stream's gap, grace and maximum session duration. The
    checkpoint's lock and the lake's are held throughout, so no run can start half-way.

    :return: what was rebuilt, and where a damaged table went.
    :raises RebuildError: before anything is written: a source table damaged, a stream
        running, a batch or a restore unfinished, or a gap other than the stream's.
    """
    if (missing := no_lake_at(spark, settings.lake)) is not None:
        raise RebuildError(missing)
    _check_sources(spark, settings.lake)
    check_checkpoint_of_lake(spark, settings.lake, settings.checkpoint)
    checkpoint = settings.checkpoint.rstrip("/")
    # A checkpoint that does not exist has no stream to guard against (and is not created);
    # a stream on another checkpoint holds the lake's lock.
    guard = checkpoint_lock(checkpoint) if storage.exists(spark, checkpoint) else nullcontext()
    try:
        # And the lake's batch lock: an erasure between the rebuild's reads and its write
        # would find the user's open sessions, which the write then puts back.
        with guard, lake_lock(settings.lake, checkpoint), lake_batch_lock(settings.lake):
            report = _rebuild(spark, settings, clock)
    except StreamAlreadyRunning as error:
        raise RebuildError(f"{error} (rebuild-state needs the stream stopped)") from None
    if report.overdue:
        log.warning("%s", report.summary())
    return report


def _rebuild(spark: SparkSession, settings: Settings, clock: Clock) -> RebuildReport:
    """The checks that need the lock, then the rebuild and its one write."""
    lake = settings.lake
    _check_no_batch_pending(spark, settings)
    check_session_rules_unchanged(spark, settings, note=False)
    metrics = read_table(spark, lake, BATCH_METRICS)
    newest = metrics.agg(F.max("max_event_time"), F.max("started_at"),
                         F.max("watermark_after")).head()
    # Spark hands back UTC, naive; the last batch's clock caps its watermark, as it did,
    # and the watermark never falls below the one the batches reached.
    max_event_time, last_clock, reached = (None, None, None) if newest is None else (
        None if moment is None else moment.replace(tzinfo=moment.tzinfo or UTC)
        for moment in newest)
    watermark = max((moment for moment in (watermark_of(max_event_time, settings.grace,
                                                        last_clock), reached)
                     if moment is not None), default=None)
    since = None if watermark is None else (
        watermark - settings.gap - settings.max_session_duration)
    events = read_table(spark, lake, EVENTS)
    recent = events if since is None else events.where(
        (F.col("event_date") >= F.lit(since.date())) & (F.col("event_time") > F.lit(since)))
    unfinished = _unfinished_batches(recent, metrics)
    if unfinished:
        raise RebuildError(
            f"events holds rows of batch(es) {unfinished} without a batch_metrics row: a "
            "batch was cut off mid-way; run `sessionlake run` first to replay it"
        )
    buckets, moved_to = _prepare_target(spark, settings, clock())
    rebuilt = open_sessions_from(
        events, read_table(spark, lake, SESSIONS), settings.gap,
        settings.max_session_duration, buckets, since,
    ).persist()
    try:
        closes_by = None if watermark is None else watermark - settings.gap
        counts = rebuilt.agg(
            F.count(F.lit(1)).alias("sessions"),
            F.coalesce(F.sum("event_count"), F.lit(0)).alias("events"),
            F.count(F.when(
                F.col("session_end") <= F.lit(closes_by).cast("timestamp"), 1,
            )).alias("overdue"),
        ).head()
        assert counts is not None
        path = table_path(lake, OPEN_SESSIONS)
        retry_on_conflict(
            lambda: rebuilt.write.format("delta").mode("overwrite")
            .option("userMetadata", "sessionlake rebuild-state").save(path),
            "rebuild of open_sessions",
        )
    finally:
        rebuilt.unpersist()
    return RebuildReport(
        sessions=int(counts["sessions"]), events=int(counts["events"]),
        overdue=int(counts["overdue"]), buckets=buckets, watermark=watermark,
        version=table_version(spark, lake, OPEN_SESSIONS), moved_to=moved_to,
    )

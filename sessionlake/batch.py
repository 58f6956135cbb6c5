"""One micro-batch, from raw lines to committed tables.

The stages run top to bottom: source adapter → validation → duplicates → lateness and
sessionization → changelog → state MERGE (with pruning of closed sessions) → metrics.

Exactly-once: before writing anything a batch records in its ledger entry (a file in the
checkpoint, :mod:`sessionlake.ledger`) which table versions and which clock it reads. A
batch replayed after a crash finds that entry, reads the same versions by time travel and
so computes the same rows.
Every write is tagged with the batch (``userMetadata``: the stream's identity and the batch
id), and a replay looks for its tag among the commits after the recorded versions, so
whatever was committed before the crash is skipped, not doubled.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import partial, reduce
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from sessionlake import faults
from sessionlake.changelog import (
    changelog_rows,
    classify_sessions,
    expiring_open_sessions,
    merge_source,
    merge_source_rows,
)
from sessionlake.checkpoint import batch_locks
from sessionlake.config import Settings
from sessionlake.conflicts import retry_on_conflict
from sessionlake.deltalog import BatchKey
from sessionlake.erasure import KeepOut, KeptOut, erasure_runs, quarantine_erased
from sessionlake.ledger import (
    STATE_ROWS_PER_RECORD,
    BatchInputs,
    Clock,
    OpenCount,
    StreamIdentity,
    count_open_sessions,
    mark_done,
    open_sessions_estimate,
    open_sessions_known,
    record_inputs,
    utc_now,
)
from sessionlake.sessionize import (
    EPOCH,
    SESSIONIZED_EVENT_COLUMNS,
    as_closed_sessions,
    batch_sessions,
    closed_session_hits,
    event_date,
    files_read_order,
    moment_at,
    open_session_events,
    sessionize_batch,
    straddles_a_cut,
    user_bucket,
)
from sessionlake.sources import adapter_for
from sessionlake.spark import (
    fit_codegen_to_batch,
    fit_codegen_to_parse,
    in_named_jobs,
    naming_jobs,
)
from sessionlake.state import MergeResult, apply_changelog_merge, none_closes_by
from sessionlake.tables import (
    BATCH_METRICS,
    EVENTS,
    LATE_EVENTS,
    OPEN_SESSIONS,
    QUARANTINE,
    SESSION_CHANGELOG,
    SESSIONS,
    append,
    batch_commit_metrics,
    literal_row,
    read_table,
    resolve_snapshot,
)
from sessionlake.validation import (
    EVENT_COLUMNS,
    apply_guards,
    cap_record_size,
    derived_from_kafka_offset,
    quarantined,
    valid_events,
)

log = logging.getLogger("sessionlake.batch")


@dataclass(frozen=True)
class BatchReport:
    """The batch's ``batch_metrics`` row, as returned to callers and listeners."""

    row: dict[str, Any]
    skipped: bool = False
    phases_ms: dict[str, int] = field(default_factory=dict)
    #: The files the batch read from a landing folder (``None``: Kafka, or not told).
    input_files: int | None = None
    #: The batch had been cut off by a crash and was finished now: what its first attempt
    #: had committed was found and kept, the rest was written.
    resumed: bool = False


def _observed(frame: DataFrame, **figures: Column) -> tuple[DataFrame, Observation]:
    """``frame`` with ``figures`` (aggregates by name) observed while it is computed.

    The observation's ``get`` holds them once an action over the returned frame finished
    (the batch materializes each frame it observes at once), so the figures cost no query
    of their own. Timestamps are observed as microseconds (see :func:`_moment`): the
    observed row reaches Python without a time zone.
    """
    seen = Observation(f"sessionlake-{uuid.uuid4().hex}")
    return frame.observe(seen, *[value.alias(name) for name, value in figures.items()]), seen


def _parse_figures(watermark: datetime | None, user_buckets: int) -> dict[str, Column]:
    """What the batch needs to know of its parsed records before it reads any table."""
    valid = F.col("reason").isNull()
    behind = valid & (F.col("event_time") < F.lit(watermark).cast("timestamp"))
    checked = valid & ~derived_from_kafka_offset()  # the ids the duplicate check looks up
    return {
        "input": F.count(F.lit(1)),
        "quarantined": F.count("reason"),
        "days": F.collect_set(F.when(valid, F.unix_date(event_date()))),
        "buckets": F.collect_set(F.when(valid, user_bucket("user_id", user_buckets))),
        "first_event_id": F.min(F.when(checked, F.col("event_id"))),
        "last_event_id": F.max(F.when(checked, F.col("event_id"))),
        "first_behind_watermark": F.min(F.when(behind, F.unix_micros("event_time"))),
        "last_behind_watermark": F.max(F.when(behind, F.unix_micros("event_time"))),
    }


def watermark_of(max_event_time: datetime | None, grace: timedelta,
                 clock: datetime | None = None) -> datetime | None:
    """The watermark: the largest accepted event time so far minus the grace period, but
    never past the batch's ``clock`` minus the grace period. (A batch's never falls below
    the one reached before it, :func:`sessionlake.ledger.watermark_floor`.)

    An event ahead of the clock (a device whose clock is wrong, by less than
    ``--max-future-skew``, which is quarantined beyond) is accepted, but does not move
    time on: before, one event 50 minutes ahead closed every open session at once and made
    every live event after it late. A stream reading history
    (event times long before the clock) is not held back.
    """
    if max_event_time is None:
        return None
    return (max_event_time if clock is None else min(max_event_time, clock)) - grace


#: The tables whose snapshots a batch resolves while it parses (see :func:`resolve_ahead`).
RESOLVED_AHEAD: tuple[str, ...] = (OPEN_SESSIONS, EVENTS)


def resolve_ahead(
    pool: ThreadPoolExecutor, spark: SparkSession, lake: str, inputs: BatchInputs, label: str
) -> list[Future[None]]:
    """Start resolving, in ``pool``, the snapshots of the tables the sessionization reads.

    The sessionization reads the state and the earlier events at the versions the batch
    pinned, and Delta resolves each version's snapshot before the query starts
    (:func:`sessionlake.tables.resolve_snapshot`): in a new process, or after the previous
    batch committed new versions, that was half of a small batch's sessionization.
    Resolved beside the parse, whose small batches leave the driver waiting on code
    generation and short tasks, it mostly overlaps. A restart of 100 events over 10^4 open
    sessions (five runs each, alternating): the sessionization took 1.9-2.1 s instead of
    4.0-4.4, the parse and the wait for the snapshots 1.0-1.4 s more, and the batch
    committed 13.2-14.4 s after the process started instead of 14.4-16.2. Batches of
    100,000 events, whose parse keeps both cores busy, gain nothing and lose nothing.
    The tables the batch only writes gained nothing from it. Tables at version 0 (just
    created, empty) are not read, so not resolved; nor is ``events`` when the previous
    batch's duplicate check did not need to read it (see :mod:`sessionlake.eventids`).
    """
    versions = inputs.table_versions
    return [pool.submit(in_named_jobs, spark, f"{label}: resolve {table}",
                        partial(resolve_snapshot, spark, lake, table, versions[table]))
            for table in RESOLVED_AHEAD if versions[table] > 0
            and (table != EVENTS or inputs.earlier_events_read_before)]


def process_lines(
    spark: SparkSession,
    lines: DataFrame,
    batch_id: int,
    settings: Settings,
    identity: StreamIdentity,
    clock: Clock = utc_now,
    on_phase: Callable[[str], None] | None = None,
    keep_out: KeepOut | None = None,
    landed: Mapping[str, int | None] | None = None,
) -> BatchReport:
    """Process one micro-batch of lines (``source_file``, ``source_line``, ``line``).

    The batch holds the checkpoint's and the lake's batch locks from pinning its input
    versions to its last write, so that an erasure (which takes them too) happens before
    or after the whole batch, never between its read of a user's state and its write of it.

    :param on_phase: told where the batch is as it gets there: ``locks`` (waiting for
        them), ``inputs``, then each of :data:`PHASES` (the run names it in its alert for a
        batch that runs too long). The Spark jobs of each are named after it
        (:func:`batch_label`).
    :param keep_out: which of the batch's records landed before an erasure of their user
        (:data:`~sessionlake.erasure.KeepOut`; the stream's source knows when they
        landed): they are kept out of the lake.
    :param landed: the batch's files (``source_file``) with their modification times when
        the stream listed them (ms; ``None`` unknown): of an event's copies in two of them,
        the one in the file the stream takes first is kept (:func:`files_read_order`).
    """
    told = on_phase or (lambda _: None)
    with naming_jobs(spark) as name_jobs:

        def tell(phase: str) -> None:
            name_jobs(f"{batch_label(batch_id)}: {phase}")
            told(phase)

        tell("locks")
        with batch_locks(settings.lake, settings.checkpoint):
            tell("inputs")
            return _process_locked(spark, lines, batch_id, settings, identity, clock, tell,
                                   keep_out, landed)


def batch_label(batch_id: int) -> str:
    """How a batch's Spark jobs are named, before what each does
    (:func:`~sessionlake.spark.naming_jobs`): the Spark UI lists ``sessionlake batch 3:
    sessionize``, ``sessionlake batch 3: append events``, ..."""
    return f"sessionlake batch {batch_id}"


#: A batch's phases, in order: each is timed (``BatchReport.phases_ms``).
PHASES: tuple[str, ...] = ("parse", "lateness_and_state", "sessionize", "classify",
                           "appends", "merge_wait", "metrics")


class _BatchWork:
    """What one run of a micro-batch keeps while it works: its materialized frames (freed
    at the end, see :func:`materialize`), how long each phase took, and which one it is
    in (told to ``on_phase``)."""

    def __init__(self, on_phase: Callable[[str], None]) -> None:
        self.kept: list[DataFrame] = []
        self.phases_ms: dict[str, int] = {}
        self._phase_start = time.monotonic()
        self._on_phase = on_phase
        on_phase(PHASES[0])

    def keep(self, frame: DataFrame) -> DataFrame:
        """``frame`` computed now, once (:func:`materialize`), until :meth:`release`."""
        self.kept.append(materialize(frame))
        return self.kept[-1]

    def phase(self, name: str) -> None:
        """End the phase ``name`` (it began where the previous one ended); the next of
        :data:`PHASES` begins."""
        now = time.monotonic()
        self.phases_ms[name] = int((now - self._phase_start) * 1000)
        self._phase_start = now
        following = PHASES.index(name) + 1
        if following < len(PHASES):
            self._on_phase(PHASES[following])

    def release(self) -> None:
        """Free every kept frame's blocks: the batch is done with them."""
        for frame in self.kept:
            release(frame)


def _process_locked(
    spark: SparkSession,
    lines: DataFrame,
    batch_id: int,
    settings: Settings,
    identity: StreamIdentity,
    clock: Clock,
    on_phase: Callable[[str], None],
    keep_out: KeepOut | None,
    landed: Mapping[str, int | None] | None,
) -> BatchReport:
    """One micro-batch, its locks held (:func:`process_lines`): its inputs pinned in the
    ledger, or its report when it was already done; then its phases (:data:`PHASES`), each
    a few steps named for what they compute."""
    inputs, done = record_inputs(spark, settings, identity, batch_id, clock)
    if done:
        return BatchReport(row={"batch_id": batch_id}, skipped=True)
    now = inputs.processing_time
    lake, gap, key = settings.lake, settings.gap, (identity.app_id, batch_id)
    watermark = _newest(watermark_of(inputs.max_event_time_before, settings.grace, now),
                        inputs.watermark_floor)
    work = _BatchWork(on_phase)
    ahead = ThreadPoolExecutor(max_workers=len(RESOLVED_AHEAD))
    resolving = resolve_ahead(ahead, spark, lake, inputs, batch_label(batch_id))
    try:
        faults.point("ingest")
        # Read under the batch locks, which an erasure holds while it runs.
        runs = erasure_runs(spark, lake) if keep_out else []
        erased = keep_out(runs) if keep_out and runs else []
        guarded, stats = _parsed(lines, settings, now, watermark, work, erased)
        valid = valid_events(guarded)
        buckets = sorted(int(b) for b in stats["buckets"])
        dates = sorted(EPOCH.date() + timedelta(days=int(d)) for d in stats["days"])
        open_estimate = open_sessions_estimate(inputs.previous)

        def open_sessions_in(touched: list[int]) -> int:
            """About how many open sessions the ``touched`` buckets hold."""
            return open_estimate * len(touched) // settings.user_buckets

        # The batch works through its records and the open sessions of its users' buckets.
        _fit_codegen(spark, lines, int(stats["input"])
                     + open_sessions_in(buckets) // STATE_ROWS_PER_RECORD)
        work.phase("parse")
        for snapshot in resolving:
            snapshot.result()

        # Sessionization reads a narrow projection of the events; what it rejects is
        # subtracted from the parsed rows by their key (source_file, source_line) at the end.
        events = valid.select(*SESSIONIZED_EVENT_COLUMNS)
        closed = _closed_sessions_near(
            spark, settings, inputs.table_versions[SESSIONS],
            moment_at(stats["first_behind_watermark"]), moment_at(stats["last_behind_watermark"]),
        )
        near_closed = None if closed is None or watermark is None else work.keep(
            closed_session_hits(events, closed, watermark, gap))
        records = int(stats["input"])
        users = shipped_whole(events.select("user_id").distinct(), records)
        state_version = inputs.table_versions[OPEN_SESSIONS]
        open_before = read_table(spark, lake, OPEN_SESSIONS, state_version)
        state = _open_sessions_of(users, open_before, buckets, state_version)
        work.phase("lateness_and_state")
        ids = (stats["first_event_id"], stats["last_event_id"])
        searched = _recorded_to_search(inputs, dates, ids)
        seen_before = _seen_before(spark, settings, inputs, events, records, dates, ids,
                                   searched)
        assigned, outcome, split_ids = _sessionize_cut_consistently(
            spark, settings, inputs, work, events, state, seen_before, near_closed, watermark,
            files_read_order(spark, landed))
        sessions = batch_sessions(assigned)
        work.phase("sessionize")
        max_event_time = _newest(inputs.max_event_time_before, moment_at(outcome["max_t"]))
        watermark_after = _newest(watermark_of(max_event_time, settings.grace, now), watermark)
        classified, classified_counts = _classified(sessions, watermark_after, gap, split_ids,
                                                    work)
        # The other users' open sessions, when the state's statistics leave any to close.
        none_closes = state is None or watermark_after is None or none_closes_by(
            lake, state_version, watermark_after - gap)
        expiring, expiring_counts = _expiring_elsewhere(
            open_before.limit(0) if none_closes else open_before.join(
                users, "user_id", "left_anti"), watermark_after, gap, work)

        # Not materialized: a union of projections of materialized frames, which the MERGE
        # reads twice without a copy (state.MATERIALIZE_SOURCE).
        source = merge_source(classified, expiring, settings.user_buckets, batch_id, now,
                              split=bool(split_ids))
        counts = _batch_counts(outcome, classified_counts, expiring_counts, buckets)
        work.phase("classify")
        appends = _appends(guarded, valid, assigned, classified, expiring, stats, counts,
                           gap, batch_id, now, watermark)
        open_count_before = open_sessions_known(spark, settings, identity, batch_id,
                                                state_version, inputs.previous)

        def update_state() -> tuple[MergeResult, OpenCount]:
            faults.point("before_merge")
            merged = apply_changelog_merge(
                spark, lake, source, counts["merge_buckets"], key,
                inputs.written_after(OPEN_SESSIONS), counts["merge_rows"],
                open_sessions_in(counts["merge_buckets"]), empty=state_version <= 0,
            )
            faults.point("after_merge")
            return merged, count_open_sessions(spark, lake, open_count_before, state_version,
                                               merged)

        merged, open_after = _write_tables(spark, lake, key, inputs, appends, update_state,
                                           work)
        row = _metrics_row(
            identity, batch_id, inputs, stats, counts, merged, open_after.sessions,
            max_event_time, watermark, watermark_after,
        )
        _append_once(literal_row(spark, row, read_table(spark, lake, BATCH_METRICS).schema),
                     lake, BATCH_METRICS, key, inputs.written_after(BATCH_METRICS))
        faults.point("after_metrics")
        mark_done(spark, settings, identity, batch_id, inputs.entry, max_event_time,
                  open_after, read_earlier_events=EVENTS in searched,
                  watermark_after=watermark_after)
        work.phase("metrics")
        log.debug("batch %s phases (ms): %s", batch_id, work.phases_ms)
        return BatchReport(row=row, phases_ms=work.phases_ms, resumed=inputs.replay)
    finally:
        ahead.shutdown(wait=True)
        work.release()


def _newest(*moments: datetime | None) -> datetime | None:
    """The latest of ``moments`` that are known; ``None`` when none is."""
    return max((moment for moment in moments if moment is not None), default=None)


def _parsed(lines: DataFrame, settings: Settings, now: datetime, watermark: datetime | None,
            work: _BatchWork, erased: Sequence[KeptOut] = (),
            ) -> tuple[DataFrame, dict[str, Any]]:
    """The batch's records parsed by its format's adapter and guarded, computed once; and
    the figures the batch needs of them before it reads any table (:func:`_parse_figures`),
    observed as they were computed rather than queried again. The records of ``erased``
    users are quarantined without their text (:func:`~sessionlake.erasure.
    quarantine_erased`)."""
    fit_codegen_to_parse(lines.sparkSession)
    guarded = apply_guards(
        adapter_for(settings.input_format).parse(cap_record_size(spread(lines))),
        now, settings.max_future_skew,
    )
    if erased:
        guarded = quarantine_erased(guarded, erased)
    parsed, seen = _observed(guarded, **_parse_figures(watermark, settings.user_buckets))
    return work.keep(parsed), seen.get


def _fit_codegen(spark: SparkSession, lines: DataFrame, size: int) -> None:
    """Compile the batch's code or not, by its ``size`` (:func:`fit_codegen_to_batch`), in
    the session and in the stream's clone of it that owns the batch's frames."""
    fit_codegen_to_batch(spark, size)
    if lines.sparkSession is not spark:
        fit_codegen_to_batch(lines.sparkSession, size)


def _open_sessions_of(users: DataFrame, open_before: DataFrame, buckets: list[int],
                      state_version: int) -> DataFrame | None:
    """The open sessions of the batch's ``users`` (in their ``buckets``); ``None`` while the
    table holds none (version 0). ``users`` is broadcast: the state is not shuffled to find
    theirs."""
    return None if state_version <= 0 else open_before.where(
        F.col("user_bucket").isin(buckets)).join(users, "user_id", "left_semi")


def _classified(sessions: DataFrame, watermark: datetime | None, gap: timedelta,
                split_ids: Sequence[str], work: _BatchWork) -> tuple[DataFrame, dict[str, Any]]:
    """The batch's sessions classified (:func:`classify_sessions`), computed once, with the
    counts of each kind of change observed as they were."""
    classifying, seen = _observed(
        classify_sessions(sessions, watermark, gap, split_ids),
        opened=F.count(F.when(F.col("change") == "open", 1)),
        changed=F.count(F.when(F.col("change") != "unchanged", 1)),
        closes=F.count(F.when(F.col("closes"), 1)),
        merge_rows=merge_source_rows(),
    )
    return work.keep(classifying), seen.get


def _expiring_elsewhere(untouched: DataFrame, watermark: datetime | None, gap: timedelta,
                        work: _BatchWork) -> tuple[DataFrame, dict[str, Any]]:
    """The open sessions of users not in the batch (``untouched``) that the new watermark
    closes, computed once; with how many and in which buckets, observed as they were."""
    expiring, seen = _observed(
        expiring_open_sessions(untouched, watermark, gap),
        expired=F.count(F.lit(1)), buckets=F.collect_set("user_bucket"),
    )
    return work.keep(expiring), seen.get


def _sessionize_cut_consistently(
    spark: SparkSession,
    settings: Settings,
    inputs: BatchInputs,
    work: _BatchWork,
    events: DataFrame,
    state: DataFrame | None,
    seen_before: DataFrame | None,
    near_closed: DataFrame | None,
    watermark: datetime | None,
    read_order: DataFrame | None,
) -> tuple[DataFrame, dict[str, Any], list[str]]:
    """The batch sessionized with its users' open sessions (:func:`sessionize_batch`,
    materialized), the figures observed on it, and the open sessions it split.

    When an accepted event moved a run's cuts across an open session, that user's open
    sessions are replaced by their events (:func:`_state_cut_anew`) and the batch is
    sessionized again, so that the cuts fall where a batch sessionization puts them.
    """
    accepting = _accepted()
    event = ~F.col("is_state")

    def sessionize(state: DataFrame | None) -> tuple[DataFrame, dict[str, Any]]:
        sessionized, sessionize_seen = _observed(
            sessionize_batch(events, state, seen_before, near_closed, watermark, settings.gap,
                             settings.max_session_duration, read_order),
            valid=F.count(F.when(event, 1)),
            unique=F.count(F.when(event & ~F.col("is_duplicate"), 1)),
            accepted=F.count(F.when(event & accepting, 1)),
            late=F.count(F.when(event, F.col("late_reason"))),
            max_t=F.max(F.when(event & accepting, F.unix_micros("event_time"))),
            straddling=F.count(F.when(straddles_a_cut(settings.max_session_duration), 1)),
        )
        return work.keep(sessionized), sessionize_seen.get

    assigned, outcome = sessionize(state)
    if outcome["straddling"]:
        assert state is not None  # only open sessions straddle
        recut = _state_cut_anew(spark, settings, inputs, state, assigned)
        if recut is not None:
            assigned, outcome = sessionize(recut)
            return assigned, outcome, _split_session_ids(assigned)
    return assigned, outcome, []


def _accepted() -> Column:
    """On the sessionization's rows: an event (or open session) neither duplicate nor late."""
    return ~F.col("is_duplicate") & F.col("late_reason").isNull()


def _appends(
    guarded: DataFrame,
    valid: DataFrame,
    assigned: DataFrame,
    classified: DataFrame,
    expiring: DataFrame,
    stats: dict[str, Any],
    counts: dict[str, Any],
    gap: timedelta,
    batch_id: int,
    now: datetime,
    watermark: datetime | None,
) -> list[tuple[str, DataFrame]]:
    """The batch's rows for each table it appends to (those it has rows for): its
    quarantined records, late events, accepted events, closed sessions and changelog."""
    accepting = _accepted()
    late_keys = assigned.where(F.col("late_reason").isNotNull()).select(
        *RECORD_KEY, "late_reason")
    late_rows = _records_of(valid, late_keys, counts["late"], "inner").select(
        *EVENT_COLUMNS, F.col("late_reason").alias("reason"),
        F.lit(watermark).cast("timestamp").alias("watermark"),
    )
    accepted = valid if counts["accepted"] == counts["valid"] else _records_of(
        valid,
        assigned.where(~F.col("is_state") & ~accepting).select(*RECORD_KEY),
        counts["valid"] - counts["accepted"], "left_anti",
    )
    closing = as_closed_sessions(
        classified.where("closes"), gap, batch_id, now
    ).unionByName(as_closed_sessions(expiring, gap, batch_id, now))
    appends = [
        (stats["quarantined"], QUARANTINE,
         _stamp(quarantined(guarded), batch_id, "quarantined_at", now)),
        (counts["late"], LATE_EVENTS, _stamp(late_rows, batch_id, "recorded_at", now)),
        (counts["accepted"], EVENTS,
         _stamp(accepted, batch_id, "ingested_at", now).withColumn("event_date", event_date())),
        (counts["closed"], SESSIONS, closing),
        (counts["changes"], SESSION_CHANGELOG,
         changelog_rows(classified, expiring, batch_id, now)),
    ]
    small = int(stats["input"]) <= ONE_TASK_RECORDS
    return [(table, frame.coalesce(1) if small and table in UNPARTITIONED else frame)
            for rows, table, frame in appends if rows]


#: A batch of up to this many records writes each of its tables that is not partitioned
#: in one task. Each task of such a write writes a file, an empty one when its share of the
#: rows is none, which Delta does not list but leaves in the table's folder until a VACUUM
#: (and a VACUUM then has something to do: :func:`~sessionlake.retention.nothing_to_vacuum`):
#: three few-record batches on ``local[8]`` left 1, 1 and 3 such files in ``quarantine``,
#: ``late_events`` and ``session_changelog``, none in one task. One task reads such a
#: batch's rows in a fraction of a second; a larger batch keeps its parallelism.
ONE_TASK_RECORDS = 50_000
#: The tables a batch appends to that are not partitioned (sql/tables/).
UNPARTITIONED = frozenset({QUARANTINE, LATE_EVENTS, SESSION_CHANGELOG})


def _write_tables(
    spark: SparkSession,
    lake: str,
    key: BatchKey,
    inputs: BatchInputs,
    appends: list[tuple[str, DataFrame]],
    update_state: Callable[[], tuple[MergeResult, OpenCount]],
    work: _BatchWork,
) -> tuple[MergeResult, OpenCount]:
    """Write the batch's appends and its state MERGE, each at most once per batch.

    The tables are independent, so their commits run side by side; ``batch_metrics``,
    whose row marks the batch as done and carries the watermark forward, is written by
    the caller only after all of them succeeded. Each thread names its Spark jobs after
    the table it writes (:func:`batch_label`).
    """
    label = batch_label(key[1])
    with ThreadPoolExecutor(max_workers=len(appends) + 1) as pool:
        state_update = pool.submit(in_named_jobs, spark, f"{label}: merge {OPEN_SESSIONS}",
                                   update_state)
        writes = [pool.submit(in_named_jobs, spark, f"{label}: append {table}",
                              partial(_append_once, frame, lake, table, key,
                                      inputs.written_after(table)))
                  for table, frame in appends]
        for write in writes:
            write.result()
        faults.point("after_sessions")
        work.phase("appends")
        merged, open_after = state_update.result()
        work.phase("merge_wait")
    return merged, open_after


def spread(lines: DataFrame) -> DataFrame:
    """``lines`` over as many partitions as the cluster runs tasks at once, when they come
    in fewer (a batch of one file up to Spark's split size reads it in one task).

    The batch's records stay in their partitions from the parse to the append of its
    events, so a one-file batch would parse and write its events on one core. The lines
    are shuffled by their key (file, line), which places each on the same partition
    whenever the batch is replayed.
    """
    slots = lines.sparkSession.sparkContext.defaultParallelism
    if lines.rdd.getNumPartitions() >= slots:
        return lines
    return lines.repartition(slots, *RECORD_KEY)


def materialize(frame: DataFrame) -> DataFrame:
    """``frame`` computed now, once, as a DataFrame whose plan is only its rows.

    A micro-batch runs a dozen queries over a few intermediate frames. Were those frames
    merely persisted, every query on them would still carry the whole lineage back to the
    raw lines, and Spark would analyze it, and match it against its cache, again each time:
    on a small batch that planning cost more than the work (a batch of four events: 13-15
    CPU s with persisted frames, 12.3-12.6 checkpointed). The rows live in the executors'
    block managers, as a persisted frame's would, but cannot be recomputed: should an
    executor be lost in mid-batch, the batch fails, and the restart replays it exactly once.
    """
    return frame.localCheckpoint(eager=True)


def release(frame: DataFrame) -> None:
    """Free the blocks of a frame from :func:`materialize`, and wait until they are free:
    after this it cannot be read.

    Left to finish in the background, the removal of a large batch's blocks was still
    running when its process stopped Spark: the block manager, shut down under it, printed
    two ``RejectedExecutionException`` stack traces after a run of 5,000,000 events had
    succeeded. Waiting took that batch 0.8 s, and a batch of 100,000 events 29-65 ms
    against 3-21 ms (2026-12-04); the next batch then starts with this one's memory back.
    """
    frame._jdf.logicalPlan().rdd().unpersist(True)


#: Delta writer options of the batch's appends, per table. ``events`` is written without
#: Delta's optimized write (the table's default, for other writers): a batch's events come
#: in as few partitions as its input had, so the shuffle would not save files, and it wrote
#: a million-event batch's events in one task.
APPEND_OPTIONS: dict[str, dict[str, str]] = {EVENTS: {"optimizeWrite": "false"}}


def _append_once(
    frame: DataFrame, lake: str, table: str, batch: BatchKey, replay_after: int | None
) -> None:
    """Append the batch's rows to ``table`` unless a first attempt of a replay did.

    :param replay_after: on a replay, the table's version before the batch's first attempt:
        a commit of the batch after it means the append is done. A first attempt (``None``)
        cannot find its own write, so it looks for none.

    A blind append conflicts with little (an OPTIMIZE only removes files it read), but any
    lost race is redone rather than failing the batch; Delta commits nothing of the attempt
    that lost.
    """
    if replay_after is not None and batch_commit_metrics(
        frame.sparkSession, lake, table, batch, after=replay_after
    ) is not None:
        return
    retry_on_conflict(lambda: append(frame, lake, table, batch, APPEND_OPTIONS.get(table)),
                      f"append to {table}")


#: Where a batch looks for copies of its events: the events earlier batches recorded,
#: accepted or rejected as late. An event is recorded once; each copy of it counts as a
#: duplicate, whichever batch it comes in.
RECORDED: tuple[str, ...] = (EVENTS, LATE_EVENTS)


def _recorded_to_search(inputs: BatchInputs, dates: list[date],
                        ids: tuple[str | None, str | None]) -> list[str]:
    """Those of :data:`RECORDED` that can hold a copy of one of the batch's events: not
    those at version 0 (their creation, nothing recorded), nor those that hold no id from
    the batch's least up (:meth:`BatchInputs.holds_no_id_from`); none for a batch without
    a valid event."""
    first, last = ids
    if not dates or first is None or last is None:
        return []
    return [table for table in RECORDED if inputs.table_versions[table] > 0
            and not inputs.holds_no_id_from(table, first)]


def _seen_before(
    spark: SparkSession,
    settings: Settings,
    inputs: BatchInputs,
    events: DataFrame,
    records: int,
    dates: list[date],
    ids: tuple[str | None, str | None],
    tables: list[str],
) -> DataFrame | None:
    """The ids of ``events`` an earlier batch recorded on the same day (``user_id``,
    ``event_id``, ``event_date``), looked for in ``tables`` (:func:`_recorded_to_search`)
    among the events of the batch's days.

    Only events whose id lies between the batch's least and greatest ids (``ids``) can
    match, and saying so lets Delta skip every file whose ids lie outside: ids that sort
    by time (zero-padded sequence numbers, UUIDv7, ULID; ``<file>#<line>`` sorts by file)
    put each earlier batch's files outside a new batch's range, so the check reads what
    the batch could repeat, not the whole day so far. Random ids skip nothing and cost
    nothing.
    Those days' events are scanned against the batch's ids shipped whole to every task
    (for a batch of up to :data:`BROADCAST_KEYS_MAX` ``records``), so the earlier events
    are not shuffled; ``None`` when there is no table to search: then none is read at all.
    """
    if not tables:
        return None
    first, last = ids
    assert first is not None and last is not None  # tables to search imply both
    key = ["user_id", "event_id", "event_date"]
    earlier = reduce(DataFrame.unionByName, [
        _recorded_on(spark, settings.lake, table, inputs.table_versions[table], dates)
        .where(F.col("event_id").between(first, last)).select(*key) for table in tables])
    batch = events.where(~derived_from_kafka_offset()).select(
        "user_id", "event_id", event_date().alias("event_date"))
    return earlier.join(shipped_whole(batch, records), key, "left_semi")


def _recorded_on(spark: SparkSession, lake: str, table: str, version: int,
                 dates: list[date]) -> DataFrame:
    """The events ``table`` (of :data:`RECORDED`) holds at ``version`` on ``dates``, with
    their ``event_date``."""
    frame = read_table(spark, lake, table, version)
    if table == EVENTS:
        return frame.where(F.col("event_date").isin(dates))
    # late_events is not partitioned by day: its files are skipped by their events' times.
    first, last = (datetime(d.year, d.month, d.day, tzinfo=UTC) for d in (dates[0], dates[-1]))
    return frame.where(F.col("event_time").between(first, last + timedelta(days=1))).withColumn(
        "event_date", event_date()).where(F.col("event_date").isin(dates))


def _state_cut_anew(
    spark: SparkSession,
    settings: Settings,
    inputs: BatchInputs,
    state: DataFrame,
    assigned: DataFrame,
) -> DataFrame | None:
    """The batch users' open sessions, those of users with a session that now straddles a
    cut of its run (:func:`~sessionlake.sessionize.straddles_a_cut`) replaced by their
    events from ``events``, for a second sessionization that cuts them where a batch
    sessionization of the same events would.

    Rare: it takes a run longer than the maximum duration whose start an accepted event
    moves earlier. ``None`` (the sessions are kept whole, as before) when ``events`` no
    longer holds every event of those sessions (retention deleted some): a cut made of
    what is left would lose events.
    """
    # The users to cut anew, with their open sessions' span and events, in one query of
    # the state rows the sessionization already holds.
    affected = assigned.where(F.col("is_state")).groupBy("user_id").agg(
        F.max(straddles_a_cut(settings.max_session_duration)).alias("straddles"),
        F.min("start_us").alias("first"), F.max("end_us").alias("last"),
        F.sum("event_count").alias("events"),
    ).where("straddles").collect()
    users = [r["user_id"] for r in affected]
    first = moment_at(min(r["first"] for r in affected))
    last = moment_at(max(r["last"] for r in affected))
    expected = sum(r["events"] for r in affected)
    assert first is not None and last is not None
    accepted = read_table(spark, settings.lake, EVENTS, inputs.table_versions[EVENTS]).where(
        F.col("user_id").isin(users)
        & F.col("event_date").between(F.lit(first.date()), F.lit(last.date())))
    theirs = state.where(F.col("user_id").isin(users))
    exploded = open_session_events(theirs, accepted)
    found = exploded.count()
    if found != expected:
        log.warning("open sessions of %d user(s) now span a cut of their run, but events "
                    "holds %d of their %d events: kept whole", len(users), found, expected)
        return None
    columns = exploded.columns
    return state.where(~F.col("user_id").isin(users)).select(*columns).unionByName(exploded)


def _split_session_ids(assigned: DataFrame) -> list[str]:
    """The open sessions whose events a sessionization divided between two or more
    sessions (they were cut anew by :func:`_state_cut_anew`)."""
    pieces = assigned.where(F.col("is_state")).groupBy("state_session_id").agg(
        F.countDistinct("run_no", "chunk").alias("sessions"))
    return sorted(r[0] for r in pieces.where(F.col("sessions") > 1).collect())


def _closed_sessions_near(
    spark: SparkSession,
    settings: Settings,
    version: int,
    first: datetime | None,
    last: datetime | None,
) -> DataFrame | None:
    """Closed sessions that events between ``first`` and ``last`` could fall near.

    ``None`` when no event of the batch is behind the watermark: then no event can be
    near a closed session and ``sessions`` is not read at all.
    """
    if first is None or last is None:
        return None
    reach = settings.max_session_duration + settings.gap
    return read_table(spark, settings.lake, SESSIONS, version).where(
        F.col("session_date").between(
            F.lit((first - reach).date()), F.lit((last + settings.gap).date())
        )
    )


#: A record's key within a batch: where it sits in the input (a file's line, a Kafka offset).
RECORD_KEY: tuple[str, ...] = ("source_file", "source_line")

#: Keys a join ships whole to every task rather than shuffling the batch's records for it.
BROADCAST_KEYS_MAX = 1_000_000


def shipped_whole(keys: DataFrame, rows: int) -> DataFrame:
    """``keys`` (at most ``rows`` rows) marked to be shipped whole to every task of a join,
    as long as they are few enough (:data:`BROADCAST_KEYS_MAX`) for the driver to hold and
    send: a Kafka catch-up without ``--max-offsets-per-trigger`` can make one batch of a
    hundred million records, whose keys, broadcast, would not fit the driver's memory."""
    return F.broadcast(keys) if rows <= BROADCAST_KEYS_MAX else keys


def _records_of(valid: DataFrame, keys: DataFrame, count: int, how: str) -> DataFrame:
    """The batch's parsed records joined (``how``) to ``count`` record keys of them.

    Sessionization works on a narrow projection of the events; the rows it rejected (late
    or duplicate) are found again among the parsed records by their key. They are usually
    few, so the keys are broadcast and the records are not shuffled.
    """
    joined = shipped_whole(keys, count)
    extra = [c for c in keys.columns if c not in RECORD_KEY] if how == "inner" else []
    return valid.join(joined, list(RECORD_KEY), how).select(*valid.columns, *extra)


def _stamp(frame: DataFrame, batch_id: int, column: str, at: datetime) -> DataFrame:
    return frame.withColumn("batch_id", F.lit(batch_id).cast("long")).withColumn(
        column, F.lit(at).cast("timestamp")
    )


def _batch_counts(
    outcome: dict[str, Any],
    classified: dict[str, Any],
    expiring: dict[str, Any],
    batch_buckets: list[int],
) -> dict[str, Any]:
    """Counts of the batch's outcomes, from the figures observed on its frames."""
    closed = int(classified["closes"]) + int(expiring["expired"])
    return {
        **{name: int(outcome[name]) for name in ("valid", "unique", "accepted", "late")},
        "opened": int(classified["opened"]),
        "closed": closed,
        "changes": int(classified["changed"]) + closed,
        # The MERGE source's rows: its upserts and deletes, and a delete per expiring one.
        "merge_rows": int(classified["merge_rows"]) + int(expiring["expired"]),
        "merge_buckets": sorted({*batch_buckets,
                                 *(int(b) for b in expiring["buckets"])}),
    }


def _metrics_row(
    identity: StreamIdentity,
    batch_id: int,
    inputs: BatchInputs,
    stats: dict[str, Any],
    counts: dict[str, Any],
    merged: MergeResult,
    open_now: int,
    max_event_time: datetime | None,
    watermark: datetime | None,
    watermark_after: datetime | None,
) -> dict[str, Any]:
    valid = int(stats["input"]) - int(stats["quarantined"])
    duration_ms = int((time.monotonic() - inputs.clock_read_at) * 1000)
    return {
        "batch_id": batch_id,
        "stream_id": identity.stream_id,
        "started_at": inputs.processing_time,
        "finished_at": inputs.processing_time + timedelta(milliseconds=duration_ms),
        "duration_ms": duration_ms,
        "input_records": int(stats["input"]),
        "accepted": counts["accepted"],
        "late": counts["late"],
        "quarantined": int(stats["quarantined"]),
        "duplicates": valid - counts["unique"],
        "sessions_opened": counts["opened"],
        "closed_sessions": counts["closed"],
        "open_sessions": open_now,
        "max_event_time": max_event_time,
        "watermark_before": watermark,
        "watermark_after": watermark_after,
        "merge_rows_inserted": merged.rows_inserted,
        "merge_rows_updated": merged.rows_updated,
        "merge_rows_deleted": merged.rows_deleted,
        "merge_rows_copied": merged.rows_copied,
        "merge_files_added": merged.files_added,
        "merge_files_removed": merged.files_removed,
        "merge_duration_ms": merged.duration_ms,
    }

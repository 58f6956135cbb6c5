"""The batch ledger: what a micro-batch reads, recorded in the checkpoint before it writes.

A batch's entry (``<checkpoint>/ledger/<stream>-<epoch>-<batch>.json``) holds the version of
every stream table it reads, the watermark's start and the batch's clock. A batch replayed
after a crash finds its entry and reads the same versions by time travel, so it computes
the same rows; when it finishes, its entry is marked done with what the next batch needs
without a query (the watermark, the open sessions' count, the bound of the ids in
``events``). The checkpoint's identity (stream id and restore epoch) names the entries and
tags every commit.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionlake import eventids, storage
from sessionlake.checkpoint import IDENTITY_FILE, StreamIdentity, read_stream_identity
from sessionlake.config import ConfigError, Settings, format_duration
from sessionlake.state import MergeResult
from sessionlake.tables import (
    BATCH_METRICS,
    EVENTS,
    LATE_EVENTS,
    OPEN_SESSIONS,
    SESSIONS,
    STREAM_TABLES,
    committed_by,
    never_written,
    read_table,
    single_row,
    table_version,
)

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    """The wall clock, in UTC, to the microsecond."""
    return datetime.now(UTC)


def stream_identity(spark: SparkSession, checkpoint: str) -> StreamIdentity:
    """The identity kept in the checkpoint folder, created on the first run."""
    identity = read_stream_identity(spark, checkpoint)
    if identity is None:
        identity = StreamIdentity(stream_id=uuid.uuid4().hex[:16], epoch=0)
        write_stream_identity(spark, checkpoint, identity)
    return identity


def write_stream_identity(
    spark: SparkSession | None, checkpoint: str, identity: StreamIdentity
) -> None:
    """Store ``identity`` in the checkpoint folder (restore bumps the epoch)."""
    storage.write_text(
        spark,
        f"{checkpoint.rstrip('/')}/{IDENTITY_FILE}",
        json.dumps({"stream_id": identity.stream_id, "epoch": identity.epoch}),
    )


@dataclass(frozen=True)
class BatchInputs:
    """What a batch reads besides its files: fixed in the ledger before any write.

    ``table_versions`` holds every stream table's version before the first attempt: the
    versions the batch reads by time travel. ``replay`` says that an earlier attempt
    recorded them, and so may have committed some of its writes: each write then first
    looks for its commit among those after its table's version.
    """

    table_versions: dict[str, int]
    max_event_time_before: datetime | None
    processing_time: datetime
    #: The watermark reached before the batch (:func:`watermark_floor`); ``None`` on a new
    #: lake, and in an entry recorded before 2026-12-06.
    watermark_floor: datetime | None = None
    replay: bool = False
    #: The ledger entry of the previous batch of the same stream and epoch (empty when
    #: there is none), read once for all of its notes (:func:`previous_entry`).
    previous: Mapping[str, Any] = field(default_factory=dict)
    #: The batch's own ledger entry as recorded, which :func:`mark_done` completes.
    entry: Mapping[str, Any] = field(default_factory=dict)
    #: ``time.monotonic()`` when ``processing_time`` was read (a replay: when it began),
    #: from which the batch's ``duration_ms`` counts, so that ``started_at`` plus it is
    #: when the batch finished.
    clock_read_at: float = 0.0

    def id_bound(self, table: str) -> eventids.IdBound | None:
        """An upper bound of the ids in ``table`` (``events`` or ``late_events``, see
        :mod:`sessionlake.eventids`), if the batch recorded one."""
        return eventids.from_json(self.entry.get(ID_BOUND_NOTES[table]))

    @property
    def earlier_events_read_before(self) -> bool:
        """Whether the previous batch's duplicate check read ``events``: if it did not, this
        one most likely will not either, and the table's snapshot is not resolved ahead."""
        return self.previous.get(EVENTS_READ_NOTE) is not False

    def written_after(self, table: str) -> int | None:
        """Where a replay looks for this batch's commit of ``table``; ``None``: not a replay."""
        return self.table_versions[table] if self.replay else None

    def holds_no_id_from(self, table: str, least_id: str | None) -> bool:
        """Whether ``table``, at the version the batch reads, holds no id from ``least_id``
        up: then no event of the batch can repeat one of its events."""
        bound = self.id_bound(table)
        return (bound is not None and bound.version == self.table_versions[table]
                and bound.excludes(least_id))


def _as_utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def ledger_uri(settings: Settings, identity: StreamIdentity, batch_id: int) -> str:
    return f"{settings.checkpoint.rstrip('/')}/ledger/{identity.ledger_prefix}{batch_id}.json"


def read_ledger(
    spark: SparkSession, settings: Settings, identity: StreamIdentity, batch_id: int
) -> dict[str, Any] | None:
    text = storage.read_text(spark, ledger_uri(settings, identity, batch_id))
    return None if text is None else dict(json.loads(text))


def previous_entry(
    spark: SparkSession, settings: Settings, identity: StreamIdentity, batch_id: int
) -> dict[str, Any]:
    """The ledger entry of the batch before ``batch_id`` in the same stream and epoch,
    empty when there is none (the first batch of a stream or of a restore epoch).

    A batch reads it once, in :func:`record_inputs`: on an object store each read is a
    request, and the entry does not change once its batch is done.
    """
    if batch_id <= 0:
        return {}
    return read_ledger(spark, settings, identity, batch_id - 1) or {}


def write_ledger(
    spark: SparkSession, settings: Settings, identity: StreamIdentity, batch_id: int,
    entry: dict[str, Any],
) -> None:
    storage.write_text(spark, ledger_uri(settings, identity, batch_id), json.dumps(entry))


def _parse_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


#: How far before the previous batch's processing time a new batch's clock may read: NTP's
#: small steps pass; a clock set back further would judge events against a time behind
#: theirs (:func:`record_inputs`).
CLOCK_SET_BACK_TOLERANCE = timedelta(minutes=5)


class ClockSetBack(ConfigError):
    """This machine's clock reads a time before the previous batch's: the batch refuses to
    begin rather than judge events against it."""


def check_clock_not_set_back(now: datetime, previous: Mapping[str, Any], batch_id: int) -> None:
    """Refuse a new batch whose processing time ``now`` lies more than
    :data:`CLOCK_SET_BACK_TOLERANCE` before the previous batch's (its ledger entry
    ``previous``): events ahead of the batch's clock by more than ``--max-future-skew`` are
    quarantined as from the future, so a clock set back an hour would quarantine every live
    event, with no way to read them again but a restore. Also what two workers whose
    clocks disagree look like.

    :raises ClockSetBack: naming both times and what to do.
    """
    before = _parse_time(previous.get("processing_time"))
    if before is None or now >= before - CLOCK_SET_BACK_TOLERANCE:
        return
    raise ClockSetBack(
        f"this machine's clock reads {now.isoformat(timespec='seconds')}, "
        f"{format_duration(before - now)} before the processing time of batch {batch_id - 1} "
        f"({before.isoformat(timespec='seconds')}): a clock set back, or a worker whose clock "
        "disagrees with the one that ran that batch. Batch "
        f"{batch_id} would judge events against it and quarantine those ahead of it by more "
        "than --max-future-skew as from the future. Nothing was written: set the clock right "
        "(NTP) and run again; the batch runs then")


def record_inputs(
    spark: SparkSession,
    settings: Settings,
    identity: StreamIdentity,
    batch_id: int,
    clock: Clock,
) -> tuple[BatchInputs, bool]:
    """The batch's inputs, and whether the batch already completed.

    A replayed batch gets the inputs its first attempt recorded in the ledger (a JSON file
    per batch in the checkpoint, so that a restore of the checkpoint restores it too);
    a new batch records them there now, before anything is written.
    """
    clock_read_at = time.monotonic()
    entry = read_ledger(spark, settings, identity, batch_id)
    replay = entry is not None
    previous = previous_entry(spark, settings, identity, batch_id)
    if entry is None:
        check_clock_not_set_back(clock().astimezone(UTC), previous, batch_id)
        versions = {table: table_version(spark, settings.lake, table) for table in STREAM_TABLES}
        max_before, floor = times_before(spark, settings, previous, versions[BATCH_METRICS])
        bounds = {table: eventids.id_bound(
            spark, settings.lake, eventids.from_json(previous.get(note)), versions[table],
            from_log=note not in previous, table=table,
        ) for table, note in ID_BOUND_NOTES.items()}
        clock_read_at = time.monotonic()
        entry = {
            "events_version": versions[EVENTS],
            "open_sessions_version": versions[OPEN_SESSIONS],
            "sessions_version": versions[SESSIONS],
            "table_versions": versions,
            "max_event_time_before": None if max_before is None else max_before.isoformat(),
            "watermark_floor": None if floor is None else floor.isoformat(),
            "processing_time": clock().astimezone(UTC).isoformat(),
            **{ID_BOUND_NOTES[table]: None if bound is None else bound.as_json()
               for table, bound in bounds.items()},
            "done": False,
        }
        write_ledger(spark, settings, identity, batch_id, entry)
    inputs = BatchInputs(
        table_versions=_versions_before(spark, settings, entry),
        max_event_time_before=_parse_time(entry["max_event_time_before"]),
        watermark_floor=_parse_time(entry.get("watermark_floor")),
        processing_time=_parse_time(entry["processing_time"]) or clock(),
        replay=replay,
        previous=previous,
        entry=entry,
        clock_read_at=clock_read_at,
    )
    return inputs, bool(entry.get("done"))


#: Ledger keys: the batch's bound of the ids in ``events`` and in ``late_events`` at the
#: versions it reads (:mod:`sessionlake.eventids`), and whether its duplicate check read
#: ``events``.
ID_BOUND_NOTES = {EVENTS: "events_id_bound", LATE_EVENTS: "late_events_id_bound"}


EVENTS_READ_NOTE = "read_earlier_events"


def _versions_before(
    spark: SparkSession, settings: Settings, entry: dict[str, Any]
) -> dict[str, int]:
    """Every stream table's version before the batch, from its ledger entry.

    An entry written before these were all recorded (by an earlier release) has the read
    versions of three tables only; for the others a replay looks through the newest 50
    commits.
    """
    recorded = {EVENTS: entry["events_version"], OPEN_SESSIONS: entry["open_sessions_version"],
                SESSIONS: entry["sessions_version"], **entry.get("table_versions", {})}
    for table in STREAM_TABLES:
        if table not in recorded:
            recorded[table] = max(-1, table_version(spark, settings.lake, table) - 50)
    return {table: int(recorded[table]) for table in STREAM_TABLES}


def max_event_time_before(
    spark: SparkSession, settings: Settings, previous: Mapping[str, Any], metrics_version: int
) -> datetime | None:
    """The largest event time accepted before a batch: where its watermark stands.

    The previous batch of the same stream and epoch noted it in its ledger entry
    (``previous``, see :func:`previous_entry`) when it finished, so a batch reads one small
    file instead of scanning ``batch_metrics``, whose files grow with every batch. The note
    holds while that batch's row is the only commit to ``batch_metrics`` since the version
    it read (``metrics_version`` is the table's version now). Otherwise another writer came
    between: a stream on another checkpoint may have moved the lake's watermark on, so the
    batch takes the maximum over ``batch_metrics``, as does the first batch after a restore
    (a new epoch) or after a ledger without that note.
    """
    return times_before(spark, settings, previous, metrics_version)[0]


def watermark_floor(
    spark: SparkSession, settings: Settings, previous: Mapping[str, Any], metrics_version: int
) -> datetime | None:
    """The watermark the lake's batches have reached, which a batch's never falls below.

    With one grace period it never would; a run with a longer ``--grace`` than the runs
    before it would otherwise move the watermark back, and an event next to a session
    already closed would find that session open again (a second session 20 minutes from
    it with a 30-minute gap, where it is late). A shorter grace moves it on at once.
    Read as :func:`max_event_time_before` reads its instant: the previous batch's note,
    else ``batch_metrics``.
    """
    return times_before(spark, settings, previous, metrics_version)[1]


def times_before(
    spark: SparkSession, settings: Settings, previous: Mapping[str, Any], metrics_version: int
) -> tuple[datetime | None, datetime | None]:
    """:func:`max_event_time_before` and :func:`watermark_floor` together: the previous
    batch's notes while its row is the only commit to ``batch_metrics`` since the version
    it read; else the maxima over ``batch_metrics``, in one query."""
    notes = ("max_event_time_after", "watermark_after")
    read_before = previous.get("table_versions", {}).get(BATCH_METRICS)
    if (previous.get("done") and all(note in previous for note in notes)
            and read_before is not None and metrics_version <= read_before + 1):
        return _parse_time(previous[notes[0]]), _parse_time(previous[notes[1]])
    if never_written(spark, settings.lake, BATCH_METRICS):  # a new lake's first batch
        return None, None
    newest = single_row(read_table(spark, settings.lake, BATCH_METRICS, metrics_version).agg(
        F.max("max_event_time"), F.max("watermark_after")))
    return _as_utc(newest[0]), _as_utc(newest[1])


@dataclass(frozen=True)
class OpenCount:
    """How many rows ``open_sessions`` holds, and at which of its versions."""

    sessions: int
    version: int


def mark_done(
    spark: SparkSession,
    settings: Settings,
    identity: StreamIdentity,
    batch_id: int,
    entry: Mapping[str, Any],
    max_event_time_after: datetime | None,
    open_after: OpenCount,
    read_earlier_events: bool = True,
    watermark_after: datetime | None = None,
) -> None:
    """Note in the batch's ledger entry (``entry``, as :func:`record_inputs` recorded it)
    that every table write of the batch has committed, the largest accepted event time so
    far and the watermark (the next batch's starts there), how many sessions are open at which
    version (see :func:`open_sessions_estimate` and :func:`count_open_sessions`) and
    whether the duplicate check read ``events``
    (:attr:`BatchInputs.earlier_events_read_before`)."""
    after = None if max_event_time_after is None else max_event_time_after.isoformat()
    write_ledger(spark, settings, identity, batch_id,
                  {**entry, "done": True, "max_event_time_after": after,
                   "watermark_after": None if watermark_after is None
                   else watermark_after.isoformat(),
                   "open_sessions_after": open_after.sessions,
                   "open_sessions_version_after": open_after.version,
                   EVENTS_READ_NOTE: read_earlier_events})


def open_sessions_known(
    spark: SparkSession, settings: Settings, identity: StreamIdentity, batch_id: int,
    version: int, previous: Mapping[str, Any],
) -> int | None:
    """How many sessions are open at ``open_sessions``' ``version``: none at version 0,
    the table's creation (the batch reads no state there either); else when the previous
    batch of the stream counted them at that very version (its ledger entry,
    ``previous``) and that version is its own MERGE (so nothing was written to the table
    since, and it is the same table); ``None`` otherwise."""
    if version <= 0:
        return 0
    if previous.get("open_sessions_version_after") != version:
        return None
    noted = previous.get("open_sessions_after")
    if not isinstance(noted, int) or not committed_by(
            spark, settings.lake, OPEN_SESSIONS, version, (identity.app_id, batch_id - 1)):
        return None
    return noted


def count_open_sessions(
    spark: SparkSession, lake: str, known: int | None, version_before: int,
    merged: MergeResult,
) -> OpenCount:
    """The open sessions after the batch's MERGE.

    From the count before it and the MERGE's own metrics when nothing else wrote to the
    table in between, else by counting the table: counting read the table's newest state
    at the end of every batch (0.3-0.4 s of a 100,000-event batch).
    """
    if known is not None and merged.version is None:
        return OpenCount(known, version_before)
    if known is not None and merged.version == version_before + 1:
        return OpenCount(known + merged.rows_inserted - merged.rows_deleted, merged.version)
    version = table_version(spark, lake, OPEN_SESSIONS)
    return OpenCount(read_table(spark, lake, OPEN_SESSIONS, version).count(), version)


#: How many open sessions a batch reads for about the work of one of its records, in
#: choosing its code generation: the state is only scanned for the batch's users, while
#: a record is parsed, checked, sessionized and written. Counted one for one, a restart's
#: 100 events over 10^5 open sessions ran compiled: 25.5-26.8 s to the first commit,
#: against 22.0-22.9 s interpreted (whole process, alternating). Over 10^6 the two were
#: even: 30.0-32.7 s compiled, 29.5-30.8 s interpreted.
STATE_ROWS_PER_RECORD = 10


def open_sessions_estimate(previous: Mapping[str, Any]) -> int:
    """About how many sessions are open before a batch, known without a query.

    The count the previous batch of the same stream and epoch left in its ledger entry
    (``previous``); 0 when there is none (the first batch of a stream or of a restore
    epoch). Used only to size the batch's code generation (see
    :data:`STATE_ROWS_PER_RECORD`): a few events of users spread over every bucket read
    the whole state. Maintenance between batches can make it stale; that changes how fast
    the batch runs, never what it writes.
    """
    noted = previous.get("open_sessions_after")
    # Only a hint: an entry edited by hand into something else must not fail the batch.
    return noted if isinstance(noted, int) and noted > 0 else 0

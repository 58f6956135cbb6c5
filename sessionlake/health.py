"""The pipeline's health, read from the lake without Spark.

What the Airflow plugin's page and JSON show (``plugins/sessionlake_health.py``) and what
``sessionlake report`` prints: the last micro-batch and how far it was behind the newest
event, the watermark, open and closed sessions, late, quarantined and duplicate records per
batch, the snapshot catalog, files per table and compaction debt, and the retention audit.

Everything comes from files, through :mod:`sessionlake.deltareader` (Delta logs and small
tables read with pyarrow) and the snapshot catalog's JSON: no JVM is started, so the
Airflow API server can call :func:`collect_health` on every request.

* ``batch_metrics`` (one row per batch) gives the last batch, the watermark and the series;
* ``open_sessions`` and ``sessions`` are counted from their logs (record counts minus
  deletion vectors), so the counts are exact even after retention deleted rows;
* each table's log gives its files, bytes and small files (what OPTIMIZE would rewrite).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from socket import gethostname
from typing import Any, NamedTuple

from sessionlake import deltalog, deltareader
from sessionlake.checkpoint import (
    LAKE_HOLDER_FILE,
    LAKE_LOCK_FILE,
    MANIFEST,
    PID_FILE,
    RESTORING_MARKER,
    SNAPSHOTS_DIR,
    UnreadInput,
    kafka_topics_read,
    lake_lock_folder,
    lock_held,
    unread_input,
)
from sessionlake.config import (
    KAFKA_SOURCE,
    Settings,
    format_age,
    format_duration,
    no_lake_message,
)
from sessionlake.storage import is_glob, local_path

log = logging.getLogger("sessionlake.health")

#: The tables shown, in the order a micro-batch writes them, then the audit.
TABLES: tuple[str, ...] = (
    "events", "open_sessions", "sessions", "session_changelog", "late_events",
    "quarantine", "batch_metrics", "retention_audit",
)
#: ``sessionlake compact``'s default ``--min-files``: a table with this many files that an
#: OPTIMIZE would rewrite is due for compaction.
COMPACT_MIN_FILES = 16
#: How many of the newest batches the series (and the charts) hold.
SERIES_BATCHES = 200
#: How many of the newest retention runs are shown.
RETENTION_RUNS = 10

_BATCH_COLUMNS = (
    "batch_id", "stream_id", "started_at", "finished_at", "duration_ms", "input_records",
    "accepted", "late", "quarantined", "duplicates", "sessions_opened", "closed_sessions",
    "open_sessions", "max_event_time", "watermark_after", "merge_duration_ms",
)
_COUNTED = ("input_records", "accepted", "late", "quarantined", "duplicates")


@dataclass(frozen=True)
class BatchPoint:
    """One micro-batch, from its ``batch_metrics`` row."""

    batch_id: int
    stream_id: str
    started_at: datetime
    finished_at: datetime
    duration_ms: int
    input_records: int
    accepted: int
    late: int
    quarantined: int
    duplicates: int
    sessions_opened: int
    closed_sessions: int
    #: Rows in ``open_sessions`` after the batch: the state's size.
    open_sessions: int
    max_event_time: datetime | None
    watermark_after: datetime | None
    merge_duration_ms: int

    @property
    def late_fraction(self) -> float:
        """Late events over the batch's input records (0 for an empty batch)."""
        return self.late / self.input_records if self.input_records else 0.0

    @property
    def lag_seconds(self) -> float | None:
        """How far the batch's newest event was behind the time the batch committed."""
        if self.max_event_time is None:
            return None
        return (self.finished_at - self.max_event_time).total_seconds()


@dataclass(frozen=True)
class TableHealth:
    """A table's size and compaction debt, from its Delta log."""

    name: str
    version: int
    files: int
    bytes: int
    rows: int
    #: Live files below Delta's OPTIMIZE threshold.
    small_files: int
    #: Small files in partitions holding two or more of them: what OPTIMIZE would rewrite.
    compactable_files: int
    #: Files with a deletion vector, and the rows those vectors delete (until a rewrite).
    deletion_vector_files: int
    deleted_rows: int
    last_operation: str | None
    committed_at: datetime | None

    @property
    def needs_compaction(self) -> bool:
        """Whether ``sessionlake compact`` with its default ``--min-files`` would act."""
        return self.compactable_files >= COMPACT_MIN_FILES


@dataclass(frozen=True)
class SnapshotEntry:
    """A restore point of the catalog."""

    snapshot_id: str
    created_at: str
    name: str | None
    last_batch_id: int
    #: Why it can no longer be restored (a VACUUM removed a file one of its table
    #: versions needs), or ``None``.
    unrestorable: str | None = None


@dataclass(frozen=True)
class RetentionRun:
    """A row of ``retention_audit``."""

    run_id: str
    started_at: datetime
    finished_at: datetime
    erased_users: int
    rows_deleted: dict[str, int]
    files_vacuumed: int
    time_travel_purged: bool
    note: str | None


@dataclass(frozen=True)
class Health:
    """Everything the health page shows, as of ``generated_at``."""

    lake: str
    generated_at: datetime
    lake_exists: bool
    stream_running: bool
    #: The running stream's pid and checkpoint, when its lock's holder file names them.
    stream_pid: int | None
    stream_checkpoint: str | None
    open_sessions: int | None
    closed_sessions: int | None
    last_batch: BatchPoint | None
    #: Totals over every batch in ``batch_metrics``: input, accepted, late, ...
    totals: dict[str, int]
    batch_count: int
    #: The newest batches (at most :data:`SERIES_BATCHES`), oldest first.
    batches: list[BatchPoint]
    tables: list[TableHealth]
    snapshots: list[SnapshotEntry]
    retention: list[RetentionRun]
    #: The landing folder (``SESSIONLAKE_SOURCE``), or ``kafka``, also when only the
    #: stream's checkpoint says it reads Kafka; ``None`` when not set.
    source: str | None = None
    #: The topics a Kafka stream reads (its checkpoint's, else ``--kafka-topic``).
    kafka_topics: list[str] = field(default_factory=list)
    #: What of the landing folder no committed batch has read yet (the backlog a run would
    #: read now), and the read files still there; ``None`` when that cannot be told
    #: without Spark: a Kafka topic, a glob, a folder on another machine, or no source.
    input_waiting: UnreadInput | None = None
    #: What could not be read, in words (the rest of the page is still shown).
    problems: list[str] = field(default_factory=list)
    #: The host the running stream runs on (what to stop, where), when its holder says.
    stream_host: str | None = None

    @property
    def watermark(self) -> datetime | None:
        """The watermark after the last batch."""
        return self.last_batch.watermark_after if self.last_batch else None

    @property
    def lag_seconds(self) -> float | None:
        """How far the last batch's newest event was behind the time the batch committed."""
        return self.last_batch.lag_seconds if self.last_batch else None

    @property
    def status(self) -> str:
        """``ok``, or ``unhealthy`` while there is any problem (a probe pages on it)."""
        return "unhealthy" if self.problems else "ok"

    @property
    def seconds_since_last_batch(self) -> float | None:
        """How long ago the last batch committed."""
        if self.last_batch is None:
            return None
        return (self.generated_at - self.last_batch.finished_at).total_seconds()

    def as_json(self) -> dict[str, Any]:
        """The health as JSON-ready values (times in ISO 8601, UTC)."""
        last = self.last_batch
        return _jsonable({
            "lake": self.lake,
            "generated_at": self.generated_at,
            "lake_exists": self.lake_exists,
            "stream_running": self.stream_running,
            "stream_pid": self.stream_pid,
            "stream_checkpoint": self.stream_checkpoint,
            "stream_host": self.stream_host,
            "open_sessions": self.open_sessions,
            "closed_sessions": self.closed_sessions,
            "last_batch_id": last.batch_id if last else None,
            "watermark": self.watermark,
            "lag_seconds": self.lag_seconds,
            "seconds_since_last_batch": self.seconds_since_last_batch,
            "batch_count": self.batch_count,
            "totals": self.totals,
            "last_batch": _batch_json(last) if last else None,
            "batches": [_batch_json(b) for b in self.batches],
            "tables": [{**asdict(t), "needs_compaction": t.needs_compaction}
                       for t in self.tables],
            "snapshots": [asdict(s) for s in self.snapshots],
            "retention": [asdict(r) for r in self.retention],
            "source": self.source,
            "kafka_topics": self.kafka_topics,
            "input_waiting": {**{k: v for k, v in asdict(waiting).items() if k != "ties"},
                              "archive_due": waiting.archive_due}
            if (waiting := self.input_waiting) else None,
            "problems": self.problems,
            "status": self.status,
        })


def _batch_json(batch: BatchPoint) -> dict[str, Any]:
    return {**asdict(batch), "late_fraction": batch.late_fraction,
            "lag_seconds": batch.lag_seconds}


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def collect_health(settings: Settings, now: datetime | None = None) -> Health:
    """Read the health of the lake of ``settings`` (and whether its stream runs).

    Never raises for a missing or half-written lake: what cannot be read is named in
    ``problems`` and the rest is filled in.
    """
    now = now or datetime.now(UTC)
    lake = deltareader.local_table_path(settings.lake)
    exists = _is_lake(lake)
    problems = [] if exists else [no_lake_message(settings.lake)]
    states = _table_states(lake, problems) if exists else {}
    batches = _batches(states.get("batch_metrics"), problems)
    totals = {key: sum(getattr(b, key) for b in batches) for key in _COUNTED}
    running = running_stream(settings)
    # The running stream's checkpoint, whatever ``--checkpoint`` it was given, else the
    # one ``settings`` name (as ``sessionlake run`` and ``archive`` take it).
    checkpoint = (running[1] if running else None) or settings.checkpoint
    topics = _kafka_topics(settings, checkpoint)
    waiting = _input_waiting(settings, checkpoint, problems)
    last = batches[-1] if batches else None
    problems += _stalled(settings, now, last, waiting, running is not None)
    problems += _restore_cut_off(checkpoint)
    return Health(
        lake=settings.lake,
        generated_at=now,
        lake_exists=exists,
        stream_running=running is not None,
        stream_pid=running.pid if running else None,
        stream_checkpoint=running.checkpoint if running else None,
        stream_host=running.host if running else None,
        open_sessions=_rows(states.get("open_sessions")),
        closed_sessions=_rows(states.get("sessions")),
        last_batch=last,
        totals=totals,
        batch_count=len(batches),
        batches=batches[-SERIES_BATCHES:],
        tables=[table_health(name, state) for name, state in states.items()],
        snapshots=list_snapshot_entries(lake, problems),
        retention=_retention_runs(states.get("retention_audit"), problems),
        source=KAFKA_SOURCE if topics else settings.source,
        kafka_topics=topics,
        input_waiting=waiting,
        problems=problems,
    )


def _stalled(settings: Settings, now: datetime, last: BatchPoint | None,
             waiting: UnreadInput | None, running: bool) -> list[str]:
    """The stream has stalled: files have waited in the landing folder, and no batch has
    committed, for longer than ``alert_stalled_after``. A hung run, a paused or failing
    micro-batch DAG and a stream nobody restarted look the same from the lake; the
    run's own ALERTs are in its log, which nobody may be reading."""
    since = None if last is None else now - last.finished_at
    if not waiting or not waiting.files or \
            (since is not None and since <= settings.alert_stalled_after):
        return []
    stalled = format_duration(settings.alert_stalled_after)
    no_batch = ("no batch has committed yet" if since is None else
                f"the last batch committed {format_age(since)} ago")
    who = ("the run holding the checkpoint has not committed them: is it stuck?" if running
           else "no run holds the checkpoint: is the micro-batch DAG paused or failing?")
    files = f"{waiting.files} files wait" if waiting.files != 1 else "1 file waits"
    return [f"the stream has stalled: {files} in the landing folder and {no_batch} "
            f"(over {stalled}, SESSIONLAKE_ALERT_STALLED_AFTER); {who}"]


def _restore_cut_off(checkpoint: str) -> list[str]:
    """A restore cut off half-way, which keeps every run from starting until it is run
    again."""
    folder = local_path(checkpoint)
    marker = None if folder is None else folder / RESTORING_MARKER
    if marker is None or not marker.exists():
        return []
    try:
        snapshot = json.loads(marker.read_text()).get("snapshot_id", "?")
    except (OSError, ValueError):
        snapshot = "?"
    return [f"a restore to snapshot {snapshot} was cut off half-way: no run starts until "
            f"`sessionlake restore --snapshot {snapshot}` is run again"]


def _kafka_topics(settings: Settings, checkpoint: str) -> list[str]:
    """The topics the stream reads: its checkpoint's when that is on this machine and
    read Kafka (``report`` and the page are mostly given only ``--lake``), else the
    settings' topic for a Kafka stream; none for a folder's stream."""
    if settings.source and not settings.reads_kafka:
        return []
    logged = kafka_topics_read(None, checkpoint) if local_path(checkpoint) else None
    if logged:
        return logged
    return [settings.kafka_topic] if settings.reads_kafka and settings.kafka_topic else []


def _input_waiting(settings: Settings, checkpoint: str,
                   problems: list[str]) -> UnreadInput | None:
    """The landing folder's backlog against the stream's ``checkpoint``; a missing folder
    is a problem."""
    source = settings.source
    if not source:
        return None
    folder = None if settings.reads_kafka else local_path(source)
    if folder is not None and not is_glob(source) and not folder.is_dir():
        problems.append(f"no landing folder at {source}: the stream has nothing to read")
        return None
    return unread_input(source, checkpoint)


def _is_lake(lake: Path) -> bool:
    """Whether ``lake`` holds any of the lake's tables: an empty or unrelated folder (a
    misspelt ``--lake``) is no lake, not one whose every table is missing."""
    return lake.is_dir() and any(deltareader.is_delta_table(lake / name) for name in TABLES)


def _table_states(lake: Path, problems: list[str]) -> dict[str, deltareader.TableState]:
    states = {}
    for name in TABLES:
        if not deltareader.is_delta_table(lake / name):
            problems.append(f"table {name} does not exist yet")
            continue
        try:
            states[name] = deltareader.read_state(lake / name, remember=True)
        except (deltareader.DeltaReadError, OSError, ValueError) as error:
            problems.append(f"table {name} could not be read: {error}")
    return states


def _rows(state: deltareader.TableState | None) -> int | None:
    return None if state is None else state.row_count()


class RunningStream(NamedTuple):
    """The stream running on a lake: its pid, checkpoint and host, each ``None`` when its
    holder file does not name it."""

    pid: int | None
    checkpoint: str | None
    host: str | None = None

    @property
    def who(self) -> str:
        """``pid N``, and ``on host H`` when it is known and not this one: what to stop,
        where."""
        pid = f"pid {'?' if self.pid is None else self.pid}"
        return f"{pid} on host {self.host}" if self.host not in (None, gethostname()) else pid


def running_stream(settings: Settings) -> RunningStream | None:
    """The stream running on the lake (or on the checkpoint of ``settings``), ``None``
    when none runs.

    Found by the locks a run holds, not by pids alone: a lock is seen from another container
    sharing the lake's volume (the health page runs in Airflow's API server, the streams
    in its workers) and goes with a killed run, where a pid file would name a dead or
    reused process.
    """
    try:
        lake_folder = deltareader.local_table_path(lake_lock_folder(settings.lake))
        if lock_held(lake_folder, LAKE_LOCK_FILE):
            try:
                holder = json.loads((lake_folder / LAKE_HOLDER_FILE).read_text())
            except (OSError, ValueError):
                holder = {}
            return RunningStream(holder.get("pid"), holder.get("checkpoint"),
                                 holder.get("host"))
        folder = deltareader.local_table_path(settings.checkpoint)
    except deltareader.DeltaReadError:
        return None
    if not lock_held(folder):  # a run of a version before the lake's lock
        return None
    text = (folder / PID_FILE).read_text().strip() if (folder / PID_FILE).exists() else ""
    return RunningStream(int(text) if text.isdigit() else None, settings.checkpoint)


def _batches(state: deltareader.TableState | None, problems: list[str]) -> list[BatchPoint]:
    """Every batch of ``batch_metrics``, in the order they committed."""
    if state is None:
        return []
    try:
        rows = deltareader.read_rows(state, _BATCH_COLUMNS).to_pylist()
    except (deltareader.DeltaReadError, OSError, ValueError) as error:
        problems.append(f"batch_metrics could not be read: {error}")
        return []
    points = [BatchPoint(**row) for row in rows]
    return sorted(points, key=lambda b: (b.finished_at, b.batch_id))


def table_health(name: str, state: deltareader.TableState) -> TableHealth:
    """Files, bytes, rows and compaction debt of one table."""
    small = [f for f in state.files if f.size < deltareader.OPTIMIZE_MIN_FILE_SIZE]
    per_partition = Counter(tuple(sorted(f.partition_values.items())) for f in small)
    compactable = sum(n for n in per_partition.values() if n >= 2)
    return TableHealth(
        name=name,
        version=state.version,
        files=len(state.files),
        bytes=state.total_bytes,
        rows=state.row_count(),
        small_files=len(small),
        compactable_files=compactable,
        deletion_vector_files=sum(1 for f in state.files if f.deletion_vector),
        deleted_rows=sum(f.deleted_rows for f in state.files),
        last_operation=state.last_operation,
        committed_at=state.committed_at,
    )


def list_snapshot_entries(lake: Path, problems: list[str] | None = None) -> list[SnapshotEntry]:
    """The snapshot catalog (``<lake>/_snapshots/*/snapshot.json``), oldest first, each
    marked when it can no longer be restored."""
    root = lake / SNAPSHOTS_DIR
    entries = []
    listed: dict[str, dict[str, int]] = {}  # each table's files, listed once for all
    for manifest in sorted(root.glob(f"*/{MANIFEST}")) if root.is_dir() else []:
        try:
            data = json.loads(manifest.read_text(encoding="utf-8"))
            entries.append(SnapshotEntry(
                snapshot_id=str(data["snapshot_id"]), created_at=str(data["created_at"]),
                name=data.get("name"), last_batch_id=int(data.get("last_batch_id", -1)),
                unrestorable=unrestorable_versions(str(lake), data.get("table_versions", {}),
                                                   listed),
            ))
        except (OSError, ValueError, KeyError) as error:
            if problems is not None:
                problems.append(f"snapshot {manifest.parent.name} is unreadable: {error}")
    return sorted(entries, key=lambda s: (s.created_at, s.snapshot_id))


def unrestorable_versions(lake: str, table_versions: Mapping[str, int],
                          listed: dict[str, dict[str, int]] | None = None) -> str | None:
    """Why the lake's tables can no longer all return to ``table_versions`` (a snapshot's),
    or ``None``. ``listed`` keeps each table's files once listed, for the next snapshot.

    The lake is on this machine (a local path).
    """
    listed = {} if listed is None else listed
    for table, version in table_versions.items():
        uri = f"{lake.rstrip('/')}/{table}"
        if uri not in listed:
            listed[uri] = deltalog.files_on_disk(None, uri)
        missing = deltalog.missing_at(None, uri, int(version), listed[uri])
        if missing:
            return f"{table} {missing}"
    return None


def _retention_runs(state: deltareader.TableState | None, problems: list[str]
                    ) -> list[RetentionRun]:
    if state is None:
        return []
    columns = ("run_id", "started_at", "finished_at", "erased_users", "rows_deleted",
               "files_vacuumed", "time_travel_purged", "note")
    try:
        rows = deltareader.read_rows(state, columns).to_pylist()
    except (deltareader.DeltaReadError, OSError, ValueError) as error:
        problems.append(f"retention_audit could not be read: {error}")
        return []
    runs = [RetentionRun(**{**row, "rows_deleted": dict(row["rows_deleted"] or [])})
            for row in rows]
    return sorted(runs, key=lambda r: r.started_at)[-RETENTION_RUNS:]


def series(batches: Sequence[BatchPoint], key: str) -> list[float]:
    """One number per batch (``duration_ms`` in seconds, counts as they are)."""
    if key == "duration_s":
        return [b.duration_ms / 1000 for b in batches]
    return [float(getattr(b, key)) for b in batches]

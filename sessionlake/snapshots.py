"""Snapshots: consistent restore points of the whole lake, and restoring them.

A snapshot is the version of every table together with a copy of the streaming
checkpoint, taken at a micro-batch boundary: the tables hold exactly the batches the copied
checkpoint has committed. Restoring one returns every table (a ``RESTORE`` commit) and
the checkpoint to that point, so that the next run resumes there and, fed the same input,
ends with the same result as if nothing had been restored. This is the answer to state
stores whose restore replays a whole changelog: here it is one metadata commit per table,
written from the table's log for a local lake (:mod:`sessionlake.deltarestore`), so that a
restore takes a second or two and starts no JVM unless erasures must be made again.

Taking a snapshot never stops a running stream:

* the checkpoint is copied until the copy is a stable point-in-time image (the same files
  before and after the copy); such an image is the same as a crash state, which Spark's
  checkpoint recovers from by design;
* every table write of batch ``b`` is tagged with the stream's app id and ``b`` (its
  commit's ``userMetadata``), so the version of a table "after batch ``c``" is the one just
  before its first commit tagged with a batch after ``c`` (commits of compaction or
  retention in between change no rows).

A restore bumps the stream's epoch: Delta ``RESTORE`` does not remove the commits after the
version it returns to from the log, so the batches run again after the restore write under
a new app id, and their tags cannot be mistaken for those of the batches undone.

Snapshots are kept in ``<lake>/_snapshots/<id>/``: ``snapshot.json`` (the catalog entry)
and ``checkpoint/`` (the copy). They are kept until expired (:func:`expire_snapshots`):
VACUUM keeps every file the oldest kept snapshot needs, so that rows deleted since (aged
out, or erased) stay readable by time travel for as long as it is kept.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta

from delta.tables import DeltaTable
from pyspark.sql import SparkSession

from sessionlake import storage
from sessionlake.checkpoint import (
    BATCH_LOCK_FILE,
    CATALOG_LOCK_FILE,
    CONTINUOUS_LOG,
    CONTINUOUS_RUN,
    HOLDER_FILE,
    IDENTITY_FILE,
    LOCK_FILE,
    MANIFEST,
    PID_FILE,
    RESTORING_MARKER,
    SNAPSHOTS_DIR,
    LockTimeout,
    StreamIdentity,
    batch_lock,
    lake_batch_lock,
    last_committed_batch,
    read_stream_identity,
)
from sessionlake.config import ActionableError, Settings
from sessionlake.deltalog import (
    batch_keys,
    clear_delta_cache,
    commit_actions,
    missing_at,
    read_log,
    set_aside_log_from,
)
from sessionlake.deltarestore import ConcurrentCommit, is_at, needs_delta, restore_commit
from sessionlake.erasure import mark_killed_erasures, reapply_retention
from sessionlake.health import running_stream
from sessionlake.kafkastream import check_restore_keeps_kafka_records
from sessionlake.ledger import write_stream_identity
from sessionlake.locks import StreamAlreadyRunning, stream_locks
from sessionlake.registry import check_checkpoint_of_lake, lake_streams
from sessionlake.spark import SparkOnDemand
from sessionlake.tables import (
    PROPERTIES_NOTE,
    STREAM_TABLES,
    each_table,
    not_a_lake,
    table_path,
    table_version,
)

log = logging.getLogger("sessionlake.snapshots")

#: Files of the checkpoint folder that belong to the running process, not to the stream:
#: a snapshot does not copy them, a restore does not touch them (the continuous run's log
#: goes on across a restore).
_PROCESS_FILES = (LOCK_FILE, BATCH_LOCK_FILE, PID_FILE, HOLDER_FILE, RESTORING_MARKER,
                  CONTINUOUS_LOG, CONTINUOUS_RUN)
_COPY_ATTEMPTS = 20
#: How long an expiry waits for a restore to let go of the catalog before it gives up.
EXPIRY_WAIT_S = 60.0
#: A folder of the catalog without a manifest, named for a time longer ago than this, is
#: what a snapshot or an expiry cut off left (a snapshot in progress writes its manifest
#: last, within minutes): an expiry removes it.
UNFINISHED_AFTER = timedelta(days=1)


class SnapshotError(ActionableError):
    """A snapshot cannot be taken or restored; the message says why and what to do."""


@dataclass(frozen=True)
class Snapshot:
    """A catalog entry: when, which batch, and the version of every table."""

    snapshot_id: str
    created_at: str
    name: str | None
    stream_id: str | None
    epoch: int | None
    last_batch_id: int
    table_versions: dict[str, int] = field(default_factory=dict)
    has_checkpoint: bool = True

    def summary(self) -> str:
        """One line for the command line and task logs."""
        label = f" ({self.name})" if self.name else ""
        versions = ", ".join(f"{t}@{v}" for t, v in sorted(self.table_versions.items()))
        batch = "no batch yet" if self.last_batch_id < 0 else f"after batch {self.last_batch_id}"
        return f"{self.snapshot_id}{label} {self.created_at} {batch}: {versions}"

    @property
    def created(self) -> datetime:
        """``created_at`` as a time."""
        return datetime.fromisoformat(self.created_at)


#: A snapshot's copy of the checkpoint, in its catalog folder.
CHECKPOINT_COPY = "checkpoint"


def snapshots_root(lake: str) -> str:
    """The catalog folder of the lake's snapshots."""
    return f"{lake.rstrip('/')}/{SNAPSHOTS_DIR}"


def _snapshot_dir(lake: str, snapshot_id: str) -> str:
    return f"{snapshots_root(lake)}/{snapshot_id}"


def list_snapshots(lake: str, spark: SparkSession | None = None) -> list[Snapshot]:
    """The lake's snapshots, oldest first (``spark`` is needed for remote lakes only)."""
    root = snapshots_root(lake)
    if storage.local_path(root) is None and spark is None:
        raise SnapshotError(f"listing the snapshots of {lake} needs a Spark session")
    found = []
    for name in storage.list_names(spark, root):
        text = storage.read_text(spark, f"{root}/{name}/{MANIFEST}")
        if text is not None:
            found.append(Snapshot(**json.loads(text)))
    return sorted(found, key=lambda s: (s.created_at, s.snapshot_id))


def find_snapshot(lake: str, snapshot_id: str, spark: SparkSession | None = None) -> Snapshot:
    """The catalog entry of ``snapshot_id``: its id, or else the name it was given
    (``snapshot --name``, the snapshot DAG's ``name``), which only one snapshot may bear.

    :raises SnapshotError: naming the ids that do exist, or those a name is ambiguous
        between.
    """
    snapshots = list_snapshots(lake, spark)
    for snapshot in snapshots:
        if snapshot.snapshot_id == snapshot_id:
            return snapshot
    named = [s for s in snapshots if s.name == snapshot_id]
    if len(named) == 1:
        return named[0]
    if named:
        raise SnapshotError(
            f"{len(named)} snapshots of {lake} are named {snapshot_id!r} "
            f"({', '.join(s.snapshot_id for s in named)}): give the id of the one meant"
        )
    known = ", ".join(s.snapshot_id for s in snapshots[-5:]) or "none yet"
    raise SnapshotError(
        f"no snapshot {snapshot_id!r} in {lake} (newest: {known}); "
        "list them with `sessionlake snapshot --list`"
    )


def _require_lake(spark: SparkSession | None, lake: str) -> None:
    if (why := not_a_lake(spark, lake)) is not None:
        raise SnapshotError(why)


def copy_stable(spark: SparkSession | None, source: str, target: str) -> None:
    """Copy the folder ``source`` to ``target`` as a point-in-time image.

    A running stream keeps writing its checkpoint; the copy is repeated until no file of
    ``source`` was added, removed or changed while it was being copied.

    :raises SnapshotError: when the folder never stood still long enough.
    """
    def state() -> dict[str, tuple[int, int]]:
        return {name: stat for name, stat in storage.tree_state(spark, source).items()
                if name not in _PROCESS_FILES}

    for _ in range(_COPY_ATTEMPTS):
        before = state()
        storage.copy_tree(spark, source, target)
        if state() == before:
            for name in _PROCESS_FILES:
                storage.delete(spark, f"{target}/{name}")
            _drop_orphan_checksums(spark, target)
            return
    raise SnapshotError(
        f"the checkpoint {source} changed during each of {_COPY_ATTEMPTS} copies: try again"
    )


def _drop_orphan_checksums(spark: SparkSession | None, folder: str) -> None:
    """Delete ``.NAME.crc`` files whose ``NAME`` is not there.

    Hadoop renames a file and its checksum one after the other; an image taken between the
    two may hold the checksum alone, on which Spark's next write of ``NAME`` would fail.
    """
    files = set(storage.tree_state(spark, folder))
    for path in files:
        parent, _, name = path.rpartition("/")
        if name.startswith(".") and name.endswith(".crc"):
            data = f"{parent}/{name[1:-4]}" if parent else name[1:-4]
            if data not in files:
                storage.delete(spark, f"{folder}/{path}")


def _commit_batch_ids(
    spark: SparkSession | None, log_dir: str, version: int, app_id: str
) -> list[int]:
    """The batches of ``app_id`` that made commit ``version`` (its tag, or legacy txn key)."""
    text = storage.read_text(spark, f"{log_dir}/{version:020d}.json")
    if text is None:
        raise FileNotFoundError(f"{log_dir}/{version:020d}.json")
    try:
        actions = commit_actions(text)
    except json.JSONDecodeError:
        raise SnapshotError(
            f"the Delta log entry {log_dir}/{version:020d}.json is half-written: no "
            "snapshot can hold this table's newest version; `sessionlake doctor` says "
            "how to recover"
        ) from None
    return [batch for app, batch in batch_keys(actions) if app == app_id]


def version_after_batch(
    spark: SparkSession | None, lake: str, table: str, app_id: str, batch_id: int
) -> int:
    """The version of ``table`` holding exactly the batches up to ``batch_id`` of ``app_id``.

    Walks the table's commits from the newest back: a commit tagged with a later batch of
    the stream belongs after the snapshot; the first commit tagged with this batch or an
    earlier one (or the table's creation) bounds the walk.
    """
    log_dir = f"{table_path(lake, table)}/_delta_log"
    newest = table_version(spark, lake, table)
    chosen = newest
    for version in range(newest, -1, -1):
        try:
            keys = _commit_batch_ids(spark, log_dir, version, app_id)
        except FileNotFoundError:  # log cleaned up this far back: nothing older can matter
            break
        if any(k > batch_id for k in keys):
            chosen = version - 1
        elif keys:
            break
    return chosen


def new_snapshot_id(now: datetime) -> str:
    """A sortable, unique id: ``20260105T101500Z-3f9a1c``."""
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{secrets.token_hex(3)}"


def create_snapshot(
    spark: SparkSession | None, settings: Settings, name: str | None = None,
    now: datetime | None = None,
) -> Snapshot:
    """Record a consistent restore point of the lake and its checkpoint.

    Safe while a stream runs: the point is the last batch the copied checkpoint committed.
    Only files are read and copied: ``spark`` may be ``None`` for a lake and checkpoint on
    this machine's disks (no JVM to start).

    :param name: an optional label, shown in the catalog.
    :return: the catalog entry written.
    :raises SnapshotError: when the lake does not exist.
    """
    lake = settings.lake
    _require_lake(spark, lake)
    check_checkpoint_of_lake(spark, lake, settings.checkpoint)
    if name is not None and (not name.strip() or name != name.strip()):
        raise SnapshotError(f"a snapshot's name must be words without white space around "
                            f"them, got {name!r}")
    if name is not None and name in {s.snapshot_id for s in list_snapshots(lake, spark)}:
        raise SnapshotError(f"{name} is the id of another snapshot: a restore by that name "
                            "would restore that one; pick another name")
    now = now or datetime.now(UTC)
    snapshot_id = new_snapshot_id(now)
    folder = _snapshot_dir(lake, snapshot_id)
    checkpoint = settings.checkpoint.rstrip("/")
    has_checkpoint = storage.exists(spark, checkpoint)
    identity: StreamIdentity | None = None
    last_batch = -1
    if has_checkpoint:
        copy = f"{folder}/{CHECKPOINT_COPY}"
        copy_stable(spark, checkpoint, copy)
        identity = read_stream_identity(spark, copy)
        last_batch = last_committed_batch(spark, f"{copy}/spark")
    if identity is None:
        versions = {t: table_version(spark, lake, t) for t in STREAM_TABLES}
    else:
        versions = {t: version_after_batch(spark, lake, t, identity.app_id, last_batch)
                    for t in STREAM_TABLES}
    snapshot = Snapshot(
        snapshot_id=snapshot_id,
        created_at=now.isoformat(),
        name=name,
        stream_id=identity.stream_id if identity else None,
        epoch=identity.epoch if identity else None,
        last_batch_id=last_batch,
        table_versions=versions,
        has_checkpoint=has_checkpoint,
    )
    # The manifest is written last: a snapshot cut off before it is not in the catalog.
    storage.write_text(spark, f"{folder}/{MANIFEST}", json.dumps(asdict(snapshot), indent=1))
    log.info("snapshot %s", snapshot.summary())
    return snapshot


@contextmanager
def _restore_marked(
    spark: SparkSession | None, checkpoint: str, snapshot: Snapshot
) -> Iterator[None]:
    """Leave a marker in the checkpoint while a restore is half done.

    Tables and checkpoint are restored one after the other; should the restore be cut off,
    the marker stops the next run from resuming on a mix of the two (see
    :func:`sessionlake.stream.check_no_restore_pending`), and the restore can simply be run again.
    """
    marker = f"{checkpoint}/{RESTORING_MARKER}"
    storage.write_text(spark, marker, json.dumps({"snapshot_id": snapshot.snapshot_id}))
    yield
    storage.delete(spark, marker)


def _damage_to_set_aside(
    spark: SparkSession | None, lake: str, table: str, version: int, snapshot: Snapshot
) -> int | None:
    """The first damaged version of ``table``'s log, when it lies after ``version``.

    Delta ``RESTORE`` must load the table first, which fails when a log entry is missing or
    half-written; when that damage lies after ``version``, the entries from there on can be
    moved aside (:func:`_set_aside`) and the restore proceeds as usual.

    :raises SnapshotError: when the damage reaches ``version`` itself, or the table was
        created after the snapshot (``rebuild-state`` re-creates a damaged
        ``open_sessions``): its version numbers are then not the snapshot's.
    """
    table_log = read_log(spark, table_path(lake, table))
    if table_log.created_ms is not None and \
            table_log.created_ms > snapshot.created.timestamp() * 1000:
        raise SnapshotError(
            f"{table} was created after snapshot {snapshot.snapshot_id} (a rebuild-state of a "
            "damaged table re-creates it), so its versions are not the snapshot's: restore a "
            "snapshot taken since"
        )
    damaged_from = table_log.log_damaged_from
    if damaged_from is not None and damaged_from <= version:
        raise SnapshotError(
            f"{table}'s log is damaged from version {damaged_from} on, and this snapshot "
            f"needs version {version}: restore an older snapshot (`sessionlake doctor` "
            "names one)"
        )
    return damaged_from


def _check_files_kept(spark: SparkSession | None, lake: str, table: str, version: int) -> None:
    """Refuse, before anything changes, when ``RESTORE`` of ``table`` to ``version`` would
    fail: a data file or deletion vector of that version is gone (a VACUUM removed it, or
    it was deleted), or the log no longer reaches that version. Found only half-way, the
    tables restored before would be left at the snapshot and the others not.

    :raises SnapshotError: naming the table, the file and the version.
    """
    missing = missing_at(spark, table_path(lake, table), version)
    if missing:
        raise SnapshotError(
            f"{table} {missing} (a VACUUM or a deletion removed it since the snapshot was taken); "
            f"nothing was restored: restore a newer snapshot (listed in "
            f"{lake.rstrip('/')}/_snapshots)"
        )


def _set_aside(spark: SparkOnDemand, lake: str, table: str, damaged_from: int,
               now: datetime) -> None:
    """Move the log entries of ``table`` from ``damaged_from`` on out of its log."""
    uri = table_path(lake, table)
    target, moved = set_aside_log_from(_files(spark, lake), uri, damaged_from,
                                       now.strftime("%Y%m%dT%H%M%SZ"))
    if spark.started is not None:
        clear_delta_cache(spark.started)
    log.warning("%s: moved the damaged log entries from version %s on (%s) to %s",
                table, damaged_from, ", ".join(n for n in moved if not n.startswith(".")),
                target)


def _restore_table(spark: SparkOnDemand, lake: str, table: str, version: int) -> bool:
    """``RESTORE`` one table to ``version``; ``False`` when it already is there.

    A local table is restored by one commit written from its log
    (:mod:`sessionlake.deltarestore`: milliseconds, no Spark); one it cannot restore so
    by Delta's ``RESTORE``.
    """
    uri = table_path(lake, table)
    if storage.local_path(uri) is not None:
        if is_at(uri, version):
            return False  # already there, or a previous attempt of this restore got this far
        try:
            if restore_commit(uri, version) is not None:
                return True
        except ConcurrentCommit as error:
            raise SnapshotError(f"{error}: nothing of it changed; run the restore again") \
                from None
        log.info("%s: restored by Delta's RESTORE (%s)", table, needs_delta(uri, version))
    session = spark()
    if table_version(session, lake, table) == version:
        return False
    target = DeltaTable.forPath(session, uri)
    history = target.history(1).head()
    if history is not None and history["operation"] == "RESTORE" and \
            str((history["operationParameters"] or {}).get("version")) == str(version):
        return False  # a previous attempt of this restore got this far
    try:
        target.restoreToVersion(version)
    except Exception as error:
        text = str(error)
        if "FileNotFound" in text or "DELTA_FILE_NOT_FOUND" in text or "missing" in text.lower():
            raise SnapshotError(
                f"{table} cannot return to version {version}: its data files have been "
                "vacuumed since the snapshot was taken"
            ) from None
        raise
    return True


def _replace_checkpoint(
    spark: SparkSession | None, checkpoint: str, snapshot_dir: str, snapshot: Snapshot
) -> StreamIdentity | None:
    """Put the snapshot's checkpoint copy in place, under a new epoch of its stream."""
    current = read_stream_identity(spark, checkpoint)
    for name in storage.list_names(spark, checkpoint):
        if name not in _PROCESS_FILES:
            storage.delete(spark, f"{checkpoint}/{name}")
    if not snapshot.has_checkpoint or snapshot.stream_id is None:
        return None  # the next run starts the stream afresh, as the snapshot had none
    copy = f"{snapshot_dir}/{CHECKPOINT_COPY}"
    for name in storage.list_names(spark, copy):
        if name != IDENTITY_FILE and name not in _PROCESS_FILES:
            storage.copy_tree(spark, f"{copy}/{name}", f"{checkpoint}/{name}")
    epochs = [snapshot.epoch or 0, *([current.epoch] if current else [])]
    identity = StreamIdentity(snapshot.stream_id, max(epochs) + 1)
    write_stream_identity(spark, checkpoint, identity)
    return identity


def check_restore_request(settings: Settings, snapshot_id: str) -> None:
    """What a restore checks first that needs no Spark, for a lake on this machine: the
    snapshot is in the catalog, and no stream holds the checkpoint or the lake (asked of
    their locks without taking them, :func:`sessionlake.health.running_stream`). Told in a
    moment, before a JVM starts (about 6 and 9 s before, on a loaded machine);
    :func:`restore_snapshot` checks them again under the locks.

    :raises SnapshotError: as :func:`restore_snapshot` would.
    """
    if storage.local_path(settings.lake) is None or \
            storage.local_path(settings.checkpoint) is None:
        return
    find_snapshot(settings.lake, snapshot_id)
    if not storage.exists(None, settings.lake):
        raise SnapshotError(f"{settings.lake} is not a sessionlake lake (no such folder): "
                            "`sessionlake run` creates it")
    check_checkpoint_of_lake(None, settings.lake, settings.checkpoint)
    running = running_stream(settings)
    if running is not None:
        raise SnapshotError(f"a sessionlake run ({running.who}) is writing the lake on "
                            f"checkpoint {running.checkpoint} (a restore needs the stream "
                            "stopped)")


def restore_snapshot(
    spark: SparkSession | SparkOnDemand, settings: Settings, snapshot_id: str
) -> Snapshot:
    """Return every table and the streaming checkpoint to ``snapshot_id``.

    Users erased since the snapshot was taken (see the retention audit) are erased again
    from the restored tables. Refused while a stream runs on the checkpoint (stop it first:
    the restart DAG, or SIGTERM); the checkpoint's lock is held throughout, so no run can
    start half-way.
    Running it again after an interruption finishes the job. A table whose log is damaged
    after the snapshot's version (an entry missing or half-written, so that Delta cannot
    load it to restore it) first has those entries moved aside.

    On this machine's disks a restore is written from the tables' logs and needs Spark only
    to erase users again or for a table it cannot restore so: pass a
    :class:`~sessionlake.spark.SparkOnDemand` to start the JVM only then.

    :return: the snapshot restored.
    :raises SnapshotError: unknown id, no lake, a running stream, vacuumed files, a log
        damaged at the snapshot's version, or a table re-created since.
    """
    on_demand = spark if isinstance(spark, SparkOnDemand) else SparkOnDemand.of(spark)
    lake, checkpoint = settings.lake, settings.checkpoint.rstrip("/")
    files = _files(on_demand, lake, checkpoint)
    find_snapshot(lake, snapshot_id, files)  # refused before the catalog's lock is made
    _require_lake(files, lake)
    check_checkpoint_of_lake(files, lake, checkpoint)
    with _catalog_lock(lake):  # no expiry removes the snapshot while it is being restored
        snapshot = find_snapshot(lake, snapshot_id, files)
        _restore_locked_streams(on_demand, files, settings, snapshot)
    return snapshot


def _restore_locked_streams(on_demand: SparkOnDemand, files: SparkSession | None,
                            settings: Settings, snapshot: Snapshot) -> None:
    """The restore under the stream locks: refused while a stream runs."""
    lake, checkpoint = settings.lake, settings.checkpoint.rstrip("/")
    try:
        # The lake's batch lock: an erasure must not run between the restore's look at the
        # audit (the erasures it re-applies) and its commits.
        with stream_locks(lake, checkpoint), lake_batch_lock(lake):
            # Checked before anything changes: a refusal leaves no restore half done.
            damaged = {t: d for t, v in snapshot.table_versions.items()
                       if (d := _damage_to_set_aside(files, lake, t, v, snapshot)) is not None}
            _check_restorable(on_demand, files, settings, snapshot)
            with _restore_marked(files, checkpoint, snapshot):
                _restore_locked(on_demand, lake, checkpoint, snapshot, damaged)
    except StreamAlreadyRunning as error:
        raise SnapshotError(f"{error} (a restore needs the stream stopped)") from None


def _check_restorable(on_demand: SparkOnDemand, files: SparkSession | None,
                      settings: Settings, snapshot: Snapshot) -> None:
    """What a restore checks that needs no lock: every table's files at the snapshot's
    version are still there, and a Kafka stream's topic still holds what the snapshot's
    stream reads on from."""
    for table, version in snapshot.table_versions.items():
        _check_files_kept(files, settings.lake, table, version)
    if snapshot.has_checkpoint:
        check_restore_keeps_kafka_records(
            on_demand, files, settings,
            f"{_snapshot_dir(settings.lake, snapshot.snapshot_id)}/{CHECKPOINT_COPY}",
            snapshot.snapshot_id)


def check_restore_possible(
    spark: SparkSession | SparkOnDemand, settings: Settings, snapshot_id: str
) -> Snapshot:
    """Whether :func:`restore_snapshot` could return the lake to ``snapshot_id`` now,
    changing nothing and taking no lock: beside a running stream, so that the restore DAG
    asks before it stops the stream (a refusal after the stop would leave it stopped).

    :raises SnapshotError: unknown id, no lake, or vacuumed files.
    :raises ConfigError: a Kafka stream's records gone (:func:`check_restore_keeps_kafka_records`).
    """
    on_demand = spark if isinstance(spark, SparkOnDemand) else SparkOnDemand.of(spark)
    files = _files(on_demand, settings.lake, settings.checkpoint)
    snapshot = find_snapshot(settings.lake, snapshot_id, files)
    _require_lake(files, settings.lake)
    check_checkpoint_of_lake(files, settings.lake, settings.checkpoint)
    _check_restorable(on_demand, files, settings, snapshot)
    return snapshot


def _files(spark: SparkOnDemand, *locations: str) -> SparkSession | None:
    """What the file operations on ``locations`` need: no session for this machine's
    disks, Spark's file systems for anything else."""
    if all(storage.local_path(location) is not None for location in locations):
        return spark.started
    return spark()


def _restore_locked(
    spark: SparkOnDemand, lake: str, checkpoint: str, snapshot: Snapshot,
    damaged: dict[str, int],
) -> None:
    """The restore proper, under the lock and the marker: logs, tables, checkpoint, erasures."""
    # An erasure killed after some deletes is counted from its commits, before the
    # restore's commits (and its re-application of that erasure) follow them.
    mark_killed_erasures(None, lake)
    now = datetime.now(UTC)
    for table, damaged_from in damaged.items():
        _set_aside(spark, lake, table, damaged_from, now)
    versions = snapshot.table_versions
    if any(needs_delta(table_path(lake, t), v) for t, v in versions.items()):
        spark()  # the JVM starts here, not in one of the threads below
    # Side by side, for the tables Delta's RESTORE must return (a dozen small Spark jobs
    # each, that mostly wait on the driver); the others take milliseconds.
    changed = each_table(lambda t: _restore_table(spark, lake, t, versions[t]), versions)
    restored = [t for t, was_changed in changed.items() if was_changed]
    if spark.started is not None:
        clear_delta_cache(spark.started)  # this JVM's cached states predate the commits
    files = _files(spark, lake, checkpoint)
    identity = _replace_checkpoint(
        files, checkpoint, _snapshot_dir(lake, snapshot.snapshot_id), snapshot
    )
    # Whoever was erased, and whatever aged out, after the snapshot was taken stays deleted.
    reapply_retention(spark, lake, snapshot.created, snapshot.table_versions,
                      snapshot.snapshot_id)
    # Delta's RESTORE returns the tables' properties to the snapshot's too (checked with
    # Delta 4.4): the next run looks at them again.
    storage.delete(files, f"{lake.rstrip('/')}/{PROPERTIES_NOTE}")
    log.info("restored %s (tables changed: %s; stream %s)", snapshot.snapshot_id,
             ", ".join(restored) or "none", identity)


def oldest_kept(lake: str, spark: SparkSession | None = None) -> Snapshot | None:
    """The oldest kept snapshot (``None`` without snapshots).

    VACUUM must keep every file removed since it was taken, or it could not be restored.
    """
    snapshots = list_snapshots(lake, spark)
    return snapshots[0] if snapshots else None


def _catalog_lock(lake: str, timeout: float | None = None) -> AbstractContextManager[None]:
    """The catalog's lock, waited for (local lakes; on object stores there is none, and the
    snapshot a cut-off restore names is what an expiry keeps)."""
    return batch_lock(storage.local_path(snapshots_root(lake)), timeout, CATALOG_LOCK_FILE)


@dataclass(frozen=True)
class Expiry:
    """What an expiry removed, and what it kept."""

    expired: tuple[Snapshot, ...]
    kept: tuple[Snapshot, ...]
    #: Kept although the rules would expire them: a cut-off restore must be run again to it.
    held: tuple[Snapshot, ...] = ()
    #: Folders without a manifest that a cut-off snapshot or expiry left, removed.
    leftovers: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """What the command line and the task log print."""
        said = [f"expired {s.summary()}" for s in self.expired]
        said += [f"kept {s.snapshot_id}, which a cut-off restore needs to be run again: "
                 "`sessionlake doctor` says how" for s in self.held]
        said += [f"removed {name}, a snapshot folder a cut-off snapshot or expiry left"
                 for name in self.leftovers]
        if self.kept:
            oldest = self.kept[0]
            said.append(f"{len(self.expired)} snapshot(s) expired, {len(self.kept)} kept; "
                        f"VACUUM keeps the files the oldest, {oldest.snapshot_id} (taken "
                        f"{oldest.created_at}), needs")
        else:
            said.append(f"{len(self.expired)} snapshot(s) expired, none kept")
        return said


def snapshots_to_expire(
    snapshots: list[Snapshot], now: datetime, max_age_days: int | None,
    keep_last: int | None, held: frozenset[str] = frozenset(),
) -> list[Snapshot]:
    """The snapshots an expiry removes, of ``snapshots`` (oldest first).

    Those taken more than ``max_age_days`` ago, but never the ``keep_last`` newest (one
    when only an age is given: the lake always keeps a restore point); with no age, all
    but the ``keep_last`` newest. Neither given: none. A snapshot in ``held`` is kept.
    """
    if max_age_days is None and keep_last is None:
        return []
    keep = keep_last or 1
    older = snapshots[:-keep] if len(snapshots) > keep else []
    cutoff = None if max_age_days is None else now - timedelta(days=max_age_days)
    return [s for s in older if (cutoff is None or s.created < cutoff)
            and s.snapshot_id not in held]


def _restores_pending(spark: SparkSession | None, settings: Settings) -> frozenset[str]:
    """The snapshots that cut-off restores of the lake's checkpoints name: each must be
    run again, and needs its snapshot for that."""
    checkpoints = {settings.checkpoint.rstrip("/"),
                   *(c.rstrip("/") for c in lake_streams(spark, settings.lake))}
    named = set()
    for checkpoint in checkpoints:
        text = storage.read_text(spark, f"{checkpoint}/{RESTORING_MARKER}")
        if text is not None:
            try:
                named.add(str(json.loads(text)["snapshot_id"]))
            except (ValueError, KeyError, TypeError):
                raise SnapshotError(
                    f"{checkpoint}/{RESTORING_MARKER} does not read, so which snapshot a "
                    "cut-off restore needs is unknown: nothing expired; `sessionlake "
                    "doctor` says how to recover") from None
    return frozenset(named)


def _unfinished_folders(spark: SparkSession | None, lake: str, now: datetime) -> list[str]:
    """Catalog folders without a manifest, named for a time over :data:`UNFINISHED_AFTER`
    ago: a snapshot cut off before its manifest, or an expiry after it."""
    root = snapshots_root(lake)
    found = []
    for name in storage.list_names(spark, root):
        try:
            taken = datetime.strptime(name.split("-", 1)[0], "%Y%m%dT%H%M%SZ")
        except ValueError:
            continue  # not a snapshot's folder (the catalog's lock, a folder put there)
        if taken.replace(tzinfo=UTC) < now - UNFINISHED_AFTER and \
                not storage.exists(spark, f"{root}/{name}/{MANIFEST}"):
            found.append(name)
    return found


def expire_snapshots(
    spark: SparkSession | None, settings: Settings, max_age_days: int | None,
    keep_last: int | None, now: datetime | None = None,
) -> Expiry:
    """Remove the snapshots :func:`snapshots_to_expire` names, so that VACUUM no longer
    keeps files for them.

    Without expiry a lake snapshotted daily keeps every file ever removed, and every row
    deleted since the oldest snapshot (aged out, or erased) readable by time travel. Each
    expired snapshot leaves the catalog first (its manifest), then its folder goes; a
    restore in progress is waited for (up to :data:`EXPIRY_WAIT_S`), and the snapshot a
    cut-off restore names is kept.

    :raises SnapshotError: a restore held the catalog that long, or a cut-off restore's
        marker does not read.
    """
    lake = settings.lake
    now = now or datetime.now(UTC)
    try:
        with _catalog_lock(lake, EXPIRY_WAIT_S):
            snapshots = list_snapshots(lake, spark)
            held = _restores_pending(spark, settings)
            expired = snapshots_to_expire(snapshots, now, max_age_days, keep_last, held)
            for snapshot in expired:
                folder = _snapshot_dir(lake, snapshot.snapshot_id)
                storage.delete(spark, f"{folder}/{MANIFEST}")  # out of the catalog first
                storage.delete(spark, folder)
                log.info("expired snapshot %s", snapshot.summary())
            leftovers = _unfinished_folders(spark, lake, now)
            for name in leftovers:
                storage.delete(spark, _snapshot_dir(lake, name))
    except LockTimeout:
        raise SnapshotError(
            f"a restore held the snapshot catalog of {lake} for {EXPIRY_WAIT_S:g} s: nothing "
            "expired; expire once it is done") from None
    gone = {s.snapshot_id for s in expired}
    rules = snapshots_to_expire(snapshots, now, max_age_days, keep_last)
    return Expiry(
        expired=tuple(expired),
        kept=tuple(s for s in snapshots if s.snapshot_id not in gone),
        held=tuple(s for s in rules if s.snapshot_id in held),
        leftovers=tuple(leftovers),
    )

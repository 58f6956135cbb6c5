"""The streaming job: files in the landing folder, or a Kafka topic, to micro-batches.

Spark's file source tracks which files were processed, and Spark's Kafka source which
offsets of which partitions (both in the checkpoint); each micro-batch is turned into lines
and handed whole to :func:`sessionlake.batch.process_lines` through ``foreachBatch``. No
Spark stateful operator is used, so the checkpoint holds only source offsets:
``--shuffle-partitions`` and ``--master`` may change between runs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from functools import partial
from types import FrameType
from typing import Any, NoReturn

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from sessionlake import faults, storage
from sessionlake.batch import PHASES, BatchReport, process_lines
from sessionlake.checkpoint import (
    GAP_NOTE,
    LANDING_NOTE,
    RESTORING_MARKER,
    SPARK_CHECKPOINT,
    SPARK_OFFSETS_LOG,
    LoggedFile,
    batch_files,
    changed_since_read,
    forget_archived_files,
    forget_requested,
    hidden_from_spark,
    kafka_topics_read,
    lake_lock_folder,
    landing_subfolders_read,
    last_committed_batch,
    note_input_format,
    noted_input_format,
    noted_session_rules,
    partition_folder,
    recorded_source_file,
)
from sessionlake.config import ActionableError, ConfigError, Settings, format_duration
from sessionlake.deltalog import LOG_DIR, commit_actions, commit_file, newest_commit_gone
from sessionlake.erasure import ErasureRun, KeepOut, KeptOut, files_kept_out
from sessionlake.kafkaadmin import (
    KafkaTopic,
    kafka_timeout,
)
from sessionlake.kafkastream import (
    check_checkpoint_reads_kafka,
    check_kafka_settings,
    check_kafka_topic,
    check_kafka_topic_unchanged,
    check_no_kafka_records_lost,
    check_topic_not_read_elsewhere,
    kafka_kept_out,
    kafka_records,
    kafka_topic_gone,
)
from sessionlake.ledger import Clock, StreamIdentity, stream_identity, utc_now
from sessionlake.locks import stream_locks
from sessionlake.monitor import (
    BatchMonitor,
    BatchRereads,
    KafkaRereads,
    LostExecutorRereads,
    PlanningWatch,
    RunningBatchWatch,
    rereads_kafka_timeouts,
    rereads_lost_executor,
    spark_activity,
)
from sessionlake.registry import (
    checkpoint_key,
    lake_streams,
    register_stream,
    source_key,
    unfinished_batch_since,
)
from sessionlake.sources import file_lines, kafka_lines, number_lines, source_file_of
from sessionlake.spark import QUERY_FAILURE_LOGGER, fit_to_stream, quiet_task_failures
from sessionlake.storage import is_glob, local_path
from sessionlake.tables import (
    BATCH_METRICS,
    STREAM_TABLES,
    ensure_tables,
    read_table,
    stream_gap_s,
    table_exists,
    table_path,
    upgrade_table_properties,
)

log = logging.getLogger("sessionlake.stream")


class RestoreUnfinished(ActionableError, RuntimeError):
    """A restore of the checkpoint was cut off half-way: the run would mix two states."""


class SourceGone(ActionableError, RuntimeError):
    """The stream's source went away for good while it ran (a Kafka topic deleted)."""


def check_no_restore_pending(spark: SparkSession, checkpoint: str) -> None:
    """Refuse to run on a checkpoint whose restore was cut off half-way.

    Tables and checkpoint are restored one after the other; resuming on a mix of the two
    would silently lose or double batches, so the restore must be run again first.

    :raises RestoreUnfinished: naming the snapshot to restore again.
    """
    text = storage.read_text(spark, f"{checkpoint.rstrip('/')}/{RESTORING_MARKER}")
    if text is not None:
        snapshot_id = json.loads(text).get("snapshot_id", "?")
        raise RestoreUnfinished(
            f"a restore to snapshot {snapshot_id} did not finish on {checkpoint}: run "
            f"`sessionlake restore --snapshot {snapshot_id}` again before running the stream"
        )


class BatchUnfinishedElsewhere(ActionableError, RuntimeError):
    """A stream on another checkpoint of the lake was cut off in the middle of a batch."""


def check_last_batch_has_its_offsets(spark: SparkSession, checkpoint: str) -> None:
    """Refuse a run whose checkpoint lacks the offsets of the last batch it committed (a
    file deleted or lost by hand): Spark would stop on an assertion of its own, in a
    stack trace that says nothing of the checkpoint or of how to go on.

    :raises ConfigError: naming the file, pointing at ``sessionlake doctor``, which says
        what each way on costs.
    """
    spark_checkpoint = f"{checkpoint.rstrip('/')}/{SPARK_CHECKPOINT}"
    committed = last_committed_batch(spark, spark_checkpoint)
    offsets = f"{spark_checkpoint}/{SPARK_OFFSETS_LOG}/{committed}"
    if committed >= 0 and not storage.exists(spark, offsets):
        raise ConfigError(
            f"checkpoint {checkpoint} is damaged: {offsets} is missing, although batch "
            f"{committed} committed, so the stream cannot tell where it stopped. "
            "`sessionlake doctor` says what is lost and how to go on")


def check_newest_commits(lake: str) -> None:
    """Refuse a run when the newest commit of one of a local lake's tables is cut short
    (a copy, a full disk, a hand) or gone while its checksum stays (deleted by hand): Delta
    skips a line it cannot parse and reads a log without its newest commit as the version
    before, so the run would lose what that commit added, commit on top of it, and in the
    first case leave the table unreadable after (the day-30 review). Delta writes a
    commit whole or not at all, and before its checksums, so neither is a commit in flight.

    A listing taken while another writer commits (a compaction, a retention) may show a
    commit's checksum and not yet the commit: a checksum found alone is looked for again.

    :raises ConfigError: naming the commit, pointing at ``sessionlake doctor`` (a snapshot
        to restore), and saying how to go on without what the commit added.
    """
    if local_path(lake) is None:
        return  # a listing and a read per table on object storage: left to doctor
    for table in STREAM_TABLES:
        log_dir = f"{table_path(lake, table)}/{LOG_DIR}"
        names = storage.list_names(None, log_dir)
        gone = newest_commit_gone(names)
        if gone is not None and not storage.exists(None, f"{log_dir}/{gone:020d}.json"):
            checksums = [name for name in names
                         if name in (f"{gone:020d}.crc", f".{gone:020d}.json.crc")]
            raise ConfigError(
                f"the newest commit of table {table} is gone "
                f"({table_path(lake, table)}/{commit_file(gone)}: its checksum is still "
                "there), and a run on the version before would lose what it added: nothing "
                f"was read. `sessionlake doctor` names a snapshot to restore if one holds "
                f"the table; to go on without what the commit added, delete "
                f"{' and '.join(f'{log_dir}/{name}' for name in checksums)}")
        versions = [int(name[:-5]) for name in names
                     if name.endswith(".json") and name[:-5].isdigit()]
        if not versions:
            continue
        commit = f"{table_path(lake, table)}/{commit_file(max(versions))}"
        try:
            commit_actions(storage.read_text(None, commit) or "")
        except ValueError:
            raise ConfigError(
                f"the newest commit of table {table} is cut short ({commit}: a line is not "
                "complete JSON), and a run on it would lose what it added: nothing was "
                "read. `sessionlake doctor` names a snapshot to restore if one holds the "
                "table; to go on without what the commit added, move it and its checksums "
                "out of the log") from None


def check_no_batch_cut_off_elsewhere(spark: SparkSession, settings: Settings) -> None:
    """Refuse to run while a stream on another checkpoint of the lake has a batch that was
    cut off and not replayed.

    Such a batch may have committed some of its tables and not others (its MERGE, say, and
    not its closed sessions); a stream that read the lake in between would judge its events
    against half a batch. The cut-off stream's next run replays the batch whole.

    :raises BatchUnfinishedElsewhere: naming the checkpoint to run once first.
    """
    ours = checkpoint_key(settings.checkpoint)
    for checkpoint in lake_streams(spark, settings.lake):
        started = unfinished_batch_since(spark, checkpoint) if checkpoint != ours else None
        if started is not None:
            raise BatchUnfinishedElsewhere(
                f"a batch of the stream on checkpoint {checkpoint}, started "
                f"{started.isoformat()}, was cut off and not replayed: run the stream on that "
                "checkpoint once first (`sessionlake run --checkpoint "
                f"{checkpoint}` with its --source), so that the lake holds whole batches"
            )


def check_session_rules_unchanged(spark: SparkSession, settings: Settings,
                                  note: bool = True) -> None:
    """Refuse a run whose ``--gap`` or ``--max-session-duration`` is not the one the lake's
    stream has cut its sessions with; note them at the lake's first run (and the maximum
    duration at the first run after a note of the gap alone).

    Open sessions cut with one rule and extended with another are neither: the lake would
    no longer match a batch sessionization of its events with any rule (a run at 1h cut
    an open session of two hours in two, and the next at 24h extended the second piece).
    A rule changed by mistake (``--gap 30``, which is 30 seconds; a DAG's environment
    other than the command line's) is refused before any batch, and so is another gap on
    a lake whose note was deleted: its newest closed sessions tell the gap. Sessions cut otherwise
    are a backfill of a date range (``sessionlake backfill``) or a new lake.

    :param note: whether to note the rules where they are not yet (a run); a rebuild of
        the state only checks.
    """
    noted = noted_session_rules(spark, settings.lake)
    if noted is None and (closed_with := stream_gap_s(spark, settings.lake)) is not None:
        noted = {"gap_s": float(closed_with)}  # the note is gone: the sessions tell
    asked = {"gap_s": settings.gap.total_seconds(),
             "max_session_duration_s": settings.max_session_duration.total_seconds()}
    rules = (("gap_s", "--gap", "another gap, `sessionlake backfill --gap` re-cuts a date "
              "range, or start a new lake"),
             ("max_session_duration_s", "--max-session-duration",
              "another maximum duration, start a new lake"))
    for key, flag, elsewhere in rules:
        if noted is not None and key in noted and noted[key] != asked[key]:
            lake_rule = format_duration(timedelta(seconds=noted[key]))
            raise ConfigError(
                f"the stream of lake {settings.lake} cuts its sessions with {flag} "
                f"{lake_rule}; {flag} {format_duration(timedelta(seconds=asked[key]))} would "
                f"cut the rest otherwise. Pass {flag} {lake_rule} (a number without a unit is "
                f"seconds); for sessions with {elsewhere}"
            )
    if note and noted != asked:
        storage.write_text(spark, f"{lake_lock_folder(settings.lake)}/{GAP_NOTE}",
                           json.dumps(asked))


def check_format_unchanged(spark: SparkSession, settings: Settings) -> bool:
    """Refuse a run whose ``--format`` is not the one the checkpoint's stream reads with;
    whether it is still to be noted (the stream's first run: noted once every check
    passed, so a refused run leaves no note).

    Run without ``--format apache`` (the default is ``jsonl``), a stream of access logs
    would quarantine every new line as invalid JSON: refused before any batch instead.
    """
    noted = noted_input_format(settings.checkpoint, spark)
    if noted is None:
        return True
    if noted != settings.input_format:
        raise ConfigError(
            f"the stream of checkpoint {settings.checkpoint} reads --format {noted}; "
            f"--format {settings.input_format} would quarantine its input. Pass --format "
            f"{noted} (jsonl is the default); another format needs another checkpoint "
            "(--checkpoint) and landing folder" + _wrong_format_way_out(spark, settings)
        )
    return False


def _wrong_format_way_out(spark: SparkSession, settings: Settings) -> str:
    """When the lake never accepted an event (its first run read the input with the wrong
    ``--format`` and quarantined it all), the way out of that mistake: a new lake. The
    checkpoint has read the files, so no other run on it reads them again."""
    # batch_metrics, not events: age limits and erasures empty events, never the metrics.
    if table_exists(spark, settings.lake, BATCH_METRICS) and not read_table(
            spark, settings.lake, BATCH_METRICS).where("accepted > 0").limit(1).collect():
        return (f". The lake has accepted no event yet: if --format {settings.input_format} "
                f"is what its input is, remove the lake {settings.lake} and the checkpoint "
                f"{settings.checkpoint} (inside it by default) and run again with it")
    return ""


@dataclass
class RunSummary:
    """What one ``sessionlake run`` did."""

    batches: list[BatchReport] = field(default_factory=list)

    @property
    def processed(self) -> list[dict[str, Any]]:
        """Metrics rows of the batches this run processed (replays already done excluded)."""
        return [b.row for b in self.batches if not b.skipped]

    def summary(self) -> str:
        """One line: the batches processed, where their records went, and the sessions
        closed and open after them."""
        rows = self.processed
        total = {key: sum(row[key] for row in rows) for key in (
            "input_records", "accepted", "late", "quarantined", "duplicates",
            "closed_sessions")}
        open_now = rows[-1]["open_sessions"] if rows else "unchanged"
        return (f"processed {len(rows)} micro-batch(es): {total['input_records']} records, "
                f"{total['accepted']} accepted, {total['late']} late, "
                f"{total['quarantined']} quarantined, {total['duplicates']} duplicates; "
                f"{total['closed_sessions']} sessions closed, {open_now} open")


def check_source(settings: Settings) -> str:
    """The source folder, or ``kafka`` with its brokers and topic, checked before anything
    is read or written (without reaching the brokers: see :func:`check_kafka_topic`)."""
    if not settings.source:
        raise ConfigError("no source folder: pass --source DIR (or --source kafka) "
                          "or set SESSIONLAKE_SOURCE")
    if settings.reads_kafka:
        return check_kafka_settings(settings)
    if settings.kafka_max_offsets_per_trigger:
        raise ConfigError("--max-offsets-per-trigger goes with --source kafka; for a "
                          "folder use --max-files-per-trigger")
    if settings.kafka_starting_offsets == "latest":
        raise ConfigError("--starting-offsets latest goes with --source kafka; a folder's "
                          "new stream reads every file already there")
    if settings.kafka_accept_data_loss:
        raise ConfigError("--accept-kafka-data-loss goes with --source kafka; a folder "
                          "loses no file it has not read")
    path = local_path(settings.source)
    if path is not None and not path.is_dir():
        raise ConfigError(
            f"source folder {settings.source} does not exist or is not a folder: "
            "create it, or point --source at the landing folder"
        )
    for flag, folder in (("--lake", settings.lake), ("--checkpoint", settings.checkpoint)):
        if folder and storage.within(folder, settings.source):
            raise ConfigError(
                f"{flag} {folder} lies in the landing folder {settings.source}: the stream "
                "would read its own files as events. Put the lake and the checkpoint "
                "outside the landing folder"
            )
    return settings.source


#: Why a landing folder cannot move under a stream.
MOVED_SOURCE_WHY = ("Spark's checkpoint keeps each file's absolute path, so the landing "
                    "folder cannot move under a stream")


def source_moved_from(
    spark: SparkSession | None, checkpoint: str, source_root: str
) -> str | None:
    """The folder the checkpoint's file source read from, when it is not ``source_root``.

    ``None`` too when nothing was read yet, or when the source is a glob (left to Spark).
    """
    if is_glob(source_root):
        return None
    recorded = recorded_source_file(spark, checkpoint)
    if recorded is None or recorded.startswith(f"{source_root.rstrip('/')}/"):
        return None
    return os.path.dirname(recorded)


def check_landing_folder(spark: SparkSession, settings: Settings) -> None:
    """Refuse a landing folder that does not go with the checkpoint, reading its file
    source log once.

    A checkpoint that has read files must go on with the folder it read them from: Spark
    would fail the next batch with a bare "Wrong basePath" (it checks each recorded path
    against the source), after the run had started. A new checkpoint must not take a folder
    that a stream of the lake on another checkpoint has read: Spark's file source knows
    what it read only from its own checkpoint, so the new stream would read every file
    again (its events judged late against the lake's watermark or dropped as duplicates,
    its malformed lines quarantined twice); forgetting the ``--checkpoint`` a stream ran
    with is the usual way there. A glob is left to Spark and the operator.

    :raises ConfigError: naming the folder the checkpoint knows, or the checkpoint that
        read the folder, and what to run instead.
    """
    root = storage.path_part(spark, settings.source or "").rstrip("/")
    ours = checkpoint_key(settings.checkpoint)
    topics = kafka_topics_read(spark, ours)
    if topics is not None:
        raise ConfigError(
            f"the stream's checkpoint {settings.checkpoint} reads Kafka topic "
            f"{', '.join(topics) or '(none)'}, not a folder: run it with --source kafka "
            f"--topic {','.join(topics)}, or give a stream of {settings.source} a checkpoint "
            "of its own (--checkpoint DIR)")
    if is_glob(root):
        return
    recorded = recorded_source_file(spark, ours)
    if recorded is not None:
        if not recorded.startswith(f"{root}/"):
            before = os.path.dirname(recorded)
            raise ConfigError(
                f"the stream's checkpoint {settings.checkpoint} read its files from {before}, "
                f"not from --source {settings.source}: {MOVED_SOURCE_WHY}. Run with "
                f"--source {before} (a symbolic link there to the moved folder will do)"
            )
        return
    for checkpoint in lake_streams(spark, settings.lake):
        theirs = recorded_source_file(spark, checkpoint) if checkpoint != ours else None
        if theirs is not None and storage.within(theirs, root):
            raise ConfigError(
                f"the landing folder {settings.source} was read by the lake's stream on "
                f"checkpoint {checkpoint}; a stream on the new checkpoint "
                f"{settings.checkpoint} would read all its files again (their events late or "
                f"duplicates). Run with --checkpoint {checkpoint}"
            )


#: Why a landing folder must hold files, not links out of it.
LINKS_OUT_WHY = (
    "Spark follows symbolic links, so the stream would read a file of wherever the link "
    "leads (into quarantine, whatever it holds), and `sessionlake archive` would move the "
    "files of the folder it leads to")


def check_no_links_out(settings: Settings) -> None:
    """Refuse, before the stream reads anything, a local landing folder that holds a
    symbolic link leading out of it (:data:`LINKS_OUT_WHY`): whoever may drop files there
    is not thereby given every file the run may read. Links within it are fine.

    :raises ConfigError: naming the links and where they lead.
    """
    landing = local_path(settings.source or "")
    if landing is None or is_glob(settings.source or ""):
        return
    if out := storage.links_leading_out(landing):
        named = ", ".join(f"{link} -> {target}" for link, target in out[:5])
        more = f" (and {len(out) - 5} more)" if len(out) > 5 else ""
        raise ConfigError(
            f"the landing folder {settings.source} holds symbolic links leading out of it: "
            f"{named}{more}. {LINKS_OUT_WHY}. Remove them, or put the files themselves in "
            "the landing folder")


def check_batch_stays_in_landing(settings: Settings, batch_id: int,
                                 files: Sequence[str]) -> None:
    """Refuse batch ``batch_id`` before it reads anything when one of its ``files`` leads
    out of the landing folder: a link made there after the run started
    (:func:`check_no_links_out`).

    :raises ConfigError: naming the file, where it leads, and how to run on.
    """
    landing = settings.source or ""
    if local_path(landing) is None or is_glob(landing):
        return
    for path in files:
        if not storage.within(path, landing):
            raise ConfigError(
                f"batch {batch_id} would read {path}, a symbolic link leading out of the "
                f"landing folder to {os.path.realpath(path)}: {LINKS_OUT_WHY}. Nothing of the "
                "batch was read or written. Put a file in its place (the file it leads "
                f"to: `cp --remove-destination {os.path.realpath(path)} {path}`, or an empty "
                "one), and run again: the batch then reads that file")


def file_identities(paths: Sequence[str]) -> dict[str, tuple[int, int] | None]:
    """Each path's device and inode, not following a link (``None``: not there)."""
    def identity(path: str) -> tuple[int, int] | None:
        try:
            status = os.lstat(path)
        except OSError:
            return None
        return status.st_dev, status.st_ino

    return {path: identity(path) for path in paths}


def check_batch_files_unchanged(batch_id: int,
                                before: Mapping[str, tuple[int, int] | None]) -> None:
    """Refuse batch ``batch_id``, after it read its files and before it writes anything,
    when one was replaced since :func:`check_batch_stays_in_landing` looked (another file,
    or a link, put in its place while the batch waited for its locks): what it read may
    be a file of anywhere.

    :raises ConfigError: naming the file.
    """
    for path, was in file_identities(list(before)).items():
        if was is not None and was != before[path]:
            raise ConfigError(
                f"batch {batch_id}: {path} was replaced while the batch read it (another "
                f"file, or a link, in its place: {LINKS_OUT_WHY}). Nothing of the batch was "
                "written; run again, and the batch reads the file as it is then")


def forget_files_archived_meanwhile(settings: Settings) -> None:
    """Drop from the source log the files ``sessionlake archive`` moved out while this
    stream ran, which kept it from doing so
    (:func:`sessionlake.checkpoint.forget_archived_files`); run holding the stream's locks.
    A failure is a warning: the log is only bigger."""
    checkpoint, landing = local_path(settings.checkpoint), local_path(settings.source or "")
    if checkpoint is None or landing is None or is_glob(settings.source or ""):
        return
    try:
        trim = forget_archived_files(checkpoint, landing)
    except (OSError, ValueError, KeyError, IndexError) as error:
        log.warning("the checkpoint's source log was not trimmed of archived files: %s", error)
        return
    if trim.dropped:
        log.info("the checkpoint's source log forgot %s archived file(s) (%s: %s -> %s "
                 "bytes)", trim.dropped, trim.entry, trim.bytes_before, trim.bytes_after)


def warn_of_files_changed_since_read(checkpoint: str) -> None:
    """Say which landing files changed after the stream read them, written to or replaced
    by a file of the same name: a file is read once, and what it holds now is not read
    (:func:`sessionlake.checkpoint.changed_since_read`)."""
    folder = local_path(checkpoint)
    try:
        changed = changed_since_read(folder / SPARK_CHECKPOINT) if folder is not None else []
    except (OSError, ValueError, KeyError, TypeError):
        return  # a source log Spark would not read either: its own error says so
    if changed:
        log.warning("landing files changed after the stream read them (written to, or put "
                    "back under the same name), and a file is read once, so what they hold now "
                    "is not read: %s%s. A file must be whole when it lands: write it elsewhere "
                    "(or under a name starting with . or _) and move it in; a file to read "
                    "again needs a new name",
                    ", ".join(str(p) for p in changed[:5]),
                    f" and {len(changed) - 5} more" if len(changed) > 5 else "")


def reads_subfolders(spark: SparkSession, settings: Settings) -> bool:
    """Whether the stream reads the files in the landing folder's subfolders too, at any
    depth (as a Firehose or a Kafka Connect sink lays them out: ``2026/01/05/...``); noted
    in the checkpoint at its first run.

    Every stream begun since sessionlake reads them does. A stream that read files before
    noted nothing, and keeps reading only the folder's own files (and Spark's ``key=value``
    partition folders): its subfolders may hold what nobody meant it to read, an archive
    of files already read say, which it would take in all at once. ``--read-subfolders``
    switches it; until then a run says which subfolders hold files it does not read.
    Hidden files and folders (``.``, ``_``) are never read.
    """
    note = f"{settings.checkpoint.rstrip('/')}/{LANDING_NOTE}"
    if settings.read_subfolders or landing_subfolders_read(settings.checkpoint, spark):
        if storage.read_text(spark, note) is None:
            storage.write_text(spark, note, json.dumps({"subfolders": True}))
        return True
    skipped = unread_subfolders(settings.source or "")
    if skipped:
        log.warning("files in subfolders of the landing folder %s are not read: %s. This "
                    "stream began before sessionlake read subfolders; `sessionlake run "
                    "--read-subfolders` reads them from now on (what they hold now too)",
                    settings.source, ", ".join(skipped))
    return False


def unread_subfolders(source: str, most: int = 5) -> list[str]:
    """Up to ``most`` subfolders of a local landing folder that hold a file, Spark's
    ``key=value`` partition folders and hidden ones aside."""
    folder = local_path(source)
    if folder is None or not folder.is_dir():
        return []
    found = []
    for sub in sorted(folder.iterdir()):
        if (sub.is_dir() and not hidden_from_spark(sub.name) and not partition_folder(sub.name)
                and any(f.is_file() for f in sub.rglob("*"))):
            found.append(sub.name)
            if len(found) == most:
                break
    return found


#: How much older than the newest file read a landing file may be and still be read:
#: Spark's file source ignores older ones (``maxFileAge``, a week by default), without a
#: word, so a file copied in with its time kept (``cp -p``) a week after newer ones was
#: never read. A hundred years: every file is read. What it costs: the source keeps every
#: file it read in a map (a path and a time each), where it kept a week's, read from its
#: log at each start (20,000 files: a 2.3 MB log; with the files archived, a run still
#: took 0.3-0.7 s more than with 10, Spark's and the start-up checks' reading of the log
#: together; docs/performance.md).
MAX_FILE_AGE = "36500d"
def landing_files(spark: SparkSession, settings: Settings, subfolders: bool = True) -> DataFrame:
    """The streaming DataFrame of the lines (:func:`sessionlake.sources.file_lines`) of the
    files in the source, and in its subfolders (:func:`reads_subfolders`), however old
    (:data:`MAX_FILE_AGE`)."""
    reader = spark.readStream.option("maxFileAge", MAX_FILE_AGE)
    if subfolders:
        reader = reader.option("recursiveFileLookup", "true")
    if settings.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", settings.max_files_per_trigger)
    return file_lines(reader, settings.source or "")


def check_run(spark: SparkSession, settings: Settings) -> None:
    """What ``sessionlake run --check-only`` asks: whether a run with ``settings`` would
    start, or what it would refuse (:func:`check_stream_can_start`), changing nothing."""
    check_source(settings)
    topic = check_kafka_topic(spark, settings) if settings.reads_kafka else None
    check_stream_can_start(spark, settings, topic)


def check_and_register_stream(spark: SparkSession, settings: Settings,
                              topic: KafkaTopic | None) -> StreamIdentity:
    """Refuse, before the stream reads or writes anything, a run that would break what
    earlier runs left (:func:`check_stream_can_start`), tidy what the checkpoint read
    (files archived meanwhile), then note the stream in the lake with its identity, which
    it returns."""
    format_unnoted = check_stream_can_start(spark, settings, topic, note=True)
    if topic is None:
        warn_of_files_changed_since_read(settings.checkpoint)
        forget_files_archived_meanwhile(settings)
    if format_unnoted:
        note_input_format(spark, settings.checkpoint, settings.input_format)
    identity = stream_identity(spark, settings.checkpoint)
    register_stream(spark, settings.lake, settings.checkpoint, source_key(settings),
                    *((topic.cluster_id, topic.topic_id) if topic else (None, None)),
                    stream_id=identity.stream_id)
    return identity


def check_stream_can_start(spark: SparkSession, settings: Settings, topic: KafkaTopic | None,
                           *, note: bool = False) -> bool:
    """Refuse a run that would break what earlier runs left: a restore cut off, another
    checkpoint's batch cut off, another source than the checkpoint's, a changed gap or
    input format. Taking no lock and, unless ``note``, writing nothing: the restart DAG
    asks it (``run --check-only``) of the run it would start, beside the one it would
    stop, so that what the new run would refuse is told before the stream stops.

    :param note: note the session rules at the lake's first run (a run, not a check).
    :return: whether the checkpoint's input format is still to be noted (its first run).
    """
    check_no_restore_pending(spark, settings.checkpoint)
    check_last_batch_has_its_offsets(spark, settings.checkpoint)
    check_newest_commits(settings.lake)
    check_no_batch_cut_off_elsewhere(spark, settings)
    # The source first: a run given another stream's folder or topic is told so, not
    # that this one's gap or format differs.
    if topic is not None:
        check_checkpoint_reads_kafka(spark, settings)
        check_kafka_topic_unchanged(spark, settings, topic)
        check_topic_not_read_elsewhere(spark, settings, topic)
        check_no_kafka_records_lost(spark, settings, topic)
    else:
        check_landing_folder(spark, settings)
        check_no_links_out(settings)
    check_session_rules_unchanged(spark, settings, note=note)
    return check_format_unchanged(spark, settings)


def prepare_lake(spark: SparkSession, settings: Settings) -> Settings:
    """Make the lake's tables (a new lake) or bring their properties up to date, and return
    ``settings`` with the user buckets the lake's ``open_sessions`` was made with: a lake
    keeps its buckets whatever a later run asks."""
    # The stream's own queries (tables, ledger, Delta's log replays) are small:
    # interpreted until a batch big enough to repay compiled code comes.
    fit_to_stream(spark)
    buckets = ensure_tables(spark, settings.lake, settings.user_buckets)
    upgrade_table_properties(spark, settings.lake)
    if buckets == settings.user_buckets:
        return settings
    log.warning("the lake's open_sessions has %s user buckets: using that, not %s",
                buckets, settings.user_buckets)
    return settings.with_overrides(user_buckets=buckets)


def input_lines(spark: SparkSession, settings: Settings,
                source: str) -> tuple[DataFrame, Callable[[DataFrame], DataFrame]]:
    """The stream of the run's input (landing files or Kafka records), and what turns a
    micro-batch of it into numbered lines for the format adapter."""
    if settings.reads_kafka:
        return kafka_records(spark, settings), kafka_lines
    root = storage.path_part(spark, source)
    stream = landing_files(spark, settings, reads_subfolders(spark, settings))
    return stream, partial(number_lines, source_root_path=root)


def stream_writer(stream: DataFrame, handle: Callable[[DataFrame, int], None],
                  settings: Settings, identity: StreamIdentity) -> DataStreamWriter:
    """The query's writer: each micro-batch to ``handle``, progress in the checkpoint's
    Spark folder, triggered as the settings ask (available-now or every interval)."""
    writer = (
        stream.writeStream.foreachBatch(handle)
        .option("checkpointLocation", f"{settings.checkpoint.rstrip('/')}/{SPARK_CHECKPOINT}")
        .queryName(f"sessionlake-{identity.stream_id}")
    )
    if settings.trigger == "available-now":
        return writer.trigger(availableNow=True)
    seconds = int(settings.processing_interval.total_seconds())
    return writer.trigger(processingTime=f"{seconds} seconds")


def run_stream(
    spark: SparkSession,
    settings: Settings,
    *,
    clock: Clock = utc_now,
    on_batch: Callable[[BatchReport], None] | None = None,
) -> RunSummary:
    """Run the stream until the source is drained (available-now) or it is stopped.

    A continuous run stops gracefully on SIGTERM or SIGINT: the batch in flight finishes
    and is committed, then the query stops. A second signal, from
    :data:`SECOND_SIGNAL_AFTER_S` after the first, stops it at once: the batch in flight is
    cancelled before its commit and runs again on restart.

    :param clock: the batch clock (tests pass a fixed one).
    :param on_batch: called with every batch's report, after its commit.

    Unless the session's Spark configuration sets them, ``spark``'s adaptive execution is
    turned off (:func:`sessionlake.spark.fit_to_stream`) and its code generation settings
    are chosen per batch (:func:`sessionlake.spark.fit_codegen_to_batch`); both stay so
    after the run.
    """
    source = check_source(settings)
    topic = check_kafka_topic(spark, settings) if settings.reads_kafka else None
    with stream_locks(settings.lake, settings.checkpoint):
        identity = check_and_register_stream(spark, settings, topic)
        settings = prepare_lake(spark, settings)
        stream, to_lines = input_lines(spark, settings, source)
        handler = _BatchHandler(spark, settings, identity, to_lines, clock, on_batch,
                                topic.earliest if topic is not None else {})
        monitor = handler.monitor
        run = _Supervision(spark, settings, topic, stream_writer(stream, handler, settings,
                                                                 identity), handler)
        spark.streams.addListener(monitor)
        quiet_after_stop = _QuietAfterStop(monitor)
        _PY4J_LOG.addFilter(quiet_after_stop)
        try:
            error = run.to_its_end()
            if handler.refused is not None:
                raise handler.refused
            _end_of_run(error, handler.not_begun, monitor.stop_requested, run.forced,
                        run.cancelled)
            monitor.wait_for(handler.reports)
        finally:
            if run.query is not None:
                monitor.wait_terminated()
            spark.streams.removeListener(monitor)
            _PY4J_LOG.removeFilter(quiet_after_stop)
    return handler.summary


class _BatchHandler:
    """The query's ``foreachBatch`` handler: each micro-batch through
    :func:`sessionlake.batch.process_lines`, its report kept for the run's summary and
    Spark's progress line, unless the run was asked to stop (:class:`StopBeforeBatch`)."""

    def __init__(self, spark: SparkSession, settings: Settings, identity: StreamIdentity,
                 to_lines: Callable[[DataFrame], DataFrame], clock: Clock,
                 on_batch: Callable[[BatchReport], None] | None,
                 kafka_earliest: Mapping[int, int]) -> None:
        self.spark, self.settings, self.identity = spark, settings, identity
        #: The first offset each partition of the topic held as the run began.
        self.kafka_earliest = kafka_earliest
        self.to_lines, self.clock, self.on_batch = to_lines, clock, on_batch
        self.summary = RunSummary()
        self.reports: dict[int, BatchReport] = {}
        self.monitor = BatchMonitor(settings, self.reports)
        self.in_flight = _BatchInFlight()
        self.stop = threading.Event()  # a graceful stop requested (SIGTERM, SIGINT)
        self.stop_now = threading.Event()  # a second signal: cancel the batch in flight
        self.quiet_on_stop = contextlib.ExitStack()
        self.not_begun: list[int] = []  # the batch a stop kept from beginning, if any
        #: A batch's own refusal, raised as it is rather than as Spark's failure around it.
        self.refused: ConfigError | None = None

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        if self.stop.is_set():
            self._refuse(batch_id)
        self.in_flight.start(batch_id)
        try:
            faults.set_batch(batch_id)
            files = None if self.settings.reads_kafka else batch_files(
                self.spark, self.settings.checkpoint, batch_id)
            paths = [file.path for file in files or []]
            identities = file_identities(paths) if local_path(
                self.settings.source or "") else {}
            if paths:
                check_batch_stays_in_landing(self.settings, batch_id, paths)

            def on_phase(phase: str) -> None:
                self.in_flight.begin(phase)
                if phase == PHASES[1] and identities:  # the files read, nothing written
                    check_batch_files_unchanged(batch_id, identities)

            landed = self._landed(files)
            report = process_lines(self.spark, self.to_lines(frame), batch_id, self.settings,
                                   self.identity, self.clock, on_phase,
                                   keep_out=self._keep_out(landed), landed=landed)
            if files is not None:
                report = replace(report, input_files=len(files))
            self.summary.batches.append(report)
            self.reports[batch_id] = report
            log.debug("batch %s: %s", batch_id, report.row)  # -v has its line
            if self.on_batch is not None:
                self.on_batch(report)
        except ConfigError as refused:
            self.refused = refused
            raise
        except Exception:
            if not self.stop_now.is_set():
                raise
            # Cancelled by a second signal (the run says so in one line). Spark's own error
            # is long (Spark's and Py4J's stack traces), and Spark's check of whether a
            # stop caused it runs a regex that recurses once per character: it overflowed
            # the stack and printed a thousand frames of java.util.regex. Spark gets a
            # short one instead.
            raise BatchCancelled(f"batch {batch_id} was cancelled by a second signal") from None
        finally:
            self.in_flight.end()

    def _landed(self, files: Sequence[LoggedFile] | None) -> dict[str, int | None] | None:
        """Each of the batch's files, as its records name it (``source_file``), with its
        modification time when Spark listed it; ``None`` for Kafka, or when the checkpoint
        does not name the batch's files (an entry of its logs missing)."""
        if files is None:
            return None
        root = storage.path_part(self.spark, self.settings.source or "")
        return {source_file_of(file.uri, root): file.timestamp_ms for file in files}

    def _keep_out(self, landed: Mapping[str, int | None] | None) -> KeepOut:
        """Which of the batch's records landed before an erasure of their user: those of
        its files that landed before it (``landed``: each file's modification time when
        Spark listed it), or, read from Kafka, its records before the erasure's offsets.
        Files the checkpoint does not name (an entry of its logs missing) count as landed
        before every erasure, as a file whose time is not known does."""
        if self.settings.reads_kafka:
            return lambda runs: kafka_kept_out(self.spark, self.settings, runs,
                                               self.kafka_earliest)
        if landed is None:
            return self._all_kept_out
        return lambda runs: files_kept_out(runs, landed)

    @staticmethod
    def _all_kept_out(runs: Sequence[ErasureRun]) -> list[KeptOut]:
        """Every erased user's records kept out of a batch whose files are not known."""
        if runs:
            log.warning("the checkpoint does not name this batch's files (an entry of its "
                        "logs is missing): the records of every user ever erased are kept "
                        "out of it, as their files may have landed before the erasure")
        return [KeptOut(F.lit(True), run.hashes) for run in runs]

    def _refuse(self, batch_id: int) -> NoReturn:
        """End batch ``batch_id`` before it reads or writes anything: the run was asked to
        stop.

        Batches that follow each other without a pause (available-now, or longer than the
        interval) leave the run no moment between two to stop the query in, and the next
        one's handler starts before Spark reports the last one's progress. The batch was
        planned, not committed, and runs on restart, as after a crash.
        """
        self.monitor.stop_requested = True
        self.not_begun.append(batch_id)
        self.quiet_on_stop.enter_context(
            quiet_task_failures(self.spark, also=(QUERY_FAILURE_LOGGER,)))
        raise StopBeforeBatch(f"batch {batch_id} not begun: the run was asked to stop")


class _Supervision:
    """The run's own thread while its query runs. Once a second it looks at the query:
    for the planning and running watches' alerts (a Kafka topic gone ends the run), to
    start it again after Kafka's time-outs or to forget archived files, and, once a stop
    is requested, to stop it at a quiet moment between triggers."""

    def __init__(self, spark: SparkSession, settings: Settings, topic: KafkaTopic | None,
                 writer: DataStreamWriter, handler: _BatchHandler) -> None:
        self.spark, self.settings, self.writer, self.handler = spark, settings, writer, handler
        self.monitor, self.in_flight, self.stop = handler.monitor, handler.in_flight, \
            handler.stop
        self.planning = PlanningWatch(settings, diagnose=kafka_topic_gone(
            spark, settings, topic) if topic is not None else None)
        self.running = RunningBatchWatch(settings, activity=lambda: spark_activity(
            spark.sparkContext.statusTracker()))
        self.rereads: tuple[BatchRereads, ...] = (KafkaRereads(settings),
                                                  LostExecutorRereads(settings))
        # A run that starts its query again after Kafka's time-outs says so in one line
        # each time; Spark's stack traces of the same failure (some 300 lines) would bury
        # it. A failure that stops the run still shows its tasks' stack trace in the error
        # the run raises.
        self.quiet: contextlib.AbstractContextManager[object] = quiet_task_failures(
            spark, also=(QUERY_FAILURE_LOGGER,)) if rereads_kafka_timeouts(settings) \
            else contextlib.nullcontext()
        # Where a continuous run on files looks for an archive's request to forget files
        # (answered by a new query: see _restarted_forgetting).
        self.requests_in = None if settings.reads_kafka or \
            settings.trigger == "available-now" else local_path(settings.checkpoint)
        self.query: StreamingQuery | None = None
        self.ended: StreamingQueryException | None = None  # raised by awaitTermination
        self.give_up_waiting: float | None = None  # when a stop stops waiting to be quiet
        self.forced = False  # the stop gave up waiting for a quiet moment
        self.cancelled: int | None = None  # the batch a second signal cancelled

    def to_its_end(self) -> BaseException | None:
        """Start the query and watch it until it ends; the error it ended on, if any."""
        query = self.query = self.writer.start()
        handler = self.handler
        with _stop_on_signals(self.stop, handler.stop_now, handler.in_flight), self.quiet, \
                handler.quiet_on_stop:
            while True:
                if not query.isActive:
                    error, self.ended = self.ended or query.exception(), None
                    if self._starts_again_after(error):
                        query = self.query = _started_again(self.writer, self.monitor)
                        continue
                    return self._left_for_the_restart(error)
                now, status = time.monotonic(), query.status  # one py4j call a second
                self._look(query, status, now)
                if self._quiet_for_the_stop(status, now):
                    self.monitor.stop_requested = True
                    query.stop()
                    return self.ended or query.exception()
                if self._asked_to_forget(status):
                    query = self.query = _restarted_forgetting(query, self.writer,
                                                               self.monitor, self.settings)
                    if self.requests_in is not None and forget_requested(self.requests_in):
                        self.requests_in = None  # the trim failed: not again
                    continue
                try:
                    query.awaitTermination(1)
                except StreamingQueryException as failed:
                    self.ended = failed

    def _starts_again_after(self, error: BaseException | None) -> bool:
        """Whether the query, ended on ``error``, is to start again (after Kafka's time-out,
        :class:`KafkaRereads`) or a lost executor (:class:`LostExecutorRereads`), having
        waited as long as it asks, with no stop requested."""
        if error is None or self.monitor.stop_requested or self.stop.is_set():
            return False
        for rereads in self.rereads:
            wait_s = rereads.wait_before_next(error, len(self.handler.summary.batches))
            if wait_s is not None:
                return not self.stop.wait(wait_s)
        return False

    def _left_for_the_restart(self, error: BaseException | None) -> BaseException | None:
        """``error``, unless a stop came while the run waited to read again a batch that
        failed (:class:`BatchRereads`): that batch runs again on restart."""
        if error is None or not self.stop.is_set():
            return error
        for rereads in self.rereads:
            if (why := rereads.reason(str(error))) is not None:
                log.warning(rereads.stopped, why)
                return None
        return error

    def _look(self, query: StreamingQuery, status: Mapping[str, Any], now: float) -> None:
        """Feed the watches; end the run when the source is gone."""
        self.planning.look(status, self.in_flight.is_set(), now)
        batch, phase = self.in_flight.seen()
        self.running.look(batch, now, phase)
        if self.planning.gone is not None:
            self.monitor.stop_requested = True
            query.stop()
            raise SourceGone(f"the stream stopped: {self.planning.gone}")

    def _quiet_for_the_stop(self, status: Mapping[str, Any], now: float) -> bool:
        """Whether a requested stop may stop the query now: no batch of the run's own in
        flight, and no trigger active or none worth waiting for any longer."""
        if not self.stop.is_set():
            return False
        if self.handler.stop_now.is_set():
            self._cancel_the_batch_in_flight()
            return True
        if self.give_up_waiting is None:
            # A trigger stuck on its source will not reach a quiet moment.
            self.give_up_waiting = now + (0.0 if self.planning.stuck(now)
                                          else quiet_moment_wait(self.settings))
        if self.in_flight.is_set():
            return False
        self.forced = time.monotonic() > self.give_up_waiting
        return self.forced or _between_triggers(status)

    def _cancel_the_batch_in_flight(self) -> None:
        """Cancel the Spark jobs of the batch in flight, if any, so that a batch stuck in
        Spark (waiting for executors, say) ends: it commits nothing more and, as after a
        crash, runs again on restart. Spark's reports of the cancelled tasks are not
        logged: the run says what happened in one line."""
        self.forced = True
        self.monitor.stop_requested = True
        batch, _ = self.in_flight.seen()
        if batch is None:
            return
        self.cancelled = batch
        self.handler.quiet_on_stop.enter_context(
            quiet_task_failures(self.spark, also=(QUERY_FAILURE_LOGGER,)))
        self.spark.sparkContext.cancelAllJobs()

    def _asked_to_forget(self, status: Mapping[str, Any]) -> bool:
        """Whether an archive asked a continuous run on files to forget the files it moved,
        and the query is between triggers with no stop requested."""
        return (self.requests_in is not None and not self.stop.is_set()
                and not self.in_flight.is_set() and forget_requested(self.requests_in)
                and _between_triggers(status))


def _end_of_run(error: BaseException | None, not_begun: list[int], stop_requested: bool,
                forced: bool, cancelled: int | None = None) -> None:
    """Say which batch a stop left for the restart, or raise the ``error`` that ended the
    query when the run did not stop it."""
    if cancelled is not None:
        log.warning("stopped at once, as a second signal asked: batch %s was cancelled "
                    "before its commit and runs again on restart", cancelled)
    elif not_begun:
        log.warning("stopped before batch %s began (it was planned: it runs on restart)",
                    not_begun[0])
    elif error is not None and stop_requested:
        # A trigger can begin between the check for a quiet moment and the stop (or the
        # wait gave up): the stop interrupts it before its commit, so it runs again on
        # restart, as after a crash. Not an error of the run.
        log.warning("stopped while a trigger %s its batch (%s): that batch was not "
                    "committed and runs again on restart",
                    "planned" if forced else "started", str(error).splitlines()[0])
    elif error is not None:
        raise error


class BatchCancelled(Exception):
    """The batch in flight was cancelled by a second signal: it runs again on restart."""


class StopBeforeBatch(Exception):
    """Raised in a batch's handler, before it does anything, when the run was asked to
    stop: it ends the query there (see :meth:`_BatchHandler._refuse`)."""


class _BatchInFlight:
    """Which batch the stream's ``foreachBatch`` handler is running, if any, and where it
    is: set on Spark's thread, read by the run's loop.

    The two are one value, replaced whole: read as two, the loop once saw a batch in flight
    with no phase (between the batch's start and its first phase), and told it so.
    """

    def __init__(self) -> None:
        self._now: tuple[int, str] | None = None

    def start(self, batch_id: int) -> None:
        """The handler began batch ``batch_id``: its first phase."""
        self._now = (batch_id, PHASES[0])

    def begin(self, phase: str) -> None:
        """The batch in flight got to ``phase`` (:func:`sessionlake.batch.process_lines`)."""
        if (now := self._now) is not None:
            self._now = (now[0], phase)

    def end(self) -> None:
        """The handler is done with its batch."""
        self._now = None

    def seen(self) -> tuple[int | None, str | None]:
        """The batch in flight and its phase, read together; ``(None, None)``: none."""
        now = self._now
        return (None, None) if now is None else now

    def is_set(self) -> bool:
        """Whether a batch of the stream's own is in flight."""
        return self._now is not None


def _started_again(writer: DataStreamWriter, monitor: BatchMonitor) -> StreamingQuery:
    """A new query of ``writer`` on its checkpoint, the previous one having ended."""
    monitor.wait_terminated()
    monitor.query_restarted()
    return writer.start()


def _restarted_forgetting(query: StreamingQuery, writer: DataStreamWriter,
                          monitor: BatchMonitor, settings: Settings) -> StreamingQuery:
    """``query`` stopped between two triggers and started anew on its checkpoint, the files
    ``sessionlake archive`` moved meanwhile forgotten in between
    (:func:`forget_files_archived_meanwhile`), as a run's start does.

    A running file source holds every file it ever read in memory and writes them all into
    every tenth entry of its log; only a new query reads the trimmed log. A trigger that
    began just before the stop is interrupted and its batch runs again in the new query,
    as after a crash (every table write is idempotent per batch id).
    """
    monitor.stop_requested = True
    query.stop()
    monitor.wait_terminated()
    error = query.exception()
    if error is not None:
        log.warning("a trigger began as the stream stopped to forget archived files (%s): "
                    "its batch runs again", str(error).splitlines()[0])
    forget_files_archived_meanwhile(settings)
    monitor.query_restarted()
    return writer.start()


#: py4j reports, with a traceback, an error of the Python side of a batch.
_PY4J_LOG = logging.getLogger("py4j.clientserver")


class _QuietAfterStop(logging.Filter):
    """Drop py4j's report of a batch that a requested stop interrupted as it began, or
    that failed on Kafka brokers that did not answer or on a lost executor.

    That batch was not committed and runs again (on restart, or in a continuous run's next
    query: :class:`BatchRereads`); the run says so in one line. Before a stop is requested
    every other report passes.
    """

    def __init__(self, monitor: BatchMonitor) -> None:
        super().__init__()
        self._monitor = monitor

    def filter(self, record: logging.LogRecord) -> bool:
        if self._monitor.stop_requested:
            return False
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return True
        settings, text = self._monitor.settings, str(error)
        kafka = settings.reads_kafka and kafka_timeout(text) is not None
        return not kafka and rereads_lost_executor(settings, text) is None


def quiet_moment_wait(settings: Settings) -> float:
    """How long a requested stop waits for a quiet moment between triggers, in seconds.

    When batches take longer than the trigger interval, triggers follow each other without
    a gap; the run then stops as soon as no batch of its own is in flight. That is safe: a
    batch whose offsets were planned but not committed is replayed on restart, and every
    table write is idempotent per batch id.
    """
    return max(30.0, 3 * settings.processing_interval.total_seconds())


def _between_triggers(status: Mapping[str, Any]) -> bool:
    """Whether the query's ``status`` (``StreamingQuery.status``) says it waits for its next
    trigger, so that stopping it interrupts nothing.

    Stopping it while a trigger plans a batch would interrupt that batch as it starts (it
    is replayed later, but the run ends on an error instead of cleanly).
    """
    return not status.get("isTriggerActive", False)


#: A signal that comes this long after the first or later stops the run at once. Sooner,
#: it is the same request again: a supervisor that signals the run and its process group.
SECOND_SIGNAL_AFTER_S = 2.0


@contextmanager
def _stop_on_signals(stop: threading.Event, stop_now: threading.Event,
                     in_flight: _BatchInFlight) -> Iterator[None]:
    """Turn SIGTERM and SIGINT into a graceful-stop request while the query runs, and a
    second one (:data:`SECOND_SIGNAL_AFTER_S` later or more) into a request to stop now.
    The first is answered with what the stop waits for: the batch ``in_flight``, if any."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    first: list[float] = []

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        if not first:
            first.append(time.monotonic())
            batch, _ = in_flight.seen()
            if batch is None:
                log.warning("signal %s received: stopping (no batch in flight)", signum)
            else:
                log.warning("signal %s received: stopping after batch %s, in flight (a "
                            "second signal cancels it, and it runs again on restart)",
                            signum, batch)
            stop.set()
        elif time.monotonic() - first[0] >= SECOND_SIGNAL_AFTER_S and not stop_now.is_set():
            log.warning("signal %s received again: stopping now", signum)
            stop_now.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

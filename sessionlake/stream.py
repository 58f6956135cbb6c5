"""The streaming job: files in the landing folder, or a Kafka topic, to micro-batches.

Spark's file source tracks which files were processed, and Spark's Kafka source which
offsets of which partitions (both in the checkpoint); each micro-batch is turned into lines
and handed whole to :func:`sessionlake.batch.process_lines` through ``foreachBatch``. No
Spark stateful operator is used, so the checkpoint holds only source offsets:
``--shuffle-partitions`` and ``--master`` may change between runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

from sessionlake import faults, storage
from sessionlake.batch import (
    PHASES,
    BatchReport,
    Clock,
    StreamIdentity,
    process_lines,
    stream_identity,
    utc_now,
)
from sessionlake.checkpoint import (
    GAP_NOTE,
    IDENTITY_FILE,
    KAFKA_LOG_MARK,
    KAFKA_SOURCE_LOG_START,
    LAKE_HOLDER_FILE,
    LAKE_LOCK_FILE,
    LANDING_NOTE,
    LOCK_FILE,
    LOCK_PATIENCE_S,
    PID_FILE,
    RESTORING_MARKER,
    SOURCE_LOG,
    SOURCE_LOG_ENTRY,
    SPARK_CHECKPOINT,
    SPARK_OFFSETS_LOG,
    STREAMS_DIR,
    batch_file_count,
    changed_since_read,
    first_logged_file,
    forget_archived_files,
    forget_requested,
    hidden_from_spark,
    kafka_offsets,
    kafka_topics_logged,
    lake_lock_folder,
    landing_subfolders_read,
    lock_held,
    note_input_format,
    noted_gap_s,
    noted_input_format,
    partition_folder,
)
from sessionlake.config import ENV, ConfigError, Settings, format_duration
from sessionlake.kafkaadmin import (
    KafkaTopic,
    KafkaTopicMissing,
    KafkaUnavailable,
    describe_topic,
    kafka_timeout,
)
from sessionlake.monitor import (
    BatchMonitor,
    KafkaRereads,
    PlanningWatch,
    RunningBatchWatch,
    rereads_after,
    rereads_kafka_timeouts,
    spark_activity,
)
from sessionlake.sources import KAFKA_SCHEME, file_lines, kafka_lines, number_lines
from sessionlake.spark import QUERY_FAILURE_LOGGER, fit_to_stream, quiet_task_failures
from sessionlake.storage import is_glob, local_path
from sessionlake.tables import ensure_tables, upgrade_table_properties

log = logging.getLogger("sessionlake.stream")



class StreamAlreadyRunning(RuntimeError):
    """Another process runs a stream on the same checkpoint, or on the same lake."""


class RestoreUnfinished(RuntimeError):
    """A restore of the checkpoint was cut off half-way: the run would mix two states."""


class SourceGone(RuntimeError):
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


class BatchUnfinishedElsewhere(RuntimeError):
    """A stream on another checkpoint of the lake was cut off in the middle of a batch."""


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


def check_gap_unchanged(spark: SparkSession, settings: Settings) -> None:
    """Refuse a run whose ``--gap`` is not the one the lake's stream has cut its sessions
    with; note it at the lake's first run.

    Open sessions cut with one gap and extended with another are neither: the lake would
    no longer match a batch sessionization of its events with any gap. A gap changed by
    mistake (``--gap 30``, which is 30 seconds; a DAG's environment other than the
    command line's) is refused before any batch. Sessions with another gap are a backfill
    of a date range (``sessionlake backfill --gap``) or a new lake.
    """
    noted = noted_gap_s(spark, settings.lake)
    gap_s = settings.gap.total_seconds()
    if noted is None:
        storage.write_text(spark, f"{lake_lock_folder(settings.lake)}/{GAP_NOTE}",
                           json.dumps({"gap_s": gap_s}))
        return
    if noted != gap_s:
        lake_gap = format_duration(timedelta(seconds=noted))
        raise ConfigError(
            f"the stream of lake {settings.lake} cuts its sessions with --gap {lake_gap}; "
            f"--gap {format_duration(settings.gap)} would cut the rest with another. Pass "
            f"--gap {lake_gap} (a number without a unit is seconds); for sessions with "
            "another gap, `sessionlake backfill --gap` re-cuts a date range, or start a new "
            "lake"
        )


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
            "(--checkpoint) and landing folder"
        )
    return False


def checkpoint_key(checkpoint: str) -> str:
    """One spelling of a checkpoint's folder: a local one absolute and resolved."""
    local = local_path(checkpoint)
    return str(local.resolve()) if local is not None else checkpoint.rstrip("/")


def _streams_folder(lake: str) -> str:
    return f"{lake_lock_folder(lake)}/{STREAMS_DIR}"


def register_stream(spark: SparkSession, lake: str, checkpoint: str,
                    source: str | None = None, kafka_cluster: str | None = None,
                    kafka_topic_id: str | None = None) -> None:
    """Note ``checkpoint`` among the lake's streams, once, with the ``source`` it reads
    (:func:`source_key`) and, for Kafka, the ids of the brokers' cluster and of the topic,
    so that maintenance and the lake's other streams find its unfinished batches
    (:func:`lake_streams`), a new checkpoint on its source is told, and so is a topic
    that is no longer the one the checkpoint read (:func:`check_kafka_topic_unchanged`).

    A checkpoint inside the lake (the default) is noted relative to it, so that a copy of
    the lake names its own copy of the checkpoint, not the original's. A note written
    before sources (or clusters) were noted gets them at the stream's next run.
    """
    key, inside = checkpoint_key(checkpoint), f"{checkpoint_key(lake)}/"
    noted = key[len(inside):] if key.startswith(inside) else key
    name = hashlib.sha256(noted.encode()).hexdigest()[:16]
    uri = f"{_streams_folder(lake)}/{name}.json"
    text = storage.read_text(spark, uri)
    before = {} if text is None else json.loads(text)
    entry = {"checkpoint": noted, "source": before.get("source") or source}
    for key, value in (("kafka_cluster", kafka_cluster), ("kafka_topic_id", kafka_topic_id)):
        if value or before.get(key):
            entry[key] = before.get(key) or value
    if entry != before:
        storage.write_text(spark, uri, json.dumps(entry))


def lake_stream_entries(spark: SparkSession | None, lake: str) -> dict[str, dict[str, Any]]:
    """The checkpoints that ever ran a stream on ``lake``, as :func:`checkpoint_key` spells
    them, each with what :func:`register_stream` noted of it."""
    folder, lake_key = _streams_folder(lake), checkpoint_key(lake)
    found = {}
    for name in storage.list_names(spark, folder):
        text = storage.read_text(spark, f"{folder}/{name}") if name.endswith(".json") else None
        if text is not None:
            entry = json.loads(text)
            noted = str(entry["checkpoint"])
            absolute = noted.startswith("/") or "://" in noted
            found[noted if absolute else f"{lake_key}/{noted}"] = entry
    return found


def lake_stream_sources(spark: SparkSession | None, lake: str) -> dict[str, str | None]:
    """The checkpoints that ever ran a stream on ``lake``, as :func:`checkpoint_key` spells
    them, each with the source it noted (``None``: noted before sources were)."""
    return {checkpoint: entry.get("source")
            for checkpoint, entry in lake_stream_entries(spark, lake).items()}


def lake_streams(spark: SparkSession | None, lake: str) -> list[str]:
    """The checkpoints that ever ran a stream on ``lake`` (:func:`register_stream`), as
    :func:`checkpoint_key` spells them."""
    return sorted(lake_stream_sources(spark, lake))


def source_key(settings: Settings) -> str:
    """The stream's source in one spelling: ``kafka://<brokers>/<topic>``
    (:func:`kafka_source_key`), or the landing folder as given."""
    if settings.reads_kafka:
        return kafka_source_key(settings.kafka_bootstrap or "", settings.kafka_topic or "")
    return (settings.source or "").rstrip("/")


def kafka_source_key(bootstrap: str, topic: str) -> str:
    """``kafka://<brokers>/<topic>``, the brokers sorted and their host names in lower case
    (host names are not case-sensitive; topic names are)."""
    brokers = ",".join(sorted(b.strip().lower() for b in bootstrap.split(",")))
    return f"{KAFKA_SCHEME}{brokers}/{topic}"


def same_kafka_topic(noted: Mapping[str, Any], source: str, kafka_cluster: str | None,
                     topic_id: str | None = None) -> bool:
    """Whether a stream's note (:func:`register_stream`) names the topic ``source``
    (:func:`kafka_source_key`) of the cluster ``kafka_cluster``: by the cluster's id where
    both know it, whatever brokers they were given; else by the brokers' spelling. A topic
    deleted and created anew under the name (another ``topic_id``) is not the same."""
    their = noted.get("source")
    if not isinstance(their, str) or not their.startswith(KAFKA_SCHEME):
        return False
    their_brokers, _, their_topic = their[len(KAFKA_SCHEME):].partition("/")
    topic = source[len(KAFKA_SCHEME):].partition("/")[2]
    if their_topic != topic:
        return False
    if topic_id and noted.get("kafka_topic_id") and noted["kafka_topic_id"] != topic_id:
        return False
    if kafka_cluster and noted.get("kafka_cluster"):
        return bool(noted["kafka_cluster"] == kafka_cluster)
    return kafka_source_key(their_brokers, topic) == source


def unfinished_batch_since(spark: SparkSession | None, checkpoint: str) -> datetime | None:
    """When the oldest batch of the checkpoint's stream that is not marked done started
    (in flight, or cut off by a crash): it will read the table versions it recorded.
    ``None`` when every batch finished, or the checkpoint is gone."""
    text = storage.read_text(spark, f"{checkpoint.rstrip('/')}/{IDENTITY_FILE}")
    if text is None:
        return None
    identity = json.loads(text)
    prefix = f"{identity['stream_id']}-{identity['epoch']}-"
    ledger = f"{checkpoint.rstrip('/')}/ledger"
    batches = sorted(
        (int(n[len(prefix):-5]) for n in storage.list_names(spark, ledger)
         if n.startswith(prefix) and n.endswith(".json") and n[len(prefix):-5].isdigit()),
        reverse=True,
    )
    oldest: datetime | None = None
    for batch in batches[:3]:  # only the newest batches can be unfinished
        entry = json.loads(storage.read_text(spark, f"{ledger}/{prefix}{batch}.json") or "{}")
        if entry and not entry.get("done"):
            oldest = datetime.fromisoformat(entry["processing_time"])
    return oldest


def lake_in_use(lake: str) -> bool:
    """Whether a run holds the local lake's stream lock, whatever its checkpoint (remote
    lakes: ``False``)."""
    folder = local_path(lake_lock_folder(lake))
    return folder is not None and lock_held(folder, LAKE_LOCK_FILE)


@dataclass
class RunSummary:
    """What one ``sessionlake run`` did."""

    batches: list[BatchReport] = field(default_factory=list)

    @property
    def processed(self) -> list[dict[str, Any]]:
        """Metrics rows of the batches this run processed (replays already done excluded)."""
        return [b.row for b in self.batches if not b.skipped]


def check_source(settings: Settings) -> str:
    """The source folder, or ``kafka`` with its brokers and topic, checked before anything
    is read or written (without reaching the brokers: see :func:`check_kafka_topic`)."""
    if not settings.source:
        raise ConfigError("no source folder: pass --source DIR (or --source kafka) "
                          "or set SESSIONLAKE_SOURCE")
    if settings.reads_kafka:
        return _check_kafka_settings(settings)
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


class SourceLogUnreadable(ConfigError):
    """An entry of the checkpoint's file source log is not what Spark writes."""

    def __init__(self, entry: str, error: Exception) -> None:
        super().__init__(
            f"the checkpoint's file source log entry {entry} cannot be read ({error!r}): "
            "restore a snapshot (`sessionlake restore --snapshot ID`), which brings the "
            "checkpoint back as it was")
        self.entry = entry


def recorded_source_file(spark: SparkSession | None, checkpoint: str) -> str | None:
    """The path of a file the stream's checkpoint says Spark's file source read, if any.

    Spark keeps each file it read by its absolute path in ``<checkpoint>/spark/sources/0``
    (a version line, then one JSON object per file). The newest batch's own entry is read
    first: a compacted entry (``N.compact``) lists every file the stream ever read.

    :raises SourceLogUnreadable: naming the entry, and the way back (Spark would fail on
        it too, after the run had started).
    """
    folder = f"{checkpoint.rstrip('/')}/{SOURCE_LOG}"
    entries = [(bool(m.group(2)), -int(m.group(1)), name)
               for name in storage.list_names(spark, folder)
               if (m := SOURCE_LOG_ENTRY.match(name))]
    for _, _, name in sorted(entries):
        text = storage.read_text(spark, f"{folder}/{name}") or ""
        if text.startswith(KAFKA_SOURCE_LOG_START):
            return None  # a Kafka stream's: it read no file
        try:
            path = first_logged_file(text)
        except (ValueError, KeyError, TypeError) as error:
            raise SourceLogUnreadable(f"{folder}/{name}", error) from None
        if path is not None:
            return path
    return None


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
    """Say which landing files changed after the stream read them: what was added to them
    since is not read (:func:`sessionlake.checkpoint.changed_since_read`)."""
    folder = local_path(checkpoint)
    try:
        changed = changed_since_read(folder / SPARK_CHECKPOINT) if folder is not None else []
    except (OSError, ValueError, KeyError, TypeError):
        return  # a source log Spark would not read either: its own error says so
    if changed:
        log.warning("landing files changed after the stream read them, so what was added to "
                    "them since is not read: %s%s. A file must be whole when it lands: write it "
                    "elsewhere (or under a name starting with . or _) and move it in",
                    ", ".join(str(p) for p in changed[:5]),
                    f" and {len(changed) - 5} more" if len(changed) > 5 else "")


def kafka_topics_read(spark: SparkSession | None, checkpoint: str) -> list[str] | None:
    """The topics of the checkpoint's Kafka source; ``None`` when it has no Kafka source
    log (a folder's stream, or nothing read yet)."""
    text = storage.read_text(spark, f"{checkpoint.rstrip('/')}/{SOURCE_LOG}/0")
    try:
        return None if text is None else kafka_topics_logged(text)
    except ValueError:
        return []  # a Kafka entry cut short: the doctor names it


def check_checkpoint_reads_kafka(spark: SparkSession, settings: Settings) -> None:
    """Refuse Kafka on a checkpoint whose stream read a folder: Spark would fail the run's
    first batch on the folder's offsets, with a stack trace.

    :raises ConfigError: naming the folder the checkpoint read.
    """
    recorded = recorded_source_file(spark, checkpoint_key(settings.checkpoint))
    if recorded is not None:
        folder = os.path.dirname(recorded)
        raise ConfigError(
            f"the stream's checkpoint {settings.checkpoint} read files from {folder}, not a "
            f"Kafka topic: run it with --source {folder}, or give the stream of topic "
            f"{settings.kafka_topic} a checkpoint of its own (--checkpoint DIR)")


def check_kafka_topic_unchanged(
    spark: SparkSession, settings: Settings, topic: KafkaTopic
) -> None:
    """Refuse a Kafka stream whose brokers now belong to another cluster than the one its
    checkpoint read, or whose topic was deleted and created anew since (the ids
    :func:`register_stream` noted).

    A checkpoint's offsets mean nothing on another cluster (a new one, or the development
    broker formatted anew) nor on a new topic of the same name: where it holds fewer
    records Spark stops on the offsets gone backwards, and where it holds more the records
    up to the old offsets would be skipped, silently.

    :raises ConfigError: naming both ids and what to run instead.
    """
    noted = lake_stream_entries(spark, settings.lake).get(checkpoint_key(settings.checkpoint), {})
    cluster, topic_id = noted.get("kafka_cluster"), noted.get("kafka_topic_id")
    if cluster and topic.cluster_id and cluster != topic.cluster_id:
        raise ConfigError(
            f"the stream's checkpoint {settings.checkpoint} read topic {settings.kafka_topic} "
            f"from Kafka cluster {cluster}, but the brokers at {settings.kafka_bootstrap} are "
            f"cluster {topic.cluster_id} (a new cluster, or one formatted anew): its offsets "
            "would skip records there or start mid-topic. Read this cluster's topic on a "
            "checkpoint of its own (--checkpoint DIR), or point --kafka-bootstrap at the "
            "cluster the stream read")
    if topic_id and topic.topic_id and topic_id != topic.topic_id:
        raise ConfigError(
            f"topic {settings.kafka_topic} on {settings.kafka_bootstrap} was deleted and "
            f"created anew since the stream's checkpoint {settings.checkpoint} read it (topic "
            f"id {topic_id}, now {topic.topic_id}): its offsets would skip the new topic's "
            "first records. Read the new topic on a checkpoint of its own (--checkpoint DIR)")


def kafka_resume_offsets(spark: SparkSession | None, checkpoint: str) -> dict[int, int] | None:
    """Where the checkpoint's Kafka stream reads on from, by partition: the end of its last
    committed batch (a batch planned after it is read again from there), else the offsets
    it began at. ``None`` when it has not read the topic yet."""
    spark_checkpoint = f"{checkpoint.rstrip('/')}/{SPARK_CHECKPOINT}"
    committed = max((int(n) for n in storage.list_names(spark, f"{spark_checkpoint}/commits")
                     if n.isdigit()), default=-1)
    line: str | None = None
    if committed >= 0:
        text = storage.read_text(spark, f"{spark_checkpoint}/{SPARK_OFFSETS_LOG}/{committed}")
        line = text.splitlines()[2] if text else None
    else:
        text = storage.read_text(spark, f"{checkpoint.rstrip('/')}/{SOURCE_LOG}/0")
        if text and text.startswith(KAFKA_SOURCE_LOG_START):
            line = text.removeprefix(KAFKA_LOG_MARK).splitlines()[1]
    if line is None:
        return None
    by_topic = kafka_offsets(line)
    return next(iter(by_topic.values()), {})


def kafka_records_lost(
    resume: Mapping[int, int], earliest: Mapping[int, int]
) -> dict[int, tuple[int, int]]:
    """The offsets ``[first, end)`` of each partition's records deleted before the stream
    read them: from where it reads on (``resume``; a partition added since from 0) to the
    first offset the topic still holds (``earliest``)."""
    return {partition: (resume.get(partition, 0), first)
            for partition, first in sorted(earliest.items())
            if first > resume.get(partition, 0)}


def check_no_kafka_records_lost(
    spark: SparkSession, settings: Settings, topic: KafkaTopic
) -> None:
    """Refuse a Kafka stream whose next records were deleted before it read them (Kafka's
    retention outran a stream stopped too long), unless ``--accept-kafka-data-loss``: then
    they are skipped, with a warning naming them.

    Spark would find the gap only while reading the batch, stop with a long stack trace
    after planning it, and stop again at every later run.

    :raises ConfigError: naming the records lost and the flag that skips them.
    """
    resume = kafka_resume_offsets(spark, checkpoint_key(settings.checkpoint))
    lost = kafka_records_lost(resume or {}, topic.earliest) if resume is not None else {}
    if not lost:
        return
    count = sum(end - first for first, end in lost.values())
    ranges = ", ".join(f"partition {p} offsets {first}-{end - 1}"
                       for p, (first, end) in lost.items())
    what = (f"{count} record{'s' * (count != 1)} of topic {settings.kafka_topic} were "
            f"deleted from Kafka before the stream read them ({ranges})")
    if settings.kafka_accept_data_loss:
        log.warning("%s: skipped, as --accept-kafka-data-loss says; their events are not in "
                    "the lake", what)
        return
    raise ConfigError(
        f"{what}, by the topic's retention or by hand, and cannot be read any more. Run "
        "once with --accept-kafka-data-loss to skip them and go on (their events will not "
        "be in the lake); a longer retention on the topic avoids it")


def check_topic_not_read_elsewhere(
    spark: SparkSession, settings: Settings, topic: KafkaTopic
) -> None:
    """Refuse a new checkpoint on a Kafka topic that a stream of the lake on another
    checkpoint has read from the same cluster (:func:`same_kafka_topic`), however its
    brokers were spelled.

    The offsets a stream has read live in its checkpoint only, so the new stream would
    start again from ``--starting-offsets``: the topic's retained records read a second
    time (their events late or duplicates), or, from ``latest``, the records since the
    other stream's last batch never read.

    :raises ConfigError: naming the checkpoint that read the topic.
    """
    ours, source = checkpoint_key(settings.checkpoint), source_key(settings)
    if storage.list_names(spark, f"{ours}/{SPARK_CHECKPOINT}/offsets"):
        return  # a stream that has read is not new
    for checkpoint, noted in lake_stream_entries(spark, settings.lake).items():
        if checkpoint != ours and \
                same_kafka_topic(noted, source, topic.cluster_id, topic.topic_id) and \
                storage.list_names(spark, f"{checkpoint}/{SPARK_CHECKPOINT}/offsets"):
            raise ConfigError(
                f"topic {settings.kafka_topic} on {settings.kafka_bootstrap} was read by the "
                f"lake's stream on checkpoint {checkpoint} (brokers {noted['source']}); a "
                f"stream on the new checkpoint "
                f"{settings.checkpoint} would start again from --starting-offsets "
                f"{settings.kafka_starting_offsets}. Run with --checkpoint {checkpoint}"
            )


def _check_kafka_settings(settings: Settings) -> str:
    """The Kafka flags of ``--source kafka``: both brokers and topic, no folder-only flag."""
    if not settings.kafka_bootstrap:
        raise ConfigError("--source kafka needs the brokers: pass --kafka-bootstrap "
                          f"HOST:PORT or set {ENV['kafka_bootstrap']}")
    if not settings.kafka_topic:
        raise ConfigError("--source kafka needs a topic: pass --topic NAME or set "
                          f"{ENV['kafka_topic']}")
    if settings.max_files_per_trigger:
        raise ConfigError("--max-files-per-trigger is for a folder; with --source kafka "
                          "use --max-offsets-per-trigger")
    return settings.source or ""


def check_kafka_topic(spark: SparkSession, settings: Settings) -> KafkaTopic:
    """Check that the brokers answer and the topic exists, before the stream starts.

    Without this, Spark's Kafka source waits for an unreachable broker or an absent topic
    without saying so.

    :return: the topic's partition count and its cluster's id (:func:`same_kafka_topic`);
        when the brokers do not tell the id, their spelling stands for it, with a warning.
    :raises ConfigError: naming the brokers or the topic, and what to check.
    """
    assert settings.kafka_bootstrap and settings.kafka_topic
    try:
        topic = describe_topic(spark, settings.kafka_bootstrap, settings.kafka_topic,
                               properties=settings.kafka_client_properties())
    except KafkaUnavailable as error:
        raise ConfigError(str(error)) from None
    if topic.cluster_id is None:
        log.warning("the Kafka brokers at %s did not tell their cluster's id: a new checkpoint "
                    "on a topic another checkpoint read is told only when its brokers are "
                    "spelled the same", settings.kafka_bootstrap)
    return topic


@contextmanager
def checkpoint_lock(checkpoint: str) -> Iterator[None]:
    """Hold the checkpoint's lock for one stream at a time, with our pid beside it.

    Two streams on one checkpoint would each commit the same batch ids; the second is
    refused with a message instead. (Local checkpoints only: on object stores the
    orchestrator, which runs one micro-batch DAG run at a time, is the guard.)
    """
    folder = local_path(checkpoint)
    new = folder is not None and not folder.exists()
    try:
        with _held_alone(folder, LOCK_FILE, PID_FILE, str(os.getpid()), lambda pid: (
                f"another sessionlake run (pid {pid}) is using checkpoint {checkpoint}: "
                "wait for it to finish, or stop it first")):
            yield
    finally:
        if new and folder is not None:
            _remove_if_only_lock(folder)


def _remove_if_only_lock(folder: Path) -> None:
    """Remove a new checkpoint folder that holds nothing but its lock (a run refused before
    it wrote anything), so that no empty checkpoint is left behind; kept if anything else
    is in it, or another run holds it."""
    if [p.name for p in folder.iterdir()] != [LOCK_FILE] or lock_held(folder):
        return
    (folder / LOCK_FILE).unlink(missing_ok=True)
    folder.rmdir()


@contextmanager
def lake_lock(lake: str, checkpoint: str) -> Iterator[None]:
    """Hold the lake's stream lock for one stream at a time, whatever its checkpoint.

    Two streams on one lake, on two checkpoints, would each MERGE the open sessions they
    read before the other's commit, and judge lateness each by its own watermark; the
    second is refused, naming the first's checkpoint. (Local lakes only, as above.) The
    holder file names a local checkpoint by its absolute path, so that the health page,
    in another process and folder, sizes the stream's input on it.
    """
    folder = local_path(lake_lock_folder(lake))
    holder = json.dumps({"pid": os.getpid(), "checkpoint": checkpoint_key(checkpoint)})

    def refusal(text: str) -> str:
        try:
            other = json.loads(text)
        except ValueError:
            other = {}
        return (f"another sessionlake run (pid {other.get('pid', '?')}) is writing lake {lake}"
                f" from checkpoint {other.get('checkpoint', '?')}: one stream per lake;"
                " stop it first, or run on its checkpoint")

    with _held_alone(folder, LAKE_LOCK_FILE, LAKE_HOLDER_FILE, holder, refusal):
        yield


@contextmanager
def stream_locks(lake: str, checkpoint: str) -> Iterator[None]:
    """Hold both: the checkpoint's lock, then the lake's (see above): what a run holds,
    and what a restore or a rebuild of the state needs, which no stream may write beside."""
    with checkpoint_lock(checkpoint), lake_lock(lake, checkpoint):
        yield


@contextmanager
def _held_alone(folder: Path | None, lock_file: str, holder_file: str, holder: str,
                refusal: Callable[[str], str]) -> Iterator[None]:
    """Hold the ``flock`` of ``folder/lock_file`` with ``holder`` written beside it, or
    raise :class:`StreamAlreadyRunning` with ``refusal`` of the holder's text. The kernel
    lets go when the process dies, even by SIGKILL. ``folder`` ``None``: not local, no lock.
    """
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + LOCK_PATIENCE_S
    with open(folder / lock_file, "a+") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:  # perhaps a reader's probe: try again
                    time.sleep(0.05)
                    continue
                text = (folder / holder_file).read_text().strip() if (
                    folder / holder_file).exists() else "?"
                raise StreamAlreadyRunning(refusal(text)) from None
        (folder / holder_file).write_text(holder)
        try:
            yield
        finally:
            (folder / holder_file).unlink(missing_ok=True)
            fcntl.flock(lock, fcntl.LOCK_UN)


def checkpoint_in_use(checkpoint: str) -> bool:
    """Whether a run holds the checkpoint's lock (local checkpoints; remote: ``False``)."""
    folder = local_path(checkpoint)
    return folder is not None and lock_held(folder)


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
#: How many times a continuous run's Kafka source asks the brokers for the topic's offsets
#: before the stream fails: Java's largest int, so that it waits out an outage of any
#: length (about one attempt a minute, each Kafka's ``default.api.timeout.ms``), with an
#: ALERT every five minutes (:class:`sessionlake.monitor.PlanningWatch`) and SIGTERM
#: still stopping it. Spark's default is 3.
KAFKA_OUTAGE_ATTEMPTS = 2**31 - 1


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


def kafka_records(spark: SparkSession, settings: Settings) -> DataFrame:
    """The streaming DataFrame of the topic's records, every partition, new ones included.

    Offsets live in the checkpoint, so ``--starting-offsets`` only matters for a new one.
    Partitions added to the topic later are read from their first offset. Spark's
    ``failOnDataLoss`` stays on: records deleted (by retention) before they were read stop
    the stream instead of being skipped silently, unless ``--accept-kafka-data-loss``
    (:func:`check_no_kafka_records_lost`). The ``--kafka-properties`` settings go to Kafka's
    client as ``kafka.<key>``.

    A continuous run waits out brokers that stop answering (:data:`KAFKA_OUTAGE_ATTEMPTS`)
    and goes on where it was when they are back; an available-now run gives up after
    Spark's three attempts to ask them for offsets, so that a scheduled run fails in minutes.
    """
    client = {f"kafka.{key}": value for key, value in settings.kafka_client_properties().items()}
    reader = (
        spark.readStream.format("kafka")
        .options(**client)
        .option("kafka.bootstrap.servers", settings.kafka_bootstrap)
        .option("subscribe", settings.kafka_topic)
        .option("startingOffsets", settings.kafka_starting_offsets)
        .option("failOnDataLoss", str(not settings.kafka_accept_data_loss).lower())
    )
    if settings.trigger == "continuous":
        reader = reader.option("fetchOffset.numRetries", KAFKA_OUTAGE_ATTEMPTS)
    if settings.kafka_max_offsets_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", settings.kafka_max_offsets_per_trigger)
    return reader.load().select("topic", "partition", "offset", "value")


#: How long the look-up that tells a deleted topic from brokers away may wait, in seconds.
KAFKA_DIAGNOSIS_TIMEOUT_S = 5.0


def kafka_topic_gone(
    spark: SparkSession, settings: Settings, topic: KafkaTopic
) -> Callable[[], str | None]:
    """The :class:`~sessionlake.monitor.PlanningWatch` diagnosis of a Kafka stream whose
    trigger waits: why the topic ``topic`` (as the run found it at its start) is gone for
    good, or ``None`` while the brokers are only away (the run waits for them).

    A continuous run's source asks the brokers for a deleted topic again and again, and
    would wait for ever, its alerts blaming the brokers.
    """
    def diagnose() -> str | None:
        assert settings.kafka_bootstrap and settings.kafka_topic
        where = f"topic {settings.kafka_topic} on the Kafka brokers at {settings.kafka_bootstrap}"
        try:
            now = describe_topic(spark, settings.kafka_bootstrap, settings.kafka_topic,
                                 KAFKA_DIAGNOSIS_TIMEOUT_S, settings.kafka_client_properties())
        except KafkaTopicMissing:
            return (f"{where} was deleted while the stream read it: its records not read yet "
                    "are gone. A topic of that name created anew is read on a checkpoint of "
                    "its own (--checkpoint DIR)")
        except (KafkaUnavailable, ConfigError):
            return None
        if topic.topic_id and now.topic_id and now.topic_id != topic.topic_id:
            return (f"{where} was deleted and created anew while the stream read it (topic id "
                    f"{topic.topic_id}, now {now.topic_id}): read the new one on a checkpoint "
                    "of its own (--checkpoint DIR)")
        return None

    return diagnose


def check_and_register_stream(spark: SparkSession, settings: Settings,
                              topic: KafkaTopic | None) -> None:
    """Refuse, before the stream reads or writes anything, a run that would break what
    earlier runs left (a restore cut off, another checkpoint's batch cut off, a changed gap
    or input format, another source than the checkpoint's), tidy what the checkpoint read
    (files archived meanwhile), then note the stream in the lake."""
    check_no_restore_pending(spark, settings.checkpoint)
    check_no_batch_cut_off_elsewhere(spark, settings)
    check_gap_unchanged(spark, settings)
    format_unnoted = check_format_unchanged(spark, settings)
    if topic is not None:
        check_checkpoint_reads_kafka(spark, settings)
        check_kafka_topic_unchanged(spark, settings, topic)
        check_topic_not_read_elsewhere(spark, settings, topic)
        check_no_kafka_records_lost(spark, settings, topic)
    else:
        check_landing_folder(spark, settings)
        warn_of_files_changed_since_read(settings.checkpoint)
        forget_files_archived_meanwhile(settings)
    if format_unnoted:
        note_input_format(spark, settings.checkpoint, settings.input_format)
    register_stream(spark, settings.lake, settings.checkpoint, source_key(settings),
                    *((topic.cluster_id, topic.topic_id) if topic else ()))


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
    and is committed, then the query stops.

    :param clock: the batch clock (tests pass a fixed one).
    :param on_batch: called with every batch's report, after its commit.

    Unless the session's Spark configuration sets them, ``spark``'s adaptive execution is
    turned off (:func:`sessionlake.spark.fit_to_stream`) and its code generation settings
    are chosen per batch (:func:`sessionlake.spark.fit_codegen_to_batch`); both stay so
    after the run.
    """
    source = check_source(settings)
    topic = check_kafka_topic(spark, settings) if settings.reads_kafka else None
    summary = RunSummary()
    with stream_locks(settings.lake, settings.checkpoint):
        check_and_register_stream(spark, settings, topic)
        settings = prepare_lake(spark, settings)
        identity = stream_identity(spark, settings.checkpoint)
        stream, to_lines = input_lines(spark, settings, source)

        in_flight = _BatchInFlight()
        reports: dict[int, BatchReport] = {}
        stop = threading.Event()  # a graceful stop requested (SIGTERM, SIGINT)
        quiet_on_stop = contextlib.ExitStack()
        not_begun: list[int] = []  # the batch a stop kept from beginning, if any

        def handle(frame: DataFrame, batch_id: int) -> None:
            if stop.is_set():
                # Batches that follow each other without a pause (available-now, or longer
                # than the interval) leave the run no moment between two to stop the query
                # in, and the next one's handler starts before Spark reports the last one's
                # progress. So the next batch ends here, before it reads or writes anything:
                # it was planned, not committed, and runs on restart, as after a crash.
                monitor.stop_requested = True
                not_begun.append(batch_id)
                quiet_on_stop.enter_context(
                    quiet_task_failures(spark, also=(QUERY_FAILURE_LOGGER,)))
                raise StopBeforeBatch(f"batch {batch_id} not begun: the run was asked to stop")
            in_flight.start(batch_id)
            try:
                faults.set_batch(batch_id)
                report = process_lines(spark, to_lines(frame), batch_id, settings, identity,
                                       clock, in_flight.begin)
                if not settings.reads_kafka:
                    report = replace(report, input_files=batch_file_count(
                        spark, settings.checkpoint, batch_id))
                summary.batches.append(report)
                reports[batch_id] = report
                log.debug("batch %s: %s", batch_id, report.row)  # -v has its line
                if on_batch is not None:
                    on_batch(report)
            finally:
                in_flight.end()

        writer = stream_writer(stream, handle, settings, identity)
        monitor = BatchMonitor(settings, reports)
        # Where a continuous run on files looks for an archive's request to forget files
        # (answered by a new query: see _restarted_forgetting).
        requests_in = None if settings.reads_kafka or settings.trigger == "available-now" \
            else local_path(settings.checkpoint)
        spark.streams.addListener(monitor)
        quiet_after_stop = _QuietAfterStop(monitor)
        _PY4J_LOG.addFilter(quiet_after_stop)
        query: StreamingQuery | None = None
        try:
            query = writer.start()
            forced = False
            give_up_waiting: float | None = None
            planning = PlanningWatch(settings, diagnose=kafka_topic_gone(spark, settings, topic)
                                     if topic is not None else None)
            running = RunningBatchWatch(settings, activity=lambda: spark_activity(
                spark.sparkContext.statusTracker()))
            rereads = KafkaRereads(settings)
            ended: StreamingQueryException | None = None  # raised by awaitTermination
            error: BaseException | None = None  # what the run's last query ended on
            # A run that starts its query again after Kafka's time-outs says so in one line
            # each time; Spark's stack traces of the same failure (some 300 lines) would
            # bury it. A failure that stops the run still shows its tasks' stack trace in
            # the error the run raises.
            quiet = quiet_task_failures(spark, also=(QUERY_FAILURE_LOGGER,)) \
                if rereads_kafka_timeouts(settings) else contextlib.nullcontext()
            with _stop_on_signals(stop), quiet, quiet_on_stop:
                while True:
                    if not query.isActive:
                        error = ended or query.exception()
                        wait_s = None if error is None or monitor.stop_requested \
                            or stop.is_set() else rereads.wait_before_next(
                                error, len(summary.batches))
                        if wait_s is not None and not stop.wait(wait_s):
                            ended, query = None, _started_again(writer, monitor)
                            continue
                        if error is not None and stop.is_set() and \
                                (why := rereads_after(settings, str(error))) is not None:
                            log.warning("stopped on the signal; the batch that failed on its "
                                        "Kafka brokers (%s) was not committed and runs again "
                                        "on restart", why)
                            error = None
                        break
                    now, status = time.monotonic(), query.status  # one py4j call a second
                    planning.look(status, in_flight.is_set(), now)
                    batch, phase = in_flight.seen()
                    running.look(batch, now, phase)
                    if planning.gone is not None:
                        monitor.stop_requested = True
                        query.stop()
                        raise SourceGone(f"the stream stopped: {planning.gone}")
                    if stop.is_set() and give_up_waiting is None:
                        # A trigger stuck on its source will not reach a quiet moment.
                        give_up_waiting = now + (0.0 if planning.stuck(now)
                                                 else quiet_moment_wait(settings))
                    if give_up_waiting is not None and not in_flight.is_set():
                        forced = time.monotonic() > give_up_waiting
                        if forced or _between_triggers(status):
                            monitor.stop_requested = True
                            query.stop()
                            error = ended or query.exception()
                            break
                    elif (requests_in is not None and not in_flight.is_set()
                          and forget_requested(requests_in) and _between_triggers(status)):
                        query = _restarted_forgetting(query, writer, monitor, settings)
                        if forget_requested(requests_in):  # the trim failed: not again
                            requests_in = None
                        continue
                    try:
                        query.awaitTermination(1)
                    except StreamingQueryException as failed:
                        ended = failed
            _end_of_run(error, not_begun, monitor.stop_requested, forced)
            monitor.wait_for(reports)
        finally:
            if query is not None:
                monitor.wait_terminated()
            spark.streams.removeListener(monitor)
            _PY4J_LOG.removeFilter(quiet_after_stop)
    return summary


def _end_of_run(error: BaseException | None, not_begun: list[int], stop_requested: bool,
                forced: bool) -> None:
    """Say which batch a stop left for the restart, or raise the ``error`` that ended the
    query when the run did not stop it."""
    if not_begun:
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


class StopBeforeBatch(Exception):
    """Raised in a batch's handler, before it does anything, when the run was asked to
    stop: it ends the query there (see :func:`run_stream`)."""


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
    that failed on Kafka brokers that did not answer.

    That batch was not committed and runs again (on restart, or in a continuous run's next
    query: :class:`KafkaRereads`); the run says so in one line. Before a stop is requested
    every other report passes.
    """

    def __init__(self, monitor: BatchMonitor) -> None:
        super().__init__()
        self._monitor = monitor

    def filter(self, record: logging.LogRecord) -> bool:
        if self._monitor.stop_requested:
            return False
        error = record.exc_info[1] if record.exc_info else None
        return error is None or not self._monitor.settings.reads_kafka \
            or kafka_timeout(str(error)) is None


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


@contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """Turn SIGTERM and SIGINT into a graceful-stop request while the query runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.warning("signal %s received: stopping after the batch in flight", signum)
        stop.set()

    previous = {sig: signal.signal(sig, request_stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

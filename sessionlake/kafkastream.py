"""A stream's Kafka topic: the checks before a run reads it, the streaming DataFrame of
its records, and the diagnosis of a topic gone while a run waits on it.

Each check refuses with one line (:class:`~sessionlake.config.ConfigError`) what Spark's
Kafka source would otherwise meet only mid-run, with a stack trace, or not at all: brokers
of another cluster, a topic created anew, records deleted before they were read, a topic
another checkpoint of the lake read.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionlake import storage
from sessionlake.checkpoint import (
    KAFKA_ERASURE_NOTE,
    KAFKA_ERASURES_DIR,
    KAFKA_LOG_MARK,
    KAFKA_SOURCE_LOG_START,
    SOURCE_LOG,
    SPARK_CHECKPOINT,
    SPARK_OFFSETS_LOG,
    kafka_offsets,
    kafka_topics_read,
    lake_lock_folder,
    last_committed_batch,
    recorded_source_file,
)
from sessionlake.config import ENV, ConfigError, Settings
from sessionlake.erasure import LANDING_MARGIN_MS, ErasureRun, KeptOut, erasure_ms
from sessionlake.kafkaadmin import (
    KafkaRefused,
    KafkaTopic,
    KafkaTopicMissing,
    KafkaUnavailable,
    describe_topic,
    first_offsets_after,
)
from sessionlake.registry import (
    checkpoint_key,
    kafka_source_key,
    lake_stream_entries,
    noted_stream_ids,
    same_kafka_topic,
    source_key,
)
from sessionlake.sources import KAFKA_SCHEME
from sessionlake.tables import (
    BATCH_METRICS,
    EVENTS,
    LATE_EVENTS,
    QUARANTINE,
    never_written,
    read_table,
    table_exists,
)

#: The run's logger: these checks are the run's, and its log lines keep one name.
log = logging.getLogger("sessionlake.stream")


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
    committed = last_committed_batch(spark, spark_checkpoint)
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


#: How long an erasure waits for a Kafka stream's brokers to tell where its topic ends (each
#: of their answers): it holds the batch locks meanwhile, and every stream waits with it.
ERASURE_ADMIN_TIMEOUT_S = 5.0


def note_kafka_ends(spark: SparkSession, settings: Settings, started: datetime) -> None:
    """Note where each of the lake's Kafka streams' partitions end as an erasure that
    began at ``started`` erases: the records before those offsets landed before it, and
    a batch that reads them later keeps the erased users' records out
    (:func:`kafka_kept_out`). Called under the batch locks (on a local lake), while no
    batch reads; a checkpoint since deleted is skipped.

    Brokers that do not answer leave the erasure to go on: its stream then finds the line
    by the records' timestamps (:func:`kafka_erasure_offsets`), as said in a warning.
    """
    ends = {}
    for checkpoint, entry in lake_stream_entries(spark, settings.lake).items():
        source = str(entry.get("source") or "")
        if source.startswith(KAFKA_SCHEME) and storage.exists(spark, checkpoint):
            latest = _topic_ends(spark, settings, checkpoint, entry)
            if latest is not None:
                ends[_as_noted(settings.lake, checkpoint)] = latest
    if ends:
        storage.write_text(spark, _ends_note(settings.lake, erasure_ms(started)),
                           json.dumps(ends, sort_keys=True))


def _topic_ends(spark: SparkSession, settings: Settings, checkpoint: str,
                entry: Mapping[str, Any]) -> dict[int, int] | None:
    """Where the topic of the stream on ``checkpoint`` (its register ``entry``) ends now,
    asked of the brokers it was first noted with, then of those the settings name
    (``SESSIONLAKE_KAFKA_BOOTSTRAP``: brokers moved within the cluster); brokers of another
    cluster, or a topic created anew, do not count. ``None``, with a warning, when none
    tells."""
    brokers, _, topic = str(entry["source"]).removeprefix(KAFKA_SCHEME).partition("/")
    tried = []
    for bootstrap in dict.fromkeys(b for b in (brokers, settings.kafka_bootstrap) if b):
        try:
            found = describe_topic(spark, bootstrap, topic, ERASURE_ADMIN_TIMEOUT_S,
                                   settings.kafka_client_properties())
        except KafkaUnavailable as error:
            tried.append(str(error).partition(": check ")[0])
            continue
        if same_kafka_topic(entry, kafka_source_key(bootstrap, topic), found.cluster_id,
                            found.topic_id):
            return dict(found.latest)
        tried.append(f"the brokers at {bootstrap} hold another topic {topic}")
    log.warning("where the records of topic %s, which the stream on %s reads, end as this "
                "erasure erases is not known (%s): its batches find the line by the "
                "records' timestamps. SESSIONLAKE_KAFKA_BOOTSTRAP and "
                "SESSIONLAKE_KAFKA_PROPERTIES name the brokers and their client settings",
                topic, checkpoint, "; ".join(tried) or "no brokers are known")
    return None


def _as_noted(lake: str, checkpoint: str) -> str:
    """A checkpoint as the erasures' notes name it: inside the lake, relative to it, so that
    a copy of the lake finds its own."""
    inside = f"{checkpoint_key(lake)}/"
    key = checkpoint_key(checkpoint)
    return key.removeprefix(inside) if key.startswith(inside) else key


def _ends_note(lake: str, started_ms: int) -> str:
    return f"{lake_lock_folder(lake)}/{KAFKA_ERASURES_DIR}/{started_ms}.json"


def kafka_kept_out(spark: SparkSession, settings: Settings, runs: Sequence[ErasureRun],
                   earliest: Mapping[int, int] | None = None) -> list[KeptOut]:
    """The records of a Kafka batch to keep out of the lake: each erased user's records
    at offsets before the erasure's (:func:`kafka_erasure_offsets`; ``earliest``, the
    first offset each partition held as the run began, tells which erasures Kafka's
    retention has outlived). A replay after a restore reads them again, and so does a
    stream that reads a backlog after an erasure; a stream that keeps up reads from past
    every erasure's offsets, and its batches get no condition. Erasures that reach the
    same offsets share one.

    (``sessionlake.erasure.files_kept_out`` does the same for files, by when each landed.)
    """
    if not runs:
        return []
    start = kafka_resume_offsets(spark, settings.checkpoint) or {}
    offsets = kafka_erasure_offsets(spark, settings, runs, earliest or {})
    reaching: dict[tuple[tuple[int, int], ...], set[str]] = {}
    for run in runs:
        reach = tuple(sorted((partition, end) for partition, end
                             in offsets[run.started_ms].items()
                             if end > start.get(partition, 0)))
        if reach:
            reaching.setdefault(reach, set()).update(run.hashes)
    return [KeptOut(_before(settings.kafka_topic or "", dict(reach)), tuple(sorted(hashes)))
            for reach, hashes in sorted(reaching.items())]


def _before(topic: str, ends: Mapping[int, int]) -> Column:
    """The records of ``topic`` before offset ``ends[p]`` in each partition ``p``, as
    :func:`sessionlake.sources.kafka_lines` names them."""
    where = F.lit(False)
    for partition, end in sorted(ends.items()):
        where = where | ((F.col("source_file") == f"{KAFKA_SCHEME}{topic}/{partition}")
                         & (F.col("source_line") < end))
    return where


def kafka_erasure_offsets(spark: SparkSession, settings: Settings,
                          runs: Sequence[ErasureRun], earliest: Mapping[int, int]
                          ) -> dict[int, dict[int, int]]:
    """Where the records that landed after each erasure begin in the topic, by the
    erasure's start: the first offset per partition.

    The erasure noted where the partitions ended as it erased (:func:`note_kafka_ends`).
    For an erasure that could not (brokers away, an erasure before 2026-12-06, a stream
    registered since), the brokers are asked which records have a Kafka timestamp after
    its start, up to ``LANDING_MARGIN_MS`` later as for files
    (:func:`~sessionlake.kafkaadmin.first_offsets_after`): a line a producer's clock, or
    a record it dated ahead, moves.

    Found once an erasure and noted in the checkpoint
    (:data:`~sessionlake.checkpoint.KAFKA_ERASURE_NOTE`), so that a batch replayed after a
    crash keeps out the same records; a line by timestamps is not noted until the margin
    has passed, while records that count as before the erasure may still land. An erasure
    whose line lies at or before the topic's ``earliest`` offsets in every partition
    reaches no record any read can return (Kafka's retention deleted them all): it is
    noted without partitions (``{}``), so that the note stays one entry an erasure.
    """
    note = f"{settings.checkpoint.rstrip('/')}/{KAFKA_ERASURE_NOTE}"
    try:
        noted = _offsets_by_erasure(json.loads(storage.read_text(spark, note) or "{}"))
    except (ValueError, AttributeError, TypeError):
        log.warning("%s is not readable: the erasures' offsets are found again", note)
        noted = {}
    found, by_time = dict(noted), []
    me = _as_noted(settings.lake, settings.checkpoint)
    for started in sorted({run.started_ms for run in runs} - set(noted)):
        at_erasure = _ends_at_erasure(spark, settings.lake, started, me)
        if at_erasure is not None:
            found[started] = at_erasure
        else:
            by_time.append(started)
    if by_time:
        try:
            after = first_offsets_after(
                spark, settings.kafka_bootstrap or "", settings.kafka_topic or "",
                [started + LANDING_MARGIN_MS for started in by_time],
                properties=settings.kafka_client_properties())
        except KafkaUnavailable as error:
            raise ConfigError(
                f"{error}: the batch must know which of its records landed before an "
                "erasure of their user, and wrote no row: run the stream again once the "
                "brokers answer") from None
        found.update({started: after[started + LANDING_MARGIN_MS] for started in by_time})
    found = {started: {} if _outlived(ends, earliest) else ends
             for started, ends in found.items()}
    now_ms = time.time() * 1000
    settled = {started: ends for started, ends in found.items()
               if started not in by_time or started + LANDING_MARGIN_MS < now_ms}
    if settled != noted:
        storage.write_text(spark, note, json.dumps(settled, sort_keys=True))
    return found


def _outlived(ends: Mapping[int, int], earliest: Mapping[int, int]) -> bool:
    """Whether every record before ``ends`` was deleted from the topic (by Kafka's
    retention, or ``kafka-delete-records``): its partitions now begin at ``earliest``."""
    return all(end <= earliest.get(partition, 0) for partition, end in ends.items())


def _ends_at_erasure(spark: SparkSession, lake: str, started_ms: int, checkpoint: str
                     ) -> dict[int, int] | None:
    """What :func:`note_kafka_ends` noted of ``checkpoint``'s partitions for the erasure
    that began at ``started_ms``; ``None`` when it noted nothing (or its note is damaged:
    the line is then found by timestamps, as said)."""
    note = _ends_note(lake, started_ms)
    text = storage.read_text(spark, note)
    try:
        ends = json.loads(text).get(checkpoint) if text else None
        return None if ends is None else _partition_offsets(ends)
    except (ValueError, AttributeError, TypeError):
        log.warning("%s is not readable: the line is found by the records' timestamps", note)
        return None


def _offsets_by_erasure(noted: Mapping[str, Mapping[str, int]]) -> dict[int, dict[int, int]]:
    return {int(started): _partition_offsets(ends) for started, ends in noted.items()}


def _partition_offsets(ends: Mapping[str, int]) -> dict[int, int]:
    """``{partition: offset}`` as a JSON note spells it (keys are text) made numbers."""
    return {int(partition): int(end) for partition, end in ends.items()}


def kafka_records_lost(
    resume: Mapping[int, int], earliest: Mapping[int, int]
) -> dict[int, tuple[int, int]]:
    """The offsets ``[first, end)`` of each partition's records deleted before the stream
    read them: from where it reads on (``resume``; a partition added since from 0) to the
    first offset the topic still holds (``earliest``)."""
    return {partition: (resume.get(partition, 0), first)
            for partition, first in sorted(earliest.items())
            if first > resume.get(partition, 0)}


def kafka_offsets_gone_back(
    resume: Mapping[int, int], latest: Mapping[int, int]
) -> dict[int, tuple[int, int]]:
    """The partitions whose log now ends (``latest``) before the offset the stream reads
    on from (``resume``): the brokers lost records the stream had read (an unclean leader
    election, a log truncated by hand), as ``{partition: (end, resume)}``."""
    return {partition: (end, resume[partition]) for partition, end in sorted(latest.items())
            if resume.get(partition, 0) > end}


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
    back = kafka_offsets_gone_back(resume or {}, topic.latest)
    if back:
        _refuse_offsets_gone_back(settings, back)
    lost = kafka_records_lost(resume or {}, topic.earliest) if resume is not None else {}
    if not lost:
        return
    what = _records_lost(settings.kafka_topic or "", lost, "before the stream read them")
    if settings.kafka_accept_data_loss:
        log.warning("%s: skipped, as --accept-kafka-data-loss says; their events are not in "
                    "the lake", what)
        return
    raise ConfigError(
        f"{what}, by the topic's retention or by hand, and cannot be read any more. Run "
        "once with --accept-kafka-data-loss to skip them and go on (their events will not "
        "be in the lake); a longer retention on the topic avoids it")


def _refuse_offsets_gone_back(settings: Settings, back: Mapping[int, tuple[int, int]]) -> None:
    """Refuse, unless ``--accept-kafka-data-loss``, a stream whose partitions now end
    before where it reads on (:func:`kafka_offsets_gone_back`). Spark would stop every run on
    it, or, told to accept data loss, go on from each partition's end, skipping the records
    written there since below the offset the stream had reached.

    :raises ConfigError: naming the partitions and what the flag would skip.
    """
    where = ", ".join(f"partition {p} ends at offset {end}, the stream reads on from {at}"
                      for p, (end, at) in back.items())
    what = (f"topic {settings.kafka_topic} holds fewer records than the stream has read "
            f"({where}): the brokers lost records the stream had read, whose events are in "
            "the lake (an unclean leader election, or a log truncated by hand)")
    if settings.kafka_accept_data_loss:
        log.warning("%s: read on from each partition's end, as --accept-kafka-data-loss "
                    "says; records written there since, below where the stream had read, "
                    "are skipped", what)
        return
    raise ConfigError(
        f"{what}. Records written there since would be read at offsets the stream has "
        "passed. Run once with --accept-kafka-data-loss to read on from each partition's "
        "end (records already written there since, below where the stream had read, are "
        "skipped; their events will not be in the lake)")


def _records_lost(topic: str, lost: Mapping[int, tuple[int, int]], when: str) -> str:
    """``N records of topic T were deleted from Kafka <when> (partition p offsets a-b,
    ...)``."""
    count = sum(end - first for first, end in lost.values())
    ranges = ", ".join(f"partition {p} offsets {first}-{end - 1}"
                       for p, (first, end) in lost.items())
    return (f"{count} record{'s' * (count != 1)} of topic {topic} were deleted from Kafka "
            f"{when} ({ranges})")


def check_restore_keeps_kafka_records(
    spark: Callable[[], SparkSession], files: SparkSession | None, settings: Settings,
    copy: str, snapshot_id: str,
) -> None:
    """Refuse a restore to a snapshot whose stream read a Kafka topic from offsets the
    topic no longer holds (its retention deleted them since), unless
    ``--accept-kafka-data-loss``: the restore would take their events out of the lake, and
    the stream could not read them again. Daily snapshots kept for a month outlive a topic
    kept for a week; a folder's files are kept by ``sessionlake archive`` for every
    snapshot, a topic's records by nothing sessionlake controls.

    :param spark: starts the JVM the look-up needs (only for a snapshot of a Kafka stream).
    :param copy: the snapshot's copy of the checkpoint.
    :raises ConfigError: naming the records the restore would lose, or the brokers that did
        not answer the question, and what to do instead.
    """
    topics = kafka_topics_read(files, copy)
    resume = kafka_resume_offsets(files, copy) if topics else None
    if not topics or resume is None:
        return  # a folder's stream, or one that had read nothing yet
    noted = lake_stream_entries(files, settings.lake).get(checkpoint_key(settings.checkpoint), {})
    source = str(noted.get("source") or "")
    bootstrap = settings.kafka_bootstrap or source.removeprefix(KAFKA_SCHEME).partition("/")[0]
    topic, accept = topics[0], settings.kafka_accept_data_loss
    after = ("; the next run must then skip them too: once with --trigger available-now "
             "--accept-kafka-data-loss, before the continuous run is started again")
    try:
        if not bootstrap:
            raise KafkaUnavailable(f"no brokers are known for topic {topic}: set "
                                   "SESSIONLAKE_KAFKA_BOOTSTRAP")
        earliest = describe_topic(spark(), bootstrap, topic,
                                  properties=settings.kafka_client_properties()).earliest
    except KafkaUnavailable as error:  # the topic missing, or the client refused, too
        if accept:
            log.warning("%s: snapshot %s restored without knowing whether the topic still "
                        "holds what its stream reads on from, as --accept-kafka-data-loss "
                        "says", error, snapshot_id)
            return
        retry = ("" if isinstance(error, KafkaTopicMissing) else
                 "run it again once they answer it (SESSIONLAKE_KAFKA_BOOTSTRAP and "
                 "SESSIONLAKE_KAFKA_PROPERTIES, or --kafka-properties, name the brokers and "
                 "the client's settings), or ")
        raise ConfigError(
            f"{error}. A restore to snapshot {snapshot_id} must first know whether topic "
            f"{topic} still holds the records its stream reads on from: {retry}pass "
            f"--accept-kafka-data-loss to restore without knowing{after}") from None
    lost = kafka_records_lost(resume, earliest)
    if not lost:
        return
    what = _records_lost(topic, lost, f"since snapshot {snapshot_id}'s stream read up to them")
    if accept:
        log.warning("%s: restored all the same, as --accept-kafka-data-loss says; their "
                    "events are no longer in the lake%s", what, after)
        return
    raise ConfigError(
        f"{what}: the restore would take their events out of the lake, and the stream "
        "could not read them again. Restore a newer snapshot, or pass "
        "--accept-kafka-data-loss to restore all the same (their events will not be in the "
        "lake); a topic kept longer than the snapshots avoids it")


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
    candidates: dict[str, Mapping[str, Any]] = {}
    for checkpoint, noted in lake_stream_entries(spark, settings.lake).items():
        if not same_kafka_topic(noted, source, topic.cluster_id, topic.topic_id):
            continue
        if checkpoint != ours and \
                storage.list_names(spark, f"{checkpoint}/{SPARK_CHECKPOINT}/offsets"):
            raise ConfigError(
                f"topic {settings.kafka_topic} on {settings.kafka_bootstrap} was read by the "
                f"lake's stream on checkpoint {checkpoint} (brokers {noted['source']}); a "
                f"stream on the new checkpoint "
                f"{settings.checkpoint} would start again from --starting-offsets "
                f"{settings.kafka_starting_offsets}. Run with --checkpoint {checkpoint}"
            )
        candidates[checkpoint] = noted
    readers = (_streams_that_read(spark, settings, candidates)
               if candidates and settings.kafka_starting_offsets == "earliest" else [])
    if readers:
        raise ConfigError(
            f"the lake holds records of topic {settings.kafka_topic}, read by the stream of "
            f"checkpoint {' and '.join(readers)}, whose offsets are gone; a stream on the new "
            f"checkpoint {settings.checkpoint} would read the topic again from its first "
            "record, and take in a second time every event without an event_id (its id is "
            "the record's offset) and every quarantined record. Nothing was read. `sessionlake "
            "doctor` names a snapshot to restore, which brings the checkpoint back and reads "
            "what came after it; or run with --starting-offsets latest to go on from the "
            "topic's end, leaving unread what was produced since the lake's last batch"
        )


def _streams_that_read(spark: SparkSession, settings: Settings,
                       candidates: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Which of the checkpoints noted on the topic, none of which holds offsets now, had
    read it: those whose identities have batches in ``batch_metrics`` (a checkpoint
    that failed before its first batch read nothing). A note from before identities were
    noted is judged by the lake's records of the topic's name (:func:`topic_taken_in`)."""
    ids = {checkpoint: noted_stream_ids(noted) for checkpoint, noted in candidates.items()}
    known = {i for noted in ids.values() for i in noted or []}
    ran = set() if not known or never_written(spark, settings.lake, BATCH_METRICS) else {
        row["stream_id"] for row in read_table(spark, settings.lake, BATCH_METRICS)
        .where(F.col("stream_id").isin(sorted(known))).select("stream_id").distinct()
        .collect()}
    old = [checkpoint for checkpoint, noted in ids.items() if noted is None]
    old_read = bool(old) and topic_taken_in(spark, settings.lake, settings.kafka_topic or "")
    return [checkpoint for checkpoint, noted in ids.items()
            if (noted is None and old_read) or ran.intersection(noted or [])]


def topic_taken_in(spark: SparkSession, lake: str, topic: str) -> bool:
    """Whether the lake's ``events``, ``late_events`` or ``quarantine`` holds a record of
    Kafka ``topic`` (asked only of a new checkpoint on a topic its lake's streams read)."""
    prefix = f"{KAFKA_SCHEME}{topic}/"
    return any(
        table_exists(spark, lake, table) and not never_written(spark, lake, table)
        and not read_table(spark, lake, table).where(F.col("source_file").startswith(prefix))
        .isEmpty()
        for table in (EVENTS, LATE_EVENTS, QUARANTINE))


def check_kafka_settings(settings: Settings) -> str:
    """The Kafka flags of ``--source kafka``: both brokers and topic, no folder-only flag,
    and ``--accept-kafka-data-loss`` only for a run that ends."""
    if not settings.kafka_bootstrap:
        raise ConfigError("--source kafka needs the brokers: pass --kafka-bootstrap "
                          f"HOST:PORT or set {ENV['kafka_bootstrap']}")
    if not settings.kafka_topic:
        raise ConfigError("--source kafka needs a topic: pass --topic NAME or set "
                          f"{ENV['kafka_topic']}")
    if settings.max_files_per_trigger:
        raise ConfigError("--max-files-per-trigger is for a folder; with --source kafka "
                          "use --max-offsets-per-trigger")
    if settings.kafka_accept_data_loss and settings.trigger == "continuous":
        # Spark's failOnDataLoss is the query's: off, it would skip, for as long as the run
        # lasts, every later loss with no more than a WARN line in the driver's log.
        raise ConfigError("--accept-kafka-data-loss is for one available-now run, which "
                          "skips the records lost and ends: a continuous run would also skip "
                          "any loss it met later, for as long as it ran. Run once with "
                          "--trigger available-now --accept-kafka-data-loss, then start the "
                          "continuous run again")
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


#: How many times a continuous run's Kafka source asks the brokers for the topic's offsets
#: before the stream fails: Java's largest int, so that it waits out an outage of any
#: length (about one attempt a minute, each Kafka's ``default.api.timeout.ms``), with an
#: ALERT every five minutes (:class:`sessionlake.monitor.PlanningWatch`) and SIGTERM
#: still stopping it. Spark's default is 3.
KAFKA_OUTAGE_ATTEMPTS = 2**31 - 1


#: Kafka client settings a ``--kafka-properties`` file may override. ``read_committed``:
#: a transactional producer's records are read once its transaction commits, and those of
#: an aborted one never (Kafka's consumer default, ``read_uncommitted``, reads both: the
#: retry of an aborted send, at a new offset, would be a second event, and, without a
#: producer ``event_id``, not a duplicate). Records of other producers read as before.
CONSUMER_DEFAULTS = {"isolation.level": "read_committed"}


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
    Records of transactions are read once committed (:data:`CONSUMER_DEFAULTS`).
    """
    client = {f"kafka.{key}": value for key, value in
              {**CONSUMER_DEFAULTS, **settings.kafka_client_properties()}.items()}
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
    good, or out of the client's reach (its credentials or its rights to the topic refused),
    or ``None`` while the brokers are only away (the run waits for them).

    A continuous run's source asks the brokers for a deleted topic, or with credentials
    they refuse, again and again, and would wait for ever, its alerts blaming the brokers.
    """
    # Read once, as the stream's source was given them: a file changed since (a password
    # rotated) must not let the look-up in while the stream's own client is refused.
    properties = settings.kafka_client_properties()

    def diagnose() -> str | None:
        assert settings.kafka_bootstrap and settings.kafka_topic
        where = f"topic {settings.kafka_topic} on the Kafka brokers at {settings.kafka_bootstrap}"
        try:
            now = describe_topic(spark, settings.kafka_bootstrap, settings.kafka_topic,
                                 KAFKA_DIAGNOSIS_TIMEOUT_S, properties)
        except KafkaTopicMissing:
            return (f"{where} was deleted while the stream read it: its records not read yet "
                    "are gone. A topic of that name created anew is read on a checkpoint of "
                    "its own (--checkpoint DIR)")
        except KafkaRefused as refused:  # credentials expired or rotated, an ACL revoked
            return (f"{refused}. Run it again once they let it in: it goes on from its "
                    "checkpoint")
        except (KafkaUnavailable, ConfigError):
            return None
        if topic.topic_id and now.topic_id and now.topic_id != topic.topic_id:
            return (f"{where} was deleted and created anew while the stream read it (topic id "
                    f"{topic.topic_id}, now {now.topic_id}): read the new one on a checkpoint "
                    "of its own (--checkpoint DIR)")
        return None

    return diagnose

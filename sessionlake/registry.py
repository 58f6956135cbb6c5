"""The lake's register of its streams: each checkpoint that ever ran a stream on the lake,
with the source it read.

Maintenance finds a stream's unfinished batches through it (a restore, a retention run, the
doctor), and a new checkpoint on a source another checkpoint already read is told from it
(:mod:`sessionlake.kafkastream`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pyspark.sql import SparkSession

from sessionlake import storage
from sessionlake.checkpoint import (
    STREAMS_DIR,
    lake_lock_folder,
    ledger_batch_ids,
    read_stream_identity,
)
from sessionlake.config import ConfigError, Settings
from sessionlake.sources import KAFKA_SCHEME
from sessionlake.storage import local_path


def checkpoint_key(checkpoint: str) -> str:
    """One spelling of a checkpoint's folder: a local one absolute and resolved."""
    local = local_path(checkpoint)
    return str(local.resolve()) if local is not None else checkpoint.rstrip("/")


def _streams_folder(lake: str) -> str:
    return f"{lake_lock_folder(lake)}/{STREAMS_DIR}"


def register_stream(spark: SparkSession | None, lake: str, checkpoint: str,
                    source: str | None = None, kafka_cluster: str | None = None,
                    kafka_topic_id: str | None = None, stream_id: str | None = None) -> None:
    """Note ``checkpoint`` among the lake's streams, once, with the ``source`` it reads
    (:func:`source_key`) and, for Kafka, the ids of the brokers' cluster and of the topic,
    so that maintenance and the lake's other streams find its unfinished batches
    (:func:`lake_streams`), a new checkpoint on its source is told, and so is a topic
    that is no longer the one the checkpoint read
    (:func:`sessionlake.kafkastream.check_kafka_topic_unchanged`).

    A checkpoint inside the lake (the default) is noted relative to it, so that a copy of
    the lake names its own copy of the checkpoint, not the original's. A note written
    before sources (or clusters) were noted gets them at the stream's next run.
    ``stream_id``: the checkpoint's identity, kept with those it had before (a checkpoint
    made anew at the same path has another), so that a stream's rows in ``batch_metrics``
    tell whether it read anything (:func:`noted_stream_ids`).
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
    ids = [*before.get("stream_ids", []), *([stream_id] if stream_id else [])]
    if ids:
        entry["stream_ids"] = list(dict.fromkeys(ids))
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


def check_checkpoint_of_lake(spark: SparkSession | None, lake: str, checkpoint: str) -> None:
    """Refuse a ``checkpoint`` folder that does not exist while the lake's register names
    one that does: a misspelt ``--checkpoint``. A restore to it rolled the tables back and
    wrote the snapshot's checkpoint there, while the stream's own went on from its later
    batch, whose records were then never read again; a snapshot taken with it kept no
    checkpoint, and its restore left the stream to read its whole landing folder again
    (a review). A checkpoint given anew where the lake's have all gone is taken.

    :raises ConfigError: naming the lake's checkpoints that exist.
    """
    if storage.exists(spark, checkpoint):
        return
    given = checkpoint_key(checkpoint)
    found = [c for c in lake_streams(spark, lake) if c != given and storage.exists(spark, c)]
    if found:
        raise ConfigError(
            f"no checkpoint at {checkpoint}, and the lake's stream runs on "
            f"{' and '.join(found)}: give that (--checkpoint, SESSIONLAKE_CHECKPOINT), "
            "or move the checkpoint there first")


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
    identity = read_stream_identity(spark, checkpoint)
    if identity is None:
        return None
    ledger = f"{checkpoint.rstrip('/')}/ledger"
    oldest: datetime | None = None
    # Only the newest batches can be unfinished.
    for batch in reversed(ledger_batch_ids(spark, checkpoint, identity)[-3:]):
        entry = json.loads(storage.read_text(
            spark, f"{ledger}/{identity.ledger_prefix}{batch}.json") or "{}")
        if entry and not entry.get("done"):
            oldest = datetime.fromisoformat(entry["processing_time"])
    return oldest


def noted_stream_ids(noted: Mapping[str, Any]) -> list[str] | None:
    """The identities a stream's note (:func:`register_stream`) has known its checkpoint
    by; ``None`` for a note written before they were noted."""
    ids = noted.get("stream_ids")
    return [str(i) for i in ids] if isinstance(ids, list) else None

"""``sessionlake run --source kafka`` against a real broker: exactly once through a SIGKILL,
a restart and a topic that grows from 3 to 5 partitions.

One KRaft broker (``sessionlake/devkafka.py``) serves the whole module. The events are a
generated clickstream (duplicates and malformed lines included, none late); the scenario
is one chain, because every ``sessionlake run`` is a JVM start:

1. the first two thirds of the events go round-robin to a 3-partition topic;
2. a run that reads at most 110 records per micro-batch is killed with SIGKILL in the
   middle of its second batch (``SESSIONLAKE_FAULT=after_merge@1``, after its MERGE);
3. a restart (in this process, on the suite's Spark) replays that batch, which drains the
   topic;
4. the topic grows to 5 partitions and the last third goes round-robin to all five;
5. a run at another parallelism (``--shuffle-partitions 3``) reads it, new partitions
   included;
6. the lake goes back to a snapshot taken before the growth, and a run from there reads
   the last third again (once).

After 5 and after 6, the tables must equal a file-based run over the same events: no
event lost, none doubled, every record counted once. The tests that need the broker are
marked ``kafka`` and ``slow`` (a broker start); they are never skipped: without the
broker's jars (``make kafka-broker``, part of ``make setup``) they fail.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionlake.checkpoint import KAFKA_ERASURE_NOTE, KAFKA_ERASURES_DIR, STREAMS_DIR
from sessionlake.cli import main
from sessionlake.config import ConfigError, Settings, settings_from
from sessionlake.devkafka import KafkaBroker, free_port, start_broker
from sessionlake.doctor import check_lake
from sessionlake.erasure import ERASED_REASON, LANDING_MARGIN_MS, erasure_runs
from sessionlake.generate import generate_clickstream
from sessionlake.kafkaadmin import (
    KafkaUnavailable,
    add_partitions,
    create_topic,
    delete_records,
    delete_topic,
    describe_topic,
    load_topic,
    produce_lines,
)
from sessionlake.kafkastream import kafka_erasure_offsets, kafka_kept_out, kafka_topic_gone
from sessionlake.orchestration import stream_position
from sessionlake.registry import lake_streams, register_stream, source_key
from sessionlake.retention import RetentionRequest, enforce_retention
from sessionlake.snapshots import create_snapshot, restore_snapshot
from sessionlake.spark import LISTING_PARALLELISM
from sessionlake.stream import check_landing_folder, run_stream
from sessionlake.tables import STREAM_TABLES, ensure_tables, read_table, table_version
from tests.conftest import REPO

TOPIC = "clicks"
#: Both runs take late events out of the picture (equality holds when none is late):
#: a round-robin topic read 110 records at a time keeps partitions within minutes of
#: each other in event time, far less than this grace.
GRACE = "1h"
#: The module's broker also has a listener that asks for this user and password.
SASL_USER, SASL_PASSWORD = "sessionlake", "s3cret-Pa55"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """One real KRaft broker on 127.0.0.1 for the module."""
    running = start_broker(tmp_path_factory.mktemp("kafka"), sasl_users={SASL_USER: SASL_PASSWORD})
    yield running
    running.stop()


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three chronological files of events, with duplicates and malformed lines."""
    folder = tmp_path_factory.mktemp("landing")
    generate_clickstream(folder, users=30, events=300, files=3, seed=11,
                         duplicate_fraction=0.03, malformed_fraction=0.03)
    return folder


def _lines(landing: Path) -> list[list[str]]:
    """The non-blank lines of each file, in file order."""
    return [[line for line in path.read_text().splitlines() if line.strip()]
            for path in sorted(landing.glob("*.jsonl"))]


def produce(spark: SparkSession, bootstrap: str, lines: list[str], partitions: int) -> None:
    produce_lines(spark, bootstrap, TOPIC, lines, partitions)


def run_cli(lake: Path, bootstrap: str, *extra: str, fault: str | None = None,
            ) -> subprocess.CompletedProcess[str]:
    """``sessionlake run --source kafka`` in its own process, as an operator runs it."""
    env = {k: v for k, v in os.environ.items() if k != "SESSIONLAKE_FAULT"}
    env["SESSIONLAKE_DRIVER_MEMORY"] = "1g"
    if fault:
        env["SESSIONLAKE_FAULT"] = fault
    command = [sys.executable, "-m", "sessionlake.cli", "run", "--source", "kafka",
               "--kafka-bootstrap", bootstrap, "--topic", TOPIC, "--lake", str(lake),
               "--grace", GRACE, "--max-offsets-per-trigger", "110", *extra]
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900, check=False)


def kafka_settings(lake: Path, bootstrap: str) -> Settings:
    """The settings :func:`run_cli` gives on the command line."""
    return settings_from({"lake": str(lake), "source": "kafka", "kafka_bootstrap": bootstrap,
                          "kafka_topic": TOPIC, "grace": GRACE,
                          "kafka_max_offsets_per_trigger": 110}, env={})


def outcome(spark: SparkSession, lake: Path) -> dict[str, Any]:
    """What must not depend on the source, the batching or the crashes."""
    path = str(lake)

    def rows(table: str, *columns: Any) -> list[tuple[Any, ...]]:
        return sorted(tuple(r) for r in read_table(spark, path, table).select(*columns)
                      .collect())

    key = ("session_id", "user_id", "session_start", "session_end", "event_count",
           "entry_page", "exit_page")
    metrics = read_table(spark, path, "batch_metrics").agg(*[
        F.sum(c).alias(c) for c in ("input_records", "accepted", "late", "quarantined",
                                    "duplicates")
    ]).first()
    assert metrics is not None
    return {
        "closed": rows("sessions", *key),
        "open": rows("open_sessions", *key),
        "events": rows("events", "user_id", "event_id", "event_time", "page"),
        "late": rows("late_events", "event_id"),
        "quarantine": rows("quarantine", "raw", "reason"),
        "totals": metrics.asDict(),
    }


@pytest.mark.kafka
@pytest.mark.slow
def test_kill_restart_and_new_partitions_end_as_a_file_run(
    spark: SparkSession, broker: KafkaBroker, landing: Path, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    files = _lines(landing)
    first, last = files[0] + files[1], files[2]
    expected_lake = tmp_path / "from-files"
    run_stream(spark, settings_from({
        "lake": str(expected_lake), "source": str(landing), "grace": GRACE,
        "shuffle_partitions": 2}, env={}))
    expected = outcome(spark, expected_lake)
    assert expected["closed"] and expected["open"] and expected["quarantine"]
    assert expected["totals"]["duplicates"] > 0 and not expected["late"]

    create_topic(spark, broker.bootstrap, TOPIC, 3)
    produce(spark, broker.bootstrap, first, 3)
    lake = tmp_path / "lake"
    killed = run_cli(lake, broker.bootstrap, fault="after_merge@1")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    # The restart in this process (one JVM start less): the library entry point, same code.
    settings = kafka_settings(lake, broker.bootstrap)
    restarted = run_stream(spark, settings)
    assert [r.row["batch_id"] for r in restarted.batches] == [1]  # the batch cut off
    snapshot = create_snapshot(spark, settings, name="before-growth")

    add_partitions(spark, broker.bootstrap, TOPIC, 5)
    grown_topic = describe_topic(spark, broker.bootstrap, TOPIC)
    assert grown_topic.partitions == 5
    # The id the broker was formatted with (the stream register notes it).
    assert f"cluster.id={grown_topic.cluster_id}\n" in \
        (broker.data_dir / "log" / "meta.properties").read_text()
    produce(spark, broker.bootstrap, last, 5)
    # The command line in this process too (the kill above is the process boundary), at
    # another parallelism; the session's own settings are put back after it.
    kept = {key: spark.conf.get(key) for key in ("spark.sql.shuffle.partitions",
                                                 LISTING_PARALLELISM)}
    try:
        with caplog.at_level(logging.INFO, logger="sessionlake.monitor"):
            caplog.clear()  # only this run's lines: the file run above logged too
            assert main(["run", "--source", "kafka", "--kafka-bootstrap", broker.bootstrap,
                         "--topic", TOPIC, "--lake", str(lake), "--grace", GRACE,
                         "--max-offsets-per-trigger", "110", "--shuffle-partitions", "3"]) == 0
    finally:
        for key, value in kept.items():
            if value is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, value)
    # The monitor's lines: Kafka's source rows are records, so no file count is made up.
    logged = [json.loads(message.removeprefix("batch "))
              for message in caplog.messages if message.startswith("batch {")]
    assert logged and all("input_files" not in b and b["records_per_second"] > 0
                          for b in logged if b.get("input_records"))

    assert outcome(spark, lake) == expected

    # Back to the snapshot (3 partitions' offsets in its checkpoint), then the same run:
    # the records read since, the new partitions' included, are read again, once.
    restore_snapshot(spark, settings, snapshot.snapshot_id)
    assert read_table(spark, str(lake), "events").count() < len(expected["events"])
    run_stream(spark, settings)
    assert outcome(spark, lake) == expected
    # Kafka's part of the checkpoint (its initial offsets file starts with a zero byte)
    # is read as healthy, not as a half-written file-source log.
    health = check_lake(spark, settings)
    assert health.healthy, health.lines()
    produced = len(first) + len(last)
    assert expected["totals"]["input_records"] == produced
    sources = {r[0] for r in read_table(spark, str(lake), "events")
               .select("source_file").distinct().collect()}
    assert sources == {f"kafka://{TOPIC}/{p}" for p in range(5)}

    # A checkpoint keeps the kind of source it read: a folder on the Kafka stream's, or
    # Kafka on the folder stream's, is refused before anything is written.
    versions = {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    with pytest.raises(ConfigError, match=f"reads Kafka topic {TOPIC}, not a folder"):
        run_stream(spark, settings_from(
            {"lake": str(lake), "source": str(landing), "grace": GRACE}, env={}))
    assert {t: table_version(spark, str(lake), t) for t in STREAM_TABLES} == versions
    with pytest.raises(ConfigError, match=f"read files from {landing}, not a Kafka topic"):
        run_stream(spark, kafka_settings(expected_lake, broker.bootstrap))
    # The lake's Kafka stream read no folder: a folder on a checkpoint of its own may go.
    check_landing_folder(spark, settings_from(
        {"lake": str(lake), "source": str(landing),
         "checkpoint": str(tmp_path / "files-checkpoint")}, env={}))
    # Brokers of another cluster (as when the development broker is formatted anew): the
    # checkpoint's offsets would skip that cluster's records, so the run is refused.
    [note] = (lake / "_checkpoints" / "streams").glob("*.json")
    noted = json.loads(note.read_text())
    note.write_text(json.dumps({**noted, "kafka_cluster": "another-cluster-id"}))
    with pytest.raises(ConfigError, match="read topic .* from Kafka cluster another-cluster-id"
                       f", but the brokers at .* are cluster {grown_topic.cluster_id}"):
        run_stream(spark, settings)
    assert {t: table_version(spark, str(lake), t) for t in STREAM_TABLES} == versions


@pytest.mark.kafka
@pytest.mark.slow
def test_a_new_checkpoint_on_a_topic_another_checkpoint_read_is_refused(
    spark: SparkSession, broker: KafkaBroker, landing: Path, tmp_path: Path
) -> None:
    """A run that forgot the `--checkpoint` its stream ran with would start the topic again
    from --starting-offsets: refused before touching the lake, naming that checkpoint,
    however the same brokers are spelled (by the cluster's id; the spelling rules are
    `tests/test_registry.py::test_a_topic_is_known_by_its_cluster_else_by_its_brokers`)."""
    topic, host = "forgotten", "LocalHost"
    create_topic(spark, broker.bootstrap, topic, 1)
    produce_lines(spark, broker.bootstrap, topic, _lines(landing)[0][:20], 1)
    lake = tmp_path / "lake"
    forgot = kafka_settings(lake, broker.bootstrap).with_overrides(kafka_topic=topic)
    first = forgot.with_overrides(checkpoint=str(tmp_path / "first"))
    run_stream(spark, first)
    versions = {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    spelled = forgot.with_overrides(
        kafka_bootstrap=broker.bootstrap.replace("127.0.0.1", host))
    with pytest.raises(ConfigError, match=f"topic {topic} on {spelled.kafka_bootstrap} was "
                       f"read by the lake's stream on checkpoint {tmp_path / 'first'}.*"
                       "--checkpoint"):
        run_stream(spark, spelled)
    assert {t: table_version(spark, str(lake), t) for t in STREAM_TABLES} == versions
    assert lake_streams(spark, str(lake)) == [str(tmp_path / "first")]  # not noted
    assert not (lake / "_checkpoints" / "stream" / "format.json").exists()  # nor its format

    # Its offsets gone (moved aside, as doctor says of a damaged one), a new checkpoint
    # there or elsewhere would read the topic again, and its events without an event_id
    # (an id from the offset, which the duplicate check leaves out) would be doubled (the
    # Kafka review).
    (tmp_path / "first").rename(tmp_path / "moved-aside")
    for checkpoint in ("first", "other"):
        with pytest.raises(ConfigError, match=(
                f"the lake holds records of topic {topic}, read by the stream of checkpoint "
                f"{tmp_path / 'first'}, whose offsets are gone.* Nothing was read.*"
                "--starting-offsets latest")):
            run_stream(spark, forgot.with_overrides(checkpoint=str(tmp_path / checkpoint)))
    assert {t: table_version(spark, str(lake), t) for t in STREAM_TABLES} == versions
    events = read_table(spark, str(lake), "events").count()
    run_stream(spark, forgot.with_overrides(checkpoint=str(tmp_path / "first"),
                                            kafka_starting_offsets="latest"))
    assert read_table(spark, str(lake), "events").count() == events  # none read again

    # A checkpoint whose first run failed before its first batch read nothing, and is no
    # reader (the diff review): with the lake's stream noted on an earlier topic of the
    # name (another topic id), a run on it again reads the topic.
    for note in (lake / "_checkpoints" / STREAMS_DIR).glob("*.json"):
        note.write_text(json.dumps({**json.loads(note.read_text()),
                                    "kafka_topic_id": "an-earlier-topic"}))
    failed = forgot.with_overrides(checkpoint=str(tmp_path / "failed-first"))
    register_stream(spark, str(lake), failed.checkpoint, source_key(failed),
                    stream_id="failed-first")
    assert len(run_stream(spark, failed).batches) >= 1


def input_records(spark: SparkSession, lake: Path) -> int:
    """The records the lake's batches read, in all."""
    total = read_table(spark, str(lake), "batch_metrics").agg(F.sum("input_records")).first()
    assert total is not None
    return int(total[0])


def recreate_topic(spark: SparkSession, bootstrap: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again, once the brokers have finished deleting it."""
    delete_topic(spark, bootstrap, topic)
    for _ in range(60):
        try:
            create_topic(spark, bootstrap, topic, partitions)
            return
        except Exception as error:  # py4j: TopicExistsException while it is being deleted
            if "TopicExists" not in str(error):
                raise
            time.sleep(0.5)
    raise AssertionError(f"topic {topic} was not deleted within 30 s")


@pytest.mark.kafka
@pytest.mark.slow
def test_records_deleted_unread_and_a_topic_created_anew_are_told_not_skipped(
    spark: SparkSession, broker: KafkaBroker, landing: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Records Kafka deleted before the stream read them (retention outran a stopped
    stream) stop the run in one line naming them, and are skipped only when the operator
    says so; a topic deleted and created anew is not read from the old one's offsets."""
    topic, lines = "aging", _lines(landing)[0]
    create_topic(spark, broker.bootstrap, topic, 2)
    produce_lines(spark, broker.bootstrap, topic, lines[:20], 2)  # offsets 0-9 of each
    lake = tmp_path / "lake"
    settings = kafka_settings(lake, broker.bootstrap).with_overrides(kafka_topic=topic)
    run_stream(spark, settings)
    produce_lines(spark, broker.bootstrap, topic, lines[20:40], 2)  # offsets 10-19
    delete_records(spark, broker.bootstrap, topic, {0: 14})  # 4 of them never read
    argv = ["run", "--source", "kafka", "--kafka-bootstrap", broker.bootstrap, "--topic", topic,
            "--lake", str(lake), "--grace", GRACE]

    # As Spark meets the loss (mid-run, or before this check): one line, not its traces.
    # The batch it had planned stays to do.
    with monkeypatch.context() as patched:
        patched.setattr("sessionlake.stream.check_no_kafka_records_lost",
                        lambda *args: None)
        assert main(argv) == 2
    stopped = capsys.readouterr().err.strip().splitlines()
    assert stopped[-1].startswith("sessionlake: error: the stream stopped on records deleted "
                                  "from Kafka before it read them (Could not read records in "
                                  f"offset [10, 20) for topic partition {topic}-0)"), stopped

    versions = {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    with pytest.raises(ConfigError, match=(
            rf"^4 records of topic {topic} were deleted from Kafka before the stream read them "
            r"\(partition 0 offsets 10-13\), .* Run once with --accept-kafka-data-loss")):
        run_stream(spark, settings)
    assert {t: table_version(spark, str(lake), t) for t in STREAM_TABLES} == versions

    with caplog.at_level(logging.WARNING, logger="sessionlake.stream"):
        assert main([*argv, "--accept-kafka-data-loss"]) == 0
    assert "4 records of topic aging were deleted from Kafka before the stream read them " \
           "(partition 0 offsets 10-13): skipped" in caplog.text
    assert input_records(spark, lake) == 36  # 40 sent, 4 lost

    # The topic deleted and created anew, longer than the old one: its first 20 records
    # would be skipped on the old offsets. Refused; a checkpoint of its own reads it all.
    recreate_topic(spark, broker.bootstrap, topic, 2)
    produce_lines(spark, broker.bootstrap, topic, lines[40:90], 2)
    versions = {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    with pytest.raises(ConfigError, match=f"topic {topic} on .* was deleted and created anew "
                       "since the stream's checkpoint .* read it"):
        run_stream(spark, settings)
    assert {t: table_version(spark, str(lake), t) for t in STREAM_TABLES} == versions
    run_stream(spark, settings.with_overrides(checkpoint=str(tmp_path / "anew")))
    assert input_records(spark, lake) == 36 + 50


@pytest.mark.kafka
def test_a_restore_to_records_the_topic_no_longer_holds_is_refused_before_anything_changes(
    spark: SparkSession, broker: KafkaBroker, landing: Path, tmp_path: Path,
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    """A snapshot older than the topic's retention: its stream would read on from records
    Kafka has deleted since, whose events are in the lake now. The restore says so and
    changes nothing, unless told to go on."""
    topic, lines = "retained", _lines(landing)[0]
    create_topic(spark, broker.bootstrap, topic, 1)
    produce_lines(spark, broker.bootstrap, topic, lines[:10], 1)
    lake = tmp_path / "lake"
    settings = kafka_settings(lake, broker.bootstrap).with_overrides(kafka_topic=topic)
    run_stream(spark, settings)
    snapshot = create_snapshot(spark, settings)
    produce_lines(spark, broker.bootstrap, topic, lines[10:20], 1)
    run_stream(spark, settings)
    assert input_records(spark, lake) == 20
    # Retention: offsets 0-14 go; the snapshot's stream reads on from offset 10.
    delete_records(spark, broker.bootstrap, topic, {0: 15})
    restore = settings_from({"lake": str(lake)}, env={})  # the brokers noted by the lake
    versions = {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    # Asked first, changing nothing (as the restore DAG does before it stops the stream).
    assert main(["restore", "--lake", str(lake), "--snapshot", snapshot.snapshot_id,
                 "--check-only"]) == 2
    assert "5 records of topic retained were deleted from Kafka since snapshot" in \
        capsys.readouterr().err
    with pytest.raises(ConfigError, match=(
            rf"^5 records of topic {topic} were deleted from Kafka since snapshot "
            rf"{snapshot.snapshot_id}'s stream read up to them \(partition 0 offsets 10-14\): "
            r"the restore would take their events out of the lake.*--accept-kafka-data-loss")):
        restore_snapshot(spark, restore, snapshot.snapshot_id)
    assert {t: table_version(spark, str(lake), t) for t in STREAM_TABLES} == versions
    assert input_records(spark, lake) == 20

    # A snapshot taken after the records it reads on from: restored as before.
    newer = create_snapshot(spark, settings)
    assert main(["restore", "--lake", str(lake), "--snapshot", newer.snapshot_id,
                 "--check-only"]) == 0
    assert f"restore to {newer.snapshot_id} possible; nothing changed" in \
        capsys.readouterr().out
    restore_snapshot(spark, restore, newer.snapshot_id)
    with caplog.at_level(logging.WARNING, logger="sessionlake.stream"):
        restore_snapshot(spark, restore.with_overrides(kafka_accept_data_loss=True),
                         snapshot.snapshot_id)
    assert "5 records of topic retained were deleted from Kafka" in caplog.text
    assert input_records(spark, lake) == 10


@pytest.mark.kafka
def test_a_partition_that_ends_before_where_the_stream_reads_on_is_told_not_replayed_for_ever(
    spark: SparkSession, broker: KafkaBroker, landing: Path, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The brokers lost records the stream had read (an unclean leader election): the
    partition now ends before the stream's offset. Told in one line naming it, before
    anything is written, rather than Spark's failure at every run; the flag reads on."""
    topic, lines = "truncated", _lines(landing)[0]
    create_topic(spark, broker.bootstrap, topic, 1)
    produce_lines(spark, broker.bootstrap, topic, lines[:10], 1)
    lake = tmp_path / "lake"
    settings = kafka_settings(lake, broker.bootstrap).with_overrides(kafka_topic=topic)
    run_stream(spark, settings)
    # As if the stream had read 5 records more, which the brokers have since lost.
    offsets = Path(settings.checkpoint) / "spark" / "offsets"
    last = max((path for path in offsets.iterdir() if path.name.isdigit()),
               key=lambda path: int(path.name))
    last.write_text(last.read_text().replace(f'{{"{topic}":{{"0":10}}}}',
                                             f'{{"{topic}":{{"0":15}}}}'))
    versions = {t: table_version(spark, str(lake), t) for t in STREAM_TABLES}
    with pytest.raises(ConfigError, match=(
            rf"^topic {topic} holds fewer records than the stream has read \(partition 0 "
            r"ends at offset 10, the stream reads on from 15\): the brokers lost records .* "
            r"Run once with --accept-kafka-data-loss to read on from each partition's end")):
        run_stream(spark, settings)
    assert {t: table_version(spark, str(lake), t) for t in STREAM_TABLES} == versions

    with caplog.at_level(logging.WARNING, logger="sessionlake.stream"):
        run_stream(spark, settings.with_overrides(kafka_accept_data_loss=True))
    assert "read on from each partition's end" in caplog.text
    produce_lines(spark, broker.bootstrap, topic, lines[10:13], 1)  # offsets 10-12
    run_stream(spark, settings)
    assert input_records(spark, lake) == 13


def send_at(spark: SparkSession, bootstrap: str, topic: str, partition: int, line: str,
            timestamp_ms: int) -> None:
    """Send ``line`` to ``partition`` of ``topic`` with its own Kafka timestamp (Kafka's
    default ``CreateTime``: the producer's), through Kafka's Java client."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    props = jvm.java.util.Properties()
    serializer = "org.apache.kafka.common.serialization.StringSerializer"
    for key, value in {"bootstrap.servers": bootstrap, "key.serializer": serializer,
                       "value.serializer": serializer}.items():
        props.put(key, value)
    producer = jvm.org.apache.kafka.clients.producer.KafkaProducer(props)
    try:
        record = jvm.org.apache.kafka.clients.producer.ProducerRecord(
            topic, jvm.java.lang.Integer.valueOf(partition),
            jvm.java.lang.Long.valueOf(str(timestamp_ms)), None, line)
        producer.send(record).get()
    finally:
        producer.close()


def _page_event(user: str, minute: int, page: str) -> str:
    return json.dumps({"user_id": user, "event_time": f"2026-01-05T10:{minute:02d}:00Z",
                       "event_id": f"{user}-{minute}", "page": page})


@pytest.mark.kafka
@pytest.mark.parametrize("ends_noted", [True, False], ids=["by-offsets", "by-timestamps"])
def test_records_that_landed_before_their_user_s_erasure_are_kept_out_when_read_again(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path, ends_noted: bool
) -> None:
    """A restore to a snapshot from before an erasure applies it again to the tables,
    and the stream reads again the records it had read since the snapshot: before, the
    erased user's events came back with them. A record that landed in the topic before
    its user's erasure is kept out (a quarantine row without its text or user, naming its
    partition and offset); one that landed after it is taken in.

    The erasure notes where the topic's partitions ended. Without that note (brokers away
    then, or an erasure from before the note) the records' Kafka timestamps tell, and a
    producer whose clock runs ahead moves the line: the erased user's record after its
    record comes back."""
    topic = f"erasures-{ends_noted}"
    create_topic(spark, broker.bootstrap, topic, 2)
    lake = tmp_path / "lake"
    settings = kafka_settings(lake, broker.bootstrap).with_overrides(kafka_topic=topic)
    produce_lines(spark, broker.bootstrap, topic,
                  [_page_event("u1", 0, "/a"), _page_event("u2", 1, "/b")], 2)
    run_stream(spark, settings)
    snapshot = create_snapshot(spark, settings)
    # Partition 0: a record a producer dated an hour ahead (offset 1), then u2's (2).
    send_at(spark, broker.bootstrap, topic, 0, _page_event("u3", 4, "/x"),
            int(time.time() * 1000) + 3_600_000)
    produce_lines(spark, broker.bootstrap, topic,
                  [_page_event("u2", 5, "/c"), _page_event("u1", 6, "/d")], 2)
    run_stream(spark, settings)
    enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    [ends] = (lake / "_checkpoints" / KAFKA_ERASURES_DIR).iterdir()
    assert list(json.loads(ends.read_text()).values()) == [{"0": 3, "1": 2}]
    restore_snapshot(spark, settings, snapshot.snapshot_id)
    if not ends_noted:
        ends.unlink()
        # The margin after the erasure's start passed: the line is noted once found.
        [erasure] = erasure_runs(spark, str(lake))
        time.sleep(max(0.0, (erasure.started_ms + LANDING_MARGIN_MS) / 1000 - time.time()
                       + 0.1))
    # u2 is back, a minute after the erasure (beyond the margin).
    send_at(spark, broker.bootstrap, topic, 1, _page_event("u2", 20, "/e"),
            int(time.time() * 1000) + 60_000)
    run_stream(spark, settings)

    pages = read_table(spark, str(lake), "events").select("user_id", "page").collect()
    came_back = [] if ends_noted else [("u2", "/c")]
    assert sorted(tuple(r) for r in pages) == sorted(
        [("u1", "/a"), ("u1", "/d"), ("u2", "/e"), ("u3", "/x"), *came_back])
    quarantined = [(r["source_file"], r["source_line"], r["raw"], r["user_id"], r["reason"])
                   for r in read_table(spark, str(lake), "quarantine").collect()]
    assert quarantined == ([(f"kafka://{topic}/0", 2, "", None, ERASED_REASON)]
                           if ends_noted else [])
    noted = json.loads((Path(settings.checkpoint) / KAFKA_ERASURE_NOTE).read_text())
    # Found once, for a replay.
    assert list(noted.values()) == [{"0": 3 if ends_noted else 1, "1": 2}]
    # The stream has read past the erasure's offsets: its batches get no condition.
    assert kafka_kept_out(spark, settings, erasure_runs(spark, str(lake))) == []

    # Kafka's retention deletes the records before the line in one partition: the other
    # still holds some. Then in both: the erasure reaches no record any read can return,
    # and the note keeps one entry for it, without partitions (it grew by erasures x
    # partitions for good).
    line = {0: 3 if ends_noted else 1, 1: 2}
    runs = erasure_runs(spark, str(lake))
    assert kafka_erasure_offsets(spark, settings, runs, {0: 3, 1: 0}) == {
        runs[0].started_ms: line}
    delete_records(spark, broker.bootstrap, topic, {0: 3, 1: 2})
    send_at(spark, broker.bootstrap, topic, 0, _page_event("u1", 30, "/f"),
            int(time.time() * 1000))
    run_stream(spark, settings)
    noted = json.loads((Path(settings.checkpoint) / KAFKA_ERASURE_NOTE).read_text())
    assert list(noted.values()) == [{}]
    assert read_table(spark, str(lake), "events").where(F.col("page") == "/f").count() == 1


def test_brokers_away_leave_an_erasure_to_go_on_and_stop_a_batch_that_must_ask_them(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An erasure asks the brokers of the lake's Kafka streams where their partitions end;
    brokers that do not answer must not stop an erasure request, and the stream finds the
    line by timestamps instead. A batch that must ask them, and cannot, stops in one line
    rather than letting the erased users' records in."""
    lake, nobody = tmp_path / "lake", f"127.0.0.1:{free_port()}"
    settings = kafka_settings(lake, nobody)
    ensure_tables(spark, str(lake))
    Path(settings.checkpoint).mkdir(parents=True)
    register_stream(spark, str(lake), settings.checkpoint, source_key(settings))
    with caplog.at_level(logging.WARNING, logger="sessionlake.stream"):
        enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    assert (f"where the records of topic {TOPIC}, which the stream on {settings.checkpoint} "
            f"reads, end as this erasure erases is not known (the Kafka brokers at {nobody} "
            "did not answer within 5s") in caplog.text
    assert "its batches find the line by the records' timestamps" in caplog.text
    assert not (lake / "_checkpoints" / KAFKA_ERASURES_DIR).exists()
    with pytest.raises(ConfigError, match=(
            rf"^the Kafka brokers at {nobody} did not tell where the records of topic "
            rf"{TOPIC} that landed after an erasure begin .*: the batch must know which of "
            r"its records landed before an erasure of their user, and wrote no row")):
        kafka_kept_out(spark, settings, erasure_runs(spark, str(lake)))


@pytest.mark.kafka
def test_an_erasure_asks_the_cluster_s_brokers_of_now_when_those_first_noted_are_gone(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path
) -> None:
    """The lake's register keeps the brokers a stream was first started with; the cluster
    may since answer elsewhere (``SESSIONLAKE_KAFKA_BOOTSTRAP``). The erasure asks those
    too, once the cluster's id says they are the same cluster's."""
    topic, lake, gone = "moved", tmp_path / "lake", f"127.0.0.1:{free_port()}"
    create_topic(spark, broker.bootstrap, topic, 1)
    produce_lines(spark, broker.bootstrap, topic, [_page_event("u1", 0, "/a")], 1)
    settings = kafka_settings(lake, broker.bootstrap).with_overrides(kafka_topic=topic)
    ensure_tables(spark, str(lake))
    Path(settings.checkpoint).mkdir(parents=True)
    cluster = describe_topic(spark, broker.bootstrap, topic).cluster_id
    register_stream(spark, str(lake), settings.checkpoint,
                    source_key(settings.with_overrides(kafka_bootstrap=gone)), cluster)
    enforce_retention(spark, settings, RetentionRequest(erase_users=("u2",)))
    [ends] = (lake / "_checkpoints" / KAFKA_ERASURES_DIR).iterdir()
    assert list(json.loads(ends.read_text()).values()) == [{"0": 1}]


@contextmanager
def transactional_producer(spark: SparkSession, bootstrap: str) -> Iterator[Any]:
    """A Kafka producer with a transactional id (Kafka's Java client, through the JVM), as
    a Kafka Streams application with exactly-once, or Flink's Kafka sink, writes."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    props = jvm.java.util.Properties()
    serializer = "org.apache.kafka.common.serialization.StringSerializer"
    for key, value in {"bootstrap.servers": bootstrap, "transactional.id": "sessionlake-test",
                       "key.serializer": serializer, "value.serializer": serializer}.items():
        props.put(key, value)
    producer = jvm.org.apache.kafka.clients.producer.KafkaProducer(props)
    try:
        producer.initTransactions()
        yield producer
    finally:
        producer.close()


def send_in_transaction(spark: SparkSession, producer: Any, topic: str, lines: list[str]) -> None:
    """Begin a transaction and send ``lines`` to partition 0 of ``topic`` in it."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    producer.beginTransaction()
    for line in lines:
        producer.send(jvm.org.apache.kafka.clients.producer.ProducerRecord(topic, 0, None, line))
    producer.flush()


def _event(user: str, minute: int, event_id: str) -> str:
    return json.dumps({"user_id": user, "event_time": f"2026-01-05T10:{minute:02d}:00Z",
                       "event_id": event_id, "page": "/"})


@pytest.mark.kafka
def test_records_of_aborted_transactions_are_not_read_nor_those_of_open_ones_yet(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path
) -> None:
    """A transactional producer's records count once its transaction commits: an aborted
    send and its retry are one event, and a transaction still open is read after it
    commits, not lost."""
    topic, lake = "transactional", tmp_path / "lake"
    create_topic(spark, broker.bootstrap, topic, 1)
    settings = kafka_settings(lake, broker.bootstrap).with_overrides(kafka_topic=topic)
    with transactional_producer(spark, broker.bootstrap) as producer:
        send_in_transaction(spark, producer, topic, [_event("u1", 1, "a"), _event("u1", 2, "b")])
        producer.abortTransaction()  # the application failed; it sends them again
        send_in_transaction(spark, producer, topic, [_event("u1", 1, "a2"), _event("u1", 2, "b2")])
        producer.commitTransaction()
        send_in_transaction(spark, producer, topic, [_event("u2", 3, "c")])  # still open
        run_stream(spark, settings)
        ids = {r["event_id"] for r in read_table(spark, str(lake), "events").collect()}
        assert ids == {"a2", "b2"}
        assert input_records(spark, lake) == 2
        producer.commitTransaction()
    run_stream(spark, settings)
    ids = {r["event_id"] for r in read_table(spark, str(lake), "events").collect()}
    assert ids == {"a2", "b2", "c"}
    assert input_records(spark, lake) == 3
    assert read_table(spark, str(lake), "quarantine").count() == 0


@pytest.mark.kafka
@pytest.mark.slow
def test_a_folder_loads_into_a_new_topic(
    spark: SparkSession, broker: KafkaBroker, landing: Path
) -> None:
    """What ``make kafka KAFKA_LOAD=DIR`` does: every non-blank line of the folder's files
    becomes one record of the new topic."""
    sent = load_topic(spark, broker.bootstrap, "loaded", 2, landing)
    lines = [line for file in _lines(landing) for line in file]
    assert sent == len(lines) > 0
    assert describe_topic(spark, broker.bootstrap, "loaded").partitions == 2
    records = (spark.read.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
               .option("subscribe", "loaded").load()
               .selectExpr("partition", "CAST(value AS STRING) AS value").collect())
    assert sorted(r["value"] for r in records) == sorted(lines)
    assert {r["partition"] for r in records} == {0, 1}


def test_a_missing_topic_is_refused_before_the_lake_is_touched(
    spark: SparkSession, broker: KafkaBroker, tmp_path: Path
) -> None:
    settings = settings_from({"lake": str(tmp_path / "lake"), "source": "kafka",
                              "kafka_bootstrap": broker.bootstrap,
                              "kafka_topic": "no-such-topic"}, env={})
    with pytest.raises(ConfigError, match="topic 'no-such-topic' does not exist"):
        run_stream(spark, settings)
    assert not (tmp_path / "lake").exists()


def test_a_broker_that_does_not_answer_is_named(spark: SparkSession) -> None:
    nobody = f"127.0.0.1:{free_port()}"
    with pytest.raises(KafkaUnavailable, match=f"brokers at {nobody} did not answer"):
        describe_topic(spark, nobody, TOPIC, timeout_s=2)


@pytest.mark.kafka
def test_a_secured_cluster_is_read_with_the_settings_of_kafka_properties(
    spark: SparkSession, broker: KafkaBroker, landing: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    """A listener that asks for a user and password (SASL/PLAIN): the run signs in with the
    ``--kafka-properties`` file, a wrong password is refused in one line before the lake is
    touched, and the password is written nowhere in the lake. Each batch's line tells the
    records left behind it."""
    topic, lines = "secured", _lines(landing)[0][:30]
    create_topic(spark, broker.bootstrap, topic, 2)
    produce_lines(spark, broker.bootstrap, topic, lines, 2)
    assert broker.sasl is not None
    signed_in, wrong = tmp_path / "client.properties", tmp_path / "wrong.properties"
    signed_in.write_text(broker.sasl.client_properties(SASL_USER, SASL_PASSWORD))
    wrong.write_text(broker.sasl.client_properties(SASL_USER, "not-it"))
    lake = tmp_path / "lake"
    argv = ["run", "--source", "kafka", "--kafka-bootstrap", broker.sasl_bootstrap,
            "--topic", topic, "--lake", str(lake), "--grace", GRACE]

    assert main([*argv, "--kafka-properties", str(wrong)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"sessionlake: error: the Kafka brokers at {broker.sasl_bootstrap} refused "
        "sessionlake's client (SaslAuthenticationException: Authentication failed: Invalid "
        "username or password): check the security settings of --kafka-properties")
    assert not lake.exists()

    # 20 records a batch: the first batch's line tells the 10 left behind it.
    with caplog.at_level(logging.INFO, logger="sessionlake.monitor"):
        assert main([*argv, "--kafka-properties", str(signed_in),
                     "--max-offsets-per-trigger", "20"]) == 0
    assert input_records(spark, lake) == len(lines)
    behind = [json.loads(line.split("batch ", 1)[1])["records_behind"]
              for line in caplog.messages if line.startswith("batch {")]
    assert behind == [len(lines) - 20, 0]
    written = [path for path in lake.rglob("*") if path.is_file()
               and SASL_PASSWORD.encode() in path.read_bytes()]
    assert written == []

    # Credentials refused while a continuous run waits on its source (a password rotated,
    # a certificate expired): the run stops saying so, instead of waiting for brokers that
    # do answer. (The diagnosis its trigger asks for once it has waited; before, it took
    # the refusal for brokers away, and the run waited for ever.)
    settings = kafka_settings(lake, broker.sasl_bootstrap).with_overrides(
        kafka_topic=topic, kafka_properties=str(wrong))
    said = kafka_topic_gone(spark, settings, describe_topic(spark, broker.bootstrap, topic))()
    assert said is not None and said.startswith(
        f"the Kafka brokers at {broker.sasl_bootstrap} refused sessionlake's client "
        "(SaslAuthenticationException: "), said
    assert said.endswith("Run it again once they let it in: it goes on from its checkpoint")


@contextmanager
def continuous_run(broker: KafkaBroker, topic: str, lake: Path, properties: Path, log: Path,
                   env: Mapping[str, str] | None = None, flags: Sequence[str] = (),
                   ) -> Iterator[subprocess.Popen[bytes]]:
    """``sessionlake run --trigger continuous`` on ``topic`` in its own process, its output
    in ``log``; afterwards the broker answers again (SIGCONT) and the run is not left behind."""
    environment = {k: v for k, v in os.environ.items() if k != "SESSIONLAKE_FAULT"}
    environment.update({"SESSIONLAKE_DRIVER_MEMORY": "1g", **(env or {})})
    with open(log, "w") as output:
        run = subprocess.Popen(
            [sys.executable, "-m", "sessionlake.cli", "run", "--source", "kafka",
             "--kafka-bootstrap", broker.bootstrap, "--topic", topic, "--lake", str(lake),
             "--grace", GRACE, "--trigger", "continuous", "--processing-interval", "1s",
             "--kafka-properties", str(properties), *flags],
            cwd=REPO, env=environment, stdout=output, stderr=subprocess.STDOUT)
    try:
        yield run
    finally:
        os.kill(broker.process.pid, signal.SIGCONT)
        if run.poll() is None:
            run.kill()
            run.wait()


@contextmanager
def frozen_under_first_fetch(broker: KafkaBroker, topic: str, lake: Path, properties: Path,
                             log: Path, paused: Path, env: Mapping[str, str] | None = None,
                             flags: Sequence[str] = ()) -> Iterator[subprocess.Popen[bytes]]:
    """A :func:`continuous_run` whose broker is frozen (SIGSTOP) after batch 0's offsets
    were planned and before it reads its records (the run paused at its ``ingest`` fault
    point, then let go). Spark's consumer gives up the fetch after
    ``spark.network.timeout``, 15 s here."""
    with continuous_run(broker, topic, lake, properties, log, {
        "SESSIONLAKE_FAULT": "ingest@0", "SESSIONLAKE_FAULT_PAUSE": str(paused),
        "SPARK_SUBMIT_OPTS": os.environ.get("SPARK_SUBMIT_OPTS", "")
        + " -Dspark.network.timeout=15s -Dspark.network.timeoutInterval=10s"
        " -Dspark.executor.heartbeatInterval=3s", **(env or {}),
    }, flags) as run:
        deadline = time.monotonic() + 300
        while not paused.exists():
            assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        os.kill(broker.process.pid, signal.SIGSTOP)
        paused.unlink()  # the batch goes on, to a broker that does not answer
        yield run


@pytest.mark.kafka
@pytest.mark.slow
def test_a_continuous_run_waits_out_brokers_that_stop_answering(
    spark: SparkSession, broker: KafkaBroker, landing: Path, tmp_path: Path,
) -> None:
    """The broker frozen (SIGSTOP) under a continuous run for longer than Spark's Kafka
    source waits by default (three attempts, here of 2 s each, by the properties file):
    the run goes on when it answers again, reads what came meanwhile once, and still
    stops cleanly on SIGTERM."""
    topic, lines = "outage", _lines(landing)[1]
    create_topic(spark, broker.bootstrap, topic, 1)
    produce_lines(spark, broker.bootstrap, topic, lines[:40], 1)
    quick = tmp_path / "quick.properties"
    quick.write_text("request.timeout.ms=1500\ndefault.api.timeout.ms=2000\n")
    lake = tmp_path / "lake"
    checkpoint = str(lake / "_checkpoints" / "stream")
    log = tmp_path / "run.log"
    with continuous_run(broker, topic, lake, quick, log) as run:
        first = _wait_for_batch(lake, checkpoint, after=-1, run=run, log=log)
        os.kill(broker.process.pid, signal.SIGSTOP)
        time.sleep(20)  # Spark's own source gives up after about 3 x (2 + 1) s
        assert run.poll() is None, "the run died while the broker did not answer"
        os.kill(broker.process.pid, signal.SIGCONT)
        produce_lines(spark, broker.bootstrap, topic, lines[40:70], 1)
        _wait_for_all(spark, lake, checkpoint, 70, after=first, run=run, log=log)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=120)
    assert run.returncode == 0, log.read_text()[-3000:]
    assert input_records(spark, lake) == 70


@pytest.mark.kafka
@pytest.mark.slow
def test_a_continuous_run_replays_a_batch_whose_brokers_stopped_answering_as_it_read(
    spark: SparkSession, broker: KafkaBroker, landing: Path, tmp_path: Path,
) -> None:
    """The broker frozen (SIGSTOP) after the first batch's offsets were planned and before
    it read its records (the run paused at its ``ingest`` fault point): the batch fails,
    the run says so in one ALERT and starts its query again from the checkpoint, and once
    the broker answers the batch is replayed and committed once; later records follow and
    SIGTERM still stops the run cleanly; the log holds none of Spark's stack traces of the
    failure. Spark's consumer gives up a fetch after
    ``spark.network.timeout`` (15 s here, 120 s by default), Kafka's client a look-up
    after ``default.api.timeout.ms`` (2 s here, by the properties file). While the batch
    hangs, past ``--alert-batch-duration`` (8 s here), an ALERT says so and what Spark runs."""
    topic, lines = "midbatch", _lines(landing)[1]
    create_topic(spark, broker.bootstrap, topic, 1)
    produce_lines(spark, broker.bootstrap, topic, lines[:40], 1)
    quick = tmp_path / "quick.properties"
    quick.write_text("request.timeout.ms=1500\ndefault.api.timeout.ms=2000\n")
    lake, paused = tmp_path / "lake", tmp_path / "paused"
    checkpoint = str(lake / "_checkpoints" / "stream")
    log = tmp_path / "run.log"
    alert = "ALERT a batch failed reading its records: the Kafka brokers at"
    with frozen_under_first_fetch(broker, topic, lake, quick, log, paused,
                                  {"SESSIONLAKE_ALERT_BATCH_DURATION": "8s"},
                                  ["--kafka-reread-wait", "2s"]) as run:
        deadline = time.monotonic() + 300
        while alert not in log.read_text():
            assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        os.kill(broker.process.pid, signal.SIGCONT)
        first = _wait_for_batch(lake, checkpoint, after=-1, run=run, log=log)
        produce_lines(spark, broker.bootstrap, topic, lines[40:70], 1)
        _wait_for_all(spark, lake, checkpoint, 70, after=first, run=run, log=log)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=120)
    said = log.read_text()
    assert run.returncode == 0, said[-3000:]
    assert first == 0
    assert "starts again from its checkpoint in 2s and replays that batch" in said
    assert "ALERT stream stopped on an error" not in said
    # One line for the failed batch, not Spark's stack traces of it.
    assert "terminated with error" not in said and "\tat org.apache." not in said, said
    hanging = said.index("ALERT batch 0 has been running for ")
    line = said[hanging:said.index("\n", hanging)]
    assert hanging < said.index(alert), said[-3000:]
    assert ", in phase parse; Spark: stage " in line and " tasks done, " in line, line
    metrics = read_table(spark, str(lake), "batch_metrics")
    assert metrics.count() == metrics.select("batch_id").distinct().count()
    assert input_records(spark, lake) == 70
    events = read_table(spark, str(lake), "events")
    assert events.count() == events.select("event_id").distinct().count()


@pytest.mark.kafka
@pytest.mark.slow
def test_sigterm_while_a_continuous_run_waits_to_reread_stops_it_and_a_restart_replays_once(
    spark: SparkSession, broker: KafkaBroker, landing: Path, tmp_path: Path,
) -> None:
    """As above, the broker frozen under the first batch's fetch; a SIGTERM in the wait
    before the query starts again stops the run in one line, exit status 0, and the next
    run (available-now, once the broker answers) commits that batch once."""
    topic, lines = "midbatch-stopped", _lines(landing)[1][:40]
    create_topic(spark, broker.bootstrap, topic, 1)
    produce_lines(spark, broker.bootstrap, topic, lines, 1)
    quick = tmp_path / "quick.properties"
    quick.write_text("request.timeout.ms=1500\ndefault.api.timeout.ms=2000\n")
    lake, paused = tmp_path / "lake", tmp_path / "paused"
    log = tmp_path / "run.log"
    # A wait far longer than the test: the signal must end it, not its end.
    with frozen_under_first_fetch(broker, topic, lake, quick, log, paused,
                                  {"SESSIONLAKE_KAFKA_REREAD_WAIT": "10m"}) as run:
        deadline = time.monotonic() + 300
        while "starts again from its checkpoint in 10m" not in log.read_text():
            assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        run.send_signal(signal.SIGTERM)
        run.wait(timeout=120)
    said = log.read_text()
    assert run.returncode == 0, said[-3000:]
    assert "stopped on the signal; the batch that failed on its Kafka brokers (" in said
    assert "was not committed and runs again on restart" in said
    assert not (lake / "batch_metrics").exists() or read_table(
        spark, str(lake), "batch_metrics").count() == 0
    assert main(["run", "--source", "kafka", "--kafka-bootstrap", broker.bootstrap,
                 "--topic", topic, "--lake", str(lake), "--grace", GRACE,
                 "--kafka-properties", str(quick)]) == 0
    metrics = read_table(spark, str(lake), "batch_metrics")
    assert [r.batch_id for r in metrics.select("batch_id").collect()] == [0]
    assert input_records(spark, lake) == len(lines)


@pytest.mark.kafka
@pytest.mark.slow
def test_a_topic_deleted_under_a_continuous_run_stops_it_in_one_line(
    spark: SparkSession, broker: KafkaBroker, landing: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A continuous run's source would ask for a deleted topic for ever, its alerts
    blaming the brokers: the run tells the topic gone (Kafka's Admin API, once the trigger
    has waited 10 s) and stops, in one line, exit status 2."""
    topic, lines = "vanishing", _lines(landing)[2][:30]
    create_topic(spark, broker.bootstrap, topic, 1)
    produce_lines(spark, broker.bootstrap, topic, lines, 1)
    lake = tmp_path / "lake"
    checkpoint = str(lake / "_checkpoints" / "stream")
    deleted = threading.Event()

    def delete_after_the_first_batch() -> None:
        deadline = time.monotonic() + 300
        while stream_position(str(lake), checkpoint).last_batch_id < 0:
            if time.monotonic() > deadline:
                break
            time.sleep(1)
        delete_topic(spark, broker.bootstrap, topic)
        deleted.set()
        if not stopped.wait(120):  # the run did not stop itself: stop it, and fail below
            os.kill(os.getpid(), signal.SIGTERM)

    stopped = threading.Event()
    deleter = threading.Thread(target=delete_after_the_first_batch, daemon=True)
    deleter.start()
    try:
        code = main(["run", "--source", "kafka", "--kafka-bootstrap", broker.bootstrap,
                     "--topic", topic, "--lake", str(lake), "--grace", GRACE,
                     "--trigger", "continuous", "--processing-interval", "1s"])
    finally:
        stopped.set()
        deleter.join(timeout=60)
    assert deleted.is_set() and code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"sessionlake: error: the stream stopped: topic {topic} on the Kafka brokers at "
        f"{broker.bootstrap} was deleted while the stream read it: its records not read yet "
        "are gone. A topic of that name created anew is read on a checkpoint of its own "
        "(--checkpoint DIR)")
    assert input_records(spark, lake) == len(lines)


def _wait_for_batch(lake: Path, checkpoint: str, after: int, run: subprocess.Popen[bytes],
                    log: Path, timeout_s: float = 300) -> int:
    """The id of the first batch after ``after`` that ``run`` committed, once it has."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last = stream_position(str(lake), checkpoint).last_batch_id
        if last > after:
            return last
        assert run.poll() is None, log.read_text()[-3000:]
        time.sleep(1)
    raise AssertionError(f"no batch after {after} within {timeout_s:g} s")


def _wait_for_all(spark: SparkSession, lake: Path, checkpoint: str, records: int, after: int,
                  run: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until ``run`` has committed batches after ``after`` that bring the lake's input
    to ``records``: Spark's Kafka sink may send a few records in two requests, which two
    triggers can read."""
    last = _wait_for_batch(lake, checkpoint, after=after, run=run, log=log)
    while input_records(spark, lake) < records:
        last = _wait_for_batch(lake, checkpoint, after=last, run=run, log=log)


@pytest.mark.parametrize(("flags", "message"), [
    (["--source", "kafka"], "--source kafka needs the brokers"),
    (["--source", "kafka", "--kafka-bootstrap", "127.0.0.1:9092"],
     "--source kafka needs a topic"),
    (["--source", "kafka", "--kafka-bootstrap", "localhost", "--topic", "t"],
     "kafka-bootstrap must be HOST:PORT"),
    (["--source", "kafka", "--kafka-bootstrap", "h:1", "--topic", "a topic"],
     "topic must be a Kafka topic name"),
    (["--source", "kafka", "--kafka-bootstrap", "h:1", "--topic", "t",
      "--max-files-per-trigger", "2"], "--max-files-per-trigger is for a folder"),
    (["--source", "kafka", "--kafka-bootstrap", "h:1", "--topic", "t",
      "--max-offsets-per-trigger", "0"], "max-offsets-per-trigger must be a whole number"),
    (["--source", ".", "--starting-offsets", "latest"], "--starting-offsets latest goes with"),
    (["--source", ".", "--accept-kafka-data-loss"], "--accept-kafka-data-loss goes with"),
    (["--source", "kafka", "--kafka-bootstrap", "h:1", "--topic", "t", "--trigger",
      "continuous", "--accept-kafka-data-loss"],
     "--accept-kafka-data-loss is for one available-now run"),
])
def test_bad_kafka_flags_exit_2_before_spark_starts(
    flags: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--lake", str(tmp_path / "lake"), *flags]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "lake").exists()

"""Kafka's Admin API, reached through the Spark driver's JVM (kafka-clients is in ``jars/``).

Used before a Kafka stream starts, to turn "broker unreachable" and "no such topic" into
one clear line instead of a stream that waits forever, and by the tests and the
development broker to create, grow and fill topics. No Python Kafka client is needed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

#: How long a look-up may wait for the brokers before sessionlake gives up, in seconds.
ADMIN_TIMEOUT_S = 15.0


#: Kafka's zero id (``Uuid.ZERO_UUID``), which stands for "no id".
_ZERO_UUID = "AAAAAAAAAAAAAAAAAAAAAA"


class KafkaUnavailable(RuntimeError):
    """The brokers did not answer, or the topic is not there: the message says which."""


class KafkaTopicMissing(KafkaUnavailable):
    """The brokers answered, and the topic is not among theirs."""


class KafkaRefused(KafkaUnavailable):
    """The brokers answered, and refused the client's credentials or its right to the
    topic: waiting does not help, the client's settings or the cluster's ACLs must change."""


#: What Kafka's client and Spark's Kafka consumer say when the brokers do not answer in
#: time: a look-up (offsets, a partition's position, metadata), or a batch's fetch of its
#: records (``kafkaConsumer.pollTimeoutMs``, by default ``spark.network.timeout``: 120 s).
_TIMEOUT = re.compile(
    r"(?:org\.apache\.kafka\.common\.errors\.TimeoutException: |java\.util\.concurrent\."
    r"TimeoutException: (?=Cannot fetch record for offset ))(.*?)(?: SQLSTATE:.*)?$")


def kafka_timeout(error_text: str) -> str | None:
    """Kafka's time-out in ``error_text`` (a stream's error, causes included), said in one
    line, when the brokers did not answer; ``None`` for any other error."""
    for line in error_text.splitlines():
        if found := _TIMEOUT.search(line):
            return found.group(1).strip()
    return None


@contextmanager
def kafka_admin(
    spark: SparkSession, bootstrap: str, timeout_s: float = ADMIN_TIMEOUT_S,
    properties: Mapping[str, str] | None = None,
) -> Iterator[Any]:
    """An ``org.apache.kafka.clients.admin.Admin`` on ``bootstrap``, closed afterwards.

    Example::

        with kafka_admin(spark, "127.0.0.1:9092") as admin:
            names = admin.listTopics().names().get()

    :param bootstrap: ``HOST:PORT[,HOST:PORT...]``.
    :param timeout_s: the client's request and API time-outs.
    :param properties: more client settings (a secured cluster's, from
        ``--kafka-properties``); the brokers and time-outs above take precedence.
    :return: the JVM Admin object (py4j).
    """
    jvm = spark.sparkContext._jvm
    assert jvm is not None, "Kafka look-ups need a classic (JVM) Spark session"
    props = jvm.java.util.Properties()
    millis = str(int(timeout_s * 1000))
    for key, value in {"client.id": "sessionlake-admin", **(properties or {}),
                       "bootstrap.servers": bootstrap, "request.timeout.ms": millis,
                       "default.api.timeout.ms": millis}.items():
        props.put(key, value)
    admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
    try:
        yield admin
    finally:
        admin.close(jvm.java.time.Duration.ofSeconds(5))


def _wait(spark: SparkSession, future: Any, timeout_s: float) -> Any:
    """The value of a JVM ``KafkaFuture``, waiting at most ``timeout_s``."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return future.get(int(timeout_s * 1000), jvm.java.util.concurrent.TimeUnit.MILLISECONDS)


def _cause(error: Exception) -> str:
    """The innermost Java exception's class and message, for one readable line."""
    java = getattr(error, "java_exception", None)
    while java is not None and java.getCause() is not None:
        java = java.getCause()
    if java is None:
        return str(error).strip().splitlines()[0]
    return f"{java.getClass().getSimpleName()}: {java.getMessage()}"


def _refused_credentials(cause: str) -> bool:
    """Whether a Kafka client's error is the brokers refusing its credentials or rights
    (``SaslAuthenticationException``, ``SslAuthenticationException``,
    ``TopicAuthorizationException``, ...), not brokers that are away."""
    name = cause.split(":", 1)[0]
    return name.endswith(("AuthenticationException", "AuthorizationException"))


@dataclass(frozen=True)
class KafkaTopic:
    """What the brokers tell of a topic before a stream reads it."""

    #: The topic's partition count.
    partitions: int
    #: The id of the brokers' cluster: one id however the brokers are spelled (``None``
    #: when they do not tell it).
    cluster_id: str | None
    #: Kafka's id of the topic: a topic deleted and created anew under the same name gets
    #: a new one (``None`` when the brokers do not tell it).
    topic_id: str | None = None
    #: The first offset each partition still holds: records before it were deleted (by
    #: retention, or ``kafka-delete-records``).
    earliest: Mapping[int, int] = field(default_factory=dict)
    #: The offset each partition's next record gets (its end, committed or not).
    latest: Mapping[int, int] = field(default_factory=dict)


def describe_topic(
    spark: SparkSession, bootstrap: str, topic: str, timeout_s: float = ADMIN_TIMEOUT_S,
    properties: Mapping[str, str] | None = None,
) -> KafkaTopic:
    """The topic's partitions, ids and first offsets, checking that the brokers answer and
    the topic exists, through one Admin client (with ``properties``, see
    :func:`kafka_admin`).

    :raises KafkaUnavailable: the brokers did not answer within ``timeout_s``, refused the
        client's credentials, or the topic does not exist; the message says what to check.
        Brokers that answer but do not tell their cluster's id give ``cluster_id=None``
        (the caller says what that costs).
    """
    try:
        with kafka_admin(spark, bootstrap, timeout_s, properties) as admin:
            described, numbers = _described(spark, admin, topic, timeout_s)
            return KafkaTopic(len(numbers), _cluster_id(spark, admin, bootstrap, timeout_s),
                              _topic_id(described),
                              _offsets(spark, admin, topic, numbers, timeout_s, "earliest"),
                              _offsets(spark, admin, topic, numbers, timeout_s, "latest"))
    except Exception as error:  # py4j wraps the Java exceptions
        cause = _cause(error)
        if cause.startswith("UnknownTopicOrPartitionException"):
            raise KafkaTopicMissing(
                f"topic {topic!r} does not exist on the Kafka brokers at {bootstrap}: "
                "create it, or fix --topic"
            ) from None
        if _refused_credentials(cause):
            raise KafkaRefused(
                f"the Kafka brokers at {bootstrap} refused sessionlake's client ({cause}): "
                "check the security settings of --kafka-properties"
                + (" and the cluster's ACLs for the topic"
                   if "Authorization" in cause else "")
            ) from None
        raise KafkaUnavailable(
            f"the Kafka brokers at {bootstrap} did not answer within {timeout_s:g}s "
            f"({cause}): check --kafka-bootstrap, that the brokers are running and, for a "
            "secured cluster, --kafka-properties"
        ) from None


def _described(spark: SparkSession, admin: Any, topic: str, timeout_s: float
               ) -> tuple[Any, list[int]]:
    """The topic's ``TopicDescription`` and its partitions' numbers.

    Asked of the topic itself, not found in the list of topics: a topic the client may
    not describe (ACLs) is left out of that list, and would pass for one that does not
    exist."""
    described = _wait(spark, admin.describeTopics([topic]).allTopicNames(), timeout_s
                      ).get(topic)
    return described, [int(p.partition()) for p in described.partitions()]


def _cluster_id(spark: SparkSession, admin: Any, bootstrap: str, timeout_s: float) -> str | None:
    """The cluster id ``admin``'s brokers tell; ``None`` when they do not."""
    try:
        found = _wait(spark, admin.describeCluster().clusterId(), timeout_s)
    except Exception as error:  # py4j wraps the Java exceptions
        log.info("the Kafka brokers at %s did not tell their cluster's id (%s)",
                 bootstrap, _cause(error))
        return None
    return str(found) if found else None


def _topic_id(description: Any) -> str | None:
    """The id in a ``TopicDescription``; ``None`` for brokers too old to give one (they
    answer Kafka's zero id)."""
    found = description.topicId()
    return None if found is None or str(found) == _ZERO_UUID else str(found)


def _offsets(
    spark: SparkSession, admin: Any, topic: str, partitions: Sequence[int], timeout_s: float,
    which: str, *args: int,
) -> dict[int, int]:
    """The first offset each of ``partitions`` of ``topic`` still holds (``which``
    ``earliest``), the offset its next record gets (``latest``), or that of its first
    record whose timestamp is at least ``args[0]`` ms (``forTimestamp``; -1 for none)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    kafka = jvm.org.apache.kafka
    spec = getattr(kafka.clients.admin.OffsetSpec, which)(*args)
    wanted = {kafka.common.TopicPartition(topic, p): spec for p in partitions}
    found = _wait(spark, admin.listOffsets(wanted).all(), timeout_s)
    return {int(tp.partition()): int(info.offset()) for tp, info in found.items()}


def first_offsets_after(
    spark: SparkSession, bootstrap: str, topic: str, moments_ms: Sequence[int],
    timeout_s: float = ADMIN_TIMEOUT_S, properties: Mapping[str, str] | None = None,
) -> dict[int, dict[int, int]]:
    """Where the records that landed after each of ``moments_ms`` begin in each partition
    of ``topic``: the offset of its first record whose Kafka timestamp is later (Kafka's
    time index, ``OffsetSpec.forTimestamp``), or, in a partition with none, its end as it
    was before the question (a record that lands meanwhile counts as after).

    A record's timestamp is when the broker appended it on a topic with
    ``message.timestamp.type=LogAppendTime``, and what the producer set with Kafka's
    default, ``CreateTime``: its clock at the send, or whatever time it chose.

    :raises KafkaUnavailable: the brokers did not answer, or refused the client.
    """
    try:
        with kafka_admin(spark, bootstrap, timeout_s, properties) as admin:
            _, numbers = _described(spark, admin, topic, timeout_s)
            end = _offsets(spark, admin, topic, numbers, timeout_s, "latest")
            after = {moment: _offsets(spark, admin, topic, numbers, timeout_s,
                                      "forTimestamp", moment + 1) for moment in moments_ms}
    except Exception as error:  # py4j wraps the Java exceptions
        raise KafkaUnavailable(
            f"the Kafka brokers at {bootstrap} did not tell where the records of topic "
            f"{topic} that landed after an erasure begin ({_cause(error)})") from None
    return {moment: {p: found[p] if found.get(p, -1) >= 0 else end[p] for p in numbers}
            for moment, found in after.items()}


def create_topic(spark: SparkSession, bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` with ``partitions`` partitions and the brokers' replication factor."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    optional = jvm.java.util.Optional
    new_topic = jvm.org.apache.kafka.clients.admin.NewTopic(
        topic, optional.of(partitions), optional.empty()
    )
    with kafka_admin(spark, bootstrap) as admin:
        _wait(spark, admin.createTopics([new_topic]).all(), ADMIN_TIMEOUT_S)


def add_partitions(spark: SparkSession, bootstrap: str, topic: str, total: int) -> None:
    """Grow ``topic`` to ``total`` partitions (Kafka never shrinks a topic)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    increase = jvm.org.apache.kafka.clients.admin.NewPartitions.increaseTo(total)
    with kafka_admin(spark, bootstrap) as admin:
        _wait(spark, admin.createPartitions({topic: increase}).all(), ADMIN_TIMEOUT_S)


def delete_topic(spark: SparkSession, bootstrap: str, topic: str) -> None:
    """Delete ``topic`` (the brokers finish it in the background)."""
    with kafka_admin(spark, bootstrap) as admin:
        _wait(spark, admin.deleteTopics([topic]).all(), ADMIN_TIMEOUT_S)


def delete_records(
    spark: SparkSession, bootstrap: str, topic: str, before: Mapping[int, int]
) -> None:
    """Delete the records of ``topic`` before the offset given per partition, as retention
    does to records older than it keeps."""
    gateway, jvm = spark.sparkContext._gateway, spark.sparkContext._jvm
    assert gateway is not None and jvm is not None
    # By reflection: py4j cannot call the static beforeOffset(long), which an instance
    # method of the same name hides from it.
    kind = jvm.py4j.reflection.ReflectionUtil.classForName(
        "org.apache.kafka.clients.admin.RecordsToDelete")
    argument_types = gateway.new_array(jvm.java.lang.Class, 1)
    argument_types[0] = jvm.java.lang.Long.TYPE
    before_offset = kind.getMethod("beforeOffset", argument_types)

    def records_before(offset: int) -> Any:
        arguments = gateway.new_array(jvm.java.lang.Object, 1)
        arguments[0] = jvm.java.lang.Long.valueOf(str(offset))
        return before_offset.invoke(None, arguments)

    wanted = {jvm.org.apache.kafka.common.TopicPartition(topic, p): records_before(offset)
              for p, offset in before.items()}
    with kafka_admin(spark, bootstrap) as admin:
        _wait(spark, admin.deleteRecords(wanted).all(), ADMIN_TIMEOUT_S)


def produce_lines(
    spark: SparkSession, bootstrap: str, topic: str, lines: Sequence[str], partitions: int
) -> None:
    """Send ``lines`` to ``topic`` round-robin over its ``partitions``, in order within each.

    Spark's Kafka sink writes them; one task keeps each partition's records in order.
    """
    rows = [(i % partitions, line) for i, line in enumerate(lines)]
    (spark.createDataFrame(rows, "partition int, value string").coalesce(1)
     .write.format("kafka").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).save())


def folder_records(folder: Path) -> list[str]:
    """The non-blank lines of the files in ``folder``, file after file in name order: the
    records a folder source would read from it, one Kafka record each."""
    return [line for path in sorted(p for p in folder.iterdir() if p.is_file())
            for line in path.read_text().splitlines() if line.strip()]


def load_topic(
    spark: SparkSession, bootstrap: str, topic: str, partitions: int,
    folder: Path | None = None,
) -> int:
    """Create ``topic`` and fill it with the records of ``folder`` (if any), as a
    development broker's users would before ``sessionlake run --source kafka``.

    :return: how many records were sent.
    """
    create_topic(spark, bootstrap, topic, partitions)
    lines = [] if folder is None else folder_records(folder)
    if lines:
        produce_lines(spark, bootstrap, topic, lines, partitions)
    return len(lines)

"""One place for sessionlake's configuration.

Every entry point (the command line, the Airflow DAGs, the jobs submitted to Spark, the
tests) builds a :class:`Settings` through :func:`settings_from` and nothing else, so a gap,
a grace period or a lake location is parsed and validated once, with one error message
per mistake, before any data is touched.

Precedence: explicit values (CLI flags, DAG params) over environment variables
(``SESSIONLAKE_*``) over the defaults below.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial
from typing import Any, Literal

InputFormat = Literal["jsonl", "apache"]
Trigger = Literal["available-now", "continuous"]
StartingOffsets = Literal["earliest", "latest"]

INPUT_FORMATS: tuple[str, ...] = ("jsonl", "apache")
TRIGGERS: tuple[str, ...] = ("available-now", "continuous")
STARTING_OFFSETS: tuple[str, ...] = ("earliest", "latest")
#: ``sessionlake sql --output``: an aligned table, a vertical display, CSV with a header, or
#: JSON lines.
OUTPUT_FORMATS: tuple[str, ...] = ("table", "vertical", "csv", "json")
#: The outputs for reading at a terminal: an aligned table, and ``vertical`` (a record a
#: block, a column a line, for rows too wide for a table).
DISPLAY_FORMATS: tuple[str, ...] = ("table", "vertical")
#: The rows a display format prints when no ``--limit`` is given: a table is held whole, to
#: align it, and neither is for reading a million rows; CSV and JSON lines write every row
#: as it comes.
TABLE_ROWS = 1000
#: ``--source kafka`` reads a Kafka topic instead of a landing folder (a folder that
#: happens to be called ``kafka`` is still reachable as ``./kafka``).
KAFKA_SOURCE = "kafka"

#: Environment variables read by :func:`settings_from` (the DAGs rely on the first three).
ENV = {
    "lake": "SESSIONLAKE_LAKE",
    "source": "SESSIONLAKE_SOURCE",
    "checkpoint": "SESSIONLAKE_CHECKPOINT",
    "input_format": "SESSIONLAKE_FORMAT",
    "gap": "SESSIONLAKE_GAP",
    "grace": "SESSIONLAKE_GRACE",
    "max_session_duration": "SESSIONLAKE_MAX_SESSION_DURATION",
    "max_future_skew": "SESSIONLAKE_MAX_FUTURE_SKEW",
    "master": "SESSIONLAKE_MASTER",
    "shuffle_partitions": "SESSIONLAKE_SHUFFLE_PARTITIONS",
    "max_files_per_trigger": "SESSIONLAKE_MAX_FILES_PER_TRIGGER",
    "user_buckets": "SESSIONLAKE_USER_BUCKETS",
    "alert_batch_duration": "SESSIONLAKE_ALERT_BATCH_DURATION",
    "alert_stalled_after": "SESSIONLAKE_ALERT_STALLED_AFTER",
    "alert_late_fraction": "SESSIONLAKE_ALERT_LATE_FRACTION",
    "alert_quarantine_fraction": "SESSIONLAKE_ALERT_QUARANTINE_FRACTION",
    "kafka_bootstrap": "SESSIONLAKE_KAFKA_BOOTSTRAP",
    "kafka_topic": "SESSIONLAKE_KAFKA_TOPIC",
    "kafka_starting_offsets": "SESSIONLAKE_KAFKA_STARTING_OFFSETS",
    "kafka_max_offsets_per_trigger": "SESSIONLAKE_KAFKA_MAX_OFFSETS_PER_TRIGGER",
    "kafka_reread_wait": "SESSIONLAKE_KAFKA_REREAD_WAIT",
    "kafka_properties": "SESSIONLAKE_KAFKA_PROPERTIES",
}

#: The largest whole number a setting that Spark or Kafka reads as a Java ``int`` takes.
JAVA_INT_MAX = 2**31 - 1
#: The largest whole number a setting that Spark or Kafka reads as a Java ``long`` takes.
JAVA_LONG_MAX = 2**63 - 1
#: The longest age limit a maintenance command takes, in days (a century): dates further
#: back than that are beyond Python's calendar for some, and a typo for all.
MAX_AGE_DAYS = 36_500

#: The longest duration a setting takes (a gap of more is a typo, and Python's dates end).
MAX_DURATION = timedelta(days=MAX_AGE_DAYS)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
#: One Kafka bootstrap server: a host name, IPv4 or [IPv6] address, and a port.
_KAFKA_SERVER = re.compile(r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9._-]+):(\d{1,5})$")
#: Kafka's own rule for topic names.
_KAFKA_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


#: How often the micro-batch DAG runs the stream's available-now batches.
MICROBATCH_PERIOD = timedelta(minutes=5)
#: The small files a table must hold before ``sessionlake compact`` (``--min-files``) and
#: the compaction DAG (``min_files``) OPTIMIZE it.
COMPACTION_MIN_FILES = 16
#: The hours of removed files VACUUM keeps for time travel and readers in flight: Delta's
#: own default, and the retention DAG's ``vacuum_retain_hours``.
VACUUM_RETAIN_HOURS = 168


class ActionableError(Exception):
    """A command cannot do what was asked, for a reason its user can act on: the message
    says what is wrong, with which value, and what to do. The command line tells it in
    one line, exit status 2; each step's own errors derive from it."""


class ConfigError(ActionableError, ValueError):
    """A setting is wrong: the message names it, its value, and what would be accepted."""


def parse_duration(value: str | int | float | timedelta, name: str) -> timedelta:
    """Read a duration such as ``30m``, ``90s``, ``24h``, ``1d`` or a number of seconds.

    :param value: the text, a number of seconds, or a timedelta.
    :param name: the setting's name, used in the error message.
    :return: the duration.
    :raises ConfigError: when the value is not a non-negative duration.
    """
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ConfigError(
                f"{name} must be a duration like 30m, 90s, 24h or 1d, got {value!r}"
            )
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2) or "s"]
    if seconds < 0:
        raise ConfigError(f"{name} must not be negative, got {value!r}")
    if seconds > MAX_DURATION.total_seconds():
        raise ConfigError(f"{name} must be at most {MAX_AGE_DAYS}d, got {value!r}")
    return timedelta(seconds=seconds)


def format_duration(value: timedelta) -> str:
    """Write a duration the way :func:`parse_duration` reads it (``1800s`` -> ``30m``)."""
    seconds = value.total_seconds()
    for unit in ("d", "h", "m", "s"):
        size = _UNIT_SECONDS[unit]
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    return f"{seconds:g}s"


def format_age(value: timedelta) -> str:
    """A time since something, for people: whole seconds under two minutes, whole minutes
    from there (:func:`format_duration` of the exact time read ``115.99s``)."""
    step = 1 if value.total_seconds() < 120 else 60
    return format_duration(timedelta(seconds=round(value.total_seconds() / step) * step))


def absolute_location(location: str) -> str:
    """A local path made absolute (Delta needs absolute paths); URIs stay as they are."""
    if "://" in location or location.startswith("file:"):
        return location
    return os.path.abspath(os.path.expanduser(location))


def no_lake_message(lake: str) -> str:
    """What every command says when ``lake`` holds no lake: most often a misspelt
    ``--lake``, so it names the place it looked and how a lake comes to be."""
    return f"no lake at {lake}: `sessionlake run` creates it (check --lake)"


def _one_of(value: Any, choices: tuple[str, ...], name: str) -> str:
    """``value`` when it is one of ``choices``; else a ConfigError naming them."""
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


#: The Spark masters a run can be given: ``local``, ``local[N]``, ``local[*]``,
#: ``local[N,F]``, ``local-cluster[...]``, ``spark://host:port[,host:port]``, ``yarn``,
#: ``k8s://...``.
SPARK_MASTER = re.compile(
    r"^(local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?"
    r"|local-cluster\[[1-9]\d*,[1-9]\d*,[1-9]\d*\]"
    r"|spark://[\w.-]+:\d+(,[\w.-]+:\d+)*"
    r"|yarn|k8s://\S+)$"
)
#: What :data:`SPARK_MASTER` admits, in words.
SPARK_MASTER_FORMS = "local[*], local[N], spark://host:port, yarn or k8s://..."


def spark_master(value: Any) -> str:
    """``value`` when Spark can start on it as a master URL; else a ConfigError, before a
    JVM starts (Spark's own refusal is a stack trace)."""
    text = str(value).strip()
    if not SPARK_MASTER.match(text):
        raise ConfigError(f"master must be {SPARK_MASTER_FORMS}, got {text!r}")
    return text


def whole_number(value: Any, name: str, minimum: int = 1, maximum: int = JAVA_INT_MAX) -> int:
    """A whole number from ``minimum`` to ``maximum`` read from a flag, param or
    environment variable. The bound keeps a mistyped value (a digit too many) from
    passing here and failing later, in Spark or in date arithmetic, after a restart DAG
    stopped the stream or a command touched the lake.

    :raises ConfigError: naming the setting and the range, for anything else.
    """
    wanted = f"{name} must be a whole number from {minimum} to {maximum}, got {value!r}"
    if isinstance(value, bool):
        raise ConfigError(wanted)
    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(wanted) from None
    if not minimum <= number <= maximum:
        raise ConfigError(wanted)
    return number


def _kafka_bootstrap(value: Any) -> str:
    """``HOST:PORT[,HOST:PORT...]`` checked server by server (Kafka's own client would only
    log a warning and retry forever on a typo)."""
    servers = [part.strip() for part in str(value).split(",")]
    for server in servers:
        match = _KAFKA_SERVER.match(server)
        if not match or not 1 <= int(match.group(2)) <= 65535:
            raise ConfigError(
                f"kafka-bootstrap must be HOST:PORT[,HOST:PORT...], got {value!r} "
                f"({server!r} is not a host and a port from 1 to 65535)"
            )
    return ",".join(servers)


def _kafka_topic(value: Any) -> str:
    topic = str(value)
    if not _KAFKA_TOPIC.match(topic) or topic in (".", ".."):
        raise ConfigError(
            f"topic must be a Kafka topic name (1 to 249 of letters, digits, '.', '_', "
            f"'-'), got {value!r}"
        )
    return topic


#: Kafka client settings a ``--kafka-properties`` file may not hold: sessionlake sets them
#: itself, or Spark's Kafka source refuses them. Each names what to use instead.
KAFKA_PROPERTIES_REFUSED = {
    "bootstrap.servers": "--kafka-bootstrap sets the brokers",
    "auto.offset.reset": "--starting-offsets says where a new checkpoint starts",
    "enable.auto.commit": "the offsets read live in the stream's checkpoint",
    "key.deserializer": "Spark reads keys and values as bytes",
    "value.deserializer": "Spark reads keys and values as bytes",
    "interceptor.classes": "Spark's Kafka source does not support interceptors",
}


def read_kafka_properties(path: str) -> dict[str, str]:
    """The Kafka client settings of a Java properties file (``--kafka-properties``): the
    ``security.protocol``, ``sasl.*`` and ``ssl.*`` a secured cluster needs, or client
    tuning such as ``request.timeout.ms``. They go to Spark's Kafka source (as
    ``kafka.<key>``) and to sessionlake's own look-ups of the topic.

    They live in a file, in Kafka's own format (the file ``kafka-console-consumer
    --consumer.config`` reads), so that passwords stay out of command lines, process lists,
    Airflow's task logs and the lake's stream register.

    :raises ConfigError: the file is unreadable or not a properties file, or it sets a key
        of :data:`KAFKA_PROPERTIES_REFUSED`.
    """
    import javaproperties  # only drivers reading Kafka need it

    try:
        with open(path, encoding="utf-8") as file:
            properties = dict(javaproperties.load(file))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ConfigError(f"kafka-properties: cannot read {path} ({error})") from None
    for key in properties:
        bare = key.removeprefix("kafka.")
        if bare in KAFKA_PROPERTIES_REFUSED:
            raise ConfigError(f"kafka-properties: {path} sets {key}, which sessionlake does "
                              f"not take from it: {KAFKA_PROPERTIES_REFUSED[bare]}")
        if bare != key:
            raise ConfigError(f"kafka-properties: {path} sets {key}: write Kafka's own "
                              f"name, {bare}, without the kafka. prefix")
    return properties


def _kafka_properties_file(value: Any) -> str:
    """The absolute path of a readable, valid ``--kafka-properties`` file."""
    path = os.path.abspath(os.path.expanduser(str(value)))
    read_kafka_properties(path)
    return path


def _fraction(value: Any, name: str) -> float:
    try:
        number = float(str(value))
    except ValueError:
        raise ConfigError(f"{name} must be a number from 0 to 1, got {value!r}") from None
    if not 0.0 <= number <= 1.0:
        raise ConfigError(f"{name} must be a number from 0 to 1, got {value!r}")
    return number


@dataclass(frozen=True)
class Settings:
    """Validated settings of one sessionlake run or maintenance task.

    Durations are :class:`~datetime.timedelta`; locations are paths or URIs
    (``/data/lake``, ``file:///data/lake``, ``s3a://bucket/lake``).
    """

    lake: str
    source: str | None = None
    checkpoint_dir: str | None = None
    input_format: InputFormat = "jsonl"
    gap: timedelta = timedelta(minutes=30)
    grace: timedelta = timedelta(minutes=5)
    max_session_duration: timedelta = timedelta(hours=24)
    max_future_skew: timedelta = timedelta(hours=1)
    trigger: Trigger = "available-now"
    processing_interval: timedelta = timedelta(seconds=10)
    shuffle_partitions: int = 4
    max_files_per_trigger: int | None = None
    #: Switch a stream begun before sessionlake read the landing folder's subfolders to
    #: reading them (see :func:`sessionlake.stream.reads_subfolders`); newer ones do.
    read_subfolders: bool = False
    master: str = "local[*]"
    user_buckets: int = 16
    #: A batch that takes longer than this logs an ``ALERT`` line (see sessionlake.monitor).
    alert_batch_duration: timedelta = timedelta(minutes=5)
    #: Input waiting and no batch committed for longer than this: the health page and its
    #: status (``/api/health/status``, 503) say the stream has stalled. Three micro-batch
    #: DAG periods.
    alert_stalled_after: timedelta = 3 * MICROBATCH_PERIOD
    #: A batch whose late records exceed this fraction of its input logs an ``ALERT`` line.
    alert_late_fraction: float = 0.1
    #: A batch whose quarantined records exceed this fraction of its input logs an
    #: ``ALERT`` line: most likely the wrong ``--format`` on a new stream.
    alert_quarantine_fraction: float = 0.5
    #: With ``source="kafka"``: the brokers, as ``HOST:PORT[,HOST:PORT...]``.
    kafka_bootstrap: str | None = None
    #: With ``source="kafka"``: the topic read (every partition, new ones included).
    kafka_topic: str | None = None
    #: Where a new checkpoint starts in the topic; a restart resumes from its checkpoint.
    kafka_starting_offsets: StartingOffsets = "earliest"
    #: At most this many records per micro-batch, over all partitions (Spark splits it
    #: between partitions in proportion to their backlog).
    kafka_max_offsets_per_trigger: int | None = None
    #: Skip, with a warning, records deleted from the topic before the stream read them,
    #: instead of refusing to run (``--accept-kafka-data-loss``, for one run: no variable).
    kafka_accept_data_loss: bool = False
    #: With a continuous trigger: the wait before the run starts its query again after a
    #: batch failed because Kafka's brokers stopped answering as it read its records, or
    #: because an executor holding its rows was lost; each failure that follows another
    #: without a batch committed between waits twice the last, up to twelve times this
    #: (``sessionlake.monitor.reread_waits``).
    kafka_reread_wait: timedelta = timedelta(seconds=5)
    #: With ``source="kafka"``: a Java properties file of Kafka client settings, such as a
    #: secured cluster's (:func:`read_kafka_properties`). Only its path is kept here.
    kafka_properties: str | None = None

    @property
    def checkpoint(self) -> str:
        """The streaming checkpoint: ``--checkpoint`` or ``<lake>/_checkpoints/stream``."""
        return self.checkpoint_dir or f"{self.lake.rstrip('/')}/_checkpoints/stream"

    @property
    def reads_kafka(self) -> bool:
        """Whether the source is a Kafka topic (``--source kafka``) rather than a folder."""
        return self.source == KAFKA_SOURCE

    def kafka_client_properties(self) -> dict[str, str]:
        """The settings of the ``kafka_properties`` file, read now (empty without one)."""
        return read_kafka_properties(self.kafka_properties) if self.kafka_properties else {}

    def with_overrides(self, **values: Any) -> Settings:
        """A copy with some values replaced and validated again."""
        return settings_from(values, env={}, base=self)


def _pick(values: Mapping[str, Any], env: Mapping[str, str], key: str) -> Any:
    value = values.get(key)
    if value is None and key in ENV:
        value = env.get(ENV[key]) or None
    return value


def positive_int(value: Any, name: str) -> int:
    """A whole number from 1 to :data:`JAVA_INT_MAX` (:func:`whole_number`, which it
    was before the upper bound)."""
    return whole_number(value, name)


def conflict_attempts() -> int:
    """How often a Delta commit that lost a race is tried: ``$SESSIONLAKE_CONFLICT_ATTEMPTS``,
    8 (see :mod:`sessionlake.conflicts`).

    :raises ConfigError: naming the variable, when it is no positive whole number.
    """
    return whole_number(os.environ.get("SESSIONLAKE_CONFLICT_ATTEMPTS", "8"),
                        "SESSIONLAKE_CONFLICT_ATTEMPTS")


def restart_timeout() -> float:
    """Seconds to wait for a run to stop or to resume: ``$SESSIONLAKE_RESTART_TIMEOUT``
    (seconds, or a duration such as ``10m``, more than 0), 300.

    :raises ConfigError: naming the variable, when it is no duration.
    """
    value = os.environ.get("SESSIONLAKE_RESTART_TIMEOUT", "300")
    seconds = parse_duration(value, "SESSIONLAKE_RESTART_TIMEOUT").total_seconds()
    if seconds <= 0:  # a stop would give up at once, leaving the stream stopped
        raise ConfigError(f"SESSIONLAKE_RESTART_TIMEOUT must be longer than 0, got {value!r}: "
                          "how long a stop waits for the batch in flight to commit, and a "
                          "start for the first batch")
    return seconds


def check_process_environment() -> None:
    """Refuse a wrong value of a variable read deep inside a command that writes, before
    it touches any data: otherwise it would surface only where first needed, a batch's
    first lost commit race, after other tables had taken the batch. (The restart and
    restore DAGs read ``SESSIONLAKE_RESTART_TIMEOUT`` before they stop anything.)

    :raises ConfigError: naming the variable.
    """
    conflict_attempts()


def settings_from(
    values: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    base: Settings | None = None,
) -> Settings:
    """Build validated :class:`Settings` from explicit values, the environment and defaults.

    :param values: explicit values by field name (``None`` means "not given").
    :param env: the environment to read ``SESSIONLAKE_*`` from (default ``os.environ``).
    :param base: settings to start from instead of the defaults.
    :return: settings whose every field has been checked.
    :raises ConfigError: naming the first wrong setting.
    """
    values = dict(values or {})
    env = os.environ if env is None else env
    current: dict[str, Any] = {}
    for key in Settings.__dataclass_fields__:
        picked = _pick(values, env, key if key != "checkpoint_dir" else "checkpoint")
        if key == "checkpoint_dir" and picked is None:
            picked = values.get("checkpoint_dir")
        if picked is not None:
            current[key] = picked
    from_env = {key for key in current if values.get(key) is None and key in ENV}

    lake = current.get("lake", base.lake if base else None)
    if not lake or not str(lake).strip():
        raise ConfigError(
            f"no lake location: pass --lake DIR or set {ENV['lake']}"
        )
    lake = absolute_location(str(lake))
    merged = replace(base, lake=lake) if base else Settings(lake=lake)
    updates: dict[str, Any] = {}

    def check(key: str, value_of: Callable[[Any], Any]) -> None:
        """``updates[key]`` from ``current[key]``; an error names the variable it came
        from, when it came from one (the flag's name alone would mislead there)."""
        try:
            updates[key] = value_of(current[key])
        except ConfigError as error:
            if key not in from_env:
                raise
            raise ConfigError(f"{error} (from {ENV[key]})") from None

    for key in ("source", "checkpoint_dir"):
        if key in current:
            updates[key] = (KAFKA_SOURCE if key == "source" and current[key] == KAFKA_SOURCE
                            else absolute_location(str(current[key])))
    if "master" in current:
        check("master", spark_master)
    for key, name, choices in (("input_format", "format", INPUT_FORMATS),
                               ("trigger", "trigger", TRIGGERS),
                               ("kafka_starting_offsets", "starting-offsets", STARTING_OFFSETS)):
        if key in current:
            check(key, partial(_one_of, choices=choices, name=name))
    for key in ("gap", "grace", "max_session_duration", "max_future_skew",
                "processing_interval", "alert_batch_duration", "alert_stalled_after",
                "kafka_reread_wait"):
        if key in current:
            check(key, partial(parse_duration, name=key.replace("_", "-")))
    if "kafka_bootstrap" in current:
        check("kafka_bootstrap", _kafka_bootstrap)
    if "kafka_topic" in current:
        check("kafka_topic", _kafka_topic)
    if "kafka_properties" in current:
        check("kafka_properties", _kafka_properties_file)
    for key in ("shuffle_partitions", "max_files_per_trigger", "user_buckets",
                "kafka_max_offsets_per_trigger"):
        if key in current:
            check(key, partial(whole_number, name=key.removeprefix("kafka_").replace("_", "-"),
                               maximum=JAVA_LONG_MAX if key.startswith("kafka_")
                               else JAVA_INT_MAX))
    for key in ("read_subfolders", "kafka_accept_data_loss"):
        if key in current:
            updates[key] = bool(current[key])
    for key in ("alert_late_fraction", "alert_quarantine_fraction"):
        if key in current:
            check(key, partial(_fraction, name=key.replace("_", "-")))
    settings = replace(merged, **updates)

    if settings.gap <= timedelta(0):
        raise ConfigError(f"gap must be longer than 0, got {format_duration(settings.gap)}")
    if settings.max_session_duration < settings.gap:
        raise ConfigError(
            "max-session-duration must be at least the gap "
            f"({format_duration(settings.max_session_duration)} < "
            f"{format_duration(settings.gap)})"
        )
    if settings.processing_interval <= timedelta(0):
        raise ConfigError("processing-interval must be longer than 0")
    if settings.kafka_reread_wait <= timedelta(0):
        raise ConfigError("kafka-reread-wait must be longer than 0")
    return settings

"""Validation shared by every format.

A candidate event either becomes a valid event or a quarantine row with a reason; nothing
else leaves the pipeline here. Whether a valid event repeats one already seen (same user,
same ``event_id``) is decided with its session (:func:`sessionlake.sessionize.sessionize_batch`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sessionlake.config import format_duration
from sessionlake.sources import KAFKA_SCHEME

#: Longest record parsed; a longer one is quarantined with its first MAX_RECORD_CHARS.
MAX_RECORD_CHARS = 1 << 20

EVENT_COLUMNS: tuple[str, ...] = (
    "event_id", "user_id", "event_time", "event_type", "page", "properties",
    "source_file", "source_line",
)


def cap_record_size(lines: DataFrame) -> DataFrame:
    """Cut every line to one character more than :data:`MAX_RECORD_CHARS` before parsing.

    A multi-megabyte line is almost always a broken producer (a binary blob, a missing
    newline); parsing it whole would only cost memory. The extra character lets
    :func:`apply_guards` tell that the record was longer than the limit.
    """
    line = F.col("line")
    # A line's bytes bound its characters, so only a long line is measured and cut.
    return lines.withColumn("line", F.when(F.octet_length(line) > MAX_RECORD_CHARS,
                                           F.substring(line, 1, MAX_RECORD_CHARS + 1))
                            .otherwise(line))


def apply_guards(
    candidates: DataFrame, processing_time: datetime, max_future_skew: timedelta
) -> DataFrame:
    """Add the format-independent reasons and derive missing event ids.

    * A record too long to parse keeps its cut raw text and says so.
    * An event more than ``max_future_skew`` ahead of the batch clock is quarantined, so
      that one producer with a wrong clock cannot push the watermark forward and close
      every open session.
    * An event without an id gets one from where the record sits (see
      :func:`derived_event_id`): a replayed file is recognised as a duplicate, while two
      identical lines stay two events.
    * ``raw`` is kept for quarantined records only: the batch holds these rows in memory,
      and a valid record's text, parsed into its columns, would double their size.
    """
    horizon = F.lit(processing_time + max_future_skew).cast("timestamp")
    # Characters are counted only where the bytes could be too many: counting scans the line.
    too_long = (F.octet_length("raw") > MAX_RECORD_CHARS) & (F.length("raw") > MAX_RECORD_CHARS)
    reason: Column = (
        F.when(too_long, F.lit(f"record longer than {MAX_RECORD_CHARS} characters"))
        .when(F.col("reason").isNotNull(), F.col("reason"))
        .when(
            F.col("event_time") > horizon,
            F.concat(
                F.lit("event_time "), F.date_format("event_time", "yyyy-MM-dd'T'HH:mm:ss'Z'"),
                F.lit(f" is more than {format_duration(max_future_skew)} ahead of the "
                      f"processing time {processing_time.isoformat()}"),
            ),
        )
    )
    return candidates.select(
        F.coalesce("event_id", derived_event_id()).alias("event_id"),
        "user_id", "event_time", "event_type", "page", "properties",
        "source_file", "source_line",
        "raw", too_long.alias("raw_truncated"), reason.alias("reason"),
    ).withColumn(
        "raw",
        F.when(F.col("reason").isNotNull(), F.substring("raw", 1, MAX_RECORD_CHARS)),
    )


def derived_event_id() -> Column:
    """The id of an event that has none: where its record sits in the input.

    ``<file>#<line>`` for a file (the path relative to the landing folder), and
    ``<topic>/<partition>/<offset>`` for a Kafka record, whose ``source_file`` is
    ``kafka://<topic>/<partition>``: both are stable under replay and distinct for two
    identical records.
    """
    line = F.col("source_line").cast("string")
    return F.when(
        F.col("source_file").startswith(KAFKA_SCHEME),
        F.concat(F.substring("source_file", len(KAFKA_SCHEME) + 1, 1 << 16), F.lit("/"), line),
    ).otherwise(F.concat_ws("#", "source_file", line))


def derived_from_kafka_offset() -> Column:
    """Whether a valid event's id is the one :func:`derived_event_id` gave a Kafka record
    without one: ``<topic>/<partition>/<offset>``, which no earlier batch of the stream can
    hold (a checkpoint reads each offset once; a replay is the ledger's, a restore brings
    the tables back with it). The duplicate check leaves these out: such ids do not sort
    by time, so it would read the day's events for nothing, and a topic created anew, read
    on a checkpoint of its own, would find its records taken for the old topic's."""
    return F.col("source_file").startswith(KAFKA_SCHEME) & \
        (F.col("event_id") == derived_event_id())


def quarantined(guarded: DataFrame) -> DataFrame:
    """The records that failed a rule, with their raw text and reason."""
    return guarded.where(F.col("reason").isNotNull()).select(
        "raw", "raw_truncated", "source_file", "source_line",
        F.when(F.trim("user_id") != "", F.col("user_id")).alias("user_id"), "reason",
    )


def valid_events(guarded: DataFrame) -> DataFrame:
    """The records that passed every rule, as events."""
    return guarded.where(F.col("reason").isNull()).select(*EVENT_COLUMNS)

"""Source adapters: raw lines in, candidate events out.

Lines come from a landing folder's files (:func:`number_lines`) or from a Kafka topic's
records (:func:`kafka_lines`), in the same three columns, so every format and every rule
after this point is shared.

Every input format is an adapter with one method, :meth:`SourceAdapter.parse`, that turns
a DataFrame of lines (``source_file``, ``source_line``, ``line``) into the candidate-event
shape below, with a ``reason`` column that is null for a record that parsed and says what
is wrong otherwise. Validation rules shared by all formats (future skew, record size)
and the split into accepted and quarantined records live in :mod:`sessionlake.validation`.

Candidate-event columns: ``event_id`` (null when the record has none), ``user_id``,
``event_time``, ``event_type``, ``page``, ``properties``, ``source_file``, ``source_line``,
``raw``, ``reason``.
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from pyspark.sql import Column, DataFrame, DataFrameReader, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamReader
from pyspark.sql.types import MapType, StringType

#: Top-level fields of the jsonl event model; any other field is kept in ``properties``.
JSONL_FIELDS: tuple[str, ...] = (
    "user_id", "event_time", "event_id", "event_type", "page", "properties",
)
#: An ISO-8601 date and time (RFC 3339's lower-case ``t`` and ``z`` too), with optional
#: fraction (after a point or ISO's comma) and offset (no offset means UTC).
ISO_TIMESTAMP = (
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}([.,]\d{1,9})?)?"
    r"(Z|z|[+-]\d{2}(:?\d{2})?)?$"
)
#: Apache/NGINX combined log format: client, identity, user, [time], "request", status,
#: bytes, then "referer" "agent" (optional, for the common log format) and nothing else:
#: a line cut inside a quoted field is not a log line.
COMBINED_LOG = (
    r'^(\S+) (\S+) (\S+) \[([^\]]+)\] "([^"]*)" (\d{3}) (\S+)'
    r'(?: "((?:[^"\\]|\\.)*)" "((?:[^"\\]|\\.)*)")?\s*$'
)
APACHE_TIME_FORMAT = "dd/MMM/yyyy:HH:mm:ss Z"
#: ``source_file`` of a Kafka record is ``kafka://<topic>/<partition>``.
KAFKA_SCHEME = "kafka://"

#: The string fields of the event model, and the two shapes a jsonl line is read into.
_JSONL_STRINGS: tuple[str, ...] = JSONL_FIELDS[:5]
_JSONL_TEXT = ", ".join(f"{f} string" for f in _JSONL_STRINGS)
_JSONL_VARIANTS = "struct<" + ", ".join(f"{f}: variant" for f in JSONL_FIELDS) + ">"

CANDIDATE_COLUMNS: tuple[str, ...] = (
    "event_id", "user_id", "event_time", "event_type", "page", "properties",
    "source_file", "source_line", "raw", "reason",
)


def iso_time(text: Column) -> Column:
    """``text`` as a UTC timestamp, for every form :data:`ISO_TIMESTAMP` admits; null where
    it cannot be read as one.

    Spark's parser reads most ISO-8601 forms as they are, but not a time without seconds
    that carries an offset (``10:00Z``, ``10:00+01:00``), a lower-case ``t`` or ``z``, nor
    a fraction after a comma: those are read again written out in full. Only what the
    first parse could not read is parsed twice, so the usual forms cost no more. A
    fraction finer than a microsecond, Spark's precision, is cut to the microsecond.
    """
    full = text
    for pattern, replacement in ((r"^(.{10})t", "$1T"), (r"^(.{19}),", "$1."), (r"z$", "Z"),
                                 (r"^(.{10}[T ]\d{2}:\d{2})(?=[Z+-]|$)", "$1:00")):
        full = F.regexp_replace(full, pattern, replacement)
    return F.coalesce(F.try_to_timestamp(text), F.try_to_timestamp(full))


class SourceAdapter(Protocol):
    """An input format: how lines become candidate events."""

    name: str

    def parse(self, lines: DataFrame) -> DataFrame:
        """Candidate events (see module docstring) for ``lines``, one row per line."""
        ...


def _first_reason(*checks: tuple[Column, Column | str]) -> Column:
    """The message of the first failing check, or null when every check passes."""
    expr: Column | None = None
    for failed, message in checks:
        msg = message if isinstance(message, Column) else F.lit(message)
        expr = F.when(failed, msg) if expr is None else expr.when(failed, msg)
    assert expr is not None
    return expr.otherwise(F.lit(None).cast("string"))


class JsonLinesAdapter:
    """One JSON object per line, in SPEC's event model, checked field by field.

    Types are checked strictly (a numeric ``user_id`` is quarantined, not coerced), because
    a silently coerced id splits one user's history in two.
    """

    name = "jsonl"

    def parse(self, lines: DataFrame) -> DataFrame:
        """Candidate events for JSON lines; see :class:`SourceAdapter`.

        Each line is read twice, once for each cheap thing a reader gives: as a variant
        (whether it is JSON, an object, and each field's JSON type) and by the JSON reader
        into string fields (their text). Turning a variant's strings into SQL strings
        costs more than the second parse: 1,000,000 generated lines took 9.5 s to parse
        and guard (warm, 2 cores) with every field read from the variant, 5.1 s this way.

        Both readers stop after the line's first JSON value and ignore what follows, so a
        line of two events (``{...} {...}``) would keep the first and lose the second
        unseen. The variant is therefore read from the line inside ``[...]``: text after
        the first value then makes the whole invalid JSON, or a second element.
        """
        listed = F.try_parse_json(F.concat(F.lit("["), "line", F.lit("]")))
        frame = lines.select(
            "source_file", "source_line", F.col("line").alias("raw"), listed.alias("listed"),
            F.from_json("line", _JSONL_TEXT, {"mode": "PERMISSIVE"}).alias("text"),
        ).select(
            "source_file", "source_line", "raw", "text",
            F.try_variant_get("listed", "$[0]", "variant").alias("v"),
            F.try_variant_get("listed", "$[1]", "variant").isNotNull().alias("more"),
        ).select(
            "source_file", "source_line", "raw", "v", "more", "text",
            F.try_variant_get("v", "$", _JSONL_VARIANTS).alias("fields"),
            F.size(F.try_variant_get("v", "$", "map<string,variant>")).alias("keys"),
        ).select(
            "source_file", "source_line", "raw", "v", "more", "fields", "keys",
            *[F.schema_of_variant(F.col("fields")[f]).alias(f"type_{f}")
              for f in JSONL_FIELDS],
            *[F.col("text")[f].alias(f"text_{f}") for f in _JSONL_STRINGS],
            F.try_variant_get(F.col("fields")["properties"], "$", "map<string,string>")
            .alias("props"),
            # Parsed once here: the check and the event's column both read it.
            iso_time(F.col("text")["event_time"]).alias("event_time"),
        )

        def present(f: str) -> Column:
            return F.col(f"type_{f}").isNotNull() & (F.col(f"type_{f}") != "VOID")

        def string_field(f: str) -> tuple[Column, str]:
            return (present(f) & (F.col(f"type_{f}") != "STRING"), f"{f} must be a string")

        reason = _first_reason(
            # Only a Kafka record gets here blank (a file's blank lines are not records):
            # a tombstone (null value) or an empty or blank value.
            (F.trim("raw") == "", "empty record (no value, or a blank one)"),
            (F.col("v").isNull(), "invalid JSON"),
            (F.col("more"), "more than one JSON value on the line"),
            (F.col("fields").isNull(), "not a JSON object"),
            (~present("user_id"), "missing user_id"),
            string_field("user_id"),
            (F.trim("text_user_id") == "", "user_id must not be empty"),
            (~present("event_time"), "missing event_time"),
            (F.col("type_event_time") != "STRING",
             "event_time must be an ISO-8601 string"),
            (~F.col("text_event_time").rlike(ISO_TIMESTAMP) | F.col("event_time").isNull(),
             F.concat(F.lit("event_time is not an ISO-8601 timestamp: "),
                      F.substring("text_event_time", 1, 100))),
            string_field("event_id"),
            (present("event_id") & (F.trim("text_event_id") == ""),
             "event_id must not be empty"),
            string_field("event_type"),
            string_field("page"),
            (present("properties") & ~F.col("type_properties").startswith("OBJECT"),
             "properties must be an object"),
        )
        # Fields beyond the event model are kept in properties as the JSON reader's text;
        # only a record that has some (more keys than known fields) is read for them.
        known = sum((F.col("fields")[f].isNotNull().cast("int") for f in JSONL_FIELDS),
                    F.lit(0))
        extras = F.map_filter(
            F.from_json("raw", MapType(StringType(), StringType()).simpleString(),
                        {"mode": "PERMISSIVE"}),
            lambda k, _: ~k.isin(*JSONL_FIELDS),
        )
        # A field named both at the top level and in properties keeps the properties'
        # value: Spark refuses a map with a key twice, which failed the batch for good.
        given = F.coalesce("props", F.create_map())
        properties = F.when(
            F.col("keys") > known,
            F.map_concat(
                F.map_filter(extras, lambda k, _: ~F.array_contains(F.map_keys(given), k)),
                given),
        ).otherwise(F.col("props"))
        return frame.select(
            F.col("text_event_id").alias("event_id"),
            F.col("text_user_id").alias("user_id"),
            "event_time",
            # Blank is absent: a type's default, no page (not a page named "").
            F.coalesce(_unless_blank("text_event_type"), F.lit("event")).alias("event_type"),
            _unless_blank("text_page").alias("page"),
            properties.cast("map<string,string>").alias("properties"),
            "source_file", "source_line", "raw",
            reason.alias("reason"),
        )


def _unless_blank(name: str) -> Column:
    """The string column ``name``, null where it is empty or blank."""
    return F.when(F.trim(name) != "", F.col(name))


class ApacheAccessLogAdapter:
    """Apache/NGINX combined access logs: the user is the client address, the event time
    the log time, ``page`` the request path and ``event_type`` the HTTP method; status,
    size, query, referer and agent are kept in ``properties``."""

    name = "apache"

    def parse(self, lines: DataFrame) -> DataFrame:
        """Candidate events for access-log lines; see :class:`SourceAdapter`."""
        def group(i: int) -> Column:
            return F.regexp_extract("line", COMBINED_LOG, i)

        matched = F.col("line").rlike(COMBINED_LOG)
        frame = lines.select(
            "source_file", "source_line", F.col("line").alias("raw"),
            matched.alias("matched"),
            group(1).alias("client"), group(4).alias("time_text"),
            group(5).alias("request"), group(6).alias("status"), group(7).alias("bytes"),
            group(8).alias("referer"), group(9).alias("agent"),
        )
        request = F.split("request", " ")
        target = F.try_element_at(request, F.lit(2))
        event_time = F.try_to_timestamp(F.col("time_text"), F.lit(APACHE_TIME_FORMAT))
        reason = _first_reason(
            (~F.col("matched"), "not a combined access log line"),
            (event_time.isNull(),
             F.concat(F.lit("unreadable log time: "), F.col("time_text"))),
            (F.size(request) < 2, "request line has no method and path"),
        )
        properties = F.map_filter(
            F.create_map(
                F.lit("status"), F.col("status"),
                F.lit("bytes"), F.col("bytes"),
                F.lit("query"), F.regexp_extract(target, r"\?(.*)$", 1),
                F.lit("referer"), F.col("referer"),
                F.lit("user_agent"), F.col("agent"),
            ),
            lambda _, value: (value != "") & (value != "-"),
        )
        return frame.select(
            F.lit(None).cast("string").alias("event_id"),
            F.col("client").alias("user_id"),
            event_time.alias("event_time"),
            F.try_element_at(request, F.lit(1)).alias("event_type"),
            F.regexp_replace(target, r"\?.*$", "").alias("page"),
            properties.alias("properties"),
            "source_file", "source_line", "raw",
            reason.alias("reason"),
        )


ADAPTERS: dict[str, SourceAdapter] = {
    adapter.name: adapter for adapter in (JsonLinesAdapter(), ApacheAccessLogAdapter())
}


def adapter_for(input_format: str) -> SourceAdapter:
    """The adapter of ``input_format`` (``jsonl`` or ``apache``)."""
    try:
        return ADAPTERS[input_format]
    except KeyError:
        raise ValueError(
            f"unknown input format {input_format!r}: use one of {', '.join(ADAPTERS)}"
        ) from None


#: The line ending of a landing file: a line feed (a carriage return before it is dropped
#: by :func:`number_lines`; one alone ends no line, as it did when files were read whole).
LINE_SEPARATOR = "\n"

_Reader = TypeVar("_Reader", DataFrameReader, DataStreamReader)


def file_lines(reader: _Reader, path: str) -> DataFrame:
    """The lines of the files under ``path``, as :func:`number_lines` takes them.

    ``reader`` is ``spark.read`` or ``spark.readStream``, with its own options set (the
    stream's file options). A file is read line by line, in splits when it is large, so
    its size is bounded by the disk, not by memory.

    :return: ``line``, ``file_path`` (the file's URI) and ``file_block_start`` (where the
        split the line was read in starts).
    """
    return reader.format("text").option("lineSep", LINE_SEPARATOR).load(path).select(
        F.col("value").alias("line"),
        F.col("_metadata.file_path").alias("file_path"),
        F.col("_metadata.file_block_start").alias("file_block_start"),
    )


def number_lines(lines: DataFrame, source_root_path: str) -> DataFrame:
    """One row per non-blank line of ``lines``, numbered from 1 in its file.

    A line's number is where it stands in its file, whatever splits the file was read in
    (their sizes follow the cluster's parallelism): it names the line in quarantine rows and
    in the ids derived for events without one, so a replay must find the same number. A
    split's lines come in order and together, so each line's place in its split plus the
    lines of the file's earlier splits is its number. Counting the splits' lines is a
    second pass over the batch's text (a stream's batch frame is read again whole for it:
    about 2.3 s of a cold million-line batch, see docs/performance.md); the counts are few,
    and broadcast.

    :param lines: :func:`file_lines` straight from a read (no shuffle in between: the
        lines must still be in their splits' order).
    :param source_root_path: the path part of the source folder; file names are kept
        relative to it, so the derived event ids survive a move of the landing folder.
    :return: ``source_file``, ``source_line`` and ``line`` (without its line ending).
    """
    split = ["file_path", "file_block_start"]
    read = lines.withColumn("read_order", F.monotonically_increasing_id())
    earlier_splits = Window.partitionBy("file_path").orderBy("file_block_start")
    splits = read.groupBy(*split).agg(
        F.min("read_order").alias("split_first"), F.count("*").alias("split_lines"),
    ).select(*split, "split_first",
             (F.sum("split_lines").over(earlier_splits) - F.col("split_lines"))
             .alias("lines_before"))
    root = source_root_path.rstrip("/") + "/"
    relative = F.when(
        F.instr("file_path", root) > 0,
        F.substring_index("file_path", root, -1),
    ).otherwise(F.col("file_path"))
    numbered = read.join(F.broadcast(splits), split).select(
        relative.alias("source_file"),
        (F.col("read_order") - F.col("split_first") + F.col("lines_before") + 1)
        .cast("long").alias("source_line"),
        "line",
    )
    line = F.col("line")
    # Only a line that needs it is copied: most lines end without a carriage return and
    # start with a record, and a line is a million-row batch's unit of work.
    return numbered.select(
        "source_file",
        "source_line",
        F.when(line.endswith("\r"), F.rtrim(line, F.lit("\r"))).otherwise(line).alias("line"),
    ).where(F.when(line.startswith("{"), True).otherwise(F.trim(line) != ""))


def source_file_of(uri: str, source_root_path: str) -> str:
    """The ``source_file`` :func:`number_lines` gives the lines of the file at ``uri`` (as
    Spark names it, escaped): the part after the source folder, else the whole URI."""
    root = source_root_path.rstrip("/") + "/"
    return uri.rsplit(root, 1)[-1] if root in uri else uri


def kafka_lines(records: DataFrame) -> DataFrame:
    """One line per Kafka record, in the columns :func:`number_lines` gives for files.

    Each record's value is one record of the input format (a jsonl event, usually); a
    trailing line ending is dropped. ``source_file`` is ``kafka://<topic>/<partition>`` and
    ``source_line`` the record's offset, so a record is named by where it sits in the log:
    quarantine rows point at it, and an event without an ``event_id`` gets
    ``<topic>/<partition>/<offset>`` (see :func:`sessionlake.validation.apply_guards`), which
    a replay of the same offsets reproduces.

    The record's Kafka timestamp is deliberately not used: ``event_time`` is required by the
    event model, and the producer's send time (or the broker's append time) is not when the
    event happened, so an event without one is quarantined like a file's. An empty or null
    value is a record too, and is quarantined rather than dropped.

    :param records: Kafka source rows (``topic``, ``partition``, ``offset``, ``value``).
    :return: ``source_file``, ``source_line`` and ``line``.
    """
    return records.select(
        F.concat(F.lit(KAFKA_SCHEME), F.col("topic"), F.lit("/"),
                 F.col("partition").cast("string")).alias("source_file"),
        F.col("offset").cast("long").alias("source_line"),
        F.regexp_replace(F.coalesce(F.col("value").cast("string"), F.lit("")),
                         r"\r?\n$", "").alias("line"),
    )

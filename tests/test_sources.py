"""Source adapters: every malformed-record kind gets its reason; good records parse."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sessionlake.sources import (
    ADAPTERS,
    CANDIDATE_COLUMNS,
    ApacheAccessLogAdapter,
    JsonLinesAdapter,
    adapter_for,
    file_lines,
    kafka_lines,
    number_lines,
    source_file_of,
)
from sessionlake.validation import MAX_RECORD_CHARS, apply_guards, cap_record_size
from tests.conftest import DATA
from tests.helpers import NOW, lines_frame

SKEW = timedelta(hours=1)


def parse(spark: SparkSession, lines: list[str], fmt: str = "jsonl") -> list[dict]:
    frame = cap_record_size(lines_frame(spark, lines))
    guarded = apply_guards(adapter_for(fmt).parse(frame), NOW, SKEW)
    return [r.asDict() for r in guarded.orderBy("source_line").collect()]


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"user_id": "u1", "event_time": ', "invalid JSON"),
        ("\x00\x01\x02binary", "invalid JSON"),
        # A second event, or anything, after the object: it would otherwise be lost unseen.
        ('{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z"} '
         '{"user_id": "u2", "event_time": "2026-01-05T10:01:00Z"}', "invalid JSON"),
        ('{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z"}\n'
         '{"user_id": "u2", "event_time": "2026-01-05T10:01:00Z"}', "invalid JSON"),
        ('{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z"} trailing', "invalid JSON"),
        ('{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z"}}', "invalid JSON"),
        ('{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z"},'
         '{"user_id": "u2", "event_time": "2026-01-05T10:01:00Z"}',
         "more than one JSON value on the line"),
        ('{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z"},null',
         "more than one JSON value on the line"),
        ("[1, 2, 3]", "not a JSON object"),
        ('"just a string"', "not a JSON object"),
        ('{"event_time": "2026-01-05T10:00:00Z"}', "missing user_id"),
        ('{"user_id": null, "event_time": "2026-01-05T10:00:00Z"}', "missing user_id"),
        ('{"user_id": 42, "event_time": "2026-01-05T10:00:00Z"}', "user_id must be a string"),
        ('{"user_id": "  ", "event_time": "2026-01-05T10:00:00Z"}',
         "user_id must not be empty"),
        ('{"user_id": "u1"}', "missing event_time"),
        ('{"user_id": "u1", "event_time": 1767607200}', "event_time must be an ISO-8601 string"),
        ('{"user_id": "u1", "event_time": "yesterday"}',
         "event_time is not an ISO-8601 timestamp: yesterday"),
        ('{"user_id": "u1", "event_time": "2026-13-45T10:00:00Z"}',
         "event_time is not an ISO-8601 timestamp: 2026-13-45T10:00:00Z"),
        ('{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z", "event_id": 7}',
         "event_id must be a string"),
        ('{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z", "event_id": ""}',
         "event_id must not be empty"),
        ('{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z", "event_type": ["a"]}',
         "event_type must be a string"),
        ('{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z", "page": {"p": 1}}',
         "page must be a string"),
        ('{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z", "properties": "x"}',
         "properties must be an object"),
        ('{"user_id": "u1", "event_time": "2030-01-05T10:00:00Z"}',
         "event_time 2030-01-05T10:00:00Z is more than 1h ahead of the processing time "
         "2026-02-01T00:00:00+00:00"),
    ],
)
def test_malformed_jsonl_records_get_a_reason(spark: SparkSession, line: str, reason: str) -> None:
    [parsed] = parse(spark, [line])
    assert parsed["reason"] == reason
    assert parsed["raw"] == line
    assert (parsed["source_file"], parsed["source_line"]) == ("f.jsonl", 1)


def test_record_longer_than_the_limit_is_quarantined_cut(spark: SparkSession) -> None:
    line = json.dumps({"user_id": "u1", "event_time": "2026-01-05T10:00:00Z",
                       "page": "x" * MAX_RECORD_CHARS})
    [parsed] = parse(spark, [line])
    assert parsed["reason"].startswith("record longer than")
    assert parsed["raw_truncated"] is True
    assert len(parsed["raw"]) == MAX_RECORD_CHARS


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        ("2026-01-05T10:00:00Z", datetime(2026, 1, 5, 10, 0)),
        ("2026-01-05T10:00:00", datetime(2026, 1, 5, 10, 0)),           # no offset: UTC
        ("2026-01-05T12:00:00+02:00", datetime(2026, 1, 5, 10, 0)),
        ("2026-01-05 10:00:00.250Z", datetime(2026, 1, 5, 10, 0, 0, 250000)),
        # Forms Spark's parser does not read as they are.
        ("2026-01-05T10:00Z", datetime(2026, 1, 5, 10, 0)),
        ("2026-01-05T10:00:00z", datetime(2026, 1, 5, 10, 0)),
        ("2026-01-05T10:00z", datetime(2026, 1, 5, 10, 0)),
        ("2026-01-05T11:00+01:00", datetime(2026, 1, 5, 10, 0)),
        ("2026-01-05T11:00+0100", datetime(2026, 1, 5, 10, 0)),
        ("2026-01-05T05:00-05", datetime(2026, 1, 5, 10, 0)),
        ("2026-01-05 10:00", datetime(2026, 1, 5, 10, 0)),
        ("2026-01-05t10:00:00z", datetime(2026, 1, 5, 10, 0)),          # RFC 3339 allows
        ("2026-01-05t10:00z", datetime(2026, 1, 5, 10, 0)),
        ("2026-01-05T10:00:00,5Z", datetime(2026, 1, 5, 10, 0, 0, 500000)),  # ISO's comma
        ("2026-01-05T11:00:00,25+01:00", datetime(2026, 1, 5, 10, 0, 0, 250000)),
        # Spark's precision is the microsecond: finer digits are cut.
        ("2026-01-05T10:00:00.123456789Z", datetime(2026, 1, 5, 10, 0, 0, 123456)),
    ],
)
def test_event_times_are_read_as_utc(spark: SparkSession, stamp: str, expected: datetime) -> None:
    [parsed] = parse(spark, [json.dumps({"user_id": "u", "event_time": stamp})])
    assert parsed["reason"] is None
    assert parsed["event_time"] == expected


def test_an_event_time_is_parsed_once(spark: SparkSession) -> None:
    """The check of an event's time and its column read one parse of it, not one each."""
    frame = JsonLinesAdapter().parse(lines_frame(spark, ['{"user_id": "u"}']))
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert len(re.findall(r"cast\([^()]*event_time[^()]* as timestamp\)", plan)) == 1, plan


def test_good_jsonl_record_keeps_every_field(spark: SparkSession) -> None:
    line = json.dumps({
        "user_id": "u1", "event_time": "2026-01-05T10:00:00Z", "event_id": "e-1",
        "event_type": "click", "page": "/a", "properties": {"plan": "pro", "n": 3},
        "new_field": True,
    })
    [parsed] = parse(spark, [line])
    assert parsed["reason"] is None
    assert (parsed["event_id"], parsed["event_type"], parsed["page"]) == ("e-1", "click", "/a")
    # Properties become strings; an unknown top-level field is kept, not dropped.
    assert parsed["properties"] == {"plan": "pro", "n": "3", "new_field": "true"}


def test_a_field_both_top_level_and_in_properties_keeps_the_properties_value(
    spark: SparkSession,
) -> None:
    """Spark refuses a map with a key twice (DUPLICATED_MAP_KEY): before, such a record
    failed its batch, and every run after, with nothing quarantined."""
    line = json.dumps({"user_id": "c", "event_time": "2026-01-05T10:09:00Z",
                       "user_agent": "X", "plan": "free",
                       "properties": {"user_agent": "Y", "n": 1}})
    [parsed] = parse(spark, [line])
    assert parsed["reason"] is None
    assert parsed["properties"] == {"user_agent": "Y", "n": "1", "plan": "free"}


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_type_or_page_is_absent(spark: SparkSession, blank: str) -> None:
    """SPEC's default type for a blank one, and no page named "" (a page view of it
    counted as a distinct page)."""
    line = json.dumps({"user_id": "u1", "event_time": "2026-01-05T10:00:00Z",
                       "event_type": blank, "page": blank})
    [parsed] = parse(spark, [line])
    assert (parsed["reason"], parsed["event_type"], parsed["page"]) == (None, "event", None)


def test_defaults_for_optional_fields(spark: SparkSession) -> None:
    lines = [json.dumps({"user_id": "u1", "event_time": "2026-01-05T10:00:00Z"})] * 2
    first, second = parse(spark, lines)
    assert first["event_type"] == "event"
    # Identical lines stay two events: the derived id names file and line.
    assert (first["event_id"], second["event_id"]) == ("f.jsonl#1", "f.jsonl#2")


def test_apache_combined_log_lines(spark: SparkSession) -> None:
    good = ('83.149.9.216 - - [17/May/2015:10:05:03 +0000] "GET /presentations/x.png?a=1 '
            'HTTP/1.1" 200 203023 "http://semicomplete.com/" "Mozilla/5.0"')
    cut = ('46.118.127.106 - - [20/May/2015:12:05:17 +0000] "GET /x.py HTTP/1.1" 200 235 "-" '
           '"Mozilla/5.0 (compatible; Googlebot/2.1')
    bad_time = '1.2.3.4 - - [17/Mai/2015:10:05:03 +0000] "GET / HTTP/1.1" 200 1 "-" "x"'
    parsed = parse(spark, [good, cut, bad_time, "garbage"], "apache")
    assert parsed[0]["reason"] is None
    assert (parsed[0]["user_id"], parsed[0]["event_type"], parsed[0]["page"]) == (
        "83.149.9.216", "GET", "/presentations/x.png")
    assert parsed[0]["event_time"] == datetime(2015, 5, 17, 10, 5, 3)
    assert parsed[0]["properties"] == {
        "status": "200", "bytes": "203023", "query": "a=1",
        "referer": "http://semicomplete.com/", "user_agent": "Mozilla/5.0",
    }
    assert [p["reason"] for p in parsed[1:]] == [
        "not a combined access log line",
        "unreadable log time: 17/Mai/2015:10:05:03 +0000",
        "not a combined access log line",
    ]


def test_real_access_log_slice_parses(spark: SparkSession) -> None:
    lines = (DATA / "apache_access_2015_head3000.log").read_text().splitlines()
    frame = lines_frame(spark, lines, "access.log")
    guarded = apply_guards(ApacheAccessLogAdapter().parse(frame), NOW, SKEW)
    assert guarded.where("reason IS NULL").count() == 3000


@pytest.mark.parametrize("fmt", sorted(ADAPTERS))
def test_every_adapter_gives_the_candidate_event_columns(spark: SparkSession, fmt: str) -> None:
    """What follows the parse is shared by every format (validation, sessionization)."""
    assert tuple(adapter_for(fmt).parse(lines_frame(spark, ["x"])).columns) == CANDIDATE_COLUMNS


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown input format 'xml'"):
        adapter_for("xml")


def test_jsonl_adapter_has_the_adapter_name() -> None:
    assert JsonLinesAdapter().name == "jsonl"


def test_kafka_records_become_lines_named_by_topic_partition_and_offset(
    spark: SparkSession,
) -> None:
    records = spark.createDataFrame([
        ("clicks", 2, 17, bytearray(b'{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z"}\n')),
        ("clicks", 0, 3, bytearray(b'{"user_id": "u2", "event_time": "2026-01-05T10:00:00Z", '
                                   b'"event_id": "own"}')),
        ("clicks", 1, 5, bytearray(b'{"user_id": "u3"}')),  # no event_time: the Kafka
        ("clicks", 1, 6, None),                             # timestamp is not used
    ], "topic string, partition int, offset long, value binary")
    lines = kafka_lines(records)
    assert lines.columns == ["source_file", "source_line", "line"]
    guarded = apply_guards(JsonLinesAdapter().parse(lines), NOW, SKEW)
    got = {(r.source_file, r.source_line): (r.event_id, r.reason) for r in guarded.collect()}
    assert got == {
        ("kafka://clicks/2", 17): ("clicks/2/17", None),  # derived: topic/partition/offset
        ("kafka://clicks/0", 3): ("own", None),
        ("kafka://clicks/1", 5): ("clicks/1/5", "missing event_time"),
        # A null value (a tombstone) is a record too, quarantined as empty.
        ("kafka://clicks/1", 6): ("clicks/1/6", "empty record (no value, or a blank one)"),
    }



def _numbered(spark: SparkSession, landing: Path) -> list[tuple[str, int, str]]:
    lines = number_lines(file_lines(spark.read, str(landing)), str(landing))
    return sorted((r.source_file, r.source_line, r.line) for r in lines.collect())


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("a\nb", [(1, "a"), (2, "b")]),
        ("a\r\nb\r\n", [(1, "a"), (2, "b")]),          # Windows line endings
        ("a\r\r\n", [(1, "a")]),                          # every trailing carriage return
        ("a\rb\n", [(1, "a\rb")]),                        # a carriage return alone ends none
        ("\n  \n{}\n", [(3, "{}")]),                      # blank lines are not records
        ("\t\n", [(1, "\t")]),                            # a tab is (and fails to parse)
        (" {\"k\": 1}\r", [(1, " {\"k\": 1}")]),          # kept as read, but for the CR
    ],
)
def test_number_lines_numbers_records_from_one(
    spark: SparkSession, tmp_path: Path, content: str, expected: list[tuple[int, str]]
) -> None:
    (tmp_path / "day").mkdir()
    (tmp_path / "day" / "f.jsonl").write_bytes(content.encode())
    numbered = _numbered(spark, tmp_path / "day")
    assert [(number, line) for _, number, line in numbered] == expected
    assert {name for name, _, _ in numbered} <= {"f.jsonl"}


def test_source_file_of_names_a_file_as_its_lines_are_named(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The name a batch gives a file's records, from the URI its source log keeps: what
    keeps an erased user's records out of a file read again must match them."""
    for name in ("a.jsonl", "sub/b c.jsonl", "d%e.jsonl"):
        (tmp_path / "land" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "land" / name).write_text("{}\n")
    lines = file_lines(spark.read.option("recursiveFileLookup", "true"), str(tmp_path / "land"))
    uris = sorted(r.file_path for r in lines.select("file_path").distinct().collect())
    named = {r.source_file for r in number_lines(lines, str(tmp_path / "land")).collect()}
    assert {source_file_of(uri, str(tmp_path / "land")) for uri in uris} == named
    assert named == {"a.jsonl", "sub/b%20c.jsonl", "d%25e.jsonl"}


def test_a_file_read_in_many_splits_is_numbered_as_one(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A large file is read in splits, their size set by the cluster: a line's number is
    still its place in the file, which the event ids derived from it need on replay."""
    files = {
        "a.jsonl": [f'{{"n": {i}}}' + " " * (i % 7) for i in range(1, 400)],
        "b.jsonl": [f"line {i}" if i % 5 else "" for i in range(1, 250)],
    }
    for name, lines in files.items():
        (tmp_path / name).write_text("\r\n".join(lines) + "\r\n")
    expected = sorted((name, number, line) for name, lines in files.items()
                      for number, line in enumerate(lines, 1) if line.strip())
    previous = spark.conf.get("spark.sql.files.maxPartitionBytes") or "128MB"
    spark.conf.set("spark.sql.files.maxPartitionBytes", "512")
    try:
        splits = spark.read.text(str(tmp_path)).rdd.getNumPartitions()
        numbered = _numbered(spark, tmp_path)
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", previous)
    assert splits > 10
    assert numbered == expected

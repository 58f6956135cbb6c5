"""Bad input at volume: generated records of every shape go through the parsers and the
guards, and each lands in exactly one place (an event or a quarantined record with a
reason); nothing crashes the batch. Files in odd encodings and shapes are split into lines
without losing or inventing any.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionlake.sources import adapter_for, file_lines, number_lines
from sessionlake.validation import apply_guards, cap_record_size
from tests.helpers import NOW, lines_frame

SKEW = timedelta(hours=1)
#: Text Spark can hold (no lone surrogates) on one line (no line breaks).
ONE_LINE = st.characters(exclude_categories=["Cs"], exclude_characters="\n\r")
TEXT = st.text(ONE_LINE, max_size=40)
TIMES = st.datetimes(min_value=datetime(1969, 1, 1), max_value=datetime(2040, 1, 1),
                     timezones=st.just(UTC))
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def json_records(draw: st.DrawFn) -> str:
    """A JSON object that is right, nearly right or wrong in one of many ways."""
    record: dict[str, object] = {}
    if draw(st.booleans()) or draw(st.booleans()):
        record["user_id"] = draw(TEXT | JSON_VALUES)
    if draw(st.booleans()) or draw(st.booleans()):
        stamp = draw(TIMES)
        record["event_time"] = draw(st.sampled_from([
            stamp.isoformat(), stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), stamp.timestamp(),
            stamp.strftime("%d/%b/%Y"), draw(TEXT),
        ]))
    for field in ("event_id", "event_type", "page", "properties"):
        if draw(st.booleans()):
            record[field] = draw(TEXT | JSON_VALUES)
    extras = draw(st.dictionaries(TEXT, JSON_VALUES, max_size=2))
    text = json.dumps({**extras, **record}, ensure_ascii=draw(st.booleans()))
    cut = draw(st.integers(min_value=0, max_value=len(text)))
    return text if draw(st.integers(0, 4)) else text[:cut]  # now and then, truncated


@st.composite
def apache_lines(draw: st.DrawFn) -> str:
    """A combined-log line with random parts, sometimes broken."""
    host = draw(st.sampled_from(["83.149.9.216", "::1", "-", "host.example"]))
    stamp = draw(TIMES).strftime("%d/%b/%Y:%H:%M:%S +0000")
    path = draw(TEXT).replace('"', "")
    line = (f'{host} - - [{stamp}] "GET {path} HTTP/1.1" {draw(st.integers(100, 599))} '
            f'{draw(st.integers(0, 10**6))} "-" "{draw(TEXT).replace(chr(34), "")}"')
    cut = draw(st.integers(min_value=1, max_value=len(line)))
    return line if draw(st.integers(0, 3)) else line[:cut]


def _non_blank(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip(" ") != ""]


def _each_line_lands_once(spark: SparkSession, lines: list[str], fmt: str) -> None:
    frame = cap_record_size(lines_frame(spark, lines))
    guarded = apply_guards(adapter_for(fmt).parse(frame), NOW, SKEW)
    got = guarded.select(
        "source_line",
        F.col("reason").isNull().alias("accepted"),
        (F.col("reason").isNotNull()
         | (F.col("user_id").isNotNull() & F.col("event_time").isNotNull())).alias("complete"),
    ).collect()
    assert sorted(r["source_line"] for r in got) == list(range(1, len(lines) + 1))
    assert all(r["complete"] for r in got)  # accepted events have a user and a time


FUZZ = settings(max_examples=12, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(records=st.lists(json_records() | st.text(ONE_LINE, min_size=1, max_size=80),
                        min_size=1, max_size=60))
def test_every_jsonl_record_is_an_event_or_quarantined(
    spark: SparkSession, records: list[str]
) -> None:
    lines = _non_blank(records)
    if lines:
        _each_line_lands_once(spark, lines, "jsonl")


@FUZZ
@given(records=st.lists(apache_lines() | st.text(ONE_LINE, min_size=1, max_size=80),
                        min_size=1, max_size=60))
def test_every_apache_line_is_an_event_or_quarantined(
    spark: SparkSession, records: list[str]
) -> None:
    lines = _non_blank(records)
    if lines:
        _each_line_lands_once(spark, lines, "apache")


GOOD = '{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z"}'


def _expected_lines(content: bytes) -> int:
    """Lines a reader of the file would count: split on LF, CR LF ends, blank ones skipped."""
    text = content.decode("utf-8", errors="replace")
    return sum(1 for line in text.split("\n") if line.removesuffix("\r").strip(" "))


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("empty.jsonl", b""),
        ("no-final-newline.jsonl", f"{GOOD}\n{GOOD}".encode()),
        ("crlf.jsonl", f"{GOOD}\r\n{GOOD}\r\n".encode()),
        ("blank-lines.jsonl", f"\n\n{GOOD}\n   \n{GOOD}\n".encode()),
        ("latin1.jsonl", '{"user_id": "Jos\xe9", "event_time": "2026-01-05T10:00:00Z"}\n'
         .encode("latin-1")),
        ("utf16.jsonl", f"{GOOD}\n".encode("utf-16")),
        ("binary.jsonl", bytes(range(256)) * 4),
        ("huge-line.jsonl", b'{"user_id": "u1", "x": "' + b"a" * (3 << 20) + b'"}\n'),
    ],
)
def test_odd_files_become_lines_and_every_line_lands_once(
    spark: SparkSession, tmp_path: Path, name: str, content: bytes
) -> None:
    lines = _expected_lines(content)
    (tmp_path / name).write_bytes(content)
    split = number_lines(file_lines(spark.read, str(tmp_path / name)), str(tmp_path))
    assert split.count() == lines
    if lines:
        guarded = apply_guards(adapter_for("jsonl").parse(cap_record_size(split)), NOW, SKEW)
        landed = guarded.select("source_file", "source_line", "reason").collect()
        assert len(landed) == lines
        assert {r["source_file"] for r in landed} == {name}

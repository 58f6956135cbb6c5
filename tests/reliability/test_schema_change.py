"""The producers change the event schema between batches: new fields are kept, values of a
changed type are quarantined with a reason, the stream goes on and every record is counted."""

from __future__ import annotations

import json

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionlake.config import settings_from
from sessionlake.tables import read_table
from tests.helpers import run_batches


def _record(user: str, minute: int, **fields: object) -> str:
    return json.dumps({"user_id": user, "event_time": f"2026-01-05T10:{minute:02d}:00Z",
                       **fields})


BEFORE = [_record("u1", 0, page="/a", event_type="view"),
          _record("u2", 1, page="/b", event_type="view")]


#: One schema change per batch after BEFORE: (records, properties kept, quarantine reasons).
CHANGES = [
    ([_record("u1", 5, page="/c", campaign="spring", ab={"arm": 2})],
     {"campaign": "spring", "ab": '{"arm":2}'}, []),                          # new fields
    ([_record("u1", 7, page=404), _record("u2", 8, page="/d")],
     {}, ["page must be a string"]),                                           # str -> number
    ([json.dumps({"user_id": "u1", "event_time": 1767607500}), _record("u2", 9)],
     {}, ["event_time must be an ISO-8601 string"]),                           # ISO -> epoch
    ([json.dumps({"uid": "u1", "ts": "2026-01-05T10:05:00Z"}), _record("u2", 10)],
     {}, ["missing user_id"]),                                                 # renamed
    ([_record("u1", 11, event_type=["view", "click"], properties=[1])],
     {}, ["event_type must be a string"]),                                     # str -> array
]


def test_schema_changes_keep_new_fields_and_quarantine_wrong_types(
    spark: SparkSession, lake: str
) -> None:
    settings = settings_from({"lake": lake}, env={})
    reports = run_batches(spark, settings, [BEFORE, *(records for records, _, _ in CHANGES)])
    assert not any(r.skipped for r in reports)
    events = read_table(spark, lake, "events")
    quarantine = read_table(spark, lake, "quarantine")
    for batch_id, (records, kept, reasons) in enumerate(CHANGES, start=1):
        accepted = events.where(F.col("batch_id") == batch_id)
        got = [r["reason"] for r in quarantine.where(F.col("batch_id") == batch_id).collect()]
        assert sorted(got) == sorted(reasons), batch_id
        if kept:
            [row] = accepted.collect()
            assert {k: row["properties"][k] for k in kept} == kept
        metrics = reports[batch_id].row
        assert metrics["input_records"] == len(records)
        assert (metrics["accepted"] + metrics["late"] + metrics["quarantined"]
                + metrics["duplicates"]) == len(records)
        assert accepted.count() == metrics["accepted"] == len(records) - len(reasons)

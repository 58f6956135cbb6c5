"""The stream's monitor: one structured line per batch, ALERT lines past the limits."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sessionlake.batch import BatchReport
from sessionlake.config import ConfigError, format_duration, settings_from
from sessionlake.monitor import (
    BatchRecord,
    KafkaRereads,
    LostExecutorRereads,
    PlanningWatch,
    RunningBatchWatch,
    batch_alerts,
    batch_record,
    error_summary,
    rereads_after,
    spark_activity,
)
from sessionlake.tables import read_table
from tests.conftest import ObservedLake


def _batch_lines(lake: ObservedLake) -> dict[int, dict[str, Any]]:
    lines = [r.getMessage() for r in lake.monitor_records if r.levelno == logging.INFO]
    parsed = [json.loads(m[len("batch "):]) for m in lines if m.startswith("batch ")]
    return {int(p["batch_id"]): p for p in parsed}


def test_every_batch_logs_one_structured_line(observed_lake: ObservedLake) -> None:
    lines = _batch_lines(observed_lake)
    assert sorted(lines) == [0, 1, 2]
    second = lines[1]
    # File 2: six records, three late, one replayed id, one malformed line, one accepted.
    assert (second["input_records"], second["late"], second["duplicates"],
            second["quarantined"], second["accepted"]) == (6, 3, 1, 1, 1)
    assert second["late_fraction"] == 0.5
    assert lines[2]["open_sessions"] == 1 and lines[2]["watermark"].startswith(
        "2026-01-05T13:00")
    assert all(int(line["duration_ms"]) > 0 for line in lines.values())
    # The files a batch read from the folder: one per batch here, while the batch's
    # records are counted by the batch itself. Spark's rows per second would count each
    # line once per read of it.
    assert [line["input_files"] for line in lines.values()] == [1, 1, 1]
    assert not any("rows_per_second" in line for line in lines.values())
    assert second["records_per_second"] == round(6 * 1000 / second["duration_ms"], 1)


def test_alerts_name_the_batch_and_the_limit(observed_lake: ObservedLake) -> None:
    alerts = [r.getMessage() for r in observed_lake.monitor_records
              if r.levelno == logging.WARNING]
    late = [a for a in alerts if "records were late" in a]
    slow = [a for a in alerts if " took " in a]
    running = [a for a in alerts if " has been running for " in a]
    assert late == ["ALERT batch 1: 3 of 6 records were late (50%), over the 20% limit "
                    "(--alert-late-fraction, SESSIONLAKE_ALERT_LATE_FRACTION)"]
    assert len(slow) == 3 and all(a.startswith("ALERT batch ") for a in slow)
    assert "over the 0s limit (--alert-batch-duration" in slow[0]
    # A 0s limit: each batch the run's loop sees in flight (it looks once a second, and
    # these take seconds) is told while it runs too, with its phase and Spark's stages.
    assert running and all(", in phase " in a and "; Spark: " in a for a in running), alerts
    assert len(alerts) == len(late) + len(slow) + len(running), alerts


@pytest.mark.parametrize(
    ("duration_ms", "records", "expected"),
    [
        (7088, 10_000, 1410.8),  # the demo's batch: Spark's own figure was 0.141 (files)
        (500, 3, 6.0),
        (1000, 0, 0.0),          # an empty batch
        (1000, None, None),      # a replayed batch: its records are not counted again
        (0, 10, None),           # no duration to divide by
    ],
)
def test_records_per_second_counts_the_batch_records(
    duration_ms: int, records: int | None, expected: float | None
) -> None:
    record = BatchRecord(batch_id=0, query="q", duration_ms=duration_ms, input_files=1,
                         rows_per_second=0.141, input_records=records)
    assert record.records_per_second == expected
    line = json.loads(record.as_line()[len("batch "):])
    assert line.get("records_per_second") == expected


@pytest.mark.parametrize(
    ("report", "replayed", "resumed"),
    [
        (BatchReport(row={"batch_id": 3, "input_records": 2}), False, False),
        # Cut off by a crash part-way, finished now: its committed writes were kept.
        (BatchReport(row={"batch_id": 3, "input_records": 2}, resumed=True), False, True),
        # Done before a crash cut off the checkpoint's commit: nothing redone.
        (BatchReport(row={"batch_id": 3}, skipped=True), True, False),
    ],
)
def test_the_line_tells_a_finished_batch_from_a_resumed_one(
    report: BatchReport, replayed: bool, resumed: bool
) -> None:
    progress = SimpleNamespace(batchId=3, name="q", durationMs={"triggerExecution": 900},
                               processedRowsPerSecond=None)
    line = json.loads(batch_record(progress, report).as_line()[len("batch "):])
    assert (line["replayed"], line["resumed"]) == (replayed, resumed)


@pytest.mark.parametrize(("latest", "end", "behind"), [
    # Spark's offsets JSON: topic -> partition -> offset. Capped: 30 read of 50 left.
    ('{"clicks":{"1":40,"0":60}}', '{"clicks":{"1":30,"0":40}}', 30),
    ('{"clicks":{"1":40,"0":60}}', '{"clicks":{"1":40,"0":60}}', 0),
    # A partition added since the batch's end was fixed counts from its first record.
    ('{"clicks":{"2":5,"0":60}}', '{"clicks":{"0":60}}', 5),
    # A folder's offsets (a log id), or none yet: not told.
    ('{"logOffset":3}', '{"logOffset":3}', None),
    (None, None, None),
])
def test_a_kafka_batch_line_tells_the_records_behind(
    latest: str | None, end: str | None, behind: int | None
) -> None:
    source = SimpleNamespace(latestOffset=latest, endOffset=end)
    progress = SimpleNamespace(batchId=3, name="q", durationMs={"triggerExecution": 900},
                               processedRowsPerSecond=10.0, sources=[source])
    record = batch_record(progress, None, reads_files=False)
    assert record.records_behind == behind
    assert batch_record(progress, None, reads_files=True).records_behind is None


def _record(duration_ms: int, late: int | None, records: int | None,
            quarantined: int | None = 0) -> BatchRecord:
    return BatchRecord(batch_id=7, query="q", duration_ms=duration_ms, input_files=1,
                       rows_per_second=None, input_records=records, late=late,
                       quarantined=None if records is None else quarantined)


@pytest.mark.parametrize(
    ("duration_ms", "late", "records", "quarantined", "expected"),
    [
        (1000, 0, 10, 0, []),                            # quick, nothing late
        (6000, 0, 10, 0, ["took 6.0 s"]),                # over 5 s
        (1000, 2, 10, 0, ["2 of 10 records were late"]),  # 20% > 10%
        (1000, 1, 10, 0, []),                            # 10% is not over 10%
        (1000, None, None, None, []),                    # a replayed batch: counts unknown
        (1000, 0, 0, 0, []),                             # an empty batch
        # An access log read as JSON lines (a walkthrough's DAG run said nothing of it).
        (1000, 0, 10, 10, ["10 of 10 records were quarantined (100%), over the 50% limit "
                           "(--alert-quarantine-fraction, SESSIONLAKE_ALERT_QUARANTINE_"
                           "FRACTION): is the input of --format jsonl?"]),
        (1000, 0, 10, 5, []),                            # 50% is not over 50%
    ],
)
def test_batch_alerts(duration_ms: int, late: int | None, records: int | None,
                      quarantined: int | None, expected: list[str]) -> None:
    settings = settings_from({"lake": "/tmp/lake", "alert_batch_duration": "5s"}, env={})
    alerts = batch_alerts(_record(duration_ms, late, records, quarantined), settings)
    assert len(alerts) == len(expected)
    for alert, words in zip(alerts, expected, strict=True):
        assert words in alert and alert.startswith("batch 7")


def test_alert_limits_come_from_flags_or_environment() -> None:
    env = {"SESSIONLAKE_ALERT_BATCH_DURATION": "2m", "SESSIONLAKE_ALERT_LATE_FRACTION": "0.3"}
    settings = settings_from({"lake": "/tmp/lake"}, env=env)
    assert (settings.alert_batch_duration, settings.alert_late_fraction) == (
        timedelta(minutes=2), 0.3)
    assert settings_from({"lake": "/tmp/lake", "alert_late_fraction": "0.05"},
                         env=env).alert_late_fraction == 0.05
    with pytest.raises(ConfigError, match="alert-late-fraction must be a number from 0 to 1"):
        settings_from({"lake": "/tmp/lake", "alert_late_fraction": "1.5"}, env={})


def test_a_trigger_waiting_on_its_source_alerts_then_again_then_says_it_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run's loop shows the watch the query's status each second; Spark's status
    while its Kafka source cannot reach the brokers."""
    settings = settings_from({"lake": "/l", "source": "kafka", "kafka_bootstrap": "b:9092",
                              "kafka_topic": "t"}, env={})
    watch = PlanningWatch(settings, patience_s=60, repeat_s=300)
    waiting = {"isTriggerActive": True, "message": "Getting offsets from KafkaV2[Subscribe[t]]"}
    idle = {"isTriggerActive": False, "message": "Waiting for next trigger"}
    seen: list[int] = []
    stuck: list[bool] = []
    with caplog.at_level(logging.WARNING, logger="sessionlake.monitor"):
        for second, status, in_batch in [
            (0, waiting, True), (100, idle, False),  # a long batch of its own: no alert
            (101, waiting, False), (160, waiting, False),  # 59 s: not yet
            (161, waiting, False), (200, waiting, False),  # 60 s: one alert
            (461, waiting, False),  # 360 s: again
            (462, idle, False), (463, waiting, False), (522, waiting, False),  # answered
        ]:
            watch.look(status, in_batch, float(second))
            seen.append(len(caplog.records))
            stuck.append(watch.stuck(second + 10.0))
    assert seen == [0, 0, 0, 0, 1, 1, 2, 3, 3, 3]
    # Waiting 10 s on the source: a stop no longer waits for a quiet moment.
    assert stuck == [False, False, True, True, True, True, True, False, True, True]
    first, again, answered = (r.getMessage() for r in caplog.records)
    assert first == ("ALERT the stream has waited 60s on its source for what is new, no batch "
                     "in flight (Spark: Getting offsets from KafkaV2[Subscribe[t]]): are the "
                     "Kafka brokers at b:9092 reachable? It goes on waiting; SIGTERM stops it")
    assert again.startswith("ALERT the stream has waited 360s")
    assert answered == "the source answered after 361s: the stream goes on"


def test_a_source_found_gone_while_the_trigger_waits_ends_the_watch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The diagnosis runs once the trigger is stuck (10 s), then at each alert; brokers
    only away (``None``) keep the run waiting, a topic gone for good is the watch's
    ``gone`` and one ERROR alert."""
    settings = settings_from({"lake": "/l", "source": "kafka", "kafka_bootstrap": "b:9092",
                              "kafka_topic": "t"}, env={})
    answers = iter([None, None, "topic t was deleted"])
    asked: list[int] = []

    def diagnose() -> str | None:
        asked.append(second)
        return next(answers)

    watch = PlanningWatch(settings, patience_s=60, repeat_s=300, diagnose=diagnose)
    waiting = {"isTriggerActive": True, "message": "Getting offsets from KafkaV2[Subscribe[t]]"}
    with caplog.at_level(logging.WARNING, logger="sessionlake.monitor"):
        for second in (0, 9, 10, 11, 59, 60, 61, 359, 360):
            watch.look(waiting, False, float(second))
            assert (watch.gone is None) == (second < 360)
    assert asked == [10, 60, 360]
    assert [r.levelname for r in caplog.records] == ["WARNING", "ERROR"]
    assert caplog.records[-1].getMessage() == (
        "ALERT the stream has waited 360s on a source that is gone: topic t was deleted")


def test_a_batch_running_past_the_limit_alerts_while_it_runs_then_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run's loop shows the watch the batch in flight each second: one past
    ``--alert-batch-duration`` alerts before it ends, with what Spark is doing, then again
    every ``repeat_s``; the next batch gets its own limit."""
    settings = settings_from({"lake": "/l", "alert_batch_duration": "2m"}, env={})
    asked: list[int] = []

    def activity() -> str:
        asked.append(second)
        return "stage 7 (collect at batch.py:1): 1 of 4 tasks done, 3 running"

    watch = RunningBatchWatch(settings, repeat_s=300, activity=activity)
    seen: list[int] = []
    with caplog.at_level(logging.WARNING, logger="sessionlake.monitor"):
        for second, batch in [(0, None), (1, 3), (120, 3), (121, 3), (122, 3),  # 3 from 1 s
                              (420, 3), (421, 3), (430, None),
                              (431, 4), (550, 4), (551, 4), (600, 5), (721, 5)]:
            watch.look(batch, float(second), "merge_wait" if second < 430 else None)
            seen.append(len(caplog.records))
    assert seen == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2, 3, 3, 4]
    assert asked == [121, 421, 551, 721]
    assert caplog.records[0].getMessage() == (
        "ALERT batch 3 has been running for 120s, over the 2m limit (--alert-batch-duration, "
        "SESSIONLAKE_ALERT_BATCH_DURATION), in phase merge_wait; Spark: stage 7 (collect at "
        "batch.py:1): 1 of 4 tasks done, 3 running. It goes on; SIGTERM stops the run once it "
        "ends, a second SIGTERM cancels it, and a run cancelled or killed now replays the "
        "batch on restart, exactly once")
    assert caplog.records[1].getMessage().startswith("ALERT batch 3 has been running for 420s")
    assert caplog.records[2].getMessage().startswith("ALERT batch 4 has been running for 120s")


def test_spark_activity_names_the_running_stages_and_their_tasks(
    spark: SparkSession, tmp_path: Path,
) -> None:
    """Asked of Spark's own status tracker while a job's two tasks run, and after. Spark
    updates its running tasks' count at the executors' heartbeat (10 s), so the tasks run
    until the test has seen them."""
    tracker = spark.sparkContext.statusTracker()
    holding = tmp_path / "holding"
    holding.touch()

    def held(x: int) -> int:
        deadline = time.monotonic() + 60
        while holding.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        return x

    job = threading.Thread(
        target=lambda: spark.sparkContext.parallelize(range(2), 2).map(held).collect())
    job.start()
    deadline = time.monotonic() + 60
    said = spark_activity(tracker)
    while not said.endswith(", 2 running") and time.monotonic() < deadline:
        time.sleep(0.2)
        said = spark_activity(tracker)
    holding.unlink()
    job.join()
    assert re.fullmatch(r"stage \d+ \(collect at \S+/test_monitor\.py:\d+\): "
                        r"0 of 2 tasks done, 2 running", said), said
    assert spark_activity(tracker) == (
        "no stage running (the batch is planning, committing or waiting on a lock)")


def test_a_batch_finishes_before_its_metrics_row_commits(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``finished_at`` (``started_at``, the batch's clock, plus ``duration_ms``) is no later
    than the commit of its own ``batch_metrics`` row: the duration counts from the clock's
    reading, not from before the batch pinned the versions it reads (slow on a cold start,
    made 3 s slow here)."""
    from sessionlake import eventids
    from sessionlake.stream import run_stream

    def slow_bound(*args: Any, **kwargs: Any) -> Any:
        time.sleep(3)
        return bound(*args, **kwargs)

    bound = eventids.id_bound
    monkeypatch.setattr(eventids, "id_bound", slow_bound)
    landing = tmp_path / "in"
    landing.mkdir()
    (landing / "a.jsonl").write_text(json.dumps(
        {"user_id": "u", "event_time": "2026-01-05T10:00:00Z", "page": "/"}) + "\n")
    lake = str(tmp_path / "lake")
    run_stream(spark, settings_from({"lake": lake, "source": str(landing)}, env={}))
    commits = {json.loads(r["userMetadata"])["batch_id"]: r["timestamp"] for r in spark.sql(
        f"DESCRIBE HISTORY delta.`{lake}/batch_metrics`").where("operation = 'WRITE'").collect()}
    [row] = read_table(spark, lake, "batch_metrics").collect()
    assert row["finished_at"] - row["started_at"] == timedelta(milliseconds=row["duration_ms"])
    assert row["finished_at"] <= commits[row["batch_id"]], (row.asDict(), commits)


FETCH_TIMEOUT = ("org.apache.spark.SparkException: Job aborted due to stage failure: ... "
                 "java.util.concurrent.TimeoutException: Cannot fetch record for offset 40 in "
                 "120000 milliseconds")


def _kafka_run(trigger: str, **values: Any) -> Any:
    return settings_from({"lake": "/l", "source": "kafka", "kafka_bootstrap": "127.0.0.1:9092",
                          "kafka_topic": "t", "trigger": trigger, **values}, env={})


@pytest.mark.parametrize(("first", "waits"), [
    (None, [5, 10, 20, 40, 60, 60]),  # the default
    ("1.5s", [1.5, 3, 6, 12, 18, 18]),
    ("2m", [120, 240, 480, 960, 1440, 1440]),
])
def test_a_continuous_kafka_run_waits_longer_between_failures_that_follow_each_other(
    caplog: pytest.LogCaptureFixture, first: str | None, waits: list[float],
) -> None:
    rereads = KafkaRereads(_kafka_run("continuous", **(
        {} if first is None else {"kafka_reread_wait": first})))
    with caplog.at_level(logging.ERROR, logger="sessionlake.monitor"):
        assert [rereads.wait_before_next(RuntimeError(FETCH_TIMEOUT), batches_done=3)
                for _ in waits] == waits
    assert "Cannot fetch record for offset 40 in 120000 milliseconds" in caplog.text
    first_wait = format_duration(timedelta(seconds=waits[0]))
    assert f"from its checkpoint in {first_wait} and replays" in caplog.text
    assert f"(failure {len(waits)} in a row)" in caplog.text
    # A batch committed since the last failure: the waits start again from the first.
    assert rereads.wait_before_next(RuntimeError(FETCH_TIMEOUT), batches_done=4) == waits[0]


@pytest.mark.parametrize(("trigger", "error"), [
    ("available-now", FETCH_TIMEOUT),  # a scheduled run fails, and its next run replays
    ("continuous", "[STREAM_FAILED] Query terminated with exception: Job aborted"),
    ("continuous", None),  # the query ended without an error
])
def test_other_ends_of_a_query_stop_the_run(trigger: str, error: str | None) -> None:
    rereads = KafkaRereads(_kafka_run(trigger))
    assert rereads.wait_before_next(None if error is None else RuntimeError(error), 0) is None


def test_a_run_on_files_does_not_start_again_on_a_time_out() -> None:
    files = settings_from({"lake": "/l", "source": "/landing", "trigger": "continuous"}, env={})
    assert rereads_after(files, FETCH_TIMEOUT) is None


LOST_ROWS = ("org.apache.spark.SparkException: [CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint "
             "block rdd_293_1 not found! Either the executor that originally checkpointed this "
             "partition is no longer alive, or the original RDD is unpersisted.")


@pytest.mark.parametrize(("trigger", "error", "wait"), [
    ("continuous", LOST_ROWS, 5.0),
    ("available-now", LOST_ROWS, None),  # a scheduled run fails, and its next run replays
    ("continuous", FETCH_TIMEOUT, None),  # a run on files
    ("continuous", "[STREAM_FAILED] Query terminated with exception: Job aborted", None),
])
def test_a_continuous_run_starts_again_after_a_lost_executor_only(
    caplog: pytest.LogCaptureFixture, trigger: str, error: str, wait: float | None,
) -> None:
    files = settings_from({"lake": "/l", "source": "/landing", "trigger": trigger}, env={})
    with caplog.at_level(logging.ERROR, logger="sessionlake.monitor"):
        assert LostExecutorRereads(files).wait_before_next(RuntimeError(error), 2) == wait
    assert ("ALERT a batch failed: an executor holding rows it had kept was lost (Checkpoint "
            "block rdd_293_1 not found). The stream starts again from its checkpoint in 5s"
            in caplog.text) == (wait is not None)


PROXY = ("py4j.Py4JException: An exception was raised by the Python Proxy. Return Message: "
         "Traceback (most recent call last):\n  File \"/x/py4j/clientserver.py\", line 644, "
         "in _call_proxy\n    return_value = getattr(self.pool[obj_id], method)(*params)\n")


@pytest.mark.parametrize(("text", "summary"), [
    (PROXY + "pyspark.errors.exceptions.captured.SparkException: Job aborted due to stage "
     "failure: Lost task 0.3 in stage 3.0 (TID 12) (127.0.0.1 executor 1): " + LOST_ROWS
     + "\n\tat org.apache.spark.rdd.LocalCheckpointRDD.compute(LocalCheckpointRDD.scala:56)",
     LOST_ROWS.removeprefix("org.apache.spark.SparkException: ")[:300]),
    ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: " + PROXY
     + "[FAILED_READ_FILE.FILE_NOT_EXIST] Error while reading file file:/l/events/a.parquet."
     "\n\tat x", "[FAILED_READ_FILE.FILE_NOT_EXIST] Error while reading file "
     "file:/l/events/a.parquet."),
    ("java.lang.OutOfMemoryError: Java heap space\n\tat x",
     "java.lang.OutOfMemoryError: Java heap space"),
    ("", "no message"),
])
def test_a_stopped_query_is_summed_up_by_its_cause(text: str, summary: str) -> None:
    """The ALERT of a query stopped on an error names the cause, not py4j's wrapper."""
    assert error_summary(text) == summary


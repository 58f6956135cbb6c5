"""The streaming job reports on itself: one structured log line per batch, and alerts.

A :class:`BatchMonitor` is a Spark ``StreamingQueryListener`` registered by
:func:`sessionlake.stream.run_stream`. For every batch Spark reports progress on, it logs
one line on the ``sessionlake.monitor`` logger::

    batch {"batch_id": 3, "duration_ms": 5120, "input_records": 40, "late": 6, ...}

made of Spark's progress (the trigger's duration) and the batch's own report (for a
folder the files read) and ``batch_metrics`` row (records, accepted, late, quarantined,
duplicates, sessions, watermark), with ``records_per_second``: the batch's input records
over its trigger's duration. For Kafka, ``rows_per_second`` is Spark's own figure, over
the records its source gives, and ``records_behind`` the records the topic held beyond the
batch (the consumer lag, :func:`records_behind`). Then, at
WARNING, an ``ALERT ...`` line for each limit the batch broke:

* it took longer than ``alert_batch_duration`` (``--alert-batch-duration``,
  ``SESSIONLAKE_ALERT_BATCH_DURATION``, default 5m);
* its late records exceed ``alert_late_fraction`` of its input (``--alert-late-fraction``,
  ``SESSIONLAKE_ALERT_LATE_FRACTION``, default 0.1);
* its quarantined records exceed ``alert_quarantine_fraction`` of its input
  (``--alert-quarantine-fraction``, ``SESSIONLAKE_ALERT_QUARANTINE_FRACTION``, default
  0.5): most likely input of another format than the stream's ``--format``.

A trigger that waits on its source for long, with no batch in flight (Kafka brokers that
do not answer, a remote folder's listing that hangs), gets an ``ALERT`` line too, from a
:class:`PlanningWatch`: Spark itself waits without a word. So does a batch still running
past ``alert_batch_duration`` (:class:`RunningBatchWatch`), whose own line would come only
when it ends.

Log shippers and Airflow's task log pick the lines up as they are; ``grep ALERT`` finds the
alerts. The decision is made by :func:`batch_alerts`, a plain function.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import Any

from pyspark.sql.streaming import StreamingQueryListener

from sessionlake.batch import BatchReport
from sessionlake.config import Settings, format_duration
from sessionlake.kafkaadmin import kafka_timeout

log = logging.getLogger("sessionlake.monitor")


@dataclass(frozen=True)
class BatchRecord:
    """What the per-batch log line says: Spark's progress and the batch's metrics."""

    batch_id: int
    query: str | None
    duration_ms: int
    #: The files the batch read from a folder (``None`` for Kafka, whose rows are records).
    input_files: int | None
    #: Spark's rows per second: records from Kafka (``None`` for a folder, whose lines
    #: Spark counts once per read of the batch's files).
    rows_per_second: float | None
    #: Kafka: the records the topic held beyond this batch's end when the batch was
    #: planned, over every partition (the consumer lag; ``None`` for a folder).
    records_behind: int | None = None
    input_records: int | None = None
    accepted: int | None = None
    late: int | None = None
    quarantined: int | None = None
    duplicates: int | None = None
    sessions_opened: int | None = None
    closed_sessions: int | None = None
    open_sessions: int | None = None
    watermark: str | None = None
    #: The batch had committed before (a replay after a crash): nothing was redone.
    replayed: bool = False
    #: The batch had been cut off by a crash part-way and was finished now: the writes its
    #: first attempt had committed were kept, not redone.
    resumed: bool = False

    @property
    def late_fraction(self) -> float | None:
        """Late records over input records (``None`` when unknown or no input)."""
        if not self.input_records or self.late is None:
            return None
        return self.late / self.input_records

    @property
    def records_per_second(self) -> float | None:
        """Input records over the trigger's duration (``None`` when unknown)."""
        if self.input_records is None or self.duration_ms <= 0:
            return None
        return round(self.input_records * 1000 / self.duration_ms, 1)

    def as_line(self) -> str:
        """The structured log line: ``batch`` and the record as one JSON object."""
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        if self.records_per_second is not None:
            fields["records_per_second"] = self.records_per_second
        if self.late_fraction is not None:
            fields["late_fraction"] = round(self.late_fraction, 4)
        return "batch " + json.dumps(fields, sort_keys=False)


def batch_record(progress: Any, report: BatchReport | None, reads_files: bool = True
                 ) -> BatchRecord:
    """Join Spark's progress of a batch with the batch's own report, when there is one.

    :param reads_files: whether the stream reads a folder (else Kafka). A folder's batch
        tells the files it read; Spark's count of its rows is left out, as the batch reads
        its files' lines twice (:func:`sessionlake.sources.number_lines`).
    """
    durations = dict(progress.durationMs or {})
    row: Mapping[str, Any] = report.row if report is not None and not report.skipped else {}
    watermark = row.get("watermark_after")
    return BatchRecord(
        batch_id=int(progress.batchId),
        query=progress.name,
        duration_ms=int(durations.get("triggerExecution", 0)),
        input_files=report.input_files if reads_files and report is not None else None,
        rows_per_second=None if reads_files else _finite(progress.processedRowsPerSecond),
        records_behind=None if reads_files else records_behind(progress),
        input_records=row.get("input_records"),
        accepted=row.get("accepted"),
        late=row.get("late"),
        quarantined=row.get("quarantined"),
        duplicates=row.get("duplicates"),
        sessions_opened=row.get("sessions_opened"),
        closed_sessions=row.get("closed_sessions"),
        open_sessions=row.get("open_sessions"),
        watermark=watermark.isoformat() if isinstance(watermark, datetime) else None,
        replayed=bool(report is not None and report.skipped),
        resumed=bool(report is not None and report.resumed),
    )


def records_behind(progress: Any) -> int | None:
    """The records a Kafka stream had yet to read when its batch was planned: per
    partition, the topic's latest offset then (Spark's ``latestOffset``) minus where the
    batch ended (``endOffset``, short of it under ``--max-offsets-per-trigger``), summed.
    ``None`` when Spark's progress does not tell both."""
    behind = None
    for source in getattr(progress, "sources", None) or []:
        try:
            latest, end = json.loads(source.latestOffset), json.loads(source.endOffset)
        except (TypeError, ValueError):
            continue
        if not isinstance(latest, dict) or not isinstance(end, dict):
            continue
        for topic, partitions in latest.items():
            ended = end.get(topic)
            if not isinstance(partitions, dict) or not isinstance(ended, dict | None):
                continue  # not Kafka's topic -> partition -> offset
            behind = (behind or 0) + sum(max(0, int(offset) - int((ended or {}).get(p, 0)))
                                         for p, offset in partitions.items())
    return behind


def _finite(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return round(number, 3) if number == number and abs(number) != float("inf") else None


def batch_alerts(record: BatchRecord, settings: Settings) -> list[str]:
    """The limits ``record`` broke, each as an alert message (without the ``ALERT`` word).

    Example::

        batch_alerts(record, settings)
        # ['batch 3 took 412.0 s, over the 5m limit (--alert-batch-duration)']
    """
    alerts = []
    limit = settings.alert_batch_duration
    if record.duration_ms > limit.total_seconds() * 1000:
        alerts.append(
            f"batch {record.batch_id} took {record.duration_ms / 1000:.1f} s, over the "
            f"{format_duration(limit)} limit (--alert-batch-duration, "
            "SESSIONLAKE_ALERT_BATCH_DURATION)"
        )
    fraction = record.late_fraction
    if fraction is not None and fraction > settings.alert_late_fraction:
        alerts.append(
            f"batch {record.batch_id}: {record.late} of {record.input_records} records were "
            f"late ({fraction:.0%}), over the {settings.alert_late_fraction:.0%} limit "
            "(--alert-late-fraction, SESSIONLAKE_ALERT_LATE_FRACTION)"
        )
    quarantined = record.quarantined
    if record.input_records and quarantined is not None and \
            quarantined / record.input_records > settings.alert_quarantine_fraction:
        alerts.append(
            f"batch {record.batch_id}: {quarantined} of {record.input_records} records were "
            f"quarantined ({quarantined / record.input_records:.0%}), over the "
            f"{settings.alert_quarantine_fraction:.0%} limit (--alert-quarantine-fraction, "
            f"SESSIONLAKE_ALERT_QUARANTINE_FRACTION): is the input of --format "
            f"{settings.input_format}? See the reasons in the quarantine table (records of "
            "users erased after they landed, read again after a restore, count too)"
        )
    return alerts


class BatchMonitor(StreamingQueryListener):
    """Logs a line per batch and alerts, from Spark's progress events.

    :param settings: the alert limits.
    :param reports: the batches' reports by batch id, filled by the ``foreachBatch``
        handler before Spark reports the batch's progress.
    """

    def __init__(self, settings: Settings, reports: Mapping[int, BatchReport]) -> None:
        self.settings = settings
        self.reports = reports
        self._seen: set[int] = set()
        self._changed = threading.Condition()
        self._terminated = threading.Event()
        #: Set by the run before it stops the query itself, so that an interrupted
        #: trigger is not reported as an error.
        self.stop_requested = False

    def onQueryStarted(self, event: Any) -> None:
        log.info("stream started: query %s, run %s", event.name, event.runId)

    def onQueryProgress(self, event: Any) -> None:
        progress = event.progress
        record = batch_record(progress, self.reports.get(int(progress.batchId)),
                              reads_files=not self.settings.reads_kafka)
        log.info("%s", record.as_line())
        for alert in batch_alerts(record, self.settings):
            log.warning("ALERT %s", alert)
        with self._changed:
            self._seen.add(record.batch_id)
            self._changed.notify_all()

    def onQueryIdle(self, event: Any) -> None:
        """Nothing to say while the query waits for files."""

    def onQueryTerminated(self, event: Any) -> None:
        if event.exception and rereads_after(self.settings, event.exception):
            log.info("query stopped on a batch its Kafka brokers did not answer: run %s",
                     event.runId)  # the run says what it does next (KafkaRereads)
        elif event.exception and rereads_lost_executor(self.settings, event.exception):
            log.info("query stopped on a batch that lost an executor: run %s",
                     event.runId)  # the run says what it does next (LostExecutorRereads)
        elif event.exception and not self.stop_requested:
            unanswered = kafka_timeout(event.exception) if self.settings.reads_kafka else None
            if unanswered is None:
                log.error("ALERT stream stopped on an error: %s",
                          error_summary(event.exception))
            else:
                log.error("ALERT stream stopped: its Kafka brokers at %s did not answer (%s)",
                          self.settings.kafka_bootstrap, unanswered)
        else:
            log.info("stream stopped: run %s", event.runId)
        self._terminated.set()

    def query_restarted(self) -> None:
        """The run started its query anew after stopping it itself: what follows is the
        new query's."""
        self.stop_requested = False
        self._terminated.clear()

    def wait_terminated(self, timeout: float = 10.0) -> bool:
        """Wait until Spark has told the listener that the query ended.

        The event comes on Spark's listener thread after the query stopped; a listener
        removed (or a process gone) before it arrives makes Spark log a Python traceback.
        """
        return self._terminated.wait(timeout)

    def wait_for(self, batch_ids: Iterable[int], timeout: float = 10.0) -> bool:
        """Wait until the progress of every batch in ``batch_ids`` has been logged.

        Spark delivers listener events on its own thread, after the batch: a run that
        ends right after its last batch waits here so that its last line is not lost.
        """
        wanted = set(batch_ids)
        with self._changed:
            return self._changed.wait_for(lambda: wanted <= self._seen, timeout)


#: How long a trigger may wait on its source (Spark asking it what is new) before an
#: ``ALERT`` says so, and how often the alert comes again while the wait lasts, in seconds.
PLANNING_ALERT_S = 60.0
PLANNING_ALERT_REPEAT_S = 300.0
#: A trigger waiting on its source this long, in seconds, is not about to finish planning.
PLANNING_STUCK_S = 10.0


class PlanningWatch:
    """Alerts while the stream's trigger waits on its source with no batch in flight.

    Spark's sources wait for an answer without a word: with its Kafka brokers down, a run
    said nothing for minutes (and a stop then waits for the source's own time-out). The
    run's loop shows the watch the query's status every second (:meth:`look`).

    A wait can also be for a source that is gone for good (a Kafka topic deleted under the
    stream: a continuous run's source asks for it again and again). ``diagnose``, when
    given, tells that apart: called once the trigger is :meth:`stuck`, then at each alert,
    it returns why the source is gone, or ``None`` to go on waiting. Its answer is
    :attr:`gone`, which the run stops on.
    """

    def __init__(self, settings: Settings, patience_s: float = PLANNING_ALERT_S,
                 repeat_s: float = PLANNING_ALERT_REPEAT_S,
                 diagnose: Callable[[], str | None] | None = None) -> None:
        self.patience_s, self.repeat_s = patience_s, repeat_s
        self.hint = (f": are the Kafka brokers at {settings.kafka_bootstrap} reachable?"
                     if settings.reads_kafka else "")
        self.diagnose = diagnose
        self.since: float | None = None
        self.next_alert = patience_s
        self.next_diagnosis = PLANNING_STUCK_S
        #: Why the source is gone for good (``diagnose``'s answer), once it is.
        self.gone: str | None = None

    def stuck(self, now: float) -> bool:
        """Whether the trigger has waited on its source for :data:`PLANNING_STUCK_S` or
        longer: a stop then interrupts it rather than wait for a quiet moment (its batch,
        not planned yet, runs on restart)."""
        return self.since is not None and now - self.since >= PLANNING_STUCK_S

    def look(self, status: Mapping[str, Any], in_batch: bool, now: float) -> None:
        """Note the query's ``status`` (``StreamingQuery.status``) at ``now`` (monotonic
        seconds); ``in_batch``: a batch of the stream's own is being processed."""
        waiting = bool(status.get("isTriggerActive")) and not in_batch
        if not waiting:
            if self.since is not None and now - self.since >= self.patience_s:
                log.warning("the source answered after %.0fs: the stream goes on",
                            now - self.since)
            self.since, self.next_alert = None, self.patience_s
            self.next_diagnosis = PLANNING_STUCK_S
            return
        if self.since is None:
            self.since = now
        waited = now - self.since
        if self.diagnose is not None and waited >= self.next_diagnosis:
            self.gone = self.diagnose()
            self.next_diagnosis = self.next_alert
            if self.gone is not None:
                log.error("ALERT the stream has waited %.0fs on a source that is gone: %s",
                          waited, self.gone)
                return
        if waited >= self.next_alert:
            log.warning("ALERT the stream has waited %.0fs on its source for what is new, no "
                        "batch in flight (Spark: %s)%s It goes on waiting; SIGTERM stops it",
                        waited, status.get("message", "?"), self.hint or ".")
            self.next_alert = waited + self.repeat_s
            self.next_diagnosis = self.next_alert


class RunningBatchWatch:
    """Alerts while a batch of the stream's own runs past ``alert_batch_duration``.

    A batch's line, and its alert for taking too long, come when it ends: one that hangs
    (Kafka brokers frozen while it fetches its records, a store that stops answering)
    would say nothing for as long as it hangs, and a SIGTERM waits for it. The run's loop
    shows the watch, each second, which batch is in flight (:meth:`look`); ``activity``,
    asked only when an alert is due, says what Spark is doing meanwhile
    (:func:`spark_activity`).
    """

    def __init__(self, settings: Settings, repeat_s: float = PLANNING_ALERT_REPEAT_S,
                 activity: Callable[[], str] | None = None) -> None:
        self.limit = settings.alert_batch_duration
        self.repeat_s = repeat_s
        self.activity = activity
        self.batch_id: int | None = None
        self.since = 0.0
        self.next_alert = 0.0

    def look(self, batch_id: int | None, now: float, phase: str | None = None) -> None:
        """Note at ``now`` (monotonic seconds) which batch is in flight (``None``: none),
        and in which of its phases (:func:`sessionlake.batch.process_lines`)."""
        if batch_id != self.batch_id:
            self.batch_id, self.since = batch_id, now
            self.next_alert = self.limit.total_seconds()
        if batch_id is None or now - self.since < self.next_alert:
            return
        running = now - self.since
        doing = self.activity() if self.activity is not None else ""
        log.warning("ALERT batch %s has been running for %.0fs, over the %s limit "
                    "(--alert-batch-duration, SESSIONLAKE_ALERT_BATCH_DURATION)%s%s. It goes "
                    "on; SIGTERM stops the run once it ends, a second SIGTERM cancels it, and "
                    "a run cancelled or killed now replays the batch on restart, exactly once",
                    batch_id, running,
                    format_duration(self.limit), f", in phase {phase}" if phase else "",
                    f"; Spark: {doing}" if doing else "")
        self.next_alert = running + self.repeat_s


def spark_activity(tracker: Any, most: int = 3) -> str:
    """What Spark's ``tracker`` (``SparkContext.statusTracker()``) says is running: its
    active stages, each with its name (the batch and what it was doing, see
    :func:`sessionlake.batch.batch_label`) and tasks, up to ``most`` of them."""
    stages = [info for info in map(tracker.getStageInfo, sorted(tracker.getActiveStageIds()))
              if info is not None]
    if not stages:
        return "no stage running (the batch is planning, committing or waiting on a lock)"
    said = [f"stage {info.stageId} ({info.name}): {info.numCompletedTasks} of "
            f"{info.numTasks} tasks done, {info.numActiveTasks} running"
            for info in stages[:most]]
    if len(stages) > most:
        said.append(f"{len(stages) - most} more")
    return "; ".join(said)


def rereads_kafka_timeouts(settings: Settings) -> bool:
    """Whether a run on ``settings`` starts its query again after a batch failed on
    Kafka brokers that did not answer (:class:`KafkaRereads`): a continuous run on Kafka."""
    return settings.reads_kafka and settings.trigger == "continuous"


def rereads_after(settings: Settings, error_text: str) -> str | None:
    """Kafka's time-out, when a run on ``settings`` starts its query again after it ended
    on ``error_text`` (:class:`KafkaRereads`): a continuous run on Kafka whose brokers did
    not answer. ``None``: the run stops on that error."""
    return kafka_timeout(error_text) if rereads_kafka_timeouts(settings) else None


#: The waits of a continuous run before it starts its query again after failures
#: that follow each other, as multiples of the first (``--kafka-reread-wait``): with the
#: default of 5 s, 5, 10, 20, 40, then 60 s.
KAFKA_REREAD_WAIT_FACTORS: tuple[int, ...] = (1, 2, 4, 8, 12)


def reread_waits(settings: Settings) -> tuple[timedelta, ...]:
    """How long a continuous run waits before it starts its query again after a batch
    failed (:class:`BatchRereads`): the first wait, then each one longer while failures
    follow each other without a batch committed in between, up to the last."""
    return tuple(settings.kafka_reread_wait * factor for factor in KAFKA_REREAD_WAIT_FACTORS)


#: What every :class:`BatchRereads` alert ends with (the wait, the failures in a row).
REPLAYS = ("The stream starts again from its checkpoint in %s and replays that batch "
           "(failure %d in a row); SIGTERM stops it")


class BatchRereads(ABC):
    """When a continuous run starts its query again after a batch failed on something that
    passes (:meth:`reason`), rather than stop.

    The failed batch was not committed, and every table write is idempotent per batch id,
    so a new query on the same checkpoint replays it exactly once. The run waits before it
    starts one (``--kafka-reread-wait``, 5 s by default), longer while failures follow each
    other without a batch committed between them (:func:`reread_waits`). Any other error,
    and any run that is not continuous, still stops the run.
    """

    #: What a run stopped by a signal while it waited says of the failed batch (``%s``: the
    #: reason).
    stopped = "stopped on the signal; the batch that failed (%s) runs again on restart"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.waits = reread_waits(settings)
        self.failures = 0
        self._batches_at_failure = -1

    @abstractmethod
    def reason(self, error_text: str) -> str | None:
        """Why a batch that failed on ``error_text`` is to be read again; ``None``: it is
        not."""

    @abstractmethod
    def alert(self, reason: str, wait: timedelta) -> None:
        """Say that a batch failed for ``reason`` and runs again after ``wait``."""

    def wait_before_next(self, error: BaseException | None, batches_done: int) -> float | None:
        """Seconds to wait before the next query, after the query ended on ``error``
        with ``batches_done`` batches committed by the run; ``None``: do not start one."""
        reason = self.reason(str(error)) if error is not None else None
        if reason is None:
            return None
        if batches_done > self._batches_at_failure:
            self.failures = 0
        self._batches_at_failure = batches_done
        wait = self.waits[min(self.failures, len(self.waits) - 1)]
        self.failures += 1
        self.alert(reason, wait)
        return wait.total_seconds()


class KafkaRereads(BatchRereads):
    """A continuous Kafka run whose batch failed because the brokers stopped answering
    while it read its records.

    Spark's Kafka source waits out brokers away while a trigger asks for offsets, but not
    while a batch fetches its records: the batch fails, and with it the query. The run
    starts a new one and goes on waiting for the brokers as a trigger does.
    """

    stopped = ("stopped on the signal; the batch that failed on its Kafka brokers (%s) was "
               "not committed and runs again on restart")

    def reason(self, error_text: str) -> str | None:
        return rereads_after(self.settings, error_text)

    def alert(self, reason: str, wait: timedelta) -> None:
        log.error("ALERT a batch failed reading its records: the Kafka brokers at %s stopped "
                  "answering (%s). " + REPLAYS, self.settings.kafka_bootstrap, reason,
                  format_duration(wait), self.failures)


#: Spark's error class for a batch whose kept rows (``sessionlake.batch.materialize``'s
#: local checkpoints, held by the executors that computed them) are gone with an executor.
LOST_ROWS_ERROR = "CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND"


def lost_executor(error_text: str) -> str | None:
    """Spark's words, when ``error_text`` says a batch lost rows it had kept because the
    executor that held them is gone; ``None`` otherwise."""
    if LOST_ROWS_ERROR not in error_text:
        return None
    said = re.search(r"Checkpoint block \S+ not found", error_text)
    return said.group(0) if said else LOST_ROWS_ERROR


#: A Spark error condition and its message: ``[FAILED_READ_FILE.FILE_NOT_EXIST] Error ...``.
_CONDITION = re.compile(r"\[([A-Z][A-Z0-9_]+(?:\.[A-Z0-9_]+)*)\] [^\n]*")
#: Conditions that only wrap the error that stopped a query.
_WRAPPING_CONDITIONS = frozenset({"STREAM_FAILED"})


def error_summary(error_text: str, limit: int = 300) -> str:
    """What stopped a query, in one line: the first Spark error condition in its text
    with its message, else its first line. The first line of a batch's failure is py4j's
    ("An exception was raised by the Python Proxy"), the cause a thousand lines further
    (a walkthrough's lost executor: ``[CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] ...``)."""
    for found in _CONDITION.finditer(error_text):
        if found.group(1) not in _WRAPPING_CONDITIONS:
            return found.group(0)[:limit]
    lines = error_text.strip().splitlines()
    return lines[0][:limit] if lines else "no message"


def rereads_lost_executor(settings: Settings, error_text: str) -> str | None:
    """:func:`lost_executor`'s words, when a run on ``settings`` starts its query again
    after that failure (:class:`LostExecutorRereads`): a continuous run."""
    return lost_executor(error_text) if settings.trigger == "continuous" else None


class LostExecutorRereads(BatchRereads):
    """A continuous run on a cluster whose batch failed because an executor was lost.

    A batch keeps the rows it computes once as local checkpoints on the executors that
    computed them (``sessionlake.batch.materialize``), which Spark cannot recompute: with
    an executor gone (a node lost, an executor killed), the batch fails. The cluster
    starts another executor and the run a new query, which replays the batch.
    """

    stopped = ("stopped on the signal; the batch that failed on a lost executor (%s) was "
               "not committed and runs again on restart")

    def reason(self, error_text: str) -> str | None:
        return rereads_lost_executor(self.settings, error_text)

    def alert(self, reason: str, wait: timedelta) -> None:
        log.error("ALERT a batch failed: an executor holding rows it had kept was lost (%s). "
                  + REPLAYS, reason, format_duration(wait), self.failures)

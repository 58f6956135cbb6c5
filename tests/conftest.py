"""Shared fixtures: one Spark session for the whole run, a fresh lake per test."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

#: Spark settings of every Spark the tests start. The tests' batches hold a few rows:
#: compiling generated code for each new plan, and re-planning each shuffle stage
#: adaptively, cost more than they save (a few-row micro-batch runs about a third faster
#: without). Results do not depend on either; production runs keep Spark's defaults, and
#: bench/ measures those.
SUITE_SPARK_CONF = {
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
}
# They reach the JVMs spark-submit starts (in process, `sessionlake` subprocesses, the
# DAGs' spark-submit) as system properties, which Spark reads as settings. Not through a
# spark-defaults.conf: a configuration folder on the driver's class path keeps the JVM from
# mapping the class archive `make setup` built (sessionlake/classarchive.py), and each
# driver the suite starts would load its classes anew (a CLI query: 13-15 s with the
# archive against 18-20 s without).
os.environ.pop("SPARK_CONF_DIR", None)
# Once: an xdist worker inherits the controller's environment, which already has them.
_SUBMIT_OPTS = os.environ.get("SPARK_SUBMIT_OPTS", "").split()
os.environ["SPARK_SUBMIT_OPTS"] = " ".join([*_SUBMIT_OPTS, *(
    option for option in (f"-D{k}={v}" for k, v in SUITE_SPARK_CONF.items())
    if option not in _SUBMIT_OPTS)])
# Spark hands timestamps to Python as naive local times: make local time UTC.
os.environ["TZ"] = "UTC"
time.tzset()

from pyspark import SparkContext  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402

from sessionlake.config import Settings, settings_from  # noqa: E402
from sessionlake.spark import build_spark, ui_conf  # noqa: E402
from tests.sparkcluster import SparkCluster, start_cluster  # noqa: E402

pytest_plugins = ["tests.watchdog"]

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"

#: The test files that run longest, longest first (their worker-seconds in a full `make test`
#: run on 2 cores, 2026-12-07, from `--junitxml`), started before all others: with a file
#: per worker at a time, a long file picked up late runs alone at the end (on 2026-11-27,
#: test_batch.py, then unlisted, started after 1,286 s and ran its last 173 s alone).
LONGEST_FIRST = (
    "tests/test_retention.py",                      # 722
    "tests/test_batch.py",                          # 617
    "tests/test_kafka_source.py",                   # 521
    "tests/reliability/test_crash_recovery.py",     # 494
    "tests/test_snapshots.py",                      # 379
    "tests/test_cluster.py",                        # 289
    "tests/test_stream.py",                         # 245
    "tests/dags/test_dag_runs.py",                  # 229
    "tests/test_cli.py",                            # 207
    "tests/test_compaction.py",                     # 173
    "tests/test_classarchive.py",                   # 154 (64 with its archive built)
    "tests/reliability/test_random_streams.py",     # 121
    "tests/test_backfill.py",                       # 118
    "tests/dags/test_restart_dag.py",               # 113 (one test)
    "tests/test_query.py",                          # 106
    "tests/test_deltarestore.py",                   # 86
    "tests/test_doctor.py",                         # 85
    "tests/test_eventids.py",                       # 81
    "tests/reliability/test_random_maintenance.py", # 67 (one case)
    "tests/test_archive.py",                        # 52
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the files of LONGEST_FIRST first, in that order; the others keep theirs."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """A local[2] Spark with Delta, UI off, two shuffle partitions, and its catalog's
    warehouse (where a table made without a location keeps its files) in a temporary
    folder, not the working directory."""
    session = build_spark(
        "local[2]",
        app_name="sessionlake-tests",
        shuffle_partitions=2,
        # The UI off, whatever $SESSIONLAKE_SPARK_UI says, and with it a status store that
        # keeps few plans: a worker runs thousands of queries, and the batch's plans are large.
        conf={**ui_conf("false"), "spark.driver.memory": "2g",
              "spark.sql.warehouse.dir": str(tmp_path_factory.mktemp("warehouse"))},
    )
    # The JVMs the tests start from here on (CLI runs, the DAGs' spark-submit) live for a
    # minute or two: C1 alone compiles what they run for about 40% less CPU than with C2
    # (a 3-batch CLI run here: 172-208 CPU s -> 103-110), and the suite is CPU-bound on
    # 2 cores. Not verifying the bytecode of the jars they load (Spark's, Delta's: the same
    # trusted jars every run) takes another ~4 CPU s off each start (23 -> 19 for a run
    # with no new file). This session's own JVM, long-lived, keeps the JVM's defaults.
    os.environ.setdefault(
        "JDK_JAVA_OPTIONS",
        "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=256m"
        " -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote",
    )
    yield session
    session.stop()


@pytest.fixture(scope="module", autouse=True)
def _forget_the_modules_delta_logs() -> Iterator[None]:
    """After each test module, drop the Delta logs the worker's JVM keeps cached.

    One JVM runs every module of its worker. Delta caches the log of each table it opened
    for an hour, with its snapshot's plans and cached state: a worker opens hundreds of
    tables in tmp lakes, and by the end of a run its 2 GB heap was full of them (292 logs,
    381 snapshots, 1.3 million plan nodes), and garbage collection took most of its time
    (890 full collections, 1,109 s).
    """
    yield
    forget_delta_logs()


def forget_delta_logs() -> None:
    """Drop every Delta log (and its snapshots) this process's JVM keeps cached."""
    context = SparkContext._active_spark_context
    if context is not None and context._jvm is not None:
        context._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


@pytest.fixture(autouse=True)
def _no_cli_log_handler_left() -> Iterator[None]:
    """Remove the root handler a test's ``sessionlake.cli.main`` set up (``basicConfig``).

    It writes to the standard error of the moment, which pytest's capture closes after the
    test; py4j's goodbye at the worker's exit then printed a "Logging error" traceback.
    """
    root = logging.getLogger()
    before = set(root.handlers)
    yield
    for handler in [h for h in root.handlers if h not in before]:
        if type(handler) is logging.StreamHandler:  # pytest's own handlers are subclasses
            root.removeHandler(handler)


@pytest.fixture(scope="session", autouse=True)
def _quiet_logging_at_exit() -> Iterator[None]:
    """Once the worker's tests are done, a record logged at its exit (py4j closing its
    connections) into a handler on a stream pytest has closed is dropped without a
    traceback. With the CLI's handlers removed as above, a full run still printed one such
    traceback, from a handler not found (a library's own logging set-up, likely Airflow's)."""
    yield
    logging.raiseExceptions = False


@pytest.fixture(scope="session")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A real Spark standalone master with two one-core workers (tests/sparkcluster.py)."""
    cluster = start_cluster(tmp_path_factory.mktemp("spark-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture
def lake(tmp_path: Path) -> str:
    """A fresh, empty lake folder."""
    return str(tmp_path / "lake")


@dataclass
class ObservedLake:
    """A lake written by a real stream run, with what its monitor logged."""

    settings: Settings
    monitor_records: list[logging.LogRecord]
    snapshot_id: str


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _jsonl(user: str, at: str, event_id: str, page: str = "/") -> str:
    return json.dumps({"user_id": user, "event_time": f"2026-01-05T{at}:00Z",
                       "event_id": event_id, "page": page})


#: Three files, one micro-batch each (oldest file first):
#: 1. u1 (10:00-10:20), u2 (10:05), u3 (12:00): watermark 11:55, u1 and u2 close;
#: 2. u4 and u5 too far behind the watermark, u1 within the gap of its closed session
#:    (3 late), a replay of u3's event (1 duplicate), a malformed line (1 quarantined) and
#:    u3 at 12:10 (accepted): 3 of 6 records late;
#: 3. u6 at 13:00 and 13:05: watermark 13:00, u3 (12:00-12:10) closes; u6 stays open.
OBSERVED_FILES = (
    [_jsonl("u1", "10:00", "a", "/home"), _jsonl("u1", "10:10", "b", "/cart"),
     _jsonl("u2", "10:05", "c", "/home"), _jsonl("u1", "10:20", "d", "/pay"),
     _jsonl("u3", "12:00", "e", "/home")],
    [_jsonl("u4", "09:00", "f"), _jsonl("u5", "09:10", "g"), _jsonl("u1", "10:25", "h"),
     _jsonl("u3", "12:00", "e", "/home"), "this is not json", _jsonl("u3", "12:10", "i")],
    [_jsonl("u6", "13:00", "j"), _jsonl("u6", "13:05", "k")],
)


@pytest.fixture(scope="session")
def observed_lake(
    spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> ObservedLake:
    """A lake from one real ``run_stream`` over :data:`OBSERVED_FILES`, plus a snapshot.

    Built once per test process for the health page, the report and the monitor's tests.
    The alert limits are set so that every batch is "too slow" (0s) and the second one
    has too many late records (over 20%).
    """
    from sessionlake.snapshots import create_snapshot
    from sessionlake.stream import run_stream

    root = tmp_path_factory.mktemp("observed")
    landing = root / "landing"
    landing.mkdir()
    for index, lines in enumerate(OBSERVED_FILES):
        path = landing / f"part-{index:04d}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + index * 60, 1_700_000_000 + index * 60))
    settings = settings_from({
        "lake": str(root / "lake"), "source": str(landing), "max_files_per_trigger": 1,
        "shuffle_partitions": 2, "alert_batch_duration": "0s", "alert_late_fraction": "0.2",
    }, env={})
    collect = _Collect()
    monitor_log = logging.getLogger("sessionlake.monitor")
    monitor_log.addHandler(collect)
    previous_level = monitor_log.level
    monitor_log.setLevel(logging.INFO)
    try:
        run_stream(spark, settings)
    finally:
        monitor_log.removeHandler(collect)
        monitor_log.setLevel(previous_level)
    snapshot = create_snapshot(spark, settings, name="nightly")
    return ObservedLake(settings, collect.records, snapshot.snapshot_id)

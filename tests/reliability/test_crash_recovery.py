"""SIGKILL at chosen points of a micro-batch, then a restart: the final tables must equal
an uninterrupted run's — no session lost, none doubled, every record counted once.

The kill points are deterministic (``SESSIONLAKE_FAULT=<point>@<batch>``, see
``sessionlake/faults.py``): one run is killed at each point in turn, every restart resuming
from the previous crash, some at another parallelism or master. One scenario kills at a
random moment instead.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sessionlake import faults
from sessionlake.config import settings_from
from sessionlake.generate import generate_clickstream
from sessionlake.stream import run_stream
from sessionlake.tables import read_table
from tests.conftest import REPO
from tests.helpers import all_sessions, rows

pytestmark = pytest.mark.slow


def _command(landing: Path, lake: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sessionlake.cli", "run", "--source", str(landing),
            "--lake", str(lake), "--max-files-per-trigger", "1", *extra]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SESSIONLAKE_FAULT"}
    return {**env, "SESSIONLAKE_DRIVER_MEMORY": "1g", **extra}


def run_cli(landing: Path, lake: Path, *extra: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(_command(landing, lake, *extra), cwd=REPO, env=_env(**env),
                          capture_output=True, text=True, timeout=900, check=False)


def run_here(spark: SparkSession, landing: Path, lake: Path) -> None:
    """The stream in this test's own Spark (warm: a JVM start less than a CLI run), through
    the library entry point that ``sessionlake run`` calls."""
    run_stream(spark, settings_from(
        {"lake": str(lake), "source": str(landing), "max_files_per_trigger": 1}, env={}))


def outcome(spark: SparkSession, lake: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Everything that must not depend on crashes, as sorted lists."""
    path = str(lake)
    return {
        "sessions": rows(all_sessions(spark, path)),
        "events": rows(read_table(spark, path, "events").select("user_id", "event_id")),
        "late": rows(read_table(spark, path, "late_events").select("event_id", "reason")),
        "quarantine": rows(
            read_table(spark, path, "quarantine").select("source_file", "source_line", "reason")),
        "changelog": rows(
            read_table(spark, path, "session_changelog").select("batch_id", "change",
                                                                "session_id")),
        "metrics": rows(read_table(spark, path, "batch_metrics").select(
            "batch_id", "input_records", "accepted", "late", "quarantined", "duplicates",
            "closed_sessions", "open_sessions")),
    }


@pytest.fixture(scope="module")
def landing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("landing")
    generate_clickstream(folder, users=40, events=400, files=3, seed=3, late_fraction=0.05,
                         duplicate_fraction=0.03, malformed_fraction=0.03)
    return folder


@pytest.fixture(scope="module")
def expected(
    spark: SparkSession, landing: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[tuple[Any, ...]]]:
    """The uninterrupted run's outcome: the same stream, run in this process, with this
    session's parallelism."""
    lake = tmp_path_factory.mktemp("uninterrupted") / "lake"
    run_here(spark, landing, lake)
    result = outcome(spark, lake)
    assert len(result["metrics"]) == 3
    assert result["late"] and result["quarantine"]
    return result


#: One kill per point, in the order a batch reaches them; each run restarts from the last
#: one's crash (replaying the batch it cut off), some at another parallelism or master.
KILLS = [
    ("ingest@0", ()),
    ("before_merge@1", ("--shuffle-partitions", "3")),
    ("after_merge@1", ("--master", "local[1]")),
    ("after_sessions@2", ()),
    ("after_metrics@2", ("--shuffle-partitions", "1")),
]


def test_a_kill_at_every_point_then_a_restart_ends_as_if_uninterrupted(
    spark: SparkSession, landing: Path, expected: dict, tmp_path: Path
) -> None:
    assert [fault.partition("@")[0] for fault, _ in KILLS] == list(faults.POINTS)
    lake = tmp_path / "lake"
    for fault, flags in KILLS:
        killed = run_cli(landing, lake, *flags, SESSIONLAKE_FAULT=fault)
        assert killed.returncode == -signal.SIGKILL, f"{fault}: {killed.stderr[-2000:]}"
    run_here(spark, landing, lake)  # the last restart
    assert outcome(spark, lake) == expected


def test_kill_at_a_random_moment_then_restart(
    spark: SparkSession, landing: Path, expected: dict, tmp_path: Path
) -> None:
    lake = tmp_path / "lake"
    delay = random.Random().uniform(20, 60)
    process = subprocess.Popen(_command(landing, lake), cwd=REPO, env=_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(delay)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    print(f"killed after {delay:.1f}s")  # shown should the restart fail
    run_here(spark, landing, lake)  # the last restart
    assert outcome(spark, lake) == expected, f"killed after {delay:.1f}s"


def test_a_second_sigterm_cancels_a_batch_stuck_in_spark(
    spark: SparkSession, landing: Path, expected: dict, tmp_path: Path
) -> None:
    """A batch that never ends (here a Spark job of batch 1 that sleeps, beside its
    appends: a batch waiting for executors that never come) holds a SIGTERM's graceful
    stop up; a second one cancels the batch: the run exits 0, saying so in one line,
    without Spark's stack traces, and a restart ends as an uninterrupted run."""
    lake, stalled, log_file = tmp_path / "lake", tmp_path / "stalled", tmp_path / "run.log"
    with log_file.open("w") as log_out:
        process = subprocess.Popen(
            _command(landing, lake), cwd=REPO, stdout=subprocess.DEVNULL, stderr=log_out,
            env=_env(SESSIONLAKE_FAULT="before_merge@1", SESSIONLAKE_FAULT_STALL=str(stalled)),
            start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while not stalled.exists() and process.poll() is None \
                    and time.monotonic() < deadline:
                time.sleep(0.2)
            assert stalled.exists(), log_file.read_text()[-3000:]
            os.killpg(process.pid, signal.SIGTERM)
            time.sleep(5)
            assert process.poll() is None, "the first SIGTERM waits for the batch"
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    log = log_file.read_text()
    assert process.returncode == 0, log[-3000:]
    assert "stopped at once, as a second signal asked: batch 1 was cancelled before its " \
        "commit and runs again on restart" in log, log[-3000:]
    # No JVM stack trace at all: Spark's check of a stop's Py4J error runs a regex that
    # recurses once per character, and overflowed the stack on a long one (the README
    # review: a StackOverflowError's 1,024 frames of java.util.regex).
    assert "\tat " not in log and "Traceback" not in log and "Exception in thread" not in log, \
        log[-3000:]
    assert rows(read_table(spark, str(lake), "batch_metrics").select("batch_id")) == [(0,)]
    run_here(spark, landing, lake)  # the restart replays batch 1
    assert outcome(spark, lake) == expected


def test_sigterm_stops_an_available_now_run_after_its_batch_in_flight(
    spark: SparkSession, landing: Path, expected: dict, tmp_path: Path
) -> None:
    """`kill -TERM` (Airflow stopping a task; SIGINT takes the same way) during a run with
    more to read: the batch in flight commits, the next does not begin, the run exits 0
    without Spark's stack traces, and a restart ends as an uninterrupted run. Batches follow
    each other without a pause here, so the stop cannot wait for one. The signal goes to
    the run's whole process group (`kill -- -PGID`, systemd's stop): it must not reach
    Spark's JVM, which would stop at once and cut the batch off."""
    lake, paused = tmp_path / "lake", tmp_path / "batch-1-in-flight"
    # Batch 1 waits at its start until the signal is sent: then it is surely in flight
    # (waiting for batch 0's line raced batch 1's start, and lost one run in five).
    env = _env(SESSIONLAKE_FAULT="ingest@1", SESSIONLAKE_FAULT_PAUSE=str(paused))
    process = subprocess.Popen(_command(landing, lake), cwd=REPO, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    deadline = time.monotonic() + 300
    while not paused.exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGTERM)
    time.sleep(1)  # the run's handler notes the stop request before the batch goes on
    paused.unlink()
    out, log = process.communicate(timeout=300)
    assert process.returncode == 0, log[-3000:]
    assert "stopped before batch 2 began" in log, log[-3000:]
    assert "\tat " not in log and "Traceback" not in log and "Exception in thread" not in log, \
        log[-3000:]
    assert out.startswith("processed 2 micro-batch(es)"), out
    assert len(rows(read_table(spark, str(lake), "batch_metrics").select("batch_id"))) == 2
    run_here(spark, landing, lake)  # the restart runs batch 2
    assert outcome(spark, lake) == expected

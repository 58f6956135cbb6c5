"""The restart DAG against a live stream: stopped and resumed twice at new parallelism;
then the restore DAG, which stops that stream, restores a snapshot and starts it again.

Its own file (it runs for minutes), so that the test workers run it beside the other DAG
runs instead of after them.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sessionlake import orchestration as orch
from sessionlake.checkpoint import IDENTITY_FILE
from sessionlake.config import settings_from
from sessionlake.snapshots import create_snapshot
from tests.dags.test_dag_runs import _event, _task_states, run_dag

pytestmark = pytest.mark.usefixtures("airflow_home")


#: Seconds between two landed files. Each file makes the running stream commit a batch, and
#: a stream that always has a file waiting never idles: at one file every 3 s it kept a core
#: busy for the whole test. A restarted run finds one within this time after its JVM is up.
FEED_EVERY = 15


def _feed(landing: Path, stop: threading.Event) -> None:
    """A live source: a new file of two events every FEED_EVERY s, later in event time
    each time."""
    n = 0
    while not stop.wait(FEED_EVERY):
        n += 1
        minute = f"{10 + n // 60:02d}:{n % 60:02d}:00"
        lines = [_event(f"r{n % 3}", minute, f"f{n}a"), _event("r9", minute, f"f{n}b")]
        (landing / f"feed-{n:04d}.jsonl").write_text("\n".join(lines) + "\n")


def _command_line(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]


@pytest.mark.slow
def test_restart_dag_resumes_the_stream_at_a_new_parallelism_and_a_restore_restarts_it(
    locations: dict[str, Path], monkeypatch: pytest.MonkeyPatch, spark: SparkSession,
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("SESSIONLAKE_RESTART_TIMEOUT", "300")
    checkpoint = str(locations["lake"] / "_checkpoints" / "stream")
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(locations["source"], stop), daemon=True)
    feeder.start()
    pids: list[int] = []
    try:
        # No master: the spark_default connection's (local[2] in these tests).
        first = run_dag("sessionlake_restart", {"shuffle_partitions": 2})
        assert str(first.state) == "success", _task_states(first)
        pids.append(orch.running_pid(checkpoint) or -1)
        assert _command_line(pids[0])[-4:] == ["--shuffle-partitions", "2", "--master", "local[2]"]
        before = orch.stream_position(str(locations["lake"]), checkpoint)

        second = run_dag("sessionlake_restart", {"shuffle_partitions": 3, "master": "local[1]"})
        assert str(second.state) == "success", _task_states(second)
        pids.append(orch.running_pid(checkpoint) or -1)
        second_command = _command_line(pids[1])
        assert second_command[-4:] == ["--shuffle-partitions", "3", "--master", "local[1]"]
        after = orch.stream_position(str(locations["lake"]), checkpoint)

        # A run the new one would refuse (the workers' format other than the stream's)
        # fails the DAG run before the stop: the stream runs on (the Airflow review: it was
        # stopped, then the new run refused, and the stream stayed down).
        capsys.readouterr()
        with monkeypatch.context() as workers:
            workers.setenv("SESSIONLAKE_FORMAT", "apache")
            refused = run_dag("sessionlake_restart", {"shuffle_partitions": 4})
        assert str(refused.state) == "failed"
        assert _task_states(refused)["validate_params"] == "failed", _task_states(refused)
        assert _task_states(refused)["stop_running_stream"] == "upstream_failed"
        said = caplog.text + capsys.readouterr().out
        assert "the restarted run would be refused, so nothing was stopped: the stream of " \
               f"checkpoint {checkpoint} reads --format jsonl; --format apache would " \
               "quarantine its input" in said, said[-3000:]
        assert "(the DAG's run takes SESSIONLAKE_FORMAT, SESSIONLAKE_CHECKPOINT from the " \
               "Airflow workers' environment)" in said
        assert orch.running_pid(checkpoint) == pids[1]

        # A snapshot of the running stream (in this process), a batch after it, then the
        # restore DAG: it stops the run, restores, and starts the same command line again.
        settings = settings_from({"lake": str(locations["lake"])}, env={})
        snapshot = create_snapshot(spark, settings)
        _wait_for_batch_after(locations["lake"], checkpoint, snapshot.last_batch_id)
        output = (Path(checkpoint) / orch.CONTINUOUS_LOG).read_text()
        restored = run_dag("sessionlake_restore", {"snapshot_id": snapshot.snapshot_id})
        assert str(restored.state) == "success", _task_states(restored)
        assert set(_task_states(restored).values()) == {"success"}, _task_states(restored)
        pids.append(orch.running_pid(checkpoint) or -1)
        assert _command_line(pids[2]) == second_command
        resumed = orch.stream_position(str(locations["lake"]), checkpoint)
    finally:
        stop.set()
        orch.stop_continuous_run(checkpoint, timeout=300)
        for pid in pids:
            if pid > 0:  # started by this process: reap them, unless `subprocess` already did
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
    assert -1 not in pids and len(set(pids)) == 3
    assert after.stream_id == before.stream_id and after.last_batch_id > before.last_batch_id
    # The restored stream goes on from the snapshot's batch, in a new epoch.
    assert resumed.stream_id == before.stream_id and resumed.last_batch_id > snapshot.last_batch_id
    epoch = json.loads((Path(checkpoint) / IDENTITY_FILE).read_text())["epoch"]
    assert epoch == (snapshot.epoch or 0) + 1
    log = (Path(checkpoint) / orch.CONTINUOUS_LOG).read_text()
    assert log.startswith(output)  # the restore left the run's output whole
    assert "Traceback" not in log, log[-2000:]


def _wait_for_batch_after(lake: Path, checkpoint: str, batch_id: int) -> None:
    """Wait until the running stream has committed a batch after ``batch_id``."""
    deadline = time.monotonic() + 300
    while orch.stream_position(str(lake), checkpoint).last_batch_id <= batch_id:
        assert time.monotonic() < deadline, f"no batch after {batch_id} in 300 s"
        time.sleep(1)

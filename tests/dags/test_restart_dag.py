"""The restart DAG against a live stream: stopped and resumed twice at new parallelism.

Its own file (it runs for minutes), so that the test workers run it beside the other DAG
runs instead of after them.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import pytest

from sessionlake import orchestration as orch
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
def test_restart_dag_resumes_the_stream_at_a_new_parallelism(
    locations: dict[str, Path], monkeypatch: pytest.MonkeyPatch
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
        assert _command_line(pids[1])[-4:] == ["--shuffle-partitions", "3", "--master", "local[1]"]
        after = orch.stream_position(str(locations["lake"]), checkpoint)
    finally:
        stop.set()
        orch.stop_continuous_run(checkpoint, timeout=300)
        for pid in pids:
            if pid > 0:  # started by this process: reap them, unless `subprocess` already did
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
    assert -1 not in pids and pids[0] != pids[1]
    assert after.stream_id == before.stream_id and after.last_batch_id > before.last_batch_id
    log = (Path(checkpoint) / orch.CONTINUOUS_LOG).read_text()
    assert "Traceback" not in log, log[-2000:]

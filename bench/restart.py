"""Restart cost against state size: how long a new process takes to commit one small batch.

For a size N, both systems first process the same input: N users with one event each,
within one hour, and a 3-day gap, so nothing closes and the state holds N open sessions
(sessionlake's ``open_sessions`` table, the peer's RocksDB store). Then one more small
file lands (a few events of existing users, just after every earlier event: no event is
late) and each system is started again on its own checkpoint.

Two figures per system, both from the new process's start:

* ``first_commit_s``: until the Spark checkpoint's first new ``commits/<batch>`` file was
  written (its mtime; sessionlake keeps Spark's checkpoint in ``<checkpoint>/spark``).
  Spark writes that file once the batch has committed its output, which for sessionlake
  means every Delta table of the batch, ``batch_metrics`` included. Both systems run on
  Spark, so the mark means the same thing for both.
* ``process_s``: the whole process, JVM start to exit, as an operator waits for it.

Each size is measured twice, in the order :func:`restart_order` gives, and reported as the
mean of the two (:func:`mean_restart`).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from statistics import mean
from typing import Any

from bench.processes import Timing, peer_run, query, sessionlake_run

START = datetime(2026, 1, 5, tzinfo=UTC)
#: A gap long enough that no session closes during the measurement, for both systems.
SESSIONLAKE_FLAGS = ("--gap", "3d", "--max-session-duration", "3d")
PEER_FLAGS = ("--gap", "3 days")
#: Events in the file that lands before the restart.
RESTART_EVENTS = 100


def event_line(event_id: str, user: int, at: datetime) -> str:
    """One jsonl event of the SPEC's model."""
    return json.dumps({"event_id": event_id, "user_id": f"u{user:07d}",
                       "event_time": at.isoformat().replace("+00:00", "Z"),
                       "event_type": "page_view", "page": "/"})


def write_open_sessions_input(folder: Path, users: int, files: int = 10) -> None:
    """``users`` users with one event each, spread over one hour, in ``files`` files."""
    folder.mkdir(parents=True, exist_ok=True)
    step = 3600 / users
    for f in range(files):
        lines = (event_line(f"open-{u}", u, START + timedelta(seconds=u * step))
                 for u in range(f, users, files))
        (folder / f"part-{f:05d}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_restart_file(folder: Path, users: int) -> None:
    """One more small file: events of existing users, after every event of the input."""
    later = START + timedelta(hours=1)
    lines = (event_line(f"restart-{i}", i % users, later + timedelta(seconds=i))
             for i in range(RESTART_EVENTS))
    (folder / "restart.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def commits(checkpoint: Path) -> dict[int, float]:
    """Batch id -> mtime (epoch seconds) of every commit marker of a streaming checkpoint."""
    folder = checkpoint / "commits"
    return {int(p.name): p.stat().st_mtime for p in folder.iterdir() if p.name.isdigit()}


def first_commit_s(checkpoint: Path, before: dict[int, float], run: Timing) -> float:
    """Seconds from the start of ``run`` to its first commit marker not in ``before``."""
    new = sorted(batch for batch in commits(checkpoint) if batch not in before)
    if not new:
        raise SystemExit(f"the restart committed no batch in {checkpoint}")
    return commits(checkpoint)[new[0]] - run.started


def measure_restart(size: int, out: Path) -> dict[str, Any]:
    """Build both systems' state with ``size`` open sessions, then time their restarts."""
    landing, lake, peer = out / "landing", out / "lake", out / "peer"
    write_open_sessions_input(landing, size)
    built = {"sessionlake": sessionlake_run(landing, lake, *SESSIONLAKE_FLAGS),
             "peer": peer_run(landing, peer, *PEER_FLAGS)}
    checkpoints = {"sessionlake": lake / "_checkpoints" / "stream" / "spark",
                   "peer": peer / "checkpoint"}
    before = {name: commits(path) for name, path in checkpoints.items()}
    write_restart_file(landing, size)
    restarted = {"sessionlake": sessionlake_run(landing, lake, *SESSIONLAKE_FLAGS),
                 "peer": peer_run(landing, peer, *PEER_FLAGS)}
    last_batch = query(lake, "SELECT batch_id, input_records, accepted, late, open_sessions, "
                             "duration_ms "
                             "FROM batch_metrics ORDER BY batch_id DESC LIMIT 1")[0]
    result: dict[str, Any] = {"size": size, "sessionlake_batch": last_batch,
                              "peer_state_rows": json.loads(
                                  restarted["peer"].stdout.splitlines()[-1])["state_rows"]}
    for name, run in restarted.items():
        result[f"{name}_build_s"] = built[name].seconds
        result[f"{name}_first_commit_s"] = first_commit_s(checkpoints[name], before[name], run)
        result[f"{name}_process_s"] = run.seconds
    return with_ratios(result)


def with_ratios(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with its ratios (sessionlake / peer) to the first commit and of the process."""
    result["ratio_first_commit"] = (result["sessionlake_first_commit_s"]
                                    / result["peer_first_commit_s"])
    result["ratio_process"] = result["sessionlake_process_s"] / result["peer_process_s"]
    return result


def restart_order(sizes: list[int]) -> list[int]:
    """``sizes`` ascending, then descending: each size measured twice, at mirrored places.

    A run's restarts do not take the same time at every place in it, whatever their size:
    the same code, sizes in the order 10^6, 10^4, 10^4, 10^6, took 23.3, 18.8, 15.3 and
    20.3 s to the first commit (2026-11-27), and in ascending order alone the smallest,
    measured first, looked the slowest. In mirrored places a drift along the run weighs on
    every size alike, so the largest-over-smallest ratio shows the state's cost, not the
    order.
    """
    up = sorted(sizes)
    return up + up[::-1]


def mean_restart(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One size's restart measurements as one: every time the mean of the runs', the
    ratios those means', and each run's ``batch_metrics`` row kept."""
    first = runs[0]
    result: dict[str, Any] = {
        "size": first["size"], "runs": len(runs), "peer_state_rows": first["peer_state_rows"],
        "sessionlake_batches": [run["sessionlake_batch"] for run in runs],
    }
    for key in first:
        if key.endswith("_s"):
            result[key] = mean(run[key] for run in runs)
    return with_ratios(result)

"""Deterministic crash points for the fault-injection tests.

``SESSIONLAKE_FAULT=<point>[@<batch id>]`` makes the process kill itself with SIGKILL the
first time it reaches ``<point>`` (in batch ``<batch id>``, when given): no ``finally``
block, no Spark shutdown hook runs, exactly like a machine that loses power. Unset, a
point costs one dictionary look-up.

Points, in the order a micro-batch reaches them: ``ingest``, ``before_merge``,
``after_merge``, ``after_sessions``, ``after_metrics`` (after the last table write, before
Spark commits the batch to the checkpoint). Outside the batches: ``erase``, in a
retention run after each table's DELETE of the erased users, before its purge; ``vacuum``,
in a retention run after its deletes, the batch locks let go, before its VACUUM.

With ``SESSIONLAKE_FAULT_PAUSE=<file>`` the point pauses instead of crashing: it creates
``<file>`` and waits until it is removed, then goes on. A test changes the world in that
pause (it freezes a Kafka broker, say) exactly where the batch stands.

With ``SESSIONLAKE_FAULT_STALL=<file>`` the point (once) starts a Spark job that never
ends (its one task creates ``<file>``, then sleeps): a batch stuck in Spark, as one waiting for
executors that never come, which only a cancellation of its jobs ends.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

POINTS: tuple[str, ...] = (
    "ingest", "before_merge", "after_merge", "after_sessions", "after_metrics",
)
_current_batch: list[int | None] = [None]


def set_batch(batch_id: int | None) -> None:
    """Tell the fault points which batch is running."""
    _current_batch[0] = batch_id


def point(name: str) -> None:
    """Crash here if ``SESSIONLAKE_FAULT`` names this point (and batch)."""
    wanted = os.environ.get("SESSIONLAKE_FAULT")
    if not wanted:
        return
    target, _, batch = wanted.partition("@")
    if target != name:
        return
    if batch and str(_current_batch[0]) != batch:
        return
    if pause := os.environ.get("SESSIONLAKE_FAULT_PAUSE"):
        _pause(Path(pause))
        return
    if stall := os.environ.get("SESSIONLAKE_FAULT_STALL"):
        _stall(Path(stall))
        return
    os.kill(os.getpid(), signal.SIGKILL)


def _pause(marker: Path) -> None:
    """Wait, once, until ``marker`` (created now) is removed."""
    os.environ.pop("SESSIONLAKE_FAULT", None)  # a replay of the batch goes through
    marker.touch()
    while marker.exists():
        time.sleep(0.1)


def _stall(marker: Path) -> None:
    """Run a Spark job whose one task creates ``marker``, then sleeps for a day: once the
    marker is there, the job runs, and only its cancellation ends it (a signal sent as the
    point is reached, before the job began, would cancel nothing and leave it to run). Once:
    a point other threads reach later goes through."""
    from pyspark.sql import SparkSession

    os.environ.pop("SESSIONLAKE_FAULT", None)
    where = str(marker)

    def stall(_: object) -> None:
        Path(where).touch()
        time.sleep(86_400)

    SparkSession.builder.getOrCreate().sparkContext.parallelize([0], 1).foreach(stall)

"""Health read without Spark: a missing lake, the stream's pid, compaction debt."""

from __future__ import annotations

import json
import os
from pathlib import Path

from sessionlake.checkpoint import PID_FILE
from sessionlake.config import settings_from
from sessionlake.deltalog import DataFile, DeletionVector, TableState
from sessionlake.health import COMPACT_MIN_FILES, collect_health, table_health


def test_a_missing_lake_is_a_problem_not_an_error(tmp_path: Path) -> None:
    health = collect_health(settings_from({"lake": str(tmp_path / "none")}, env={}))
    data = json.loads(json.dumps(health.as_json()))
    assert data["lake_exists"] is False and data["open_sessions"] is None
    assert (data["last_batch_id"], data["watermark"], data["lag_seconds"]) == (None, None, None)
    assert data["problems"][0].startswith(f"no lake at {tmp_path / 'none'}")


def test_stream_running_follows_the_pid_in_the_checkpoint(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    settings = settings_from({"lake": str(tmp_path / "lake"), "checkpoint": str(checkpoint)},
                             env={})
    assert collect_health(settings).stream_running is False  # no pid file
    (checkpoint / PID_FILE).write_text(str(os.getpid()))
    assert collect_health(settings).stream_running is True
    (checkpoint / PID_FILE).write_text("999999999")  # a run killed long ago
    assert collect_health(settings).stream_running is False


def _file(name: str, day: str, size: int, records: int, deleted: int = 0) -> DataFile:
    vector = DeletionVector("u", "x" * 20, 40, deleted, 1) if deleted else None
    return DataFile(f"day={day}/{name}", size, {"day": day}, records, 0, vector)


def test_compaction_debt_counts_small_files_sharing_a_partition() -> None:
    files = (
        *(_file(f"a{i}", "2026-01-05", 1000, 10) for i in range(COMPACT_MIN_FILES)),
        _file("b", "2026-01-06", 1000, 10, deleted=4),   # alone in its day: nothing to merge
        _file("c", "2026-01-07", 2 * 1024**3, 10),       # not small
    )
    state = TableState(Path("/nowhere"), 3, files, {"fields": []}, ("day",))
    health = table_health("events", state)
    assert (health.files, health.small_files, health.compactable_files) == (
        COMPACT_MIN_FILES + 2, COMPACT_MIN_FILES + 1, COMPACT_MIN_FILES)
    assert (health.deletion_vector_files, health.deleted_rows) == (1, 4)
    assert health.rows == 10 * (COMPACT_MIN_FILES + 2) - 4
    assert health.needs_compaction

"""Random maintenance between micro-batches, against the same model of SPEC's rules as
``test_random_streams.py``.

Each case lands a random stream's micro-batches one file at a time and runs the stream
after each, and between runs does a few of: compaction of every table, a snapshot (and
the expiry of all but the three newest), a restore of one of those (the next run then
reads the files landed since, one batch each as before), a rebuild of ``open_sessions``
and a backfill of the closed sessions' dates with the stream's own gap. None of them may
change a result: every closed and open session, every late event and every count must be
what the model says for the stream alone, and ``doctor`` must find the lake whole at the
end.
"""

from __future__ import annotations

import os
import random
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionlake.backfill import backfill_sessions
from sessionlake.compaction import compact_lake
from sessionlake.config import Settings, settings_from
from sessionlake.doctor import check_lake
from sessionlake.rebuild import rebuild_open_sessions
from sessionlake.snapshots import (
    Snapshot,
    create_snapshot,
    expire_snapshots,
    list_snapshots,
    restore_snapshot,
)
from sessionlake.stream import run_stream
from sessionlake.tables import read_table
from tests.helpers import NOW
from tests.reliability.test_random_streams import (
    DAY,
    GAP_SETTING,
    GRACE_SETTING,
    Model,
    as_line,
    as_setting,
    assert_as_the_model_says,
    max_duration_for,
    random_stream,
)

OPERATIONS = ("compact", "snapshot", "restore", "rebuild", "backfill")
#: The snapshots an expiry after each snapshot keeps.
KEEP_LAST = 3

#: Seed 9 does every operation, among them a restore after which the stream reads its last
#: batch again, and backfills of sessions cut by a 40-minute maximum duration.
SEEDS = (9,)


def cases() -> list[object]:
    """:data:`SEEDS`; ``SESSIONLAKE_TEST_SEEDS=0-99`` runs those seeds instead, for a
    longer soak. Odd seeds set a maximum duration that cuts their runs."""
    given = os.environ.get("SESSIONLAKE_TEST_SEEDS")
    chosen: list[int] = list(SEEDS)
    if given:
        chosen = []
        for part in given.split(","):
            first, _, last = part.partition("-")
            chosen += range(int(first), int(last or first) + 1)
    return [pytest.param(s, id=str(s)) for s in chosen]


def land(landing: Path, index: int, lines: list[str]) -> None:
    """Landing file ``index``, a minute newer than the one before: the stream reads the
    files in that order, one batch each."""
    landing.mkdir(parents=True, exist_ok=True)
    path = landing / f"part-{index:03d}.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    stamp = 1_700_000_000 + 60 * index
    os.utime(path, (stamp, stamp))


class Maintenance:
    """The operations, done on one lake, and what each did."""

    def __init__(self, spark: SparkSession, settings: Settings) -> None:
        self.spark, self.settings = spark, settings
        self.snapshots: list[Snapshot] = []
        self.done: list[str] = []

    def do(self, operation: str, rng: random.Random) -> None:
        spark, settings = self.spark, self.settings
        if operation == "compact":
            compact_lake(spark, settings.lake, min_files=1)
        elif operation == "snapshot":
            # The DAG's way: a snapshot, then the expiry of all but the newest few (an
            # expired one is no longer a restore's to choose).
            create_snapshot(spark, settings)
            expire_snapshots(spark, settings, max_age_days=None, keep_last=KEEP_LAST)
            self.snapshots = list_snapshots(settings.lake)
        elif operation == "restore":
            if not self.snapshots:
                return
            restore_snapshot(spark, settings, rng.choice(self.snapshots).snapshot_id)
        elif operation == "rebuild":
            rebuild_open_sessions(spark, settings, clock=lambda: NOW)
        elif operation == "backfill":
            dates = read_table(spark, settings.lake, "sessions").agg(
                F.min("session_date"), F.max("session_date")).head()
            if dates is None or dates[0] is None:
                return
            backfill_sessions(spark, settings, dates[0], dates[1], clock=lambda: NOW)
        self.done.append(operation)


def run(spark: SparkSession, settings: Settings) -> list[int]:
    """One available-now run; the ids of the batches it processed."""
    return [r["batch_id"] for r in run_stream(spark, settings, clock=lambda: NOW).processed]


@pytest.mark.parametrize("seed", cases())
def test_maintenance_between_batches_changes_no_result(
    spark: SparkSession, tmp_path: Path, seed: int
) -> None:
    max_duration = max_duration_for(seed) if seed % 2 else None
    start: datetime = DAY if max_duration is None else DAY + timedelta(hours=21)
    batches = random_stream(seed, start)
    model = Model(max_duration)
    for records in batches:
        model.batch(records)

    limits = {} if max_duration is None else {"max_session_duration": as_setting(max_duration)}
    settings = settings_from(
        {"lake": str(tmp_path / "lake"), "source": str(tmp_path / "landing"),
         "gap": GAP_SETTING, "grace": GRACE_SETTING, "max_files_per_trigger": 1, **limits},
        env={})
    rng = random.Random(f"maintenance-{seed}")
    maintenance = Maintenance(spark, settings)
    processed: list[int] = []
    for index, records in enumerate(batches):
        land(Path(str(settings.source)), index, [as_line(e) for e in records])
        processed += run(spark, settings)
        for operation in rng.sample(OPERATIONS, rng.randrange(1, 4)):
            maintenance.do(operation, rng)
    processed += run(spark, settings)  # what a restore after the last batch left to read

    assert_as_the_model_says(spark, settings.lake, model, batches)
    # Each batch once in the tables, however often a restore made the stream read it.
    assert sorted(set(processed)) == list(range(len(batches)))
    assert check_lake(None, settings).healthy, maintenance.done

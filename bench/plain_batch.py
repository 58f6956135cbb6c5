"""The baseline: a plain batch sessionization of the landing files, no stream, no state.

What the stream's results must equal (SPEC: "they equal a batch sessionization of the
same events"), so its time is the floor that the incremental machinery is measured
against. It reads the files whole and parses them with sessionlake's own adapter and
guards (the same parsing cost as ``sessionlake run``), drops quarantined records and
repeated event ids, sessionizes every event at once with
:func:`~sessionlake.sessionize.sessionize_events` (30-minute gap, 24-hour maximum, the
run's defaults), and overwrites one Delta table in the shape of ``sessions``. Run as a
separate process, so it is timed whole like the others:

    python -m bench.plain_batch SOURCE OUT
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

from sessionlake.config import Settings
from sessionlake.sessionize import as_closed_sessions, drop_duplicate_events, sessionize_events
from sessionlake.sources import adapter_for, file_lines, number_lines
from sessionlake.spark import build_spark
from sessionlake.storage import path_part
from sessionlake.validation import apply_guards, cap_record_size, valid_events


def main(argv: list[str]) -> int:
    """Sessionize every event under ``argv[0]`` into the Delta table at ``argv[1]``."""
    source, out = argv[:2]
    defaults = Settings(lake=out)
    spark = build_spark("local[*]", app_name="plain-batch",
                        shuffle_partitions=defaults.shuffle_partitions)
    now = datetime.now(UTC)
    lines = number_lines(file_lines(spark.read, source), path_part(spark, source))
    candidates = adapter_for("jsonl").parse(cap_record_size(lines))
    events = valid_events(apply_guards(candidates, now, defaults.max_future_skew))
    sessions = sessionize_events(drop_duplicate_events(events),
                                 defaults.gap, defaults.max_session_duration)
    as_closed_sessions(sessions, defaults.gap, 0, now).write.format("delta") \
        .mode("overwrite").save(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

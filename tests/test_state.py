"""How the ``open_sessions`` MERGE is planned (``sessionlake.state``): when it names its
source's session ids, and when it rewrites the files it touches."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from pyspark.sql import SparkSession

from sessionlake.config import settings_from
from sessionlake.state import (
    COPY_ON_WRITE_STATE_ROWS_PER_SOURCE_ROW,
    LITERAL_KEYS_MAX,
    STATE_ROWS_PER_LITERAL,
    copies_on_write,
    names_session_ids,
    none_closes_by,
)
from sessionlake.tables import OPEN_SESSIONS, table_version
from tests.helpers import event, hm, run_batches


@pytest.mark.parametrize(
    ("source_rows", "state_rows", "named"),
    [
        (100, 1_000_000, True),     # a restart's few changes over a large state
        (100, 10_000, True),        # just enough state per change
        (1_000, 10_000, False),     # too little state to spare
        (1_000, 1_000_000, True),
        (3_000, 1_000_000, False),  # too many literals to plan
        (LITERAL_KEYS_MAX, STATE_ROWS_PER_LITERAL * LITERAL_KEYS_MAX, True),
        (LITERAL_KEYS_MAX + 1, 10**12, False),
        (0, 0, True),               # nothing to name: an empty list, nothing matches
        (None, 1_000_000, False),   # sizes unknown: joined
        (100, None, False),
    ],
)
def test_names_session_ids_only_for_a_small_source_over_much_state(
    source_rows: int | None, state_rows: int | None, named: bool
) -> None:
    assert names_session_ids(source_rows, state_rows) is named


@pytest.mark.parametrize(
    ("source_rows", "state_rows", "rewritten"),
    [
        (30_000, 90_000, True),     # a steady batch changes much of the state it touches
        (36_000, 25_000, True),     # more changes than open sessions (new ones inserted)
        (100, 10_000, False),       # a restart's few changes: deletion vectors
        (100, 1_000_000, False),
        (100, COPY_ON_WRITE_STATE_ROWS_PER_SOURCE_ROW * 100, True),
        (100, COPY_ON_WRITE_STATE_ROWS_PER_SOURCE_ROW * 100 + 1, False),
        (0, 0, True),               # nothing touched, nothing copied
        (None, 1_000, False),       # sizes unknown: Delta's default
        (1_000, None, False),
    ],
)
def test_copies_on_write_when_the_source_changes_much_of_the_touched_state(
    source_rows: int | None, state_rows: int | None, rewritten: bool
) -> None:
    assert copies_on_write(source_rows, state_rows) is rewritten


def test_none_closes_by_the_least_session_end_of_the_versions_files(
    spark: SparkSession, lake: str
) -> None:
    """No open session ends at or before the threshold, by the files' statistics, at the
    version asked for; anything it cannot tell is "look"."""
    cfg = settings_from({"lake": lake, "gap": "72h", "max_session_duration": "7d"}, env={})
    run_batches(spark, cfg, [[event("u1", "10:00"), event("u1", "10:20")],
                             [event("u2", "09:30:00.250600")]])
    first, second = 1, table_version(spark, lake, OPEN_SESSIONS)
    assert second > first
    u1_end, u2_end = hm("10:20").replace(tzinfo=UTC), hm("09:30").replace(tzinfo=UTC)
    tick = timedelta(milliseconds=1)
    assert none_closes_by(lake, first, u1_end - tick)  # only u1's session then
    assert not none_closes_by(lake, first, u1_end)     # it closes at its end
    assert not none_closes_by(lake, second, u1_end - tick)  # u2's 09:30:00.2506 is older
    assert none_closes_by(lake, second, u2_end)  # 09:30:00.2506 is after 09:30
    assert not none_closes_by(lake, second, u2_end + timedelta(milliseconds=250))
    # Delta writes 09:30:00.250 (times in statistics are cut to the millisecond, down): a
    # threshold between that and the end looks, and one after the end (it closes) too.
    assert not none_closes_by(lake, second, u2_end + timedelta(microseconds=250_300))
    assert not none_closes_by(lake, second, u2_end + timedelta(microseconds=250_800))
    assert not none_closes_by(lake, second + 1, u2_end)  # no such version
    assert not none_closes_by("s3a://bucket/lake", second, u2_end)  # not on this machine

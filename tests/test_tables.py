"""The lake's tables: creation, including after a process was killed while creating them."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sessionlake.tables import (
    ALL_TABLES,
    EVENTS,
    OPEN_SESSIONS,
    ensure_tables,
    read_table,
    table_exists,
    table_path,
)


@pytest.mark.parametrize("half_created", [(OPEN_SESSIONS,), (EVENTS, OPEN_SESSIONS), ALL_TABLES])
def test_tables_a_kill_left_half_created_are_created_on_the_next_run(
    spark: SparkSession, lake: str, half_created: tuple[str, ...]
) -> None:
    # A SIGKILL during CREATE TABLE can leave a _delta_log folder without a commit (as a
    # random kill in tests/reliability did): CREATE TABLE IF NOT EXISTS then does nothing.
    for table in half_created:
        log = Path(table_path(lake, table)) / "_delta_log"
        (log / "_staged_commits").mkdir(parents=True)
        (log / ".00000000000000000000.json.0b1c.tmp").write_text("{")
    assert not table_exists(spark, lake, OPEN_SESSIONS)

    assert ensure_tables(spark, lake, user_buckets=4) == 4

    assert all(table_exists(spark, lake, table) for table in ALL_TABLES)
    assert read_table(spark, lake, OPEN_SESSIONS).count() == 0


def test_creating_tables_keeps_the_bucket_count_of_an_existing_lake(
    spark: SparkSession, lake: str
) -> None:
    assert ensure_tables(spark, lake, user_buckets=4) == 4
    assert ensure_tables(spark, lake, user_buckets=16) == 4

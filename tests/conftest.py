"""Shared fixtures: one Spark session for the whole run, a fresh lake per test."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Spark hands timestamps to Python as naive local times: make local time UTC.
os.environ["TZ"] = "UTC"
time.tzset()

from pyspark.sql import SparkSession  # noqa: E402

from sessionlake.spark import build_spark  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A local[2] Spark with Delta, UI off, two shuffle partitions."""
    session = build_spark(
        "local[2]",
        app_name="sessionlake-tests",
        shuffle_partitions=2,
        conf={"spark.ui.enabled": "false", "spark.driver.memory": "2g"},
    )
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path: Path) -> str:
    """A fresh, empty lake folder."""
    return str(tmp_path / "lake")

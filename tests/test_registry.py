"""The lake's register of its streams: each checkpoint noted once, with its source, and a
Kafka topic known by its cluster's id before its brokers' spelling."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sessionlake.registry import (
    lake_stream_entries,
    lake_stream_sources,
    lake_streams,
    register_stream,
    same_kafka_topic,
)


def test_the_lakes_streams_are_noted_once_and_a_copy_names_its_own_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    lake, outside = tmp_path / "lake", tmp_path / "elsewhere" / "checkpoint"
    inside = lake / "_checkpoints" / "stream"
    register_stream(spark, str(lake), str(inside))  # as a run before sources were noted
    for _ in range(2):  # noted once, the source added to the older note
        register_stream(spark, str(lake), str(inside), "/landing")
        register_stream(spark, f"file://{lake}", f"file://{outside}/", "kafka://b:9092/t")
    assert len(os.listdir(lake / "_checkpoints" / "streams")) == 2
    assert lake_stream_sources(None, str(lake)) == {
        str(inside): "/landing", str(outside): "kafka://b:9092/t"}
    assert lake_streams(None, str(lake)) == sorted([str(inside), str(outside)])

    shutil.copytree(lake, tmp_path / "copy")
    assert lake_streams(None, str(tmp_path / "copy")) == sorted(
        [str(tmp_path / "copy" / "_checkpoints" / "stream"), str(outside)])

    # A Kafka stream noted before clusters were gets its cluster's id at its next run, and
    # keeps it through a run whose brokers could not tell it.
    for cluster in ("C1", None):
        register_stream(spark, str(lake), str(outside), "kafka://b:9092/t", cluster)
    assert lake_stream_entries(None, str(lake))[str(outside)] == {
        "checkpoint": str(outside), "source": "kafka://b:9092/t", "kafka_cluster": "C1"}
    # Likewise the topic's id, which then stays the one the checkpoint first read.
    for topic_id in ("T1", None, "T2"):
        register_stream(spark, str(lake), str(outside), "kafka://b:9092/t", "C1", topic_id)
    assert lake_stream_entries(None, str(lake))[str(outside)]["kafka_topic_id"] == "T1"


@pytest.mark.parametrize(("noted", "cluster", "same"), [
    # Other brokers of the same cluster, and the same brokers now serving another cluster.
    ({"source": "kafka://b1:9092,b2:9092/t", "kafka_cluster": "C"}, "C", True),
    ({"source": "kafka://b1:9092/t", "kafka_cluster": "D"}, "C", False),
    # The topic deleted and created anew since (its id is "T" now), or noted before ids were.
    ({"source": "kafka://b1:9092/t", "kafka_cluster": "C", "kafka_topic_id": "T"}, "C", True),
    ({"source": "kafka://b1:9092/t", "kafka_cluster": "C", "kafka_topic_id": "S"}, "C", False),
    # Noted before clusters were: by the brokers, host names in any case; topics are
    # case-sensitive.
    ({"source": "kafka://B1:9092/t"}, "C", True),
    ({"source": "kafka://b1:9092/T"}, None, False),
    ({"source": "/landing"}, "C", False),
    ({"source": None}, "C", False),
])
def test_a_topic_is_known_by_its_cluster_else_by_its_brokers(
    noted: dict[str, str | None], cluster: str | None, same: bool
) -> None:
    assert same_kafka_topic(noted, "kafka://b1:9092/t", cluster, "T") is same

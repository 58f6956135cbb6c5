"""A restore written from the log must leave the table exactly as Delta's RESTORE does."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from sessionlake import deltarestore
from sessionlake.deltalog import clear_delta_cache, read_log
from sessionlake.deltarestore import ConcurrentCommit, is_at, restore_commit


def _history(spark: SparkSession, path: Path, interval: int) -> Path:
    """A partitioned table with deletion vectors, rewritten files and, with a small
    ``interval``, log checkpoints among its versions:
    0 created, 1 append, 2 DELETE (vectors), 3 append, 4 OPTIMIZE, 5 UPDATE, 6 DELETE."""
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, part STRING, tags MAP<STRING, STRING>) "
        "USING DELTA PARTITIONED BY (part) TBLPROPERTIES "
        f"('delta.enableDeletionVectors' = 'true', 'delta.checkpointInterval' = '{interval}')"
    )

    def rows(start: int) -> DataFrame:
        return spark.range(start, start + 300).select(
            "id", F.when(F.col("id") % 3 == 0, "a").otherwise("b").alias("part"),
            F.create_map(F.lit("k"), F.col("id").cast("string")).alias("tags"))

    rows(0).repartition(2).write.format("delta").mode("append").save(str(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 7 = 0")
    rows(300).write.format("delta").mode("append").save(str(path))
    spark.sql(f"OPTIMIZE delta.`{path}`")
    spark.sql(f"UPDATE delta.`{path}` SET tags = map('k', 'x') WHERE id BETWEEN 10 AND 40")
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id > 550")
    return path


@pytest.fixture(scope="module", params=[100, 2], ids=["commits only", "log checkpoints"])
def history(request: pytest.FixtureRequest, spark: SparkSession,
            tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _history(spark, tmp_path_factory.mktemp("history") / "t", request.param)


def _files(spark: SparkSession, path: Path) -> list[str]:
    return sorted(f.rsplit(f"{path.name}/", 1)[1]
                  for f in spark.read.format("delta").load(str(path)).inputFiles())


@pytest.mark.parametrize("version", [0, 1, 2, 4, 5])
def test_the_commit_leaves_the_table_as_deltas_restore_does(
    spark: SparkSession, history: Path, tmp_path: Path, version: int
) -> None:
    ours, delta = tmp_path / "ours", tmp_path / "delta"
    shutil.copytree(history, ours)
    shutil.copytree(history, delta)

    metrics = restore_commit(str(ours), version)
    DeltaTable.forPath(spark, str(delta)).restoreToVersion(version)

    assert metrics is not None
    assertDataFrameEqual(spark.read.format("delta").load(str(ours)),
                         spark.read.format("delta").load(str(delta)))
    assert _files(spark, ours) == _files(spark, delta)
    ours_info, delta_info = (DeltaTable.forPath(spark, str(p)).history(1).head()
                             for p in (ours, delta))
    assert ours_info is not None and delta_info is not None
    assert (ours_info["operation"], ours_info["operationParameters"],
            ours_info["operationMetrics"]) == \
        (delta_info["operation"], delta_info["operationParameters"],
         delta_info["operationMetrics"])
    assert is_at(str(ours), version)
    # Delta writes on top of it as on top of its own.
    for table in (ours, delta):
        spark.sql(f"DELETE FROM delta.`{table}` WHERE id % 5 = 1")
        spark.range(900, 910).selectExpr("id", "'a' AS part", "map('k', 'new') AS tags") \
            .write.format("delta").mode("append").save(str(table))
    assertDataFrameEqual(spark.read.format("delta").load(str(ours)),
                         spark.read.format("delta").load(str(delta)))


@pytest.mark.parametrize("change", ["row tracking", "protocol changed since", "append-only"])
def test_a_table_it_does_not_know_how_to_restore_is_left_to_delta(
    spark: SparkSession, tmp_path: Path, change: str
) -> None:
    path = tmp_path / "t"
    features = "'delta.enableRowTracking' = 'true'" if change == "row tracking" else \
        "'delta.appendOnly' = 'true'" if change == "append-only" else "'x' = 'y'"
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING DELTA TBLPROPERTIES ({features})")
    spark.range(3).write.format("delta").mode("append").save(str(path))
    if change == "protocol changed since":
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
                  "('delta.enableDeletionVectors' = 'true')")
    spark.range(3, 6).write.format("delta").mode("append").save(str(path))
    log_before = sorted(p.name for p in (path / "_delta_log").iterdir())

    assert deltarestore.refusal(read_log(None, str(path)), read_log(None, str(path), 1))
    assert restore_commit(str(path), 1) is None
    assert sorted(p.name for p in (path / "_delta_log").iterdir()) == log_before


def test_a_commit_by_another_writer_meanwhile_is_not_overwritten(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _history(spark, tmp_path / "t", 100)
    clear_delta_cache(spark)
    real_read_log = deltarestore.read_log

    def read_then_someone_commits(spark_: None, uri: str, version: int | None = None) -> object:
        found = real_read_log(spark_, uri, version)
        if version is not None:  # between the restore's reading and its writing
            spark.range(1000, 1001).selectExpr("id", "'a' AS part", "map('k', 'z') AS tags") \
                .write.format("delta").mode("append").save(str(path))
        return found

    monkeypatch.setattr(deltarestore, "read_log", read_then_someone_commits)
    with pytest.raises(ConcurrentCommit, match="version 7 was committed by another writer"):
        restore_commit(str(path), 2)
    newest = DeltaTable.forPath(spark, str(path)).history(1).head()
    assert newest is not None and newest["operation"] == "WRITE"
    assert spark.read.format("delta").load(str(path)).where("id = 1000").count() == 1
    assert not [p for p in (path / "_delta_log").iterdir() if p.name.endswith(".tmp")]

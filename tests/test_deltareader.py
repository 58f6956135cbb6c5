"""The JVM-free Delta reader against tables Spark wrote: deletion vectors, checkpoints."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionlake import deltareader


@pytest.fixture(scope="module")
def dv_table(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A partitioned table with deletion vectors of every container kind and a checkpoint.

    One file per partition; DELETEs of every other row of ``a`` (a bitset container), of
    contiguous ranges of ``b`` (run containers) and of a few scattered rows of ``c`` (an
    array container), some on top of an earlier vector (the log replaces the file's).
    """
    path = tmp_path_factory.mktemp("dv") / "t"
    spark.sql(
        f"CREATE TABLE delta.`{path}` (id BIGINT, part STRING, at TIMESTAMP) USING DELTA "
        "PARTITIONED BY (part) TBLPROPERTIES ('delta.enableDeletionVectors' = 'true', "
        "'delta.checkpointInterval' = '3')"
    )
    frame = spark.range(20000).select(
        "id", F.when(F.col("id") < 10000, "a").when(F.col("id") < 19000, "b")
        .otherwise("c").alias("part"),
        (F.lit("2026-01-05 00:00:00").cast("timestamp")
         + F.make_interval(secs=F.col("id"))).alias("at"),
    )
    frame.repartition(3, "part").write.format("delta").mode("append").save(str(path))
    for condition in ("id % 2 = 0 AND part = 'a'", "id BETWEEN 12000 AND 15000",
                      "id IN (1, 3, 5, 19001, 19003, 19005)", "id BETWEEN 15001 AND 15010"):
        spark.sql(f"DELETE FROM delta.`{path}` WHERE {condition}")
    return path


def test_row_count_comes_from_the_log(spark: SparkSession, dv_table: Path) -> None:
    state = deltareader.read_state(dv_table)
    assert any(f.deletion_vector for f in state.files)
    assert any(p.name.endswith(".checkpoint.parquet")
               for p in (dv_table / "_delta_log").iterdir())
    assert state.row_count() == spark.read.format("delta").load(str(dv_table)).count()


def test_rows_leave_deleted_rows_out(spark: SparkSession, dv_table: Path) -> None:
    state = deltareader.read_state(dv_table)
    ours = deltareader.read_rows(state, ["id", "part", "at"]).to_pylist()
    theirs = spark.read.format("delta").load(str(dv_table)).collect()
    assert sorted((r["id"], r["part"], r["at"].replace(tzinfo=None)) for r in ours) == \
        sorted((r["id"], r["part"], r["at"]) for r in theirs)


def test_the_newest_operation_is_known_when_a_checkpoint_was_written_at_it(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING DELTA "
              "TBLPROPERTIES ('delta.checkpointInterval' = '2')")
    spark.range(3).write.format("delta").mode("append").save(str(path))
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 0")  # version 2, and its checkpoint
    assert (path / "_delta_log" / f"{2:020d}.checkpoint.parquet").exists()
    state = deltareader.read_state(path)
    assert (state.version, state.last_operation, state.row_count()) == (2, "DELETE", 2)


def test_z85_decodes_the_protocol_example() -> None:
    # The Delta protocol's example: this UUID is written "vBn[lx{q8@P<9BNH/isA".
    import uuid

    assert str(uuid.UUID(bytes=deltareader.z85_decode("vBn[lx{q8@P<9BNH/isA"))) == \
        "61d16c75-6994-46b7-a15b-8b538852e50e"


def test_a_folder_without_a_log_is_refused(tmp_path: Path) -> None:
    with pytest.raises(deltareader.DeltaReadError, match="not a Delta table"):
        deltareader.read_state(tmp_path)


def test_int96_and_int64_timestamps_read_alike(spark: SparkSession, tmp_path: Path) -> None:
    # Lakes written before sessionlake stored timestamps as INT64 hold INT96 files too,
    # written here by a session of its own, so the suite's session keeps its settings.
    path = tmp_path / "t"
    at = (F.lit("2026-01-05 10:00:00").cast("timestamp")
          + F.make_interval(secs=F.col("id"))).alias("at")
    older = spark.newSession()
    older.conf.set("spark.sql.parquet.outputTimestampType", "INT96")
    older.range(0, 3).select("id", at).write.format("delta").save(str(path))
    spark.range(3, 6).select("id", at).write.format("delta").mode("append").save(str(path))

    state = deltareader.read_state(path)
    kinds: set[str] = set()
    for data_file in state.files:
        schema = pq.ParquetFile(state.file_path(data_file)).schema
        kinds.add(schema.column(schema.names.index("at")).physical_type)
    assert kinds == {"INT96", "INT64"}
    ours = deltareader.read_rows(state, ["id", "at"]).to_pylist()
    theirs = spark.read.format("delta").load(str(path)).collect()
    assert sorted((r["id"], r["at"].replace(tzinfo=None)) for r in ours) == \
        sorted((r["id"], r["at"]) for r in theirs)
    assert len(ours) == 6


@pytest.mark.parametrize("meanwhile", ["commits", "the table made anew", "nothing",
                                       "nothing, but too many files to remember"])
def test_a_table_read_again_replays_only_the_commits_since(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, meanwhile: str,
) -> None:
    """The health page reads every table at each load: a table read before is taken up
    from its last state read, and gives what a whole replay gives; a table made anew in
    the same folder is replayed whole, and so is a table of too many files to keep."""
    if meanwhile.endswith("too many files to remember"):
        monkeypatch.setattr(deltareader, "REMEMBERED_FILES_MAX", 0)
    path = tmp_path / "t"
    spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING DELTA TBLPROPERTIES "
              "('delta.enableDeletionVectors' = 'true', 'delta.checkpointInterval' = '4')")
    spark.range(0, 100).write.format("delta").mode("append").save(str(path))
    before = deltareader.read_state(path, remember=True)
    if meanwhile == "commits":  # a checkpoint at version 4 among them
        spark.range(100, 200).write.format("delta").mode("append").save(str(path))
        spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 3 = 0")
        spark.range(200, 250).write.format("delta").mode("append").save(str(path))
        spark.sql(f"DELETE FROM delta.`{path}` WHERE id < 10")
    elif meanwhile == "the table made anew":
        shutil.rmtree(path)
        spark.sql(f"CREATE TABLE delta.`{path}` (id BIGINT) USING DELTA")
        for start in (500, 600):
            spark.range(start, start + 7).write.format("delta").mode("append").save(str(path))
    replayed: list[str] = []
    apply_commit = deltareader._Replay.apply_commit

    def counted(replay: deltareader._Replay, commit: Path) -> None:
        replayed.append(commit.name)
        apply_commit(replay, commit)

    monkeypatch.setattr(deltareader._Replay, "apply_commit", counted)
    again = deltareader.read_state(path, remember=True)

    expected = {"commits": [f"{v:020d}.json" for v in range(2, 6)],
                "the table made anew": [f"{v:020d}.json" for v in range(3)],
                "nothing": [],
                "nothing, but too many files to remember": [f"{v:020d}.json" for v in range(2)],
                }[meanwhile]
    assert replayed == expected
    assert again.row_count() == spark.read.format("delta").load(str(path)).count()
    whole = deltareader.read_state(path)  # not remembered: the whole log
    assert (again.version, sorted(again.files, key=str), again.last_operation) == \
        (whole.version, sorted(whole.files, key=str), whole.last_operation)
    assert before.version == 1

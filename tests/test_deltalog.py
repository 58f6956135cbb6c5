"""The Delta log read without Spark: what a version needs to be returned to."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sessionlake import deltalog


@pytest.mark.parametrize("removed", ["a commit the replay read", "a data file",
                                     "nothing", "nothing, but too many files to remember"])
def test_a_version_found_whole_is_checked_again_without_a_replay_and_found_damaged(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, removed: str,
) -> None:
    """Asked again with the table's files, a version found whole before is not replayed
    (the health page asks for every kept snapshot at each load), yet a log entry or a data
    file deleted since is still found. A version of too many files is not remembered."""
    if removed.endswith("too many files to remember"):
        monkeypatch.setattr(deltalog, "REMEMBERED_FILES_MAX", 0)
    uri = str(tmp_path / "table")
    for n in range(3):
        spark.range(n * 10, n * 10 + 10).write.format("delta").mode("append").save(uri)
    assert deltalog.missing_at(None, uri, 1, deltalog.files_on_disk(None, uri)) is None
    replays: list[int | None] = []
    replay = deltalog.read_log

    def counted_replay(spark: SparkSession | None, uri: str,
                       version: int | None = None) -> deltalog.TableLog:
        replays.append(version)
        return replay(spark, uri, version)

    monkeypatch.setattr(deltalog, "read_log", counted_replay)
    needed = deltalog.read_log(None, uri, 1)
    replays.clear()
    if removed == "a commit the replay read":
        (tmp_path / "table" / deltalog.commit_file(1)).unlink()
    elif removed == "a data file":
        (tmp_path / "table" / sorted(f.path for f in needed.files.values())[0]).unlink()

    missing = deltalog.missing_at(None, uri, 1, deltalog.files_on_disk(None, uri))

    if removed.startswith("nothing"):
        assert (missing, replays) == (None, [] if removed == "nothing" else [1])
    else:
        assert missing is not None and missing.startswith("cannot return to version 1: ")
        assert replays == [1]
        assert ("missing Delta log entry" if "commit" in removed
                else "data file is missing") in missing

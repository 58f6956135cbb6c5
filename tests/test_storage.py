"""The file operations behave the same through Python's I/O and through Hadoop.

Local lakes take the Python branch; every other scheme (``s3a://``, ``hdfs://``) takes
Hadoop's FileSystem, which no other test reaches: here the ``hadoop`` case sends local
``file:`` URIs through it (Hadoop's real local FileSystem, on disk), so that both branches
are held to one contract.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sessionlake import storage


@pytest.fixture(params=["python", "hadoop"])
def uri(request: pytest.FixtureRequest, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> Callable[[str], str]:
    """``uri(name)``: the URI of ``name`` in a fresh folder, for the branch under test."""
    if request.param == "hadoop":
        monkeypatch.setattr(storage, "local_path", lambda _uri: None)
    return lambda name: f"file://{tmp_path / name}"


def _visible(names: list[str]) -> list[str]:
    """Without Hadoop's checksum side files (``.name.crc``), which only its branch writes."""
    return [n for n in names if not n.endswith(".crc")]


def test_a_written_file_reads_back_whole(spark: SparkSession,
                                         uri: Callable[[str], str]) -> None:
    target = uri("a/b/ledger.json")
    assert storage.read_text(spark, target) is None
    assert storage.read_bytes(spark, target) is None
    assert storage.file_size(spark, target) is None
    assert not storage.exists(spark, target)

    storage.write_text(spark, target, '{"é": 1}')
    storage.write_text(spark, target, '{"é": 2}')  # replaced whole, not appended

    assert storage.exists(spark, target)
    assert storage.read_text(spark, target) == '{"é": 2}'
    assert storage.read_bytes(spark, target) == '{"é": 2}'.encode()
    assert storage.file_size(spark, target) == len('{"é": 2}'.encode())
    assert storage.file_size(spark, uri("a/b")) is None  # a folder has no size
    assert _visible(storage.list_names(spark, uri("a/b"))) == ["ledger.json"]


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(
        spark: SparkSession, uri: Callable[[str], str]) -> None:
    target = uri("ledger.json")
    storage.write_text(spark, target, "old")

    with pytest.raises(UnicodeEncodeError):
        storage.write_text(spark, target, "new \ud800")  # a lone surrogate: no UTF-8

    assert storage.read_text(spark, target) == "old"
    assert _visible(storage.list_names(spark, uri(""))) == ["ledger.json"]


def test_a_moved_file_is_gone_from_its_source_and_refuses_to_overwrite(
        spark: SparkSession, uri: Callable[[str], str]) -> None:
    storage.write_text(spark, uri("one"), "1")
    storage.write_text(spark, uri("two"), "2")

    storage.move(spark, uri("one"), uri("moved/one"))

    assert storage.read_text(spark, uri("moved/one")) == "1"
    assert not storage.exists(spark, uri("one"))
    with pytest.raises(FileExistsError):
        storage.move(spark, uri("two"), uri("moved/one"))
    assert storage.read_text(spark, uri("moved/one")) == "1"


def test_a_copied_tree_replaces_the_target_and_lists_the_same_files(
        spark: SparkSession, uri: Callable[[str], str]) -> None:
    storage.write_text(spark, uri("src/x.txt"), "x")
    storage.write_text(spark, uri("src/sub/y.txt"), "yy")
    storage.write_text(spark, uri("dst/stale.txt"), "old")

    storage.copy_tree(spark, uri("src"), uri("dst"))

    copied = {name: size for name, (size, _) in storage.tree_state(spark, uri("dst")).items()
              if not name.endswith(".crc")}
    assert copied == {"x.txt": 1, "sub/y.txt": 2}
    assert storage.tree_state(spark, uri("absent")) == {}
    storage.copy_tree(spark, uri("src/x.txt"), uri("dst/x.txt"))  # a file, over a file
    storage.copy_tree(spark, uri("src/x.txt"), uri("one.txt"))
    assert [storage.read_text(spark, uri(n)) for n in ("dst/x.txt", "one.txt")] == ["x", "x"]


def test_delete_removes_files_and_folders_and_ignores_what_is_absent(
        spark: SparkSession, uri: Callable[[str], str]) -> None:
    storage.write_text(spark, uri("tree/a/b.txt"), "b")
    storage.write_text(spark, uri("c.txt"), "c")

    storage.delete(spark, uri("tree"))
    storage.delete(spark, uri("c.txt"))
    storage.delete(spark, uri("never"))

    assert not storage.exists(spark, uri("tree"))
    assert not storage.exists(spark, uri("c.txt"))
    assert storage.list_names(spark, uri("never")) == []


def test_a_local_write_is_on_disk_before_its_name_and_the_rename_after(
        spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A power cut after the rename must not leave an empty file under the name (a file
    system may order the rename before the data), nor the old file after the call."""
    steps: list[str] = []
    real_fsync, real_replace = storage.os.fsync, storage.os.replace

    def fsync(fd: int) -> None:
        steps.append("sync folder" if Path(f"/proc/self/fd/{fd}").resolve().is_dir()
                     else "sync file")
        real_fsync(fd)

    def replace(src: str, dst: str) -> None:
        steps.append("rename")
        real_replace(src, dst)

    monkeypatch.setattr(storage.os, "fsync", fsync)
    monkeypatch.setattr(storage.os, "replace", replace)
    storage.write_text(spark, str(tmp_path / "ledger.json"), "new")

    assert steps == ["sync file", "rename", "sync folder"]
    assert (tmp_path / "ledger.json").read_text() == "new"


@pytest.mark.parametrize(("path", "folder", "inside"), [
    ("landing", "landing", True),
    ("landing/lake", "landing/", True),
    ("link/lake", "landing", True),  # through a symbolic link to the folder
    ("other/../landing/lake", "landing", True),
    ("landing2/lake", "landing", False),  # a sibling whose name starts alike
    ("lake", "landing", False),
    ("s3a://bucket/landing/lake", "s3a://bucket/landing", True),
    ("s3a://bucket/lake", "s3a://bucket/landing", False),
    ("s3a://bucket/landing", "landing", False),
])
def test_within_tells_a_path_in_a_folder_however_either_is_spelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str, folder: str, inside: bool
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "landing").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "landing")
    assert storage.within(path, folder) is inside

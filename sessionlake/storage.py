"""Small file operations on lake and checkpoint locations, through Hadoop's FileSystem.

Going through the JVM's FileSystem (rather than Python's ``os``) keeps every location a
URI: the same code works for ``/data/lake``, ``file:///data/lake`` and ``s3a://bucket/lake``.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

if TYPE_CHECKING:  # the session is only passed through: importing this needs no PySpark
    from pyspark.sql import SparkSession


def is_glob(location: str) -> bool:
    """Whether ``location`` is a Hadoop glob (``*``, ``?``, ``[...]``, ``{a,b}``): many
    folders, which only Spark lists."""
    return any(c in location for c in "*?[{")


def local_path(uri: str) -> Path | None:
    """The local path of ``uri`` when it is on this machine's file system, else ``None``.

    Local files are handled with Python's own I/O (no Hadoop ``.crc`` side files, which
    would make a hand-edited file unreadable); everything else goes through Hadoop.
    """
    parsed = urlparse(uri)
    if parsed.scheme == "":
        return Path(uri)
    if parsed.scheme == "file":
        return Path(parsed.path)
    return None


def within(path: str, folder: str) -> bool:
    """Whether ``path`` is ``folder`` or lies under it: local paths compared resolved
    (symbolic links, ``..``, relative to the working folder), others as spelled."""
    local, local_folder = local_path(path), local_path(folder)
    if local is not None and local_folder is not None:
        path, folder = os.path.realpath(local), os.path.realpath(local_folder)
    path, folder = path.rstrip("/"), folder.rstrip("/")
    return path == folder or path.startswith(f"{folder}/")


def file_in_the_way(folder: Path) -> Path | None:
    """The file (not a folder) at ``folder`` or at one of its parents, which keeps it from
    being a folder; ``None`` when it is one or can be made."""
    return next((p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None)


def links_leading_out(folder: Path) -> list[tuple[str, str]]:
    """The symbolic links under the local ``folder`` that lead out of it, each with the
    path it leads to, sorted. Linked folders are not walked into."""
    root = os.path.realpath(folder)
    found: list[tuple[str, str]] = []

    def walk(path: str) -> None:
        with os.scandir(path) as entries:  # their types come with the names: no stat each
            for entry in entries:
                if entry.is_symlink():
                    if not within(entry.path, root):
                        found.append((entry.path, os.path.realpath(entry.path)))
                elif entry.is_dir(follow_symlinks=False):
                    walk(entry.path)

    if os.path.isdir(folder):
        walk(str(folder))
    return sorted(found)


def _needed(spark: SparkSession | None, uri: str) -> SparkSession:
    if spark is None:
        raise ValueError(f"{uri} is not a local path: a Spark session is needed to reach it")
    return spark


def _fs_and_path(spark: SparkSession | None, uri: str) -> tuple[Any, Any]:
    spark = _needed(spark, uri)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), path


def qualified(spark: SparkSession, uri: str) -> str:
    """The fully qualified form of ``uri`` (``/x`` -> ``file:/x``)."""
    fs, path = _fs_and_path(spark, uri)
    return str(fs.makeQualified(path).toString())


def path_part(spark: SparkSession, uri: str) -> str:
    """The path of ``uri`` without scheme and authority (``s3a://b/x`` -> ``/x``)."""
    fs, path = _fs_and_path(spark, uri)
    return str(fs.makeQualified(path).toUri().getPath())


def exists(spark: SparkSession | None, uri: str) -> bool:
    """Whether a file or folder exists at ``uri``."""
    local = local_path(uri)
    if local is not None:
        return local.exists()
    fs, path = _fs_and_path(spark, uri)
    return bool(fs.exists(path))


def read_text(spark: SparkSession | None, uri: str) -> str | None:
    """The UTF-8 text of the file at ``uri``, or ``None`` when there is none."""
    data = read_bytes(spark, uri)
    return None if data is None else data.decode("utf-8")


def read_bytes(spark: SparkSession | None, uri: str) -> bytes | None:
    """The bytes of the file at ``uri``, or ``None`` when there is none."""
    local = local_path(uri)
    if local is not None:
        return local.read_bytes() if local.is_file() else None
    fs, path = _fs_and_path(spark, uri)
    if not fs.exists(path):
        return None
    assert spark is not None
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    stream = fs.open(path)
    try:
        data = jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
    finally:
        stream.close()
    return bytes(data)


def file_size(spark: SparkSession | None, uri: str) -> int | None:
    """The size in bytes of the file at ``uri``, or ``None`` when there is no such file."""
    local = local_path(uri)
    if local is not None:
        return local.stat().st_size if local.is_file() else None
    fs, path = _fs_and_path(spark, uri)
    if not fs.exists(path):
        return None
    status = fs.getFileStatus(path)
    return None if status.isDirectory() else int(status.getLen())


def modified_ms(spark: SparkSession | None, uri: str) -> int | None:
    """When the file at ``uri`` was last written, in ms since the epoch (``None``: none)."""
    local = local_path(uri)
    if local is not None:
        return local.stat().st_mtime_ns // 1_000_000 if local.is_file() else None
    fs, path = _fs_and_path(spark, uri)
    if not fs.exists(path):
        return None
    return int(fs.getFileStatus(path).getModificationTime())


def move(spark: SparkSession | None, source: str, target: str) -> None:
    """Move the file or folder ``source`` to ``target`` (which must not exist yet).

    A rename where the file system has one (local, HDFS); object stores copy and delete.
    """
    src_local, dst_local = local_path(source), local_path(target)
    if src_local is not None and dst_local is not None:
        if dst_local.exists():
            raise FileExistsError(target)
        dst_local.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(src_local), str(dst_local))
        return
    fs, src = _fs_and_path(spark, source)
    _, dst = _fs_and_path(spark, target)
    if fs.exists(dst):
        raise FileExistsError(target)
    fs.mkdirs(dst.getParent())
    if not fs.rename(src, dst):
        raise OSError(f"could not move {source} to {target}")


def write_text(spark: SparkSession | None, uri: str, text: str) -> None:
    """Write ``text`` to ``uri`` whole: a reader finds the old text or the new, never a
    part of either nor no file at all, even if the writer is cut off. On this machine's
    disks the new text is synced before it replaces the old, and the rename after, so a
    power cut does not leave an empty file under the name either.

    Beyond this machine the write goes through Spark's ``CheckpointFileManager``, the one
    its streaming checkpoints use: a temporary file renamed over the target in one step
    where the file system can (HDFS, through ``FileContext``), and whatever
    ``spark.sql.streaming.checkpointFileManagerClass`` names for object stores.
    """
    local = local_path(uri)
    if local is not None:
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(f".{local.name}.tmp")
        try:
            with tmp.open("w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())  # the bytes on disk before the name points at them
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        os.replace(tmp, local)
        _sync_folder(local.parent)
        return
    spark = _needed(spark, uri)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    path = jvm.org.apache.hadoop.fs.Path(uri)
    checkpointing = jvm.org.apache.spark.sql.execution.streaming.checkpointing
    manager = checkpointing.CheckpointFileManager.create(
        path.getParent(), spark.sparkContext._jsc.hadoopConfiguration())
    manager.mkdirs(path.getParent())  # FileContext creates no missing parent folder
    stream = manager.createAtomic(path, True)
    try:
        stream.write(bytearray(text.encode("utf-8")))
    except BaseException:
        stream.cancel()  # the temporary file goes; the target is untouched
        raise
    stream.close()  # renames the temporary file over the target


def create_local(path: Path, text: str) -> None:
    """Create the file ``path`` with ``text``, whole, only if no file has that name: what
    a Delta commit needs (two writers of one version, one wins). The text is synced under
    a temporary name, then linked to ``path`` in one step that fails if it exists.

    :raises FileExistsError: ``path`` exists; nothing was changed.
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with tmp.open("x", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` survive a power cut, not only a killed process."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def delete(spark: SparkSession | None, uri: str) -> None:
    """Delete the file or folder at ``uri`` (recursively), if present."""
    local = local_path(uri)
    if local is not None:
        if local.is_dir():
            shutil.rmtree(local)
        else:
            local.unlink(missing_ok=True)
        return
    fs, path = _fs_and_path(spark, uri)
    if fs.exists(path):
        fs.delete(path, True)


def copy_tree(spark: SparkSession | None, source: str, target: str) -> None:
    """Copy the folder (or file) ``source`` to ``target``, replacing whatever was there."""
    src_local, dst_local = local_path(source), local_path(target)
    if src_local is not None and dst_local is not None:
        if dst_local.is_dir():
            shutil.rmtree(dst_local)
        dst_local.unlink(missing_ok=True)
        if src_local.is_dir():
            shutil.copytree(src_local, dst_local)
        else:
            shutil.copy2(src_local, dst_local)
        return
    spark = _needed(spark, target)
    src_fs, src = _fs_and_path(spark, source)
    dst_fs, dst = _fs_and_path(spark, target)
    if dst_fs.exists(dst):
        dst_fs.delete(dst, True)
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    jvm.org.apache.hadoop.fs.FileUtil.copy(
        src_fs, src, dst_fs, dst, False, spark.sparkContext._jsc.hadoopConfiguration()
    )


def list_names(spark: SparkSession | None, uri: str) -> list[str]:
    """Names of the entries of the folder ``uri`` (empty when it does not exist)."""
    local = local_path(uri)
    if local is not None:
        # Names, not Path objects: half the time over a 30-day Delta log's 35,000 files.
        return sorted(os.listdir(local)) if local.is_dir() else []
    fs, path = _fs_and_path(spark, uri)
    if not fs.exists(path):
        return []
    return sorted(str(status.getPath().getName()) for status in fs.listStatus(path))


def tree_state(spark: SparkSession | None, uri: str) -> dict[str, tuple[int, int]]:
    """Every file under the folder ``uri``: relative path -> (size, modification time).

    Two equal states mean nothing was written in between (used to take a stable copy of a
    folder that a running stream keeps writing).
    """
    local = local_path(uri)
    if local is not None:
        if not local.is_dir():
            return {}
        return {
            str(p.relative_to(local)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in local.rglob("*") if p.is_file()
        }
    fs, path = _fs_and_path(spark, uri)
    if not fs.exists(path):
        return {}
    root = str(fs.makeQualified(path).toString()).rstrip("/")
    state: dict[str, tuple[int, int]] = {}
    files = fs.listFiles(path, True)
    while files.hasNext():
        status = files.next()
        name = str(status.getPath().toString())[len(root) + 1:]
        state[name] = (int(status.getLen()), int(status.getModificationTime()))
    return state


def file_sizes(spark: SparkSession, uri: str) -> dict[str, int]:
    """The data files under the folder ``uri``, recursively: fully qualified path -> bytes.

    Through Hadoop on every scheme, so that the keys have the form Spark gives file paths
    (``file:/x/y.parquet``). Hidden entries are skipped as Spark skips them (names starting
    with ``.``, or with ``_`` unless they hold a ``=``): ``_delta_log``, checksums, temporary
    folders. Other writers may be at work meanwhile, so an entry that vanishes while it is
    listed is left out instead of failing the listing.
    """
    fs, root = _fs_and_path(spark, uri)
    sizes: dict[str, int] = {}
    folders = [root]
    while folders:
        folder = folders.pop()
        try:
            statuses = fs.listStatus(folder)
        except Exception as error:  # Py4JJavaError: the folder went away meanwhile
            if "FileNotFoundException" in str(error):
                continue
            raise
        for status in statuses:
            name = str(status.getPath().getName())
            if name.startswith(".") or (name.startswith("_") and "=" not in name):
                continue
            if status.isDirectory():
                folders.append(status.getPath())
            else:
                sizes[str(status.getPath().toString())] = int(status.getLen())
    return sizes

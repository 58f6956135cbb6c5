"""Read the lake's Delta tables without Spark: the log, and small tables' rows.

(Damage inspection of a log, for ``sessionlake doctor``, is :mod:`sessionlake.deltalog`.)

The Airflow API server shows the pipeline's health (:mod:`sessionlake.health`) and must
not start a JVM for it, and ``sessionlake report`` should answer in a second. Both read
the Delta tables here, with pyarrow only:

* the table's state comes from replaying its log: the newest checkpoint (Parquet) and the
  JSON commits after it give the live files, each with its size, partition values, record
  count (``stats.numRecords``) and deletion vector;
* a table's row count is the sum of its live files' record counts minus the rows their
  deletion vectors delete (each vector's ``cardinality``): no data file is opened;
* rows are read from the live Parquet files, with the partition columns added from the
  log and the rows of each file's deletion vector left out (the vectors are decoded here:
  Z85 names, RoaringBitmapArray bodies).

Why not the ``deltalake`` package (delta-rs): its 1.6 reader refuses tables with the
``deletionVectors`` reader feature, and every sessionlake table but ``batch_metrics`` and
``retention_audit`` has it. Local lakes only (a path or ``file:`` URI): the web page and
the report read what is on this machine's disks.

Example::

    state = read_state("/data/lake/open_sessions")
    state.row_count()                      # open sessions, from the log alone
    read_rows(state, ["session_start"])    # a pyarrow Table, deleted rows left out
"""

from __future__ import annotations

import json
import struct
import threading
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

#: Reader features this module knows how to honour.
SUPPORTED_READER_FEATURES = frozenset({"deletionVectors", "timestampNtz"})
#: Delta's threshold below which OPTIMIZE treats a file as small (its default, 1 GiB).
OPTIMIZE_MIN_FILE_SIZE = 1024 * 1024 * 1024
#: How Hive-style partition values name a null.
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"


class DeltaReadError(Exception):
    """A table cannot be read here: the message says which and why."""


@dataclass(frozen=True)
class DeletionVector:
    """The ``deletionVector`` of an add action: which rows of its file are deleted."""

    storage_type: str
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None

    @property
    def unique_id(self) -> str:
        """The id that, with the file's path, names a logical file in the log."""
        base = f"{self.storage_type}{self.path_or_inline_dv}"
        return base if self.offset is None else f"{base}@{self.offset}"


@dataclass(frozen=True)
class DataFile:
    """A live data file of a table's current version."""

    path: str
    size: int
    partition_values: dict[str, str | None]
    num_records: int | None
    modification_time: int
    deletion_vector: DeletionVector | None = None
    #: Each column's greatest value in the file, from its statistics (strings as written:
    #: a long one truncated and rounded up); empty without statistics.
    max_values: dict[str, Any] = field(default_factory=dict)
    #: Each column's least value in the file, from its statistics; empty without them.
    min_values: dict[str, Any] = field(default_factory=dict)

    @property
    def deleted_rows(self) -> int:
        """Rows of the file its deletion vector deletes."""
        return self.deletion_vector.cardinality if self.deletion_vector else 0


@dataclass(frozen=True)
class TableState:
    """A Delta table at its newest version, as its log describes it."""

    location: Path
    version: int
    files: tuple[DataFile, ...]
    schema: dict[str, Any]
    partition_columns: tuple[str, ...]
    configuration: dict[str, str] = field(default_factory=dict)
    #: When the newest commit was made (from its commitInfo, else the file's mtime).
    committed_at: datetime | None = None
    #: The newest commit's operation (WRITE, MERGE, OPTIMIZE, ...), when known.
    last_operation: str | None = None

    def row_count(self) -> int:
        """Rows of the table: record counts of the live files minus deleted rows.

        A file written without statistics has its Parquet footer read instead.
        """
        total = 0
        for data_file in self.files:
            records = data_file.num_records
            if records is None:
                records = pq.ParquetFile(self.file_path(data_file)).metadata.num_rows
            total += records - data_file.deleted_rows
        return total

    def file_path(self, data_file: DataFile) -> Path:
        """Where a data file is on disk."""
        return _resolve(self.location, data_file.path)

    @property
    def total_bytes(self) -> int:
        """Bytes of the live data files."""
        return sum(f.size for f in self.files)


def local_table_path(location: str | Path) -> Path:
    """The local folder of a table given as a path or ``file:`` URI.

    :raises DeltaReadError: for other schemes (``s3a://``...), which need Spark.
    """
    text = str(location)
    parsed = urlparse(text)
    if parsed.scheme == "":
        return Path(text)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    raise DeltaReadError(f"{text} is not on this machine: only local lakes can be read "
                         "without Spark")


def is_delta_table(location: str | Path) -> bool:
    """Whether a Delta log exists at ``location``."""
    log_dir = local_table_path(location) / "_delta_log"
    return log_dir.is_dir() and any(log_dir.glob("*.json"))


def read_state(
    location: str | Path, *, remember: bool = False, version: int | None = None
) -> TableState:
    """Replay the log of the table at ``location``: its newest version (or ``version``)
    and live files.

    :param remember: keep the state in this process, so that the table's next read with
        ``remember`` replays only the commits made since (:class:`_LastReads`); for a
        process that reads the same tables again and again (the health page, a stream's
        batches).
    :raises DeltaReadError: when there is no Delta table there, or no commit ``version``
        in its log, or it uses a reader feature this module does not know.
    """
    root = local_table_path(location)
    log_dir = root / "_delta_log"
    commits = _commit_versions(log_dir)
    if not commits:
        raise DeltaReadError(f"{root} is not a Delta table (no commits in _delta_log)")
    if version is not None:
        if version not in commits:
            raise DeltaReadError(f"{root} has no commit {version} in its log")
        commits = [c for c in commits if c <= version]
    newest = max(commits)
    replay, version = _LAST_READS.replay_from(root, log_dir, commits) if remember \
        else (None, -1)
    if replay is None:
        version, checkpoint_files = _newest_checkpoint(log_dir, newest)
        replay = _Replay()
        if checkpoint_files:
            replay.apply_checkpoint(checkpoint_files)
            if version == newest:  # the newest commit's own info, beside its checkpoint
                replay.read_commit_info(log_dir / f"{version:020d}.json")
    newer = [v for v in commits if v > version]
    _check_contiguous(root, version, newer)
    for version in newer:
        replay.apply_commit(log_dir / f"{version:020d}.json")
    if remember:
        _LAST_READS.keep(root, log_dir, newest, replay)
    return replay.state(root, newest, log_dir)


class _LastReads:
    """The newest state read of each table, so that the next read of it replays only the
    commits made since: the health page reads every table at each load, and between two
    checkpoints a table's log holds up to 99 commits (a MERGE's with some 150 files each).

    A state is taken up again only while the commit it was read at is the file it was
    (same size and modification time): a table created anew in its folder is replayed
    whole.
    """

    def __init__(self) -> None:
        self._states: dict[Path, tuple[int, tuple[int, int], _Replay]] = {}
        self._lock = threading.Lock()  # the page's requests are served on several threads

    def replay_from(self, root: Path, log_dir: Path, commits: Sequence[int]
                    ) -> tuple[_Replay | None, int]:
        """A copy of the table's last state read and its version, when the log's
        ``commits`` (sorted) still lead from it to the newest, none cleaned up since; else
        ``(None, -1)``."""
        with self._lock:
            kept = self._states.get(root)
        if kept is None or kept[0] not in commits or _stamp(log_dir, kept[0]) != kept[1] \
                or commits[-1] - kept[0] != len(commits) - 1 - commits.index(kept[0]):
            return None, -1
        return kept[2].copy(), kept[0]

    def keep(self, root: Path, log_dir: Path, version: int, replay: _Replay) -> None:
        stamp = _stamp(log_dir, version)
        with self._lock:
            if stamp is None or len(replay.files) > REMEMBERED_FILES_MAX:
                self._states.pop(root, None)
            else:
                self._states[root] = (version, stamp, replay.copy())


#: Live files up to which a table's state is remembered (:class:`_LastReads`): about
#: 1.4 KB each (100,000 files of the bench's ``events`` commits held 144 MB), so at most
#: some 30 MB a table. A table of more files, past due for compaction, is replayed whole.
REMEMBERED_FILES_MAX = 20_000


def _stamp(log_dir: Path, version: int) -> tuple[int, int] | None:
    """The size and modification time of commit ``version``'s file (``None``: gone)."""
    try:
        stat = (log_dir / f"{version:020d}.json").stat()
    except FileNotFoundError:
        return None
    return stat.st_size, stat.st_mtime_ns


_LAST_READS = _LastReads()


def _commit_versions(log_dir: Path) -> list[int]:
    if not log_dir.is_dir():
        return []
    versions = []
    for entry in log_dir.iterdir():
        stem, _, ext = entry.name.partition(".")
        if ext == "json" and stem.isdigit() and len(stem) == 20:
            versions.append(int(stem))
    return sorted(versions)


def _newest_checkpoint(log_dir: Path, newest: int) -> tuple[int, list[Path]]:
    """The newest complete classic checkpoint at or below ``newest``: version and parts."""
    parts: dict[int, dict[int, list[Path]]] = {}
    for entry in log_dir.glob("*.checkpoint*.parquet"):
        pieces = entry.name.split(".")
        if not pieces[0].isdigit():
            continue
        version = int(pieces[0])
        if len(pieces) == 3:  # NNN.checkpoint.parquet
            parts.setdefault(version, {}).setdefault(1, []).append(entry)
        elif len(pieces) == 5 and pieces[2].isdigit() and pieces[3].isdigit():
            parts.setdefault(version, {}).setdefault(int(pieces[3]), []).append(entry)
    for version in sorted((v for v in parts if v <= newest), reverse=True):
        for count, files in parts[version].items():
            if len(files) == count:
                return version, sorted(files)
    return -1, []


def _check_contiguous(root: Path, checkpoint_version: int, versions: list[int]) -> None:
    expected = list(range(checkpoint_version + 1, checkpoint_version + 1 + len(versions)))
    if versions != expected:
        raise DeltaReadError(f"the log of {root} has gaps after version {checkpoint_version}: "
                             "it cannot be replayed (was it cleaned up mid-read? try again)")


class _Replay:
    """Live files and metadata, built up action by action."""

    def __init__(self) -> None:
        self.files: dict[tuple[str, str | None], DataFile] = {}
        self.metadata: dict[str, Any] = {}
        self.protocol: dict[str, Any] = {}
        self.commit_info: dict[str, Any] = {}

    def copy(self) -> _Replay:
        """Another replay from the same point (actions replace the metadata, protocol
        and commit info whole, so only the files are copied)."""
        other = _Replay()
        other.files = dict(self.files)
        other.metadata, other.protocol = self.metadata, self.protocol
        other.commit_info = self.commit_info
        return other

    def apply_checkpoint(self, parts: Sequence[Path]) -> None:
        for part in parts:
            names = set(pq.ParquetFile(part).schema_arrow.names)
            columns = [c for c in ("add", "metaData", "protocol") if c in names]
            for row in pq.read_table(part, columns=columns).to_pylist():
                self.apply(row)

    def apply_commit(self, commit: Path) -> None:
        self.commit_info = {}
        for line in commit.read_text(encoding="utf-8").splitlines():
            if line.strip():
                self.apply(json.loads(line))

    def read_commit_info(self, commit: Path) -> None:
        """Only the commit's ``commitInfo`` (when, which operation): its other actions are
        already in the checkpoint written at its version."""
        for line in commit.read_text(encoding="utf-8").splitlines():
            if '"commitInfo"' in line:
                self.commit_info = json.loads(line)["commitInfo"]

    def apply(self, action: dict[str, Any]) -> None:
        if action.get("add"):
            data_file = _data_file(action["add"])
            self.files[_file_key(action["add"])] = data_file
        elif action.get("remove"):
            self.files.pop(_file_key(action["remove"]), None)
        elif action.get("metaData"):
            self.metadata = action["metaData"]
        elif action.get("protocol"):
            self.protocol = action["protocol"]
        elif action.get("commitInfo"):
            self.commit_info = action["commitInfo"]

    def state(self, root: Path, version: int, log_dir: Path) -> TableState:
        unknown = set(self.protocol.get("readerFeatures") or ()) - SUPPORTED_READER_FEATURES
        if unknown:
            raise DeltaReadError(f"{root} needs reader features {sorted(unknown)}, which "
                                 "sessionlake's log reader does not implement")
        schema = json.loads(self.metadata.get("schemaString") or '{"fields": []}')
        stamp = self.commit_info.get("timestamp")
        if stamp is None:
            stamp = (log_dir / f"{version:020d}.json").stat().st_mtime * 1000
        return TableState(
            location=root,
            version=version,
            files=tuple(self.files.values()),
            schema=schema,
            partition_columns=tuple(self.metadata.get("partitionColumns") or ()),
            configuration=_as_dict(self.metadata.get("configuration")),
            committed_at=datetime.fromtimestamp(float(stamp) / 1000, UTC),
            last_operation=self.commit_info.get("operation"),
        )


def _as_dict(value: Any) -> dict[str, Any]:
    """A map from the log: a dict in JSON, a list of pairs from a Parquet checkpoint."""
    return dict(value or {})


def _deletion_vector(raw: dict[str, Any] | None) -> DeletionVector | None:
    if not raw:
        return None
    return DeletionVector(
        storage_type=str(raw["storageType"]),
        path_or_inline_dv=str(raw["pathOrInlineDv"]),
        size_in_bytes=int(raw["sizeInBytes"]),
        cardinality=int(raw["cardinality"]),
        offset=None if raw.get("offset") is None else int(raw["offset"]),
    )


def _file_key(action: dict[str, Any]) -> tuple[str, str | None]:
    """A logical file: its path and its deletion vector's id (protocol's reconciliation)."""
    vector = _deletion_vector(action.get("deletionVector"))
    return unquote(str(action["path"])), vector.unique_id if vector else None


def _data_file(add: dict[str, Any]) -> DataFile:
    stats = json.loads(add["stats"]) if add.get("stats") else {}
    records = stats.get("numRecords")
    return DataFile(
        path=str(add["path"]),
        size=int(add.get("size") or 0),
        partition_values=_as_dict(add.get("partitionValues")),
        num_records=None if records is None else int(records),
        modification_time=int(add.get("modificationTime") or 0),
        deletion_vector=_deletion_vector(add.get("deletionVector")),
        max_values=_as_dict(stats.get("maxValues")),
        min_values=_as_dict(stats.get("minValues")),
    )


def _resolve(root: Path, path: str) -> Path:
    """A path from the log (relative and URL-encoded, or an absolute URI) on disk."""
    if "://" in path or path.startswith("file:"):
        return local_table_path(path)
    return root / unquote(path)


# --- deletion vectors --------------------------------------------------------------------

_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_VALUE = {char: index for index, char in enumerate(_Z85)}
#: RoaringBitmapArray in the portable format (the only one Delta writes).
_PORTABLE_MAGIC = 1681511377
_SERIAL_COOKIE_NO_RUN = 12346
_SERIAL_COOKIE = 12347


def z85_decode(text: str) -> bytes:
    """Decode Z85 (ZeroMQ's base 85), in which Delta writes deletion vector ids."""
    if len(text) % 5:
        raise DeltaReadError(f"not Z85 text (length {len(text)} is not a multiple of 5)")
    out = bytearray()
    for start in range(0, len(text), 5):
        value = 0
        for char in text[start:start + 5]:
            value = value * 85 + _Z85_VALUE[char]
        out += value.to_bytes(4, "big")
    return bytes(out)


def deletion_vector_path(root: Path, vector: DeletionVector) -> Path | None:
    """The file holding a deletion vector (``None`` for an inline one)."""
    if vector.storage_type == "i":
        return None
    if vector.storage_type == "p":
        return local_table_path(vector.path_or_inline_dv)
    if vector.storage_type != "u":
        raise DeltaReadError(f"unknown deletion vector storage type {vector.storage_type!r}")
    return root / deletion_vector_file(vector.path_or_inline_dv)


def deletion_vector_file(path_or_inline_dv: str) -> str:
    """The file, relative to its table, of a deletion vector stored beside the data
    (``storageType`` ``u``): ``pathOrInlineDv`` is an optional random prefix (a folder)
    followed by the file's UUID in 20 characters of Z85."""
    prefix, encoded = path_or_inline_dv[:-20], path_or_inline_dv[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return f"{prefix}/{name}" if prefix else name


def deleted_row_indexes(root: Path, vector: DeletionVector) -> np.ndarray:
    """The row positions (from 0, within its file) a deletion vector deletes."""
    path = deletion_vector_path(root, vector)
    if path is None:
        encoded = vector.path_or_inline_dv
        data = z85_decode(encoded + "0" * (-len(encoded) % 5))[:vector.size_in_bytes]
    else:
        with open(path, "rb") as handle:
            handle.seek(vector.offset or 0)
            (size,) = struct.unpack(">i", handle.read(4))
            data = handle.read(size)
    (magic,) = struct.unpack_from("<i", data, 0)
    if magic != _PORTABLE_MAGIC:
        raise DeltaReadError(f"deletion vector {vector.unique_id}: unknown format {magic}")
    rows = _roaring_treemap(memoryview(data), 4)
    if len(rows) != vector.cardinality:
        raise DeltaReadError(f"deletion vector {vector.unique_id} holds {len(rows)} rows, "
                             f"the log says {vector.cardinality}")
    return rows


def _roaring_treemap(data: memoryview, pos: int) -> np.ndarray:
    """Values of a 64-bit Roaring treemap: a count, then (high key, 32-bit bitmap) pairs."""
    (count,) = struct.unpack_from("<q", data, pos)
    pos += 8
    parts = []
    for _ in range(count):
        (high,) = struct.unpack_from("<I", data, pos)
        low, pos = _roaring_bitmap(data, pos + 4)
        parts.append((np.uint64(high) << np.uint64(32)) | low.astype(np.uint64))
    return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint64)


def _roaring_bitmap(data: memoryview, pos: int) -> tuple[np.ndarray, int]:
    """Values of one 32-bit Roaring bitmap in the portable format, and where it ends."""
    (cookie,) = struct.unpack_from("<I", data, pos)
    pos += 4
    if cookie & 0xFFFF == _SERIAL_COOKIE:
        containers = (cookie >> 16) + 1
        run_flags = bytes(data[pos:pos + (containers + 7) // 8])
        pos += (containers + 7) // 8
        has_offsets = containers >= 4
    elif cookie == _SERIAL_COOKIE_NO_RUN:
        (containers,) = struct.unpack_from("<I", data, pos)
        pos += 4
        run_flags, has_offsets = b"", True
    else:
        raise DeltaReadError(f"not a Roaring bitmap (cookie {cookie})")
    header = np.frombuffer(data, dtype="<u2", count=2 * containers, offset=pos)
    keys, cardinalities = header[0::2].astype(np.uint32), header[1::2].astype(np.int64) + 1
    pos += 4 * containers + (4 * containers if has_offsets else 0)
    values = []
    for index in range(containers):
        is_run = bool(run_flags) and bool(run_flags[index // 8] >> (index % 8) & 1)
        low, pos = _container(data, pos, is_run, int(cardinalities[index]))
        values.append((keys[index] << np.uint32(16)) | low.astype(np.uint32))
    return (np.concatenate(values) if values else np.empty(0, dtype=np.uint32)), pos


def _container(data: memoryview, pos: int, is_run: bool, cardinality: int
               ) -> tuple[np.ndarray, int]:
    """The 16-bit values of one container (run, array or bitset) and where it ends."""
    if is_run:
        (runs,) = struct.unpack_from("<H", data, pos)
        pairs = np.frombuffer(data, dtype="<u2", count=2 * runs, offset=pos + 2)
        ranges = [np.arange(int(s), int(s) + int(n) + 1, dtype=np.uint32)
                  for s, n in zip(pairs[0::2], pairs[1::2], strict=True)]
        values = np.concatenate(ranges) if ranges else np.empty(0, dtype=np.uint32)
        return values, pos + 2 + 4 * runs
    if cardinality <= 4096:
        values = np.frombuffer(data, dtype="<u2", count=cardinality, offset=pos)
        return values.astype(np.uint32), pos + 2 * cardinality
    bits = np.unpackbits(np.frombuffer(data, dtype=np.uint8, count=8192, offset=pos),
                         bitorder="little")
    return np.flatnonzero(bits).astype(np.uint32), pos + 8192


# --- rows --------------------------------------------------------------------------------

_PARTITION_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(), "integer": pa.int32(), "long": pa.int64(), "short": pa.int16(),
    "byte": pa.int8(), "date": pa.date32(), "boolean": pa.bool_(), "double": pa.float64(),
    "float": pa.float32(),
}


def read_rows(
    state: TableState, columns: Sequence[str] | None = None, files: Iterable[DataFile] | None = None
) -> pa.Table:
    """The table's rows (or those of some of its live ``files``), deleted rows left out.

    Timestamps come back as UTC (``timestamp[us, UTC]``); partition columns are typed as
    the table's schema says.

    :param columns: the columns to read (default: every column of the schema).
    :raises DeltaReadError: for a partition column of a type this reader does not cast.
    """
    wanted = list(columns or [f["name"] for f in state.schema.get("fields", [])])
    tables = [_file_rows(state, data_file, wanted) for data_file in
              (state.files if files is None else files)]
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return _empty(state, wanted)
    return pa.concat_tables(tables, promote_options="default")


def _file_rows(state: TableState, data_file: DataFile, wanted: list[str]) -> pa.Table:
    path = state.file_path(data_file)
    available = set(pq.ParquetFile(path).schema_arrow.names)
    stored = [c for c in wanted if c in available]
    table = pq.read_table(path, columns=stored)
    if data_file.deletion_vector is not None and data_file.deleted_rows:
        keep = np.ones(table.num_rows, dtype=bool)
        keep[deleted_row_indexes(state.location, data_file.deletion_vector)] = False
        table = table.filter(pa.array(keep))
    columns = {}
    for name in wanted:
        if name in available:
            columns[name] = _as_utc(table.column(name))
        elif name in state.partition_columns:
            columns[name] = _partition_column(state, name,
                                              data_file.partition_values.get(name),
                                              table.num_rows)
        else:
            columns[name] = pa.nulls(table.num_rows, _arrow_type(state, name))
    return pa.table(columns)


def _as_utc(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """Spark's timestamps (INT64 microseconds, or INT96 in older files: UTC instants) as
    ``timestamp[us, UTC]``."""
    if pa.types.is_timestamp(column.type):
        return pc.cast(column, pa.timestamp("us", tz="UTC"))
    return column


def _field_type(state: TableState, name: str) -> Any:
    for field_ in state.schema.get("fields", []):
        if field_["name"] == name:
            return field_["type"]
    raise DeltaReadError(f"{state.location} has no column {name!r}")


def _arrow_type(state: TableState, name: str) -> pa.DataType:
    kind = _field_type(state, name)
    if kind == "timestamp":
        return pa.timestamp("us", tz="UTC")
    if isinstance(kind, str) and kind in _PARTITION_TYPES:
        return _PARTITION_TYPES[kind]
    return pa.null()


def _partition_column(state: TableState, name: str, value: str | None, rows: int
                      ) -> pa.Array:
    kind = _field_type(state, name)
    if kind not in _PARTITION_TYPES:
        raise DeltaReadError(f"partition column {name} of type {kind} is not supported")
    if value is None or value == NULL_PARTITION:
        return pa.nulls(rows, _PARTITION_TYPES[kind])
    return pc.cast(pa.array([value] * rows, pa.string()), _PARTITION_TYPES[kind])


def _empty(state: TableState, wanted: list[str]) -> pa.Table:
    return pa.table({name: pa.array([], _arrow_type(state, name)) for name in wanted})

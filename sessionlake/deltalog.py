"""A Delta table's transaction log read by hand: which files it holds, and what is broken.

Delta reports a damaged table only as a failed read (``DELTA_VERSIONS_NOT_CONTIGUOUS``, a
malformed record in a commit, a checksum error in a data file), and only for the part it
happens to read. ``sessionlake doctor`` has to name the broken file and the first version
it spoils, and ``sessionlake restore`` has to know whether the version it returns to can
still be read. Both follow the Delta protocol (``PROTOCOL.md`` of delta-io/delta):

* a table's state is its newest checkpoint (``NNN.checkpoint.parquet``, or its parts) plus
  every commit after it (``NNN.json``, one JSON action per line), versions contiguous;
* the live data files are the ``add`` actions that no later ``remove`` undid; each records
  the file's size, and a deletion vector its file, offset and size;
* ``NNN.crc`` (written after commit NNN) holds the number and total size of the live files.

Only what Delta itself would read is checked: commits older than the newest checkpoint are
not. Every read goes through :mod:`sessionlake.storage` (local files directly, other URIs
through Hadoop), so a local lake is checked without starting Spark.
"""

from __future__ import annotations

import io
import json
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow.parquet as pq

from sessionlake import storage
from sessionlake.deltareader import deletion_vector_file

if TYPE_CHECKING:  # the local paths need no Spark, nor its import
    from pyspark.sql import SparkSession

LOG_DIR = "_delta_log"
LAST_CHECKPOINT = "_last_checkpoint"
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKSUM = re.compile(r"^(\d{20})\.crc$")
_HADOOP_CHECKSUM = re.compile(r"^\.(\d{20})\.json\.crc$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d+)\.(\d+))?\.parquet$")
#: Any log entry of one version: commit, checksum, checkpoint, and Hadoop's ``.x.crc`` files.
_OF_VERSION = re.compile(r"^\.?(\d{20})\.")


def commit_file(version: int) -> str:
    """The commit file of ``version``, relative to the table folder."""
    return f"{LOG_DIR}/{version:020d}.json"


def commit_actions(text: str) -> list[dict[str, Any]]:
    """The actions of a commit file's text, one JSON object per line.

    :raises json.JSONDecodeError: on a half-written line.
    """
    return [json.loads(line) for line in text.splitlines() if line.strip()]


#: A micro-batch's identity: the stream's app id (``sessionlake-<stream id>-e<epoch>``) and
#: the batch id.
BatchKey = tuple[str, int]


def batch_tag(batch: BatchKey) -> str:
    """The ``userMetadata`` of a micro-batch's commits: which stream and batch made them.

    It is how a replayed batch finds what its first attempt committed, how a snapshot finds
    the table versions at a batch boundary, and what ``DESCRIBE HISTORY`` shows a user.
    """
    return json.dumps({"sessionlake": batch[0], "batch_id": batch[1]}, sort_keys=True)


def batch_keys(actions: Iterable[dict[str, Any]]) -> list[BatchKey]:
    """The micro-batches a commit (its actions) was made by.

    Read from the :func:`batch_tag` in its ``commitInfo``, and from Delta ``txn`` actions:
    lakes written before the tag keyed every batch write with ``txnAppId``/``txnVersion``.
    """
    found: list[BatchKey] = []
    for action in actions:
        if "txn" in action:
            found.append((str(action["txn"]["appId"]), int(action["txn"]["version"])))
        tagged = tag_batch(action.get("commitInfo", {}).get("userMetadata"))
        if tagged is not None:
            found.append(tagged)
    return found


def tag_batch(metadata: str | None) -> BatchKey | None:
    """The micro-batch a commit's ``userMetadata`` names, if it is a :func:`batch_tag`."""
    if not metadata or not metadata.startswith("{"):
        return None
    try:
        tag = json.loads(metadata)
    except json.JSONDecodeError:
        return None
    if isinstance(tag, dict) and isinstance(tag.get("batch_id"), int) \
            and isinstance(tag.get("sessionlake"), str):
        return tag["sessionlake"], tag["batch_id"]
    return None


@dataclass(frozen=True)
class Damage:
    """One broken file of a table.

    :param file: the file, relative to the table folder.
    :param problem: what is wrong with it, for people.
    :param version: the first table version it spoils: a version before it reads correctly.
    :param in_log: whether the log itself is broken (Delta cannot load the table), rather
        than a data file it names.
    """

    file: str
    problem: str
    version: int
    in_log: bool


@dataclass(frozen=True)
class LiveFile:
    """A data file of the table's current state, as its ``add`` action describes it."""

    path: str
    size: int
    version: int | None
    deletion_vector: dict[str, Any] | None = None
    #: the ``add`` action itself, as a commit's JSON holds it (a restore writes it again).
    action: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass
class TableLog:
    """What the log of one table says, and what is wrong with it."""

    uri: str
    exists: bool = False
    newest_version: int | None = None
    checkpoint_version: int | None = None
    commits: list[int] = field(default_factory=list)
    files: dict[tuple[str, str], LiveFile] = field(default_factory=dict)
    configuration: dict[str, str] = field(default_factory=dict)
    created_ms: int | None = None
    #: the newest ``metaData`` and ``protocol`` actions, as a commit's JSON holds them.
    metadata: dict[str, Any] = field(default_factory=dict)
    protocol: dict[str, Any] = field(default_factory=dict)
    damage: list[Damage] = field(default_factory=list)
    #: the log entries the replay read (checkpoint parts, then commits), relative to the
    #: table folder.
    entries_read: list[str] = field(default_factory=list)

    @property
    def log_damaged_from(self) -> int | None:
        """The first version the log cannot give (``None`` when the log is whole)."""
        return min((d.version for d in self.damage if d.in_log), default=None)

    @property
    def damaged_from(self) -> int | None:
        """The first version spoilt by any damage, log or data (``None`` when healthy)."""
        return min((d.version for d in self.damage), default=None)


def read_log(spark: SparkSession | None, uri: str, version: int | None = None) -> TableLog:
    """Replay the log of the table at ``uri``: its live files, and damage of the log.

    ``spark`` is needed for non-local URIs only. Data files are not looked at (see
    :func:`inspect_table`). With ``version``, the table as it stood at that version (what
    a ``RESTORE`` to it reads): later entries are left out.
    """
    log = TableLog(uri=uri.rstrip("/"))
    names = storage.list_names(spark, f"{log.uri}/{LOG_DIR}")
    commits = sorted(int(m[1]) for n in names if (m := _COMMIT.match(n)))
    checkpoints = _complete_checkpoints(names)
    if version is not None:
        commits = [c for c in commits if c <= version]
        checkpoints = {v: parts for v, parts in checkpoints.items() if v <= version}
    if not commits and not checkpoints:
        problem = ("the table folder is missing" if not storage.exists(spark, log.uri)
                   else "its _delta_log holds no commit: the table cannot be read")
        log.damage.append(Damage(LOG_DIR, problem, 0, True))
        return log
    log.exists, log.commits = True, commits
    newest = max([*commits, *checkpoints])
    log.newest_version = newest
    if version is None:
        _check_last_checkpoint(spark, log, names, checkpoints)
    elif newest < version:
        log.damage.append(Damage(commit_file(newest + 1), f"missing Delta log entry: "
                                 f"version {version} is not in the log", newest + 1, True))

    files: dict[tuple[str, str], LiveFile] = {}
    for version in sorted(checkpoints, reverse=True):
        try:
            files, meta, log.protocol = _read_checkpoint(spark, log.uri, checkpoints[version])
        except Exception as error:  # pyarrow or I/O: an unreadable checkpoint
            log.damage.append(Damage(f"{LOG_DIR}/{checkpoints[version][0]}",
                                     f"checkpoint does not read ({_first_line(error)})",
                                     version, True))
            continue
        log.checkpoint_version = version
        log.entries_read = [f"{LOG_DIR}/{part}" for part in checkpoints[version]]
        _apply_metadata(log, meta)
        break
    start = 0 if log.checkpoint_version is None else log.checkpoint_version + 1
    present = set(commits)
    last = max(commits, default=-1)
    missing = [v for v in range(start, last + 1) if v not in present]
    end = missing[0] if missing else last + 1
    if missing:
        log.damage.append(Damage(
            commit_file(missing[0]),
            f"missing Delta log entry: versions {missing[0]}..{last} cannot be read"
            if missing[0] < last else "missing Delta log entry",
            missing[0], True,
        ))
    gone = newest_commit_gone(names) if version is None else None
    if gone is not None:
        version = gone
        log.damage.append(Damage(
            commit_file(version),
            "missing Delta log entry: the newest commit is gone, a checksum of it is "
            "still there", version, True,
        ))
    for version in range(start, end):
        if not _apply_commit(spark, log, version, files):
            break
        log.entries_read.append(commit_file(version))
    log.files = files
    return log


def files_on_disk(spark: SparkSession | None, uri: str) -> dict[str, int]:
    """Every file under the table at ``uri`` (its log included), by path relative to it:
    its size in bytes."""
    return {path: size for path, (size, _) in storage.tree_state(spark, uri).items()}


def inspect_table(spark: SparkSession | None, uri: str, version: int | None = None,
                  on_disk: Mapping[str, int] | None = None) -> TableLog:
    """:func:`read_log`, then every live data file and deletion vector checked on disk.

    A data file that is missing, or whose size differs from its ``add`` action (a file cut
    short while written or copied), is damage from the version that added it. With
    ``version``, the files of that version are checked (those a ``RESTORE`` to it needs).
    ``on_disk``: the table's :func:`files_on_disk`, when already listed (checks of several
    versions of one table list it once).
    """
    log = read_log(spark, uri, version)
    if not log.exists:
        return log
    _check_checksum(spark, log)
    if on_disk is None:
        on_disk = files_on_disk(spark, log.uri)
    broken: list[tuple[LiveFile, str, str]] = []
    for live in log.files.values():
        relative = unquote(live.path)
        absolute = "://" in live.path or live.path.startswith("/")
        size = storage.file_size(spark, relative) if absolute else on_disk.get(relative)
        if size is None:
            broken.append((live, relative, f"data file is missing ({live.size} bytes in the log)"))
        elif size != live.size:
            broken.append((live, relative, f"data file is {size} bytes, the log says "
                                           f"{live.size}: half-written or changed"))
        vector = _deletion_vector_needs(live)
        if vector is not None:
            dv_file, needed = vector
            dv_size = on_disk.get(dv_file)
            if dv_size is None or dv_size < needed:
                state = "missing" if dv_size is None else f"cut short ({dv_size} bytes)"
                broken.append((live, dv_file, f"deletion vector of {relative} is {state}"))
    unknown = {live.path for live, _, _ in broken if live.version is None}
    added = _versions_adding(spark, log, unknown) if unknown else {}
    for live, file, problem in broken:
        version = live.version if live.version is not None else added.get(live.path, 0)
        log.damage.append(Damage(file, problem, version, False))
    return log


def newest_commit_gone(names: Iterable[str]) -> int | None:
    """The first version past a table's newest commit (or checkpoint) that a checksum in
    its log folder (``names``) still names: its commit was deleted, and what it wrote is
    lost to every reader. A commit's checksums outlive it when only the commit is deleted:
    Delta's ``NNN.crc``, and the ``.NNN.json.crc`` of Hadoop's local file system, which
    fails the next commit of that version. ``None`` when none does.

    Delta writes a commit before its checksums, so one in flight is never taken for gone.
    """
    names = list(names)
    written = [int(m[1]) for n in names if (m := _COMMIT.match(n))]
    written += list(_complete_checkpoints(names))
    newest = max(written, default=-1)
    orphans = [int(m[1]) for n in names
               if (m := _CHECKSUM.match(n) or _HADOOP_CHECKSUM.match(n)) and int(m[1]) > newest]
    return min(orphans, default=None)


def missing_at(spark: SparkSession | None, uri: str, version: int,
               on_disk: Mapping[str, int] | None = None) -> str | None:
    """What the table at ``uri`` lacks to return to ``version`` (a data file or deletion
    vector a VACUUM removed, a log entry), said in one line, or ``None``: a snapshot
    that names that version can no longer be restored. ``on_disk``: as for
    :func:`inspect_table`; given it, a local table's version found whole is remembered
    (:class:`_VersionNeeds`), and asked again it is checked against ``on_disk`` without
    replaying its log while the entries that replay read stay as they were."""
    listed = on_disk if spark is None else None  # only a local table's are remembered
    key = (uri.rstrip("/"), version)
    if listed is not None:
        with _WHOLE_VERSIONS_LOCK:
            needs = _WHOLE_VERSIONS.pop(key, None)
        if needs is not None and needs.met_by(listed):
            _remember_whole(key, needs)
            return None
    log = inspect_table(spark, uri, version, on_disk)
    if not log.damage:
        if listed is not None and len(log.files) <= REMEMBERED_FILES_MAX and not any(
                "://" in f.path or f.path.startswith("/") for f in log.files.values()):
            _remember_whole(key, _VersionNeeds.of(log, listed))
        return None
    first = min(log.damage, key=lambda d: d.version)
    return f"cannot return to version {version}: {first.file}: {first.problem}"


@dataclass(frozen=True)
class _VersionNeeds:
    """What a version of a table found whole needs on disk to stay whole: the log entries
    its replay read, each of the size it had, and its data files and deletion vectors, at
    least as big as its log says (paths relative to the table folder).

    A version's log entries never change once written: while they are there as they
    were, replaying them gives the same files, so the health page, which checks every kept
    snapshot at each load, replays each one once (thirty snapshots of eight tables of 270
    versions each: 6.5 s a load, replayed each time).
    """

    entries: tuple[tuple[str, int], ...]
    files: tuple[tuple[str, int, bool], ...]  # path, size, whether exactly that size

    @classmethod
    def of(cls, log: TableLog, on_disk: Mapping[str, int]) -> _VersionNeeds:
        files: list[tuple[str, int, bool]] = []
        for live in log.files.values():
            files.append((sys.intern(unquote(live.path)), live.size, True))
            vector = _deletion_vector_needs(live)
            if vector is not None:
                files.append((*vector, False))
        entries = tuple((name, on_disk.get(name, -1)) for name in log.entries_read)
        return cls(entries, tuple(files))

    def met_by(self, on_disk: Mapping[str, int]) -> bool:
        """Whether the table's files ``on_disk`` still hold this version whole."""
        if any(on_disk.get(name) != size for name, size in self.entries):
            return False
        for path, size, exact in self.files:
            found = on_disk.get(path)
            if found is None or found < size or (exact and found != size):
                return False
        return True


#: Whole versions remembered by :func:`missing_at`, least recently asked first (the
#: health page's requests are served on several threads).
_WHOLE_VERSIONS: OrderedDict[tuple[str, int], _VersionNeeds] = OrderedDict()
_WHOLE_VERSIONS_KEPT = 512

#: Live files up to which a whole version is remembered (:class:`_VersionNeeds`): about
#: 70 bytes each, the paths shared between versions (100,000 files took 6.9 MB a version,
#: 10.5 for the first), so at most some 1.4 MB a version. A version of more files is
#: replayed at each check.
REMEMBERED_FILES_MAX = 20_000
_WHOLE_VERSIONS_LOCK = threading.Lock()


def _remember_whole(key: tuple[str, int], needs: _VersionNeeds) -> None:
    with _WHOLE_VERSIONS_LOCK:
        _WHOLE_VERSIONS[key] = needs
        _WHOLE_VERSIONS.move_to_end(key)
        while len(_WHOLE_VERSIONS) > _WHOLE_VERSIONS_KEPT:
            _WHOLE_VERSIONS.popitem(last=False)


def set_aside_log_from(
    spark: SparkSession | None, uri: str, version: int, suffix: str
) -> tuple[str, list[str]]:
    """Move every log entry of ``version`` and later out of the table's ``_delta_log``.

    Afterwards the table reads as of ``version - 1`` (the files those entries added stay
    in the folder, unreferenced, until VACUUM). ``_last_checkpoint`` goes too, since it may
    name a checkpoint that was moved; Delta then finds the newest checkpoint by listing.

    :param suffix: names the folder the entries go to, ``_delta_log.damaged-<suffix>``.
    :return: that folder and the names moved.
    """
    base = uri.rstrip("/")
    target = f"{base}/{LOG_DIR}.damaged-{suffix}"
    moved = []
    for name in storage.list_names(spark, f"{base}/{LOG_DIR}"):
        match = _OF_VERSION.match(name)
        if (match and int(match[1]) >= version) or name in (LAST_CHECKPOINT,
                                                            f".{LAST_CHECKPOINT}.crc"):
            storage.move(spark, f"{base}/{LOG_DIR}/{name}", f"{target}/{name}")
            moved.append(name)
    return target, moved


def clear_delta_cache(spark: SparkSession) -> None:
    """Forget the table states Delta cached in this JVM (after log files moved under it)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()


def file_key(action: dict[str, Any]) -> tuple[str, str]:
    """The identity of a data file in the log: its path and its deletion vector's id.

    A DELETE that adds a deletion vector removes ``(path, old vector)`` and adds
    ``(path, new vector)``, in either order within one commit.
    """
    dv = action.get("deletionVector") or {}
    dv_id = f"{dv.get('storageType', '')}{dv.get('pathOrInlineDv', '')}"
    if dv.get("offset") is not None:
        dv_id += f"@{dv['offset']}"
    return action["path"], dv_id


def _complete_checkpoints(names: list[str]) -> dict[int, list[str]]:
    """Checkpoint versions whose every part is present: version -> part file names."""
    parts: dict[int, dict[int, str]] = {}
    expected: dict[int, int] = {}
    for name in names:
        match = _CHECKPOINT.match(name)
        if match is None:
            continue
        version = int(match[1])
        part, total = (int(match[2]), int(match[3])) if match[2] else (1, 1)
        parts.setdefault(version, {})[part] = name
        expected[version] = total
    return {v: [p[i] for i in sorted(p)] for v, p in parts.items()
            if sorted(p) == list(range(1, expected[v] + 1))}


def _check_last_checkpoint(
    spark: SparkSession | None, log: TableLog, names: list[str],
    checkpoints: dict[int, list[str]],
) -> None:
    """A ``_last_checkpoint`` that does not parse, or names a checkpoint that is not there.

    Delta falls back to listing the log then, so nothing is lost; the damage is put after
    the newest version so that any snapshot may be restored, and restoring moves it aside.
    """
    if LAST_CHECKPOINT not in names:
        return
    text = storage.read_text(spark, f"{log.uri}/{LOG_DIR}/{LAST_CHECKPOINT}") or ""
    try:
        named = int(json.loads(text)["version"])
    except (ValueError, KeyError, TypeError):
        problem = "does not parse"
    else:
        if named in checkpoints:
            return
        problem = f"names checkpoint {named}, which is missing or incomplete"
    after = (log.newest_version or 0) + 1
    log.damage.append(Damage(f"{LOG_DIR}/{LAST_CHECKPOINT}", problem, after, True))


def _read_checkpoint(
    spark: SparkSession | None, uri: str, parts: list[str]
) -> tuple[dict[tuple[str, str], LiveFile], dict[str, Any], dict[str, Any]]:
    """The live files and the ``metaData`` and ``protocol`` actions of a (multi-part)
    checkpoint, each in the shape a commit's JSON gives it."""
    files: dict[tuple[str, str], LiveFile] = {}
    metadata: dict[str, Any] = {}
    protocol: dict[str, Any] = {}
    for part in parts:
        data = storage.read_bytes(spark, f"{uri}/{LOG_DIR}/{part}")
        if data is None:
            raise FileNotFoundError(part)
        names = pq.read_schema(io.BytesIO(data)).names
        columns = [c for c in ("add", "metaData", "protocol") if c in names]
        for row in pq.read_table(io.BytesIO(data), columns=columns).to_pylist():
            add, meta, proto = row.get("add"), row.get("metaData"), row.get("protocol")
            if add:
                add = _as_json_action(add, maps=("partitionValues", "tags"))
                add.pop("stats_parsed", None)
                add.pop("partitionValues_parsed", None)
                files[file_key(add)] = LiveFile(add["path"], int(add["size"]), None,
                                                add.get("deletionVector"), add)
            if meta:
                metadata = _as_json_action(meta, maps=("configuration",))
                if isinstance(metadata.get("format"), dict):
                    metadata["format"] = _as_json_action(metadata["format"], maps=("options",))
            if proto:
                protocol = _as_json_action(proto, maps=())
    return files, metadata, protocol


def _as_json_action(row: dict[str, Any], maps: tuple[str, ...]) -> dict[str, Any]:
    """A checkpoint row's action as a commit's JSON gives it: no null fields, and the named
    map fields as objects (Parquet gives maps as lists of key-value pairs)."""
    action = {}
    for key, value in row.items():
        if value is None:
            continue
        if key in maps:
            value = dict(value)
        elif isinstance(value, dict):
            value = {k: v for k, v in value.items() if v is not None}
        action[key] = value
    return action


def _apply_commit(
    spark: SparkSession | None, log: TableLog, version: int,
    files: dict[tuple[str, str], LiveFile],
) -> bool:
    """Apply commit ``version`` to ``files``; ``False`` (and damage) when it is unreadable."""
    text = storage.read_text(spark, f"{log.uri}/{commit_file(version)}")
    actions = []
    for number, line in enumerate((text or "").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError:
            action = None
        if not isinstance(action, dict):
            log.damage.append(Damage(
                commit_file(version),
                f"half-written commit: line {number} is not a complete JSON action",
                version, True,
            ))
            return False
        actions.append(action)
    if not actions:
        log.damage.append(Damage(commit_file(version), "empty commit file", version, True))
        return False
    for action in actions:
        if "add" in action:
            add = action["add"]
            files[file_key(add)] = LiveFile(add["path"], int(add["size"]), version,
                                            add.get("deletionVector"), add)
        elif "remove" in action:
            files.pop(file_key(action["remove"]), None)
        elif "metaData" in action:
            _apply_metadata(log, action["metaData"])
        elif "protocol" in action:
            log.protocol = action["protocol"]
    return True


def _apply_metadata(log: TableLog, metadata: dict[str, Any]) -> None:
    """Keep what sessionlake needs of a ``metaData`` action (JSON, or a checkpoint row)."""
    if not metadata:
        return
    log.metadata = metadata
    log.configuration = dict(metadata.get("configuration") or {})
    if metadata.get("createdTime") is not None:
        log.created_ms = int(metadata["createdTime"])


def _check_checksum(spark: SparkSession | None, log: TableLog) -> None:
    """Compare the replayed state with ``NNN.crc`` of the newest version, when present.

    A commit cut off exactly between two lines still parses; only the checksum shows that
    actions are missing.
    """
    version = log.newest_version
    if version is None or log.damage or version not in log.commits:
        return
    text = storage.read_text(spark, f"{log.uri}/{LOG_DIR}/{version:020d}.crc")
    try:
        checksum = json.loads(text or "")
        files, size = int(checksum["numFiles"]), int(checksum["tableSizeBytes"])
    except (ValueError, KeyError, TypeError):
        return  # no checksum (or one of another shape): nothing to compare
    found = (len(log.files), sum(f.size for f in log.files.values()))
    if found != (files, size):
        log.damage.append(Damage(
            commit_file(version),
            f"half-written commit: the log gives {found[0]} files / {found[1]} bytes, its "
            f"checksum {version:020d}.crc {files} / {size}", version, True,
        ))


def _versions_adding(
    spark: SparkSession | None, log: TableLog, paths: set[str]
) -> dict[str, int]:
    """The commit that added each of ``paths``, from the commits kept before the checkpoint.

    Paths whose commit was cleaned up from the log are left out.
    """
    found: dict[str, int] = {}
    for version in sorted((v for v in log.commits if v <= (log.checkpoint_version or -1)),
                          reverse=True):
        text = storage.read_text(spark, f"{log.uri}/{commit_file(version)}") or ""
        for line in text.splitlines():
            try:
                add = json.loads(line).get("add")
            except (ValueError, AttributeError):
                continue
            if add and add.get("path") in paths and add["path"] not in found:
                found[add["path"]] = version
        if len(found) == len(paths):
            break
    return found


def _deletion_vector_needs(live: LiveFile) -> tuple[str, int] | None:
    """The file of ``live``'s deletion vector stored beside the data, and the bytes it
    must hold at least to give it (its offset, size and checksum); ``None`` for no such
    vector."""
    dv = live.deletion_vector
    if not dv or dv.get("storageType") != "u":
        return None
    needed = int(dv.get("offset") or 0) + 4 + int(dv["sizeInBytes"]) + 4
    return deletion_vector_file(str(dv["pathOrInlineDv"])), needed


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__

"""The files sessionlake keeps in a checkpoint folder besides Spark's, and its lock; where
the lake keeps its snapshot catalog.

Kept free of PySpark so that the Airflow DAGs and the health page can look at a checkpoint
(is a run holding it? which stream is it?) and at the snapshots without starting a JVM.
"""

from __future__ import annotations

import fcntl
import io
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from itertools import accumulate, groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import unquote, urlsplit

from sessionlake.config import KAFKA_SOURCE, ConfigError
from sessionlake.storage import is_glob, list_names, local_path, read_text, write_text

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: The flock a run holds for its whole life; a second run on the checkpoint is refused.
LOCK_FILE = "sessionlake.lock"
#: The flock a micro-batch holds from pinning the table versions it reads to its last write.
#: An erasure takes it too, so that no batch reads a user's state from before an erasure
#: and writes it back after.
BATCH_LOCK_FILE = "sessionlake-batch.lock"
#: The pid of the run holding the lock.
PID_FILE = "sessionlake.pid"
#: The pid and host of the run holding the lock: where to stop a run of another host or
#: container, whose pid means another process here (see ``sessionlake.locks.Holder``).
HOLDER_FILE = "sessionlake-holder.json"
#: Output of a continuous run the restart DAG started, detached.
CONTINUOUS_LOG = "sessionlake-continuous.log"
#: The continuous run the restart DAG started last: its pid and command line, so that the
#: restore DAG can stop it and start it again as it was.
CONTINUOUS_RUN = "sessionlake-continuous.json"
#: The lake's own stream lock, beside its default checkpoint: ``<lake>/_checkpoints/``
#: ``lake.lock``, held by a run for its whole life whatever its checkpoint, with the pid
#: and checkpoint of the run holding it in ``lake-holder.json``.
LAKE_LOCK_DIR = "_checkpoints"
LAKE_LOCK_FILE = "lake.lock"
LAKE_HOLDER_FILE = "lake-holder.json"
#: In the lake's ``_checkpoints`` folder: the gap and the maximum session duration its
#: stream cuts sessions with, noted at the first run
#: (:func:`sessionlake.stream.check_session_rules_unchanged`), ``{"gap_s": 1800.0,
#: "max_session_duration_s": 86400.0}``; notes from before 2026-12-06 hold the gap alone.
GAP_NOTE = "gap.json"
#: In the lake's ``_checkpoints`` folder: where each Kafka stream's partitions ended when an
#: erasure erased, a file per erasure, ``<its start, ms>.json``, ``{"<checkpoint>":
#: {"<partition>": offset}}`` (``sessionlake.kafkastream.note_kafka_ends``).
KAFKA_ERASURES_DIR = "kafka-erasures"
#: The checkpoints that ever ran a stream on the lake, a file each in this folder of
#: ``<lake>/_checkpoints/`` (see ``sessionlake.registry.register_stream``).
STREAMS_DIR = "streams"
#: The stream's id and restore epoch (see :class:`StreamIdentity`).
IDENTITY_FILE = "sessionlake.json"
#: Left by a restore that has not finished (see ``sessionlake.snapshots``).
RESTORING_MARKER = "sessionlake-restoring.json"
#: The lake's snapshot catalog: ``<lake>/_snapshots/<id>/snapshot.json`` (see
#: ``sessionlake.snapshots``).
SNAPSHOTS_DIR = "_snapshots"
MANIFEST = "snapshot.json"
#: In the catalog folder: held by a restore throughout and by an expiry while it deletes,
#: so that no expiry removes the snapshot a restore is reading.
CATALOG_LOCK_FILE = ".catalog.lock"

#: Spark's own checkpoint, inside sessionlake's.
SPARK_CHECKPOINT = "spark"
#: Spark's file source log in its checkpoint: the files each batch read.
SPARK_SOURCE_LOG = "sources/0"
#: The same log in sessionlake's checkpoint.
SOURCE_LOG = f"{SPARK_CHECKPOINT}/{SPARK_SOURCE_LOG}"
#: Entries of that log: ``N`` or ``N.compact``.
SOURCE_LOG_ENTRY = re.compile(r"^(\d+)(\.compact)?$")
#: Spark's offsets log in its checkpoint: entry ``N`` holds where batch ``N`` ends in each
#: source; for the file source, the number of its log's last entry the batch reads.
SPARK_OFFSETS_LOG = "offsets"
#: In a checkpoint: the folders ``sessionlake archive`` moved the files the stream read
#: to, ``{"targets": [...]}`` (:func:`forget_archived_files`).
ARCHIVE_NOTE = "archived.json"
#: In a checkpoint: an archive found its stream running and left the trim of the source log
#: to it (:func:`request_forget`); a continuous run does it between two batches.
FORGET_REQUEST = "archived.pending"
#: In a checkpoint: whether its stream reads the landing folder's subfolders,
#: ``{"subfolders": true}`` (:func:`landing_subfolders_read`).
LANDING_NOTE = "landing.json"
#: In a checkpoint of a Kafka stream: where the records that landed after each erasure
#: begin, by the erasure's start (ms), ``{"<ms>": {"<partition>": offset}}``
#: (``sessionlake.kafkastream.kafka_erasure_offsets``).
KAFKA_ERASURE_NOTE = "kafka-erasures.json"
#: In a checkpoint: the format its stream parses records with, ``{"format": "apache"}``
#: (:func:`noted_input_format`).
FORMAT_NOTE = "format.json"

log = logging.getLogger("sessionlake.checkpoint")



@dataclass(frozen=True)
class StreamIdentity:
    """Who writes: the checkpoint's id and its restore epoch, named in every commit's tag."""

    stream_id: str
    epoch: int

    @property
    def app_id(self) -> str:
        """The stream's name in its commits' tags (changes with every restore)."""
        return f"sessionlake-{self.stream_id}-e{self.epoch}"

    @property
    def ledger_prefix(self) -> str:
        """How the names of this stream's ledger entries in this epoch begin:
        ``<stream id>-<epoch>-`` (then the batch id and ``.json``)."""
        return f"{self.stream_id}-{self.epoch}-"


def read_stream_identity(spark: SparkSession | None, checkpoint: str) -> StreamIdentity | None:
    """The identity kept in the checkpoint folder (:data:`IDENTITY_FILE`); ``None``
    before the stream's first run.

    :raises ValueError, KeyError, TypeError: on a file that does not parse.
    """
    text = read_text(spark, f"{checkpoint.rstrip('/')}/{IDENTITY_FILE}")
    if text is None:
        return None
    data = json.loads(text)
    return StreamIdentity(stream_id=str(data["stream_id"]), epoch=int(data["epoch"]))


def ledger_batch_ids(spark: SparkSession | None, checkpoint: str,
                     identity: StreamIdentity) -> list[int]:
    """The batch ids of ``identity``'s entries in the checkpoint's ledger, ascending."""
    prefix = identity.ledger_prefix
    numbers = (name[len(prefix):-len(".json")]
               for name in list_names(spark, f"{checkpoint.rstrip('/')}/ledger")
               if name.startswith(prefix) and name.endswith(".json"))
    return sorted(int(number) for number in numbers if number.isdigit())

#: How long a starting run keeps trying for its lock before it calls the lock taken: long
#: enough to ride out a reader's probe (:func:`lock_held`), short for a refusal to wait.
LOCK_PATIENCE_S = 1.0


def lock_held(folder: Path, lock_file: str = LOCK_FILE) -> bool:
    """Whether a process holds ``folder/lock_file`` (the run's lock of the local checkpoint
    ``folder`` by default).

    A probe: a free lock is taken for a moment, which a run starting then rides out (it
    keeps trying for :data:`LOCK_PATIENCE_S`). Unlike a pid file, it sees a run in another
    container sharing the folder, and a killed run's lock goes with it.
    """
    if not (folder / lock_file).exists():
        return False
    with open(folder / lock_file, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
    return False


class LockTimeout(TimeoutError):
    """A lock was not free within the time the caller was willing to wait."""


@contextmanager
def batch_lock(folder: Path | None, timeout: float | None = None,
               lock_file: str = BATCH_LOCK_FILE) -> Iterator[None]:
    """Hold the batch lock of the local checkpoint ``folder`` (``None``: remote, no lock),
    or another lock of a folder that is waited for the same way (``lock_file``).

    Without ``timeout`` this waits as long as it takes (a batch waiting for an erasure);
    with one it raises :class:`LockTimeout` when the lock stays taken that long.
    """
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / lock_file, "a+") as lock:
        if timeout is None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        else:
            deadline = time.monotonic() + timeout
            waited = False
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not waited:
                        log.info("waiting up to %g s for %s of %s", timeout,
                                 "the batch in flight" if lock_file == BATCH_LOCK_FILE
                                 else lock_file, folder)
                        waited = True
                    if time.monotonic() > deadline:
                        raise LockTimeout(
                            f"the lock {folder / lock_file} stayed taken for {timeout:g} s"
                        ) from None
                    time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def lake_lock_folder(lake: str) -> str:
    """Where the lake keeps its stream locks and its register of streams."""
    return f"{lake.rstrip('/')}/{LAKE_LOCK_DIR}"


def noted_gap_s(spark: SparkSession | None, lake: str) -> float | None:
    """The gap, in seconds, the lake's stream cuts its sessions with, as its first run
    noted it (:data:`GAP_NOTE`); ``None`` before that run.

    :raises ValueError, KeyError, TypeError: on a note that does not parse.
    """
    noted = noted_session_rules(spark, lake)
    return None if noted is None else noted["gap_s"]


def noted_session_rules(spark: SparkSession | None, lake: str) -> dict[str, float] | None:
    """What the lake's stream cuts its sessions with, in seconds, as its first run noted
    it (:data:`GAP_NOTE`): ``gap_s``, and ``max_session_duration_s`` unless the note is
    older than that key; ``None`` before that run.

    :raises ValueError, KeyError, TypeError: on a note that does not parse.
    """
    text = read_text(spark, f"{lake_lock_folder(lake)}/{GAP_NOTE}")
    if text is None:
        return None
    noted = json.loads(text)
    return {key: float(noted[key]) for key in ("gap_s", "max_session_duration_s")
            if key in noted or key == "gap_s"}


@contextmanager
def batch_locks(lake: str, checkpoint: str, timeout: float | None = None) -> Iterator[None]:
    """Hold the checkpoint's batch lock, then the lake's (``<lake>/_checkpoints/``), as
    :func:`batch_lock` does each: a batch and an erasure take both, so that an erasure
    waits for the batch in flight of whatever checkpoint writes the lake, and for the
    stream of the checkpoint it was given."""
    lake_folder = local_path(lake_lock_folder(lake))
    with batch_lock(local_path(checkpoint), timeout), batch_lock(lake_folder, timeout):
        yield


def lake_batch_lock(lake: str) -> AbstractContextManager[None]:
    """The lake's batch lock alone, waited for: what a restore, a rebuild of the state
    and a backfill's changelog hold so that no erasure (which takes it, see
    :func:`batch_locks`) runs between what they read and what they write back."""
    return batch_lock(local_path(lake_lock_folder(lake)))


#: Read files left in the landing folder from which a run and the health page say to
#: archive them: 20,000 of them cost each run about 1.5 s (docs/performance.md).
ARCHIVE_HINT_FILES = 10_000


@dataclass(frozen=True)
class UnreadInput:
    """What a run on a checkpoint would read now: the files of which no batch committed."""

    bytes: int
    files: int
    #: Files that committed batches read, still in the landing folder: each run lists them
    #: again (``sessionlake archive`` moves them out).
    read_left: int = 0
    #: The bytes of the file source log each run reads back: every file it ever read,
    #: but those ``sessionlake archive`` made it forget.
    log_bytes: int = 0
    #: The files that share their modification time (to the millisecond, as Spark lists
    #: them) with others, as runs ``(first, count)`` of the files in time order: Spark
    #: orders a landing folder's files by that time alone.
    ties: tuple[tuple[int, int], ...] = field(default=(), compare=False, repr=False)

    @property
    def archive_due(self) -> bool:
        """Whether enough read files are left in the landing folder to slow each run."""
        return self.read_left >= ARCHIVE_HINT_FILES

    def split_by_batches(self, max_files_per_trigger: int) -> int:
        """How many files share their modification time with files an available-now run
        reads in another of its batches (``max_files_per_trigger`` files each): Spark has
        nothing else to order them by, so which of them each batch takes is chance."""
        n = max_files_per_trigger
        # A run of files [first, first + count) is split when a batch boundary k*n falls
        # strictly inside it.
        return sum(count for first, count in self.ties
                   if (first // n + 1) * n < first + count)

    def batches(self, max_files_per_trigger: int | None = None) -> int:
        """How many micro-batches an available-now run makes of these files."""
        if not self.files:
            return 0
        return -(-self.files // max_files_per_trigger) if max_files_per_trigger else 1


def noted_input_format(checkpoint: str, spark: SparkSession | None = None) -> str | None:
    """The ``--format`` the checkpoint's stream reads its input with, as its first run
    noted it (:func:`note_input_format`; ``None``: no note, from before the note or before
    any run)."""
    text = read_text(spark, f"{checkpoint.rstrip('/')}/{FORMAT_NOTE}")
    return None if text is None else str(json.loads(text)["format"])


def note_input_format(spark: SparkSession, checkpoint: str, input_format: str) -> None:
    """Note in the checkpoint the ``--format`` its stream reads its input with."""
    write_text(spark, f"{checkpoint.rstrip('/')}/{FORMAT_NOTE}",
               json.dumps({"format": input_format}))


def landing_subfolders_read(checkpoint: str, spark: SparkSession | None = None) -> bool:
    """Whether the checkpoint's stream reads the landing folder's subfolders: as its
    :data:`LANDING_NOTE` says, else whether it is new (its file source listed no file yet).

    Every stream begun since sessionlake reads subfolders does (a run notes it); one that
    read files before keeps to the folder's own files and Spark's ``key=value`` folders
    (:func:`sessionlake.stream.reads_subfolders`).
    """
    text = read_text(spark, f"{checkpoint.rstrip('/')}/{LANDING_NOTE}")
    if text is not None:
        return bool(json.loads(text).get("subfolders"))
    return not list_names(spark, f"{checkpoint.rstrip('/')}/{SOURCE_LOG}")


def unread_input(source: str, checkpoint: str) -> UnreadInput | None:
    """What of the landing folder ``source`` a run on ``checkpoint`` would read now: the
    files of which the stream has committed no batch (new files, and those of a batch
    planned but not committed, which runs again). Hidden files (``.``, ``_``) do not
    count, as Spark skips them.

    ``None`` when that cannot be told without a Spark of its own: a Kafka topic, a landing
    folder or checkpoint not on this machine, or a glob; and when a file cannot be read or
    the source log is not Spark's (the run itself then says what is wrong: this is only a
    hint for how it starts).
    """
    if not source or source == KAFKA_SOURCE or is_glob(source):
        return None
    folder, checkpoint_folder = local_path(source), local_path(checkpoint)
    if folder is None or checkpoint_folder is None:
        return None
    try:
        return unread_files(folder, checkpoint_folder / SPARK_CHECKPOINT,
                            landing_subfolders_read(str(checkpoint_folder)))
    except (OSError, ValueError, KeyError, TypeError) as error:
        log.warning("cannot size the input to read in %s: %s", source, error)
        return None


def hidden_from_spark(name: str) -> bool:
    """Whether Spark's file listing skips a file or folder of this name (a leading ``.``
    or ``_``: checksums, ``_SUCCESS``, work in progress, archives)."""
    return name.startswith((".", "_"))


def partition_folder(name: str) -> bool:
    """Whether a folder of this name is a Spark ``key=value`` partition folder, which a
    stream that does not read subfolders reads all the same."""
    return "=" in name


def unread_files(folder: Path, spark_checkpoint: Path, subfolders: bool = True) -> UnreadInput:
    """The files in ``folder`` (but hidden ones) that no committed batch of the Spark
    checkpoint ``spark_checkpoint`` read: how many, and their bytes; and how many it read
    are still there. With
    ``subfolders`` false, only the folder's own files and those of ``key=value`` folders,
    as a stream that does not read subfolders sees them."""
    read = files_read(spark_checkpoint)
    folder = Path(os.path.abspath(folder))  # as Hadoop qualifies it: links stay as named
    total = read_left = 0
    times: list[int] = []
    for path in folder.rglob("*"):
        parts = path.relative_to(folder).parts
        hidden = any(hidden_from_spark(part) for part in parts)
        seen = subfolders or all(partition_folder(part) for part in parts[:-1])
        if str(path) in read:
            read_left += 1
        elif not hidden and seen and path.is_file():
            stat = path.stat()
            total += stat.st_size
            times.append(stat.st_mtime_ns // 1_000_000)
    log_bytes = sum(entry.stat().st_size for entry in _entries_read_back(spark_checkpoint))
    runs = [sum(1 for _ in same) for _, same in groupby(sorted(times))]
    starts = accumulate(runs, initial=0)
    return UnreadInput(bytes=total, files=len(times), read_left=read_left,
                       log_bytes=log_bytes,
                       ties=tuple((first, count) for first, count in zip(starts, runs,
                                                                        strict=False)
                                  if count > 1))


def warn_of_files_in_no_order(unread: UnreadInput | None, source: str,
                              max_files_per_trigger: int | None) -> None:
    """Say when a run will read files in batches (``--max-files-per-trigger``) that share
    their modification time: Spark reads a landing folder's files oldest first and has
    nothing else to order these by, so a later file's events may be read first and make an
    earlier file's late, for good. A plain ``cp`` into the folder gives every file about
    the same time."""
    split = 0 if unread is None or not max_files_per_trigger else \
        unread.split_by_batches(max_files_per_trigger)
    if not split:
        return
    assert unread is not None and max_files_per_trigger is not None
    log.warning("%d of the %d files to read in %s share their modification time with "
                "another that falls in another batch: Spark reads files oldest first, "
                "--max-files-per-trigger %d at a time, and reads these in no particular order "
                "among themselves, so a later file's events read first can make an earlier "
                "file's late. Give them times in the order they were written (`cp -p` keeps "
                "the originals'; `touch` them one by one), or read them in one batch (no "
                "--max-files-per-trigger)", split, unread.files, source, max_files_per_trigger)


def modified_since_listed(mtime_ns: int, listed_ms: int | None) -> bool:
    """Whether a file whose modification time is now ``mtime_ns`` changed after Spark's file
    source listed it at ``listed_ms`` (as its log notes): lines added since were never
    read. A file merely touched counts too."""
    return listed_ms is not None and mtime_ns // 1_000_000 > listed_ms


def changed_since_read(spark_checkpoint: Path, batches: int = 3) -> list[Path]:
    """The local files of the stream's newest ``batches`` batches whose modification time
    is now later than when Spark's file source listed them.

    Spark reads a file once, whole as it was then: lines appended to it later (a log still
    being written, a copy not finished) are never read. Only the newest batches are looked
    at: a file still being written is among them, and a run should not stat every file
    ever read.
    """
    entries = _source_log_entries(spark_checkpoint)
    since = entries[-1][0] - batches if entries else 0
    changed = set()
    for number, _, entry in reversed(entries):
        if number <= since:
            break
        for logged in logged_after(entry.read_text(), since):
            path = Path(logged.path)
            try:
                if modified_since_listed(path.stat().st_mtime_ns, logged.timestamp_ms):
                    changed.add(path)
            except FileNotFoundError:
                continue
    return sorted(changed)


def logged_after(text: str, batch_id: int) -> list[LoggedFile]:
    """The files an entry of the file source log lists for batches after ``batch_id``,
    read from its end: a compacted entry lists every file ever read, in batch order, and
    the newest batches' few are all that is wanted of it."""
    files = []
    end = len(text)
    while (start := text.rfind("\n", 0, end)) >= 0:  # the line before the first is the version
        line, end = text[start + 1:end], start
        if not line.strip():
            continue
        entry = json.loads(line)
        if int(entry.get("batchId", 0)) <= batch_id:
            break
        files.append(_logged(entry))
    return files[::-1]


def _source_log_entries(spark_checkpoint: Path) -> list[tuple[int, bool, Path]]:
    """The entries of a local Spark checkpoint's file source log, oldest first: number,
    whether compacted, file."""
    folder = spark_checkpoint / SPARK_SOURCE_LOG
    return sorted(
        (int(m.group(1)), bool(m.group(2)), p)
        for p in (folder.iterdir() if folder.is_dir() else [])
        if (m := SOURCE_LOG_ENTRY.match(p.name))
    )


def files_read(spark_checkpoint: Path) -> set[str]:
    """The local paths of the files that committed batches of a Spark checkpoint's stream
    read, from its file source log (the newest ``N.compact`` entry lists every file up to
    it; later entries one batch each), up to the entry the last committed batch's offset
    names."""
    return set(files_read_as_listed(spark_checkpoint))


def files_read_as_listed(spark_checkpoint: Path) -> dict[str, int | None]:
    """:func:`files_read`, each with its modification time (ms) when the file source
    listed it: a file modified since has lines the stream never read."""
    last = committed_source_offset(spark_checkpoint)
    read: dict[str, int | None] = {}
    for entry in _entries_read_back(spark_checkpoint):
        read.update((local_file(logged["path"]), logged.get("timestamp"))
                    for logged in _source_log_json(entry.read_text())
                    if int(logged.get("batchId", 0)) <= last)
    return read


def _entries_read_back(spark_checkpoint: Path) -> list[Path]:
    """The file source log's entries Spark reads at a stream's start, which list every
    file read: the newest compacted one and those after it."""
    entries = _source_log_entries(spark_checkpoint)
    compacts = [number for number, compact, _ in entries if compact]
    since = compacts[-1] if compacts else -1
    return [entry for number, _, entry in entries if number >= since]


def last_committed_batch(spark: SparkSession | None, spark_checkpoint: str | Path) -> int:
    """The newest batch id in a Spark checkpoint's ``commits`` log (-1 when none)."""
    names = list_names(spark, f"{str(spark_checkpoint).rstrip('/')}/commits")
    return max((int(name) for name in names if name.isdigit()), default=-1)


def committed_source_offset(spark_checkpoint: Path) -> int:
    """The file source log's entry up to which committed batches read (-1: none)."""
    committed = last_committed_batch(None, spark_checkpoint)
    if committed < 0:
        return -1
    return file_source_offset((spark_checkpoint / SPARK_OFFSETS_LOG / str(committed)).read_text())


def file_source_offset(offsets_entry: str) -> int:
    """The file source's offset in an entry of Spark's offsets log: the number of the last
    source log entry its batch reads.

    A source log entry is written when the source lists new files, the offsets entry when
    the batch is planned: a driver that stops between the two leaves the listed files to
    the next batch, with those listed at its start. So batch ``N`` reads the source log's
    entries after batch ``N-1``'s offset up to its own, not entry ``N`` alone.

    The entry is a version line, a line of the batch's metadata, then a line per source.
    """
    return int(json.loads(offsets_entry.splitlines()[2])["logOffset"])


class LoggedFile(NamedTuple):
    """A file an entry of Spark's file source log lists."""

    path: str  #: its local path
    batch_id: int
    timestamp_ms: int | None  #: its modification time when the source listed it
    uri: str = ""  #: its URI as Spark wrote it (escaped), as the batch's records name it


def batch_files(spark: SparkSession | None, checkpoint: str,
                batch_id: int) -> list[LoggedFile] | None:
    """The files the stream's batch ``batch_id`` reads: those of the file source log's
    entries after the previous batch's offset up to its own (:func:`file_source_offset`),
    as Spark's file source reads them (``None``: an entry of either log is missing)."""
    spark_checkpoint = f"{checkpoint.rstrip('/')}/{SPARK_CHECKPOINT}"

    def offset(batch: int) -> int | None:
        if batch < 0:
            return -1  # the first batch reads from the log's first entry on
        text = read_text(spark, f"{spark_checkpoint}/{SPARK_OFFSETS_LOG}/{batch}")
        return None if text is None else file_source_offset(text)

    start, end = offset(batch_id - 1), offset(batch_id)
    if start is None or end is None:
        return None
    files: list[LoggedFile] = []
    for number in range(start + 1, end + 1):
        logged = _entry_s_own_files(spark, spark_checkpoint, number)
        if logged is None:
            return None
        files += [file for file in logged if file.batch_id == number]
    return files


def _entry_s_own_files(
    spark: SparkSession | None, spark_checkpoint: str, number: int
) -> list[LoggedFile] | None:
    """The files the file source log's entry ``number`` lists for its own batch, read from
    its end (a compacted entry lists every earlier file before them); ``None`` when it is
    not there."""
    for name in (str(number), f"{number}.compact"):
        text = read_text(spark, f"{spark_checkpoint}/{SPARK_SOURCE_LOG}/{name}")
        if text is not None:
            return logged_after(text, number - 1)
    return None


def _logged(entry: dict[str, Any]) -> LoggedFile:
    """One JSON object of the file source log as a :class:`LoggedFile`."""
    return LoggedFile(local_file(entry["path"]), int(entry.get("batchId", 0)),
                      None if "timestamp" not in entry else int(entry["timestamp"]),
                      str(entry["path"]))


def _source_log_json(text: str) -> list[dict[str, Any]]:
    """The JSON objects of an entry of Spark's file source log: a version line, then one
    object per file. Parsed as one array, as a stream that has read a million files has
    a compacted entry of a million lines (5.1 s one by one, 0.7 s so)."""
    lines = text.split("\n")[1:]
    return list(json.loads("[" + ",".join(line for line in lines if line.strip()) + "]"))


#: How Spark's Kafka source begins its one source log entry, the topics' starting offsets
#: (a zero byte, kept for Spark 2.1's readers, then the version line); the file source's
#: entries begin with the version line.
KAFKA_LOG_MARK = "\0"
KAFKA_SOURCE_LOG_START = f"{KAFKA_LOG_MARK}v"


def kafka_topics_logged(text: str) -> list[str] | None:
    """The topics of a Kafka source log entry; ``None`` when ``text`` is not one."""
    if not text.startswith(KAFKA_SOURCE_LOG_START):
        return None
    lines = text.removeprefix(KAFKA_LOG_MARK).splitlines()
    offsets = json.loads(lines[1]) if len(lines) > 1 and lines[1].strip() else {}
    return sorted(offsets) if isinstance(offsets, dict) else []


def kafka_topics_read(spark: SparkSession | None, checkpoint: str) -> list[str] | None:
    """The topics of the checkpoint's Kafka source; ``None`` when it has no Kafka source
    log (a folder's stream, or nothing read yet)."""
    text = read_text(spark, f"{checkpoint.rstrip('/')}/{SOURCE_LOG}/0")
    try:
        return None if text is None else kafka_topics_logged(text)
    except ValueError:
        return []  # a Kafka entry cut short: the doctor names it


def kafka_offsets(line: str) -> dict[str, dict[int, int]]:
    """Kafka offsets as Spark writes them in its logs (``{"topic": {"0": 42}}``): the next
    offset to read, by topic and partition."""
    return {topic: {int(p): int(o) for p, o in partitions.items()}
            for topic, partitions in json.loads(line).items()}


def first_logged_file(text: str) -> str | None:
    """The local path of the first file an entry of the file source log lists, read
    without parsing the rest (a compacted entry may list a million files)."""
    lines = io.StringIO(text)
    next(lines, None)  # the version
    for line in lines:
        if line.strip():
            return local_file(json.loads(line)["path"])
    return None


@dataclass(frozen=True)
class LogTrim:
    """What trimming the file source log's newest compacted entry did, or would do."""

    #: The entry's file name; ``None`` when the log has no compacted entry yet.
    entry: str | None
    dropped: int
    kept: int
    bytes_before: int
    bytes_after: int


def trim_source_log(
    spark_checkpoint: Path, forget: Callable[[str], bool], *, write: bool = True
) -> LogTrim:
    """Drop the files ``forget`` names, of those committed batches read, from the file
    source log's newest compacted entry, so that runs stop reading them back.

    Spark's file source never forgets a file it read (dropping aged entries, SPARK-17604,
    was never merged): every run reads the newest compacted entry, which lists every file
    ever read, and every tenth batch writes it anew; at 10^6 files that is 115 MB and about
    12 s a run (docs/performance.md). Only that entry is rewritten: Spark reads it and the
    entries after it, and its next compaction starts from it. Files of a batch not yet
    committed stay (its replay reads them again), and one line always stays, so that the
    log still names the folder read (:func:`first_logged_file`). The new entry is renamed
    over the old one, Hadoop's checksum of it removed first. The caller makes sure that no
    stream runs on the checkpoint.
    """
    compacts = [path for _, compact, path in _source_log_entries(spark_checkpoint) if compact]
    if not compacts:
        return LogTrim(None, 0, 0, 0, 0)
    path, last = compacts[-1], committed_source_offset(spark_checkpoint)
    text = path.read_text()
    version, _, body = text.partition("\n")
    lines = [line for line in body.split("\n") if line.strip()]
    keep = [line for line, entry in zip(lines, _source_log_json(text), strict=True)
            if int(entry.get("batchId", 0)) > last or not forget(local_file(entry["path"]))]
    keep = keep or lines[-1:]
    trimmed = version + "".join(f"\n{line}" for line in keep)
    size = len(text.encode())
    if len(keep) == len(lines):
        return LogTrim(path.name, 0, len(keep), size, size)
    if write:
        path.with_name(f".{path.name}.crc").unlink(missing_ok=True)
        temporary = path.with_name(f".{path.name}.trimmed")
        with open(temporary, "w", encoding="utf-8") as out:
            out.write(trimmed)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    return LogTrim(path.name, len(lines) - len(keep), len(keep), size, len(trimmed.encode()))


def note_archive_target(checkpoint: Path, target: Path) -> None:
    """Note in the checkpoint that read files of its landing folder were moved to
    ``target``, so that its source log may forget them (:func:`forget_archived_files`)."""
    note = checkpoint / ARCHIVE_NOTE
    targets = json.loads(note.read_text())["targets"] if note.exists() else []
    if str(target) not in targets:
        temporary = note.with_name(f".{ARCHIVE_NOTE}.new")
        temporary.write_text(json.dumps({"targets": [*targets, str(target)]}))
        os.replace(temporary, note)


def request_forget(checkpoint: Path) -> None:
    """Ask the stream running on ``checkpoint`` to forget the files archived
    (:data:`FORGET_REQUEST`), which the archive could not do beside it."""
    (checkpoint / FORGET_REQUEST).touch()


def forget_requested(checkpoint: Path) -> bool:
    """Whether an archive asked the stream on ``checkpoint`` to forget what it archived."""
    return (checkpoint / FORGET_REQUEST).exists()


def forget_archived_files(checkpoint: Path, landing: Path, *, write: bool = True) -> LogTrim:
    """Drop from the checkpoint's file source log the files ``sessionlake archive`` moved
    out of ``landing`` (:func:`trim_source_log`); the archive does it while no stream runs,
    and a run at its start, holding the locks, for what a running stream kept it from.

    A file is forgotten when a committed batch read it, it is gone from the landing folder
    and it is, under the same path, in a folder the archive noted (:data:`ARCHIVE_NOTE`). A
    file merely missing (a folder not mounted, say) is not, or it would be read again as
    new when it came back. Writing answers an archive's request (:func:`request_forget`).
    """
    if write:  # first, so that a trim that fails is not asked for again and again
        (checkpoint / FORGET_REQUEST).unlink(missing_ok=True)
    note = checkpoint / ARCHIVE_NOTE
    targets = [Path(t) for t in json.loads(note.read_text())["targets"]] if note.exists() else []
    if not targets:
        return LogTrim(None, 0, 0, 0, 0)
    prefix = f"{os.path.abspath(landing)}{os.sep}"

    def archived(path: str) -> bool:
        return path.startswith(prefix) and not os.path.lexists(path) and any(
            os.path.isfile(target / path[len(prefix):]) for target in targets)

    return trim_source_log(checkpoint / SPARK_CHECKPOINT, archived, write=write)


def local_file(uri: str) -> str:
    """The local path of a ``file:`` URI as Hadoop writes it (``file:/p`` or
    ``file:///p``, special characters %-escaped); the path part of any other URI."""
    if uri.startswith("file:///"):
        path = uri[len("file://"):]
    elif uri.startswith("file:/") and not uri.startswith("file://"):
        path = uri[len("file:"):]
    else:
        return unquote(urlsplit(uri).path)
    return unquote(path) if "%" in path else path


class SourceLogUnreadable(ConfigError):
    """An entry of the checkpoint's file source log is not what Spark writes."""

    def __init__(self, entry: str, error: Exception) -> None:
        super().__init__(
            f"the checkpoint's file source log entry {entry} cannot be read ({error!r}): "
            "restore a snapshot (`sessionlake restore --snapshot ID`), which brings the "
            "checkpoint back as it was")
        self.entry = entry


def recorded_source_file(spark: SparkSession | None, checkpoint: str) -> str | None:
    """The path of a file the stream's checkpoint says Spark's file source read, if any.

    Spark keeps each file it read by its absolute path in ``<checkpoint>/spark/sources/0``
    (a version line, then one JSON object per file). The newest batch's own entry is read
    first: a compacted entry (``N.compact``) lists every file the stream ever read.

    :raises SourceLogUnreadable: naming the entry, and the way back (Spark would fail on
        it too, after the run had started).
    """
    folder = f"{checkpoint.rstrip('/')}/{SOURCE_LOG}"
    entries = [(bool(m.group(2)), -int(m.group(1)), name)
               for name in list_names(spark, folder)
               if (m := SOURCE_LOG_ENTRY.match(name))]
    for _, _, name in sorted(entries):
        text = read_text(spark, f"{folder}/{name}") or ""
        if text.startswith(KAFKA_SOURCE_LOG_START):
            return None  # a Kafka stream's: it read no file
        try:
            path = first_logged_file(text)
        except (ValueError, KeyError, TypeError) as error:
            raise SourceLogUnreadable(f"{folder}/{name}", error) from None
        if path is not None:
            return path
    return None

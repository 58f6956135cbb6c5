"""Moving the files a stream has read out of its landing folder.

Every run lists the whole landing folder, so files read and left there cost each run more
as they pile up (20,000 of them about 1.5 s a run, docs/performance.md). A file may leave
once no restore can make the stream read it again: when the checkpoint's committed batches
have read it, and so had every snapshot's copy of the checkpoint (a restore resumes from
the snapshot's point, reading what landed after it). Moving such a file changes no result:
Spark's file source never reads a file twice, and backfills read the lake's ``events``.

No lock is needed beside a running stream, a snapshot or a restore: what the checkpoint
and every snapshot have read only grows, and a restore returns to a snapshot, which had
read every file moved.

Then, while no stream runs (it takes the locks a run holds), the checkpoint's file source
log forgets the files archived, which Spark would otherwise read back at every run for
good (:func:`forget_archived`); when a stream runs, it does so itself: between two
batches if it runs continuously, else at its next start.
"""

from __future__ import annotations

import filecmp
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from sessionlake.checkpoint import (
    ARCHIVE_HINT_FILES,
    RESTORING_MARKER,
    SPARK_CHECKPOINT,
    LogTrim,
    UnreadInput,
    files_read_as_listed,
    forget_archived_files,
    modified_since_listed,
    note_archive_target,
    request_forget,
)
from sessionlake.config import ActionableError, Settings
from sessionlake.locks import StreamAlreadyRunning, stream_locks
from sessionlake.registry import checkpoint_key, lake_stream_sources
from sessionlake.snapshots import CHECKPOINT_COPY, list_snapshots, snapshots_root
from sessionlake.sources import KAFKA_SCHEME
from sessionlake.storage import file_in_the_way, is_glob, local_path, within

log = logging.getLogger(__name__)

#: How many changed files an archive's summary names.
CHANGED_NAMED = 5


def warn_of_read_files_left(
    unread: UnreadInput | None, source: str, at_least: int = ARCHIVE_HINT_FILES
) -> None:
    """Say, from ``at_least`` on, how many files the stream has read are still in its
    landing folder, and what moves them out."""
    if unread is not None and unread.read_left >= at_least:
        log.warning("%s files the stream has read are still in the landing folder %s, and "
                    "every run lists them again (20,000 cost a run about 1.5 s): `sessionlake "
                    "archive --to DIR` or the sessionlake_archive DAG moves them out",
                    unread.read_left, source)


class ArchiveError(ActionableError, ValueError):
    """The files cannot be archived as asked; the message says why. Nothing was moved."""


class ArchiveTargetError(ArchiveError):
    """The folder to archive to is not one files may move to."""


@dataclass(frozen=True)
class ArchiveReport:
    """What an archive run moved, what it left for the snapshots, and what the checkpoint's
    source log forgot."""

    target: str
    moved: int
    moved_bytes: int
    #: Files the stream has read but a snapshot had not: a restore to it reads them again.
    kept_for_snapshots: int
    dry_run: bool = False
    #: What the checkpoint's source log forgot of the files archived (:func:`forget_archived`).
    log_trim: LogTrim | None = None
    #: Why the source log was left as it was, when it was.
    log_trim_skipped: str | None = None
    #: Files moved (below the landing folder) that changed after the stream read them:
    #: what was added to them later was never read.
    changed_after_read: tuple[str, ...] = ()
    #: Read files left where they are: a symbolic link leads them out of the landing
    #: folder, and a move would take the file of the folder the link leads to.
    leading_out: tuple[str, ...] = ()

    def summary(self) -> str:
        """One line for the command line and task logs."""
        verb = "would move" if self.dry_run else "moved"
        kept = (f"; {self.kept_for_snapshots} read file(s) kept in the landing folder: a "
                "snapshot had not read them, and a restore to it reads them again"
                if self.kept_for_snapshots else "")
        out = (f"; {len(self.leading_out)} read file(s) left, a symbolic link leads them out "
               f"of the landing folder: {', '.join(self.leading_out[:CHANGED_NAMED])}"
               if self.leading_out else "")
        return (f"{verb} {self.moved} file(s), {self.moved_bytes} bytes, to "
                f"{self.target}{kept}{out}{self._changed_summary()}{self._trim_summary()}")

    def _changed_summary(self) -> str:
        changed = self.changed_after_read
        if not changed:
            return ""
        more = f" and {len(changed) - CHANGED_NAMED} more" if len(changed) > CHANGED_NAMED else ""
        return (f"; {len(changed)} of them changed after the stream read them, and what was "
                f"added later was never read: {', '.join(changed[:CHANGED_NAMED])}{more}")

    def _trim_summary(self) -> str:
        if self.log_trim_skipped:
            return (f"; the checkpoint's source log still lists the archived files "
                    f"({self.log_trim_skipped}): a continuous stream forgets them between "
                    "two batches, any stream at its next start, or the next archive while "
                    "none runs")
        trim = self.log_trim
        if trim is None or not trim.dropped:
            return ""
        verb = "would forget" if self.dry_run else "forgot"
        return (f"; the checkpoint's source log {verb} {trim.dropped} archived file(s) "
                f"({trim.entry}: {trim.bytes_before} -> {trim.bytes_after} bytes)")


def read_by_every_restore_point(
    checkpoint: Path, lake: str
) -> tuple[dict[str, int | None], set[str]]:
    """The files the checkpoint's committed batches read (with their modification times
    as listed, :func:`~sessionlake.checkpoint.files_read_as_listed`), and of those the ones
    every snapshot of the lake had read too (a snapshot of another checkpoint, or taken
    before any batch, keeps every file in place).

    :raises ArchiveError: a log that cannot be read.
    """
    read = _files_read(checkpoint / SPARK_CHECKPOINT, f"the checkpoint {checkpoint}")
    safe = set(read)
    root = local_path(snapshots_root(lake))
    for snapshot in list_snapshots(lake):
        assert root is not None  # list_snapshots refuses a remote lake without Spark
        copy = root / snapshot.snapshot_id / CHECKPOINT_COPY / SPARK_CHECKPOINT
        safe &= set(_files_read(copy, f"snapshot {snapshot.snapshot_id}")) \
            if snapshot.has_checkpoint else set()
    return read, safe


def _files_read(spark_checkpoint: Path, what: str) -> dict[str, int | None]:
    """:func:`files_read_as_listed`, or the refusal when the logs cannot be read."""
    try:
        return files_read_as_listed(spark_checkpoint)
    except (OSError, ValueError, KeyError, IndexError) as error:
        raise ArchiveError(f"cannot tell which files {what} has read ({error}); nothing "
                           "moved: `sessionlake doctor` checks a checkpoint") from None


def archive_read_files(settings: Settings, target: str, *, dry_run: bool = False) -> ArchiveReport:
    """Move the landing folder's files that no restore can make the stream read again to
    ``target``, each to the same path below it as below the landing folder.

    Checked before anything moves: a local landing folder (not Kafka, not a glob), a local
    lake and checkpoint, and a target outside the landing folder (files there would be
    read again as new). A file whose copy is already in ``target`` with the same size (a
    move cut off between the copy and the delete) is removed from the landing folder;
    one with a different file of its name there is left, with a warning. Running it again
    after an interruption moves the rest.

    :raises ArchiveError: naming what is wrong; nothing moved.
    """
    landing, checkpoint, destination = check_archive_request(settings, target)
    read, safe = read_by_every_restore_point(checkpoint, settings.lake)
    prefix = f"{landing}{os.sep}"
    listed = sorted(p for p in safe if p.startswith(prefix) and os.path.isfile(p))
    # Spark reads through symbolic links: a file read as landing/x/f may be one of
    # anywhere (x -> the lake's _delta_log); only what truly lies in the folder moves.
    inside = {p: within(p, str(landing)) for p in listed}
    moving = [p for p in listed if inside[p]]
    leading_out = tuple(str(Path(p).relative_to(landing)) for p in listed if not inside[p])
    kept = sum(1 for p in read.keys() - safe if p.startswith(prefix) and os.path.isfile(p))
    moved = moved_bytes = 0
    changed = []
    for path in moving:
        source = Path(path)
        try:
            stat = source.stat()
            if not dry_run and not _move(source, destination / source.relative_to(landing)):
                continue
        except FileNotFoundError:
            continue  # taken away meanwhile (by another archive run, say)
        moved += 1
        moved_bytes += stat.st_size
        if modified_since_listed(stat.st_mtime_ns, read[path]):
            changed.append(str(source.relative_to(landing)))
    if changed:
        log.warning("%s archived file(s) changed after the stream read them; what was added "
                    "later was never read: %s", len(changed), ", ".join(changed[:CHANGED_NAMED]))
    trim, skipped = forget_archived(settings, landing, checkpoint, destination, dry_run)
    return ArchiveReport(str(destination), moved, moved_bytes, kept, dry_run, trim, skipped,
                         tuple(changed), leading_out)


def forget_archived(
    settings: Settings, landing: Path, checkpoint: Path, destination: Path, dry_run: bool
) -> tuple[LogTrim | None, str | None]:
    """Note ``destination`` in the checkpoint, and drop the files archived there from its
    file source log (:func:`sessionlake.checkpoint.forget_archived_files`) while holding
    the locks a run holds; the trim and ``None``, or ``None`` and why not (a running stream
    is asked to forget them itself). The snapshots' copies of the checkpoint keep their
    whole logs.
    """
    try:
        if dry_run:  # what earlier archives left listed
            return forget_archived_files(checkpoint, landing, write=False), None
        if (checkpoint / RESTORING_MARKER).exists():
            return None, "a restore of the checkpoint did not finish"
        note_archive_target(checkpoint, destination)
        with stream_locks(settings.lake, settings.checkpoint):
            return forget_archived_files(checkpoint, landing), None
    except StreamAlreadyRunning:
        request_forget(checkpoint)
        return None, "a stream is running"
    except (OSError, ValueError, KeyError, IndexError) as error:
        log.warning("the checkpoint's source log was not trimmed: %s", error)
        return None, f"it could not be trimmed: {error}"


def check_archive_request(settings: Settings, target: str) -> tuple[Path, Path, Path]:
    """The landing folder, checkpoint and target as local absolute paths (the lake must be
    local too), or the refusal: checked before any file moves, and by the archive DAG
    before its task starts.

    :raises ArchiveTargetError: the target is not local, or lies inside the landing folder
        or the lake.
    :raises ArchiveError: the stream or its folders do not allow archiving.
    """
    if settings.reads_kafka:
        raise ArchiveError("a Kafka stream has no landing folder to archive")
    source = settings.source or ""
    if not source:
        raise ArchiveError("no landing folder: pass --source DIR or set SESSIONLAKE_SOURCE")
    if is_glob(source):
        raise ArchiveError(f"--source {source} is a glob: name the landing folder itself")
    if not target.strip():
        raise ArchiveTargetError("the target is empty: name the folder to move the files to")
    places = {"landing folder": source, "checkpoint": settings.checkpoint,
              "lake": settings.lake, "target": target}
    local = {name: local_path(place) for name, place in places.items()}
    for name, path in local.items():
        if path is None:
            error = ArchiveTargetError if name == "target" else ArchiveError
            raise error(f"the {name} {places[name]} is not on this machine: archiving "
                        "moves local files only")
    landing, checkpoint, destination = (
        Path(os.path.abspath(str(local[n]))) for n in ("landing folder", "checkpoint", "target"))
    if not landing.is_dir():
        raise ArchiveError(f"the landing folder {source} does not exist")
    if within(str(destination), str(landing)):
        raise ArchiveTargetError(f"the target {target} is inside the landing folder {source}: "
                                 "its files would be read again as new; pick a folder "
                                 "outside it")
    if within(str(destination), os.path.abspath(str(local["lake"]))):
        raise ArchiveTargetError(f"the target {target} is inside the lake {settings.lake}, "
                                 "whose folders are its tables' and checkpoints'; pick a "
                                 "folder outside it")
    # A file, or a file on its path: the move failed with a stack trace (a review).
    if (blocking := file_in_the_way(destination)) is not None:
        raise ArchiveTargetError(f"the target {target} is not a folder ({blocking} is a "
                                 "file): pick a folder, or one to be made")
    if not checkpoint.is_dir():
        raise ArchiveError(f"no stream's checkpoint at {settings.checkpoint}: no file of the "
                           "landing folder was read (check --lake and --checkpoint)")
    read = lake_stream_sources(None, settings.lake).get(checkpoint_key(str(checkpoint)))
    noted = local_path(read) if read and not read.startswith(KAFKA_SCHEME) else None
    # Only a folder noted whole: a relative one was relative to that run's working folder.
    if noted is not None and noted.is_absolute() and not is_glob(read or "") and \
            os.path.realpath(noted) != os.path.realpath(landing):
        # Nothing of it was read: the archive moved nothing, without a word (a review).
        raise ArchiveError(f"the stream on {settings.checkpoint} reads {read}, not {source}: "
                           "give its landing folder (--source, SESSIONLAKE_SOURCE)")
    return landing, checkpoint, destination


def _move(source: Path, destination: Path) -> bool:
    """Move one file, keeping its modification time; ``False`` when another file of its
    name is already there."""
    if destination.exists():
        if not filecmp.cmp(source, destination, shallow=False):
            log.warning("not archived: %s, another file of its name is in %s", source,
                        destination.parent)
            return False
        source.unlink()  # the copy of a move cut off before its delete (byte for byte)
        return True
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(source, destination)
    return True

"""Erasing users: deleting their rows from every table and purging them from the files.

Users are found by the SHA-256 of their id (:func:`users_hashed`), a literal in a
DataFrame filter, never SQL text: an id such as ``x' OR '1'='1`` matches the user of that
exact id and nobody else, and the condition Delta keeps in each table's history holds no
id.

A Delta DELETE on a table with deletion vectors does not rewrite the data files: it marks
rows as deleted, and the files, still part of the current version, keep the rows. An
erasure therefore rewrites the files that hold deleted rows (``REORG ... APPLY (PURGE)``);
the old files are then no longer part of the table and a VACUUM removes them for good.

The retention audit keeps erased ids only as SHA-256 hashes; that is enough to apply an
erasure again after a restore returned the tables to a version from before it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import IO, Any

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionlake import faults, storage
from sessionlake.agelimits import cutoff_conditions
from sessionlake.checkpoint import lake_lock_folder
from sessionlake.conflicts import retry_on_conflict
from sessionlake.deltareader import read_rows, read_state
from sessionlake.spark import SparkOnDemand
from sessionlake.tables import (
    QUARANTINE,
    RETENTION_AUDIT,
    STREAM_TABLES,
    USER_TABLES,
    append,
    commit_metrics_since,
    each_table,
    literal_row,
    path_identifier,
    read_table,
    session_tagged,
    table_commit_actions,
    table_exists,
    table_path,
    table_version,
)

log = logging.getLogger("sessionlake.erasure")


def user_hash(user_id: str) -> str:
    """The SHA-256 (hex) of a user id, as Spark's ``sha2(user_id, 256)`` computes it."""
    return hashlib.sha256(user_id.encode("utf-8")).hexdigest()


#: A user id's SHA-256, as :func:`user_hash` writes it: 64 lowercase hex digits.
USER_HASH = re.compile(r"^[0-9a-f]{64}$")


def users_hashed(hashes: Iterable[str]) -> Column:
    """Rows whose user id has one of these SHA-256 hashes."""
    return F.sha2(F.col("user_id"), 256).isin([F.lit(h) for h in hashes])


#: A JSON string literal in a record's text: its content, escapes as written.
_JSON_STRING = r'"((?:[^"\\]|\\.)*)"'
#: Quotes, brackets and separators around a word of a record's text.
_AROUND_WORD = r'^["\[\](){},;:]+|["\[\](){},;:]+$'


def words_of(text: Column) -> Column:
    """The words a record's raw text may name a user by: its JSON string values (where
    a record that was quarantined keeps an id under another key, or in a line that did not
    parse) and its whitespace-separated words, quotes and brackets around them taken off
    (an Apache log line's fields)."""
    strings = F.regexp_extract_all(text, F.lit(_JSON_STRING), F.lit(1))
    words = F.transform(F.split(text, r"\s+"),
                        lambda word: F.regexp_replace(word, _AROUND_WORD, ""))
    return F.array_union(strings, words)


def users_named(table: str, hashes: Sequence[str]) -> Column:
    """The rows of ``table`` that hold one of these users (by the SHA-256 of their id): its
    ``user_id``, and in ``quarantine`` also a word of the raw text (:func:`words_of`), since
    a record quarantined before its user was read names the user only there. Each word is
    hashed, so the condition Delta keeps in the table's history holds no id either."""
    named = users_hashed(hashes)
    if table != QUARANTINE:
        return named
    listed = [F.lit(h) for h in hashes]
    in_text = F.exists(words_of(F.col("raw")), lambda word: F.sha2(word, 256).isin(listed))
    return named | F.coalesce(in_text, F.lit(False))


def delete_rows(spark: SparkSession, lake: str, table: str, condition: Column,
                tag: str | None = None) -> int:
    """DELETE the rows of ``table`` matching ``condition``; how many rows it deleted.

    Retried when it loses a commit race with the stream or another maintenance job. The
    count is of this DELETE's own commit, told by its tag (``userMetadata``, on a private
    session: :func:`~sessionlake.tables.session_tagged`; one of its own unless ``tag``
    is given): an age limit and an erasure run side by side each counted the other's
    deletes too (the concurrency review).
    """
    tag = tag or f"sessionlake delete {uuid.uuid4().hex}"
    target = DeltaTable.forPath(session_tagged(spark, tag), table_path(lake, table))
    before = table_version(spark, lake, table)
    retry_on_conflict(lambda: target.delete(condition), f"DELETE from {table}")
    return sum(m.get("numDeletedRows", 0)
               for m in commit_metrics_since(spark, lake, table, before, "DELETE", tag))


def purge_deleted_rows(spark: SparkSession, lake: str, table: str) -> None:
    """Rewrite the files of ``table`` that still hold rows marked as deleted.

    After this the deleted rows are only in files that the current version no longer uses,
    which a VACUUM can then remove.
    """
    name = path_identifier(table_path(lake, table))
    retry_on_conflict(lambda: spark.sql(f"REORG TABLE {name} APPLY (PURGE)"),
                      f"REORG {table}")


def erase(spark: SparkSession, lake: str, hashes: Sequence[str]) -> dict[str, int]:
    """Delete the rows of these users (by the SHA-256 of their id, :func:`users_named`) from
    every table that holds user data, and purge them.

    The tables are independent, so they are erased side by side.

    :return: rows deleted per table.
    """
    def erase_from(table: str) -> int:
        deleted = delete_rows(spark, lake, table, users_named(table, hashes))
        faults.point("erase")
        if deleted:
            purge_deleted_rows(spark, lake, table)
        return deleted

    return each_table(erase_from, USER_TABLES)


@dataclass(frozen=True)
class ErasureRun:
    """A retention run that erased users: when it started, and whom (SHA-256 each)."""

    started_ms: int
    hashes: tuple[str, ...]


#: The erasure runs of each lake's audit as last read, by the audit's version: a stream
#: asks at every batch, and the audit changes once a retention run.
_ERASURES_READ: dict[str, tuple[int, list[ErasureRun]]] = {}


#: Beside the lake's locks (``<lake>/_checkpoints/``): a file per erasure that has let go
#: of the batch locks but not yet written its audit row (:func:`note_erasure`).
ERASURES_UNDER_WAY = "erasures-under-way"

#: The ``flock`` of each erasure this process runs, by run id: held from its note's writing
#: to its audit row or its cut-off mark, so that the kernel tells a run killed outright
#: (SIGKILL: Airflow stopping a spark-submitted task, the OOM killer) from one still under
#: way (:func:`mark_killed_erasures`). Local lakes only.
_ALIVE: dict[str, IO[str]] = {}


def erasure_ms(started: datetime) -> int:
    """An erasure's start as :class:`ErasureRun` keeps it, in ms since the epoch (UTC)."""
    return int(_utc(started).timestamp() * 1000)


def _under_way(lake: str) -> str:
    return f"{lake_lock_folder(lake)}/{ERASURES_UNDER_WAY}"


def _alive_file(lake: str, run_id: str) -> Path | None:
    """The file whose ``flock`` erasure ``run_id`` holds while it runs (local lakes)."""
    folder = storage.local_path(_under_way(lake))
    return None if folder is None else folder / f"{run_id}.lock"


def _hold_alive(lake: str, run_id: str) -> None:
    """Take erasure ``run_id``'s lock for this process, until :func:`_let_go`."""
    path = _alive_file(lake, run_id)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")  # noqa: SIM115 - held until the run lets go of it
        fcntl.flock(handle, fcntl.LOCK_EX)
        _ALIVE[run_id] = handle


def _let_go(lake: str, run_id: str) -> None:
    """Remove erasure ``run_id``'s lock, and let go of it if this process holds it: the
    run has ended, or its note is marked (nothing is left to tell by it)."""
    path = _alive_file(lake, run_id)
    if path is not None:
        path.unlink(missing_ok=True)
    handle = _ALIVE.pop(run_id, None)
    if handle is not None:
        handle.close()


def note_erasure(spark: SparkSession | None, lake: str, run_id: str, started: datetime,
                 hashes: Sequence[str], versions: Mapping[str, int] | None = None) -> None:
    """Note an erasure under way, for the batches that run between its deletes and its
    audit row (its age limits and VACUUM come in between): read from the audit alone, they
    would take the erased users' waiting records in. The tables'
    ``versions`` before its deletes tell, should it be cut off or killed, what it deleted
    (:func:`erased_since`). This process holds the note's lock until the run ends."""
    _hold_alive(lake, run_id)
    try:
        storage.write_text(spark, f"{_under_way(lake)}/{run_id}.json", json.dumps(
            {"started_ms": erasure_ms(started), "hashes": list(hashes),
             "versions": dict(versions or {})}))
    except BaseException:
        _let_go(lake, run_id)
        raise


def note_deleted(spark: SparkSession | None, lake: str, run_id: str,
                 deleted: Mapping[str, int]) -> None:
    """Note in erasure ``run_id``'s note the rows its deletes ``deleted``, as they end,
    while it still holds the batch locks: killed later (in its VACUUM, which other
    erasures and restores may run beside), it is counted from this, not from the commits,
    where theirs would follow its own (:func:`mark_killed_erasures`)."""
    _rewrite_note(spark, lake, run_id, {"deleted": dict(deleted)})


def _rewrite_note(spark: SparkSession | None, lake: str, run_id: str,
                  fields: Mapping[str, Any]) -> None:
    """Add ``fields`` to erasure ``run_id``'s note; a note already gone stays gone."""
    note = f"{_under_way(lake)}/{run_id}.json"
    if text := storage.read_text(spark, note):
        storage.write_text(spark, note, json.dumps({**json.loads(text), **fields}))


#: A SHA-256 in a DELETE's condition as Delta keeps it in the commit.
_HASH_IN_CONDITION = re.compile(r"\b[0-9a-f]{64}\b")


def erased_since(spark: SparkSession | None, lake: str, hashes: Sequence[str],
                 versions: Mapping[str, int]) -> dict[str, int] | None:
    """The rows that erasures of these users (DELETEs whose condition names some of these
    hashes and no other) deleted from each table after its version in ``versions``, read
    from the tables' commits: what a run cut off within its deletes did (under the batch
    locks, which keep other erasures and restores out, so the DELETEs are its own).
    ``None`` when a commit in between is gone (Delta's log clean-up): unknown."""
    wanted, found = set(hashes), {}
    for table, before in versions.items():
        rows = 0
        for version in range(before + 1, table_version(spark, lake, table) + 1):
            actions = table_commit_actions(spark, lake, table, version)
            if not actions:
                return None
            for action in actions:
                info = action.get("commitInfo") or {}
                if info.get("operation") != "DELETE":
                    continue
                named = set(_HASH_IN_CONDITION.findall(
                    str((info.get("operationParameters") or {}).get("predicate", ""))))
                if named and named <= wanted:
                    rows += int((info.get("operationMetrics") or {}).get("numDeletedRows", 0))
        if rows:
            found[table] = rows
    return found


def note_cut_off(spark: SparkSession | None, lake: str, run_id: str,
                 deleted: Mapping[str, int]) -> None:
    """Mark the note of erasure ``run_id`` (:func:`note_erasure`) as cut off (Ctrl-C, a
    failure) after it ``deleted`` these rows, and before its audit row: it stays, keeping
    the users' waiting records out, until a run that erases them again finishes it and
    counts these deletes (:func:`cut_off_erasures`)."""
    _rewrite_note(spark, lake, run_id, {"cut_off": dict(deleted)})
    _let_go(lake, run_id)


def erasure_cut_off(spark: SparkSession | None, lake: str, run_id: str,
                    deleted: Mapping[str, int] | None) -> None:
    """Erasure ``run_id`` was cut off (Ctrl-C, a failure, killed) before its audit row,
    after it ``deleted`` these rows: its note is marked with them (:func:`note_cut_off`),
    or goes when it deleted nothing; when that is not known (``None``: its commits gone),
    it stays as it is, keeping the users out until an erasure of them drops it. This
    process lets go of the run's lock whatever happens."""
    try:
        if deleted:
            note_cut_off(spark, lake, run_id, deleted)
        elif deleted is not None:
            erasure_noted(spark, lake, run_id)
    finally:
        _let_go(lake, run_id)


@dataclass(frozen=True)
class NotedErasure:
    """An erasure under way as its note tells it (:func:`note_erasure`). ``cut_off``: the
    rows it had deleted, by table, when it was marked cut off (:func:`note_cut_off`);
    empty while it runs. ``deleted``: what its deletes did, once they ended
    (:func:`note_deleted`)."""

    run_id: str
    started_ms: int
    hashes: tuple[str, ...]
    cut_off: Mapping[str, int]
    versions: Mapping[str, int]
    deleted: Mapping[str, int] | None


def erasures_under_way(spark: SparkSession | None, lake: str) -> list[NotedErasure]:
    """The erasures noted under way, by run id; a note that cannot be read is said in the
    log and passed over, and a writer's temporary file (``.<name>.tmp``) is not one."""
    folder, noted_runs = _under_way(lake), []
    for name in storage.list_names(spark, folder):
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            noted = json.loads(storage.read_text(spark, f"{folder}/{name}") or "{}")
            noted_runs.append(NotedErasure(
                name.removesuffix(".json"), int(noted["started_ms"]),
                tuple(str(h) for h in noted["hashes"]),
                {str(t): int(n) for t, n in (noted.get("cut_off") or {}).items()},
                {str(t): int(v) for t, v in (noted.get("versions") or {}).items()},
                None if noted.get("deleted") is None else
                {str(t): int(n) for t, n in noted["deleted"].items()}))
        except (ValueError, KeyError, TypeError, AttributeError):
            log.warning("unreadable note of an erasure under way: %s", name)
    return noted_runs


def cut_off_erasures(spark: SparkSession | None, lake: str, hashes: Sequence[str]
                     ) -> tuple[list[str], dict[str, int]]:
    """The erasure runs marked cut off after some of their deletes (:func:`note_cut_off`)
    that erased none but these users, and the rows they deleted, by table: the run that
    erases the users again finishes theirs, and its audit row counts those deletes too
    (a run killed outright is marked by :func:`mark_killed_erasures`)."""
    runs = [run for run in erasures_under_way(spark, lake)
            if run.cut_off and set(run.hashes) <= set(hashes)]
    deleted: dict[str, int] = {}
    for run in runs:
        for table, count in run.cut_off.items():
            deleted[table] = deleted.get(table, 0) + count
    return sorted(run.run_id for run in runs), deleted


def cut_off_with_others(spark: SparkSession | None, lake: str, hashes: Sequence[str]
                        ) -> list[tuple[str, int]]:
    """The erasure runs marked cut off after some of their deletes that erased some of
    these users together with others, and how many others: an erasure of these users
    does not finish them (their deletes are counted by table, not by user); one of all
    their users does (:func:`cut_off_erasures`)."""
    wanted = set(hashes)
    return sorted((run.run_id, len(set(run.hashes) - wanted))
                  for run in erasures_under_way(spark, lake)
                  if run.cut_off and wanted & set(run.hashes) and not set(run.hashes) <= wanted)


def erasure_noted(spark: SparkSession | None, lake: str, run_id: str,
                  hashes: Sequence[str] = (), finished: Sequence[str] = ()) -> None:
    """The erasure ``run_id`` wrote its audit row, or was cut off before its deletes: its
    note goes (:func:`note_erasure`), and so do those of the cut-off runs it ``finished``
    (its audit row counts their deletes), and of runs of none but these ``hashes`` that
    no lock tells alive or dead (a lake not on local disks, a note from before the locks):
    this run's audit row keeps their users out now. A run that may still write its own
    audit row, or whose deletes are still to be counted (marked cut off since, or killed
    and not yet marked), keeps its note."""
    dropped = [run.run_id for run in erasures_under_way(spark, lake)
               if run.run_id != run_id and (run.run_id in finished or (
                   set(run.hashes) <= set(hashes) and not run.cut_off
                   and not _has_lock(lake, run.run_id)))]
    for noted in [*dropped, run_id]:
        storage.delete(spark, f"{_under_way(lake)}/{noted}.json")
        _let_go(lake, noted)


def _has_lock(lake: str, run_id: str) -> bool:
    """Whether erasure ``run_id`` has a lock that tells whether it still runs."""
    path = _alive_file(lake, run_id)
    return path is not None and path.exists()


@contextmanager
def _dead(lake: str, run_id: str) -> Iterator[bool]:
    """Whether erasure ``run_id`` died before its audit row: its lock is there, and free.
    The lock stays taken through the block (a live run that let go of it meanwhile has
    unlinked it: the file is another, and the run not dead), then goes. False on a lake
    not on local disks, or for a note written without a lock."""
    path = _alive_file(lake, run_id)
    try:
        handle = None if path is None else os.open(path, os.O_RDONLY)
    except OSError:  # gone (the run ended), or not ours to open: not known dead
        handle = None
    if handle is None:
        yield False
        return
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # held (the run is alive), or no flock here
            yield False
            return
        assert path is not None
        try:
            same = os.stat(path).st_ino == os.fstat(handle).st_ino
        except FileNotFoundError:
            same = False
        yield same
        if same:
            path.unlink(missing_ok=True)
    finally:
        os.close(handle)


def mark_killed_erasures(spark: SparkSession | None, lake: str) -> None:
    """Mark the notes of erasures killed outright (nothing ran in them to mark them,
    :func:`note_cut_off`) with the rows they deleted, so that the run that finishes them
    counts those deletes (:func:`cut_off_erasures`); the note of one killed before any
    delete goes (it erased nothing).

    A run killed after its deletes noted them (:func:`note_deleted`). One killed within
    them is read back from the tables' commits (:func:`erased_since`): this is called
    under the batch locks by whatever may delete these users' rows next (an erasure, a
    restore), and so before it, and the DELETEs since the note's versions (taken under the
    batch locks) that name none but its users are the killed run's own. When those
    commits are gone, the note stays unmarked (it keeps the users out, and goes with the
    audit row of an erasure of them). Nothing to do on a lake not on local disks, where no
    lock tells a killed run from a live one.
    """
    if storage.local_path(_under_way(lake)) is None:
        return
    audited: set[str] | None = None
    for run in erasures_under_way(spark, lake):
        if run.cut_off:
            continue
        with _dead(lake, run.run_id) as dead:
            if not dead:
                continue
            if audited is None:
                audited = {str(row[0]) for row in _audit_rows(spark, lake, ["run_id"])}
            if run.run_id in audited:  # killed after its audit row, which counts it
                erasure_noted(spark, lake, run.run_id)
                continue
            deleted = (dict(run.deleted) if run.deleted is not None
                       else erased_since(spark, lake, run.hashes, run.versions))
            if deleted is None:
                log.warning("erasure run %s was killed within its deletes, and the commits "
                            "that tell what it deleted are gone: its deletes are in no "
                            "audit row", run.run_id)
            elif any(deleted.values()):
                log.warning("erasure run %s was killed before its audit row, after "
                            "deleting rows (%s): the next erasure of its users counts them",
                            run.run_id, ", ".join(f"{t} {n}" for t, n in deleted.items()
                                                  if n))
            else:
                log.warning("erasure run %s was killed before any delete", run.run_id)
            erasure_cut_off(spark, lake, run.run_id,
                            None if deleted is None else {t: n for t, n in deleted.items() if n})


def erasure_runs(spark: SparkSession | None, lake: str) -> list[ErasureRun]:
    """The retention audit's runs that erased users, but a restore's re-application of
    them (the run it re-applies is in the audit itself), and the erasures under way
    (:func:`note_erasure`). The audit is read again only when it has a new version."""
    return _audited_erasures(spark, lake) + [
        ErasureRun(run.started_ms, run.hashes) for run in erasures_under_way(spark, lake)]


def _audited_erasures(spark: SparkSession | None, lake: str) -> list[ErasureRun]:
    """The audit's part of :func:`erasure_runs`."""
    log_names = storage.list_names(spark, f"{table_path(lake, RETENTION_AUDIT)}/_delta_log")
    versions = [int(n[:-5]) for n in log_names if n.endswith(".json") and n[:-5].isdigit()]
    if not versions:
        return []
    cached = _ERASURES_READ.get(lake)
    if cached is not None and cached[0] == max(versions):
        return cached[1]
    rows = _audit_rows(spark, lake, ["run_id", "started_at", "erased_user_sha256"])
    runs = sorted((ErasureRun(erasure_ms(started), tuple(hashes))
                   for run_id, started, hashes in rows
                   if hashes and not str(run_id).endswith("-restore")),
                  key=lambda run: run.started_ms)
    _ERASURES_READ[lake] = (max(versions), runs)
    return runs


#: How long after an erasure's start a file may have landed and still be kept out of:
#: times are cut to milliseconds, and a file's comes from its file system's clock (a file
#: server's), not the erasure's. Errs toward keeping an erased user out.
LANDING_MARGIN_MS = 5_000


def _audit_rows(spark: SparkSession | None, lake: str,
                columns: Sequence[str]) -> list[tuple[Any, ...]]:
    """The retention audit's ``columns``, a tuple per run; a local lake's read without
    Spark (:mod:`sessionlake.deltareader`), so that a restore or a batch asks without a
    JVM of its own."""
    if storage.local_path(lake) is not None:
        audit = read_rows(read_state(table_path(lake, RETENTION_AUDIT)), list(columns))
        return list(zip(*(audit[c].to_pylist() for c in columns), strict=True))
    if spark is None:
        raise ValueError(f"{lake} is not a local path: a Spark session is needed to reach it")
    return [tuple(r) for r in read_table(spark, lake, RETENTION_AUDIT).select(
        *columns).collect()]


def erased_after_landing(runs: Sequence[ErasureRun], landed: Mapping[str, int | None]
                         ) -> list[tuple[list[str], list[str]]]:
    """The users each of a batch's files must not bring back: those erased by a run that
    started after the file landed, or up to :data:`LANDING_MARGIN_MS` before (``landed``:
    a file's modification time, in ms, when the stream listed it). A file read after such
    a run holds records the erasure reached, or would have: a replay after a restore reads
    them again, and so does a stream that reads a backlog after an erasure. Files that
    name the same users are grouped, so that the batch's condition has a term per erasure,
    not per file.

    :return: (files, hashes) pairs; empty when no file of the batch landed before an
        erasure, which is every batch of a stream that keeps up.
    """
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, landed_ms in landed.items():
        hashes = tuple(sorted({h for run in runs if landed_ms is None
                               or run.started_ms + LANDING_MARGIN_MS >= landed_ms
                               for h in run.hashes}))
        if hashes:
            groups.setdefault(hashes, []).append(name)
    return [(sorted(files), list(hashes)) for hashes, files in sorted(groups.items())]


@dataclass(frozen=True)
class KeptOut:
    """Records a batch keeps out of the lake: those of the users with these SHA-256
    ``hashes`` among the records ``where`` selects (by ``source_file`` and
    ``source_line``: those that landed before the users' erasure)."""

    where: Column
    hashes: tuple[str, ...]


#: What a batch keeps out of the lake, given the erasure runs (:func:`erasure_runs`): it
#: knows when its records landed (:func:`files_kept_out`, ``sessionlake.kafkastream.
#: kafka_kept_out``).
KeepOut = Callable[[Sequence[ErasureRun]], list[KeptOut]]


def files_kept_out(runs: Sequence[ErasureRun], landed: Mapping[str, int | None]
                   ) -> list[KeptOut]:
    """The records of a batch of files to keep out (:func:`erased_after_landing`)."""
    return [KeptOut(F.col("source_file").isin(files), tuple(hashes))
            for files, hashes in erased_after_landing(runs, landed)]


#: The reason of a record :func:`quarantine_erased` keeps out of the lake.
ERASED_REASON = ("its user was erased after the record landed (retention_audit): not "
                 "taken in, and neither its text nor its user kept")


def quarantine_erased(guarded: DataFrame, erased: Sequence[KeptOut]) -> DataFrame:
    """The batch's guarded records that are ``erased`` turned into quarantine rows
    without their text or user: counted, and traceable to their file and line (or
    partition and offset), but the lake takes nothing of them in. A record that names the
    user only in its text (one that would be quarantined) is found as an erasure finds it
    in ``quarantine`` (:func:`users_named`)."""
    hit = F.lit(False)
    for kept in erased:
        hit = hit | (kept.where
                     & F.coalesce(users_named(QUARANTINE, kept.hashes), F.lit(False)))
    kept_out = {"reason": F.lit(ERASED_REASON), "raw": F.lit(""),
                "raw_truncated": F.lit(False), "user_id": F.lit(None).cast("string")}
    return guarded.withColumn("erased", hit).select(*[
        F.when(F.col("erased"), kept_out[c]).otherwise(F.col(c)).alias(c)
        if c in kept_out else F.col(c) for c in guarded.columns])


@dataclass(frozen=True)
class NotHeld:
    """What retention runs did that a snapshot may not hold (:func:`runs_not_in`): the users
    they erased, and the newest cut-offs of their age limits (``None``: none)."""

    erased: list[str]
    sessions_cutoff: date | None = None
    events_cutoff: date | None = None


def runs_not_in(spark: SparkSession | None, lake: str, taken: datetime,
                versions: Mapping[str, int]) -> NotHeld:
    """What the retention runs that a snapshot, taken at ``taken`` with these table
    ``versions``, may not hold did: runs that finished at or after it was taken, or that
    committed a version of a table after the snapshot's; and the erasures under way
    (:func:`erasures_under_way`: cut off after some of their deletes, or in their VACUUM
    beside the restore), which have no audit row yet and whose deletes it would undo.

    An erasure's ``started_at`` is stamped once it holds the batch locks, and a snapshot
    takes none: one taken while an erasure erased may hold the users, though the run
    "started" before it. Re-applying what the snapshot does hold deletes nothing.
    A local lake's audit is read without Spark (:mod:`sessionlake.deltareader`): a restore
    asks this before it knows whether it needs a JVM at all.
    """
    under_way = {h for run in erasures_under_way(spark, lake) for h in run.hashes}
    if not table_exists(spark, lake, RETENTION_AUDIT):
        return NotHeld(sorted(under_way))
    runs = _audit_rows(spark, lake, ["finished_at", "versions_after", "erased_user_sha256",
                                     "sessions_cutoff", "events_cutoff"])
    taken_utc = _utc(taken)

    def not_held(finished: datetime, after: Any) -> bool:
        committed = dict(after or {})
        return _utc(finished) >= taken_utc or any(
            versions.get(table, -1) < version for table, version in committed.items()
            if table in USER_TABLES)

    since = [run for run in runs if not_held(run[0], run[1])]
    return NotHeld(
        erased=sorted(under_way | {h for run in since for h in run[2] or ()}),
        sessions_cutoff=max((run[3] for run in since if run[3] is not None), default=None),
        events_cutoff=max((run[4] for run in since if run[4] is not None), default=None),
    )


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def reapply_retention(spark: SparkOnDemand, lake: str, taken: datetime,
                      versions: Mapping[str, int], snapshot_id: str) -> dict[str, int]:
    """Erase again every user erased, and delete again by the age limits applied, by the
    retention runs the restored snapshot (taken at ``taken``, with these table
    ``versions``) may not hold (:func:`runs_not_in`): a restore must not bring back what
    they deleted. The caller holds the batch locks (open sessions are among the rows).
    What it did goes into the retention audit, as a run of its own, since the audit is
    the record of every deletion it promised.

    :param spark: started only when there is something to apply again (or the lake is
        not local).
    :return: rows deleted per table (empty when nothing needs applying again).
    """
    since = runs_not_in(None if storage.local_path(lake) else spark(), lake, taken, versions)
    limits = cutoff_conditions(since.sessions_cutoff, since.events_cutoff)
    if not since.erased and not limits:
        return {}
    # Told before: it starts Spark and reads the user tables (half a minute on a small
    # lake), a wait a restore from its logs alone does not have.
    what = [f"{len(since.erased)} erasure(s)"] if since.erased else []
    what += [f"the age limits (sessions before {since.sessions_cutoff}, events before "
             f"{since.events_cutoff})"] if limits else []
    log.warning("re-applying %s the snapshot may not hold (it was taken %s)",
                " and ".join(what), taken.isoformat(timespec="seconds"))
    started = datetime.now(UTC)
    before = {t: table_version(spark(), lake, t) for t in STREAM_TABLES}
    deleted = erase(spark(), lake, since.erased) if since.erased else {}
    if limits:
        aged = each_table(lambda t: delete_rows(spark(), lake, t, limits[t]), limits)
        for table, rows in aged.items():
            deleted[table] = deleted.get(table, 0) + rows
    log.warning("re-applied %s: rows deleted %s", " and ".join(what),
                ", ".join(f"{t} {n}" for t, n in deleted.items() if n) or "none")
    append_audit_row(spark(), lake, {
        "run_id": f"{started.strftime('%Y%m%dT%H%M%SZ')}-restore",
        "started_at": started,
        "erased_user_sha256": since.erased,
        "sessions_cutoff": since.sessions_cutoff,
        "events_cutoff": since.events_cutoff,
        "rows_deleted": deleted,
        "versions_before": before,
        "files_vacuumed": 0,
        "time_travel_purged": False,
        "note": f"re-applied by the restore to snapshot {snapshot_id}: deleted rows stay "
                "readable by time travel until a retention run with VACUUM removes them",
    })
    return deleted


def append_audit_row(spark: SparkSession, lake: str, row: Mapping[str, Any]) -> None:
    """Append one run's row to ``retention_audit``, its last write: ``row`` with when it
    finished, how many users it erased and the tables' versions after it filled in."""
    append(literal_row(spark, {
        **row,
        "finished_at": datetime.now(UTC),
        "erased_users": len(row["erased_user_sha256"]),
        "versions_after": {t: table_version(spark, lake, t) for t in STREAM_TABLES},
    }, read_table(spark, lake, RETENTION_AUDIT).schema), lake, RETENTION_AUDIT)

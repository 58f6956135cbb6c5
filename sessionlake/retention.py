"""Retention: age limits, per-user erasure, VACUUM, and an audit row per run.

State that only grows is the first war story of stream processors (seeds/): here old
sessions and events are deleted by age, users are erased on request from every table that
holds their data, and VACUUM removes the files that time travel would otherwise still read.

VACUUM never goes below what is still needed unless the operator forces it:

* a kept snapshot needs every file removed since it was taken, or it cannot be restored;
* a running stream, or a batch cut off by a crash, replays from the table versions its
  ledger recorded, so files removed since then must stay.

When that floor keeps erased rows reachable by time travel, the audit row and the report
say so, and until when.

A dry run counts what a run would delete and VACUUM, and changes nothing: retention is the
one maintenance job that cannot be undone, so its effect can be read before it is had.
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from functools import partial
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from sessionlake import faults
from sessionlake.agelimits import cutoff_conditions
from sessionlake.checkpoint import LockTimeout, batch_locks
from sessionlake.config import (
    MAX_AGE_DAYS,
    VACUUM_RETAIN_HOURS,
    ActionableError,
    Settings,
    format_duration,
)
from sessionlake.conflicts import retry_on_conflict
from sessionlake.deltareader import DeltaReadError, deletion_vector_path, read_state
from sessionlake.erasure import (
    USER_HASH,
    append_audit_row,
    cut_off_erasures,
    cut_off_with_others,
    delete_rows,
    erase,
    erased_since,
    erasure_cut_off,
    erasure_noted,
    mark_killed_erasures,
    note_deleted,
    note_erasure,
    user_hash,
    users_named,
)
from sessionlake.kafkastream import note_kafka_ends
from sessionlake.locks import checkpoint_in_use, lake_in_use
from sessionlake.registry import checkpoint_key, lake_streams, unfinished_batch_since
from sessionlake.snapshots import oldest_kept
from sessionlake.storage import local_path
from sessionlake.tables import (
    OPEN_SESSIONS,
    STREAM_TABLES,
    USER_TABLES,
    commit_metrics_since,
    each_table,
    ensure_tables,
    not_a_lake,
    path_identifier,
    read_table,
    table_path,
    table_version,
    written_by_others_since,
)

log = logging.getLogger("sessionlake.retention")

#: Delta's own safety margin for VACUUM (7 days); going below it needs its check turned off.
DELTA_DEFAULT_RETAIN_HOURS = float(VACUUM_RETAIN_HOURS)
#: What a running stream may still read that was removed a moment ago.
RUNNING_STREAM_HOURS = 1.0
#: How long an erasure waits for the stream's batch in flight to finish.
BATCH_WAIT = timedelta(minutes=15)


class RetentionError(ActionableError):
    """A retention request cannot run; nothing was changed."""


@dataclass(frozen=True)
class RetentionRequest:
    """What one retention run should do (``None`` leaves a limit or the VACUUM out)."""

    erase_users: tuple[str, ...] = ()
    #: Users to erase named by the SHA-256 of their id (:func:`~sessionlake.erasure.user_hash`):
    #: how the retention DAG passes them, so that no id is written to its task logs.
    erase_user_sha256: tuple[str, ...] = ()
    sessions_max_age_days: int | None = None
    events_max_age_days: int | None = None
    vacuum_retain_hours: int | None = None
    force_vacuum: bool = False
    dry_run: bool = False

    @property
    def erased_hashes(self) -> list[str]:
        """The SHA-256 of every user to erase, each once, as the audit keeps them."""
        return list(dict.fromkeys([*(user_hash(u) for u in self.erase_users),
                                   *self.erase_user_sha256]))

    def users_to_erase(self, table: str) -> Column | None:
        """The rows of ``table`` of the users to erase, found by the SHA-256 of their id
        whether they were named by id or by hash (:func:`users_named`); ``None``: no
        erasure asked. Delta writes a DELETE's condition into the table's log, which every
        reader of its history sees for as long as the log keeps that commit: an id there
        would outlive the erasure of its rows."""
        hashes = self.erased_hashes
        return users_named(table, hashes) if hashes else None


@dataclass(frozen=True)
class VacuumPlan:
    """The VACUUM retention to use, and why it is more than was asked for (or what a forced
    one, less than the lake needs, may cost)."""

    requested_hours: float
    hours: float
    reason: str | None = None
    #: While what the floor was raised for lasts (a snapshot kept, a batch not replayed),
    #: since that floor grows with each hour: the files the VACUUM keeps for it stay until
    #: then, not ``hours`` from now. ``None``: a floor of fixed hours.
    lasts: str | None = None


@dataclass(frozen=True)
class RetentionReport:
    """What a retention run did: its audit row, as returned to the caller."""

    run_id: str
    rows_deleted: dict[str, int] = field(default_factory=dict)
    vacuum: VacuumPlan | None = None
    files_vacuumed: int = 0
    time_travel_purged: bool = False
    note: str | None = None
    dry_run: bool = False

    def summary(self) -> str:
        """One line for the command line and task logs."""
        deleted = ", ".join(f"{t} {n}" for t, n in self.rows_deleted.items() if n) or "nothing"
        note = f" ({self.note})" if self.note else ""
        files = f"{self.files_vacuumed} file{'' if self.files_vacuumed == 1 else 's'}"
        if self.dry_run:
            vacuum = "no VACUUM" if self.vacuum is None else (
                f"VACUUM {self.vacuum.hours:g}h would remove {files}")
            return (f"retention dry run {self.run_id}: would delete {deleted}; {vacuum}; "
                    f"nothing changed{note}")
        vacuum = "no VACUUM" if self.vacuum is None else (
            f"VACUUM {self.vacuum.hours:g}h removed {files}")
        purged = "time travel purged" if self.time_travel_purged else "time travel kept"
        return f"retention {self.run_id}: deleted {deleted}; {vacuum}; {purged}{note}"


#: The note of a request whose erasure found no row: a mistyped id would otherwise read as
#: an erasure done ("deleted nothing"). A user whose records wait unread (in the landing
#: folder, in Kafka) has no row yet, and the erasure still keeps those out when read.
NO_ROW_TO_ERASE = ("no row of the user(s) to erase was found: erased before, not a user id "
                   "of this lake, or none of their records read yet (those that landed "
                   "before this erasure are kept out when read)")


def check_request(request: RetentionRequest) -> None:
    """Reject a malformed request before anything is read or written.

    :raises RetentionError: naming the wrong value.
    """
    for user in request.erase_users:
        if not isinstance(user, str) or not user.strip():
            raise RetentionError(f"erase-user {user!r} is not a user id (empty)")
    for digest in request.erase_user_sha256:
        if not isinstance(digest, str) or not USER_HASH.match(digest):
            raise RetentionError(f"erase-user-sha256 {digest!r} is not a SHA-256 in "
                                 "lowercase hex (64 digits)")
    for name, low, high in (("sessions_max_age_days", 1, MAX_AGE_DAYS),
                            ("events_max_age_days", 1, MAX_AGE_DAYS),
                            ("vacuum_retain_hours", 0, MAX_AGE_DAYS * 24)):
        value = getattr(request, name)
        if value is not None and not low <= value <= high:
            raise RetentionError(
                f"{name.replace('_', '-')} must be from {low} to {high}, got {value}")
    if not (request.erased_hashes or request.vacuum_retain_hours is not None
            or request.sessions_max_age_days is not None
            or request.events_max_age_days is not None):
        raise RetentionError(
            "nothing to do: give --erase-user ID, --erase-user-sha256 HASH, "
            "--sessions-max-age-days N, --events-max-age-days N or --vacuum-retain-hours N")


def _hours_since(moment: datetime, now: datetime) -> float:
    """Whole hours from ``moment`` to ``now``, rounded up: Delta rounds VACUUM's retention
    to whole hours (math.round), so a floor of 0.26 h would keep nothing and delete the
    files of the snapshot taken 15 minutes ago."""
    return float(max(0, math.ceil((now - moment).total_seconds() / 3600)))


def streams_need_since(spark: SparkSession, settings: Settings
                       ) -> tuple[tuple[datetime, str] | None, bool]:
    """Since when a stream of the lake may still read removed files (and on which
    checkpoint), and whether a stream is running on it.

    A batch whose ledger entry is not marked done (in flight, or cut off by a crash) will
    read the table versions it recorded; the oldest such entry, over the checkpoint given
    and every other that ran a stream on the lake, bounds VACUUM and holds erasures back.
    """
    checkpoints = {checkpoint_key(settings.checkpoint), *lake_streams(spark, settings.lake)}
    pending = [(started, checkpoint) for checkpoint in sorted(checkpoints)
               if (started := unfinished_batch_since(spark, checkpoint)) is not None]
    running = checkpoint_in_use(settings.checkpoint) or lake_in_use(settings.lake)
    return min(pending, default=None), running


@contextmanager
def batches_held(
    spark: SparkSession, settings: Settings, timeout: timedelta = BATCH_WAIT
) -> Iterator[None]:
    """Keep the stream's micro-batches out while the block erases users.

    A batch reads the state of its users at the versions it pinned when it started and
    writes it back at its end; a user erased in between would come back with it. So the
    erasure waits for the batch in flight (the batch locks of the checkpoint and of the
    lake, which a batch of any checkpoint holds; local folders only) and refuses to start
    while a batch cut off by a crash is still to be replayed from versions pinned before it.

    :raises RetentionError: the batch in flight outlasted ``timeout``, or a replay is due.
    """
    try:
        with batch_locks(settings.lake, settings.checkpoint, timeout.total_seconds()):
            pending, _ = streams_need_since(spark, settings)
            if pending is not None:
                started, checkpoint = pending
                raise RetentionError(
                    f"a batch of the stream on {checkpoint} started {started.isoformat()} "
                    "and did not finish (its run was cut off): run the stream once, so "
                    "that it replays that batch, then run retention again"
                )
            yield
    except LockTimeout:
        raise RetentionError(
            f"the stream's batch in flight on {settings.checkpoint} did not finish within "
            f"{format_duration(timeout)}: run retention again when it has"
        ) from None


#: How to let go of the snapshots a VACUUM keeps files for. An expiry by age alone never
#: removes the newest (the lake keeps a restore point), so it cannot help a lake with one
#: young snapshot; a new snapshot, taken after the deletes, with the older ones expired can.
EXPIRE_HINT = ("expire it: `sessionlake snapshot --keep-last 1` takes a snapshot of the lake "
               "as it is now and expires the older ones, as does the snapshot DAG with "
               "keep_last 1 and max_age_days null; `--expire-only --max-age-days N` expires "
               "those older than N days, but never the newest; --force-vacuum removes them, "
               "and the snapshot can then not be restored")


def plan_vacuum(
    spark: SparkSession, settings: Settings, request: RetentionRequest, now: datetime,
    streams_need: tuple[tuple[datetime, str] | None, bool] | None = None,
) -> VacuumPlan | None:
    """The VACUUM retention: what was asked, raised to what snapshots and the stream need.

    ``None`` when no VACUUM was asked for.

    :param streams_need: :func:`streams_need_since`, when the caller has it already (it
        reads every checkpoint's ledger).
    """
    if request.vacuum_retain_hours is None:
        return None
    asked = float(request.vacuum_retain_hours)
    needs: list[tuple[float, str, str | None]] = []
    snapshot = oldest_kept(settings.lake, spark)
    if snapshot is not None:
        needs.append((_hours_since(snapshot.created, now),
                      f"the oldest kept snapshot, taken {snapshot.created.isoformat()}",
                      f"while snapshot {snapshot.snapshot_id} is kept ({EXPIRE_HINT})"))
    pending, running = streams_need or streams_need_since(spark, settings)
    if pending is not None:
        needs.append((_hours_since(pending[0], now),
                      f"an unfinished batch that started {pending[0].isoformat()}",
                      "until that batch is replayed (run the stream); a retention run with "
                      "VACUUM after that removes them"))
    if running:
        needs.append((RUNNING_STREAM_HOURS, "the running stream", None))
    floor, why, lasts = max(needs, default=(0.0, None, None))
    if floor <= asked:
        return VacuumPlan(asked, asked)
    if request.force_vacuum:
        return VacuumPlan(asked, asked, f"VACUUM forced to {asked:g}h, under the {floor:g}h "
                          f"kept for {why}: `sessionlake snapshot --list` and `sessionlake "
                          "doctor` say what can no longer be restored")
    return VacuumPlan(asked, floor, f"VACUUM kept {floor:g}h instead of {asked:g}h for {why}",
                      lasts)


def purges_time_travel(plan: VacuumPlan | None) -> bool:
    """Whether a run's VACUUM leaves no deleted row readable by time travel: it keeps no
    hour of removed files."""
    return plan is not None and plan.hours == 0


def still_readable(started: datetime, plan: VacuumPlan | None, earlier: bool = False) -> str:
    """How long rows a retention run deleted stay readable by time travel, given its
    VACUUM: for an erasure request, the part that must not be left out. ``earlier``: the
    run deleted none, and the rows meant are those earlier runs deleted of its users."""
    rows = ("rows of these users that earlier runs deleted may stay" if earlier
            else "deleted rows stay")
    if plan is None:
        return (f"{rows} readable by time travel until a retention run with "
                "VACUUM (--vacuum-retain-hours) removes them")
    if plan.lasts is not None:
        return f"{rows} readable by time travel {plan.lasts}"
    until = (started + timedelta(hours=plan.hours)).isoformat(timespec="minutes")
    return (f"{rows} readable by time travel until {until}: a later retention "
            "run with VACUUM removes them")


@contextmanager
def _retention_check_off(spark: SparkSession, hours: float) -> Iterator[None]:
    """Let VACUUM go below Delta's 7-day margin for this block only (the plan decided it)."""
    key = "spark.databricks.delta.retentionDurationCheck.enabled"
    if hours >= DELTA_DEFAULT_RETAIN_HOURS:
        yield
        return
    previous = spark.conf.get(key, None)
    spark.conf.set(key, "false")
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def nothing_to_vacuum(lake: str, table: str, hours: float) -> bool:
    """Whether a VACUUM of ``table`` with ``hours`` of retention would delete nothing, told
    without Spark from its folder and its log: every file VACUUM looks at (names not
    hidden by ``.`` or ``_``, outside ``_delta_log``) is a live data file or deletion
    vector of the table's newest version, or was written less than ``hours`` ago, and no
    such folder is empty.

    VACUUM deletes only files that are not live and older than its retention (or removed
    less recently than that: kept too), and empty folders; a table with none costs it its
    Spark jobs and two commits all the same (about a second each of eight tables, warm), on
    most tables most days: the run skips those. ``False`` on a remote lake (not looked at)
    and for a table whose log this process cannot read.
    """
    folder = local_path(table_path(lake, table))
    if folder is None:
        return False
    root = Path(folder)
    try:
        state = read_state(root)
    except (DeltaReadError, OSError, ValueError, KeyError):
        return False
    live = {state.file_path(f) for f in state.files}
    live.update(path for f in state.files if f.deletion_vector is not None
                and (path := deletion_vector_path(root, f.deletion_vector)) is not None)
    threshold = time.time() - hours * 3600
    for current, folders, files in os.walk(root):
        folders[:] = [name for name in folders if not name.startswith(("_", "."))]
        shown = [name for name in files if not name.startswith(("_", "."))]
        if Path(current) != root and not folders and not shown:
            return False  # an empty folder, or one of hidden files only: VACUUM's to judge
        for name in shown:
            path = Path(current, name)
            if path in live:
                continue
            try:
                written = path.stat().st_mtime
            except FileNotFoundError:
                continue  # removed meanwhile (a writer's cleanup, another VACUUM)
            if written < threshold:
                return False
    return True


def vacuum_tables(spark: SparkSession, lake: str, hours: float) -> int:
    """VACUUM every stream table with ``hours`` of retention, side by side, but those it
    would delete nothing of (:func:`nothing_to_vacuum`); how many files it deleted."""
    spark.conf.set("spark.databricks.delta.vacuum.logging.enabled", "true")

    def vacuum(table: str) -> int:
        if nothing_to_vacuum(lake, table, hours):
            log.debug("VACUUM of %s skipped: no file it would delete", table)
            return 0
        before = table_version(spark, lake, table)
        target = DeltaTable.forPath(spark, table_path(lake, table))
        retry_on_conflict(partial(target.vacuum, hours), f"VACUUM {table}")
        return sum(m.get("numDeletedFiles", 0)
                   for m in commit_metrics_since(spark, lake, table, before, "VACUUM END"))

    with _retention_check_off(spark, hours):
        return sum(each_table(vacuum, STREAM_TABLES).values())


def files_to_vacuum(spark: SparkSession, lake: str, hours: float) -> int:
    """How many files and folders a VACUUM of every stream table with ``hours`` of
    retention would delete now (Delta's ``DRY RUN``: no file deleted, no commit)."""
    def dry_run(table: str) -> int:
        if nothing_to_vacuum(lake, table, hours):
            return 0
        name = path_identifier(table_path(lake, table))
        return spark.sql(f"VACUUM {name} RETAIN {hours:g} HOURS DRY RUN").count()

    with _retention_check_off(spark, hours):
        return sum(each_table(dry_run, STREAM_TABLES).values())


def age_conditions(
    request: RetentionRequest, today: date
) -> tuple[dict[str, Column], date | None, date | None]:
    """The rows each age limit reaches, by table (:func:`cutoff_conditions`), and the two
    cut-off dates (``None``: no limit)."""
    sessions_cutoff = None if request.sessions_max_age_days is None else \
        today - timedelta(days=request.sessions_max_age_days)
    events_cutoff = None if request.events_max_age_days is None else \
        today - timedelta(days=request.events_max_age_days)
    return cutoff_conditions(sessions_cutoff, events_cutoff), sessions_cutoff, events_cutoff


def age_limits(
    spark: SparkSession, settings: Settings, request: RetentionRequest, today: date
) -> tuple[dict[str, int], date | None, date | None, str | None]:
    """Delete sessions and events older than their limits (:func:`age_conditions`).

    The tables' rows go first, beside the stream. Then, between two batches
    (:func:`batches_held`), the open sessions, which are the stream's state (a batch writes
    back the state it read when it started), and once more the rows of the tables a batch
    committed to in the meantime: a stream reading old input would otherwise leave this
    run's tables disagreeing, its events kept but their open sessions deleted, say (the
    concurrency review). When no such moment comes (a batch in flight too long, or one cut
    off and not replayed), both are left for the next run, and the note says so.

    :return: rows deleted per table, the two cut-off dates (``None``: no limit), and the
        note when something was left.
    """
    lake = settings.lake
    limits, sessions_cutoff, events_cutoff = age_conditions(request, today)
    state_limit = limits.pop(OPEN_SESSIONS, None)
    if not (limits or state_limit is not None):
        return {}, sessions_cutoff, events_cutoff, None
    tag = f"sessionlake retention {uuid.uuid4().hex}"  # this run's DELETEs
    before = {table: table_version(spark, lake, table) for table in limits}
    deleted = each_table(lambda table: delete_rows(spark, lake, table, limits[table], tag),
                         limits)
    try:
        with batches_held(spark, settings):
            # A batch's blind append does not conflict with a DELETE: rows appended while
            # it ran are found by any other writer's commit since the run began.
            again = {table: limit for table, limit in limits.items()
                     if written_by_others_since(spark, lake, table, before[table], tag)}
            if state_limit is not None:
                again[OPEN_SESSIONS] = state_limit
            for table, rows in each_table(
                    lambda table: delete_rows(spark, lake, table, again[table], tag),
                    again).items():
                deleted[table] = deleted.get(table, 0) + rows
    except RetentionError as error:
        written = "rows the stream may have written while this run deleted"
        note = (f"open sessions were not aged out, nor {written} ({error})"
                if state_limit is not None else f"{written} were not aged out ({error})")
        log.warning("%s", note)
        return deleted, sessions_cutoff, events_cutoff, note
    return deleted, sessions_cutoff, events_cutoff, None


def rows_to_delete(
    spark: SparkSession, lake: str, request: RetentionRequest, today: date,
    versions: Mapping[str, int] | None = None,
) -> tuple[dict[str, int], dict[str, int]]:
    """How many rows of each table the request's erasures and age limits would delete, in
    each table as it is now or at ``versions``; and of those, how many the erasures reach
    (so that an erasure that finds no row is told even when the age limits find some).

    A row that both rules reach counts once, as the run deletes it once.
    """
    reached, _, _ = age_conditions(request, today)
    named = {t: c for t in USER_TABLES if (c := request.users_to_erase(t)) is not None}
    for table, users in named.items():
        reached[table] = reached[table] | users if table in reached else users
    at = versions or {}

    def count(table: str) -> tuple[int, int]:
        """The rows of ``table`` either rule reaches, and of those the erasures'."""
        by_erasure = named.get(table, F.lit(False))
        row = read_table(spark, lake, table, at.get(table)).where(reached[table]).agg(
            F.count(F.lit(1)), F.count(F.when(by_erasure, 1))).head()
        assert row is not None  # an aggregate without grouping has one row
        return int(row[0]), int(row[1])

    counted = each_table(count, reached)
    return ({t: n for t, (n, _) in counted.items()},
            {t: n for t, (_, n) in counted.items() if t in USER_TABLES})


@dataclass(frozen=True)
class _Erasure:
    """What a run's erasure did, under the batch locks."""

    #: When it began, once the batch in flight was done: what landed before, it reaches.
    started: datetime
    #: Rows deleted per table: its own, and those of the cut-off runs it finishes.
    erased: dict[str, int]
    #: Its own deletes alone.
    own: dict[str, int]
    #: The cut-off runs of the same users whose deletes it counts.
    finished: list[str]
    #: Cut-off runs of these users and others, with how many others: not finished here.
    partly: list[tuple[str, int]]


def _erase_users(
    spark: SparkSession, settings: Settings, run_id: str, to_erase: Sequence[str],
    now: datetime | None,
) -> _Erasure:
    """Delete the users ``to_erase`` (SHA-256 hashes) from every user table, the batch
    locks held so that no batch writes them back, and note the run so that, cut off, it
    is finished and counted by a later one (:mod:`sessionlake.erasure`)."""
    lake = settings.lake
    with batches_held(spark, settings):
        # The run starts now, the batch in flight done: what landed before this moment,
        # the erasure reaches (a batch keeps it out when read later), whatever waited.
        started = now or datetime.now(UTC)
        mark_killed_erasures(spark, lake)  # counted before this run's deletes follow
        # Under the batch locks: after these versions, the DELETEs are this run's.
        user_versions = {t: table_version(spark, lake, t) for t in USER_TABLES}
        note_erasure(spark, lake, run_id, started, to_erase, user_versions)
        try:
            note_kafka_ends(spark, settings, started)  # what Kafka holds of them now
            own = erase(spark, lake, to_erase)
            note_deleted(spark, lake, run_id, own)
            finished, earlier = cut_off_erasures(spark, lake, to_erase)
            partly = cut_off_with_others(spark, lake, to_erase)
        except BaseException:
            # Cut off (Ctrl-C, a failure) before any delete: no erasure to keep the users'
            # records out for, until it is run again. After some: its note stays, for the
            # run that finishes it and counts them.
            erasure_cut_off(spark, lake, run_id,
                            erased_since(spark, lake, to_erase, user_versions))
            raise
    erased = own
    if finished:  # the cut-off runs' deletes are counted here
        erased = {t: own.get(t, 0) + earlier.get(t, 0) for t in {*own, *earlier}}
    return _Erasure(started, erased, own, finished, partly)


def _run_notes(
    plan: VacuumPlan | None, erasure: _Erasure | None, state_left: str | None,
    deleted: Mapping[str, int], started: datetime,
) -> str | None:
    """The audit row's note: what the run left undone or kept, and why."""
    purged = purges_time_travel(plan)
    notes = [plan.reason] if plan is not None and plan.reason else []
    if erasure is not None and erasure.finished:
        notes.append(f"finishes erasure run(s) {', '.join(erasure.finished)}, cut off after "
                     "some of their deletes (counted here)")
    if erasure is not None and erasure.partly:
        notes.append(
            "erasure run(s) " + ", ".join(f"{run} (with {n} other user(s))"
                                          for run, n in erasure.partly)
            + " erased these users with others and were cut off after some of their "
            "deletes, which are not counted here: erase all their users in one run to "
            "finish them and count those deletes")
    if state_left is not None:
        notes.append(state_left)
    if erasure is not None and not any(erasure.erased.values()):
        notes.append(NO_ROW_TO_ERASE)
    if not purged and any(deleted.values()):
        notes.append(still_readable(started, plan))
    elif not purged and erasure is not None and plan is not None:
        # An erasure run again with VACUUM to purge time travel, its VACUUM held back.
        notes.append(still_readable(started, plan, earlier=True))
    return "; ".join(notes) or None


def enforce_retention(
    spark: SparkSession,
    settings: Settings,
    request: RetentionRequest,
    now: datetime | None = None,
) -> RetentionReport:
    """Apply erasures and age limits, VACUUM as planned, and append the audit row.

    Running it again after a crash is safe: deletes find nothing more to delete, and the
    audit row is written last. A dry run (``request.dry_run``) only counts
    (:func:`preview_retention`).

    :raises RetentionError: a malformed request or a missing lake (nothing changed).
    """
    check_request(request)
    lake = settings.lake
    if (why := not_a_lake(spark, lake)) is not None:
        raise RetentionError(why)
    started = now or datetime.now(UTC)
    run_id = f"{started.strftime('%Y%m%dT%H%M%SZ')}-{uuid.uuid4().hex[:6]}"
    if request.dry_run:
        return preview_retention(spark, settings, request, started, run_id)
    ensure_tables(spark, lake)
    versions_before = {t: table_version(spark, lake, t) for t in STREAM_TABLES}

    to_erase = request.erased_hashes
    erasure = _erase_users(spark, settings, run_id, to_erase, now) if to_erase else None
    if erasure is not None:
        started = erasure.started
    deleted = dict(erasure.erased) if erasure is not None else {}
    try:
        aged, sessions_cutoff, events_cutoff, state_left = age_limits(
            spark, settings, request, started.date())
        for table, rows in aged.items():
            deleted[table] = deleted.get(table, 0) + rows

        plan = plan_vacuum(spark, settings, request, started)
        faults.point("vacuum")
        files = vacuum_tables(spark, lake, plan.hours) if plan is not None else 0
        report = RetentionReport(run_id, deleted, plan, files, purges_time_travel(plan),
                                 _run_notes(plan, erasure, state_left, deleted, started))
        _append_audit(spark, lake, report, request, started, sessions_cutoff, events_cutoff,
                      versions_before)
    except BaseException:
        if erasure is not None:  # cut off after its erasure: the run that finishes it counts it
            erasure_cut_off(spark, lake, run_id, {t: n for t, n in erasure.own.items() if n})
        raise
    if erasure is not None:
        erasure_noted(spark, lake, run_id, to_erase, erasure.finished)
    log.info("%s", report.summary())
    return report


def preview_retention(
    spark: SparkSession,
    settings: Settings,
    request: RetentionRequest,
    started: datetime,
    run_id: str,
) -> RetentionReport:
    """What the request would delete and VACUUM as the lake is now; nothing is written.

    The VACUUM is counted with the retention the run would use (:func:`plan_vacuum`); with
    0 hours the run would also remove the files its own deletes rewrite, which do not exist
    yet and are not counted.
    """
    # Every table counted as of one moment (a running stream commits meanwhile), and said.
    versions = {t: table_version(spark, settings.lake, t) for t in STREAM_TABLES}
    deleted, erased = rows_to_delete(spark, settings.lake, request, started.date(), versions)
    streams_need = streams_need_since(spark, settings)
    plan = plan_vacuum(spark, settings, request, started, streams_need)
    files = files_to_vacuum(spark, settings.lake, plan.hours) if plan is not None else 0
    notes = [plan.reason] if plan is not None and plan.reason else []
    pending = streams_need[0]
    erasing = bool(request.erased_hashes)
    if erasing and pending is not None:
        notes.append(f"the erasure would be refused now: a batch of the stream on "
                     f"{pending[1]} was cut off and is to be replayed first")
    if erasing and not any(erased.values()):
        notes.append(NO_ROW_TO_ERASE)
    notes.append("rows counted in " + ", ".join(
        f"{t}@{versions[t]}" for t in STREAM_TABLES if t in deleted))
    report = RetentionReport(run_id, deleted, plan, files, purges_time_travel(plan),
                             "; ".join(notes) or None, dry_run=True)
    log.info("%s", report.summary())
    return report


def _append_audit(
    spark: SparkSession,
    lake: str,
    report: RetentionReport,
    request: RetentionRequest,
    started: datetime,
    sessions_cutoff: date | None,
    events_cutoff: date | None,
    versions_before: dict[str, int],
) -> None:
    append_audit_row(spark, lake, {
        "run_id": report.run_id,
        "started_at": started,
        "erased_user_sha256": request.erased_hashes,
        "sessions_cutoff": sessions_cutoff,
        "events_cutoff": events_cutoff,
        "rows_deleted": report.rows_deleted,
        "versions_before": versions_before,
        "vacuum_retain_hours": report.vacuum.hours if report.vacuum else None,
        "vacuum_requested_hours": report.vacuum.requested_hours if report.vacuum else None,
        "files_vacuumed": report.files_vacuumed,
        "time_travel_purged": report.time_travel_purged,
        "note": report.note,
    })

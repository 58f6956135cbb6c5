"""``sessionlake doctor``: find damaged state, say what is wrong and how to recover.

State kept in files can be damaged outside any transaction: a checkpoint folder deleted by
hand, a disk that cut a file short, a log entry lost in a copy. Delta and Spark then fail
on the next read with a stack trace that names neither the damage nor a way out. The
doctor reads the lake and its checkpoint without changing anything and prints one line per
check: ``ok``, or ``ERROR`` with the broken file and the exact command that recovers it:

* ``open_sessions`` is derived state: ``sessionlake rebuild-state`` recomputes it from
  ``events`` and ``sessions`` (see :mod:`sessionlake.rebuild`);
* anything else (another table, the streaming checkpoint) returns to a snapshot with
  ``sessionlake restore``: the newest snapshot taken before every damaged version, since a
  snapshot that holds the broken file or log entry would bring it back. When no snapshot
  qualifies, the line says so and what is lost.

Checks are small functions over :mod:`sessionlake.deltalog` (the tables' logs and data
files) and the checkpoint's files, so a local lake is checked without starting Spark.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Sequence, Set
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import SparkSession

from sessionlake import storage
from sessionlake.checkpoint import (
    IDENTITY_FILE,
    KAFKA_LOG_MARK,
    RESTORING_MARKER,
    SOURCE_LOG,
    SourceLogUnreadable,
    last_committed_batch,
    ledger_batch_ids,
    noted_input_format,
    read_stream_identity,
)
from sessionlake.config import ActionableError, Settings, no_lake_message
from sessionlake.deltalog import TableLog, commit_file, inspect_table
from sessionlake.health import RunningStream, running_stream, unrestorable_versions
from sessionlake.registry import checkpoint_key, lake_streams
from sessionlake.snapshots import Snapshot, list_snapshots, snapshots_root
from sessionlake.stream import MOVED_SOURCE_WHY, source_moved_from
from sessionlake.tables import (
    BATCH_METRICS,
    EVENTS,
    OPEN_SESSIONS,
    RETENTION_AUDIT,
    SESSIONS,
    STREAM_TABLES,
    table_path,
)

CHECKPOINT = "checkpoint"
SNAPSHOTS = "snapshots"
#: The tables ``rebuild-state`` recomputes ``open_sessions`` from: they must be whole.
STATE_SOURCES: tuple[str, ...] = (EVENTS, SESSIONS, BATCH_METRICS)
#: A checkpoint missing where the lake's streams (its register) say they ran elsewhere.
OTHER_CHECKPOINT_WHY = "is not here; the lake's stream ran on"
#: Spark's own checkpoint parts that a stream which has run cannot do without.
SPARK_PARTS = ("offsets", "commits", "metadata")
_VERSION_LINE = re.compile(r"^v\d+$")


class DoctorError(ActionableError):
    """The lake cannot be checked at all (for example, there is none)."""


@dataclass(frozen=True)
class Finding:
    """The outcome of one check.

    :param subject: ``checkpoint`` or a table name.
    :param problem: what is wrong, or ``None`` when the check passed.
    :param detail: what was checked (passed checks) or which file is broken.
    :param version: for table damage, the first table version it spoils.
    :param in_log: for table damage, whether Delta cannot read the log at all.
    :param lost: what is lost if no snapshot can restore it (for an unfinished restore:
        the snapshot to restore again).
    :param recovery: what to do, filled in by :func:`advise`.
    :param damage: whether the problem is damage to the lake or checkpoint, rather than
        a mismatch with what the doctor was asked (another ``--source``).
    """

    subject: str
    problem: str | None
    detail: str
    version: int | None = None
    in_log: bool = False
    lost: str = ""
    recovery: str | None = None
    damage: bool = True

    @property
    def ok(self) -> bool:
        """Whether the check passed."""
        return self.problem is None

    def line(self) -> str:
        """The finding as printed: ``ok ...`` or ``ERROR ...; recover: ...``."""
        if self.ok:
            return f"ok     {self.subject}: {self.detail}"
        return f"ERROR  {self.subject}: {self.detail}: {self.problem}; {self.recovery}"


@dataclass(frozen=True)
class HealthReport:
    """Every finding of one doctor run, with the recovery filled in."""

    findings: tuple[Finding, ...]

    @property
    def healthy(self) -> bool:
        """Whether every check passed."""
        return all(f.ok for f in self.findings)

    def lines(self) -> list[str]:
        """One line per finding, then a verdict with the order of the recovery commands."""
        lines = [f.line() for f in self.findings]
        if self.healthy:
            return [*lines, f"healthy: {len(lines)} checks passed"]
        problems = [f for f in self.findings if not f.ok]
        commands = dict.fromkeys(
            command for f in problems if f.recovery and f.recovery.startswith("recover:")
            for command in re.findall(r"`([^`]+)`", f.recovery)
        )
        order = ("sessionlake restore", "sessionlake rebuild-state", "sessionlake run")
        steps = "; then ".join(sorted(commands, key=lambda c: next(
            (i for i, prefix in enumerate(order) if c.startswith(prefix)), len(order))))
        verdict = "damaged:" if any(f.damage for f in problems) else "not damaged, but"
        then = ("recover with: " + steps if steps
                else "move the snapshot folders named above out of the lake"
                if all(f.subject == SNAPSHOTS for f in problems)
                else "no command recovers it")
        return [*lines, f"{verdict} {len(problems)} problem(s); {then}"]


def check_table(
    spark: SparkSession | None, lake: str, table: str
) -> tuple[TableLog, list[Finding]]:
    """Check one table's log and data files (:func:`sessionlake.deltalog.inspect_table`)."""
    log = inspect_table(spark, table_path(lake, table))
    if not log.damage:
        checkpoint = ("" if log.checkpoint_version is None
                      else f" (from checkpoint v{log.checkpoint_version})")
        return log, [Finding(table, None, f"log v0..v{log.newest_version} readable{checkpoint}, "
                                          f"{len(log.files)} live data file(s) present")]
    findings = []
    for damage in log.damage:
        lost = (f"{table} from version {damage.version} on cannot be read: that data is lost"
                if damage.in_log else f"the rows in {damage.file} are lost")
        findings.append(Finding(table, damage.problem, damage.file, damage.version,
                                damage.in_log, lost))
    return log, findings


def _spark_file_problem(text: str | None) -> str | None:
    """What is wrong with a file of Spark's offset/commit/source logs (``None``: nothing).

    Each is a version line (``v1``) followed by JSON lines. Spark's Kafka source writes
    its initial offsets (``sources/0/0``) after a zero byte, kept for Spark 2.1's readers.
    """
    if text is None:
        return "is missing"
    lines = text.removeprefix(KAFKA_LOG_MARK).split("\n")
    if not _VERSION_LINE.match(lines[0].strip()):
        return "does not start with a version line such as v1: half-written or overwritten"
    if not any(line.strip() for line in lines[1:]):
        return "holds a version line only: half-written"
    for number, line in enumerate(lines[1:], start=2):
        if line.strip():
            try:
                json.loads(line)
            except ValueError:
                return f"line {number} is not complete JSON: half-written"
    return None


def _json_problem(text: str | None, keys: Sequence[str]) -> str | None:
    """What is wrong with a JSON object file that must hold ``keys`` (``None``: nothing)."""
    if text is None:
        return "is missing"
    try:
        data = json.loads(text)
    except ValueError:
        return "is not complete JSON: half-written or overwritten"
    missing = [k for k in keys if not isinstance(data, dict) or k not in data]
    return f"lacks {', '.join(missing)}" if missing else None


_CHECKPOINT_LOST = (
    "the record of what the stream has read is lost: a run on a fresh checkpoint (move the "
    "damaged one aside) reads every landing file again, in which events already accepted "
    "or rejected as late count as duplicates but quarantined records are recorded a second "
    "time; on a Kafka topic it is refused, since the topic's events without an event_id "
    "would be taken in twice (restore a snapshot, or run with --starting-offsets latest)"
)


def check_spark_checkpoint(
    spark: SparkSession | None, checkpoint: str, batches_ran: bool = True
) -> list[Finding]:
    """Spark's part of the checkpoint (``<checkpoint>/spark``): offsets, commits, metadata.

    Every kept file of the offset, commit and source logs must parse, and the newest commit
    must have its offsets; once a batch ran, none of the three may be missing.
    """
    root = f"{checkpoint.rstrip('/')}/spark"
    findings = []
    for part in SPARK_PARTS:
        if batches_ran and not storage.exists(spark, f"{root}/{part}"):
            findings.append(Finding(CHECKPOINT, "is missing while the lake holds processed "
                                    "batches", f"spark/{part}", lost=_CHECKPOINT_LOST))
    metadata = storage.read_text(spark, f"{root}/metadata")
    problem = _json_problem(metadata, ["id"]) if metadata is not None else None
    if problem:
        findings.append(Finding(CHECKPOINT, problem, "spark/metadata", lost=_CHECKPOINT_LOST))
    logs = ["offsets", "commits", *(f"sources/{s}" for s in storage.list_names(
        spark, f"{root}/sources") if not s.startswith("."))]
    for part in logs:
        for name in storage.list_names(spark, f"{root}/{part}"):
            if name.startswith(".") or not name.split(".")[0].isdigit():
                continue
            problem = _spark_file_problem(storage.read_text(spark, f"{root}/{part}/{name}"))
            if problem:
                findings.append(Finding(CHECKPOINT, problem, f"spark/{part}/{name}",
                                        lost=_CHECKPOINT_LOST))
    committed = last_committed_batch(spark, root)
    if committed >= 0 and not storage.exists(spark, f"{root}/offsets/{committed}"):
        findings.append(Finding(CHECKPOINT, "is missing although batch "
                                f"{committed} committed", f"spark/offsets/{committed}",
                                lost=_CHECKPOINT_LOST))
    return findings


def check_sessionlake_files(spark: SparkSession | None, checkpoint: str) -> list[Finding]:
    """sessionlake's files in the checkpoint: the stream identity and the batch ledger."""
    root = checkpoint.rstrip("/")
    findings = []
    identity = storage.read_text(spark, f"{root}/{IDENTITY_FILE}")
    problem = _json_problem(identity, ["stream_id", "epoch"])
    if problem:
        findings.append(Finding(
            CHECKPOINT, problem, IDENTITY_FILE,
            lost="a run would start under a new stream identity, and a batch cut off before "
                 "the damage would then be written twice",
        ))
    for name in storage.list_names(spark, f"{root}/ledger"):
        if name.startswith(".") or not name.endswith(".json"):
            continue
        problem = _json_problem(storage.read_text(spark, f"{root}/ledger/{name}"),
                                ["events_version", "processing_time"])
        if problem:
            findings.append(Finding(
                CHECKPOINT, problem, f"ledger/{name}",
                lost="a replay of that batch cannot know which table versions it read",
            ))
    return findings


def _newest_ledger_entry(
    spark: SparkSession | None, checkpoint: str
) -> tuple[int, str, dict[str, Any] | None] | None:
    """The newest batch of the checkpoint's stream (its current epoch) with a ledger entry:
    its id, the entry's location and its contents (``None`` when they do not parse)."""
    root = checkpoint.rstrip("/")
    try:
        identity = read_stream_identity(spark, root)
    except (ValueError, KeyError, TypeError):
        return None
    batches = [] if identity is None else ledger_batch_ids(spark, root, identity)
    if identity is None or not batches:
        return None
    newest = batches[-1]
    uri = f"{root}/ledger/{identity.ledger_prefix}{newest}.json"
    try:
        entry = json.loads(storage.read_text(spark, uri) or "")
    except ValueError:
        entry = None
    return newest, uri, entry if isinstance(entry, dict) else None


def unfinished_batch(spark: SparkSession | None, checkpoint: str) -> int | None:
    """The newest batch of the checkpoint's stream whose ledger entry is not done, if any.

    Such a batch was cut off mid-way (or is running); ``sessionlake run`` replays it.
    """
    newest = _newest_ledger_entry(spark, checkpoint)
    if newest is None:
        return None
    batch, _, entry = newest
    return None if entry is not None and entry.get("done") else batch


def check_versions_the_stream_saw(
    spark: SparkSession | None, checkpoint: str, logs: dict[str, TableLog]
) -> list[Finding]:
    """A table whose log ends before a version the stream's newest batch read or wrote (its
    ledger entry): the newest log entries were deleted, every checksum with them, so the
    log itself looks whole. The table silently went back in time (``open_sessions`` then
    holds sessions that are also closed in ``sessions``). A table created after the entry
    was written (``rebuild-state`` re-creates ``open_sessions``) has other version numbers
    and is left out."""
    newest = _newest_ledger_entry(spark, checkpoint)
    if newest is None:
        return []
    batch, uri, entry = newest
    if entry is None:
        return []
    seen = {t: int(v) for t, v in (entry.get("table_versions") or {}).items()}
    if entry.get("done") and entry.get("open_sessions_version_after") is not None:
        seen[OPEN_SESSIONS] = max(seen.get(OPEN_SESSIONS, -1),
                                  int(entry["open_sessions_version_after"]))
    written_ms = storage.modified_ms(spark, uri) or 0
    findings = []
    for table, version in sorted(seen.items()):
        log = logs.get(table)
        if log is None or not log.exists or log.damage or log.newest_version is None \
                or (log.created_ms or 0) > written_ms or log.newest_version >= version:
            continue
        missing = log.newest_version + 1
        findings.append(Finding(
            table, f"missing Delta log entries: the log ends at version {log.newest_version}, "
            f"but batch {batch} of the stream saw version {version} (its ledger entry "
            f"{uri.rsplit('/', 1)[-1]}): the newest entries were deleted",
            commit_file(missing), missing, True,
            f"{table} from version {missing} on cannot be read: that data is lost"))
    return findings


def check_checkpoint(
    spark: SparkSession | None, checkpoint: str, batches_ran: bool,
    elsewhere: Sequence[str] = (), running: RunningStream | None = None,
) -> list[Finding]:
    """The streaming checkpoint: present when the lake holds batches, and every file whole.

    :param batches_ran: whether ``batch_metrics`` holds rows, so a checkpoint must exist.
    :param elsewhere: the other checkpoints the lake's streams ran on that still exist: a
        checkpoint missing here is then most likely the wrong one, not a lost one, and the
        finding names them instead of advising a restore.
    :param running: the pid and checkpoint of a stream running on the lake
        (:func:`sessionlake.health.running_stream`), named in the finding.
    """
    root = checkpoint.rstrip("/")
    if not storage.exists(spark, root) or not storage.exists(spark, f"{root}/spark"):
        if not batches_ran:
            return [Finding(CHECKPOINT, None, f"{root}: none yet, and no batch has run")]
        what = root if not storage.exists(spark, root) else f"{root}/spark"
        if elsewhere:
            return [Finding(CHECKPOINT, f"{OTHER_CHECKPOINT_WHY}: {', '.join(elsewhere)}",
                            what, lost=elsewhere[0])]
        return [Finding(CHECKPOINT, "is missing while batch_metrics holds processed batches "
                        "(if the stream runs with --checkpoint DIR, pass the same "
                        "--checkpoint)", what, lost=_CHECKPOINT_LOST)]
    findings = [*check_spark_checkpoint(spark, root, batches_ran),
                *check_sessionlake_files(spark, root)]
    marker = storage.read_text(spark, f"{root}/{RESTORING_MARKER}")
    if marker is not None:
        try:
            snapshot_id = str(json.loads(marker).get("snapshot_id", "?"))
        except (ValueError, AttributeError):
            snapshot_id = "?"
        findings.append(Finding(CHECKPOINT, f"a restore to snapshot {snapshot_id} was cut "
                                "off: tables and checkpoint may be a mix of two states",
                                RESTORING_MARKER, lost=snapshot_id))
    if findings:
        return findings
    committed = last_committed_batch(spark, f"{root}/spark")
    notes = [f"last committed batch {committed}" if committed >= 0 else "no batch committed yet"]
    pending = unfinished_batch(spark, root)
    if pending is not None:
        notes.append(f"batch {pending} unfinished (the next run replays it)")
    if running is not None:
        where = running.checkpoint
        on = f" on checkpoint {where}" if where and checkpoint_key(where) != \
            checkpoint_key(root) else ""
        notes.append(f"in use by a running stream ({running.who}{on}): "
                     "files may change while read")
    return [Finding(CHECKPOINT, None, f"{root}: offsets, commits, metadata, identity and "
                                      f"ledger readable; {'; '.join(notes)}")]


def check_source_folder(spark: SparkSession | None, settings: Settings) -> list[Finding]:
    """A problem when ``--source`` names another landing folder than the checkpoint read.

    Nothing to check without ``--source``, for Kafka, or for a remote folder without Spark.
    """
    if not settings.source or settings.reads_kafka:
        return []
    local = storage.local_path(settings.source)
    if local is not None:
        root = os.path.abspath(local)
    elif spark is not None:
        root = storage.path_part(spark, settings.source)
    else:
        return []
    try:
        before = source_moved_from(spark, settings.checkpoint, root)
    except SourceLogUnreadable:
        return []  # named by the checkpoint's own check (check_checkpoint), once
    if before is None:
        return []
    return [Finding(CHECKPOINT, f"its files were read from {before}, not from --source "
                                f"{settings.source}: {MOVED_SOURCE_WHY}",
                    f"{settings.checkpoint.rstrip('/')}/{SOURCE_LOG}", lost=before,
                    damage=False)]


def _batches_ran(log: TableLog) -> bool:
    """Whether ``batch_metrics`` holds rows (when its log is damaged: whether it was written)."""
    if log.log_damaged_from is None and log.exists:
        return bool(log.files)
    return (log.newest_version or 0) > 0


def _command(settings: Settings, name: str, *extra: str) -> str:
    """A sessionlake command line for this lake and checkpoint, quoted for a shell."""
    parts = ["sessionlake", name, "--lake", settings.lake]
    if settings.checkpoint_dir:
        parts += ["--checkpoint", settings.checkpoint_dir]
    return shlex.join([*parts, *extra])


def _run_command(settings: Settings) -> str:
    """``sessionlake run`` for this lake, with the landing folder when it is known, and the
    input format when it is not the default (the run refuses another than its stream's)."""
    form = [] if settings.input_format == "jsonl" else ["--format", settings.input_format]
    if settings.reads_kafka:
        secured = (["--kafka-properties", settings.kafka_properties]
                   if settings.kafka_properties else [])
        return _command(settings, "run", "--source", settings.source or "kafka",
                        "--kafka-bootstrap", settings.kafka_bootstrap or "<HOST:PORT>",
                        "--topic", settings.kafka_topic or "<topic>", *secured, *form)
    if settings.source:
        return _command(settings, "run", "--source", settings.source, *form)
    return f"{_command(settings, 'run', *form)} --source <landing folder>"


def restore_target(
    findings: Sequence[Finding], snapshots: Sequence[Snapshot]
) -> Snapshot | None:
    """The newest snapshot a restore to which repairs every finding that needs a restore.

    A damaged table version must come after the snapshot's version of that table (else the
    restore would bring the damage back, or could not read the log to get there); damage
    of the checkpoint is repaired by any snapshot, which carries its own copy. Log damage of
    ``open_sessions`` counts too: the restore returns that table as well.
    """
    needs = [f for f in findings if not f.ok and f.version is not None
             and (f.subject != OPEN_SESSIONS or f.in_log) and f.subject != RETENTION_AUDIT]
    for snapshot in reversed(snapshots):
        if all(snapshot.table_versions.get(f.subject, -1) < (f.version or 0) for f in needs):
            return snapshot
    return None


def advise(
    findings: Sequence[Finding], settings: Settings, snapshots: Sequence[Snapshot],
    unusable: Set[str] = frozenset(),
) -> list[Finding]:
    """Fill in each problem's recovery: the command, or why there is none and what is lost.

    :param unusable: the ids of snapshots that cannot be restored, never advised.
    """
    usable = [s for s in snapshots if s.snapshot_id not in unusable]
    target = restore_target(findings, usable)
    advised = []
    for finding in findings:
        if finding.ok:
            advised.append(finding)
            continue
        if finding.subject == SNAPSHOTS and finding.lost:
            recovery = _unrestorable_recovery(finding.lost, settings, snapshots, usable)
        elif finding.subject == SNAPSHOTS:
            recovery = ("move the snapshot folder whose snapshot.json does not parse out of "
                        f"{finding.detail}; the other snapshots stay usable")
        elif finding.detail.endswith(SOURCE_LOG):
            run = _run_command(settings.with_overrides(source=finding.lost))
            recovery = (f"recover: `{run}` (a symbolic link at {finding.lost} to the moved "
                        "folder lets Spark find its files)")
        elif (finding.problem or "").startswith(OTHER_CHECKPOINT_WHY):
            again = _command(settings.with_overrides(checkpoint=finding.lost), "doctor")
            recovery = (f"recover: `{again}` (and the same --checkpoint for every command "
                        "on this lake)")
        elif finding.detail == RESTORING_MARKER:
            again = _command(settings, "restore", "--snapshot", finding.lost)
            recovery = f"recover: run `{again}` again"
        elif finding.subject == RETENTION_AUDIT:
            recovery = (f"no snapshot holds it (the erasures it records outlive any restore): "
                        f"{finding.lost}; the erasures themselves stay done. Move "
                        f"{table_path(settings.lake, RETENTION_AUDIT)} aside, and the next "
                        "`sessionlake run` creates it anew, empty")
        elif finding.subject == OPEN_SESSIONS and target is None and (broken_sources := [
                f.subject for f in findings if not f.ok and f.subject in STATE_SOURCES]):
            # rebuild-state would refuse, sending the user back here.
            recovery = (f"`{_command(settings, 'rebuild-state')}` recomputes it once "
                        f"{', '.join(dict.fromkeys(broken_sources))} is whole again, which no "
                        "command here can make it (above)")
        elif finding.subject == OPEN_SESSIONS:
            recovery = (f"recover: `{_command(settings, 'rebuild-state')}` (recomputes it "
                        "from events and sessions)")
        elif target is not None:
            restore = _command(settings, "restore", "--snapshot", target.snapshot_id)
            recovery = (f"recover: `{restore}` then `{_run_command(settings)}` (re-processes "
                        "the landing files that came after it)")
        elif not snapshots:
            recovery = ("no snapshot can restore it (there is none, or every one was taken "
                        f"before a table was re-created): {finding.lost}; take snapshots from "
                        "now on (`sessionlake snapshot`, DAG sessionlake_snapshot)")
        elif (broken := restore_target([finding], snapshots)) is not None:
            recovery = (f"no snapshot can restore it: those that predate it (newest: "
                        f"{broken.snapshot_id}) cannot be restored, files they need are gone "
                        f"(`sessionlake snapshot --list` says which): {finding.lost}; take "
                        "a new one now (`sessionlake snapshot`)")
        else:
            newest = snapshots[-1]
            held = newest.table_versions.get(finding.subject)
            holds = "" if held is None else f", which holds {finding.subject} v{held}"
            recovery = (f"no snapshot predates this damage (newest: {newest.snapshot_id}{holds})"
                        f"; {finding.lost}")
        advised.append(replace(finding, recovery=recovery))
    return advised


def check_lake(spark: SparkSession | None, settings: Settings) -> HealthReport:
    """Run every check on the lake and its checkpoint, read-only.

    ``spark`` may be ``None`` when lake and checkpoint are local folders.

    :raises DoctorError: when there is no lake at ``settings.lake``.
    """
    lake = settings.lake
    try:
        noted = noted_input_format(settings.checkpoint, spark)
    except (ValueError, KeyError, TypeError):
        noted = None  # a format note that does not parse: its run would say so
    if noted is not None:
        settings = settings.with_overrides(input_format=noted)
    if not any(storage.exists(spark, table_path(lake, t)) for t in STREAM_TABLES):
        raise DoctorError(no_lake_message(lake))
    findings: list[Finding] = []
    logs: dict[str, TableLog] = {}
    for table in STREAM_TABLES:
        logs[table], table_findings = check_table(spark, lake, table)
        findings += table_findings
    if storage.exists(spark, table_path(lake, RETENTION_AUDIT)):  # else the next run makes it
        findings += check_table(spark, lake, RETENTION_AUDIT)[1]
    given = checkpoint_key(settings.checkpoint)
    elsewhere = [checkpoint for checkpoint in lake_streams(spark, lake)
                 if checkpoint != given and storage.exists(spark, f"{checkpoint}/spark")]
    findings = check_checkpoint(spark, settings.checkpoint,
                                _batches_ran(logs[BATCH_METRICS]), elsewhere,
                                running_stream(settings)) \
        + check_source_folder(spark, settings) + findings \
        + check_versions_the_stream_saw(spark, settings.checkpoint, logs)
    try:
        # A snapshot older than a table's creation cannot restore it (restore refuses).
        created = max((log.created_ms or 0 for log in logs.values()), default=0) / 1000
        snapshots = [s for s in list_snapshots(lake, spark)
                     if s.created.timestamp() >= created]
    except (ValueError, TypeError) as error:  # a manifest that does not parse
        findings.append(Finding(SNAPSHOTS, f"a snapshot manifest does not read ({error})",
                                snapshots_root(lake)))
        snapshots = []
    unusable = unrestorable_snapshots(lake, snapshots)
    if all(f.ok for f in findings):  # else the damage found says why, once
        findings += unusable
    return HealthReport(tuple(advise(findings, settings, snapshots,
                                     unusable={f.lost for f in unusable})))


#: Why a snapshot cannot be restored, as far as the doctor can tell: its files are gone,
#: and it cannot tell a forced VACUUM from a hand.
_GONE = "files it needs are gone: a forced VACUUM, or a hand, removed them"


def _unrestorable_recovery(snapshot_id: str, settings: Settings,
                           snapshots: Sequence[Snapshot], usable: Sequence[Snapshot]) -> str:
    """What to do with a snapshot that cannot be restored: move it out of the lake, and take
    a new restore point unless one was taken since (then no command is left to run)."""
    unusable = next((s for s in snapshots if s.snapshot_id == snapshot_id), None)
    since = [s.snapshot_id for s in usable
             if unusable is not None and s.created > unusable.created]
    if since:
        return (f"move this folder out of the lake ({_GONE}); "
                f"snapshot {since[-1]}, taken since, is a restore point")
    return (f"recover: `{_command(settings, 'snapshot')}` for a new restore point, and move "
            f"this folder out of the lake ({_GONE})")


def unrestorable_snapshots(lake: str, snapshots: Sequence[Snapshot]) -> list[Finding]:
    """A finding for each snapshot whose tables can no longer return to their versions (a
    forced VACUUM removed files they need): a restore point that ``restore`` would refuse
    must not pass for one, nor be advised as the way to recover. Checked for a lake on
    this machine, as ``snapshot --list`` and the health page do."""
    if storage.local_path(lake) is None:
        return []
    listed: dict[str, dict[str, int]] = {}  # each table's files, listed once for all
    found = []
    for snapshot in snapshots:
        why = unrestorable_versions(lake, snapshot.table_versions, listed)
        if why is not None:
            found.append(Finding(SNAPSHOTS, f"cannot be restored ({why})",
                                 f"{snapshots_root(lake)}/{snapshot.snapshot_id}",
                                 lost=snapshot.snapshot_id, damage=False))
    return found

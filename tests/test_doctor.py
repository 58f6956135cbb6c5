"""Damaged state: the doctor names each damage and its recovery, and the recovery works.

One lake is built per module by a real stream (two micro-batches, a snapshot between them)
and copied per test before it is damaged. Its open sessions hold every case the rebuild
must get right: a run split by the maximum duration whose first chunk closed, a session
bridged from two open ones, sessions last changed in either batch.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import Row, SparkSession
from pyspark.testing import assertDataFrameEqual

from sessionlake.batch import BatchReport
from sessionlake.checkpoint import RESTORING_MARKER
from sessionlake.cli import main
from sessionlake.config import Settings, settings_from
from sessionlake.deltalog import clear_delta_cache, inspect_table, read_log
from sessionlake.doctor import Finding, advise, check_lake
from sessionlake.locks import checkpoint_lock, lake_lock
from sessionlake.rebuild import RebuildError, rebuild_open_sessions
from sessionlake.registry import register_stream
from sessionlake.snapshots import Snapshot, SnapshotError, create_snapshot, restore_snapshot
from sessionlake.stream import run_stream
from sessionlake.tables import OPEN_SESSIONS, RETENTION_AUDIT, read_table, table_path
from tests.helpers import NOW, all_sessions, event, held_by_another_process, hm, rows, run_batches

#: Batch 0 closes c's session and the bot's first one-hour chunk (watermark 10:35); the
#: bot's second chunk, both of b's sessions and s's stay open. Batch 1 bridges b's two
#: sessions, extends the bot's open chunk, opens n's, and brings a late event of c.
FILES = [
    [event("c", "08:00", "/"),
     event("bot", "09:00", "/"), event("bot", "09:25", "/a"), event("bot", "09:50", "/b"),
     event("bot", "10:15", "/c"), event("bot", "10:30", "/d"),
     event("b", "10:10", "/"), event("b", "10:40", "/x"), event("s", "10:20", "/")],
    [event("b", "10:25", "/y"), event("bot", "10:35", "/e"), event("n", "10:38", "/"),
     event("c", "08:10", "/late"), "{not json"],
]


@dataclass(frozen=True)
class BuiltLake:
    """The module's lake: where it is, how it was run, and the state the stream ended with."""

    root: Path
    snapshot_id: str
    open_rows: list[Row]

    def settings(self, root: Path | None = None) -> Settings:
        base = root or self.root
        return settings_from({"lake": str(base / "lake"), "source": str(base / "landing"),
                              "max_files_per_trigger": 1, "max_session_duration": "1h"},
                             env={})


@pytest.fixture(scope="module")
def built(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> BuiltLake:
    root = tmp_path_factory.mktemp("doctor")
    landing = root / "landing"
    landing.mkdir()
    for index, lines in enumerate(FILES):
        path = landing / f"part-{index:02d}.jsonl"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + 60 * index,) * 2)
    config = settings_from({"lake": str(root / "lake"), "source": str(landing),
                            "max_files_per_trigger": 1, "max_session_duration": "1h"}, env={})
    snapshots = []

    def snapshot_after_batch_0(report: BatchReport) -> None:
        # Called after batch 1's writes, before Spark commits it: the copy holds batch 0.
        if report.row["batch_id"] == 1:
            snapshots.append(create_snapshot(spark, config))

    run_stream(spark, config, clock=lambda: NOW, on_batch=snapshot_after_batch_0)
    open_rows = read_table(spark, config.lake, OPEN_SESSIONS).collect()
    return BuiltLake(root, snapshots[0].snapshot_id, open_rows)


@pytest.fixture
def copy(built: BuiltLake, tmp_path: Path) -> Settings:
    """A copy of the module's lake, landing folder and checkpoint, to damage. Its source
    is the module's landing folder, which the copied checkpoint names by path."""
    shutil.copytree(built.root, tmp_path, dirs_exist_ok=True)
    return built.settings(tmp_path).with_overrides(source=str(built.root / "landing"))


def test_the_module_lake_holds_the_cases(built: BuiltLake) -> None:
    by_user = {r["user_id"]: r for r in built.open_rows}
    assert sorted(by_user) == ["b", "bot", "n", "s"]
    bot, bridged = by_user["bot"], by_user["b"]
    assert (bot["session_start"], bot["run_start"], bot["event_count"]) == (
        hm("10:15"), hm("09:00"), 3)  # chunk 2 of a run whose first chunk closed
    assert (bridged["session_start"], bridged["session_end"], bridged["event_count"]) == (
        hm("10:10"), hm("10:40"), 3)  # two open sessions bridged by 10:25
    assert {u: r["updated_batch_id"] for u, r in by_user.items()} == {
        "b": 1, "bot": 1, "n": 1, "s": 0}


def test_a_healthy_lake_passes_every_check(
    built: BuiltLake, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--lake", str(built.root / "lake")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == ["ok"] * 9 + ["healthy:"]
    assert any(line.split()[:2] == ["ok", "retention_audit:"] for line in lines), lines
    assert "last committed batch 1" in lines[0]


# --- Each kind of damage: detected, named, and given the right recovery -------------------

def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _newest_commit(settings: Settings, table: str) -> Path:
    version = read_log(None, table_path(settings.lake, table)).newest_version
    return Path(table_path(settings.lake, table)) / "_delta_log" / f"{version:020d}.json"


def _file_added_last(settings: Settings, table: str) -> str:
    log = read_log(None, table_path(settings.lake, table))
    return max(log.files.values(), key=lambda f: f.version or -1).path


def delete_checkpoint(settings: Settings) -> str:
    shutil.rmtree(settings.checkpoint)
    return settings.checkpoint


def corrupt_offsets(settings: Settings) -> str:
    offsets = Path(settings.checkpoint) / "spark" / "offsets" / "1"
    offsets.write_text('v1\n{"batchWatermarkMs":0,"batchTimest')
    return "spark/offsets/1"


def garble_source_log(settings: Settings) -> str:
    log = Path(settings.checkpoint) / "spark" / "sources" / "0"
    newest = max((p for p in log.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    newest.write_text('v1\n{"path":"file:///landing/a.js')  # cut off mid-line
    return f"spark/sources/0/{newest.name}"


def delete_newest_events_commit(settings: Settings) -> str:
    commit = _newest_commit(settings, "events")
    commit.unlink()
    return f"_delta_log/{commit.name}"


def delete_newest_state_commit_and_its_crc(settings: Settings) -> str:
    """As a hand clean-up does: Hadoop's hidden .NNN.json.crc stays, and fails the next
    commit of that version."""
    commit = _newest_commit(settings, OPEN_SESSIONS)
    commit.unlink()
    commit.with_suffix(".crc").unlink()
    assert (commit.parent / f".{commit.name}.crc").exists()
    return f"_delta_log/{commit.name}"


def delete_newest_state_commit_and_every_checksum(settings: Settings) -> str:
    """Nothing in the log shows it: only the stream's ledger says that version existed."""
    commit = _newest_commit(settings, OPEN_SESSIONS)
    for path in (commit, commit.with_suffix(".crc"), commit.parent / f".{commit.name}.crc"):
        path.unlink()
    return f"_delta_log/{commit.name}"


def delete_first_state_commit(settings: Settings) -> str:
    (Path(table_path(settings.lake, OPEN_SESSIONS)) / "_delta_log"
     / f"{1:020d}.json").unlink()
    return f"_delta_log/{1:020d}.json"


def delete_state_folder(settings: Settings) -> str:
    shutil.rmtree(table_path(settings.lake, OPEN_SESSIONS))
    return "_delta_log"


def truncate_events_file(settings: Settings) -> str:
    name = _file_added_last(settings, "events")
    _truncate(Path(table_path(settings.lake, "events")) / name)
    return name


def truncate_state_file(settings: Settings) -> str:
    name = _file_added_last(settings, OPEN_SESSIONS)
    _truncate(Path(table_path(settings.lake, OPEN_SESSIONS)) / name)
    return name


def half_write_changelog_commit(settings: Settings) -> str:
    commit = _newest_commit(settings, "session_changelog")
    _truncate(commit)
    return f"_delta_log/{commit.name}"


@pytest.mark.parametrize(
    ("damage", "subject", "problem", "recovery"),
    [
        (delete_checkpoint, "checkpoint", "is missing", "restore"),
        (corrupt_offsets, "checkpoint", "not complete JSON", "restore"),
        (garble_source_log, "checkpoint", "not complete JSON", "restore"),
        (delete_newest_events_commit, "events", "missing Delta log entry", "restore"),
        (delete_newest_state_commit_and_its_crc, OPEN_SESSIONS, "missing Delta log entry",
         "rebuild-state"),
        (delete_newest_state_commit_and_every_checksum, OPEN_SESSIONS,
         "the newest entries were deleted", "rebuild-state"),
        (delete_first_state_commit, OPEN_SESSIONS, "missing Delta log entry", "rebuild-state"),
        (delete_state_folder, OPEN_SESSIONS, "table folder is missing", "rebuild-state"),
        (truncate_events_file, "events", "half-written", "restore"),
        (truncate_state_file, OPEN_SESSIONS, "half-written", "rebuild-state"),
        (half_write_changelog_commit, "session_changelog", "half-written commit", "restore"),
    ],
    ids=lambda value: getattr(value, "__name__", None),
)
def test_damage_is_named_with_its_recovery(
    built: BuiltLake, copy: Settings, damage: Callable[[Settings], str], subject: str,
    problem: str, recovery: str,
) -> None:
    broken = damage(copy)
    report = check_lake(None, copy)
    assert not report.healthy
    [finding] = [f for f in report.findings if not f.ok]
    assert (finding.subject, finding.detail) == (subject, broken)
    assert problem in (finding.problem or "")
    command = (f"sessionlake restore --lake {copy.lake} --snapshot {built.snapshot_id}"
               if recovery == "restore" else f"sessionlake rebuild-state --lake {copy.lake}")
    assert f"recover: `{command}`" in finding.line()
    assert report.lines()[-1].startswith("damaged: 1 problem(s); recover with: " + command)


def test_a_damaged_retention_audit_is_named_with_no_restore(copy: Settings) -> None:
    """No snapshot holds the audit (erasures outlive restores): a restore is not offered for
    it, and the way out says what is lost and what stays done."""
    commit = _newest_commit(copy, RETENTION_AUDIT)
    commit.write_text("garbage")
    report = check_lake(None, copy)
    [finding] = [f for f in report.findings if not f.ok]
    assert (finding.subject, finding.detail) == (RETENTION_AUDIT, f"_delta_log/{commit.name}")
    assert "sessionlake restore" not in (finding.recovery or "")
    assert f"Move {table_path(copy.lake, RETENTION_AUDIT)} aside" in (finding.recovery or "")
    assert report.lines()[-1] == "damaged: 1 problem(s); no command recovers it"


def test_a_moved_landing_folder_is_named_with_the_run_that_still_works(
    built: BuiltLake, copy: Settings, tmp_path: Path
) -> None:
    moved = copy.with_overrides(source=str(tmp_path / "landing"))
    report = check_lake(None, moved)
    [finding] = [f for f in report.findings if not f.ok]
    assert (finding.subject, finding.detail) == (
        "checkpoint", f"{moved.checkpoint}/spark/sources/0")
    assert f"read from {built.root / 'landing'}, not from --source {tmp_path / 'landing'}" \
        in (finding.problem or "")
    command = f"sessionlake run --lake {copy.lake} --source {built.root / 'landing'}"
    assert f"recover: `{command}` (a symbolic link" in finding.line()
    assert report.lines()[-1] == f"not damaged, but 1 problem(s); recover with: {command}"
    assert check_lake(None, copy).healthy


def test_a_stream_on_another_checkpoint_is_named_not_taken_for_a_lost_one(
    spark: SparkSession, copy: Settings, tmp_path: Path
) -> None:
    """Asked without the `--checkpoint` the stream ran with, the doctor finds the lake's
    stream where the lake noted it, and says to look there, not to restore."""
    elsewhere = str(tmp_path / "elsewhere")
    shutil.move(copy.checkpoint, elsewhere)
    register_stream(spark, copy.lake, elsewhere)  # as a run there did
    report = check_lake(None, copy)
    [finding] = [f for f in report.findings if not f.ok]
    assert (finding.subject, finding.detail) == ("checkpoint", copy.checkpoint)
    assert finding.problem == f"is not here; the lake's stream ran on: {elsewhere}"
    command = f"sessionlake doctor --lake {copy.lake} --checkpoint {elsewhere}"
    assert report.lines()[-1] == f"damaged: 1 problem(s); recover with: {command}"
    assert check_lake(None, copy.with_overrides(checkpoint=elsewhere)).healthy


def test_a_stream_writing_the_lake_is_named_whatever_its_checkpoint(
    copy: Settings, tmp_path: Path
) -> None:
    """Files may change while the doctor reads them: it says which stream is writing."""
    elsewhere = tmp_path / "elsewhere"
    with held_by_another_process("stream_locks", copy.lake, elsewhere) as run:
        report = check_lake(None, copy)
    assert report.healthy
    assert (f"in use by a running stream (pid {run.pid} on checkpoint {elsewhere}): files "
            "may change while read") in report.findings[0].detail
    assert "in use" not in check_lake(None, copy).findings[0].detail  # and no longer


def test_a_snapshot_of_a_half_written_log_is_refused_naming_the_doctor(
    spark: SparkSession, copy: Settings
) -> None:
    broken = half_write_changelog_commit(copy)
    with pytest.raises(SnapshotError, match=f"{re.escape(broken)} is half-written.*doctor"):
        create_snapshot(spark, copy)


def test_damage_before_every_snapshot_says_what_is_lost(copy: Settings) -> None:
    """The first events commit of the stream predates the snapshot: restoring cannot help."""
    (Path(table_path(copy.lake, "events")) / "_delta_log" / f"{1:020d}.json").unlink()
    [finding] = [f for f in check_lake(None, copy).findings if not f.ok]
    assert "no snapshot predates this damage" in finding.line()
    assert "events from version 1 on cannot be read" in finding.line()


def test_rebuild_state_is_not_advised_while_a_table_it_reads_is_lost(copy: Settings) -> None:
    """rebuild-state refuses while events is damaged (naming the doctor): the doctor must
    not send the user to it then, round and round."""
    (Path(table_path(copy.lake, "events")) / "_delta_log" / f"{1:020d}.json").unlink()
    truncate_state_file(copy)
    report = check_lake(None, copy)
    [state] = [f for f in report.findings if not f.ok and f.subject == OPEN_SESSIONS]
    assert "recover:" not in (state.recovery or "")
    assert "recomputes it once events is whole again, which no command here can make it" \
        in state.line()
    assert report.lines()[-1] == "damaged: 2 problem(s); no command recovers it"


# --- rebuild-state --------------------------------------------------------------------------

@pytest.mark.parametrize("damage", ["log entry missing", "file truncated"])
def test_rebuild_state_gives_the_open_sessions_the_stream_had(
    spark: SparkSession, built: BuiltLake, copy: Settings, damage: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    state = Path(table_path(copy.lake, OPEN_SESSIONS))
    if damage == "log entry missing":
        delete_first_state_commit(copy)
        report = rebuild_open_sessions(spark, copy)
        assert report.moved_to is not None
        assert Path(report.moved_to).name.startswith("open_sessions.damaged-")
        assert (Path(report.moved_to) / "_delta_log" / f"{2:020d}.json").exists()
        # The new table's versions are not the old snapshot's: restoring it is refused.
        with pytest.raises(SnapshotError, match="open_sessions was created after snapshot"):
            restore_snapshot(spark, copy, built.snapshot_id)
        assert not (Path(copy.checkpoint) / RESTORING_MARKER).exists()
    else:
        truncate_state_file(copy)
        assert main(["rebuild-state", "--lake", copy.lake, "--max-session-duration", "1h",
                     "--shuffle-partitions", "2"]) == 0
        assert "rebuilt open_sessions v3: 4 open session(s) from 8 event(s)" in \
            capsys.readouterr().out
    rebuilt = read_table(spark, copy.lake, OPEN_SESSIONS)
    assertDataFrameEqual(rebuilt, spark.createDataFrame(built.open_rows, rebuilt.schema))
    assert read_log(None, str(state)).configuration["sessionlake.userBuckets"] == "16"
    assert check_lake(None, copy).healthy


@pytest.mark.parametrize("rebuilt", [True, False])
def test_rebuild_state_mends_the_run_start_an_earlier_release_left(
    spark: SparkSession, tmp_path: Path, rebuilt: bool
) -> None:
    """Before the fix of 2026-12-05, 10:12 bridging bot's two runs left the open session
    10:15-10:17 with ``run_start`` 10:15 (test_batch.py's case): rebuilt, it gets 10:00 and
    later batches cut the run as one batch does; left as it was, they cut from 10:15."""
    cfg = {"gap": "10m", "grace": "3m", "max_session_duration": "14m"}

    def bot(*ats: str) -> list[str]:
        return [event("bot", at, event_id=at) for at in ats]

    batches = [bot("10:00", "10:05", "10:15", "10:17"), bot("10:12"), [event("x", "10:26")],
               bot("10:24", "10:28")]
    one = settings_from({"lake": str(tmp_path / "one"), **cfg}, env={})
    run_batches(spark, one, [[line for b in batches for line in b]])
    many = settings_from({"lake": str(tmp_path / "many"), **cfg}, env={})
    run_batches(spark, many, batches[:2])
    DeltaTable.forPath(spark, table_path(many.lake, OPEN_SESSIONS)).update(
        "session_start = '2026-01-05 10:15:00'", {"run_start": "session_start"})
    if rebuilt:
        rebuild_open_sessions(spark, many)
    state = read_table(spark, many.lake, OPEN_SESSIONS).where("user_id = 'bot'")
    assert rows(state, "session_start", "run_start") == [
        (hm("10:00"), hm("10:00")), (hm("10:15"), hm("10:00") if rebuilt else hm("10:15"))]
    run_batches(spark, many, batches[2:], first_batch_id=2)
    bot_sessions = [rows(all_sessions(spark, s.lake).where("user_id = 'bot'"),
                         "session_start", "session_end", "event_count") for s in (one, many)]
    assert bot_sessions[0] == [
        (hm("10:00"), hm("10:12"), 3), (hm("10:15"), hm("10:24"), 3), (hm("10:28"), hm("10:28"), 1),
    ]
    assert (bot_sessions[1] == bot_sessions[0]) is rebuilt


@pytest.mark.parametrize("cause", ["stream running", "stream on another checkpoint",
                                   "batch unfinished", "events damaged"])
def test_rebuild_state_refuses_and_changes_nothing(
    spark: SparkSession, copy: Settings, cause: str
) -> None:
    before = sorted(os.listdir(Path(table_path(copy.lake, OPEN_SESSIONS)) / "_delta_log"))
    if cause == "stream running":
        with checkpoint_lock(copy.checkpoint), pytest.raises(RebuildError, match="stopped"):
            rebuild_open_sessions(spark, copy)
    elif cause == "stream on another checkpoint":
        with lake_lock(copy.lake, f"{copy.checkpoint}-2"), \
                pytest.raises(RebuildError, match="stopped"):
            rebuild_open_sessions(spark, copy)
    elif cause == "batch unfinished":
        identity = json.loads((Path(copy.checkpoint) / "sessionlake.json").read_text())
        ledger = Path(copy.checkpoint) / "ledger"
        entry = json.loads((ledger / f"{identity['stream_id']}-0-1.json").read_text())
        (ledger / f"{identity['stream_id']}-0-2.json").write_text(
            json.dumps({**entry, "done": False}))
        with pytest.raises(RebuildError, match=r"batch 2 was cut off.*sessionlake run"):
            rebuild_open_sessions(spark, copy)
    else:
        truncate_events_file(copy)
        with pytest.raises(RebuildError, match=r"events is damaged.*sessionlake doctor"):
            rebuild_open_sessions(spark, copy)
    assert sorted(os.listdir(Path(table_path(copy.lake, OPEN_SESSIONS)) / "_delta_log")) \
        == before


# --- The printed recovery, end to end -----------------------------------------------------------

def test_the_printed_restore_recovers_damaged_checkpoint_and_logs_and_the_run_resumes(
    spark: SparkSession, built: BuiltLake, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The checkpoint deleted, the newest commit of events lost and that of the changelog
    half-written: one restore repairs all three (the damaged log entries are moved aside so
    that Delta can read the logs), and the run that follows ends where the stream had.

    On the module's lake itself, since the checkpoint names its landing files by path; it is
    put back afterwards.
    """
    pristine = tmp_path / "pristine"
    shutil.copytree(built.root, pristine)
    config = built.settings()
    try:
        delete_checkpoint(config)
        delete_newest_events_commit(config)
        half_write_changelog_commit(config)
        assert main(["doctor", "--lake", config.lake, "--source", config.source or ""]) == 1
        out = capsys.readouterr().out
        errors = [line for line in out.splitlines() if line.startswith("ERROR")]
        assert len(errors) == 3
        assert all(f"--snapshot {built.snapshot_id}`" in line for line in errors)
        [command] = re.findall(r"recover with: (sessionlake restore [^;]+);", out)
        assert main([*shlex.split(command)[1:], "--shuffle-partitions", "2"]) == 0
        assert main(["doctor", "--lake", config.lake]) == 0
        assert [r["batch_id"] for r in run_stream(spark, config, clock=lambda: NOW).processed] \
            == [1]
        for table in (OPEN_SESSIONS, "events", "session_changelog"):
            assertDataFrameEqual(read_table(spark, config.lake, table),
                                 read_table(spark, str(pristine / "lake"), table))
    finally:
        shutil.rmtree(built.root)
        shutil.copytree(pristine, built.root)
        clear_delta_cache(spark)


# --- The log reader on what the module's lake does not have -----------------------------------

def test_checkpoints_and_deletion_vectors_are_read_like_delta_reads_them(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = str(tmp_path / "t")
    spark.sql(f"CREATE TABLE delta.`{path}` (id INT) USING DELTA TBLPROPERTIES "
              "('delta.enableDeletionVectors' = 'true', 'delta.checkpointInterval' = '2')")
    spark.range(10).selectExpr("CAST(id AS INT) AS id").coalesce(1).write.format("delta") \
        .mode("append").save(path)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 3")  # v2 and its checkpoint
    spark.sql(f"DELETE FROM delta.`{path}` WHERE id = 4")  # v3: a new deletion vector
    log = inspect_table(None, path)
    assert (log.checkpoint_version, log.damage) == (2, [])
    delta_files = {Path(f).name for f in spark.read.format("delta").load(path).inputFiles()}
    assert {Path(f.path).name for f in log.files.values()} == delta_files
    [live] = log.files.values()
    assert live.deletion_vector is not None
    for vector in Path(path).glob("deletion_vector_*.bin"):
        _truncate(vector)
    [damage] = inspect_table(None, path).damage
    assert "deletion vector" in damage.problem and not damage.in_log


def _snapshot(snapshot_id: str, sessions_version: int) -> Snapshot:
    return Snapshot(snapshot_id, "2026-01-05T10:00:00Z", None, "stream", 1, 0,
                    {"sessions": sessions_version})


@pytest.mark.parametrize(("unusable", "recovery"), [
    (set(), "recover: `sessionlake restore --lake /l --snapshot s2` then `sessionlake run "),
    ({"s2"}, "recover: `sessionlake restore --lake /l --snapshot s1` then `sessionlake run "),
    ({"s1", "s2"}, "no snapshot can restore it: those that predate it (newest: s2) cannot "
                   "be restored, files they need are gone (`sessionlake snapshot --list` says "
                   "which): sessions since v5; take a new one now (`sessionlake snapshot`)"),
])
def test_a_snapshot_that_cannot_be_restored_is_never_advised(
    unusable: set[str], recovery: str
) -> None:
    damage = Finding("sessions", "a data file is missing", "part-0.parquet", version=5,
                     lost="sessions since v5")
    snapshots = [_snapshot("s1", 2), _snapshot("s2", 3)]
    settings = settings_from({"lake": "/l"}, env={})
    [advised] = advise([damage], settings, snapshots, unusable=unusable)
    assert advised.recovery is not None and advised.recovery.startswith(recovery), \
        advised.recovery

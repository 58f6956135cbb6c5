"""The DAGs' param validators and command lines: plain functions, no Spark, no Airflow."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import date, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from sessionlake import locks
from sessionlake import orchestration as orch
from sessionlake.checkpoint import CONTINUOUS_LOG, CONTINUOUS_RUN, PID_FILE
from sessionlake.config import ConfigError
from sessionlake.erasure import user_hash
from sessionlake.spark import (
    COMMIT_FS_CONF,
    DRIVER_JIT_ENV,
    LOCAL_FS_CONF,
    LOCAL_FS_ENV,
    QUICK_START_JIT,
    QUICK_START_MAX_BATCHES,
    QUICK_START_MAX_BYTES,
    local_fs_jar,
)
from tests.helpers import flock_held, held_by_another_process

WHERE = orch.Locations(lake="/l", source="/in", checkpoint="/l/_checkpoints/stream")


@pytest.mark.parametrize(
    ("validate", "params", "expected"),
    [
        (orch.validate_microbatch_params, {"shuffle_partitions": 8}, orch.MicrobatchParams(8)),
        (orch.validate_microbatch_params, {"shuffle_partitions": "3"}, orch.MicrobatchParams(3)),
        (orch.validate_backfill_params,
         {"from_date": "2026-01-01", "to_date": "2026-01-01", "gap_minutes": 30},
         orch.BackfillParams(date(2026, 1, 1), date(2026, 1, 1), timedelta(minutes=30))),
        (orch.validate_backfill_params,  # a duration instead of minutes
         {"from_date": "2026-01-01", "to_date": "2026-01-31", "gap_minutes": "1h"},
         orch.BackfillParams(date(2026, 1, 1), date(2026, 1, 31), timedelta(hours=1))),
        # A bare number is minutes, a fraction too: "1.5" was 1.5 s (the Airflow review).
        *[(orch.validate_backfill_params,
           {"from_date": "2026-01-01", "to_date": "2026-01-01", "gap_minutes": minutes},
           orch.BackfillParams(date(2026, 1, 1), date(2026, 1, 1), gap))
          for minutes, gap in (("1.5", timedelta(seconds=90)), (" 45 ", timedelta(minutes=45)),
                               ("90s", timedelta(seconds=90)))],
        (orch.validate_compaction_params, {"min_files": 1}, orch.CompactionParams(1)),
        (orch.validate_snapshot_params, {"name": None}, orch.SnapshotParams(None)),
        (orch.validate_snapshot_params, {"name": "before-upgrade_2.1"},
         orch.SnapshotParams("before-upgrade_2.1")),
        (orch.validate_snapshot_params, {"name": None, "max_age_days": 30, "keep_last": "3"},
         orch.SnapshotParams(None, 30, 3)),
        (orch.validate_snapshot_params, {"max_age_days": None, "keep_last": None},
         orch.SnapshotParams(None)),
        (orch.validate_restore_params, {"snapshot_id": "20260105T101500Z-3f2a"},
         orch.RestoreParams("20260105T101500Z-3f2a")),
        (orch.validate_retention_params,  # duplicates erased once; 0 hours is allowed;
         # the ids go on as their SHA-256, which no task log then shows in clear
         {"erase_user_ids": ["u1", "u 2", "u1"], "sessions_max_age_days": 1,
          "events_max_age_days": None, "vacuum_retain_hours": 0},
         orch.RetentionParams((user_hash("u1"), user_hash("u 2")), 1, None, 0)),
        (orch.validate_retention_params, {"dry_run": True, "vacuum_retain_hours": 168},
         orch.RetentionParams((), None, None, 168, dry_run=True)),
        (orch.validate_retention_params,  # by hash, in either case; once with the id's own
         {"erase_user_sha256": [user_hash("u3").upper(), user_hash("u1")],
          "erase_user_ids": ["u1"]},
         orch.RetentionParams((user_hash("u1"), user_hash("u3")), None, None, None)),
        (orch.validate_restart_params, {"shuffle_partitions": 2, "master": "local[2]"},
         orch.RestartParams(2, "local[2]")),
        (orch.validate_restart_params, {"shuffle_partitions": 2, "master": "local[*]"},
         orch.RestartParams(2, "local[*]")),
        (partial(orch.validate_restart_params, connection_master="spark://m1:7077,m2:7077"),
         {"shuffle_partitions": 64, "master": "spark://m1:7077,m2:7077"},
         orch.RestartParams(64, "spark://m1:7077,m2:7077")),
    ],
)
def test_good_params_are_typed(
    validate: Callable[[dict[str, Any]], Any], params: dict[str, Any], expected: Any
) -> None:
    assert validate(params) == expected


def test_restart_moves_the_stream_only_to_a_master_its_operators_named(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever may trigger the DAG must not send the stream, with its Kafka credentials,
    to a cluster of their own."""
    params = {"shuffle_partitions": 2, "master": "spark://elsewhere:7077"}
    with pytest.raises(ValueError, match=r"master='spark://elsewhere:7077' is invalid: is "
                       r"neither local nor the spark_default connection's master; list .*"
                       r"SESSIONLAKE_RESTART_MASTERS"):
        orch.validate_restart_params(params, "spark://m:7077")
    monkeypatch.setenv("SESSIONLAKE_RESTART_MASTERS",
                       "spark://other:7077 spark://elsewhere:7077")
    assert orch.validate_restart_params(params, "spark://m:7077") == orch.RestartParams(
        2, "spark://elsewhere:7077")


def test_a_restart_to_a_master_that_does_not_answer_names_the_dag_s_param() -> None:
    """It named ``--master, SESSIONLAKE_MASTER``, which the DAG's run does not read (a review)."""
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        master = f"spark://127.0.0.1:{unused.getsockname()[1]}"
    with pytest.raises(ConfigError) as refused:
        orch.check_restart_master_answers(master)
    assert str(refused.value).startswith(f"the Spark master {master} does not answer (")
    assert str(refused.value).endswith(
        "start it, or give the master it listens as (the DAG's param master; empty: the "
        "spark_default connection's)")


@pytest.mark.parametrize("master", ["", "  ", None])
def test_restart_without_a_master_runs_where_the_connection_points(master: str | None) -> None:
    params = {"shuffle_partitions": 2, "master": master}
    assert orch.validate_restart_params(params, "spark://m:7077") == orch.RestartParams(
        2, "spark://m:7077")
    with pytest.raises(ValueError, match="master"):
        orch.validate_restart_params(params)  # no connection either


@pytest.mark.parametrize("params", [
    {"erase_user_sha256": ["alice@example.com"]},
    {"erase_user_sha256": "alice@example.com"},
    {"erase_user_ids": ["alice@example.com", ""]},
])
def test_params_that_may_hold_a_user_id_are_not_repeated_in_their_error(
    params: dict[str, Any]
) -> None:
    """The error goes to the task's log; a person being erased must not."""
    with pytest.raises(ValueError, match=r"param erase_user_\w+=.* is invalid") as error:
        orch.validate_retention_params(params)
    assert "alice" not in str(error.value)


def test_an_unknown_param_is_named_without_its_value() -> None:
    """A misspelt erase_user_ids holds the ids of people being erased."""
    error = orch.unknown_param("erase_users", ["erase_user_ids"])
    assert str(error) == ("param erase_users is invalid: no such param (this DAG's: "
                          "erase_user_ids)")


@pytest.mark.parametrize(
    ("validate", "params", "message"),
    [
        (orch.validate_microbatch_params, {"shuffle_partitions": 0}, "shuffle_partitions=0"),
        (orch.validate_microbatch_params, {"shuffle_partitions": "many"}, "whole number"),
        (orch.validate_microbatch_params, {"shuffle_partitions": True}, "shuffle_partitions"),
        (orch.validate_microbatch_params, {}, "shuffle_partitions=None"),
        (orch.validate_backfill_params,
         {"from_date": "2026-02-01", "to_date": "2026-01-01", "gap_minutes": 30},
         "from_date='2026-02-01' is invalid: must not be after to_date='2026-01-01'"),
        (orch.validate_backfill_params,
         {"from_date": "01/02/2026", "to_date": "2026-01-01", "gap_minutes": 30},
         "from_date='01/02/2026' is invalid: must be an ISO date"),
        (orch.validate_backfill_params,
         {"from_date": "2026-01-01", "to_date": "2026-13-01", "gap_minutes": 30}, "to_date"),
        (orch.validate_backfill_params,
         {"from_date": "2026-01-01", "to_date": "2026-01-02", "gap_minutes": "soon"},
         "gap_minutes='soon'"),
        *[(orch.validate_backfill_params,  # -5 said "must be a duration" (the Airflow review)
           {"from_date": "2026-01-01", "to_date": "2026-01-02", "gap_minutes": minutes},
           f"gap_minutes={minutes!r} is invalid: must be longer than 0")
          for minutes in (0, -5, "-5", " -1.5 ", "0.0")],
        (orch.validate_compaction_params, {"min_files": -1}, "min_files=-1"),
        (orch.validate_snapshot_params, {"name": "../../etc"}, "name='../../etc'"),
        (orch.validate_snapshot_params, {"name": "--lake=/elsewhere"}, "starting with a letter"),
        (orch.validate_snapshot_params, {"max_age_days": 0}, "max_age_days=0"),
        (orch.validate_snapshot_params, {"keep_last": "all"}, "keep_last='all'"),
        (orch.validate_restore_params, {"snapshot_id": ""}, "snapshot_id=''"),
        (orch.validate_restore_params, {"snapshot_id": "x'; DROP TABLE sessions"},
         "snapshot_id"),
        (orch.validate_retention_params, {"erase_user_ids": "u1"}, "must be a list"),
        (orch.validate_retention_params,  # the form with every field emptied
         {"erase_user_ids": [], "sessions_max_age_days": None, "events_max_age_days": None,
          "vacuum_retain_hours": None, "dry_run": True}, "the run would do nothing"),
        (orch.validate_retention_params, {"erase_user_ids": ["u1", " "]}, "' ' is not"),
        (orch.validate_retention_params, {"erase_user_ids": ["u1", "66.249.73.135 "]},
         "entry 2 begins or ends with white space"),
        (orch.validate_retention_params, {"sessions_max_age_days": 10**12},
         "sessions_max_age_days=1000000000000 is invalid: must be a whole number from 1 to "
         "36500"),
        (orch.validate_retention_params, {"vacuum_retain_hours": 10**15},
         "from 0 to 876000"),
        (orch.validate_snapshot_params, {"max_age_days": 36501}, "from 1 to 36500"),
        (orch.validate_compaction_params, {"min_files": 10**30}, "from 1 to 2147483647"),
        (orch.validate_retention_params, {"erase_user_ids": [7]}, "7 is not a non-empty"),
        (orch.validate_retention_params, {"erase_user_sha256": "ab"}, "must be a list"),
        (orch.validate_retention_params, {"erase_user_sha256": ["ab" * 31]},
         "is not a SHA-256 (64 hex digits)"),
        (orch.validate_retention_params, {"sessions_max_age_days": 0}, "sessions_max_age_days=0"),
        (orch.validate_retention_params, {"events_max_age_days": "x"}, "events_max_age_days"),
        (orch.validate_retention_params, {"vacuum_retain_hours": -1}, "vacuum_retain_hours=-1"),
        (orch.validate_retention_params, {"dry_run": "yes"}, "dry_run='yes'"),
        (orch.validate_restart_params, {"shuffle_partitions": 2, "master": "mesos://m:5050"},
         "master='mesos://m:5050'"),
        (orch.validate_restart_params, {"shuffle_partitions": 2, "master": "local[0]"}, "master"),
        (orch.validate_restart_params, {"shuffle_partitions": 0, "master": "local[2]"},
         "shuffle_partitions=0"),
        # Above a Java int: Spark refused it only after the restart DAG stopped the stream
        # (the Airflow review).
        (orch.validate_restart_params,
         {"shuffle_partitions": 2147483648, "master": "local[2]"},
         "shuffle_partitions=2147483648 is invalid: must be a whole number from 1 to "
         "2147483647"),
        (orch.validate_microbatch_params, {"shuffle_partitions": "99999999999999999999"},
         "from 1 to 2147483647"),
    ],
)
def test_bad_params_name_the_param_value_and_reason(
    validate: Callable[[dict[str, Any]], Any], params: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=r"param .* is invalid") as error:
        validate(params)
    assert message in str(error.value)


@pytest.mark.parametrize(("params", "env", "expected"), [
    ({"archive_to": " /archive ", "dry_run": True}, {orch.ARCHIVE_ROOTS_ENV: "/archive"},
     orch.ArchiveParams("/archive", True)),
    ({"archive_to": None}, {orch.ARCHIVE_ENV: "/from-env"},
     orch.ArchiveParams("/from-env", False)),
    ({"archive_to": "/from-env/2026"}, {orch.ARCHIVE_ENV: "/from-env"},
     orch.ArchiveParams("/from-env/2026", False)),
    ({"archive_to": "/b/old"}, {orch.ARCHIVE_ROOTS_ENV: "/a  /b"},
     orch.ArchiveParams("/b/old", False)),
    # A trigger may not send the landing files anywhere the workers may write.
    ({"archive_to": "/param"}, {orch.ARCHIVE_ENV: "/from-env"},
     "param archive_to='/param' is invalid: must lie inside SESSIONLAKE_ARCHIVE or a folder "
     "listed in SESSIONLAKE_ARCHIVE_ROOTS"),
    ({"archive_to": "/from-env/../elsewhere"}, {orch.ARCHIVE_ENV: "/from-env"},
     "must lie inside"),
    ({"archive_to": "/from-envy"}, {orch.ARCHIVE_ENV: "/from-env"}, "must lie inside"),
    ({"archive_to": "/a"}, {}, "; neither is set"),
    ({"archive_to": None}, {}, "param archive_to=None is invalid: name the folder"),
    ({"archive_to": "  "}, {}, "archive_to='  '"),
    ({"archive_to": "relative/dir"}, {}, "param archive_to='relative/dir' is invalid: must be "
                                         "an absolute path"),
    ({"archive_to": None}, {orch.ARCHIVE_ENV: "archive"}, "archive_to='archive'"),
    ({"archive_to": "/a", "dry_run": "yes"}, {orch.ARCHIVE_ROOTS_ENV: "/"},
     "param dry_run='yes' is invalid"),
])
def test_the_archive_folder_comes_from_the_param_else_the_environment(
    params: dict[str, Any], env: dict[str, str], expected: orch.ArchiveParams | str
) -> None:
    if isinstance(expected, str):
        with pytest.raises(ValueError, match="is invalid") as error:
            orch.validate_archive_params(params, env)
        assert expected in str(error.value)
    else:
        assert orch.validate_archive_params(params, env) == expected


def test_command_lines_keep_every_value_its_own_argument() -> None:
    retention = orch.RetentionParams(("a" * 64, "b" * 64), 30, None, 0)
    assert orch.retention_args(WHERE, retention) == [
        "retention", "--lake", "/l", f"--erase-user-sha256={'a' * 64}",
        f"--erase-user-sha256={'b' * 64}",
        "--sessions-max-age-days", "30", "--vacuum-retain-hours", "0",
    ]
    preview = orch.RetentionParams(("c" * 64,), None, None, 168, dry_run=True)
    assert orch.retention_args(WHERE, preview) == [
        "retention", "--lake", "/l", f"--erase-user-sha256={'c' * 64}",
        "--vacuum-retain-hours", "168", "--dry-run",
    ]
    backfill = orch.BackfillParams(date(2026, 1, 1), date(2026, 1, 2), timedelta(minutes=45))
    assert orch.backfill_args(WHERE, backfill) == [
        "backfill", "--lake", "/l", "--from", "2026-01-01", "--to", "2026-01-02", "--gap", "45m",
    ]
    assert orch.microbatch_args(WHERE, orch.MicrobatchParams(3)) == [
        "run", "--source", "/in", "--lake", "/l", "--checkpoint", "/l/_checkpoints/stream",
        "--trigger", "available-now", "--shuffle-partitions", "3",
    ]
    assert orch.continuous_run_args(WHERE, orch.RestartParams(8, "local[2]"))[-5:] == [
        "continuous", "--shuffle-partitions", "8", "--master", "local[2]",
    ]
    assert orch.snapshot_args(WHERE, orch.SnapshotParams("n1"))[-1] == "--name=n1"
    assert orch.snapshot_args(WHERE, orch.SnapshotParams(None, 30, 3))[-4:] == [
        "--max-age-days", "30", "--keep-last", "3"]
    assert "--keep-last" not in orch.snapshot_args(WHERE, orch.SnapshotParams(None, 30))
    assert orch.restore_args(WHERE, orch.RestoreParams("s1"))[-1] == "--snapshot=s1"
    assert orch.compaction_args(WHERE, orch.CompactionParams(5)) == [
        "compact", "--lake", "/l", "--min-files", "5",
    ]


def test_locations_come_from_the_environment(tmp_path: Path) -> None:
    env = {"SESSIONLAKE_LAKE": str(tmp_path / "lake"), "SESSIONLAKE_SOURCE": "in"}
    where = orch.locations_from_env(env)
    assert where.lake == str(tmp_path / "lake")
    assert where.checkpoint == f"{tmp_path / 'lake'}/_checkpoints/stream"
    assert Path(where.source or "").is_absolute()
    custom = orch.locations_from_env({**env, "SESSIONLAKE_CHECKPOINT": str(tmp_path / "cp")})
    assert custom.checkpoint == str(tmp_path / "cp")
    with pytest.raises(ValueError, match="SESSIONLAKE_LAKE"):
        orch.locations_from_env({})
    with pytest.raises(ValueError, match="SESSIONLAKE_SOURCE"):
        orch.microbatch_args(orch.locations_from_env({"SESSIONLAKE_LAKE": "/l"}),
                             orch.MicrobatchParams(1))


def test_spark_job_carries_the_delta_jars_and_the_interpreter() -> None:
    job = orch.spark_job(["sql", "SELECT 1"])
    assert job["args"] == ["sql", "SELECT 1"]
    assert "delta-spark_" in job["conf"]["spark.jars"]
    assert job["conf"]["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert Path(job["env"]["PYSPARK_PYTHON"]).exists()


def test_spark_job_leaves_an_administrators_tuning_to_spark_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """spark-submit takes its ``--conf`` over the file's: what the file sets is left out."""
    (tmp_path / "spark-defaults.conf").write_text(
        "spark.buffer.pageSize 4m\nspark.driver.memory 6g\nspark.sql.session.timeZone CET\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv("SESSIONLAKE_DRIVER_MEMORY", raising=False)
    conf = orch.spark_job(["sql", "SELECT 1"])["conf"]
    assert "spark.buffer.pageSize" not in conf
    assert conf["spark.driver.memory"] == "6g"
    assert conf["spark.sql.session.timeZone"] == "UTC"  # sessionlake's semantics need it


@pytest.mark.parametrize(
    ("lake", "checkpoint", "local"),
    [
        ("/l", "/l/_checkpoints/stream", True),
        ("file:///l", "file:///l/_checkpoints/stream", True),
        ("s3a://bucket/l", "s3a://bucket/l/_checkpoints/stream", False),
        ("/l", "hdfs://nn/checkpoints/stream", False),  # the checkpoint is copied too
        ("s3a://bucket/l", "/l/_checkpoints/stream", False),
    ],
)
def test_a_snapshot_or_restore_of_a_local_lake_runs_in_the_worker(
    lake: str, checkpoint: str, local: bool,
) -> None:
    where = orch.Locations(lake=lake, source=None, checkpoint=checkpoint)
    snapshot = orch.snapshot_job(where, orch.SnapshotParams("n"))
    restore = orch.restore_job(where, orch.RestoreParams("20260105T101500Z-abc123"))
    assert (snapshot["local"], restore["local"]) == (local, local)
    assert snapshot["args"][:3] == ["snapshot", "--lake", lake]
    assert restore["args"][:3] == ["restore", "--lake", lake]
    # Every other job is spark-submitted.
    assert not orch.spark_job(orch.compaction_args(where, orch.CompactionParams(1)))["local"]


def test_the_submitted_driver_imports_the_project_of_the_dags(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The package beside jobs/ first, ahead of any installed copy and of what was set before.
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    env = orch.spark_submit_env()
    assert env["PYTHONPATH"].split(":") == [str(orch.PROJECT_ROOT), "/elsewhere"]
    assert (orch.PROJECT_ROOT / "sessionlake" / "orchestration.py").is_file()
    assert orch.JOB_SCRIPT.parent.parent == orch.PROJECT_ROOT


def test_a_spark_submitted_driver_commits_through_the_local_file_system(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The DAGs' spark-submit, on whatever master Airflow's connection names, commits with
    the hard-link rename: a micro-batch and a compaction DAG run committing the same version
    of a table cannot both win it."""
    monkeypatch.delenv(LOCAL_FS_ENV, raising=False)
    conf = orch.spark_submit_conf()
    assert str(local_fs_jar()) in conf["spark.driver.extraClassPath"].split(os.pathsep)
    assert conf.items() >= COMMIT_FS_CONF.items()
    assert "spark.hadoop.fs.file.impl" not in conf
    monkeypatch.setenv(LOCAL_FS_ENV, "hadoop")
    assert not orch.spark_submit_conf().keys() & LOCAL_FS_CONF.keys()


def test_stream_position_reads_the_batch_tags_of_batch_metrics(tmp_path: Path) -> None:
    checkpoint, lake = tmp_path / "cp", tmp_path / "lake"
    checkpoint.mkdir()
    assert orch.stream_position(str(lake), str(checkpoint)) == orch.StreamPosition(None, -1)
    (checkpoint / "sessionlake.json").write_text('{"stream_id": "s1", "epoch": 0}')
    log = lake / "batch_metrics" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000001.json").write_text(
        '{"txn": {"appId": "sessionlake-s1-e0", "version": 4}}\n{"add": {}}\n')
    (log / "00000000000000000002.json").write_text(
        '{"txn": {"appId": "sessionlake-other-e0", "version": 9}}\n')
    assert orch.stream_position(str(lake), str(checkpoint)) == orch.StreamPosition("s1", 4)
    assert orch.running_pid(str(checkpoint)) is None
    # A restore to the snapshot after batch 1 bumps the epoch: batch ids start again at 2.
    (checkpoint / "sessionlake.json").write_text('{"stream_id": "s1", "epoch": 1}')
    assert orch.stream_position(str(lake), str(checkpoint)) == orch.StreamPosition("s1", -1)
    (log / "00000000000000000003.json").write_text(
        '{"txn": {"appId": "sessionlake-s1-e1", "version": 2}}\n')
    assert orch.stream_position(str(lake), str(checkpoint)) == orch.StreamPosition("s1", 2)
    # Commits are tagged in their userMetadata (the txn actions above are older lakes').
    tag = json.dumps({"batch_id": 3, "sessionlake": "sessionlake-s1-e1"})
    (log / "00000000000000000004.json").write_text(
        json.dumps({"commitInfo": {"operation": "WRITE", "userMetadata": tag}}) + "\n")
    assert orch.stream_position(str(lake), str(checkpoint)) == orch.StreamPosition("s1", 3)
    # Read from the newest commit back to the stream's last: the older ones are not read.
    (log / "00000000000000000002.json").write_text("not read")
    (log / "00000000000000000005.json").write_text('{"commitInfo": {"operation": "OPTIMIZE"}}')
    assert orch.stream_position(str(lake), str(checkpoint)) == orch.StreamPosition("s1", 3)


def test_a_resumed_stream_counts_only_batches_committed_while_the_new_run_holds_it(
    tmp_path: Path,
) -> None:
    """The restart and restore DAGs' last step: a batch a micro-batch DAG run committed
    between two of their tasks is no proof that the run they started resumed."""
    checkpoint, lake = tmp_path / "cp", tmp_path / "lake"
    checkpoint.mkdir()
    (checkpoint / "sessionlake.json").write_text('{"stream_id": "s1", "epoch": 0}')
    (checkpoint / CONTINUOUS_LOG).write_text("sessionlake run: refused, the checkpoint is held\n")
    log = lake / "batch_metrics" / "_delta_log"
    log.mkdir(parents=True)
    (log / "00000000000000000001.json").write_text(
        '{"txn": {"appId": "sessionlake-s1-e0", "version": 4}}\n')
    before = orch.StreamPosition("s1", 3)
    refused = subprocess.Popen(["true"])  # the new run, refused by the lock: it exited
    refused.wait()
    with held_by_another_process("checkpoint_lock", checkpoint) as microbatch:
        with pytest.raises(RuntimeError, match=f"pid {refused.pid}\\) exited"):
            orch.wait_for_resumed_stream(str(lake), str(checkpoint), before, refused.pid,
                                         timeout=30)
        # The run holding the checkpoint: its batch counts.
        assert orch.wait_for_resumed_stream(str(lake), str(checkpoint), before,
                                            microbatch.pid, timeout=30) == orch.StreamPosition(
            "s1", 4)


@pytest.mark.parametrize(("last_batch_id", "what"), [(-1, "no batch"),
                                                     (3, "no batch after batch 3")])
def test_a_resumed_run_that_commits_nothing_in_time_is_said_to_go_on(
    tmp_path: Path, last_batch_id: int, what: str
) -> None:
    """It said "committed no batch after -1", and not that the run it started goes on (the
    Airflow review: it committed its first batch two minutes later)."""
    checkpoint = tmp_path / "cp"
    checkpoint.mkdir()
    waiting = subprocess.Popen(["sleep", "30"])  # the new run, alive, no batch yet
    try:
        with pytest.raises(TimeoutError) as timed_out:
            orch.wait_for_resumed_stream(str(tmp_path / "lake"), str(checkpoint),
                                         orch.StreamPosition("s1", last_batch_id),
                                         waiting.pid, timeout=1)
    finally:
        waiting.kill()
        waiting.wait()
    assert str(timed_out.value) == (
        f"the new run (pid {waiting.pid}) has committed {what} within 1s "
        "(SESSIONLAKE_RESTART_TIMEOUT): is data arriving? The run goes on, and may commit "
        f"once data comes or its first batch ends (its log: {checkpoint / CONTINUOUS_LOG}); "
        "this failure stops nothing")


def test_a_small_landing_starts_the_micro_batch_driver_with_c1_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(DRIVER_JIT_ENV, raising=False)
    landing = tmp_path / "in"
    landing.mkdir()
    (landing / "a.jsonl").write_text("{}\n")
    where = orch.Locations(str(tmp_path / "lake"), str(landing), str(tmp_path / "cp"))

    def driver_options() -> str:
        return orch.microbatch_job(where, orch.MicrobatchParams(2))["conf"][
            "spark.driver.extraJavaOptions"]

    assert QUICK_START_JIT in driver_options()
    # Many small batches: each plans the same queries, which C2's code plans faster.
    for n in range(QUICK_START_MAX_BATCHES):
        (landing / f"more-{n}.jsonl").write_text("{}\n")
    monkeypatch.setenv("SESSIONLAKE_MAX_FILES_PER_TRIGGER", "1")
    assert QUICK_START_JIT not in driver_options()
    monkeypatch.delenv("SESSIONLAKE_MAX_FILES_PER_TRIGGER")
    assert QUICK_START_JIT in driver_options()  # one batch of them all
    with open(landing / "big.jsonl", "wb") as big:  # sparse: sized, not written
        big.truncate(QUICK_START_MAX_BYTES)
    assert QUICK_START_JIT not in driver_options()
    monkeypatch.setenv(DRIVER_JIT_ENV, "quick")
    assert QUICK_START_JIT in driver_options()


def test_only_the_restart_dag_s_run_is_stopped_for_a_restore(tmp_path: Path) -> None:
    """The restore DAG stops and starts again the continuous run the restart DAG noted
    (its pid and command line); a run from the command line holding the checkpoint is
    left alone, and the restore refused."""
    checkpoint = tmp_path / "cp"
    assert orch.stop_for_restore(str(checkpoint)) is None  # no run: nothing to start again
    args = ["run", "--trigger", "continuous", "--shuffle-partitions", "3"]
    with held_by_another_process("checkpoint_lock", checkpoint) as holder:
        (checkpoint / CONTINUOUS_RUN).write_text(json.dumps({"pid": holder.pid + 1,
                                                             "args": args}))
        with pytest.raises(ValueError, match=f"pid {holder.pid}, not the restart DAG's"):
            orch.stop_for_restore(str(checkpoint))
        assert holder.poll() is None
        (checkpoint / CONTINUOUS_RUN).write_text(json.dumps({"pid": holder.pid, "args": args}))
        # SIGTERM ends the holder (it has no handler): the checkpoint is let go of.
        assert orch.stop_for_restore(str(checkpoint), timeout=30) == args
        holder.wait(timeout=30)
    assert orch.running_pid(str(checkpoint)) is None


@pytest.mark.parametrize(("args", "continuous"), [
    (["sessionlake", "run", "--trigger", "continuous"], True),
    (["sessionlake", "run", "--trigger=continuous"], True),
    (["sessionlake", "run", "--trig", "continuous"], True),  # argparse takes a prefix
    (["sessionlake", "run", "--trig=continuous"], True),
    (["sessionlake", "run", "--trigger", "available-now"], False),
    (["sessionlake", "run"], False),
    (["sessionlake", "snapshot", "--name", "continuous"], False),  # another flag's value
    (["sessionlake", "run", "--checkpoint", "continuous"], False),
])
def test_a_continuous_run_is_told_by_its_command_line_as_the_parser_reads_it(
    args: list[str], continuous: bool
) -> None:
    """The diff review: ``--trig=continuous`` was taken for a run that ends by itself, and
    ``--name continuous`` for a continuous one."""
    assert orch.asks_continuous(args) is continuous


def test_a_restore_waits_for_a_run_that_ends_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A restore triggered while a scheduled micro-batch (no continuous run) holds the
    checkpoint waits for it to end instead of failing (the Airflow review); one that
    outlasts ``SESSIONLAKE_RESTART_TIMEOUT`` is refused, saying it ends by itself."""
    checkpoint = tmp_path / "cp"
    where = orch.Locations(lake="s3a://bucket/lake", source="/in", checkpoint=str(checkpoint))
    params = orch.RestoreParams("20260105T101500Z-3f2a")
    monkeypatch.setenv("SESSIONLAKE_RESTART_TIMEOUT", "1")
    with held_by_another_process("checkpoint_lock", checkpoint) as holder:
        with pytest.raises(ValueError, match=f"sessionlake pid {holder.pid} still holds "
                                             r"checkpoint .* after 1s .* It is no continuous"):
            orch.check_restore_possible(where, params)
        monkeypatch.setenv("SESSIONLAKE_RESTART_TIMEOUT", "60")
        threading.Timer(1.0, holder.kill).start()
        orch.check_restore_possible(where, params)  # the run ended: the checkpoint is free
        assert holder.poll() is not None
    # A continuous run the restart DAG did not start is no run to wait for.
    with flock_held(checkpoint / "sessionlake.lock", stubborn_run=True,
                    args=["run", "--trigger", "continuous"]) as holder:
        refusal = f"`kill -TERM {holder.pid}` stops it"
        with pytest.raises(ValueError, match=refusal):
            orch.check_restore_possible(where, params)


def test_a_micro_batch_waits_for_a_run_that_ends_by_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scheduled micro-batch beside a backlog run from the command line (an available-now
    run: it ends by itself) waits for it, then runs, instead of failing; one that outlasts
    ``SESSIONLAKE_RESTART_TIMEOUT`` fails it, saying so. A continuous run the restart DAG
    did not start is not waited for."""
    checkpoint = tmp_path / "cp"
    where = orch.Locations(lake=str(tmp_path / "lake"), source="/in", checkpoint=str(checkpoint))
    monkeypatch.setenv("SESSIONLAKE_RESTART_TIMEOUT", "1")
    with held_by_another_process("checkpoint_lock", checkpoint) as holder:
        with pytest.raises(ValueError, match=f"sessionlake pid {holder.pid} still holds "
                                             r"checkpoint .* after 1s .* It is no continuous"):
            orch.microbatch_skip_reason(where)
        monkeypatch.setenv("SESSIONLAKE_RESTART_TIMEOUT", "60")
        threading.Timer(1.0, holder.kill).start()
        assert orch.microbatch_skip_reason(where) is None  # it ended: the micro-batch runs
        assert holder.poll() is not None
    with flock_held(checkpoint / "sessionlake.lock", stubborn_run=True,
                    args=["run", "--trigger", "continuous"]) as holder:
        started = time.monotonic()
        with pytest.raises(ValueError, match="it is not the restart DAG's continuous run"):
            orch.microbatch_skip_reason(where)
        assert time.monotonic() - started < 30, "a continuous run is not waited for"


def test_the_pid_files_do_not_choose_whom_a_stop_signals(tmp_path: Path) -> None:
    """Whoever can write the checkpoint folder can write its pid files: the process that
    gets the SIGTERM is the one the kernel says holds the lock, and the restart DAG's note
    is taken only for that process (before, a `sleep` the files named was killed)."""
    checkpoint = tmp_path / "cp"
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        with held_by_another_process("checkpoint_lock", checkpoint) as holder:
            (checkpoint / PID_FILE).write_text(str(bystander.pid))
            (checkpoint / CONTINUOUS_RUN).write_text(json.dumps(
                {"pid": bystander.pid, "args": ["run", "--trigger", "continuous"]}))
            assert orch.running_pid(str(checkpoint)) == holder.pid
            assert orch.stop_restart_dag_run(str(checkpoint), timeout=30) is None
            assert orch.stop_continuous_run(str(checkpoint), timeout=30) == holder.pid
            assert holder.wait(timeout=30) == -signal.SIGTERM
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_without_the_kernel_s_word_the_holder_is_the_process_with_the_lock_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``/proc/locks`` names the lock's inode otherwise (a file system stacked on
    another), the pid file's process is taken as the holder only while it has the lock
    file open: a pid written there by anyone else is no process to signal."""
    monkeypatch.setattr(locks, "kernel_holder", lambda lock: 0)
    checkpoint = tmp_path / "cp"
    bystander = subprocess.Popen(["sleep", "600"])
    try:
        with held_by_another_process("checkpoint_lock", checkpoint) as holder:
            assert orch.running_holder(str(checkpoint)) == locks.Holder(holder.pid)
            (checkpoint / PID_FILE).write_text(str(bystander.pid))
            assert orch.running_holder(str(checkpoint)) == locks.Holder(
                bystander.pid, here=False)
            assert orch.running_pid(str(checkpoint)) is None
    finally:
        bystander.kill()
        bystander.wait()


def test_a_process_that_is_no_sessionlake_run_is_not_signalled(tmp_path: Path) -> None:
    """Whatever holds the lock when the stop looks (a reader's probe just after the run
    let go: the health page probes it in Airflow's API server) is signalled only if it
    runs sessionlake (the diff review)."""
    checkpoint = tmp_path / "cp"
    checkpoint.mkdir()
    with flock_held(checkpoint / "sessionlake.lock") as other:
        with pytest.raises(ValueError, match=f"pid {other.pid} holds the lock of checkpoint "
                                             ".* is no sessionlake process: not signalled"):
            orch.stop_continuous_run(str(checkpoint), timeout=5)
        assert other.poll() is None


@pytest.mark.parametrize(("value", "seconds"), [(None, 300.0), ("45", 45.0), ("10m", 600.0)])
def test_the_restart_timeout_is_seconds_or_a_duration(
    monkeypatch: pytest.MonkeyPatch, value: str | None, seconds: float
) -> None:
    if value is None:
        monkeypatch.delenv("SESSIONLAKE_RESTART_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("SESSIONLAKE_RESTART_TIMEOUT", value)
    assert orch.restart_timeout() == seconds


@pytest.mark.parametrize(("value", "said"), [
    ("five minutes", "must be a duration"),
    # 0 was taken: the restart DAG's stop gave up at once, and the stream stayed stopped
    # (the Airflow review).
    ("0", "must be longer than 0, got '0'"), ("0s", "must be longer than 0"),
    ("-5", "must be a duration"),
])
def test_a_bad_restart_timeout_is_named(
    monkeypatch: pytest.MonkeyPatch, value: str, said: str
) -> None:
    monkeypatch.setenv("SESSIONLAKE_RESTART_TIMEOUT", value)
    with pytest.raises(ConfigError, match=f"SESSIONLAKE_RESTART_TIMEOUT {said}"):
        orch.restart_timeout()


def test_a_stop_waits_as_long_as_the_restart_timeout_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every stop without a timeout of its own waits ``SESSIONLAKE_RESTART_TIMEOUT``: the
    scheduler container's end (``stop_restart_dag_run``) waited 300 s whatever it said."""
    checkpoint = tmp_path / "cp"
    checkpoint.mkdir()
    args = ["run", "--trigger", "continuous"]
    with flock_held(checkpoint / "sessionlake.lock", stubborn_run=True) as stubborn:
        (checkpoint / CONTINUOUS_RUN).write_text(json.dumps({"pid": stubborn.pid,
                                                             "args": args}))
        monkeypatch.setenv("SESSIONLAKE_RESTART_TIMEOUT", "1")
        for stop in (orch.stop_continuous_run, orch.stop_restart_dag_run):
            with pytest.raises(TimeoutError, match=f"pid {stubborn.pid} still holds .* 1s "
                                                   "after SIGTERM"):
                stop(str(checkpoint))
        assert stubborn.poll() is None


_STOPS_FROM_ANOTHER_CONTAINER = """
import json, subprocess, sys
from pathlib import Path
from sessionlake import locks
from sessionlake import orchestration as orch
from sessionlake.checkpoint import CONTINUOUS_RUN, HOLDER_FILE, PID_FILE
checkpoint = Path(sys.argv[1])
bystander = subprocess.Popen(["sleep", "600"])  # what the holder's pid names here
noted = json.loads((checkpoint / HOLDER_FILE).read_text())
(checkpoint / PID_FILE).write_text(str(bystander.pid))
(checkpoint / HOLDER_FILE).write_text(json.dumps({**noted, "pid": bystander.pid}))
(checkpoint / CONTINUOUS_RUN).write_text(json.dumps(
    {"pid": bystander.pid, "host": noted["host"], "args": ["run"]}))
said = {}
for name, stop in [("stop", orch.stop_continuous_run), ("restore", orch.stop_for_restore),
                   ("scheduler's end", orch.stop_restart_dag_run)]:
    try:
        said[name] = repr(stop(str(checkpoint), timeout=5))
    except Exception as error:
        said[name] = f"{type(error).__name__}: {error}"
said["bystander"] = bystander.poll()
said["bystander_pid"] = bystander.pid
print(json.dumps(said))
"""


def test_a_run_in_another_container_is_not_signalled_by_its_pid_here(tmp_path: Path) -> None:
    """A pid names a process in its own pid namespace: the restart and restore DAGs, and
    the scheduler container's end, must not SIGTERM whatever has the run's pid in their
    container (before, they did), but say where the run is and leave it running."""
    unshare = ["unshare", "--pid", "--fork", "--uts", "--mount-proc", "--kill-child"]
    if shutil.which("unshare") is None or subprocess.run(
            [*unshare, "true"], capture_output=True).returncode:
        pytest.skip("unshare --pid --uts --mount-proc is not permitted here (needs root)")
    checkpoint = tmp_path / "cp"
    holder = subprocess.Popen(
        [*unshare, "sh", "-c", 'hostname other-container && exec "$0" -c "$1" "$2"',
         sys.executable,
         "import sys, time; from sessionlake.locks import checkpoint_lock\n"
         "with checkpoint_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)",
         str(checkpoint)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        stops = subprocess.run([*unshare, sys.executable, "-c", _STOPS_FROM_ANOTHER_CONTAINER,
                                str(checkpoint)], capture_output=True, text=True, timeout=120)
        said = json.loads(stops.stdout)
        where = f"pid {said['bystander_pid']} on host other-container"
        assert said["stop"].startswith(f"ValueError: sessionlake run {where} holds checkpoint")
        assert f"`kill -TERM {said['bystander_pid']}` on other-container" in said["stop"]
        assert said["restore"].startswith(f"ValueError: sessionlake run {where}")
        assert said["scheduler's end"] == "None"
        assert said["bystander"] is None and holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize(("tamper", "accepted"), [
    (lambda args: args, True),
    (lambda args: [*args[:-1], "local[4]"], True),  # another local parallelism
    (lambda args: [*args[:-1], "spark://evil:7077"], False),  # a master nobody listed
    (lambda args: [*args, "--kafka-properties", "/tmp/planted"], False),
    (lambda args: [a.replace("/in", "/elsewhere") for a in args], False),  # another source
    (lambda args: ["sql", *args[1:]], False),
    (lambda args: args[:-2], False),  # no master
], ids=["as written", "local master", "foreign master", "extra option", "other source",
        "other command", "cut short"])
def test_a_restore_starts_again_only_a_command_line_the_restart_dag_writes(
    tamper: Callable[[list[str]], list[str]], accepted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The continuous run's command line is noted in the checkpoint folder, which whoever
    writes the lake's volume can write: the restore DAG must not start what they put there."""
    monkeypatch.delenv(orch.RESTART_MASTERS_ENV, raising=False)
    written = orch.continuous_run_args(WHERE, orch.RestartParams(3, "spark://cluster:7077"))
    noted = tamper(list(written))
    if accepted:
        assert orch.checked_restart_args(WHERE, noted, "spark://cluster:7077") == noted
    else:
        with pytest.raises(ValueError, match="is not one the restart DAG starts"):
            orch.checked_restart_args(WHERE, noted, "spark://cluster:7077")


def test_a_process_a_task_starts_does_not_inherit_airflow_s_secrets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The restart DAG's run lasts days: the worker's JWT secret, database URL and
    connections have no business in its environment; what sessionlake reads stays."""
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "s3cret")
    monkeypatch.setenv("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "postgresql://a:pw@db/airflow")
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", "spark://cluster:7077")
    monkeypatch.setenv("AIRFLOW_VAR_TOKEN", "t")
    monkeypatch.setenv("SESSIONLAKE_LAKE", "/l")
    monkeypatch.setenv(orch.ALERT_WEBHOOK_ENV, "https://hooks.example/T0K3N")
    env = orch.child_env()
    assert not {"AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN",
                "AIRFLOW_CONN_SPARK_DEFAULT", "AIRFLOW_VAR_TOKEN"} & set(env)
    # Blanked for a spark-submit too, whose hook passes the whole environment on.
    assert env[orch.ALERT_WEBHOOK_ENV] == orch.spark_submit_env()[orch.ALERT_WEBHOOK_ENV] == ""
    assert "s3cret" not in env.values()
    assert env["SESSIONLAKE_LAKE"] == "/l" and env["PATH"] == os.environ["PATH"]
    assert env["PYSPARK_PYTHON"] == orch.python_executable()

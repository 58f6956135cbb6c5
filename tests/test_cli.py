"""The command line: exit status 2 and one line for bad arguments; a real run in a
subprocess that changes --master and --shuffle-partitions between runs."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import unquote

import pytest
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionlake.cli import build_parser, configure_logging, main
from sessionlake.deltalog import read_log
from sessionlake.kafkaadmin import kafka_timeout
from tests.conftest import DATA, REPO, ObservedLake

LOG_LINES = (DATA / "apache_access_2015_head3000.log").read_text().splitlines(keepends=True)


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Each sub-command's parser, by name."""
    [commands] = build_parser()._subparsers._group_actions  # type: ignore[union-attr]
    return dict(commands.choices)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("run", "--gap DURATION inactivity gap that ends a session (default $SESSIONLAKE_GAP, "
                "else 30m)"),
        ("run", "--max-files-per-trigger N at most this many files per micro-batch (default "
                "$SESSIONLAKE_MAX_FILES_PER_TRIGGER, else all)"),
        ("rebuild-state", "--max-session-duration DURATION the stream's maximum session "
                          "duration (default $SESSIONLAKE_MAX_SESSION_DURATION, else 24h)"),
        ("doctor", "--master URL Spark master, such as spark://host:port; a local lake is "
                   "checked without Spark (default $SESSIONLAKE_MASTER, else local[*])"),
        ("sql", "--lake DIR lake folder or URI (default $SESSIONLAKE_LAKE)"),
    ],
)
def test_a_setting_s_help_names_its_kind_of_value_and_its_variable(
    command: str, said: str
) -> None:
    assert said in " ".join(_commands()[command].format_help().split())


def test_every_option_s_value_has_a_name_not_its_dest() -> None:
    """``--gap DURATION``, not ``--max-session-duration MAX_SESSION_DURATION``."""
    for name, sub in _commands().items():
        usage = " ".join(sub.format_usage().split())
        assert re.findall(r"--[\w-]+ ([A-Z]+_[A-Z_]+)", usage) == [], name


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--lake", "L", "--source", "nowhere"], "nowhere does not exist"),
        (["run", "--lake", "L", "--source", ".", "--gap", "soon"],
         "gap must be a duration like 30m"),
        (["run", "--lake", "L", "--source", ".", "--gap", "0s"], "gap must be longer than 0"),
        (["run", "--lake", "L", "--source", ".", "--gap", "-5m"],
         "a value that starts with '-' is written --gap=VALUE"),
        (["run", "--lake", "L", "--source", ".", "--gap=-5m"], "gap must be a duration"),
        (["run", "--lake", "L", "--source", ".", "--shuffle-partitions", "0"],
         "shuffle-partitions must be a whole number from 1 to 2147483647"),
        (["run", "--lake", "L", "--source", ".", "--shuffle-partitions", "2147483648"],
         "shuffle-partitions must be a whole number from 1 to 2147483647, got 2147483648"),
        (["run", "--lake", "L", "--source", ".", "--gap", "99999999999d"],
         "gap must be at most 36500d"),
        (["run", "--source", "."], "no lake location"),
        (["run", "--lake", "L", "--source", "."], "lies in the landing folder"),
        (["run", "--lake", "../elsewhere", "--source", ".", "--checkpoint", "L"],
         "--checkpoint"),
        (["run", "--lake", "L", "--source", ".", "--format", "xml"], "invalid choice: 'xml'"),
        *[(["run", "--lake", "L", "--source", ".", "--master", master],
           f"master must be local[*], local[N], spark://host:port, yarn or k8s://..., got "
           f"'{master}'") for master in ("foo", "spark//127.0.0.1:7077", "spark://127.0.0.1")],
        (["sql", "--lake", "L", "--master", "local[0]", "SELECT 1"], "master must be"),
        (["generate", "--out", "x", "--users", "0", "--events", "10"], "users"),
        # A stack trace, the working folder, and a run with no late events (a review).
        (["generate", "--out", "/dev/null", "--users", "5", "--events", "10"],
         "/dev/null is not a folder (/dev/null is a file): pass a new folder"),
        (["generate", "--out", "", "--users", "5", "--events", "10"], "--out is empty"),
        (["generate", "--out", "x", "--users", "5", "--events", "10", "--late-fraction", "nan"],
         "late-fraction must be in [0, 1), got nan"),
        (["report", "--lake", "L", "--html", "."], "--html . is not a file to write"),
        (["generate", "--out", "x", "--users", "5", "--events", "10", "--seed=-1"],
         "seed must be a whole number >= 0, got -1"),
        (["generate", "--out", "x", "--users", "5", "--events", "10", "--files", "100"],
         "files must be at most events (10), got 100: the others would be empty"),
        (["archive", "--lake", "L", "--source", ".", "--to", "old"],
         "inside the landing folder"),
        (["archive", "--lake", "L", "--source", "."], "--to"),
        (["sql", "--lake", "L", "--limit=-1", "SELECT 1"], "argument --limit: '-1' must be >= 0"),
        (["retention", "--lake", "L", "--dry-run"],
         "nothing to do: give --erase-user ID, --erase-user-sha256 HASH, "),
        # Pasted with a space, it would erase nobody, and the run would succeed.
        (["retention", "--lake", "L", "--erase-user", "u1 "],
         "'u1 ' begins or ends with white space, and ids are matched exactly"),
        (["retention", "--lake", "L", "--erase-user", "\tu1"], "--erase-user-sha256"),
        (["retention", "--lake", "L", "--erase-user-sha256", "ABC"],
         "'ABC' is not a SHA-256 (64 hex digits)"),
        (["snapshot", "--lake", "L", "--list", "--keep-last", "2"], "--list changes nothing"),
        (["snapshot", "--lake", "L", "--expire-only"],
         "--expire-only needs --max-age-days N or --keep-last N"),
        (["snapshot", "--lake", "L", "--keep-last", "0"], "argument --keep-last: '0' must be"),
        (["sql", "--lake", "L", "--list", "SELECT 1"], "--list runs nothing"),
        (["sql", "--lake", "L", "--query", "daily_sessions", "--param", "step1=a",
          "--param", "step1=b"], "--param step1 is given twice"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """Told before a JVM starts (seconds of waiting for one line otherwise)."""
    def no_spark(*_: object, **__: object) -> None:
        raise AssertionError("Spark was started for a command line that is refused")

    monkeypatch.setattr("sessionlake.cli._spark", no_spark)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SESSIONLAKE_LAKE", raising=False)
    try:
        status = main(argv)
    except SystemExit as exit_:
        status = int(exit_.code or 0)
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert len(err.splitlines()) == 1
    assert message in err
    assert not (tmp_path / "L").exists()


@pytest.mark.parametrize("value", ["0", "many"])
def test_a_bad_process_variable_is_refused_before_the_lake_is_touched(
    value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A variable read deep inside a run (at a batch's first lost commit race) is checked
    at its start, not where first needed: after some tables took the batch. A command that
    writes nothing goes on (the diff review: doctor, the tool that tells what to mend)."""
    def no_spark(*_: object, **__: object) -> None:
        raise AssertionError("Spark was started under a variable that is refused")

    monkeypatch.setattr("sessionlake.cli._spark", no_spark)
    monkeypatch.setenv("SESSIONLAKE_CONFLICT_ATTEMPTS", value)
    (tmp_path / "landing").mkdir()
    status = main(["run", "--lake", str(tmp_path / "L"), "--source", str(tmp_path / "landing")])
    err = capsys.readouterr().err.strip()
    assert status == 2
    assert len(err.splitlines()) == 1
    assert "SESSIONLAKE_CONFLICT_ATTEMPTS" in err
    assert not (tmp_path / "L").exists()
    main(["doctor", "--lake", str(tmp_path / "L")])
    assert "SESSIONLAKE_CONFLICT_ATTEMPTS" not in capsys.readouterr().err


@pytest.mark.parametrize("command", ["run", "sql"])
def test_a_drivers_memory_that_is_no_size_is_one_line_before_the_lake_is_touched(
    command: str, observed_lake: ObservedLake, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """Not the JVM's error and PySpark's traceback (the README review, stop 93)."""
    monkeypatch.setenv("SESSIONLAKE_DRIVER_MEMORY", "lots")
    (tmp_path / "landing").mkdir()
    argv = {"run": ["run", "--lake", str(tmp_path / "L"), "--source", str(tmp_path / "landing")],
            "sql": ["sql", "--lake", observed_lake.settings.lake, "SELECT 1"]}[command]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "sessionlake: error: SESSIONLAKE_DRIVER_MEMORY must be a memory size such as 4g or "
        "512m, got 'lots'"]
    assert not (tmp_path / "L").exists()


@pytest.mark.parametrize(("raised", "said"), [
    (RuntimeError("An exception was raised by the Python Proxy. Return Message: Traceback\n"
                  + "\tat org.apache.spark.Frame.call(Frame.java:1)\n" * 2000
                  + "org.apache.spark.SparkException: [CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] "
                  "Checkpoint block rdd_12_0 not found!\n"),
     "[CHECKPOINT_RDD_BLOCK_ID_NOT_FOUND] Checkpoint block rdd_12_0 not found!"),
    (KeyError("session_id"), "KeyError: 'session_id'"),
    # The JVM killed alone (the Kafka review: the line said only "Connection refused").
    (ConnectionRefusedError(111, "Connection refused"),
     "Spark's driver JVM is gone under it (killed: by hand, or by the kernel's OOM killer, "
     "which `dmesg` names); run it again ("
     "ConnectionRefusedError: [Errno 111] Connection refused)"),
])
def test_an_unforeseen_failure_ends_with_its_cause_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    raised: Exception, said: str
) -> None:
    """The trace is kept, above; the last line says what failed (Airflow quotes a failed
    task's last lines, which were Java frames)."""
    from sessionlake import cli

    def failing(args: argparse.Namespace) -> int:
        raise raised

    monkeypatch.setitem(cli.COMMANDS, "report", failing)
    assert main(["report", "--lake", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.splitlines()[-1] == f"sessionlake: error: report failed: {said} (its trace is above)"


@pytest.mark.parametrize(("command", "after"), [
    ("compact", ""),
    ("backfill", ": run the same backfill again, which finishes what this one began"),
    ("restore", ": run the same restore again, which finishes it (one cut off once it began "
                "changing the lake keeps the stream from starting until then)"),
])
def test_ctrl_c_ends_a_command_in_one_line_with_the_status_of_sigint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    command: str, after: str
) -> None:
    """Spark's handler cancels the jobs in flight and raises KeyboardInterrupt wherever
    Python waits; its trace said nothing of what the command left. (Retention's own line,
    and a real Ctrl-C: tests/test_retention.py.)"""
    from sessionlake import cli

    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, command, interrupted)
    required = {"restore": ["--snapshot", "x"],
                "backfill": ["--from", "2026-01-05", "--to", "2026-01-05"]}
    argv = [command, "--lake", str(tmp_path), *required.get(command, [])]
    assert main(argv) == 130
    said = f"sessionlake: {command} interrupted before it finished{after}\n"
    assert capsys.readouterr().err == said


def test_ctrl_c_cancels_the_spark_job_the_command_waits_on_without_py4j_s_traces(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The main thread waits in a call into the JVM (a job's result) as Ctrl-C comes.
    Spark's own handler cancelled the jobs over that same busy connection: the call
    failed, py4j logged pages of traces, and the job ran on until the JVM died (a hands-on
    review's `compact`: 50 to 222 lines). The command's handler cancels them from a thread
    of its own: the job ends, and the command says it was interrupted in one line, also
    when py4j's cleanup of the call cut off fails in turn (it did once in the suite)."""
    from sessionlake import cli

    tracker = spark.sparkContext.statusTracker()

    def ctrl_c_once_the_job_runs() -> None:
        deadline = time.monotonic() + 60
        while not tracker.getActiveJobsIds() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGINT)

    def sleep(_: object) -> None:
        time.sleep(120)

    def compact(args: argparse.Namespace) -> int:
        cli._cancel_jobs_on_ctrl_c(spark)  # as the command's Spark session is built
        threading.Thread(target=ctrl_c_once_the_job_runs).start()
        spark.sparkContext.parallelize([0], 1).foreach(sleep)
        return 0

    monkeypatch.setitem(cli.COMMANDS, "compact", compact)
    previous = signal.getsignal(signal.SIGINT)
    try:
        with caplog.at_level(logging.WARNING):  # what the command shows without -v
            assert main(["compact", "--lake", str(tmp_path)]) == 130
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not tracker.getActiveJobsIds(), "the job the command waited on runs on"
    assert capsys.readouterr().err == "sessionlake: compact interrupted before it finished\n"
    assert "while sending command" not in caplog.text, caplog.text


def test_a_standalone_master_that_does_not_answer_is_told_before_spark_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark would retry for a minute, then fail in a stack trace that names no master."""
    def no_spark(*_: object, **__: object) -> None:
        raise AssertionError("Spark was started on a master that does not answer")

    monkeypatch.setattr("sessionlake.spark.build_spark", no_spark)
    with socket.socket() as unused:  # a port nothing listens on
        unused.bind(("127.0.0.1", 0))
        master = f"spark://127.0.0.1:{unused.getsockname()[1]},localhost:1"
    (tmp_path / "landing").mkdir()
    status = main(["run", "--lake", str(tmp_path / "lake"), "--source",
                   str(tmp_path / "landing"), "--master", master])
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"sessionlake: error: the Spark master {master} does not answer (")
    assert "Connection refused" in err and not (tmp_path / "lake").exists()


@pytest.mark.parametrize(("flags", "troubled"), [
    ([], True),  # SPEC: a clickstream with late, duplicate and malformed records
    (["--late-fraction", "0", "--duplicate-fraction", "0", "--malformed-fraction", "0"], False),
])
def test_generate_writes_some_of_every_trouble_unless_told_not_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], troubled: bool
) -> None:
    argv = ["generate", "--out", str(tmp_path / "out"), "--users", "50", "--events", "2000"]
    assert main([*argv, *flags]) == 0
    printed = capsys.readouterr().out
    figures = [int(n) for n in re.findall(
        r"\((\d+) held back to the last file: late when each file is a batch, "
        r"--max-files-per-trigger 1\), (\d+) duplicates, (\d+) malformed", printed)[0]]
    assert all(n > 0 for n in figures) if troubled else figures == [0, 0, 0], printed
    # The range printed is that of the files, as they spell times (it had microseconds).
    times = []
    for path in (tmp_path / "out").iterdir():
        for line in path.read_text().splitlines():
            with contextlib.suppress(ValueError, AttributeError, TypeError, KeyError):
                times.append(datetime.fromisoformat(json.loads(line)["event_time"]))
    first, last = (t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
                   for t in (min(times), max(times)))
    assert printed.rstrip().endswith(f", {first} .. {last}"), printed


def test_sql_on_a_missing_lake_and_bad_sql_exit_2(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sql", "--lake", str(tmp_path / "none"), "SELECT 1"]) == 2
    assert f"no lake at {tmp_path / 'none'}" in capsys.readouterr().err


@pytest.mark.parametrize("statement", ["SELECT * FROM nosuch", "SELECT nosuch FROM sessions"])
def test_an_analysis_error_is_one_line_without_a_stack_trace(
    observed_lake: ObservedLake, capfd: pytest.CaptureFixture[str], statement: str
) -> None:
    assert main(["sql", "--lake", observed_lake.settings.lake, statement]) == 2
    err = capfd.readouterr().err
    assert "SQLQueryContextLogger" not in err and "\tat org.apache" not in err, err[:2000]
    assert err.strip().splitlines()[-1].startswith("sessionlake: error: the query failed: ")


@pytest.mark.parametrize(("statement", "hint"), [
    ("SELECT * FROM sesions", "did you mean sessions? the lake's tables: events, "),
    ("SELECT * FROM bounce_rates", "did you mean bounce_rate? the lake's tables: events, "),
    ("SELECT * FROM nosuch", "(the lake's tables: events, "),
])
def test_a_name_not_in_the_lake_gets_the_closest_and_the_tables(
    observed_lake: ObservedLake, capsys: pytest.CaptureFixture[str], statement: str, hint: str
) -> None:
    assert main(["sql", "--lake", observed_lake.settings.lake, statement]) == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert said.startswith("sessionlake: error: the query failed: [TABLE_OR_VIEW_NOT_FOUND]")
    assert hint in said and said.endswith("`sessionlake sql --list` lists the named queries)")


@pytest.mark.parametrize("output", ["table", "csv", "json"])
@pytest.mark.parametrize("statement", [
    "SELECT 1 / (event_count - event_count) FROM sessions",
    "SELECT CAST(user_id AS INT) FROM sessions",
    "SELECT raise_error('boom') FROM sessions",
])
def test_a_query_that_fails_while_running_is_one_line(
    observed_lake: ObservedLake, capsys: pytest.CaptureFixture[str], statement: str,
    output: str,
) -> None:
    """Also from CSV and JSON lines, whose rows are written as they come (their failure
    arrives wrapped in the wait for the next partition)."""
    assert main(["sql", "--lake", observed_lake.settings.lake, "--output", output,
                 statement]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("sessionlake: error: the query failed while running: [")


@pytest.mark.parametrize(("argv", "status", "stackless", "said"), [
    (["sql", "SELECT raise_error('boom') FROM sessions"], 1, True,
     "sessionlake: error: the query failed while running: [USER_RAISED_EXCEPTION] boom "
     "SQLSTATE: P0001"),
    (["sql", "--output", "csv", "SELECT raise_error('boom') FROM sessions"], 1, True,
     "sessionlake: error: the query failed while running: [USER_RAISED_EXCEPTION] boom "
     "SQLSTATE: P0001"),
    # The backfill's check that every replaced session finds its events fails a task. Its
    # stack traces are quieted too, but a sibling task killed while writing can still log
    # one (seen in 2 of about 8 runs, under load): the line it ends with is what counts.
    (["backfill", "--from", "2026-01-05", "--to", "2026-01-05"], 2, False,
     "sessionlake: error: cannot backfill 2026-01-05..2026-01-05: 1 session(s) of the range "
     "have events missing from `events`, e.g. user u1 from 2026-01-05T10:00:00Z has 2 of its "
     "3 events; re-cutting them would lose events, so nothing was written (if a micro-batch "
     "was committing at that moment, run the backfill again)"),
], ids=["sql", "sql-csv", "backfill"])
def test_a_failed_task_s_stack_trace_is_not_printed(
    spark: SparkSession, observed_lake: ObservedLake, tmp_path: Path, argv: list[str],
    status: int, stackless: bool, said: str,
) -> None:
    """Spark's JVM (a child process, whose output no capture of this one sees) logs a
    failed task's stack trace unless the command quiets it."""
    lake = tmp_path / "lake"
    shutil.copytree(observed_lake.settings.lake, lake)
    DeltaTable.forPath(spark, str(lake / "events")).delete(F.col("event_id") == "b")
    result = _cli(argv[0], "--lake", str(lake), *argv[1:])
    assert result.returncode == status
    if stackless:
        assert "\tat org.apache" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1] == said


@pytest.mark.parametrize("argv", [
    ["backfill", "--from", "2026-01-05", "--to", "2026-01-05"],
    ["sql", "SELECT sum(event_count) FROM sessions"],
    ["sql", "--output", "csv", "SELECT * FROM sessions"],
])
def test_a_deleted_data_file_is_named_as_damage_with_the_doctor(
    observed_lake: ObservedLake, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    argv: list[str],
) -> None:
    lake = tmp_path / "lake"
    shutil.copytree(observed_lake.settings.lake, lake)
    sessions = lake / "sessions"
    live = read_log(None, str(sessions)).files.values()
    (sessions / unquote(next(iter(live)).path)).unlink()
    assert main([*argv[:1], "--lake", str(lake), *argv[1:]]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("sessionlake: error: a data file of the lake cannot be read "
                           "([FAILED_READ_FILE"), line
    assert line.endswith("`sessionlake doctor` names the damage and how to recover from it")


def test_version_names_the_packages_it_runs_on(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert re.fullmatch(r"sessionlake \S+ \(pyspark 4\.2\.\d+, delta-spark 4\.4\.\d+, "
                        r"Delta jars 4\.4\.\d+\)\n", capsys.readouterr().out)


def test_version_says_when_the_delta_jars_are_missing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JVM runs the jars, whose version can differ from the Python package's."""
    monkeypatch.setenv("SESSIONLAKE_JARS", str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.endswith(", Delta jars not found: make jars)\n")


def test_output_whose_reader_went_away_ends_quietly(tmp_path: Path) -> None:
    """`sessionlake ... | head`: when the pipe closes, no traceback and no "Exception
    ignored" message; the status a shell gives a tool stopped by SIGPIPE. (argparse's own
    `--help` already ignores a closed pipe.)"""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sessionlake.cli", "generate", "--out", str(tmp_path),
             "--users", "5", "--events", "20", "--files", "1"],
            stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)
    finally:
        os.close(write_end)
    assert (done.returncode, done.stderr) == (128 + signal.SIGPIPE, "")
    assert len(list(tmp_path.glob("*.jsonl"))) == 1  # the command itself did its work


NO_LAKE = "no lake at {lake}: `sessionlake run` creates it (check --lake)"


@pytest.mark.parametrize(("command", "said"), [
    (["snapshot", "--list"], NO_LAKE),
    (["snapshot", "--expire-only", "--keep-last", "1"], NO_LAKE),
    (["rebuild-state"], NO_LAKE),
    (["compact"], NO_LAKE),
    (["doctor"], NO_LAKE),
    (["report"], NO_LAKE),
    (["archive", "--source", "{tmp}", "--to", "{tmp}/../archived", "--dry-run"],
     "no stream's checkpoint at {lake}/_checkpoints/stream: no file of the landing folder "
     "was read (check --lake and --checkpoint)"),
], ids=["snapshot-list", "snapshot-expire", "rebuild-state", "compact", "doctor", "report",
       "archive"])
@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_a_misspelt_lake_is_named_not_taken_for_an_empty_or_damaged_one(
    command: list[str], said: str, folder: str, tmp_path: Path, spark: SparkSession,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A ``--lake`` that names no folder, or a folder with none of the lake's tables in
    it, gets the same one line and exit 2, and is left as it was."""
    lake = tmp_path / "no-such-lake"
    if folder == "empty":
        lake.mkdir()
    argv = [a.format(tmp=tmp_path) for a in command]
    assert main([*argv, "--lake", str(lake)]) == 2
    assert capsys.readouterr().err == f"sessionlake: error: {said.format(lake=lake)}\n"
    assert (list(lake.iterdir()) == []) if folder == "empty" else not lake.exists()


def _cli(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sessionlake.cli", *args], capture_output=True, text=True,
        cwd=cwd, env={**os.environ, "SESSIONLAKE_DRIVER_MEMORY": "1g", **(env or {})},
        timeout=600, check=False,
    )


def test_sql_prints_utc_times_on_a_machine_in_another_time_zone(
    spark: SparkSession, observed_lake: ObservedLake
) -> None:
    """PySpark hands timestamps to Python in the process's local time: the command line
    must print (and the engine read) the tables' UTC whatever the machine's zone."""
    lake = observed_lake.settings.lake
    statement = "SELECT max(max_event_time) AS newest FROM batch_metrics"
    # This test process runs in UTC (conftest).
    [(newest,)] = spark.sql(
        statement.replace("batch_metrics", f"delta.`{lake}/batch_metrics`")).collect()
    result = _cli("sql", "--lake", lake, "--output", "csv", statement,
                  env={"TZ": "America/New_York"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == ["newest", newest.isoformat(sep=" ")]


@pytest.mark.slow
@pytest.mark.parametrize(("verbosity", "root", "py4j"), [
    (0, logging.WARNING, logging.WARNING),
    (1, logging.INFO, logging.WARNING),
    (2, logging.DEBUG, logging.INFO),
    (3, logging.DEBUG, logging.INFO),
])
def test_each_v_logs_more_and_py4j_only_from_two(
    verbosity: int, root: int, py4j: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(logging.root, "handlers", [])  # as in a new process
    monkeypatch.setattr(logging.root, "level", logging.root.level)
    for name in ("py4j", "sessionlake.monitor"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    configure_logging(verbosity)
    assert (logging.root.level, logging.getLogger("py4j").level) == (root, py4j)
    assert logging.getLogger("sessionlake.monitor").getEffectiveLevel() == logging.INFO


def test_run_then_restart_on_another_master_then_query(tmp_path: Path) -> None:
    landing, lake = tmp_path / "landing", tmp_path / "lake"
    landing.mkdir()
    (landing / "a.log").write_text("".join(LOG_LINES[:1500]))
    first = _cli("run", "--source", str(landing), "--format", "apache", "--lake", str(lake),
                 "--master", "local[1]", "--shuffle-partitions", "1")
    assert first.returncode == 0, first.stderr
    assert "1500 records, 1500 accepted" in first.stdout
    (landing / "b.log").write_text("".join(LOG_LINES[1500:]))
    os.utime(landing / "b.log", (2_000_000_000, 2_000_000_000))
    second = _cli("-v", "run", "--source", str(landing), "--format", "apache", "--lake",
                  str(lake), "--master", "local[2]", "--shuffle-partitions", "3")
    assert second.returncode == 0, second.stderr
    unread = (landing / "b.log").stat().st_size / 2**20  # a.log's batch was committed
    assert (f"input to read: {unread:.1f} MiB in 1 batch(es); the driver compiles with C1 only"
            in second.stderr)
    assert "processed 1 micro-batch(es): 1500 records, 1500 accepted" in second.stdout
    assert re.search(r"INFO sessionlake\.monitor: batch \{\"batch_id\": 1,", second.stderr)
    assert "py4j" not in second.stderr  # two lines a call into the JVM: from -vv only

    query = _cli("sql", "--lake", str(lake), "--output", "json",
                 "SELECT (SELECT sum(event_count) FROM sessions) + "
                 "(SELECT sum(event_count) FROM open_sessions) AS events, "
                 "(SELECT count(*) FROM late_events) AS late", cwd=tmp_path)
    assert query.returncode == 0, query.stderr
    assert json.loads(query.stdout) == {"events": 3000, "late": 0}
    assert not (tmp_path / "spark-warehouse").exists()  # nothing left where it ran


@pytest.mark.parametrize(("error", "said"), [
    # What a continuous run's query raised after its broker had been down for 3 minutes.
    ("[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: org.apache.kafka."
     "common.errors.TimeoutException: Timed out waiting for a node assignment. Call: "
     "listNodes SQLSTATE: XXKST\n=== Streaming Query ===\n",
     "Timed out waiting for a node assignment. Call: listNodes"),
    # What a batch's fetch raised with its broker frozen under it (Spark's consumer gave up).
    ("py4j.protocol.Py4JJavaError: An error occurred while calling o899.localCheckpoint.\n"
     ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage "
     "2.0 failed 1 times, most recent failure: Lost task 0.0 in stage 2.0 (TID 1) (localhost "
     "executor driver): java.util.concurrent.TimeoutException: Cannot fetch record for "
     "offset 0 in 15000 milliseconds\n",
     "Cannot fetch record for offset 0 in 15000 milliseconds"),
    ("[STREAM_FAILED] Query terminated with exception: Job aborted", None),
    ("java.util.concurrent.TimeoutException: Futures timed out after [300 seconds]", None),
])
def test_kafka_brokers_gone_mid_run_are_told_in_one_line(error: str, said: str | None) -> None:
    assert kafka_timeout(error) == said

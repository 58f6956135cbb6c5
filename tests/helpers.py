"""Small helpers for the tests: inline events, batches, and answers to compare."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import psutil
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from sessionlake.batch import BatchReport, process_lines
from sessionlake.config import Settings, settings_from
from sessionlake.ledger import StreamIdentity
from sessionlake.tables import ensure_tables, read_table

#: The batch clock of the tests: after every event they use, so no future-skew surprises.
NOW = datetime(2026, 2, 1, tzinfo=UTC)
LINES_SCHEMA = "source_file string, source_line long, line string"


def lake_settings(lake: str | Path, **values: Any) -> Settings:
    """Settings of the lake ``lake``, the defaults but for ``values``, whatever the
    runner's ``SESSIONLAKE_*`` variables say."""
    return settings_from({"lake": str(lake), **values}, env={})


def event(user: str, at: str, page: str | None = None, **fields: Any) -> str:
    """One jsonl record; ``at`` is ``HH:MM`` or ``HH:MM:SS`` on 2026-01-05, or a full time."""
    stamp = at if "T" in at else f"2026-01-05T{at if at.count(':') == 2 else at + ':00'}Z"
    record: dict[str, Any] = {"user_id": user, "event_time": stamp}
    if page is not None:
        record["page"] = page
    record.update(fields)
    return json.dumps(record)


def lines_frame(spark: SparkSession, lines: Sequence[str], file: str = "f.jsonl") -> DataFrame:
    """A micro-batch of raw lines, numbered from 1 as the file source would."""
    return spark.createDataFrame(
        [(file, i + 1, line) for i, line in enumerate(lines)], LINES_SCHEMA
    )


@cache
def _empty_tables(spark: SparkSession, user_buckets: int) -> Path:
    """Every table of a lake, empty, made once per test process and bucket count."""
    folder = Path(tempfile.mkdtemp(prefix="sessionlake-empty-lake-"))
    atexit.register(shutil.rmtree, folder, True)
    ensure_tables(spark, str(folder / "lake"), user_buckets)
    return folder / "lake"


def create_tables(spark: SparkSession, settings: Settings) -> None:
    """The lake's tables, as :func:`ensure_tables` makes them, for a test's new lake.

    A new local lake is a copy of empty tables made once per process: creating eight Delta
    tables costs 2-3 s in a warm JVM, and dozens of tests start from an empty lake.
    ``tests/test_tables.py`` tests the creation itself.
    """
    target = Path(settings.lake.removeprefix("file:"))
    if "://" in settings.lake or target.exists():
        ensure_tables(spark, settings.lake, settings.user_buckets)
        return
    shutil.copytree(_empty_tables(spark, settings.user_buckets), target)


def run_batches(
    spark: SparkSession,
    settings: Settings,
    batches: Sequence[Sequence[str]],
    identity: StreamIdentity | None = None,
    first_batch_id: int = 0,
) -> list[BatchReport]:
    """Process each list of lines as one micro-batch (file ``b<N>.jsonl``)."""
    create_tables(spark, settings)
    identity = identity or StreamIdentity("test", 0)
    reports = []
    for offset, lines in enumerate(batches):
        batch_id = first_batch_id + offset
        frame = lines_frame(spark, lines, f"b{batch_id}.jsonl")
        reports.append(process_lines(spark, frame, batch_id, settings, identity, lambda: NOW))
    return reports


SESSION_KEY = ("user_id", "session_start", "session_end", "event_count", "entry_page",
               "exit_page")


def all_sessions(spark: SparkSession, lake: str) -> DataFrame:
    """Closed and open sessions together, in comparable columns."""
    closed = read_table(spark, lake, "sessions").select(
        "session_id", *SESSION_KEY, "distinct_pages"
    )
    open_ = read_table(spark, lake, "open_sessions").select(
        "session_id", *SESSION_KEY, F.size("pages").cast("int").alias("distinct_pages")
    )
    return closed.unionByName(open_)


def first(frame: DataFrame) -> Row:
    """The first row of ``frame``; the test fails when it has none."""
    row = frame.head()
    assert row is not None, "expected a row, the frame is empty"
    return row


def rows(frame: DataFrame, *columns: str) -> list[tuple[Any, ...]]:
    """Sorted tuples of ``columns`` (all columns when none are named)."""
    selected = frame.select(*columns) if columns else frame
    return sorted(tuple(r) for r in selected.collect())


def hm(at: str) -> datetime:
    """A naive UTC datetime on 2026-01-05 (as Spark returns timestamps)."""
    hours, minutes, *rest = (int(x) for x in at.split(":"))
    return datetime(2026, 1, 5, hours, minutes, rest[0] if rest else 0)


def _once_held(holder: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    """``holder`` once it printed ``held``, until the block ends; then it is killed, so the
    kernel lets go of its locks and its holder files stay."""
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


@contextmanager
def held_by_another_process(locks: str, *paths: str | Path) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``locks`` (a lock context manager of ``sessionlake.stream``,
    e.g. ``stream_locks``) of ``paths``, as a running stream does, until the block ends;
    then it is killed, so the kernel lets go of its locks and its holder files stay."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         f"import sys, time; from sessionlake.locks import {locks}\n"
         f"with {locks}(*sys.argv[1:]):\n    print('held', flush=True); time.sleep(600)",
         *map(str, paths)],
        stdout=subprocess.PIPE, text=True,
    )
    yield from _once_held(holder)


@contextmanager
def flock_held(lock: Path, stubborn_run: bool = False, args: Sequence[str] = ()
               ) -> Iterator[subprocess.Popen[str]]:
    """A Python process holding ``lock`` with ``flock`` until the block ends (then killed):
    no sessionlake run, or with ``stubborn_run`` one that a stop takes for a run (its
    command line names sessionlake) and that a SIGTERM does not stop; ``args`` end its
    command line (``--trigger continuous``, say)."""
    holder = subprocess.Popen(
        [sys.executable, "-c",
         ("# a sessionlake run that ignores SIGTERM\n"
          "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if stubborn_run
          else "")
         + "import fcntl, os, time\n"
         + "lock = open(os.environ['LOCK'], 'a+'); fcntl.flock(lock, fcntl.LOCK_EX)\n"
         "print('held', flush=True); time.sleep(600)", *args],
        # The path in the environment, not the command line: a test's folder may be named
        # for sessionlake, and a stop signals a command line that names it.
        env={**os.environ, "LOCK": str(lock)}, stdout=subprocess.PIPE, text=True,
    )
    yield from _once_held(holder)


@contextmanager
def erasure_stalled(lake: str, user: str, tmp: Path, point: str = "erase"
                    ) -> Iterator[subprocess.Popen[str]]:
    """``sessionlake retention --erase-user USER`` in a process group of its own, stalled
    in a Spark job at fault ``point`` (``erase``: after one table's DELETE, the other
    tables' deletes going on; ``vacuum``: after them all): the block starts once it
    stalls. Its output goes to ``tmp/retention.out`` and ``tmp/retention.err`` (a pipe
    nobody reads while it runs could fill and stop it). What is left of it after the
    block is killed, its driver's JVM too (a session of its own: the group's signal
    misses it)."""
    stalled = tmp / "stalled"
    env = {**{k: v for k, v in os.environ.items() if k != "SESSIONLAKE_FAULT"},
           "SESSIONLAKE_DRIVER_MEMORY": "1g", "SESSIONLAKE_FAULT": point,
           "SESSIONLAKE_FAULT_STALL": str(stalled)}
    with open(tmp / "retention.out", "w") as out, open(tmp / "retention.err", "w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "sessionlake.cli", "retention", "--lake", lake,
             "--erase-user", user],
            cwd=Path(__file__).resolve().parent.parent, env=env, stdout=out, stderr=err,
            text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not stalled.exists():
            assert process.poll() is None and time.monotonic() < deadline, \
                (tmp / "retention.err").read_text()[-3000:]
            time.sleep(0.2)
        yield process
    finally:
        kill_with_children(process)


def kill_with_children(process: subprocess.Popen[str]) -> None:
    """SIGKILL ``process`` and every process it started, and wait until they are gone
    (nothing of theirs commits after this returns)."""
    try:
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(family, timeout=60)
    process.wait()


def write_source_log(checkpoint: Path, entries: dict[str, list[tuple[str, int]]],
                     committed: int, offsets: dict[int, int] | None = None) -> None:
    """Spark's file source log with ``entries``, and batches up to ``committed`` planned
    (with the source log ``offsets`` given, else batch N ending at entry N) and committed.
    A file is logged with its modification time, as Spark lists it (0 if it is not there)."""
    folder = checkpoint / "spark" / "sources" / "0"
    folder.mkdir(parents=True)

    def listed_at(path: str) -> int:
        return os.stat(path).st_mtime_ns // 1_000_000 if os.path.exists(path) else 0

    for name, files in entries.items():
        (folder / name).write_text("v1\n" + "".join(
            json.dumps({"path": f"file://{path}", "timestamp": listed_at(path),
                        "batchId": batch}) + "\n"
            for path, batch in files))
    for log in ("offsets", "commits"):
        (checkpoint / "spark" / log).mkdir()
    for batch, offset in (offsets or {b: b for b in range(committed + 1)}).items():
        (checkpoint / "spark" / "offsets" / str(batch)).write_text(
            f'v1\n{{"batchWatermarkMs":0}}\n{{"logOffset":{offset}}}')
    for batch in range(committed + 1):
        (checkpoint / "spark" / "commits" / str(batch)).write_text("v1\n{}")

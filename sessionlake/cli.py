"""The ``sessionlake`` command line: thin wiring from flags to the package.

Every command validates its arguments before touching data; a wrong argument or input
prints one line (what is wrong, what to do) and exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from contextlib import nullcontext, suppress
from datetime import UTC, date, datetime
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from sessionlake import __version__
from sessionlake.config import (
    COMPACTION_MIN_FILES,
    ENV,
    INPUT_FORMATS,
    JAVA_INT_MAX,
    MAX_AGE_DAYS,
    OUTPUT_FORMATS,
    STARTING_OFFSETS,
    TABLE_ROWS,
    TRIGGERS,
    ActionableError,
    Settings,
    check_process_environment,
    no_lake_message,
    settings_from,
)
from sessionlake.progress import Step, progress

if TYPE_CHECKING:
    from sessionlake.checkpoint import UnreadInput

#: What ``sessionlake --help`` says the tool is, and how to begin.
DESCRIPTION = """\
Sessionize user events into Delta Lake tables (sessions, open_sessions, session_changelog,
events, ...), query them with Delta SQL, and look after the lake: snapshots, restore,
compaction, retention.

  sessionlake run --lake DIR --source LANDING_FOLDER
  sessionlake sql --lake DIR "SELECT count(*) FROM sessions"
"""
EPILOG = """\
Each setting's option falls back to its $SESSIONLAKE_* variable, then to its default.
Arguments are checked before any data is touched: a wrong one prints one line and exits
with status 2. `sessionlake COMMAND --help` lists a command's options.
"""

EXIT_USAGE = 2
#: The output's reader went away: the status a shell reports for a tool killed by SIGPIPE.
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
#: ``sessionlake sql``: the statement was valid but failed while it ran.
EXIT_QUERY_FAILED = 1
#: Stopped by Ctrl-C: the status a shell reports for a tool killed by SIGINT.
EXIT_INTERRUPTED = 128 + signal.SIGINT

log = logging.getLogger("sessionlake.cli")


class UsageError(Exception):
    """A bad argument or input: reported in one line, exit status 2."""


_MISSING_VALUE = re.compile(r"^argument (--[\w-]+)(?:/[\w-]+)*: expected one argument$")


#: The kind of value each option takes, by its ``dest``, as usage lines show it.
_VALUE_NAMES = {
    "lake": "DIR", "source": "DIR", "checkpoint": "DIR", "master": "URL",
    "gap": "DURATION", "grace": "DURATION", "max_session_duration": "DURATION",
    "max_future_skew": "DURATION", "processing_interval": "DURATION",
    "kafka_reread_wait": "DURATION", "alert_batch_duration": "DURATION",
    "alert_late_fraction": "F", "alert_quarantine_fraction": "F",
    "shuffle_partitions": "N", "max_files_per_trigger": "N",
    "kafka_max_offsets_per_trigger": "N", "kafka_bootstrap": "HOST:PORT[,...]",
    "kafka_topic": "TOPIC", "query": "NAME", "params": "NAME=VALUE", "as_of": "VERSION|TIME",
    "limit": "N", "out": "DIR", "users": "N", "events": "N", "files": "N", "seed": "N",
    "late_fraction": "F", "duplicate_fraction": "F", "malformed_fraction": "F",
    "html": "FILE", "snapshot": "ID", "min_files": "N", "tables": "TABLE",
    "erase_users": "ID", "sessions_max_age_days": "DAYS", "events_max_age_days": "DAYS",
    "vacuum_retain_hours": "HOURS", "archive_to": "DIR", "from_date": "DATE",
    "to_date": "DATE",
}
_DEFAULT = re.compile(r"\(default (?!\$)([^)]*)\)$")


class _Parser(argparse.ArgumentParser):
    def add_argument(self, *names: Any, **options: Any) -> argparse.Action:
        """An option of a setting is shown with the kind of value it takes (``--gap
        DURATION``) and the environment variable it falls back to, named here once for
        every command rather than in each option's help."""
        # As argparse names it: the first long option (`-v, --verbose`: verbose).
        flag = next((n for n in names if n.startswith("--")), names[0])
        dest = options.get("dest") or flag.lstrip("-").replace("-", "_")
        if dest in _VALUE_NAMES:
            options.setdefault("metavar", _VALUE_NAMES[dest])
        said = options.get("help")
        if dest in ENV and said and f"${ENV[dest]}" not in said:
            variable = f"${ENV[dest]}"
            options["help"] = (_DEFAULT.sub(rf"(default {variable}, else \1)", said)
                               if _DEFAULT.search(said) else f"{said} (default {variable})")
        return super().add_argument(*names, **options)

    def error(self, message: str) -> NoReturn:
        # argparse reads a value starting with '-' (`--gap -5m`) as the next option.
        if found := _MISSING_VALUE.match(message):
            message += f" (a value that starts with '-' is written {found.group(1)}=VALUE)"
        self.exit(EXIT_USAGE, f"sessionlake: error: {message} (see `{self.prog} --help`)\n")


#: ``sessionlake generate``'s defaults: a stream with some of every kind of trouble, as
#: SPEC describes it; pass 0 for each for a clean one (the benchmark does).
GENERATED_LATE = 0.05
GENERATED_DUPLICATES = 0.01
GENERATED_MALFORMED = 0.005


def _common_spark(parser: argparse.ArgumentParser, when: str = "") -> None:
    parser.add_argument("--master", help=f"Spark master, such as spark://host:port{when} "
                                         "(default local[*])")
    parser.add_argument("--shuffle-partitions", type=int, dest="shuffle_partitions",
                        help=f"spark.sql.shuffle.partitions, which may change between runs"
                             f"{when} (default {Settings.shuffle_partitions})")


def _lake(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("--lake", required=required,
                        help="lake folder or URI (default $SESSIONLAKE_LAKE)")


def _versions() -> str:
    """sessionlake's version, those of the PySpark and Delta packages it runs on, and that
    of the Delta jars the JVM runs, which can differ from the Python package's (README)."""
    found = []
    for package in ("pyspark", "delta-spark"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} not installed")
    try:
        from sessionlake.spark import delta_jars

        jar = next(Path(j).name for j in delta_jars() if Path(j).name.startswith("delta-spark_"))
        found.append(f"Delta jars {jar.rsplit('-', 1)[1].removesuffix('.jar')}")
    except (ImportError, ActionableError):
        found.append("Delta jars not found: make jars")
    return f"sessionlake {__version__} ({', '.join(found)})"


class _VersionAction(argparse.Action):
    """``--version``, whose text is found only when asked: it imports PySpark and looks in
    the jars folder, which no other command line should wait for."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: object, option_string: str | None = None) -> None:
        print(_versions())
        parser.exit()


def option_variables(command: str) -> dict[str, str]:
    """The options of ``command`` that fall back to an environment variable, each to its
    variable (``--format``: ``SESSIONLAKE_FORMAT``), as its ``--help`` names them."""
    [commands] = build_parser()._subparsers._group_actions  # type: ignore[union-attr]
    parser = commands.choices[command]  # type: ignore[index]
    return {flag: ENV[action.dest] for action in parser._actions if action.dest in ENV
            for flag in action.option_strings}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = _Parser(prog="sessionlake", description=DESCRIPTION, epilog=EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action=_VersionAction,
                        help="show the versions of sessionlake, PySpark and Delta, and exit")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log at INFO: the stream's start and stop, each batch's "
                             "progress, the code generation chosen; -vv at DEBUG: also each "
                             "batch's whole batch_metrics row and phases, and py4j's connections")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser(
        "run", help="sessionize the events in a landing folder or a Kafka topic")
    run.add_argument("--source", metavar="DIR|kafka",
                     help="landing folder, or `kafka` to read --topic (default "
                          "$SESSIONLAKE_SOURCE)")
    run.add_argument("--format", dest="input_format", choices=INPUT_FORMATS,
                     help="input format (default jsonl)")
    _lake(run)
    run.add_argument("--checkpoint",
                     help="streaming checkpoint (default <lake>/_checkpoints/stream)")
    run.add_argument("--gap", help="inactivity gap that ends a session (default 30m)")
    run.add_argument("--grace", help="how late an event may be and still count (default 5m)")
    run.add_argument("--max-session-duration", dest="max_session_duration",
                     help="longer sessions are split (default 24h; at least --gap)")
    run.add_argument("--max-future-skew", dest="max_future_skew",
                     help="events further ahead of the clock are quarantined (default 1h)")
    run.add_argument("--trigger", choices=TRIGGERS,
                     help="process what is there and stop (default), or keep running")
    run.add_argument("--processing-interval", dest="processing_interval",
                     help="with --trigger continuous: time between micro-batches (default 10s)")
    run.add_argument("--max-files-per-trigger", type=int, dest="max_files_per_trigger",
                     help="at most this many files per micro-batch (default all)")
    run.add_argument("--read-subfolders", action="store_true", dest="read_subfolders",
                     help="a stream begun before sessionlake read the landing folder's "
                          "subfolders reads them from now on (newer streams do)")
    run.add_argument("--kafka-bootstrap", dest="kafka_bootstrap",
                     help="with --source kafka: the brokers (default "
                          "$SESSIONLAKE_KAFKA_BOOTSTRAP)")
    run.add_argument("--topic", dest="kafka_topic",
                     help="with --source kafka: the topic to read, every partition "
                          "(default $SESSIONLAKE_KAFKA_TOPIC)")
    run.add_argument("--starting-offsets", dest="kafka_starting_offsets",
                     choices=STARTING_OFFSETS,
                     help="with --source kafka: where a new checkpoint starts in the topic "
                          "(default earliest; a restart resumes from its checkpoint)")
    run.add_argument("--max-offsets-per-trigger", type=int,
                     dest="kafka_max_offsets_per_trigger",
                     help="with --source kafka: at most this many records per micro-batch "
                          "(default all)")
    run.add_argument("--kafka-reread-wait", dest="kafka_reread_wait",
                     help="with --trigger continuous: the wait before a batch that failed "
                          "on Kafka brokers that stopped answering, or on a lost executor, is "
                          "read again; twice as long after each failure in a row, up to 12 "
                          "times (default 5s)")
    run.add_argument("--accept-kafka-data-loss", action="store_true",
                     dest="kafka_accept_data_loss",
                     help="with --source kafka: skip, with a warning, records deleted from the "
                          "topic before the stream read them, instead of refusing to run")
    run.add_argument("--kafka-properties", dest="kafka_properties", metavar="FILE",
                     help="with --source kafka: a Java properties file of Kafka client "
                          "settings (security.protocol, sasl.*, ssl.*; passwords stay out of "
                          "the command line) (default $SESSIONLAKE_KAFKA_PROPERTIES)")
    run.add_argument("--alert-batch-duration", dest="alert_batch_duration",
                     help="log an ALERT line for a batch that takes longer (default 5m)")
    run.add_argument("--alert-quarantine-fraction", dest="alert_quarantine_fraction",
                     help="log an ALERT line for a batch with a larger share of quarantined "
                          "records, such as a wrong --format's (default 0.5)")
    run.add_argument("--alert-late-fraction", dest="alert_late_fraction",
                     help="log an ALERT line for a batch with a larger share of late "
                          "records (default 0.1)")
    run.add_argument("--check-only", action="store_true", dest="check_only",
                     help="only check that this run could start (its source, and the gap, "
                          "format and folder or topic the lake and checkpoint noted); take no "
                          "lock and change nothing, also beside a running stream")
    _common_spark(run)

    sql = commands.add_parser("sql", help="Delta SQL over the lake's tables by name")
    _lake(sql)
    sql.add_argument("statement", nargs="?",
                     help='for example "SELECT count(*) FROM sessions"')
    sql.add_argument("--query", help="run this named query instead (see --list)")
    sql.add_argument("--param", dest="params", action="append", default=[],
                     help="name=value for the named query (repeatable)")
    sql.add_argument("--list", action="store_true", help="list the named queries and exit")
    sql.add_argument("--as-of", dest="as_of",
                     help="read the lake as it was: a version of sessions, or a UTC time "
                          "such as 2026-01-31 or 2026-01-31T18:00:00Z")
    sql.add_argument("--output", choices=OUTPUT_FORMATS, default="table",
                     help="an aligned table (default); vertical, a line per column, for wide "
                          "rows; CSV with a header; or JSON lines")
    sql.add_argument("--limit", type=_at_least(0), default=None,
                     help=f"print at most this many rows (--output table or vertical: "
                          f"{TABLE_ROWS:,} unless given)")
    _common_spark(sql)

    serve = commands.add_parser(
        "serve", help="a Spark Connect server with the lake's tables, for notebooks and BI")
    _lake(serve)
    serve.add_argument("--port", type=_at_least(1, 65535), default=15002,
                       help="Spark Connect port (15002)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (127.0.0.1; 0.0.0.0 for every interface, "
                            "behind a TLS proxy)")
    serve.add_argument("--token-file", type=Path, dest="token_file", metavar="FILE",
                       help="where to write the token clients must send, readable by its "
                            "owner alone (~/.sessionlake/connect-PORT.token; the token is "
                            "$SESSIONLAKE_CONNECT_TOKEN, else a new random one)")
    _common_spark(serve)

    gen = commands.add_parser("generate", help="write a synthetic clickstream (jsonl)")
    gen.add_argument("--out", required=True, help="folder to write part-*.jsonl files into")
    gen.add_argument("--users", type=int, required=True, help="distinct users")
    gen.add_argument("--events", type=int, required=True, help="distinct events")
    gen.add_argument("--files", type=int, default=10,
                     help="files, in event-time order (10); late events go into the last")
    gen.add_argument("--late-fraction", type=float, default=GENERATED_LATE, dest="late_fraction",
                     help="chance that an event of the stream's first 30%% of time arrives "
                          f"in the last file, after the watermark passed it ({GENERATED_LATE}; "
                          "so about 0.3 x this of all events are late)")
    gen.add_argument("--duplicate-fraction", type=float, default=GENERATED_DUPLICATES,
                     dest="duplicate_fraction",
                     help="extra lines repeating an event, per event "
                          f"({GENERATED_DUPLICATES})")
    gen.add_argument("--malformed-fraction", type=float, default=GENERATED_MALFORMED,
                     dest="malformed_fraction",
                     help=f"extra lines to be quarantined, per event ({GENERATED_MALFORMED}); "
                          "all three 0 for a clean stream")
    gen.add_argument("--seed", type=int, default=0, help="random seed (0): same seed, same files")

    report = commands.add_parser(
        "report", help="a summary of the lake, and an HTML page of charts (no Spark)")
    _lake(report)
    report.add_argument("--source", help="landing folder whose waiting input is sized "
                                         "(default $SESSIONLAKE_SOURCE)")
    report.add_argument("--checkpoint",
                        help="streaming checkpoint (default <lake>/_checkpoints/stream)")
    report.add_argument("--html", type=Path,
                        help="also write sessions per hour and session lengths as charts here")

    _add_maintenance(commands)
    return parser


def _at_least(minimum: int, maximum: int = JAVA_INT_MAX) -> Callable[[str], int]:
    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {minimum}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"{text!r} must be <= {maximum}")
        return value

    return whole


def _iso_date(text: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date like 2026-01-31") from None


def _user_id(text: str) -> str:
    """A user id to erase, as the DAG's ``erase_user_ids`` takes it: one pasted with a
    space or line end around it would match no row, and the erasure would succeed having
    erased nobody."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a user id must not be empty")
    if text != text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} begins or ends with white space, and ids are matched exactly: give "
            "it without, or, where the space is part of the id, its SHA-256 with "
            "--erase-user-sha256")
    return text


def _user_hash(text: str) -> str:
    from sessionlake.erasure import USER_HASH

    if not USER_HASH.match(text.lower()):
        raise argparse.ArgumentTypeError(f"{text!r} is not a SHA-256 (64 hex digits)")
    return text.lower()


def _add_maintenance(commands: Any) -> None:
    """The maintenance sub-commands behind the Airflow DAGs, callable by hand."""
    checkpoint_help = "streaming checkpoint (default <lake>/_checkpoints/stream)"

    snap = commands.add_parser("snapshot", help="a consistent restore point of the lake")
    _lake(snap)
    snap.add_argument("--checkpoint", help=checkpoint_help)
    snap.add_argument("--name", help="a label for the restore point")
    snap.add_argument("--list", action="store_true", help="list the restore points instead")
    snap.add_argument("--max-age-days", dest="max_age_days", type=_at_least(1, MAX_AGE_DAYS),
                      metavar="N",
                      help="then expire the snapshots taken more than N days ago (the "
                           "--keep-last newest stay, one at least); VACUUM no longer keeps "
                           "files for them")
    snap.add_argument("--keep-last", dest="keep_last", type=_at_least(1), metavar="N",
                      help="then expire all but the N newest (with --max-age-days: keep "
                           "them, however old)")
    snap.add_argument("--expire-only", dest="expire_only", action="store_true",
                      help="expire as asked, take no new snapshot")
    _common_spark(snap)

    restore = commands.add_parser("restore", help="return the tables and checkpoint to a snapshot")
    _lake(restore)
    restore.add_argument("--checkpoint", help=checkpoint_help)
    restore.add_argument("--snapshot", required=True,
                         help="id printed by `sessionlake snapshot`, or the --name given to it")
    restore.add_argument("--accept-kafka-data-loss", action="store_true",
                         dest="kafka_accept_data_loss",
                         help="for a Kafka stream: restore even when the topic no longer "
                              "holds records the snapshot's stream reads on from (their "
                              "events leave the lake for good)")
    restore.add_argument("--kafka-properties", dest="kafka_properties", metavar="FILE",
                         help="for a Kafka stream: the Kafka client settings to ask its "
                              "brokers with (default $SESSIONLAKE_KAFKA_PROPERTIES)")
    restore.add_argument("--check-only", action="store_true", dest="check_only",
                         help="only check that the restore could be done now (the "
                              "snapshot's files kept, a Kafka topic's records still there); "
                              "change nothing, also beside a running stream")
    _common_spark(restore)

    compact = commands.add_parser("compact", help="OPTIMIZE tables where small files piled up")
    _lake(compact)
    compact.add_argument("--min-files", dest="min_files", type=_at_least(1),
                         default=COMPACTION_MIN_FILES,
                         help="compact a table with at least this many small files (16)")
    compact.add_argument("--table", dest="tables", action="append",
                         help="only this table (repeatable; default every table)")
    _common_spark(compact)

    retention = commands.add_parser(
        "retention", help="age limits, per-user erasure across every table, VACUUM")
    _lake(retention)
    retention.add_argument("--checkpoint", help=checkpoint_help)
    retention.add_argument("--erase-user", dest="erase_users", action="append", default=[],
                           type=_user_id, help="erase this user everywhere (repeatable)")
    retention.add_argument("--erase-user-sha256", dest="erase_user_sha256", action="append",
                           default=[], type=_user_hash, metavar="HASH",
                           help="erase the user whose id has this SHA-256 (64 hex digits; "
                                "repeatable): no id in the command line or its logs")
    retention.add_argument("--sessions-max-age-days", dest="sessions_max_age_days",
                           type=_at_least(1, MAX_AGE_DAYS),
                           help="delete sessions older than this")
    retention.add_argument("--events-max-age-days", dest="events_max_age_days",
                           type=_at_least(1, MAX_AGE_DAYS),
                           help="delete events older than this")
    retention.add_argument("--vacuum-retain-hours", dest="vacuum_retain_hours",
                           type=_at_least(0, MAX_AGE_DAYS * 24),
                           help="VACUUM files older than this (never below what the stream "
                                "or a kept snapshot needs, unless --force-vacuum)")
    retention.add_argument("--force-vacuum", dest="force_vacuum", action="store_true",
                           help="VACUUM even below what kept snapshots need (they expire)")
    retention.add_argument("--dry-run", dest="dry_run", action="store_true",
                           help="only count the rows it would delete and the files VACUUM "
                                "would remove; change nothing, write no audit row")
    retention.add_argument("--kafka-properties", dest="kafka_properties", metavar="FILE",
                           help="for a lake with Kafka streams: the Kafka client settings "
                                "an erasure asks their brokers with, to note where their "
                                "records end (default $SESSIONLAKE_KAFKA_PROPERTIES)")
    _common_spark(retention)

    doctor = commands.add_parser(
        "doctor",
        help="check the lake and checkpoint for damage (read-only); exit 1 if a check fails")
    _lake(doctor)
    doctor.add_argument("--checkpoint", help=checkpoint_help)
    doctor.add_argument("--source", help="landing folder, for the printed `run` command "
                                         "(default $SESSIONLAKE_SOURCE)")
    _common_spark(doctor, "; a local lake is checked without Spark")

    rebuild = commands.add_parser(
        "rebuild-state", help="recompute open_sessions from events and sessions")
    _lake(rebuild)
    rebuild.add_argument("--checkpoint", help=checkpoint_help)
    rebuild.add_argument("--gap", help="the stream's gap (default 30m)")
    rebuild.add_argument("--grace", help="the stream's grace (default 5m)")
    rebuild.add_argument("--max-session-duration", dest="max_session_duration",
                         help="the stream's maximum session duration (default 24h)")
    _common_spark(rebuild)

    archive = commands.add_parser(
        "archive", help="move the landing folder's files no restore can make the stream "
                        "read again out of it")
    _lake(archive)
    archive.add_argument("--source", help="landing folder (default $SESSIONLAKE_SOURCE)")
    archive.add_argument("--checkpoint", help=checkpoint_help)
    archive.add_argument("--to", dest="archive_to", required=True,
                         help="folder to move them to, outside the landing folder (each file "
                              "keeps its path below it)")
    archive.add_argument("--dry-run", dest="dry_run", action="store_true",
                         help="only count what would move")

    backfill = commands.add_parser(
        "backfill", help="re-sessionize a date range from events, replacing it in sessions")
    _lake(backfill)
    backfill.add_argument("--from", dest="from_date", required=True, type=_iso_date,
                          help="first session date (UTC), e.g. 2026-01-01")
    backfill.add_argument("--to", dest="to_date", required=True, type=_iso_date,
                          help="last session date (UTC), inclusive")
    backfill.add_argument("--gap", help="inactivity gap (default: the configured gap, 30m)")
    _common_spark(backfill)


def _settings(args: argparse.Namespace) -> Settings:
    keys = ("lake", "source", "checkpoint", "input_format", "gap", "grace",
            "max_session_duration", "max_future_skew", "trigger", "processing_interval",
            "shuffle_partitions", "max_files_per_trigger", "read_subfolders", "master",
            "alert_batch_duration", "alert_late_fraction", "alert_quarantine_fraction",
            "kafka_bootstrap", "kafka_topic", "kafka_starting_offsets",
            "kafka_max_offsets_per_trigger", "kafka_reread_wait", "kafka_accept_data_loss",
            "kafka_properties")
    return settings_from({k: getattr(args, k, None) for k in keys})


def _spark(settings: Settings, app: str, *, kafka: bool = False,
           quick_start: bool = False, runs_stream: bool = False) -> Any:
    """The command's Spark session, once its master answers; on a cluster, only when
    its executors see the lake's folder as the driver does (and, for a run, which makes
    the lake's folder, its landing folder)."""
    from sessionlake.spark import (
        build_spark,
        check_executors_see,
        check_kafka_jars,
        check_master_answers,
        warn_of_many_shuffle_partitions,
    )

    check_master_answers(settings.master)
    if kafka:
        check_kafka_jars()
    spark = build_spark(settings.master, app_name=app,
                        shuffle_partitions=settings.shuffle_partitions, quick_start=quick_start)
    check_executors_see(spark, settings.lake, make=runs_stream,
                        source=None if not runs_stream or kafka else settings.source)
    warn_of_many_shuffle_partitions(spark, settings.shuffle_partitions)
    _cancel_jobs_on_ctrl_c(spark)
    return spark


#: The Spark session the running command built (:func:`_spark`), whose jobs Ctrl-C ends.
_COMMAND_SESSION: list[Any] = []
#: Set by Ctrl-C: an error raised after it (a job cancelled, py4j's cleanup of the call
#: it cut off failing) is the interruption's, and said as one.
_CTRL_C = threading.Event()


def _cancel_jobs_on_ctrl_c(spark: Any) -> None:
    """Ctrl-C: cancel the session's Spark jobs, from a thread of its own, and stop where
    Python waits (``KeyboardInterrupt``, said in one line by :func:`_interrupted`).

    Spark's own handler calls the JVM from the main thread, which is often in a call of its
    own: that call fails on the busy connection, py4j logs pages of traces, and the jobs
    run on to the JVM's shutdown (a `compact` printed 50 lines, then Spark's errors from
    jobs cut off by its death)."""
    if threading.current_thread() is not threading.main_thread():
        return
    _COMMAND_SESSION[:] = [spark]

    def cancel() -> None:
        for attempt in range(3):  # a connection of py4j's pool the JVM closed fails once
            try:
                spark.sparkContext.cancelAllJobs()
                return
            except Exception:
                log.debug("cancelling Spark's jobs on Ctrl-C failed (attempt %d)",
                          attempt + 1, exc_info=True)

    def interrupted(signum: int, frame: Any) -> None:
        _CTRL_C.set()
        threading.Thread(target=cancel, name="cancel-on-ctrl-c", daemon=True).start()
        raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupted)


def _not_a_call_cut_off(record: logging.LogRecord) -> bool:
    """Leave out py4j's trace of a call into the JVM that Ctrl-C cut off (an ERROR on the
    root logger): the command says in one line that it was interrupted."""
    return record.getMessage() != "KeyboardInterrupt while sending command."


def cmd_run(args: argparse.Namespace) -> int:
    """``sessionlake run``: drain (or follow) the landing folder into the lake."""
    from sessionlake.archive import warn_of_read_files_left
    from sessionlake.checkpoint import unread_input, warn_of_files_in_no_order
    from sessionlake.stream import (
        check_run,
        check_source,
        run_stream,
    )

    settings = _settings(args)
    check_source(settings)
    if args.check_only:
        check_run(_spark(settings, "sessionlake-run-check", kafka=settings.reads_kafka,
                         quick_start=True), settings)
        print("run possible; nothing changed")
        return 0
    unread = unread_input(settings.source or "", settings.checkpoint)
    warn_of_read_files_left(unread, settings.source or "")
    warn_of_files_in_no_order(unread, settings.source or "", settings.max_files_per_trigger)
    spark = _spark(settings, "sessionlake-run", kafka=settings.reads_kafka,
                   quick_start=_quick_start(settings, unread), runs_stream=True)
    # A bar for runs that end (available-now); a continuous run is followed in its log.
    bar = progress("micro-batches") if settings.trigger == "available-now" else nullcontext()
    with bar as step:
        summary = run_stream(spark, settings, on_batch=_batch_step(step))
    print(summary.summary())
    return 0


def _quick_start(settings: Settings, unread: UnreadInput | None) -> bool:
    """Whether this run's driver compiles with C1 only, by what it has to read; logged."""
    from sessionlake.spark import QUICK_START_MAX_BATCHES, QUICK_START_MAX_BYTES, quick_start_for

    if settings.trigger != "available-now":  # runs for as long as it is left to
        unread = None
    quick = quick_start_for(unread, settings.max_files_per_trigger)
    size = "unknown" if unread is None else (
        f"{unread.bytes / 2**20:.1f} MiB in {unread.batches(settings.max_files_per_trigger)}"
        " batch(es)")
    log.info("input to read: %s; the driver compiles with %s (C1 only up to %d MiB in %d "
             "batches)", size, "C1 only" if quick else "C1 and C2",
             QUICK_START_MAX_BYTES // 2**20, QUICK_START_MAX_BATCHES)
    return quick


def _quick_query(settings: Settings, statement: str) -> bool:
    """Whether a query's driver compiles with C1 only, by the tables it reads; logged."""
    from sessionlake.query import bytes_to_read
    from sessionlake.spark import QUERY_QUICK_MAX_BYTES, quick_start_for_query

    size = bytes_to_read(settings.lake, statement)
    quick = quick_start_for_query(size)
    log.info("tables to read: %s; the driver compiles with %s (C1 only up to %d MiB)",
             "unknown" if size is None else f"{size / 2**20:.1f} MiB",
             "C1 only" if quick else "C1 and C2", QUERY_QUICK_MAX_BYTES // 2**20)
    return quick


def _batch_step(step: Step | None) -> Callable[[Any], None] | None:
    """``run_stream``'s ``on_batch`` that moves a progress bar, if there is one."""
    if step is None:
        return None
    bar = step
    return lambda report: bar(f"batch {report.row['batch_id']}")


def cmd_sql(args: argparse.Namespace) -> int:
    """``sessionlake sql``: run a statement or a named query and print its rows."""
    from pyspark.errors import AnalysisException, ParseException, PySparkException
    from pyspark.logger import PySparkLogger

    from sessionlake.query import (
        check_named_query,
        named_queries,
        names_hint,
        parse_as_of,
        parse_param_assignments,
        run_named_query,
        run_sql,
        write_frame,
    )
    from sessionlake.spark import quiet_task_failures
    from sessionlake.storage import local_path
    from sessionlake.tables import no_lake_at

    if args.list:
        if args.statement is not None or args.query is not None:
            raise UsageError("--list runs nothing: give it without a statement or --query")
        for name, query in named_queries().items():
            flags = "".join(f" [--param {p.name}={p.default}]" for p in query.params)
            print(f"{name}{flags}\n    {query.description}")
        return 0
    if (args.statement is None) == (args.query is None):
        raise UsageError("give either a SQL statement or --query NAME (see --list)")
    if args.params and args.query is None:
        raise UsageError("--param goes with --query NAME")
    params = parse_param_assignments(args.params)
    as_of = parse_as_of(args.as_of) if args.as_of else None
    if args.query is not None:
        check_named_query(args.query, params)
    settings = _settings(args)
    if local_path(settings.lake) is not None and \
            (missing := no_lake_at(None, settings.lake)) is not None:
        raise UsageError(missing)  # told before a JVM starts for it (6 s)
    statement = named_queries()[args.query].text if args.query is not None else args.statement
    spark = _spark(settings, "sessionlake-sql", quick_start=_quick_query(settings, statement))
    # PySpark logs an analysis error with its query context as a JSON record with a Java
    # stack trace before raising it; the one line below says what is wrong.
    PySparkLogger.getLogger("SQLQueryContextLogger").disabled = True
    try:
        with quiet_task_failures(spark):
            if args.query is not None:
                frame = run_named_query(spark, settings.lake, args.query, params, as_of)
            else:
                frame = run_sql(spark, settings.lake, args.statement, as_of)
            write_frame(frame, args.output, sys.stdout, args.limit)
    except (AnalysisException, ParseException) as error:
        first = str(error).strip().splitlines()[0]
        if error.getCondition() == "TABLE_OR_VIEW_NOT_FOUND":
            missing = (error.getMessageParameters() or {}).get("relationName", "")
            first = f"{first} ({names_hint(missing)})"
        raise UsageError(f"the query failed: {first}") from None
    except PySparkException as error:  # at run time: a division by zero, a bad cast...
        if _unreadable_file(error) is not None:
            raise  # damage, not the query's fault: see main
        first = str(error).strip().splitlines()[0]
        print(f"sessionlake: error: the query failed while running: {first}", file=sys.stderr)
        return EXIT_QUERY_FAILED
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """``sessionlake serve``: Spark Connect with the lake's tables until SIGTERM/SIGINT."""
    from sessionlake.serve import serve_lake

    settings = _settings(args)
    serve_lake(settings, host=args.host, port=args.port, token_file=args.token_file)
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """``sessionlake generate``: write a synthetic clickstream for demos and benchmarks."""
    from sessionlake.generate import generate_clickstream

    if not args.out.strip():
        raise UsageError("--out is empty: name the folder to write the files to")
    try:
        result = generate_clickstream(
            Path(args.out), users=args.users, events=args.events, files=args.files,
            late_fraction=args.late_fraction, duplicate_fraction=args.duplicate_fraction,
            malformed_fraction=args.malformed_fraction, seed=args.seed,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    print(
        f"wrote {len(result.files)} files to {args.out}: {result.events} events "
        f"({result.late} held back to the last file: late when each file is a batch, "
        f"--max-files-per-trigger 1), {result.duplicates} duplicates, "
        f"{result.malformed} malformed, "
        f"{_as_written(result.first_event_time)} .. {_as_written(result.last_event_time)}"
    )
    return 0


def _as_written(moment: datetime) -> str:
    """A time as ``generate`` writes event times: UTC, to the millisecond."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def cmd_snapshot(args: argparse.Namespace) -> int:
    """``sessionlake snapshot``: record a restore point and print its id (or list them),
    then expire the snapshots the rules name."""
    from sessionlake.health import unrestorable_versions
    from sessionlake.snapshots import (
        create_snapshot,
        expire_snapshots,
        list_snapshots,
    )
    from sessionlake.storage import local_path
    from sessionlake.tables import no_lake_at

    settings = _settings(args)
    expires = args.max_age_days is not None or args.keep_last is not None
    if args.list and (expires or args.expire_only):
        raise UsageError("--list changes nothing: give it without --max-age-days, "
                         "--keep-last or --expire-only")
    if args.expire_only and not expires:
        raise UsageError("--expire-only needs --max-age-days N or --keep-last N: which "
                         "snapshots to expire")
    if args.list:
        if (no_lake := no_lake_at(None, settings.lake)) is not None:
            raise UsageError(no_lake)
        listed: dict[str, dict[str, int]] = {}  # each table's files, listed once for all
        snapshots = list_snapshots(settings.lake)
        if not snapshots:
            print(f"no snapshots of {settings.lake}: `sessionlake snapshot` takes one")
        for snapshot in snapshots:
            missing = unrestorable_versions(settings.lake, snapshot.table_versions, listed)
            print(snapshot.summary() + (f"  [cannot be restored: {missing}]" if missing else ""))
        return 0
    # A snapshot reads and copies files: on this machine's disks, no JVM is needed.
    local = all(local_path(p) is not None for p in (settings.lake, settings.checkpoint))
    spark = None if local else _spark(settings, "sessionlake-snapshot")
    if args.expire_only:
        if (no_lake := no_lake_at(spark, settings.lake)) is not None:
            raise UsageError(no_lake)
    else:
        snapshot = create_snapshot(spark, settings, name=args.name)
        print(snapshot.summary())
        print(f"snapshot {snapshot.snapshot_id}")
    if expires:
        # After the new snapshot is written: it is among the newest an expiry keeps.
        for line in expire_snapshots(spark, settings, args.max_age_days,
                                     args.keep_last).lines():
            print(line)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    """``sessionlake restore``: return every table and the checkpoint to a snapshot."""
    from sessionlake.snapshots import (
        check_restore_possible,
        check_restore_request,
        restore_snapshot,
    )
    from sessionlake.spark import SparkOnDemand

    settings = _settings(args)
    # A local lake is restored from its logs; the JVM starts only if a step needs it.
    spark = SparkOnDemand(lambda: _spark(settings, "sessionlake-restore"))
    if args.check_only:
        snapshot = check_restore_possible(spark, settings, args.snapshot)
        print(f"restore to {snapshot.snapshot_id} possible; nothing changed")
        return 0
    check_restore_request(settings, args.snapshot)
    snapshot = restore_snapshot(spark, settings, args.snapshot)
    print(f"restored {snapshot.summary()}")
    return 0


def cmd_archive(args: argparse.Namespace) -> int:
    """``sessionlake archive``: move read files out of the landing folder (no JVM)."""
    from sessionlake.archive import archive_read_files

    report = archive_read_files(_settings(args), args.archive_to, dry_run=args.dry_run)
    print(report.summary())
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    """``sessionlake compact``: OPTIMIZE the tables that need it, report files before/after."""
    from sessionlake.compaction import checked_tables, compact_lake

    settings = _settings(args)
    tables = checked_tables(args.tables)  # a misspelt name is refused before Spark starts
    spark = _spark(settings, "sessionlake-compact")
    with progress("compaction", total=len(tables)) as step:
        reports = compact_lake(spark, settings.lake, min_files=args.min_files,
                               tables=tables, on_table=lambda r: step(r.table))
    for report in reports:
        print(report.summary())
    return 0


def cmd_retention(args: argparse.Namespace) -> int:
    """``sessionlake retention``: age limits, erasures, VACUUM, and an audit row; or, with
    ``--dry-run``, what they would delete."""
    from sessionlake.retention import (
        RetentionRequest,
        check_request,
        enforce_retention,
    )

    settings = _settings(args)
    request = RetentionRequest(
        erase_users=tuple(dict.fromkeys(args.erase_users)),
        erase_user_sha256=tuple(dict.fromkeys(args.erase_user_sha256)),
        sessions_max_age_days=args.sessions_max_age_days,
        events_max_age_days=args.events_max_age_days,
        vacuum_retain_hours=args.vacuum_retain_hours,
        force_vacuum=args.force_vacuum,
        dry_run=args.dry_run,
    )
    check_request(request)  # before a JVM starts: a wrong request is told at once
    spark = _spark(settings, "sessionlake-retention")
    report = enforce_retention(spark, settings, request)
    print(report.summary())
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    """``sessionlake backfill``: re-sessionize a date range and replace it in ``sessions``."""
    from sessionlake.backfill import BACKFILL_STEPS, backfill_sessions

    if args.from_date > args.to_date:
        raise UsageError(f"--from {args.from_date} is after --to {args.to_date}")
    settings = _settings(args)
    spark = _spark(settings, "sessionlake-backfill")
    with progress("backfill", total=len(BACKFILL_STEPS)) as step:
        report = backfill_sessions(spark, settings, args.from_date, args.to_date,
                                   on_step=step)
    print(report.summary())
    return 0


#: ``sessionlake doctor`` found damage.
EXIT_DAMAGED = 1


def cmd_doctor(args: argparse.Namespace) -> int:
    """``sessionlake doctor``: one line per check; exit 1 when any check fails."""
    from sessionlake.doctor import check_lake
    from sessionlake.storage import local_path

    settings = _settings(args)
    local = local_path(settings.lake) is not None and local_path(settings.checkpoint) is not None
    spark = None if local else _spark(settings, "sessionlake-doctor")
    report = check_lake(spark, settings)
    print("\n".join(report.lines()))
    return 0 if report.healthy else EXIT_DAMAGED


def cmd_rebuild_state(args: argparse.Namespace) -> int:
    """``sessionlake rebuild-state``: recompute ``open_sessions`` and print what was rebuilt."""
    from sessionlake.rebuild import rebuild_open_sessions

    settings = _settings(args)
    spark = _spark(settings, "sessionlake-rebuild-state")
    report = rebuild_open_sessions(spark, settings)
    print(report.summary())
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """``sessionlake report``: print the lake's summary; with ``--html``, write the charts."""
    from sessionlake.deltareader import DeltaReadError
    from sessionlake.report import build_report, format_summary, write_report_html
    from sessionlake.storage import file_in_the_way

    settings = _settings(args)
    if args.html is not None and (args.html.is_dir()
                                  or file_in_the_way(args.html.parent) is not None):
        raise UsageError(f"--html {args.html} is not a file to write: name an .html file "
                         "in a folder")
    try:
        report = build_report(settings)
    except DeltaReadError as error:
        raise UsageError(str(error)) from None
    if not report.health.lake_exists:
        raise UsageError(no_lake_message(settings.lake))
    sys.stdout.write(format_summary(report))
    if args.html is not None:
        write_report_html(report, args.html)
        print(f"wrote {args.html}")
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "sql": cmd_sql,
    "generate": cmd_generate,
    "serve": cmd_serve,
    "snapshot": cmd_snapshot,
    "restore": cmd_restore,
    "compact": cmd_compact,
    "archive": cmd_archive,
    "retention": cmd_retention,
    "backfill": cmd_backfill,
    "doctor": cmd_doctor,
    "rebuild-state": cmd_rebuild_state,
    "report": cmd_report,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sessionlake`` command."""
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # here, while a closed pipe can still be told apart
    except BrokenPipeError:
        # The output's reader went away (`sessionlake sql ... | head`): stop as other tools
        # do when their pipe closes, without a traceback, and write nothing more to it.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def configure_logging(verbosity: int) -> None:
    """Log at WARNING, INFO (``-v``) or DEBUG (``-vv``), the stream's batch lines always.

    py4j's INFO is two lines per call into the JVM (a connection opened, a command
    received), which would bury the batches' lines under ``-v``: it is shown from ``-vv``.
    """
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.INFO if verbosity >= 2 else logging.WARNING)
    logging.getLogger().addFilter(_not_a_call_cut_off)
    # The stream's line per batch (and its alerts) are always shown: they are its log.
    logging.getLogger("sessionlake.monitor").setLevel(logging.INFO)


#: Commands that commit nothing to a lake: a wrong variable of the writers' does not stop
#: them (``doctor`` least of all, which tells what to mend).
READ_ONLY_COMMANDS = frozenset({"sql", "serve", "report", "doctor", "generate"})


def _run(argv: Sequence[str] | None) -> int:
    """Parse the command line and run its command, turning known errors into one line."""
    args = build_parser().parse_args(argv)
    configure_logging(args.verbose)
    _COMMAND_SESSION.clear()
    _CTRL_C.clear()
    try:
        if args.command not in READ_ONLY_COMMANDS:
            check_process_environment()
        return COMMANDS[args.command](args)
    except (UsageError, ActionableError) as error:
        print(f"sessionlake: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        raise  # the output's reader went away: see main
    except KeyboardInterrupt:
        return _interrupted(args.command)
    except Exception as error:
        if _CTRL_C.is_set():
            return _interrupted(args.command)
        from sessionlake.kafkaadmin import kafka_timeout

        lost = _kafka_data_lost(error)
        if lost is not None:
            print(f"sessionlake: error: the stream stopped on records deleted from Kafka before "
                  f"it read them ({lost}): run it again, and it names them and how to skip "
                  "them", file=sys.stderr)
            return EXIT_USAGE
        unanswered = kafka_timeout(str(error))
        if unanswered is not None:
            print(f"sessionlake: error: the stream stopped: its Kafka brokers did not answer "
                  f"({unanswered}): run it again once they do; it goes on from its checkpoint",
                  file=sys.stderr)
            return EXIT_USAGE
        unreadable = _unreadable_file(error)
        if unreadable is None:
            return _failed(args.command, error)
        if args.command == "sql" and _travels_in_time(args):
            print(f"sessionlake: error: a data file of the version read is gone "
                  f"({unreadable}): VACUUM removes the files of versions older than its "
                  "retention, so time travel reaches back only as far as the last VACUUM "
                  "left files (`DESCRIBE HISTORY <table>` lists the VACUUM commits); read a "
                  "later version. `sessionlake doctor` tells damage to the lake as it is now",
                  file=sys.stderr)
            return EXIT_USAGE
        print(f"sessionlake: error: a data file of the lake cannot be read ({unreadable}): "
              "`sessionlake doctor` names the damage and how to recover from it",
              file=sys.stderr)
        return EXIT_DAMAGED


#: What a command stopped by Ctrl-C left, where there is more to say than that it stopped.
AFTER_INTERRUPT = {
    "retention": "its deletes may be done in some tables and not yet in others, and it wrote "
                 "no audit row: run the same command again, which finishes them (its audit "
                 "row counts this run's erasure deletes too)",
    "backfill": "run the same backfill again, which finishes what this one began",
    "restore": "run the same restore again, which finishes it (one cut off once it began "
               "changing the lake keeps the stream from starting until then)",
}


def _interrupted(command: str) -> int:
    """Say in one line that ``command`` was stopped by Ctrl-C, and what to do, rather than
    print the trace of wherever Python was waiting on Spark (the jobs in flight are
    cancelled: :func:`_cancel_jobs_on_ctrl_c`)."""
    for spark in _COMMAND_SESSION:  # its jobs end first, and what they say comes before
        with suppress(Exception):
            tracker, deadline = spark.sparkContext.statusTracker(), time.monotonic() + 10
            while tracker.getActiveJobsIds() and time.monotonic() < deadline:
                time.sleep(0.1)
    after = AFTER_INTERRUPT.get(command)
    print(f"sessionlake: {command} interrupted before it finished"
          + (f": {after}" if after else ""), file=sys.stderr)
    return EXIT_INTERRUPTED


#: A command that failed on an error it has no words of its own for.
EXIT_FAILED = 1


def _failed(command: str, error: Exception) -> int:
    """Print ``error``'s trace, then its cause in one line, last: a Spark failure's trace
    runs to thousands of lines of Java frames, and the tail of a log (Airflow's task error
    quotes its last lines) should say what went wrong, not where in the JVM."""
    from sessionlake.monitor import error_summary

    traceback.print_exc()
    summary = error_summary(f"{type(error).__name__}: {error}")
    if _jvm_gone(error):
        again = ("run it again: it goes on from its checkpoint and replays the batch it was "
                 "in" if command == "run" else AFTER_INTERRUPT.get(command, "run it again"))
        summary = (f"Spark's driver JVM is gone under it (killed: by hand, or by the kernel's "
                   f"OOM killer, which `dmesg` names); {again} ({summary})")
    print(f"sessionlake: error: {command} failed: {summary} (its trace is above)",
          file=sys.stderr)
    return EXIT_FAILED


def _jvm_gone(error: BaseException) -> bool:
    """Whether ``error`` is py4j's finding that the driver's JVM no longer answers: the
    Python side's socket refused or cut (a SIGKILL of the JVM alone, the kernel's OOM
    killer), rather than any error of the work itself."""
    from py4j.protocol import Py4JNetworkError

    return isinstance(error, Py4JNetworkError | ConnectionRefusedError | ConnectionResetError)


def _kafka_data_lost(error: BaseException) -> str | None:
    """Spark's reason when ``error`` stopped a stream on records that Kafka deleted before
    they were read: a ``KafkaIllegalStateException`` (``KAFKA_DATA_LOSS``) anywhere in its
    causes, which says "Some data may have been lost", then "Reason: ..." a few lines on."""
    text = str(error)
    if "KafkaIllegalStateException: Some data may have been lost" not in text:
        return None
    after = text.split("Some data may have been lost", 1)[1].splitlines()
    reasons = [line.strip().removeprefix("Reason: ") for line in after[:8]
               if line.strip().startswith("Reason: ")]
    return reasons[0] if reasons else "Kafka's offsets no longer hold them"


def _travels_in_time(args: argparse.Namespace) -> bool:
    """Whether a ``sql`` command reads an earlier version: ``--as-of``, or ``VERSION AS
    OF`` / ``TIMESTAMP AS OF`` in its statement."""
    statement = args.statement or ""
    return bool(args.as_of) or re.search(r"\b(VERSION|TIMESTAMP)\s+AS\s+OF\b", statement,
                                         re.IGNORECASE) is not None


def _unreadable_file(error: BaseException) -> str | None:
    """Spark's message when ``error`` is its failure to read a data file that the Delta log
    names (deleted, or cut short): damage, which ``sessionlake doctor`` diagnoses. Spark
    raises it as PySpark's own exception or, from a collect, as a ``Py4JJavaError``
    around the JVM's; a subquery's failure comes wrapped in another ("Exception thrown in
    awaitResult"), so the causes are looked through."""
    java = getattr(error, "java_exception", None)
    source: Any = error if java is None else java
    for _ in range(8):
        try:
            condition = str(source.getCondition() or "")
            message = str(error) if source is error else str(source.getMessage())
        except Exception:  # not a Spark error: no condition to ask for
            condition, message = "", ""
        if condition.startswith("FAILED_READ_FILE"):
            return message.strip().splitlines()[0]
        try:
            source = source.getCause() if java is not None else None
        except Exception:
            return None
        if source is None:
            return None
    return None


if __name__ == "__main__":
    sys.exit(main())

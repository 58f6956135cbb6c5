"""The ``sessionlake`` command line: thin wiring from flags to the package.

Every command validates its arguments before touching data; a wrong argument or input
prints one line (what is wrong, what to do) and exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from sessionlake.config import ConfigError, Settings, settings_from

EXIT_USAGE = 2


class UsageError(Exception):
    """A bad argument or input: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"sessionlake: error: {message} (see `{self.prog} --help`)\n")


def _common_spark(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--master", help="Spark master: local[*] (default) or spark://host:port")
    parser.add_argument("--shuffle-partitions", type=int, dest="shuffle_partitions",
                        help="spark.sql.shuffle.partitions (may change between runs)")


def _lake(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument("--lake", required=required,
                        help="lake folder or URI (default $SESSIONLAKE_LAKE)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every sub-command."""
    parser = _Parser(prog="sessionlake", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log every batch")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = commands.add_parser("run", help="sessionize the events in a landing folder")
    run.add_argument("--source", help="landing folder (default $SESSIONLAKE_SOURCE)")
    run.add_argument("--format", dest="input_format", choices=("jsonl", "apache"),
                     help="input format (default jsonl)")
    _lake(run)
    run.add_argument("--checkpoint",
                     help="streaming checkpoint (default <lake>/_checkpoints/stream)")
    run.add_argument("--gap", help="inactivity gap that ends a session (default 30m)")
    run.add_argument("--grace", help="how late an event may be and still count (default 5m)")
    run.add_argument("--max-session-duration", dest="max_session_duration",
                     help="longer sessions are split (default 24h)")
    run.add_argument("--max-future-skew", dest="max_future_skew",
                     help="events further ahead of the clock are quarantined (default 1h)")
    run.add_argument("--trigger", choices=("available-now", "continuous"),
                     help="process what is there and stop (default), or keep running")
    run.add_argument("--processing-interval", dest="processing_interval",
                     help="with --trigger continuous: time between micro-batches (default 10s)")
    run.add_argument("--max-files-per-trigger", type=int, dest="max_files_per_trigger",
                     help="at most this many files per micro-batch")
    _common_spark(run)

    sql = commands.add_parser("sql", help="Delta SQL over the lake's tables by name")
    _lake(sql)
    sql.add_argument("statement", help='for example "SELECT count(*) FROM sessions"')
    sql.add_argument("--output", choices=("table", "csv", "json"), default="table")
    sql.add_argument("--limit", type=int, default=None, help="print at most this many rows")
    _common_spark(sql)

    gen = commands.add_parser("generate", help="write a synthetic clickstream (jsonl)")
    gen.add_argument("--out", required=True, help="folder to write part-*.jsonl files into")
    gen.add_argument("--users", type=int, required=True)
    gen.add_argument("--events", type=int, required=True)
    gen.add_argument("--files", type=int, default=10)
    gen.add_argument("--late-fraction", type=float, default=0.0, dest="late_fraction")
    gen.add_argument("--duplicate-fraction", type=float, default=0.0, dest="duplicate_fraction")
    gen.add_argument("--malformed-fraction", type=float, default=0.0, dest="malformed_fraction")
    gen.add_argument("--seed", type=int, default=0)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    keys = ("lake", "source", "checkpoint", "input_format", "gap", "grace",
            "max_session_duration", "max_future_skew", "trigger", "processing_interval",
            "shuffle_partitions", "max_files_per_trigger", "master")
    return settings_from({k: getattr(args, k, None) for k in keys})


def _spark(settings: Settings, app: str) -> Any:
    from sessionlake.spark import JarsMissingError, build_spark

    try:
        return build_spark(settings.master, app_name=app,
                           shuffle_partitions=settings.shuffle_partitions)
    except JarsMissingError as error:
        raise UsageError(str(error)) from None


def cmd_run(args: argparse.Namespace) -> int:
    """``sessionlake run``: drain (or follow) the landing folder into the lake."""
    from sessionlake.stream import StreamAlreadyRunning, check_source, run_stream

    settings = _settings(args)
    check_source(settings)
    spark = _spark(settings, "sessionlake-run")
    try:
        summary = run_stream(spark, settings)
    except StreamAlreadyRunning as error:
        raise UsageError(str(error)) from None
    rows = summary.processed
    totals = {k: sum(r[k] for r in rows) for k in (
        "input_records", "accepted", "late", "quarantined", "duplicates", "closed_sessions")}
    open_now = rows[-1]["open_sessions"] if rows else "unchanged"
    print(
        f"processed {len(rows)} micro-batch(es): {totals['input_records']} records, "
        f"{totals['accepted']} accepted, {totals['late']} late, "
        f"{totals['quarantined']} quarantined, {totals['duplicates']} duplicates; "
        f"{totals['closed_sessions']} sessions closed, {open_now} open"
    )
    return 0


def cmd_sql(args: argparse.Namespace) -> int:
    """``sessionlake sql``: run a statement and print its rows."""
    from pyspark.errors import AnalysisException, ParseException

    from sessionlake.query import LakeNotFound, format_frame, run_sql

    settings = _settings(args)
    spark = _spark(settings, "sessionlake-sql")
    try:
        frame = run_sql(spark, settings.lake, args.statement)
        sys.stdout.write(format_frame(frame, args.output, args.limit))
    except LakeNotFound as error:
        raise UsageError(str(error)) from None
    except (AnalysisException, ParseException) as error:
        first = str(error).strip().splitlines()[0]
        raise UsageError(f"the query failed: {first}") from None
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    """``sessionlake generate``: write a synthetic clickstream for demos and benchmarks."""
    from sessionlake.generate import generate_clickstream

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
        f"({result.late} late), {result.duplicates} duplicates, {result.malformed} malformed, "
        f"{result.first_event_time.isoformat()} .. {result.last_event_time.isoformat()}"
    )
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": cmd_run,
    "sql": cmd_sql,
    "generate": cmd_generate,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sessionlake`` command."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return COMMANDS[args.command](args)
    except (UsageError, ConfigError) as error:
        print(f"sessionlake: error: {error}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())

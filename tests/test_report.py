"""``sessionlake report``: the summary and the HTML charts, read without Spark."""

from __future__ import annotations

import io
import re
import shutil
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sessionlake import cli
from sessionlake.progress import progress
from sessionlake.report import (
    build_report,
    duration_classes,
    format_summary,
    gaps_used,
    sessions_per_hour,
)
from tests.conftest import ObservedLake


def test_summary_of_the_observed_lake(observed_lake: ObservedLake) -> None:
    text = format_summary(build_report(observed_lake.settings))
    assert "3 closed, 1 open" in text
    # Sessions: u1 20 min, u2 one event, u3 10 min -> median 10 min, one bounce in three.
    assert "median length 10.0 min, 33% bounces" in text
    assert "13 in, 8 accepted, 3 late, 1 quarantined, 1 duplicates (3 batches)" in text
    assert "watermark     2026-01-05 13:00:00 UTC" in text
    assert (f"input         0 files, 0 B waiting; 3 files read and still in "
            f"{observed_lake.settings.source}\n") in text
    assert "busiest hour  2026-01-05 10:00 UTC: 2 sessions" in text
    assert f"snapshots     1 (newest {observed_lake.snapshot_id} nightly)\n" in text
    assert "gaps          30m\n" in text  # one gap: the stream's


def test_the_summary_names_the_snapshots_that_cannot_be_restored(
    observed_lake: ObservedLake
) -> None:
    report = build_report(observed_lake.settings)
    kept = report.health.snapshots[0]
    broken = replace(kept, snapshot_id="s-broken", name=None, unrestorable="sessions v2: ...")
    health = replace(report.health, snapshots=[broken, kept])
    text = format_summary(replace(report, health=health))
    assert (f"snapshots     2 (newest {kept.snapshot_id} nightly); cannot be restored: "
            "s-broken (`sessionlake doctor` says why)\n") in text


def test_report_command_writes_the_charts(
    observed_lake: ObservedLake, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "out" / "report.html"
    settings = observed_lake.settings
    assert cli.main(["report", "--lake", settings.lake, "--source", settings.source or "",
                     "--html", str(page)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"sessionlake report: {settings.lake}")
    assert f"0 files, 0 B waiting; 3 files read and still in {settings.source}" in out
    assert out.rstrip().endswith(f"wrote {page}")
    html = page.read_text()
    charts = re.findall(r"<svg .*?</svg>", html, re.S)
    assert len(charts) == 2
    # Sessions per hour: 10:00 has two, 11:00 none, 12:00 one.
    hours = re.findall(r'<rect class="bar"[^>]*><title>([^<]*)</title>', charts[0])
    assert hours == ["01-05 10:00: 2", "01-05 11:00: 0", "01-05 12:00: 1"]
    lengths = dict(t.split(": ") for t in
                   re.findall(r'<rect class="bar"[^>]*><title>([^<]*)</title>', charts[1]))
    assert (lengths["0 s"], lengths["5-15 min"], lengths["15-30 min"]) == ("1", "1", "1")


def test_report_on_a_missing_lake_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["report", "--lake", str(tmp_path / "none")]) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no lake at" in err[0]


def test_sessions_per_hour_fills_empty_hours() -> None:
    starts = [datetime(2026, 1, 5, 10, 59, tzinfo=UTC), datetime(2026, 1, 5, 13, 1, tzinfo=UTC)]
    assert [n for _, n in sessions_per_hour(starts)] == [1, 0, 0, 1]


@pytest.mark.parametrize(
    ("seconds", "label"),
    [(0, "0 s"), (9.9, "<10 s"), (10, "10-60 s"), (1799, "15-30 min"), (1800, "30-60 min"),
     (86400, "2 h+")],
)
def test_duration_classes(seconds: float, label: str) -> None:
    assert dict(duration_classes([seconds]))[label] == 1


def test_progress_draws_on_a_terminal_only(capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    screen = io.StringIO()
    with progress("compaction", total=3,
                  console=Console(file=screen, force_terminal=True, width=100)) as step:
        for table in ("events", "sessions", "quarantine"):
            step(table)
    assert "3/3" in screen.getvalue() and "compaction: quarantine" in screen.getvalue()
    with progress("compaction", total=3) as step:  # pytest's stderr is no terminal
        step("events")
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("damage", ["missing", "cut short"])
def test_a_damaged_sessions_file_is_a_problem_line_not_a_traceback(
    observed_lake: ObservedLake, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    damage: str,
) -> None:
    lake = tmp_path / "lake"
    shutil.copytree(observed_lake.settings.lake, lake)
    data = sorted((lake / "sessions").rglob("*.parquet"))[0]
    if damage == "missing":
        data.unlink()
    else:
        data.write_bytes(data.read_bytes()[:100])
    assert cli.main(["report", "--lake", str(lake)]) == 0
    out = capsys.readouterr().out
    [problem] = [line for line in out.splitlines() if "sessions could not be read" in line]
    assert problem.split()[0] == "problem" and problem.endswith(
        "`sessionlake doctor` names the damage and its recovery")
    assert "3 closed, 1 open" in out  # the rest of the report is there


def test_sessions_cut_with_more_than_one_gap_are_told_apart(observed_lake: ObservedLake) -> None:
    """After a backfill with another --gap, the lake mixes sessions of two gaps: the report
    says which, how many and from which days, the most used first."""
    day = datetime(2026, 1, 5, 10, tzinfo=UTC)
    gaps = gaps_used([(1800, day), (10, day), (1800, day + timedelta(days=2)), (10, day)])
    assert gaps == [(10, 2, day.date(), day.date()),
                    (1800, 2, day.date(), (day + timedelta(days=2)).date())]
    report = build_report(observed_lake.settings)
    assert report.sessions.stream_gap_s == 1800  # the stream's note
    mixed = replace(report, sessions=replace(report.sessions, gaps=[
        (1800, 3, day.date(), (day + timedelta(days=2)).date()), (10, 1, day.date(), day.date())]))
    assert ("gaps          30m 3 sessions started 2026-01-05..2026-01-07; 10s 1 session "
            "started 2026-01-05; the stream cuts with 30m (`sessionlake backfill --gap` re-cut "
            "a range)\n") in format_summary(mixed)
    # A backfill of every day there is: one gap left, not the stream's.
    recut = replace(report, sessions=replace(report.sessions, gaps=[
        (10, 4, day.date(), day.date())]))
    assert ("gaps          10s 4 sessions started 2026-01-05; the stream cuts with 30m "
            "(`sessionlake backfill --gap` re-cut a range)\n") in format_summary(recut)

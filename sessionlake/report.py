"""``sessionlake report``: a readable summary of the lake, and an HTML page of charts.

Read without Spark (:mod:`sessionlake.deltareader`), so it answers in seconds, with no JVM to
start: the pipeline's health (:mod:`sessionlake.health`) plus two pictures of the closed sessions,
sessions per hour (by start) and the distribution of session lengths, as inline SVG in
one self-contained HTML file.

Example::

    report = build_report(settings_from({"lake": "demo/lake"}))
    print(format_summary(report))
    Path("report.html").write_text(render_report_html(report))
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import date, datetime, timedelta
from html import escape
from pathlib import Path
from statistics import median

import pyarrow as pa

from sessionlake import deltareader
from sessionlake.charts import bar_chart
from sessionlake.checkpoint import noted_gap_s
from sessionlake.config import Settings, format_duration
from sessionlake.health import Health, collect_health
from sessionlake.health_page import (
    STYLE,
    counted,
    fmt_seconds,
    fmt_time,
    input_waiting_text,
)

#: Session lengths are counted in these classes: (label, upper bound in seconds, exclusive).
DURATION_CLASSES: tuple[tuple[str, float], ...] = (
    ("0 s", 1e-9), ("<10 s", 10), ("10-60 s", 60), ("1-5 min", 300), ("5-15 min", 900),
    ("15-30 min", 1800), ("30-60 min", 3600), ("1-2 h", 7200), ("2 h+", float("inf")),
)
#: At most this many hours are drawn (the newest ones).
MAX_HOURS = 14 * 24


@dataclass(frozen=True)
class SessionStats:
    """Closed sessions in numbers."""

    count: int
    median_duration_s: float | None
    mean_events: float | None
    bounce_rate: float | None
    #: (hour, sessions that started in it), every hour from the first to the last.
    per_hour: list[tuple[datetime, int]]
    #: (length class, sessions), in the order of :data:`DURATION_CLASSES`.
    durations: list[tuple[str, int]]
    #: (gap in seconds, sessions, first start day, last start day) of each gap the sessions
    #: were cut with, the most used first: more than one after a backfill with another.
    gaps: list[tuple[int, int, date, date]] = field(default_factory=list)
    #: The gap the lake's stream cuts with (its note at the first run), if noted.
    stream_gap_s: int | None = None


@dataclass(frozen=True)
class LakeReport:
    """What ``sessionlake report`` shows."""

    health: Health
    sessions: SessionStats


def build_report(settings: Settings) -> LakeReport:
    """Read the lake's health and its closed sessions. A data file of ``sessions`` that is
    missing or cut short is named among the problems, the session figures left empty: the
    report shows what it can, and ``sessionlake doctor`` says how to recover."""
    health = collect_health(settings)
    sessions_table = deltareader.local_table_path(settings.lake) / "sessions"
    stats = SessionStats(0, None, None, None, [], [])
    if deltareader.is_delta_table(sessions_table):
        try:
            stats = replace(session_stats(deltareader.read_state(sessions_table)),
                            stream_gap_s=stream_gap_s(settings.lake))
        except (OSError, pa.ArrowException) as error:
            problem = (f"sessions could not be read ({str(error).splitlines()[0]}): "
                       "`sessionlake doctor` names the damage and its recovery")
            health = replace(health, problems=[*health.problems, problem])
    return LakeReport(health, stats)


def session_stats(state: deltareader.TableState) -> SessionStats:
    """Counts, per-hour starts and length classes of the ``sessions`` table."""
    rows = deltareader.read_rows(
        state, ["session_start", "duration_s", "event_count", "is_bounce", "gap_s"]
    ).to_pylist()
    if not rows:
        return SessionStats(0, None, None, None, [], [])
    durations = [float(r["duration_s"]) for r in rows]
    return SessionStats(
        count=len(rows),
        median_duration_s=median(durations),
        mean_events=sum(int(r["event_count"]) for r in rows) / len(rows),
        bounce_rate=sum(1 for r in rows if r["is_bounce"]) / len(rows),
        per_hour=sessions_per_hour([r["session_start"] for r in rows]),
        durations=duration_classes(durations),
        gaps=gaps_used([(int(r["gap_s"]), r["session_start"]) for r in rows]),
    )


def stream_gap_s(lake: str) -> int | None:
    """The gap the lake's stream cuts its sessions with (:func:`noted_gap_s`), if noted."""
    try:
        noted = noted_gap_s(None, lake)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a note that does not parse: the next run says so
    return None if noted is None else int(noted)


def gaps_used(sessions: Sequence[tuple[int, datetime]]) -> list[tuple[int, int, date, date]]:
    """For each gap the sessions (gap in seconds, start) were cut with: how many, and the
    days they started on, the most used gap first. A stream cuts with one gap; a backfill
    may re-cut a date range with another, and the lake then mixes the two."""
    days: dict[int, list[date]] = {}
    for gap_s, start in sessions:
        days.setdefault(gap_s, []).append(start.date())
    return sorted(((gap_s, len(d), min(d), max(d)) for gap_s, d in days.items()),
                  key=lambda gap: (-gap[1], gap[0]))


def sessions_per_hour(starts: Sequence[datetime]) -> list[tuple[datetime, int]]:
    """Sessions per start hour, with the empty hours in between (the newest MAX_HOURS)."""
    hours = Counter(s.replace(minute=0, second=0, microsecond=0) for s in starts)
    if not hours:
        return []
    last = max(hours)
    first = max(min(hours), last - timedelta(hours=MAX_HOURS - 1))
    count = int((last - first).total_seconds() // 3600) + 1
    return [(first + timedelta(hours=i), hours.get(first + timedelta(hours=i), 0))
            for i in range(count)]


def duration_classes(durations: Sequence[float]) -> list[tuple[str, int]]:
    """How many sessions fall in each class of :data:`DURATION_CLASSES`."""
    counts = Counter(next(label for label, bound in DURATION_CLASSES if seconds < bound)
                     for seconds in durations)
    return [(label, counts.get(label, 0)) for label, _ in DURATION_CLASSES]


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def summary_lines(report: LakeReport) -> list[tuple[str, str]]:
    """The summary as (label, text) pairs, shared by the terminal and the HTML page."""
    health, stats = report.health, report.sessions
    last = health.last_batch
    totals = health.totals
    busiest = max(stats.per_hour, key=lambda hour: hour[1]) if stats.per_hour else None
    due = [t.name for t in health.tables if t.needs_compaction]
    retention = health.retention[-1] if health.retention else None
    return [
        ("last batch", f"#{last.batch_id} finished {fmt_time(last.finished_at)} in "
                       f"{fmt_seconds(last.duration_ms / 1000)}; lag behind newest event "
                       f"{fmt_seconds(last.lag_seconds)}" if last else "none yet"),
        ("watermark", fmt_time(health.watermark)),
        ("input", _input_text(health)),
        ("sessions", f"{health.closed_sessions or 0} closed, {health.open_sessions or 0} open;"
                     f" the closed: median length {fmt_seconds(stats.median_duration_s)}, "
                     f"{_percent(stats.bounce_rate)} bounces, "
                     + ("—" if stats.mean_events is None else f"{stats.mean_events:.1f}")
                     + " events per session"),
        ("gaps", _gaps_text(stats.gaps, stats.stream_gap_s)),
        ("records", f"{totals.get('input_records', 0)} in, {totals.get('accepted', 0)} "
                    f"accepted, {totals.get('late', 0)} late, {totals.get('quarantined', 0)} "
                    f"quarantined, {totals.get('duplicates', 0)} duplicates "
                    f"({health.batch_count} batch{'es' if health.batch_count != 1 else ''})"),
        ("busiest hour", f"{busiest[0].strftime('%Y-%m-%d %H:00 UTC')}: {busiest[1]} sessions"
                         if busiest else "—"),
        ("tables", f"{len(health.tables)} tables, {sum(t.files for t in health.tables)} "
                   f"files; compaction due: {', '.join(due) or 'none'}"),
        ("snapshots", _snapshots_text(health)),
        ("retention", f"last run {fmt_time(retention.started_at)}, "
                      f"{sum(retention.rows_deleted.values())} rows deleted"
                      if retention else "no run yet"),
        *(("problem", problem) for problem in health.problems),
    ]


def _gaps_text(gaps: Sequence[tuple[int, int, date, date]], stream_gap_s: int | None) -> str:
    """The gap the closed sessions were cut with. When a backfill's ``--gap`` re-cut a range
    with another than the stream's, each gap with its sessions and days, and the stream's:
    their figures are then not alike."""
    def gap(seconds: int) -> str:
        return format_duration(timedelta(seconds=seconds))

    if not gaps:
        return "—" if stream_gap_s is None else f"{gap(stream_gap_s)} (the stream's)"
    if len(gaps) == 1 and stream_gap_s in (None, gaps[0][0]):
        return gap(gaps[0][0])
    return "; ".join(
        f"{gap(gap_s)} {counted(count, 'session')} started "
        f"{first.isoformat()}" + ("" if last == first else f"..{last.isoformat()}")
        for gap_s, count, first, last in gaps) + (
        "" if stream_gap_s is None else f"; the stream cuts with {gap(stream_gap_s)}") + (
        " (`sessionlake backfill --gap` re-cut a range)")


def _snapshots_text(health: Health) -> str:
    """How many restore points, the newest, and those a restore would refuse: a snapshot
    a forced VACUUM broke must not pass for a restore point."""
    if not health.snapshots:
        return "0"
    newest = health.snapshots[-1]
    broken = [s for s in health.snapshots if s.unrestorable is not None]
    return (f"{len(health.snapshots)} (newest {newest.snapshot_id}"
            f"{' ' + newest.name if newest.name else ''})"
            + (f"; cannot be restored: {', '.join(s.snapshot_id for s in broken)} "
               f"(`sessionlake doctor` says why)" if broken else ""))


def _input_text(health: Health) -> str:
    """The backlog, and the read files left in the landing folder."""
    waiting = health.input_waiting
    if waiting is None:
        return input_waiting_text(health)
    return (f"{input_waiting_text(health)} waiting; {counted(waiting.read_left, 'file')} "
            f"read and still in {health.source}"
            + (" (`sessionlake archive` moves them out)" if waiting.archive_due else ""))


def format_summary(report: LakeReport) -> str:
    """The summary for a terminal: a title line, then one aligned line per topic."""
    lines = [f"sessionlake report: {report.health.lake} "
             f"(as of {fmt_time(report.health.generated_at)})"]
    lines += [f"  {label:<13} {text}" for label, text in summary_lines(report)]
    return "\n".join(lines) + "\n"


def render_report_html(report: LakeReport) -> str:
    """The report as one self-contained HTML page with two SVG charts."""
    stats = report.sessions
    hours = [(hour.strftime("%m-%d %H:00"), float(n)) for hour, n in stats.per_hour]
    rows = "".join(f"<tr><td>{escape(label)}</td><td>{escape(text)}</td></tr>"
                   for label, text in summary_lines(report))
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        "<title>sessionlake report</title>",
        f"<style>{STYLE} #summary td {{ text-align: left; }}</style></head><body>",
        "<h1>sessionlake report</h1>",
        f'<div class="muted">Lake {escape(report.health.lake)} · as of '
        f"{escape(fmt_time(report.health.generated_at))}</div>",
        f'<h2>Summary</h2><table id="summary"><tbody>{rows}</tbody></table>',
        "<h2>Closed sessions</h2>",
        '<div class="charts">',
        bar_chart("Sessions per hour (by start, UTC)", hours, width=900),
        bar_chart("Session length", [(label, float(n)) for label, n in stats.durations]),
        "</div>",
        "</body></html>",
    ])


def write_report_html(report: LakeReport, path: Path) -> None:
    """Write the HTML page to ``path`` (its folder is created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_report_html(report), encoding="utf-8")

"""The health page: :class:`sessionlake.health.Health` as one self-contained HTML page.

No script, no stylesheet or font from elsewhere: the Airflow UI shows it in a frame, on
machines that may have no network. Charts are inline SVG (:mod:`sessionlake.charts`);
every value is escaped.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from html import escape
from socket import gethostname
from typing import Any

from sessionlake.charts import line_chart
from sessionlake.config import KAFKA_SOURCE
from sessionlake.health import BatchPoint, Health, series
from sessionlake.storage import is_glob, local_path

#: Batches listed in the table of recent batches.
RECENT_BATCHES = 20
#: Refresh the page this often (seconds).
REFRESH_SECONDS = 60

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5rem; color: #222; }
h1 { font-size: 1.4rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.1rem; margin-top: 1.8rem; border-bottom: 1px solid #ddd; }
.muted { color: #666; font-size: 0.85rem; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8rem; margin-top: 1rem; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: 0.6rem 0.9rem; min-width: 9rem; }
.card .label { font-size: 0.8rem; color: #555; }
.card .value { font-size: 1.3rem; font-weight: 600; }
.problems { background: #fff4e5; border: 1px solid #f0a040; padding: 0.5rem 1rem; }
.warn { color: #b30000; font-weight: 600; }
table { border-collapse: collapse; font-size: 0.85rem; }
th, td { border: 1px solid #ddd; padding: 0.25rem 0.5rem; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.charts { display: flex; flex-wrap: wrap; gap: 1rem; }
"""


def fmt_time(value: datetime | None) -> str:
    """A UTC time to the second, or a dash."""
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"


def fmt_seconds(value: float | None) -> str:
    """A duration in the largest fitting unit: 42 s, 3.5 min, 2.1 h, 4.0 d."""
    if value is None:
        return "—"
    size = abs(value)
    if size < 120:
        return f"{value:.1f} s"
    if size < 7200:
        return f"{value / 60:.1f} min"
    if size < 172800:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} d"


def fmt_bytes(value: int) -> str:
    """Bytes in KiB, MiB, GiB."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def counted(count: int, noun: str) -> str:
    """``count`` and ``noun``, plural unless one ("1 file", "3 files")."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _cell(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, datetime):
        return fmt_time(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _table(headers: Sequence[str], rows: Iterable[Sequence[Any]], css_id: str) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(_cell(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f'<table id="{css_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _card(label: str, value: str, css_id: str) -> str:
    return (f'<div class="card" id="{css_id}"><div class="label">{escape(label)}</div>'
            f'<div class="value">{escape(value)}</div></div>')


def _cards(health: Health) -> str:
    last = health.last_batch
    return '<div class="cards">' + "".join([
        _card("Last batch", f"#{last.batch_id}" if last else "none yet", "last-batch"),
        _card("Last batch finished", fmt_time(last.finished_at if last else None),
              "last-batch-time"),
        _card("Lag behind newest event", fmt_seconds(health.lag_seconds), "lag"),
        _card("Watermark", fmt_time(health.watermark), "watermark"),
        _card("Open sessions", _cell(health.open_sessions), "open-sessions"),
        _card("Closed sessions", _cell(health.closed_sessions), "closed-sessions"),
        _card("Input waiting", input_waiting_text(health), "input-waiting"),
        _card("Stream", _stream_text(health), "stream"),
    ]) + "</div>"


def input_waiting_text(health: Health) -> str:
    """The landing folder's backlog: files and bytes no committed batch has read yet."""
    waiting = health.input_waiting
    if waiting is not None:
        return f"{counted(waiting.files, 'file')}, {fmt_bytes(waiting.bytes)}"
    source = health.source
    if source == KAFKA_SOURCE:
        topics = ", ".join(health.kafka_topics) or "?"
        return (f"not counted: Kafka topic {topics} (the offsets read are in the checkpoint: "
                "Spark commits none to a consumer group)")
    if not source:
        return "no landing folder set"
    if is_glob(source):
        return "not counted: the landing folder is a pattern, which only Spark lists"
    folder = local_path(source)
    if folder is None:
        return "not counted: the landing folder is not on this machine"
    if not folder.is_dir():
        return f"not counted: no landing folder at {source}"
    return "not counted: the stream's checkpoint could not be read here"


def archive_note(health: Health) -> str:
    """The read files still in the landing folder, which every run lists again."""
    waiting = health.input_waiting
    if waiting is None:
        return ""
    text = (f"{counted(waiting.read_left, 'file')} the stream has read "
            f"{'is' if waiting.read_left == 1 else 'are'} still in the landing folder"
            f" {health.source}")
    log = (f" The checkpoint's file source log, which every run reads back, holds "
           f"{fmt_bytes(waiting.log_bytes)}.")
    if not waiting.archive_due:
        return f'<p id="archive-due">{escape(text)}.{escape(log)}</p>'
    return (f'<p class="warn" id="archive-due">{escape(text)}, and every run lists them '
            "again: <code>sessionlake archive --to DIR</code> or the DAG "
            f"<code>sessionlake_archive</code> moves them out.{escape(log)}</p>")


def _stream_text(health: Health) -> str:
    """Whether a stream runs on the lake, with its pid and checkpoint: what to stop, or
    where to run, when a second run is refused."""
    if not health.stream_running:
        return "not running"
    pid = f"pid {health.stream_pid}" if health.stream_pid is not None else "pid unknown"
    if health.stream_host and health.stream_host != gethostname():
        pid += f" on host {health.stream_host}"  # the page runs in another container
    checkpoint = health.stream_checkpoint
    return f"running ({pid}, checkpoint {checkpoint})" if checkpoint else f"running ({pid})"


def _charts(batches: Sequence[BatchPoint]) -> str:
    labels = (fmt_time(batches[0].finished_at), fmt_time(batches[-1].finished_at)) \
        if batches else ("", "")
    return '<div class="charts">' + "".join([
        line_chart("Batch duration (s)", {"duration": series(batches, "duration_s")},
                   x_labels=labels, unit=" s"),
        line_chart("State size (open sessions)",
                   {"open sessions": series(batches, "open_sessions")}, x_labels=labels),
        line_chart("Late, quarantined and duplicate records per batch", {
            "late": series(batches, "late"),
            "quarantined": series(batches, "quarantined"),
            "duplicates": series(batches, "duplicates"),
        }, x_labels=labels),
    ]) + "</div>"


def _recent_batches(batches: Sequence[BatchPoint]) -> str:
    headers = ("batch", "finished", "duration", "input", "accepted", "late", "quarantined",
               "duplicates", "opened", "closed", "open after", "watermark after")
    rows = [(b.batch_id, b.finished_at, fmt_seconds(b.duration_ms / 1000), b.input_records,
             b.accepted, b.late, b.quarantined, b.duplicates, b.sessions_opened,
             b.closed_sessions, b.open_sessions, b.watermark_after)
            for b in reversed(batches[-RECENT_BATCHES:])]
    return _table(headers, rows, "batches")


def _tables(health: Health) -> str:
    headers = ("table", "version", "files", "size", "rows", "small files",
               "files OPTIMIZE would rewrite", "files with deletion vectors",
               "deleted rows pending", "compaction due", "last operation", "last commit")
    rows = [(t.name, t.version, t.files, fmt_bytes(t.bytes), t.rows, t.small_files,
             t.compactable_files, t.deletion_vector_files, t.deleted_rows,
             t.needs_compaction, t.last_operation, t.committed_at) for t in health.tables]
    return _table(headers, rows, "tables")


def _snapshots(health: Health) -> str:
    if not health.snapshots:
        return '<p id="snapshots">No snapshots yet (`sessionlake snapshot`).</p>'
    rows = [(s.snapshot_id, s.name, s.created_at, s.last_batch_id,
             "yes" if s.unrestorable is None else f"no: {s.unrestorable}")
            for s in reversed(health.snapshots)]
    return _table(("snapshot", "name", "taken at", "after batch", "restorable"), rows,
                  "snapshots")


def _retention(health: Health) -> str:
    if not health.retention:
        return '<p id="retention">No retention run yet (`sessionlake retention`).</p>'
    rows = [(r.run_id, r.started_at, r.erased_users, sum(r.rows_deleted.values()),
             r.files_vacuumed, r.time_travel_purged, r.note) for r in reversed(health.retention)]
    return _table(("run", "started", "users erased", "rows deleted", "files vacuumed",
                   "time travel purged", "note"), rows, "retention")


def _totals(health: Health) -> str:
    totals = health.totals
    rows = [(health.batch_count, totals.get("input_records", 0), totals.get("accepted", 0),
             totals.get("late", 0), totals.get("quarantined", 0), totals.get("duplicates", 0))]
    return _table(("batches", "input records", "accepted", "late", "quarantined",
                   "duplicates"), rows, "totals")


def render_health_page(health: Health, json_href: str = "api/health") -> str:
    """The whole page; ``json_href`` links to its JSON."""
    problems = "".join(f"<li>{escape(p)}</li>" for p in health.problems)
    due = [t.name for t in health.tables if t.needs_compaction]
    compaction_note = (
        f'<p class="warn" id="compaction-due">Compaction due: {escape(", ".join(due))}</p>'
        if due else '<p id="compaction-due">No table is due for compaction.</p>'
    )
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">',
        "<title>sessionlake pipeline health</title>",
        f"<style>{STYLE}</style></head><body>",
        "<h1>sessionlake pipeline health</h1>",
        f'<div class="muted">Lake {escape(health.lake)} · as of '
        f"{escape(fmt_time(health.generated_at))} · JSON: "
        f'<a href="{escape(json_href)}">{escape(json_href)}</a></div>',
        f'<div class="problems"><ul>{problems}</ul></div>' if problems else "",
        _cards(health),
        archive_note(health),
        "<h2>Batches over time</h2>",
        _charts(health.batches),
        "<h2>Totals</h2>",
        _totals(health),
        "<h2>Recent batches</h2>",
        _recent_batches(health.batches),
        "<h2>Tables and compaction debt</h2>",
        compaction_note,
        _tables(health),
        "<h2>Snapshots</h2>",
        _snapshots(health),
        "<h2>Retention audit</h2>",
        _retention(health),
        "</body></html>",
    ])

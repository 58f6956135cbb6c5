"""A synthetic clickstream in the jsonl event format, for demos, tests and benchmarks.

Users have sessions of a few events (inter-event times exponential, well under the gap),
separated by more than the session gap; the events are written in time order into
chronological files, as a landing folder receives them. On request a share of events is
delivered late (moved into the last file), repeated (duplicates), or joined by malformed
lines of every kind the validator knows. Same arguments and seed, same bytes.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

from sessionlake.storage import file_in_the_way

PAGES: tuple[str, ...] = (
    "/", "/pricing", "/signup", "/checkout", "/docs", "/docs/install", "/docs/quickstart",
    "/docs/sql", "/docs/airflow", "/docs/faq", "/blog", "/blog/state-without-ttl",
    "/blog/grace-periods", "/blog/exactly-once", "/blog/rebalances", "/about", "/careers",
    "/contact", "/login", "/account",
)
EVENT_TYPES: tuple[str, ...] = ("page_view", "click", "purchase")
EVENT_TYPE_WEIGHTS: tuple[float, ...] = (0.85, 0.12, 0.03)
MALFORMED: tuple[str, ...] = (
    '{"user_id": "u1", "event_time": ',
    "[1, 2, 3]",
    '{"event_time": "2026-01-05T10:00:00Z", "page": "/"}',
    '{"user_id": "", "event_time": "2026-01-05T10:00:00Z"}',
    '{"user_id": 12345, "event_time": "2026-01-05T10:00:00Z"}',
    '{"user_id": "u1", "page": "/"}',
    '{"user_id": "u1", "event_time": "yesterday"}',
    '{"user_id": "u1", "event_time": 1767607200}',
    '{"user_id": "u1", "event_time": "2026-01-05T10:00:00Z", "properties": "not an object"}',
)


@dataclass(frozen=True)
class GeneratedClickstream:
    """What :func:`generate_clickstream` wrote."""

    files: list[Path]
    events: int
    late: int
    duplicates: int
    malformed: int
    first_event_time: datetime
    last_event_time: datetime


def _check(name: str, value: float, low: float, high: float | None, text: str) -> None:
    if not value >= low or (high is not None and not value < high):  # NaN too
        raise ValueError(f"{name} must be {text}, got {value}")


def generate_clickstream(
    out: Path,
    *,
    users: int,
    events: int,
    files: int = 10,
    late_fraction: float = 0.0,
    duplicate_fraction: float = 0.0,
    malformed_fraction: float = 0.0,
    seed: int = 0,
    start: datetime = datetime(2026, 1, 5, tzinfo=UTC),
    mean_gap_between_events_s: float = 120.0,
    session_gap_s: float = 1800.0,
) -> GeneratedClickstream:
    """Write ``files`` chronological ``part-NNNNN.jsonl`` files into ``out``.

    :param late_fraction: share of events moved into the last file; with two or more
        files they arrive after the watermark has passed them, so they are late.
    :param duplicate_fraction: share of extra lines repeating an event (same id and user).
    :param malformed_fraction: share of extra lines that must be quarantined.
    :raises ValueError: on a bad argument or a folder that already holds jsonl files,
        before anything is written.
    """
    _check("users", users, 1, None, "a whole number >= 1")
    _check("events", events, 1, None, "a whole number >= 1")
    _check("files", files, 1, None, "a whole number >= 1")
    _check("seed", seed, 0, None, "a whole number >= 0")
    if files > events:
        raise ValueError(f"files must be at most events ({events}), got {files}: the others "
                         "would be empty")
    for name, value in (("late-fraction", late_fraction),
                        ("duplicate-fraction", duplicate_fraction),
                        ("malformed-fraction", malformed_fraction)):
        _check(name, value, 0.0, 1.0, "in [0, 1)")
    if (file := file_in_the_way(out)) is not None:
        raise ValueError(f"{out} is not a folder ({file} is a file): pass a new folder")
    if out.exists() and any(out.glob("*.jsonl")):
        raise ValueError(f"{out} already holds .jsonl files: pass an empty or new folder")

    rng = np.random.default_rng(seed)
    times_s, user_of = _event_times(rng, users, events, mean_gap_between_events_s,
                                    session_gap_s)
    order = np.argsort(times_s, kind="stable")
    times_s, user_of = times_s[order], user_of[order]
    pages = np.minimum(rng.zipf(1.6, size=events) - 1, len(PAGES) - 1)
    kinds = rng.choice(len(EVENT_TYPES), size=events, p=EVENT_TYPE_WEIGHTS)
    with_properties = rng.random(events) < 0.2
    with_offset = rng.random(events) < 0.05
    base = np.datetime64(start.astimezone(UTC).replace(tzinfo=None), "ms")
    stamps = base + (times_s * 1000).astype("timedelta64[ms]")

    def line(i: int) -> str:
        record: dict[str, object] = {
            "event_id": f"e{i:09d}", "user_id": f"u{user_of[i]:06d}",
            "event_time": _iso(stamps[i], bool(with_offset[i])),
            "event_type": EVENT_TYPES[kinds[i]], "page": PAGES[pages[i]],
        }
        if with_properties[i]:
            record["properties"] = {"plan": "pro" if i % 3 else "free", "items": int(i % 5)}
        return json.dumps(record, separators=(",", ":"))

    chunk = np.minimum(np.arange(events) * files // events, files - 1)
    late = rng.random(events) < late_fraction if files > 1 else np.zeros(events, bool)
    late &= times_s < np.quantile(times_s, 0.3)
    target = np.where(late, files - 1, chunk)
    buckets: list[list[str]] = [[] for _ in range(files)]
    for f in range(files):
        on_time = np.flatnonzero((chunk == f) & ~late)
        buckets[f].extend(line(int(i)) for i in on_time)
    for i in np.flatnonzero(late):
        buckets[files - 1].append(line(int(i)))

    duplicates = round(events * duplicate_fraction)
    for i in rng.choice(events, size=duplicates, replace=duplicates > events):
        buckets[int(target[i])].append(line(int(i)))
    malformed = round(events * malformed_fraction)
    for k in range(malformed):
        buckets[int(rng.integers(files))].append(MALFORMED[k % len(MALFORMED)])

    out.mkdir(parents=True, exist_ok=True)
    written = []
    landed = time.time() - files
    for f, lines in enumerate(buckets):
        path = out / f"part-{f:05d}.jsonl"
        path.write_text("\n".join(lines) + ("\n" if lines else ""), encoding="utf-8")
        # Spark's file source takes files oldest first: land them one second apart.
        os.utime(path, (landed + f, landed + f))
        written.append(path)
    first = start + timedelta(seconds=float(times_s.min()))
    last = start + timedelta(seconds=float(times_s.max()))
    return GeneratedClickstream(written, events, int(late.sum()), duplicates, malformed,
                                first, last)


def _event_times(
    rng: np.random.Generator, users: int, events: int, mean_gap_s: float, session_gap_s: float
) -> tuple[np.ndarray, np.ndarray]:
    """Seconds after the start, and the user, of every event (unsorted)."""
    sizes = rng.geometric(0.25, size=events // 2 + 1)
    sessions = int(np.searchsorted(np.cumsum(sizes), events)) + 1
    sizes = sizes[:sessions]
    sizes[-1] -= int(sizes.sum()) - events
    owner = np.sort(rng.integers(users, size=sessions))
    gaps = np.minimum(rng.exponential(mean_gap_s, size=events), session_gap_s * 0.9)
    session_of = np.repeat(np.arange(sessions), sizes)
    first_of_session = np.r_[0, np.cumsum(sizes)[:-1]]
    gaps[first_of_session] = 0.0
    in_session = np.cumsum(gaps) - np.repeat(np.cumsum(gaps)[first_of_session], sizes)
    duration = in_session[np.r_[first_of_session[1:] - 1, events - 1]]
    pause = session_gap_s * (1.5 + rng.exponential(1.0, size=sessions))
    advance = duration + pause
    # Each user's sessions follow one another from a random first start.
    cumulative = np.cumsum(advance) - advance
    user_first = np.r_[0, np.flatnonzero(np.diff(owner)) + 1]
    user_base = np.repeat(cumulative[user_first], np.diff(np.r_[user_first, sessions]))
    offset = rng.uniform(0, 6 * 3600, size=users)[owner]
    session_start = offset + cumulative - user_base
    return session_start[session_of] + in_session, owner[session_of]


def _iso(stamp: np.datetime64, with_offset: bool) -> str:
    if with_offset:
        local = np.datetime_as_string(stamp + np.timedelta64(2, "h"), unit="ms")
        return f"{local}+02:00"
    return f"{np.datetime_as_string(stamp, unit='ms')}Z"

"""Random streams against a model of SPEC's session semantics, written from SPEC alone.

Each case draws a few users' events on a minute grid (so that events exactly ``gap``
apart, equal times and out-of-order arrivals all occur), exact copies of some of them, and
cuts the arrival order into micro-batches. The engine runs them batch by batch; the model
below applies SPEC's rules ("Session semantics") to the same batches in plain Python. Both
must agree on every closed and open session, on which events were late, and on the number
of duplicates, and every record must be counted once.

The model keeps the events of open sessions and re-cuts them at each batch; the engine
keeps aggregates, so agreement checks its merging of runs and bridging of sessions too.
"""

from __future__ import annotations

import json
import os
import random
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import SparkSession

from sessionlake.config import settings_from
from sessionlake.tables import read_table
from tests.helpers import rows, run_batches

GAP = timedelta(minutes=30)
GRACE = timedelta(minutes=5)
DAY = datetime(2026, 1, 5, tzinfo=UTC)


@dataclass(frozen=True, order=True)
class Event:
    time: datetime
    event_id: str
    user: str


#: (user, session_start, session_end, event_count): how sessions are compared.
Session = tuple[str, datetime, datetime, int]


def cut(events: list[Event]) -> list[list[Event]]:
    """One user's events as sessions: maximal runs in which each event is less than the
    gap after the previous one (an event exactly the gap after starts a new session)."""
    runs: list[list[Event]] = []
    for event in sorted(events):
        if runs and event.time - runs[-1][-1].time < GAP:
            runs[-1].append(event)
        else:
            runs.append([event])
    return runs


def summary(run: list[Event]) -> Session:
    return (run[0].user, run[0].time, run[-1].time, len(run))


@dataclass
class Model:
    """SPEC's rules, batch by batch."""

    watermark: datetime | None = None  # W: the largest accepted time minus grace
    newest: datetime | None = None
    open_events: dict[str, list[Event]] = field(default_factory=lambda: defaultdict(list))
    closed: list[Session] = field(default_factory=list)
    late: set[str] = field(default_factory=set)
    accepted_ids: set[tuple[str, str]] = field(default_factory=set)
    duplicates: int = 0

    def batch(self, records: list[Event]) -> None:
        unique: dict[tuple[str, str], Event] = {}
        for record in records:
            key = (record.user, record.event_id)
            if key in self.accepted_ids or key in unique:
                self.duplicates += 1
            else:
                unique[key] = record
        by_user: dict[str, list[Event]] = defaultdict(list)
        for record in unique.values():
            by_user[record.user].append(record)
        for user, events in by_user.items():
            self._judge(user, events)
        if self.newest is not None:
            self.watermark = self.newest - GRACE
            self._close()

    def _judge(self, user: str, events: list[Event]) -> None:
        closed = [s for s in self.closed if s[0] == user]
        rest = []
        for event in events:  # (1) it would join a closed session
            if any(start - GAP < event.time < end + GAP for _, start, end, _ in closed):
                self.late.add(event.event_id)
            else:
                rest.append(event)
        batch_ids = {e.event_id for e in rest}
        old_ids = {e.event_id for e in self.open_events[user]}
        for run in cut(self.open_events[user] + rest):
            ids = {e.event_id for e in run}
            only_new = not ids & old_ids
            if only_new and self.watermark is not None and run[-1].time + GAP <= self.watermark:
                self.late |= ids  # (2) a session of this batch alone, already closed
                continue
            for event in run:
                if event.event_id in batch_ids:
                    self.open_events[user].append(event)
                    self.accepted_ids.add((user, event.event_id))
                    self.newest = max(self.newest or event.time, event.time)

    def _close(self) -> None:
        assert self.watermark is not None
        for user, events in self.open_events.items():
            keep = []
            for run in cut(events):
                if run[-1].time + GAP <= self.watermark:
                    self.closed.append(summary(run))
                else:
                    keep += run
            self.open_events[user] = keep

    def open_sessions(self) -> list[Session]:
        return sorted(summary(run) for events in self.open_events.values()
                      for run in cut(events))


def random_stream(seed: int) -> list[list[Event]]:
    """A few users' events over six hours, arriving somewhat out of order, with copies,
    cut into three to five micro-batches."""
    rng = random.Random(seed)
    events = [
        Event(DAY + timedelta(minutes=rng.randrange(0, 360, rng.choice([1, 5, 15]))),
              f"e{seed}-{i:03d}", f"u{rng.randrange(3)}")
        for i in range(rng.randrange(20, 60))
    ]
    # Arrival: by time, shaken by up to two hours, so that some events are late.
    arrival = sorted(events, key=lambda e: e.time + timedelta(minutes=rng.uniform(0, 120)))
    arrival += [rng.choice(events) for _ in range(rng.randrange(0, 6))]  # copies, late
    for _ in range(rng.randrange(0, 4)):  # copies in place
        at = rng.randrange(len(arrival))
        arrival.insert(at, arrival[rng.randrange(at + 1)])
    cuts = sorted(rng.sample(range(1, len(arrival)), rng.randrange(2, 5)))
    return [arrival[a:b] for a, b in zip([0, *cuts], [*cuts, len(arrival)], strict=True)]


def as_line(event: Event) -> str:
    return json.dumps({"user_id": event.user, "event_id": event.event_id, "page": "/",
                       "event_time": event.time.isoformat().replace("+00:00", "Z")})


def _naive(session: Session) -> Session:
    user, start, end, count = session
    return (user, start.replace(tzinfo=None), end.replace(tzinfo=None), count)


#: Seeds 0 and 13 between them tell the model from each of its variants with one rule
#: dropped or one boundary moved (rules 1 and 2 of "Late events", the gap, a session's
#: closing, the grace, duplicates across batches): of 300 seeds, 8 move rule 2's boundary.
#: ``SESSIONLAKE_TEST_SEEDS=0-199`` runs those instead, for a longer soak.
SEEDS = (0, 1, 2, 3, 13)


def seeds() -> list[int]:
    given = os.environ.get("SESSIONLAKE_TEST_SEEDS")
    if not given:
        return list(SEEDS)
    first, _, last = given.partition("-")
    return list(range(int(first), int(last or first) + 1))


@pytest.mark.parametrize("seed", seeds())
def test_a_random_stream_ends_as_spec_s_rules_say(
    spark: SparkSession, lake: str, seed: int
) -> None:
    batches = random_stream(seed)
    model = Model()
    for records in batches:
        model.batch(records)

    settings = settings_from({"lake": lake, "gap": "30m", "grace": "5m"}, env={})
    run_batches(spark, settings, [[as_line(e) for e in records] for records in batches])

    key = ("user_id", "session_start", "session_end", "event_count")
    assert rows(read_table(spark, lake, "sessions"), *key) == sorted(map(_naive, model.closed))
    assert rows(read_table(spark, lake, "open_sessions"), *key) == [
        _naive(s) for s in model.open_sessions()
    ]
    assert {r[0] for r in rows(read_table(spark, lake, "late_events"), "event_id")} \
        == model.late
    [(duplicates, late, accepted, records)] = rows(
        read_table(spark, lake, "batch_metrics").groupBy().sum(
            "duplicates", "late", "accepted", "input_records"))
    assert duplicates == model.duplicates
    assert records == sum(map(len, batches)) == accepted + late + duplicates

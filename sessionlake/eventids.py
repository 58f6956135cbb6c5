"""The largest event id ``events`` (and ``late_events``) can hold, carried from batch to
batch.

A batch's duplicate check (``batch._seen_before``) looks for the batch's ids among the
events earlier batches recorded, accepted (``events``) or rejected as late
(``late_events``), on the same days and with ids between the batch's least and greatest. When
ids grow with time (sequence numbers, UUIDv7, ULID, ``<file>#<line>``), a new batch's least
id lies above every id already recorded, and the check finds nothing, yet it still cost
Delta's resolution of the table's new version (Spark jobs that replay its log and list its
files) and a query of it in every batch. Knowing an upper bound of a table's ids, the
batch skips both when its least id lies above it. Each table has its own bound.

The bound is a fact about one version of the table, read from Delta's own log: each add
action's statistics hold its file's greatest ``event_id`` (truncated strings are rounded
up, so it stays an upper bound). A batch records the bound at the version it reads in its
ledger entry; the next batch carries it to its own version through the commits in
between, whoever made them (a compaction, an erasure, a backfill): every file they added
counts. The first batch of a stream or of an epoch takes it from the table's whole log,
and so does a batch that could not carry its previous batch's bound (a commit file gone,
too many commits to read), so that one long pause does not cost the stream its bound for
good. Where the log fails too (a file without statistics of its ids, a lake not on this
machine's disks), there is no bound, the batch reads the table as before, and the batches
after it do not look again until the next epoch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from sessionlake import deltareader, storage
from sessionlake.deltalog import commit_actions, commit_file
from sessionlake.tables import EVENTS, table_path

#: The column whose statistics bound the table's ids.
EVENT_ID = "event_id"

#: Commits a batch reads to carry the previous batch's bound to its own version. More
#: (a long pause beside busy maintenance) are not read: the batch reads the table instead.
CARRIED_COMMITS_MAX = 50


@dataclass(frozen=True)
class IdBound:
    """At ``version`` of ``events``, no event's id is greater than ``largest``
    (``None``: the table holds no event)."""

    version: int
    largest: str | None

    def excludes(self, least_id: str | None) -> bool:
        """Whether no event of the table can have an id from ``least_id`` up."""
        return least_id is not None and (self.largest is None or least_id > self.largest)

    def as_json(self) -> dict[str, Any]:
        """The bound as a ledger entry stores it."""
        return {"version": self.version, "largest": self.largest}


def from_json(noted: Any) -> IdBound | None:
    """The bound a ledger entry stored (``None`` when it stored none)."""
    if not isinstance(noted, dict) or not isinstance(noted.get("version"), int):
        return None
    largest = noted.get("largest")
    return IdBound(noted["version"], largest if isinstance(largest, str) else None)


def _greater(a: str | None, b: str | None) -> str | None:
    return b if a is None else a if b is None else max(a, b)


def _largest_in(records: int | None, max_values: Mapping[str, Any]) -> tuple[bool, str | None]:
    """Whether a file of ``records`` rows with these statistics has a known greatest id,
    and that id (``None`` for a file with no row)."""
    if records == 0:
        return True, None
    largest = max_values.get(EVENT_ID)
    return (True, largest) if isinstance(largest, str) else (False, None)


def file_largest_id(add: dict[str, Any]) -> tuple[bool, str | None]:
    """:func:`_largest_in` for an add action of a commit file."""
    if not add.get("stats"):
        return False, None
    stats = json.loads(add["stats"])
    return _largest_in(stats.get("numRecords"), stats.get("maxValues") or {})


def carried_to(spark: SparkSession | None, lake: str, bound: IdBound, version: int,
               table: str = EVENTS) -> IdBound | None:
    """``bound`` carried to ``version`` of ``table`` through the commits after its own:
    raised by the greatest id of every file they add. ``None`` when it cannot be (see the
    module)."""
    if version < bound.version or version - bound.version > CARRIED_COMMITS_MAX:
        return None
    largest = bound.largest
    for commit in range(bound.version + 1, version + 1):
        text = storage.read_text(spark, f"{table_path(lake, table)}/{commit_file(commit)}")
        if text is None:
            return None
        for action in commit_actions(text):
            if "add" in action:
                known, file_largest = file_largest_id(action["add"])
                if not known:
                    return None
                largest = _greater(largest, file_largest)
    return IdBound(version, largest)


def bound_from_log(lake: str, table: str = EVENTS) -> IdBound | None:
    """The bound at ``table``'s newest version, from its whole log (checkpoint and
    commits), for a local lake; ``None`` elsewhere or when a live file has no
    statistics of its ids."""
    try:
        state = deltareader.read_state(table_path(lake, table))
    except (deltareader.DeltaReadError, OSError):
        return None
    largest: str | None = None
    for data_file in state.files:
        known, file_largest = _largest_in(data_file.num_records, data_file.max_values)
        if not known:
            return None
        largest = _greater(largest, file_largest)
    return IdBound(state.version, largest)


def id_bound(
    spark: SparkSession | None, lake: str, noted: IdBound | None, version: int,
    from_log: bool, table: str = EVENTS,
) -> IdBound | None:
    """A bound of ``table``'s ids, for a batch that reads it at ``version``.

    :param noted: the bound the previous batch of the stream noted, if any.
    :param from_log: whether, with no bound noted, to take one from the table's whole log:
        for the first batch of a stream or of an epoch (after a restore), which has no
        previous batch to carry one from. Not after a batch that noted none: whatever
        stopped it (a file without statistics of its ids, say) would most likely stop this
        one too, at the cost of replaying the log in Python at every batch. A noted bound
        that cannot be carried is always replaced from the log.
    :return: the bound at ``version`` when it could be carried there (or the table is
        only its creation); else one at the table's newest version, which the next batch
        carries on; else ``None``.
    """
    if version <= 0:
        return IdBound(version, None)  # the table's creation: no event
    if noted is not None:
        carried = carried_to(spark, lake, noted, version, table)
        if carried is not None:
            return carried
    return bound_from_log(lake, table) if from_log or noted is not None else None

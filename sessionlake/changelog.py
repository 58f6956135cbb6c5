"""The changelog of a micro-batch: what happened to each session, and the MERGE source.

After sessionization every resulting session is one of: ``open`` (new), ``extend`` (an
open session with new events, or whose start moved earlier), ``merge`` (two or more open
sessions bridged into one), ``split`` (it holds part of an open session that a cut of its
run, moved by an earlier event, divided) or ``unchanged``; any of them may also ``close``
once the watermark has advanced past ``end + gap``. Open sessions of users not in the batch can
only close. This module turns that classification into

* the ``session_changelog`` rows (one per change per session), and
* the MERGE source for ``open_sessions``: an ``upsert`` per changed session that stays
  open and a ``delete`` per open-session id that is closed or was absorbed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from sessionlake.sessionize import as_open_sessions, user_bucket


def change_kind(split_ids: Sequence[str] = ()) -> Column:
    """``open``, ``extend``, ``merge``, ``split`` or ``unchanged`` for an aggregated session.

    :param split_ids: the open sessions whose events this batch divided between sessions.
    """
    previous = F.col("previous_session_ids")
    kind = F.when(F.size(previous) == 0, F.lit("open"))
    if split_ids:
        kind = kind.when(F.arrays_overlap(previous, F.array(*map(F.lit, sorted(split_ids)))),
                         F.lit("split"))
    return (
        kind
        .when(F.size(previous) > 1, F.lit("merge"))
        .when((previous[0] != F.col("session_id")) | (F.col("added_events") > 0),
              F.lit("extend"))
        .otherwise(F.lit("unchanged"))
    )


def classify_sessions(
    sessions: DataFrame, watermark_after: datetime | None, gap: timedelta,
    split_ids: Sequence[str] = (),
) -> DataFrame:
    """Add ``change`` (see :func:`change_kind`) and ``closes`` (``end + gap <=
    watermark``) to aggregated sessions."""
    closes = (
        F.lit(False)
        if watermark_after is None
        else F.col("session_end") <= F.lit(watermark_after - gap).cast("timestamp")
    )
    return sessions.withColumn("change", change_kind(split_ids)).withColumn("closes", closes)


def expiring_open_sessions(
    open_sessions: DataFrame, watermark_after: datetime | None, gap: timedelta
) -> DataFrame:
    """Open sessions (``open_sessions`` rows) that the new watermark closes."""
    if watermark_after is None:
        return open_sessions.limit(0)
    return open_sessions.where(
        F.col("session_end") <= F.lit(watermark_after - gap).cast("timestamp")
    )


def changelog_rows(
    classified: DataFrame, expiring: DataFrame, batch_id: int, changed_at: datetime
) -> DataFrame:
    """The ``session_changelog`` rows of one batch.

    :param classified: the batch users' sessions from :func:`classify_sessions`.
    :param expiring: open sessions of other users that close in this batch.
    """
    def row(frame: DataFrame, change: Column, added: Column, previous: Column) -> DataFrame:
        return frame.select(
            F.lit(batch_id).cast("long").alias("batch_id"),
            change.alias("change"),
            "session_id", "user_id", "session_start", "session_end", "event_count",
            added.cast("long").alias("added_events"),
            previous.alias("previous_session_ids"),
            F.lit(changed_at).cast("timestamp").alias("changed_at"),
        )

    no_ids = F.array().cast("array<string>")
    changed = row(
        classified.where(F.col("change") != "unchanged"),
        F.col("change"), F.col("added_events"), F.col("previous_session_ids"),
    )
    closed_here = row(
        classified.where("closes"), F.lit("close"), F.lit(0), no_ids,
    )
    closed_elsewhere = row(expiring, F.lit("close"), F.lit(0), no_ids)
    return changed.unionByName(closed_here).unionByName(closed_elsewhere)


def merge_source(
    classified: DataFrame,
    expiring: DataFrame,
    buckets: int,
    batch_id: int,
    updated_at: datetime,
    split: bool = False,
) -> DataFrame:
    """The rows the ``open_sessions`` MERGE applies: ``op`` is ``upsert`` or ``delete``.

    A session that changed and stays open is upserted; every open-session id it replaced
    (absorbed by a merge, or re-keyed because its start moved) is deleted; a session that
    closes is deleted under every id it had.

    :param split: whether the batch divided an open session between sessions: then two
        sessions can name the same replaced id, and one of them may keep it (upserted);
        each id is then deleted once, and not where it is upserted.
    """
    upserted = classified.where(_upserted())
    upserts = as_open_sessions(upserted, buckets, batch_id, updated_at
                               ).withColumn("op", F.lit("upsert"))
    replaced = classified.select(
        "user_id", F.explode(_replaced_ids()).alias("session_id"),
    ).unionByName(expiring.select("user_id", "session_id"))
    if split:
        replaced = replaced.join(upserted.select("session_id"), "session_id", "left_anti"
                                 ).dropDuplicates(["session_id"])
    deletes = replaced.select(
        "session_id", "user_id", user_bucket("user_id", buckets).alias("user_bucket"),
        F.lit("delete").alias("op"),
    )
    return upserts.unionByName(deletes, allowMissingColumns=True)


def merge_source_rows() -> Column:
    """An aggregate over :func:`classify_sessions`' rows: how many rows :func:`merge_source`
    takes from them (each expiring session adds one more).

    Observed while the classification is materialized, it sizes the MERGE's join without a
    query of its own. The batch's count of changes is no such size: a session that opens
    and closes in the same batch is a change, but is never in ``open_sessions``.
    """
    return (F.count(F.when(_upserted(), 1))
            + F.coalesce(F.sum(F.size(_replaced_ids())), F.lit(0)))


def _upserted() -> Column:
    """A classified session that changed and stays open: its row is upserted.

    A session ``unchanged`` to its readers is upserted too when its run now starts
    earlier (:func:`run_start_moved`): its stored ``run_start`` is where later batches
    cut the run.
    """
    return ((F.col("change") != "unchanged") | run_start_moved()) & ~F.col("closes")


def run_start_moved() -> Column:
    """A classified session whose run now starts before the run start it was written with.

    An event that bridges the gap before an open session's run, or starts that run
    earlier, moves where the run is cut (every maximum duration from its start) even when
    the session keeps its events: the session cut off behind the new run's first cut, say.
    Kept with its old start, the next batch would cut its run from there.
    """
    return F.coalesce(F.col("run_start") < F.col("run_start_before"), F.lit(False))


def _replaced_ids() -> Column:
    """The open-session ids a classified session deletes: all it had when it closes, else
    those it absorbed or was re-keyed from."""
    return F.when(F.col("closes"), F.col("previous_session_ids")).otherwise(
        F.array_remove("previous_session_ids", F.col("session_id")))

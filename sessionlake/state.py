"""The session state in ``open_sessions``: one changelog MERGE per micro-batch.

The MERGE's condition names the user buckets of its source rows as literals, so Delta
prunes every other partition before it looks for matches: the MERGE reads the buckets of the
batch's users (and of the sessions it closes), not the whole state; a batch of more users
than there are buckets reads them all. A small source's session ids are named as literals
too, so the state rows of those buckets that the MERGE does not change are dropped where
they are read. When the source is small against the state of the buckets it touches
(a restart's few changes), deleted and updated rows are recorded as deletion vectors instead
of rewritten files; when it changes much of that state (a steady stream's batches), the
touched files are rewritten whole, which costs less than finding each row's position
(:func:`copies_on_write`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from sessionlake import deltareader
from sessionlake.conflicts import retry_on_conflict
from sessionlake.deltalog import BatchKey
from sessionlake.tables import (
    OPEN_SESSIONS,
    append,
    batch_commit,
    last_operation_metrics,
    table_path,
    tagged_session,
)

OPEN_SESSION_COLUMNS: tuple[str, ...] = (
    "session_id", "user_id", "user_bucket", "session_start", "session_end", "run_start",
    "event_count", "page_views", "entry_page", "entry_event_id", "exit_page",
    "exit_event_id", "pages", "updated_batch_id", "updated_at",
)


#: Whether Delta's MERGE copies its source before reading it twice (to find the files it
#: touches, then to write). The batch's source is a union of projections of frames already
#: computed and held in memory, so it reads the same rows both times without a copy: a
#: MERGE of 13,000 changes into 25,000 open sessions took 1.7-1.9 s instead of 2.4-2.8 s.
MATERIALIZE_SOURCE = "spark.databricks.delta.merge.materializeSource"


#: Source rows up to which the MERGE ships its source whole to every task. Spark cannot
#: tell how small the source is: its frames are checkpoints of plans over the state, and
#: they carry those plans' size estimates. So, unhinted, the MERGE sorted and shuffled the
#: state of every bucket it touched to join it with a few rows. For 100 changes into
#: 10^6 open sessions (Spark's event log, a new process), the search for touched files
#: took 1.3 s instead of 3.1, and the writing of deletion vectors 1.6 s instead of 2.9.
#: Above this, as in a backfill's batch, the source is too big to copy to every task.
BROADCAST_SOURCE_ROWS_MAX = 100_000

#: Source rows up to which the MERGE's condition may name the source's session ids as
#: literals (see :func:`names_session_ids`). Delta joins the state to the source twice:
#: to find the rows to delete (an inner join, for which the small source is shipped to
#: every task), and to write the rows it updates and inserts, an outer join whose source
#: side Spark cannot ship, so it shuffled and sorted every state row of the touched
#: buckets to meet a few source rows.
#: Named as literals, the ids filter the state where it is read, before any shuffle. But
#: every literal is planned, by Spark and by Delta, in each of the MERGE's queries: over
#: 10^6 open sessions (a new process, runs alternating), the MERGE of 1,000 changes waited
#: 4.4-4.7 s named against 5.6-6.2 joined, of 3,000 changes 7.0 s against 4.8-6.2, and of
#: 9,000 changes 11.3 s against 5.5-6.2.
LITERAL_KEYS_MAX = 1_000

#: State rows in the touched buckets, per source row, from which the ids are worth naming:
#: over 10^4 open sessions the MERGE of 1,000 changes waited 2.4-2.6 s named against
#: 1.8-2.1 joined, while 100 changes were even either way.
STATE_ROWS_PER_LITERAL = 100

#: Whether Delta's MERGE marks the rows it deletes or updates in deletion vectors (a few
#: bytes per touched file, found by one more scan of the touched files for each row's
#: position) rather than rewriting the touched files whole. Set per MERGE on its private
#: session (:func:`copies_on_write`).
MERGE_DELETION_VECTORS = "spark.databricks.delta.merge.deletionVectors.persistent"

#: State rows in the touched buckets, per source row, up to which the MERGE rewrites the
#: touched files instead of writing deletion vectors. Warm, in one process (2026-11-28),
#: deletion vectors against rewritten files: 60,000 source rows into 10^5 open sessions
#: 2.2-2.3 s against 1.6-2.1; 1,500 into 10^5, 1.7-1.9 s against 1.4-1.9. A restart's 100
#: events, new process, to its first commit: over 10^4 open sessions (100 state rows per
#: source row) 11.5-12.7 s against 11.1-12.6; over 10^5 (1,000 per source row) 12.1-12.5 s
#: against 14.3-15.1, rewriting 10^5 rows to change 100.
COPY_ON_WRITE_STATE_ROWS_PER_SOURCE_ROW = 10


@dataclass(frozen=True)
class MergeResult:
    """What the MERGE did to ``open_sessions``, from Delta's operation metrics."""

    rows_inserted: int = 0
    rows_updated: int = 0
    rows_deleted: int = 0
    rows_copied: int = 0
    files_added: int = 0
    files_removed: int = 0
    duration_ms: int = 0
    #: The version the MERGE committed (``None``: there was nothing to apply).
    version: int | None = None


def apply_changelog_merge(
    spark: SparkSession,
    lake: str,
    source: DataFrame,
    buckets: list[int],
    batch: BatchKey | None,
    replay_after: int | None = None,
    source_rows: int | None = None,
    state_rows: int | None = None,
    empty: bool = False,
) -> MergeResult:
    """Apply ``source`` (from :func:`sessionlake.changelog.merge_source`) in one MERGE.

    :param buckets: the user buckets present in ``source``; only those partitions are read.
    :param source_rows: about how many rows ``source`` holds, when known: up to
        :data:`BROADCAST_SOURCE_ROWS_MAX` it is joined to the state without a shuffle.
    :param state_rows: about how many rows of ``open_sessions`` the touched buckets hold,
        when known: with ``source_rows``, whether the condition names the source's session
        ids (:func:`names_session_ids`) and whether the touched files are rewritten whole
        (:func:`copies_on_write`).
    :param empty: the table holds no row at the version the batch read (its creation): the
        source's upserts are appended instead (:func:`insert_into_empty`).
    :param batch: the micro-batch the MERGE belongs to; its commit is tagged with it.
    :param replay_after: on a replay of ``batch``, the version of ``open_sessions`` before
        its first attempt: a MERGE of the batch committed after it is not done again.
    :return: the MERGE's metrics (zeros when there was nothing to apply).
    """
    if not buckets or source_rows == 0:
        return MergeResult()
    if batch is not None and replay_after is not None:
        done = batch_commit(spark, lake, OPEN_SESSIONS, batch, after=replay_after)
        if done is not None:
            version, metrics = done
            return merge_result(metrics, version)
    if empty:
        return insert_into_empty(spark, lake, source, batch, replay_after)
    path = table_path(lake, OPEN_SESSIONS)
    condition = (
        F.col("t.user_bucket").isin(sorted(buckets))
        & (F.col("t.user_bucket") == F.col("s.user_bucket"))
        & (F.col("t.session_id") == F.col("s.session_id"))
    )
    if names_session_ids(source_rows, state_rows):
        condition &= F.col("t.session_id").isin(source_session_ids(source))
    values: dict[str, str | Column] = {c: F.col(f"s.{c}") for c in OPEN_SESSION_COLUMNS}
    small = source_rows is not None and source_rows <= BROADCAST_SOURCE_ROWS_MAX
    changes = (F.broadcast(source) if small else source).alias("s")

    def merge() -> None:
        # Each attempt plans against the table's newest version: a MERGE that lost a race
        # (say, to an OPTIMIZE that rewrote the files it read) is redone on the rewritten
        # files. That is correct because the MERGE is keyed by (user_bucket, session_id)
        # and a compaction changes where rows live, not which rows there are; and it cannot
        # apply twice, because Delta commits nothing of an attempt that lost its race.
        with tagged_session(spark, batch) as session:
            if session is not spark:  # a private clone: its settings are its own
                session.conf.set(MATERIALIZE_SOURCE, "none")
                session.conf.set(MERGE_DELETION_VECTORS,
                                 str(not copies_on_write(source_rows, state_rows)).lower())
            (
                DeltaTable.forPath(session, path).alias("t")
                .merge(changes, condition)
                .whenMatchedDelete(condition=F.col("s.op") == "delete")
                .whenMatchedUpdate(condition=F.col("s.op") == "upsert", set=values)
                .whenNotMatchedInsert(condition=F.col("s.op") == "upsert", values=values)
                .execute()
            )

    retry_on_conflict(merge, f"MERGE into {OPEN_SESSIONS}")
    return written_result(spark, lake, batch, replay_after, "MERGE")


def insert_into_empty(
    spark: SparkSession,
    lake: str,
    source: DataFrame,
    batch: BatchKey | None,
    replay_after: int | None = None,
) -> MergeResult:
    """Append ``source``'s upserts to an ``open_sessions`` that held no row when the batch
    read it, as the MERGE would have inserted them.

    Into an empty table a MERGE matches nothing and its deletes delete nothing, yet it plans
    its joins and searches the table for touched files: a stream's first batch of 1M events
    waited 2.5 s for it after its appends, which ran slower beside it. The append carries the
    batch's tag like the MERGE, so a replay finds it the same way (:func:`batch_commit`).
    """
    # One file per bucket, as the MERGE writes them (its rows are shuffled by partition).
    rows = source.where(F.col("op") == "upsert").select(*OPEN_SESSION_COLUMNS) \
        .repartition("user_bucket")
    retry_on_conflict(lambda: append(rows, lake, OPEN_SESSIONS, batch),
                      f"append to {OPEN_SESSIONS}")
    return written_result(spark, lake, batch, replay_after, "WRITE")


def written_result(
    spark: SparkSession, lake: str, batch: BatchKey | None, replay_after: int | None,
    operation: str,
) -> MergeResult:
    """The result of the state write just made (``operation``: ``MERGE`` or ``WRITE``), from
    the batch's tagged commit, or without a batch from the table's last such operation.

    A batch's write that committed nothing (Delta commits no MERGE that changes no row)
    changed nothing: zeros, not the figures of an earlier batch's commit.
    """
    if batch is not None:
        committed = batch_commit(spark, lake, OPEN_SESSIONS, batch, after=replay_after)
        if committed is None:
            return MergeResult()
        version, metrics = committed
        return merge_result(metrics, version)
    return merge_result(last_operation_metrics(spark, lake, OPEN_SESSIONS, operation=operation))


def names_session_ids(source_rows: int | None, state_rows: int | None) -> bool:
    """Whether the MERGE's condition names its source's session ids as literals.

    Worth it for a small source over much state: the literals spare the shuffle and sort
    of the touched buckets' state, and cost their planning, which grows with their number
    (see :data:`LITERAL_KEYS_MAX`, :data:`STATE_ROWS_PER_LITERAL`). Unknown sizes: no.

    Example::

        names_session_ids(100, 1_000_000)    # True
        names_session_ids(1_000, 10_000)     # False: too little state to spare
        names_session_ids(3_000, 1_000_000)  # False: too many literals to plan
    """
    if source_rows is None or state_rows is None:
        return False
    return source_rows <= LITERAL_KEYS_MAX and state_rows >= STATE_ROWS_PER_LITERAL * source_rows


def copies_on_write(source_rows: int | None, state_rows: int | None) -> bool:
    """Whether the MERGE rewrites the files it touches whole rather than marking its deleted
    and updated rows in deletion vectors.

    Rewriting copies every unchanged row of a touched file; deletion vectors cost one more
    scan of the touched files, to find each changed row's position, and every later read
    of the file filters through them. When the source changes much of the touched state,
    as each batch of a busy stream does, the copy is the cheaper; for a few changes over
    much state the vectors are. Unknown sizes: deletion vectors, as Delta does by default.

    Example::

        copies_on_write(30_000, 90_000)   # True: a steady batch's changes
        copies_on_write(100, 10_000)      # False: a restart's few changes
    """
    if source_rows is None or state_rows is None:
        return False
    return state_rows <= COPY_ON_WRITE_STATE_ROWS_PER_SOURCE_ROW * source_rows


def source_session_ids(source: DataFrame) -> list[str]:
    """The distinct session ids of a MERGE source, sorted (so a replay plans the same)."""
    return sorted(row[0] for row in source.select("session_id").distinct().collect())


def merge_result(metrics: dict[str, int], version: int | None = None) -> MergeResult:
    """A MERGE's result from its commit's operation metrics (and version, if known); an
    append's (:func:`insert_into_empty`) counts its rows and files as inserted and added."""
    return MergeResult(
        version=version,
        rows_inserted=metrics.get("numTargetRowsInserted", metrics.get("numOutputRows", 0)),
        rows_updated=metrics.get("numTargetRowsUpdated", 0),
        rows_deleted=metrics.get("numTargetRowsDeleted", 0),
        rows_copied=metrics.get("numTargetRowsCopied", 0),
        files_added=metrics.get("numTargetFilesAdded", metrics.get("numFiles", 0)),
        files_removed=metrics.get("numTargetFilesRemoved", 0),
        duration_ms=metrics.get("executionTimeMs", 0),
    )


def none_closes_by(lake: str, version: int, threshold: datetime) -> bool:
    """Whether no open session of ``open_sessions`` at ``version`` ends at or before
    ``threshold`` (the new watermark less the gap), by the least ``session_end`` of each
    live file in Delta's statistics: then the batch need not look for open sessions that
    close (:func:`~sessionlake.changelog.expiring_open_sessions`).

    That look is a query of the state of its own, half a second of a small batch even
    when Delta's statistics let it skip every file; a restart, growing state or a burst of
    events finds nothing to close. The statistics round times down to the millisecond, so
    a file's minimum never lies above its true one. ``False`` (look) for a file without
    them, and for a lake not on this machine's disks or a log the reader cannot replay.
    """
    try:
        state = deltareader.read_state(table_path(lake, OPEN_SESSIONS), remember=True,
                                       version=version)
    except (deltareader.DeltaReadError, OSError):
        return False
    for data_file in state.files:
        if data_file.num_records == 0:
            continue
        least = data_file.min_values.get("session_end")
        if not isinstance(least, str) or datetime.fromisoformat(least) <= threshold:
            return False
    return True

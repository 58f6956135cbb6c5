"""Erasing users: deleting their rows from every table and purging them from the files.

User ids reach Delta only inside DataFrame filters built from literals, never as SQL text,
so an id such as ``x' OR '1'='1`` matches the user of that exact id and nobody else.

A Delta DELETE on a table with deletion vectors does not rewrite the data files: it marks
rows as deleted, and the files, still part of the current version, keep the rows. An
erasure therefore rewrites the files that hold deleted rows (``REORG ... APPLY (PURGE)``);
the old files are then no longer part of the table and a VACUUM removes them for good.

The retention audit keeps erased ids only as SHA-256 hashes; that is enough to apply an
erasure again after a restore returned the tables to a version from before it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable
from datetime import UTC, datetime

from delta.tables import DeltaTable
from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F

from sessionlake import storage
from sessionlake.conflicts import retry_on_conflict
from sessionlake.deltareader import read_rows, read_state
from sessionlake.spark import SparkOnDemand
from sessionlake.tables import (
    RETENTION_AUDIT,
    USER_TABLES,
    commit_metrics_since,
    each_table,
    path_identifier,
    read_table,
    table_exists,
    table_path,
    table_version,
)

log = logging.getLogger("sessionlake.erasure")


def user_hash(user_id: str) -> str:
    """The SHA-256 (hex) of a user id, as Spark's ``sha2(user_id, 256)`` computes it."""
    return hashlib.sha256(user_id.encode("utf-8")).hexdigest()


def users_named(user_ids: Iterable[str]) -> Column:
    """Rows of exactly these user ids (bound as literals)."""
    return F.col("user_id").isin([F.lit(u) for u in user_ids])


#: A user id's SHA-256, as :func:`user_hash` writes it: 64 lowercase hex digits.
USER_HASH = re.compile(r"^[0-9a-f]{64}$")


def users_hashed(hashes: Iterable[str]) -> Column:
    """Rows whose user id has one of these SHA-256 hashes."""
    return F.sha2(F.col("user_id"), 256).isin([F.lit(h) for h in hashes])


def delete_rows(spark: SparkSession, lake: str, table: str, condition: Column) -> int:
    """DELETE the rows of ``table`` matching ``condition``; how many rows it deleted.

    Retried when it loses a commit race with the stream or another maintenance job.
    """
    target = DeltaTable.forPath(spark, table_path(lake, table))
    before = table_version(spark, lake, table)
    retry_on_conflict(lambda: target.delete(condition), f"DELETE from {table}")
    return sum(m.get("numDeletedRows", 0)
               for m in commit_metrics_since(spark, lake, table, before, "DELETE"))


def purge_deleted_rows(spark: SparkSession, lake: str, table: str) -> None:
    """Rewrite the files of ``table`` that still hold rows marked as deleted.

    After this the deleted rows are only in files that the current version no longer uses,
    which a VACUUM can then remove.
    """
    name = path_identifier(table_path(lake, table))
    retry_on_conflict(lambda: spark.sql(f"REORG TABLE {name} APPLY (PURGE)"),
                      f"REORG {table}")


def erase(spark: SparkSession, lake: str, condition: Column) -> dict[str, int]:
    """Delete the matching users' rows from every table that holds user data, and purge them.

    The tables are independent, so they are erased side by side.

    :return: rows deleted per table.
    """
    def erase_from(table: str) -> int:
        deleted = delete_rows(spark, lake, table, condition)
        if deleted:
            purge_deleted_rows(spark, lake, table)
        return deleted

    return each_table(erase_from, USER_TABLES)


def erasures_since(spark: SparkSession | None, lake: str, since: datetime) -> list[str]:
    """Hashes of the users erased by retention runs that started at or after ``since``.

    A local lake's audit is read without Spark (:mod:`sessionlake.deltareader`): a restore
    asks this before it knows whether it needs a JVM at all.
    """
    if not table_exists(spark, lake, RETENTION_AUDIT):
        return []
    if storage.local_path(lake) is not None:
        audit = read_rows(read_state(table_path(lake, RETENTION_AUDIT)),
                          ["started_at", "erased_user_sha256"])
        since_utc = since if since.tzinfo else since.replace(tzinfo=UTC)
        runs = zip(audit["started_at"].to_pylist(), audit["erased_user_sha256"].to_pylist(),
                   strict=True)
        return sorted({h for started, hashes in runs if started >= since_utc
                       for h in hashes or ()})
    if spark is None:
        raise ValueError(f"{lake} is not a local path: a Spark session is needed to reach it")
    rows = read_table(spark, lake, RETENTION_AUDIT).where(
        F.col("started_at") >= F.lit(since).cast("timestamp")
    ).select(F.explode("erased_user_sha256").alias("hash")).distinct().collect()
    return sorted(row["hash"] for row in rows)


def reapply_erasures(spark: SparkOnDemand, lake: str, since: datetime) -> dict[str, int]:
    """Erase again every user erased since ``since`` (after a restore to before then).

    :param spark: started only when someone was erased (or the lake is not local).
    :return: rows deleted per table (empty when nobody was erased since).
    """
    hashes = erasures_since(None if storage.local_path(lake) else spark(), lake, since)
    if not hashes:
        return {}
    # Told before: the erasure starts Spark and reads every user table (half a minute on
    # a small lake), a wait a restore from its logs alone does not have.
    log.warning("re-applying %d erasure(s) made since %s, when the snapshot was taken",
                len(hashes), since.isoformat(timespec="seconds"))
    deleted = erase(spark(), lake, users_hashed(hashes))
    log.warning("re-applied %d erasure(s): rows deleted %s", len(hashes),
                ", ".join(f"{t} {n}" for t, n in deleted.items() if n) or "none")
    return deleted

"""The peer: Spark's own streaming ``session_window`` with the RocksDB state store.

Reads the same jsonl files, keeps sessions in Spark's state store (RocksDB), emits closed
sessions (append mode, watermark = max event time - grace) into a Delta table. Run as a
separate process, like ``sessionlake run``, so both are timed whole:

    python -m bench.peer_session_window SOURCE OUT CHECKPOINT
        [--max-files-per-trigger N] [--gap "30 minutes"]

Prints one JSON line at the end, ``{"state_rows": N}``: the sessions held in the state
store after the last batch, so the restart benchmark can show how much state it restored.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from sessionlake.checkpoint import unread_files
from sessionlake.spark import build_spark, quick_start_for

SCHEMA = StructType([
    StructField("event_id", StringType()), StructField("user_id", StringType()),
    StructField("event_time", StringType()), StructField("event_type", StringType()),
    StructField("page", StringType()),
])


def main(argv: list[str]) -> int:
    """Run the peer job over the files of SOURCE until they are all processed."""
    parser = argparse.ArgumentParser(prog="python -m bench.peer_session_window")
    parser.add_argument("source")
    parser.add_argument("out")
    parser.add_argument("checkpoint")
    parser.add_argument("--max-files-per-trigger", type=int)
    parser.add_argument("--gap", default="30 minutes", help="session_window's gap duration")
    args = parser.parse_args(argv)
    # The same JVM as sessionlake's: its garbage collector, class archive and, for a run
    # with little to read, C1 only (by the same rule, on the peer's own checkpoint).
    unread = unread_files(Path(args.source), Path(args.checkpoint))
    spark = build_spark(
        "local[*]", app_name="peer-session-window", shuffle_partitions=4,
        conf={"spark.sql.streaming.stateStore.providerClass":
              "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"},
        quick_start=quick_start_for(unread, args.max_files_per_trigger),
    )
    reader = spark.readStream.schema(SCHEMA)
    if args.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
    events = reader.json(args.source).select(
        "user_id", F.to_timestamp("event_time").alias("event_time")
    ).where(F.col("user_id").isNotNull() & F.col("event_time").isNotNull())
    sessions = (
        events.withWatermark("event_time", "5 minutes")
        .groupBy("user_id", F.session_window("event_time", args.gap))
        .agg(F.count(F.lit(1)).alias("event_count"),
             F.min("event_time").alias("session_start"),
             F.max("event_time").alias("session_end"))
        .select("user_id", "session_start", "session_end", "event_count")
    )
    query = (
        sessions.writeStream.format("delta").outputMode("append")
        .option("checkpointLocation", args.checkpoint).trigger(availableNow=True)
        .start(args.out)
    )
    query.awaitTermination()
    progress: dict[str, Any] = query.lastProgress or {}
    operators = progress.get("stateOperators") or [{}]
    print(json.dumps({"state_rows": operators[0].get("numRowsTotal")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

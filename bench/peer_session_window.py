"""The peer: Spark's own streaming ``session_window`` with the RocksDB state store.

Reads the same jsonl files, keeps sessions in Spark's state store (RocksDB), emits closed
sessions (append mode, watermark = max event time - grace) into a Delta table. Run as a
separate process, like ``sessionlake run``, so both are timed whole:

    python -m bench.peer_session_window SOURCE OUT CHECKPOINT [MAX_FILES_PER_TRIGGER]
"""

from __future__ import annotations

import sys

from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType

from sessionlake.spark import build_spark

SCHEMA = StructType([
    StructField("event_id", StringType()), StructField("user_id", StringType()),
    StructField("event_time", StringType()), StructField("event_type", StringType()),
    StructField("page", StringType()),
])


def main(argv: list[str]) -> int:
    """Run the peer job over ``argv`` = source, output table, checkpoint[, files/trigger]."""
    source, out, checkpoint = argv[:3]
    spark = build_spark(
        "local[*]", app_name="peer-session-window", shuffle_partitions=4,
        conf={"spark.sql.streaming.stateStore.providerClass":
              "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"},
    )
    reader = spark.readStream.schema(SCHEMA)
    if len(argv) > 3:
        reader = reader.option("maxFilesPerTrigger", int(argv[3]))
    events = reader.json(source).select(
        "user_id", F.to_timestamp("event_time").alias("event_time")
    ).where(F.col("user_id").isNotNull() & F.col("event_time").isNotNull())
    sessions = (
        events.withWatermark("event_time", "5 minutes")
        .groupBy("user_id", F.session_window("event_time", "30 minutes"))
        .agg(F.count(F.lit(1)).alias("event_count"),
             F.min("event_time").alias("session_start"),
             F.max("event_time").alias("session_end"))
        .select("user_id", "session_start", "session_end", "event_count")
    )
    query = (
        sessions.writeStream.format("delta").outputMode("append")
        .option("checkpointLocation", checkpoint).trigger(availableNow=True).start(out)
    )
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

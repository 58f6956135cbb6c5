"""How sessionlake reaches Spark: one function that builds a Delta-enabled session.

The JVM artifacts pyspark does not ship (Delta Lake, and Spark's Kafka source) are resolved
once from Maven Central into the project's ``jars/`` folder (``make jars``) and every jar
there is put on ``spark.jars``, so that every later start is offline and takes seconds
instead of an Ivy resolution.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

PROJECT_ROOT = Path(__file__).resolve().parent.parent
LOG_CONFIG = PROJECT_ROOT / "conf" / "log4j2.properties"

#: Settings that suit sessionlake's small, frequent batches on Delta.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    # The UI costs a listener per job; turn it on with SESSIONLAKE_SPARK_UI=true.
    "spark.ui.enabled": os.environ.get("SESSIONLAKE_SPARK_UI", "false"),
    # The Delta log of a small table is replayed with this many tasks: the default of 50
    # makes every commit of a small batch pay for 50 tiny tasks.
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
}


class JarsMissingError(RuntimeError):
    """The Delta jars are not where sessionlake looks for them."""


def _jars_folder(jars_dir: str | os.PathLike[str] | None = None) -> Path:
    return Path(jars_dir or os.environ.get("SESSIONLAKE_JARS") or PROJECT_ROOT / "jars")


def delta_jars(jars_dir: str | os.PathLike[str] | None = None) -> list[str]:
    """Every jar of the jars folder, to put on ``spark.jars``: Delta Lake's, which must be
    there, and Spark's Kafka source with its client, when ``make jars`` fetched them.

    :param jars_dir: the folder holding them; default ``$SESSIONLAKE_JARS`` or ``jars/``
        in the project.
    :return: absolute paths, sorted.
    :raises JarsMissingError: with the command that fetches them, when there are none.
    """
    folder = _jars_folder(jars_dir)
    jars = sorted(str(p.resolve()) for p in folder.glob("*.jar"))
    if not any(Path(j).name.startswith("delta-spark_") for j in jars):
        raise JarsMissingError(
            f"no Delta Lake jars in {folder}: run `make jars` (resolves them from Maven "
            "Central once) or set SESSIONLAKE_JARS to a folder that holds them"
        )
    return jars


#: The jars Spark's Kafka source needs beyond pyspark's (see build/pom.xml).
KAFKA_JAR_PREFIXES: tuple[str, ...] = (
    "spark-sql-kafka-0-10_", "spark-token-provider-kafka-0-10_", "kafka-clients-",
    "commons-pool2-",
)


def check_kafka_jars(jars_dir: str | os.PathLike[str] | None = None) -> None:
    """Check, before Spark starts, that the Kafka source's jars are in the jars folder.

    :raises JarsMissingError: naming the missing jars and the command that fetches them.
    """
    folder = _jars_folder(jars_dir)
    names = [p.name for p in folder.glob("*.jar")]
    missing = [prefix.rstrip("-_") for prefix in KAFKA_JAR_PREFIXES
               if not any(name.startswith(prefix) for name in names)]
    if missing:
        raise JarsMissingError(
            f"no {', '.join(missing)} jar in {folder}, which --source kafka needs: run "
            "`make jars` (resolves them from Maven Central once)"
        )


#: Tasks of a parallel file listing (Spark's default, 10000, is meant for huge tables).
LISTING_PARALLELISM = "spark.sql.sources.parallelPartitionDiscovery.parallelism"


def build_spark(
    master: str = "local[*]",
    *,
    app_name: str = "sessionlake",
    shuffle_partitions: int = 4,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or reuse) a Spark session with Delta Lake enabled.

    Example::

        spark = build_spark("local[2]", shuffle_partitions=2, conf={"spark.ui.enabled": "false"})

    :param master: ``local[*]``, ``local[N]`` or ``spark://host:port``.
    :param app_name: the name shown in the Spark UI and the master's page.
    :param shuffle_partitions: ``spark.sql.shuffle.partitions``; safe to change between
        runs because no Spark stateful operator keeps state in the checkpoint.
    :param conf: further Spark settings, applied last.

    Parallel file listing (VACUUM's, and partition discovery) uses as many tasks as a
    shuffle: Spark's default of 10000 tasks made each VACUUM of a small table take half a
    minute here, for listing a few folders.
    :return: the session.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON") or _python())
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        **DEFAULT_CONF,
        "spark.jars": ",".join(delta_jars()),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.driver.memory": os.environ.get("SESSIONLAKE_DRIVER_MEMORY", "4g"),
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}",
        **(conf or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    listing = (conf or {}).get(LISTING_PARALLELISM, str(shuffle_partitions))
    spark.conf.set(LISTING_PARALLELISM, listing)
    spark.sparkContext.setLogLevel(os.environ.get("SESSIONLAKE_SPARK_LOG_LEVEL", "ERROR"))
    return spark


def _python() -> str:
    import sys

    return sys.executable

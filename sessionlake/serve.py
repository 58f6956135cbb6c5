"""``sessionlake serve``: the lake's tables behind a Spark Connect endpoint.

Notebooks, BI tools and Airflow tasks then query sessions with a thin client
(``pyspark-client``: ``SparkSession.builder.remote("sc://host:15002")``) and no JVM of their
own. The server is a local Spark driver with Spark's Connect plugin (shipped with pyspark);
the tables and the param-free named queries are registered in its session catalog, which
every Connect session shares, so a client can ``SELECT * FROM sessions`` or
``SELECT * FROM bounce_rate`` right away.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession

from sessionlake.config import Settings
from sessionlake.query import LakeNotFound, named_queries, register_table
from sessionlake.spark import build_spark
from sessionlake.tables import PUBLIC_TABLES, table_exists, table_path

log = logging.getLogger(__name__)

CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"


def connect_conf(host: str, port: int) -> dict[str, str]:
    """Spark settings that start the Connect gRPC server inside the driver."""
    return {
        "spark.plugins": CONNECT_PLUGIN,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
    }


def register_catalog(spark: SparkSession, lake: str) -> list[str]:
    """Register the lake's tables (by location) and param-free named queries in the catalog.

    Catalog objects, unlike temporary views, are seen by every Connect session.

    :return: the names registered.
    :raises LakeNotFound: when the lake has none of the tables.
    """
    tables = [t for t in PUBLIC_TABLES if table_exists(spark, lake, t)]
    if not tables:
        raise LakeNotFound(
            f"no sessionlake tables in {lake}: check --lake, or create them with "
            "`sessionlake run`"
        )
    for table in tables:
        register_table(spark, table, table_path(lake, table))
    views = {name: q for name, q in named_queries().items() if not q.params}
    for name, query in views.items():  # names are checked identifiers, texts are our files
        spark.sql(f"CREATE OR REPLACE VIEW {name} AS {query.text}")
    return tables + list(views)


def serve_lake(settings: Settings, host: str = "127.0.0.1", port: int = 15002) -> None:
    """Serve the lake over Spark Connect until SIGTERM or SIGINT."""
    spark = build_spark(settings.master, app_name="sessionlake-serve",
                        shuffle_partitions=settings.shuffle_partitions,
                        conf=connect_conf(host, port))
    names = register_catalog(spark, settings.lake)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.warning("signal %d: stopping the Spark Connect server", signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, request_stop)
    print(f"serving {len(names)} tables and views of {settings.lake} on sc://{host}:{port}",
          flush=True)
    stop.wait()
    try:
        spark.stop()
    except (Py4JError, OSError) as error:
        # The signal went to every process of the service (systemd's default stop): the
        # driver's JVM got it too and has stopped itself.
        log.info("Spark's JVM had stopped already (%s)", type(error).__name__)

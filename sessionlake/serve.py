"""``sessionlake serve``: the lake's tables behind a Spark Connect endpoint.

Notebooks, BI tools and Airflow tasks then query sessions with a thin client
(``pyspark-client``: ``SparkSession.builder.remote("sc://host:15002")``) and no JVM of their
own. The server is a local Spark driver with Spark's Connect plugin (shipped with pyspark);
the tables and the param-free named queries are registered in its session catalog, which
every Connect session shares, so a client can ``SELECT * FROM sessions`` or
``SELECT * FROM bounce_rate`` right away.

A Connect client runs SQL and Python (UDFs) as the server's account, so the server asks
every client for a token (Spark's ``spark.connect.authenticate.token``):
``$SESSIONLAKE_CONNECT_TOKEN``, else a random one, written to a file only its owner can
read (``--token-file``). A client sends it as ``sc://localhost:PORT/;token=...``. Spark
Connect serves plain gRPC, and a client sends a token to any host but ``localhost`` over
TLS only: clients on other machines go through a TLS proxy in front of the server.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import threading
from pathlib import Path
from types import FrameType

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession

from sessionlake.config import ConfigError, Settings
from sessionlake.query import LakeNotFound, named_queries, register_table
from sessionlake.spark import build_spark
from sessionlake.storage import file_in_the_way
from sessionlake.tables import PUBLIC_TABLES, table_exists, table_path

log = logging.getLogger(__name__)

CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"


#: A token every client must send (else one is made up per server).
ENV_CONNECT_TOKEN = "SESSIONLAKE_CONNECT_TOKEN"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def connect_conf(host: str, port: int, token: str) -> dict[str, str]:
    """Spark settings that start the Connect gRPC server inside the driver, asking every
    client for ``token``."""
    return {
        "spark.plugins": CONNECT_PLUGIN,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(port),
        "spark.connect.authenticate.token": token,
    }


def default_token_file(port: int) -> Path:
    """Where ``serve`` writes its token unless told: in the user's home, per port."""
    return Path.home() / ".sessionlake" / f"connect-{port}.token"


def write_token(path: Path) -> str:
    """The token (``$SESSIONLAKE_CONNECT_TOKEN``, else a new random one), written to
    ``path`` readable by its owner alone (its folder made so too, when new)."""
    token = os.environ.get(ENV_CONNECT_TOKEN) or secrets.token_urlsafe(32)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)  # a file someone else made is not written through
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as out:
        out.write(token)
    return token


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


def serve_lake(settings: Settings, host: str = "127.0.0.1", port: int = 15002,
               token_file: Path | None = None) -> None:
    """Serve the lake over Spark Connect until SIGTERM or SIGINT, to clients that send the
    token written to ``token_file`` (:func:`default_token_file` when ``None``)."""
    check_can_listen(host, port)
    token_file = token_file or default_token_file(port)
    if (file := file_in_the_way(token_file.parent)) is not None:
        raise ConfigError(f"--token-file {token_file} cannot be written: {file} is a file")
    token = write_token(token_file)
    try:
        _serve(settings, host, port, token_file, token)
    finally:
        forget_token(token_file, token)


def check_can_listen(host: str, port: int) -> None:
    """Refuse, before Spark starts, an address the server could not listen on (a port in
    use, a host not of this machine): Spark failed in a Java stack trace whose last line
    did not say why (a review).

    :raises ConfigError: naming the address and the system's reason.
    """
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            # As a server sets it: a port left in TIME_WAIT is free to listen on again.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except (OSError, UnicodeError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise ConfigError(f"cannot listen on {host}:{port} ({reason}): give another "
                          "--port, or a --host of this machine") from None


def forget_token(path: Path, token: str) -> None:
    """Remove the token file a server wrote once it no longer serves (left behind, one
    per port piled up in the home folder), unless another server wrote its own there since."""
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8") == token:
            path.unlink()


def _serve(settings: Settings, host: str, port: int, token_file: Path, token: str) -> None:
    """:func:`serve_lake` once its token is written."""
    spark = build_spark(settings.master, app_name="sessionlake-serve",
                        shuffle_partitions=settings.shuffle_partitions,
                        conf=connect_conf(host, port, token))
    names = register_catalog(spark, settings.lake)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.warning("signal %d: stopping the Spark Connect server", signum)
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, request_stop)
    if host not in LOOPBACK:
        log.warning("listening on %s: a client elsewhere sends its token over TLS only, "
                    "which Spark Connect does not serve: put a TLS proxy in front", host)
    print(f"serving {len(names)} tables and views of {settings.lake} on "
          f"sc://localhost:{port}/;token=<the text of {token_file}>", flush=True)
    stop.wait()
    try:
        spark.stop()
    except (Py4JError, OSError) as error:
        # The signal went to every process of the service (systemd's default stop): the
        # driver's JVM got it too and has stopped itself.
        log.info("Spark's JVM had stopped already (%s)", type(error).__name__)

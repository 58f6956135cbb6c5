"""How sessionlake reaches Spark: one function that builds a Delta-enabled session.

The JVM artifacts pyspark does not ship (Delta Lake, and Spark's Kafka source) are resolved
once from Maven Central into the project's ``jars/`` folder (``make jars``) and every jar
there is put on ``spark.jars``, so that every later start is offline and takes seconds
instead of an Ivy resolution.

On a cluster (any master but ``local``), the ``sessionlake`` package itself is shipped to the
executors as a zip (:func:`package_zip`, added with ``addPyFile``), so that Python code run
on an executor imports the very code the driver runs, whatever is installed on the nodes.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import socket
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from functools import partial
from pathlib import Path
from typing import TypeVar

from pyspark import SparkContext
from pyspark.sql import SparkSession

from sessionlake.checkpoint import UnreadInput
from sessionlake.config import ActionableError, ConfigError, format_duration, parse_duration
from sessionlake.storage import is_glob, local_path

T = TypeVar("T")
log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = PACKAGE_DIR.parent
LOG_CONFIG = PROJECT_ROOT / "conf" / "log4j2.properties"

#: ``true`` turns Spark's UI on (off by default, as the UI costs a listener per job); it
#: wins over ``spark.ui.enabled`` in ``spark-defaults.conf``.
SPARK_UI_ENV = "SESSIONLAKE_SPARK_UI"


def ui_conf(enabled: str) -> dict[str, str]:
    """Spark's UI settings: ``spark.ui.enabled`` as given (:data:`SPARK_UI_ENV`, else the
    administrator's, else off: see :func:`default_conf`) and, with the UI off, a status
    store that keeps the last 50 SQL executions instead of 1,000. Nothing reads them then, yet each
    holds its plan's text and graph: a continuous run's driver, idle after 60 one-file
    batches of 1,000 events, held 261 MB live with 1,000 and 131 MB with 50 (2026-12-05)."""
    conf = {"spark.ui.enabled": enabled}
    if enabled.strip().lower() != "true":
        conf["spark.sql.ui.retainedExecutions"] = "50"
    return conf


#: Settings that suit sessionlake's small, frequent batches on Delta, beside the UI's
#: (:func:`ui_conf`). Those an administrator sets in ``spark-defaults.conf`` are theirs
#: (:func:`default_conf`), but for :data:`REQUIRED_CONF_KEYS`.
DEFAULT_CONF: dict[str, str] = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    # The Delta log of a small table is replayed with this many tasks: the default of 50
    # makes every commit of a small batch pay for 50 tiny tasks.
    "spark.databricks.delta.snapshotPartitions": "2",
    "spark.sql.streaming.stopGracefullyOnShutdown": "true",
    # PySpark's DataFrame debugging sends the Python call site of every DataFrame and
    # Column call to the JVM, a handful of py4j round trips each. Five warm batches of four
    # events made 37,600 round trips with it, 15,700 without; ten took 86-96 s with it and
    # 71-77 s without (Python CPU 14-15 s and 7 s). Errors keep their Python traceback; only
    # Spark's own error context loses the Python line.
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    # Spark keeps the classes it generated for the last 100 plans by default. A batch plans
    # about 230 of them (its own and Delta's), the same ones every batch, so each batch
    # compiled them all again: ten batches of 100,000 events compiled 2,329 classes (24 s
    # in the driver) of which 340 were distinct, and the JIT compiled each copy anew.
    "spark.sql.codegen.cache.maxEntries": "1000",
    # Spark sizes its memory pages from the heap (32 MB each with a 4g driver here), and a
    # broadcast hash join's relation takes at least one whole page, kept in the driver's
    # block manager for as long as the broadcast lives, however few its rows: a batch's
    # broadcasts of its users held 32 MB each. A continuous run of 160 one-file batches of
    # 1,000 events (2026-12-05, one run each): the driver's live heap 0.86-3.19 GB, 4.9 GB
    # resident, the batches 477.9 s in all; with 2 MB pages 0.23-0.37 GB, 2.7 GB and
    # 454.2 s. Ten batches of 100,000 events, whole process, runs alternating: 109.6,
    # 108.5, 96.8 and 102.3 s against 113.6, 110.9, 100.8 and 101.8; one batch of
    # 1,000,000 the same (46.6 and 46.1 s against 46.7 and 45.6). A task can hold at most
    # 8,192 pages: 16 GB of sort or aggregation memory at this size before it spills.
    "spark.buffer.pageSize": "2m",
    # Timestamps are stored as Parquet INT64 microseconds (UTC), not Spark's default of
    # INT96, a deprecated 12-byte type that each value is converted to and dictionary-
    # encodes as a byte array. 1,000,000 events in one batch (whole process, runs
    # alternating): 54.3 and 57.0 s instead of 59.4 and 63.5. Files of either kind read
    # alike (Spark, and sessionlake.deltareader), so older files need no rewrite.
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    # The catalog holds only tables by location (``sessionlake sql``, ``serve``), yet its
    # first use makes the warehouse folder: in the temporary folder, not an empty
    # spark-warehouse/ in the user's working directory.
    "spark.sql.warehouse.dir": str(Path(tempfile.gettempdir()) / "sessionlake-spark-warehouse"),
}


#: The settings of :data:`DEFAULT_CONF` sessionlake cannot run without, whatever an
#: administrator's ``spark-defaults.conf`` says: Delta's SQL extension and catalog; UTC, in
#: which Spark hands event times to Python and sessions and events get their dates; and a
#: SIGTERM that lets the batch in flight commit.
REQUIRED_CONF_KEYS = frozenset({
    "spark.sql.extensions",
    "spark.sql.catalog.spark_catalog",
    "spark.sql.session.timeZone",
    "spark.sql.streaming.stopGracefullyOnShutdown",
})


def default_conf(administrators: Mapping[str, str] | None = None) -> dict[str, str]:
    """:data:`DEFAULT_CONF` and the UI's settings (:func:`ui_conf`) less what an
    administrator set in ``spark-defaults.conf`` (:func:`administrators_conf`, or
    ``administrators``), so that their setting counts.

    spark-submit, and PySpark's builder through it, takes a setting given to it over the
    file's: sessionlake's tuning would silently undo a cluster's own (its page size, its
    warehouse folder). :data:`REQUIRED_CONF_KEYS` stay sessionlake's, but for the file's
    other SQL extensions, which are kept beside Delta's; a different value of another is
    replaced, with a warning, once.
    """
    given = administrators_conf() if administrators is None else administrators
    wanted = os.environ.get(SPARK_UI_ENV)
    ui = ui_conf(wanted or given.get("spark.ui.enabled") or "false")
    conf = {key: value for key, value in {**DEFAULT_CONF, **ui}.items()
            if key in REQUIRED_CONF_KEYS or key not in given
            or (key == "spark.ui.enabled" and wanted)}  # the variable wins over the file
    extensions = [name.strip() for name in given.get(_EXTENSIONS, "").split(",") if name.strip()]
    if extensions:
        conf[_EXTENSIONS] = ",".join(dict.fromkeys([*extensions, DEFAULT_CONF[_EXTENSIONS]]))
    for key in sorted(REQUIRED_CONF_KEYS - {_EXTENSIONS}):
        if key in given and given[key] != conf[key] and (key, given[key]) not in _WARNED:
            _WARNED.add((key, given[key]))
            log.warning("spark-defaults.conf sets %s to %s; sessionlake runs with %s, which "
                        "it needs", key, given[key], conf[key])
    return conf


_EXTENSIONS = "spark.sql.extensions"
#: The administrator's settings :func:`default_conf` has warned of (key, value).
_WARNED: set[tuple[str, str]] = set()


#: The JVM's garbage collector: the parallel one, which beat the default (G1) on this
#: 2-core machine. ``sessionlake run`` of 100,000 events in one batch, whole process:
#: 73.3-73.6 s with G1, 70.2-70.9 s with it; of 1,000,000: 134.6 s against 124.8 s (one
#: run each). Measured on local masters only.
THROUGHPUT_GC = "-XX:+UseParallelGC"


#: The driver JVM's compiler for a run with little to read: C1 only, no C2. A JVM compiles
#: what it runs hottest twice, quickly (C1), then well (C2), and on 2 cores C2 competes with
#: the run itself; a run that ends after a few small batches never earns that back. Whole
#: process on this 2-core machine, runs alternating (2026-11-26), C1 only against both:
#: a restart of 100 events over 10^4 open sessions 18.6-20.7 s to its first commit against
#: 23.0-26.6; over 10^6, 28.5-30.3 against 33.3-34.7; 100,000 events (13 MB) in a new lake
#: 28.3-31.3 s against 40.3-41.7; 300,000 (40 MB) 41.6-43.4 against 43.9-49.8; 1,000,000
#: (134 MB, measured earlier) 63.5-65.5 against 50.5-52.8.
#: C1 alone gets a code cache of 48 MB, not the 240 MB of both compilers; five one-file
#: batches of the bundled access log (2,000 lines each) filled it after 22 s ("CodeCache
#: is full. Compiler has been disabled.") and ran 33.0 and 32.1 s, whole process; with the
#: 240 MB, 28.9 and 28.5 s, the last batches 4.0-4.3 s against 4.5-6.7 (2026-12-01).
QUICK_START_JIT = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"
#: Input, in bytes, up to which a run's driver compiles with C1 only (see QUICK_START_JIT).
QUICK_START_MAX_BYTES = 32 * 2**20
#: Micro-batches up to which a run with little to read compiles with C1 only. Every batch
#: plans the same few dozen queries, whatever its size, and C1's code plans them slower.
#: One-file batches of 100 events into a new lake, whole process, C1 only against both
#: (2026-11-26, one run each): two batches 24.1 s against 29.2; three 35.6 against 36.6;
#: five 44.3 against 47.3; ten 79.4 against 66.0 (and 78.0 against 57.0).
QUICK_START_MAX_BATCHES = 5
#: ``auto`` (the default: by the input a run has to read, or the tables a query reads),
#: ``quick`` (always C1 only) or ``full`` (never): the driver's compiler for
#: ``sessionlake run`` and ``sessionlake sql``.
DRIVER_JIT_ENV = "SESSIONLAKE_DRIVER_JIT"
#: Bytes of the tables a ``sessionlake sql`` statement reads up to which its driver compiles
#: with C1 only (see QUICK_START_JIT and :func:`quick_start_for_query`). Whole process, on
#: this 2-core machine (2026-12-04), C2 as well against C1 only: over a lake of 1M events
#: (`events` 20 MB, `sessions` 16 MB) `count(*)` of sessions 8.9-9.3 s against 6.1-6.5,
#: the named queries 11.6-16.6 s against 7.8-12.6; over 5M events (97 and 69 MB)
#: `sessions_per_hour` 13.1-13.5 s against 9.9-10.0, `returning_users` 14.1-15.0 against
#: 9.5-10.8, a distinct count per page of `events` 15.3-17.1 against 13.8-14.9, but
#: `funnel` (both tables, 166 MB) 25.5-27.4 against 27.1-27.6. A query whose work is
#: mostly computing is another matter: 20 million SHA-256s over a self-join of the 20 MB
#: `events` took 62 s with C1 only against 33 (``SESSIONLAKE_DRIVER_JIT=full``).
QUERY_QUICK_MAX_BYTES = 128 * 2**20


def driver_jit_mode() -> str:
    """``$SESSIONLAKE_DRIVER_JIT``: ``auto``, ``quick`` or ``full``.

    :raises ConfigError: when it is set to anything else.
    """
    mode = os.environ.get(DRIVER_JIT_ENV, "auto").strip().lower() or "auto"
    if mode not in ("auto", "quick", "full"):
        raise ConfigError(
            f"{DRIVER_JIT_ENV} must be auto, quick or full, got {os.environ[DRIVER_JIT_ENV]!r}"
        )
    return mode


def quick_start_for(unread: UnreadInput | None, max_files_per_trigger: int | None = None) -> bool:
    """Whether the driver JVM of an available-now run over ``unread`` compiles with C1 only:
    up to :data:`QUICK_START_MAX_BYTES` in up to :data:`QUICK_START_MAX_BATCHES` batches
    (of ``max_files_per_trigger`` files each, when given).

    ``None`` (unknown: a Kafka topic, a remote folder, a run that keeps following) means
    no: a run of unknown length may be long, and then C2's code pays. ``$SESSIONLAKE_DRIVER_JIT``
    overrides the choice.

    :raises ConfigError: when ``$SESSIONLAKE_DRIVER_JIT`` is not one of its values.
    """
    mode = driver_jit_mode()
    if mode != "auto":
        return mode == "quick"
    return unread is not None and unread.bytes <= QUICK_START_MAX_BYTES and \
        unread.batches(max_files_per_trigger) <= QUICK_START_MAX_BATCHES


def quick_start_for_query(table_bytes: int | None) -> bool:
    """Whether the driver JVM of a ``sessionlake sql`` query over tables of ``table_bytes``
    compiles with C1 only: up to :data:`QUERY_QUICK_MAX_BYTES`.

    A query is a short process, most of it the JVM warming up: the cold parts (Delta's log
    replay, the planning, the first of each operator) run sooner with C1's code than with
    C2 compiling beside them on two cores. ``None`` (the size is unknown: a lake not on
    this machine's disks) means no. ``$SESSIONLAKE_DRIVER_JIT`` overrides the choice.

    :raises ConfigError: when ``$SESSIONLAKE_DRIVER_JIT`` is not one of its values.
    """
    mode = driver_jit_mode()
    if mode != "auto":
        return mode == "quick"
    return table_bytes is not None and table_bytes <= QUERY_QUICK_MAX_BYTES


def java_options(quick_start: bool = False) -> dict[str, str]:
    """The driver's and executors' JVM options: sessionlake's log configuration (driver),
    the garbage collector, the driver's class archive when ``make setup`` built one for
    this JVM and these jars (:mod:`sessionlake.classarchive`), and C1 only for the driver
    of a short run (``quick_start``, see :data:`QUICK_START_JIT`). The driver's class path
    starts with sessionlake's local file system when it is built (:func:`local_fs_jar`), on
    every master, so that every driver has the class path its class archive was built with.

    An administrator's options in ``spark-defaults.conf`` are kept, as a value given here
    would replace them: ``spark.*.extraJavaOptions`` and ``spark.driver.extraClassPath``
    after sessionlake's (so their ``-D`` settings win), ``spark.*.defaultJavaOptions``
    before (Spark prepends those itself); and a garbage collector chosen in either is
    theirs, as a JVM refuses two.
    """
    from sessionlake.classarchive import driver_archive_option

    theirs = administrators_conf()

    def options(role: str, ours: Sequence[str]) -> str:
        extra = theirs.get(f"spark.{role}.extraJavaOptions", "")
        chosen = _COLLECTOR.search(f"{theirs.get(f'spark.{role}.defaultJavaOptions', '')} {extra}")
        collector = [] if chosen else [THROUGHPUT_GC]
        return " ".join(option for option in [*collector, *ours, extra] if option)

    jar = local_fs_jar()
    class_path = [str(jar)] if jar else []
    if class_path and (given := theirs.get("spark.driver.extraClassPath")):
        class_path.append(given)
    driver = [f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}", driver_archive_option(),
              QUICK_START_JIT if quick_start else ""]
    return {
        "spark.driver.extraJavaOptions": options("driver", driver),
        "spark.executor.extraJavaOptions": options("executor", []),
        **({"spark.driver.extraClassPath": os.pathsep.join(class_path)} if class_path else {}),
    }


#: A JVM option that chooses the garbage collector.
_COLLECTOR = re.compile(r"-XX:\+Use\w+GC\b")
_PROPERTY = re.compile(r"^\s*([^\s=:]+)(?:\s*[=:]\s*|\s+|$)(.*?)\s*$")


def administrators_conf() -> dict[str, str]:
    """The Spark settings in ``spark-defaults.conf`` (in
    :func:`sessionlake.classarchive.spark_conf_folder`), which spark-submit applies to
    each setting not given to it.

    Read as Spark reads it, a Java properties file: ``key value``, ``key=value`` or
    ``key: value``, ``#`` and ``!`` comments, a line continued after a backslash; the last
    of a key counts, and keys not under ``spark.`` are ignored, as Spark ignores them.
    Java's escapes within a key or value are not decoded.
    """
    from sessionlake.classarchive import spark_conf_folder

    defaults = spark_conf_folder() / "spark-defaults.conf"
    text = defaults.read_text(encoding="utf-8") if defaults.is_file() else ""  # as Spark reads it
    found: dict[str, str] = {}
    for line in re.sub(r"\\\r?\n[ \t\f]*", "", text).splitlines():
        if line.lstrip().startswith(("#", "!")) or not (match := _PROPERTY.match(line)):
            continue
        key, value = match.groups()
        if key.startswith("spark."):
            found[key] = value
    return found


#: sessionlake's local file system for Hadoop (``build/hadoop/``, compiled into the jars
#: folder by ``make jars``). Without Hadoop's native library, which pip's Spark lacks,
#: Hadoop's own forks a ``chmod`` for every file it creates and a ``readlink`` for every
#: rename: ten micro-batches of 100 events forked 2,188 processes from the driver's JVM.
#: This one answers both from Java (22 forks left), with the same results. Whole process,
#: ten one-file batches of 100 events, runs alternating: 70.8-72.6 s against 73.5-80.7 s.
LOCAL_FS_JAR = "sessionlake-hadoop.jar"
#: Set to ``hadoop`` to keep Hadoop's own local file system.
LOCAL_FS_ENV = "SESSIONLAKE_LOCAL_FS"
#: The part of :data:`LOCAL_FS_CONF` a driver on any master takes: its ``FileContext``,
#: through which it alone writes (Delta's commits, the streaming checkpoint), and whose
#: rename without overwrite must fail for all writers of a version but one.
COMMIT_FS_CONF: dict[str, str] = {
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "sessionlake.hadoop.LocalFs",
}
#: The Hadoop settings that give ``file:`` paths sessionlake's local file system, through
#: Hadoop's ``FileSystem`` (Parquet files) and its ``FileContext`` (:data:`COMMIT_FS_CONF`).
LOCAL_FS_CONF: dict[str, str] = {
    "spark.hadoop.fs.file.impl": "sessionlake.hadoop.LocalFileSystem",
    **COMMIT_FS_CONF,
}


def local_fs_jar(jars_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The jar of sessionlake's local file system (:data:`LOCAL_FS_JAR`), or ``None`` when
    it was not built."""
    jar = _jars_folder(jars_dir) / LOCAL_FS_JAR
    return jar.resolve() if jar.is_file() else None


def local_fs_conf(master: str | None, settings: Mapping[str, str]) -> dict[str, str]:
    """sessionlake's local file system for a new driver whose ``settings`` put its jar on
    the class path: all of :data:`LOCAL_FS_CONF` on a local master, only
    :data:`COMMIT_FS_CONF` on any other, or on one not known yet (``None``: spark-submit's
    master comes from Airflow's connection); nothing when ``$SESSIONLAKE_LOCAL_FS`` is
    ``hadoop``.

    Only a local master runs its executors in the driver's JVM, whose class path has the
    jar: a cluster's executors write their data files through Hadoop's own file system.
    Its driver still commits through sessionlake's, so that a stream and a maintenance
    command committing beside it cannot both win a version (:data:`COMMIT_FS_CONF`); the
    setting reaches the executors too, where nothing sessionlake runs opens a
    ``FileContext``. The jar stays on the class path either way, so that the driver's
    class archive still fits it.
    """
    if os.environ.get(LOCAL_FS_ENV, "").strip().lower() == "hadoop":
        return {}
    jar = local_fs_jar()
    class_path = settings.get("spark.driver.extraClassPath", "").split(os.pathsep)
    if jar is None or str(jar) not in class_path:
        return {}
    return dict(LOCAL_FS_CONF if master and is_local_master(master) else COMMIT_FS_CONF)


class JarsMissingError(ActionableError, RuntimeError):
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


def spark_jars() -> str:
    """``spark.jars``: the jars folder's (:func:`delta_jars`), then those ``spark.jars``
    in ``spark-defaults.conf`` lists, which a value given to spark-submit would replace.

    :raises JarsMissingError: as :func:`delta_jars`.
    """
    theirs = administrators_conf().get("spark.jars", "").split(",")
    return ",".join(dict.fromkeys([*delta_jars(), *(jar.strip() for jar in theirs
                                                    if jar.strip())]))


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


def use_utc_in_python() -> None:
    """Make this process's local time UTC, the Spark session's time zone.

    PySpark hands a collected timestamp back as a naive datetime in the Python process's
    local time, whatever ``spark.sql.session.timeZone`` says: on a machine set to New York,
    10:00 UTC came back as 05:00. sessionlake reads such values as UTC (the watermark a
    batch takes from ``batch_metrics``, the one ``rebuild-state`` starts from) and
    ``sessionlake sql`` prints them as the tables' UTC; they would be off by the machine's
    offset. Set before the JVM starts, the JVM and its Python workers inherit it too.
    """
    if os.environ.get("TZ") != "UTC":
        os.environ["TZ"] = "UTC"
        time.tzset()


#: How long :func:`check_master_answers` waits for a standalone master to answer.
MASTER_CONNECT_TIMEOUT_S = 5.0


def check_master_answers(master: str, timeout: float = MASTER_CONNECT_TIMEOUT_S,
                         given_by: str = "--master, SESSIONLAKE_MASTER") -> None:
    """Refuse a standalone master (``spark://host:port[,host:port]``) none of whose
    addresses accepts a connection, before a JVM starts: Spark itself retries for a
    minute, then fails the session with a stack trace that does not name the master. A
    restart checks this before it stops the stream it would replace. Other masters pass.

    :param given_by: where the user gave the master, named in the refusal.
    :raises ConfigError: naming the master and what each address said.
    """
    if not master.startswith("spark://"):
        return
    said = []
    for address in master.removeprefix("spark://").split(","):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=timeout).close()
            return
        except (OSError, ValueError) as error:
            said.append(f"{address}: {getattr(error, 'strerror', None) or error}")
    raise ConfigError(f"the Spark master {master} does not answer ({'; '.join(said)}): "
                      f"start it, or give the master it listens as ({given_by})")


def build_spark(
    master: str = "local[*]",
    *,
    app_name: str = "sessionlake",
    shuffle_partitions: int = 4,
    conf: Mapping[str, str] | None = None,
    quick_start: bool = False,
) -> SparkSession:
    """Start (or reuse) a Spark session with Delta Lake enabled.

    Example::

        spark = build_spark("local[2]", shuffle_partitions=2, conf={"spark.ui.enabled": "false"})

    :param master: ``local[*]``, ``local[N]`` or ``spark://host:port``.
    :param app_name: the name shown in the Spark UI and the master's page.
    :param shuffle_partitions: ``spark.sql.shuffle.partitions``; safe to change between
        runs because no Spark stateful operator keeps state in the checkpoint.
    :param conf: further Spark settings, applied last.
    :param quick_start: the driver JVM compiles with C1 only (see :func:`quick_start_for`);
        only a session that starts the JVM can choose.

    Parallel file listing (VACUUM's, and partition discovery) uses as many tasks as a
    shuffle: Spark's default of 10000 tasks made each VACUUM of a small table take half a
    minute here, for listing a few folders.

    On a cluster (any master but ``local``) the ``sessionlake`` package is shipped to the
    executors (:func:`ship_package`), judged by the master the session really has: under
    spark-submit the session predates this call and ``master`` is ignored.
    :return: the session.
    """
    use_utc_in_python()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON") or _python())
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {
        **default_conf(),
        "spark.jars": spark_jars(),
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.driver.memory": driver_memory(),
        **java_options(quick_start),
        **(conf or {}),
    }
    # Only where this call starts the JVM: under spark-submit its class path and master
    # were set before this ran.
    starts_jvm = SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ
    if starts_jvm:
        settings = {**local_fs_conf(master, settings), **settings}
    for key, value in settings.items():
        builder = builder.config(key, value)
    with jvm_stdout_to_stderr() if starts_jvm else contextlib.nullcontext():
        if starts_jvm:
            launch_driver_jvm({"spark.master": master, "spark.app.name": app_name, **settings})
        spark = builder.getOrCreate()
    ship_package(spark)
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
    listing = (conf or {}).get(LISTING_PARALLELISM, str(shuffle_partitions))
    spark.conf.set(LISTING_PARALLELISM, listing)
    spark.sparkContext.setLogLevel(os.environ.get("SESSIONLAKE_SPARK_LOG_LEVEL", "ERROR"))
    return spark


def launch_driver_jvm(conf: Mapping[str, str]) -> None:
    """Start the driver's JVM, with ``conf``, in a session (and process group) of its own.

    A run stops after its batch in flight on SIGTERM, which this process handles and the
    JVM must outlive. In this process's group, the JVM also got a signal sent to the whole
    group (``kill -- -PGID``, a terminal's hang-up) and stopped at once, cutting the batch
    off (measured: a continuous run then ended with py4j's tracebacks). A session of its
    own, not only a group, keeps the JVM off the terminal's job control, which could stop
    a background group writing to it. The JVM still ends with this process: PySpark gives
    it a pipe from this process as its standard input, and it exits when that closes.
    What PySpark would do on its own but for ``start_new_session``
    (``SparkContext._ensure_initialized`` is how a ``SparkContext`` takes a given gateway).
    """
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway(SparkConf(loadDefaults=False).setAll(list(conf.items())),
                             popen_kwargs={"start_new_session": True})
    SparkContext._ensure_initialized(gateway=gateway)


@contextlib.contextmanager
def jvm_stdout_to_stderr() -> Iterator[None]:
    """Give a JVM started within the block this process's standard error as its standard
    output, and keep this process's own standard output.

    What a command prints on standard output is its result, which scripts read
    (``sessionlake sql --output csv``, ``retention``'s summary). The JVM prints there only
    chatter: Delta's VACUUM wrote "Deleted 0 files and directories in a total of 3
    directories." once per table, seven lines before ``retention``'s summary. Its logs
    already go to standard error (``conf/log4j2.properties``). A child process inherits
    its parent's descriptors at its start, so the swap lasts only while the JVM starts.
    """
    sys.stdout.flush()
    try:
        out, err = sys.__stdout__.fileno(), sys.__stderr__.fileno()  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):  # no real descriptors to swap
        yield
        return
    kept = os.dup(out)
    try:
        os.dup2(err, out)
        yield
    finally:
        os.dup2(kept, out)
        os.close(kept)


#: The loggers that print a failed task's Java stack trace on the driver (in local mode,
#: where the executor is the driver's JVM) before the failure reaches Python: the task's,
#: a writing task's "Aborting task" (``Utils``), and a write's, whose job is aborted by it.
TASK_FAILURE_LOGGERS = ("org.apache.spark.executor.Executor",
                        "org.apache.spark.scheduler.TaskSetManager",
                        "org.apache.spark.util.Utils",
                        "org.apache.spark.sql.execution.datasources.FileFormatWriter",
                        "org.apache.spark.sql.delta.files.DeltaFileFormatWriter")

#: The logger of a streaming query's end, whose "terminated with error" prints the error's
#: whole Java stack trace (with its causes) before the failure reaches Python.
QUERY_FAILURE_LOGGER = "org.apache.spark.sql.execution.streaming.runtime.MicroBatchExecution"


class SparkOnDemand:
    """A Spark session started the first time a step asks for it.

    Some commands often finish from the Delta log alone (a restore of a local lake writes
    its commits by hand, :mod:`sessionlake.deltarestore`) and start the JVM, about 7 s, only
    for a step that needs one.
    """

    def __init__(self, start: Callable[[], SparkSession]) -> None:
        self._start = start
        self._session: SparkSession | None = None
        self._starting = threading.Lock()  # steps side by side start one session

    @classmethod
    def of(cls, spark: SparkSession) -> SparkOnDemand:
        """One already started."""
        on_demand = cls(lambda: spark)
        on_demand._session = spark
        return on_demand

    def __call__(self) -> SparkSession:
        with self._starting:
            if self._session is None:
                self._session = self._start()
            return self._session

    @property
    def started(self) -> SparkSession | None:
        """The session, if a step has started it."""
        return self._session


@contextlib.contextmanager
def quiet_task_failures(spark: SparkSession, also: Sequence[str] = ()) -> Iterator[None]:
    """Spark logs no failed task's stack trace meanwhile (nor those of the loggers named in
    ``also``): for a command whose every failure is the user's own query (``sessionlake
    sql``: a division by zero, a bad cast, ``raise_error``) and is said once, in one line,
    when it reaches Python; or a run that says itself what it does about a failure."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    configurator = jvm.org.apache.logging.log4j.core.config.Configurator
    manager = jvm.org.apache.logging.log4j.LogManager
    names = (*TASK_FAILURE_LOGGERS, *also)
    before = {name: manager.getLogger(name).getLevel() for name in names}
    for name in names:
        configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.OFF)
    try:
        yield
    finally:
        for name, level in before.items():
            configurator.setLevel(name, level)


#: Rows a micro-batch works through (its records, plus the open sessions it reads: see
#: ``sessionlake.batch``) from which Spark compiles code for the batch's plans. Below it
#: every plan is evaluated interpreted: a batch runs some forty distinct small queries (its
#: own and Delta's), and compiling them costs more than it saves. Measured with
#: ``sessionlake run`` on 2 cores, whole process: ten batches of 10,000 events 165 s
#: compiled against 121 s interpreted; ten of 100,000, 269 s against 277 s; one batch of
#: 1,000,000, 95 s against 136 s. The open sessions a batch reads count a tenth of a
#: record each (``sessionlake.ledger.STATE_ROWS_PER_RECORD``).
CODEGEN_MIN_RECORDS = 100_000

#: The Spark settings :func:`codegen_for_batch` chooses.
CODEGEN_KEYS = ("spark.sql.codegen.wholeStage", "spark.sql.codegen.factoryMode")


def codegen_for_batch(records: int) -> dict[str, str]:
    """Spark's code generation settings for a batch of ``records`` input records.

    Example::

        codegen_for_batch(500)        # interpreted: wholeStage false, NO_CODEGEN
        codegen_for_batch(2_000_000)  # Spark's defaults: wholeStage true, FALLBACK
    """
    compiled = records >= CODEGEN_MIN_RECORDS
    return {
        "spark.sql.codegen.wholeStage": "true" if compiled else "false",
        "spark.sql.codegen.factoryMode": "FALLBACK" if compiled else "NO_CODEGEN",
    }


#: The settings each Spark application started with, by application id (see
#: :func:`operator_gave`).
_STARTED_WITH: dict[str, frozenset[str]] = {}


def operator_gave(spark: SparkSession, key: str) -> bool:
    """Whether ``key`` was set when the session's Spark application started (``--conf``,
    ``spark-defaults.conf``, ``build_spark``'s ``conf``): the operator's settings win over
    those the stream picks for itself.

    They are fixed for the application's life, so they are read once: a copy of Spark's
    configuration costs 20-30 ms, and every batch asks twice.
    """
    context = spark.sparkContext
    given = _STARTED_WITH.get(context.applicationId)
    if given is None:
        given = frozenset(name for name, _ in context.getConf().getAll())
        _STARTED_WITH[context.applicationId] = given
    return key in given


#: The thread's properties that name the Spark jobs it starts: the call site names a job
#: and its stages (the long-batch alert shows those), the description is what the Spark
#: UI lists.
_CALL_SITE, _DESCRIPTION = "callSite.short", "spark.job.description"


@contextlib.contextmanager
def naming_jobs(spark: SparkSession) -> Iterator[Callable[[str], None]]:
    """A function that names the Spark jobs this thread starts from then on, and their
    stages, until the block ends; then the thread's names are what they were before it.

    Every action PySpark starts reaches Spark through py4j, so Spark named each job of a
    batch after the same Java frame (``localCheckpoint at NativeMethodAccessorImpl.java:0``,
    ``save at ...``): the Spark UI's jobs, and the stages the long-batch alert names, could
    not tell a parse from an append. A description the thread had (a streaming query's,
    ``id = ..., runId = ..., batch = 3``) is kept after the name.
    """
    context = spark.sparkContext._jsc
    before = {key: context.getLocalProperty(key) for key in (_CALL_SITE, _DESCRIPTION)}

    def name(text: str) -> None:
        context.setLocalProperty(_CALL_SITE, text)
        described = before[_DESCRIPTION]
        context.setLocalProperty(_DESCRIPTION, f"{text} ({described})" if described else text)

    try:
        yield name
    finally:
        for key, value in before.items():
            context.setLocalProperty(key, value)  # null: unset


def in_named_jobs(spark: SparkSession, name: str, work: Callable[[], T]) -> T:
    """``work()``, the Spark jobs it starts from this thread named ``name``
    (:func:`naming_jobs`): for work handed to another thread, which names its own jobs."""
    with naming_jobs(spark) as naming:
        naming(name)
        return work()


def fit_codegen_to_batch(spark: SparkSession, records: int) -> None:
    """Set the session's code generation for the rest of a batch of ``records`` records.

    Settings the operator gave (:func:`operator_gave`) win: when either key is set there,
    nothing changes.
    """
    if any(operator_gave(spark, key) for key in CODEGEN_KEYS):
        return
    for key, value in codegen_for_batch(records).items():
        spark.conf.set(key, value)


#: Spark's adaptive query execution, which the stream turns off (see :func:`fit_to_stream`).
ADAPTIVE = "spark.sql.adaptive.enabled"


def fit_to_stream(spark: SparkSession) -> None:
    """Settings for a session that runs micro-batches, unless the operator gave them.

    Adaptive execution re-plans a query after each of its shuffles, and every re-planning
    lists the files of each Delta table the query reads again, with a Spark job: a batch's
    sessionization listed its two tables four times each. Without it a batch's plans are
    made once and its shuffles have ``--shuffle-partitions`` partitions. Ten batches of
    100,000 events took 121.6 s instead of 133.6 s (whole process), one of 1,000,000
    57.0 s instead of 59.7 s. Operator-given settings win (see
    :func:`fit_codegen_to_batch`).
    """
    if not operator_gave(spark, ADAPTIVE):
        spark.conf.set(ADAPTIVE, "false")
    fit_codegen_to_batch(spark, 0)


def fit_codegen_to_parse(spark: SparkSession) -> None:
    """Compiled code for the parse of a batch's lines, whatever the batch's size.

    The batch's size is known only once its lines are parsed, and the parse is the batch's
    heaviest work per record. It is one query of the same shape in every batch, whose
    generated classes Spark caches, so a process compiles it once. Measured on 2 cores, in
    a stream's batch, warm: 100,000 jsonl events parsed in 3.0-3.3 s compiled against
    8.3-8.8 s interpreted, while a batch of four events parses as fast either way after
    the first (about a second more for that one). Operator-given settings still win (see
    :func:`fit_codegen_to_batch`).
    """
    fit_codegen_to_batch(spark, CODEGEN_MIN_RECORDS)


_LOCAL_MASTER = re.compile(r"^local(\[[^\]]*\])?$")


#: The driver's memory, as Spark spells it (default 4g).
ENV_DRIVER_MEMORY = "SESSIONLAKE_DRIVER_MEMORY"

#: A memory size as Spark reads ``spark.driver.memory``: a whole number of MiB, or with a
#: unit (``512m``, ``4g``, ``4gb``, ``1t``; any case).
_MEMORY_SIZE = re.compile(r"^[1-9][0-9]*([kmgtp]b?|b)?$", re.IGNORECASE)


def driver_memory() -> str:
    """The driver's memory, as Spark spells it: ``SESSIONLAKE_DRIVER_MEMORY``, else
    ``spark.driver.memory`` in ``spark-defaults.conf`` (:func:`administrators_conf`), else
    4g.

    Checked here, before a JVM starts: the JVM refused a wrong value with a Java error and
    PySpark's traceback instead of one line.

    :raises ConfigError: naming where a value that is no memory size came from.
    """
    if given := os.environ.get(ENV_DRIVER_MEMORY, "").strip():
        where = ENV_DRIVER_MEMORY
    elif given := administrators_conf().get("spark.driver.memory", "").strip():
        where = "spark.driver.memory in spark-defaults.conf"
    else:
        return "4g"
    if not _MEMORY_SIZE.match(given):
        raise ConfigError(f"{where} must be a memory size such as 4g or 512m, got {given!r}")
    return given


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs the executors inside the driver's JVM, on this machine.

    Example::

        is_local_master("local[2]")                 # True
        is_local_master("spark://10.0.0.5:7077")    # False
        is_local_master("local-cluster[2,1,1024]")  # False: separate executor processes

    :param master: a Spark master URL.
    :return: ``True`` for ``local``, ``local[N]``, ``local[*]`` and ``local[N,F]``.
    """
    return bool(_LOCAL_MASTER.match(master.strip()))


def package_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The files of the package that executors need: its modules and ``py.typed``, sorted."""
    return sorted(
        path for path in package_dir.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
        and (path.suffix == ".py" or path.name == "py.typed")
    )


def _own_folder(folder: Path) -> Path:
    """``folder``, made when missing (for its owner alone); refused when another account
    owns it or others may write in it. A predictable folder under ``/tmp`` that another
    user made first would let them plant the zip every executor imports."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    status = folder.stat()
    wrong = ("owned by another account" if status.st_uid != os.getuid()
             else "writable by others" if status.st_mode & 0o022 else None)
    if wrong is not None:
        raise ConfigError(
            f"{folder} is {wrong}: the package zip kept there runs on every executor; set "
            "SESSIONLAKE_PYFILES_DIR to a folder of this account's own")
    return folder


def package_zip(target_dir: Path | None = None, package_dir: Path = PACKAGE_DIR) -> Path:
    """A zip of the ``sessionlake`` package named after a hash of its content.

    The same code always gives the same file (``sessionlake-<sha256 prefix>.zip``, entries in
    a fixed order with a fixed date), so it is built once per code version and two
    versions never overwrite each other's zip while an application still ships it.

    Example::

        spark.sparkContext.addPyFile(str(package_zip()))

    :param target_dir: where to keep it; default ``$SESSIONLAKE_PYFILES_DIR`` or
        ``<tmp>/sessionlake-pyfiles-<uid>``. A folder that another account owns, or that
        others may write in, is refused (:func:`_own_folder`): a zip found there runs on
        every executor.
    :param package_dir: the package to zip (default: the one running this code).
    :return: the zip's path.
    """
    files = package_files(package_dir)
    digest = hashlib.sha256()
    for path in files:
        name = path.relative_to(package_dir.parent).as_posix()
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    default = Path(tempfile.gettempdir()) / f"sessionlake-pyfiles-{os.getuid()}"
    folder = _own_folder(Path(target_dir or os.environ.get("SESSIONLAKE_PYFILES_DIR")
                              or default))
    target = folder / f"{package_dir.name}-{digest.hexdigest()[:16]}.zip"
    if target.exists():
        return target
    # Written beside the target and renamed into place: a reader never sees half a zip.
    handle, partial = tempfile.mkstemp(dir=folder, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as raw, zipfile.ZipFile(raw, "w") as archive:
            for path in files:
                name = path.relative_to(package_dir.parent).as_posix()
                archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)),
                                 path.read_bytes(), compress_type=zipfile.ZIP_DEFLATED)
        os.replace(partial, target)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return target


#: Zips already added, per application id (``addPyFile`` once per application).
_SHIPPED: dict[str, str] = {}


def ship_package(spark: SparkSession) -> Path | None:
    """Ship the ``sessionlake`` package to the executors when the master is not local.

    With a local master the executors run in this process and import the package the
    driver imported. On a cluster the nodes may hold another version, or none: the zip
    goes to every executor (``addPyFile``) and ahead of installed packages on their path.

    :return: the zip shipped, or ``None`` for a local master.
    """
    context = spark.sparkContext
    if is_local_master(str(context.master)):
        return None
    archive = package_zip()
    if _SHIPPED.get(context.applicationId) != str(archive):
        context.addPyFile(str(archive))
        _SHIPPED[context.applicationId] = str(archive)
    return archive


def check_executors_see(spark: SparkSession, lake: str, *, source: str | None = None,
                        make: bool = False) -> None:
    """Refuse a lake folder on this machine's file system that the cluster's executors do
    not see as the driver does (a ``file://`` lake on a disk of the driver's, not on a
    volume every node mounts at the same path), and a landing folder they do not see.

    The executors write the tables' data files and the driver their logs: on a folder
    they do not share, a batch commits files that only an executor's disk holds, and the
    lake has lost them (measured: a worker in a mount namespace of its own, its batch 0
    committed, its files then missing to every later read). A file the driver writes
    there must be seen by every task of a small job, one per core the cluster gives; a
    local master or a lake on other storage pass, and so does a folder not made yet
    unless ``make`` (a run's, which would make it anyway) makes it first. The landing
    folder, which the executors read, is only looked for (nothing is written there: it
    may be read-only); a batch on one they do not see fails, with nothing committed, in
    a stack trace.

    :raises ConfigError: naming the folder and the executors that do not see it.
    """
    if is_local_master(str(spark.sparkContext.master)):
        return
    local = local_path(lake)
    if local is not None and make:
        local.mkdir(parents=True, exist_ok=True)
    folder = None if local is None or not local.is_dir() else local
    landing = local_path(source) if source and not is_glob(source) else None
    if landing is not None and not landing.is_dir():
        landing = None
    if folder is None and landing is None:
        return
    marker = None if folder is None else folder / f".sessionlake-shared-{uuid.uuid4().hex}"
    if marker is not None:
        marker.write_bytes(b"")
    try:
        seen = _on_every_core(spark, partial(executor_sees, str(marker or ""),
                                             str(landing or "")))
    finally:
        if marker is not None:
            marker.unlink(missing_ok=True)
    for name, what, index in ((lake, "lake", 1), (source, "landing folder", 2)):
        blind = sorted({answer[0] for answer in seen if answer[index] is False})
        if blind:
            raise ConfigError(
                f"the {what} {name} is a folder of this machine that the executors "
                f"({', '.join(blind)}) do not see: "
                + ("a file written there is not there for them, so the files they write "
                   "would be lost" if index == 1 else "they read its files")
                + ". Give a folder every node mounts at the same path, or object storage "
                "(docs/object-storage.md)")


#: How long a command waits for the cluster's executors before it gives up
#: (``SESSIONLAKE_EXECUTOR_WAIT``, a duration).
ENV_EXECUTOR_WAIT = "SESSIONLAKE_EXECUTOR_WAIT"
EXECUTOR_WAIT = "2m"


def _on_every_core(spark: SparkSession, probe: Callable[[], T]) -> list[T]:
    """``probe``'s answers from a job of one task per core the cluster gives, waited for
    ``SESSIONLAKE_EXECUTOR_WAIT``: a cluster that gives no executor (workers too small
    for ``spark.executor.memory``, or busy) would hold the job, and the command, without a
    word, Spark's own warning being below the log level.

    :raises ConfigError: when the job did not finish in time, its tasks cancelled.
    """
    wait = parse_duration(os.environ.get(ENV_EXECUTOR_WAIT, EXECUTOR_WAIT), ENV_EXECUTOR_WAIT)
    context = spark.sparkContext
    tasks = max(2, context.defaultParallelism)
    group = f"sessionlake-probe-{uuid.uuid4().hex}"

    def run() -> list[T]:
        context.setJobGroup(group, "sessionlake: do the executors see the lake?", True)
        return context.parallelize(range(tasks), tasks).map(lambda _: probe()).collect()

    pool = ThreadPoolExecutor(max_workers=1)
    try:
        return pool.submit(run).result(timeout=wait.total_seconds())
    except FuturesTimeout:
        context.cancelJobGroup(group)
        executors = context._jsc.sc().getExecutorMemoryStatus().size() - 1  # but the driver
        raise ConfigError(
            f"the cluster did not run this command's first job in {format_duration(wait)} "
            f"({executors} executor(s) registered): its workers lack the free cores or the "
            "memory an executor asks (spark.executor.memory, 1g unless set), or are busy; "
            f"the master's page says which ({ENV_EXECUTOR_WAIT} sets the wait)") from None
    finally:
        pool.shutdown(wait=False)


#: Shuffle partitions per core Spark runs tasks on beyond which a command warns.
SHUFFLE_PARTITIONS_PER_CORE_MAX = 50


def warn_of_many_shuffle_partitions(spark: SparkSession, partitions: int) -> None:
    """Warn when ``--shuffle-partitions`` asks for many more tasks than the cores Spark
    runs them on: every shuffle of every batch schedules that many, each a fixed cost even
    when it has no row, so a small batch crawls (a walkthrough's 1,218 lines over 150 s at
    100,000 on two cores). Warned, not refused: the setting is Spark's to honour."""
    cores = spark.sparkContext.defaultParallelism
    if partitions > SHUFFLE_PARTITIONS_PER_CORE_MAX * cores:
        log.warning("--shuffle-partitions %d is %d tasks for each of the %d core(s) Spark "
                    "runs on, in every shuffle of every batch, each a fixed cost even with no "
                    "row: a few per core is usual (the default is 4)", partitions,
                    partitions // cores, cores)


def executor_sees(marker: str, folder: str) -> tuple[str, bool | None, bool | None]:
    """Run on an executor: where it runs (host and process), whether the file ``marker``
    exists and whether ``folder`` is a folder there (``None`` for either not asked)."""
    return (f"{socket.gethostname()} pid {os.getpid()}",
            os.path.exists(marker) if marker else None,
            os.path.isdir(folder) if folder else None)


def _python() -> str:
    import sys

    return sys.executable

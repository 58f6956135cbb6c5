"""A class-data archive for the driver JVM, so that a new process starts warm.

Each ``sessionlake`` process starts a new JVM, and that JVM spends seconds loading and
verifying the same twenty thousand classes of Spark, Delta and their libraries before
it commits anything. That is most of why a restart after a stop is slow. The JDK can
instead map a dynamic CDS archive (``-XX:SharedArchiveFile``): classes parsed and
verified by an earlier run, taken from a file.

``make setup`` builds the archive once (``python -m sessionlake.classarchive``). It runs a
small stream on a temporary lake: two micro-batches with late, duplicate and malformed
events, the state MERGE, and a query. The JVM writes out every class the run loaded as
it exits.

The archive is named by a key over the JVM and the jars it was built with. A new JDK or
new jars get a new name, so a stale archive is never offered. A JVM that cannot map the
archive it is given starts without it, silently, and only slower. The archive changes how
fast a process starts, never what it computes.

Measured on the benchmark's restart (100 events over 10,000 open sessions, whole
process, alternating runs on 2 cores): 22.3-23.9 s to the first commit with the archive
``make setup`` builds, 25.8-29.9 s without.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

#: Set to ``off`` to start every JVM without the archive.
SWITCH_ENV = "SESSIONLAKE_CLASS_ARCHIVE"
#: Where archives are kept (default: ``build/class-archive`` in the project).
FOLDER_ENV = "SESSIONLAKE_CLASS_ARCHIVE_DIR"


def archive_folder() -> Path:
    """The folder holding the archives: ``$SESSIONLAKE_CLASS_ARCHIVE_DIR``, else
    ``build/class-archive`` in the project."""
    from sessionlake.spark import PROJECT_ROOT

    given = os.environ.get(FOLDER_ENV)
    return Path(given) if given else PROJECT_ROOT / "build" / "class-archive"


def java_binary() -> Path | None:
    """The ``java`` that ``spark-submit`` starts: ``$JAVA_HOME/bin/java``, else the
    first on ``PATH``; ``None`` when there is none."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def spark_home() -> Path:
    """The Spark that starts the driver: ``$SPARK_HOME``, else pyspark's own."""
    home = os.environ.get("SPARK_HOME")
    if home:
        return Path(home)
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def spark_jars_folder() -> Path:
    """The jars on the driver's class path."""
    return spark_home() / "jars"


def spark_conf_folder() -> Path:
    """The configuration folder, first on the driver's class path: ``$SPARK_CONF_DIR``,
    else ``conf`` in the Spark home (as ``spark-submit`` picks it)."""
    given = os.environ.get("SPARK_CONF_DIR")
    return Path(given) if given else spark_home() / "conf"


def archivable_class_path() -> bool:
    """Whether the JDK can archive the driver's classes: JDK 17 refuses to, and cannot map
    an archive, when a non-empty folder is on the class path. Spark puts its configuration
    folder there, so that folder must be missing or empty."""
    folder = spark_conf_folder()
    return not folder.is_dir() or not any(folder.iterdir())


def archive_key() -> str | None:
    """A name for the archive that suits this JVM and these jars, or ``None`` without a
    ``java``.

    It is a digest of the Spark configuration folder's path, of the ``java`` binary (path,
    size, modification time) and of every jar on the driver's class path and
    ``spark.jars`` (name, size, modification time). An upgrade of either gives another
    key, and so another archive.
    """
    from sessionlake.spark import delta_jars

    java = java_binary()
    if java is None:
        return None
    digest = hashlib.sha256()
    digest.update(f"{spark_conf_folder().resolve()}\n".encode())
    files = [java, *sorted(spark_jars_folder().glob("*.jar")), *map(Path, delta_jars())]
    for path in files:
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def archive_path() -> Path | None:
    """Where the archive of this JVM and these jars is, or would be, kept."""
    key = archive_key()
    return None if key is None else archive_folder() / f"sessionlake-{key}.jsa"


def driver_archive_option() -> str:
    """The driver JVM option that maps the archive, or ``""``.

    It is ``""`` when there is no archive for this JVM and these jars, when the class
    path cannot be archived (:func:`archivable_class_path`), or when
    ``$SESSIONLAKE_CLASS_ARCHIVE`` is ``off``.
    """
    if os.environ.get(SWITCH_ENV, "").lower() == "off" or not archivable_class_path():
        return ""
    from sessionlake.spark import JarsMissingError

    try:
        path = archive_path()
    except (OSError, JarsMissingError):  # only a speed-up: the start reports what is missing
        return ""
    return f"-XX:SharedArchiveFile={path}" if path is not None and path.is_file() else ""


def build_archive(timeout_s: float = 600.0) -> Path:
    """Build the archive of this JVM and these jars, replacing any older one of the same key.

    A separate process runs the training stream (:func:`train`) with a JVM that writes
    the archive as it exits. The archive is renamed into place only once that JVM has
    exited, so a build cut off halfway leaves no archive behind.

    :return: the archive's path.
    :raises RuntimeError: when there is no ``java`` or the training run failed.
    """
    path = archive_path()
    if path is None:
        raise RuntimeError("no java on PATH nor in $JAVA_HOME: no class archive to build")
    if not archivable_class_path():
        raise RuntimeError(
            f"the Spark configuration folder {spark_conf_folder()} is on the driver's class "
            "path and is not empty, and the JDK archives no classes of such a class path: "
            "drivers will start without an archive (build one with SPARK_CONF_DIR unset, "
            "for the drivers that run without it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    with tempfile.TemporaryDirectory(prefix="sessionlake-class-archive-") as work:
        done = subprocess.run(
            [sys.executable, "-m", "sessionlake.classarchive", "--train", work,
             "--dump", str(partial)],
            capture_output=True, text=True, timeout=timeout_s, check=False,
            env={**os.environ, SWITCH_ENV: "off"},
        )
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"the class archive's training run failed:\n{done.stderr[-3000:]}")
    install_archive(partial, path)
    return path


def install_archive(built: Path, path: Path) -> None:
    """Move a finished archive to ``path`` and delete the archives of other JVMs or jars
    in its folder: only one archive can suit the JVM and jars installed."""
    os.replace(built, path)
    for old in path.parent.glob("sessionlake-*.jsa"):
        if old != path:
            old.unlink(missing_ok=True)


def train(work: Path, dump_to: Path) -> None:
    """Run what a sessionlake process loads, in a JVM that archives its classes as it exits.

    It runs two micro-batches of generated events into a lake under ``work``. The second
    batch brings late, duplicate and malformed lines, and MERGEs into the state of the
    first. Then it runs a query. At the end it stops Spark and waits for the JVM to exit,
    which is when the JVM writes ``dump_to``.
    """
    from sessionlake.config import settings_from
    from sessionlake.generate import generate_clickstream
    from sessionlake.query import run_sql
    from sessionlake.spark import build_spark, java_options
    from sessionlake.stream import run_stream

    landing, lake = work / "landing", work / "lake"
    generate_clickstream(landing, users=200, events=4_000, files=2, late_fraction=0.02,
                         duplicate_fraction=0.02, malformed_fraction=0.01)
    options = java_options()
    driver = f"{options['spark.driver.extraJavaOptions']} -XX:ArchiveClassesAtExit={dump_to}"
    spark = build_spark("local[*]", app_name="sessionlake-class-archive",
                        conf={**options, "spark.driver.extraJavaOptions": driver})
    settings = settings_from({"lake": str(lake), "source": str(landing),
                              "max_files_per_trigger": 1})
    run_stream(spark, settings)
    run_sql(spark, str(lake), "SELECT count(*), sum(event_count) FROM sessions").collect()
    gateway = spark.sparkContext._gateway
    if gateway is None:
        raise RuntimeError("the training run's JVM is not a child of this process")
    jvm = gateway.proc
    spark.stop()
    jvm.stdin.close()  # the JVM exits when its stdin closes, and writes the archive then
    if jvm.wait(timeout=300) != 0:
        raise RuntimeError(f"the training run's JVM exited with code {jvm.returncode}")


def main(argv: list[str] | None = None) -> int:
    """``python -m sessionlake.classarchive``: build this machine's archive."""
    parser = argparse.ArgumentParser(prog="python -m sessionlake.classarchive",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--if-missing", action="store_true",
                        help="do nothing when this JVM's and these jars' archive exists")
    parser.add_argument("--train", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--dump", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.train is not None:
        train(args.train, args.dump)
        return 0
    if args.if_missing:
        existing = archive_path()
        if existing is not None and existing.is_file():
            print(f"class archive: {existing} (already built)")
            return 0
    try:
        path = build_archive()
    except RuntimeError as error:
        print(f"sessionlake: {error}", file=sys.stderr)
        return 1
    print(f"class archive: {path} ({path.stat().st_size // 2**20} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

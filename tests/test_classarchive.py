"""The driver's class archive: named by its JVM and jars, built by a real training run (set-up's),
mapped by the next driver, and left out when switched off."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sessionlake import classarchive
from sessionlake.classarchive import (
    FOLDER_ENV,
    SWITCH_ENV,
    archive_key,
    archive_path,
    build_archive,
    driver_archive_option,
    install_archive,
)
from sessionlake.spark import PROJECT_ROOT


@pytest.fixture
def fake_jvm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A JAVA_HOME, a SPARK_HOME and an archive folder of the test's own."""
    (tmp_path / "jdk" / "bin").mkdir(parents=True)
    (tmp_path / "jdk" / "bin" / "java").write_text("#!/bin/sh\n")
    (tmp_path / "spark" / "jars").mkdir(parents=True)
    (tmp_path / "spark" / "jars" / "spark-core.jar").write_bytes(b"core")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    monkeypatch.setenv(FOLDER_ENV, str(tmp_path / "archives"))
    monkeypatch.delenv(SWITCH_ENV, raising=False)
    return tmp_path


@pytest.mark.parametrize("change", ["new jar", "changed jar", "other java"])
def test_the_archive_is_named_anew_for_another_jvm_or_other_jars(
    fake_jvm: Path, change: str
) -> None:
    before = archive_key()
    if change == "new jar":
        (fake_jvm / "spark" / "jars" / "extra.jar").write_bytes(b"extra")
    elif change == "changed jar":
        (fake_jvm / "spark" / "jars" / "spark-core.jar").write_bytes(b"core, upgraded")
    else:
        (fake_jvm / "jdk" / "bin" / "java").write_text("#!/bin/sh\n# another build\n")
    assert before is not None and archive_key() not in (None, before)


def test_a_driver_maps_only_an_archive_that_exists_and_is_not_switched_off(
    fake_jvm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = archive_path()
    assert path is not None and path.parent == fake_jvm / "archives"
    assert driver_archive_option() == ""
    path.parent.mkdir()
    path.write_bytes(b"archive")
    assert driver_archive_option() == f"-XX:SharedArchiveFile={path}"
    monkeypatch.setenv(SWITCH_ENV, "off")
    assert driver_archive_option() == ""


def test_a_spark_configuration_on_the_class_path_means_no_archive(
    fake_jvm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JDK 17 neither writes nor maps an archive with a non-empty folder on the class path,
    and Spark puts its configuration folder there: an empty one is fine."""
    path = archive_path()
    assert path is not None
    path.parent.mkdir()
    path.write_bytes(b"archive")
    conf = fake_jvm / "spark" / "conf"
    conf.mkdir()
    assert driver_archive_option() == f"-XX:SharedArchiveFile={path}"
    (conf / "spark-defaults.conf").write_text("spark.sql.shuffle.partitions 8\n")
    assert driver_archive_option() == ""
    with pytest.raises(RuntimeError, match="not empty"):
        build_archive()
    monkeypatch.setenv("SPARK_CONF_DIR", str(fake_jvm / "another-conf"))
    assert archive_path() != path


def test_without_java_there_is_no_archive(fake_jvm: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(fake_jvm / "no-jdk"))
    assert archive_key() is None and driver_archive_option() == ""
    with pytest.raises(RuntimeError, match="no java"):
        build_archive()


#: A driver started the way every sessionlake command starts one, running a Delta query.
DRIVER = """
from sessionlake.spark import build_spark
spark = build_spark("local[1]", conf={"spark.ui.enabled": "false"})
spark.range(3).write.format("delta").mode("overwrite").save(__import__("sys").argv[1])
print(spark.read.format("delta").load(__import__("sys").argv[1]).count())
"""


def _driver_class_sources(tmp_path: Path, env: dict[str, str]) -> dict[str, str]:
    """Class name -> where the driver JVM loaded it from, from the JVM's own class log."""
    logs = tmp_path / "class-logs"
    logs.mkdir(exist_ok=True)
    for old in logs.iterdir():
        old.unlink()
    env = {**env, "JDK_JAVA_OPTIONS": f"-Xlog:class+load=info:file={logs}/%p.log"}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path / "table")],
                          cwd=PROJECT_ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith("3")
    sources: dict[str, str] = {}
    for log in logs.iterdir():  # the launcher's JVM and the driver's: the driver loaded Delta
        text = log.read_text(errors="replace")
        if "org.apache.spark.sql.delta.DeltaLog " in text:
            sources = dict(re.findall(r"\] (\S+) source: (.+)$", text, re.MULTILINE))
    assert sources, "no driver JVM loaded Delta"
    return sources


def test_a_built_archive_is_mapped_by_the_next_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real thing: the archive of this JVM and these jars, as ``make setup`` built it
    (built here when it is missing, as ``make setup`` would), is mapped by a new driver,
    which takes Spark's and Delta's classes from it instead of from their jars.

    A build takes the training run's JVM several minutes of CPU, so the test reuses the
    archive of set-up (which ``make test`` runs first) rather than building another.
    """
    monkeypatch.delenv(FOLDER_ENV, raising=False)
    monkeypatch.delenv(SWITCH_ENV, raising=False)
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    path = archive_path()
    assert path is not None
    built = path if path.is_file() else build_archive()

    assert built == path and built.stat().st_size > 50 * 2**20
    archived = "shared objects file (top)"  # the dynamic archive, above the JDK's own
    mapped = _driver_class_sources(tmp_path, dict(os.environ))
    assert mapped["org.apache.spark.sql.SparkSession"] == archived
    assert mapped["org.apache.spark.sql.delta.DeltaLog"] == archived
    assert sum(source == archived for source in mapped.values()) > 5_000

    unmapped = _driver_class_sources(tmp_path, {**os.environ, SWITCH_ENV: "off"})
    assert archived not in unmapped.values()
    assert unmapped["org.apache.spark.sql.delta.DeltaLog"].endswith(".jar")


def test_installing_an_archive_deletes_those_of_other_jvms_or_jars(fake_jvm: Path) -> None:
    path = archive_path()
    assert path is not None
    path.parent.mkdir()
    stale = path.parent / "sessionlake-0123456789abcdef0123.jsa"
    stale.write_bytes(b"an archive of other jars")
    unrelated = path.parent / "notes.txt"
    unrelated.write_text("kept")
    partial = path.with_name(f"{path.name}.123.partial")
    partial.write_bytes(b"archive")

    install_archive(partial, path)

    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, "notes.txt"])
    assert path.read_bytes() == b"archive"


def test_the_if_missing_build_keeps_an_archive_that_is_there(
    fake_jvm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = archive_path()
    assert path is not None
    path.parent.mkdir()
    path.write_bytes(b"archive")
    assert classarchive.main(["--if-missing"]) == 0
    assert "already built" in capsys.readouterr().out
    assert path.read_bytes() == b"archive"

"""Building the Spark session: which masters are local, and the package zip for executors."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionlake.checkpoint import UnreadInput
from sessionlake.config import ConfigError
from sessionlake.spark import (
    _STARTED_WITH,
    CODEGEN_KEYS,
    CODEGEN_MIN_RECORDS,
    COMMIT_FS_CONF,
    DEFAULT_CONF,
    DRIVER_JIT_ENV,
    ENV_DRIVER_MEMORY,
    LOCAL_FS_CONF,
    LOCAL_FS_ENV,
    LOG_CONFIG,
    PACKAGE_DIR,
    QUERY_QUICK_MAX_BYTES,
    QUICK_START_JIT,
    QUICK_START_MAX_BATCHES,
    QUICK_START_MAX_BYTES,
    REQUIRED_CONF_KEYS,
    SPARK_UI_ENV,
    THROUGHPUT_GC,
    administrators_conf,
    check_master_answers,
    codegen_for_batch,
    default_conf,
    delta_jars,
    driver_memory,
    fit_codegen_to_batch,
    fit_codegen_to_parse,
    is_local_master,
    java_options,
    jvm_stdout_to_stderr,
    local_fs_conf,
    local_fs_jar,
    operator_gave,
    package_files,
    package_zip,
    quick_start_for,
    quick_start_for_query,
    ship_package,
    spark_jars,
    ui_conf,
    warn_of_many_shuffle_partitions,
)
from tests.conftest import REPO
from tests.helpers import first


@pytest.mark.parametrize(
    ("master", "local"),
    [
        ("local", True),
        ("local[*]", True),
        ("local[2]", True),
        ("local[2,3]", True),  # with task retries
        (" local[4] ", True),
        ("spark://127.0.0.1:7077", False),
        ("spark://m1:7077,m2:7077", False),  # standby masters
        ("local-cluster[2,1,1024]", False),  # executors in separate JVMs
        ("yarn", False),
        ("k8s://https://kubernetes:443", False),
        ("localhost", False),
    ],
)
def test_is_local_master(master: str, local: bool) -> None:
    assert is_local_master(master) is local


@pytest.mark.parametrize("whose", ["writable by others", "owned by another account"])
def test_package_zip_refuses_a_folder_others_could_plant_a_zip_in(
    tmp_path: Path, whose: str
) -> None:
    """The zip runs on every executor: one planted where the driver looks (a predictable
    folder under /tmp another user made first) must not be shipped."""
    folder = tmp_path / "zips"
    folder.mkdir()
    planted = folder / package_zip(tmp_path / "mine").name  # the name anyone can compute
    planted.write_bytes(b"not ours")
    if whose == "writable by others":
        folder.chmod(0o777)
    elif os.getuid() != 0:
        pytest.skip("giving a folder to another account takes root")
    else:
        os.chown(folder, 1, -1)
    with pytest.raises(ConfigError, match=f"{folder} is {whose}: .*SESSIONLAKE_PYFILES_DIR"):
        package_zip(folder)


def test_package_zip_holds_every_module_and_is_named_by_content(tmp_path: Path) -> None:
    archive = package_zip(tmp_path)
    names = zipfile.ZipFile(archive).namelist()
    assert names == [f"sessionlake/{p.relative_to(PACKAGE_DIR).as_posix()}"
                     for p in package_files()]
    assert "sessionlake/__init__.py" in names and "sessionlake/py.typed" in names
    assert not any("__pycache__" in name for name in names)
    # Same code, same file: built once, reused by every application.
    assert package_zip(tmp_path) == archive
    assert archive.name.startswith("sessionlake-") and archive.suffix == ".zip"
    assert [p.name for p in tmp_path.iterdir()] == [archive.name]  # no temporary left over


def test_changed_code_gets_a_new_zip_beside_the_old(tmp_path: Path) -> None:
    copy = tmp_path / "src" / "sessionlake"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    before = package_zip(tmp_path / "zips", package_dir=copy)
    with open(copy / "sessionize.py", "a") as module:
        module.write("\n# changed\n")
    after = package_zip(tmp_path / "zips", package_dir=copy)
    assert after != before and before.exists() and after.exists()


def test_executors_import_the_package_from_the_zip(tmp_path: Path) -> None:
    archive = package_zip(tmp_path)
    # As a PySpark worker does: the shipped file ahead of what the interpreter has installed.
    code = ("import sys; sys.path.insert(1, sys.argv[1]); import sessionlake.sessionize as m; "
            "print(m.__file__)")
    done = subprocess.run([sys.executable, "-c", code, str(archive)], capture_output=True,
                          text=True, cwd=tmp_path, check=True)
    assert done.stdout.strip() == f"{archive}/sessionlake/sessionize.py"


class _Context:
    def __init__(self, master: str) -> None:
        self.master, self.applicationId = master, f"app-{master}"
        self.added: list[str] = []

    def addPyFile(self, path: str) -> None:
        self.added.append(path)


def _session(master: str) -> Any:
    return SimpleNamespace(sparkContext=_Context(master))


def test_a_local_master_ships_nothing() -> None:
    spark = _session("local[2]")
    assert ship_package(spark) is None
    assert spark.sparkContext.added == []


def test_a_cluster_master_ships_the_zip_once_per_application(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SESSIONLAKE_PYFILES_DIR", str(tmp_path))
    spark = _session("spark://127.0.0.1:7077")
    shipped = ship_package(spark)
    assert shipped is not None and shipped.parent == tmp_path
    assert ship_package(spark) == shipped  # build_spark again on the same session
    assert spark.sparkContext.added == [str(shipped)]


@pytest.mark.parametrize(
    ("records", "compiled"),
    [(0, False), (1, False), (99_999, False), (100_000, True), (10_000_000, True)],
)
def test_only_big_batches_compile_code(records: int, compiled: bool) -> None:
    assert codegen_for_batch(records) == {
        "spark.sql.codegen.wholeStage": "true" if compiled else "false",
        "spark.sql.codegen.factoryMode": "FALLBACK" if compiled else "NO_CODEGEN",
    }


def test_code_generation_the_operator_set_is_kept(spark: SparkSession) -> None:
    """The suite's spark-defaults.conf sets both keys: a big batch must not undo them."""
    before = {key: spark.conf.get(key) for key in CODEGEN_KEYS}
    assert operator_gave(spark, CODEGEN_KEYS[0]) and operator_gave(spark, CODEGEN_KEYS[1])
    fit_codegen_to_batch(spark, 10_000_000)
    assert {key: spark.conf.get(key) for key in CODEGEN_KEYS} == before


@pytest.fixture
def codegen_unset(
    spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> Iterator[SparkSession]:
    """The suite's session as if no operator had set code generation; restored after."""
    before = {key: spark.conf.get(key) for key in CODEGEN_KEYS}
    monkeypatch.setitem(_STARTED_WITH, spark.sparkContext.applicationId, frozenset())
    yield spark
    for key, value in before.items():
        if value is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, value)


@pytest.mark.parametrize("records", [10, 1_000_000])
def test_code_generation_follows_the_batch_when_nobody_set_it(
    codegen_unset: SparkSession, records: int
) -> None:
    spark = codegen_unset
    fit_codegen_to_batch(spark, records)
    assert {key: spark.conf.get(key) for key in CODEGEN_KEYS} == codegen_for_batch(records)
    assert first(spark.range(5).selectExpr("sum(id * 2) AS s"))["s"] == 20


def test_the_parse_is_compiled_even_for_a_small_batch(codegen_unset: SparkSession) -> None:
    spark = codegen_unset
    fit_codegen_to_batch(spark, 4)
    fit_codegen_to_parse(spark)
    assert {key: spark.conf.get(key) for key in CODEGEN_KEYS} == codegen_for_batch(
        CODEGEN_MIN_RECORDS)


def test_the_driver_jvm_runs_the_log_config_and_the_collector(spark: SparkSession) -> None:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    runtime = jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert THROUGHPUT_GC in arguments
    assert f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}" in arguments
    assert java_options()["spark.executor.extraJavaOptions"] == THROUGHPUT_GC


def test_a_small_broadcast_holds_a_small_page_in_the_driver(spark: SparkSession) -> None:
    """A broadcast hash join's relation lives in the driver's block manager as long as the
    broadcast does, in memory pages: at Spark's own page size, three rows held 16 MB in
    this 2g driver (32 MB in sessionlake's 4g one)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    memory = jvm.org.apache.spark.SparkEnv.get().memoryManager()
    users = spark.range(100).selectExpr("concat('u', id) AS user_id")
    few = spark.createDataFrame([("u1",), ("u2",), ("u3",)], "user_id string")
    held_before = memory.storageMemoryUsed()
    assert users.join(F.broadcast(few), "user_id").count() == 3
    assert memory.storageMemoryUsed() - held_before < 4 * 2**20


@pytest.mark.parametrize(("enabled", "retained"), [
    ("false", "50"), ("False", "50"), ("true", None), ("TRUE", None),
])
def test_with_the_ui_off_the_status_store_keeps_few_sql_executions(
    enabled: str, retained: str | None,
) -> None:
    conf = ui_conf(enabled)
    assert conf["spark.ui.enabled"] == enabled
    assert conf.get("spark.sql.ui.retainedExecutions") == retained


_SMALL = UnreadInput(bytes=10, files=1)


@pytest.mark.parametrize(("mode", "unread", "per_batch", "quick"), [
    (None, UnreadInput(0, files=0), None, True),
    (None, UnreadInput(QUICK_START_MAX_BYTES, files=1), None, True),
    (None, UnreadInput(QUICK_START_MAX_BYTES + 1, files=1), None, False),
    (None, UnreadInput(10, files=100), None, True),  # one batch of them all
    (None, UnreadInput(10, files=QUICK_START_MAX_BATCHES), 1, True),
    (None, UnreadInput(10, files=QUICK_START_MAX_BATCHES + 1), 1, False),
    (None, UnreadInput(10, files=2 * QUICK_START_MAX_BATCHES), 2, True),
    (None, None, None, False),  # unknown: a topic, a remote folder, a run that keeps following
    ("auto", _SMALL, None, True),
    ("quick", None, None, True),
    ("QUICK", UnreadInput(10 * QUICK_START_MAX_BYTES, files=50), 1, True),
    ("full", _SMALL, None, False),
])
def test_a_run_with_little_to_read_compiles_with_c1_only(
    monkeypatch: pytest.MonkeyPatch, mode: str | None, unread: UnreadInput | None,
    per_batch: int | None, quick: bool,
) -> None:
    if mode is None:
        monkeypatch.delenv(DRIVER_JIT_ENV, raising=False)
    else:
        monkeypatch.setenv(DRIVER_JIT_ENV, mode)
    assert quick_start_for(unread, per_batch) is quick


@pytest.mark.parametrize(("mode", "table_bytes", "quick"), [
    (None, 0, True),
    (None, QUERY_QUICK_MAX_BYTES, True),
    (None, QUERY_QUICK_MAX_BYTES + 1, False),
    (None, None, False),  # unknown: a lake not on this machine's disks
    ("quick", None, True),
    ("full", 0, False),
])
def test_a_query_over_small_tables_compiles_with_c1_only(
    monkeypatch: pytest.MonkeyPatch, mode: str | None, table_bytes: int | None, quick: bool,
) -> None:
    if mode is None:
        monkeypatch.delenv(DRIVER_JIT_ENV, raising=False)
    else:
        monkeypatch.setenv(DRIVER_JIT_ENV, mode)
    assert quick_start_for_query(table_bytes) is quick


def test_a_wrong_jit_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DRIVER_JIT_ENV, "fast")
    with pytest.raises(ConfigError, match="SESSIONLAKE_DRIVER_JIT must be auto, quick or full"):
        quick_start_for(_SMALL)
    with pytest.raises(ConfigError, match="SESSIONLAKE_DRIVER_JIT must be auto, quick or full"):
        quick_start_for_query(0)


def test_only_the_driver_of_a_quick_start_stops_at_c1() -> None:
    quick, full = java_options(quick_start=True), java_options()
    assert quick["spark.driver.extraJavaOptions"].endswith(f" {QUICK_START_JIT}")
    assert "-XX:ReservedCodeCacheSize=240m" in QUICK_START_JIT  # C1 alone would get 48 MB
    assert QUICK_START_JIT not in full["spark.driver.extraJavaOptions"]
    assert QUICK_START_JIT not in quick["spark.executor.extraJavaOptions"]


def test_the_local_file_system_is_built_and_on_the_drivers_class_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    jar = local_fs_jar()
    assert jar is not None, "make jars builds it"
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert java_options()["spark.driver.extraClassPath"] == str(jar)


_ADMINISTRATORS = """\
# an administrator's spark-defaults.conf
! also a comment
spark.buffer.pageSize 4m
spark.databricks.delta.snapshotPartitions=3
  spark.sql.warehouse.dir : /srv/warehouse
spark.sql.session.timeZone\tAmerica/New_York
spark.driver.memory 8g
spark.executor.extraJavaOptions -XX:+UseG1GC \\
    -Dcontinued=yes
spark.driver.extraClassPath=/opt/a.jar:/opt/b.jar
spark.eventLog.enabled
hadoop.tmp.dir /not/spark
spark.buffer.pageSize 8m
"""


@pytest.fixture
def administrators(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A configuration folder with :data:`_ADMINISTRATORS` as its ``spark-defaults.conf``."""
    (tmp_path / "spark-defaults.conf").write_text(_ADMINISTRATORS)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv(ENV_DRIVER_MEMORY, raising=False)
    return tmp_path


def test_the_administrators_settings_are_read_as_spark_reads_them(administrators: Path) -> None:
    assert administrators_conf() == {
        "spark.buffer.pageSize": "8m",  # the last of a key
        "spark.databricks.delta.snapshotPartitions": "3",
        "spark.sql.warehouse.dir": "/srv/warehouse",
        "spark.sql.session.timeZone": "America/New_York",
        "spark.driver.memory": "8g",
        "spark.executor.extraJavaOptions": "-XX:+UseG1GC -Dcontinued=yes",
        "spark.driver.extraClassPath": "/opt/a.jar:/opt/b.jar",
        "spark.eventLog.enabled": "",
    }


def test_without_a_defaults_file_there_are_no_administrators_settings(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    monkeypatch.delenv(SPARK_UI_ENV, raising=False)
    assert administrators_conf() == {}
    assert default_conf() == {**DEFAULT_CONF, **ui_conf("false")}


@pytest.mark.parametrize(("variable", "file", "conf"), [
    (None, None, {"spark.ui.enabled": "false", "spark.sql.ui.retainedExecutions": "50"}),
    (None, "true", {}),  # the file's UI, with Spark's 1,000 executions
    (None, "false", {"spark.sql.ui.retainedExecutions": "50"}),
    ("true", "false", {"spark.ui.enabled": "true"}),  # the variable wins over the file
    ("false", "true", {"spark.ui.enabled": "false", "spark.sql.ui.retainedExecutions": "50"}),
])
def test_the_ui_is_the_variables_else_the_administrators_else_off(
    monkeypatch: pytest.MonkeyPatch, variable: str | None, file: str | None,
    conf: dict[str, str],
) -> None:
    if variable is None:
        monkeypatch.delenv(SPARK_UI_ENV, raising=False)
    else:
        monkeypatch.setenv(SPARK_UI_ENV, variable)
    given = {} if file is None else {"spark.ui.enabled": file}
    assert {key: value for key, value in default_conf(given).items()
            if key.startswith(("spark.ui.", "spark.sql.ui."))
            and key != "spark.ui.showConsoleProgress"} == conf


def test_the_administrators_tuning_wins_but_not_over_what_sessionlake_needs(
    administrators: Path,
) -> None:
    conf = default_conf()
    for theirs in ("spark.buffer.pageSize", "spark.databricks.delta.snapshotPartitions",
                   "spark.sql.warehouse.dir"):
        assert theirs not in conf  # so that spark-submit takes the file's
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert {key: conf[key] for key in REQUIRED_CONF_KEYS} == \
        {key: DEFAULT_CONF[key] for key in REQUIRED_CONF_KEYS}
    assert conf["spark.sql.parquet.outputTimestampType"] == "TIMESTAMP_MICROS"  # not theirs


@pytest.mark.parametrize(("theirs", "extensions"), [
    ("org.example.Ext", "org.example.Ext,io.delta.sql.DeltaSparkSessionExtension"),
    (" org.example.Ext , io.delta.sql.DeltaSparkSessionExtension",
     "org.example.Ext,io.delta.sql.DeltaSparkSessionExtension"),
    ("io.delta.sql.DeltaSparkSessionExtension", "io.delta.sql.DeltaSparkSessionExtension"),
    ("", "io.delta.sql.DeltaSparkSessionExtension"),
])
def test_the_administrators_sql_extensions_are_kept_beside_deltas(
    theirs: str, extensions: str
) -> None:
    assert default_conf({"spark.sql.extensions": theirs})["spark.sql.extensions"] == extensions


def test_a_setting_sessionlake_needs_is_kept_with_one_warning(
    administrators: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sessionlake.spark._WARNED", set())  # none yet in this process
    with caplog.at_level("WARNING", logger="sessionlake.spark"):
        default_conf()
        default_conf()
    assert [r.getMessage() for r in caplog.records] == [
        "spark-defaults.conf sets spark.sql.session.timeZone to America/New_York; sessionlake "
        "runs with UTC, which it needs"]


@pytest.mark.parametrize(("file", "env", "memory"), [
    (True, None, "8g"),
    (True, "2g", "2g"),
    (False, None, "4g"),
])
def test_the_drivers_memory_is_sessionlakes_setting_else_the_administrators_else_4g(
    administrators: Path, monkeypatch: pytest.MonkeyPatch, file: bool, env: str | None,
    memory: str,
) -> None:
    if not file:
        (administrators / "spark-defaults.conf").unlink()
    if env:
        monkeypatch.setenv(ENV_DRIVER_MEMORY, env)
    assert driver_memory() == memory


@pytest.mark.parametrize("value", ["512m", "4g", "4G", "4gb", "1t", "2048", "1073741824b"])
def test_a_memory_size_as_spark_reads_it_is_taken(
    administrators: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(ENV_DRIVER_MEMORY, value)
    assert driver_memory() == value


@pytest.mark.parametrize("value", ["lots", "4 g", "1.5g", "0", "0g", "-1g", "4x", "g"])
@pytest.mark.parametrize("where", ["env", "file"])
def test_a_drivers_memory_that_is_no_size_is_refused_naming_where_it_came_from(
    administrators: Path, monkeypatch: pytest.MonkeyPatch, value: str, where: str
) -> None:
    """Before any JVM starts: the JVM refused it with a Java error and PySpark's traceback."""
    if where == "env":
        monkeypatch.setenv(ENV_DRIVER_MEMORY, value)
        said = f"SESSIONLAKE_DRIVER_MEMORY must be a memory size such as 4g or 512m, got {value!r}"
    else:
        (administrators / "spark-defaults.conf").write_text(f"spark.driver.memory {value}\n")
        said = ("spark.driver.memory in spark-defaults.conf must be a memory size such as 4g "
                f"or 512m, got {value!r}")
    with pytest.raises(ConfigError) as refused:
        driver_memory()
    assert str(refused.value) == said


def test_an_administrators_java_options_and_class_path_are_kept_after_sessionlakes(
    administrators: Path,
) -> None:
    """spark-submit takes options given to it over spark-defaults.conf's; a JVM refuses two
    garbage collectors, so one chosen there is the only one."""
    options = java_options()
    assert options["spark.executor.extraJavaOptions"] == "-XX:+UseG1GC -Dcontinued=yes"
    assert options["spark.driver.extraJavaOptions"].startswith(f"{THROUGHPUT_GC} ")
    assert options["spark.driver.extraClassPath"] == f"{local_fs_jar()}:/opt/a.jar:/opt/b.jar"


def test_the_administrators_jars_are_kept_after_the_jar_folders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "spark-defaults.conf").write_text("spark.jars /opt/a.jar, /opt/b.jar\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert spark_jars().split(",") == [*delta_jars(), "/opt/a.jar", "/opt/b.jar"]
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path / "none"))
    assert spark_jars().split(",") == delta_jars()


@pytest.mark.parametrize("line", [
    "spark.driver.defaultJavaOptions -XX:+UseSerialGC",  # Spark prepends these itself
    "spark.driver.extraJavaOptions=-Xss4m -XX:+UseG1GC",
])
def test_a_collector_the_administrator_chose_is_the_drivers_only_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, line: str
) -> None:
    (tmp_path / "spark-defaults.conf").write_text(f"{line}\n")
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    driver = java_options()["spark.driver.extraJavaOptions"]
    assert THROUGHPUT_GC not in driver and driver.startswith("-Dlog4j2.configurationFile=")
    assert driver.endswith("-Xss4m -XX:+UseG1GC") == ("extra" in line)


_REPORT_SETTINGS = """
import json
from sessionlake.spark import build_spark
spark = build_spark("local[1]", shuffle_partitions=1)
jvm = spark.sparkContext._jvm
print(json.dumps({
    "page": spark.conf.get("spark.buffer.pageSize"),
    "zone": spark.conf.get("spark.sql.session.timeZone"),
    "heap_mb": jvm.Runtime.getRuntime().maxMemory() // 2**20,
    "collectors": [bean.getName() for bean in
                   jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()],
    "marker": jvm.System.getProperty("administrators.marker"),
}))
"""


def test_a_new_driver_runs_with_the_administrators_spark_defaults(tmp_path: Path) -> None:
    """What spark-submit makes of the file and of sessionlake's settings, in a new JVM."""
    (tmp_path / "spark-defaults.conf").write_text(
        "spark.buffer.pageSize 4m\n"
        "spark.sql.session.timeZone America/New_York\n"
        "spark.driver.memory 1g\n"
        "spark.driver.extraJavaOptions -XX:+UseSerialGC -Dadministrators.marker=kept\n")
    env = {key: value for key, value in os.environ.items() if key != ENV_DRIVER_MEMORY}
    done = subprocess.run([sys.executable, "-c", _REPORT_SETTINGS], capture_output=True,
                          text=True, cwd=REPO, timeout=300, check=False,
                          env={**env, "SPARK_CONF_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["page"] == "4m" and report["marker"] == "kept"
    assert report["zone"] == "UTC"
    assert report["heap_mb"] < 1024
    assert report["collectors"] == ["Copy", "MarkSweepCompact"]  # the serial collector's


@pytest.mark.parametrize(("master", "on_class_path", "switch", "chosen"), [
    ("local[2]", True, None, LOCAL_FS_CONF),
    ("local[*]", True, "sessionlake", LOCAL_FS_CONF),
    # The executors lack the jar: the driver's commits alone.
    ("spark://127.0.0.1:7077", True, None, COMMIT_FS_CONF),
    ("local-cluster[2,1,1024]", True, None, COMMIT_FS_CONF),
    (None, True, None, COMMIT_FS_CONF),  # spark-submit's: the master is not known
    ("local[2]", False, None, {}),  # an operator's own driver class path
    ("spark://127.0.0.1:7077", False, None, {}),
    ("local[2]", True, "hadoop", {}),
    (None, True, " Hadoop ", {}),
])
def test_a_new_driver_gets_the_local_file_system_its_executors_can_load(
    monkeypatch: pytest.MonkeyPatch, master: str | None, on_class_path: bool,
    switch: str | None, chosen: dict[str, str],
) -> None:
    jar = local_fs_jar()
    assert jar is not None
    if switch is None:
        monkeypatch.delenv(LOCAL_FS_ENV, raising=False)
    else:
        monkeypatch.setenv(LOCAL_FS_ENV, switch)
    settings = {"spark.driver.extraClassPath": str(jar) if on_class_path else "/opt/other.jar"}
    assert local_fs_conf(master, settings) == chosen
    assert COMMIT_FS_CONF == {
        "spark.hadoop.fs.AbstractFileSystem.file.impl": "sessionlake.hadoop.LocalFs"}


@pytest.fixture(scope="module")
def hadoop(spark: SparkSession) -> SimpleNamespace:
    """The session's Hadoop file system and file context for ``file:`` paths, and the JVM."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    uri = jvm.java.net.URI("file:///")
    return SimpleNamespace(
        jvm=jvm, gateway=spark.sparkContext._gateway,
        fs=jvm.org.apache.hadoop.fs.FileSystem.get(uri, conf),
        context=jvm.org.apache.hadoop.fs.FileContext.getFileContext(uri, conf),
    )


def test_the_session_writes_files_through_the_local_file_system(hadoop: SimpleNamespace) -> None:
    assert hadoop.fs.getClass().getName() == "sessionlake.hadoop.LocalFileSystem"
    assert hadoop.fs.getRawFileSystem().getClass().getName() == \
        "sessionlake.hadoop.RawLocalFileSystem"
    assert hadoop.context.getDefaultFileSystem().getClass().getName() == \
        "sessionlake.hadoop.LocalFs"


def test_a_created_file_gets_the_permission_asked_for(
    hadoop: SimpleNamespace, tmp_path: Path
) -> None:
    path = hadoop.jvm.org.apache.hadoop.fs.Path((tmp_path / "f.txt").as_uri())
    permission = hadoop.jvm.org.apache.hadoop.fs.permission.FsPermission(0o640)
    stream = hadoop.fs.create(path, permission, False, 4096, 1, 1 << 20, None)
    stream.write(b"x")
    stream.close()
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o640
    hadoop.fs.setPermission(path, hadoop.jvm.org.apache.hadoop.fs.permission.FsPermission(0o604))
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o604


@pytest.mark.parametrize("name", ["file", "link", "file_uri", "link_uri"])
def test_a_link_status_is_hadoops_own(hadoop: SimpleNamespace, tmp_path: Path, name: str) -> None:
    """The same answer as Hadoop's local file system, which ran ``readlink`` for it."""
    (tmp_path / "file").write_text("abc")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    jvm = hadoop.jvm
    given = tmp_path / name.removesuffix("_uri")
    path = jvm.org.apache.hadoop.fs.Path(given.as_uri() if name.endswith("_uri") else str(given))
    hadoops = jvm.org.apache.hadoop.fs.RawLocalFileSystem()
    hadoops.initialize(jvm.java.net.URI("file:///"), hadoop.fs.getConf())
    ours, theirs = hadoop.fs.getRawFileSystem().getFileLinkStatus(path), \
        hadoops.getFileLinkStatus(path)
    assert (ours.isSymlink(), ours.getLen(), ours.isFile()) == \
        (theirs.isSymlink(), theirs.getLen(), theirs.isFile())
    assert str(ours.getPath()) == str(theirs.getPath())
    if theirs.isSymlink():
        assert str(ours.getSymlink()) == str(theirs.getSymlink())
        assert ours.getSymlink().toUri().getPath() == str(tmp_path / "file")


def test_a_missing_path_has_no_link_status(hadoop: SimpleNamespace, tmp_path: Path) -> None:
    path = hadoop.jvm.org.apache.hadoop.fs.Path((tmp_path / "missing").as_uri())
    with pytest.raises(Exception, match="FileNotFoundException"):
        hadoop.fs.getRawFileSystem().getFileLinkStatus(path)


def test_a_rename_through_the_file_context_never_overwrites(
    hadoop: SimpleNamespace, tmp_path: Path
) -> None:
    """Delta's commits and Spark's checkpoint rely on it: the first writer of a name wins."""
    jvm = hadoop.jvm
    (tmp_path / "a.tmp").write_text("a")
    (tmp_path / "b.tmp").write_text("b")

    def path(name: str) -> Any:
        return jvm.org.apache.hadoop.fs.Path((tmp_path / name).as_uri())

    options = hadoop.gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
    options[0] = jvm.org.apache.hadoop.fs.Options.Rename.NONE
    hadoop.context.rename(path("a.tmp"), path("00.json"), options)
    with pytest.raises(Exception, match="FileAlreadyExistsException"):
        hadoop.context.rename(path("b.tmp"), path("00.json"), options)
    assert (tmp_path / "00.json").read_text() == "a"
    assert (tmp_path / "b.tmp").read_text() == "b"


def test_of_writers_racing_for_a_name_exactly_one_renames_to_it(
    hadoop: SimpleNamespace, tmp_path: Path
) -> None:
    """Two processes committing one Delta version (a stream and a maintenance command
    beside it) rename their files to the same name at once. Hadoop's local rename checks
    that the name is free, then renames, replacing what another writer renamed in between:
    both "committed", the first commit was lost (11 of 300 rounds of six threads here).
    Threads of one JVM race the same way."""
    jvm = hadoop.jvm
    options = hadoop.gateway.new_array(jvm.org.apache.hadoop.fs.Options.Rename, 1)
    options[0] = jvm.org.apache.hadoop.fs.Options.Rename.NONE
    writers, doubled, failed = 6, list[int](), list[str]()
    for round_ in range(200):
        target = tmp_path / f"{round_:03d}.json"
        for writer in range(writers):
            (tmp_path / f".{round_:03d}.{writer}.tmp").write_text(str(writer))
        renamed: list[int] = []
        start = threading.Barrier(writers)

        def rename(writer: int, target: Path = target, round_: int = round_,
                   renamed: list[int] = renamed, start: threading.Barrier = start) -> None:
            source = jvm.org.apache.hadoop.fs.Path(
                (tmp_path / f".{round_:03d}.{writer}.tmp").as_uri())
            start.wait()
            try:
                hadoop.context.rename(source, jvm.org.apache.hadoop.fs.Path(target.as_uri()),
                                      options)
            except Exception as error:  # py4j's error names the Java one
                if "FileAlreadyExistsException" not in str(error):
                    failed.append(str(error)[-2000:])
            else:
                renamed.append(writer)

        threads = [threading.Thread(target=rename, args=(w,)) for w in range(writers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if len(renamed) != 1:
            doubled.append(round_)
        else:
            assert target.read_text() == str(renamed[0])
    assert failed == []
    assert doubled == [], f"{len(doubled)} of 200 names not renamed to by exactly one writer"


def test_a_child_started_in_the_swap_writes_its_output_to_standard_error(
    capfd: pytest.CaptureFixture[str]
) -> None:
    with jvm_stdout_to_stderr():
        subprocess.run(["sh", "-c", "echo child"], check=True)
    print("parent", flush=True)
    assert capfd.readouterr() == ("parent\n", "child\n")


#: A JVM started by build_spark in a process of its own prints a line as Delta's VACUUM does
#: ("Deleted 0 files and directories ...", through Scala's console), and Python the result.
_JVM_THEN_PYTHON_PRINT = """
from sessionlake.spark import build_spark
build_spark("local[1]", shuffle_partitions=1)._jvm.scala.Console.println("from the JVM")
print("result")
"""


def test_the_jvms_output_goes_to_standard_error_and_the_commands_result_alone_to_standard_output(
) -> None:
    done = subprocess.run([sys.executable, "-c", _JVM_THEN_PYTHON_PRINT],
                          capture_output=True, text=True, cwd=REPO, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == "result\n"
    assert "from the JVM" in done.stderr


def test_a_standalone_master_must_answer_at_one_of_its_addresses() -> None:
    """A restart checks this before it stops the stream it replaces: an unreachable master
    would leave that stream stopped. One answering address of several (a standby
    master's) is enough; other masters are not asked."""
    with socket.socket() as listening, socket.socket() as closed:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        closed.bind(("127.0.0.1", 0))
        up, down = (f"127.0.0.1:{s.getsockname()[1]}" for s in (listening, closed))
        check_master_answers(f"spark://{up}")
        check_master_answers(f"spark://{down},{up}")
        for master in ("local[2]", "yarn", "k8s://https://nowhere:6443"):
            check_master_answers(master)
        with pytest.raises(ConfigError, match=rf"^the Spark master spark://{down} does not "
                           rf"answer \({down}: Connection refused\): start it"):
            check_master_answers(f"spark://{down}")


@pytest.mark.parametrize(("per_core", "warned"), [(50, False), (51, True)])
def test_many_more_shuffle_partitions_than_cores_are_warned_of(
    spark: SparkSession, caplog: pytest.LogCaptureFixture, per_core: int, warned: bool
) -> None:
    cores = spark.sparkContext.defaultParallelism
    with caplog.at_level(logging.WARNING, logger="sessionlake.spark"):
        warn_of_many_shuffle_partitions(spark, per_core * cores)
    assert bool(caplog.records) is warned
    if warned:
        assert caplog.records[0].getMessage().startswith(
            f"--shuffle-partitions {per_core * cores} is {per_core} tasks for each of the "
            f"{cores} core(s)")

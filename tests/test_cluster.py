"""sessionlake on a real Spark standalone cluster: same tables as a local run.

One cluster (a master and two one-core workers, ``spark_cluster``), one synthetic
clickstream file with duplicate and malformed records (one micro-batch: every job of a
batch costs scheduling on the cluster, and lateness across batches is tested locally
elsewhere), and three runs of it: a local one in this process (the reference), ``sessionlake run
--master spark://...`` into a ``file://`` lake, and the micro-batch DAG through the
``spark_default`` connection pointed at the cluster. Both cluster runs must give the
reference's tables and must have run tasks on both workers, each executor holding the
shipped ``sessionlake`` zip.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.testing import assertDataFrameEqual

from sessionlake.config import settings_from
from sessionlake.generate import generate_clickstream
from sessionlake.spark import package_zip
from sessionlake.stream import run_stream
from sessionlake.tables import read_table
from tests.conftest import REPO
from tests.dags.conftest import DAGS, airflow_home  # noqa: F401 - the DAG test's fixture
from tests.sparkcluster import SparkCluster, start_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

#: Processing-time columns: the only ones allowed to differ between two runs.
PROCESSING_TIME = ("ingested_at", "recorded_at", "quarantined_at", "updated_at",
                   "changed_at", "closed_at")
#: Every table a micro-batch writes but batch_metrics (timings), which is compared by counts.
TABLES = ("events", "open_sessions", "sessions", "session_changelog", "late_events",
          "quarantine")
METRIC_COUNTS = ("batch_id", "input_records", "accepted", "late", "quarantined", "duplicates")


def _comparable(frame: DataFrame) -> DataFrame:
    return frame.drop(*[c for c in PROCESSING_TIME if c in frame.columns])


def assert_same_tables(spark: SparkSession, lake: str, reference: str) -> None:
    """Every table of ``lake`` holds the rows of ``reference``'s, processing times aside."""
    for table in TABLES:
        assertDataFrameEqual(_comparable(read_table(spark, lake, table)),
                             _comparable(read_table(spark, reference, table)))
    assertDataFrameEqual(read_table(spark, lake, "batch_metrics").select(*METRIC_COUNTS),
                         read_table(spark, reference, "batch_metrics").select(*METRIC_COUNTS))


def assert_ran_on_both_workers(cluster: SparkCluster, app_name: str) -> None:
    """The app had an executor on each worker, and each fetched the shipped package zip."""
    app = cluster.completed_app(app_name)
    executors = cluster.executor_dirs(app["id"])
    assert len(executors) == 2 and all(executors.values()), executors
    shipped = package_zip().name
    for work, folders in executors.items():
        assert any((folder / shipped).is_file() for folder in folders), (
            f"no executor of {app['id']} in {work} fetched {shipped}: "
            f"{[sorted(p.name for p in f.iterdir()) for f in folders]}")


@pytest.fixture(scope="module")
def clickstream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One file of synthetic events, duplicate and malformed records included."""
    landing = tmp_path_factory.mktemp("cluster") / "landing"
    generate_clickstream(landing, users=20, events=400, files=1, duplicate_fraction=0.03,
                         malformed_fraction=0.03, seed=7)
    return landing


@pytest.fixture(scope="module")
def reference_lake(spark: SparkSession, clickstream: Path) -> str:
    """The same events run locally, in this process."""
    settings = settings_from({"lake": str(clickstream.parent / "local-lake"),
                              "source": str(clickstream), "shuffle_partitions": 2}, env={})
    run_stream(spark, settings)
    return settings.lake


@pytest.fixture
def cluster_env(spark_cluster: SparkCluster, monkeypatch: pytest.MonkeyPatch) -> SparkCluster:
    """Submitted drivers read the cluster apps' spark-defaults and stay small."""
    monkeypatch.setenv("SPARK_CONF_DIR", str(spark_cluster.conf_dir))
    monkeypatch.setenv("SESSIONLAKE_DRIVER_MEMORY", "1g")
    return spark_cluster


def test_cli_run_on_the_cluster_gives_the_local_tables(
    spark: SparkSession, cluster_env: SparkCluster, clickstream: Path, reference_lake: str,
) -> None:
    lake = (clickstream.parent / "cli-lake").as_uri()
    done = subprocess.run(
        [sys.executable, "-m", "sessionlake.cli", "run", "--source", str(clickstream),
         "--lake", lake, "--master", cluster_env.master_url, "--shuffle-partitions", "2"],
        capture_output=True, text=True, cwd=REPO, env=dict(os.environ), timeout=600, check=False,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}\n{cluster_env.logs()}"
    assert_ran_on_both_workers(cluster_env, "sessionlake-run")
    assert_same_tables(spark, lake, reference_lake)


def test_a_lake_the_executors_do_not_see_is_refused_before_a_batch(
    tmp_path: Path, clickstream: Path
) -> None:
    """A ``file://`` lake on the driver's disk alone: the executors' data files would land
    on theirs, and the lake would lose them once a batch committed (a walkthrough saw
    batch 0 commit, then every read fail). Refused, naming the executors, before any
    table is written; and so is a landing folder they cannot read."""
    if subprocess.run(["unshare", "--mount", "true"], check=False,
                      capture_output=True).returncode != 0:
        pytest.skip("needs unshare --mount (root) to hide a folder from a worker")
    hidden = tmp_path / "hidden"
    shutil.copytree(clickstream, hidden / "landing")
    cluster = start_cluster(tmp_path / "cluster", workers=1, hidden=hidden)

    def run(source: Path, lake: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sessionlake.cli", "run", "--source", str(source),
             "--lake", str(lake), "--master", cluster.master_url],
            capture_output=True, text=True, cwd=REPO, timeout=600, check=False,
            env={**os.environ, "SPARK_CONF_DIR": str(cluster.conf_dir),
                 "SESSIONLAKE_DRIVER_MEMORY": "1g"},
        )

    try:
        lake_hidden = run(clickstream, hidden / "lake")
        landing_hidden = run(hidden / "landing", tmp_path / "lake")
    finally:
        cluster.stop()
    for done, what, why in (
        (lake_hidden, f"lake {hidden / 'lake'}", "a file written there is not there for them"),
        (landing_hidden, f"landing folder {hidden / 'landing'}", "they read its files"),
    ):
        assert done.returncode == 2, f"{done.stdout}\n{done.stderr[-4000:]}"
        assert (f"sessionlake: error: the {what} is a folder of this machine that the "
                "executors (") in done.stderr
        assert f") do not see: {why}" in done.stderr
    assert list((hidden / "lake").iterdir()) == list((tmp_path / "lake").iterdir()) == []


def test_a_cluster_that_gives_no_executor_is_told_in_one_line(
    cluster_env: SparkCluster, clickstream: Path, tmp_path: Path
) -> None:
    """Executors that ask more memory than any worker offers: the application waits for
    ever, and Spark's warning is below the log level. Told after the wait, nothing
    written."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        (cluster_env.conf_dir / "spark-defaults.conf").read_text()
        + "spark.executor.memory 64g\n")
    lake = tmp_path / "lake"
    done = subprocess.run(
        [sys.executable, "-m", "sessionlake.cli", "run", "--source", str(clickstream),
         "--lake", str(lake), "--master", cluster_env.master_url],
        capture_output=True, text=True, cwd=REPO, timeout=600, check=False,
        env={**os.environ, "SPARK_CONF_DIR": str(conf), "SESSIONLAKE_EXECUTOR_WAIT": "15s"},
    )
    assert done.returncode == 2, f"{done.stdout}\n{done.stderr[-4000:]}"
    assert done.stderr.strip().splitlines()[-1] == (
        "sessionlake: error: the cluster did not run this command's first job in 15s (0 "
        "executor(s) registered): its workers lack the free cores or the memory an executor "
        "asks (spark.executor.memory, 1g unless set), or are busy; the master's page says "
        "which (SESSIONLAKE_EXECUTOR_WAIT sets the wait)")
    assert list(lake.iterdir()) == []


def _executor_pids(app_id: str) -> list[int]:
    """The executor JVMs of application ``app_id`` on this machine."""
    found = subprocess.run(["pgrep", "-f", f"CoarseGrainedExecutorBackend.*{app_id}"],
                           capture_output=True, text=True, check=False)
    return [int(pid) for pid in found.stdout.split()]


def test_a_continuous_run_replays_a_batch_whose_executor_was_lost(
    spark: SparkSession, cluster_env: SparkCluster, clickstream: Path, reference_lake: str,
    tmp_path: Path,
) -> None:
    """An executor killed while its batch holds rows there: the batch fails, the run says so
    in one ALERT and starts its query again, and the tables end as the local run's."""
    lake, paused, log = (tmp_path / "lake").as_uri(), tmp_path / "paused", tmp_path / "run.log"
    env = {**os.environ, "SESSIONLAKE_FAULT": "before_merge@0",
           "SESSIONLAKE_FAULT_PAUSE": str(paused)}
    with log.open("w") as out:
        run = subprocess.Popen(
            [sys.executable, "-m", "sessionlake.cli", "-v", "run", "--source", str(clickstream),
             "--lake", lake, "--master", cluster_env.master_url, "--shuffle-partitions", "2",
             "--trigger", "continuous", "--processing-interval", "1s"],
            stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env)
    try:
        deadline = time.monotonic() + 300
        while not paused.exists():  # batch 0 computed its rows and waits before its MERGE
            assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.5)
        [app] = [a["id"] for a in cluster_env.status()["activeapps"]
                 if a["name"] == "sessionlake-run"]
        executors = _executor_pids(app)
        assert len(executors) == 2, executors
        os.kill(executors[0], signal.SIGKILL)
        paused.unlink()
        while '"batch_id": 0' not in log.read_text():
            assert run.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.5)
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=120) == 0, log.read_text()[-4000:]
    finally:
        if run.poll() is None:
            run.kill()
    said = log.read_text()
    assert said.count("ALERT a batch failed: an executor holding rows it had kept was lost "
                      "(Checkpoint block rdd_") == 1, said[-4000:]
    assert_same_tables(spark, lake, reference_lake)


@pytest.fixture
def dag_on_cluster(cluster_env: SparkCluster, clickstream: Path,
                   monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """``spark_default`` pointed at the cluster; the DAG's lake, a ``file://`` URI."""
    lake = (clickstream.parent / "dag-lake").as_uri()
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT",
                       json.dumps({"conn_type": "spark", "host": cluster_env.master_url}))
    monkeypatch.setenv("SESSIONLAKE_LAKE", lake)
    monkeypatch.setenv("SESSIONLAKE_SOURCE", str(clickstream))
    monkeypatch.delenv("SESSIONLAKE_CHECKPOINT", raising=False)
    yield lake


@pytest.mark.usefixtures("airflow_home")
def test_microbatch_dag_on_the_cluster_gives_the_local_tables(
    spark: SparkSession, spark_cluster: SparkCluster, dag_on_cluster: str, reference_lake: str,
) -> None:
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(DAGS / "sessionlake_microbatch.py")).dags[
        "sessionlake_microbatch"]
    run: Any = dag.test(run_conf={"shuffle_partitions": 2})
    states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
    assert str(run.state) == "success", f"{states}\n{spark_cluster.logs()}"
    assert_ran_on_both_workers(spark_cluster, "sessionlake-microbatch")
    assert_same_tables(spark, dag_on_cluster, reference_lake)

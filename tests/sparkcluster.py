"""A real Spark standalone cluster on this machine: one master and two workers.

Started from the installed pyspark (``bin/spark-class`` runs the master and worker daemons
in the foreground) on 127.0.0.1 with free ports, each worker with its own work folder, one
core and a little memory, so that an application gets one executor per worker. The
project's interpreter is the workers' ``PYSPARK_PYTHON``, as on a real cluster where every
node has the same environment. Used by the ``spark_cluster`` fixture (tests/conftest.py).

Example::

    cluster = start_cluster(tmp_path / "cluster")
    try:
        ...  # sessionlake run --master cluster.master_url
    finally:
        cluster.stop()
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pyspark

from sessionlake.devkafka import free_port

SPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"

#: Spark settings of the applications the tests submit to the cluster (the spark-defaults.conf
#: of ``SparkCluster.conf_dir``): jobs wait until both executors have registered (so that
#: both workers run tasks), and executors stay small.
APP_CONF = {
    "spark.scheduler.minRegisteredResourcesRatio": "1.0",
    "spark.scheduler.maxRegisteredResourcesWaitingTime": "60s",
    "spark.executor.memory": "512m",
}


@dataclass
class SparkCluster:
    """A running standalone cluster and where to look at it."""

    master_url: str
    webui_url: str
    work_dirs: list[Path]
    conf_dir: Path
    log_dir: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _logs: list[TextIO] = field(default_factory=list)

    def status(self) -> dict[str, Any]:
        """The master's JSON status (``/json/``): workers, active and completed apps."""
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=10) as response:
            data: dict[str, Any] = json.load(response)
        return data

    def alive_workers(self) -> int:
        """How many workers the master sees ALIVE."""
        return sum(1 for w in self.status().get("workers", []) if w.get("state") == "ALIVE")

    def completed_app(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        """The newest finished application called ``name`` (waits until the master has it)."""
        deadline = time.monotonic() + timeout
        while True:
            apps = [a for a in self.status().get("completedapps", []) if a.get("name") == name]
            if apps:
                return max(apps, key=lambda a: a.get("starttime", 0))
            if time.monotonic() > deadline:
                raise TimeoutError(f"no finished application {name!r} on {self.master_url}: "
                                   f"{self.status().get('completedapps')}")
            time.sleep(0.5)

    def executor_dirs(self, app_id: str) -> dict[Path, list[Path]]:
        """Per worker work folder, the executor folders the application had there."""
        return {
            work: sorted(p for p in (work / app_id).glob("*") if p.is_dir())
            for work in self.work_dirs
        }

    def logs(self) -> str:
        """The tail of every daemon's log, for failure messages."""
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
                         for path in sorted(self.log_dir.glob("*.log")))

    def stop(self) -> None:
        """Stop the workers, then the master, and wait for them to exit."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        for log in self._logs:
            log.close()


def _daemon_env(python: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "SPARK_HOME": str(SPARK_HOME),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": python,
        # The daemons themselves need little: the executors get their own JVMs.
        "SPARK_DAEMON_MEMORY": "256m",
    })
    env.pop("SPARK_CONF_DIR", None)
    return env


def start_cluster(
    root: Path,
    *,
    workers: int = 2,
    cores: int = 1,
    memory: str = "1g",
    python: str | None = None,
    timeout: float = 120.0,
    hidden: Path | None = None,
) -> SparkCluster:
    """Start a master and ``workers`` workers under ``root``; wait until all are ALIVE.

    :param root: folder for the work folders (``worker-N``), logs and the apps' conf.
    :param cores: cores each worker offers; with one, an app gets one executor per worker.
    :param memory: memory each worker offers to executors.
    :param python: the executors' Python; default the interpreter running this code.
    :param hidden: a folder the workers (and so their executors) do not see: each runs in
        a mount namespace of its own with an empty file system mounted there, as a node
        without the driver's disk would (needs ``unshare``, as root).
    :raises RuntimeError: with the daemons' logs, when they are not all up in ``timeout``.
    """
    log_dir, conf_dir = root / "logs", root / "conf"
    log_dir.mkdir(parents=True, exist_ok=True)
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "spark-defaults.conf").write_text(
        "".join(f"{key} {value}\n" for key, value in APP_CONF.items()))

    port, webui_port = free_port(), free_port()
    cluster = SparkCluster(
        master_url=f"spark://127.0.0.1:{port}", webui_url=f"http://127.0.0.1:{webui_port}",
        work_dirs=[root / f"worker-{n}" for n in range(1, workers + 1)],
        conf_dir=conf_dir, log_dir=log_dir,
    )
    env = _daemon_env(python or sys.executable)
    commands = [("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                            "--port", str(port), "--webui-port", str(webui_port)])]
    for n, work in enumerate(cluster.work_dirs, start=1):
        work.mkdir(parents=True, exist_ok=True)
        commands.append((f"worker-{n}", [
            "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
            "--webui-port", str(free_port()), "--cores", str(cores), "--memory", memory,
            "--work-dir", str(work), cluster.master_url,
        ]))
    try:
        for name, args in commands:
            log = open(log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed by stop()
            cluster._logs.append(log)
            hide = [] if hidden is None or name == "master" else [
                "unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs none "$0" && exec "$@"', str(hidden)]
            cluster.processes.append(subprocess.Popen(
                [*hide, str(SPARK_CLASS), *args], stdout=log, stderr=subprocess.STDOUT,
                env=env, stdin=subprocess.DEVNULL, cwd=root,
            ))
        _wait_until_alive(cluster, workers, timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait_until_alive(cluster: SparkCluster, workers: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError):
            if cluster.alive_workers() >= workers:
                return
        exited = [p.args for p in cluster.processes if p.poll() is not None]
        if exited or time.monotonic() > deadline:
            why = f"exited: {exited}" if exited else f"not up after {timeout:.0f}s"
            raise RuntimeError(f"Spark standalone cluster {why}\n{cluster.logs()}")
        time.sleep(0.5)


"""docker/: what can be checked without a Docker engine.

The compose file parses and wires the deployment (Airflow 3's four services on PostgreSQL,
a Spark master and two workers, one lake volume, healthchecks); the images install the
project's own pins (requirements.lock, unchanged) and add only packages the lock does not
hold; the scheduler's entrypoint runs here, with stand-ins for the scheduler and the
continuous run; ``docker compose config`` validates the file where the compose plugin is
installed.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.fernet import Fernet

from sessionlake.checkpoint import CONTINUOUS_RUN
from sessionlake.orchestration import CHECKPOINT_POOL
from tests.conftest import REPO

DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
AIRFLOW_SERVICES = ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor",
                    "airflow-triggerer")
SPARK_SERVICES = ("spark-master", "spark-worker-1", "spark-worker-2")
LONG_RUNNING = ("postgres", *AIRFLOW_SERVICES, *SPARK_SERVICES)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def _services(compose: dict[str, Any]) -> dict[str, Any]:
    services: dict[str, Any] = compose["services"]
    return services


def _pins(path: Path) -> dict[str, str]:
    """``name -> version`` of a requirements file's ``name==version`` lines (names normalized)."""
    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9._-]+)(\[[^\]]*\])?==([^\s;]+)", line)
        assert match, f"{path.name}: {line!r} is not pinned as name==version"
        pins[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(3)
    return pins


def test_compose_has_the_deployment_and_every_long_running_service_a_healthcheck(
    compose: dict[str, Any],
) -> None:
    services = _services(compose)
    assert set(LONG_RUNNING) | {"airflow-init"} == set(services)
    for name in LONG_RUNNING:
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    commands = {name: " ".join(services[name]["command"]) for name in AIRFLOW_SERVICES}
    assert commands == {
        "airflow-api-server": "airflow api-server",
        "airflow-scheduler": "airflow scheduler",
        "airflow-dag-processor": "airflow dag-processor",
        "airflow-triggerer": "airflow triggerer",
    }
    assert "deploy.master.Master" in " ".join(services["spark-master"]["command"])
    for worker in ("spark-worker-1", "spark-worker-2"):
        assert services[worker]["command"][-1] == "spark://spark-master:7077"
        assert services[worker]["depends_on"]["spark-master"]["condition"] == "service_healthy"


def test_published_pages_listen_on_this_machine_only(compose: dict[str, Any]) -> None:
    """Airflow's simple auth manager and Spark's master page (no login) are not for other
    machines; the master's page may not kill applications."""
    published = {name: service.get("ports", []) for name, service in _services(compose).items()
                 if service.get("ports")}
    assert published == {"airflow-api-server": ["127.0.0.1:8080:8080"],
                         "spark-master": ["127.0.0.1:8081:8080"]}
    assert "-Dspark.ui.killEnabled=false" in (
        _services(compose)["spark-master"]["environment"]["SPARK_MASTER_OPTS"])


def test_airflow_runs_on_postgres_after_the_init_and_submits_to_the_cluster(
    compose: dict[str, Any],
) -> None:
    services = _services(compose)
    for name in AIRFLOW_SERVICES:
        service = services[name]
        env = service["environment"]
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith(
            "postgresql+psycopg2://")
        assert "@postgres:5432/" in env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        assert (service["depends_on"]["airflow-init"]["condition"]
                == "service_completed_successfully")
        assert json.loads(env["AIRFLOW_CONN_SPARK_DEFAULT"])["host"] == (
            "spark://spark-master:7077")
        assert service["build"]["target"] == "airflow"
    for name in SPARK_SERVICES:
        assert services[name]["build"]["target"] == "spark"
    init = " ".join(services["airflow-init"]["command"])
    assert "airflow db migrate" in init
    assert f"airflow pools set {CHECKPOINT_POOL} 1" in init


def test_the_scheduler_forks_as_few_workers_as_make_airflow_s(compose: dict[str, Any]) -> None:
    """The LocalExecutor forks ``parallelism`` workers at once beside the Spark drivers:
    Airflow's default of 32 is 7 GiB on a 2-core machine, for four tasks at most at once."""
    default = re.search(r"^AIRFLOW_PARALLELISM \?= (\d+)$", (REPO / "Makefile").read_text(),
                        re.MULTILINE)
    assert default, "no AIRFLOW_PARALLELISM default in the Makefile"
    env = _services(compose)["airflow-scheduler"]["environment"]
    assert env.get("AIRFLOW__CORE__PARALLELISM") == default.group(1) == "4"


def test_the_lake_is_one_volume_at_the_same_path_for_drivers_and_executors(
    compose: dict[str, Any],
) -> None:
    services = _services(compose)
    assert "lake" in compose["volumes"]
    # The scheduler runs the drivers (Delta log), the workers the executors (data files),
    # the api-server the health page: all must see /data as one folder.
    for name in ("airflow-scheduler", "airflow-api-server", "spark-worker-1", "spark-worker-2"):
        assert "lake:/data" in services[name]["volumes"], name
    env = services["airflow-scheduler"]["environment"]
    assert env["SESSIONLAKE_LAKE"].startswith("/data/")
    assert env["SESSIONLAKE_SOURCE"].startswith("/data/")


def test_the_images_install_requirements_lock_unchanged_and_only_add_packages() -> None:
    dockerfile = (DOCKER / "Dockerfile").read_text()
    installs = re.findall(r"pip install[^\n]*", dockerfile)
    assert any("-r requirements.lock" in line for line in installs), installs
    assert "COPY requirements.lock docker/requirements-deploy.txt" in dockerfile
    # Both targets build on the one base that installed them.
    assert re.search(r"^FROM base AS spark$", dockerfile, re.MULTILINE)
    assert re.search(r"^FROM base AS airflow$", dockerfile, re.MULTILINE)
    lock = _pins(REPO / "requirements.lock")
    extras = _pins(DOCKER / "requirements-deploy.txt")
    assert "psycopg2-binary" in extras
    assert not set(extras) & set(lock), "requirements-deploy.txt re-pins packages of the lock"
    for package in ("pyspark", "pyspark-client", "delta-spark", "apache-airflow",
                    "apache-airflow-providers-apache-spark"):
        assert package in lock


def _maven_goals(command: str) -> list[str]:
    """The goals of the ``mvn ... -f build/pom.xml`` in ``command`` (a Makefile recipe or a
    Dockerfile ``RUN``), or the pom's defaultGoal when it names none, as Maven runs them."""
    line = next(line for line in command.replace("\\\n", " ").splitlines() if "mvn " in line)
    words = shlex.split(re.sub(r"\$\([^)]*\)", "DIR", line))  # make's $(...) as one word
    mvn = words[words.index("mvn") + 1:]
    goals = [word for before, word in zip(["", *mvn], mvn, strict=False)
             if not word.startswith("-") and before != "-f"]
    if goals:
        return goals
    default = re.search(r"<defaultGoal>([^<]*)</defaultGoal>", (REPO / "build/pom.xml").read_text())
    return default.group(1).split() if default else []


def test_the_image_resolves_the_jars_make_jars_does() -> None:
    """Both the Delta jars and Spark's Kafka source: an image without the latter failed
    every ``--source kafka`` run at its jar check."""
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^jars/\.resolved:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert recipe, "no jars/.resolved target in the Makefile"
    dockerfile = (DOCKER / "Dockerfile").read_text()
    run = re.search(r"^RUN (mvn .*(?:\\\n.*)*)", dockerfile, re.MULTILINE)
    assert run, "no mvn RUN in the Dockerfile"
    assert "build/pom.xml" in recipe.group(1) and "/build/pom.xml" in run.group(1)
    goals = _maven_goals(recipe.group(1))
    assert {"dependency:copy-dependencies", "dependency:copy@kafka-jars"} <= set(goals)
    assert _maven_goals(run.group(1)) == goals


def test_the_build_context_leaves_local_state_out() -> None:
    ignored = set((REPO / ".dockerignore").read_text().split())
    assert {".git", ".venv", "jars", "demo", "docker/.env"} <= ignored


#: The keys every Airflow container must share, and the variable each comes from.
SHARED_KEYS = {
    "AIRFLOW__API_AUTH__JWT_SECRET": "SESSIONLAKE_JWT_SECRET",
    "AIRFLOW__API__SECRET_KEY": "SESSIONLAKE_API_SECRET_KEY",
    "AIRFLOW__CORE__FERNET_KEY": "SESSIONLAKE_FERNET_KEY",
}


@pytest.mark.parametrize(("setting", "variable"), SHARED_KEYS.items())
def test_airflow_s_containers_share_keys_of_the_deployment_not_of_the_file(
    compose: dict[str, Any], setting: str, variable: str,
) -> None:
    """Without them each container writes random keys to its own airflow.cfg: the
    scheduler's log server refuses the api-server's token (403), and what one container
    encrypts in the database another cannot read."""
    for name in (*AIRFLOW_SERVICES, "airflow-init"):
        value = _services(compose)[name]["environment"].get(setting)
        # Compose refuses to start without the variable: the file holds no default.
        assert value and re.fullmatch(rf"\$\{{{variable}:\?[^}}]+\}}", value), (name, value)


def test_only_the_api_server_sees_the_admin_s_password(compose: dict[str, Any]) -> None:
    """Airflow's simple auth manager reads its passwords file in the api-server alone (at
    its start and at each login); in the scheduler, any DAG task or Spark driver could read
    the admin's password from it."""
    services = _services(compose)
    setting = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"
    for name in (*AIRFLOW_SERVICES, "airflow-init"):
        mounts = [volume for volume in services[name]["volumes"]
                  if volume.startswith("airflow-passwords:")]
        if name == "airflow-api-server":
            assert len(mounts) == 1
            folder = mounts[0].split(":")[1]
            assert services[name]["environment"][setting].startswith(f"{folder}/")
        else:
            assert not mounts, name
            assert setting not in services[name]["environment"], name


def _make_env(path: Path) -> str:
    subprocess.run(["make", "-s", "-C", str(REPO), f"DOCKER_ENV={path}", str(path)],
                   check=True, capture_output=True, timeout=60)
    return path.read_text()


def test_the_metadata_database_s_password_is_the_deployment_s_not_the_file_s(
    compose: dict[str, Any],
) -> None:
    """The Spark workers share the compose network with Postgres: a password written in
    the public compose file would be everyone's (before 2026-12-06 it was `airflow`)."""
    services = _services(compose)
    variable = r"\$\{SESSIONLAKE_POSTGRES_PASSWORD:\?[^}]+\}"
    assert re.fullmatch(variable, services["postgres"]["environment"]["POSTGRES_PASSWORD"])
    for name in (*AIRFLOW_SERVICES, "airflow-init"):
        connection = services[name]["environment"]["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        assert re.fullmatch(rf"postgresql\+psycopg2://airflow:{variable}@postgres:5432/airflow",
                            connection), (name, connection)


def test_make_writes_random_keys_once_readable_by_their_owner_only(tmp_path: Path) -> None:
    first = _make_env(tmp_path / "a.env")
    keys = dict(line.split("=", 1) for line in first.splitlines())
    assert set(keys) == {*SHARED_KEYS.values(), "SESSIONLAKE_POSTGRES_PASSWORD"}
    assert re.fullmatch(r"[0-9a-f]{64}", keys["SESSIONLAKE_POSTGRES_PASSWORD"])
    assert re.fullmatch(r"[0-9a-f]{128}", keys["SESSIONLAKE_JWT_SECRET"])
    assert re.fullmatch(r"[0-9a-f]{128}", keys["SESSIONLAKE_API_SECRET_KEY"])
    assert keys["SESSIONLAKE_API_SECRET_KEY"] != keys["SESSIONLAKE_JWT_SECRET"]
    # A Fernet key, as Fernet.generate_key() makes: urlsafe base64 of 32 random bytes.
    assert len(base64.urlsafe_b64decode(keys["SESSIONLAKE_FERNET_KEY"])) == 32
    Fernet(keys["SESSIONLAKE_FERNET_KEY"])
    assert (tmp_path / "a.env").stat().st_mode & 0o777 == 0o600
    assert _make_env(tmp_path / "a.env") == first  # kept: running services keep working
    assert _make_env(tmp_path / "b.env") != first


def test_make_adds_the_keys_a_file_of_an_older_makefile_lacks(tmp_path: Path) -> None:
    """A docker/.env from before holds only the JWT secret: kept, the others added."""
    path = tmp_path / ".env"
    path.write_text(f"SESSIONLAKE_JWT_SECRET={'ab' * 64}\n")
    path.chmod(0o644)
    keys = dict(line.split("=", 1) for line in _make_env(path).splitlines())
    assert set(keys) == {*SHARED_KEYS.values(), "SESSIONLAKE_POSTGRES_PASSWORD"}
    assert keys["SESSIONLAKE_JWT_SECRET"] == "ab" * 64
    # Its Postgres volume was made with the password the compose file then fixed.
    assert keys["SESSIONLAKE_POSTGRES_PASSWORD"] == "airflow"
    assert path.stat().st_mode & 0o777 == 0o600


def test_stopping_the_scheduler_s_container_lets_the_continuous_run_commit(
    compose: dict[str, Any],
) -> None:
    """The restart DAG's continuous run lives in the scheduler's container, in a session
    of its own that tini's SIGTERM does not reach; Docker's default 10 s before SIGKILL
    is short for a micro-batch to commit."""
    scheduler = _services(compose)["airflow-scheduler"]
    grace = re.fullmatch(r"(\d+)m", str(scheduler.get("stop_grace_period", "")))
    assert grace and 2 <= int(grace.group(1)) <= 5, scheduler.get("stop_grace_period")
    assert scheduler["environment"]["SESSIONLAKE_STOP_CONTINUOUS_RUN_AT_EXIT"] == "true"
    assert 'ENTRYPOINT ["tini", "--", "sessionlake-entrypoint"]' in (
        DOCKER / "Dockerfile").read_text()


#: A stand-in for the restart DAG's continuous run: it holds the checkpoint's lock and, at
#: SIGTERM, takes a second to "commit its batch" before it exits.
FAKE_CONTINUOUS_RUN = """
import pathlib, signal, sys, time
from sessionlake.locks import checkpoint_lock
checkpoint, ready, committed = sys.argv[1:]
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
with checkpoint_lock(checkpoint):
    pathlib.Path(ready).touch()
    while not stop:
        time.sleep(0.05)
    time.sleep(1)
    pathlib.Path(committed).touch()
"""


def _wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path.name} after {timeout:.0f}s"
        time.sleep(0.05)


@pytest.mark.parametrize("restart_dag_s", [True, False])
def test_the_scheduler_s_entrypoint_stops_the_continuous_run_before_it_exits(
    tmp_path: Path, restart_dag_s: bool,
) -> None:
    """Only the run the restart DAG noted is stopped: another holder's pid may be one of
    another container, which names another process here."""
    checkpoint = tmp_path / "lake" / "_checkpoints" / "stream"
    checkpoint.mkdir(parents=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPARK_LOCAL_IP": "127.0.0.1",
           "SESSIONLAKE_PYTHON": sys.executable, "SESSIONLAKE_LAKE": str(tmp_path / "lake"),
           "SESSIONLAKE_SOURCE": str(tmp_path / "landing"),
           "SESSIONLAKE_STOP_CONTINUOUS_RUN_AT_EXIT": "true"}
    env.pop("SESSIONLAKE_CHECKPOINT", None)
    run = subprocess.Popen(
        [sys.executable, "-c", FAKE_CONTINUOUS_RUN, str(checkpoint), str(tmp_path / "ready"),
         str(tmp_path / "committed")], env=env, start_new_session=True)
    try:
        _wait_for(tmp_path / "ready")
        if restart_dag_s:  # as start_continuous_run notes it
            (checkpoint / CONTINUOUS_RUN).write_text(json.dumps({"pid": run.pid, "args": []}))
        scheduler = subprocess.Popen(
            ["sh", str(DOCKER / "entrypoint.sh"), "sh", "-c",
             f"touch {tmp_path / 'started'} && exec sleep 600"], env=env)
        _wait_for(tmp_path / "started")
        time.sleep(0.5)  # the entrypoint's trap is set just after it started the command
        scheduler.send_signal(signal.SIGTERM)  # as tini passes on docker stop's
        status = scheduler.wait(timeout=60)
        if restart_dag_s:  # it committed before the entrypoint exited
            assert (tmp_path / "committed").exists()
            assert run.wait(timeout=10) == 0
        else:
            assert run.poll() is None
        assert status == 128 + signal.SIGTERM  # the command's: it got the SIGTERM
    finally:
        run.kill()
        run.wait()


def test_make_targets_start_and_stop_the_deployment() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"^docker-up:", makefile, re.MULTILINE)
    assert re.search(r"^docker-down:", makefile, re.MULTILINE)
    assert "docker compose -f docker/compose.yaml" in makefile
    assert f"airflow pools set {CHECKPOINT_POOL} 1" in makefile


def _compose_plugin() -> bool:
    if shutil.which("docker") is None:
        return False
    done = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    return done.returncode == 0


@pytest.mark.skipif(not _compose_plugin(),
                    reason="the docker compose plugin is not installed here")
def test_docker_compose_config_accepts_the_file() -> None:
    done = subprocess.run(["docker", "compose", "-f", str(COMPOSE), "config", "--quiet"],
                          capture_output=True, text=True, check=False, timeout=60)
    assert done.returncode == 0, done.stderr

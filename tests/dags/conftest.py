"""Airflow for the DAG tests: a throwaway AIRFLOW_HOME with a migrated SQLite database.

Airflow reads its configuration when it is first imported, so the environment is set here,
before any test module of this folder imports it (they import airflow inside functions or
after this file has run).
"""

from __future__ import annotations

import atexit
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS = REPO / "dags"
BIN = REPO / ".venv" / "bin"

_HOME = Path(tempfile.mkdtemp(prefix="sessionlake-airflow-"))
# Removed when the test process ends: each process of each run made one, and none was removed.
atexit.register(shutil.rmtree, _HOME, ignore_errors=True)
AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    # Airflow signs its API tokens with HS512: a key of 64 bytes or more, as RFC 7518 asks
    # (the one it generates itself is 16 bytes, and PyJWT warns at every token).
    "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_urlsafe(64),
    "AIRFLOW_CONN_SPARK_DEFAULT": '{"conn_type": "spark", "host": "local[2]"}',
    # Submitted drivers beside the test process: keep them small.
    "SESSIONLAKE_DRIVER_MEMORY": "1g",
    "SPARK_LOCAL_IP": "127.0.0.1",
    # The Spark provider runs `spark-submit` from PATH.
    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
}
os.environ.update(AIRFLOW_ENV)


@pytest.fixture(scope="session")
def airflow_home() -> Iterator[Path]:
    """AIRFLOW_HOME with its metadata database migrated once (`airflow db migrate`)."""
    os.environ.update(AIRFLOW_ENV)
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], check=True, capture_output=True,
                   env={**os.environ, **AIRFLOW_ENV}, timeout=300)
    yield _HOME


@pytest.fixture
def locations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """A fresh lake and landing folder, given to the DAGs through SESSIONLAKE_*."""
    paths = {"lake": tmp_path / "lake", "source": tmp_path / "landing"}
    paths["source"].mkdir()
    monkeypatch.setenv("SESSIONLAKE_LAKE", str(paths["lake"]))
    monkeypatch.setenv("SESSIONLAKE_SOURCE", str(paths["source"]))
    monkeypatch.delenv("SESSIONLAKE_CHECKPOINT", raising=False)
    return paths

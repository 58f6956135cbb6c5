"""The Makefile's `make airflow`: what its local standalone Airflow is started with.

The standalone itself (a scheduler, an API server, a browser's login) is not started
here; the DAGs' own tests run them through ``dag.test()``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

AIRFLOW = Path(sys.executable).with_name("airflow")


def _make(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    done = subprocess.run(["make", "-s", "-C", str(REPO), *args], env=env, cwd=cwd,
                          check=True, capture_output=True, text=True, timeout=60)
    return done.stdout


def _airflow_env(secret: Path | None, *overrides: str, env: dict[str, str] | None = None,
                 cwd: Path | None = None) -> dict[str, str]:
    """The variables `make airflow` starts Airflow with, as the recipe's shell reads them."""
    line = _make(*([f"AIRFLOW_JWT_SECRET={secret}"] if secret else []), *overrides,
                 "--eval=airflow-env: ; @printf '%s\\n' '$(AIRFLOW_ENV)'", "airflow-env",
                 env=env, cwd=cwd)
    return dict(word.split("=", 1) for word in shlex.split(line))


def test_make_airflow_s_home_is_the_repository_s_unless_given_on_the_make_line(
        tmp_path: Path) -> None:
    """An AIRFLOW_HOME in the environment is likely another Airflow's, whose database
    `airflow db migrate` would change: only one given to make itself moves the home, the
    JWT key and the password file with it. Run from another folder, the DAGs are still
    the repository's."""
    elsewhere = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "someone-elses"),
                 "PWD": str(tmp_path)}  # as a shell in that folder has it
    started = _airflow_env(None, env=elsewhere, cwd=tmp_path)
    assert started["AIRFLOW_HOME"] == str(REPO / "airflow_home")
    assert started["AIRFLOW__CORE__DAGS_FOLDER"] == str(REPO / "dags")
    assert started["AIRFLOW__API_AUTH__JWT_SECRET_CMD"] == f"cat {REPO}/airflow_home/jwt_secret"

    mine = tmp_path / "mine"
    started = _airflow_env(None, f"AIRFLOW_HOME={mine}", env=elsewhere)
    assert started["AIRFLOW_HOME"] == str(mine)
    assert started["AIRFLOW__API_AUTH__JWT_SECRET_CMD"] == f"cat {mine}/jwt_secret"
    assert _make(f"AIRFLOW_HOME={mine}", "--eval=p: ; @echo $(AIRFLOW_PASSWORDS)", "p",
                 env=elsewhere).strip() == f"{mine}/simple_auth_manager_passwords.json.generated"


def test_make_airflow_signs_tokens_with_a_random_64_byte_key_kept_from_run_to_run(
        tmp_path: Path) -> None:
    secret = tmp_path / "home" / "jwt_secret"
    _make(f"AIRFLOW_JWT_SECRET={secret}", str(secret))
    key = secret.read_text()
    assert re.fullmatch(r"[0-9a-f]{128}\n", key)
    assert secret.stat().st_mode & 0o777 == 0o600
    _make(f"AIRFLOW_JWT_SECRET={secret}", str(secret))
    assert secret.read_text() == key  # kept: tokens already issued stay valid

    other = tmp_path / "other" / "jwt_secret"
    _make(f"AIRFLOW_JWT_SECRET={other}", str(other))
    assert other.read_text() != key

    # Airflow reads it through the command, over the 16-byte key its airflow.cfg holds.
    home = tmp_path / "airflow_home"
    home.mkdir()
    (home / "airflow.cfg").write_text("[api_auth]\njwt_secret = c2l4dGVlbiBieXRlcyE=\n")
    env = {name: value for name, value in os.environ.items() if not name.startswith("AIRFLOW")}
    env |= {**_airflow_env(secret), "AIRFLOW_HOME": str(home)}
    done = subprocess.run([str(AIRFLOW), "config", "get-value", "api_auth", "jwt_secret"],
                          env=env, check=True, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == key.strip()


def test_make_airflow_listens_on_this_machine_only_with_a_few_workers(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if not name.startswith("AIRFLOW")}
    env |= {**_airflow_env(tmp_path / "jwt_secret"), "AIRFLOW_HOME": str(tmp_path)}
    done = subprocess.run([str(AIRFLOW), "config", "get-value", "api", "host"], env=env,
                          check=True, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "127.0.0.1"
    assert _airflow_env(tmp_path / "jwt_secret")["AIRFLOW__CORE__PARALLELISM"] == "4"


def test_make_airflow_on_another_port_sends_the_tasks_there_too(tmp_path: Path) -> None:
    """On another port, the tasks must reach the API's execution endpoints there too: a
    walkthrough on port 18280 saw every task fail to connect to 8080 until it was set."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("AIRFLOW")}
    env |= {**_airflow_env(tmp_path / "jwt_secret", "AIRFLOW_PORT=18280"),
            "AIRFLOW_HOME": str(tmp_path)}
    for section, key, value in (("api", "port", "18280"), (
            "core", "execution_api_server_url", "http://127.0.0.1:18280/execution/")):
        done = subprocess.run([str(AIRFLOW), "config", "get-value", section, key], env=env,
                              check=True, capture_output=True, text=True, timeout=120)
        assert done.stdout.strip() == value


def test_make_airflow_keeps_the_generated_admin_password_from_other_users(
        tmp_path: Path) -> None:
    passwords = tmp_path / "simple_auth_manager_passwords.json.generated"
    _make(f"AIRFLOW_PASSWORDS={passwords}", "airflow-passwords")
    # Airflow's own simple auth manager then generates the admin's password into it.
    env = {name: value for name, value in os.environ.items() if not name.startswith("AIRFLOW")}
    env |= {"AIRFLOW_HOME": str(tmp_path)}
    subprocess.run(
        [sys.executable, "-c", "from airflow.api_fastapi.auth.managers.simple."
         "simple_auth_manager import SimpleAuthManager; SimpleAuthManager().init()"],
        env=env, check=True, capture_output=True, text=True, timeout=120)
    assert passwords.stat().st_mode & 0o777 == 0o600
    assert set(json.loads(passwords.read_text())) == {"admin"}
    passwords.chmod(0o644)  # a file from before: made private at the next `make airflow`
    _make(f"AIRFLOW_PASSWORDS={passwords}", "airflow-passwords")
    assert passwords.stat().st_mode & 0o777 == 0o600
    assert set(json.loads(passwords.read_text())) == {"admin"}

"""`sessionlake serve`: a real Spark Connect round trip from a thin client process."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sessionlake.cli import main
from sessionlake.config import settings_from
from tests.conftest import REPO
from tests.helpers import event, run_batches

CLIENT = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
sessions = spark.sql("SELECT user_id, event_count FROM sessions ORDER BY user_id").collect()
bounces = spark.table("bounce_rate").collect()
print(json.dumps({"sessions": [list(r) for r in sessions],
                  "bounces": [r["bounces"] for r in bounces]}))
"""


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_spark_connect_client_queries_the_lake(
    spark: SparkSession, lake: str, tmp_path: Path
) -> None:
    settings = settings_from({"lake": lake}, env={})
    run_batches(spark, settings, [[
        event("u1", "10:00", "/"), event("u1", "10:05", "/a"), event("u2", "10:00", "/"),
        event("u3", "12:00", "/"),  # moves the watermark past u1's and u2's sessions
    ]])
    port = _free_port()
    token_file = tmp_path / "private" / "token"
    env = {k: v for k, v in os.environ.items() if k != "SESSIONLAKE_CONNECT_TOKEN"}
    env["SESSIONLAKE_DRIVER_MEMORY"] = "1g"
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "sessionlake"), "serve", "--lake", lake,
         "--port", str(port), "--master", "local[1]", "--token-file", str(token_file)],
        stdout=subprocess.PIPE, stderr=log, text=True, env=env, cwd=REPO,
        start_new_session=True,
    )
    try:
        assert server.stdout is not None
        # Printed once the tables are registered; a server that neither prints nor exits
        # fails the test instead of holding it.
        ready, _, _ = select.select([server.stdout], [], [], 300)
        assert ready, (tmp_path / "serve.log").read_text()[-2000:]
        banner = server.stdout.readline()
        assert f"sc://localhost:{port}/;token=<the text of {token_file}>" in banner, \
            (tmp_path / "serve.log").read_text()[-2000:]
        # A client runs SQL and Python as the server's account: only the token's holder.
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert token_file.parent.stat().st_mode & 0o777 == 0o700
        token = token_file.read_text()
        deadline = time.monotonic() + 120
        while True:
            client = subprocess.run(
                [sys.executable, "-c", CLIENT, f"sc://localhost:{port}/;token={token}"],
                capture_output=True, text=True, timeout=180)
            if client.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert client.returncode == 0, client.stderr[-2000:]
        answer = json.loads(client.stdout.strip().splitlines()[-1])
        assert answer == {"sessions": [["u1", 2], ["u2", 1]], "bounces": [1]}
        for url in (f"sc://127.0.0.1:{port}", f"sc://localhost:{port}/;token=wrong"):
            refused = subprocess.run([sys.executable, "-c", CLIENT, url],
                                     capture_output=True, text=True, timeout=180)
            assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr, \
                (url, refused.stdout[-1000:], refused.stderr[-2000:])
    finally:
        # To the whole process group, as systemd stops a service: the JVM gets it too.
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
    said = (tmp_path / "serve.log").read_text()
    assert server.returncode == 0 and "Traceback" not in said, said[-3000:]
    assert not token_file.exists(), "a stopped server's token is not left behind"


def test_serve_refuses_a_lake_without_tables(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "sessionlake"), "serve", "--lake",
         str(tmp_path / "nothing"), "--port", str(_free_port()), "--master", "local[1]",
         "--token-file", str(tmp_path / "token")],
        capture_output=True, text=True, timeout=180,
        env={**os.environ, "SESSIONLAKE_DRIVER_MEMORY": "1g"},
    )
    assert done.returncode == 2
    assert "no sessionlake tables" in done.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "token").exists()


@pytest.mark.parametrize("port", ["0", "http"])
def test_serve_rejects_a_bad_port(port: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "sessionlake"), "serve", "--lake", str(tmp_path),
         "--port", port], capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2 and "--port" in done.stderr


@pytest.mark.parametrize("where", ["in use", "not of this machine"])
def test_an_address_serve_cannot_listen_on_is_refused_before_spark(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Spark failed in about a hundred lines of Java whose last did not say why (a review)."""
    def no_spark(*_: object, **__: object) -> None:
        raise AssertionError("Spark was started for an address it cannot listen on")

    monkeypatch.setattr("sessionlake.serve.build_spark", no_spark)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        host, port = ("127.0.0.1", taken.getsockname()[1]) if where == "in use" \
            else ("999.1.1.1", _free_port())
        status = main(["serve", "--lake", str(tmp_path), "--host", host, "--port", str(port),
                       "--token-file", str(tmp_path / "token")])
    err = capsys.readouterr().err
    assert status == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"sessionlake: error: cannot listen on {host}:{port} (")
    assert not (tmp_path / "token").exists()

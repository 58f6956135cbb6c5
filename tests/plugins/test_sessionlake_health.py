"""The health plugin in a real Airflow API server app: JSON, auth, and the page in Chromium.

The app is Airflow's own (``create_app("core")``), which finds ``plugins/`` and mounts the
plugin at ``/sessionlake``; tokens are minted by its auth manager. The lake is written once
by a real stream run (``observed_lake``), and every expected value is read back from it
with Spark.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sessionlake.checkpoint import RESTORING_MARKER
from tests.conftest import REPO, ObservedLake
from tests.helpers import held_by_another_process

pytestmark = pytest.mark.usefixtures("airflow_home")

ARTIFACTS = REPO / "artifacts"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@pytest.fixture(scope="module")
def airflow_app(observed_lake: ObservedLake) -> Iterator[FastAPI]:
    """Airflow's API server app, with SESSIONLAKE_LAKE pointing at the observed lake."""
    from airflow.api_fastapi.app import create_app, purge_cached_app

    with pytest.MonkeyPatch.context() as env:
        env.setenv("SESSIONLAKE_LAKE", observed_lake.settings.lake)
        env.setenv("SESSIONLAKE_SOURCE", observed_lake.settings.source or "")
        env.delenv("SESSIONLAKE_CHECKPOINT", raising=False)
        yield create_app("core")
    purge_cached_app()


@pytest.fixture(scope="module")
def client(airflow_app: FastAPI) -> TestClient:
    return TestClient(airflow_app)


def _token(role: str | None) -> str:
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    return get_auth_manager().generate_jwt(SimpleAuthManagerUser(username="ada", role=role))


@pytest.fixture(scope="module")
def token(airflow_app: FastAPI) -> str:
    """A real JWT of a viewer, minted by the app's auth manager."""
    return _token("VIEWER")


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _expected(spark: SparkSession, lake: str) -> dict[str, Any]:
    """What the lake holds, read with Spark."""
    def table(name: str) -> Any:
        return spark.read.format("delta").load(f"{lake}/{name}")

    metrics = table("batch_metrics")
    last = metrics.orderBy(F.col("finished_at").desc(), F.col("batch_id").desc()).head()
    totals = metrics.agg(*(F.sum(c).alias(c) for c in (
        "input_records", "accepted", "late", "quarantined", "duplicates"))).head()
    return {
        "open_sessions": table("open_sessions").count(),
        "closed_sessions": table("sessions").count(),
        "last": last,
        "totals": totals.asDict(),
        "rows": {name: table(name).count() for name in (
            "events", "open_sessions", "sessions", "session_changelog", "late_events",
            "quarantine", "batch_metrics", "retention_audit")},
        "batches": metrics.count(),
    }


def test_health_json_holds_what_the_lake_holds(
    client: TestClient, token: str, spark: SparkSession, observed_lake: ObservedLake
) -> None:
    response = client.get("/sessionlake/api/health", headers=_bearer(token))
    assert response.status_code == 200, response.text
    health = response.json()
    expected = _expected(spark, observed_lake.settings.lake)
    last = expected["last"]
    # The scenario of OBSERVED_FILES: u1, u2, u3 closed, u6 open, after three batches.
    assert (health["open_sessions"], health["closed_sessions"]) == (1, 3)
    assert health["open_sessions"] == expected["open_sessions"]
    assert health["closed_sessions"] == expected["closed_sessions"]
    assert health["last_batch_id"] == last["batch_id"] == 2
    assert health["watermark"] == last["watermark_after"].replace(tzinfo=UTC).isoformat()
    assert health["watermark"] == "2026-01-05T13:00:00+00:00"
    lag = (last["finished_at"] - last["max_event_time"]).total_seconds()
    assert health["lag_seconds"] == pytest.approx(lag, abs=0.001)
    assert health["totals"] == expected["totals"]
    assert health["batch_count"] == expected["batches"] == 3
    assert {t["name"]: t["rows"] for t in health["tables"]} == expected["rows"]
    assert [s["snapshot_id"] for s in health["snapshots"]] == [observed_lake.snapshot_id]
    assert health["snapshots"][0]["name"] == "nightly"
    # The three landing files were read: nothing waits, and all three are still there.
    assert health["source"] == observed_lake.settings.source
    log = Path(observed_lake.settings.checkpoint) / "spark" / "sources" / "0"
    assert health["input_waiting"] == {
        "files": 0, "bytes": 0, "read_left": 3, "archive_due": False,
        "log_bytes": sum(entry.stat().st_size for entry in log.glob("[0-9]*"))}
    assert health["problems"] == []
    assert health["status"] == "ok"


def test_the_status_is_503_with_its_problems_while_the_lake_is_unhealthy(
    client: TestClient, token: str, observed_lake: ObservedLake
) -> None:
    """What a probe pages on: 200 while all is well, 503 and the problems otherwise."""
    response = client.get("/sessionlake/api/health/status", headers=_bearer(token))
    assert (response.status_code, response.json()) == (200, {"status": "ok", "problems": []})
    marker = Path(observed_lake.settings.checkpoint) / RESTORING_MARKER
    marker.write_text(json.dumps({"snapshot_id": observed_lake.snapshot_id}))
    try:
        response = client.get("/sessionlake/api/health/status", headers=_bearer(token))
    finally:
        marker.unlink()
    assert response.status_code == 503
    assert response.json()["status"] == "unhealthy"
    assert response.json()["problems"] == [
        f"a restore to snapshot {observed_lake.snapshot_id} was cut off half-way: no run "
        f"starts until `sessionlake restore --snapshot {observed_lake.snapshot_id}` is run "
        "again"]


@pytest.mark.parametrize("path", ["/sessionlake/", "/sessionlake/api/health",
                                  "/sessionlake/api/health/status"])
def test_callers_without_a_valid_token_are_refused(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 401
    assert client.get(path, headers=_bearer("not-a-jwt")).status_code == 403
    forged = _token("ADMIN")[:-4] + "AAAA"
    assert client.get(path, headers=_bearer(forged)).status_code == 403
    # A real user whom the auth manager gives no role may not use the UI.
    assert client.get(path, headers=_bearer(_token(None))).status_code == 403


@pytest.mark.parametrize("path", ["/sessionlake/", "/sessionlake/api/health",
                                  "/sessionlake/api/health/status"])
def test_a_user_who_may_not_read_the_pipeline_dag_is_refused(
    client: TestClient, token: str, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The page shows the lake's paths, pids, snapshots and retention runs: the UI's
    WEBSITE view alone is not enough, the user must be allowed to read the micro-batch
    DAG. The simple auth manager gives every viewer every DAG, so its answer is replaced
    by a policy's that names the DAG asked for."""
    from airflow.api_fastapi.app import get_auth_manager

    manager = get_auth_manager()
    asked: list[tuple[str, str | None]] = []
    readable: set[str] = set()

    def policy(*, method: str, user: Any, access_entity: Any = None,
               details: Any = None) -> bool:
        asked.append((method, details.id if details else None))
        return details is not None and details.id in readable

    monkeypatch.setattr(manager, "is_authorized_dag", policy)
    assert client.get(path, headers=_bearer(token)).status_code == 403
    readable.add("sessionlake_microbatch")
    assert client.get(path, headers=_bearer(token)).status_code == 200
    assert asked == [("GET", "sessionlake_microbatch")] * 2


def test_the_ui_cookie_opens_the_page(client: TestClient, token: str) -> None:
    response = TestClient(client.app, cookies={"_token": token}).get("/sessionlake/")
    assert response.status_code == 200
    assert "sessionlake pipeline health" in response.text


def test_the_plugin_adds_a_nav_entry(client: TestClient, token: str) -> None:
    plugins = client.get("/api/v2/plugins", headers=_bearer(token)).json()["plugins"]
    ours = next(p for p in plugins if p["name"] == "sessionlake")
    assert ours["fastapi_apps"][0]["url_prefix"] == "/sessionlake"
    view = ours["external_views"][0]
    assert (view["href"], view["destination"]) == ("/sessionlake/", "nav")


def test_the_health_module_starts_no_jvm() -> None:
    import subprocess
    import sys

    code = ("import sys, sessionlake.health, sessionlake.health_app; "
            "sys.exit('pyspark' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr or "sessionlake.health imported pyspark"


# --- the page in a real browser ----------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server(airflow_app: FastAPI) -> Iterator[str]:
    """The app served by uvicorn on a loopback port, for the browser."""
    import uvicorn

    port = _free_port()
    config = uvicorn.Config(airflow_app, host="127.0.0.1", port=port, log_level="warning",
                            lifespan="off")
    served = uvicorn.Server(config)
    thread = threading.Thread(target=served.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not served.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    served.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium through chromedriver (Debian's packages; `make browser`)."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.fail("Chromium is not installed: run `make browser` (Debian's chromium and "
                    "chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="sessionlake-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,2200",
                 f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


def _text(driver: Any, css: str) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.CSS_SELECTOR, css).text)


def test_the_page_in_chromium(
    browser: Any, server: str, token: str, observed_lake: ObservedLake
) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.wait import WebDriverWait

    browser.get(f"{server}/sessionlake/")
    assert "Not authenticated" in browser.find_element(By.TAG_NAME, "body").text
    browser.add_cookie({"name": "_token", "value": token, "path": "/"})
    browser.get(f"{server}/sessionlake/")
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "health_page.png"))

    assert browser.title == "sessionlake pipeline health"
    assert _text(browser, "#last-batch .value") == "#2"
    assert _text(browser, "#open-sessions .value") == "1"
    assert _text(browser, "#closed-sessions .value") == "3"
    assert _text(browser, "#watermark .value") == "2026-01-05 13:00:00 UTC"
    assert _text(browser, "#stream .value") == "not running"
    assert _text(browser, "#input-waiting .value") == "0 files, 0 B"
    assert _text(browser, "#archive-due").startswith("3 files the stream has read")
    # Totals: 13 records, 3 late, 1 quarantined, 1 duplicate over three batches.
    totals = _text(browser, "#totals tbody tr").split()
    assert totals == ["3", "13", "8", "3", "1", "1"]
    recent = [row.text.split()[0] for row in
              browser.find_elements(By.CSS_SELECTOR, "#batches tbody tr")]
    assert recent == ["2", "1", "0"]
    tables = {row.text.split()[0]: row.text.split() for row in
              browser.find_elements(By.CSS_SELECTOR, "#tables tbody tr")}
    assert set(tables) >= {"events", "open_sessions", "sessions", "batch_metrics"}
    assert observed_lake.snapshot_id in _text(browser, "#snapshots")
    assert "No retention run yet" in _text(browser, "#retention")
    charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
    assert len(charts) == 3

    duration = charts[0].find_element(By.CSS_SELECTOR, "polyline.series")
    assert len(duration.get_attribute("points").split()) == 3
    assert charts[0].size["width"] > 300 and charts[0].size["height"] > 100
    link = browser.find_element(By.LINK_TEXT, "/sessionlake/api/health")
    assert link.get_attribute("href") == f"{server}/sessionlake/api/health"

    # A stream writing the lake (a process holding its locks) is named on the next load.
    settings = observed_lake.settings
    with held_by_another_process("stream_locks", settings.lake, settings.checkpoint) as run:
        browser.refresh()
        running = f"running (pid {run.pid}, checkpoint {settings.checkpoint})"
        WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException]).until(
            lambda page: _text(page, "#stream .value") == running)


def test_the_nav_entry_shows_the_page_in_the_airflow_ui(
    browser: Any, server: str, token: str
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{server}/api/v2/version")
    browser.add_cookie({"name": "_token", "value": token, "path": "/"})
    browser.get(f"{server}/plugin/sessionlake-health")
    wait = WebDriverWait(browser, 60)
    wait.until(ready.frame_to_be_available_and_switch_to_it((By.TAG_NAME, "iframe")))
    heading = wait.until(ready.presence_of_element_located((By.TAG_NAME, "h1")))
    assert heading.text == "sessionlake pipeline health"
    assert _text(browser, "#open-sessions .value") == "1"
    browser.switch_to.default_content()
    assert "Pipeline health" in browser.page_source  # the nav entry
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "health_in_airflow_ui.png"))

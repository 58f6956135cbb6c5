"""Whole DAG runs with `dag.test()`: real spark-submit jobs on a temporary lake.

Each spark-submit costs a JVM start (about 20 s here), so the micro-batch DAG runs once and
the maintenance DAGs reuse its lake.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, cast

import pandas as pd
import pytest
from pyspark.sql import SparkSession

from sessionlake import orchestration as orch
from sessionlake.checkpoint import CONTINUOUS_RUN
from sessionlake.config import settings_from
from sessionlake.erasure import user_hash
from sessionlake.snapshots import create_snapshot, list_snapshots
from tests.dags.conftest import BIN, DAGS
from tests.helpers import held_by_another_process

pytestmark = pytest.mark.usefixtures("airflow_home")


def _event(user: str, at: str, event_id: str) -> str:
    return json.dumps({"user_id": user, "event_time": f"2026-01-05T{at}Z", "event_id": event_id})


#: u1: one session of three events; u2: one event; u3 at 12:00 moves the watermark past
#: both sessions' end + gap, so they close into `sessions`.
EVENTS = [_event("u1", "10:00:00", "a"), _event("u1", "10:10:00", "b"),
          _event("u2", "10:05:00", "c"), _event("u1", "10:20:00", "d"),
          _event("u3", "12:00:00", "e")]


def read_delta(table: Path) -> pd.DataFrame:
    """A small Delta table read from its log without Spark: live files = adds - removes."""
    live: dict[str, None] = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live[action["add"]["path"]] = None
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    frames = [pd.read_parquet(table / path) for path in live]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def run_dag(dag_id: str, conf: dict[str, Any] | None = None) -> Any:
    """`dag.test()` of one DAG; returns its DagRun."""
    from airflow.dag_processing.dagbag import DagBag

    dag = DagBag(dag_folder=str(DAGS / f"{dag_id}.py")).dags[dag_id]
    return dag.test(run_conf=conf or {})


def _task_states(run: Any) -> dict[str, str]:
    return {ti.task_id: str(ti.state) for ti in run.get_task_instances()}


def _cli_has(command: str) -> bool:
    done = subprocess.run([str(BIN / "sessionlake"), command, "--help"], capture_output=True)
    return done.returncode == 0


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A lake filled by one `sessionlake_microbatch` run over EVENTS."""
    root = tmp_path_factory.mktemp("microbatch")
    landing = root / "landing"
    landing.mkdir()
    (landing / "part-0001.jsonl").write_text("\n".join(EVENTS) + "\n")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SESSIONLAKE_LAKE", str(root / "lake"))
        env.setenv("SESSIONLAKE_SOURCE", str(landing))
        env.delenv("SESSIONLAKE_CHECKPOINT", raising=False)
        run = run_dag("sessionlake_microbatch", {"shuffle_partitions": 2})
        yield {"root": root, "lake": root / "lake", "run": run}


def test_microbatch_dag_sessionizes_the_landing_folder(lake: dict[str, Any]) -> None:
    assert str(lake["run"].state) == "success", _task_states(lake["run"])
    sessions = read_delta(lake["lake"] / "sessions").sort_values("user_id")
    assert list(sessions["user_id"]) == ["u1", "u2"]
    assert list(sessions["event_count"]) == [3, 1]
    metrics = read_delta(lake["lake"] / "batch_metrics")
    assert int(metrics["input_records"].sum()) == len(EVENTS)


@pytest.mark.parametrize(
    ("dag_id", "conf", "param"),
    [
        ("sessionlake_microbatch", {"shuffle_partitions": 0}, "shuffle_partitions"),
        ("sessionlake_restart", {"shuffle_partitions": 2, "master": "mesos://m:5050"}, "master"),
        ("sessionlake_backfill",
         {"from_date": "2026-02-01", "to_date": "2026-01-01", "gap_minutes": 30}, "from_date"),
        ("sessionlake_retention", {"erase_user_ids": ["u1", " "]}, "erase_user_ids"),
        ("sessionlake_erasure", {}, "erase_user_ids"),  # nobody to erase
        ("sessionlake_erasure", {"vacuum_retain_hours": None}, "erase_user_ids"),
        ("sessionlake_erasure", {"events_max_age_days": 1}, "events_max_age_days"),
        ("sessionlake_archive", {"archive_to": None}, "archive_to"),
        ("sessionlake_archive", {"archive_to": "{source}/archived"}, "archive_to"),
        # A misspelt param name (Airflow itself runs such a run with the defaults).
        ("sessionlake_microbatch", {"shuffle_partition": 2}, "shuffle_partition"),
        # Well-formed, but no such snapshot: told before a job starts.
        ("sessionlake_restore", {"snapshot_id": "20260105T101500Z-none"}, "snapshot_id"),
    ],
)
def test_bad_params_fail_the_run_before_any_table_exists(
    dag_id: str, conf: dict[str, Any], param: str, locations: dict[str, Path],
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    folders = {name: str(path) for name, path in locations.items()}
    conf = {name: value.format(**folders) if isinstance(value, str) else value
            for name, value in conf.items()}
    try:
        run = run_dag(dag_id, conf)
    except Exception as error:  # rejected by the param's schema before the run starts
        assert param in str(error)
    else:
        assert str(run.state) == "failed"
        assert _task_states(run)["validate_params"] == "failed"
        # The task log (structlog, to stdout) carries the validation message (an unknown
        # param's value is not repeated: it may hold user ids).
        said = caplog.text + capsys.readouterr().out
        assert f"param {param}=" in said or f"param {param} is invalid" in said
    assert not locations["lake"].exists()


MAINTENANCE = [
    # Then expires a snapshot taken 60 days ago (the default keep_last of 3 would keep it).
    ("sessionlake_snapshot", "snapshot", {"name": "dag-test", "keep_last": 1}),
    ("sessionlake_compaction", "compact", {"min_files": 1}),
    ("sessionlake_backfill", "backfill",
     {"from_date": "2026-01-05", "to_date": "2026-01-05", "gap_minutes": 30}),
    ("sessionlake_retention", "retention",
     # By hash: the run's conf holds no id (erase_user_ids' hashing: test_params.py).
     {"erase_user_sha256": [user_hash("u2")], "sessions_max_age_days": 3650,
      "events_max_age_days": 3650, "vacuum_retain_hours": 0}),
    # No age limit, though the lake's events are all older than the retention DAG's 90 days.
    ("sessionlake_erasure", "retention",
     {"erase_user_sha256": [user_hash("u2")], "vacuum_retain_hours": 0}),
    ("sessionlake_restore", "restore", None),
]


@pytest.mark.parametrize(("dag_id", "command", "conf"), MAINTENANCE,
                         ids=[m[0] for m in MAINTENANCE])
def test_maintenance_dag_runs_its_cli_command(
    dag_id: str, command: str, conf: dict[str, Any] | None, lake: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch, spark: SparkSession,
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    """Each maintenance DAG runs its command on the lake; a snapshot or a restore of this
    local lake runs in the worker (no spark-submit), every other command is submitted."""
    if not _cli_has(command):
        pytest.skip(f"`sessionlake {command} --help` fails: the sub-command is not there yet")
    monkeypatch.setenv("SESSIONLAKE_LAKE", str(lake["lake"]))
    monkeypatch.setenv("SESSIONLAKE_SOURCE", str(lake["root"] / "landing"))
    settings = settings_from({"lake": str(lake["lake"])}, env={})
    if conf is None:  # restore: to a snapshot taken by hand (in this process: no JVM start)
        snapshot = create_snapshot(spark, settings)
        conf = {"snapshot_id": snapshot.snapshot_id}
    if command == "snapshot":
        expiring = create_snapshot(None, settings, now=datetime.now(UTC) - timedelta(days=60))
    snapshots_before = {s.snapshot_id for s in list_snapshots(settings.lake)}
    run = run_dag(dag_id, conf)
    assert str(run.state) == "success", _task_states(run)
    said = caplog.text + capsys.readouterr().out
    in_worker = f"sessionlake {command} --lake {lake['lake']}"
    assert (in_worker in said and "not spark-submitted" in said) == (
        command in ("snapshot", "restore")), said[-2000:]
    if command == "retention":
        assert "u2" not in set(read_delta(lake["lake"] / "sessions")["user_id"])
    if dag_id == "sessionlake_erasure":
        assert set(read_delta(lake["lake"] / "events")["user_id"]) == {"u1", "u3"}
    if command == "snapshot":
        [taken] = [s for s in list_snapshots(settings.lake)
                   if s.snapshot_id not in snapshots_before]
        assert taken.name == "dag-test"
        assert f"snapshot {taken.snapshot_id}" in said  # the job's output, in the task log
        assert f"expired {expiring.snapshot_id}" in said
        assert expiring.snapshot_id not in {s.snapshot_id for s in list_snapshots(settings.lake)}
    if command == "restore":
        assert f"restore to {conf['snapshot_id']} possible; nothing changed" in said
        assert f"restored {conf['snapshot_id']}" in said


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local HTTP server taking JSON POSTs, as an incoming webhook does: its URL and
    what was posted."""
    posted: list[dict[str, Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posted.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hooks/T0K3N", posted
    finally:
        server.shutdown()
        server.server_close()


def test_a_failed_task_is_told_to_the_alert_webhook(
    webhook: tuple[str, list[dict[str, Any]]], locations: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A DAG that fails at night is otherwise seen only by whoever opens the UI: its
    failed task is POSTed to SESSIONLAKE_ALERT_WEBHOOK, and logged as an ALERT line; a
    webhook that does not answer changes nothing of the run, and its URL (a token) is not
    logged."""
    url, posted = webhook
    monkeypatch.setenv(orch.ALERT_WEBHOOK_ENV, url)
    run = run_dag("sessionlake_microbatch", {"shuffle_partition": 2})
    assert str(run.state) == "failed"
    # The task's failure, once: the DAG run's own callback leaves a task's failure to it.
    assert [(p["dag_id"], p["task_id"], p["run_id"]) for p in posted] == [
        ("sessionlake_microbatch", "validate_params", run.run_id)]
    assert posted[0]["text"].startswith(
        "ALERT sessionlake DAG sessionlake_microbatch task validate_params failed (run ")
    assert "param shuffle_partition" in posted[0]["error"]  # misspelt
    assert posted[0]["error"] in posted[0]["text"]
    # A run past its dagrun_timeout has its tasks skipped: the DAG's callback tells it.
    from sessionlake.airflow_tasks import alert_on_dag_failure
    alert_on_dag_failure(cast(Any, {"dag_run": run, "reason": "timed_out"}))
    assert posted[1]["text"] == (f"ALERT sessionlake DAG sessionlake_microbatch run "
                                 f"{run.run_id} failed: timed_out")

    # No answer, no scheme, a space: a malformed URL's error quotes it (the diff review).
    for bad in (url.replace("127.0.0.1:", "127.0.0.1:1"), url.split("//", 1)[1],
                url + " x"):
        monkeypatch.setenv(orch.ALERT_WEBHOOK_ENV, bad)
        caplog.clear()
        capsys.readouterr()
        assert str(run_dag("sessionlake_microbatch", {"shuffle_partition": 2}).state) == "failed"
        said = caplog.text + capsys.readouterr().out
        assert "ALERT sessionlake DAG sessionlake_microbatch task validate_params failed" in said
        assert f"the alert was not delivered to {orch.ALERT_WEBHOOK_ENV}" in said, bad
        assert "T0K3N" not in said and len(posted) == 2


def test_a_command_run_in_the_worker_that_fails_fails_its_task_with_its_error(
    tmp_path: Path,
) -> None:
    """The child's own one-line error is the task's; nothing is spark-submitted."""
    from sessionlake.airflow_tasks import SessionlakeJobOperator

    (tmp_path / "lake").mkdir()
    job = orch.restore_job(orch.Locations(str(tmp_path / "lake"), None, str(tmp_path / "cp")),
                           orch.RestoreParams("20260105T101500Z-abc123"))
    operator = SessionlakeJobOperator(task_id="restore", application="/nonexistent.py",
                                      application_args=job["args"], env_vars=job["env"],
                                      local=job["local"])
    failed = r"sessionlake restore exited with status 2: .*20260105T101500Z-abc123"
    with pytest.raises(RuntimeError, match=failed):
        operator.execute({})  # the local run reads no context


def test_microbatch_runs_are_skipped_while_a_continuous_run_holds_the_checkpoint(
    lake: dict[str, Any], monkeypatch: pytest.MonkeyPatch, spark: SparkSession,
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str],
) -> None:
    """Beside the restart DAG's continuous run, the scheduled runs would each start a job
    that the checkpoint's lock refuses, and fail every five minutes; they are skipped. Any
    other run holding the checkpoint fails them, naming it, once waited for when it ends
    by itself: skipped, a run left hanging would keep the DAG green while nothing reads the
    landing folder. A restore too waits for a run that ends by itself, then is refused
    before its job starts."""
    monkeypatch.setenv("SESSIONLAKE_RESTART_TIMEOUT", "1")
    monkeypatch.setenv("SESSIONLAKE_LAKE", str(lake["lake"]))
    monkeypatch.setenv("SESSIONLAKE_SOURCE", str(lake["root"] / "landing"))
    checkpoint = lake["lake"] / "_checkpoints" / "stream"
    snapshot = create_snapshot(spark, settings_from({"lake": str(lake["lake"])}, env={}))
    with held_by_another_process("checkpoint_lock", checkpoint) as holder:
        run = run_dag("sessionlake_microbatch", {"shuffle_partitions": 2})
        assert str(run.state) == "failed"
        assert _task_states(run)["validate_params"] == "failed"
        said = caplog.text + capsys.readouterr().out
        # No continuous run (its command line asks for none): it ends by itself, and the
        # micro-batch waits for it, up to SESSIONLAKE_RESTART_TIMEOUT.
        assert f"sessionlake pid {holder.pid} still holds checkpoint {checkpoint} after 1s" \
            in said
        (checkpoint / CONTINUOUS_RUN).write_text(json.dumps({"pid": holder.pid, "args": []}))
        try:
            run = run_dag("sessionlake_microbatch", {"shuffle_partitions": 2})
        finally:
            (checkpoint / CONTINUOUS_RUN).unlink()
        assert str(run.state) == "success"
        assert _task_states(run) == {"validate_params": "skipped", "run_microbatch": "skipped"}
        said = caplog.text + capsys.readouterr().out
        assert f"sessionlake run pid {holder.pid} holds checkpoint {checkpoint} and reads" in said
        # The restore waits for it too.
        restore = run_dag("sessionlake_restore", {"snapshot_id": snapshot.snapshot_id})
        assert _task_states(restore)["validate_params"] == "failed"
        assert f"sessionlake pid {holder.pid} still holds checkpoint {checkpoint} after 1s" \
            in caplog.text + capsys.readouterr().out


def test_archive_dag_moves_the_read_file_out_of_the_landing_folder(
    lake: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # After the maintenance DAGs above: their snapshots were taken after the file was read.
    monkeypatch.setenv("SESSIONLAKE_LAKE", str(lake["lake"]))
    monkeypatch.setenv("SESSIONLAKE_SOURCE", str(lake["root"] / "landing"))
    archive = lake["root"] / "archive"
    monkeypatch.setenv("SESSIONLAKE_ARCHIVE_ROOTS", str(lake["root"]))
    run = run_dag("sessionlake_archive", {"archive_to": str(archive)})
    assert str(run.state) == "success", _task_states(run)
    assert not list((lake["root"] / "landing").iterdir())
    assert (archive / "part-0001.jsonl").read_text() == "\n".join(EVENTS) + "\n"

"""Every DAG file loads, with the seven ids the spec names, sessionlake_archive and
sessionlake_erasure, each documented and tagged."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.dags.conftest import DAGS

DAG_IDS = {
    "sessionlake_microbatch", "sessionlake_backfill", "sessionlake_compaction",
    "sessionlake_snapshot", "sessionlake_restore", "sessionlake_retention",
    "sessionlake_restart", "sessionlake_archive", "sessionlake_erasure",
}
PARAMS = {
    "sessionlake_microbatch": {"shuffle_partitions"},
    "sessionlake_backfill": {"from_date", "to_date", "gap_minutes"},
    "sessionlake_compaction": {"min_files"},
    "sessionlake_snapshot": {"name", "max_age_days", "keep_last"},
    "sessionlake_restore": {"snapshot_id"},
    "sessionlake_retention": {"erase_user_ids", "erase_user_sha256", "sessions_max_age_days",
                              "events_max_age_days", "vacuum_retain_hours", "dry_run"},
    "sessionlake_restart": {"shuffle_partitions", "master"},
    "sessionlake_archive": {"archive_to", "dry_run"},
    "sessionlake_erasure": {"erase_user_ids", "erase_user_sha256", "vacuum_retain_hours",
                            "dry_run"},
}


@pytest.fixture(scope="module")
def dagbag() -> Any:
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_no_import_errors_and_exactly_these_dags(dagbag: Any) -> None:
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == DAG_IDS


@pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
def test_each_dag_is_documented_tagged_and_validates_first(dagbag: Any, dag_id: str) -> None:
    dag = dagbag.dags[dag_id]
    assert dag.doc_md and dag_id in dag.doc_md
    assert "sessionlake" in dag.tags
    assert dag.catchup is False
    assert set(dag.params.keys()) == PARAMS[dag_id]
    # The params are checked before any other task runs.
    assert [t.task_id for t in dag.roots] == ["validate_params"]
    # Every task's failure is told (docs/monitoring.md).
    from sessionlake.airflow_tasks import alert_on_dag_failure, alert_on_failure
    assert all(alert_on_failure in (t.on_failure_callback or []) for t in dag.tasks), dag_id
    # A run past its dagrun_timeout is told by the DAG's callback (only such a DAG has one:
    # see alert_on_dag_failure).
    callbacks = dag.on_failure_callback or []
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    assert (alert_on_dag_failure in callbacks) == (dag.dagrun_timeout is not None), dag_id


def test_microbatch_never_runs_twice_at_once(dagbag: Any) -> None:
    dag = dagbag.dags["sessionlake_microbatch"]
    assert dag.max_active_runs == 1
    assert dag.schedule == timedelta(minutes=5)


#: The tasks that write the streaming checkpoint, per DAG: they share a one-slot pool.
CHECKPOINT_TASKS = {
    "sessionlake_microbatch": {"run_microbatch"},
    "sessionlake_restore": {"stop_running_stream", "restore", "start_stream_again",
                            "verify_resumed"},
    "sessionlake_restart": {"stop_running_stream", "start_stream", "verify_resumed"},
    "sessionlake_retention": {"enforce_retention"},
    "sessionlake_erasure": {"erase_users"},
    "sessionlake_archive": {"archive"},
}


def test_checkpoint_writers_share_a_one_slot_pool_and_nothing_else_uses_it(dagbag: Any) -> None:
    from sessionlake.orchestration import CHECKPOINT_POOL

    in_pool = {
        dag_id: {t.task_id for t in dag.tasks if t.pool == CHECKPOINT_POOL}
        for dag_id, dag in dagbag.dags.items()
    }
    assert {k: v for k, v in in_pool.items() if v} == CHECKPOINT_TASKS
    for dag_id, tasks in CHECKPOINT_TASKS.items():
        for task_id in tasks:
            assert dagbag.dags[dag_id].get_task(task_id).pool_slots == 1


def test_the_restore_is_checked_before_the_stream_is_stopped(dagbag: Any) -> None:
    # A refusal after the stop (a Kafka topic's records gone) left the stream stopped.
    stop = dagbag.dags["sessionlake_restore"].get_task("stop_running_stream")
    assert "check_restore" in stop.upstream_task_ids


def test_the_microbatch_task_never_runs_twice_at_once(dagbag: Any) -> None:
    run = dagbag.dags["sessionlake_microbatch"].get_task("run_microbatch")
    assert run.max_active_tis_per_dag == 1


@pytest.mark.parametrize("dag_id", sorted(DAG_IDS))
def test_each_dag_runs_one_at_a_time(dagbag: Any, dag_id: str) -> None:
    # Two compactions, backfills or snapshots at once would only conflict with each other;
    # docs/airflow-at-scale.md counts what may run together against one lake.
    assert dagbag.dags[dag_id].max_active_runs == 1


def test_the_pool_is_reported_missing_until_it_is_created() -> None:
    from airflow.dag_processing.dagbag import DagBag

    from sessionlake.orchestration import CHECKPOINT_POOL

    # What the dag-processor warns about on a deployment that skipped `airflow pools set`
    # (the scheduler would then never start these tasks; dag.test() runs them anyway).
    bag = DagBag(dag_folder=str(DAGS), known_pools={"default_pool"})
    warned = {w.dag_id for w in bag.dag_warnings if CHECKPOINT_POOL in w.message}
    assert warned == set(CHECKPOINT_TASKS)
    created = DagBag(dag_folder=str(DAGS), known_pools={"default_pool", CHECKPOINT_POOL})
    assert not created.dag_warnings

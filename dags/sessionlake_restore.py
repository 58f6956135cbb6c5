"""
### sessionlake_restore

`sessionlake restore --snapshot ID`: return every table and the streaming checkpoint to a
snapshot, so the next run resumes from exactly that point.

1. check the params: the snapshot must be in the lake's catalog; then check, changing
   nothing, that the restore can be done now (`sessionlake restore --check-only`: the
   snapshot's files kept and, for a Kafka stream, the topic still holding the records the
   snapshot's stream reads on from), so that a refusal comes before anything stops;
2. stop the continuous run, when the restart DAG's holds the checkpoint (SIGTERM: the
   batch in flight commits first), and keep its command line;
3. restore;
4. start that run again, as it was started, and wait for its first batch from the
   snapshot's point (within `SESSIONLAKE_RESTART_TIMEOUT` seconds, 300). With no run
   stopped, step 4 is skipped: the next micro-batch run resumes from the snapshot.

A continuous run from the command line holding the checkpoint is not stopped: the DAG run
fails at step 1, saying how to stop it. A run of this host that ends by itself (a
scheduled micro-batch, an available-now run) is waited for at step 1, up to
`SESSIONLAKE_RESTART_TIMEOUT`. Steps 2-4 run in the one-slot pool `sessionlake_checkpoint`,
so no micro-batch runs beside any of them; one may run between two of them, which is
harmless (before the restore, the restore undoes its batch; after it, it resumes from the
snapshot), and step 4 counts only the started run's own batches.

Params: `snapshot_id` (as printed by `sessionlake_snapshot`, or the `name` given to it
when no other snapshot bears it).
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.sdk import DAG, Param, chain, task
from airflow.sdk.exceptions import AirflowSkipException

from sessionlake import orchestration as orch
from sessionlake.airflow_tasks import (
    at_run_time,
    connection_master,
    dag_defaults,
    submit_job,
    trigger_params,
)

with DAG(
    dag_id="sessionlake_restore",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["sessionlake", "maintenance"],
    default_args=dag_defaults(),
    params={
        "snapshot_id": Param(type="string", minLength=1, maxLength=128,
                             description="the id sessionlake_snapshot printed, or the "
                                         "name given to it (if no other snapshot has it)"),
    },
):

    @task(multiple_outputs=True)
    def validate_params() -> orch.SparkJob:
        """Check the params and build the job before any data is touched."""
        checked = orch.validate_restore_params(trigger_params())
        locations = orch.locations_from_env()
        orch.check_restore_possible(locations, checked, connection_master())
        return orch.restore_job(locations, checked)

    @task(pool=orch.CHECKPOINT_POOL)
    def stop_running_stream() -> list[str]:
        """Stop the restart DAG's continuous run, if one holds the checkpoint; return its
        command line, to start it again after the restore (empty: none ran; a value all
        the same, since a task's ``None`` is no XCom and its reader logs an error)."""
        return orch.stop_for_restore(orch.locations_from_env().checkpoint,
                                     orch.restart_timeout()) or []

    @task(pool=orch.CHECKPOINT_POOL)
    def start_stream_again(args: list[str] | None) -> dict[str, Any]:
        """Start the stopped run again, detached; return its pid and the restored stream's
        position, from which it must commit a batch."""
        if not args:
            raise AirflowSkipException("no continuous run was stopped: the next run resumes "
                                       "from the snapshot")
        where = orch.locations_from_env()
        args = orch.checked_restart_args(where, args, connection_master())
        return orch.started_run(where, args)

    @task(pool=orch.CHECKPOINT_POOL)
    def verify_resumed(started: dict[str, Any]) -> dict[str, Any]:
        """Wait for the run's first batch after the restore, on the same stream."""
        return orch.resumed_run(started, started["pid"])

    @task(multiple_outputs=True)
    def check_job(job: orch.SparkJob) -> orch.SparkJob:
        """The restore's job as a check that changes nothing (``--check-only``)."""
        return orch.restore_check_job(job)

    job = validate_params()
    checked = submit_job(check_job(at_run_time(job)), task_id="check_restore",
                         name="sessionlake-restore-check")
    stopped = stop_running_stream()
    restore = submit_job(job, task_id="restore", name="sessionlake-restore",
                         pool=orch.CHECKPOINT_POOL)
    started = start_stream_again(at_run_time(stopped))
    chain(job, checked, stopped, restore, started)
    verify_resumed(at_run_time(started))

"""
### sessionlake_restore

`sessionlake restore --snapshot ID`: return every table and the streaming checkpoint to a
snapshot, so the next run resumes from exactly that point. Stop a continuous run first
(the job refuses while another run holds the checkpoint). Runs in the one-slot pool
`sessionlake_checkpoint`, so a scheduled micro-batch waits for it.

Params: `snapshot_id` (as printed by `sessionlake_snapshot`).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task

from sessionlake import orchestration as orch
from sessionlake.airflow_tasks import submit_job, trigger_params

with DAG(
    dag_id="sessionlake_restore",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["sessionlake", "maintenance"],
    params={
        "snapshot_id": Param(type="string", minLength=1, maxLength=128,
                             description="the id sessionlake_snapshot printed"),
    },
):

    @task(multiple_outputs=True)
    def validate_params() -> orch.SparkJob:
        """Check the params and build the job before any data is touched."""
        checked = orch.validate_restore_params(trigger_params())
        locations = orch.locations_from_env()
        orch.check_restore_possible(locations, checked)
        return orch.spark_job(orch.restore_args(locations, checked))

    submit_job(validate_params(), task_id="restore", name="sessionlake-restore",
               pool=orch.CHECKPOINT_POOL)

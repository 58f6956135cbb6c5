"""
### sessionlake_restore

`sessionlake restore --snapshot ID`: return every table and the streaming checkpoint to a
snapshot, so the next run resumes from exactly that point. Stop a continuous run first
(the job refuses while another run holds the checkpoint). Runs in the one-slot pool
`sessionlake_checkpoint`, so a scheduled micro-batch waits for it.

Params: `snapshot_id` (as printed by `sessionlake_snapshot`).
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param, task

from sessionlake import orchestration as orch

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
    def validate_params(params: dict[str, Any]) -> orch.SparkJob:
        """Check the params and build the job before any data is touched."""
        checked = orch.validate_restore_params(params)
        return orch.spark_job(orch.restore_args(orch.locations_from_env(), checked))

    job = validate_params()
    SparkSubmitOperator(
        task_id="restore",
        conn_id="spark_default",
        application=str(orch.JOB_SCRIPT),
        application_args=job["args"],
        conf=job["conf"],
        env_vars=job["env"],
        name="sessionlake-restore",
        pool=orch.CHECKPOINT_POOL,
    )

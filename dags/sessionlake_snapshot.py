"""
### sessionlake_snapshot

Daily `sessionlake snapshot`: a consistent restore point, the version of every table
together with the streaming checkpoint. The job prints the snapshot id (see the task log);
give it to `sessionlake_restore`.

Params: `name` (optional label: letters, digits, `_ . : -`).
"""

from __future__ import annotations

from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, Param, task

from sessionlake import orchestration as orch

with DAG(
    dag_id="sessionlake_snapshot",
    doc_md=__doc__,
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["sessionlake", "maintenance"],
    params={
        "name": Param(None, type=["null", "string"], maxLength=128,
                      description="optional label of the restore point"),
    },
):

    @task(multiple_outputs=True)
    def validate_params(params: dict[str, Any]) -> orch.SparkJob:
        """Check the params and build the job before any data is touched."""
        checked = orch.validate_snapshot_params(params)
        return orch.spark_job(orch.snapshot_args(orch.locations_from_env(), checked))

    job = validate_params()
    SparkSubmitOperator(
        task_id="snapshot",
        conn_id="spark_default",
        application=str(orch.JOB_SCRIPT),
        application_args=job["args"],
        conf=job["conf"],
        env_vars=job["env"],
        name="sessionlake-snapshot",
    )

"""
### sessionlake_snapshot

Daily `sessionlake snapshot`: a consistent restore point, the version of every table
together with the streaming checkpoint. The job prints the snapshot id (see the task log);
give it to `sessionlake_restore`.

Params: `name` (optional label: letters, digits, `_ . : -`).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task

from sessionlake import orchestration as orch
from sessionlake.airflow_tasks import submit_job, trigger_params

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
    def validate_params() -> orch.SparkJob:
        """Check the params and build the job before any data is touched."""
        checked = orch.validate_snapshot_params(trigger_params())
        return orch.snapshot_job(orch.locations_from_env(), checked)

    submit_job(validate_params(), task_id="snapshot", name="sessionlake-snapshot")

"""
### sessionlake_erasure

`sessionlake retention` for erasure requests only: erase the listed users from every table,
purge them from the files, VACUUM, and write an audit row; no age limit. Trigger it from
the UI with the users to erase. `sessionlake_retention` erases too, but its form comes
filled with its daily age limits (sessions over 365 days, events over 90), which a run
triggered only to erase someone would apply as well. Runs in the one-slot pool
`sessionlake_checkpoint`, as the retention DAG does.

Params: `erase_user_ids` (list of user ids), `erase_user_sha256` (the same users by the
SHA-256 of their id, so that the DAG run's conf, which Airflow keeps, holds no id): at
least one user in all; `vacuum_retain_hours` (hours >= 0; null: no VACUUM, and the erased
rows stay readable by time travel until one), `dry_run` (only count what the run would
delete and VACUUM; nothing changes, no audit row).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from sessionlake import orchestration as orch
from sessionlake.airflow_tasks import (
    dag_defaults,
    submit_job,
    trigger_params,
    users_to_erase_params,
    vacuum_params,
)

with DAG(
    dag_id="sessionlake_erasure",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["sessionlake", "maintenance", "privacy"],
    default_args=dag_defaults(),
    params={
        **users_to_erase_params(),
        **vacuum_params(),
    },
):

    @task(multiple_outputs=True)
    def validate_params() -> orch.SparkJob:
        """Check the params and build the job before any data is touched."""
        checked = orch.validate_erasure_params(trigger_params())
        return orch.spark_job(orch.retention_args(orch.locations_from_env(), checked))

    submit_job(validate_params(), task_id="erase_users", name="sessionlake-erasure",
               pool=orch.CHECKPOINT_POOL)

"""
### sessionlake_retention

Daily `sessionlake retention`: erase the listed users from every table, drop sessions and
events older than the age limits, VACUUM files older than the retention, and write an
audit row. A null limit leaves that step out. Runs in the one-slot pool
`sessionlake_checkpoint`: an erasure must not interleave with a micro-batch (the job would
wait for the batch in flight; in the pool Airflow queues it instead of holding executors).

Params: `erase_user_ids` (list of user ids), `erase_user_sha256` (the same users by the
SHA-256 of their id, so that the DAG run's conf, which Airflow keeps, holds no id),
`sessions_max_age_days`, `events_max_age_days` (days >= 1), `vacuum_retain_hours`
(hours >= 0), `dry_run` (only count what the run would delete and VACUUM; nothing
changes, no audit row).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task

from sessionlake import orchestration as orch
from sessionlake.airflow_tasks import (
    dag_defaults,
    submit_job,
    trigger_params,
    users_to_erase_params,
    vacuum_params,
)

with DAG(
    dag_id="sessionlake_retention",
    doc_md=__doc__,
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["sessionlake", "maintenance", "privacy"],
    default_args=dag_defaults(),
    params={
        **users_to_erase_params(),
        "sessions_max_age_days": Param(
            365, type=["null", "integer"], minimum=1,
            description="delete sessions (open ones too) and their changelog rows whose "
                        "start day, by event time, lies more than this many days before "
                        "today (UTC); null: keep them"),
        "events_max_age_days": Param(
            90, type=["null", "integer"], minimum=1,
            description="delete events and late events whose event day, and quarantined "
                        "records whose arrival day, lies more than this many days before "
                        "today (UTC); null: keep them"),
        **vacuum_params(),
    },
):

    @task(multiple_outputs=True)
    def validate_params() -> orch.SparkJob:
        """Check the params and build the job before any data is touched."""
        checked = orch.validate_retention_params(trigger_params())
        return orch.spark_job(orch.retention_args(orch.locations_from_env(), checked))

    submit_job(validate_params(), task_id="enforce_retention", name="sessionlake-retention",
               pool=orch.CHECKPOINT_POOL)

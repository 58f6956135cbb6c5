"""
### sessionlake_snapshot

Daily `sessionlake snapshot`: a consistent restore point, the version of every table
together with the streaming checkpoint. The job prints the snapshot id (see the task log);
give it to `sessionlake_restore`. Then it expires the snapshots taken more than
`max_age_days` ago, but for the `keep_last` newest: VACUUM keeps every file the oldest kept
snapshot needs, so rows deleted since (aged out, erased) stay readable by time travel
until it expires.

Params: `name` (optional label: letters, digits, `_ . : -`), `max_age_days` (days >= 1,
null: no age limit), `keep_last` (>= 1, null: no count limit; both null: nothing expires).
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param, task

from sessionlake import orchestration as orch
from sessionlake.airflow_tasks import dag_defaults, submit_job, trigger_params

with DAG(
    dag_id="sessionlake_snapshot",
    doc_md=__doc__,
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    tags=["sessionlake", "maintenance"],
    default_args=dag_defaults(),
    params={
        "name": Param(None, type=["null", "string"], maxLength=128,
                      description="optional label of the restore point; the restore "
                                  "DAG takes it in place of the id"),
        "max_age_days": Param(30, type=["null", "integer"], minimum=1,
                              description="expire snapshots taken more than this many days "
                                          "ago (null: no age limit)"),
        "keep_last": Param(3, type=["null", "integer"], minimum=1,
                           description="keep this many newest snapshots, however old "
                                       "(null: no count limit)"),
    },
):

    @task(multiple_outputs=True)
    def validate_params() -> orch.SparkJob:
        """Check the params and build the job before any data is touched."""
        checked = orch.validate_snapshot_params(trigger_params())
        return orch.snapshot_job(orch.locations_from_env(), checked)

    submit_job(validate_params(), task_id="snapshot", name="sessionlake-snapshot")
